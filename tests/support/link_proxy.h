// A TCP forwarder that can cut the link without closing anything: what 100%
// packet loss looks like to the two ends. While blackholed it accepts no
// connection and reads or writes nothing in either direction; bytes already
// sent stay queued in the kernel's socket buffers and FINs/RSTs are not
// passed on, so neither end learns anything until its own timers fire. On
// restore everything queued flows again, in order -- as TCP retransmission
// would deliver it once the link is back.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace pmirror::testing {

class LinkProxy {
 public:
  // Listens on listen_host:listen_port (0: a free port) and forwards every
  // connection to target_host:target_port. nullptr with *error set on failure.
  static std::unique_ptr<LinkProxy> start(const std::string& listen_host, uint16_t listen_port,
                                          const std::string& target_host, uint16_t target_port,
                                          std::string* error);
  ~LinkProxy();
  LinkProxy(const LinkProxy&) = delete;
  LinkProxy& operator=(const LinkProxy&) = delete;

  uint16_t port() const { return port_; }
  void set_blackhole(bool on);
  bool blackholed() const { return blackhole_.load(); }

  uint64_t connections_accepted() const { return accepted_.load(); }
  uint64_t bytes_forwarded() const { return forwarded_.load(); }
  uint64_t open_connections() const { return open_.load(); }

 private:
  LinkProxy() = default;
  void run();

  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::string target_host_;
  uint16_t target_port_ = 0;
  std::atomic<bool> blackhole_{false};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> forwarded_{0};
  std::atomic<uint64_t> open_{0};
  std::thread thread_;
};

}  // namespace pmirror::testing
