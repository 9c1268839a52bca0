// `config check`: do the volumes fit on their file systems? pmirror
// allocates every volume file in full (region::Region, posix_fallocate), so
// a volume that does not fit fails at start; this says so beforehand, for
// every file system at once.
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_internal.h"

namespace pmirror::config {
namespace {

// "8.0 TiB", for reading next to the exact byte count.
std::string human(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

struct Need {
  size_t volume = 0;  // index in config.volumes
  uint64_t bytes = 0;
};

struct Filesystem {
  std::string where;  // a directory on it, for the message
  uint64_t free = 0;
  std::vector<Need> needs;
  uint64_t total = 0;
};

}  // namespace

std::vector<std::string> space_problems(const ClusterConfig& config, const std::string& node) {
  std::map<dev_t, Filesystem> filesystems;
  for (size_t i = 0; i < config.volumes.size(); ++i) {
    const ClusterVolume& volume = config.volumes[i];
    auto path = volume.paths.find(node);
    if (path == volume.paths.end() || volume.size == 0) continue;
    // What the volume still needs: all of it for a file to be created,
    // its holes for an existing one. Devices, missing files without
    // `create`, missing folders and files of the wrong size are someone
    // else's message (or pmirrord's at start).
    std::string on;  // a path on the file system that will hold it
    uint64_t need = 0;
    struct stat st {};
    if (::stat(path->second.c_str(), &st) == 0) {
      if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != volume.size) continue;
      uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
      if (allocated >= volume.size) continue;
      need = volume.size - allocated;
      on = path->second;
    } else {
      if (!volume.create) continue;
      on = std::filesystem::path(path->second).parent_path().string();
      if (on.empty()) on = ".";
      if (::stat(on.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      need = volume.size;
    }
    struct statvfs vfs {};
    if (::statvfs(on.c_str(), &vfs) != 0) continue;
    Filesystem& fs = filesystems[st.st_dev];
    if (fs.where.empty()) {
      fs.where = S_ISDIR(st.st_mode) ? on : std::filesystem::path(on).parent_path().string();
      // What an unprivileged process may use; root may have a little more
      // (reserved blocks), which a check should not count on.
      fs.free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    }
    fs.needs.push_back({i, need});
    fs.total += need;
  }

  std::vector<std::string> problems;
  for (const auto& [device, fs] : filesystems) {
    if (fs.total <= fs.free) continue;
    std::string device_name = std::to_string(major(device)) + ":" + std::to_string(minor(device));
    std::string others;
    if (fs.needs.size() > 1) {
      others = ", where " + std::to_string(fs.needs.size()) + " volumes need " +
               std::to_string(fs.total) + " bytes (" + human(fs.total) + ") in all,";
    }
    for (const Need& need : fs.needs) {
      const ClusterVolume& volume = config.volumes[need.volume];
      problems.push_back(volume.path_at.at(node) + ": volumes[" + std::to_string(need.volume) +
                         "].paths." + node + ": volume '" + volume.name + "' (" +
                         volume.paths.at(node) + ") needs " + std::to_string(need.bytes) +
                         " bytes (" + human(need.bytes) + ") on the file system of " + fs.where +
                         " (device " + device_name + ")" + others + " but only " +
                         std::to_string(fs.free) + " bytes (" + human(fs.free) +
                         ") are free there; volumes are allocated in full: free space or lower "
                         "size");
    }
  }
  return problems;
}

}  // namespace pmirror::config
