// Prometheus endpoint for pmirror processes (off unless configured).
//
// The exporter owns no counters of its own: at every scrape it asks
// `snapshot()` for the status JSON (docs/status-schema.md) and converts it
// into metric families, so the numbers in /metrics are exactly the numbers
// `pmirrorctl status` shows. docs/operations.md lists every series.
//
//   auto exporter = metrics::Exporter::start("127.0.0.1:9942", [&] { return status_json(); });
//   if (!exporter.ok()) ... exporter.status().message() names the address and the cause
//
// `snapshot` is called from the HTTP server's threads, concurrently with
// everything else: it must be thread-safe. A snapshot that throws, is not an
// object, or has fields of the wrong type does not fail the scrape: what can
// be read is exported, the rest is skipped and counted in
// pmirror_metrics_snapshot_errors_total.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pmirror::metrics {

using SnapshotFn = std::function<nlohmann::json()>;

// The conversion alone, without an HTTP server, in the Prometheus text
// format (what GET /metrics returns for this snapshot); for tests and tools.
std::string render_text(const nlohmann::json& snapshot);

class Exporter {
 public:
  // host_port: "HOST:PORT" or "[IPV6]:PORT"; HOST is an address or a name
  // that resolves to one (the first address is used); PORT 0 picks a free
  // port (see port()). Serves GET /metrics until destroyed.
  // Errors: kConfigError for a malformed address, kConnectionError when the
  // address cannot be bound (in use, not local, no permission).
  static Result<std::unique_ptr<Exporter>> start(const std::string& host_port, SnapshotFn snapshot);
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  uint16_t port() const;                                   // the port actually bound
  const std::string& address() const { return address_; }  // as bound, "127.0.0.1:9942"

  class Impl;

 private:
  Exporter(std::unique_ptr<Impl> impl, std::string address);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// Splits "HOST:PORT" / "[IPV6]:PORT". kConfigError "metrics address 'x':
// expected HOST:PORT (...)" when malformed.
struct Endpoint {
  std::string host;
  uint16_t port = 0;
};
Result<Endpoint> parse_endpoint(std::string_view host_port);

}  // namespace pmirror::metrics
