#include "initiator/rate_limiter.h"

#include <algorithm>

namespace pmirror::initiator {

RateLimiter::RateLimiter(uint64_t bytes_per_second) : rate_(bytes_per_second) {}

void RateLimiter::restart(TimePoint now) {
  tokens_ = 0;
  refilled_ = now;
}

uint64_t RateLimiter::grant(TimePoint now, uint64_t want, uint64_t least) {
  if (rate_ == 0) return want;
  double elapsed = std::chrono::duration<double>(now - refilled_).count();
  refilled_ = now;
  tokens_ =
      std::min(tokens_ + elapsed * double(rate_), double(std::max<uint64_t>(want, rate_ / 10)));
  if (tokens_ < double(least)) return 0;
  return std::min<uint64_t>(want, uint64_t(tokens_));
}

void RateLimiter::spend(uint64_t bytes) {
  if (rate_ != 0) tokens_ -= double(bytes);
}

}  // namespace pmirror::initiator
