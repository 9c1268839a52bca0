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

}  // namespace pmirror::config
