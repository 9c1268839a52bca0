// Checks shared by the libpmemobj pools pmirror keeps (the daemon's state
// pool, lib/state; each copy's metadata, lib/metadata).
#pragma once

#include <sys/stat.h>

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

}  // namespace pmirror::state
