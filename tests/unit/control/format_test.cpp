// pmirrorctl's presentation, against golden strings.
#include <gtest/gtest.h>

#include "control/control.h"
#include "unit/control/canned.h"

namespace pmirror::control {
namespace {

using json = nlohmann::json;

HumanFormat at(const char* now) {
  HumanFormat format;
  format.now = *parse_time(now);
  format.utc = true;
  return format;
}

TEST(ControlFormat, StatusGolden) {
  json merged = merge_status({testing::initiator_status(), testing::daemon_status()});
  EXPECT_EQ(format_status_human(merged, std::nullopt, at("2026-11-29T16:03:15Z")),
            testing::kHumanStatus);
}

TEST(ControlFormat, StatusFilteredByVolume) {
  json merged = merge_status({testing::initiator_status(), testing::daemon_status()});
  EXPECT_EQ(format_status_human(merged, "db1", at("2026-11-29T16:03:15Z")),
            "db1 role:replica size:256MiB backing:devdax generation:3 last-seq:4567 (pmirrord "
            "node2)\n"
            "  app1@10.0.0.1 connection:connected since 2026-11-28 09:00:00 (1d ago) "
            "persists:4567\n");
  EXPECT_EQ(format_status_human(merged, "nope", at("2026-11-29T16:03:15Z")), "");
}

TEST(ControlFormat, ProcessWithoutVolumesAndMissingFields) {
  json merged = merge_status({json{{"process", {{"kind", "pmirrord"}, {"pid", 7}}}},
                              json{{"volumes", {{{"name", "v"}, {"peers", {json::object()}}}}}}});
  EXPECT_EQ(format_status_human(merged, std::nullopt, at("2026-11-29T16:03:15Z")),
            "v (process)\n"
            "  ? connection:unknown\n"
            "(pmirrord, pid 7: no volumes)\n");
}

TEST(ControlFormat, MergeKeepsOrderAndFilters) {
  json merged = merge_status({testing::initiator_status(), testing::daemon_status()});
  EXPECT_EQ(merged["schema_version"], 1);
  ASSERT_EQ(merged["processes"].size(), 2u);
  EXPECT_EQ(merged["processes"][0], testing::initiator_status());
  EXPECT_EQ(merged["processes"][1], testing::daemon_status());
  EXPECT_EQ(volume_names(merged), (std::vector<std::string>{"db0", "db1", "db2"}));

  json only = merge_status({testing::initiator_status(), testing::daemon_status()}, "db2");
  ASSERT_EQ(only["processes"].size(), 1u);
  EXPECT_EQ(only["processes"][0]["process"]["kind"], "pmirrord");
  ASSERT_EQ(only["processes"][0]["volumes"].size(), 1u);
  EXPECT_EQ(only["processes"][0]["volumes"][0]["name"], "db2");
  EXPECT_TRUE(merge_status({testing::daemon_status()}, "zz")["processes"].empty());
}

TEST(ControlFormat, Events) {
  HumanFormat format = at("2026-11-29T16:03:15Z");
  EXPECT_EQ(format_event_human(json::parse(R"({"time":"2026-11-29T16:01:02Z","process":"pmirrord",
      "node":"node2","volume":"db0","peer":"node2","from":"connected","to":"disconnected",
      "reason":"nothing heard for 5000 ms"})"),
                               format),
            "16:01:02 db0 node2: connected -> disconnected (nothing heard for 5000 ms)");
  EXPECT_EQ(format_event_human(
                json::parse(R"({"time":"2026-11-29T16:01:03Z","volume":"db0","to":"connecting"})"),
                format),
            "16:01:03 db0: connecting");
  EXPECT_EQ(format_event_human(json::parse(R"({"dropped":12})"), format),
            "16:03:15 (12 event(s) dropped: pmirrorctl did not keep up)");
  EXPECT_EQ(format_event_human(
                json::parse(R"({"time":"2026-11-29T16:01:04Z","message":"checkpoint"})"), format),
            "16:01:04 checkpoint");
}

TEST(ControlFormat, Sizes) {
  EXPECT_EQ(format_size(0), "0B");
  EXPECT_EQ(format_size(100), "100B");
  EXPECT_EQ(format_size(4096), "4KiB");
  EXPECT_EQ(format_size(64ull << 20), "64MiB");
  EXPECT_EQ(format_size(1ull << 30), "1GiB");
  EXPECT_EQ(format_size(3ull << 29), "1.5GiB");
  EXPECT_EQ(format_size(2ull << 40), "2TiB");
}

TEST(ControlFormat, Latencies) {
  EXPECT_EQ(format_latency_us(55.1), "55us");
  EXPECT_EQ(format_latency_us(0.4), "0us");
  EXPECT_EQ(format_latency_us(1234), "1.2ms");
  EXPECT_EQ(format_latency_us(2500000), "2.5s");
}

TEST(ControlFormat, Times) {
  auto t = parse_time("2026-11-29T16:01:02Z");
  ASSERT_TRUE(t);
  EXPECT_EQ(format_time(*t), "2026-11-29T16:01:02Z");
  auto fraction = parse_time("2026-11-29T16:01:02.5Z");
  ASSERT_TRUE(fraction);
  EXPECT_EQ(*fraction - *t, std::chrono::milliseconds(500));
  EXPECT_TRUE(parse_time("2026-11-29T16:01:02+00:00"));
  EXPECT_FALSE(parse_time("2026-11-29 16:01:02"));
  EXPECT_FALSE(parse_time("yesterday"));
  EXPECT_FALSE(parse_time("2026-11-29T16:01:02+02:00"));
}

}  // namespace
}  // namespace pmirror::control
