// Internal to lib/config: what config.cpp, cluster.cpp, yaml_scan.cpp and
// file_identity.cpp share.
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "config/config.h"

namespace pmirror::config {

constexpr size_t kMinSecretLength = 16;
constexpr size_t kMaxSecretFileSize = 4096;

// A secret file: a regular file, no group/other permission bits, non-empty,
// at most 4 KiB, one trailing newline stripped. Errors name the path and
// say what to run.
Result<std::string> read_secret_file(const std::string& path);

// The whole configuration file (kConfigError naming the path on failure).
Result<std::string> read_config_file(const std::string& path);

// Where a copy's metadata pool lives when the cluster file does not say:
// `<data_path>.pmirror`, or /var/lib/pmirror/<volume>.pmirror for a path
// under /dev/dax (a devdax device has no room beside it). The same rule as
// metadata::default_metadata_path (lib/metadata), kept here so that the
// config library does not link libpmemobj; change both together.
std::string default_metadata_path(const std::string& data_path, const std::string& volume);

// Empty when `host` is a valid numeric IPv4 or IPv6 address or DNS host
// name (RFC 1123); otherwise why not.
std::string check_host(std::string_view host);

// ------------------------------------------------------ yaml_scan.cpp

// Where a node really is when yaml-cpp's Mark() says otherwise.
struct MarkFix {
  YAML::Mark given;   // what Mark() returns
  YAML::Mark actual;  // where to report problems with the node
};

inline bool same_mark(const YAML::Mark& a, const YAML::Mark& b) {
  return a.pos == b.pos && a.line == b.line && a.column == b.column;
}

// What parsing the document a second time, as events, tells the parser:
// * fixes, by key path (as the parser's contexts: "volumes[0].replicas[1]"):
//   an alias's own position (Mark() gives its anchor's) and the '-' of an
//   empty block sequence item (Mark() gives the next token's, which may be
//   past the end of the file);
// * refused_at/refused: the document is refused as a whole -- more than
//   kMaxDocumentNodes nodes with its aliases expanded (at the node or alias
//   that crossed the limit), or an alias inside the node it refers to.
struct DocumentScan {
  std::unordered_map<std::string, MarkFix> fixes;
  std::optional<YAML::Mark> refused_at;
  std::string refused;
};
// Scans the first document of `text`, which yaml-cpp has loaded already.
DocumentScan scan_document(const std::string& text);

// `mark`, moved onto the last line of `text` that has something on it when
// it lies past the end.
YAML::Mark clamp_mark(const std::string& text, YAML::Mark mark);

// -------------------------------------------------- cluster.cpp

// One problem found in a cluster file, with its position for sorting
// (0: the whole file).
struct Problem {
  int line = 0;
  int column = 0;
  std::string text;
};
// "SOURCE:LINE:COL: ..." -> a Problem at (LINE, COL); (0, 0) when there is none.
Problem problem_from_text(const std::string& source, std::string text);
// By position, keeping the order of problems at one position.
void sort_problems(std::vector<Problem>& problems);
// The first kMaxReportedProblems (sorted), then one line counting the rest.
void cap_problems(std::vector<Problem>& problems);
// One kConfigError listing them, one per line (capped).
Status problems_status(std::vector<Problem> problems);
// Parses without failing: the config as far as it could be read, and every
// problem (sorted by position).
ClusterConfig parse_collecting(const std::string& text, const std::string& source,
                               std::vector<Problem>& problems);
// "a, b, c"; of names, the first 20 and how many in all.
std::string join(std::span<const std::string_view> words);
std::string join(const std::vector<std::string>& words);
std::vector<std::string> node_names(const ClusterConfig& cluster);

// -------------------------------------------------- file_identity.cpp

// On the host of node `self` (docs/config.md, "Files shared on one host"),
// every two uses of one file among volume copies, copy metadata pools,
// state pools and control sockets: one "FILE:LINE:COL: where: what" each.
// Files that exist are compared by device and inode (st_rdev for
// devices), others by their path with links resolved. `self` empty: the
// nodes at a loopback address or an address of this machine. only_own:
// only clashes involving one of self's files (pmirrord's view).
std::vector<std::string> shared_file_problems(const ClusterConfig& cluster, const std::string& self,
                                              bool only_own);
struct ClusterConfig;

// For check_cluster_file (space_check.cpp): on `node`, every volume whose
// file still needs more space (all of it to be created, its holes if it
// exists) than is free on its file system, summed per file system. One
// "FILE:LINE:COL: volumes[i].paths.NODE: ..." text each.
std::vector<std::string> space_problems(const ClusterConfig& config, const std::string& node);

}  // namespace pmirror::config
