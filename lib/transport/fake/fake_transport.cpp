// Kind::kFake dispatch: see fake_transport.h.
#include "transport/fake/fake_transport.h"

#include <mutex>
#include <utility>

namespace pmirror::transport::fake {

namespace {

struct Installed {
  std::mutex mu;
  std::shared_ptr<FakeFabric> fabric;
  std::string from = "initiator";
};

Installed& installed() {
  static Installed* state = new Installed;  // never destroyed: usable at exit
  return *state;
}

std::pair<std::shared_ptr<FakeFabric>, std::string> current() {
  Installed& s = installed();
  std::lock_guard lk(s.mu);
  return {s.fabric, s.from};
}

Status not_installed(std::string_view what) {
  return Status(Errc::kFailedPrecondition,
                std::string(what) +
                    " over transport 'fake': no FakeFabric is installed (the fake transport is "
                    "for tests: fake::install_fabric or fake::ScopedFabric first)");
}

}  // namespace

void install_fabric(std::shared_ptr<FakeFabric> fabric, std::string connect_from) {
  Installed& s = installed();
  std::lock_guard lk(s.mu);
  s.fabric = std::move(fabric);
  s.from = std::move(connect_from);
}

std::shared_ptr<FakeFabric> installed_fabric() { return current().first; }

ScopedFabric::ScopedFabric(std::shared_ptr<FakeFabric> fabric, std::string connect_from) {
  auto [previous, from] = current();
  previous_ = std::move(previous);
  previous_from_ = std::move(from);
  install_fabric(std::move(fabric), std::move(connect_from));
}

ScopedFabric::~ScopedFabric() { install_fabric(std::move(previous_), std::move(previous_from_)); }

Result<std::unique_ptr<Listener>> listen_installed(const std::string& address, uint16_t port,
                                                   const ConnectionOptions& options) {
  auto [fabric, from] = current();
  if (fabric == nullptr) return not_installed("listen on " + address);
  return fabric->listen(address, options, port);
}

Result<std::unique_ptr<Connection>> connect_installed(const std::string& address, uint16_t port,
                                                      const ConnectionOptions& options) {
  auto [fabric, from] = current();
  std::string where = address + ":" + std::to_string(port);
  if (fabric == nullptr) return not_installed("connect to " + where);
  if (port != 0) {
    auto listening = fabric->port_of(address);
    if (listening.ok() && *listening != port)
      return Status(Errc::kConnectionError, "connect to fake:" + where +
                                                ": connection refused (the listener there has "
                                                "port " +
                                                std::to_string(*listening) + ")");
  }
  return fabric->connect(address, options, from);
}

void owner_persisted(const void* addr, size_t len) {
  if (auto fabric = installed_fabric()) fabric->mark_durable(addr, len);
}

}  // namespace pmirror::transport::fake
