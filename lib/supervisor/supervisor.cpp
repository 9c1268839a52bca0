#include "supervisor/supervisor.h"

#include <algorithm>

namespace pmirror::supervisor {

std::string_view state_name(PeerState state) {
  switch (state) {
    case PeerState::kConnecting: return "connecting";
    case PeerState::kHandshaking: return "handshaking";
    case PeerState::kSyncing: return "syncing";
    case PeerState::kConnected: return "connected";
    case PeerState::kLagging: return "lagging";
    case PeerState::kDisconnected: return "disconnected";
    case PeerState::kRefused: return "refused";
    case PeerState::kSplitBrain: return "split-brain";
    case PeerState::kClosed: return "closed";
  }
  return "unknown";
}

PeerStateMachine::PeerStateMachine(std::string volume, std::string peer, PeerState initial,
                                   EventSink sink)
    : volume_(std::move(volume)),
      peer_(std::move(peer)),
      sink_(std::move(sink)),
      state_(initial),
      since_(std::chrono::system_clock::now()) {}

void PeerStateMachine::transition(PeerState to, std::string reason) {
  StateChange change;
  {
    std::lock_guard lock(mutex_);
    if (state_ == to && reason_ == reason) return;
    change = {std::chrono::system_clock::now(), volume_, peer_, state_, to, reason};
    if (state_ != to) since_ = change.time;
    state_ = to;
    reason_ = std::move(reason);
  }
  if (sink_ && change.from != change.to) sink_(change);
}

PeerStateMachine::Snapshot PeerStateMachine::snapshot() const {
  std::lock_guard lock(mutex_);
  return {state_, since_, reason_};
}

PeerState PeerStateMachine::state() const {
  std::lock_guard lock(mutex_);
  return state_;
}

Backoff::Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max, double jitter)
    : initial_(initial), max_(std::max(max, initial)), jitter_(jitter), rng_(std::random_device{}()) {}

std::chrono::milliseconds Backoff::next() {
  double base = static_cast<double>(initial_.count());
  for (uint32_t i = 0; i < attempts_ && base < static_cast<double>(max_.count()); ++i) base *= 2;
  base = std::min(base, static_cast<double>(max_.count()));
  ++attempts_;
  // Jitter spreads the reconnects of many initiators after a target restart.
  std::uniform_real_distribution<double> spread(1.0 - jitter_, 1.0 + jitter_);
  return std::chrono::milliseconds(static_cast<int64_t>(base * spread(rng_)));
}

void Backoff::reset() { attempts_ = 0; }

LatencyWindow::LatencyWindow(size_t capacity) { samples_.reserve(capacity); }

void LatencyWindow::add(double microseconds) {
  std::lock_guard lock(mutex_);
  if (samples_.size() < samples_.capacity()) {
    samples_.push_back(microseconds);
  } else {
    samples_[next_] = microseconds;
    next_ = (next_ + 1) % samples_.size();
  }
  ++count_;
  sum_ += microseconds;
}

LatencyWindow::Percentiles LatencyWindow::percentiles() const {
  std::vector<double> sorted;
  Percentiles out;
  {
    std::lock_guard lock(mutex_);
    sorted = samples_;
    out.count = count_;
    out.sum = sum_;
  }
  if (sorted.empty()) return out;
  std::sort(sorted.begin(), sorted.end());
  auto at = [&](double q) {
    return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
  };
  out.p50 = at(0.50);
  out.p99 = at(0.99);
  out.p999 = at(0.999);
  return out;
}

}  // namespace pmirror::supervisor
