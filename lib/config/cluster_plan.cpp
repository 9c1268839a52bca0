// What each node derives from a parsed cluster file (cluster.cpp parses
// it): the daemon's configuration (daemon_config_for), an initiator's plan
// for a volume (initiator_plan), which node this is (resolve_node), and
// `pmirrorctl config check`'s whole-file check with what only this host
// can see (secret files, existing files' sizes, shared files, free space).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "config/config_internal.h"

namespace pmirror::config {
namespace {

size_t volume_index(const ClusterConfig& cluster, const ClusterVolume& volume) {
  return static_cast<size_t>(&volume - cluster.volumes.data());
}

// The volume's secret: inline, or read from its secret_file. A problem is
// "FILE:LINE:COL: volumes[i].secret_file: what".
std::optional<std::string> volume_secret(const ClusterConfig& cluster, const ClusterVolume& volume,
                                         std::vector<Problem>& problems) {
  if (volume.secret_file.empty()) return volume.secret;
  std::string prefix = volume.secret_file_at + ": volumes[" +
                       std::to_string(volume_index(cluster, volume)) + "].secret_file: ";
  auto contents = read_secret_file(volume.secret_file);
  if (!contents.ok()) {
    problems.push_back(problem_from_text(cluster.source, prefix + contents.status().message()));
    return std::nullopt;
  }
  if (contents->size() < kMinSecretLength) {
    problems.push_back(problem_from_text(
        cluster.source, prefix + "the secret in " + volume.secret_file + " is too short (" +
                            std::to_string(contents->size()) + " characters); use at least " +
                            std::to_string(kMinSecretLength) +
                            " random characters, e.g. `openssl rand -base64 32 > " +
                            volume.secret_file + "`"));
    return std::nullopt;
  }
  return std::move(*contents);
}

bool takes_part(const ClusterVolume& volume, const std::string& node) {
  return volume.primary == node ||
         std::find(volume.replicas.begin(), volume.replicas.end(), node) != volume.replicas.end();
}

// The volume's nodes other than `node`: the configured primary first, then
// the replicas in file order.
std::vector<std::string> other_nodes(const ClusterVolume& volume, const std::string& node) {
  std::vector<std::string> out;
  if (volume.primary != node) out.push_back(volume.primary);
  for (const auto& replica : volume.replicas) {
    if (replica != node) out.push_back(replica);
  }
  return out;
}

// metadata_paths holds every node with a data path; fall back to the rule
// for a ClusterVolume built by hand.
std::string metadata_path_of(const ClusterVolume& volume, const std::string& node) {
  if (auto it = volume.metadata_paths.find(node); it != volume.metadata_paths.end()) {
    return it->second;
  }
  return default_metadata_path(volume.paths.at(node), volume.name);
}

// A devdax device at a node's path too small for the volume (it may be
// larger: the volume uses a prefix). The start finds it once mapped; a
// regular file's size is check_volume_paths's.
std::optional<std::string> local_size_problem(const std::string& path, uint64_t size) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;  // created or reported at start
  if (S_ISCHR(st.st_mode)) {
    std::ifstream sys("/sys/dev/char/" + std::to_string(major(st.st_rdev)) + ":" +
                      std::to_string(minor(st.st_rdev)) + "/size");
    uint64_t device_size = 0;
    if (sys >> device_size && device_size < size) {
      // The start's words (region::Region::map).
      return "devdax device " + path + " is " + std::to_string(device_size) +
             " bytes, smaller than the configured size " + std::to_string(size) +
             " bytes; lower size: or use 0";
    }
  }
  return std::nullopt;
}

// Why the promoter could not read `path` (a TLS file), or nothing.
std::optional<std::string> unreadable_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return "cannot read " + path + ": " + std::strerror(errno);
  struct stat st {};
  std::optional<std::string> problem;
  if (::fstat(fd, &st) != 0) {
    problem = "cannot read " + path + ": " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = path + " is not a regular file";
  } else if (st.st_size == 0) {
    problem = path + " is empty";
  }
  ::close(fd);
  return problem;
}

// <lease_dir>/<volume>.lease
std::string lease_file_path(std::string dir, const std::string& volume) {
  if (dir.empty() || dir.back() != '/') dir += '/';
  return dir + volume + ".lease";
}

}  // namespace

Result<std::string> resolve_node(const ClusterConfig& cluster, std::string_view explicit_node,
                                 std::string_view hostname) {
  std::string names = join(node_names(cluster));
  if (!explicit_node.empty()) {
    if (cluster.find_node(explicit_node) != nullptr) return std::string(explicit_node);
    return Status(Errc::kConfigError, "--node " + std::string(explicit_node) +
                                          ": no such node in " + cluster.source +
                                          "; nodes: " + names);
  }
  std::string host(hostname);
  if (host.empty()) {
    char buffer[HOST_NAME_MAX + 1] = {};
    if (::gethostname(buffer, sizeof buffer - 1) != 0) {
      return errno_status(Errc::kConfigError,
                          "cannot read this machine's host name (name the node with --node NAME)",
                          errno);
    }
    host = buffer;
  }
  if (cluster.find_node(host) != nullptr) return host;
  std::string short_name = host.substr(0, host.find('.'));
  if (cluster.find_node(short_name) != nullptr) return short_name;
  return Status(Errc::kConfigError, "this machine's host name '" + host + "' is not a node in " +
                                        cluster.source + " (nodes: " + names +
                                        "); say which node this is with --node NAME");
}

Result<DaemonConfig> daemon_config_for(const ClusterConfig& cluster, const std::string& node) {
  const NodeConfig* self = cluster.find_node(node);
  if (self == nullptr) {
    return Status(Errc::kConfigError, "no node '" + node + "' in " + cluster.source +
                                          "; nodes: " + join(node_names(cluster)));
  }
  DaemonConfig config;
  config.node = self->name;
  config.listen_address = self->listen;
  config.port = self->port;
  config.transport = self->transport;
  config.state_pool = self->daemon.state_pool;
  config.log_level = self->daemon.log_level;
  config.control_socket = self->daemon.control_socket;
  config.metrics = self->daemon.metrics;
  config.heartbeat_interval = self->daemon.heartbeat_interval;
  config.heartbeat_timeout = self->daemon.heartbeat_timeout;
  config.reconnect_initial = self->daemon.reconnect_initial;
  config.reconnect_max = self->daemon.reconnect_max;
  config.handshake_timeout = self->daemon.handshake_timeout;
  config.max_unauthenticated = self->daemon.max_unauthenticated;
  config.max_unauthenticated_per_source = self->daemon.max_unauthenticated_per_source;
  std::vector<Problem> problems;
  for (const auto& volume : cluster.volumes) {
    if (!takes_part(volume, node)) continue;
    auto secret = volume_secret(cluster, volume, problems);
    if (!secret) continue;
    VolumeConfig served;
    served.name = volume.name;
    served.path = volume.paths.at(node);
    served.size = volume.size;
    served.create = volume.create;
    served.allowed_peers = volume.allowed_peers;
    served.secret = std::move(*secret);
    served.apm = volume.apm;
    served.native_persistence = volume.native_persistence;
    served.metadata_path = metadata_path_of(volume, node);
    served.chunk = volume.chunk;
    served.poll = volume.poll;
    served.primary = volume.primary;
    served.peers = other_nodes(volume, node);
    served.configured_primary = volume.primary == node;
    config.volumes.push_back(std::move(served));
  }
  // Only clashes with this node's own files: another daemon on this host
  // refuses its own.
  for (auto& text : shared_file_problems(cluster, node, /*only_own=*/true)) {
    problems.push_back(problem_from_text(cluster.source, std::move(text)));
  }
  if (!problems.empty()) {
    sort_problems(problems);
    return problems_status(problems);
  }
  config.cluster = cluster;
  return config;
}

Result<InitiatorPlan> initiator_plan(const ClusterConfig& cluster, const std::string& volume,
                                     const std::string& node) {
  const ClusterVolume* found = cluster.find_volume(volume);
  if (found == nullptr) {
    std::vector<std::string> names;
    for (const auto& v : cluster.volumes) names.push_back(v.name);
    return Status(Errc::kConfigError,
                  "no volume '" + volume + "' in " + cluster.source + "; volumes: " + join(names));
  }
  if (!takes_part(*found, node)) {
    return Status(Errc::kConfigError,
                  "node '" + node + "' holds no copy of volume '" + volume + "' (" +
                      cluster.source + ": primary " + found->primary + ", replicas " +
                      join(found->replicas) +
                      "); libpmirror opens a volume on its primary node, or on a replica "
                      "promoted with `pmirrorctl promote " +
                      volume + "`");
  }
  std::vector<Problem> problems;
  auto secret = volume_secret(cluster, *found, problems);
  if (!secret) return problems_status(problems);
  InitiatorPlan plan;
  plan.volume = found->name;
  plan.node = node;
  plan.local_path = found->paths.at(node);
  plan.size = found->size;
  plan.create = found->create;
  plan.secret = std::move(*secret);
  plan.allowed_peers = found->allowed_peers;
  for (const auto& name : other_nodes(*found, node)) {
    const NodeConfig* replica = cluster.find_node(name);
    plan.replicas.push_back({replica->name, replica->address, replica->port, replica->transport});
  }
  plan.ack = found->ack;
  plan.on_insufficient = found->on_insufficient;
  plan.heartbeat_interval = cluster.daemon.heartbeat_interval;
  plan.heartbeat_timeout = cluster.daemon.heartbeat_timeout;
  plan.reconnect_initial = cluster.daemon.reconnect_initial;
  plan.reconnect_max = cluster.daemon.reconnect_max;
  plan.metadata_path = metadata_path_of(*found, node);
  plan.chunk = found->chunk;
  plan.resync_rate = found->resync_rate;
  plan.poll = found->poll;
  plan.after_split_brain = found->after_split_brain;
  plan.configured_primary = found->primary == node;
  if (cluster.failover.engine == FailoverEngine::kEtcd) {
    const NodeConfig* self = cluster.find_node(node);
    plan.lease_file = lease_file_path(
        self != nullptr ? self->daemon.lease_dir : cluster.daemon.lease_dir, found->name);
  }
  return plan;
}

std::vector<std::string> check_cluster_file(const std::string& path, std::string_view node,
                                            std::vector<std::string>* warnings) {
  auto text = read_config_file(path);
  if (!text.ok()) return {text.status().message()};
  std::vector<Problem> problems;
  ClusterConfig config = parse_collecting(*text, path, problems);

  std::string self;
  if (!node.empty()) {
    if (auto resolved = resolve_node(config, node); resolved.ok()) {
      self = *resolved;
    } else {
      problems.push_back({0, 0, resolved.status().message()});
    }
  } else if (auto resolved = resolve_node(config, {}); resolved.ok()) {
    self = *resolved;
  } else if (warnings != nullptr && !config.nodes.empty()) {
    warnings->push_back(path + ": warning: " + resolved.status().message() +
                        "; checked as no node in particular");
  }
  // What pmirrord's start on this node would refuse, in its words.
  if (const NodeConfig* node_config = self.empty() ? nullptr : config.find_node(self)) {
    Status pool = check_state_pool_path(node_config->daemon.state_pool);
    if (!pool.ok()) {
      const Origin& given = node_config->daemon.state_pool_origin;
      const std::string where =
          given.at.empty()
              ? node_config->origin.at + ": " + node_config->origin.key + ".state_pool (default)"
              : given.at + ": " + given.key;
      problems.push_back(problem_from_text(path, where + ": " + pool.message()));
    }
  }
  for (size_t i = 0; i < config.volumes.size(); ++i) {
    const ClusterVolume& volume = config.volumes[i];
    if (!self.empty() && !takes_part(volume, self)) continue;
    (void)volume_secret(config, volume, problems);
    if (self.empty()) continue;
    auto it = volume.paths.find(self);
    if (it == volume.paths.end()) continue;
    const std::string where =
        volume.path_at.at(self) + ": volumes[" + std::to_string(i) + "].paths." + self + ": ";
    VolumeConfig copy;
    copy.name = volume.name;
    copy.path = it->second;
    copy.size = volume.size;
    copy.create = volume.create;
    copy.metadata_path = metadata_path_of(volume, self);
    if (Status openable = check_volume_paths(copy, self); !openable.ok()) {
      problems.push_back(problem_from_text(path, where + openable.message()));
    } else if (volume.size != 0) {
      if (auto problem = local_size_problem(it->second, volume.size)) {
        problems.push_back(problem_from_text(path, where + *problem));
      }
    }
  }
  // The promoter's TLS files, where it runs: on a node holding a copy of
  // some volume (or, no node in particular, here).
  const EtcdSettings& etcd = config.failover.etcd;
  bool promoter_here = self.empty() || std::any_of(config.volumes.begin(), config.volumes.end(),
                                                   [&](const ClusterVolume& volume) {
                                                     return takes_part(volume, self);
                                                   });
  if (config.failover.engine == FailoverEngine::kEtcd && promoter_here) {
    for (const auto& [file, at, key] : {std::tuple{&etcd.tls_ca, &etcd.tls_ca_at, "ca"},
                                        std::tuple{&etcd.tls_cert, &etcd.tls_cert_at, "cert"},
                                        std::tuple{&etcd.tls_key, &etcd.tls_key_at, "key"}}) {
      if (file->empty()) continue;
      if (auto problem = unreadable_file(*file)) {
        problems.push_back(
            problem_from_text(path, *at + ": failover.etcd.tls." + key + ": " + *problem +
                                        " (pmirror-promoter reads it to reach etcd)"));
      }
    }
  }
  for (auto& text : shared_file_problems(config, self, /*only_own=*/false)) {
    problems.push_back(problem_from_text(path, std::move(text)));
  }
  if (!self.empty()) {
    for (auto& text : space_problems(config, self)) {
      problems.push_back(problem_from_text(path, std::move(text)));
    }
  }
  sort_problems(problems);
  cap_problems(problems);
  std::vector<std::string> out;
  for (auto& p : problems) out.push_back(std::move(p.text));
  return out;
}

}  // namespace pmirror::config
