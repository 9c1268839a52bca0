// An in-process Target on tcp loopback, driven by a raw session (the
// protocol messages by hand, no libpmirror): the copy's metadata in the
// VolumeDescriptor, SetGeneration, VerifyRequest, split-brain reports, and
// promote/demote.
#include "target/target.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "auth/auth.h"
#include "common/fault.h"
#include "common/log.h"
#include "metadata/metadata.h"
#include "protocol/protocol.h"
#include "session/session.h"
#include "target/target_internal.h"
#include "transport/transport.h"

namespace pmirror::target {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr uint64_t kVolumeSize = 16ull << 20;  // four activity extents
constexpr const char* kSecret = "s3cret";

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout = 5s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

// One initiator's side of a session, by hand.
struct Client {
  std::unique_ptr<transport::Connection> connection;
  std::unique_ptr<session::Messenger> messenger;
  protocol::VolumeDescriptor descriptor;

  Status send(const protocol::Message& m) { return messenger->send(m); }
  Result<protocol::Message> receive(std::string_view what) {
    return messenger->receive(5000ms, what);
  }
  template <typename T>
  T expect(std::string_view what) {
    auto got = receive(what);
    EXPECT_TRUE(got.ok()) << got.status().to_string();
    if (!got.ok()) return T{};
    const T* m = std::get_if<T>(&*got);
    EXPECT_NE(m, nullptr) << "got " << protocol::type_name(protocol::type_of(*got));
    return m != nullptr ? *m : T{};
  }
};

Result<Client> open_session(uint16_t port, const std::string& volume = "v1",
                            const std::string& identity = "app", uint32_t hello_flags = 0) {
  Client c;
  PMIRROR_ASSIGN_OR_RETURN(c.connection, transport::connect(transport::Kind::kTcp, "127.0.0.1",
                                                            port, transport::ConnectionOptions{}));
  c.messenger = std::make_unique<session::Messenger>(*c.connection);
  protocol::Hello hello;
  hello.volume = volume;
  hello.identity = identity;
  hello.flags = hello_flags;
  PMIRROR_ASSIGN_OR_RETURN(hello.client_nonce, auth::random_nonce());
  PMIRROR_RETURN_IF_ERROR(c.send(hello));
  PMIRROR_ASSIGN_OR_RETURN(auto challenge_message, c.receive("Challenge"));
  auto* challenge = std::get_if<protocol::Challenge>(&challenge_message);
  if (challenge == nullptr) return Status(Errc::kProtocolError, "expected Challenge");
  auth::SessionContext context{volume, identity, hello.client_nonce, challenge->server_nonce};
  PMIRROR_RETURN_IF_ERROR(c.send(protocol::AuthResponse{auth::initiator_proof(kSecret, context)}));
  PMIRROR_ASSIGN_OR_RETURN(auto descriptor_message, c.receive("VolumeDescriptor"));
  auto* descriptor = std::get_if<protocol::VolumeDescriptor>(&descriptor_message);
  if (descriptor == nullptr) return Status(Errc::kProtocolError, "expected VolumeDescriptor");
  if (!auth::macs_equal(descriptor->mac, auth::target_proof(kSecret, context))) {
    return Status(Errc::kPermissionDenied, "target proof wrong");
  }
  c.descriptor = *descriptor;
  return c;
}

class TargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log::set_level(spdlog::level::warn);
    std::string templ = (fs::temp_directory_path() / "pmirror-target-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
    data_path_ = (dir_ / "v1.img").string();
    metadata_path_ = data_path_ + ".pmirror";  // the default path

    config_.node = "b";
    config_.listen_address = "127.0.0.1";
    config_.port = 0;
    config_.transport = transport::Kind::kTcp;
    config_.state_pool = (dir_ / "state.pool").string();
    config::VolumeConfig volume;
    volume.name = "v1";
    volume.path = data_path_;
    volume.size = kVolumeSize;
    volume.create = true;
    volume.allowed_peers = {"app"};
    volume.secret = kSecret;
    volume.chunk = 64 * 1024;
    volume.primary = "a";
    volume.peers = {"a", "c"};
    config_.volumes.push_back(volume);
  }

  void TearDown() override {
    stop();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Fills the volume's file with a pattern no two chunks share.
  void write_pattern() {
    std::vector<char> bytes(kVolumeSize);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + i / 4093);
    std::ofstream out(data_path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
  }

  std::vector<std::byte> file_bytes() {
    std::ifstream in(data_path_, std::ios::binary);
    std::vector<char> bytes(kVolumeSize);
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::vector<std::byte> out(bytes.size());
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

  void start() {
    TargetOptions options;
    options.session_timeout = 10s;
    options.handshake_timeout = 5s;
    options.on_event = [this](const supervisor::StateChange& change) {
      std::lock_guard lock(events_mutex_);
      events_.push_back(change);
    };
    auto started = Target::start(config_, options);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    target_ = std::move(started).value();
    runner_ = std::thread([this] { run_status_ = target_->run(); });
  }

  void stop() {
    if (target_ == nullptr) return;
    target_->stop();
    if (runner_.joinable()) runner_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_.to_string();
    target_.reset();
  }

  nlohmann::json volume_status() { return to_json(target_->status())["volumes"][0]; }

  // config_ with a second volume "v2" beside v1, in files of its own.
  config::DaemonConfig with_second_volume() const {
    config::DaemonConfig next = config_;
    config::VolumeConfig added = config_.volumes[0];
    added.name = "v2";
    added.path = (dir_ / "v2.img").string();
    added.metadata_path = added.path + ".pmirror";
    next.volumes.push_back(added);
    return next;
  }

  // Waits until no session holds the volume (the last one has closed its
  // metadata and released the claim).
  bool wait_no_writer() {
    return wait_until([this] { return target_->status().volumes[0].writer.empty(); });
  }

  std::unique_ptr<metadata::CopyMetadata> open_metadata() {
    metadata::CopyMetadata::Options options;
    options.path = metadata_path_;
    options.volume_size = kVolumeSize;
    options.chunk_size = 64 * 1024;
    options.create_if_missing = true;
    auto md = metadata::CopyMetadata::open(options);
    EXPECT_TRUE(md.ok()) << md.status().to_string();
    return md.ok() ? std::move(md).value() : nullptr;
  }

  // A session that adopts `generation` as consistent, then says Goodbye.
  void adopt(uint64_t generation, bool consistent = true) {
    auto client = open_session(target_->port());
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    ASSERT_TRUE(client
                    ->send(protocol::SetGeneration{
                        generation, consistent ? protocol::kGenerationConsistent : 0u})
                    .ok());
    auto ack = client->expect<protocol::GenerationAck>("GenerationAck");
    EXPECT_EQ(ack.generation, generation);
    ASSERT_TRUE(client->send(protocol::Goodbye{}).ok());
    // The Goodbye leaves before the connection is dropped; the target may
    // close its end first, which fails the wait harmlessly.
    (void)client->messenger->wait_sends(2000ms);
    ASSERT_TRUE(wait_no_writer());
  }

  fs::path dir_;
  std::string data_path_;
  std::string metadata_path_;
  config::DaemonConfig config_;
  std::unique_ptr<Target> target_;
  std::thread runner_;
  Status run_status_;
  std::mutex events_mutex_;
  std::vector<supervisor::StateChange> events_;
};

TEST_F(TargetTest, StartCreatesTheCopyMetadataAndStatusShowsIt) {
  start();
  EXPECT_TRUE(fs::exists(metadata_path_));
  auto copy = volume_status()["copy"];
  EXPECT_EQ(copy["generation"], "0000000000000000");
  EXPECT_EQ(copy["history"], nlohmann::json::array());
  EXPECT_EQ(copy["consistent"], true);
  EXPECT_EQ(copy["promoted"], false);
  EXPECT_EQ(copy["clean"], true);
  EXPECT_EQ(copy["uuid"].get<std::string>().size(), 36u);
}

// Placement order (docs/protocol.md, "Ordering"): a tcp target whose copy
// is pmem persists each Write as it lands and says so, but only to an
// initiator whose Hello says it knows the bit (an older one would refuse the
// descriptor). On a plain file it is not offered (an msync per Write).
TEST_F(TargetTest, PlacementOrderIsDeclaredOnPmemToAnInitiatorThatKnowsIt) {
  const uint32_t apm_gpspm = protocol::kMethodApm | protocol::kMethodGpspm;
  start();
  auto plain = open_session(target_->port(), "v1", "app", protocol::kHelloPlacementOrder);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->descriptor.methods, apm_gpspm) << "a plain file";
  EXPECT_EQ(volume_status()["methods"], nlohmann::json({"apm", "gpspm"}));
  ASSERT_TRUE(plain->send(protocol::Goodbye{}).ok());
  ASSERT_TRUE(wait_no_writer());
  stop();

  ::setenv("PMEM_IS_PMEM_FORCE", "1", 1);  // the copy's mapping counts as pmem
  start();
  ::unsetenv("PMEM_IS_PMEM_FORCE");
  EXPECT_EQ(volume_status()["methods"], nlohmann::json({"apm", "gpspm", "placement-order"}));
  {
    auto older = open_session(target_->port());
    ASSERT_TRUE(older.ok()) << older.status().to_string();
    EXPECT_EQ(older->descriptor.methods, apm_gpspm) << "an initiator that predates the bit";
    ASSERT_TRUE(older->send(protocol::Goodbye{}).ok());
    ASSERT_TRUE(wait_no_writer());
  }
  auto client = open_session(target_->port(), "v1", "app", protocol::kHelloPlacementOrder);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  EXPECT_EQ(client->descriptor.methods, apm_gpspm | protocol::kMethodPlacementOrder);
  // Its registration takes Writes (each persisted as it lands).
  std::vector<std::byte> bytes(300 + 8);  // the last 8 take the flush Read
  for (size_t i = 0; i < 300; ++i) bytes[i] = std::byte(0x40 + i % 64);
  auto local = client->connection->register_memory(bytes.data(), bytes.size(), transport::kLocalOnly);
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  const transport::RemoteKey remote{client->descriptor.remote_address, client->descriptor.rkey,
                                    client->descriptor.region_size};
  ASSERT_TRUE(client->connection->post_write(**local, 0, 200, remote, 8192, 1, false).ok());
  ASSERT_TRUE(client->connection->post_write(**local, 200, 100, remote, 12288, 2, false).ok());
  ASSERT_TRUE(client->connection->post_read(**local, 300, 8, remote, 12288, 3).ok());
  std::vector<transport::Completion> polled_buffer(8);
  std::vector<transport::Completion> done;
  ASSERT_TRUE(wait_until([&] {
    auto polled = client->connection->poll(polled_buffer, 10ms);
    if (!polled.ok()) return true;
    done.insert(done.end(), polled_buffer.begin(), polled_buffer.begin() + long(*polled));
    return !done.empty();
  }));
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done[0].status.ok()) << done[0].status.to_string();
  ASSERT_TRUE(client->send(protocol::Goodbye{}).ok());
  ASSERT_TRUE(wait_no_writer());
  auto file = file_bytes();
  EXPECT_EQ(0, std::memcmp(file.data() + 8192, bytes.data(), 200));
  EXPECT_EQ(0, std::memcmp(file.data() + 12288, bytes.data() + 200, 100));
}

// Before authentication a peer is nobody: no session record (status and
// events never see its bytes), no thread. Its identity here is not even
// UTF-8. Only the counters say it was there.
TEST_F(TargetTest, StrangersLeaveNoSessionRecord) {
  start();
  const std::string odd = "\xff\xfe\xfd";
  // One fails authentication...
  auto refused = open_session(target_->port(), "v1", odd);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Errc::kPermissionDenied) << refused.status().to_string();
  // ... one says Hello and waits ...
  auto waiting = transport::connect(transport::Kind::kTcp, "127.0.0.1", target_->port(), {});
  ASSERT_TRUE(waiting.ok());
  session::Messenger messenger(**waiting);
  protocol::Hello hello;
  hello.volume = "v1";
  hello.identity = odd + " waiting";
  ASSERT_TRUE(messenger.send(hello).ok());
  auto challenge = messenger.receive(5000ms, "Challenge");
  ASSERT_TRUE(challenge.ok()) << challenge.status().to_string();
  // ... and another asks for a volume that is not here.
  auto unknown = open_session(target_->port(), "nope", odd);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Errc::kNotFound);

  auto status = to_json(target_->status());
  EXPECT_TRUE(status["volumes"][0]["peers"].empty()) << status.dump();
  EXPECT_EQ(status["admission"]["authentication_failures"], 1) << status.dump();
  EXPECT_EQ(status["admission"]["refused"], 1) << status.dump();
  {
    std::lock_guard lock(events_mutex_);
    EXPECT_TRUE(events_.empty()) << "a stranger made an event";
  }
  // An initiator that authenticates is somebody.
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  auto peers = volume_status()["peers"];
  ASSERT_EQ(peers.size(), 1u);
  // By identity; the connection's address (an ephemeral port) beside it.
  EXPECT_EQ(peers[0]["name"], "app") << peers.dump();
  EXPECT_EQ(peers[0]["address"].get<std::string>().rfind("127.0.0.1:", 0), 0u) << peers.dump();
  EXPECT_EQ(peers[0]["ended"], false) << peers.dump();
}

TEST_F(TargetTest, DescriptorCarriesTheCopysState) {
  start();
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const auto& d = client->descriptor;
  EXPECT_EQ(d.region_size, kVolumeSize);
  EXPECT_EQ(d.data_generation, 0u);
  EXPECT_EQ(d.copy_flags, protocol::kCopyConsistent);
  EXPECT_EQ(d.activity_extent_size, metadata::kActivityExtent);
  EXPECT_TRUE(d.activity_extents.empty());
  // While the session runs, status reads the session's own handle.
  auto copy = volume_status()["copy"];
  EXPECT_EQ(copy["uuid"], metadata::uuid_to_string(d.copy_uuid));
  ASSERT_TRUE(client->send(protocol::Goodbye{}).ok());
  ASSERT_TRUE(wait_no_writer());
  // Closed between sessions: the test (a "local primary") can open it.
  auto md = open_metadata();
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->info().uuid, d.copy_uuid);
}

TEST_F(TargetTest, SetGenerationIsRecordedInTheCopy) {
  start();
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const uint64_t g1 = 0x1111222233334444, g2 = 0x5555666677778888;
  ASSERT_TRUE(client->send(protocol::SetGeneration{g1, 0}).ok());  // resync starts
  EXPECT_EQ(client->expect<protocol::GenerationAck>("GenerationAck").generation, g1);
  auto copy = volume_status()["copy"];
  EXPECT_EQ(copy["generation"], hex16(g1));
  EXPECT_EQ(copy["consistent"], false);
  ASSERT_TRUE(client->send(protocol::SetGeneration{g1, protocol::kGenerationConsistent}).ok());
  EXPECT_EQ(client->expect<protocol::GenerationAck>("GenerationAck").generation, g1);
  ASSERT_TRUE(client->send(protocol::SetGeneration{g2, protocol::kGenerationConsistent}).ok());
  EXPECT_EQ(client->expect<protocol::GenerationAck>("GenerationAck").generation, g2);
  ASSERT_TRUE(client->send(protocol::Goodbye{}).ok());
  ASSERT_TRUE(wait_no_writer());

  auto md = open_metadata();
  ASSERT_NE(md, nullptr);
  auto info = md->info();
  EXPECT_EQ(info.generations.current, g2);
  EXPECT_EQ(info.generations.history[0], g1);
  EXPECT_TRUE(info.consistent);
  md.reset();

  // The next session's descriptor says so.
  auto again = open_session(target_->port());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->descriptor.data_generation, g2);
  EXPECT_EQ(again->descriptor.generation_history[0], g1);
  EXPECT_EQ(again->descriptor.generation_history[1], 0u);
}

TEST_F(TargetTest, UncleanCopyReportsItsActivityLogUntilInSync) {
  write_pattern();  // the copy's file (a missing one would make the copy new)
  {
    // This copy was a primary that crashed with two extents in flight and a
    // peer it tracked.
    auto md = open_metadata();
    ASSERT_NE(md, nullptr);
    ASSERT_TRUE(md->adopt_generation(0xabc, true).ok());
    ASSERT_TRUE(md->peer("c").ok());
    ASSERT_TRUE(md->set_clean(false).ok());
    auto logged =
        md->activity_begin(3 * metadata::kActivityExtent - 1, 2, [](uint64_t) { return false; });
    ASSERT_TRUE(logged.ok()) << logged.status().to_string();
  }
  start();
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const auto& d = client->descriptor;
  EXPECT_EQ(d.copy_flags, protocol::kCopyConsistent | protocol::kCopyUnclean);
  EXPECT_EQ(d.activity_extent_size, metadata::kActivityExtent);
  EXPECT_EQ(d.activity_extents, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(d.data_generation, 0xabcu);
  EXPECT_EQ(volume_status()["copy"]["clean"], false);

  // The new primary resynced those extents: the copy is a plain replica now.
  ASSERT_TRUE(client->send(protocol::SetGeneration{0xdef, protocol::kGenerationConsistent}).ok());
  EXPECT_EQ(client->expect<protocol::GenerationAck>("GenerationAck").generation, 0xdefu);
  ASSERT_TRUE(client->send(protocol::Goodbye{}).ok());
  ASSERT_TRUE(wait_no_writer());
  auto md = open_metadata();
  ASSERT_NE(md, nullptr);
  EXPECT_TRUE(md->info().clean);
  EXPECT_TRUE(md->activity_extents().empty());
  EXPECT_TRUE(md->peers().empty());
}

TEST_F(TargetTest, VerifyHashesEachChunkOfTheRegion) {
  write_pattern();
  start();
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const auto bytes = file_bytes();

  // The whole volume in 64 KiB chunks: 256, the most one request may cover.
  ASSERT_TRUE(client->send(protocol::VerifyRequest{0, kVolumeSize, 64 * 1024}).ok());
  auto reply = client->expect<protocol::VerifyReply>("VerifyReply");
  EXPECT_EQ(reply.offset, 0u);
  EXPECT_EQ(reply.chunk_size, 64u * 1024);
  ASSERT_EQ(reply.hashes.size(), 256u);
  for (size_t i = 0; i < reply.hashes.size(); ++i) {
    ASSERT_EQ(reply.hashes[i], XXH3_64bits(bytes.data() + i * 65536, 65536)) << "chunk " << i;
  }

  // A range whose last chunk is short.
  const uint64_t offset = 1 << 20, length = 100000;
  ASSERT_TRUE(client->send(protocol::VerifyRequest{offset, length, 4096}).ok());
  reply = client->expect<protocol::VerifyReply>("VerifyReply");
  ASSERT_EQ(reply.hashes.size(), 25u);
  EXPECT_EQ(reply.hashes[0], XXH3_64bits(bytes.data() + offset, 4096));
  EXPECT_EQ(reply.hashes[24], XXH3_64bits(bytes.data() + offset + 24 * 4096, length - 24 * 4096));

  // Beyond the region: refused, the session ends.
  ASSERT_TRUE(client->send(protocol::VerifyRequest{kVolumeSize - 4096, 8192, 4096}).ok());
  auto refused = client->receive("VerifyReply");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Errc::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("ends beyond the volume's"));
}

TEST_F(TargetTest, EachCommitIsAnsweredUnlessTheInitiatorTakesCumulativeAcks) {
  start();
  uint64_t sequence = 0;
  {
    // A version-2 initiator (no flags): one CommitAck per Commit, in order.
    auto client = open_session(target_->port());
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    sequence = client->descriptor.last_sequence;
    for (int i = 1; i <= 3; ++i) {
      ASSERT_TRUE(client
                      ->send(protocol::Commit{
                          sequence + i, client->descriptor.generation, {{uint64_t(i) * 4096, 64}}})
                      .ok());
    }
    for (int i = 1; i <= 3; ++i) {
      EXPECT_EQ(client->expect<protocol::CommitAck>("CommitAck").sequence, sequence + i);
    }
    sequence += 3;
    ASSERT_TRUE(client->send(protocol::Goodbye{}).ok());
    ASSERT_TRUE(wait_no_writer());
  }
  // With cumulative acks: 40 Commits back to back (the target keeps 64
  // receive slots, so it answers once 16 are unanswered, and the rest when
  // the session goes idle). Fewer acks, each answering every Commit up to
  // its sequence, the last one the last Commit; every Commit recorded.
  auto client = open_session(target_->port(), "v1", "app", protocol::kHelloCumulativeAcks);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  ASSERT_EQ(client->descriptor.last_sequence, sequence);
  ASSERT_GE(client->descriptor.recv_slots, 16u) << "the target acks every recv_slots / 4";
  const uint64_t first = sequence + 1, last = sequence + 40;
  for (uint64_t s = first; s <= last; ++s) {
    ASSERT_TRUE(
        client->send(protocol::Commit{s, client->descriptor.generation, {{(s % 64) * 4096, 64}}})
            .ok());
  }
  std::vector<uint64_t> acks;
  while (acks.empty() || acks.back() < last) {
    auto ack = client->expect<protocol::CommitAck>("CommitAck");
    if (ack.sequence == 0) break;  // expect() failed
    acks.push_back(ack.sequence);
  }
  ASSERT_FALSE(acks.empty());
  EXPECT_EQ(acks.back(), last);
  EXPECT_LT(acks.size(), 40u);
  EXPECT_TRUE(std::is_sorted(acks.begin(), acks.end()) &&
              std::adjacent_find(acks.begin(), acks.end()) == acks.end())
      << "acks rise";
  ASSERT_TRUE(client->send(protocol::Goodbye{}).ok());
  ASSERT_TRUE(wait_no_writer());
  // The next session starts after the last one recorded.
  auto next = open_session(target_->port());
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  EXPECT_EQ(next->descriptor.last_sequence, last);
}

TEST_F(TargetTest, SplitBrainReportEndsTheSessionAsSplitBrain) {
  start();
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const std::string text = "split brain: node a and node b both moved on from generation 1";
  ASSERT_TRUE(client->send(protocol::ErrorReply{Errc::kSplitBrain, text}).ok());
  ASSERT_TRUE(wait_no_writer());
  auto peer = volume_status()["peers"][0];
  EXPECT_EQ(peer["state"], "split-brain");
  EXPECT_EQ(peer["reason"], text);
  std::lock_guard lock(events_mutex_);
  ASSERT_FALSE(events_.empty());
  EXPECT_EQ(events_.back().to, supervisor::PeerState::kSplitBrain);
  EXPECT_EQ(events_.back().reason, text);
}

TEST_F(TargetTest, PromoteIsRefusedWhileAWriterIsConnectedUnlessForced) {
  start();
  const uint64_t g = 0x77;
  adopt(g);
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();

  auto refused = target_->promote("v1", false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Errc::kBusy);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("is still connected as primary; stop it first, or use --force"));

  auto promoted = target_->promote("v1", true);
  ASSERT_TRUE(promoted.ok()) << promoted.status().to_string();
  EXPECT_EQ(promoted->volume, "v1");
  EXPECT_EQ(promoted->node, "b");
  EXPECT_EQ(promoted->previous, g);
  EXPECT_NE(promoted->generation, g);
  EXPECT_NE(promoted->generation, 0u);
  EXPECT_TRUE(promoted->forced);
  EXPECT_FALSE(promoted->already_promoted);
  // What pmirrord answers `promote` with (docs/control.md).
  const nlohmann::json promoted_json = to_json(*promoted);
  EXPECT_EQ(promoted_json, (nlohmann::json{{"volume", "v1"},
                                           {"node", "b"},
                                           {"generation", hex16(promoted->generation)},
                                           {"previous", hex16(g)},
                                           {"promoted", true},
                                           {"forced", true},
                                           {"already_promoted", false},
                                           {"fences", promoted_json.at("fences")}}));
  // This test's daemon has no cluster file: each other node is reported
  // unfenced, with the reason (the fences themselves: recovery_test).
  ASSERT_EQ(promoted->fences.size(), 2u);
  for (const FenceOutcome& fence : promoted->fences) {
    EXPECT_FALSE(fence.fenced) << fence.node;
    EXPECT_THAT(fence.error, HasSubstr("not a node of the cluster file")) << fence.node;
  }

  // The old primary's session was ended.
  auto ended = client->receive("anything");
  ASSERT_FALSE(ended.ok());
  EXPECT_EQ(ended.status().code(), Errc::kClosed);
  EXPECT_THAT(ended.status().message(), HasSubstr("volume 'v1' was promoted on node b"));

  auto copy = volume_status()["copy"];
  EXPECT_EQ(copy["promoted"], true);
  EXPECT_EQ(copy["generation"], hex16(promoted->generation));
  EXPECT_EQ(copy["history"][0], hex16(g));
}

TEST_F(TargetTest, PromotedCopyRefusesSessionsUntilDemoted) {
  start();
  adopt(0x99);
  auto promoted = target_->promote("v1", false);
  ASSERT_TRUE(promoted.ok()) << promoted.status().to_string();
  EXPECT_FALSE(promoted->forced);
  EXPECT_FALSE(promoted->already_promoted);
  const uint64_t generation = promoted->generation;
  {
    // The configured peers are tracked from the old generation on.
    auto md = open_metadata();
    ASSERT_NE(md, nullptr);
    auto info = md->info();
    EXPECT_TRUE(info.promoted);
    EXPECT_TRUE(info.clean);
    EXPECT_EQ(info.generations.current, generation);
    auto peers = md->peers();
    ASSERT_EQ(peers.size(), 2u);
    EXPECT_EQ(peers[0].name, "a");
    EXPECT_EQ(peers[1].name, "c");
    EXPECT_EQ(peers[0].bitmap_generation, 0x99u);
  }

  auto refused = open_session(target_->port());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Errc::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("volume 'v1' was promoted on node b and accepts no other primary; run "
                        "`pmirrorctl demote v1` on b to make it a replica again"));

  // Promoting again changes nothing.
  auto again = target_->promote("v1", false);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_TRUE(again->already_promoted);
  EXPECT_EQ(again->generation, generation);
  EXPECT_EQ(again->previous, 0x99u);

  auto demoted = target_->demote("v1");
  ASSERT_TRUE(demoted.ok()) << demoted.status().to_string();
  EXPECT_EQ(demoted->generation, generation);
  // What pmirrord answers `demote` with (docs/control.md).
  EXPECT_EQ(to_json(*demoted), (nlohmann::json{{"volume", "v1"},
                                               {"node", "b"},
                                               {"promoted", false},
                                               {"generation", hex16(generation)}}));
  auto accepted = open_session(target_->port());
  ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
  EXPECT_EQ(accepted->descriptor.data_generation, generation);
  EXPECT_EQ(accepted->descriptor.generation_history[0], 0x99u);
}

TEST_F(TargetTest, PromoteRefusesAnEmptyOrInconsistentCopyUnlessForced) {
  start();
  auto empty = target_->promote("v1", false);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Errc::kFailedPrecondition);
  EXPECT_THAT(empty.status().message(), HasSubstr("the copy never received data"));

  adopt(0x42, /*consistent=*/false);  // a resync into the copy was interrupted
  auto mixed = target_->promote("v1", false);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), Errc::kFailedPrecondition);
  EXPECT_THAT(mixed.status().message(),
              HasSubstr("the copy is inconsistent: a resync into it was interrupted; promoting "
                        "it would serve mixed data (use --force to promote anyway)"));

  auto forced = target_->promote("v1", true);
  ASSERT_TRUE(forced.ok()) << forced.status().to_string();
  EXPECT_EQ(volume_status()["copy"]["consistent"], true);
}

// A volume that failed (here: a fault on its mapping, as the tcp receiver's
// guard reports one) ends its session, refuses new ones, shows as failed,
// and is reopened by a reload of the same configuration.
TEST_F(TargetTest, AFailedVolumeEndsItsSessionRefusesNewOnesAndAReloadReopensIt) {
  start();
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  EXPECT_EQ(volume_status()["state"], "ok");
  Status reported = fault::report({client->descriptor.remote_address + 4096, BUS_ADRERR, 0});
  EXPECT_EQ(reported.message(), "volume 'v1' (" + data_path_ +
                                    "): memory fault at offset 4096 (si_code BUS_ADRERR): the "
                                    "backing file was truncated or the medium failed");

  auto ended = client->receive("the end of the session");
  ASSERT_FALSE(ended.ok());
  EXPECT_EQ(ended.status().code(), Errc::kIoError);
  EXPECT_THAT(ended.status().message(), HasSubstr("volume 'v1' on node b has failed"));
  auto status = volume_status();
  EXPECT_EQ(status["state"], "failed");
  EXPECT_EQ(status["error"], reported.message());
  EXPECT_EQ(target_->status().volumes[0].failure, reported.message());
  ASSERT_TRUE(wait_no_writer());

  auto refused = open_session(target_->port());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Errc::kIoError);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("volume 'v1' on node b has failed and takes no writer until an operator "
                        "fixes the cause and reopens it (`systemctl reload pmirrord` or a "
                        "restart): volume 'v1' ("));

  ASSERT_TRUE(target_->reload(config_).ok());
  EXPECT_EQ(volume_status()["state"], "ok");
  auto accepted = open_session(target_->port());
  ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
}

TEST_F(TargetTest, AFailedVolumeThatCannotBeReopenedStaysFailedWhileTheReloadApplies) {
  start();
  uint64_t address = 0;
  {
    auto client = open_session(target_->port());
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    address = client->descriptor.remote_address;
  }
  ASSERT_TRUE(wait_no_writer());
  (void)fault::report({address, BUS_ADRERR, 0});
  ASSERT_EQ(volume_status()["state"], "failed");
  ASSERT_EQ(::truncate(data_path_.c_str(), 0), 0);  // cannot be reopened now

  config::DaemonConfig next = with_second_volume();
  auto reloaded = target_->reload(next);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  EXPECT_EQ(reloaded->added, std::vector<std::string>{"v2"});
  EXPECT_TRUE(reloaded->changed.empty()) << "v1 stays failed: not reopened";
  EXPECT_FALSE(reloaded->dry_run);
  auto status = target_->status().volumes;
  ASSERT_EQ(status.size(), 2u);
  EXPECT_EQ(status[0].name, "v1");
  EXPECT_THAT(status[0].failure, HasSubstr("memory fault at offset 0"));
  EXPECT_EQ(status[1].name, "v2");
  EXPECT_EQ(status[1].failure, "");
}

TEST_F(TargetTest, ADryRunReloadSaysWhatWouldChangeAndChangesNothing) {
  start();
  config::DaemonConfig next = with_second_volume();
  next.volumes[0].apm = config::ApmPolicy::kOff;  // v1 would be reopened

  auto dry = target_->reload(next, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status().to_string();
  EXPECT_TRUE(dry->dry_run);
  EXPECT_EQ(dry->added, std::vector<std::string>{"v2"});
  EXPECT_EQ(dry->changed, std::vector<std::string>{"v1"});
  EXPECT_TRUE(dry->removed.empty());
  ASSERT_EQ(target_->status().volumes.size(), 1u) << "nothing was opened";
  EXPECT_FALSE(fs::exists(next.volumes[1].path));
  EXPECT_EQ(to_json(*dry), nlohmann::json::parse(
                               R"({"dry_run":true,"added":["v2"],"changed":["v1"],"removed":[]})"));

  config::DaemonConfig empty = config_;
  empty.volumes.clear();
  auto removal = target_->reload(empty, /*dry_run=*/true);
  ASSERT_TRUE(removal.ok()) << removal.status().to_string();
  EXPECT_EQ(removal->removed, std::vector<std::string>{"v1"});
  ASSERT_EQ(target_->status().volumes.size(), 1u) << "nothing was removed";

  // What a reload refuses, a dry run refuses too.
  config::DaemonConfig moved = config_;
  moved.port = static_cast<uint16_t>(moved.port + 1);
  auto refused = target_->reload(moved, /*dry_run=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Errc::kConfigError);
  EXPECT_THAT(refused.status().message(), HasSubstr("cannot change on reload"));

  // ... in the reload's words: a size the file does not have, a new
  // volume in a directory that does not exist.
  config::DaemonConfig resized = config_;
  resized.volumes[0].size *= 2;
  config::DaemonConfig elsewhere = with_second_volume();
  const std::string missing = (dir_ / "missing").string();
  elsewhere.volumes[1].path = missing + "/v2.img";
  for (const auto& bad : {resized, elsewhere}) {
    auto dry_refusal = target_->reload(bad, /*dry_run=*/true);
    ASSERT_FALSE(dry_refusal.ok());
    auto refusal = target_->reload(bad);
    ASSERT_FALSE(refusal.ok());
    EXPECT_EQ(dry_refusal.status().to_string(), refusal.status().to_string());
  }
  EXPECT_THAT(target_->reload(elsewhere, /*dry_run=*/true).status().message(),
              HasSubstr("directory " + missing + " for volume 'v2' (" + missing +
                        "/v2.img) does not exist"));
  ASSERT_EQ(target_->status().volumes.size(), 1u) << "nothing was changed";
}

// The serve locks /proc/locks lists on `path`'s inode (OFD locks at byte
// 2^62, where a serving pmirrord marks its copies).
size_t serve_locks_on(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  std::ifstream locks("/proc/locks");
  const std::string at = ":" + std::to_string(st.st_ino) + " 4611686018427387904 ";
  size_t n = 0;
  for (std::string line; std::getline(locks, line);) {
    if (line.find("OFDLCK") != std::string::npos && line.find(at) != std::string::npos) ++n;
  }
  return n;
}

// A reload that reopens a changed volume maps its copy again while the old
// mapping still serves: the process's one lock on the copy goes on (two
// locks of one process on one copy would refuse each other), and it goes
// when the last volume naming the copy does.
TEST_F(TargetTest, AReloadReopeningAVolumeKeepsTheCopysOneServeLock) {
  start();
  EXPECT_EQ(serve_locks_on(data_path_), 1u);
  config::DaemonConfig changed = config_;
  changed.volumes[0].apm = config::ApmPolicy::kOff;  // reopened
  auto reloaded = target_->reload(changed);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  EXPECT_EQ(reloaded->changed, std::vector<std::string>{"v1"});
  EXPECT_EQ(serve_locks_on(data_path_), 1u);
  // Served by this process, not by another: the checks do not refuse it.
  EXPECT_TRUE(check_not_served_elsewhere("v1", data_path_).ok());
  auto client = open_session(target_->port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  client = Status(Errc::kClosed, "done");
  stop();
  EXPECT_EQ(serve_locks_on(data_path_), 0u);
}

TEST_F(TargetTest, UnknownVolume) {
  start();
  auto promoted = target_->promote("nope", false);
  EXPECT_EQ(promoted.status().code(), Errc::kNotFound);
  EXPECT_THAT(promoted.status().message(), HasSubstr("no volume 'nope' on node b"));
  EXPECT_EQ(target_->demote("nope").status().code(), Errc::kNotFound);
}

TEST_F(TargetTest, ALocalPrimaryHoldingTheCopyExcludesSessionsAndCommands) {
  start();
  auto primary = open_metadata();  // as libpmirror on this node would
  ASSERT_NE(primary, nullptr);

  auto refused = open_session(target_->port());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Errc::kBusy);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the copy of volume 'v1' on node b is open as primary by a process on "
                        "that node (metadata pool " +
                        metadata_path_ + " is locked)"));
  EXPECT_EQ(volume_status()["copy"], (nlohmann::json{{"in_use_by_local_primary", true}}));

  auto promoted = target_->promote("v1", true);
  EXPECT_EQ(promoted.status().code(), Errc::kBusy);
  auto demoted = target_->demote("v1");
  EXPECT_EQ(demoted.status().code(), Errc::kBusy);
  EXPECT_THAT(demoted.status().message(),
              HasSubstr("close the application using it as primary first"));

  primary.reset();
  auto accepted = open_session(target_->port());
  EXPECT_TRUE(accepted.ok()) << accepted.status().to_string();
}

// Commands exclude each other, but one that arrives while another runs
// waits for it (within its own bound) instead of being refused: a fence
// refused because this node's promoter was demoting the copy at that
// instant left the copy unfenced. Order, not timing: the second command
// holds the claim only after the first let go.
TEST(WriterClaim, ACommandWaitsForTheCommandUnderWayAndIsRefusedOnlyPastItsBound) {
  ServedVolume volume;
  volume.config.name = "v1";
  auto first = std::make_unique<WriterClaim>();
  ASSERT_TRUE(first->claim_for_command(volume, "pmirrorctl demote on node c", false, "", 1s).ok());

  // Past its bound, the other command is refused, naming the one under way.
  WriterClaim impatient;
  Status refused = impatient.claim_for_command(volume, "a fence from node b", true, "fenced", 50ms);
  EXPECT_EQ(refused.code(), Errc::kBusy);
  EXPECT_THAT(refused.message(),
              HasSubstr("volume 'v1' is busy: pmirrorctl demote on node c is under way"));

  std::atomic<bool> first_released{false};
  std::atomic<bool> second_claimed{false};
  Status second_status;
  WriterClaim second;
  std::thread fence([&] {
    second_status = second.claim_for_command(volume, "a fence from node b", true, "fenced", 60s);
    // The claim can only be held once the first one is gone.
    EXPECT_TRUE(first_released.load());
    second_claimed = true;
  });
  {
    std::lock_guard lock(volume.mutex);
    EXPECT_EQ(volume.admin, "pmirrorctl demote on node c");
  }
  EXPECT_FALSE(second_claimed.load());
  first_released = true;
  first.reset();  // the demote ends
  fence.join();
  ASSERT_TRUE(second_status.ok()) << second_status.to_string();
  std::lock_guard lock(volume.mutex);
  EXPECT_EQ(volume.admin, "a fence from node b");
}

}  // namespace
}  // namespace pmirror::target
