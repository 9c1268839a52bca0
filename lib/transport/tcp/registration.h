// Memory registrations of one tcp Connection: rkey lookup with access and
// bounds checks for the peer's one-sided operations, pinning (a region is not
// deregistered while a frame is received into / sent from it), and the
// written-range bookkeeping behind PersistFn.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace pmirror::transport::tcp {

// Beyond this many separate written ranges in one registration (after
// merging) they are persisted eagerly, which bounds the bookkeeping.
inline constexpr size_t kMaxDirtyRanges = 4096;

class RegistrationTable {
 public:
  struct Reg {
    uint32_t rkey = 0;
    std::byte* base = nullptr;
    size_t length = 0;
    uint32_t access = 0;
    PersistFn persist;
    int pins = 0;
    std::vector<std::pair<uint64_t, uint64_t>> dirty;     // (offset, length), unpersisted writes
    std::vector<std::pair<uint64_t, uint64_t>> flushing;  // being persisted (capacity reused)
  };

  RegistrationTable();

  // Returns the new registration's rkey.
  uint32_t add(std::byte* base, size_t length, uint32_t access, PersistFn persist);
  // Revokes rkey: waits until nothing uses the region, persists what was
  // written into it and not yet persisted (the first failure is returned).
  Status remove(uint32_t rkey);

  // Checks that the peer may `need` (kRemoteWrite/kRemoteRead) [addr, +len)
  // through rkey and pins the registration. The error names the problem.
  Result<Reg*> pin(uint32_t rkey, uint64_t addr, uint64_t len, uint32_t need, std::string_view op);
  void unpin(Reg* reg);
  // Unpins after a Write landed in [addr, +len); true when the registration
  // holds so many separate dirty ranges that persist_all() should run now.
  bool unpin_written(Reg* reg, uint64_t addr, uint64_t len);
  // For a registration with kPersistEachWrite: persists the Write that
  // landed in [addr, +len) through its PersistFn, then unpins. Receiver
  // thread only. A failure is returned (the Write is refused).
  Status unpin_persisted(Reg* reg, uint64_t addr, uint64_t len);

  // Calls every registration's PersistFn on its ranges written since the last
  // persist (merged). Called by the one receiver thread. Returns the first
  // failure; once one failed, every later call returns it too (the ranges
  // it dropped were not made durable, so no later flush can vouch for them).
  Status persist_all();

 private:
  static void merge(std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  static Status persist_ranges(Reg& reg);

  std::mutex mu_;
  std::condition_variable unpinned_;
  std::unordered_map<uint32_t, std::unique_ptr<Reg>> regs_;
  std::vector<Reg*> persist_batch_;  // persist_all scratch, capacity reused
  Status persist_failure_;           // the first failed persist; receiver thread only
  uint32_t salt_ = 0;
  uint32_t counter_ = 0;
};

}  // namespace pmirror::transport::tcp
