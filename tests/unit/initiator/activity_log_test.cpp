// The activity log as the persist pipeline uses it, over a real metadata
// pool: extents are logged before their persists, and a slot is given up
// only by an extent whose last persist is settled.
#include "initiator/activity_log.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace pmirror::initiator {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kExtent = metadata::kActivityExtent;
constexpr uint64_t kSlots = metadata::kActivityLogSlots;

class ActivityLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string templ = (base / "pmirror-activity-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
    metadata::CopyMetadata::Options options;
    options.path = (dir_ / "copy.pmirror").string();
    options.volume_size = 2 * kSlots * kExtent;  // more extents than slots
    options.chunk_size = 1 << 20;
    auto meta = metadata::CopyMetadata::open(options);
    ASSERT_TRUE(meta.ok()) << meta.status().to_string();
    meta_ = std::move(meta).value();
  }
  void TearDown() override {
    meta_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::vector<uint64_t> logged() const {
    auto extents = meta_->activity_extents();
    std::sort(extents.begin(), extents.end());
    return extents;
  }

  fs::path dir_;
  std::unique_ptr<metadata::CopyMetadata> meta_;
};

TEST_F(ActivityLogTest, ExtentsAreLoggedOnceBeforeTheirPersists) {
  ActivityLog log(*meta_, "v");
  EXPECT_FALSE(log.covers(0, 1));
  // A range across two extents.
  ASSERT_TRUE(log.add(kExtent - 8, 16, 0).ok());
  log.note(1, kExtent - 8, 16);
  EXPECT_EQ(logged(), (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(log.covers(0, 2 * kExtent));
  EXPECT_FALSE(log.covers(0, 2 * kExtent + 1));
}

TEST_F(ActivityLogTest, OnlyExtentsWhosePersistsAreSettledGiveUpTheirSlot) {
  ActivityLog log(*meta_, "v");
  for (uint64_t extent = 0; extent < kSlots; ++extent) {
    ASSERT_TRUE(log.add(extent * kExtent, 1, 0).ok());
    log.note(extent + 1, extent * kExtent, 1);  // persist extent+1 touches it
  }
  ASSERT_EQ(logged().size(), kSlots);
  // Full, and nothing settled: refused, the log unchanged.
  Status full = log.add(kSlots * kExtent, 1, 0);
  EXPECT_EQ(full.code(), Errc::kResourceExhausted) << full.to_string();
  EXPECT_NE(full.message().find("activity log of 'v'"), std::string::npos) << full.message();
  EXPECT_EQ(logged().size(), kSlots);
  // Persists up to 3 settled: extents 0..2 may make room.
  ASSERT_TRUE(log.add(kSlots * kExtent, 1, 3).ok());
  log.note(kSlots + 1, kSlots * kExtent, 1);
  auto now = logged();
  EXPECT_EQ(now.size(), kSlots);
  EXPECT_TRUE(std::binary_search(now.begin(), now.end(), kSlots));
  uint64_t evicted = 0;
  for (uint64_t extent = 0; extent < kSlots; ++extent) {
    if (!std::binary_search(now.begin(), now.end(), extent)) {
      EXPECT_LT(extent, 3u) << "extent " << extent << " still had a persist in flight";
      EXPECT_FALSE(log.covers(extent * kExtent, 1));
      ++evicted;
    }
  }
  EXPECT_EQ(evicted, 1u);
}

}  // namespace
}  // namespace pmirror::initiator
