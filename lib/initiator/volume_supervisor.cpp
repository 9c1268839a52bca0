#include "initiator/volume_supervisor.h"

#include <algorithm>

namespace pmirror::initiator {

VolumeSupervisor::VolumeSupervisor(VolumeCore& core, Peers& peers, Resyncer& resyncer)
    : core_(core), peers_(peers), resyncer_(resyncer) {}

VolumeSupervisor::~VolumeSupervisor() { stop(); }

void VolumeSupervisor::start() {
  thread_ = std::thread([this] { run(); });
}

void VolumeSupervisor::stop() {
  core_.supervisor_wakeup.stop();
  if (thread_.joinable()) thread_.join();
}

void VolumeSupervisor::run() {
  Work work = Work::kIdle;
  // Idle: look again soon. Waiting: a resync copy or an acknowledgement is
  // on its way, look again shortly. Busy: at once.
  auto pause = [](Work w) -> std::chrono::microseconds {
    return w == Work::kIdle      ? std::chrono::milliseconds(50)
           : w == Work::kWaiting ? std::chrono::microseconds(100)
                                 : std::chrono::microseconds(0);
  };
  while (core_.supervisor_wakeup.sleep(pause(work))) {
    work = supervise();
    if (work != Work::kIdle) {
      for (int spins = 0; core_.app_waiting.load() > 0 && spins < 1000; ++spins) {
        std::this_thread::sleep_for(std::chrono::microseconds(10));
      }
    }
  }
}

Work VolumeSupervisor::supervise() {
  Work work = Work::kIdle;
  for (const auto& peer : peers_.all()) {
    std::unique_lock lock(core_.mutex);
    work = std::max(work, supervise(*peer));
  }
  std::lock_guard lock(core_.mutex);
  peers_.settle();
  return work;
}

Work VolumeSupervisor::supervise(Peer& peer) {
  Work work = Work::kIdle;
  // A connection attempt that was under way when the peer was given up is
  // closed as it completes.
  auto close_late_connect = [&] {
    if (peer.connecting.valid() &&
        peer.connecting.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      auto late = peer.connecting.get();
      if (late.ok()) {
        (*late)->close();
        core_.reaper.reap(std::move(late).value());
      }
    }
  };
  if (!core_.fenced.ok()) {
    // This primary may no longer write (fenced, or its lease lapsed): its
    // sessions end now, so that the copies are the new primary's at once
    // (a session left open holds a copy's writer claim), and none starts
    // again -- a fenced primary reconnecting would only be refused, over and
    // over. The application must close the volume.
    close_late_connect();
    const std::string why = core_.fenced.message() + "; not reconnecting: close the volume";
    if (peer.live()) {
      peers_.drop(peer, Status(core_.fenced.code(), why), supervisor::PeerState::kRefused);
    } else if (!peer.connecting.valid() && peer.state.state() != supervisor::PeerState::kRefused) {
      peer.state.transition(supervisor::PeerState::kRefused, why);
    }
    return work;
  }
  if (peer.held_by_operator) {
    // `pmirrorctl disconnect`: none is started until `connect`.
    close_late_connect();
    if (peer.live()) peers_.drop(peer, Status(Errc::kClosed, "disconnected by an operator"));
    return work;
  }
  if (peer.connecting.valid()) {
    if (peer.connecting.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      return work;
    }
    if (auto resync = peers_.finish_reconnect(peer)) {
      resyncer_.start(peer, resync->full, resync->reason);
    }
  } else if (!peer.live() && Clock::now() >= peer.next_attempt) {
    peers_.start_reconnect(peer);
    return work;
  }
  if (!peer.live()) return work;
  // The progress check: persists no longer wait for every replica, so a
  // replica that stops answering without closing its connection is caught
  // here (a persist, copy or ping unanswered for operation_timeout),
  // however busy the volume is.
  if (Status alive = peer.replica->poll(std::chrono::milliseconds(0)); !alive.ok()) {
    peers_.drop(peer, alive);
    return work;
  }
  // A quiet volume's last persists are recorded on the target too.
  if (Status committed = peer.replica->commit_if_idle(Clock::now()); !committed.ok()) {
    peers_.drop(peer, committed);
    return work;
  }
  if (peer.lagging && peer.replica->in_flight_count() == 0 && peer.replica->has_credit()) {
    resyncer_.catch_up(peer);
    work = Work::kBusy;
  }
  bool settled = peers_.settle_generation(peer, [this](Peer& finished, uint64_t generation) {
    resyncer_.finish(finished, generation);
  });
  if (!settled) {
    if (!peer.live()) return work;
    // An acknowledgement to collect soon (a lagging replica sends none).
    if (!peer.lagging) work = std::max(work, Work::kWaiting);
  }
  if (resyncer_.active(peer)) {
    work = std::max(work, resyncer_.step(peer));
  } else if (peer.in_sync) {
    peers_.announce_generation(peer);
  }
  peers_.heartbeat_if_quiet(peer);
  return work;
}

}  // namespace pmirror::initiator
