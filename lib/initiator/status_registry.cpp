#include "initiator/status_registry.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <shared_mutex>

#include "control/control.h"

namespace pmirror::initiator {
namespace {

class Registry {
 public:
  static Registry& instance() {
    static Registry registry;  // never destroyed before volumes: they hold registrations
    return registry;
  }

  uint64_t add(StatusFn status) {
    std::lock_guard lock(mutex_);
    uint64_t id = ++last_id_;
    volumes_.emplace(id, std::move(status));
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

  void publish(const nlohmann::json& event) {
    std::lock_guard lock(mutex_);
    if (server_) server_->publish(event);
  }

 private:
  void start_locked() {
    auto server = control::Server::start(
        control::initiator_socket_path(::getpid()),
        [this](const nlohmann::json& request) -> Result<nlohmann::json> {
          if (request.value("command", "") != "status") return control::unknown_command(request);
          return status();
        });
    if (!server.ok()) {
      // Status is a convenience: the volume works without it.
      spdlog::warn("libpmirror: no control socket, `pmirrorctl status` will not see this "
                   "process: {}",
                   server.status().message());
      start_failed_ = true;
      return;
    }
    server_ = std::move(server).value();
  }

  nlohmann::json status() {
    std::shared_lock calls(calls_mutex_);
    std::vector<StatusFn> functions;
    {
      std::lock_guard lock(mutex_);
      for (auto& [id, fn] : volumes_) functions.push_back(fn);
    }
    nlohmann::json volumes = nlohmann::json::array();
    for (auto& fn : functions) volumes.push_back(fn());
    char host[256] = "";
    ::gethostname(host, sizeof host - 1);
    return {{"schema_version", control::kSchemaVersion},
            {"process",
             {{"kind", "initiator"}, {"pid", ::getpid()}, {"node", host}, {"version", "0.1.0"}}},
            {"volumes", std::move(volumes)}};
  }

  std::shared_mutex calls_mutex_;  // held shared while volumes' status functions run
  std::mutex mutex_;
  uint64_t last_id_ = 0;
  std::map<uint64_t, StatusFn> volumes_;
  std::unique_ptr<control::Server> server_;
  bool start_failed_ = false;
};

}  // namespace

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

StatusRegistration register_volume(StatusFn status) {
  return StatusRegistration(Registry::instance().add(std::move(status)));
}

void publish_event(const supervisor::StateChange& change) {
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  Registry::instance().publish({{"time", supervisor::format_time(change.time)},
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
