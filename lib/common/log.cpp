#include "common/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace pmirror::log {
namespace {

std::mutex g_mutex;
// Not registered with spdlog: an application's spdlog::set_level or
// drop_all leaves it alone, and two copies of this file in one process
// (a program linking libpmirror.so and pmirror's static libraries) do not
// clash over one name.
std::shared_ptr<spdlog::logger> g_logger;         // guarded by g_mutex
std::atomic<spdlog::logger*> g_current{nullptr};  // g_logger, for the lock-free path

// Hands each line's text to the application's function. No lock of its
// own beyond base_sink's: spdlog's sinks serialise their calls, so the
// function sees one line at a time.
class FunctionSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FunctionSink(Function function) : function_(std::move(function)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    function_(msg.level, std::string_view(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override {}

 private:
  Function function_;
};

std::shared_ptr<spdlog::logger> to_stderr() {
  auto logger = std::make_shared<spdlog::logger>("pmirror",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e pmirror %l: %v");
  return logger;
}

std::shared_ptr<spdlog::logger> from_environment() {
  auto logger = to_stderr();
  logger->set_level(spdlog::level::info);
  if (const char* env = std::getenv("PMIRROR_LOG_LEVEL"); env != nullptr && *env != '\0') {
    if (auto level = parse_level(env)) {
      logger->set_level(*level);
    } else {
      logger->warn(
          "PMIRROR_LOG_LEVEL={} is not a level (trace, debug, info, warn, error, critical, "
          "off); logging at info",
          env);
    }
  }
  return logger;
}

}  // namespace

std::optional<spdlog::level::level_enum> parse_level(std::string_view name) {
  for (auto [text, level] : {std::pair{"trace", spdlog::level::trace},
                             {"debug", spdlog::level::debug},
                             {"info", spdlog::level::info},
                             {"warn", spdlog::level::warn},
                             {"warning", spdlog::level::warn},
                             {"error", spdlog::level::err},
                             {"critical", spdlog::level::critical},
                             {"off", spdlog::level::off}}) {
    if (name == text) return level;
  }
  return std::nullopt;
}

spdlog::logger& get() {
  if (auto* current = g_current.load(std::memory_order_acquire)) return *current;
  std::lock_guard lock(g_mutex);
  if (g_logger == nullptr) {
    g_logger = from_environment();
    g_current.store(g_logger.get(), std::memory_order_release);
  }
  return *g_logger;
}

void set(std::shared_ptr<spdlog::logger> logger) {
  std::lock_guard lock(g_mutex);
  // The old logger is kept alive: another thread may be writing to it.
  static std::vector<std::shared_ptr<spdlog::logger>> retired;
  if (g_logger != nullptr) retired.push_back(g_logger);
  g_logger = std::move(logger);
  g_current.store(g_logger.get(), std::memory_order_release);
}

void set_level(spdlog::level::level_enum level) { get().set_level(level); }

spdlog::level::level_enum level() { return get().level(); }

void set_function(Function function) {
  spdlog::level::level_enum threshold = level();
  std::shared_ptr<spdlog::logger> logger;
  if (function) {
    logger = std::make_shared<spdlog::logger>("pmirror",
                                              std::make_shared<FunctionSink>(std::move(function)));
  } else {
    logger = to_stderr();
  }
  logger->set_level(threshold);
  set(std::move(logger));
}

}  // namespace pmirror::log
