// The control edge: where libpmirror meets `pmirrorctl`, and the only place
// in libpmirror that makes JSON.
//
// One control socket per process, whatever the number of open volumes: the
// first volume to open starts it at <runtime dir>/initiator-<pid>.sock, the
// last to close stops it. pmirrorctl finds it there. A volume registers
// typed functions (status, resync, verify); requests and replies are turned
// from and into the JSON of docs/control.md here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "initiator/initiator.h"
#include "initiator/volume_status.h"
#include "supervisor/supervisor.h"

namespace pmirror::initiator {

// What the control socket may ask of an open volume. Each function takes
// the volume's locks itself; each is called from the control socket's
// threads until the registration is gone.
struct VolumeControls {
  std::function<VolumeStatus()> status;
  std::function<Result<ResyncStarted>(const std::string& peer, bool full)> resync;
  std::function<Result<std::vector<VerifyPeerResult>>(const std::string& peer, bool mark_dirty)>
      verify;
  std::function<Result<std::vector<PeerSwitched>>(const std::string& peer, bool connect)>
      set_connected;
  uint64_t chunk_size = 0;  // for verify replies
};

// Unregisters on destruction: once it is gone, the volume's functions are
// never called again. Move-only.
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

StatusRegistration register_volume(std::string name, VolumeControls controls);
// Sends a replica state change to `pmirrorctl events` subscribers.
void publish_event(const supervisor::StateChange& change);
// The volume's object of docs/control.md, serialized (Volume::status_json).
std::string status_json(const VolumeStatus& status);

}  // namespace pmirror::initiator
