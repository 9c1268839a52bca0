// pmirror-run: runs an unmodified PMDK program (libpmemobj, libpmemlog,
// libpmemblk, or libpmem itself) with its pool mirrored (docs/pmdk.md).
// Thin: checks the cluster file and the volume's local copy, then executes
// the program with libpmirror-preload.so in LD_PRELOAD and the volume named
// in its environment; the preloaded library does the mirroring.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "defaults.h"

namespace {

constexpr int kExitUsage = 64;   // EX_USAGE
constexpr int kExitConfig = 78;  // EX_CONFIG
constexpr int kExitExec = 127;   // as a shell: the program could not be run

// The preload library: $PMIRROR_PRELOAD_LIBRARY, else the one built beside
// this pmirror-run (a build tree), else the installed one.
std::string preload_library() {
  if (const char* given = std::getenv("PMIRROR_PRELOAD_LIBRARY"); given != nullptr && *given) {
    return given;
  }
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && self == std::filesystem::path(PMIRROR_RUN_BUILD_PATH) &&
      std::filesystem::exists(PMIRROR_PRELOAD_BUILD_PATH)) {
    return PMIRROR_PRELOAD_BUILD_PATH;
  }
  return PMIRROR_PRELOAD_INSTALLED_PATH;
}

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "pmirror-run: %s\n", message.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "pmirror-run: runs a PMDK program with its pool mirrored to the volume's replicas, "
      "unmodified (pmirror-run(1))"};
  std::string config_path = pmirror::kDefaultClusterFile;
  std::string volume, node, identity, log_level;
  std::string durability = "observed";
  std::vector<std::string> command;
  app.add_option("-c,--config", config_path, "the cluster configuration file")
      ->capture_default_str();
  app.add_option("--volume", volume, "the volume whose local copy the program maps")->required();
  app.add_option("-n,--node", node,
                 "which node of the cluster this is (default: the node named like this host)");
  app.add_option("--identity", identity,
                 "who the program is to the targets (default: the volume's first allowed_peers "
                 "entry)");
  app.add_option("--log-level", log_level, "libpmirror's messages: warn (default), info, debug")
      ->check(CLI::IsMember({"warn", "info", "debug"}));
  app.add_option("--durability", durability,
                 "when the program waits for the replicas: observed (default: a drain is "
                 "ordered, and the program waits before its state can be seen outside it: a "
                 "write, send, fsync, rename, exit, ...) or drain (every drain waits)")
      ->check(CLI::IsMember({"observed", "drain"}))
      ->capture_default_str();
  app.add_option("command", command, "the program and its arguments (after --)")->required();
  app.set_version_flag("-V,--version", "pmirror-run " PMIRROR_VERSION_STRING);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }

  auto cluster = pmirror::config::load_cluster_config(config_path);
  if (!cluster.ok()) return fail(kExitConfig, cluster.status().message());
  auto me = pmirror::config::resolve_node(*cluster, node);
  if (!me.ok()) return fail(kExitConfig, me.status().message());
  const pmirror::config::ClusterVolume* found = cluster->find_volume(volume);
  if (found == nullptr) {
    return fail(kExitConfig, config_path + ": no volume '" + volume + "'");
  }
  auto path = found->paths.find(*me);
  if (path == found->paths.end()) {
    return fail(kExitConfig,
                config_path + ": node '" + *me + "' holds no copy of volume '" + volume + "'");
  }
  if (identity.empty()) {
    if (found->allowed_peers.empty()) {
      return fail(kExitConfig, "volume '" + volume +
                                   "' names no allowed_peers: say who the program is with "
                                   "--identity");
    }
    identity = found->allowed_peers.front();
  }
  // The local copy is the file the program maps. It must be there (unless
  // the volume creates it, zero-filled, which pmemobj_create with size 0
  // then formats), and as large as the volume.
  struct stat st {};
  if (::stat(path->second.c_str(), &st) != 0) {
    if (errno != ENOENT || !found->create) {
      return fail(kExitConfig, "volume '" + volume + "': its local copy " + path->second + ": " +
                                   std::strerror(errno) +
                                   (errno == ENOENT ? " (create the pool there, or set "
                                                      "`create: true` on the volume)"
                                                    : ""));
    }
  } else if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) != found->size) {
    return fail(kExitConfig,
                "volume '" + volume + "': its local copy " + path->second + " is " +
                    std::to_string(st.st_size) + " bytes, the volume " +
                    std::to_string(found->size) +
                    ": make the pool exactly the volume's size (e.g. pmempool create --size)");
  }

  std::string absolute_config = std::filesystem::absolute(config_path).string();
  std::string preload = preload_library();
  if (::access(preload.c_str(), R_OK) != 0) {
    return fail(kExitExec,
                "cannot read the preload library " + preload + ": " + std::strerror(errno));
  }
  const char* existing = std::getenv("LD_PRELOAD");
  std::string preload_list = existing != nullptr && *existing ? preload + ":" + existing : preload;
  ::setenv("LD_PRELOAD", preload_list.c_str(), 1);
  ::setenv("PMIRROR_RUN_CONFIG", absolute_config.c_str(), 1);
  ::setenv("PMIRROR_RUN_VOLUME", volume.c_str(), 1);
  ::setenv("PMIRROR_RUN_NODE", me->c_str(), 1);
  ::setenv("PMIRROR_RUN_IDENTITY", identity.c_str(), 1);
  ::setenv("PMIRROR_RUN_PATH", path->second.c_str(), 1);
  ::setenv("PMIRROR_RUN_DURABILITY", durability.c_str(), 1);
  if (!log_level.empty()) ::setenv("PMIRROR_RUN_LOG_LEVEL", log_level.c_str(), 1);

  std::vector<char*> args;
  for (std::string& word : command) args.push_back(word.data());
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  return fail(kExitExec, "cannot run " + command.front() + ": " + std::strerror(errno));
}
