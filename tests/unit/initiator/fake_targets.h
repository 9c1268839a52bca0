// A test fixture for the initiator's pieces: real pmirrord Targets (one per
// replica) in this process over the fake fabric (docs/transport-fake.md),
// as tests/unit/crash does for the whole Volume, and the initiator's side:
// an OpenVolume (every piece, wired as Volume::open wires them) over a
// local copy and metadata in /dev/shm, whose supervisor thread is not
// started -- tests run supervisor passes themselves.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "initiator/initiator.h"
#include "initiator/open_volume.h"
#include "initiator/replica.h"
#include "initiator/volume_core.h"
#include "target/target.h"
#include "transport/fake/fake_fabric.h"
#include "transport/fake/fake_transport.h"

namespace pmirror::initiator::testing {

class FakeTargetsTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSize = 1 << 20;
  static constexpr uint64_t kChunk = 4096;

  void SetUp() override;
  void TearDown() override;

  // Starts `count` targets "t0".."t<count-1>", each serving volume "v".
  void start_targets(size_t count, config::ApmPolicy apm = config::ApmPolicy::kOn);
  // Starts `replicas` targets, builds volume_ with options() changed by
  // `tweak`, adds the peers, connects each and begins its session, as
  // open() does (without waiting for any resync).
  void open_volume(size_t replicas, const std::function<void(VolumeOptions&)>& tweak = {},
                   config::ApmPolicy apm = config::ApmPolicy::kOn);
  Peer& peer_at(size_t i) { return *volume_->peers.all()[i]; }
  // Runs supervisor passes until `done` (called with the volume mutex
  // held) is true, or 20 s passed (false).
  bool supervise_until(const std::function<bool()>& done);
  // supervise_until every peer is in sync with no resync under way.
  bool all_in_sync();
  // Persists [offset, +length) through the pipeline, as Volume::persist.
  Status persist(uint64_t offset, uint64_t length);
  void stop_target(size_t i);
  // Volume options naming every target as a replica (short timeouts).
  VolumeOptions options() const;
  // The pieces over a fresh local copy and metadata, as open() makes them.
  std::unique_ptr<OpenVolume> make_volume(const VolumeOptions& options);
  // A session with target `i` (connected, not tracked in a ledger yet).
  std::unique_ptr<Replica> connect(const VolumeCore& core, size_t i);

  // Target i's copy of the volume, as its file holds it now.
  std::vector<std::byte> target_bytes(size_t i) const;
  // Target i's status of the volume (what it recorded, its sessions).
  target::VolumeStatus target_volume(size_t i) const;
  // Changes target i's copy behind its back (damage, for verify).
  void scribble_on_target(size_t i, uint64_t offset, std::byte value);

  transport::fake::FakeFabric& fabric() { return *fabric_; }

  std::unique_ptr<OpenVolume> volume_;  // closed by TearDown

 private:
  struct Node {
    std::unique_ptr<target::Target> target;
    std::thread runner;
    Status run_status;
  };
  std::string target_path(size_t i) const;

  std::filesystem::path dir_;
  std::shared_ptr<transport::fake::FakeFabric> fabric_;
  std::unique_ptr<transport::fake::ScopedFabric> installed_;
  std::vector<std::unique_ptr<Node>> nodes_;  // threads refer to them
};

}  // namespace pmirror::initiator::testing
