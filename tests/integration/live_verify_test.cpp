// `pmirrorctl verify` on a volume being written: the application stores
// into the mapping and then persists, continuously, while verify compares
// the copies. No run may report a difference that is not there (the bytes
// at the moving write position are either being written or not persisted
// yet); a byte really changed on a replica is still found, exactly its
// chunk. Real pmirrord processes over tcp loopback, verify through the
// test process's control socket as an operator would run it
// (docs/replica-recovery.md, "Verify").
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "initiator/initiator.h"
#include "support/cluster.h"

namespace pmirror {
namespace {

using namespace std::chrono_literals;
using initiator::Volume;
using nlohmann::json;
using testing::ClusterVolumeSpec;
using testing::RunResult;
using testing::ShmDir;
using testing::TestCluster;

constexpr uint64_t kChunk = 64ull << 10;
constexpr uint64_t kSize = 32ull << 20;
// The writer stays in the first half; the corrupted byte is in the second.
constexpr uint64_t kWriterArea = kSize / 2;

bool in_sync(const Volume& volume, const std::string& name) {
  json v = json::parse(volume.status_json());
  for (const auto& p : v["peers"]) {
    if (p.value("name", "") != name) continue;
    return p.value("state", "") == "connected" && p.value("dirty_chunks", uint64_t{1}) == 0 &&
           !p.contains("resync");
  }
  return false;
}

// Stores 512-byte records one after the other into [0, kWriterArea) and
// persists each after storing it, as fast as it can, from its own thread.
class Writer {
 public:
  static constexpr uint64_t kRecord = 512;
  explicit Writer(Volume& volume) : volume_(volume) {}
  ~Writer() { stop(); }

  void start() {
    thread_ = std::thread([this] {
      uint64_t n = 0;
      while (!stop_) {
        uint64_t offset = (n % (kWriterArea / kRecord)) * kRecord;
        for (uint64_t i = 0; i < kRecord; i += 8) {
          uint64_t word = (n + 1) * 0x9e3779b97f4a7c15ull + i;
          std::memcpy(volume_.data() + offset + i, &word, 8);
        }
        Status s = volume_.persist(offset, kRecord);
        if (!s.ok()) {
          failure_ = s.to_string();
          return;
        }
        count_ = ++n;
      }
    });
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t count() const { return count_.load(); }
  const std::string& failure() const { return failure_; }  // after stop()

 private:
  Volume& volume_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> count_{0};
  std::string failure_;
  std::thread thread_;
};

class LiveVerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<TestCluster>(dir_.path(), "tcp", "127.0.0.1");
    ::setenv("PMIRROR_RUNTIME_DIR", cluster_->runtime_dir().c_str(), 1);
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", cluster_->logs().c_str());
    cluster_.reset();
    ::unsetenv("PMIRROR_RUNTIME_DIR");
  }

  ShmDir dir_;
  std::unique_ptr<TestCluster> cluster_;
};

TEST_F(LiveVerifyTest, NoFalseDifferenceWhileWritingAndARealOneIsFound) {
  cluster_->add_node("app", false);
  cluster_->add_node("n1");
  cluster_->add_node("n2");
  ClusterVolumeSpec spec;
  spec.size = kSize;
  spec.primary = "app";
  spec.replicas = {"n1", "n2"};
  spec.chunk = "64KiB";
  spec.resync_rate = "unlimited";
  spec.explicit_metadata = true;
  cluster_->add_volume(spec);
  cluster_->write_config();
  ASSERT_TRUE(cluster_->start("n1")) << cluster_->logs();
  ASSERT_TRUE(cluster_->start("n2")) << cluster_->logs();
  auto opened = Volume::open_from_config(cluster_->config_path(), "v", "app", "app");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string() << cluster_->logs();
  Volume& v = **opened;
  ASSERT_TRUE(testing::eventually([&] { return in_sync(v, "n1") && in_sync(v, "n2"); }, 30s))
      << v.status_json();

  Writer writer(v);
  writer.start();
  ASSERT_TRUE(testing::eventually([&] { return writer.count() > 100; }, 30s));
  uint64_t busy_reported = 0;
  for (int run = 1; run <= 20; ++run) {
    uint64_t before = writer.count();
    RunResult r = cluster_->ctl("n1", {"verify", "v", "--json"});
    json result = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(result.is_object()) << r.text();
    EXPECT_EQ(r.exit, 0) << "run " << run << " reported a difference while writing: " << r.text();
    for (const auto& peer : result["peers"]) {
      EXPECT_EQ(peer.value("mismatch_count", uint64_t{1}), 0u) << "run " << run << ": " << r.text();
      EXPECT_FALSE(peer.contains("error")) << "run " << run << ": " << r.text();
      busy_reported += peer.value("busy_count", uint64_t{0});
    }
    ASSERT_TRUE(testing::eventually([&] { return writer.count() > before; }, 30s))
        << "the writer is stuck";
  }
  std::fprintf(stderr, "[live verify] 20 runs, %llu persists, %llu busy ranges reported\n",
               static_cast<unsigned long long>(writer.count()),
               static_cast<unsigned long long>(busy_reported));

  // A byte changed behind pmirror's back, outside what the writer touches:
  // found while the writer goes on, and nothing else.
  const uint64_t bad = kWriterArea + 37 * kChunk + 4321;
  {
    int fd = ::open(cluster_->copy_path("n1").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(bad)), 1);
    byte = static_cast<char>(~byte);
    ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(bad)), 1);
    ::close(fd);
  }
  RunResult found = cluster_->ctl("n1", {"verify", "v", "--json"});
  EXPECT_EQ(found.exit, 6) << found.text();
  json result = json::parse(found.out, nullptr, false);
  ASSERT_TRUE(result.is_object()) << found.text();
  for (const auto& peer : result["peers"]) {
    if (peer.value("name", "") == "n2") {
      EXPECT_EQ(peer.value("mismatch_count", uint64_t{1}), 0u) << found.text();
      continue;
    }
    ASSERT_EQ(peer.value("mismatch_count", uint64_t{0}), 1u) << found.text();
    const json& range = peer["mismatches"][0];
    EXPECT_EQ(range.value("offset", uint64_t{0}), bad / kChunk * kChunk) << found.text();
    EXPECT_EQ(range.value("length", uint64_t{0}), kChunk) << found.text();
  }
  auto in_process = v.verify("n1", false);
  ASSERT_TRUE(in_process.ok()) << in_process.status().to_string();
  ASSERT_EQ(in_process->size(), 1u);
  ASSERT_EQ(in_process->front().mismatches.size(), 1u);
  EXPECT_EQ(in_process->front().mismatches[0].first, bad / kChunk * kChunk);
  EXPECT_EQ(in_process->front().mismatches[0].second, kChunk);
  writer.stop();
  EXPECT_EQ(writer.failure(), "");
}

// The application keeps storing into one chunk and never persists it:
// the replica rightly has older bytes there, which is no damage. verify
// reports that chunk busy (not verified), never as differing.
TEST_F(LiveVerifyTest, AChunkStoredToWithoutPersistIsBusyNotDiffering) {
  cluster_->add_node("app", false);
  cluster_->add_node("n1");
  ClusterVolumeSpec spec;
  spec.size = 4ull << 20;
  spec.primary = "app";
  spec.replicas = {"n1"};
  spec.chunk = "64KiB";
  spec.resync_rate = "unlimited";
  spec.explicit_metadata = true;
  cluster_->add_volume(spec);
  cluster_->write_config();
  ASSERT_TRUE(cluster_->start("n1")) << cluster_->logs();
  auto opened = Volume::open_from_config(cluster_->config_path(), "v", "app", "app");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string() << cluster_->logs();
  Volume& v = **opened;
  ASSERT_TRUE(testing::eventually([&] { return in_sync(v, "n1"); }, 30s)) << v.status_json();

  const uint64_t hot = 5 * kChunk;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> stores{0};
  std::thread storer([&] {
    volatile uint64_t* words = reinterpret_cast<volatile uint64_t*>(v.data() + hot);
    for (uint64_t n = 1; !stop; ++n) {
      words[n % (kChunk / 8)] = n;
      stores = n;
    }
  });
  ASSERT_TRUE(testing::eventually([&] { return stores.load() > 1000; }, 30s));
  RunResult r = cluster_->ctl("n1", {"verify", "v", "--json"});
  RunResult human = cluster_->ctl("n1", {"verify", "v"});
  uint64_t stored = stores.load();
  stop = true;
  storer.join();
  json result = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(result.is_object()) << r.text();
  EXPECT_EQ(r.exit, 0) << r.text();
  ASSERT_EQ(result["peers"].size(), 1u) << r.text();
  const json& peer = result["peers"][0];
  EXPECT_EQ(peer.value("mismatch_count", uint64_t{1}), 0u) << r.text();
  ASSERT_EQ(peer.value("busy_count", uint64_t{0}), 1u) << r.text();
  EXPECT_EQ(peer["busy"][0].value("offset", uint64_t{0}), hot) << r.text();
  EXPECT_EQ(peer["busy"][0].value("length", uint64_t{0}), kChunk) << r.text();
  EXPECT_EQ(human.exit, 0) << human.text();
  EXPECT_NE(human.out.find("busy"), std::string::npos) << human.text();
  std::fprintf(stderr, "[live verify] %llu stores into one chunk during verify; %s",
               static_cast<unsigned long long>(stored), human.out.c_str());

  // Persisted, it is equal again: nothing was damaged.
  ASSERT_TRUE(v.persist(hot, kChunk).ok());
  auto after = v.verify("n1", false);
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  EXPECT_TRUE(after->front().mismatches.empty());
  EXPECT_TRUE(after->front().busy.empty());
}

}  // namespace
}  // namespace pmirror
