#include "support/link_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <list>
#include <vector>

namespace pmirror::testing {
namespace {

constexpr size_t kBufferLimit = 1 << 20;

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

bool resolve(const std::string& host, uint16_t port, sockaddr_in& out) {
  std::memset(&out, 0, sizeof out);
  out.sin_family = AF_INET;
  out.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &out.sin_addr) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0 || result == nullptr) return false;
  out.sin_addr = reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr;
  ::freeaddrinfo(result);
  return true;
}

// One direction of a forwarded connection: bytes read from `from`, waiting
// to be written to `to`.
struct Direction {
  std::vector<char> pending;
  size_t written = 0;
  bool eof = false;   // `from` said EOF
  bool shut = false;  // EOF passed on (shutdown(to, SHUT_WR))
  size_t queued() const { return pending.size() - written; }
};

struct Link {
  int client = -1;
  int upstream = -1;
  Direction up;    // client -> upstream
  Direction down;  // upstream -> client
  bool dead = false;
};

}  // namespace

std::unique_ptr<LinkProxy> LinkProxy::start(const std::string& listen_host, uint16_t listen_port,
                                            const std::string& target_host, uint16_t target_port,
                                            std::string* error) {
  std::unique_ptr<LinkProxy> proxy(new LinkProxy());
  proxy->target_host_ = target_host;
  proxy->target_port_ = target_port;
  sockaddr_in addr{};
  if (!resolve(listen_host, listen_port, addr)) {
    if (error) *error = "cannot resolve " + listen_host;
    return nullptr;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) {
    if (error)
      *error = "bind/listen " + listen_host + ":" + std::to_string(listen_port) + ": " +
               std::strerror(errno);
    ::close(fd);
    return nullptr;
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  proxy->port_ = ntohs(addr.sin_port);
  set_nonblocking(fd);
  proxy->listen_fd_ = fd;
  if (::pipe2(proxy->wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    if (error) *error = std::string("pipe: ") + std::strerror(errno);
    return nullptr;
  }
  proxy->thread_ = std::thread([p = proxy.get()] { p->run(); });
  return proxy;
}

LinkProxy::~LinkProxy() {
  stop_ = true;
  if (wake_fds_[1] >= 0) (void)!::write(wake_fds_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_fds_) {
    if (fd >= 0) ::close(fd);
  }
}

void LinkProxy::set_blackhole(bool on) {
  blackhole_ = on;
  (void)!::write(wake_fds_[1], "x", 1);
}

void LinkProxy::run() {
  std::list<Link> links;
  sockaddr_in target{};
  const bool target_ok = resolve(target_host_, target_port_, target);

  auto close_link = [&](Link& link) {
    if (link.client >= 0) ::close(link.client);
    if (link.upstream >= 0) ::close(link.upstream);
    link.client = link.upstream = -1;
    link.dead = true;
  };
  // Moves bytes `from` -> buffer and buffer -> `to`; false on a hard error.
  auto pump = [&](int from, int to, Direction& d, short from_events, short to_events) {
    if ((from_events & (POLLIN | POLLHUP | POLLERR)) && !d.eof && d.queued() < kBufferLimit) {
      char buffer[65536];
      ssize_t n = ::read(from, buffer, sizeof buffer);
      if (n > 0) {
        if (d.written == d.pending.size()) {
          d.pending.clear();
          d.written = 0;
        }
        d.pending.insert(d.pending.end(), buffer, buffer + n);
      } else if (n == 0) {
        d.eof = true;
      } else if (errno != EAGAIN && errno != EINTR) {
        return false;
      }
    }
    if ((to_events & POLLOUT) && d.queued() > 0) {
      ssize_t n = ::send(to, d.pending.data() + d.written, d.queued(), MSG_NOSIGNAL);
      if (n > 0) {
        d.written += n;
        forwarded_ += n;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return false;
      }
    }
    if (d.eof && !d.shut && d.queued() == 0) {
      ::shutdown(to, SHUT_WR);
      d.shut = true;
    }
    return true;
  };

  while (!stop_) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fds_[0], POLLIN, 0});
    const bool cut = blackhole_.load();
    if (!cut) {
      fds.push_back({listen_fd_, POLLIN, 0});
      for (Link& link : links) {
        short client_events = 0, upstream_events = 0;
        if (!link.up.eof && link.up.queued() < kBufferLimit) client_events |= POLLIN;
        if (!link.down.eof && link.down.queued() < kBufferLimit) upstream_events |= POLLIN;
        if (link.down.queued() > 0) client_events |= POLLOUT;
        if (link.up.queued() > 0) upstream_events |= POLLOUT;
        fds.push_back({link.client, client_events, 0});
        fds.push_back({link.upstream, upstream_events, 0});
      }
    }
    int ready = ::poll(fds.data(), fds.size(), cut ? 200 : 1000);
    if (ready < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      char drain[64];
      while (::read(wake_fds_[0], drain, sizeof drain) > 0) {
      }
    }
    if (cut || stop_) continue;
    if (fds[1].revents & POLLIN) {
      while (true) {
        int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (client < 0) break;
        ++accepted_;
        int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (!target_ok ||
            ::connect(upstream, reinterpret_cast<sockaddr*>(&target), sizeof target) != 0) {
          // Nothing listens behind us: as the real port would, refuse.
          linger hard{1, 0};
          ::setsockopt(client, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
          ::close(client);
          ::close(upstream);
          continue;
        }
        int one = 1;
        ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_nonblocking(client);
        set_nonblocking(upstream);
        links.push_back(Link{client, upstream, {}, {}, false});
        ++open_;
      }
    }
    // Only the links polled above: those just accepted (appended at the
    // end) have no pollfd yet and wait for the next round.
    size_t index = 2;
    for (Link& link : links) {
      if (index + 1 >= fds.size()) break;
      short client_revents = fds[index].revents;
      short upstream_revents = fds[index + 1].revents;
      index += 2;
      bool ok = pump(link.client, link.upstream, link.up, client_revents, upstream_revents) &&
                pump(link.upstream, link.client, link.down, upstream_revents, client_revents);
      if ((client_revents & POLLERR) || (upstream_revents & POLLERR)) ok = false;
      // A side that hung up completely (POLLHUP: both directions) and whose
      // bytes we have all read cannot take part any more; without this the
      // hang-up would wake poll() forever.
      if ((client_revents & POLLHUP) && link.up.eof && link.up.queued() == 0) ok = false;
      if ((upstream_revents & POLLHUP) && link.down.eof && link.down.queued() == 0) ok = false;
      if (!ok || (link.up.shut && link.down.shut)) close_link(link);
    }
    for (auto it = links.begin(); it != links.end();) {
      if (it->dead) {
        it = links.erase(it);
        --open_;
      } else {
        ++it;
      }
    }
  }
  for (Link& link : links) close_link(link);
}

}  // namespace pmirror::testing
