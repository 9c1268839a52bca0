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
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
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

// What `status` shows about one volume.
struct VolumeStatus {
  std::string name;
  std::string path;
  uint64_t size = 0;
  bool is_pmem = false;
  uint32_t methods = 0;  // protocol::PersistMethod bits offered
  std::string writer;    // identity@address of the connected writer, empty if none
  uint64_t generation = 0;
  uint64_t last_sequence = 0;  // last sequence recorded in the state pool
  // Empty, or why the volume failed (a write-back error, a fault on its
  // mapping): it then takes no writer until a reload or restart reopens it.
  std::string failure;
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
  std::vector<VolumeStatus> status() const;
  // The status object of docs/control.md (volumes with role "replica").
  std::string status_json() const;

  // `pmirrorctl promote VOLUME [--force]` on this node: this node's copy
  // starts a new data generation and becomes the volume's primary (an
  // application on this node may then open it through libpmirror); from
  // then on the target refuses sessions for the volume until demote().
  // Peers named in the volume's config start being tracked at the old
  // generation. Errors: kNotFound (no such volume here); kBusy (a writer is
  // connected -- without force; with force its session is ended, refused
  // with kClosed -- or the copy is open as primary by a local process);
  // kFailedPrecondition without force when the copy is inconsistent (an
  // interrupted resync) or never received data. Returns
  //   {"volume", "node", "generation": "<16 hex>", "previous": "<16 hex>",
  //    "promoted": true, "forced": bool, "already_promoted": bool}
  // (already promoted: nothing changes, "previous" is the newest history entry).
  Result<nlohmann::json> promote(const std::string& volume, bool force);
  // `pmirrorctl demote VOLUME`: the copy is a replica again (sessions are
  // accepted). kBusy while a local process has the copy open as primary.
  // Returns {"volume", "node", "promoted": false, "generation": "<16 hex>"}.
  Result<nlohmann::json> demote(const std::string& volume);

  // Applies a new configuration without touching what did not change:
  // volumes only in the new one are mapped and served, volumes gone from it
  // are dropped (their session ends), volumes whose settings changed, and
  // failed volumes, are reopened. The listener settings cannot change on
  // reload. On any error nothing is changed and the old configuration stays
  // in force -- except that a failed volume which still cannot be reopened
  // stays failed (logged) while the rest applies.
  Status reload(const config::DaemonConfig& config);

  class Impl;

 private:
  explicit Target(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pmirror::target
