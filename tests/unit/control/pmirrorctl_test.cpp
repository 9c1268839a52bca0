// pmirrorctl end to end: the real binary against test Servers serving canned
// status objects in a temporary runtime directory.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "control/control.h"
#include "unit/control/canned.h"

namespace pmirror::control {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

struct CtlRun {
  int code = -1;
  std::string out;
  std::string err;
};

// A control server's handler for the command tests: answers "status" with
// a fixed object and every other command with `reply`, recording the
// requests (on the server's threads) for the test to check.
class Recorder {
 public:
  using Reply = std::function<Result<json>(const json& request)>;
  Recorder(json status, Reply reply) : status_(std::move(status)), reply_(std::move(reply)) {}

  Handler handler() {
    return [this](const json& request) -> Result<json> {
      if (request["command"] == "status") return status_;
      {
        std::lock_guard lock(mutex_);
        requests_.push_back(request);
      }
      return reply_(request);
    };
  }
  std::vector<json> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  json status_;
  Reply reply_;
  mutable std::mutex mutex_;
  std::vector<json> requests_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

class Pmirrorctl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/pmctl-e2e-XXXXXX";
    dir_ = ::mkdtemp(pattern.data());
  }
  void TearDown() override {
    daemon_.reset();
    initiator_.reset();
    std::filesystem::remove_all(dir_);
  }

  void serve_both() {
    auto daemon = Server::start(daemon_socket_path(dir_), canned(testing::daemon_status()));
    ASSERT_TRUE(daemon.ok()) << daemon.status().message();
    daemon_ = std::move(daemon).value();
    // Any pid works as a name; use ours so that it is alive.
    auto initiator =
        Server::start(initiator_socket_path(::getpid(), dir_), canned(testing::initiator_status()));
    ASSERT_TRUE(initiator.ok()) << initiator.status().message();
    initiator_ = std::move(initiator).value();
  }

  static Handler canned(json status) {
    return [status](const json& request) -> Result<json> {
      if (request["command"] == "status") return status;
      return unknown_command(request);
    };
  }

  // Runs pmirrorctl --runtime-dir DIR ARGS, with TZ=UTC.
  CtlRun run(const std::string& args) {
    std::string err_path = dir_ + "/stderr";
    std::string command =
        "TZ=UTC " PMIRRORCTL_PATH " --runtime-dir " + dir_ + " " + args + " 2>" + err_path;
    CtlRun result;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return result;
    char chunk[4096];
    size_t n;
    while ((n = std::fread(chunk, 1, sizeof(chunk), pipe)) > 0) result.out.append(chunk, n);
    int status = ::pclose(pipe);
    result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.err = slurp(err_path);
    return result;
  }

  std::string dir_;
  std::unique_ptr<Server> daemon_;
  std::unique_ptr<Server> initiator_;
};

TEST_F(Pmirrorctl, StatusHuman) {
  serve_both();
  CtlRun r = run("status");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // Ages depend on the clock; check the lines' stable parts.
  EXPECT_NE(r.out.find("db0 role:primary size:1GiB (initiator app1, pid 4242)\n"
                       "  node2 connection:connected since "),
            std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find("db1 role:replica size:256MiB backing:devdax session-generation:3 last-seq:4567 "
                 "(pmirrord node2)\n  app1@10.0.0.1 connection:connected"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("16:01:02 ("), std::string::npos);  // TZ=UTC; the date if not today
  EXPECT_NE(r.out.find("db2 role:replica size:1.5GiB"), std::string::npos);
}

TEST_F(Pmirrorctl, StatusJsonIsTheMergedObject) {
  serve_both();
  CtlRun r = run("status --json");
  EXPECT_EQ(r.code, 0) << r.err;
  json printed = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(printed.is_discarded()) << r.out;
  // The daemon first, then initiators by pid.
  EXPECT_EQ(printed, merge_status({testing::daemon_status(), testing::initiator_status()}));
  EXPECT_EQ(printed["schema_version"], 1);
}

TEST_F(Pmirrorctl, StatusOfOneVolume) {
  serve_both();
  CtlRun r = run("status db1");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("db1 role:replica", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find("db0"), std::string::npos) << r.out;
  CtlRun j = run("status db0 --json");
  EXPECT_EQ(j.code, 0);
  EXPECT_EQ(json::parse(j.out), merge_status({testing::initiator_status()}, "db0"));
}

TEST_F(Pmirrorctl, UnknownVolumeIsExitCode1) {
  serve_both();
  CtlRun r = run("status nope");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "pmirrorctl: no volume 'nope' on this node; known: db0, db1, db2\n");
}

TEST_F(Pmirrorctl, NothingRunningIsExitCode3) {
  CtlRun r = run("status");
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.err, "pmirrorctl: pmirrord is not running on this node (no socket at " + dir_ +
                       "/pmirrord.sock) and no process has a volume open\n");
  EXPECT_EQ(run("events").code, 3);
}

TEST_F(Pmirrorctl, StaleInitiatorSocketsAreSkippedWithANote) {
  auto daemon = Server::start(daemon_socket_path(dir_), canned(testing::daemon_status()));
  ASSERT_TRUE(daemon.ok());
  {
    // What a killed process leaves behind: a socket file nobody listens on.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::string stale = initiator_socket_path(999998, dir_);
    std::strncpy(address.sun_path, stale.c_str(), sizeof(address.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    ::close(fd);
  }
  std::ofstream(dir_ + "/initiator-999999.sock") << "";  // not even a socket
  CtlRun r = run("status");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("db1 role:replica"), std::string::npos);
  EXPECT_NE(r.err.find("note: removed stale socket " + dir_ +
                       "/initiator-999998.sock (process 999998 has gone)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/initiator-999998.sock"));
  EXPECT_NE(r.err.find("note: ignoring " + dir_ + "/initiator-999999.sock: not a socket"),
            std::string::npos)
      << r.err;
  // Removed once: the next call has nothing to say about it.
  CtlRun again = run("status");
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(again.err.find("stale socket"), std::string::npos) << again.err;
  // A file that is not a socket is someone else's: left alone.
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/initiator-999999.sock"));
}

TEST_F(Pmirrorctl, ASocketWhoseProcessLivesIsNeverRemoved) {
  auto daemon = Server::start(daemon_socket_path(dir_), canned(testing::daemon_status()));
  ASSERT_TRUE(daemon.ok());
  // Nothing listens, but its process (this one) is alive: perhaps it is
  // opening a volume right now.
  std::string mine = initiator_socket_path(::getpid(), dir_);
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, mine.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ::close(fd);
  CtlRun r = run("status");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("note: ignoring " + mine + ": nothing listens there, yet process " +
                       std::to_string(::getpid()) + " exists"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(std::filesystem::exists(mine));
}

TEST_F(Pmirrorctl, OnlyInitiatorsRunning) {
  auto initiator =
      Server::start(initiator_socket_path(::getpid(), dir_), canned(testing::initiator_status()));
  ASSERT_TRUE(initiator.ok());
  CtlRun r = run("status --json");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out), merge_status({testing::initiator_status()}));
}

TEST_F(Pmirrorctl, NotASocketIsAnError) {
  std::ofstream(dir_ + "/pmirrord.sock") << "";
  CtlRun r = run("status");
  EXPECT_EQ(r.code, 5);
  EXPECT_NE(r.err.find("is not a socket"), std::string::npos) << r.err;
}

TEST_F(Pmirrorctl, PermissionDeniedIsExitCode4) {
  if (::geteuid() != 0 || std::system("command -v setpriv >/dev/null") != 0) {
    GTEST_SKIP() << "needs root and setpriv";
  }
  serve_both();
  ::chmod(dir_.c_str(), 0755);
  std::string err_path = dir_ + "/stderr-nobody";
  std::string command = "setpriv --reuid=65534 --regid=65534 --clear-groups " PMIRRORCTL_PATH
                        " --runtime-dir " +
                        dir_ + " status >/dev/null 2>" + err_path;
  int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 4);
  EXPECT_NE(slurp(err_path).find("permission denied on " + dir_ + "/pmirrord.sock: run as root"),
            std::string::npos)
      << slurp(err_path);
}

TEST_F(Pmirrorctl, EventsStreamFromEveryProcess) {
  serve_both();
  std::string out_path = dir_ + "/events.out";
  std::string command = "TZ=UTC " PMIRRORCTL_PATH " --runtime-dir " + dir_ + " events --count 3 >" +
                        out_path + " 2>&1";
  std::thread ctl([&] { EXPECT_EQ(std::system(command.c_str()), 0); });
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while ((daemon_->subscriber_count() == 0 || initiator_->subscriber_count() == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(daemon_->subscriber_count(), 1u);
  ASSERT_EQ(initiator_->subscriber_count(), 1u);
  daemon_->publish({{"time", "2026-11-29T16:01:02Z"},
                    {"volume", "db1"},
                    {"peer", "app1@10.0.0.1"},
                    {"from", "connected"},
                    {"to", "disconnected"},
                    {"reason", "goodbye"}});
  std::this_thread::sleep_for(50ms);
  initiator_->publish({{"time", "2026-11-29T16:01:03Z"},
                       {"volume", "db0"},
                       {"peer", "node2"},
                       {"from", "connected"},
                       {"to", "disconnected"},
                       {"reason", "nothing heard for 5000 ms"}});
  std::this_thread::sleep_for(50ms);
  daemon_->publish({{"time", "2026-11-29T16:01:04Z"},
                    {"volume", "db1"},
                    {"peer", "app1@10.0.0.1"},
                    {"from", "disconnected"},
                    {"to", "connected"}});
  ctl.join();
  // First each process's current state (as drbdsetup events2), then the
  // changes: the state lines do not count for --count.
  std::istringstream lines(slurp(out_path));
  std::string line, changes;
  std::vector<std::string> states;
  while (std::getline(lines, line)) {
    if (line.find(": exists") != std::string::npos) {
      states.push_back(line);
    } else {
      changes += line + "\n";
    }
  }
  EXPECT_EQ(changes,
            "16:01:02 db1 app1@10.0.0.1: connected -> disconnected (goodbye)\n"
            "16:01:03 db0 node2: connected -> disconnected (nothing heard for 5000 "
            "ms)\n"
            "16:01:04 db1 app1@10.0.0.1: disconnected -> connected\n");
  auto has_state = [&](const std::string& text) {
    return std::any_of(states.begin(), states.end(), [&](const std::string& state) {
      return state.find(text) != std::string::npos;
    });
  };
  EXPECT_EQ(states.size(), 6u) << "3 volumes, 3 peers";
  EXPECT_TRUE(has_state(" db0 node2: exists connected since 2026-11-29 16:01:02 (handshake done)"));
  EXPECT_TRUE(has_state(" db1 app1@10.0.0.1: exists connected since 2026-11-28 09:00:00"));
  EXPECT_TRUE(has_state(" db2: exists role:replica"));
}

TEST_F(Pmirrorctl, EventsStateLinesComeBeforeTheChangesOfTheirProcess) {
  serve_both();
  std::string out_path = dir_ + "/events.out";
  std::string command = "TZ=UTC " PMIRRORCTL_PATH " --runtime-dir " + dir_ +
                        " events --json --count 1 >" + out_path + " 2>&1";
  std::thread ctl([&] { EXPECT_EQ(std::system(command.c_str()), 0); });
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (daemon_->subscriber_count() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(daemon_->subscriber_count(), 1u);
  // Published at once, possibly before pmirrorctl asked for the state: it
  // still comes after the daemon's state lines.
  daemon_->publish({{"volume", "db1"}, {"to", "disconnected"}});
  ctl.join();
  std::istringstream lines(slurp(out_path));
  std::string line;
  std::vector<json> daemon_lines;
  while (std::getline(lines, line)) {
    json event = json::parse(line, nullptr, false);
    ASSERT_FALSE(event.is_discarded()) << line;
    if (event.value("process", "") != "initiator") daemon_lines.push_back(event);
  }
  ASSERT_EQ(daemon_lines.size(), 4u);  // db1, its writer, db2, the change
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(daemon_lines[i].value("exists", false)) << daemon_lines[i].dump();
    EXPECT_EQ(daemon_lines[i]["node"], "node2");
  }
  EXPECT_EQ(daemon_lines[3], json({{"volume", "db1"}, {"to", "disconnected"}}));
}

TEST_F(Pmirrorctl, EventsNowPrintsTheCurrentStateAndExits) {
  serve_both();
  CtlRun r = run("events --now");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(" db0: exists role:primary\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" db0 node3: exists disconnected since 2026-11-29 16:03:10 (nothing heard "
                       "for 5000 ms)\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(" db2: exists role:replica\n"), std::string::npos) << r.out;
  CtlRun as_json = run("events --now --json");
  EXPECT_EQ(as_json.code, 0) << as_json.err;
  std::istringstream lines(as_json.out);
  std::string line;
  size_t count = 0;
  while (std::getline(lines, line)) {
    json event = json::parse(line, nullptr, false);
    ASSERT_FALSE(event.is_discarded()) << line;
    EXPECT_TRUE(event.value("exists", false)) << line;
    ++count;
  }
  EXPECT_EQ(count, 6u);  // 3 volumes, 3 peers
  EXPECT_EQ(run("events --now").code, 0);
}

TEST_F(Pmirrorctl, EventsJsonIsTheRawLine) {
  serve_both();
  std::string out_path = dir_ + "/events.json";
  std::string command =
      PMIRRORCTL_PATH " --runtime-dir " + dir_ + " events --json --count 1 >" + out_path + " 2>&1";
  std::thread ctl([&] { EXPECT_EQ(std::system(command.c_str()), 0); });
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (daemon_->subscriber_count() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  json event = {{"time", "2026-11-29T16:01:02Z"}, {"volume", "db1"}, {"to", "connected"}};
  daemon_->publish(event);
  ctl.join();
  std::string out = slurp(out_path);
  ASSERT_FALSE(out.empty());
  out.pop_back();  // the last newline
  // After the state lines, the event exactly as the process sent it.
  EXPECT_EQ(out.substr(out.rfind('\n') + 1), event.dump());
}

TEST_F(Pmirrorctl, UsageErrorsAreExitCode1) {
  EXPECT_EQ(run("").code, 1);
  EXPECT_EQ(run("status --frobnicate").code, 1);
  EXPECT_EQ(run("config").code, 1);
  EXPECT_EQ(run("--help").code, 0);
}

TEST_F(Pmirrorctl, ConfigCheckOfABadFileIsExitCode2) {
  std::ofstream(dir_ + "/cluster.yaml") << "nodes: [\n";
  CtlRun r = run("config check " + dir_ + "/cluster.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(dir_ + "/cluster.yaml"), std::string::npos) << r.err;
  CtlRun missing = run("config check " + dir_ + "/missing.yaml");
  EXPECT_EQ(missing.code, 2);
}

// The configuration as pmirrord and libpmirror run it: keys the file leaves
// out show their defaults, a node's overrides apply, secrets never show.
TEST_F(Pmirrorctl, ConfigShowPrintsTheDefaultsAppliedAndNoSecret) {
  const std::string file = dir_ + "/cluster.yaml";
  std::ofstream(dir_ + "/w.secret") << "a secret from a file, long enough\n";
  std::ofstream(file) << "nodes:\n"
                         "  - {name: a, address: 10.0.0.1}\n"
                         "  - {name: b, address: 10.0.0.2, port: 7460, state_pool: /srv/b.state}\n"
                         "daemon: {heartbeat_timeout: 3s}\n"
                         "volumes:\n"
                         "  - name: v\n"
                         "    size: 1MiB\n"
                         "    primary: a\n"
                         "    replicas: [b]\n"
                         "    paths: {a: /srv/a.img, b: /srv/b.img}\n"
                         "    allowed_peers: [app]\n"
                         "    secret: \"the inline secret, never printed\"\n"
                         "  - name: w\n"
                         "    size: 1MiB\n"
                         "    primary: b\n"
                         "    replicas: [a]\n"
                         "    paths: {a: /srv/wa.img, b: /srv/wb.img}\n"
                         "    allowed_peers: [app]\n"
                         "    secret_file: " +
                             dir_ +
                             "/w.secret\n"
                             "    resync_rate: 16MiB/s\n";
  CtlRun b = run("config show " + file + " --node b");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.out.find("node:\n  name: b\n  address: 10.0.0.2\n  port: 7460\n  transport: tcp\n"
                       "  listen: 10.0.0.2\n  control_socket: /run/pmirror/pmirrord.sock\n"
                       "  state_pool: /srv/b.state\n"),
            std::string::npos)
      << b.out;
  EXPECT_NE(b.out.find("  heartbeat_interval: 1000ms\n  heartbeat_timeout: 3000ms\n"),
            std::string::npos)
      << b.out;
  EXPECT_NE(b.out.find("  - name: v\n    size: 1048576  # 1.0 MiB\n    primary: a\n"
                       "    replicas: [b]\n    ack: 1\n"
                       "    on_insufficient: fail\n    path: /srv/b.img\n"
                       "    metadata: /srv/b.img.pmirror\n    create: false\n"),
            std::string::npos)
      << b.out;
  EXPECT_NE(b.out.find("    chunk: 65536  # 64.0 KiB\n    resync_rate: 104857600  # 100.0 MiB/s\n"
                       "    after_split_brain: refuse\n"),
            std::string::npos)
      << b.out;
  EXPECT_NE(b.out.find("    secret: \"<given inline in the file; not shown>\"\n"),
            std::string::npos)
      << b.out;
  EXPECT_NE(b.out.find("    secret: \"<secret from " + dir_ + "/w.secret>\"\n"), std::string::npos)
      << b.out;
  EXPECT_NE(b.out.find("    resync_rate: 16777216  # 16.0 MiB/s\n"), std::string::npos) << b.out;
  EXPECT_EQ(b.out.find("the inline secret"), std::string::npos) << b.out;
  EXPECT_EQ(b.out.find("a secret from a file"), std::string::npos) << b.out;

  // Every node, one volume.
  CtlRun w = run("config show " + file + " --volume w");
  ASSERT_EQ(w.code, 0) << w.err;
  EXPECT_NE(w.out.find("    path:\n      a: /srv/wa.img\n      b: /srv/wb.img\n"),
            std::string::npos)
      << w.out;
  EXPECT_EQ(w.out.find("name: v\n"), std::string::npos) << w.out;

  CtlRun unknown = run("config show " + file + " --volume nope");
  EXPECT_EQ(unknown.code, 1);
  EXPECT_EQ(unknown.err, "pmirrorctl: no volume 'nope' in " + file + "; volumes: v, w\n");
  EXPECT_EQ(run("config show " + file + " --node c").code, 1);
  std::ofstream(dir_ + "/bad.yaml") << "nodes: [\n";
  CtlRun bad = run("config show " + dir_ + "/bad.yaml");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find(dir_ + "/bad.yaml"), std::string::npos) << bad.err;
}

// ---- resync / verify / promote / demote ------------------------------

json resync_reply(const json& request) {
  return {{"volume", request["volume"]},
          {"peer", request["peer"]},
          {"started", true},
          {"dirty_bytes", request["full"] == true ? 1073741824 : 3355443},
          {"full", request["full"]}};
}

// A verify of node2 (equal) and node3 (`count` mismatching ranges, 25 listed).
json verify_reply(uint64_t count) {
  json mismatches = json::array();
  for (uint64_t i = 0; i < std::min<uint64_t>(count, 25); ++i) {
    mismatches.push_back({{"offset", i * 0x20000}, {"length", 65536}});
  }
  return {{"volume", "db0"},
          {"chunk_size", 65536},
          {"peers",
           {{{"name", "node2"},
             {"chunks_compared", 16384},
             {"bytes_compared", 1073741824},
             {"mismatches", json::array()},
             {"mismatch_count", 0},
             {"marked_dirty", 0}},
            {{"name", "node3"},
             {"chunks_compared", 16384},
             {"bytes_compared", 1073741824},
             {"mismatches", mismatches},
             {"mismatch_count", count},
             {"marked_dirty", 0}}}}};
}

class PmirrorctlCommands : public Pmirrorctl {
 protected:
  // pmirrord (replica of db1, db2) with `daemon`; the primary of db0 with
  // `primary` as our pid; another libpmirror process (pid 1's name: any
  // name does) with a volume "other" open as primary.
  void serve(Recorder* daemon, Recorder* primary) {
    if (daemon != nullptr) {
      auto server = Server::start(daemon_socket_path(dir_), daemon->handler());
      ASSERT_TRUE(server.ok()) << server.status().message();
      daemon_ = std::move(server).value();
    }
    if (primary != nullptr) {
      auto server = Server::start(initiator_socket_path(::getpid(), dir_), primary->handler());
      ASSERT_TRUE(server.ok()) << server.status().message();
      initiator_ = std::move(server).value();
    }
    auto other = Server::start(initiator_socket_path(1, dir_), other_.handler());
    ASSERT_TRUE(other.ok()) << other.status().message();
    other_server_ = std::move(other).value();
  }
  void TearDown() override {
    stop();
    Pmirrorctl::TearDown();
  }
  // Joins the servers' threads, so that no handler runs on (or after) the
  // test's locals: declare it after them.
  void stop() {
    daemon_.reset();
    initiator_.reset();
    other_server_.reset();
  }
  struct Stopper {
    PmirrorctlCommands* test;
    ~Stopper() { test->stop(); }
  };
  Stopper stop_at_exit() { return Stopper{this}; }

  static json other_status() {
    json status = testing::initiator_status();
    status["process"]["pid"] = 1;
    status["volumes"][0]["name"] = "other";
    return status;
  }

  Recorder other_{other_status(), [](const json&) -> Result<json> {
                    return Status(Errc::kInternal, "the wrong process was asked");
                  }};
  std::unique_ptr<Server> other_server_;
};

TEST_F(PmirrorctlCommands, ResyncGoesToTheProcessWithThePrimary) {
  Recorder daemon(testing::daemon_status(), [](const json&) -> Result<json> { return json(); });
  Recorder primary(testing::initiator_status(), resync_reply);
  serve(&daemon, &primary);
  auto stopper = stop_at_exit();

  CtlRun r = run("resync db0 --peer node3");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out,
            "db0: resync of node3 started: 3.2 MiB to copy; follow it with `pmirrorctl status "
            "db0`\n");
  CtlRun j = run("resync db0 --peer node3 --full --json");
  EXPECT_EQ(j.code, 0) << j.err;
  EXPECT_EQ(json::parse(j.out), json::parse(R"({"volume":"db0","peer":"node3","started":true,
                                               "dirty_bytes":1073741824,"full":true})"));

  auto requests = primary.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0],
            json::parse(R"({"command":"resync","volume":"db0","peer":"node3","full":false})"));
  EXPECT_EQ(requests[1],
            json::parse(R"({"command":"resync","volume":"db0","peer":"node3","full":true})"));
  EXPECT_TRUE(other_.requests().empty());
  EXPECT_TRUE(daemon.requests().empty());
}

TEST_F(PmirrorctlCommands, ResyncOfAVolumeNotOpenAsPrimaryHere) {
  Recorder daemon(testing::daemon_status(), [](const json&) -> Result<json> { return json(); });
  Recorder primary(testing::initiator_status(), resync_reply);
  serve(&daemon, &primary);
  auto stopper = stop_at_exit();
  // pmirrord holds db1: this is a replica's node.
  CtlRun replica = run("resync db1 --peer node3");
  EXPECT_EQ(replica.code, 1);
  EXPECT_EQ(replica.out, "");
  EXPECT_EQ(replica.err,
            "pmirrorctl: volume 'db1' is not open as primary on this node: pmirrord here holds a "
            "copy of it; run this on the node where the application has it open\n");
  CtlRun unknown = run("verify nope");
  EXPECT_EQ(unknown.code, 1);
  EXPECT_EQ(unknown.err,
            "pmirrorctl: no process on this node has volume 'nope' open as primary; open as "
            "primary here: other, db0\n");
  EXPECT_TRUE(primary.requests().empty());
}

TEST_F(Pmirrorctl, ResyncWithNothingRunningIsExitCode3) {
  CtlRun r = run("resync db0 --peer node3");
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.err,
            "pmirrorctl: no process on this node has a volume open through libpmirror (no live "
            "initiator-PID.sock in " +
                dir_ + ")\n");
}

TEST_F(PmirrorctlCommands, RefusalsAndErrorsOfTheProcess) {
  Status answer = Status(Errc::kFailedPrecondition, "node3 is in split brain");
  std::mutex mutex;
  Recorder primary(testing::initiator_status(), [&](const json& request) -> Result<json> {
    std::lock_guard lock(mutex);
    if (answer.code() == Errc::kInvalidArgument) return unknown_command(request);
    return answer;
  });
  serve(nullptr, &primary);
  auto stopper = stop_at_exit();
  struct Case {
    Status status;
    int code;
    std::string err;
  };
  const Case cases[] = {
      {Status(Errc::kFailedPrecondition, "node3 is in split brain"), 7,
       "pmirrorctl: node3 is in split brain\n"},
      {Status(Errc::kBusy, "a resync of node3 is running"), 7,
       "pmirrorctl: a resync of node3 is running\n"},
      {Status(Errc::kNotFound, "no replica 'node9' of db0"), 1,
       "pmirrorctl: no replica 'node9' of db0\n"},
      {Status(Errc::kConnectionError, "node3 is not connected"), 5,
       "pmirrorctl: node3 is not connected\n"},
      {Status(Errc::kInvalidArgument, ""), 5,
       "pmirrorctl: unknown command 'resync' (that process runs an older pmirror than this "
       "pmirrorctl)\n"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.err);
    {
      std::lock_guard lock(mutex);
      answer = c.status;
    }
    CtlRun r = run("resync db0 --peer node3");
    EXPECT_EQ(r.code, c.code);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, c.err);
  }
}

TEST_F(PmirrorctlCommands, VerifyReportsMismatchesWithExitCode6) {
  uint64_t count = 30;
  std::mutex mutex;
  Recorder primary(testing::initiator_status(), [&](const json&) -> Result<json> {
    std::lock_guard lock(mutex);
    return verify_reply(count);
  });
  serve(nullptr, &primary);
  auto stopper = stop_at_exit();

  CtlRun r = run("verify db0 --peer node3 --mark-dirty");
  EXPECT_EQ(r.code, 6) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out.rfind("db0 node2: equal (16384 chunks, 1.0 GiB compared)\n"
                        "db0 node3: 30 mismatching ranges (16384 chunks, 1.0 GiB compared):\n"
                        "  offset 0x0 length 64.0 KiB\n",
                        0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("  offset 0x260000 length 64.0 KiB\n  ... and 10 more\n"), std::string::npos)
      << r.out;

  CtlRun j = run("verify db0 --json");
  EXPECT_EQ(j.code, 6);
  EXPECT_EQ(json::parse(j.out), verify_reply(30));

  {
    std::lock_guard lock(mutex);
    count = 0;
  }
  CtlRun equal = run("verify db0");
  EXPECT_EQ(equal.code, 0) << equal.err;
  EXPECT_EQ(equal.out,
            "db0 node2: equal (16384 chunks, 1.0 GiB compared)\n"
            "db0 node3: equal (16384 chunks, 1.0 GiB compared)\n");

  auto requests = primary.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0], json::parse(R"({"command":"verify","volume":"db0","peer":"node3",
                                         "mark_dirty":true})"));
  // No --peer: no "peer" (every connected replica).
  EXPECT_EQ(requests[1], json::parse(R"({"command":"verify","volume":"db0","mark_dirty":false})"));
}

TEST_F(PmirrorctlCommands, VerifyHonoursTimeout) {
  Recorder primary(testing::initiator_status(), [](const json&) -> Result<json> {
    std::this_thread::sleep_for(1500ms);
    return verify_reply(0);
  });
  serve(nullptr, &primary);
  auto stopper = stop_at_exit();
  CtlRun r = run("--timeout 300 verify db0");
  EXPECT_EQ(r.code, 5);
  EXPECT_NE(
      r.err.find("no answer from " + initiator_socket_path(::getpid(), dir_) + " within 300 ms"),
      std::string::npos)
      << r.err;
}

TEST_F(PmirrorctlCommands, PromoteAndDemoteGoToPmirrord) {
  Recorder daemon(testing::daemon_status(), [](const json& request) -> Result<json> {
    if (request["command"] == "demote") {
      return json{{"volume", request["volume"]},
                  {"node", "node2"},
                  {"promoted", false},
                  {"generation", "9f3a2b1c4d5e6f70"}};
    }
    if (request["volume"] != "db1") return Status(Errc::kNotFound, "no volume 'db9' on node node2");
    if (request["force"] != true) {
      return Status(Errc::kBusy,
                    "volume 'db1' is being written by app1@10.0.0.1; stop it or use --force");
    }
    return json{{"volume", "db1"},
                {"node", "node2"},
                {"generation", "9f3a2b1c4d5e6f70"},
                {"previous", "12ab34cd56ef7890"},
                {"promoted", true},
                {"forced", true}};
  });
  Recorder primary(testing::initiator_status(), resync_reply);
  serve(&daemon, &primary);
  auto stopper = stop_at_exit();

  CtlRun busy = run("promote db1");
  EXPECT_EQ(busy.code, 7);
  EXPECT_EQ(busy.err,
            "pmirrorctl: volume 'db1' is being written by app1@10.0.0.1; stop it or use --force\n");
  CtlRun forced = run("promote db1 --force");
  EXPECT_EQ(forced.code, 0) << forced.err;
  EXPECT_EQ(forced.out,
            "db1 promoted on node2 (forced): generation 9f3a2b1c4d5e6f70 (was 12ab34cd56ef7890)\n");
  CtlRun missing = run("promote db9 --force --json");
  EXPECT_EQ(missing.code, 1);
  EXPECT_EQ(missing.out, "");
  CtlRun demote = run("demote db1");
  EXPECT_EQ(demote.code, 0) << demote.err;
  EXPECT_EQ(demote.out, "db1 demoted on node2: generation 9f3a2b1c4d5e6f70; a replica again\n");
  CtlRun demote_json = run("demote db1 --json");
  EXPECT_EQ(demote_json.code, 0);
  EXPECT_EQ(json::parse(demote_json.out)["promoted"], false);

  auto requests = daemon.requests();
  ASSERT_EQ(requests.size(), 5u);
  EXPECT_EQ(requests[0], json::parse(R"({"command":"promote","volume":"db1","force":false})"));
  EXPECT_EQ(requests[1], json::parse(R"({"command":"promote","volume":"db1","force":true})"));
  EXPECT_EQ(requests[2], json::parse(R"({"command":"promote","volume":"db9","force":true})"));
  EXPECT_EQ(requests[3], json::parse(R"({"command":"demote","volume":"db1"})"));
  EXPECT_TRUE(primary.requests().empty());
}

TEST_F(PmirrorctlCommands, DisconnectAndConnectGoToThePrimary) {
  Recorder daemon(testing::daemon_status(), [](const json&) -> Result<json> { return json(); });
  Recorder primary(testing::initiator_status(), [](const json& request) -> Result<json> {
    if (request.contains("peer") && request["peer"] != "node3") {
      return Status(Errc::kNotFound,
                    "volume 'db0' has no replica 'node9' (replicas: node2, node3)");
    }
    json peers = request.contains("peer") ? json::array({{{"name", "node3"}, {"changed", true}}})
                                          : json::array({{{"name", "node2"}, {"changed", true}},
                                                         {{"name", "node3"}, {"changed", false}}});
    return json{{"volume", request["volume"]},
                {"connected", request["command"] == "connect"},
                {"peers", peers}};
  });
  serve(&daemon, &primary);
  auto stopper = stop_at_exit();

  CtlRun down = run("disconnect db0 --peer node3");
  EXPECT_EQ(down.code, 0) << down.err;
  EXPECT_EQ(down.out,
            "db0: node3 disconnected by an operator; its writes are recorded dirty until "
            "`pmirrorctl connect db0 --peer node3`\n");
  CtlRun all = run("connect db0");
  EXPECT_EQ(all.code, 0) << all.err;
  EXPECT_EQ(all.out,
            "db0: node2 reconnecting; a resync brings it up to date (follow it with `pmirrorctl "
            "status db0`)\n"
            "db0: node3 was not disconnected by an operator; nothing changed\n");
  CtlRun missing = run("disconnect db0 --peer node9");
  EXPECT_EQ(missing.code, 1);
  EXPECT_EQ(missing.err,
            "pmirrorctl: volume 'db0' has no replica 'node9' (replicas: node2, node3)\n");
  CtlRun elsewhere = run("disconnect db1 --peer node3");
  EXPECT_EQ(elsewhere.code, 1) << "db1 is only a replica here";

  auto requests = primary.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0], json::parse(R"({"command":"disconnect","volume":"db0","peer":"node3"})"));
  EXPECT_EQ(requests[1], json::parse(R"({"command":"connect","volume":"db0"})"));
  EXPECT_TRUE(daemon.requests().empty());
}

TEST_F(PmirrorctlCommands, DownAndUpGoToPmirrord) {
  Recorder daemon(testing::daemon_status(), [](const json& request) -> Result<json> {
    if (request["volume"] != "db1") return Status(Errc::kNotFound, "no volume 'db9' on node node2");
    bool down = request["command"] == "down";
    return json{{"volume", "db1"},
                {"node", "node2"},
                {"down", down},
                {"changed", true},
                {"sessions_ended", down ? 1 : 0}};
  });
  Recorder primary(testing::initiator_status(), resync_reply);
  serve(&daemon, &primary);
  auto stopper = stop_at_exit();

  CtlRun down = run("down db1");
  EXPECT_EQ(down.code, 0) << down.err;
  EXPECT_EQ(down.out,
            "db1: down by an operator on node2: 1 session(s) ended; new sessions are refused "
            "until `pmirrorctl up db1`\n");
  CtlRun up = run("up db1");
  EXPECT_EQ(up.code, 0) << up.err;
  EXPECT_EQ(up.out, "db1: served again on node2; writers may connect\n");
  CtlRun missing = run("down db9 --json");
  EXPECT_EQ(missing.code, 1);
  EXPECT_EQ(missing.err, "pmirrorctl: no volume 'db9' on node node2\n");

  auto requests = daemon.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0], json::parse(R"({"command":"down","volume":"db1"})"));
  EXPECT_EQ(requests[1], json::parse(R"({"command":"up","volume":"db1"})"));
  EXPECT_TRUE(primary.requests().empty());
}

TEST_F(Pmirrorctl, PromoteWithoutPmirrordIsExitCode3) {
  CtlRun r = run("promote db1");
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.err,
            "pmirrorctl: pmirrord is not running (no socket at " + dir_ + "/pmirrord.sock)\n");
  EXPECT_EQ(run("--socket " + dir_ + "/elsewhere.sock demote db1").code, 3);
}

TEST_F(Pmirrorctl, CommandUsageErrorsAreExitCode1) {
  EXPECT_EQ(run("resync db0").code, 1);           // --peer is required
  EXPECT_EQ(run("resync --peer node2").code, 1);  // VOLUME is required
  EXPECT_EQ(run("verify").code, 1);
  EXPECT_EQ(run("verify db0 --full").code, 1);
  EXPECT_EQ(run("promote").code, 1);
  EXPECT_EQ(run("demote db1 --force").code, 1);
  EXPECT_EQ(run("down").code, 1);              // VOLUME is required
  EXPECT_EQ(run("up db1 --peer n1").code, 1);  // no --peer on pmirrord's switch
  EXPECT_EQ(run("disconnect").code, 1);
  EXPECT_EQ(run("connect db0 --full").code, 1);
  EXPECT_EQ(run("--timeout 0 verify db0").code, 1);
  CtlRun help = run("resync --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--full"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace pmirror::control
