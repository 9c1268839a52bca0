// The application hook (lib/failover/application.h): what the promoter
// finds when the application it runs ends, and how it stops it.
#include "failover/application.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include "support/daemon_process.h"

namespace pmirror::failover {
namespace {

using namespace std::chrono_literals;

class ApplicationTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return dir_.file(name); }
  std::string read(const std::string& name) const {
    std::ifstream in(file(name));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // A pid the command wrote to `name`, once it did (10 s at most).
  pid_t pid_in(const std::string& name) const {
    for (int i = 0; i < 500; ++i) {
      std::string text = read(name);
      if (!text.empty() && text.back() == '\n') return static_cast<pid_t>(std::stol(text));
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }
  // What gone() says once it says something (10 s at most).
  std::string wait_gone(ApplicationHook& app) {
    for (int i = 0; i < 500; ++i) {
      if (auto why = app.gone()) return *why;
      std::this_thread::sleep_for(20ms);
    }
    return "(still running)";
  }
  // Running: there, and not a zombie its new parent has yet to reap.
  static bool alive(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto paren = stat.rfind(')');
    return paren != std::string::npos && stat.size() > paren + 2 && stat[paren + 2] != 'Z';
  }

  testing::TempDir dir_;
};

TEST_F(ApplicationTest, AnApplicationThatRunsIsNotGoneAndOneKilledIsWithTheSignal) {
  config::VolumeFailover hook{.start_command = "echo $$ > " + file("pid") + "; exec sleep 600"};
  ApplicationHook app(hook, {{"PMIRROR_VOLUME", "v"}});
  ASSERT_TRUE(app.start().ok());
  const pid_t pid = pid_in("pid");
  ASSERT_GT(pid, 0);
  EXPECT_EQ(app.pid(), pid) << "exec: the shell became the application";
  EXPECT_EQ(::getpgid(pid), pid) << "a process group of its own";
  EXPECT_FALSE(app.gone().has_value());
  ::kill(pid, SIGKILL);
  std::string why = wait_gone(app);
  EXPECT_NE(why.find("the application (start_command `echo"), std::string::npos) << why;
  EXPECT_NE(why.find("was killed by signal 9 after "), std::string::npos) << why;
  EXPECT_EQ(app.pid(), 0);
  EXPECT_FALSE(app.gone().has_value()) << "reported once";
}

TEST_F(ApplicationTest, ACommandThatReturnsAtOnceIsAnApplicationThatEndedAndTakesItsGroup) {
  // The old contract (start in the background and return) is refused
  // loudly: the volume would otherwise be held by nothing.
  config::VolumeFailover hook{.start_command = "sleep 600 & echo $! > " + file("child")};
  ApplicationHook app(hook, {});
  ASSERT_TRUE(app.start().ok());
  const pid_t child = pid_in("child");
  ASSERT_GT(child, 0);
  std::string why = wait_gone(app);
  EXPECT_NE(why.find("exited with 0 after"), std::string::npos) << why;
  EXPECT_NE(why.find("runs the application in the foreground"), std::string::npos) << why;
  // What it left in the background went with its group.
  for (int i = 0; i < 250 && alive(child); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(alive(child));
}

TEST_F(ApplicationTest, TheEnvironmentReachesTheCommandAndAnExitStatusIsSaid) {
  config::VolumeFailover hook{.start_command = "echo \"$PMIRROR_VOLUME $PMIRROR_NODE\" > " +
                                               file("env") + "; sleep 0.2; exit 3"};
  ApplicationHook app(hook, {{"PMIRROR_VOLUME", "db1"}, {"PMIRROR_NODE", "n2"}});
  ASSERT_TRUE(app.start().ok());
  std::string why = wait_gone(app);
  EXPECT_NE(why.find("exited with 3 after"), std::string::npos) << why;
  EXPECT_EQ(why.find("foreground"), std::string::npos) << "not exit 0: no hint" << why;
  EXPECT_EQ(read("env"), "db1 n2\n");
}

TEST_F(ApplicationTest, StopRunsTheStopCommandWithTheGroupsPid) {
  config::VolumeFailover hook{.start_command = "sleep 600 & echo $! > " + file("child") + "; wait",
                              .stop_command = "echo $PMIRROR_APP_PID > " + file("stopped") +
                                              "; kill -TERM -$PMIRROR_APP_PID"};
  ApplicationHook app(hook, {});
  ASSERT_TRUE(app.start().ok());
  const pid_t leader = app.pid();
  const pid_t child = pid_in("child");
  ASSERT_GT(child, 0);
  app.stop();
  EXPECT_EQ(read("stopped"), std::to_string(leader) + "\n");
  EXPECT_EQ(app.pid(), 0);
  EXPECT_FALSE(alive(leader));
  for (int i = 0; i < 250 && alive(child); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(alive(child));
  EXPECT_FALSE(app.gone().has_value()) << "stopped, not ended";
}

TEST_F(ApplicationTest, StopWithoutAStopCommandTermsTheGroupThenKillsWhatIgnoresIt) {
  // The shell ignores SIGTERM (and so does its child): SIGKILL after the
  // grace (10 s in the promoter, 1 s here) ends them.
  config::VolumeFailover hook{.start_command = "trap '' TERM; sh -c \"trap '' TERM; echo \\$$ > " +
                                               file("child") + "; sleep 600\" & wait; wait"};
  ApplicationHook app(hook, {}, 1s);
  ASSERT_TRUE(app.start().ok());
  const pid_t leader = app.pid();
  const pid_t child = pid_in("child");
  ASSERT_GT(child, 0);
  app.stop();
  EXPECT_FALSE(alive(leader));
  for (int i = 0; i < 250 && alive(child); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(alive(child));
}

TEST_F(ApplicationTest, RunCommandCapturesOutputAndSaysHowItEnded) {
  std::string out;
  EXPECT_TRUE(run_command("echo active", {}, 5s, &out).ok());
  EXPECT_EQ(out, "active\n");
  Status failed = run_command("echo failed; exit 3", {}, 5s, &out);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("`echo failed; exit 3` exited with 3"), std::string::npos)
      << failed.message();
  Status slow = run_command("sleep 5", {}, 200ms);
  EXPECT_EQ(slow.code(), Errc::kTimeout);
  EXPECT_NE(slow.message().find("still runs after"), std::string::npos) << slow.message();
}

TEST_F(ApplicationTest, NoHookStartsNothing) {
  ApplicationHook app({}, {});
  EXPECT_FALSE(app.configured());
  EXPECT_TRUE(app.start().ok());
  EXPECT_FALSE(app.gone().has_value());
  app.stop();
}

}  // namespace
}  // namespace pmirror::failover
