// Test support: runs a real pmirrord process with a config written into a
// temporary folder, on a free loopback port, and kills it at the end.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace pmirror::testing {

// A fresh folder under the system temp dir, removed (recursively) at the end.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A port nobody listens on right now (bound to 0, read back, released).
uint16_t free_port();

struct VolumeSpec {
  std::string name;
  std::string path;
  uint64_t size = 0;
  std::vector<std::string> allowed_peers = {"app"};
  std::string secret = "correct horse battery staple";
  std::string apm = "auto";
  // The copy's metadata pool; empty: one in the daemon's folder.
  std::string metadata{};
  std::string native_persistence{};  // empty: not in the file (auto)
};

// One pmirrord, a node of its own cluster file: the node `node` (this
// daemon, replica of every volume) and the node "app" at 127.0.0.1, the
// volumes' primary, where the test's initiator runs (no daemon there).
class DaemonProcess {
 public:
  // dir: where the config, state pool and log go.
  DaemonProcess(std::string dir, std::vector<VolumeSpec> volumes, std::string transport = "tcp",
                std::string address = "127.0.0.1", std::string node = "target");
  ~DaemonProcess();  // SIGKILL if still running

  // Writes the config and starts the daemon; waits until the port accepts
  // connections. false: it exited or never listened (see log()).
  bool start();
  void kill9();                // SIGKILL and reap
  int terminate();             // SIGTERM, wait, return the exit status (-1 if killed)
  bool running();

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }

  // Extra environment for the daemon, set in the child before exec (e.g.
  // NOTIFY_SOCKET). The value "{pid}" becomes the daemon's own pid (for
  // WATCHDOG_PID, which must name the daemon).
  std::vector<std::pair<std::string, std::string>> env;
  // More settings of the config's `daemon:` section, one "key: value" each
  // (e.g. "max_unauthenticated: 500", "metrics: 127.0.0.1:9942").
  std::vector<std::string> daemon_settings;
  // RLIMIT_NOFILE for the daemon (set in the child before exec); 0: inherited.
  uint64_t nofile_limit = 0;
  const std::string& config_path() const { return config_path_; }
  std::string log() const;  // everything it wrote to stdout/stderr

 private:
  std::string dir_;
  std::vector<VolumeSpec> volumes_;
  std::string transport_;
  std::string address_;
  std::string node_;
  uint16_t port_ = 0;
  std::string config_path_;
  std::string log_path_;
  pid_t pid_ = -1;
  size_t log_offset_ = 0;
};

// Runs pmirrord with the given arguments to completion; returns its exit
// status and combined output.
int run_daemon_to_exit(const std::vector<std::string>& args, std::string& output);

std::string daemon_binary();  // path of the built pmirrord
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace pmirror::testing
