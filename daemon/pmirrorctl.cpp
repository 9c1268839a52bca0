// pmirrorctl: asks the pmirror processes on this node what they are doing
// (control sockets, lib/control) and checks cluster files. docs/pmirrorctl.md.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "control/control.h"
#include "defaults.h"

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
constexpr int kExitMismatch = 6;    // verify: the copies differ
constexpr int kExitRefused = 7;     // the process refused in its present state (busy, ...)

// verify reads the whole volume on both sides: give it time.
constexpr int kVerifyTimeoutMs = 10 * 60 * 1000;
// promote/demote may wait for pmirrord to end a writer's session (10 s).
constexpr int kRoleTimeoutMs = 30 * 1000;

struct Global {
  std::string socket;
  std::string runtime_dir;
  int timeout_ms = 5000;
  bool timeout_given = false;  // --timeout on the command line
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

// A socket whose process is gone (refused) or that went away meanwhile.
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
  // Who holds each volume's lease, when pmirror-promoter runs here
  // (docs/failover.md); said nothing about when it does not.
  auto attach_promoter = [&] {
    auto promoter =
        control::request(control::promoter_socket_path(global.socket), request, timeout);
    if (promoter.ok()) control::attach_failover(gathered.statuses, *promoter);
  };
  auto sockets = control::list_initiator_sockets(global.runtime_dir);
  if (!sockets.ok()) {
    classify(sockets.status(), gathered);
    attach_promoter();
    return gathered;
  }
  for (const control::InitiatorSocket& socket : *sockets) {
    auto status = control::request(socket.path, request, timeout);
    if (status.ok()) {
      gathered.statuses.push_back(std::move(status).value());
    } else if (status.status().code() == Errc::kNotFound) {
      continue;  // closed its volume meanwhile
    } else if (status.status().code() == Errc::kConnectionError) {
      // Left by a process that died with a volume open: removed, so that
      // the next call says nothing about it.
      const std::string pid = std::to_string(socket.pid);
      auto removed = control::remove_if_stale(socket);
      if (!removed.ok()) {
        note("note: ignoring stale socket " + socket.path + ": " + removed.status().message());
      } else if (*removed) {
        note("note: removed stale socket " + socket.path + " (process " + pid + " has gone)");
      } else {
        note("note: ignoring " + socket.path + ": nothing listens there, yet process " + pid +
             " exists");
      }
    } else if (status.status().code() == Errc::kInvalidArgument) {
      note("note: ignoring " + socket.path + ": not a socket");
    } else {
      classify(status.status(), gathered);
    }
  }
  attach_promoter();
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
// events --now: the state of every process as "exists" events, then exit.
int run_events_now(const Global& global, bool as_json) {
  Gathered gathered = gather_status(global);
  if (gathered.statuses.empty()) {
    if (gathered.permission_denied) return kExitPermission;
    if (gathered.other_error) return kExitError;
    return nothing_running(global);
  }
  for (const json& status : gathered.statuses) {
    for (const json& event : control::state_events(status)) {
      std::string line = as_json ? event.dump(-1, ' ', false, json::error_handler_t::replace)
                                 : control::format_event_human(event);
      std::printf("%s\n", line.c_str());
    }
  }
  return incomplete_exit(gathered);
}

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
    // pmirror-promoter's lease changes, where one runs (failover.engine: etcd).
    if (control::probe(promoter_socket(), std::chrono::milliseconds(global_.timeout_ms)).ok()) {
      paths.push_back(promoter_socket());
    }
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
    std::vector<std::string> candidates = {global_.socket, promoter_socket()};
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
      // Subscribed first, then the state: every event that follows is
      // newer than the state printed.
      auto print_state = [this, &path] {
        // The promoter's status is not a process status: it has no state
        // lines (`pmirrorctl status` shows who holds each lease).
        if (path == promoter_socket()) return;
        auto status = control::request(path, {{"command", "status"}},
                                       std::chrono::milliseconds(global_.timeout_ms));
        if (!status.ok()) return;  // it went away; the subscription says so
        for (const json& event : control::state_events(*status)) print(event, /*counted=*/false);
      };
      pmirror::Status ended = control::subscribe(
          path, [this](const json& event) { return print(event); }, stop,
          std::chrono::milliseconds(global_.timeout_ms), print_state);
      if (!stop.stop_requested() && !ended.ok()) note("note: " + ended.message());
      raw->done.store(true);
    });
    sources_.emplace(path, std::move(source));
  }

  std::string promoter_socket() const { return control::promoter_socket_path(global_.socket); }

  // `counted`: a change, as --count counts them (the state lines are not).
  bool print(const json& event, bool counted = true) {
    std::lock_guard lock(mutex_);
    if (finished_) return false;
    std::string line = as_json_ ? event.dump(-1, ' ', false, json::error_handler_t::replace)
                                : control::format_event_human(event);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (counted && count_ != 0 && ++printed_ >= count_) {
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

// ---- commands: resync, verify (a primary's libpmirror), promote, demote
// (pmirrord) ------------------------------------------------------------

void print_json(const json& value) {
  std::printf("%s\n", value.dump(2, ' ', false, json::error_handler_t::replace).c_str());
}

// The exit code for a failed command request, after printing why. Errors
// of the connection come before the reply; the rest are the process's own
// answer (docs/pmirrorctl.md#exit-status).
int command_failed(const pmirror::Status& status) {
  std::string message = status.message();
  switch (status.code()) {
    case Errc::kPermissionDenied:
      note(message);
      return kExitPermission;
    case Errc::kNotFound:
      note(message);
      return kExitUsage;
    case Errc::kInvalidArgument:
      if (message.rfind("unknown command", 0) == 0) {
        note(message + " (that process runs an older pmirror than this pmirrorctl)");
        return kExitError;
      }
      note(message);
      return kExitUsage;
    case Errc::kBusy:
    case Errc::kFailedPrecondition:
    case Errc::kSplitBrain:
    case Errc::kFenced:
    case Errc::kUnsupported:
      note(message);
      return kExitRefused;
    default:
      note(message);
      return kExitError;
  }
}

// The control socket of the process that has `volume` open as primary
// (libpmirror), or the exit code after saying why there is none.
struct Located {
  std::string path;
  int exit_code = kExitOk;
  pid_t pid = 0;  // the process whose socket `path` is
};

Located find_primary(const Global& global, const std::string& volume) {
  std::chrono::milliseconds timeout(global.timeout_ms);
  const json request = {{"command", "status"}};
  bool permission = false, other = false;
  std::vector<std::string> primaries;  // volumes open as primary, for the message
  auto sockets = control::list_initiator_sockets(global.runtime_dir);
  if (!sockets.ok()) {
    note(sockets.status().message());
    return {{}, sockets.status().code() == Errc::kPermissionDenied ? kExitPermission : kExitError};
  }
  size_t answered = 0;
  for (const control::InitiatorSocket& socket : *sockets) {
    auto status = control::request(socket.path, request, timeout);
    if (!status.ok()) {
      if (is_stale(status.status()) || status.status().code() == Errc::kInvalidArgument) continue;
      note(status.status().message());
      (status.status().code() == Errc::kPermissionDenied ? permission : other) = true;
      continue;
    }
    ++answered;
    if (control::has_primary_volume(*status, volume)) return {socket.path, kExitOk, socket.pid};
    for (const std::string& name : control::volume_names(control::merge_status({*status}))) {
      if (control::has_primary_volume(*status, name)) primaries.push_back(name);
    }
  }
  if (permission) return {{}, kExitPermission};
  if (other) return {{}, kExitError};
  // pmirrord may hold the volume as a replica: then this is the wrong node.
  auto daemon = control::request(global.socket, request, timeout);
  bool replica_here = false;
  if (daemon.ok()) {
    for (const std::string& name : control::volume_names(control::merge_status({*daemon}))) {
      replica_here = replica_here || name == volume;
    }
  }
  if (replica_here) {
    note("volume '" + volume +
         "' is not open as primary on this node: pmirrord here holds a copy of it; run this "
         "on the node where the application has it open");
    return {{}, kExitUsage};
  }
  if (answered == 0 && !daemon.ok()) {
    note(
        "no process on this node has a volume open through libpmirror (no live initiator-PID.sock "
        "in " +
        global.runtime_dir + ")");
    return {{}, kExitNotRunning};
  }
  std::string known;
  for (const std::string& name : primaries) known += (known.empty() ? "" : ", ") + name;
  note("no process on this node has volume '" + volume +
       "' open as primary; open as primary here: " + (known.empty() ? "none" : known));
  return {{}, kExitUsage};
}

// The peer's resync counters before the resync is asked for, so that
// --wait tells the one it started from any earlier one.
struct ResyncCounters {
  uint64_t resyncs = 0;
  uint64_t resynced_bytes = 0;
};
ResyncCounters resync_counters(const json& peer) {
  if (!peer.is_object()) return {};
  // A member that is not an unsigned number counts as 0 (json's value()
  // would throw on another type).
  auto count = [&](const char* key) {
    const json field = peer.value(key, json());
    return field.is_number_unsigned() ? field.get<uint64_t>() : uint64_t{0};
  };
  return {count("resyncs"), count("resynced_bytes")};
}
ResyncCounters resync_counters(const Global& global, const std::string& path,
                               const std::string& volume, const std::string& peer) {
  auto status =
      control::request(path, {{"command", "status"}}, std::chrono::milliseconds(global.timeout_ms));
  if (!status.ok()) return {};
  return resync_counters(control::find_peer(*status, volume, peer));
}

// Follows a resync in the primary's status until the replica is in sync
// (exit 0) or goes away (exit 5). On a terminal one line is rewritten in
// place; otherwise a line per tenth of the copy, so that a log stays short;
// with --json nothing (stdout holds the one JSON reply), the exit code says.
int wait_for_resync(const Global& global, const std::string& path, const std::string& volume,
                    const std::string& peer, ResyncCounters before, bool quiet) {
  using Clock = std::chrono::steady_clock;
  const bool terminal = !quiet && ::isatty(STDOUT_FILENO) == 1;
  const auto started = Clock::now();
  uint64_t last_tenth = 0;
  bool line_open = false;  // a terminal line without its newline yet
  std::chrono::milliseconds timeout(global.timeout_ms);
  for (;;) {
    auto status = control::request(path, {{"command", "status"}}, timeout);
    if (!status.ok()) {
      if (line_open) std::printf("\n");
      note("lost the primary's process while waiting: " + status.status().message());
      return kExitError;
    }
    json p = control::find_peer(*status, volume, peer);
    if (!p.is_object()) {
      if (line_open) std::printf("\n");
      note("volume '" + volume + "' or its replica '" + peer +
           "' is no longer open in that process");
      return kExitError;
    }
    control::ResyncObservation seen = control::observe_resync(volume, p, before.resyncs);
    if (seen.outcome != control::ResyncOutcome::kRunning) {
      if (line_open) std::printf("\n");
      if (seen.outcome == control::ResyncOutcome::kStopped) {
        note(seen.line);
        return kExitError;
      }
      double seconds = std::chrono::duration<double>(Clock::now() - started).count();
      uint64_t after = resync_counters(p).resynced_bytes;
      uint64_t copied = after > before.resynced_bytes ? after - before.resynced_bytes : 0;
      if (quiet) return kExitOk;
      std::printf("%s: copied %s in %.1f s\n", seen.line.c_str(),
                  control::format_amount(copied).c_str(), seconds);
      return kExitOk;
    }
    if (terminal) {
      std::printf("\r\033[K%s", seen.line.c_str());
      line_open = true;
    } else if (!quiet && seen.total_bytes > 0) {
      uint64_t tenth = seen.done_bytes * 10 / seen.total_bytes;
      if (tenth > last_tenth) {
        last_tenth = tenth;
        std::printf("%s\n", seen.line.c_str());
      }
    }
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(terminal ? 250 : 500));
  }
}

int run_resync(const Global& global, const std::string& volume, const std::string& peer, bool full,
               bool wait, bool as_json) {
  Located primary = find_primary(global, volume);
  if (primary.exit_code != kExitOk) return primary.exit_code;
  const ResyncCounters before =
      wait ? resync_counters(global, primary.path, volume, peer) : ResyncCounters{};
  json request = {{"command", "resync"}, {"volume", volume}, {"peer", peer}, {"full", full}};
  auto result =
      control::request(primary.path, request, std::chrono::milliseconds(global.timeout_ms));
  if (!result.ok()) return command_failed(result.status());
  if (as_json) {
    print_json(*result);
  } else {
    std::string line = control::format_resync_human(*result);
    // With --wait the progress follows, not the advice to follow it.
    if (wait) line = line.substr(0, line.find("; follow it with"));
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
  if (!wait) return kExitOk;
  return wait_for_resync(global, primary.path, volume, peer, before, as_json);
}

// Whether process `pid` runs under pmirror-run (its preload library is
// mapped): false when its maps cannot be read (another user's process).
bool runs_under_pmirror_run(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libpmirror-preload") != std::string::npos) return true;
  }
  return false;
}

int run_verify(const Global& global, const std::string& volume, const std::string& peer,
               bool mark_dirty, bool as_json) {
  Located primary = find_primary(global, volume);
  if (primary.exit_code != kExitOk) return primary.exit_code;
  json request = {{"command", "verify"}, {"volume", volume}, {"mark_dirty", mark_dirty}};
  if (!peer.empty()) request["peer"] = peer;
  int timeout_ms = global.timeout_given ? global.timeout_ms : kVerifyTimeoutMs;
  // The verify's reply comes at its end; meanwhile its progress, from the
  // process's status on a second connection (answered beside the verify):
  // one line rewritten on a terminal, a line per tenth otherwise.
  std::promise<pmirror::Result<json>> reply;
  std::future<pmirror::Result<json>> replied = reply.get_future();
  std::thread requester([&] {
    reply.set_value(control::request(primary.path, request, std::chrono::milliseconds(timeout_ms)));
  });
  const bool terminal = !as_json && ::isatty(STDOUT_FILENO) == 1;
  std::map<std::string, uint64_t> tenths;  // per replica, for the plain lines
  bool line_open = false;
  while (!as_json && replied.wait_for(std::chrono::milliseconds(terminal ? 250 : 500)) !=
                         std::future_status::ready) {
    auto status = control::request(primary.path, {{"command", "status"}},
                                   std::chrono::milliseconds(global.timeout_ms));
    if (!status.ok()) continue;  // the verify's own reply says what went wrong
    std::string shown;
    for (const auto& [name, done, total] : control::verify_progress(*status, volume)) {
      std::string line = control::format_verify_progress(volume, name, done, total);
      if (terminal) {
        shown += (shown.empty() ? "" : "; ") + line;
      } else if (total > 0 && done * 10 / total > tenths[name]) {
        tenths[name] = done * 10 / total;
        std::printf("%s\n", line.c_str());
      }
    }
    if (terminal && !shown.empty()) {
      std::printf("\r\033[K%s", shown.c_str());
      line_open = true;
    }
    std::fflush(stdout);
  }
  requester.join();
  if (line_open) std::printf("\r\033[K");
  auto result = replied.get();
  if (!result.ok()) return command_failed(result.status());
  if (as_json) {
    print_json(*result);
  } else {
    std::fputs(control::format_verify_human(*result).c_str(), stdout);
    // Under pmirror-run, differences are expected while the program has its
    // pool open: the pool library writes bytes it never persists, which
    // pmirror-run mirrors only when the program closes the pool.
    if (control::verify_mismatches(*result) > 0 && runs_under_pmirror_run(primary.pid)) {
      std::printf(
          "note: %s is written by a program under pmirror-run (pid %d): while that program has "
          "its pool open, chunks where its pool library keeps bytes it writes and never persists "
          "may differ (libpmemobj: the chunk at 0x0, free chunks' footers); pmirror-run mirrors "
          "them when the program closes its pool: a chunk listed after that differs for another "
          "reason (pmirror-run(1))\n",
          volume.c_str(), static_cast<int>(primary.pid));
    }
  }
  if (control::verify_mismatches(*result) > 0) return kExitMismatch;
  if (control::verify_failures(*result) > 0) return kExitError;
  return kExitOk;
}

// Whether pmirrord answers on its socket: kExitOk, else the exit code for
// why not, said on stderr.
int daemon_unreachable(const Global& global) {
  pmirror::Status live =
      control::probe(global.socket, std::chrono::milliseconds(global.timeout_ms));
  if (live.ok()) return kExitOk;
  note(live.message());
  if (live.code() == Errc::kPermissionDenied) return kExitPermission;
  if (is_stale(live)) return kExitNotRunning;
  return kExitError;
}

// promote / demote / down / up, to pmirrord; `format` makes the human line.
int run_daemon_command(const Global& global, const json& request, bool as_json,
                       std::string (*format)(const json&)) {
  std::chrono::milliseconds timeout(global.timeout_given ? global.timeout_ms : kRoleTimeoutMs);
  if (int down = daemon_unreachable(global); down != kExitOk) return down;
  auto result = control::request(global.socket, request, timeout);
  if (!result.ok()) return command_failed(result.status());
  if (as_json) {
    print_json(*result);
  } else {
    std::printf("%s\n", format(*result).c_str());
  }
  return kExitOk;
}

// disconnect / connect, to the primary's libpmirror (found as resync finds it).
int run_connect(const Global& global, const std::string& volume, const std::string& peer,
                bool connect, bool as_json) {
  Located primary = find_primary(global, volume);
  if (primary.exit_code != kExitOk) return primary.exit_code;
  json request = {{"command", connect ? "connect" : "disconnect"}, {"volume", volume}};
  if (!peer.empty()) request["peer"] = peer;
  auto result =
      control::request(primary.path, request, std::chrono::milliseconds(global.timeout_ms));
  if (!result.ok()) return command_failed(result.status());
  if (as_json) {
    print_json(*result);
  } else {
    std::fputs(control::format_connect_human(*result).c_str(), stdout);
  }
  return kExitOk;
}

// "v2, v3" or "none".
std::string names_or_none(const json& names) {
  std::string out;
  if (names.is_array()) {
    for (const json& name : names) {
      if (name.is_string()) out += (out.empty() ? "" : ", ") + name.get<std::string>();
    }
  }
  return out.empty() ? "none" : out;
}

// reload [--dry-run]: pmirrord reads its cluster file again. A rejection
// is exit code 2 with pmirrord's reasons, so that `systemctl reload` fails.
int run_reload(const Global& global, bool dry_run, bool as_json) {
  std::chrono::milliseconds timeout(global.timeout_given ? global.timeout_ms : kRoleTimeoutMs);
  if (int down = daemon_unreachable(global); down != kExitOk) return down;
  auto result =
      control::request(global.socket, {{"command", "reload"}, {"dry_run", dry_run}}, timeout);
  if (!result.ok()) {
    // pmirrord's own answer (a config error, a volume it cannot open) is a
    // rejection; not getting one is the usual failure.
    const Errc code = result.status().code();
    if (code == Errc::kTimeout || code == Errc::kConnectionError || code == Errc::kClosed ||
        code == Errc::kProtocolError || code == Errc::kPermissionDenied ||
        result.status().message().rfind("unknown command", 0) == 0) {
      return command_failed(result.status());
    }
    note(std::string(dry_run ? "a reload would be rejected" : "reload rejected") +
         ", the running configuration stays: " + result.status().message());
    return kExitConfig;
  }
  if (as_json) {
    print_json(*result);
  } else if (dry_run) {
    std::printf(
        "a reload would add %s; change %s; remove %s\n", names_or_none((*result)["added"]).c_str(),
        names_or_none((*result)["changed"]).c_str(), names_or_none((*result)["removed"]).c_str());
  } else {
    std::printf(
        "reloaded: added %s; changed %s; removed %s\n", names_or_none((*result)["added"]).c_str(),
        names_or_none((*result)["changed"]).c_str(), names_or_none((*result)["removed"]).c_str());
  }
  return kExitOk;
}

// What a cluster resource agent (ocf:pmirror:pmirror) must know before it
// manages a volume: that the file names the volume, that this node holds a
// copy of it, and that the file hands failover to the engine in charge.
std::vector<std::string> check_expectations(const std::string& file, const std::string& node,
                                            const std::string& volume, const std::string& engine) {
  std::vector<std::string> problems;
  auto cluster = pmirror::config::load_cluster_config(file);
  if (!cluster.ok()) return {cluster.status().message()};
  if (!volume.empty()) {
    const auto* found = cluster->find_volume(volume);
    if (found == nullptr) {
      problems.push_back(file + ": no volume '" + volume + "' in the file");
    } else if (!node.empty() && found->paths.count(node) == 0) {
      problems.push_back(file + ": node '" + node + "' holds no copy of volume '" + volume +
                         "' (it is neither its primary nor one of its replicas)");
    }
  }
  if (!engine.empty()) {
    using pmirror::config::FailoverEngine;
    const FailoverEngine actual = cluster->failover.engine;
    const std::string actual_name = actual == FailoverEngine::kEtcd        ? "etcd"
                                    : actual == FailoverEngine::kPacemaker ? "pacemaker"
                                                                           : "none";
    if (actual_name != engine) {
      problems.push_back(
          file + ": failover.engine is " + actual_name + ", not " + engine +
          (engine == "pacemaker"
               ? ": with Pacemaker deciding, set `failover: {engine: pacemaker}` "
                 "so that no pmirror-promoter competes with it (pmirror-cluster.yaml(5))"
               : ""));
    }
  }
  return problems;
}

int run_config_check(const std::string& file, const std::string& node, const std::string& volume,
                     const std::string& engine) {
  std::vector<std::string> warnings;
  std::vector<std::string> problems = pmirror::config::check_cluster_file(file, node, &warnings);
  for (const std::string& warning : warnings) std::fprintf(stderr, "%s\n", warning.c_str());
  if (problems.empty()) problems = check_expectations(file, node, volume, engine);
  if (problems.empty()) {
    std::printf("%s: OK\n", file.c_str());
    return kExitOk;
  }
  for (const std::string& problem : problems) std::fprintf(stderr, "%s\n", problem.c_str());
  std::fprintf(stderr, "%s: %zu problem(s)\n", file.c_str(), problems.size());
  return kExitConfig;
}

// ---- config show: the effective configuration, defaults applied ------

// A YAML scalar: plain when safe, else double-quoted (JSON's quoting is YAML's).
std::string yaml_scalar(const std::string& text) {
  bool plain = !text.empty() && text.find_first_of("-?:,[]{}#&*!|>'\"%@` ") != 0;
  for (char c : text) {
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) != 0 ||
                      std::string_view("._/@:+-").find(c) != std::string_view::npos);
  }
  if (plain && text.find(": ") == std::string::npos) return text;
  return json(text).dump();
}

std::string yaml_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const auto& item : items) out += (out.size() > 1 ? ", " : "") + yaml_scalar(item);
  return out + "]";
}

std::string milliseconds(std::chrono::milliseconds value) {
  return std::to_string(value.count()) + "ms";
}

// Bytes as a number, with the amount in words beside it.
std::string bytes_value(uint64_t bytes) {
  return std::to_string(bytes) + "  # " + control::format_amount(bytes);
}

// The settings a node's pmirrord runs with (its overrides of `daemon:` applied).
void print_node_settings(std::string& out, const pmirror::config::NodeConfig& node,
                         const char* indent) {
  const pmirror::config::DaemonSettings& d = node.daemon;
  auto line = [&](const std::string& key, const std::string& value) {
    out += std::string(indent) + key + ": " + value + "\n";
  };
  line("address", yaml_scalar(node.address));
  line("port", std::to_string(node.port));
  line("transport", std::string(pmirror::transport::kind_name(node.transport)));
  line("listen", yaml_scalar(node.listen.empty() ? node.address : node.listen));
  line("control_socket", yaml_scalar(d.control_socket));
  line("state_pool", yaml_scalar(d.state_pool));
  line("log_level", yaml_scalar(d.log_level));
  line("metrics", d.metrics ? yaml_scalar(d.metrics->to_string()) : "none  # no endpoint");
  line("lease_dir", yaml_scalar(d.lease_dir));
  line("heartbeat_interval", milliseconds(d.heartbeat_interval));
  line("heartbeat_timeout", milliseconds(d.heartbeat_timeout));
  line("reconnect_initial", milliseconds(d.reconnect_initial));
  line("reconnect_max", milliseconds(d.reconnect_max));
  line("handshake_timeout", milliseconds(d.handshake_timeout));
  line("max_unauthenticated", std::to_string(d.max_unauthenticated));
  line("max_unauthenticated_per_source", std::to_string(d.max_unauthenticated_per_source));
}

// One volume as its nodes run it; `node` empty: every node's path.
void print_volume_settings(std::string& out, const pmirror::config::ClusterVolume& v,
                           const std::string& node) {
  using pmirror::config::ApmPolicy;
  using pmirror::config::InsufficientPolicy;
  using pmirror::config::SplitBrainPolicy;
  auto line = [&](const std::string& key, const std::string& value) {
    out += "    " + key + ": " + value + "\n";
  };
  out += "  - name: " + yaml_scalar(v.name) + "\n";
  line("size", bytes_value(v.size));
  line("primary", yaml_scalar(v.primary));
  line("replicas", yaml_list(v.replicas));
  const uint32_t ack = v.ack == 0 ? static_cast<uint32_t>(v.replicas.size()) : v.ack;
  line("ack", std::to_string(ack));
  line("on_insufficient", v.on_insufficient == InsufficientPolicy::kBlock ? "block" : "fail");
  auto per_node = [&](const char* key, const std::map<std::string, std::string>& values) {
    if (!node.empty()) {
      auto it = values.find(node);
      if (it != values.end()) line(key, yaml_scalar(it->second));
      return;
    }
    out += std::string("    ") + key + ":\n";
    for (const auto& [name, value] : values) {
      out += "      " + yaml_scalar(name) + ": " + yaml_scalar(value) + "\n";
    }
  };
  per_node("path", v.paths);
  per_node("metadata", v.metadata_paths);
  line("create", v.create ? "true" : "false");
  line("allowed_peers", yaml_list(v.allowed_peers));
  // Never the secret itself: where it comes from.
  line("secret", v.secret_file.empty() ? "\"<given inline in the file; not shown>\""
                                       : json("<secret from " + v.secret_file + ">").dump());
  line("apm", v.apm == ApmPolicy::kOn ? "on" : v.apm == ApmPolicy::kOff ? "off" : "auto");
  line("native_persistence",
       v.native_persistence == pmirror::config::NativePersistence::kFlush ? "flush"
       : v.native_persistence == pmirror::config::NativePersistence::kOff ? "off"
                                                                          : "auto");
  line("poll", std::string(pmirror::transport::poll_mode_name(v.poll)));
  line("chunk", bytes_value(v.chunk));
  line("resync_rate", v.resync_rate == 0 ? "unlimited"
                                         : std::to_string(v.resync_rate) + "  # " +
                                               control::format_amount(v.resync_rate) + "/s");
  line("after_split_brain",
       v.after_split_brain == SplitBrainPolicy::kOverwriteReplica ? "overwrite_replica" : "refuse");
  if (!v.failover.hook_unit.empty())
    line("failover", "{hook_unit: " + yaml_scalar(v.failover.hook_unit) + "}");
  if (!v.failover.start_command.empty()) {
    line("failover", "{start_command: " + json(v.failover.start_command).dump() +
                         ", stop_command: " + json(v.failover.stop_command).dump() + "}");
  }
}

int run_config_show(const std::string& file, const std::string& node_asked,
                    const std::string& volume) {
  auto cluster = pmirror::config::load_cluster_config(file);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().message().c_str());
    return kExitConfig;
  }
  // As pmirrord picks its node: --node, else the host name; neither: the
  // whole cluster, every node.
  std::string node;
  if (!node_asked.empty()) {
    auto resolved = pmirror::config::resolve_node(*cluster, node_asked);
    if (!resolved.ok()) {
      note(resolved.status().message());
      return kExitUsage;
    }
    node = *resolved;
  } else if (auto here = pmirror::config::resolve_node(*cluster, {}); here.ok()) {
    node = *here;
  }
  if (!volume.empty() && cluster->find_volume(volume) == nullptr) {
    std::string known;
    for (const auto& v : cluster->volumes) known += (known.empty() ? "" : ", ") + v.name;
    note("no volume '" + volume + "' in " + file +
         "; volumes: " + (known.empty() ? "none" : known));
    return kExitUsage;
  }
  std::string out = "# " + file + ": the configuration " +
                    (node.empty() ? std::string("of every node") : "node " + node + " runs with") +
                    ", defaults applied (pmirror-cluster.yaml(5))\n";
  if (!cluster->name.empty()) out += "cluster: {name: " + yaml_scalar(cluster->name) + "}\n";
  if (volume.empty()) {
    if (!node.empty()) {
      out += "node:\n  name: " + yaml_scalar(node) + "\n";
      print_node_settings(out, *cluster->find_node(node), "  ");
    } else {
      out += "nodes:\n";
      for (const auto& n : cluster->nodes) {
        out += "  - name: " + yaml_scalar(n.name) + "\n";
        print_node_settings(out, n, "    ");
      }
    }
    const auto& f = cluster->failover;
    out += "failover:\n  engine: ";
    out += f.engine == pmirror::config::FailoverEngine::kEtcd        ? "etcd\n"
           : f.engine == pmirror::config::FailoverEngine::kPacemaker ? "pacemaker\n"
                                                                     : "none\n";
    if (f.engine == pmirror::config::FailoverEngine::kEtcd) {
      out += "  etcd:\n    endpoints: " + yaml_list(f.etcd.endpoints) + "\n";
      out += "    prefix: " + yaml_scalar(f.etcd.prefix) + "\n";
      out += "    ttl: " + milliseconds(f.etcd.ttl) + "\n";
      out += "    renew: " + milliseconds(f.etcd.renew) + "\n";
      out += "    timeout: " + milliseconds(f.etcd.timeout) + "\n";
      out += "    margin: " + milliseconds(f.etcd.margin) + "\n";
    }
  }
  out += "volumes:\n";
  size_t shown = 0;
  for (const auto& v : cluster->volumes) {
    if (!volume.empty() && v.name != volume) continue;
    if (!node.empty() && v.paths.count(node) == 0) continue;  // no copy on this node
    print_volume_settings(out, v, node);
    ++shown;
  }
  if (shown == 0)
    out += "  []  # none" + (node.empty() ? "" : " with a copy on node " + node) + "\n";
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

// For bash completion (completion/pmirrorctl.bash): the volume or node
// names of a cluster file, one per line. Quiet on a file it cannot load, so
// that a broken file never spills onto the command line being typed.
int run_complete(const std::string& what, const std::string& file) {
  auto cluster = pmirror::config::load_cluster_config(file);
  if (!cluster.ok()) return kExitConfig;
  if (what == "volumes") {
    for (const auto& volume : cluster->volumes) std::printf("%s\n", volume.name.c_str());
  } else {
    for (const auto& node : cluster->nodes) std::printf("%s\n", node.name.c_str());
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "pmirrorctl: shows what pmirror does on this node, resyncs, verifies, promotes, takes "
      "volumes down and replicas away and back; checks and shows cluster files"};
  app.require_subcommand(1);
  app.set_version_flag("-V,--version", "pmirrorctl " PMIRROR_VERSION_STRING);
  Global global;
  app.add_option("--socket", global.socket,
                 "pmirrord's control socket (default: RUNTIME_DIR/pmirrord.sock)");
  app.add_option("--runtime-dir", global.runtime_dir,
                 "where control sockets live (default: $PMIRROR_RUNTIME_DIR, else /run/pmirror)");
  app.add_option("--timeout", global.timeout_ms,
                 "milliseconds to wait for each process (unless given: verify 600000, "
                 "promote/demote 30000)")
      ->check(CLI::Range(1, 86400000))
      ->capture_default_str();

  std::optional<std::string> volume;
  bool as_json = false;
  auto* status = app.add_subcommand(
      "status", "every volume this node serves or writes, its peers, lag and latency");
  status->add_option("VOLUME", volume, "only this volume");
  status->add_flag("--json", as_json, "the stable JSON form (/usr/share/doc/pmirrord/control.md)");

  bool events_json = false;
  uint64_t count = 0;
  auto* events =
      app.add_subcommand("events", "print state changes as they happen, until interrupted");
  events->add_flag("--json", events_json, "one JSON object per line, as the processes send them");
  events->add_option("--count", count,
                     "exit after this many changes (0: never; the current state does not count)");
  bool events_now = false;
  events->add_flag("--now", events_now, "print the current state and exit");

  auto* config = app.add_subcommand("config", "configuration files");
  config->require_subcommand(1);
  std::string config_file, node;
  auto* check = config->add_subcommand("check", "validate a cluster file (exit code 2 if invalid)");
  check->add_option("FILE", config_file, "the cluster file")->required();
  check->add_option("--node", node, "check as this node (default: the one matching the host name)");
  std::string check_volume, check_engine;
  check->add_option("--volume", check_volume,
                    "also require this volume in the file (and, with --node, a copy of it there)");
  check->add_option("--engine", check_engine, "also require failover.engine to be this one")
      ->check(CLI::IsMember({"none", "etcd", "pacemaker"}));

  std::string show_file = pmirror::kDefaultClusterFile, show_node, show_volume;
  auto* show = config->add_subcommand(
      "show", "print the configuration a node runs with, defaults applied (no secret)");
  show->add_option("FILE", show_file, "the cluster file")->capture_default_str();
  show->add_option("--node", show_node,
                   "as this node runs it (default: the one matching the host name, else every "
                   "node)");
  show->add_option("--volume", show_volume, "only this volume");

  std::string command_volume, peer;
  bool full = false, mark_dirty = false, force = false, command_json = false;
  auto* resync = app.add_subcommand(
      "resync", "copy a replica's dirty chunks (or with --full everything) to it now");
  resync->add_option("VOLUME", command_volume, "a volume open as primary on this node")->required();
  resync->add_option("--peer", peer, "the replica's node name")->required();
  resync->add_flag("--full", full, "copy the whole volume, not only the dirty chunks");
  resync->add_flag("--json", command_json,
                   "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");
  bool wait = false;
  resync->add_flag("--wait", wait,
                   "follow the resync's progress and return once the replica is in sync "
                   "(exit code 5 if it goes away first)");

  auto* verify = app.add_subcommand(
      "verify", "compare the primary's copy with the replicas (exit code 6 if they differ)");
  verify->add_option("VOLUME", command_volume, "a volume open as primary on this node")->required();
  verify->add_option("--peer", peer, "only this replica (default: every connected one)");
  verify->add_flag("--mark-dirty", mark_dirty,
                   "mark mismatching chunks dirty, so that a resync copies them");
  verify->add_flag("--json", command_json,
                   "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");

  auto* promote = app.add_subcommand("promote",
                                     "make this node's copy of a volume the primary one and fence "
                                     "the other copies against the old primary (asks pmirrord)");
  promote->add_option("VOLUME", command_volume, "a volume pmirrord holds on this node")->required();
  promote->add_flag("--force", force,
                    "even while the old primary is connected, or the copy is inconsistent");
  promote->add_flag("--json", command_json,
                    "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");

  auto* demote = app.add_subcommand("demote", "make this node's copy a replica again");
  demote->add_option("VOLUME", command_volume, "a volume pmirrord holds on this node")->required();
  demote->add_flag("--json", command_json,
                   "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");

  auto* disconnect = app.add_subcommand(
      "disconnect",
      "end the session to a replica and keep it disconnected until `connect` (its writes are "
      "recorded dirty)");
  disconnect->add_option("VOLUME", command_volume, "a volume open as primary on this node")
      ->required();
  disconnect->add_option("--peer", peer, "only this replica (default: every one)");
  disconnect->add_flag("--json", command_json,
                       "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");
  auto* connect = app.add_subcommand(
      "connect", "reconnect a replica that `disconnect` held; a resync brings it up to date");
  connect->add_option("VOLUME", command_volume, "a volume open as primary on this node")
      ->required();
  connect->add_option("--peer", peer, "only this replica (default: every one)");
  connect->add_flag("--json", command_json,
                    "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");

  auto* down = app.add_subcommand(
      "down",
      "stop serving one volume on this node's pmirrord until `up` or its restart: its sessions "
      "end, new ones are refused");
  down->add_option("VOLUME", command_volume, "a volume pmirrord holds on this node")->required();
  down->add_flag("--json", command_json,
                 "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");
  auto* up = app.add_subcommand("up", "serve a volume that `down` stopped again");
  up->add_option("VOLUME", command_volume, "a volume pmirrord holds on this node")->required();
  up->add_flag("--json", command_json,
               "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");

  bool dry_run = false;
  auto* reload = app.add_subcommand(
      "reload", "make pmirrord read its cluster file again (exit code 2 if it refuses)");
  reload->add_flag("--dry-run", dry_run, "only say what a reload would add, change and remove");
  reload->add_flag("--json", command_json,
                   "print the reply as JSON (/usr/share/doc/pmirrord/control.md)");

  // Hidden (no group): what the bash completion asks for.
  std::string complete_what, complete_file = pmirror::kDefaultClusterFile;
  auto* complete = app.add_subcommand("__complete", "")->group("");
  complete->add_option("WHAT", complete_what)
      ->required()
      ->check(CLI::IsMember({"volumes", "nodes"}));
  complete->add_option("--config", complete_file);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  global.timeout_given = app.count("--timeout") > 0;
  if (global.runtime_dir.empty()) global.runtime_dir = control::runtime_dir();
  if (global.socket.empty()) global.socket = control::daemon_socket_path(global.runtime_dir);

  if (complete->parsed()) return run_complete(complete_what, complete_file);
  if (status->parsed()) return run_status(global, volume, as_json);
  if (events->parsed()) {
    if (events_now) return run_events_now(global, events_json);
    return EventStream(global, events_json, count).run();
  }
  if (check->parsed()) return run_config_check(config_file, node, check_volume, check_engine);
  if (show->parsed()) return run_config_show(show_file, show_node, show_volume);
  if (resync->parsed()) return run_resync(global, command_volume, peer, full, wait, command_json);
  if (verify->parsed()) return run_verify(global, command_volume, peer, mark_dirty, command_json);
  if (promote->parsed()) {
    return run_daemon_command(
        global, {{"command", "promote"}, {"volume", command_volume}, {"force", force}},
        command_json, control::format_promote_human);
  }
  if (reload->parsed()) return run_reload(global, dry_run, command_json);
  if (disconnect->parsed() || connect->parsed()) {
    return run_connect(global, command_volume, peer, connect->parsed(), command_json);
  }
  if (down->parsed() || up->parsed()) {
    return run_daemon_command(
        global, {{"command", down->parsed() ? "down" : "up"}, {"volume", command_volume}},
        command_json, control::format_down_human);
  }
  if (demote->parsed()) {
    return run_daemon_command(global, {{"command", "demote"}, {"volume", command_volume}},
                              command_json, control::format_promote_human);
  }
  return kExitUsage;
}
