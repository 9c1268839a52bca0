// pmirrorctl's presentation: merging status objects and the human forms.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <set>

#include "common/rfc3339.h"
#include "control/control.h"

namespace pmirror::control {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::system_clock;

// Control characters (a terminal's escape sequences among them) as \xNN:
// a status string may carry text a peer chose.
std::string terminal_safe(const std::string& text) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kDigits[c >> 4];
      out += kDigits[c & 0xf];
    } else {
      out += ch;
    }
  }
  return out;
}

const json& member(const json& object, const char* key) {
  static const json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

// A boolean member; anything else (absent, another type, not an object) is
// no answer: what a peer sends never throws here.
std::optional<bool> flag(const json& object, const char* key) {
  const json& value = member(object, key);
  if (!value.is_boolean()) return std::nullopt;
  return value.get<bool>();
}

std::string str(const json& object, const char* key) {
  if (!object.is_object()) return {};
  auto it = object.find(key);
  if (it == object.end()) return {};
  if (it->is_string()) return terminal_safe(it->get<std::string>());
  if (it->is_null()) return {};
  return it->dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<uint64_t> number(const json& object, const char* key) {
  if (!object.is_object()) return std::nullopt;
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer()) {
    int64_t v = it->get<int64_t>();
    return v < 0 ? 0 : static_cast<uint64_t>(v);
  }
  double v = it->get<double>();
  if (v < 0) return 0;
  // At or past 2^64 the conversion would be undefined: the most there is.
  if (v >= 18446744073709551616.0) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(v);
}

std::optional<double> real(const json& object, const char* key) {
  if (!object.is_object()) return std::nullopt;
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::tm broken_down(Clock::time_point time, bool utc) {
  std::time_t t = Clock::to_time_t(time);
  std::tm tm{};
  if (utc) {
    gmtime_r(&t, &tm);
  } else {
    localtime_r(&t, &tm);
  }
  return tm;
}

std::string strftime_string(const std::tm& tm, const char* pattern) {
  char out[64];
  size_t n = std::strftime(out, sizeof(out), pattern, &tm);
  return std::string(out, n);
}

// "16:01:02" today, "2026-11-28 16:01:02" on another day.
std::string clock_time(Clock::time_point time, const HumanFormat& format) {
  std::tm tm = broken_down(time, format.utc);
  std::tm today = broken_down(format.now, format.utc);
  bool same_day = tm.tm_year == today.tm_year && tm.tm_yday == today.tm_yday;
  return strftime_string(tm, same_day ? "%H:%M:%S" : "%Y-%m-%d %H:%M:%S");
}

std::string ago(Clock::time_point time, Clock::time_point now) {
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(now - time).count();
  if (seconds < 0) return {};
  std::string amount;
  if (seconds < 60) {
    amount = std::to_string(seconds) + "s";
  } else if (seconds < 3600) {
    amount = std::to_string(seconds / 60) + "m";
  } else if (seconds < 86400) {
    amount = std::to_string(seconds / 3600) + "h";
  } else {
    amount = std::to_string(seconds / 86400) + "d";
  }
  return "(" + amount + " ago)";
}

// From a status object's "process": "initiator app1, pid 4242", "pmirrord node2".
std::string process_label(const json& status) {
  static const json kNone = json::object();
  const json& process =
      status.contains("process") && status["process"].is_object() ? status["process"] : kNone;
  std::string kind = str(process, "kind");
  auto pid = number(process, "pid");
  std::string pid_text = pid ? "pid " + std::to_string(*pid) : std::string();
  if (kind == "initiator") {
    std::string identity = str(process, "identity");
    std::string label = identity.empty() ? "initiator" : "initiator " + identity;
    return pid ? label + ", " + pid_text : label;
  }
  if (kind.empty()) kind = "process";
  std::string node = str(process, "node");
  if (!node.empty()) return kind + " " + node;
  return pid ? kind + ", " + pid_text : kind;
}

void append_field(std::string& line, std::string_view key, const std::string& value) {
  if (value.empty()) return;
  line += ' ';
  line += key;
  line += ':';
  // key:value tokens stay single words ("plain file" -> "plain-file").
  for (char c : value) line += c == ' ' ? '-' : c;
}

std::string peer_line(const json& peer, const HumanFormat& format) {
  std::string name = str(peer, "name");
  if (name.empty()) name = str(peer, "address");
  if (name.empty()) name = "?";
  std::string state = str(peer, "state");
  std::string line = "  " + name;
  append_field(line, "connection", state.empty() ? "unknown" : state);
  if (flag(peer, "by_operator").value_or(false)) line += " (by operator)";
  if (auto since = parse_rfc3339(str(peer, "since"))) {
    line += " since " + clock_time(*since, format);
    std::string how_long = ago(*since, format.now);
    if (!how_long.empty()) line += " " + how_long;
  }
  // The replica's data as the primary knows it (absent from a replica's view).
  append_field(line, "disk", str(peer, "disk"));
  append_field(line, "method", str(peer, "method"));
  // A replica's writer: named by identity, its connection's address here.
  if (peer.is_object() && peer.contains("ended"))
    append_field(line, "address", str(peer, "address"));
  if (auto v = number(peer, "acknowledged_sequence"))
    append_field(line, "acked", std::to_string(*v));
  if (auto v = number(peer, "lag")) append_field(line, "lag", std::to_string(*v));
  if (auto v = number(peer, "persists")) append_field(line, "persists", std::to_string(*v));
  if (peer.contains("latency_us") && peer["latency_us"].is_object()) {
    const json& latency = peer["latency_us"];
    if (auto v = real(latency, "p50")) append_field(line, "p50", format_latency_us(*v));
    if (auto v = real(latency, "p99")) append_field(line, "p99", format_latency_us(*v));
    if (auto v = real(latency, "p999")) append_field(line, "p99.9", format_latency_us(*v));
  }
  if (auto v = number(peer, "resynced_bytes"); v && *v > 0)
    append_field(line, "resynced", format_size(*v));
  if (auto v = number(peer, "errors"); v && *v > 0)
    append_field(line, "errors", std::to_string(*v));
  std::string reason = str(peer, "reason");
  if (state != "connected" && !reason.empty()) line += " reason: " + reason;
  return line;
}

// "  app1 session ended 12:01:07 (3m ago) address:10.0.0.1:40412 persists:120 (closed: goodbye)"
std::string ended_session_line(const json& peer, const HumanFormat& format) {
  std::string line = "  " + str(peer, "name") + " session ended";
  if (auto since = parse_rfc3339(str(peer, "since"))) {
    line += " " + clock_time(*since, format);
    if (std::string how_long = ago(*since, format.now); !how_long.empty()) line += " " + how_long;
  }
  append_field(line, "address", str(peer, "address"));
  if (auto v = number(peer, "persists")) append_field(line, "persists", std::to_string(*v));
  std::string why = str(peer, "state");
  if (std::string reason = str(peer, "reason"); !reason.empty()) why += ": " + reason;
  return line + " (" + why + ")";
}

std::string volume_line(const json& volume, const json& process) {
  std::string line = str(volume, "name");
  append_field(line, "role", str(volume, "role"));
  const json& copy = member(volume, "copy");
  // A promoted copy refuses other writers: say so before anything else.
  if (flag(copy, "promoted").value_or(false)) line += " PROMOTED";
  // A failed volume takes no writer until reopened: as loud.
  if (str(volume, "state") == "failed") line += " FAILED";
  if (flag(volume, "down").value_or(false)) line += " down (by operator)";
  if (auto v = number(volume, "size")) append_field(line, "size", format_size(*v));
  append_field(line, "backing", str(volume, "backing"));
  // Two numbers, two names, as in the logs: `generation` names the data
  // (the copy's, or a primary's: a random identifier, 16 hex digits);
  // `session-generation` is a replica's state-pool counter of writer
  // sessions (a number, in decimal).
  const json& counter = member(volume, "generation");
  std::string generation = format_generation(member(copy, "generation"));
  if (generation.empty() && counter.is_string()) generation = format_generation(counter);
  append_field(line, "generation", generation);
  if (counter.is_number()) append_field(line, "session-generation", format_generation(counter));
  if (auto v = number(volume, "last_sequence")) append_field(line, "last-seq", std::to_string(*v));
  line += " (" + process_label(process) + ")";
  return line;
}

// "  this copy: uuid:... history:a,b consistent:yes clean:yes", or "" when
// the volume has no "copy" object.
std::string copy_line(const json& volume) {
  const json& copy = member(volume, "copy");
  if (!copy.is_object() || copy.empty()) return {};
  std::string line = "  this copy:";
  if (flag(copy, "in_use_by_local_primary").value_or(false)) {
    return line + " in use by the primary on this node (libpmirror has it open)";
  }
  if (std::string error = str(copy, "error"); !error.empty()) return line + " error: " + error;
  append_field(line, "uuid", str(copy, "uuid"));
  const json& history = member(copy, "history");
  if (history.is_array() && !history.empty()) {
    std::string list;
    for (const json& g : history) {
      std::string text = format_generation(g);
      if (!text.empty()) list += (list.empty() ? "" : ",") + text;
    }
    append_field(line, "history", list);
  }
  for (const char* key : {"consistent", "clean", "promoted"}) {
    if (auto v = flag(copy, key)) append_field(line, key, *v ? "yes" : "no");
  }
  // Takes writes only from the primary promoted there (docs/failover.md).
  if (const json& fence = member(copy, "fence"); fence.is_object()) {
    append_field(line, "fenced-by", str(fence, "promoted_on"));
    append_field(line, "fence-generation", format_generation(member(fence, "generation")));
  }
  return line == "  this copy:" ? std::string() : line;
}

// "  fences (promoted here at 12:01:07): a NOT fenced yet, retrying (timeout ...), c fenced"
// from the last promotion on this node; "" when there was none.
std::string fences_line(const json& volume, const HumanFormat& format) {
  const json& fences = member(volume, "fences");
  if (!fences.is_array() || fences.empty()) return {};
  std::string line = "  fences";
  if (auto at = parse_rfc3339(str(volume, "fences_at"))) {
    line += " (promoted here at " + clock_time(*at, format) + ")";
  }
  line += ":";
  bool first = true;
  for (const json& f : fences) {
    line += first ? " " : ", ";
    first = false;
    line += str(f, "node");
    if (flag(f, "fenced").value_or(false)) {
      line += " fenced";
    } else if (flag(f, "pending").value_or(false)) {
      line += " NOT fenced yet, retrying (" + str(f, "error") + ")";
    } else {
      line += " NOT fenced (" + str(f, "error") + ")";
    }
  }
  return line;
}

// "  lease: held by node b since 12:01:07" from the promoter's part
// (attach_failover); empty without one.
std::string failover_line(const json& volume, const HumanFormat& format) {
  const json& failover = member(volume, "failover");
  if (!failover.is_object()) return {};
  std::string line = "  lease: ";
  std::string holder = str(failover, "holder");
  if (holder.empty()) {
    line += "nobody holds it";
  } else {
    line += flag(failover, "held_here").value_or(false) ? "held here (node " + holder + ")"
                                                        : "held by node " + holder;
    if (auto since = parse_rfc3339(str(failover, "since"))) {
      line += " since " + clock_time(*since, format);
    }
  }
  if (std::string refused = str(failover, "refused"); !refused.empty()) {
    line += "; this node does not take over: " + refused;
  }
  if (std::string error = str(failover, "etcd_error"); !error.empty()) {
    line += "; etcd: " + error;
  }
  return line;
}

// "syncing 12.0 MiB / 64.0 MiB (18%), 95.2 MiB/s, ETA 1s"
std::string resync_text(const json& resync) {
  auto done = number(resync, "done_bytes");
  auto left = number(resync, "left_bytes");
  auto total = number(resync, "total_bytes");
  if (!total && done && left) total = *done + *left;
  if (!left && done && total && *total >= *done) left = *total - *done;
  std::string out = flag(resync, "full").value_or(false) ? "full sync" : "syncing";
  if (done && total) {
    out += " " + format_amount(*done) + " / " + format_amount(*total);
    if (*total > 0) {
      out += " (" +
             std::to_string(static_cast<unsigned>(static_cast<double>(std::min(*done, *total)) *
                                                  100.0 / static_cast<double>(*total))) +
             "%)";
    }
  } else if (left) {
    out += ", " + format_amount(*left) + " left";
  }
  auto rate = number(resync, "rate_bytes_per_s");
  if (rate) out += ", " + format_amount(*rate) + "/s";
  auto eta = number(resync, "eta_seconds");
  if (!eta && rate && *rate > 0 && left) eta = (*left + *rate - 1) / *rate;
  if (eta) out += ", ETA " + format_eta(*eta);
  return out;
}

// Lines under a peer: split brain, resync progress, how far behind.
std::string peer_details(const json& peer, const json& volume) {
  std::string out;
  if (str(peer, "state") == "split-brain") {
    out +=
        "    split brain: both copies were written since they last agreed; nothing is copied "
        "until an operator chooses (/usr/share/doc/pmirrord/replica-recovery.md)\n";
  }
  const json& resync = member(peer, "resync");
  if (resync.is_object()) {
    out += "    " + resync_text(resync) + "\n";
  } else if (auto dirty = number(peer, "dirty_bytes"); dirty && *dirty > 0) {
    out += "    behind by " + format_amount(*dirty);
    auto chunks = number(peer, "dirty_chunks");
    auto chunk_size = number(volume, "chunk_size");
    if (!chunks && chunk_size && *chunk_size > 0) chunks = (*dirty + *chunk_size - 1) / *chunk_size;
    if (chunks) out += " (" + std::to_string(*chunks) + (*chunks == 1 ? " chunk)" : " chunks)");
    out += "\n";
  }
  return out;
}

std::string hex16(uint64_t value) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016" PRIx64, value);
  return out;
}

}  // namespace

nlohmann::json merge_status(const std::vector<nlohmann::json>& statuses,
                            const std::optional<std::string>& volume) {
  json processes = json::array();
  for (const json& status : statuses) {
    if (!status.is_object()) continue;
    if (!volume) {
      processes.push_back(status);
      continue;
    }
    json filtered = status;
    json volumes = json::array();
    if (status.contains("volumes") && status["volumes"].is_array()) {
      for (const json& v : status["volumes"]) {
        if (str(v, "name") == *volume) volumes.push_back(v);
      }
    }
    if (volumes.empty()) continue;
    filtered["volumes"] = std::move(volumes);
    processes.push_back(std::move(filtered));
  }
  return json{{"schema_version", kSchemaVersion}, {"processes", std::move(processes)}};
}

std::vector<std::string> volume_names(const nlohmann::json& merged) {
  std::set<std::string> names;
  if (merged.contains("processes") && merged["processes"].is_array()) {
    for (const json& process : merged["processes"]) {
      if (!process.is_object() || !process.contains("volumes") || !process["volumes"].is_array())
        continue;
      for (const json& v : process["volumes"]) {
        std::string name = str(v, "name");
        if (!name.empty()) names.insert(name);
      }
    }
  }
  return {names.begin(), names.end()};
}

// pmirrord's connections that never authenticated, when there were any:
// what a flood or a misconfigured initiator looks like (docs/operations.md).
std::string admission_line(const json& process) {
  auto it = process.find("admission");
  if (it == process.end() || !it->is_object()) return {};
  const json& a = *it;
  uint64_t now = number(a, "unauthenticated").value_or(0);
  std::string counts;
  for (auto [key, what] : {std::pair{"evicted", "evicted"}, std::pair{"timed_out", "timed out"},
                           std::pair{"dropped", "dropped"}, std::pair{"refused", "refused"},
                           std::pair{"authentication_failures", "failed authentication"}}) {
    uint64_t n = number(a, key).value_or(0);
    if (n > 0) counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " " + what;
  }
  if (now == 0 && counts.empty()) return {};
  return "(" + process_label(process) + ": " + std::to_string(now) +
         " unauthenticated connection(s) now" + (counts.empty() ? "" : "; since start " + counts) +
         ")\n";
}

std::string format_status_human(const nlohmann::json& merged,
                                const std::optional<std::string>& volume,
                                const HumanFormat& format) {
  struct Entry {
    std::string name;
    const json* volume;
    const json* process;
  };
  std::vector<Entry> entries;
  std::string idle;  // processes with no volume, when not filtering
  if (merged.contains("processes") && merged["processes"].is_array()) {
    for (const json& process : merged["processes"]) {
      if (!process.is_object()) continue;
      bool any = false;
      if (process.contains("volumes") && process["volumes"].is_array()) {
        for (const json& v : process["volumes"]) {
          std::string name = str(v, "name");
          any = true;
          if (volume && name != *volume) continue;
          entries.push_back({name, &v, &process});
        }
      }
      if (!any && !volume) idle += "(" + process_label(process) + ": no volumes)\n";
      if (!volume) idle += admission_line(process);
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.name < b.name; });
  std::string out;
  for (const Entry& entry : entries) {
    out += volume_line(*entry.volume, *entry.process) + "\n";
    const json& v = *entry.volume;
    if (str(v, "state") == "failed") out += "  failed: " + str(v, "error") + "\n";
    if (std::string copy = copy_line(v); !copy.empty()) out += copy + "\n";
    if (std::string fenced = fences_line(v, format); !fenced.empty()) out += fenced + "\n";
    if (std::string lease = failover_line(v, format); !lease.empty()) out += lease + "\n";
    if (v.contains("peers") && v["peers"].is_array() && !v["peers"].empty()) {
      for (const json& peer : v["peers"]) {
        if (flag(peer, "ended").value_or(false)) {
          out += ended_session_line(peer, format) + "\n";
          continue;
        }
        out += peer_line(peer, format) + "\n";
        out += peer_details(peer, v);
      }
    } else if (flag(v, "local_only").value_or(false)) {
      out += "  (no replicas: a persist is durable on this copy only; nothing is mirrored)\n";
    } else {
      out += "  (no peers)\n";
    }
  }
  return out + idle;
}

std::string format_event_human(const nlohmann::json& event, const HumanFormat& format) {
  // Events are live: the time of day is enough.
  auto time = parse_rfc3339(str(event, "time"));
  std::string out = strftime_string(broken_down(time.value_or(format.now), format.utc), "%H:%M:%S");
  if (auto dropped = number(event, "dropped")) {
    return out + " (" + std::to_string(*dropped) + " event(s) dropped: pmirrorctl did not keep up)";
  }
  std::string volume = str(event, "volume"), peer = str(event, "peer");
  if (!volume.empty()) out += " " + volume;
  if (!peer.empty()) out += " " + peer;
  if (flag(event, "exists").value_or(false)) {
    out += ": exists";
    if (std::string role = str(event, "role"); !role.empty()) out += " role:" + role;
    if (std::string state = str(event, "state"); !state.empty()) out += " " + state;
    if (auto since = parse_rfc3339(str(event, "since"))) {
      out += " since " + clock_time(*since, format);
    }
    if (std::string reason = str(event, "reason"); !reason.empty()) out += " (" + reason + ")";
    return out;
  }
  std::string from = str(event, "from"), to = str(event, "to");
  std::string reason = str(event, "reason"), message = str(event, "message");
  if (!volume.empty() || !peer.empty()) out += ":";
  if (!to.empty()) {
    out += " " + (from.empty() ? to : from + " -> " + to);
    if (!reason.empty()) out += " (" + reason + ")";
  } else if (!message.empty()) {
    out += " " + message;
  } else if (!reason.empty()) {
    out += " " + reason;
  } else {
    out += " " + event.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return out;
}

std::vector<json> state_events(const json& status, Clock::time_point now) {
  std::vector<json> events;
  const json kNone = json::object();
  const json& process =
      status.contains("process") && status["process"].is_object() ? status["process"] : kNone;
  json common = {{"time", format_rfc3339(now)}, {"exists", true}};
  if (std::string kind = str(process, "kind"); !kind.empty()) common["process"] = kind;
  if (std::string node = str(process, "node"); !node.empty()) common["node"] = node;
  if (!status.contains("volumes") || !status["volumes"].is_array()) return events;
  for (const json& volume : status["volumes"]) {
    if (!volume.is_object()) continue;
    json line = common;
    line["volume"] = str(volume, "name");
    if (std::string role = str(volume, "role"); !role.empty()) line["role"] = role;
    events.push_back(line);
    if (!volume.contains("peers") || !volume["peers"].is_array()) continue;
    for (const json& peer : volume["peers"]) {
      if (!peer.is_object()) continue;
      json peer_line = common;
      peer_line["volume"] = str(volume, "name");
      peer_line["peer"] = str(peer, "name");
      for (const char* key : {"state", "since", "reason"}) {
        if (std::string value = str(peer, key); !value.empty()) peer_line[key] = value;
      }
      events.push_back(std::move(peer_line));
    }
  }
  return events;
}

std::string format_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t unit = 0;
  uint64_t scale = 1;
  while (unit + 1 < std::size(kUnits) && bytes / scale >= 1024) {
    scale *= 1024;
    ++unit;
  }
  char out[32];
  if (bytes % scale == 0) {
    std::snprintf(out, sizeof(out), "%" PRIu64 "%s", bytes / scale, kUnits[unit]);
  } else {
    std::snprintf(out, sizeof(out), "%.1f%s",
                  static_cast<double>(bytes) / static_cast<double>(scale), kUnits[unit]);
  }
  return out;
}

std::string format_amount(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  size_t unit = 0;
  double value = static_cast<double>(bytes);
  while (unit + 1 < std::size(kUnits) && value >= 1024.0) {
    value /= 1024.0;
    ++unit;
  }
  // 1023.96 MiB would print as "1024.0 MiB": move up a unit instead.
  if (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char out[32];
  std::snprintf(out, sizeof(out), "%.1f %s", value, kUnits[unit]);
  return out;
}

std::string format_eta(uint64_t seconds) {
  char out[32];
  if (seconds < 60) {
    std::snprintf(out, sizeof(out), "%" PRIu64 "s", seconds);
  } else if (seconds < 3600) {
    std::snprintf(out, sizeof(out), "%" PRIu64 "m%02" PRIu64 "s", seconds / 60, seconds % 60);
  } else if (seconds < 86400) {
    std::snprintf(out, sizeof(out), "%" PRIu64 "h%02" PRIu64 "m", seconds / 3600,
                  seconds % 3600 / 60);
  } else {
    std::snprintf(out, sizeof(out), "%" PRIu64 "d%02" PRIu64 "h", seconds / 86400,
                  seconds % 86400 / 3600);
  }
  return out;
}

std::string format_generation(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_unsigned()) {
    uint64_t g = value.get<uint64_t>();
    return g < (1ull << 32) ? std::to_string(g) : hex16(g);
  }
  if (value.is_number_integer()) {
    int64_t g = value.get<int64_t>();
    if (g >= 0 && g < (int64_t{1} << 32)) return std::to_string(g);
    return hex16(static_cast<uint64_t>(g));
  }
  return {};
}

void attach_failover(std::vector<nlohmann::json>& statuses, const nlohmann::json& promoter) {
  const json& volumes = member(promoter, "volumes");
  if (!volumes.is_array()) return;
  const std::string etcd_error = str(member(promoter, "lease"), "error");
  for (json& status : statuses) {
    if (!status.is_object() || !status.contains("volumes") || !status["volumes"].is_array()) {
      continue;
    }
    for (json& v : status["volumes"]) {
      for (const json& f : volumes) {
        if (str(f, "name") != str(v, "name") || !v.is_object()) continue;
        v["failover"] = {{"holder", str(f, "holder")},
                         {"held_here", flag(f, "held").value_or(false)},
                         {"since", str(f, "since")},
                         {"refused", str(f, "refused")},
                         {"etcd_error", etcd_error}};
      }
    }
  }
}

bool has_primary_volume(const nlohmann::json& status, const std::string& volume) {
  const json& volumes = member(status, "volumes");
  if (!volumes.is_array()) return false;
  for (const json& v : volumes) {
    if (str(v, "name") == volume && str(v, "role") == "primary") return true;
  }
  return false;
}

std::string format_resync_human(const nlohmann::json& result) {
  std::string volume = str(result, "volume");
  std::string peer = str(result, "peer");
  bool full = flag(result, "full").value_or(false);
  std::string out = volume + ": ";
  if (!flag(result, "started").value_or(false)) {
    out += "no resync of " + peer + " started";
    if (std::string reason = str(result, "reason"); !reason.empty()) out += ": " + reason;
    return out;
  }
  out += std::string(full ? "full resync" : "resync") + " of " + peer + " started";
  if (auto dirty = number(result, "dirty_bytes")) {
    out += ": " + format_amount(*dirty);
    if (auto chunks = number(result, "dirty_chunks")) {
      out += " (" + std::to_string(*chunks) + (*chunks == 1 ? " chunk)" : " chunks)");
    }
    out += " to copy";
  }
  return out + "; follow it with `pmirrorctl status " + volume + "`";
}

// The peers of `volume` as primary in one process's status object (null
// when it has no such volume or no peer list).
static const json& primary_peers(const json& status, const std::string& volume) {
  static const json none;
  const json& volumes = member(status, "volumes");
  if (!volumes.is_array()) return none;
  for (const json& v : volumes) {
    if (str(v, "name") == volume && str(v, "role") == "primary") {
      const json& peers = member(v, "peers");
      return peers.is_array() ? peers : none;
    }
  }
  return none;
}

// " (18%)": floored, so 100% only once everything is done; "" for no total.
static std::string percent(uint64_t done, uint64_t total) {
  return total == 0 ? std::string() : " (" + std::to_string(done * 100 / total) + "%)";
}

nlohmann::json find_peer(const nlohmann::json& status, const std::string& volume,
                         const std::string& peer) {
  const json& peers = primary_peers(status, volume);
  if (peers.is_array()) {
    for (const json& p : peers) {
      if (str(p, "name") == peer) return p;
    }
  }
  return nullptr;
}

ResyncObservation observe_resync(const std::string& volume, const nlohmann::json& peer,
                                 uint64_t resyncs_before) {
  ResyncObservation seen;
  std::string name = str(peer, "name");
  std::string state = str(peer, "state");
  const json& progress = member(peer, "resync");
  if (!progress.is_object()) {
    if (number(peer, "resyncs").value_or(0) > resyncs_before) {
      seen.outcome = ResyncOutcome::kDone;
      seen.line = volume + ": " + name + " in sync";
      return seen;
    }
  }
  // Connected, or copying to it: the resync goes on. Any other state
  // (disconnected, connecting again, refused, split-brain, closed) means the
  // replica went away.
  if (state != "connected" && state != "syncing" && state != "lagging") {
    seen.outcome = ResyncOutcome::kStopped;
    seen.line = volume + ": resync of " + name + " stopped: " + name + " is " + state;
    if (std::string reason = str(peer, "reason"); !reason.empty()) seen.line += " (" + reason + ")";
    seen.line += state == "refused" || state == "split-brain"
                     ? "; see /usr/share/doc/pmirrord/replica-recovery.md"
                     : "; it resumes when the replica is back: `pmirrorctl status " + volume + "`";
    return seen;
  }
  seen.line = volume + " -> " + name + ": ";
  if (!progress.is_object()) {
    seen.line += "waiting for the resync to start (" + state + ")";
    return seen;
  }
  seen.done_bytes = number(progress, "done_bytes").value_or(0);
  seen.total_bytes = number(progress, "total_bytes").value_or(0);
  seen.line += format_amount(seen.done_bytes) + " of " + format_amount(seen.total_bytes) +
               percent(seen.done_bytes, seen.total_bytes);
  if (auto rate = number(progress, "rate_bytes_per_s"); rate && *rate > 0) {
    seen.line += ", " + format_amount(*rate) + "/s";
  }
  if (auto eta = number(progress, "eta_seconds")) seen.line += ", " + format_eta(*eta) + " left";
  return seen;
}

std::vector<std::tuple<std::string, uint64_t, uint64_t>> verify_progress(
    const nlohmann::json& status, const std::string& volume) {
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> out;
  const json& peers = primary_peers(status, volume);
  if (!peers.is_array()) return out;
  for (const json& p : peers) {
    const json& progress = member(p, "verify");
    if (!progress.is_object()) continue;
    out.emplace_back(str(p, "name"), number(progress, "done_bytes").value_or(0),
                     number(progress, "total_bytes").value_or(0));
  }
  return out;
}

std::string format_verify_progress(const std::string& volume, const std::string& peer,
                                   uint64_t done_bytes, uint64_t total_bytes) {
  return volume + " verify of " + peer + ": " + format_amount(done_bytes) + " of " +
         format_amount(total_bytes) + " compared" + percent(done_bytes, total_bytes);
}

uint64_t verify_mismatches(const nlohmann::json& result) {
  uint64_t total = 0;
  const json& peers = member(result, "peers");
  if (!peers.is_array()) return 0;
  for (const json& peer : peers) {
    if (auto count = number(peer, "mismatch_count")) {
      total += *count;
    } else if (const json& list = member(peer, "mismatches"); list.is_array()) {
      total += list.size();
    }
  }
  return total;
}

uint64_t verify_failures(const nlohmann::json& result) {
  uint64_t failures = 0;
  const json& peers = member(result, "peers");
  if (!peers.is_array()) return 0;
  for (const json& peer : peers) {
    if (!member(peer, "error").is_null()) ++failures;
  }
  return failures;
}

std::string format_verify_human(const nlohmann::json& result, size_t max_ranges) {
  std::string volume = str(result, "volume");
  const json& peers = member(result, "peers");
  if (!peers.is_array() || peers.empty()) return volume + ": no replica was compared\n";
  std::string out;
  for (const json& peer : peers) {
    std::string name = str(peer, "name");
    out += volume + " " + (name.empty() ? "?" : name) + ": ";
    if (const json& error = member(peer, "error"); !error.is_null()) {
      std::string message = error.is_object() ? str(error, "message") : str(peer, "error");
      out += "not compared: " + (message.empty() ? error.dump() : message) + "\n";
      continue;
    }
    std::string compared;
    auto chunks = number(peer, "chunks_compared");
    auto bytes = number(peer, "bytes_compared");
    if (chunks) compared = std::to_string(*chunks) + (*chunks == 1 ? " chunk" : " chunks");
    if (bytes) compared += (compared.empty() ? "" : ", ") + format_amount(*bytes);
    if (!compared.empty()) compared += " compared";
    // The first max_ranges of `list`, then "... and N more".
    auto list_ranges = [&](const json& list, uint64_t count) {
      size_t shown = 0;
      if (list.is_array()) {
        for (const json& range : list) {
          if (shown == max_ranges) break;
          auto offset = number(range, "offset");
          auto length = number(range, "length");
          char line[96];
          std::snprintf(line, sizeof(line), "  offset 0x%" PRIx64 " length %s\n",
                        offset.value_or(0), length ? format_amount(*length).c_str() : "?");
          out += line;
          ++shown;
        }
      }
      if (count > shown) out += "  ... and " + std::to_string(count - shown) + " more\n";
    };
    const json& list = member(peer, "mismatches");
    uint64_t count = number(peer, "mismatch_count").value_or(list.is_array() ? list.size() : 0);
    const json& busy = member(peer, "busy");
    uint64_t busy_count = number(peer, "busy_count").value_or(busy.is_array() ? busy.size() : 0);
    if (count == 0) {
      out += "equal" + (compared.empty() ? "" : " (" + compared + ")");
    } else {
      out += std::to_string(count) + (count == 1 ? " mismatching range" : " mismatching ranges") +
             (compared.empty() ? "" : " (" + compared + ")") + ":\n";
      list_ranges(list, count);
    }
    if (busy_count > 0) {
      out += std::string(count == 0 ? "; " : "  ") + std::to_string(busy_count) +
             (busy_count == 1 ? " busy range" : " busy ranges") +
             " not verified (being written; run verify again):\n";
      list_ranges(busy, busy_count);
    } else if (count == 0) {
      out += "\n";
    }
    if (auto marked = number(peer, "marked_dirty"); marked && *marked > 0) {
      out += "  " + std::to_string(*marked) + (*marked == 1 ? " chunk" : " chunks") +
             " marked dirty; the resync copies them\n";
    }
  }
  return out;
}

std::string format_promote_human(const nlohmann::json& result) {
  std::string volume = str(result, "volume");
  std::string node = str(result, "node");
  std::string generation = format_generation(member(result, "generation"));
  std::string on = node.empty() ? "" : " on " + node;
  if (!flag(result, "promoted").value_or(false)) {
    return volume + " demoted" + on + (generation.empty() ? "" : ": generation " + generation) +
           "; a replica again";
  }
  std::string previous = format_generation(member(result, "previous"));
  // One line per other node: fenced, or why not (docs/failover.md).
  auto fences = [&] {
    std::string lines;
    const json& list = member(result, "fences");
    if (!list.is_array()) return lines;
    for (const json& f : list) {
      if (!f.is_object()) continue;
      std::string node_name = str(f, "node");
      if (flag(f, "fenced").value_or(false)) {
        const json& ended = member(f, "sessions_ended");
        bool ended_one = ended.is_number_unsigned() && ended.get<uint64_t>() > 0;
        lines += "\n  fenced on " + node_name +
                 (ended_one ? " (the old primary's session there was ended)" : "");
      } else if (flag(f, "pending").value_or(false)) {
        lines += "\n  NOT fenced on " + node_name + " yet: " + str(f, "error") +
                 " (that copy may still take the old primary's writes until it is; pmirrord "
                 "retries in the background, `pmirrorctl status` shows when it lands)";
      } else {
        lines += "\n  NOT fenced on " + node_name + ": " + str(f, "error") +
                 " (that copy may still take the old primary's writes; run promote again)";
      }
    }
    return lines;
  };
  if (flag(result, "already_promoted").value_or(false)) {
    return volume + " was already promoted" + on +
           (generation.empty() ? "" : ": generation " + generation) + fences();
  }
  std::string out = volume + " promoted" + on;
  if (flag(result, "forced").value_or(false)) out += " (forced)";
  if (!generation.empty()) out += ": generation " + generation;
  if (!previous.empty()) out += " (was " + previous + ")";
  return out + fences();
}

std::string format_latency_us(double microseconds) {
  char out[32];
  if (microseconds < 999.5) {
    std::snprintf(out, sizeof(out), "%.0fus", microseconds);
  } else if (microseconds < 999950.0) {
    std::snprintf(out, sizeof(out), "%.1fms", microseconds / 1000.0);
  } else {
    std::snprintf(out, sizeof(out), "%.1fs", microseconds / 1e6);
  }
  return out;
}

}  // namespace pmirror::control
