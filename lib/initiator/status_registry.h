// One control socket per process, whatever the number of open volumes:
// the first volume to open starts it at <runtime dir>/initiator-<pid>.sock,
// the last to close stops it. pmirrorctl finds it there.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "supervisor/supervisor.h"

namespace pmirror::initiator {

using StatusFn = std::function<nlohmann::json()>;
// A volume's control commands other than status (resync, verify): the
// request as received, routed by its "volume" field.
using CommandFn = std::function<Result<nlohmann::json>(const nlohmann::json& request)>;

// Unregisters on destruction. Move-only.
class StatusRegistration {
 public:
  StatusRegistration() = default;
  explicit StatusRegistration(uint64_t id) : id_(id) {}
  ~StatusRegistration();
  StatusRegistration(StatusRegistration&& other) noexcept : id_(other.id_) { other.id_ = 0; }
  StatusRegistration& operator=(StatusRegistration&& other) noexcept;
  StatusRegistration(const StatusRegistration&) = delete;
  StatusRegistration& operator=(const StatusRegistration&) = delete;

 private:
  uint64_t id_ = 0;
};

StatusRegistration register_volume(std::string name, StatusFn status, CommandFn command = {});
// Sends a replica state change to `pmirrorctl events` subscribers.
void publish_event(const supervisor::StateChange& change);

}  // namespace pmirror::initiator
