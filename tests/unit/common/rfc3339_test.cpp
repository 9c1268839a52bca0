// RFC 3339 times as the control socket carries them (common/rfc3339.h).
#include "common/rfc3339.h"

#include <gtest/gtest.h>

namespace pmirror {
namespace {

TEST(Rfc3339, FormatsUtcWholeSeconds) {
  auto t = std::chrono::system_clock::from_time_t(1790000000);
  EXPECT_EQ(format_rfc3339(t), "2026-09-21T14:13:20Z");
  // The fraction is dropped, not rounded.
  EXPECT_EQ(format_rfc3339(t + std::chrono::milliseconds(999)), "2026-09-21T14:13:20Z");
}

TEST(Rfc3339, ParsesWhatItFormatsAndAFraction) {
  auto t = parse_rfc3339("2026-11-29T16:01:02Z");
  ASSERT_TRUE(t);
  EXPECT_EQ(format_rfc3339(*t), "2026-11-29T16:01:02Z");
  auto fraction = parse_rfc3339("2026-11-29T16:01:02.5Z");
  ASSERT_TRUE(fraction);
  EXPECT_EQ(*fraction - *t, std::chrono::milliseconds(500));
  auto offset = parse_rfc3339("2026-11-29T16:01:02+00:00");
  ASSERT_TRUE(offset);
  EXPECT_EQ(*offset, *t);
}

TEST(Rfc3339, RefusesOtherShapes) {
  EXPECT_FALSE(parse_rfc3339("2026-11-29 16:01:02"));
  EXPECT_FALSE(parse_rfc3339("yesterday"));
  EXPECT_FALSE(parse_rfc3339(""));
  EXPECT_FALSE(parse_rfc3339("2026-11-29T16:01:02+02:00"));  // UTC only
  EXPECT_FALSE(parse_rfc3339("2026-11-29T16:01:02Zjunk"));
}

// Beyond what the clock holds: refused, not an overflow (found by
// tests/fuzz/control_fuzz; UBSan reported it in from_time_t).
TEST(Rfc3339, RefusesTimesTheClockCannotHold) {
  EXPECT_FALSE(parse_rfc3339("-999-11-29T16:01:02Z"));
  EXPECT_FALSE(parse_rfc3339("9999-11-29T16:01:02Z"));
  EXPECT_TRUE(parse_rfc3339("2200-01-01T00:00:00Z"));
}

}  // namespace
}  // namespace pmirror
