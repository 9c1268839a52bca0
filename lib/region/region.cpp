#include "region/region.h"

#include <libpmem.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

namespace pmirror::region {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Maps an errno from stat/open/mmap to the error class callers act on.
Errc errc_for(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return Errc::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS:
      return Errc::kPermissionDenied;
    case EEXIST:
      return Errc::kAlreadyExists;
    case EINVAL:
      return Errc::kInvalidArgument;
    case ENOMEM:
    case ENOSPC:
      return Errc::kResourceExhausted;
    case EBUSY:
    case ETXTBSY:
      return Errc::kBusy;
    default:
      return Errc::kIoError;
  }
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// libpmem's own message is more specific than strerror when it has one
// (e.g. which step of pmem_map_file failed).
std::string pmem_reason(int err) {
  const char* msg = pmem_errormsg();
  if (msg != nullptr && *msg != '\0') return msg;
  return errno_text(err);
}

std::string permission_hint(const std::string& path) {
  return "check that the user pmirror runs as (uid " + std::to_string(::geteuid()) +
         ") can read and write " + path + " and search its directories, and that the " +
         "filesystem is not mounted read-only";
}

// A character device is devdax when sysfs files it under the dax subsystem
// (/sys/class/dax on older kernels, /sys/bus/dax on newer: both end "/dax").
bool is_devdax(const struct stat& st, std::string* subsystem_out) {
  std::string link = "/sys/dev/char/" + std::to_string(major(st.st_rdev)) + ":" +
                     std::to_string(minor(st.st_rdev)) + "/subsystem";
  char resolved[PATH_MAX];
  if (::realpath(link.c_str(), resolved) == nullptr) {
    *subsystem_out = "(none)";
    return false;
  }
  std::string subsystem(resolved);
  *subsystem_out = subsystem;
  auto slash = subsystem.find_last_of('/');
  return subsystem.substr(slash == std::string::npos ? 0 : slash + 1) == "dax";
}

Status check_page_multiple(const std::string& path, uint64_t size, const char* what) {
  if (size % kPageSize != 0) {
    return Status(Errc::kInvalidArgument, std::string(what) + " of volume " + path + " is " +
                                              std::to_string(size) + " bytes, not a multiple of " +
                                              std::to_string(kPageSize) +
                                              "; volumes are whole 4 KiB pages (e.g. 64MiB)");
  }
  return Status::Ok();
}

}  // namespace

std::string_view backing_name(Backing backing) {
  switch (backing) {
    case Backing::kPlainFile:
      return "plain file";
    case Backing::kFsdaxFile:
      return "fsdax file";
    case Backing::kDevdax:
      return "devdax device";
  }
  return "unknown";
}

Region::~Region() {
  if (data_ != nullptr && pmem_unmap(data_, mapped_len_) != 0) {
    spdlog::warn("region: unmapping {} failed: {}", path_, errno_text(errno));
  }
}

Result<std::unique_ptr<Region>> Region::open(const OpenOptions& options) {
  const std::string& path = options.path;
  if (path.empty()) {
    return Status(Errc::kInvalidArgument,
                  "volume path is empty; give a file path or a devdax device such as /dev/dax0.0");
  }
  PMIRROR_RETURN_IF_ERROR(check_page_multiple(path, options.size, "requested size"));

  // Mapped below; owning from the start so every error path unmaps.
  std::unique_ptr<Region> region(new Region());
  region->path_ = path;

  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == EACCES) {
      return Status(Errc::kPermissionDenied, "cannot look up volume " + path + ": " +
                                                 errno_text(err) + "; " + permission_hint(path));
    }
    if (err == ENOTDIR) {
      return Status(Errc::kNotFound, "cannot look up volume " + path +
                                         ": a component of the path is not a directory");
    }
    if (err != ENOENT) return errno_status(Errc::kIoError, "cannot look up volume " + path, err);

    std::string parent = parent_dir(path);
    struct stat pst {};
    if (::stat(parent.c_str(), &pst) != 0 || !S_ISDIR(pst.st_mode)) {
      return Status(Errc::kNotFound, "directory " + parent + " for volume " + path +
                                         " does not exist; create it first (mkdir -p " + parent +
                                         ")");
    }
    if (!options.create) {
      return Status(Errc::kNotFound,
                    "volume " + path +
                        " does not exist; use create: true with a size, or create it with "
                        "`truncate -s <size> " +
                        path + "` (or point path at a devdax device such as /dev/dax0.0)");
    }
    if (options.size == 0) {
      return Status(Errc::kInvalidArgument, "cannot create volume " + path +
                                                " with size 0; give a size (e.g. size: 64MiB)");
    }
    // Sparse: creating a large volume must not write (or reserve) every block.
    size_t mapped_len = 0;
    int is_pmem = 0;
    void* addr = pmem_map_file(path.c_str(), options.size,
                               PMEM_FILE_CREATE | PMEM_FILE_EXCL | PMEM_FILE_SPARSE, 0600,
                               &mapped_len, &is_pmem);
    if (addr == nullptr) {
      int err = errno;
      std::string what = "cannot create volume " + path + " (" + std::to_string(options.size) +
                         " bytes): " + pmem_reason(err);
      if (errc_for(err) == Errc::kPermissionDenied) what += "; " + permission_hint(path);
      if (err == EEXIST) what += "; another process created it at the same time";
      return Status(errc_for(err), what);
    }
    region->data_ = static_cast<std::byte*>(addr);
    region->mapped_len_ = mapped_len;
    region->size_ = options.size;
    region->is_pmem_ = is_pmem != 0;
    region->backing_ = region->is_pmem_ ? Backing::kFsdaxFile : Backing::kPlainFile;
    return region;
  }

  if (S_ISDIR(st.st_mode)) {
    return Status(Errc::kInvalidArgument,
                  "volume path " + path + " is a directory; give a file inside it (e.g. " + path +
                      "/volume.img) or a devdax device such as /dev/dax0.0");
  }
  if (S_ISBLK(st.st_mode)) {
    return Status(Errc::kInvalidArgument,
                  "volume path " + path +
                      " is a block device; pmirror maps a devdax character device "
                      "(/dev/daxX.Y, see `ndctl create-namespace -m devdax`) or a file on a "
                      "DAX-mounted filesystem (mount -o dax)");
  }

  bool devdax = false;
  if (S_ISCHR(st.st_mode)) {
    std::string subsystem;
    if (!is_devdax(st, &subsystem)) {
      return Status(Errc::kInvalidArgument,
                    "volume path " + path + " is a character device that is not devdax (its " +
                        "sysfs subsystem is " + subsystem +
                        "); use /dev/daxX.Y, a file on a DAX filesystem, or a plain file");
    }
    devdax = true;
  } else if (!S_ISREG(st.st_mode)) {
    return Status(Errc::kInvalidArgument,
                  "volume path " + path +
                      " is not a regular file or devdax device (a FIFO or socket?); "
                      "give a file or /dev/daxX.Y");
  } else {
    uint64_t file_size = static_cast<uint64_t>(st.st_size);
    if (file_size == 0) {
      return Status(Errc::kInvalidArgument,
                    "volume file " + path +
                        " is empty (0 bytes), not a volume; an existing file is never resized: "
                        "remove it and use create: true with a size, or `truncate -s <size> " +
                        path + "`");
    }
    if (options.size != 0 && options.size != file_size) {
      return Status(Errc::kInvalidArgument,
                    "volume file " + path + " is " + std::to_string(file_size) +
                        " bytes but the configured size is " + std::to_string(options.size) +
                        " bytes; existing files are never resized: fix size: or use another "
                        "path");
    }
    PMIRROR_RETURN_IF_ERROR(check_page_multiple(path, file_size, "file size"));
  }

  // Length 0, no flags: map the whole file / device as it is.
  size_t mapped_len = 0;
  int is_pmem = 0;
  void* addr = pmem_map_file(path.c_str(), 0, 0, 0, &mapped_len, &is_pmem);
  if (addr == nullptr) {
    int err = errno;
    std::string what = "cannot map volume " + path + ": " + pmem_reason(err);
    if (errc_for(err) == Errc::kPermissionDenied) what += "; " + permission_hint(path);
    return Status(errc_for(err), what);
  }
  region->data_ = static_cast<std::byte*>(addr);
  region->mapped_len_ = mapped_len;
  region->size_ = mapped_len;
  region->is_pmem_ = is_pmem != 0;

  if (devdax) {
    region->backing_ = Backing::kDevdax;
    if (options.size > mapped_len) {
      return Status(Errc::kInvalidArgument,
                    "devdax device " + path + " is " + std::to_string(mapped_len) +
                        " bytes, smaller than the configured size " + std::to_string(options.size) +
                        " bytes; lower size: or use 0");
    }
    // A volume may use the first `size` bytes of a larger device.
    if (options.size != 0) region->size_ = options.size;
  } else {
    region->backing_ = region->is_pmem_ ? Backing::kFsdaxFile : Backing::kPlainFile;
    if (mapped_len != static_cast<uint64_t>(st.st_size)) {
      return Status(Errc::kIoError, "volume file " + path + " changed size while being opened (" +
                                        std::to_string(st.st_size) + " -> " +
                                        std::to_string(mapped_len) + " bytes)");
    }
  }
  return region;
}

Status Region::persist(uint64_t offset, uint64_t len) const {
  // Written so that offset + len cannot overflow.
  if (offset > size_ || len > size_ - offset) {
    return Status(Errc::kInvalidArgument, "persist range [" + std::to_string(offset) + ", +" +
                                              std::to_string(len) + ") is outside volume " + path_ +
                                              " (" + std::to_string(size_) + " bytes)");
  }
  if (len == 0) return Status::Ok();
  std::byte* addr = data_ + offset;
  if (is_pmem_) {
    pmem_persist(addr, len);
    return Status::Ok();
  }
  // pmem_msync rounds addr down to a page boundary itself, as msync needs.
  if (pmem_msync(addr, len) != 0) {
    return errno_status(Errc::kIoError,
                        "msync of volume " + path_ + " [" + std::to_string(offset) + ", +" +
                            std::to_string(len) + ") failed; the data may not be durable",
                        errno);
  }
  return Status::Ok();
}

void Region::persist_range(const void* addr, size_t len) const {
  auto begin = reinterpret_cast<uintptr_t>(addr);
  auto base = reinterpret_cast<uintptr_t>(data_);
  if (begin < base) {
    spdlog::error("region {}: persist_range called with an address below the mapping", path_);
    return;
  }
  Status status = persist(begin - base, len);
  if (!status.ok()) spdlog::error("region: {}", status.to_string());
}

}  // namespace pmirror::region
