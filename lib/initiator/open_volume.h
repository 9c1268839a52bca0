// An open volume's pieces, wired together: what Volume::Impl is (it adds
// only its control socket registration), and what the unit tests build
// over targets of their own. Each piece is described in its header; the
// map is in docs/architecture.md ("Inside libpmirror").
//
// The members are declared in dependency order: each piece refers only to
// those above it, and is destroyed before them.
#pragma once

#include <future>
#include <memory>
#include <vector>

#include "initiator/activity_log.h"
#include "initiator/peers.h"
#include "initiator/persist_ledger.h"
#include "initiator/persist_pipeline.h"
#include "initiator/replica.h"
#include "initiator/resyncer.h"
#include "initiator/verifier.h"
#include "initiator/volume_core.h"
#include "initiator/volume_status.h"
#include "initiator/volume_supervisor.h"

namespace pmirror::initiator {

struct OpenVolume {
  OpenVolume(const VolumeOptions& options, std::unique_ptr<region::Region> local,
             std::unique_ptr<metadata::CopyMetadata> meta);
  OpenVolume(const OpenVolume&) = delete;
  OpenVolume& operator=(const OpenVolume&) = delete;

  VolumeCore core;
  PersistLedger ledger;  // guarded by core.mutex
  ActivityLog activity;  // guarded by core.mutex
  Peers peers;
  Resyncer resyncer;
  PersistPipeline pipeline;
  std::vector<protocol::Range> ranges_scratch;  // persist_async(ranges)'s, guarded by core.mutex
  std::vector<size_t> group_starts_scratch;     // persist_ordered_async's, likewise
  Verifier verifier;
  VolumeSupervisor supervisor;
  const supervisor::SystemTime opened_at = std::chrono::system_clock::now();

  // Sessions for the replicas connected at open (one result per peer, in
  // order): decides each one's sync and starts the resyncs needed;
  // sequences go on past whatever any replica recorded, so that each target
  // sees them rise. Takes the volume mutex.
  // `connected[i]` is replica i's answer, unless `still_connecting[i]` is
  // valid: its attempt goes on in the background, as a reconnect.
  void begin_sessions(std::vector<Result<std::unique_ptr<Replica>>>& connected,
                      std::vector<std::future<Result<std::unique_ptr<Replica>>>>& still_connecting);
  // Every replica answered.
  void begin_sessions(std::vector<Result<std::unique_ptr<Replica>>>& connected) {
    std::vector<std::future<Result<std::unique_ptr<Replica>>>> none(connected.size());
    begin_sessions(connected, none);
  }
  // Waits until `ack` replicas are in sync (their initial or catch-up
  // resyncs run in the background, by the supervisor), up to
  // open_sync_timeout; otherwise stops the supervisor and says which
  // replica is where. Takes the volume mutex.
  Status wait_for_ack_replicas();
  // Takes the volume mutex.
  VolumeStatus status();
  Result<ResyncStarted> resync(const std::string& peer, bool full);
  // `pmirrorctl disconnect` (connect false) / `connect`: one replica, or
  // every one when `peer` is empty. Takes the volume mutex.
  Result<std::vector<PeerSwitched>> set_connected(const std::string& peer, bool connect);
  // Every persist started is made durable on `ack` replicas (or recorded
  // dirty), the sessions end, and the copy is clean. Stops the supervisor.
  void close();

 private:
  // A replica connected but behind (lagging, being resynced, or not yet
  // told the copy's current generation) is given up to operation_timeout
  // to catch up before close stops the supervisor, so that a clean close
  // leaves every reachable replica in sync: one left behind keeps an older
  // generation, and promoting it later would make a split brain of the
  // writes it did in fact receive.
  void let_replicas_catch_up();
};

}  // namespace pmirror::initiator
