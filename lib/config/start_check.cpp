// What pmirrord's start refuses on this host before it creates, maps or
// locks anything (config.h: check_state_pool_path, check_volume_paths): the
// start calls these, and so do the checks, so that both say the same.
#include "common/preflight.h"
#include "config/config.h"

namespace pmirror::config {

Status check_state_pool_path(const std::string& state_pool) {
  if (state_pool.empty()) {
    return Status(Errc::kInvalidArgument, "state pool path is empty; set daemon.state_pool")
        .with_context("opening the state pool");
  }
  return preflight::pool_path(state_pool, "state pool", /*will_create=*/true)
      .with_context("opening the state pool");
}

Status check_volume_paths(const VolumeConfig& volume, const std::string& node) {
  auto found = preflight::volume_path(volume.name, volume.path, volume.size, volume.create);
  if (!found.ok()) return found.status();
  if (volume.metadata_path.empty()) return Status::Ok();
  // As the target opens it (lib/target, open_copy_metadata): created when
  // missing, its errors named by volume and node.
  return preflight::pool_path(volume.metadata_path, "copy metadata", /*will_create=*/true)
      .with_context("volume '" + volume.name + "' on node " + node);
}

}  // namespace pmirror::config
