// Peer tracking over real targets on the fake fabric: the decision taken
// when a session opens, generations, lagging, losing a replica, and what
// each leaves in the dirty maps and the ledger.
#include "initiator/peers.h"

#include <gtest/gtest.h>

#include <cstring>

#include "unit/initiator/fake_targets.h"

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
using supervisor::PeerState;
using testing::FakeTargetsTest;

class PeersTest : public FakeTargetsTest {
 protected:
  void open(size_t replicas, uint32_t ack = 0) {
    open_volume(replicas, [&](VolumeOptions& o) { o.ack = ack; });
  }
  bool dirty(const Peer& peer, uint64_t offset) {
    return volume_->core.meta->is_dirty(peer.meta_index, offset / kChunk);
  }
};

TEST_F(PeersTest, ANewReplicaIsFullySyncedBeforeItCounts) {
  open(1);
  Peer& peer = peer_at(0);
  {
    std::lock_guard lock(volume_->core.mutex);
    EXPECT_TRUE(peer.live());
    EXPECT_FALSE(peer.in_sync) << "a never-written copy is not trusted to be zero";
    EXPECT_EQ(peer.state.state(), PeerState::kSyncing);
    EXPECT_EQ(volume_->core.meta->dirty_count(peer.meta_index), volume_->core.chunks);
    EXPECT_EQ(volume_->peers.in_sync_count(), 0u);
  }
  std::memset(volume_->core.local->data(), 0xab, kSize);
  ASSERT_TRUE(all_in_sync());
  std::lock_guard lock(volume_->core.mutex);
  EXPECT_EQ(peer.state.state(), PeerState::kConnected);
  EXPECT_EQ(volume_->core.meta->dirty_count(peer.meta_index), 0u);
  EXPECT_EQ(peer.told_generation, volume_->core.current_generation());
  EXPECT_EQ(peer.replica->remote_copy().generations.current, volume_->core.current_generation());
  auto bytes = target_bytes(0);
  EXPECT_TRUE(
      std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0xab}; }));
}

TEST_F(PeersTest, LaggingMarksWhatItHasNotAcknowledgedAndKeepsTheSession) {
  open(2, /*ack=*/1);
  ASSERT_TRUE(all_in_sync());
  std::lock_guard lock(volume_->core.mutex);
  Peer& lagging = peer_at(1);
  uint64_t generation = volume_->core.current_generation();
  Peer& other = peer_at(0);
  // Persist 1 reached both replicas; persist 2 only replica 0.
  uint64_t first = volume_->ledger.start(0, 100);
  ASSERT_TRUE(lagging.replica->post_persist(first, 0, 100).ok());
  ASSERT_TRUE(lagging.replica->wait_for(first).ok());
  ASSERT_TRUE(other.replica->post_persist(first, 0, 100).ok());
  uint64_t second = volume_->ledger.start(3 * kChunk, 100);
  ASSERT_TRUE(other.replica->post_persist(second, 3 * kChunk, 100).ok());
  ASSERT_TRUE(other.replica->wait_for(second).ok());
  volume_->peers.start_lagging(lagging, Status(Errc::kResourceExhausted, "no slot"));
  EXPECT_TRUE(lagging.live());
  EXPECT_TRUE(lagging.lagging);
  EXPECT_FALSE(lagging.in_sync);
  auto state = lagging.state.snapshot();
  EXPECT_EQ(state.state, PeerState::kLagging);
  EXPECT_EQ(state.reason, "no slot; its writes are recorded dirty until it catches up");
  EXPECT_FALSE(dirty(lagging, 0)) << "acknowledged by it";
  EXPECT_TRUE(dirty(lagging, 3 * kChunk));
  EXPECT_NE(volume_->core.current_generation(), generation) << "tracked from a new generation";
  EXPECT_EQ(volume_->peers.in_sync_count(), 1u);
  // A lagging replica does not hold the unsettled boundary back.
  EXPECT_EQ(volume_->peers.durable_everywhere(), second);
}

TEST_F(PeersTest, ALostReplicaGetsItsUnacknowledgedRangesMarkedAndItsSessionForgotten) {
  open(1);
  ASSERT_TRUE(all_in_sync());
  std::unique_lock lock(volume_->core.mutex);
  Peer& peer = peer_at(0);
  fabric().set_manual(true);  // nothing completes
  uint64_t sequence = volume_->ledger.start(5 * kChunk, 10);
  ASSERT_TRUE(peer.replica->post_persist(sequence, 5 * kChunk, 10).ok());
  EXPECT_EQ(volume_->ledger.pending_count(0), 1u);
  fabric().set_manual(false);
  volume_->peers.drop(peer, Status(Errc::kConnectionError, "cable pulled"));
  EXPECT_FALSE(peer.live());
  EXPECT_FALSE(peer.in_sync);
  EXPECT_EQ(peer.errors, 1u);
  EXPECT_EQ(peer.state.snapshot().reason, "cable pulled");
  EXPECT_EQ(peer.state.state(), PeerState::kDisconnected);
  EXPECT_EQ(volume_->ledger.pending_count(0), 0u);
  EXPECT_TRUE(dirty(peer, 5 * kChunk)) << "marked even if it may have arrived";
  EXPECT_FALSE(dirty(peer, 6 * kChunk));
  EXPECT_NE(volume_->core.meta->peers()[peer.meta_index].bitmap_generation, 0u);
  auto status = volume_->peers.status(peer);
  EXPECT_EQ(status.method, "");
  EXPECT_EQ(status.dirty_chunks, 1u);
  EXPECT_EQ(status.dirty_bytes, kChunk);
  ASSERT_TRUE(status.behind_since_generation.has_value());
  EXPECT_NE(*status.behind_since_generation, 0u);
  auto replica = volume_->peers.replica_status(peer);
  EXPECT_EQ(replica.state, ReplicaState::kFailed);
  EXPECT_EQ(replica.connection, "disconnected");
  EXPECT_EQ(replica.last_error, "cable pulled");
  // While it reconnects, the error stays what it was (the state's reason
  // says which attempt runs).
  peer.state.transition(PeerState::kConnecting, "reconnect attempt 1");
  EXPECT_EQ(volume_->peers.replica_status(peer).connection, "connecting");
  EXPECT_EQ(volume_->peers.replica_status(peer).last_error, "cable pulled");
}

// Away, a replica's status keeps the last sequence it acknowledged, and
// the lag counts from there (it read acked:0 and a lag of every sequence
// ever started).
TEST_F(PeersTest, AnAwayReplicaKeepsItsLastAcknowledgedSequence) {
  open(1);
  ASSERT_TRUE(all_in_sync());
  std::unique_lock lock(volume_->core.mutex);
  Peer& peer = peer_at(0);
  uint64_t acked = 0;
  for (int i = 0; i < 3; ++i) {
    acked = volume_->ledger.start(0, 100);
    ASSERT_TRUE(peer.replica->post_persist(acked, 0, 100).ok());
    ASSERT_TRUE(peer.replica->wait_for(acked).ok());
  }
  ASSERT_EQ(volume_->peers.status(peer).acknowledged_sequence, acked);
  volume_->peers.drop(peer, Status(Errc::kConnectionError, "cable pulled"));
  ASSERT_FALSE(peer.live());
  auto away = volume_->peers.status(peer);
  EXPECT_EQ(away.acknowledged_sequence, acked);
  EXPECT_EQ(away.lag, 0u) << "nothing started since it left";
  // Persists started while it is away: the lag counts them.
  uint64_t later = 0;
  for (int i = 0; i < 2; ++i) later = volume_->ledger.start(2 * kChunk, 10);
  away = volume_->peers.status(peer);
  EXPECT_EQ(away.acknowledged_sequence, acked);
  EXPECT_EQ(away.lag, later - acked);
}

TEST_F(PeersTest, AnInSyncReplicaLearnsTheNewGenerationAndIsUntracked) {
  open(2, /*ack=*/1);
  ASSERT_TRUE(all_in_sync());
  Peer* peer = nullptr;
  {
    std::lock_guard lock(volume_->core.mutex);
    peer = &peer_at(0);
    // Replica 1 is lost: a new generation starts; replica 0, in sync, is
    // tracked from the old one until it learns the new one.
    volume_->peers.drop(peer_at(1), Status(Errc::kConnectionError, "gone"));
    EXPECT_NE(volume_->core.meta->peers()[peer->meta_index].bitmap_generation, 0u);
    volume_->peers.announce_generation(*peer);
    ASSERT_EQ(peer->generation_updates.size(), 1u);
    EXPECT_EQ(peer->generation_updates.front().news, GenerationNews::kAnnounce);
  }
  bool finished_called = false;
  bool settled = supervise_until([&] {
    return volume_->peers.settle_generation(*peer,
                                            [&](Peer&, uint64_t) { finished_called = true; });
  });
  ASSERT_TRUE(settled);
  std::lock_guard lock(volume_->core.mutex);
  EXPECT_FALSE(finished_called) << "an announcement ends no resync";
  EXPECT_EQ(peer->told_generation, volume_->core.current_generation());
  EXPECT_EQ(peer->replica->remote_copy().generations.current, volume_->core.current_generation());
  EXPECT_EQ(volume_->core.meta->peers()[peer->meta_index].bitmap_generation, 0u);
}

TEST_F(PeersTest, LookupByNodeOrAddress) {
  open(2);
  auto by_node = volume_->peers.lookup("t1");
  ASSERT_TRUE(by_node.ok());
  EXPECT_EQ((*by_node)->index, 1u);
  auto by_address = volume_->peers.lookup("t0:" + std::to_string(peer_at(0).spec.port));
  ASSERT_TRUE(by_address.ok());
  EXPECT_EQ((*by_address)->index, 0u);
  auto unknown = volume_->peers.lookup("t9");
  EXPECT_EQ(unknown.status().code(), Errc::kNotFound);
  EXPECT_EQ(unknown.status().message(), "volume 'v' has no replica 't9' (replicas: t0, t1)");
}

}  // namespace
}  // namespace pmirror::initiator
