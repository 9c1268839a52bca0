#include "state/pool_file.h"

#include <fcntl.h>
#include <libpmemobj.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

namespace pmirror::state {

Status precheck_pool_file(const std::string& path, const struct stat& st,
                          const PoolFileNames& names) {
  if (!S_ISREG(st.st_mode)) return Status::Ok();  // devdax: cannot read(2) it; trust libpmemobj
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == EACCES || err == EPERM) return names.permission_error(path, std::strerror(err));
    return errno_status(Errc::kIoError, "cannot read " + names.noun + " " + path, err);
  }
  char sig[11] = {};
  ssize_t got = ::pread(fd, sig, sizeof(sig), 0);
  ::close(fd);
  std::string_view head(sig, got > 0 ? static_cast<size_t>(got) : 0);
  if (head.starts_with("PMEMPOOLSET")) return Status::Ok();
  std::string_view signature = head.substr(0, std::min<size_t>(8, head.size()));
  signature = signature.substr(0, strnlen(signature.data(), signature.size()));
  const std::string not_pool = names.noun + " " + path + " is not a libpmemobj pool";
  if (static_cast<uint64_t>(st.st_size) < PMEMOBJ_MIN_POOL) {
    return Status(Errc::kInvalidArgument, not_pool + " (" + std::to_string(st.st_size) +
                                              " bytes, smaller than any pool)" + names.what_to_do);
  }
  if (signature.starts_with("PMEM") && signature != "PMEMOBJ") {
    return Status(Errc::kInvalidArgument, not_pool + " but a " + std::string(signature) +
                                              " pool of another library" + names.what_to_do);
  }
  if (signature != "PMEMOBJ") {
    return Status(Errc::kInvalidArgument, not_pool + " (no PMEMOBJ signature)" + names.what_to_do);
  }
  return Status::Ok();
}

}  // namespace pmirror::state
