// A volume's bytes, mapped with libpmem: a devdax device, a file on fsdax,
// or a plain file on machines without pmem (is_pmem() false: persist goes
// through msync). RAII: the mapping is unmapped when the Region dies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

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
  // Create the file (sparse, size bytes) if it does not exist. Never
  // truncates or resizes an existing file: a wrong size is an error.
  bool create = false;
};

class Region {
 public:
  // Errors (kNotFound, kPermissionDenied, kInvalidArgument for a wrong size
  // or a path that is a directory / not a regular file or dax device,
  // kIoError otherwise) name the path and say what to do.
  static Result<std::unique_ptr<Region>> open(const OpenOptions& options);

  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool is_pmem() const { return is_pmem_; }
  Backing backing() const { return backing_; }
  const std::string& path() const { return path_; }

  // Makes [offset, offset+len) durable: pmem_persist on pmem, msync
  // otherwise. Offsets outside the region are a caller bug: kInvalidArgument.
  Status persist(uint64_t offset, uint64_t len) const;
  // The same, for a pointer into the mapping (used as transport::PersistFn).
  void persist_range(const void* addr, size_t len) const;

 private:
  Region() = default;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  size_t mapped_len_ = 0;
  bool is_pmem_ = false;
  Backing backing_ = Backing::kPlainFile;
  std::string path_;
};

}  // namespace pmirror::region
