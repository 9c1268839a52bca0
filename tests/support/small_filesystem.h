// A small tmpfs mounted for the length of a test, to run out of space on
// purpose (root only: mounted() says whether it worked, error() why not).
#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace pmirror::testing {

class SmallFilesystem {
 public:
  // `size` as mount(8) takes it: "2m", "64k".
  SmallFilesystem(const std::string& dir, const std::string& size) : dir_(dir) {
    std::filesystem::create_directories(dir);
    const std::string options = "size=" + size;
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~SmallFilesystem() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  SmallFilesystem(const SmallFilesystem&) = delete;
  SmallFilesystem& operator=(const SmallFilesystem&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace pmirror::testing
