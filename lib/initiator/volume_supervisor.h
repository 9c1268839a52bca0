// The volume's supervisor thread: over and over, for each peer, collects or
// starts a reconnect, checks that the replica makes progress, ends its
// lagging once it answers, sends queued generation updates, runs a resync
// step or announces our generation, and pings a quiet replica
// (docs/replica-recovery.md).
//
// Ownership: the thread only; the state it works on is Peers' and the
// Resyncer's. It takes the volume mutex for one peer at a time and never
// waits for the network while holding it (polls are non-blocking), and it
// lets waiting application threads in between passes.
#pragma once

#include <thread>

#include "initiator/peers.h"
#include "initiator/resyncer.h"
#include "initiator/volume_core.h"

namespace pmirror::initiator {

class VolumeSupervisor {
 public:
  VolumeSupervisor(VolumeCore& core, Peers& peers, Resyncer& resyncer);
  ~VolumeSupervisor();  // stops
  VolumeSupervisor(const VolumeSupervisor&) = delete;
  VolumeSupervisor& operator=(const VolumeSupervisor&) = delete;

  void start();
  // Stops the thread and waits for it; it is not started again.
  void stop();

  // One pass over every peer (the thread's body, without the thread).
  // Returns the most urgent work left.
  Work supervise();

 private:
  void run();
  // The pass for one peer, with the volume mutex held.
  Work supervise(Peer& peer);

  VolumeCore& core_;
  Peers& peers_;
  Resyncer& resyncer_;
  std::thread thread_;
};

}  // namespace pmirror::initiator
