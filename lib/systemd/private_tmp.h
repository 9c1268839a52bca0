// systemd's PrivateTmp= (systemd.exec(5)) gives a service a /tmp and a
// /var/tmp of its own: bind mounts of /tmp/systemd-private-<boot>-<unit>-*/
// that the service manager deletes when the service stops. pmirrord's unit
// sets it, so a volume, metadata pool or state pool configured under /tmp
// lands in a folder no other process sees (pmirrorctl verify from a shell
// looks at another file) and is gone after every stop: each start creates
// an empty copy and forgets the daemon's state. pmirrord warns about such
// paths at start; it does not refuse them, since whether a path is private
// depends on how the daemon was started, which `pmirrorctl config check`
// cannot see.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pmirror::systemd {

// The mount point ("/tmp", "/var/tmp") of the private temporary folder that
// `path` lies under, according to `mountinfo` (the text of
// /proc/self/mountinfo, proc(5)); empty when it lies under none. A private
// folder is a mount whose root (in its file system) is inside a
// systemd-private-* folder. `path` should be absolute and normal.
std::string private_tmp_mount(std::string_view mountinfo, const std::string& path);

// One line per path of `paths` (what: where pairs, e.g. {"state pool",
// "/tmp/p.state"}) that lies in a private temporary folder of this process
// (or of `mountinfo`, for tests), saying what happens to it and what to do.
struct NamedPath {
  std::string what;  // "volume db0", "volume db0's metadata", "the state pool"
  std::string path;
};
std::vector<std::string> private_tmp_warnings(const std::vector<NamedPath>& paths,
                                              std::string_view mountinfo);
// The same, reading /proc/self/mountinfo (no warning when it cannot be read).
std::vector<std::string> private_tmp_warnings(const std::vector<NamedPath>& paths);

}  // namespace pmirror::systemd
