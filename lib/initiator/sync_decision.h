// What a primary does with a replica it has just (re)connected to, decided
// from the two copies' generations and what the primary recorded about the
// replica (docs/replica-recovery.md, "Generations"). Pure: no I/O, so that
// every case is unit-tested.
#pragma once

#include <string>

#include "metadata/metadata.h"

namespace pmirror::initiator {

// The replica's copy as its VolumeDescriptor describes it.
struct RemoteCopy {
  metadata::Uuid uuid{};
  metadata::Generations generations;
  bool consistent = true;
  bool promoted = false;
};

enum class SyncAction {
  kInSync,       // same generation, nothing recorded: counts for acks at once
  kResyncDirty,  // copy the chunks recorded dirty for it, then it is in sync
  kFullSync,     // copy every chunk (new, replaced, or untracked history)
  kPeerNewer,    // the replica moved on from our generation: refuse, it must sync us
  kSplitBrain,   // both moved on from a common past: refuse (or overwrite by policy)
};
std::string_view sync_action_name(SyncAction action);

struct SyncDecision {
  SyncAction action = SyncAction::kInSync;
  std::string reason;  // for status and logs, in an operator's words
};

// `peer` is what this primary's metadata holds for the replica; `dirty`
// its dirty chunk count. `overwrite_split_brain` turns kSplitBrain into
// kFullSync (after_split_brain: overwrite_replica).
SyncDecision decide_sync(const metadata::Generations& primary, const metadata::PeerInfo& peer,
                         const RemoteCopy& remote, bool overwrite_split_brain);

// 16 hex digits, as status shows generations.
std::string generation_hex(uint64_t generation);

}  // namespace pmirror::initiator
