// The tcp Connection: a send-queue ring served by a sender thread, a
// receiver thread that serves the peer's requests, a completion queue.
// Semantics: see tcp_transport.h.
#pragma once

#include <sys/uio.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/admission.h"
#include "transport/spin.h"
#include "transport/tcp/registration.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/wire.h"
#include "transport/transport.h"

namespace pmirror::transport::tcp {

class TcpMemoryRegion final : public MemoryRegion {
 public:
  TcpMemoryRegion(std::shared_ptr<RegistrationTable> table, std::byte* base, size_t length,
                  RemoteKey key)
      : table_(std::move(table)), base_(base), length_(length), key_(key) {}
  // A persist failing here has nobody to report to: the PersistFn's owner
  // records and logs it (transport.h).
  ~TcpMemoryRegion() override { (void)table_->remove(key_.rkey); }

  std::byte* base() const override { return base_; }
  size_t length() const override { return length_; }
  RemoteKey remote_key() const override { return key_; }
  const RegistrationTable* table() const { return table_.get(); }

 private:
  std::shared_ptr<RegistrationTable> table_;
  std::byte* base_;
  size_t length_;
  RemoteKey key_;
};

class TcpConnection final : public Connection {
 public:
  // fd: connected, transport hello done, non-blocking. The connection
  // starts DORMANT (transport.h): no threads, Send/Recv only, in the
  // caller's thread; activate() starts the sender and receiver threads.
  // ticket: the connection's place among the listener's unauthenticated
  // ones (null on the connecting side), released by activate().
  TcpConnection(UniqueFd fd, const ConnectionOptions& options, const Hello& peer,
                std::string peer_address,
                std::unique_ptr<AdmissionControl::Ticket> ticket = nullptr);
  ~TcpConnection() override;

  Result<std::unique_ptr<MemoryRegion>> register_memory(void* addr, size_t len, uint32_t access,
                                                        PersistFn persist) override;
  Status post_write(const MemoryRegion& local, size_t local_offset, size_t len,
                    const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id,
                    bool signaled) override;
  Status post_read(const MemoryRegion& local, size_t local_offset, size_t len,
                   const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id) override;
  Status post_send(std::span<const std::byte> message, uint64_t wr_id) override;
  Result<size_t> post_list(std::span<const WorkRequest> requests) override;
  void set_poll_mode(PollMode mode) override { spin_.set_mode(mode); }
  Result<size_t> poll(std::span<Completion> out, std::chrono::milliseconds timeout) override;
  std::span<const std::byte> recv_data(uint32_t slot, uint32_t byte_len) const override;
  Status repost_recv(uint32_t slot) override;
  void shutdown() override;
  // An active connection's poll under way returns at once; a dormant one's
  // (before activate(): the caller's thread sleeps on the socket) at its
  // next look -- nobody wakes a handshake, and an eventfd per
  // unauthenticated connection would cost a flood one more descriptor each.
  void wake() override;
  const ConnectionOptions& options() const override { return options_; }
  std::string peer_address() const override { return peer_address_; }
  Status activate() override;
  int wait_fd() const override;

 private:
  static constexpr uint64_t kNoSeq = ~uint64_t{0};

  // A work request in the send-queue ring; slot = seq % ring size. Fields
  // other than state are written by post_* before publication and then only
  // read, until the entry is retired.
  struct Wr {
    uint64_t seq = 0;
    uint64_t wr_id = 0;
    Opcode opcode = Opcode::kWrite;
    bool signaled = true;
    bool in_flight = false;  // taken by the sender (reads: awaiting READ_RESP)
    bool done = false;
    Status status;
    std::byte* local = nullptr;  // write source / read destination
    uint32_t length = 0;
    HeaderBytes header{};
    std::vector<std::byte> message;  // send payload copy (capacity reused)
  };

  // A frame the receiver asks the sender to emit: READ_RESP or ERROR.
  // A READ_RESP of at most this many bytes carries a copy taken when the
  // Read executes (as an RNIC's would), not the registration's bytes at
  // send time: a later Write to the same bytes need not wait for it. The
  // flush Reads are 8 bytes.
  static constexpr size_t kCopiedReadResponse = 64;
  struct Response {
    HeaderBytes header{};
    RegistrationTable::Reg* reg = nullptr;  // pinned source of a READ_RESP
    const std::byte* data = nullptr;  // the registration's bytes, or `copied`
    uint32_t length = 0;
    std::array<std::byte, kCopiedReadResponse> copied{};
  };

  struct Cqe {
    Completion completion;
    bool counted;  // counts toward max_outstanding until polled
  };

  enum class SlotState : uint8_t { kPosted, kFilling, kOwnedByApp };

  Result<const TcpMemoryRegion*> check_local(const MemoryRegion& local, size_t offset, size_t len,
                                             std::string_view op) const;
  Status post(Opcode opcode, uint64_t wr_id, bool signaled, std::byte* local, size_t len,
              const RemoteKey* remote, uint64_t remote_offset, std::span<const std::byte> message);
  // Fills the next ring entry and its frame header (room already checked).
  void enqueue_locked(Opcode opcode, uint64_t wr_id, bool signaled, std::byte* local, size_t len,
                      const RemoteKey* remote, uint64_t remote_offset,
                      std::span<const std::byte> message);
  Status queue_full_locked();  // also asks to be told when room is made

  // Dormant mode: the owner's thread moves the bytes, under mu_, on the
  // non-blocking socket. Frames are read exactly (never past the end of
  // one), so nothing is buffered when the threads take over.
  void dormant_io_locked();
  void dormant_send_locked();
  void dormant_receive_locked();
  // Breaks a dormant connection: reason, socket shut, queues flushed.
  void dormant_fail_locked(Status why);
  void abandon_input_locked();
  Status dormant_lost_locked(int err);

  // What one sendmsg carries: the first `responses` queued responses and
  // the ring entries [first, last); `final_error_frame`: the responses end
  // with the ERROR frame, after which the socket is shut.
  struct Batch {
    size_t responses = 0;
    uint64_t first = 0;
    uint64_t last = 0;
    bool final_error_frame = false;
  };
  // Takes what waits to be sent (at most kSenderBatch frames of each kind)
  // and makes the socket ours (socket_busy_). False: the socket is someone
  // else's, or nothing waits.
  bool claim_batch_locked(Batch& batch);
  // The batch's frames, gathered into `iov` (its entries are stable until
  // the batch is finished).
  void gather(const Batch& batch, std::vector<iovec>& iov);
  // After the batch went to the kernel (err 0) or failed (errno): unpins
  // the responses, completes the Writes and Sends, frees the socket.
  void finish_batch_locked(const Batch& batch, int err);
  // From the posting thread (an application's, or the receiver's for a
  // READ_RESP), when no one else writes to the socket: sends what is queued
  // now, without the hand-off to the sender thread. Never blocks: what the
  // kernel does not take at once is copied and left to the sender, and a
  // batch over kInlineSendLimit bytes is left to it whole.
  // `lk` holds mu_ and is let go while sending.
  void send_inline(std::unique_lock<std::mutex>& lk);
  // After a post queued its frames: sends them inline when the connection
  // was idle before (nothing posted and unfinished), else wakes the sender,
  // which batches what concurrent or pipelined posts queue.
  void post_queued(std::unique_lock<std::mutex>& lk, bool idle);

  void sender_main();
  void receiver_main();
  Status receive_loop();
  Status refuse(const FrameHeader& h, Opcode op, const Status& why);
  Status on_error_frame(const FrameHeader& h, std::string_view text);
  bool overlaps_pending_response_locked(uint64_t addr, uint64_t len) const;

  // Marks the connection broken (first reason wins) and, unless an ERROR
  // frame still has to go out, shuts the socket down to stop both threads.
  void fail(Status reason, uint64_t culprit = kNoSeq);
  // fail()'s halves: breaks the connection under mu_ (the first reason
  // wins; `culprit` is the request that completes with it), true when the
  // socket may be shut down now (no ERROR frame waits to be sent); then,
  // without mu_, wakes both threads and shuts the socket down.
  bool break_locked(Status reason, uint64_t culprit);
  void wake_and_shut(bool shut);
  void thread_exit();
  void retire_locked();
  void flush_locked();
  void push_cqe_locked(Completion c, bool counted);
  Status closed_status_locked() const;

  const ConnectionOptions options_;
  const Hello peer_;
  const std::string peer_address_;
  UniqueFd fd_;
  std::shared_ptr<RegistrationTable> table_;

  mutable std::mutex mu_;
  std::condition_variable sender_cv_;    // work for the sender
  std::condition_variable cq_cv_;        // completions for poll()
  std::condition_variable receiver_cv_;  // a slot was reposted / a response went out
  bool sender_idle_ = false;
  // Someone -- the sender, or a thread in send_inline() -- is writing to the
  // socket; nobody else may until it is cleared.
  bool socket_busy_ = false;
  // send_inline() left a batch to the sender (the socket stays busy till
  // it is finished): whole when tail_ is empty, else tail_ holds the bytes
  // the kernel did not take (copied).
  bool tail_pending_ = false;
  Batch tail_batch_;
  std::vector<std::byte> tail_;
  std::vector<iovec> inline_iov_;  // send_inline()'s, used by the socket's holder
  int pollers_ = 0;
  bool receiver_waits_slot_ = false;
  bool receiver_waits_resp_ = false;

  bool stop_sender_ = false;  // activate() failed halfway: the sender leaves quietly
  bool broken_ = false;
  bool error_frame_pending_ = false;
  std::condition_variable error_frame_sent_;  // error_frame_pending_ went false
  static constexpr std::chrono::milliseconds kErrorFrameGrace{200};
  bool flushed_ = false;
  int live_threads_ = 0;  // sender + receiver, once active
  Status reason_;
  uint64_t culprit_ = kNoSeq;

  // Send queue: [head_seq_, tail_seq_) are posted and not retired;
  // [next_unsent_, tail_seq_) not yet taken by the sender.
  std::vector<Wr> ring_;
  uint64_t head_seq_ = 0;
  uint64_t next_unsent_ = 0;
  uint64_t tail_seq_ = 0;
  uint32_t outstanding_ = 0;
  // A post was refused for max_outstanding: the next unsignaled Write that
  // leaves the queue wakes poll() (which then returns, possibly with 0), so
  // that a caller waiting for room does not sleep to its timeout.
  bool room_wanted_ = false;
  bool room_made_ = false;  // since then; poll() returns at once and clears it
  bool woken_ = false;      // wake() since the last poll(): it returns at once

  // Responses queued by the receiver for the sender (FIFO ring). Sized for
  // the peer's declared max_outstanding reads plus one ERROR frame.
  std::vector<Response> responses_;
  size_t resp_head_ = 0;
  size_t resp_count_ = 0;
  std::string error_text_;  // payload of the ERROR frame, if any

  std::deque<Cqe> cq_;
  SpinPolicy spin_{PollMode::kAdaptive};  // how poll() waits (thread-safe; set from options_)

  // Receive slots.
  std::unique_ptr<std::byte[]> slots_;
  std::vector<SlotState> slot_state_;
  std::vector<uint32_t> posted_;  // FIFO ring of posted slots, consumed in posting order
  size_t posted_head_ = 0;
  size_t posted_count_ = 0;

  // Dormant state (guarded by mu_; only the owner's activate() ends it).
  bool dormant_ = true;
  std::vector<uint8_t> out_;  // frames of the sends [out_first_, next_unsent_) being written
  size_t out_pos_ = 0;        // bytes of out_ already written
  uint64_t out_first_ = 0;
  uint8_t in_header_[kHeaderSize] = {};
  size_t in_got_ = 0;        // header bytes read
  bool in_payload_ = false;  // reading the payload of in_frame_
  FrameHeader in_frame_;
  uint32_t in_slot_ = 0;  // SEND: the slot being filled
  size_t in_payload_got_ = 0;
  std::string in_error_text_;  // ERROR: the peer's text
  std::unique_ptr<AdmissionControl::Ticket> ticket_;

  std::mutex shutdown_mu_;
  std::thread sender_;
  std::thread receiver_;
};

}  // namespace pmirror::transport::tcp
