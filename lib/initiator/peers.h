// Peer tracking: the replicas of an open volume as its primary keeps them
// (docs/replica-recovery.md). For each, the live session if any, the
// connection state machine and its reconnect backoff, the generations it
// holds and is told, the decision taken when a session opens, its dirty
// map in the copy metadata, and whether it lags.
//
// Ownership: Peers owns every Peer and everything in it. Other pieces read
// a Peer and call Peers to change it; the resyncer keeps its own per-peer
// state and learns from PeerListener when a session ends or a range is
// marked for a peer without being sent to it.
//
// Locking: the Peer objects and the vector are fixed after open; every
// field of a Peer is guarded by the volume mutex (volume_core.h), except
// `state` and `latency` (their own locks) and `connecting` (the reconnect
// thread fills it; it is collected with the mutex held). Every method is
// called with the volume mutex held.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "initiator/persist_ledger.h"
#include "initiator/replica.h"
#include "initiator/volume_core.h"
#include "initiator/volume_status.h"
#include "supervisor/supervisor.h"

namespace pmirror::initiator {

// What a SetGeneration tells a replica, and what happens once it is
// acknowledged.
enum class GenerationNews {
  kInconsistent,  // a resync into it starts: it keeps the generation it holds, mixed
  kAnnounce,      // an in-sync replica learns the primary's new generation
  kFinish,        // a resync ends: it holds the primary's generation, consistent
};
struct GenerationUpdate {
  GenerationNews news;
  uint64_t generation = 0;  // kInconsistent: filled in when posted
  bool posted = false;
};

// One replica of the volume.
struct Peer {
  Peer(const VolumeOptions& options, const ReplicaSpec& replica_spec, size_t volume_index,
       supervisor::EventSink sink);

  const ReplicaSpec spec;
  const std::string label;           // its node name, or host:port
  const size_t index;                // its place in the volume: its bit in the PersistLedger
  size_t meta_index = 0;             // its index in the copy metadata
  std::unique_ptr<Replica> replica;  // null while disconnected
  // A reconnect attempt under way (valid while it runs or is not collected).
  std::future<Result<std::unique_ptr<Replica>>> connecting;
  supervisor::PeerStateMachine state;
  supervisor::Backoff backoff;
  Clock::time_point next_attempt{};
  Clock::time_point last_ping{};
  bool in_sync = false;  // counts towards the ack policy
  // `pmirrorctl disconnect`: no session with it until `connect` (its
  // writes are recorded dirty meanwhile, as for any absent replica).
  bool held_by_operator = false;
  // Connected but behind: it could not take a persist without holding the
  // application back, so persists are recorded dirty for it instead of
  // posted, until it answers again and a resync brings it up to date.
  bool lagging = false;
  uint64_t in_sync_since = 0;    // first sequence started after it became in sync
  uint64_t told_generation = 0;  // the generation the replica knows it holds
  // Sent by the supervisor one at a time, never waited for under the mutex
  // (the replica may stop answering in the middle of one).
  std::deque<GenerationUpdate> generation_updates;
  uint64_t remote_generation = 0;  // its copy's, as its last session said
  // Why its last session ended or its last attempt failed, kept while it
  // reconnects (the state's reason then says "reconnect attempt N");
  // cleared when it is in sync again.
  std::string last_error;

  // A verify against it under way (Verifier, under the volume mutex):
  // bytes compared so far of the volume's size, for status.
  bool verifying = false;
  uint64_t verify_done_bytes = 0;

  // The last sequence it acknowledged, kept across its sessions: status
  // shows it (and the lag from it) while it is away.
  uint64_t acknowledged = 0;

  // Since open.
  supervisor::LatencyWindow latency;
  uint64_t persists = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;

  bool live() const { return replica != nullptr; }
};

// The resyncer's side of peer tracking.
class PeerListener {
 public:
  virtual ~PeerListener() = default;
  // The peer's session ended (dropped): whatever was under way with it stops.
  virtual void session_ended(Peer& peer) = 0;
  // [offset, +length) was marked dirty for a connected peer that does not
  // get it by a persist (it lags, or verify found it different).
  virtual void range_missed(Peer& peer, uint64_t offset, uint64_t length) = 0;
  // A connected peer has dirty ranges that no persist will bring it (a
  // persist failed before it was sent): copy them.
  virtual void unsent_ranges(Peer& peer) = 0;
};

// A session opened and the copies' generations call for a resync.
struct ResyncNeeded {
  bool full = false;
  std::string reason;
};

class Peers {
 public:
  Peers(VolumeCore& core, PersistLedger& ledger);
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  // At open, before anything else uses the peers.
  Status add(const ReplicaSpec& spec, supervisor::EventSink sink);
  void set_listener(PeerListener* listener) { listener_ = listener; }

  const std::vector<std::unique_ptr<Peer>>& all() const { return peers_; }
  // By node name, label or host:port; kNotFound naming the peers there are.
  Result<Peer*> lookup(const std::string& name) const;
  std::string names() const;  // "a, b, c"

  // ---- the ack policy's counts
  uint32_t required_acks() const;
  uint32_t in_sync_count() const;
  uint32_t live_count() const;
  // Every persist up to here is durable on every live replica, or recorded
  // dirty for it (a lagging replica has each range it may miss marked).
  uint64_t durable_everywhere() const;
  // Moves the ledger's unsettled boundary up to durable_everywhere().
  void settle();
  // "replica b is disconnected (why)": for error messages.
  static std::string describe(const Peer& peer);

  // ---- dirty maps
  // From now on the primary records what the peer misses: if it was not
  // tracked, a new generation starts (and every untracked peer is tracked
  // from the old one).
  void ensure_tracked(Peer& peer);
  void mark_dirty(Peer& peer, uint64_t offset, uint64_t length);
  // Marks a range dirty for a connected peer that will not get it by a
  // persist (the listener hears of it: a resync copy of it in flight must
  // not clean it).
  void mark_missed(Peer& peer, uint64_t offset, uint64_t length);
  // A persist of [offset, +length) failed before it reached every peer (or
  // before it was started): the application stored those bytes in the
  // local copy, so they are dirty for every peer, whatever the persist
  // returned, until a resync copies them. A connected peer gets that
  // resync now; one away gets it when it reconnects.
  void mark_unsent(uint64_t offset, uint64_t length);

  // ---- lagging and losing
  // The peer cannot take the persist just started without holding the
  // application back: from now on its ranges are recorded dirty instead,
  // starting with every persist it has not acknowledged. Its session stays.
  void start_lagging(Peer& peer, const Status& why);
  // It answers again (nothing pending, a receive slot free).
  void stop_lagging(Peer& peer) { peer.lagging = false; }
  // The peer is lost: forget its session, record what it missed, reconnect
  // later.
  void drop(Peer& peer, const Status& why,
            supervisor::PeerState to = supervisor::PeerState::kDisconnected);
  // A target's kFenced (from a drop, a refused connect): the volume is
  // fenced (VolumeCore::fenced). Anything else: nothing.
  void note_fenced(const Status& why);

  // ---- sessions
  // A new session: decides from both copies' generations whether the peer
  // is in sync, needs a resync (returned: the caller starts it), or must be
  // refused.
  std::optional<ResyncNeeded> begin_session(Peer& peer, std::unique_ptr<Replica> replica);
  // A connection attempt at open failed: retry later.
  void connect_failed(Peer& peer, const Status& why);
  // Open went on without the peer's answer (enough others are in sync):
  // its attempt finishes in the background as a reconnect does, and what
  // is written meanwhile is recorded for it.
  void connect_continues(Peer& peer, std::future<Result<std::unique_ptr<Replica>>> attempt);
  void become_in_sync(Peer& peer, const std::string& reason);
  // Connecting can take seconds: it runs on its own thread, so that the
  // supervisor keeps pinging and resyncing the other peers meanwhile.
  void start_reconnect(Peer& peer);
  // The attempt has finished: begin_session, or retry later.
  std::optional<ResyncNeeded> finish_reconnect(Peer& peer);

  // ---- generations
  // Queues a generation update for the supervisor to send.
  void tell_generation(Peer& peer, GenerationNews news, uint64_t generation);
  // Sends the queued updates one by one and acts on each acknowledgement;
  // never waits. `finished` is called when a kFinish is acknowledged (the
  // resyncer completes the resync; it may queue another update, which is
  // sent at once). True when none is left. May drop the peer.
  bool settle_generation(Peer& peer, const std::function<void(Peer&, uint64_t)>& finished);
  // An in-sync peer learns the primary's new generation, so that it is no
  // longer counted as left behind.
  void announce_generation(Peer& peer);

  // ---- heartbeats
  // Pings when nothing was heard from the peer for a heartbeat interval (is
  // it alive?), or nothing was sent to it (the target keeps a session only
  // while it hears messages; resync copies and lagging send none).
  void heartbeat_if_quiet(Peer& peer);

  // ---- status (the resync part is the resyncer's)
  PeerStatus status(const Peer& peer) const;
  ReplicaStatus replica_status(const Peer& peer) const;

 private:
  VolumeCore& core_;
  PersistLedger& ledger_;
  PeerListener* listener_ = nullptr;
  std::vector<std::unique_ptr<Peer>> peers_;  // fixed after open
};

// Refusals that mean the configuration is wrong: opening fails on them
// rather than running degraded and hiding the mistake.
bool is_misconfiguration(Errc code);
// A replica's copy was promoted: this node is no longer the primary, and
// writing on without it would make a split brain certain.
bool is_demotion(Errc code);
bool is_refusal(Errc code);

}  // namespace pmirror::initiator
