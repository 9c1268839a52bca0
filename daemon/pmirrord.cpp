// pmirrord: the target daemon. Thin: parse flags, load the config, start a
// Target, serve until SIGTERM/SIGINT. It never forks; systemd (or the
// shell) supervises it.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>
#include <vector>

#include "common/fault.h"
#include "common/log.h"
#include "common/rfc3339.h"
#include "common/thread_name.h"
#include "config/config.h"
#include "control/control.h"
#include "defaults.h"
#include "metrics/metrics.h"
#include "supervisor/supervisor.h"
#include "systemd/private_tmp.h"
#include "systemd/systemd.h"
#include "target/serve_lock.h"
#include "target/target.h"

namespace {

constexpr int kExitConfig = 2;
constexpr int kExitStart = 3;

bool apply_log_level(const std::string& name) {
  auto level = pmirror::log::parse_level(name);
  if (!level) return false;
  pmirror::log::set_level(*level);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pmirrord: serves pmem volumes to pmirror initiators (the replication target)"};
  std::string config_path = pmirror::kDefaultClusterFile;
  bool foreground = false;
  std::string log_level;
  bool check_only = false;
  std::string node;
  app.add_option("-c,--config", config_path, "the cluster configuration file")
      ->capture_default_str();
  app.add_option("-n,--node", node,
                 "which node of the cluster this is (default: the node named like this host)");
  app.add_flag("-f,--foreground", foreground,
               "log for a terminal (time stamps, colour); without it logs suit journald");
  app.add_option("-l,--log-level", log_level,
                 "trace|debug|info|warn|error|critical|off (overrides the config file)");
  app.add_flag("--check-config", check_only,
               "validate the configuration, and this host's paths as a start would (creating and "
               "locking nothing), and exit");
  app.set_version_flag("-V,--version", "pmirrord " PMIRROR_VERSION_STRING);
  CLI11_PARSE(app, argc, argv);

  // Started by systemd: straight to the journal, each line with its
  // priority (`journalctl -p warning -u pmirrord`). Otherwise stderr; a
  // terminal (--foreground) gets time stamps and colour.
  std::shared_ptr<spdlog::logger> console;
  if (!foreground && pmirror::systemd::stderr_is_journal()) {
    console =
        std::make_shared<spdlog::logger>("pmirrord", pmirror::systemd::journal_sink("pmirrord"));
    console->set_pattern("%v");
  } else {
    console = spdlog::stderr_color_mt("pmirrord");
    // Under a supervisor that stamps lines itself, keep them short.
    console->set_pattern(foreground ? "%Y-%m-%d %H:%M:%S.%e %^%l%$ %v" : "%l: %v");
  }
  spdlog::set_default_logger(console);
  pmirror::log::set(console);  // what lib/ logs goes there too

  // Every problem is printed, one per line; exit 2 on any of them.
  auto config_error = [](const pmirror::Status& status) {
    std::fprintf(stderr, "pmirrord: %s\n", status.message().c_str());
    return kExitConfig;
  };
  auto cluster = pmirror::config::load_cluster_config(config_path);
  if (!cluster.ok()) return config_error(cluster.status());
  auto self = pmirror::config::resolve_node(*cluster, node);
  if (!self.ok()) return config_error(self.status());
  auto loaded = pmirror::config::daemon_config_for(*cluster, *self);
  if (!loaded.ok()) return config_error(loaded.status());
  const pmirror::config::DaemonConfig& config = *loaded;
  if (!apply_log_level(log_level.empty() ? config.log_level : log_level)) {
    std::fprintf(
        stderr,
        "pmirrord: --log-level %s: not a level (trace|debug|info|warn|error|critical|off)\n",
        log_level.c_str());
    return kExitConfig;
  }
  if (check_only) {
    // What the start would refuse on this host, in its words: the state
    // pool's and the volumes' paths, and a copy another pmirrord serves
    // (looked at, not locked). Every problem, one per line.
    std::vector<pmirror::Status> refusals{
        pmirror::config::check_state_pool_path(config.state_pool)};
    for (const auto& volume : config.volumes) {
      refusals.push_back(pmirror::config::check_volume_paths(volume, config.node));
      refusals.push_back(pmirror::target::check_not_served_elsewhere(volume.name, volume.path));
    }
    int code = 0;
    for (const auto& refusal : refusals) {
      if (!refusal.ok()) code = config_error(refusal);
    }
    if (code != 0) return code;
    std::printf("%s: OK (node %s, replica of %zu volume(s))\n", config_path.c_str(),
                config.node.c_str(), config.volumes.size());
    return 0;
  }
  if (config.volumes.empty()) {
    spdlog::warn("node {} is a replica of no volume in {}; listening without serving any",
                 config.node, config_path);
  }
  // A path under /tmp while systemd's PrivateTmp= is on (the unit's
  // default) is private to this run and deleted at its stop: said, not
  // refused (systemd/private_tmp.h says why).
  std::vector<pmirror::systemd::NamedPath> own_paths{{"the state pool", config.state_pool}};
  for (const auto& volume : config.volumes) {
    own_paths.push_back({"volume " + volume.name, volume.path});
    own_paths.push_back({"volume " + volume.name + "'s metadata", volume.metadata_path});
  }
  for (const std::string& warning : pmirror::systemd::private_tmp_warnings(own_paths)) {
    spdlog::warn("{}", warning);
  }

  // Signals are taken by a dedicated thread with sigwait, so that stop()
  // runs in ordinary context rather than in a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // A SIGBUS on a volume's mapping (a truncated backing file, a media error)
  // fails that volume instead of every volume this daemon serves: the
  // places that touch a mapping are guarded (common/fault.h). Installed
  // here, in the program: libpmirror never takes an application's signals.
  if (pmirror::Status installed = pmirror::fault::install_fault_handler(); !installed.ok()) {
    spdlog::critical("{}", installed.message());
    return kExitStart;
  }

  // Session state changes go to `pmirrorctl events` subscribers. The
  // control server starts after the target, so the sink looks it up.
  std::atomic<pmirror::control::Server*> control_server{nullptr};
  pmirror::target::TargetOptions target_options;
  // Initiators ping every heartbeat_interval while idle and give up on a
  // replica after heartbeat_timeout. The target waits twice that: a live
  // initiator may spend a whole heartbeat_timeout waiting on another
  // replica before it writes to this one again.
  target_options.session_timeout = 2 * config.heartbeat_timeout;
  target_options.handshake_timeout = config.handshake_timeout;
  target_options.max_unauthenticated = config.max_unauthenticated;
  target_options.max_unauthenticated_per_source = config.max_unauthenticated_per_source;
  target_options.on_event = [&control_server, &config](const pmirror::supervisor::StateChange& c) {
    spdlog::info("volume {}: peer {}: {} -> {}{}{}", c.volume, c.peer,
                 pmirror::supervisor::state_name(c.from), pmirror::supervisor::state_name(c.to),
                 c.reason.empty() ? "" : ": ", c.reason);
    if (auto* server = control_server.load()) {
      server->publish({{"time", pmirror::format_rfc3339(c.time)},
                       {"process", "pmirrord"},
                       {"node", config.node},
                       {"volume", c.volume},
                       {"peer", c.peer},
                       {"from", pmirror::supervisor::state_name(c.from)},
                       {"to", pmirror::supervisor::state_name(c.to)},
                       {"reason", c.reason}});
    }
  };
  auto target = pmirror::target::Target::start(config, target_options);
  if (!target.ok()) {
    spdlog::critical("{}", target.status().message());
    return kExitStart;
  }
  // A reload (SIGHUP, or `pmirrorctl reload` on the control socket): the
  // file read again, this node's part checked, then applied -- or with
  // dry_run only compared. One at a time.
  std::mutex reload_mutex;
  auto reload = [&](bool dry_run) -> pmirror::Result<pmirror::target::ReloadResult> {
    std::lock_guard lock(reload_mutex);
    spdlog::info("{}reloading {}", dry_run ? "dry run: " : "", config_path);
    auto reloaded = [&]() -> pmirror::Result<pmirror::target::ReloadResult> {
      auto next_cluster = pmirror::config::load_cluster_config(config_path);
      if (!next_cluster.ok()) return next_cluster.status();
      auto next = pmirror::config::daemon_config_for(*next_cluster, config.node);
      if (!next.ok()) return next.status();
      return (*target)->reload(*next, dry_run);
    }();
    if (!reloaded.ok()) {
      spdlog::error("{}reload rejected, the running configuration stays: {}",
                    dry_run ? "dry run: " : "", reloaded.status().message());
    }
    return reloaded;
  };
  // STATUS= for systemd; set once everything runs, then `ready` (a reload
  // on the control socket before that tells systemd nothing).
  std::function<std::string()> service_status;
  std::atomic<bool> ready{false};

  auto server = pmirror::control::Server::start(
      config.control_socket,
      [&target, &reload, &service_status,
       &ready](const nlohmann::json& request) -> pmirror::Result<nlohmann::json> {
        const std::string command = request.value("command", "");
        if (command == "status") return pmirror::target::to_json((*target)->status());
        if (command == "reload") {
          auto dry_run = request.find("dry_run");
          if (dry_run != request.end() && !dry_run->is_boolean()) {
            return pmirror::Status(pmirror::Errc::kInvalidArgument,
                                   "reload: \"dry_run\" must be true or false");
          }
          const bool dry = dry_run != request.end() && dry_run->get<bool>();
          if (!dry && ready.load()) pmirror::systemd::notify_reloading();
          auto reloaded = reload(dry);
          if (!dry && ready.load()) {
            pmirror::systemd::notify_ready(reloaded.ok() ? service_status()
                                                         : "reload rejected (see the log); " +
                                                               service_status());
          }
          if (!reloaded.ok()) return reloaded.status();
          return pmirror::target::to_json(*reloaded);
        }
        if (command == "down" || command == "up") {
          auto volume = request.find("volume");
          if (volume == request.end() || !volume->is_string() ||
              volume->get<std::string>().empty()) {
            return pmirror::Status(pmirror::Errc::kInvalidArgument,
                                   command + " needs \"volume\": the volume's name");
          }
          auto switched = (*target)->set_down(volume->get<std::string>(), command == "down");
          if (!switched.ok()) return switched.status();
          return pmirror::target::to_json(*switched);
        }
        if (command == "promote" || command == "demote") {
          auto volume = request.find("volume");
          if (volume == request.end() || !volume->is_string() ||
              volume->get<std::string>().empty()) {
            return pmirror::Status(pmirror::Errc::kInvalidArgument,
                                   command + " needs \"volume\": the volume's name");
          }
          if (command == "demote") {
            auto demoted = (*target)->demote(volume->get<std::string>());
            if (!demoted.ok()) return demoted.status();
            return pmirror::target::to_json(*demoted);
          }
          auto force = request.find("force");
          if (force != request.end() && !force->is_boolean()) {
            return pmirror::Status(pmirror::Errc::kInvalidArgument,
                                   "promote: \"force\" must be true or false");
          }
          bool forced = force != request.end() && force->get<bool>();
          // How long to wait for the fences' first answers (the promoter's
          // takeover); absent: as long as they take.
          std::optional<std::chrono::milliseconds> fence_wait;
          if (auto wait = request.find("fence_wait_ms"); wait != request.end()) {
            if (!wait->is_number_unsigned() || wait->get<uint64_t>() > 3'600'000) {
              return pmirror::Status(pmirror::Errc::kInvalidArgument,
                                     "promote: \"fence_wait_ms\" must be a whole number of "
                                     "milliseconds from 0 to 3600000");
            }
            fence_wait = std::chrono::milliseconds(wait->get<uint64_t>());
          }
          auto promoted = (*target)->promote(volume->get<std::string>(), forced, fence_wait);
          if (!promoted.ok()) return promoted.status();
          return pmirror::target::to_json(*promoted);
        }
        return pmirror::control::unknown_command(request);
      });
  if (!server.ok()) {
    spdlog::critical("control socket: {}", server.status().message());
    return kExitStart;
  }
  control_server = server->get();

  // Prometheus endpoint, only when the config asks for one.
  std::unique_ptr<pmirror::metrics::Exporter> exporter;
  if (config.metrics) {
    // Both sides of this node: the copies pmirrord serves and the volumes
    // that applications here have open as primary (their control sockets).
    // And the node's pmirror-promoter, where one runs: its leases.
    const std::string promoter_socket =
        pmirror::control::promoter_socket_path(config.control_socket);
    // Each application's volumes once per host, however many pmirrords run on it.
    auto local_primaries =
        std::make_shared<pmirror::control::LocalPrimaries>(pmirror::control::runtime_dir());
    auto started = pmirror::metrics::Exporter::start(
        config.metrics->to_string(), [&target, promoter_socket, local_primaries] {
          nlohmann::json snapshot = local_primaries->add_to(
              pmirror::target::to_json((*target)->status()), std::chrono::seconds(1));
          auto promoter = pmirror::control::request(promoter_socket, {{"command", "status"}},
                                                    std::chrono::seconds(1));
          if (promoter.ok() && snapshot.is_object()) snapshot["promoter"] = std::move(*promoter);
          return snapshot;
        });
    if (!started.ok()) {
      spdlog::critical("{}", started.status().message());
      return kExitStart;
    }
    exporter = std::move(*started);
  }

  // systemd (Type=notify): ready once the volumes are mapped and every
  // socket listens; a one-line STATUS=; watchdog pings while alive.
  service_status = [&] {
    return "node " + config.node + ": serving " +
           std::to_string((*target)->status().volumes.size()) + " volume(s) on port " +
           std::to_string((*target)->port()) +
           (exporter ? ", metrics on " + exporter->address() : "");
  };
  ready.store(true);
  pmirror::systemd::notify_ready(service_status());
  pmirror::systemd::WatchdogPinger watchdog;

  // SIGHUP reloads the configuration; SIGTERM/SIGINT stop.
  std::thread signal_thread;
  auto signal_loop = [&] {
    for (;;) {
      int received = 0;
      if (sigwait(&signals, &received) != 0) continue;
      if (received != SIGHUP) {
        spdlog::info("signal {}: shutting down", received);
        pmirror::systemd::notify_stopping();
        (*target)->stop();
        return;
      }
      spdlog::info("SIGHUP");
      pmirror::systemd::notify_reloading();
      auto reloaded = reload(/*dry_run=*/false);
      pmirror::systemd::notify_ready(
          reloaded.ok() ? service_status() : "reload rejected (see the log); " + service_status());
    }
  };
  try {
    signal_thread = std::thread([&signal_loop] {
      pmirror::name_this_thread("pmirrord-signal");
      signal_loop();
    });
  } catch (const std::system_error& e) {
    spdlog::critical("cannot start the signal thread: {} (is the task limit, TasksMax=, too low?)",
                     e.what());
    return kExitStart;
  }

  pmirror::Status served = (*target)->run();
  control_server = nullptr;
  server->reset();
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
