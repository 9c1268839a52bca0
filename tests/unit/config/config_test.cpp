#include "config/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace pmirror::config {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "pmirror-config-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

  // Writes a file with the given mode and returns its path.
  std::string write(const std::string& name, const std::string& contents, mode_t mode = 0600) {
    fs::path file = path_ / name;
    std::ofstream(file, std::ios::binary) << contents;
    EXPECT_EQ(::chmod(file.c_str(), mode), 0);
    return file.string();
  }

 private:
  fs::path path_;
};

constexpr const char* kSecret = "0123456789abcdef0123";

// A minimal valid volume, for configs that test something else.
const std::string kVolume =
    "volumes:\n"
    "  - name: v\n"
    "    path: /pmem/v\n"
    "    allowed_peers: [app]\n"
    "    secret: 0123456789abcdef\n";

TEST(ConfigTest, FullConfigParses) {
  TempDir dir;
  std::string secret_file = dir.write("db1.secret", std::string(kSecret) + "\n");
  std::string text =
      "daemon:\n"
      "  listen: 10.0.0.5\n"
      "  port: 9000\n"
      "  transport: rdma\n"
      "  state_pool: /pmem/state.pool\n"
      "  log_level: debug\n"
      "volumes:\n"
      "  - name: db0\n"
      "    path: /dev/dax0.0\n"
      "    allowed_peers: [app1, app2]\n"
      "    secret: \"" +
      std::string(kSecret) +
      "\"\n"
      "    apm: on\n"
      "  - name: db1.log_2-x\n"
      "    path: /var/lib/pmirror/db1.img\n"
      "    size: 64MiB\n"
      "    create: true\n"
      "    allowed_peers:\n"
      "      - app1\n"
      "    secret_file: " +
      secret_file +
      "\n"
      "    apm: off\n";
  auto config = parse_daemon_config(text, "full.yaml");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->listen_address, "10.0.0.5");
  EXPECT_EQ(config->port, 9000);
  EXPECT_EQ(config->transport, transport::Kind::kRdma);
  EXPECT_EQ(config->state_pool, "/pmem/state.pool");
  EXPECT_EQ(config->log_level, "debug");
  ASSERT_EQ(config->volumes.size(), 2u);

  const VolumeConfig& db0 = config->volumes[0];
  EXPECT_EQ(db0.name, "db0");
  EXPECT_EQ(db0.path, "/dev/dax0.0");
  EXPECT_EQ(db0.size, 0u);
  EXPECT_FALSE(db0.create);
  EXPECT_EQ(db0.allowed_peers, (std::vector<std::string>{"app1", "app2"}));
  EXPECT_EQ(db0.secret, kSecret);
  EXPECT_EQ(db0.apm, ApmPolicy::kOn);

  const VolumeConfig& db1 = config->volumes[1];
  EXPECT_EQ(db1.name, "db1.log_2-x");
  EXPECT_EQ(db1.path, "/var/lib/pmirror/db1.img");
  EXPECT_EQ(db1.size, 64u << 20);
  EXPECT_TRUE(db1.create);
  EXPECT_EQ(db1.allowed_peers, (std::vector<std::string>{"app1"}));
  EXPECT_EQ(db1.secret, kSecret);  // trailing newline stripped
  EXPECT_EQ(db1.apm, ApmPolicy::kOff);
}

TEST(ConfigTest, DefaultsApplyWhenDaemonSectionIsAbsentOrEmpty) {
  for (const std::string& prefix : {std::string(), std::string("daemon:\n")}) {
    auto config = parse_daemon_config(prefix + kVolume);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    DaemonConfig defaults;
    EXPECT_EQ(config->listen_address, defaults.listen_address);
    EXPECT_EQ(config->port, defaults.port);
    EXPECT_EQ(config->transport, transport::Kind::kTcp);
    EXPECT_EQ(config->state_pool, defaults.state_pool);
    EXPECT_EQ(config->log_level, "info");
    ASSERT_EQ(config->volumes.size(), 1u);
    EXPECT_EQ(config->volumes[0].apm, ApmPolicy::kAuto);
    EXPECT_FALSE(config->volumes[0].create);
  }
}

struct BadConfig {
  const char* what;
  std::string yaml;
  int line;  // expected line of the (first) error; 0: no position
  const char* fragment;
};

std::vector<BadConfig> bad_configs() {
  const std::string v = kVolume;
  // Volume prefix used by the volume-level cases; its items start on line 2.
  const std::string vol = "volumes:\n  - name: v\n";
  const std::string rest = "    allowed_peers: [app]\n    secret: 0123456789abcdef\n";
  return {
      {"empty file", "", 0, "the configuration is empty"},
      {"only comments", "# nothing\n", 0, "the configuration is empty"},
      {"syntax error", "daemon:\n  port: [1, 2\n", 3, "YAML syntax error"},
      {"tab indentation", "daemon:\n\tport: 1\n", 2, "YAML syntax error"},
      {"top-level list", "- a\n- b\n", 1, "top level must be a map"},
      {"top-level scalar", "hello\n", 1, "top level must be a map"},
      {"two documents", v + "---\n" + v, 7, "single document"},
      {"unknown top key", "deamon:\n  port: 1\n" + v, 1,
       "unknown key 'deamon' (did you mean 'daemon'?); allowed keys: daemon, volumes"},
      {"unknown daemon key", "daemon:\n  prot: 1\n" + v, 2,
       "allowed keys: listen, port, transport, state_pool, log_level"},
      {"duplicate daemon key", "daemon:\n  port: 1\n  port: 2\n" + v, 3,
       "duplicate key 'port' (first at <config>:2:3)"},
      {"daemon is a list", "daemon: [a]\n" + v, 1,
       "daemon: expected a map of settings, got a list"},
      {"port zero", "daemon:\n  port: 0\n" + v, 2,
       "daemon.port: expected a port number 1..65535, got '0'"},
      {"port too big", "daemon:\n  port: 65536\n" + v, 2, "1..65535, got '65536'"},
      {"port negative", "daemon:\n  port: -1\n" + v, 2, "got '-1'"},
      {"port string", "daemon:\n  port: http\n" + v, 2, "got 'http'"},
      {"port map", "daemon:\n  port: {a: 1}\n" + v, 2, "got a map"},
      {"port null", "daemon:\n  port:\n" + v, 2, "got nothing (null)"},
      {"bad transport", "daemon:\n  transport: udp\n" + v, 2, "'udp' is not one of tcp, rdma"},
      {"bad log level", "daemon:\n  log_level: verbose\n" + v, 2,
       "'verbose' is not one of trace, debug, info, warn, error, critical, off"},
      {"relative state pool", "daemon:\n  state_pool: state.pool\n" + v, 2, "not an absolute path"},
      {"empty listen", "daemon:\n  listen: ''\n" + v, 2, "daemon.listen: must not be empty"},
      {"no volumes key", "daemon:\n  port: 1\n", 1, "no 'volumes' section"},
      {"volumes null", "volumes:\n", 1, "no volumes are listed"},
      {"volumes empty list", "volumes: []\n", 1, "the list is empty"},
      {"volumes is a map", "volumes:\n  db0:\n    path: /x\n", 2, "expected a list of volumes"},
      {"volume is a scalar", "volumes:\n  - db0\n", 2, "expected a map describing a volume"},
      {"unknown volume key", vol + "    path: /p\n    sise: 1G\n" + rest, 4,
       "volumes[0]: unknown key 'sise' (did you mean 'size'?)"},
      {"missing name", "volumes:\n  - path: /p\n" + rest, 2, "missing required key 'name'"},
      {"missing path", vol + rest, 2, "missing required key 'path'"},
      {"bad volume name", "volumes:\n  - name: db/0\n    path: /p\n" + rest, 2,
       "volumes[0].name: volume name 'db/0' contains a character that is not allowed"},
      {"empty volume name", "volumes:\n  - name: ''\n    path: /p\n" + rest, 2,
       "volume name must not be empty"},
      {"long volume name",
       "volumes:\n  - name: " + std::string(65, 'a') + "\n    path: /p\n" + rest, 2,
       "at most 64 are allowed"},
      {"relative path", vol + "    path: pmem/v\n" + rest, 3, "'pmem/v' is not an absolute path"},
      {"duplicate name", vol + "    path: /a\n" + rest + "  - name: v\n    path: /b\n" + rest, 6,
       "duplicate volume name 'v' (first defined at <config>:2:11)"},
      {"duplicate path", vol + "    path: /a\n" + rest + "  - name: w\n    path: //a\n" + rest, 7,
       "path '//a' is already used by another volume (at <config>:3:11)"},
      {"fractional size", vol + "    path: /p\n    size: 1.5G\n" + rest, 4,
       "fractions are not allowed"},
      {"junk size", vol + "    path: /p\n    size: lots\n" + rest, 4, "invalid size 'lots'"},
      {"zero size", vol + "    path: /p\n    size: 0\n" + rest, 4, "greater than zero"},
      {"size is a list", vol + "    path: /p\n    size: [1]\n" + rest, 4, "got a list"},
      {"create without size", vol + "    path: /p\n    create: true\n" + rest, 4,
       "create: true needs a size"},
      {"create yes", vol + "    path: /p\n    create: yes\n" + rest, 4,
       "expected true or false, got 'yes'"},
      {"missing allowed_peers", vol + "    path: /p\n    secret: 0123456789abcdef\n", 2,
       "missing required key 'allowed_peers'"},
      {"allowed_peers scalar",
       vol + "    path: /p\n    allowed_peers: app\n    secret: 0123456789abcdef\n", 4,
       "expected a list of identities"},
      {"allowed_peers map",
       vol + "    path: /p\n    allowed_peers:\n      app: 1\n    secret: 0123456789abcdef\n", 5,
       "expected a list of identities (e.g. [app1, app2]), got a map"},
      {"allowed_peers empty",
       vol + "    path: /p\n    allowed_peers: []\n    secret: 0123456789abcdef\n", 4,
       "the list is empty"},
      {"bad identity",
       vol + "    path: /p\n    allowed_peers:\n      - ok\n      - 'a b'\n    secret: "
             "0123456789abcdef\n",
       6, "allowed_peers[1]: identity 'a b' contains a character"},
      {"duplicate identity",
       vol + "    path: /p\n    allowed_peers: [a, a]\n    secret: 0123456789abcdef\n", 4,
       "identity 'a' is listed twice"},
      {"no secret", vol + "    path: /p\n    allowed_peers: [a]\n", 2,
       "missing required key 'secret_file' (or 'secret')"},
      {"both secrets",
       vol + "    path: /p\n    allowed_peers: [a]\n    secret: 0123456789abcdef\n    secret_file: "
             "/s\n",
       6, "give either 'secret' or 'secret_file', not both"},
      {"short secret", vol + "    path: /p\n    allowed_peers: [a]\n    secret: short\n", 5,
       "volumes[0].secret: too short (5 characters); use at least 16"},
      {"relative secret_file",
       vol + "    path: /p\n    allowed_peers: [a]\n    secret_file: s.key\n", 5,
       "not an absolute path"},
      {"missing secret_file",
       vol + "    path: /p\n    allowed_peers: [a]\n    secret_file: /nonexistent/pmirror.secret\n",
       5, "cannot open secret file /nonexistent/pmirror.secret"},
      {"bad apm", vol + "    path: /p\n" + rest + "    apm: maybe\n", 6,
       "'maybe' is not one of auto, on, off"},
  };
}

// The line the message's first "<config>:LINE:COL:" names, or 0.
int first_line(const std::string& message) {
  const std::string prefix = "<config>:";
  if (message.rfind(prefix, 0) != 0) return 0;
  return std::atoi(message.c_str() + prefix.size());
}

TEST(ConfigTest, BadConfigsAreRejectedWithPosition) {
  auto cases = bad_configs();
  ASSERT_GE(cases.size(), 25u);
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.what) + ":\n" + c.yaml);
    auto config = parse_daemon_config(c.yaml);
    ASSERT_FALSE(config.ok());
    const Status& status = config.status();
    EXPECT_EQ(status.code(), Errc::kConfigError);
    EXPECT_NE(status.message().find(c.fragment), std::string::npos) << status.message();
    EXPECT_EQ(first_line(status.message()), c.line) << status.message();
    if (c.line != 0) {
      // 1-based column present: "<config>:L:C: ..."
      EXPECT_NE(status.message().find("<config>:" + std::to_string(c.line) + ":"),
                std::string::npos);
    }
  }
}

TEST(ConfigTest, ReportsEveryErrorAtOnce) {
  std::string text =
      "daemon:\n"
      "  port: 0\n"         // 2
      "  transport: udp\n"  // 3
      "volumes:\n"
      "  - name: 'bad name'\n"   // 5
      "    path: relative\n"     // 6
      "    size: 1.5G\n"         // 7
      "    allowed_peers: []\n"  // 8
      "    secret: short\n";     // 9
  auto config = parse_daemon_config(text, "multi.yaml");
  ASSERT_FALSE(config.ok());
  std::vector<std::string> lines;
  std::istringstream in(config.status().message());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 7u) << config.status().message();
  EXPECT_EQ(lines[0].rfind("multi.yaml:2:9: daemon.port", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("multi.yaml:3:14: daemon.transport", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("multi.yaml:5:11: volumes[0].name", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("multi.yaml:6:11: volumes[0].path", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4].rfind("multi.yaml:7:11: volumes[0].size", 0), 0u) << lines[4];
  EXPECT_EQ(lines[5].rfind("multi.yaml:8:20: volumes[0].allowed_peers", 0), 0u) << lines[5];
  EXPECT_EQ(lines[6].rfind("multi.yaml:9:13: volumes[0].secret", 0), 0u) << lines[6];
}

TEST(ConfigTest, ParseSizeAcceptsUnits) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"1", 1},
      {"4096", 4096},
      {"4096B", 4096},
      {"1K", 1024},
      {"1k", 1024},
      {"1KB", 1024},
      {"1KiB", 1024},
      {"64M", 64ull << 20},
      {"64MiB", 64ull << 20},
      {"64 MiB", 64ull << 20},
      {"1G", 1ull << 30},
      {"1GB", 1ull << 30},
      {"3GiB", 3ull << 30},
      {"2T", 2ull << 40},
      {"2TiB", 2ull << 40},
      {"16777215T", 16777215ull << 40},  // largest whole-TiB count that fits
      {"18446744073709551615", UINT64_MAX},
  };
  for (const auto& c : cases) {
    auto size = parse_size(c.text);
    ASSERT_TRUE(size.ok()) << c.text << ": " << size.status().to_string();
    EXPECT_EQ(*size, c.bytes) << c.text;
  }
}

TEST(ConfigTest, ParseSizeRejectsJunk) {
  struct Case {
    const char* text;
    const char* fragment;
  };
  const Case cases[] = {
      {"", "empty"},
      {"-1", "negative"},
      {"-1G", "negative"},
      {"+5", "without a sign"},
      {"1.5G", "fractions"},
      {"0.5", "fractions"},
      {"1,5G", "fractions"},
      {"0", "greater than zero"},
      {"0G", "greater than zero"},
      {"G", "expected a number"},
      {"abc", "expected a number"},
      {"10X", "unknown unit 'X'"},
      {"10GiBs", "unknown unit"},
      {"10Gb", "unknown unit"},
      {"10ib", "unknown unit"},
      {"10 ", "trailing spaces"},
      {"1 2", "unknown unit"},
      {"0x10", "unknown unit"},
      {"16777216T", "too large"},
      {"18446744073709551616", "too large"},
      {"99999999999999999999999G", "too large"},
  };
  for (const auto& c : cases) {
    auto size = parse_size(c.text);
    ASSERT_FALSE(size.ok()) << "'" << c.text << "' parsed as " << *size;
    EXPECT_NE(size.status().message().find(c.fragment), std::string::npos)
        << "'" << c.text << "': " << size.status().message();
  }
}

// A config whose only volume reads its secret from `path`.
std::string with_secret_file(const std::string& path) {
  return "volumes:\n"
         "  - name: v\n"
         "    path: /pmem/v\n"
         "    allowed_peers: [app]\n"
         "    secret_file: " +
         path + "\n";
}

TEST(ConfigTest, SecretFileIsReadAndOneNewlineStripped) {
  TempDir dir;
  struct Case {
    std::string contents;
    std::string secret;
  };
  const Case cases[] = {
      {"0123456789abcdef", "0123456789abcdef"},
      {"0123456789abcdef\n", "0123456789abcdef"},
      {"0123456789abcdef\n\n", "0123456789abcdef\n"},  // only one newline is stripped
      {std::string(4096, 'x'), std::string(4096, 'x')},
  };
  for (const auto& c : cases) {
    std::string path = dir.write("secret", c.contents, 0600);
    auto config = parse_daemon_config(with_secret_file(path));
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    EXPECT_EQ(config->volumes[0].secret, c.secret);
  }
  // 0400 is fine too: only group/other bits are refused.
  std::string readonly = dir.write("readonly", kSecret, 0400);
  EXPECT_TRUE(parse_daemon_config(with_secret_file(readonly)).ok());
}

TEST(ConfigTest, SecretFileProblemsAreReported) {
  TempDir dir;
  struct Case {
    const char* what;
    std::string path;
    const char* fragment;
  };
  const Case cases[] = {
      {"group readable", dir.write("g", kSecret, 0640), "has mode 0640"},
      {"world readable", dir.write("o", kSecret, 0604), "chmod 600"},
      {"group writable", dir.write("gw", kSecret, 0620), "lets group or others access it"},
      {"empty", dir.write("empty", "", 0600), "is empty"},
      {"only a newline", dir.write("newline", "\n", 0600), "is empty"},
      {"too large", dir.write("large", std::string(4097, 'x'), 0600), "at most 4096 bytes"},
      {"too short", dir.write("short", "abc\n", 0600), "too short (3 characters)"},
      {"directory", dir.path().string(), "not a regular file"},
      {"missing", (dir.path() / "absent").string(), "No such file or directory"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto config = parse_daemon_config(with_secret_file(c.path));
    ASSERT_FALSE(config.ok());
    const std::string& message = config.status().message();
    EXPECT_EQ(config.status().code(), Errc::kConfigError);
    EXPECT_EQ(message.rfind("<config>:5:18: volumes[0].secret_file: ", 0), 0u) << message;
    EXPECT_NE(message.find(c.fragment), std::string::npos) << message;
    EXPECT_NE(message.find(c.path), std::string::npos) << message;
  }
}

TEST(ConfigTest, UnreadableSecretFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempDir dir;
  std::string path = dir.write("noread", kSecret, 0200);
  auto config = parse_daemon_config(with_secret_file(path));
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("Permission denied"), std::string::npos)
      << config.status().message();
}

TEST(ConfigTest, LoadReadsFileAndNamesItInErrors) {
  TempDir dir;
  std::string good = dir.write("good.yaml", kVolume);
  auto config = load_daemon_config(good);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->volumes.size(), 1u);

  std::string bad = dir.write("bad.yaml", "daemon:\n  port: 0\n" + kVolume);
  config = load_daemon_config(bad);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message().rfind(bad + ":2:9: daemon.port", 0), 0u)
      << config.status().message();

  std::string missing = (dir.path() / "missing.yaml").string();
  config = load_daemon_config(missing);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), Errc::kConfigError);
  EXPECT_NE(config.status().message().find(missing), std::string::npos);
  EXPECT_NE(config.status().message().find("No such file or directory"), std::string::npos);

  config = load_daemon_config(dir.path().string());
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("is a directory"), std::string::npos)
      << config.status().message();
}

// The shipped example must stay valid. Its secret_file paths (/etc/pmirror/)
// do not exist here, so point them at temp files with the right mode.
TEST(ConfigTest, ExampleFileParses) {
  std::ifstream in(PMIRROR_EXAMPLE_CONFIG);
  ASSERT_TRUE(in) << PMIRROR_EXAMPLE_CONFIG;
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();

  TempDir dir;
  dir.write("db0.secret", "db0-secret-0123456789\n");
  dir.write("log0.secret", "log0-secret-0123456789\n");
  const std::string from = "/etc/pmirror/";
  const std::string to = dir.path().string() + "/";
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }

  auto config = parse_daemon_config(text, PMIRROR_EXAMPLE_CONFIG);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->transport, transport::Kind::kRdma);
  EXPECT_EQ(config->port, 7450);
  ASSERT_EQ(config->volumes.size(), 2u);
  EXPECT_EQ(config->volumes[0].name, "db0");
  EXPECT_EQ(config->volumes[0].path, "/dev/dax0.0");
  EXPECT_EQ(config->volumes[0].size, 0u);
  EXPECT_EQ(config->volumes[0].secret, "db0-secret-0123456789");
  EXPECT_EQ(config->volumes[0].apm, ApmPolicy::kAuto);
  EXPECT_EQ(config->volumes[1].name, "log0");
  EXPECT_TRUE(config->volumes[1].create);
  EXPECT_EQ(config->volumes[1].size, 256ull << 20);
  EXPECT_EQ(config->volumes[1].secret, "log0-secret-0123456789");
  EXPECT_EQ(config->volumes[1].apm, ApmPolicy::kOff);
}

}  // namespace
}  // namespace pmirror::config
