// The etcd promoter (failover.h; docs/failover.md, section 2).
//
// One thread, one loop: renew the node's lease, then for every volume of
// this node look at its leader key and act. Every decision is taken from
// what etcd and the local pmirrord say at that moment; nothing is cached
// across rounds but what this node holds, so a promoter that restarts
// picks up where the cluster is.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "common/log.h"
#include "common/rfc3339.h"
#include "control/control.h"
#include "failover/application.h"
#include "failover/etcd_client.h"
#include "failover/failover.h"
#include "failover/lease_file.h"

namespace pmirror::failover {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// pmirrord answers status and promote (promote fences the other nodes, 15 s
// at most each, in parallel).
constexpr milliseconds kStatusTimeout{5000};
constexpr milliseconds kPromoteTimeout{40000};
// How long a takeover's promotion waits for the fences' first answers: a
// live node's fence lands in milliseconds; one that has not by then is
// retried by pmirrord in the background and shown pending.
constexpr milliseconds kFenceWait{100};
// A copy's generation in pmirrord's status when it never received data.
constexpr const char* kNoGeneration = "0000000000000000";

int64_t unix_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t monotonic_ns(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

std::string str(const json& object, const char* key) {
  if (!object.is_object()) return {};
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool is_zero_generation(const std::string& generation) {
  return generation.empty() || generation.find_first_not_of('0') == std::string::npos;
}

// One copy's generations as its promoter publishes them.
struct CopyRecord {
  std::string generation;            // hex, as the status shows it
  std::vector<std::string> history;  // previous generations, newest first
  uint64_t sequence = 0;             // the last persist it recorded (a replica's last_sequence)
  bool consistent = false;
  bool primary = false;  // the application has it open as primary here

  json to_json() const {
    return {{"generation", generation},
            {"history", history},
            {"sequence", sequence},
            {"consistent", consistent},
            {"primary", primary}};
  }
  static CopyRecord from_json(const json& j) {
    CopyRecord r;
    r.generation = str(j, "generation");
    if (j.is_object() && j.contains("history") && j["history"].is_array()) {
      for (const auto& g : j["history"]) {
        if (g.is_string()) r.history.push_back(g.get<std::string>());
      }
    }
    r.consistent = j.is_object() && j.value("consistent", false);
    if (j.is_object() && j.contains("sequence") && j["sequence"].is_number_unsigned()) {
      r.sequence = j["sequence"].get<uint64_t>();
    }
    r.primary = j.is_object() && j.value("primary", false);
    return r;
  }
  // True if `generation` is this copy's or one it moved on from.
  bool knows(const std::string& g) const {
    return g == generation || std::find(history.begin(), history.end(), g) != history.end();
  }
};

}  // namespace

VolumeKeys volume_keys(const config::EtcdSettings& etcd, const std::string& cluster,
                       const std::string& volume) {
  std::string base = etcd.prefix + "/" + cluster + "/volumes/" + volume + "/";
  return {.leader = base + "leader",
          .last_generation = base + "last_generation",
          .copies = base + "copies/"};
}

struct Promoter::Impl {
  PromoterOptions options;
  config::EtcdSettings etcd_settings;
  std::unique_ptr<EtcdClient> etcd;
  // The lease keeper's own client (an EtcdClient serves one thread).
  std::unique_ptr<EtcdClient> keeper_etcd;
  std::string socket;       // pmirrord's
  std::string runtime_dir;  // where the application's sockets are

  // The node's lease, kept by its own thread (keep_lease): however long a
  // round of the volumes takes (a hundred volumes' status, promotions that
  // wait for fences, hooks that wait for a unit), renewals go on every
  // `renew`. lease_mutex guards these fields and every volume's `held`
  // and lease file publication.
  std::mutex lease_mutex;
  std::string
      lease_lost;  // set by the keeper: why the lease is gone; the loop gives the volumes up
  int64_t lost_lease_id = 0;  // the lease to revoke once they are given up
  int64_t lease_id = 0;
  Clock::time_point last_renew_sent{};
  Clock::time_point deadline{};  // the primary stops writing at it
  std::string lease_error;       // why the last renewal failed, for status
  uint64_t renewals = 0;         // keep-alives etcd answered (status, metrics)
  uint64_t renewal_failures = 0;  // keep-alives that failed or came too late

  struct Volume {
    const config::ClusterVolume* config = nullptr;
    VolumeKeys keys;
    std::vector<std::string> nodes;  // the volume's nodes: primary first
    std::string path;  // this node's copy
    std::unique_ptr<LeaseFileWriter> lease_file;
    bool held = false;
    Clock::time_point held_since{};
    std::optional<Clock::time_point> absent_since;
    std::string holder;             // the node seen holding the key
    int64_t since_unix_ms = 0;      // since when (the key's since_unix_ms)
    std::string refused;            // why this node did not take over
    std::string published_copy;     // the copy record last put in etcd
    std::string published_last;     // the last generation last put in etcd
    int64_t copy_record_lease = 0;  // the lease the copy record is attached to
    bool demote_pending = false;    // promoted here, another node holds it now
    uint64_t takeovers = 0;         // times this node took the volume
    uint64_t losses = 0;            // times this node lost or gave it up
    std::unique_ptr<ApplicationHook> application;
    uint64_t application_ends = 0;  // times the application ended while held
    std::string application_ended;  // why, the last time
    // After its application ended, this node lets the others take the
    // volume first (it takes it back after this, if nobody did).
    std::optional<Clock::time_point> hold_off_until;
  };
  std::vector<Volume> volumes;
  // What pmirrord and the node's applications said, read once per round of
  // the volumes (not once per volume: a status names every volume, and
  // pmirrord reads each copy's metadata for it).
  std::optional<Result<json>> round_daemon_status;
  // Every key of the cluster's volumes, read with one range per round (a
  // read per volume made a round of a hundred volumes last seconds).
  std::string volumes_prefix;  // <prefix>/<cluster>/volumes/
  std::optional<Result<std::map<std::string, EtcdKeyValue>>> round_keys;
  std::optional<std::vector<json>> round_application_statuses;
  mutable std::mutex status_mutex;
  json last_status;

  // An event for `pmirrorctl events` (docs/control.md): lease-acquired,
  // lease-lost, lease-released, promoted, demoted, primary-changed, application-ended.
  void emit(const Volume& v, const char* event, const std::string& message) const {
    if (!options.on_event) return;
    options.on_event({{"time", format_rfc3339(std::chrono::system_clock::now())},
                      {"process", "pmirror-promoter"},
                      {"node", options.node},
                      {"volume", v.config->name},
                      {"event", event},
                      {"message", message}});
  }

  // ---- etcd, as read this round ----------------------------------------------

  const Result<std::map<std::string, EtcdKeyValue>>& keys_this_round() {
    if (!round_keys) {
      auto all = etcd->get_prefix(volumes_prefix);
      if (!all.ok()) {
        round_keys = all.status();
      } else {
        std::map<std::string, EtcdKeyValue> by_key;
        for (auto& kv : *all) by_key.emplace(kv.key, std::move(kv));
        round_keys = std::move(by_key);
      }
    }
    return *round_keys;
  }

  Result<std::optional<EtcdKeyValue>> key_now(const std::string& key) {
    const auto& keys = keys_this_round();
    if (!keys.ok()) return keys.status();
    auto it = keys->find(key);
    if (it == keys->end()) return std::optional<EtcdKeyValue>();
    return std::optional<EtcdKeyValue>(it->second);
  }

  Result<std::vector<EtcdKeyValue>> keys_under(const std::string& prefix) {
    const auto& keys = keys_this_round();
    if (!keys.ok()) return keys.status();
    std::vector<EtcdKeyValue> out;
    for (auto it = keys->lower_bound(prefix); it != keys->end() && it->first.rfind(prefix, 0) == 0;
         ++it) {
      out.push_back(it->second);
    }
    return out;
  }

  // ---- pmirrord and the application --------------------------------------

  // This node's copy of `volume` as pmirrord and (if open here) the
  // application see it.
  Result<CopyRecord> local_copy(const Volume& v) {
    if (!round_daemon_status) {
      round_daemon_status = control::request(socket, {{"command", "status"}}, kStatusTimeout);
    }
    PMIRROR_ASSIGN_OR_RETURN(json status, *round_daemon_status);
    const json* entry = nullptr;
    if (status.contains("volumes") && status["volumes"].is_array()) {
      for (const auto& candidate : status["volumes"]) {
        if (str(candidate, "name") == v.config->name) entry = &candidate;
      }
    }
    if (entry == nullptr) {
      return Status(Errc::kNotFound, "pmirrord on node " + options.node +
                                         " does not serve volume '" + v.config->name + "'");
    }
    const json copy = entry->contains("copy") ? (*entry)["copy"] : json();
    if (copy.is_object() && copy.value("in_use_by_local_primary", false)) {
      // The application has it open here: its own status says the generation.
      CopyRecord record;
      record.consistent = true;
      record.primary = true;
      record.generation = application_generation(v);
      return record;
    }
    if (!copy.is_object() || copy.contains("error")) {
      return Status(Errc::kFailedPrecondition, "pmirrord cannot read the copy's metadata: " +
                                                   (copy.is_object() ? str(copy, "error") : ""));
    }
    CopyRecord record = CopyRecord::from_json(copy);
    if (entry->contains("last_sequence") && (*entry)["last_sequence"].is_number_unsigned()) {
      record.sequence = (*entry)["last_sequence"].get<uint64_t>();
    }
    return record;
  }

  // The generation the application on this node writes `v` at; empty when
  // no application here has it open as primary.
  std::string application_generation(const Volume& v) {
    if (!round_application_statuses) {
      round_application_statuses.emplace();
      auto sockets = control::list_initiator_sockets(runtime_dir);
      if (sockets.ok()) {
        for (const auto& s : *sockets) {
          auto status = control::request(s.path, {{"command", "status"}}, milliseconds(1000));
          if (status.ok()) round_application_statuses->push_back(std::move(*status));
        }
      }
    }
    for (const json& status : *round_application_statuses) {
      if (!status.contains("volumes") || !status["volumes"].is_array()) continue;
      for (const auto& entry : status["volumes"]) {
        // Several nodes' applications may share a runtime directory (tests
        // on one machine): this node's is the one writing this node's copy.
        if (str(entry, "name") == v.config->name && str(entry, "role") == "primary" &&
            str(entry, "path") == v.path) {
          return str(entry, "generation");
        }
      }
    }
    return {};
  }

  Status promote(const Volume& v, bool force) {
    // The takeover does not wait for the node it replaces (a frozen one
    // answers nothing until heartbeat_timeout): the lease already stopped
    // the old primary's writes; fences not answered by then are retried by
    // pmirrord in the background (docs/failover.md, section 1).
    auto result = control::request(socket,
                                   {{"command", "promote"},
                                    {"volume", v.config->name},
                                    {"force", force},
                                    {"fence_wait_ms", kFenceWait.count()}},
                                   kPromoteTimeout);
    if (!result.ok()) return result.status();
    std::string fences;
    if (result->contains("fences") && (*result)["fences"].is_array()) {
      for (const auto& f : (*result)["fences"]) {
        fences += " " + str(f, "node") +
                  (f.value("fenced", false)    ? ":fenced"
                   : f.value("pending", false) ? ":pending"
                                               : ":NOT-fenced");
      }
    }
    log::warn("volume {}: promoted on node {} (generation {}); fences:{}", v.config->name,
              options.node, str(*result, "generation"), fences.empty() ? " none" : fences);
    emit(v, "promoted",
         "promoted on node " + options.node + " at generation " + str(*result, "generation") +
             (force ? " (forced: the old primary was still connected)" : "") +
             "; fences:" + (fences.empty() ? " none" : fences));
    return Status::Ok();
  }

  void demote(Volume& v) {
    auto result = control::request(socket, {{"command", "demote"}, {"volume", v.config->name}},
                                   kStatusTimeout);
    if (result.ok()) {
      v.demote_pending = false;
      log::info("volume {}: demoted on node {}: a replica of {}", v.config->name, options.node,
                v.holder);
      emit(v, "demoted", "demoted on node " + options.node + ": a replica of node " + v.holder);
    }
  }

  std::map<std::string, std::string> hook_env(const Volume& v) const {
    return {{"PMIRROR_VOLUME", v.config->name},
            {"PMIRROR_NODE", options.node},
            {"PMIRROR_CLUSTER", options.cluster.name},
            {"PMIRROR_CLUSTER_FILE", options.cluster.source},
            {"PMIRROR_PATH", v.path}};
  }

  // Starts the application (ApplicationHook: a unit, or start_command as
  // the promoter's watched child). Its failure is logged: the lease is held
  // all the same (a start that failed at once is found by the next watch).
  void start_hook(Volume& v) {
    if (!v.application->configured()) return;
    Status s = v.application->start();
    if (!s.ok()) {
      log::error("volume {}: could not start the application: {}", v.config->name, s.message());
    } else {
      log::info("volume {}: started the application ({}{})", v.config->name,
                v.application->describe(),
                v.application->pid() > 0 ? ", pid " + std::to_string(v.application->pid())
                                         : std::string());
    }
  }
  void stop_hook(Volume& v) {
    if (v.application->configured()) v.application->stop();
  }

  // How long a node whose application ended leaves the volume to the
  // others: every standby's turn (live rank x renew) fits in a ttl.
  std::chrono::milliseconds hold_off() const { return etcd_settings.ttl; }

  // The application of a volume this node holds ended (or its unit is no
  // longer active): the volume is given up at once -- lease file withdrawn,
  // leader key deleted -- so that a standby takes over now instead of a
  // primary without an application holding it forever.
  void watch_application(Volume& v) {
    if (!v.application->configured()) return;
    {
      std::lock_guard lock(lease_mutex);
      if (!v.held) return;
    }
    auto ended = v.application->gone();
    if (!ended) return;
    int64_t lease = 0;
    {
      std::lock_guard lock(lease_mutex);
      if (!v.held) return;
      v.held = false;
      ++v.losses;
      v.lease_file->withdraw();
      lease = lease_id;
    }
    ++v.application_ends;
    v.application_ended = *ended;
    v.hold_off_until = Clock::now() + hold_off();
    log::error(
        "volume {}: {}; node {} gives the volume up (another node may take it over; this "
        "one not within {} s)",
        v.config->name, *ended, options.node, hold_off().count() / 1000);
    emit(v, "application-ended", *ended + "; node " + options.node + " gave the volume up");
    v.application->stop();  // what the unit or the command's group left
    if (lease != 0) (void)etcd->delete_if_held(v.keys.leader, lease);
  }

  // ---- the lease ------------------------------------------------------------

  // With lease_mutex held.
  void publish_deadlines() {
    for (auto& v : volumes) {
      if (v.held) v.lease_file->publish(monotonic_ns(deadline), lease_id);
    }
  }

  // This node no longer holds `v`: the application must stop writing at
  // once (its persists fail from here on), then it is stopped.
  void lose(Volume& v, const std::string& why) {
    {
      std::lock_guard lock(lease_mutex);
      if (!v.held) return;
      v.held = false;
      ++v.losses;
      v.lease_file->withdraw();
    }
    log::warn("volume {}: node {} lost the lease: {}; stopping the application", v.config->name,
              options.node, why);
    emit(v, "lease-lost", "node " + options.node + " lost the lease: " + why);
    stop_hook(v);
  }

  // The keeper's round: grants a lease when there is none, renews it every
  // `renew`, and past the deadline withdraws the lease files at once (the
  // applications stop there by themselves too: they read the deadline) and
  // tells the loop, which stops the hooks and revokes the lease.
  void keep_lease_once() {
    int64_t id = 0;
    {
      std::lock_guard lock(lease_mutex);
      if (!lease_lost.empty()) return;  // the loop has yet to give the volumes up
      id = lease_id;
      if (id != 0 && Clock::now() >= deadline) {
        give_up_locked("the lease was not renewed in time (" + lease_error + ")");
        return;
      }
      if (id != 0 && Clock::now() - last_renew_sent < etcd_settings.renew) return;
    }
    const auto sent = Clock::now();
    if (id == 0) {
      auto ttl = std::chrono::duration_cast<std::chrono::seconds>(etcd_settings.ttl);
      auto lease = keeper_etcd->grant_lease(ttl);
      std::lock_guard lock(lease_mutex);
      if (!lease.ok()) {
        lease_error = lease.status().message();
        return;
      }
      lease_id = lease->id;
      last_renew_sent = sent;
      deadline = sent + lease->ttl - etcd_settings.margin;
      lease_error.clear();
      log::info("node {}: etcd lease {:x} granted ({} s) by {}", options.node, lease_id,
                lease->ttl.count(), keeper_etcd->current_endpoint());
      return;
    }
    // The deadline counts from when the renewal was sent: etcd counts its
    // TTL from when it received it, later.
    auto ttl = keeper_etcd->keep_alive(id);
    std::lock_guard lock(lease_mutex);
    if (lease_id != id) return;
    last_renew_sent = sent;
    if (!ttl.ok()) {
      ++renewal_failures;
      lease_error = ttl.status().message();
      log::warn("node {}: renewing the etcd lease failed: {}", options.node, lease_error);
      if (Clock::now() >= deadline) {
        give_up_locked("the lease was not renewed in time (" + lease_error + ")");
      }
      return;
    }
    if (ttl->count() <= 0) {
      ++renewal_failures;
      lease_error = "etcd no longer knows lease " + std::to_string(lease_id) + " (it expired)";
      give_up_locked(lease_error);
      return;
    }
    ++renewals;
    lease_error.clear();
    deadline = sent + *ttl - etcd_settings.margin;
    publish_deadlines();
  }

  // With lease_mutex held: the lease is gone; no application may write
  // under it from now (its lease files are withdrawn); the loop does the
  // rest (give_up_lost_lease).
  void give_up_locked(const std::string& why) {
    for (auto& v : volumes) {
      if (v.held) v.lease_file->withdraw();
    }
    lease_lost = why;
    lost_lease_id = lease_id;
    lease_id = 0;
  }

  void keep_lease(std::stop_token stop) {
    while (!stop.stop_requested()) {
      keep_lease_once();
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  // The loop's part of a lost lease: the volumes it held are given up (the
  // hooks stop the applications) and the old lease is revoked; the keeper
  // then grants a new one.
  void give_up_lost_lease() {
    std::string why;
    int64_t old = 0;
    {
      std::lock_guard lock(lease_mutex);
      if (lease_lost.empty()) return;
      why = lease_lost;
      old = lost_lease_id;
    }
    for (auto& v : volumes) {
      bool was_held = false;
      {
        std::lock_guard lock(lease_mutex);
        was_held = v.held;
      }
      if (!was_held) continue;
      {
        std::lock_guard lock(lease_mutex);
        v.held = false;  // lose() would find it released already
        ++v.losses;
      }
      log::warn("volume {}: node {} lost the lease: {}; stopping the application", v.config->name,
                options.node, why);
      emit(v, "lease-lost", "node " + options.node + " lost the lease: " + why);
      stop_hook(v);
    }
    if (old != 0) (void)etcd->revoke_lease(old);
    std::lock_guard lock(lease_mutex);
    lease_lost.clear();
    lost_lease_id = 0;
  }

  int64_t current_lease() {
    std::lock_guard lock(lease_mutex);
    return lease_id;
  }

  // ---- one volume -------------------------------------------------------------

  // This copy's record in etcd, under the node's lease: what the other
  // nodes compare theirs with before taking over.
  // The sequence only while nobody holds the volume (it is compared only
  // then, and changes with every persist: published all the time it would
  // be a write to etcd per poll, per copy, per volume).
  void publish_copy(Volume& v, CopyRecord record, bool with_sequence) {
    if (!with_sequence) record.sequence = 0;
    std::string value = record.to_json().dump();
    std::string key = v.keys.copies + options.node;
    if (v.copy_record_lease == lease_id && value == v.published_copy) return;
    Result<bool> done = v.copy_record_lease == lease_id
                            ? etcd->update_if_held(key, value, lease_id)
                            : etcd->create_if_absent(key, value, lease_id);
    if (done.ok() && !*done && v.copy_record_lease != lease_id) {
      // A record of this node's previous lease: replace it.
      auto old = etcd->get(key);
      if (old.ok() && *old) (void)etcd->delete_if_held(key, (*old)->lease);
      done = etcd->create_if_absent(key, value, lease_id);
    }
    if (done.ok() && *done) {
      v.published_copy = value;
      v.copy_record_lease = lease_id;
    }
  }

  // Why this node's copy must not become the primary, or empty. It must be
  // consistent, know the generation the last primary announced, and not be
  // behind any copy another live node published: newer (its generation
  // follows this one's) or further in the same generation (a higher
  // sequence: with ack < all, a persist may be on one replica only).
  std::string refusal(Volume& v, const CopyRecord& mine) {
    if (!mine.consistent) {
      return "the copy is inconsistent (a resync into it was interrupted)";
    }
    auto last = key_now(v.keys.last_generation);
    if (!last.ok()) return "etcd: " + last.status().message();
    if (*last && !mine.knows((*last)->value)) {
      return "the last primary wrote generation " + (*last)->value +
             ", which this copy does not have (it was left behind); the copy that has it "
             "should take over (or promote by hand: pmirrorctl promote --force)";
    }
    auto copies = keys_under(v.keys.copies);
    if (!copies.ok()) return "etcd: " + copies.status().message();
    bool others_empty = true;
    for (const auto& kv : *copies) {
      std::string node = kv.key.substr(v.keys.copies.size());
      if (node == options.node) continue;
      CopyRecord other = CopyRecord::from_json(json::parse(kv.value, nullptr, false));
      if (!is_zero_generation(other.generation)) others_empty = false;
      if (other.generation != mine.generation && other.knows(mine.generation)) {
        return "node " + node + "'s copy is newer (generation " + other.generation +
               " follows this copy's " + mine.generation + ")";
      }
      if (other.generation == mine.generation && other.sequence > mine.sequence) {
        return "node " + node + "'s copy has more of generation " + mine.generation +
               " (sequence " + std::to_string(other.sequence) + ", this copy " +
               std::to_string(mine.sequence) + ")";
      }
    }
    if (is_zero_generation(mine.generation)) {
      // A new cluster: the configured primary starts it.
      bool fresh = !*last && others_empty;
      if (!(fresh && v.config->primary == options.node)) return "the copy never received data";
    }
    return {};
  }

  // How many of the nodes ahead of this one in the volume's order have a
  // copy record in etcd this round (one under a live lease).
  size_t live_rank(const Volume& v) {
    size_t rank = 0;
    for (const std::string& node : v.nodes) {
      if (node == options.node) break;
      auto record = key_now(v.keys.copies + node);
      if (!record.ok() || *record) ++rank;  // unknown counts as live: the safe side
    }
    return rank;
  }

  void step(Volume& v) {
    const int64_t lease_id = current_lease();
    auto leader = key_now(v.keys.leader);
    if (!leader.ok()) return;  // etcd unreachable: nothing changes here
    auto copy = local_copy(v);
    if (copy.ok() && lease_id != 0) publish_copy(v, *copy, /*with_sequence=*/!*leader);
    if (*leader) {
      const EtcdKeyValue& kv = **leader;
      if (kv.lease == lease_id && lease_id != 0) {
        v.holder = options.node;
        // The holder announces the generation its application writes at:
        // a standby whose copy does not have it must not take over.
        if (copy.ok() && copy->primary && !is_zero_generation(copy->generation) &&
            copy->generation != v.published_last) {
          if (etcd->put(v.keys.last_generation, copy->generation, 0).ok()) {
            v.published_last = copy->generation;
          }
        }
        return;
      }
      json value = json::parse(kv.value, nullptr, false);
      std::string holder = str(value, "node");
      if (value.is_object() && value.contains("since_unix_ms") &&
          value["since_unix_ms"].is_number_integer()) {
        v.since_unix_ms = value["since_unix_ms"].get<int64_t>();
      }
      lose(v, "node " + holder + " holds it now");
      if (holder != v.holder) {
        v.holder = holder;
        log::info("volume {}: primary is node {}", v.config->name, holder);
        emit(v, "primary-changed", "node " + holder + " holds the lease");
        v.demote_pending = holder != options.node;
      }
      v.absent_since.reset();
      v.refused.clear();
      // A copy promoted here while another node is primary refuses that
      // primary's sessions: a replica again, once its application is gone.
      if (v.demote_pending && copy.ok() && !copy->primary) demote(v);
      return;
    }
    // Nobody holds the volume.
    lose(v, "its leader key was deleted");
    if (lease_id == 0) return;
    auto now = Clock::now();
    if (!v.absent_since) {
      v.absent_since = now;
      v.holder.clear();
      v.since_unix_ms = 0;
      log::info("volume {}: no primary holds the lease", v.config->name);
    }
    if (!copy.ok()) {
      v.refused = copy.status().message();
      return;
    }
    std::string why = copy->primary ? std::string() : refusal(v, *copy);
    if (why != v.refused && !why.empty()) {
      log::warn("volume {}: node {} does not take over: {}", v.config->name, options.node, why);
    }
    v.refused = why;
    if (!why.empty()) return;
    if (v.hold_off_until && now < *v.hold_off_until) {
      const auto left = std::chrono::duration_cast<milliseconds>(*v.hold_off_until - now);
      v.refused = v.application_ended + "; this node leaves the volume to the others for " +
                  std::to_string((left.count() + 999) / 1000) + " s more";
      return;
    }
    v.hold_off_until.reset();
    // Two polls at least, for every node to publish its copy's sequence;
    // equal candidates then go in the file's order (the configured primary
    // first), one renew interval apart, so that they do not race to promote.
    // Only live nodes count: a node ahead of this one whose copy record went
    // with its lease (the dead primary, as a rule) cannot take over, and
    // waiting for it cost every takeover a renew interval.
    if (now - *v.absent_since <
        std::max(2 * poll_interval(), static_cast<int64_t>(live_rank(v)) * etcd_settings.renew)) {
      return;
    }
    const int64_t since = unix_ms();
    json value = {
        {"node", options.node}, {"generation", copy->generation}, {"since_unix_ms", since}};
    auto won = etcd->create_if_absent(v.keys.leader, value.dump(), lease_id);
    if (!won.ok() || !*won) return;
    log::warn("volume {}: node {} took the lease", v.config->name, options.node);
    emit(v, "lease-acquired", "node " + options.node + " took the lease");
    if (!copy->primary) {
      Status promoted = promote_copy(v);
      if (!promoted.ok()) {
        log::error("volume {}: promoting the copy on node {} failed: {}; giving the lease back",
                   v.config->name, options.node, promoted.message());
        (void)etcd->delete_if_held(v.keys.leader, lease_id);
        v.refused = "promote failed: " + promoted.message();
        v.absent_since = now;  // the next candidate goes first
        return;
      }
    }
    {
      std::lock_guard lock(lease_mutex);
      if (this->lease_id != lease_id) {
        // The lease ran out while this node promoted: the key goes with it.
        v.refused = "the lease ran out during the takeover";
        return;
      }
      v.held = true;
      v.lease_file->publish(monotonic_ns(deadline), lease_id);
    }
    ++v.takeovers;
    v.held_since = now;
    v.holder = options.node;
    v.since_unix_ms = since;
    v.absent_since.reset();
    v.demote_pending = false;
    start_hook(v);
  }

  // Every taker promotes its copy, fencing the others -- the configured
  // primary taking its volume back too: its copy may have been another
  // primary's replica since, whose frozen session still holds it and whose
  // other replicas must stop taking that primary's writes. Two cases need
  // no promotion: a new cluster's configured primary (its copy has no data
  // yet and nobody else has written: its application opens it as the file
  // says), and a copy this node's application holds open already (the
  // promoter restarted under it). A writer still connected here (an old
  // primary that lost its lease but kept its connection) is ended: the
  // lease says it may no longer write.
  Status promote_copy(const Volume& v) {
    if (v.config->primary == options.node) {
      auto status = control::request(socket, {{"command", "status"}}, kStatusTimeout);
      if (status.ok() && status->contains("volumes")) {
        for (const auto& entry : (*status)["volumes"]) {
          if (str(entry, "name") != v.config->name) continue;
          const json copy = entry.value("copy", json::object());
          if (copy.value("in_use_by_local_primary", false)) return Status::Ok();
          const bool fresh = str(copy, "generation") == kNoGeneration && !copy.contains("fence");
          if (fresh) return Status::Ok();
        }
      }
    }
    Status s = promote(v, /*force=*/false);
    if (s.code() == Errc::kBusy) s = promote(v, /*force=*/true);
    return s;
  }

  // How often the leader keys are read: standbys notice a lost primary
  // within one poll; the lease itself is renewed every `renew`.
  std::chrono::milliseconds poll_interval() const {
    return std::min(etcd_settings.renew, milliseconds(250));
  }

  void update_status() {
    json out = {{"node", options.node}};
    std::unique_lock lease_lock(lease_mutex);
    if (lease_id != 0) {
      out["lease"] = {{"id", lease_id},
                      {"deadline_in_ms",
                       std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count()},
                      {"error", lease_error}};
    } else {
      out["lease"] = {{"id", 0}, {"error", lease_error}};
    }
    out["lease"]["renewals"] = renewals;
    out["lease"]["renewal_failures"] = renewal_failures;
    json list = json::array();
    for (const auto& v : volumes) {
      list.push_back(
          {{"name", v.config->name},
           {"holder", v.holder},
           {"since", v.since_unix_ms == 0 ? std::string()
                                          : format_rfc3339(std::chrono::system_clock::time_point(
                                                std::chrono::milliseconds(v.since_unix_ms)))},
           {"held", v.held},
           {"refused", v.refused},
           {"takeovers", v.takeovers},
           {"losses", v.losses},
           {"application",
            {{"hook", v.application->configured() ? v.application->describe() : std::string()},
             {"pid", v.application->pid()},
             {"ended", v.application_ends},
             {"last_end", v.application_ended}}}});
    }
    lease_lock.unlock();
    out["volumes"] = std::move(list);
    std::lock_guard lock(status_mutex);
    last_status = std::move(out);
  }
};

Promoter::Promoter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Promoter::~Promoter() = default;

Result<std::unique_ptr<Promoter>> Promoter::create(PromoterOptions options) {
  const config::ClusterConfig& cluster = options.cluster;
  if (cluster.failover.engine != config::FailoverEngine::kEtcd) {
    return Status(Errc::kConfigError, cluster.source +
                                          ": failover.engine is not etcd: pmirror-promoter has "
                                          "nothing to do (pmirror-promoter(8))");
  }
  if (cluster.find_node(options.node) == nullptr) {
    return Status(Errc::kConfigError, "no node '" + options.node + "' in " + cluster.source);
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const config::ClusterConfig& kept = impl->options.cluster;
  const config::EtcdSettings& etcd = kept.failover.etcd;
  const config::NodeConfig* node = kept.find_node(impl->options.node);
  impl->etcd_settings = etcd;
  impl->socket = impl->options.pmirrord_socket.empty() ? node->daemon.control_socket
                                                       : impl->options.pmirrord_socket;
  impl->runtime_dir = control::runtime_dir();
  impl->volumes_prefix = etcd.prefix + "/" + kept.name + "/volumes/";
  const EtcdOptions etcd_options{.endpoints = etcd.endpoints,
                                 .timeout = etcd.timeout,
                                 .tls_ca = etcd.tls_ca,
                                 .tls_cert = etcd.tls_cert,
                                 .tls_key = etcd.tls_key};
  PMIRROR_ASSIGN_OR_RETURN(impl->etcd, EtcdClient::create(etcd_options));
  PMIRROR_ASSIGN_OR_RETURN(impl->keeper_etcd, EtcdClient::create(etcd_options));
  const std::string& me = impl->options.node;
  for (const auto& volume : kept.volumes) {
    std::vector<std::string> nodes{volume.primary};
    nodes.insert(nodes.end(), volume.replicas.begin(), volume.replicas.end());
    auto it = std::find(nodes.begin(), nodes.end(), me);
    if (it == nodes.end()) continue;
    Impl::Volume v;
    v.config = &volume;
    v.keys = volume_keys(etcd, kept.name, volume.name);
    v.nodes = nodes;
    auto path = volume.paths.find(me);
    if (path != volume.paths.end()) v.path = path->second;
    std::string lease_path = node->daemon.lease_dir + "/" + volume.name + ".lease";
    auto file = LeaseFileWriter::create(lease_path, volume.name, me);
    if (!file.ok()) return file.status().with_context("volume " + volume.name);
    v.lease_file = std::make_unique<LeaseFileWriter>(std::move(*file));
    v.application = std::make_unique<ApplicationHook>(volume.failover, impl->hook_env(v));
    impl->volumes.push_back(std::move(v));
  }
  impl->update_status();
  return std::unique_ptr<Promoter>(new Promoter(std::move(impl)));
}

Status Promoter::run(std::stop_token stop) {
  Impl& impl = *impl_;
  log::info("node {}: promoter for {} volume(s), etcd {} (ttl {} ms, renew {} ms)",
            impl.options.node, impl.volumes.size(), impl.etcd_settings.endpoints.front(),
            impl.etcd_settings.ttl.count(), impl.etcd_settings.renew.count());
  const milliseconds poll = impl.poll_interval();
  std::jthread keeper([&impl](std::stop_token keeper_stop) { impl.keep_lease(keeper_stop); });
  while (!stop.stop_requested()) {
    impl.round_daemon_status.reset();
    impl.round_keys.reset();
    impl.round_application_statuses.reset();
    impl.give_up_lost_lease();
    for (auto& v : impl.volumes) {
      if (stop.stop_requested()) break;
      impl.give_up_lost_lease();
      impl.step(v);
      impl.watch_application(v);
    }
    impl.update_status();
    auto until = Clock::now() + poll;
    while (!stop.stop_requested() && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  // Hand over: the application stops, then the keys go with the lease, so
  // that a standby takes over now instead of after ttl.
  keeper.request_stop();
  keeper.join();
  impl.give_up_lost_lease();
  for (auto& v : impl.volumes) {
    {
      std::lock_guard lock(impl.lease_mutex);
      if (!v.held) continue;
      v.lease_file->withdraw();
      v.held = false;
    }
    impl.stop_hook(v);
    impl.emit(v, "lease-released", "node " + impl.options.node + " handed the volume over");
  }
  if (int64_t lease = impl.current_lease(); lease != 0) (void)impl.etcd->revoke_lease(lease);
  impl.update_status();
  log::info("node {}: promoter stopped; its lease revoked", impl.options.node);
  return Status::Ok();
}

json Promoter::status() const {
  std::lock_guard lock(impl_->status_mutex);
  return impl_->last_status;
}

}  // namespace pmirror::failover
