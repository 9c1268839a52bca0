// pmirrorctl's presentation: merging status objects and the human forms.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <set>

#include "control/control.h"

namespace pmirror::control {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::system_clock;

std::string str(const json& object, const char* key) {
  if (!object.is_object()) return {};
  auto it = object.find(key);
  if (it == object.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_null()) return {};
  return it->dump();
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
  return v < 0 ? 0 : static_cast<uint64_t>(v);
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
  if (auto since = parse_time(str(peer, "since"))) {
    line += " since " + clock_time(*since, format);
    std::string how_long = ago(*since, format.now);
    if (!how_long.empty()) line += " " + how_long;
  }
  append_field(line, "method", str(peer, "method"));
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
  if (auto v = number(peer, "errors"); v && *v > 0)
    append_field(line, "errors", std::to_string(*v));
  std::string reason = str(peer, "reason");
  if (state != "connected" && !reason.empty()) line += " reason: " + reason;
  return line;
}

std::string volume_line(const json& volume, const json& process) {
  std::string line = str(volume, "name");
  append_field(line, "role", str(volume, "role"));
  if (auto v = number(volume, "size")) append_field(line, "size", format_size(*v));
  append_field(line, "backing", str(volume, "backing"));
  if (auto v = number(volume, "generation")) append_field(line, "generation", std::to_string(*v));
  if (auto v = number(volume, "last_sequence")) append_field(line, "last-seq", std::to_string(*v));
  line += " (" + process_label(process) + ")";
  return line;
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
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.name < b.name; });
  std::string out;
  for (const Entry& entry : entries) {
    out += volume_line(*entry.volume, *entry.process) + "\n";
    const json& v = *entry.volume;
    if (v.contains("peers") && v["peers"].is_array() && !v["peers"].empty()) {
      for (const json& peer : v["peers"]) out += peer_line(peer, format) + "\n";
    } else {
      out += "  (no peers)\n";
    }
  }
  return out + idle;
}

std::string format_event_human(const nlohmann::json& event, const HumanFormat& format) {
  // Events are live: the time of day is enough.
  auto time = parse_time(str(event, "time"));
  std::string out = strftime_string(broken_down(time.value_or(format.now), format.utc), "%H:%M:%S");
  if (auto dropped = number(event, "dropped")) {
    return out + " (" + std::to_string(*dropped) + " event(s) dropped: pmirrorctl did not keep up)";
  }
  std::string volume = str(event, "volume"), peer = str(event, "peer");
  if (!volume.empty()) out += " " + volume;
  if (!peer.empty()) out += " " + peer;
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

std::optional<std::chrono::system_clock::time_point> parse_time(std::string_view iso8601) {
  if (iso8601.size() < 20) return std::nullopt;
  std::string text(iso8601);
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6 ||
      consumed != 19) {
    return std::nullopt;
  }
  std::string_view rest = std::string_view(text).substr(19);
  std::chrono::microseconds fraction{0};
  if (!rest.empty() && rest.front() == '.') {
    rest.remove_prefix(1);
    int64_t micros = 0;
    int digits = 0;
    while (!rest.empty() && rest.front() >= '0' && rest.front() <= '9') {
      if (digits < 6) {
        micros = micros * 10 + (rest.front() - '0');
        ++digits;
      }
      rest.remove_prefix(1);
    }
    while (digits++ < 6) micros *= 10;
    fraction = std::chrono::microseconds(micros);
  }
  if (rest != "Z" && rest != "+00:00") return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  std::time_t seconds = timegm(&tm);
  if (seconds == static_cast<std::time_t>(-1)) return std::nullopt;
  return Clock::from_time_t(seconds) + fraction;
}

std::string format_time(std::chrono::system_clock::time_point time) {
  return strftime_string(broken_down(time, true), "%Y-%m-%dT%H:%M:%SZ");
}

}  // namespace pmirror::control
