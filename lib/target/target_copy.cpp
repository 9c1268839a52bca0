// The copy's side of the target: the writer claim (sessions and operator
// commands exclude each other), opening the copy's metadata pool, and how
// status shows it.
#include <algorithm>
#include <cstdio>

#include "target/target_internal.h"

namespace pmirror::target {

void WriterClaim::release() {
  if (volume_ == nullptr) return;
  {
    std::lock_guard lock(volume_->mutex);
    if (command_) {
      volume_->admin.clear();
    } else {
      volume_->writer.clear();
      volume_->writer_leaving = false;
    }
  }
  volume_->writer_released.notify_all();
  volume_ = nullptr;
}

void WriterClaim::leaving() {
  if (volume_ == nullptr || command_) return;
  std::lock_guard lock(volume_->mutex);
  volume_->writer_leaving = true;
}

bool WriterClaim::try_claim(ServedVolume& volume, const std::string& who, std::string& holder) {
  std::unique_lock lock(volume.mutex);
  volume.writer_released.wait_for(lock, std::chrono::seconds(5), [&] {
    return (volume.writer.empty() || !volume.writer_leaving) && volume.admin.empty();
  });
  if (!volume.admin.empty()) {
    holder = volume.admin;
    return false;
  }
  if (!volume.writer.empty()) {
    holder = volume.writer;
    return false;
  }
  volume.writer = who;
  volume_ = &volume;
  command_ = false;
  return true;
}

Status WriterClaim::claim_for_command(ServedVolume& volume, const std::string& command, bool evict,
                                      const std::string& evict_reason,
                                      std::chrono::milliseconds wait, Errc evict_code,
                                      bool* evicted) {
  if (evicted != nullptr) *evicted = false;
  const std::string& name = volume.config.name;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::unique_lock lock(volume.mutex);
  // Another command (a demote by this node's promoter, a fence) holds the
  // copy for moments: wait for it rather than refuse. A fence refused here
  // left a copy unfenced because its promoter was demoting it at that
  // instant (found by FailoverTest under ASan).
  if (!volume.writer_released.wait_until(lock, deadline, [&] { return volume.admin.empty(); })) {
    return Status(Errc::kBusy, "volume '" + name + "' is busy: " + volume.admin +
                                   " is under way; try again when it has finished");
  }
  // A session refused after claiming (say, because the copy is promoted)
  // lets go within moments: give it that long before calling it a writer.
  volume.writer_released.wait_until(
      lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(500)),
      [&] { return volume.writer.empty(); });
  if (!volume.writer.empty() && !volume.writer_leaving) {
    if (!evict) {
      return Status(Errc::kBusy, "volume '" + name + "' has a writer: " + volume.writer +
                                     " is still connected as primary; stop it first, or use "
                                     "--force, which ends that session");
    }
    volume.evict_reason = evict_reason;
    volume.evict_code = evict_code;
    volume.evict = true;
    volume.wake_sessions_locked();
    if (evicted != nullptr) *evicted = true;
  }
  volume.admin = command;  // from here on, no new session claims the volume
  bool released =
      volume.writer_released.wait_until(lock, deadline, [&] { return volume.writer.empty(); });
  volume.evict = false;
  if (!released) {
    std::string writer = volume.writer;
    volume.admin.clear();
    lock.unlock();
    volume.writer_released.notify_all();
    return Status(Errc::kBusy, "volume '" + name + "': the session of " + writer +
                                   " did not end within " + std::to_string(wait.count()) +
                                   " ms; try again");
  }
  volume_ = &volume;
  command_ = true;
  return Status::Ok();
}

std::string copy_metadata_path(const config::VolumeConfig& volume) {
  return volume.metadata_path.empty() ? metadata::default_metadata_path(volume.path, volume.name)
                                      : volume.metadata_path;
}

metadata::CopyMetadata::Options metadata_options(const ServedVolume& volume, bool create) {
  metadata::CopyMetadata::Options options;
  options.path = copy_metadata_path(volume.config);
  options.volume_size = volume.region->size();
  options.chunk_size = volume.config.chunk;
  options.create_if_missing = create;
  return options;
}

Result<std::unique_ptr<metadata::CopyMetadata>> open_copy_metadata(const ServedVolume& volume,
                                                                   const std::string& node,
                                                                   bool create) {
  auto options = metadata_options(volume, create);
  auto opened = metadata::CopyMetadata::open(options);
  if (opened.ok()) return opened;
  const std::string& name = volume.config.name;
  if (opened.status().code() == Errc::kBusy) {
    return Status(Errc::kBusy, "the copy of volume '" + name + "' on node " + node +
                                   " is open as primary by a process on that node (metadata "
                                   "pool " +
                                   options.path + " is locked)");
  }
  return opened.status().with_context("volume '" + name + "' on node " + node);
}

std::string hex16(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

}  // namespace pmirror::target
