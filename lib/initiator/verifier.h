// verify: compares the local copy with the replicas chunk by chunk, by
// XXH3-64 computed on each side, on a volume that may be written meanwhile
// (docs/replica-recovery.md, "Verify"). A chunk that differs is only a
// suspect until it differed twice with the same local bytes; one that
// keeps changing is reported busy.
//
// Ownership: no state between calls. Runs on the caller's thread (the
// application's, or the control socket's) and takes the volume mutex for
// each batch, letting persists in between; the replica's VerifyRequest
// round trips happen with it held.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "initiator/peers.h"
#include "initiator/persist_ledger.h"
#include "initiator/resyncer.h"
#include "initiator/volume_core.h"

namespace pmirror::initiator {

class Verifier {
 public:
  Verifier(VolumeCore& core, PersistLedger& ledger, Peers& peers, Resyncer& resyncer);

  // `peer` empty: every connected replica. With `mark_dirty` the chunks
  // that differ are marked dirty and a resync repairs them. Takes the
  // volume mutex itself (do not hold it). kNotFound, kFailedPrecondition.
  Result<std::vector<VerifyPeerResult>> verify(const std::string& peer, bool mark_dirty);

 private:
  VerifyPeerResult verify_peer(Peer& peer, bool mark_dirty);
  // The chunks in [first, first+count) whose hashes differ. Mutex held.
  Result<std::vector<uint64_t>> compare_chunks(Peer& peer, uint64_t first, uint64_t count);
  // Mutex held by `lock`. The peer is connected and not lagging (a lagging
  // peer answers nothing: wait, without the mutex, until it catches up or
  // is dropped).
  Status ready(std::unique_lock<std::mutex>& lock, Peer& peer);
  // Between two looks at the suspects: time for the application to persist
  // what it stored. `looked_at`: the next sequence at the end of the last
  // look.
  void let_application_in(uint64_t looked_at);
  // Sorted chunks as merged (offset, length) ranges.
  std::vector<std::pair<uint64_t, uint64_t>> chunk_ranges(const std::vector<uint64_t>& sorted);

  VolumeCore& core_;
  PersistLedger& ledger_;
  Peers& peers_;
  Resyncer& resyncer_;
};

}  // namespace pmirror::initiator
