// verify over a real target on the fake fabric: equal copies report
// nothing, damage on the replica is reported (merged ranges) and, with
// mark_dirty, repaired by a resync; chunks recorded dirty are left alone.
#include "initiator/verifier.h"

#include <gtest/gtest.h>

#include "unit/initiator/fake_targets.h"

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
using supervisor::PeerState;
using testing::FakeTargetsTest;
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

class VerifierTest : public FakeTargetsTest {
 protected:
  void open() {
    open_volume(1);
    ASSERT_TRUE(all_in_sync());
  }
  VerifyPeerResult verify(bool mark_dirty) {
    auto results = volume_->verifier.verify("t0", mark_dirty);
    EXPECT_TRUE(results.ok()) << results.status().to_string();
    if (!results.ok() || results->size() != 1) return {};
    EXPECT_TRUE((*results)[0].status.ok()) << (*results)[0].status.to_string();
    return (*results)[0];
  }
};

TEST_F(VerifierTest, EqualCopiesHaveNothingToReport) {
  open();
  VerifyPeerResult result = verify(false);
  EXPECT_EQ(result.peer, "t0");
  EXPECT_EQ(result.chunks_compared, volume_->core.chunks);
  EXPECT_EQ(result.bytes_compared, kSize);
  EXPECT_TRUE(result.mismatches.empty());
  EXPECT_TRUE(result.busy.empty());
  EXPECT_EQ(result.marked_dirty, 0u);
}

TEST_F(VerifierTest, DamageIsReportedAndWithMarkDirtyRepaired) {
  open();
  scribble_on_target(0, 10 * kChunk + 5, std::byte{0xee});
  scribble_on_target(0, 11 * kChunk + 9, std::byte{0xee});
  scribble_on_target(0, 30 * kChunk, std::byte{0xee});
  VerifyPeerResult found = verify(false);
  EXPECT_EQ(found.mismatches, (Ranges{{10 * kChunk, 2 * kChunk}, {30 * kChunk, kChunk}}));
  EXPECT_EQ(found.marked_dirty, 0u);
  {
    std::lock_guard lock(volume_->core.mutex);
    EXPECT_TRUE(peer_at(0).in_sync) << "only reported";
  }

  VerifyPeerResult marked = verify(true);
  EXPECT_EQ(marked.mismatches.size(), 2u);
  EXPECT_EQ(marked.marked_dirty, 3u);
  {
    std::lock_guard lock(volume_->core.mutex);
    Peer& peer = peer_at(0);
    EXPECT_FALSE(peer.in_sync) << "known to differ: it does not count for acks";
    EXPECT_TRUE(volume_->resyncer.active(peer));
    EXPECT_EQ(peer.state.state(), PeerState::kSyncing);
    EXPECT_TRUE(volume_->core.meta->is_dirty(peer.meta_index, 10));
  }
  ASSERT_TRUE(all_in_sync());
  EXPECT_EQ(target_bytes(0)[10 * kChunk + 5], std::byte{0});
  EXPECT_TRUE(verify(false).mismatches.empty());
}

TEST_F(VerifierTest, ChunksRecordedDirtyAreLeftToTheResync) {
  open();
  scribble_on_target(0, 3 * kChunk, std::byte{1});
  {
    std::lock_guard lock(volume_->core.mutex);
    volume_->peers.mark_dirty(peer_at(0), 3 * kChunk, 1);
  }
  EXPECT_TRUE(verify(false).mismatches.empty());
}

TEST_F(VerifierTest, SaysWhyItCannotCompare) {
  open();
  EXPECT_EQ(volume_->verifier.verify("nobody", false).status().code(), Errc::kNotFound);
  {
    std::lock_guard lock(volume_->core.mutex);
    volume_->peers.drop(peer_at(0), Status(Errc::kConnectionError, "gone"));
  }
  auto none = volume_->verifier.verify("", false);
  EXPECT_EQ(none.status().code(), Errc::kFailedPrecondition);
  EXPECT_EQ(none.status().message(), "no replica of 'v' is connected to verify against");
  auto named = volume_->verifier.verify("t0", false);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ((*named)[0].status.code(), Errc::kConnectionError);
  EXPECT_EQ((*named)[0].status.message(), "replica t0 is not connected");
}

}  // namespace
}  // namespace pmirror::initiator
