// pmirrorctl end to end: the real binary against test Servers serving canned
// status objects in a temporary runtime directory.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

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
  EXPECT_NE(r.out.find("db1 role:replica size:256MiB backing:devdax generation:3 last-seq:4567 "
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
  EXPECT_NE(r.err.find("note: ignoring stale socket " + dir_ +
                       "/initiator-999998.sock (process 999998 has gone)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("note: ignoring " + dir_ + "/initiator-999999.sock: not a socket"),
            std::string::npos)
      << r.err;
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
  EXPECT_EQ(slurp(out_path),
            "16:01:02 db1 app1@10.0.0.1: connected -> disconnected (goodbye)\n"
            "16:01:03 db0 node2: connected -> disconnected (nothing heard for 5000 "
            "ms)\n"
            "16:01:04 db1 app1@10.0.0.1: disconnected -> connected\n");
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
  EXPECT_EQ(slurp(out_path), event.dump() + "\n");
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

}  // namespace
}  // namespace pmirror::control
