// The one record of a volume's persists: sequences, the unsettled persists
// a lost replica gets marked dirty, and per replica what is pending there.
#include "initiator/persist_ledger.h"

#include <gtest/gtest.h>

#include <vector>

namespace pmirror::initiator {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::vector<uint64_t> unsettled(const PersistLedger& ledger) {
  std::vector<uint64_t> out;
  ledger.for_each_unsettled([&](uint64_t sequence, const protocol::Range&) {
    if (out.empty() || out.back() != sequence) out.push_back(sequence);
  });
  return out;
}

TEST(PersistLedger, SequencesRiseAndAreAcknowledgedInOrder) {
  PersistLedger ledger;
  EXPECT_EQ(ledger.next_sequence(), 1u);
  EXPECT_TRUE(ledger.quiet());
  EXPECT_EQ(ledger.start(0, 8), 1u);
  EXPECT_EQ(ledger.start(4096, 16), 2u);
  EXPECT_EQ(ledger.last_started(), 2u);
  EXPECT_FALSE(ledger.quiet());
  ledger.acknowledge(2);
  ledger.acknowledge(1);  // never goes back
  EXPECT_EQ(ledger.acknowledged(), 2u);
  EXPECT_FALSE(ledger.quiet()) << "acknowledged, but not settled everywhere";
  ledger.settle(2);
  EXPECT_TRUE(ledger.quiet());
  EXPECT_EQ(ledger.size(), 0u);
}

// A drain's ranges are one persist: one sequence, every range kept for
// marking dirty, and a snapshot's bytes released when the record goes.
TEST(PersistLedger, APersistOfSeveralRangesIsOneRecord) {
  PersistLedger ledger;
  const std::vector<protocol::Range> drain{{0, 64}, {4096, 8}, {65536, 512}};
  EXPECT_EQ(ledger.start(drain, /*staged_end=*/584), 1u);
  const std::vector<protocol::Range> next{{128, 8}};
  EXPECT_EQ(ledger.start(next, /*staged_end=*/592), 2u);
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  ledger.for_each_unsettled([&](uint64_t sequence, const protocol::Range& r) {
    seen.emplace_back(sequence, r.offset);
  });
  EXPECT_EQ(seen, (std::vector<std::pair<uint64_t, uint64_t>>{{1, 0}, {1, 4096}, {1, 65536}, {2, 128}}));
  ledger.posted(0, 1, Clock::now());
  ledger.posted(0, 2, Clock::now());
  ledger.settle(2);
  EXPECT_EQ(ledger.staging_released(), 0u) << "posted to replica 0 and not completed there";
  ASSERT_TRUE(ledger.complete(0, 1, "test").ok());
  EXPECT_EQ(ledger.staging_released(), 584u);
  ASSERT_EQ(ledger.size(), 1u);
  EXPECT_EQ(ledger.ranges(*ledger.oldest_pending(0)).size(), 1u);
  EXPECT_EQ(ledger.ranges(*ledger.oldest_pending(0))[0].offset, 128u);
  ASSERT_TRUE(ledger.complete(0, 2, "test").ok());
  EXPECT_EQ(ledger.staging_released(), 592u);
  EXPECT_EQ(ledger.size(), 0u);
}

// The range store is trimmed with the records: a long stream keeps each
// persist's own ranges.
TEST(PersistLedger, RangesFollowTheirRecordsThroughTrimming) {
  PersistLedger ledger;
  for (uint64_t i = 1; i <= 1000; ++i) {
    const std::vector<protocol::Range> ranges{{i * 4096, i}, {i * 4096 + 64, 1}};
    ASSERT_EQ(ledger.start(ranges), i);
    ledger.posted(0, i, Clock::now());
    ledger.settle(i);
    if (i > 3) {
      ASSERT_TRUE(ledger.complete(0, i - 3, "test").ok());
      const InFlightPersist* oldest = ledger.oldest_pending(0);
      ASSERT_NE(oldest, nullptr);
      ASSERT_EQ(oldest->sequence, i - 2);
      auto kept = ledger.ranges(*oldest);
      ASSERT_EQ(kept.size(), 2u);
      EXPECT_EQ(kept[0].offset, (i - 2) * 4096);
      EXPECT_EQ(kept[0].length, i - 2);
      EXPECT_EQ(kept[1].offset, (i - 2) * 4096 + 64);
    }
  }
}

TEST(PersistLedger, ContinuesAfterWhatAReplicaRecorded) {
  PersistLedger ledger;
  ledger.continue_after(41);
  EXPECT_EQ(ledger.next_sequence(), 42u);
  EXPECT_EQ(ledger.acknowledged(), 41u);
  EXPECT_EQ(ledger.start(0, 1), 42u);
}

TEST(PersistLedger, UnsettledPersistsKeepTheirRanges) {
  PersistLedger ledger;
  ledger.start(0, 100);
  ledger.start(8192, 200);
  ledger.start(16384, 300);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  ledger.for_each_unsettled(
      [&](uint64_t, const protocol::Range& r) { ranges.emplace_back(r.offset, r.length); });
  EXPECT_EQ(ranges,
            (std::vector<std::pair<uint64_t, uint64_t>>{{0, 100}, {8192, 200}, {16384, 300}}));
  ledger.settle(2);
  EXPECT_EQ(unsettled(ledger), (std::vector<uint64_t>{3}));
  ledger.settle(1);  // a lower boundary (a new session) changes nothing
  EXPECT_EQ(unsettled(ledger), (std::vector<uint64_t>{3}));
  EXPECT_TRUE(ledger.has_unsettled());
}

TEST(PersistLedger, CompletionsMatchThePostingOrderPerReplica) {
  PersistLedger ledger;
  auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) ledger.start(uint64_t(i) * 4096, 8);
  ledger.posted(0, 1, t0);
  ledger.posted(0, 2, t0 + 1ms);
  ledger.posted(1, 2, t0 + 2ms);  // replica 1 missed persist 1 (it lagged)
  ledger.posted(0, 3, t0 + 3ms);
  EXPECT_EQ(ledger.pending_count(0), 3u);
  EXPECT_EQ(ledger.pending_count(1), 1u);
  EXPECT_EQ(ledger.oldest_pending(1)->sequence, 2u);
  EXPECT_EQ(ledger.newest_pending(0), 3u);
  EXPECT_TRUE(ledger.is_pending(1, 2));
  EXPECT_FALSE(ledger.is_pending(1, 1));

  // Out of order: a protocol error naming what was expected.
  auto wrong = ledger.complete(0, 2, "PersistAck");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Errc::kProtocolError);
  EXPECT_EQ(wrong.status().message(), "PersistAck for sequence 2, expected 1");
  EXPECT_EQ(ledger.pending_count(0), 3u) << "a wrong completion changes nothing";

  auto first = ledger.complete(0, 1, "flush completion");
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(*first, t0) << "the time it was posted there";
  auto other = ledger.complete(1, 2, "flush completion");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, t0 + 2ms);
  EXPECT_EQ(ledger.oldest_pending(0)->sequence, 2u);
  EXPECT_EQ(ledger.oldest_pending(1), nullptr);

  auto none = ledger.complete(1, 3, "PersistAck");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "PersistAck for sequence 3 with nothing in flight");
}

TEST(PersistLedger, ARecordStaysWhileAReplicaHasItPendingEvenOnceSettled) {
  PersistLedger ledger;
  ledger.start(0, 8);
  ledger.start(4096, 8);
  ledger.posted(2, 1, Clock::now());  // a lagging replica still holds 1
  ledger.settle(2);
  EXPECT_TRUE(unsettled(ledger).empty()) << "settled persists are nobody's to mark";
  EXPECT_EQ(ledger.size(), 2u) << "kept for the replica's completion (records leave in order)";
  ledger.acknowledge(2);
  EXPECT_TRUE(ledger.quiet());
  ASSERT_TRUE(ledger.complete(2, 1, "flush completion").ok());
  EXPECT_EQ(ledger.size(), 0u);
}

TEST(PersistLedger, ForgettingAReplicaEndsWhatWasPendingThere) {
  PersistLedger ledger;
  ledger.start(0, 8);
  ledger.start(4096, 8);
  ledger.posted(0, 1, Clock::now());
  ledger.posted(0, 2, Clock::now());
  ledger.posted(1, 2, Clock::now());
  ledger.settle(2);
  ledger.forget(0);
  EXPECT_EQ(ledger.pending_count(0), 0u);
  EXPECT_EQ(ledger.oldest_pending(0), nullptr);
  EXPECT_FALSE(ledger.newest_pending(0).has_value());
  EXPECT_TRUE(ledger.is_pending(1, 2)) << "the other replica is untouched";
  EXPECT_EQ(ledger.size(), 1u);
  ledger.forget(1);
  EXPECT_EQ(ledger.size(), 0u);
}

TEST(PersistLedger, SequencesMayJumpWhileARecordIsKeptForAReplica) {
  PersistLedger ledger;
  ledger.start(0, 8);
  ledger.posted(3, 1, Clock::now());
  ledger.acknowledge(1);
  ledger.settle(1);
  ASSERT_TRUE(ledger.quiet());
  ledger.continue_after(100);  // a replica recorded sequences beyond ours
  EXPECT_EQ(ledger.start(0, 8), 101u);
  ledger.posted(3, 101, Clock::now());
  EXPECT_EQ(ledger.oldest_pending(3)->sequence, 1u);
  EXPECT_TRUE(ledger.complete(3, 1, "flush completion").ok());
  EXPECT_TRUE(ledger.complete(3, 101, "flush completion").ok());
  EXPECT_EQ(unsettled(ledger), (std::vector<uint64_t>{101}));
}

}  // namespace
}  // namespace pmirror::initiator
