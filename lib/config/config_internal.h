// Internal to lib/config: file reading shared by config.cpp and cluster.cpp.
#pragma once

#include <string>

#include "common/status.h"

namespace pmirror::config {

constexpr size_t kMinSecretLength = 16;
constexpr size_t kMaxSecretFileSize = 4096;

// A secret file: a regular file, no group/other permission bits, non-empty,
// at most 4 KiB, one trailing newline stripped. Errors name the path and
// say what to run.
Result<std::string> read_secret_file(const std::string& path);

// The whole configuration file (kConfigError naming the path on failure).
Result<std::string> read_config_file(const std::string& path);

// Where a copy's metadata pool lives when the cluster file does not say:
// `<data_path>.pmirror`, or /var/lib/pmirror/<volume>.pmirror for a path
// under /dev/dax (a devdax device has no room beside it). The same rule as
// metadata::default_metadata_path (lib/metadata), kept here so that the
// config library does not link libpmemobj; change both together.
std::string default_metadata_path(const std::string& data_path, const std::string& volume);

}  // namespace pmirror::config
