#include "support/cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "support/daemon_process.h"

namespace pmirror::testing {

using namespace std::chrono_literals;

std::string pmirrorctl_binary() { return PMIRRORCTL_PATH; }
std::string record_writer_binary() { return PMIRROR_RECORD_WRITER_PATH; }

namespace {

std::string read_whole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<char*> c_argv(std::vector<std::string>& copies) {
  std::vector<char*> args;
  for (auto& a : copies) args.push_back(a.data());
  args.push_back(nullptr);
  return args;
}

// waitpid with a deadline; SIGKILL at the deadline. Returns the raw status.
int reap(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return status;
    }
    std::this_thread::sleep_for(10ms);
  }
}

}  // namespace

std::string RunResult::text() const {
  return "exit " + std::to_string(exit) + "\n--- stdout\n" + out + "--- stderr\n" + err;
}

RunResult run_program(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  RunResult result;
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return result;
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return result;
  // Everything the child needs is made before fork: after it, in a
  // threaded process, the child may only make async-signal-safe calls (an
  // allocation can wait forever for a lock another thread held).
  std::vector<std::string> copies = argv;
  auto args = c_argv(copies);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close_range(3, ~0u, 0);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_count = 2;
  while (open_count > 0 && std::chrono::steady_clock::now() < deadline) {
    if (::poll(fds, 2, 100) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[8192];
      ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        (i == 0 ? result.out : result.err).append(buffer, n);
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  int status = reap(pid, std::max(left, std::chrono::milliseconds(100)));
  result.exit = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (WIFSIGNALED(status))
    result.err += "\n(killed by signal " + std::to_string(WTERMSIG(status)) + ")";
  return result;
}

// ------------------------------------------------------------ ClusterDaemon

ClusterDaemon::ClusterDaemon(std::string node, std::string config, std::string log)
    : node_(std::move(node)), config_(std::move(config)), log_(std::move(log)) {}

ClusterDaemon::~ClusterDaemon() { kill9(); }

bool ClusterDaemon::start(std::chrono::milliseconds limit) {
  if (running()) return true;
  size_t offset = log().size();
  const std::string binary = daemon_binary();  // before fork (see run_program)
  pid_ = ::fork();
  if (pid_ == 0) {
    int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close_range(3, ~0u, 0);  // nothing of the test process (its sockets) leaks in
    ::execl(binary.c_str(), binary.c_str(), "--config", config_.c_str(), "--node", node_.c_str(),
            "--foreground", nullptr);
    ::_exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (log().find("listening on", offset) != std::string::npos) return true;
    if (!running()) return false;
    std::this_thread::sleep_for(25ms);
  }
  return false;
}

bool ClusterDaemon::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void ClusterDaemon::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

void ClusterDaemon::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

int ClusterDaemon::terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = reap(pid_, 10s);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ClusterDaemon::log() const { return read_whole(log_); }

std::string ClusterDaemon::log_tail(size_t lines) const {
  std::string text = log();
  size_t pos = text.size();
  for (size_t i = 0; i <= lines && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) {
      pos = 0;
      break;
    }
  }
  return text.substr(pos);
}

// -------------------------------------------------------------- TestCluster

TestCluster::TestCluster(std::string dir, std::string transport, std::string address)
    : dir_(std::move(dir)), transport_(std::move(transport)), address_(std::move(address)) {
  config_path_ = dir_ + "/cluster.yaml";
  runtime_dir_ = dir_ + "/run";
  std::filesystem::create_directories(runtime_dir_);
}

TestCluster::~TestCluster() {
  for (auto& [name, daemon] : daemons_) daemon->kill9();
}

ClusterNodeSpec& TestCluster::add_node(const std::string& name, bool daemon) {
  nodes_.push_back(ClusterNodeSpec{name, daemon, "", "", 0, 0});
  return nodes_.back();
}

ClusterVolumeSpec& TestCluster::add_volume(ClusterVolumeSpec spec) {
  volumes_.push_back(std::move(spec));
  return volumes_.back();
}

ClusterVolumeSpec& TestCluster::volume_spec(const std::string& name) {
  for (auto& v : volumes_) {
    if (v.name == name) return v;
  }
  throw std::invalid_argument("no volume " + name);
}

const ClusterNodeSpec& TestCluster::node(const std::string& name) const {
  for (const auto& n : nodes_) {
    if (n.name == name) return n;
  }
  throw std::invalid_argument("no node " + name);
}

std::string TestCluster::copy_path(const std::string& node, const std::string& volume) const {
  return dir_ + "/" + node + "-" + volume + ".img";
}

std::string TestCluster::metadata_path(const std::string& node, const std::string& volume) const {
  for (const auto& v : volumes_) {
    if (v.name == volume && v.explicit_metadata) return dir_ + "/" + node + "-" + volume + ".meta";
  }
  return copy_path(node, volume) + ".pmirror";
}

std::string TestCluster::lease_dir(const std::string& node) const {
  return dir_ + "/" + node + "-lease";
}

std::string TestCluster::socket(const std::string& node) const {
  return dir_ + "/" + node + ".sock";
}

std::string TestCluster::state_pool(const std::string& node) const {
  return dir_ + "/" + node + ".state";
}

void TestCluster::write_config() {
  for (auto& n : nodes_) {
    if (n.port == 0) n.port = free_port();
  }
  std::ofstream out(config_path_);
  out << "cluster: {name: recovery}\n"
      << "daemon:\n"
      << "  log_level: " << log_level << "\n"
      << "  heartbeat_interval: " << heartbeat_interval << "\n"
      << "  heartbeat_timeout: " << heartbeat_timeout << "\n"
      << "  reconnect_initial: " << reconnect_initial << "\n"
      << "  reconnect_max: " << reconnect_max << "\n";
  if (!failover_yaml.empty()) out << failover_yaml << (failover_yaml.back() == '\n' ? "" : "\n");
  out << "nodes:\n";
  for (const auto& n : nodes_) {
    out << "  - name: " << n.name << "\n"
        << "    address: " << (n.address.empty() ? address_ : n.address) << "\n"
        << "    port: " << n.port << "\n"
        << "    transport: " << transport_ << "\n"
        << "    control_socket: " << socket(n.name) << "\n"
        << "    state_pool: " << state_pool(n.name) << "\n";
    if (!n.listen.empty()) out << "    listen: " << n.listen << "\n";
    if (!failover_yaml.empty()) {
      std::filesystem::create_directories(lease_dir(n.name));
      out << "    lease_dir: " << lease_dir(n.name) << "\n";
    }
    if (n.metrics != 0) out << "    metrics: 127.0.0.1:" << n.metrics << "\n";
  }
  out << "volumes:\n";
  for (const auto& v : volumes_) {
    out << "  - name: " << v.name << "\n"
        << "    size: " << v.size << "\n"
        << "    primary: " << v.primary << "\n"
        << "    replicas: [";
    for (size_t i = 0; i < v.replicas.size(); ++i) out << (i ? ", " : "") << v.replicas[i];
    out << "]\n";
    if (v.ack != 0) out << "    ack: " << v.ack << "\n";
    if (!v.on_insufficient.empty()) out << "    on_insufficient: " << v.on_insufficient << "\n";
    if (!v.chunk.empty()) out << "    chunk: " << v.chunk << "\n";
    if (!v.resync_rate.empty()) out << "    resync_rate: " << v.resync_rate << "\n";
    if (!v.after_split_brain.empty()) {
      out << "    after_split_brain: " << v.after_split_brain << "\n";
    }
    std::vector<std::string> participants = {v.primary};
    participants.insert(participants.end(), v.replicas.begin(), v.replicas.end());
    out << "    paths:\n";
    for (const auto& p : participants) out << "      " << p << ": " << copy_path(p, v.name) << "\n";
    if (v.explicit_metadata) {
      out << "    metadata:\n";
      for (const auto& p : participants) {
        out << "      " << p << ": " << metadata_path(p, v.name) << "\n";
      }
    }
    out << "    create: true\n"
        << "    allowed_peers: [";
    for (size_t i = 0; i < v.allowed_peers.size(); ++i)
      out << (i ? ", " : "") << v.allowed_peers[i];
    out << "]\n"
        << "    secret: \"" << v.secret << "\"\n";
    if (!v.failover.empty()) out << "    failover: " << v.failover << "\n";
  }
}

ClusterDaemon& TestCluster::daemon(const std::string& node) {
  auto& d = daemons_[node];
  if (!d) d = std::make_unique<ClusterDaemon>(node, config_path_, dir_ + "/" + node + ".log");
  return *d;
}

bool TestCluster::start(const std::string& node) { return daemon(node).start(); }

RunResult TestCluster::ctl(const std::string& node, const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = {pmirrorctl_binary(), "--socket", socket(node), "--runtime-dir",
                                   runtime_dir_};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, timeout);
}

std::string TestCluster::logs() const {
  std::string all;
  for (const auto& [name, daemon] : daemons_) {
    all += "\n===== pmirrord " + name + " (last lines) =====\n" + daemon->log_tail(40);
  }
  return all;
}

// -------------------------------------------------------------- LineProcess

LineProcess::~LineProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  if (reader_.joinable()) reader_.join();
}

bool LineProcess::start(const std::vector<std::string>& argv, const std::string& stderr_path) {
  stderr_path_ = stderr_path;
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return false;
  std::vector<std::string> copies = argv;  // before fork (see run_program)
  auto args = c_argv(copies);
  pid_ = ::fork();
  if (pid_ < 0) return false;
  if (pid_ == 0) {
    ::dup2(out_pipe[1], 1);
    int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(err, 2);
    ::close_range(3, ~0u, 0);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  out_fd_ = out_pipe[0];
  reader_ = std::thread([this] {
    std::string partial;
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(out_fd_, buffer, sizeof buffer)) > 0) {
      partial.append(buffer, n);
      size_t pos;
      std::lock_guard lock(mutex_);
      while ((pos = partial.find('\n')) != std::string::npos) {
        lines_.push_back(partial.substr(0, pos));
        partial.erase(0, pos + 1);
      }
      changed_.notify_all();
    }
    ::close(out_fd_);
    std::lock_guard lock(mutex_);
    if (!partial.empty()) lines_.push_back(partial);  // a line cut by a kill
    eof_ = true;
    changed_.notify_all();
  });
  return true;
}

void LineProcess::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int LineProcess::wait(std::chrono::milliseconds limit) {
  if (pid_ > 0) {
    int status = reap(pid_, limit);
    pid_ = -1;
    exit_status_ = WIFEXITED(status)     ? WEXITSTATUS(status)
                   : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                         : -1;
  }
  if (reader_.joinable()) reader_.join();
  return exit_status_;
}

bool LineProcess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    exit_status_ = WIFEXITED(status)     ? WEXITSTATUS(status)
                   : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                         : -1;
    return false;
  }
  return true;
}

bool LineProcess::wait_for_line(const std::function<bool(const std::string&)>& pred,
                                std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  size_t seen = 0;
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    for (; seen < lines_.size(); ++seen) {
      if (pred(lines_[seen])) return true;
    }
    if (eof_) return false;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      for (; seen < lines_.size(); ++seen) {
        if (pred(lines_[seen])) return true;
      }
      return false;
    }
  }
}

std::vector<std::string> LineProcess::lines() const {
  std::lock_guard lock(mutex_);
  return lines_;
}

std::string LineProcess::stderr_text() const { return read_whole(stderr_path_); }

// ------------------------------------------------------------------- ShmDir

ShmDir::ShmDir() {
  std::random_device rd;
  std::string base = "/dev/shm";
  struct stat st {};
  if (::stat(base.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || ::access(base.c_str(), W_OK) != 0) {
    base = std::filesystem::temp_directory_path().string();
  }
  for (int i = 0; i < 100; ++i) {
    std::string candidate =
        base + "/pmirror-rt-" + std::to_string(::getpid()) + "-" + std::to_string(rd() % 1000000);
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a directory under " + base);
}

ShmDir::~ShmDir() {
  if (std::getenv("PMIRROR_TEST_KEEP") != nullptr) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit,
                std::chrono::milliseconds step) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(step);
  }
  return pred();
}

}  // namespace pmirror::testing
