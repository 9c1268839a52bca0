#include "transport/registry.h"

#include <utility>

namespace pmirror::transport {
namespace {

size_t slot(Kind kind) { return static_cast<size_t>(kind); }

}  // namespace

Registry& Registry::instance() {
  // Never destroyed: connections may outlive main's locals.
  static Registry* const registry = [] {
    auto* r = new Registry;
    register_built_transports(*r);
    return r;
  }();
  return *registry;
}

void Registry::add(Provider provider) {
  const size_t at = slot(provider.kind);
  auto shared = std::make_shared<const Provider>(std::move(provider));
  std::lock_guard lock(mutex_);
  providers_[at] = std::move(shared);
}

void Registry::remove(Kind kind) {
  std::shared_ptr<const Provider> removed;  // released outside the lock
  std::lock_guard lock(mutex_);
  removed = std::move(providers_[slot(kind)]);
}

Result<std::shared_ptr<const Provider>> Registry::find(Kind kind) const {
  {
    std::lock_guard lock(mutex_);
    if (auto provider = providers_[slot(kind)]) return provider;
  }
  const KindInfo& info = kind_info(kind);
  if (!info.built) return Status(Errc::kUnsupported, not_built_reason(info));
  std::string message =
      "transport '" + std::string(info.name) + "' is not registered in this process";
  if (!info.registered_by.empty())
    message += " (it is registered by " + std::string(info.registered_by) + ")";
  return Status(Errc::kFailedPrecondition, message);
}

}  // namespace pmirror::transport
