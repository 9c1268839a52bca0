// A three-node cluster on this machine: the test process is node "app"
// (the primary, through libpmirror), node1 and node2 run pmirrord on
// loopback over tcp, all from ONE cluster file. What an operator sees --
// `pmirrorctl status --json`, `events` -- must follow what happens: a
// replica stopped, restarted (and brought up to date), a config reloaded
// with a volume added and one removed, a broken config refused on reload.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <pmirror/pmirror.hpp>
#include <sstream>
#include <thread>

#include "control/control.h"
#include "support/daemon_process.h"

namespace pmirror {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::TempDir;

constexpr uint64_t kSize = 4ull << 20;

// Over tcp on any machine; over rdma in the lab (scripts/lab/tests/
// guest-data-path.sh sets PMIRROR_TEST_TRANSPORT=rdma and the rxe address).
std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}
std::string test_transport() { return env_or("PMIRROR_TEST_TRANSPORT", "tcp"); }
std::string test_address() { return env_or("PMIRROR_TEST_ADDRESS", "127.0.0.1"); }

// Runs a command, returns its exit status and stdout.
int run(const std::vector<std::string>& argv, std::string& out) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return -1;
  // Made before fork: the child of a threaded process must not allocate.
  std::vector<char*> args;
  std::vector<std::string> copies = argv;
  for (auto& a : copies) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipe_fds[1], 1);
    ::close(pipe_fds[0]);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) out.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class Node {
 public:
  Node(std::string name, std::string config, std::string log)
      : name_(std::move(name)), config_(std::move(config)), log_(std::move(log)) {}
  ~Node() { kill(SIGKILL); }

  bool start() {
    size_t offset = read_log().size();
    const std::string binary = testing::daemon_binary();  // before fork: no allocation after
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execl(binary.c_str(), binary.c_str(), "--config", config_.c_str(), "--node", name_.c_str(),
              "--foreground", nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 400; ++i) {
      if (read_log().find("listening on", offset) != std::string::npos) return true;
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(25ms);
    }
    return false;
  }
  void kill(int signal) {
    if (pid_ <= 0) return;
    ::kill(pid_, signal);
    if (signal == SIGHUP) return;
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  void hup() { ::kill(pid_, SIGHUP); }
  std::string read_log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string name_, config_, log_;
  pid_t pid_ = -1;
};

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_ = tmp_.file("run");
    std::filesystem::create_directories(runtime_);
    ::setenv("PMIRROR_RUNTIME_DIR", runtime_.c_str(), 1);
    for (auto& p : ports_) p = testing::free_port();
    write_config(/*node1_volumes=*/{"v3"});
    node1_ = std::make_unique<Node>("node1", config_path(), tmp_.file("node1.log"));
    node2_ = std::make_unique<Node>("node2", config_path(), tmp_.file("node2.log"));
    ASSERT_TRUE(node1_->start()) << node1_->read_log();
    ASSERT_TRUE(node2_->start()) << node2_->read_log();
  }
  void TearDown() override { ::unsetenv("PMIRROR_RUNTIME_DIR"); }

  std::string config_path() const { return tmp_.file("cluster.yaml"); }

  // v1: primary app, replicas node1 + node2, one ack needed. Plus
  // node1-only volumes named in `extra`.
  void write_config(const std::vector<std::string>& extra, const std::string& junk = "") {
    std::ofstream out(config_path());
    out << "cluster: {name: test}\n"
        << "daemon:\n"
        << "  log_level: debug\n"
        << "  heartbeat_interval: 200ms\n"
        << "  heartbeat_timeout: 1s\n"
        << "  reconnect_initial: 100ms\n"
        << "  reconnect_max: 400ms\n"
        << "nodes:\n"
        << "  - {name: app, address: " << test_address() << ", port: " << ports_[0]
        << ", transport: " << test_transport() << "}\n";
    for (int i = 1; i <= 2; ++i) {
      out << "  - name: node" << i << "\n"
          << "    address: " << test_address() << "\n"
          << "    transport: " << test_transport() << "\n"
          << "    port: " << ports_[i] << "\n"
          << "    control_socket: " << socket(i) << "\n"
          << "    state_pool: " << tmp_.file("node" + std::to_string(i) + ".state") << "\n";
    }
    out << "volumes:\n"
        << "  - name: v1\n"
        << "    size: 4MiB\n"
        << "    primary: app\n"
        << "    replicas: [node1, node2]\n"
        << "    ack: 1\n"
        << "    paths: {app: " << tmp_.file("app-v1.img")
        << ", node1: " << tmp_.file("node1-v1.img") << ", node2: " << tmp_.file("node2-v1.img")
        << "}\n"
        << "    create: true\n"
        << "    allowed_peers: [app]\n"
        << "    secret: \"cluster test secret, long\"\n";
    for (const auto& name : extra) {
      out << "  - name: " << name << "\n"
          << "    size: 1MiB\n"
          << "    primary: app\n"
          << "    replicas: [node1]\n"
          << "    paths: {app: " << tmp_.file("app-" + name + ".img")
          << ", node1: " << tmp_.file("node1-" + name + ".img") << "}\n"
          << "    create: true\n"
          << "    allowed_peers: [app]\n"
          << "    secret: \"cluster test secret, long\"\n";
    }
    out << junk;
  }

  std::string socket(int node) const { return tmp_.file("node" + std::to_string(node) + ".sock"); }

  // `pmirrorctl status --json` as an operator runs it on node `node`.
  json status(int node) {
    std::string out;
    int code = run(
        {PMIRRORCTL_PATH, "--socket", socket(node), "--runtime-dir", runtime_, "status", "--json"},
        out);
    if (code != 0) return json{{"exit", code}, {"output", out}};
    return json::parse(out, nullptr, false);
  }

  // The state of `peer` of `volume` as seen by the process of `kind`.
  static std::string peer_state(const json& merged, const std::string& kind,
                                const std::string& volume, const std::string& peer_prefix) {
    if (!merged.contains("processes")) return "<no status: " + merged.dump() + ">";
    for (const auto& process : merged["processes"]) {
      if (process["process"]["kind"] != kind) continue;
      for (const auto& v : process["volumes"]) {
        if (v["name"] != volume) continue;
        for (const auto& p : v["peers"]) {
          std::string name = p["name"];
          if (name.rfind(peer_prefix, 0) == 0) return p["state"];
        }
      }
    }
    return "<absent>";
  }

  static std::vector<std::string> volume_names(const json& merged, const std::string& kind) {
    std::vector<std::string> names;
    if (!merged.contains("processes")) return names;
    for (const auto& process : merged["processes"]) {
      if (process["process"]["kind"] != kind) continue;
      for (const auto& v : process["volumes"]) names.push_back(v["name"]);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // Polls until pred() holds (true) or the deadline passes (false).
  static bool eventually(const std::function<bool()>& pred, std::chrono::seconds limit = 15s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return pred();
  }

  TempDir tmp_;
  std::string runtime_;
  uint16_t ports_[3] = {};
  std::unique_ptr<Node> node1_, node2_;
};

TEST_F(ClusterTest, StatusFollowsAReplicaStoppedAndRestartedAndResyncsIt) {
  auto volume = Volume::open_from_config(config_path(), "v1", "app", "app");
  ASSERT_TRUE(volume.ok()) << volume.status().to_string();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE((*volume)->write(i * 4096, "before", 6).ok());

  json s = status(1);
  EXPECT_EQ(peer_state(s, "initiator", "v1", "node1"), "connected") << s.dump(2);
  EXPECT_EQ(peer_state(s, "initiator", "v1", "node2"), "connected") << s.dump(2);
  EXPECT_EQ(peer_state(s, "pmirrord", "v1", "app"), "connected") << s.dump(2);

  // Events stream from the initiator's control socket.
  std::vector<json> events;
  std::mutex events_mutex;
  std::atomic<bool> stop_events{false};
  std::promise<void> subscribed;
  auto ready = subscribed.get_future();
  std::thread subscriber([&] {
    (void)control::subscribe(
        control::initiator_socket_path(::getpid()),
        [&](const json& e) {
          std::lock_guard lock(events_mutex);
          events.push_back(e);
          return !stop_events.load();
        },
        {}, std::chrono::seconds(5), [&] { subscribed.set_value(); });
  });
  // Subscribed before node2 stops: its connected -> disconnected is the
  // first event this test looks for (the lab's slow guest lost that race).
  EXPECT_EQ(ready.wait_for(std::chrono::seconds(30)), std::future_status::ready);

  node2_->kill(SIGTERM);
  // Writes go on: one ack (node1) is enough.
  int round = 0;
  ASSERT_TRUE(eventually([&] {
    EXPECT_TRUE((*volume)->write(round++ * 4096, "during", 6).ok());
    std::string state = peer_state(status(1), "initiator", "v1", "node2");
    return state == "disconnected" || state == "connecting" || state == "refused";
  })) << status(1).dump(2);
  EXPECT_EQ(peer_state(status(1), "initiator", "v1", "node1"), "connected");

  // Restarted, node2 is reconnected and brought up to date.
  ASSERT_TRUE(node2_->start()) << node2_->read_log();
  ASSERT_TRUE(eventually([&] {
    return peer_state(status(1), "initiator", "v1", "node2") == "connected";
  })) << status(1).dump(2);
  for (int i = 0; i < 50; ++i) ASSERT_TRUE((*volume)->write(i * 4096 + 100, "after", 5).ok());
  volume->reset();

  auto local = testing::read_file(tmp_.file("app-v1.img"));
  EXPECT_EQ(testing::read_file(tmp_.file("node1-v1.img")), local);
  EXPECT_EQ(testing::read_file(tmp_.file("node2-v1.img")), local)
      << "node2 missed writes while it was down and must have been resynced";

  stop_events = true;
  // Nudge the subscriber out of its read: any event will do.
  auto again = Volume::open_from_config(config_path(), "v1", "app", "app");
  again->reset();
  subscriber.join();
  std::lock_guard lock(events_mutex);
  bool saw_down = false, saw_up = false;
  for (const auto& e : events) {
    if (e.value("peer", "") != "node2") continue;
    if (e.value("from", "") == "connected" && e.value("to", "") == "disconnected") saw_down = true;
    if (e.value("to", "") == "connected") saw_up = true;
  }
  EXPECT_TRUE(saw_down) << json(events).dump(2);
  EXPECT_TRUE(saw_up) << json(events).dump(2);
}

TEST_F(ClusterTest, ReloadAddsAndRemovesVolumesWithoutTouchingTheOthers) {
  auto volume = Volume::open_from_config(config_path(), "v1", "app", "app");
  ASSERT_TRUE(volume.ok()) << volume.status().to_string();
  EXPECT_EQ(volume_names(status(1), "pmirrord"), (std::vector<std::string>{"v1", "v3"}));

  write_config({"v4"});  // v3 gone, v4 new
  node1_->hup();
  ASSERT_TRUE(eventually([&] {
    return volume_names(status(1), "pmirrord") == std::vector<std::string>{"v1", "v4"};
  })) << status(1).dump(2)
      << node1_->read_log();
  // v1's session was not touched.
  EXPECT_EQ(peer_state(status(1), "pmirrord", "v1", "app"), "connected");
  EXPECT_TRUE((*volume)->write(0, "still here", 10).ok());
  EXPECT_EQ(peer_state(status(1), "initiator", "v1", "node1"), "connected");

  // The new volume is served.
  auto v4 = Volume::open_from_config(config_path(), "v4", "app", "app");
  ASSERT_TRUE(v4.ok()) << v4.status().to_string();
  EXPECT_TRUE((*v4)->write(10, "v4", 2).ok());

  // A broken file is refused; the running configuration stays.
  write_config({"v4"}, "  - name: [broken\n");
  node1_->hup();
  ASSERT_TRUE(eventually([&] {
    return node1_->read_log().find("reload rejected") != std::string::npos;
  })) << node1_->read_log();
  EXPECT_EQ(volume_names(status(1), "pmirrord"), (std::vector<std::string>{"v1", "v4"}));
  EXPECT_TRUE((*volume)->write(20, "and still", 9).ok());
}

TEST_F(ClusterTest, PmirrorctlSaysWhenNothingRuns) {
  node1_->kill(SIGTERM);
  std::string out;
  int code =
      run({PMIRRORCTL_PATH, "--socket", socket(1), "--runtime-dir", runtime_, "status"}, out);
  EXPECT_EQ(code, 3) << out;
}

}  // namespace
}  // namespace pmirror
