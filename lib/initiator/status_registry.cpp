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

  uint64_t add(std::string name, StatusFn status, CommandFn command) {
    std::lock_guard lock(mutex_);
    uint64_t id = ++last_id_;
    volumes_.emplace(id, Entry{std::move(name), std::move(status), std::move(command)});
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
    auto server =
        control::Server::start(control::initiator_socket_path(::getpid()),
                               [this](const nlohmann::json& request) -> Result<nlohmann::json> {
                                 if (request.value("command", "") == "status") return status();
                                 return command(request);
                               });
    if (!server.ok()) {
      // Status is a convenience: the volume works without it.
      spdlog::warn(
          "libpmirror: no control socket, `pmirrorctl status` will not see this "
          "process: {}",
          server.status().message());
      start_failed_ = true;
      return;
    }
    server_ = std::move(server).value();
  }

  // Routes a command to the volume it names.
  Result<nlohmann::json> command(const nlohmann::json& request) {
    const std::string command = request.value("command", "");
    if (command != "resync" && command != "verify") return control::unknown_command(request);
    if (!request.contains("volume") || !request["volume"].is_string()) {
      return Status(Errc::kInvalidArgument, "'" + command + "' needs a \"volume\" string");
    }
    const std::string volume = request["volume"].get<std::string>();
    std::shared_lock calls(calls_mutex_);
    CommandFn target;
    {
      std::lock_guard lock(mutex_);
      for (auto& [id, entry] : volumes_) {
        if (entry.name == volume && entry.command) target = entry.command;
      }
    }
    if (!target) {
      return Status(Errc::kNotFound,
                    "volume '" + volume + "' is not open in process " + std::to_string(::getpid()));
    }
    return target(request);
  }

  nlohmann::json status() {
    std::shared_lock calls(calls_mutex_);
    std::vector<StatusFn> functions;
    {
      std::lock_guard lock(mutex_);
      for (auto& [id, entry] : volumes_) functions.push_back(entry.status);
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
  struct Entry {
    std::string name;
    StatusFn status;
    CommandFn command;
  };
  std::map<uint64_t, Entry> volumes_;
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

StatusRegistration register_volume(std::string name, StatusFn status, CommandFn command) {
  return StatusRegistration(
      Registry::instance().add(std::move(name), std::move(status), std::move(command)));
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
