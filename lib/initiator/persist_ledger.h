// The volume's one record of its persists: the sequences handed out, the
// last one acknowledged to the application, and every persist in flight --
// its range, and per replica whether and when it was posted to the
// replica's current session and is not durable there yet.
//
// Two views of the same records:
//  * unsettled: persists not yet durable on every live replica that is not
//    lagging. If a replica is lost (or starts lagging), the ones it has not
//    acknowledged are marked dirty for it. Peers::settle() moves the
//    boundary up as replicas acknowledge.
//  * pending on replica i: posted to its session and not completed. A
//    Replica matches its completions against these (they come in posting
//    order), waits on them and times them out. A lagging replica may hold
//    settled persists pending; a record stays until it is settled and
//    pending nowhere.
//
// Ownership: the pipeline starts persists and acknowledges them, Replicas
// report posts and completions, Peers settle and forget. Guarded by the
// volume mutex (volume_core.h): every call is made with it held. Not
// thread-safe by itself.
#pragma once

#include <array>
#include <bitset>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "metadata/metadata.h"
#include "protocol/protocol.h"

namespace pmirror::initiator {

// A volume has at most this many replicas; a replica's index in the volume
// is its bit in a ReplicaSet.
inline constexpr size_t kMaxReplicas = metadata::kMaxPeers;
using ReplicaSet = std::bitset<kMaxReplicas>;

struct InFlightPersist {
  uint64_t sequence = 0;
  // Its ranges: PersistLedger::ranges() (kept beside the records, so that
  // a persist of many ranges allocates nothing).
  uint64_t first_range = 0;  // index in the ledger's range store (absolute)
  uint32_t range_count = 0;
  // The snapshot buffer (StagingBuffer) holds its bytes up to here
  // (absolute); 0: sent from the local mapping.
  uint64_t staged_end = 0;
  ReplicaSet pending;  // posted to these replicas' sessions, not durable there yet
  // For each replica in `pending`: when it was posted there (its latency and
  // its timeout run from then).
  std::array<std::chrono::steady_clock::time_point, kMaxReplicas> posted_at{};
};

class PersistLedger {
 public:
  // ---- sequences
  uint64_t next_sequence() const { return next_; }
  uint64_t last_started() const { return next_ - 1; }
  // Every persist up to here is durable on `ack` replicas: returned to the
  // application as done.
  uint64_t acknowledged() const { return acknowledged_; }
  void acknowledge(uint64_t sequence);
  // Sequences go on after `sequence` (the highest a replica recorded):
  // every target must see them rise. Only while quiet().
  void continue_after(uint64_t sequence);
  // Every persist started is acknowledged and settled: sequences may jump.
  bool quiet() const;

  // ---- persists
  // Starts the next persist of `ranges` (unsettled, pending nowhere);
  // returns its sequence. `staged_end`: see InFlightPersist.
  uint64_t start(std::span<const protocol::Range> ranges, uint64_t staged_end = 0);
  uint64_t start(uint64_t offset, uint64_t length) {
    const protocol::Range range{offset, length};
    return start(std::span(&range, 1));
  }
  // The record of `sequence`; nullptr once it is released (or never started).
  const InFlightPersist* record(uint64_t sequence) const {
    auto it = find(sequence);
    return it == persists_.end() || it->sequence != sequence ? nullptr : &*it;
  }
  std::span<const protocol::Range> ranges(const InFlightPersist& persist) const {
    return {ranges_.data() + (persist.first_range - ranges_base_), persist.range_count};
  }
  // Each range of the unsettled persists, oldest first: fn(sequence, range).
  template <typename Fn>
  void for_each_unsettled(Fn&& fn) const {
    for (auto it = find(settled_ + 1); it != persists_.end(); ++it) {
      for (const protocol::Range& range : ranges(*it)) fn(it->sequence, range);
    }
  }
  // The snapshot buffer's bytes up to here belong to no record any more
  // (the staged_end of the newest record released).
  uint64_t staging_released() const { return staging_released_; }
  bool has_unsettled() const { return size() > 0 && persists_.back().sequence > settled_; }
  // Every persist up to `upto` is durable on every live replica that is not
  // lagging (or recorded dirty for it). A lower value than before changes
  // nothing.
  void settle(uint64_t upto);

  // ---- per replica (by its index in the volume)
  void posted(size_t replica, uint64_t sequence, std::chrono::steady_clock::time_point at);
  // The oldest persist pending on the replica; nullptr when none is.
  const InFlightPersist* oldest_pending(size_t replica) const;
  std::optional<uint64_t> newest_pending(size_t replica) const;
  uint64_t pending_count(size_t replica) const { return pending_[replica]; }
  bool is_pending(size_t replica, uint64_t sequence) const;
  // `sequence` is durable on the replica. Completions come in posting
  // order, so it must be the oldest pending there: otherwise
  // kProtocolError naming `what` (the completion) and what was expected.
  // Returns when it was posted.
  Result<std::chrono::steady_clock::time_point> complete(size_t replica, uint64_t sequence,
                                                         std::string_view what);
  // The replica's session ended: nothing is pending on it any more.
  void forget(size_t replica);

  // Records kept (unsettled, or pending somewhere).
  size_t size() const { return persists_.size() - head_; }

 private:
  using Records = std::vector<InFlightPersist>;
  Records::const_iterator find(uint64_t sequence) const;
  Records::iterator find(uint64_t sequence);
  // Drops the oldest records while they are settled and pending nowhere.
  void release();

  // The records are persists_[head_, end), rising sequences. Dropping the
  // oldest advances head_; the dead front is erased once it is half of the
  // vector, whose capacity stays: a steady stream of persists allocates
  // nothing (a deque would allocate and free a block every few).
  Records persists_;
  size_t head_ = 0;
  // The records' ranges, in record order: ranges_[i] is range
  // ranges_base_ + i. Trimmed with the records.
  std::vector<protocol::Range> ranges_;
  uint64_t ranges_base_ = 0;
  uint64_t staging_released_ = 0;
  uint64_t next_ = 1;
  uint64_t acknowledged_ = 0;
  uint64_t settled_ = 0;
  std::array<uint64_t, kMaxReplicas> pending_{};
  // Per replica: no persist before this one is pending there (a search
  // hint, so that finding the oldest pending persist costs O(1) amortized).
  mutable std::array<uint64_t, kMaxReplicas> pending_from_{};
};

}  // namespace pmirror::initiator
