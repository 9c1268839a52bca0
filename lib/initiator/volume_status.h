// An open volume's status as typed values, built by its pieces (Peers, the
// Resyncer, the PersistLedger) with the volume mutex held. The control edge
// (control_edge.cpp) alone turns it into the JSON object of
// docs/control.md; nothing else in libpmirror makes status JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "supervisor/supervisor.h"

namespace pmirror::initiator {

struct ResyncProgress {
  uint64_t done_bytes = 0;
  uint64_t left_bytes = 0;
  uint64_t total_bytes = 0;  // done + left
  uint64_t rate_bytes_per_s = 0;
  std::optional<uint64_t> eta_seconds;  // unknown until a copy completed
  bool full = false;
};

// The first pass of a verify (each chunk's hash on both sides); the second
// look at the suspects is not counted.
struct VerifyProgress {
  uint64_t done_bytes = 0;
  uint64_t total_bytes = 0;
};

struct PeerStatus {
  std::string name;
  std::string address;  // host:port
  std::string transport;
  supervisor::PeerStateMachine::Snapshot connection{};
  std::string method;  // "apm", "gpspm"; empty without a session
  uint64_t acknowledged_sequence = 0;
  uint64_t lag = 0;  // persists started and not acknowledged by it
  uint64_t persists = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  uint64_t dirty_chunks = 0;
  uint64_t dirty_bytes = 0;
  // The generation it was left behind at (0: in sync); absent when the
  // metadata has no record of it.
  std::optional<uint64_t> behind_since_generation;
  uint64_t generation = 0;  // its copy's, as its last session said (0: unknown)
  uint64_t resynced_chunks = 0;
  uint64_t resynced_bytes = 0;
  uint64_t resyncs = 0;
  std::optional<ResyncProgress> resync;  // while one runs
  std::optional<VerifyProgress> verify;  // while a verify compares it
  supervisor::LatencyWindow::Percentiles latency_us;
  // From the copy metadata: every chunk must be copied to it (a new or
  // replaced replica), and whether a session with it ever opened.
  bool full_sync_pending = false;
  bool never_seen = false;
  bool by_operator = false;  // disconnected by `pmirrorctl disconnect`
};

// The peer's disk state as the primary knows it, in DRBD's words
// (docs/pmirrorctl.md, "Disk states"): "UpToDate", "Outdated",
// "Inconsistent" or "Unknown".
std::string_view disk_state(const PeerStatus& peer);

// The failover lease this primary writes under (docs/failover.md, section 2).
struct LeaseStatus {
  std::string file;
  uint64_t remaining_ms = 0;  // until the deadline; 0: lapsed or given up
};

struct VolumeStatus {
  std::string name;
  uint64_t size = 0;
  std::string path;
  std::string backing;
  std::string metadata;
  uint64_t generation = 0;
  uint64_t chunk_size = 0;
  bool promoted = false;
  uint64_t last_sequence = 0;
  uint64_t acknowledged_sequence = 0;
  uint32_t ack_required = 0;
  uint32_t in_sync = 0;
  std::string identity;
  supervisor::SystemTime opened_at{};
  std::optional<LeaseStatus> lease;  // none: the volume needs no lease
  std::vector<PeerStatus> peers;
};

// What `pmirrorctl disconnect` / `connect` did to one replica.
struct PeerSwitched {
  std::string peer;
  bool changed = false;  // false: it was so already
};

// What `pmirrorctl resync` is told once a resync started.
struct ResyncStarted {
  std::string peer;
  bool full = false;
  uint64_t dirty_bytes = 0;  // what it will copy
};

}  // namespace pmirror::initiator
