// Crash consistency (issue 5), deterministically: the real libpmirror Volume
// and the real pmirrord Target run in this process over the fake fabric
// (transport Kind::kFake, docs/transport-fake.md). The application persists
// sequence-numbered records; the target's node (or everything) crashes
// after exactly k operations of the initiator, for every k of the workload;
// the fake rolls the target's region back to what a flush covered (whole
// Writes, or torn at 8-byte words). The replica must then hold every
// acknowledged record, intact, and -- without tearing -- exactly a prefix
// of the records.
//
// GPSPM durability comes from the target persisting a PersistRequest's
// ranges itself (region::Region::persist -> pmem_msync / pmem_persist).
// The fake cannot see that call, so this test interposes both functions:
// the static pmirror_region library resolves them to the definitions below,
// which call libpmem's and then tell the installed fabric
// (fake::owner_persisted). Switching that off is one of the negative
// controls: the target then acknowledges what the fake considers volatile,
// and the checker must report the loss.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "config/config.h"
#include "initiator/initiator.h"
#include "metadata/metadata.h"
#include "target/target.h"
#include "transport/fake/fake_fabric.h"
#include "transport/fake/fake_transport.h"
#include "transport/transport.h"

namespace {
// Whether the target's own persists reach the fake (negative control: off).
std::atomic<bool> g_route_owner_persists{true};
std::atomic<uint64_t> g_owner_persists{0};  // calls routed to the fabric
}  // namespace

extern "C" int pmem_msync(const void* addr, size_t len) {
  using Fn = int (*)(const void*, size_t);
  static Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "pmem_msync"));
  int rc = real(addr, len);
  if (rc == 0 && g_route_owner_persists.load()) {
    ++g_owner_persists;
    pmirror::transport::fake::owner_persisted(addr, len);
  }
  return rc;
}

extern "C" void pmem_persist(const void* addr, size_t len) {
  using Fn = void (*)(const void*, size_t);
  static Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "pmem_persist"));
  real(addr, len);
  if (g_route_owner_persists.load()) {
    ++g_owner_persists;
    pmirror::transport::fake::owner_persisted(addr, len);
  }
}

namespace pmirror {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using transport::fake::CrashOptions;
using transport::fake::FabricOptions;
using transport::fake::FakeFabric;

constexpr uint64_t kSize = 256 * 1024;
constexpr uint64_t kSlot = 512;  // records live in distinct 512-byte slots
constexpr uint64_t kSlots = kSize / kSlot;
constexpr uint64_t kMagic = 0x5245434f52440001ull;  // "RECORD" v1
constexpr char kSecret[] = "crash-consistency-secret";
constexpr char kTargetNode[] = "target";
constexpr char kInitiatorNode[] = "initiator";

// ------------------------------------------------------------------ records

// Record i (1-based): a slot chosen by a permutation (so that consecutive
// records land far apart), an 8-aligned offset inside it and a length of
// 40..432 bytes, multiple of 8: {magic, i, length, payload..., checksum}.
uint64_t record_offset(uint64_t i) { return (i * 37 % kSlots) * kSlot + (i % 7) * 8; }
uint64_t record_length(uint64_t i) { return 40 + (i * 24) % 400; }

uint64_t fnv1a(std::span<const std::byte> bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : bytes) {
    h ^= static_cast<uint8_t>(b);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<std::byte> record_bytes(uint64_t i) {
  std::vector<std::byte> r(record_length(i));
  uint64_t header[3] = {kMagic, i, r.size()};
  std::memcpy(r.data(), header, sizeof header);
  for (size_t p = sizeof header; p + 8 < r.size(); ++p) {
    r[p] = static_cast<std::byte>((i * 131 + p * 7) | 1);  // never zero
  }
  uint64_t sum = fnv1a(std::span(r).first(r.size() - 8));
  std::memcpy(r.data() + r.size() - 8, &sum, 8);
  return r;
}

enum class Found { kAbsent, kIntact, kTorn };

// What the replica holds of record i: the old bytes (zeros), the record
// (its header names it and its checksum holds), or anything else.
Found classify(std::span<const std::byte> replica, uint64_t i) {
  auto got = replica.subspan(record_offset(i), record_length(i));
  if (std::all_of(got.begin(), got.end(), [](std::byte b) { return b == std::byte{0}; })) {
    return Found::kAbsent;
  }
  uint64_t header[3];
  std::memcpy(header, got.data(), sizeof header);
  uint64_t sum = 0;
  std::memcpy(&sum, got.data() + got.size() - 8, 8);
  bool valid = header[0] == kMagic && header[1] == i && header[2] == got.size() &&
               sum == fnv1a(got.first(got.size() - 8));
  auto want = record_bytes(i);
  bool equal = std::equal(got.begin(), got.end(), want.begin());
  EXPECT_EQ(valid, equal) << "record " << i << ": checksum and content disagree";
  return equal ? Found::kIntact : Found::kTorn;
}

const char* found_name(Found f) {
  switch (f) {
    case Found::kAbsent:
      return "absent";
    case Found::kIntact:
      return "intact";
    case Found::kTorn:
      return "torn";
  }
  return "?";
}

struct Verdict {
  std::vector<std::string> violations;
  uint64_t intact = 0, torn = 0;
  bool unacked_survived = false;  // a record not acknowledged is intact
  bool unacked_lost = false;      // a record written, not acknowledged, is absent or torn

  std::string text() const {
    std::string s;
    for (const auto& v : violations) s += "\n  " + v;
    return s;
  }
};

// The records in the order they were posted (`order`, what each is in
// `found`): with whole Writes the intact ones are a prefix of it, the rest
// absent.
void check_prefix(const std::vector<uint64_t>& order, std::span<const Found> found, Verdict& v) {
  size_t prefix = 0;
  while (prefix < found.size() && found[prefix] == Found::kIntact) ++prefix;
  for (size_t k = prefix; k < found.size(); ++k) {
    if (found[k] != Found::kAbsent) {
      v.violations.push_back("record " + std::to_string(order[k]) + " is " + found_name(found[k]) +
                             " although record " + std::to_string(order[prefix]) +
                             ", posted before it, is not: the replica does not hold a prefix");
    }
  }
}

// The ordering invariant with tearing: after the intact prefix at most one
// record is there in part (torn), and every later one is absent.
void check_boundary_plus_one(std::span<const Found> found, Verdict& v) {
  size_t k = 0;
  while (k < found.size() && found[k] == Found::kIntact) ++k;
  const size_t boundary = k;
  if (k < found.size() && found[k] == Found::kTorn) ++k;
  for (; k < found.size(); ++k) {
    if (found[k] != Found::kAbsent) {
      v.violations.push_back("record " + std::to_string(k + 1) + " is " + found_name(found[k]) +
                             " beyond the persist boundary after record " +
                             std::to_string(boundary) +
                             " and the one persist after it: a later persist landed before an "
                             "earlier one");
      break;
    }
  }
}

// No byte outside the records (`covered`) changed.
void check_outside_records(std::span<const std::byte> replica, const std::vector<bool>& covered,
                           Verdict& v) {
  for (size_t b = 0; b < replica.size(); ++b) {
    if (!covered[b] && replica[b] != std::byte{0}) {
      v.violations.push_back("byte " + std::to_string(b) + " outside every record changed");
      break;
    }
  }
}

// Records 1..written were written (locally, and posted or about to be),
// 1..acked were acknowledged. Always: every acknowledged record is intact,
// and no record is present without every earlier acknowledged one; no byte
// outside the records changed. `strict` (whole Writes, no tearing): no
// record is torn and the intact records are exactly a prefix 1..k.
Verdict check_replica(std::span<const std::byte> replica, uint64_t written, uint64_t acked,
                      bool strict) {
  Verdict v;
  std::vector<Found> found(written + 1, Found::kAbsent);
  std::vector<bool> covered(replica.size(), false);
  for (uint64_t i = 1; i <= written; ++i) {
    found[i] = classify(replica, i);
    for (uint64_t b = 0; b < record_length(i); ++b) covered[record_offset(i) + b] = true;
    if (found[i] == Found::kIntact) ++v.intact;
    if (found[i] == Found::kTorn) ++v.torn;
    if (i > acked && found[i] == Found::kIntact) v.unacked_survived = true;
    if (i > acked && found[i] != Found::kIntact) v.unacked_lost = true;
  }
  for (uint64_t i = 1; i <= acked; ++i) {
    if (found[i] != Found::kIntact) {
      v.violations.push_back("record " + std::to_string(i) + " was acknowledged but is " +
                             found_name(found[i]) + " on the replica");
    }
  }
  // The prefix property as the issue states it.
  for (uint64_t j = 1; j <= written; ++j) {
    if (found[j] != Found::kIntact) continue;
    for (uint64_t i = 1; i < j && i <= acked; ++i) {
      if (found[i] != Found::kIntact) {
        v.violations.push_back("record " + std::to_string(j) +
                               " is on the replica without the earlier acknowledged record " +
                               std::to_string(i));
        break;
      }
    }
  }
  if (strict) {
    std::vector<uint64_t> in_order(written);
    std::iota(in_order.begin(), in_order.end(), uint64_t{1});
    check_prefix(in_order, std::span(found).subspan(1), v);
  }
  check_outside_records(replica, covered, v);
  return v;
}

// Several writers: the records' order is their sequences' (`in_sequence`),
// not their numbers; `unsequenced` were written locally and never posted.
// Always: every acknowledged record is intact, no byte outside the records
// changed. `strict` (whole Writes): nothing is torn, and the intact records
// are a prefix of the sequence order, the unsequenced ones absent.
Verdict check_replica_in_order(std::span<const std::byte> replica,
                               const std::vector<uint64_t>& in_sequence,
                               const std::vector<uint64_t>& unsequenced,
                               const std::set<uint64_t>& acked, bool strict) {
  Verdict v;
  std::vector<bool> covered(replica.size(), false);
  std::vector<Found> found;
  auto look = [&](uint64_t i) {
    Found f = classify(replica, i);
    for (uint64_t b = 0; b < record_length(i); ++b) covered[record_offset(i) + b] = true;
    if (f == Found::kIntact) ++v.intact;
    if (f == Found::kTorn) ++v.torn;
    const bool is_acked = acked.contains(i);
    if (!is_acked && f == Found::kIntact) v.unacked_survived = true;
    if (!is_acked && f != Found::kIntact) v.unacked_lost = true;
    if (is_acked && f != Found::kIntact) {
      v.violations.push_back("record " + std::to_string(i) + " was acknowledged but is " +
                             found_name(f) + " on the replica");
    }
    return f;
  };
  for (uint64_t i : in_sequence) found.push_back(look(i));
  for (uint64_t i : unsequenced) {
    Found f = look(i);
    if (strict && f != Found::kAbsent) {
      v.violations.push_back("record " + std::to_string(i) + " was never posted but is " +
                             found_name(f));
    }
  }
  if (strict) check_prefix(in_sequence, found, v);
  check_outside_records(replica, covered, v);
  return v;
}

// --------------------------------------------------------------- the rig

std::vector<std::byte> read_file(const std::string& path, uint64_t size) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes(size);
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  EXPECT_TRUE(in.good()) << "reading " << path;
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), bytes.data(), size);
  return out;
}

enum class Mode { kSync, kAsync };

struct Scenario {
  config::ApmPolicy apm = config::ApmPolicy::kOn;  // what the target offers (kOff: GPSPM)
  // With fabric.native_persistence and a pmem copy: kAuto also records each
  // persist by ATOMIC WRITE (one-sided commit), kFlush does not.
  config::NativePersistence native = config::NativePersistence::kAuto;
  FabricOptions fabric;
  Mode mode = Mode::kSync;
  uint64_t records = 12;
  uint64_t window = 4;                   // kAsync: persists started before waiting for them
  // kAsync, > 1: each window is one persist_ordered_async of its records,
  // a group each (the ordered groups of one persist, issue 25).
  bool ordered_groups = false;
  std::string crash_node = kTargetNode;  // empty: the initiator and the target crash
  bool tear = false;
  // The fake keeps unflushed Writes as a prefix of their placement order
  // (the APM model), not independently.
  bool in_placement_order = false;
  // Check the ordering invariant (docs/protocol.md, "Ordering"): the
  // intact records are a prefix, at most the one record after them is
  // torn, the rest absent -- a state the primary passed through at a
  // persist boundary, plus part of the next persist.
  bool boundary_plus_one = false;
  // Application threads persisting at once (> 1: writer w persists records
  // w+1, w+1+writers, ... with persist_async + wait, each as it goes).
  uint64_t writers = 1;
};

struct Outcome {
  uint64_t written = 0;     // records stored locally and handed to persist
  uint64_t acked = 0;       // records whose persist (or wait) returned ok
  uint64_t operations = 0;  // initiator operations the fabric executed during the workload
  bool crashed = false;
  std::string method;  // what the replica used
  std::vector<std::byte> replica;
  // One-sided commit: the target's commit word once the run ended (read
  // from its metadata pool after the target stopped).
  metadata::CommitWord commit_word;
  // Several writers: the records in the order of their sequences, those
  // written but never given one, and those acknowledged.
  std::vector<uint64_t> in_sequence;
  std::vector<uint64_t> unsequenced;
  std::set<uint64_t> acked_records;
};

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log::set_level(::getenv("PMIRROR_TEST_LOG") ? spdlog::level::debug : spdlog::level::off);
    std::string shm = "/dev/shm/pmirror-crash-XXXXXX";
    ASSERT_NE(::mkdtemp(shm.data()), nullptr) << std::strerror(errno);
    shm_ = shm;
    // The state pool's temp dir on tmpfs too: a libpmemobj pool on a disk
    // costs a few hundred ms per run in msync.
    std::string tmp = "/dev/shm/pmirror-crash-state-XXXXXX";
    ASSERT_NE(::mkdtemp(tmp.data()), nullptr) << std::strerror(errno);
    tmp_ = tmp;
    g_route_owner_persists = true;
  }

  void TearDown() override {
    stop_target();
    transport::fake::install_fabric(nullptr);
    g_route_owner_persists = true;
    std::error_code ec;
    fs::remove_all(shm_, ec);
    fs::remove_all(tmp_, ec);
  }

  std::string target_path() const { return (shm_ / "target.img").string(); }
  std::string local_path() const { return (shm_ / "local.img").string(); }

  void remove_files() {
    std::error_code ec;
    for (const auto& dir : {shm_, tmp_}) {
      for (const auto& entry : fs::directory_iterator(dir)) fs::remove_all(entry.path(), ec);
    }
  }

  void start_target(const Scenario& s) {
    config::DaemonConfig config;
    config.node = kTargetNode;
    config.listen_address = kTargetNode;  // the fabric node
    config.port = 0;
    config.transport = transport::Kind::kFake;
    config.state_pool = (tmp_ / "pmirrord.state").string();
    config::VolumeConfig volume;
    volume.name = "v";
    volume.path = target_path();
    volume.size = kSize;
    volume.create = true;
    volume.allowed_peers = {"app"};
    volume.secret = kSecret;
    volume.apm = s.apm;
    volume.native_persistence = s.native;
    volume.metadata_path = target_path() + ".pmirror";
    volume.primary = kInitiatorNode;
    volume.peers = {kInitiatorNode};
    config.volumes.push_back(volume);
    target::TargetOptions options;
    options.session_timeout = 60s;
    options.handshake_timeout = 10s;
    auto started = target::Target::start(config, options);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    target_ = std::move(started).value();
    runner_ = std::thread([this] { run_status_ = target_->run(); });
  }

  void stop_target() {
    if (target_ == nullptr) return;
    target_->stop();
    if (runner_.joinable()) runner_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_.to_string();
    target_.reset();
  }

  Result<std::unique_ptr<initiator::Volume>> open_volume(bool create) {
    initiator::VolumeOptions o;
    o.name = "v";
    o.local_path = local_path();
    o.metadata_path = local_path() + ".pmirror";
    o.size = kSize;
    o.create = create;
    o.identity = "app";
    initiator::ReplicaSpec replica;
    replica.address = kTargetNode;
    replica.port = target_->port();
    replica.transport = "fake";  // resolves: the test installed a FakeFabric
    replica.secret = kSecret;
    replica.node = kTargetNode;
    o.replicas = {replica};
    o.max_in_flight = 8;
    o.connect_timeout = 10s;
    o.operation_timeout = 10s;
    // Nothing may happen behind the workload's back: no heartbeats, no
    // reconnect (and so no resync over the crashed replica) during a run.
    o.heartbeat_interval = 1h;
    o.reconnect_initial = 1h;
    o.reconnect_max = 1h;
    o.resync_rate = 0;
    o.open_sync_timeout = 30s;
    return initiator::Volume::open(o);
  }

  // The workload: records 1..s.records, persisted one at a time (kSync) or
  // s.window at a time with persist_async (kAsync); stops at the first
  // failure (the replica is gone: ack is "all").
  static void run_workload(initiator::Volume& volume, const Scenario& s, Outcome& out) {
    std::vector<std::pair<uint64_t, uint64_t>> pending;  // (sequence, record)
    for (uint64_t i = 1; i <= s.records; ++i) {
      auto r = record_bytes(i);
      std::memcpy(volume.data() + record_offset(i), r.data(), r.size());
      out.written = i;
      if (s.mode == Mode::kSync) {
        if (!volume.persist(record_offset(i), r.size()).ok()) return;
        out.acked = i;
        continue;
      }
      if (s.ordered_groups) {
        pending.emplace_back(0, i);
        if (pending.size() < s.window && i < s.records) continue;
        std::vector<PersistRange> ranges;
        for (const auto& [unused, record] : pending) {
          ranges.push_back({record_offset(record), record_bytes(record).size()});
        }
        std::vector<uint32_t> sizes(ranges.size(), 1);
        auto sequence =
            volume.persist_ordered_async(ranges.data(), ranges.size(), sizes.data(), sizes.size());
        if (!sequence.ok() || !volume.wait(*sequence).ok()) return;
        out.acked = pending.back().second;
        pending.clear();
        continue;
      }
      auto sequence = volume.persist_async(record_offset(i), r.size());
      if (!sequence.ok()) return;
      pending.emplace_back(*sequence, i);
      if (pending.size() == s.window || i == s.records) {
        if (!volume.wait(pending.back().first).ok()) return;
        out.acked = pending.back().second;
        pending.clear();
      }
    }
  }

  // Several writers, each persisting its own records one at a time
  // (persist_async for the sequence, then wait); each stops at its first
  // failure.
  static void run_writers(initiator::Volume& volume, const Scenario& s, Outcome& out) {
    std::mutex mutex;
    std::vector<std::pair<uint64_t, uint64_t>> sequenced;  // (sequence, record)
    std::set<uint64_t> written;
    std::vector<std::thread> threads;
    for (uint64_t w = 0; w < s.writers; ++w) {
      threads.emplace_back([&, w] {
        for (uint64_t i = w + 1; i <= s.records; i += s.writers) {
          auto r = record_bytes(i);
          std::memcpy(volume.data() + record_offset(i), r.data(), r.size());
          {
            std::lock_guard lock(mutex);
            written.insert(i);
          }
          auto sequence = volume.persist_async(record_offset(i), r.size());
          if (!sequence.ok()) return;
          {
            std::lock_guard lock(mutex);
            sequenced.emplace_back(*sequence, i);
          }
          if (!volume.wait(*sequence).ok()) return;
          std::lock_guard lock(mutex);
          out.acked_records.insert(i);
        }
      });
    }
    for (auto& t : threads) t.join();
    std::sort(sequenced.begin(), sequenced.end());
    for (const auto& [sequence, record] : sequenced) {
      out.in_sequence.push_back(record);
      written.erase(record);
    }
    out.unsequenced.assign(written.begin(), written.end());
    out.written = out.in_sequence.size() + out.unsequenced.size();
    out.acked = out.acked_records.size();
  }

  static Verdict check(const Scenario& s, const Outcome& out, bool strict) {
    if (s.writers > 1) {
      return check_replica_in_order(out.replica, out.in_sequence, out.unsequenced,
                                    out.acked_records, strict);
    }
    return check_replica(out.replica, out.written, out.acked, strict);
  }

  // crash_at: once the workload has finished (every persist returned).
  static constexpr uint64_t kAtEnd = UINT64_MAX;

  // One run: fresh files, fabric, target and volume; the crash armed after
  // `crash_at` initiator operations of the workload (none: no crash).
  Outcome run_once(const Scenario& s, std::optional<uint64_t> crash_at) {
    Outcome out;
    remove_files();
    auto fabric = FakeFabric::create(s.fabric);
    transport::fake::ScopedFabric installed(fabric, kInitiatorNode);
    start_target(s);
    if (target_ == nullptr) return out;
    {
      auto volume = open_volume(/*create=*/true);
      EXPECT_TRUE(volume.ok()) << volume.status().to_string();
      if (!volume.ok()) return out;
      auto replicas = (*volume)->replicas();
      out.method = replicas.empty() ? "" : replicas[0].method;
      uint64_t before = fabric->executed(kInitiatorNode);
      CrashOptions crash;
      crash.tear = s.tear;
      crash.in_placement_order = s.in_placement_order;
      crash.seed = 1000 + crash_at.value_or(0);
      if (crash_at && *crash_at != kAtEnd) {
        fabric->crash_after(*crash_at, s.crash_node, crash, kInitiatorNode);
      }
      if (s.writers > 1) {
        run_writers(**volume, s, out);
      } else {
        run_workload(**volume, s, out);
      }
      if (crash_at == kAtEnd) fabric->crash_after(0, s.crash_node, crash);
      out.operations = fabric->executed(kInitiatorNode) - before;
      out.crashed = fabric->crashes() > 0;
      // The replica as the crash left it: its file (the mapping is shared).
      out.replica = read_file(target_path(), kSize);
      // The initiator's process is gone too, or about to close: nothing it
      // does now reaches the crashed target (its connection is broken).
    }
    stop_target();
    metadata::CopyMetadata::Options md;
    md.path = target_path() + ".pmirror";
    md.volume_size = kSize;
    md.create_if_missing = false;
    if (auto opened = metadata::CopyMetadata::open(md); opened.ok()) {
      out.commit_word = (*opened)->commit_word();
    }
    return out;
  }

  // The sequence of record i in a single-writer run (sequences start at 1
  // on a fresh target; an ordered persist of a window's records takes one).
  static uint64_t sequence_of(const Scenario& s, uint64_t i) {
    return s.ordered_groups ? (i - 1) / s.window + 1 : i;
  }

  // One-sided commit: the commit word never names a persist whose records
  // are not all intact on the replica (the ATOMIC WRITE is fenced behind
  // the persist's FLUSHes).
  static void check_commit_word(const Scenario& s, const Outcome& out, Verdict& v) {
    for (uint64_t i = 1; i <= out.written; ++i) {
      if (sequence_of(s, i) > out.commit_word.sequence) break;
      if (classify(out.replica, i) != Found::kIntact) {
        v.violations.push_back("the commit word says sequence " +
                               std::to_string(out.commit_word.sequence) + ", but record " +
                               std::to_string(i) + " (sequence " +
                               std::to_string(sequence_of(s, i)) + ") is not intact");
        return;
      }
    }
  }

  struct Coverage {
    uint64_t runs = 0;
    uint64_t unacked_survived = 0;  // crash after the flush, before the acknowledgement
    uint64_t unacked_lost = 0;      // crash with a Write not flushed yet
    uint64_t torn = 0;
    uint64_t workload_operations = 0;  // the dry run's initiator operations
  };

  // Measures the workload, then crashes once after each of its operations.
  Coverage sweep(const Scenario& s) {
    Coverage c;
    uint64_t owner_persists = g_owner_persists.load();
    Outcome dry = run_once(s, std::nullopt);
    if (s.apm == config::ApmPolicy::kOff) {
      // GPSPM is durable through the target's own persists: they must have
      // reached the fabric, or the interposition above is not in effect.
      EXPECT_GT(g_owner_persists.load(), owner_persists + s.records)
          << "the target's pmem_msync/pmem_persist calls did not reach the fake fabric";
    }
    EXPECT_FALSE(dry.crashed);
    EXPECT_EQ(dry.acked, s.records) << "the workload fails without a crash";
    // Native flush: where the fabric has FLUSH and the target's copy is
    // pmem (PMEM_IS_PMEM_FORCE in these tests).
    const char* forced = std::getenv("PMEM_IS_PMEM_FORCE");
    const bool native = s.fabric.native_persistence && forced != nullptr &&
                        std::string_view(forced) == "1" &&
                        s.native != config::NativePersistence::kOff;
    const bool one_sided =
        native && s.native == config::NativePersistence::kAuto && s.apm != config::ApmPolicy::kOff;
    EXPECT_EQ(dry.method, s.apm == config::ApmPolicy::kOff ? "gpspm"
                          : one_sided                      ? "one-sided-commit"
                          : native                         ? "native-flush"
                                                           : "apm");
    if (one_sided && s.writers == 1) {
      // Every persist's sequence reached the word; the target read it.
      EXPECT_EQ(dry.commit_word.sequence, sequence_of(s, s.records));
      EXPECT_NE(dry.commit_word.generation, 0u);
    } else if (!one_sided) {
      EXPECT_EQ(dry.commit_word.generation, 0u) << "a word armed without one-sided commit";
    }
    Verdict clean = check(s, dry, true);
    EXPECT_TRUE(clean.violations.empty()) << "without a crash:" << clean.text();
    EXPECT_EQ(clean.intact, s.records);
    EXPECT_GT(dry.operations, s.records);
    c.workload_operations = dry.operations;
    // After each operation, and once every persist has returned.
    for (uint64_t k = 0; k <= dry.operations + 1; ++k) {
      Outcome out = run_once(s, k <= dry.operations ? k : kAtEnd);
      // Several writers coalesce their persists as the threads happen to
      // meet, so a run may take fewer operations than the dry run: a crash
      // point past the end of this run's own workload cannot happen (the
      // run is then a crash-free one, checked as such below).
      const bool past_this_run = s.writers > 1 && k <= dry.operations && out.operations <= k;
      EXPECT_TRUE(out.crashed || past_this_run)
          << "crash after " << k << " operations did not happen (" << out.operations
          << " operations in this run)";
      EXPECT_LE(out.acked, out.written);
      if (k > dry.operations) {
        EXPECT_EQ(out.acked, s.records);
      }
      Verdict v = check(s, out, !s.tear);
      if (s.boundary_plus_one) {
        std::vector<Found> found;
        for (uint64_t i = 1; i <= out.written; ++i) found.push_back(classify(out.replica, i));
        check_boundary_plus_one(found, v);
      }
      if (one_sided && s.writers == 1) check_commit_word(s, out, v);
      EXPECT_TRUE(v.violations.empty())
          << "crash after " << k << " of " << dry.operations << " operations (" << out.acked
          << " acknowledged, " << out.written << " written):" << v.text();
      ++c.runs;
      c.unacked_survived += v.unacked_survived ? 1 : 0;
      c.unacked_lost += v.unacked_lost ? 1 : 0;
      c.torn += v.torn;
      if (HasFailure()) break;  // one failing point says enough
    }
    return c;
  }

  fs::path shm_, tmp_;
  std::unique_ptr<target::Target> target_;
  std::thread runner_;
  Status run_status_;
};

// ----------------------------------------------------- the checker itself

// The fake fabric alone, without pmirror: an "initiator" that acknowledges
// a record as soon as its Write is posted (no flush) loses acknowledged
// records in a crash, and the checker says so; with a Read after each Write
// (APM's flush) it does not. This is the proof that the checker can fail.
TEST_F(CrashTest, CheckerCatchesAcknowledgingBeforeTheFlush) {
  for (bool flush : {false, true}) {
    SCOPED_TRACE(flush ? "Write + Read" : "Write only");
    auto fabric = FakeFabric::create();
    auto listener = fabric->listen(kTargetNode);
    ASSERT_TRUE(listener.ok());
    auto active = fabric->connect(kTargetNode);
    ASSERT_TRUE(active.ok());
    auto passive = (*listener)->accept(0ms);
    ASSERT_TRUE(passive.ok() && *passive);
    std::vector<std::byte> remote(kSize), local(kSize), scratch(8);
    auto remote_mr = (*passive)->register_memory(remote.data(), remote.size(),
                                                 transport::kRemoteWrite | transport::kRemoteRead);
    auto local_mr = (*active)->register_memory(local.data(), local.size(), transport::kLocalOnly);
    auto scratch_mr = (*active)->register_memory(scratch.data(), 8, transport::kLocalOnly);
    ASSERT_TRUE(remote_mr.ok() && local_mr.ok() && scratch_mr.ok());
    const auto key = (*remote_mr)->remote_key();
    uint64_t acked = 0;
    for (uint64_t i = 1; i <= 6; ++i) {
      auto r = record_bytes(i);
      std::memcpy(local.data() + record_offset(i), r.data(), r.size());
      ASSERT_TRUE((*active)
                      ->post_write(**local_mr, record_offset(i), r.size(), key, record_offset(i), i,
                                   /*signaled=*/false)
                      .ok());
      if (flush) {
        ASSERT_TRUE((*active)->post_read(**scratch_mr, 0, 8, key, record_offset(i), i).ok());
        transport::Completion c;
        auto n = (*active)->poll(std::span(&c, 1), 1000ms);
        ASSERT_TRUE(n.ok() && *n == 1 && c.status.ok());
      }
      acked = i;  // "acknowledged to the application"
    }
    // Before the crash the records are visible on the "replica"...
    EXPECT_TRUE(check_replica(remote, 6, acked, true).violations.empty());
    fabric->crash(kTargetNode);
    Verdict v = check_replica(remote, 6, acked, true);
    if (flush) {
      EXPECT_TRUE(v.violations.empty()) << v.text();
      EXPECT_EQ(v.intact, 6u);
    } else {
      ASSERT_EQ(v.violations.size(), 6u) << v.text();
      EXPECT_EQ(v.violations[0], "record 1 was acknowledged but is absent on the replica");
      EXPECT_EQ(v.intact, 0u);
    }
  }
}

TEST_F(CrashTest, CheckerCatchesTornAndOutOfOrderRecords) {
  std::vector<std::byte> replica(kSize);
  auto put = [&](uint64_t i) {
    auto r = record_bytes(i);
    std::memcpy(replica.data() + record_offset(i), r.data(), r.size());
  };
  put(1);
  put(3);
  // 2 was acknowledged, 3 is there without it.
  Verdict v = check_replica(replica, 3, 2, false);
  ASSERT_EQ(v.violations.size(), 2u) << v.text();
  EXPECT_EQ(v.violations[0], "record 2 was acknowledged but is absent on the replica");
  EXPECT_EQ(v.violations[1],
            "record 3 is on the replica without the earlier acknowledged record 2");
  // Nothing after 1 acknowledged: fine unless strict (not a prefix).
  EXPECT_TRUE(check_replica(replica, 3, 1, false).violations.empty());
  EXPECT_EQ(check_replica(replica, 3, 1, true).violations.size(), 1u);
  // A torn record (one word of it lost) is not intact.
  put(2);
  replica[record_offset(2) + 16] = std::byte{0};
  EXPECT_EQ(classify(replica, 2), Found::kTorn);
  EXPECT_EQ(check_replica(replica, 3, 2, false).violations.size(), 2u);
  // A stray byte elsewhere.
  put(2);
  replica[kSize - 1] = std::byte{1};
  EXPECT_EQ(check_replica(replica, 3, 3, true).violations.size(), 1u);
}

// ------------------------------------------- the real stack, crash sweeps

TEST_F(CrashTest, ApmTargetCrashAtEveryOperation) {
  Scenario s;
  s.apm = config::ApmPolicy::kOn;
  Coverage c = sweep(s);
  // Some crashes fell between a Write and its flush (the unacknowledged
  // record is lost), some between the flush and the acknowledgement.
  EXPECT_GT(c.unacked_lost, 0u);
  EXPECT_GT(c.unacked_survived, 0u);
}

TEST_F(CrashTest, ApmTargetCrashTornAtEveryOperation) {
  Scenario s;
  s.apm = config::ApmPolicy::kOn;
  s.tear = true;
  Coverage c = sweep(s);
  EXPECT_GT(c.torn, 0u) << "no crash tore a record: the torn case is not exercised";
}

TEST_F(CrashTest, GpspmTargetCrashAtEveryOperation) {
  Scenario s;
  s.apm = config::ApmPolicy::kOff;
  Coverage c = sweep(s);
  EXPECT_GT(c.unacked_lost, 0u);
}

TEST_F(CrashTest, GpspmTargetCrashTornAtEveryOperation) {
  Scenario s;
  s.apm = config::ApmPolicy::kOff;
  s.tear = true;
  Coverage c = sweep(s);
  EXPECT_GT(c.torn, 0u);
}

// persist_async: several persists in flight when the crash comes.
TEST_F(CrashTest, ApmAsyncTargetCrashWithPersistsInFlight) {
  Scenario s;
  s.apm = config::ApmPolicy::kOn;
  s.mode = Mode::kAsync;
  s.records = 16;
  s.window = 5;
  Coverage c = sweep(s);
  EXPECT_GT(c.unacked_lost, 0u);
  EXPECT_GT(c.unacked_survived, 0u);
}

TEST_F(CrashTest, GpspmAsyncTargetCrashWithPersistsInFlight) {
  for (bool tear : {false, true}) {
    SCOPED_TRACE(tear ? "torn" : "whole writes");
    Scenario s;
    s.apm = config::ApmPolicy::kOff;
    s.mode = Mode::kAsync;
    s.records = 16;
    s.window = 5;
    s.tear = tear;
    Coverage c = sweep(s);
    EXPECT_GT(c.unacked_lost, 0u);
    if (HasFailure()) break;
  }
}

// The ordering invariant with many persists in flight (issue 25), under
// each method's crash model. APM: placed Writes become durable in
// placement order, so a crash keeps a prefix of them, the last torn.
TEST_F(CrashTest, ApmAsyncCrashKeepsAPersistBoundaryPlusOne) {
  Scenario s;
  s.apm = config::ApmPolicy::kOn;
  s.mode = Mode::kAsync;
  s.records = 16;
  s.window = 8;
  s.tear = true;
  s.in_placement_order = true;
  s.boundary_plus_one = true;
  Coverage c = sweep(s);
  EXPECT_GT(c.unacked_survived, 0u) << "some crash kept placed, unflushed persists";
  EXPECT_GT(c.torn, 0u);
}

// GPSPM: the target's CPU persists on request, and placed bytes that it did
// not persist may survive in any subset (page cache written back at
// random, CPU caches evicted): the order holds only because a replica
// takes a persist once the one before it is durable there.
TEST_F(CrashTest, GpspmAsyncCrashKeepsAPersistBoundaryPlusOne) {
  Scenario s;
  s.apm = config::ApmPolicy::kOff;
  s.mode = Mode::kAsync;
  s.records = 16;
  s.window = 8;
  s.tear = true;
  s.boundary_plus_one = true;
  Coverage c = sweep(s);
  EXPECT_GT(c.torn, 0u);
}

// 16 records as ordered persists of groups, 8 in flight, torn Writes,
// checked for a group boundary plus part of the next.
Scenario ordered_groups_scenario(config::ApmPolicy apm) {
  Scenario s;
  s.apm = apm;
  s.mode = Mode::kAsync;
  s.ordered_groups = true;
  s.records = 16;
  s.window = 8;
  s.tear = true;
  s.boundary_plus_one = true;
  return s;
}

// Ordered groups of one persist (persist_ordered_async: one sequence)
// under the tcp target's model: placed bytes that no Read flushed yet
// survive in any subset. APM: the flush Read after each group keeps them in
// order; GPSPM: each group is a persist of its own (the target's CPU could
// not keep their order inside one). Either way a prefix of the records,
// one torn at most.
TEST_F(CrashTest, OrderedGroupsCrashKeepsAGroupBoundaryPlusOne) {
  for (auto apm : {config::ApmPolicy::kOn, config::ApmPolicy::kOff}) {
    SCOPED_TRACE(apm == config::ApmPolicy::kOn ? "apm" : "gpspm");
    Coverage c = sweep(ordered_groups_scenario(apm));
    EXPECT_GT(c.torn, 0u);
    if (apm == config::ApmPolicy::kOn) {
      EXPECT_GT(c.unacked_survived, 0u)
          << "some crash kept flushed groups of an unacknowledged persist";
    }
    if (HasFailure()) break;
  }
}

// The same onto a copy the target takes for pmem: the tcp-like fabric
// persists each Write as it applies it, the target declares placement
// order, and the groups go without a flush Read between them (fewer
// operations than the same workload onto a plain file). A crash at any
// operation still leaves a group boundary plus part of the next, and no
// Write is torn: each was durable before the next operation.
TEST_F(CrashTest, OrderedGroupsUnderPlacementOrderKeepAGroupBoundaryPlusOne) {
  const Scenario s = ordered_groups_scenario(config::ApmPolicy::kOn);
  const uint64_t with_flush_reads = run_once(s, std::nullopt).operations;
  ASSERT_EQ(setenv("PMEM_IS_PMEM_FORCE", "1", 1), 0);
  Coverage c = sweep(s);
  unsetenv("PMEM_IS_PMEM_FORCE");
  EXPECT_LT(c.workload_operations, with_flush_reads)
      << "the groups still carry flush Reads: the target did not declare placement order";
  EXPECT_EQ(c.torn, 0u) << "a Write was placed but not persisted before the next operation";
  EXPECT_GT(c.unacked_survived, 0u) << "some crash kept placed groups of an unacknowledged persist";
}

// Native flush (issue 26): the fabric has FLUSH and the copy is pmem, so
// the target declares it and the initiator flushes each persist's ranges
// with FLUSHes instead of a Read -- here a Read flushes nothing
// (read_flushes = false), and placed bytes no FLUSH covered survive in any
// subset, word by word (the cache writes back what it likes). A crash at
// every operation, 8 persists in flight, plain and as ordered groups,
// leaves a persist (or group) boundary plus part of the next.
// With one-sided commit (native_persistence: auto; the metadata pool is
// pmem too) each persist's sequence also goes into the target's commit
// word by ATOMIC WRITE, fenced behind its FLUSHes: after any crash the word
// names no persist whose records are not intact (check_commit_word).
TEST_F(CrashTest, NativeFlushCrashKeepsABoundaryPlusOne) {
  ASSERT_EQ(setenv("PMEM_IS_PMEM_FORCE", "1", 1), 0);
  for (auto native : {config::NativePersistence::kFlush, config::NativePersistence::kAuto}) {
    for (bool groups : {false, true}) {
      SCOPED_TRACE(std::string(native == config::NativePersistence::kFlush ? "native flush"
                                                                           : "one-sided commit") +
                   (groups ? ", ordered groups" : ", persists"));
      Scenario s = ordered_groups_scenario(config::ApmPolicy::kOn);
      s.native = native;
      s.ordered_groups = groups;
      s.fabric.native_persistence = true;
      s.fabric.read_flushes = false;
      Coverage c = sweep(s);
      EXPECT_GT(c.torn, 0u);
      EXPECT_GT(c.unacked_survived, 0u) << "some crash kept flushed, unacknowledged persists";
      if (HasFailure()) break;
    }
    if (HasFailure()) break;
  }
  unsetenv("PMEM_IS_PMEM_FORCE");
}

// A pmirrord killed before it read the commit word leaves its state pool
// behind the word: the next session continues after the word (here the
// word is moved ahead of the state pool while the target is stopped, as
// the NIC would have moved it), so a reopened primary's next sequence
// follows it.
TEST_F(CrashTest, OneSidedCommitNextSessionContinuesAfterTheWord) {
  ASSERT_EQ(setenv("PMEM_IS_PMEM_FORCE", "1", 1), 0);
  Scenario s;
  s.fabric.native_persistence = true;
  remove_files();
  auto fabric = FakeFabric::create(s.fabric);
  transport::fake::ScopedFabric installed(fabric, kInitiatorNode);
  start_target(s);
  ASSERT_NE(target_, nullptr);
  {
    auto volume = open_volume(/*create=*/true);
    ASSERT_TRUE(volume.ok()) << volume.status().to_string();
    ASSERT_EQ((*volume)->replicas().at(0).method, "one-sided-commit");
    for (uint64_t i = 1; i <= 10; ++i) {
      auto r = record_bytes(i);
      std::memcpy((*volume)->data() + record_offset(i), r.data(), r.size());
      ASSERT_TRUE((*volume)->persist(record_offset(i), r.size()).ok());
    }
  }
  stop_target();
  metadata::CopyMetadata::Options md;
  md.path = target_path() + ".pmirror";
  md.volume_size = kSize;
  md.create_if_missing = false;
  {
    auto opened = metadata::CopyMetadata::open(md);
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    const metadata::CommitWord word = (*opened)->commit_word();
    EXPECT_EQ(word.sequence, 10u) << "the word holds the last persist's sequence";
    ASSERT_NE(word.generation, 0u);
    ASSERT_TRUE((*opened)->arm_commit_word(word.generation, 25).ok());
  }
  start_target(s);
  ASSERT_NE(target_, nullptr);
  {
    auto volume = open_volume(/*create=*/false);
    ASSERT_TRUE(volume.ok()) << volume.status().to_string();
    auto sequence = (*volume)->persist_async(record_offset(11), record_bytes(11).size());
    ASSERT_TRUE(sequence.ok()) << sequence.status().to_string();
    EXPECT_EQ(*sequence, 26u) << "the session continued after the word, not the state pool";
    ASSERT_TRUE((*volume)->wait(*sequence).ok());
  }
  stop_target();
  unsetenv("PMEM_IS_PMEM_FORCE");
}

// The checker catches a later persist that landed before an earlier one.
TEST_F(CrashTest, CheckerCatchesALaterPersistBeforeAnEarlierOne) {
  Verdict fine, reordered, two_torn;
  check_boundary_plus_one(std::vector<Found>{Found::kIntact, Found::kTorn, Found::kAbsent}, fine);
  EXPECT_TRUE(fine.violations.empty()) << fine.text();
  check_boundary_plus_one(std::vector<Found>{Found::kIntact, Found::kAbsent, Found::kIntact},
                          reordered);
  EXPECT_EQ(reordered.violations.size(), 1u);
  check_boundary_plus_one(std::vector<Found>{Found::kTorn, Found::kTorn, Found::kAbsent}, two_torn);
  EXPECT_EQ(two_torn.violations.size(), 1u);
}

// Several application threads persisting at once (their persists share the
// connection, one waiter collecting for all): the crash comes between any
// two operations, and the replica holds every acknowledged record and,
// with whole Writes, a prefix of the persists in sequence order.
// (Tearing is the fake's business and is covered above; whole Writes make
// the prefix check strict.)
TEST_F(CrashTest, ApmSeveralWritersTargetCrashAtEveryOperation) {
  Scenario s;
  s.apm = config::ApmPolicy::kOn;
  s.writers = 4;
  s.records = 16;
  Coverage c = sweep(s);
  EXPECT_GT(c.unacked_lost, 0u);
  EXPECT_GT(c.unacked_survived, 0u);
}

TEST_F(CrashTest, GpspmSeveralWritersTargetCrashAtEveryOperation) {
  Scenario s;
  s.apm = config::ApmPolicy::kOff;
  s.writers = 4;
  s.records = 16;
  Coverage c = sweep(s);
  EXPECT_GT(c.unacked_lost, 0u);
}

// The initiator and the target crash at the same instant (crash_all: every
// connection breaks, the target's memory rolls back). The initiator's
// process state is gone as far as the target can tell: the Volume is then
// destroyed, but nothing it does reaches the target any more.
TEST_F(CrashTest, BothSidesCrashAtEveryOperation) {
  for (auto apm : {config::ApmPolicy::kOn, config::ApmPolicy::kOff}) {
    SCOPED_TRACE(apm == config::ApmPolicy::kOn ? "apm" : "gpspm");
    Scenario s;
    s.apm = apm;
    s.crash_node = "";  // everything
    s.mode = Mode::kAsync;
    s.records = 10;
    s.window = 3;
    s.tear = true;
    sweep(s);
    if (HasFailure()) break;
  }
}

// After both sides crashed, pmirrord restarts on the rolled-back copy and
// the application reopens its local copy: the replica is brought up to date
// before open returns, and still holds every acknowledged record (now
// every record the local copy has).
TEST_F(CrashTest, BothSidesCrashThenRecover) {
  for (auto apm : {config::ApmPolicy::kOn, config::ApmPolicy::kOff}) {
    SCOPED_TRACE(apm == config::ApmPolicy::kOn ? "apm" : "gpspm");
    Scenario s;
    s.apm = apm;
    s.crash_node = "";
    s.mode = Mode::kAsync;
    s.records = 10;
    s.window = 3;
    s.tear = true;
    for (uint64_t k : {5u, 11u, 17u}) {
      SCOPED_TRACE("crash after " + std::to_string(k) + " operations");
      // run_once without its teardown of the files: crash, then restart.
      remove_files();
      auto fabric = FakeFabric::create(s.fabric);
      transport::fake::ScopedFabric installed(fabric, kInitiatorNode);
      start_target(s);
      ASSERT_NE(target_, nullptr);
      Outcome out;
      {
        auto volume = open_volume(true);
        ASSERT_TRUE(volume.ok()) << volume.status().to_string();
        fabric->crash_after(k, "", CrashOptions{true, 7 + k}, kInitiatorNode);
        run_workload(**volume, s, out);
        ASSERT_EQ(fabric->crashes(), 1u);
      }
      stop_target();
      Verdict crashed =
          check_replica(read_file(target_path(), kSize), out.written, out.acked, false);
      EXPECT_TRUE(crashed.violations.empty()) << crashed.text();

      start_target(s);
      ASSERT_NE(target_, nullptr);
      {
        auto volume = open_volume(false);
        ASSERT_TRUE(volume.ok()) << volume.status().to_string();
        auto replicas = (*volume)->replicas();
        ASSERT_EQ(replicas.size(), 1u);
        EXPECT_EQ(replicas[0].connection, "connected");
        auto replica = read_file(target_path(), kSize);
        Verdict v = check_replica(replica, out.written, out.acked, true);
        EXPECT_TRUE(v.violations.empty()) << v.text();
        // The replica equals the local copy: the written records that were
        // lost in the crash came back from it.
        auto local = read_file(local_path(), kSize);
        EXPECT_TRUE(replica == local) << "the replica differs from the local copy after recovery";
        EXPECT_EQ(v.intact, out.written);
      }
      stop_target();
    }
  }
}

// The initiator's process really dies: a child process runs the target and
// the application, both crash after k operations (crash_all, torn), and the
// child _exits at once -- no destructor runs, so the Volume's metadata stays
// unclean with its activity log. Reopening then resyncs the logged extents:
// the replica ends equal to the local copy.
TEST_F(CrashTest, InitiatorProcessDiesThenRecovers) {
  for (auto apm : {config::ApmPolicy::kOn, config::ApmPolicy::kOff}) {
    SCOPED_TRACE(apm == config::ApmPolicy::kOn ? "apm" : "gpspm");
    Scenario s;
    s.apm = apm;
    s.crash_node = "";
    s.mode = Mode::kAsync;
    s.records = 10;
    s.window = 3;
    s.tear = true;
    for (uint64_t k : {7u, 16u}) {
      SCOPED_TRACE("crash after " + std::to_string(k) + " operations");
      remove_files();
      int fds[2];
      ASSERT_EQ(::pipe(fds), 0);
      pid_t pid = ::fork();
      ASSERT_GE(pid, 0) << std::strerror(errno);
      if (pid == 0) {
        ::close(fds[0]);
        auto fabric = FakeFabric::create(s.fabric);
        transport::fake::install_fabric(fabric, kInitiatorNode);
        start_target(s);
        if (target_ == nullptr) ::_exit(2);
        auto volume = open_volume(true);
        if (!volume.ok()) ::_exit(3);
        fabric->crash_after(k, "", CrashOptions{true, 7 + k}, kInitiatorNode);
        Outcome out;
        run_workload(**volume, s, out);
        uint64_t result[3] = {out.written, out.acked, fabric->crashes()};
        if (::write(fds[1], result, sizeof result) != sizeof result) ::_exit(4);
        ::_exit(0);  // the process dies here: no destructor, no close
      }
      ::close(fds[1]);
      uint64_t result[3] = {0, 0, 0};
      ssize_t got = ::read(fds[0], result, sizeof result);
      ::close(fds[0]);
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
      ASSERT_EQ(got, static_cast<ssize_t>(sizeof result));
      const uint64_t written = result[0], acked = result[1];
      ASSERT_EQ(result[2], 1u) << "the crash did not happen";
      Verdict crashed = check_replica(read_file(target_path(), kSize), written, acked, false);
      EXPECT_TRUE(crashed.violations.empty()) << crashed.text();

      auto fabric = FakeFabric::create(s.fabric);
      transport::fake::ScopedFabric installed(fabric, kInitiatorNode);
      start_target(s);
      ASSERT_NE(target_, nullptr);
      {
        auto volume = open_volume(false);
        ASSERT_TRUE(volume.ok()) << volume.status().to_string();
        auto replica = read_file(target_path(), kSize);
        Verdict v = check_replica(replica, written, acked, true);
        EXPECT_TRUE(v.violations.empty()) << v.text();
        EXPECT_TRUE(replica == read_file(local_path(), kSize))
            << "the replica differs from the local copy after recovery";
        EXPECT_EQ(v.intact, written);
      }
      stop_target();
    }
  }
}

// --------------------------------------- negative controls, real stack

// GPSPM with the target's own persists hidden from the fake: the target
// acknowledges what the fake considers volatile, so a crash after the
// workload loses acknowledged records -- and the checker reports it.
TEST_F(CrashTest, NegativeControlGpspmWithoutTheTargetsPersist) {
  Scenario s;
  s.apm = config::ApmPolicy::kOff;
  s.records = 6;
  g_route_owner_persists = false;
  Outcome dry = run_once(s, std::nullopt);
  ASSERT_EQ(dry.acked, s.records);
  Outcome out = run_once(s, kAtEnd);  // every persist returned ok
  ASSERT_TRUE(out.crashed);
  EXPECT_EQ(out.acked, s.records);
  Verdict v = check_replica(out.replica, out.written, out.acked, true);
  EXPECT_EQ(v.violations.size(), s.records) << v.text();
  EXPECT_EQ(v.intact, 0u);
}

// APM promised (apm: on) where a Read does not flush (rdma into a plain
// file: FabricOptions::read_flushes = false): acknowledged records are lost.
// This is why `apm: auto` offers APM over rdma only on pmem.
TEST_F(CrashTest, NegativeControlApmWhereAReadDoesNotFlush) {
  Scenario s;
  s.apm = config::ApmPolicy::kOn;
  s.fabric.read_flushes = false;
  s.records = 6;
  Outcome dry = run_once(s, std::nullopt);
  ASSERT_EQ(dry.acked, s.records);
  Outcome out = run_once(s, kAtEnd);
  ASSERT_TRUE(out.crashed);
  EXPECT_EQ(out.acked, s.records);
  Verdict v = check_replica(out.replica, out.written, out.acked, true);
  EXPECT_EQ(v.violations.size(), s.records) << v.text();
}

}  // namespace
}  // namespace pmirror
