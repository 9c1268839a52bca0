// transport::listen/connect with Kind::kFake: the process-wide FakeFabric
// they reach (docs/transport-fake.md, "Running the real daemon and library
// over it"). For tests only (library pmirror_transport_fake, which no
// production target links); parse_kind never yields kFake. Installing a
// fabric registers the fake transport in the registry (registry.h);
// uninstalling it unregisters it.
//
//   auto fabric = fake::FakeFabric::create();
//   fake::ScopedFabric installed(fabric);  // until the end of the scope
//   // pmirror::target::Target with DaemonConfig{.listen_address = "target",
//   //   .transport = Kind::kFake} listens on fabric node "target";
//   // pmirror::Volume with ReplicaSpec{"target", target->port(), "fake"}
//   //   connects to it from node "initiator".
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

// Makes `fabric` the one Kind::kFake reaches (replacing any other) and
// registers the fake transport; connections it makes come from node
// `connect_from`. nullptr uninstalls (and unregisters). The fake registers
// the capabilities of rdma (a Read does not flush on any backing), so that a
// target over it offers APM only where `apm:` says or on pmem, and a test
// chooses the method with `apm:`.
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

// While installed, transport::listen(Kind::kFake, address, port, options)
// is a listener named `address` (also the node its accepted connections
// belong to), reporting `port` (a fabric counter when 0); and
// transport::connect(Kind::kFake, address, port, options) connects to the
// listener `address` from the installed node, where a non-zero `port` must
// be that listener's (kConnectionError otherwise, as a wrong port would be).
// Nothing installed: kFailedPrecondition (the registry's "not registered").

// FakeFabric::mark_durable on the installed fabric; nothing when none is.
// For a test that routes the owner's own persists (the target's
// pmem_msync/pmem_persist on a GPSPM PersistRequest) to the fabric.
void owner_persisted(const void* addr, size_t len);

}  // namespace pmirror::transport::fake
