// Kind::kFake registration: see fake_transport.h.
#include "transport/fake/fake_transport.h"

#include <mutex>
#include <utility>

#include "transport/registry.h"

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

Result<std::unique_ptr<Connection>> connect_to(const std::shared_ptr<FakeFabric>& fabric,
                                               const std::string& from, const std::string& address,
                                               uint16_t port, const ConnectionOptions& options) {
  if (port != 0) {
    auto listening = fabric->port_of(address);
    if (listening.ok() && *listening != port)
      return Status(Errc::kConnectionError,
                    "connect to fake:" + address + ":" + std::to_string(port) +
                        ": connection refused (the listener there has port " +
                        std::to_string(*listening) + ")");
  }
  return fabric->connect(address, options, from);
}

// The provider serving Kind::kFake with `fabric`, connecting from `from`.
Provider provider_for(std::shared_ptr<FakeFabric> fabric, std::string from) {
  Provider fake;
  fake.kind = Kind::kFake;
  fake.capabilities.read_flushes_writes_on_any_backing = false;  // as rdma: see the header
  fake.capabilities.persists_each_write = true;                   // as tcp
  fake.listen = [fabric](const std::string& address, uint16_t port,
                         const ConnectionOptions& options, const AdmissionOptions&) {
    return fabric->listen(address, options, port);
  };
  fake.connect = [fabric, from](const std::string& address, uint16_t port,
                                const ConnectionOptions& options) {
    return connect_to(fabric, from, address, port, options);
  };
  return fake;
}

}  // namespace

void install_fabric(std::shared_ptr<FakeFabric> fabric, std::string connect_from) {
  Installed& s = installed();
  std::lock_guard lk(s.mu);
  if (fabric != nullptr) {
    Registry::instance().add(provider_for(fabric, connect_from));
  } else {
    Registry::instance().remove(Kind::kFake);
  }
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

void owner_persisted(const void* addr, size_t len) {
  if (auto fabric = installed_fabric()) fabric->mark_durable(addr, len);
}

}  // namespace pmirror::transport::fake
