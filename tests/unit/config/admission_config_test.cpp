// The daemon section's admission settings (handshake_timeout,
// max_unauthenticated, max_unauthenticated_per_source): defaults, values,
// and every bad value rejected with its line.
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"

namespace pmirror::config {
namespace {

using std::chrono::milliseconds;

// `daemon_lines` (from line 2) in a daemon section, then a minimal cluster.
std::string with_daemon(const std::string& daemon_lines) {
  return "daemon:\n" + daemon_lines +
         "nodes:\n"
         "  - {name: n1, address: 10.0.0.1}\n"
         "  - {name: n2, address: 10.0.0.2}\n"
         "volumes:\n"
         "  - {name: v, size: 1MiB, primary: n1, replicas: [n2], path: /pmem/v,\n"
         "     allowed_peers: [app], secret: 0123456789abcdef}\n";
}

int first_line(const std::string& message) {
  // "<config>:LINE:COL: ..."
  size_t colon = message.find(':');
  if (colon == std::string::npos) return 0;
  return std::atoi(message.c_str() + colon + 1);
}

TEST(AdmissionConfig, DefaultsAndValues) {
  auto defaults = parse_cluster_config(with_daemon("  log_level: info\n"));
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_EQ(defaults->daemon.handshake_timeout, milliseconds(5000));
  EXPECT_EQ(defaults->daemon.max_unauthenticated, 64u);
  EXPECT_EQ(defaults->daemon.max_unauthenticated_per_source, 16u);

  auto set =
      parse_cluster_config(with_daemon("  handshake_timeout: 2s\n"
                                       "  max_unauthenticated: 500\n"
                                       "  max_unauthenticated_per_source: 500\n"));
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->daemon.handshake_timeout, milliseconds(2000));
  EXPECT_EQ(set->daemon.max_unauthenticated, 500u);
  EXPECT_EQ(set->daemon.max_unauthenticated_per_source, 500u);
  // Every node's pmirrord gets them.
  auto daemon = daemon_config_for(*set, "n2");
  ASSERT_TRUE(daemon.ok()) << daemon.status().message();
  EXPECT_EQ(daemon->handshake_timeout, milliseconds(2000));
  EXPECT_EQ(daemon->max_unauthenticated, 500u);
  EXPECT_EQ(daemon->max_unauthenticated_per_source, 500u);

  // A total below the default per-source cap lowers that cap with it.
  auto small = parse_cluster_config(with_daemon("  max_unauthenticated: 8\n"));
  ASSERT_TRUE(small.ok()) << small.status().message();
  EXPECT_EQ(small->daemon.max_unauthenticated_per_source, 8u);
}

TEST(AdmissionConfig, BadValuesAreRejectedWithTheirLine) {
  struct Case {
    std::string daemon_lines;
    int line;
    const char* fragment;
  };
  const Case cases[] = {
      {"  handshake_timeout: 0s\n", 2, "daemon.handshake_timeout: must be greater than zero"},
      {"  handshake_timeout: 5\n", 2, "daemon.handshake_timeout: invalid duration '5'"},
      {"  max_unauthenticated: 0\n", 2,
       "daemon.max_unauthenticated: expected a number of connections 1..65536, got '0'"},
      {"  max_unauthenticated: lots\n", 2, "got 'lots'"},
      {"  max_unauthenticated: 100000\n", 2, "1..65536, got '100000'"},
      {"  max_unauthenticated_per_source: -1\n", 2,
       "daemon.max_unauthenticated_per_source: expected a number of connections"},
      {"  log_level: info\n  max_unauthenticated: 8\n  max_unauthenticated_per_source: 9\n", 4,
       "max_unauthenticated_per_source (9) must not exceed max_unauthenticated (8)"},
      {"  max_unauthenticated_per_source: 65\n", 2,
       "max_unauthenticated_per_source (65) must not exceed max_unauthenticated (64)"},
      {"  max_unauthenticated_per_sourc: 9\n", 2,
       "unknown key 'max_unauthenticated_per_sourc' (did you mean "
       "'max_unauthenticated_per_source'?)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.daemon_lines);
    auto config = parse_cluster_config(with_daemon(c.daemon_lines));
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), Errc::kConfigError);
    EXPECT_NE(config.status().message().find(c.fragment), std::string::npos)
        << config.status().message();
    EXPECT_EQ(first_line(config.status().message()), c.line) << config.status().message();
  }
}

}  // namespace
}  // namespace pmirror::config
