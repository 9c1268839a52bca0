// The control edge: a volume's typed status and commands, as pmirrorctl
// sees them through the process's control socket (docs/control.md). No
// transport: the volume's side is a set of functions.
#include "initiator/control_edge.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/rfc3339.h"
#include "control/control.h"

namespace pmirror::initiator {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::set<std::string> keys(const json& object) {
  std::set<std::string> out;
  for (const auto& [key, value] : object.items()) out.insert(key);
  return out;
}

VolumeStatus sample_status() {
  VolumeStatus s;
  s.name = "db0";
  s.size = 1 << 20;
  s.path = "/dev/shm/db0";
  s.backing = "file";
  s.metadata = "/dev/shm/db0.pmirror";
  s.generation = 0xabc;
  s.chunk_size = 4096;
  s.promoted = false;
  s.last_sequence = 42;
  s.acknowledged_sequence = 40;
  s.ack_required = 2;
  s.in_sync = 1;
  s.identity = "app";
  s.opened_at = supervisor::SystemTime(std::chrono::seconds(1700000000));
  PeerStatus in_sync;
  in_sync.name = "b";
  in_sync.address = "10.0.0.2:7450";
  in_sync.transport = "tcp";
  in_sync.connection = {supervisor::PeerState::kConnected,
                        supervisor::SystemTime(std::chrono::seconds(1700000001)), "session open"};
  in_sync.method = "apm";
  in_sync.acknowledged_sequence = 42;
  in_sync.behind_since_generation = 0;
  in_sync.generation = 0xabc;
  in_sync.latency_us = {10.5, 20, 30, 7, 95.5};
  PeerStatus syncing = in_sync;
  syncing.name = "c";
  syncing.connection.state = supervisor::PeerState::kSyncing;
  syncing.acknowledged_sequence = 12;
  syncing.lag = 30;
  syncing.dirty_chunks = 3;
  syncing.dirty_bytes = 3 * 4096;
  syncing.behind_since_generation = 0x123;
  syncing.generation = 0;
  syncing.resync = ResyncProgress{4096, 3 * 4096, 4 * 4096, 0, std::nullopt, true};
  PeerStatus unrecorded = in_sync;
  unrecorded.name = "d";
  unrecorded.behind_since_generation.reset();
  unrecorded.resync = ResyncProgress{8192, 4096, 12288, 4096, 1, false};
  s.peers = {in_sync, syncing, unrecorded};
  return s;
}

TEST(ControlEdge, DiskStateIsWhatThePrimaryKnowsOfTheReplicasData) {
  using supervisor::PeerState;
  PeerStatus peer;
  peer.connection.state = PeerState::kConnected;
  EXPECT_EQ(disk_state(peer), "UpToDate") << "connected, nothing dirty";
  peer.lag = 3;
  EXPECT_EQ(disk_state(peer), "UpToDate") << "persists in flight are not missed writes";
  peer.connection.state = PeerState::kLagging;
  EXPECT_EQ(disk_state(peer), "Outdated") << "its writes are recorded dirty";
  peer.connection.state = PeerState::kDisconnected;
  EXPECT_EQ(disk_state(peer), "Unknown") << "away, nothing missed yet";
  peer.dirty_chunks = 2;
  EXPECT_EQ(disk_state(peer), "Outdated") << "away and missed writes";
  peer.connection.state = PeerState::kConnected;
  EXPECT_EQ(disk_state(peer), "Outdated") << "back, not resynced yet";
  peer.connection.state = PeerState::kSyncing;
  EXPECT_EQ(disk_state(peer), "Inconsistent") << "a resync into it is under way";
  peer.connection.state = PeerState::kDisconnected;
  peer.full_sync_pending = true;
  EXPECT_EQ(disk_state(peer), "Inconsistent") << "every chunk is to be copied";
  peer.full_sync_pending = false;
  peer.never_seen = true;
  EXPECT_EQ(disk_state(peer), "Inconsistent") << "never received the volume";

  json v = json::parse(status_json(sample_status()));
  EXPECT_EQ(v["peers"][0]["disk"], "UpToDate");
  EXPECT_EQ(v["peers"][1]["disk"], "Inconsistent");
}

TEST(ControlEdge, StatusNamesTheLeaseFileAndWhatIsLeftOfIt) {
  VolumeStatus s = sample_status();
  s.lease = LeaseStatus{"/run/pmirror/db1.lease", 7250};
  json v = json::parse(status_json(s));
  EXPECT_EQ(v["lease"], (json{{"file", "/run/pmirror/db1.lease"}, {"remaining_ms", 7250}}));
}

TEST(ControlEdge, StatusIsTheObjectOfTheControlDocs) {
  json v = json::parse(status_json(sample_status()));
  EXPECT_EQ(keys(v),
            (std::set<std::string>{"name", "role", "size", "path", "backing", "metadata",
                                   "generation", "chunk_size", "promoted", "last_sequence",
                                   "acknowledged_sequence", "ack_required", "in_sync", "local_only",
                                   "identity", "opened_at", "lease", "peers"}));
  EXPECT_EQ(v["role"], "primary");
  EXPECT_EQ(v["local_only"], false);  // the sample has replicas
  EXPECT_TRUE(v["lease"].is_null());  // no failover lease needed
  EXPECT_EQ(v["generation"], "0000000000000abc");
  EXPECT_EQ(v["opened_at"], format_rfc3339(sample_status().opened_at));
  EXPECT_EQ(v["last_sequence"], 42);
  ASSERT_EQ(v["peers"].size(), 3u);
  const json& b = v["peers"][0];
  EXPECT_EQ(keys(b), (std::set<std::string>{"name",
                                            "address",
                                            "transport",
                                            "state",
                                            "disk",
                                            "since",
                                            "reason",
                                            "method",
                                            "acknowledged_sequence",
                                            "lag",
                                            "persists",
                                            "bytes",
                                            "errors",
                                            "dirty_chunks",
                                            "dirty_bytes",
                                            "behind_since_generation",
                                            "generation",
                                            "resynced_chunks",
                                            "resynced_bytes",
                                            "resyncs",
                                            "latency_us"}));
  EXPECT_EQ(b["state"], "connected");
  EXPECT_EQ(b["behind_since_generation"], "") << "0: in sync";
  EXPECT_EQ(b["generation"], "0000000000000abc");
  EXPECT_EQ(b["latency_us"],
            (json{{"p50", 10.5}, {"p99", 20.0}, {"p999", 30.0}, {"count", 7}, {"sum", 95.5}}));
  const json& c = v["peers"][1];
  EXPECT_EQ(c["state"], "syncing");
  EXPECT_EQ(c["behind_since_generation"], "0000000000000123");
  EXPECT_EQ(c["generation"], "") << "unknown";
  EXPECT_EQ(c["resync"], (json{{"done_bytes", 4096},
                               {"left_bytes", 12288},
                               {"total_bytes", 16384},
                               {"rate_bytes_per_s", 0},
                               {"eta_seconds", nullptr},
                               {"full", true}}));
  const json& d = v["peers"][2];
  EXPECT_FALSE(d.contains("behind_since_generation")) << "no record of it";
  EXPECT_EQ(d["resync"]["eta_seconds"], 1);
}

TEST(ControlEdge, PeerTextThatIsNotUtf8DoesNotBreakStatus) {
  VolumeStatus s = sample_status();
  s.peers[0].connection.reason = "target ended the session: \xff\xfe";
  json v = json::parse(status_json(s));
  EXPECT_TRUE(v["peers"][0]["reason"].is_string());
}

class ControlSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "pmirror-edge-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
    ::setenv("PMIRROR_RUNTIME_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("PMIRROR_RUNTIME_DIR");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Result<json> ask(const json& request) {
    return control::request(control::initiator_socket_path(::getpid(), dir_.string()), request);
  }

  fs::path dir_;
};

TEST_F(ControlSocketTest, CommandsReachTheVolumeTypedAndComeBackAsJson) {
  std::string resynced, verified;
  VolumeControls controls;
  controls.status = [] { return sample_status(); };
  controls.resync = [&](const std::string& peer, bool full) -> Result<ResyncStarted> {
    resynced = peer + (full ? " full" : "");
    if (peer == "x") return Status(Errc::kNotFound, "volume 'db0' has no replica 'x'");
    return ResyncStarted{"c", full, 12288};
  };
  controls.verify = [&](const std::string& peer,
                        bool mark) -> Result<std::vector<VerifyPeerResult>> {
    verified = peer + (mark ? " mark" : "");
    VerifyPeerResult r;
    r.peer = "c";
    r.chunks_compared = 256;
    r.bytes_compared = 1 << 20;
    r.mismatches = {{4096, 8192}};
    r.busy = {{0, 4096}};
    r.marked_dirty = 2;
    VerifyPeerResult failed;
    failed.peer = "d";
    failed.status = Status(Errc::kConnectionError, "replica d is not connected");
    return std::vector<VerifyPeerResult>{r, failed};
  };
  controls.chunk_size = 4096;
  StatusRegistration registration = register_volume("db0", controls);

  auto status = ask({{"command", "status"}});
  ASSERT_TRUE(status.ok()) << status.status().to_string();
  ASSERT_EQ((*status)["volumes"].size(), 1u);
  EXPECT_EQ((*status)["volumes"][0], json::parse(status_json(sample_status())));
  EXPECT_EQ((*status)["process"]["kind"], "initiator");

  auto resync = ask({{"command", "resync"}, {"volume", "db0"}, {"peer", "c"}, {"full", true}});
  ASSERT_TRUE(resync.ok()) << resync.status().to_string();
  EXPECT_EQ(resynced, "c full");
  EXPECT_EQ(*resync, (json{{"volume", "db0"},
                           {"peer", "c"},
                           {"started", true},
                           {"full", true},
                           {"dirty_bytes", 12288}}));
  auto no_peer = ask({{"command", "resync"}, {"volume", "db0"}});
  EXPECT_EQ(no_peer.status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(no_peer.status().message(), "resync needs a \"peer\"");
  auto unknown = ask({{"command", "resync"}, {"volume", "db0"}, {"peer", "x"}});
  EXPECT_EQ(unknown.status().code(), Errc::kNotFound);

  auto verify = ask({{"command", "verify"}, {"volume", "db0"}, {"mark_dirty", true}});
  ASSERT_TRUE(verify.ok()) << verify.status().to_string();
  EXPECT_EQ(verified, " mark") << "no peer: every connected one";
  EXPECT_EQ((*verify)["chunk_size"], 4096);
  ASSERT_EQ((*verify)["peers"].size(), 2u);
  EXPECT_EQ((*verify)["peers"][0], (json{{"name", "c"},
                                         {"chunks_compared", 256},
                                         {"bytes_compared", 1 << 20},
                                         {"mismatches", {{{"offset", 4096}, {"length", 8192}}}},
                                         {"mismatch_count", 1},
                                         {"marked_dirty", 2},
                                         {"busy", {{{"offset", 0}, {"length", 4096}}}},
                                         {"busy_count", 1}}));
  EXPECT_EQ((*verify)["peers"][1]["error"], "replica d is not connected");

  auto elsewhere = ask({{"command", "verify"}, {"volume", "nope"}});
  EXPECT_EQ(elsewhere.status().code(), Errc::kNotFound);
  registration = {};
  EXPECT_FALSE(ask({{"command", "status"}}).ok()) << "the last volume closed the socket";
}

}  // namespace
}  // namespace pmirror::initiator
