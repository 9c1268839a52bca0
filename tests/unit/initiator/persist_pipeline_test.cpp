// The persist pipeline over real targets on the fake fabric: a persist
// reaches every in-sync replica and the local copy, is acknowledged by the
// ack policy, marks its range for replicas that do not get it, and keeps
// at most max_in_flight outstanding.
#include "initiator/persist_pipeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "failover/lease_file.h"
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

// A snapshot persist: the replicas get the bytes handed over, not what the
// mapping holds when the persist is posted (the program stored again at
// once: pmirror-run's observed mode), through the snapshot buffer's
// wrap-around many times over; several ranges are one persist.
TEST_F(PersistPipelineTest, ASnapshotPersistSendsTheBytesItWasGiven) {
  open_volume(2, [](VolumeOptions& o) { o.snapshot_buffer = 64 << 10; });
  ASSERT_TRUE(all_in_sync());
  std::vector<protocol::Range> ranges{{8192, 3000}, {200000, 5000}};
  std::vector<std::byte> snapshot(8000);
  uint64_t last = 0;
  for (int round = 1; round <= 40; ++round) {
    std::memset(snapshot.data(), round, snapshot.size());
    // The mapping already holds what comes after: 0xee.
    fill(8192, 3000, std::byte{0xee});
    fill(200000, 5000, std::byte{0xee});
    std::unique_lock lock(volume_->core.mutex);
    uint64_t before = volume_->ledger.next_sequence();
    auto started = volume_->pipeline.start(lock, ranges, snapshot);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    EXPECT_EQ(*started, before) << "two ranges, one persist";
    last = *started;
  }
  {
    std::unique_lock lock(volume_->core.mutex);
    ASSERT_TRUE(volume_->pipeline.wait(lock, last).ok());
  }
  for (size_t i = 0; i < 2; ++i) {
    auto bytes = target_bytes(i);
    EXPECT_EQ(bytes[8192], std::byte{40}) << "replica " << i;
    EXPECT_EQ(bytes[8192 + 2999], std::byte{40}) << "replica " << i;
    EXPECT_EQ(bytes[200000], std::byte{40}) << "replica " << i;
    EXPECT_EQ(bytes[204999], std::byte{40}) << "replica " << i;
    EXPECT_EQ(bytes[205000], std::byte{0}) << "replica " << i;
  }
}

TEST_F(PersistPipelineTest, ASnapshotLargerThanTheBufferIsRefusedAndMarkedUnsent) {
  open_volume(1, [](VolumeOptions& o) { o.snapshot_buffer = 16 << 10; });
  ASSERT_TRUE(all_in_sync());
  std::vector<protocol::Range> ranges{{0, 4096}, {65536, 20000}};
  std::vector<std::byte> snapshot(24096, std::byte{1});
  std::unique_lock lock(volume_->core.mutex);
  auto started = volume_->pipeline.start(lock, ranges, snapshot);
  ASSERT_EQ(started.status().code(), Errc::kInvalidArgument) << started.status().to_string();
  EXPECT_NE(started.status().message().find("more than the snapshot buffer"), std::string::npos);
  // The first range went as a persist of its own; the second, refused, is
  // dirty for the replica: the local copy holds bytes it may not.
  EXPECT_TRUE(volume_->core.meta->is_dirty(peer_at(0).meta_index, 65536 / kChunk));
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

// The failover lease (docs/failover.md, section 2): the whole Volume, as
// Volume::open_from_config opens it when failover.engine is etcd, over a
// lease file that the test writes as pmirror-promoter would.
class LeaseTest : public FakeTargetsTest {
 protected:
  static constexpr uint64_t kSecond = 1'000'000'000;

  void SetUp() override {
    FakeTargetsTest::SetUp();
    dir_ = std::filesystem::temp_directory_path() /
           ("pmirror-lease-pipeline-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    lease_path_ = (dir_ / "v.lease").string();
  }
  void TearDown() override {
    FakeTargetsTest::TearDown();
    std::filesystem::remove_all(dir_);
  }
  failover::LeaseFileWriter promoter(const std::string& volume = "v",
                                     const std::string& node = "a") {
    auto writer = failover::LeaseFileWriter::create(lease_path_, volume, node);
    EXPECT_TRUE(writer.ok()) << writer.status().to_string();
    return std::move(writer).value();
  }
  Result<std::unique_ptr<Volume>> open_leased() {
    return open_volume_with(options(), OpenContext{lease_path_, "a"});
  }
  static std::vector<std::byte> page(std::byte value) {
    return std::vector<std::byte>(4096, value);
  }

  std::filesystem::path dir_;
  std::string lease_path_;
};

TEST_F(LeaseTest, PersistsStopOnceTheDeadlinePassesForGood) {
  start_targets(1);
  auto writer = promoter();
  writer.publish(failover::monotonic_now_ns() + 60 * kSecond, 101);
  auto opened = open_leased();
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Volume& volume = **opened;

  ASSERT_TRUE(volume.write(8192, page(std::byte{0x11}).data(), 4096).ok());
  EXPECT_EQ(target_bytes(0)[8192], std::byte{0x11});
  EXPECT_EQ(target_bytes(0)[8192 + 4095], std::byte{0x11});
  auto status = nlohmann::json::parse(volume.status_json());
  EXPECT_EQ(status["lease"]["file"], lease_path_);
  EXPECT_GT(status["lease"]["remaining_ms"].get<uint64_t>(), 50'000u);

  // The promoter could not renew: its deadline is behind us.
  writer.publish(failover::monotonic_now_ns() - 1, 101);
  Status lost = volume.write(8192, page(std::byte{0x22}).data(), 4096);
  EXPECT_EQ(lost.code(), Errc::kLeaseLost) << lost.to_string();
  EXPECT_EQ(lost.message().rfind("volume v: lease lost ", 0), 0u) << lost.message();
  EXPECT_NE(lost.message().find(" ms ago: pmirror-promoter on node a did not renew it (etcd "
                                "unreachable or the promoter stopped); the primary stops writing "
                                "before another node may take over (pmirror-promoter(8))"),
            std::string::npos)
      << lost.message();
  EXPECT_EQ(volume.persist_async(8192, 4096).status().code(), Errc::kLeaseLost);
  EXPECT_EQ(volume.persist(0, 1).code(), Errc::kLeaseLost);
  EXPECT_EQ(target_bytes(0)[8192], std::byte{0x11}) << "nothing of the refused persist was sent";
  EXPECT_EQ(target_bytes(0)[8192 + 4095], std::byte{0x11});
  status = nlohmann::json::parse(volume.status_json());
  EXPECT_EQ(status["lease"]["remaining_ms"], 0);

  // Renewed late: this primary stays stopped (a replica dropped during the
  // lapse took no new generation); the application reopens the volume.
  writer.publish(failover::monotonic_now_ns() + 60 * kSecond, 101);
  Status still = volume.write(8192, page(std::byte{0x33}).data(), 4096);
  EXPECT_EQ(still.code(), Errc::kLeaseLost) << still.to_string();
  EXPECT_EQ(target_bytes(0)[8192], std::byte{0x11});
  opened->reset();
  auto reopened = open_leased();
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  ASSERT_TRUE((*reopened)->write(8192, page(std::byte{0x33}).data(), 4096).ok());
  EXPECT_EQ(target_bytes(0)[8192], std::byte{0x33});
  EXPECT_EQ(target_bytes(0)[8192 + 4095], std::byte{0x33});

  // Given up (a hand-over): the next persist fails at once.
  writer.withdraw();
  Status withdrawn = (*reopened)->write(0, page(std::byte{0x44}).data(), 4096);
  EXPECT_EQ(withdrawn.code(), Errc::kLeaseLost);
  EXPECT_EQ(withdrawn.message(),
            "volume v: no lease: pmirror-promoter on node a gave it up (it handed the volume "
            "over, lost the key, or stopped); the primary stops writing before another node may "
            "take over (pmirror-promoter(8))");
  EXPECT_NE(target_bytes(0)[0], std::byte{0x44});
}

// A persist posted while the lease held, whose replica then went (a fence
// shuts the old primary's connection) while the lease lapsed -- a frozen
// primary thawed: it fails with the reason the application can act on,
// `lease lost`, not with the connection error that followed from it.
TEST_F(LeaseTest, APersistThatOutlivedItsLeaseAndItsReplicaSaysLeaseLost) {
  start_targets(1);
  auto writer = promoter();
  writer.publish(failover::monotonic_now_ns() + 60 * kSecond, 101);
  auto opened = open_leased();
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Volume& volume = **opened;
  ASSERT_TRUE(volume.write(8192, page(std::byte{0x11}).data(), 4096).ok());

  stop_target(0);
  auto posted = volume.persist_async(8192, 4096);
  writer.publish(failover::monotonic_now_ns() - 1, 101);
  Status waited = posted.ok() ? volume.wait(*posted) : posted.status();
  EXPECT_EQ(waited.code(), Errc::kLeaseLost) << waited.to_string();
  EXPECT_NE(waited.message().find("lease lost"), std::string::npos) << waited.message();
}

TEST_F(LeaseTest, OpeningWithoutALeaseFailsBeforeTouchingAnything) {
  start_targets(1);
  auto missing = open_leased();
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Errc::kLeaseLost);
  EXPECT_EQ(missing.status().message(),
            "volume v: no lease on node a: pmirror-promoter holds none (lease file " + lease_path_ +
                " does not exist); failover.engine is etcd, so only the node holding the "
                "volume's lease may write (pmirror-promoter(8))");
  EXPECT_FALSE(std::filesystem::exists(options().local_path)) << "nothing was created";

  auto writer = promoter();
  auto unpublished = open_leased();
  ASSERT_FALSE(unpublished.ok());
  EXPECT_EQ(unpublished.status().code(), Errc::kLeaseLost);
  EXPECT_NE(
      unpublished.status().message().find("(lease file " + lease_path_ + ": no lease published)"),
      std::string::npos)
      << unpublished.status().message();

  writer.publish(failover::monotonic_now_ns() - 5 * kSecond, 7);
  auto expired = open_leased();
  ASSERT_FALSE(expired.ok());
  EXPECT_EQ(expired.status().code(), Errc::kLeaseLost);
  EXPECT_NE(expired.status().message().find(": its deadline passed 5"), std::string::npos)
      << expired.status().message();

  auto other_node = promoter("v", "b");
  other_node.publish(failover::monotonic_now_ns() + 60 * kSecond, 8);
  auto elsewhere = open_leased();
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_EQ(elsewhere.status().code(), Errc::kLeaseLost);
  EXPECT_NE(elsewhere.status().message().find("belongs to volume v on node b, not volume v on "
                                              "node a"),
            std::string::npos)
      << elsewhere.status().message();

  // And without a lease file in the plan, no lease is looked for.
  auto plain = open_volume_with(options(), {});
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_TRUE(nlohmann::json::parse((*plain)->status_json())["lease"].is_null());
}

}  // namespace
}  // namespace pmirror::initiator
