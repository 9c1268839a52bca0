// Example 01: open a volume mirrored to one or more pmirrord targets, write
// records into the local mapping and persist each one. When persist returns,
// the record is durable locally and on every replica.
//
//   pmirror-demo --config cluster.yaml --node app1 --volume demo --identity demo
//
// or without a cluster file, naming everything on the command line:
//
//   pmirror-demo --volume demo --local /tmp/demo.img --size 64MiB
//       --replica 127.0.0.1:7450 --secret-file demo.secret --count 10000
//
// It uses libpmirror's public C++ API only (<pmirror/pmirror.hpp>, -lpmirror),
// as an application would.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <pmirror/pmirror.hpp>
#include <random>
#include <string_view>

using namespace pmirror;

namespace {

// "4096", "64MiB", "1G": bytes, with an optional binary K/M/G/T suffix.
std::optional<uint64_t> parse_size(std::string_view text) {
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  std::string_view unit(end, text.data() + text.size() - end);
  for (std::string_view tail : {"iB", "B", ""}) {
    if (unit.size() >= tail.size() && unit.substr(unit.size() - tail.size()) == tail) {
      unit.remove_suffix(tail.size());
      break;
    }
  }
  unsigned shift = 0;
  if (unit == "K") {
    shift = 10;
  } else if (unit == "M") {
    shift = 20;
  } else if (unit == "G") {
    shift = 30;
  } else if (unit == "T") {
    shift = 40;
  } else if (!unit.empty()) {
    return std::nullopt;
  }
  if (number > (~0ull >> shift)) return std::nullopt;
  return number << shift;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pmirror-demo: mirror records to pmirrord targets and report persist latency"};
  VolumeOptions options;
  std::string size_text = "64MiB";
  std::vector<std::string> replicas;
  std::string transport_name = "tcp";
  std::string secret;
  std::string secret_file;
  uint64_t count = 10000;
  uint64_t record_size = 256;
  options.identity = "demo";
  std::string config_path;
  std::string node;
  auto* config_option =
      app.add_option("--config", config_path,
                     "cluster file: the volume's replicas, secret and local path come from it");
  app.add_option("--node", node, "this node's name in the cluster file (default: host name)");
  app.add_option("--volume", options.name, "volume name on the targets")->required();
  app.add_option("--local", options.local_path, "local copy (created if missing)");
  app.add_option("--size", size_text, "volume size (e.g. 64MiB)")->capture_default_str();
  app.add_option("--replica", replicas, "target as HOST:PORT (repeat for more)");
  app.add_option("--transport", transport_name, "tcp|rdma")->capture_default_str();
  app.add_option("--identity", options.identity, "who we are to the targets")
      ->capture_default_str();
  auto* secret_option = app.add_option("--secret", secret, "the volume's shared secret");
  app.add_option("--secret-file", secret_file, "file holding the shared secret (mode 600)")
      ->excludes(secret_option);
  app.add_option("--count", count, "records to write")->capture_default_str();
  app.add_option("--record-size", record_size, "bytes per record")->capture_default_str();
  const std::map<std::string, PollMode> poll_modes = {
      {"busy", PollMode::kBusy}, {"adaptive", PollMode::kAdaptive}, {"event", PollMode::kEvent}};
  std::string poll_name = "adaptive";
  app.add_option("--poll", poll_name,
                 "busy|adaptive|event: how this side waits for completions (not with --config: "
                 "there the volume's `poll` says it)")
      ->check(CLI::IsMember(poll_modes))
      ->excludes(config_option)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (config_path.empty() && (options.local_path.empty() || replicas.empty())) {
    std::fprintf(stderr, "pmirror-demo: give --config FILE, or --local and --replica\n");
    return 2;
  }
  auto size = parse_size(size_text);
  if (!size) {
    std::fprintf(stderr, "--size %s: expected bytes, e.g. 4096, 64MiB, 1G\n", size_text.c_str());
    return 2;
  }
  if (transport_name != "tcp" && transport_name != "rdma") {
    std::fprintf(stderr, "--transport %s: expected tcp or rdma\n", transport_name.c_str());
    return 2;
  }
  if (!secret_file.empty()) {
    std::ifstream in(secret_file);
    if (!in) {
      std::fprintf(stderr, "--secret-file %s: cannot read it\n", secret_file.c_str());
      return 2;
    }
    std::getline(in, secret);
  }
  if (record_size == 0 || record_size > *size) {
    std::fprintf(stderr, "--record-size must be between 1 and the volume size\n");
    return 2;
  }
  options.size = *size;
  options.create = true;
  options.poll = poll_modes.at(poll_name);
  for (const auto& r : replicas) {
    auto colon = r.rfind(':');
    if (colon == std::string::npos) {
      std::fprintf(stderr, "--replica %s: expected HOST:PORT\n", r.c_str());
      return 2;
    }
    ReplicaSpec spec;
    spec.address = r.substr(0, colon);
    try {
      spec.port = static_cast<uint16_t>(std::stoul(r.substr(colon + 1)));
    } catch (const std::exception&) {
      std::fprintf(stderr, "--replica %s: bad port\n", r.c_str());
      return 2;
    }
    spec.transport = transport_name;
    spec.secret = secret;
    options.replicas.push_back(spec);
  }

  auto volume = config_path.empty()
                    ? Volume::open(options)
                    : Volume::open_from_config(config_path, options.name, options.identity, node);
  if (!volume.ok()) {
    std::fprintf(stderr, "pmirror-demo: %s\n", volume.status().message().c_str());
    return 1;
  }
  std::printf("opened volume '%s' (%llu bytes, local pmem=%d) with %zu replica(s):\n",
              options.name.c_str(), static_cast<unsigned long long>((*volume)->size()),
              (*volume)->is_pmem(), (*volume)->replicas().size());
  for (const auto& r : (*volume)->replicas()) {
    std::printf("  %s  %s  method=%s generation=%llu\n", r.address.c_str(),
                std::string(replica_state_name(r.state)).c_str(), r.method.c_str(),
                static_cast<unsigned long long>(r.generation));
  }

  std::mt19937_64 rng(std::random_device{}());
  std::vector<double> latencies_us;
  latencies_us.reserve(count);
  uint64_t slots = (*volume)->size() / record_size;
  auto started = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t offset = (rng() % slots) * record_size;
    std::byte* record = (*volume)->data() + offset;
    for (uint64_t b = 0; b < record_size; ++b) record[b] = static_cast<std::byte>(rng());
    auto t0 = std::chrono::steady_clock::now();
    Status persisted = (*volume)->persist(offset, record_size);
    auto t1 = std::chrono::steady_clock::now();
    if (!persisted.ok()) {
      std::fprintf(stderr, "pmirror-demo: persist %llu: %s\n",
                   static_cast<unsigned long long>(i), persisted.message().c_str());
      return 1;
    }
    latencies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::sort(latencies_us.begin(), latencies_us.end());
  auto pct = [&](double p) {
    return latencies_us.empty() ? 0.0
                                : latencies_us[std::min(latencies_us.size() - 1,
                                                        size_t(p * latencies_us.size()))];
  };
  std::printf("persisted %llu records of %llu bytes in %.2f s: %.0f persists/s, "
              "latency p50 %.1f us, p99 %.1f us, max %.1f us\n",
              static_cast<unsigned long long>(count),
              static_cast<unsigned long long>(record_size), seconds, count / seconds, pct(0.50),
              pct(0.99), latencies_us.empty() ? 0.0 : latencies_us.back());
  return 0;
}
