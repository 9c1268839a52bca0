// The cluster file's `failover` section, `daemon.lease_dir` and a volume's
// `failover:` entry (docs/config.md#failover, docs/failover.md section 2).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"

namespace pmirror::config {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// A file: `cluster` (line 1), `failover` (from line 2), two nodes, one
// volume v with `volume_extra` appended to it.
std::string cluster_file(const std::string& failover, const std::string& volume_extra = "",
                         const std::string& cluster = "cluster: {name: prod}\n",
                         const std::string& node_extra = "") {
  return cluster + failover +
         "nodes:\n"
         "  - {name: n1, address: 10.0.0.1" +
         node_extra +
         "}\n"
         "  - {name: n2, address: 10.0.0.2}\n"
         "volumes:\n"
         "  - name: v\n"
         "    size: 1MiB\n"
         "    primary: n1\n"
         "    replicas: [n2]\n"
         "    path: /pmem/v\n"
         "    allowed_peers: [app]\n"
         "    secret: 0123456789abcdef\n" +
         volume_extra;
}

const std::string kEtcd =
    "failover:\n"
    "  engine: etcd\n"
    "  etcd:\n"
    "    endpoints: [http://127.0.0.1:2379]\n";

// The whole error text of a file that must be refused.
std::string errors_of(const std::string& text) {
  auto config = parse_cluster_config(text, "c.yaml");
  EXPECT_FALSE(config.ok()) << text;
  if (config.ok()) return {};
  EXPECT_EQ(config.status().code(), Errc::kConfigError);
  return config.status().message();
}

TEST(FailoverConfigTest, AFullEtcdSectionParsesIntoTheStructs) {
  auto config = parse_cluster_config(cluster_file(
      "failover:\n"
      "  engine: etcd\n"
      "  etcd:\n"
      "    endpoints: [http://127.0.0.1:2379, 'https://10.0.0.2:2379/', 'https://[::1]:2379']\n"
      "    prefix: /pm/irror\n"
      "    ttl: 12s\n"
      "    renew: 1500ms\n"
      "    timeout: 3s\n"
      "    margin: 0s\n"
      "    tls: {ca: /etc/pmirror/etcd-ca.pem, cert: /etc/pmirror/etcd.pem, key: "
      "/etc/pmirror/etcd-key.pem}\n",
      "    failover: {hook_unit: db1-app.service}\n"));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  const FailoverSettings& f = config->failover;
  EXPECT_EQ(f.engine, FailoverEngine::kEtcd);
  EXPECT_EQ(f.origin.key, "failover");
  EXPECT_EQ(f.origin.at, "<config>:3:3");
  EXPECT_EQ(f.etcd.endpoints,
            (std::vector<std::string>{"http://127.0.0.1:2379", "https://10.0.0.2:2379/",
                                      "https://[::1]:2379"}));
  EXPECT_EQ(f.etcd.prefix, "/pm/irror");
  EXPECT_EQ(f.etcd.ttl, milliseconds(12000));
  EXPECT_EQ(f.etcd.renew, milliseconds(1500));
  EXPECT_EQ(f.etcd.timeout, milliseconds(3000));
  EXPECT_EQ(f.etcd.margin, milliseconds(0));
  EXPECT_EQ(f.etcd.tls_ca, "/etc/pmirror/etcd-ca.pem");
  EXPECT_EQ(f.etcd.tls_cert, "/etc/pmirror/etcd.pem");
  EXPECT_EQ(f.etcd.tls_key, "/etc/pmirror/etcd-key.pem");
  EXPECT_EQ(f.etcd.tls_ca_at, "<config>:11:15");
  ASSERT_EQ(config->volumes.size(), 1u);
  EXPECT_EQ(config->volumes[0].failover.hook_unit, "db1-app.service");
  EXPECT_EQ(config->volumes[0].failover.start_command, "");
}

TEST(FailoverConfigTest, DefaultsAndTheSmallestEtcdSection) {
  auto none = parse_cluster_config(cluster_file(""));
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->failover.engine, FailoverEngine::kNone);
  EXPECT_TRUE(none->failover.etcd.endpoints.empty());
  EXPECT_EQ(none->daemon.lease_dir, "/run/pmirror");
  EXPECT_EQ(none->nodes[0].daemon.lease_dir, "/run/pmirror");

  auto etcd = parse_cluster_config(cluster_file(kEtcd));
  ASSERT_TRUE(etcd.ok()) << etcd.status().to_string();
  const EtcdSettings& e = etcd->failover.etcd;
  EXPECT_EQ(e.endpoints, std::vector<std::string>{"http://127.0.0.1:2379"});
  EXPECT_EQ(e.prefix, "/pmirror");
  EXPECT_EQ(e.ttl, milliseconds(10000));
  EXPECT_EQ(e.renew, milliseconds(2000));
  EXPECT_EQ(e.timeout, milliseconds(2000));
  EXPECT_EQ(e.margin, milliseconds(1000));
  EXPECT_EQ(e.tls_ca, "");
  EXPECT_EQ(e.tls_cert, "");
  EXPECT_EQ(e.tls_key, "");
  EXPECT_EQ(etcd->volumes[0].failover.hook_unit, "");

  // `failover:` with everything commented out, and engine: none.
  for (const char* text : {"failover:\n", "failover: {engine: none}\n"}) {
    auto config = parse_cluster_config(cluster_file(text));
    ASSERT_TRUE(config.ok()) << text << config.status().to_string();
    EXPECT_EQ(config->failover.engine, FailoverEngine::kNone);
  }
}

TEST(FailoverConfigTest, PacemakerNeedsNoEtcdSection) {
  auto config = parse_cluster_config(cluster_file(
      "failover: {engine: pacemaker}\n",
      "    failover: {start_command: 'systemctl start app', stop_command: 'kill app'}\n", ""));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->failover.engine, FailoverEngine::kPacemaker);
  EXPECT_EQ(config->volumes[0].failover.start_command, "systemctl start app");
  EXPECT_EQ(config->volumes[0].failover.stop_command, "kill app");
  auto plan = initiator_plan(*config, "v", "n1");
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->lease_file, "");
}

TEST(FailoverConfigTest, VolumeFailoverEntriesThatAreValid) {
  for (const char* entry : {"{hook_unit: app@db1.service}", "{hook_unit: db.target}",
                            "{start_command: /usr/bin/app}", "{}", ""}) {
    auto config =
        parse_cluster_config(cluster_file(kEtcd, std::string("    failover: ") + entry + "\n"));
    EXPECT_TRUE(config.ok()) << entry << ": " << config.status().to_string();
  }
}

TEST(FailoverConfigTest, LeaseDirDefaultsAndNodeOverride) {
  auto config = parse_cluster_config(
      cluster_file(kEtcd, "", "cluster: {name: prod}\ndaemon: {lease_dir: /run/pm}\n",
                   ", lease_dir: /run/pm-n1/"));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->daemon.lease_dir, "/run/pm");
  EXPECT_EQ(config->nodes[0].daemon.lease_dir, "/run/pm-n1/");
  EXPECT_EQ(config->nodes[1].daemon.lease_dir, "/run/pm");

  auto on_n1 = initiator_plan(*config, "v", "n1");
  ASSERT_TRUE(on_n1.ok()) << on_n1.status().to_string();
  EXPECT_EQ(on_n1->lease_file, "/run/pm-n1/v.lease");
  auto on_n2 = initiator_plan(*config, "v", "n2");
  ASSERT_TRUE(on_n2.ok()) << on_n2.status().to_string();
  EXPECT_EQ(on_n2->lease_file, "/run/pm/v.lease");

  auto defaults = parse_cluster_config(cluster_file(kEtcd));
  ASSERT_TRUE(defaults.ok()) << defaults.status().to_string();
  auto plan = initiator_plan(*defaults, "v", "n1");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->lease_file, "/run/pmirror/v.lease");

  auto none = parse_cluster_config(cluster_file(""));
  ASSERT_TRUE(none.ok());
  plan = initiator_plan(*none, "v", "n1");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->lease_file, "");

  EXPECT_NE(errors_of(cluster_file("", "", "daemon: {lease_dir: run/pmirror}\n"))
                .find("c.yaml:1:21: daemon.lease_dir: 'run/pmirror' is not an absolute path"),
            std::string::npos);
  EXPECT_NE(errors_of(cluster_file("", "", "", ", lease_dir: x"))
                .find("nodes[0].lease_dir: 'x' is not an absolute path"),
            std::string::npos);
}

struct Rejected {
  const char* name;
  std::string text;
  std::vector<std::string> expected;  // substrings of the error
};

std::string etcd_with(const std::string& lines) {
  return "failover:\n"
         "  engine: etcd\n"
         "  etcd:\n" +
         lines;
}
const std::string kEndpoint = "    endpoints: [http://127.0.0.1:2379]\n";

TEST(FailoverConfigTest, EachRuleIsRejectedWithTheKeyAndTheReason) {
  const std::vector<Rejected> cases = {
      {"engine unknown",
       cluster_file("failover: {engine: zookeeper}\n"),
       {"c.yaml:2:20: failover.engine: 'zookeeper' is not one of none, etcd, pacemaker"}},
      {"failover not a map", cluster_file("failover: etcd\n"), {"failover: expected a map"}},
      {"etcd without its section",
       cluster_file("failover: {engine: etcd}\n"),
       {"failover.etcd: engine: etcd needs the etcd section"}},
      {"etcd without endpoints",
       cluster_file(etcd_with("    prefix: /pm\n")),
       {"c.yaml:4:3: failover.etcd: missing required key 'endpoints'"}},
      {"empty endpoint list",
       cluster_file(etcd_with("    endpoints: []\n")),
       {"failover.etcd.endpoints: the list is empty"}},
      {"endpoints not a list",
       cluster_file(etcd_with("    endpoints: http://a:2379\n")),
       {"failover.etcd.endpoints: expected a list of URLs"}},
      {"endpoint without scheme",
       cluster_file(etcd_with("    endpoints: [10.0.0.1:2379]\n")),
       {"c.yaml:5:17: failover.etcd.endpoints[0]: '10.0.0.1:2379' is not an etcd endpoint",
        "http:// or https://"}},
      {"endpoint of another scheme",
       cluster_file(etcd_with("    endpoints: [http://a:2379, grpc://b:2379]\n")),
       {"failover.etcd.endpoints[1]: 'grpc://b:2379'", "http:// or https://"}},
      {"endpoint without port",
       cluster_file(etcd_with("    endpoints: [https://10.0.0.1]\n")),
       {"failover.etcd.endpoints[0]: 'https://10.0.0.1' is not an etcd endpoint",
        "the port is missing"}},
      {"endpoint without host",
       cluster_file(etcd_with("    endpoints: ['http://:2379']\n")),
       {"failover.etcd.endpoints[0]", "the host is missing"}},
      {"endpoint with a bad port",
       cluster_file(etcd_with("    endpoints: ['http://a:99999']\n")),
       {"failover.etcd.endpoints[0]", "the port must be a number 1..65535"}},
      {"endpoint with a path",
       cluster_file(etcd_with("    endpoints: ['http://a:2379/v3']\n")),
       {"failover.etcd.endpoints[0]: 'http://a:2379/v3'", "no path is allowed"}},
      {"endpoint with a user",
       cluster_file(etcd_with("    endpoints: ['http://u@a:2379']\n")),
       {"failover.etcd.endpoints[0]", "without user"}},
      {"endpoint listed twice",
       cluster_file(etcd_with("    endpoints: [http://a:2379, http://a:2379]\n")),
       {"failover.etcd.endpoints[1]: 'http://a:2379' is listed twice (first at c.yaml:5:17)"}},
      {"endpoint not a string",
       cluster_file(etcd_with("    endpoints: [{a: 1}]\n")),
       {"failover.etcd.endpoints[0]: expected a URL"}},
      {"etcd with engine none",
       cluster_file("failover:\n  etcd: {endpoints: [http://a:2379]}\n"),
       {"c.yaml:3:3: failover.etcd: failover.etcd is only used with engine: etcd",
        "none, the default"}},
      {"etcd with engine pacemaker",
       cluster_file("failover:\n  engine: pacemaker\n  etcd: {endpoints: [http://a:2379]}\n"),
       {"failover.etcd: failover.etcd is only used with engine: etcd (engine is pacemaker)"}},
      {"prefix without leading slash",
       cluster_file(etcd_with(kEndpoint + "    prefix: pmirror\n")),
       {"c.yaml:6:13: failover.etcd.prefix: 'pmirror' must start with '/'"}},
      {"prefix with trailing slash",
       cluster_file(etcd_with(kEndpoint + "    prefix: /pmirror/\n")),
       {"failover.etcd.prefix: '/pmirror/' must not end with '/'"}},
      {"prefix with whitespace",
       cluster_file(etcd_with(kEndpoint + "    prefix: '/pm irror'\n")),
       {"failover.etcd.prefix: '/pm irror' must not contain whitespace"}},
      {"prefix empty",
       cluster_file(etcd_with(kEndpoint + "    prefix: ''\n")),
       {"failover.etcd.prefix: must not be empty"}},
      {"duration junk",
       cluster_file(etcd_with(kEndpoint + "    ttl: 10\n")),
       {"failover.etcd.ttl: invalid duration '10': a unit is required"}},
      {"duration not a scalar",
       cluster_file(etcd_with(kEndpoint + "    renew: [1s]\n")),
       {"failover.etcd.renew: expected a duration"}},
      {"ttl too short",
       cluster_file(etcd_with(kEndpoint + "    ttl: 2s\n")),
       {"c.yaml:6:10: failover.etcd.ttl: 2s is too short; at least 3s"}},
      {"renew too short",
       cluster_file(etcd_with(kEndpoint + "    renew: 50ms\n")),
       {"failover.etcd.renew: 50ms is too short; at least 100ms"}},
      {"renew zero",
       cluster_file(etcd_with(kEndpoint + "    renew: 0s\n")),
       {"failover.etcd.renew: must be greater than zero"}},
      {"timeout too short",
       cluster_file(etcd_with(kEndpoint + "    timeout: 99ms\n")),
       {"failover.etcd.timeout: 99ms is too short; at least 100ms"}},
      {"margin negative",
       cluster_file(etcd_with(kEndpoint + "    margin: -1s\n")),
       {"failover.etcd.margin: invalid duration '-1s': a duration cannot be negative"}},
      {"timing rule",
       cluster_file(etcd_with(kEndpoint + "    ttl: 5s\n")),
       {"c.yaml:6:10: failover.etcd: renew (2s) + 2 x timeout (2s) + margin (1s) = 7s must not "
        "exceed ttl (5s): a primary that cannot renew would go on writing after its lease "
        "expired (pmirror-cluster.yaml(5), FAILOVER)"}},
      {"timing rule without ttl",
       cluster_file(etcd_with(kEndpoint + "    renew: 4s\n    timeout: 2600ms\n")),
       {"c.yaml:4:3: failover.etcd: renew (4s) + 2 x timeout (2600ms) + margin (1s) = 10200ms "
        "must not exceed ttl (10s)"}},
      {"tls cert without key",
       cluster_file(etcd_with("    endpoints: [https://a:2379]\n    tls: {cert: /c.pem}\n")),
       {"failover.etcd.tls: cert and key go together", "without its key"}},
      {"tls key without cert",
       cluster_file(etcd_with("    endpoints: [https://a:2379]\n    tls: {key: /k.pem}\n")),
       {"failover.etcd.tls: cert and key go together", "key without its certificate"}},
      {"tls with http endpoints only",
       cluster_file(etcd_with(kEndpoint + "    tls: {ca: /ca.pem}\n")),
       {"c.yaml:6:5: failover.etcd.tls: every endpoint is http://, so TLS would never be used"}},
      {"tls relative path",
       cluster_file(etcd_with("    endpoints: [https://a:2379]\n    tls: {ca: ca.pem}\n")),
       {"failover.etcd.tls.ca: 'ca.pem' is not an absolute path"}},
      {"tls not a map",
       cluster_file(etcd_with("    endpoints: [https://a:2379]\n    tls: true\n")),
       {"failover.etcd.tls: expected a map of files"}},
      {"etcd without cluster name",
       cluster_file(kEtcd, "", ""),
       {"c.yaml:2:11: failover.engine: engine: etcd needs cluster.name"}},
      {"etcd with a cluster name that is not allowed",
       cluster_file(kEtcd, "", "cluster: {name: 'pr od'}\n"),
       {"cluster.name: cluster name 'pr od' contains a character that is not allowed"}},
      {"volume failover without engine",
       cluster_file("", "    failover: {hook_unit: app.service}\n"),
       {"volumes[0].failover: has no effect without failover.engine"}},
      {"volume failover not a map",
       cluster_file(kEtcd, "    failover: app.service\n"),
       {"volumes[0].failover: expected a map"}},
      {"hook_unit and start_command",
       cluster_file(kEtcd, "    failover: {hook_unit: a.service, start_command: x}\n"),
       {"volumes[0].failover: give either hook_unit or start_command"}},
      {"stop_command alone",
       cluster_file(kEtcd, "    failover: {stop_command: x}\n"),
       {"volumes[0].failover: stop_command is only used with start_command"}},
      {"hook_unit without a suffix",
       cluster_file(kEtcd, "    failover: {hook_unit: db1-app}\n"),
       {"volumes[0].failover.hook_unit: 'db1-app' is not a systemd unit name; it must end in "
        ".service"}},
      {"hook_unit with a slash",
       cluster_file(kEtcd, "    failover: {hook_unit: /etc/app.service}\n"),
       {"volumes[0].failover.hook_unit: '/etc/app.service' contains a character", "no '/'"}},
      {"hook_unit with whitespace",
       cluster_file(kEtcd, "    failover: {hook_unit: 'my app.service'}\n"),
       {"volumes[0].failover.hook_unit: 'my app.service' contains a character"}},
      {"hook_unit a template",
       cluster_file(kEtcd, "    failover: {hook_unit: app@.service}\n"),
       {"volumes[0].failover.hook_unit: 'app@.service' is a template"}},
      {"start_command empty",
       cluster_file(kEtcd, "    failover: {start_command: ''}\n"),
       {"volumes[0].failover.start_command: must not be empty"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string errors = errors_of(c.text);
    for (const auto& expected : c.expected) {
      EXPECT_NE(errors.find(expected), std::string::npos) << "expected '" << expected << "' in:\n"
                                                          << errors;
    }
  }
}

TEST(FailoverConfigTest, TheTimingRuleAtItsEdge) {
  // 2s + 2 x 3s + 2s = 10s = ttl: allowed.
  auto config = parse_cluster_config(
      cluster_file(etcd_with(kEndpoint + "    timeout: 3s\n    margin: 2s\n")));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  // The same with 1ms more margin: refused.
  std::string errors =
      errors_of(cluster_file(etcd_with(kEndpoint + "    timeout: 3s\n    margin: 2001ms\n")));
  EXPECT_NE(errors.find("margin (2001ms) = 10001ms must not exceed ttl (10s)"), std::string::npos)
      << errors;
  // A duration that is wrong is reported alone, not also through the rule.
  errors = errors_of(cluster_file(etcd_with(kEndpoint + "    ttl: 1s\n")));
  EXPECT_EQ(errors.find("must not exceed ttl"), std::string::npos) << errors;
}

TEST(FailoverConfigTest, UnknownKeysGetADidYouMean) {
  std::string errors = errors_of(cluster_file("failover: {engnie: etcd}\n"));
  EXPECT_NE(errors.find("c.yaml:2:12: failover: unknown key 'engnie' (did you mean 'engine'?); "
                        "allowed keys: engine, etcd"),
            std::string::npos)
      << errors;
  errors = errors_of(cluster_file(etcd_with(kEndpoint + "    ttl_s: 10s\n")));
  EXPECT_NE(errors.find("c.yaml:6:5: failover.etcd: unknown key 'ttl_s' (did you mean 'ttl'?)"),
            std::string::npos)
      << errors;
  errors = errors_of(
      cluster_file(etcd_with("    endpoints: [https://a:2379]\n    tls: {caa: /ca.pem}\n")));
  EXPECT_NE(errors.find("failover.etcd.tls: unknown key 'caa' (did you mean 'ca'?); allowed "
                        "keys: ca, cert, key"),
            std::string::npos)
      << errors;
  errors = errors_of(cluster_file(kEtcd, "    failover: {hook_unti: a.service}\n"));
  EXPECT_NE(errors.find("volumes[0].failover: unknown key 'hook_unti' (did you mean 'hook_unit'?)"),
            std::string::npos)
      << errors;
  errors = errors_of(cluster_file("", "", "daemon: {lease_directory: /run/x}\n"));
  EXPECT_NE(errors.find("daemon: unknown key 'lease_directory' (did you mean 'lease_dir'?)"),
            std::string::npos)
      << errors;
}

TEST(FailoverConfigTest, EveryProblemOfTheSectionIsReportedAtOnce) {
  std::string errors = errors_of(cluster_file(
      etcd_with("    endpoints: [ftp://a:1]\n    prefix: x\n    ttl: 1s\n    tls: {cert: /c}\n"),
      "    failover: {stop_command: x}\n", ""));
  for (const char* expected :
       {"failover.engine: engine: etcd needs cluster.name", "failover.etcd.endpoints[0]",
        "failover.etcd.prefix", "failover.etcd.ttl", "failover.etcd.tls: cert and key",
        "volumes[0].failover: stop_command"}) {
    EXPECT_NE(errors.find(expected), std::string::npos) << expected << " in:\n" << errors;
  }
}

TEST(FailoverConfigTest, ConfigCheckReadsTheTlsFiles) {
  std::string pattern = (fs::temp_directory_path() / "pmirror-failover-XXXXXX").string();
  fs::path dir = ::mkdtemp(pattern.data());
  std::ofstream(dir / "ca.pem") << "-----BEGIN CERTIFICATE-----\n";
  std::ofstream(dir / "cert.pem") << "-----BEGIN CERTIFICATE-----\n";
  // n1's copy and state pool where its start would find them.
  const std::string local =
      "    create: true\ndaemon:\n  state_pool: " + (dir / "state").string() + "\n";
  auto here = [&](std::string text) {
    return text.replace(text.find("/pmem/v"), 7, (dir / "v.img").string()) + local;
  };
  std::string text = here(cluster_file(etcd_with(
      "    endpoints: [https://a:2379]\n    tls: {ca: " + (dir / "ca.pem").string() + ", cert: " +
      (dir / "cert.pem").string() + ", key: " + (dir / "missing.pem").string() + "}\n")));
  std::ofstream(dir / "cluster.yaml") << text;
  auto problems = check_cluster_file((dir / "cluster.yaml").string(), "n1");
  ASSERT_EQ(problems.size(), 1u) << (problems.empty() ? "" : problems[0]);
  EXPECT_NE(problems[0].find("cluster.yaml:6:"), std::string::npos) << problems[0];
  EXPECT_NE(
      problems[0].find("failover.etcd.tls.key: cannot read " + (dir / "missing.pem").string()),
      std::string::npos)
      << problems[0];
  std::ofstream(dir / "missing.pem") << "-----BEGIN PRIVATE KEY-----\n";
  problems = check_cluster_file((dir / "cluster.yaml").string(), "n1");
  EXPECT_TRUE(problems.empty()) << problems[0];
  // The timing rule comes with parsing.
  std::ofstream(dir / "cluster.yaml") << here(cluster_file(etcd_with(kEndpoint + "    ttl: 4s\n")));
  problems = check_cluster_file((dir / "cluster.yaml").string(), "n1");
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("must not exceed ttl (4s)"), std::string::npos) << problems[0];
  std::error_code ignored;
  fs::remove_all(dir, ignored);
}

}  // namespace
}  // namespace pmirror::config
