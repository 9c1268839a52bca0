// Automatic failover with etcd (docs/failover.md, section 2), as an
// operator runs it: a 3-member etcd, three nodes each with pmirrord and
// pmirror-promoter, all on loopback; the application is
// pmirror-record-writer, started and stopped by the volume's hook (two
// small scripts), writing self-checking records.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "control/control.h"
#include "support/cluster.h"
#include "support/daemon_process.h"
#include "support/etcd_cluster.h"
#include "support/records.h"

namespace pmirror {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::RecordLayout;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSize = 16ull << 20;
constexpr uint64_t kRecord = 4096;
constexpr auto kTtl = 4s;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The highest N of the "acked N" lines in a record writer's output; 0: none.
uint64_t last_acked(const std::string& out_path) {
  std::istringstream lines(read_text(out_path));
  uint64_t highest = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("acked ", 0) == 0)
      highest = std::max<uint64_t>(highest, std::stoull(line.substr(6)));
  }
  return highest;
}

// Where each node's application starts writing, and its tag.
uint64_t first_seq(const std::string& node) { return node == "a" ? 1 : node == "b" ? 1001 : 2001; }
uint64_t tag_of(const std::string& node) { return node == "a" ? 1 : node == "b" ? 2 : 3; }

// Every event published on one control socket from the subscription on
// (pmirrorctl events reads the same stream).
class EventRecorder {
 public:
  explicit EventRecorder(const std::string& socket) {
    std::promise<void> subscribed;
    auto ready = subscribed.get_future();
    thread_ =
        std::jthread([this, socket, promise = std::move(subscribed)](std::stop_token stop) mutable {
          bool told = false;
          (void)control::subscribe(
              socket,
              [this](const json& event) {
                std::lock_guard lock(mutex_);
                events_.push_back(event);
                return true;
              },
              stop, 2s,
              [&] {
                promise.set_value();
                told = true;
              });
          if (!told) promise.set_value();
        });
    ready.wait_for(5s);
  }
  std::vector<json> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }
  // The first event whose `key` is `value` and whose text contains `part`.
  std::optional<json> find(const std::string& key, const std::string& value,
                           const std::string& part = "") const {
    for (const json& e : events()) {
      if (e.value(key, "") != value) continue;
      std::string text = e.value("message", "") + e.value("reason", "");
      if (text.find(part) != std::string::npos) return e;
    }
    return std::nullopt;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<json> events_;
  std::jthread thread_;  // last: stopped and joined before the events go
};

class FailoverTest : public ::testing::Test {
 protected:
  // `ack`: the volume's ack (0: all replicas). `failover`: the volume's
  // failover entry; empty: the start_command and stop_command hooks.
  void start_cluster(uint32_t ack, const std::string& failover = "") {
    std::string error;
    etcd_ = testing::EtcdCluster::start(3, &error);
    ASSERT_NE(etcd_, nullptr) << error;
    dir_ = std::make_unique<testing::ShmDir>();
    cluster_ = std::make_unique<testing::TestCluster>(dir_->path(), "tcp", "127.0.0.1");
    // The application and the promoters find each other's control sockets here.
    ::setenv("PMIRROR_RUNTIME_DIR", cluster_->runtime_dir().c_str(), 1);
    std::string endpoints;
    for (const auto& e : etcd_->endpoints()) endpoints += (endpoints.empty() ? "" : ", ") + e;
    cluster_->failover_yaml = "failover:\n  engine: etcd\n  etcd:\n    endpoints: [" + endpoints +
                              "]\n    prefix: /pmirror-test\n    ttl: 4s\n    renew: 1s\n"
                              "    timeout: 1s\n    margin: 1s\n";
    write_hooks();
    for (const char* node : {"a", "b", "c"}) cluster_->add_node(node);
    testing::ClusterVolumeSpec spec;
    spec.size = kSize;
    spec.primary = "a";
    spec.replicas = {"b", "c"};
    spec.ack = ack;
    spec.failover = !failover.empty()
                        ? failover
                        : "{start_command: \"sh " + dir_->file("start-app.sh") +
                              "\", stop_command: \"sh " + dir_->file("stop-app.sh") + "\"}";
    cluster_->add_volume(spec);
    cluster_->write_config();
    for (const char* node : {"a", "b", "c"}) {
      ASSERT_TRUE(cluster_->start(node)) << cluster_->logs();
    }
  }

  void TearDown() override {
    if (etcd_ != nullptr) {
      for (int i = 0; i < etcd_->size(); ++i) etcd_->resume(i);
    }
    for (auto& [node, promoter] : promoters_) promoter->signal(SIGKILL);
    for (const char* node : {"a", "b", "c"}) kill_application(node, SIGKILL);
  }

  // The hook: start-app.sh is the record writer, run in the foreground on
  // the node the promoter names ($PMIRROR_NODE) and watched by its promoter
  // (it writes its pid for the tests to kill or freeze it); stop-app.sh
  // stops it by the pid the promoter gives it.
  void write_hooks() {
    std::ofstream start(dir_->file("start-app.sh"));
    // a writes long enough to be killed, frozen or cut off mid-stream; the
    // node that takes over writes 300 records and idles.
    start << "case \"$PMIRROR_NODE\" in a) first=1; tag=1; count=990;; "
             "b) first=1001; tag=2; count=300;; *) first=2001; tag=3; count=300;; esac\n"
          << "echo $$ > " << dir_->path() << "/app-$PMIRROR_NODE.pid\n"
          << "exec " << testing::record_writer_binary() << " write --config "
          << dir_->file("cluster.yaml")
          << " --volume v --node \"$PMIRROR_NODE\" --identity app --record-size " << kRecord
          << " --first-seq $first --count $count --tag $tag --rate 50 --hold-open"
          << " --open-timeout 30 > " << dir_->path() << "/app-$PMIRROR_NODE.out 2> " << dir_->path()
          << "/app-$PMIRROR_NODE.err < /dev/null\n";
    std::ofstream stop(dir_->file("stop-app.sh"));
    stop << "echo \"$PMIRROR_APP_PID\" > " << dir_->path() << "/stopped-$PMIRROR_NODE.pid\n"
         << "kill -TERM -\"$PMIRROR_APP_PID\"\n";
  }

  void start_promoter(const std::string& node) {
    auto p = std::make_unique<testing::LineProcess>();
    ASSERT_TRUE(p->start({PMIRROR_PROMOTER_PATH, "--config", cluster_->config_path(), "--node",
                          node, "--foreground", "--log-level", "debug"},
                         dir_->file("promoter-" + node + ".log")));
    promoters_[node] = std::move(p);
  }

  std::string out_of(const std::string& node) { return dir_->file("app-" + node + ".out"); }

  pid_t application_pid(const std::string& node) {
    std::string text = read_text(dir_->file("app-" + node + ".pid"));
    return text.empty() ? -1 : static_cast<pid_t>(std::stol(text));
  }

  void kill_application(const std::string& node, int sig) {
    pid_t pid = application_pid(node);
    if (pid > 0) ::kill(pid, sig);
  }

  // The node whose application has printed an "acked" line, other than `old`.
  std::string serving_node(const std::string& old) {
    for (const char* node : {"a", "b", "c"}) {
      if (node != old && last_acked(out_of(node)) >= first_seq(node)) return node;
    }
    return {};
  }

  // The node other than a whose application acknowledges records, once
  // one does (60 s at most); empty if none.
  std::string new_primary() {
    std::string next;
    testing::eventually(
        [&] {
          next = serving_node("a");
          return !next.empty();
        },
        60s, 20ms);
    return next;
  }

  std::string diagnostics() {
    std::string all = cluster_->logs();
    for (const char* node : {"a", "b", "c"}) {
      all += "\n--- promoter " + std::string(node) + "\n" +
             read_text(dir_->file("promoter-" + std::string(node) + ".log"));
      all += "\n--- application " + std::string(node) + " stderr\n" +
             read_text(dir_->file("app-" + std::string(node) + ".err"));
    }
    return all;
  }

  // The takeover's time, for scripts/failover-takeover.sh ("[failover] node
  // N serves MS ms after the EVENT (ttl T ms)"); with PMIRROR_FAILOVER_TRACE
  // also when it happened ("[failover] DONE at hh:mm:ss.mmm") and every
  // node's logs: where the time went.
  void report_takeover(const std::string& next, Clock::time_point since, const char* event,
                       const char* done) {
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since);
    std::fprintf(stderr, "[failover] node %s serves %lld ms after the %s (ttl %lld ms)\n",
                 next.c_str(), static_cast<long long>(took.count()), event,
                 static_cast<long long>(std::chrono::milliseconds(kTtl).count()));
    if (std::getenv("PMIRROR_FAILOVER_TRACE") == nullptr) return;
    const auto wall = std::chrono::system_clock::now() - (Clock::now() - since);
    const std::time_t t = std::chrono::system_clock::to_time_t(wall);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()) % 1000;
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%H:%M:%S", std::localtime(&t));
    std::fprintf(stderr, "[failover] %s at %s.%03lld\n%s\n", done, stamp,
                 static_cast<long long>(ms.count()), diagnostics().c_str());
  }

  // Empty if every record first..last with `tag` is intact on `node`'s
  // copy; else what is not, with the copy's summary.
  std::string missing_on(const std::string& node, uint64_t first, uint64_t last, uint64_t tag) {
    RecordLayout layout(kSize, kRecord);
    auto bytes = testing::read_file(cluster_->copy_path(node));
    if (bytes.size() < kSize)
      return node + "'s copy is only " + std::to_string(bytes.size()) + " bytes";
    auto scan = testing::scan_records(bytes.data(), layout);
    std::string missing = testing::check_present(scan, first, last, tag);
    return missing.empty() ? missing : missing + "\n" + scan.summary();
  }

  json promoter_status(const std::string& node) {
    auto status =
        control::request(dir_->file(node + ".promoter.sock"), {{"command", "status"}}, 2s);
    return status.ok() ? *status : json();
  }

  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::unique_ptr<testing::ShmDir> dir_;
  std::unique_ptr<testing::TestCluster> cluster_;
  std::map<std::string, std::unique_ptr<testing::LineProcess>> promoters_;
};

// kill -9 the primary's application and its promoter mid-stream: a replica
// takes the lease once it runs out, promotes its copy (fencing the others)
// and starts the application, which goes on writing; every record the old
// application saw acknowledged is on the new primary's copy.
TEST_F(FailoverTest, KilledPrimaryIsReplacedAndItsAcknowledgedRecordsSurvive) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(/*ack=*/0));
  for (const char* node : {"a", "b", "c"}) ASSERT_NO_FATAL_FAILURE(start_promoter(node));
  // a, the configured primary of a new cluster, takes the lease and starts
  // the application; b and c stay replicas.
  ASSERT_TRUE(testing::eventually([&] { return last_acked(out_of("a")) >= 100; }, 60s, 50ms))
      << diagnostics();
  EXPECT_EQ(last_acked(out_of("b")), 0u);
  EXPECT_EQ(last_acked(out_of("c")), 0u);
  // What the standbys' promoters and pmirrords announce from here on.
  std::map<std::string, std::unique_ptr<EventRecorder>> promoter_events, daemon_events;
  for (const char* node : {"b", "c"}) {
    promoter_events[node] =
        std::make_unique<EventRecorder>(dir_->file(std::string(node) + ".promoter.sock"));
    daemon_events[node] = std::make_unique<EventRecorder>(dir_->file(std::string(node) + ".sock"));
  }

  promoters_["a"]->signal(SIGKILL);
  kill_application("a", SIGKILL);
  const auto killed_at = Clock::now();
  EXPECT_EQ(promoters_["a"]->wait(10s), 128 + SIGKILL);
  std::this_thread::sleep_for(200ms);  // the writer's last lines reach its file
  const uint64_t acked = last_acked(out_of("a"));
  ASSERT_GE(acked, 100u);

  const std::string next = new_primary();
  ASSERT_FALSE(next.empty()) << diagnostics();
  report_takeover(next, killed_at, "kill", "killed");

  // Every record a saw acknowledged is on the new primary's copy.
  EXPECT_EQ(missing_on(next, 1, acked, tag_of("a")), "");

  // The application the hook started goes on writing, and its records
  // reach the other live replica.
  const uint64_t first = first_seq(next);
  ASSERT_TRUE(testing::eventually([&] { return last_acked(out_of(next)) >= first + 100; }, 60s))
      << diagnostics();
  const std::string other = next == "b" ? "c" : "b";
  ASSERT_TRUE(testing::eventually(
      [&] { return missing_on(other, first, first + 50, tag_of(next)).empty(); }, 30s))
      << diagnostics();
  // Only one node took over.
  EXPECT_EQ(last_acked(out_of(other)), 0u) << diagnostics();
  // pmirrorctl status says who holds the lease, on either node.
  testing::RunResult here = cluster_->ctl(next, {"status", "v"});
  EXPECT_NE(here.out.find("  lease: held here (node " + next + ") since "), std::string::npos)
      << here.text();
  testing::RunResult there = cluster_->ctl(other, {"status", "v"});
  EXPECT_NE(there.out.find("  lease: held by node " + next + " since "), std::string::npos)
      << there.text();

  // The events say so: the new primary's promoter took the lease and
  // promoted (fencing the other copies), the other's saw the primary
  // change, and the other's pmirrord recorded the fence.
  auto took_lease = promoter_events[next]->find("event", "lease-acquired");
  EXPECT_TRUE(took_lease.has_value()) << json(promoter_events[next]->events()).dump(2);
  if (took_lease) {
    EXPECT_EQ(took_lease->value("volume", ""), "v");
    EXPECT_EQ(took_lease->value("node", ""), next);
    EXPECT_EQ(took_lease->value("process", ""), "pmirror-promoter");
  }
  // The promotion waits 100 ms at most for the fences' first answers (a
  // busy machine may leave this one pending: pmirrord's event below shows
  // it landed).
  EXPECT_TRUE(promoter_events[next]->find("event", "promoted", other + ":fenced").has_value() ||
              promoter_events[next]->find("event", "promoted", other + ":pending").has_value())
      << json(promoter_events[next]->events()).dump(2);
  EXPECT_TRUE(promoter_events[other]->find("event", "primary-changed", "node " + next).has_value())
      << json(promoter_events[other]->events()).dump(2);
  EXPECT_FALSE(promoter_events[other]->find("event", "lease-acquired").has_value());
  ASSERT_TRUE(testing::eventually(
      [&] {
        return daemon_events[other]
            ->find("to", "closed", "fence recorded: promoted on node " + next)
            .has_value();
      },
      10s))
      << json(daemon_events[other]->events()).dump(2);
  // And the promoter's counters, which pmirrord's metrics export.
  json status = promoter_status(next);
  ASSERT_TRUE(status.contains("volumes")) << status.dump(2);
  EXPECT_EQ(status["volumes"][0].value("takeovers", 0), 1) << status.dump(2);
  EXPECT_GE(status["lease"].value("renewals", 0), 1) << status.dump(2);
}

// The application dies on the primary's node while its promoter and
// pmirrord go on: the promoter (start_command is its watched child) gives
// the volume up at once, a standby takes it over and starts its own
// application, and the node whose application ended does not take the
// volume back while the other holds it; every record the dead application
// saw acknowledged is on the new primary's copy.
TEST_F(FailoverTest, AnApplicationThatEndsGivesItsVolumeUp) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(/*ack=*/0));
  for (const char* node : {"a", "b", "c"}) ASSERT_NO_FATAL_FAILURE(start_promoter(node));
  ASSERT_TRUE(testing::eventually([&] { return last_acked(out_of("a")) >= 100; }, 60s, 50ms))
      << diagnostics();
  // The promoter knows its application: the process group the writer
  // (the pid the hook wrote) runs in.
  json before = promoter_status("a");
  ASSERT_TRUE(before.contains("volumes")) << before.dump(2);
  EXPECT_EQ(before["volumes"][0]["application"].value("pid", 0), ::getpgid(application_pid("a")))
      << before.dump(2);
  EventRecorder a_events(dir_->file("a.promoter.sock"));

  kill_application("a", SIGKILL);
  const auto killed_at = Clock::now();
  std::this_thread::sleep_for(200ms);  // the writer's last lines reach its file
  const uint64_t acked = last_acked(out_of("a"));

  const std::string next = new_primary();
  ASSERT_FALSE(next.empty()) << diagnostics();
  report_takeover(next, killed_at, "application's kill", "killed");
  // Well before a's lease could have run out: a gave the volume up.
  EXPECT_TRUE(promoters_["a"]->running()) << "a's promoter must go on";
  ASSERT_TRUE(testing::eventually(
      [&] {
        // The shell running start_command says how its child ended.
        return a_events.find("event", "application-ended", "exited with 137 after").has_value();
      },
      10s))
      << json(a_events.events()).dump(2);
  json after = promoter_status("a");
  ASSERT_TRUE(after.contains("volumes")) << after.dump(2);
  const json& volume = after["volumes"][0];
  // At least once: on a loaded machine the standbys may not have taken the
  // volume within a's hold-off, which a then takes back (its copy is as
  // new as theirs) and hands over again.
  EXPECT_GE(volume["application"].value("ended", 0), 1) << after.dump(2);
  EXPECT_NE(volume["application"].value("last_end", "").find("exited with 137 after"),
            std::string::npos)
      << after.dump(2);
  EXPECT_FALSE(volume.value("held", true)) << after.dump(2);
  EXPECT_EQ(volume["application"].value("pid", -1), 0) << after.dump(2);

  EXPECT_EQ(missing_on(next, 1, acked, tag_of("a")), "");
  // a does not take the volume back while the new primary holds it, and
  // its copy follows the new primary's as a replica.
  const uint64_t first = first_seq(next);
  ASSERT_TRUE(testing::eventually([&] { return last_acked(out_of(next)) >= first + 100; }, 60s))
      << diagnostics();
  EXPECT_EQ(promoter_status("a")["volumes"][0].value("holder", ""), next);
  ASSERT_TRUE(testing::eventually(
      [&] { return missing_on("a", first, first + 50, tag_of(next)).empty(); }, 30s))
      << diagnostics();
}

// A volume handed over (its promoter stopped) stops its application with
// the stop_command, which gets the application's pid.
TEST_F(FailoverTest, AHandOverStopsTheApplicationWithItsPid) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(/*ack=*/0));
  for (const char* node : {"a", "b", "c"}) ASSERT_NO_FATAL_FAILURE(start_promoter(node));
  ASSERT_TRUE(testing::eventually([&] { return last_acked(out_of("a")) >= 20; }, 60s, 50ms))
      << diagnostics();
  const pid_t pid = application_pid("a");
  ASSERT_GT(pid, 0);
  const pid_t group = ::getpgid(pid);
  promoters_["a"]->signal(SIGTERM);
  EXPECT_EQ(promoters_["a"]->wait(60s), 0) << diagnostics();
  // PMIRROR_APP_PID: the shell that ran start_command, the leader of the
  // application's process group.
  EXPECT_EQ(read_text(dir_->file("stopped-a.pid")), std::to_string(group) + "\n");
  // Stopped, and its group with it (gone, or a zombie its new parent has
  // yet to reap).
  auto ended = [](pid_t p) {
    std::string stat = read_text("/proc/" + std::to_string(p) + "/stat");
    auto paren = stat.rfind(')');
    return stat.empty() || (paren != std::string::npos && stat.substr(paren + 2, 1) == "Z");
  };
  EXPECT_TRUE(ended(pid));
  EXPECT_TRUE(ended(group));
  const std::string next = new_primary();
  EXPECT_FALSE(next.empty()) << diagnostics();
}

// hook_unit: the promoter asks systemd once a second whether the unit
// still runs; a unit found failed gives the volume up as an ended
// start_command does. systemctl here is a stand-in on PATH that runs the
// hook script as the unit (this machine's tests run without systemd).
TEST_F(FailoverTest, AUnitFoundFailedGivesItsVolumeUp) {
  testing::ShmDir bin;
  {
    std::ofstream fake(bin.file("systemctl"));
    const std::string pid_file = "/app-$PMIRROR_NODE.pid";
    fake << "#!/bin/sh\n"
         << "echo \"$*\" >> " << bin.file("calls-") << "$PMIRROR_NODE\n"
         << "pid=$(cat " << bin.path() << pid_file << " 2>/dev/null)\n"
         << "case $1 in\n"
         << "start) (setsid sh " << bin.path() << "/unit.sh > /dev/null 2>&1 &) ;;\n"
         << "stop) [ -n \"$pid\" ] && kill \"$pid\" ;;\n"
         << "is-active) if [ -n \"$pid\" ] && kill -0 \"$pid\" 2>/dev/null; then echo active; "
            "else echo failed; exit 3; fi ;;\n"
         << "esac\nexit 0\n";
  }
  ::chmod(bin.file("systemctl").c_str(), 0755);
  const std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  ::setenv("PATH", (bin.path() + ":" + path).c_str(), 1);
  ASSERT_NO_FATAL_FAILURE(start_cluster(/*ack=*/0, "{hook_unit: app-v.service}"));
  // The "unit": the hook script, its pid where is-active looks.
  {
    std::ofstream unit(bin.file("unit.sh"));
    unit << "echo $$ > " << bin.path() << "/app-$PMIRROR_NODE.pid\n"
         << "exec sh " << dir_->file("start-app.sh") << "\n";
  }
  for (const char* node : {"a", "b", "c"}) ASSERT_NO_FATAL_FAILURE(start_promoter(node));
  ::setenv("PATH", path.c_str(), 1);
  ASSERT_TRUE(testing::eventually([&] { return last_acked(out_of("a")) >= 50; }, 60s, 50ms))
      << diagnostics();
  EventRecorder a_events(dir_->file("a.promoter.sock"));
  kill_application("a", SIGKILL);
  const std::string next = new_primary();
  ASSERT_FALSE(next.empty()) << diagnostics();
  EXPECT_TRUE(promoters_["a"]->running());
  ASSERT_TRUE(testing::eventually(
      [&] {
        return a_events.find("event", "application-ended", "(unit app-v.service) is failed")
            .has_value();
      },
      10s))
      << json(a_events.events()).dump(2);
  // a started the unit, asked after it, and stopped it once it had failed.
  const std::string calls = read_text(bin.file("calls-a"));
  EXPECT_NE(calls.find("start app-v.service\nis-active app-v.service\n"), std::string::npos)
      << calls;
  EXPECT_NE(calls.find("stop app-v.service"), std::string::npos) << calls;
  EXPECT_NE(read_text(bin.file("calls-" + next)).find("start app-v.service"), std::string::npos);
}

// The seqs of the valid records with `tag` on `node`'s copy.
std::set<uint64_t> records_with_tag(const testing::TestCluster& cluster, const std::string& node,
                                    uint64_t tag) {
  RecordLayout layout(kSize, kRecord);
  auto bytes = testing::read_file(cluster.copy_path(node));
  std::set<uint64_t> out;
  if (bytes.size() < kSize) return out;
  auto scan = testing::scan_records(bytes.data(), layout);
  for (uint64_t seq = 1; seq < scan.records.size(); ++seq) {
    const auto& r = scan.records[seq];
    if (r.state == testing::RecordState::kValid && r.tag == tag) out.insert(seq);
  }
  return out;
}

// The "failed SEQ MESSAGE" line of a record writer's output; empty: none.
std::string failed_line(const std::string& out_path) {
  std::istringstream lines(read_text(out_path));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("failed ", 0) == 0) return line;
  }
  return {};
}

// Freeze the primary's node -- application, promoter and pmirrord
// (SIGSTOP) -- past the lease:
// a replica takes over and fences the other copies. Thawed, the old
// primary writes nothing more to any replica (bytes checked), its persists
// fail (its lease is gone; a persist it had posted before the freeze meets
// the fence), and its copy comes back as a replica of the new primary,
// resynced to the same bytes.
TEST_F(FailoverTest, FrozenPrimaryIsFencedAndComesBackAsAReplica) {
  // ack 1: the frozen primary's application still holds its own node's
  // copy (that pmirrord answers busy, and cannot record the fence), so the
  // new primary writes with the third copy meanwhile and brings a's up to
  // date once the old application is gone.
  ASSERT_NO_FATAL_FAILURE(start_cluster(/*ack=*/1));
  for (const char* node : {"a", "b", "c"}) ASSERT_NO_FATAL_FAILURE(start_promoter(node));
  ASSERT_TRUE(testing::eventually([&] { return last_acked(out_of("a")) >= 100; }, 60s, 50ms))
      << diagnostics();
  // The whole node freezes: application, promoter and pmirrord. The
  // takeover must not wait for it (its fence is retried in the background).
  promoters_["a"]->signal(SIGSTOP);
  kill_application("a", SIGSTOP);
  cluster_->daemon("a").signal(SIGSTOP);
  const auto frozen_at = Clock::now();

  const std::string next = new_primary();
  ASSERT_FALSE(next.empty()) << diagnostics();
  report_takeover(next, frozen_at, "freeze", "frozen");
  cluster_->daemon("a").signal(SIGCONT);
  // The new primary is serving: the fence is in force on every copy it
  // reached. What a's records are on the replicas now is all there will be.
  const std::string other = next == "b" ? "c" : "b";
  const auto on_next = records_with_tag(*cluster_, next, tag_of("a"));
  const auto on_other = records_with_tag(*cluster_, other, tag_of("a"));
  ASSERT_GE(on_next.size(), 100u);

  // The application first, on its own: what stops it is its lease file and
  // the fence, not its promoter (thawed after, it stops the application
  // and gives the volume up).
  kill_application("a", SIGCONT);
  ASSERT_TRUE(testing::eventually([&] { return !failed_line(out_of("a")).empty(); }, 30s))
      << "the thawed primary went on writing: " << read_text(out_of("a")).substr(0, 2000)
      << diagnostics();
  promoters_["a"]->signal(SIGCONT);
  const std::string failed = failed_line(out_of("a"));
  EXPECT_TRUE(failed.find("lease lost") != std::string::npos ||
              failed.find("fenced") != std::string::npos)
      << failed;
  std::fprintf(stderr, "[frozen primary] thawed, it says: %s\n", failed.c_str());
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(records_with_tag(*cluster_, next, tag_of("a")), on_next)
      << "the thawed primary wrote into the new primary's copy";
  EXPECT_EQ(records_with_tag(*cluster_, other, tag_of("a")), on_other)
      << "the thawed primary wrote into a fenced copy";

  // The new primary's application writes its 300 records and idles; a's
  // copy, a replica again, is resynced to the new primary's bytes but for
  // the record the old application stored and failed to persist: a store
  // no persist carried is in no log (docs/failover.md, "What a fenced
  // primary leaves in its copy").
  const uint64_t refused = std::stoull(failed.substr(7));
  RecordLayout layout(kSize, kRecord);
  const uint64_t refused_at = layout.offset_of(refused);
  auto same_but_refused = [&](const std::vector<uint8_t>& x, const std::vector<uint8_t>& y) {
    if (x.size() != y.size() || x.size() < kSize) return false;
    return std::equal(x.begin(), x.begin() + refused_at, y.begin()) &&
           std::equal(x.begin() + refused_at + kRecord, x.end(), y.begin() + refused_at + kRecord);
  };
  ASSERT_TRUE(testing::eventually(
      [&] { return read_text(out_of(next)).find("\nidle") != std::string::npos; }, 60s))
      << diagnostics();
  ASSERT_TRUE(testing::eventually(
      [&] {
        auto primary = testing::read_file(cluster_->copy_path(next));
        return same_but_refused(testing::read_file(cluster_->copy_path("a")), primary) &&
               testing::read_file(cluster_->copy_path(other)) == primary;
      },
      60s, 200ms))
      << "a's copy did not come back as a replica of " << next << diagnostics();

  // Now the new primary freezes, and a -- the configured primary, whose copy
  // the first fence never reached -- takes the volume back. That is a
  // promotion like any other: the frozen primary's session on a's pmirrord
  // is ended (a's application must not wait for it to time out) and the
  // third copy is fenced against it. docs/failover.md, section 2.
  EventRecorder other_daemon(dir_->file(other + ".sock"));
  const pid_t old_application = application_pid("a");
  promoters_[next]->signal(SIGSTOP);
  kill_application(next, SIGSTOP);
  ASSERT_TRUE(testing::eventually(
      [&] { return application_pid("a") != old_application && last_acked(out_of("a")) >= 50; },
      60s, 50ms))
      << "a did not take its volume back" << diagnostics();
  ASSERT_TRUE(testing::eventually(
      [&] {
        return other_daemon.find("to", "closed", "fence recorded: promoted on node a").has_value();
      },
      10s))
      << "taking the volume back fenced nothing on " << other << ": "
      << json(other_daemon.events()).dump(2) << diagnostics();
  // Thawed, the second primary (idle: its 300 records are written) gives
  // the volume up; a writes on.
  kill_application(next, SIGCONT);
  promoters_[next]->signal(SIGCONT);
  const uint64_t a_acked = last_acked(out_of("a"));
  ASSERT_TRUE(
      testing::eventually([&] { return last_acked(out_of("a")) >= a_acked + 50; }, 30s, 50ms))
      << diagnostics();
}

// One etcd member of three dies: nothing changes (the primary keeps its
// lease and writes on, nobody takes over). Then etcd loses its majority
// (two members stopped): the primary cannot renew and its persists fail
// with kLeaseLost, by its deadline, before etcd could let the lease expire;
// nobody else can take the key meanwhile.
TEST_F(FailoverTest, EtcdMinorityLossChangesNothingMajorityLossStopsThePrimary) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(/*ack=*/0));
  for (const char* node : {"a", "b", "c"}) ASSERT_NO_FATAL_FAILURE(start_promoter(node));
  ASSERT_TRUE(testing::eventually([&] { return last_acked(out_of("a")) >= 100; }, 60s, 50ms))
      << diagnostics();
  etcd_->kill(0);
  const uint64_t before = last_acked(out_of("a"));
  // Longer than the lease: had a renewal failed for good, the lease file
  // would have stopped the writer by now.
  std::this_thread::sleep_for(kTtl + 2s);
  EXPECT_GT(last_acked(out_of("a")), before + 100) << diagnostics();
  EXPECT_EQ(failed_line(out_of("a")), "");
  EXPECT_EQ(serving_node("a"), "");

  etcd_->stop(1);
  etcd_->stop(2);
  const auto stopped_at = Clock::now();
  ASSERT_TRUE(testing::eventually([&] { return !failed_line(out_of("a")).empty(); }, 60s))
      << diagnostics();
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped_at);
  const std::string failed = failed_line(out_of("a"));
  EXPECT_NE(failed.find("lease lost"), std::string::npos) << failed;
  std::fprintf(stderr,
               "[etcd majority lost] the primary stopped writing %lld ms after (ttl %lld ms)\n",
               static_cast<long long>(took.count()),
               static_cast<long long>(std::chrono::milliseconds(kTtl).count()));
  EXPECT_EQ(serving_node("a"), "");
  etcd_->resume(1);
  etcd_->resume(2);
}

}  // namespace
}  // namespace pmirror
