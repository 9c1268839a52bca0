#include "region/region.h"

#include <fcntl.h>
#include <libpmem.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "common/log.h"
#include "common/preflight.h"

namespace pmirror::region {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

using preflight::permission_hint;
static_assert(kPageSize == 4096, "preflight checks volumes against 4 KiB pages");

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
    case EDQUOT:
      return Errc::kResourceExhausted;
    case EBUSY:
    case ETXTBSY:
      return Errc::kBusy;
    default:
      return Errc::kIoError;
  }
}

// libpmem's own message is more specific than strerror when it has one
// (e.g. which step of pmem_map_file failed).
std::string pmem_reason(int err) {
  const char* msg = pmem_errormsg();
  if (msg != nullptr && *msg != '\0') return msg;
  return errno_text(err);
}

// Allocates every block of the first `size` bytes of fd that is not
// allocated yet (posix_fallocate keeps existing data), so that no store into
// the mapping can meet a hole the file system has no room for (SIGBUS).
// `missing`: the bytes that were not allocated, for the message.
Status allocate(int fd, const std::string& label, uint64_t size, uint64_t missing) {
  int err = 0;
  // Plainly too large: say so without trying, because a file system may
  // allocate what it can before giving up, filling the disk for a moment.
  struct statvfs vfs {};
  if (missing > 0 && ::fstatvfs(fd, &vfs) == 0) {
    uint64_t blocks = ::geteuid() == 0 ? vfs.f_bfree : vfs.f_bavail;  // root may use reserved ones
    if (static_cast<uint64_t>(blocks) * vfs.f_frsize < missing) err = ENOSPC;
  }
  while (err == 0) {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (err != EINTR) break;
    err = 0;
  }
  if (err == 0) return Status::Ok();
  std::string what =
      label + ": cannot allocate " + std::to_string(missing) + " bytes: " + errno_text(err);
  if (err == ENOSPC || err == EDQUOT) {
    what += "; free space or lower size";
  } else if (err == EFBIG) {
    what += "; the file system does not allow a file this large: lower size";
  }
  return Status(errc_for(err), what);
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
  fault_registration_.reset();  // before the addresses can be reused
  if (data_ != nullptr && pmem_unmap(data_, mapped_len_) != 0) {
    log::warn("region: unmapping {} failed: {}", path_, errno_text(errno));
  }
}

Result<std::unique_ptr<Region>> Region::open(const OpenOptions& options) {
  const std::string& path = options.path;
  // What the checks (`pmirrorctl config check`, `pmirrord --check-config`)
  // also ask, in the same words: the path, its directory, its type and size.
  auto found = preflight::volume_path(options.name, path, options.size, options.create);
  if (!found.ok()) return found.status();
  const struct stat& st = found->st;
  // Mapped below; owning from the start so every error path unmaps.
  std::unique_ptr<Region> region(new Region());
  region->path_ = path;
  region->label_ = preflight::volume_label(options.name, path);
  const std::string& label = region->label_;

  if (!found->exists) {
    // Created, then allocated in full, then mapped like an existing file.
    // O_EXCL: never take over a file another process created meanwhile.
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      int err = errno;
      std::string what = "cannot create " + label + ": " + errno_text(err);
      if (errc_for(err) == Errc::kPermissionDenied) what += "; " + permission_hint(path);
      if (err == EEXIST) what += "; another process created it at the same time";
      return Status(errc_for(err), what);
    }
    Status allocated = allocate(fd, label, options.size, options.size);
    ::close(fd);
    if (!allocated.ok()) {
      ::unlink(path.c_str());  // ours (O_EXCL): leave nothing half-made behind
      return allocated;
    }
    region->created_ = true;
    auto mapped = map(std::move(region), options.size, /*devdax=*/false, options.size);
    if (!mapped.ok()) ::unlink(path.c_str());
    return mapped;
  }

  if (!found->devdax) {
    uint64_t file_size = static_cast<uint64_t>(st.st_size);
    // Holes (a file made with `truncate -s`, or by an older pmirror, which
    // created volumes sparse) are allocated now; data is kept.
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      std::string what = "cannot open " + label + ": " + errno_text(err);
      if (errc_for(err) == Errc::kPermissionDenied) what += "; " + permission_hint(path);
      return Status(errc_for(err), what);
    }
    uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
    Status holes =
        allocate(fd, label, file_size, file_size > allocated ? file_size - allocated : 0);
    ::close(fd);
    PMIRROR_RETURN_IF_ERROR(holes);
  }
  return map(std::move(region), options.size, found->devdax, static_cast<uint64_t>(st.st_size));
}

Result<std::unique_ptr<Region>> Region::map(std::unique_ptr<Region> region, uint64_t size,
                                            bool devdax, uint64_t file_size) {
  const std::string& path = region->path_;
  // Length 0, no flags: map the whole file / device as it is.
  size_t mapped_len = 0;
  int is_pmem = 0;
  void* addr = pmem_map_file(path.c_str(), 0, 0, 0, &mapped_len, &is_pmem);
  if (addr == nullptr) {
    int err = errno;
    std::string what = "cannot map " + region->label_ + ": " + pmem_reason(err);
    if (errc_for(err) == Errc::kPermissionDenied) what += "; " + permission_hint(path);
    return Status(errc_for(err), what);
  }
  region->data_ = static_cast<std::byte*>(addr);
  region->mapped_len_ = mapped_len;
  region->size_ = mapped_len;
  // PMEM_IS_PMEM_FORCE=1 (libpmem's variable) treats the mapping as pmem:
  // libpmem latches it at its first is_pmem question in the process, this
  // reads it at each open, so that it also holds for a volume opened after
  // it was set (the tests set it per case).
  const char* forced = std::getenv("PMEM_IS_PMEM_FORCE");
  region->is_pmem_ = is_pmem != 0 || (forced != nullptr && std::string_view(forced) == "1");

  if (devdax) {
    region->backing_ = Backing::kDevdax;
    if (size > mapped_len) {
      return Status(Errc::kInvalidArgument,
                    "devdax device " + path + " is " + std::to_string(mapped_len) +
                        " bytes, smaller than the configured size " + std::to_string(size) +
                        " bytes; lower size: or use 0");
    }
    // A volume may use the first `size` bytes of a larger device.
    if (size != 0) region->size_ = size;
  } else {
    region->backing_ = region->is_pmem_ ? Backing::kFsdaxFile : Backing::kPlainFile;
    if (mapped_len != file_size) {
      return Status(Errc::kIoError, region->label_ +
                                        ": the file changed size while being opened (" +
                                        std::to_string(file_size) + " -> " +
                                        std::to_string(mapped_len) + " bytes)");
    }
  }
  // A fault inside the mapping (SIGBUS caught by a guard in pmirrord) fails
  // this region; ~Region withdraws the registration before unmapping.
  const Region* self = region.get();
  region->fault_registration_ =
      fault::register_mapping(region->data_, region->mapped_len_, region->label_,
                              [self](const Status& why) { self->fail(why); });
  return region;
}

Status Region::failure() const {
  if (!failed()) return Status::Ok();
  std::lock_guard lock(failure_mutex_);
  return failure_;
}

void Region::fail(const Status& why) const {
  {
    std::lock_guard lock(failure_mutex_);
    if (!failure_.ok()) return;
    failure_ = Status(why.code() == Errc::kOk ? Errc::kIoError : why.code(), why.message());
    failed_.store(true, std::memory_order_release);
  }
  // Once: later persists only return it.
  std::string detail = why.message();
  if (detail.rfind(label_ + ": ", 0) == 0) detail.erase(0, label_.size() + 2);
  log::error("{} failed: {}; every persist on it fails from now on, until it is reopened", label_,
             detail);
}

Status Region::persist(uint64_t offset, uint64_t len) const {
  // Written so that offset + len cannot overflow.
  if (offset > size_ || len > size_ - offset) {
    return Status(Errc::kInvalidArgument, "persist range [" + std::to_string(offset) + ", +" +
                                              std::to_string(len) + ") is outside " + label_ +
                                              " (" + std::to_string(size_) + " bytes)");
  }
  if (failed()) {
    Status first = failure();
    return Status(first.code(), label_ + " failed earlier and stays failed until it is reopened: " +
                                    first.message());
  }
  if (len == 0) return Status::Ok();
  return persist_mapped(data_ + offset, offset, len);
}

Status Region::persist_mapped(std::byte* addr, uint64_t offset, uint64_t len) const {
  if (is_pmem_) {
    // A cache flush of a poisoned line or of a page the file lost faults.
    auto fault = fault::guarded(addr, len, [&] { pmem_persist(addr, len); });
    if (fault) return fault::report(*fault);  // fails this region, too
    return Status::Ok();
  }
  // pmem_msync rounds addr down to a page boundary itself, as msync needs.
  if (pmem_msync(addr, len) != 0) {
    int err = errno;
    Status failed(Errc::kIoError, label_ + ": msync of [" + std::to_string(offset) + ", +" +
                                      std::to_string(len) + ") failed: " + errno_text(err) +
                                      " (errno " + std::to_string(err) +
                                      "); the data may not be durable");
    fail(failed);
    return failed;
  }
  return Status::Ok();
}

Status Region::persist_range(const void* addr, size_t len) const {
  auto begin = reinterpret_cast<uintptr_t>(addr);
  auto base = reinterpret_cast<uintptr_t>(data_);
  if (begin < base) {
    return Status(Errc::kInvalidArgument,
                  "persist of an address below the mapping of " + label_ + " (a caller bug)");
  }
  return persist(begin - base, len);
}

}  // namespace pmirror::region
