// pmirror's logger (common/log.h): its own, never spdlog's default logger,
// which belongs to the application.
#include "common/log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

namespace pmirror {
namespace {

TEST(Log, ParseLevelNamesEveryThresholdAndNothingElse) {
  EXPECT_EQ(log::parse_level("trace"), spdlog::level::trace);
  EXPECT_EQ(log::parse_level("debug"), spdlog::level::debug);
  EXPECT_EQ(log::parse_level("info"), spdlog::level::info);
  EXPECT_EQ(log::parse_level("warn"), spdlog::level::warn);
  EXPECT_EQ(log::parse_level("warning"), spdlog::level::warn);
  EXPECT_EQ(log::parse_level("error"), spdlog::level::err);
  EXPECT_EQ(log::parse_level("critical"), spdlog::level::critical);
  EXPECT_EQ(log::parse_level("off"), spdlog::level::off);
  EXPECT_FALSE(log::parse_level("INFO"));
  EXPECT_FALSE(log::parse_level("verbose"));
  EXPECT_FALSE(log::parse_level(""));
}

TEST(Log, LinesGoToPmirrorsLoggerNotSpdlogsDefault) {
  std::ostringstream ours, applications;
  auto application = std::make_shared<spdlog::logger>(
      "application", std::make_shared<spdlog::sinks::ostream_sink_mt>(applications));
  auto previous_default = spdlog::default_logger();
  spdlog::set_default_logger(application);
  auto logger = std::make_shared<spdlog::logger>(
      "pmirror-test", std::make_shared<spdlog::sinks::ostream_sink_mt>(ours));
  logger->set_pattern("%l: %v");
  log::set(logger);

  log::set_level(spdlog::level::info);
  log::info("volume {}: replica {}: connected", "db0", "node2");
  log::debug("below the threshold");
  log::set_level(spdlog::level::warn);
  log::info("dropped at warn");
  log::warn("kept at warn");

  spdlog::set_default_logger(previous_default);
  log::set(std::make_shared<spdlog::logger>("pmirror-test-done"));  // `ours` goes away
  EXPECT_EQ(ours.str(), "info: volume db0: replica node2: connected\nwarning: kept at warn\n");
  EXPECT_EQ(applications.str(), "");
}

}  // namespace
}  // namespace pmirror
