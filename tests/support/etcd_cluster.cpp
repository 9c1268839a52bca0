#include "support/etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "failover/etcd_client.h"

namespace pmirror::testing {

namespace {

// `count` distinct ports nobody listens on right now: all bound to port 0
// at once (so they differ), read back, released together just before use.
std::vector<uint16_t> free_ports(size_t count) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  for (size_t i = 0; i < count; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd >= 0) ::close(fd);
      continue;
    }
    fds.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string etcd_binary(std::string* error) {
  const char* env = std::getenv("PMIRROR_ETCD");
  std::string path = env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
  if (::access(path.c_str(), X_OK) != 0) {
    if (error != nullptr) {
      *error = "etcd is not installed (no executable " + path +
               "): the etcd tests need a real etcd; install Debian's etcd-server "
               "(scripts/install-deps.sh does) or set PMIRROR_ETCD to its path";
    }
    return "";
  }
  return path;
}

std::unique_ptr<EtcdCluster> EtcdCluster::start(int members, std::string* error,
                                                std::chrono::milliseconds timeout) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  std::string binary = etcd_binary(error);
  if (binary.empty()) return nullptr;
  if (members < 1) {
    *error = "an etcd cluster needs at least one member";
    return nullptr;
  }
  std::random_device rd;
  std::string why;
  // A port picked here may be taken by someone else before etcd binds it
  // (tests run in parallel): then a member exits at once, and the cluster
  // is started again on other ports.
  for (int round = 0; round < 3; ++round) {
    std::unique_ptr<EtcdCluster> cluster(new EtcdCluster());
    cluster->binary_ = binary;
    const std::string unique = std::to_string(::getpid()) + "-" + std::to_string(rd() % 1000000);
    cluster->dir_ = std::filesystem::temp_directory_path() / ("pmirror-etcd-" + unique);
    std::error_code ec;
    if (!std::filesystem::create_directory(cluster->dir_, ec)) {
      why = "cannot create " + cluster->dir_.string() + ": " + ec.message();
      continue;
    }
    cluster->token_ = "pmirror-test-" + unique;
    auto ports = free_ports(2 * static_cast<size_t>(members));
    if (ports.size() != 2 * static_cast<size_t>(members)) {
      why = "cannot find free loopback ports";
      continue;
    }
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = "m" + std::to_string(i);
      m.client_port = ports[2 * i];
      m.peer_port = ports[2 * i + 1];
      m.data_dir = (cluster->dir_ / (m.name + ".etcd")).string();
      m.log_path = (cluster->dir_ / (m.name + ".log")).string();
      cluster->initial_cluster_ +=
          (i ? "," : "") + m.name + "=http://127.0.0.1:" + std::to_string(m.peer_port);
      cluster->members_.push_back(std::move(m));
    }
    bool spawned = true;
    for (int i = 0; i < members && spawned; ++i) spawned = cluster->spawn(i, &why);
    if (spawned && cluster->wait_ready(timeout, &why)) return cluster;
    bool any_exited = false;
    for (int i = 0; i < members; ++i) any_exited |= cluster->exited(i) || cluster->members_[i].died;
    if (!any_exited) break;  // it hung rather than failed to bind: do not try again
  }
  *error = "the etcd cluster did not come up: " + why;
  return nullptr;
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i) kill(i);
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}

std::string EtcdCluster::endpoint(int i) const {
  return "http://127.0.0.1:" + std::to_string(members_.at(i).client_port);
}

bool EtcdCluster::spawn(int i, std::string* error) {
  Member& m = members_.at(i);
  const std::string client = "http://127.0.0.1:" + std::to_string(m.client_port);
  const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
  // Everything the child needs is made before fork: a threaded parent's
  // child may only make async-signal-safe calls.
  std::vector<std::string> args = {
      binary_,
      "--name",
      m.name,
      "--data-dir",
      m.data_dir,
      "--listen-client-urls",
      client,
      "--advertise-client-urls",
      client,
      "--listen-peer-urls",
      peer,
      "--initial-advertise-peer-urls",
      peer,
      "--initial-cluster",
      initial_cluster_,
      "--initial-cluster-state",
      "new",
      "--initial-cluster-token",
      token_,
      // Fast elections and lease checks for tests.
      "--heartbeat-interval",
      "50",
      "--election-timeout",
      "500",
      "--logger",
      "zap",
      "--log-outputs",
      "stderr",
  };
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int log = ::open(m.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    *error = "cannot open " + m.log_path;
    return false;
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(log, 1);  // dup2 clears O_CLOEXEC on the copies
    ::dup2(log, 2);
    ::close_range(3, ~0U, 0);            // no test socket or curl connection lives on in etcd
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a crashed test leaves no etcd behind
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log);
  if (pid < 0) {
    *error = "fork failed";
    return false;
  }
  m.pid = pid;
  m.stopped = false;
  return true;
}

bool EtcdCluster::exited(int i) {
  Member& m = members_.at(i);
  if (m.pid <= 0) return false;
  int status = 0;
  if (::waitpid(m.pid, &status, WNOHANG) == m.pid) {
    m.pid = -1;
    m.died = true;
    return true;
  }
  return false;
}

void EtcdCluster::kill(int i) {
  Member& m = members_.at(i);
  if (m.pid <= 0) return;
  ::kill(m.pid, SIGKILL);
  int status = 0;
  ::waitpid(m.pid, &status, 0);
  m.pid = -1;
  m.stopped = false;
}

void EtcdCluster::stop(int i) {
  Member& m = members_.at(i);
  if (m.pid > 0 && ::kill(m.pid, SIGSTOP) == 0) m.stopped = true;
}

void EtcdCluster::resume(int i) {
  Member& m = members_.at(i);
  if (m.pid > 0 && ::kill(m.pid, SIGCONT) == 0) m.stopped = false;
}

bool EtcdCluster::restart(int i, std::string* error, std::chrono::milliseconds timeout) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  kill(i);
  // The data folder holds the member's identity: it rejoins as itself (the
  // --initial-cluster flags are ignored then).
  if (!spawn(i, error)) return false;
  return wait_ready(timeout, error);
}

bool EtcdCluster::wait_ready(std::chrono::milliseconds timeout, std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> ready(members_.size(), false);
  std::vector<std::string> last(members_.size());
  while (true) {
    bool all = true;
    for (int i = 0; i < size(); ++i) {
      if (ready[i] || members_[i].stopped) continue;
      if (members_[i].pid <= 0) continue;  // killed on purpose
      if (exited(i)) {
        *error = "etcd member " + members_[i].name + " exited; its log ends with:\n" + log_tail(i);
        return false;
      }
      auto client = failover::EtcdClient::create(
          {.endpoints = {endpoint(i)}, .timeout = std::chrono::milliseconds(1000)});
      if (!client.ok()) {
        *error = client.status().to_string();
        return false;
      }
      auto answer = (*client)->get("/pmirror-test/ready");
      if (answer.ok()) {
        ready[i] = true;
      } else {
        last[i] = answer.status().to_string();
        all = false;
      }
    }
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string text = "etcd members not answering after " + std::to_string(timeout.count()) +
                     " ms (folder " + dir_.string() + "):";
  for (int i = 0; i < size(); ++i) {
    if (!ready[i] && !last[i].empty()) text += "\n  " + members_[i].name + ": " + last[i];
  }
  *error = text + "\n" + tails();
  return false;
}

std::string EtcdCluster::log(int i) const { return read_text(members_.at(i).log_path); }

std::string EtcdCluster::log_tail(int i, size_t lines) const {
  std::string text = log(i);
  size_t start = text.size();
  if (start > 0 && text[start - 1] == '\n') --start;
  for (size_t n = 0; n < lines && start > 0; ++n) {
    size_t nl = text.rfind('\n', start - 1);
    start = nl == std::string::npos ? 0 : nl;
  }
  return text.substr(start > 0 ? start + 1 : 0);
}

std::string EtcdCluster::tails() const {
  std::string out;
  for (int i = 0; i < size(); ++i) {
    out += "--- " + members_[i].log_path + " (last lines) ---\n" + log_tail(i, 8) + "\n";
  }
  return out;
}

}  // namespace pmirror::testing
