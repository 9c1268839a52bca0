#include "initiator/volume_core.h"

#include <algorithm>
#include <string>

#include "common/log.h"

namespace pmirror::initiator {

void SupervisorWakeup::wake() {
  std::lock_guard lock(mutex_);
  wake_.notify_all();
}

void SupervisorWakeup::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

bool SupervisorWakeup::sleep(std::chrono::microseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!stopping_ && timeout.count() > 0) wake_.wait_for(lock, timeout);
  return !stopping_;
}

VolumeCore::VolumeCore(const VolumeOptions& volume_options,
                       std::unique_ptr<region::Region> local_copy,
                       std::unique_ptr<metadata::CopyMetadata> copy_metadata)
    : options(volume_options),
      local(std::move(local_copy)),
      meta(std::move(copy_metadata)),
      chunk_size(meta->info().chunk_size),
      chunks(meta->info().chunks) {}

Status VolumeCore::check_lease(uint64_t now) {
  if (!lease || !fenced.ok()) return fenced;
  // Read again: the promoter may have published since the caller looked.
  const uint64_t deadline = lease->deadline_ns();
  if (deadline != 0 && now < deadline) return Status::Ok();
  // Lapsed, for good: a renewal that came late could be let through only if
  // nothing else happened meanwhile (a replica dropped here would have taken
  // a new generation); the promoter stops the application at the same
  // deadline anyway, and starts it again if it takes the volume again.
  const std::string& node = lease->node();
  std::string why;
  if (deadline == 0) {
    why = "volume " + options.name + ": no lease: pmirror-promoter on node " + node +
          " gave it up (it handed the volume over, lost the key, or stopped)";
  } else {
    why = "volume " + options.name + ": lease lost " +
          std::to_string((now - deadline) / 1'000'000) + " ms ago: pmirror-promoter on node " +
          node + " did not renew it (etcd unreachable or the promoter stopped)";
  }
  why += "; the primary stops writing before another node may take over (pmirror-promoter(8))";
  log::error("{}; every persist fails from now on: close the volume", why);
  fenced = Status(Errc::kLeaseLost, std::move(why));
  sync_changed.notify_all();  // a persist blocked for replicas gives up
  return fenced;
}

protocol::Lineage VolumeCore::lineage(size_t meta_index) const {
  protocol::Lineage lineage;
  const metadata::Generations generations = meta->info().generations;
  lineage.current = generations.current;
  static_assert(protocol::kGenerationHistory == metadata::kHistory);
  std::copy(generations.history.begin(), generations.history.end(), lineage.history.begin());
  const std::vector<metadata::PeerInfo> peers = meta->peers();
  if (meta_index < peers.size()) lineage.left_behind_at = peers[meta_index].bitmap_generation;
  return lineage;
}

uint64_t VolumeCore::chunk_bytes(uint64_t dirty) const {
  return std::min(dirty * chunk_size, local->size());
}

std::unique_lock<std::mutex> app_lock(VolumeCore& core) {
  core.app_waiting.fetch_add(1);
  std::unique_lock lock(core.mutex);
  core.app_waiting.fetch_sub(1);
  return lock;
}

}  // namespace pmirror::initiator
