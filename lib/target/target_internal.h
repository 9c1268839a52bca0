// Shared between target.cpp (the daemon's accept loop) and
// target_session.cpp (one initiator's session).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "config/config.h"
#include "supervisor/supervisor.h"
#include "region/region.h"
#include "state/state.h"
#include "target/target.h"
#include "transport/transport.h"

namespace pmirror::target {

// One initiator's session as status shows it; kept a while after it ends so
// that an operator sees who was there and why they left.
struct SessionRecord {
  SessionRecord(const std::string& volume, const std::string& peer, supervisor::EventSink sink)
      : peer(peer), state(volume, peer, supervisor::PeerState::kHandshaking, std::move(sink)) {}
  std::string peer;  // identity@address
  supervisor::PeerStateMachine state;
  std::atomic<uint64_t> persists{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> acknowledged{0};
  std::string method;  // set once connected; guarded by the volume's mutex
};

struct ServedVolume {
  config::VolumeConfig config;
  std::unique_ptr<region::Region> region;
  uint32_t methods = 0;  // protocol::PersistMethod bits this target guarantees

  std::mutex mutex;
  std::string writer;  // identity@address of the session holding the volume; guarded by mutex
  // The writer's session has ended and is writing its last checkpoint: a
  // new writer waits for it rather than being refused (an initiator that
  // closes and reopens at once must not see "busy").
  bool writer_leaving = false;  // guarded by mutex
  std::condition_variable writer_released;

  // The writer's progress, published by its session and written to the
  // state pool by the recorder (Checkpointer) -- a pmemobj transaction costs
  // milliseconds on a plain file, far too much for every persist.
  std::atomic<uint64_t> generation{0};
  std::atomic<uint64_t> applied_sequence{0};
  std::string writer_identity;  // guarded by mutex
  std::mutex record_mutex;      // one state-pool update of this volume at a time
  uint64_t recorded_sequence = 0;  // guarded by record_mutex

  // Set when a reload removed the volume: its session ends, and the region
  // is unmapped when the last session lets go of it.
  std::atomic<bool> removed{false};
  // The newest sessions first, at most kKeptSessions; guarded by mutex.
  static constexpr size_t kKeptSessions = 4;
  std::deque<std::shared_ptr<SessionRecord>> sessions;
};

// Writes a volume's published progress to the state pool if it moved.
Status checkpoint(state::StateStore& state, ServedVolume& volume);

// Everything a session needs from the daemon.
struct SessionContext {
  const TargetOptions& options;
  state::StateStore& state;
  std::function<std::shared_ptr<ServedVolume>(const std::string& name)> find_volume;
  const std::atomic<bool>& stopping;
};

// Serves one initiator until it leaves, errs, or the daemon stops.
void serve_session(SessionContext& context, std::unique_ptr<transport::Connection> connection);

// Which persistency methods a volume may promise on this transport.
uint32_t offered_methods(transport::Kind kind, const config::VolumeConfig& volume,
                         const region::Region& region);

}  // namespace pmirror::target
