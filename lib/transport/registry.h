// The transport registry: which implementation serves each Kind in this
// process, as rdma-core's providers plug in through a table of operations.
// The built-in transports register themselves from one place
// (register_built_transports in kind.h) the first time the registry is
// used; the tests' fake fabric registers while a test installs one
// (fake/fake_transport.h). Code above the seam reaches a transport only
// through transport.h (listen, connect, capabilities): it asks what a
// transport guarantees, never which one it is.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "transport/kind.h"
#include "transport/transport.h"

namespace pmirror::transport {

// One implementation of the seam.
struct Provider {
  Kind kind = Kind::kTcp;
  Capabilities capabilities;
  std::function<Result<std::unique_ptr<Listener>>(const std::string& address, uint16_t port,
                                                  const ConnectionOptions& options,
                                                  const AdmissionOptions& admission)>
      listen;
  std::function<Result<std::unique_ptr<Connection>>(const std::string& address, uint16_t port,
                                                    const ConnectionOptions& options)>
      connect;
};

class Registry {
 public:
  // The process's registry, with the built-in transports registered.
  static Registry& instance();

  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Makes `provider` the one serving its kind (replacing any other).
  void add(Provider provider);
  // Unregisters `kind`; what it created stays valid.
  void remove(Kind kind);
  // The provider of `kind`, or why there is none: kUnsupported for a kind
  // this build left out, kFailedPrecondition for one nothing registered
  // (the fake fabric outside a test that installed it).
  Result<std::shared_ptr<const Provider>> find(Kind kind) const;

 private:
  mutable std::mutex mutex_;
  std::array<std::shared_ptr<const Provider>, kKinds.size()> providers_;  // guarded by mutex_
};

}  // namespace pmirror::transport
