#include "initiator/open_volume.h"

#include <algorithm>

#include "common/log.h"
#include "region/region.h"

namespace pmirror::initiator {

using supervisor::PeerState;

OpenVolume::OpenVolume(const VolumeOptions& options, std::unique_ptr<region::Region> local,
                       std::unique_ptr<metadata::CopyMetadata> meta)
    : core(options, std::move(local), std::move(meta)),
      activity(*core.meta, options.name),
      peers(core, ledger),
      resyncer(core, peers),
      pipeline(core, ledger, activity, peers),
      verifier(core, ledger, peers, resyncer),
      supervisor(core, peers, resyncer) {
  peers.set_listener(&resyncer);
}

void OpenVolume::begin_sessions(
    std::vector<Result<std::unique_ptr<Replica>>>& connected,
    std::vector<std::future<Result<std::unique_ptr<Replica>>>>& still_connecting) {
  std::lock_guard lock(core.mutex);
  uint64_t highest = 0;
  for (size_t i = 0; i < connected.size(); ++i) {
    Peer& peer = *peers.all()[i];
    if (still_connecting[i].valid()) {
      peers.connect_continues(peer, std::move(still_connecting[i]));
      continue;
    }
    if (!connected[i].ok()) {
      peers.connect_failed(peer, connected[i].status());
      continue;
    }
    highest = std::max(highest, (*connected[i])->last_sequence());
    if (auto needed = peers.begin_session(peer, std::move(connected[i]).value())) {
      resyncer.start(peer, needed->full, needed->reason);
    }
  }
  ledger.continue_after(highest);
  for (const auto& peer : peers.all()) {
    if (peer->in_sync) peer->in_sync_since = ledger.next_sequence();
  }
}

Status OpenVolume::wait_for_ack_replicas() {
  std::unique_lock lock(core.mutex);
  auto deadline = Clock::now() + core.options.open_sync_timeout;
  const uint32_t required = peers.required_acks();
  while (peers.in_sync_count() < required) {
    if ((peers.live_count() < required && !core.options.block_when_insufficient) ||
        Clock::now() > deadline) {
      std::string states;
      Errc code = Errc::kConnectionError;
      for (const auto& peer : peers.all()) {
        auto snapshot = peer->state.snapshot();
        if (!states.empty()) states += "; ";
        states += peer->label + " is " + std::string(supervisor::state_name(snapshot.state)) +
                  (snapshot.reason.empty() ? "" : " (" + snapshot.reason + ")");
      }
      uint32_t in_sync = peers.in_sync_count();
      lock.unlock();
      supervisor.stop();
      for (const auto& peer : peers.all()) {
        if (peer->state.snapshot().state == PeerState::kSplitBrain) code = Errc::kSplitBrain;
      }
      return Status(code, "opening volume '" + core.options.name + "': " + std::to_string(in_sync) +
                              " of the " + std::to_string(required) +
                              " replicas required are in sync: " + states);
    }
    core.sync_changed.wait_for(lock, std::chrono::milliseconds(100));
  }
  return Status::Ok();
}

VolumeStatus OpenVolume::status() {
  std::lock_guard lock(core.mutex);
  VolumeStatus s;
  for (const auto& peer : peers.all()) {
    PeerStatus p = peers.status(*peer);
    resyncer.status(*peer, p);
    s.peers.push_back(std::move(p));
  }
  auto info = core.meta->info();
  s.name = core.options.name;
  s.size = core.local->size();
  s.path = core.local->path();
  s.backing = region::backing_name(core.local->backing());
  s.metadata = core.meta->path();
  s.generation = info.generations.current;
  s.chunk_size = core.chunk_size;
  s.promoted = info.promoted;
  s.last_sequence = ledger.last_started();
  s.acknowledged_sequence = ledger.acknowledged();
  s.ack_required = peers.required_acks();
  s.in_sync = peers.in_sync_count();
  s.identity = core.options.identity;
  s.opened_at = opened_at;
  if (core.lease) {
    const uint64_t now = failover::monotonic_now_ns();
    const uint64_t deadline = core.lease->deadline_ns();
    s.lease = LeaseStatus{core.lease->path(), now < deadline ? (deadline - now) / 1'000'000 : 0};
  }
  return s;
}

Result<ResyncStarted> OpenVolume::resync(const std::string& peer, bool full) {
  std::lock_guard lock(core.mutex);
  return resyncer.request(peer, full);
}

Result<std::vector<PeerSwitched>> OpenVolume::set_connected(const std::string& name, bool connect) {
  std::lock_guard lock(core.mutex);
  std::vector<Peer*> chosen;
  if (name.empty()) {
    for (const auto& peer : peers.all()) chosen.push_back(peer.get());
  } else {
    PMIRROR_ASSIGN_OR_RETURN(Peer * peer, peers.lookup(name));
    chosen.push_back(peer);
  }
  std::vector<PeerSwitched> switched;
  for (Peer* peer : chosen) {
    switched.push_back({peer->label, peer->held_by_operator == connect});
    if (peer->held_by_operator != connect) continue;
    peer->held_by_operator = !connect;
    if (connect) {
      // The supervisor reconnects it at once; the session's start decides
      // its resync from what was recorded dirty meanwhile.
      peer->backoff.reset();
      peer->next_attempt = Clock::now();
      peer->state.transition(supervisor::PeerState::kDisconnected,
                             "connect asked by an operator; reconnecting");
      continue;
    }
    const std::string why = "disconnected by an operator (`pmirrorctl connect " +
                            core.options.name + " --peer " + peer->label + "` reconnects it)";
    if (peer->live()) {
      peers.drop(*peer, Status(Errc::kClosed, why));
    } else {
      // Not connected: what is written from now on is recorded for it.
      peers.ensure_tracked(*peer);
      peer->state.transition(supervisor::PeerState::kDisconnected, why);
    }
  }
  return switched;
}

void OpenVolume::let_replicas_catch_up() {
  std::unique_lock lock(core.mutex);
  // A fenced primary, or one whose lease lapsed, resyncs nobody.
  if (!core.fenced.ok() || !core.check_lease(failover::monotonic_now_ns()).ok()) return;
  auto behind = [&] {
    for (const auto& peer : peers.all()) {
      if (peer->live() && (!peer->in_sync || !peer->generation_updates.empty())) return true;
    }
    return false;
  };
  const auto deadline = Clock::now() + core.options.operation_timeout;
  if (behind()) {
    log::info("volume {}: closing: letting connected replicas catch up first (up to {} ms)",
              core.options.name, core.options.operation_timeout.count());
  }
  // The supervisor brings them up to date and wakes sync_changed when one
  // is in sync; a generation update's answer wakes nobody, hence the poll.
  while (behind() && Clock::now() < deadline) {
    core.sync_changed.wait_for(lock, std::chrono::milliseconds(20));
  }
}

void OpenVolume::close() {
  let_replicas_catch_up();
  supervisor.stop();
  for (const auto& peer : peers.all()) {
    if (!peer->connecting.valid()) continue;
    auto late = peer->connecting.get();  // a reconnect still under way
    if (late.ok()) (*late)->close();
  }
  std::unique_lock lock(core.mutex);
  core.options.block_when_insufficient = false;  // closing never waits for replicas to return
  // Every persist started is now durable on each live replica, or that
  // replica was dropped and its ranges recorded dirty: nothing is left
  // for the activity log to cover.
  if (ledger.last_started() > 0) (void)pipeline.wait(lock, ledger.last_started());
  // Replicas beyond `ack` may still have persists on their way: let them
  // land (each up to operation_timeout) rather than record them dirty.
  for (const auto& peer : peers.all()) {
    if (!peer->live() || peer->lagging) continue;
    if (Status drained = peer->replica->drain(); !drained.ok()) peers.drop(*peer, drained);
  }
  for (const auto& peer : peers.all()) {
    if (!peer->live()) continue;
    uint64_t done = peer->replica->done_upto();
    ledger.for_each_unsettled([&](uint64_t sequence, const protocol::Range& range) {
      if (sequence > done) {
        peers.mark_dirty(*peer, range.offset, range.length);
        peers.ensure_tracked(*peer);
      }
    });
  }
  for (const auto& peer : peers.all()) {
    if (peer->replica) peer->replica->close();
    peer->state.transition(PeerState::kClosed, "volume closed");
  }
  if (Status cleared = core.meta->clear_activity_log(); cleared.ok()) {
    (void)core.meta->set_clean(true);
  }
  lock.unlock();
  core.reaper.drain();  // every session dropped before has ended too
}

}  // namespace pmirror::initiator
