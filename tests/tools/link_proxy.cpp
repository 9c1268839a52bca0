// pmirror-link-proxy: a TCP forwarder that cuts the link on demand as 100%
// packet loss would (tests/support/link_proxy.h): nothing is closed, nothing
// flows, until the link is restored.
//
//   pmirror-link-proxy LISTEN_HOST:PORT TARGET_HOST:PORT
//
// Prints "listening on HOST:PORT". Control: lines on stdin ("cut" or
// "drop": blackhole; "restore" or "pass": forward again; "stats"), or
// SIGUSR1 (cut) / SIGUSR2 (restore). Each change prints "state cut" or
// "state forwarding". SIGTERM/SIGINT end it.
#include "support/link_proxy.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>

namespace {

volatile std::sig_atomic_t g_request = 0;  // 1 cut, 2 restore, 3 stop
void on_signal(int sig) { g_request = sig == SIGUSR1 ? 1 : sig == SIGUSR2 ? 2 : 3; }

bool split(const std::string& text, std::string& host, uint16_t& port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  host = text.substr(0, colon);
  try {
    int p = std::stoi(text.substr(colon + 1));
    if (p < 0 || p > 65535) return false;
    port = static_cast<uint16_t>(p);
  } catch (...) {
    return false;
  }
  return true;
}

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen_host, target_host;
  uint16_t listen_port = 0, target_port = 0;
  if (argc != 3 || !split(argv[1], listen_host, listen_port) ||
      !split(argv[2], target_host, target_port)) {
    std::fprintf(stderr, "usage: %s LISTEN_HOST:PORT TARGET_HOST:PORT\n", argv[0]);
    return 2;
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  for (int sig : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT}) sigaction(sig, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  std::string error;
  auto proxy = pmirror::testing::LinkProxy::start(listen_host, listen_port, target_host,
                                                  target_port, &error);
  if (!proxy) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  say("listening on " + listen_host + ":" + std::to_string(proxy->port()));
  bool stdin_open = true;
  std::string line;
  auto apply = [&](bool cut) {
    proxy->set_blackhole(cut);
    say(cut ? "state cut" : "state forwarding");
  };
  while (true) {
    int request = g_request;
    g_request = 0;
    if (request == 3) break;
    if (request == 1) apply(true);
    if (request == 2) apply(false);
    pollfd fd{0, POLLIN, 0};
    if (!stdin_open || ::poll(&fd, 1, 100) <= 0) {
      if (!stdin_open) ::usleep(100000);
      continue;
    }
    char c;
    ssize_t n = ::read(0, &c, 1);
    if (n <= 0) {
      stdin_open = false;
      continue;
    }
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line == "cut" || line == "drop") {
      apply(true);
    } else if (line == "restore" || line == "pass") {
      apply(false);
    } else if (line == "stats") {
      say("accepted " + std::to_string(proxy->connections_accepted()) + " open " +
          std::to_string(proxy->open_connections()) + " forwarded " +
          std::to_string(proxy->bytes_forwarded()));
    } else if (!line.empty()) {
      say("unknown command '" + line + "' (cut, restore, stats)");
    }
    line.clear();
  }
  return 0;
}
