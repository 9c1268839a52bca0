#include "transport/tcp/tcp_connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "common/fault.h"

namespace pmirror::transport::tcp {

namespace {

constexpr size_t kSenderBatch = 64;  // frames per sendmsg
// A posting thread sends a batch itself up to this many bytes; larger ones
// go to the sender thread (see send_inline).
constexpr size_t kInlineSendLimit = 256 << 10;

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

// Buffered reader: small frames cost one recv for many; large payloads are
// received straight into their destination (registered memory).
class FrameReader {
 public:
  explicit FrameReader(int fd) : fd_(fd), buf_(new uint8_t[kBufSize]) {}

  // Fills dst with exactly n bytes; false on EOF (err() == 0) or error.
  bool read(void* dst, size_t n) {
    if (n == 0) return true;
    auto* out = static_cast<uint8_t*>(dst);
    size_t take = std::min(end_ - begin_, n);
    if (take > 0) {
      std::memcpy(out, buf_.get() + begin_, take);
      begin_ += take;
      out += take;
      n -= take;
    }
    while (n > 0) {
      if (n >= kDirectThreshold) {
        ssize_t r = ::recv(fd_, out, n, MSG_WAITALL);
        if (r <= 0) {
          if (r < 0 && errno == EINTR) continue;
          err_ = r == 0 ? 0 : errno;
          // The kernel could not store into the destination (a mapping
          // whose file was truncated): where it stopped.
          failed_at_ = reinterpret_cast<uintptr_t>(out);
          return false;
        }
        out += r;
        n -= static_cast<size_t>(r);
        continue;
      }
      ssize_t r = ::recv(fd_, buf_.get(), kBufSize, 0);
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        err_ = r == 0 ? 0 : errno;
        return false;
      }
      begin_ = 0;
      end_ = static_cast<size_t>(r);
      take = std::min(end_, n);
      std::memcpy(out, buf_.get(), take);
      begin_ = take;
      out += take;
      n -= take;
    }
    return true;
  }
  int err() const { return err_; }
  uintptr_t failed_at() const { return failed_at_; }
  // Bytes received and not read yet.
  size_t buffered() const { return end_ - begin_; }

 private:
  static constexpr size_t kBufSize = 64 * 1024;
  static constexpr size_t kDirectThreshold = 16 * 1024;
  int fd_;
  std::unique_ptr<uint8_t[]> buf_;
  size_t begin_ = 0;
  size_t end_ = 0;
  int err_ = 0;
  uintptr_t failed_at_ = 0;
};

}  // namespace

TcpConnection::TcpConnection(UniqueFd fd, const ConnectionOptions& options, const Hello& peer,
                             std::string peer_address,
                             std::unique_ptr<AdmissionControl::Ticket> ticket)
    : options_(options),
      peer_(peer),
      peer_address_(std::move(peer_address)),
      fd_(std::move(fd)),
      table_(std::make_shared<RegistrationTable>()),
      ring_(options.max_outstanding),
      slots_(new std::byte[size_t{options.recv_slots} * options.message_size]),
      slot_state_(options.recv_slots, SlotState::kPosted),
      posted_(options.recv_slots),
      ticket_(std::move(ticket)) {
  for (uint32_t i = 0; i < options.recv_slots; ++i) posted_[i] = i;
  posted_count_ = options.recv_slots;
  spin_.set_mode(options.poll_mode);
  inline_iov_.reserve(4 * kSenderBatch + 4);
}

TcpConnection::~TcpConnection() {
  // First: the listener may shut our socket down until the ticket is gone.
  ticket_.reset();
  shutdown();
}

void TcpConnection::wake() {
  {
    std::lock_guard lk(mu_);
    woken_ = true;
  }
  cq_cv_.notify_all();
}

int TcpConnection::wait_fd() const {
  std::lock_guard lk(mu_);
  return dormant_ ? fd_.get() : -1;
}

Status TcpConnection::activate() {
  std::unique_lock lk(mu_);
  if (!dormant_) return Status::Ok();
  if (ticket_ != nullptr) {
    ticket_->release();  // authenticated: no longer the listener's to evict
    if (ticket_->evicted() && !broken_)
      dormant_fail_locked(Status(Errc::kClosed, "closed to make room for newer connections"));
  }
  if (broken_) return closed_status_locked();
  // A READ_RESP is popped only after sendmsg returned, by which time the
  // peer may have polled it and posted another Read: hence twice the
  // peer's depth, plus one spare for an ERROR frame. Allocated now, when
  // the peer is authenticated: a stranger's hello announcing the largest
  // depth (65536) made every unauthenticated connection hold 16 MiB, 64 of
  // them 1 GiB (docs/architecture.md, "Admission", (6)). Dormant,
  // a connection answers no Read (its frames are refused as malformed).
  if (responses_.empty()) responses_.resize(2 * size_t{peer_.max_outstanding} + 1);
  if (in_got_ > 0 || in_payload_) {
    dormant_fail_locked(Status(Errc::kProtocolError,
                               "peer " + peer_address_ +
                                   " was sending a frame when the session was set up (a pmirror "
                                   "initiator waits for the target's answer); connection closed"));
    return reason_;
  }
  // Sends the kernel could not take yet are finished here, before the
  // threads start (the sender knows nothing of out_).
  if (out_pos_ < out_.size()) {
    Status sent = send_all_deadline(fd_.get(), out_.data() + out_pos_, out_.size() - out_pos_,
                                    Clock::now() + options_.connect_timeout);
    if (!sent.ok()) {
      dormant_fail_locked(sent.with_context("connection to " + peer_address_ + " lost"));
      return closed_status_locked();
    }
    for (uint64_t s = out_first_; s < next_unsent_; ++s) ring_[s % ring_.size()].done = true;
    out_.clear();
    out_pos_ = 0;
    retire_locked();
  }
  if (Status blocking = set_nonblocking(fd_.get(), false); !blocking.ok()) {
    dormant_fail_locked(blocking.with_context("connection to " + peer_address_));
    return closed_status_locked();
  }
  dormant_ = false;
  live_threads_ = 2;
  lk.unlock();
  // Out of threads (a task limit, memory): an error for this connection,
  // never an exception through the daemon.
  auto out_of_threads = [&](const std::system_error& e) {
    return Status(Errc::kResourceExhausted,
                  "connection to " + peer_address_ + ": cannot start its threads: " + e.what());
  };
  // Either way the connection stays dormant and usable, so that its owner
  // can still tell the peer why it is refused.
  auto stay_dormant = [&] {
    std::lock_guard relock(mu_);
    live_threads_ = 0;
    dormant_ = true;
    (void)set_nonblocking(fd_.get(), true);
  };
  try {
    sender_ = std::thread([this] { sender_main(); });
  } catch (const std::system_error& e) {
    stay_dormant();
    return out_of_threads(e);
  }
  try {
    receiver_ = std::thread([this] { receiver_main(); });
  } catch (const std::system_error& e) {
    {
      std::lock_guard relock(mu_);
      stop_sender_ = true;  // it is idle: nothing was posted since it started
    }
    sender_cv_.notify_all();
    sender_.join();
    stay_dormant();
    stop_sender_ = false;
    return out_of_threads(e);
  }
  return Status::Ok();
}

Result<std::unique_ptr<MemoryRegion>> TcpConnection::register_memory(void* addr, size_t len,
                                                                     uint32_t access,
                                                                     PersistFn persist) {
  if (addr == nullptr || len == 0)
    return Status(Errc::kInvalidArgument, "register_memory: empty region (addr " +
                                              hex(reinterpret_cast<uint64_t>(addr)) + ", length " +
                                              std::to_string(len) + ")");
  if ((access & (kRemoteFlush | kRemoteAtomicWrite)) != 0)
    return Status(Errc::kUnsupported,
                  "register_memory: FLUSH and ATOMIC WRITE are the fabric's verbs (rdma where "
                  "the device has them); this transport has neither");
  if ((access & ~uint32_t{kRemoteWrite | kRemoteRead | kPersistEachWrite}) != 0)
    return Status(Errc::kInvalidArgument, "register_memory: unknown access bits " + hex(access));
  if ((access & kPersistEachWrite) != 0 && ((access & kRemoteWrite) == 0 || !persist))
    return Status(Errc::kInvalidArgument,
                  "register_memory: kPersistEachWrite needs kRemoteWrite and a persist function");
  auto* base = static_cast<std::byte*>(addr);
  uint32_t rkey = table_->add(base, len, access, std::move(persist));
  RemoteKey key{reinterpret_cast<uint64_t>(addr), rkey, len};
  return std::unique_ptr<MemoryRegion>(new TcpMemoryRegion(table_, base, len, key));
}

Result<const TcpMemoryRegion*> TcpConnection::check_local(const MemoryRegion& local, size_t offset,
                                                          size_t len, std::string_view op) const {
  auto* mr = dynamic_cast<const TcpMemoryRegion*>(&local);
  if (mr == nullptr || mr->table() != table_.get())
    return Status(Errc::kInvalidArgument,
                  std::string(op) + ": the local region is not registered on this connection");
  if (offset > mr->length() || len > mr->length() - offset)
    return Status(Errc::kInvalidArgument, std::string(op) + ": local range [" +
                                              std::to_string(offset) + ", +" + std::to_string(len) +
                                              ") exceeds the local region (" +
                                              std::to_string(mr->length()) + " bytes)");
  if (len > kMaxTransfer)
    return Status(Errc::kInvalidArgument, std::string(op) + ": " + std::to_string(len) +
                                              " bytes exceed the largest transfer (" +
                                              std::to_string(kMaxTransfer) + ")");
  return mr;
}

namespace {
Status not_active(const std::string& peer, std::string_view op) {
  return Status(Errc::kFailedPrecondition,
                std::string(op) + " on the connection from " + peer +
                    ": the connection is dormant (its peer is not authenticated yet); only "
                    "sends and receives work until activate()");
}
}  // namespace

Status TcpConnection::post_write(const MemoryRegion& local, size_t local_offset, size_t len,
                                 const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id,
                                 bool signaled) {
  {
    std::lock_guard lk(mu_);
    if (dormant_) return not_active(peer_address_, "post_write");
  }
  PMIRROR_ASSIGN_OR_RETURN(auto* mr, check_local(local, local_offset, len, "post_write"));
  return post(Opcode::kWrite, wr_id, signaled, mr->base() + local_offset, len, &remote,
              remote_offset, {});
}

Status TcpConnection::post_read(const MemoryRegion& local, size_t local_offset, size_t len,
                                const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id) {
  {
    std::lock_guard lk(mu_);
    if (dormant_) return not_active(peer_address_, "post_read");
  }
  PMIRROR_ASSIGN_OR_RETURN(auto* mr, check_local(local, local_offset, len, "post_read"));
  return post(Opcode::kRead, wr_id, true, mr->base() + local_offset, len, &remote, remote_offset,
              {});
}

Status TcpConnection::post_send(std::span<const std::byte> message, uint64_t wr_id) {
  if (message.size() > options_.message_size)
    return Status(Errc::kInvalidArgument,
                  "post_send: message of " + std::to_string(message.size()) +
                      " bytes exceeds message_size " + std::to_string(options_.message_size));
  return post(Opcode::kSend, wr_id, true, nullptr, message.size(), nullptr, 0, message);
}

Status TcpConnection::post(Opcode opcode, uint64_t wr_id, bool signaled, std::byte* local,
                           size_t len, const RemoteKey* remote, uint64_t remote_offset,
                           std::span<const std::byte> message) {
  std::unique_lock lk(mu_);
  if (broken_) return closed_status_locked();
  if (outstanding_ >= options_.max_outstanding) return queue_full_locked();
  const bool idle = head_seq_ == tail_seq_;
  enqueue_locked(opcode, wr_id, signaled, local, len, remote, remote_offset, message);
  if (dormant_) {
    dormant_send_locked();  // failures show as the send's completion
    return Status::Ok();
  }
  post_queued(lk, idle);
  return Status::Ok();
}

void TcpConnection::post_queued(std::unique_lock<std::mutex>& lk, bool idle) {
  if (idle) {
    // Nothing else in flight: this thread sends it now (a busy socket's
    // holder leaves what it did not take to the sender).
    send_inline(lk);
  } else if (sender_idle_) {
    // Under load the sender batches what several posts queued.
    lk.unlock();
    sender_cv_.notify_one();
    lk.lock();
  }
}

Result<size_t> TcpConnection::post_list(std::span<const WorkRequest> requests) {
  // Checked whole first: the list is queued entirely or not at all, and its
  // frames leave together (in one sendmsg).
  bool one_sided = false;
  for (const WorkRequest& request : requests) {
    switch (request.opcode) {
      case Opcode::kWrite:
      case Opcode::kRead: {
        one_sided = true;
        std::string_view op = request.opcode == Opcode::kWrite ? "post_write" : "post_read";
        if (request.local == nullptr)
          return Status(Errc::kInvalidArgument, std::string(op) + ": no local region");
        PMIRROR_RETURN_IF_ERROR(
            check_local(*request.local, request.local_offset, request.length, op).status());
        break;
      }
      case Opcode::kSend:
        if (request.message.size() > options_.message_size)
          return Status(Errc::kInvalidArgument,
                        "post_send: message of " + std::to_string(request.message.size()) +
                            " bytes exceeds message_size " + std::to_string(options_.message_size));
        break;
      case Opcode::kRecv:
        return Status(Errc::kInvalidArgument, "post_list: a receive is not posted, it is reposted");
      case Opcode::kFlush:
      case Opcode::kAtomicWrite:
        return Status(Errc::kUnsupported,
                      "post_list: " + std::string(opcode_name(request.opcode)) +
                          " is the fabric's verb (rdma where the device has it); tcp persists "
                          "each Write, or before the Read after it, instead");
    }
  }
  {
    std::unique_lock lk(mu_);
    if (one_sided && dormant_) return not_active(peer_address_, "post_list");
    if (broken_) return closed_status_locked();
    const bool idle = head_seq_ == tail_seq_;
    if (outstanding_ + requests.size() > options_.max_outstanding) {
      if (requests.size() > options_.max_outstanding)
        return Status(Errc::kInvalidArgument, "post_list of " + std::to_string(requests.size()) +
                                                  " requests exceeds max_outstanding " +
                                                  std::to_string(options_.max_outstanding));
      (void)queue_full_locked();
      return size_t{0};
    }
    for (const WorkRequest& request : requests) {
      std::byte* local = nullptr;
      if (request.opcode != Opcode::kSend)
        local = static_cast<const TcpMemoryRegion*>(request.local)->base() + request.local_offset;
      enqueue_locked(request.opcode, request.wr_id,
                     request.opcode == Opcode::kWrite ? request.signaled : true, local,
                     request.length, request.opcode == Opcode::kSend ? nullptr : &request.remote,
                     request.remote_offset, request.message);
    }
    if (dormant_) {
      dormant_send_locked();
      return requests.size();
    }
    // The list leaves in one sendmsg, from this thread when nothing else is
    // in flight.
    post_queued(lk, idle);
  }
  return requests.size();
}

Status TcpConnection::queue_full_locked() {
  room_wanted_ = true;
  return Status(Errc::kResourceExhausted, "send queue to " + peer_address_ +
                                              " is full: " + std::to_string(outstanding_) +
                                              " operations outstanding (max_outstanding " +
                                              std::to_string(options_.max_outstanding) +
                                              "); poll completions before posting more");
}

void TcpConnection::enqueue_locked(Opcode opcode, uint64_t wr_id, bool signaled, std::byte* local,
                                   size_t len, const RemoteKey* remote, uint64_t remote_offset,
                                   std::span<const std::byte> message) {
  Wr& w = ring_[tail_seq_ % ring_.size()];
  w.seq = tail_seq_;
  w.wr_id = wr_id;
  w.opcode = opcode;
  w.signaled = signaled;
  w.in_flight = false;
  w.done = false;
  w.status = Status::Ok();
  w.local = local;
  w.length = static_cast<uint32_t>(len);
  FrameHeader h;
  h.seq = w.seq;
  h.wr_id = wr_id;
  h.length = static_cast<uint32_t>(len);
  h.opcode = static_cast<uint8_t>(opcode);
  if (remote != nullptr) {
    h.rkey = remote->rkey;
    h.addr = remote->address + remote_offset;  // wraps on nonsense; the peer refuses it
  }
  switch (opcode) {
    case Opcode::kWrite:
      h.type = FrameType::kWrite;
      break;
    case Opcode::kRead:
      h.type = FrameType::kReadReq;
      break;
    default:
      h.type = FrameType::kSend;
      w.message.assign(message.begin(), message.end());  // reuses the entry's capacity
      break;
  }
  encode(h, w.header.data());
  ++tail_seq_;
  ++outstanding_;
}

Result<size_t> TcpConnection::poll(std::span<Completion> out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (dormant_) {
    // The caller's thread does the I/O; wait on the socket, not on threads.
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (!broken_) dormant_io_locked();
      if (!cq_.empty() || flushed_ || out.empty() || woken_) break;
      // No slot to receive into (the application holds them all): nothing
      // can arrive before it reposts one, which only this thread can do.
      bool rnr = posted_count_ == 0 && in_got_ == 0 && !in_payload_;
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (rnr || left.count() <= 0) break;
      pollfd p{fd_.get(), static_cast<short>(POLLIN | (out_pos_ < out_.size() ? POLLOUT : 0)), 0};
      lk.unlock();
      int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX)));
      int err = errno;
      lk.lock();
      if (rc < 0 && err != EINTR) {
        dormant_fail_locked(
            errno_status(Errc::kConnectionError, "connection to " + peer_address_ + ": poll", err));
      }
    }
  } else if (cq_.empty() && !flushed_ && !room_made_ && !woken_ && timeout.count() > 0 &&
             !out.empty()) {
    const auto ready = [&] { return !cq_.empty() || flushed_ || room_made_ || woken_; };
    const auto start = Clock::now();
    const auto deadline = start + timeout;
    // Spin first (PollMode): the receiver thread fills cq_ under mu_, which
    // is let go between looks.
    const auto window = spin_.window();
    const auto spin_until = window >= std::chrono::nanoseconds(timeout) ? deadline : start + window;
    bool seen = false;
    uint32_t spins = 0;
    while (!seen && Clock::now() < spin_until) {
      lk.unlock();
      relax(spins);
      lk.lock();
      seen = ready();
    }
    if (!seen) {
      ++pollers_;
      cq_cv_.wait_until(lk, deadline, ready);
      --pollers_;
    }
    if (!cq_.empty()) spin_.observed(Clock::now() - start);
  }
  room_made_ = false;
  woken_ = false;
  size_t n = 0;
  while (n < out.size() && !cq_.empty()) {
    Cqe& e = cq_.front();
    out[n++] = std::move(e.completion);
    if (e.counted) --outstanding_;
    cq_.pop_front();
  }
  if (n == 0 && flushed_ && !out.empty()) return closed_status_locked();
  return n;
}

std::span<const std::byte> TcpConnection::recv_data(uint32_t slot, uint32_t byte_len) const {
  if (slot >= options_.recv_slots) return {};
  return {slots_.get() + size_t{slot} * options_.message_size,
          std::min(byte_len, options_.message_size)};
}

Status TcpConnection::repost_recv(uint32_t slot) {
  bool wake;
  {
    std::lock_guard lk(mu_);
    if (slot >= options_.recv_slots)
      return Status(Errc::kInvalidArgument, "repost_recv: slot " + std::to_string(slot) +
                                                " out of range (recv_slots " +
                                                std::to_string(options_.recv_slots) + ")");
    if (broken_) return closed_status_locked();
    if (slot_state_[slot] != SlotState::kOwnedByApp)
      return Status(Errc::kInvalidArgument,
                    "repost_recv: slot " + std::to_string(slot) + " is already posted");
    slot_state_[slot] = SlotState::kPosted;
    posted_[(posted_head_ + posted_count_) % posted_.size()] = slot;
    ++posted_count_;
    wake = receiver_waits_slot_;
  }
  if (wake) receiver_cv_.notify_one();
  return Status::Ok();
}

void TcpConnection::shutdown() {
  std::lock_guard once(shutdown_mu_);
  {
    std::unique_lock lk(mu_);
    // The receiver refused a request and its ERROR frame is queued: that is
    // the peer's only way to learn why (say, the failed msync that refused
    // its flush), so give the sender a moment to emit it -- but never wait
    // long for a peer that may not read.
    if (error_frame_pending_ && !dormant_) {
      error_frame_sent_.wait_for(lk, kErrorFrameGrace, [&] { return !error_frame_pending_; });
    }
    if (!broken_) {
      broken_ = true;
      reason_ = Status(Errc::kClosed, "connection to " + peer_address_ + " was shut down locally");
    }
    error_frame_pending_ = false;
    if (dormant_ && !flushed_) {
      // No thread will flush the queues: do it here.
      abandon_input_locked();
      flush_locked();
    }
  }
  sender_cv_.notify_all();
  receiver_cv_.notify_all();
  cq_cv_.notify_all();
  ::shutdown(fd_.get(), SHUT_RDWR);
  if (sender_.joinable()) sender_.join();
  if (receiver_.joinable()) receiver_.join();
}

Status TcpConnection::closed_status_locked() const {
  return Status(Errc::kClosed,
                "connection to " + peer_address_ + " is closed: " + reason_.message());
}

void TcpConnection::fail(Status reason, uint64_t culprit) {
  bool shut;
  {
    std::lock_guard lk(mu_);
    shut = break_locked(std::move(reason), culprit);
  }
  wake_and_shut(shut);
}

bool TcpConnection::break_locked(Status reason, uint64_t culprit) {
  if (!broken_) {
    broken_ = true;
    reason_ = std::move(reason);
    culprit_ = culprit;
  }
  return !error_frame_pending_;
}

void TcpConnection::wake_and_shut(bool shut) {
  sender_cv_.notify_all();
  receiver_cv_.notify_all();
  if (shut) ::shutdown(fd_.get(), SHUT_RDWR);
}

void TcpConnection::thread_exit() {
  std::lock_guard lk(mu_);
  // Flushing waits for both threads: until then one of them may still be
  // moving bytes into or out of the application's buffers.
  if (--live_threads_ == 0) flush_locked();
}

void TcpConnection::push_cqe_locked(Completion c, bool counted) {
  cq_.push_back(Cqe{std::move(c), counted});
  if (pollers_ > 0) cq_cv_.notify_all();
}

void TcpConnection::retire_locked() {
  while (head_seq_ < tail_seq_) {
    Wr& w = ring_[head_seq_ % ring_.size()];
    if (!w.done) break;
    if (w.signaled || !w.status.ok()) {
      Completion c;
      c.wr_id = w.wr_id;
      c.opcode = w.opcode;
      c.status = std::move(w.status);
      push_cqe_locked(std::move(c), true);
    } else {
      --outstanding_;
      if (room_wanted_) {
        room_wanted_ = false;
        room_made_ = true;
        if (pollers_ > 0) cq_cv_.notify_all();
      }
    }
    ++head_seq_;
  }
}

void TcpConnection::flush_locked() {
  Errc code = reason_.code() == Errc::kClosed ? Errc::kClosed : Errc::kConnectionError;
  Status flushed(code, "operation flushed: " + reason_.message());
  for (uint64_t seq = head_seq_; seq < tail_seq_; ++seq) {
    Wr& w = ring_[seq % ring_.size()];
    if (w.done) continue;
    w.done = true;
    w.status = seq == culprit_ ? reason_ : flushed;
  }
  next_unsent_ = tail_seq_;
  retire_locked();
  // As verbs flushes the receive queue: every posted slot completes in error.
  for (; posted_count_ > 0; --posted_count_) {
    uint32_t slot = posted_[posted_head_];
    posted_head_ = (posted_head_ + 1) % posted_.size();
    slot_state_[slot] = SlotState::kOwnedByApp;
    Completion c;
    c.wr_id = slot;
    c.opcode = Opcode::kRecv;
    c.status = flushed;
    push_cqe_locked(std::move(c), false);
  }
  flushed_ = true;
  cq_cv_.notify_all();
}

// ---------------------------------------------------------------- dormant

void TcpConnection::dormant_io_locked() {
  if (ticket_ != nullptr && ticket_->evicted() && !broken_) {
    dormant_fail_locked(
        Status(Errc::kClosed, "connection from " + peer_address_ +
                                  " was closed to make room for newer connections (too many "
                                  "unauthenticated connections)"));
    return;
  }
  dormant_send_locked();
  if (!broken_) dormant_receive_locked();
}

void TcpConnection::dormant_send_locked() {
  while (!broken_) {
    if (out_pos_ == out_.size()) {
      // Everything taken so far has left: those sends are complete.
      for (uint64_t s = out_first_; s < next_unsent_; ++s) ring_[s % ring_.size()].done = true;
      retire_locked();
      out_.clear();
      out_pos_ = 0;
      if (next_unsent_ == tail_seq_) return;
      out_first_ = next_unsent_;
      for (; next_unsent_ < tail_seq_; ++next_unsent_) {
        Wr& w = ring_[next_unsent_ % ring_.size()];
        w.in_flight = true;
        out_.insert(out_.end(), w.header.begin(), w.header.end());
        const auto* m = reinterpret_cast<const uint8_t*>(w.message.data());
        out_.insert(out_.end(), m, m + w.message.size());
      }
    }
    ssize_t n = ::send(fd_.get(), out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL);
    if (n > 0) {
      out_pos_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    dormant_fail_locked(errno_status(Errc::kConnectionError,
                                     "connection to " + peer_address_ + " lost: send", errno));
  }
}

Status TcpConnection::dormant_lost_locked(int err) {
  if (ticket_ != nullptr && ticket_->evicted())
    return Status(Errc::kClosed, "connection from " + peer_address_ +
                                     " was closed to make room for newer connections (too many "
                                     "unauthenticated connections)");
  if (err == 0)
    return Status(Errc::kConnectionError,
                  "connection to " + peer_address_ + " lost: the peer closed the connection");
  return errno_status(Errc::kConnectionError, "connection to " + peer_address_ + " lost: recv",
                      err);
}

void TcpConnection::dormant_receive_locked() {
  auto malformed = [&](const std::string& what) {
    dormant_fail_locked(Status(
        Errc::kProtocolError,
        "peer " + peer_address_ + " sent a malformed frame (" + what + "); connection closed"));
  };
  // Reads up to n bytes into dst; >0 read, 0 nothing now, -1 broken.
  auto read_some = [&](void* dst, size_t n) -> ssize_t {
    for (;;) {
      ssize_t r = ::recv(fd_.get(), dst, n, MSG_DONTWAIT);
      if (r > 0) return r;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      dormant_fail_locked(dormant_lost_locked(r == 0 ? 0 : errno));
      return -1;
    }
  };
  while (!broken_) {
    if (!in_payload_) {
      // A new frame only when a slot can take it (RNR: leave it in the socket).
      if (in_got_ == 0 && posted_count_ == 0) return;
      ssize_t r = read_some(in_header_ + in_got_, kHeaderSize - in_got_);
      if (r <= 0) return;
      in_got_ += static_cast<size_t>(r);
      if (in_got_ < kHeaderSize) continue;
      in_frame_ = decode(in_header_);
      in_got_ = 0;
      const FrameHeader& h = in_frame_;
      if (h.magic != kFrameMagic) return malformed("bad magic " + hex(h.magic));
      switch (h.type) {
        case FrameType::kSend:
          if (h.length > options_.message_size)
            return malformed("a message of " + std::to_string(h.length) +
                             " bytes exceeds the receive buffer size " +
                             std::to_string(options_.message_size));
          in_slot_ = posted_[posted_head_];
          posted_head_ = (posted_head_ + 1) % posted_.size();
          --posted_count_;
          slot_state_[in_slot_] = SlotState::kFilling;
          break;
        case FrameType::kError:
          if (h.length > kMaxErrorText) return malformed("error text too long");
          in_error_text_.assign(h.length, '\0');
          break;
        case FrameType::kWrite:
        case FrameType::kReadReq:
        case FrameType::kReadResp:
          return malformed(std::string(h.type == FrameType::kWrite     ? "a Write"
                                       : h.type == FrameType::kReadReq ? "a Read request"
                                                                       : "a Read response") +
                           " before the connection was activated (its peer is not "
                           "authenticated)");
        case FrameType::kHello:
          return malformed("a second hello");
        default:
          return malformed("unknown frame type " + std::to_string(static_cast<int>(h.type)));
      }
      in_payload_ = true;
      in_payload_got_ = 0;
    }
    const uint32_t length = in_frame_.length;
    if (in_payload_got_ < length) {
      void* dst = in_frame_.type == FrameType::kSend
                      ? static_cast<void*>(slots_.get() + size_t{in_slot_} * options_.message_size +
                                           in_payload_got_)
                      : static_cast<void*>(in_error_text_.data() + in_payload_got_);
      ssize_t r = read_some(dst, length - in_payload_got_);
      if (r <= 0) return;
      in_payload_got_ += static_cast<size_t>(r);
      if (in_payload_got_ < length) continue;
    }
    in_payload_ = false;
    if (in_frame_.type == FrameType::kError) {
      auto code = static_cast<Errc>(in_frame_.errc);
      if (in_frame_.errc == 0 || in_frame_.errc > static_cast<uint16_t>(Errc::kResourceExhausted))
        code = Errc::kProtocolError;
      dormant_fail_locked(Status(code, "peer " + peer_address_ + " refused wr_id " +
                                           std::to_string(in_frame_.wr_id) + ": " +
                                           in_error_text_));
      return;
    }
    slot_state_[in_slot_] = SlotState::kOwnedByApp;
    Completion c;
    c.wr_id = in_slot_;
    c.opcode = Opcode::kRecv;
    c.byte_len = length;
    push_cqe_locked(std::move(c), false);
  }
}

void TcpConnection::abandon_input_locked() {
  if (in_payload_ && in_frame_.type == FrameType::kSend &&
      slot_state_[in_slot_] == SlotState::kFilling) {
    // Back to the front of the queue, so the flush reports it.
    posted_head_ = (posted_head_ + posted_.size() - 1) % posted_.size();
    posted_[posted_head_] = in_slot_;
    ++posted_count_;
    slot_state_[in_slot_] = SlotState::kPosted;
  }
  in_payload_ = false;
  in_got_ = 0;
}

void TcpConnection::dormant_fail_locked(Status why) {
  if (!broken_) {
    broken_ = true;
    reason_ = std::move(why);
  }
  ::shutdown(fd_.get(), SHUT_RDWR);
  abandon_input_locked();
  if (!flushed_) flush_locked();
}

// ---------------------------------------------------------------- sender

bool TcpConnection::claim_batch_locked(Batch& batch) {
  if (socket_busy_) return false;
  batch = Batch{};
  if (broken_) {
    if (!error_frame_pending_) return false;
    // The receiver refused a request: emit the responses queued before it
    // and the ERROR frame (queued last), then close.
    batch.final_error_frame = true;
    batch.responses = resp_count_;
  } else {
    batch.responses = std::min(resp_count_, kSenderBatch);
    batch.first = next_unsent_;
    batch.last = std::min(tail_seq_, batch.first + kSenderBatch);
    for (uint64_t s = batch.first; s < batch.last; ++s) ring_[s % ring_.size()].in_flight = true;
    next_unsent_ = batch.last;
  }
  if (batch.responses == 0 && batch.first == batch.last) return false;
  socket_busy_ = true;
  return true;
}

void TcpConnection::gather(const Batch& batch, std::vector<iovec>& iov) {
  // Entries handed out by the claim are stable until the batch is finished
  // (or until the peer's READ_RESP for them, which cannot precede our bytes).
  iov.clear();
  for (size_t i = 0; i < batch.responses; ++i) {
    Response& r = responses_[(resp_head_ + i) % responses_.size()];
    iov.push_back({r.header.data(), r.header.size()});
    if (r.length > 0) iov.push_back({const_cast<std::byte*>(r.data), r.length});
  }
  for (uint64_t s = batch.first; s < batch.last; ++s) {
    Wr& w = ring_[s % ring_.size()];
    iov.push_back({w.header.data(), w.header.size()});
    if (w.opcode == Opcode::kWrite && w.length > 0) iov.push_back({w.local, w.length});
    if (w.opcode == Opcode::kSend && !w.message.empty())
      iov.push_back({w.message.data(), w.message.size()});
  }
}

void TcpConnection::finish_batch_locked(const Batch& batch, int err) {
  for (size_t i = 0; i < batch.responses; ++i) {
    Response& r = responses_[(resp_head_ + i) % responses_.size()];
    if (r.reg != nullptr) table_->unpin(r.reg);
    r.reg = nullptr;
  }
  resp_head_ = (resp_head_ + batch.responses) % responses_.size();
  resp_count_ -= batch.responses;
  if (batch.responses > 0 && receiver_waits_resp_) receiver_cv_.notify_one();
  if (err == 0) {
    // Handed to the kernel: Writes and Sends are complete. After a
    // refusal only those before the refused request count as done.
    for (uint64_t s = batch.first; s < batch.last; ++s) {
      Wr& w = ring_[s % ring_.size()];
      if (w.opcode != Opcode::kRead && (!broken_ || s < culprit_)) w.done = true;
    }
    retire_locked();
  }
  if (batch.final_error_frame) {
    error_frame_pending_ = false;
    error_frame_sent_.notify_all();
  }
  socket_busy_ = false;
}

void TcpConnection::send_inline(std::unique_lock<std::mutex>& lk) {
  Batch batch;
  if (dormant_ || broken_ || !claim_batch_locked(batch)) return;
  gather(batch, inline_iov_);
  size_t total = 0;
  for (const iovec& v : inline_iov_) total += v.iov_len;
  // The sender's, whole or the rest of it; the socket stays busy till then.
  auto hand_to_sender = [&] {
    tail_batch_ = batch;
    tail_pending_ = true;
    lk.unlock();
    sender_cv_.notify_one();
    lk.lock();
  };
  if (total > kInlineSendLimit) {
    // A large batch (a resync chunk, a wide persist) would not fit the
    // socket buffer anyway: no copy, the sender sends it from where it is.
    tail_.clear();
    hand_to_sender();
    return;
  }
  lk.unlock();
  const ssize_t n = sendv_nowait(fd_.get(), inline_iov_.data(), inline_iov_.size());
  const int err = n < 0 ? static_cast<int>(-n) : 0;
  const size_t sent = n > 0 ? static_cast<size_t>(n) : 0;
  if (err == 0 && sent < total) {
    // The kernel's buffer is full (the peer is slow to read): the sender
    // thread finishes the batch, blocking where this thread must not. The
    // rest (at most kInlineSendLimit) is copied: the batch's memory is then
    // not read again.
    tail_.clear();
    copy_unsent(inline_iov_.data(), inline_iov_.size(), sent, tail_);
    lk.lock();
    hand_to_sender();
    return;
  }
  lk.lock();
  finish_batch_locked(batch, err);
  // Work queued meanwhile (or a failure) is the sender's.
  const bool wake = sender_idle_ && (resp_count_ > 0 || next_unsent_ != tail_seq_ || broken_);
  if (err != 0) {
    const bool shut = break_locked(
        errno_status(Errc::kConnectionError, "connection to " + peer_address_ + " lost: send", err),
        kNoSeq);
    lk.unlock();
    wake_and_shut(shut);
    lk.lock();
    return;
  }
  if (wake) {
    lk.unlock();
    sender_cv_.notify_one();
    lk.lock();
  }
}

void TcpConnection::sender_main() {
  std::vector<iovec> iov;
  iov.reserve(4 * kSenderBatch + 4);
  for (;;) {
    Batch batch;
    bool tail = false;
    {
      std::unique_lock lk(mu_);
      // The socket may be another thread's (send_inline); wait for it
      // before anything else, broken or not, so that frames never mix and
      // nobody moves the application's bytes after we leave.
      while ((socket_busy_ && !tail_pending_) || (!socket_busy_ && !broken_ && !stop_sender_ &&
                                                  resp_count_ == 0 && next_unsent_ == tail_seq_)) {
        sender_idle_ = true;
        sender_cv_.wait(lk);
      }
      sender_idle_ = false;
      if (tail_pending_) {
        tail_pending_ = false;
        batch = tail_batch_;
        tail = true;
      } else {
        if (stop_sender_) return;  // activate() could not start the receiver
        if (!claim_batch_locked(batch)) {
          if (broken_) break;  // (no ERROR frame to send)
          continue;
        }
      }
    }
    int err = 0;
    if (tail && !tail_.empty()) {
      iovec rest{tail_.data(), tail_.size()};
      err = sendv_all(fd_.get(), &rest, 1);
    } else {
      gather(batch, iov);
      err = sendv_all(fd_.get(), iov.data(), static_cast<int>(iov.size()));
    }
    {
      std::lock_guard lk(mu_);
      finish_batch_locked(batch, err);
    }
    if (err != 0) {
      fail(errno_status(Errc::kConnectionError, "connection to " + peer_address_ + " lost: send",
                        err));
      break;
    }
    if (batch.final_error_frame) {
      ::shutdown(fd_.get(), SHUT_RDWR);
      break;
    }
  }
  // Responses never sent still pin their registrations.
  {
    std::lock_guard lk(mu_);
    for (; resp_count_ > 0; --resp_count_) {
      Response& r = responses_[resp_head_];
      if (r.reg != nullptr) table_->unpin(r.reg);
      r.reg = nullptr;
      resp_head_ = (resp_head_ + 1) % responses_.size();
    }
  }
  thread_exit();
}

// ---------------------------------------------------------------- receiver

void TcpConnection::receiver_main() {
  Status why = receive_loop();
  if (!why.ok()) fail(why);
  // Whatever the peer wrote and we placed is made durable before we go. A
  // failure here has no Read left to fail: the PersistFn's owner records and
  // logs it (transport.h).
  (void)table_->persist_all();
  thread_exit();
}

Status TcpConnection::receive_loop() {
  FrameReader rd(fd_.get());
  auto lost = [&]() {
    if (rd.err() == 0)
      return Status(Errc::kConnectionError,
                    "connection to " + peer_address_ + " lost: the peer closed the connection");
    return errno_status(Errc::kConnectionError, "connection to " + peer_address_ + " lost: recv",
                        rd.err());
  };
  auto malformed = [&](const std::string& what) {
    return Status(Errc::kProtocolError, "peer " + peer_address_ + " sent a malformed frame (" +
                                            what + "); connection closed");
  };
  uint8_t hb[kHeaderSize];
  for (;;) {
    // About to wait for the peer: answer the Reads read so far first, in
    // one sendmsg (responses to a burst of requests are batched, to a lone
    // one sent at once, without waking the sender).
    if (rd.buffered() < sizeof hb) {
      std::unique_lock lk(mu_);
      if (resp_count_ > 0) send_inline(lk);
    }
    if (!rd.read(hb, sizeof hb)) return lost();
    FrameHeader h = decode(hb);
    if (h.magic != kFrameMagic) return malformed("bad magic " + hex(h.magic));
    switch (h.type) {
      case FrameType::kWrite: {
        auto reg = table_->pin(h.rkey, h.addr, h.length, kRemoteWrite, "write");
        if (!reg.ok()) return refuse(h, Opcode::kWrite, reg.status());
        {
          // RC order: a Read answered before this Write must not see it. Its
          // READ_RESP is sent zero-copy from the registration, so wait until
          // an overlapping one has gone out.
          std::unique_lock lk(mu_);
          if (!broken_ && overlaps_pending_response_locked(h.addr, h.length)) {
            // Ours to send (they wait for the top of the loop), unless the
            // socket is busy: then its holder leaves them to the sender.
            send_inline(lk);
          }
          while (!broken_ && overlaps_pending_response_locked(h.addr, h.length)) {
            receiver_waits_resp_ = true;
            receiver_cv_.wait(lk);
          }
          receiver_waits_resp_ = false;
          if (broken_) {
            lk.unlock();
            table_->unpin(*reg);
            return Status::Ok();
          }
        }
        // Checked above: [addr, +length) lies inside the pinned registration.
        // Small payloads are copied from the read buffer: a fault on the
        // registration's memory there (a volume whose file was truncated,
        // a media error) is caught and refuses this Write (pmirrord
        // installs the handler; see common/fault.h). Large ones are
        // received into it by the kernel, which says EFAULT instead.
        auto* dest = reinterpret_cast<void*>(h.addr);
        bool ok = false;
        auto fault = fault::guarded(dest, h.length, [&] { ok = rd.read(dest, h.length); });
        if (!fault && !ok && rd.err() == EFAULT) fault = fault::Fault{rd.failed_at(), 0, EFAULT};
        if (fault) {
          table_->unpin(*reg);
          return refuse(h, Opcode::kWrite, fault::report(*fault));
        }
        if ((reg.value()->access & kPersistEachWrite) != 0) {
          // Durable before the next frame executes: placement order is
          // durability order (transport.h).
          if (!ok) {
            table_->unpin(*reg);
            return lost();
          }
          if (Status persisted = table_->unpin_persisted(*reg, h.addr, h.length); !persisted.ok())
            return refuse(h, Opcode::kWrite, persisted);
          break;
        }
        bool persist_now = table_->unpin_written(*reg, h.addr, h.length);
        if (!ok) return lost();
        if (persist_now) {
          if (Status persisted = table_->persist_all(); !persisted.ok())
            return refuse(h, Opcode::kWrite, persisted);
        }
        break;
      }
      case FrameType::kReadReq: {
        auto reg = table_->pin(h.rkey, h.addr, h.length, kRemoteRead, "read");
        if (!reg.ok()) return refuse(h, Opcode::kRead, reg.status());
        // RC ordering + tcp durability: Writes before this Read are persisted
        // before the Read is answered -- or it is refused: a flush that did
        // not make them durable must not complete.
        if (Status persisted = table_->persist_all(); !persisted.ok()) {
          table_->unpin(*reg);
          return refuse(h, Opcode::kRead, persisted);
        }
        enum { kQueued, kBroken, kOverflow } outcome = kQueued;
        {
          std::unique_lock lk(mu_);
          if (broken_) {
            outcome = kBroken;
          } else if (resp_count_ + 1 >= responses_.size()) {  // one spare for ERROR
            outcome = kOverflow;
          } else {
            Response& r = responses_[(resp_head_ + resp_count_) % responses_.size()];
            FrameHeader rh;
            rh.type = FrameType::kReadResp;
            rh.seq = h.seq;
            rh.wr_id = h.wr_id;
            rh.length = h.length;
            encode(rh, r.header.data());
            r.reg = *reg;
            r.data = reinterpret_cast<const std::byte*>(h.addr);
            r.length = h.length;
            if (h.length <= r.copied.size()) {
              // Copied now (a fault on the registration's memory refuses
              // the Read, as a Write's would): not in the way of a Write.
              auto fault = fault::guarded(reinterpret_cast<void*>(h.addr), h.length, [&] {
                std::memcpy(r.copied.data(), r.data, h.length);
              });
              if (fault) {
                r.reg = nullptr;
                lk.unlock();
                table_->unpin(*reg);
                return refuse(h, Opcode::kRead, fault::report(*fault));
              }
              r.data = r.copied.data();
            }
            ++resp_count_;
            // Sent by this thread before it next waits for the peer (the
            // top of the loop): the flush's round trip crosses no hand-off.
          }
        }
        if (outcome != kQueued) {
          table_->unpin(*reg);
          if (outcome == kOverflow)
            return malformed("more reads in flight than its declared max_outstanding " +
                             std::to_string(peer_.max_outstanding));
          return Status::Ok();
        }
        break;
      }
      case FrameType::kSend: {
        if (h.length > options_.message_size)
          return refuse(
              h, Opcode::kSend,
              Status(Errc::kInvalidArgument, "message of " + std::to_string(h.length) +
                                                 " bytes exceeds the receive buffer size " +
                                                 std::to_string(options_.message_size)));
        uint32_t slot;
        {
          std::unique_lock lk(mu_);
          // The Reads read so far are answered before the Send is delivered:
          // its completion wakes the application (a Commit after a persist's
          // flush Read), which may take this core before the answer left.
          // And before an RNR stop (the peer may wait for them).
          if (resp_count_ > 0 && !broken_) send_inline(lk);
          while (posted_count_ == 0 && !broken_) {
            receiver_waits_slot_ = true;
            receiver_cv_.wait(lk);
          }
          receiver_waits_slot_ = false;
          if (broken_) return Status::Ok();
          slot = posted_[posted_head_];
          posted_head_ = (posted_head_ + 1) % posted_.size();
          --posted_count_;
          slot_state_[slot] = SlotState::kFilling;
        }
        bool ok = rd.read(slots_.get() + size_t{slot} * options_.message_size, h.length);
        std::unique_lock lk(mu_);
        if (!ok || broken_) {
          // Back to the front of the queue, so the flush reports it.
          posted_head_ = (posted_head_ + posted_.size() - 1) % posted_.size();
          posted_[posted_head_] = slot;
          ++posted_count_;
          slot_state_[slot] = SlotState::kPosted;
          lk.unlock();
          return ok ? Status::Ok() : lost();
        }
        slot_state_[slot] = SlotState::kOwnedByApp;
        Completion c;
        c.wr_id = slot;
        c.opcode = Opcode::kRecv;
        c.byte_len = h.length;
        push_cqe_locked(std::move(c), false);
        break;
      }
      case FrameType::kReadResp: {
        std::byte* dest;
        {
          std::lock_guard lk(mu_);
          bool valid = h.seq >= head_seq_ && h.seq < tail_seq_;
          Wr* w = valid ? &ring_[h.seq % ring_.size()] : nullptr;
          if (w == nullptr || w->opcode != Opcode::kRead || !w->in_flight || w->done ||
              w->length != h.length)
            return malformed("unexpected read response seq " + std::to_string(h.seq) + ", length " +
                             std::to_string(h.length));
          dest = w->local;
        }
        if (!rd.read(dest, h.length)) return lost();
        std::lock_guard lk(mu_);
        if (!broken_) {
          ring_[h.seq % ring_.size()].done = true;
          retire_locked();
        }
        break;
      }
      case FrameType::kError: {
        if (h.length > kMaxErrorText) return malformed("error text too long");
        char text[kMaxErrorText];
        if (!rd.read(text, h.length)) return lost();
        return on_error_frame(h, std::string_view(text, h.length));
      }
      default:
        return malformed("unknown frame type " + std::to_string(static_cast<int>(h.type)));
    }
  }
}

bool TcpConnection::overlaps_pending_response_locked(uint64_t addr, uint64_t len) const {
  for (size_t i = 0; i < resp_count_; ++i) {
    const Response& r = responses_[(resp_head_ + i) % responses_.size()];
    if (r.reg == nullptr) continue;
    auto start = reinterpret_cast<uint64_t>(r.data);
    if (addr < start + r.length && start < addr + len) return true;
  }
  return false;
}

Status TcpConnection::refuse(const FrameHeader& h, Opcode op, const Status& why) {
  bool wake = false;
  {
    std::lock_guard lk(mu_);
    if (broken_) return Status::Ok();
    // A slot is always free for the ERROR frame: reads leave one spare.
    Response& r = responses_[(resp_head_ + resp_count_) % responses_.size()];
    error_text_ = why.message().substr(0, kMaxErrorText);
    FrameHeader eh;
    eh.type = FrameType::kError;
    eh.opcode = static_cast<uint8_t>(op);
    eh.errc = static_cast<uint16_t>(why.code());
    eh.seq = h.seq;
    eh.wr_id = h.wr_id;
    eh.length = static_cast<uint32_t>(error_text_.size());
    encode(eh, r.header.data());
    r.reg = nullptr;
    r.data = reinterpret_cast<const std::byte*>(error_text_.data());
    r.length = eh.length;
    ++resp_count_;
    broken_ = true;
    error_frame_pending_ = true;
    reason_ = Status(why.code(), "refused a " + std::string(opcode_name(op)) + " from peer " +
                                     peer_address_ + ": " + why.message());
    wake = true;
  }
  if (wake) sender_cv_.notify_all();
  receiver_cv_.notify_all();
  return Status::Ok();
}

Status TcpConnection::on_error_frame(const FrameHeader& h, std::string_view text) {
  auto code = static_cast<Errc>(h.errc);
  if (h.errc == 0 || h.errc > static_cast<uint16_t>(Errc::kResourceExhausted))
    code = Errc::kProtocolError;
  auto op = h.opcode <= static_cast<uint8_t>(Opcode::kRecv) ? static_cast<Opcode>(h.opcode)
                                                            : Opcode::kWrite;
  Status why(code, "peer " + peer_address_ + " refused " + std::string(opcode_name(op)) +
                       " wr_id " + std::to_string(h.wr_id) + ": " + std::string(text));
  bool shut;
  {
    // One critical section: between finding the request still in flight
    // and breaking the connection, the sender (which completes a Write once
    // it is sent) must not complete it, or its OK would be the only
    // completion and the refusal would be lost.
    std::lock_guard lk(mu_);
    uint64_t culprit = kNoSeq;
    if (h.seq >= head_seq_ && h.seq < tail_seq_ && !ring_[h.seq % ring_.size()].done) {
      culprit = h.seq;  // completes with `why` when the ring is flushed
    } else if (!broken_) {
      // Already completed (Writes complete when sent): report it separately.
      Completion c;
      c.wr_id = h.wr_id;
      c.opcode = op;
      c.status = why;
      push_cqe_locked(std::move(c), false);
    }
    shut = break_locked(why, culprit);
  }
  wake_and_shut(shut);
  return Status::Ok();
}

}  // namespace pmirror::transport::tcp
