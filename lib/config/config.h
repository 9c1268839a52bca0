// pmirrord's configuration file (YAML, yaml-cpp). docs/config.md is the
// reference. Every mistake is reported with the file, line and column and
// what is wrong; unknown keys are errors (a typo must not silently become a
// default).
//
//   daemon:
//     listen: 127.0.0.1          # address to bind
//     port: 7450
//     transport: tcp             # tcp | rdma
//     state_pool: /var/lib/pmirror/pmirrord.state   # libpmemobj pool
//     log_level: info            # trace|debug|info|warn|error|critical|off
//   volumes:
//     - name: db0
//       path: /dev/dax0.0        # devdax, a file on fsdax, or a plain file
//       size: 1GiB               # bytes, or with K/M/G/T[i]B suffix
//       create: false            # create the file if missing (plain/fsdax)
//       allowed_peers: [app1]    # identities allowed to open it
//       secret_file: /etc/pmirror/db0.secret   # or `secret: "..."`
//       apm: auto                # auto|on|off: may the target promise APM?
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace pmirror::config {

// APM over rdma is only correct where the NIC writes straight into the
// persistence domain (DDIO off or eADR). auto: promise it when the volume is
// pmem; on: always (operator asserts the platform); off: never (GPSPM only).
enum class ApmPolicy { kAuto, kOn, kOff };

struct VolumeConfig {
  std::string name;
  std::string path;
  uint64_t size = 0;
  bool create = false;
  std::vector<std::string> allowed_peers;
  std::string secret;  // resolved: from `secret` or the contents of `secret_file`
  ApmPolicy apm = ApmPolicy::kAuto;
};

struct DaemonConfig {
  std::string listen_address = "127.0.0.1";
  uint16_t port = 7450;
  transport::Kind transport = transport::Kind::kTcp;
  std::string state_pool = "/var/lib/pmirror/pmirrord.state";
  std::string log_level = "info";
  std::vector<VolumeConfig> volumes;
};

// Parses and validates. Errors are kConfigError with "FILE:LINE:COL: what".
Result<DaemonConfig> load_daemon_config(const std::string& path);
Result<DaemonConfig> parse_daemon_config(const std::string& yaml_text,
                                         const std::string& source_name = "<config>");

// "64MiB", "1G", "4096" -> bytes. Suffixes K,M,G,T with optional "iB"/"B",
// all powers of 1024. Rejects negatives, fractions, overflow, junk.
Result<uint64_t> parse_size(std::string_view text);

}  // namespace pmirror::config
