// The rdma Connection: one RC queue pair, one completion queue with a
// completion channel, the connection's own rdma_cm event channel, a block of
// pre-posted receive slots and a registered send ring. rdma_transport.cpp
// builds it (active and passive rdma_cm flows); this file is the data path.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "transport/admission.h"
#include "transport/rdma/verbs.h"
#include "transport/spin.h"
#include "transport/transport.h"

namespace pmirror::transport::rdma {

// What each side tells the other in the rdma_cm private data (REQ / REP),
// little-endian: magic, version, kind, message_size, recv_slots. 16 bytes
// fit the smallest private-data limit (56 bytes in an IB/RoCE REQ).
struct WireParams {
  static constexpr uint32_t kMagic = 0x444d5250;  // "PRMD"
  static constexpr uint16_t kVersion = 1;
  static constexpr size_t kSize = 16;
  enum Kind : uint16_t {
    kParams = 0,
    kRejectProtocol = 1,     // not ours / wrong version
    kRejectResources = 2,    // the target could not build the QP
    kRejectMessageSize = 3,  // message_size differs; carries the target's
  };

  uint16_t kind = kParams;
  uint32_t message_size = 0;  // receive buffer size of the sender
  uint32_t recv_slots = 0;    // receive buffers the sender pre-posts

  std::array<uint8_t, kSize> encode() const;
  // Fails if the bytes are not ours (another rdma_cm application, or a
  // transport that pads private data with zeros).
  static Result<WireParams> decode(const void* data, size_t len);
};

// Verbs-level resources of one connection, declared in creation order so the
// implicit destructor runs in reverse (QP, CQ, completion channel, MRs,
// buffers, PD, id, event channel). Shared with the connection's
// MemoryRegions: a region that outlives its Connection keeps the PD alive
// until it is deregistered.
struct Endpoint {
  EventChannel channel;  // this connection's rdma_cm events
  CmId id;
  Pd pd;  // per connection: a listener on 0.0.0.0 may accept on any device
  AlignedBuffer recv_block;
  AlignedBuffer send_block;
  Mr recv_mr;
  Mr send_mr;
  CompChannel comp;
  Cq cq;
  Qp qp;

  std::string device;              // for messages
  std::string peer;                // "host:port"
  uint32_t max_inline = 0;         // what the QP granted
  uint32_t max_msg_size = 0;       // port limit of one RDMA message
  bool odp_rc_read_write = false;  // device can register without pinning (ODP)
  FabricPersistence fabric;        // the device's FLUSH / ATOMIC WRITE
  // The QP's work-request API (ibv_wr_*), where the QP was made to post
  // FLUSH or ATOMIC WRITE (fabric.can_post_*); not owned: it lives with qp.
  ibv_qp_ex* qpx = nullptr;

  // ~Endpoint needs the QP gone before the CQ etc.; the member order does it.
};

// Builds PD, buffers, MRs, CQ and QP on endpoint.id (whose verbs context is
// known: after ROUTE_RESOLVED or on a CONNECT_REQUEST) and posts every
// receive slot. On failure the caller still owns the id (to reject it).
Status build_endpoint(Endpoint& endpoint, const ConnectionOptions& options);

// initiator_depth / responder_resources the device allows (>= 1 each so
// RDMA Read works both ways; the read-after-write flush needs it).
void device_rd_atomic(const Endpoint& endpoint, uint8_t* initiator_depth,
                      uint8_t* responder_resources);

class RdmaConnection final : public Connection {
 public:
  // ticket: the connection's place among the listener's unauthenticated
  // ones (passive side), released by activate() or destruction.
  RdmaConnection(std::shared_ptr<Endpoint> endpoint, const ConnectionOptions& options,
                 const WireParams& peer,
                 std::unique_ptr<AdmissionControl::Ticket> ticket = nullptr);
  ~RdmaConnection() override;

  Result<std::unique_ptr<MemoryRegion>> register_memory(void* addr, size_t len, uint32_t access,
                                                        PersistFn persist) override;
  Status post_write(const MemoryRegion& local, size_t local_offset, size_t len,
                    const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id,
                    bool signaled) override;
  Status post_read(const MemoryRegion& local, size_t local_offset, size_t len,
                   const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id) override;
  Status post_send(std::span<const std::byte> message, uint64_t wr_id) override;
  // One linked ibv_post_send for the whole list, all or nothing.
  Result<size_t> post_list(std::span<const WorkRequest> requests) override;
  Result<size_t> poll(std::span<Completion> out, std::chrono::milliseconds timeout) override;
  std::span<const std::byte> recv_data(uint32_t slot, uint32_t byte_len) const override;
  Status repost_recv(uint32_t slot) override;
  void shutdown() override;
  void wake() override;
  const ConnectionOptions& options() const override { return options_; }
  std::string peer_address() const override { return endpoint_->peer; }
  FabricPersistence fabric_persistence() const override { return endpoint_->fabric; }
  // No threads to start: only leaves the listener's unauthenticated count.
  Status activate() override;
  void set_poll_mode(PollMode mode) override { spin_.set_mode(mode); }

 private:
  // One send-queue work request. ibv wr_id is its sequence number; the ring
  // is indexed by seq % depth.
  struct WrRecord {
    uint64_t user_wr_id = 0;
    Opcode opcode = Opcode::kWrite;
    bool report = false;  // the caller asked for a completion on success
    bool op_end = false;  // last WR of a caller's operation (split writes)
    int32_t send_slot = -1;
  };
  struct Piece {
    uint64_t local_addr;
    uint32_t length;
    uint64_t remote_addr;
  };

  // How many WRs `request` takes, or why it is refused (checked before the
  // lock: local arguments only).
  Result<size_t> check_request(const WorkRequest& request) const;
  // Posts the whole list with one doorbell, or nothing (kResourceExhausted
  // when the send queue or the send buffers lack room).
  Status post_requests(std::span<const WorkRequest> requests);
  Status check_open_locked() const;
  // Posts `wrs` (already linked); on failure rolls back what was not posted.
  // With `extended` (the chain holds a FLUSH or an ATOMIC WRITE), through
  // the QP's ibv_wr_* API, all or nothing; wr_extra_scratch_ then holds each
  // WR's FLUSH length or ATOMIC WRITE value.
  Status post_chain_locked(std::span<ibv_send_wr> wrs, std::string_view what, bool extended);
  Status post_extended_locked(std::span<ibv_send_wr> wrs, size_t* posted);
  void reclaim_through_locked(uint64_t seq);
  size_t drain_cq_locked(std::span<Completion> out);
  void handle_cm_events_locked();
  void mark_broken_locked(Errc code, std::string reason);
  size_t synthesize_errors_locked(std::span<Completion> out);
  Status flushed_status_locked(std::string_view what) const;
  bool room_freed_locked();
  // A wake() not yet seen by poll(): true once (drains the eventfd).
  bool take_wake();
  Status post_recv_locked(uint32_t slot);

  std::shared_ptr<Endpoint> endpoint_;
  const ConnectionOptions options_;
  const uint32_t send_limit_;  // min(ours, peer's receive buffer)
  const uint32_t sq_depth_;
  const uint32_t signal_every_;  // bound on consecutive unsignaled WRs

  mutable std::mutex mu_;  // everything below; never held while sleeping
  std::vector<WrRecord> ring_;
  uint64_t next_seq_ = 0;
  uint64_t tail_seq_ = 0;  // oldest WR whose SQ slot is not reclaimed
  uint32_t unsignaled_run_ = 0;
  std::vector<uint32_t> free_send_slots_;
  std::vector<ibv_send_wr> wr_scratch_;  // one post's chain, reused
  std::vector<ibv_sge> sge_scratch_;
  std::vector<uint64_t> wr_extra_scratch_;  // FLUSH length / ATOMIC WRITE value per WR
  std::vector<bool> recv_posted_;
  bool broken_ = false;
  bool shutdown_called_ = false;
  bool starved_ = false;     // a post was refused with kResourceExhausted
  bool room_freed_ = false;  // ... and room was reclaimed since
  Status broken_reason_;
  // wake(): the flag says so, the eventfd ends poll(2) (-1: could not be
  // made; poll() then sees the flag within its timeout or spin slice).
  std::atomic<bool> wake_requested_{false};
  UniqueFd wake_fd_;
  std::mutex poll_mu_;  // one poller sleeps at a time
  SpinPolicy spin_;     // how poll() waits (thread-safe)
  std::unique_ptr<AdmissionControl::Ticket> ticket_;  // owner's thread only
};

}  // namespace pmirror::transport::rdma
