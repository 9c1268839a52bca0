// What pmirrord and pmirrorctl share besides lib/: the default cluster file
// (the same path in the unit, the man pages and docs/) and the version
// string they print (common/version.h).
#ifndef PMIRROR_DAEMON_DEFAULTS_H
#define PMIRROR_DAEMON_DEFAULTS_H

#include "common/version.h"  // PMIRROR_VERSION_STRING

namespace pmirror {

inline constexpr const char* kDefaultClusterFile = "/etc/pmirror/cluster.yaml";

}  // namespace pmirror

#endif  // PMIRROR_DAEMON_DEFAULTS_H
