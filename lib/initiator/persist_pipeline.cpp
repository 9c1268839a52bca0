#include "initiator/persist_pipeline.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/log.h"

namespace pmirror::initiator {

PersistPipeline::PersistPipeline(VolumeCore& core, PersistLedger& ledger, ActivityLog& activity,
                                 Peers& peers)
    : core_(core), ledger_(ledger), activity_(activity), peers_(peers) {
  pending_.reserve(kMaxReplicas);
}

Status PersistPipeline::check_range(uint64_t offset, uint64_t length) const {
  const uint64_t size = core_.local->size();
  if (offset > size || length > size - offset) {
    return Status(Errc::kInvalidArgument, "range [" + std::to_string(offset) + ", +" +
                                              std::to_string(length) + ") is outside volume '" +
                                              core_.options.name + "' of " + std::to_string(size) +
                                              " bytes");
  }
  return Status::Ok();
}

bool PersistPipeline::holds(const Peer& peer, uint64_t sequence) {
  return peer.replica->done_upto() >= sequence ||
         (peer.in_sync_since > sequence && !peer.replica->awaiting(sequence));
}

Status PersistPipeline::wait(std::unique_lock<std::mutex>& lock, uint64_t sequence) {
  if (sequence <= ledger_.acknowledged()) return Status::Ok();
  if (sequence >= ledger_.next_sequence()) {
    return Status(Errc::kInvalidArgument,
                  "sequence " + std::to_string(sequence) + " was never started");
  }
  // No transport wait covers several connections yet: look at every
  // replica still needed without waiting, then wait a short slice on the
  // one most likely to answer first.
  constexpr auto kWaitSlice = std::chrono::milliseconds(1);
  // A follower looks again after this even if nobody wakes it (a collector
  // wakes it as soon as it has collected anything).
  constexpr auto kFollowerWait = std::chrono::milliseconds(10);
  const uint32_t required = peers_.required_acks();
  std::vector<Peer*>& pending = pending_;  // kept from wait to wait: no allocation
  while (true) {
    if (!core_.fenced.ok()) return core_.fenced;
    uint32_t acknowledged = 0;
    pending.clear();
    std::string problems;
    auto note = [&](const std::string& problem) {
      if (!problems.empty()) problems += "; ";
      problems += problem;
    };
    for (const auto& peer : peers_.all()) {
      if (!peer->live() || !peer->in_sync) {
        note(Peers::describe(*peer));
        continue;
      }
      if (Status polled = peer->replica->poll(std::chrono::milliseconds(0)); !polled.ok()) {
        note(polled.message());
        peers_.drop(*peer, polled);
        continue;
      }
      if (holds(*peer, sequence)) {
        ++acknowledged;
      } else {
        pending.push_back(peer.get());
      }
    }
    peers_.settle();
    if (acknowledged >= required) break;
    if (acknowledged + pending.size() >= required) {
      if (core_.collecting) {
        // Another waiter collects: what it collects may be ours too.
        core_.collected.wait_for(lock, kFollowerWait);
        continue;
      }
      Peer* next = *std::min_element(pending.begin(), pending.end(), [](Peer* a, Peer* b) {
        return a->replica->in_flight_count() < b->replica->in_flight_count();
      });
      collect(lock, *next->replica, kWaitSlice);
      continue;
    }
    // A lapsed lease says why better than the replicas it cost (a frozen
    // primary thawed: its connections were shut by the fence).
    PMIRROR_RETURN_IF_ERROR(check_lease());
    if (!core_.options.block_when_insufficient) {
      return Status(Errc::kConnectionError,
                    "persist " + std::to_string(sequence) + " of volume '" + core_.options.name +
                        "' is durable on " + std::to_string(acknowledged) + " of the " +
                        std::to_string(required) + " replicas required: " + problems);
    }
    // on_insufficient: block -- until enough replicas are back in sync.
    log::debug("volume {}: persist {} waits for replicas: {}", core_.options.name, sequence,
               problems);
    core_.sync_changed.wait_for(lock, std::chrono::milliseconds(500));
  }
  ledger_.acknowledge(sequence);
  return Status::Ok();
}

void PersistPipeline::collect(std::unique_lock<std::mutex>& lock, Replica& replica,
                              std::chrono::milliseconds timeout) {
  // The reservation is taken before the mutex is let go: a replica dropped
  // meanwhile is closed and destroyed only after the collector is out.
  std::unique_lock reservation = replica.reserve_collect();
  core_.collecting = true;
  lock.unlock();
  replica.collect(timeout);
  reservation.unlock();  // the last touch of `replica`
  lock.lock();
  core_.collecting = false;
  core_.collected.notify_all();
}

Status PersistPipeline::log_activity(uint64_t sequence, std::span<const protocol::Range> ranges) {
  for (const protocol::Range& range : ranges) {
    if (!activity_.covers(range.offset, range.length)) {
      uint64_t settled = std::min(ledger_.acknowledged(), peers_.durable_everywhere());
      PMIRROR_RETURN_IF_ERROR(activity_.add(range.offset, range.length, settled));
    }
  }
  for (const protocol::Range& range : ranges) activity_.note(sequence, range.offset, range.length);
  return Status::Ok();
}

namespace {

// Pieces of one persist touch at most this many activity extents, so that
// each fits in the activity log while others are in flight.
constexpr uint64_t kMaxExtentsPerPersist = metadata::kActivityLogSlots / 4;

uint64_t extents_touched(const protocol::Range& range) {
  return (range.offset + range.length - 1) / metadata::kActivityExtent -
         range.offset / metadata::kActivityExtent + 1;
}

}  // namespace

Result<uint64_t> PersistPipeline::start(std::unique_lock<std::mutex>& lock, uint64_t offset,
                                        uint64_t length) {
  constexpr uint64_t kPiece = kMaxExtentsPerPersist * metadata::kActivityExtent;
  uint64_t sequence = 0;
  while (length > 0) {
    // Pieces end on an extent boundary, so each touches at most
    // kMaxExtentsPerPersist extents.
    uint64_t piece = std::min(length, kPiece - offset % metadata::kActivityExtent);
    const protocol::Range range{offset, piece};
    Result<uint64_t> started = start_piece(lock, std::span(&range, 1), {});
    if (!started.ok()) {
      // The bytes are in the local copy already, and maybe on no replica.
      peers_.mark_unsent(offset, length);
      return started.status();
    }
    sequence = *started;
    offset += piece;
    length -= piece;
  }
  return sequence;
}

Result<uint64_t> PersistPipeline::start(std::unique_lock<std::mutex>& lock,
                                        std::span<const protocol::Range> ranges,
                                        std::span<const std::byte> snapshot,
                                        std::span<const size_t> group_starts) {
  // As few persists as the limits allow, in order: a run of ranges that
  // fits (kMaxRangesPerPersist ranges and group flushes, kMaxExtentsPerPersist
  // extents, the snapshot buffer) is one persist; a range too large for one
  // alone without a snapshot is started as pieces (start above). Groups
  // share a persist only where every live replica keeps their order inside
  // one (APM); under GPSPM each group ends a persist.
  bool groups_share = true;
  for (const auto& peer : peers_.all()) {
    if (peer->live() && !peer->replica->uses_apm()) groups_share = false;
  }
  size_t next_group = 0;  // group_starts[next_group]: the next group's first range
  std::vector<size_t>& group_ends = group_ends_scratch_;
  uint64_t sequence = 0;
  size_t first = 0;
  size_t snapshot_at = 0;
  auto fail = [&](size_t from, const Status& why) -> Result<uint64_t> {
    for (size_t i = from; i < ranges.size(); ++i) {
      peers_.mark_unsent(ranges[i].offset, ranges[i].length);
    }
    return why;
  };
  while (first < ranges.size()) {
    size_t end = first;
    uint64_t extents = 0, bytes = 0;
    group_ends.clear();
    while (next_group < group_starts.size() && group_starts[next_group] <= first) ++next_group;
    while (end < ranges.size() && end - first + group_ends.size() < kMaxRangesPerPersist) {
      const bool group_starts_here =
          next_group < group_starts.size() && group_starts[next_group] == end;
      if (end > first && group_starts_here && !groups_share) break;
      uint64_t more = extents_touched(ranges[end]);
      if (end > first && (extents + more > kMaxExtentsPerPersist ||
                          (!snapshot.empty() &&
                           bytes + ranges[end].length > core_.staging.capacity()) ||
                          (group_starts_here &&
                           end - first + group_ends.size() + 1 >= kMaxRangesPerPersist))) {
        break;
      }
      if (group_starts_here) {
        if (end > first) group_ends.push_back(end - first);
        ++next_group;
      }
      extents += more;
      bytes += ranges[end].length;
      ++end;
    }
    Result<uint64_t> started = Status::Ok();
    if (snapshot.empty() && end == first + 1 && extents > kMaxExtentsPerPersist) {
      started = start(lock, ranges[first].offset, ranges[first].length);
    } else if (!snapshot.empty() && (bytes > core_.staging.capacity() ||
                                     extents > kMaxExtentsPerPersist)) {
      started = Status(Errc::kInvalidArgument,
                       "a snapshot persist of a range of " + std::to_string(bytes) +
                           " bytes: more than the snapshot buffer (" +
                           std::to_string(core_.staging.capacity()) + " bytes) or " +
                           std::to_string(kMaxExtentsPerPersist) + " activity extents take");
    } else {
      started = start_piece(lock, ranges.subspan(first, end - first),
                            snapshot.empty() ? snapshot : snapshot.subspan(snapshot_at, bytes),
                            group_ends);
    }
    if (!started.ok()) return fail(first, started.status());
    sequence = *started;
    snapshot_at += bytes;
    first = end;
  }
  return sequence;
}

Result<uint64_t> PersistPipeline::reserve_staging(std::unique_lock<std::mutex>& lock,
                                                  uint64_t bytes) {
  while (true) {
    if (auto at = core_.staging.reserve(bytes, ledger_.staging_released())) return *at;
    // The buffer holds persists some replica may still read: wait for the
    // acknowledgements, then for the replicas beyond `ack` (each up to
    // operation_timeout; one that does not answer is dropped, and what it
    // held is dirty for it).
    if (ledger_.acknowledged() < ledger_.last_started()) {
      PMIRROR_RETURN_IF_ERROR(wait(lock, ledger_.last_started()));
      continue;
    }
    bool drained_any = false;
    for (const auto& peer : peers_.all()) {
      if (!peer->live() || peer->replica->in_flight_count() == 0) continue;
      drained_any = true;
      if (Status drained = peer->replica->drain(); !drained.ok()) peers_.drop(*peer, drained);
    }
    peers_.settle();
    if (!drained_any) {
      if (auto at = core_.staging.reserve(bytes, ledger_.staging_released())) return *at;
      return Status(Errc::kInternal, "the snapshot buffer has no room for " +
                                         std::to_string(bytes) + " bytes with nothing in flight");
    }
  }
}

Result<uint64_t> PersistPipeline::start_piece(std::unique_lock<std::mutex>& lock,
                                              std::span<const protocol::Range> ranges,
                                              std::span<const std::byte> snapshot,
                                              std::span<const size_t> group_ends) {
  if (!core_.fenced.ok()) return core_.fenced;
  const uint32_t max_in_flight = core_.options.max_in_flight;
  // Keep at most max_in_flight persists outstanding.
  if (ledger_.last_started() - ledger_.acknowledged() >= max_in_flight) {
    PMIRROR_RETURN_IF_ERROR(wait(lock, ledger_.next_sequence() - max_in_flight));
  }
  std::optional<uint64_t> staged;
  if (!snapshot.empty()) {
    PMIRROR_ASSIGN_OR_RETURN(staged, reserve_staging(lock, snapshot.size()));
  }
  // The lease is looked at after the only waits above (so that a persist
  // that waited for room is not posted on a deadline read before it) and
  // before anything of the persist reaches the activity log or a replica:
  // a persist refused here left no trace anywhere but the local mapping.
  PMIRROR_RETURN_IF_ERROR(check_lease());
  if (staged) {
    std::memcpy(core_.staging.base() + core_.staging.offset_of(*staged), snapshot.data(),
                snapshot.size());
  }
  uint64_t sequence = ledger_.next_sequence();
  Status logged = log_activity(sequence, ranges);
  if (!logged.ok() && logged.code() == Errc::kResourceExhausted) {
    // Every slot holds an extent with a persist in flight: let them finish.
    PMIRROR_RETURN_IF_ERROR(wait(lock, ledger_.last_started()));
    logged = log_activity(sequence, ranges);
  }
  PMIRROR_RETURN_IF_ERROR(logged);
  uint64_t length = 0;
  for (const protocol::Range& range : ranges) length += range.length;
  ledger_.start(ranges, staged ? *staged + snapshot.size() : 0);
  // Replicas that are not connected, or lagging, get the ranges marked
  // dirty first (a local 8-byte persist per new word, no round trip);
  // connected ones -- in sync or being brought up to date -- get the
  // persist itself.
  for (const auto& peer : peers_.all()) {
    for (const protocol::Range& range : ranges) {
      if (!peer->live()) {
        peers_.mark_dirty(*peer, range.offset, range.length);
      } else if (peer->lagging) {
        peers_.mark_missed(*peer, range.offset, range.length);
      }
    }
  }
  std::optional<size_t> staged_at;
  if (staged) staged_at = core_.staging.offset_of(*staged);
  for (const auto& peer : peers_.all()) {
    if (!peer->live() || peer->lagging) continue;
    // A replica that does not count for ack, or without which ack is
    // still met, never holds the persist back: if it cannot take it now,
    // it lags. The others are waited for (ack: all waits for every one).
    bool may_lag = !peer->in_sync || peers_.in_sync_count() > peers_.required_acks();
    Status posted =
        peer->replica->post_persist(sequence, ranges, staged_at, /*may_wait=*/!may_lag, group_ends);
    if (posted.ok()) {
      peer->bytes += length;
    } else if (peer->replica->failed()) {
      peers_.drop(*peer, posted);
    } else {
      peers_.start_lagging(*peer, posted);
    }
  }
  // The local copy is persisted while the replicas work (unless the
  // application did it already: pmirror-run's interposer).
  if (!core_.options.local_persisted_by_caller) {
    for (const protocol::Range& range : ranges) {
      Status local_persist = core_.local->persist(range.offset, range.length);
      if (!local_persist.ok()) return local_persist.with_context("local copy");
    }
  }
  return sequence;
}

}  // namespace pmirror::initiator
