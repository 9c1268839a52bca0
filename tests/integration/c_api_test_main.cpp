#include <gtest/gtest.h>
#include <pmirror/pmirror.h>

#include <cstring>

#include "support/daemon_process.h"

extern "C" int c_api_mirror(const char* local_path, uint16_t port, const char* secret, char* error,
                            size_t error_size);
extern "C" int c_api_open_from_config(const char* config_path, char* error, size_t error_size);
extern "C" int c_api_cfg_rejects_bad_values(char* error, size_t error_size);
extern "C" int c_api_names_every_error(char* error, size_t error_size);
extern "C" int c_api_version(char* error, size_t error_size);
extern "C" int c_api_open_null(void);
extern "C" int c_api_no_replicas(const char* local_path, char* error, size_t error_size);
extern "C" int c_api_log_function(const char* first_path, const char* second_path, uint16_t port,
                                  const char* secret, char* error, size_t error_size);

namespace pmirror {
namespace {

bool bytes_at(const std::vector<uint8_t>& file, size_t offset, const char* text) {
  size_t n = std::strlen(text) + 1;
  return file.size() >= offset + n && std::memcmp(file.data() + offset, text, n) == 0;
}

TEST(CApiTest, MirrorsWritesFromC) {
  testing::TempDir tmp;
  testing::DaemonProcess target(tmp.path().string(), {{"vol", tmp.file("replica.img"), 1 << 20}});
  ASSERT_TRUE(target.start()) << target.log();
  char error[1024] = "";
  ASSERT_EQ(c_api_mirror(tmp.file("local.img").c_str(), target.port(),
                         "correct horse battery staple", error, sizeof error),
            0)
      << error;
  auto replica = testing::read_file(tmp.file("replica.img"));
  ASSERT_EQ(replica.size(), 1u << 20);
  EXPECT_TRUE(bytes_at(replica, 4096, "hello from C"));
  EXPECT_TRUE(bytes_at(replica, 8192, "hello from C"));
  // Never persisted: it reached the replica through verify's mark_dirty
  // and the resync that followed.
  EXPECT_TRUE(bytes_at(replica, 200000, "stored, never persisted"));
  EXPECT_EQ(replica, testing::read_file(tmp.file("local.img")));
}

TEST(CApiTest, OpensFromTheClusterFile) {
  testing::TempDir tmp;
  testing::DaemonProcess target(tmp.path().string(), {{"vol", tmp.file("replica.img"), 1 << 20}});
  ASSERT_TRUE(target.start()) << target.log();
  char error[1024] = "";
  ASSERT_EQ(c_api_open_from_config(target.config_path().c_str(), error, sizeof error), 0) << error;
  EXPECT_TRUE(
      bytes_at(testing::read_file(tmp.file("replica.img")), 12288, "hello from the cluster file"));
}

TEST(CApiTest, TheApplicationsLogFunctionGetsTheLinesAboveItsThreshold) {
  testing::TempDir tmp;
  testing::DaemonProcess target(tmp.path().string(), {{"vol", tmp.file("replica.img"), 1 << 20},
                                                      {"vol2", tmp.file("replica2.img"), 1 << 20}});
  ASSERT_TRUE(target.start()) << target.log();
  char error[1024] = "";
  EXPECT_EQ(c_api_log_function(tmp.file("first.img").c_str(), tmp.file("second.img").c_str(),
                               target.port(), "correct horse battery staple", error, sizeof error),
            0)
      << error;
}

TEST(CApiTest, CfgRefusesBadValuesWithAMessage) {
  char error[1024] = "";
  EXPECT_EQ(c_api_cfg_rejects_bad_values(error, sizeof error), 0) << error;
}

TEST(CApiTest, EveryErrorCodeHasAName) {
  char error[1024] = "";
  EXPECT_EQ(c_api_names_every_error(error, sizeof error), 0) << error;
}

TEST(CApiTest, ReportsItsVersion) {
  char error[1024] = "";
  EXPECT_EQ(c_api_version(error, sizeof error), 0) << error;
}

TEST(CApiTest, AVolumeWithNoReplicaOpensButSaysItMirrorsNothing) {
  testing::TempDir tmp;
  char error[1024] = "";
  EXPECT_EQ(c_api_no_replicas(tmp.file("alone.img").c_str(), error, sizeof error), 0) << error;
}

TEST(CApiTest, NullArgumentsAreErrorsNotCrashes) {
  EXPECT_EQ(c_api_open_null(), -PMIRROR_E_INVALID_ARGUMENT);
  EXPECT_NE(std::strlen(pmirror_errormsg()), 0u);
  EXPECT_EQ(pmirror_persist(nullptr, 0, 1), -PMIRROR_E_INVALID_ARGUMENT);
  EXPECT_EQ(pmirror_close(nullptr), -PMIRROR_E_INVALID_ARGUMENT);
  char* json = nullptr;
  EXPECT_EQ(pmirror_status(nullptr, &json), -PMIRROR_E_INVALID_ARGUMENT);
  EXPECT_EQ(json, nullptr);
  EXPECT_EQ(pmirror_resync(nullptr, "x", false), -PMIRROR_E_INVALID_ARGUMENT);
  pmirror_verify_result* result = nullptr;
  EXPECT_EQ(pmirror_verify(nullptr, nullptr, false, &result), -PMIRROR_E_INVALID_ARGUMENT);
  EXPECT_EQ(result, nullptr);
  size_t count = 0;
  EXPECT_EQ(pmirror_verify_result_get_peer_count(nullptr, &count), -PMIRROR_E_INVALID_ARGUMENT);
  EXPECT_EQ(pmirror_data(nullptr), nullptr);
  EXPECT_EQ(pmirror_size(nullptr), 0u);
  EXPECT_FALSE(pmirror_is_pmem(nullptr));
}

}  // namespace
}  // namespace pmirror
