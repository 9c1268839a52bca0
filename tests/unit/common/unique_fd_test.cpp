// The file descriptor owner (common/unique_fd.h): each descriptor closed
// exactly once, whatever path the owner takes.
#include "common/unique_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cerrno>

namespace pmirror {
namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

int open_null() {
  int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  return fd;
}

TEST(UniqueFd, ClosesWhenItGoes) {
  int raw = open_null();
  {
    UniqueFd fd(raw);
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(fd.get(), raw);
  }
  EXPECT_FALSE(is_open(raw));
}

TEST(UniqueFd, MoveHandsOverAndClosesOnlyOnce) {
  int raw = open_null();
  UniqueFd first(raw);
  UniqueFd second(std::move(first));
  EXPECT_FALSE(first.valid());  // moved from: holds nothing
  EXPECT_EQ(second.get(), raw);

  int other = open_null();
  UniqueFd third(other);
  third = std::move(second);  // closes what third held
  EXPECT_FALSE(is_open(other));
  EXPECT_TRUE(is_open(raw));
  EXPECT_EQ(third.get(), raw);
}

TEST(UniqueFd, ResetAndRelease) {
  int a = open_null(), b = open_null();
  UniqueFd fd(a);
  fd.reset(b);
  EXPECT_FALSE(is_open(a));
  EXPECT_EQ(fd.get(), b);
  int released = fd.release();
  EXPECT_EQ(released, b);
  EXPECT_FALSE(fd.valid());
  EXPECT_TRUE(is_open(b));  // no longer ours to close
  ::close(b);
  UniqueFd empty;
  EXPECT_FALSE(empty.valid());
  empty.reset();  // closing nothing is fine
}

}  // namespace
}  // namespace pmirror
