// transport::listen/connect with Kind::kFake: the process-wide FakeFabric
// they reach (docs/transport-fake.md, "Running the real daemon and library
// over it"). For tests only; parse_kind never yields kFake.
//
//   auto fabric = fake::FakeFabric::create();
//   fake::ScopedFabric installed(fabric);  // until the end of the scope
//   // pmirror::target::Target with DaemonConfig{.listen_address = "target",
//   //   .transport = Kind::kFake} listens on fabric node "target";
//   // initiator::Volume with ReplicaSpec{"target", target->port(),
//   //   Kind::kFake} connects to it from node "initiator".
//   fabric->crash("target");
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/fake/fake_fabric.h"
#include "transport/transport.h"

namespace pmirror::transport::fake {

// Makes `fabric` the one Kind::kFake reaches (replacing any other);
// connections it makes come from node `connect_from`. nullptr uninstalls.
void install_fabric(std::shared_ptr<FakeFabric> fabric, std::string connect_from = "initiator");
std::shared_ptr<FakeFabric> installed_fabric();

// Installs a fabric for its lifetime, then puts back what was installed
// before. Objects created through it keep the fabric alive.
class ScopedFabric {
 public:
  explicit ScopedFabric(std::shared_ptr<FakeFabric> fabric, std::string connect_from = "initiator");
  ~ScopedFabric();
  ScopedFabric(const ScopedFabric&) = delete;
  ScopedFabric& operator=(const ScopedFabric&) = delete;

 private:
  std::shared_ptr<FakeFabric> previous_;
  std::string previous_from_;
};

// transport::listen(Kind::kFake, address, port, options): a listener named
// `address` (also the node its accepted connections belong to), reporting
// `port` (a fabric counter when 0). kFailedPrecondition when no fabric is
// installed.
Result<std::unique_ptr<Listener>> listen_installed(const std::string& address, uint16_t port,
                                                   const ConnectionOptions& options);
// transport::connect(Kind::kFake, address, port, options): connects to the
// listener `address` from the installed node; a non-zero `port` must be
// that listener's (kConnectionError otherwise, as a wrong port would be).
Result<std::unique_ptr<Connection>> connect_installed(const std::string& address, uint16_t port,
                                                      const ConnectionOptions& options);

// FakeFabric::mark_durable on the installed fabric; nothing when none is.
// For a test that routes the owner's own persists (the target's
// pmem_msync/pmem_persist on a GPSPM PersistRequest) to the fabric.
void owner_persisted(const void* addr, size_t len);

}  // namespace pmirror::transport::fake
