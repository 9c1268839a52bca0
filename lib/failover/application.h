// The application of one volume, as the promoter runs and watches it on
// the node that holds the volume (docs/failover.md, "The application").
//
// Two kinds, from the volume's `failover:` entry:
//  - start_command: the application itself, run with /bin/sh -c in the
//    foreground as the promoter's child, in a process group of its own.
//    Its exit, whatever its status, means the application is gone. It is
//    stopped with stop_command if there is one (PMIRROR_APP_PID names it),
//    then SIGTERM to its group, then SIGKILL after a grace.
//  - hook_unit: `systemctl start UNIT`, then `systemctl is-active UNIT`
//    once a second: inactive or failed means the application is gone.
//
//   ApplicationHook app(volume.failover, env);
//   app.start();
//   if (auto gone = app.gone()) { /* give the volume up: *gone says why */ }
//   app.stop();
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"
#include "config/config.h"

namespace pmirror::failover {

// Runs `command` with /bin/sh -c, `env` added to its environment, and
// waits for it (`timeout` at most: then it is left running). Ok if it
// exited 0; `output`, if given, receives its standard output.
Status run_command(const std::string& command, const std::map<std::string, std::string>& env,
                   std::chrono::milliseconds timeout, std::string* output = nullptr);

class ApplicationHook {
 public:
  // How long a hook command (systemctl, stop_command) may run, and how long
  // a start_command's application has to exit after SIGTERM.
  static constexpr std::chrono::milliseconds kCommandTimeout{30000};
  static constexpr std::chrono::milliseconds kStopGrace{10000};
  // How often a unit is asked whether it still runs.
  static constexpr std::chrono::milliseconds kUnitCheckInterval{1000};

  // `stop_grace`: how long a start_command's application has to exit
  // after its stop_command, and then after SIGTERM, before SIGKILL.
  ApplicationHook(config::VolumeFailover hook, std::map<std::string, std::string> env,
                  std::chrono::milliseconds stop_grace = kStopGrace);
  ~ApplicationHook();  // stops what it started (a start_command's group)
  ApplicationHook(const ApplicationHook&) = delete;
  ApplicationHook& operator=(const ApplicationHook&) = delete;

  // False when the volume has no hook: the promoter only holds the lease.
  bool configured() const { return !hook_.hook_unit.empty() || !hook_.start_command.empty(); }

  // Starts the application. A start_command is running when this returns
  // (its exit is found by gone()); a unit is started and waited for.
  Status start();

  // Why the application started by start() is gone, or nothing while it
  // runs (or when nothing was started). Cheap: call it every round.
  std::optional<std::string> gone();

  // Stops the application if it runs; afterwards gone() reports nothing
  // until the next start(). Errors are logged, not returned: the lease is
  // given up all the same.
  void stop();

  // The start_command's process (its group's leader), or 0.
  pid_t pid() const { return pid_; }
  // What the hook runs, for messages: "start_command `...`" or "unit X".
  std::string describe() const;

 private:
  // Reaps the child if it exited; true if it is gone (the message in `why`).
  bool reap(bool block, std::chrono::milliseconds wait, std::string* why);
  void signal_group(int sig) const;

  config::VolumeFailover hook_;
  std::map<std::string, std::string> env_;
  std::chrono::milliseconds stop_grace_;
  pid_t pid_ = 0;                                // a running start_command
  bool unit_started_ = false;                    // a unit this hook started
  std::chrono::steady_clock::time_point since_;  // when it was started
  std::chrono::steady_clock::time_point next_unit_check_;
};

}  // namespace pmirror::failover
