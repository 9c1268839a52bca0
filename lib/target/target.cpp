#include "target/target.h"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <list>
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

class Target::Impl {
 public:
  config::DaemonConfig config;
  TargetOptions options;
  std::unique_ptr<state::StateStore> state;
  std::list<ServedVolume> volumes;  // stable addresses: sessions hold pointers
  std::unique_ptr<transport::Listener> listener;
  std::atomic<bool> stopping{false};

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

  void checkpoint_loop() {
    std::unique_lock lock(checkpoint_mutex);
    while (!stopping.load()) {
      checkpoint_wake.wait_for(lock, options.checkpoint_interval);
      for (auto& volume : volumes) {
        if (Status saved = checkpoint(*state, volume); !saved.ok()) {
          spdlog::error("volume {}: checkpoint: {}", volume.config.name, saved.to_string());
        }
      }
    }
  }

  ServedVolume* find(const std::string& name) {
    for (auto& v : volumes) {
      if (v.config.name == name) return &v;
    }
    return nullptr;
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
    region::OpenOptions open_options;
    open_options.path = volume_config.path;
    open_options.size = volume_config.size;
    open_options.create = volume_config.create;
    auto region = region::Region::open(open_options);
    if (!region.ok()) {
      return region.status().with_context("volume '" + volume_config.name + "'");
    }
    auto& served = impl->volumes.emplace_back();
    served.config = volume_config;
    served.region = std::move(region).value();
    served.methods = offered_methods(config.transport, volume_config, *served.region);
    auto recorded = impl->state->get_or_create(volume_config.name);
    if (!recorded.ok()) {
      return recorded.status().with_context("volume '" + volume_config.name + "' state");
    }
    spdlog::info("volume {}: {} ({} bytes, {}, pmem={}), generation {}, last sequence {}",
                 volume_config.name, volume_config.path, served.region->size(),
                 region::backing_name(served.region->backing()), served.region->is_pmem(),
                 recorded->generation, recorded->last_sequence);
  }

  transport::ConnectionOptions connection_options;
  auto listener = transport::listen(config.transport, config.listen_address, config.port,
                                    connection_options);
  if (!listener.ok()) {
    return listener.status().with_context(
        "listening on " + config.listen_address + ":" + std::to_string(config.port) + " (" +
        std::string(transport::kind_name(config.transport)) + ")");
  }
  impl->listener = std::move(listener).value();
  for (auto& volume : impl->volumes) {
    Status registrable = impl->listener->check_registrable(
        volume.region->data(), volume.region->size(),
        transport::kRemoteWrite | transport::kRemoteRead);
    if (!registrable.ok()) {
      return registrable.with_context("volume '" + volume.config.name + "' (" +
                                      volume.config.path + ", " +
                                      std::string(region::backing_name(volume.region->backing())) +
                                      ") cannot be served over " +
                                      std::string(transport::kind_name(config.transport)));
    }
  }
  spdlog::info("listening on {}:{} ({}), {} volume(s)", config.listen_address,
               impl->listener->port(), transport::kind_name(config.transport),
               impl->volumes.size());
  return std::unique_ptr<Target>(new Target(std::move(impl)));
}

Status Target::run() {
  Impl& impl = *impl_;
  SessionContext context{impl.options, *impl.state,
                         [&impl](const std::string& name) { return impl.find(name); },
                         impl.stopping};
  Status result;
  impl.checkpointer = std::thread([&impl] { impl.checkpoint_loop(); });
  while (!impl.stopping.load()) {
    auto accepted = impl.listener->accept(std::chrono::milliseconds(200));
    impl.reap(false);
    if (!accepted.ok()) {
      if (impl.stopping.load()) break;
      // A failed accept (a peer that hung up mid-handshake, garbage) must not
      // take the daemon down: log it and keep serving.
      spdlog::warn("accept: {}", accepted.status().to_string());
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
  return result;
}

void Target::stop() {
  if (impl_->stopping.exchange(true)) return;
  if (impl_->listener) impl_->listener->shutdown();
  impl_->checkpoint_wake.notify_all();
}

uint16_t Target::port() const { return impl_->listener->port(); }

std::vector<VolumeStatus> Target::status() const {
  std::vector<VolumeStatus> out;
  for (auto& v : impl_->volumes) {
    VolumeStatus s;
    s.name = v.config.name;
    s.path = v.config.path;
    s.size = v.region->size();
    s.is_pmem = v.region->is_pmem();
    s.methods = v.methods;
    {
      std::lock_guard lock(v.mutex);
      s.writer = v.writer;
    }
    auto recorded = impl_->state->get_or_create(v.config.name);
    if (recorded.ok()) {
      s.generation = recorded->generation;
      s.last_sequence = recorded->last_sequence;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace pmirror::target
