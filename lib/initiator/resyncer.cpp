#include "initiator/resyncer.h"

#include <algorithm>
#include <cmath>

#include "common/log.h"

namespace pmirror::initiator {

using supervisor::PeerState;

Resyncer::Resyncer(VolumeCore& core, Peers& peers)
    : core_(core), peers_(peers), jobs_(kMaxReplicas, Job(core.options.resync_rate)) {}

void Resyncer::start(Peer& peer, bool full, const std::string& reason) {
  // The replica's copy is a mix of two generations until the resync ends
  // (copies wait until it knows).
  if (!peer.in_sync) peers_.tell_generation(peer, GenerationNews::kInconsistent, 0);
  Job& job = jobs_[peer.index];
  job.active = true;
  job.full = full;
  job.cursor = 0;
  job.done_bytes = 0;
  job.total_bytes = core_.chunk_bytes(core_.meta->dirty_count(peer.meta_index));
  job.started = Clock::now();
  job.rate = 0;
  job.limiter.restart(Clock::now());
  if (!peer.in_sync) {
    peer.state.transition(PeerState::kSyncing,
                          reason + "; copying " + std::to_string(job.total_bytes) + " bytes");
  }
}

Result<ResyncStarted> Resyncer::request(const std::string& name, bool full) {
  PMIRROR_ASSIGN_OR_RETURN(Peer * peer, peers_.lookup(name));
  if (!peer->live()) {
    auto snapshot = peer->state.snapshot();
    return Status(Errc::kFailedPrecondition,
                  "replica " + peer->label + " is " +
                      std::string(supervisor::state_name(snapshot.state)) +
                      "; a resync starts by itself when it reconnects");
  }
  if (peer->lagging) {
    return Status(Errc::kFailedPrecondition,
                  "replica " + peer->label +
                      " is lagging (it does not answer); a resync starts by itself when it "
                      "answers again");
  }
  if (full) PMIRROR_RETURN_IF_ERROR(core_.meta->mark_all(peer->meta_index));
  peers_.ensure_tracked(*peer);
  start(*peer, full, full ? "full resync requested" : "resync requested");
  core_.supervisor_wakeup.wake();
  return ResyncStarted{peer->label, full, jobs_[peer->index].total_bytes};
}

void Resyncer::catch_up(Peer& peer) {
  peers_.stop_lagging(peer);
  if (jobs_[peer.index].active) {
    peer.state.transition(PeerState::kSyncing, "answering again; copying what it missed");
    return;
  }
  start(peer, false, "answering again after lagging");
}

Work Resyncer::step(Peer& peer) {
  Job& job = jobs_[peer.index];
  bool completed = false;
  if (job.copy_in_flight) {
    auto done = peer.replica->resync_done();
    if (!done.ok()) {
      peers_.drop(peer, done.status());
      return Work::kIdle;
    }
    if (!*done) return Work::kWaiting;
    complete_copy(peer, job);
    completed = true;
  }
  // Nothing new while it lags (it answers nothing), while a generation
  // update travels, or while its receive slots are taken (persists first;
  // look again shortly).
  if (peer.lagging) return completed ? Work::kBusy : Work::kIdle;
  if (!peer.generation_updates.empty() || !peer.replica->has_credit()) return Work::kWaiting;
  const uint64_t chunk_size = core_.chunk_size;
  const uint64_t chunks = core_.chunks;
  uint64_t step =
      job.limiter.grant(Clock::now(), std::max(core_.options.resync_step, chunk_size), chunk_size);
  if (step == 0) return Work::kIdle;
  uint64_t first = core_.meta->next_dirty(peer.meta_index, job.cursor);
  if (first >= chunks && job.cursor != 0) {
    // Wrap once: a chunk before the cursor may have been marked since.
    job.cursor = 0;
    first = core_.meta->next_dirty(peer.meta_index, 0);
  }
  if (first >= chunks) {
    // Nothing dirty left: once the replica knows it holds our generation,
    // it is in sync.
    peers_.tell_generation(peer, GenerationNews::kFinish, core_.current_generation());
    return Work::kWaiting;
  }
  uint64_t run = 1;
  while (first + run < chunks && (run + 1) * chunk_size <= step &&
         core_.meta->is_dirty(peer.meta_index, first + run)) {
    ++run;
  }
  uint64_t offset = first * chunk_size;
  uint64_t length = std::min(run * chunk_size, core_.local->size() - offset);
  if (Status posted = peer.replica->post_resync(offset, length); !posted.ok()) {
    peers_.drop(peer, posted);
    return Work::kIdle;
  }
  job.copy_in_flight = true;
  job.copy_first = first;
  job.copy_run = run;
  job.copy_length = length;
  job.cursor = first + run;
  job.limiter.spend(length);
  return Work::kWaiting;
}

void Resyncer::complete_copy(Peer& peer, Job& job) {
  job.copy_in_flight = false;
  if (job.copy_stale) {
    // Written meanwhile and not sent after the copy: copied again later.
    job.copy_stale = false;
    return;
  }
  for (uint64_t chunk = job.copy_first; chunk < job.copy_first + job.copy_run; ++chunk) {
    if (Status cleared = core_.meta->clear(peer.meta_index, chunk); !cleared.ok()) {
      log::error("volume {}: clearing chunk {} for {}: {}", core_.options.name, chunk, peer.label,
                 cleared.to_string());
    }
  }
  job.done_bytes += job.copy_length;
  job.resynced_chunks += job.copy_run;
  job.resynced_bytes += job.copy_length;
  double seconds = std::chrono::duration<double>(Clock::now() - job.started).count();
  if (seconds > 0) job.rate = double(job.done_bytes) / seconds;
}

void Resyncer::finish(Peer& peer, uint64_t generation) {
  Job& job = jobs_[peer.index];
  if (peer.lagging || core_.meta->next_dirty(peer.meta_index, 0) < core_.chunks) {
    // It lagged meanwhile: written and not sent, so mixed again.
    job.cursor = 0;
    peers_.tell_generation(peer, GenerationNews::kInconsistent, 0);
    return;
  }
  if (Status untracked = core_.meta->untrack_peer(peer.meta_index); !untracked.ok()) {
    log::warn("volume {}: replica {}: {}", core_.options.name, peer.label, untracked.to_string());
  }
  job.active = false;
  ++job.resyncs;
  std::string what = "in sync after copying " + std::to_string(job.done_bytes) + " bytes" +
                     (job.full ? " (full sync)" : " (dirty chunks)");
  if (peer.in_sync) {
    peer.told_generation = generation;
    peer.state.transition(PeerState::kConnected, what);
  } else {
    peers_.become_in_sync(peer, what);
    peer.told_generation = generation;
  }
}

void Resyncer::status(const Peer& peer, PeerStatus& status) const {
  const Job& job = jobs_[peer.index];
  status.resynced_chunks = job.resynced_chunks;
  status.resynced_bytes = job.resynced_bytes;
  status.resyncs = job.resyncs;
  if (!job.active) return;
  ResyncProgress progress;
  uint64_t left = job.total_bytes > job.done_bytes ? job.total_bytes - job.done_bytes : 0;
  left = std::max(left, core_.chunk_bytes(core_.meta->dirty_count(peer.meta_index)));
  progress.done_bytes = job.done_bytes;
  progress.left_bytes = left;
  progress.total_bytes = job.done_bytes + left;
  progress.rate_bytes_per_s = uint64_t(job.rate);
  if (job.rate > 0) progress.eta_seconds = uint64_t(std::ceil(double(left) / job.rate));
  progress.full = job.full;
  status.resync = progress;
}

void Resyncer::session_ended(Peer& peer) {
  Job& job = jobs_[peer.index];
  job.active = false;
  job.copy_in_flight = false;
  job.copy_stale = false;
}

void Resyncer::range_missed(Peer& peer, uint64_t offset, uint64_t length) {
  Job& job = jobs_[peer.index];
  if (!job.copy_in_flight) return;
  uint64_t begin = job.copy_first * core_.chunk_size;
  if (offset < begin + job.copy_length && offset + length > begin) job.copy_stale = true;
}

void Resyncer::unsent_ranges(Peer& peer) {
  // A resync under way finds the new dirty chunks (its cursor wraps, and
  // it does not finish while any is left).
  if (jobs_[peer.index].active) return;
  start(peer, false, "copying what failed persists left out");
  core_.supervisor_wakeup.wake();
}

}  // namespace pmirror::initiator
