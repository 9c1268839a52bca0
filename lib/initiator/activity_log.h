// The primary's activity log, as the persist pipeline uses it: before a
// persist is posted, every kActivityExtent extent it touches is in the copy
// metadata's log, so that a primary that crashes knows what may differ from
// its replicas (docs/replica-recovery.md, "The primary crashes").
//
// It keeps the extents logged in the metadata and, for each, the last
// sequence that touched it: an extent's slot may be given to another once
// that persist is settled. That is the extent's state, not a second record
// of the persist (the PersistLedger has that); it outlives the persists.
//
// Guarded by the volume mutex (volume_core.h).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "metadata/metadata.h"

namespace pmirror::initiator {

class ActivityLog {
 public:
  ActivityLog(metadata::CopyMetadata& meta, std::string volume);

  // Whether every extent of the range is logged already (no metadata
  // write needed).
  bool covers(uint64_t offset, uint64_t length) const;
  // Logs the extents of the range. An extent logged earlier may give up its
  // slot if its last persist is at or below `settled`. kResourceExhausted
  // when every slot holds an extent with a persist above it.
  Status add(uint64_t offset, uint64_t length, uint64_t settled);
  // Persist `sequence` touches the range's extents (logged).
  void note(uint64_t sequence, uint64_t offset, uint64_t length);

 private:
  metadata::CopyMetadata& meta_;
  std::string volume_;
  std::unordered_map<uint64_t, uint64_t> last_sequence_;  // logged extent -> last persist
};

}  // namespace pmirror::initiator
