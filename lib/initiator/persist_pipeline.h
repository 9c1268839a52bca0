// The persist pipeline: what Volume::persist, persist_async, wait and
// drain do (docs/architecture.md, "The data path"). Starting a persist
// takes the next sequence in the PersistLedger (after at most
// max_in_flight outstanding), logs its extents in the activity log, marks
// it dirty for the peers that will not get it, posts it to the others,
// and persists the local copy. Waiting applies the ack policy: `ack`
// in-sync replicas hold it (every in-sync replica with ack 0); a replica
// that cannot take a persist lags rather than hold the application back,
// as long as `ack` can be met without it.
//
// Ownership: no state of its own beyond what it is given; the sequences and
// the persists are the ledger's, the replicas Peers'. Called by application
// threads with the volume mutex held (the `lock` arguments), which it
// releases while a persist waits for acknowledgements (volume_core.h: one
// waiter collects completions without it, the others sleep) and while a
// blocked persist waits for replicas to come back.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "initiator/activity_log.h"
#include "initiator/peers.h"
#include "initiator/persist_ledger.h"
#include "initiator/volume_core.h"

namespace pmirror::initiator {

class PersistPipeline {
 public:
  PersistPipeline(VolumeCore& core, PersistLedger& ledger, ActivityLog& activity, Peers& peers);

  // kInvalidArgument when the range is outside the volume. No lock needed.
  Status check_range(uint64_t offset, uint64_t length) const;
  // Starts persisting [offset, +length) (length > 0); returns the sequence
  // that stands for it. A persist larger than a quarter of the activity
  // log is started as several, so that each fits in the log; they complete
  // in order, so the last one's sequence stands for the whole. When it
  // fails, what it did not start is marked dirty for every replica
  // (Peers::mark_unsent): the local copy holds those bytes either way.
  Result<uint64_t> start(std::unique_lock<std::mutex>& lock, uint64_t offset, uint64_t length);
  // Starts one persist of `ranges` (each non-empty) -- or, past the limits
  // of one (kMaxRangesPerPersist ranges, a quarter of the activity log,
  // the snapshot buffer), as few as hold them, in order -- and returns the
  // last one's sequence. With `snapshot` (the ranges' bytes, concatenated:
  // copied into the snapshot buffer before it returns), the replicas get
  // those bytes rather than the mapping's. `group_starts` (ascending,
  // each in (0, ranges.size())): the ranges are ordered groups, a new one
  // starting at each index named; each group is durable on a replica only
  // after the ones before it (Replica::post_persist's group_ends; where a
  // live replica uses GPSPM, each group is a persist of its own). Fails as
  // start above.
  Result<uint64_t> start(std::unique_lock<std::mutex>& lock,
                         std::span<const protocol::Range> ranges,
                         std::span<const std::byte> snapshot,
                         std::span<const size_t> group_starts = {});
  // Returns once every persist up to `sequence` is durable on `ack` in-sync
  // replicas; replicas beyond `ack` keep their copy of the persist in
  // flight and are not waited for.
  Status wait(std::unique_lock<std::mutex>& lock, uint64_t sequence);

 private:
  Result<uint64_t> start_piece(std::unique_lock<std::mutex>& lock,
                               std::span<const protocol::Range> ranges,
                               std::span<const std::byte> snapshot,
                               std::span<const size_t> group_ends = {});
  std::vector<size_t> group_ends_scratch_;  // start's, under the volume mutex
  // Room for `bytes` in the snapshot buffer, waiting for the persists that
  // hold it; returns its absolute position.
  Result<uint64_t> reserve_staging(std::unique_lock<std::mutex>& lock, uint64_t bytes);
  Status log_activity(uint64_t sequence, std::span<const protocol::Range> ranges);
  // kLeaseLost unless the promoter's lease holds now (VolumeCore::lease):
  // one clock read and one atomic load when the volume needs a lease,
  // nothing otherwise.
  Status check_lease() {
    if (!core_.lease) return Status::Ok();
    const uint64_t now = failover::monotonic_now_ns();
    if (core_.lease->holds_at(now)) return Status::Ok();
    return core_.check_lease(now);
  }
  // Waits up to `timeout` for completions on `replica` without the volume
  // mutex (`lock` is let go and taken again); they are handled by the next
  // poll. Wakes the other waiters afterwards.
  void collect(std::unique_lock<std::mutex>& lock, Replica& replica,
               std::chrono::milliseconds timeout);
  // Whether `sequence` is durable on an in-sync peer: it acknowledged it,
  // or the peer became in sync after the persist started and the persist
  // was not sent to it (the resync that brought it there copied the range).
  static bool holds(const Peer& peer, uint64_t sequence);

  VolumeCore& core_;
  PersistLedger& ledger_;
  ActivityLog& activity_;
  Peers& peers_;
  std::vector<Peer*> pending_;  // wait()'s scratch
};

}  // namespace pmirror::initiator
