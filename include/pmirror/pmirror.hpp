// libpmirror's C++ API: a volume mirrored to pmirrord targets.
//
//   #include <pmirror/pmirror.hpp>
//
//   pmirror::VolumeOptions options;
//   options.name = "db0";
//   options.local_path = "/mnt/pmem/db0";
//   options.identity = "app1";
//   options.replicas = {{"10.0.0.2", 7450, "rdma", secret, "node2"}};
//   auto volume = pmirror::Volume::open(options);
//   if (!volume.ok()) { ... volume.status().message() ... }
//   std::memcpy((*volume)->data() + 4096, record, n);
//   pmirror::Status s = (*volume)->persist(4096, n);  // durable locally and on `ack` replicas
//
// Link with -lpmirror. The C API (pmirror.h) offers the same; libpmirror(3) and
// /usr/share/doc/libpmirror-dev/initiator.md describe both, with the error
// classes.
//
// Each persist is written to every replica in parallel: one-sided Writes of
// the range, then -- where the target guarantees APM -- an 8-byte Read on
// the same connection as the flush and a Commit carrying the bookkeeping;
// elsewhere (GPSPM) a PersistRequest that the target answers once it has
// persisted the range itself.
//
// Thread safety: all methods may be called from several threads; persists
// are then serialised. The bytes of a range must not change while its
// persist is in flight (as with pmem_persist, a concurrent store may or may
// not reach the replicas).
//
// Compatibility: the C++ API is kept source compatible within a major
// version; its structs may grow, so an application is rebuilt against the
// headers of the libpmirror it runs with. The C API (pmirror.h) is the
// stable ABI.
#pragma once

#include <pmirror/export.h>
#include <pmirror/version.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <pmirror/status.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pmirror {

struct ReplicaSpec {
  std::string address;
  uint16_t port = 7450;
  // "tcp" or "rdma"; anything else fails open() with kInvalidArgument.
  std::string transport = "tcp";
  std::string secret;  // the volume's shared secret on that target
  // The node's name in the cluster configuration, for status and logs;
  // empty: the replica is called by its address.
  std::string node;
};

enum class MethodPreference {
  kAuto,   // APM where the target guarantees it, GPSPM otherwise
  kGpspm,  // always ask the target to persist (Send/Recv)
};

// How a thread waiting for a replica's completions waits (also the
// target's session thread, from the volume's `poll` in the cluster file).
enum class PollMode {
  kEvent,     // sleep at once: no CPU while waiting, a wake-up per wait
  kAdaptive,  // spin about twice as long as recent waits took (<= 1 ms), then sleep
  kBusy,      // spin until done: lowest latency, a core per waiting thread
};

struct VolumeOptions {
  std::string name;        // the volume's name on the targets
  std::string local_path;  // the local copy: devdax, a file on fsdax, or a plain file
  uint64_t size = 0;       // 0: use the existing local copy's size
  bool create = false;     // create the local file if missing
  std::string identity;    // who we are to the targets (their allowed_peers)
  std::vector<ReplicaSpec> replicas;
  MethodPreference method = MethodPreference::kAuto;
  uint32_t max_in_flight = 32;  // asynchronous persists outstanding before persist_async waits
  PollMode poll = PollMode::kAdaptive;
  std::chrono::milliseconds connect_timeout{5000};
  // How long a persist waits for a replica before calling it failed.
  std::chrono::milliseconds operation_timeout{10000};
  // While idle, each replica is pinged this often, so that the target keeps
  // the session and a dead target is noticed.
  std::chrono::milliseconds heartbeat_interval{2000};
  // Replicas that must acknowledge a persist before it returns; 0: all.
  // A persist returns as soon as `ack` in-sync replicas hold it; the others
  // get it too, without being waited for, and one that cannot take more
  // (it stopped answering) lags: its ranges are recorded dirty instead.
  // A lost or lagging replica is reconnected / resynced in the background
  // (backoff with jitter) and brought up to date before it counts again.
  uint32_t ack = 0;
  std::chrono::milliseconds reconnect_initial{200};
  std::chrono::milliseconds reconnect_max{10000};
  // Bytes copied per step when bringing a reconnected replica up to date;
  // the application's persists run between steps.
  uint64_t resync_step = 1ull << 20;

  // --- recovery (/usr/share/doc/pmirrord/replica-recovery.md) ---
  // The local copy's metadata pool (generations, dirty bitmaps, activity
  // log); empty: next to the local copy, <local_path>.pmirror (devdax:
  // /var/lib/pmirror/<name>.pmirror).
  std::string metadata_path;
  uint64_t chunk_size = 64ull << 10;    // bytes per dirty bit (4 KiB .. 1 MiB)
  uint64_t resync_rate = 100ull << 20;  // bytes/s a resync may copy; 0: unlimited
  // A persist that cannot reach `ack` in-sync replicas: fail at once
  // (false), or wait until enough replicas are back in sync (true).
  bool block_when_insufficient = false;
  // Split brain (both copies moved on from a common generation): refuse
  // the replica (false), or copy the whole volume over it (true).
  bool overwrite_split_brain = false;
  // This node is not the configured primary: the copy must have been
  // promoted here (`pmirrorctl promote`) before it may be opened.
  bool require_promoted = false;
  // How long open() waits for replicas that need an initial or catch-up
  // resync before `ack` of them are in sync.
  std::chrono::milliseconds open_sync_timeout{600000};
  // The application persists the local copy itself, through its own
  // mapping of the same file, before each persist() (pmirror-run's libpmem
  // interposer: the real pmem_persist / pmem_msync already did it):
  // persist() then only mirrors the range, instead of flushing it again.
  bool local_persisted_by_caller = false;
  // Bytes set aside for persists started with a snapshot (persist_async
  // with `snapshot` bytes: the replicas get those, so the application may
  // store to the ranges again at once); every replica session registers
  // them. 0 (default): no snapshot persists. pmirror-run uses 4 MiB.
  uint64_t snapshot_buffer = 0;
};

// One range of a persist of several (Volume::persist_async).
struct PersistRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One replica's comparison by verify().
struct VerifyPeerResult {
  std::string peer;
  uint64_t chunks_compared = 0;
  uint64_t bytes_compared = 0;
  std::vector<std::pair<uint64_t, uint64_t>> mismatches;  // (offset, length), merged
  // Being written while verify looked (their local bytes kept changing):
  // not verified, not reported as differing. (offset, length), merged.
  std::vector<std::pair<uint64_t, uint64_t>> busy;
  uint64_t marked_dirty = 0;                              // chunks marked for resync (mark_dirty)
  Status status;  // not ok: the replica could not be compared
};

enum class ReplicaState { kConnected, kFailed, kClosed };
// "connected", "failed", "closed".
PMIRROR_EXPORT std::string_view replica_state_name(ReplicaState state);

struct ReplicaStatus {
  std::string address;            // host:port
  std::string transport = "tcp";  // "tcp" or "rdma"
  ReplicaState state = ReplicaState::kClosed;
  std::string connection;  // the supervisor's state: connecting, connected, syncing, ...
  std::string method;      // "one-sided-commit", "native-flush", "apm" or "gpspm"
  uint64_t generation = 0;
  uint64_t acknowledged_sequence = 0;  // highest sequence durable on the replica
  uint64_t resynced_bytes = 0;         // copied by the last resync
  std::string last_error;
};

// Where libpmirror's log lines go. By default: stderr (never stdout), at
// the threshold that PMIRROR_LOG_LEVEL names (trace, debug, info -- the
// default --, warn, error, critical, off).
enum class LogLevel : int { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };
// One line: its level and its text (no time stamp, no level, no newline).
// Called from any of libpmirror's threads, one line at a time; it must not
// call libpmirror.
using LogFunction = std::function<void(LogLevel level, std::string_view message)>;
// Lines at or above the threshold go to `function`; an empty one sends them
// to stderr again. The threshold is kept.
PMIRROR_EXPORT void set_log_function(LogFunction function);
// Lines below `threshold` are dropped (kOff: all). Overrides PMIRROR_LOG_LEVEL.
PMIRROR_EXPORT void set_log_threshold(LogLevel threshold);

class PMIRROR_EXPORT Volume {
 public:
  // Maps the local copy, connects and authenticates to every replica (in
  // parallel), and checks that each replica's region has the local size.
  // Errors: kInvalidArgument (an option out of range, an unknown transport,
  // a replica's region of another size), kPermissionDenied (wrong secret or
  // identity, a copy that must be promoted first), kNotFound (the target
  // has no such volume), kBusy (another writer), kSplitBrain,
  // kFailedPrecondition (a replica was promoted: this copy is no longer
  // the primary), kFenced (a promotion elsewhere fenced this primary out),
  // kConnectionError / kTimeout (fewer than `ack` replicas
  // reachable in time), kIoError (the local copy or its metadata). The
  // message names every replica at fault and why; nothing is left open.
  // Options with no replica open, but mirror nothing: every persist is
  // durable on the local copy only (a warning is logged; status says
  // local_only).
  static Result<std::unique_ptr<Volume>> open(const VolumeOptions& options);
  // Opens `volume` as the cluster configuration file describes it: this
  // node (`node`, or the one named like this host) must hold a copy; the
  // replicas, secret, ack policy and timers come from the file. Errors: as
  // open(), and kConfigError (the file cannot be read or is wrong, or it
  // has no such node or volume, or this node holds no copy of it).
  static Result<std::unique_ptr<Volume>> open_from_config(const std::string& config_path,
                                                          const std::string& volume,
                                                          const std::string& identity,
                                                          const std::string& node = "");
  // The same, with `adjust` applied to the options the file gives before
  // the volume is opened (e.g. local_persisted_by_caller).
  static Result<std::unique_ptr<Volume>> open_from_config(
      const std::string& config_path, const std::string& volume, const std::string& identity,
      const std::string& node, const std::function<void(VolumeOptions&)>& adjust);
  // Drains, lets a connected replica that is behind catch up (up to
  // operation_timeout), says Goodbye, disconnects.
  ~Volume();
  Volume(const Volume&) = delete;
  Volume& operator=(const Volume&) = delete;

  std::byte* data() const;
  uint64_t size() const;
  bool is_pmem() const;

  // Durable locally and on `ack` in-sync replicas (default every replica)
  // when it returns ok. Errors: kInvalidArgument (range outside the
  // volume); kConnectionError / kTimeout when fewer than `ack` replicas
  // acknowledged it, naming each replica that did not and why; kFenced
  // once a target said another copy was promoted (then every later
  // persist fails too: pmirror-promoter(8)).
  Status persist(uint64_t offset, uint64_t length);
  // memcpy into the mapping, then persist. Errors: as persist().
  Status write(uint64_t offset, const void* source, uint64_t length);

  // Starts a persist and returns its sequence number; does not wait.
  // Ordered: on every replica it is durable only after every persist
  // started before it (/usr/share/doc/pmirrord/protocol.md, "Ordering"), so a program may
  // start its ordering points with it and wait only where its state is
  // seen (wait / drain). The bytes a replica gets are those the range
  // holds when the persist is posted: do not store to it until it is
  // waited for (or use a snapshot, below). Errors: as persist(), and
  // kInvalidArgument for an empty range.
  Result<uint64_t> persist_async(uint64_t offset, uint64_t length);
  // One persist of `count` ranges (one sequence, one flush, one commit
  // record), ordered as above; ranges may be empty (skipped) but not all.
  // With `snapshot` (the ranges' bytes, concatenated in range order: as
  // many bytes as the ranges hold): the replicas get these bytes, copied
  // before it returns, and the application may store to the ranges again
  // at once; needs VolumeOptions::snapshot_buffer (kFailedPrecondition
  // without, kInvalidArgument for a range larger than it). The local copy
  // is persisted as it is now (unless local_persisted_by_caller).
  Result<uint64_t> persist_async(const PersistRange* ranges, size_t count,
                                 const void* snapshot = nullptr);
  // Several persists started as one: `groups` groups, group i being the
  // next group_sizes[i] ranges of `ranges` (the sizes add up to `count`).
  // Each group is durable on a replica only once the groups before it are,
  // as if each were a persist_async of its own, yet over APM they share one
  // sequence, one commit record and one wait (the flush between two groups
  // is posted at once, not waited for, or not posted where the target
  // declares placement order); a replica using GPSPM takes them as a
  // persist each. The sequence returned stands for them all. Ranges and
  // snapshot as above. Errors: as above; kInvalidArgument when the group
  // sizes do not add up to `count`.
  Result<uint64_t> persist_ordered_async(const PersistRange* ranges, size_t count,
                                         const uint32_t* group_sizes, size_t groups,
                                         const void* snapshot = nullptr);
  // Returns once every persist up to `sequence` is durable on `ack`
  // replicas (as persist). Errors: as persist().
  Status wait(uint64_t sequence);
  Status drain();  // wait for everything started so far

  // Starts a resync of `peer` (node name or host:port) now: its dirty
  // chunks, or with `full` every chunk. Errors: kNotFound (no such
  // replica), kFailedPrecondition (it is not connected).
  Status resync(const std::string& peer, bool full);
  // Compares the local copy with the replicas (`peer` empty: every
  // connected one) chunk by chunk, by XXH3-64 computed on each side.
  // Chunks that differ are checked again with nothing in flight to the
  // replica, until they differ twice with the same local bytes (reported
  // and, with `mark_dirty`, marked for resync, which then starts), are
  // equal, or keep changing (reported busy: the application is writing
  // there). Chunks already recorded dirty for a replica are not reported.
  // Errors: kNotFound (no such
  // replica), kFailedPrecondition (no connected replica to compare); a
  // replica that fails during the comparison has its own status.
  Result<std::vector<VerifyPeerResult>> verify(const std::string& peer, bool mark_dirty);

  std::vector<ReplicaStatus> replicas() const;
  // The status object of pmirror_status(3) for this volume (role primary).
  std::string status_json() const;

  class Impl;  // libpmirror's own

 private:
  explicit Volume(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pmirror
