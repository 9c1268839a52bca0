// A volume's bytes, mapped with libpmem: a devdax device, a file on fsdax,
// or a plain file on machines without pmem (is_pmem() false: persist goes
// through msync). RAII: the mapping is unmapped when the Region dies.
//
// Files are fully allocated (posix_fallocate) when created and when opened,
// so that a full file system is an error at open, never a SIGBUS when a
// store reaches a hole the file system cannot fill.
//
// A Region fails for good when a persist of it fails (a write-back error) or
// a memory fault hits its mapping (fault::report): Linux reports a
// write-back error to msync once (errseq), so a later msync may succeed
// although earlier data was lost. From then on every persist returns the
// first failure, until the volume is opened again (a new Region).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/fault.h"
#include "common/status.h"

namespace pmirror::region {

enum class Backing { kPlainFile, kFsdaxFile, kDevdax };
std::string_view backing_name(Backing backing);

// File-backed volumes are whole pages: msync and mmap work in pages, and a
// volume smaller than one page is certainly a mistake. Sizes (given or
// found) must be a non-zero multiple of this.
inline constexpr uint64_t kPageSize = 4096;

struct OpenOptions {
  std::string path;
  // Expected size in bytes, a multiple of kPageSize. 0 with create=false: use
  // the existing size. Required (non-zero) with create=true.
  // For devdax, 0 means the whole device; a non-zero size must not exceed
  // it, and the volume is then the device's first `size` bytes.
  uint64_t size = 0;
  // Create the file (size bytes, allocated) if it does not exist. Never
  // truncates or resizes an existing file: a wrong size is an error.
  bool create = false;
  // The volume's name, for messages ("volume 'db0' (/mnt/pmem/db0)");
  // empty: messages name the path only. (The initializer keeps positional
  // {path, size, create} initialisation free of -Wmissing-field-initializers.)
  std::string name{};
};

class Region {
 public:
  // Errors (kNotFound, kPermissionDenied, kInvalidArgument for a wrong size
  // or a path that is a directory / not a regular file or dax device,
  // kResourceExhausted when the file system has no room for the file,
  // kIoError otherwise) name the volume and say what to do.
  static Result<std::unique_ptr<Region>> open(const OpenOptions& options);

  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool is_pmem() const { return is_pmem_; }
  Backing backing() const { return backing_; }
  const std::string& path() const { return path_; }
  // True when open() created the file (create: true and it did not exist).
  bool created() const { return created_; }
  // "volume 'db0' (/mnt/pmem/db0)", or "volume /mnt/pmem/db0" without a name.
  const std::string& label() const { return label_; }

  // Makes [offset, offset+len) durable: pmem_persist on pmem, msync
  // otherwise. Offsets outside the region are a caller bug: kInvalidArgument.
  // kIoError naming the volume when it did not become durable (the region
  // is then failed), or when the region failed before.
  Status persist(uint64_t offset, uint64_t len) const;
  // The same, for a pointer into the mapping (used as transport::PersistFn).
  Status persist_range(const void* addr, size_t len) const;

  // Ok until the region failed; then the first failure, for good.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status failure() const;
  // Marks the region failed (the first reason stays) and logs it once.
  void fail(const Status& why) const;

 private:
  Region() = default;
  // Maps the file or device at path_; size and file_size as open() found them.
  static Result<std::unique_ptr<Region>> map(std::unique_ptr<Region> region, uint64_t size,
                                             bool devdax, uint64_t file_size);
  Status persist_mapped(std::byte* addr, uint64_t offset, uint64_t len) const;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  size_t mapped_len_ = 0;
  bool is_pmem_ = false;
  Backing backing_ = Backing::kPlainFile;
  std::string path_;
  std::string label_;
  bool created_ = false;
  fault::Registration fault_registration_;

  mutable std::atomic<bool> failed_{false};
  mutable std::mutex failure_mutex_;
  mutable Status failure_;  // guarded by failure_mutex_
};

}  // namespace pmirror::region
