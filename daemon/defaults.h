// What pmirrord and pmirrorctl share besides lib/: the default cluster file
// (the same path in the unit, the man pages and docs/) and the version
// string they print, taken from the public header so it is written once.
#ifndef PMIRROR_DAEMON_DEFAULTS_H
#define PMIRROR_DAEMON_DEFAULTS_H

#include <pmirror/version.h>

#define PMIRROR_STRINGIFY_(x) #x
#define PMIRROR_STRINGIFY(x) PMIRROR_STRINGIFY_(x)
// "MAJOR.MINOR.PATCH", as pmirror_version_string() gives it.
#define PMIRROR_VERSION_STRING             \
  PMIRROR_STRINGIFY(PMIRROR_VERSION_MAJOR) \
  "." PMIRROR_STRINGIFY(PMIRROR_VERSION_MINOR) "." PMIRROR_STRINGIFY(PMIRROR_VERSION_PATCH)

namespace pmirror {

inline constexpr const char* kDefaultClusterFile = "/etc/pmirror/cluster.yaml";

}  // namespace pmirror

#endif  // PMIRROR_DAEMON_DEFAULTS_H
