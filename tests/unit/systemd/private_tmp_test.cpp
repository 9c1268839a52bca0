// PrivateTmp= detection: which configured paths lie in the service's own
// /tmp or /var/tmp, read from mountinfo as systemd 252 leaves it.
#include "systemd/private_tmp.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace pmirror::systemd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// / on ext4, /tmp a tmpfs; then PrivateTmp='s two bind mounts: /tmp from
// the tmpfs, /var/tmp from the root file system.
constexpr const char* kPrivateTmp =
    "26 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
    "27 26 0:30 / /tmp rw,nosuid,nodev shared:12 - tmpfs tmpfs rw\n"
    "28 26 259:2 / /mnt/pmem0 rw,relatime shared:20 - ext4 /dev/pmem0 rw,dax=always\n"
    "612 27 0:30 /systemd-private-0b1c2d3e4f-pmirrord.service-Qx9Lmz/tmp /tmp "
    "rw,nosuid,nodev shared:301 - tmpfs tmpfs rw\n"
    "613 26 253:1 /var/tmp/systemd-private-0b1c2d3e4f-pmirrord.service-Zr3Kw1/tmp /var/tmp "
    "rw,relatime shared:302 - ext4 /dev/vda1 rw\n";
// The same host without PrivateTmp: /tmp is the host's tmpfs.
constexpr const char* kSharedTmp =
    "26 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
    "27 26 0:30 / /tmp rw,nosuid,nodev shared:12 - tmpfs tmpfs rw\n";

TEST(PrivateTmp, PathsUnderThePrivateFoldersAreFound) {
  EXPECT_EQ(private_tmp_mount(kPrivateTmp, "/tmp/db0.img"), "/tmp");
  EXPECT_EQ(private_tmp_mount(kPrivateTmp, "/tmp/a/b/db0.img"), "/tmp");
  EXPECT_EQ(private_tmp_mount(kPrivateTmp, "/var/tmp/db0.img"), "/var/tmp");
}

TEST(PrivateTmp, OtherPathsAndASharedTmpAreNot) {
  EXPECT_EQ(private_tmp_mount(kPrivateTmp, "/mnt/pmem0/db0.img"), "");
  EXPECT_EQ(private_tmp_mount(kPrivateTmp, "/var/lib/pmirror/pmirrord.state"), "");
  EXPECT_EQ(private_tmp_mount(kPrivateTmp, "/tmpfoo/db0.img"), "");  // not under /tmp
  EXPECT_EQ(private_tmp_mount(kSharedTmp, "/tmp/db0.img"), "");
  EXPECT_EQ(private_tmp_mount(kSharedTmp, "/var/tmp/db0.img"), "");
}

TEST(PrivateTmp, AMountPointWithASpaceIsUnescaped) {
  const std::string mountinfo =
      std::string(kSharedTmp) +
      "700 26 0:40 /systemd-private-1-x.service-y/tmp /srv/scratch\\040space rw - tmpfs tmpfs rw\n";
  EXPECT_EQ(private_tmp_mount(mountinfo, "/srv/scratch space/v.img"), "/srv/scratch space");
  EXPECT_EQ(private_tmp_mount(mountinfo, "/srv/scratch/v.img"), "");
}

TEST(PrivateTmp, OneWarningPerPathInAPrivateFolderSayingWhatToDo) {
  const auto warnings = private_tmp_warnings({{"volume db0", "/tmp/db0.img"},
                                              {"volume db0's metadata", "/mnt/pmem0/db0.pmirror"},
                                              {"the state pool", "/var/tmp/pmirrord.state"},
                                              {"volume db1's metadata", ""}},
                                             kPrivateTmp);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_THAT(warnings[0], HasSubstr("volume db0: /tmp/db0.img is in this service's private /tmp "
                                     "(systemd's PrivateTmp=)"));
  EXPECT_THAT(warnings[0], HasSubstr("systemd deletes it when pmirrord stops"));
  EXPECT_THAT(warnings[0], HasSubstr("set PrivateTmp=no in a drop-in"));
  EXPECT_THAT(warnings[1], HasSubstr("the state pool: /var/tmp/pmirrord.state is in this "
                                     "service's private /var/tmp"));
  EXPECT_THAT(private_tmp_warnings({{"volume db0", "/tmp/db0.img"}}, kSharedTmp), ElementsAre());
}

}  // namespace
}  // namespace pmirror::systemd
