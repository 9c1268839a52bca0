// The cluster file: its schema and validation (Parser), as far as the file
// alone tells. What each node derives from it is in cluster_plan.cpp.
#include <arpa/inet.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/config_internal.h"
#include "config/yaml_documents.h"
#include "protocol/protocol.h"

namespace pmirror::config {
namespace {

// Names and identities travel in the protocol's Hello (header-only
// constant: the config library does not link the protocol).
constexpr size_t kMaxNameLength = protocol::kMaxNameLength;
constexpr uint64_t kPageSize = 4096;
// A dirty bit stands for one chunk (metadata::kMinChunk..kMaxChunk).
constexpr uint64_t kMinChunk = 4096;
constexpr uint64_t kMaxChunk = 1ull << 20;
// Below this a resync of any real volume would take days: a typo (100/s
// for 100MiB/s) rather than a wish.
constexpr uint64_t kMinResyncRate = 1ull << 20;

constexpr std::string_view kTopKeys[] = {"cluster", "daemon", "failover", "nodes", "volumes"};
constexpr std::string_view kClusterKeys[] = {"name"};
constexpr std::string_view kDaemonKeys[] = {"control_socket",
                                            "log_level",
                                            "metrics",
                                            "state_pool",
                                            "heartbeat_interval",
                                            "heartbeat_timeout",
                                            "reconnect_initial",
                                            "reconnect_max",
                                            "handshake_timeout",
                                            "max_unauthenticated",
                                            "max_unauthenticated_per_source",
                                            "lease_dir"};
// Unauthenticated connections a daemon may be told to keep: each costs a
// socket (a file descriptor), so beyond this the limit means nothing.
constexpr uint64_t kMaxUnauthenticatedLimit = 65536;
constexpr std::string_view kNodeKeys[] = {"name",    "address",    "port",           "transport",
                                          "listen",  "state_pool", "control_socket", "log_level",
                                          "metrics", "lease_dir"};
constexpr std::string_view kVolumeKeys[] = {"name",        "size",
                                            "primary",     "replicas",
                                            "ack",         "on_insufficient",
                                            "path",        "paths",
                                            "create",      "allowed_peers",
                                            "secret",      "secret_file",
                                            "apm",         "chunk",
                                            "resync_rate", "after_split_brain",
                                            "metadata",    "poll",
                                            "failover",    "native_persistence"};
// `failover` (docs/failover.md, section 2).
constexpr std::string_view kFailoverKeys[] = {"engine", "etcd"};
constexpr std::string_view kEngines[] = {"none", "etcd", "pacemaker"};
constexpr std::string_view kEtcdKeys[] = {"endpoints", "prefix", "ttl", "renew",
                                          "timeout",   "margin", "tls"};
constexpr std::string_view kTlsKeys[] = {"ca", "cert", "key"};
constexpr std::string_view kVolumeFailoverKeys[] = {"hook_unit", "start_command", "stop_command"};
// What systemctl can start: unit types with a start job.
constexpr std::string_view kUnitSuffixes[] = {".service",   ".socket", ".target", ".mount",
                                              ".automount", ".swap",   ".path",   ".timer",
                                              ".slice",     ".scope",  ".device"};
// The lease timing's lower bounds: below them, scheduling and network
// jitter alone would cost a primary its lease.
constexpr std::chrono::milliseconds kMinLeaseTtl{3000};
constexpr std::chrono::milliseconds kMinLeaseRenew{100};
constexpr std::chrono::milliseconds kMinEtcdTimeout{100};
constexpr std::string_view kLogLevels[] = {"trace", "debug",    "info", "warn",
                                           "error", "critical", "off"};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      size_t substitute = diagonal + (std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                                              std::tolower(static_cast<unsigned char>(b[j - 1]))
                                          ? 0
                                          : 1);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The allowed key `name` was probably meant as: one at most two edits
// away, else one that `name` starts with (chunk_size -> chunk,
// metadata_path -> metadata); empty if none.
std::string similar_key(std::string_view name, std::span<const std::string_view> allowed) {
  for (auto candidate : allowed) {
    if (edit_distance(name, candidate) <= 2) return std::string(candidate);
  }
  for (auto candidate : allowed) {
    if (candidate.size() >= 4 && name.size() > candidate.size() &&
        name.substr(0, candidate.size()) == candidate) {
      return std::string(candidate);
    }
  }
  return {};
}

// Node, volume and identity names travel in the protocol and appear in logs
// and file names, so keep them to a conservative charset.
std::string check_name(std::string_view name) {
  if (name.empty()) return "must not be empty";
  if (name.size() > kMaxNameLength) {
    return "'" + std::string(name) + "' is " + std::to_string(name.size()) +
           " characters; at most " + std::to_string(kMaxNameLength) +
           " are allowed (the protocol carries names and identities of at most " +
           std::to_string(kMaxNameLength) + " bytes)";
  }
  for (char c : name) {
    bool good = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-';
    if (!good) {
      return "'" + std::string(name) +
             "' contains a character that is not allowed; use only letters, digits, '.', '_' "
             "and '-'";
    }
  }
  return {};
}

// What the operator wrote instead of what we expected, for "expected X, got Y".
std::string type_name(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      return "'" + (text.size() > 40 ? text.substr(0, 40) + "..." : text) + "'";
    }
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Undefined:
      return "nothing";
  }
  return "something else";
}

// "2s", "1500ms": how the timing rule's message shows a duration.
std::string duration_text(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

// Empty when `unit` is a name systemctl can start (db1-app.service,
// app@db1.service); otherwise why not.
std::string check_unit_name(std::string_view unit) {
  constexpr size_t kMaxUnitName = 255;  // systemd's UNIT_NAME_MAX
  if (unit.size() > kMaxUnitName) {
    return "is " + std::to_string(unit.size()) + " characters; a unit name has at most " +
           std::to_string(kMaxUnitName);
  }
  std::string_view suffix;
  for (auto candidate : kUnitSuffixes) {
    if (unit.size() > candidate.size() && unit.ends_with(candidate)) suffix = candidate;
  }
  const std::string quoted = "'" + std::string(unit) + "'";
  if (suffix.empty()) {
    return quoted + " is not a systemd unit name; it must end in " + join(kUnitSuffixes) +
           " (e.g. db1-app.service)";
  }
  for (char c : unit) {
    bool good = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == ':' || c == '-' || c == '_' || c == '.' || c == '\\' || c == '@';
    if (!good) {
      return quoted +
             " contains a character a systemd unit name cannot have (no '/' or whitespace; "
             "letters, digits and ':-_.\\@' only)";
    }
  }
  std::string_view prefix = unit.substr(0, unit.size() - suffix.size());
  if (prefix.front() == '@' || std::count(prefix.begin(), prefix.end(), '@') > 1) {
    return quoted + " is not a systemd unit name (at most one '@', not at the start)";
  }
  if (prefix.back() == '@') {
    return quoted + " is a template; name an instance of it (e.g. " + std::string(prefix) + "db1" +
           std::string(suffix) + ")";
  }
  return {};
}

// Everything one parse needs: the source name for messages and the list of
// problems found so far (we keep going after an error so the operator sees
// all of them at once).
class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  std::string where(const YAML::Mark& mark) const {
    if (mark.is_null()) return source_;
    return source_ + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }

  void error(const YAML::Mark& given, const std::string& context, const std::string& problem) {
    // yaml-cpp's mark of an alias is its anchor's, and that of an empty
    // sequence item the next token's (maybe past the end of the file): use
    // where the node really is (scan_document), and never a line the file
    // does not have.
    YAML::Mark mark = given;
    if (auto fix = fixes_.find(context);
        fix != fixes_.end() && same_mark(fix->second.given, mark)) {
      mark = fix->second.actual;
    }
    if (text_ != nullptr) mark = clamp_mark(*text_, mark);
    std::string line = where(mark) + ": ";
    if (!context.empty()) line += context + ": ";
    line += problem;
    Problem p;
    if (!mark.is_null()) {
      p.line = mark.line + 1;
      p.column = mark.column + 1;
    }
    p.text = std::move(line);
    problems_.push_back(std::move(p));
  }

  std::vector<Problem>& problems() { return problems_; }

  // One key of a map together with where to blame problems with its value:
  // a null value (`key:` with nothing after it) has a useless mark (start of
  // the next line), so point at the key instead.
  struct Entry {
    YAML::Node key;
    YAML::Node value;
    YAML::Mark value_mark() const { return value.IsNull() ? key.Mark() : value.Mark(); }
  };
  using Entries = std::map<std::string, Entry>;

  // Splits a map into its entries, rejecting unknown and duplicate keys.
  // yaml-cpp keeps duplicate keys (and lookup would silently pick one), so
  // check for them here.
  Entries entries(const YAML::Node& map, const std::string& context,
                  std::span<const std::string_view> allowed) {
    Entries out;
    for (auto it = map.begin(); it != map.end(); ++it) {
      // Copies: yaml-cpp's iterator yields a temporary proxy, so a reference
      // to it->first would dangle.
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      if (!key.IsScalar()) {
        error(key.Mark(), context, "expected a key name, got " + type_name(key));
        continue;
      }
      const std::string& name = key.Scalar();
      if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
        std::string problem = "unknown key '" + name + "'";
        if (auto hint = similar_key(name, allowed); !hint.empty()) {
          problem += " (did you mean '" + hint + "'?)";
        }
        problem += "; allowed keys: " + join(allowed);
        error(key.Mark(), context, problem);
        continue;
      }
      auto [previous, inserted] = out.emplace(name, Entry{key, value});
      if (!inserted) {
        error(key.Mark(), context,
              "duplicate key '" + name + "' (first at " + where(previous->second.key.Mark()) + ")");
      }
    }
    return out;
  }

  static const Entry* find(const Entries& keys, const char* name) {
    auto it = keys.find(name);
    return it == keys.end() ? nullptr : &it->second;
  }

  std::optional<std::string> scalar(const Entry& entry, const std::string& context,
                                    const char* expected) {
    if (!entry.value.IsScalar()) {
      error(entry.value_mark(), context,
            std::string("expected ") + expected + ", got " + type_name(entry.value));
      return std::nullopt;
    }
    return entry.value.Scalar();
  }

  std::optional<std::string> string(const Entry& entry, const std::string& context) {
    auto text = scalar(entry, context, "a string");
    if (text && text->empty()) {
      error(entry.value_mark(), context, "must not be empty");
      return std::nullopt;
    }
    return text;
  }

  std::optional<std::string> absolute_path(const Entry& entry, const std::string& context) {
    auto text = string(entry, context);
    if (text && text->front() != '/') {
      error(entry.value_mark(), context,
            "'" + *text + "' is not an absolute path; write the full path starting with '/'");
      return std::nullopt;
    }
    return text;
  }

  std::optional<std::string> name(const Entry& entry, const std::string& context,
                                  const char* what) {
    auto text = scalar(entry, context, "a name");
    if (!text) return std::nullopt;
    if (auto problem = check_name(*text); !problem.empty()) {
      error(entry.value_mark(), context, std::string(what) + " " + problem);
      return std::nullopt;
    }
    return text;
  }

  // YAML 1.1 would also take yes/no/on/off; accepting only true/false keeps
  // `apm: off`-style values from being confused with booleans.
  std::optional<bool> boolean(const Entry& entry, const std::string& context) {
    auto text = scalar(entry, context, "true or false");
    if (!text) return std::nullopt;
    if (*text == "true") return true;
    if (*text == "false") return false;
    error(entry.value_mark(), context, "expected true or false, got '" + *text + "'");
    return std::nullopt;
  }

  std::optional<uint64_t> integer(const Entry& entry, const std::string& context, uint64_t min,
                                  uint64_t max, const std::string& expected) {
    auto text = scalar(entry, context, expected.c_str());
    if (!text) return std::nullopt;
    uint64_t value = 0;
    auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
    if (text->empty() || ec != std::errc() || end != text->data() + text->size() || value < min ||
        value > max) {
      error(entry.value_mark(), context, "expected " + expected + ", got '" + *text + "'");
      return std::nullopt;
    }
    return value;
  }

  std::optional<uint16_t> port(const Entry& entry, const std::string& context) {
    auto value = integer(entry, context, 1, 65535, "a port number 1..65535");
    if (!value) return std::nullopt;
    return static_cast<uint16_t>(*value);
  }

  std::optional<std::string> one_of(const Entry& entry, const std::string& context,
                                    std::span<const std::string_view> choices) {
    std::string expected = "one of " + join(choices);
    auto text = scalar(entry, context, expected.c_str());
    if (!text) return std::nullopt;
    if (std::find(choices.begin(), choices.end(), *text) == choices.end()) {
      error(entry.value_mark(), context, "'" + *text + "' is not " + expected);
      return std::nullopt;
    }
    return text;
  }

  std::optional<std::chrono::milliseconds> duration(const Entry& entry, const std::string& context,
                                                    bool allow_zero = false) {
    auto text = scalar(entry, context, "a duration such as 200ms, 5s or 1m");
    if (!text) return std::nullopt;
    auto value = parse_duration(*text);
    if (!value.ok()) {
      error(entry.value_mark(), context, value.status().message());
      return std::nullopt;
    }
    if (value->count() == 0 && !allow_zero) {
      error(entry.value_mark(), context, "must be greater than zero");
      return std::nullopt;
    }
    return *value;
  }

  // A list of names (replicas, allowed_peers): each checked, none twice.
  std::optional<std::vector<std::pair<std::string, YAML::Mark>>> name_list(
      const Entry& entry, const std::string& context, const char* what, const char* example,
      const char* empty_problem) {
    if (!entry.value.IsSequence()) {
      error(entry.value_mark(), context,
            std::string("expected a list of ") + what + "s (e.g. " + example + "), got " +
                type_name(entry.value));
      return std::nullopt;
    }
    if (entry.value.size() == 0) {
      error(entry.value_mark(), context, empty_problem);
      return std::nullopt;
    }
    std::vector<std::pair<std::string, YAML::Mark>> out;
    std::map<std::string, YAML::Mark> listed;
    bool bad = false;
    for (size_t i = 0; i < entry.value.size(); ++i) {
      const YAML::Node item = entry.value[i];
      std::string item_context = context + "[" + std::to_string(i) + "]";
      if (!item.IsScalar()) {
        error(item.Mark(), item_context,
              std::string("expected a ") + what + " name, got " + type_name(item));
        bad = true;
        continue;
      }
      if (auto problem = check_name(item.Scalar()); !problem.empty()) {
        error(item.Mark(), item_context, std::string(what) + " " + problem);
        bad = true;
        continue;
      }
      if (auto [first, inserted] = listed.emplace(item.Scalar(), item.Mark()); !inserted) {
        error(item.Mark(), item_context,
              std::string(what) + " '" + item.Scalar() + "' is listed twice (first at " +
                  where(first->second) + ")");
        bad = true;
        continue;
      }
      out.emplace_back(item.Scalar(), item.Mark());
    }
    if (bad) return std::nullopt;
    return out;
  }

  // ------------------------------------------------------------- sections

  struct DaemonMarks {
    std::optional<YAML::Mark> heartbeat_timeout, reconnect_max, heartbeat_interval,
        reconnect_initial;
  };

  // Keys shared by `daemon` and node entries (the per-node overrides).
  void parse_daemon_overrides(const Entries& keys, const std::string& context,
                              DaemonSettings& settings) {
    if (auto* e = find(keys, "control_socket")) {
      std::string key_context = context + "control_socket";
      if (auto v = absolute_path(*e, key_context)) {
        if (v->size() >= sizeof(sockaddr_un{}.sun_path)) {
          error(e->value_mark(), key_context,
                "'" + *v + "' is " + std::to_string(v->size()) +
                    " characters; a unix socket path holds at most " +
                    std::to_string(sizeof(sockaddr_un{}.sun_path) - 1));
        } else {
          settings.control_socket = *v;
          settings.control_socket_origin = {where(e->value_mark()), key_context};
        }
      }
    }
    if (auto* e = find(keys, "log_level")) {
      if (auto v = one_of(*e, context + "log_level", kLogLevels)) settings.log_level = *v;
    }
    if (auto* e = find(keys, "state_pool")) {
      if (auto v = absolute_path(*e, context + "state_pool")) {
        settings.state_pool = *v;
        settings.state_pool_origin = {where(e->value_mark()), context + "state_pool"};
      }
    }
    if (auto* e = find(keys, "lease_dir")) {
      if (auto v = absolute_path(*e, context + "lease_dir")) settings.lease_dir = *v;
    }
    if (auto* e = find(keys, "metrics")) {
      if (auto v = scalar(*e, context + "metrics", "HOST:PORT or off")) {
        if (*v == "off") {
          settings.metrics.reset();
        } else if (auto address = parse_host_port(*v); address.ok()) {
          settings.metrics = *address;
        } else {
          error(e->value_mark(), context + "metrics",
                address.status().message() + " (or 'off' for no metrics endpoint)");
        }
      }
    }
  }

  void parse_daemon(const Entry& entry, DaemonSettings& settings) {
    if (entry.value.IsNull()) return;  // `daemon:` with every key commented out: all defaults
    if (!entry.value.IsMap()) {
      error(entry.value_mark(), "daemon",
            std::string("expected a map of settings, got ") + type_name(entry.value));
      return;
    }
    auto keys = entries(entry.value, "daemon", kDaemonKeys);
    parse_daemon_overrides(keys, "daemon.", settings);
    DaemonMarks marks;
    auto read = [&](const char* key, std::chrono::milliseconds& out,
                    std::optional<YAML::Mark>& mark) {
      if (auto* e = find(keys, key)) {
        if (auto v = duration(*e, std::string("daemon.") + key)) {
          out = *v;
          mark = e->value_mark();
        }
      }
    };
    read("heartbeat_interval", settings.heartbeat_interval, marks.heartbeat_interval);
    read("heartbeat_timeout", settings.heartbeat_timeout, marks.heartbeat_timeout);
    read("reconnect_initial", settings.reconnect_initial, marks.reconnect_initial);
    read("reconnect_max", settings.reconnect_max, marks.reconnect_max);
    std::optional<YAML::Mark> handshake_mark;
    read("handshake_timeout", settings.handshake_timeout, handshake_mark);
    std::optional<YAML::Mark> total_mark, per_source_mark;
    const std::string range =
        "a number of connections 1.." + std::to_string(kMaxUnauthenticatedLimit);
    if (auto* e = find(keys, "max_unauthenticated")) {
      if (auto v = integer(*e, "daemon.max_unauthenticated", 1, kMaxUnauthenticatedLimit, range)) {
        settings.max_unauthenticated = static_cast<uint32_t>(*v);
        total_mark = e->value_mark();
      }
    }
    if (auto* e = find(keys, "max_unauthenticated_per_source")) {
      if (auto v = integer(*e, "daemon.max_unauthenticated_per_source", 1, kMaxUnauthenticatedLimit,
                           range)) {
        settings.max_unauthenticated_per_source = static_cast<uint32_t>(*v);
        per_source_mark = e->value_mark();
      }
    }
    if (!per_source_mark &&
        settings.max_unauthenticated_per_source > settings.max_unauthenticated) {
      // Only the total given, below the default per-source cap: that cap is the total.
      settings.max_unauthenticated_per_source = settings.max_unauthenticated;
    }
    if (settings.max_unauthenticated_per_source > settings.max_unauthenticated) {
      auto mark = per_source_mark ? *per_source_mark : total_mark.value_or(entry.key.Mark());
      error(mark, "daemon.max_unauthenticated_per_source",
            "max_unauthenticated_per_source (" +
                std::to_string(settings.max_unauthenticated_per_source) +
                ") must not exceed max_unauthenticated (" +
                std::to_string(settings.max_unauthenticated) + ")");
    }
    auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()) + "ms"; };
    if (settings.heartbeat_timeout <= settings.heartbeat_interval) {
      auto mark = marks.heartbeat_timeout ? *marks.heartbeat_timeout
                                          : marks.heartbeat_interval.value_or(entry.key.Mark());
      error(mark, "daemon.heartbeat_timeout",
            "the timeout (" + ms(settings.heartbeat_timeout) +
                ") must be longer than heartbeat_interval (" + ms(settings.heartbeat_interval) +
                "), or every peer is declared dead between two heartbeats; a few intervals "
                "is usual");
    }
    if (settings.reconnect_initial > settings.reconnect_max) {
      auto mark = marks.reconnect_max ? *marks.reconnect_max
                                      : marks.reconnect_initial.value_or(entry.key.Mark());
      error(mark, "daemon.reconnect_max",
            "reconnect_max (" + ms(settings.reconnect_max) +
                ") must not be shorter than reconnect_initial (" + ms(settings.reconnect_initial) +
                ")");
    }
  }

  // ------------------------------------------------------------- failover

  // One etcd endpoint: http:// or https://, a host and a port, no path
  // beyond "/". Returns the URL as written, or nothing (reported).
  std::optional<std::string> etcd_endpoint(const YAML::Node& item, const std::string& context) {
    if (!item.IsScalar()) {
      error(item.Mark(), context,
            "expected a URL such as https://10.0.0.1:2379, got " + type_name(item));
      return std::nullopt;
    }
    const std::string& url = item.Scalar();
    auto bad = [&](const std::string& why) {
      error(item.Mark(), context, "'" + url + "' is not an etcd endpoint: " + why);
      return std::nullopt;
    };
    std::string_view rest(url);
    if (rest.starts_with("http://")) {
      rest.remove_prefix(7);
    } else if (rest.starts_with("https://")) {
      rest.remove_prefix(8);
    } else {
      return bad("it must start with http:// or https:// (e.g. https://10.0.0.1:2379)");
    }
    size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    if (slash != std::string_view::npos && rest.substr(slash) != "/") {
      return bad("no path is allowed after the port (the gateway's /v3/... paths are added)");
    }
    if (authority.find_first_of("@?# \t") != std::string_view::npos) {
      return bad("write only http(s)://HOST:PORT, without user, query or spaces");
    }
    const size_t host_end = authority.starts_with('[') ? authority.find(']') : 0;
    if (host_end != std::string_view::npos &&
        authority.find(':', host_end) == std::string_view::npos) {
      return bad("the port is missing (e.g. https://10.0.0.1:2379)");
    }
    if (auto address = parse_host_port(authority); !address.ok()) {
      return bad(address.status().message() + " (etcd's client port is usually 2379)");
    }
    return url;
  }

  void parse_etcd(const Entry& entry, const std::string& context, EtcdSettings& etcd) {
    if (!entry.value.IsMap()) {
      error(entry.value_mark(), context,
            "expected a map (endpoints, prefix, ttl, ...), got " + type_name(entry.value));
      return;
    }
    auto keys = entries(entry.value, context, kEtcdKeys);
    bool any_https = false;
    if (auto* e = find(keys, "endpoints"); e == nullptr) {
      error(entry.key.Mark(), context,
            "missing required key 'endpoints' (e.g. endpoints: [https://10.0.0.1:2379])");
    } else if (!e->value.IsSequence()) {
      error(e->value_mark(), context + ".endpoints",
            "expected a list of URLs (e.g. [https://10.0.0.1:2379, https://10.0.0.2:2379]), got " +
                type_name(e->value));
    } else if (e->value.size() == 0) {
      error(e->value_mark(), context + ".endpoints",
            "the list is empty; name at least one etcd endpoint (better: every member)");
    } else {
      std::map<std::string, YAML::Mark> listed;
      for (size_t i = 0; i < e->value.size(); ++i) {
        const YAML::Node item = e->value[i];
        std::string item_context = context + ".endpoints[" + std::to_string(i) + "]";
        auto url = etcd_endpoint(item, item_context);
        if (!url) continue;
        if (auto [first, inserted] = listed.emplace(*url, item.Mark()); !inserted) {
          error(item.Mark(), item_context,
                "'" + *url + "' is listed twice (first at " + where(first->second) + ")");
          continue;
        }
        any_https = any_https || url->starts_with("https://");
        etcd.endpoints.push_back(*url);
      }
    }
    if (auto* e = find(keys, "prefix")) {
      std::string key_context = context + ".prefix";
      if (auto v = string(*e, key_context)) {
        if (v->front() != '/') {
          error(e->value_mark(), key_context, "'" + *v + "' must start with '/' (e.g. /pmirror)");
        } else if (v->back() == '/') {
          error(e->value_mark(), key_context,
                "'" + *v + "' must not end with '/' (keys are <prefix>/<cluster>/...)");
        } else if (v->find_first_of(" \t\r\n\f\v") != std::string::npos) {
          error(e->value_mark(), key_context, "'" + *v + "' must not contain whitespace");
        } else if (v->find("//") != std::string::npos) {
          error(e->value_mark(), key_context, "'" + *v + "' must not contain '//'");
        } else {
          etcd.prefix = *v;
        }
      }
    }
    // The timing: each at least its minimum, then the rule between them.
    bool timing_ok = true;
    std::optional<YAML::Mark> ttl_mark;
    auto read = [&](const char* key, std::chrono::milliseconds& out,
                    std::chrono::milliseconds minimum, const char* why,
                    std::optional<YAML::Mark>* mark = nullptr) {
      const Entry* e = find(keys, key);
      if (e == nullptr) return;
      const std::string key_context = context + "." + key;
      auto v = duration(*e, key_context, /*allow_zero=*/minimum.count() == 0);
      if (!v) {
        timing_ok = false;
      } else if (*v < minimum) {
        error(e->value_mark(), key_context,
              duration_text(*v) + " is too short; at least " + duration_text(minimum) + ": " + why);
        timing_ok = false;
      } else {
        out = *v;
        if (mark != nullptr) *mark = e->value_mark();
      }
    };
    read("ttl", etcd.ttl, kMinLeaseTtl,
         "a shorter lease expires on a busy network or after a scheduling delay", &ttl_mark);
    read("renew", etcd.renew, kMinLeaseRenew, "renewing more often only loads etcd");
    read("timeout", etcd.timeout, kMinEtcdTimeout,
         "etcd rarely answers that fast under load, and a timed-out renewal is a failed one");
    read("margin", etcd.margin, std::chrono::milliseconds(0), "");
    const auto needed = etcd.renew + 2 * etcd.timeout + etcd.margin;
    if (timing_ok && needed > etcd.ttl) {
      error(ttl_mark.value_or(entry.key.Mark()), context,
            "renew (" + duration_text(etcd.renew) + ") + 2 x timeout (" +
                duration_text(etcd.timeout) + ") + margin (" + duration_text(etcd.margin) + ") = " +
                duration_text(needed) + " must not exceed ttl (" + duration_text(etcd.ttl) +
                "): a primary that cannot renew would go on writing after its lease expired "
                "(pmirror-cluster.yaml(5), FAILOVER)");
    }
    if (auto* e = find(keys, "tls")) {
      const std::string tls_context = context + ".tls";
      if (!e->value.IsMap()) {
        error(e->value_mark(), tls_context,
              "expected a map of files (e.g. {ca: /etc/pmirror/etcd-ca.pem, cert: ..., key: "
              "...}), got " +
                  type_name(e->value));
      } else {
        auto tls = entries(e->value, tls_context, kTlsKeys);
        auto file = [&](const char* key, std::string& out, std::string& at) {
          if (auto* f = find(tls, key)) {
            if (auto v = absolute_path(*f, tls_context + "." + key)) {
              out = *v;
              at = where(f->value_mark());
            }
          }
        };
        file("ca", etcd.tls_ca, etcd.tls_ca_at);
        file("cert", etcd.tls_cert, etcd.tls_cert_at);
        file("key", etcd.tls_key, etcd.tls_key_at);
        const Entry* cert = find(tls, "cert");
        const Entry* key = find(tls, "key");
        if ((cert == nullptr) != (key == nullptr)) {
          const Entry* given = cert != nullptr ? cert : key;
          error(given->key.Mark(), tls_context,
                std::string("cert and key go together: the client certificate is given ") +
                    (cert != nullptr ? "without its key" : "key without its certificate") +
                    "; give both, or neither (server-verified TLS only)");
        }
        if (!etcd.endpoints.empty() && !any_https) {
          error(e->key.Mark(), tls_context,
                "every endpoint is http://, so TLS would never be used; write the endpoints as "
                "https://, or drop tls");
        }
      }
    }
  }

  // `failover` (docs/failover.md, section 2). `cluster_name_given`: the
  // file has a cluster.name key (valid or reported already).
  void parse_failover(const Entry& entry, ClusterConfig& config, bool cluster_name_given) {
    config.failover.origin = {where(entry.value_mark()), "failover"};
    if (entry.value.IsNull()) return;  // all defaults: no engine
    if (!entry.value.IsMap()) {
      error(entry.value_mark(), "failover",
            "expected a map (e.g. {engine: etcd, etcd: {...}}), got " + type_name(entry.value));
      engine_ok_ = false;
      return;
    }
    auto keys = entries(entry.value, "failover", kFailoverKeys);
    const Entry* engine = find(keys, "engine");
    if (engine != nullptr) {
      if (auto v = one_of(*engine, "failover.engine", kEngines)) {
        config.failover.engine = *v == "etcd"        ? FailoverEngine::kEtcd
                                 : *v == "pacemaker" ? FailoverEngine::kPacemaker
                                                     : FailoverEngine::kNone;
      } else {
        engine_ok_ = false;
      }
    }
    const Entry* etcd = find(keys, "etcd");
    if (!engine_ok_) {
      if (etcd != nullptr) parse_etcd(*etcd, "failover.etcd", config.failover.etcd);
      return;
    }
    if (config.failover.engine == FailoverEngine::kEtcd) {
      if (etcd == nullptr || etcd->value.IsNull()) {
        error(etcd != nullptr ? etcd->key.Mark() : engine->value_mark(), "failover.etcd",
              "engine: etcd needs the etcd section with its endpoints, e.g.\n"
              "  failover:\n"
              "    engine: etcd\n"
              "    etcd: {endpoints: [https://10.0.0.1:2379, https://10.0.0.2:2379]}");
      } else {
        parse_etcd(*etcd, "failover.etcd", config.failover.etcd);
      }
      if (config.name.empty() && !cluster_name_given) {
        error(engine->value_mark(), "failover.engine",
              "engine: etcd needs cluster.name (e.g. cluster: {name: prod}): the lease keys "
              "live under <prefix>/<cluster name>/, so that clusters sharing an etcd do not "
              "take each other's leases");
      }
    } else if (etcd != nullptr) {
      error(etcd->key.Mark(), "failover.etcd",
            "failover.etcd is only used with engine: etcd (engine is " +
                std::string(engine != nullptr ? engine->value.Scalar() : "none, the default") +
                "); set engine: etcd or remove the etcd section");
    }
  }

  // A volume's `failover:` entry.
  void parse_volume_failover(const Entry& entry, const std::string& context,
                             const ClusterConfig& config, VolumeFailover& out) {
    if (entry.value.IsNull()) return;
    if (!entry.value.IsMap()) {
      error(entry.value_mark(), context,
            "expected a map (e.g. {hook_unit: db1-app.service}), got " + type_name(entry.value));
      return;
    }
    if (engine_ok_ && config.failover.engine == FailoverEngine::kNone) {
      error(entry.key.Mark(), context,
            "has no effect without failover.engine (etcd or pacemaker): with none, an operator "
            "promotes by hand and starts the application; set failover.engine or remove this "
            "entry");
    }
    auto keys = entries(entry.value, context, kVolumeFailoverKeys);
    const Entry* unit = find(keys, "hook_unit");
    const Entry* start = find(keys, "start_command");
    const Entry* stop = find(keys, "stop_command");
    if (unit != nullptr && (start != nullptr || stop != nullptr)) {
      const Entry* other = start != nullptr ? start : stop;
      error(other->key.Mark(), context,
            "give either hook_unit or start_command (with stop_command), not both (hook_unit is "
            "at " +
                where(unit->key.Mark()) + ")");
      return;
    }
    if (stop != nullptr && start == nullptr) {
      error(stop->key.Mark(), context,
            "stop_command is only used with start_command; give start_command too, or use "
            "hook_unit");
      return;
    }
    if (unit != nullptr) {
      if (auto v = string(*unit, context + ".hook_unit")) {
        if (auto problem = check_unit_name(*v); !problem.empty()) {
          error(unit->value_mark(), context + ".hook_unit", problem);
        } else {
          out.hook_unit = *v;
        }
      }
    }
    if (start != nullptr) {
      if (auto v = string(*start, context + ".start_command")) out.start_command = *v;
    }
    if (stop != nullptr) {
      if (auto v = string(*stop, context + ".stop_command")) out.stop_command = *v;
    }
  }

  // Where each node name and address:port was first seen.
  struct NodeSeen {
    std::map<std::string, YAML::Mark> names;
    std::map<std::string, std::pair<std::string, YAML::Mark>> endpoints;  // -> (node, mark)
  };

  void parse_node(const YAML::Node& item, const std::string& context, ClusterConfig& config,
                  NodeSeen& seen) {
    if (!item.IsMap()) {
      error(item.Mark(), context,
            std::string("expected a map describing a node (name, address, ...), got ") +
                type_name(item));
      return;
    }
    auto keys = entries(item, context, kNodeKeys);
    NodeConfig node;
    node.daemon = config.daemon;
    node.origin = {where(item.Mark()), context};
    bool named = false;
    if (auto* e = find(keys, "name"); e == nullptr) {
      error(item.Mark(), context, "missing required key 'name'");
    } else if (auto v = name(*e, context + ".name", "node name")) {
      if (auto [first, inserted] = seen.names.emplace(*v, e->value_mark()); !inserted) {
        error(e->value_mark(), context + ".name",
              "duplicate node name '" + *v + "' (first defined at " + where(first->second) + ")");
      } else {
        node.name = *v;
        named = true;
      }
    }
    const Entry* address_entry = find(keys, "address");
    if (address_entry == nullptr) {
      error(item.Mark(), context,
            "missing required key 'address' (the IP or host name peers reach this node at)");
    } else if (auto v = string(*address_entry, context + ".address")) {
      in6_addr ignored{};
      if (v->find(':') != std::string::npos && v->find_first_of(" \t/") == std::string::npos &&
          ::inet_pton(AF_INET6, v->c_str(), &ignored) != 1) {
        error(address_entry->value_mark(), context + ".address",
              "'" + *v + "' is not an address; write the port under 'port', not after a ':'");
      } else if (std::string problem = check_host(*v); !problem.empty()) {
        error(address_entry->value_mark(), context + ".address", problem);
      } else {
        node.address = *v;
      }
    }
    if (auto* e = find(keys, "port")) {
      if (auto v = port(*e, context + ".port")) node.port = *v;
    }
    if (auto* e = find(keys, "transport")) {
      const std::string expected = "one of " + transport::configurable_kind_names();
      if (auto v = scalar(*e, context + ".transport", expected.c_str())) {
        // transport/kind.h: also refuses a kind this build left out.
        auto kind = transport::parse_kind(*v);
        if (kind.ok()) {
          node.transport = *kind;
        } else {
          error(e->value_mark(), context + ".transport", kind.status().message());
        }
      }
    }
    if (auto* e = find(keys, "listen")) {
      if (auto v = string(*e, context + ".listen")) {
        if (std::string problem = check_host(*v); !problem.empty()) {
          error(e->value_mark(), context + ".listen", problem);
        } else {
          node.listen = *v;
        }
      }
    }
    parse_daemon_overrides(keys, context + ".", node.daemon);
    if (node.listen.empty()) node.listen = node.address;

    if (!node.address.empty()) {
      std::string endpoint = node.address + ":" + std::to_string(node.port);
      auto [first, inserted] =
          seen.endpoints.emplace(endpoint, std::make_pair(node.name, address_entry->value_mark()));
      if (!inserted) {
        shares_endpoint_.insert(node.name);
        error(address_entry->value_mark(), context,
              "node '" + node.name + "' uses " + endpoint + ", as node '" + first->second.first +
                  "' does (at " + where(first->second.second) +
                  "); two daemons cannot listen on the same address and port");
      }
    }
    if (named) config.nodes.push_back(std::move(node));
  }

  void parse_nodes(const Entry* entry, const YAML::Node& root, ClusterConfig& config) {
    const char* hint =
        "; list every machine of the cluster, e.g.\n"
        "  nodes:\n"
        "    - {name: node1, address: 10.0.0.1}\n"
        "    - {name: node2, address: 10.0.0.2}";
    if (entry == nullptr) {
      error(root.Mark(), "", std::string("no 'nodes' section") + hint);
      return;
    }
    if (entry->value.IsNull() || (entry->value.IsSequence() && entry->value.size() == 0)) {
      error(entry->value_mark(), "nodes", std::string("no nodes are listed") + hint);
      return;
    }
    if (!entry->value.IsSequence()) {
      error(entry->value_mark(), "nodes",
            std::string("expected a list of nodes (each item starting with '- name:'), got ") +
                type_name(entry->value));
      return;
    }
    NodeSeen seen;
    for (size_t i = 0; i < entry->value.size(); ++i) {
      parse_node(entry->value[i], "nodes[" + std::to_string(i) + "]", config, seen);
    }
    // Two daemons on one machine (same address) must not share their files.
    std::map<std::string, const NodeConfig*> pools, sockets;
    for (size_t i = 0; i < config.nodes.size(); ++i) {
      const NodeConfig& node = config.nodes[i];
      if (shares_endpoint_.count(node.name) != 0) continue;  // reported already
      for (auto& [files, value, key] :
           {std::tuple{&pools, node.daemon.state_pool, "state_pool"},
            std::tuple{&sockets, node.daemon.control_socket, "control_socket"}}) {
        auto [first, inserted] = files->emplace(node.address + " " + value, &node);
        if (!inserted) {
          error(node_marks_[node.name], "nodes",
                "nodes '" + first->second->name + "' and '" + node.name + "' share the address " +
                    node.address + " and the " + key + " " + value +
                    "; give one of them its own `" + key + ":`");
        }
      }
    }
  }

  // The node names for messages, joined once (volumes come after nodes):
  // thousands of mistakes must not each copy them.
  const std::string& known_nodes(const ClusterConfig& config) {
    if (known_nodes_.empty()) known_nodes_ = join(node_names(config));
    return known_nodes_;
  }

  // Where each (node, path) was first used, across volumes.
  using PathSeen = std::map<std::pair<std::string, std::string>, std::string>;

  void parse_volume(const YAML::Node& item, const std::string& context, ClusterConfig& config,
                    std::map<std::string, YAML::Mark>& names, PathSeen& paths_seen) {
    if (!item.IsMap()) {
      error(item.Mark(), context,
            std::string("expected a map describing a volume (name, size, primary, ...), got ") +
                type_name(item));
      return;
    }
    auto keys = entries(item, context, kVolumeKeys);
    auto missing = [&](const char* key, const std::string& hint) {
      error(item.Mark(), context, std::string("missing required key '") + key + "'" + hint);
    };
    auto is_node = [&](const std::string& name) { return config.find_node(name) != nullptr; };
    auto not_a_node = [&](const std::string& name) {
      return "'" + name + "' is not a node; nodes: " + known_nodes(config);
    };
    ClusterVolume volume;
    YAML::Mark size_mark;

    if (auto* e = find(keys, "name"); e == nullptr) {
      missing("name", "");
    } else if (auto v = name(*e, context + ".name", "volume name")) {
      if (auto [first, inserted] = names.emplace(*v, e->value_mark()); !inserted) {
        error(e->value_mark(), context + ".name",
              "duplicate volume name '" + *v + "' (first defined at " + where(first->second) + ")");
      } else {
        volume.name = *v;
      }
    }

    if (auto* e = find(keys, "size"); e == nullptr) {
      missing("size", " (e.g. size: 1GiB; the same on every node)");
    } else if (auto text = scalar(*e, context + ".size", "a size such as 1GiB")) {
      if (auto size = parse_size(*text); !size.ok()) {
        error(e->value_mark(), context + ".size", size.status().message());
      } else if (*size % kPageSize != 0) {
        error(e->value_mark(), context + ".size",
              "'" + *text + "' is " + std::to_string(*size) + " bytes, not a multiple of " +
                  std::to_string(kPageSize) + " (the page size)");
      } else if (*size > kMaxVolumeSize) {
        error(e->value_mark(), context + ".size",
              "'" + *text + "' is " + std::to_string(*size) + " bytes; a volume holds at most " +
                  std::to_string(kMaxVolumeSize) +
                  " (64TiB), so that pmirrord can map it: x86-64 gives a process 128TiB of "
                  "address space");
      } else {
        volume.size = *size;
        size_mark = e->value_mark();
      }
    }

    // Participants, as far as they are valid nodes.
    bool primary_ok = false;
    if (auto* e = find(keys, "primary"); e == nullptr) {
      missing("primary", " (the node where the application runs)");
    } else if (auto v = name(*e, context + ".primary", "node name")) {
      if (!is_node(*v)) {
        error(e->value_mark(), context + ".primary", not_a_node(*v));
      } else {
        volume.primary = *v;
        primary_ok = true;
      }
    }
    bool replicas_ok = false;
    if (auto* e = find(keys, "replicas"); e == nullptr) {
      missing("replicas", " (the nodes that hold copies, e.g. [node2, node3])");
    } else if (auto list = name_list(*e, context + ".replicas", "node", "[node2, node3]",
                                     "the list is empty; a volume needs at least one replica")) {
      replicas_ok = true;
      for (size_t i = 0; i < list->size(); ++i) {
        const auto& [replica, mark] = (*list)[i];
        std::string item_context = context + ".replicas[" + std::to_string(i) + "]";
        if (!is_node(replica)) {
          error(mark, item_context, not_a_node(replica));
          replicas_ok = false;
        } else if (primary_ok && replica == volume.primary) {
          error(mark, item_context,
                "'" + replica +
                    "' is the primary; the primary holds the local copy and cannot also be a "
                    "replica");
          replicas_ok = false;
        } else {
          volume.replicas.push_back(replica);
        }
      }
    }

    if (auto* e = find(keys, "ack")) {
      if (replicas_ok) {
        uint64_t count = volume.replicas.size();
        if (auto v =
                integer(*e, context + ".ack", 1, count,
                        "a number of replicas 1.." + std::to_string(count) + " (this volume has " +
                            std::to_string(count) + " replica" + (count == 1 ? "" : "s") + ")")) {
          volume.ack = static_cast<uint32_t>(*v);
        }
      }
    } else {
      volume.ack = static_cast<uint32_t>(volume.replicas.size());
    }
    if (auto* e = find(keys, "on_insufficient")) {
      constexpr std::string_view kPolicies[] = {"fail", "block"};
      if (auto v = one_of(*e, context + ".on_insufficient", kPolicies)) {
        volume.on_insufficient =
            *v == "block" ? InsufficientPolicy::kBlock : InsufficientPolicy::kFail;
      }
    }

    // path (every node) and paths (per node).
    std::optional<std::pair<std::string, YAML::Mark>> common_path;
    if (auto* e = find(keys, "path")) {
      if (auto v = absolute_path(*e, context + ".path")) common_path.emplace(*v, e->value_mark());
    }
    std::map<std::string, std::pair<std::string, YAML::Mark>> node_paths;
    const Entry* paths_entry = find(keys, "paths");
    bool paths_ok = true;
    if (paths_entry != nullptr) {
      if (!paths_entry->value.IsMap()) {
        error(paths_entry->value_mark(), context + ".paths",
              "expected a map of node: path (e.g. {node1: /dev/dax0.0, node2: /mnt/pmem/db0}), "
              "got " +
                  type_name(paths_entry->value));
        paths_ok = false;
      } else {
        for (auto it = paths_entry->value.begin(); it != paths_entry->value.end(); ++it) {
          const YAML::Node key = it->first;
          const YAML::Node value = it->second;
          if (!key.IsScalar()) {
            error(key.Mark(), context + ".paths", "expected a node name, got " + type_name(key));
            paths_ok = false;
            continue;
          }
          const std::string node = key.Scalar();
          std::string node_context = context + ".paths." + node;
          Entry path_entry{key, value};
          if (node_paths.count(node) != 0) {
            error(key.Mark(), context + ".paths",
                  "duplicate key '" + node + "' (first at " + where(node_paths[node].second) + ")");
            paths_ok = false;
            continue;
          }
          if (!is_node(node)) {
            error(key.Mark(), context + ".paths", not_a_node(node));
            paths_ok = false;
            continue;
          }
          bool participant = (primary_ok && node == volume.primary) ||
                             std::find(volume.replicas.begin(), volume.replicas.end(), node) !=
                                 volume.replicas.end();
          if (!participant && primary_ok && replicas_ok) {
            error(key.Mark(), context + ".paths",
                  "node '" + node + "' is neither the primary (" + volume.primary +
                      ") nor a replica (" + join(volume.replicas) +
                      "); remove its path or add it to replicas");
            paths_ok = false;
            continue;
          }
          if (auto v = absolute_path(path_entry, node_context)) {
            node_paths.emplace(node, std::make_pair(*v, path_entry.value_mark()));
          } else {
            paths_ok = false;
          }
        }
      }
    }
    std::vector<std::string> participants;
    std::map<std::string, YAML::Mark> data_marks;  // node -> where its path was given
    if (primary_ok) participants.push_back(volume.primary);
    participants.insert(participants.end(), volume.replicas.begin(), volume.replicas.end());
    for (const auto& node : participants) {
      std::pair<std::string, YAML::Mark> chosen;
      if (auto it = node_paths.find(node); it != node_paths.end()) {
        chosen = it->second;
      } else if (common_path) {
        chosen = *common_path;
      } else {
        if (paths_ok && find(keys, "path") == nullptr) {
          const bool is_primary = primary_ok && node == volume.primary;
          error(paths_entry ? paths_entry->key.Mark() : item.Mark(), context,
                "no path for node '" + node + "' (" + (is_primary ? "the primary" : "a replica") +
                    "); add `" + node +
                    ": /dev/dax0.0` (its device or file) under paths, or a "
                    "`path:` for every node");
        }
        continue;
      }
      std::string normal = std::filesystem::path(chosen.first).lexically_normal().string();
      std::string at = where(chosen.second);
      if (auto [first, inserted] = paths_seen.emplace(std::make_pair(node, normal),
                                                      at + " (volume " + volume.name + ")");
          !inserted) {
        error(chosen.second, context + ".paths." + node,
              "node '" + node + "' already uses '" + chosen.first + "' for another volume (at " +
                  first->second + "); two volumes cannot share storage");
        continue;
      }
      volume.paths[node] = chosen.first;
      volume.path_at[node] = at;
      data_marks[node] = chosen.second;
      files_.push_back({node, normal, chosen.first, chosen.second, context + ".paths." + node,
                        "volume " + volume.name});
    }

    parse_metadata(find(keys, "metadata"), context, config, volume, participants, data_marks,
                   primary_ok && replicas_ok, paths_seen);

    if (auto* e = find(keys, "create")) {
      if (auto v = boolean(*e, context + ".create")) volume.create = *v;
    }

    if (auto* e = find(keys, "allowed_peers"); e == nullptr) {
      missing("allowed_peers", " (the identities allowed to open the volume, e.g. [app1])");
    } else if (auto list = name_list(
                   *e, context + ".allowed_peers", "identity", "[app1, app2]",
                   "the list is empty, so nobody could open the volume; name at least one "
                   "identity")) {
      for (auto& [peer, mark] : *list) volume.allowed_peers.push_back(peer);
    }

    const Entry* secret = find(keys, "secret");
    const Entry* secret_file = find(keys, "secret_file");
    if (secret != nullptr && secret_file != nullptr) {
      error(secret_file->key.Mark(), context,
            "give either 'secret' or 'secret_file', not both (secret is at " +
                where(secret->key.Mark()) + ")");
    } else if (secret != nullptr) {
      if (auto text = scalar(*secret, context + ".secret", "a string")) {
        if (text->size() < kMinSecretLength) {
          error(secret->value_mark(), context + ".secret",
                "too short (" + std::to_string(text->size()) + " characters); use at least " +
                    std::to_string(kMinSecretLength) +
                    " random characters, e.g. from `openssl rand -base64 32`");
        } else {
          volume.secret = *text;
        }
      }
    } else if (secret_file != nullptr) {
      if (auto path = absolute_path(*secret_file, context + ".secret_file")) {
        volume.secret_file = *path;
        volume.secret_file_at = where(secret_file->value_mark());
      }
    } else {
      missing("secret_file", " (or 'secret'): the shared secret that initiators authenticate with");
    }

    if (auto* e = find(keys, "apm")) {
      constexpr std::string_view kPolicies[] = {"auto", "on", "off"};
      if (auto v = one_of(*e, context + ".apm", kPolicies)) {
        volume.apm = *v == "on" ? ApmPolicy::kOn : *v == "off" ? ApmPolicy::kOff : ApmPolicy::kAuto;
      }
    }

    if (auto* e = find(keys, "native_persistence")) {
      constexpr std::string_view kChoices[] = {"auto", "flush", "off"};
      if (auto v = one_of(*e, context + ".native_persistence", kChoices)) {
        volume.native_persistence = *v == "flush" ? NativePersistence::kFlush
                                    : *v == "off" ? NativePersistence::kOff
                                                  : NativePersistence::kAuto;
      }
    }

    if (auto* e = find(keys, "poll")) {
      constexpr std::string_view kModes[] = {"busy", "adaptive", "event"};
      if (auto v = one_of(*e, context + ".poll", kModes)) {
        volume.poll = *transport::parse_poll_mode(*v);
      }
    }

    if (auto* e = find(keys, "chunk")) {
      std::string key_context = context + ".chunk";
      if (auto text = scalar(*e, key_context, "a size such as 64KiB")) {
        if (auto size = parse_size(*text); !size.ok()) {
          error(e->value_mark(), key_context, size.status().message());
        } else if (*size < kMinChunk || *size > kMaxChunk) {
          error(e->value_mark(), key_context,
                "'" + *text +
                    "' is outside 4KiB..1MiB; one dirty bit stands for one chunk: smaller "
                    "chunks copy less after an outage, larger ones keep the bitmap small");
        } else if ((*size & (*size - 1)) != 0) {
          error(e->value_mark(), key_context,
                "'" + *text + "' is " + std::to_string(*size) +
                    " bytes, not a power of two (e.g. 16KiB, 64KiB, 256KiB)");
        } else {
          volume.chunk = *size;
        }
      }
    }
    if (auto* e = find(keys, "resync_rate")) {
      std::string key_context = context + ".resync_rate";
      if (auto text = scalar(*e, key_context, "a rate such as 100MiB/s, or unlimited")) {
        if (auto rate = parse_rate(*text); !rate.ok()) {
          error(e->value_mark(), key_context, rate.status().message());
        } else if (*rate != 0 && *rate < kMinResyncRate) {
          error(e->value_mark(), key_context,
                "'" + *text + "' is " + std::to_string(*rate) +
                    " bytes per second; the least is 1MiB/s (did you mean MiB/s?), or "
                    "'unlimited'");
        } else {
          volume.resync_rate = *rate;
        }
      }
    }
    if (auto* e = find(keys, "after_split_brain")) {
      constexpr std::string_view kPolicies[] = {"refuse", "overwrite_replica"};
      if (auto v = one_of(*e, context + ".after_split_brain", kPolicies)) {
        volume.after_split_brain = *v == "overwrite_replica" ? SplitBrainPolicy::kOverwriteReplica
                                                             : SplitBrainPolicy::kRefuse;
      }
    }
    if (auto* e = find(keys, "failover")) {
      parse_volume_failover(*e, context + ".failover", config, volume.failover);
    }
    count_mapped_bytes(volume, size_mark, context + ".size");
    config.volumes.push_back(std::move(volume));
  }

  // pmirrord maps every copy its node holds at once: their sizes together
  // must fit as one volume must.
  void count_mapped_bytes(const ClusterVolume& volume, const YAML::Mark& size_mark,
                          const std::string& context) {
    if (volume.size == 0) return;
    for (const auto& [node, path] : volume.paths) {
      auto& [bytes, names] = mapped_[node];
      if (bytes > kMaxVolumeSize) continue;  // reported already
      bytes += volume.size;                  // both at most kMaxVolumeSize: no wrap
      names += (names.empty() ? "" : ", ") + volume.name;
      if (bytes > kMaxVolumeSize) {
        error(size_mark, context,
              "node '" + node + "' would hold " + std::to_string(bytes) + " bytes of volumes (" +
                  names + "); pmirrord maps them all at once, at most " +
                  std::to_string(kMaxVolumeSize) + " (64TiB) in all");
      }
    }
  }

  // `metadata: {node: path}` (optional per node) and the default of every
  // other node holding a copy; fills volume.metadata_paths. A metadata pool
  // may share its file with nothing else on its node (`paths_seen`).
  void parse_metadata(const Entry* entry, const std::string& context, const ClusterConfig& config,
                      ClusterVolume& volume, const std::vector<std::string>& participants,
                      const std::map<std::string, YAML::Mark>& data_marks, bool participants_ok,
                      PathSeen& paths_seen) {
    std::map<std::string, std::pair<std::string, YAML::Mark>> given;
    std::map<std::string, YAML::Mark> keys_seen;
    if (entry != nullptr && !entry->value.IsNull()) {
      if (!entry->value.IsMap()) {
        error(entry->value_mark(), context + ".metadata",
              "expected a map of node: path (e.g. {node1: /mnt/pmem/db0.pmirror}), got " +
                  type_name(entry->value));
      } else {
        for (auto it = entry->value.begin(); it != entry->value.end(); ++it) {
          const YAML::Node key = it->first;
          const YAML::Node value = it->second;
          if (!key.IsScalar()) {
            error(key.Mark(), context + ".metadata", "expected a node name, got " + type_name(key));
            continue;
          }
          const std::string node = key.Scalar();
          if (auto [previous, inserted] = keys_seen.emplace(node, key.Mark()); !inserted) {
            error(key.Mark(), context + ".metadata",
                  "duplicate key '" + node + "' (first at " + where(previous->second) + ")");
            continue;
          }
          if (config.find_node(node) == nullptr) {
            error(key.Mark(), context + ".metadata",
                  "'" + node + "' is not a node; nodes: " + known_nodes(config));
            continue;
          }
          if (participants_ok &&
              std::find(participants.begin(), participants.end(), node) == participants.end()) {
            error(key.Mark(), context + ".metadata",
                  "node '" + node + "' holds no copy of volume '" + volume.name + "' (primary " +
                      volume.primary + ", replicas " + join(volume.replicas) +
                      "); remove its metadata path");
            continue;
          }
          Entry path_entry{key, value};
          if (auto path = absolute_path(path_entry, context + ".metadata." + node)) {
            given.emplace(node, std::make_pair(*path, path_entry.value_mark()));
          }
        }
      }
    }
    for (const auto& node : participants) {
      auto data = volume.paths.find(node);
      if (data == volume.paths.end()) continue;  // no usable data path: reported already
      auto explicit_path = given.find(node);
      const bool is_default = explicit_path == given.end();
      const std::string path = is_default ? default_metadata_path(data->second, volume.name)
                                          : explicit_path->second.first;
      const YAML::Mark mark = is_default ? data_marks.at(node) : explicit_path->second.second;
      const std::string key_context = context + ".metadata." + node;
      std::string normal = std::filesystem::path(path).lexically_normal().string();
      auto [first, inserted] = paths_seen.emplace(
          std::make_pair(node, normal), where(mark) + " (metadata of volume " + volume.name + ")");
      if (!inserted) {
        if (is_default) {
          error(mark, key_context,
                "the default metadata path '" + path + "' is already used on node '" + node +
                    "' (at " + first->second + "); give volume " + volume.name +
                    " its own under `metadata:`");
        } else {
          error(mark, key_context,
                "node '" + node + "' already uses '" + path + "' (at " + first->second +
                    "); a metadata pool needs a file of its own");
        }
        continue;
      }
      volume.metadata_paths[node] = path;
      volume.metadata_at[node] = where(mark);
      files_.push_back({node, normal, path, mark,
                        is_default ? context + ".paths." + node : key_context,
                        "metadata of volume " + volume.name});
    }
  }

  // Nodes on one address are daemons on one machine: they must not use the
  // same file (data or metadata) either.
  void check_shared_machines(const ClusterConfig& config) {
    std::map<std::pair<std::string, std::string>, const CopyFile*> seen;  // (address, path)
    for (const CopyFile& file : files_) {
      const NodeConfig* node = config.find_node(file.node);
      if (node == nullptr || node->address.empty()) continue;
      auto [first, inserted] = seen.emplace(std::make_pair(node->address, file.normal), &file);
      if (inserted || first->second->node == file.node) continue;
      const CopyFile& other = *first->second;
      error(file.mark, file.context,
            "nodes '" + other.node + "' and '" + file.node + "' share the address " +
                node->address + " and would both use '" + file.path + "' (" + other.node + ": " +
                other.label + ", at " + where(other.mark) + "; " + file.node + ": " + file.label +
                "); give one of them its own " +
                (file.label.rfind("metadata", 0) == 0 ? "under `metadata:`" : "path"));
    }
  }

  void parse_volumes(const Entry* entry, const YAML::Node& root, ClusterConfig& config) {
    const char* hint =
        "; describe at least one volume, e.g.\n"
        "  volumes:\n"
        "    - name: db0\n"
        "      size: 1GiB\n"
        "      primary: node1\n"
        "      replicas: [node2]\n"
        "      path: /dev/dax0.0\n"
        "      allowed_peers: [app1]\n"
        "      secret_file: /etc/pmirror/db0.secret";
    if (entry == nullptr) {
      error(root.Mark(), "", std::string("no 'volumes' section") + hint);
      return;
    }
    if (entry->value.IsNull() || (entry->value.IsSequence() && entry->value.size() == 0)) {
      error(entry->value_mark(), "volumes", std::string("no volumes are listed") + hint);
      return;
    }
    if (!entry->value.IsSequence()) {
      error(entry->value_mark(), "volumes",
            std::string("expected a list of volumes (each item starting with '- name:'), got ") +
                type_name(entry->value));
      return;
    }
    std::map<std::string, YAML::Mark> names;
    PathSeen paths;
    for (size_t i = 0; i < entry->value.size(); ++i) {
      parse_volume(entry->value[i], "volumes[" + std::to_string(i) + "]", config, names, paths);
    }
    check_shared_machines(config);
  }

  // Fills `config` as far as it can; problems() says what is wrong.
  void parse(const std::string& text, ClusterConfig& config) {
    config.source = source_;
    text_ = &text;
    YamlDocuments documents;
    try {
      documents = load_yaml_documents(text);
    } catch (const YAML::ParserException& e) {
      error(e.mark, "", "YAML syntax error: " + e.msg);
      return;
    } catch (const YAML::Exception& e) {
      error(e.mark, "", std::string("cannot parse YAML: ") + e.what());
      return;
    }
    if (documents.count == 0 || documents.first.IsNull()) {
      error(YAML::Mark::null_mark(), "",
            "the configuration is empty; see pmirror-cluster.yaml(5) and "
            "/usr/share/doc/pmirrord/examples/cluster.example.yaml for a starting point");
      return;
    }
    if (documents.count > 1) {
      error(documents.second, "",
            "found " + std::to_string(documents.count) +
                " YAML documents ('---'); the configuration must be a single document");
      return;
    }
    // Before anything walks the document: an alias bomb is refused here, and
    // the marks yaml-cpp gets wrong are found.
    DocumentScan scan = scan_document(text);
    if (scan.refused_at) {
      error(*scan.refused_at, "", scan.refused);
      return;
    }
    fixes_ = std::move(scan.fixes);
    const YAML::Node& root = documents.first;
    if (!root.IsMap()) {
      error(root.Mark(), "",
            std::string("the top level must be a map with 'nodes' and 'volumes' (and optionally "
                        "'cluster' and 'daemon') keys, got ") +
                type_name(root));
      return;
    }
    auto keys = entries(root, "", kTopKeys);
    bool cluster_name_given = false;
    if (auto* e = find(keys, "cluster"); e != nullptr && !e->value.IsNull()) {
      if (!e->value.IsMap()) {
        error(e->value_mark(), "cluster",
              "expected a map (e.g. {name: prod}), got " + type_name(e->value));
      } else {
        auto cluster_keys = entries(e->value, "cluster", kClusterKeys);
        if (auto* n = find(cluster_keys, "name")) {
          cluster_name_given = true;
          if (auto v = name(*n, "cluster.name", "cluster name")) config.name = *v;
        }
      }
    }
    if (auto* e = find(keys, "daemon")) parse_daemon(*e, config.daemon);
    if (auto* e = find(keys, "failover")) parse_failover(*e, config, cluster_name_given);
    // Node marks, for problems found once all nodes are known.
    if (auto* e = find(keys, "nodes"); e != nullptr && e->value.IsSequence()) {
      for (size_t i = 0; i < e->value.size(); ++i) {
        const YAML::Node item = e->value[i];
        if (item.IsMap() && item["name"] && item["name"].IsScalar()) {
          node_marks_.emplace(item["name"].Scalar(), item.Mark());
        }
      }
    }
    parse_nodes(find(keys, "nodes"), root, config);
    parse_volumes(find(keys, "volumes"), root, config);
  }

 private:
  std::string source_;
  const std::string* text_ = nullptr;  // the document, while parse() runs
  std::unordered_map<std::string, MarkFix> fixes_;
  std::vector<Problem> problems_;
  // node -> bytes of its volumes and their names, for count_mapped_bytes.
  std::map<std::string, std::pair<uint64_t, std::string>> mapped_;
  std::map<std::string, YAML::Mark> node_marks_;
  // False when `failover` or its engine was wrong: volumes then do not
  // report their failover entries as having no effect.
  bool engine_ok_ = true;
  std::string known_nodes_;                // see known_nodes()
  std::set<std::string> shares_endpoint_;  // nodes with another node's address:port
  // Every file a node keeps a copy in (data and metadata), for
  // check_shared_machines.
  struct CopyFile {
    std::string node;
    std::string normal;  // lexically normal path
    std::string path;    // as written (or the default)
    YAML::Mark mark;
    std::string context;
    std::string label;  // "volume v", "metadata of volume v"
  };
  std::vector<CopyFile> files_;
};

}  // namespace

std::string join(std::span<const std::string_view> words) {
  std::string out;
  for (auto word : words) {
    if (!out.empty()) out += ", ";
    out += word;
  }
  return out;
}

// For messages: the first 20 names, then how many more. Every problem of a
// file may name the nodes, so 10000 nodes must not make each message huge.
std::string join(const std::vector<std::string>& words) {
  constexpr size_t kShown = 20;
  std::vector<std::string_view> views(words.begin(),
                                      words.begin() + std::min(words.size(), kShown));
  std::string out = join(std::span<const std::string_view>(views));
  if (words.size() > kShown) out += ", ... (" + std::to_string(words.size()) + " in all)";
  return out;
}

std::vector<std::string> node_names(const ClusterConfig& cluster) {
  std::vector<std::string> names;
  for (const auto& node : cluster.nodes) names.push_back(node.name);
  return names;
}

// "SOURCE:LINE:COL: ..." -> (LINE, COL); (0, 0) when there is none.
Problem problem_from_text(const std::string& source, std::string text) {
  Problem problem;
  if (text.rfind(source + ":", 0) == 0) {
    const char* p = text.c_str() + source.size() + 1;
    char* end = nullptr;
    long line = std::strtol(p, &end, 10);
    if (end != p && *end == ':') {
      long column = std::strtol(end + 1, &end, 10);
      problem.line = static_cast<int>(line);
      problem.column = static_cast<int>(column);
    }
  }
  problem.text = std::move(text);
  return problem;
}

void sort_problems(std::vector<Problem>& problems) {
  std::stable_sort(problems.begin(), problems.end(), [](const Problem& a, const Problem& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
}

// The first kMaxReportedProblems of `problems` (sorted), then one line
// counting the rest: a file with thousands of mistakes (an alias used
// 100000 times) must not bury the first ones.
void cap_problems(std::vector<Problem>& problems) {
  if (problems.size() <= kMaxReportedProblems) return;
  size_t more = problems.size() - kMaxReportedProblems;
  problems.resize(kMaxReportedProblems);
  problems.push_back({INT_MAX, 0,
                      "... and " + std::to_string(more) + " more problem" + (more == 1 ? "" : "s") +
                          " (" + std::to_string(kMaxReportedProblems + more) +
                          " in all); fix these and check again"});
}

Status problems_status(std::vector<Problem> problems) {
  cap_problems(problems);
  std::string message;
  for (const auto& p : problems) {
    if (!message.empty()) message += '\n';
    message += p.text;
  }
  return Status(Errc::kConfigError, std::move(message));
}

// Parses without failing: the config as far as it could be read, and every
// problem (sorted by position).
ClusterConfig parse_collecting(const std::string& text, const std::string& source,
                               std::vector<Problem>& problems) {
  Parser parser(source);
  ClusterConfig config;
  parser.parse(text, config);
  problems = std::move(parser.problems());
  sort_problems(problems);
  return config;
}

const NodeConfig* ClusterConfig::find_node(std::string_view name) const {
  for (const auto& node : nodes) {
    if (node.name == name) return &node;
  }
  return nullptr;
}

const ClusterVolume* ClusterConfig::find_volume(std::string_view name) const {
  for (const auto& volume : volumes) {
    if (volume.name == name) return &volume;
  }
  return nullptr;
}

Result<ClusterConfig> parse_cluster_config(const std::string& yaml_text,
                                           const std::string& source_name) {
  std::vector<Problem> problems;
  ClusterConfig config = parse_collecting(yaml_text, source_name, problems);
  if (!problems.empty()) return problems_status(problems);
  return config;
}

Result<ClusterConfig> load_cluster_config(const std::string& path) {
  auto text = read_config_file(path);
  if (!text.ok()) return text.status();
  return parse_cluster_config(*text, path);
}

}  // namespace pmirror::config
