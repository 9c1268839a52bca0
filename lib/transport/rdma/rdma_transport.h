// Entry points of the rdma implementation of the transport seam
// (librdmacm + libibverbs), registered for Kind::kRdma by register_rdma.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace pmirror::transport {

Result<std::unique_ptr<Listener>> rdma_listen(const std::string& address, uint16_t port,
                                              const ConnectionOptions& options,
                                              const AdmissionOptions& admission = {});
Result<std::unique_ptr<Connection>> rdma_connect(const std::string& address, uint16_t port,
                                                 const ConnectionOptions& options);

}  // namespace pmirror::transport
