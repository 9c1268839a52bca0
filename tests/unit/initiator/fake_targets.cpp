#include "unit/initiator/fake_targets.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/log.h"
#include "metadata/metadata.h"
#include "region/region.h"

namespace pmirror::initiator::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {
constexpr char kSecret[] = "initiator-unit-secret";
}

void FakeTargetsTest::SetUp() {
  log::set_level(::getenv("PMIRROR_TEST_LOG") ? spdlog::level::debug : spdlog::level::off);
  fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  std::string templ = (base / "pmirror-initiator-XXXXXX").string();
  ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
  dir_ = templ;
  fabric_ = transport::fake::FakeFabric::create();
  installed_ = std::make_unique<transport::fake::ScopedFabric>(fabric_, "initiator");
}

void FakeTargetsTest::TearDown() {
  fabric_->set_manual(false);
  if (volume_) {
    // As ~Volume: persists settle, sessions say Goodbye, the copy is clean.
    volume_->close();
    volume_.reset();
  }
  for (size_t i = 0; i < nodes_.size(); ++i) stop_target(i);
  installed_.reset();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string FakeTargetsTest::target_path(size_t i) const {
  return (dir_ / ("t" + std::to_string(i) + ".img")).string();
}

void FakeTargetsTest::start_targets(size_t count, config::ApmPolicy apm) {
  for (size_t i = 0; i < count; ++i) {
    std::string node = "t" + std::to_string(i);
    config::DaemonConfig config;
    config.node = node;
    config.listen_address = node;  // the fabric node
    config.port = 0;
    config.transport = transport::Kind::kFake;
    config.state_pool = (dir_ / (node + ".state")).string();
    config::VolumeConfig volume;
    volume.name = "v";
    volume.path = target_path(i);
    volume.size = kSize;
    volume.create = true;
    volume.allowed_peers = {"app"};
    volume.secret = kSecret;
    volume.apm = apm;
    volume.metadata_path = target_path(i) + ".pmirror";
    volume.primary = "initiator";
    volume.peers = {"initiator"};
    config.volumes.push_back(volume);
    target::TargetOptions target_options;
    target_options.session_timeout = 60s;
    target_options.handshake_timeout = 10s;
    auto started = target::Target::start(config, target_options);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    nodes_.push_back(std::make_unique<Node>());
    Node& n = *nodes_.back();
    n.target = std::move(started).value();
    n.runner = std::thread([&n] { n.run_status = n.target->run(); });
  }
}

void FakeTargetsTest::stop_target(size_t i) {
  Node& n = *nodes_[i];
  if (n.target == nullptr) return;
  n.target->stop();
  if (n.runner.joinable()) n.runner.join();
  EXPECT_TRUE(n.run_status.ok()) << n.run_status.to_string();
  n.target.reset();
}

VolumeOptions FakeTargetsTest::options() const {
  VolumeOptions o;
  o.name = "v";
  o.local_path = (dir_ / "local.img").string();
  o.metadata_path = o.local_path + ".pmirror";
  o.size = kSize;
  o.create = true;
  o.identity = "app";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    ReplicaSpec replica;
    replica.address = "t" + std::to_string(i);
    replica.port = nodes_[i]->target ? nodes_[i]->target->port() : 0;
    replica.transport = "fake";  // resolves: a FakeFabric is installed
    replica.secret = kSecret;
    replica.node = replica.address;
    o.replicas.push_back(replica);
  }
  o.connect_timeout = 10s;
  o.operation_timeout = 10s;
  o.heartbeat_interval = 1h;
  o.reconnect_initial = 1ms;
  o.reconnect_max = 1ms;
  o.chunk_size = kChunk;
  o.resync_rate = 0;
  return o;
}

std::unique_ptr<OpenVolume> FakeTargetsTest::make_volume(const VolumeOptions& o) {
  auto local = region::Region::open({o.local_path, o.size, o.create});
  EXPECT_TRUE(local.ok()) << local.status().to_string();
  if (!local.ok()) return nullptr;
  metadata::CopyMetadata::Options meta_options;
  meta_options.path = o.metadata_path;
  meta_options.volume_size = o.size;
  meta_options.chunk_size = o.chunk_size;
  auto meta = metadata::CopyMetadata::open(meta_options);
  EXPECT_TRUE(meta.ok()) << meta.status().to_string();
  if (!meta.ok()) return nullptr;
  EXPECT_TRUE((*meta)->new_generation().ok());
  auto made = std::make_unique<OpenVolume>(o, std::move(local).value(), std::move(meta).value());
  Status staged = made->core.staging.allocate(o.snapshot_buffer);  // as Volume::open does
  EXPECT_TRUE(staged.ok()) << staged.to_string();
  return made;
}

std::unique_ptr<Replica> FakeTargetsTest::connect(const VolumeCore& core, size_t i) {
  auto replica = Replica::connect({core.options, core.options.replicas[i], core.local->data(),
                                   core.local->size(), {}, core.staging.base(),
                                   core.staging.capacity()});
  EXPECT_TRUE(replica.ok()) << replica.status().to_string();
  return replica.ok() ? std::move(replica).value() : nullptr;
}

std::vector<std::byte> FakeTargetsTest::target_bytes(size_t i) const {
  std::ifstream in(target_path(i), std::ios::binary);
  std::vector<char> bytes(kSize);
  in.read(bytes.data(), static_cast<std::streamsize>(kSize));
  EXPECT_TRUE(in.good()) << "reading " << target_path(i);
  std::vector<std::byte> out(kSize);
  std::memcpy(out.data(), bytes.data(), kSize);
  return out;
}

target::VolumeStatus FakeTargetsTest::target_volume(size_t i) const {
  target::TargetStatus status = nodes_[i]->target->status();
  EXPECT_EQ(status.volumes.size(), 1u);
  return status.volumes.empty() ? target::VolumeStatus{} : status.volumes[0];
}

void FakeTargetsTest::scribble_on_target(size_t i, uint64_t offset, std::byte value) {
  int fd = ::open(target_path(i).c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::pwrite(fd, &value, 1, static_cast<off_t>(offset)), 1) << std::strerror(errno);
  ::close(fd);
}

void FakeTargetsTest::open_volume(size_t replicas, const std::function<void(VolumeOptions&)>& tweak,
                                  config::ApmPolicy apm) {
  start_targets(replicas, apm);
  VolumeOptions o = options();
  if (tweak) tweak(o);
  volume_ = make_volume(o);
  ASSERT_NE(volume_, nullptr);
  auto sink = [](const supervisor::StateChange&) {};
  for (const auto& spec : o.replicas) ASSERT_TRUE(volume_->peers.add(spec, sink).ok());
  std::vector<Result<std::unique_ptr<Replica>>> connected;
  for (size_t i = 0; i < replicas; ++i) {
    connected.push_back(Replica::connect({o, o.replicas[i], volume_->core.local->data(),
                                          volume_->core.local->size(), {},
                                          volume_->core.staging.base(),
                                          volume_->core.staging.capacity()}));
    ASSERT_TRUE(connected.back().ok()) << connected.back().status().to_string();
  }
  volume_->begin_sessions(connected);
}

bool FakeTargetsTest::supervise_until(const std::function<bool()>& done) {
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard lock(volume_->core.mutex);
      if (done()) return true;
    }
    if (volume_->supervisor.supervise() != Work::kBusy) std::this_thread::sleep_for(100us);
  }
  return false;
}

bool FakeTargetsTest::all_in_sync() {
  return supervise_until([&] {
    for (const auto& p : volume_->peers.all()) {
      if (!p->in_sync || volume_->resyncer.active(*p)) return false;
    }
    return true;
  });
}

Status FakeTargetsTest::persist(uint64_t offset, uint64_t length) {
  auto lock = app_lock(volume_->core);
  PMIRROR_ASSIGN_OR_RETURN(uint64_t sequence, volume_->pipeline.start(lock, offset, length));
  return volume_->pipeline.wait(lock, sequence);
}

}  // namespace pmirror::initiator::testing
