#include "transport/tcp/tcp_transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>

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

// Both sides send HELLO, then read and check the peer's. Each side checks on
// its own, so both get a clear error on a mismatch.
Result<Hello> handshake(int fd, const ConnectionOptions& o, const std::string& peer,
                        Clock::time_point deadline) {
  PMIRROR_RETURN_IF_ERROR(set_nonblocking(fd, true));
  uint8_t out[kHeaderSize + kHelloPayloadSize];
  FrameHeader h;
  h.type = FrameType::kHello;
  h.length = kHelloPayloadSize;
  encode(h, out);
  Hello mine{kProtocolVersion, o.message_size, o.recv_slots, o.max_outstanding};
  encode(mine, out + kHeaderSize);
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
  FrameHeader ph = decode(in);
  if (ph.magic != kFrameMagic || ph.type != FrameType::kHello || ph.length != kHelloPayloadSize)
    return Status(Errc::kProtocolError,
                  "handshake with " + peer +
                      ": the peer does not speak the pmirror tcp transport (bad hello) — is it a "
                      "pmirror endpoint configured for transport tcp?");
  s = recv_all_deadline(fd, in + kHeaderSize, kHelloPayloadSize, deadline);
  if (!s.ok()) return context(s);
  Hello theirs = decode_hello(in + kHeaderSize);
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
  PMIRROR_RETURN_IF_ERROR(set_nonblocking(fd, false));
  return theirs;
}

class TcpListener final : public Listener {
 public:
  TcpListener(UniqueFd fd, UniqueFd wake, uint16_t port, const ConnectionOptions& options)
      : fd_(std::move(fd)), wake_(std::move(wake)), port_(port), options_(options) {}
  ~TcpListener() override { shutdown(); }

  Result<std::unique_ptr<Connection>> accept(std::chrono::milliseconds timeout) override {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (closed_.load()) return Status(Errc::kClosed, "listener was shut down");
      pollfd p[2] = {{fd_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() < 0) left = std::chrono::milliseconds(0);
      int rc = ::poll(p, 2, static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX)));
      if (rc < 0) {
        if (errno == EINTR) continue;
        return errno_status(Errc::kIoError, "accept: poll", errno);
      }
      if (closed_.load() || (p[1].revents & POLLIN))
        return Status(Errc::kClosed, "listener was shut down");
      if (rc == 0) return std::unique_ptr<Connection>();  // timeout
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      int cfd = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
      if (cfd < 0) {
        // Spurious wake-up, or the client gave up before we got to it.
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ||
            errno == EPROTO)
          continue;
        return errno_status(Errc::kConnectionError, "accept", errno);
      }
      UniqueFd conn(cfd);
      std::string peer = format_address(reinterpret_cast<sockaddr*>(&ss), len);
      PMIRROR_RETURN_IF_ERROR(set_nodelay(conn.get()));
      // The handshake has its own bound so a silent client cannot hold
      // accept() beyond connect_timeout.
      auto hello = handshake(conn.get(), options_, peer, Clock::now() + options_.connect_timeout);
      if (!hello.ok()) return hello.status().with_context("accept");
      return std::unique_ptr<Connection>(
          new TcpConnection(std::move(conn), options_, *hello, std::move(peer)));
    }
  }

  uint16_t port() const override { return port_; }

  void shutdown() override {
    if (closed_.exchange(true)) return;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
  }

 private:
  UniqueFd fd_;
  UniqueFd wake_;  // eventfd: shutdown() wakes a blocked accept()
  uint16_t port_;
  ConnectionOptions options_;
  std::atomic<bool> closed_{false};
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
                                             const ConnectionOptions& options) {
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
    return std::unique_ptr<Listener>(
        new TcpListener(std::move(fd), std::move(wake), bound, options));
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
    return std::unique_ptr<Connection>(
        new TcpConnection(std::move(fd), options, hello, std::move(peer)));
  }
  return last;
}

}  // namespace pmirror::transport
