#include "target/target.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <list>
#include <nlohmann/json.hpp>
#include <thread>

#include "protocol/protocol.h"
#include "target/target_internal.h"

namespace pmirror::target {

uint32_t offered_methods(transport::Kind kind, const config::VolumeConfig& volume,
                         const region::Region& region) {
  uint32_t methods = protocol::kMethodGpspm;  // the target CPU can always persist on request
  switch (volume.apm) {
    case config::ApmPolicy::kOff:
      break;
    case config::ApmPolicy::kOn:
      methods |= protocol::kMethodApm;
      break;
    case config::ApmPolicy::kAuto:
      // Over tcp the target answers a Read only after persisting every
      // earlier Write, so read-after-write is a flush on any backing. Over
      // rdma the NIC places data without the CPU: that is durable only on
      // pmem (and only with DDIO off or eADR, which `apm: on` asserts).
      if (kind == transport::Kind::kTcp || region.is_pmem()) methods |= protocol::kMethodApm;
      break;
  }
  return methods;
}

Status checkpoint(state::StateStore& state, ServedVolume& volume) {
  std::lock_guard record_lock(volume.record_mutex);
  uint64_t applied = volume.applied_sequence.load();
  if (applied == volume.recorded_sequence) return Status::Ok();
  std::string identity;
  {
    std::lock_guard lock(volume.mutex);
    identity = volume.writer_identity;
  }
  PMIRROR_RETURN_IF_ERROR(
      state.record(volume.config.name, volume.generation.load(), applied, identity));
  volume.recorded_sequence = applied;
  return Status::Ok();
}

namespace {

// Settings that need the volume reopened when they change. `peers` and
// `primary` are not among them: peers is updated in place.
bool same_settings(const config::VolumeConfig& a, const config::VolumeConfig& b) {
  return a.path == b.path && a.size == b.size && a.create == b.create &&
         a.allowed_peers == b.allowed_peers && a.secret == b.secret && a.apm == b.apm &&
         a.metadata_path == b.metadata_path && a.chunk == b.chunk;
}

// How long promote --force waits for the evicted session to let go.
constexpr std::chrono::milliseconds kEvictWait{10000};
// How long status trusts what it last read from a copy's metadata pool
// while nobody holds it open: reading opens the pool, which a local
// primary could find busy at that instant, so not on every poll.
constexpr std::chrono::seconds kCopyStatusMaxAge{5};

}  // namespace

class Target::Impl {
 public:
  config::DaemonConfig config;
  TargetOptions options;
  std::unique_ptr<state::StateStore> state;
  std::unique_ptr<transport::Listener> listener;
  std::atomic<bool> stopping{false};
  std::chrono::system_clock::time_point started_at = std::chrono::system_clock::now();

  mutable std::mutex volumes_mutex;
  std::vector<std::shared_ptr<ServedVolume>> volumes;  // guarded by volumes_mutex

  std::mutex sessions_mutex;
  struct Session {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Session> sessions;  // guarded by sessions_mutex

  // Checkpoints every volume's progress into the state pool while sessions
  // run; sessions checkpoint once more when they end.
  std::thread checkpointer;
  std::mutex checkpoint_mutex;
  std::condition_variable checkpoint_wake;

  std::shared_ptr<ServedVolume> find(const std::string& name) const {
    std::lock_guard lock(volumes_mutex);
    for (const auto& v : volumes) {
      if (v->config.name == name) return v;
    }
    return nullptr;
  }

  std::vector<std::shared_ptr<ServedVolume>> all_volumes() const {
    std::lock_guard lock(volumes_mutex);
    return volumes;
  }

  // Maps a volume and checks that it can be served; nothing is shared yet.
  Result<std::shared_ptr<ServedVolume>> open_volume(const config::VolumeConfig& volume_config) {
    region::OpenOptions open_options;
    open_options.path = volume_config.path;
    open_options.size = volume_config.size;
    open_options.create = volume_config.create;
    auto region = region::Region::open(open_options);
    if (!region.ok()) return region.status().with_context("volume '" + volume_config.name + "'");
    auto served = std::make_shared<ServedVolume>();
    served->config = volume_config;
    served->region = std::move(region).value();
    served->methods = offered_methods(config.transport, volume_config, *served->region);
    served->peers = volume_config.peers;
    // Open (creating it if needed) the copy's metadata once, so that a
    // wrong path or a mismatched pool fails now rather than at the first
    // session. Busy is fine: a local primary (or, on reload, this volume's
    // running session) has it open.
    {
      std::lock_guard lock(served->metadata_mutex);
      auto md = open_copy_metadata(*served, config.node);
      if (md.ok()) {
        served->copy_status = copy_json((*md)->info());
        served->copy_status_at = std::chrono::steady_clock::now();
      } else if (md.status().code() != Errc::kBusy) {
        return md.status();
      }
    }
    auto recorded = state->get_or_create(volume_config.name);
    if (!recorded.ok()) {
      return recorded.status().with_context("volume '" + volume_config.name + "' state");
    }
    if (listener) {
      PMIRROR_RETURN_IF_ERROR(check_servable(*served));
    }
    spdlog::info("volume {}: {} ({} bytes, {}, pmem={}), generation {}, last sequence {}",
                 volume_config.name, volume_config.path, served->region->size(),
                 region::backing_name(served->region->backing()), served->region->is_pmem(),
                 recorded->generation, recorded->last_sequence);
    return served;
  }

  Status check_servable(ServedVolume& volume) {
    Status registrable =
        listener->check_registrable(volume.region->data(), volume.region->size(),
                                    transport::kRemoteWrite | transport::kRemoteRead);
    if (!registrable.ok()) {
      return registrable.with_context(
          "volume '" + volume.config.name + "' (" + volume.config.path + ", " +
          std::string(region::backing_name(volume.region->backing())) + ") cannot be served over " +
          std::string(transport::kind_name(config.transport)));
    }
    return Status::Ok();
  }

  void reap(bool all) {
    std::lock_guard lock(sessions_mutex);
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (all || it->done->load()) {
        if (it->thread.joinable()) it->thread.join();
        it = sessions.erase(it);
      } else {
        ++it;
      }
    }
  }

  // status's "copy" object for a volume: from the open handle when a
  // session (or a command) has the pool open, otherwise from the pool,
  // read at most every kCopyStatusMaxAge.
  nlohmann::json copy_status(ServedVolume& volume) const {
    std::lock_guard lock(volume.metadata_mutex);
    if (volume.metadata) return copy_json(volume.metadata->info());
    auto now = std::chrono::steady_clock::now();
    if (!volume.copy_status.is_null() && now - volume.copy_status_at < kCopyStatusMaxAge) {
      return volume.copy_status;
    }
    auto md = open_copy_metadata(volume, config.node, /*create=*/false);
    if (md.ok()) {
      volume.copy_status = copy_json((*md)->info());
    } else if (md.status().code() == Errc::kBusy) {
      volume.copy_status = {{"in_use_by_local_primary", true}};
    } else {
      volume.copy_status = {{"error", md.status().message()}};
    }
    volume.copy_status_at = now;
    return volume.copy_status;
  }

  void checkpoint_loop() {
    std::unique_lock lock(checkpoint_mutex);
    while (!stopping.load()) {
      checkpoint_wake.wait_for(lock, options.checkpoint_interval);
      for (auto& volume : all_volumes()) {
        if (Status saved = checkpoint(*state, *volume); !saved.ok()) {
          spdlog::error("volume {}: checkpoint: {}", volume->config.name, saved.to_string());
        }
      }
    }
  }
};

Target::Target(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Target::~Target() {
  stop();
  impl_->reap(true);
  if (impl_->checkpointer.joinable()) impl_->checkpointer.join();
}

Result<std::unique_ptr<Target>> Target::start(const config::DaemonConfig& config,
                                              const TargetOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->options = options;

  auto state = state::StateStore::open(config.state_pool, /*create_if_missing=*/true);
  if (!state.ok()) return state.status().with_context("opening the state pool");
  impl->state = std::move(state).value();

  for (const auto& volume_config : config.volumes) {
    PMIRROR_ASSIGN_OR_RETURN(auto served, impl->open_volume(volume_config));
    impl->volumes.push_back(std::move(served));
  }

  transport::ConnectionOptions connection_options;
  auto listener =
      transport::listen(config.transport, config.listen_address, config.port, connection_options);
  if (!listener.ok()) {
    return listener.status().with_context(
        "listening on " + config.listen_address + ":" + std::to_string(config.port) + " (" +
        std::string(transport::kind_name(config.transport)) + ")");
  }
  impl->listener = std::move(listener).value();
  for (auto& volume : impl->volumes) PMIRROR_RETURN_IF_ERROR(impl->check_servable(*volume));
  spdlog::info("listening on {}:{} ({}), {} volume(s)", config.listen_address,
               impl->listener->port(), transport::kind_name(config.transport),
               impl->volumes.size());
  return std::unique_ptr<Target>(new Target(std::move(impl)));
}

Status Target::run() {
  Impl& impl = *impl_;
  SessionContext context{impl.options, impl.config.node, *impl.state,
                         [&impl](const std::string& name) { return impl.find(name); },
                         impl.stopping};
  impl.checkpointer = std::thread([&impl] { impl.checkpoint_loop(); });
  while (!impl.stopping.load()) {
    auto accepted = impl.listener->accept(std::chrono::milliseconds(200));
    impl.reap(false);
    if (!accepted.ok()) {
      if (impl.stopping.load()) break;
      // A failed accept (a peer that hung up mid-handshake, garbage) must not
      // take the daemon down: log it and keep serving.
      spdlog::info("accept: {}", accepted.status().to_string());
      continue;
    }
    if (!*accepted) continue;  // timeout
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard lock(impl.sessions_mutex);
    impl.sessions.push_back(
        {std::thread([&context, done, connection = std::move(accepted).value()]() mutable {
           serve_session(context, std::move(connection));
           done->store(true);
         }),
         done});
  }
  impl.reap(true);
  impl.checkpoint_wake.notify_all();
  if (impl.checkpointer.joinable()) impl.checkpointer.join();
  // Sessions checkpoint as they end; this catches anything left.
  for (auto& volume : impl.all_volumes()) {
    if (Status saved = checkpoint(*impl.state, *volume); !saved.ok()) {
      return saved.with_context("final checkpoint of volume '" + volume->config.name + "'");
    }
  }
  return Status::Ok();
}

void Target::stop() {
  if (impl_->stopping.exchange(true)) return;
  if (impl_->listener) impl_->listener->shutdown();
  impl_->checkpoint_wake.notify_all();
}

uint16_t Target::port() const { return impl_->listener->port(); }

Status Target::reload(const config::DaemonConfig& config) {
  Impl& impl = *impl_;
  if (config.listen_address != impl.config.listen_address || config.port != impl.config.port ||
      config.transport != impl.config.transport) {
    return Status(Errc::kConfigError,
                  "the listener (address, port, transport) cannot change on reload; restart "
                  "pmirrord to apply it");
  }
  if (config.state_pool != impl.config.state_pool) {
    return Status(Errc::kConfigError,
                  "state_pool cannot change on reload; restart pmirrord to apply it");
  }
  // Open everything new first: if any volume fails, nothing changes.
  std::vector<std::shared_ptr<ServedVolume>> next;
  std::vector<std::string> added, removed, changed;
  auto current = impl.all_volumes();
  for (const auto& volume_config : config.volumes) {
    std::shared_ptr<ServedVolume> existing;
    for (auto& v : current) {
      if (v->config.name == volume_config.name) existing = v;
    }
    if (existing && same_settings(existing->config, volume_config)) {
      {
        std::lock_guard lock(existing->mutex);
        existing->peers = volume_config.peers;
      }
      next.push_back(existing);
      continue;
    }
    if (existing) {
      // Changed: the old mapping keeps serving until the swap below; a new
      // path may even be the same file, which maps twice safely.
      changed.push_back(volume_config.name);
    } else {
      added.push_back(volume_config.name);
    }
    PMIRROR_ASSIGN_OR_RETURN(auto opened, impl.open_volume(volume_config));
    next.push_back(std::move(opened));
  }
  for (auto& v : current) {
    bool kept = false;
    for (auto& n : next) kept = kept || n == v;
    if (!kept) {
      v->removed = true;  // its session ends at its next idle moment
      bool renamed_or_changed = false;
      for (auto& name : changed) renamed_or_changed = renamed_or_changed || name == v->config.name;
      if (!renamed_or_changed) removed.push_back(v->config.name);
    }
  }
  {
    std::lock_guard lock(impl.volumes_mutex);
    impl.volumes = std::move(next);
  }
  impl.config = config;
  auto join = [](const std::vector<std::string>& names) {
    std::string out;
    for (auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? std::string("none") : out;
  };
  spdlog::info("configuration reloaded: added {}; removed {}; changed {}", join(added),
               join(removed), join(changed));
  return Status::Ok();
}

Result<nlohmann::json> Target::promote(const std::string& volume_name, bool force) {
  Impl& impl = *impl_;
  const std::string& node = impl.config.node;
  auto volume = impl.find(volume_name);
  if (volume == nullptr) {
    return Status(Errc::kNotFound, "no volume '" + volume_name + "' on node " + node);
  }
  WriterClaim claim;
  PMIRROR_RETURN_IF_ERROR(claim.claim_for_command(
      *volume, "pmirrorctl promote on node " + node, force,
      "volume '" + volume_name + "' was promoted on node " + node, kEvictWait));

  std::lock_guard lock(volume->metadata_mutex);
  PMIRROR_ASSIGN_OR_RETURN(auto md, open_copy_metadata(*volume, node));
  metadata::CopyInfo info = md->info();
  const uint64_t previous = info.generations.current;
  nlohmann::json result = {{"volume", volume_name}, {"node", node}};
  auto remember = [&] {
    volume->copy_status = copy_json(md->info());
    volume->copy_status_at = std::chrono::steady_clock::now();
  };
  if (info.promoted) {
    result["generation"] = hex16(previous);
    result["previous"] = hex16(info.generations.history[0]);
    result["promoted"] = true;
    result["forced"] = false;
    result["already_promoted"] = true;
    remember();
    return result;
  }
  if (!info.consistent && !force) {
    return Status(Errc::kFailedPrecondition,
                  "volume '" + volume_name + "' on node " + node +
                      ": the copy is inconsistent: a resync into it was interrupted; promoting it "
                      "would serve mixed data (use --force to promote anyway)");
  }
  if (previous == 0 && !force) {
    return Status(Errc::kFailedPrecondition,
                  "volume '" + volume_name + "' on node " + node +
                      ": the copy never received data (its generation is 0); promoting it would "
                      "make an empty copy the primary (use --force to promote anyway)");
  }
  std::vector<std::string> peers;
  {
    std::lock_guard volume_lock(volume->mutex);
    peers = volume->peers;
  }
  for (const auto& peer : peers) {
    if (peer == node) continue;
    auto added = md->peer(peer);
    if (!added.ok()) return added.status().with_context("promote: peer " + peer);
  }
  PMIRROR_ASSIGN_OR_RETURN(uint64_t generation, md->new_generation());
  // A forced promotion of an inconsistent copy declares its bytes the new
  // generation's data: from here on they are what the volume holds.
  if (!info.consistent) PMIRROR_RETURN_IF_ERROR(md->set_consistent(true));
  PMIRROR_RETURN_IF_ERROR(md->set_promoted(true));
  PMIRROR_RETURN_IF_ERROR(md->set_clean(true));
  remember();
  spdlog::warn(
      "volume {}: promoted on node {}{}: generation {} (previous {}); sessions are refused until "
      "`pmirrorctl demote {}`",
      volume_name, node, force ? " (forced)" : "", hex16(generation), hex16(previous), volume_name);
  result["generation"] = hex16(generation);
  result["previous"] = hex16(previous);
  result["promoted"] = true;
  result["forced"] = force;
  result["already_promoted"] = false;
  return result;
}

Result<nlohmann::json> Target::demote(const std::string& volume_name) {
  Impl& impl = *impl_;
  const std::string& node = impl.config.node;
  auto volume = impl.find(volume_name);
  if (volume == nullptr) {
    return Status(Errc::kNotFound, "no volume '" + volume_name + "' on node " + node);
  }
  WriterClaim claim;
  PMIRROR_RETURN_IF_ERROR(claim.claim_for_command(*volume, "pmirrorctl demote on node " + node,
                                                  /*evict=*/false, "", kEvictWait));
  std::lock_guard lock(volume->metadata_mutex);
  auto md = open_copy_metadata(*volume, node);
  if (!md.ok()) {
    if (md.status().code() == Errc::kBusy) {
      return Status(Errc::kBusy,
                    md.status().message() + "; close the application using it as primary first");
    }
    return md.status();
  }
  bool was_promoted = (*md)->info().promoted;
  PMIRROR_RETURN_IF_ERROR((*md)->set_promoted(false));
  metadata::CopyInfo info = (*md)->info();
  volume->copy_status = copy_json(info);
  volume->copy_status_at = std::chrono::steady_clock::now();
  if (was_promoted) {
    spdlog::warn("volume {}: demoted on node {}: a replica again at generation {}", volume_name,
                 node, hex16(info.generations.current));
  }
  return nlohmann::json{{"volume", volume_name},
                        {"node", node},
                        {"promoted", false},
                        {"generation", hex16(info.generations.current)}};
}

std::vector<VolumeStatus> Target::status() const {
  std::vector<VolumeStatus> out;
  for (auto& v : impl_->all_volumes()) {
    VolumeStatus s;
    s.name = v->config.name;
    s.path = v->config.path;
    s.size = v->region->size();
    s.is_pmem = v->region->is_pmem();
    s.methods = v->methods;
    {
      std::lock_guard lock(v->mutex);
      s.writer = v->writer;
    }
    auto recorded = impl_->state->get(v->config.name);
    if (recorded.ok()) {
      s.generation = recorded->generation;
      s.last_sequence = recorded->last_sequence;
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string Target::status_json() const {
  nlohmann::json volumes = nlohmann::json::array();
  for (auto& v : impl_->all_volumes()) {
    nlohmann::json volume;
    volume["name"] = v->config.name;
    volume["role"] = "replica";
    volume["size"] = v->region->size();
    volume["path"] = v->config.path;
    volume["backing"] = region::backing_name(v->region->backing());
    auto recorded = impl_->state->get(v->config.name);
    volume["generation"] = recorded.ok() ? recorded->generation : 0;
    volume["last_sequence"] = recorded.ok() ? recorded->last_sequence : 0;
    volume["applied_sequence"] = v->applied_sequence.load();
    nlohmann::json methods = nlohmann::json::array();
    if ((v->methods & protocol::kMethodApm) != 0) methods.push_back("apm");
    if ((v->methods & protocol::kMethodGpspm) != 0) methods.push_back("gpspm");
    volume["methods"] = methods;
    nlohmann::json peers = nlohmann::json::array();
    std::deque<std::shared_ptr<SessionRecord>> sessions;
    {
      std::lock_guard lock(v->mutex);
      sessions = v->sessions;
    }
    for (auto& record : sessions) {
      auto snapshot = record->state.snapshot();
      nlohmann::json peer;
      peer["name"] = record->peer;
      peer["address"] = record->peer.substr(record->peer.find('@') + 1);
      peer["transport"] = transport::kind_name(impl_->config.transport);
      peer["state"] = supervisor::state_name(snapshot.state);
      peer["since"] = supervisor::format_time(snapshot.since);
      peer["reason"] = snapshot.reason;
      peer["acknowledged_sequence"] = record->acknowledged.load();
      peer["lag"] = 0;
      peer["persists"] = record->persists.load();
      peer["bytes"] = record->bytes.load();
      peer["errors"] = record->errors.load();
      peers.push_back(std::move(peer));
    }
    volume["peers"] = std::move(peers);
    volume["copy"] = impl_->copy_status(*v);
    volumes.push_back(std::move(volume));
  }
  nlohmann::json status;
  status["schema_version"] = 1;
  status["process"] = {{"kind", "pmirrord"},
                       {"pid", ::getpid()},
                       {"node", impl_->config.node},
                       {"started_at", supervisor::format_time(impl_->started_at)},
                       {"version", "0.1.0"}};
  status["volumes"] = std::move(volumes);
  return status.dump();
}

}  // namespace pmirror::target
