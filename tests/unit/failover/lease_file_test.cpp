// The lease deadline file (lib/failover/lease_file.h): what the promoter
// publishes, a reader in another mapping sees; files that are not this
// volume's lease on this node are refused, saying whose they are.
#include "failover/lease_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace pmirror::failover {
namespace {

namespace fs = std::filesystem;

class LeaseFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pmirror-lease-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "db1.lease").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::string path_;
};

TEST_F(LeaseFileTest, APublishedDeadlineIsSeenThroughAnotherMapping) {
  auto writer = LeaseFileWriter::create(path_, "db1", "a");
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  EXPECT_EQ(fs::file_size(path_), kLeaseFileSize);
  EXPECT_EQ(fs::status(path_).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                fs::perms::others_read);

  auto reader = LeaseFileReader::open(path_, "db1", "a");
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  EXPECT_EQ(reader->deadline_ns(), 0u) << "no lease before the first publish";
  EXPECT_FALSE(reader->holds_at(monotonic_now_ns()));
  EXPECT_EQ(reader->volume(), "db1");
  EXPECT_EQ(reader->node(), "a");
  EXPECT_EQ(reader->holder_pid(), ::getpid());

  const uint64_t now = monotonic_now_ns();
  const uint64_t deadline = now + 10'000'000'000ull;
  writer->publish(deadline, 0x7a3b1c);
  EXPECT_EQ(reader->deadline_ns(), deadline);
  EXPECT_EQ(reader->lease_id(), 0x7a3b1c);
  EXPECT_GT(reader->renewed_unix_ms(), 1'600'000'000'000);
  EXPECT_TRUE(reader->holds_at(now));
  EXPECT_TRUE(reader->holds_at(deadline - 1));
  EXPECT_FALSE(reader->holds_at(deadline)) << "the deadline itself is past the lease";

  // A second reader (another process maps it the same way), and the
  // writer gone: what was published stays.
  auto second = LeaseFileReader::open(path_, "db1", "");
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  writer = Status(Errc::kClosed, "gone");
  EXPECT_EQ(second->deadline_ns(), deadline);
  EXPECT_EQ(reader->deadline_ns(), deadline);
}

TEST_F(LeaseFileTest, WithdrawEndsTheLeaseAtOnceAndARestartedPromoterStartsWithNone) {
  auto writer = LeaseFileWriter::create(path_, "db1", "a");
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  auto reader = LeaseFileReader::open(path_, "db1", "a");
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  writer->publish(monotonic_now_ns() + 10'000'000'000ull, 5);
  ASSERT_TRUE(reader->holds_at(monotonic_now_ns()));
  writer->withdraw();
  EXPECT_EQ(reader->deadline_ns(), 0u);
  EXPECT_FALSE(reader->holds_at(monotonic_now_ns()));
  EXPECT_EQ(reader->lease_id(), 0);

  writer->publish(monotonic_now_ns() + 10'000'000'000ull, 6);
  ASSERT_TRUE(reader->holds_at(monotonic_now_ns()));
  writer->publish(0, 6);  // 0 is withdraw
  EXPECT_FALSE(reader->holds_at(monotonic_now_ns()));

  writer->publish(monotonic_now_ns() + 10'000'000'000ull, 7);
  auto restarted = LeaseFileWriter::create(path_, "db1", "a");
  ASSERT_TRUE(restarted.ok()) << restarted.status().to_string();
  EXPECT_EQ(reader->deadline_ns(), 0u) << "a new promoter holds no lease until it publishes";
}

TEST_F(LeaseFileTest, AnotherVolumesOrNodesFileIsRefusedSayingWhoseItIs) {
  ASSERT_TRUE(LeaseFileWriter::create(path_, "db2", "b").ok());
  auto volume = LeaseFileReader::open(path_, "db1", "b");
  ASSERT_FALSE(volume.ok());
  EXPECT_EQ(volume.status().code(), Errc::kFailedPrecondition);
  EXPECT_EQ(volume.status().message(),
            "lease file " + path_ + " belongs to volume db2 on node b, not volume db1 on node b");
  auto node = LeaseFileReader::open(path_, "db2", "a");
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().message(),
            "lease file " + path_ + " belongs to volume db2 on node b, not volume db2 on node a");
}

TEST_F(LeaseFileTest, NamesOfTheFullSixtyFourBytesFitAndLongerOnesAreRefused) {
  const std::string longest(64, 'v');
  ASSERT_TRUE(LeaseFileWriter::create(path_, longest, "a").ok());
  auto reader = LeaseFileReader::open(path_, longest, "a");
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  EXPECT_EQ(reader->volume(), longest);
  auto too_long = LeaseFileWriter::create(path_, longest + "v", "a");
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), Errc::kInvalidArgument);
  EXPECT_FALSE(LeaseFileWriter::create(path_, "db1", "").ok());
}

TEST_F(LeaseFileTest, AFileWithoutTheMagicIsNotALeaseFile) {
  {
    std::ofstream out(path_, std::ios::binary);
    std::string page(kLeaseFileSize, '\0');
    std::memcpy(page.data(), "PMLEASE0", 8);
    out << page;
  }
  auto reader = LeaseFileReader::open(path_, "db1", "a");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(reader.status().message(),
            "lease file " + path_ +
                " is not a lease file (no PMLEASE1 magic; pmirror-promoter writes it)");
}

TEST_F(LeaseFileTest, ALayoutOfAnotherVersionIsRefused) {
  ASSERT_TRUE(LeaseFileWriter::create(path_, "db1", "a").ok());
  {
    std::fstream io(path_, std::ios::binary | std::ios::in | std::ios::out);
    const uint32_t version = 2;
    io.seekp(8);
    io.write(reinterpret_cast<const char*>(&version), sizeof version);
  }
  auto reader = LeaseFileReader::open(path_, "db1", "a");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(reader.status().message().find("has layout version 2; this libpmirror reads version 1"),
            std::string::npos)
      << reader.status().message();
}

TEST_F(LeaseFileTest, AShortFileIsNotALeaseFile) {
  {
    std::ofstream out(path_, std::ios::binary);
    out << "PMLEASE1";
  }
  auto reader = LeaseFileReader::open(path_, "db1", "a");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(reader.status().message(),
            "lease file " + path_ + " is not a lease file: 8 bytes, not 4096");
}

TEST_F(LeaseFileTest, AMissingFileIsNotFound) {
  auto reader = LeaseFileReader::open(path_, "db1", "a");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), Errc::kNotFound);
  EXPECT_EQ(reader.status().message(), "lease file " + path_ + " does not exist");
}

TEST_F(LeaseFileTest, AMissingDirectoryIsNamedAndNotCreated) {
  const std::string path = (dir_ / "missing" / "db1.lease").string();
  auto writer = LeaseFileWriter::create(path, "db1", "a");
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), Errc::kNotFound);
  EXPECT_EQ(writer.status().message(),
            "lease file " + path + ": the directory " + (dir_ / "missing").string() +
                " does not exist (pmirror-promoter does not create it: it is /run/pmirror, made "
                "by the unit's RuntimeDirectory=, or daemon.lease_dir)");
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
}

}  // namespace
}  // namespace pmirror::failover
