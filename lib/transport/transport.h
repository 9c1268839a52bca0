// The transport seam: RDMA's model, offered by two implementations.
//
//   rdma  librdmacm + libibverbs: one RC queue pair per Connection.
//   tcp   sockets; the passive side services the one-sided operations
//         against its registered memory itself, with the same guarantees.
//
// The model, as in verbs:
//  * Memory is registered on a Connection before a peer may touch it. A
//    registration gives a RemoteKey (address + rkey) that the owner hands to
//    the peer; registrations are per connection, so a peer can reach only
//    what was registered on its own connection, and loses access when the
//    registration or the connection goes away.
//  * One-sided post_write / post_read move bytes between a local
//    registration and the peer's registered memory without the peer's
//    application seeing them.
//  * Two-sided post_send delivers a message into one of the receive slots
//    the peer pre-posted; the peer sees it as a kRecv completion, reads it
//    with recv_data() and gives the slot back with repost_recv().
//  * Operations on one connection execute in the order they were posted.
//    A Read executes after every Write posted before it (RC ordering), and
//    its completion means those Writes were placed at the peer.
//  * Everything is asynchronous: post_* queue work and return; poll()
//    reports completions, in posting order for each kind of queue.
//
// Persistence. Over rdma, placement is durability only where the target's
// memory is pmem and the platform writes through to it (APM). Over tcp, the
// passive side makes every Write durable (registration's persist function)
// before it answers a later Read, so a Read after Write is a flush there too.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pmirror::transport {

// kFake is the in-process fake fabric (fake/fake_transport.h), for tests
// only: listen/connect reach the FakeFabric installed with
// fake::install_fabric. parse_kind never returns it, so no configuration
// file or user can select it.
enum class Kind { kTcp, kRdma, kFake };
std::string_view kind_name(Kind kind);           // "tcp" | "rdma" | "fake"
Result<Kind> parse_kind(std::string_view text);  // "tcp" | "rdma" only

// Access a peer is given to a registration (bit set).
enum Access : uint32_t {
  kLocalOnly = 0,         // source of our writes / destination of our reads
  kRemoteWrite = 1u << 0,  // the peer may RDMA Write into it
  kRemoteRead = 1u << 1,   // the peer may RDMA Read from it
};

// Makes [addr, addr+len) durable. The tcp transport calls it on the passive
// side before answering a Read that follows Writes into that range; rdma
// ignores it (the NIC places data; durability is the platform's business).
using PersistFn = std::function<void(const void* addr, size_t len)>;

// What the peer needs to address a registration.
struct RemoteKey {
  uint64_t address = 0;  // peer-visible address of the first byte
  uint32_t rkey = 0;
  uint64_t length = 0;
};

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual std::byte* base() const = 0;
  virtual size_t length() const = 0;
  virtual RemoteKey remote_key() const = 0;
};

enum class Opcode : uint8_t { kWrite, kRead, kSend, kRecv };
std::string_view opcode_name(Opcode op);

struct Completion {
  uint64_t wr_id = 0;     // as given to post_*; for kRecv the slot index
  Opcode opcode = Opcode::kSend;
  Status status;          // not ok: the operation failed, and the connection is broken
  uint32_t byte_len = 0;  // kRecv: length of the message in the slot
};

struct ConnectionOptions {
  uint32_t recv_slots = 64;          // receive buffers pre-posted
  uint32_t message_size = 4096;      // bytes per send/receive buffer
  uint32_t max_outstanding = 256;    // send-queue depth (writes+reads+sends in flight)
  std::chrono::milliseconds connect_timeout{5000};
};

class Connection {
 public:
  virtual ~Connection() = default;

  // Registers [addr, addr+len) on this connection. The region must outlive
  // every operation that uses it; destroying the MemoryRegion revokes access.
  virtual Result<std::unique_ptr<MemoryRegion>> register_memory(void* addr, size_t len,
                                                                uint32_t access,
                                                                PersistFn persist = {}) = 0;

  // Copies local[local_offset, +len) to the peer's remote.address + remote_offset.
  // signaled=false: no completion unless it fails.
  virtual Status post_write(const MemoryRegion& local, size_t local_offset, size_t len,
                            const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id,
                            bool signaled) = 0;
  // Copies the peer's remote.address + remote_offset (len bytes) into local.
  virtual Status post_read(const MemoryRegion& local, size_t local_offset, size_t len,
                           const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id) = 0;
  // Sends a message of at most options().message_size bytes. The bytes are
  // copied before post_send returns.
  virtual Status post_send(std::span<const std::byte> message, uint64_t wr_id) = 0;

  // Waits up to timeout for at least one completion; returns how many were
  // written to out (0 on timeout). A connection the peer closed yields a
  // completion with a kConnectionError status, then kClosed from poll.
  virtual Result<size_t> poll(std::span<Completion> out, std::chrono::milliseconds timeout) = 0;

  // The message in receive slot `slot` (valid until repost_recv(slot)).
  virtual std::span<const std::byte> recv_data(uint32_t slot, uint32_t byte_len) const = 0;
  virtual Status repost_recv(uint32_t slot) = 0;

  // Disconnects; pending operations complete with errors. Idempotent.
  virtual void shutdown() = 0;

  virtual const ConnectionOptions& options() const = 0;
  virtual std::string peer_address() const = 0;  // "host:port", for logs
  virtual Kind kind() const = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Waits up to timeout for the next initiator. nullptr on timeout.
  virtual Result<std::unique_ptr<Connection>> accept(std::chrono::milliseconds timeout) = 0;
  virtual uint16_t port() const = 0;  // the bound port (useful when 0 was asked)
  // Checks, without a peer, that [addr, addr+len) can be registered for
  // `access` on the device(s) this listener serves -- so that a volume that
  // could never be served (fsdax without ODP) fails at start-up, not at the
  // first initiator. tcp can register anything.
  virtual Status check_registrable(void* /*addr*/, size_t /*len*/, uint32_t /*access*/) {
    return Status::Ok();
  }
  virtual void shutdown() = 0;        // wakes accept(); idempotent
};

// address: numeric IPv4/IPv6 or a host name. port 0 binds an ephemeral port.
Result<std::unique_ptr<Listener>> listen(Kind kind, const std::string& address, uint16_t port,
                                         const ConnectionOptions& options);
Result<std::unique_ptr<Connection>> connect(Kind kind, const std::string& address, uint16_t port,
                                            const ConnectionOptions& options);

}  // namespace pmirror::transport
