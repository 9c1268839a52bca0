#include "transport/transport.h"

#include "transport/fake/fake_transport.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace pmirror::transport {

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kTcp:
      return "tcp";
    case Kind::kRdma:
      return "rdma";
    case Kind::kFake:
      return "fake";
  }
  return "unknown";
}

Result<Kind> parse_kind(std::string_view text) {
  if (text == "tcp") return Kind::kTcp;
  if (text == "rdma") return Kind::kRdma;
  return Status(Errc::kInvalidArgument,
                "unknown transport '" + std::string(text) + "' (expected 'tcp' or 'rdma')");
}

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

Result<std::unique_ptr<Listener>> listen(Kind kind, const std::string& address, uint16_t port,
                                         const ConnectionOptions& options) {
  switch (kind) {
    case Kind::kTcp:
      return tcp_listen(address, port, options);
    case Kind::kRdma:
      return rdma_listen(address, port, options);
    case Kind::kFake:
      return fake::listen_installed(address, port, options);
  }
  return Status(Errc::kInvalidArgument, "listen: unknown transport kind");
}

Result<std::unique_ptr<Connection>> connect(Kind kind, const std::string& address, uint16_t port,
                                            const ConnectionOptions& options) {
  switch (kind) {
    case Kind::kTcp:
      return tcp_connect(address, port, options);
    case Kind::kRdma:
      return rdma_connect(address, port, options);
    case Kind::kFake:
      return fake::connect_installed(address, port, options);
  }
  return Status(Errc::kInvalidArgument, "connect: unknown transport kind");
}

}  // namespace pmirror::transport
