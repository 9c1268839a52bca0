#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <cerrno>
#include <climits>

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace pmirror::transport::tcp {

namespace {

// A Write's payload is read from the application's mapped volume the way an
// RDMA NIC reads it, by DMA, while the application may be storing to the
// same bytes: docs/initiator.md allows a store during an in-flight persist (a
// later persist of the range sends it again), and a resync copies chunks
// while the application writes (the dirty map catches those). The kernel
// copies the bytes; no compiled code of ours races on them. ThreadSanitizer
// sees sendmsg's read and would report it; a suppression cannot always
// match, because TSan cannot always restore the reading stack of a
// long-lived thread ("failed to restore the stack"), so the reads are marked
// here, where they happen. (Synchronisation is still tracked.)
class DmaLikeRead {
 public:
#if defined(__SANITIZE_THREAD__)
  DmaLikeRead() { AnnotateIgnoreReadsBegin(__FILE__, __LINE__); }
  ~DmaLikeRead() { AnnotateIgnoreReadsEnd(__FILE__, __LINE__); }
#else
  DmaLikeRead() = default;
#endif
  DmaLikeRead(const DmaLikeRead&) = delete;
  DmaLikeRead& operator=(const DmaLikeRead&) = delete;
};

}  // namespace

std::string format_address(const sockaddr* addr, socklen_t len) {
  char host[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "?";
}

std::string format_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return format_address(reinterpret_cast<sockaddr*>(&ss), len);
}

Status set_nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    return errno_status(Errc::kIoError, "setsockopt(TCP_NODELAY)", errno);
  return Status::Ok();
}

Status set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return errno_status(Errc::kIoError, "fcntl(F_GETFL)", errno);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) != 0) return errno_status(Errc::kIoError, "fcntl(F_SETFL)", errno);
  return Status::Ok();
}

Status wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Status(Errc::kTimeout, "timed out");
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, INT_MAX)));
    if (rc > 0) return Status::Ok();  // readable/writable or error: the I/O call tells
    if (rc < 0 && errno != EINTR) return errno_status(Errc::kIoError, "poll", errno);
  }
}

Status send_all_deadline(int fd, const void* data, size_t len, Clock::time_point deadline) {
  auto* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      PMIRROR_RETURN_IF_ERROR(wait_fd(fd, POLLOUT, deadline));
      continue;
    }
    return errno_status(Errc::kConnectionError, "send", errno);
  }
  return Status::Ok();
}

Status recv_all_deadline(int fd, void* data, size_t len, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Status(Errc::kConnectionError, "peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      PMIRROR_RETURN_IF_ERROR(wait_fd(fd, POLLIN, deadline));
      continue;
    }
    return errno_status(Errc::kConnectionError, "recv", errno);
  }
  return Status::Ok();
}

int sendv_all(int fd, iovec* iov, int iovcnt) {
  [[maybe_unused]] DmaLikeRead payload;
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(iovcnt, IOV_MAX));
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    auto left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return 0;
}

ssize_t sendv_nowait(int fd, const iovec* iov, size_t iovcnt) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = iovcnt;
  [[maybe_unused]] DmaLikeRead payload;
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

void copy_unsent(const iovec* iov, size_t iovcnt, size_t skip, std::vector<std::byte>& out) {
  [[maybe_unused]] DmaLikeRead payload;
  for (size_t i = 0; i < iovcnt; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    const auto* from = static_cast<const std::byte*>(iov[i].iov_base) + skip;
    out.insert(out.end(), from, from + (iov[i].iov_len - skip));
    skip = 0;
  }
}

}  // namespace pmirror::transport::tcp
