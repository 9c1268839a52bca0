// How long a transport's poll() spins before it sleeps (PollMode,
// transport.h): shared by the tcp and rdma connections.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "transport/transport.h"

namespace pmirror::transport {

class SpinPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::nanoseconds kMinWindow = std::chrono::microseconds(10);
  static constexpr std::chrono::nanoseconds kMaxWindow = std::chrono::milliseconds(1);

  explicit SpinPolicy(PollMode mode) : mode_(mode) {}
  void set_mode(PollMode mode) { mode_.store(mode, std::memory_order_relaxed); }
  PollMode mode() const { return mode_.load(std::memory_order_relaxed); }

  // How long the wait starting now spins before sleeping (kBusy: until
  // the caller's deadline; the caller caps it).
  std::chrono::nanoseconds window() const {
    switch (mode()) {
      case PollMode::kEvent:
        return std::chrono::nanoseconds(0);
      case PollMode::kBusy:
        return std::chrono::nanoseconds::max();
      case PollMode::kAdaptive:
        break;
    }
    return std::chrono::nanoseconds(window_.load(std::memory_order_relaxed));
  }
  // A wait ended with a completion after `waited` (spinning or asleep):
  // the next one spins about twice that, so that completions which come
  // at a steady pace are caught spinning, and a connection whose waits are
  // long (idle, or a slow peer) spins only kMinWindow.
  void observed(std::chrono::nanoseconds waited) {
    auto next = waited > kMaxWindow ? kMinWindow : std::clamp(2 * waited, kMinWindow, kMaxWindow);
    window_.store(next.count(), std::memory_order_relaxed);
  }

 private:
  std::atomic<PollMode> mode_;
  std::atomic<int64_t> window_{std::chrono::nanoseconds(std::chrono::microseconds(100)).count()};
};

// A pause between two looks at a completion queue. Every 16th is a yield:
// on a machine with fewer cores than runnable threads a spinner must not
// keep the core that the completion's producer needs (tcp's receiver
// thread, rxe's kernel work, the peer on loopback).
inline void relax(uint32_t& spins) {
  if ((++spins & 15) == 0) {
    std::this_thread::yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace pmirror::transport
