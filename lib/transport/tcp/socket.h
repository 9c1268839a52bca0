// Small socket helpers for the tcp transport: address formatting,
// whole-buffer I/O (descriptors are owned by common/unique_fd.h).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace pmirror::transport::tcp {

using Clock = std::chrono::steady_clock;

// "1.2.3.4:5" or "[::1]:5".
std::string format_address(const sockaddr* addr, socklen_t len);
std::string format_host_port(const std::string& host, uint16_t port);
std::string peer_name(int fd);

Status set_nodelay(int fd);
Status set_nonblocking(int fd, bool on);

// Waits until fd is readable (POLLIN) or writable (POLLOUT) or deadline.
// Returns kTimeout on expiry, errno status on failure.
Status wait_fd(int fd, short events, Clock::time_point deadline);

// Blocking-style I/O with a deadline on a non-blocking socket (handshake).
Status send_all_deadline(int fd, const void* data, size_t len, Clock::time_point deadline);
Status recv_all_deadline(int fd, void* data, size_t len, Clock::time_point deadline);

// Writes every byte described by iov (modified in place) to a blocking
// socket. Returns 0 or the errno that stopped it.
int sendv_all(int fd, iovec* iov, int iovcnt);
// One sendmsg that never blocks: how many bytes the kernel took (0 when its
// buffer is full), or -errno.
ssize_t sendv_nowait(int fd, const iovec* iov, size_t iovcnt);
// Appends to `out` the bytes of iov after the first `skip` (what a partial
// send left).
void copy_unsent(const iovec* iov, size_t iovcnt, size_t skip, std::vector<std::byte>& out);

}  // namespace pmirror::transport::tcp
