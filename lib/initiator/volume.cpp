// pmirror::Volume: opens a volume -- the local copy, its metadata, the
// replicas -- hands it to the pieces that run it (open_volume.h), and
// closes it. The pieces, each in its own file (docs/architecture.md,
// "Inside libpmirror"):
//   persist_ledger    the one record of the persists: sequences, in flight
//   activity_log      the activity log's extents
//   persist_pipeline  persist and wait: posting and the ack policy
//   peers             the replicas: sessions, states, generations, dirty maps
//   resyncer          dirty-chunk copies and their rate limit
//   verifier          verify
//   volume_supervisor the thread: reconnects, progress, resync steps, pings
//   control_edge      pmirrorctl's socket, and all of libpmirror's JSON
// All of them share the volume mutex (volume_core.h).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <thread>

#include "common/log.h"
#include "config/config.h"
#include "failover/lease_file.h"
#include "initiator/control_edge.h"
#include "initiator/initiator.h"
#include "initiator/open_volume.h"
#include "initiator/sync_decision.h"
#include "metadata/metadata.h"
#include "protocol/protocol.h"
#include "region/region.h"
#include "supervisor/supervisor.h"

// Volume is public (pmirror::Volume, include/pmirror/pmirror.hpp), so its
// members are defined in namespace pmirror; the initiator's internals keep
// their short names.
namespace pmirror {
using namespace initiator;

// An open volume, and its place on the control socket.
class Volume::Impl : public OpenVolume {
 public:
  using OpenVolume::OpenVolume;
  StatusRegistration registration;

  // Volume::open, with what the public options do not carry.
  static Result<std::unique_ptr<Volume>> open(const VolumeOptions& options,
                                              const OpenContext& context);
};

namespace initiator {

Result<std::unique_ptr<Volume>> open_volume_with(const VolumeOptions& options,
                                                 const OpenContext& context) {
  return Volume::Impl::open(options, context);
}

namespace {

// The lease of `options.name` that this node's promoter publishes in
// `context.lease_file`, if it holds now; kLeaseLost otherwise.
Result<std::unique_ptr<failover::LeaseFileReader>> open_lease(const VolumeOptions& options,
                                                              const OpenContext& context) {
  const std::string node = context.node.empty() ? std::string("this node") : context.node;
  auto none = [&](const std::string& why) {
    return Status(Errc::kLeaseLost,
                  "volume " + options.name + ": no lease on node " + node +
                      ": pmirror-promoter holds none (" + why +
                      "); failover.engine is etcd, so only the node holding the volume's lease "
                      "may write (pmirror-promoter(8))");
  };
  auto reader = failover::LeaseFileReader::open(context.lease_file, options.name, context.node);
  if (!reader.ok()) return none(reader.status().message());
  const uint64_t now = failover::monotonic_now_ns();
  const uint64_t deadline = reader->deadline_ns();
  if (deadline == 0) return none("lease file " + context.lease_file + ": no lease published");
  if (now >= deadline) {
    return none("lease file " + context.lease_file + ": its deadline passed " +
                std::to_string((now - deadline) / 1'000'000) + " ms ago");
  }
  return std::make_unique<failover::LeaseFileReader>(std::move(reader).value());
}

}  // namespace
}  // namespace initiator

Volume::Volume(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Volume::~Volume() {
  impl_->registration = {};
  impl_->close();
}

Result<std::unique_ptr<Volume>> Volume::open(const VolumeOptions& options) {
  return Impl::open(options, {});
}

Result<std::unique_ptr<Volume>> Volume::Impl::open(const VolumeOptions& options,
                                                   const OpenContext& context) {
  if (options.name.empty()) return Status(Errc::kInvalidArgument, "volume name is empty");
  if (options.identity.empty()) {
    return Status(Errc::kInvalidArgument, "identity is empty: targets admit peers by identity");
  }
  // The Hello carries both: refuse here what encode() would refuse later.
  if (Status name = protocol::check_name(options.name); !name.ok()) return name;
  if (options.identity.size() > protocol::kMaxNameLength ||
      std::any_of(options.identity.begin(), options.identity.end(),
                  [](unsigned char c) { return c < 0x20 || c == 0x7f; })) {
    return Status(Errc::kInvalidArgument, "identity is " + std::to_string(options.identity.size()) +
                                              " bytes; the protocol carries 1.." +
                                              std::to_string(protocol::kMaxNameLength) +
                                              " bytes without control characters");
  }
  if (options.max_in_flight == 0) {
    return Status(Errc::kInvalidArgument, "max_in_flight must be at least 1");
  }
  if (options.ack > options.replicas.size()) {
    return Status(Errc::kInvalidArgument, "ack " + std::to_string(options.ack) + " exceeds the " +
                                              std::to_string(options.replicas.size()) +
                                              " replicas configured");
  }
  if (options.resync_step == 0) {
    return Status(Errc::kInvalidArgument, "resync_step must be at least 1 byte");
  }
  if (options.replicas.size() > metadata::kMaxPeers) {
    return Status(Errc::kInvalidArgument,
                  std::to_string(options.replicas.size()) + " replicas configured; at most " +
                      std::to_string(metadata::kMaxPeers) + " are supported");
  }
  for (const auto& spec : options.replicas) {
    if (auto kind = replica_transport(spec.transport); !kind.ok()) {
      return kind.status().with_context("replica " + spec.address);
    }
  }

  // Before anything is opened or connected: a node without the lease
  // leaves no trace (not even an unclean metadata flag).
  std::unique_ptr<failover::LeaseFileReader> lease;
  if (!context.lease_file.empty()) {
    PMIRROR_ASSIGN_OR_RETURN(lease, open_lease(options, context));
  }

  region::OpenOptions region_options{options.local_path, options.size, options.create};
  auto local = region::Region::open(region_options);
  if (!local.ok()) return local.status().with_context("local copy of '" + options.name + "'");

  metadata::CopyMetadata::Options meta_options;
  meta_options.path = options.metadata_path.empty()
                          ? metadata::default_metadata_path(options.local_path, options.name)
                          : options.metadata_path;
  meta_options.volume_size = (*local)->size();
  meta_options.chunk_size = options.chunk_size;
  meta_options.create_if_missing = true;
  auto meta = metadata::CopyMetadata::open(meta_options);
  // pmirrord on this node opens the pool for a moment to report the copy's
  // state; only a holder that stays (a session, another primary) is busy.
  for (int attempt = 0; !meta.ok() && meta.status().code() == Errc::kBusy && attempt < 40;
       ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    meta = metadata::CopyMetadata::open(meta_options);
  }
  if (!meta.ok()) return meta.status().with_context("metadata of '" + options.name + "'");
  auto info = (*meta)->info();
  if ((*local)->created() && info.generations.current != 0) {
    // The metadata describes a copy that existed (it says which data the
    // replicas hold and what they were last in sync with); the file was
    // deleted or moved away. Going on would pair an empty copy with that
    // history: the replicas would not be resynced, the application would
    // read zeros, and its next writes would mix with the old copy's data.
    const std::string local_path = (*local)->path();
    local->reset();
    ::unlink(local_path.c_str());  // ours, just created: leave nothing behind
    return Status(Errc::kFailedPrecondition,
                  "volume '" + options.name + "': the local copy " + local_path +
                      " did not exist and was created empty, but its metadata " +
                      meta_options.path + " belongs to a copy that held data (generation " +
                      generation_hex(info.generations.current) +
                      "); refusing to start an empty copy in its place (nothing was changed). "
                      "Restore the file, or run the application on a replica's node "
                      "(`pmirrorctl promote " +
                      options.name +
                      "` there), or, to discard this copy's history and "
                      "start it over, remove " +
                      meta_options.path +
                      " and open it once with after_split_brain: overwrite_replica (the "
                      "replicas' data is then overwritten by a full sync of the empty copy)");
  }
  if (options.require_promoted && !info.promoted) {
    return Status(Errc::kPermissionDenied,
                  "this node is not the primary of volume '" + options.name +
                      "' in the cluster file, and its copy was not promoted; run `pmirrorctl "
                      "promote " +
                      options.name + "` on this node first");
  }
  if (!info.clean) {
    // The last primary here crashed: what it had in flight may differ.
    auto recovered = (*meta)->recover_activity_log();
    if (!recovered.ok())
      return recovered.status().with_context("metadata of '" + options.name + "'");
    log::warn(
        "volume {}: the last session did not close cleanly; {} extents of its activity "
        "log will be resynced",
        options.name, recovered->size());
  }
  PMIRROR_RETURN_IF_ERROR((*meta)->set_clean(false));
  if (info.generations.current == 0) {
    PMIRROR_ASSIGN_OR_RETURN(uint64_t first, (*meta)->new_generation());
    log::info("volume {}: new copy, generation {}", options.name, generation_hex(first));
  }
  auto impl = std::make_unique<Impl>(options, std::move(local).value(), std::move(meta).value());
  VolumeCore& core = impl->core;
  core.lease = std::move(lease);  // before the first persist, and any other thread
  PMIRROR_RETURN_IF_ERROR(core.staging.allocate(options.snapshot_buffer));

  auto sink = [](const supervisor::StateChange& change) {
    log::info("volume {}: replica {}: {} -> {}{}{}", change.volume, change.peer,
              supervisor::state_name(change.from), supervisor::state_name(change.to),
              change.reason.empty() ? "" : ": ", change.reason);
    publish_event(change);
  };
  for (const auto& spec : options.replicas) {
    PMIRROR_RETURN_IF_ERROR(impl->peers.add(spec, sink));
  }
  if (options.replicas.empty()) {
    // Allowed (a primary whose replicas are yet to come, a test), but never
    // silent: nothing this volume persists survives the loss of this node.
    log::warn(
        "volume {}: opened with no replicas: a persist is durable on this node's copy only and "
        "nothing is mirrored; give the volume replicas (pmirror-cluster.yaml(5), or "
        "pmirror_cfg(3))",
        options.name);
  }

  // Connect to every replica at once: a slow one should not delay the rest.
  std::vector<std::future<Result<std::unique_ptr<Replica>>>> pending;
  // What the attempts read lives in the volume (an attempt may outlast
  // open: see below), never in the caller's options.
  for (size_t i = 0; i < options.replicas.size(); ++i) {
    const ReplicaSpec& spec = impl->peers.all()[i]->spec;
    protocol::Lineage lineage = core.lineage(impl->peers.all()[i]->meta_index);
    const bool promoted = core.meta->info().promoted;
    pending.push_back(std::async(std::launch::async, [&spec, &core, lineage, promoted] {
      return Replica::connect({core.options, spec, core.local->data(), core.local->size(), lineage,
                               core.staging.base(), core.staging.capacity(), promoted});
    }));
  }
  // Every answer is waited for, but not a dead node's connect timeout once
  // the ack policy can be met: the others then get a grace (four times what
  // the answers so far took, at least 500 ms, at most half the connect
  // timeout) and go on connecting in the background, as reconnects. A
  // promoted copy's application otherwise waited the whole timeout for the
  // dead (or frozen) old primary's node (docs/failover.md, section 3); the
  // grace is a part of every takeover's time.
  const uint32_t required = impl->peers.required_acks();
  const auto opened_at = Clock::now();
  std::vector<std::optional<Result<std::unique_ptr<Replica>>>> answers(pending.size());
  std::optional<Clock::time_point> rest_until;
  while (true) {
    size_t answered = 0;
    uint32_t usable = 0;
    bool misconfigured = false;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (!answers[i] &&
          pending[i].wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        answers[i] = pending[i].get();
      }
      if (!answers[i]) continue;
      ++answered;
      if (answers[i]->ok()) {
        ++usable;
      } else if (is_misconfiguration(answers[i]->status().code()) ||
                 is_demotion(answers[i]->status().code())) {
        misconfigured = true;  // open fails anyway: say so with every answer
      }
    }
    if (answered == pending.size()) break;
    const auto now = Clock::now();
    if (!rest_until && usable >= required && required > 0 && !misconfigured) {
      auto grace = std::max<Clock::duration>(4 * (now - opened_at), std::chrono::milliseconds(500));
      grace = std::min<Clock::duration>(grace, options.connect_timeout / 2);
      rest_until = now + grace;
    }
    if (rest_until && now >= *rest_until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<Result<std::unique_ptr<Replica>>> connected;
  for (size_t i = 0; i < pending.size(); ++i) {
    if (answers[i]) {
      connected.push_back(std::move(*answers[i]));
    } else {
      log::info(
          "volume {}: replica {} has not answered yet; opening without it, it goes on "
          "connecting in the background",
          options.name, impl->peers.all()[i]->label);
      connected.push_back(Status(Errc::kConnectionError, "still connecting"));
    }
  }
  // The attempts that go on: valid futures (answered ones were collected).
  std::vector<std::future<Result<std::unique_ptr<Replica>>>>& still_connecting = pending;

  auto fail_open = [&](Status why) -> Status {
    for (auto& result : connected) {
      if (result.ok() && *result) (*result)->close();
    }
    for (const auto& peer : impl->peers.all()) {
      if (peer->replica) peer->replica->close();
    }
    (void)core.meta->set_clean(true);
    return why;
  };
  std::string errors;
  Errc first_code = Errc::kOk;
  for (size_t i = 0; i < connected.size(); ++i) {
    if (connected[i].ok() || still_connecting[i].valid()) continue;
    if (first_code == Errc::kOk || is_misconfiguration(connected[i].status().code())) {
      if (first_code == Errc::kOk || !is_misconfiguration(first_code)) {
        first_code = connected[i].status().code();
      }
    }
    if (!errors.empty()) errors += "; ";
    errors += connected[i].status().message();
  }
  for (const auto& result : connected) {
    if (!result.ok() && is_demotion(result.status().code())) {
      return fail_open(Status(result.status().code(),
                              "opening volume '" + options.name +
                                  "': " + result.status().message() +
                                  "; this copy is no longer the primary: run the application "
                                  "on the promoted node, or demote it there first"));
    }
  }
  const auto usable = static_cast<size_t>(
      std::count_if(connected.begin(), connected.end(), [](const auto& r) { return r.ok(); }));
  if (first_code != Errc::kOk && (is_misconfiguration(first_code) || usable < required)) {
    return fail_open(Status(first_code, "opening volume '" + options.name + "': " + errors));
  }

  impl->begin_sessions(connected, still_connecting);
  impl->supervisor.start();
  if (Status synced = impl->wait_for_ack_replicas(); !synced.ok()) return fail_open(synced);

  Impl* raw = impl.get();
  VolumeControls controls;
  controls.status = [raw] { return raw->status(); };
  controls.resync = [raw](const std::string& peer, bool full) { return raw->resync(peer, full); };
  controls.verify = [raw](const std::string& peer, bool mark_dirty) {
    return raw->verifier.verify(peer, mark_dirty);
  };
  controls.set_connected = [raw](const std::string& peer, bool connect) {
    return raw->set_connected(peer, connect);
  };
  controls.chunk_size = core.chunk_size;
  impl->registration = register_volume(options.name, std::move(controls));
  return std::unique_ptr<Volume>(new Volume(std::move(impl)));
}

Result<std::unique_ptr<Volume>> Volume::open_from_config(const std::string& config_path,
                                                         const std::string& volume,
                                                         const std::string& identity,
                                                         const std::string& node) {
  return open_from_config(config_path, volume, identity, node, {});
}

Result<std::unique_ptr<Volume>> Volume::open_from_config(
    const std::string& config_path, const std::string& volume, const std::string& identity,
    const std::string& node, const std::function<void(VolumeOptions&)>& adjust) {
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
  options.metadata_path = plan.metadata_path;
  options.chunk_size = plan.chunk;
  options.resync_rate = plan.resync_rate;
  switch (plan.poll) {
    case transport::PollMode::kEvent:
      options.poll = PollMode::kEvent;
      break;
    case transport::PollMode::kBusy:
      options.poll = PollMode::kBusy;
      break;
    case transport::PollMode::kAdaptive:
      options.poll = PollMode::kAdaptive;
      break;
  }
  options.block_when_insufficient = plan.on_insufficient == config::InsufficientPolicy::kBlock;
  options.overwrite_split_brain =
      plan.after_split_brain == config::SplitBrainPolicy::kOverwriteReplica;
  options.require_promoted = !plan.configured_primary;
  for (const auto& replica : plan.replicas) {
    options.replicas.push_back({replica.address, replica.port,
                                std::string(transport::kind_name(replica.transport)), plan.secret,
                                replica.node});
  }
  if (adjust) adjust(options);
  return Impl::open(options, OpenContext{plan.lease_file, plan.node});
}

std::byte* Volume::data() const { return impl_->core.local->data(); }
uint64_t Volume::size() const { return impl_->core.local->size(); }
bool Volume::is_pmem() const { return impl_->core.local->is_pmem(); }

Status Volume::persist(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->pipeline.check_range(offset, length));
  if (length == 0) return Status::Ok();
  auto lock = app_lock(impl_->core);
  PMIRROR_ASSIGN_OR_RETURN(uint64_t sequence, impl_->pipeline.start(lock, offset, length));
  return impl_->pipeline.wait(lock, sequence);
}

Status Volume::write(uint64_t offset, const void* source, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->pipeline.check_range(offset, length));
  std::memcpy(impl_->core.local->data() + offset, source, length);
  return persist(offset, length);
}

Result<uint64_t> Volume::persist_async(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->pipeline.check_range(offset, length));
  if (length == 0) {
    return Status(Errc::kInvalidArgument, "persist_async of an empty range");
  }
  auto lock = app_lock(impl_->core);
  return impl_->pipeline.start(lock, offset, length);
}

Result<uint64_t> Volume::persist_async(const PersistRange* ranges, size_t count,
                                       const void* snapshot) {
  return persist_ordered_async(ranges, count, nullptr, 0, snapshot);
}

Result<uint64_t> Volume::persist_ordered_async(const PersistRange* ranges, size_t count,
                                               const uint32_t* group_sizes, size_t groups,
                                               const void* snapshot) {
  if (ranges == nullptr && count > 0) {
    return Status(Errc::kInvalidArgument, "persist_async: ranges is null");
  }
  if (group_sizes == nullptr && groups > 0) {
    return Status(Errc::kInvalidArgument, "persist_ordered_async: group_sizes is null");
  }
  uint64_t grouped = 0;
  for (size_t g = 0; g < groups; ++g) grouped += group_sizes[g];
  if (groups > 0 && grouped != count) {
    return Status(Errc::kInvalidArgument, "persist_ordered_async: the group sizes add up to " +
                                              std::to_string(grouped) + " ranges, not " +
                                              std::to_string(count));
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    PMIRROR_RETURN_IF_ERROR(impl_->pipeline.check_range(ranges[i].offset, ranges[i].length));
    bytes += ranges[i].length;
  }
  if (bytes == 0) return Status(Errc::kInvalidArgument, "persist_async of empty ranges only");
  std::span<const std::byte> taken;
  if (snapshot != nullptr) {
    if (impl_->core.staging.capacity() == 0) {
      return Status(Errc::kFailedPrecondition,
                    "volume '" + impl_->core.options.name +
                        "' has no snapshot buffer: open it with VolumeOptions::snapshot_buffer");
    }
    taken = {static_cast<const std::byte*>(snapshot), bytes};
  }
  auto lock = app_lock(impl_->core);
  std::vector<protocol::Range>& kept = impl_->ranges_scratch;
  std::vector<size_t>& starts = impl_->group_starts_scratch;
  kept.clear();
  starts.clear();
  // Empty ranges are skipped; a group left with none starts nothing.
  size_t at = 0;
  for (size_t g = 0; g < std::max<size_t>(groups, 1); ++g) {
    const size_t end = at + (groups > 0 ? group_sizes[g] : count);
    const size_t before = kept.size();
    for (; at < end; ++at) {
      if (ranges[at].length == 0) continue;
      kept.push_back(protocol::Range{ranges[at].offset, ranges[at].length});
    }
    if (before > 0 && kept.size() > before) starts.push_back(before);
  }
  return impl_->pipeline.start(lock, kept, taken, starts);
}

Status Volume::wait(uint64_t sequence) {
  auto lock = app_lock(impl_->core);
  return impl_->pipeline.wait(lock, sequence);
}

Status Volume::drain() {
  auto lock = app_lock(impl_->core);
  return impl_->pipeline.wait(lock, impl_->ledger.last_started());
}

std::vector<ReplicaStatus> Volume::replicas() const {
  std::lock_guard lock(impl_->core.mutex);
  std::vector<ReplicaStatus> out;
  for (const auto& peer : impl_->peers.all()) {
    ReplicaStatus s = impl_->peers.replica_status(*peer);
    s.resynced_bytes = impl_->resyncer.resynced_bytes(*peer);
    out.push_back(std::move(s));
  }
  return out;
}

std::string Volume::status_json() const { return initiator::status_json(impl_->status()); }

Status Volume::resync(const std::string& peer, bool full) {
  return impl_->resync(peer, full).status();
}

Result<std::vector<VerifyPeerResult>> Volume::verify(const std::string& peer, bool mark_dirty) {
  return impl_->verifier.verify(peer, mark_dirty);
}

}  // namespace pmirror
