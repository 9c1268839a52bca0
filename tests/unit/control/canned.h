// Fixed status objects (docs/control.md's schema) for the formatting and
// pmirrorctl tests.
#pragma once

#include <nlohmann/json.hpp>

namespace pmirror::control::testing {

// A primary (libpmirror in "app1") writing db0 to node2 and node3.
inline nlohmann::json initiator_status() {
  return nlohmann::json::parse(R"({
    "schema_version": 1,
    "process": {"kind": "initiator", "pid": 4242, "node": "node1", "identity": "app1",
                "started_at": "2026-11-29T16:00:00Z", "version": "0.1.0"},
    "volumes": [{
      "name": "db0", "role": "primary", "size": 1073741824, "path": "/mnt/pmem/db0",
      "peers": [
        {"name": "node2", "address": "10.0.0.2:7450", "transport": "rdma",
         "state": "connected", "since": "2026-11-29T16:01:02Z", "reason": "handshake done",
         "method": "apm", "acknowledged_sequence": 123456, "lag": 0, "persists": 123456,
         "bytes": 987654321, "errors": 0,
         "latency_us": {"p50": 55.1, "p99": 130.2, "p999": 900.0, "count": 123456}},
        {"name": "node3", "address": "10.0.0.3:7450", "transport": "rdma",
         "state": "disconnected", "since": "2026-11-29T16:03:10.250Z",
         "reason": "nothing heard for 5000 ms", "errors": 2}
      ]
    }]
  })");
}

// pmirrord on node2, a replica of db1 (written by app1) and of db2 (idle).
inline nlohmann::json daemon_status() {
  return nlohmann::json::parse(R"({
    "schema_version": 1,
    "process": {"kind": "pmirrord", "pid": 99, "node": "node2",
                "started_at": "2026-11-28T09:00:00Z", "version": "0.1.0"},
    "volumes": [
      {"name": "db1", "role": "replica", "size": 268435456, "path": "/dev/dax0.0",
       "backing": "devdax", "generation": 3, "last_sequence": 4567, "methods": ["apm", "gpspm"],
       "peers": [
         {"name": "app1@10.0.0.1", "address": "10.0.0.1:40022", "transport": "rdma",
          "state": "connected", "since": "2026-11-28T09:00:00Z", "persists": 4567, "errors": 0}
       ]},
      {"name": "db2", "role": "replica", "size": 1610612736, "path": "/var/lib/pmirror/db2",
       "backing": "plain file", "generation": 1, "last_sequence": 0, "methods": ["gpspm"],
       "peers": []}
    ]
  })");
}

// What `pmirrorctl status` prints for both (UTC, at 2026-11-29T16:03:15Z).
inline const char* kHumanStatus =
    "db0 role:primary size:1GiB (initiator app1, pid 4242)\n"
    "  node2 connection:connected since 16:01:02 (2m ago) method:apm acked:123456 lag:0 "
    "persists:123456 p50:55us p99:130us p99.9:900us\n"
    "  node3 connection:disconnected since 16:03:10 (4s ago) errors:2 reason: nothing heard for "
    "5000 ms\n"
    "db1 role:replica size:256MiB backing:devdax session-generation:3 last-seq:4567 (pmirrord "
    "node2)\n"
    "  app1@10.0.0.1 connection:connected since 2026-11-28 09:00:00 (1d ago) persists:4567\n"
    "db2 role:replica size:1.5GiB backing:plain-file session-generation:1 last-seq:0 (pmirrord "
    "node2)\n"
    "  (no peers)\n";

}  // namespace pmirror::control::testing
