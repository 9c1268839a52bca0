// A token bucket for the resync copies of one replica (`resync_rate`
// bytes/s): the allowance grows with time, up to one step or a tenth of a
// second's worth, whichever is more, and each copy spends what it sends.
// Pure (the caller passes the time), so that it is unit-tested exactly.
// Not thread-safe: the resyncer's, guarded by the volume mutex.
#pragma once

#include <chrono>
#include <cstdint>

namespace pmirror::initiator {

class RateLimiter {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  explicit RateLimiter(uint64_t bytes_per_second);  // 0: unlimited

  // An empty bucket, filling from `now` (a resync starts).
  void restart(TimePoint now);
  // Refills for the time since the last call, then how many of `want`
  // bytes may go now: 0 while fewer than `least` are allowed. Unlimited:
  // `want`.
  uint64_t grant(TimePoint now, uint64_t want, uint64_t least);
  // `bytes` were sent.
  void spend(uint64_t bytes);

 private:
  uint64_t rate_;
  double tokens_ = 0;  // bytes allowed now
  TimePoint refilled_{};
};

}  // namespace pmirror::initiator
