// The sd_notify wrappers against a socket this test reads.
#include "systemd/systemd.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "notify_listener.h"

namespace pmirror::systemd {
namespace {

using namespace std::chrono_literals;
using pmirror::testing::NotifyListener;

class SystemdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
    ::unsetenv("WATCHDOG_PID");
    ::unsetenv("JOURNAL_STREAM");
  }
  void TearDown() override { SetUp(); }
};

TEST_F(SystemdTest, WithoutNotifySocketEverythingIsANoOp) {
  EXPECT_FALSE(notify_socket_set());
  notify_ready("status");
  notify_status("status");
  notify_reloading();
  notify_stopping();
  notify_watchdog();
  ::setenv("WATCHDOG_USEC", "500000", 1);
  EXPECT_FALSE(watchdog_interval().has_value());
  WatchdogPinger pinger;
  EXPECT_FALSE(pinger.active());
}

// pmirrord logs to the journal only when its stderr is the journal's
// stream: JOURNAL_STREAM names stderr's device and inode, not another file.
TEST_F(SystemdTest, StderrIsTheJournalOnlyWhenJournalStreamNamesIt) {
  EXPECT_FALSE(stderr_is_journal());  // unset
  struct stat err {};
  ASSERT_EQ(::fstat(STDERR_FILENO, &err), 0);
  std::string self = std::to_string(err.st_dev) + ":" + std::to_string(err.st_ino);
  ::setenv("JOURNAL_STREAM", self.c_str(), 1);
  EXPECT_TRUE(stderr_is_journal());
  std::string other = std::to_string(err.st_dev) + ":" + std::to_string(err.st_ino + 1);
  ::setenv("JOURNAL_STREAM", other.c_str(), 1);
  EXPECT_FALSE(stderr_is_journal()) << "stderr was redirected elsewhere: not the journal";
  for (const char* bad : {"", "garbage", "1:", ":2", "1:2:3", "1:2x"}) {
    ::setenv("JOURNAL_STREAM", bad, 1);
    EXPECT_FALSE(stderr_is_journal()) << bad;
  }
}

TEST_F(SystemdTest, MessagesReachTheSocket) {
  NotifyListener listener;
  ::setenv("NOTIFY_SOCKET", listener.path().c_str(), 1);
  ASSERT_TRUE(notify_socket_set());

  notify_ready();
  EXPECT_EQ(listener.receive(1s), "READY=1");
  notify_ready("serving 2 volumes");
  EXPECT_EQ(listener.receive(1s), "READY=1\nSTATUS=serving 2 volumes");
  notify_status("two\nlines");
  EXPECT_EQ(listener.receive(1s), "STATUS=two lines");
  notify_stopping();
  EXPECT_EQ(listener.receive(1s), "STOPPING=1");
  notify_watchdog();
  EXPECT_EQ(listener.receive(1s), "WATCHDOG=1");

  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  notify_reloading();
  auto reloading = listener.receive(1s);
  ASSERT_TRUE(reloading.has_value());
  const std::string prefix = "RELOADING=1\nMONOTONIC_USEC=";
  ASSERT_EQ(reloading->rfind(prefix, 0), 0u) << *reloading;
  uint64_t usec = std::stoull(reloading->substr(prefix.size()));
  uint64_t before = static_cast<uint64_t>(now.tv_sec) * 1000000u + now.tv_nsec / 1000u;
  EXPECT_GE(usec, before);
  EXPECT_LT(usec, before + 5000000u);
}

TEST_F(SystemdTest, AnUnreachableSocketIsIgnored) {
  ::setenv("NOTIFY_SOCKET", "/nonexistent/notify.sock", 1);
  notify_ready("x");  // logs at debug level, does not throw or abort
  notify_watchdog();
}

TEST_F(SystemdTest, WatchdogIntervalHonoursWatchdogPid) {
  NotifyListener listener;
  ::setenv("NOTIFY_SOCKET", listener.path().c_str(), 1);
  EXPECT_FALSE(watchdog_interval().has_value());  // WatchdogSec= unset

  ::setenv("WATCHDOG_USEC", "500000", 1);
  EXPECT_EQ(watchdog_interval(), std::chrono::microseconds(500000));
  ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  EXPECT_EQ(watchdog_interval(), std::chrono::microseconds(500000));
  // Meant for another process (a parent that exec'd without clearing it).
  ::setenv("WATCHDOG_PID", std::to_string(::getpid() + 1).c_str(), 1);
  EXPECT_FALSE(watchdog_interval().has_value());
}

TEST_F(SystemdTest, PingerPingsEveryHalfIntervalAndStopsPromptly) {
  NotifyListener listener;
  ::setenv("NOTIFY_SOCKET", listener.path().c_str(), 1);
  ::setenv("WATCHDOG_USEC", "200000", 1);
  ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  auto start = std::chrono::steady_clock::now();
  {
    WatchdogPinger pinger;
    ASSERT_TRUE(pinger.active());
    EXPECT_EQ(pinger.period(), std::chrono::microseconds(100000));
    for (int i = 0; i < 4; ++i) EXPECT_EQ(listener.receive(1s), "WATCHDOG=1") << i;
  }
  // Four pings at 100 ms: the first at once, the fourth after ~300 ms.
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, 250ms);
  EXPECT_LT(elapsed, 2s);

  // A long interval: the destructor does not wait it out.
  start = std::chrono::steady_clock::now();
  {
    WatchdogPinger pinger(std::chrono::seconds(60), {});
    EXPECT_EQ(listener.receive(1s), "WATCHDOG=1");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_FALSE(listener.receive(200ms).has_value());
}

TEST_F(SystemdTest, AnUnhealthyProcessIsNotPinged) {
  NotifyListener listener;
  ::setenv("NOTIFY_SOCKET", listener.path().c_str(), 1);
  std::atomic<bool> healthy{false};
  WatchdogPinger pinger(std::chrono::milliseconds(100), [&] { return healthy.load(); });
  EXPECT_FALSE(listener.receive(300ms).has_value());
  healthy = true;
  EXPECT_EQ(listener.receive(1s), "WATCHDOG=1");
}

}  // namespace
}  // namespace pmirror::systemd
