#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "config/config.h"
#include "control/control.h"
#include "initiator/initiator.h"
#include "initiator/replica.h"
#include "initiator/status_registry.h"
#include "initiator/sync_decision.h"
#include "metadata/metadata.h"
#include "protocol/protocol.h"
#include "region/region.h"
#include "supervisor/supervisor.h"

namespace pmirror::initiator {

using Clock = std::chrono::steady_clock;
using supervisor::PeerState;

namespace {

// A persist not yet durable on every live replica: if one of them is lost,
// its range is marked dirty for it.
struct InFlight {
  uint64_t sequence = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// What a supervisor pass left to do: nothing soon (sleep), more at once,
// or a copy in flight to poll shortly.
enum class Work { kIdle, kWaiting, kBusy };  // ordered: std::max picks the most urgent

// A replica as the volume's supervisor sees it: the live session (if any),
// its connection state, what is recorded dirty for it, and its resync.
struct Slot {
  Slot(const VolumeOptions& options, const ReplicaSpec& replica_spec, supervisor::EventSink sink)
      : spec(replica_spec),
        label(replica_spec.node.empty()
                  ? replica_spec.address + ":" + std::to_string(replica_spec.port)
                  : replica_spec.node),
        state(options.name, label, PeerState::kConnecting, std::move(sink)),
        backoff(options.reconnect_initial, options.reconnect_max) {}

  ReplicaSpec spec;
  std::string label;
  size_t peer = 0;                   // index in the copy metadata
  std::unique_ptr<Replica> replica;  // null while disconnected
  // A reconnect attempt under way (valid while it runs or is not collected).
  std::future<Result<std::unique_ptr<Replica>>> connecting;
  supervisor::PeerStateMachine state;
  supervisor::Backoff backoff;
  Clock::time_point next_attempt{};
  Clock::time_point last_ping{};
  bool in_sync = false;          // counts towards the ack policy
  uint64_t in_sync_since = 0;    // first sequence started after it became in sync
  uint64_t told_generation = 0;  // the generation the replica knows it holds
  uint64_t remote_generation = 0;

  // The resync under way (while `resync_active`).
  bool resync_active = false;
  bool resync_full = false;
  // The resync copy on its way (one at a time): its chunks are cleared
  // when it is durable.
  bool copy_in_flight = false;
  uint64_t copy_first = 0;
  uint64_t copy_run = 0;
  uint64_t copy_length = 0;
  uint64_t resync_cursor = 0;  // next chunk to look at
  uint64_t resync_total_bytes = 0;
  uint64_t resync_done_bytes = 0;
  Clock::time_point resync_started{};
  double resync_rate = 0;  // bytes/s, smoothed
  double rate_tokens = 0;  // the rate limiter's allowance, bytes
  Clock::time_point rate_refilled{};

  // Since open.
  uint64_t resynced_chunks = 0;
  uint64_t resynced_bytes = 0;
  uint64_t resyncs = 0;
  supervisor::LatencyWindow latency;
  uint64_t persists = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;

  bool live() const { return replica != nullptr; }
};

// Refusals that mean the configuration is wrong: opening fails on them
// rather than running degraded and hiding the mistake.
bool is_misconfiguration(Errc code) {
  return code == Errc::kPermissionDenied || code == Errc::kNotFound ||
         code == Errc::kInvalidArgument || code == Errc::kUnsupported;
}

// A replica's copy was promoted: this node is no longer the primary, and
// writing on without it would make a split brain certain.
bool is_demotion(Errc code) { return code == Errc::kFailedPrecondition; }

bool is_refusal(Errc code) {
  return is_misconfiguration(code) || is_demotion(code) || code == Errc::kBusy;
}

}  // namespace

class Volume::Impl {
 public:
  VolumeOptions options;
  std::unique_ptr<region::Region> local;
  std::unique_ptr<metadata::CopyMetadata> meta;
  uint64_t chunk_size = 0;
  uint64_t chunks = 0;
  std::vector<std::unique_ptr<Slot>> slots;  // the vector is fixed after open; contents: mutex

  mutable std::mutex mutex;
  // Application threads waiting for `mutex`: the supervisor lets them in
  // between resync steps rather than taking the mutex straight back.
  std::atomic<int> app_waiting{0};
  // Signalled when a replica becomes in sync (blocked persists, open).
  std::condition_variable sync_changed;
  uint64_t next_sequence = 1;   // guarded by mutex
  uint64_t last_completed = 0;  // every persist up to here is durable on `ack` replicas
  std::deque<std::pair<uint64_t, Clock::time_point>> started;  // for latency; guarded by mutex
  std::deque<InFlight> in_flight;                              // guarded by mutex
  // Extents in the activity log -> the last sequence that touched each.
  std::unordered_map<uint64_t, uint64_t> activity;  // guarded by mutex
  Clock::time_point last_activity = Clock::now();
  std::chrono::system_clock::time_point opened_at = std::chrono::system_clock::now();

  std::mutex supervisor_mutex;
  std::condition_variable supervisor_wake;
  bool stopping = false;  // guarded by supervisor_mutex
  std::thread supervisor_thread;
  StatusRegistration registration;

  uint32_t required_acks() const {
    return options.ack == 0 ? static_cast<uint32_t>(slots.size()) : options.ack;
  }

  uint32_t in_sync_count() const {
    uint32_t count = 0;
    for (const auto& slot : slots) count += slot->live() && slot->in_sync ? 1 : 0;
    return count;
  }

  uint64_t current_generation() const { return meta->info().generations.current; }

  Status check_range(uint64_t offset, uint64_t length) const {
    if (offset > local->size() || length > local->size() - offset) {
      return Status(Errc::kInvalidArgument, "range [" + std::to_string(offset) + ", +" +
                                                std::to_string(length) + ") is outside volume '" +
                                                options.name + "' of " +
                                                std::to_string(local->size()) + " bytes");
    }
    return Status::Ok();
  }

  // Every persist up to here is durable on every live replica.
  uint64_t durable_everywhere() const {
    uint64_t upto = next_sequence - 1;
    for (const auto& slot : slots) {
      if (slot->live()) upto = std::min(upto, slot->replica->done_upto());
    }
    return upto;
  }

  void trim_in_flight() {
    uint64_t upto = durable_everywhere();
    while (!in_flight.empty() && in_flight.front().sequence <= upto) in_flight.pop_front();
  }

  // From now on the primary records what the replica misses: if it was not
  // tracked, a new generation starts (and every untracked replica is
  // tracked from the old one). Mutex held.
  void ensure_tracked(Slot& slot) {
    auto peers = meta->peers();
    if (slot.peer < peers.size() && peers[slot.peer].bitmap_generation != 0) return;
    auto bumped = meta->new_generation();
    if (!bumped.ok()) {
      spdlog::error("volume {}: starting a new generation for replica {}: {}", options.name,
                    slot.label, bumped.status().to_string());
      return;
    }
    spdlog::info("volume {}: replica {} left behind; generation is now {}", options.name,
                 slot.label, generation_hex(*bumped));
  }

  void mark_dirty(Slot& slot, uint64_t offset, uint64_t length) {
    if (auto marked = meta->mark(slot.peer, offset, length); !marked.ok()) {
      // The local copy is still right; only an exact resync is at stake.
      spdlog::error(
          "volume {}: recording [{}, +{}) dirty for {}: {}; a full resync will be "
          "needed",
          options.name, offset, length, slot.label, marked.status().to_string());
      (void)meta->mark_all(slot.peer);
    }
  }

  // The replica is lost: forget its session, record what it missed,
  // reconnect later. Mutex held.
  void drop(Slot& slot, const Status& why, PeerState to = PeerState::kDisconnected) {
    uint64_t done = slot.replica ? slot.replica->done_upto() : 0;
    if (slot.replica) {
      for (const auto& persist : in_flight) {
        if (persist.sequence > done) mark_dirty(slot, persist.offset, persist.length);
      }
    }
    ensure_tracked(slot);
    ++slot.errors;
    if (slot.replica) slot.replica->close();
    slot.replica.reset();
    slot.in_sync = false;
    slot.resync_active = false;
    slot.copy_in_flight = false;
    slot.next_attempt = Clock::now() + slot.backoff.next();
    slot.state.transition(to, why.message());
    trim_in_flight();
  }

  // Waits (mutex held) until `sequence` is durable on enough replicas.
  Status wait_locked(std::unique_lock<std::mutex>& lock, uint64_t sequence) {
    if (sequence <= last_completed) return Status::Ok();
    if (sequence >= next_sequence) {
      return Status(Errc::kInvalidArgument,
                    "sequence " + std::to_string(sequence) + " was never started");
    }
    Clock::time_point start_time = Clock::now();
    while (!started.empty() && started.front().first < sequence) started.pop_front();
    if (!started.empty() && started.front().first == sequence) start_time = started.front().second;

    while (true) {
      uint32_t acknowledged = 0;
      std::string problems;
      for (auto& slot : slots) {
        if (!slot->live() || !slot->in_sync) {
          if (!problems.empty()) problems += "; ";
          auto snapshot = slot->state.snapshot();
          problems += "replica " + slot->label + " is " +
                      std::string(supervisor::state_name(snapshot.state)) +
                      (snapshot.reason.empty() ? "" : " (" + snapshot.reason + ")");
          continue;
        }
        if (slot->in_sync_since > sequence) {
          // It became in sync after this persist started: the resync that
          // brought it there copied the range.
          ++acknowledged;
          continue;
        }
        Status waited = slot->replica->wait_for(sequence);
        if (!waited.ok()) {
          if (!problems.empty()) problems += "; ";
          problems += waited.message();
          drop(*slot, waited);
          continue;
        }
        ++acknowledged;
        ++slot->persists;
        slot->latency.add(
            std::chrono::duration<double, std::micro>(Clock::now() - start_time).count());
      }
      last_activity = Clock::now();
      trim_in_flight();
      if (acknowledged >= required_acks()) break;
      if (!options.block_when_insufficient) {
        return Status(Errc::kConnectionError,
                      "persist " + std::to_string(sequence) + " of volume '" + options.name +
                          "' is durable on " + std::to_string(acknowledged) + " of the " +
                          std::to_string(required_acks()) + " replicas required: " + problems);
      }
      // on_insufficient: block -- until enough replicas are back in sync.
      spdlog::debug("volume {}: persist {} waits for replicas: {}", options.name, sequence,
                    problems);
      sync_changed.wait_for(lock, std::chrono::milliseconds(500));
    }
    last_completed = std::max(last_completed, sequence);
    return Status::Ok();
  }

  // Puts the extents of [offset, +length) into the activity log before the
  // persist is posted (a primary that crashes then knows what may differ).
  Status log_activity(uint64_t sequence, uint64_t offset, uint64_t length) {
    uint64_t first = offset / metadata::kActivityExtent;
    uint64_t last = (offset + length - 1) / metadata::kActivityExtent;
    bool logged = true;
    for (uint64_t extent = first; extent <= last && logged; ++extent) {
      logged = activity.count(extent) != 0;
    }
    if (!logged) {
      uint64_t durable = std::min(last_completed, durable_everywhere());
      auto written = meta->activity_begin(offset, length, [&](uint64_t extent) {
        auto it = activity.find(extent);
        return it == activity.end() || it->second <= durable;
      });
      if (!written.ok()) {
        return written.status().with_context("activity log of '" + options.name + "'");
      }
      std::unordered_map<uint64_t, uint64_t> kept;
      for (uint64_t extent : meta->activity_extents()) {
        auto it = activity.find(extent);
        kept[extent] = it == activity.end() ? 0 : it->second;
      }
      activity = std::move(kept);
    }
    for (uint64_t extent = first; extent <= last; ++extent) activity[extent] = sequence;
    return Status::Ok();
  }

  // A persist larger than a quarter of the activity log is started as
  // several, so that each fits in the log; they complete in order, so the
  // last one's sequence stands for the whole.
  Result<uint64_t> start_locked(std::unique_lock<std::mutex>& lock, uint64_t offset,
                                uint64_t length) {
    constexpr uint64_t kPiece = metadata::kActivityLogSlots / 4 * metadata::kActivityExtent;
    uint64_t sequence = 0;
    while (length > 0) {
      // Pieces end on an extent boundary, so each touches at most
      // kActivityLogSlots / 4 extents.
      uint64_t piece = std::min(length, kPiece - offset % metadata::kActivityExtent);
      PMIRROR_ASSIGN_OR_RETURN(sequence, start_piece_locked(lock, offset, piece));
      offset += piece;
      length -= piece;
    }
    return sequence;
  }

  Result<uint64_t> start_piece_locked(std::unique_lock<std::mutex>& lock, uint64_t offset,
                                      uint64_t length) {
    // Keep at most max_in_flight persists outstanding.
    if (next_sequence - 1 - last_completed >= options.max_in_flight) {
      PMIRROR_RETURN_IF_ERROR(wait_locked(lock, next_sequence - options.max_in_flight));
    }
    uint64_t sequence = next_sequence;
    Status logged = log_activity(sequence, offset, length);
    if (!logged.ok() && logged.code() == Errc::kResourceExhausted) {
      // Every slot holds an extent with a persist in flight: let them finish.
      PMIRROR_RETURN_IF_ERROR(wait_locked(lock, next_sequence - 1));
      logged = log_activity(sequence, offset, length);
    }
    PMIRROR_RETURN_IF_ERROR(logged);
    ++next_sequence;
    started.emplace_back(sequence, Clock::now());
    // Replicas that are not connected get the range marked dirty first (a
    // local 8-byte persist per new word, no round trip); connected ones --
    // in sync or being brought up to date -- get the persist itself.
    for (auto& slot : slots) {
      if (!slot->live()) mark_dirty(*slot, offset, length);
    }
    in_flight.push_back({sequence, offset, length});
    for (auto& slot : slots) {
      if (!slot->live()) continue;
      Status posted = slot->replica->post_persist(sequence, offset, length);
      if (posted.ok()) {
        slot->bytes += length;
      } else {
        drop(*slot, posted);
      }
    }
    // The local copy is persisted while the replicas work.
    Status local_persist = local->persist(offset, length);
    last_activity = Clock::now();
    if (!local_persist.ok()) return local_persist.with_context("local copy");
    return sequence;
  }

  // ---------------------------------------------------------- (re)connect

  // A new session with the replica: decide from both copies' generations
  // whether it is in sync, needs the dirty chunks or everything, or must be
  // refused. Mutex held.
  void begin_session(Slot& slot, std::unique_ptr<Replica> replica) {
    if (replica->last_sequence() >= next_sequence) {
      // The replica recorded sequences beyond ours (another primary wrote
      // to it while this one ran without it). Sequences must rise on every
      // target: jump past it, which is only simple with nothing in flight.
      if (next_sequence - 1 != last_completed || !in_flight.empty()) {
        replica->close();
        slot.next_attempt = Clock::now() + std::chrono::milliseconds(50);
        slot.state.transition(PeerState::kDisconnected,
                              "its last sequence " + std::to_string(replica->last_sequence()) +
                                  " is beyond ours; retrying once no persist is in flight");
        return;
      }
      next_sequence = replica->last_sequence() + 1;
      last_completed = next_sequence - 1;
    }
    slot.replica = std::move(replica);
    Replica& session = *slot.replica;
    const RemoteCopy& remote = session.remote_copy();
    slot.remote_generation = remote.generations.current;
    if (session.remote_unclean() && session.remote_activity_extent_size() != 0) {
      // An old primary that crashed: what its activity log names may differ.
      for (uint64_t extent : session.remote_activity_extents()) {
        uint64_t offset = extent * session.remote_activity_extent_size();
        if (offset >= local->size()) continue;
        mark_dirty(slot, offset,
                   std::min(session.remote_activity_extent_size(), local->size() - offset));
      }
    }
    auto peers = meta->peers();
    metadata::PeerInfo peer = slot.peer < peers.size() ? peers[slot.peer] : metadata::PeerInfo{};
    metadata::Generations ours = meta->info().generations;
    SyncDecision decision = decide_sync(ours, peer, remote, options.overwrite_split_brain);
    spdlog::info("volume {}: replica {}: {} ({})", options.name, slot.label,
                 sync_action_name(decision.action), decision.reason);
    switch (decision.action) {
      case SyncAction::kPeerNewer: {
        session.close();
        slot.replica.reset();
        ensure_tracked(slot);
        slot.next_attempt = Clock::now() + options.reconnect_max;
        slot.state.transition(PeerState::kRefused, decision.reason);
        return;
      }
      case SyncAction::kSplitBrain: {
        session.abandon(Status(Errc::kSplitBrain, "primary " + options.identity + " of '" +
                                                      options.name + "': " + decision.reason));
        slot.replica.reset();
        ensure_tracked(slot);
        slot.next_attempt = Clock::now() + options.reconnect_max;
        slot.state.transition(PeerState::kSplitBrain, decision.reason);
        return;
      }
      case SyncAction::kInSync: {
        (void)meta->set_peer_uuid(slot.peer, remote.uuid);
        if (peer.bitmap_generation != 0) (void)meta->untrack_peer(slot.peer);
        become_in_sync(slot, "session open, " + decision.reason);
        return;
      }
      case SyncAction::kFullSync:
      case SyncAction::kResyncDirty: {
        if (decision.action == SyncAction::kFullSync) {
          if (Status all = meta->mark_all(slot.peer); !all.ok()) {
            drop(slot, all.with_context("recording a full sync"));
            return;
          }
        }
        (void)meta->set_peer_uuid(slot.peer, remote.uuid);
        ensure_tracked(slot);
        start_resync(slot, decision.action == SyncAction::kFullSync, decision.reason);
        return;
      }
    }
  }

  void become_in_sync(Slot& slot, const std::string& reason) {
    slot.in_sync = true;
    slot.in_sync_since = next_sequence;
    slot.told_generation = slot.replica->remote_copy().generations.current;
    slot.backoff.reset();
    slot.state.transition(PeerState::kConnected, reason);
    sync_changed.notify_all();
  }

  void start_resync(Slot& slot, bool full, const std::string& reason) {
    // The replica's copy is a mix of two generations until the resync ends.
    if (slot.in_sync == false) {
      Status marked = slot.replica->set_generation(slot.remote_generation, /*consistent=*/false);
      if (!marked.ok()) {
        drop(slot, marked);
        return;
      }
    }
    slot.resync_active = true;
    slot.resync_full = full;
    slot.resync_cursor = 0;
    slot.resync_done_bytes = 0;
    slot.resync_total_bytes = std::min(meta->dirty_count(slot.peer) * chunk_size, local->size());
    slot.resync_started = Clock::now();
    slot.resync_rate = 0;
    slot.rate_tokens = 0;
    slot.rate_refilled = Clock::now();
    if (!slot.in_sync) {
      slot.state.transition(
          PeerState::kSyncing,
          reason + "; copying " + std::to_string(slot.resync_total_bytes) + " bytes");
    }
  }

  // Connecting can take seconds: it runs on its own thread, so that the
  // supervisor keeps pinging and resyncing the other replicas meanwhile.
  // Mutex held.
  void start_reconnect(Slot& slot) {
    slot.state.transition(PeerState::kConnecting,
                          "reconnect attempt " + std::to_string(slot.backoff.attempts()));
    slot.connecting = std::async(std::launch::async, [this, &slot] {
      return Replica::connect({options, slot.spec, local->data(), local->size()});
    });
  }

  // Mutex held; the attempt has finished.
  void finish_reconnect(Slot& slot) {
    auto replica = slot.connecting.get();
    if (!replica.ok()) {
      slot.next_attempt = Clock::now() + slot.backoff.next();
      slot.state.transition(
          is_refusal(replica.status().code()) ? PeerState::kRefused : PeerState::kDisconnected,
          replica.status().message());
      return;
    }
    begin_session(slot, std::move(replica).value());
  }

  // ---------------------------------------------------------------- resync

  // Collects the copy in flight, if it is durable, and posts the next run of
  // dirty chunks. The mutex is held only to post and to poll, never across
  // the round trip, so persists go on while a copy travels. Mutex held.
  Work resync_step(Slot& slot) {
    bool completed = false;
    if (slot.copy_in_flight) {
      auto done = slot.replica->resync_done();
      if (!done.ok()) {
        drop(slot, done.status());
        return Work::kIdle;
      }
      if (!*done) return Work::kWaiting;
      complete_copy(slot);
      completed = true;
    }
    auto now = Clock::now();
    uint64_t step = std::max(options.resync_step, chunk_size);
    if (options.resync_rate != 0) {
      double elapsed = std::chrono::duration<double>(now - slot.rate_refilled).count();
      slot.rate_refilled = now;
      slot.rate_tokens = std::min(slot.rate_tokens + elapsed * double(options.resync_rate),
                                  double(std::max<uint64_t>(step, options.resync_rate / 10)));
      if (slot.rate_tokens < double(chunk_size)) return Work::kIdle;
      step = std::min<uint64_t>(step, uint64_t(slot.rate_tokens));
    }
    uint64_t first = meta->next_dirty(slot.peer, slot.resync_cursor);
    if (first >= chunks && slot.resync_cursor != 0) {
      // Wrap once: a chunk before the cursor may have been marked since.
      slot.resync_cursor = 0;
      first = meta->next_dirty(slot.peer, 0);
    }
    if (first >= chunks) {
      finish_resync(slot);
      return completed ? Work::kBusy : Work::kIdle;
    }
    uint64_t run = 1;
    while (first + run < chunks && (run + 1) * chunk_size <= step &&
           meta->is_dirty(slot.peer, first + run)) {
      ++run;
    }
    uint64_t offset = first * chunk_size;
    uint64_t length = std::min(run * chunk_size, local->size() - offset);
    if (Status posted = slot.replica->post_resync(offset, length); !posted.ok()) {
      drop(slot, posted);
      return Work::kIdle;
    }
    slot.copy_in_flight = true;
    slot.copy_first = first;
    slot.copy_run = run;
    slot.copy_length = length;
    slot.resync_cursor = first + run;
    if (options.resync_rate != 0) slot.rate_tokens -= double(length);
    return Work::kWaiting;
  }

  // The copy in flight is durable on the replica: its chunks are clean.
  void complete_copy(Slot& slot) {
    slot.copy_in_flight = false;
    for (uint64_t chunk = slot.copy_first; chunk < slot.copy_first + slot.copy_run; ++chunk) {
      if (Status cleared = meta->clear(slot.peer, chunk); !cleared.ok()) {
        spdlog::error("volume {}: clearing chunk {} for {}: {}", options.name, chunk, slot.label,
                      cleared.to_string());
      }
    }
    slot.resync_done_bytes += slot.copy_length;
    slot.resynced_chunks += slot.copy_run;
    slot.resynced_bytes += slot.copy_length;
    double seconds = std::chrono::duration<double>(Clock::now() - slot.resync_started).count();
    if (seconds > 0) slot.resync_rate = double(slot.resync_done_bytes) / seconds;
  }

  void finish_resync(Slot& slot) {
    uint64_t generation = current_generation();
    Status told = slot.replica->set_generation(generation, /*consistent=*/true);
    if (!told.ok()) {
      drop(slot, told);
      return;
    }
    if (Status untracked = meta->untrack_peer(slot.peer); !untracked.ok()) {
      spdlog::warn("volume {}: replica {}: {}", options.name, slot.label, untracked.to_string());
    }
    slot.resync_active = false;
    ++slot.resyncs;
    std::string what = "in sync after copying " + std::to_string(slot.resync_done_bytes) +
                       " bytes" + (slot.resync_full ? " (full sync)" : " (dirty chunks)");
    if (slot.in_sync) {
      slot.told_generation = generation;
      slot.state.transition(PeerState::kConnected, what);
    } else {
      become_in_sync(slot, what);
      slot.told_generation = generation;
    }
  }

  // An in-sync replica learns the primary's new generation, so that it is
  // no longer counted as left behind. Mutex held.
  void announce_generation(Slot& slot) {
    uint64_t generation = current_generation();
    if (slot.told_generation == generation) return;
    Status told = slot.replica->set_generation(generation, /*consistent=*/true);
    if (!told.ok()) {
      drop(slot, told);
      return;
    }
    slot.told_generation = generation;
    if (meta->dirty_count(slot.peer) == 0) (void)meta->untrack_peer(slot.peer);
  }

  // One supervisor pass: reconnect, resync a step, heartbeat. Returns the
  // most urgent work left (kBusy > kWaiting > kIdle).
  Work supervise() {
    Work work = Work::kIdle;
    for (auto& slot_ptr : slots) {
      Slot& slot = *slot_ptr;
      std::unique_lock lock(mutex);
      if (slot.connecting.valid()) {
        if (slot.connecting.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
          continue;
        }
        finish_reconnect(slot);
      } else if (!slot.live() && Clock::now() >= slot.next_attempt) {
        start_reconnect(slot);
        continue;
      }
      if (!slot.live()) continue;
      if (slot.resync_active) {
        work = std::max(work, resync_step(slot));
      } else if (slot.in_sync) {
        announce_generation(slot);
      }
      // Persists carry messages the target hears; resync copies may not (a
      // tcp or RDMA Write is no message), so a replica being resynced is
      // pinged like an idle one.
      if (slot.live() &&
          Clock::now() - std::max(last_activity, slot.last_ping) >= options.heartbeat_interval) {
        slot.last_ping = Clock::now();
        if (Status alive = slot.replica->heartbeat(); !alive.ok()) drop(slot, alive);
      }
    }
    std::lock_guard lock(mutex);
    trim_in_flight();
    return work;
  }

  void supervisor_loop() {
    std::unique_lock wake_lock(supervisor_mutex);
    Work work = Work::kIdle;
    while (!stopping) {
      if (work == Work::kIdle) {
        supervisor_wake.wait_for(wake_lock, std::chrono::milliseconds(50));
      } else if (work == Work::kWaiting) {
        // A resync copy is on its way: look again shortly.
        supervisor_wake.wait_for(wake_lock, std::chrono::microseconds(100));
      }
      if (stopping) break;
      wake_lock.unlock();
      work = supervise();
      if (work != Work::kIdle) {
        for (int spins = 0; app_waiting.load() > 0 && spins < 1000; ++spins) {
          std::this_thread::sleep_for(std::chrono::microseconds(10));
        }
      }
      wake_lock.lock();
    }
  }

  void wake_supervisor() {
    std::lock_guard lock(supervisor_mutex);
    supervisor_wake.notify_all();
  }

  Slot* find_slot(const std::string& peer) {
    for (auto& slot : slots) {
      if (slot->label == peer || slot->spec.node == peer ||
          slot->spec.address + ":" + std::to_string(slot->spec.port) == peer) {
        return slot.get();
      }
    }
    return nullptr;
  }

  std::string peer_names() const {
    std::string names;
    for (const auto& slot : slots) names += (names.empty() ? "" : ", ") + slot->label;
    return names;
  }

  // ---------------------------------------------------------------- verify

  // The chunks in [first, first+count) whose hashes differ. Mutex held.
  Result<std::vector<uint64_t>> compare_chunks(Slot& slot, uint64_t first, uint64_t count) {
    uint64_t offset = first * chunk_size;
    uint64_t length = std::min(count * chunk_size, local->size() - offset);
    auto remote = slot.replica->verify_chunks(offset, length, chunk_size);
    if (!remote.ok()) return remote.status();
    // The same function the target uses, over the local copy.
    std::vector<uint64_t> ours = protocol::hash_chunks(
        std::span<const std::byte>(local->data() + offset, length), chunk_size);
    std::vector<uint64_t> differing;
    for (uint64_t i = 0; i < remote->size() && i < ours.size(); ++i) {
      if ((*remote)[i] != ours[i]) differing.push_back(first + i);
    }
    return differing;
  }

  VerifyPeerResult verify_peer(Slot& slot, bool mark) {
    VerifyPeerResult result;
    result.peer = slot.label;
    std::vector<uint64_t> suspects;
    const uint64_t batch = protocol::kMaxVerifyChunks;
    for (uint64_t first = 0; first < chunks; first += batch) {
      // Persists go on between batches.
      std::lock_guard lock(mutex);
      if (!slot.live()) {
        result.status =
            Status(Errc::kConnectionError, "replica " + slot.label + " is not connected");
        return result;
      }
      uint64_t count = std::min(batch, chunks - first);
      auto differing = compare_chunks(slot, first, count);
      if (!differing.ok()) {
        result.status = differing.status();
        drop(slot, differing.status());
        return result;
      }
      suspects.insert(suspects.end(), differing->begin(), differing->end());
      result.chunks_compared += count;
      result.bytes_compared += std::min(count * chunk_size, local->size() - first * chunk_size);
    }
    // A chunk may have differed only because a persist was on its way:
    // check those again with nothing in flight.
    std::unique_lock lock(mutex);
    if (!suspects.empty()) {
      (void)wait_locked(lock, next_sequence - 1);
      if (!slot.live()) {
        result.status =
            Status(Errc::kConnectionError, "replica " + slot.label + " was lost during verify");
        return result;
      }
    }
    std::vector<uint64_t> confirmed;
    for (uint64_t chunk : suspects) {
      auto differing = compare_chunks(slot, chunk, 1);
      if (!differing.ok()) {
        result.status = differing.status();
        drop(slot, differing.status());
        return result;
      }
      if (!differing->empty()) confirmed.push_back(chunk);
    }
    for (uint64_t chunk : confirmed) {
      uint64_t offset = chunk * chunk_size;
      uint64_t length = std::min(chunk_size, local->size() - offset);
      if (!result.mismatches.empty() &&
          result.mismatches.back().first + result.mismatches.back().second == offset) {
        result.mismatches.back().second += length;
      } else {
        result.mismatches.emplace_back(offset, length);
      }
    }
    if (mark && !confirmed.empty()) {
      for (uint64_t chunk : confirmed) mark_dirty(slot, chunk * chunk_size, chunk_size);
      result.marked_dirty = confirmed.size();
      // Known to differ: it does not count for acks until repaired.
      ensure_tracked(slot);
      slot.in_sync = false;
      start_resync(slot, false,
                   "verify found " + std::to_string(confirmed.size()) + " chunks that differ");
      wake_supervisor();
    }
    spdlog::info("volume {}: verify of {}: {} chunks compared, {} differ", options.name, slot.label,
                 result.chunks_compared, confirmed.size());
    return result;
  }

  // -------------------------------------------------------------- control

  Result<nlohmann::json> command(const nlohmann::json& request) {
    const std::string command = request.value("command", "");
    std::string peer = request.contains("peer") && request["peer"].is_string()
                           ? request["peer"].get<std::string>()
                           : std::string();
    if (command == "resync") {
      if (peer.empty()) return Status(Errc::kInvalidArgument, "resync needs a \"peer\"");
      bool full = request.value("full", false);
      PMIRROR_RETURN_IF_ERROR(resync(peer, full));
      std::lock_guard lock(mutex);
      Slot* slot = find_slot(peer);
      return nlohmann::json{{"volume", options.name},
                            {"peer", slot->label},
                            {"started", true},
                            {"full", full},
                            {"dirty_bytes", slot->resync_total_bytes}};
    }
    if (command == "verify") {
      bool mark = request.value("mark_dirty", false);
      PMIRROR_ASSIGN_OR_RETURN(auto results, verify(peer, mark));
      nlohmann::json peers = nlohmann::json::array();
      for (const auto& result : results) {
        nlohmann::json mismatches = nlohmann::json::array();
        for (const auto& [offset, length] : result.mismatches) {
          mismatches.push_back({{"offset", offset}, {"length", length}});
        }
        nlohmann::json entry{{"name", result.peer},
                             {"chunks_compared", result.chunks_compared},
                             {"bytes_compared", result.bytes_compared},
                             {"mismatches", std::move(mismatches)},
                             {"mismatch_count", result.mismatches.size()},
                             {"marked_dirty", result.marked_dirty}};
        if (!result.status.ok()) entry["error"] = result.status.message();
        peers.push_back(std::move(entry));
      }
      return nlohmann::json{
          {"volume", options.name}, {"chunk_size", chunk_size}, {"peers", std::move(peers)}};
    }
    return control::unknown_command(request);
  }

  Status resync(const std::string& peer, bool full) {
    std::lock_guard lock(mutex);
    Slot* slot = find_slot(peer);
    if (slot == nullptr) {
      return Status(Errc::kNotFound, "volume '" + options.name + "' has no replica '" + peer +
                                         "' (replicas: " + peer_names() + ")");
    }
    if (!slot->live()) {
      auto snapshot = slot->state.snapshot();
      return Status(Errc::kFailedPrecondition,
                    "replica " + slot->label + " is " +
                        std::string(supervisor::state_name(snapshot.state)) +
                        "; a resync starts by itself when it reconnects");
    }
    if (full) PMIRROR_RETURN_IF_ERROR(meta->mark_all(slot->peer));
    ensure_tracked(*slot);
    start_resync(*slot, full, full ? "full resync requested" : "resync requested");
    wake_supervisor();
    return Status::Ok();
  }

  Result<std::vector<VerifyPeerResult>> verify(const std::string& peer, bool mark) {
    std::vector<Slot*> targets;
    {
      std::lock_guard lock(mutex);
      if (!peer.empty()) {
        Slot* slot = find_slot(peer);
        if (slot == nullptr) {
          return Status(Errc::kNotFound, "volume '" + options.name + "' has no replica '" + peer +
                                             "' (replicas: " + peer_names() + ")");
        }
        targets.push_back(slot);
      } else {
        for (auto& slot : slots) {
          if (slot->live()) targets.push_back(slot.get());
        }
      }
    }
    if (targets.empty()) {
      return Status(Errc::kFailedPrecondition,
                    "no replica of '" + options.name + "' is connected to verify against");
    }
    std::vector<VerifyPeerResult> results;
    for (Slot* slot : targets) results.push_back(verify_peer(*slot, mark));
    return results;
  }

  nlohmann::json status() const {
    std::lock_guard lock(mutex);
    nlohmann::json peers = nlohmann::json::array();
    auto recorded = meta->peers();
    for (const auto& slot : slots) {
      auto snapshot = slot->state.snapshot();
      nlohmann::json peer;
      peer["name"] = slot->label;
      peer["address"] = slot->spec.address + ":" + std::to_string(slot->spec.port);
      peer["transport"] = transport::kind_name(slot->spec.transport);
      peer["state"] = supervisor::state_name(snapshot.state);
      peer["since"] = supervisor::format_time(snapshot.since);
      peer["reason"] = snapshot.reason;
      uint64_t acknowledged = slot->replica ? slot->replica->done_upto() : 0;
      peer["method"] = slot->replica ? (slot->replica->uses_apm() ? "apm" : "gpspm") : "";
      peer["acknowledged_sequence"] = acknowledged;
      peer["lag"] = next_sequence - 1 > acknowledged ? next_sequence - 1 - acknowledged : 0;
      peer["persists"] = slot->persists;
      peer["bytes"] = slot->bytes;
      peer["errors"] = slot->errors;
      uint64_t dirty = meta->dirty_count(slot->peer);
      peer["dirty_chunks"] = dirty;
      peer["dirty_bytes"] = std::min(dirty * chunk_size, local->size());
      if (slot->peer < recorded.size()) {
        peer["behind_since_generation"] =
            recorded[slot->peer].bitmap_generation == 0
                ? std::string()
                : generation_hex(recorded[slot->peer].bitmap_generation);
      }
      peer["generation"] =
          slot->remote_generation == 0 ? std::string() : generation_hex(slot->remote_generation);
      peer["resynced_chunks"] = slot->resynced_chunks;
      peer["resynced_bytes"] = slot->resynced_bytes;
      peer["resyncs"] = slot->resyncs;
      if (slot->resync_active) {
        uint64_t left = slot->resync_total_bytes > slot->resync_done_bytes
                            ? slot->resync_total_bytes - slot->resync_done_bytes
                            : 0;
        left = std::max(left, std::min(dirty * chunk_size, local->size()));
        peer["resync"] = {
            {"done_bytes", slot->resync_done_bytes},
            {"left_bytes", left},
            {"total_bytes", slot->resync_done_bytes + left},
            {"rate_bytes_per_s", uint64_t(slot->resync_rate)},
            {"eta_seconds",
             slot->resync_rate > 0
                 ? nlohmann::json(uint64_t(std::ceil(double(left) / slot->resync_rate)))
                 : nlohmann::json(nullptr)},
            {"full", slot->resync_full}};
      }
      auto percentiles = slot->latency.percentiles();
      peer["latency_us"] = {{"p50", percentiles.p50},
                            {"p99", percentiles.p99},
                            {"p999", percentiles.p999},
                            {"count", percentiles.count}};
      peers.push_back(std::move(peer));
    }
    auto info = meta->info();
    nlohmann::json volume;
    volume["name"] = options.name;
    volume["role"] = "primary";
    volume["size"] = local->size();
    volume["path"] = local->path();
    volume["backing"] = region::backing_name(local->backing());
    volume["metadata"] = meta->path();
    volume["generation"] = generation_hex(info.generations.current);
    volume["chunk_size"] = chunk_size;
    volume["promoted"] = info.promoted;
    volume["last_sequence"] = next_sequence - 1;
    volume["acknowledged_sequence"] = last_completed;
    volume["ack_required"] = required_acks();
    volume["in_sync"] = in_sync_count();
    volume["identity"] = options.identity;
    volume["opened_at"] = supervisor::format_time(opened_at);
    volume["peers"] = std::move(peers);
    return volume;
  }
};

Volume::Volume(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Volume::~Volume() {
  impl_->registration = {};
  {
    std::lock_guard lock(impl_->supervisor_mutex);
    impl_->stopping = true;
  }
  impl_->supervisor_wake.notify_all();
  if (impl_->supervisor_thread.joinable()) impl_->supervisor_thread.join();
  for (auto& slot : impl_->slots) {
    if (!slot->connecting.valid()) continue;
    auto late = slot->connecting.get();  // a reconnect still under way
    if (late.ok()) (*late)->close();
  }
  std::unique_lock lock(impl_->mutex);
  impl_->options.block_when_insufficient = false;  // closing never waits for replicas to return
  // Every persist started is now durable on each live replica, or that
  // replica was dropped and its ranges recorded dirty: nothing is left for
  // the activity log to cover.
  if (impl_->next_sequence > 1) (void)impl_->wait_locked(lock, impl_->next_sequence - 1);
  for (auto& slot : impl_->slots) {
    if (!slot->live()) continue;
    for (const auto& persist : impl_->in_flight) {
      if (persist.sequence > slot->replica->done_upto()) {
        impl_->mark_dirty(*slot, persist.offset, persist.length);
        impl_->ensure_tracked(*slot);
      }
    }
  }
  for (auto& slot : impl_->slots) {
    if (slot->replica) slot->replica->close();
    slot->state.transition(PeerState::kClosed, "volume closed");
  }
  if (Status cleared = impl_->meta->clear_activity_log(); cleared.ok()) {
    (void)impl_->meta->set_clean(true);
  }
}

Result<std::unique_ptr<Volume>> Volume::open(const VolumeOptions& options) {
  if (options.name.empty()) return Status(Errc::kInvalidArgument, "volume name is empty");
  if (options.identity.empty()) {
    return Status(Errc::kInvalidArgument, "identity is empty: targets admit peers by identity");
  }
  if (options.max_in_flight == 0) {
    return Status(Errc::kInvalidArgument, "max_in_flight must be at least 1");
  }
  if (options.ack > options.replicas.size()) {
    return Status(Errc::kInvalidArgument, "ack " + std::to_string(options.ack) + " exceeds the " +
                                              std::to_string(options.replicas.size()) +
                                              " replicas configured");
  }
  if (options.resync_step == 0) {
    return Status(Errc::kInvalidArgument, "resync_step must be at least 1 byte");
  }
  if (options.replicas.size() > metadata::kMaxPeers) {
    return Status(Errc::kInvalidArgument,
                  std::to_string(options.replicas.size()) + " replicas configured; at most " +
                      std::to_string(metadata::kMaxPeers) + " are supported");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;

  region::OpenOptions region_options{options.local_path, options.size, options.create};
  auto local = region::Region::open(region_options);
  if (!local.ok()) return local.status().with_context("local copy of '" + options.name + "'");
  impl->local = std::move(local).value();

  metadata::CopyMetadata::Options meta_options;
  meta_options.path = options.metadata_path.empty()
                          ? metadata::default_metadata_path(options.local_path, options.name)
                          : options.metadata_path;
  meta_options.volume_size = impl->local->size();
  meta_options.chunk_size = options.chunk_size;
  meta_options.create_if_missing = true;
  auto meta = metadata::CopyMetadata::open(meta_options);
  // pmirrord on this node opens the pool for a moment to report the copy's
  // state; only a holder that stays (a session, another primary) is busy.
  for (int attempt = 0; !meta.ok() && meta.status().code() == Errc::kBusy && attempt < 40;
       ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    meta = metadata::CopyMetadata::open(meta_options);
  }
  if (!meta.ok()) return meta.status().with_context("metadata of '" + options.name + "'");
  impl->meta = std::move(meta).value();
  auto info = impl->meta->info();
  impl->chunk_size = info.chunk_size;
  impl->chunks = info.chunks;
  if (options.require_promoted && !info.promoted) {
    return Status(Errc::kPermissionDenied,
                  "this node is not the primary of volume '" + options.name +
                      "' in the cluster file, and its copy was not promoted; run `pmirrorctl "
                      "promote " +
                      options.name + "` on this node first");
  }
  if (!info.clean) {
    // The last primary here crashed: what it had in flight may differ.
    auto recovered = impl->meta->recover_activity_log();
    if (!recovered.ok())
      return recovered.status().with_context("metadata of '" + options.name + "'");
    spdlog::warn(
        "volume {}: the last session did not close cleanly; {} extents of its activity "
        "log will be resynced",
        options.name, recovered->size());
  }
  PMIRROR_RETURN_IF_ERROR(impl->meta->set_clean(false));
  if (info.generations.current == 0) {
    PMIRROR_ASSIGN_OR_RETURN(uint64_t first, impl->meta->new_generation());
    spdlog::info("volume {}: new copy, generation {}", options.name, generation_hex(first));
  }

  auto sink = [](const supervisor::StateChange& change) {
    spdlog::info("volume {}: replica {}: {} -> {}{}{}", change.volume, change.peer,
                 supervisor::state_name(change.from), supervisor::state_name(change.to),
                 change.reason.empty() ? "" : ": ", change.reason);
    publish_event(change);
  };
  for (const auto& spec : options.replicas) {
    impl->slots.push_back(std::make_unique<Slot>(options, spec, sink));
    PMIRROR_ASSIGN_OR_RETURN(impl->slots.back()->peer, impl->meta->peer(impl->slots.back()->label));
  }

  // Connect to every replica at once: a slow one should not delay the rest.
  std::vector<std::future<Result<std::unique_ptr<Replica>>>> pending;
  for (const auto& spec : options.replicas) {
    pending.push_back(std::async(std::launch::async, [&options, &spec, &impl] {
      return Replica::connect({options, spec, impl->local->data(), impl->local->size()});
    }));
  }
  std::vector<Result<std::unique_ptr<Replica>>> connected;
  for (auto& future : pending) connected.push_back(future.get());

  auto fail_open = [&](Status why) -> Status {
    for (auto& result : connected) {
      if (result.ok() && *result) (*result)->close();
    }
    for (auto& slot : impl->slots) {
      if (slot->replica) slot->replica->close();
    }
    (void)impl->meta->set_clean(true);
    return why;
  };
  std::string errors;
  Errc first_code = Errc::kOk;
  for (size_t i = 0; i < connected.size(); ++i) {
    if (connected[i].ok()) continue;
    if (first_code == Errc::kOk || is_misconfiguration(connected[i].status().code())) {
      if (first_code == Errc::kOk || !is_misconfiguration(first_code)) {
        first_code = connected[i].status().code();
      }
    }
    if (!errors.empty()) errors += "; ";
    errors += connected[i].status().message();
  }
  for (const auto& result : connected) {
    if (!result.ok() && is_demotion(result.status().code())) {
      return fail_open(Status(Errc::kFailedPrecondition,
                              "opening volume '" + options.name +
                                  "': " + result.status().message() +
                                  "; this copy is no longer the primary: run the application "
                                  "on the promoted node, or demote it there first"));
    }
  }
  if (first_code != Errc::kOk &&
      (is_misconfiguration(first_code) ||
       connected.size() - std::count_if(connected.begin(), connected.end(), [](const auto& r) {
         return !r.ok();
       }) < impl->required_acks())) {
    return fail_open(Status(first_code, "opening volume '" + options.name + "': " + errors));
  }

  uint64_t highest = 0;
  {
    std::lock_guard lock(impl->mutex);
    for (size_t i = 0; i < connected.size(); ++i) {
      Slot& slot = *impl->slots[i];
      if (!connected[i].ok()) {
        impl->ensure_tracked(slot);
        slot.next_attempt = Clock::now() + slot.backoff.next();
        slot.state.transition(is_refusal(connected[i].status().code()) ? PeerState::kRefused
                                                                       : PeerState::kDisconnected,
                              connected[i].status().message());
        continue;
      }
      highest = std::max(highest, (*connected[i])->last_sequence());
      impl->begin_session(slot, std::move(connected[i]).value());
    }
    // Sequences continue past whatever any replica recorded, so that each
    // target sees them rise.
    impl->next_sequence = highest + 1;
    impl->last_completed = highest;
    for (auto& slot : impl->slots) {
      if (slot->in_sync) slot->in_sync_since = impl->next_sequence;
    }
  }

  Impl* raw = impl.get();
  impl->supervisor_thread = std::thread([raw] { raw->supervisor_loop(); });

  // Replicas that need an initial or catch-up copy get it now, in the
  // background; open returns once `ack` of them are in sync.
  {
    std::unique_lock lock(impl->mutex);
    auto deadline = Clock::now() + options.open_sync_timeout;
    while (impl->in_sync_count() < impl->required_acks()) {
      uint32_t possible = 0;
      for (auto& slot : impl->slots) possible += slot->live() ? 1 : 0;
      if ((possible < impl->required_acks() && !options.block_when_insufficient) ||
          Clock::now() > deadline) {
        std::string states;
        for (auto& slot : impl->slots) {
          auto snapshot = slot->state.snapshot();
          if (!states.empty()) states += "; ";
          states += slot->label + " is " + std::string(supervisor::state_name(snapshot.state)) +
                    (snapshot.reason.empty() ? "" : " (" + snapshot.reason + ")");
        }
        lock.unlock();
        {
          std::lock_guard wake(impl->supervisor_mutex);
          impl->stopping = true;
        }
        impl->supervisor_wake.notify_all();
        impl->supervisor_thread.join();
        Errc code = Errc::kConnectionError;
        for (auto& slot : impl->slots) {
          auto state = slot->state.snapshot().state;
          if (state == PeerState::kSplitBrain) code = Errc::kSplitBrain;
        }
        return fail_open(Status(code, "opening volume '" + options.name +
                                          "': " + std::to_string(impl->in_sync_count()) +
                                          " of the " + std::to_string(impl->required_acks()) +
                                          " replicas required are in sync: " + states));
      }
      impl->sync_changed.wait_for(lock, std::chrono::milliseconds(100));
    }
  }
  impl->registration = register_volume(
      options.name, [raw] { return raw->status(); },
      [raw](const nlohmann::json& request) { return raw->command(request); });
  return std::unique_ptr<Volume>(new Volume(std::move(impl)));
}

Result<std::unique_ptr<Volume>> Volume::open_from_config(const std::string& config_path,
                                                         const std::string& volume,
                                                         const std::string& identity,
                                                         const std::string& node) {
  PMIRROR_ASSIGN_OR_RETURN(auto cluster, config::load_cluster_config(config_path));
  PMIRROR_ASSIGN_OR_RETURN(std::string self, config::resolve_node(cluster, node));
  PMIRROR_ASSIGN_OR_RETURN(auto plan, config::initiator_plan(cluster, volume, self));
  VolumeOptions options;
  options.name = plan.volume;
  options.local_path = plan.local_path;
  options.size = plan.size;
  options.create = plan.create;
  options.identity = identity;
  options.ack = plan.ack;
  options.heartbeat_interval = plan.heartbeat_interval;
  // A replica silent for heartbeat_timeout (no pong, no completion) is lost.
  options.operation_timeout = plan.heartbeat_timeout;
  options.reconnect_initial = plan.reconnect_initial;
  options.reconnect_max = plan.reconnect_max;
  options.metadata_path = plan.metadata_path;
  options.chunk_size = plan.chunk;
  options.resync_rate = plan.resync_rate;
  options.block_when_insufficient = plan.on_insufficient == config::InsufficientPolicy::kBlock;
  options.overwrite_split_brain =
      plan.after_split_brain == config::SplitBrainPolicy::kOverwriteReplica;
  options.require_promoted = !plan.configured_primary;
  for (const auto& replica : plan.replicas) {
    options.replicas.push_back(
        {replica.address, replica.port, replica.transport, plan.secret, replica.node});
  }
  return open(options);
}

std::byte* Volume::data() const { return impl_->local->data(); }
uint64_t Volume::size() const { return impl_->local->size(); }
bool Volume::is_pmem() const { return impl_->local->is_pmem(); }

namespace {
// Takes the volume's mutex for an application call, letting the supervisor
// know someone is waiting for it.
std::unique_lock<std::mutex> app_lock(std::mutex& mutex, std::atomic<int>& waiting) {
  waiting.fetch_add(1);
  std::unique_lock lock(mutex);
  waiting.fetch_sub(1);
  return lock;
}
}  // namespace

Status Volume::persist(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  if (length == 0) return Status::Ok();
  auto lock = app_lock(impl_->mutex, impl_->app_waiting);
  PMIRROR_ASSIGN_OR_RETURN(uint64_t sequence, impl_->start_locked(lock, offset, length));
  return impl_->wait_locked(lock, sequence);
}

Status Volume::write(uint64_t offset, const void* source, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  std::memcpy(impl_->local->data() + offset, source, length);
  return persist(offset, length);
}

Result<uint64_t> Volume::persist_async(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  if (length == 0) {
    return Status(Errc::kInvalidArgument, "persist_async of an empty range");
  }
  auto lock = app_lock(impl_->mutex, impl_->app_waiting);
  return impl_->start_locked(lock, offset, length);
}

Status Volume::wait(uint64_t sequence) {
  auto lock = app_lock(impl_->mutex, impl_->app_waiting);
  return impl_->wait_locked(lock, sequence);
}

Status Volume::drain() {
  auto lock = app_lock(impl_->mutex, impl_->app_waiting);
  return impl_->wait_locked(lock, impl_->next_sequence - 1);
}

std::vector<ReplicaStatus> Volume::replicas() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<ReplicaStatus> out;
  for (const auto& slot : impl_->slots) {
    ReplicaStatus s;
    if (slot->replica) {
      s = slot->replica->status();
    } else {
      s.address = slot->label;
      s.transport = slot->spec.transport;
      s.state = ReplicaState::kFailed;
    }
    auto snapshot = slot->state.snapshot();
    s.connection = supervisor::state_name(snapshot.state);
    if (s.last_error.empty() && snapshot.state != PeerState::kConnected) {
      s.last_error = snapshot.reason;
    }
    s.resynced_bytes = slot->resynced_bytes;
    out.push_back(std::move(s));
  }
  return out;
}

std::string Volume::status_json() const { return impl_->status().dump(); }

Status Volume::resync(const std::string& peer, bool full) { return impl_->resync(peer, full); }

Result<std::vector<VerifyPeerResult>> Volume::verify(const std::string& peer, bool mark_dirty) {
  return impl_->verify(peer, mark_dirty);
}

}  // namespace pmirror::initiator
