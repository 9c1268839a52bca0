#include "systemd/systemd.h"

#include <spdlog/sinks/systemd_sink.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>

#include "common/log.h"

namespace pmirror::systemd {

namespace {

void send(const std::string& message) {
  if (!notify_socket_set()) return;
  int rc = sd_notify(0, message.c_str());
  if (rc < 0) {
    log::debug("sd_notify({}): {}", message.substr(0, message.find('\n')), std::strerror(-rc));
  }
}

std::string one_line(std::string_view text) {
  std::string line(text);
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return line;
}

}  // namespace

bool notify_socket_set() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && socket[0] != '\0';
}

bool stderr_is_journal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long device = 0, inode = 0;
  char end = '\0';
  if (std::sscanf(stream, "%llu:%llu%c", &device, &inode, &end) != 2) return false;
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) != 0) return false;
  return st.st_dev == device && st.st_ino == inode;
}

std::shared_ptr<spdlog::sinks::sink> journal_sink(const std::string& identifier) {
  return std::make_shared<spdlog::sinks::systemd_sink_mt>(identifier);
}

void notify_ready(std::string_view status) {
  if (status.empty()) {
    send("READY=1");
  } else {
    send("READY=1\nSTATUS=" + one_line(status));
  }
}

void notify_status(std::string_view text) { send("STATUS=" + one_line(text)); }

void notify_reloading() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  uint64_t usec =
      static_cast<uint64_t>(now.tv_sec) * 1000000u + static_cast<uint64_t>(now.tv_nsec) / 1000u;
  send("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec));
}

void notify_stopping() { send("STOPPING=1"); }

void notify_watchdog() { send("WATCHDOG=1"); }

std::optional<std::chrono::microseconds> watchdog_interval() {
  if (!notify_socket_set()) return std::nullopt;
  uint64_t usec = 0;
  // unset_environment = 0: WATCHDOG_USEC stays for anyone else who asks.
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::nullopt;
  return std::chrono::microseconds(usec);
}

WatchdogPinger::WatchdogPinger(std::function<bool()> healthy) : healthy_(std::move(healthy)) {
  auto interval = watchdog_interval();
  if (!interval) return;
  period_ = *interval / 2;
  start();
}

WatchdogPinger::WatchdogPinger(std::chrono::microseconds interval, std::function<bool()> healthy)
    : healthy_(std::move(healthy)), period_(interval / 2) {
  if (period_.count() <= 0) return;
  start();
}

void WatchdogPinger::start() {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    // Out of threads: no pings, so systemd restarts us -- better than an abort.
    log::error(
        "watchdog: cannot start the ping thread: {}; systemd's watchdog will restart the "
        "service",
        e.what());
  }
}

WatchdogPinger::~WatchdogPinger() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WatchdogPinger::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    if (!healthy_ || healthy_()) {
      notify_watchdog();
    } else {
      log::warn("watchdog: not healthy, withholding the ping");
    }
    lock.lock();
    wake_.wait_for(lock, period_, [this] { return stop_; });
  }
}

}  // namespace pmirror::systemd
