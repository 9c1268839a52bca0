// The tcp implementation of the transport seam: RDMA RC semantics over one
// TCP stream per Connection.
//
// Threads. Each active Connection runs a sender and a receiver thread.
// post_* only queue a work request (WR) into a fixed ring of
// max_outstanding entries and wake the sender; poll() waits on the
// completion queue. No per-op heap allocation on the hot path (send
// payloads reuse their slot's buffer).
//
// Listener. Accepted sockets are non-blocking and wait in the listener's
// pending set, each with a deadline (AdmissionOptions::handshake_timeout),
// all watched by one epoll set together with the listening socket (its
// descriptor is wait_fd()); accept() sends our HELLO and assembles the
// peer's as its bytes come, so a silent or slow peer holds up nobody. The
// caps of AdmissionOptions apply to every connection from its accept until
// activate(): a new one beyond them closes the oldest (admission.h).
// Out of descriptors (EMFILE/ENFILE) or memory, accept() evicts the oldest
// unauthenticated connection or accepts-and-closes with a spare
// descriptor, then pauses 100 ms; it never spins.
//
// Dormant connections. What accept() returns has no thread yet: its socket
// stays non-blocking and post_send/poll/recv_data/repost_recv do their I/O
// in the caller's thread (frames written at once, the rest on the next
// poll; frames read exactly, assembled across calls). wait_fd() is the
// socket. post_write/post_read return kFailedPrecondition; a WRITE,
// READ_REQ or READ_RESP from the peer before activation is a protocol error
// that closes the connection. activate() leaves the unauthenticated count,
// finishes pending output, makes the socket blocking and starts the two
// threads (kResourceExhausted, connection still dormant and usable, when
// they cannot be created). tcp_connect returns active connections.
//
// Wire format (all integers little-endian). Every frame is a 40-byte header,
// then `length` payload bytes:
//   u8 type | u8 opcode | u16 errc | u32 rkey | u64 seq | u64 wr_id |
//   u64 addr | u32 length | u32 magic ("PMTF")
//   HELLO     both sides, first frame; payload: version, message_size,
//             recv_slots, max_outstanding. message_size must match.
//   WRITE     rkey/addr name the target; payload = the data, sent straight
//             from the registered local memory (zero copy, writev).
//   READ_REQ  rkey/addr/length name the source; no payload.
//   READ_RESP seq echoes the READ_REQ; payload = the data, sent straight
//             from the registration, received straight into the reader's.
//   SEND      payload = the message (<= message_size).
//   ERROR     the peer refused request `seq` (wr_id, opcode echoed); errc +
//             text payload; the connection closes after it.
// A bad magic, unknown type or over-long length is a protocol error: the
// connection is closed (no reply). Nothing is allocated from a peer-supplied
// length.
//
// Remote access (passive side, in the receiver thread). A WRITE/READ_REQ is
// served only if its rkey is registered on THIS connection, the registration
// has the access bit (kRemoteWrite/kRemoteRead) and [addr, addr+length) lies
// inside it; else the passive side answers ERROR (kPermissionDenied, "remote
// access error: ...") and closes, as an RC QP goes to the error state. WRITE
// payloads are received directly into the registration (after the check).
// RemoteKey.address is the registration's real virtual address (as verbs);
// rkeys are per-connection random nonzero ids. Destroying a MemoryRegion
// waits until no frame is being received into / sent from it.
//
// Persistence. The receiver records the ranges each WRITE touched per
// registration. Before answering a READ_REQ it calls every registration's
// PersistFn on its ranges written since the last persist (sorted, merged),
// so the Read completes only after all earlier Writes are durable; a
// PersistFn failure refuses the READ_REQ (ERROR with its message) and the
// connection closes. Ranges also get persisted when a registration is
// destroyed, when the connection ends, and when a registration collects
// more than kMaxDirtyRanges ranges (a failure there refuses that WRITE).
// A WRITE whose copy into the registration faults (common/fault.h: SIGBUS
// under a guard, or EFAULT from recv) is refused with kIoError.
//
// Receives. SEND fills the oldest posted receive slot (kRecv completion,
// wr_id = slot). With no slot posted (RNR), the receiver stops reading the
// socket until the application reposts one: back-pressure, like an infinite
// rnr_retry; nothing is dropped, order is kept.
//
// Completions, in posting order of the send queue: a Write (signaled) or Send
// completes once its frame is handed to the kernel; a Read once its data has
// landed. An operation counts toward max_outstanding from post_* until its
// completion is polled (unsignaled Writes: until sent); beyond that post_*
// returns kResourceExhausted, like a full send queue.
//
// Errors. When the connection breaks (peer closed, socket error, protocol
// error, remote access error, shutdown()), posts return kClosed; once both
// threads stopped touching memory every unfinished WR completes with an error
// (the one the peer refused with the peer's reason, the others "flushed"),
// then every posted receive slot (kRecv, wr_id = slot) does, as verbs flushes
// its queues; afterwards poll() returns kClosed. Because Writes complete at
// send time, a refused Write may already have completed ok; its refusal then
// arrives as an extra error completion carrying its wr_id.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace pmirror::transport {

Result<std::unique_ptr<Listener>> tcp_listen(const std::string& address, uint16_t port,
                                             const ConnectionOptions& options,
                                             const AdmissionOptions& admission = {});
Result<std::unique_ptr<Connection>> tcp_connect(const std::string& address, uint16_t port,
                                                const ConnectionOptions& options);

}  // namespace pmirror::transport
