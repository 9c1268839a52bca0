// The control socket: server, client, socket paths.
#include "control/control.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/log.h"
#include "common/log_limit.h"
#include "common/thread_name.h"
#include "common/unique_fd.h"

namespace pmirror::control {

namespace {

using json = nlohmann::json;

std::string dump_line(const json& value) {
  // Invalid UTF-8 in a string must not throw: replace it.
  std::string line = value.dump(-1, ' ', false, json::error_handler_t::replace);
  line += '\n';
  return line;
}

json error_reply(const Status& status) {
  return json{
      {"ok", false},
      {"error", {{"code", std::string(errc_name(status.code()))}, {"message", status.message()}}}};
}

// "pmirrord" for /run/pmirror/pmirrord.sock, "initiator-42" for ...-42.sock.
std::string socket_owner_name(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".sock")) name.resize(name.size() - 5);
  return name;
}

std::string process_name(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  if (!std::getline(comm, name) || name.empty()) return "process";
  return name;
}

Result<sockaddr_un> make_address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return Result<sockaddr_un>(Errc::kInvalidArgument,
                               "control socket path '" + path + "' must be 1 to " +
                                   std::to_string(sizeof(address.sun_path) - 1) + " bytes");
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

// Writes all of `data`; false if the peer is gone or shut down, or (with a
// deadline) has not taken it in time.
bool send_all(int fd, std::string_view data,
              std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt) {
  while (!data.empty()) {
    int flags = MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0);
    ssize_t n = ::send(fd, data.data(), data.size(), flags);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        int wait_ms = -1;
        if (deadline) {
          auto left = std::chrono::ceil<std::chrono::milliseconds>(
              *deadline - std::chrono::steady_clock::now());
          if (left.count() <= 0) return false;
          wait_ms = static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX));
        }
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, wait_ms) < 0 && errno != EINTR) return false;
        continue;
      }
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// mkdir -p with mode 0755 for each missing component.
Status make_parent_dirs(const std::string& socket_path) {
  size_t slash = socket_path.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return Status::Ok();
  std::string dir = socket_path.substr(0, slash);
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return errno_status(errno == EACCES ? Errc::kPermissionDenied : Errc::kIoError,
                          "cannot create directory " + prefix + " for the control socket", errno);
    }
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status(Errc::kInvalidArgument,
                  dir + " is not a directory: choose another control socket path");
  }
  return Status::Ok();
}

// Connects to `path` with a deadline; the errors are the documented ones.
Result<UniqueFd> connect_to(const std::string& path, std::chrono::milliseconds timeout) {
  PMIRROR_ASSIGN_OR_RETURN(sockaddr_un address, make_address(path));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) {
      return Result<UniqueFd>(
          Errc::kNotFound, socket_owner_name(path) + " is not running (no socket at " + path + ")");
    }
    if (err == EACCES) {
      return Result<UniqueFd>(Errc::kPermissionDenied,
                              "permission denied on " + path + ": run as root");
    }
    return errno_status(Errc::kIoError, "cannot stat " + path, err);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return Result<UniqueFd>(Errc::kInvalidArgument, path + " is not a socket: is --socket right?");
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errno_status(Errc::kIoError, "socket(AF_UNIX)", errno);
  // A full backlog makes a non-blocking AF_UNIX connect fail with EAGAIN,
  // and nothing is in progress then: try again until the deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int rc;
  while ((rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address))) !=
             0 &&
         (errno == EAGAIN || errno == EINTR)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return Result<UniqueFd>(Errc::kTimeout, "no answer from " + path + " within " +
                                                  std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (rc != 0) {
    int err = errno;
    switch (err) {
      case ECONNREFUSED:
        return Result<UniqueFd>(
            Errc::kConnectionError,
            "stale socket " + path + ": nothing is listening (" + socket_owner_name(path) +
                " exited without removing it; it is replaced when it starts again)");
      case EACCES:
      case EPERM:
        return Result<UniqueFd>(Errc::kPermissionDenied,
                                "permission denied on " + path + ": run as root");
      case ENOENT:
        return Result<UniqueFd>(Errc::kNotFound, socket_owner_name(path) +
                                                     " is not running (no socket at " + path + ")");
      default:
        return errno_status(Errc::kConnectionError, "cannot connect to " + path, err);
    }
  }
  return fd;
}

// Reads one line (without '\n') into `line`, keeping what follows in
// `buffer`. Errors: kClosed on EOF, kTimeout, kResourceExhausted if longer
// than `limit`. `stop` (if set) is checked every 200 ms.
Status read_line(int fd, std::string& buffer, std::string& line, size_t limit,
                 std::optional<std::chrono::steady_clock::time_point> deadline,
                 const std::string& path, const std::stop_token* stop = nullptr) {
  for (;;) {
    size_t newline = buffer.find('\n');
    if (newline != std::string::npos) {
      line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      return Status::Ok();
    }
    if (buffer.size() > limit) {
      return Status(Errc::kResourceExhausted,
                    "a line from " + path + " exceeds " + std::to_string(limit) + " bytes");
    }
    int wait_ms = 200;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          *deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return Status(Errc::kTimeout, "no answer from " + path + " in time");
      wait_ms = static_cast<int>(std::min<int64_t>(left.count(), 200));
    }
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, wait_ms);
    if (ready < 0 && errno != EINTR) return errno_status(Errc::kIoError, "poll " + path, errno);
    if (stop != nullptr && stop->stop_requested()) return Status(Errc::kClosed, "stopped");
    if (ready <= 0) continue;
    char chunk[8192];
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno_status(Errc::kConnectionError, "reading from " + path, errno);
    }
    if (n == 0) return Status(Errc::kClosed, path + " closed the connection");
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

Result<json> parse_reply(const std::string& line, const std::string& path) {
  json reply = json::parse(line, nullptr, false);
  if (reply.is_discarded() || !reply.is_object() || !reply.contains("ok") ||
      !reply["ok"].is_boolean()) {
    return Result<json>(Errc::kProtocolError,
                        path + " answered something that is not a control reply");
  }
  if (reply["ok"].get<bool>()) return reply.value("result", json());
  const json& error = reply.contains("error") ? reply["error"] : json::object();
  // A member of another type is no answer (json's value() would throw).
  auto text = [&](const char* key) {
    const json field = error.is_object() ? error.value(key, json()) : json();
    return field.is_string() ? field.get<std::string>() : std::string();
  };
  std::string code = text("code");
  std::string message = text("message");
  if (message.empty()) message = "request failed";
  return Result<json>(errc_from_name(code), message);
}

}  // namespace

// ---- paths -------------------------------------------------------------

std::string promoter_socket_path(const std::string& daemon_socket) {
  std::string path = daemon_socket;
  if (path.size() > 5 && path.ends_with(".sock")) path.resize(path.size() - 5);
  return path + ".promoter.sock";
}

std::string runtime_dir() {
  const char* env = std::getenv("PMIRROR_RUNTIME_DIR");
  if (env != nullptr && *env != '\0') return env;
  return "/run/pmirror";
}

std::string daemon_socket_path(const std::string& dir) { return dir + "/pmirrord.sock"; }

std::string initiator_socket_path(pid_t pid, const std::string& dir) {
  return dir + "/initiator-" + std::to_string(pid) + ".sock";
}

LocalPrimaries::LocalPrimaries(std::string dir) : dir_(std::move(dir)) {}

LocalPrimaries::~LocalPrimaries() {
  // The claims end with this process: their files go with them (another
  // pmirrord makes its own when it takes an application over).
  for (const auto& [socket, claim] : claims_) ::unlink(claim.lock_path.c_str());
}

void LocalPrimaries::sweep_stale_claims(const std::vector<InitiatorSocket>& sockets) {
  // A claim file whose application is gone and whose holder died (kill -9
  // leaves it): nobody else removes it, so the first pmirrord to find it
  // unheld does.
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir_.c_str()), ::closedir);
  if (!handle) return;
  constexpr std::string_view kPrefix = "initiator-", kSuffix = ".metrics-owner";
  while (dirent* entry = ::readdir(handle.get())) {
    std::string_view name = entry->d_name;
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    std::string pid(name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size()));
    std::string socket_path = dir_ + "/initiator-" + pid + ".sock";
    bool live = std::any_of(sockets.begin(), sockets.end(),
                            [&](const InitiatorSocket& s) { return s.path == socket_path; });
    if (live || claims_.count(socket_path) != 0) continue;
    std::string path = dir_ + "/" + std::string(name);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
    if (fd.get() < 0) continue;
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) ::unlink(path.c_str());  // unheld: stale
  }
}

bool LocalPrimaries::owns(const InitiatorSocket& socket) {
  if (claims_.count(socket.path) != 0) return true;
  // The claim is a lock on a file beside the application's socket: held by
  // one process at a time, released when that process exits.
  std::string path = dir_ + "/initiator-" + std::to_string(socket.pid) + ".metrics-owner";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) {
    // No claim can be made here (a read-only directory): export the
    // application rather than lose it (two such pmirrords both would).
    log::debug("metrics: cannot create {}: {}; exporting pid {} unclaimed", path,
               std::strerror(errno), socket.pid);
    return true;
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;  // another pmirrord has it
  claims_.emplace(socket.path, Claim{path, std::move(fd)});
  return true;
}

nlohmann::json LocalPrimaries::add_to(nlohmann::json status, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  auto sockets = list_initiator_sockets(dir_);
  if (!sockets.ok()) return status;
  // Applications that went away: their claims go too (the lock file with
  // them, while this process still holds it).
  for (auto it = claims_.begin(); it != claims_.end();) {
    bool listed = std::any_of(sockets->begin(), sockets->end(),
                              [&](const InitiatorSocket& s) { return s.path == it->first; });
    if (!listed) {
      ::unlink(it->second.lock_path.c_str());
      it = claims_.erase(it);
    } else {
      ++it;
    }
  }
  sweep_stale_claims(*sockets);
  if (sockets->empty() || !status.is_object()) return status;
  nlohmann::json& volumes = status["volumes"];
  if (!volumes.is_array()) volumes = nlohmann::json::array();
  const nlohmann::json ask = {{"command", "status"}};
  for (const InitiatorSocket& socket : *sockets) {
    if (!owns(socket)) continue;  // another pmirrord on this host exports it
    auto answer = request(socket.path, ask, timeout);
    if (!answer.ok() || !answer->is_object()) continue;
    auto theirs = answer->find("volumes");
    if (theirs == answer->end() || !theirs->is_array()) continue;
    for (nlohmann::json& volume : *theirs) {
      if (volume.is_object() && volume.value("role", json()) == "primary") {
        volumes.push_back(std::move(volume));
      }
    }
  }
  return status;
}

Result<std::vector<InitiatorSocket>> list_initiator_sockets(const std::string& dir) {
  std::vector<InitiatorSocket> sockets;
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir.c_str()), ::closedir);
  if (!handle) {
    int err = errno;
    if (err == ENOENT) return sockets;
    if (err == EACCES) {
      return Result<std::vector<InitiatorSocket>>(Errc::kPermissionDenied,
                                                  "permission denied on " + dir + ": run as root");
    }
    return errno_status(Errc::kIoError, "cannot list " + dir, err);
  }
  while (dirent* entry = ::readdir(handle.get())) {
    std::string_view name = entry->d_name;
    constexpr std::string_view kPrefix = "initiator-", kSuffix = ".sock";
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    std::string_view digits =
        name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    pid_t pid = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (ec != std::errc() || end != digits.data() + digits.size() || pid <= 0) continue;
    sockets.push_back({pid, dir + "/" + std::string(name)});
  }
  std::sort(sockets.begin(), sockets.end(),
            [](const InitiatorSocket& a, const InitiatorSocket& b) { return a.pid < b.pid; });
  return sockets;
}

Result<bool> remove_if_stale(const InitiatorSocket& socket) {
  // A pid that exists (even another user's: EPERM) may be the owner.
  if (::kill(socket.pid, 0) == 0 || errno != ESRCH) return false;
  auto connected = connect_to(socket.path, std::chrono::milliseconds(100));
  if (connected.ok() || connected.status().code() != Errc::kConnectionError ||
      connected.status().message().rfind("stale socket", 0) != 0) {
    return false;  // something answers, or it is not a socket we know how to judge
  }
  if (::unlink(socket.path.c_str()) != 0) {
    int err = errno;
    if (err == ENOENT) return true;  // another pmirrorctl was quicker
    if (err == EACCES || err == EPERM) {
      return Status(Errc::kPermissionDenied, "cannot remove stale socket " + socket.path +
                                                 ": permission denied (run as root)");
    }
    return errno_status(Errc::kIoError, "cannot remove stale socket " + socket.path, err);
  }
  return true;
}

Status unknown_command(const nlohmann::json& request) {
  std::string command =
      request.is_object() && request.contains("command") && request["command"].is_string()
          ? request["command"].get<std::string>()
          : std::string();
  return Status(Errc::kInvalidArgument, "unknown command '" + command + "'");
}

std::string answer_request(const std::string& line, const Handler& handler) {
  json request = json::parse(line, nullptr, false);
  if (request.is_discarded()) {
    return dump_line(error_reply(Status(Errc::kInvalidArgument,
                                        "request is not JSON: send one object per line, e.g. "
                                        "{\"command\":\"status\"}")));
  }
  if (!request.is_object() || !request.contains("command") || !request["command"].is_string()) {
    return dump_line(error_reply(Status(Errc::kInvalidArgument,
                                        "request must be an object with a string \"command\", "
                                        "e.g. {\"command\":\"status\"}")));
  }
  try {
    Result<json> result = handler(request);
    if (!result.ok()) return dump_line(error_reply(result.status()));
    return dump_line(json{{"ok", true}, {"result", std::move(result).value()}});
  } catch (const std::exception& e) {
    return dump_line(error_reply(Status(Errc::kInternal, std::string("handling '") +
                                                             request["command"].get<std::string>() +
                                                             "' failed: " + e.what())));
  }
}

Errc errc_from_name(std::string_view name) {
  for (uint16_t code = 0; code <= static_cast<uint16_t>(Errc::kFenced); ++code) {
    if (errc_name(static_cast<Errc>(code)) == name) return static_cast<Errc>(code);
  }
  return Errc::kInternal;
}

// ---- server ------------------------------------------------------------

class Server::Impl {
 public:
  struct Subscriber {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::string> queue;
    uint64_t dropped = 0;
    bool closed = false;
  };

  // A connection waits for a request (idle), handles one (busy), streams
  // events (subscriber), or was closed to make room (evicted). Only the
  // accept loop evicts, and only an idle one (compare-and-swap, against
  // the connection's own thread taking a request).
  enum State : int { kIdle, kBusy, kSubscriber, kEvicted };

  struct Connection {
    UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<int> state{kIdle};
  };

  Impl(std::string path, Handler handler, const ServerOptions& options, UniqueFd listen_fd,
       UniqueFd wake_read, UniqueFd wake_write, dev_t dev, ino_t ino)
      : path_(std::move(path)),
        handler_(std::move(handler)),
        options_(options),
        listen_fd_(std::move(listen_fd)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)),
        dev_(dev),
        ino_(ino) {}

  ~Impl() { stop(); }

  Status start() {
    spare_.reset();
    spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    try {
      accept_thread_ = std::thread([this] {
        name_this_thread("control-accept");
        accept_loop();
      });
    } catch (const std::system_error& e) {
      return Status(Errc::kResourceExhausted,
                    "control socket " + path_ + ": cannot start its thread: " + e.what());
    }
    return Status::Ok();
  }

  void stop() {
    if (stopping_.exchange(true)) return;
    char byte = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), &byte, 1);
    if (accept_thread_.joinable()) accept_thread_.join();
    {
      std::lock_guard lock(subscribers_mutex_);
      for (auto& subscriber : subscribers_) {
        std::lock_guard sub_lock(subscriber->mutex);
        subscriber->closed = true;
        subscriber->wake.notify_all();
      }
    }
    {
      std::lock_guard lock(connections_mutex_);
      // Wakes threads blocked in recv/send on a stalled peer.
      for (auto& connection : connections_) ::shutdown(connection->fd.get(), SHUT_RDWR);
    }
    for (auto& connection : connections_) {
      if (connection->thread.joinable()) connection->thread.join();
    }
    connections_.clear();
    // Remove the socket only if it is still the one we bound.
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
      ::unlink(path_.c_str());
    }
  }

  void publish(const json& event) {
    std::string line = dump_line(event);
    std::lock_guard lock(subscribers_mutex_);
    for (auto& subscriber : subscribers_) {
      std::lock_guard sub_lock(subscriber->mutex);
      if (subscriber->closed) continue;
      if (subscriber->queue.size() >= kSubscriberQueueLimit) {
        ++subscriber->dropped;
        continue;
      }
      if (subscriber->dropped > 0) {  // tell it, in order, what it missed
        subscriber->queue.push_back(dump_line(json{{"dropped", subscriber->dropped}}));
        subscriber->dropped = 0;
      }
      subscriber->queue.push_back(line);
      subscriber->wake.notify_one();
    }
  }

  size_t subscriber_count() const {
    std::lock_guard lock(subscribers_mutex_);
    return subscribers_.size();
  }

  const std::string& path() const { return path_; }

 private:
  void reap_finished() {
    std::lock_guard lock(connections_mutex_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // accept(2) failed: out of descriptors or memory, or something else. Take
  // the waiting connection with the spare descriptor and close it (so it is
  // not left hanging), then pause: never a busy loop.
  void accept_failed(int err) {
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
      spare_.reset();
      UniqueFd dropped(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
    if (accept_errors_.count()) {
      log::warn("control socket {}: accept: {}; pausing {} ms", path_, std::strerror(err),
                kAcceptPause.count());
    }
    paused_ = true;
  }

  // Room for one more request connection: the oldest idle one is closed if
  // all are taken. false: every one is busy.
  bool make_room_locked() {
    size_t requests = 0;
    for (auto& c : connections_) {
      int state = c->state.load();
      if (!c->done.load() && (state == kIdle || state == kBusy)) ++requests;
    }
    if (requests < options_.max_connections) return true;
    for (auto& c : connections_) {  // in arrival order: the oldest first
      int idle = kIdle;
      if (c->done.load() || !c->state.compare_exchange_strong(idle, kEvicted)) continue;
      send_all(c->fd.get(),
               dump_line(error_reply(
                   Status(Errc::kResourceExhausted, "closed: this connection was idle and " +
                                                        std::to_string(options_.max_connections) +
                                                        " control connections were open"))),
               std::chrono::steady_clock::now());
      ::shutdown(c->fd.get(), SHUT_RDWR);
      if (evictions_.count()) {
        log::warn(
            "control socket {}: {} connections open; closed the oldest idle one to make "
            "room (idle ones are closed after {} ms anyway)",
            path_, options_.max_connections, options_.idle_timeout.count());
      }
      return true;
    }
    return false;
  }

  void accept_loop() {
    while (!stopping_.load()) {
      if (uint64_t n = accept_errors_.unreported())
        log::warn("control socket {}: accept failed {} more time(s) in the last {} s", path_, n,
                  kControlLogInterval.count());
      if (uint64_t n = evictions_.unreported())
        log::warn("control socket {}: closed {} more idle connection(s) in the last {} s", path_, n,
                  kControlLogInterval.count());
      // While paused, only the wake pipe is watched.
      pollfd fds[2] = {{wake_read_.get(), POLLIN, 0}, {listen_fd_.get(), POLLIN, 0}};
      int ready =
          ::poll(fds, paused_ ? 1 : 2, paused_ ? static_cast<int>(kAcceptPause.count()) : 1000);
      paused_ = false;
      reap_finished();
      if (ready < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].revents != 0 || stopping_.load()) break;
      if ((fds[1].revents & POLLIN) == 0) continue;
      UniqueFd client(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!client.valid()) {
        int err = errno;
        if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR && err != ECONNABORTED)
          accept_failed(err);
        continue;
      }
      // The file mode already keeps others out; check the peer anyway.
      ucred peer{};
      socklen_t len = sizeof(peer);
      if (::getsockopt(client.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 ||
          (peer.uid != 0 && peer.uid != ::geteuid())) {
        send_all(client.get(),
                 dump_line(error_reply(Status(Errc::kPermissionDenied,
                                              "permission denied on " + path_ + ": run as root"))));
        continue;
      }
      std::lock_guard lock(connections_mutex_);
      auto soon = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      if (!make_room_locked()) {
        send_all(client.get(),
                 dump_line(error_reply(Status(Errc::kResourceExhausted,
                                              "too many control connections to " + path_ + " (" +
                                                  std::to_string(options_.max_connections) +
                                                  ", all busy); try again"))),
                 soon);
        continue;
      }
      auto connection = std::make_unique<Connection>();
      connection->fd = std::move(client);
      Connection* raw = connection.get();
      try {
        raw->thread = std::thread([this, raw] {
          name_this_thread("control-conn");
          serve(*raw);
          raw->done.store(true);
        });
      } catch (const std::system_error& e) {
        send_all(raw->fd.get(),
                 dump_line(error_reply(
                     Status(Errc::kResourceExhausted, std::string("control socket: cannot start a "
                                                                  "thread for the request: ") +
                                                          e.what() + "; try again"))),
                 soon);
        continue;
      }
      connections_.push_back(std::move(connection));
    }
  }

  void serve(Connection& connection) {
    const int fd = connection.fd.get();
    auto reply_deadline = [&] { return std::chrono::steady_clock::now() + options_.idle_timeout; };
    std::string buffer;
    for (;;) {
      std::string line;
      Status read = read_line(fd, buffer, line, kMaxRequestBytes,
                              std::chrono::steady_clock::now() + options_.idle_timeout, path_);
      if (read.code() == Errc::kTimeout) {
        int idle = kIdle;
        if (connection.state.compare_exchange_strong(idle, kBusy)) {
          send_all(fd,
                   dump_line(error_reply(
                       Status(Errc::kTimeout, "no request within " +
                                                  std::to_string(options_.idle_timeout.count()) +
                                                  " ms; closing the connection"))),
                   reply_deadline());
        }
        return;
      }
      if (read.code() == Errc::kResourceExhausted) {
        send_all(
            fd,
            dump_line(error_reply(Status(Errc::kInvalidArgument,
                                         "request larger than " + std::to_string(kMaxRequestBytes) +
                                             " bytes; closing the connection"))),
            reply_deadline());
        return;
      }
      if (!read.ok() || stopping_.load()) return;
      // Evicted meanwhile (it was idle an instant ago): gone.
      int idle = kIdle;
      if (!connection.state.compare_exchange_strong(idle, kBusy)) return;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") != std::string::npos) {
        json request = json::parse(line, nullptr, false);
        if (request.is_object() && request.value("command", json()) == "events") {
          connection.state = kSubscriber;
          stream_events(fd);
          return;
        }
        std::string reply = answer_request(line, [this](const json& request) {
          if (concurrent(request)) return handler_(request);
          std::lock_guard lock(handler_mutex_);
          return handler_(request);
        });
        if (!send_all(fd, reply, reply_deadline())) return;
      }
      connection.state = kIdle;
    }
  }

  bool concurrent(const json& request) const {
    const json& command = request["command"];  // a string: answer_request checked
    for (const std::string& name : options_.concurrent_commands) {
      if (command == name) return true;
    }
    return false;
  }

  void stream_events(int fd) {
    auto subscriber = std::make_shared<Subscriber>();
    {
      std::lock_guard lock(subscribers_mutex_);
      if (stopping_.load()) return;
      if (subscribers_.size() >= options_.max_subscribers) {
        send_all(fd,
                 dump_line(error_reply(Status(Errc::kResourceExhausted,
                                              "too many event subscribers on " + path_ + " (" +
                                                  std::to_string(options_.max_subscribers) +
                                                  "); try again later"))),
                 std::chrono::steady_clock::now() + options_.idle_timeout);
        return;
      }
      subscribers_.push_back(subscriber);
    }
    // Notices the subscriber hanging up while no event is due.
    std::atomic<bool> hung_up{false};
    std::thread watcher;
    try {
      watcher = std::thread([fd, &hung_up, subscriber] {
        char byte;
        while (::recv(fd, &byte, 1, 0) > 0) {
        }
        hung_up.store(true);
        std::lock_guard lock(subscriber->mutex);
        subscriber->wake.notify_all();
      });
    } catch (const std::system_error& e) {
      {
        std::lock_guard lock(subscribers_mutex_);
        std::erase(subscribers_, subscriber);
      }
      send_all(fd,
               dump_line(error_reply(Status(
                   Errc::kResourceExhausted,
                   std::string("control socket: cannot start a thread for events: ") + e.what()))),
               std::chrono::steady_clock::now() + options_.idle_timeout);
      return;
    }
    bool alive = send_all(fd, dump_line(json{{"ok", true}, {"result", {{"subscribed", true}}}}));
    while (alive) {
      std::string line;
      {
        std::unique_lock lock(subscriber->mutex);
        subscriber->wake.wait(lock, [&] {
          return subscriber->closed || hung_up.load() || !subscriber->queue.empty() ||
                 subscriber->dropped > 0;
        });
        if (subscriber->closed || hung_up.load()) break;
        if (!subscriber->queue.empty()) {
          line = std::move(subscriber->queue.front());
          subscriber->queue.pop_front();
        } else {
          line = dump_line(json{{"dropped", subscriber->dropped}});
          subscriber->dropped = 0;
        }
      }
      alive = send_all(fd, line);
    }
    {
      std::lock_guard lock(subscribers_mutex_);
      std::erase(subscribers_, subscriber);
    }
    ::shutdown(fd, SHUT_RDWR);
    watcher.join();
  }

  static constexpr std::chrono::milliseconds kAcceptPause{100};
  static constexpr std::chrono::seconds kControlLogInterval{10};

  std::string path_;
  Handler handler_;
  const ServerOptions options_;
  std::mutex handler_mutex_;
  UniqueFd listen_fd_;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
  dev_t dev_;
  ino_t ino_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  // The accept loop's own (only it touches them).
  UniqueFd spare_;  // given up to take and close a connection when out of descriptors
  bool paused_ = false;
  LogLimiter accept_errors_{kControlLogInterval, 1};
  LogLimiter evictions_{kControlLogInterval, 1};
  std::mutex connections_mutex_;
  std::list<std::unique_ptr<Connection>> connections_;
  mutable std::mutex subscribers_mutex_;
  std::vector<std::shared_ptr<Subscriber>> subscribers_;
};

Result<std::unique_ptr<Server>> Server::start(const std::string& socket_path, Handler handler,
                                              const ServerOptions& options) {
  using R = Result<std::unique_ptr<Server>>;
  if (!handler) return R(Errc::kInvalidArgument, "control server needs a handler");
  PMIRROR_ASSIGN_OR_RETURN(sockaddr_un address, make_address(socket_path));
  PMIRROR_RETURN_IF_ERROR(make_parent_dirs(socket_path));

  struct stat st {};
  if (::lstat(socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return R(Errc::kAlreadyExists,
               socket_path + " exists and is not a socket: remove it or choose another path");
    }
    auto live = connect_to(socket_path, std::chrono::milliseconds(1000));
    if (live.ok()) {
      ucred peer{};
      socklen_t len = sizeof(peer);
      std::string who = "another process is";
      if (::getsockopt(live->get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.pid > 0) {
        who = "another " + process_name(peer.pid) + " is already running (pid " +
              std::to_string(peer.pid) + ")";
      } else {
        who = "another process is already serving";
      }
      return R(Errc::kAlreadyExists, who + " on " + socket_path);
    }
    if (live.status().code() == Errc::kPermissionDenied) return live.status();
    // Refused: a stale socket left by a process that died. Replace it.
    if (::unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
      return errno_status(Errc::kIoError, "cannot remove stale socket " + socket_path, errno);
    }
  }

  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status(Errc::kIoError, "socket(AF_UNIX)", errno);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    int err = errno;
    return errno_status(err == EACCES ? Errc::kPermissionDenied : Errc::kIoError,
                        "cannot bind control socket " + socket_path, err);
  }
  // Nobody can connect before listen(), so setting the mode here (rather than
  // changing the process-wide umask under an application's threads) leaves no
  // window in which others could get in.
  if (::chmod(socket_path.c_str(), 0600) != 0 || ::lstat(socket_path.c_str(), &st) != 0) {
    int err = errno;
    ::unlink(socket_path.c_str());
    return errno_status(Errc::kIoError, "cannot set mode 0600 on " + socket_path, err);
  }
  if (::listen(fd.get(), 128) != 0) {
    int err = errno;
    ::unlink(socket_path.c_str());
    return errno_status(Errc::kIoError, "listen on " + socket_path, err);
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    int err = errno;
    ::unlink(socket_path.c_str());
    return errno_status(Errc::kIoError, "pipe", err);
  }
  auto impl =
      std::make_unique<Impl>(socket_path, std::move(handler), options, std::move(fd),
                             UniqueFd(pipe_fds[0]), UniqueFd(pipe_fds[1]), st.st_dev, st.st_ino);
  PMIRROR_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
void Server::publish(const nlohmann::json& event) { impl_->publish(event); }
const std::string& Server::path() const { return impl_->path(); }
size_t Server::subscriber_count() const { return impl_->subscriber_count(); }

// ---- client ------------------------------------------------------------

Result<nlohmann::json> request(const std::string& socket_path, const nlohmann::json& request,
                               std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  PMIRROR_ASSIGN_OR_RETURN(UniqueFd fd, connect_to(socket_path, timeout));
  if (!send_all(fd.get(), dump_line(request))) {
    return errno_status(Errc::kConnectionError, "sending to " + socket_path, errno);
  }
  std::string buffer, line;
  Status read = read_line(fd.get(), buffer, line, kMaxResponseBytes, deadline, socket_path);
  if (read.code() == Errc::kTimeout) {
    return Result<json>(Errc::kTimeout, "no answer from " + socket_path + " within " +
                                            std::to_string(timeout.count()) + " ms");
  }
  if (!read.ok()) return read;
  return parse_reply(line, socket_path);
}

Status probe(const std::string& socket_path, std::chrono::milliseconds timeout) {
  auto fd = connect_to(socket_path, timeout);
  return fd.ok() ? Status::Ok() : fd.status();
}

Status subscribe(const std::string& socket_path,
                 const std::function<bool(const nlohmann::json& event)>& on_event,
                 std::stop_token stop, std::chrono::milliseconds connect_timeout,
                 const std::function<void()>& on_subscribed) {
  PMIRROR_ASSIGN_OR_RETURN(UniqueFd fd, connect_to(socket_path, connect_timeout));
  if (!send_all(fd.get(), dump_line(json{{"command", "events"}}))) {
    return errno_status(Errc::kConnectionError, "sending to " + socket_path, errno);
  }
  std::string buffer, line;
  auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  Status read = read_line(fd.get(), buffer, line, kMaxResponseBytes, deadline, socket_path, &stop);
  if (stop.stop_requested()) return Status::Ok();
  if (!read.ok()) return read;
  auto reply = parse_reply(line, socket_path);
  if (!reply.ok()) return reply.status();
  if (on_subscribed) on_subscribed();
  for (;;) {
    read = read_line(fd.get(), buffer, line, kMaxResponseBytes, std::nullopt, socket_path, &stop);
    if (stop.stop_requested()) return Status::Ok();
    if (!read.ok()) return read;
    json event = json::parse(line, nullptr, false);
    if (event.is_discarded()) {
      return Status(Errc::kProtocolError, socket_path + " sent an event that is not JSON");
    }
    if (!on_event(event)) return Status::Ok();
  }
}

}  // namespace pmirror::control
