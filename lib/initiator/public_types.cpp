// The free functions of the public C++ API (include/pmirror/pmirror.hpp)
// that belong to no object.
#include <algorithm>
#include <pmirror/pmirror.hpp>

#include "common/log.h"

namespace pmirror {

std::string_view replica_state_name(ReplicaState state) {
  switch (state) {
    case ReplicaState::kConnected:
      return "connected";
    case ReplicaState::kFailed:
      return "failed";
    case ReplicaState::kClosed:
      return "closed";
  }
  return "unknown";
}

// LogLevel's values are spdlog's, in the same order.
static_assert(static_cast<int>(LogLevel::kTrace) == spdlog::level::trace);
static_assert(static_cast<int>(LogLevel::kOff) == spdlog::level::off);

void set_log_function(LogFunction function) {
  if (!function) {
    log::set_function({});
    return;
  }
  log::set_function(
      [function = std::move(function)](spdlog::level::level_enum level, std::string_view message) {
        function(static_cast<LogLevel>(level), message);
      });
}

void set_log_threshold(LogLevel threshold) {
  int level = std::clamp(static_cast<int>(threshold), static_cast<int>(LogLevel::kTrace),
                         static_cast<int>(LogLevel::kOff));
  log::set_level(static_cast<spdlog::level::level_enum>(level));
}

}  // namespace pmirror
