#include "initiator/sync_decision.h"

#include <cstdio>

namespace pmirror::initiator {

std::string_view sync_action_name(SyncAction action) {
  switch (action) {
    case SyncAction::kInSync:
      return "in-sync";
    case SyncAction::kResyncDirty:
      return "resync-dirty";
    case SyncAction::kFullSync:
      return "full-sync";
    case SyncAction::kPeerNewer:
      return "peer-newer";
    case SyncAction::kSplitBrain:
      return "split-brain";
  }
  return "unknown";
}

std::string generation_hex(uint64_t generation) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(generation));
  return text;
}

SyncDecision decide_sync(const metadata::Generations& primary, const metadata::PeerInfo& peer,
                         const RemoteCopy& remote, bool overwrite_split_brain) {
  const uint64_t ours = primary.current;
  const uint64_t theirs = remote.generations.current;
  const bool seen_before = peer.peer_uuid != metadata::Uuid{};
  const bool same_copy = !seen_before || peer.peer_uuid == remote.uuid;

  if (theirs == 0) {
    return {SyncAction::kFullSync, "the replica's copy never received data: initial full sync"};
  }
  if (!same_copy) {
    return {SyncAction::kFullSync, "the replica's copy was replaced (uuid " +
                                       metadata::uuid_to_string(remote.uuid) + ", recorded " +
                                       metadata::uuid_to_string(peer.peer_uuid) + "): full sync"};
  }
  if (peer.full_sync) {
    return {SyncAction::kFullSync, "a full sync of this replica is pending"};
  }
  if (theirs == ours) {
    if (peer.dirty_chunks == 0)
      return {SyncAction::kInSync, "same generation " + generation_hex(ours)};
    return {SyncAction::kResyncDirty,
            "same generation, " + std::to_string(peer.dirty_chunks) + " chunks recorded dirty"};
  }
  if (peer.bitmap_generation != 0 && theirs == peer.bitmap_generation) {
    return {SyncAction::kResyncDirty, "left behind at generation " + generation_hex(theirs) +
                                          ", now " + generation_hex(ours) + ": " +
                                          std::to_string(peer.dirty_chunks) +
                                          " chunks recorded dirty"};
  }
  if (remote.generations.knows(ours)) {
    return {SyncAction::kPeerNewer,
            "the replica's copy is newer: it moved on from our generation " + generation_hex(ours) +
                " to " + generation_hex(theirs) +
                " (it was promoted and written to); this copy must be resynced from it, "
                "not the other way round"};
  }
  if (primary.knows(theirs)) {
    // Ours descends from theirs, but nothing recorded what changed since.
    return {SyncAction::kFullSync, "the replica holds our earlier generation " +
                                       generation_hex(theirs) +
                                       " and no dirty map covers it: full sync"};
  }
  std::string why = "split brain: the replica's generation " + generation_hex(theirs) +
                    " and ours " + generation_hex(ours) +
                    " both moved on from a common past; neither copy is overwritten";
  if (overwrite_split_brain) {
    return {SyncAction::kFullSync,
            "split brain resolved by after_split_brain: overwrite_replica (replica's generation " +
                generation_hex(theirs) + " discarded): full sync"};
  }
  return {SyncAction::kSplitBrain, why};
}

}  // namespace pmirror::initiator
