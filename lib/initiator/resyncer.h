// The resyncer: brings a replica's copy up to date while the application
// keeps writing (docs/replica-recovery.md, "Resync"). It tells the replica
// its copy is inconsistent, copies runs of dirty chunks (up to
// `resync_step`, at most `resync_rate` bytes/s) down the same connection as
// the persists, clears each chunk once its copy is durable, and finally
// tells the replica it holds our generation and counts it in sync again.
//
// Ownership: one ResyncJob per peer, here; the peers themselves are Peers'.
// The supervisor thread drives the jobs (step()); open, verify and the
// resync command start them. Guarded by the volume mutex (volume_core.h):
// every method is called with it held. A copy travels without the mutex
// held: step() posts it and a later step() collects it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "initiator/peers.h"
#include "initiator/rate_limiter.h"
#include "initiator/volume_core.h"
#include "initiator/volume_status.h"

namespace pmirror::initiator {

// What a supervisor pass left to do: nothing soon (sleep), a copy or an
// acknowledgement to collect shortly, or more at once.
enum class Work { kIdle, kWaiting, kBusy };  // ordered: std::max picks the most urgent

class Resyncer : public PeerListener {
 public:
  Resyncer(VolumeCore& core, Peers& peers);

  // Starts (or restarts) copying what is dirty for the peer.
  void start(Peer& peer, bool full, const std::string& reason);
  // The resync command: checks that the peer can be resynced now, marks
  // everything dirty with `full`, starts. kNotFound, kFailedPrecondition.
  Result<ResyncStarted> request(const std::string& name, bool full);
  // A lagging peer answers again: persists go to it again, and a resync
  // copies what was recorded dirty meanwhile.
  void catch_up(Peer& peer);
  // Collects the copy in flight, if it is durable, and posts the next run
  // of dirty chunks, or asks the peer to take our generation when none is
  // left. May drop the peer.
  Work step(Peer& peer);
  // The peer acknowledged that it holds `generation`, consistent: it is in
  // sync, unless something was marked for it meanwhile.
  void finish(Peer& peer, uint64_t generation);

  bool active(const Peer& peer) const { return jobs_[peer.index].active; }
  // Fills the resync part of the peer's status.
  void status(const Peer& peer, PeerStatus& status) const;
  uint64_t resynced_bytes(const Peer& peer) const { return jobs_[peer.index].resynced_bytes; }

  // PeerListener
  void session_ended(Peer& peer) override;
  void range_missed(Peer& peer, uint64_t offset, uint64_t length) override;
  void unsent_ranges(Peer& peer) override;

 private:
  struct Job {
    explicit Job(uint64_t rate) : limiter(rate) {}
    bool active = false;  // a resync is under way
    bool full = false;
    // The copy on its way (one at a time): its chunks are cleared when it
    // is durable.
    bool copy_in_flight = false;
    uint64_t copy_first = 0;
    uint64_t copy_run = 0;
    uint64_t copy_length = 0;
    // A range of the copy in flight was written meanwhile and not sent
    // after it (lagging): its chunks stay dirty when the copy completes.
    bool copy_stale = false;
    uint64_t cursor = 0;  // next chunk to look at
    uint64_t total_bytes = 0;
    uint64_t done_bytes = 0;
    Clock::time_point started{};
    double rate = 0;  // bytes/s, smoothed
    RateLimiter limiter;
    // Since open.
    uint64_t resynced_chunks = 0;
    uint64_t resynced_bytes = 0;
    uint64_t resyncs = 0;
  };
  // The copy in flight is durable on the peer: its chunks are clean.
  void complete_copy(Peer& peer, Job& job);

  VolumeCore& core_;
  Peers& peers_;
  std::vector<Job> jobs_;  // by Peer::index
};

}  // namespace pmirror::initiator
