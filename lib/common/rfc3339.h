// Times on the control socket and in logs: RFC 3339 in UTC, whole seconds
// ("2026-11-29T16:01:02Z"). One formatter and one parser for every component
// that writes or reads them (pmirrord, libpmirror's control edge,
// pmirrorctl).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace pmirror {

std::string format_rfc3339(std::chrono::system_clock::time_point time);

// Accepts what format_rfc3339 writes, with an optional fraction of a second
// and "+00:00" for "Z". Anything else, or a time the clock cannot hold, is
// nullopt: the text may come from another process.
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view text);

}  // namespace pmirror
