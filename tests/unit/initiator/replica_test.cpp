// One session with a real target over the fake fabric: the one routine
// that posts Write + flush (persists and resync copies), the one credit
// wait, and the persists it records in the volume's ledger.
#include "initiator/replica.h"

#include <gtest/gtest.h>

#include <cstring>

#include "unit/initiator/fake_targets.h"

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
using testing::FakeTargetsTest;

class ReplicaTest : public FakeTargetsTest {
 protected:
  void open(config::ApmPolicy apm, std::chrono::milliseconds operation_timeout = 10s) {
    start_targets(1, apm);
    VolumeOptions o = options();
    o.operation_timeout = operation_timeout;
    volume_ = make_volume(o);
    ASSERT_NE(volume_, nullptr);
    core_ = &volume_->core;
    replica_ = connect(*core_, 0);
    ASSERT_NE(replica_, nullptr);
    replica_->track_in(ledger_, 0);
    replica_->on_persist_done([this](Clock::duration) { ++done_; });
  }

  // Stores `byte` over [offset, +length) of the local copy and starts a
  // persist of it in the ledger.
  uint64_t store(uint64_t offset, uint64_t length, std::byte byte) {
    std::memset(core_->local->data() + offset, static_cast<int>(byte), length);
    return ledger_.start(offset, length);
  }

  bool target_holds(uint64_t offset, uint64_t length, std::byte byte) {
    auto bytes = target_bytes(0);
    return std::all_of(bytes.begin() + offset, bytes.begin() + offset + length,
                       [&](std::byte b) { return b == byte; });
  }

  void several_ranges_land_whole() {
    std::vector<protocol::Range> ranges{{4096, 100}, {65536, 8}, {300000, 4000}};
    for (const auto& r : ranges) std::memset(core_->local->data() + r.offset, 7, r.length);
    uint64_t sequence = ledger_.start(ranges);
    ASSERT_TRUE(replica_->post_persist(sequence, ranges).ok());
    ASSERT_TRUE(replica_->wait_for(sequence).ok());
    EXPECT_EQ(replica_->done_upto(), sequence);
    for (const auto& r : ranges) EXPECT_TRUE(target_holds(r.offset, r.length, std::byte{7}));
    EXPECT_TRUE(target_holds(4196, 8, std::byte{0})) << "nothing between the ranges";
  }

  // Posts `count` persists of `length` bytes of `byte`, `stride` apart from
  // offset 0 (waiting as post_persist does); returns the last sequence.
  uint64_t post_run(uint64_t count, uint64_t stride, uint64_t length, std::byte byte) {
    uint64_t sequence = 0;
    for (uint64_t i = 0; i < count; ++i) {
      sequence = store(stride * i, length, byte);
      Status posted = replica_->post_persist(sequence, stride * i, length);
      EXPECT_TRUE(posted.ok()) << "persist " << i << ": " << posted.to_string();
    }
    return sequence;
  }

  // Whether target 0 records `sequence` as its last applied one within 5 s
  // (its session thread handles the Commit).
  bool target_records(uint64_t sequence) {
    for (int i = 0; i < 5000; ++i) {
      if (target_volume(0).applied_sequence == sequence) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  // Polls the resync copy in flight until it is done (true), fails, or 5 s
  // passed.
  bool resync_finishes() {
    for (int i = 0; i < 5000; ++i) {
      auto polled = replica_->resync_done();
      EXPECT_TRUE(polled.ok()) << polled.status().to_string();
      if (!polled.ok()) return false;
      if (*polled) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  // A resync copy: its Write and its flush (a Read, or a PersistRequest of
  // sequence 0), through the routine persists use; no bookkeeping.
  void copy_and_check() {
    std::memset(core_->local->data() + 65536, 0x77, 8192);
    uint64_t before = fabric().executed("initiator");
    ASSERT_TRUE(replica_->post_resync(65536, 8192).ok());
    EXPECT_EQ(fabric().executed("initiator") - before, 2u);
    EXPECT_EQ(replica_->post_resync(0, 4096).code(), Errc::kInternal) << "one at a time";
    EXPECT_TRUE(resync_finishes());
    EXPECT_TRUE(target_holds(65536, 8192, std::byte{0x77}));
    EXPECT_EQ(ledger_.size(), 0u) << "a resync copy is not a persist";
    EXPECT_EQ(replica_->done_upto(), 0u);
  }

  void TearDown() override {
    replica_.reset();  // its registrations before the local copy
    FakeTargetsTest::TearDown();
  }

  VolumeCore* core_ = nullptr;  // volume_'s
  PersistLedger ledger_;
  std::unique_ptr<Replica> replica_;
  int done_ = 0;
};

TEST_F(ReplicaTest, ApmPersistIsAWriteAndARead) {
  open(config::ApmPolicy::kOn);
  ASSERT_TRUE(replica_->uses_apm());
  uint64_t sequence = store(8192, 300, std::byte{0x5a});
  uint64_t before = fabric().executed("initiator");
  ASSERT_TRUE(replica_->post_persist(sequence, 8192, 300).ok());
  EXPECT_EQ(fabric().executed("initiator") - before, 2u) << "Write, flush Read";
  ASSERT_TRUE(replica_->wait_for(sequence).ok());
  EXPECT_EQ(replica_->done_upto(), sequence);
  EXPECT_EQ(ledger_.pending_count(0), 0u);
  EXPECT_EQ(done_, 1);
  EXPECT_TRUE(target_holds(8192, 300, std::byte{0x5a}));
  EXPECT_EQ(replica_->uncommitted(), 1u) << "its Commit goes with a later persist";
}

// One Commit records a run of persists: every kPersistsPerCommit-th
// persist carries it, with one range per persist it covers.
TEST_F(ReplicaTest, ACommitGoesWithEveryRunOfPersistsAndCoversThemAll) {
  open(config::ApmPolicy::kOn);
  uint64_t sequence = 0;
  for (size_t i = 0; i < kPersistsPerCommit; ++i) {
    sequence = store(i * 100, 100, std::byte{0x11});
    uint64_t before = fabric().executed("initiator");
    ASSERT_TRUE(replica_->post_persist(sequence, i * 100, 100).ok());
    const bool last = i + 1 == kPersistsPerCommit;
    EXPECT_EQ(fabric().executed("initiator") - before, last ? 3u : 2u) << "persist " << i;
    ASSERT_TRUE(replica_->wait_for(sequence).ok());
    if (!last) {
      EXPECT_EQ(target_volume(0).applied_sequence, 0u) << "persist " << i;
    }
  }
  EXPECT_EQ(replica_->uncommitted(), 0u);
  EXPECT_TRUE(target_records(sequence)) << target_volume(0).applied_sequence;
  target::VolumeStatus recorded = target_volume(0);
  ASSERT_FALSE(recorded.sessions.empty());
  EXPECT_EQ(recorded.sessions[0].persists, kPersistsPerCommit);
  EXPECT_EQ(recorded.sessions[0].bytes, kPersistsPerCommit * 100);
  EXPECT_TRUE(target_holds(0, kPersistsPerCommit * 100, std::byte{0x11}));
}

// A Commit goes every kPersistsPerCommit persists however many ranges
// each has (libpmemobj's transactions under pmirror-run are persists of
// six): the target's session thread is woken per run of persists, not per
// 32 ranges.
TEST_F(ReplicaTest, ACommitCountsPersistsNotRanges) {
  open(config::ApmPolicy::kOn);
  uint64_t sequence = 0;
  for (size_t i = 0; i < kPersistsPerCommit; ++i) {
    const uint64_t base = i * 4096;
    sequence = store(base, 4096, std::byte{0x22});
    const protocol::Range ranges[] = {{base, 100}, {base + 1000, 100}, {base + 2000, 100}};
    ASSERT_TRUE(replica_->post_persist(sequence, ranges).ok());
    ASSERT_TRUE(replica_->wait_for(sequence).ok());
    if (i + 1 < kPersistsPerCommit) {
      EXPECT_EQ(target_volume(0).applied_sequence, 0u) << "persist " << i;
      EXPECT_EQ(replica_->uncommitted(), 3 * (i + 1)) << "persist " << i;
    }
  }
  EXPECT_EQ(replica_->uncommitted(), 0u);
  EXPECT_TRUE(target_records(sequence)) << target_volume(0).applied_sequence;
}

// The persists of a volume that went quiet are recorded too: once nothing
// was posted for kCommitWhenIdleFor and nothing is in flight.
TEST_F(ReplicaTest, AQuietReplicaGetsTheCommitOfItsLastPersists) {
  open(config::ApmPolicy::kOn);
  post_run(5, 4096, 64, std::byte{0x42});
  const auto posted = Clock::now();
  // Not while a persist is in flight, however long ago it was posted.
  fabric().set_manual(true);
  uint64_t in_flight = store(1 << 19, 64, std::byte{0x43});
  // No later than the persist's own clock read: "right after" it whatever
  // the machine's load (a Clock::now() after wait_for may be 2 ms on).
  const auto just_before_last_post = Clock::now();
  ASSERT_TRUE(replica_->post_persist(in_flight, 1 << 19, 64).ok());
  size_t queued = fabric().pending();
  ASSERT_TRUE(replica_->commit_if_idle(posted + 1s).ok());
  EXPECT_EQ(fabric().pending(), queued) << "no Commit behind the persist in flight";
  fabric().set_manual(false);
  ASSERT_TRUE(replica_->wait_for(in_flight).ok());
  // Not right after the last persist: the next one would carry it.
  ASSERT_TRUE(replica_->commit_if_idle(just_before_last_post).ok());
  EXPECT_EQ(replica_->uncommitted(), 6u);
  ASSERT_TRUE(replica_->commit_if_idle(Clock::now() + kCommitWhenIdleFor).ok());
  EXPECT_EQ(replica_->uncommitted(), 0u);
  EXPECT_TRUE(target_records(in_flight)) << target_volume(0).applied_sequence;
  EXPECT_EQ(target_volume(0).sessions[0].persists, 6u);
}

TEST_F(ReplicaTest, AnOrderlyCloseSendsTheLastCommit) {
  open(config::ApmPolicy::kOn);
  uint64_t sequence = post_run(3, 512, 512, std::byte{0x17});
  replica_->close();
  EXPECT_TRUE(target_records(sequence)) << target_volume(0).applied_sequence;
  EXPECT_EQ(target_volume(0).sessions[0].persists, 3u);
  EXPECT_TRUE(target_holds(0, 1536, std::byte{0x17}));
}

TEST_F(ReplicaTest, GpspmPersistIsAWriteAndAPersistRequest) {
  open(config::ApmPolicy::kOff);
  ASSERT_FALSE(replica_->uses_apm());
  uint64_t sequence = store(0, 4096, std::byte{0x33});
  uint64_t before = fabric().executed("initiator");
  ASSERT_TRUE(replica_->post_persist(sequence, 0, 4096).ok());
  EXPECT_EQ(fabric().executed("initiator") - before, 2u) << "Write, PersistRequest";
  EXPECT_TRUE(replica_->awaiting(sequence) || replica_->done_upto() == sequence);
  ASSERT_TRUE(replica_->wait_for(sequence).ok());
  EXPECT_FALSE(replica_->awaiting(sequence));
  EXPECT_TRUE(target_holds(0, 4096, std::byte{0x33}));
}

TEST_F(ReplicaTest, ApmResyncCopyIsAWriteAndARead) {
  open(config::ApmPolicy::kOn);
  copy_and_check();
}

TEST_F(ReplicaTest, GpspmResyncCopyIsAWriteAndAPersistRequest) {
  open(config::ApmPolicy::kOff);
  copy_and_check();
}

// GPSPM keeps the order of persists by waiting (docs/protocol.md,
// "Ordering"): the target's CPU persists a persist's ranges when its
// PersistRequest arrives, and the next one's Writes must not be placed
// before that. A caller that may not wait leaves the next persist queued:
// nothing of it is posted until the pump that completes the one before.
TEST_F(ReplicaTest, UnderGpspmAPersistWaitsForTheOneBeforeIt) {
  open(config::ApmPolicy::kOff);
  ASSERT_FALSE(replica_->uses_apm());
  fabric().set_manual(true);
  uint64_t first = store(0, 64, std::byte{1});
  ASSERT_TRUE(replica_->post_persist(first, 0, 64, /*may_wait=*/false).ok());
  uint64_t second = store(1 << 19, 64, std::byte{2});
  const size_t posted_first = fabric().pending();
  ASSERT_TRUE(replica_->post_persist(second, 1 << 19, 64, /*may_wait=*/false).ok());
  EXPECT_FALSE(replica_->failed());
  EXPECT_EQ(fabric().pending(), posted_first) << "nothing of the queued persist was posted";
  EXPECT_FALSE(ledger_.is_pending(0, second)) << "queued, not posted";
  EXPECT_TRUE(replica_->awaiting(second));
  EXPECT_EQ(replica_->in_flight_count(), 2u);

  // The first runs; the second is still not posted: only a pump that
  // sees the first durable posts it.
  fabric().run_until_idle();
  EXPECT_FALSE(target_holds(1 << 19, 64, std::byte{2}));
  fabric().set_manual(false);
  ASSERT_TRUE(replica_->wait_for(first).ok());
  ASSERT_TRUE(replica_->wait_for(second).ok());
  EXPECT_EQ(replica_->done_upto(), second);
  EXPECT_EQ(replica_->in_flight_count(), 0u);
  EXPECT_TRUE(target_holds(0, 64, std::byte{1}));
  EXPECT_TRUE(target_holds(1 << 19, 64, std::byte{2}));

  // Waiting, a persist goes once the one before is durable (queued ones
  // included).
  uint64_t third = store(4096, 64, std::byte{3});
  ASSERT_TRUE(replica_->post_persist(third, 4096, 64, /*may_wait=*/false).ok());
  uint64_t fourth = store(8192, 64, std::byte{4});
  ASSERT_TRUE(replica_->post_persist(fourth, 8192, 64, /*may_wait=*/true).ok());
  EXPECT_GE(replica_->done_upto(), third) << "the third was durable before the fourth went";
  ASSERT_TRUE(replica_->drain().ok());
  EXPECT_TRUE(target_holds(8192, 64, std::byte{4}));
}

// A replica that starts lagging drops what it queued (the pipeline records
// it dirty): nothing of it is posted later.
TEST_F(ReplicaTest, UnderGpspmForgottenQueuedPersistsAreNeverPosted) {
  open(config::ApmPolicy::kOff);
  fabric().set_manual(true);
  uint64_t first = store(0, 64, std::byte{5});
  ASSERT_TRUE(replica_->post_persist(first, 0, 64, /*may_wait=*/false).ok());
  uint64_t second = store(4096, 64, std::byte{6});
  ASSERT_TRUE(replica_->post_persist(second, 4096, 64, /*may_wait=*/false).ok());
  replica_->forget_queued();
  EXPECT_FALSE(replica_->awaiting(second));
  fabric().set_manual(false);
  ASSERT_TRUE(replica_->drain().ok());
  EXPECT_EQ(replica_->done_upto(), first);
  EXPECT_TRUE(target_holds(0, 64, std::byte{5}));
  EXPECT_FALSE(target_holds(4096, 64, std::byte{6}));
}

// A persist of several ranges is one persist: one sequence, the Writes of
// every range, one flush.
TEST_F(ReplicaTest, APersistOfSeveralRangesLandsWholeUnderApm) {
  open(config::ApmPolicy::kOn);
  ASSERT_TRUE(replica_->uses_apm());
  several_ranges_land_whole();
}

TEST_F(ReplicaTest, APersistOfSeveralRangesLandsWholeUnderGpspm) {
  open(config::ApmPolicy::kOff);
  ASSERT_FALSE(replica_->uses_apm());
  several_ranges_land_whole();
}

TEST_F(ReplicaTest, UnderGpspmWaitingForThePersistBeforeGivesUpAfterTheOperationTimeout) {
  open(config::ApmPolicy::kOff, 300ms);
  fabric().set_manual(true);
  uint64_t first = store(0, 64, std::byte{1});
  ASSERT_TRUE(replica_->post_persist(first, 0, 64, /*may_wait=*/false).ok());
  uint64_t second = store(4096, 64, std::byte{2});
  Status waited = replica_->post_persist(second, 4096, 64, /*may_wait=*/true);
  EXPECT_EQ(waited.code(), Errc::kTimeout) << waited.to_string();
  EXPECT_NE(waited.message().find("persist " + std::to_string(first) +
                                  " not acknowledged within 300 ms"),
            std::string::npos)
      << waited.message();
  EXPECT_TRUE(replica_->failed());
  // Failed: every later call says why, without waiting.
  EXPECT_EQ(replica_->verify_chunks(0, 4096, 4096).status().code(), Errc::kTimeout);
}

// A heartbeat never queues a Ping behind an outstanding operation (Soft-RoCE
// can stall a queue pair when a Send follows a Read it is retransmitting):
// the persist's own answer shows the connection alive; a Ping that fell due
// meanwhile goes out before the next resync copy, where nothing is
// outstanding, so that a long resync (one-sided work the target does not
// see) still tells the target the session is alive.
TEST_F(ReplicaTest, AHeartbeatWaitsUntilNothingIsOutstanding) {
  open(config::ApmPolicy::kOn);
  fabric().set_manual(true);
  uint64_t sequence = store(4096, 128, std::byte{0x21});
  ASSERT_TRUE(replica_->post_persist(sequence, 4096, 128).ok());
  const size_t queued = fabric().pending();
  EXPECT_EQ(queued, 2u) << "Write, flush Read";
  ASSERT_TRUE(replica_->heartbeat().ok());
  EXPECT_EQ(fabric().pending(), queued) << "no Ping behind the outstanding persist";

  fabric().set_manual(false);
  fabric().run_until_idle();
  ASSERT_TRUE(replica_->wait_for(sequence).ok());
  EXPECT_TRUE(target_holds(4096, 128, std::byte{0x21}));

  // Nothing outstanding now: the due Ping leads the next resync copy.
  std::memset(core_->local->data() + 65536, 0x44, 4096);
  fabric().set_manual(true);
  ASSERT_TRUE(replica_->post_resync(65536, 4096).ok());
  EXPECT_EQ(fabric().pending(), 3u) << "the due Ping, then the copy's Write and Read";
  fabric().set_manual(false);
  fabric().run_until_idle();
  EXPECT_TRUE(resync_finishes());
  EXPECT_TRUE(target_holds(65536, 4096, std::byte{0x44}));
}

}  // namespace
}  // namespace pmirror::initiator
