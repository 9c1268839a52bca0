// Every way a primary can find a replica's copy on reconnect, and what it
// must do about it (docs/replica-recovery.md, "Generations").
#include "initiator/sync_decision.h"

#include <gtest/gtest.h>

namespace pmirror::initiator {
namespace {

constexpr uint64_t kOld = 0x1111;
constexpr uint64_t kMiddle = 0x2222;
constexpr uint64_t kNow = 0x3333;
constexpr uint64_t kTheirs = 0x4444;

metadata::Uuid uuid(uint8_t seed) {
  metadata::Uuid u{};
  u.fill(seed);
  return u;
}

metadata::Generations gens(uint64_t current, std::initializer_list<uint64_t> history = {}) {
  metadata::Generations g;
  g.current = current;
  size_t i = 0;
  for (uint64_t h : history) g.history[i++] = h;
  return g;
}

metadata::PeerInfo peer(uint64_t bitmap_generation, uint64_t dirty, metadata::Uuid seen = {}) {
  metadata::PeerInfo p;
  p.name = "b";
  p.bitmap_generation = bitmap_generation;
  p.dirty_chunks = dirty;
  p.peer_uuid = seen;
  return p;
}

RemoteCopy remote(uint64_t current, std::initializer_list<uint64_t> history = {},
                  metadata::Uuid id = uuid(7)) {
  RemoteCopy r;
  r.uuid = id;
  r.generations = gens(current, history);
  return r;
}

TEST(SyncDecision, SameGenerationNothingDirtyIsInSync) {
  auto d = decide_sync(gens(kNow, {kOld}), peer(0, 0, uuid(7)), remote(kNow, {kOld}), false);
  EXPECT_EQ(d.action, SyncAction::kInSync) << d.reason;
}

TEST(SyncDecision, SameGenerationWithDirtyChunksResyncsThem) {
  // e.g. the primary crashed and its activity log was merged into the bitmap
  auto d = decide_sync(gens(kNow), peer(0, 12, uuid(7)), remote(kNow), false);
  EXPECT_EQ(d.action, SyncAction::kResyncDirty) << d.reason;
}

TEST(SyncDecision, LeftBehindAtTrackedGenerationResyncsDirtyChunks) {
  auto d = decide_sync(gens(kNow, {kMiddle, kOld}), peer(kMiddle, 40, uuid(7)),
                       remote(kMiddle, {kOld}), false);
  EXPECT_EQ(d.action, SyncAction::kResyncDirty) << d.reason;
  EXPECT_NE(d.reason.find("40 chunks"), std::string::npos) << d.reason;
}

TEST(SyncDecision, NewEmptyReplicaGetsFullSync) {
  auto d = decide_sync(gens(kNow), peer(0, 0), remote(0), false);
  EXPECT_EQ(d.action, SyncAction::kFullSync) << d.reason;
}

TEST(SyncDecision, ReplacedReplicaGetsFullSyncEvenWithMatchingGeneration) {
  auto d = decide_sync(gens(kNow), peer(0, 0, uuid(1)), remote(kNow, {}, uuid(2)), false);
  EXPECT_EQ(d.action, SyncAction::kFullSync) << d.reason;
  EXPECT_NE(d.reason.find("replaced"), std::string::npos) << d.reason;
}

TEST(SyncDecision, PendingFullSyncStaysFull) {
  auto p = peer(kMiddle, 100, uuid(7));
  p.full_sync = true;
  auto d = decide_sync(gens(kNow, {kMiddle}), p, remote(kMiddle), false);
  EXPECT_EQ(d.action, SyncAction::kFullSync) << d.reason;
}

TEST(SyncDecision, OlderGenerationWithoutBitmapGetsFullSync) {
  auto d = decide_sync(gens(kNow, {kMiddle, kOld}), peer(kMiddle, 3, uuid(7)), remote(kOld), false);
  EXPECT_EQ(d.action, SyncAction::kFullSync) << d.reason;
}

TEST(SyncDecision, PromotedReplicaIsNewerAndRefused) {
  // We are the old primary at kNow; the replica was promoted from kNow.
  auto d =
      decide_sync(gens(kNow, {kOld}), peer(0, 0, uuid(7)), remote(kTheirs, {kNow, kOld}), false);
  EXPECT_EQ(d.action, SyncAction::kPeerNewer) << d.reason;
  EXPECT_NE(d.reason.find("newer"), std::string::npos) << d.reason;
}

TEST(SyncDecision, BothMovedOnIsSplitBrainAndRefusedByDefault) {
  auto d = decide_sync(gens(kNow, {kOld}), peer(kOld, 5, uuid(7)), remote(kTheirs, {kOld}), false);
  EXPECT_EQ(d.action, SyncAction::kSplitBrain) << d.reason;
  EXPECT_NE(d.reason.find("split brain"), std::string::npos) << d.reason;
}

TEST(SyncDecision, SplitBrainOverwrittenOnlyByPolicy) {
  auto d = decide_sync(gens(kNow, {kOld}), peer(kOld, 5, uuid(7)), remote(kTheirs, {kOld}), true);
  EXPECT_EQ(d.action, SyncAction::kFullSync) << d.reason;
  EXPECT_NE(d.reason.find("overwrite_replica"), std::string::npos) << d.reason;
}

TEST(SyncDecision, UnrelatedHistoriesAreSplitBrain) {
  auto d = decide_sync(gens(kNow), peer(0, 0), remote(kTheirs), false);
  EXPECT_EQ(d.action, SyncAction::kSplitBrain) << d.reason;
}

TEST(SyncDecision, GenerationHexIsSixteenDigits) {
  EXPECT_EQ(generation_hex(0xabc), "0000000000000abc");
  EXPECT_EQ(generation_hex(~0ull), "ffffffffffffffff");
}

}  // namespace
}  // namespace pmirror::initiator
