// What pmirrord does with its configuration, as a real process: a refused
// start leaves no state pool behind; a file shared by two uses refuses the
// start and the reload; a reload that changes allowed_peers ends only the
// session whose identity lost access. And libpmirror refuses names the
// protocol cannot carry before it connects.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "initiator/initiator.h"
#include "support/daemon_process.h"

namespace pmirror {
namespace {

using namespace std::chrono_literals;
using initiator::Volume;
using initiator::VolumeOptions;
using testing::DaemonProcess;
using testing::TempDir;
using testing::VolumeSpec;

constexpr uint64_t kSize = 1ull << 20;
constexpr const char* kSecret = "correct horse battery staple";  // VolumeSpec's default

// Polls until pred() holds (true) or the deadline passes (false); the
// deadline only guards against a hang.
bool eventually(const std::function<bool()>& pred, std::chrono::seconds limit = 20s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from << " not in:\n" << text;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// `pmirrorctl ARGS`: exit status and what it printed (stdout, stderr).
struct CtlRun {
  int code = -1;
  std::string out, err;
};
CtlRun run_pmirrorctl(const TempDir& tmp, const std::string& args) {
  const std::string out_path = tmp.file("ctl.out"), err_path = tmp.file("ctl.err");
  const std::string command = PMIRRORCTL_PATH " " + args + " >" + out_path + " 2>" + err_path;
  int status = std::system(command.c_str());
  return CtlRun{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out_path),
                read_text(err_path)};
}

// What a refused start said: its "critical: " line.
std::string start_refusal(const std::string& output) {
  const std::string marker = "critical: ";
  size_t at = output.find(marker);
  if (at == std::string::npos) return "";
  at += marker.size();
  return output.substr(at, output.find('\n', at) - at);
}

class ConfigDaemonTest : public ::testing::Test {
 protected:
  std::string dir() const { return tmp_.path().string(); }
  std::string pool() const { return tmp_.file("pmirrord.state"); }

  // The writer: identity `identity`, the one replica of volume "v".
  Result<std::unique_ptr<Volume>> open_writer(const DaemonProcess& daemon,
                                              const std::string& identity = "app") {
    VolumeOptions options;
    options.name = "v";
    options.local_path = tmp_.file("local.img");
    options.size = kSize;
    options.create = true;
    options.identity = identity;
    options.reconnect_initial = 100ms;
    options.reconnect_max = 400ms;
    options.replicas.push_back({"127.0.0.1", daemon.port(), "tcp", kSecret, ""});
    return Volume::open(options);
  }

  // Rewrites the daemon's config with `edit`, sends SIGHUP and waits for the
  // reload's outcome in the log ("configuration reloaded" or "reload
  // rejected"); returns the log written since.
  std::string reload(DaemonProcess& daemon, const std::function<std::string(std::string)>& edit) {
    write_text(daemon.config_path(), edit(read_text(daemon.config_path())));
    size_t from = daemon.log().size();
    ::kill(daemon.pid(), SIGHUP);
    std::string since;
    EXPECT_TRUE(eventually([&] {
      since = daemon.log().substr(from);
      return since.find("configuration reloaded") != std::string::npos ||
             since.find("reload rejected") != std::string::npos;
    })) << daemon.log();
    return since;
  }

  TempDir tmp_;
};

TEST_F(ConfigDaemonTest, ARefusedStartLeavesNoStatePoolItCreated) {
  // The volume's folder does not exist: the start is refused after the
  // state pool was created.
  DaemonProcess refused(dir(), {VolumeSpec{"v", tmp_.file("missing/v.img"), kSize}});
  ASSERT_FALSE(refused.start()) << refused.log();
  EXPECT_NE(refused.log().find("volume 'v'"), std::string::npos) << refused.log();
  EXPECT_FALSE(std::filesystem::exists(pool())) << "the refused start left " << pool();

  // A pool that was there before a refused start stays.
  DaemonProcess good(dir(), {VolumeSpec{"v", tmp_.file("v.img"), kSize}});
  ASSERT_TRUE(good.start()) << good.log();
  EXPECT_EQ(good.terminate(), 0) << good.log();
  ASSERT_TRUE(std::filesystem::exists(pool()));
  const auto size = std::filesystem::file_size(pool());
  ASSERT_FALSE(refused.start()) << refused.log();
  ASSERT_TRUE(std::filesystem::exists(pool())) << "a refused start removed an existing pool";
  EXPECT_EQ(std::filesystem::file_size(pool()), size);
}

TEST_F(ConfigDaemonTest, AVolumeOnTheStatePoolIsRefusedAtStart) {
  // Before: the pool was mapped as a volume too, and pmirrord aborted.
  DaemonProcess daemon(dir(), {VolumeSpec{"v", pool(), kSize}});
  ASSERT_FALSE(daemon.start()) << daemon.log();
  const std::string log = daemon.log();
  EXPECT_NE(log.find("volumes[0].paths.target: the copy of volume 'v' on node 'target', " + pool() +
                     ", and the state pool of node 'target', " + pool()),
            std::string::npos)
      << log;
  EXPECT_FALSE(std::filesystem::exists(pool()));
}

TEST_F(ConfigDaemonTest, AReloadAddingAVolumeLinkedToAnotherIsRefused) {
  const std::string v = tmp_.file("v.img");
  DaemonProcess daemon(dir(), {VolumeSpec{"v", v, kSize}});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto writer = open_writer(daemon);
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  ASSERT_TRUE((*writer)->write(0, "before", 6).ok());

  const std::string w = tmp_.file("w.img");
  ASSERT_EQ(::symlink(v.c_str(), w.c_str()), 0);
  std::string since = reload(daemon, [&](std::string text) {
    return text + "  - name: w\n    size: " + std::to_string(kSize) +
           "\n    primary: app\n    replicas: [target]\n    paths: {app: " +
           tmp_.file("app-w.img") + ", target: " + w +
           "}\n    allowed_peers: [app]\n    secret: \"" + kSecret + "\"\n";
  });
  EXPECT_NE(since.find("reload rejected"), std::string::npos) << since;
  EXPECT_NE(since.find("the copy of volume 'w' on node 'target', " + w +
                       ", and the copy of volume 'v' on node 'target', " + v),
            std::string::npos)
      << since;
  // The running configuration stays: v is still served.
  EXPECT_TRUE((*writer)->write(100, "after", 5).ok());
  writer->reset();
  EXPECT_TRUE(testing::read_file(v) == testing::read_file(tmp_.file("local.img")));
}

// `pmirrorctl reload`: what SIGHUP does, with the outcome where the
// operator (and `systemctl reload`) sees it.
TEST_F(ConfigDaemonTest, PmirrorctlReloadSaysWhatChangedAndFailsWhenRejected) {
  const std::string v = tmp_.file("v.img");
  DaemonProcess daemon(dir(), {VolumeSpec{"v", v, kSize}});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const std::string original = read_text(daemon.config_path());
  auto with_volume_w = [&](const std::string& path) {
    return original + "  - name: w\n    size: " + std::to_string(kSize) +
           "\n    primary: app\n    replicas: [target]\n    create: true\n    paths: {app: " +
           tmp_.file("app-w.img") + ", target: " + path +
           "}\n    metadata: {target: " + tmp_.file("target-w.pmirror") +
           "}\n    allowed_peers: [app]\n    secret: \"" + kSecret + "\"\n";
  };
  auto ctl = [&](const std::string& args) {
    return run_pmirrorctl(tmp_, "--socket " + dir() + "/pmirrord.sock " + args);
  };

  const std::string w = tmp_.file("w.img");
  write_text(daemon.config_path(), with_volume_w(w));
  CtlRun dry = ctl("reload --dry-run");
  EXPECT_EQ(dry.code, 0) << dry.err;
  EXPECT_EQ(dry.out, "a reload would add w; change none; remove none\n");
  EXPECT_FALSE(std::filesystem::exists(w)) << "a dry run opens nothing";

  CtlRun applied = ctl("reload");
  EXPECT_EQ(applied.code, 0) << applied.err << daemon.log();
  EXPECT_EQ(applied.out, "reloaded: added w; changed none; removed none\n");
  EXPECT_TRUE(std::filesystem::exists(w)) << daemon.log();

  // w on v's file: refused, and said so with pmirrord's reasons.
  ASSERT_EQ(::unlink(w.c_str()), 0);
  ASSERT_EQ(::symlink(v.c_str(), w.c_str()), 0);
  write_text(daemon.config_path(), with_volume_w(w));
  for (const char* args : {"reload --dry-run", "reload"}) {
    CtlRun rejected = ctl(args);
    EXPECT_EQ(rejected.code, 2) << args << ": " << rejected.out << rejected.err;
    EXPECT_TRUE(rejected.out.empty()) << rejected.out;
    EXPECT_NE(rejected.err.find("the running configuration stays"), std::string::npos)
        << rejected.err;
    EXPECT_NE(rejected.err.find("and the copy of volume 'v' on node 'target', " + v),
              std::string::npos)
        << rejected.err;
  }

  // Back to v alone: w is removed.
  write_text(daemon.config_path(), original);
  CtlRun removed = ctl("reload --json");
  EXPECT_EQ(removed.code, 0) << removed.err;
  EXPECT_EQ(nlohmann::json::parse(removed.out, nullptr, false),
            nlohmann::json::parse(R"({"dry_run":false,"added":[],"changed":[],"removed":["w"]})"));
}

TEST_F(ConfigDaemonTest, AReloadAddingAnIdentityKeepsTheWritersSession) {
  const std::string v = tmp_.file("v.img");
  DaemonProcess daemon(dir(), {VolumeSpec{"v", v, kSize}});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto writer = open_writer(daemon);
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  for (int i = 0; i < 100; ++i) {
    std::string record = "record " + std::to_string(i);
    ASSERT_TRUE((*writer)->write(i * 512, record.data(), record.size()).ok());
  }

  std::string since = reload(daemon, [](std::string text) {
    return replaced(text, "allowed_peers: [app]", "allowed_peers: [app, app2]");
  });
  EXPECT_NE(since.find("configuration reloaded"), std::string::npos) << since;
  EXPECT_NE(since.find("volume v: allowed_peers now app, app2"), std::string::npos) << since;

  // The writer goes on in the same session.
  for (int i = 100; i < 200; ++i) {
    std::string record = "record " + std::to_string(i);
    ASSERT_TRUE((*writer)->write(i * 512, record.data(), record.size()).ok()) << daemon.log();
  }
  const std::string log = daemon.log();
  EXPECT_EQ(count(log, "volume v: session open"), 1u) << log;
  EXPECT_EQ(count(log, "session closed"), 0u) << log;
  writer->reset();
  EXPECT_TRUE(testing::read_file(v) == testing::read_file(tmp_.file("local.img")))
      << "every record must be on the replica";

  // The new identity may open the volume at once.
  auto second = open_writer(daemon, "app2");
  ASSERT_TRUE(second.ok()) << second.status().to_string() << daemon.log();
  EXPECT_TRUE((*second)->write(0, "app2", 4).ok());
}

TEST_F(ConfigDaemonTest, AReloadRemovingTheWritersIdentityEndsItsSession) {
  DaemonProcess daemon(dir(), {VolumeSpec{"v", tmp_.file("v.img"), kSize}});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto writer = open_writer(daemon);
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  ASSERT_TRUE((*writer)->write(0, "before", 6).ok());

  reload(daemon, [](std::string text) {
    return replaced(text, "allowed_peers: [app]", "allowed_peers: [app2]");
  });
  const std::string reason = "access of 'app' to volume 'v' was removed by a configuration reload";
  ASSERT_TRUE(eventually([&] {
    return daemon.log().find("session closed at sequence") != std::string::npos;
  })) << daemon.log();
  const std::string log = daemon.log();
  const size_t closed = log.find("session closed at sequence");
  ASSERT_NE(closed, std::string::npos) << log;
  const std::string line = log.substr(closed, log.find('\n', closed) - closed);
  EXPECT_NE(line.find(": " + reason), std::string::npos) << log;
  EXPECT_EQ(log.find("volume removed"), std::string::npos) << log;
  // Its one replica gone (and refusing it now), the writer's persists fail.
  EXPECT_TRUE(eventually([&] { return !(*writer)->write(0, "after", 5).ok(); }, 60s));
}

// Issue 24: a second pmirrord with its own port, control socket and state
// pool served the copy the first one served. One pmirrord serves a copy, by
// its identity (the inode), whichever path names it.
TEST_F(ConfigDaemonTest, ASecondDaemonOnTheSameCopyIsRefusedNamingTheFirst) {
  const std::string v = tmp_.file("v.img");
  DaemonProcess first(dir(), {VolumeSpec{"v", v, kSize}});
  ASSERT_TRUE(first.start()) << first.log();
  auto writer = open_writer(first);
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  ASSERT_TRUE((*writer)->write(0, "before", 6).ok());
  const std::string served_by =
      " is already served by another pmirrord (pid " + std::to_string(first.pid()) + ": " +
      testing::daemon_binary() + " --config " + first.config_path() +
      " --node target --foreground); a copy is served by one pmirrord at a time";

  TempDir other;
  const std::string hard_link = other.file("hard.img"), symlink = other.file("soft.img");
  ASSERT_EQ(::link(v.c_str(), hard_link.c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(::symlink(v.c_str(), symlink.c_str()), 0) << std::strerror(errno);
  for (const std::string& path : {v, hard_link, symlink}) {
    // Its own port, socket, state pool and metadata pool: only the copy is shared.
    DaemonProcess second(other.path().string(), {VolumeSpec{"v", path, kSize}});
    EXPECT_FALSE(second.start()) << second.log();
    const std::string refusal = "volume 'v': its copy " + path + served_by;
    EXPECT_NE(second.log().find(refusal), std::string::npos) << second.log();
    std::string output;
    EXPECT_EQ(
        testing::run_daemon_to_exit({"--config", second.config_path(), "--node", "target"}, output),
        3)
        << output;
    EXPECT_EQ(start_refusal(output), refusal) << output;
    // The check says so too (and takes no lock).
    output.clear();
    EXPECT_EQ(testing::run_daemon_to_exit(
                  {"--config", second.config_path(), "--node", "target", "--check-config"}, output),
              2)
        << output;
    EXPECT_NE(output.find("pmirrord: " + refusal + "\n"), std::string::npos) << output;
  }

  // A reload that adds the copy, under another name, to a daemon serving
  // another volume: that volume is refused, the reload rejected, and the
  // daemon goes on serving what it served.
  DaemonProcess second(other.path().string(), {VolumeSpec{"x", other.file("x.img"), kSize}});
  ASSERT_TRUE(second.start()) << second.log();
  const std::string with_w =
      read_text(second.config_path()) + "  - name: w\n    size: " + std::to_string(kSize) +
      "\n    primary: app\n    replicas: [target]\n    paths: {app: " + other.file("app-w.img") +
      ", target: " + symlink + "}\n    allowed_peers: [app]\n    secret: \"" + kSecret + "\"\n";
  write_text(second.config_path(), with_w);
  const std::string refusal = "volume 'w': its copy " + symlink + served_by;
  for (const char* args : {"reload --dry-run", "reload"}) {
    CtlRun rejected = run_pmirrorctl(tmp_, "--socket " + other.file("pmirrord.sock") + " " + args);
    EXPECT_EQ(rejected.code, 2) << args << ": " << rejected.out << rejected.err;
    EXPECT_NE(rejected.err.find(refusal), std::string::npos) << args << ": " << rejected.err;
  }
  CtlRun status = run_pmirrorctl(tmp_, "--socket " + other.file("pmirrord.sock") + " status");
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_NE(status.out.find("x"), std::string::npos) << status.out;
  EXPECT_TRUE(second.running());

  // The first daemon served throughout: a record written now arrives.
  ASSERT_TRUE((*writer)->write(512, "after", 5).ok()) << first.log();
  writer->reset();
  EXPECT_TRUE(testing::read_file(v) == testing::read_file(tmp_.file("local.img")));
  EXPECT_EQ(first.terminate(), 0) << first.log();
  // Once the first has gone, the copy may be served by another.
  DaemonProcess after(other.path().string(), {VolumeSpec{"v", hard_link, kSize}});
  EXPECT_EQ(second.terminate(), 0) << second.log();
  EXPECT_TRUE(after.start()) << after.log();
}

// Issue 24: a path in a directory that does not exist passed the checks,
// then the start refused it. The checks refuse what the start refuses, in
// its words: a volume's directory, the state pool's directory.
TEST_F(ConfigDaemonTest, TheChecksRefuseWhatTheStartRefusesWithItsMessage) {
  struct Case {
    std::string what;
    std::function<std::string(std::string)> edit;  // of a good config
    std::string message;
  };
  const std::string missing = tmp_.file("missing");
  const std::vector<Case> cases = {
      {"a volume's directory",
       [&](std::string text) {
         return replaced(text, "target: " + tmp_.file("v.img"), "target: " + missing + "/v.img");
       },
       "directory " + missing + " for volume 'v' (" + missing +
           "/v.img) does not exist; create it (mkdir -p " + missing + ")"},
      {"the state pool's directory",
       [&](std::string text) {
         return replaced(text, "state_pool: " + pool(),
                         "state_pool: " + missing + "/pmirrord.state");
       },
       "opening the state pool: directory " + missing + " for state pool " + missing +
           "/pmirrord.state does not exist; create it (mkdir -p " + missing + ")"},
  };
  DaemonProcess daemon(dir(), {VolumeSpec{"v", tmp_.file("v.img"), kSize}});
  ASSERT_TRUE(daemon.start()) << daemon.log();  // writes the good config
  EXPECT_EQ(daemon.terminate(), 0);
  const std::string good = read_text(daemon.config_path());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    write_text(daemon.config_path(), c.edit(good));
    std::string output;
    EXPECT_EQ(
        testing::run_daemon_to_exit({"--config", daemon.config_path(), "--node", "target"}, output),
        3)
        << output;
    EXPECT_EQ(start_refusal(output), c.message) << output;

    output.clear();
    EXPECT_EQ(testing::run_daemon_to_exit(
                  {"--config", daemon.config_path(), "--node", "target", "--check-config"}, output),
              2)
        << output;
    EXPECT_NE(output.find("pmirrord: " + c.message + "\n"), std::string::npos) << output;

    CtlRun checked = run_pmirrorctl(tmp_, "config check --node target " + daemon.config_path());
    EXPECT_EQ(checked.code, 2) << checked.out << checked.err;
    EXPECT_NE((checked.out + checked.err).find(": " + c.message + "\n"), std::string::npos)
        << checked.out << checked.err;
  }
  EXPECT_FALSE(std::filesystem::exists(missing)) << "a check creates nothing";
}

TEST(VolumeOpenTest, RefusesNamesTheProtocolCannotCarry) {
  TempDir tmp;
  VolumeOptions options;
  options.name = "v";
  options.local_path = tmp.file("local.img");
  options.size = kSize;
  options.create = true;
  options.identity = std::string(80, 'i');
  options.replicas.push_back({"127.0.0.1", testing::free_port(), "tcp", kSecret, ""});
  auto opened = Volume::open(options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(opened.status().message().find("identity is 80 bytes; the protocol carries 1..64"),
            std::string::npos)
      << opened.status().to_string();
  options.identity = "app\n";
  EXPECT_EQ(Volume::open(options).status().code(), Errc::kInvalidArgument);

  options.identity = "app";
  options.name = std::string(65, 'v');
  opened = Volume::open(options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(opened.status().message().find("volume name is 65 bytes, the limit is 64"),
            std::string::npos)
      << opened.status().to_string();
  EXPECT_FALSE(std::filesystem::exists(options.local_path)) << "refused before anything is made";
}

}  // namespace
}  // namespace pmirror
