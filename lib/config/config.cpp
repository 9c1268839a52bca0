#include "config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace pmirror::config {
namespace {

constexpr size_t kMaxNameLength = 64;
constexpr size_t kMinSecretLength = 16;
constexpr size_t kMaxSecretFileSize = 4096;
// Largest configuration file we read; far beyond any sane config, it only
// stops us from slurping a device or a mistaken multi-gigabyte path.
constexpr off_t kMaxConfigFileSize = 16 << 20;

constexpr std::string_view kTopKeys[] = {"daemon", "volumes"};
constexpr std::string_view kDaemonKeys[] = {"listen", "port", "transport", "state_pool",
                                            "log_level"};
constexpr std::string_view kVolumeKeys[] = {"name",          "path",   "size",        "create",
                                            "allowed_peers", "secret", "secret_file", "apm"};
constexpr std::string_view kLogLevels[] = {"trace", "debug",    "info", "warn",
                                           "error", "critical", "off"};

std::string join(std::span<const std::string_view> words) {
  std::string out;
  for (auto word : words) {
    if (!out.empty()) out += ", ";
    out += word;
  }
  return out;
}

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

// Volume and identity names travel in the protocol and appear in logs and
// file names, so keep them to a conservative charset.
std::string check_name(std::string_view name) {
  if (name.empty()) return "must not be empty";
  if (name.size() > kMaxNameLength) {
    return "'" + std::string(name) + "' is " + std::to_string(name.size()) +
           " characters; at most " + std::to_string(kMaxNameLength) + " are allowed";
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

// Same rules as auth::read_secret_file (kept local so the config library
// does not link OpenSSL and the protocol code): a regular file, no
// group/other permission bits, non-empty, at most 4 KiB, one trailing
// newline stripped.
Result<std::string> read_secret_file(const std::string& path) {
  // O_NONBLOCK: a FIFO named by mistake must not hang the daemon in open().
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    Status status = errno_status(err == EACCES ? Errc::kPermissionDenied : Errc::kNotFound,
                                 "cannot open secret file " + path, err);
    if (err != ENOENT) return status;
    return Status(status.code(), status.message() + "; create it with `umask 077; openssl rand " +
                                     "-base64 32 > " + path + "`");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status(Errc::kIoError, "cannot stat " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    return Status(Errc::kInvalidArgument, "secret file " + path + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status(Errc::kPermissionDenied,
                  "secret file " + path + " has mode " + mode +
                      ", which lets group or others access it; run `chmod 600 " + path + "`");
  }
  if (st.st_size > static_cast<off_t>(kMaxSecretFileSize)) {
    return Status(Errc::kInvalidArgument, "secret file " + path + " is " +
                                              std::to_string(st.st_size) +
                                              " bytes; a secret file holds at most " +
                                              std::to_string(kMaxSecretFileSize) + " bytes");
  }
  std::string contents(kMaxSecretFileSize + 1, '\0');
  size_t length = 0;
  while (length < contents.size()) {
    ssize_t n = ::read(fd, contents.data() + length, contents.size() - length);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(Errc::kIoError, "cannot read secret file " + path, errno);
    }
    if (n == 0) break;
    length += static_cast<size_t>(n);
  }
  if (length > kMaxSecretFileSize) {  // grew after fstat
    return Status(Errc::kInvalidArgument, "secret file " + path + " is larger than " +
                                              std::to_string(kMaxSecretFileSize) + " bytes");
  }
  contents.resize(length);
  if (!contents.empty() && contents.back() == '\n') contents.pop_back();
  if (contents.empty()) {
    return Status(Errc::kInvalidArgument,
                  "secret file " + path + " is empty; put the shared secret in it");
  }
  return contents;
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

  void error(const YAML::Mark& mark, const std::string& context, const std::string& problem) {
    std::string line = where(mark) + ": ";
    if (!context.empty()) line += context + ": ";
    line += problem;
    errors_.push_back(std::move(line));
  }

  bool failed() const { return !errors_.empty(); }

  Status status() const {
    std::string message;
    for (const auto& line : errors_) {
      if (!message.empty()) message += '\n';
      message += line;
    }
    return Status(Errc::kConfigError, std::move(message));
  }

  // One key of a map together with where to blame problems with its value:
  // a null value (`key:` with nothing after it) has a useless mark (start of
  // the next line), so point at the key instead.
  struct Entry {
    YAML::Node key;
    YAML::Node value;
    YAML::Mark value_mark() const { return value.IsNull() ? key.Mark() : value.Mark(); }
  };

  // Splits a map into its entries, rejecting unknown and duplicate keys.
  // yaml-cpp keeps duplicate keys (and lookup would silently pick one), so
  // check for them here.
  std::map<std::string, Entry> entries(const YAML::Node& map, const std::string& context,
                                       std::span<const std::string_view> allowed) {
    std::map<std::string, Entry> out;
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
        for (auto candidate : allowed) {
          if (edit_distance(name, candidate) <= 2) {
            problem += " (did you mean '" + std::string(candidate) + "'?)";
            break;
          }
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

  void parse_daemon(const Entry& entry, DaemonConfig& config) {
    if (entry.value.IsNull()) return;  // `daemon:` with every key commented out: all defaults
    if (!entry.value.IsMap()) {
      error(entry.value_mark(), "daemon",
            std::string("expected a map of settings, got ") + type_name(entry.value));
      return;
    }
    auto keys = entries(entry.value, "daemon", kDaemonKeys);
    if (auto it = keys.find("listen"); it != keys.end()) {
      if (auto v = string(it->second, "daemon.listen")) config.listen_address = *v;
    }
    if (auto it = keys.find("port"); it != keys.end()) {
      const Entry& port = it->second;
      if (auto text = scalar(port, "daemon.port", "a port number 1..65535")) {
        uint32_t value = 0;
        auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
        if (text->empty() || ec != std::errc() || end != text->data() + text->size() || value < 1 ||
            value > 65535) {
          error(port.value_mark(), "daemon.port",
                "expected a port number 1..65535, got '" + *text + "'");
        } else {
          config.port = static_cast<uint16_t>(value);
        }
      }
    }
    if (auto it = keys.find("transport"); it != keys.end()) {
      constexpr std::string_view kKinds[] = {"tcp", "rdma"};
      // Parsed here rather than with transport::parse_kind so that config
      // does not pull in the transport library (and libibverbs) to link.
      if (auto v = one_of(it->second, "daemon.transport", kKinds)) {
        config.transport = *v == "rdma" ? transport::Kind::kRdma : transport::Kind::kTcp;
      }
    }
    if (auto it = keys.find("state_pool"); it != keys.end()) {
      if (auto v = absolute_path(it->second, "daemon.state_pool")) config.state_pool = *v;
    }
    if (auto it = keys.find("log_level"); it != keys.end()) {
      if (auto v = one_of(it->second, "daemon.log_level", kLogLevels)) config.log_level = *v;
    }
  }

  // Where each volume name and path was first seen, to name both places
  // when one repeats.
  struct Seen {
    std::map<std::string, YAML::Mark> names;
    std::map<std::string, YAML::Mark> paths;
  };

  std::optional<VolumeConfig> parse_volume(const YAML::Node& node, const std::string& context,
                                           Seen& seen) {
    if (!node.IsMap()) {
      error(node.Mark(), context,
            std::string("expected a map describing a volume (name, path, ...), got ") +
                type_name(node));
      return std::nullopt;
    }
    size_t errors_before = errors_.size();
    auto keys = entries(node, context, kVolumeKeys);
    auto missing = [&](const char* key, const std::string& hint) {
      error(node.Mark(), context, std::string("missing required key '") + key + "'" + hint);
    };
    VolumeConfig volume;

    if (auto it = keys.find("name"); it == keys.end()) {
      missing("name", "");
    } else if (auto name = scalar(it->second, context + ".name", "a string")) {
      if (auto problem = check_name(*name); !problem.empty()) {
        error(it->second.value_mark(), context + ".name", "volume name " + problem);
      } else if (auto [first, inserted] = seen.names.emplace(*name, it->second.value.Mark());
                 !inserted) {
        error(it->second.value_mark(), context + ".name",
              "duplicate volume name '" + *name + "' (first defined at " + where(first->second) +
                  ")");
      } else {
        volume.name = *name;
      }
    }

    if (auto it = keys.find("path"); it == keys.end()) {
      missing("path", " (the devdax device or file holding the volume)");
    } else if (auto path = absolute_path(it->second, context + ".path")) {
      // Compare normalized so "/pmem//a" and "/pmem/a" are caught too.
      std::string normal = std::filesystem::path(*path).lexically_normal().string();
      if (auto [first, inserted] = seen.paths.emplace(normal, it->second.value.Mark()); !inserted) {
        error(it->second.value_mark(), context + ".path",
              "path '" + *path + "' is already used by another volume (at " + where(first->second) +
                  "); two volumes cannot share storage");
      } else {
        volume.path = *path;
      }
    }

    if (auto it = keys.find("size"); it != keys.end()) {
      if (auto text = scalar(it->second, context + ".size", "a size such as 1GiB")) {
        if (auto size = parse_size(*text); size.ok()) {
          volume.size = *size;
        } else {
          error(it->second.value_mark(), context + ".size", size.status().message());
        }
      }
    }
    if (auto it = keys.find("create"); it != keys.end()) {
      if (auto v = boolean(it->second, context + ".create")) {
        volume.create = *v;
        if (volume.create && keys.find("size") == keys.end()) {
          error(it->second.key.Mark(), context,
                "create: true needs a size (e.g. size: 1GiB) for the new file");
        }
      }
    }

    if (auto it = keys.find("allowed_peers"); it == keys.end()) {
      missing("allowed_peers", " (the identities allowed to open the volume, e.g. [app1])");
    } else {
      const Entry& peers = it->second;
      std::string peers_context = context + ".allowed_peers";
      if (!peers.value.IsSequence()) {
        error(peers.value_mark(), peers_context,
              std::string("expected a list of identities (e.g. [app1, app2]), got ") +
                  type_name(peers.value));
      } else if (peers.value.size() == 0) {
        error(peers.value_mark(), peers_context,
              "the list is empty, so nobody could open the volume; name at least one identity");
      } else {
        std::map<std::string, YAML::Mark> listed;
        for (size_t i = 0; i < peers.value.size(); ++i) {
          const YAML::Node peer = peers.value[i];
          std::string peer_context = peers_context + "[" + std::to_string(i) + "]";
          if (!peer.IsScalar()) {
            error(peer.Mark(), peer_context,
                  std::string("expected an identity name, got ") + type_name(peer));
            continue;
          }
          if (auto problem = check_name(peer.Scalar()); !problem.empty()) {
            error(peer.Mark(), peer_context, "identity " + problem);
            continue;
          }
          if (auto [first, inserted] = listed.emplace(peer.Scalar(), peer.Mark()); !inserted) {
            error(peer.Mark(), peer_context,
                  "identity '" + peer.Scalar() + "' is listed twice (first at " +
                      where(first->second) + ")");
            continue;
          }
          volume.allowed_peers.push_back(peer.Scalar());
        }
      }
    }

    auto secret = keys.find("secret");
    auto secret_file = keys.find("secret_file");
    if (secret != keys.end() && secret_file != keys.end()) {
      error(secret_file->second.key.Mark(), context,
            "give either 'secret' or 'secret_file', not both (secret is at " +
                where(secret->second.key.Mark()) + ")");
    } else if (secret != keys.end()) {
      if (auto text = scalar(secret->second, context + ".secret", "a string")) {
        if (text->size() < kMinSecretLength) {
          error(secret->second.value_mark(), context + ".secret",
                "too short (" + std::to_string(text->size()) + " characters); use at least " +
                    std::to_string(kMinSecretLength) +
                    " random characters, e.g. from `openssl rand -base64 32`");
        } else {
          volume.secret = *text;
        }
      }
    } else if (secret_file != keys.end()) {
      if (auto path = absolute_path(secret_file->second, context + ".secret_file")) {
        if (auto contents = read_secret_file(*path); !contents.ok()) {
          error(secret_file->second.value_mark(), context + ".secret_file",
                contents.status().message());
        } else if (contents->size() < kMinSecretLength) {
          error(secret_file->second.value_mark(), context + ".secret_file",
                "the secret in " + *path + " is too short (" + std::to_string(contents->size()) +
                    " characters); use at least " + std::to_string(kMinSecretLength) +
                    " random characters, e.g. `openssl rand -base64 32 > " + *path + "`");
        } else {
          volume.secret = std::move(*contents);
        }
      }
    } else {
      missing("secret_file", " (or 'secret'): the shared secret that initiators authenticate with");
    }

    if (auto it = keys.find("apm"); it != keys.end()) {
      constexpr std::string_view kPolicies[] = {"auto", "on", "off"};
      if (auto v = one_of(it->second, context + ".apm", kPolicies)) {
        volume.apm = *v == "on" ? ApmPolicy::kOn : *v == "off" ? ApmPolicy::kOff : ApmPolicy::kAuto;
      }
    }

    if (errors_.size() != errors_before) return std::nullopt;
    return volume;
  }

  void parse_volumes(const Entry* entry, const YAML::Node& root, DaemonConfig& config) {
    const char* hint =
        "; a daemon serves at least one volume, e.g.\n"
        "  volumes:\n"
        "    - name: db0\n"
        "      path: /dev/dax0.0\n"
        "      allowed_peers: [app1]\n"
        "      secret_file: /etc/pmirror/db0.secret";
    if (entry == nullptr) {
      error(root.Mark(), "", std::string("no 'volumes' section") + hint);
      return;
    }
    if (entry->value.IsNull()) {
      error(entry->value_mark(), "volumes", std::string("no volumes are listed") + hint);
      return;
    }
    if (!entry->value.IsSequence()) {
      error(entry->value_mark(), "volumes",
            std::string("expected a list of volumes (each item starting with '- name:'), got ") +
                type_name(entry->value));
      return;
    }
    if (entry->value.size() == 0) {
      error(entry->value_mark(), "volumes", std::string("the list is empty") + hint);
      return;
    }
    Seen seen;
    for (size_t i = 0; i < entry->value.size(); ++i) {
      std::string context = "volumes[" + std::to_string(i) + "]";
      if (auto volume = parse_volume(entry->value[i], context, seen)) {
        config.volumes.push_back(std::move(*volume));
      }
    }
  }

  Result<DaemonConfig> parse(const std::string& text) {
    std::vector<YAML::Node> documents;
    try {
      documents = YAML::LoadAll(text);
    } catch (const YAML::ParserException& e) {
      error(e.mark, "", "YAML syntax error: " + e.msg);
      return status();
    } catch (const YAML::Exception& e) {
      error(e.mark, "", std::string("cannot parse YAML: ") + e.what());
      return status();
    }
    if (documents.empty() || documents[0].IsNull()) {
      error(YAML::Mark::null_mark(), "",
            "the configuration is empty; see docs/config.md and "
            "config/pmirrord.example.yaml for a starting point");
      return status();
    }
    if (documents.size() > 1) {
      error(documents[1].Mark(), "",
            "found " + std::to_string(documents.size()) +
                " YAML documents ('---'); the configuration must be a single document");
      return status();
    }
    const YAML::Node& root = documents[0];
    if (!root.IsMap()) {
      error(root.Mark(), "",
            std::string("the top level must be a map with 'daemon' and 'volumes' keys, got ") +
                type_name(root));
      return status();
    }

    DaemonConfig config;
    auto keys = entries(root, "", kTopKeys);
    if (auto it = keys.find("daemon"); it != keys.end()) parse_daemon(it->second, config);
    auto volumes = keys.find("volumes");
    parse_volumes(volumes == keys.end() ? nullptr : &volumes->second, root, config);
    if (failed()) return status();
    return config;
  }

 private:
  std::string source_;
  std::vector<std::string> errors_;
};

}  // namespace

Result<DaemonConfig> parse_daemon_config(const std::string& yaml_text,
                                         const std::string& source_name) {
  Parser parser(source_name);
  return parser.parse(yaml_text);
}

Result<DaemonConfig> load_daemon_config(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return errno_status(Errc::kConfigError, "cannot open configuration file " + path, errno);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return errno_status(Errc::kConfigError, "cannot stat configuration file " + path, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status(Errc::kConfigError, "configuration file " + path + " is not a regular file" +
                                          (S_ISDIR(st.st_mode) ? " (it is a directory)" : ""));
  }
  if (st.st_size > kMaxConfigFileSize) {
    return Status(Errc::kConfigError, "configuration file " + path + " is " +
                                          std::to_string(st.st_size) +
                                          " bytes; that is not a pmirrord configuration");
  }
  std::string text;
  char buffer[8192];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(Errc::kConfigError, "cannot read configuration file " + path, errno);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return parse_daemon_config(text, path);
}

Result<uint64_t> parse_size(std::string_view text) {
  auto invalid = [&](const std::string& why) {
    return Status(Errc::kInvalidArgument, "invalid size '" + std::string(text) + "': " + why);
  };
  if (text.empty()) return invalid("empty");
  if (text.front() == '-') return invalid("a size cannot be negative");
  if (text.front() == '+') return invalid("write the number without a sign");
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) {
    return invalid(
        "expected a number of bytes, optionally with a K/M/G/T suffix (e.g. 4096, "
        "64MiB, 1G)");
  }
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + digits, number);
  if (ec == std::errc::result_out_of_range) return invalid("too large");
  if (ec != std::errc() || end != text.data() + digits) return invalid("not a number");

  std::string_view rest = text.substr(digits);
  if (!rest.empty() && (rest.front() == '.' || rest.front() == ',')) {
    return invalid("fractions are not allowed; use a smaller unit (e.g. 1536MiB, not 1.5GiB)");
  }
  // "64 MiB" reads naturally; allow spaces between number and unit.
  size_t spaces = 0;
  while (spaces < rest.size() && rest[spaces] == ' ') ++spaces;
  if (spaces != 0 && spaces == rest.size()) return invalid("trailing spaces");
  rest.remove_prefix(spaces);

  unsigned shift = 0;
  if (!rest.empty()) {
    switch (rest.front()) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      case 'T':
      case 't':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift != 0) rest.remove_prefix(1);
    if (shift != 0 && (rest == "" || rest == "B" || rest == "iB")) {
      // ok
    } else if (shift == 0 && rest == "B") {
      // plain bytes with a B
    } else {
      return invalid("unknown unit '" + std::string(text.substr(digits)) +
                     "'; use K, M, G or T, optionally followed by iB or B (all powers of 1024)");
    }
  }
  if (number == 0) return invalid("a size must be greater than zero");
  if (shift != 0 && number > (UINT64_MAX >> shift)) return invalid("too large");
  return number << shift;
}

}  // namespace pmirror::config
