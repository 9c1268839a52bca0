// The Prometheus exporter: series, labels and values from a canned status
// snapshot, scraped over HTTP with a plain socket.
#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/unique_fd.h"
#include "control/control.h"

namespace pmirror::metrics {
namespace {

using nlohmann::json;

json canned() {
  return json::parse(R"({
    "schema_version": 1,
    "process": {"kind": "pmirrord", "pid": 1234, "node": "node2", "version": "0.1.0"},
    "volumes": [
      {"name": "db0", "role": "primary", "size": 1073741824, "path": "/dev/dax0.0",
       "backing": "devdax", "generation": 3, "last_sequence": 123456,
       "peers": [
         {"name": "node2", "address": "10.0.0.2:7450", "transport": "rdma",
          "state": "connected", "method": "apm", "acknowledged_sequence": 123450, "lag": 6,
          "persists": 123450, "bytes": 987654321, "errors": 2,
          "latency_us": {"p50": 55.0, "p99": 130.0, "p999": 900.0, "count": 123450,
                         "sum": 7000000.0},
          "latency_histogram": {"count": 100, "sum_seconds": 0.01,
                                "buckets": [{"le": 0.00005, "count": 40},
                                            {"le": 0.0001, "count": 90}]}},
         {"name": "node3", "address": "10.0.0.3:7450", "transport": "tcp",
          "state": "disconnected", "lag": 100, "persists": 5, "bytes": 10, "errors": 0}
       ]}
    ]
  })");
}

// canned() with every other part of a status: a replica volume with its
// copy and sessions, admission, pmirror-promoter.
json everything() {
  json snapshot = canned();
  snapshot["admission"] = {{"unauthenticated", 1}, {"evicted", 2}, {"timed_out", 3},
                           {"dropped", 4},         {"refused", 5}, {"authentication_failures", 6}};
  json replica = {
      {"name", "db1"},
      {"role", "replica"},
      {"size", 4096},
      {"path", "/pmem/db1"},
      {"backing", "plain file"},
      {"state", "ok"},
      {"generation", 2},
      {"last_sequence", 77},
      {"copy", {{"generation", "9f3a2b1c4d5e6f70"}, {"consistent", true}, {"promoted", false}}},
      {"peers",
       {{{"name", "app1@10.0.0.1:40000"},
         {"address", "10.0.0.1:40000"},
         {"transport", "tcp"},
         {"state", "connected"},
         {"since", "2026-12-02T10:00:00Z"},
         {"acknowledged_sequence", 77},
         {"persists", 10},
         {"bytes", 100},
         {"errors", 0}}}}};
  snapshot["volumes"].push_back(replica);
  snapshot["promoter"] = {
      {"lease", {{"id", 7}, {"deadline_in_ms", 2500}, {"renewals", 41}, {"renewal_failures", 2}}},
      {"volumes",
       {{{"name", "db1"}, {"holder", "node2"}, {"held", false}, {"takeovers", 0}, {"losses", 1}}}}};
  return snapshot;
}

// "name{a="1",b="2"} value" lines -> value, keyed by name and sorted labels.
using Labels = std::map<std::string, std::string>;
std::map<std::string, double> parse(const std::string& text) {
  std::map<std::string, double> series;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t value_at = line.rfind(' ');
    std::string key = line.substr(0, value_at);
    Labels labels;
    std::string name = key;
    if (auto brace = key.find('{'); brace != std::string::npos) {
      name = key.substr(0, brace);
      std::string body = key.substr(brace + 1, key.size() - brace - 2);
      size_t i = 0;
      while (i < body.size()) {
        size_t eq = body.find('=', i);
        std::string label = body.substr(i, eq - i);
        size_t end = body.find('"', eq + 2);
        labels[label] = body.substr(eq + 2, end - eq - 2);
        i = end + 2;  // past '",'
      }
    }
    std::string canonical = name + "{";
    for (const auto& [k, v] : labels) canonical += k + "=" + v + ",";
    canonical += "}";
    std::string value = line.substr(value_at + 1);
    series[canonical] = value == "Nan" || value == "NaN" ? std::nan("") : std::stod(value);
  }
  return series;
}

std::optional<double> value(const std::map<std::string, double>& series, const std::string& name,
                            const Labels& labels = {}) {
  std::string canonical = name + "{";
  for (const auto& [k, v] : labels) canonical += k + "=" + v + ",";
  canonical += "}";
  auto it = series.find(canonical);
  if (it == series.end()) return std::nullopt;
  return it->second;
}

std::string http_get(uint16_t port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("connect failed");
  }
  std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  ::send(fd, request.data(), request.size(), 0);
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) response.append(buffer, n);
  ::close(fd);
  return response;
}

std::string body_of(const std::string& response) {
  auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

const Labels kNode2{{"volume", "db0"}, {"role", "primary"}, {"peer", "node2"}};
const Labels kNode3{{"volume", "db0"}, {"role", "primary"}, {"peer", "node3"}};

Labels with(Labels labels, const std::string& k, const std::string& v) {
  labels[k] = v;
  return labels;
}

TEST(MetricsTest, ParsesEndpoints) {
  auto v4 = parse_endpoint("127.0.0.1:9942");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 9942);
  auto v6 = parse_endpoint("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  for (const char* bad : {"", "x", "9942", ":9942", "host:", "host:http", "host:65536", "::1:80",
                          "[::1]", "[::1]80", "host:80x"}) {
    auto r = parse_endpoint(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Errc::kConfigError);
    EXPECT_NE(
        r.status().message().find("metrics address '" + std::string(bad) + "': expected HOST:PORT"),
        std::string::npos)
        << r.status().message();
  }
}

TEST(MetricsTest, BadAddressesAreClearErrors) {
  auto r = Exporter::start("x", [] { return json::object(); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("metrics address 'x': expected HOST:PORT", 0), 0u)
      << r.status().message();
  r = Exporter::start("no-such-host.invalid:9942", [] { return json::object(); });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot resolve 'no-such-host.invalid'"), std::string::npos)
      << r.status().message();
}

TEST(MetricsTest, PortInUseIsAClearError) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto r = Exporter::start(address, [] { return json::object(); });
  ::close(fd);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kConnectionError);
  EXPECT_NE(r.status().message().find("metrics address '" + address + "': cannot listen"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("in use"), std::string::npos) << r.status().message();
}

TEST(MetricsTest, ScrapeShowsTheSnapshot) {
  std::mutex mutex;
  json snapshot = canned();
  auto exporter = Exporter::start("127.0.0.1:0", [&] {
    std::lock_guard lock(mutex);
    return snapshot;
  });
  ASSERT_TRUE(exporter.ok()) << exporter.status().message();
  ASSERT_NE((*exporter)->port(), 0);
  EXPECT_EQ((*exporter)->address(), "127.0.0.1:" + std::to_string((*exporter)->port()));

  std::string response = http_get((*exporter)->port(), "/metrics");
  ASSERT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  std::string text = body_of(response);
  auto s = parse(text);

  EXPECT_EQ(value(s, "pmirror_up"), 1);
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 0);
  EXPECT_EQ(value(s, "pmirror_process_info",
                  {{"kind", "pmirrord"}, {"node", "node2"}, {"version", "0.1.0"}}),
            1);
  Labels volume{{"volume", "db0"}, {"role", "primary"}};
  EXPECT_EQ(value(s, "pmirror_volume_size_bytes", volume), 1073741824.0);
  EXPECT_EQ(value(s, "pmirror_volume_generation", volume), 3);
  EXPECT_EQ(value(s, "pmirror_volume_last_sequence", volume), 123456);
  EXPECT_EQ(value(s, "pmirror_volume_info",
                  with(with(volume, "path", "/dev/dax0.0"), "backing", "devdax")),
            1);

  EXPECT_EQ(value(s, "pmirror_peer_connected", kNode2), 1);
  EXPECT_EQ(value(s, "pmirror_peer_connected", kNode3), 0);
  EXPECT_EQ(value(s, "pmirror_peer_state", with(kNode2, "state", "connected")), 1);
  EXPECT_EQ(value(s, "pmirror_peer_state", with(kNode2, "state", "failed")), 0);
  EXPECT_EQ(value(s, "pmirror_peer_state", with(kNode3, "state", "disconnected")), 1);
  EXPECT_EQ(value(s, "pmirror_peer_state", with(kNode3, "state", "connected")), 0);
  EXPECT_EQ(value(s, "pmirror_peer_info",
                  with(with(with(kNode2, "address", "10.0.0.2:7450"), "transport", "rdma"),
                       "method", "apm")),
            1);
  EXPECT_EQ(value(s, "pmirror_persists_total", kNode2), 123450);
  EXPECT_EQ(value(s, "pmirror_bytes_total", kNode2), 987654321);
  EXPECT_EQ(value(s, "pmirror_errors_total", kNode2), 2);
  EXPECT_EQ(value(s, "pmirror_replication_lag", kNode2), 6);
  EXPECT_EQ(value(s, "pmirror_replication_lag", kNode3), 100);
  EXPECT_EQ(value(s, "pmirror_peer_acknowledged_sequence", kNode2), 123450);

  // Summary from latency_us (microseconds -> seconds).
  EXPECT_NEAR(*value(s, "pmirror_persist_latency_seconds", with(kNode2, "quantile", "0.99")),
              130e-6, 1e-12);
  EXPECT_NEAR(*value(s, "pmirror_persist_latency_seconds", with(kNode2, "quantile", "0.999")),
              900e-6, 1e-12);
  EXPECT_EQ(value(s, "pmirror_persist_latency_seconds_count", kNode2), 123450);
  EXPECT_NEAR(*value(s, "pmirror_persist_latency_seconds_sum", kNode2), 7.0, 1e-9);
  EXPECT_FALSE(value(s, "pmirror_persist_latency_seconds_count", kNode3).has_value());
  // Histogram from the optional latency_histogram.
  EXPECT_EQ(value(s, "pmirror_persist_duration_seconds_bucket", with(kNode2, "le", "5e-05")), 40)
      << text;
  EXPECT_EQ(value(s, "pmirror_persist_duration_seconds_bucket", with(kNode2, "le", "+Inf")), 100)
      << text;
  EXPECT_EQ(value(s, "pmirror_persist_duration_seconds_count", kNode2), 100);

  EXPECT_NE(text.find("# TYPE pmirror_persists_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE pmirror_persist_latency_seconds summary"), std::string::npos);
  EXPECT_NE(text.find("# TYPE pmirror_persist_duration_seconds histogram"), std::string::npos);

  // The next scrape sees the next snapshot.
  {
    std::lock_guard lock(mutex);
    snapshot["volumes"][0]["peers"][0]["persists"] = 200000;
    snapshot["volumes"][0]["peers"][1]["state"] = "connected";
  }
  s = parse(body_of(http_get((*exporter)->port(), "/metrics")));
  EXPECT_EQ(value(s, "pmirror_persists_total", kNode2), 200000);
  EXPECT_EQ(value(s, "pmirror_peer_connected", kNode3), 1);
  EXPECT_EQ(value(s, "pmirror_peer_state", with(kNode3, "state", "disconnected")), 0);
}

// What an endpoint serves is in pmirror's name space only (no exposer_*
// series of the HTTP library) and holds no NaN: a summary's _sum is the
// total of the observed latencies.
TEST(MetricsTest, AScrapeHasOnlyPmirrorSeriesAndNoNaN) {
  auto exporter = Exporter::start("127.0.0.1:0", [] { return everything(); });
  ASSERT_TRUE(exporter.ok()) << exporter.status().message();
  std::string response = http_get((*exporter)->port(), "/metrics");
  ASSERT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4"), std::string::npos)
      << response;
  std::string text = body_of(response);
  std::istringstream lines(text);
  std::string line;
  size_t series = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::string name = line;
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) name = line.substr(7);
    EXPECT_EQ(name.rfind("pmirror_", 0), 0u) << line;
    EXPECT_EQ(line.find("NaN"), std::string::npos) << line;
    EXPECT_EQ(line.find("Nan"), std::string::npos) << line;
    if (line[0] != '#') ++series;
  }
  EXPECT_GT(series, 50u) << text;
  EXPECT_NEAR(*value(parse(text), "pmirror_persist_latency_seconds_sum", kNode2), 7.0, 1e-9);
  EXPECT_EQ(value(parse(text), "pmirror_metrics_snapshot_errors_total"), 0) << text;
}

// A process that reports no latency sum (a libpmirror older than the
// pmirrord) has no summary, rather than one whose _sum is NaN.
TEST(MetricsTest, ALatencyWithoutASumIsLeftOutNotNaN) {
  json snapshot = canned();
  snapshot["volumes"][0]["peers"][0]["latency_us"].erase("sum");
  snapshot["volumes"][0]["peers"][0]["latency_histogram"].erase("sum_seconds");
  std::string text = render_text(snapshot);
  EXPECT_EQ(text.find("NaN"), std::string::npos) << text;
  auto s = parse(text);
  EXPECT_FALSE(value(s, "pmirror_persist_latency_seconds_count", kNode2).has_value()) << text;
  EXPECT_FALSE(value(s, "pmirror_persist_duration_seconds_count", kNode2).has_value());
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 2);
  EXPECT_EQ(value(s, "pmirror_persists_total", kNode2), 123450) << "the rest is there";
}

// Prometheus's own parser and linter on a scrape with every part of a
// status (Debian's `prometheus` package has promtool).
TEST(MetricsTest, PromtoolChecksTheScrape) {
  std::string promtool;
  for (const char* candidate : {"/usr/bin/promtool", "/usr/local/bin/promtool"}) {
    if (std::filesystem::exists(candidate)) promtool = candidate;
  }
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool is not installed (Debian: apt-get install prometheus; "
                    "scripts/install-deps.sh installs it)";
  }
  auto exporter = Exporter::start("127.0.0.1:0", [] { return everything(); });
  ASSERT_TRUE(exporter.ok()) << exporter.status().message();
  std::string text = body_of(http_get((*exporter)->port(), "/metrics"));
  std::string file = ::testing::TempDir() + "metrics_test_scrape.txt";
  std::ofstream(file) << text;
  std::string command = promtool + " check metrics < " + file + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  int rc = ::pclose(pipe);
  std::filesystem::remove(file);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0)
      << "promtool check metrics: " << output << "\non:\n"
      << text;
  EXPECT_EQ(output, "") << text;
}

// Two pmirrords on one host (two nodes of a test cluster sharing the
// runtime directory) and an application with volume db0 open as primary:
// each primary-side series comes from one endpoint, and from the other
// once the first is gone.
TEST(MetricsTest, AnApplicationsPrimarySeriesComeFromOneDaemonOfAHost) {
  std::string dir = ::testing::TempDir() + "metrics_test_run." + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  json application = canned();
  application["process"] = {{"kind", "initiator"}, {"pid", ::getpid()}};
  auto server = control::Server::start(control::initiator_socket_path(::getpid(), dir),
                                       [&](const json&) -> Result<json> { return application; });
  ASSERT_TRUE(server.ok()) << server.status().message();

  auto scrape = [&](control::LocalPrimaries& daemon, const std::string& node) {
    json replica = {
        {"name", "db9"}, {"role", "replica"}, {"state", "ok"}, {"peers", json::array()}};
    json status = {{"process", {{"kind", "pmirrord"}, {"node", node}}},
                   {"volumes", json::array({replica})}};
    return render_text(daemon.add_to(status, std::chrono::seconds(5)));
  };
  // Every primary-side series once across the host's endpoints.
  auto expect_once = [](const std::vector<std::string>& scrapes) {
    std::map<std::string, int> seen;
    for (const std::string& text : scrapes) {
      for (const auto& [series, v] : parse(text)) {
        if (series.find("role=primary,") != std::string::npos) ++seen[series];
      }
    }
    EXPECT_GT(seen.size(), 20u);
    for (const auto& [series, count] : seen) EXPECT_EQ(count, 1) << series;
  };
  auto a = std::make_unique<control::LocalPrimaries>(dir);
  control::LocalPrimaries b(dir);
  for (int round = 0; round < 2; ++round) {
    std::string node_a = scrape(*a, "a");
    std::string node_b = scrape(b, "b");
    EXPECT_EQ(value(parse(node_a), "pmirror_persists_total", kNode2), 123450) << node_a;
    EXPECT_EQ(node_b.find("role=\"primary\""), std::string::npos) << node_b;
    EXPECT_NE(node_b.find("role=\"replica\""), std::string::npos) << "its own part stays";
    expect_once({node_a, node_b});
  }
  a.reset();  // node a's pmirrord stops: b takes the application over
  std::string node_b = scrape(b, "b");
  EXPECT_EQ(value(parse(node_b), "pmirror_persists_total", kNode2), 123450) << node_b;
  expect_once({node_b});
  // The application goes: its claim (and lock file) with it.
  server->reset();
  scrape(b, "b");
  EXPECT_FALSE(
      std::filesystem::exists(dir + "/initiator-" + std::to_string(::getpid()) + ".metrics-owner"));
  std::filesystem::remove_all(dir);
}

// A claim file left by a pmirrord that died (kill -9) for an application
// that is gone too is removed by the next pmirrord's scrape; one that a
// live process holds stays.
TEST(MetricsTest, ClaimFilesOfGoneApplicationsAreSweptUnlessHeld) {
  std::string dir = ::testing::TempDir() + "metrics_test_sweep." + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string stale = dir + "/initiator-999991.metrics-owner";
  const std::string held = dir + "/initiator-999992.metrics-owner";
  { std::ofstream(stale).put('\0'); }
  { std::ofstream(held).put('\0'); }
  UniqueFd holder(::open(held.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_GE(holder.get(), 0);
  ASSERT_EQ(::flock(holder.get(), LOCK_EX | LOCK_NB), 0);
  {
    control::LocalPrimaries daemon(dir);
    json status = {{"process", {{"kind", "pmirrord"}, {"node", "a"}}}, {"volumes", json::array()}};
    (void)daemon.add_to(status, std::chrono::seconds(1));
  }
  EXPECT_FALSE(std::filesystem::exists(stale)) << "nobody held it: swept";
  EXPECT_TRUE(std::filesystem::exists(held)) << "a live process holds it";
  std::filesystem::remove_all(dir);
}

TEST(MetricsTest, MalformedFieldsAreSkippedAndCounted) {
  json snapshot = canned();
  auto& volume = snapshot["volumes"][0];
  volume["size"] = "big";                                // 1: wrong type
  volume["peers"][0]["latency_us"] = 5;                  // 2: not an object
  volume["peers"][1]["persists"] = "many";               // 3
  volume["peers"].push_back({{"state", "connected"}});   // 4: no name, no address
  volume["peers"].push_back(volume["peers"][0]);         // 5: duplicate peer
  snapshot["volumes"].push_back(42);                     // 6: not an object
  snapshot["volumes"].push_back({{"role", "replica"}});  // 7: no name
  auto exporter = Exporter::start("127.0.0.1:0", [&] { return snapshot; });
  ASSERT_TRUE(exporter.ok()) << exporter.status().message();

  auto s = parse(body_of(http_get((*exporter)->port(), "/metrics")));
  EXPECT_EQ(value(s, "pmirror_up"), 1);
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 7);
  Labels v{{"volume", "db0"}, {"role", "primary"}};
  EXPECT_FALSE(value(s, "pmirror_volume_size_bytes", v).has_value());
  EXPECT_EQ(value(s, "pmirror_volume_generation", v), 3);  // the rest of the volume is there
  EXPECT_FALSE(value(s, "pmirror_persist_latency_seconds_count", kNode2).has_value());
  EXPECT_EQ(value(s, "pmirror_persists_total", kNode2), 123450);
  EXPECT_FALSE(value(s, "pmirror_persists_total", kNode3).has_value());
  EXPECT_EQ(value(s, "pmirror_bytes_total", kNode3), 10);
  // The count is cumulative across scrapes.
  s = parse(body_of(http_get((*exporter)->port(), "/metrics")));
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 14);
}

TEST(MetricsTest, AFailingSnapshotReportsDown) {
  int calls = 0;
  auto exporter = Exporter::start("127.0.0.1:0", [&]() -> json {
    if (++calls == 1) throw std::runtime_error("status_json exploded");
    return json::array();  // not an object either
  });
  ASSERT_TRUE(exporter.ok()) << exporter.status().message();
  auto s = parse(body_of(http_get((*exporter)->port(), "/metrics")));
  EXPECT_EQ(value(s, "pmirror_up"), 0);
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 1);
  s = parse(body_of(http_get((*exporter)->port(), "/metrics")));
  EXPECT_EQ(value(s, "pmirror_up"), 0);
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 2);
}

TEST(MetricsTest, RenderTextWithoutAServer) {
  auto s = parse(render_text(canned()));
  EXPECT_EQ(value(s, "pmirror_up"), 1);
  EXPECT_EQ(value(s, "pmirror_errors_total", kNode2), 2);
}

TEST(MetricsTest, RecoveryFieldsOfAPrimaryAreExported) {
  json snapshot = canned();
  auto& volume = snapshot["volumes"][0];
  volume["generation"] = "5e826b7e01ae6a93";  // a primary's data generation
  volume["peers"][0]["state"] = "syncing";
  volume["peers"][0]["dirty_bytes"] = 3 * 65536;
  volume["peers"][0]["resynced_bytes"] = 1048576;
  volume["peers"][0]["resync"] = {{"done_bytes", 1048576},
                                  {"left_bytes", 196608},
                                  {"total_bytes", 1245184},
                                  {"rate_bytes_per_s", 52428800}};
  volume["peers"][1]["state"] = "split-brain";
  volume["peers"][1]["dirty_bytes"] = 0;
  auto s = parse(render_text(snapshot));
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 0);
  Labels v{{"volume", "db0"}, {"role", "primary"}};
  EXPECT_FALSE(value(s, "pmirror_volume_generation", v).has_value());
  EXPECT_EQ(value(s, "pmirror_peer_dirty_bytes", kNode2), 3 * 65536);
  EXPECT_EQ(value(s, "pmirror_peer_resync_left_bytes", kNode2), 196608);
  EXPECT_EQ(value(s, "pmirror_peer_resync_rate_bytes_per_second", kNode2), 52428800);
  EXPECT_EQ(value(s, "pmirror_peer_resynced_bytes_total", kNode2), 1048576);
  EXPECT_EQ(value(s, "pmirror_peer_resync_left_bytes", kNode3), 0);
  Labels syncing = kNode2;
  syncing["state"] = "syncing";
  EXPECT_EQ(value(s, "pmirror_peer_state", syncing), 1);
  Labels split = kNode3;
  split["state"] = "split-brain";
  EXPECT_EQ(value(s, "pmirror_peer_state", split), 1);
}

TEST(MetricsTest, AFailedReplicaVolumeIsExported) {
  json snapshot = canned();
  json replica = snapshot["volumes"][0];
  replica["name"] = "db1";
  replica["role"] = "replica";
  replica["state"] = "failed";
  replica["error"] = "volume 'db1' (/pmem/db1): msync of [0, +4096) failed: Input/output error";
  json healthy = replica;
  healthy["name"] = "db2";
  healthy["state"] = "ok";
  snapshot["volumes"].push_back(replica);
  snapshot["volumes"].push_back(healthy);
  auto s = parse(render_text(snapshot));
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 0);
  EXPECT_EQ(value(s, "pmirror_volume_failed", {{"volume", "db1"}, {"role", "replica"}}), 1);
  EXPECT_EQ(value(s, "pmirror_volume_failed", {{"volume", "db2"}, {"role", "replica"}}), 0);
  // A volume that reports no state (a primary) has no such series.
  EXPECT_FALSE(value(s, "pmirror_volume_failed", {{"volume", "db0"}, {"role", "primary"}}));
}

// A replica's writers are labelled by identity (never by their ephemeral
// port); ended sessions are not exported, and of two live sessions of one
// writer the connected one is, else the newer.
TEST(MetricsTest, AReplicasWritersAreLabelledByIdentityAndEndedSessionsLeave) {
  json session = {
      {"name", "app1@10.0.0.1:40000"}, {"address", "10.0.0.1:40000"},     {"transport", "tcp"},
      {"state", "connected"},          {"since", "2026-12-02T10:00:00Z"}, {"persists", 10}};
  json older = session;  // superseded by a reconnect, not reaped yet
  older["name"] = "app1@10.0.0.1:39000";
  older["state"] = "disconnected";
  older["since"] = "2026-12-02T09:00:00Z";
  older["persists"] = 5;
  json ended = session;
  ended["name"] = "app2@10.0.0.2:41000";
  ended["state"] = "closed";
  json volume = {{"name", "db1"},
                 {"role", "replica"},
                 {"state", "ok"},
                 {"peers", json::array({older, session, ended})}};
  json snapshot = {{"process", {{"kind", "pmirrord"}}}, {"volumes", json::array({volume})}};
  std::string text = render_text(snapshot);
  auto s = parse(text);
  const Labels app1{{"volume", "db1"}, {"role", "replica"}, {"peer", "app1"}};
  EXPECT_EQ(value(s, "pmirror_peer_connected", app1), 1) << text;
  EXPECT_EQ(value(s, "pmirror_persists_total", app1), 10) << "the newer session's\n" << text;
  EXPECT_FALSE(value(s, "pmirror_peer_connected",
                     {{"volume", "db1"}, {"role", "replica"}, {"peer", "app2"}}))
      << "an ended session is not a writer that is down\n"
      << text;
  EXPECT_EQ(text.find("peer=\"app1@"), std::string::npos) << text;
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 0) << text;
  // Re-ordered, the newest still wins.
  snapshot["volumes"][0]["peers"] = json::array({session, older});
  EXPECT_EQ(value(parse(render_text(snapshot)), "pmirror_persists_total", app1), 10);
  // The old session's teardown came after the reconnect (its state changed
  // later): the connected session still stands for the writer (CI once saw
  // a reconnected writer exported as down).
  older["since"] = "2026-12-02T11:00:00Z";
  snapshot["volumes"][0]["peers"] = json::array({older, session});
  auto late = parse(render_text(snapshot));
  EXPECT_EQ(value(late, "pmirror_peer_connected", app1), 1);
  EXPECT_EQ(value(late, "pmirror_persists_total", app1), 10);
}

// Labels come from status, which may carry bytes a peer chose: the scrape
// stays UTF-8 (the text format requires it) and names them as best it can.
TEST(MetricsTest, LabelsThatAreNotUtf8AreMadeUtf8) {
  json snapshot = canned();
  // Built in-process (parsing would refuse these bytes): overlong, stray
  // continuation, truncated, a surrogate, then a good "é".
  snapshot["volumes"][0]["peers"][0]["name"] =
      std::string("\xc0\xaf\x80 \xe2\x82 \xed\xa0\x80 caf\xc3\xa9");
  std::string text = render_text(snapshot);
  auto s = parse(text);
  EXPECT_EQ(value(s, "pmirror_up"), 1.0);
  const std::string replaced = "\xef\xbf\xbd";
  std::string expected = replaced + replaced + replaced + " " + replaced + replaced + " " +
                         replaced + replaced + replaced + " caf\xc3\xa9";
  EXPECT_TRUE(value(s, "pmirror_peer_connected", with(kNode2, "peer", expected)).has_value())
      << text;
}

TEST(MetricsTest, AdmissionCountersAreExported) {
  json snapshot = canned();
  snapshot["admission"] = {{"unauthenticated", 3},
                           {"evicted", 40},
                           {"timed_out", 5},
                           {"dropped", 2},
                           {"refused", 7},
                           {"authentication_failures", 9},
                           {"max_unauthenticated", 64},
                           {"max_unauthenticated_per_source", 16},
                           {"handshake_timeout_ms", 5000}};
  auto s = parse(render_text(snapshot));
  EXPECT_EQ(value(s, "pmirror_unauthenticated_connections"), 3.0);
  EXPECT_EQ(value(s, "pmirror_unauthenticated_evicted_total"), 40.0);
  EXPECT_EQ(value(s, "pmirror_handshake_timeouts_total"), 5.0);
  EXPECT_EQ(value(s, "pmirror_connections_dropped_total"), 2.0);
  EXPECT_EQ(value(s, "pmirror_handshakes_refused_total"), 7.0);
  EXPECT_EQ(value(s, "pmirror_authentication_failures_total"), 9.0);
}

TEST(MetricsTest, ListensOnIpv6Loopback) {
  auto exporter = Exporter::start("[::1]:0", [] { return canned(); });
  if (!exporter.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << exporter.status().message();
  EXPECT_EQ((*exporter)->address(), "[::1]:" + std::to_string((*exporter)->port()));
}

// A copy's fence, promotion and consistency (pmirrord's `copy`), and the
// node's pmirror-promoter (its status under "promoter"): who holds each
// lease, renewals, takeovers (docs/failover.md section 4).
TEST(MetricsTest, FencesAndLeasesAreExported) {
  json snapshot = canned();
  json fenced = snapshot["volumes"][0];
  fenced["name"] = "db1";
  fenced["role"] = "replica";
  fenced["copy"] = {{"generation", "9f3a2b1c4d5e6f70"},
                    {"consistent", true},
                    {"promoted", false},
                    {"fence",
                     {{"generation", "12ab34cd56ef7890"},
                      {"promoted_on", "node2"},
                      {"since", "2026-12-04T10:00:00Z"}}}};
  json promoted = fenced;
  promoted["name"] = "db2";
  promoted["copy"] = {
      {"generation", "12ab34cd56ef7890"}, {"consistent", false}, {"promoted", true}};
  // Promoted here: one fence landed, two still retried.
  promoted["fences"] = {
      {{"node", "node1"}, {"fenced", true}, {"sessions_ended", 1}, {"attempts", 1}},
      {{"node", "node3"}, {"fenced", false}, {"pending", true}, {"attempts", 0}, {"error", "x"}},
      {{"node", "node4"}, {"fenced", false}, {"pending", true}, {"attempts", 3}, {"error", "y"}}};
  json in_use = fenced;
  in_use["name"] = "db3";
  in_use["copy"] = {{"in_use_by_local_primary", true}};
  snapshot["volumes"].push_back(fenced);
  snapshot["volumes"].push_back(promoted);
  snapshot["volumes"].push_back(in_use);
  snapshot["promoter"] = {
      {"node", "node1"},
      {"lease", {{"id", 7}, {"deadline_in_ms", 2500}, {"renewals", 41}, {"renewal_failures", 2}}},
      {"volumes",
       {{{"name", "db1"}, {"holder", "node2"}, {"held", false}, {"takeovers", 0}, {"losses", 1}},
        {{"name", "db2"},
         {"holder", "node1"},
         {"held", true},
         {"takeovers", 3},
         {"losses", 0},
         {"application", {{"hook", "unit db2.service"}, {"pid", 0}, {"ended", 2}}}}}}};
  auto s = parse(render_text(snapshot));
  EXPECT_EQ(value(s, "pmirror_metrics_snapshot_errors_total"), 0);
  const Labels db1{{"volume", "db1"}, {"role", "replica"}};
  const Labels db2{{"volume", "db2"}, {"role", "replica"}};
  EXPECT_EQ(value(s, "pmirror_copy_fenced", db1), 1);
  EXPECT_EQ(value(s, "pmirror_copy_fenced", db2), 0);
  EXPECT_EQ(value(s, "pmirror_copy_promoted", db1), 0);
  EXPECT_EQ(value(s, "pmirror_copy_promoted", db2), 1);
  EXPECT_EQ(value(s, "pmirror_copy_consistent", db1), 1);
  EXPECT_EQ(value(s, "pmirror_copy_consistent", db2), 0);
  EXPECT_EQ(value(s, "pmirror_fences_pending", db2), 2);
  EXPECT_FALSE(value(s, "pmirror_fences_pending", db1)) << "never promoted here: no series";
  // A copy open by the local application says nothing of itself.
  EXPECT_FALSE(value(s, "pmirror_copy_fenced", {{"volume", "db3"}, {"role", "replica"}}));

  EXPECT_EQ(value(s, "pmirror_lease_renewals_total"), 41);
  EXPECT_EQ(value(s, "pmirror_lease_renewal_failures_total"), 2);
  EXPECT_EQ(value(s, "pmirror_lease_deadline_seconds"), 2.5);
  EXPECT_EQ(value(s, "pmirror_lease_held", {{"volume", "db1"}}), 0);
  EXPECT_EQ(value(s, "pmirror_lease_held", {{"volume", "db2"}}), 1);
  EXPECT_EQ(value(s, "pmirror_lease_holder_info", {{"volume", "db1"}, {"holder", "node2"}}), 1);
  EXPECT_EQ(value(s, "pmirror_lease_takeovers_total", {{"volume", "db2"}}), 3);
  EXPECT_EQ(value(s, "pmirror_lease_losses_total", {{"volume", "db1"}}), 1);
  EXPECT_EQ(value(s, "pmirror_application_ends_total", {{"volume", "db2"}}), 2);
  EXPECT_FALSE(value(s, "pmirror_application_ends_total", {{"volume", "db1"}}));

  // Without a lease (etcd unreachable), no deadline.
  snapshot["promoter"]["lease"] = {{"id", 0}, {"error", "etcd: timeout"}};
  auto down = parse(render_text(snapshot));
  EXPECT_EQ(value(down, "pmirror_lease_deadline_seconds"), 0);
  // A broken promoter section is skipped and counted, the rest still exported.
  snapshot["promoter"] = "garbage";
  auto broken = parse(render_text(snapshot));
  EXPECT_EQ(value(broken, "pmirror_metrics_snapshot_errors_total"), 1);
  EXPECT_EQ(value(broken, "pmirror_copy_fenced", db1), 1);
}

}  // namespace
}  // namespace pmirror::metrics
