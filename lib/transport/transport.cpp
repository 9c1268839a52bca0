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
    case Opcode::kFlush:
      return "flush";
    case Opcode::kAtomicWrite:
      return "atomic write";
  }
  return "unknown";
}

// The fallback for transports without a doorbell to save: one post each.
Result<size_t> Connection::post_list(std::span<const WorkRequest> requests) {
  size_t posted = 0;
  for (const WorkRequest& request : requests) {
    if (request.opcode == Opcode::kFlush || request.opcode == Opcode::kAtomicWrite)
      return Status(Errc::kUnsupported, "post_list: " + std::string(opcode_name(request.opcode)) +
                                            " is not offered by this transport (the fabric's "
                                            "persistence verbs: rdma where the device has them)");
    if (request.opcode != Opcode::kSend && request.local == nullptr)
      return Status(Errc::kInvalidArgument,
                    "post_list: a one-sided request without a local region");
    Status status;
    switch (request.opcode) {
      case Opcode::kWrite:
        status = post_write(*request.local, request.local_offset, request.length, request.remote,
                            request.remote_offset, request.wr_id, request.signaled);
        break;
      case Opcode::kRead:
        status = post_read(*request.local, request.local_offset, request.length, request.remote,
                           request.remote_offset, request.wr_id);
        break;
      case Opcode::kSend:
        status = post_send(request.message, request.wr_id);
        break;
      case Opcode::kRecv:
        status =
            Status(Errc::kInvalidArgument, "post_list: a receive is not posted, it is reposted");
        break;
      case Opcode::kFlush:
      case Opcode::kAtomicWrite:
        break;  // refused above
    }
    if (status.code() == Errc::kResourceExhausted) return posted;
    PMIRROR_RETURN_IF_ERROR(status);
    ++posted;
  }
  return posted;
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
