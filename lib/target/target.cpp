#include "target/target.h"

#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <list>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "common/log.h"
#include "common/rfc3339.h"
#include "common/thread_name.h"
#include "protocol/protocol.h"
#include "target/target_internal.h"

namespace pmirror::target {

uint32_t offered_methods(const transport::Capabilities& transport,
                         const config::VolumeConfig& volume, const region::Region& region) {
  uint32_t methods = protocol::kMethodGpspm;  // the target CPU can always persist on request
  switch (volume.apm) {
    case config::ApmPolicy::kOff:
      break;
    case config::ApmPolicy::kOn:
      methods |= protocol::kMethodApm;
      break;
    case config::ApmPolicy::kAuto:
      // Where the transport makes a Read wait for earlier Writes to be
      // durable (tcp: the target persists them first), read-after-write is
      // a flush on any backing. Otherwise (rdma) the NIC places data
      // without the CPU: durable only on pmem (and only with DDIO off or
      // eADR, which `apm: on` asserts).
      if (transport.read_flushes_writes_on_any_backing || region.is_pmem())
        methods |= protocol::kMethodApm;
      break;
  }
  // Where the target's CPU places each Write (tcp) and a persist of it is a
  // cache-line flush (pmem), it persists every Write as it lands: placement
  // order is durability order, and an ordered persist's groups need no
  // flush Read between them. On a plain file that would be an msync per
  // Write instead of one per flush: not offered there.
  if ((methods & protocol::kMethodApm) != 0 && transport.persists_each_write && region.is_pmem())
    methods |= protocol::kMethodPlacementOrder;
  return methods;
}

bool checkpoint_due(ServedVolume& volume) {
  std::lock_guard record_lock(volume.record_mutex);
  return volume.applied_sequence.load() != volume.recorded_sequence;
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

bool ServedVolume::allows(const std::string& identity, std::string* secret_out) {
  std::lock_guard lock(mutex);
  if (secret_out != nullptr) *secret_out = secret;
  return std::find(allowed_peers.begin(), allowed_peers.end(), identity) != allowed_peers.end();
}

bool ServedVolume::allows_fencer(const std::string& identity, std::string* secret_out) {
  std::lock_guard lock(mutex);
  if (secret_out != nullptr) *secret_out = secret;
  return std::find(peers.begin(), peers.end(), identity) != peers.end();
}

namespace {

// Gives the memory that ended sessions and handshakes freed back to the
// system. glibc keeps what a thread frees in that thread's arena: each
// session thread opens its copy's metadata pool (libpmemobj's run-time
// heap, about 11 MiB) in an arena of its own, so a daemon whose sessions
// came and went, or that a crowd of strangers' handshakes passed through,
// held on to tens of MiB it no longer used (scripts/soak.sh measured 25
// -> 82 MiB of anonymous memory in a minute of reconnects; with this, flat:
// docs/operations.md, "Memory"). malloc_trim(3) hands free pages of every
// arena back; at most once a second, a second after what ended.
class MemoryGiveBack {
 public:
  void note(size_t sessions_ended, size_t handshakes_now) {
    const auto now = std::chrono::steady_clock::now();
    if (sessions_ended > 0 || handshakes_now + kHandshakesWorthIt <= handshakes_peak_) {
      due_ = true;
      handshakes_peak_ = handshakes_now;
    }
    handshakes_peak_ = std::max(handshakes_peak_, handshakes_now);
    if (due_ && now - last_ >= std::chrono::seconds(1)) {
      ::malloc_trim(0);
      due_ = false;
      last_ = now;
    }
  }

 private:
  // Fewer handshakes gone than this leave too little to be worth a trim.
  static constexpr size_t kHandshakesWorthIt = 8;
  bool due_ = false;
  size_t handshakes_peak_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

// Settings that need the volume reopened when they change. `peers`,
// `primary`, `allowed_peers`, `secret` and `poll` are not among them: they are
// updated in place, and a session goes on unless its identity lost access.
bool same_settings(const config::VolumeConfig& a, const config::VolumeConfig& b) {
  return a.path == b.path && a.size == b.size && a.create == b.create && a.apm == b.apm &&
         a.native_persistence == b.native_persistence && a.metadata_path == b.metadata_path &&
         a.chunk == b.chunk;
}

// A refused start leaves nothing behind: removes the state pool when this
// start created it and then failed. "Created": missing when the start
// began, then opened (and locked) by it -- never another daemon's pool.
class NewPoolRemover {
 public:
  explicit NewPoolRemover(std::string path) : path_(std::move(path)) {
    struct stat st {};
    existed_ = ::stat(path_.c_str(), &st) == 0 || errno != ENOENT;
  }
  ~NewPoolRemover() {
    if (!created_ || started_) return;
    if (::unlink(path_.c_str()) == 0) {
      log::info("removed the state pool {} this refused start had created", path_);
    } else {
      log::warn("could not remove the state pool {} this refused start had created: {}", path_,
                std::strerror(errno));
    }
  }
  NewPoolRemover(const NewPoolRemover&) = delete;
  NewPoolRemover& operator=(const NewPoolRemover&) = delete;
  void opened() { created_ = !existed_; }
  void started() { started_ = true; }

 private:
  std::string path_;
  bool existed_ = true;
  bool created_ = false;
  bool started_ = false;
};

// How long promote --force waits for the evicted session to let go.
constexpr std::chrono::milliseconds kEvictWait{10000};
// How long a fence may take per node once connected (handshake, the old
// primary's session ending there): nodes are fenced in parallel. Reaching
// the node at all gets heartbeat_timeout, after which every other part of
// pmirror calls a silent peer gone: a powered-off node (whose address the
// neighbours still resolve, so connects are not refused but unanswered)
// costs the promotion that, not this (docs/failover.md, section 1).
constexpr std::chrono::milliseconds kFenceTimeout{15000};
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
  transport::Capabilities capabilities;  // of config.transport, asked at start
  std::atomic<bool> stopping{false};
  std::chrono::system_clock::time_point started_at = std::chrono::system_clock::now();
  AdmissionStats admission;

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
  CheckpointBell checkpoint_bell;
  // The fences of promotions here, retried until they land (after config:
  // it reads config.cluster, and goes first).
  Fencer fencer{config.cluster};

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

  // The volume's file was missing and has just been created empty. A
  // metadata pool already there belongs to the copy that was deleted: kept,
  // it would tell the primary that this empty file holds that copy's
  // generation, and the primary would skip the sync. It is moved aside (not
  // deleted: it is evidence) so that the copy starts as a new, empty
  // replica, which the primary fills with a full sync.
  Status set_aside_stale_metadata(const config::VolumeConfig& volume_config) {
    const std::string path = copy_metadata_path(volume_config);
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return Status::Ok();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    const std::string aside = path + ".replaced-" + std::to_string(seconds);
    std::filesystem::rename(path, aside, ec);
    if (ec) {
      return Status(Errc::kIoError,
                    "volume '" + volume_config.name + "': its file " + volume_config.path +
                        " was missing and was created empty, but the metadata of the copy that "
                        "was there (" +
                        path + ") could not be moved aside: " + ec.message() +
                        "; move or remove it by hand (the primary then makes a full sync)");
    }
    log::warn(
        "volume {}: its file {} was missing and was created empty; the metadata of the copy "
        "that was there is kept as {}; this copy starts as a new, empty replica (the primary "
        "makes a full sync)",
        volume_config.name, volume_config.path, aside);
    return Status::Ok();
  }

  // Maps a volume and checks that it can be served; nothing is shared yet.
  Result<std::shared_ptr<ServedVolume>> open_volume(const config::VolumeConfig& volume_config) {
    // What the checks (`pmirrord --check-config`, `pmirrorctl config check`,
    // a reload's dry run) ask too, in the same words; then the opens.
    PMIRROR_RETURN_IF_ERROR(config::check_volume_paths(volume_config, config.node));
    region::OpenOptions open_options;
    open_options.path = volume_config.path;
    open_options.size = volume_config.size;
    open_options.create = volume_config.create;
    open_options.name = volume_config.name;  // its errors name the volume
    auto region = region::Region::open(open_options);
    if (!region.ok()) return region.status();
    // Before the copy's metadata is touched: another pmirrord may serve it.
    auto serve_lock = ServeLock::take(volume_config.name, volume_config.path);
    if (!serve_lock.ok()) return serve_lock.status();
    if ((*region)->created()) PMIRROR_RETURN_IF_ERROR(set_aside_stale_metadata(volume_config));
    auto served = std::make_shared<ServedVolume>();
    served->serve_lock = std::move(serve_lock).value();
    served->config = volume_config;
    served->region = std::move(region).value();
    served->methods = offered_methods(capabilities, volume_config, *served->region);
    served->peers = volume_config.peers;
    served->allowed_peers = volume_config.allowed_peers;
    served->secret = volume_config.secret;
    served->poll = volume_config.poll;
    // Open (creating it if needed) the copy's metadata once, so that a
    // wrong path or a mismatched pool fails now rather than at the first
    // session. Busy is fine: a local primary (or, on reload, this volume's
    // running session) has it open.
    {
      std::lock_guard lock(served->metadata_mutex);
      auto md = open_copy_metadata(*served, config.node);
      if (md.ok()) {
        served->copy_status = CopyStatus{.info = (*md)->info()};
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
    log::info("volume {}: {} ({} bytes, {}, pmem={}), session generation {}, last sequence {}",
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

  // Joins the sessions that ended (all: every one); how many.
  size_t reap(bool all) {
    std::lock_guard lock(sessions_mutex);
    size_t joined = 0;
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (all || it->done->load()) {
        if (it->thread.joinable()) it->thread.join();
        it = sessions.erase(it);
        ++joined;
      } else {
        ++it;
      }
    }
    return joined;
  }

  // status's view of a volume's copy: from the open handle when a session
  // (or a command) has the pool open, otherwise from the pool, read at
  // most every kCopyStatusMaxAge.
  CopyStatus copy_status(ServedVolume& volume) const {
    std::lock_guard lock(volume.metadata_mutex);
    if (volume.metadata) return CopyStatus{.info = volume.metadata->info()};
    auto now = std::chrono::steady_clock::now();
    if (volume.copy_status_at != std::chrono::steady_clock::time_point{} &&
        now - volume.copy_status_at < kCopyStatusMaxAge) {
      return volume.copy_status;
    }
    auto md = open_copy_metadata(volume, config.node, /*create=*/false);
    if (md.ok()) {
      volume.copy_status = CopyStatus{.info = (*md)->info()};
    } else if (md.status().code() == Errc::kBusy) {
      volume.copy_status = CopyStatus{.in_use_by_local_primary = true};
    } else {
      volume.copy_status = CopyStatus{.error = md.status().message()};
    }
    volume.copy_status_at = now;
    return volume.copy_status;
  }

  void checkpoint_loop() {
    name_this_thread("pmirrord-ckpt");
    bool idle = false;
    while (!stopping.load()) {
      checkpoint_bell.wait(idle, options.checkpoint_interval, [&] {
        if (stopping.load()) return true;
        for (auto& volume : all_volumes()) {
          if (checkpoint_due(*volume)) return true;
        }
        return false;
      });
      idle = true;
      for (auto& volume : all_volumes()) {
        if (!checkpoint_due(*volume)) continue;
        idle = false;
        if (Status saved = checkpoint(*state, *volume); !saved.ok()) {
          log::error("volume {}: checkpoint: {}", volume->config.name, saved.to_string());
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
  // Declared before impl, so that on a refused start it runs once impl has
  // closed the pool.
  NewPoolRemover remover(config.state_pool);
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->options = options;
  // Before anything is created: a transport this build lacks (rdma with
  // PMIRROR_RDMA=OFF) is refused with the registry's reason.
  auto capabilities = transport::capabilities(config.transport);
  if (!capabilities.ok()) return capabilities.status().with_context("node " + config.node);
  impl->capabilities = *capabilities;

  // What the checks (`pmirrord --check-config`, `pmirrorctl config check`)
  // ask too, in the same words; then the open.
  PMIRROR_RETURN_IF_ERROR(config::check_state_pool_path(config.state_pool));
  auto state = state::StateStore::open(config.state_pool, /*create_if_missing=*/true);
  if (!state.ok()) return state.status().with_context("opening the state pool");
  impl->state = std::move(state).value();
  remover.opened();

  for (const auto& volume_config : config.volumes) {
    PMIRROR_ASSIGN_OR_RETURN(auto served, impl->open_volume(volume_config));
    impl->volumes.push_back(std::move(served));
  }

  transport::ConnectionOptions connection_options;
  transport::AdmissionOptions admission;
  admission.handshake_timeout = options.handshake_timeout;
  admission.max_unauthenticated = options.max_unauthenticated;
  admission.max_unauthenticated_per_source = options.max_unauthenticated_per_source;
  auto listener = transport::listen(config.transport, config.listen_address, config.port,
                                    connection_options, admission);
  if (!listener.ok()) {
    return listener.status().with_context(
        "listening on " + config.listen_address + ":" + std::to_string(config.port) + " (" +
        std::string(transport::kind_name(config.transport)) + ")");
  }
  impl->listener = std::move(listener).value();
  for (auto& volume : impl->volumes) PMIRROR_RETURN_IF_ERROR(impl->check_servable(*volume));
  log::info("listening on {}:{} ({}), {} volume(s)", config.listen_address, impl->listener->port(),
            transport::kind_name(config.transport), impl->volumes.size());
  remover.started();
  return std::unique_ptr<Target>(new Target(std::move(impl)));
}

Status Target::run() {
  Impl& impl = *impl_;
  SessionContext context{
      impl.options,        impl.config.node,
      *impl.state,         [&impl](const std::string& name) { return impl.find(name); },
      impl.stopping,       impl.admission,
      impl.checkpoint_bell};
  try {
    impl.checkpointer = std::thread([&impl] { impl.checkpoint_loop(); });
  } catch (const std::system_error& e) {
    return Status(Errc::kResourceExhausted, std::string("cannot start the checkpoint thread: ") +
                                                e.what() +
                                                " (is the task limit, TasksMax=, too low?)");
  }
  // Peers are admitted on this thread; each authenticated one gets a
  // session thread (and its connection's threads) -- a stranger gets none.
  Admission admission(context, *impl.listener, [&impl, &context](AdmittedPeer& peer) -> Status {
    auto done = std::make_shared<std::atomic<bool>>(false);
    // Shared so that the peer survives a thread that could not be created.
    auto shared = std::make_shared<AdmittedPeer>(std::move(peer));
    std::lock_guard lock(impl.sessions_mutex);
    try {
      impl.sessions.push_back({std::thread([&context, done, shared] {
                                 name_this_thread("pmirrord-sess");
                                 serve_session(context, std::move(*shared));
                                 done->store(true);
                               }),
                               done});
    } catch (const std::system_error& e) {
      peer = std::move(*shared);
      return Status(Errc::kResourceExhausted,
                    std::string("cannot start a session thread: ") + e.what());
    }
    return Status::Ok();
  });
  MemoryGiveBack give_back;
  while (!impl.stopping.load()) {
    // A second when nothing happens: a handshake's deadline and a stop
    // (the listener's shutdown) end the wait sooner; ended sessions' threads
    // are joined a second late at most.
    bool open = admission.step(std::chrono::milliseconds(1000));
    give_back.note(impl.reap(false), admission.under_way());
    if (!open) break;
  }
  admission.close_all();
  impl.reap(true);
  impl.checkpoint_bell.ring_always();
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
  impl_->fencer.cancel();
  for (auto& volume : impl_->all_volumes()) volume->wake_sessions();
  impl_->checkpoint_bell.ring_always();
}

uint16_t Target::port() const { return impl_->listener->port(); }

Result<ReloadResult> Target::reload(const config::DaemonConfig& config, bool dry_run) {
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
  if (config.handshake_timeout != impl.config.handshake_timeout ||
      config.max_unauthenticated != impl.config.max_unauthenticated ||
      config.max_unauthenticated_per_source != impl.config.max_unauthenticated_per_source) {
    return Status(Errc::kConfigError,
                  "handshake_timeout, max_unauthenticated and max_unauthenticated_per_source "
                  "belong to the listener and cannot change on reload; restart pmirrord to apply "
                  "them");
  }
  // Open everything new first: if any volume fails, nothing changes.
  std::vector<std::shared_ptr<ServedVolume>> next;
  // Volumes kept open, with their new settings (applied once nothing failed).
  std::vector<std::pair<std::shared_ptr<ServedVolume>, const config::VolumeConfig*>> kept;
  ReloadResult result{.dry_run = dry_run};
  std::vector<std::string>& added = result.added;
  std::vector<std::string>& removed = result.removed;
  std::vector<std::string>& changed = result.changed;
  auto current = impl.all_volumes();
  if (dry_run) {
    for (const auto& volume_config : config.volumes) {
      auto existing = std::find_if(current.begin(), current.end(), [&](const auto& v) {
        return v->config.name == volume_config.name;
      });
      const bool settings_kept =
          existing != current.end() && same_settings((*existing)->config, volume_config);
      if (existing == current.end()) {
        added.push_back(volume_config.name);
      } else if ((*existing)->region->failed() || !settings_kept) {
        changed.push_back(volume_config.name);
      } else {
        continue;  // kept open: nothing to check
      }
      // What the reload would refuse before it opens the volume, in its
      // words: its paths, another pmirrord serving the copy. A failed
      // volume with the same settings only stays failed (see below).
      Status openable = config::check_volume_paths(volume_config, impl.config.node);
      if (openable.ok()) {
        openable = check_not_served_elsewhere(volume_config.name, volume_config.path);
      }
      if (!openable.ok() && !settings_kept) return openable;
    }
    for (const auto& v : current) {
      auto kept = std::find_if(config.volumes.begin(), config.volumes.end(),
                               [&](const auto& c) { return c.name == v->config.name; });
      if (kept == config.volumes.end()) removed.push_back(v->config.name);
    }
    return result;
  }
  for (const auto& volume_config : config.volumes) {
    std::shared_ptr<ServedVolume> existing;
    for (auto& v : current) {
      if (v->config.name == volume_config.name) existing = v;
    }
    // A failed volume is reopened by any reload: the operator's way of
    // saying the cause is fixed (a new mapping starts without the failure).
    const bool reopen = existing && existing->region->failed();
    if (reopen) {
      log::warn("volume {}: reopening it, which had failed: {}", volume_config.name,
                existing->region->failure().message());
    }
    if (existing && !reopen && same_settings(existing->config, volume_config)) {
      kept.emplace_back(existing, &volume_config);
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
    auto opened = impl.open_volume(volume_config);
    if (!opened.ok() && reopen && same_settings(existing->config, volume_config)) {
      // Still broken (e.g. its file was truncated): it stays failed, and the
      // rest of the reload goes on.
      log::error("volume {}: stays failed: reopening it failed: {}", volume_config.name,
                 opened.status().message());
      changed.pop_back();
      kept.emplace_back(existing, &volume_config);
      next.push_back(existing);
      continue;
    }
    if (!opened.ok()) return opened.status();
    next.push_back(std::move(opened).value());
    // Reopened with new settings: still down if an operator said so.
    if (existing) next.back()->down_by_operator = existing->down_by_operator.load();
  }
  for (auto& [volume, volume_config] : kept) {
    bool access_changed = false;
    {
      std::lock_guard lock(volume->mutex);
      volume->peers = volume_config->peers;
      access_changed = volume->allowed_peers != volume_config->allowed_peers;
      volume->allowed_peers = volume_config->allowed_peers;
      volume->secret = volume_config->secret;
    }
    volume->poll = volume_config->poll;  // sessions that start from now on
    if (access_changed) {
      ++volume->access_version;  // its session checks its identity again
      volume->wake_sessions();
      std::string peers;
      for (const auto& peer : volume_config->allowed_peers) {
        peers += (peers.empty() ? "" : ", ") + peer;
      }
      log::info("volume {}: allowed_peers now {}", volume_config->name, peers);
    }
  }
  for (auto& v : current) {
    bool still_served = false;
    for (auto& n : next) still_served = still_served || n == v;
    if (!still_served) {
      v->removed = true;  // its session ends at its next idle moment
      v->wake_sessions();
      bool renamed_or_changed = false;
      for (auto& name : changed) renamed_or_changed = renamed_or_changed || name == v->config.name;
      if (!renamed_or_changed) removed.push_back(v->config.name);
    }
  }
  {
    std::lock_guard lock(impl.volumes_mutex);
    impl.volumes = std::move(next);
  }
  // impl.config is not replaced: what a reload may change lives in the
  // volumes (swapped above, under volumes_mutex); what it may not (node,
  // listener, state pool, admission) was checked equal. Status, promote and
  // demote read impl.config from other threads without a lock.
  auto join = [](const std::vector<std::string>& names) {
    std::string out;
    for (auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? std::string("none") : out;
  };
  log::info("configuration reloaded: added {}; removed {}; changed {}", join(added), join(removed),
            join(changed));
  return result;
}

Result<PromoteResult> Target::promote(const std::string& volume_name, bool force,
                                      std::optional<std::chrono::milliseconds> fence_wait) {
  Impl& impl = *impl_;
  auto volume = impl.find(volume_name);
  if (volume == nullptr) {
    return Status(Errc::kNotFound, "no volume '" + volume_name + "' on node " + impl.config.node);
  }
  std::vector<std::string> peers;
  std::string secret;
  bool writer_connected = false;
  {
    std::lock_guard volume_lock(volume->mutex);
    peers = volume->peers;
    secret = volume->secret;
    writer_connected = !volume->writer.empty();
  }
  auto fence = [&](uint64_t generation) {
    return impl.fencer.fence(
        Fencer::Round{.volume = volume,
                      .peers = peers,
                      .self = impl.config.node,
                      .secret = secret,
                      .generation = generation,
                      .connect_timeout = std::min(impl.config.heartbeat_timeout, kFenceTimeout),
                      .timeout = kFenceTimeout},
        fence_wait);
  };
  // promote --force with the old primary connected here: fence the other
  // copies first, with the generation this copy is about to take, and end
  // the session here last. Fenced there, the old primary stops (its
  // persists fail) while this copy still has all it acknowledged; ended
  // here first, it would go on with the others under a generation this
  // copy never has, and they would be split-brained against it
  // (docs/failover.md, section 1).
  uint64_t chosen = 0;
  std::vector<FenceOutcome> fenced_first;
  if (force && writer_connected) {
    {
      std::lock_guard lock(volume->metadata_mutex);
      if (volume->metadata != nullptr) chosen = volume->metadata->fresh_generation();
    }
    if (chosen != 0) fenced_first = fence(chosen);
  }
  auto promoted = promote_copy(volume_name, force, chosen);
  if (!promoted.ok()) {
    std::lock_guard volume_lock(volume->mutex);
    if (chosen != 0) volume->fence_round = 0;  // the fences at `chosen` stop being retried
    return promoted.status();
  }
  PromoteResult result = std::move(promoted).value();
  // Otherwise fence every other node's copy now, also when the copy was
  // promoted already (a new round of fences, at once).
  result.fences = chosen != 0 && result.generation == chosen ? std::move(fenced_first)
                                                             : fence(result.generation);
  return result;
}

Result<PromoteResult> Target::promote_copy(const std::string& volume_name, bool force,
                                           uint64_t chosen) {
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
  PromoteResult result{.volume = volume_name, .node = node};
  auto remember = [&] {
    volume->copy_status = CopyStatus{.info = md->info()};
    volume->copy_status_at = std::chrono::steady_clock::now();
  };
  if (info.promoted) {
    result.generation = previous;
    result.previous = info.generations.history[0];
    result.already_promoted = true;
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
  PMIRROR_ASSIGN_OR_RETURN(uint64_t generation, md->new_generation(chosen));
  // A forced promotion of an inconsistent copy declares its bytes the new
  // generation's data: from here on they are what the volume holds.
  if (!info.consistent) PMIRROR_RETURN_IF_ERROR(md->set_consistent(true));
  // A fence another promotion left on this copy names a primary this one
  // now replaces.
  PMIRROR_RETURN_IF_ERROR(md->clear_fence());
  PMIRROR_RETURN_IF_ERROR(md->set_promoted(true));
  PMIRROR_RETURN_IF_ERROR(md->set_clean(true));
  remember();
  log::warn(
      "volume {}: promoted on node {}{}: generation {} (previous {}); sessions are refused until "
      "`pmirrorctl demote {}`",
      volume_name, node, force ? " (forced)" : "", hex16(generation), hex16(previous), volume_name);
  result.generation = generation;
  result.previous = previous;
  result.forced = force;
  return result;
}

Result<DemoteResult> Target::demote(const std::string& volume_name) {
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
  volume->copy_status = CopyStatus{.info = info};
  volume->copy_status_at = std::chrono::steady_clock::now();
  // A fence of this node's promotion landing from now on could undo a newer
  // promotion's on that copy: the retries stop.
  abandon_fences(*volume, "the copy was demoted on node " + node);
  if (was_promoted) {
    log::warn("volume {}: demoted on node {}: a replica again at generation {}", volume_name, node,
              hex16(info.generations.current));
  }
  return DemoteResult{.volume = volume_name, .node = node, .generation = info.generations.current};
}

Result<DownResult> Target::set_down(const std::string& volume_name, bool down) {
  Impl& impl = *impl_;
  const std::string& node = impl.config.node;
  auto volume = impl.find(volume_name);
  if (volume == nullptr) {
    return Status(Errc::kNotFound, "no volume '" + volume_name + "' on node " + node);
  }
  DownResult result{.volume = volume_name, .node = node, .down = down};
  result.changed = volume->down_by_operator.exchange(down) != down;
  if (!down) {
    if (result.changed) log::warn("volume {}: up again on node {}: served", volume_name, node);
    return result;
  }
  // Set first: a session that claims the volume after the writer below
  // let go sees it and is refused.
  bool evicted = false;
  WriterClaim claim;
  Status ended = claim.claim_for_command(*volume, "pmirrorctl down on node " + node,
                                         /*evict=*/true, down_text(volume_name, node), kEvictWait,
                                         Errc::kClosed, &evicted);
  if (!ended.ok()) {
    if (result.changed) volume->down_by_operator = false;
    return ended;
  }
  result.sessions_ended = evicted ? 1 : 0;
  if (result.changed) {
    log::warn("volume {}: down by an operator on node {}: {} session ended; new ones are refused",
              volume_name, node, result.sessions_ended);
  }
  return result;
}

TargetStatus Target::status() const {
  TargetStatus out;
  out.node = impl_->config.node;
  out.pid = static_cast<int>(::getpid());
  out.started_at = impl_->started_at;
  const std::string transport(transport::kind_name(impl_->config.transport));
  for (auto& v : impl_->all_volumes()) {
    VolumeStatus s;
    s.name = v->config.name;
    s.path = v->config.path;
    s.size = v->region->size();
    s.is_pmem = v->region->is_pmem();
    s.backing = region::backing_name(v->region->backing());
    s.methods = v->methods;
    s.failure = v->region->failure().message();
    s.down_by_operator = v->down_by_operator.load();
    std::deque<std::shared_ptr<SessionRecord>> sessions;
    {
      std::lock_guard lock(v->mutex);
      s.writer = v->writer;
      sessions = v->sessions;
      s.fences = v->last_fences;
      s.fences_at = v->last_fences_at;
    }
    auto recorded = impl_->state->get(v->config.name);
    if (recorded.ok()) {
      s.generation = recorded->generation;
      s.last_sequence = recorded->last_sequence;
    }
    s.applied_sequence = v->applied_sequence.load();
    for (auto& record : sessions) {
      auto snapshot = record->state.snapshot();
      s.sessions.push_back(SessionStatus{.peer = record->peer,
                                         .transport = transport,
                                         .state = snapshot.state,
                                         .since = snapshot.since,
                                         .reason = snapshot.reason,
                                         .acknowledged_sequence = record->acknowledged.load(),
                                         .persists = record->persists.load(),
                                         .bytes = record->bytes.load(),
                                         .errors = record->errors.load()});
    }
    s.copy = impl_->copy_status(*v);
    out.volumes.push_back(std::move(s));
  }
  const transport::AdmissionCounters listener = impl_->listener->admission();
  const AdmissionStats& ours = impl_->admission;
  out.admission = AdmissionStatus{
      .unauthenticated = std::max(listener.unauthenticated, ours.unauthenticated.load()),
      .evicted = listener.evicted,
      .timed_out = listener.timed_out + ours.timed_out.load(),
      .dropped = listener.dropped,
      .refused = listener.failed + ours.refused.load(),
      .authentication_failures = ours.authentication_failures.load(),
      .max_unauthenticated = impl_->options.max_unauthenticated,
      .max_unauthenticated_per_source = impl_->options.max_unauthenticated_per_source,
      .handshake_timeout = impl_->options.handshake_timeout};
  return out;
}

}  // namespace pmirror::target
