// The target: what pmirrord runs. Per configured volume it maps the region
// (lib/region) and keeps the volume's bookkeeping in the state pool
// (lib/state); it listens on one transport and serves each initiator in its
// own session: authenticate, register the region on that connection only,
// then record Commits and answer PersistRequests until the initiator leaves.
// One writer per volume; a second is refused while the first is connected.
// While a session runs, the target holds the copy's metadata pool
// (lib/metadata) open: generations, consistent/promoted/clean; between
// sessions it is closed so that libpmirror on this node may open the copy
// as primary (after `pmirrorctl promote` here).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "metadata/metadata.h"
#include "supervisor/supervisor.h"

namespace pmirror::target {

struct TargetOptions {
  // A session that sends nothing for this long is ended (initiators send
  // heartbeats while idle), so a silently dead writer does not keep its
  // volume claimed for ever.
  std::chrono::milliseconds session_timeout{15000};
  // Admission of peers not yet authenticated (docs/architecture.md,
  // "Admission"): the transport's hello must complete within
  // handshake_timeout of the accept, and Hello through AuthResponse within
  // handshake_timeout after that. At most max_unauthenticated such
  // connections (max_unauthenticated_per_source from one address) are kept;
  // a new one makes room by closing the oldest.
  std::chrono::milliseconds handshake_timeout{5000};
  uint32_t max_unauthenticated = 64;
  uint32_t max_unauthenticated_per_source = 16;
  // How often a volume's progress (last applied sequence) is written to the
  // state pool while a session runs. A pmemobj transaction costs
  // milliseconds on a plain file; the data itself is durable regardless.
  std::chrono::milliseconds checkpoint_interval{100};
  // Every session state change (handshaking, connected, disconnected, ...).
  supervisor::EventSink on_event;
};

// What `status` shows about one initiator's session (kept a while after
// it ends, so that an operator sees who was there and why they left).
struct SessionStatus {
  std::string peer{};       // identity@address
  std::string transport{};  // the listener's: "tcp", "rdma"
  supervisor::PeerState state = supervisor::PeerState::kHandshaking;
  supervisor::SystemTime since{};
  std::string reason{};  // why it is in that state
  uint64_t acknowledged_sequence = 0;
  uint64_t persists = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
};

// This node's copy of a volume, from its metadata pool (lib/metadata).
struct CopyStatus {
  std::optional<metadata::CopyInfo> info{};  // absent when the pool could not be read
  // A process on this node holds the copy open as primary (the pool is
  // locked): nothing more can be read.
  bool in_use_by_local_primary = false;
  std::string error{};  // why the pool could not be read, otherwise
};

// What `status` shows about one volume.
// One other node of the volume, told by a promotion that it is fenced
// (docs/failover.md): fenced, or why not.
struct FenceOutcome {
  std::string node{};
  bool fenced = false;
  uint32_t sessions_ended = 0;  // the old primary's sessions it ended there
  std::string error{};          // when not fenced: the last attempt's
  // Not fenced yet and still tried, in the background (docs/failover.md,
  // section 1): no answer so far, or the last attempt failed.
  bool pending = false;
  uint32_t attempts = 0;  // made so far (0: the first has not answered)
};

struct VolumeStatus {
  std::string name{};
  std::string path{};
  uint64_t size = 0;
  bool is_pmem = false;
  std::string backing{};  // region::backing_name: "devdax", "fsdax", "file"
  uint32_t methods = 0;   // protocol::PersistMethod bits offered
  std::string writer{};   // identity@address of the connected writer, empty if none
  uint64_t generation = 0;
  uint64_t last_sequence = 0;     // last sequence recorded in the state pool
  uint64_t applied_sequence = 0;  // last sequence the writer's session applied
  // Empty, or why the volume failed (a write-back error, a fault on its
  // mapping): it then takes no writer until a reload or restart reopens it.
  std::string failure{};
  bool down_by_operator = false;          // `pmirrorctl down`: serves no session until `up`
  std::vector<SessionStatus> sessions{};  // the newest first
  CopyStatus copy{};
  // The last promotion on this node: each other node's fence, and when
  // (empty: never promoted here since pmirrord started).
  std::vector<FenceOutcome> fences{};
  std::chrono::system_clock::time_point fences_at{};
};

// Connections not yet authenticated (docs/architecture.md, "Admission"):
// the transport's counts (its hello stage, evictions) and the target's
// (Hello through AuthResponse).
struct AdmissionStatus {
  uint64_t unauthenticated = 0;
  uint64_t evicted = 0;
  uint64_t timed_out = 0;
  uint64_t dropped = 0;
  uint64_t refused = 0;
  uint64_t authentication_failures = 0;
  uint32_t max_unauthenticated = 0;
  uint32_t max_unauthenticated_per_source = 0;
  std::chrono::milliseconds handshake_timeout{0};
};

struct TargetStatus {
  std::string node{};
  int pid = 0;  // pmirrord's
  supervisor::SystemTime started_at{};
  std::vector<VolumeStatus> volumes{};
  AdmissionStatus admission{};
};

// What `pmirrorctl promote` did. already_promoted: nothing changed, and
// `previous` is the newest generation in the copy's history.

struct PromoteResult {
  std::string volume{};
  std::string node{};
  uint64_t generation = 0;
  uint64_t previous = 0;
  bool forced = false;
  bool already_promoted = false;
  // Every other node of the volume, in the file's order.
  std::vector<FenceOutcome> fences{};
};

// What a reload did, or with dry_run would do: volume names, each list in
// the new configuration's order (removed: the old one's).
struct ReloadResult {
  std::vector<std::string> added{};
  std::vector<std::string> changed{};  // reopened: new settings, or failed before
  std::vector<std::string> removed{};
  bool dry_run = false;
};

// What `pmirrorctl demote` did: the copy is a replica at `generation`.
struct DemoteResult {
  std::string volume{};
  std::string node{};
  uint64_t generation = 0;
};

// What `pmirrorctl down` / `up` did.
struct DownResult {
  std::string volume{};
  std::string node{};
  bool down = false;            // the volume's state now
  bool changed = false;         // false: it was so already
  uint32_t sessions_ended = 0;  // down: the writer's session ended (0 or 1)
};

class Target {
 public:
  // Maps every volume, opens (creating if needed) the state pool and binds
  // the listener. Fails without serving anything if any volume cannot be
  // served: a half-started daemon hides mistakes.
  static Result<std::unique_ptr<Target>> start(const config::DaemonConfig& config,
                                               const TargetOptions& options = {});
  ~Target();
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  // Accepts and serves initiators until stop(). Returns when every session
  // has ended and the state pool has been brought up to date.
  Status run();
  // Thread-safe; makes run() return. Sessions are told Goodbye-style by
  // closing their connections.
  void stop();

  uint16_t port() const;
  TargetStatus status() const;

  // `pmirrorctl promote VOLUME [--force]` on this node: this node's copy
  // starts a new data generation and becomes the volume's primary (an
  // application on this node may then open it through libpmirror); from
  // then on the target refuses sessions for the volume until demote().
  // Peers named in the volume's config start being tracked at the old
  // generation. Errors: kNotFound (no such volume here); kBusy (a writer is
  // connected -- without force; with force its session is ended, refused
  // with kClosed -- or the copy is open as primary by a local process);
  // kFailedPrecondition without force when the copy is inconsistent (an
  // interrupted resync) or never received data. Promoting a promoted copy
  // changes nothing (already_promoted). Then every other node of the
  // volume is fenced (docs/failover.md): its copy takes writes only from
  // this primary's lineage, and the old primary's session there ends with
  // kFenced. Fences that fail are in the result (`fences`), not an error:
  // the promotion stands, and each is retried in the background until it
  // lands (FenceOutcome::pending). `fence_wait`: how long to wait for the
  // fences' first answers (none: as long as they take, up to
  // heartbeat_timeout to reach a node); the promoter's takeover passes a
  // short one, so that it never waits for the node it replaces.
  Result<PromoteResult> promote(const std::string& volume, bool force,
                                std::optional<std::chrono::milliseconds> fence_wait = {});
  // `pmirrorctl demote VOLUME`: the copy is a replica again (sessions are
  // accepted). kBusy while a local process has the copy open as primary.
  Result<DemoteResult> demote(const std::string& volume);
  // `pmirrorctl down VOLUME` (down) / `up VOLUME`: down ends the writer's
  // session (told why) and refuses new ones (kBusy, saying it is down by an
  // operator and how to bring it up) until up. The other volumes are not
  // touched. Runtime state: a reload keeps it, a restart forgets it.
  // kNotFound: no such volume here.
  Result<DownResult> set_down(const std::string& volume, bool down);

  // Applies a new configuration without touching what did not change:
  // volumes only in the new one are mapped and served, volumes gone from it
  // are dropped (their session ends), volumes whose settings changed, and
  // failed volumes, are reopened. The listener settings cannot change on
  // reload. On any error nothing is changed and the old configuration stays
  // in force -- except that a failed volume which still cannot be reopened
  // stays failed (logged) while the rest applies. `dry_run`: the checks
  // that need no file (the listener, the state pool), and what would be
  // added, changed and removed; nothing is opened or changed.
  Result<ReloadResult> reload(const config::DaemonConfig& config, bool dry_run = false);

  class Impl;

 private:
  // `chosen`: the new generation (the other copies were fenced with it
  // already); 0: a random one.
  Result<PromoteResult> promote_copy(const std::string& volume, bool force, uint64_t chosen);
  explicit Target(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The control edge (target_json.cpp): the objects of docs/control.md that
// pmirrord answers `status`, `promote` and `demote` with, and that its
// metrics are made from. Nothing else in the target speaks JSON.
nlohmann::json to_json(const TargetStatus& status);
nlohmann::json to_json(const PromoteResult& result);
nlohmann::json to_json(const DemoteResult& result);
nlohmann::json to_json(const DownResult& result);
nlohmann::json to_json(const ReloadResult& result);

}  // namespace pmirror::target
