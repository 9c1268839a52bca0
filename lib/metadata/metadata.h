// What travels with one copy of a volume, on the node that holds it: the
// copy's data generations (DRBD's generation identifiers), whether it is
// consistent, whether it was promoted, the activity log of a primary, and
// one dirty bitmap per peer. A libpmemobj pool (layout "pmirror-copy-v1")
// next to the copy: `<path>.pmirror` for files, configurable (`metadata:`).
//
// Whoever uses the copy opens its metadata: libpmirror while the copy is
// the primary, pmirrord while it serves a session as a replica. libpmemobj
// locks the pool file, so the two roles exclude each other on a node: a
// second open fails with kBusy.
//
// Crash consistency: generation and role changes are libpmemobj
// transactions. Dirty bits and activity-log slots are single aligned 8-byte
// words made durable with one pmem persist each, so marking adds no round
// trip and nothing is lost if the process dies at any instant.
//
// Thread safety: one mutex serialises every call.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

struct pmemobjpool;
typedef struct pmemobjpool PMEMobjpool;

namespace pmirror::metadata {

inline constexpr const char* kLayoutName = "pmirror-copy-v1";
inline constexpr size_t kMaxPeers = 8;
inline constexpr size_t kHistory = 4;                    // previous generations remembered
inline constexpr size_t kActivityLogSlots = 64;          // extents a primary may have in flight
inline constexpr uint64_t kActivityExtent = 4ull << 20;  // bytes per activity-log slot
inline constexpr uint64_t kMinChunk = 4096;
inline constexpr uint64_t kMaxChunk = 1ull << 20;
inline constexpr uint64_t kDefaultChunk = 64ull << 10;
inline constexpr size_t kMaxPeerName = 64;

using Uuid = std::array<uint8_t, 16>;
std::string uuid_to_string(const Uuid& uuid);

// A copy's generation identifiers: random nonzero 64-bit values. `current`
// names the data the copy holds; 0 means the copy has never been written
// through pmirror (a new, empty replica). `history` holds the previous
// currents, newest first, 0 where unused.
struct Generations {
  uint64_t current = 0;
  std::array<uint64_t, kHistory> history{};
  // True if g (nonzero) is current or in history.
  bool knows(uint64_t g) const;
  bool operator==(const Generations&) const = default;
};

// Which primary a copy takes writes from, once a promotion elsewhere
// fenced it (docs/failover.md): only one whose copy descends from
// `generation` (the promoted copy's, then each generation its writer moves
// the copy to).
struct Fence {
  uint64_t generation = 0;  // 0: not fenced, any authenticated primary
  std::string node;         // where the volume was promoted
  uint64_t since_unix_ns = 0;
  bool operator==(const Fence&) const = default;
};

struct CopyInfo {
  Uuid uuid{};  // random, fixed when the pool is created: which copy this is
  Generations generations;
  // False while a resync into this copy is under way: its bytes are a mix
  // of two generations and it must not be promoted (without force).
  bool consistent = true;
  // Set by `pmirrorctl promote` on a replica node: this copy may be opened
  // as primary here; it refuses other writers.
  bool promoted = false;
  // False while a primary has the copy open: after a crash, the activity
  // log names the extents that may differ from the replicas.
  bool clean = true;
  Fence fence;
  uint64_t volume_size = 0;
  uint64_t chunk_size = kDefaultChunk;
  uint64_t chunks = 0;  // ceil(volume_size / chunk_size)
};

// A peer (another node's copy) as this copy's primary tracks it.
struct PeerInfo {
  std::string name;  // the node name in the cluster file
  // The generation the peer held when it was left behind (bits started
  // being recorded for it); 0: not tracking, the peer was in sync.
  uint64_t bitmap_generation = 0;
  Uuid peer_uuid{};        // the peer's copy uuid when last seen; zero: never seen
  bool full_sync = false;  // every chunk must be copied (new or replaced peer)
  uint64_t dirty_chunks = 0;
};

// One-sided commit's word (docs/protocol.md, "One-sided commit"): the last
// sequence a replica's initiator recorded into this copy's metadata with
// the fabric's ATOMIC WRITE, for one session bookkeeping generation.
struct CommitWord {
  uint64_t generation = 0;  // 0: no session armed it
  uint64_t sequence = 0;
};

class CopyMetadata {
 public:
  struct Options {
    std::string path;
    uint64_t volume_size = 0;  // a multiple of 4096
    // Chunk per dirty bit: a power of two in [kMinChunk, kMaxChunk]. An
    // existing pool keeps its own; a different value is kInvalidArgument
    // naming both (the bitmaps would not mean the same chunks).
    uint64_t chunk_size = kDefaultChunk;
    bool create_if_missing = true;
  };
  // Opens or creates (mode 0600, size enough for kMaxPeers bitmaps). A new
  // pool: fresh uuid, current generation 0, consistent, clean, no peers.
  // Errors name the path and say what to do: kBusy (open elsewhere, e.g.
  // the copy is primary in another process on this node), kNotFound,
  // kPermissionDenied, kInvalidArgument (other layout, other volume size
  // or chunk), kIoError (corrupt: `pmempool check`).
  static Result<std::unique_ptr<CopyMetadata>> open(const Options& options);
  ~CopyMetadata();
  CopyMetadata(const CopyMetadata&) = delete;
  CopyMetadata& operator=(const CopyMetadata&) = delete;

  const std::string& path() const { return path_; }
  CopyInfo info() const;

  // --- generations and role (each one transaction) ---
  // current := a new random value, the old current pushed into history.
  // Every peer not tracked yet (bitmap_generation 0) starts being tracked
  // at the old current (0 stays 0: nothing to track from). Returns the new
  // current.
  // `chosen` (nonzero, not current or in history): that value instead of a
  // random one (a promotion that fenced the other copies with it first).
  Result<uint64_t> new_generation(uint64_t chosen = 0);
  // A random nonzero generation this copy does not know.
  uint64_t fresh_generation() const;
  // Adopts a primary's generation (a replica after a resync, or a primary
  // announcing its new current): the old current goes into history if it
  // differs and is nonzero. Sets `consistent`.
  Status adopt_generation(uint64_t current, bool consistent);
  Status set_consistent(bool consistent);
  Status set_promoted(bool promoted);
  Status set_clean(bool clean);
  // Records the fence (replacing one before); clear_fence() lifts it (a
  // copy promoted here takes writes from its own node's primary again).
  // adopt_generation moves a fence along to the adopted generation.
  Status set_fence(uint64_t generation, const std::string& node);
  Status clear_fence();

  // --- peers ---
  // The peer's index, adding it (untracked, never seen) if new.
  // kResourceExhausted past kMaxPeers.
  Result<size_t> peer(const std::string& name);
  // Every peer, by index: peers()[i] is peer i (indices are handed out in
  // order and only forget_peers() removes peers, all at once).
  std::vector<PeerInfo> peers() const;
  Status set_peer_uuid(size_t peer, const Uuid& uuid);
  // Start tracking at `generation` (nonzero) if not tracking; no-op
  // otherwise.
  Status track_peer(size_t peer, uint64_t generation);
  // Stop tracking (the peer is in sync again): bitmap_generation 0,
  // full_sync false. kFailedPrecondition while dirty bits remain.
  Status untrack_peer(size_t peer);
  // Sets every bit and full_sync: the whole volume must be copied.
  Status mark_all(size_t peer);
  // Removes every peer (a copy that became a plain replica of another
  // primary: its old bitmaps mean nothing any more).
  Status forget_peers();

  // --- dirty bits (single-word persists, no transaction) ---
  // Sets the bits of every chunk touching [offset, +length). Words already
  // set are not written again, so a peer that stays behind costs nothing
  // after the first write to a chunk. Returns how many bits were newly set.
  Result<uint64_t> mark(size_t peer, uint64_t offset, uint64_t length);
  Status clear(size_t peer, uint64_t chunk);
  bool is_dirty(size_t peer, uint64_t chunk) const;
  // The first dirty chunk at or after `from`, or `chunks` if none.
  uint64_t next_dirty(size_t peer, uint64_t from) const;
  uint64_t dirty_count(size_t peer) const;

  // --- activity log (a primary's in-flight extents) ---
  // Makes sure every kActivityExtent extent touching [offset, +length) is in
  // the log before the persist is posted. `evictable(extent)` tells whether
  // an extent logged earlier has no persist in flight; one of those is
  // replaced when the log is full. kResourceExhausted if the range needs
  // more free slots than there are. Returns how many slots were written.
  // `evictable` runs with this object's mutex held: it must not call back
  // into this CopyMetadata. It is asked only about extents outside the range.
  Result<uint32_t> activity_begin(uint64_t offset, uint64_t length,
                                  const std::function<bool(uint64_t extent)>& evictable);
  // The logged extents (extent indices).
  std::vector<uint64_t> activity_extents() const;
  // After a crash (clean was false at open): marks every logged extent
  // dirty for every peer, then empties the log. Returns the extents merged.
  Result<std::vector<uint64_t>> recover_activity_log();
  // Marks [extent * kActivityExtent, +kActivityExtent) dirty for one peer
  // (a returning old primary's own activity log, reported by its target).
  Status mark_extent(size_t peer, uint64_t extent);
  // Empties the log without marking anything (a replica whose new primary
  // has already resynced the extents it reported).
  Status clear_activity_log();

  // --- one-sided commit's word (written by the NIC, read here) ---
  // The word's 8 bytes (8-byte aligned) inside the pool's mapping: what a
  // session registers for the initiator's ATOMIC WRITE and FLUSH.
  void* commit_word_address() const;
  // True when the pool's mapping is pmem: a FLUSH to persistence of the
  // word means something only then (the target offers the method only so).
  bool commit_word_is_pmem() const;
  // A session starts: the word holds `sequence` for `generation` (each
  // step persisted: generation 0 first, so that a crash in between never
  // pairs one session's generation with another's sequence).
  Status arm_commit_word(uint64_t generation, uint64_t sequence);
  // The word now (an atomic read: the NIC may be writing it).
  CommitWord commit_word() const;

 private:
  struct PoolCloser {
    void operator()(PMEMobjpool* pop) const;
  };
  struct Root;
  CopyMetadata() = default;

  std::unique_ptr<PMEMobjpool, PoolCloser> pool_;
  Root* root_ = nullptr;
  std::string path_;
  mutable std::mutex mutex_;
  // Volatile: each peer's number of set bits, counted at open and kept up
  // to date by every change, so dirty_count() is O(1).
  std::array<uint64_t, kMaxPeers> dirty_{};
  // The pool's file is pmem (a MAP_SYNC mapping of it works): libpmem knows
  // only its own mappings, not libpmemobj's, so this is asked at open.
  bool on_pmem_ = false;
};

// The default metadata path for a copy at `data_path` of volume `volume`:
// `<data_path>.pmirror` for files, `/var/lib/pmirror/<volume>.pmirror` for
// devdax devices (paths starting /dev/dax).
std::string default_metadata_path(const std::string& data_path, const std::string& volume);

}  // namespace pmirror::metadata
