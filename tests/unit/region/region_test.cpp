#include "region/region.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "support/small_filesystem.h"

// Write-back errors on demand: Region persists a plain file with
// pmem_msync, which this definition interposes (the executable's symbol
// wins over libpmem's). 0: the real one.
std::atomic<int> g_msync_errno{0};

extern "C" int pmem_msync(const void* addr, size_t len) {
  if (int err = g_msync_errno.load(); err != 0) {
    errno = err;
    return -1;
  }
  using Fn = int (*)(const void*, size_t);
  static Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "pmem_msync"));
  return real(addr, len);
}

namespace pmirror::region {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1024 * 1024;

class RegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "pmirror-region-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static void write_file(const std::string& p, size_t bytes) {
    std::ofstream out(p, std::ios::binary);
    std::vector<char> zeros(bytes, 'x');
    out.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }

  fs::path dir_;
};

TEST_F(RegionTest, CreateMakesAFullyAllocatedFileOfRequestedSize) {
  auto r = Region::open({.path = path("vol"), .size = 64 * kMiB, .create = true});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Region& region = **r;
  EXPECT_EQ(region.size(), 64 * kMiB);
  EXPECT_NE(region.data(), nullptr);
  EXPECT_EQ(region.path(), path("vol"));

  struct stat st {};
  ASSERT_EQ(::stat(path("vol").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 64 * kMiB);
  // Every block allocated: a store can never meet a hole the file system
  // has no room for (SIGBUS).
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 64 * kMiB);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(RegionTest, PlainTmpFileIsNotPmem) {
  // The test's temp dir lives on tmpfs or a disk filesystem, never DAX.
  auto r = Region::open({.path = path("vol"), .size = kMiB, .create = true});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE((*r)->is_pmem());
  EXPECT_EQ((*r)->backing(), Backing::kPlainFile);
  EXPECT_EQ(backing_name((*r)->backing()), "plain file");
}

TEST_F(RegionTest, DataSurvivesReopen) {
  {
    auto r = Region::open({.path = path("vol"), .size = kMiB, .create = true});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::byte* data = (*r)->data();
    for (uint64_t i = 0; i < kMiB; i += 4096) data[i] = static_cast<std::byte>(i / 4096 + 1);
    std::memcpy(data + 12345, "hello", 5);
    ASSERT_TRUE((*r)->persist(0, kMiB).ok());
  }
  // size 0: take the existing size.
  auto r = Region::open({.path = path("vol")});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->size(), kMiB);
  const std::byte* data = (*r)->data();
  for (uint64_t i = 0; i < kMiB; i += 4096) {
    ASSERT_EQ(data[i], static_cast<std::byte>(i / 4096 + 1)) << "offset " << i;
  }
  EXPECT_EQ(std::memcmp(data + 12345, "hello", 5), 0);
}

TEST_F(RegionTest, CreateOnExistingFileOpensItWithoutTruncating) {
  {
    auto r = Region::open({.path = path("vol"), .size = kMiB, .create = true});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::memcpy((*r)->data() + 100, "keep", 4);
    ASSERT_TRUE((*r)->persist(100, 4).ok());
  }
  auto r = Region::open({.path = path("vol"), .size = kMiB, .create = true});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp((*r)->data() + 100, "keep", 4), 0);
}

TEST_F(RegionTest, MappingIsSharedWithTheFile) {
  auto r = Region::open({.path = path("vol"), .size = kMiB, .create = true});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::memcpy((*r)->data() + 8192, "shared", 6);
  ASSERT_TRUE((*r)->persist(8192, 6).ok());

  int fd = ::open(path("vol").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[6] = {};
  ASSERT_EQ(::pread(fd, buf, sizeof(buf), 8192), 6);
  ::close(fd);
  EXPECT_EQ(std::memcmp(buf, "shared", 6), 0);
}

TEST_F(RegionTest, SizeMismatchNamesBothSizes) {
  ASSERT_TRUE(Region::open({.path = path("vol"), .size = kMiB, .create = true}).ok());
  auto r = Region::open({.path = path("vol"), .size = 2 * kMiB});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(r.status().message().find("1048576"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("2097152"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(path("vol")), std::string::npos);
  // And the file was not resized.
  EXPECT_EQ(fs::file_size(path("vol")), kMiB);
}

TEST_F(RegionTest, MissingPathWithoutCreate) {
  auto r = Region::open({.path = path("nope"), .size = kMiB});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kNotFound);
  EXPECT_NE(r.status().message().find(path("nope")), std::string::npos);
  EXPECT_NE(r.status().message().find("create: true"), std::string::npos) << r.status().message();
  EXPECT_FALSE(fs::exists(path("nope")));
}

TEST_F(RegionTest, MissingParentDirectory) {
  std::string p = path("no/such/dir/vol");
  auto r = Region::open({.path = p, .size = kMiB, .create = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kNotFound);
  EXPECT_NE(r.status().message().find(path("no/such/dir")), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("mkdir -p"), std::string::npos);
}

TEST_F(RegionTest, CreateWithSizeZeroIsRejected) {
  auto r = Region::open({.path = path("vol"), .size = 0, .create = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(r.status().message().find("size 0"), std::string::npos) << r.status().message();
  EXPECT_FALSE(fs::exists(path("vol")));
}

TEST_F(RegionTest, SizeMustBeWholePages) {
  auto r = Region::open({.path = path("vol"), .size = 5000, .create = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(r.status().message().find("4096"), std::string::npos) << r.status().message();
  EXPECT_FALSE(fs::exists(path("vol")));

  write_file(path("odd"), 5000);
  auto odd = Region::open({.path = path("odd")});
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(odd.status().message().find("5000"), std::string::npos);
}

TEST_F(RegionTest, DirectoryIsRejected) {
  fs::create_directory(path("adir"));
  auto r = Region::open({.path = path("adir"), .size = kMiB, .create = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(r.status().message().find("is a directory"), std::string::npos) << r.status().message();
}

TEST_F(RegionTest, EmptyFileIsNotAVolume) {
  write_file(path("empty"), 0);
  auto r = Region::open({.path = path("empty"), .size = kMiB, .create = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(r.status().message().find("empty"), std::string::npos) << r.status().message();
  EXPECT_EQ(fs::file_size(path("empty")), 0u);  // never resized
}

TEST_F(RegionTest, FifoIsNotAVolume) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  auto r = Region::open({.path = path("fifo")});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a regular file or devdax"), std::string::npos)
      << r.status().message();
}

TEST_F(RegionTest, CharacterDeviceThatIsNotDaxIsRejected) {
  auto r = Region::open({.path = "/dev/null"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not devdax"), std::string::npos) << r.status().message();
}

TEST_F(RegionTest, BlockDeviceIsRejected) {
  std::string dev;
  for (const char* candidate : {"/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1"}) {
    struct stat st {};
    if (::stat(candidate, &st) == 0 && S_ISBLK(st.st_mode)) {
      dev = candidate;
      break;
    }
  }
  if (dev.empty()) GTEST_SKIP() << "no block device node found to test with";
  auto r = Region::open({.path = dev});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(r.status().message().find("block device"), std::string::npos) << r.status().message();
}

TEST_F(RegionTest, NoPermission) {
  ASSERT_TRUE(Region::open({.path = path("vol"), .size = kMiB, .create = true}).ok());
  ASSERT_EQ(::chmod(path("vol").c_str(), 0400), 0);
  if (::geteuid() != 0) {
    auto r = Region::open({.path = path("vol")});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Errc::kPermissionDenied);
    EXPECT_NE(r.status().message().find(path("vol")), std::string::npos);
    return;
  }
  // Root bypasses file modes, so drop to "nobody" in a child: the directory
  // is searchable (0755), the file is root's and read-only for its owner.
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(100);
    auto r = Region::open({.path = path("vol")});
    if (r.ok()) ::_exit(101);
    if (r.status().message().find(path("vol")) == std::string::npos) ::_exit(102);
    ::_exit(static_cast<int>(r.status().code()));
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  if (WEXITSTATUS(wstatus) == 100) GTEST_SKIP() << "cannot drop privileges to uid 65534 here";
  EXPECT_EQ(WEXITSTATUS(wstatus), static_cast<int>(Errc::kPermissionDenied))
      << "child exit code (101: open succeeded, 102: message lacks the path)";
}

TEST_F(RegionTest, PersistChecksBounds) {
  auto r = Region::open({.path = path("vol"), .size = kMiB, .create = true});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Region& region = **r;
  EXPECT_TRUE(region.persist(0, kMiB).ok());
  EXPECT_TRUE(region.persist(100, 10).ok());  // unaligned: msync needs page alignment
  EXPECT_TRUE(region.persist(kMiB, 0).ok());
  EXPECT_TRUE(region.persist(kMiB - 1, 1).ok());

  Status past_end = region.persist(kMiB - 1, 2);
  EXPECT_EQ(past_end.code(), Errc::kInvalidArgument);
  EXPECT_NE(past_end.message().find("outside"), std::string::npos) << past_end.message();
  EXPECT_EQ(region.persist(kMiB + 1, 0).code(), Errc::kInvalidArgument);
  // offset + len would wrap around.
  EXPECT_EQ(region.persist(std::numeric_limits<uint64_t>::max(), 2).code(), Errc::kInvalidArgument);
  EXPECT_EQ(region.persist(1, std::numeric_limits<uint64_t>::max()).code(), Errc::kInvalidArgument);

  EXPECT_TRUE(region.persist_range(region.data() + 4097, 3).ok());  // unaligned pointer
  EXPECT_EQ(region.persist_range(region.data() - 1, 1).code(), Errc::kInvalidArgument);
  EXPECT_FALSE(region.failed()) << "a caller's bad range is not the volume's failure";
}

TEST_F(RegionTest, OpenAllocatesTheHolesOfASparseFileAndKeepsItsData) {
  {
    std::ofstream out(path("sparse"), std::ios::binary);
    out.seekp(static_cast<std::streamoff>(3 * kMiB + 5));
    out.write("tail", 4);
    out.seekp(4096);
    out.write("head", 4);
  }
  ASSERT_EQ(::truncate(path("sparse").c_str(), 4 * kMiB), 0);
  struct stat before {};
  ASSERT_EQ(::stat(path("sparse").c_str(), &before), 0);
  ASSERT_LT(static_cast<uint64_t>(before.st_blocks) * 512, kMiB) << "the file is not sparse";

  auto r = Region::open({.path = path("sparse")});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  struct stat after {};
  ASSERT_EQ(::stat(path("sparse").c_str(), &after), 0);
  EXPECT_GE(static_cast<uint64_t>(after.st_blocks) * 512, 4 * kMiB);
  EXPECT_EQ(static_cast<uint64_t>(after.st_size), 4 * kMiB);
  EXPECT_EQ(std::memcmp((*r)->data() + 4096, "head", 4), 0);
  EXPECT_EQ(std::memcmp((*r)->data() + 3 * kMiB + 5, "tail", 4), 0);
}

using testing::SmallFilesystem;

TEST_F(RegionTest, AVolumeLargerThanTheFreeSpaceIsAnErrorAtCreateAndAtOpen) {
  SmallFilesystem small(path("small"), "2m");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << small.error();
  std::string vol = path("small") + "/vol";
  auto created = Region::open({.path = vol, .size = 16 * kMiB, .create = true, .name = "db0"});
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), Errc::kResourceExhausted);
  EXPECT_EQ(created.status().message(),
            "volume 'db0' (" + vol +
                "): cannot allocate 16777216 bytes: No space left on device; free space or lower "
                "size");
  EXPECT_FALSE(fs::exists(vol)) << "the file that could not be allocated was left behind";

  // An existing sparse file too large for what is free: its holes cannot be
  // allocated, so it is refused at open, not faulted on later.
  ASSERT_EQ(::close(::open(vol.c_str(), O_CREAT | O_WRONLY, 0600)), 0);
  ASSERT_EQ(::truncate(vol.c_str(), 16 * kMiB), 0);
  auto opened = Region::open({.path = vol, .size = 16 * kMiB, .name = "db0"});
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), Errc::kResourceExhausted);
  EXPECT_NE(opened.status().message().find("volume 'db0' (" + vol + "): cannot allocate "),
            std::string::npos)
      << opened.status().message();
  EXPECT_NE(opened.status().message().find("No space left on device"), std::string::npos);
  EXPECT_EQ(fs::file_size(vol), 16 * kMiB) << "an existing file is never resized or removed";
}

TEST_F(RegionTest, AFailedPersistFailsTheRegionUntilItIsReopened) {
  auto r = Region::open({.path = path("vol"), .size = kMiB, .create = true, .name = "db0"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Region& region = **r;
  ASSERT_TRUE(region.persist(0, 4096).ok());
  EXPECT_FALSE(region.failed());

  g_msync_errno = EIO;
  Status failed = region.persist(8192, 100);
  g_msync_errno = 0;
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), Errc::kIoError);
  EXPECT_EQ(failed.message(), "volume 'db0' (" + path("vol") +
                                  "): msync of [8192, +100) failed: Input/output error (errno 5); "
                                  "the data may not be durable");
  EXPECT_TRUE(region.failed());
  EXPECT_EQ(region.failure().message(), failed.message());

  // msync works again, but a write-back error is reported once: what it
  // lost is not reported again, so the region stays failed.
  Status later = region.persist(0, 4096);
  EXPECT_EQ(later.code(), Errc::kIoError);
  EXPECT_NE(later.message().find("failed earlier"), std::string::npos) << later.message();
  EXPECT_NE(later.message().find("Input/output error"), std::string::npos) << later.message();
  EXPECT_FALSE(region.persist_range(region.data(), 1).ok());

  // Reopened: a new mapping starts without the failure.
  r->reset();
  auto reopened = Region::open({.path = path("vol"), .name = "db0"});
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  EXPECT_FALSE((*reopened)->failed());
  EXPECT_TRUE((*reopened)->persist(0, 4096).ok());
}

TEST_F(RegionTest, AFaultInAGuardedAccessIsAnErrorOfThatVolume) {
  ASSERT_TRUE(fault::install_fault_handler().ok());
  auto r = Region::open({.path = path("vol"), .size = kMiB, .create = true, .name = "db0"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Region& region = **r;
  auto* target = reinterpret_cast<volatile char*>(region.data() + 8192 + 7);
  EXPECT_FALSE(fault::guarded(region.data(), region.size(), [&] { *target = 'x'; }));

  // The backing file loses its pages under the mapping.
  ASSERT_EQ(::truncate(path("vol").c_str(), 0), 0);
  auto fault = fault::guarded(region.data(), region.size(), [&] { *target = 'y'; });
  ASSERT_TRUE(fault.has_value()) << "the store into a truncated file did not fault";
  EXPECT_EQ(fault->address, reinterpret_cast<uintptr_t>(target));
  Status reported = fault::report(*fault);
  EXPECT_EQ(reported.code(), Errc::kIoError);
  EXPECT_EQ(reported.message(), "volume 'db0' (" + path("vol") +
                                    "): memory fault at offset 8199 (si_code BUS_ADRERR): the "
                                    "backing file was truncated or the medium failed");
  // The volume failed with it.
  EXPECT_TRUE(region.failed());
  EXPECT_EQ(region.failure().message(), reported.message());
  EXPECT_FALSE(region.persist(0, 4096).ok());

  // The thread goes on; guards work again (and nest).
  auto again = fault::guarded(region.data(), region.size(), [&] {
    auto inner = fault::guarded(region.data(), region.size(), [&] { *target = 'z'; });
    EXPECT_TRUE(inner.has_value());
  });
  EXPECT_FALSE(again.has_value()) << "the inner guard's fault reached the outer one";
}

TEST_F(RegionTest, EmptyPathIsRejected) {
  auto r = Region::open({.path = ""});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
}

}  // namespace
}  // namespace pmirror::region
