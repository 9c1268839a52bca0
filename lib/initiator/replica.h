// One session with a replica of an open volume: its connection, the
// registrations the data path uses, its receive credits, and the protocol
// exchanges in flight on it (a resync copy, a generation update, a verify
// request, a ping). The persists posted to it are recorded in the volume's
// PersistLedger (track_in), not here.
//
// Not thread-safe. Connecting runs on a thread of its own; from the moment
// Peers attaches the session to a peer, it is used with the volume mutex
// held (volume_core.h).
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "initiator/initiator.h"
#include "initiator/persist_ledger.h"
#include "initiator/sync_decision.h"
#include "protocol/protocol.h"
#include "session/session.h"
#include "transport/transport.h"

namespace pmirror::initiator {

// Under APM a persist is durable once its flush Read completes; the Commit
// that tells the target its sequence is bookkeeping, and one covers this
// many persists (docs/protocol.md, section 5): a Send, a wake-up of the
// target and a credit per this many, not per persist.
inline constexpr size_t kPersistsPerCommit = 32;
// A Commit for the persists not yet committed goes out once none was
// posted for this long (and none is in flight).
inline constexpr std::chrono::milliseconds kCommitWhenIdleFor{2};
// Ranges one persist may hold: a Write each, posted in one list with the
// flush and up to two Commits (well within a send queue of 256).
inline constexpr size_t kMaxRangesPerPersist = 64;

class Replica {
 public:
  struct Setup {
    const VolumeOptions& options;
    const ReplicaSpec& spec;
    std::byte* local_base;
    uint64_t local_size;
    protocol::Lineage lineage{};  // VolumeCore::lineage: what the Hello carries
    // The snapshot buffer (StagingBuffer), registered too when not empty.
    std::byte* staging_base = nullptr;
    uint64_t staging_size = 0;
    bool promoted = false;  // the local copy was promoted: the Hello says so
  };
  // Connects, authenticates both ways, checks the remote size, and
  // registers the local copy. Errors name the replica.
  static Result<std::unique_ptr<Replica>> connect(const Setup& setup);
  ~Replica();

  const std::string& label() const { return label_; }
  uint64_t last_sequence() const { return remote_last_sequence_; }
  bool failed() const { return state_ != ReplicaState::kConnected; }
  // A persist, resync copy or generation update waits for its answer.
  bool awaits_answer() const {
    return in_flight_count() > 0 || resync_outstanding_ || generation_ack_outstanding_;
  }
  const Status& error() const { return error_; }
  uint64_t done_upto() const { return done_upto_; }
  // Records the persists posted here in `ledger` as replica `index`. A
  // session posts persists only once tracked.
  void track_in(PersistLedger& ledger, size_t index);

  // Posts the Writes (one per range, 1..kMaxRangesPerPersist) and the
  // flush (APM Read, or PersistRequest) for one persist; under APM, every
  // kPersistsPerCommit persists, also the Commit of the persists since the
  // last one (see commit_if_idle()). The Writes' bytes come from the
  // snapshot buffer at `staged_at` (the ranges' bytes one after the
  // other) or, without it, from the local mapping. Under GPSPM a persist
  // is posted only once the one before it is durable (the order of
  // persists, docs/protocol.md). With `may_wait`, waits (up to
  // operation_timeout) for that, and while the target has no free
  // receive slot the persist needs or the send queue is full. Without,
  // never waits: under GPSPM a persist that must wait for the one before
  // is queued here and posted by the pump that completes it (in_flight
  // and awaiting count it meanwhile); otherwise returns
  // kResourceExhausted and leaves the replica as it was when it cannot
  // take the persist now (nothing of it will complete; a Write already
  // posted may still land, which is harmless to a caller that records the
  // ranges dirty for this replica).
  //
  // `group_ends` (ascending, each < ranges.size()): the persist is several
  // ordered groups, a group ending before each index named: under APM over
  // tcp (and the fake) each group's Writes are followed by a flush Read of
  // their own, posted at once and not waited for, so that no group is
  // placed before the one before it is flushed (the tcp target persists at
  // each Read); over rdma, and where the target declared placement order
  // (it persists each Write), placement order is durability order, and the
  // groups need nothing between them. GPSPM
  // cannot keep that order inside one persist: kInternal (the pipeline
  // starts each group as a persist of its own there).
  Status post_persist(uint64_t sequence, std::span<const protocol::Range> ranges,
                      std::optional<size_t> staged_at = std::nullopt, bool may_wait = true,
                      std::span<const size_t> group_ends = {});
  Status post_persist(uint64_t sequence, uint64_t offset, uint64_t length, bool may_wait = true) {
    const protocol::Range range{offset, length};
    return post_persist(sequence, std::span(&range, 1), std::nullopt, may_wait);
  }
  // Waits until every persist posted here is durable (up to
  // operation_timeout), or the replica failed.
  Status drain();
  // Returns once `sequence` is durable on the replica (or was never posted
  // to it: nothing of it is in flight), or it failed.
  Status wait_for(uint64_t sequence);
  // Processes completions for up to `timeout` (0: only what is there), then
  // fails the replica if a persist, a resync copy or a ping has gone
  // unanswered for operation_timeout. The progress check that catches a
  // replica which stops answering without closing its connection.
  Status poll(std::chrono::milliseconds timeout);
  // Waiting for completions without the volume mutex (session.h,
  // "Collecting"): reserve with the mutex held, let it go, collect, release
  // the reservation, take the mutex again; the next poll handles what was
  // collected. Only the reservation's holder may touch the replica between.
  std::unique_lock<std::mutex> reserve_collect() { return messenger_->reserve_collect(); }
  void collect(std::chrono::milliseconds timeout) { messenger_->collect(timeout); }
  // Never blocks: collects a pong if one arrived, fails the replica if the
  // last ping has gone unanswered for operation_timeout, otherwise sends a
  // new ping when none is outstanding.
  Status heartbeat();
  // Whether `sequence` was taken here (posted, or queued under GPSPM) and
  // is not durable yet.
  bool awaiting(uint64_t sequence) const;
  // Persists taken here and not durable yet.
  uint64_t in_flight_count() const;
  // GPSPM: the persists queued behind the one in flight are not posted
  // (the replica starts lagging: the caller records them dirty).
  void forget_queued() { queued_.clear(); }
  // The target has a free receive slot for one more request.
  bool has_credit() const { return credits_ > 0; }
  // When we last heard from the target (a completion or a message), and
  // when we last sent it a message: the supervisor pings when either is
  // older than heartbeat_interval.
  std::chrono::steady_clock::time_point last_heard() const { return last_heard_; }
  std::chrono::steady_clock::time_point last_message_sent() const { return last_sent_; }
  // Called (under the caller's lock, from whichever call processed the
  // completion) with the time from posting to completion of each persist.
  void on_persist_done(std::function<void(std::chrono::steady_clock::duration)> observer) {
    persist_done_ = std::move(observer);
  }
  // Copies [offset, +length) of the local copy to the replica (Write +
  // flush, as a persist; no bookkeeping), without waiting for the round
  // trip: resync_done() then says whether it is durable (true), not yet
  // (false), or failed. One resync copy in flight at a time. Application
  // persists may be in flight meanwhile: both go down the same connection
  // in order, so the replica ends with the newest bytes either way.
  Status post_resync(uint64_t offset, uint64_t length);
  Result<bool> resync_done();
  // The replica's copy as its descriptor described it, and what it reported
  // of its own activity log (an old primary that crashed).
  const RemoteCopy& remote_copy() const { return remote_copy_; }
  bool remote_unclean() const { return remote_unclean_; }
  uint64_t remote_activity_extent_size() const { return remote_activity_extent_size_; }
  const std::vector<uint64_t>& remote_activity_extents() const { return remote_activity_extents_; }
  // Tells the target its copy now holds `generation` (consistent: a resync
  // completed, or the primary moved on while the replica stayed in sync;
  // not consistent: a resync into it starts). Never waits: without a free
  // receive slot or room in the send queue it returns kResourceExhausted
  // (try again later) and the replica is unchanged. One at a time.
  Status post_generation(uint64_t generation, bool consistent);
  // Whether the update posted last was acknowledged (true; remote_copy()
  // then says so) or not yet (false). poll() fails the replica when it goes
  // unacknowledged for operation_timeout.
  Result<bool> generation_done();
  // XXH3-64 of each `chunk_size` chunk of [offset, +length) of the replica's
  // copy (at most protocol::kMaxVerifyChunks chunks).
  Result<std::vector<uint64_t>> verify_chunks(uint64_t offset, uint64_t length,
                                              uint64_t chunk_size);
  // Ends the session telling the target why (e.g. split brain), so that it
  // reports it too.
  void abandon(const Status& why);
  bool uses_apm() const { return apm_; }
  // "one-sided-commit", "native-flush", "apm" or "gpspm": how this replica's persists become
  // durable (status: `method`).
  const char* method_name() const {
    return one_sided_commit_ ? "one-sided-commit"
           : native_flush_   ? "native-flush"
           : apm_            ? "apm"
                             : "gpspm";
  }
  // APM: persists recorded on the target by no Commit yet (their Commit
  // comes with a later persist, or from commit_if_idle()).
  size_t uncommitted() const;
  // The Commit of the persists not yet recorded on the target, once none
  // is in flight here and none was posted for kCommitWhenIdleFor (the
  // supervisor's call): what a quiet volume's target records. Never waits;
  // nothing to do without a free receive slot (later, then).
  Status commit_if_idle(std::chrono::steady_clock::time_point now);
  // Orderly close: drains, sends the last Commit, says Goodbye,
  // disconnects.
  void close();

  ReplicaStatus status() const;

 private:
  Replica(const Setup& setup);
  Status handshake(const Setup& setup);
  Status fail(Status why);
  Status send_ping();  // heartbeat()'s Ping, now or when it fell due
  // Processes completions for up to `timeout`.
  Status pump(std::chrono::milliseconds timeout);
  // The time for what the current pump handles: read once per pump.
  std::chrono::steady_clock::time_point pump_clock();
  Status handle_message(const protocol::Message& message);
  Status handle_completion(const transport::Completion& completion);
  Status complete_persist(uint64_t sequence, std::string_view what);
  // GPSPM: posts the oldest queued persist once nothing is pending here
  // (and a receive slot is free); called at the end of each pump.
  Status post_queued();
  // Waits for a free receive slot on the target. With `may_wait`, up to
  // operation_timeout (failing the replica then); without, only takes what
  // completions have returned: kResourceExhausted if none is free.
  Status await_credit(bool may_wait);
  // Posts the Write of [offset, +length) and its flush: under APM an 8-byte
  // Read on the same connection (and for a persist the Commit carrying its
  // bookkeeping), under GPSPM a PersistRequest. `sequence` is the
  // persist's, or protocol::kResyncSequence for a resync copy. `may_wait`:
  // retry while the send queue is full; without, kResourceExhausted when
  // nothing of it will complete (the replica is unchanged), the replica
  // failed on any other error. The one place that posts data.
  // `now`: when it is posted (the caller's one clock read).
  Status post_write_flush(uint64_t sequence, std::span<const protocol::Range> ranges,
                          std::optional<size_t> staged_at, bool may_wait,
                          std::chrono::steady_clock::time_point now,
                          std::span<const size_t> group_ends = {});
  // Posts the pending Commit alone (its receive slot awaited as
  // await_credit(may_wait) does).
  Status post_pending_commit(bool may_wait);
  Status flush_commit_word_if_idle(std::chrono::steady_clock::time_point now);
  // The pending Commit, encoded for a post_list; the caller posts it and
  // then calls committed().
  Result<transport::WorkRequest> encode_commit();
  void committed(std::chrono::steady_clock::time_point now);
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
  std::unique_ptr<transport::MemoryRegion> staging_region_;  // null without a snapshot buffer
  std::vector<transport::WorkRequest> post_scratch_;  // post_write_flush's list, kept

  transport::RemoteKey remote_;
  uint64_t remote_size_ = 0;
  bool apm_ = false;
  // Under APM, placed Writes become durable in placement order (rdma: the
  // model APM assumes; tcp and the fake where the target declared
  // kMethodPlacementOrder); otherwise the target persists at a Read, so an
  // ordered persist's groups need a flush each.
  bool placed_in_order_ = false;
  // The target declared native flush and this connection can post FLUSH:
  // a persist's Writes are followed by FLUSHes of their ranges instead of
  // the flush Read, and each persist's (and group's) first Write is fenced
  // behind the FLUSHes before it (placement is not durability there).
  bool native_flush_ = false;
  // With native flush, the target declared one-sided commit and this
  // connection can post ATOMIC WRITE: each persist's sequence goes into the
  // target's commit word with an ATOMIC WRITE fenced behind its FLUSHes,
  // and no Commit is sent (docs/protocol.md, "One-sided commit").
  bool one_sided_commit_ = false;
  transport::RemoteKey commit_word_;
  uint64_t commit_word_posted_ = 0;           // the last sequence ATOMIC WRITTEN into the word
  uint64_t commit_word_flushed_ = 0;          // the last one a FLUSH of the word was posted for
  std::vector<protocol::Range> flush_spans_;  // post_write_flush's scratch
  uint64_t generation_ = 0;
  uint64_t remote_last_sequence_ = 0;
  uint32_t credits_ = 0;
  // The sequences of the Commits not answered yet, oldest first (a ring of
  // as many as there are credits): a CommitAck answers those up to its own.
  std::vector<uint64_t> unacked_commits_;
  size_t unacked_head_ = 0;
  size_t unacked_count_ = 0;
  PersistLedger* ledger_ = nullptr;  // where the persists posted here are recorded
  size_t index_ = 0;                 // this replica's index in the ledger
  uint64_t done_upto_ = 0;
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_sent_ = std::chrono::steady_clock::now();
  std::function<void(std::chrono::steady_clock::duration)> persist_done_;
  uint64_t acknowledged_ = 0;
  uint64_t ping_token_ = 0;
  bool ping_outstanding_ = false;
  bool ping_due_ = false;  // deferred while an answer was awaited (heartbeat())
  std::chrono::steady_clock::time_point ping_sent_{};
  bool resync_outstanding_ = false;
  std::chrono::steady_clock::time_point resync_posted_{};
  std::string resync_what_;
  bool generation_ack_outstanding_ = false;
  std::chrono::steady_clock::time_point generation_posted_{};
  std::pair<uint64_t, bool> generation_update_{};  // (generation, consistent) in flight
  std::optional<protocol::VerifyReply> verify_reply_;
  // Reused from persist to persist, so that posting one allocates nothing.
  // Its ranges are those of the persists since the last Commit, each
  // persist's in order (capacity reserved: no allocation).
  protocol::Message commit_message_{protocol::Commit{}};
  // Persists whose ranges the pending Commit holds: a Commit goes every
  // kPersistsPerCommit persists (however many ranges each has; one
  // holds at most kMaxRangesPerMessage ranges, post_persist sees to it).
  size_t uncommitted_persists_ = 0;
  // GPSPM: persists taken while the one before was not durable yet,
  // oldest first; each is posted once the one before it completes.
  struct QueuedPersist {
    uint64_t sequence = 0;
    std::optional<size_t> staged_at;
    std::chrono::steady_clock::time_point since;
  };
  std::deque<QueuedPersist> queued_;
  uint64_t last_posted_sequence_ = 0;  // the newest persist posted here
  std::chrono::steady_clock::time_point last_persist_posted_{};
  protocol::Message persist_request_message_{protocol::PersistRequest{}};
  std::vector<protocol::Message> pumped_;
  std::optional<std::chrono::steady_clock::time_point> pump_now_;  // see pump_clock()
  RemoteCopy remote_copy_;
  bool remote_unclean_ = false;
  uint64_t remote_activity_extent_size_ = 0;
  std::vector<uint64_t> remote_activity_extents_;
  ReplicaState state_ = ReplicaState::kClosed;
  Status error_;
};

}  // namespace pmirror::initiator
