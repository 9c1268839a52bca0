#include "state/pool_file.h"

#include <fcntl.h>
#include <libpmemobj.h>
#include <systemd/sd-id128.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
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

std::string read_name(const char* field, size_t field_size) {
  return std::string(field, strnlen(field, field_size));
}

std::string pmemobj_reason(int err) {
  const char* msg = pmemobj_errormsg();
  if (msg != nullptr && *msg != '\0') return msg;
  return std::strerror(err);
}

std::array<uint8_t, 16> random_uuid() {
  sd_id128_t id;
  std::array<uint8_t, 16> uuid{};
  if (sd_id128_randomize(&id) == 0) {
    std::memcpy(uuid.data(), id.bytes, uuid.size());
    return uuid;  // already version 4, RFC 4122 variant
  }
  std::random_device rd;  // no kernel random source: never seen, but not fatal
  for (auto& b : uuid) b = static_cast<uint8_t>(rd());
  uuid[6] = static_cast<uint8_t>((uuid[6] & 0x0f) | 0x40);  // version 4
  uuid[8] = static_cast<uint8_t>((uuid[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return uuid;
}

}  // namespace pmirror::state
