// pmirror's logger. Every component logs through it, never through spdlog's
// default logger: that one belongs to the application that links
// libpmirror (whose stdout it writes to, and which may use spdlog itself).
//
// Unless a program installs its own (pmirrord does: journald or a
// terminal), the logger writes to stderr at the threshold that the
// environment variable PMIRROR_LOG_LEVEL names: trace, debug, info (the
// default), warn, error, critical or off.
//
//   log::warn("volume {}: replica {} is lagging", name, peer);
#pragma once

#include <spdlog/spdlog.h>

#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

namespace pmirror::log {

// The logger, made on first use from PMIRROR_LOG_LEVEL.
spdlog::logger& get();
// Replaces it (pmirrord, tests): its sinks, threshold and pattern.
void set(std::shared_ptr<spdlog::logger> logger);
void set_level(spdlog::level::level_enum level);
spdlog::level::level_enum level();

// Sends every line at or above the current threshold to `function` instead
// of stderr (the application's choice: pmirror_log_set_function). The
// message is the bare text, without time stamp or level: the function adds
// what its own log wants. It may be called from any of libpmirror's threads,
// concurrently; it must not log through pmirror itself. An empty function
// puts stderr back. The threshold is kept.
using Function = std::function<void(spdlog::level::level_enum level, std::string_view message)>;
void set_function(Function function);

// The threshold a PMIRROR_LOG_LEVEL value names; nullopt when it names none.
std::optional<spdlog::level::level_enum> parse_level(std::string_view name);

template <typename... Args>
void trace(spdlog::format_string_t<Args...> format, Args&&... args) {
  get().trace(format, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(spdlog::format_string_t<Args...> format, Args&&... args) {
  get().debug(format, std::forward<Args>(args)...);
}
template <typename... Args>
void info(spdlog::format_string_t<Args...> format, Args&&... args) {
  get().info(format, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> format, Args&&... args) {
  get().warn(format, std::forward<Args>(args)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> format, Args&&... args) {
  get().error(format, std::forward<Args>(args)...);
}
template <typename... Args>
void critical(spdlog::format_string_t<Args...> format, Args&&... args) {
  get().critical(format, std::forward<Args>(args)...);
}

}  // namespace pmirror::log
