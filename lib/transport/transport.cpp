// The seam's entry points: each asks the registry which implementation
// serves a kind. No implementation is named here.
#include "transport/transport.h"

#include "transport/registry.h"

namespace pmirror::transport {

std::string_view opcode_name(Opcode op) {
  switch (op) {
    case Opcode::kWrite:
      return "write";
    case Opcode::kRead:
      return "read";
    case Opcode::kSend:
      return "send";
    case Opcode::kRecv:
      return "recv";
  }
  return "unknown";
}

Result<Capabilities> capabilities(Kind kind) {
  PMIRROR_ASSIGN_OR_RETURN(auto provider, Registry::instance().find(kind));
  return provider->capabilities;
}

Result<Kind> kind_for_name(std::string_view name) {
  for (const KindInfo& info : kKinds) {
    if (info.configurable || info.name != name) continue;
    if (Registry::instance().find(info.kind).ok()) return info.kind;
  }
  return parse_kind(name);
}

Result<std::unique_ptr<Listener>> listen(Kind kind, const std::string& address, uint16_t port,
                                         const ConnectionOptions& options,
                                         const AdmissionOptions& admission) {
  PMIRROR_ASSIGN_OR_RETURN(auto provider, Registry::instance().find(kind));
  return provider->listen(address, port, options, admission);
}

Result<std::unique_ptr<Connection>> connect(Kind kind, const std::string& address, uint16_t port,
                                            const ConnectionOptions& options) {
  PMIRROR_ASSIGN_OR_RETURN(auto provider, Registry::instance().find(kind));
  return provider->connect(address, port, options);
}

}  // namespace pmirror::transport
