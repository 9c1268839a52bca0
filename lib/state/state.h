// The target daemon's own durable state, one record per volume, kept in a
// libpmemobj pool (layout "pmirror-state-v1"). Every change is one
// libpmemobj transaction: after a crash at any instant, reopening the pool
// shows each record either as it was before the change or after it, never
// a mix. docs/state.md describes the pool layout and how to inspect it.
//
// Thread-safe: one mutex serialises all calls (connection threads share one
// StateStore). A pool can be open in one StateStore at a time, system-wide:
// libpmemobj locks the file, a second open fails with kBusy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

// libpmemobj's pool handle; kept opaque so users need not include libpmemobj.
struct pmemobjpool;
typedef struct pmemobjpool PMEMobjpool;

namespace pmirror::state {

inline constexpr const char* kLayoutName = "pmirror-state-v1";
inline constexpr size_t kMaxVolumeName = 64;  // = protocol::kMaxNameLength
inline constexpr size_t kMaxWriterName = 64;  // = protocol::kMaxNameLength
inline constexpr size_t kMaxVolumes = 1024;   // slots in the pool's table
// Size of a newly created pool (libpmemobj's minimum, PMEMOBJ_MIN_POOL).
inline constexpr uint64_t kPoolSize = 8 * 1024 * 1024;

using Uuid = std::array<uint8_t, 16>;

struct VolumeState {
  std::string name;
  // Bumped when a new writer takes over the volume; commits carrying an
  // older generation are stale.
  uint64_t generation = 0;
  uint64_t last_sequence = 0;  // last sequence applied in this generation
  std::string last_writer;     // identity of the initiator that recorded it
  Uuid uuid{};                 // random (RFC 4122 v4), fixed when first recorded
  uint64_t created_unix_ns = 0;
  uint64_t updated_unix_ns = 0;  // CLOCK_REALTIME of the last change
};

// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case.
std::string uuid_to_string(const Uuid& uuid);

class StateStore {
 public:
  // Opens the pool at pool_path, or creates it (kPoolSize bytes, mode 0600)
  // when missing and create_if_missing. Errors name the path and say what
  // to do: kNotFound (file or its directory missing), kPermissionDenied,
  // kBusy (open elsewhere), kInvalidArgument (not a libpmemobj pool, or one
  // with another layout), kIoError (corrupt or unreadable: run
  // `pmempool check`).
  static Result<std::unique_ptr<StateStore>> open(const std::string& pool_path,
                                                  bool create_if_missing);

  ~StateStore();  // closes the pool
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  const std::string& path() const { return path_; }

  // The volume's record; created on first use with generation 1, sequence 0,
  // no writer and a fresh random uuid. kResourceExhausted when all
  // kMaxVolumes slots are in use; kInvalidArgument for an empty name, one
  // longer than kMaxVolumeName or containing NUL.
  Result<VolumeState> get_or_create(const std::string& volume);
  // The record, or kNotFound.
  Result<VolumeState> get(const std::string& volume) const;

  // Records that `writer` applied `sequence` in `generation`. Monotonic:
  //  - generation below the stored one: kInvalidArgument (a stale writer);
  //  - generation above it: accepted, the generation moves forward and the
  //    sequence may be anything (sequences restart with a generation);
  //  - same generation: sequence must be >= the stored one (equal is an
  //    idempotent retry), lower is kInvalidArgument.
  // kNotFound if the volume has no record (call get_or_create first).
  Status record(const std::string& volume, uint64_t generation, uint64_t sequence,
                const std::string& writer);

  // Moves the volume to `generation`, which must not be below the stored one
  // (kInvalidArgument). Raising it resets last_sequence to 0; equal is a no-op.
  Status set_generation(const std::string& volume, uint64_t generation);
  // Raises the generation by one (sequence reset to 0, writer recorded) and
  // returns the new value: what the daemon does when a new writer opens the
  // volume. Atomic with respect to other calls.
  Result<uint64_t> bump_generation(const std::string& volume, const std::string& writer);

  // All records, sorted by name.
  std::vector<VolumeState> list() const;
  // Deletes the record (kNotFound if there is none). A later get_or_create
  // starts afresh with a new uuid.
  Status remove(const std::string& volume);

 private:
  struct PoolCloser {
    void operator()(PMEMobjpool* pop) const;
  };
  struct Root;  // the persistent layout, defined in state.cpp

  StateStore() = default;
  Status init_root();
  // Slot index of the volume, or -1. Callers hold mutex_.
  int find_slot(const std::string& volume) const;

  std::unique_ptr<PMEMobjpool, PoolCloser> pool_;
  Root* root_ = nullptr;
  std::string path_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, int> index_;  // name -> slot, rebuilt at open
};

}  // namespace pmirror::state
