// pmirror-promoter: automatic failover with etcd leases on one node
// (docs/failover.md, section 2). Thin: flags, the cluster file, a Promoter
// (lib/failover), its status on <runtime dir>/promoter.sock, and SIGTERM,
// which hands the node's volumes over.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "common/log.h"
#include "config/config.h"
#include "control/control.h"
#include "defaults.h"
#include "failover/failover.h"
#include "systemd/systemd.h"

namespace {

constexpr int kExitConfig = 2;
constexpr int kExitStart = 3;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "pmirror-promoter: holds a volume's etcd lease on the node that is its primary, and takes "
      "over (promote, fence, start the application) when the primary's lease runs out"};
  std::string config_path = pmirror::kDefaultClusterFile;
  std::string node;
  std::string socket;
  std::string log_level;
  bool foreground = false;
  app.add_option("-c,--config", config_path, "the cluster configuration file")
      ->capture_default_str();
  app.add_option("-n,--node", node,
                 "which node of the cluster this is (default: the node named like this host)");
  app.add_option("--socket", socket,
                 "pmirrord's control socket (default: the node's daemon.control_socket)");
  app.add_flag("-f,--foreground", foreground, "log for a terminal (time stamps, colour)");
  app.add_option("-l,--log-level", log_level, "trace|debug|info|warn|error|critical|off");
  app.set_version_flag("-V,--version", "pmirror-promoter " PMIRROR_VERSION_STRING);
  CLI11_PARSE(app, argc, argv);

  std::shared_ptr<spdlog::logger> console;
  if (!foreground && pmirror::systemd::stderr_is_journal()) {
    console = std::make_shared<spdlog::logger>("pmirror-promoter",
                                               pmirror::systemd::journal_sink("pmirror-promoter"));
    console->set_pattern("%v");
  } else {
    console = spdlog::stderr_color_mt("pmirror-promoter");
    console->set_pattern(foreground ? "%Y-%m-%d %H:%M:%S.%e %^%l%$ %v" : "%l: %v");
  }
  spdlog::set_default_logger(console);
  pmirror::log::set(console);
  if (!log_level.empty()) {
    auto level = pmirror::log::parse_level(log_level);
    if (!level) {
      std::fprintf(stderr, "pmirror-promoter: --log-level %s: not a level\n", log_level.c_str());
      return kExitConfig;
    }
    pmirror::log::set_level(*level);
  }

  auto cluster = pmirror::config::load_cluster_config(config_path);
  if (!cluster.ok()) {
    std::fprintf(stderr, "pmirror-promoter: %s\n", cluster.status().message().c_str());
    return kExitConfig;
  }
  auto me = pmirror::config::resolve_node(*cluster, node);
  if (!me.ok()) {
    std::fprintf(stderr, "pmirror-promoter: %s\n", me.status().message().c_str());
    return kExitConfig;
  }
  const pmirror::config::NodeConfig* this_node = cluster->find_node(*me);
  std::string daemon_socket = socket.empty() ? this_node->daemon.control_socket : socket;
  // Lease changes go out on the status socket's event stream (pmirrorctl
  // events) once the socket exists.
  std::atomic<pmirror::control::Server*> events{nullptr};
  auto promoter =
      pmirror::failover::Promoter::create({.cluster = std::move(*cluster),
                                           .node = *me,
                                           .pmirrord_socket = socket,
                                           .on_event = [&events](const nlohmann::json& event) {
                                             if (auto* server = events.load())
                                               server->publish(event);
                                           }});
  if (!promoter.ok()) {
    std::fprintf(stderr, "pmirror-promoter: %s\n", promoter.status().message().c_str());
    return promoter.status().code() == pmirror::Errc::kConfigError ? kExitConfig : kExitStart;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  // Its status beside pmirrord's socket (pmirrord.sock ->
  // pmirrord.promoter.sock), for pmirrorctl and the tests.
  std::string status_socket = pmirror::control::promoter_socket_path(daemon_socket);
  auto* p = promoter->get();
  auto server = pmirror::control::Server::start(
      status_socket, [p](const nlohmann::json& request) -> pmirror::Result<nlohmann::json> {
        if (request.is_object() && request.value("command", nlohmann::json()) == "status") {
          return p->status();
        }
        return pmirror::control::unknown_command(request);
      });
  if (!server.ok()) {
    spdlog::warn("no status socket: {}", server.status().message());
  } else {
    events.store(server->get());
  }

  std::jthread loop([p](std::stop_token stop) {
    pmirror::Status s = p->run(stop);
    if (!s.ok()) spdlog::error("{}", s.message());
  });
  int received = 0;
  while (sigwait(&signals, &received) != 0) {
  }
  spdlog::info("signal {}: handing over", received);
  loop.request_stop();
  loop.join();
  return 0;
}
