#include <gtest/gtest.h>

#include <cstring>

#include <pmirror/pmirror.h>
#include "support/daemon_process.h"

extern "C" int c_api_mirror(const char* local_path, uint16_t port, const char* secret,
                            char* error, size_t error_size);
extern "C" int c_api_open_null(void);

namespace pmirror {
namespace {

TEST(CApiTest, MirrorsWritesFromC) {
  testing::TempDir tmp;
  testing::DaemonProcess target(tmp.path().string(),
                                {{"vol", tmp.file("replica.img"), 1 << 20}});
  ASSERT_TRUE(target.start()) << target.log();
  char error[512] = "";
  ASSERT_EQ(c_api_mirror(tmp.file("local.img").c_str(), target.port(),
                         "correct horse battery staple", error, sizeof error),
            0)
      << error;
  auto replica = testing::read_file(tmp.file("replica.img"));
  ASSERT_EQ(replica.size(), 1u << 20);
  EXPECT_EQ(std::memcmp(replica.data() + 4096, "hello from C", 13), 0);
  EXPECT_EQ(std::memcmp(replica.data() + 8192, "hello from C", 13), 0);
}

TEST(CApiTest, NullArgumentsAreErrorsNotCrashes) {
  EXPECT_EQ(c_api_open_null(), -PMIRROR_E_INVALID_ARGUMENT);
  EXPECT_NE(std::strlen(pmirror_errormsg()), 0u);
  EXPECT_EQ(pmirror_persist(nullptr, 0, 1), -PMIRROR_E_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace pmirror
