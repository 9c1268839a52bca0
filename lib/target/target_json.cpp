// The target's control edge: its typed status and command results as the
// JSON objects of docs/control.md. pmirrord answers the control socket with
// them and builds its metrics from them; the target itself never speaks
// JSON.
#include <string>

#include "common/rfc3339.h"
#include "common/version.h"
#include "protocol/protocol.h"
#include "target/target.h"
#include "target/target_internal.h"

namespace pmirror::target {
namespace {

using json = nlohmann::json;

json copy_json(const CopyStatus& copy) {
  if (copy.in_use_by_local_primary) return {{"in_use_by_local_primary", true}};
  if (!copy.info) return {{"error", copy.error}};
  const metadata::CopyInfo& info = *copy.info;
  json history = json::array();
  for (uint64_t g : info.generations.history) {
    if (g != 0) history.push_back(hex16(g));
  }
  json out = {{"uuid", metadata::uuid_to_string(info.uuid)},
              {"generation", hex16(info.generations.current)},
              {"history", std::move(history)},
              {"consistent", info.consistent},
              {"promoted", info.promoted},
              {"clean", info.clean}};
  if (info.fence.generation != 0) {
    // Which primary this copy takes writes from since a promotion elsewhere.
    out["fence"] = {{"generation", hex16(info.fence.generation)},
                    {"promoted_on", info.fence.node},
                    {"since", format_rfc3339(std::chrono::system_clock::time_point(
                                  std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                      std::chrono::nanoseconds(info.fence.since_unix_ns))))}};
  }
  return out;
}

// Each other node's fence: {"node","fenced","sessions_ended","attempts"}
// or {"node","fenced":false,"error","pending","attempts"} (pending: still
// retried in the background).
json fences_json(const std::vector<FenceOutcome>& outcomes) {
  json fences = json::array();
  for (const FenceOutcome& f : outcomes) {
    json entry = {{"node", f.node}, {"fenced", f.fenced}, {"attempts", f.attempts}};
    if (f.fenced) {
      entry["sessions_ended"] = f.sessions_ended;
    } else {
      entry["error"] = f.error;
      entry["pending"] = f.pending;
    }
    fences.push_back(std::move(entry));
  }
  return fences;
}

// Whether a session in `state` still serves its writer.
bool live(supervisor::PeerState state) {
  using supervisor::PeerState;
  return state == PeerState::kConnecting || state == PeerState::kHandshaking ||
         state == PeerState::kSyncing || state == PeerState::kConnected ||
         state == PeerState::kLagging;
}

// A writer by its identity, its address (a new port at every connection)
// beside it. The few newest sessions that ended stay listed, "ended", with
// `since` the time they ended.
json session_json(const SessionStatus& session) {
  return {{"name", session.peer.substr(0, session.peer.find('@'))},
          {"address", session.peer.substr(session.peer.find('@') + 1)},
          {"ended", !live(session.state)},
          {"transport", session.transport},
          {"state", supervisor::state_name(session.state)},
          {"since", format_rfc3339(session.since)},
          {"reason", session.reason},
          {"acknowledged_sequence", session.acknowledged_sequence},
          // A replica's own view has no lag: the primary measures it.
          {"lag", 0},
          {"persists", session.persists},
          {"bytes", session.bytes},
          {"errors", session.errors}};
}

json volume_json(const VolumeStatus& v) {
  json volume;
  volume["name"] = v.name;
  volume["role"] = "replica";
  volume["size"] = v.size;
  volume["path"] = v.path;
  volume["backing"] = v.backing;
  if (!v.failure.empty()) {
    volume["state"] = "failed";
    volume["error"] = v.failure;
  } else {
    volume["state"] = "ok";
  }
  if (v.down_by_operator) volume["down"] = true;
  volume["generation"] = v.generation;
  volume["last_sequence"] = v.last_sequence;
  if (!v.fences.empty()) {
    // The last promotion here: the fence state of every other node's copy.
    volume["fences"] = fences_json(v.fences);
    volume["fences_at"] = format_rfc3339(v.fences_at);
  }
  volume["applied_sequence"] = v.applied_sequence;
  json methods = json::array();
  if ((v.methods & protocol::kMethodApm) != 0) methods.push_back("apm");
  if ((v.methods & protocol::kMethodGpspm) != 0) methods.push_back("gpspm");
  if ((v.methods & protocol::kMethodPlacementOrder) != 0) methods.push_back("placement-order");
  volume["methods"] = std::move(methods);
  json peers = json::array();
  for (const auto& session : v.sessions) peers.push_back(session_json(session));
  volume["peers"] = std::move(peers);
  volume["copy"] = copy_json(v.copy);
  return volume;
}

}  // namespace

json to_json(const TargetStatus& status) {
  json volumes = json::array();
  for (const auto& v : status.volumes) volumes.push_back(volume_json(v));
  const AdmissionStatus& a = status.admission;
  return {{"schema_version", 1},
          {"process",
           {{"kind", "pmirrord"},
            {"pid", status.pid},
            {"node", status.node},
            {"started_at", format_rfc3339(status.started_at)},
            {"version", PMIRROR_VERSION_STRING}}},
          {"volumes", std::move(volumes)},
          {"admission",
           {{"unauthenticated", a.unauthenticated},
            {"evicted", a.evicted},
            {"timed_out", a.timed_out},
            {"dropped", a.dropped},
            {"refused", a.refused},
            {"authentication_failures", a.authentication_failures},
            {"max_unauthenticated", a.max_unauthenticated},
            {"max_unauthenticated_per_source", a.max_unauthenticated_per_source},
            {"handshake_timeout_ms", a.handshake_timeout.count()}}}};
}

json to_json(const PromoteResult& result) {
  return {{"volume", result.volume},
          {"node", result.node},
          {"generation", hex16(result.generation)},
          {"previous", hex16(result.previous)},
          {"promoted", true},
          {"forced", result.forced},
          {"already_promoted", result.already_promoted},
          {"fences", fences_json(result.fences)}};
}

json to_json(const DemoteResult& result) {
  return {{"volume", result.volume},
          {"node", result.node},
          {"promoted", false},
          {"generation", hex16(result.generation)}};
}

json to_json(const DownResult& result) {
  return {{"volume", result.volume},
          {"node", result.node},
          {"down", result.down},
          {"changed", result.changed},
          {"sessions_ended", result.sessions_ended}};
}

json to_json(const ReloadResult& result) {
  return {{"dry_run", result.dry_run},
          {"added", result.added},
          {"changed", result.changed},
          {"removed", result.removed}};
}

}  // namespace pmirror::target
