#include "supervisor/supervisor.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace pmirror::supervisor {
namespace {

using namespace std::chrono_literals;

TEST(BackoffTest, DoublesUpToTheCapWithJitterInsideItsBand) {
  Backoff backoff(100ms, 1000ms, 0.2);
  const double expected[] = {100, 200, 400, 800, 1000, 1000, 1000};
  for (double base : expected) {
    auto delay = backoff.next().count();
    EXPECT_GE(delay, base * 0.8 - 1) << "base " << base;
    EXPECT_LE(delay, base * 1.2 + 1) << "base " << base;
  }
  EXPECT_EQ(backoff.attempts(), 7u);
  backoff.reset();
  EXPECT_LE(backoff.next().count(), 121);
}

TEST(BackoffTest, JitterSpreadsTheDelays) {
  Backoff backoff(1000ms, 1000ms, 0.2);
  std::vector<int64_t> delays;
  for (int i = 0; i < 50; ++i) delays.push_back(backoff.next().count());
  auto [low, high] = std::minmax_element(delays.begin(), delays.end());
  EXPECT_LT(*low, *high) << "fifty delays without any jitter";
}

TEST(PeerStateMachineTest, RecordsSinceAndReasonAndPublishesChanges) {
  std::vector<StateChange> seen;
  PeerStateMachine machine("db0", "node2", PeerState::kConnecting,
                           [&](const StateChange& c) { seen.push_back(c); });
  auto before = machine.snapshot().since;
  std::this_thread::sleep_for(5ms);
  machine.transition(PeerState::kConnected, "session open");
  machine.transition(PeerState::kConnected, "session open");  // no change: no event
  machine.transition(PeerState::kDisconnected, "nothing heard for 5000 ms");
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].from, PeerState::kConnecting);
  EXPECT_EQ(seen[0].to, PeerState::kConnected);
  EXPECT_EQ(seen[1].volume, "db0");
  EXPECT_EQ(seen[1].peer, "node2");
  EXPECT_EQ(seen[1].reason, "nothing heard for 5000 ms");
  auto now = machine.snapshot();
  EXPECT_EQ(now.state, PeerState::kDisconnected);
  EXPECT_EQ(now.reason, "nothing heard for 5000 ms");
  EXPECT_GT(now.since, before);
}

TEST(PeerStateMachineTest, ANewReasonInTheSameStateKeepsSince) {
  int events = 0;
  PeerStateMachine machine("v", "p", PeerState::kDisconnected,
                           [&](const StateChange&) { ++events; });
  auto since = machine.snapshot().since;
  std::this_thread::sleep_for(5ms);
  machine.transition(PeerState::kDisconnected, "connection refused");
  EXPECT_EQ(machine.snapshot().since, since);
  EXPECT_EQ(machine.snapshot().reason, "connection refused");
  EXPECT_EQ(events, 0);
}

TEST(LatencyWindowTest, PercentilesOfTheLastSamples) {
  LatencyWindow window(1000);
  for (int i = 1; i <= 1000; ++i) window.add(i);
  auto p = window.percentiles();
  EXPECT_EQ(p.count, 1000u);
  EXPECT_EQ(p.sum, 500500.0);
  EXPECT_NEAR(p.p50, 500, 2);
  EXPECT_NEAR(p.p99, 990, 2);
  EXPECT_NEAR(p.p999, 999, 2);
  // The window slides: new samples replace the oldest.
  for (int i = 0; i < 1000; ++i) window.add(5000);
  p = window.percentiles();
  EXPECT_EQ(p.count, 2000u);
  EXPECT_EQ(p.p50, 5000);
  // The sum is of every sample, not of the window (a summary's _sum).
  EXPECT_EQ(p.sum, 500500.0 + 1000 * 5000.0);
}

}  // namespace
}  // namespace pmirror::supervisor
