// systemd integration for pmirrord (Type=notify): thin wrappers over
// libsystemd's sd_notify (sd-daemon.h) and a watchdog pinger.
//
// Every function is a no-op when the process was not started by systemd
// (NOTIFY_SOCKET unset), so the daemon calls them unconditionally. Failures
// to reach the notify socket are logged at debug level and otherwise
// ignored: the service manager's own timeouts report a daemon that never
// became ready, and a daemon must not stop serving because its supervisor's
// socket went away.
//
// The protocol, as pmirrord uses it (docs/operations.md):
//   READY=1       once every volume is mapped and the listener accepts
//   STATUS=...    a one-line summary, shown by `systemctl status`
//   RELOADING=1   + MONOTONIC_USEC= when a SIGHUP reload starts; READY=1 ends it
//   STOPPING=1    when SIGTERM/SIGINT starts the shutdown
//   WATCHDOG=1    every half WatchdogSec= while the daemon is healthy
#pragma once

#include <spdlog/sinks/sink.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

namespace pmirror::systemd {

// True when NOTIFY_SOCKET is set (the service manager listens).
bool notify_socket_set();

// True when stderr is the journal's stream (systemd started us with
// StandardError=journal): JOURNAL_STREAM names stderr's device and inode.
// Then logging straight to the journal keeps each line's priority, which a
// plain line on stderr loses (systemd.exec(5), "JOURNAL_STREAM").
bool stderr_is_journal();
// A sink that writes each line to the journal with its syslog priority
// (trace and debug: LOG_DEBUG ... critical: LOG_CRIT) and
// SYSLOG_IDENTIFIER=`identifier`.
std::shared_ptr<spdlog::sinks::sink> journal_sink(const std::string& identifier);

// READY=1, with STATUS=<status> in the same datagram when status is not empty.
void notify_ready(std::string_view status = {});
// STATUS=<text>; newlines are replaced by spaces (the protocol is line based).
void notify_status(std::string_view text);
// RELOADING=1 and MONOTONIC_USEC=<CLOCK_MONOTONIC now> (systemd >= 253 wants
// the time stamp for Type=notify-reload; 252 ignores it). Send READY=1 when
// the reload is done.
void notify_reloading();
// STOPPING=1.
void notify_stopping();
// WATCHDOG=1.
void notify_watchdog();

// WatchdogSec= as the service manager passed it (WATCHDOG_USEC, honoured
// only when WATCHDOG_PID is unset or this process); nullopt when the
// watchdog is off or NOTIFY_SOCKET is unset.
std::optional<std::chrono::microseconds> watchdog_interval();

// Sends WATCHDOG=1 every half interval from its own thread while it lives.
// `healthy`, if given, is asked before each ping; while it answers false no
// ping is sent, so systemd restarts a daemon that is alive but wedged. The
// destructor stops the thread promptly (it does not wait out an interval).
// Does nothing (no thread) when the watchdog is off.
class WatchdogPinger {
 public:
  explicit WatchdogPinger(std::function<bool()> healthy = {});
  // For tests: an explicit interval instead of watchdog_interval().
  WatchdogPinger(std::chrono::microseconds interval, std::function<bool()> healthy);
  ~WatchdogPinger();
  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

  bool active() const { return thread_.joinable(); }
  std::chrono::microseconds period() const { return period_; }

 private:
  void start();
  void run();

  std::function<bool()> healthy_;
  std::chrono::microseconds period_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pmirror::systemd
