// Checks shared by the libpmemobj pools pmirror keeps (the daemon's state
// pool, lib/state; each copy's metadata, lib/metadata).
#pragma once

#include <libpmemobj.h>
#include <sys/stat.h>

#include <cerrno>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace pmirror::state {

// How a pool names itself in messages.
struct PoolFileNames {
  std::string noun;        // "state pool", "copy metadata"
  std::string what_to_do;  // appended to "not a pool" errors, starting "; "
  // The error for a file the caller may not read or write.
  std::function<Status(const std::string& path, const std::string& reason)> permission_error;
};

// Checks that an existing file looks like a libpmemobj pool before handing
// it to pmemobj_open, which can crash (SIGBUS) on a short or empty file.
// Every pmem pool starts with an 8-byte signature ("PMEMOBJ\0" for
// libpmemobj); a pool set is a text file starting "PMEMPOOLSET". Devices
// (devdax) are left to libpmemobj.
Status precheck_pool_file(const std::string& path, const struct stat& st,
                          const PoolFileNames& names);

// A fixed-size, NUL-padded name field of a pool record as a string (a
// field that fills its size has no NUL).
std::string read_name(const char* field, size_t field_size);

// libpmemobj's own message for the last failure, else strerror(err).
std::string pmemobj_reason(int err);

// A random version-4 UUID (sd_id128_randomize; the kernel's random source).
std::array<uint8_t, 16> random_uuid();

// Runs `fn` as one libpmemobj transaction through the C API. With a null
// jmp_buf libpmemobj never longjmps (which would skip C++ destructors);
// failures come back as return values instead. `fn` snapshots every range
// it changes with snapshot() first and returns 0, or an errno to abort (a
// failed snapshot has already aborted the transaction).
template <typename Fn>
Status run_tx(PMEMobjpool* pop, const std::string& what, Fn&& fn) {
  if (pmemobj_tx_begin(pop, nullptr, TX_PARAM_NONE) != 0) {
    int err = errno;
    std::string reason = pmemobj_reason(err);
    pmemobj_tx_end();  // required even when begin failed
    return Status(Errc::kIoError, what + ": cannot start a transaction: " + reason);
  }
  int err = fn();
  if (pmemobj_tx_stage() == TX_STAGE_WORK) {
    if (err == 0) {
      pmemobj_tx_commit();
    } else {
      pmemobj_tx_abort(err);
    }
  }
  int rc = pmemobj_tx_end();
  if (rc != 0) {
    return Status(rc == ENOMEM ? Errc::kResourceExhausted : Errc::kIoError,
                  what + ": transaction aborted, nothing changed: " + pmemobj_reason(rc));
  }
  return Status::Ok();
}

// Adds [addr, addr + len) to the running transaction's undo log.
inline int snapshot(void* addr, size_t len) { return pmemobj_tx_add_range_direct(addr, len); }

}  // namespace pmirror::state
