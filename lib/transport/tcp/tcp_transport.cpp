#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>

#include "common/log.h"
#include "common/log_limit.h"
#include "transport/admission.h"
#include "transport/registry.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_connection.h"
#include "transport/tcp/wire.h"

namespace pmirror::transport {

namespace tcp {
namespace {

constexpr uint32_t kMaxSlots = 1u << 16;
constexpr uint32_t kMaxMessageSize = 64u << 20;
constexpr uint32_t kMaxOutstanding = 1u << 16;

Status validate_options(const ConnectionOptions& o) {
  auto bad = [](const char* name, uint32_t v, uint32_t max) {
    return Status(Errc::kInvalidArgument, std::string("transport option ") + name + " = " +
                                              std::to_string(v) + " is out of range [1, " +
                                              std::to_string(max) + "]");
  };
  if (o.recv_slots == 0 || o.recv_slots > kMaxSlots)
    return bad("recv_slots", o.recv_slots, kMaxSlots);
  if (o.message_size == 0 || o.message_size > kMaxMessageSize)
    return bad("message_size", o.message_size, kMaxMessageSize);
  if (o.max_outstanding == 0 || o.max_outstanding > kMaxOutstanding)
    return bad("max_outstanding", o.max_outstanding, kMaxOutstanding);
  return Status::Ok();
}

// The hello both sides send first.
void encode_hello(const ConnectionOptions& o, uint8_t* out) {
  FrameHeader h;
  h.type = FrameType::kHello;
  h.length = kHelloPayloadSize;
  encode(h, out);
  Hello mine{kProtocolVersion, o.message_size, o.recv_slots, o.max_outstanding};
  encode(mine, out + kHeaderSize);
}

Status bad_hello(const std::string& peer) {
  return Status(Errc::kProtocolError,
                "handshake with " + peer +
                    ": the peer does not speak the pmirror tcp transport (bad hello) — is it a "
                    "pmirror endpoint configured for transport tcp?");
}

bool hello_header_ok(const uint8_t* header) {
  FrameHeader ph = decode(header);
  return ph.magic == kFrameMagic && ph.type == FrameType::kHello && ph.length == kHelloPayloadSize;
}

// Checks the peer's hello against ours. Each side checks on its own, so
// both get a clear error on a mismatch.
Status check_hello(const Hello& theirs, const ConnectionOptions& o, const std::string& peer) {
  if (theirs.version != kProtocolVersion)
    return Status(Errc::kProtocolError, "handshake with " + peer + ": peer speaks tcp transport " +
                                            "version " + std::to_string(theirs.version) +
                                            ", we speak " + std::to_string(kProtocolVersion));
  if (theirs.message_size != o.message_size)
    return Status(Errc::kConfigError, "handshake with " + peer + ": message_size mismatch (ours " +
                                          std::to_string(o.message_size) + ", peer's " +
                                          std::to_string(theirs.message_size) +
                                          ") — configure both sides with the same message size");
  if (theirs.recv_slots == 0 || theirs.recv_slots > kMaxSlots || theirs.max_outstanding == 0 ||
      theirs.max_outstanding > kMaxOutstanding)
    return Status(Errc::kProtocolError,
                  "handshake with " + peer + ": peer announced invalid limits (recv_slots " +
                      std::to_string(theirs.recv_slots) + ", max_outstanding " +
                      std::to_string(theirs.max_outstanding) + ")");
  return Status::Ok();
}

// The connecting side's hello: both send, then read and check the peer's,
// blocking until deadline (the initiator has a thread of its own for it).
Result<Hello> handshake(int fd, const ConnectionOptions& o, const std::string& peer,
                        Clock::time_point deadline) {
  PMIRROR_RETURN_IF_ERROR(set_nonblocking(fd, true));
  uint8_t out[kHeaderSize + kHelloPayloadSize];
  encode_hello(o, out);
  auto context = [&](const Status& s) {
    if (s.code() == Errc::kTimeout)
      return Status(Errc::kTimeout, "handshake with " + peer +
                                        " timed out (no pmirror tcp hello) — is the peer a "
                                        "pmirror tcp endpoint?");
    return s.with_context("handshake with " + peer);
  };
  Status s = send_all_deadline(fd, out, sizeof out, deadline);
  if (!s.ok()) return context(s);
  uint8_t in[kHeaderSize + kHelloPayloadSize];
  s = recv_all_deadline(fd, in, kHeaderSize, deadline);
  if (!s.ok()) return context(s);
  if (!hello_header_ok(in)) return bad_hello(peer);
  s = recv_all_deadline(fd, in + kHeaderSize, kHelloPayloadSize, deadline);
  if (!s.ok()) return context(s);
  Hello theirs = decode_hello(in + kHeaderSize);
  PMIRROR_RETURN_IF_ERROR(check_hello(theirs, o, peer));
  return theirs;
}

// How long the listener stops accepting after accept(2) ran out of file
// descriptors or memory: long enough for the owner of an evicted
// connection to close it, short enough that nobody waits noticeably.
constexpr std::chrono::milliseconds kExhaustedBackoff{100};
// Accepts taken per readiness of the listening socket, so that a flood
// cannot keep the hellos already under way from progressing.
constexpr int kAcceptBatch = 32;
// Failed hellos kept for accept() to report; beyond, they are only counted.
constexpr size_t kMaxQueuedFailures = 64;
constexpr std::chrono::seconds kLogInterval{10};

// The passive side. Every accepted socket is non-blocking and sits in
// pending_ with a deadline until its hello has been sent and the peer's
// received and checked; one epoll set watches the listening socket, the
// shutdown eventfd and every pending socket, so a silent or slow peer holds
// up nobody. Completed ones become dormant TcpConnections (ready_).
class TcpListener final : public Listener {
 public:
  TcpListener(UniqueFd fd, UniqueFd wake, UniqueFd epoll, uint16_t port, std::string where,
              const ConnectionOptions& options, const AdmissionOptions& admission)
      : fd_(std::move(fd)),
        wake_(std::move(wake)),
        epoll_(std::move(epoll)),
        port_(port),
        where_(std::move(where)),
        options_(options),
        control_(AdmissionControl::create(admission)) {
    reopen_spare();
  }
  ~TcpListener() override { shutdown(); }

  Result<std::unique_ptr<Connection>> accept(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (bool first = true;; first = false) {
      if (closed_.load()) return Status(Errc::kClosed, "listener on " + where_ + " was shut down");
      auto now = Clock::now();
      expire(now);
      if (paused_ && now >= paused_until_) resume();
      report(now);
      if (!ready_.empty()) {
        std::unique_ptr<Connection> c = std::move(ready_.front());
        ready_.pop_front();
        return c;
      }
      if (!failures_.empty()) {
        Status failed = std::move(failures_.front());
        failures_.pop_front();
        return failed.with_context("accept");
      }
      if (!first && now >= deadline) return std::unique_ptr<Connection>();  // timeout
      auto wake_at = deadline;
      for (auto& [fd, p] : pending_) wake_at = std::min(wake_at, p->deadline);
      if (paused_) wake_at = std::min(wake_at, paused_until_);
      auto left = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now);
      epoll_event events[64];
      int n = ::epoll_wait(epoll_.get(), events, 64,
                           static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT32_MAX)));
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno_status(Errc::kIoError, "listener on " + where_ + ": epoll_wait", errno);
      }
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == wake_.get())
          return Status(Errc::kClosed, "listener on " + where_ + " was shut down");
        if (fd == fd_.get()) {
          accept_ready();
        } else {
          progress(fd);
        }
      }
    }
  }

  int wait_fd() const override { return epoll_.get(); }
  AdmissionCounters admission() const override { return control_->counters(); }
  uint16_t port() const override { return port_; }

  void shutdown() override {
    if (closed_.exchange(true)) return;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
  }

 private:
  struct Pending {
    UniqueFd fd;
    std::string peer;
    Clock::time_point deadline;
    uint8_t out[kHeaderSize + kHelloPayloadSize] = {};
    size_t sent = 0;
    uint8_t in[kHeaderSize + kHelloPayloadSize] = {};
    size_t got = 0;
    uint32_t watching = EPOLLIN;  // the epoll events registered for it
    // Last: destroyed first, before the fd its eviction would shut down.
    std::unique_ptr<AdmissionControl::Ticket> ticket;
  };

  void reopen_spare() {
    if (!spare_.valid()) spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }

  void accept_ready() {
    for (int i = 0; i < kAcceptBatch && !paused_; ++i) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      int cfd = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                          SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (cfd >= 0) {
        admit(UniqueFd(cfd), ss, len);
        continue;
      }
      int err = errno;
      switch (err) {
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
          return;
        // The client gave up before we got to it: the next one.
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
          continue;
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
          exhausted(err);
          return;
        default:
          // Anything else (a firewall's EPERM, ...) concerns that attempt;
          // back off rather than spin on it.
          if (other_errors_.count())
            log::warn("listener on {}: accept: {}; pausing {} ms", where_, std::strerror(err),
                      kExhaustedBackoff.count());
          pause();
          return;
      }
    }
  }

  // accept(2) failed for want of a file descriptor or memory: free one if
  // an unauthenticated connection holds it, else take the waiting
  // connection with the spare descriptor and close it at once; then stop
  // accepting for a moment. Never a busy loop, never an exit.
  void exhausted(int err) {
    const char* what;
    if (control_->evict_one()) {
      sweep_evicted();
      what = "closed the oldest unauthenticated connection";
    } else {
      spare_.reset();
      int cfd = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (cfd >= 0) {
        ::close(cfd);
        control_->count_dropped();
        what = "closed a new connection at once";
      } else {
        what = "could not take the connection";
      }
      reopen_spare();
    }
    if (exhausted_log_.count()) {
      log::warn(
          "listener on {}: accept: {} ({}): {}; pausing {} ms (raise the file descriptor limit, "
          "LimitNOFILE=, or lower max_unauthenticated)",
          where_, std::strerror(err),
          err == EMFILE   ? "the process's file descriptor limit"
          : err == ENFILE ? "the system's file limit"
                          : "out of memory",
          what, kExhaustedBackoff.count());
    }
    pause();
  }

  void pause() {
    paused_ = true;
    paused_until_ = Clock::now() + kExhaustedBackoff;
    epoll_event ev{};
    ev.events = 0;
    ev.data.fd = fd_.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd_.get(), &ev);
  }

  void resume() {
    paused_ = false;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd_.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd_.get(), &ev);
  }

  void admit(UniqueFd conn, const sockaddr_storage& ss, socklen_t len) {
    const auto* address = reinterpret_cast<const sockaddr*>(&ss);
    std::string peer = format_address(address, len);
    const int raw = conn.get();
    bool made_room = false;
    auto ticket = control_->admit(
        admission_source(address, len), [raw] { ::shutdown(raw, SHUT_RDWR); }, &made_room);
    if (made_room) {
      sweep_evicted();
      if (evicted_log_.count()) control_->warn_evicted("listener on " + where_, peer);
    }
    (void)set_nodelay(raw);
    auto p = std::make_unique<Pending>();
    p->fd = std::move(conn);
    p->peer = std::move(peer);
    p->deadline = Clock::now() + control_->options().handshake_timeout;
    encode_hello(options_, p->out);
    p->ticket = std::move(ticket);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = raw;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &ev) != 0) {
      control_->count_dropped();  // out of memory for the epoll entry: drop it
      return;
    }
    Pending& ref = *p;
    pending_[raw] = std::move(p);
    progress_pending(ref);
  }

  void progress(int fd) {
    auto it = pending_.find(fd);
    if (it != pending_.end()) progress_pending(*it->second);
  }

  void fail(Pending& p, Status why, bool timed_out = false) {
    if (timed_out) {
      control_->count_timed_out();
    } else {
      control_->count_failed();
    }
    if (failures_.size() < kMaxQueuedFailures) failures_.push_back(std::move(why));
    pending_.erase(p.fd.get());  // closes it (and so leaves the epoll set)
  }

  void progress_pending(Pending& p) {
    if (p.ticket->evicted()) {
      pending_.erase(p.fd.get());
      return;
    }
    const int fd = p.fd.get();
    while (p.sent < sizeof p.out) {
      ssize_t n = ::send(fd, p.out + p.sent, sizeof p.out - p.sent, MSG_NOSIGNAL);
      if (n > 0) {
        p.sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return fail(
          p, errno_status(Errc::kConnectionError, "handshake with " + p.peer + ": send", errno));
    }
    const bool want_out = p.sent < sizeof p.out;
    // Read exactly the hello, never beyond: what follows is the
    // connection's, not ours.
    while (p.got < sizeof p.in) {
      size_t want = p.got < kHeaderSize ? kHeaderSize - p.got : sizeof p.in - p.got;
      ssize_t n = ::recv(fd, p.in + p.got, want, 0);
      if (n > 0) {
        p.got += static_cast<size_t>(n);
        if (p.got == kHeaderSize && !hello_header_ok(p.in)) return fail(p, bad_hello(p.peer));
        continue;
      }
      if (n == 0)
        return fail(p, Status(Errc::kConnectionError,
                              "handshake with " + p.peer + ": the peer closed the connection"));
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        watch(p, EPOLLIN | (want_out ? uint32_t{EPOLLOUT} : uint32_t{0}));
        return;
      }
      return fail(
          p, errno_status(Errc::kConnectionError, "handshake with " + p.peer + ": recv", errno));
    }
    if (want_out) {
      // The peer's hello is in, ours is still going out: wait for room
      // only (a readable socket would wake us for nothing, over and over).
      watch(p, EPOLLOUT);
      return;
    }
    Hello theirs = decode_hello(p.in + kHeaderSize);
    if (Status checked = check_hello(theirs, options_, p.peer); !checked.ok())
      return fail(p, checked);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    auto node = pending_.extract(fd);
    Pending& done = *node.mapped();
    ready_.push_back(std::unique_ptr<Connection>(new TcpConnection(
        std::move(done.fd), options_, theirs, std::move(done.peer), std::move(done.ticket))));
  }

  // What a pending socket is to be watched for.
  void watch(Pending& p, uint32_t events) {
    if (p.watching == events) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = p.fd.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, p.fd.get(), &ev);
    p.watching = events;
  }

  // Pending hellos the admission control evicted: their sockets are shut
  // down; close them now (the descriptor may be what accept needs).
  void sweep_evicted() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->ticket->evicted()) {
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void expire(Clock::time_point now) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = *it->second;
      ++it;
      if (now < p.deadline) continue;
      fail(p,
           Status(Errc::kTimeout,
                  "handshake with " + p.peer + " timed out after " +
                      std::to_string(control_->options().handshake_timeout.count()) +
                      " ms (no pmirror tcp hello) — is the peer a pmirror tcp endpoint?"),
           /*timed_out=*/true);
    }
  }

  // The per-interval sums of what was not logged line by line.
  void report(Clock::time_point now) {
    if (uint64_t n = evicted_log_.unreported(now))
      AdmissionControl::warn_evicted_since("listener on " + where_, n, kLogInterval);
    if (uint64_t n = exhausted_log_.unreported(now))
      log::warn(
          "listener on {}: accept ran out of file descriptors or memory {} more time(s) "
          "in the last {} s",
          where_, n, kLogInterval.count());
    if (uint64_t n = other_errors_.unreported(now))
      log::warn("listener on {}: accept failed {} more time(s) in the last {} s", where_, n,
                kLogInterval.count());
  }

  UniqueFd fd_;
  UniqueFd wake_;   // eventfd: shutdown() wakes a blocked accept()
  UniqueFd epoll_;  // fd_, wake_ and every pending socket
  UniqueFd spare_;  // reserved descriptor, given up to take (and close) a connection under EMFILE
  uint16_t port_;
  std::string where_;
  ConnectionOptions options_;
  std::shared_ptr<AdmissionControl> control_;
  std::atomic<bool> closed_{false};
  // Below: only the thread in accept() touches these.
  std::map<int, std::unique_ptr<Pending>> pending_;  // by descriptor
  std::deque<std::unique_ptr<Connection>> ready_;
  std::deque<Status> failures_;
  bool paused_ = false;
  Clock::time_point paused_until_{};
  LogLimiter evicted_log_{kLogInterval, 1};
  LogLimiter exhausted_log_{kLogInterval, 1};
  LogLimiter other_errors_{kLogInterval, 1};
};

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfoPtr> resolve(const std::string& address, uint16_t port, bool passive,
                            const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(address.empty() ? nullptr : address.c_str(), service.c_str(), &hints, &res);
  if (rc != 0)
    return Status(Errc::kConnectionError,
                  what + ": cannot resolve '" + address + "': " + gai_strerror(rc));
  return AddrInfoPtr(res);
}

}  // namespace
}  // namespace tcp

using namespace tcp;

Result<std::unique_ptr<Listener>> tcp_listen(const std::string& address, uint16_t port,
                                             const ConnectionOptions& options,
                                             const AdmissionOptions& admission) {
  PMIRROR_RETURN_IF_ERROR(validate_options(options));
  std::string what = "listen on " + format_host_port(address, port);
  PMIRROR_ASSIGN_OR_RETURN(auto ai, resolve(address, port, true, what));
  Status last(Errc::kConnectionError, what + ": no usable address");
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      last = errno_status(Errc::kConnectionError, what + ": socket", errno);
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      int err = errno;
      last = errno_status(Errc::kConnectionError, what + ": bind", err);
      if (err == EADDRINUSE)
        last = Status(Errc::kConnectionError,
                      last.message() + " — is another pmirrord already listening there?");
      continue;
    }
    if (::listen(fd.get(), 128) != 0) {
      last = errno_status(Errc::kConnectionError, what + ": listen", errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
      return errno_status(Errc::kIoError, what + ": getsockname", errno);
    uint16_t bound = ss.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake.valid()) return errno_status(Errc::kIoError, what + ": eventfd", errno);
    UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll.valid()) return errno_status(Errc::kIoError, what + ": epoll_create1", errno);
    for (int watched : {fd.get(), wake.get()}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = watched;
      if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, watched, &ev) != 0)
        return errno_status(Errc::kIoError, what + ": epoll_ctl", errno);
    }
    return std::unique_ptr<Listener>(
        new TcpListener(std::move(fd), std::move(wake), std::move(epoll), bound,
                        format_host_port(address, bound), options, admission));
  }
  return last;
}

Result<std::unique_ptr<Connection>> tcp_connect(const std::string& address, uint16_t port,
                                                const ConnectionOptions& options) {
  PMIRROR_RETURN_IF_ERROR(validate_options(options));
  std::string target = format_host_port(address, port);
  std::string what = "connect to " + target;
  auto deadline = Clock::now() + options.connect_timeout;
  PMIRROR_ASSIGN_OR_RETURN(auto ai, resolve(address, port, false, what));
  Status last(Errc::kConnectionError, what + ": no usable address");
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      last = errno_status(Errc::kConnectionError, what + ": socket", errno);
      continue;
    }
    int err = 0;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        Status w = wait_fd(fd.get(), POLLOUT, deadline);
        if (w.code() == Errc::kTimeout) {
          last =
              Status(Errc::kTimeout,
                     what + ": timed out after " + std::to_string(options.connect_timeout.count()) +
                         " ms — is the host reachable and the port not firewalled?");
          continue;
        }
        if (!w.ok()) return w.with_context(what);
        socklen_t len = sizeof err;
        if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
    if (err != 0) {
      last = errno_status(Errc::kConnectionError, what, err);
      if (err == ECONNREFUSED)
        last = Status(Errc::kConnectionError,
                      last.message() + " — is pmirrord running and listening there?");
      continue;
    }
    std::string peer = peer_name(fd.get());
    PMIRROR_RETURN_IF_ERROR(set_nodelay(fd.get()));
    PMIRROR_ASSIGN_OR_RETURN(Hello hello, handshake(fd.get(), options, peer, deadline));
    auto connection = std::make_unique<TcpConnection>(std::move(fd), options, hello, peer);
    // The connecting side is active from the start.
    PMIRROR_RETURN_IF_ERROR(connection->activate().with_context(what));
    return std::unique_ptr<Connection>(std::move(connection));
  }
  return last;
}

void register_tcp(Registry& registry) {
  Provider tcp;
  tcp.kind = Kind::kTcp;
  // The passive side persists every Write's range before it answers a later
  // Read (PersistFn: msync or pmem_persist), whatever backs the memory.
  tcp.capabilities.read_flushes_writes_on_any_backing = true;
  // The receiver places each Write itself, so it can persist it at once.
  tcp.capabilities.persists_each_write = true;
  tcp.listen = tcp_listen;
  tcp.connect = tcp_connect;
  registry.add(std::move(tcp));
}

}  // namespace pmirror::transport
