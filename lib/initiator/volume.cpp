#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "initiator/initiator.h"
#include "initiator/replica.h"
#include "initiator/status_registry.h"
#include "config/config.h"
#include "region/region.h"
#include "supervisor/supervisor.h"

namespace pmirror::initiator {

using Clock = std::chrono::steady_clock;
using supervisor::PeerState;

namespace {

// A replica as the volume's supervisor sees it: the live session (if any),
// its connection state, and what it has done.
struct Slot {
  Slot(const VolumeOptions& options, const ReplicaSpec& replica_spec,
       supervisor::EventSink sink)
      : spec(replica_spec),
        label(replica_spec.node.empty()
                  ? replica_spec.address + ":" + std::to_string(replica_spec.port)
                  : replica_spec.node),
        state(options.name, label, PeerState::kConnecting, std::move(sink)),
        backoff(options.reconnect_initial, options.reconnect_max) {}

  ReplicaSpec spec;
  std::string label;
  std::unique_ptr<Replica> replica;  // null while disconnected
  supervisor::PeerStateMachine state;
  supervisor::Backoff backoff;
  Clock::time_point next_attempt{};
  bool in_sync = false;  // counts towards the ack policy
  uint64_t resync_cursor = 0;
  uint64_t resynced_bytes = 0;
  supervisor::LatencyWindow latency;
  uint64_t persists = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
};

bool is_refusal(Errc code) {
  return code == Errc::kPermissionDenied || code == Errc::kNotFound || code == Errc::kBusy ||
         code == Errc::kInvalidArgument || code == Errc::kUnsupported;
}

}  // namespace

class Volume::Impl {
 public:
  VolumeOptions options;
  std::unique_ptr<region::Region> local;
  std::vector<std::unique_ptr<Slot>> slots;  // the vector is fixed after open; contents: mutex

  mutable std::mutex mutex;
  uint64_t next_sequence = 1;    // guarded by mutex
  uint64_t last_completed = 0;   // every persist up to here is durable on `ack` replicas
  std::deque<std::pair<uint64_t, Clock::time_point>> started;  // for latency; guarded by mutex
  Clock::time_point last_activity = Clock::now();
  std::chrono::system_clock::time_point opened_at = std::chrono::system_clock::now();

  std::mutex supervisor_mutex;
  std::condition_variable supervisor_wake;
  bool stopping = false;  // guarded by supervisor_mutex
  std::thread supervisor_thread;
  StatusRegistration registration;

  uint32_t required_acks() const {
    return options.ack == 0 ? static_cast<uint32_t>(slots.size()) : options.ack;
  }

  Status check_range(uint64_t offset, uint64_t length) const {
    if (offset > local->size() || length > local->size() - offset) {
      return Status(Errc::kInvalidArgument,
                    "range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                        ") is outside volume '" + options.name + "' of " +
                        std::to_string(local->size()) + " bytes");
    }
    return Status::Ok();
  }

  // The replica failed: forget its session, reconnect later. Mutex held.
  void drop(Slot& slot, const Status& why) {
    ++slot.errors;
    slot.replica.reset();
    slot.in_sync = false;
    slot.next_attempt = Clock::now() + slot.backoff.next();
    slot.state.transition(PeerState::kDisconnected, why.message());
  }

  // Waits (mutex held) until `sequence` is durable on enough replicas.
  Status wait_locked(uint64_t sequence) {
    if (sequence <= last_completed) return Status::Ok();
    if (sequence >= next_sequence) {
      return Status(Errc::kInvalidArgument,
                    "sequence " + std::to_string(sequence) + " was never started");
    }
    Clock::time_point start_time = Clock::now();
    while (!started.empty() && started.front().first < sequence) started.pop_front();
    if (!started.empty() && started.front().first == sequence) start_time = started.front().second;

    uint32_t acknowledged = 0;
    std::string problems;
    for (auto& slot : slots) {
      if (!slot->replica || !slot->in_sync) {
        if (!problems.empty()) problems += "; ";
        auto snapshot = slot->state.snapshot();
        problems += "replica " + slot->label + " is " +
                    std::string(supervisor::state_name(snapshot.state)) +
                    (snapshot.reason.empty() ? "" : " (" + snapshot.reason + ")");
        continue;
      }
      Status waited = slot->replica->wait_for(sequence);
      if (!waited.ok()) {
        if (!problems.empty()) problems += "; ";
        problems += waited.message();
        drop(*slot, waited);
        continue;
      }
      ++acknowledged;
      ++slot->persists;
      slot->latency.add(
          std::chrono::duration<double, std::micro>(Clock::now() - start_time).count());
    }
    last_activity = Clock::now();
    if (acknowledged < required_acks()) {
      return Status(Errc::kConnectionError,
                    "persist " + std::to_string(sequence) + " of volume '" + options.name +
                        "' is durable on " + std::to_string(acknowledged) + " of the " +
                        std::to_string(required_acks()) + " replicas required: " + problems);
    }
    last_completed = sequence;
    return Status::Ok();
  }

  Result<uint64_t> start_locked(uint64_t offset, uint64_t length) {
    // Keep at most max_in_flight persists outstanding.
    if (next_sequence - 1 - last_completed >= options.max_in_flight) {
      PMIRROR_RETURN_IF_ERROR(wait_locked(next_sequence - options.max_in_flight));
    }
    uint64_t sequence = next_sequence++;
    started.emplace_back(sequence, Clock::now());
    // Replicas being brought up to date get the persist too, so that they
    // do not fall further behind; only in-sync ones are waited for.
    for (auto& slot : slots) {
      if (!slot->replica) continue;
      Status posted = slot->replica->post_persist(sequence, offset, length);
      if (posted.ok()) {
        slot->bytes += length;
      } else {
        drop(*slot, posted);
      }
    }
    // The local copy is persisted while the replicas work.
    Status local_persist = local->persist(offset, length);
    last_activity = Clock::now();
    if (!local_persist.ok()) return local_persist.with_context("local copy");
    return sequence;
  }

  // One supervisor pass: reconnect, resync a step, heartbeat.
  void supervise() {
    for (auto& slot_ptr : slots) {
      Slot& slot = *slot_ptr;
      bool needs_connect = false;
      {
        std::lock_guard lock(mutex);
        needs_connect = !slot.replica && Clock::now() >= slot.next_attempt;
      }
      if (needs_connect) reconnect(slot);

      std::unique_lock lock(mutex);
      if (slot.replica && !slot.in_sync) {
        resync_step(slot);
      } else if (slot.replica && Clock::now() - last_activity >= options.heartbeat_interval) {
        if (Status alive = slot.replica->heartbeat(); !alive.ok()) drop(slot, alive);
      }
    }
    std::lock_guard lock(mutex);
    if (Clock::now() - last_activity >= options.heartbeat_interval) last_activity = Clock::now();
  }

  void reconnect(Slot& slot) {
    slot.state.transition(PeerState::kConnecting,
                          "reconnect attempt " + std::to_string(slot.backoff.attempts()));
    // Connecting can take seconds: never with the mutex held.
    auto replica = Replica::connect({options, slot.spec, local->data(), local->size()});
    std::lock_guard lock(mutex);
    if (!replica.ok()) {
      slot.next_attempt = Clock::now() + slot.backoff.next();
      slot.state.transition(is_refusal(replica.status().code()) ? PeerState::kRefused
                                                                : PeerState::kDisconnected,
                            replica.status().message());
      return;
    }
    slot.replica = std::move(replica).value();
    slot.resync_cursor = 0;
    slot.resynced_bytes = 0;
    slot.state.transition(PeerState::kSyncing,
                          "reconnected; copying the volume to bring it up to date");
  }

  // Copies the next step of the volume to a reconnected replica. Without a
  // record of what it missed, the whole volume is copied. Mutex held.
  void resync_step(Slot& slot) {
    uint64_t length = std::min(options.resync_step, local->size() - slot.resync_cursor);
    Status copied = slot.replica->resync_range(slot.resync_cursor, length);
    if (!copied.ok()) {
      drop(slot, copied);
      return;
    }
    slot.resync_cursor += length;
    slot.resynced_bytes += length;
    if (slot.resync_cursor == local->size()) {
      slot.in_sync = true;
      slot.backoff.reset();
      slot.state.transition(PeerState::kConnected, "in sync after copying " +
                                                       std::to_string(slot.resynced_bytes) +
                                                       " bytes");
    }
  }

  void supervisor_loop() {
    std::unique_lock wake_lock(supervisor_mutex);
    while (!stopping) {
      supervisor_wake.wait_for(wake_lock, std::chrono::milliseconds(50));
      if (stopping) break;
      wake_lock.unlock();
      supervise();
      wake_lock.lock();
    }
  }

  nlohmann::json status() const {
    std::lock_guard lock(mutex);
    nlohmann::json peers = nlohmann::json::array();
    for (const auto& slot : slots) {
      auto snapshot = slot->state.snapshot();
      nlohmann::json peer;
      peer["name"] = slot->label;
      peer["address"] = slot->spec.address + ":" + std::to_string(slot->spec.port);
      peer["transport"] = transport::kind_name(slot->spec.transport);
      peer["state"] = supervisor::state_name(snapshot.state);
      peer["since"] = supervisor::format_time(snapshot.since);
      peer["reason"] = snapshot.reason;
      uint64_t acknowledged = slot->replica ? slot->replica->done_upto() : 0;
      peer["method"] = slot->replica ? (slot->replica->uses_apm() ? "apm" : "gpspm") : "";
      peer["acknowledged_sequence"] = acknowledged;
      peer["lag"] = next_sequence - 1 > acknowledged ? next_sequence - 1 - acknowledged : 0;
      peer["persists"] = slot->persists;
      peer["bytes"] = slot->bytes;
      peer["errors"] = slot->errors;
      if (snapshot.state == PeerState::kSyncing) {
        peer["resync"] = {{"done_bytes", slot->resync_cursor},
                          {"left_bytes", local->size() - slot->resync_cursor}};
      }
      auto percentiles = slot->latency.percentiles();
      peer["latency_us"] = {{"p50", percentiles.p50},
                            {"p99", percentiles.p99},
                            {"p999", percentiles.p999},
                            {"count", percentiles.count}};
      peers.push_back(std::move(peer));
    }
    nlohmann::json volume;
    volume["name"] = options.name;
    volume["role"] = "primary";
    volume["size"] = local->size();
    volume["path"] = local->path();
    volume["backing"] = region::backing_name(local->backing());
    volume["last_sequence"] = next_sequence - 1;
    volume["acknowledged_sequence"] = last_completed;
    volume["ack_required"] = required_acks();
    volume["identity"] = options.identity;
    volume["opened_at"] = supervisor::format_time(opened_at);
    volume["peers"] = std::move(peers);
    return volume;
  }
};

Volume::Volume(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Volume::~Volume() {
  impl_->registration = {};
  {
    std::lock_guard lock(impl_->supervisor_mutex);
    impl_->stopping = true;
  }
  impl_->supervisor_wake.notify_all();
  if (impl_->supervisor_thread.joinable()) impl_->supervisor_thread.join();
  std::lock_guard lock(impl_->mutex);
  for (auto& slot : impl_->slots) {
    if (slot->replica) slot->replica->close();
    slot->state.transition(PeerState::kClosed, "volume closed");
  }
}

Result<std::unique_ptr<Volume>> Volume::open(const VolumeOptions& options) {
  if (options.name.empty()) return Status(Errc::kInvalidArgument, "volume name is empty");
  if (options.identity.empty()) {
    return Status(Errc::kInvalidArgument, "identity is empty: targets admit peers by identity");
  }
  if (options.max_in_flight == 0) {
    return Status(Errc::kInvalidArgument, "max_in_flight must be at least 1");
  }
  if (options.ack > options.replicas.size()) {
    return Status(Errc::kInvalidArgument,
                  "ack " + std::to_string(options.ack) + " exceeds the " +
                      std::to_string(options.replicas.size()) + " replicas configured");
  }
  if (options.resync_step == 0) {
    return Status(Errc::kInvalidArgument, "resync_step must be at least 1 byte");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;

  region::OpenOptions region_options{options.local_path, options.size, options.create};
  auto local = region::Region::open(region_options);
  if (!local.ok()) return local.status().with_context("local copy of '" + options.name + "'");
  impl->local = std::move(local).value();

  auto sink = [](const supervisor::StateChange& change) {
    spdlog::info("volume {}: replica {}: {} -> {}{}{}", change.volume, change.peer,
                 supervisor::state_name(change.from), supervisor::state_name(change.to),
                 change.reason.empty() ? "" : ": ", change.reason);
    publish_event(change);
  };
  for (const auto& spec : options.replicas) {
    impl->slots.push_back(std::make_unique<Slot>(options, spec, sink));
  }

  // Connect to every replica at once: a slow one should not delay the rest.
  std::vector<std::future<Result<std::unique_ptr<Replica>>>> pending;
  for (const auto& spec : options.replicas) {
    pending.push_back(std::async(std::launch::async, [&options, &spec, &impl] {
      return Replica::connect({options, spec, impl->local->data(), impl->local->size()});
    }));
  }
  std::string errors;
  Errc first_code = Errc::kOk;
  for (size_t i = 0; i < pending.size(); ++i) {
    auto replica = pending[i].get();
    if (!replica.ok()) {
      if (first_code == Errc::kOk) first_code = replica.status().code();
      if (!errors.empty()) errors += "; ";
      errors += replica.status().message();
      continue;
    }
    impl->slots[i]->replica = std::move(replica).value();
  }
  if (first_code != Errc::kOk) {
    for (auto& slot : impl->slots) {
      if (slot->replica) slot->replica->close();
    }
    return Status(first_code, "opening volume '" + options.name + "': " + errors);
  }
  uint64_t highest = 0;
  for (auto& slot : impl->slots) {
    highest = std::max(highest, slot->replica->last_sequence());
    // Replicas are taken to be in step with the local copy when it opens.
    slot->in_sync = true;
    slot->state.transition(PeerState::kConnected, "session open");
  }
  // Sequences continue past whatever any replica recorded, so that each
  // target sees them rise.
  impl->next_sequence = highest + 1;
  impl->last_completed = highest;

  Impl* raw = impl.get();
  impl->supervisor_thread = std::thread([raw] { raw->supervisor_loop(); });
  impl->registration = register_volume([raw] { return raw->status(); });
  return std::unique_ptr<Volume>(new Volume(std::move(impl)));
}

Result<std::unique_ptr<Volume>> Volume::open_from_config(const std::string& config_path,
                                                         const std::string& volume,
                                                         const std::string& identity,
                                                         const std::string& node) {
  PMIRROR_ASSIGN_OR_RETURN(auto cluster, config::load_cluster_config(config_path));
  PMIRROR_ASSIGN_OR_RETURN(std::string self, config::resolve_node(cluster, node));
  PMIRROR_ASSIGN_OR_RETURN(auto plan, config::initiator_plan(cluster, volume, self));
  VolumeOptions options;
  options.name = plan.volume;
  options.local_path = plan.local_path;
  options.size = plan.size;
  options.create = plan.create;
  options.identity = identity;
  options.ack = plan.ack;
  options.heartbeat_interval = plan.heartbeat_interval;
  // A replica silent for heartbeat_timeout (no pong, no completion) is lost.
  options.operation_timeout = plan.heartbeat_timeout;
  options.reconnect_initial = plan.reconnect_initial;
  options.reconnect_max = plan.reconnect_max;
  for (const auto& replica : plan.replicas) {
    options.replicas.push_back(
        {replica.address, replica.port, replica.transport, plan.secret, replica.node});
  }
  return open(options);
}

std::byte* Volume::data() const { return impl_->local->data(); }
uint64_t Volume::size() const { return impl_->local->size(); }
bool Volume::is_pmem() const { return impl_->local->is_pmem(); }

Status Volume::persist(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  if (length == 0) return Status::Ok();
  std::lock_guard lock(impl_->mutex);
  PMIRROR_ASSIGN_OR_RETURN(uint64_t sequence, impl_->start_locked(offset, length));
  return impl_->wait_locked(sequence);
}

Status Volume::write(uint64_t offset, const void* source, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  std::memcpy(impl_->local->data() + offset, source, length);
  return persist(offset, length);
}

Result<uint64_t> Volume::persist_async(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  if (length == 0) {
    return Status(Errc::kInvalidArgument, "persist_async of an empty range");
  }
  std::lock_guard lock(impl_->mutex);
  return impl_->start_locked(offset, length);
}

Status Volume::wait(uint64_t sequence) {
  std::lock_guard lock(impl_->mutex);
  return impl_->wait_locked(sequence);
}

Status Volume::drain() {
  std::lock_guard lock(impl_->mutex);
  return impl_->wait_locked(impl_->next_sequence - 1);
}

std::vector<ReplicaStatus> Volume::replicas() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<ReplicaStatus> out;
  for (const auto& slot : impl_->slots) {
    ReplicaStatus s;
    if (slot->replica) {
      s = slot->replica->status();
    } else {
      s.address = slot->label;
      s.transport = slot->spec.transport;
      s.state = ReplicaState::kFailed;
    }
    auto snapshot = slot->state.snapshot();
    s.connection = supervisor::state_name(snapshot.state);
    if (s.last_error.empty() && snapshot.state != PeerState::kConnected) {
      s.last_error = snapshot.reason;
    }
    s.resynced_bytes = slot->resynced_bytes;
    out.push_back(std::move(s));
  }
  return out;
}

std::string Volume::status_json() const { return impl_->status().dump(); }

}  // namespace pmirror::initiator
