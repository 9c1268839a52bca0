// The resyncer over a real target on the fake fabric: it copies exactly the
// chunks recorded dirty, clears them once durable, keeps a chunk written
// during its copy dirty, honours the rate limit, and says why it cannot
// start.
#include "initiator/resyncer.h"

#include <gtest/gtest.h>

#include <cstring>

#include "unit/initiator/fake_targets.h"

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
using supervisor::PeerState;
using testing::FakeTargetsTest;

class ResyncerTest : public FakeTargetsTest {
 protected:
  void open(uint64_t resync_rate = 0) {
    open_volume(1, [&](VolumeOptions& o) {
      o.resync_rate = resync_rate;
      o.resync_step = 4 * kChunk;
    });
  }
  Peer& peer() { return FakeTargetsTest::peer_at(0); }
  bool resynced() { return all_in_sync(); }
  void fill(uint64_t offset, uint64_t length, std::byte byte) {
    std::memset(volume_->core.local->data() + offset, static_cast<int>(byte), length);
  }
  std::byte target_at(uint64_t offset) { return target_bytes(0)[offset]; }
};

TEST_F(ResyncerTest, CopiesExactlyTheDirtyChunksAndClearsThem) {
  open();
  ASSERT_TRUE(resynced());  // the initial full sync
  uint64_t copied_before = volume_->resyncer.resynced_bytes(peer());
  // Both ranges change locally; only chunks 2 and 7..9 are recorded dirty.
  fill(2 * kChunk, kChunk, std::byte{1});
  fill(7 * kChunk, 3 * kChunk, std::byte{2});
  fill(20 * kChunk, kChunk, std::byte{3});
  {
    std::lock_guard lock(volume_->core.mutex);
    volume_->peers.mark_dirty(peer(), 2 * kChunk, kChunk);
    volume_->peers.mark_dirty(peer(), 7 * kChunk, 3 * kChunk);
    auto started = volume_->resyncer.request("t0", /*full=*/false);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    EXPECT_EQ(started->peer, "t0");
    EXPECT_EQ(started->dirty_bytes, 4 * kChunk);
    PeerStatus status;
    volume_->resyncer.status(peer(), status);
    ASSERT_TRUE(status.resync.has_value());
    EXPECT_EQ(status.resync->left_bytes, 4 * kChunk);
    EXPECT_FALSE(status.resync->full);
  }
  ASSERT_TRUE(resynced());
  EXPECT_EQ(target_at(2 * kChunk), std::byte{1});
  EXPECT_EQ(target_at(9 * kChunk + 5), std::byte{2});
  EXPECT_NE(target_at(20 * kChunk), std::byte{3}) << "a clean chunk is not copied";
  std::lock_guard lock(volume_->core.mutex);
  EXPECT_EQ(volume_->core.meta->dirty_count(peer().meta_index), 0u);
  EXPECT_EQ(volume_->resyncer.resynced_bytes(peer()) - copied_before, 4 * kChunk);
  PeerStatus status;
  volume_->resyncer.status(peer(), status);
  EXPECT_FALSE(status.resync.has_value());
  EXPECT_EQ(status.resyncs, 2u);
}

TEST_F(ResyncerTest, AChunkWrittenWhileItsCopyTravelsStaysDirty) {
  open();
  ASSERT_TRUE(resynced());
  fill(4 * kChunk, kChunk, std::byte{9});
  std::unique_lock lock(volume_->core.mutex);
  volume_->peers.mark_dirty(peer(), 4 * kChunk, kChunk);
  ASSERT_TRUE(volume_->resyncer.request("t0", false).ok());
  // An in-sync replica keeps counting (no "inconsistent" update first):
  // the first step posts the copy.
  fabric().set_manual(true);  // the copy does not complete yet
  EXPECT_EQ(volume_->resyncer.step(peer()), Work::kWaiting);
  // Meanwhile the chunk is written and marked for it without a persist.
  volume_->peers.mark_missed(peer(), 4 * kChunk + 100, 8);
  fabric().set_manual(false);
  // The copy is durable on the replica; the next step collects it.
  bool durable = false;
  for (int i = 0; i < 5000 && !durable; ++i) {
    auto done = peer().replica->resync_done();
    ASSERT_TRUE(done.ok()) << done.status().to_string();
    durable = *done;
    if (!durable) std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(durable);
  uint64_t copied = volume_->resyncer.resynced_bytes(peer());
  volume_->resyncer.step(peer());
  EXPECT_TRUE(volume_->core.meta->is_dirty(peer().meta_index, 4))
      << "cleared by a copy that left before the write";
  EXPECT_EQ(volume_->resyncer.resynced_bytes(peer()), copied) << "a stale copy does not count";
  lock.unlock();
  ASSERT_TRUE(resynced()) << "copied again, then in sync";
  EXPECT_EQ(target_at(4 * kChunk), std::byte{9});
}

TEST_F(ResyncerTest, TheRateLimitHoldsCopiesBack) {
  open(/*resync_rate=*/kChunk / 100);  // one chunk per 100 s
  std::lock_guard lock(volume_->core.mutex);
  ASSERT_TRUE(volume_->resyncer.active(peer()));
  // The replica first acknowledges that its copy is mixed: no copy before.
  auto settled = volume_->peers.settle_generation(peer(), [](Peer&, uint64_t) {});
  for (int i = 0; i < 5000 && !settled; ++i) {
    std::this_thread::sleep_for(1ms);
    settled = volume_->peers.settle_generation(peer(), [](Peer&, uint64_t) {});
  }
  ASSERT_TRUE(settled);
  // The bucket starts empty: nothing may go for most of a second.
  EXPECT_EQ(volume_->resyncer.step(peer()), Work::kIdle);
  EXPECT_EQ(volume_->resyncer.resynced_bytes(peer()), 0u);
  PeerStatus status;
  volume_->resyncer.status(peer(), status);
  ASSERT_TRUE(status.resync.has_value());
  EXPECT_TRUE(status.resync->full);
  EXPECT_EQ(status.resync->done_bytes, 0u);
  EXPECT_EQ(status.resync->total_bytes, kSize);
  EXPECT_FALSE(status.resync->eta_seconds.has_value()) << "no rate measured yet";
}

TEST_F(ResyncerTest, SaysWhyAResyncCannotStart) {
  open();
  ASSERT_TRUE(resynced());
  std::lock_guard lock(volume_->core.mutex);
  EXPECT_EQ(volume_->resyncer.request("nobody", false).status().code(), Errc::kNotFound);
  volume_->peers.start_lagging(peer(), Status(Errc::kResourceExhausted, "full"));
  auto lagging = volume_->resyncer.request("t0", false);
  EXPECT_EQ(lagging.status().code(), Errc::kFailedPrecondition);
  EXPECT_NE(lagging.status().message().find("is lagging"), std::string::npos);
  volume_->peers.drop(peer(), Status(Errc::kConnectionError, "gone"));
  auto lost = volume_->resyncer.request("t0", true);
  EXPECT_EQ(lost.status().code(), Errc::kFailedPrecondition);
  EXPECT_EQ(lost.status().message(),
            "replica t0 is disconnected; a resync starts by itself when it reconnects");
  EXPECT_FALSE(volume_->resyncer.active(peer()));
}

}  // namespace
}  // namespace pmirror::initiator
