// A fake fabric: a third implementation of the transport seam, in-process,
// for deterministic tests (docs/transport-fake.md).
//
// It really moves bytes between registered memory, with the semantics of an
// RC connection as transport.h and tcp_transport.h describe them: operations
// on a connection execute in posting order, each one atomically; a Read sees
// every Write posted before it; a Send fills the oldest pre-posted receive
// slot of the peer and, with none posted, waits (back-pressure, RNR) and holds
// up everything posted behind it; remote access errors (unknown rkey, range
// outside the registration, missing access bit) complete the operation with
// kPermissionDenied "remote access error: ..." and break the connection;
// shutdown() and broken connections flush unfinished operations, then the
// posted receive slots, with errors, after which poll() returns kClosed.
//
// Execution. By default the fabric executes an operation as soon as it can
// (inside post_*, or inside repost_recv() for a Send that waited for a slot),
// in the calling thread. set_manual(true) queues everything instead; the test
// then executes operations one at a time with step() (the oldest runnable
// operation on the fabric, by posting order) or step(connection), or all of
// them with run_until_idle().
//
// Persistence (the passive side's durable image). Every registration with
// kRemoteWrite access is backed by a tracked "medium": a durable image of its
// bytes (taken from the memory when first registered or tracked) and the list
// of Writes placed into it that are not durable yet. A Write changes the
// visible bytes at once; its range becomes durable
//  * when a later Read executes on the same connection (APM; the fabric then
//    calls the registration's PersistFn on the flushed ranges, as tcp does,
//    and a PersistFn that fails fails the Read and breaks the connection),
//    unless FabricOptions::read_flushes is false;
//  * when the owner persists it: persist(addr, len), mark_durable(addr, len),
//    or a PersistFn obtained from tracking_persist_fn() (GPSPM).
// A flush makes the *addresses* durable with their current contents, as a
// CPU cache flush does. crash() rolls the visible bytes back to the durable
// image: every Write not covered by a flush is dropped -- entirely, or (with
// CrashOptions::tear) independently per aligned 8-byte word, to model torn
// writes.
//
// Thread safety: every object may be used from any thread; one mutex guards
// the whole fabric. PersistFns are called with it held and must not call back
// into the fabric.
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace pmirror::transport::fake {

struct FabricOptions {
  // false: a Read does not make earlier Writes durable (rdma into a plain
  // file: only the owner's persist does -- GPSPM only).
  bool read_flushes = true;
  // The fabric's remote persistence verbs, as 6.12's rxe has them:
  // connections report FLUSH (persistent) and ATOMIC WRITE and post_list
  // takes them. A FLUSH makes its range of the peer's registration durable
  // (calling its PersistFn, which failing fails the FLUSH and breaks the
  // connection); an ATOMIC WRITE places 8 bytes, not durable until flushed.
  bool native_persistence = false;
};

struct CrashOptions {
  // false: a Write not covered by a flush is dropped entirely.
  // true: each 8-byte word it touched (aligned to the address) survives or
  // not independently, chosen by a generator seeded with `seed`.
  bool tear = false;
  uint64_t seed = 1;
  // The APM model (docs/protocol.md, "Ordering"): what was placed becomes
  // durable in placement order. The Writes no flush covered survive as a
  // prefix of their posting order (a random cut), the one at the cut torn
  // word by word as with `tear`, the later ones dropped. Without it they
  // survive independently (`tear`), or not at all: a target whose CPU
  // persists keeps nothing unpersisted in order.
  bool in_placement_order = false;
};

// Whether the calling thread is running the fabric's own code (a
// connection's post, poll or repost: the simulated NIC and media, which
// allocate as they please). Tests that count what the code above the seam
// allocates leave those allocations out: a real NIC makes none in the
// application's address space.
bool in_fabric_code();

namespace detail {
struct Hub;
}

class FakeFabric {
 public:
  static std::shared_ptr<FakeFabric> create(const FabricOptions& options = {});
  ~FakeFabric();
  FakeFabric(const FakeFabric&) = delete;
  FakeFabric& operator=(const FakeFabric&) = delete;

  // A listener for `name` (kAlreadyExists if one is listening there). The
  // name is also the node that accepted connections belong to, for crash().
  // `port` 0: Listener::port() is a per-fabric counter; otherwise that port
  // (a label only: connections are made by name).
  Result<std::unique_ptr<Listener>> listen(const std::string& name,
                                           const ConnectionOptions& options = {},
                                           uint16_t port = 0);
  // The port of the listener `name` (kNotFound when nobody listens there).
  Result<uint16_t> port_of(const std::string& name) const;
  // Connects to the listener `name`: the pair exists at once (the passive end
  // waits in the listener's backlog for accept()). `from` names the node of
  // the active end. kConnectionError when nobody listens there; kConfigError
  // when message_size differs from the listener's.
  Result<std::unique_ptr<Connection>> connect(const std::string& name,
                                              const ConnectionOptions& options = {},
                                              const std::string& from = "initiator");

  // ---- execution control
  void set_manual(bool manual);  // false again: runs everything runnable
  bool manual() const;
  // Executes the oldest runnable operation (a Send waiting for a slot is not
  // runnable, nor anything behind it). false when there was none.
  bool step();
  // The same, restricted to operations posted on `connection`.
  bool step(const Connection& connection);
  size_t run_until_idle();  // executes until nothing is runnable; how many
  size_t pending() const;   // operations posted, not yet executed

  // ---- fault injection
  // Breaks the connection (both ends) now, as a pulled cable: unfinished
  // operations on both ends complete with `reason`-derived errors.
  void break_connection(const Connection& connection,
                        Status reason = Status(Errc::kConnectionError, "link failure (injected)"));
  // The operation executed on `connection` after `skip` more have executed
  // successfully fails with `reason` (kConnectionError "... retry exceeded"
  // by default: lost on the wire) and breaks the connection; it is not
  // applied at the peer.
  void fail_after(const Connection& connection, uint64_t skip,
                  Status reason = Status(Errc::kConnectionError,
                                         "transport retry counter exceeded (injected drop)"));
  // The next operation executed on `connection` is lost on the wire: it is
  // not applied at the peer, completes with "transport retry counter
  // exceeded" and breaks the connection (RC never loses silently).
  // fail_after(connection, 0) with that reason.
  void drop_next(const Connection& connection);
  // Connection objects whose peer end is on `peer_node` wait for `until`
  // when destroyed, before any of their teardown (a kernel teardown that
  // blocks: an rdma_cm id whose peer does not answer). The wait holds no
  // fabric lock. An invalid future lifts the stall.
  void stall_teardown(const std::string& peer_node, std::shared_future<void> until);

  // ---- persistence
  // Tracks [addr, addr+len) as pmem of `node` for the fabric's lifetime, so
  // its durable image outlives registrations (a target's region across
  // sessions). Registrations inside it share it.
  Status track(const std::string& node, void* addr, size_t len);
  // The owner persists [addr, addr+len) (GPSPM): marks it durable in every
  // tracked medium it overlaps, then calls the PersistFn of every live
  // registration that overlaps it, clipped to that registration. Returns
  // the first PersistFn failure.
  Status persist(const void* addr, size_t len);
  // A PersistFn that marks the range durable (no registration callbacks) and
  // then calls `real` -- to hand to code that persists through a PersistFn.
  // Called from inside a PersistFn the fabric is calling, it only calls
  // `real` (see mark_durable).
  PersistFn tracking_persist_fn(PersistFn real = {});
  // The owner made [addr, addr+len) durable by itself (its CPU flushed it:
  // pmem_persist, msync -- what a GPSPM target does on a PersistRequest):
  // marks it durable in every tracked medium it overlaps, calls no
  // PersistFn. Untracked memory is ignored. Called from inside a PersistFn
  // the fabric is calling (a Read flush or persist() reaching the owner's
  // persist code), it does nothing: the fabric marked the range already,
  // and taking its lock again would deadlock.
  void mark_durable(const void* addr, size_t len);
  // Ends track(): the medium holding addr is forgotten once no registration
  // uses it. Call it before freeing tracked memory.
  void untrack(const void* addr);

  // Crashes `node`: every connection with an end there breaks (operations
  // not executed yet are lost), and every medium of the node rolls back to
  // its durable image.
  void crash(const std::string& node, const CrashOptions& options = {});
  // Crashes the medium behind one registration, and breaks its connection.
  void crash(const MemoryRegion& region, const CrashOptions& options = {});
  void crash_all(const CrashOptions& options = {});
  // Arms a crash at an exact point of the execution: once `operations` more
  // operations posted from `counted_node` (every node when empty) have
  // executed successfully, `node` crashes (crash_all when empty) at once,
  // under the fabric's lock, before anything else executes -- after the
  // completion of that last operation was queued. 0: crashes now. One
  // trigger at a time; arming again replaces it.
  void crash_after(uint64_t operations, const std::string& node, const CrashOptions& options = {},
                   const std::string& counted_node = {});
  void cancel_crash();
  uint64_t crashes() const;  // crashes so far (any crash*, triggered or not)
  // Operations executed successfully so far, posted from `node` (every
  // node when empty): to measure a workload, then crash at each point of it.
  uint64_t executed(const std::string& node = {}) const;

  // The durable image of [addr, addr+len), which must lie inside one tracked
  // medium (kNotFound otherwise).
  Result<std::vector<std::byte>> durable_bytes(const void* addr, size_t len) const;
  Result<std::vector<std::byte>> durable_bytes(const MemoryRegion& region) const;
  // Writes placed into tracked media and not yet durable.
  size_t undurable_writes() const;

 private:
  explicit FakeFabric(const FabricOptions& options);
  std::shared_ptr<detail::Hub> hub_;
};

}  // namespace pmirror::transport::fake
