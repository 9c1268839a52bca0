#include "common/rfc3339.h"

#include <cstdint>
#include <cstdio>
#include <ctime>

namespace pmirror {

namespace {
using Clock = std::chrono::system_clock;
}  // namespace

std::string format_rfc3339(Clock::time_point time) {
  std::time_t t = Clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char out[32];
  size_t n = std::strftime(out, sizeof out, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string(out, n);
}

std::optional<Clock::time_point> parse_rfc3339(std::string_view input) {
  if (input.size() < 20) return std::nullopt;
  std::string text(input);
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6 ||
      consumed != 19) {
    return std::nullopt;
  }
  std::string_view rest = std::string_view(text).substr(19);
  std::chrono::microseconds fraction{0};
  if (!rest.empty() && rest.front() == '.') {
    rest.remove_prefix(1);
    int64_t micros = 0;
    int digits = 0;
    while (!rest.empty() && rest.front() >= '0' && rest.front() <= '9') {
      if (digits < 6) {
        micros = micros * 10 + (rest.front() - '0');
        ++digits;
      }
      rest.remove_prefix(1);
    }
    while (digits++ < 6) micros *= 10;
    fraction = std::chrono::microseconds(micros);
  }
  if (rest != "Z" && rest != "+00:00") return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  std::time_t seconds = timegm(&tm);
  if (seconds == static_cast<std::time_t>(-1)) return std::nullopt;
  // A time the clock cannot hold (before 1677 or after 2262 with
  // nanoseconds) would overflow in from_time_t: not a time a server sends.
  using std::chrono::duration_cast;
  constexpr auto kLimit = duration_cast<std::chrono::seconds>(Clock::duration::max()).count() - 1;
  if (seconds < -kLimit || seconds > kLimit) return std::nullopt;
  return Clock::from_time_t(seconds) + fraction;
}

}  // namespace pmirror
