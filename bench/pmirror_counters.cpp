// pmirror-counters-bench: the transaction of examples/02-pmemobj-counters
// (transactions = K, slot[K % 64] = K, a checksum) rewritten for
// libpmirror, as an application that calls pmirror_persist itself would
// write it: two copies of the root, each new state written whole into the
// older one (its sequence and checksum say which is current after a
// crash), one persist per transaction. scripts/bench-pmdk.sh runs it beside
// the libpmemobj program, plain and under pmirror-run (docs/benchmarks.md).
// With --log, each transaction is followed, after its persist, by its
// "committed K" line appended to FILE with one write(2), as the libpmemobj
// program does (its commit made visible outside the process).
//
// With --shaped, the program writes what libpmemobj writes for the same
// transaction instead (a control for the ratio of the two, not a way to
// write a program): five ordered groups, six ranges, 1,192 bytes -- an
// undo log header (64), its snapshot and entry (512 + 64), the root (536;
// libpmemobj's object is 528), a lane word set and cleared (8, 8) -- the
// shape pmirror-run mirrors for one transaction of
// examples/02-pmemobj-counters, as one persist_ordered_async and one wait.
// Where observed / shaped is about 1 and observed / rewritten is not, the
// difference is the shape's Writes, not pmirror-run (docs/benchmarks.md).
//
//   pmirror-counters-bench --config FILE --volume V [--node N] [--identity ID]
//                          --count N [--log FILE] [--shaped]
// prints "transactions_per_s=R p50_us=A p99_us=B". A transaction is timed
// as in examples/02-pmemobj-counters (`bench`): clock_gettime(CLOCK_MONOTONIC)
// before it and after its log line's write (or its persist, without --log);
// p50 and p99 are the sorted latencies at COUNT/2 and COUNT*99/100.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <pmirror/pmirror.hpp>
#include <string>
#include <vector>

namespace {

constexpr int kSlots = 64;
constexpr uint64_t kRootSlotBytes = 4096;  // the two copies of the root, a page apart
// --shaped: where its log and lane words go, past the two roots (the
// offsets' distances as in the libpmemobj pool: the log's header after its
// entries, the lane word before them).
constexpr uint64_t kShapeBase = 2 * kRootSlotBytes;
constexpr uint64_t kLaneWord = kShapeBase;           // 8 bytes, set then cleared
constexpr uint64_t kLogEntry = kShapeBase + 40;      // 64: the entry's header
constexpr uint64_t kLogSnapshot = kShapeBase + 104;  // 512: the root's bytes
constexpr uint64_t kLogHeader = kShapeBase + 616;    // 64: the log's header
constexpr uint64_t kShapeEnd = kLogHeader + 64;

struct Root {
  uint64_t sequence;  // which of the two copies is newer
  uint64_t transactions;
  uint64_t slot[kSlots];
  uint64_t checksum;
};

uint64_t checksum_of(const Root& r) {
  uint64_t sum = r.sequence ^ r.transactions;
  for (uint64_t v : r.slot) sum = sum * 31 + v;
  return sum;
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// The transaction as libpmemobj writes it (--shaped): the log first, then
// the data, then the lane word cleared -- each group durable before the
// next, all in one ordered persist and one wait.
pmirror::Status write_shaped(pmirror::Volume& v, uint64_t root_at, const Root& next) {
  std::byte* base = v.data();
  const uint64_t lane = next.sequence;
  std::memcpy(base + kLogHeader, &next.sequence, sizeof(next.sequence));
  std::memcpy(base + kLogSnapshot, base + root_at, 512);
  std::memcpy(base + kLogEntry, &next.transactions, sizeof(next.transactions));
  std::memcpy(base + root_at, &next, sizeof(next));
  std::memcpy(base + kLaneWord, &lane, sizeof(lane));
  const pmirror::PersistRange ranges[] = {{kLogHeader, 64}, {kLogSnapshot, 512},
                                          {kLogEntry, 64},  {root_at, sizeof(Root)},
                                          {kLaneWord, 8},   {kLaneWord, 8}};
  const uint32_t groups[] = {1, 2, 1, 1, 1};
  auto started = v.persist_ordered_async(ranges, 6, groups, 5);
  if (!started.ok()) return started.status();
  return v.wait(*started);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the counters transaction over libpmirror: one persist per transaction"};
  std::string config, volume, node, identity, log;
  uint64_t count = 10000;
  app.add_option("--config", config, "the cluster file")->required();
  app.add_option("--volume", volume, "the volume")->required();
  app.add_option("--node", node, "this node (default: by host name)");
  app.add_option("--identity", identity, "who this is to the targets")->required();
  app.add_option("--count", count, "transactions")->check(CLI::Range(1ull, 100000000ull));
  app.add_option("--log", log, "append \"committed K\" to this file after each transaction");
  bool shaped = false;
  app.add_flag("--shaped", shaped,
               "write what libpmemobj writes for the transaction (5 ordered groups, 6 ranges)");
  CLI11_PARSE(app, argc, argv);

  auto opened = pmirror::Volume::open_from_config(config, volume, identity, node);
  if (!opened.ok()) {
    std::fprintf(stderr, "pmirror-counters-bench: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  pmirror::Volume& v = **opened;
  if (shaped && v.size() < kShapeEnd) {
    std::fprintf(stderr, "pmirror-counters-bench: --shaped needs a volume of %" PRIu64 " bytes\n",
                 kShapeEnd);
    return 1;
  }
  int log_fd = -1;
  if (!log.empty() && (log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600)) < 0) {
    std::fprintf(stderr, "pmirror-counters-bench: %s: %s\n", log.c_str(), std::strerror(errno));
    return 1;
  }
  Root current{};
  // Recover the newer of the two copies.
  for (uint64_t copy = 0; copy < 2; ++copy) {
    Root r;
    std::memcpy(&r, v.data() + copy * kRootSlotBytes, sizeof(r));
    if (r.checksum == checksum_of(r) && r.sequence >= current.sequence) current = r;
  }
  std::vector<uint64_t> latency(count);
  const uint64_t start = now_ns();
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t t0 = now_ns();
    Root next = current;
    next.sequence = current.sequence + 1;
    next.transactions = current.transactions + 1;
    next.slot[next.transactions % kSlots] = next.transactions;
    next.checksum = checksum_of(next);
    const uint64_t offset = (next.sequence % 2) * kRootSlotBytes;
    pmirror::Status written;
    if (!shaped) {
      written = v.write(offset, &next, sizeof(next));
    } else {
      written = write_shaped(v, offset, next);
    }
    if (!written.ok()) {
      std::fprintf(stderr, "pmirror-counters-bench: %s\n", written.to_string().c_str());
      return 1;
    }
    current = next;
    if (log_fd >= 0) {
      char line[64];
      const int n = std::snprintf(line, sizeof(line), "committed %" PRIu64 "\n", next.transactions);
      if (::write(log_fd, line, static_cast<size_t>(n)) != n) {
        std::fprintf(stderr, "pmirror-counters-bench: %s: %s\n", log.c_str(), std::strerror(errno));
        return 1;
      }
    }
    latency[i] = now_ns() - t0;
  }
  const double seconds = static_cast<double>(now_ns() - start) / 1e9;
  if (log_fd >= 0) ::close(log_fd);
  std::sort(latency.begin(), latency.end());
  std::printf("transactions_per_s=%.0f p50_us=%.1f p99_us=%.1f\n",
              static_cast<double>(count) / seconds, static_cast<double>(latency[count / 2]) / 1e3,
              static_cast<double>(latency[(count * 99) / 100]) / 1e3);
  return 0;
}
