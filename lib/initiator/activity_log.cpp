#include "initiator/activity_log.h"

#include <utility>

namespace pmirror::initiator {

ActivityLog::ActivityLog(metadata::CopyMetadata& meta, std::string volume)
    : meta_(meta), volume_(std::move(volume)) {}

bool ActivityLog::covers(uint64_t offset, uint64_t length) const {
  uint64_t first = offset / metadata::kActivityExtent;
  uint64_t last = (offset + length - 1) / metadata::kActivityExtent;
  for (uint64_t extent = first; extent <= last; ++extent) {
    if (last_sequence_.count(extent) == 0) return false;
  }
  return true;
}

Status ActivityLog::add(uint64_t offset, uint64_t length, uint64_t settled) {
  auto written = meta_.activity_begin(offset, length, [&](uint64_t extent) {
    auto it = last_sequence_.find(extent);
    return it == last_sequence_.end() || it->second <= settled;
  });
  if (!written.ok()) return written.status().with_context("activity log of '" + volume_ + "'");
  // The log may have given up slots: keep only what it holds now.
  std::unordered_map<uint64_t, uint64_t> kept;
  for (uint64_t extent : meta_.activity_extents()) {
    auto it = last_sequence_.find(extent);
    kept[extent] = it == last_sequence_.end() ? 0 : it->second;
  }
  last_sequence_ = std::move(kept);
  return Status::Ok();
}

void ActivityLog::note(uint64_t sequence, uint64_t offset, uint64_t length) {
  uint64_t first = offset / metadata::kActivityExtent;
  uint64_t last = (offset + length - 1) / metadata::kActivityExtent;
  for (uint64_t extent = first; extent <= last; ++extent) last_sequence_[extent] = sequence;
}

}  // namespace pmirror::initiator
