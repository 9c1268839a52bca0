#include "initiator/volume_core.h"

#include <algorithm>

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
