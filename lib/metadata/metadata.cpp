#include "metadata/metadata.h"

#include <fcntl.h>
#include <libpmem.h>
#include <libpmemobj.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string_view>

#include "common/log.h"
#include "common/preflight.h"
#include "state/pool_file.h"

namespace pmirror::metadata {

namespace {
constexpr const char* kDefaultMetadataDir = preflight::kDefaultDirectory;
}  // namespace

namespace {

using state::pmemobj_reason;
using state::random_uuid;
using state::read_name;
using state::run_tx;
using state::snapshot;

// "PMCOPY01": set when the root object is constructed.
constexpr uint64_t kRootMagic = 0x313059504f434d50ULL;
constexpr uint32_t kRootVersion = 1;
constexpr size_t kPeerNameField = kMaxPeerName + 8;  // NUL-terminated, padded to 8
// The bitmaps of all peers together may not exceed this (libpmemobj can
// allocate up to ~16 GiB in one piece; 4 GiB is 32 TiB at 4 KiB chunks).
constexpr uint64_t kMaxBitmapBytes = 4ull << 30;
// libpmemobj's own overhead in a pool (lanes, heap headers): measured at
// under 4 MiB; twice that plus 1/256 of the root for the heap's chunk map.
constexpr uint64_t kPoolSlack = 8ull << 20;

// One peer's record, as stored. Field order and sizes are the on-media
// format of layout pmirror-copy-v1: append into `reserved` only.
struct PeerRecord {
  uint64_t in_use;             // 1: this slot holds a peer; 0: free (whole record 0)
  uint64_t bitmap_generation;  // 0: not tracking
  uint64_t full_sync;          // 1: every chunk must be copied
  uint64_t filling;            // 1: mark_all() was filling the bitmap; open() finishes it
  uint8_t uuid[16];
  char name[kPeerNameField];
  uint8_t reserved[8];
};
static_assert(sizeof(PeerRecord) == 128, "on-media layout of pmirror-copy-v1");

// The fixed part of the root object; the bitmaps follow it, kMaxPeers of
// them, `bitmap_words` 64-bit words each (a multiple of 8: each bitmap
// starts on its own cache line).
struct PoolHeader {
  uint64_t magic;  // kRootMagic
  uint32_t version;
  uint32_t max_peers;
  uint64_t volume_size;
  uint64_t chunk_size;
  uint64_t chunks;
  uint64_t bitmap_words;
  uint64_t activity_extent;
  uint32_t activity_slots;
  uint32_t history_length;
  uint8_t uuid[16];
  // Generations and role: changed in transactions only.
  uint64_t current;
  uint64_t history[kHistory];
  uint64_t consistent;
  uint64_t promoted;
  uint64_t clean;
  // The fence (docs/failover.md): 0, or the generation a writer's copy must
  // descend from. Appended in the former reserved bytes (zero in older
  // pools: no fence). Changed in transactions only.
  uint64_t fence_generation;
  uint64_t fenced_unix_ns;
  char fence_node[kPeerNameField];
  // One-sided commit (docs/protocol.md, "One-sided commit"): the last
  // sequence a session's initiator recorded with ATOMIC WRITE (the NIC
  // writes it; only the session's start writes it from here), valid for
  // the session bookkeeping generation beside it. Appended in the former
  // reserved bytes (zero in older pools: no word).
  uint64_t commit_sequence;
  uint64_t commit_generation;
  uint8_t reserved[8];
  PeerRecord peers[kMaxPeers];
  // extent index + 1; 0: free. Single-word persists.
  uint64_t activity[kActivityLogSlots];
};
static_assert(offsetof(PoolHeader, peers) == 256, "on-media layout of pmirror-copy-v1");
static_assert(offsetof(PoolHeader, commit_sequence) % 8 == 0,
              "ATOMIC WRITE needs 8-byte alignment");
static_assert(sizeof(PoolHeader) == 256 + 128 * kMaxPeers + 8 * kActivityLogSlots,
              "on-media layout of pmirror-copy-v1");
static_assert(sizeof(PoolHeader) % 64 == 0, "bitmaps start on a cache line");

// What a volume of a given size and chunk needs.
struct Geometry {
  uint64_t chunks = 0;
  uint64_t used_words = 0;    // words holding bits: ceil(chunks / 64)
  uint64_t bitmap_words = 0;  // per peer, rounded up to a cache line
  uint64_t root_size = 0;
  uint64_t pool_size = 0;
};

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

Geometry geometry(uint64_t volume_size, uint64_t chunk_size) {
  Geometry g;
  g.chunks = ceil_div(volume_size, chunk_size);
  g.used_words = (g.chunks + 63) / 64;
  g.bitmap_words = (g.used_words + 7) / 8 * 8;
  g.root_size = sizeof(PoolHeader) + kMaxPeers * g.bitmap_words * 8;
  uint64_t pool = g.root_size + kPoolSlack + g.root_size / 256;
  pool = (pool + 4095) / 4096 * 4096;
  g.pool_size = std::max<uint64_t>(pool, PMEMOBJ_MIN_POOL);
  return g;
}

uint64_t* bitmap_of(PoolHeader* h, size_t peer) {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(h) + sizeof(PoolHeader)) +
         peer * h->bitmap_words;
}

// An aligned 8-byte store the compiler may not split.
void store_word(uint64_t* word, uint64_t value) {
  std::atomic_ref<uint64_t>(*word).store(value, std::memory_order_relaxed);
}

bool random_bytes(void* out, size_t len) {
  size_t filled = 0;
  auto* p = static_cast<uint8_t*>(out);
  while (filled < len) {
    ssize_t n = ::getrandom(p + filled, len - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    filled += static_cast<size_t>(n);
  }
  return true;
}

uint64_t random_u64() {
  uint64_t v = 0;
  if (!random_bytes(&v, sizeof(v))) {
    std::random_device rd;
    v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  return v;
}

Generations read_generations(const PoolHeader* h) {
  Generations g;
  g.current = h->current;
  for (size_t i = 0; i < kHistory; ++i) g.history[i] = h->history[i];
  return g;
}

// Newest first; the oldest falls off. 0 is never pushed.
void push_history(PoolHeader* h, uint64_t old_current) {
  if (old_current == 0) return;
  for (size_t i = kHistory - 1; i > 0; --i) h->history[i] = h->history[i - 1];
  h->history[0] = old_current;
}

// Sets bits [first, last] of `bm`; only words that change are written, and
// each run of changed words is persisted before the call returns. Returns
// how many bits were newly set.
uint64_t set_bits(PMEMobjpool* pop, uint64_t* bm, uint64_t first, uint64_t last) {
  uint64_t added = 0;
  uint64_t run_start = 0;
  uint64_t run_len = 0;
  auto flush = [&] {
    if (run_len != 0) pmemobj_persist(pop, bm + run_start, run_len * 8);
    run_len = 0;
  };
  for (uint64_t w = first / 64; w <= last / 64; ++w) {
    uint64_t lo = w == first / 64 ? first % 64 : 0;
    uint64_t hi = w == last / 64 ? last % 64 : 63;
    uint64_t mask = (hi == 63 ? ~0ull : ((1ull << (hi + 1)) - 1)) & ~((1ull << lo) - 1);
    uint64_t old = bm[w];
    if ((old & mask) == mask) {
      flush();
      continue;
    }
    store_word(&bm[w], old | mask);
    added += static_cast<uint64_t>(std::popcount(mask & ~old));
    if (run_len == 0) run_start = w;
    ++run_len;
  }
  flush();
  return added;
}

// Sets bits [0, chunks), leaving the tail of the last word zero.
void fill_bitmap(PMEMobjpool* pop, uint64_t* bm, uint64_t chunks) {
  uint64_t full = chunks / 64;
  if (full != 0) pmemobj_memset_persist(pop, bm, 0xff, full * 8);
  if (chunks % 64 != 0) {
    store_word(&bm[full], (1ull << (chunks % 64)) - 1);
    pmemobj_persist(pop, &bm[full], 8);
  }
}

uint64_t count_bits(const uint64_t* bm, uint64_t chunks) {
  uint64_t n = 0;
  uint64_t full = chunks / 64;
  for (uint64_t w = 0; w < full; ++w) n += static_cast<uint64_t>(std::popcount(bm[w]));
  if (chunks % 64 != 0) {
    n += static_cast<uint64_t>(std::popcount(bm[full] & ((1ull << (chunks % 64)) - 1)));
  }
  return n;
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string bytes_text(uint64_t bytes) { return std::to_string(bytes) + " bytes"; }

Status permission_error(const std::string& path, const std::string& reason) {
  return Status(Errc::kPermissionDenied,
                "cannot open copy metadata " + path + ": " + reason +
                    "; it must be readable and writable by the user that opens the copy (uid " +
                    std::to_string(::geteuid()) + ")");
}

// Why pmemobj_open failed on a file that passed precheck_pool_file.
Status diagnose_open_failure(const std::string& path, int err, const std::string& reason) {
  if (err == EACCES || err == EPERM || err == EROFS) return permission_error(path, reason);
  if (err == EWOULDBLOCK || err == EAGAIN) {
    return Status(Errc::kBusy,
                  "copy metadata " + path +
                      " is already open: the copy may be open as primary in another process on "
                      "this node (an application using libpmirror) or served as a replica by "
                      "pmirrord; a copy can be used by one of them at a time");
  }
  // With no layout given, pmemobj_open skips the layout check, so success
  // here means a healthy pool of someone else's.
  if (PMEMobjpool* other = pmemobj_open(path.c_str(), nullptr)) {
    pmemobj_close(other);
    return Status(Errc::kInvalidArgument, "copy metadata " + path +
                                              " belongs to another program (" + reason +
                                              "; pmirror expects layout " + kLayoutName +
                                              "); give the copy's metadata a path of its own");
  }
  return Status(Errc::kIoError, "copy metadata " + path + " cannot be opened: " + reason +
                                    "; it may be corrupt: run `pmempool check -v " + path +
                                    "` (`pmempool check -r` repairs), or move it away (every "
                                    "peer then needs a full resync)");
}

Status validate_options(const CopyMetadata::Options& o) {
  if (o.path.empty()) {
    return Status(Errc::kInvalidArgument, "copy metadata path is empty; set `metadata:`");
  }
  if (o.volume_size == 0 || o.volume_size % 4096 != 0) {
    return Status(Errc::kInvalidArgument, "copy metadata " + o.path + ": volume size " +
                                              bytes_text(o.volume_size) +
                                              " is not a nonzero multiple of 4096");
  }
  if (o.chunk_size < kMinChunk || o.chunk_size > kMaxChunk || !std::has_single_bit(o.chunk_size)) {
    return Status(Errc::kInvalidArgument,
                  "copy metadata " + o.path + ": chunk size " + bytes_text(o.chunk_size) +
                      " must be a power of two from " + std::to_string(kMinChunk) + " to " +
                      std::to_string(kMaxChunk));
  }
  Geometry g = geometry(o.volume_size, o.chunk_size);
  if (g.root_size - sizeof(PoolHeader) > kMaxBitmapBytes) {
    return Status(Errc::kInvalidArgument,
                  "copy metadata " + o.path + ": a volume of " + bytes_text(o.volume_size) +
                      " in chunks of " + std::to_string(o.chunk_size) + " needs " +
                      bytes_text(g.root_size - sizeof(PoolHeader)) + " of bitmaps for " +
                      std::to_string(kMaxPeers) + " peers, more than " +
                      bytes_text(kMaxBitmapBytes) + "; use a larger chunk");
  }
  return Status::Ok();
}

struct ConstructArgs {
  const CopyMetadata::Options* options;
  Geometry geometry;
  Uuid uuid;
};

// Runs inside libpmemobj's atomic root allocation (zeroed): the root
// appears with its header complete, or not at all.
int construct_root(PMEMobjpool* pop, void* ptr, void* arg) {
  auto* a = static_cast<ConstructArgs*>(arg);
  auto* h = static_cast<PoolHeader*>(ptr);
  std::memset(h, 0, sizeof(PoolHeader));
  h->magic = kRootMagic;
  h->version = kRootVersion;
  h->max_peers = kMaxPeers;
  h->volume_size = a->options->volume_size;
  h->chunk_size = a->options->chunk_size;
  h->chunks = a->geometry.chunks;
  h->bitmap_words = a->geometry.bitmap_words;
  h->activity_extent = kActivityExtent;
  h->activity_slots = kActivityLogSlots;
  h->history_length = kHistory;
  std::memcpy(h->uuid, a->uuid.data(), a->uuid.size());
  h->current = 0;
  h->consistent = 1;
  h->promoted = 0;
  h->clean = 1;
  pmemobj_persist(pop, h, sizeof(PoolHeader));
  return 0;
}

}  // namespace

struct CopyMetadata::Root : PoolHeader {};

bool Generations::knows(uint64_t g) const {
  if (g == 0) return false;
  if (current == g) return true;
  return std::find(history.begin(), history.end(), g) != history.end();
}

std::string uuid_to_string(const Uuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[uuid[i] >> 4];
    out += kHex[uuid[i] & 0x0f];
  }
  return out;
}

std::string default_metadata_path(const std::string& data_path, const std::string& volume) {
  // A devdax character device has no directory of its own to hold a file.
  if (data_path.starts_with("/dev/dax")) {
    return std::string(kDefaultMetadataDir) + "/" + volume + ".pmirror";
  }
  return data_path + ".pmirror";
}

void CopyMetadata::PoolCloser::operator()(PMEMobjpool* pop) const { pmemobj_close(pop); }

CopyMetadata::~CopyMetadata() = default;

Result<std::unique_ptr<CopyMetadata>> CopyMetadata::open(const Options& options) {
  PMIRROR_RETURN_IF_ERROR(validate_options(options));
  const std::string& path = options.path;
  const Geometry g = geometry(options.volume_size, options.chunk_size);
  std::unique_ptr<CopyMetadata> md(new CopyMetadata());
  md->path_ = path;

  // The default home of devdax copies' metadata (the systemd unit's
  // StateDirectory, absent on a machine set up by hand).
  if (options.create_if_missing) preflight::make_default_directory(path);
  // Its directory, its type: what the checks (`pmirrorctl config check`,
  // `pmirrord --check-config`) also ask, in the same words.
  PMIRROR_RETURN_IF_ERROR(preflight::pool_path(path, "copy metadata", options.create_if_missing));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == EACCES) return permission_error(path, std::strerror(err));
    if (err != ENOENT) {
      return errno_status(err == ENOTDIR ? Errc::kNotFound : Errc::kIoError,
                          "cannot look up copy metadata " + path, err);
    }
    std::string parent = parent_dir(path);
    if (!options.create_if_missing) {
      return Status(Errc::kNotFound, "copy metadata " + path +
                                         " does not exist; open the copy with creation allowed "
                                         "to create it (a new copy's metadata: every peer needs "
                                         "a full resync)");
    }
    PMEMobjpool* pop = pmemobj_create(path.c_str(), kLayoutName, g.pool_size, 0600);
    if (pop == nullptr) {
      int cerr = errno;
      std::string reason = pmemobj_reason(cerr);
      if (cerr == EACCES || cerr == EPERM || cerr == EROFS) {
        return Status(Errc::kPermissionDenied, "cannot create copy metadata " + path + ": " +
                                                   reason + "; the directory " + parent +
                                                   " must be writable by this user");
      }
      return Status(
          cerr == ENOSPC ? Errc::kResourceExhausted : Errc::kIoError,
          "cannot create copy metadata " + path + " (" + bytes_text(g.pool_size) + "): " + reason);
    }
    md->pool_.reset(pop);
  } else {
    PMIRROR_RETURN_IF_ERROR(state::precheck_pool_file(
        path, st,
        {"copy metadata",
         "; point `metadata:` at a new path (it is created) or move this file away",
         permission_error}));
    PMEMobjpool* pop = pmemobj_open(path.c_str(), kLayoutName);
    if (pop == nullptr) {
      int err = errno;
      return diagnose_open_failure(path, err, pmemobj_reason(err));
    }
    md->pool_.reset(pop);
  }
  PMEMobjpool* pop = md->pool_.get();

  size_t existing = pmemobj_root_size(pop);
  if (existing == 0) {
    // A new pool (or one whose creation was interrupted before its root
    // object existed): nothing recorded yet.
    ConstructArgs args{&options, g, random_uuid()};
    PMEMoid oid = pmemobj_root_construct(pop, g.root_size, construct_root, &args);
    if (OID_IS_NULL(oid)) {
      int err = errno;
      return Status(err == ENOMEM ? Errc::kResourceExhausted : Errc::kIoError,
                    "copy metadata " + path + ": cannot allocate its root object (" +
                        bytes_text(g.root_size) + "): " + pmemobj_reason(err) +
                        "; move the file away so that it is created again with the right size");
    }
    md->root_ = static_cast<Root*>(pmemobj_direct(oid));
  } else {
    if (existing < sizeof(PoolHeader)) {
      return Status(Errc::kUnsupported, "copy metadata " + path + " has a root object of " +
                                            bytes_text(existing) +
                                            "; it was written by an incompatible pmirror version");
    }
    md->root_ = static_cast<Root*>(pmemobj_direct(pmemobj_root(pop, existing)));
  }

  Root* r = md->root_;
  {
    size_t mapped = 0;
    int is_pmem = 0;
    if (void* probe = pmem_map_file(path.c_str(), 0, 0, 0, &mapped, &is_pmem)) {
      pmem_unmap(probe, mapped);
      md->on_pmem_ = is_pmem != 0;
    }
  }
  if (r->magic != kRootMagic) {
    return Status(Errc::kIoError, "copy metadata " + path +
                                      " has a damaged header (bad magic); run `pmempool check -v " +
                                      path +
                                      "` or move it away (every peer then needs a full "
                                      "resync)");
  }
  if (r->version != kRootVersion || r->max_peers != kMaxPeers ||
      r->activity_slots != kActivityLogSlots || r->activity_extent != kActivityExtent ||
      r->history_length != kHistory) {
    return Status(Errc::kUnsupported,
                  "copy metadata " + path + " has format version " + std::to_string(r->version) +
                      " (" + std::to_string(r->max_peers) + " peers, " +
                      std::to_string(r->activity_slots) +
                      " activity-log slots); this pmirror "
                      "reads version " +
                      std::to_string(kRootVersion) + " with " + std::to_string(kMaxPeers) +
                      " peers and " + std::to_string(kActivityLogSlots) + " slots");
  }
  if (r->volume_size != options.volume_size || r->chunk_size != options.chunk_size) {
    return Status(Errc::kInvalidArgument,
                  "copy metadata " + path + " was created for a volume of " +
                      bytes_text(r->volume_size) + " in chunks of " +
                      std::to_string(r->chunk_size) + " bytes, but this volume is " +
                      bytes_text(options.volume_size) + " in chunks of " +
                      std::to_string(options.chunk_size) +
                      " bytes: its dirty bitmaps would not mean the same chunks; configure the "
                      "pool's values, or move the pool away (every peer then needs a full "
                      "resync)");
  }
  Geometry stored = geometry(r->volume_size, r->chunk_size);
  if (r->chunks != stored.chunks || r->bitmap_words != stored.bitmap_words ||
      pmemobj_root_size(pop) < stored.root_size) {
    return Status(Errc::kIoError, "copy metadata " + path +
                                      " has a damaged header (bitmap geometry does not match "
                                      "the volume size); run `pmempool check -v " +
                                      path + "` or move it away");
  }

  // Peers: a prefix of the table, each named, names unique.
  bool ended = false;
  for (size_t i = 0; i < kMaxPeers; ++i) {
    const PeerRecord& p = r->peers[i];
    if (p.in_use == 0) {
      ended = true;
      continue;
    }
    std::string name = read_name(p.name, sizeof(p.name));
    bool dup = false;
    for (size_t j = 0; j < i; ++j) {
      if (read_name(r->peers[j].name, sizeof(r->peers[j].name)) == name) dup = true;
    }
    if (ended || p.in_use != 1 || name.empty() || name.size() > kMaxPeerName || dup) {
      return Status(Errc::kIoError, "copy metadata " + path + ": peer slot " + std::to_string(i) +
                                        " is damaged (bad flag, name, position or a "
                                        "duplicate); run `pmempool check -v " +
                                        path + "`");
    }
  }

  // A mark_all() cut short by a crash: its transaction committed (the peer
  // needs everything), the fill may not have completed. Finish it.
  for (size_t i = 0; i < kMaxPeers; ++i) {
    PeerRecord& p = r->peers[i];
    if (p.in_use == 1 && p.filling != 0) {
      log::warn("copy metadata {}: completing the interrupted marking of every chunk for peer {}",
                path, read_name(p.name, sizeof(p.name)));
      fill_bitmap(pop, bitmap_of(r, i), r->chunks);
      store_word(&p.filling, 0);
      pmemobj_persist(pop, &p.filling, 8);
    }
    md->dirty_[i] = p.in_use == 1 ? count_bits(bitmap_of(r, i), r->chunks) : 0;
  }
  return md;
}

CopyInfo CopyMetadata::info() const {
  std::lock_guard lock(mutex_);
  CopyInfo info;
  std::memcpy(info.uuid.data(), root_->uuid, info.uuid.size());
  info.generations = read_generations(root_);
  info.consistent = root_->consistent != 0;
  info.promoted = root_->promoted != 0;
  info.clean = root_->clean != 0;
  info.fence.generation = root_->fence_generation;
  info.fence.node = read_name(root_->fence_node, sizeof(root_->fence_node));
  info.fence.since_unix_ns = root_->fenced_unix_ns;
  info.volume_size = root_->volume_size;
  info.chunk_size = root_->chunk_size;
  info.chunks = root_->chunks;
  return info;
}

// --- generations and role ---

uint64_t CopyMetadata::fresh_generation() const {
  std::lock_guard lock(mutex_);
  Generations known = read_generations(root_);
  uint64_t next = 0;
  while (next == 0 || known.knows(next)) next = random_u64();
  return next;
}

Result<uint64_t> CopyMetadata::new_generation(uint64_t chosen) {
  std::lock_guard lock(mutex_);
  Root* r = root_;
  Generations before = read_generations(r);
  if (chosen != 0 && before.knows(chosen)) {
    return Status(Errc::kInvalidArgument, "copy metadata " + path_ + ": generation " +
                                              std::to_string(chosen) + " is not new to this copy");
  }
  uint64_t next = chosen;
  while (next == 0 || before.knows(next)) next = random_u64();
  uint64_t old = r->current;
  PMIRROR_RETURN_IF_ERROR(run_tx(pool_.get(), "copy metadata " + path_ + ": new generation", [&] {
    if (int err = snapshot(&r->current, sizeof(r->current) + sizeof(r->history))) return err;
    if (old != 0) {
      for (size_t i = 0; i < kMaxPeers; ++i) {
        PeerRecord& p = r->peers[i];
        if (p.in_use != 1 || p.bitmap_generation != 0) continue;
        if (int err = snapshot(&p.bitmap_generation, sizeof(p.bitmap_generation))) return err;
        p.bitmap_generation = old;
      }
    }
    push_history(r, old);
    r->current = next;
    return 0;
  }));
  return next;
}

Status CopyMetadata::adopt_generation(uint64_t current, bool consistent) {
  std::lock_guard lock(mutex_);
  Root* r = root_;
  uint64_t want_consistent = consistent ? 1 : 0;
  if (r->current == current && r->consistent == want_consistent) return Status::Ok();
  return run_tx(pool_.get(), "copy metadata " + path_ + ": adopting generation", [&] {
    if (int err =
            snapshot(&r->current, offsetof(PoolHeader, promoted) - offsetof(PoolHeader, current))) {
      return err;
    }
    if (r->current != current) {
      push_history(r, r->current);
      r->current = current;
      // Only a writer that passed the fence gets here: the fence follows
      // its lineage, so that its later generations still pass it.
      if (r->fence_generation != 0) {
        if (int err = snapshot(&r->fence_generation, sizeof(r->fence_generation))) return err;
        r->fence_generation = current;
      }
    }
    r->consistent = want_consistent;
    return 0;
  });
}

Status CopyMetadata::set_fence(uint64_t generation, const std::string& node) {
  if (generation == 0) return Status(Errc::kInvalidArgument, "a fence needs a nonzero generation");
  if (node.empty() || node.size() > kMaxPeerName || node.find('\0') != std::string::npos) {
    return Status(Errc::kInvalidArgument, "fence: bad node name \"" + node.substr(0, 80) + "\"");
  }
  std::lock_guard lock(mutex_);
  Root* r = root_;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return run_tx(pool_.get(), "copy metadata " + path_ + ": recording the fence", [&] {
    if (int err = snapshot(&r->fence_generation, offsetof(PoolHeader, commit_sequence) -
                                                     offsetof(PoolHeader, fence_generation))) {
      return err;
    }
    r->fence_generation = generation;
    r->fenced_unix_ns = static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull +
                        static_cast<uint64_t>(now.tv_nsec);
    std::memset(r->fence_node, 0, sizeof(r->fence_node));
    std::memcpy(r->fence_node, node.data(), node.size());
    return 0;
  });
}

Status CopyMetadata::clear_fence() {
  std::lock_guard lock(mutex_);
  Root* r = root_;
  if (r->fence_generation == 0) return Status::Ok();
  return run_tx(pool_.get(), "copy metadata " + path_ + ": clearing the fence", [&] {
    if (int err = snapshot(&r->fence_generation, offsetof(PoolHeader, commit_sequence) -
                                                     offsetof(PoolHeader, fence_generation))) {
      return err;
    }
    r->fence_generation = 0;
    r->fenced_unix_ns = 0;
    std::memset(r->fence_node, 0, sizeof(r->fence_node));
    return 0;
  });
}

namespace {
Status set_flag(PMEMobjpool* pop, uint64_t* field, bool value, const std::string& what) {
  uint64_t want = value ? 1 : 0;
  if (*field == want) return Status::Ok();
  return run_tx(pop, what, [&] {
    if (int err = snapshot(field, sizeof(*field))) return err;
    *field = want;
    return 0;
  });
}
}  // namespace

Status CopyMetadata::set_consistent(bool consistent) {
  std::lock_guard lock(mutex_);
  return set_flag(pool_.get(), &root_->consistent, consistent,
                  "copy metadata " + path_ + ": setting consistent");
}

Status CopyMetadata::set_promoted(bool promoted) {
  std::lock_guard lock(mutex_);
  return set_flag(pool_.get(), &root_->promoted, promoted,
                  "copy metadata " + path_ + ": setting promoted");
}

Status CopyMetadata::set_clean(bool clean) {
  std::lock_guard lock(mutex_);
  return set_flag(pool_.get(), &root_->clean, clean, "copy metadata " + path_ + ": setting clean");
}

// --- peers ---

namespace {
Status bad_peer(const std::string& path, size_t peer) {
  return Status(Errc::kInvalidArgument, "copy metadata " + path + ": peer index " +
                                            std::to_string(peer) +
                                            " is not a peer (get an index from peer(name))");
}
bool valid_peer(const PoolHeader* h, size_t peer) {
  return peer < kMaxPeers && h->peers[peer].in_use == 1;
}
}  // namespace

Result<size_t> CopyMetadata::peer(const std::string& name) {
  if (name.empty() || name.size() > kMaxPeerName || name.find('\0') != std::string::npos) {
    return Status(Errc::kInvalidArgument, "peer name \"" + name.substr(0, 80) + "\" must be 1 to " +
                                              std::to_string(kMaxPeerName) + " bytes without NUL");
  }
  std::lock_guard lock(mutex_);
  Root* r = root_;
  size_t free_slot = kMaxPeers;
  std::string names;
  for (size_t i = 0; i < kMaxPeers; ++i) {
    PeerRecord& p = r->peers[i];
    if (p.in_use != 1) {
      if (free_slot == kMaxPeers) free_slot = i;
      continue;
    }
    std::string existing = read_name(p.name, sizeof(p.name));
    if (existing == name) return i;
    names += (names.empty() ? "" : ", ") + existing;
  }
  if (free_slot == kMaxPeers) {
    return Status(Errc::kResourceExhausted, "copy metadata " + path_ + " already has " +
                                                std::to_string(kMaxPeers) + " peers (" + names +
                                                "); cannot add " + name);
  }
  // The slot is free, so nothing reads its bitmap: clear it (a forgotten
  // peer's bits may remain) before the transaction makes the peer exist.
  pmemobj_memset_persist(pool_.get(), bitmap_of(r, free_slot), 0, r->bitmap_words * 8);
  PeerRecord* p = &r->peers[free_slot];
  PMIRROR_RETURN_IF_ERROR(
      run_tx(pool_.get(), "copy metadata " + path_ + ": adding peer " + name, [&] {
        if (int err = snapshot(p, sizeof(PeerRecord))) return err;
        std::memset(p, 0, sizeof(PeerRecord));
        std::memcpy(p->name, name.data(), name.size());
        p->in_use = 1;
        return 0;
      }));
  dirty_[free_slot] = 0;
  return free_slot;
}

std::vector<PeerInfo> CopyMetadata::peers() const {
  std::lock_guard lock(mutex_);
  std::vector<PeerInfo> out;
  for (size_t i = 0; i < kMaxPeers; ++i) {
    const PeerRecord& p = root_->peers[i];
    if (p.in_use != 1) continue;
    PeerInfo info;
    info.name = read_name(p.name, sizeof(p.name));
    info.bitmap_generation = p.bitmap_generation;
    std::memcpy(info.peer_uuid.data(), p.uuid, info.peer_uuid.size());
    info.full_sync = p.full_sync != 0;
    info.dirty_chunks = dirty_[i];
    out.push_back(std::move(info));
  }
  return out;
}

Status CopyMetadata::set_peer_uuid(size_t peer, const Uuid& uuid) {
  std::lock_guard lock(mutex_);
  if (!valid_peer(root_, peer)) return bad_peer(path_, peer);
  PeerRecord* p = &root_->peers[peer];
  if (std::memcmp(p->uuid, uuid.data(), uuid.size()) == 0) return Status::Ok();
  return run_tx(pool_.get(),
                "copy metadata " + path_ + ": recording the uuid of peer " +
                    read_name(p->name, sizeof(p->name)),
                [&] {
                  if (int err = snapshot(p->uuid, sizeof(p->uuid))) return err;
                  std::memcpy(p->uuid, uuid.data(), uuid.size());
                  return 0;
                });
}

Status CopyMetadata::track_peer(size_t peer, uint64_t generation) {
  std::lock_guard lock(mutex_);
  if (!valid_peer(root_, peer)) return bad_peer(path_, peer);
  PeerRecord* p = &root_->peers[peer];
  std::string name = read_name(p->name, sizeof(p->name));
  if (generation == 0) {
    return Status(Errc::kInvalidArgument,
                  "copy metadata " + path_ + ": cannot track peer " + name + " from generation 0");
  }
  if (p->bitmap_generation != 0) return Status::Ok();
  return run_tx(pool_.get(), "copy metadata " + path_ + ": tracking peer " + name, [&] {
    if (int err = snapshot(&p->bitmap_generation, sizeof(p->bitmap_generation))) return err;
    p->bitmap_generation = generation;
    return 0;
  });
}

Status CopyMetadata::untrack_peer(size_t peer) {
  std::lock_guard lock(mutex_);
  if (!valid_peer(root_, peer)) return bad_peer(path_, peer);
  PeerRecord* p = &root_->peers[peer];
  std::string name = read_name(p->name, sizeof(p->name));
  if (dirty_[peer] != 0) {
    return Status(Errc::kFailedPrecondition,
                  "copy metadata " + path_ + ": peer " + name + " still has " +
                      std::to_string(dirty_[peer]) +
                      " dirty chunks; resync (and clear) them before it counts as in sync");
  }
  if (p->bitmap_generation == 0 && p->full_sync == 0) return Status::Ok();
  return run_tx(pool_.get(), "copy metadata " + path_ + ": untracking peer " + name, [&] {
    if (int err = snapshot(&p->bitmap_generation, 2 * sizeof(uint64_t))) return err;
    p->bitmap_generation = 0;
    p->full_sync = 0;
    return 0;
  });
}

Status CopyMetadata::mark_all(size_t peer) {
  std::lock_guard lock(mutex_);
  if (!valid_peer(root_, peer)) return bad_peer(path_, peer);
  PeerRecord* p = &root_->peers[peer];
  // Crash order: the transaction records "full sync, fill in progress";
  // a crash before the fill completes is finished by the next open().
  PMIRROR_RETURN_IF_ERROR(run_tx(pool_.get(),
                                 "copy metadata " + path_ + ": marking every chunk for peer " +
                                     read_name(p->name, sizeof(p->name)),
                                 [&] {
                                   if (int err = snapshot(&p->full_sync, 2 * sizeof(uint64_t))) {
                                     return err;
                                   }
                                   p->full_sync = 1;
                                   p->filling = 1;
                                   return 0;
                                 }));
  fill_bitmap(pool_.get(), bitmap_of(root_, peer), root_->chunks);
  dirty_[peer] = root_->chunks;
  store_word(&p->filling, 0);
  pmemobj_persist(pool_.get(), &p->filling, 8);
  return Status::Ok();
}

Status CopyMetadata::forget_peers() {
  std::lock_guard lock(mutex_);
  Root* r = root_;
  // The bitmaps stay as they are: a slot's bitmap is cleared when a peer
  // takes the slot again.
  PMIRROR_RETURN_IF_ERROR(
      run_tx(pool_.get(), "copy metadata " + path_ + ": forgetting every peer", [&] {
        if (int err = snapshot(r->peers, sizeof(r->peers))) return err;
        std::memset(r->peers, 0, sizeof(r->peers));
        return 0;
      }));
  dirty_.fill(0);
  return Status::Ok();
}

// --- dirty bits ---

Result<uint64_t> CopyMetadata::mark(size_t peer, uint64_t offset, uint64_t length) {
  std::lock_guard lock(mutex_);
  if (!valid_peer(root_, peer)) return bad_peer(path_, peer);
  if (length == 0) return uint64_t{0};
  uint64_t size = root_->volume_size;
  if (offset > size || length > size - offset) {
    return Status(Errc::kInvalidArgument, "copy metadata " + path_ + ": range [" +
                                              std::to_string(offset) + ", +" +
                                              std::to_string(length) + ") is outside the volume (" +
                                              bytes_text(size) + ")");
  }
  uint64_t chunk = root_->chunk_size;
  uint64_t added =
      set_bits(pool_.get(), bitmap_of(root_, peer), offset / chunk, (offset + length - 1) / chunk);
  dirty_[peer] += added;
  return added;
}

Status CopyMetadata::clear(size_t peer, uint64_t chunk) {
  std::lock_guard lock(mutex_);
  if (!valid_peer(root_, peer)) return bad_peer(path_, peer);
  if (chunk >= root_->chunks) {
    return Status(Errc::kInvalidArgument, "copy metadata " + path_ + ": chunk " +
                                              std::to_string(chunk) + " is outside the volume (" +
                                              std::to_string(root_->chunks) + " chunks)");
  }
  uint64_t* word = bitmap_of(root_, peer) + chunk / 64;
  uint64_t bit = 1ull << (chunk % 64);
  if ((*word & bit) == 0) return Status::Ok();
  store_word(word, *word & ~bit);
  pmemobj_persist(pool_.get(), word, 8);
  --dirty_[peer];
  return Status::Ok();
}

bool CopyMetadata::is_dirty(size_t peer, uint64_t chunk) const {
  std::lock_guard lock(mutex_);
  if (!valid_peer(root_, peer) || chunk >= root_->chunks) return false;
  return (bitmap_of(root_, peer)[chunk / 64] >> (chunk % 64)) & 1;
}

uint64_t CopyMetadata::next_dirty(size_t peer, uint64_t from) const {
  std::lock_guard lock(mutex_);
  uint64_t chunks = root_->chunks;
  if (!valid_peer(root_, peer) || from >= chunks || dirty_[peer] == 0) return chunks;
  const uint64_t* bm = bitmap_of(root_, peer);
  uint64_t words = (chunks + 63) / 64;
  uint64_t w = from / 64;
  uint64_t bits = bm[w] & (~0ull << (from % 64));
  while (bits == 0) {
    if (++w >= words) return chunks;
    bits = bm[w];
  }
  return std::min<uint64_t>(w * 64 + static_cast<uint64_t>(std::countr_zero(bits)), chunks);
}

uint64_t CopyMetadata::dirty_count(size_t peer) const {
  std::lock_guard lock(mutex_);
  return valid_peer(root_, peer) ? dirty_[peer] : 0;
}

// --- activity log ---

Result<uint32_t> CopyMetadata::activity_begin(
    uint64_t offset, uint64_t length, const std::function<bool(uint64_t extent)>& evictable) {
  std::lock_guard lock(mutex_);
  if (length == 0) return uint32_t{0};
  uint64_t size = root_->volume_size;
  if (offset > size || length > size - offset) {
    return Status(Errc::kInvalidArgument, "copy metadata " + path_ + ": activity range [" +
                                              std::to_string(offset) + ", +" +
                                              std::to_string(length) + ") is outside the volume (" +
                                              bytes_text(size) + ")");
  }
  uint64_t first = offset / kActivityExtent;
  uint64_t last = (offset + length - 1) / kActivityExtent;
  if (last - first + 1 > kActivityLogSlots) {
    return Status(Errc::kResourceExhausted,
                  "copy metadata " + path_ + ": range [" + std::to_string(offset) + ", +" +
                      std::to_string(length) + ") spans " + std::to_string(last - first + 1) +
                      " activity extents of " + std::to_string(kActivityExtent) +
                      " bytes; the log has " + std::to_string(kActivityLogSlots) +
                      " slots: persist it in smaller pieces");
  }
  uint64_t* slots = root_->activity;
  std::vector<uint64_t> missing;
  for (uint64_t e = first; e <= last; ++e) {
    bool logged = false;
    for (size_t s = 0; s < kActivityLogSlots && !logged; ++s) logged = slots[s] == e + 1;
    if (!logged) missing.push_back(e);
  }
  if (missing.empty()) return uint32_t{0};

  // Choose every slot first, so that nothing is written when the log
  // cannot take the whole range. Free slots, then evictable ones.
  std::vector<size_t> chosen;
  for (size_t s = 0; s < kActivityLogSlots && chosen.size() < missing.size(); ++s) {
    if (slots[s] == 0) chosen.push_back(s);
  }
  for (size_t s = 0; s < kActivityLogSlots && chosen.size() < missing.size(); ++s) {
    if (slots[s] == 0) continue;
    uint64_t extent = slots[s] - 1;
    if (extent >= first && extent <= last) continue;  // needed by this range
    bool may_evict = false;
    try {
      may_evict = evictable && evictable(extent);
    } catch (...) {
      return Status(Errc::kInternal,
                    "copy metadata " + path_ + ": the activity log's evictable() callback threw");
    }
    if (may_evict) chosen.push_back(s);
  }
  if (chosen.size() < missing.size()) {
    return Status(Errc::kResourceExhausted,
                  "copy metadata " + path_ + ": the activity log's " +
                      std::to_string(kActivityLogSlots) + " slots are all in use by extents " +
                      "with persists in flight; " + std::to_string(missing.size()) +
                      " more are needed for [" + std::to_string(offset) + ", +" +
                      std::to_string(length) + "): wait for persists to complete");
  }
  for (size_t i = 0; i < missing.size(); ++i) {
    uint64_t* slot = &slots[chosen[i]];
    store_word(slot, missing[i] + 1);
    pmemobj_persist(pool_.get(), slot, 8);
  }
  return static_cast<uint32_t>(missing.size());
}

std::vector<uint64_t> CopyMetadata::activity_extents() const {
  std::lock_guard lock(mutex_);
  std::vector<uint64_t> out;
  for (uint64_t v : root_->activity) {
    if (v != 0) out.push_back(v - 1);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Result<std::vector<uint64_t>> CopyMetadata::recover_activity_log() {
  std::lock_guard lock(mutex_);
  Root* r = root_;
  std::vector<uint64_t> extents;
  for (uint64_t v : r->activity) {
    if (v != 0) extents.push_back(v - 1);
  }
  std::sort(extents.begin(), extents.end());
  extents.erase(std::unique(extents.begin(), extents.end()), extents.end());
  // Mark first, then empty the log: a crash in between repeats the marking.
  uint64_t size = r->volume_size;
  for (uint64_t extent : extents) {
    if (extent >= ceil_div(size, kActivityExtent)) continue;  // beyond the volume
    uint64_t begin = extent * kActivityExtent;
    uint64_t end = std::min(begin + kActivityExtent, size);
    for (size_t i = 0; i < kMaxPeers; ++i) {
      if (!valid_peer(r, i)) continue;
      dirty_[i] +=
          set_bits(pool_.get(), bitmap_of(r, i), begin / r->chunk_size, (end - 1) / r->chunk_size);
    }
  }
  pmemobj_memset_persist(pool_.get(), r->activity, 0, sizeof(r->activity));
  return extents;
}

Status CopyMetadata::mark_extent(size_t peer, uint64_t extent) {
  std::lock_guard lock(mutex_);
  if (!valid_peer(root_, peer)) return bad_peer(path_, peer);
  uint64_t size = root_->volume_size;
  if (extent >= ceil_div(size, kActivityExtent)) {
    return Status(Errc::kInvalidArgument, "copy metadata " + path_ + ": activity extent " +
                                              std::to_string(extent) + " is outside the volume (" +
                                              bytes_text(size) + ")");
  }
  uint64_t begin = extent * kActivityExtent;
  uint64_t end = std::min(begin + kActivityExtent, size);
  dirty_[peer] += set_bits(pool_.get(), bitmap_of(root_, peer), begin / root_->chunk_size,
                           (end - 1) / root_->chunk_size);
  return Status::Ok();
}

Status CopyMetadata::clear_activity_log() {
  std::lock_guard lock(mutex_);
  pmemobj_memset_persist(pool_.get(), root_->activity, 0, sizeof(root_->activity));
  return Status::Ok();
}

// --- one-sided commit's word ---

void* CopyMetadata::commit_word_address() const { return &root_->commit_sequence; }

bool CopyMetadata::commit_word_is_pmem() const {
  // PMEM_IS_PMEM_FORCE=1 as libpmem reads it (the tests' pmem), at each
  // call as region.cpp does.
  const char* forced = std::getenv("PMEM_IS_PMEM_FORCE");
  return on_pmem_ || (forced != nullptr && std::string_view(forced) == "1");
}

Status CopyMetadata::arm_commit_word(uint64_t generation, uint64_t sequence) {
  std::lock_guard lock(mutex_);
  PMEMobjpool* pop = pool_.get();
  std::atomic_ref<uint64_t>(root_->commit_generation).store(0);
  pmemobj_persist(pop, &root_->commit_generation, 8);
  std::atomic_ref<uint64_t>(root_->commit_sequence).store(sequence);
  pmemobj_persist(pop, &root_->commit_sequence, 8);
  std::atomic_ref<uint64_t>(root_->commit_generation).store(generation);
  pmemobj_persist(pop, &root_->commit_generation, 8);
  return Status::Ok();
}

CommitWord CopyMetadata::commit_word() const {
  std::lock_guard lock(mutex_);
  return {std::atomic_ref<uint64_t>(root_->commit_generation).load(),
          std::atomic_ref<uint64_t>(root_->commit_sequence).load()};
}

}  // namespace pmirror::metadata
