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
//   pmirror-counters-bench --config FILE --volume V [--node N] [--identity ID]
//                          --count N [--log FILE]
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
  CLI11_PARSE(app, argc, argv);

  auto opened = pmirror::Volume::open_from_config(config, volume, identity, node);
  if (!opened.ok()) {
    std::fprintf(stderr, "pmirror-counters-bench: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  pmirror::Volume& v = **opened;
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
    if (auto s = v.write(offset, &next, sizeof(next)); !s.ok()) {
      std::fprintf(stderr, "pmirror-counters-bench: %s\n", s.to_string().c_str());
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
