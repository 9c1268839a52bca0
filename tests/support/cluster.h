// Test support for multi-node scenarios on one machine: ONE cluster file
// with N nodes on one address (each its own port, state pool and control
// socket), a pmirrord per node that may be started, killed and restarted,
// pmirrorctl runs, and child processes whose output is read line by line
// (tests/tools/record_writer.cpp).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pmirror::testing {

std::string pmirrorctl_binary();     // PMIRRORCTL_PATH
std::string record_writer_binary();  // PMIRROR_RECORD_WRITER_PATH

// The result of running a program to completion.
struct RunResult {
  int exit = -1;  // exit status; -1: killed by a signal or could not run
  std::string out, err;
  std::string text() const;  // "exit N\nstdout...\nstderr..." for messages
};
RunResult run_program(const std::vector<std::string>& argv,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

struct ClusterNodeSpec {
  std::string name;
  bool daemon = true;   // runs pmirrord (the test process may also open volumes as it)
  std::string address;  // empty: the cluster's address
  std::string listen;   // empty: not written (pmirrord binds `address`)
  uint16_t port = 0;    // 0: a free port
  uint16_t metrics = 0;  // its pmirrord's metrics port (127.0.0.1); 0: no endpoint
};

struct ClusterVolumeSpec {
  std::string name = "v";
  uint64_t size = 16ull << 20;
  std::string primary;
  std::vector<std::string> replicas;
  uint32_t ack = 0;                // 0: key not written (all replicas)
  std::string on_insufficient;     // empty: not written
  std::string chunk;               // e.g. "64KiB"; empty: not written
  std::string resync_rate;         // e.g. "unlimited", "16MiB/s"
  std::string after_split_brain;   // refuse | overwrite_replica
  bool explicit_metadata = false;  // write `metadata: {node: DIR/NODE-VOL.meta}`
  std::vector<std::string> allowed_peers = {"app"};
  std::string secret = "recovery test secret, long enough";
  std::string failover;  // the volume's `failover:` value (a flow map); empty: not written
};

// A pmirrord for one node of the cluster file. Restartable; its log
// accumulates across starts.
class ClusterDaemon {
 public:
  ClusterDaemon(std::string node, std::string config, std::string log);
  ~ClusterDaemon();  // SIGKILL if running
  // Starts it and waits (up to `limit`) for "listening on" in the log.
  bool start(std::chrono::milliseconds limit = std::chrono::seconds(30));
  void kill9();
  int terminate();  // SIGTERM, wait (10 s, then SIGKILL); exit status or -1
  void signal(int sig);
  bool running();
  pid_t pid() const { return pid_; }
  std::string log() const;
  std::string log_tail(size_t lines = 60) const;

 private:
  std::string node_, config_, log_;
  pid_t pid_ = -1;
};

class TestCluster {
 public:
  // dir: where the cluster file, copies, state pools, sockets and logs go.
  TestCluster(std::string dir, std::string transport, std::string address);
  ~TestCluster();

  ClusterNodeSpec& add_node(const std::string& name, bool daemon = true);
  ClusterVolumeSpec& add_volume(ClusterVolumeSpec spec);
  // A volume added earlier, to change before write_config() is called again.
  ClusterVolumeSpec& volume_spec(const std::string& name);
  // Timers of the daemon section; tight by default so that tests are quick.
  std::string heartbeat_interval = "200ms";
  std::string heartbeat_timeout = "1s";
  std::string reconnect_initial = "100ms";
  std::string reconnect_max = "400ms";
  std::string log_level = "debug";
  // A top-level `failover:` section, written as it is (docs/failover.md);
  // with it every node gets its own lease_dir (lease_dir(node)).
  std::string failover_yaml;

  // Assigns free ports, writes the file (again, if called again).
  void write_config();
  const std::string& config_path() const { return config_path_; }
  const std::string& runtime_dir() const { return runtime_dir_; }
  const std::string& dir() const { return dir_; }
  const std::string& address() const { return address_; }
  const std::string& transport() const { return transport_; }

  std::string copy_path(const std::string& node, const std::string& volume = "v") const;
  std::string metadata_path(const std::string& node, const std::string& volume = "v") const;
  std::string socket(const std::string& node) const;
  std::string state_pool(const std::string& node) const;
  std::string lease_dir(const std::string& node) const;
  const ClusterNodeSpec& node(const std::string& name) const;

  ClusterDaemon& daemon(const std::string& node);
  bool start(const std::string& node);  // daemon(node).start()

  // pmirrorctl --socket <node's> --runtime-dir <ours> ARGS...
  RunResult ctl(const std::string& node, const std::vector<std::string>& args,
                std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // Every daemon's log, for failure messages.
  std::string logs() const;

 private:
  std::string dir_, transport_, address_;
  std::string config_path_, runtime_dir_;
  std::vector<ClusterNodeSpec> nodes_;
  std::vector<ClusterVolumeSpec> volumes_;
  std::map<std::string, std::unique_ptr<ClusterDaemon>> daemons_;
};

// A child process whose stdout is read line by line in the background
// (stderr goes to a file).
class LineProcess {
 public:
  LineProcess() = default;
  ~LineProcess();  // SIGKILL and reap if still running
  LineProcess(const LineProcess&) = delete;
  LineProcess& operator=(const LineProcess&) = delete;

  bool start(const std::vector<std::string>& argv, const std::string& stderr_path);
  void signal(int sig);
  // Waits for exit; returns the exit status, or 128+signal.
  int wait(std::chrono::milliseconds limit = std::chrono::seconds(60));
  bool running();
  pid_t pid() const { return pid_; }

  // Waits until pred(line) holds for some line (true), the process ends
  // with its output drained, or the deadline passes (false).
  bool wait_for_line(const std::function<bool(const std::string&)>& pred,
                     std::chrono::milliseconds limit);
  std::vector<std::string> lines() const;
  std::string stderr_text() const;

 private:
  pid_t pid_ = -1;
  int exit_status_ = -1;
  int out_fd_ = -1;
  std::string stderr_path_;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> lines_;
  bool eof_ = false;
};

// A directory for a test's files, preferring /dev/shm (tmpfs: copies of
// tens of MiB cost no disk I/O), removed at the end.
class ShmDir {
 public:
  ShmDir();
  ~ShmDir();
  ShmDir(const ShmDir&) = delete;
  ShmDir& operator=(const ShmDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Polls pred every `step` until it holds (true) or `limit` passes (false).
bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit,
                std::chrono::milliseconds step = std::chrono::milliseconds(50));

}  // namespace pmirror::testing
