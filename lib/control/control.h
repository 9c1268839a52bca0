// The control socket: how pmirrorctl (and anything else root runs on the
// node) asks pmirrord and every process with a volume open through
// libpmirror what it is doing. docs/control.md is the reference.
//
// A Unix stream socket, mode 0600 (its owner -- root -- only), speaking
// newline-delimited JSON: one request line, one response line,
//
//   -> {"command":"status"}
//   <- {"ok":true,"result":{...}}
//   <- {"ok":false,"error":{"code":"not found","message":"no volume 'x'"}}
//
// and `{"command":"events"}`, after whose response the connection carries
// every published event, one JSON object per line, until either side closes.
//
// Embedding a server (pmirrord, libpmirror):
//
//   auto server = control::Server::start(control::initiator_socket_path(getpid()),
//       [&](const nlohmann::json& request) -> Result<nlohmann::json> {
//         if (request["command"] == "status") return my_status_json();
//         return control::unknown_command(request);
//       });
//   if (!server.ok()) log::warn("{}", server.status().message());
//   ...
//   (*server)->publish({{"time", ...}, {"volume", "db0"}, {"from", ...}, ...});
//
// The Server owns its threads; destroying it stops serving, joins them and
// removes the socket file.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace pmirror::control {

// The version of the status object and of pmirrorctl's merged JSON.
constexpr int kSchemaVersion = 1;
// A request line longer than this is refused and the connection closed.
constexpr size_t kMaxRequestBytes = 64 * 1024;
// A response line longer than this is refused by the client.
constexpr size_t kMaxResponseBytes = 16 * 1024 * 1024;
// Events queued for one subscriber before further ones are dropped (the
// subscriber then receives {"dropped": N} before the next event it gets).
constexpr size_t kSubscriberQueueLimit = 1024;
// Request connections served at once (event subscribers count apart). When
// all are taken, a new connection closes the one that has been waiting the
// longest for a request, so idle clients never lock a fresh request out;
// only when every one is busy is the new one answered with an error.
constexpr size_t kMaxConnections = 64;
// Event subscribers at once; beyond, `events` is refused (kResourceExhausted).
constexpr size_t kMaxSubscribers = 32;
// A connection that sends no complete request line for this long is told so
// and closed; so is one that does not take its response for this long.
constexpr std::chrono::milliseconds kIdleTimeout{5000};

struct ServerOptions {
  std::chrono::milliseconds idle_timeout = kIdleTimeout;
  size_t max_connections = kMaxConnections;
  size_t max_subscribers = kMaxSubscribers;
  // Commands whose handler calls are not serialised with the others: the
  // handler is thread-safe for them. libpmirror lists "status", so that a
  // verify (minutes on a large volume) does not hold `pmirrorctl status` up.
  std::vector<std::string> concurrent_commands;
};

// Where control sockets live: $PMIRROR_RUNTIME_DIR, else /run/pmirror.
std::string runtime_dir();
// pmirrord's socket in `dir`: <dir>/pmirrord.sock.
std::string daemon_socket_path(const std::string& dir = runtime_dir());
// pmirror-promoter's status socket beside pmirrord's: PATH.sock ->
// PATH.promoter.sock (docs/failover.md).
std::string promoter_socket_path(const std::string& daemon_socket);
// A libpmirror process's socket: <dir>/initiator-<pid>.sock.
std::string initiator_socket_path(pid_t pid, const std::string& dir = runtime_dir());

struct InitiatorSocket {
  pid_t pid = 0;
  std::string path;
};
// Every initiator-<pid>.sock in `dir`, sorted by pid. A missing directory is
// an empty list; an unreadable one an error.
Result<std::vector<InitiatorSocket>> list_initiator_sockets(const std::string& dir = runtime_dir());
// Removes `socket` if it is stale: its process has gone (no such pid) and
// nothing listens on it (a process that died without closing its volume).
// true: removed; false: left alone (its process lives, or something
// answers there). Errors: kPermissionDenied, kIoError from unlink.
Result<bool> remove_if_stale(const InitiatorSocket& socket);

// pmirrord's metrics snapshot: its own status object with, appended to its
// "volumes", the volumes that the processes on this node have open as
// primary (each initiator-<pid>.sock in `dir` asked for its status), so that
// one endpoint per node serves both sides (docs/operations.md#metrics).
//
// One owner per application: of the pmirrords sharing `dir` (two nodes of
// a test cluster on one host), the first that finds an application claims
// it (a lock on <dir>/initiator-<pid>.metrics-owner, held while both live)
// and only it exports that application's volumes; another takes over when
// the owner exits. A process that does not answer within `timeout` (or
// has gone) is left out of this snapshot; the daemon's own part is never
// held up beyond that. Thread-safe.
class LocalPrimaries {
 public:
  explicit LocalPrimaries(std::string dir);
  ~LocalPrimaries();
  LocalPrimaries(const LocalPrimaries&) = delete;
  LocalPrimaries& operator=(const LocalPrimaries&) = delete;

  nlohmann::json add_to(nlohmann::json status, std::chrono::milliseconds timeout);

 private:
  bool owns(const InitiatorSocket& socket);  // claims it if nobody has
  // Removes claim files of applications that are gone, held by nobody.
  void sweep_stale_claims(const std::vector<InitiatorSocket>& sockets);

  struct Claim {
    std::string lock_path;
    UniqueFd fd;
  };
  const std::string dir_;
  std::mutex mutex_;
  std::map<std::string, Claim> claims_;  // by the application's socket path
};

// Handles one request (a JSON object with a string "command"; never
// "events", which the Server handles). Calls are serialised by the Server
// (but for ServerOptions::concurrent_commands), so the handler needs no
// locking of its own against other requests.
// An error Status becomes {"ok":false,"error":{"code":errc_name,"message":...}}.
using Handler = std::function<Result<nlohmann::json>(const nlohmann::json& request)>;

// The error a Handler returns for a command it does not know.
Status unknown_command(const nlohmann::json& request);

// What a Server replies to one request line (without its "\n" and a
// trailing "\r"; not blank and not "events", which the Server handles
// itself): the reply line, "\n"-terminated. `handler` is called only for an
// object with a string "command"; anything else, an error Status and an
// exception from the handler become {"ok":false,...}. Pure apart from the
// handler, so that tests and the control fuzzer (tests/fuzz) reach it
// without a socket.
std::string answer_request(const std::string& line, const Handler& handler);

class Server {
 public:
  // Creates the parent directory if missing (0755), replaces a stale socket
  // file, refuses if a live process answers on `socket_path` ("another
  // pmirrord is already running (pid N) on PATH") or if the path exists and
  // is not a socket, binds (mode 0600 before anyone can connect) and starts
  // serving on its own threads.
  static Result<std::unique_ptr<Server>> start(const std::string& socket_path, Handler handler,
                                               const ServerOptions& options = {});
  // Stops accepting, closes every connection, joins the threads, removes
  // the socket file (only if it is still ours).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Sends `event` as one line to every subscriber. Thread-safe, never
  // blocks on a subscriber: each has a bounded queue; on overflow the event
  // is dropped for that subscriber and it is told how many it missed.
  void publish(const nlohmann::json& event);

  const std::string& path() const;
  size_t subscriber_count() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One request, one response. Errors name the socket and what to do:
//   kNotFound          "<name> is not running (no socket at PATH)"
//   kInvalidArgument   "PATH is not a socket"
//   kConnectionError   "stale socket PATH: nothing is listening ..."
//   kPermissionDenied  "permission denied on PATH: run as root"
//   kTimeout           "no answer from PATH within N ms"
// An {"ok":false} reply becomes its Errc (by name) and message.
// <name> is the socket file's name without ".sock" (pmirrord, initiator-42).
Result<nlohmann::json> request(const std::string& socket_path, const nlohmann::json& request,
                               std::chrono::milliseconds timeout = std::chrono::seconds(5));

// Connects and hangs up: Ok if something answers on `socket_path`, else the
// errors of request().
Status probe(const std::string& socket_path,
             std::chrono::milliseconds timeout = std::chrono::seconds(5));

// Subscribes to events and calls `on_event` for each, until it returns
// false (Ok), `stop` is requested (Ok) or the connection ends (kClosed:
// "PATH closed the connection"). Connection errors as request().
// `on_subscribed`, if given, is called once the server has accepted the
// subscription and before the first event is read: what the caller learns
// there (the current state) is older than every event it then receives.
Status subscribe(const std::string& socket_path,
                 const std::function<bool(const nlohmann::json& event)>& on_event,
                 std::stop_token stop = {},
                 std::chrono::milliseconds connect_timeout = std::chrono::seconds(5),
                 const std::function<void()>& on_subscribed = {});

// errc_name() backwards; unknown names are kInternal.
Errc errc_from_name(std::string_view name);

// ---- pmirrorctl's presentation (here so that it can be tested) ----------

// {"schema_version":1,"processes":[status objects...]} keeping, when
// `volume` is set, only that volume (and the processes that have it).
nlohmann::json merge_status(const std::vector<nlohmann::json>& statuses,
                            const std::optional<std::string>& volume = std::nullopt);
// Adds to every volume of `statuses` that the promoter's status
// (pmirror-promoter's {"volumes":[{"name","holder","held","since",
// "refused"}],"lease":{...}}) names a "failover" object: {"holder",
// "held_here", "since", "refused", "etcd_error"}, so that `pmirrorctl
// status` says who holds each volume's lease.
void attach_failover(std::vector<nlohmann::json>& statuses, const nlohmann::json& promoter);
// Sorted, unique names of every volume in a merged status.
std::vector<std::string> volume_names(const nlohmann::json& merged);

struct HumanFormat {
  std::chrono::system_clock::time_point now = std::chrono::system_clock::now();
  bool utc = false;  // print times in UTC instead of local time
};

// drbdadm-status-like text of a merged status: one line per volume, one
// indented line per peer. Unknown or missing fields are left out.
std::string format_status_human(const nlohmann::json& merged,
                                const std::optional<std::string>& volume,
                                const HumanFormat& format = {});
// "16:01:02 db0 node2: connected -> disconnected (nothing heard for 5000 ms)"
// An "exists" event: "16:05:00 db0 node2: exists connected since 16:01:02 (...)".
std::string format_event_human(const nlohmann::json& event, const HumanFormat& format = {});
// The current state of one process's status object as events (as drbdsetup
// events2 starts): per volume {"exists":true,"volume","role"}, then per
// peer {"exists":true,"volume","peer","state","since","reason"}, each with
// "time" (`now`), "process" (its kind) and "node" when known.
std::vector<nlohmann::json> state_events(
    const nlohmann::json& status,
    std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

// 1073741824 -> "1GiB", 1610612736 -> "1.5GiB", 4096 -> "4KiB", 100 -> "100B".
std::string format_size(uint64_t bytes);
// An amount in running text, one decimal: 12582912 -> "12.0 MiB", 100 -> "100 B".
std::string format_amount(uint64_t bytes);
// Seconds left: 1 -> "1s", 125 -> "2m05s", 3720 -> "1h02m", 93600 -> "1d02h".
std::string format_eta(uint64_t seconds);
// A generation identifier as the status shows it: a string as it is (16
// hex digits, "9f3a2b1c4d5e6f70"); an integer below 2^32 (a legacy
// counter) in decimal, a larger one in 16 hex digits; "" otherwise.
std::string format_generation(const nlohmann::json& value);

// ---- pmirrorctl's commands (docs/control.md#commands) -----------------

// True if `status` (one process's status object) has `volume` with role
// "primary": the process resync and verify go to.
bool has_primary_volume(const nlohmann::json& status, const std::string& volume);
// The result of "resync" in one line:
//   "db0: resync of node3 started: 3.2 MiB (52 chunks) to copy"
std::string format_resync_human(const nlohmann::json& result);
// `pmirrorctl resync --wait`: what one peer object of the primary's status
// says of a resync started when that peer's "resyncs" counter read
// `resyncs_before`.
enum class ResyncOutcome {
  kRunning,  // line: "db0 -> node3: 12.0 MiB of 64.0 MiB (18%), 8.0 MiB/s, 6s left"
  kDone,     // the counter moved and no resync runs: "db0: node3 in sync"
  kStopped,  // the replica is gone (any state but connected, syncing and
             // lagging): line says so, and that the resync resumes when it is back
};
struct ResyncObservation {
  ResyncOutcome outcome = ResyncOutcome::kRunning;
  std::string line;
  uint64_t done_bytes = 0;  // kRunning: as the progress says
  uint64_t total_bytes = 0;
};
ResyncObservation observe_resync(const std::string& volume, const nlohmann::json& peer,
                                 uint64_t resyncs_before);
// The peer object named `peer` of `volume` (role primary) in one process's
// status object; null when there is none.
nlohmann::json find_peer(const nlohmann::json& status, const std::string& volume,
                         const std::string& peer);

// The replicas of `volume` (role primary) that a verify is comparing now,
// in one process's status object: (name, done_bytes, total_bytes).
std::vector<std::tuple<std::string, uint64_t, uint64_t>> verify_progress(
    const nlohmann::json& status, const std::string& volume);
// "db0 verify of node3: 12.0 MiB of 64.0 MiB compared (18%)"
std::string format_verify_progress(const std::string& volume, const std::string& peer,
                                   uint64_t done_bytes, uint64_t total_bytes);

// The result of "verify": a line per peer, then at most `max_ranges`
// mismatching ranges each ("... and N more").
std::string format_verify_human(const nlohmann::json& result, size_t max_ranges = 20);
// Mismatching ranges found by a verify, over every peer.
uint64_t verify_mismatches(const nlohmann::json& result);
// Peers a verify could not compare (those with an "error").
uint64_t verify_failures(const nlohmann::json& result);
// The result of "promote" or "demote" in one line:
//   "db1 promoted on node2: generation 9f3a2b1c4d5e6f70 (was 12ab34cd56ef7890)"
std::string format_promote_human(const nlohmann::json& result);
// ---- an operator's switches (operator.cpp; docs/pmirrorctl.md) -------

// The result of "disconnect" or "connect" (a primary's libpmirror), a line
// per replica:
//   "db0: node3 disconnected by an operator; its writes are recorded dirty until
//    `pmirrorctl connect db0 --peer node3`"
std::string format_connect_human(const nlohmann::json& result);
// The result of "down" or "up" (pmirrord) in one line:
//   "db1: down by an operator on node2: its sessions ended (1), new ones are refused; ..."
std::string format_down_human(const nlohmann::json& result);

// Microseconds: 55.2 -> "55us", 1234 -> "1.2ms", 2500000 -> "2.5s".
std::string format_latency_us(double microseconds);

}  // namespace pmirror::control
