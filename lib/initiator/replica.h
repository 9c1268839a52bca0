// One replica of an open volume, as the initiator sees it: its connection,
// the registrations the data path uses, and the persists in flight to it.
// Not thread-safe: the Volume serialises access.
#pragma once

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "initiator/initiator.h"
#include "initiator/sync_decision.h"
#include "protocol/protocol.h"
#include "session/session.h"
#include "transport/transport.h"

namespace pmirror::initiator {

class Replica {
 public:
  struct Setup {
    const VolumeOptions& options;
    const ReplicaSpec& spec;
    std::byte* local_base;
    uint64_t local_size;
  };
  // Connects, authenticates both ways, checks the remote size, and
  // registers the local copy. Errors name the replica.
  static Result<std::unique_ptr<Replica>> connect(const Setup& setup);
  ~Replica();

  const std::string& label() const { return label_; }
  uint64_t last_sequence() const { return remote_last_sequence_; }
  bool failed() const { return state_ != ReplicaState::kConnected; }
  const Status& error() const { return error_; }
  uint64_t done_upto() const { return done_upto_; }

  // Posts the Writes and the flush (APM Read + Commit, or PersistRequest)
  // for one persist. Waits only if the target has no free receive slot.
  Status post_persist(uint64_t sequence, uint64_t offset, uint64_t length);
  // Returns once `sequence` is durable on the replica, or it failed.
  Status wait_for(uint64_t sequence);
  // Never blocks: collects a pong if one arrived, fails the replica if the
  // last ping has gone unanswered for operation_timeout, otherwise sends a
  // new ping when none is outstanding.
  Status heartbeat();
  // Copies [offset, +length) of the local copy to the replica and waits
  // until it is durable there (Write + flush; no bookkeeping). Application
  // persists may be in flight meanwhile: both go down the same connection
  // in order, so the replica ends with the newest bytes either way.
  Status resync_range(uint64_t offset, uint64_t length);
  // The same in two halves, so that the caller need not wait (and hold its
  // lock) for the round trip: post the copy, then ask whether it is durable
  // (true), not yet (false), or failed. One resync copy in flight at a time.
  Status post_resync(uint64_t offset, uint64_t length);
  Result<bool> resync_done();
  uint64_t in_flight_count() const { return in_flight_.size(); }
  // The replica's copy as its descriptor described it, and what it reported
  // of its own activity log (an old primary that crashed).
  const RemoteCopy& remote_copy() const { return remote_copy_; }
  bool remote_unclean() const { return remote_unclean_; }
  uint64_t remote_activity_extent_size() const { return remote_activity_extent_size_; }
  const std::vector<uint64_t>& remote_activity_extents() const { return remote_activity_extents_; }
  // Tells the target its copy now holds `generation` (consistent: a resync
  // completed, or the primary moved on while the replica stayed in sync;
  // not consistent: a resync into it starts). Waits for the acknowledgement.
  Status set_generation(uint64_t generation, bool consistent);
  // XXH3-64 of each `chunk_size` chunk of [offset, +length) of the replica's
  // copy (at most protocol::kMaxVerifyChunks chunks).
  Result<std::vector<uint64_t>> verify_chunks(uint64_t offset, uint64_t length,
                                              uint64_t chunk_size);
  // Ends the session telling the target why (e.g. split brain), so that it
  // reports it too.
  void abandon(const Status& why);
  bool uses_apm() const { return apm_; }
  // Orderly close: drains, says Goodbye, disconnects.
  void close();

  ReplicaStatus status() const;

 private:
  Replica(const Setup& setup);
  Status handshake(const Setup& setup);
  Status fail(Status why);
  // Processes completions for up to `timeout`.
  Status pump(std::chrono::milliseconds timeout);
  Status handle_message(const protocol::Message& message);
  Status handle_completion(const transport::Completion& completion);
  // Retries a post while the send queue is full.
  Status post_with_retry(const std::function<Status()>& post);

  std::string label_;
  ReplicaSpec spec_;
  std::chrono::milliseconds operation_timeout_;
  // Declared in creation order: registrations go before the connection.
  std::unique_ptr<transport::Connection> connection_;
  std::unique_ptr<session::Messenger> messenger_;
  alignas(64) std::array<std::byte, 64> flush_buffer_{};
  std::unique_ptr<transport::MemoryRegion> local_region_;
  std::unique_ptr<transport::MemoryRegion> flush_region_;

  transport::RemoteKey remote_;
  uint64_t remote_size_ = 0;
  bool apm_ = false;
  uint64_t generation_ = 0;
  uint64_t remote_last_sequence_ = 0;
  uint32_t credits_ = 0;
  std::deque<uint64_t> in_flight_;
  uint64_t done_upto_ = 0;
  uint64_t acknowledged_ = 0;
  uint64_t ping_token_ = 0;
  bool ping_outstanding_ = false;
  std::chrono::steady_clock::time_point ping_sent_{};
  bool resync_outstanding_ = false;
  std::chrono::steady_clock::time_point resync_posted_{};
  std::string resync_what_;
  bool generation_ack_outstanding_ = false;
  std::optional<protocol::VerifyReply> verify_reply_;
  RemoteCopy remote_copy_;
  bool remote_unclean_ = false;
  uint64_t remote_activity_extent_size_ = 0;
  std::vector<uint64_t> remote_activity_extents_;
  ReplicaState state_ = ReplicaState::kClosed;
  Status error_;
};

}  // namespace pmirror::initiator
