// pmirrord: the target daemon. Thin: parse flags, load the config, start a
// Target, serve until SIGTERM/SIGINT. It never forks; systemd (or the
// shell) supervises it.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <thread>

#include "config/config.h"
#include "target/target.h"

namespace {

constexpr int kExitConfig = 2;
constexpr int kExitStart = 3;

bool apply_log_level(const std::string& name) {
  auto level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") return false;
  spdlog::set_level(level);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pmirrord: serves pmem volumes to pmirror initiators (the replication target)"};
  std::string config_path = "/etc/pmirror/pmirrord.yaml";
  bool foreground = false;
  std::string log_level;
  bool check_only = false;
  app.add_option("-c,--config", config_path, "configuration file")
      ->capture_default_str();
  app.add_flag("-f,--foreground", foreground,
               "log for a terminal (time stamps, colour); without it logs suit journald");
  app.add_option("-l,--log-level", log_level,
                 "trace|debug|info|warn|error|critical|off (overrides the config file)");
  app.add_flag("--check-config", check_only, "validate the configuration and exit");
  app.set_version_flag("-V,--version", "pmirrord " PMIRROR_VERSION);
  CLI11_PARSE(app, argc, argv);

  auto console = spdlog::stderr_color_mt("pmirrord");
  spdlog::set_default_logger(console);
  // journald adds its own time stamps and knows the unit; keep lines short.
  spdlog::set_pattern(foreground ? "%Y-%m-%d %H:%M:%S.%e %^%l%$ %v" : "%l: %v");

  auto loaded = pmirror::config::load_daemon_config(config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "pmirrord: %s\n", loaded.status().message().c_str());
    return kExitConfig;
  }
  const pmirror::config::DaemonConfig& config = *loaded;
  if (!apply_log_level(log_level.empty() ? config.log_level : log_level)) {
    std::fprintf(stderr, "pmirrord: --log-level %s: not a level (trace|debug|info|warn|error|critical|off)\n",
                 log_level.c_str());
    return kExitConfig;
  }
  if (check_only) {
    std::printf("%s: OK (%zu volume(s))\n", config_path.c_str(), config.volumes.size());
    return 0;
  }

  // Signals are taken by a dedicated thread with sigwait, so that stop()
  // runs in ordinary context rather than in a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto target = pmirror::target::Target::start(config);
  if (!target.ok()) {
    spdlog::critical("{}", target.status().message());
    return kExitStart;
  }
  std::thread signal_thread([&signals, &target] {
    int received = 0;
    sigwait(&signals, &received);
    if (received != 0) spdlog::info("signal {}: shutting down", received);
    (*target)->stop();
  });

  pmirror::Status served = (*target)->run();
  // Wake the signal thread if run() ended for another reason.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (!served.ok()) {
    spdlog::critical("{}", served.message());
    return 1;
  }
  spdlog::info("stopped");
  return 0;
}
