// Admission control shared by the tcp and rdma listeners: which
// unauthenticated connections exist (hello pending or dormant), from which
// source, in which order they arrived, and which one to close when a new
// one would exceed a cap (AdmissionOptions in transport.h).
//
// Each unauthenticated connection holds a Ticket. Evicting a connection
// runs its on_evict callback under the control's mutex and removes it from
// the counts at once; the callback only shuts the socket (or rdma_cm id)
// down -- whoever owns the connection notices and frees it. A Ticket is
// released (and can no longer be evicted) when the connection is activated
// or destroyed; the owner must release it before the resource on_evict
// touches goes away (destroy the Ticket first).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "transport/transport.h"

namespace pmirror::transport {

// The admission "source" of a peer address: the IPv4 address (an
// IPv4-mapped IPv6 address counts as IPv4), or the IPv6 /64 prefix ("2001:db8:1:2::/64").
std::string admission_source(const sockaddr* address, socklen_t length);

class AdmissionControl : public std::enable_shared_from_this<AdmissionControl> {
 public:
  class Ticket {
   public:
    ~Ticket() { release(); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // No longer counted (activated or closed). Idempotent.
    void release();
    // The control closed the connection to make room.
    bool evicted() const { return evicted_->load(); }

   private:
    friend class AdmissionControl;
    Ticket(std::shared_ptr<AdmissionControl> owner, uint64_t id,
           std::shared_ptr<std::atomic<bool>> evicted)
        : owner_(std::move(owner)), id_(id), evicted_(std::move(evicted)) {}
    std::shared_ptr<AdmissionControl> owner_;  // null once released
    uint64_t id_;
    std::shared_ptr<std::atomic<bool>> evicted_;
  };

  static std::shared_ptr<AdmissionControl> create(const AdmissionOptions& options);

  // Counts a new connection from `source`. If that exceeds a cap, first
  // evicts one: the oldest of `source` when it is at its per-source cap,
  // otherwise (total cap) the oldest of the source holding the most
  // connections (the oldest connection among equally busy sources).
  // Returns the new connection's ticket; `evicted` is set when one was
  // closed to make room.
  std::unique_ptr<Ticket> admit(const std::string& source, std::function<void()> on_evict,
                                bool* evicted = nullptr);
  // Evicts one connection (the oldest of the busiest source) to free its
  // resources, e.g. when accept fails for want of file descriptors. false
  // when there is none.
  bool evict_one();

  void count_timed_out() { timed_out_.fetch_add(1); }
  void count_dropped() { dropped_.fetch_add(1); }
  void count_failed() { failed_.fetch_add(1); }

  // The operator's warnings, worded once for every listener (`listener`:
  // "listener on 0.0.0.0:7450", "rdma listener on ..."): the first eviction
  // of a rate-limited period, and how many more followed in it.
  void warn_evicted(const std::string& listener, const std::string& newcomer) const;
  static void warn_evicted_since(const std::string& listener, uint64_t count,
                                 std::chrono::seconds period);

  AdmissionCounters counters() const;
  const AdmissionOptions& options() const { return options_; }
  size_t unauthenticated() const;
  size_t unauthenticated(const std::string& source) const;

 private:
  explicit AdmissionControl(const AdmissionOptions& options) : options_(options) {}
  struct Entry {
    std::string source;
    std::function<void()> on_evict;
    std::shared_ptr<std::atomic<bool>> evicted;
  };
  void release(uint64_t id);
  bool evict_locked(const std::string* source);

  const AdmissionOptions options_;
  mutable std::mutex mutex_;
  uint64_t next_id_ = 0;                      // ids rise with arrival: the map is in age order
  std::map<uint64_t, Entry> entries_;         // guarded by mutex_
  std::map<std::string, size_t> per_source_;  // guarded by mutex_
  std::atomic<uint64_t> evicted_{0};
  std::atomic<uint64_t> timed_out_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> failed_{0};
};

}  // namespace pmirror::transport
