// Files shared on one host: two volume copies, a copy and a metadata pool,
// a state pool and a control socket... that are one file under two names
// (a symbolic or hard link, `..`, a path through a linked directory)
// overwrite each other. The parser compares paths as written; this compares
// what they name on this machine, so it runs where the files are: in
// `pmirrorctl config check` and in pmirrord (daemon_config_for).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "config/config_internal.h"

namespace pmirror::config {
namespace {

namespace fs = std::filesystem;

// ------------------------------------------------------------ the host

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

// A numeric address in inet_ntop's form (so that ::1 and 0:0:0:0:0:0:0:1
// compare equal); a host name in lower case without a trailing dot.
std::string canonical_address(std::string_view address) {
  const std::string text(address);
  in_addr v4{};
  in6_addr v6{};
  char buffer[INET6_ADDRSTRLEN] = {};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return ::inet_ntop(AF_INET, &v4, buffer, sizeof buffer);
  }
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return ::inet_ntop(AF_INET6, &v6, buffer, sizeof buffer);
  }
  return lower(address);
}

bool is_wildcard(const std::string& canonical) {
  return canonical.empty() || canonical == "0.0.0.0" || canonical == "::";
}

bool is_loopback(const std::string& canonical) {
  if (canonical == "localhost" || canonical.ends_with(".localhost")) return true;
  if (canonical == "::1") return true;
  in_addr v4{};
  std::string v4_text = canonical.starts_with("::ffff:") ? canonical.substr(7) : canonical;
  return ::inet_pton(AF_INET, v4_text.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

// This machine's own names: every interface address and the host name.
std::set<std::string> this_machine() {
  std::set<std::string> names;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr) continue;
      char buffer[INET6_ADDRSTRLEN] = {};
      if (a->ifa_addr->sa_family == AF_INET) {
        auto* in = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
        if (::inet_ntop(AF_INET, &in->sin_addr, buffer, sizeof buffer)) names.insert(buffer);
      } else if (a->ifa_addr->sa_family == AF_INET6) {
        auto* in = reinterpret_cast<sockaddr_in6*>(a->ifa_addr);
        if (::inet_ntop(AF_INET6, &in->sin6_addr, buffer, sizeof buffer)) names.insert(buffer);
      }
    }
    ::freeifaddrs(list);
  }
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) == 0 && host[0] != '\0') {
    std::string name = lower(host);
    names.insert(name);
    names.insert(name.substr(0, name.find('.')));
  }
  return names;
}

// The nodes whose daemons and applications run on the machine of `self`
// (docs/config.md): self; every node reached at, or listening on, one of
// self's addresses; every node at a loopback address (only this machine
// can reach it); every node at an address or name of this machine. Host
// names are compared as written, never resolved.
std::set<std::string> nodes_on_this_host(const ClusterConfig& cluster, const std::string& self) {
  std::set<std::string> own;  // self's addresses
  if (const NodeConfig* node = cluster.find_node(self)) {
    for (const auto& address : {node->address, node->listen}) {
      std::string canonical = canonical_address(address);
      if (!is_wildcard(canonical)) own.insert(canonical);
    }
  }
  const std::set<std::string> machine = this_machine();
  std::set<std::string> out;
  for (const auto& node : cluster.nodes) {
    bool here = node.name == self;
    for (const auto& address : {node.address, node.listen}) {
      std::string canonical = canonical_address(address);
      if (is_wildcard(canonical)) continue;
      here = here || own.count(canonical) != 0 || is_loopback(canonical) ||
             machine.count(canonical) != 0;
    }
    if (here) out.insert(node.name);
  }
  return out;
}

// ------------------------------------------------------------ the files

enum class Kind { kCopy, kMetadata, kStatePool, kControlSocket };

// One use of a file on one node.
struct Use {
  std::string node;
  Kind kind;
  std::string volume;  // for kCopy and kMetadata
  std::string path;
  Origin origin;
  bool is_default = false;
  int line = 0, column = 0;  // of origin.at, for file order

  std::string what() const {
    std::string text;
    switch (kind) {
      case Kind::kCopy:
        text = "the copy of volume '" + volume + "' on node '" + node + "'";
        break;
      case Kind::kMetadata:
        text = "the metadata pool of volume '" + volume + "' on node '" + node + "'";
        break;
      case Kind::kStatePool:
        text = "the state pool of node '" + node + "'";
        break;
      case Kind::kControlSocket:
        text = "the control socket of node '" + node + "'";
        break;
    }
    return text + (is_default ? " (the default)" : "");
  }
  // The parser compares these kinds with each other by path (on nodes of
  // one address); its report is enough for those.
  int parser_group() const {
    return kind == Kind::kCopy || kind == Kind::kMetadata ? 0 : static_cast<int>(kind);
  }
};

// "SOURCE:LINE:COL" -> (LINE, COL); the source may itself hold ':'.
std::pair<int, int> position(const std::string& at) {
  size_t second = at.rfind(':');
  if (second == std::string::npos || second == 0) return {0, 0};
  size_t first = at.rfind(':', second - 1);
  if (first == std::string::npos) return {0, 0};
  return {std::atoi(at.c_str() + first + 1), std::atoi(at.c_str() + second + 1)};
}

// A path that does not exist (yet): its links resolved as far as they go
// -- a dangling link names the file that creating it would make -- then
// the deepest existing directory made canonical and the rest appended.
std::string resolved_path(const std::string& path) {
  fs::path current = fs::path(path).lexically_normal();
  for (int hops = 0; hops < 40; ++hops) {  // the kernel's own limit on links
    struct stat st {};
    if (::lstat(current.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) break;
    std::error_code error;
    fs::path target = fs::read_symlink(current, error);
    if (error) break;
    current = (target.is_absolute() ? target : current.parent_path() / target).lexically_normal();
  }
  std::error_code error;
  fs::path canonical = fs::weakly_canonical(current, error);
  return (error ? current : canonical).string();
}

// What identifies the file a use names on this machine, and how to say so.
struct Identity {
  std::string key;
  std::string detail;  // "device 8:1, inode 1234"
};

Identity identify(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      std::string device =
          std::to_string(major(st.st_rdev)) + ":" + std::to_string(minor(st.st_rdev));
      return {"device " + device, "both are device " + device};
    }
    std::string inode = "device " + std::to_string(major(st.st_dev)) + ":" +
                        std::to_string(minor(st.st_dev)) + ", inode " + std::to_string(st.st_ino);
    return {"file " + inode, inode + ": a symbolic or hard link, or a path through one"};
  }
  std::string resolved = resolved_path(path);
  return {"path " + resolved, "both name " + resolved + " once links are followed"};
}

std::vector<Use> uses_on(const ClusterConfig& cluster, const std::set<std::string>& nodes) {
  std::vector<Use> uses;
  for (size_t i = 0; i < cluster.volumes.size(); ++i) {
    const ClusterVolume& volume = cluster.volumes[i];
    const std::string index = "volumes[" + std::to_string(i) + "]";
    for (const auto& [node, path] : volume.paths) {
      if (nodes.count(node) == 0) continue;
      auto at = volume.path_at.find(node);
      Origin data{at == volume.path_at.end() ? cluster.source : at->second,
                  index + ".paths." + node};
      uses.push_back({node, Kind::kCopy, volume.name, path, data});
      auto metadata = volume.metadata_paths.find(node);
      if (metadata == volume.metadata_paths.end()) continue;
      auto metadata_at = volume.metadata_at.find(node);
      const bool is_default =
          metadata_at == volume.metadata_at.end() || metadata_at->second == data.at;
      uses.push_back({node, Kind::kMetadata, volume.name, metadata->second,
                      is_default ? data : Origin{metadata_at->second, index + ".metadata." + node},
                      is_default});
    }
  }
  for (const auto& node : cluster.nodes) {
    if (nodes.count(node.name) == 0) continue;
    const Origin& pool = node.daemon.state_pool_origin;
    const Origin& socket = node.daemon.control_socket_origin;
    uses.push_back({node.name, Kind::kStatePool, "", node.daemon.state_pool,
                    pool.at.empty() ? node.origin : pool, pool.at.empty()});
    uses.push_back({node.name, Kind::kControlSocket, "", node.daemon.control_socket,
                    socket.at.empty() ? node.origin : socket, socket.at.empty()});
  }
  for (auto& use : uses) std::tie(use.line, use.column) = position(use.origin.at);
  std::stable_sort(uses.begin(), uses.end(), [](const Use& a, const Use& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  return uses;
}

}  // namespace

std::vector<std::string> shared_file_problems(const ClusterConfig& cluster, const std::string& self,
                                              bool only_own) {
  const std::set<std::string> here = nodes_on_this_host(cluster, self);
  const std::vector<Use> uses = uses_on(cluster, here);
  auto address_of = [&](const std::string& node) {
    const NodeConfig* found = cluster.find_node(node);
    return found == nullptr ? std::string() : found->address;
  };
  std::vector<std::string> problems;
  std::map<std::string, std::vector<size_t>> by_file;  // identity -> uses, in file order
  std::vector<Identity> identities;
  identities.reserve(uses.size());
  for (size_t i = 0; i < uses.size(); ++i) {
    identities.push_back(identify(uses[i].path));
    by_file[identities[i].key].push_back(i);
  }
  for (const auto& [key, indexes] : by_file) {
    const Use& first = uses[indexes.front()];
    for (size_t k = 1; k < indexes.size(); ++k) {
      const Use& later = uses[indexes[k]];
      if (only_own && first.node != self && later.node != self) continue;
      // The parser reported these already (one path on two nodes of one
      // address), and the same use twice is no clash.
      const bool same_text =
          fs::path(first.path).lexically_normal() == fs::path(later.path).lexically_normal();
      if (first.node != later.node && same_text &&
          address_of(first.node) == address_of(later.node) &&
          first.parser_group() == later.parser_group()) {
        continue;
      }
      std::string detail = same_text ? "" : " (" + identities[indexes[k]].detail + ")";
      problems.push_back(
          later.origin.at + ": " + later.origin.key + ": " + later.what() + ", " + later.path +
          ", and " + first.what() + ", " + first.path + " (at " + first.origin.at +
          "), are the same file" + detail +
          "; give each a file of its own (two uses of one file overwrite each other)");
    }
  }
  return problems;
}

}  // namespace pmirror::config
