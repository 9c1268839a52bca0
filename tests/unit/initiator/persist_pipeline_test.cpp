// The persist pipeline over real targets on the fake fabric: a persist
// reaches every in-sync replica and the local copy, is acknowledged by the
// ack policy, marks its range for replicas that do not get it, and keeps
// at most max_in_flight outstanding.
#include "initiator/persist_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "unit/initiator/fake_targets.h"

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
using testing::FakeTargetsTest;

class PersistPipelineTest : public FakeTargetsTest {
 protected:
  void open(size_t replicas, uint32_t ack, uint32_t max_in_flight = 32) {
    open_volume(replicas, [&](VolumeOptions& o) {
      o.ack = ack;
      o.max_in_flight = max_in_flight;
    });
    ASSERT_TRUE(all_in_sync());
  }
  void fill(uint64_t offset, uint64_t length, std::byte byte) {
    std::memset(volume_->core.local->data() + offset, static_cast<int>(byte), length);
  }
};

TEST_F(PersistPipelineTest, APersistIsDurableOnEveryReplicaWithAckAll) {
  open(2, /*ack=*/0);
  fill(12288, 5000, std::byte{0x42});
  ASSERT_TRUE(persist(12288, 5000).ok());
  for (size_t i = 0; i < 2; ++i) {
    auto bytes = target_bytes(i);
    EXPECT_EQ(bytes[12288], std::byte{0x42}) << "replica " << i;
    EXPECT_EQ(bytes[12288 + 4999], std::byte{0x42}) << "replica " << i;
    std::lock_guard lock(volume_->core.mutex);
    EXPECT_EQ(peer_at(i).replica->done_upto(), volume_->ledger.last_started());
    EXPECT_EQ(peer_at(i).bytes, 5000u);
  }
  std::lock_guard lock(volume_->core.mutex);
  EXPECT_EQ(volume_->ledger.acknowledged(), volume_->ledger.last_started());
  volume_->peers.settle();
  EXPECT_FALSE(volume_->ledger.has_unsettled()) << "durable everywhere";
  auto logged = volume_->core.meta->activity_extents();
  EXPECT_EQ(logged, (std::vector<uint64_t>{0})) << "its extent was logged first";
}

TEST_F(PersistPipelineTest, WithAckOneALostReplicaHasTheRangeMarkedAndPersistsGoOn) {
  open(2, /*ack=*/1);
  stop_target(1);
  fill(0, 100, std::byte{7});
  // Replica 1's connection is gone: the persist drops it (or it was
  // dropped already) and succeeds on replica 0.
  Status persisted = persist(0, 100);
  ASSERT_TRUE(persisted.ok()) << persisted.to_string();
  for (int i = 0; i < 3 && peer_at(1).live(); ++i) {
    ASSERT_TRUE(persist(0, 100).ok());
  }
  std::lock_guard lock(volume_->core.mutex);
  Peer& lost = peer_at(1);
  EXPECT_FALSE(lost.live());
  EXPECT_TRUE(volume_->core.meta->is_dirty(lost.meta_index, 0));
  EXPECT_FALSE(volume_->core.meta->is_dirty(peer_at(0).meta_index, 0));
  EXPECT_EQ(target_bytes(0)[99], std::byte{7});
}

TEST_F(PersistPipelineTest, WithAckAllAPersistFailsNamingTheMissingReplica) {
  open(2, /*ack=*/0);
  stop_target(1);
  fill(0, 100, std::byte{7});
  // The persist that finds the connection gone fails with its error...
  Status persisted = persist(0, 100);
  for (int i = 0; i < 3 && persisted.ok(); ++i) persisted = persist(0, 100);
  EXPECT_EQ(persisted.code(), Errc::kConnectionError) << persisted.to_string();
  // ...and the next ones name the replica and its state.
  persisted = persist(0, 100);
  EXPECT_EQ(persisted.code(), Errc::kConnectionError) << persisted.to_string();
  EXPECT_NE(persisted.message().find("of volume 'v' is durable on 1 of the 2 replicas required: "
                                     "replica t1 is disconnected"),
            std::string::npos)
      << persisted.message();
  // The local copy and the other replica have it all the same.
  EXPECT_EQ(target_bytes(0)[50], std::byte{7});
}

TEST_F(PersistPipelineTest, AtMostMaxInFlightPersistsAreOutstanding) {
  open(1, /*ack=*/0, /*max_in_flight=*/2);
  auto lock = app_lock(volume_->core);
  for (uint64_t i = 0; i < 5; ++i) {
    fill(i * kChunk, 64, std::byte(i + 1));
    auto sequence = volume_->pipeline.start(lock, i * kChunk, 64);
    ASSERT_TRUE(sequence.ok()) << sequence.status().to_string();
    EXPECT_LE(volume_->ledger.last_started() - volume_->ledger.acknowledged(), 2u)
        << "after starting persist " << *sequence;
  }
  ASSERT_TRUE(volume_->pipeline.wait(lock, volume_->ledger.last_started()).ok());
  EXPECT_EQ(volume_->pipeline.wait(lock, volume_->ledger.next_sequence()).code(),
            Errc::kInvalidArgument)
      << "never started";
  auto bytes = target_bytes(0);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(bytes[i * kChunk], std::byte(i + 1));
}

// A persist waiting for its acknowledgements does not hold the volume
// mutex: while the fabric moves nothing, a second thread starts its own
// persist, and both complete once it moves again.
TEST_F(PersistPipelineTest, AWaitingPersistLetsAnotherThreadPostItsOwn) {
  open(2, /*ack=*/0);
  fill(0, 64, std::byte{0x11});
  fill(8 * kChunk, 64, std::byte{0x22});
  fabric().set_manual(true);  // nothing posted executes until set_manual(false)
  std::atomic<bool> first_done{false};
  Status first_status;
  std::thread first([&] {
    first_status = persist(0, 64);
    first_done = true;
  });
  // Wait until the first persist is posted and waiting.
  for (;;) {
    auto lock = app_lock(volume_->core);
    if (volume_->ledger.last_started() >= 1) break;
    lock.unlock();
    std::this_thread::sleep_for(1ms);
  }
  std::atomic<bool> second_done{false};
  Status second_status;
  std::thread second([&] {
    second_status = persist(8 * kChunk, 64);
    second_done = true;
  });
  bool both_posted = false;
  for (int i = 0; i < 20000 && !both_posted; ++i) {
    auto lock = app_lock(volume_->core);
    both_posted = volume_->ledger.last_started() >= 2;
    if (!both_posted) {
      lock.unlock();
      std::this_thread::sleep_for(1ms);
    }
  }
  EXPECT_TRUE(both_posted) << "the second persist could not start while the first waited";
  EXPECT_FALSE(first_done) << "the first persist completed while the fabric moved nothing";
  fabric().set_manual(false);
  first.join();
  second.join();
  ASSERT_TRUE(first_status.ok()) << first_status.to_string();
  ASSERT_TRUE(second_status.ok()) << second_status.to_string();
  for (size_t i = 0; i < 2; ++i) {
    auto bytes = target_bytes(i);
    EXPECT_EQ(bytes[63], std::byte{0x11}) << "replica " << i;
    EXPECT_EQ(bytes[8 * kChunk + 63], std::byte{0x22}) << "replica " << i;
  }
}

// Several application threads persisting at once, each its own records:
// every persist is acknowledged, every byte is on both replicas, and the
// ledger ends with nothing outstanding.
TEST_F(PersistPipelineTest, ConcurrentWritersAllReachEveryReplica) {
  open(2, /*ack=*/0, /*max_in_flight=*/8);
  constexpr uint64_t kWriters = 4;
  constexpr uint64_t kRecords = 150;
  constexpr uint64_t kRecord = 256;
  std::vector<std::thread> writers;
  std::vector<Status> failures(kWriters);
  for (uint64_t w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (uint64_t r = 0; r < kRecords; ++r) {
        const uint64_t offset = (w * kRecords + r) * kRecord;
        // Each writer's bytes are its own: no lock needed to fill them.
        fill(offset, kRecord, std::byte(1 + (w * 31 + r) % 250));
        Status persisted = persist(offset, kRecord);
        if (!persisted.ok()) {
          failures[w] = persisted.with_context("writer " + std::to_string(w) + " record " +
                                               std::to_string(r));
          return;
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  for (const Status& failure : failures) ASSERT_TRUE(failure.ok()) << failure.to_string();
  for (size_t i = 0; i < 2; ++i) {
    auto bytes = target_bytes(i);
    for (uint64_t w = 0; w < kWriters; ++w) {
      for (uint64_t r = 0; r < kRecords; ++r) {
        const uint64_t offset = (w * kRecords + r) * kRecord;
        ASSERT_EQ(bytes[offset], std::byte(1 + (w * 31 + r) % 250))
            << "replica " << i << " writer " << w << " record " << r;
        ASSERT_EQ(bytes[offset + kRecord - 1], std::byte(1 + (w * 31 + r) % 250))
            << "replica " << i << " writer " << w << " record " << r;
      }
    }
  }
  std::lock_guard lock(volume_->core.mutex);
  EXPECT_EQ(volume_->ledger.last_started(), kWriters * kRecords);
  EXPECT_EQ(volume_->ledger.acknowledged(), volume_->ledger.last_started());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(peer_at(i).replica->done_upto(), volume_->ledger.last_started()) << "replica " << i;
  }
}

TEST_F(PersistPipelineTest, RangesOutsideTheVolumeAreRefused) {
  open(1, 0);
  EXPECT_TRUE(volume_->pipeline.check_range(kSize - 1, 1).ok());
  Status outside = volume_->pipeline.check_range(kSize - 1, 2);
  EXPECT_EQ(outside.code(), Errc::kInvalidArgument);
  EXPECT_EQ(outside.message(), "range [" + std::to_string(kSize - 1) +
                                   ", +2) is outside volume 'v' of " + std::to_string(kSize) +
                                   " bytes");
}

}  // namespace
}  // namespace pmirror::initiator
