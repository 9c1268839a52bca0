// The resync's token bucket, with the time given by the test.
#include "initiator/rate_limiter.h"

#include <gtest/gtest.h>

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kChunk = 4096;
constexpr uint64_t kStep = 1 << 20;

TEST(RateLimiter, UnlimitedGrantsEverything) {
  RateLimiter limiter(0);
  auto t = std::chrono::steady_clock::now();
  limiter.restart(t);
  EXPECT_EQ(limiter.grant(t, kStep, kChunk), kStep);
  limiter.spend(kStep);
  EXPECT_EQ(limiter.grant(t, kStep, kChunk), kStep);
}

TEST(RateLimiter, GrantsWhatTheRateAllowsSinceTheStart) {
  RateLimiter limiter(1 << 20);  // 1 MiB/s
  auto t = std::chrono::steady_clock::now();
  limiter.restart(t);
  EXPECT_EQ(limiter.grant(t, kStep, kChunk), 0u) << "an empty bucket at the start";
  EXPECT_EQ(limiter.grant(t + 1ms, kStep, kChunk), 0u) << "1 KiB: less than a chunk";
  // 10 ms more: ~11.5 KiB in the bucket.
  uint64_t granted = limiter.grant(t + 11ms, kStep, kChunk);
  EXPECT_GE(granted, 11u * 1024 - 1);
  EXPECT_LE(granted, 12u * 1024);
  limiter.spend(granted);
  EXPECT_EQ(limiter.grant(t + 11ms, kStep, kChunk), 0u) << "spent";
}

TEST(RateLimiter, TheBucketHoldsAtMostAStepOrATenthOfASecond) {
  auto t = std::chrono::steady_clock::now();
  RateLimiter slow(1 << 20);
  slow.restart(t);
  // After an hour idle: one step (1 MiB > 1 MiB/s / 10), not an hour's worth.
  EXPECT_EQ(slow.grant(t + 1h, 4 * kStep, kChunk), 4 * kStep);
  slow.spend(4 * kStep);
  EXPECT_EQ(slow.grant(t + 1h, 4 * kStep, kChunk), 0u);

  RateLimiter fast(100ull << 20);  // 100 MiB/s: a tenth of a second is 10 MiB
  fast.restart(t);
  EXPECT_EQ(fast.grant(t + 1h, kStep, kChunk), kStep) << "never more than asked";
  fast.spend(kStep);
  EXPECT_EQ(fast.grant(t + 1h, 20 * kStep, kChunk), 9 * kStep) << "10 MiB, one of them spent";
}

TEST(RateLimiter, RestartEmptiesTheBucket) {
  RateLimiter limiter(1 << 20);
  auto t = std::chrono::steady_clock::now();
  limiter.restart(t);
  EXPECT_GT(limiter.grant(t + 500ms, kStep, kChunk), 0u);
  limiter.restart(t + 500ms);
  EXPECT_EQ(limiter.grant(t + 500ms, kStep, kChunk), 0u);
}

}  // namespace
}  // namespace pmirror::initiator
