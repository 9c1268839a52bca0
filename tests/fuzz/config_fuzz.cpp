// Fuzz harness: the cluster file parser (config::parse_cluster_config) on
// arbitrary text, as pmirrord reads it at start and on SIGHUP and as
// `pmirrorctl config check` does (docs/testing.md). Checks, besides
// memory safety, undefined behaviour, hangs and memory blow-ups (scripts/
// fuzz.sh runs it with -timeout and -rss_limit_mb):
//  - a refused file is a kConfigError whose message says something;
//  - an accepted file is consistent: every volume's primary and replicas
//    are nodes with a path, and, when its secrets are inline (secret files
//    are not read here), every node gets its daemon configuration and
//    every copy its initiator plan -- what validation promised.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "config/config.h"

namespace {

using namespace pmirror;

void require(bool condition) {
  if (!condition) std::abort();
}

void check_accepted(const config::ClusterConfig& cluster) {
  bool inline_secrets = true;
  for (const auto& volume : cluster.volumes) {
    require(cluster.find_volume(volume.name) == &volume);
    require(cluster.find_node(volume.primary) != nullptr);
    require(volume.paths.count(volume.primary) == 1);
    for (const auto& replica : volume.replicas) {
      require(cluster.find_node(replica) != nullptr);
      require(volume.paths.count(replica) == 1);
    }
    require(volume.ack >= 1 && volume.ack <= volume.replicas.size());
    if (!volume.secret_file.empty()) inline_secrets = false;
  }
  for (const auto& node : cluster.nodes) {
    auto resolved = config::resolve_node(cluster, node.name);
    require(resolved.ok() && *resolved == node.name);
  }
  if (!inline_secrets) return;
  for (const auto& node : cluster.nodes) {
    auto daemon = config::daemon_config_for(cluster, node.name);
    require(daemon.ok());
  }
  for (const auto& volume : cluster.volumes) {
    require(config::initiator_plan(cluster, volume.name, volume.primary).ok());
    for (const auto& replica : volume.replicas) {
      require(config::initiator_plan(cluster, volume.name, replica).ok());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto cluster = config::parse_cluster_config(text, "fuzz.yaml");
  if (!cluster.ok()) {
    require(cluster.status().code() == Errc::kConfigError);
    require(!cluster.status().message().empty());
    return 0;
  }
  check_accepted(*cluster);
  return 0;
}
