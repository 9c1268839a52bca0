// The supervisor's building blocks, shared by pmirrord and libpmirror:
// a readable connection state machine per (volume, peer) that remembers
// since when and why, publishes every change as an event, and an
// exponential backoff with jitter for reconnecting.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <string_view>

namespace pmirror::supervisor {

enum class PeerState {
  kConnecting,    // transport connect under way
  kHandshaking,   // connected, authenticating / exchanging the descriptor
  kSyncing,       // session up, copy being brought up to date (not counted for acks)
  kConnected,     // in sync: persists wait for it
  kLagging,       // session up, but it fell behind: its writes are recorded dirty instead of
                  // waited for (not counted for acks) until it answers again and is resynced
  kDisconnected,  // lost; reconnect scheduled
  kRefused,       // the peer refused us (auth, unknown volume, busy); retried slowly
  kSplitBrain,    // both copies moved on from a common generation; never synced automatically
  kClosed,        // closed on purpose
};
std::string_view state_name(PeerState state);

using SystemTime = std::chrono::system_clock::time_point;

struct StateChange {
  SystemTime time;
  std::string volume;
  std::string peer;
  PeerState from;
  PeerState to;
  std::string reason;
};
using EventSink = std::function<void(const StateChange&)>;

// Thread-safe record of one peer's connection state.
class PeerStateMachine {
 public:
  PeerStateMachine(std::string volume, std::string peer, PeerState initial, EventSink sink);

  // Records the change (no-op if already in `to` with the same reason) and
  // publishes it.
  void transition(PeerState to, std::string reason);

  struct Snapshot {
    PeerState state;
    SystemTime since;
    std::string reason;
  };
  Snapshot snapshot() const;
  PeerState state() const;

 private:
  std::string volume_;
  std::string peer_;
  EventSink sink_;
  mutable std::mutex mutex_;
  PeerState state_;     // guarded by mutex_
  SystemTime since_;    // guarded by mutex_
  std::string reason_;  // guarded by mutex_
};

// Exponential backoff with +-jitter: initial, initial*2, ... capped at max.
class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max, double jitter = 0.2);
  std::chrono::milliseconds next();  // the delay before the next attempt
  void reset();
  uint32_t attempts() const { return attempts_; }

 private:
  std::chrono::milliseconds initial_;
  std::chrono::milliseconds max_;
  double jitter_;
  uint32_t attempts_ = 0;
  std::mt19937_64 rng_;
};

// Latency percentiles over a sliding window of the last N samples, and
// the count and sum of every sample ever added (a Prometheus summary's
// _count and _sum: rate(_sum)/rate(_count) is the mean over any range).
class LatencyWindow {
 public:
  explicit LatencyWindow(size_t capacity = 4096);
  void add(double microseconds);
  struct Percentiles {
    double p50 = 0, p99 = 0, p999 = 0;
    uint64_t count = 0;  // all samples ever added
    double sum = 0;      // of all samples ever added, microseconds
  };
  Percentiles percentiles() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> samples_;  // ring; guarded by mutex_
  size_t next_ = 0;
  uint64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace pmirror::supervisor
