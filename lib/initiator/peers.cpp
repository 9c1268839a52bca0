#include "initiator/peers.h"

#include <algorithm>

#include "common/log.h"
#include "initiator/sync_decision.h"

namespace pmirror::initiator {

using supervisor::PeerState;

bool is_misconfiguration(Errc code) {
  return code == Errc::kPermissionDenied || code == Errc::kNotFound ||
         code == Errc::kInvalidArgument || code == Errc::kUnsupported;
}

bool is_demotion(Errc code) { return code == Errc::kFailedPrecondition || code == Errc::kFenced; }

bool is_refusal(Errc code) {
  return is_misconfiguration(code) || is_demotion(code) || code == Errc::kBusy;
}

Peer::Peer(const VolumeOptions& options, const ReplicaSpec& replica_spec, size_t volume_index,
           supervisor::EventSink sink)
    : spec(replica_spec),
      label(replica_spec.node.empty()
                ? replica_spec.address + ":" + std::to_string(replica_spec.port)
                : replica_spec.node),
      index(volume_index),
      state(options.name, label, PeerState::kConnecting, std::move(sink)),
      backoff(options.reconnect_initial, options.reconnect_max) {}

Peers::Peers(VolumeCore& core, PersistLedger& ledger) : core_(core), ledger_(ledger) {}

Status Peers::add(const ReplicaSpec& spec, supervisor::EventSink sink) {
  if (peers_.size() >= kMaxReplicas) {
    return Status(Errc::kInvalidArgument,
                  "at most " + std::to_string(kMaxReplicas) + " replicas are supported");
  }
  peers_.push_back(std::make_unique<Peer>(core_.options, spec, peers_.size(), std::move(sink)));
  PMIRROR_ASSIGN_OR_RETURN(peers_.back()->meta_index, core_.meta->peer(peers_.back()->label));
  return Status::Ok();
}

Result<Peer*> Peers::lookup(const std::string& name) const {
  for (const auto& peer : peers_) {
    if (peer->label == name || peer->spec.node == name ||
        peer->spec.address + ":" + std::to_string(peer->spec.port) == name) {
      return peer.get();
    }
  }
  return Status(Errc::kNotFound, "volume '" + core_.options.name + "' has no replica '" + name +
                                     "' (replicas: " + names() + ")");
}

std::string Peers::names() const {
  std::string names;
  for (const auto& peer : peers_) names += (names.empty() ? "" : ", ") + peer->label;
  return names;
}

uint32_t Peers::required_acks() const {
  return core_.options.ack == 0 ? static_cast<uint32_t>(peers_.size()) : core_.options.ack;
}

uint32_t Peers::in_sync_count() const {
  uint32_t count = 0;
  for (const auto& peer : peers_) count += peer->live() && peer->in_sync ? 1 : 0;
  return count;
}

uint32_t Peers::live_count() const {
  uint32_t count = 0;
  for (const auto& peer : peers_) count += peer->live() ? 1 : 0;
  return count;
}

uint64_t Peers::durable_everywhere() const {
  uint64_t upto = ledger_.last_started();
  for (const auto& peer : peers_) {
    if (peer->live() && !peer->lagging) upto = std::min(upto, peer->replica->done_upto());
  }
  return upto;
}

void Peers::settle() { ledger_.settle(durable_everywhere()); }

std::string Peers::describe(const Peer& peer) {
  auto snapshot = peer.state.snapshot();
  return "replica " + peer.label + " is " + std::string(supervisor::state_name(snapshot.state)) +
         (snapshot.reason.empty() ? "" : " (" + snapshot.reason + ")");
}

// ------------------------------------------------------------ dirty maps

void Peers::ensure_tracked(Peer& peer) {
  // A primary that may no longer write keeps its copy's generation: it is a
  // past of the new primary's, which resyncs it, not a split brain.
  if (!core_.fenced.ok() || !core_.check_lease(failover::monotonic_now_ns()).ok()) return;
  auto recorded = core_.meta->peers();
  if (peer.meta_index < recorded.size() && recorded[peer.meta_index].bitmap_generation != 0) {
    return;
  }
  auto bumped = core_.meta->new_generation();
  if (!bumped.ok()) {
    log::error("volume {}: starting a new generation for replica {}: {}", core_.options.name,
               peer.label, bumped.status().to_string());
    return;
  }
  log::info("volume {}: replica {} left behind; generation is now {}", core_.options.name,
            peer.label, generation_hex(*bumped));
}

void Peers::mark_dirty(Peer& peer, uint64_t offset, uint64_t length) {
  if (auto marked = core_.meta->mark(peer.meta_index, offset, length); !marked.ok()) {
    // The local copy is still right; only an exact resync is at stake.
    log::error(
        "volume {}: recording [{}, +{}) dirty for {}: {}; a full resync will be "
        "needed",
        core_.options.name, offset, length, peer.label, marked.status().to_string());
    (void)core_.meta->mark_all(peer.meta_index);
  }
}

void Peers::mark_missed(Peer& peer, uint64_t offset, uint64_t length) {
  mark_dirty(peer, offset, length);
  if (listener_ != nullptr) listener_->range_missed(peer, offset, length);
}

void Peers::mark_unsent(uint64_t offset, uint64_t length) {
  // A fenced primary (or one whose lease lapsed) writes to no replica any
  // more: the new primary resyncs them; the marks only keep the record.
  const bool may_write = core_.fenced.ok() && core_.check_lease(failover::monotonic_now_ns()).ok();
  for (const auto& peer : peers_) {
    ensure_tracked(*peer);
    if (!peer->live()) {
      mark_dirty(*peer, offset, length);
      continue;
    }
    mark_missed(*peer, offset, length);
    // A lagging peer's resync starts when it answers again.
    if (may_write && !peer->lagging && listener_ != nullptr) listener_->unsent_ranges(*peer);
  }
}

// --------------------------------------------------- lagging and losing

void Peers::start_lagging(Peer& peer, const Status& why) {
  uint64_t done = peer.replica->done_upto();
  ledger_.for_each_unsettled([&](uint64_t sequence, const protocol::Range& range) {
    if (sequence > done) mark_missed(peer, range.offset, range.length);
  });
  ensure_tracked(peer);
  peer.replica->forget_queued();
  peer.lagging = true;
  peer.in_sync = false;
  peer.state.transition(PeerState::kLagging,
                        why.message() + "; its writes are recorded dirty until it catches up");
  core_.sync_changed.notify_all();
}

void Peers::note_fenced(const Status& why) {
  if (why.code() != Errc::kFenced || !core_.fenced.ok()) return;  // the first reason is kept
  core_.fenced = why;
  log::error("volume {}: this primary is fenced: {}; every persist fails from now on",
             core_.options.name, why.message());
  core_.sync_changed.notify_all();  // a persist blocked for replicas gives up
}

void Peers::drop(Peer& peer, const Status& why, PeerState to) {
  note_fenced(why);
  if (peer.replica) {
    uint64_t done = peer.replica->done_upto();
    peer.acknowledged = std::max(peer.acknowledged, done);
    ledger_.for_each_unsettled([&](uint64_t sequence, const protocol::Range& range) {
      if (sequence > done) mark_dirty(peer, range.offset, range.length);
    });
  }
  ensure_tracked(peer);
  ++peer.errors;
  if (peer.replica) peer.replica->close();
  ledger_.forget(peer.index);
  core_.reaper.reap(std::move(peer.replica));
  peer.in_sync = false;
  peer.lagging = false;
  if (listener_ != nullptr) listener_->session_ended(peer);
  peer.generation_updates.clear();
  peer.next_attempt = Clock::now() + peer.backoff.next();
  peer.last_error = why.message();
  peer.state.transition(to, why.message());
  settle();
}

// -------------------------------------------------------------- sessions

std::optional<ResyncNeeded> Peers::begin_session(Peer& peer, std::unique_ptr<Replica> replica) {
  if (replica->last_sequence() >= ledger_.next_sequence()) {
    // The replica recorded sequences beyond ours (another primary wrote
    // to it while this one ran without it). Sequences must rise on every
    // target: jump past it, which is only simple with nothing in flight.
    if (!ledger_.quiet()) {
      replica->close();
      core_.reaper.reap(std::move(replica));
      peer.next_attempt = Clock::now() + std::chrono::milliseconds(50);
      peer.state.transition(PeerState::kDisconnected,
                            "its last sequence " + std::to_string(replica->last_sequence()) +
                                " is beyond ours; retrying once no persist is in flight");
      return std::nullopt;
    }
    ledger_.continue_after(replica->last_sequence());
  }
  peer.replica = std::move(replica);
  Replica& session = *peer.replica;
  session.track_in(ledger_, peer.index);
  session.on_persist_done([&peer](Clock::duration took) {
    ++peer.persists;
    peer.latency.add(std::chrono::duration<double, std::micro>(took).count());
  });
  const RemoteCopy& remote = session.remote_copy();
  peer.remote_generation = remote.generations.current;
  const uint64_t size = core_.local->size();
  if (session.remote_unclean() && session.remote_activity_extent_size() != 0) {
    // An old primary that crashed: what its activity log names may differ.
    for (uint64_t extent : session.remote_activity_extents()) {
      uint64_t offset = extent * session.remote_activity_extent_size();
      if (offset >= size) continue;
      mark_dirty(peer, offset, std::min(session.remote_activity_extent_size(), size - offset));
    }
  }
  auto recorded = core_.meta->peers();
  metadata::PeerInfo info =
      peer.meta_index < recorded.size() ? recorded[peer.meta_index] : metadata::PeerInfo{};
  metadata::Generations ours = core_.meta->info().generations;
  SyncDecision decision = decide_sync(ours, info, remote, core_.options.overwrite_split_brain);
  log::info("volume {}: replica {}: {} ({})", core_.options.name, peer.label,
            sync_action_name(decision.action), decision.reason);
  switch (decision.action) {
    case SyncAction::kPeerNewer:
      session.close();
      core_.reaper.reap(std::move(peer.replica));
      ensure_tracked(peer);
      peer.next_attempt = Clock::now() + core_.options.reconnect_max;
      peer.state.transition(PeerState::kRefused, decision.reason);
      return std::nullopt;
    case SyncAction::kSplitBrain:
      session.abandon(Status(Errc::kSplitBrain, "primary " + core_.options.identity + " of '" +
                                                    core_.options.name + "': " + decision.reason));
      core_.reaper.reap(std::move(peer.replica));
      ensure_tracked(peer);
      peer.next_attempt = Clock::now() + core_.options.reconnect_max;
      peer.state.transition(PeerState::kSplitBrain, decision.reason);
      return std::nullopt;
    case SyncAction::kInSync:
      (void)core_.meta->set_peer_uuid(peer.meta_index, remote.uuid);
      if (info.bitmap_generation != 0) (void)core_.meta->untrack_peer(peer.meta_index);
      become_in_sync(peer, "session open, " + decision.reason);
      return std::nullopt;
    case SyncAction::kFullSync:
    case SyncAction::kResyncDirty:
      break;
  }
  bool full = decision.action == SyncAction::kFullSync;
  if (full) {
    if (Status all = core_.meta->mark_all(peer.meta_index); !all.ok()) {
      drop(peer, all.with_context("recording a full sync"));
      return std::nullopt;
    }
  }
  (void)core_.meta->set_peer_uuid(peer.meta_index, remote.uuid);
  ensure_tracked(peer);
  return ResyncNeeded{full, decision.reason};
}

void Peers::connect_failed(Peer& peer, const Status& why) {
  note_fenced(why);
  ensure_tracked(peer);
  peer.next_attempt = Clock::now() + peer.backoff.next();
  peer.last_error = why.message();
  peer.state.transition(is_refusal(why.code()) ? PeerState::kRefused : PeerState::kDisconnected,
                        why.message());
}

void Peers::connect_continues(Peer& peer, std::future<Result<std::unique_ptr<Replica>>> attempt) {
  ensure_tracked(peer);
  peer.connecting = std::move(attempt);
  peer.state.transition(PeerState::kConnecting,
                        "no answer yet at open; still connecting in the background");
}

void Peers::become_in_sync(Peer& peer, const std::string& reason) {
  peer.in_sync = true;
  peer.in_sync_since = ledger_.next_sequence();
  peer.told_generation = peer.replica->remote_copy().generations.current;
  peer.backoff.reset();
  peer.last_error.clear();
  peer.state.transition(PeerState::kConnected, reason);
  core_.sync_changed.notify_all();
}

void Peers::start_reconnect(Peer& peer) {
  peer.state.transition(PeerState::kConnecting,
                        "reconnect attempt " + std::to_string(peer.backoff.attempts()));
  peer.connecting = std::async(std::launch::async, [this, &peer] {
    return Replica::connect({core_.options, peer.spec, core_.local->data(), core_.local->size(),
                             core_.lineage(peer.meta_index), core_.staging.base(),
                             core_.staging.capacity(), core_.meta->info().promoted});
  });
}

std::optional<ResyncNeeded> Peers::finish_reconnect(Peer& peer) {
  auto replica = peer.connecting.get();
  if (!replica.ok()) {
    note_fenced(replica.status());
    peer.next_attempt = Clock::now() + peer.backoff.next();
    peer.last_error = replica.status().message();
    peer.state.transition(
        is_refusal(replica.status().code()) ? PeerState::kRefused : PeerState::kDisconnected,
        replica.status().message());
    return std::nullopt;
  }
  return begin_session(peer, std::move(replica).value());
}

// ----------------------------------------------------------- generations

void Peers::tell_generation(Peer& peer, GenerationNews news, uint64_t generation) {
  peer.generation_updates.push_back({news, generation, false});
  core_.supervisor_wakeup.wake();
}

bool Peers::settle_generation(Peer& peer, const std::function<void(Peer&, uint64_t)>& finished) {
  while (!peer.generation_updates.empty()) {
    GenerationUpdate& update = peer.generation_updates.front();
    if (!update.posted) {
      if (update.news == GenerationNews::kInconsistent) {
        // The generation it holds once the updates before were applied.
        update.generation = peer.replica->remote_copy().generations.current;
      }
      Status posted = peer.replica->post_generation(update.generation,
                                                    update.news != GenerationNews::kInconsistent);
      if (!posted.ok()) {
        if (peer.replica->failed()) drop(peer, posted);
        return false;  // else no receive slot free yet
      }
      update.posted = true;
    }
    auto done = peer.replica->generation_done();
    if (!done.ok()) {
      drop(peer, done.status());
      return false;
    }
    if (!*done) return false;
    GenerationUpdate told = update;
    peer.generation_updates.pop_front();
    switch (told.news) {
      case GenerationNews::kInconsistent:
        break;
      case GenerationNews::kAnnounce:
        peer.told_generation = told.generation;
        if (peer.in_sync && core_.meta->dirty_count(peer.meta_index) == 0) {
          (void)core_.meta->untrack_peer(peer.meta_index);
        }
        break;
      case GenerationNews::kFinish:
        finished(peer, told.generation);
        break;
    }
  }
  return true;
}

void Peers::announce_generation(Peer& peer) {
  uint64_t generation = core_.current_generation();
  if (peer.told_generation == generation || !peer.generation_updates.empty()) return;
  tell_generation(peer, GenerationNews::kAnnounce, generation);
}

// ------------------------------------------------------------ heartbeats

void Peers::heartbeat_if_quiet(Peer& peer) {
  if (!peer.live()) return;
  auto now = Clock::now();
  auto quiet_since = std::min(peer.replica->last_heard(), peer.replica->last_message_sent());
  if (now - std::max(quiet_since, peer.last_ping) >= core_.options.heartbeat_interval) {
    peer.last_ping = now;
    if (Status alive = peer.replica->heartbeat(); !alive.ok()) drop(peer, alive);
  }
}

// ---------------------------------------------------------------- status

PeerStatus Peers::status(const Peer& peer) const {
  PeerStatus s;
  s.name = peer.label;
  s.address = peer.spec.address + ":" + std::to_string(peer.spec.port);
  s.transport = peer.spec.transport;
  s.connection = peer.state.snapshot();
  s.acknowledged_sequence = peer.replica ? peer.replica->done_upto() : peer.acknowledged;
  s.method = peer.replica ? peer.replica->method_name() : "";
  uint64_t last = ledger_.last_started();
  s.lag = last > s.acknowledged_sequence ? last - s.acknowledged_sequence : 0;
  s.persists = peer.persists;
  s.bytes = peer.bytes;
  s.errors = peer.errors;
  s.dirty_chunks = core_.meta->dirty_count(peer.meta_index);
  s.dirty_bytes = core_.chunk_bytes(s.dirty_chunks);
  auto recorded = core_.meta->peers();
  if (peer.meta_index < recorded.size()) {
    s.behind_since_generation = recorded[peer.meta_index].bitmap_generation;
    s.full_sync_pending = recorded[peer.meta_index].full_sync;
    s.never_seen = recorded[peer.meta_index].peer_uuid == metadata::Uuid{};
  }
  s.generation = peer.remote_generation;
  s.by_operator = peer.held_by_operator;
  s.latency_us = peer.latency.percentiles();
  if (peer.verifying) s.verify = VerifyProgress{peer.verify_done_bytes, core_.local->size()};
  return s;
}

ReplicaStatus Peers::replica_status(const Peer& peer) const {
  ReplicaStatus s;
  if (peer.replica) {
    s = peer.replica->status();
  } else {
    s.address = peer.label;
    s.transport = peer.spec.transport;
    s.state = ReplicaState::kFailed;
  }
  auto snapshot = peer.state.snapshot();
  s.connection = supervisor::state_name(snapshot.state);
  if (s.last_error.empty()) s.last_error = peer.last_error;
  if (s.last_error.empty() && snapshot.state != PeerState::kConnected) {
    s.last_error = snapshot.reason;
  }
  return s;
}

}  // namespace pmirror::initiator
