// The transport seam: RDMA's model, offered by two implementations.
//
//   rdma  librdmacm + libibverbs: one RC queue pair per Connection.
//   tcp   sockets; the passive side services the one-sided operations
//         against its registered memory itself, with the same guarantees.
//
// (and, in tests, the in-process fake fabric). Which implementation serves a
// Kind is the registry's business (registry.h); code above the seam calls
// listen/connect with a Kind and asks capabilities(), never the kind itself,
// what a transport guarantees.
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
//  * Where the fabric has them (rdma on a device with the IBTA's remote
//    persistence verbs), post_list also takes FLUSH and ATOMIC WRITE
//    (WorkRequest::flush / atomic_write); every transport says whether a
//    connection can in fabric_persistence() and refuses them otherwise.
//
// Dormant connections. A Connection that Listener::accept returns is
// DORMANT until activate(): the peer has completed the transport's own
// hello but is not yet authenticated by the layer above, so it costs no
// thread. A dormant connection offers only what a handshake needs:
// post_send, poll, recv_data and repost_recv (and register_memory, which
// grants nothing before activation), all executed in the caller's thread
// (poll(0) never blocks; wait_fd() says when to call it). One-sided
// operations are refused (kFailedPrecondition) and a peer's one-sided
// frame is a protocol error that closes the connection. activate() makes
// it a full connection (tcp: starts its sender and receiver threads);
// connect() returns connections that are already active. The listener
// counts dormant connections as unauthenticated against AdmissionOptions'
// caps and may close the oldest to make room for a new one (the owner then
// sees the connection closed); activate() takes it out of that count.
//
// Persistence. Over rdma, placement is durability only where the target's
// memory is pmem and the platform writes through to it (APM). Over tcp, the
// passive side makes every Write durable (registration's persist function)
// before it answers a later Read, so a Read after Write is a flush there too;
// a Read whose persist failed fails.
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
#include "transport/kind.h"

namespace pmirror::transport {

// Kind, kind_name and parse_kind ("tcp" | "rdma"): transport/kind.h. kFake
// is the in-process fake fabric, for tests only: it is registered while a
// test installs a FakeFabric (fake/fake_transport.h), and parse_kind never
// returns it, so no configuration file or user can select it.

// Access a peer is given to a registration (bit set).
enum Access : uint32_t {
  kLocalOnly = 0,          // source of our writes / destination of our reads
  kRemoteWrite = 1u << 0,  // the peer may RDMA Write into it
  kRemoteRead = 1u << 1,   // the peer may RDMA Read from it
  // With kRemoteWrite, where Capabilities::persists_each_write: the passive
  // side makes each Write durable (the registration's PersistFn) before it
  // executes the next operation of the connection, so that placement order
  // is durability order. A Write whose persist fails fails, and the
  // connection breaks. Other transports refuse the bit (kUnsupported).
  kPersistEachWrite = 1u << 2,
  // The peer may FLUSH it to the persistence domain (rdma:
  // IBV_ACCESS_FLUSH_PERSISTENT; a device refuses it on memory that is not
  // pmem). Only where the connection's FabricPersistence says
  // `can_post_flush`; kUnsupported otherwise.
  kRemoteFlush = 1u << 3,
  // The peer may ATOMIC WRITE 8-byte words into it (rdma:
  // IBV_ACCESS_REMOTE_ATOMIC). Only where `can_post_atomic_write`.
  kRemoteAtomicWrite = 1u << 4,
};

// Makes [addr, addr+len) durable; not ok when it could not (a write-back
// error: the message names the volume and the errno). The tcp transport
// calls it on the passive side before answering a Read that follows Writes
// into that range, and refuses that Read when it fails (an ERROR frame with
// the message; the connection breaks, as an RC QP would); rdma ignores it
// (the NIC places data; durability is the platform's business). A failure
// no Read can report -- while a registration is destroyed, or after the
// connection ended -- is dropped by the transport: the owner's function must
// record and log it itself (region::Region does).
using PersistFn = std::function<Status(const void* addr, size_t len)>;

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

// kFlush and kAtomicWrite: the IBTA's remote persistence verbs, posted only
// through post_list (WorkRequest::flush / atomic_write) and only where the
// connection's FabricPersistence says it can; kUnsupported elsewhere.
enum class Opcode : uint8_t { kWrite, kRead, kSend, kRecv, kFlush, kAtomicWrite };
std::string_view opcode_name(Opcode op);

struct Completion {
  uint64_t wr_id = 0;  // as given to post_*; for kRecv the slot index
  Opcode opcode = Opcode::kSend;
  Status status;          // not ok: the operation failed, and the connection is broken
  uint32_t byte_len = 0;  // kRecv: length of the message in the slot
};

// One operation of a post_list (the fields its opcode uses; the others are
// ignored).
struct WorkRequest {
  Opcode opcode = Opcode::kWrite;  // kWrite, kRead, kSend, kFlush or kAtomicWrite
  uint64_t wr_id = 0;
  // kWrite/kRead: the local side, as post_write/post_read take it.
  const MemoryRegion* local = nullptr;
  size_t local_offset = 0;
  size_t length = 0;  // kFlush: the bytes of `remote` from remote_offset to flush
  RemoteKey remote{};
  uint64_t remote_offset = 0;
  bool signaled = true;  // kWrite and kFlush only: the others always complete
  // kSend: the message, copied before post_list returns.
  std::span<const std::byte> message{};
  // kAtomicWrite: the 8-byte word written, at an 8-byte aligned address.
  uint64_t value = 0;
  // Not started before every operation posted before it has completed
  // (IBV_SEND_FENCE): an ATOMIC WRITE after a FLUSH is then never placed
  // before the bytes that FLUSH made persistent, whatever the responder does.
  bool fence = false;

  static WorkRequest write(const MemoryRegion& local, size_t local_offset, size_t len,
                           const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id,
                           bool signaled) {
    return {Opcode::kWrite, wr_id, &local, local_offset, len, remote, remote_offset, signaled, {}};
  }
  static WorkRequest read(const MemoryRegion& local, size_t local_offset, size_t len,
                          const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id) {
    return {Opcode::kRead, wr_id, &local, local_offset, len, remote, remote_offset, true, {}};
  }
  static WorkRequest send(std::span<const std::byte> message, uint64_t wr_id) {
    return {Opcode::kSend, wr_id, nullptr, 0, message.size(), {}, 0, true, message};
  }
  // FLUSH(persistent, range): completes once the peer's bytes [remote +
  // remote_offset, +len) -- every Write before it that placed them -- are
  // in its persistence domain. Unsignaled, it completes with the next
  // signaled operation (RC completes in order).
  static WorkRequest flush(const RemoteKey& remote, uint64_t remote_offset, size_t len,
                           uint64_t wr_id, bool signaled = true) {
    return {Opcode::kFlush, wr_id, nullptr, 0, len, remote, remote_offset, signaled, {}};
  }
  static WorkRequest atomic_write(const RemoteKey& remote, uint64_t remote_offset,
                                  uint64_t value, uint64_t wr_id, bool fence) {
    return {Opcode::kAtomicWrite, wr_id, nullptr, 0,     sizeof value, remote,
            remote_offset,        true,  {},      value, fence};
  }
};

struct ConnectionOptions {
  uint32_t recv_slots = 64;        // receive buffers pre-posted
  uint32_t message_size = 4096;    // bytes per send/receive buffer
  uint32_t max_outstanding = 256;  // send-queue depth (writes+reads+sends in flight)
  std::chrono::milliseconds connect_timeout{5000};
  PollMode poll_mode = PollMode::kAdaptive;  // local only: never told to the peer
};

// What a listener allows peers that are not yet authenticated: from the
// accepted socket through the transport's hello until the connection is
// activate()d. When a new connection would exceed a cap, the oldest
// unauthenticated connection of its source (per-source cap) or of the
// source holding the most (total cap) is closed to make room, so silent
// connections can never lock a new initiator out. A source is the peer's
// IPv4 address or its IPv6 /64 prefix.
struct AdmissionOptions {
  // The transport's hello must complete within this of the accept.
  std::chrono::milliseconds handshake_timeout{5000};
  uint32_t max_unauthenticated = 64;
  uint32_t max_unauthenticated_per_source = 16;
};

// A listener's admission counts since it started (thread-safe to read).
struct AdmissionCounters {
  uint64_t unauthenticated = 0;  // now: hello pending or dormant
  uint64_t evicted = 0;          // closed to make room under a cap (or for a file descriptor)
  uint64_t timed_out = 0;        // the transport's hello did not complete in time
  uint64_t dropped = 0;          // accepted and closed at once: out of file descriptors/memory
  uint64_t failed = 0;           // the transport's hello was wrong (not ours, mismatched)
};

// What the device under a connection offers for remote persistence, asked
// at run time and never assumed (docs/transport-rdma.md, "Native
// persistence"): the IBTA's FLUSH and ATOMIC WRITE, and whether they work
// on on-demand-paging (fs-dax) registrations. tcp and the fake fabric:
// none. post_list posts kFlush / kAtomicWrite where `can_post_*` says so
// (issue 26); status reports them.
struct FabricPersistence {
  bool flush_global = false;      // FLUSH to the point of global visibility
  bool flush_persistent = false;  // FLUSH to the persistence domain
  bool atomic_write = false;      // 8-byte ATOMIC WRITE
  bool odp_flush = false;         // FLUSH on an ODP registration (RC)
  bool odp_atomic_write = false;  // ATOMIC WRITE on an ODP registration (RC)
  // This build can post them (built against rdma-core 45 or later: Debian
  // 12 has 44, whose verbs.h has no ibv_wr_flush).
  bool verbs_api = false;
  // This connection can post them: the build can, the device offers them,
  // and its queue pair was made for them (and, for FLUSH, the peer's QP
  // lets it in: both sides enable FLUSH on their QPs when their devices
  // have it).
  bool can_post_flush = false;         // FLUSH(persistent, range)
  bool can_post_atomic_write = false;  // ATOMIC WRITE
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

  // Posts `requests` in order, as the single posts above would, with one
  // doorbell where the transport has them (rdma: one linked ibv_post_send,
  // small Writes inline; tcp: one hand-off to the sender, one writev).
  // Returns how many were posted: all, or -- when the send queue or the
  // send buffers are full -- a prefix (rdma and tcp: none), the rest left
  // for the caller to post again after polling. Any other error is returned
  // as the single post would; requests before the failing one are then in
  // flight (rdma and tcp check the whole list first, so none is).
  virtual Result<size_t> post_list(std::span<const WorkRequest> requests);

  // Waits up to timeout for at least one completion; returns how many were
  // written to out (0 on timeout). A connection the peer closed yields a
  // completion with a kConnectionError status, then kClosed from poll.
  virtual Result<size_t> poll(std::span<Completion> out, std::chrono::milliseconds timeout) = 0;

  // The message in receive slot `slot` (valid until repost_recv(slot)).
  virtual std::span<const std::byte> recv_data(uint32_t slot, uint32_t byte_len) const = 0;
  virtual Status repost_recv(uint32_t slot) = 0;

  // Disconnects; pending operations complete with errors. Idempotent.
  virtual void shutdown() = 0;

  // Makes a poll() under way, or else the next one, return at once with
  // what it has (perhaps nothing): for another thread that changed what the
  // poller should look at (a fence, a reload, a stop), so that the poller
  // can sleep long between looks. Thread-safe; never blocks; a wake with no
  // poll to end is spent by the next poll. Default: none (poll periodically).
  virtual void wake() {}

  // Changes how poll() waits from now on (the passive side learns the
  // volume, and so its poll mode, only after accepting). Thread-safe.
  virtual void set_poll_mode(PollMode /*mode*/) {}

  // Ends the dormant state (see above): the peer is authenticated. No-op on
  // an active connection. Errors: kResourceExhausted when the threads it
  // needs cannot be created (the connection is then unusable; shut it
  // down), kClosed when the connection already broke (or was evicted),
  // kProtocolError when the peer is in the middle of sending a frame.
  virtual Status activate() { return Status::Ok(); }
  // A descriptor that becomes readable when poll() may have something to
  // return (for poll(2) by the owner of a dormant connection); -1: none,
  // poll periodically.
  virtual int wait_fd() const { return -1; }

  virtual const ConnectionOptions& options() const = 0;
  virtual std::string peer_address() const = 0;  // "host:port", for logs
  // The device's remote-persistence verbs (above); none by default.
  virtual FabricPersistence fabric_persistence() const { return {}; }
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Waits up to timeout for the next initiator whose transport hello has
  // completed, and returns its connection, dormant (see above). nullptr on
  // timeout. An error concerns one peer only (a hello that failed: not a
  // pmirror peer, mismatched options, timed out) and the listener stays
  // usable, except kClosed after shutdown(). Hellos progress only while
  // accept() runs: call it whenever wait_fd() is readable, and at least
  // every few hundred milliseconds (deadlines, back-off after running out
  // of file descriptors).
  virtual Result<std::unique_ptr<Connection>> accept(std::chrono::milliseconds timeout) = 0;
  // Readable when accept(0) may make progress; -1: none, poll periodically.
  virtual int wait_fd() const { return -1; }
  virtual AdmissionCounters admission() const { return {}; }
  virtual uint16_t port() const = 0;  // the bound port (useful when 0 was asked)
  // Checks, without a peer, that [addr, addr+len) can be registered for
  // `access` on the device(s) this listener serves -- so that a volume that
  // could never be served (fsdax without ODP) fails at start-up, not at the
  // first initiator. tcp can register anything.
  virtual Status check_registrable(void* /*addr*/, size_t /*len*/, uint32_t /*access*/) {
    return Status::Ok();
  }
  virtual void shutdown() = 0;  // wakes accept(); idempotent
};

// What a transport guarantees, for the code above the seam to decide by
// (rather than by its kind). Per-mapping questions go to the listener
// (Listener::check_registrable: rdma cannot register fsdax pages without
// ODP), since the answer depends on the device it serves.
struct Capabilities {
  // A Read posted after Writes on one connection completes only once those
  // Writes are durable, whatever memory backs the peer's registration: tcp,
  // whose passive side persists (PersistFn) before it answers. false: the
  // Read only proves the Writes were placed, which is durability only where
  // that memory is pmem and the platform writes through to it (rdma: APM
  // on devdax/fsdax, with DDIO off or eADR).
  bool read_flushes_writes_on_any_backing = false;
  // register_memory takes kPersistEachWrite: the passive side's CPU places
  // each Write and can persist it before the next (tcp). rdma cannot: the
  // NIC places data without the CPU.
  bool persists_each_write = false;
};

// What the transport serving `kind` in this process guarantees; kUnsupported
// when this build left it out, kFailedPrecondition when nothing registered
// it (the fake outside a test).
Result<Capabilities> capabilities(Kind kind);

// The kind a replica's transport name selects in this process: a name
// parse_kind accepts, or the name of a kind registered here although no
// configuration may name it ("fake", while a test installed a fabric).
// kInvalidArgument otherwise, as parse_kind.
Result<Kind> kind_for_name(std::string_view name);

// address: numeric IPv4/IPv6 or a host name. port 0 binds an ephemeral port.
// Errors as capabilities() when no transport serves `kind`.
Result<std::unique_ptr<Listener>> listen(Kind kind, const std::string& address, uint16_t port,
                                         const ConnectionOptions& options,
                                         const AdmissionOptions& admission = {});
Result<std::unique_ptr<Connection>> connect(Kind kind, const std::string& address, uint16_t port,
                                            const ConnectionOptions& options);

}  // namespace pmirror::transport
