// The `on_insufficient` policy: what a persist does when fewer than `ack`
// replicas are in sync. `fail` returns an error at once (the local copy has
// the bytes, the missing replica has them recorded dirty); `block` waits
// until the replica is back and resynced, then returns ok. Real pmirrord
// processes over tcp loopback.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <nlohmann/json.hpp>
#include <pmirror/pmirror.hpp>
#include <string>
#include <vector>

#include "support/cluster.h"

namespace pmirror {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::ClusterVolumeSpec;
using testing::ShmDir;
using testing::TestCluster;

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

json peer_of(const Volume& volume, const std::string& name) {
  json v = json::parse(volume.status_json());
  for (const auto& p : v["peers"]) {
    if (p.value("name", "") == name) return p;
  }
  return json();
}

bool in_sync(const Volume& volume, const std::string& name) {
  json p = peer_of(volume, name);
  return p.is_object() && p.value("state", "") == "connected" &&
         p.value("dirty_chunks", uint64_t{1}) == 0 && !p.contains("resync");
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

class InsufficientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // tcp on loopback, unless the lab runs them over rdma
    // (PMIRROR_TEST_TRANSPORT, _ADDRESS; PMIRROR_TEST_TIME_SCALE stretches
    // the timers for its slower guest).
    cluster_ = std::make_unique<TestCluster>(dir_.path(), env_or("PMIRROR_TEST_TRANSPORT", "tcp"),
                                             env_or("PMIRROR_TEST_ADDRESS", "127.0.0.1"));
    const int scale = std::max(1, std::stoi(env_or("PMIRROR_TEST_TIME_SCALE", "1")));
    cluster_->heartbeat_interval = std::to_string(200 * scale) + "ms";
    cluster_->heartbeat_timeout = std::to_string(1000 * scale) + "ms";
    ::setenv("PMIRROR_RUNTIME_DIR", cluster_->runtime_dir().c_str(), 1);
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", cluster_->logs().c_str());
    cluster_.reset();
    ::unsetenv("PMIRROR_RUNTIME_DIR");
  }

  // app (this process) -> `replicas` (each a started pmirrord), `ack` of
  // them, on_insufficient as given (empty: the default).
  void make_cluster(const std::string& policy, const std::vector<std::string>& replicas = {"n1"},
                    uint32_t ack = 1) {
    cluster_->add_node("app", false);
    for (const std::string& node : replicas) cluster_->add_node(node);
    ClusterVolumeSpec spec;
    spec.size = 4ull << 20;
    spec.primary = "app";
    spec.replicas = replicas;
    spec.ack = ack;
    spec.on_insufficient = policy;
    spec.chunk = "64KiB";
    spec.resync_rate = "unlimited";
    spec.explicit_metadata = true;
    cluster_->add_volume(spec);
    cluster_->write_config();
    for (const std::string& node : replicas) {
      ASSERT_TRUE(cluster_->start(node)) << cluster_->logs();
    }
  }

  ShmDir dir_;
  std::unique_ptr<TestCluster> cluster_;
};

TEST_F(InsufficientTest, FailReturnsAnErrorNamingTheReplicaAndLosesNothing) {
  make_cluster("fail");
  auto opened = Volume::open_from_config(cluster_->config_path(), "v", "app", "app");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Volume& v = **opened;
  ASSERT_TRUE(v.write(0, "before", 6).ok());

  cluster_->daemon("n1").kill9();
  // The persist that finds the replica gone fails, naming it; so do the
  // next ones, at once, while it is away.
  Status failed = v.write(65536, "during", 6);
  for (int i = 0; failed.ok() && i < 50; ++i) failed = v.write(65536, "during", 6);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), Errc::kConnectionError) << failed.to_string();
  EXPECT_NE(failed.message().find("n1"), std::string::npos) << failed.to_string();
  auto start = std::chrono::steady_clock::now();
  Status again = v.write(3 * 65536, "during2", 7);
  EXPECT_FALSE(again.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms) << "fail must not wait";
  EXPECT_GE(peer_of(v, "n1").value("dirty_chunks", uint64_t{0}), 2u) << v.status_json();

  // Back: the dirty chunks are copied and the replica equals the local copy.
  ASSERT_TRUE(cluster_->start("n1")) << cluster_->logs();
  ASSERT_TRUE(testing::eventually([&] { return in_sync(v, "n1"); }, 30s)) << v.status_json();
  ASSERT_TRUE(v.write(5 * 65536, "after", 5).ok());
  opened->reset();
  EXPECT_TRUE(read_file(cluster_->copy_path("app")) == read_file(cluster_->copy_path("n1")));
}

TEST_F(InsufficientTest, BlockWaitsUntilTheReplicaIsBackAndResynced) {
  make_cluster("block");
  auto opened = Volume::open_from_config(cluster_->config_path(), "v", "app", "app");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Volume& v = **opened;
  ASSERT_TRUE(v.write(0, "before", 6).ok());

  cluster_->daemon("n1").kill9();
  std::memcpy(v.data() + 65536, "blocked", 7);
  auto blocked = std::async(std::launch::async, [&] { return v.persist(65536, 7); });
  // Longer than heartbeat_timeout (1 s): the replica is known lost, and the
  // persist still waits instead of failing.
  ASSERT_TRUE(
      testing::eventually([&] { return peer_of(v, "n1").value("state", "") != "connected"; }, 10s))
      << v.status_json();
  EXPECT_EQ(blocked.wait_for(1500ms), std::future_status::timeout)
      << "the persist returned while no replica was in sync: " << blocked.get().to_string();

  ASSERT_TRUE(cluster_->start("n1")) << cluster_->logs();
  ASSERT_EQ(blocked.wait_for(30s), std::future_status::ready) << v.status_json();
  Status done = blocked.get();
  EXPECT_TRUE(done.ok()) << done.to_string();
  EXPECT_TRUE(in_sync(v, "n1")) << v.status_json();
  // It returned only once the bytes were on the replica.
  std::vector<char> replica = read_file(cluster_->copy_path("n1"));
  ASSERT_GE(replica.size(), 65536u + 7);
  EXPECT_EQ(std::string(replica.data() + 65536, 7), "blocked");
  opened->reset();
  EXPECT_TRUE(read_file(cluster_->copy_path("app")) == read_file(cluster_->copy_path("n1")));
}

// One persist wider than the whole activity log (64 extents of 4 MiB) is
// started in pieces that each fit, and still arrives whole.
TEST_F(InsufficientTest, APersistWiderThanTheActivityLogArrivesWhole) {
  cluster_->add_node("app", false);
  cluster_->add_node("n1");
  ClusterVolumeSpec spec;
  spec.size = 288ull << 20;
  spec.primary = "app";
  spec.replicas = {"n1"};
  spec.resync_rate = "unlimited";
  spec.explicit_metadata = true;
  cluster_->add_volume(spec);
  cluster_->write_config();
  ASSERT_TRUE(cluster_->start("n1")) << cluster_->logs();
  auto opened = Volume::open_from_config(cluster_->config_path(), "v", "app", "app");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Volume& v = **opened;
  const uint64_t offset = 12345;
  for (uint64_t i = 16384; i < v.size(); i += 4096) v.data()[i + 7] = std::byte(i / 4096 % 251);
  Status done = v.persist(offset, v.size() - offset);
  ASSERT_TRUE(done.ok()) << done.to_string();
  opened->reset();
  EXPECT_TRUE(read_file(cluster_->copy_path("app")) == read_file(cluster_->copy_path("n1")));
}

// Persists that fail leave their bytes in the local copy: they are dirty
// for every replica, whatever failed and wherever, until a resync copies
// them. Here, with ack 2 of 2 and n2 away, each persist fails, most of them
// before being sent to anyone (the max_in_flight window is full of failed
// persists); n1 stays connected, n2 comes back; both must end equal to the
// local copy without anyone marking them dirty by hand.
TEST_F(InsufficientTest, FailedPersistsLeaveTheirBytesDirtyForEveryReplicaUntilResynced) {
  ASSERT_NO_FATAL_FAILURE(make_cluster("fail", {"n1", "n2"}, 2));
  auto opened = Volume::open_from_config(cluster_->config_path(), "v", "app", "app");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Volume& v = **opened;
  ASSERT_TRUE(v.write(0, "before", 6).ok());

  cluster_->daemon("n2").kill9();
  // Far more than max_in_flight (32) persists, each in a 64 KiB chunk of
  // its own, all failing.
  constexpr int kRecords = 48;
  int failed = 0;
  for (int i = 1; i <= kRecords; ++i) {
    std::string record = "record " + std::to_string(i);
    if (!v.write(uint64_t(i) * 65536, record.data(), record.size()).ok()) ++failed;
  }
  ASSERT_GE(failed, kRecords - 1) << v.status_json();
  // n2 has every one of them dirty; n1, which stayed, got them by a
  // resync (or still has them dirty while it runs).
  EXPECT_GE(peer_of(v, "n2").value("dirty_chunks", uint64_t{0}), uint64_t(kRecords - 1))
      << v.status_json();
  ASSERT_TRUE(testing::eventually([&] { return in_sync(v, "n1"); }, 30s)) << v.status_json();
  std::vector<char> n1 = read_file(cluster_->copy_path("n1"));
  for (int i = 1; i <= kRecords; ++i) {
    std::string record = "record " + std::to_string(i);
    ASSERT_EQ(std::string(n1.data() + uint64_t(i) * 65536, record.size()), record) << i;
  }

  ASSERT_TRUE(cluster_->start("n2")) << cluster_->logs();
  ASSERT_TRUE(testing::eventually([&] { return in_sync(v, "n2"); }, 30s)) << v.status_json();
  auto verified = v.verify("", /*mark_dirty=*/false);
  ASSERT_TRUE(verified.ok()) << verified.status().to_string();
  ASSERT_EQ(verified->size(), 2u);
  for (const auto& peer : *verified) {
    EXPECT_TRUE(peer.status.ok()) << peer.peer << ": " << peer.status.to_string();
    EXPECT_TRUE(peer.mismatches.empty())
        << peer.peer << ": " << peer.mismatches.size() << " mismatching ranges, the first at "
        << peer.mismatches.front().first;
  }
  ASSERT_TRUE(v.write(0, "after", 5).ok());
  opened->reset();
  EXPECT_TRUE(read_file(cluster_->copy_path("app")) == read_file(cluster_->copy_path("n1")));
  EXPECT_TRUE(read_file(cluster_->copy_path("app")) == read_file(cluster_->copy_path("n2")));
}

// Open waits for every replica's answer, but not for one that does not
// answer once the ack policy is met (a dead node's connect timeout: the
// application of a promoted copy waited it for the old primary's node).
// That replica's attempt goes on in the background and brings it in once
// it answers, with what was written meanwhile. Its connect timeout here
// is ten minutes: an open that waited for it would not return before the
// replica is thawed, which happens only after open returned.
TEST_F(InsufficientTest, OpenGoesOnWithoutAReplicaThatDoesNotAnswerOnceTheAckPolicyIsMet) {
  ASSERT_NO_FATAL_FAILURE(make_cluster("", {"n1", "n2"}));
  cluster_->daemon("n2").signal(SIGSTOP);  // its socket still accepts; nothing answers

  auto opening = std::async(std::launch::async, [&] {
    return Volume::open_from_config(cluster_->config_path(), "v", "app", "app",
                                    [](VolumeOptions& o) { o.connect_timeout = 10min; });
  });
  const bool returned = opening.wait_for(120s) == std::future_status::ready;
  cluster_->daemon("n2").signal(SIGCONT);
  ASSERT_TRUE(returned) << "open waited for the replica that does not answer";
  auto opened = opening.get();
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Volume& v = **opened;
  EXPECT_EQ(peer_of(v, "n1").value("state", ""), "connected") << v.status_json();
  ASSERT_TRUE(v.write(0, "while n2 was frozen", 19).ok());

  // Thawed, n2 answers the attempt made at open, is resynced, and holds
  // what was written without it.
  ASSERT_TRUE(testing::eventually([&] { return in_sync(v, "n2"); }, 60s)) << v.status_json();
  ASSERT_TRUE(v.write(65536, "after", 5).ok());
  opened->reset();
  EXPECT_TRUE(read_file(cluster_->copy_path("app")) == read_file(cluster_->copy_path("n1")));
  EXPECT_TRUE(read_file(cluster_->copy_path("app")) == read_file(cluster_->copy_path("n2")));
}

}  // namespace
}  // namespace pmirror
