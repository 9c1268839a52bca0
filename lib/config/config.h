// The cluster configuration (YAML, yaml-cpp): ONE file, the same on every
// node, describing the nodes, the volumes (who is primary, who holds
// replicas, how many must acknowledge a persist) and the daemon settings.
// docs/config.md is the reference; config/cluster.example.yaml a documented
// three-node example.
//
//   daemon: {control_socket: /run/pmirror/pmirrord.sock, log_level: info}
//   nodes:
//     - {name: node1, address: 10.0.0.1, transport: rdma}
//     - {name: node2, address: 10.0.0.2, transport: rdma}
//   volumes:
//     - name: db0
//       size: 1GiB
//       primary: node1            # where the application (libpmirror) runs
//       replicas: [node2]         # where pmirrord serves copies
//       path: /dev/dax0.0         # or paths: {node1: ..., node2: ...}
//       allowed_peers: [app1]
//       secret_file: /etc/pmirror/db0.secret
//       chunk: 64KiB              # recovery: bytes per dirty bit
//       resync_rate: 100MiB/s     # or unlimited
//       after_split_brain: refuse # or overwrite_replica
//       metadata: {node2: /mnt/pmem/db0.pmirror}  # default: beside the data
//
// Parsing is strict: unknown keys (with a "did you mean"), wrong types and
// every cross-reference mistake are errors, all of them collected, each as
// "FILE:LINE:COL: where: what". Secret files are read only where they are
// needed (daemon_config_for / initiator_plan / check_cluster_file), because
// a node need not hold the secrets of volumes it takes no part in.
//
// How a node uses it:
//   pmirrord:   load_cluster_config -> resolve_node -> daemon_config_for
//   libpmirror: load_cluster_config -> resolve_node -> initiator_plan
//   pmirrorctl config check: check_cluster_file
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "transport/kind.h"

namespace pmirror::config {

constexpr uint16_t kDefaultPort = 7450;

// The largest volume, and the most one node may hold in all (pmirrord maps
// every copy of its node at once): half of the 128 TiB (2^47 bytes) of user
// address space a process has on x86-64, so that the mappings fit beside
// everything else in the process.
constexpr uint64_t kMaxVolumeSize = 64ull << 40;
// Problems listed at most in one report; the rest are counted
// ("... and N more problems").
constexpr size_t kMaxReportedProblems = 50;
// YAML nodes a configuration may have with its aliases expanded; a real
// cluster file has a few thousand. Bounds the work an alias bomb causes.
constexpr size_t kMaxDocumentNodes = 100000;

// APM over rdma is only correct where the NIC writes straight into the
// persistence domain (DDIO off or eADR). auto: promise it when the volume is
// pmem; on: always (operator asserts the platform); off: never (GPSPM only).
enum class ApmPolicy { kAuto, kOn, kOff };
// The fabric's own persistence verbs (rdma devices with FLUSH and ATOMIC
// WRITE, docs/protocol.md section 5): auto: one-sided commit where the
// device and the copy allow it, else native flush; flush: native flush
// only (bookkeeping by Send); off: neither (APM's Read, or GPSPM).
enum class NativePersistence { kAuto, kFlush, kOff };

// What a primary does when fewer than `ack` replicas are reachable.
// kFail: persists return an error; kBlock: persists wait for replicas.
enum class InsufficientPolicy { kFail, kBlock };
// What a primary does on meeting a replica whose copy also moved on from
// their common generation (docs/replica-recovery.md).
enum class SplitBrainPolicy {
  kRefuse,            // report it, keep both copies, do not sync (default)
  kOverwriteReplica,  // copy the whole volume from the primary over the replica
};

// Where a value was given in the file, for problems found after parsing
// (a file shared with another use, ...): "FILE:LINE:COL" and the key path
// ("nodes[1].state_pool"). Both empty for a default.
struct Origin {
  std::string at;
  std::string key;
};

// "host:port" (IPv6 as "[::1]:9942").
struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;
};

// The `daemon` section: settings of every node's pmirrord. A node entry may
// override state_pool, control_socket, log_level, metrics, lease_dir (see
// NodeConfig::daemon); heartbeats and reconnects are cluster-wide because
// peers must agree on them.
struct DaemonSettings {
  std::string control_socket = "/run/pmirror/pmirrord.sock";
  std::string log_level = "info";
  std::optional<HostPort> metrics;  // absent: no metrics endpoint
  std::string state_pool = "/var/lib/pmirror/pmirrord.state";
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  std::chrono::milliseconds reconnect_initial{200};
  std::chrono::milliseconds reconnect_max{10000};
  // Where state_pool and control_socket were given (empty: the default).
  Origin state_pool_origin;
  Origin control_socket_origin;
  // Peers not yet authenticated (docs/config.md#daemon): time for each
  // handshake stage, how many are kept at once (in all, from one address).
  std::chrono::milliseconds handshake_timeout{5000};
  uint32_t max_unauthenticated = 64;
  uint32_t max_unauthenticated_per_source = 16;
  // Where this node's pmirror-promoter publishes the lease deadline of each
  // volume it holds the lease of (<lease_dir>/<volume>.lease), and where
  // libpmirror on this node reads it (docs/failover.md, section 2).
  std::string lease_dir = "/run/pmirror";
};

// Automatic failover (docs/failover.md): which cluster engine decides which
// copy is primary. kNone: an operator promotes by hand.
enum class FailoverEngine { kNone, kEtcd, kPacemaker };

// `failover.etcd`: the promoter's etcd (v3 JSON gateway) and its timing.
// The timing rule renew + 2 * timeout + margin <= ttl, ttl >= 3 s, is
// checked when the file is loaded.
struct EtcdSettings {
  std::vector<std::string> endpoints;  // "http://127.0.0.1:2379", "https://..."
  std::string prefix = "/pmirror";     // keys live under <prefix>/<cluster name>/
  std::chrono::milliseconds ttl{10000};
  std::chrono::milliseconds renew{2000};
  std::chrono::milliseconds timeout{2000};  // one etcd request, all endpoints tried
  std::chrono::milliseconds margin{1000};
  std::string tls_ca;  // empty: the system's CAs (https) or no TLS (http)
  std::string tls_cert;
  std::string tls_key;
  // "FILE:LINE:COL" of each tls file (empty when not given), for problems
  // found after parsing (check_cluster_file reads them).
  std::string tls_ca_at;
  std::string tls_cert_at;
  std::string tls_key_at;
};

struct FailoverSettings {
  FailoverEngine engine = FailoverEngine::kNone;
  EtcdSettings etcd;
  Origin origin;  // the `failover` section
};

// A volume's `failover:` entry: how the promoter starts and stops the
// application on the node that becomes (or stops being) its primary. At
// most one of hook_unit and start_command; none: the promoter promotes and
// holds the lease, something else starts the application.
struct VolumeFailover {
  std::string hook_unit{};      // a systemd unit: systemctl start / stop
  std::string start_command{};  // or the application, run with /bin/sh -c
  std::string stop_command{};
};

struct NodeConfig {
  std::string name;
  std::string address;  // where peers reach it
  uint16_t port = kDefaultPort;
  transport::Kind transport = transport::Kind::kTcp;
  std::string listen;  // address pmirrord binds; defaults to `address`
  // The cluster's daemon settings with this node's overrides applied.
  DaemonSettings daemon;
  Origin origin;  // the node's entry ("nodes[1]")
};

struct ClusterVolume {
  std::string name;
  uint64_t size = 0;                  // required, a multiple of 4096
  std::string primary;                // node name
  std::vector<std::string> replicas;  // node names, in file order
  uint32_t ack = 0;                   // 1..replicas.size(); default all
  InsufficientPolicy on_insufficient = InsufficientPolicy::kFail;
  std::map<std::string, std::string> paths;  // node -> path, for primary and every replica
  bool create = false;
  std::vector<std::string> allowed_peers;
  ApmPolicy apm = ApmPolicy::kAuto;
  NativePersistence native_persistence = NativePersistence::kAuto;
  // How the primary's and the targets' threads wait for this volume's
  // completions (`poll: busy | adaptive | event`).
  transport::PollMode poll = transport::PollMode::kAdaptive;
  std::string secret;       // inline `secret`; empty when `secret_file` is used
  std::string secret_file;  // read by daemon_config_for / initiator_plan
  // "FILE:LINE:COL" of the secret_file value and of each node's path, for
  // problems found after parsing (reading the secret, checking a file).
  std::string secret_file_at;
  std::map<std::string, std::string> path_at;
  // Recovery (docs/replica-recovery.md).
  uint64_t chunk = 64 * 1024;           // bytes per dirty bit: 4KiB..1MiB, a power of two
  uint64_t resync_rate = 100ull << 20;  // bytes/s a resync may copy; 0: unlimited
  SplitBrainPolicy after_split_brain = SplitBrainPolicy::kRefuse;
  // node -> the copy's metadata pool, for every node holding a copy (as
  // `paths`): the node's `metadata:` entry, else the default of
  // metadata::default_metadata_path (`<path>.pmirror`, or
  // /var/lib/pmirror/<volume>.pmirror for a devdax path, /dev/dax*).
  std::map<std::string, std::string> metadata_paths;
  // node -> "FILE:LINE:COL" of its `metadata:` entry, or of its data path
  // (path_at) when the default is used.
  std::map<std::string, std::string> metadata_at;
  VolumeFailover failover;
};

struct ClusterConfig {
  std::string source;  // the file name, for messages
  std::string name;    // `cluster.name`, may be empty
  DaemonSettings daemon;
  FailoverSettings failover;
  std::vector<NodeConfig> nodes;
  std::vector<ClusterVolume> volumes;

  const NodeConfig* find_node(std::string_view name) const;
  const ClusterVolume* find_volume(std::string_view name) const;
};

// ------------------------------------------------------ what pmirrord runs

// One volume as a target serves it (lib/target).
struct VolumeConfig {
  std::string name;
  std::string path;  // this node's path
  uint64_t size = 0;
  bool create = false;
  std::vector<std::string> allowed_peers;
  std::string secret;  // resolved: from `secret` or the contents of `secret_file`
  ApmPolicy apm = ApmPolicy::kAuto;
  NativePersistence native_persistence = NativePersistence::kAuto;
  transport::PollMode poll = transport::PollMode::kAdaptive;  // the session threads'
  std::string metadata_path;                                  // this node's copy metadata pool
  uint64_t chunk = 64 * 1024;
  std::string primary;             // the primary named in the file
  std::vector<std::string> peers;  // the volume's other nodes, primary first, then replicas
  // True when this node is the configured primary: pmirrord holds the
  // volume too (to serve it after a promote elsewhere).
  bool configured_primary = false;
};

// Everything one node's pmirrord needs; built by daemon_config_for.
struct DaemonConfig {
  std::string node;  // this node's name
  std::string listen_address = "127.0.0.1";
  uint16_t port = kDefaultPort;
  transport::Kind transport = transport::Kind::kTcp;
  std::string state_pool = "/var/lib/pmirror/pmirrord.state";
  std::string log_level = "info";
  std::string control_socket = "/run/pmirror/pmirrord.sock";
  std::optional<HostPort> metrics;
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  std::chrono::milliseconds reconnect_initial{200};
  std::chrono::milliseconds reconnect_max{10000};
  std::chrono::milliseconds handshake_timeout{5000};
  uint32_t max_unauthenticated = 64;
  uint32_t max_unauthenticated_per_source = 16;
  // Every volume this node holds a copy of (as a replica or as the
  // configured primary), in file order, with this node's path.
  std::vector<VolumeConfig> volumes;
  // The whole cluster (peers, the volumes this node is primary of). Secrets
  // of volumes not in `volumes` are not read.
  ClusterConfig cluster;
};

// ------------------------------------------- what libpmirror needs (primary)

struct ReplicaEndpoint {
  std::string node;
  std::string address;
  uint16_t port = kDefaultPort;
  transport::Kind transport = transport::Kind::kTcp;
};

struct InitiatorPlan {
  std::string volume;
  std::string node;        // the node opening the volume (usually the configured primary)
  std::string local_path;  // that node's path
  uint64_t size = 0;
  bool create = false;
  std::string secret;  // resolved; the same on every replica
  std::vector<std::string> allowed_peers;
  // The volume's other nodes: the configured primary first (when `node`
  // is not it), then the replicas in file order.
  std::vector<ReplicaEndpoint> replicas;
  uint32_t ack = 0;
  InsufficientPolicy on_insufficient = InsufficientPolicy::kFail;
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  std::chrono::milliseconds reconnect_initial{200};
  std::chrono::milliseconds reconnect_max{10000};
  std::string metadata_path;  // the local copy's metadata pool
  uint64_t chunk = 64 * 1024;
  uint64_t resync_rate = 100ull << 20;
  transport::PollMode poll = transport::PollMode::kAdaptive;
  SplitBrainPolicy after_split_brain = SplitBrainPolicy::kRefuse;
  // True when `node` is the primary the file names; any other node may
  // open the volume only after `pmirrorctl promote` there.
  bool configured_primary = true;
  // Non-empty when a failover engine decides who is primary (etcd): the
  // lease deadline file of this node's promoter for this volume
  // (<lease_dir>/<volume>.lease). Persists fail with kLeaseLost once its
  // deadline has passed, and opening fails without it.
  std::string lease_file;
};

// ------------------------------------------------------------------- API

// Parses and validates everything that does not depend on the machine
// (secret files are not read). Errors are kConfigError, one problem per
// line, each "FILE:LINE:COL: where: what".
Result<ClusterConfig> load_cluster_config(const std::string& path);
Result<ClusterConfig> parse_cluster_config(const std::string& yaml_text,
                                           const std::string& source_name = "<config>");

// Which node this process is: `explicit_node` if given (it must be a node),
// otherwise the node whose name equals the host name (or its part before
// the first '.'). `hostname` empty: gethostname(). The error lists the node
// names and says to use --node.
Result<std::string> resolve_node(const ClusterConfig& cluster, std::string_view explicit_node,
                                 std::string_view hostname = {});

// pmirrord's configuration on `node`: its listen address/port/transport,
// effective daemon settings, and every volume it holds a copy of, replica
// or configured primary (secrets read here; every problem reported at
// once).
Result<DaemonConfig> daemon_config_for(const ClusterConfig& cluster, const std::string& node);

// What libpmirror on `node` needs to open `volume`; `node` must hold a copy
// of it (the configured primary, or a replica -- which may open it only
// once promoted there: configured_primary false).
Result<InitiatorPlan> initiator_plan(const ClusterConfig& cluster, const std::string& volume,
                                     const std::string& node);

// What pmirrord's start (and a reload) refuses on this host before it
// creates, maps or locks anything, in the start's own words: the start calls
// these first, and so do the checks (`pmirrorctl config check`, `pmirrord
// --check-config`, `pmirrorctl reload --dry-run`), so that a check passes
// only what a start takes.
// The state pool: its directory exists (and is writable, where the pool is
// to be created); it is a file or device, not a directory.
Status check_state_pool_path(const std::string& state_pool);
// A volume's copy on `node`: its directory exists (writable with create:
// true, for a missing file); an existing path is a regular file of the
// volume's size or a devdax device, readable and writable; the directory of
// its metadata pool exists.
Status check_volume_paths(const VolumeConfig& volume, const std::string& node);

// For `pmirrorctl config check FILE [--node NAME]`: every problem in the
// file, one "FILE:LINE:COL: where: what" string each; empty means valid.
// Beyond parsing it reads secret files and checks this host's paths as
// pmirrord's start would (check_state_pool_path, check_volume_paths) --
// for `node` (explicit, else the node
// matching this host name); when no node matches, every volume's secret
// file is read and no local file is checked, and `warnings` (if given)
// gets a line saying so: the file is valid, but pmirrord started here
// without --node would refuse it.
std::vector<std::string> check_cluster_file(const std::string& path, std::string_view node = {},
                                            std::vector<std::string>* warnings = nullptr);

// "64MiB", "1G", "4096" -> bytes. Suffixes K,M,G,T with optional "iB"/"B",
// all powers of 1024. Rejects negatives, fractions, overflow, junk.
Result<uint64_t> parse_size(std::string_view text);

// A rate: "100MiB/s" (a size, then "/s") -> bytes per second; "unlimited"
// or "0" -> 0 (no limit).
Result<uint64_t> parse_rate(std::string_view text);

// "200ms", "5s", "2m" -> milliseconds. A unit is required; whole numbers
// only; zero is allowed here (callers decide).
Result<std::chrono::milliseconds> parse_duration(std::string_view text);

// "127.0.0.1:9942", "[::1]:9942", "metrics.local:9942".
Result<HostPort> parse_host_port(std::string_view text);

}  // namespace pmirror::config
