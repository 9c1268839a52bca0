// The built pmirrord speaks the sd_notify protocol: started with
// NOTIFY_SOCKET pointing at a socket this test reads (as systemd would for
// Type=notify), it sends READY=1 once it listens, STATUS= lines, WATCHDOG=1
// every half WATCHDOG_USEC, RELOADING=1 + READY=1 around a SIGHUP reload,
// and STOPPING=1 on SIGTERM.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "notify_listener.h"
#include "support/daemon_process.h"

namespace pmirror {
namespace {

using namespace std::chrono_literals;

// Collects datagrams on a thread; for READY=1 it also records whether the
// daemon had logged that it listens by then.
class Collector {
 public:
  explicit Collector(testing::DaemonProcess& daemon) : daemon_(daemon) {
    thread_ = std::thread([this] {
      while (!stop_) {
        auto message = listener_.receive(50ms);
        if (!message) continue;
        bool listening = daemon_.log().find("listening on") != std::string::npos;
        std::lock_guard lock(mutex_);
        messages_.push_back(*message);
        if (message->find("READY=1") != std::string::npos)
          ready_after_listening_.push_back(listening);
      }
    });
  }
  ~Collector() {
    stop_ = true;
    thread_.join();
  }
  const std::string& path() const { return listener_.path(); }

  std::vector<std::string> messages() {
    std::lock_guard lock(mutex_);
    return messages_;
  }
  std::vector<bool> ready_after_listening() {
    std::lock_guard lock(mutex_);
    return ready_after_listening_;
  }
  size_t count(const std::string& prefix) {
    size_t n = 0;
    for (const auto& m : messages()) n += m.rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
  }
  // Waits until `count(prefix) >= n`.
  bool wait_for(const std::string& prefix, size_t n, std::chrono::milliseconds timeout = 10s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (count(prefix) >= n) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

 private:
  testing::DaemonProcess& daemon_;
  testing::NotifyListener listener_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<std::string> messages_;
  std::vector<bool> ready_after_listening_;
  std::thread thread_;
};

std::string dump(const std::vector<std::string>& messages) {
  std::string out;
  for (const auto& m : messages) out += "[" + m + "]\n";
  return out;
}

TEST(NotifyProtocolTest, ReadyStatusWatchdogReloadStopping) {
  testing::TempDir tmp;
  testing::DaemonProcess daemon(tmp.path().string(),
                                {testing::VolumeSpec{"v0", tmp.file("v0.img"), 1 << 20}});
  Collector collector(daemon);
  daemon.env = {
      {"NOTIFY_SOCKET", collector.path()}, {"WATCHDOG_USEC", "500000"}, {"WATCHDOG_PID", "{pid}"}};
  ASSERT_TRUE(daemon.start()) << daemon.log();

  ASSERT_TRUE(collector.wait_for("READY=1", 1)) << dump(collector.messages()) << daemon.log();
  ASSERT_EQ(collector.ready_after_listening().size(), 1u);
  EXPECT_TRUE(collector.ready_after_listening()[0]) << "READY=1 came before the listener";
  // The status line names the node and what it serves.
  bool status_seen = false;
  for (const auto& m : collector.messages()) {
    auto at = m.find("STATUS=");
    if (at != std::string::npos && m.find("serving 1 volume(s)", at) != std::string::npos) {
      status_seen = true;
    }
  }
  EXPECT_TRUE(status_seen) << dump(collector.messages());

  // 500 ms watchdog: a ping every 250 ms.
  EXPECT_TRUE(collector.wait_for("WATCHDOG=1", 4, 3s)) << dump(collector.messages());

  // SIGHUP: RELOADING=1 (with MONOTONIC_USEC), then READY=1 again.
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  EXPECT_TRUE(collector.wait_for("RELOADING=1\nMONOTONIC_USEC=", 1)) << dump(collector.messages());
  EXPECT_TRUE(collector.wait_for("READY=1", 2)) << dump(collector.messages()) << daemon.log();
  EXPECT_TRUE(daemon.running());

  EXPECT_EQ(daemon.terminate(), 0) << daemon.log();
  EXPECT_TRUE(collector.wait_for("STOPPING=1", 1, 2s)) << dump(collector.messages());
  // After STOPPING=1 the daemon is gone: no more pings.
  size_t pings = collector.count("WATCHDOG=1");
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(collector.count("WATCHDOG=1"), pings);
}

TEST(NotifyProtocolTest, WithoutNotifySocketTheDaemonRunsAsBefore) {
  testing::TempDir tmp;
  testing::DaemonProcess daemon(tmp.path().string(),
                                {testing::VolumeSpec{"v0", tmp.file("v0.img"), 1 << 20}});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  EXPECT_EQ(daemon.terminate(), 0) << daemon.log();
}

}  // namespace
}  // namespace pmirror
