// The application hook (application.h).
#include "failover/application.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/unique_fd.h"

namespace pmirror::failover {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// What a wait status says, for messages: "exited with 3", "was killed by
// signal 9".
std::string describe_status(int wstatus) {
  if (WIFEXITED(wstatus)) return "exited with " + std::to_string(WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) return "was killed by signal " + std::to_string(WTERMSIG(wstatus));
  return "ended (wait status " + std::to_string(wstatus) + ")";
}

std::string seconds_since(Clock::time_point since) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s",
                std::chrono::duration<double>(Clock::now() - since).count());
  return text;
}

// The environment a hook runs with: the promoter's, `extra` added or
// replacing. Built before fork: the promoter has threads, and between fork
// and exec the child may only call async-signal-safe functions.
class HookEnvironment {
 public:
  explicit HookEnvironment(const std::map<std::string, std::string>& extra) {
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry(*e);
      const std::string name = entry.substr(0, entry.find('='));
      if (!extra.contains(name)) entries_.push_back(std::move(entry));
    }
    for (const auto& [name, value] : extra) entries_.push_back(name + "=" + value);
    for (auto& entry : entries_) pointers_.push_back(entry.data());
    pointers_.push_back(nullptr);
  }
  char* const* envp() const { return pointers_.data(); }

 private:
  std::vector<std::string> entries_;
  std::vector<char*> pointers_;
};

// In the child: /bin/sh -c COMMAND.
[[noreturn]] void exec_shell(const std::string& command, const HookEnvironment& env) {
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  ::execve("/bin/sh", const_cast<char* const*>(argv), env.envp());
  ::_exit(127);
}

}  // namespace

Status run_command(const std::string& command, const std::map<std::string, std::string>& env,
                   milliseconds timeout, std::string* output) {
  int pipe_fds[2] = {-1, -1};
  if (output != nullptr && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return errno_status(Errc::kIoError, "a pipe for `" + command + "`", errno);
  }
  UniqueFd read_end(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);
  const HookEnvironment environment(env);
  pid_t pid = ::fork();
  if (pid < 0) return errno_status(Errc::kIoError, "fork for `" + command + "`", errno);
  if (pid == 0) {
    if (write_end.valid()) ::dup2(write_end.get(), STDOUT_FILENO);
    exec_shell(command, environment);
  }
  write_end.reset();
  const auto deadline = Clock::now() + timeout;
  int wstatus = 0;
  while (true) {
    if (read_end.valid()) {
      pollfd p{.fd = read_end.get(), .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 20) > 0) {
        char buffer[512];
        ssize_t n = ::read(read_end.get(), buffer, sizeof buffer);
        if (n > 0 && output->size() < 65536) output->append(buffer, static_cast<size_t>(n));
        if (n == 0) read_end.reset();
      }
    } else {
      std::this_thread::sleep_for(milliseconds(20));
    }
    pid_t done = ::waitpid(pid, &wstatus, WNOHANG);
    if (done == pid) break;
    if (done < 0) return errno_status(Errc::kIoError, "waiting for `" + command + "`", errno);
    if (Clock::now() > deadline) {
      return Status(Errc::kTimeout, "`" + command + "` still runs after " +
                                        std::to_string(timeout.count() / 1000) +
                                        " s; left running");
    }
  }
  // What it wrote before it exited and the pipe held.
  while (read_end.valid()) {
    char buffer[512];
    ssize_t n = ::read(read_end.get(), buffer, sizeof buffer);
    if (n <= 0) break;
    if (output->size() < 65536) output->append(buffer, static_cast<size_t>(n));
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return Status::Ok();
  return Status(Errc::kFailedPrecondition, "`" + command + "` " + describe_status(wstatus));
}

ApplicationHook::ApplicationHook(config::VolumeFailover hook,
                                 std::map<std::string, std::string> env, milliseconds stop_grace)
    : hook_(std::move(hook)), env_(std::move(env)), stop_grace_(stop_grace) {}

ApplicationHook::~ApplicationHook() {
  // Only a start_command's process is ours to end; a unit outlives the
  // promoter's object as systemd's.
  if (pid_ > 0) {
    signal_group(SIGKILL);
    std::string ignored;
    reap(/*block=*/true, kStopGrace, &ignored);
  }
}

std::string ApplicationHook::describe() const {
  if (!hook_.hook_unit.empty()) return "unit " + hook_.hook_unit;
  return "start_command `" + hook_.start_command + "`";
}

Status ApplicationHook::start() {
  if (!hook_.hook_unit.empty()) {
    PMIRROR_RETURN_IF_ERROR(
        run_command("systemctl start " + hook_.hook_unit, env_, kCommandTimeout));
    unit_started_ = true;
    since_ = Clock::now();
    next_unit_check_ = since_ + kUnitCheckInterval;
    return Status::Ok();
  }
  if (hook_.start_command.empty()) return Status::Ok();
  if (pid_ > 0) stop();  // one application per volume and node
  const pid_t parent = ::getpid();
  const HookEnvironment environment(env_);
  pid_t pid = ::fork();
  if (pid < 0) return errno_status(Errc::kIoError, "fork for the application", errno);
  if (pid == 0) {
    // A group of its own: the stop signals reach what the shell started.
    ::setpgid(0, 0);
    // The promoter gone (killed, crashed), its application goes too: the
    // lease it wrote under is no longer renewed by anyone.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);
    exec_shell(hook_.start_command, environment);
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first
  pid_ = pid;
  since_ = Clock::now();
  return Status::Ok();
}

bool ApplicationHook::reap(bool block, milliseconds wait, std::string* why) {
  const auto deadline = Clock::now() + wait;
  while (true) {
    int wstatus = 0;
    pid_t done = ::waitpid(pid_, &wstatus, WNOHANG);
    if (done == pid_ || (done < 0 && errno == ECHILD)) {
      *why = done == pid_ ? describe_status(wstatus) : "is no longer a child of the promoter";
      pid_ = 0;
      return true;
    }
    if (!block || Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

void ApplicationHook::signal_group(int sig) const {
  if (pid_ > 0) ::kill(-pid_, sig);
}

std::optional<std::string> ApplicationHook::gone() {
  if (pid_ > 0) {
    std::string how;
    const pid_t group = pid_;
    if (!reap(/*block=*/false, milliseconds(0), &how)) return std::nullopt;
    // The application is the command's process tree: what it started in
    // the background goes with it.
    ::kill(-group, SIGKILL);
    std::string why =
        "the application (" + describe() + ") " + how + " after " + seconds_since(since_);
    if (how == "exited with 0" && Clock::now() - since_ < std::chrono::seconds(5)) {
      why +=
          " (start_command runs the application in the foreground; one that starts it in "
          "the background and returns counts as an application that ended: "
          "pmirror-cluster.yaml(5))";
    }
    return why;
  }
  if (unit_started_ && Clock::now() >= next_unit_check_) {
    next_unit_check_ = Clock::now() + kUnitCheckInterval;
    std::string state;
    // is-active prints the state and exits non-zero for all but active.
    (void)run_command("systemctl is-active " + hook_.hook_unit, env_, kCommandTimeout, &state);
    while (!state.empty() && (state.back() == '\n' || state.back() == ' ')) state.pop_back();
    // Starting, restarting and reloading still count as running: systemd
    // is bringing it back by the unit's own Restart= policy.
    if (state == "active" || state == "activating" || state == "reloading" ||
        state == "deactivating") {
      return std::nullopt;
    }
    unit_started_ = false;
    return "the application (" + describe() + ") is " + (state.empty() ? "unknown" : state) +
           " after " + seconds_since(since_);
  }
  return std::nullopt;
}

void ApplicationHook::stop() {
  if (!hook_.hook_unit.empty()) {
    unit_started_ = false;
    Status s = run_command("systemctl stop " + hook_.hook_unit, env_, kCommandTimeout);
    if (!s.ok()) log::error("stopping the application: {}", s.message());
    return;
  }
  if (pid_ <= 0) {
    // Nothing of ours runs (it exited, or another promoter started it):
    // the stop_command, if any, still gets its say.
    if (!hook_.stop_command.empty()) {
      Status s = run_command(hook_.stop_command, env_, kCommandTimeout);
      if (!s.ok()) log::error("stopping the application: {}", s.message());
    }
    return;
  }
  const pid_t group = pid_;
  std::string how;
  if (!hook_.stop_command.empty()) {
    auto env = env_;
    env["PMIRROR_APP_PID"] = std::to_string(group);
    Status s = run_command(hook_.stop_command, env, kCommandTimeout);
    if (!s.ok()) log::error("stopping the application: {}", s.message());
    if (reap(/*block=*/true, stop_grace_, &how)) {
      ::kill(-group, SIGKILL);  // what it left behind in its group
      return;
    }
  }
  signal_group(SIGTERM);
  if (!reap(/*block=*/true, stop_grace_, &how)) {
    log::warn("the application ({}, pid {}) still runs {} s after SIGTERM: SIGKILL", describe(),
              group, stop_grace_.count() / 1000);
    signal_group(SIGKILL);
    reap(/*block=*/true, stop_grace_, &how);
  }
  ::kill(-group, SIGKILL);  // what it left behind in its group
}

}  // namespace pmirror::failover
