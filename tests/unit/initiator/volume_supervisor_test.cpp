// The supervisor's passes over real targets on the fake fabric: a lost
// replica is reconnected and resynced with what it missed, a lagging one
// is caught up once it answers, and its thread stops when told.
#include "initiator/volume_supervisor.h"

#include <gtest/gtest.h>

#include <cstring>

#include "unit/initiator/fake_targets.h"

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
using supervisor::PeerState;
using testing::FakeTargetsTest;

class VolumeSupervisorTest : public FakeTargetsTest {
 protected:
  void open(size_t replicas, uint32_t ack) {
    open_volume(replicas, [&](VolumeOptions& o) { o.ack = ack; });
    ASSERT_TRUE(all_in_sync());
  }
};

TEST_F(VolumeSupervisorTest, ALostReplicaIsReconnectedAndGetsWhatItMissed) {
  open(2, /*ack=*/1);
  {
    std::lock_guard lock(volume_->core.mutex);
    volume_->peers.drop(peer_at(1), Status(Errc::kConnectionError, "gone for a while"));
  }
  // Written while it is away: recorded dirty for it, durable on replica 0.
  std::memset(volume_->core.local->data() + 40 * kChunk, 0x61, 2 * kChunk);
  ASSERT_TRUE(persist(40 * kChunk, 2 * kChunk).ok());
  EXPECT_NE(target_bytes(1)[40 * kChunk], std::byte{0x61});
  ASSERT_TRUE(all_in_sync());
  std::lock_guard lock(volume_->core.mutex);
  Peer& back = peer_at(1);
  EXPECT_TRUE(back.live());
  EXPECT_EQ(back.state.state(), PeerState::kConnected);
  EXPECT_EQ(volume_->core.meta->dirty_count(back.meta_index), 0u);
  EXPECT_EQ(target_bytes(1)[40 * kChunk + 2 * kChunk - 1], std::byte{0x61});
  EXPECT_GE(volume_->resyncer.resynced_bytes(back), 2 * kChunk);
}

TEST_F(VolumeSupervisorTest, ALaggingReplicaIsCaughtUpOnceItAnswers) {
  open(2, /*ack=*/1);
  {
    std::lock_guard lock(volume_->core.mutex);
    ASSERT_TRUE(volume_->core.meta->mark(peer_at(1).meta_index, 50 * kChunk, 1).ok());
    std::memset(volume_->core.local->data() + 50 * kChunk, 0x62, kChunk);
    volume_->peers.start_lagging(peer_at(1), Status(Errc::kResourceExhausted, "slow"));
  }
  ASSERT_TRUE(all_in_sync());
  std::lock_guard lock(volume_->core.mutex);
  EXPECT_FALSE(peer_at(1).lagging);
  EXPECT_EQ(target_bytes(1)[50 * kChunk], std::byte{0x62});
}

TEST_F(VolumeSupervisorTest, TheThreadRunsUntilStopped) {
  open(1, 0);
  {
    std::lock_guard lock(volume_->core.mutex);
    volume_->peers.drop(peer_at(0), Status(Errc::kConnectionError, "gone"));
  }
  volume_->supervisor.start();
  auto deadline = std::chrono::steady_clock::now() + 20s;
  bool back = false;
  while (!back && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    std::lock_guard lock(volume_->core.mutex);
    back = peer_at(0).in_sync;
  }
  EXPECT_TRUE(back) << "the thread reconnected it";
  volume_->supervisor.stop();
  EXPECT_FALSE(volume_->core.supervisor_wakeup.sleep(std::chrono::seconds(10)))
      << "stopped: sleeps return at once";
}

}  // namespace
}  // namespace pmirror::initiator
