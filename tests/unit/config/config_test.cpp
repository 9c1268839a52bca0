#include "config/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace pmirror::config {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "pmirror-config-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

  // Writes a file with the given mode and returns its path.
  std::string write(const std::string& name, const std::string& contents, mode_t mode = 0600) {
    fs::path file = path_ / name;
    std::ofstream(file, std::ios::binary) << contents;
    EXPECT_EQ(::chmod(file.c_str(), mode), 0);
    return file.string();
  }

 private:
  fs::path path_;
};

constexpr const char* kSecret = "0123456789abcdef0123";

// Lines 1-4: three nodes.
const std::string kNodes =
    "nodes:\n"                              // 1
    "  - {name: n1, address: 10.0.0.1}\n"   // 2
    "  - {name: n2, address: 10.0.0.2}\n"   // 3
    "  - {name: n3, address: 10.0.0.3}\n";  // 4

// kNodes plus one volume "v" (lines 5-12); `changes` replace the value of a
// key of the volume ("" drops the line), `extra` is appended (line 13 on).
std::string with_volume(const std::vector<std::pair<std::string, std::string>>& changes = {},
                        const std::string& extra = "") {
  std::vector<std::pair<std::string, std::string>> body = {{"size", "1MiB"},                 // 7
                                                           {"primary", "n1"},                // 8
                                                           {"replicas", "[n2, n3]"},         // 9
                                                           {"path", "/pmem/v"},              // 10
                                                           {"allowed_peers", "[app]"},       // 11
                                                           {"secret", "0123456789abcdef"}};  // 12
  std::string text = kNodes + "volumes:\n  - name: v\n";                                     // 5, 6
  for (auto& [key, value] : body) {
    for (const auto& [changed, new_value] : changes) {
      if (changed == key) value = new_value;
    }
    if (!value.empty()) text += "    " + key + ": " + value + "\n";
  }
  return text + extra;
}

TEST(ClusterConfigTest, MinimalConfigTakesDefaults) {
  auto config = parse_cluster_config(with_volume());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->source, "<config>");
  EXPECT_EQ(config->name, "");
  DaemonSettings defaults;
  EXPECT_EQ(config->daemon.control_socket, defaults.control_socket);
  EXPECT_EQ(config->daemon.state_pool, defaults.state_pool);
  EXPECT_EQ(config->daemon.log_level, "info");
  EXPECT_FALSE(config->daemon.metrics.has_value());
  EXPECT_EQ(config->daemon.heartbeat_interval, milliseconds(1000));
  EXPECT_EQ(config->daemon.heartbeat_timeout, milliseconds(5000));
  EXPECT_EQ(config->daemon.reconnect_initial, milliseconds(200));
  EXPECT_EQ(config->daemon.reconnect_max, milliseconds(10000));
  ASSERT_EQ(config->nodes.size(), 3u);
  EXPECT_EQ(config->nodes[0].port, 7450);
  EXPECT_EQ(config->nodes[0].transport, transport::Kind::kTcp);
  EXPECT_EQ(config->nodes[0].listen, "10.0.0.1");
  ASSERT_EQ(config->volumes.size(), 1u);
  const ClusterVolume& v = config->volumes[0];
  EXPECT_EQ(v.ack, 2u);  // default: every replica
  EXPECT_EQ(v.on_insufficient, InsufficientPolicy::kFail);
  EXPECT_EQ(v.apm, ApmPolicy::kAuto);
  EXPECT_FALSE(v.create);
  EXPECT_EQ(v.paths, (std::map<std::string, std::string>{
                         {"n1", "/pmem/v"}, {"n2", "/pmem/v"}, {"n3", "/pmem/v"}}));
  EXPECT_EQ(v.path_at.at("n2"), "<config>:10:11");
  // Recovery defaults: 64KiB chunks, 100MiB/s, refuse a split brain, the
  // metadata pool beside each copy.
  EXPECT_EQ(v.chunk, 64u << 10);
  EXPECT_EQ(v.resync_rate, 100u << 20);
  EXPECT_EQ(v.after_split_brain, SplitBrainPolicy::kRefuse);
  EXPECT_EQ(v.metadata_paths,
            (std::map<std::string, std::string>{
                {"n1", "/pmem/v.pmirror"}, {"n2", "/pmem/v.pmirror"}, {"n3", "/pmem/v.pmirror"}}));
}

// The three-node file of the reference, every key used.
std::string full_config(const std::string& secret_file) {
  return "cluster: {name: prod}\n"
         "daemon:\n"
         "  control_socket: /run/pm.sock\n"
         "  log_level: debug\n"
         "  metrics: 127.0.0.1:9942\n"
         "  state_pool: /var/lib/pm.state\n"
         "  heartbeat_interval: 500ms\n"
         "  heartbeat_timeout: 3s\n"
         "  reconnect_initial: 100ms\n"
         "  reconnect_max: 1m\n"
         "nodes:\n"
         "  - {name: node1, address: 10.0.0.1, port: 7460, transport: rdma}\n"
         "  - {name: node2, address: 10.0.0.2, listen: 0.0.0.0}\n"
         "  - name: node3\n"
         "    address: 'fe80::1'\n"
         "    state_pool: /mnt/pmem/pm.state\n"
         "    control_socket: /run/pm3.sock\n"
         "    log_level: warn\n"
         "    metrics: off\n"
         "volumes:\n"
         "  - name: db0\n"
         "    size: 1GiB\n"
         "    primary: node1\n"
         "    replicas: [node2, node3]\n"
         "    ack: 1\n"
         "    on_insufficient: block\n"
         "    paths: {node1: /dev/dax0.0, node2: /dev/dax1.0, node3: /mnt/pmem/db0}\n"
         "    create: false\n"
         "    allowed_peers: [app1, app2]\n"
         "    secret_file: " +
         secret_file +
         "\n"
         "    apm: on\n"
         "    poll: busy\n"
         "    chunk: 16KiB\n"
         "    resync_rate: 200MiB/s\n"
         "    after_split_brain: overwrite_replica\n"
         "    metadata: {node2: /var/lib/pmirror/db0-copy.pmirror}\n"
         "  - name: log0\n"
         "    size: 64MiB\n"
         "    primary: node2\n"
         "    replicas: [node3]\n"
         "    path: /var/lib/pmirror/log0.img\n"
         "    paths: {node3: /mnt/pmem/log0}\n"
         "    create: true\n"
         "    allowed_peers: [app3]\n"
         "    secret: \"" +
         kSecret +
         "\"\n"
         "    apm: off\n"
         "    resync_rate: unlimited\n"
         "    native_persistence: flush\n";
}

TEST(ClusterConfigTest, FullConfigParsesToTheExpectedStructs) {
  TempDir dir;
  std::string secret_file = dir.write("db0.secret", std::string(kSecret) + "\n");
  auto config = parse_cluster_config(full_config(secret_file), "full.yaml");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->source, "full.yaml");
  EXPECT_EQ(config->name, "prod");
  EXPECT_EQ(config->daemon.control_socket, "/run/pm.sock");
  EXPECT_EQ(config->daemon.log_level, "debug");
  ASSERT_TRUE(config->daemon.metrics.has_value());
  EXPECT_EQ(config->daemon.metrics->to_string(), "127.0.0.1:9942");
  EXPECT_EQ(config->daemon.state_pool, "/var/lib/pm.state");
  EXPECT_EQ(config->daemon.heartbeat_interval, milliseconds(500));
  EXPECT_EQ(config->daemon.heartbeat_timeout, milliseconds(3000));
  EXPECT_EQ(config->daemon.reconnect_initial, milliseconds(100));
  EXPECT_EQ(config->daemon.reconnect_max, milliseconds(60000));

  ASSERT_EQ(config->nodes.size(), 3u);
  const NodeConfig& node1 = config->nodes[0];
  EXPECT_EQ(node1.name, "node1");
  EXPECT_EQ(node1.address, "10.0.0.1");
  EXPECT_EQ(node1.listen, "10.0.0.1");
  EXPECT_EQ(node1.port, 7460);
  EXPECT_EQ(node1.transport, transport::Kind::kRdma);
  EXPECT_EQ(node1.daemon.state_pool, "/var/lib/pm.state");  // inherited
  EXPECT_EQ(config->nodes[1].listen, "0.0.0.0");
  EXPECT_EQ(config->nodes[1].port, 7450);
  const NodeConfig& node3 = config->nodes[2];
  EXPECT_EQ(node3.address, "fe80::1");
  EXPECT_EQ(node3.daemon.state_pool, "/mnt/pmem/pm.state");
  EXPECT_EQ(node3.daemon.control_socket, "/run/pm3.sock");
  EXPECT_EQ(node3.daemon.log_level, "warn");
  EXPECT_FALSE(node3.daemon.metrics.has_value());
  EXPECT_EQ(node3.daemon.heartbeat_interval, milliseconds(500));

  ASSERT_EQ(config->volumes.size(), 2u);
  const ClusterVolume& db0 = config->volumes[0];
  EXPECT_EQ(db0.name, "db0");
  EXPECT_EQ(db0.size, 1ull << 30);
  EXPECT_EQ(db0.primary, "node1");
  EXPECT_EQ(db0.replicas, (std::vector<std::string>{"node2", "node3"}));
  EXPECT_EQ(db0.ack, 1u);
  EXPECT_EQ(db0.on_insufficient, InsufficientPolicy::kBlock);
  EXPECT_EQ(db0.paths,
            (std::map<std::string, std::string>{
                {"node1", "/dev/dax0.0"}, {"node2", "/dev/dax1.0"}, {"node3", "/mnt/pmem/db0"}}));
  EXPECT_FALSE(db0.create);
  EXPECT_EQ(db0.allowed_peers, (std::vector<std::string>{"app1", "app2"}));
  EXPECT_EQ(db0.secret, "");  // read later, where needed
  EXPECT_EQ(db0.secret_file, secret_file);
  EXPECT_EQ(db0.secret_file_at, "full.yaml:30:18");
  EXPECT_EQ(db0.apm, ApmPolicy::kOn);
  EXPECT_EQ(db0.native_persistence, NativePersistence::kAuto);  // the default
  EXPECT_EQ(db0.poll, transport::PollMode::kBusy);
  EXPECT_EQ(db0.chunk, 16u << 10);
  EXPECT_EQ(db0.resync_rate, 200u << 20);
  EXPECT_EQ(db0.after_split_brain, SplitBrainPolicy::kOverwriteReplica);
  // node1's and node3's by the default rule: devices under /dev/ keep it in
  // /var/lib/pmirror, files beside themselves.
  EXPECT_EQ(db0.metadata_paths,
            (std::map<std::string, std::string>{{"node1", "/var/lib/pmirror/db0.pmirror"},
                                                {"node2", "/var/lib/pmirror/db0-copy.pmirror"},
                                                {"node3", "/mnt/pmem/db0.pmirror"}}));
  const ClusterVolume& log0 = config->volumes[1];
  EXPECT_EQ(log0.ack, 1u);
  EXPECT_EQ(log0.paths, (std::map<std::string, std::string>{{"node2", "/var/lib/pmirror/log0.img"},
                                                            {"node3", "/mnt/pmem/log0"}}));
  EXPECT_TRUE(log0.create);
  EXPECT_EQ(log0.secret, kSecret);
  EXPECT_EQ(log0.apm, ApmPolicy::kOff);
  EXPECT_EQ(log0.native_persistence, NativePersistence::kFlush);
  EXPECT_EQ(log0.poll, transport::PollMode::kAdaptive);  // the default
  EXPECT_EQ(log0.chunk, 64u << 10);
  EXPECT_EQ(log0.resync_rate, 0u);  // unlimited
  EXPECT_EQ(log0.after_split_brain, SplitBrainPolicy::kRefuse);
  EXPECT_EQ(log0.metadata_paths,
            (std::map<std::string, std::string>{{"node2", "/var/lib/pmirror/log0.img.pmirror"},
                                                {"node3", "/mnt/pmem/log0.pmirror"}}));
  EXPECT_EQ(config->find_node("node2"), &config->nodes[1]);
  EXPECT_EQ(config->find_node("node9"), nullptr);
  EXPECT_EQ(config->find_volume("log0"), &config->volumes[1]);
}

TEST(ClusterConfigTest, DaemonConfigForEachNode) {
  TempDir dir;
  std::string secret_file = dir.write("db0.secret", std::string(kSecret) + "\n");
  auto cluster = parse_cluster_config(full_config(secret_file), "full.yaml");
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();

  // node1 is only a primary: its pmirrord holds db0 too (to serve it
  // should another node be promoted).
  auto node1 = daemon_config_for(*cluster, "node1");
  ASSERT_TRUE(node1.ok()) << node1.status().to_string();
  EXPECT_EQ(node1->node, "node1");
  EXPECT_EQ(node1->listen_address, "10.0.0.1");
  EXPECT_EQ(node1->port, 7460);
  EXPECT_EQ(node1->transport, transport::Kind::kRdma);
  EXPECT_EQ(node1->state_pool, "/var/lib/pm.state");
  EXPECT_EQ(node1->control_socket, "/run/pm.sock");
  EXPECT_EQ(node1->log_level, "debug");
  ASSERT_TRUE(node1->metrics.has_value());
  EXPECT_EQ(node1->metrics->port, 9942);
  EXPECT_EQ(node1->heartbeat_interval, milliseconds(500));
  EXPECT_EQ(node1->heartbeat_timeout, milliseconds(3000));
  EXPECT_EQ(node1->reconnect_initial, milliseconds(100));
  EXPECT_EQ(node1->reconnect_max, milliseconds(60000));
  ASSERT_EQ(node1->volumes.size(), 1u);
  const VolumeConfig& primary_copy = node1->volumes[0];
  EXPECT_EQ(primary_copy.name, "db0");
  EXPECT_EQ(primary_copy.path, "/dev/dax0.0");
  EXPECT_EQ(primary_copy.metadata_path, "/var/lib/pmirror/db0.pmirror");
  EXPECT_EQ(primary_copy.chunk, 16u << 10);
  EXPECT_EQ(primary_copy.primary, "node1");
  EXPECT_TRUE(primary_copy.configured_primary);
  EXPECT_EQ(primary_copy.peers, (std::vector<std::string>{"node2", "node3"}));
  EXPECT_EQ(primary_copy.secret, kSecret);
  EXPECT_EQ(node1->cluster.nodes.size(), 3u);

  // node2: replica of db0, primary of log0.
  auto node2 = daemon_config_for(*cluster, "node2");
  ASSERT_TRUE(node2.ok()) << node2.status().to_string();
  EXPECT_EQ(node2->listen_address, "0.0.0.0");
  EXPECT_EQ(node2->port, 7450);
  EXPECT_EQ(node2->transport, transport::Kind::kTcp);
  ASSERT_EQ(node2->volumes.size(), 2u);
  const VolumeConfig& db0 = node2->volumes[0];
  EXPECT_EQ(db0.name, "db0");
  EXPECT_EQ(db0.path, "/dev/dax1.0");
  EXPECT_EQ(db0.size, 1ull << 30);
  EXPECT_FALSE(db0.create);
  EXPECT_EQ(db0.allowed_peers, (std::vector<std::string>{"app1", "app2"}));
  EXPECT_EQ(db0.secret, kSecret);  // read from the file, newline stripped
  EXPECT_EQ(db0.apm, ApmPolicy::kOn);
  EXPECT_EQ(db0.metadata_path, "/var/lib/pmirror/db0-copy.pmirror");
  EXPECT_EQ(db0.chunk, 16u << 10);
  EXPECT_EQ(db0.primary, "node1");
  EXPECT_FALSE(db0.configured_primary);
  EXPECT_EQ(db0.peers, (std::vector<std::string>{"node1", "node3"}));
  const VolumeConfig& log0 = node2->volumes[1];
  EXPECT_EQ(log0.name, "log0");
  EXPECT_EQ(log0.path, "/var/lib/pmirror/log0.img");
  EXPECT_EQ(log0.metadata_path, "/var/lib/pmirror/log0.img.pmirror");
  EXPECT_EQ(log0.chunk, 64u << 10);
  EXPECT_TRUE(log0.configured_primary);
  EXPECT_EQ(log0.peers, (std::vector<std::string>{"node3"}));

  // node3: replica of both, with its overrides.
  auto node3 = daemon_config_for(*cluster, "node3");
  ASSERT_TRUE(node3.ok()) << node3.status().to_string();
  EXPECT_EQ(node3->listen_address, "fe80::1");
  EXPECT_EQ(node3->state_pool, "/mnt/pmem/pm.state");
  EXPECT_EQ(node3->control_socket, "/run/pm3.sock");
  EXPECT_EQ(node3->log_level, "warn");
  EXPECT_FALSE(node3->metrics.has_value());
  ASSERT_EQ(node3->volumes.size(), 2u);
  EXPECT_EQ(node3->volumes[0].path, "/mnt/pmem/db0");
  EXPECT_EQ(node3->volumes[1].name, "log0");
  EXPECT_EQ(node3->volumes[1].path, "/mnt/pmem/log0");
  EXPECT_EQ(node3->volumes[1].size, 64ull << 20);
  EXPECT_TRUE(node3->volumes[1].create);
  EXPECT_EQ(node3->volumes[1].native_persistence, NativePersistence::kFlush);
  EXPECT_EQ(node3->volumes[1].secret, kSecret);
  EXPECT_EQ(node3->volumes[1].apm, ApmPolicy::kOff);
  EXPECT_EQ(node3->volumes[0].poll, transport::PollMode::kBusy);
  EXPECT_EQ(node3->volumes[1].poll, transport::PollMode::kAdaptive);
  EXPECT_EQ(node3->volumes[1].peers, (std::vector<std::string>{"node2"}));
  EXPECT_EQ(node3->volumes[0].peers, (std::vector<std::string>{"node1", "node2"}));

  auto unknown = daemon_config_for(*cluster, "node4");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(), "no node 'node4' in full.yaml; nodes: node1, node2, node3");
}

TEST(ClusterConfigTest, SecretsAreReadOnlyWhereNeeded) {
  // db0's secret file is missing: no node holding db0 can use it (so none
  // of their daemons starts), but node2 can still open log0 as primary.
  auto cluster = parse_cluster_config(full_config("/nonexistent/db0.secret"), "full.yaml");
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
  auto node3 = daemon_config_for(*cluster, "node3");
  ASSERT_FALSE(node3.ok());
  EXPECT_EQ(node3.status().code(), Errc::kConfigError);
  EXPECT_EQ(node3.status().message().rfind(
                "full.yaml:30:18: volumes[0].secret_file: cannot open secret file "
                "/nonexistent/db0.secret: No such file or directory; create it with `umask 077",
                0),
            0u)
      << node3.status().message();
  EXPECT_FALSE(daemon_config_for(*cluster, "node2").ok());
  EXPECT_FALSE(daemon_config_for(*cluster, "node1").ok());
  EXPECT_FALSE(initiator_plan(*cluster, "db0", "node1").ok());
  EXPECT_TRUE(initiator_plan(*cluster, "log0", "node2").ok());
  // A node holding no copy of db0 needs no secret of it.
  auto other = parse_cluster_config(
      full_config("/nonexistent/db0.secret") + "  - {name: solo, size: 1MiB, primary: node1, " +
          "replicas: [node2], path: /pmem/solo, allowed_peers: [a], secret: " + kSecret + "}\n",
      "full.yaml");
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_TRUE(initiator_plan(*other, "solo", "node2").ok());
}

TEST(ClusterConfigTest, InitiatorPlanForEveryCopy) {
  TempDir dir;
  std::string secret_file = dir.write("db0.secret", kSecret);
  auto cluster = parse_cluster_config(full_config(secret_file), "full.yaml");
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
  auto plan = initiator_plan(*cluster, "db0", "node1");
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->volume, "db0");
  EXPECT_EQ(plan->node, "node1");
  EXPECT_EQ(plan->local_path, "/dev/dax0.0");
  EXPECT_EQ(plan->size, 1ull << 30);
  EXPECT_FALSE(plan->create);
  EXPECT_EQ(plan->secret, kSecret);
  EXPECT_EQ(plan->allowed_peers, (std::vector<std::string>{"app1", "app2"}));
  EXPECT_EQ(plan->ack, 1u);
  EXPECT_EQ(plan->on_insufficient, InsufficientPolicy::kBlock);
  EXPECT_EQ(plan->poll, transport::PollMode::kBusy);
  EXPECT_EQ(plan->heartbeat_interval, milliseconds(500));
  EXPECT_EQ(plan->heartbeat_timeout, milliseconds(3000));
  EXPECT_EQ(plan->reconnect_initial, milliseconds(100));
  EXPECT_EQ(plan->reconnect_max, milliseconds(60000));
  ASSERT_EQ(plan->replicas.size(), 2u);
  EXPECT_EQ(plan->replicas[0].node, "node2");
  EXPECT_EQ(plan->replicas[0].address, "10.0.0.2");  // `address`, not `listen`
  EXPECT_EQ(plan->replicas[0].port, 7450);
  EXPECT_EQ(plan->replicas[0].transport, transport::Kind::kTcp);
  EXPECT_EQ(plan->replicas[1].node, "node3");
  EXPECT_EQ(plan->replicas[1].address, "fe80::1");
  EXPECT_EQ(plan->metadata_path, "/var/lib/pmirror/db0.pmirror");
  EXPECT_EQ(plan->chunk, 16u << 10);
  EXPECT_EQ(plan->resync_rate, 200u << 20);
  EXPECT_EQ(plan->after_split_brain, SplitBrainPolicy::kOverwriteReplica);
  EXPECT_TRUE(plan->configured_primary);

  auto log0 = initiator_plan(*cluster, "log0", "node2");
  ASSERT_TRUE(log0.ok()) << log0.status().to_string();
  EXPECT_EQ(log0->local_path, "/var/lib/pmirror/log0.img");
  EXPECT_TRUE(log0->create);
  EXPECT_EQ(log0->secret, kSecret);
  ASSERT_EQ(log0->replicas.size(), 1u);
  EXPECT_EQ(log0->replicas[0].node, "node3");
  EXPECT_EQ(log0->resync_rate, 0u);
  EXPECT_EQ(log0->metadata_path, "/var/lib/pmirror/log0.img.pmirror");

  // On a replica (to open it once promoted there): its own path and
  // metadata, the other nodes -- the configured primary first -- as
  // replicas, the same ack.
  auto replica = initiator_plan(*cluster, "db0", "node3");
  ASSERT_TRUE(replica.ok()) << replica.status().to_string();
  EXPECT_EQ(replica->node, "node3");
  EXPECT_EQ(replica->local_path, "/mnt/pmem/db0");
  EXPECT_EQ(replica->metadata_path, "/mnt/pmem/db0.pmirror");
  EXPECT_FALSE(replica->configured_primary);
  ASSERT_EQ(replica->replicas.size(), 2u);
  EXPECT_EQ(replica->replicas[0].node, "node1");
  EXPECT_EQ(replica->replicas[0].port, 7460);
  EXPECT_EQ(replica->replicas[0].transport, transport::Kind::kRdma);
  EXPECT_EQ(replica->replicas[1].node, "node2");
  EXPECT_EQ(replica->ack, 1u);
  EXPECT_EQ(replica->on_insufficient, InsufficientPolicy::kBlock);
  EXPECT_EQ(replica->chunk, 16u << 10);

  auto no_copy = initiator_plan(*cluster, "log0", "node1");
  ASSERT_FALSE(no_copy.ok());
  EXPECT_EQ(no_copy.status().code(), Errc::kConfigError);
  EXPECT_EQ(no_copy.status().message(),
            "node 'node1' holds no copy of volume 'log0' (full.yaml: primary node2, replicas "
            "node3); libpmirror opens a volume on its primary node, or on a replica promoted "
            "with `pmirrorctl promote log0`");
  auto no_volume = initiator_plan(*cluster, "db9", "node1");
  ASSERT_FALSE(no_volume.ok());
  EXPECT_EQ(no_volume.status().message(), "no volume 'db9' in full.yaml; volumes: db0, log0");
}

TEST(ClusterConfigTest, ResolveNode) {
  auto cluster = parse_cluster_config(with_volume(), "c.yaml");
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
  // An explicit --node wins over the host name.
  auto explicit_node = resolve_node(*cluster, "n2", "n1");
  ASSERT_TRUE(explicit_node.ok());
  EXPECT_EQ(*explicit_node, "n2");
  auto wrong = resolve_node(*cluster, "n9", "n1");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Errc::kConfigError);
  EXPECT_EQ(wrong.status().message(), "--node n9: no such node in c.yaml; nodes: n1, n2, n3");
  // The host name, then its first label.
  EXPECT_EQ(*resolve_node(*cluster, "", "n3"), "n3");
  EXPECT_EQ(*resolve_node(*cluster, "", "n3.example.com"), "n3");
  auto unknown = resolve_node(*cluster, "", "build-42.example.com");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(),
            "this machine's host name 'build-42.example.com' is not a node in c.yaml (nodes: n1, "
            "n2, n3); say which node this is with --node NAME");
  // Without a host name given, gethostname() is used.
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  auto actual = resolve_node(*cluster, "");
  if (std::string(host) != "n1" && std::string(host) != "n2" && std::string(host) != "n3") {
    ASSERT_FALSE(actual.ok());
    EXPECT_NE(actual.status().message().find(std::string("'") + host + "'"), std::string::npos);
  }
}

struct BadConfig {
  const char* what;
  std::string yaml;
  int line;  // expected line of the (first) error; 0: no position
  std::string fragment;
};

std::string replace_first(std::string text, const std::string& from, const std::string& to) {
  return text.replace(text.find(from), from.size(), to);
}

std::vector<BadConfig> bad_configs() {
  const std::string good = with_volume();
  // A second volume "w" (lines 13-19) with the given path (line 17).
  auto second = [](const std::string& path, const std::string& name = "w") {
    return "  - name: " + name +
           "\n"                    // 13
           "    size: 1MiB\n"      // 14
           "    primary: n1\n"     // 15
           "    replicas: [n2]\n"  // 16
           "    path: " +
           path +
           "\n"                               // 17
           "    allowed_peers: [app]\n"       // 18
           "    secret: 0123456789abcdef\n";  // 19
  };
  // with_volume, its `path:` line turned into `paths:`.
  auto with_paths = [](const std::vector<std::pair<std::string, std::string>>& changes) {
    std::string text = with_volume(changes);
    return text.replace(text.find("    path:"), 9, "    paths:");
  };
  auto daemon = [&](const std::string& lines) { return "daemon:\n" + lines + good; };
  // Nodes replaced by `nodes` (from line 1); a volume follows.
  auto nodes = [](const std::string& nodes_text) {
    return nodes_text +
           "volumes:\n  - {name: v, size: 1MiB, primary: a, replicas: [b], path: /p, "
           "allowed_peers: [app], secret: 0123456789abcdef}\n";
  };
  return {
      // The file as a whole.
      {"empty file", "", 0, "the configuration is empty"},
      {"only comments", "# nothing\n", 0, "the configuration is empty"},
      // yaml-cpp says line 3, after the last line: the last line there is.
      {"syntax error", "nodes:\n  - [1, 2\n", 2, "YAML syntax error"},
      {"tab indentation", "nodes:\n\t- a\n", 2, "YAML syntax error"},
      {"top-level list", "- a\n- b\n", 1, "top level must be a map"},
      {"two documents", good + "---\n" + good, 14, "single document"},
      {"unknown top key", "node:\n  - a\n" + good, 1,
       "unknown key 'node' (did you mean 'nodes'?); allowed keys: cluster, daemon, "
       "failover, nodes, volumes"},
      {"no nodes section", "volumes: []\n", 1, "no 'nodes' section"},
      {"no volumes section", kNodes, 1, "no 'volumes' section"},
      {"volumes empty", kNodes + "volumes: []\n", 5, "volumes: no volumes are listed"},
      {"volumes a map", kNodes + "volumes:\n  v: 1\n", 6, "expected a list of volumes"},
      {"cluster unknown key", "cluster: {nam: x}\n" + good, 1,
       "cluster: unknown key 'nam' (did you mean 'name'?)"},
      // daemon
      {"unknown daemon key", daemon("  log_levle: info\n"), 2,
       "daemon: unknown key 'log_levle' (did you mean 'log_level'?)"},
      {"daemon a list", "daemon: [a]\n" + good, 1,
       "daemon: expected a map of settings, got a list"},
      {"bad log level", daemon("  log_level: verbose\n"), 2,
       "daemon.log_level: 'verbose' is not one of trace, debug, info, warn, error, critical, off"},
      {"relative control socket", daemon("  control_socket: pm.sock\n"), 2,
       "daemon.control_socket: 'pm.sock' is not an absolute path"},
      {"control socket too long", daemon("  control_socket: /" + std::string(120, 's') + "\n"), 2,
       "a unix socket path holds at most 107"},
      {"relative state pool", daemon("  state_pool: state.pool\n"), 2, "not an absolute path"},
      {"metrics without port", daemon("  metrics: localhost\n"), 2,
       "daemon.metrics: invalid address 'localhost': expected HOST:PORT"},
      {"metrics port zero", daemon("  metrics: 127.0.0.1:0\n"), 2,
       "port must be a number 1..65535"},
      {"metrics bare IPv6", daemon("  metrics: '::1:9942'\n"), 2, "in brackets"},
      {"duration without unit", daemon("  heartbeat_interval: 5\n"), 2,
       "daemon.heartbeat_interval: invalid duration '5': a unit is required"},
      {"fractional duration", daemon("  heartbeat_timeout: 1.5s\n"), 2,
       "fractions are not allowed"},
      {"unknown duration unit", daemon("  reconnect_max: 10h\n"), 2, "unknown unit 'h'"},
      {"zero duration", daemon("  reconnect_initial: 0ms\n"), 2, "must be greater than zero"},
      {"timeout not above interval", daemon("  heartbeat_interval: 5s\n  heartbeat_timeout: 5s\n"),
       3,
       "daemon.heartbeat_timeout: the timeout (5000ms) must be longer than heartbeat_interval "
       "(5000ms)"},
      {"reconnect max below initial", daemon("  reconnect_initial: 20s\n  reconnect_max: 10s\n"), 3,
       "reconnect_max (10000ms) must not be shorter than reconnect_initial (20000ms)"},
      // nodes
      {"nodes empty", "nodes: []\nvolumes: []\n", 1, "nodes: no nodes are listed"},
      {"node is a scalar", nodes("nodes:\n  - a\n"), 2, "expected a map describing a node"},
      {"node unknown key", nodes("nodes:\n  - {name: a, adress: 10.0.0.1}\n"), 2,
       "nodes[0]: unknown key 'adress' (did you mean 'address'?)"},
      {"node without address", nodes("nodes:\n  - {name: a}\n"), 2,
       "nodes[0]: missing required key 'address'"},
      {"node without name", nodes("nodes:\n  - {address: 10.0.0.1}\n"), 2,
       "nodes[0]: missing required key 'name'"},
      {"bad node name", nodes("nodes:\n  - {name: 'a b', address: 10.0.0.1}\n"), 2,
       "nodes[0].name: node name 'a b' contains a character that is not allowed"},
      {"port too big", nodes("nodes:\n  - {name: a, address: 10.0.0.1, port: 70000}\n"), 2,
       "nodes[0].port: expected a port number 1..65535, got '70000'"},
      {"port a list", nodes("nodes:\n  - {name: a, address: 10.0.0.1, port: [1]}\n"), 2,
       "expected a port number 1..65535, got a list"},
      {"bad transport", nodes("nodes:\n  - {name: a, address: 10.0.0.1, transport: udp}\n"), 2,
       "nodes[0].transport: 'udp' is not one of tcp, rdma"},
      {"port in the address", nodes("nodes:\n  - {name: a, address: '10.0.0.1:7450'}\n"), 2,
       "write the port under 'port'"},
      {"node log level", nodes("nodes:\n  - {name: a, address: 10.0.0.1, log_level: loud}\n"), 2,
       "nodes[0].log_level: 'loud' is not one of"},
      {"duplicate node name",
       nodes("nodes:\n  - {name: a, address: 10.0.0.1}\n  - {name: a, address: 10.0.0.2}\n"), 3,
       "nodes[1].name: duplicate node name 'a' (first defined at <config>:2:12)"},
      {"duplicate address and port",
       nodes("nodes:\n  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.1, port: "
             "7450}\n"),
       3,
       "nodes[1]: node 'b' uses 10.0.0.1:7450, as node 'a' does (at <config>:2:24); two daemons "
       "cannot listen on the same address and port"},
      {"nodes on one address share files",
       nodes("nodes:\n  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.1, port: "
             "7451}\n"),
       3,
       "nodes 'a' and 'b' share the address 10.0.0.1 and the state_pool "
       "/var/lib/pmirror/pmirrord.state; give one of them its own `state_pool:`"},
      // volumes
      {"volume is a scalar", kNodes + "volumes:\n  - v\n", 6, "expected a map describing a volume"},
      {"unknown volume key", with_volume({}, "    replica: [n2]\n"), 13,
       "volumes[0]: unknown key 'replica' (did you mean 'replicas'?)"},
      {"duplicate volume key", with_volume({}, "    size: 2MiB\n"), 13,
       "duplicate key 'size' (first at <config>:7:5)"},
      {"duplicate volume name", good + second("/pmem/w", "v"), 13,
       "volumes[1].name: duplicate volume name 'v' (first defined at <config>:6:11)"},
      {"bad volume name",
       kNodes + "volumes:\n  - name: db/0\n" + good.substr(good.find("    size")), 6,
       "volume name 'db/0' contains a character that is not allowed"},
      {"missing size", with_volume({{"size", ""}}), 6, "volumes[0]: missing required key 'size'"},
      {"zero size", with_volume({{"size", "0"}}), 7, "volumes[0].size: invalid size '0'"},
      {"fractional size", with_volume({{"size", "1.5G"}}), 7, "fractions are not allowed"},
      {"size not a page multiple", with_volume({{"size", "1000"}}), 7,
       "'1000' is 1000 bytes, not a multiple of 4096"},
      {"size a list", with_volume({{"size", "[1]"}}), 7,
       "expected a size such as 1GiB, got a list"},
      {"missing primary", with_volume({{"primary", ""}}), 6, "missing required key 'primary'"},
      {"primary not a node", with_volume({{"primary", "n9"}}), 8,
       "volumes[0].primary: 'n9' is not a node; nodes: n1, n2, n3"},
      {"replica not a node", with_volume({{"replicas", "[n2, n4]"}}), 9,
       "volumes[0].replicas[1]: 'n4' is not a node; nodes: n1, n2, n3"},
      {"primary also a replica", with_volume({{"replicas", "[n1, n2]"}}), 9,
       "volumes[0].replicas[0]: 'n1' is the primary; the primary holds the local copy and cannot "
       "also be a replica"},
      {"replicas empty", with_volume({{"replicas", "[]"}}), 9,
       "volumes[0].replicas: the list is empty; a volume needs at least one replica"},
      {"replicas a scalar", with_volume({{"replicas", "n2"}}), 9,
       "expected a list of nodes (e.g. [node2, node3]), got 'n2'"},
      {"replica twice", with_volume({{"replicas", "[n2, n2]"}}), 9, "node 'n2' is listed twice"},
      {"missing replicas", with_volume({{"replicas", ""}}), 6, "missing required key 'replicas'"},
      {"ack above replicas", with_volume({}, "    ack: 3\n"), 13,
       "volumes[0].ack: expected a number of replicas 1..2 (this volume has 2 replicas), got '3'"},
      {"ack zero", with_volume({}, "    ack: 0\n"), 13, "1..2"},
      {"bad on_insufficient", with_volume({}, "    on_insufficient: wait\n"), 13,
       "'wait' is not one of fail, block"},
      {"relative path", with_volume({{"path", "pmem/v"}}), 10,
       "volumes[0].path: 'pmem/v' is not an absolute path"},
      {"no path at all", with_volume({{"path", ""}}), 6,
       "volumes[0]: no path for node 'n1' (the primary)"},
      {"paths misses a replica", with_paths({{"path", "{n1: /a, n2: /b}"}}), 10,
       "no path for node 'n3' (a replica); add `n3: /dev/dax0.0`"},
      {"paths names a non-participant",
       with_paths({{"replicas", "[n2]"}, {"path", "{n1: /a, n2: /b, n3: /c}"}}), 10,
       "node 'n3' is neither the primary (n1) nor a replica (n2); remove its path"},
      {"paths names an unknown node", with_paths({{"path", "{n1: /a, n2: /b, n3: /c, n7: /d}"}}),
       10, "volumes[0].paths: 'n7' is not a node"},
      {"paths a list", with_volume({}, "    paths: [/a]\n"), 13, "expected a map of node: path"},
      {"relative path in paths", with_paths({{"path", "{n1: /a, n2: b, n3: /c}"}}), 10,
       "volumes[0].paths.n2: 'b' is not an absolute path"},
      {"duplicate path on a node", good + second("/pmem//v"), 17,
       "volumes[1].paths.n1: node 'n1' already uses '/pmem//v' for another volume (at "
       "<config>:10:11 (volume v))"},
      {"create yes", with_volume({}, "    create: yes\n"), 13, "expected true or false, got 'yes'"},
      {"bad apm", with_volume({}, "    apm: maybe\n"), 13, "'maybe' is not one of auto, on, off"},
      {"bad native_persistence", with_volume({}, "    native_persistence: atomic\n"), 13,
       "'atomic' is not one of auto, flush, off"},
      {"bad poll", with_volume({}, "    poll: spin\n"), 13,
       "'spin' is not one of busy, adaptive, event"},
      {"missing allowed_peers", with_volume({{"allowed_peers", ""}}), 6,
       "missing required key 'allowed_peers'"},
      {"allowed_peers empty", with_volume({{"allowed_peers", "[]"}}), 11,
       "the list is empty, so nobody could open the volume"},
      {"bad identity", with_volume({{"allowed_peers", "[ok, 'a b']"}}), 11,
       "volumes[0].allowed_peers[1]: identity 'a b' contains a character"},
      {"no secret", with_volume({{"secret", ""}}), 6,
       "missing required key 'secret_file' (or 'secret')"},
      {"short secret", with_volume({{"secret", "short"}}), 12,
       "volumes[0].secret: too short (5 characters); use at least 16"},
      {"both secrets", with_volume({}, "    secret_file: /s\n"), 13,
       "give either 'secret' or 'secret_file', not both (secret is at <config>:12:5)"},
      {"relative secret_file", with_volume({{"secret", ""}}, "    secret_file: s.key\n"), 12,
       "volumes[0].secret_file: 's.key' is not an absolute path"},
      // recovery keys
      {"chunk not a power of two", with_volume({}, "    chunk: 48KiB\n"), 13,
       "volumes[0].chunk: '48KiB' is 49152 bytes, not a power of two (e.g. 16KiB, 64KiB, 256KiB)"},
      {"chunk too small", with_volume({}, "    chunk: 2KiB\n"), 13,
       "volumes[0].chunk: '2KiB' is outside 4KiB..1MiB; one dirty bit stands for one chunk"},
      {"chunk too large", with_volume({}, "    chunk: 2MiB\n"), 13, "'2MiB' is outside 4KiB..1MiB"},
      {"chunk not a size", with_volume({}, "    chunk: big\n"), 13,
       "volumes[0].chunk: invalid size 'big'"},
      {"chunk a list", with_volume({}, "    chunk: [1]\n"), 13,
       "volumes[0].chunk: expected a size such as 64KiB, got a list"},
      {"chunk_size for chunk", with_volume({}, "    chunk_size: 64KiB\n"), 13,
       "volumes[0]: unknown key 'chunk_size' (did you mean 'chunk'?)"},
      {"resync_rate without /s", with_volume({}, "    resync_rate: 100MiB\n"), 13,
       "volumes[0].resync_rate: invalid rate '100MiB': expected a size per second such as "
       "100MiB/s, or 'unlimited'"},
      {"resync_rate not a size", with_volume({}, "    resync_rate: fast/s\n"), 13,
       "volumes[0].resync_rate: invalid rate 'fast/s': expected a number of bytes"},
      {"resync_rate negative", with_volume({}, "    resync_rate: -1MiB/s\n"), 13,
       "invalid rate '-1MiB/s': a size cannot be negative"},
      {"resync_rate in bytes", with_volume({}, "    resync_rate: 100/s\n"), 13,
       "volumes[0].resync_rate: '100/s' is 100 bytes per second; the least is 1MiB/s"},
      {"resync_rate a map", with_volume({}, "    resync_rate: {a: 1}\n"), 13,
       "expected a rate such as 100MiB/s, or unlimited, got a map"},
      {"bad after_split_brain", with_volume({}, "    after_split_brain: overwrite\n"), 13,
       "volumes[0].after_split_brain: 'overwrite' is not one of refuse, overwrite_replica"},
      {"metadata a list", with_volume({}, "    metadata: [/m]\n"), 13,
       "volumes[0].metadata: expected a map of node: path (e.g. {node1: "
       "/mnt/pmem/db0.pmirror}), got a list"},
      {"metadata a path", with_volume({}, "    metadata: /m\n"), 13,
       "volumes[0].metadata: expected a map of node: path"},
      {"metadata_path for metadata", with_volume({}, "    metadata_path: {n1: /m}\n"), 13,
       "unknown key 'metadata_path' (did you mean 'metadata'?)"},
      {"relative metadata path", with_volume({}, "    metadata: {n1: /m, n2: m.pool}\n"), 13,
       "volumes[0].metadata.n2: 'm.pool' is not an absolute path"},
      {"metadata of an unknown node", with_volume({}, "    metadata: {n7: /m}\n"), 13,
       "volumes[0].metadata: 'n7' is not a node; nodes: n1, n2, n3"},
      {"metadata of a node without a copy",
       with_volume({{"replicas", "[n2]"}}, "    metadata:\n      n3: /m\n"), 14,
       "volumes[0].metadata: node 'n3' holds no copy of volume 'v' (primary n1, replicas n2); "
       "remove its metadata path"},
      {"metadata node twice", with_volume({}, "    metadata: {n2: /a, n2: /b}\n"), 13,
       "volumes[0].metadata: duplicate key 'n2' (first at <config>:13:16)"},
      {"metadata on the data path", with_volume({}, "    metadata: {n2: /pmem/v}\n"), 13,
       "volumes[0].metadata.n2: node 'n2' already uses '/pmem/v' (at <config>:10:11 (volume v)); "
       "a metadata pool needs a file of its own"},
      {"metadata shared by two volumes",
       good + second("/pmem/w") + "    metadata: {n1: /pmem/v.pmirror}\n", 20,
       "volumes[1].metadata.n1: node 'n1' already uses '/pmem/v.pmirror' (at <config>:10:11 "
       "(metadata of volume v))"},
      {"data path on another volume's metadata", good + second("/pmem//v.pmirror"), 17,
       "volumes[1].paths.n1: node 'n1' already uses '/pmem//v.pmirror' for another volume (at "
       "<config>:10:11 (metadata of volume v))"},
      {"default metadata on another volume's data",
       with_volume({}, "    metadata: {n1: /pmem/w.pmirror}\n") + second("/pmem/w"), 18,
       "volumes[1].metadata.n1: the default metadata path '/pmem/w.pmirror' is already used on "
       "node 'n1' (at <config>:13:20 (metadata of volume v)); give volume w its own under "
       "`metadata:`"},
      {"two daemons on one machine, one metadata pool",
       "nodes:\n"
       "  - {name: a, address: 10.0.0.1, state_pool: /a.state, control_socket: /a.sock}\n"
       "  - {name: b, address: 10.0.0.1, port: 7451}\n"
       "volumes:\n"
       "  - {name: v, size: 1MiB, primary: a, replicas: [b], allowed_peers: [app],\n"
       "     secret: 0123456789abcdef, paths: {a: /dev/dax0.0, b: /dev/dax1.0}}\n",
       6,
       "volumes[0].paths.b: nodes 'a' and 'b' share the address 10.0.0.1 and would both use "
       "'/var/lib/pmirror/v.pmirror' (a: metadata of volume v, at <config>:6:43; b: metadata of "
       "volume v); give one of them its own under `metadata:`"},
      {"two daemons on one machine, one file",
       "nodes:\n"
       "  - {name: a, address: 10.0.0.1, state_pool: /a.state, control_socket: /a.sock}\n"
       "  - {name: b, address: 10.0.0.1, port: 7451}\n"
       "volumes:\n"
       "  - {name: v, size: 1MiB, primary: a, replicas: [b], allowed_peers: [app],\n"
       "     secret: 0123456789abcdef, path: /p, metadata: {a: /a.meta, b: /b.meta}}\n",
       6,
       "volumes[0].paths.b: nodes 'a' and 'b' share the address 10.0.0.1 and would both use '/p' "
       "(a: volume v, at <config>:6:38; b: volume v); give one of them its own path"},
      // addresses: a number must be an address, anything else a DNS name
      {"IPv4 address out of range", nodes("nodes:\n  - {name: a, address: 999.999.1.1}\n"), 2,
       "nodes[0].address: '999.999.1.1' is not an IPv4 address"},
      {"IPv4 address with three parts", nodes("nodes:\n  - {name: a, address: 10.0.1}\n"), 2,
       "'10.0.1' is not an IPv4 address"},
      {"listen out of range",
       nodes("nodes:\n  - {name: a, address: 10.0.0.1, listen: 999.1.1.1}\n"), 2,
       "nodes[0].listen: '999.1.1.1' is not an IPv4 address"},
      {"listen not an IPv6 address",
       nodes("nodes:\n  - {name: a, address: 10.0.0.1, listen: '::g'}\n"), 2,
       "nodes[0].listen: '::g' is not an IPv6 address"},
      {"host name with an underscore", nodes("nodes:\n  - {name: a, address: db_1.example}\n"), 2,
       "nodes[0].address: 'db_1.example' is not an IP address or host name"},
      {"host name label starting with -", nodes("nodes:\n  - {name: a, address: -db.example}\n"), 2,
       "the label '-db' starts or ends with '-'"},
      {"host name label too long",
       nodes("nodes:\n  - {name: a, address: " + std::string(64, 'h') + ".example}\n"), 2,
       "is 64 characters; at most 63"},
      {"host name with an empty label", nodes("nodes:\n  - {name: a, address: db..example}\n"), 2,
       "an empty label between dots"},
      {"metrics host out of range", daemon("  metrics: 300.0.0.1:9942\n"), 2,
       "daemon.metrics: invalid address '300.0.0.1:9942': '300.0.0.1' is not an IPv4 address"},
      // sizes that cannot be mapped
      {"size of 16 EiB - 4096", with_volume({{"size", "18446744073709547520"}}), 7,
       "volumes[0].size: '18446744073709547520' is 18446744073709547520 bytes; a volume holds at "
       "most 70368744177664 (64TiB)"},
      {"size just above 64 TiB", with_volume({{"size", "70368744181760"}}), 7,
       "a volume holds at most 70368744177664 (64TiB)"},
      {"volumes of one node above 64 TiB together",
       with_volume({{"size", "40TiB"}}) + replace_first(second("/pmem/w"), "1MiB", "40TiB"), 14,
       "volumes[1].size: node 'n1' would hold 87960930222080 bytes of volumes (v, w); pmirrord "
       "maps them all at once, at most 70368744177664 (64TiB) in all"},
      // names and identities travel in the protocol's Hello (at most 64 bytes)
      {"identity of 80 bytes", with_volume({{"allowed_peers", "[" + std::string(80, 'i') + "]"}}),
       11,
       "volumes[0].allowed_peers[0]: identity '" + std::string(80, 'i') +
           "' is 80 characters; at most 64 are allowed (the protocol carries names and "
           "identities of at most 64 bytes)"},
      {"volume name of 65 bytes",
       kNodes + "volumes:\n  - name: " + std::string(65, 'v') + "\n" +
           good.substr(good.find("    size")),
       6, "volume name '" + std::string(65, 'v') + "' is 65 characters; at most 64"},
      // YAML positions: every error on a line the file has, where the problem is
      {"empty list item at the end of the file",
       with_volume({{"replicas", ""}}, "    replicas:\n      - n2\n      - \n"), 14,
       "volumes[0].replicas[1]: expected a node name, got nothing (null)"},
      {"empty list item before another",
       with_volume({{"replicas", ""}}, "    replicas:\n      -    # to do\n      - n2\n"), 13,
       "volumes[0].replicas[0]: expected a node name, got nothing (null)"},
      {"empty node item",
       nodes("nodes:\n  - {name: a, address: 10.0.0.1}\n  -\n  - {name: b, address: 10.0.0.2}\n"),
       3, "nodes[1]: expected a map describing a node (name, address, ...), got nothing (null)"},
      {"alias to a map where a name belongs",
       "nodes:\n"                                    // 1
       "  - &first {name: n1, address: 10.0.0.1}\n"  // 2
       "  - {name: n2, address: 10.0.0.2}\n"         // 3
       "volumes:\n"                                  // 4
       "  - name: v\n"                               // 5
       "    size: 1MiB\n"                            // 6
       "    primary: n1\n"                           // 7
       "    replicas:\n"                             // 8
       "      - n2\n"                                // 9
       "      - *first\n"                            // 10
       "    path: /p\n"                              // 11
       "    allowed_peers: [app]\n"                  // 12
       "    secret: 0123456789abcdef\n",             // 13
       10, "volumes[0].replicas[1]: expected a node name, got a map"},
      {"alias to a scalar that is no node",
       "cluster: {name: &who n9}\n" + replace_first(good, "primary: n1", "primary: *who"), 9,
       "volumes[0].primary: 'n9' is not a node"},
      {"alias inside its own anchor", "nodes: &self [*self]\nvolumes: []\n", 1,
       "alias *self refers to a node that contains it (a cycle)"},
      {"nesting 600 deep", "nodes: " + std::string(600, '[') + std::string(600, ']') + "\n", 1,
       "levels deep; a cluster file needs a few"},
  };
}

int line_count(const std::string& text) {
  int lines = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  return text.empty() || text.back() == '\n' ? lines : lines + 1;
}

// The line the message's first "<config>:LINE:COL:" names, or 0.
int first_line(const std::string& message) {
  const std::string prefix = "<config>:";
  if (message.rfind(prefix, 0) != 0) return 0;
  return std::atoi(message.c_str() + prefix.size());
}

TEST(ClusterConfigTest, BadConfigsAreRejectedWithLineAndReason) {
  auto cases = bad_configs();
  ASSERT_GE(cases.size(), 25u);
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.what) + ":\n" + c.yaml);
    auto config = parse_cluster_config(c.yaml);
    ASSERT_FALSE(config.ok());
    const Status& status = config.status();
    EXPECT_EQ(status.code(), Errc::kConfigError);
    EXPECT_NE(status.message().find(c.fragment), std::string::npos) << status.message();
    EXPECT_EQ(first_line(status.message()), c.line) << status.message();
    EXPECT_LE(first_line(status.message()), line_count(c.yaml)) << "a line the file does not have";
  }
}

TEST(ClusterConfigTest, ReportsEveryErrorAtOnceInFileOrder) {
  std::string text =
      "volumes:\n"                              // 1
      "  - name: v\n"                           // 2
      "    size: 1.5G\n"                        // 3
      "    primary: n9\n"                       // 4
      "    replicas: [n1]\n"                    // 5
      "    path: relative\n"                    // 6
      "    allowed_peers: []\n"                 // 7
      "    secret: short\n"                     // 8
      "daemon:\n"                               // 9
      "  log_level: loud\n"                     // 10
      "nodes:\n"                                // 11
      "  - {name: n1, address: a, port: 0}\n";  // 12
  auto config = parse_cluster_config(text, "multi.yaml");
  ASSERT_FALSE(config.ok());
  std::vector<std::string> lines;
  std::istringstream in(config.status().message());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 7u) << config.status().message();
  EXPECT_EQ(lines[0].rfind("multi.yaml:3:11: volumes[0].size: ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("multi.yaml:4:14: volumes[0].primary: 'n9' is not a node", 0), 0u)
      << lines[1];
  EXPECT_EQ(lines[2].rfind("multi.yaml:6:11: volumes[0].path: ", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("multi.yaml:7:20: volumes[0].allowed_peers: ", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4].rfind("multi.yaml:8:13: volumes[0].secret: ", 0), 0u) << lines[4];
  EXPECT_EQ(lines[5].rfind("multi.yaml:10:14: daemon.log_level: ", 0), 0u) << lines[5];
  EXPECT_EQ(lines[6].rfind("multi.yaml:12:34: nodes[0].port: ", 0), 0u) << lines[6];
}

// Lines of a message, one problem each.
std::vector<std::string> lines_of(const std::string& message) {
  std::vector<std::string> lines;
  std::istringstream in(message);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// kNodes, then a volume whose replicas are n2 and `count` aliases of n1's
// map (lines 14 on).
std::string aliased_replicas(int count) {
  std::string text =
      "nodes:\n"                                            // 1
      "  - &n1 {name: n1, address: 10.0.0.1}\n"             // 2
      "  - {name: n2, address: 10.0.0.2}\n"                 // 3
      "volumes:\n"                                          // 4
      "  - name: v\n"                                       // 5
      "    size: 1MiB\n"                                    // 6
      "    primary: n1\n"                                   // 7
      "    path: /p\n"                                      // 8
      "    allowed_peers: [app]\n"                          // 9
      "    secret: 0123456789abcdef\n"                      // 10
      "    replicas:\n"                                     // 11
      "      - n2\n";                                       // 12
  for (int i = 0; i < count; ++i) text += "      - *n1\n";  // 13 on
  return text;
}

TEST(ClusterConfigTest, ManyProblemsAreCappedAndEachAliasIsReportedWhereItIs) {
  auto config = parse_cluster_config(aliased_replicas(1000));
  ASSERT_FALSE(config.ok());
  auto lines = lines_of(config.status().message());
  ASSERT_EQ(lines.size(), kMaxReportedProblems + 1) << config.status().message();
  for (size_t i = 0; i < kMaxReportedProblems; ++i) {
    // Each alias at its own line (13, 14, ...), not at its anchor's (2).
    EXPECT_EQ(lines[i], "<config>:" + std::to_string(13 + i) + ":9: volumes[0].replicas[" +
                            std::to_string(i + 1) + "]: expected a node name, got a map");
  }
  EXPECT_EQ(lines.back(), "... and 950 more problems (1000 in all); fix these and check again");

  // config check: the same cap.
  TempDir dir;
  auto problems = check_cluster_file(dir.write("aliases.yaml", aliased_replicas(1000)));
  ASSERT_EQ(problems.size(), kMaxReportedProblems + 1);
  EXPECT_NE(problems[0].find("aliases.yaml:13:9: volumes[0].replicas[1]"), std::string::npos)
      << problems[0];
  EXPECT_EQ(problems.back(), lines.back());

  // At the cap, nothing is cut.
  config = parse_cluster_config(aliased_replicas(50));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(lines_of(config.status().message()).size(), 50u);
}

// "Billion laughs": ten levels of ten aliases each, 10^10 nodes expanded.
std::string alias_bomb(const std::string& used_at) {
  std::string text =
      "nodes:\n  - {name: n1, address: 10.0.0.1}\n  - {name: n2, address: 10.0.0.2}\n";
  text += "cluster: {name: &l0 [a, a, a, a, a, a, a, a, a, a]}\n";  // 4; refused as a name anyway
  for (int level = 1; level <= 10; ++level) {
    text += "x" + std::to_string(level) + ": &l" + std::to_string(level) + " [";
    for (int i = 0; i < 10; ++i) text += (i ? ", *l" : "*l") + std::to_string(level - 1);
    text += "]\n";  // 5..14
  }
  return text + "volumes:\n  - {name: v, size: 1MiB, primary: n1, replicas: " + used_at +
         ", path: /p, allowed_peers: [app], secret: 0123456789abcdef}\n";
}

TEST(ClusterConfigTest, AnAliasBombIsRefusedBeforeItIsExpanded) {
  // Level 3 holds 11111 nodes: the count passes 100000 at the 8th alias to
  // it, in level 4's list (line 8), long before anything is expanded.
  const std::string text = alias_bomb("*l10");
  auto config = parse_cluster_config(text);
  ASSERT_FALSE(config.ok());
  auto lines = lines_of(config.status().message());
  ASSERT_EQ(lines.size(), 1u) << config.status().message();
  EXPECT_EQ(first_line(lines[0]), 8) << lines[0];
  EXPECT_NE(lines[0].find("with this alias *l3 (11111 nodes), the document has more than 100000 "
                          "YAML nodes once its aliases are expanded"),
            std::string::npos)
      << lines[0];

  TempDir dir;
  auto problems = check_cluster_file(dir.write("bomb.yaml", text));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("more than 100000 YAML nodes"), std::string::npos) << problems[0];

  // Fan-out the parser would walk: 20000 volumes, each the same map with
  // 20000 allowed_peers (4*10^8 names to copy before).
  std::string wide =
      "nodes:\n  - {name: n1, address: 10.0.0.1}\n  - {name: n2, address: 10.0.0.2}\n";
  wide += "cluster: {name: &peers [p";
  for (int i = 0; i < 20000; ++i) wide += ", p";
  wide += "]}\n";
  wide +=
      "daemon: {log_level: &v {name: v, size: 1MiB, primary: n1, replicas: [n2], path: /p, "
      "allowed_peers: *peers, secret: 0123456789abcdef}}\n";
  wide += "volumes: [*v";
  for (int i = 0; i < 20000; ++i) wide += ", *v";
  wide += "]\n";
  config = parse_cluster_config(wide);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("more than 100000 YAML nodes"), std::string::npos)
      << config.status().message().substr(0, 2000);
  EXPECT_EQ(first_line(config.status().message()), 6);
}

TEST(ClusterConfigTest, ADocumentOfTooManyNodesIsRefused) {
  std::string text =
      "nodes:\n  - {name: n1, address: 10.0.0.1}\n  - {name: n2, address: 10.0.0.2}\n";
  text += "volumes:\n  - {name: v, size: 1MiB, primary: n1, path: /p, allowed_peers: [app],\n";
  text += "     secret: 0123456789abcdef, replicas: [\n";   // 6
  for (int i = 0; i < 100000; ++i) text += "       n2,\n";  // 7 on
  text += "     ]}\n";
  auto config = parse_cluster_config(text);
  ASSERT_FALSE(config.ok());
  // Nodes so far: 1 root, 2 keys+values... the 100001st is a replica.
  const std::string& message = config.status().message();
  EXPECT_NE(message.find("the document has more than 100000 YAML nodes"), std::string::npos)
      << message.substr(0, 500);
  EXPECT_GT(first_line(message), 7);
  EXPECT_LE(first_line(message), line_count(text));
}

TEST(ClusterConfigTest, AddressesAndHostNamesThatAreValid) {
  auto config = parse_cluster_config(
      "nodes:\n"
      "  - {name: a, address: db-1.example.com, listen: 0.0.0.0}\n"
      "  - {name: b, address: 'fe80::1', listen: '::'}\n"
      "  - {name: c, address: localhost, port: 7451, listen: 127.0.0.1}\n"
      "  - {name: d, address: node4.example., port: 65535}\n"
      "  - {name: e, address: 10.0.0.5, port: 1, metrics: '[::1]:9942'}\n"
      "volumes:\n"
      "  - {name: v, size: 64TiB, primary: a, replicas: [b], allowed_peers: [app],\n"
      "     paths: {a: /dev/dax0.0, b: /dev/dax1.0}, secret: 0123456789abcdef}\n");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->nodes[0].address, "db-1.example.com");
  EXPECT_EQ(config->nodes[1].listen, "::");
  EXPECT_EQ(config->nodes[3].port, 65535);
  EXPECT_EQ(config->volumes[0].size, 64ull << 40);  // the largest volume
}

TEST(ClusterConfigTest, ParseDuration) {
  EXPECT_EQ(*parse_duration("200ms"), milliseconds(200));
  EXPECT_EQ(*parse_duration("0ms"), milliseconds(0));
  EXPECT_EQ(*parse_duration("5s"), milliseconds(5000));
  EXPECT_EQ(*parse_duration("2m"), milliseconds(120000));
  EXPECT_EQ(*parse_duration("1440m"), milliseconds(86400000));
  struct Case {
    const char* text;
    const char* fragment;
  };
  const Case cases[] = {
      {"", "empty"},
      {"5", "a unit is required"},
      {"-1s", "negative"},
      {"1.5s", "fractions"},
      {"5h", "unknown unit 'h'"},
      {"5 s", "unknown unit ' s'"},
      {"ms", "expected a number"},
      {"1441m", "too large"},
      {"99999999999999999999999ms", "too large"},
  };
  for (const auto& c : cases) {
    auto d = parse_duration(c.text);
    ASSERT_FALSE(d.ok()) << c.text;
    EXPECT_NE(d.status().message().find(c.fragment), std::string::npos)
        << c.text << ": " << d.status().message();
  }
}

TEST(ClusterConfigTest, ParseRate) {
  EXPECT_EQ(*parse_rate("100MiB/s"), 100u << 20);
  EXPECT_EQ(*parse_rate("1G/s"), 1u << 30);
  EXPECT_EQ(*parse_rate("512 KiB/s"), 512u << 10);
  EXPECT_EQ(*parse_rate("4096/s"), 4096u);
  EXPECT_EQ(*parse_rate("unlimited"), 0u);
  EXPECT_EQ(*parse_rate("0"), 0u);
  EXPECT_EQ(*parse_rate("0/s"), 0u);
  for (const char* bad : {"", "/s", "100MiB", "100MiB/m", "fast", "1.5GiB/s", "-1M/s", "100X/s",
                          "Unlimited", "100MiB/s "}) {
    auto rate = parse_rate(bad);
    EXPECT_FALSE(rate.ok()) << bad;
    if (!rate.ok()) {
      EXPECT_EQ(rate.status().code(), Errc::kInvalidArgument);
      EXPECT_EQ(rate.status().message().rfind("invalid rate '" + std::string(bad) + "': ", 0), 0u)
          << rate.status().message();
    }
  }
}

TEST(ClusterConfigTest, RecoveryKeysOfOneVolume) {
  auto config = parse_cluster_config(with_volume({{"path", "/dev/dax0.0"}},
                                                 "    chunk: 1MiB\n"
                                                 "    resync_rate: 4KiB/s\n"  // below the minimum
                                                 "    after_split_brain: refuse\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            "<config>:14:18: volumes[0].resync_rate: '4KiB/s' is 4096 bytes per second; the least "
            "is 1MiB/s (did you mean MiB/s?), or 'unlimited'");
  config = parse_cluster_config(with_volume({{"path", "/dev/dax0.0"}},
                                            "    chunk: 4KiB\n"
                                            "    resync_rate: 1MiB/s\n"
                                            "    after_split_brain: overwrite_replica\n"
                                            "    metadata:\n"
                                            "      n3: /mnt/pmem/v.meta\n"
                                            "      n1: /mnt/pmem//v.meta\n"));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  const ClusterVolume& v = config->volumes[0];
  EXPECT_EQ(v.chunk, 4096u);
  EXPECT_EQ(v.resync_rate, 1u << 20);
  EXPECT_EQ(v.after_split_brain, SplitBrainPolicy::kOverwriteReplica);
  // As written; a device path's default lives in /var/lib/pmirror.
  EXPECT_EQ(v.metadata_paths,
            (std::map<std::string, std::string>{{"n1", "/mnt/pmem//v.meta"},
                                                {"n2", "/var/lib/pmirror/v.pmirror"},
                                                {"n3", "/mnt/pmem/v.meta"}}));
  // `metadata:` with nothing under it: every default.
  config = parse_cluster_config(with_volume({}, "    metadata:\n"));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->volumes[0].metadata_paths.at("n2"), "/pmem/v.pmirror");
}

TEST(ClusterConfigTest, ParseHostPort) {
  auto v4 = parse_host_port("127.0.0.1:9942");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 9942);
  auto v6 = parse_host_port("[::1]:80");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->to_string(), "[::1]:80");
  EXPECT_EQ(parse_host_port("metrics.local:1")->host, "metrics.local");
  for (const char* bad :
       {"", "host", ":80", "host:", "host:0", "host:65536", "host:x", "::1:80", "[::1]", "[::1:80",
        "[zz]:80", "a b:80", "999.1.1.1:80", "a_b:80", "-a:80", "a..b:80"}) {
    EXPECT_FALSE(parse_host_port(bad).ok()) << bad;
  }
}

TEST(ClusterConfigTest, ParseSizeAcceptsUnits) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"1", 1},
      {"4096", 4096},
      {"4096B", 4096},
      {"1K", 1024},
      {"1k", 1024},
      {"1KB", 1024},
      {"1KiB", 1024},
      {"64M", 64ull << 20},
      {"64MiB", 64ull << 20},
      {"64 MiB", 64ull << 20},
      {"1G", 1ull << 30},
      {"1GB", 1ull << 30},
      {"3GiB", 3ull << 30},
      {"2T", 2ull << 40},
      {"2TiB", 2ull << 40},
      {"16777215T", 16777215ull << 40},  // largest whole-TiB count that fits
      {"18446744073709551615", UINT64_MAX},
  };
  for (const auto& c : cases) {
    auto size = parse_size(c.text);
    ASSERT_TRUE(size.ok()) << c.text << ": " << size.status().to_string();
    EXPECT_EQ(*size, c.bytes) << c.text;
  }
}

TEST(ClusterConfigTest, ParseSizeRejectsJunk) {
  struct Case {
    const char* text;
    const char* fragment;
  };
  const Case cases[] = {
      {"", "empty"},
      {"-1", "negative"},
      {"-1G", "negative"},
      {"+5", "without a sign"},
      {"1.5G", "fractions"},
      {"0.5", "fractions"},
      {"1,5G", "fractions"},
      {"0", "greater than zero"},
      {"0G", "greater than zero"},
      {"G", "expected a number"},
      {"abc", "expected a number"},
      {"10X", "unknown unit 'X'"},
      {"10GiBs", "unknown unit"},
      {"10Gb", "unknown unit"},
      {"10ib", "unknown unit"},
      {"10 ", "trailing spaces"},
      {"1 2", "unknown unit"},
      {"0x10", "unknown unit"},
      {"16777216T", "too large"},
      {"18446744073709551616", "too large"},
      {"99999999999999999999999G", "too large"},
  };
  for (const auto& c : cases) {
    auto size = parse_size(c.text);
    ASSERT_FALSE(size.ok()) << "'" << c.text << "' parsed as " << *size;
    EXPECT_NE(size.status().message().find(c.fragment), std::string::npos)
        << "'" << c.text << "': " << size.status().message();
  }
}

// A cluster whose volume "v" (replica on n2) reads its secret from `path`
// (line 12).
std::string with_secret_file(const std::string& path) {
  return with_volume({{"secret", ""}, {"replicas", "[n2]"}}, "    secret_file: " + path + "\n");
}

// daemon_config_for(n2) on with_secret_file(path).
Result<DaemonConfig> daemon_with_secret_file(const std::string& path) {
  auto cluster = parse_cluster_config(with_secret_file(path));
  if (!cluster.ok()) return cluster.status();
  return daemon_config_for(*cluster, "n2");
}

TEST(ClusterConfigTest, SecretFileIsReadAndOneNewlineStripped) {
  TempDir dir;
  struct Case {
    std::string contents;
    std::string secret;
  };
  const Case cases[] = {
      {"0123456789abcdef", "0123456789abcdef"},
      {"0123456789abcdef\n", "0123456789abcdef"},
      {"0123456789abcdef\n\n", "0123456789abcdef\n"},  // only one newline is stripped
      {std::string(4096, 'x'), std::string(4096, 'x')},
  };
  for (const auto& c : cases) {
    std::string path = dir.write("secret", c.contents, 0600);
    auto config = daemon_with_secret_file(path);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    EXPECT_EQ(config->volumes[0].secret, c.secret);
  }
  // 0400 is fine too: only group/other bits are refused.
  std::string readonly = dir.write("readonly", kSecret, 0400);
  EXPECT_TRUE(daemon_with_secret_file(readonly).ok());
}

TEST(ClusterConfigTest, SecretFileProblemsAreReportedWithTheLine) {
  TempDir dir;
  struct Case {
    const char* what;
    std::string path;
    const char* fragment;
  };
  const Case cases[] = {
      {"group readable", dir.write("g", kSecret, 0640), "has mode 0640"},
      {"world readable", dir.write("o", kSecret, 0604), "chmod 600"},
      {"group writable", dir.write("gw", kSecret, 0620), "lets group or others access it"},
      {"empty", dir.write("empty", "", 0600), "is empty"},
      {"only a newline", dir.write("newline", "\n", 0600), "is empty"},
      {"too large", dir.write("large", std::string(4097, 'x'), 0600), "at most 4096 bytes"},
      {"too short", dir.write("short", "abc\n", 0600), "too short (3 characters)"},
      {"directory", dir.path().string(), "not a regular file"},
      {"missing", (dir.path() / "absent").string(), "No such file or directory"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto config = daemon_with_secret_file(c.path);
    ASSERT_FALSE(config.ok());
    const std::string& message = config.status().message();
    EXPECT_EQ(config.status().code(), Errc::kConfigError);
    EXPECT_EQ(message.rfind("<config>:12:18: volumes[0].secret_file: ", 0), 0u) << message;
    EXPECT_NE(message.find(c.fragment), std::string::npos) << message;
    EXPECT_NE(message.find(c.path), std::string::npos) << message;
  }
}

TEST(ClusterConfigTest, UnreadableSecretFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempDir dir;
  std::string path = dir.write("noread", kSecret, 0200);
  auto config = daemon_with_secret_file(path);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("Permission denied"), std::string::npos)
      << config.status().message();
}

TEST(ClusterConfigTest, LoadReadsFileAndNamesItInErrors) {
  TempDir dir;
  std::string good = dir.write("good.yaml", with_volume());
  auto config = load_cluster_config(good);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->source, good);
  EXPECT_EQ(config->volumes.size(), 1u);

  std::string bad = dir.write("bad.yaml", "daemon:\n  log_level: loud\n" + with_volume());
  config = load_cluster_config(bad);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message().rfind(bad + ":2:14: daemon.log_level", 0), 0u)
      << config.status().message();

  std::string missing = (dir.path() / "missing.yaml").string();
  config = load_cluster_config(missing);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), Errc::kConfigError);
  EXPECT_NE(config.status().message().find(missing), std::string::npos);
  EXPECT_NE(config.status().message().find("No such file or directory"), std::string::npos);

  config = load_cluster_config(dir.path().string());
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("is a directory"), std::string::npos)
      << config.status().message();
}

TEST(ClusterConfigTest, CheckClusterFileListsEveryProblem) {
  TempDir dir;
  // Valid: nothing to report (n2's copy is created in a directory that
  // exists, its state pool too).
  std::string secret = dir.write("v.secret", kSecret);
  std::string good = dir.write(
      "good.yaml",
      with_volume({{"path", (dir.path() / "v.img").string()}, {"secret", ""}, {"replicas", "[n2]"}},
                  "    secret_file: " + secret + "\n    create: true\ndaemon:\n" +
                      "  state_pool: " + (dir.path() / "state").string() + "\n"));
  EXPECT_EQ(check_cluster_file(good, "n2"), std::vector<std::string>{});
  EXPECT_EQ(check_cluster_file(good), std::vector<std::string>{});  // no node: every secret
  // ... but the host that matches no node is told so: pmirrord would refuse
  // to start here without --node (the test machine is none of n1..n3).
  std::vector<std::string> warnings;
  EXPECT_EQ(check_cluster_file(good, {}, &warnings), std::vector<std::string>{});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0].rfind(good + ": warning: this machine's host name '", 0), 0u)
      << warnings[0];
  EXPECT_NE(warnings[0].find("is not a node in " + good + " (nodes: n1, n2, n3)"),
            std::string::npos)
      << warnings[0];
  warnings.clear();
  EXPECT_EQ(check_cluster_file(good, "n2", &warnings), std::vector<std::string>{});
  EXPECT_TRUE(warnings.empty()) << "a named node is no surprise";

  // A parse problem and an unreadable secret file are both reported, in
  // file order.
  std::string open_secret = dir.write("open.secret", kSecret, 0644);
  std::string bad =
      dir.write("bad.yaml", "daemon:\n  log_level: loud\n" + with_secret_file(open_secret));
  auto problems = check_cluster_file(bad);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].rfind(bad + ":2:14: daemon.log_level", 0), 0u) << problems[0];
  EXPECT_EQ(
      problems[1].rfind(
          bad + ":14:18: volumes[0].secret_file: secret file " + open_secret + " has mode 0644", 0),
      0u)
      << problems[1];

  // A node that takes no part in the volume does not need its secret.
  EXPECT_EQ(check_cluster_file(bad, "n3").size(), 1u);
  // An unknown --node is a problem too.
  problems = check_cluster_file(good, "n9");
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("--node n9: no such node"), std::string::npos) << problems[0];

  // The node's existing plain file must have the volume's size.
  std::string image = dir.write("v.img", std::string(8192, '\0'));
  std::string sized = dir.write(
      "sized.yaml", with_volume({{"path", image}, {"secret", ""}, {"replicas", "[n2]"}},
                                "    secret_file: " + secret + "\ndaemon:\n  state_pool: " +
                                    (dir.path() / "state").string() + "\n"));
  problems = check_cluster_file(sized, "n2");
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0], sized + ":10:11: volumes[0].paths.n2: volume 'v' (" + image +
                             "): the file is 8192 bytes but the configured size is 1048576 "
                             "bytes; existing files are never resized: fix size: or use another "
                             "path");

  problems = check_cluster_file((dir.path() / "absent.yaml").string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("No such file or directory"), std::string::npos);
}

// What pmirrord's start refuses before it creates or maps anything, the
// check refuses too, in the start's words (the start calls the same
// check_volume_paths and check_state_pool_path).
TEST(ClusterConfigTest, CheckClusterFileRefusesWhatTheStartRefuses) {
  TempDir dir;
  const std::string base = dir.path().string();
  // n2's copy, its metadata pool and its state pool, each where given.
  auto cluster = [&](const std::string& copy, const std::string& state_pool,
                     const std::string& metadata = "") {
    std::string extra = "    create: true\n";
    if (!metadata.empty()) extra += "    metadata: {n2: " + metadata + "}\n";
    return dir.write("cluster.yaml",
                     with_volume({{"path", copy}, {"replicas", "[n2]"}},
                                 extra + "daemon:\n  state_pool: " + state_pool + "\n"));
  };
  // The one problem n2's check finds in `file` ("" and a failure if not one).
  auto the_problem = [](const std::string& file) {
    auto problems = check_cluster_file(file, "n2");
    EXPECT_EQ(problems.size(), 1u) << ::testing::PrintToString(problems);
    return problems.size() == 1 ? problems[0] : std::string();
  };
  const std::string state = base + "/pmirrord.state";
  std::string file = cluster(base + "/v.img", state);
  EXPECT_EQ(check_cluster_file(file, "n2"), std::vector<std::string>{});

  // The copy's directory is missing.
  file = cluster(base + "/missing/v.img", state);
  EXPECT_EQ(check_cluster_file(file, "n2"),
            std::vector<std::string>{file + ":10:11: volumes[0].paths.n2: directory " + base +
                                     "/missing for volume 'v' (" + base +
                                     "/missing/v.img) does not exist; create it (mkdir -p " + base +
                                     "/missing)"});
  VolumeConfig copy;
  copy.name = "v";
  copy.path = base + "/missing/v.img";
  copy.size = 1 << 20;
  copy.create = true;
  EXPECT_EQ(check_volume_paths(copy, "n2").message(),
            "directory " + base + "/missing for volume 'v' (" + base +
                "/missing/v.img) does not exist; create it (mkdir -p " + base + "/missing)");

  // The state pool's directory is no directory (a file) ...
  dir.write("plain", "x");
  file = cluster(base + "/v.img", base + "/plain/pmirrord.state");
  std::string problem = the_problem(file);
  EXPECT_NE(
      problem.find(": daemon.state_pool: opening the state pool: cannot look up state "
                   "pool " +
                   base + "/plain/pmirrord.state: a component of the path is not a directory"),
      std::string::npos)
      << problem;
  EXPECT_EQ(problem.substr(problem.find("opening the state pool")),
            check_state_pool_path(base + "/plain/pmirrord.state").message());
  // ... or not there at all.
  file = cluster(base + "/v.img", base + "/nostate/pmirrord.state");
  problem = the_problem(file);
  EXPECT_NE(problem.find(": daemon.state_pool: opening the state pool: directory " + base +
                         "/nostate for state pool " + base +
                         "/nostate/pmirrord.state does not exist; create it (mkdir -p " + base +
                         "/nostate)"),
            std::string::npos)
      << problem;

  // The copy's metadata pool's directory is missing.
  file = cluster(base + "/v.img", state, base + "/nowhere/v.pmirror");
  problem = the_problem(file);
  EXPECT_NE(
      problem.find("volumes[0].paths.n2: volume 'v' on node n2: directory " + base +
                   "/nowhere for copy metadata " + base +
                   "/nowhere/v.pmirror does not exist; create it (mkdir -p " + base + "/nowhere)"),
      std::string::npos)
      << problem;

  // Something at the copy's path that is no volume: a directory, a FIFO.
  fs::create_directory(base + "/adir");
  file = cluster(base + "/adir", state);
  problem = the_problem(file);
  EXPECT_NE(problem.find("volume 'v' (" + base + "/adir): the path is a directory"),
            std::string::npos)
      << problem;
  ASSERT_EQ(::mkfifo((base + "/fifo").c_str(), 0600), 0) << std::strerror(errno);
  file = cluster(base + "/fifo", state);
  problem = the_problem(file);
  EXPECT_NE(problem.find("volume 'v' (" + base +
                         "/fifo): the path is not a regular file or devdax device"),
            std::string::npos)
      << problem;
}

// ---------------------------------------------------- files shared on a host

// n1 is this machine (loopback), its daemon's files in `dir`; n2 is at a
// documentation address, another machine. Volumes (line 5 on) are served
// by n1 and n2; `extra_nodes` go after n2 (line 4 on).
class SharedFilesTest : public ::testing::Test {
 protected:
  std::string d(const std::string& name) const { return (dir_.path() / name).string(); }

  // A 1 MiB file (the volumes' size).
  std::string image(const std::string& name) {
    std::string path = d(name);
    std::ofstream(path).close();
    EXPECT_EQ(::truncate(path.c_str(), 1 << 20), 0);
    return path;
  }

  static std::string volume(const std::string& name, const std::string& path,
                            const std::string& extra = "") {
    return "  - {name: " + name +
           ", size: 1MiB, primary: n2, replicas: [n1], allowed_peers: [app], secret: "
           "0123456789abcdef, path: " +
           path + extra + "}\n";
  }

  std::string write(const std::vector<std::string>& volumes, const std::string& extra_nodes = "",
                    const std::string& n1_files = "") {
    std::string text =
        "nodes:\n  - {name: n1, address: 127.0.0.1, " +
        (n1_files.empty() ? "state_pool: " + d("n1.state") + ", control_socket: " + d("n1.sock")
                          : n1_files) +
        "}\n  - {name: n2, address: 203.0.113.7}\n" + extra_nodes + "volumes:\n";
    for (const auto& v : volumes) text += v;
    return file_ = dir_.write("cluster.yaml", text);
  }

  // "FILE:LINE:COL" of the first `needle` on line `line` of the file.
  std::string at(int line, const std::string& needle, size_t skip = 0) const {
    std::ifstream in(file_);
    std::string text;
    for (int i = 0; i < line; ++i) std::getline(in, text);
    size_t column = text.find(needle);
    for (size_t k = 0; k < skip; ++k) column = text.find(needle, column + 1);
    EXPECT_NE(column, std::string::npos) << needle << " not on line " << line << ": " << text;
    return file_ + ":" + std::to_string(line) + ":" + std::to_string(column + needle.size() + 1);
  }

  TempDir dir_;
  std::string file_;
};

TEST_F(SharedFilesTest, AVolumeLinkedToAnotherIsTheSameFile) {
  std::string v = image("v.img");
  std::string w = d("w.img");
  ASSERT_EQ(::symlink(v.c_str(), w.c_str()), 0);
  struct stat st {};
  ASSERT_EQ(::stat(v.c_str(), &st), 0);
  write({volume("v", v), volume("w", w)});
  const std::string expected =
      at(6, "path: ") + ": volumes[1].paths.n1: the copy of volume 'w' on node 'n1', " + w +
      ", and the copy of volume 'v' on node 'n1', " + v + " (at " + at(5, "path: ") +
      "), are the same file (device " + std::to_string(major(st.st_dev)) + ":" +
      std::to_string(minor(st.st_dev)) + ", inode " + std::to_string(st.st_ino) +
      ": a symbolic or hard link, or a path through one); give each a file of its own (two uses "
      "of one file overwrite each other)";
  // n2 (another machine) uses the same paths: not compared.
  EXPECT_EQ(check_cluster_file(file_, "n1"), std::vector<std::string>{expected});

  // pmirrord refuses it with the same message.
  auto cluster = load_cluster_config(file_);
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
  auto daemon = daemon_config_for(*cluster, "n1");
  ASSERT_FALSE(daemon.ok());
  EXPECT_EQ(daemon.status().code(), Errc::kConfigError);
  EXPECT_EQ(daemon.status().message(), expected);

  // A hard link too.
  ASSERT_EQ(::unlink(w.c_str()), 0);
  ASSERT_EQ(::link(v.c_str(), w.c_str()), 0);
  EXPECT_EQ(check_cluster_file(file_, "n1"), std::vector<std::string>{expected});
}

TEST_F(SharedFilesTest, FilesNotCreatedYetCompareWithTheirLinksResolved) {
  std::filesystem::create_directory(d("real"));
  ASSERT_EQ(::symlink(d("real").c_str(), d("linked").c_str()), 0);
  // A dangling link names the file creating it would make.
  ASSERT_EQ(::symlink(d("real/x.img").c_str(), d("dangling").c_str()), 0);
  write({volume("v", d("real/v.img"), ", create: true"),
         volume("w", d("linked/../linked/v.img"), ", create: true"),
         volume("x", d("real/x.img"), ", create: true"),
         volume("y", d("dangling"), ", create: true")});
  auto problems = check_cluster_file(file_, "n1");
  ASSERT_EQ(problems.size(), 3u) << ::testing::PrintToString(problems);
  EXPECT_EQ(problems[0].rfind(at(6, "path: ") + ": volumes[1].paths.n1: the copy of volume 'w'", 0),
            0u)
      << problems[0];
  EXPECT_NE(problems[0].find("(both name " + d("real/v.img") + " once links are followed)"),
            std::string::npos)
      << problems[0];
  // ... and so are their default metadata pools beside them.
  EXPECT_EQ(problems[1].rfind(at(6, "path: ") +
                                  ": volumes[1].paths.n1: the metadata pool of "
                                  "volume 'w' on node 'n1' (the default), " +
                                  d("linked/../linked/v.img.pmirror"),
                              0),
            0u)
      << problems[1];
  EXPECT_EQ(problems[2].rfind(at(8, "path: ") + ": volumes[3].paths.n1: the copy of volume 'y'", 0),
            0u)
      << problems[2];
}

TEST_F(SharedFilesTest, DaemonFilesShareNothingWithVolumesOrEachOther) {
  struct Case {
    const char* what;
    std::vector<std::string> volumes;
    std::string n1_files;  // empty: n1.state and n1.sock
    int line;
    std::string needle;  // the value the problem is reported at, on `line`
    std::string fragment;
  };
  const Case cases[] = {
      {"a volume on the state pool",
       {volume("v", d("n1.state"))},
       "",
       5,
       "path: ",
       "volumes[0].paths.n1: the copy of volume 'v' on node 'n1', " + d("n1.state") +
           ", and the state pool of node 'n1', " + d("n1.state") + " (at "},
      {"a metadata pool on the state pool",
       {volume("v", d("v.img"), ", metadata: {n1: " + d("n1.state") + "}")},
       "",
       5,
       "n1: ",
       "volumes[0].metadata.n1: the metadata pool of volume 'v' on node 'n1', " + d("n1.state") +
           ", and the state pool of node 'n1'"},
      {"a volume on the control socket",
       {volume("v", d("n1.sock"))},
       "",
       5,
       "path: ",
       "volumes[0].paths.n1: the copy of volume 'v' on node 'n1', " + d("n1.sock") +
           ", and the control socket of node 'n1'"},
      {"the control socket on the state pool",
       {volume("v", d("v.img"))},
       "state_pool: " + d("p") + ", control_socket: " + d("p"),
       2,
       "control_socket: ",
       "nodes[0].control_socket: the control socket of node 'n1', " + d("p") +
           ", and the state pool of node 'n1', " + d("p")},
      {"the default state pool on a volume",
       {volume("v", "/var/lib/pmirror/pmirrord.state")},
       "control_socket: " + d("n1.sock"),
       5,
       "path: ",
       "and the state pool of node 'n1' (the default), /var/lib/pmirror/pmirrord.state"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    write(c.volumes, "", c.n1_files);
    // The one shared file; beside it, what the start refuses in a path
    // (e.g. a copy that does not exist yet, without create: true).
    auto problems = check_cluster_file(file_, "n1");
    auto shared = std::find_if(problems.begin(), problems.end(), [&](const std::string& p) {
      return p.find("are the same file") != std::string::npos;
    });
    ASSERT_NE(shared, problems.end()) << ::testing::PrintToString(problems);
    EXPECT_EQ(std::count_if(problems.begin(), problems.end(),
                            [](const std::string& p) {
                              return p.find("are the same file") != std::string::npos;
                            }),
              1)
        << ::testing::PrintToString(problems);
    EXPECT_EQ(shared->rfind(at(c.line, c.needle) + ": ", 0), 0u) << *shared;
    EXPECT_NE(shared->find(c.fragment), std::string::npos) << *shared;
    auto cluster = load_cluster_config(file_);
    ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
    auto daemon = daemon_config_for(*cluster, "n1");
    ASSERT_FALSE(daemon.ok());
    EXPECT_EQ(daemon.status().message(), *shared);
  }
}

TEST_F(SharedFilesTest, WhichNodesShareTheHost) {
  // n3 at another loopback address: this machine too. Its state pool is
  // n1's copy of v.
  std::string v = image("v.img");
  const std::string n3 = "  - {name: n3, address: 127.0.0.3, state_pool: " + v +
                         ", control_socket: " + d("n3.sock") + "}\n";
  write({volume("v", v)}, n3);
  auto problems = check_cluster_file(file_, "n1");
  ASSERT_EQ(problems.size(), 1u) << ::testing::PrintToString(problems);
  EXPECT_EQ(problems[0].rfind(at(6, "path: ") +
                                  ": volumes[0].paths.n1: the copy of volume 'v' on "
                                  "node 'n1', " +
                                  v + ", and the state pool of node 'n3', " + v,
                              0),
            0u)
      << problems[0];
  // Without --node: the loopback nodes are this machine's.
  EXPECT_EQ(check_cluster_file(file_), problems);
  auto cluster = load_cluster_config(file_);
  ASSERT_TRUE(cluster.ok());
  EXPECT_FALSE(daemon_config_for(*cluster, "n3").ok());  // n3's own file
  EXPECT_FALSE(daemon_config_for(*cluster, "n1").ok());

  // Nodes on one address (not this machine's): the same machine. n5's
  // state pool is a link to n4's copy of w.
  std::string w = image("w.img");
  ASSERT_EQ(::symlink(w.c_str(), d("w.link").c_str()), 0);
  const std::string n45 =
      "  - {name: n4, address: 198.51.100.4, state_pool: " + d("n4.state") +
      ", control_socket: " + d("n4.sock") + "}\n" +
      "  - {name: n5, address: 198.51.100.4, port: 7451, state_pool: " + d("w.link") +
      ", control_socket: " + d("n5.sock") + "}\n";
  write({"  - {name: w, size: 1MiB, primary: n2, replicas: [n4], allowed_peers: [app], secret: "
         "0123456789abcdef, path: " +
         w + "}\n"},
        n45);
  problems = check_cluster_file(file_, "n4");
  ASSERT_EQ(problems.size(), 1u) << ::testing::PrintToString(problems);
  EXPECT_NE(problems[0].find("the copy of volume 'w' on node 'n4', " + w +
                             ", and the state pool of node 'n5', " + d("w.link")),
            std::string::npos)
      << problems[0];
  // n1 (loopback) does not share 198.51.100.4's machine; n5 does.
  EXPECT_EQ(check_cluster_file(file_, "n1"), std::vector<std::string>{});
  EXPECT_EQ(check_cluster_file(file_, "n5"), problems);
  cluster = load_cluster_config(file_);
  ASSERT_TRUE(cluster.ok());
  EXPECT_TRUE(daemon_config_for(*cluster, "n1").ok());
  EXPECT_FALSE(daemon_config_for(*cluster, "n4").ok());
}

TEST_F(SharedFilesTest, DevicesCompareByDeviceNumber) {
  // /dev/null stands in for a devdax device: a character device.
  struct stat st {};
  if (::stat("/dev/null", &st) != 0 || !S_ISCHR(st.st_mode)) GTEST_SKIP() << "no /dev/null";
  ASSERT_EQ(::symlink("/dev/null", d("dax").c_str()), 0);
  write({volume("v", "/dev/null", ", metadata: {n1: " + d("v.pmirror") + "}"),
         volume("w", d("dax"), ", metadata: {n1: " + d("w.pmirror") + "}")});
  // Beside it, each path is refused as the start refuses it: /dev/null is
  // no devdax device.
  auto problems = check_cluster_file(file_, "n1");
  ASSERT_EQ(problems.size(), 3u) << ::testing::PrintToString(problems);
  EXPECT_NE(problems[0].find("volume 'v' (/dev/null): the path is a character device that is "
                             "not devdax"),
            std::string::npos)
      << problems[0];
  std::swap(problems[0], problems[2]);
  EXPECT_NE(problems[0].find("the copy of volume 'w' on node 'n1', " + d("dax") +
                             ", and the copy of volume 'v' on node 'n1', /dev/null"),
            std::string::npos)
      << problems[0];
  EXPECT_NE(problems[0].find("(both are device " + std::to_string(major(st.st_rdev)) + ":" +
                             std::to_string(minor(st.st_rdev)) + ")"),
            std::string::npos)
      << problems[0];
}

TEST_F(SharedFilesTest, DefaultDaemonFilesOfTwoLoopbackNodesClash) {
  // Two daemons on this machine at different loopback addresses, both with
  // the default state pool and control socket: the parser cannot see it
  // (different addresses), the host check can.
  write({volume("v", d("v.img"), ", create: true")}, "  - {name: n3, address: 127.0.0.3}\n",
        "state_pool: " + d("n1.state"));
  auto problems = check_cluster_file(file_, "n1");
  ASSERT_EQ(problems.size(), 1u) << ::testing::PrintToString(problems);
  EXPECT_EQ(problems[0].rfind(at(4, "- ") + ": nodes[2]: the control socket of node 'n3' (the "
                                            "default), /run/pmirror/pmirrord.sock, and the "
                                            "control socket of node 'n1' (the default)",
                              0),
            0u)
      << problems[0];
}

// The shipped example must stay valid. Its secret_file paths (/etc/pmirror/)
// do not exist here, so point them at temp files with the right mode.
TEST(ClusterConfigTest, ExampleFileParses) {
  std::ifstream in(PMIRROR_EXAMPLE_CONFIG);
  ASSERT_TRUE(in) << PMIRROR_EXAMPLE_CONFIG;
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();

  TempDir dir;
  dir.write("db0.secret", "db0-secret-0123456789\n");
  dir.write("log0.secret", "log0-secret-0123456789\n");
  const std::string from = "/etc/pmirror/";
  const std::string to = dir.path().string() + "/";
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }

  auto cluster = parse_cluster_config(text, PMIRROR_EXAMPLE_CONFIG);
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
  EXPECT_EQ(cluster->name, "prod");
  ASSERT_EQ(cluster->nodes.size(), 3u);
  EXPECT_EQ(cluster->nodes[0].transport, transport::Kind::kRdma);
  EXPECT_EQ(cluster->nodes[2].transport, transport::Kind::kTcp);
  EXPECT_EQ(cluster->nodes[2].daemon.state_pool, "/mnt/pmem/pmirrord.state");
  ASSERT_TRUE(cluster->daemon.metrics.has_value());
  ASSERT_EQ(cluster->volumes.size(), 2u);
  EXPECT_EQ(cluster->volumes[0].ack, 2u);
  EXPECT_EQ(cluster->volumes[1].ack, 1u);
  EXPECT_EQ(cluster->volumes[0].chunk, 64u << 10);
  EXPECT_EQ(cluster->volumes[0].resync_rate, 100u << 20);
  EXPECT_EQ(cluster->volumes[0].after_split_brain, SplitBrainPolicy::kRefuse);
  EXPECT_EQ(cluster->volumes[0].metadata_paths,
            (std::map<std::string, std::string>{{"node1", "/mnt/pmem/db0.pmirror"},
                                                {"node2", "/mnt/pmem/db0.pmirror"},
                                                {"node3", "/mnt/pmem/db0.pmirror"}}));
  EXPECT_EQ(cluster->volumes[1].resync_rate, 0u);
  EXPECT_EQ(cluster->volumes[1].metadata_paths.at("node2"), "/var/lib/pmirror/log0.img.pmirror");

  auto node2 = daemon_config_for(*cluster, "node2");
  ASSERT_TRUE(node2.ok()) << node2.status().to_string();
  ASSERT_EQ(node2->volumes.size(), 2u);
  EXPECT_EQ(node2->volumes[0].name, "db0");
  EXPECT_EQ(node2->volumes[0].path, "/dev/dax0.0");
  EXPECT_EQ(node2->volumes[0].secret, "db0-secret-0123456789");
  EXPECT_EQ(node2->volumes[1].name, "log0");
  EXPECT_EQ(node2->volumes[1].size, 256ull << 20);
  EXPECT_EQ(node2->volumes[1].secret, "log0-secret-0123456789");
  EXPECT_EQ(node2->volumes[1].apm, ApmPolicy::kOff);
  auto node3 = daemon_config_for(*cluster, "node3");
  ASSERT_TRUE(node3.ok()) << node3.status().to_string();
  ASSERT_EQ(node3->volumes.size(), 1u);
  EXPECT_EQ(node3->volumes[0].path, "/mnt/pmem/db0");
  auto node1 = daemon_config_for(*cluster, "node1");  // the primary of both
  ASSERT_TRUE(node1.ok()) << node1.status().to_string();
  ASSERT_EQ(node1->volumes.size(), 2u);
  EXPECT_TRUE(node1->volumes[0].configured_primary);
  auto plan = initiator_plan(*cluster, "db0", "node1");
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->replicas.size(), 2u);
  EXPECT_EQ(plan->ack, 2u);
  EXPECT_EQ(plan->metadata_path, "/mnt/pmem/db0.pmirror");
}

}  // namespace
}  // namespace pmirror::config
