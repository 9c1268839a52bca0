// What opening a file pmirror keeps (a volume's copy, a copy's metadata
// pool, the daemon's state pool) requires of the file and its directory
// before anything is created or mapped. The opens (region::Region::open,
// metadata::CopyMetadata::open, state::StateStore::open) call these first,
// and so do the checks that say beforehand what a start would refuse
// (`pmirrorctl config check`, `pmirrord --check-config`, a reload's dry
// run): one function, so the checks refuse what the start refuses, with the
// start's words. Nothing here creates, opens for writing or locks anything.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pmirror::preflight {

// The directory part of `path` ("." for a bare name, "/" for "/x").
std::string parent_dir(const std::string& path);

// What to check when the user pmirror runs as cannot use `path`.
std::string permission_hint(const std::string& path);

// "volume 'name' (path)", or "volume path" without a name: how every
// message about a volume's copy names it.
std::string volume_label(const std::string& name, const std::string& path);

// The default home of the state pool and of devdax copies' metadata: the
// systemd unit's StateDirectory=, which a start by hand makes when missing
// (make_default_directory) rather than refuse.
inline constexpr const char* kDefaultDirectory = "/var/lib/pmirror";

// Makes kDefaultDirectory when `path`, a file about to be created, is in it
// and it is missing; a failure is left to parent_directory to report.
void make_default_directory(const std::string& path);

// The directory that is to hold the file at `path` (`what` names the file,
// e.g. "state pool /var/lib/pmirror/pmirrord.state") exists and is a
// directory; with `will_create`, this user may create a file in it. With
// `default_made_by_open` (a pool's open calls make_default_directory), a
// missing kDefaultDirectory passes where this user may make it.
Status parent_directory(const std::string& path, const std::string& what, bool will_create,
                        bool default_made_by_open = false);

// A volume's copy at `path` as an open finds it: missing (then its
// directory must exist, and `create` must allow making it with a size), or
// a regular file of the volume's size (any, with size 0) or a devdax
// device, readable and writable by this user.
struct VolumePath {
  bool exists = false;
  bool devdax = false;  // a devdax character device (else a regular file)
  struct stat st {};    // when it exists
};
Result<VolumePath> volume_path(const std::string& name, const std::string& path, uint64_t size,
                               bool create);

// A pmemobj pool pmirror keeps (`what`: "state pool", "copy metadata") at
// `path`: missing (then its directory must exist, writable with
// `will_create`), or a regular file or devdax device -- not a directory.
Status pool_path(const std::string& path, const std::string& what, bool will_create);

}  // namespace pmirror::preflight
