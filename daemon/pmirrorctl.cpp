// pmirrorctl: asks the pmirror processes on this node what they are doing
// (control sockets, lib/control) and checks cluster files. docs/pmirrorctl.md.
#include <CLI/CLI.hpp>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "control/control.h"

namespace {

namespace control = pmirror::control;
using nlohmann::json;
using pmirror::Errc;

// Exit codes, in the spirit of drbdadm's classes. docs/pmirrorctl.md.
constexpr int kExitOk = 0;
constexpr int kExitUsage = 1;       // bad usage, or the volume asked for does not exist
constexpr int kExitConfig = 2;      // config check found problems
constexpr int kExitNotRunning = 3;  // nothing pmirror runs on this node
constexpr int kExitPermission = 4;  // a socket or the runtime directory is not readable
constexpr int kExitError = 5;       // anything else (timeout, bad reply, ...)

struct Global {
  std::string socket;
  std::string runtime_dir;
  int timeout_ms = 5000;
};

// What asking every process gave.
struct Gathered {
  std::vector<json> statuses;
  bool daemon_running = false;
  bool permission_denied = false;
  bool other_error = false;
};

void note(const std::string& text) { std::fprintf(stderr, "pmirrorctl: %s\n", text.c_str()); }

void classify(const pmirror::Status& status, Gathered& gathered) {
  if (status.code() == Errc::kPermissionDenied) {
    gathered.permission_denied = true;
  } else {
    gathered.other_error = true;
  }
  note(status.message());
}

// Initiator sockets whose process is gone are skipped with a note.
bool is_stale(const pmirror::Status& status) {
  return status.code() == Errc::kConnectionError || status.code() == Errc::kNotFound;
}

Gathered gather_status(const Global& global) {
  Gathered gathered;
  std::chrono::milliseconds timeout(global.timeout_ms);
  json request = {{"command", "status"}};
  auto daemon = control::request(global.socket, request, timeout);
  if (daemon.ok()) {
    gathered.daemon_running = true;
    gathered.statuses.push_back(std::move(daemon).value());
  } else if (daemon.status().code() == Errc::kConnectionError) {
    note("note: " + daemon.status().message());
  } else if (daemon.status().code() != Errc::kNotFound) {
    classify(daemon.status(), gathered);
  }
  auto sockets = control::list_initiator_sockets(global.runtime_dir);
  if (!sockets.ok()) {
    classify(sockets.status(), gathered);
    return gathered;
  }
  for (const control::InitiatorSocket& socket : *sockets) {
    auto status = control::request(socket.path, request, timeout);
    if (status.ok()) {
      gathered.statuses.push_back(std::move(status).value());
    } else if (is_stale(status.status())) {
      note("note: ignoring stale socket " + socket.path + " (process " +
           std::to_string(socket.pid) + " has gone)");
    } else if (status.status().code() == Errc::kInvalidArgument) {
      note("note: ignoring " + socket.path + ": not a socket");
    } else {
      classify(status.status(), gathered);
    }
  }
  return gathered;
}

int nothing_running(const Global& global) {
  note("pmirrord is not running on this node (no socket at " + global.socket +
       ") and no process has a volume open");
  return kExitNotRunning;
}

int incomplete_exit(const Gathered& gathered) {
  if (gathered.permission_denied) return kExitPermission;
  if (gathered.other_error) return kExitError;
  return kExitOk;
}

int run_status(const Global& global, const std::optional<std::string>& volume, bool as_json) {
  Gathered gathered = gather_status(global);
  if (gathered.statuses.empty()) {
    if (gathered.permission_denied) return kExitPermission;
    if (gathered.other_error) return kExitError;
    return nothing_running(global);
  }
  if (volume) {
    std::vector<std::string> known =
        control::volume_names(control::merge_status(gathered.statuses));
    if (std::find(known.begin(), known.end(), *volume) == known.end()) {
      std::string list;
      for (const std::string& name : known) list += (list.empty() ? "" : ", ") + name;
      note("no volume '" + *volume + "' on this node; known: " + (list.empty() ? "none" : list));
      int incomplete = incomplete_exit(gathered);
      return incomplete != kExitOk ? incomplete : kExitUsage;
    }
  }
  json merged = control::merge_status(gathered.statuses, volume);
  if (as_json) {
    std::printf("%s\n", merged.dump(2, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    std::fputs(control::format_status_human(merged, volume).c_str(), stdout);
  }
  return incomplete_exit(gathered);
}

// Subscribes to every process on the node, and to those that appear later,
// printing events as they arrive.
class EventStream {
 public:
  EventStream(const Global& global, bool as_json, uint64_t count)
      : global_(global), as_json_(as_json), count_(count) {}

  int run() {
    // First pass: is anything there at all?
    std::vector<std::string> paths;
    bool permission = false, other = false;
    auto check = [&](const std::string& path, bool daemon) {
      pmirror::Status live = control::probe(path, std::chrono::milliseconds(global_.timeout_ms));
      if (live.ok()) {
        paths.push_back(path);
      } else if (live.code() == Errc::kPermissionDenied) {
        permission = true;
        note(live.message());
      } else if (!is_stale(live) || daemon) {
        if (live.code() != Errc::kNotFound) note(live.message());
        if (!is_stale(live)) other = true;
      }
    };
    check(global_.socket, true);
    auto sockets = control::list_initiator_sockets(global_.runtime_dir);
    if (!sockets.ok()) {
      note(sockets.status().message());
      return sockets.status().code() == Errc::kPermissionDenied ? kExitPermission : kExitError;
    }
    for (const auto& socket : *sockets) check(socket.path, false);
    if (paths.empty()) {
      if (permission) return kExitPermission;
      if (other) return kExitError;
      return nothing_running(global_);
    }
    for (const std::string& path : paths) start(path);
    std::unique_lock lock(mutex_);
    while (!finished_) {
      wake_.wait_for(lock, std::chrono::seconds(1));
      if (finished_) break;
      lock.unlock();
      rescan();
      lock.lock();
    }
    lock.unlock();
    for (auto& [path, source] : sources_) source->thread.request_stop();
    sources_.clear();  // joins
    return kExitOk;
  }

 private:
  struct Source {
    std::jthread thread;
    std::atomic<bool> done{false};
  };

  void rescan() {
    std::vector<std::string> candidates = {global_.socket};
    if (auto sockets = control::list_initiator_sockets(global_.runtime_dir); sockets.ok()) {
      for (const auto& socket : *sockets) candidates.push_back(socket.path);
    }
    for (auto it = sources_.begin(); it != sources_.end();) {
      it = it->second->done.load() ? sources_.erase(it) : std::next(it);
    }
    for (const std::string& path : candidates) {
      if (sources_.count(path) != 0) continue;
      if (!control::probe(path, std::chrono::milliseconds(global_.timeout_ms)).ok()) continue;
      start(path);
    }
  }

  void start(const std::string& path) {
    auto source = std::make_unique<Source>();
    Source* raw = source.get();
    raw->thread = std::jthread([this, path, raw](std::stop_token stop) {
      pmirror::Status ended = control::subscribe(
          path, [this](const json& event) { return print(event); }, stop,
          std::chrono::milliseconds(global_.timeout_ms));
      if (!stop.stop_requested() && !ended.ok()) note("note: " + ended.message());
      raw->done.store(true);
    });
    sources_.emplace(path, std::move(source));
  }

  bool print(const json& event) {
    std::lock_guard lock(mutex_);
    if (finished_) return false;
    std::string line = as_json_ ? event.dump(-1, ' ', false, json::error_handler_t::replace)
                                : control::format_event_human(event);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (count_ != 0 && ++printed_ >= count_) {
      finished_ = true;
      wake_.notify_all();
      return false;
    }
    return true;
  }

  const Global& global_;
  bool as_json_;
  uint64_t count_;
  uint64_t printed_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool finished_ = false;
  std::map<std::string, std::unique_ptr<Source>> sources_;
};

int run_config_check(const std::string& file, const std::string& node) {
  std::vector<std::string> problems = pmirror::config::check_cluster_file(file, node);
  if (problems.empty()) {
    std::printf("%s: OK\n", file.c_str());
    return kExitOk;
  }
  for (const std::string& problem : problems) std::fprintf(stderr, "%s\n", problem.c_str());
  std::fprintf(stderr, "%s: %zu problem(s)\n", file.c_str(), problems.size());
  return kExitConfig;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"pmirrorctl: shows what pmirror does on this node; checks cluster files"};
  app.require_subcommand(1);
  Global global;
  app.add_option("--socket", global.socket,
                 "pmirrord's control socket (default: RUNTIME_DIR/pmirrord.sock)");
  app.add_option("--runtime-dir", global.runtime_dir,
                 "where control sockets live (default: $PMIRROR_RUNTIME_DIR, else /run/pmirror)");
  app.add_option("--timeout", global.timeout_ms, "milliseconds to wait for each process")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();

  std::optional<std::string> volume;
  bool as_json = false;
  auto* status = app.add_subcommand(
      "status", "every volume this node serves or writes, its peers, lag and latency");
  status->add_option("VOLUME", volume, "only this volume");
  status->add_flag("--json", as_json, "the stable JSON form (docs/control.md)");

  bool events_json = false;
  uint64_t count = 0;
  auto* events =
      app.add_subcommand("events", "print state changes as they happen, until interrupted");
  events->add_flag("--json", events_json, "one JSON object per line, as the processes send them");
  events->add_option("--count", count, "exit after this many events (0: never)");

  auto* config = app.add_subcommand("config", "configuration files");
  config->require_subcommand(1);
  std::string config_file, node;
  auto* check = config->add_subcommand("check", "validate a cluster file (exit code 2 if invalid)");
  check->add_option("FILE", config_file, "the cluster file")->required();
  check->add_option("--node", node, "check as this node (default: the one matching the host name)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  if (global.runtime_dir.empty()) global.runtime_dir = control::runtime_dir();
  if (global.socket.empty()) global.socket = control::daemon_socket_path(global.runtime_dir);

  if (status->parsed()) return run_status(global, volume, as_json);
  if (events->parsed()) return EventStream(global, events_json, count).run();
  if (check->parsed()) return run_config_check(config_file, node);
  return kExitUsage;
}
