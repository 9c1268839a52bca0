// The lease deadline file (lease_file.h).
#include "failover/lease_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <type_traits>
#include <utility>

namespace pmirror::failover {

static_assert(sizeof(LeaseFileLayout) == kLeaseFileSize);
static_assert(std::is_standard_layout_v<LeaseFileLayout>);
static_assert(offsetof(LeaseFileLayout, version) == 8);
static_assert(offsetof(LeaseFileLayout, size) == 12);
static_assert(offsetof(LeaseFileLayout, volume) == 16);
static_assert(offsetof(LeaseFileLayout, node) == 80);
static_assert(offsetof(LeaseFileLayout, lease_id) == 144);
static_assert(offsetof(LeaseFileLayout, deadline_ns) == 152);
static_assert(offsetof(LeaseFileLayout, renewed_unix_ms) == 160);
static_assert(offsetof(LeaseFileLayout, holder_pid) == 168);
// Shared between processes: the atomics must be plain memory, not a lock.
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint64_t>) == 8 && alignof(std::atomic<uint64_t>) == 8);

uint64_t monotonic_now_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return uint64_t(now.tv_sec) * 1'000'000'000u + uint64_t(now.tv_nsec);
}

namespace {

int64_t unix_now_ms() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return int64_t(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
}

Status check_name(std::string_view what, std::string_view name) {
  if (name.empty() || name.size() > kLeaseNameSize) {
    return Status(Errc::kInvalidArgument, std::string(what) + " name '" + std::string(name) +
                                              "' is " + std::to_string(name.size()) +
                                              " bytes; a lease file holds 1.." +
                                              std::to_string(kLeaseNameSize));
  }
  return Status::Ok();
}

std::string field(const char (&bytes)[kLeaseNameSize]) {
  return std::string(bytes, ::strnlen(bytes, kLeaseNameSize));
}

}  // namespace

// ------------------------------------------------------------ mapping

LeaseMapping::LeaseMapping(LeaseMapping&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), size_(std::exchange(other.size_, 0)) {}

LeaseMapping& LeaseMapping::operator=(LeaseMapping&& other) noexcept {
  if (this != &other) {
    if (address_ != nullptr) ::munmap(address_, size_);
    address_ = std::exchange(other.address_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

LeaseMapping::~LeaseMapping() {
  if (address_ != nullptr) ::munmap(address_, size_);
}

// ------------------------------------------------------------- writer

Result<LeaseFileWriter> LeaseFileWriter::create(const std::string& path, std::string_view volume,
                                                std::string_view node) {
  PMIRROR_RETURN_IF_ERROR(check_name("volume", volume));
  PMIRROR_RETURN_IF_ERROR(check_name("node", node));
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status(Errc::kNotFound,
                  "lease file " + path + ": the directory " + dir.string() +
                      " does not exist (pmirror-promoter does not create it: it is "
                      "/run/pmirror, made by the unit's RuntimeDirectory=, or daemon.lease_dir)");
  }
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd.valid()) return errno_status(Errc::kIoError, "lease file " + path, errno);
  // Readable by the application's user whatever the umask.
  if (::fchmod(fd.get(), 0644) != 0) {
    return errno_status(Errc::kIoError, "lease file " + path + ": chmod 0644", errno);
  }
  if (::ftruncate(fd.get(), kLeaseFileSize) != 0) {
    return errno_status(Errc::kIoError, "lease file " + path + ": sizing it", errno);
  }
  void* address = ::mmap(nullptr, kLeaseFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (address == MAP_FAILED) {
    return errno_status(Errc::kIoError, "lease file " + path + ": mapping it", errno);
  }
  LeaseMapping mapping(address, kLeaseFileSize);
  LeaseFileLayout* layout = mapping.layout();
  // No lease until the first publish: a reader mapping the file from now
  // on, or one still mapping it from a promoter before, sees none.
  layout->deadline_ns.store(0, std::memory_order_release);
  layout->lease_id.store(0, std::memory_order_relaxed);
  layout->renewed_unix_ms.store(0, std::memory_order_relaxed);
  layout->holder_pid.store(int32_t(::getpid()), std::memory_order_relaxed);
  layout->size = kLeaseFileSize;
  std::memset(layout->volume, 0, kLeaseNameSize);
  std::memcpy(layout->volume, volume.data(), volume.size());
  std::memset(layout->node, 0, kLeaseNameSize);
  std::memcpy(layout->node, node.data(), node.size());
  std::memcpy(layout->magic, kLeaseMagic, sizeof kLeaseMagic);
  // Last, with release: a reader that loads it (acquire) sees the rest.
  layout->version.store(kLeaseLayoutVersion, std::memory_order_release);
  return LeaseFileWriter(path, std::move(fd), std::move(mapping));
}

void LeaseFileWriter::publish(uint64_t deadline_ns, int64_t lease_id) {
  if (deadline_ns == 0) return withdraw();
  LeaseFileLayout* layout = mapping_.layout();
  layout->lease_id.store(lease_id, std::memory_order_relaxed);
  layout->renewed_unix_ms.store(unix_now_ms(), std::memory_order_relaxed);
  layout->deadline_ns.store(deadline_ns, std::memory_order_release);
}

void LeaseFileWriter::withdraw() {
  LeaseFileLayout* layout = mapping_.layout();
  layout->deadline_ns.store(0, std::memory_order_release);
  layout->lease_id.store(0, std::memory_order_relaxed);
}

uint64_t LeaseFileWriter::deadline_ns() const {
  return mapping_.layout()->deadline_ns.load(std::memory_order_acquire);
}

// ------------------------------------------------------------- reader

Result<LeaseFileReader> LeaseFileReader::open(const std::string& path,
                                              std::string_view expected_volume,
                                              std::string_view expected_node) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT) {
      return Status(Errc::kNotFound, "lease file " + path + " does not exist");
    }
    return errno_status(Errc::kIoError, "lease file " + path, err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return errno_status(Errc::kIoError, "lease file " + path, errno);
  }
  if (!S_ISREG(st.st_mode) || uint64_t(st.st_size) < kLeaseFileSize) {
    return Status(Errc::kInvalidArgument,
                  "lease file " + path + " is not a lease file: " +
                      (S_ISREG(st.st_mode) ? std::to_string(st.st_size) + " bytes, not " +
                                                 std::to_string(kLeaseFileSize)
                                           : std::string("not a regular file")));
  }
  void* address = ::mmap(nullptr, kLeaseFileSize, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (address == MAP_FAILED) {
    return errno_status(Errc::kIoError, "lease file " + path + ": mapping it", errno);
  }
  LeaseMapping mapping(address, kLeaseFileSize);
  const LeaseFileLayout* layout = mapping.layout();
  const uint32_t version = layout->version.load(std::memory_order_acquire);
  if (std::memcmp(layout->magic, kLeaseMagic, sizeof kLeaseMagic) != 0) {
    return Status(Errc::kInvalidArgument,
                  "lease file " + path +
                      " is not a lease file (no PMLEASE1 magic; pmirror-promoter writes it)");
  }
  if (version != kLeaseLayoutVersion || layout->size != kLeaseFileSize) {
    return Status(Errc::kInvalidArgument,
                  "lease file " + path + " has layout version " + std::to_string(version) +
                      "; this libpmirror reads version " + std::to_string(kLeaseLayoutVersion) +
                      " (pmirror-promoter and libpmirror of different releases?)");
  }
  std::string volume = field(layout->volume);
  std::string node = field(layout->node);
  if (volume != expected_volume || (!expected_node.empty() && node != expected_node)) {
    return Status(Errc::kFailedPrecondition,
                  "lease file " + path + " belongs to volume " + volume + " on node " + node +
                      ", not volume " + std::string(expected_volume) +
                      (expected_node.empty() ? "" : " on node " + std::string(expected_node)));
  }
  return LeaseFileReader(path, std::move(volume), std::move(node), std::move(mapping));
}

int64_t LeaseFileReader::lease_id() const {
  return mapping_.layout()->lease_id.load(std::memory_order_relaxed);
}

int64_t LeaseFileReader::renewed_unix_ms() const {
  return mapping_.layout()->renewed_unix_ms.load(std::memory_order_relaxed);
}

int32_t LeaseFileReader::holder_pid() const {
  return mapping_.layout()->holder_pid.load(std::memory_order_relaxed);
}

}  // namespace pmirror::failover
