#include "support/daemon_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace pmirror::testing {

TempDir::TempDir() {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (int i = 0; i < 100; ++i) {
    auto candidate =
        base / ("pmirror-test-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 1000000));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temp dir under " + base.string());
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string daemon_binary() { return PMIRROR_DAEMON_PATH; }

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

DaemonProcess::DaemonProcess(std::string dir, std::vector<VolumeSpec> volumes,
                             std::string transport, std::string address, std::string node)
    : dir_(std::move(dir)),
      volumes_(std::move(volumes)),
      transport_(std::move(transport)),
      address_(std::move(address)),
      node_(std::move(node)) {
  config_path_ = dir_ + "/pmirrord.yaml";
  log_path_ = dir_ + "/pmirrord.log";
}

DaemonProcess::~DaemonProcess() { kill9(); }

bool DaemonProcess::start() {
  if (port_ == 0) port_ = free_port();
  {
    // The "app" node has no daemon; its port and files only have to differ
    // from ours (nodes on one address may not share a port or files).
    uint16_t app_port = port_ == 7450 ? 7451 : 7450;
    std::ofstream out(config_path_);
    out << "daemon:\n"
        << "  control_socket: " << dir_ << "/pmirrord.sock\n"
        << "  state_pool: " << dir_ << "/pmirrord.state\n"
        << "  log_level: debug\n";
    for (const auto& setting : daemon_settings) out << "  " << setting << "\n";
    out << "nodes:\n"
        << "  - {name: app, address: 127.0.0.1, port: " << app_port << ", state_pool: " << dir_
        << "/app.state, control_socket: " << dir_ << "/app.sock}\n"
        << "  - name: " << node_ << "\n"
        << "    address: " << address_ << "\n"
        << "    port: " << port_ << "\n"
        << "    transport: " << transport_ << "\n"
        << "volumes:\n";
    for (const auto& v : volumes_) {
      out << "  - name: " << v.name << "\n"
          << "    size: " << v.size << "\n"
          << "    primary: app\n"
          << "    replicas: [" << node_ << "]\n"
          << "    paths:\n"
          << "      app: " << dir_ << "/app-" << v.name << ".img\n"
          << "      " << node_ << ": " << v.path << "\n"
          << "    create: true\n"
          // Each test's own metadata pool: a devdax copy's default one
          // (/var/lib/pmirror/<volume>.pmirror) would outlive the test and
          // make the next test's new primary a split brain.
          << "    metadata:\n"
          << "      " << node_ << ": "
          << (v.metadata.empty() ? dir_ + "/" + node_ + "-" + v.name + ".pmirror" : v.metadata)
          << "\n"
          << "    allowed_peers: [";
      for (size_t i = 0; i < v.allowed_peers.size(); ++i) {
        out << (i ? ", " : "") << v.allowed_peers[i];
      }
      out << "]\n"
          << "    secret: \"" << v.secret << "\"\n"
          << "    apm: " << v.apm << "\n";
      if (!v.native_persistence.empty()) {
        out << "    native_persistence: " << v.native_persistence << "\n";
      }
    }
  }
  log_offset_ = log().size();  // a restart appends to the same log
  // Everything the child needs is made before fork: after it, in a
  // threaded process, the child may only make async-signal-safe calls (an
  // allocation or setenv can wait forever for a lock another thread held).
  const std::string binary = daemon_binary();
  std::vector<std::string> environment;
  std::vector<size_t> pid_slots;  // entries whose value is the child's pid, filled in by it
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    bool replaced = false;
    for (const auto& [name, value] : env) replaced |= text.starts_with(name + "=");
    if (!replaced) environment.emplace_back(text);
  }
  for (const auto& [name, value] : env) {
    if (value == "{pid}") {
      pid_slots.push_back(environment.size());
      environment.push_back(name + "=" + std::string(20, '\0'));
    } else {
      environment.push_back(name + "=" + value);
    }
  }
  std::vector<char*> envp;
  for (auto& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>(binary.c_str()),
                  const_cast<char*>("--config"),
                  config_path_.data(),
                  const_cast<char*>("--node"),
                  node_.data(),
                  const_cast<char*>("--foreground"),
                  nullptr};
  pid_ = ::fork();
  if (pid_ == 0) {
    int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(log, 1);
    ::dup2(log, 2);
    for (size_t slot : pid_slots) {
      // The pid's digits after "NAME=", written in place.
      char* digits = std::strchr(envp[slot], '=') + 1;
      char reversed[20];
      int n = 0;
      for (pid_t pid = ::getpid(); pid > 0 && n < 20; pid /= 10)
        reversed[n++] = char('0' + pid % 10);
      for (int i = 0; i < n; ++i) digits[i] = reversed[n - 1 - i];
    }
    if (nofile_limit > 0) {
      rlimit limit{nofile_limit, nofile_limit};
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(126);
    }
    ::execve(binary.c_str(), argv, envp.data());
    ::_exit(127);
  }
  // The first start may create volumes and the state pool: give it time.
  // Readiness is read from the log, not probed with a connection: an rdma
  // listener does not answer tcp, and a probe would be logged as a failed
  // session.
  const std::string ready = "listening on " + address_ + ":" + std::to_string(port_);
  for (int i = 0; i < 600; ++i) {
    if (!running()) return false;
    if (log().find(ready, log_offset_) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

bool DaemonProcess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void DaemonProcess::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

int DaemonProcess::terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill9();
  return -1;
}

std::string DaemonProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_daemon_to_exit(const std::vector<std::string>& args, std::string& output) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return -1;
  // Made before fork: the child of a threaded process must not allocate.
  std::string binary = daemon_binary();
  std::vector<char*> argv;
  argv.push_back(binary.data());
  std::vector<std::string> copies = args;
  for (auto& a : copies) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipe_fds[1], 1);
    ::dup2(pipe_fds[1], 2);
    ::close(pipe_fds[0]);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) output.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace pmirror::testing
