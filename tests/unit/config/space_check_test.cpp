// `config check` reports volumes that do not fit on their file system:
// volumes are allocated in full, so what they still need (all of a file to
// be created, the holes of an existing one) is summed per file system and
// compared with its free space.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"

namespace pmirror::config {
namespace {

namespace fs = std::filesystem;

class SpaceCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "pmirror-space-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    if (mounted_) ::umount2(small_.c_str(), MNT_DETACH);
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // A tmpfs of `size` at dir/small; false (and a reason) without root.
  bool mount_small(const std::string& size) {
    small_ = dir_ + "/small";
    fs::create_directories(small_);
    mounted_ = ::mount("tmpfs", small_.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    if (!mounted_) mount_error_ = std::strerror(errno);
    return mounted_;
  }

  // Nodes n1 (primary) and n2 (replica); each volume {name, n2's path, size}.
  std::string write_config(const std::vector<std::vector<std::string>>& volumes) {
    // The state pool where the checks find its directory whoever runs them.
    std::string text =
        "daemon:\n"
        "  state_pool: " +
        dir_ +
        "/pmirrord.state\n"
        "nodes:\n"
        "  - {name: n1, address: 10.0.0.1}\n"
        "  - {name: n2, address: 10.0.0.2}\n"
        "volumes:\n";
    for (const auto& v : volumes) {
      text += "  - name: " + v[0] + "\n" + "    size: " + v[2] + "\n" +
              "    primary: n1\n"
              "    replicas: [n2]\n"
              "    paths: {n1: /pmem/" +
              v[0] + ", n2: " + v[1] + "}\n" +
              "    create: true\n"
              "    allowed_peers: [app]\n"
              "    secret: 0123456789abcdef\n";
    }
    std::string path = dir_ + "/cluster.yaml";
    std::ofstream(path) << text;
    return path;
  }

  std::string dir_;
  std::string small_;
  bool mounted_ = false;
  std::string mount_error_;
};

uint64_t free_bytes(const std::string& path) {
  struct statvfs vfs {};
  EXPECT_EQ(::statvfs(path.c_str(), &vfs), 0);
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

// Without root: ask for more than the temp folder's file system has free.
TEST_F(SpaceCheckTest, AVolumeLargerThanTheFreeSpaceIsReportedWithBothNumbers) {
  uint64_t free = free_bytes(dir_);
  uint64_t size = (free + (1ull << 30)) / 4096 * 4096;  // 1 GiB more than is free
  std::string vol = dir_ + "/v.img";
  std::string file = write_config({{"v", vol, std::to_string(size)}});
  auto problems = check_cluster_file(file, "n2");
  ASSERT_EQ(problems.size(), 1u) << ::testing::PrintToString(problems);
  const std::string& p = problems[0];
  EXPECT_EQ(p.rfind(file + ":", 0), 0u) << p;
  EXPECT_NE(p.find("volumes[0].paths.n2: volume 'v' (" + vol + ") needs " + std::to_string(size) +
                   " bytes"),
            std::string::npos)
      << p;
  // The free space moves with the machine's other writers: read it back.
  auto only = p.find("but only ");
  ASSERT_NE(only, std::string::npos) << p;
  uint64_t reported = std::strtoull(p.c_str() + only + 9, nullptr, 10);
  EXPECT_LT(reported, size) << p;
  EXPECT_GT(reported + (1ull << 30), free) << p;
  EXPECT_NE(p.find("free space or lower size"), std::string::npos) << p;

  // Another node (n1 holds /pmem/v, not on this machine) has no space to
  // find (only, where /pmem is missing, that directory).
  for (const auto& other : check_cluster_file(file, "n1")) {
    EXPECT_EQ(other.find(" needs "), std::string::npos) << other;
  }
  // A size that fits is fine.
  std::string fits = write_config({{"v", vol, "1MiB"}});
  EXPECT_TRUE(check_cluster_file(fits, "n2").empty()) << check_cluster_file(fits, "n2")[0];
}

// Exact numbers on a tmpfs: what existing files already hold is not needed
// again, their holes are, and volumes on one file system add up.
TEST_F(SpaceCheckTest, VolumesOnOneFileSystemAddUpAndExistingBlocksCount) {
  if (!mount_small("8m")) GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << mount_error_;
  std::string a = small_ + "/a.img", b = small_ + "/b.img", c = small_ + "/c.img";
  {
    // a: 6 MiB, fully written (allocated).
    std::ofstream out(a, std::ios::binary);
    std::string mib(1 << 20, 'x');
    for (int i = 0; i < 6; ++i) out << mib;
  }
  ASSERT_EQ(free_bytes(small_), 2u << 20);

  // b (to be created, 1 MiB) fits next to a.
  std::string file = write_config({{"a", a, "6MiB"}, {"b", b, "1MiB"}});
  EXPECT_TRUE(check_cluster_file(file, "n2").empty()) << check_cluster_file(file, "n2")[0];

  // b (2 MiB) and c (an existing sparse 1 MiB file) need 3 MiB, 2 MiB are free.
  ASSERT_EQ(::close(::creat(c.c_str(), 0600)), 0);
  ASSERT_EQ(::truncate(c.c_str(), 1 << 20), 0);
  file = write_config({{"a", a, "6MiB"}, {"b", b, "2MiB"}, {"c", c, "1MiB"}});
  auto problems = check_cluster_file(file, "n2");
  ASSERT_EQ(problems.size(), 2u) << ::testing::PrintToString(problems);
  EXPECT_NE(problems[0].find("volumes[1].paths.n2: volume 'b' (" + b +
                             ") needs 2097152 bytes (2.0 MiB) on the file system of " + small_),
            std::string::npos)
      << problems[0];
  EXPECT_NE(
      problems[1].find("volumes[2].paths.n2: volume 'c' (" + c + ") needs 1048576 bytes (1.0 MiB)"),
      std::string::npos)
      << problems[1];
  for (const auto& p : problems) {
    EXPECT_NE(p.find("where 2 volumes need 3145728 bytes (3.0 MiB) in all, but only 2097152 "
                     "bytes (2.0 MiB) are free there"),
              std::string::npos)
        << p;
  }
}

}  // namespace
}  // namespace pmirror::config
