// What a drbdadm user reaches for (issue 24, item 10), against real pmirrord
// processes on loopback and the test process as the primary through
// libpmirror:
//
//  - `pmirrorctl down VOLUME` on a replica's node ends that volume's session
//    and refuses new ones with a message saying who stopped it and how to
//    bring it back, while the node's other volume goes on being written;
//    `up` serves it again;
//  - `pmirrorctl disconnect VOLUME --peer NODE` on the primary's node keeps
//    the replica away, its writes recorded dirty, its disk `Outdated`;
//    `connect` brings it back, resynced: its bytes equal the primary's and
//    its disk is `UpToDate`.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <pmirror/pmirror.hpp>
#include <string>
#include <thread>

#include "support/cluster.h"
#include "support/daemon_process.h"

namespace pmirror {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::ClusterVolumeSpec;
using testing::RunResult;
using testing::ShmDir;
using testing::TestCluster;

json peer_json(const Volume& volume, const std::string& peer) {
  json j = json::parse(volume.status_json(), nullptr, false);
  if (j.is_object() && j.contains("volumes") && j["volumes"].is_array() && !j["volumes"].empty()) {
    j = j["volumes"][0];
  }
  if (!j.is_object() || !j.contains("peers")) return json();
  for (const auto& p : j["peers"]) {
    if (p.is_object() && p.value("name", "") == peer) return p;
  }
  return json();
}

std::string field(const Volume& volume, const std::string& peer, const char* name) {
  json p = peer_json(volume, peer);
  return p.is_object() && p.contains(name) && p[name].is_string() ? p[name].get<std::string>() : "";
}

uint64_t number(const Volume& volume, const std::string& peer, const char* name) {
  json p = peer_json(volume, peer);
  return p.is_object() && p.contains(name) && p[name].is_number() ? p[name].get<uint64_t>() : 0;
}

bool in_sync(const Volume& volume, const std::string& peer) {
  json p = peer_json(volume, peer);
  return p.is_object() && p.value("state", "") == "connected" &&
         p.value("dirty_chunks", uint64_t{1}) == 0 && !p.contains("resync");
}

std::string diag(const Volume& volume) {
  return "\nprimary status: " + volume.status_json() + "\n";
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

class OperatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // tcp on loopback, unless the lab runs it over rdma
    // (PMIRROR_TEST_TRANSPORT, PMIRROR_TEST_ADDRESS).
    cluster_ = std::make_unique<TestCluster>(dir_.path(), env_or("PMIRROR_TEST_TRANSPORT", "tcp"),
                                             env_or("PMIRROR_TEST_ADDRESS", "127.0.0.1"));
    ::setenv("PMIRROR_RUNTIME_DIR", cluster_->runtime_dir().c_str(), 1);
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", cluster_->logs().c_str());
    cluster_.reset();
    ::unsetenv("PMIRROR_RUNTIME_DIR");
  }

  void add_volume(const std::string& name, const std::vector<std::string>& replicas, uint32_t ack) {
    ClusterVolumeSpec spec;
    spec.name = name;
    spec.size = 4ull << 20;
    spec.primary = "app";
    spec.replicas = replicas;
    spec.ack = ack;
    spec.chunk = "64KiB";
    spec.resync_rate = "unlimited";
    spec.explicit_metadata = true;
    cluster_->add_volume(spec);
  }

  Result<std::unique_ptr<Volume>> open(const std::string& name) {
    return Volume::open_from_config(cluster_->config_path(), name, "app", "app");
  }

  bool wait_in_sync(const Volume& volume, const std::string& peer) {
    return testing::eventually([&] { return in_sync(volume, peer); }, 60s);
  }

  // Fills [offset, +length) with `byte` and persists it.
  static Status write(Volume& volume, uint64_t offset, uint64_t length, unsigned char byte) {
    std::memset(volume.data() + offset, byte, length);
    return volume.persist(offset, length);
  }

  // The bytes of node's copy of `name` at [offset, +length).
  std::string replica_bytes(const std::string& node, const std::string& name, uint64_t offset,
                            uint64_t length) {
    auto bytes = testing::read_file(cluster_->copy_path(node, name));
    if (bytes.size() < offset + length) return "<short copy>";
    return std::string(reinterpret_cast<const char*>(bytes.data()) + offset, length);
  }

  ShmDir dir_;
  std::unique_ptr<TestCluster> cluster_;
};

TEST_F(OperatorTest, DownStopsServingOneVolumeUntilUpAndLeavesTheOtherServed) {
  cluster_->add_node("app", false);
  cluster_->add_node("n1");
  add_volume("v", {"n1"}, 1);
  add_volume("w", {"n1"}, 1);
  cluster_->write_config();
  ASSERT_TRUE(cluster_->start("n1")) << cluster_->logs();
  auto v = open("v");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  auto w = open("w");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE(wait_in_sync(**v, "n1")) << diag(**v);
  ASSERT_TRUE(wait_in_sync(**w, "n1")) << diag(**w);

  RunResult down = cluster_->ctl("n1", {"down", "v"});
  ASSERT_EQ(down.exit, 0) << down.text();
  EXPECT_NE(down.out.find("v: down by an operator on n1: 1 session(s) ended; new sessions are "
                          "refused until `pmirrorctl up v`"),
            std::string::npos)
      << down.text();

  // Its session ended, and every new one is refused saying why and what to do.
  ASSERT_TRUE(testing::eventually(
      [&] {
        return field(**v, "n1", "state") == "refused" &&
               field(**v, "n1", "reason").find("is down on node n1 by an operator") !=
                   std::string::npos;
      },
      60s))
      << diag(**v);
  EXPECT_NE(field(**v, "n1", "reason").find("`pmirrorctl up v` on n1 serves it again"),
            std::string::npos)
      << diag(**v);
  RunResult status = cluster_->ctl("n1", {"status", "v"});
  EXPECT_NE(status.out.find("v role:replica down (by operator)"), std::string::npos)
      << status.text();
  RunResult shown = cluster_->ctl("n1", {"status", "--json"});
  EXPECT_NE(shown.out.find("\"down\": true"), std::string::npos) << shown.text();

  // The other volume is untouched: still connected, and a record written
  // to it arrives.
  EXPECT_EQ(field(**w, "n1", "state"), "connected") << diag(**w);
  ASSERT_TRUE(write(**w, 8192, 4096, 0x5a).ok());
  EXPECT_EQ(replica_bytes("n1", "w", 8192, 4096), std::string(4096, '\x5a'));

  // A reload keeps it down.
  RunResult reload = cluster_->ctl("n1", {"reload"});
  ASSERT_EQ(reload.exit, 0) << reload.text();
  EXPECT_NE(cluster_->ctl("n1", {"status", "v"}).out.find("v role:replica down (by operator)"),
            std::string::npos);

  RunResult up = cluster_->ctl("n1", {"up", "v"});
  ASSERT_EQ(up.exit, 0) << up.text();
  EXPECT_NE(up.out.find("v: served again on n1"), std::string::npos) << up.text();
  ASSERT_TRUE(wait_in_sync(**v, "n1")) << diag(**v);
  ASSERT_TRUE(write(**v, 4096, 4096, 0xa5).ok());
  EXPECT_EQ(replica_bytes("n1", "v", 4096, 4096), std::string(4096, '\xa5'));

  RunResult unknown = cluster_->ctl("n1", {"down", "nope"});
  EXPECT_EQ(unknown.exit, 1) << unknown.text();
  EXPECT_NE(unknown.err.find("no volume 'nope' on node n1"), std::string::npos) << unknown.text();
}

TEST_F(OperatorTest, DisconnectKeepsAReplicaAwayAndConnectResyncsIt) {
  cluster_->add_node("app", false);
  cluster_->add_node("n1");
  cluster_->add_node("n2");
  add_volume("v", {"n1", "n2"}, 1);
  cluster_->write_config();
  ASSERT_TRUE(cluster_->start("n1")) << cluster_->logs();
  ASSERT_TRUE(cluster_->start("n2")) << cluster_->logs();
  auto opened = open("v");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Volume& v = **opened;
  ASSERT_TRUE(wait_in_sync(v, "n1")) << diag(v);
  ASSERT_TRUE(wait_in_sync(v, "n2")) << diag(v);
  EXPECT_EQ(field(v, "n1", "disk"), "UpToDate") << diag(v);

  RunResult disconnect = cluster_->ctl("app", {"disconnect", "v", "--peer", "n1"});
  ASSERT_EQ(disconnect.exit, 0) << disconnect.text();
  EXPECT_NE(disconnect.out.find("v: n1 disconnected by an operator; its writes are recorded "
                                "dirty until `pmirrorctl connect v --peer n1`"),
            std::string::npos)
      << disconnect.text();
  EXPECT_EQ(field(v, "n1", "state"), "disconnected") << diag(v);
  EXPECT_TRUE(peer_json(v, "n1").value("by_operator", false)) << diag(v);

  // Several reconnect periods (reconnect_max 400 ms) later it is still away,
  // and a persist is recorded dirty for it.
  std::this_thread::sleep_for(1500ms);
  ASSERT_TRUE(write(v, 65536, 8192, 0x3c).ok()) << diag(v);
  EXPECT_EQ(field(v, "n1", "state"), "disconnected") << diag(v);
  EXPECT_GE(number(v, "n1", "dirty_bytes"), 65536u) << diag(v);
  EXPECT_EQ(field(v, "n1", "disk"), "Outdated") << diag(v);
  EXPECT_EQ(field(v, "n2", "disk"), "UpToDate") << diag(v);
  RunResult status = cluster_->ctl("app", {"status", "v"});
  EXPECT_NE(status.out.find("  n1 connection:disconnected (by operator) since "), std::string::npos)
      << status.text();
  EXPECT_NE(status.out.find(" disk:Outdated "), std::string::npos) << status.text();
  EXPECT_NE(replica_bytes("n1", "v", 65536, 8192), std::string(8192, '\x3c'));

  RunResult connect = cluster_->ctl("app", {"connect", "v", "--peer", "n1"});
  ASSERT_EQ(connect.exit, 0) << connect.text();
  EXPECT_NE(connect.out.find("v: n1 reconnecting"), std::string::npos) << connect.text();
  ASSERT_TRUE(wait_in_sync(v, "n1")) << diag(v);
  EXPECT_EQ(field(v, "n1", "disk"), "UpToDate") << diag(v);
  EXPECT_FALSE(peer_json(v, "n1").contains("by_operator")) << diag(v);
  EXPECT_EQ(replica_bytes("n1", "v", 0, v.size()),
            std::string(reinterpret_cast<const char*>(v.data()), v.size()));

  RunResult unknown = cluster_->ctl("app", {"disconnect", "v", "--peer", "nope"});
  EXPECT_EQ(unknown.exit, 1) << unknown.text();
  EXPECT_NE(unknown.err.find("has no replica 'nope'"), std::string::npos) << unknown.text();
}

}  // namespace
}  // namespace pmirror
