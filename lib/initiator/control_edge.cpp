#include "initiator/control_edge.h"

#include <unistd.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>

#include "common/log.h"
#include "common/rfc3339.h"
#include "common/version.h"
#include "control/control.h"
#include "initiator/sync_decision.h"

namespace pmirror::initiator {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------- status

json to_json(const PeerStatus& s) {
  json peer;
  peer["name"] = s.name;
  peer["address"] = s.address;
  peer["transport"] = s.transport;
  peer["state"] = supervisor::state_name(s.connection.state);
  peer["disk"] = disk_state(s);
  if (s.by_operator) peer["by_operator"] = true;
  peer["since"] = format_rfc3339(s.connection.since);
  peer["reason"] = s.connection.reason;
  peer["method"] = s.method;
  peer["acknowledged_sequence"] = s.acknowledged_sequence;
  peer["lag"] = s.lag;
  peer["persists"] = s.persists;
  peer["bytes"] = s.bytes;
  peer["errors"] = s.errors;
  peer["dirty_chunks"] = s.dirty_chunks;
  peer["dirty_bytes"] = s.dirty_bytes;
  if (s.behind_since_generation) {
    peer["behind_since_generation"] = *s.behind_since_generation == 0
                                          ? std::string()
                                          : generation_hex(*s.behind_since_generation);
  }
  peer["generation"] = s.generation == 0 ? std::string() : generation_hex(s.generation);
  peer["resynced_chunks"] = s.resynced_chunks;
  peer["resynced_bytes"] = s.resynced_bytes;
  peer["resyncs"] = s.resyncs;
  if (s.resync) {
    const ResyncProgress& r = *s.resync;
    peer["resync"] = {{"done_bytes", r.done_bytes},
                      {"left_bytes", r.left_bytes},
                      {"total_bytes", r.total_bytes},
                      {"rate_bytes_per_s", r.rate_bytes_per_s},
                      {"eta_seconds", r.eta_seconds ? json(*r.eta_seconds) : json(nullptr)},
                      {"full", r.full}};
  }
  if (s.verify) {
    peer["verify"] = {{"done_bytes", s.verify->done_bytes}, {"total_bytes", s.verify->total_bytes}};
  }
  peer["latency_us"] = {{"p50", s.latency_us.p50},
                        {"p99", s.latency_us.p99},
                        {"p999", s.latency_us.p999},
                        {"count", s.latency_us.count},
                        {"sum", s.latency_us.sum}};
  return peer;
}

json to_json(const VolumeStatus& s) {
  json peers = json::array();
  for (const auto& peer : s.peers) peers.push_back(to_json(peer));
  json volume;
  volume["name"] = s.name;
  volume["role"] = "primary";
  volume["size"] = s.size;
  volume["path"] = s.path;
  volume["backing"] = s.backing;
  volume["metadata"] = s.metadata;
  volume["generation"] = generation_hex(s.generation);
  volume["chunk_size"] = s.chunk_size;
  volume["promoted"] = s.promoted;
  volume["last_sequence"] = s.last_sequence;
  volume["acknowledged_sequence"] = s.acknowledged_sequence;
  volume["ack_required"] = s.ack_required;
  volume["in_sync"] = s.in_sync;
  // No replica configured: every persist is local only (pmirrorctl status
  // says so in words).
  volume["local_only"] = s.peers.empty();
  volume["identity"] = s.identity;
  volume["opened_at"] = format_rfc3339(s.opened_at);
  volume["lease"] = s.lease ? json{{"file", s.lease->file}, {"remaining_ms", s.lease->remaining_ms}}
                            : json(nullptr);
  volume["peers"] = std::move(peers);
  return volume;
}

// -------------------------------------------------------------- commands

json ranges_json(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  json out = json::array();
  for (const auto& [offset, length] : ranges)
    out.push_back({{"offset", offset}, {"length", length}});
  return out;
}

// A volume's resync or verify, as pmirrorctl sends it.
Result<json> volume_command(const std::string& volume, const VolumeControls& controls,
                            const json& request) {
  const std::string command = request.value("command", "");
  std::string peer = request.contains("peer") && request["peer"].is_string()
                         ? request["peer"].get<std::string>()
                         : std::string();
  if (command == "resync") {
    if (peer.empty()) return Status(Errc::kInvalidArgument, "resync needs a \"peer\"");
    PMIRROR_ASSIGN_OR_RETURN(ResyncStarted started,
                             controls.resync(peer, request.value("full", false)));
    return json{{"volume", volume},
                {"peer", started.peer},
                {"started", true},
                {"full", started.full},
                {"dirty_bytes", started.dirty_bytes}};
  }
  if (command == "verify") {
    PMIRROR_ASSIGN_OR_RETURN(auto results,
                             controls.verify(peer, request.value("mark_dirty", false)));
    json peers = json::array();
    for (const auto& result : results) {
      json entry{{"name", result.peer},
                 {"chunks_compared", result.chunks_compared},
                 {"bytes_compared", result.bytes_compared},
                 {"mismatches", ranges_json(result.mismatches)},
                 {"mismatch_count", result.mismatches.size()},
                 {"marked_dirty", result.marked_dirty},
                 {"busy", ranges_json(result.busy)},
                 {"busy_count", result.busy.size()}};
      if (!result.status.ok()) entry["error"] = result.status.message();
      peers.push_back(std::move(entry));
    }
    return json{
        {"volume", volume}, {"chunk_size", controls.chunk_size}, {"peers", std::move(peers)}};
  }
  if (command == "disconnect" || command == "connect") {
    PMIRROR_ASSIGN_OR_RETURN(auto switched, controls.set_connected(peer, command == "connect"));
    json peers = json::array();
    for (const auto& one : switched) {
      peers.push_back({{"name", one.peer}, {"changed", one.changed}});
    }
    return json{{"volume", volume}, {"connected", command == "connect"}, {"peers", peers}};
  }
  return control::unknown_command(request);
}

// ---------------------------------------------------------- the registry

class Registry {
 public:
  static Registry& instance() {
    static Registry registry;  // never destroyed before volumes: they hold registrations
    return registry;
  }

  uint64_t add(std::string name, VolumeControls controls) {
    std::lock_guard lock(mutex_);
    uint64_t id = ++last_id_;
    volumes_.emplace(id, Entry{std::move(name), std::move(controls)});
    if (!server_ && !start_failed_) start_locked();
    return id;
  }

  void remove(uint64_t id) {
    std::unique_ptr<control::Server> stopping;
    {
      // Waits for status calls in progress: once remove() returns, the
      // volume's function is never called again.
      std::unique_lock calls(calls_mutex_);
      std::lock_guard lock(mutex_);
      volumes_.erase(id);
      if (volumes_.empty()) {
        stopping = std::move(server_);
        start_failed_ = false;
      }
    }
    // Destroyed outside the lock: its threads may be calling status().
  }

  void publish(const json& event) {
    std::lock_guard lock(mutex_);
    if (server_) server_->publish(event);
  }

 private:
  void start_locked() {
    // status() and command() take the registry's own locks: status is
    // answered while a verify runs on another connection.
    control::ServerOptions options;
    options.concurrent_commands = {"status"};
    auto server = control::Server::start(
        control::initiator_socket_path(::getpid()),
        [this](const json& request) -> Result<json> {
          if (request.value("command", "") == "status") return status();
          return command(request);
        },
        options);
    if (!server.ok()) {
      // Status is a convenience: the volume works without it.
      log::warn(
          "libpmirror: no control socket, `pmirrorctl status` will not see this "
          "process: {}",
          server.status().message());
      start_failed_ = true;
      return;
    }
    server_ = std::move(server).value();
  }

  // Routes a command to the volume it names.
  Result<json> command(const json& request) {
    const std::string command = request.value("command", "");
    if (command != "resync" && command != "verify" && command != "disconnect" &&
        command != "connect") {
      return control::unknown_command(request);
    }
    if (!request.contains("volume") || !request["volume"].is_string()) {
      return Status(Errc::kInvalidArgument, "'" + command + "' needs a \"volume\" string");
    }
    const std::string volume = request["volume"].get<std::string>();
    std::shared_lock calls(calls_mutex_);
    const VolumeControls* target = nullptr;
    {
      std::lock_guard lock(mutex_);
      for (auto& [id, entry] : volumes_) {
        if (entry.name == volume) target = &entry.controls;
      }
    }
    if (target == nullptr) {
      return Status(Errc::kNotFound,
                    "volume '" + volume + "' is not open in process " + std::to_string(::getpid()));
    }
    // The entry stays while `calls` is held (remove() waits for it).
    return volume_command(volume, *target, request);
  }

  json status() {
    std::shared_lock calls(calls_mutex_);
    std::vector<const VolumeControls*> controls;
    {
      std::lock_guard lock(mutex_);
      for (auto& [id, entry] : volumes_) controls.push_back(&entry.controls);
    }
    json volumes = json::array();
    for (const auto* volume : controls) volumes.push_back(to_json(volume->status()));
    char host[256] = "";
    ::gethostname(host, sizeof host - 1);
    return {{"schema_version", control::kSchemaVersion},
            {"process",
             {{"kind", "initiator"},
              {"pid", ::getpid()},
              {"node", host},
              {"version", PMIRROR_VERSION_STRING}}},
            {"volumes", std::move(volumes)}};
  }

  std::shared_mutex calls_mutex_;  // held shared while volumes' status functions run
  std::mutex mutex_;
  uint64_t last_id_ = 0;
  struct Entry {
    std::string name;
    VolumeControls controls;
  };
  std::map<uint64_t, Entry> volumes_;
  std::unique_ptr<control::Server> server_;
  bool start_failed_ = false;
};

}  // namespace

std::string_view disk_state(const PeerStatus& peer) {
  using supervisor::PeerState;
  const PeerState state = peer.connection.state;
  // Mixed data: a resync into it is under way or was cut short, or it
  // never received the volume at all.
  if (state == PeerState::kSyncing || peer.resync || peer.full_sync_pending || peer.never_seen) {
    return "Inconsistent";
  }
  // Whole and consistent, but missing writes the primary recorded for it.
  if (peer.dirty_chunks > 0 || state == PeerState::kLagging) return "Outdated";
  if (state == PeerState::kConnected) return "UpToDate";
  // Not connected and nothing recorded against it: it was up to date when
  // last seen, but what it holds now cannot be seen from here.
  return "Unknown";
}

StatusRegistration::~StatusRegistration() {
  if (id_ != 0) Registry::instance().remove(id_);
}

StatusRegistration& StatusRegistration::operator=(StatusRegistration&& other) noexcept {
  if (this != &other) {
    if (id_ != 0) Registry::instance().remove(id_);
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

StatusRegistration register_volume(std::string name, VolumeControls controls) {
  return StatusRegistration(Registry::instance().add(std::move(name), std::move(controls)));
}

std::string status_json(const VolumeStatus& status) {
  // A peer's text (an ErrorReply) that is not UTF-8 must not break status.
  return to_json(status).dump(-1, ' ', false, json::error_handler_t::replace);
}

void publish_event(const supervisor::StateChange& change) {
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  Registry::instance().publish({{"time", format_rfc3339(change.time)},
                                {"process", "initiator"},
                                {"node", host},
                                {"pid", ::getpid()},
                                {"volume", change.volume},
                                {"peer", change.peer},
                                {"from", supervisor::state_name(change.from)},
                                {"to", supervisor::state_name(change.to)},
                                {"reason", change.reason}});
}

}  // namespace pmirror::initiator
