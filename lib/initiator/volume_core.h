// What every piece of an open volume shares (docs/architecture.md, "Inside
// libpmirror"): its options, the local copy, the copy's metadata, and the
// volume mutex that guards the pieces' state.
//
// Locking, the whole rule: one mutex per volume, `VolumeCore::mutex`.
// Each piece (PersistLedger, ActivityLog, Peers, Resyncer, PersistPipeline,
// Verifier) keeps its state in its own members and documents them as
// guarded by it; every call into a piece that touches that state is made
// with it held, by the application's thread (persist, wait, status, verify,
// resync) or the supervisor thread (one peer at a time). A persist waiting
// for its acknowledgements does not hold it across the network wait: one
// waiter at a time (the collector, `collecting`) waits on one replica's
// connection without it, the others sleep on `collected` -- so that
// application threads post their persists meanwhile and one wait serves
// them all (group commit). The mutex is still held across the other,
// rarer network waits (a verify batch, a full send queue, a close).
// Objects with their own lock: CopyMetadata, the peers' PeerStateMachine
// and LatencyWindow, SupervisorWakeup below, and the SessionReaper, which
// destroys dropped sessions without the mutex (a teardown may block).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "failover/lease_file.h"
#include "initiator/initiator.h"
#include "initiator/session_reaper.h"
#include "initiator/staging_buffer.h"
#include "metadata/metadata.h"
#include "protocol/protocol.h"
#include "region/region.h"

namespace pmirror::initiator {

using Clock = std::chrono::steady_clock;

// How the supervisor thread is woken early and told to stop. Pieces that
// leave it work (a generation update to send, a resync to start) wake it.
class SupervisorWakeup {
 public:
  void wake();
  void stop();
  // Sleeps for `timeout` or until woken (0: not at all). False once stop()
  // was called, before or during the sleep.
  bool sleep(std::chrono::microseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mutex_
};

struct VolumeCore {
  VolumeCore(const VolumeOptions& volume_options, std::unique_ptr<region::Region> local_copy,
             std::unique_ptr<metadata::CopyMetadata> copy_metadata);

  // Fixed after open, except that closing turns block_when_insufficient off
  // (with the volume mutex held) so that closing never waits for replicas.
  VolumeOptions options;
  const std::unique_ptr<region::Region> local;  // persist() with the volume mutex held
  // Thread-safe on its own. Which peers it tracks and their dirty bits
  // change with the volume mutex held.
  const std::unique_ptr<metadata::CopyMetadata> meta;
  const uint64_t chunk_size;  // bytes per dirty bit
  const uint64_t chunks;      // dirty bits per peer

  // What a Hello tells the target with metadata peer `meta_index` about
  // this copy's generations (a fenced target checks it: docs/failover.md).
  protocol::Lineage lineage(size_t meta_index) const;

  // The volume mutex (see the top of this file).
  std::mutex mutex;
  // Notified, with `mutex`, when a replica becomes in sync or stops being
  // in sync (blocked persists and open() wait on it).
  std::condition_variable sync_changed;
  // Whether a waiting persist collects completions without the mutex (at
  // most one at a time), and notified, with `mutex`, when it has collected
  // some: the other waiters then look at what arrived.
  bool collecting = false;
  std::condition_variable collected;
  // Application threads waiting for `mutex`: the supervisor and verify let
  // them in between their steps rather than taking the mutex straight back.
  std::atomic<int> app_waiting{0};
  // Why this primary may no longer write, set (with `mutex`) when a target
  // said that another copy was promoted and fenced it out (kFenced), or
  // when the promoter's lease lapsed (kLeaseLost, check_lease below;
  // docs/failover.md): from then on every persist fails with it, and the
  // copy's generation no longer moves (a replica left behind now is not
  // given a new generation: the copy must stay a past of the new
  // primary's, not become a split brain against it). Never cleared: the
  // application must close the volume; its copy comes back as a replica of
  // the new primary.
  Status fenced;
  // The lease deadline file of this node's pmirror-promoter when the
  // volume needs a lease (InitiatorPlan::lease_file, docs/failover.md
  // section 2); null otherwise. Set at open before any persist, then
  // fixed; what it points at changes under the promoter's hand (atomic).
  std::unique_ptr<failover::LeaseFileReader> lease;
  // Ok while the lease holds at `now` (CLOCK_MONOTONIC ns) or the volume
  // needs none; once it does not, `fenced` becomes kLeaseLost for good
  // (logged once) and is returned. With `mutex` held.
  Status check_lease(uint64_t now);
  SupervisorWakeup supervisor_wakeup;
  // Snapshot persists' bytes (options.snapshot_buffer; empty without).
  // Allocated at open, before any session registers it; then guarded by
  // `mutex`. Declared before the reaper: it outlives every session.
  StagingBuffer staging;
  // Last: destroyed first, ending dropped sessions while the local copy
  // they registered is still mapped.
  SessionReaper reaper;

  uint64_t current_generation() const { return meta->info().generations.current; }
  // Bytes that `dirty` chunks stand for (the last chunk may be short).
  uint64_t chunk_bytes(uint64_t dirty) const;
};

// Takes the volume mutex for an application call, letting the supervisor
// know someone is waiting for it.
std::unique_lock<std::mutex> app_lock(VolumeCore& core);

}  // namespace pmirror::initiator
