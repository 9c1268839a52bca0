// pmirror-counters-bench: the transaction of examples/02-pmemobj-counters
// (transactions = K, slot[K % 64] = K, a checksum) rewritten for
// libpmirror, as an application that calls pmirror_persist itself would
// write it: two copies of the root, each new state written whole into the
// older one (its sequence and checksum say which is current after a
// crash), one persist per transaction. scripts/bench-pmdk.sh runs it beside
// the libpmemobj program, plain and under pmirror-run (docs/benchmarks.md).
//
//   pmirror-counters-bench --config FILE --volume V [--node N] [--identity ID] --count N
// prints "transactions_per_s=R p50_us=A p99_us=B".
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the counters transaction over libpmirror: one persist per transaction"};
  std::string config, volume, node, identity;
  uint64_t count = 10000;
  app.add_option("--config", config, "the cluster file")->required();
  app.add_option("--volume", volume, "the volume")->required();
  app.add_option("--node", node, "this node (default: by host name)");
  app.add_option("--identity", identity, "who this is to the targets")->required();
  app.add_option("--count", count, "transactions")->check(CLI::Range(1ull, 100000000ull));
  CLI11_PARSE(app, argc, argv);

  auto opened = pmirror::Volume::open_from_config(config, volume, identity, node);
  if (!opened.ok()) {
    std::fprintf(stderr, "pmirror-counters-bench: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  pmirror::Volume& v = **opened;
  Root current{};
  // Recover the newer of the two copies.
  for (uint64_t copy = 0; copy < 2; ++copy) {
    Root r;
    std::memcpy(&r, v.data() + copy * kRootSlotBytes, sizeof(r));
    if (r.checksum == checksum_of(r) && r.sequence >= current.sequence) current = r;
  }
  std::vector<uint64_t> latency(count);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    const auto t0 = Clock::now();
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
    latency[i] = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(latency.begin(), latency.end());
  std::printf("transactions_per_s=%.0f p50_us=%.1f p99_us=%.1f\n",
              static_cast<double>(count) / seconds, latency[count / 2] / 1e3,
              latency[(count * 99) / 100] / 1e3);
  return 0;
}
