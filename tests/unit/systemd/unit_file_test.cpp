// systemd/pmirrord.service passes `systemd-analyze verify` without a single
// warning (a build-tree copy whose ExecStart= is the built pmirrord), and
// keeps the settings docs/operations.md promises.
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string analyze_binary() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(std::string(path ? path : "") + ":/usr/bin:/bin:/usr/sbin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/systemd-analyze";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// Runs `systemd-analyze verify unit`; returns the exit status, output in `out`.
// --man=no: the Documentation= man pages are not installed for a build tree
// (install_layout and scripts/package-test.sh verify the installed unit
// with them).
int verify(const std::string& analyze, const std::string& unit, std::string& out) {
  std::string command = "'" + analyze + "' verify --man=no '" + unit + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[1024];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(UnitFileTest, VerifiesWithoutWarnings) {
  std::string analyze = analyze_binary();
  if (analyze.empty()) {
    GTEST_SKIP() << "systemd-analyze not found (Debian package `systemd`; "
                    "scripts/install-deps.sh installs it): unit not verified";
  }
  std::string out;
  int status = verify(analyze, PMIRROR_UNIT_FILE, out);
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out, "") << "systemd-analyze verify " << PMIRROR_UNIT_FILE << " warns:\n" << out;
}

TEST(UnitFileTest, TheCheckCatchesAMistake) {
  // Proves the test above would notice: an unknown setting is reported.
  std::string analyze = analyze_binary();
  if (analyze.empty()) GTEST_SKIP() << "systemd-analyze not found";
  auto dir = std::filesystem::temp_directory_path() / ("pmirror-unit-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string broken = (dir / "pmirrord-broken.service").string();
  std::string text = read_text(PMIRROR_UNIT_FILE);
  auto at = text.find("\n[Service]\n");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + 11, "WatchdogSecs=30s\n");
  std::ofstream(broken) << text;
  std::string out;
  verify(analyze, broken, out);
  std::filesystem::remove_all(dir);
  EXPECT_NE(out.find("WatchdogSecs"), std::string::npos) << out;
}

TEST(UnitFileTest, HasTheDocumentedSettings) {
  std::string text = read_text(PMIRROR_UNIT_SOURCE);
  for (const char* line :
       {"Type=notify\n", "ExecStart=/usr/sbin/pmirrord --config /etc/pmirror/cluster.yaml\n",
        "ExecReload=/usr/sbin/pmirrorctl reload\n", "Restart=on-failure\n", "LimitMEMLOCK=infinity\n",
        "RuntimeDirectory=pmirror\n", "StateDirectory=pmirror\n", "ProtectSystem=strict\n",
        "ProtectHome=yes\n", "PrivateTmp=yes\n", "NoNewPrivileges=yes\n",
        "CapabilityBoundingSet=CAP_IPC_LOCK\n",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_IB\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line;
  }
  EXPECT_NE(text.find("WatchdogSec="), std::string::npos);
  EXPECT_NE(text.find("DeviceAllow=char-dax rw"), std::string::npos);
  EXPECT_NE(text.find("DeviceAllow=/dev/infiniband/rdma_cm rw"), std::string::npos);
  EXPECT_NE(read_text(PMIRROR_TMPFILES_SOURCE).find("\nd /run/pmirror 0755 root root -\n"),
            std::string::npos);
}

// The promoter gets the hardening its hooks can live with (docs/operations.md,
// "pmirror-promoter.service"), and none of the settings that would reach the
// application a start_command starts: a private /tmp, a closed device list
// (ProtectClock= implies one), no new privileges, capabilities or families.
TEST(UnitFileTest, ThePromoterHasTheHardeningItsHooksAllow) {
  std::string text = read_text(PMIRROR_PROMOTER_UNIT_SOURCE);
  ASSERT_NE(text.find("ExecStart=/usr/sbin/pmirror-promoter"), std::string::npos);
  for (const char* line :
       {"ProtectSystem=full\n", "ProtectKernelTunables=yes\n", "ProtectKernelModules=yes\n",
        "ProtectKernelLogs=yes\n", "ProtectControlGroups=yes\n", "ProtectHostname=yes\n",
        "RestrictSUIDSGID=yes\n", "LockPersonality=yes\n", "RuntimeDirectory=pmirror\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line;
  }
  for (const char* setting :
       {"\nPrivateTmp=", "\nProtectHome=", "\nPrivateDevices=", "\nDevicePolicy=", "\nDeviceAllow=",
        "\nProtectClock=", "\nNoNewPrivileges=", "\nCapabilityBoundingSet=",
        "\nRestrictAddressFamilies=", "\nRestrictNamespaces=", "\nRestrictRealtime=",
        "\nSystemCallArchitectures=", "\nProtectSystem=strict"}) {
    EXPECT_EQ(text.find(setting), std::string::npos) << "would reach the hooks: " << setting + 1;
  }
}

}  // namespace
