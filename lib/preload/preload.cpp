// libpmirror-preload: what pmirror-run preloads into an unmodified PMDK
// program (docs/pmdk.md). It defines libpmem's persistence functions with
// libpmem's symbol version, so that libpmemobj, libpmemlog and libpmemblk
// bind to them; each forwards to the real libpmem first, then mirrors the
// ranges that fall inside the volume's local copy through libpmirror:
// flushes are recorded per thread and mirrored as one group at the next
// drain; persist and msync mirror at once. It also wraps mmap and munmap,
// to learn where the program mapped the local copy (whatever address it
// chose). Ranges elsewhere pass through untouched.
//
// Loaded without pmirror-run's variables, it only forwards.
#include <dlfcn.h>
#include <libpmem.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <pmirror/pmirror.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#define PMIRROR_PRELOAD_API extern "C" __attribute__((visibility("default")))

namespace {

// ---- the real libpmem ---------------------------------------------------------

struct RealLibpmem {
  void (*persist)(const void*, size_t) = nullptr;
  void (*flush)(const void*, size_t) = nullptr;
  void (*drain)() = nullptr;
  int (*msync)(const void*, size_t) = nullptr;
  void (*deep_flush)(const void*, size_t) = nullptr;
  int (*deep_drain)(const void*, size_t) = nullptr;
  int (*deep_persist)(const void*, size_t) = nullptr;
  void* (*memcpy)(void*, const void*, size_t, unsigned) = nullptr;
  void* (*memmove)(void*, const void*, size_t, unsigned) = nullptr;
  void* (*memset)(void*, int, size_t, unsigned) = nullptr;
  void* (*memcpy_persist)(void*, const void*, size_t) = nullptr;
  void* (*memmove_persist)(void*, const void*, size_t) = nullptr;
  void* (*memset_persist)(void*, int, size_t) = nullptr;
  void* (*memcpy_nodrain)(void*, const void*, size_t) = nullptr;
  void* (*memmove_nodrain)(void*, const void*, size_t) = nullptr;
  void* (*memset_nodrain)(void*, int, size_t) = nullptr;
};

template <typename F>
void resolve(F& slot, const char* name) {
  // The next definition after ours: libpmem's (a dependency of libpmirror
  // when the program does not link it itself).
  void* found = dlvsym(RTLD_NEXT, name, "LIBPMEM_1.0");
  if (found == nullptr) found = dlsym(RTLD_NEXT, name);
  if (found == nullptr) {
    std::fprintf(stderr, "pmirror-run: libpmem's %s not found: %s\n", name, dlerror());
    std::abort();
  }
  slot = reinterpret_cast<F>(found);
}

const RealLibpmem& real() {
  static const RealLibpmem functions = [] {
    RealLibpmem r;
    resolve(r.persist, "pmem_persist");
    resolve(r.flush, "pmem_flush");
    resolve(r.drain, "pmem_drain");
    resolve(r.msync, "pmem_msync");
    resolve(r.deep_flush, "pmem_deep_flush");
    resolve(r.deep_drain, "pmem_deep_drain");
    resolve(r.deep_persist, "pmem_deep_persist");
    resolve(r.memcpy, "pmem_memcpy");
    resolve(r.memmove, "pmem_memmove");
    resolve(r.memset, "pmem_memset");
    resolve(r.memcpy_persist, "pmem_memcpy_persist");
    resolve(r.memmove_persist, "pmem_memmove_persist");
    resolve(r.memset_persist, "pmem_memset_persist");
    resolve(r.memcpy_nodrain, "pmem_memcpy_nodrain");
    resolve(r.memmove_nodrain, "pmem_memmove_nodrain");
    resolve(r.memset_nodrain, "pmem_memset_nodrain");
    return r;
  }();
  return functions;
}

// ---- where the program mapped the local copy ----------------------------------

// A few mappings at most (a pool is mapped once; a poolset part per
// mapping): an array read without a lock. Writers (mmap, munmap) hold
// g_mappings_mutex; a reader sees `begin` last (release/acquire).
constexpr int kMaxMappings = 16;
struct Mapping {
  std::atomic<uintptr_t> begin{0};  // 0: free slot
  std::atomic<uintptr_t> end{0};
  std::atomic<uint64_t> offset{0};  // the file offset at `begin`
};
Mapping g_mappings[kMaxMappings];
std::atomic<int> g_mapping_slots{0};  // slots in use are below this
std::mutex g_mappings_mutex;

// The local copy, as fstat names it.
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  dev_t rdev = 0;  // devdax: the character device
  bool is_device = false;
};
FileIdentity g_copy;
std::atomic<bool> g_watching{false};  // the volume is open: mappings are noted
uint64_t g_volume_size = 0;
// The volume's name for the messages that stop the program. A character
// array, not a std::string: constant-initialised and never destroyed, so
// that it holds the name whatever the order of this library's constructor,
// the globals' initialisation and the destructors at exit (a std::string
// here read '' in the abort message).
char g_volume_name[256] = "";
bool g_forked_child = false;  // a fork's child: its parent's volume is not its own
// --durability observed (the default): a drain is ordered, not waited
// for; the program waits before its state can be seen outside it
// (docs/pmdk.md, section 3). false: --durability drain, every drain waits.
bool g_observed = false;
const std::byte* g_local_base = nullptr;  // libpmirror's own mapping of the local copy
bool g_verbose = false;       // --log-level info or debug: say what the close settled
// The program may have written the local copy since the last settle (it
// mapped it): settle_unpersisted has work at exit.
std::atomic<bool> g_unsettled{false};
// It mirrored something since the last settle: the unmap of its last
// mapping is the close of a pool it wrote (not the header that libpmem
// maps and unmaps alone while it opens the pool).
std::atomic<bool> g_mirrored{false};

// A call made by pmirror itself (libpmirror opening, mapping or persisting
// its own files): passed through. Initial-exec TLS: this library is loaded
// at start (LD_PRELOAD), so a plain load, no __tls_get_addr.
__attribute__((tls_model("initial-exec"))) thread_local bool t_inside = false;

bool same_file(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  if (g_copy.is_device) return S_ISCHR(st.st_mode) && st.st_rdev == g_copy.rdev;
  return S_ISREG(st.st_mode) && st.st_dev == g_copy.dev && st.st_ino == g_copy.ino;
}

void note_mapping(void* addr, size_t length, int fd, off_t offset) {
  if (!g_watching.load(std::memory_order_acquire) || t_inside || g_forked_child) return;
  if (!same_file(fd)) return;
  g_unsettled.store(true, std::memory_order_relaxed);
  std::lock_guard lock(g_mappings_mutex);
  for (int i = 0; i < kMaxMappings; ++i) {
    Mapping& m = g_mappings[i];
    if (m.begin.load(std::memory_order_relaxed) != 0) continue;
    m.end.store(reinterpret_cast<uintptr_t>(addr) + length, std::memory_order_relaxed);
    m.offset.store(static_cast<uint64_t>(offset), std::memory_order_relaxed);
    m.begin.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_release);
    if (i + 1 > g_mapping_slots.load(std::memory_order_relaxed)) {
      g_mapping_slots.store(i + 1, std::memory_order_release);
    }
    return;
  }
  std::fprintf(stderr,
               "pmirror-run: volume '%s': more than %d mappings of its local copy; stopping "
               "rather than leave one unmirrored\n",
               g_volume_name, kMaxMappings);
  std::abort();
}

// munmap of [addr, addr + length): forget what it covers, keep the rest of
// a mapping it cuts at one end (PMDK unmaps whole pools; a hole in the
// middle keeps the lower part and a new slot for the upper one). True when
// it took the last mapping of the local copy away (the program closed its
// pool).
bool forget_mapping(void* addr, size_t length) {
  if (g_mapping_slots.load(std::memory_order_acquire) == 0) return false;
  const uintptr_t cut_begin = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t cut_end = cut_begin + length;
  std::lock_guard lock(g_mappings_mutex);
  bool cut = false;
  for (int i = 0; i < kMaxMappings; ++i) {
    Mapping& m = g_mappings[i];
    const uintptr_t begin = m.begin.load(std::memory_order_relaxed);
    const uintptr_t end = m.end.load(std::memory_order_relaxed);
    if (begin == 0 || cut_end <= begin || cut_begin >= end) continue;
    cut = true;
    const uint64_t offset = m.offset.load(std::memory_order_relaxed);
    m.begin.store(0, std::memory_order_release);
    if (cut_begin > begin) {  // the lower part stays
      m.end.store(cut_begin, std::memory_order_relaxed);
      m.begin.store(begin, std::memory_order_release);
    }
    if (cut_end < end) {  // the upper part stays
      for (int j = 0; j < kMaxMappings; ++j) {
        Mapping& upper = g_mappings[j];
        if (upper.begin.load(std::memory_order_relaxed) != 0) continue;
        upper.end.store(end, std::memory_order_relaxed);
        upper.offset.store(offset + (cut_end - begin), std::memory_order_relaxed);
        upper.begin.store(cut_end, std::memory_order_release);
        if (j + 1 > g_mapping_slots.load(std::memory_order_relaxed)) {
          g_mapping_slots.store(j + 1, std::memory_order_release);
        }
        break;
      }
    }
  }
  if (!cut) return false;
  for (const Mapping& m : g_mappings) {
    if (m.begin.load(std::memory_order_relaxed) != 0) return false;
  }
  return true;
}

// ---- the ranges of this thread ----------------------------------------------------

// Flushed since this thread's last drain, as volume offsets; adjacent
// ranges merged. Full, it is mirrored at once (which only makes data
// durable earlier than the drain promised).
constexpr int kMaxPending = 64;
struct PendingGroup {
  uint64_t offset[kMaxPending];
  uint64_t length[kMaxPending];
  int count;
};
__attribute__((tls_model("initial-exec"))) thread_local PendingGroup t_pending{};

[[noreturn]] void stop_program(const pmirror::Status& why) {
  t_inside = true;  // its message is no observation point to wait at
  std::fprintf(stderr,
               "pmirror-run: volume '%s': a persist could not be mirrored: %s. Stopping the "
               "program: libpmem's drain has no error return, and going on would let it take "
               "data that is not on the replicas as durable (pmirror-run(1))\n",
               g_volume_name, why.to_string().c_str());
  std::abort();
}

// ---- the mirroring thread ----------------------------------------------------------
//
// Decided: libpmirror runs on a thread of its own, never on the program's.
// A drain is called inside the program's libpmemobj transaction, and
// libpmirror's bookkeeping (its metadata pool: dirty maps, generations)
// is libpmemobj too, whose transactions are per thread: run on the
// program's thread, a replica lost mid-transaction made libpmirror's own
// transaction a "nested transaction for a different pool", which aborted
// the program's (found by tests/pmdk/pmirror_run_test.sh). The thread
// takes every group waiting when it wakes (several threads' drains become
// one wait: a group commit), and also closes the volume at exit.

struct MirrorRequest {
  const PendingGroup* group = nullptr;
  pmirror::Status result;
  std::atomic<bool> done{false};  // set after result, with release
};

// The hand-off spins before it sleeps: a libpmemobj transaction drains
// about five times, a few microseconds apart, and a futex wake-up of each
// side at each drain cost as much as the mirror's round trip itself
// (docs/benchmarks.md, "Unmodified PMDK programs"). Bounded, and yielding,
// so that a 2-core machine still runs everyone else.
constexpr auto kSpin = std::chrono::microseconds(100);
template <typename Ready>
bool spin_until(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

// The volume and its thread. Made in the constructor and never destroyed:
// static destructors run at exit before this library's own destructor
// would, and a joinable std::thread destroyed then ends the process;
// stop_mirroring, registered with atexit, stops and joins it instead.
struct MirrorState {
  std::unique_ptr<pmirror::Volume> volume;
  std::mutex mutex;
  std::condition_variable wake;  // a request, or stop
  std::condition_variable done;  // requests finished
  std::vector<MirrorRequest*> requests;
  std::atomic<size_t> queued{0};  // requests.size(), read without the mutex by the spin
  bool stop = false;
  bool settle = false;         // the program closed its pool: settle_unpersisted
  bool worker_asleep = false;  // guarded by mutex: notify only then
  std::thread worker;
};

// ---- observed mode: drains handed over as snapshots ------------------------------
//
// A drain copies the bytes of its group (from the local copy, just
// drained) into an epoch and returns. The epochs wait, and are started
// together as one ordered persist carrying those bytes
// (Volume::persist_ordered_async, a group per epoch, with a snapshot) --
// so the replicas see the program's drains in order, and get what each
// drain made durable even though the program goes on storing to the same
// bytes. A point where the program's state can be seen outside it
// (observe_point) starts the epochs handed over before it, in its own
// thread, and waits until they are durable on the replicas the ack policy
// needs: a transaction's five or so drains then cost one persist and one
// round trip, as one pmirror_persist would. Epochs nobody observes are
// started by the mirroring thread after kLinger, or at once when the ring
// is half full.
constexpr uint64_t kSnapshotBuffer = 4ull << 20;  // libpmirror's, and what epochs may hold
// A drain of more than this is mirrored the old way: the program waits
// (the epochs before it first), and the replicas read the mapping.
constexpr uint64_t kMaxSnapshotDrain = kSnapshotBuffer / 4;
constexpr uint64_t kEpochSlots = 256;
constexpr auto kLinger = std::chrono::milliseconds(1);

struct Epoch {
  std::vector<pmirror::PersistRange> ranges;
  std::vector<std::byte> bytes;
};

// Guarded by MirrorState::mutex, except the atomics.
struct ObservedState {
  Epoch slots[kEpochSlots];
  uint64_t produced = 0;       // epochs handed over (epoch n is slots[n % kEpochSlots])
  uint64_t consumed = 0;       // epochs started as persists (their bytes copied)
  uint64_t pending_bytes = 0;  // bytes of epochs handed over and not started
  std::condition_variable room;  // a slot or bytes freed
  bool worker_lingering = false;  // the mirroring thread waits kLinger before it starts them
  std::condition_variable durable;  // `durable_epochs` moved, or failed
  // A thread inside a libpmemobj transaction waits at an observation point:
  // the mirroring thread makes the epochs durable for it.
  std::atomic<uint64_t> durable_wanted{0};
  std::atomic<uint64_t> handed{0};          // == produced
  std::atomic<uint64_t> durable_epochs{0};  // epochs durable on the replicas
  std::atomic<bool> failed{false};
  pmirror::Status failure;  // why, once failed

  // Starting epochs: one thread at a time, so that they start in order.
  // Guarded by `posting`, not by MirrorState::mutex.
  std::mutex posting;
  uint64_t started = 0;        // epochs started (== consumed once posting is released)
  uint64_t last_sequence = 0;  // the persist that stands for them
  std::vector<pmirror::PersistRange> ranges;  // start_epochs' scratch, kept
  // What was started, said at exit with --log-level info.
  uint64_t calls = 0;
  uint64_t ranges_started = 0;
  uint64_t bytes_started = 0;
  std::vector<uint32_t> group_sizes;
  std::vector<std::byte> bytes;
};

// Enough waiting for an observation point: start them now.
bool epochs_pile_up(const ObservedState& ob) {
  return ob.produced - ob.consumed >= kEpochSlots / 2 || ob.pending_bytes >= kSnapshotBuffer / 2;
}
ObservedState& observed() {
  static ObservedState* const made = new ObservedState;  // never deleted, as state()
  return *made;
}
MirrorState& state() {
  static MirrorState* const made = new MirrorState;  // deliberately never deleted
  return *made;
}

void mirror_requests(std::vector<MirrorRequest*>& batch) {
  uint64_t last = 0;
  pmirror::Status failed;
  // Each group is one persist of its ranges (kept from batch to batch:
  // only this thread mirrors).
  static std::vector<pmirror::PersistRange> ranges;
  for (MirrorRequest* request : batch) {
    if (!failed.ok()) break;
    ranges.clear();
    for (int i = 0; i < request->group->count; ++i) {
      ranges.push_back({request->group->offset[i], request->group->length[i]});
    }
    auto started = state().volume->persist_async(ranges.data(), ranges.size());
    if (!started.ok()) {
      failed = started.status();
    } else {
      last = *started;
    }
  }
  if (failed.ok() && last != 0) failed = state().volume->wait(last);
  for (MirrorRequest* request : batch) request->result = failed;
  // The program writes its pool (a close settled while it opened it again).
  g_unsettled.store(true, std::memory_order_relaxed);
  g_mirrored.store(true, std::memory_order_relaxed);
}

// libpmemobj writes bytes of its pool that it never persists (docs in
// pmirror-run(1), "Bytes written and never persisted"): the run-time part
// of its pool descriptor (this process's pointers), the footers of free
// chunks, the descriptor of a free chunk kept in that chunk's own bytes. It
// sets them again at every open and never reads them from the file, so
// they reach the local copy and never the replicas. When the program has
// closed its pool (its last mapping of the local copy gone) and at exit,
// the copies are compared (Volume::verify) and every chunk where they
// differ is persisted through the mirror, as if the program had persisted
// it: once the pool is closed, `pmirrorctl verify` finds the copies equal.
// On the mirroring thread, with nothing else for it to do meanwhile.
void settle_unpersisted() {
  MirrorState& st = state();
  auto compared = st.volume->verify("", false);
  if (!compared.ok()) {
    std::fprintf(stderr,
                 "pmirror-run: volume '%s': the program closed its pool, but its copies could "
                 "not be compared: %s; bytes that it wrote without persisting them may differ "
                 "on the replicas until its next close (harmless to the pool: pmirror-run(1))\n",
                 g_volume_name, compared.status().to_string().c_str());
    return;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const pmirror::VerifyPeerResult& peer : *compared) {
    if (!peer.status.ok()) {
      std::fprintf(stderr,
                   "pmirror-run: volume '%s': the program closed its pool, but replica %s could "
                   "not be compared: %s; bytes that it wrote without persisting them may differ "
                   "there until its next close (harmless to the pool: pmirror-run(1))\n",
                   g_volume_name, peer.peer.c_str(), peer.status.to_string().c_str());
    }
    ranges.insert(ranges.end(), peer.mismatches.begin(), peer.mismatches.end());
  }
  // The same chunks usually differ on every replica: each is mirrored once.
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& [offset, length] : ranges) {
    if (!merged.empty() && offset <= merged.back().first + merged.back().second) {
      merged.back().second = std::max(merged.back().second, offset + length - merged.back().first);
    } else {
      merged.emplace_back(offset, length);
    }
  }
  uint64_t last = 0, bytes = 0;
  pmirror::Status mirrored;
  for (const auto& [offset, length] : merged) {
    auto started = st.volume->persist_async(offset, length);
    if (!started.ok()) {
      mirrored = started.status();
      break;
    }
    last = *started;
    bytes += length;
  }
  if (mirrored.ok() && last != 0) mirrored = st.volume->wait(last);
  if (!mirrored.ok()) {
    // A persist that fails leaves its range dirty: the next open resyncs it.
    std::fprintf(stderr,
                 "pmirror-run: volume '%s': the program closed its pool, but the chunks where "
                 "its copies differ could not be mirrored: %s; they are recorded dirty and the "
                 "next open copies them\n",
                 g_volume_name, mirrored.to_string().c_str());
  } else if (g_verbose && !merged.empty()) {
    std::fprintf(stderr,
                 "pmirror-run: volume '%s': the program closed its pool: %llu bytes where the "
                 "copies differed (written, never persisted) mirrored to the replicas\n",
                 g_volume_name, static_cast<unsigned long long>(bytes));
  }
}

// Marks the calling thread as pmirror's own while libpmirror works in it
// (its socket writes are no observation points, its mappings no pool's).
class InsidePmirror {
 public:
  InsidePmirror() : was_(t_inside) { t_inside = true; }
  ~InsidePmirror() { t_inside = was_; }
  InsidePmirror(const InsidePmirror&) = delete;
  InsidePmirror& operator=(const InsidePmirror&) = delete;

 private:
  bool was_;
};

void note_failure(const pmirror::Status& why) {
  MirrorState& st = state();
  ObservedState& ob = observed();
  std::lock_guard lock(st.mutex);
  // The program stops at its next drain or observation point: nothing it
  // does after this can be seen outside it.
  if (!ob.failed.load(std::memory_order_relaxed)) ob.failure = why;
  ob.failed.store(true, std::memory_order_release);
  ob.room.notify_all();
  ob.durable.notify_all();
}

// Starts every epoch handed over and not started yet as one ordered
// persist, a group per epoch (libpmirror splits it where its limits say,
// in order). With ob.posting held, not MirrorState::mutex.
void start_epochs() {
  MirrorState& st = state();
  ObservedState& ob = observed();
  uint64_t to = 0;
  {
    std::lock_guard lock(st.mutex);
    to = ob.produced;
  }
  const uint64_t from = ob.started;
  if (from == to || ob.failed.load(std::memory_order_acquire)) return;
  // The slots [from, to) are ours until consumed moves: hand_over fills
  // only slots past `produced`, and only while the ring has room.
  ob.ranges.clear();
  ob.group_sizes.clear();
  ob.bytes.clear();
  for (uint64_t n = from; n < to; ++n) {
    const Epoch& epoch = ob.slots[n % kEpochSlots];
    ob.ranges.insert(ob.ranges.end(), epoch.ranges.begin(), epoch.ranges.end());
    ob.group_sizes.push_back(static_cast<uint32_t>(epoch.ranges.size()));
    ob.bytes.insert(ob.bytes.end(), epoch.bytes.begin(), epoch.bytes.end());
  }
  pmirror::Result<uint64_t> started = pmirror::Status::Ok();
  {
    InsidePmirror inside;
    started = st.volume->persist_ordered_async(ob.ranges.data(), ob.ranges.size(),
                                               ob.group_sizes.data(), ob.group_sizes.size(),
                                               ob.bytes.data());
  }
  ++ob.calls;
  ob.ranges_started += ob.ranges.size();
  ob.bytes_started += ob.bytes.size();
  if (ob.bytes.capacity() > (1u << 20)) std::vector<std::byte>().swap(ob.bytes);
  ob.started = to;
  if (started.ok()) ob.last_sequence = *started;
  g_unsettled.store(true, std::memory_order_relaxed);
  g_mirrored.store(true, std::memory_order_relaxed);
  {
    std::lock_guard lock(st.mutex);
    for (uint64_t n = from; n < to; ++n) {
      Epoch& epoch = ob.slots[n % kEpochSlots];
      ob.pending_bytes -= epoch.bytes.size();
      if (epoch.bytes.capacity() > (256u << 10)) std::vector<std::byte>().swap(epoch.bytes);
    }
    ob.consumed = to;
    ob.room.notify_all();
  }
  if (!started.ok()) note_failure(started.status());
}

// Starts the epochs not started yet and waits until every epoch started
// is durable on the replicas the ack policy needs (a failure is noted).
void make_epochs_durable() {
  ObservedState& ob = observed();
  uint64_t sequence = 0, upto = 0;
  {
    std::lock_guard posting(ob.posting);
    start_epochs();
    sequence = ob.last_sequence;
    upto = ob.started;
  }
  if (ob.failed.load(std::memory_order_acquire) || sequence == 0) return;
  pmirror::Status waited;
  {
    InsidePmirror inside;
    waited = state().volume->wait(sequence);
  }
  if (!waited.ok()) {
    note_failure(waited);
    return;
  }
  uint64_t durable = ob.durable_epochs.load(std::memory_order_relaxed);
  while (durable < upto &&
         !ob.durable_epochs.compare_exchange_weak(durable, upto, std::memory_order_release)) {
  }
}

// The mirroring thread's part in observed mode. While drains come, it
// looks every kLinger (a timed sleep: no hand-off wakes it): epochs that no
// observation point took since it last looked are started here, not waited
// for; a thread inside a libpmemobj transaction that waits at an
// observation point is served at once. After kIdlePolls looks with nothing
// to do it sleeps until the next drain wakes it.
constexpr int kIdlePolls = 10;

// After a failure nothing is: whoever waits stops the program instead.
bool durable_wanted(const ObservedState& ob) {
  return ob.durable_wanted.load(std::memory_order_relaxed) >
             ob.durable_epochs.load(std::memory_order_relaxed) &&
         !ob.failed.load(std::memory_order_relaxed);
}

// With MirrorState::mutex held on entry and exit.
void serve_epochs(std::unique_lock<std::mutex>& lock, uint64_t& seen) {
  MirrorState& st = state();
  ObservedState& ob = observed();
  const bool wanted = durable_wanted(ob);
  // Epochs handed over before the last look (or piling up) are due.
  const bool due = ob.consumed < seen || epochs_pile_up(ob) || st.stop || st.settle;
  seen = ob.produced;
  if (wanted || due) {
    lock.unlock();
    if (wanted) {
      make_epochs_durable();
    } else {
      std::lock_guard posting(ob.posting);
      start_epochs();
    }
    lock.lock();
    if (wanted) ob.durable.notify_all();
  }
  if (ob.failed.load(std::memory_order_relaxed)) {
    // Nobody takes the epochs left: the program stops at its next drain
    // or observation point.
    ob.pending_bytes = 0;
    ob.consumed = ob.produced;
    ob.room.notify_all();
  }
}

void worker_loop() {
  t_inside = true;  // everything this thread does is pmirror's own
  MirrorState& st = state();
  ObservedState& ob = observed();
  std::vector<MirrorRequest*> batch;
  std::unique_lock lock(st.mutex);
  uint64_t seen = 0;  // epochs handed over when the thread last looked
  int idle_polls = 0;
  // A failure wakes the thread once, to release the epochs nobody will
  // take. As a standing reason to wake it kept the thread looping with the
  // mutex held, and the program's thread, come to stop itself at its next
  // observation point, waited for that mutex for ever (found over rdma in
  // the lab: tests/pmdk/observation_point_test.sh).
  bool failure_served = false;
  while (true) {
    if (g_observed) {
      serve_epochs(lock, seen);
      failure_served = ob.failed.load(std::memory_order_relaxed);
      const bool busy = ob.consumed != ob.produced;
      idle_polls = busy ? 0 : idle_polls + 1;
      if (st.requests.empty() && !st.stop && !st.settle && !durable_wanted(ob)) {
        auto woken = [&] {
          return st.stop || st.settle || !st.requests.empty() || durable_wanted(ob) ||
                 epochs_pile_up(ob) ||
                 (!failure_served && ob.failed.load(std::memory_order_relaxed));
        };
        if (busy || idle_polls < kIdlePolls) {
          ob.worker_lingering = true;
          st.wake.wait_for(lock, kLinger, woken);
          ob.worker_lingering = false;
        } else {
          st.worker_asleep = true;
          st.wake.wait(lock, [&] { return woken() || ob.consumed != ob.produced; });
          st.worker_asleep = false;
          idle_polls = 0;
          seen = ob.consumed;  // the epoch that woke it gets its kLinger
        }
        continue;
      }
      if (ob.consumed != ob.produced && (st.stop || st.settle)) continue;  // started first
    } else if (st.requests.empty() && !st.stop && !st.settle) {
      // Drain mode: the program waits at each drain, so the hand-off spins
      // first.
      lock.unlock();
      spin_until([&] { return st.queued.load(std::memory_order_acquire) != 0; });
      lock.lock();
      st.worker_asleep = true;
      st.wake.wait(lock, [&] { return st.stop || st.settle || !st.requests.empty(); });
      st.worker_asleep = false;
    }
    if (st.requests.empty()) {
      // The pool closed, or the program exits: settle what it left, once.
      if ((st.settle || st.stop) && g_unsettled.exchange(false)) {
        st.settle = false;
        g_mirrored.store(false, std::memory_order_relaxed);
        lock.unlock();
        // The epochs started last are compared once they landed.
        if (pmirror::Status drained = st.volume->drain(); !drained.ok() && g_observed) {
          note_failure(drained);
        }
        settle_unpersisted();
        lock.lock();
        continue;  // drains may have queued meanwhile (a pool opened again)
      }
      st.settle = false;
      if (st.stop) break;
      continue;
    }
    batch.clear();
    batch.swap(st.requests);
    st.queued.store(0, std::memory_order_relaxed);
    lock.unlock();
    mirror_requests(batch);
    lock.lock();
    for (MirrorRequest* request : batch) request->done.store(true, std::memory_order_release);
    st.done.notify_all();
  }
  lock.unlock();
  // At exit: what was persisted is on the replicas already; closing says
  // goodbye to them and marks the copy clean.
  st.volume.reset();
}

// munmap took the program's last mapping of the local copy away: the
// mirroring thread settles the close (settle_unpersisted), without making
// munmap wait for it.
void pool_closed() {
  MirrorState& st = state();
  std::lock_guard lock(st.mutex);
  st.settle = true;
  if (st.worker_asleep || observed().worker_lingering) st.wake.notify_one();
}

void observe_point();
[[noreturn]] void stop_program(const pmirror::Status& why);

// Observed mode: the group becomes the next epoch (false: it is too large
// for a snapshot, and is mirrored the waiting way).
bool hand_over(PendingGroup& group) {
  uint64_t total = 0;
  for (int i = 0; i < group.count; ++i) total += group.length[i];
  if (total > kMaxSnapshotDrain) return false;
  MirrorState& st = state();
  ObservedState& ob = observed();
  if (ob.failed.load(std::memory_order_acquire)) stop_program(ob.failure);
  std::unique_lock lock(st.mutex);
  ob.room.wait(lock, [&] {
    return (ob.produced - ob.consumed < kEpochSlots &&
            ob.pending_bytes + total <= kSnapshotBuffer) ||
           ob.failed.load(std::memory_order_relaxed);
  });
  if (ob.failed.load(std::memory_order_relaxed)) {
    pmirror::Status why = ob.failure;
    lock.unlock();
    stop_program(why);
  }
  Epoch& epoch = ob.slots[ob.produced % kEpochSlots];
  epoch.ranges.resize(static_cast<size_t>(group.count));
  epoch.bytes.resize(total);
  uint64_t at = 0;
  for (int i = 0; i < group.count; ++i) {
    epoch.ranges[i] = pmirror::PersistRange{group.offset[i], group.length[i]};
    std::memcpy(epoch.bytes.data() + at, g_local_base + group.offset[i], group.length[i]);
    at += group.length[i];
  }
  ++ob.produced;
  ob.pending_bytes += total;
  ob.handed.store(ob.produced, std::memory_order_release);
  if (st.worker_asleep || (ob.worker_lingering && epochs_pile_up(ob))) st.wake.notify_one();
  return true;
}

void mirror_pending() {
  PendingGroup& group = t_pending;
  if (group.count == 0) return;
  if (g_observed) {
    if (hand_over(group)) {
      group.count = 0;
      return;
    }
    observe_point();  // the epochs before it are durable first: it goes in order
  }
  MirrorRequest request;
  request.group = &group;
  {
    MirrorState& st = state();
    std::unique_lock lock(st.mutex);
    st.requests.push_back(&request);
    st.queued.store(st.requests.size(), std::memory_order_release);
    if (st.worker_asleep || observed().worker_lingering) st.wake.notify_one();
    lock.unlock();
    if (!spin_until([&] { return request.done.load(std::memory_order_acquire); })) {
      lock.lock();
      st.done.wait(lock, [&] { return request.done.load(std::memory_order_acquire); });
    }
  }
  group.count = 0;
  if (!request.result.ok()) stop_program(request.result);
}

// Records [addr, addr + length) if it lies in a mapping of the local copy.
// The hot path of every call: a few comparisons when it does not.
void record(const void* addr, size_t length) {
  if (length == 0 || t_inside || g_forked_child) return;
  const int slots = g_mapping_slots.load(std::memory_order_acquire);
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  for (int i = 0; i < slots; ++i) {
    const Mapping& m = g_mappings[i];
    const uintptr_t begin = m.begin.load(std::memory_order_acquire);
    if (begin == 0 || a < begin) continue;
    const uintptr_t end = m.end.load(std::memory_order_relaxed);
    if (a >= end) continue;
    uint64_t offset = m.offset.load(std::memory_order_relaxed) + (a - begin);
    uint64_t len = std::min<uint64_t>(length, end - a);
    if (offset >= g_volume_size) return;  // beyond the volume: not mirrored
    len = std::min(len, g_volume_size - offset);
    PendingGroup& group = t_pending;
    if (group.count > 0) {
      uint64_t& last_offset = group.offset[group.count - 1];
      uint64_t& last_length = group.length[group.count - 1];
      if (offset >= last_offset && offset <= last_offset + last_length) {
        last_length = std::max(last_length, offset + len - last_offset);
        return;
      }
    }
    if (group.count == kMaxPending) mirror_pending();
    group.offset[group.count] = offset;
    group.length[group.count] = len;
    ++group.count;
    return;
  }
}

bool mirroring() {
  return g_watching.load(std::memory_order_acquire) && !t_inside && !g_forked_child;
}

void drain_here() {
  if (mirroring()) mirror_pending();
}

// Observed mode: the program's state may be seen outside it next (a
// write, a send, an fsync, an exit, ...): wait until every drain handed
// over before now is durable on the replicas the ack policy needs.
// pmirror's own threads (and those they start) pass.
// Whether the calling thread is inside a libpmemobj transaction (libpmirror
// links libpmemobj, so the program's and libpmirror's are one library).
bool in_pmemobj_transaction() {
  using TxStage = int (*)();
  static const TxStage stage =
      reinterpret_cast<TxStage>(dlsym(RTLD_DEFAULT, "pmemobj_tx_stage"));
  return stage == nullptr || stage() != 0;  // TX_STAGE_NONE is 0; unknown: the safe way
}

void observe_point() {
  if (!g_observed || t_inside || g_forked_child || !g_watching.load(std::memory_order_acquire)) {
    return;
  }
  ObservedState& ob = observed();
  const uint64_t target = ob.handed.load(std::memory_order_acquire);
  auto done = [&] {
    return ob.durable_epochs.load(std::memory_order_acquire) >= target ||
           ob.failed.load(std::memory_order_acquire);
  };
  if (!done()) {
    if (!in_pmemobj_transaction()) {
      // This thread starts what is left (with what other threads handed
      // over meanwhile: harmless) and waits for it: no hand-off.
      make_epochs_durable();
    } else {
      // libpmirror's bookkeeping is libpmemobj too, whose transactions are
      // per thread: inside the program's own it runs on the mirroring
      // thread (section 2 of docs/pmdk.md).
      MirrorState& st = state();
      std::unique_lock lock(st.mutex);
      uint64_t wanted = ob.durable_wanted.load(std::memory_order_relaxed);
      while (wanted < target &&
             !ob.durable_wanted.compare_exchange_weak(wanted, target, std::memory_order_release)) {
      }
      st.wake.notify_one();
      ob.durable.wait(lock, done);
    }
  }
  if (ob.failed.load(std::memory_order_acquire)) {
    pmirror::Status why;
    {
      std::lock_guard lock(state().mutex);
      why = ob.failure;
    }
    stop_program(why);
  }
}

// ---- start and end ----------------------------------------------------------------

std::string take_env(const char* name) {
  const char* value = std::getenv(name);
  std::string out = value != nullptr ? value : "";
  ::unsetenv(name);
  return out;
}

// The program's children run plain: our variables go, and so does this
// library from LD_PRELOAD.
void leave_children_alone() {
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload == nullptr) return;
  std::string kept, list = preload;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find_first_of(": ", start);
    if (end == std::string::npos) end = list.size();
    std::string entry = list.substr(start, end - start);
    if (!entry.empty() && entry.find("libpmirror-preload") == std::string::npos) {
      kept += (kept.empty() ? "" : ":") + entry;
    }
    start = end + 1;
  }
  if (kept.empty()) {
    ::unsetenv("LD_PRELOAD");
  } else {
    ::setenv("LD_PRELOAD", kept.c_str(), 1);
  }
}

void stop_mirroring();

__attribute__((constructor)) void start_mirroring() {
  (void)real();
  std::string config = take_env("PMIRROR_RUN_CONFIG");
  std::string volume = take_env("PMIRROR_RUN_VOLUME");
  std::string node = take_env("PMIRROR_RUN_NODE");
  std::string identity = take_env("PMIRROR_RUN_IDENTITY");
  std::string path = take_env("PMIRROR_RUN_PATH");
  std::string log_level = take_env("PMIRROR_RUN_LOG_LEVEL");
  std::string durability = take_env("PMIRROR_RUN_DURABILITY");
  leave_children_alone();
  if (config.empty() || volume.empty()) return;  // not under pmirror-run: forward only
  std::snprintf(g_volume_name, sizeof g_volume_name, "%s", volume.c_str());
  g_verbose = log_level == "debug" || log_level == "info";
  pmirror::set_log_threshold(log_level == "debug"  ? pmirror::LogLevel::kDebug
                             : log_level == "info" ? pmirror::LogLevel::kInfo
                                                   : pmirror::LogLevel::kWarn);
  // A child could show what its parent's state was: the fork waits.
  pthread_atfork([] { observe_point(); }, nullptr, [] { g_forked_child = true; });

  t_inside = true;
  auto opened = pmirror::Volume::open_from_config(
      config, volume, identity, node,
      [&](pmirror::VolumeOptions& options) {
        options.local_persisted_by_caller = true;
        if (durability != "drain") options.snapshot_buffer = kSnapshotBuffer;
      });
  t_inside = false;
  if (!opened.ok()) {
    std::fprintf(stderr, "pmirror-run: cannot mirror volume '%s': %s\n", volume.c_str(),
                 opened.status().to_string().c_str());
    std::_Exit(70);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "pmirror-run: volume '%s': cannot stat its local copy %s: %s\n",
                 volume.c_str(), path.c_str(), std::strerror(errno));
    std::_Exit(70);
  }
  g_copy = FileIdentity{st.st_dev, st.st_ino, st.st_rdev, S_ISCHR(st.st_mode)};
  g_volume_size = (*opened)->size();
  g_local_base = (*opened)->data();
  g_observed = durability != "drain";
  state().volume = std::move(*opened);
  state().worker = std::thread(worker_loop);
  std::atexit(stop_mirroring);
  g_watching.store(true, std::memory_order_release);
}

// At exit (atexit, registered once the volume is open: it runs before the
// handlers registered earlier, after the program's own): the thread
// finishes what is queued, closes the volume, and is joined.
void stop_mirroring() {
  MirrorState& st = state();
  if (!st.worker.joinable() || g_forked_child) return;
  g_watching.store(false, std::memory_order_release);
  {
    std::lock_guard lock(st.mutex);
    st.stop = true;
    st.wake.notify_one();
  }
  st.worker.join();
  ObservedState& ob = observed();
  if (g_verbose && g_observed) {
    std::fprintf(stderr,
                 "pmirror-run: volume '%s': %llu drains mirrored as %llu ordered persists "
                 "(%llu ranges, %llu bytes)\n",
                 g_volume_name, static_cast<unsigned long long>(ob.started),
                 static_cast<unsigned long long>(ob.calls),
                 static_cast<unsigned long long>(ob.ranges_started),
                 static_cast<unsigned long long>(ob.bytes_started));
  }
}

}  // namespace

// ---- the interposed functions ------------------------------------------------------

PMIRROR_PRELOAD_API void* mmap(void* addr, size_t length, int prot, int flags, int fd,
                               off_t offset) noexcept {
  void* mapped =
      reinterpret_cast<void*>(::syscall(SYS_mmap, addr, length, prot, flags, fd, offset));
  if (mapped != MAP_FAILED && fd >= 0 && (flags & MAP_SHARED) != 0) {
    note_mapping(mapped, length, fd, offset);
  }
  return mapped;
}

PMIRROR_PRELOAD_API void* mmap64(void* addr, size_t length, int prot, int flags, int fd,
                                 off_t offset) noexcept {
  return mmap(addr, length, prot, flags, fd, offset);
}

PMIRROR_PRELOAD_API int munmap(void* addr, size_t length) noexcept {
  int rc = static_cast<int>(::syscall(SYS_munmap, addr, length));
  if (rc == 0 && forget_mapping(addr, length) && mirroring() &&
      g_mirrored.load(std::memory_order_relaxed)) {
    pool_closed();
  }
  return rc;
}

PMIRROR_PRELOAD_API void pmem_persist(const void* addr, size_t len) {
  real().persist(addr, len);
  if (!mirroring()) return;
  record(addr, len);
  mirror_pending();
}

PMIRROR_PRELOAD_API int pmem_msync(const void* addr, size_t len) {
  int rc = real().msync(addr, len);
  if (rc != 0 || !mirroring()) return rc;
  record(addr, len);
  mirror_pending();
  return rc;
}

PMIRROR_PRELOAD_API void pmem_flush(const void* addr, size_t len) {
  real().flush(addr, len);
  if (mirroring()) record(addr, len);
}

PMIRROR_PRELOAD_API void pmem_drain(void) {
  real().drain();
  drain_here();
}

PMIRROR_PRELOAD_API void pmem_deep_flush(const void* addr, size_t len) {
  real().deep_flush(addr, len);
  if (mirroring()) record(addr, len);
}

PMIRROR_PRELOAD_API int pmem_deep_drain(const void* addr, size_t len) {
  int rc = real().deep_drain(addr, len);
  if (rc != 0 || !mirroring()) return rc;
  record(addr, len);
  mirror_pending();
  return rc;
}

PMIRROR_PRELOAD_API int pmem_deep_persist(const void* addr, size_t len) {
  int rc = real().deep_persist(addr, len);
  if (rc != 0 || !mirroring()) return rc;
  record(addr, len);
  mirror_pending();
  return rc;
}

namespace {
// pmem_memcpy and friends with flags: NOFLUSH leaves nothing durable (a
// later flush records it); NODRAIN records; otherwise the range is drained.
void after_mem(void* dest, size_t len, unsigned flags) {
  if (!mirroring() || (flags & PMEM_F_MEM_NOFLUSH) != 0) return;
  record(dest, len);
  if ((flags & PMEM_F_MEM_NODRAIN) == 0) mirror_pending();
}
void after_mem_persist(void* dest, size_t len) {
  if (!mirroring()) return;
  record(dest, len);
  mirror_pending();
}
void after_mem_nodrain(void* dest, size_t len) {
  if (mirroring()) record(dest, len);
}
}  // namespace

PMIRROR_PRELOAD_API void* pmem_memcpy(void* dest, const void* src, size_t len, unsigned flags) {
  void* out = real().memcpy(dest, src, len, flags);
  after_mem(dest, len, flags);
  return out;
}

PMIRROR_PRELOAD_API void* pmem_memmove(void* dest, const void* src, size_t len, unsigned flags) {
  void* out = real().memmove(dest, src, len, flags);
  after_mem(dest, len, flags);
  return out;
}

PMIRROR_PRELOAD_API void* pmem_memset(void* dest, int c, size_t len, unsigned flags) {
  void* out = real().memset(dest, c, len, flags);
  after_mem(dest, len, flags);
  return out;
}

PMIRROR_PRELOAD_API void* pmem_memcpy_persist(void* dest, const void* src, size_t len) {
  void* out = real().memcpy_persist(dest, src, len);
  after_mem_persist(dest, len);
  return out;
}

PMIRROR_PRELOAD_API void* pmem_memmove_persist(void* dest, const void* src, size_t len) {
  void* out = real().memmove_persist(dest, src, len);
  after_mem_persist(dest, len);
  return out;
}

PMIRROR_PRELOAD_API void* pmem_memset_persist(void* dest, int c, size_t len) {
  void* out = real().memset_persist(dest, c, len);
  after_mem_persist(dest, len);
  return out;
}

PMIRROR_PRELOAD_API void* pmem_memcpy_nodrain(void* dest, const void* src, size_t len) {
  void* out = real().memcpy_nodrain(dest, src, len);
  after_mem_nodrain(dest, len);
  return out;
}

PMIRROR_PRELOAD_API void* pmem_memmove_nodrain(void* dest, const void* src, size_t len) {
  void* out = real().memmove_nodrain(dest, src, len);
  after_mem_nodrain(dest, len);
  return out;
}

PMIRROR_PRELOAD_API void* pmem_memset_nodrain(void* dest, int c, size_t len) {
  void* out = real().memset_nodrain(dest, c, len);
  after_mem_nodrain(dest, len);
  return out;
}

// ---- observation points (observed mode) -----------------------------------------
//
// Where the program's state may be seen outside it: each waits
// (observe_point) and then calls the next definition (the C library's).
// glibc's own internal calls (stdio writing its buffer) do not come here,
// so the stdio functions that may write are wrapped too. The list, and
// what it does not cover, is in pmirror-run(1) and docs/pmdk.md, section 3.

namespace {

template <typename F>
F next_definition(const char* name) {
  void* found = dlsym(RTLD_NEXT, name);
  if (found == nullptr) {
    std::fprintf(stderr, "pmirror-run: the C library's %s not found: %s\n", name, dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(found);
}

// Threads that pmirror's own threads start (libpmirror's supervisor,
// reconnects, its transport's) are pmirror's too: they pass observation
// points (waiting there for pmirror itself would never end).
struct ThreadStart {
  void* (*start)(void*);
  void* arg;
};
void* start_inside(void* argument) {
  ThreadStart what = *static_cast<ThreadStart*>(argument);
  delete static_cast<ThreadStart*>(argument);
  t_inside = true;
  return what.start(what.arg);
}

}  // namespace

PMIRROR_PRELOAD_API int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                       void* (*start)(void*), void* arg) {
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Fn next = next_definition<Fn>("pthread_create");
  if (!t_inside) return next(thread, attr, start, arg);
  auto* what = new ThreadStart{start, arg};
  int rc = next(thread, attr, start_inside, what);
  if (rc != 0) delete what;
  return rc;
}

// An observation point with the C library's signature `R name(ARGS)`.
#define PMIRROR_OBSERVED(R, name, PARAMS, ARGS)                        \
  PMIRROR_PRELOAD_API R name PARAMS {                                  \
    using Fn = R(*) PARAMS;                                            \
    static const Fn next = next_definition<Fn>(#name);                 \
    observe_point();                                                   \
    return next ARGS;                                                  \
  }

// Writing to a file, a pipe, a socket or a terminal.
PMIRROR_OBSERVED(ssize_t, write, (int fd, const void* buf, size_t n), (fd, buf, n))
PMIRROR_OBSERVED(ssize_t, pwrite, (int fd, const void* buf, size_t n, off_t at), (fd, buf, n, at))
PMIRROR_OBSERVED(ssize_t, pwrite64, (int fd, const void* buf, size_t n, off64_t at),
                 (fd, buf, n, at))
PMIRROR_OBSERVED(ssize_t, writev, (int fd, const struct iovec* iov, int count), (fd, iov, count))
PMIRROR_OBSERVED(ssize_t, pwritev, (int fd, const struct iovec* iov, int count, off_t at),
                 (fd, iov, count, at))
PMIRROR_OBSERVED(ssize_t, pwritev2,
                 (int fd, const struct iovec* iov, int count, off_t at, int flags),
                 (fd, iov, count, at, flags))
PMIRROR_OBSERVED(ssize_t, send, (int fd, const void* buf, size_t n, int flags),
                 (fd, buf, n, flags))
PMIRROR_OBSERVED(ssize_t, sendto,
                 (int fd, const void* buf, size_t n, int flags, const struct sockaddr* to,
                  socklen_t to_length),
                 (fd, buf, n, flags, to, to_length))
PMIRROR_OBSERVED(ssize_t, sendmsg, (int fd, const struct msghdr* message, int flags),
                 (fd, message, flags))
PMIRROR_OBSERVED(int, sendmmsg, (int fd, struct mmsghdr* messages, unsigned count, int flags),
                 (fd, messages, count, flags))
PMIRROR_OBSERVED(ssize_t, sendfile, (int out, int in, off_t* at, size_t n), (out, in, at, n))
PMIRROR_OBSERVED(ssize_t, sendfile64, (int out, int in, off64_t* at, size_t n), (out, in, at, n))
PMIRROR_OBSERVED(ssize_t, splice,
                 (int in, loff_t* in_at, int out, loff_t* out_at, size_t n, unsigned flags),
                 (in, in_at, out, out_at, n, flags))
PMIRROR_OBSERVED(ssize_t, copy_file_range,
                 (int in, loff_t* in_at, int out, loff_t* out_at, size_t n, unsigned flags),
                 (in, in_at, out, out_at, n, flags))
// Making files durable, or changing their names.
PMIRROR_OBSERVED(int, fsync, (int fd), (fd))
PMIRROR_OBSERVED(int, fdatasync, (int fd), (fd))
PMIRROR_OBSERVED(void, sync, (void), ())
PMIRROR_OBSERVED(int, syncfs, (int fd), (fd))
PMIRROR_OBSERVED(int, sync_file_range, (int fd, off64_t at, off64_t n, unsigned flags),
                 (fd, at, n, flags))
PMIRROR_OBSERVED(int, rename, (const char* from, const char* to), (from, to))
PMIRROR_OBSERVED(int, renameat, (int from_dir, const char* from, int to_dir, const char* to),
                 (from_dir, from, to_dir, to))
PMIRROR_OBSERVED(int, renameat2,
                 (int from_dir, const char* from, int to_dir, const char* to, unsigned flags),
                 (from_dir, from, to_dir, to, flags))
PMIRROR_OBSERVED(int, link, (const char* from, const char* to), (from, to))
PMIRROR_OBSERVED(int, linkat,
                 (int from_dir, const char* from, int to_dir, const char* to, int flags),
                 (from_dir, from, to_dir, to, flags))
PMIRROR_OBSERVED(int, symlink, (const char* target, const char* path), (target, path))
PMIRROR_OBSERVED(int, unlink, (const char* path), (path))
PMIRROR_OBSERVED(int, unlinkat, (int dir, const char* path, int flags), (dir, path, flags))
PMIRROR_OBSERVED(int, truncate, (const char* path, off_t n), (path, n))
// Signals to others; running another program; ending this one.
PMIRROR_OBSERVED(int, kill, (pid_t pid, int signal), (pid, signal))
PMIRROR_OBSERVED(int, sigqueue, (pid_t pid, int signal, const union sigval value),
                 (pid, signal, value))
PMIRROR_OBSERVED(int, execve, (const char* path, char* const argv[], char* const envp[]),
                 (path, argv, envp))
PMIRROR_OBSERVED(int, execv, (const char* path, char* const argv[]), (path, argv))
PMIRROR_OBSERVED(int, execvp, (const char* file, char* const argv[]), (file, argv))
PMIRROR_OBSERVED(int, execvpe, (const char* file, char* const argv[], char* const envp[]),
                 (file, argv, envp))
PMIRROR_OBSERVED(int, posix_spawn,
                 (pid_t * pid, const char* path, const posix_spawn_file_actions_t* actions,
                  const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]),
                 (pid, path, actions, attributes, argv, envp))
PMIRROR_OBSERVED(int, posix_spawnp,
                 (pid_t * pid, const char* file, const posix_spawn_file_actions_t* actions,
                  const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]),
                 (pid, file, actions, attributes, argv, envp))
// stdio: any of these may write its buffer (through the C library's
// internal write, which does not come here).
PMIRROR_OBSERVED(size_t, fwrite, (const void* buf, size_t size, size_t n, FILE* stream),
                 (buf, size, n, stream))
PMIRROR_OBSERVED(size_t, fwrite_unlocked, (const void* buf, size_t size, size_t n, FILE* stream),
                 (buf, size, n, stream))
PMIRROR_OBSERVED(int, fputs, (const char* text, FILE* stream), (text, stream))
PMIRROR_OBSERVED(int, fputs_unlocked, (const char* text, FILE* stream), (text, stream))
PMIRROR_OBSERVED(int, puts, (const char* text), (text))
PMIRROR_OBSERVED(int, fputc, (int c, FILE* stream), (c, stream))
PMIRROR_OBSERVED(int, putc, (int c, FILE* stream), (c, stream))
PMIRROR_OBSERVED(int, putchar, (int c), (c))
PMIRROR_OBSERVED(int, fflush, (FILE * stream), (stream))
PMIRROR_OBSERVED(int, fclose, (FILE * stream), (stream))
PMIRROR_OBSERVED(int, vprintf, (const char* format, va_list args), (format, args))
PMIRROR_OBSERVED(int, vfprintf, (FILE * stream, const char* format, va_list args),
                 (stream, format, args))
PMIRROR_OBSERVED(int, vdprintf, (int fd, const char* format, va_list args), (fd, format, args))
PMIRROR_OBSERVED(int, __vfprintf_chk, (FILE * stream, int flag, const char* format, va_list args),
                 (stream, flag, format, args))
PMIRROR_OBSERVED(int, __vprintf_chk, (int flag, const char* format, va_list args),
                 (flag, format, args))

#undef PMIRROR_OBSERVED

// The variadic ones, through their va_list forms.
PMIRROR_PRELOAD_API int printf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  int n = vprintf(format, args);
  va_end(args);
  return n;
}
PMIRROR_PRELOAD_API int fprintf(FILE* stream, const char* format, ...) {
  va_list args;
  va_start(args, format);
  int n = vfprintf(stream, format, args);
  va_end(args);
  return n;
}
PMIRROR_PRELOAD_API int dprintf(int fd, const char* format, ...) {
  va_list args;
  va_start(args, format);
  int n = vdprintf(fd, format, args);
  va_end(args);
  return n;
}
PMIRROR_PRELOAD_API int __printf_chk(int flag, const char* format, ...) {
  va_list args;
  va_start(args, format);
  int n = __vprintf_chk(flag, format, args);
  va_end(args);
  return n;
}
PMIRROR_PRELOAD_API int __fprintf_chk(FILE* stream, int flag, const char* format, ...) {
  va_list args;
  va_start(args, format);
  int n = __vfprintf_chk(stream, flag, format, args);
  va_end(args);
  return n;
}

// msync of another file is an observation point; of the local copy it is
// a persist (libpmem's pmem_msync on a pool that is not pmem), which the
// pmem_msync wrapper mirrors.
PMIRROR_PRELOAD_API int msync(void* addr, size_t length, int flags) {
  using Fn = int (*)(void*, size_t, int);
  static const Fn next = next_definition<Fn>("msync");
  bool local = false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  const int slots = g_mapping_slots.load(std::memory_order_acquire);
  for (int i = 0; i < slots && !local; ++i) {
    const uintptr_t begin = g_mappings[i].begin.load(std::memory_order_acquire);
    local = begin != 0 && a >= begin && a < g_mappings[i].end.load(std::memory_order_relaxed);
  }
  if (!local) observe_point();
  return next(addr, length, flags);
}

PMIRROR_PRELOAD_API void _exit(int status) {
  using Fn = void (*)(int);
  static const Fn next = next_definition<Fn>("_exit");
  observe_point();
  next(status);
  __builtin_unreachable();
}
PMIRROR_PRELOAD_API void _Exit(int status) { _exit(status); }
