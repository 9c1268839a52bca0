// pmirror-bench: measures persist latency and throughput through libpmirror
// over a matrix of record sizes x replica counts x persists in flight, and,
// next to each size, the round trip of a plain TCP ping-pong of the same
// message size over loopback, so that pmirror's overhead over the raw
// transport shows as a ratio. docs/benchmarks.md describes the method.
//
//   # self-contained: starts 2 pmirrord on loopback, volumes in /dev/shm
//   pmirror-bench --spawn-targets 2 --json results.json
//   # against running targets
//   pmirror-bench --replica 10.0.0.2:7450 --replica 10.0.0.3:7450 --secret S
//       --volume db0 --local /mnt/pmem/db0 --size 1GiB --transport rdma
//   # resync throughput and persist latency while a resync runs (one target)
//   pmirror-bench --scenario resync --spawn-targets 1 --size 1GiB
//       --resync-rates unlimited,200MiB/s --json resync.json
//
// Latency of one persist:
//   depth 1   persist() timed with steady_clock around the call.
//   depth D   persist_async() keeps up to D persists outstanding. When the
//             window is full the benchmark wait()s for the oldest; an op's
//             latency runs from its persist_async() call until the return of
//             the first wait() that covers it (completion is in order).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <pmirror/pmirror.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "config/config.h"
#include "transport/transport.h"

namespace {

using namespace pmirror;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

std::atomic<bool> g_interrupted{false};

void on_interrupt(int) { g_interrupted = true; }

// ---------------------------------------------------------------- statistics

struct Summary {
  size_t count = 0;
  double p50 = 0, p99 = 0, p999 = 0, mean = 0, min = 0, max = 0;  // microseconds
};

// Nearest-rank percentiles of the samples (microseconds).
Summary summarize(std::vector<double> samples) {
  Summary s;
  s.count = samples.size();
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double p) {
    size_t r = static_cast<size_t>(std::ceil(p * static_cast<double>(samples.size())));
    return samples[std::clamp<size_t>(r, 1, samples.size()) - 1];
  };
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  s.p999 = rank(0.999);
  s.min = samples.front();
  s.max = samples.back();
  double total = 0;
  for (double v : samples) total += v;
  s.mean = total / static_cast<double>(samples.size());
  return s;
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

Json summary_json(const Summary& s) {
  return Json{{"samples", s.count}, {"p50_us", s.p50}, {"p99_us", s.p99}, {"p999_us", s.p999},
              {"mean_us", s.mean},  {"min_us", s.min}, {"max_us", s.max}};
}

std::string size_label(uint64_t bytes) {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) == 0) {
    return std::to_string(bytes / (1024 * 1024)) + " MiB";
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes) + " B";
}

// ------------------------------------------------------------- machine facts

std::string read_first_line_with(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      auto colon = line.find(':');
      if (colon == std::string::npos) return line;
      auto value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      return value;
    }
  }
  return "unknown";
}

std::string filesystem_of(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return "unknown";
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0x01021994UL:
      return "tmpfs";
    case 0xEF53UL:
      return "ext4";
    case 0x58465342UL:
      return "xfs";
    case 0x9123683EUL:
      return "btrfs";
    case 0x794C7630UL:
      return "overlayfs";
    default: {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "0x%lx", static_cast<unsigned long>(fs.f_type));
      return buffer;
    }
  }
}

// "1.23 0.98 0.50": the 1, 5 and 15 minute load averages.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

Json machine_facts() {
  struct utsname u {};
  ::uname(&u);
  return Json{{"nproc", std::thread::hardware_concurrency()},
              {"kernel", std::string(u.sysname) + " " + u.release},
              {"machine", u.machine},
              {"cpu_model", read_first_line_with("/proc/cpuinfo", "model name")}};
}

// ------------------------------------------------------- TCP ping-pong baseline

bool read_exactly(int fd, std::byte* data, size_t n) {
  while (n > 0) {
    ssize_t got = ::recv(fd, data, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    data += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool write_exactly(int fd, const std::byte* data, size_t n) {
  while (n > 0) {
    ssize_t put = ::send(fd, data, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    data += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// An echo server thread on 127.0.0.1 and a client in this thread: the
// client sends `size` bytes, the server reads all of them and sends them
// back; one round trip is timed from before send to after the last byte.
Result<Summary> tcp_ping_pong(uint64_t size, uint64_t warmup, uint64_t iterations,
                              double& seconds) {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return Status(Errc::kIoError, std::string("socket: ") + strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(listener);
    return Status(Errc::kIoError, std::string("ping-pong listener: ") + strerror(errno));
  }
  std::thread server([listener, size] {
    int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    set_nodelay(fd);
    std::vector<std::byte> buffer(size);
    while (read_exactly(fd, buffer.data(), size) && write_exactly(fd, buffer.data(), size)) {
    }
    ::close(fd);
  });
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool connected = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  if (!connected) {
    ::shutdown(listener, SHUT_RDWR);
  } else {
    set_nodelay(fd);
  }
  std::vector<std::byte> out(size, std::byte{0x5a});
  std::vector<std::byte> in(size);
  std::vector<double> samples;
  samples.reserve(iterations);
  bool ok = connected;
  Clock::time_point started;
  for (uint64_t i = 0; ok && i < warmup + iterations; ++i) {
    if (i == warmup) started = Clock::now();
    out[0] = static_cast<std::byte>(i);
    auto t0 = Clock::now();
    ok = write_exactly(fd, out.data(), size) && read_exactly(fd, in.data(), size);
    auto t1 = Clock::now();
    if (i >= warmup) samples.push_back(micros(t1 - t0));
  }
  seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (fd >= 0) ::close(fd);
  server.join();
  ::close(listener);
  if (!ok) return Status(Errc::kIoError, "tcp ping-pong over 127.0.0.1 failed");
  return summarize(std::move(samples));
}

// ---------------------------------------------------------- spawned targets

uint16_t free_port(const std::string& address) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  socklen_t len = sizeof addr;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One pmirrord serving one volume, with its config, state pool, log and
// volume file in its own folder.
class SpawnedTarget {
 public:
  SpawnedTarget(std::string daemon, std::string dir, std::string address, std::string transport,
                std::string poll)
      : daemon_(std::move(daemon)),
        dir_(std::move(dir)),
        address_(std::move(address)),
        transport_(std::move(transport)),
        poll_(std::move(poll)) {}
  ~SpawnedTarget() { stop(); }
  SpawnedTarget(const SpawnedTarget&) = delete;
  SpawnedTarget& operator=(const SpawnedTarget&) = delete;

  Status start(const std::string& volume, uint64_t size, const std::string& identity,
               const std::string& secret) {
    port_ = free_port(address_);
    if (port_ == 0) {
      return Status(Errc::kIoError, "no free port on " + address_ + ": " + strerror(errno));
    }
    std::filesystem::create_directories(dir_);
    std::string config = dir_ + "/pmirrord.yaml";
    log_ = dir_ + "/pmirrord.log";
    {
      std::ofstream out(config);
      // A cluster file of two nodes: "bench" (the primary, where this
      // process runs; no daemon) and "target" (this pmirrord). Both may be
      // on one address, so "bench" gets its own port and files.
      out << "daemon:\n"
          << "  state_pool: " << dir_ << "/pmirrord.state\n"
          << "  control_socket: " << dir_ << "/pmirrord.sock\n"
          << "  log_level: info\n"
          << "nodes:\n"
          << "  - {name: bench, address: " << address_
          << ", port: " << (port_ == 7450 ? 7451 : 7450) << ", state_pool: " << dir_
          << "/bench.state, control_socket: " << dir_ << "/bench.sock}\n"
          << "  - {name: target, address: " << address_ << ", port: " << port_
          << ", transport: " << transport_ << "}\n"
          << "volumes:\n"
          << "  - name: " << volume << "\n"
          << "    primary: bench\n"
          << "    replicas: [target]\n"
          << "    paths:\n"
          << "      bench: " << dir_ << "/local.img\n"
          << "      target: " << (volume_path_.empty() ? dir_ + "/replica.img" : volume_path_)
          << "\n";
      // Beside this target's other files: two targets on devdax would
      // otherwise share /var/lib/pmirror/<volume>.pmirror (and a run would
      // meet the generations of the last).
      if (!metadata_dir_.empty()) {
        out << "    metadata: {target: " << metadata_dir_ << "/"
            << std::filesystem::path(dir_).parent_path().filename().string() << "-"
            << std::filesystem::path(dir_).filename().string() << ".pmirror}\n";
      } else if (!volume_path_.empty()) {
        out << "    metadata: {target: " << dir_ << "/replica.pmirror}\n";
      }
      if (!native_persistence_.empty()) {
        out << "    native_persistence: " << native_persistence_ << "\n";
      }
      out << "    size: " << size << "\n"
          << "    create: true\n"
          << "    allowed_peers: [" << identity << "]\n"
          << "    secret: \"" << secret << "\"\n"
          << "    poll: " << poll_ << "\n";
      if (!out) return Status(Errc::kIoError, "cannot write " + config);
    }
    pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) return Status(Errc::kIoError, std::string("fork: ") + strerror(errno));
    if (pid_ == 0) {
      // Die with the benchmark, however it ends.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);
      int log = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(log, 1);
      ::dup2(log, 2);
      ::execl(daemon_.c_str(), daemon_.c_str(), "--config", config.c_str(), "--node", "target",
              nullptr);
      ::_exit(127);
    }
    // Ready once it logs that it listens (works for tcp and rdma alike).
    for (int i = 0; i < 600; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return Status(Errc::kIoError,
                      "pmirrord exited while starting; its log (" + log_ + "):\n" + slurp(log_));
      }
      if (slurp(log_).find("listening on") != std::string::npos) return Status::Ok();
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return Status(Errc::kTimeout,
                  "pmirrord did not listen within 15 s; its log (" + log_ + "):\n" + slurp(log_));
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 200; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string endpoint() const { return address_ + ":" + std::to_string(port_); }

  // --target-volume (lab benchmark, scripts/lab/bench.sh): serve the
  // volume from this path (e.g. a devdax device) instead of DIR/replica.img.
  void set_volume_path(std::string path) { volume_path_ = std::move(path); }
  // --native-persistence and --target-metadata-dir (issue 26's method
  // comparisons: the commit word needs the metadata on pmem).
  void set_native_persistence(std::string value) { native_persistence_ = std::move(value); }
  void set_metadata_dir(std::string dir) { metadata_dir_ = std::move(dir); }
  pid_t pid() const { return pid_; }

 private:
  std::string volume_path_;  // empty: dir_ + "/replica.img"
  std::string native_persistence_;
  std::string metadata_dir_;
  std::string daemon_;
  std::string dir_;
  std::string address_;
  std::string transport_;
  std::string poll_;  // the volume's `poll`
  std::string log_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

// --------------------------------------------------------------- the matrix

// What the spawned pmirrords spent: CPU time (user + system, every
// thread) and context switches (voluntary and not, every thread: each
// wake-up is one), summed over the daemons.
struct DaemonCost {
  double cpu_us = 0;
  uint64_t switches = 0;
};

DaemonCost daemon_cost(const std::vector<pid_t>& pids) {
  DaemonCost cost;
  const double tick_us = 1e6 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  for (pid_t pid : pids) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // After the command's closing parenthesis: field 3 onwards; utime and
    // stime are fields 14 and 15.
    auto close = text.rfind(')');
    if (close != std::string::npos) {
      std::istringstream fields(text.substr(close + 2));
      std::string field;
      uint64_t utime = 0, stime = 0;
      for (int i = 3; i <= 15 && fields >> field; ++i) {
        if (i == 14) utime = std::stoull(field);
        if (i == 15) stime = std::stoull(field);
      }
      cost.cpu_us += static_cast<double>(utime + stime) * tick_us;
    }
    std::error_code ec;
    for (const auto& task :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
      std::ifstream status(task.path() / "status");
      for (std::string line; std::getline(status, line);) {
        if (line.starts_with("voluntary_ctxt_switches:") ||
            line.starts_with("nonvoluntary_ctxt_switches:")) {
          cost.switches += std::stoull(line.substr(line.find(':') + 1));
        }
      }
    }
  }
  return cost;
}

struct Cell {
  uint64_t size = 0;
  size_t replicas = 0;
  uint32_t depth = 0;
  uint64_t iterations = 0;
  Summary latency;
  double seconds = 0;
  uint32_t writers = 1;
  // Spawned targets only: their CPU time and context switches per persist
  // of the cell (warm-up included), -1 otherwise.
  double target_cpu_us_per_persist = -1;
  double target_switches_per_persist = -1;
  double persists_per_second() const { return seconds > 0 ? latency.count / seconds : 0; }
  double mib_per_second() const {
    return persists_per_second() * static_cast<double>(size) / (1024.0 * 1024.0);
  }
};

struct PingPong {
  Summary rtt;
  double seconds = 0;
};

// Writes an 8-byte stamp at both ends of the record, so that every persist
// carries fresh bytes without the benchmark timing a full memset.
void stamp(std::byte* record, uint64_t size, uint64_t value) {
  std::memcpy(record, &value, std::min<uint64_t>(8, size));
  if (size >= 16) std::memcpy(record + size - 8, &value, 8);
}

// Runs `warmup` then `iterations` persists of `size` bytes at depth `depth`,
// from `writers` threads at once (each its own records, iterations/writers
// persists each): the persists/s is the sum, the latency summary all of
// theirs.
Result<Cell> run_cell(Volume& volume, size_t replicas, uint64_t size, uint32_t depth,
                      uint32_t writers, uint64_t warmup, uint64_t iterations, uint64_t& counter) {
  const uint64_t slots = volume.size() / size;
  std::byte* base = volume.data();
  const uint64_t first = counter;
  Cell cell{size, replicas, depth, iterations, {}, 0};
  cell.writers = writers;

  // Writer w's k-th persist goes to slot first + w + writers * k.
  auto run_phase = [&](uint32_t w, uint64_t& k, uint64_t n,
                       std::vector<double>* samples) -> Status {
    auto next_offset = [&] { return ((first + w + uint64_t{writers} * k++) % slots) * size; };
    if (depth == 1) {
      for (uint64_t i = 0; i < n; ++i) {
        if (g_interrupted) return Status(Errc::kClosed, "interrupted");
        uint64_t offset = next_offset();
        stamp(base + offset, size, first + k);
        auto t0 = Clock::now();
        Status persisted = volume.persist(offset, size);
        auto t1 = Clock::now();
        if (!persisted.ok()) return persisted;
        if (samples != nullptr) samples->push_back(micros(t1 - t0));
      }
      return Status::Ok();
    }
    struct Pending {
      uint64_t sequence;
      Clock::time_point started;
    };
    std::deque<Pending> window;
    auto retire_oldest = [&]() -> Status {
      Status waited = volume.wait(window.front().sequence);
      auto now = Clock::now();
      if (!waited.ok()) return waited;
      if (samples != nullptr) samples->push_back(micros(now - window.front().started));
      window.pop_front();
      return Status::Ok();
    };
    for (uint64_t i = 0; i < n; ++i) {
      if (g_interrupted) return Status(Errc::kClosed, "interrupted");
      if (window.size() == depth) PMIRROR_RETURN_IF_ERROR(retire_oldest());
      uint64_t offset = next_offset();
      stamp(base + offset, size, first + k);
      auto t0 = Clock::now();
      auto sequence = volume.persist_async(offset, size);
      if (!sequence.ok()) return sequence.status();
      window.push_back({*sequence, t0});
    }
    while (!window.empty()) PMIRROR_RETURN_IF_ERROR(retire_oldest());
    return Status::Ok();
  };

  const uint64_t per_writer = std::max<uint64_t>(1, iterations / writers);
  std::vector<std::vector<double>> samples(writers);
  std::vector<Status> results(writers);
  std::vector<uint64_t> next(writers, 0);
  for (auto& v : samples) v.reserve(per_writer);
  // Every writer warms up, then all start measuring together.
  Clock::time_point started;
  std::barrier start_line(writers, [&]() noexcept { started = Clock::now(); });
  auto writer = [&](uint32_t w) {
    Status warmed = run_phase(w, next[w], std::max<uint64_t>(1, warmup / writers), nullptr);
    start_line.arrive_and_wait();  // a writer whose warm-up failed still arrives
    results[w] = warmed.ok() ? run_phase(w, next[w], per_writer, &samples[w]) : warmed;
  };
  if (writers == 1) {
    writer(0);
  } else {
    std::vector<std::thread> threads;
    for (uint32_t w = 0; w < writers; ++w) threads.emplace_back(writer, w);
    for (auto& t : threads) t.join();
  }
  cell.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  for (const Status& result : results) PMIRROR_RETURN_IF_ERROR(result);
  std::vector<double> all;
  for (auto& v : samples) all.insert(all.end(), v.begin(), v.end());
  uint64_t used = 0;
  for (uint64_t k : next) used = std::max(used, k);
  counter = first + used * writers;
  cell.iterations = all.size();
  cell.latency = summarize(std::move(all));
  return cell;
}

// Writes the whole volume once (random bytes, 64 KiB persists, 32 in
// flight), so that no measured persist pays for first-touch page faults on
// either side.
Status prefill(Volume& volume) {
  std::mt19937_64 rng(42);
  auto* words = reinterpret_cast<uint64_t*>(volume.data());
  for (uint64_t i = 0; i < volume.size() / 8; ++i) words[i] = rng();
  const uint64_t chunk = 64 * 1024;
  for (uint64_t offset = 0; offset < volume.size(); offset += chunk) {
    auto started = volume.persist_async(offset, std::min(chunk, volume.size() - offset));
    if (!started.ok()) return started.status().with_context("prefill");
  }
  return volume.drain().with_context("prefill");
}

uint64_t default_iterations(uint64_t size) {
  if (size <= 4096) return 10000;
  if (size <= 16384) return 5000;
  return 3000;
}

std::string random_secret() {
  std::random_device rd;
  std::string secret;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 48; ++i) secret += hex[rd() % 16];
  return secret;
}

struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

Result<Endpoint> parse_endpoint(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status(Errc::kInvalidArgument, "--replica " + text + ": expected HOST:PORT");
  }
  try {
    unsigned long port = std::stoul(text.substr(colon + 1));
    if (port == 0 || port > 65535) throw std::out_of_range("port");
    return Endpoint{text.substr(0, colon), static_cast<uint16_t>(port)};
  } catch (const std::exception&) {
    return Status(Errc::kInvalidArgument, "--replica " + text + ": bad port");
  }
}

std::string volume_dir_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

void print_rule(int width) {
  std::printf("%s\n", std::string(static_cast<size_t>(width), '-').c_str());
}

// ------------------------------------------------------ the resync scenario
//
// --scenario resync: one target. Per resync rate (--resync-rates, e.g.
// unlimited,200MiB/s) the volume is opened with that VolumeOptions::
// resync_rate and
//   baseline        depth-1 persists of --latency-size, no resync running;
//   resync alone    Volume::resync(peer, full) copies the whole volume while
//                   nothing else runs: throughput = bytes copied / time from
//                   the call until status_json() shows the resync finished;
//   resync+persists the same full resync with depth-1 persists issued back to
//                   back until it finishes: their latency, and the resync's
//                   throughput under that load.
// Before the first rate, the volume is written whole twice as a reference
// for the copy rate: 64 KiB persists with 32 in flight (the prefill), then
// persists of --resync-step bytes one at a time (what a resync step does).

struct ResyncPhase {
  std::string name;         // baseline | resync-idle | resync-load
  uint64_t rate_limit = 0;  // bytes/s, 0 = unlimited
  uint64_t resync_bytes = 0;
  double resync_seconds = 0;
  double lib_rate = 0;  // the library's own rate_bytes_per_s, last seen
  uint64_t polls = 0;
  uint64_t record_size = 0;
  Summary latency;  // depth-1 persists (baseline, resync-load)
  double persist_seconds = 0;
  double resync_mib_per_second() const {
    return resync_seconds > 0 ? static_cast<double>(resync_bytes) / resync_seconds / 1048576.0 : 0;
  }
  double persists_per_second() const {
    return persist_seconds > 0 ? static_cast<double>(latency.count) / persist_seconds : 0;
  }
};

struct CopyReference {
  std::string name;
  uint64_t record = 0;
  uint32_t depth = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double mib_per_second() const {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / 1048576.0 : 0;
  }
};

std::string rate_label(uint64_t rate) { return rate == 0 ? "unlimited" : size_label(rate) + "/s"; }

// The first peer's resync counters, from the status object.
struct PeerProgress {
  uint64_t resyncs = 0;
  uint64_t resynced_bytes = 0;
  uint64_t rate = 0;  // rate_bytes_per_s while a resync runs
  bool active = false;
  std::string state;
};

PeerProgress peer_progress(const Volume& volume) {
  PeerProgress p;
  Json status = Json::parse(volume.status_json());
  const Json& peer = status.at("peers").at(0);
  p.resyncs = peer.value("resyncs", uint64_t{0});
  p.resynced_bytes = peer.value("resynced_bytes", uint64_t{0});
  p.state = peer.value("state", std::string());
  if (peer.contains("resync")) {
    p.active = true;
    p.rate = peer["resync"].value("rate_bytes_per_s", uint64_t{0});
  }
  return p;
}

// Writes the whole volume with persists of `record` bytes, `depth` in flight.
Result<CopyReference> copy_reference(Volume& volume, const std::string& name, uint64_t record,
                                     uint32_t depth) {
  CopyReference ref{name, record, depth, volume.size(), 0};
  auto started = Clock::now();
  std::deque<uint64_t> window;
  for (uint64_t offset = 0; offset < volume.size(); offset += record) {
    if (g_interrupted) return Status(Errc::kClosed, "interrupted");
    if (window.size() == depth) {
      PMIRROR_RETURN_IF_ERROR(volume.wait(window.front()));
      window.pop_front();
    }
    auto sequence = volume.persist_async(offset, std::min(record, volume.size() - offset));
    if (!sequence.ok()) return sequence.status().with_context(name);
    window.push_back(*sequence);
  }
  PMIRROR_RETURN_IF_ERROR(volume.drain());
  ref.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return ref;
}

// Runs a full resync of the first peer; with `load`, depth-1 persists of
// `record` bytes are issued back to back until it has finished.
Result<ResyncPhase> resync_phase(Volume& volume, const std::string& peer, uint64_t rate, bool load,
                                 uint64_t record, uint64_t& counter, std::chrono::seconds limit) {
  ResyncPhase phase;
  phase.name = load ? "resync-load" : "resync-idle";
  phase.rate_limit = rate;
  phase.record_size = load ? record : 0;
  PeerProgress before = peer_progress(volume);
  if (before.active) return Status(Errc::kFailedPrecondition, "a resync is already running");
  const uint64_t slots = volume.size() / record;
  std::vector<double> samples;
  auto started = Clock::now();
  PMIRROR_RETURN_IF_ERROR(volume.resync(peer, /*full=*/true));
  auto last_poll = Clock::now();
  PeerProgress now = before;
  while (true) {
    if (g_interrupted) return Status(Errc::kClosed, "interrupted");
    if (load) {
      uint64_t offset = (counter++ % slots) * record;
      stamp(volume.data() + offset, record, counter);
      auto t0 = Clock::now();
      Status persisted = volume.persist(offset, record);
      auto t1 = Clock::now();
      if (!persisted.ok()) return persisted.with_context("persist during resync");
      samples.push_back(micros(t1 - t0));
      if (t1 - last_poll < std::chrono::milliseconds(10)) continue;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    last_poll = Clock::now();
    now = peer_progress(volume);
    ++phase.polls;
    if (now.active && now.rate > 0) phase.lib_rate = static_cast<double>(now.rate);
    if (now.resyncs > before.resyncs) break;
    if (Clock::now() - started > limit) {
      return Status(Errc::kTimeout, "the resync did not finish within " +
                                        std::to_string(limit.count()) +
                                        " s; status: " + volume.status_json());
    }
  }
  auto finished = Clock::now();
  phase.resync_seconds = std::chrono::duration<double>(finished - started).count();
  phase.resync_bytes = now.resynced_bytes - before.resynced_bytes;
  phase.persist_seconds = load ? phase.resync_seconds : 0;
  phase.latency = summarize(std::move(samples));
  return phase;
}

Result<ResyncPhase> baseline_phase(Volume& volume, uint64_t rate, uint64_t record, uint64_t warmup,
                                   uint64_t iterations, uint64_t& counter) {
  PMIRROR_ASSIGN_OR_RETURN(Cell cell,
                           run_cell(volume, 1, record, 1, 1, warmup, iterations, counter));
  ResyncPhase phase;
  phase.name = "baseline";
  phase.rate_limit = rate;
  phase.record_size = record;
  phase.latency = cell.latency;
  phase.persist_seconds = cell.seconds;
  return phase;
}

struct ResyncSettings {
  VolumeOptions base;  // everything but resync_rate
  std::vector<uint64_t> rates;
  uint64_t record = 4096;
  uint64_t warmup = 500;
  uint64_t iterations = 5000;
  bool idle = true;
  bool reference = true;
};

struct ResyncResults {
  std::vector<CopyReference> references;
  std::vector<ResyncPhase> phases;
  std::vector<std::pair<uint64_t, double>> open_seconds;  // rate, seconds of open()
  std::string method;
};

Result<std::unique_ptr<Volume>> open_with_retry(const VolumeOptions& o) {
  auto volume = Volume::open(o);
  for (int retry = 0; retry < 100 && !volume.ok() && volume.status().code() == Errc::kBusy;
       ++retry) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    volume = Volume::open(o);
  }
  return volume;
}

void print_phase(const ResyncPhase& p) {
  char resync[64] = "-", lib[32] = "-", secs[32] = "-", mib[32] = "-";
  if (p.name != "baseline") {
    std::snprintf(resync, sizeof resync, "%s", size_label(p.resync_bytes).c_str());
    std::snprintf(secs, sizeof secs, "%.2f", p.resync_seconds);
    std::snprintf(mib, sizeof mib, "%.1f", p.resync_mib_per_second());
    std::snprintf(lib, sizeof lib, "%.1f", p.lib_rate / 1048576.0);
  }
  char lat[96] = "-";
  if (p.latency.count > 0) {
    std::snprintf(lat, sizeof lat, "%7llu %8.1f %8.1f %8.1f %9.1f %9.0f",
                  static_cast<unsigned long long>(p.latency.count), p.latency.p50, p.latency.p99,
                  p.latency.p999, p.latency.max, p.persists_per_second());
  }
  std::printf("%-16s %-12s %9s %8s %9s %9s  %s\n", p.name.c_str(), rate_label(p.rate_limit).c_str(),
              resync, secs, mib, lib, lat);
  std::fflush(stdout);
}

Result<ResyncResults> run_resync_scenario(const ResyncSettings& s, const std::string& peer) {
  ResyncResults results;
  uint64_t counter = 0;
  std::printf("%-16s %-12s %9s %8s %9s %9s  %7s %8s %8s %8s %9s %9s\n", "phase", "rate limit",
              "copied", "seconds", "MiB/s", "lib MiB/s", "persists", "p50", "p99", "p99.9", "max",
              "persists/s");
  print_rule(120);
  for (size_t i = 0; i < s.rates.size(); ++i) {
    uint64_t rate = s.rates[i];
    VolumeOptions options = s.base;
    options.resync_rate = rate;
    auto opened_at = Clock::now();
    PMIRROR_ASSIGN_OR_RETURN(auto volume, open_with_retry(options));
    double open_seconds = std::chrono::duration<double>(Clock::now() - opened_at).count();
    results.open_seconds.emplace_back(rate, open_seconds);
    if (i == 0) {
      for (const auto& r : volume->replicas()) results.method = r.method;
      // The first open gave the new replica its initial full sync.
      std::printf("%-16s %-12s %9s %8.2f %9.1f %9s  (open(): connect + initial full sync)\n",
                  "open", rate_label(rate).c_str(), size_label(volume->size()).c_str(),
                  open_seconds, static_cast<double>(volume->size()) / open_seconds / 1048576.0,
                  "-");
      // Random bytes everywhere, so that no copy moves zero pages.
      std::mt19937_64 rng(42);
      auto* words = reinterpret_cast<uint64_t*>(volume->data());
      for (uint64_t w = 0; w < volume->size() / 8; ++w) words[w] = rng();
      PMIRROR_ASSIGN_OR_RETURN(auto prefill,
                               copy_reference(*volume, "persist 64KiB x32", 64 * 1024, 32));
      results.references.push_back(prefill);
      if (s.reference) {
        std::string step = size_label(s.base.resync_step);
        step.erase(std::remove(step.begin(), step.end(), ' '), step.end());
        std::string name = "persist " + step + " x1";
        PMIRROR_ASSIGN_OR_RETURN(auto stream, copy_reference(*volume, name, s.base.resync_step, 1));
        results.references.push_back(stream);
      }
      for (const auto& ref : results.references) {
        std::printf("%-29s %9s %8.2f %9.1f %9s  (the whole volume as persists)\n", ref.name.c_str(),
                    size_label(ref.bytes).c_str(), ref.seconds, ref.mib_per_second(), "-");
      }
    }
    // Generous: the limiter's rate, or 20 MiB/s when unlimited, with 3x slack.
    uint64_t expected_rate = rate != 0 ? rate : 20ull << 20;
    auto limit = std::chrono::seconds(30 + 3 * volume->size() / expected_rate);
    PMIRROR_ASSIGN_OR_RETURN(
        auto base, baseline_phase(*volume, rate, s.record, s.warmup, s.iterations, counter));
    print_phase(base);
    results.phases.push_back(base);
    if (s.idle) {
      PMIRROR_ASSIGN_OR_RETURN(auto idle,
                               resync_phase(*volume, peer, rate, false, s.record, counter, limit));
      print_phase(idle);
      results.phases.push_back(idle);
    }
    PMIRROR_ASSIGN_OR_RETURN(auto loaded,
                             resync_phase(*volume, peer, rate, true, s.record, counter, limit));
    print_phase(loaded);
    results.phases.push_back(loaded);
  }
  print_rule(120);
  return results;
}

Json resync_json(const ResyncResults& r) {
  Json out;
  out["method"] = r.method;
  out["open"] = Json::array();
  for (const auto& [rate, seconds] : r.open_seconds) {
    out["open"].push_back(Json{{"rate_limit", rate}, {"seconds", seconds}});
  }
  out["references"] = Json::array();
  for (const auto& ref : r.references) {
    out["references"].push_back(Json{{"name", ref.name},
                                     {"record", ref.record},
                                     {"depth", ref.depth},
                                     {"bytes", ref.bytes},
                                     {"seconds", ref.seconds},
                                     {"mib_per_s", ref.mib_per_second()}});
  }
  out["phases"] = Json::array();
  for (const auto& p : r.phases) {
    Json row{{"phase", p.name},
             {"rate_limit", p.rate_limit},
             {"rate_limit_label", rate_label(p.rate_limit)},
             {"record_size", p.record_size}};
    if (p.name != "baseline") {
      row["resync_bytes"] = p.resync_bytes;
      row["resync_seconds"] = p.resync_seconds;
      row["resync_mib_per_s"] = p.resync_mib_per_second();
      row["lib_rate_mib_per_s"] = p.lib_rate / 1048576.0;
      row["polls"] = p.polls;
    }
    if (p.latency.count > 0) {
      row["latency"] = summary_json(p.latency);
      row["persists_per_s"] = p.persists_per_second();
    }
    out["phases"].push_back(row);
  }
  return out;
}

// ------------------------------------------------------------ command line

// Everything the command line sets; --help says what each is.
struct BenchOptions {
  std::vector<std::string> replica_args;
  std::string secret;
  std::string volume_name = "bench";
  std::string local_path;
  std::string size_text = "64MiB";
  std::string transport_name = "tcp";
  std::string address = "127.0.0.1";
  std::string identity = "bench";
  std::string method_name = "auto";
  std::string poll_name = "adaptive";
  int spawn_targets = 0;
  std::string daemon_path = PMIRROR_BENCH_DAEMON_PATH;
  std::string data_dir = "/dev/shm";
  bool keep = false;
  std::vector<std::string> size_args = {"64", "256", "1KiB", "4KiB", "16KiB", "64KiB"};
  std::vector<uint32_t> depths = {1, 4, 16, 32};
  std::vector<uint32_t> writers = {1};
  std::vector<size_t> replica_counts;
  std::optional<uint64_t> iterations_override;
  uint64_t warmup = 500;
  std::string json_path;
  std::vector<std::string> target_volumes;  // --target-volume, i-th for target i (lab)
  std::string native_persistence;           // spawned targets' volume setting ("": not set)
  std::string target_metadata_dir;          // spawned targets' metadata pools ("": their folder)
  std::string scenario = "matrix";
  std::vector<std::string> resync_rate_args = {"unlimited", "200MiB/s"};
  std::string chunk_text = "64KiB";
  std::string resync_step_text = "1MiB";
  std::string latency_size_text = "4KiB";
  bool skip_idle = false;
  bool skip_reference = false;
  bool verbose = false;
  std::string connect_timeout_text = "5s";

  bool spawning() const { return spawn_targets > 0; }
  MethodPreference method() const {
    return method_name == "gpspm" ? MethodPreference::kGpspm : MethodPreference::kAuto;
  }
  PollMode poll() const {
    return poll_name == "busy"    ? PollMode::kBusy
           : poll_name == "event" ? PollMode::kEvent
                                  : PollMode::kAdaptive;
  }
};

void add_options(CLI::App& app, BenchOptions& o) {
  auto* replica_option = app.add_option("--replica", o.replica_args,
                                        "a running target as HOST:PORT (repeat for more)");
  app.add_option("--secret", o.secret, "the volume's shared secret on the --replica targets");
  app.add_option("--volume", o.volume_name, "volume name on the targets")->capture_default_str();
  app.add_option("--local", o.local_path,
                 "local copy (created if missing); spawn mode: DIR/…/local.img");
  app.add_option("--size", o.size_text, "volume size")->capture_default_str();
  app.add_option("--transport", o.transport_name, "tcp|rdma")->capture_default_str();
  app.add_option("--address", o.address,
                 "spawn mode: address the targets listen on (rdma: the RDMA device's IP)")
      ->capture_default_str();
  app.add_option("--identity", o.identity, "who we are to the targets")->capture_default_str();
  app.add_option("--method", o.method_name, "auto (APM where offered) | gpspm")
      ->capture_default_str();
  app.add_option("--poll", o.poll_name,
                 "busy | adaptive | event: how the bench's and the spawned targets' threads "
                 "wait for completions (the volume's `poll`)")
      ->capture_default_str();
  app.add_option("--spawn-targets", o.spawn_targets,
                 "start N pmirrord on free ports with generated configs, then stop them")
      ->excludes(replica_option)
      ->check(CLI::Range(1, 16));
  app.add_option("--pmirrord", o.daemon_path, "pmirrord binary for --spawn-targets")
      ->capture_default_str();
  app.add_option("--dir", o.data_dir,
                 "spawn mode: where volume files, state pools and logs go (/dev/shm keeps msync "
                 "off the disk)")
      ->capture_default_str();
  app.add_option("--target-volume", o.target_volumes,
                 "spawn mode: the next target serves its volume from PATH (e.g. a devdax device "
                 "such as /dev/dax1.0, for APM over rdma) instead of a file under --dir; "
                 "repeat for the second target and on");
  app.add_option("--native-persistence", o.native_persistence,
                 "spawn mode: the volume's native_persistence on the targets (auto|flush|off)")
      ->check(CLI::IsMember({"auto", "flush", "off"}));
  app.add_option("--target-metadata-dir", o.target_metadata_dir,
                 "spawn mode: keep the targets' metadata pools in DIR (pmem: one-sided commit)");
  app.add_flag("--keep", o.keep, "spawn mode: keep the work folder (configs, logs, volumes)");
  app.add_option("--sizes", o.size_args, "record sizes (e.g. 64,4KiB)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--depths", o.depths, "persists in flight (1 = synchronous persist())")
      ->delimiter(',')
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_option("--writers", o.writers,
                 "application threads persisting at once, each at every --depths (e.g. 1,4)")
      ->delimiter(',')
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  app.add_option("--replicas-list", o.replica_counts,
                 "replica counts to measure, each using the first K targets (default 1,2 capped "
                 "at the targets available)")
      ->delimiter(',')
      ->check(CLI::Range(size_t{1}, size_t{16}));
  app.add_option("--iterations", o.iterations_override,
                 "measured persists per cell (default: 10000 up to 4 KiB, 5000 up to 16 KiB, 3000 "
                 "above)");
  app.add_option("--warmup", o.warmup, "unmeasured persists before each cell")
      ->capture_default_str();
  app.add_option("--json", o.json_path, "also write the results as JSON to FILE");
  app.add_option("--scenario", o.scenario,
                 "matrix: persist latency/throughput matrix; resync: full-resync throughput and "
                 "depth-1 persist latency while it runs (first target only)")
      ->check(CLI::IsMember({"matrix", "resync"}))
      ->capture_default_str();
  app.add_option("--resync-rates", o.resync_rate_args,
                 "resync scenario: VolumeOptions::resync_rate of each pass (unlimited, 200MiB/s)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--chunk-size", o.chunk_text, "resync scenario: bytes per dirty bit")
      ->capture_default_str();
  app.add_option("--resync-step", o.resync_step_text, "resync scenario: bytes copied per step")
      ->capture_default_str();
  app.add_option("--latency-size", o.latency_size_text,
                 "resync scenario: size of the depth-1 persists timed with and without a resync")
      ->capture_default_str();
  app.add_flag("--skip-idle", o.skip_idle, "resync scenario: no resync without persists");
  app.add_flag("--skip-reference", o.skip_reference,
               "resync scenario: do not write the volume with --resync-step persists as a "
               "reference (the 64 KiB x 32 prefill is always timed)");
  app.add_option("--connect-timeout", o.connect_timeout_text,
                 "resync scenario: VolumeOptions::connect_timeout (e.g. 30s under TCG)")
      ->capture_default_str();
  app.add_flag("--verbose", o.verbose,
               "resync scenario: keep libpmirror's info log (state changes) on stdout");
}

Status usage_error(const std::string& what) { return Status(Errc::kInvalidArgument, what); }

// What the matrix needs from the command line, checked: the volume's size,
// the record sizes, the deepest window. Fills in the default replica counts.
struct MatrixPlan {
  uint64_t volume_size = 0;
  std::vector<uint64_t> sizes;
  uint32_t max_depth = 1;
};

Result<MatrixPlan> check_options(BenchOptions& o) {
  MatrixPlan plan;
  auto kind = transport::parse_kind(o.transport_name);
  if (!kind.ok()) return usage_error("--transport: " + kind.status().message());
  auto volume_size = config::parse_size(o.size_text);
  if (!volume_size.ok()) return usage_error("--size: " + volume_size.status().message());
  plan.volume_size = *volume_size;
  if (o.poll_name != "busy" && o.poll_name != "adaptive" && o.poll_name != "event") {
    return usage_error("--poll: busy, adaptive or event");
  }
  if (o.method_name != "auto" && o.method_name != "gpspm") {
    return usage_error("--method: auto or gpspm");
  }
  for (const auto& text : o.size_args) {
    auto size = config::parse_size(text);
    if (!size.ok() || *size == 0) return usage_error("--sizes " + text + ": not a size");
    plan.sizes.push_back(*size);
  }
  plan.max_depth = *std::max_element(o.depths.begin(), o.depths.end());
  const uint64_t most_in_flight =
      uint64_t{plan.max_depth} * *std::max_element(o.writers.begin(), o.writers.end());
  for (uint64_t size : plan.sizes) {
    if (plan.volume_size / size < 2 * most_in_flight) {
      return usage_error("--size " + o.size_text + " holds too few records of " + size_label(size) +
                         " for " + std::to_string(most_in_flight) + " in flight");
    }
  }
  if (!o.spawning() && o.replica_args.empty()) {
    return usage_error(
        "give --spawn-targets N (self-contained) or --replica HOST:PORT (running "
        "targets); see --help");
  }
  if (!o.replica_args.empty() && (o.secret.empty() || o.local_path.empty())) {
    return usage_error("--replica needs --secret and --local");
  }
  const size_t available =
      o.spawning() ? static_cast<size_t>(o.spawn_targets) : o.replica_args.size();
  if (!o.spawning() && !o.target_volumes.empty()) {
    return usage_error("--target-volume is for --spawn-targets: a running --replica target "
                       "serves the volume its own cluster file names");
  }
  if (o.target_volumes.size() > available) {
    return usage_error(std::to_string(o.target_volumes.size()) + " --target-volume paths for " +
                       std::to_string(o.spawn_targets) +
                       " spawned target(s): give at most one per --spawn-targets");
  }
  if (o.replica_counts.empty()) {
    for (size_t k = 1; k <= std::min<size_t>(2, available); ++k) o.replica_counts.push_back(k);
  }
  for (size_t k : o.replica_counts) {
    if (k > available) {
      return usage_error("--replicas-list asks for " + std::to_string(k) + " replicas but only " +
                         std::to_string(available) + " target(s) are available");
    }
  }
  return plan;
}

// ----------------------------------------------------------------- targets

// The targets measured: pmirrord processes spawned into a work folder under
// --dir (removed at the end unless --keep), or the --replica endpoints.
class Targets {
 public:
  explicit Targets(bool keep) : keep_(keep) {}
  ~Targets() {
    spawned_.clear();  // stop the daemons before their folder goes
    if (work_dir_.empty()) return;
    if (keep_) {
      std::printf("kept %s\n", work_dir_.c_str());
      return;
    }
    std::error_code ignored;
    std::filesystem::remove_all(work_dir_, ignored);
  }
  Targets(const Targets&) = delete;
  Targets& operator=(const Targets&) = delete;

  // Spawn mode sets the options' secret (random) and, when not given,
  // the local copy's path (in the work folder).
  Status set_up(BenchOptions& o, uint64_t volume_size) {
    if (!o.spawning()) {
      for (const auto& text : o.replica_args) {
        PMIRROR_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(text));
        endpoints_.push_back(endpoint);
      }
      return Status::Ok();
    }
    if (::access(o.daemon_path.c_str(), X_OK) != 0) {
      return usage_error("--pmirrord " + o.daemon_path + ": not an executable");
    }
    std::string pattern = o.data_dir + "/pmirror-bench.XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr) {
      return Status(Errc::kIoError, "cannot create a work folder under --dir " + o.data_dir + ": " +
                                        strerror(errno));
    }
    work_dir_ = buffer.data();
    o.secret = random_secret();
    if (o.local_path.empty()) o.local_path = work_dir_ + "/local.img";
    for (int i = 0; i < o.spawn_targets; ++i) {
      spawned_.push_back(std::make_unique<SpawnedTarget>(o.daemon_path,
                                                         work_dir_ + "/target" + std::to_string(i),
                                                         o.address, o.transport_name, o.poll_name));
      if (static_cast<size_t>(i) < o.target_volumes.size()) {
        spawned_.back()->set_volume_path(o.target_volumes[i]);
      }
      spawned_.back()->set_native_persistence(o.native_persistence);
      spawned_.back()->set_metadata_dir(o.target_metadata_dir);
      Status started = spawned_.back()->start(o.volume_name, volume_size, o.identity, o.secret);
      if (!started.ok()) {
        return Status(started.code(),
                      "starting target " + std::to_string(i) + ": " + started.message());
      }
      PMIRROR_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(spawned_.back()->endpoint()));
      endpoints_.push_back(endpoint);
    }
    return Status::Ok();
  }

  const std::vector<Endpoint>& endpoints() const { return endpoints_; }
  const std::string& work_dir() const { return work_dir_; }
  // The first `count` spawned daemons (spawn mode; empty otherwise).
  std::vector<pid_t> daemon_pids(size_t count) const {
    std::vector<pid_t> pids;
    for (size_t i = 0; i < spawned_.size() && i < count; ++i) pids.push_back(spawned_[i]->pid());
    return pids;
  }

 private:
  bool keep_;
  std::string work_dir_;
  std::vector<std::unique_ptr<SpawnedTarget>> spawned_;
  std::vector<Endpoint> endpoints_;
};

int fail(const std::string& what) {
  std::fprintf(stderr, "pmirror-bench: %s\n", what.c_str());
  return 1;
}

Status write_json_file(const std::string& path, const Json& out) {
  std::ofstream file(path);
  file << out.dump(2) << "\n";
  if (!file) return Status(Errc::kIoError, "cannot write --json " + path);
  std::printf("wrote %s\n", path.c_str());
  return Status::Ok();
}

// What the run says about where it ran, printed and in the JSON.
struct RunContext {
  Json facts;
  std::string load_before;
};

// ----------------------------------------------------------- the scenarios

// --scenario resync (first target only).
int run_resync_main(const BenchOptions& o, uint64_t volume_size, const Targets& targets,
                    const RunContext& run) {
  // libpmirror logs every state change at info; keep the table readable.
  if (!o.verbose) log::set_level(spdlog::level::warn);
  ResyncSettings settings;
  for (const auto& text : o.resync_rate_args) {
    std::string t = text;
    if (t != "unlimited" && t != "0" && (t.size() < 2 || t.substr(t.size() - 2) != "/s")) {
      t += "/s";
    }
    auto rate = config::parse_rate(t);
    if (!rate.ok()) return fail("--resync-rates: " + rate.status().message());
    settings.rates.push_back(*rate);
  }
  auto chunk = config::parse_size(o.chunk_text);
  auto step = config::parse_size(o.resync_step_text);
  auto record = config::parse_size(o.latency_size_text);
  if (!chunk.ok()) return fail("--chunk-size: " + chunk.status().message());
  if (!step.ok() || *step == 0) return fail("--resync-step: not a size");
  if (!record.ok() || *record == 0 || *record > volume_size / 2) {
    return fail("--latency-size: not a size, or too large for the volume");
  }
  const Endpoint& first = targets.endpoints()[0];
  VolumeOptions& v = settings.base;
  v.name = o.volume_name;
  v.local_path = o.local_path;
  v.size = volume_size;
  v.create = true;
  v.identity = o.identity;
  v.method = o.method();
  v.poll = o.poll();
  v.max_in_flight = 32;
  v.chunk_size = *chunk;
  v.resync_step = *step;
  v.replicas.push_back({first.host, first.port, o.transport_name, o.secret, ""});
  auto connect_timeout = config::parse_duration(o.connect_timeout_text);
  if (!connect_timeout.ok() || connect_timeout->count() == 0) {
    return fail("--connect-timeout: a duration such as 5s");
  }
  v.connect_timeout = *connect_timeout;
  settings.record = *record;
  settings.warmup = o.warmup;
  settings.iterations = o.iterations_override.value_or(5000);
  settings.idle = !o.skip_idle;
  settings.reference = !o.skip_reference;
  const std::string peer = first.host + ":" + std::to_string(first.port);
  std::string fs = filesystem_of(o.spawning() ? targets.work_dir() : volume_dir_of(o.local_path));
  std::printf(
      "pmirror-bench --scenario resync: %s, target %s (%s), volume %s, local copy %s (%s)\n",
      o.transport_name.c_str(), peer.c_str(), o.spawning() ? "spawned" : "given",
      o.size_text.c_str(), o.local_path.c_str(), fs.c_str());
  std::printf("chunk %s, resync step %s, full resyncs; persists: %s at depth 1\n",
              size_label(*chunk).c_str(), size_label(*step).c_str(), size_label(*record).c_str());
  std::printf("machine: %s, %s, %s cores; load %s\n",
              run.facts["cpu_model"].get<std::string>().c_str(),
              run.facts["kernel"].get<std::string>().c_str(),
              std::to_string(run.facts["nproc"].get<unsigned>()).c_str(), run.load_before.c_str());
  std::printf(
      "copied/seconds/MiB/s: the resync, from Volume::resync() until status_json() counts it "
      "done; lib MiB/s: its own rate_bytes_per_s; latency in microseconds\n\n");
  auto results = run_resync_scenario(settings, peer);
  if (!results.ok()) return fail(results.status().message());
  std::string load_after = load_average();
  std::printf("target method: %s; load average before %s, after %s\n", results->method.c_str(),
              run.load_before.c_str(), load_after.c_str());
  if (o.json_path.empty()) return 0;
  Json out = resync_json(*results);
  out["machine"] = run.facts;
  out["machine"]["load_average_before"] = run.load_before;
  out["machine"]["load_average_after"] = load_after;
  out["setup"] = Json{{"scenario", "resync"},
                      {"transport", o.transport_name},
                      {"mode", o.spawning() ? "spawn" : "replica"},
                      {"target", peer},
                      {"target_volume", o.target_volumes.empty() ? "" : o.target_volumes[0]},
                      {"data_dir", o.spawning() ? o.data_dir : volume_dir_of(o.local_path)},
                      {"data_fs", fs},
                      {"volume_size", volume_size},
                      {"chunk_size", *chunk},
                      {"resync_step", *step},
                      {"latency_size", *record},
                      {"warmup", o.warmup},
                      {"iterations", settings.iterations}};
  Status written = write_json_file(o.json_path, out);
  return written.ok() ? 0 : fail(written.message());
}

// The matrix's results, for the JSON.
struct MatrixResults {
  std::map<uint64_t, PingPong> ping_pongs;
  std::vector<Cell> cells;
  Json methods = Json::array();
};

Json matrix_json(const BenchOptions& o, const MatrixPlan& plan, const Targets& targets,
                 const RunContext& run, const std::string& load_after,
                 const std::string& volume_dir, const std::string& fs, MatrixResults& r) {
  Json out;
  out["machine"] = run.facts;
  out["machine"]["load_average_before"] = run.load_before;
  out["machine"]["load_average_after"] = load_after;
  out["setup"] = Json{{"transport", o.transport_name},
                      {"mode", o.spawning() ? "spawn" : "replica"},
                      {"targets", targets.endpoints().size()},
                      {"address", o.spawning() ? o.address : ""},
                      {"data_dir", o.spawning() ? o.data_dir : volume_dir},
                      {"data_fs", fs},
                      {"volume_size", plan.volume_size},
                      {"warmup", o.warmup},
                      {"methods", r.methods}};
  out["ping_pong"] = Json::array();
  for (const auto& [size, pp] : r.ping_pongs) {
    Json row = summary_json(pp.rtt);
    row["size"] = size;
    row["round_trips_per_s"] = pp.rtt.count / pp.seconds;
    out["ping_pong"].push_back(row);
  }
  out["persist"] = Json::array();
  for (const auto& cell : r.cells) {
    const Summary& rtt = r.ping_pongs[cell.size].rtt;
    Json row = summary_json(cell.latency);
    row["size"] = cell.size;
    row["replicas"] = cell.replicas;
    row["depth"] = cell.depth;
    row["writers"] = cell.writers;
    row["api"] = cell.depth == 1 ? "persist" : "persist_async";
    row["seconds"] = cell.seconds;
    row["persists_per_s"] = cell.persists_per_second();
    row["mib_per_s"] = cell.mib_per_second();
    if (cell.target_cpu_us_per_persist >= 0) {
      row["target_cpu_us_per_persist"] = cell.target_cpu_us_per_persist;
      row["target_switches_per_persist"] = cell.target_switches_per_persist;
    }
    row["tcp_rtt_p50_us"] = rtt.p50;
    row["p50_over_tcp_rtt_p50"] = rtt.p50 > 0 ? cell.latency.p50 / rtt.p50 : 0.0;
    out["persist"].push_back(row);
  }
  return out;
}

// "16", or "4x1" for 4 writer threads at depth 1 each.
std::string depth_label(uint32_t depth, uint32_t writers) {
  return writers == 1 ? std::to_string(depth)
                      : std::to_string(writers) + "x" + std::to_string(depth);
}

// --scenario matrix: sizes x replica counts x depths, next to a TCP
// ping-pong of each size.
int run_matrix_main(const BenchOptions& o, const MatrixPlan& plan, const Targets& targets,
                    const RunContext& run) {
  const auto& endpoints = targets.endpoints();
  std::string volume_dir = std::filesystem::path(o.local_path).parent_path().string();
  if (volume_dir.empty()) volume_dir = ".";
  std::string fs = filesystem_of(o.spawning() ? targets.work_dir() : volume_dir);
  std::printf("pmirror-bench: %s, %zu target(s) %s, volume %s (%s)\n", o.transport_name.c_str(),
              endpoints.size(), o.spawning() ? ("spawned on " + o.address).c_str() : "given",
              o.size_text.c_str(),
              o.spawning() ? ("files in " + o.data_dir + ", " + fs).c_str()
                           : ("local copy " + o.local_path + ", " + fs).c_str());
  std::printf("machine: %s, %s, %s cores\n", run.facts["cpu_model"].get<std::string>().c_str(),
              run.facts["kernel"].get<std::string>().c_str(),
              std::to_string(run.facts["nproc"].get<unsigned>()).c_str());
  std::printf(
      "latency in microseconds; depth 1 = persist(), depth D = persist_async() with D "
      "in flight, WxD = W writer threads at depth D each\n\n");

  MatrixResults r;
  uint64_t counter = 0;
  const int kWidth = 118;
  std::printf("%9s %4s %5s %6s %9s %9s %9s %9s %10s %9s %10s %7s\n", "size", "repl", "depth",
              "iters", "p50", "p99", "p99.9", "max", "persists/s", "MiB/s", "tcp rtt50", "x rtt");
  print_rule(kWidth);
  for (size_t replicas : o.replica_counts) {
    VolumeOptions options;
    options.name = o.volume_name;
    options.local_path = o.local_path;
    options.size = plan.volume_size;
    options.create = true;
    options.identity = o.identity;
    options.method = o.method();
    options.poll = o.poll();
    options.max_in_flight = plan.max_depth * *std::max_element(o.writers.begin(), o.writers.end());
    for (size_t i = 0; i < replicas; ++i) {
      options.replicas.push_back(
          {endpoints[i].host, endpoints[i].port, o.transport_name, o.secret, ""});
    }
    // A target releases the previous run's writer claim once it has seen
    // that session end, which may be a moment after our Volume closed it.
    auto volume = open_with_retry(options);
    if (!volume.ok()) return fail(volume.status().message());
    for (const auto& replica : (*volume)->replicas()) {
      r.methods.push_back(
          Json{{"replicas", replicas}, {"target", replica.address}, {"method", replica.method}});
    }
    Status filled = prefill(**volume);
    if (!filled.ok()) return fail(filled.message());
    for (uint64_t size : plan.sizes) {
      uint64_t iterations = o.iterations_override.value_or(default_iterations(size));
      if (!r.ping_pongs.contains(size)) {
        PingPong pp;
        auto rtt = tcp_ping_pong(size, o.warmup, iterations, pp.seconds);
        if (!rtt.ok()) return fail(rtt.status().message());
        pp.rtt = *rtt;
        r.ping_pongs[size] = pp;
        std::printf("%9s %4s %5s %6llu %9.1f %9.1f %9.1f %9.1f %10.0f %9.1f %10s %7s\n",
                    size_label(size).c_str(), "tcp", "1",
                    static_cast<unsigned long long>(iterations), pp.rtt.p50, pp.rtt.p99,
                    pp.rtt.p999, pp.rtt.max, pp.rtt.count / pp.seconds,
                    pp.rtt.count / pp.seconds * static_cast<double>(size) / (1024.0 * 1024.0),
                    "(ping-pong)", "");
      }
      for (uint32_t writers : o.writers)
        for (uint32_t depth : o.depths) {
          const std::vector<pid_t> pids = targets.daemon_pids(replicas);
          const DaemonCost cost_before = daemon_cost(pids);
          auto cell =
              run_cell(**volume, replicas, size, depth, writers, o.warmup, iterations, counter);
          if (!cell.ok()) return fail(cell.status().message());
          if (!pids.empty()) {
            const DaemonCost cost_after = daemon_cost(pids);
            const double persists = static_cast<double>(cell->latency.count + o.warmup * writers);
            cell->target_cpu_us_per_persist = (cost_after.cpu_us - cost_before.cpu_us) / persists;
            cell->target_switches_per_persist =
                static_cast<double>(cost_after.switches - cost_before.switches) / persists;
          }
          const PingPong& pp = r.ping_pongs[size];
          // The ratio is shown for depth 1 only: deeper windows add queueing
          // to each op's latency by design (the JSON has it for every cell).
          char ratio[16] = "-";
          if (depth == 1 && writers == 1 && pp.rtt.p50 > 0) {
            std::snprintf(ratio, sizeof ratio, "%.2f", cell->latency.p50 / pp.rtt.p50);
          }
          std::printf("%9s %4zu %5s %6llu %9.1f %9.1f %9.1f %9.1f %10.0f %9.1f %10.1f %7s\n",
                      size_label(size).c_str(), replicas, depth_label(depth, writers).c_str(),
                      static_cast<unsigned long long>(iterations), cell->latency.p50,
                      cell->latency.p99, cell->latency.p999, cell->latency.max,
                      cell->persists_per_second(), cell->mib_per_second(), pp.rtt.p50, ratio);
          if (cell->target_cpu_us_per_persist >= 0) {
            std::printf("%9s target pmirrord: %.2f us CPU and %.3f context switches per persist\n",
                        "", cell->target_cpu_us_per_persist, cell->target_switches_per_persist);
          }
          std::fflush(stdout);
          r.cells.push_back(*cell);
        }
    }
    print_rule(kWidth);
  }
  for (const auto& m : r.methods) {
    std::printf("replicas=%d: %s uses %s\n", m["replicas"].get<int>(),
                m["target"].get<std::string>().c_str(), m["method"].get<std::string>().c_str());
  }
  std::printf(
      "tcp rtt50 = p50 round trip of a TCP ping-pong of the same size (127.0.0.1, TCP_NODELAY)\n"
      "x rtt = persist p50 / tcp rtt50 (depth 1 only)\n");
  std::string load_after = load_average();
  std::printf("load average before %s, after %s (other work on the machine skews the tails)\n",
              run.load_before.c_str(), load_after.c_str());
  if (o.json_path.empty()) return 0;
  Status written = write_json_file(
      o.json_path, matrix_json(o, plan, targets, run, load_after, volume_dir, fs, r));
  return written.ok() ? 0 : fail(written.message());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "pmirror-bench: persist latency and throughput of libpmirror over sizes x replicas x "
      "persists in flight, next to a plain TCP ping-pong of the same sizes"};
  BenchOptions options;
  add_options(app, options);
  CLI11_PARSE(app, argc, argv);
  auto plan = check_options(options);
  if (!plan.ok()) return fail(plan.status().message());

  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::signal(SIGPIPE, SIG_IGN);

  Targets targets(options.keep);
  if (Status ready = targets.set_up(options, plan->volume_size); !ready.ok()) {
    return fail(ready.message());
  }
  const RunContext run{machine_facts(), load_average()};
  if (options.scenario == "resync") {
    return run_resync_main(options, plan->volume_size, targets, run);
  }
  return run_matrix_main(options, *plan, targets, run);
}
