// Rate-limited reporting of events that strangers can cause at will
// (connection floods, bad hellos, failed authentications): the first
// `burst` of each interval are logged one by one, the rest only counted and
// summed up once per interval, so a flood costs a bounded number of log
// lines whatever its size. Not thread-safe: one per thread or under a lock.
//
//   LogLimiter refused(std::chrono::seconds(10), 5);
//   if (refused.count()) log::warn("{}: refused: ...", who);
//   ...
//   if (auto n = refused.unreported()) log::warn("... {} more refused in the last 10 s", n);
#pragma once

#include <chrono>
#include <cstdint>

namespace pmirror {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(10),
                      uint32_t burst = 5)
      : interval_(interval), burst_(burst) {}

  // Counts one event; true when it may be logged on its own.
  bool count(Clock::time_point now = Clock::now()) {
    roll(now);
    ++total_;
    if (logged_ < burst_) {
      ++logged_;
      return true;
    }
    // The first unlogged event of a quiet spell starts the summary's interval.
    if (unreported_++ == 0 && now - last_summary_ >= interval_) last_summary_ = now;
    return false;
  }

  // How many events were counted but not logged since the last summary,
  // at most once per interval (0 otherwise): call it regularly and log the
  // sum when it is not 0.
  uint64_t unreported(Clock::time_point now = Clock::now()) {
    if (unreported_ == 0 || now - last_summary_ < interval_) return 0;
    last_summary_ = now;
    uint64_t n = unreported_;
    unreported_ = 0;
    return n;
  }

  uint64_t total() const { return total_; }
  std::chrono::milliseconds interval() const { return interval_; }

 private:
  void roll(Clock::time_point now) {
    if (now - window_start_ >= interval_) {
      window_start_ = now;
      logged_ = 0;
    }
  }

  std::chrono::milliseconds interval_;
  uint32_t burst_;
  Clock::time_point window_start_{};
  Clock::time_point last_summary_{};
  uint32_t logged_ = 0;
  uint64_t unreported_ = 0;
  uint64_t total_ = 0;
};

}  // namespace pmirror
