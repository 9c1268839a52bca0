#include "systemd/private_tmp.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace pmirror::systemd {

namespace {

// mountinfo writes space, tab, newline and backslash in paths as \ooo.
std::string unescape(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string_view octal = field.substr(i + 1, 3);
      if (octal.find_first_not_of("01234567") == std::string_view::npos) {
        out += static_cast<char>((octal[0] - '0') * 64 + (octal[1] - '0') * 8 + (octal[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

bool lies_under(const std::string& path, const std::string& mount_point) {
  if (mount_point == "/") return true;
  return path == mount_point || (path.starts_with(mount_point) && path[mount_point.size()] == '/');
}

// `path` with symbolic links of its existing part resolved, so that a link
// into /tmp counts as /tmp; as written when that fails.
std::string resolved(const std::string& path) {
  std::error_code error;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(path, error);
  if (error) return std::filesystem::path(path).lexically_normal().string();
  return canonical.string();
}

}  // namespace

std::string private_tmp_mount(std::string_view mountinfo, const std::string& path) {
  // The mount that holds `path`: the longest mount point above it, the
  // later one of equal mount points (it is mounted over the earlier).
  std::string holder_point;
  bool holder_private = false;
  bool found = false;
  std::istringstream lines{std::string(mountinfo)};
  std::string line;
  while (std::getline(lines, line)) {
    // ID PARENT MAJOR:MINOR ROOT MOUNT-POINT ...
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point;
    if (!(fields >> id >> parent >> device >> root >> mount_point)) continue;
    mount_point = unescape(mount_point);
    if (!lies_under(path, mount_point)) continue;
    if (found && mount_point.size() < holder_point.size()) continue;
    found = true;
    holder_point = mount_point;
    holder_private = unescape(root).find("/systemd-private-") != std::string::npos;
  }
  return found && holder_private ? holder_point : std::string();
}

std::vector<std::string> private_tmp_warnings(const std::vector<NamedPath>& paths,
                                              std::string_view mountinfo) {
  std::vector<std::string> warnings;
  for (const NamedPath& named : paths) {
    if (named.path.empty()) continue;
    const std::string mount = private_tmp_mount(mountinfo, resolved(named.path));
    if (mount.empty()) continue;
    warnings.push_back(
        named.what + ": " + named.path + " is in this service's private " + mount +
        " (systemd's PrivateTmp=): no other process sees it, and systemd deletes it when "
        "pmirrord stops, so every start begins with an empty copy and no state; put it "
        "outside /tmp and /var/tmp (pmirrord(8), FILES), or set PrivateTmp=no in a drop-in "
        "(systemctl edit pmirrord)");
  }
  return warnings;
}

std::vector<std::string> private_tmp_warnings(const std::vector<NamedPath>& paths) {
  std::ifstream file("/proc/self/mountinfo");
  if (!file) return {};
  std::ostringstream text;
  text << file.rdbuf();
  return private_tmp_warnings(paths, text.str());
}

}  // namespace pmirror::systemd
