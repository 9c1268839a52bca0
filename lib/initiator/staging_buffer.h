// The snapshot buffer: where a persist's bytes wait when they were handed
// over as a snapshot (Volume::persist_async with snapshot bytes) instead
// of being read from the local mapping when the persist is posted. Every
// replica session registers it (Replica::Setup), and its Writes take the
// bytes from here, so that the application may store to the same range
// again as soon as the call returns (pmirror-run's `observed` mode:
// docs/pmdk.md, section 3).
//
// A ring of bytes, positions counted from the open (absolute, never
// wrapping): a persist's bytes are one contiguous piece, reserved in
// persist order and given back when the ledger drops its record (no
// replica can read them any more: PersistLedger::staging_released).
//
// Guarded by the volume mutex. Owns its memory (an anonymous mapping).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace pmirror::initiator {

class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() {
    if (base_ != nullptr) ::munmap(base_, capacity_);
  }

  // 0 bytes: no snapshot persists (the default).
  Status allocate(uint64_t capacity) {
    if (capacity == 0) return Status::Ok();
    void* mapped =
        ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) {
      return Status(Errc::kResourceExhausted,
                    "cannot map a snapshot buffer of " + std::to_string(capacity) + " bytes");
    }
    base_ = static_cast<std::byte*>(mapped);
    capacity_ = capacity;
    return Status::Ok();
  }

  std::byte* base() const { return base_; }
  uint64_t capacity() const { return capacity_; }
  size_t offset_of(uint64_t position) const { return position % capacity_; }

  // Reserves `length` (> 0) contiguous bytes when the ring has room once
  // everything before `released` is given back; returns the piece's
  // absolute position (its end is position + length).
  std::optional<uint64_t> reserve(uint64_t length, uint64_t released) {
    if (length > capacity_) return std::nullopt;
    uint64_t position = head_;
    const uint64_t in_ring = position % capacity_;
    if (in_ring + length > capacity_) position += capacity_ - in_ring;  // skip the tail end
    if (position + length - released > capacity_) return std::nullopt;
    head_ = position + length;
    return position;
  }

 private:
  std::byte* base_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t head_ = 0;
};

}  // namespace pmirror::initiator
