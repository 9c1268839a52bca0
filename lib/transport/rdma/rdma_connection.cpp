#include "transport/rdma/rdma_connection.h"

#include <arpa/inet.h>
#include <endian.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/log.h"

namespace pmirror::transport::rdma {
namespace {

// Receive wr_ids carry this bit so a completion (whose opcode is undefined
// on error) is told apart from send-queue ones by wr_id alone.
constexpr uint64_t kRecvTag = uint64_t{1} << 63;
// Inline sends skip the copy into the send ring and the DMA read of it.
constexpr uint32_t kWantedInline = 128;
// IB encoding of the RNR NAK delay we ask senders to wait (12 = 0.64 ms).
constexpr uint8_t kMinRnrTimer = 12;
// Bytes of send ring at most; beyond that fewer slots than max_outstanding.
constexpr size_t kMaxSendRingBytes = size_t{64} << 20;

std::string_view op_word(Opcode op) {
  switch (op) {
    case Opcode::kWrite:
      return "RDMA write";
    case Opcode::kRead:
      return "RDMA read";
    case Opcode::kSend:
      return "send";
    case Opcode::kRecv:
      return "receive";
    case Opcode::kFlush:
      return "FLUSH";
    case Opcode::kAtomicWrite:
      return "ATOMIC WRITE";
  }
  return "operation";
}

uint32_t send_slot_count(const ConnectionOptions& o) {
  const size_t by_bytes = std::max<size_t>(1, kMaxSendRingBytes / o.message_size);
  return static_cast<uint32_t>(std::min<size_t>(o.max_outstanding, by_bytes));
}

// The file a virtual address is mapped from ("" for anonymous memory), to
// say "a mapping of /mnt/pmem/x" when registration fails.
std::string mapping_path(const void* addr) {
  std::ifstream maps("/proc/self/maps");
  const auto target = reinterpret_cast<uintptr_t>(addr);
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0;
    uintptr_t hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) != 2) continue;
    if (target < lo || target >= hi) continue;
    const auto slash = line.find('/');
    if (slash == std::string::npos) return {};
    std::string path = line.substr(slash);
    constexpr std::string_view kDeleted = " (deleted)";
    if (path.ends_with(kDeleted)) path.resize(path.size() - kDeleted.size());
    return path;
  }
  return {};
}

std::string describe_range(const void* addr, size_t len) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "[%p, +%zu)", addr, len);
  return buf;
}

Status post_recv_slot(Endpoint& ep, uint32_t slot, uint32_t message_size) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(ep.recv_block.get()) + size_t{slot} * message_size;
  sge.length = message_size;
  sge.lkey = ep.recv_mr->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = kRecvTag | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int err = ibv_post_recv(ep.qp.get(), &wr, &bad); err != 0)
    return verbs_error(Errc::kIoError, "ibv_post_recv", ep.id->verbs, err);
  return Status::Ok();
}

std::string format_peer(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa == nullptr) return "?";
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "?";
}

class RdmaMemoryRegion final : public MemoryRegion {
 public:
  RdmaMemoryRegion(std::shared_ptr<Endpoint> endpoint, Mr mr, void* addr, size_t len)
      : endpoint_(std::move(endpoint)),
        mr_(std::move(mr)),
        base_(static_cast<std::byte*>(addr)),
        length_(len) {}
  std::byte* base() const override { return base_; }
  size_t length() const override { return length_; }
  RemoteKey remote_key() const override {
    return RemoteKey{reinterpret_cast<uintptr_t>(base_), mr_->rkey, length_};
  }
  uint32_t lkey() const { return mr_->lkey; }
  const Endpoint* endpoint() const { return endpoint_.get(); }

 private:
  std::shared_ptr<Endpoint> endpoint_;  // first: outlives mr_ (PD after MR)
  Mr mr_;
  std::byte* base_;
  size_t length_;
};

}  // namespace

// ---- WireParams -------------------------------------------------------------

std::array<uint8_t, WireParams::kSize> WireParams::encode() const {
  std::array<uint8_t, kSize> out{};
  const uint32_t magic = htole32(kMagic);
  const uint16_t version = htole16(kVersion);
  const uint16_t k = htole16(kind);
  const uint32_t ms = htole32(message_size);
  const uint32_t rs = htole32(recv_slots);
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &version, 2);
  std::memcpy(out.data() + 6, &k, 2);
  std::memcpy(out.data() + 8, &ms, 4);
  std::memcpy(out.data() + 12, &rs, 4);
  return out;
}

Result<WireParams> WireParams::decode(const void* data, size_t len) {
  if (data == nullptr || len < kSize)
    return Status(Errc::kProtocolError, "peer sent no pmirror connection parameters (" +
                                            std::to_string(len) + " bytes of private data)");
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t k = 0;
  uint32_t ms = 0;
  uint32_t rs = 0;
  std::memcpy(&magic, p, 4);
  std::memcpy(&version, p + 4, 2);
  std::memcpy(&k, p + 6, 2);
  std::memcpy(&ms, p + 8, 4);
  std::memcpy(&rs, p + 12, 4);
  if (le32toh(magic) != kMagic)
    return Status(Errc::kProtocolError,
                  "peer is not a pmirror rdma endpoint (wrong magic in private data)");
  if (le16toh(version) != kVersion)
    return Status(Errc::kProtocolError, "peer speaks rdma connection version " +
                                            std::to_string(le16toh(version)) + ", we speak " +
                                            std::to_string(kVersion));
  WireParams params;
  params.kind = le16toh(k);
  params.message_size = le32toh(ms);
  params.recv_slots = le32toh(rs);
  if (params.kind == kParams && (params.message_size == 0 || params.recv_slots == 0))
    return Status(Errc::kProtocolError, "peer announced zero message_size or recv_slots");
  return params;
}

// ---- Endpoint ---------------------------------------------------------------

namespace {

// rdma_create_qp, retried without inline data (some devices cap it below
// what we ask; inline is optional). Where the device offers FLUSH or ATOMIC
// WRITE and this build can post them, the QP is made for the ibv_wr_* API
// with those operations (rdma_create_qp_ex, send_ops_flags); a device that
// refuses that gets the plain QP, and the connection says it cannot post
// them.
Status create_qp(Endpoint& ep, ibv_qp_init_attr& init) {
  rdma_cm_id* cm = ep.id.get();
#ifdef PMIRROR_HAVE_IBV_WR_FLUSH
  uint64_t native = 0;
  if (ep.fabric.flush_persistent) native |= IBV_QP_EX_WITH_FLUSH;
  if (ep.fabric.atomic_write) native |= IBV_QP_EX_WITH_ATOMIC_WRITE;
  if (native != 0) {
    for (uint32_t inline_bytes : {init.cap.max_inline_data, 0u}) {
      ibv_qp_init_attr_ex ex{};
      ex.send_cq = init.send_cq;
      ex.recv_cq = init.recv_cq;
      ex.qp_type = init.qp_type;
      ex.sq_sig_all = init.sq_sig_all;
      ex.cap = init.cap;
      ex.cap.max_inline_data = inline_bytes;
      ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      ex.pd = ep.pd.get();
      ex.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
                          IBV_QP_EX_WITH_SEND | native;
      if (rdma_create_qp_ex(cm, &ex) != 0) continue;
      ep.qpx = ibv_qp_to_qp_ex(cm->qp);
      if (ep.qpx == nullptr) {  // a provider without the API after all
        rdma_destroy_qp(cm);
        break;
      }
      ep.max_inline = ex.cap.max_inline_data;
      ep.fabric.can_post_flush = ep.fabric.flush_persistent;
      ep.fabric.can_post_atomic_write = ep.fabric.atomic_write;
      return Status::Ok();
    }
    log::debug("rdma: {} offers FLUSH / ATOMIC WRITE but made no QP for them ({}); "
               "a plain QP instead",
               ep.device, std::strerror(errno));
  }
#endif
  if (rdma_create_qp(cm, ep.pd.get(), &init) != 0) {
    init.cap.max_inline_data = 0;
    if (rdma_create_qp(cm, ep.pd.get(), &init) != 0)
      return verbs_error(Errc::kIoError, "rdma_create_qp", cm->verbs, errno);
  }
  ep.max_inline = init.cap.max_inline_data;
  return Status::Ok();
}

}  // namespace

Status build_endpoint(Endpoint& endpoint, const ConnectionOptions& o) {
  Endpoint* ep = &endpoint;
  rdma_cm_id* cm = ep->id.get();
  ibv_context* ctx = cm->verbs;
  if (ctx == nullptr)
    return Status(Errc::kInternal, "rdma_cm id is not bound to a device after address resolution");
  ep->device = device_name(ctx);
  ep->peer = format_peer(rdma_get_peer_addr(cm));

  ibv_device_attr attr{};
  if (int err = ibv_query_device(ctx, &attr); err != 0)
    return verbs_error(Errc::kIoError, "ibv_query_device", ctx, err);
  ibv_port_attr port{};
  if (int err = ibv_query_port(ctx, cm->port_num, &port); err != 0)
    return verbs_error(Errc::kIoError, "ibv_query_port", ctx, err);
  ep->max_msg_size = port.max_msg_sz != 0 ? port.max_msg_sz : (uint32_t{1} << 31);

  const uint64_t cqe = uint64_t{o.max_outstanding} + o.recv_slots;
  if (o.max_outstanding > static_cast<uint32_t>(attr.max_qp_wr) ||
      o.recv_slots > static_cast<uint32_t>(attr.max_qp_wr))
    return Status(Errc::kInvalidArgument, "max_outstanding " + std::to_string(o.max_outstanding) +
                                              " / recv_slots " + std::to_string(o.recv_slots) +
                                              " exceed " + ep->device + "'s max_qp_wr " +
                                              std::to_string(attr.max_qp_wr));
  if (cqe > static_cast<uint64_t>(attr.max_cqe))
    return Status(Errc::kInvalidArgument, "max_outstanding + recv_slots = " + std::to_string(cqe) +
                                              " exceeds " + ep->device + "'s max_cqe " +
                                              std::to_string(attr.max_cqe));

  // ODP lets registration work on memory the kernel will not pin (fsdax).
  ep->odp_rc_read_write = device_has_rc_odp(ctx);
  ep->fabric = device_fabric_persistence(ctx);

  ep->pd = Pd(ibv_alloc_pd(ctx));
  if (!ep->pd) return verbs_error(Errc::kIoError, "ibv_alloc_pd", ctx, errno);

  const size_t recv_bytes = size_t{o.recv_slots} * o.message_size;
  const size_t send_bytes = size_t{send_slot_count(o)} * o.message_size;
  ep->recv_block = allocate_aligned(recv_bytes);
  ep->send_block = allocate_aligned(send_bytes);
  if (!ep->recv_block || !ep->send_block)
    return Status(Errc::kResourceExhausted, "cannot allocate " +
                                                std::to_string(recv_bytes + send_bytes) +
                                                " bytes of send/receive buffers");
  ep->recv_mr =
      Mr(ibv_reg_mr(ep->pd.get(), ep->recv_block.get(), recv_bytes, IBV_ACCESS_LOCAL_WRITE));
  if (!ep->recv_mr) return verbs_error(Errc::kIoError, "ibv_reg_mr (receive slots)", ctx, errno);
  ep->send_mr = Mr(ibv_reg_mr(ep->pd.get(), ep->send_block.get(), send_bytes, 0));
  if (!ep->send_mr) return verbs_error(Errc::kIoError, "ibv_reg_mr (send ring)", ctx, errno);

  ep->comp = CompChannel(ibv_create_comp_channel(ctx));
  if (!ep->comp) return verbs_error(Errc::kIoError, "ibv_create_comp_channel", ctx, errno);
  PMIRROR_RETURN_IF_ERROR(set_nonblocking(ep->comp->fd, "the completion channel"));
  ep->cq = Cq(ibv_create_cq(ctx, static_cast<int>(cqe), nullptr, ep->comp.get(), 0));
  if (!ep->cq) return verbs_error(Errc::kIoError, "ibv_create_cq", ctx, errno);

  ibv_qp_init_attr init{};
  init.send_cq = ep->cq.get();
  init.recv_cq = ep->cq.get();
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = o.max_outstanding;
  init.cap.max_recv_wr = o.recv_slots;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = kWantedInline;
  PMIRROR_RETURN_IF_ERROR(create_qp(*ep, init));
  ep->qp = Qp(cm);
  log::debug(
      "rdma: QP on {} port {}: max_inline {}, max_msg_sz {}, ODP {}; FLUSH global {} "
      "persistent {}, ATOMIC WRITE {} (on ODP: FLUSH {}, ATOMIC WRITE {}; verbs here: {}; "
      "this QP posts FLUSH {}, ATOMIC WRITE {})",
      ep->device, cm->port_num, ep->max_inline, ep->max_msg_size, ep->odp_rc_read_write,
      ep->fabric.flush_global, ep->fabric.flush_persistent, ep->fabric.atomic_write,
      ep->fabric.odp_flush, ep->fabric.odp_atomic_write, ep->fabric.verbs_api,
      ep->fabric.can_post_flush, ep->fabric.can_post_atomic_write);

  // Every receive is posted before the connection is accepted/established,
  // so the peer's first send never meets an empty receive queue.
  for (uint32_t slot = 0; slot < o.recv_slots; ++slot)
    PMIRROR_RETURN_IF_ERROR(post_recv_slot(*ep, slot, o.message_size));
  return Status::Ok();
}

void device_rd_atomic(const Endpoint& endpoint, uint8_t* initiator_depth,
                      uint8_t* responder_resources) {
  ibv_device_attr attr{};
  int init = 1;
  int resp = 1;
  if (ibv_query_device(endpoint.id->verbs, &attr) == 0) {
    init = std::clamp(attr.max_qp_init_rd_atom, 1, 16);
    resp = std::clamp(attr.max_qp_rd_atom, 1, 16);
  }
  *initiator_depth = static_cast<uint8_t>(init);
  *responder_resources = static_cast<uint8_t>(resp);
}

// ---- RdmaConnection ---------------------------------------------------------

RdmaConnection::RdmaConnection(std::shared_ptr<Endpoint> endpoint, const ConnectionOptions& options,
                               const WireParams& peer,
                               std::unique_ptr<AdmissionControl::Ticket> ticket)
    : endpoint_(std::move(endpoint)),
      options_(options),
      send_limit_(std::min(options.message_size, peer.message_size)),
      sq_depth_(options.max_outstanding),
      signal_every_(std::max<uint32_t>(1, options.max_outstanding / 4)),
      ring_(options.max_outstanding),
      recv_posted_(options.recv_slots, true),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      spin_(options.poll_mode),
      ticket_(std::move(ticket)) {
  if (!wake_fd_.valid())
    log::warn("rdma: eventfd for the connection to {}: {}; a wake waits for the poller's timeout",
              endpoint_->peer, std::strerror(errno));
  // rdma_cm leaves min_rnr_timer at 0, which IB encodes as 655 ms: a sender
  // that meets an empty receive queue would pause that long. 12 = 0.64 ms.
  // (Allowed RTS->RTS; a device that refuses keeps working, just slower.)
  ibv_qp_attr attr{};
  attr.min_rnr_timer = kMinRnrTimer;
  if (int err = ibv_modify_qp(endpoint_->qp.get(), &attr, IBV_QP_MIN_RNR_TIMER); err != 0)
    log::warn("rdma: ibv_modify_qp(min_rnr_timer) on {}: {}; RNR waits stay at 655 ms",
              endpoint_->device, std::strerror(err));
  const uint32_t slots = send_slot_count(options);
  free_send_slots_.reserve(slots);
  for (uint32_t s = slots; s > 0; --s) free_send_slots_.push_back(s - 1);
}

RdmaConnection::~RdmaConnection() {
  // First: the listener may disconnect our id until the ticket is gone.
  ticket_.reset();
  shutdown();
}

Status RdmaConnection::activate() {
  if (ticket_ == nullptr) return Status::Ok();
  ticket_->release();
  bool evicted = ticket_->evicted();
  ticket_.reset();
  std::lock_guard lock(mu_);
  if (evicted && !broken_)
    mark_broken_locked(Errc::kClosed, "connection from " + endpoint_->peer +
                                          " was closed to make room for newer connections (too "
                                          "many unauthenticated connections)");
  if (broken_) return flushed_status_locked("activate");
  return Status::Ok();
}

Result<std::unique_ptr<MemoryRegion>> RdmaConnection::register_memory(void* addr, size_t len,
                                                                      uint32_t access,
                                                                      PersistFn /*persist*/) {
  if (addr == nullptr || len == 0)
    return Status(Errc::kInvalidArgument, "register_memory: empty range");
  if ((access & kPersistEachWrite) != 0)
    return Status(Errc::kUnsupported,
                  "register_memory: rdma cannot persist each Write (the NIC places data without "
                  "the CPU)");
  PMIRROR_ASSIGN_OR_RETURN(const int flags, access_flags(access));
  if ((access & kRemoteFlush) != 0 && !endpoint_->fabric.flush_persistent)
    return Status(Errc::kUnsupported, "register_memory: " + endpoint_->device +
                                          " offers no FLUSH to persistence");
  if ((access & kRemoteAtomicWrite) != 0 && !endpoint_->fabric.atomic_write)
    return Status(Errc::kUnsupported,
                  "register_memory: " + endpoint_->device + " offers no ATOMIC WRITE");

  const Endpoint& ep = *endpoint_;
  const std::string path = mapping_path(addr);
  const bool file_backed = !path.empty() && path.rfind("/dev/dax", 0) != 0;
  std::string what = "cannot register " + describe_range(addr, len);
  if (!path.empty()) what += " (a mapping of " + path + ")";
  what += " with " + ep.device;
  PMIRROR_ASSIGN_OR_RETURN(Mr mr, register_memory_region(ep.pd.get(), ep.id->verbs,
                                                         ep.odp_rc_read_write, addr, len, flags,
                                                         file_backed, what));
  return std::unique_ptr<MemoryRegion>(new RdmaMemoryRegion(endpoint_, std::move(mr), addr, len));
}

Status RdmaConnection::check_open_locked() const {
  if (!broken_) return Status::Ok();
  return Status(Errc::kClosed, "connection is closed: " + broken_reason_.message());
}

Status RdmaConnection::post_write(const MemoryRegion& local, size_t local_offset, size_t len,
                                  const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id,
                                  bool signaled) {
  const WorkRequest request =
      WorkRequest::write(local, local_offset, len, remote, remote_offset, wr_id, signaled);
  return post_requests({&request, 1});
}

Status RdmaConnection::post_read(const MemoryRegion& local, size_t local_offset, size_t len,
                                 const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id) {
  const WorkRequest request =
      WorkRequest::read(local, local_offset, len, remote, remote_offset, wr_id);
  return post_requests({&request, 1});
}

Status RdmaConnection::post_send(std::span<const std::byte> message, uint64_t wr_id) {
  const WorkRequest request = WorkRequest::send(message, wr_id);
  return post_requests({&request, 1});
}

Result<size_t> RdmaConnection::post_list(std::span<const WorkRequest> requests) {
  Status status = post_requests(requests);
  if (status.code() == Errc::kResourceExhausted) return size_t{0};
  PMIRROR_RETURN_IF_ERROR(status);
  return requests.size();
}

Result<size_t> RdmaConnection::check_request(const WorkRequest& request) const {
  const std::string_view what = op_word(request.opcode);
  if (request.opcode == Opcode::kSend) {
    if (request.message.size() > send_limit_)
      return Status(Errc::kInvalidArgument,
                    "send of " + std::to_string(request.message.size()) +
                        " bytes exceeds the limit of " + std::to_string(send_limit_) +
                        " bytes (our message_size and the peer's receive buffers)");
    return size_t{1};
  }
  if (request.opcode == Opcode::kRecv)
    return Status(Errc::kInvalidArgument, "a receive is not posted, it is reposted");
  if (request.opcode == Opcode::kFlush || request.opcode == Opcode::kAtomicWrite) {
    const FabricPersistence& fabric = endpoint_->fabric;
    const bool flush = request.opcode == Opcode::kFlush;
    if (!(flush ? fabric.can_post_flush : fabric.can_post_atomic_write)) {
      const bool device_has = flush ? fabric.flush_persistent : fabric.atomic_write;
      return Status(Errc::kUnsupported,
                    std::string(what) + ": " +
                        (!device_has ? endpoint_->device + " does not offer it"
                         : !fabric.verbs_api
                             ? "this build of pmirror (against rdma-core < 45) cannot post it"
                             : "the queue pair could not be made for it"));
    }
    if (flush) {
      if (request.length == 0)
        return Status(Errc::kInvalidArgument, std::string(what) + " of no bytes");
      const uint64_t piece_max = endpoint_->max_msg_size;
      return static_cast<size_t>((request.length + piece_max - 1) / piece_max);
    }
    if ((request.remote.address + request.remote_offset) % sizeof(uint64_t) != 0)
      return Status(Errc::kInvalidArgument,
                    std::string(what) + ": the remote address is not 8-byte aligned");
    return size_t{1};
  }
  const auto* region =
      request.local == nullptr ? nullptr : dynamic_cast<const RdmaMemoryRegion*>(request.local);
  if (region == nullptr)
    return Status(
        Errc::kInvalidArgument,
        std::string(what) + ": the local region was not registered by the rdma transport");
  if (region->endpoint() != endpoint_.get())
    return Status(Errc::kInvalidArgument,
                  std::string(what) + ": the local region is registered on another connection");
  const size_t offset = request.local_offset, len = request.length;
  if (offset > region->length() || len > region->length() - offset)
    return Status(Errc::kInvalidArgument, std::string(what) + ": local range [" +
                                              std::to_string(offset) + ", +" + std::to_string(len) +
                                              ") exceeds the region (" +
                                              std::to_string(region->length()) + " bytes)");
  // The NIC enforces the remote bounds: a bad rkey or range fails the
  // operation with an error completion (remote access error).
  // One WR moves at most the port's max_msg_sz; larger requests are split.
  const uint64_t piece_max = endpoint_->max_msg_size;
  return len == 0 ? size_t{1} : static_cast<size_t>((len + piece_max - 1) / piece_max);
}

Status RdmaConnection::post_requests(std::span<const WorkRequest> requests) {
  const std::string_view what = requests.size() == 1 ? op_word(requests[0].opcode) : "post_list";
  // Checked whole before anything is posted: a list goes out entirely or
  // not at all.
  size_t total = 0, buffered_sends = 0;
  for (const WorkRequest& request : requests) {
    PMIRROR_ASSIGN_OR_RETURN(size_t pieces, check_request(request));
    total += pieces;
    if (request.opcode == Opcode::kSend && request.message.size() > endpoint_->max_inline)
      ++buffered_sends;
  }

  std::lock_guard lock(mu_);
  PMIRROR_RETURN_IF_ERROR(check_open_locked());
  if (total > sq_depth_)
    return Status(Errc::kInvalidArgument, std::string(what) + " needs " + std::to_string(total) +
                                              " work requests, more than max_outstanding");
  if (next_seq_ - tail_seq_ + total > sq_depth_) {
    starved_ = true;
    return Status(Errc::kResourceExhausted, std::string(what) + ": send queue full (" +
                                                std::to_string(next_seq_ - tail_seq_) +
                                                " work requests in flight, max_outstanding " +
                                                std::to_string(sq_depth_) +
                                                "); poll for completions and retry");
  }
  if (buffered_sends > free_send_slots_.size()) {
    starved_ = true;
    return Status(
        Errc::kResourceExhausted,
        std::string(what) + ": all send buffers are in flight; poll for completions and retry");
  }

  // Scratch reused from post to post (no allocation once grown); the sges
  // are sized first so that the WRs' pointers into them stay valid.
  sge_scratch_.resize(total);
  wr_scratch_.resize(total);
  wr_extra_scratch_.resize(total);
  const uint64_t piece_max = endpoint_->max_msg_size;
  uint32_t run = unsignaled_run_;
  size_t n = 0;
  bool extended = false;
  for (const WorkRequest& request : requests) {
    if (request.opcode == Opcode::kFlush || request.opcode == Opcode::kAtomicWrite) {
#ifdef PMIRROR_HAVE_IBV_WR_FLUSH
      extended = true;
      const bool flush = request.opcode == Opcode::kFlush;
      const size_t len = flush ? request.length : sizeof(uint64_t);
      const size_t pieces = flush ? static_cast<size_t>((len + piece_max - 1) / piece_max) : 1;
      for (size_t i = 0; i < pieces; ++i) {
        ibv_send_wr& wr = wr_scratch_[n];
        wr = ibv_send_wr{};
        const uint64_t seq = next_seq_ + n;
        const bool last = i + 1 == pieces;
        // An ATOMIC WRITE always completes, a FLUSH as asked (and every
        // signal_every_, as Writes, so that the queue drains).
        const bool wanted = last && (!flush || request.signaled);
        const bool sig = wanted || run + 1 >= signal_every_;
        run = sig ? 0 : run + 1;
        ring_[seq % sq_depth_] = WrRecord{request.wr_id, request.opcode, wanted, last, -1};
        const uint64_t off = uint64_t{i} * piece_max;
        wr.wr_id = seq;
        wr.opcode = flush ? IBV_WR_FLUSH : IBV_WR_ATOMIC_WRITE;
        wr.send_flags =
            (sig ? IBV_SEND_SIGNALED : 0) | (request.fence && i == 0 ? IBV_SEND_FENCE : 0);
        wr.wr.rdma.remote_addr = request.remote.address + request.remote_offset + off;
        wr.wr.rdma.rkey = request.remote.rkey;
        wr_extra_scratch_[n] = flush ? std::min<uint64_t>(piece_max, len - off) : request.value;
        ++n;
      }
      continue;
#endif
    }
    if (request.opcode == Opcode::kSend) {
      ibv_sge& sge = sge_scratch_[n];
      ibv_send_wr& wr = wr_scratch_[n];
      sge = ibv_sge{};
      wr = ibv_send_wr{};
      int32_t slot = -1;
      const auto& message = request.message;
      wr.send_flags = IBV_SEND_SIGNALED;  // sends always complete: the slot is reused then
      if (message.size() <= endpoint_->max_inline) {
        // Inline: the provider copies the bytes into the WQE during the post.
        sge.addr = reinterpret_cast<uintptr_t>(message.data());
        wr.send_flags |= IBV_SEND_INLINE;
      } else {
        slot = static_cast<int32_t>(free_send_slots_.back());
        free_send_slots_.pop_back();
        std::byte* dst = endpoint_->send_block.get() + size_t(slot) * options_.message_size;
        std::memcpy(dst, message.data(), message.size());
        sge.addr = reinterpret_cast<uintptr_t>(dst);
        sge.lkey = endpoint_->send_mr->lkey;
      }
      sge.length = static_cast<uint32_t>(message.size());
      const uint64_t seq = next_seq_ + n;
      ring_[seq % sq_depth_] = WrRecord{request.wr_id, Opcode::kSend, true, true, slot};
      wr.wr_id = seq;
      wr.sg_list = &sge;
      wr.num_sge = message.empty() ? 0 : 1;
      wr.opcode = IBV_WR_SEND;
      run = 0;
      ++n;
      continue;
    }
    const auto* region = static_cast<const RdmaMemoryRegion*>(request.local);
    const size_t len = request.length;
    const size_t pieces = len == 0 ? 1 : static_cast<size_t>((len + piece_max - 1) / piece_max);
    // A small Write travels in the WQE itself: no DMA read of the source.
    const bool inline_write =
        request.opcode == Opcode::kWrite && pieces == 1 && len > 0 && len <= endpoint_->max_inline;
    for (size_t i = 0; i < pieces; ++i) {
      ibv_sge& sge = sge_scratch_[n];
      ibv_send_wr& wr = wr_scratch_[n];
      sge = ibv_sge{};
      wr = ibv_send_wr{};
      const uint64_t seq = next_seq_ + n;
      const bool last = i + 1 == pieces;
      const bool wanted = last && (request.opcode == Opcode::kRead || request.signaled);
      // Unsignaled WRs hold SQ slots until a later signaled one completes;
      // signal every signal_every_ so the queue always drains.
      const bool sig = wanted || run + 1 >= signal_every_;
      run = sig ? 0 : run + 1;
      ring_[seq % sq_depth_] = WrRecord{request.wr_id, request.opcode, wanted, last, -1};

      const uint64_t off = uint64_t{i} * piece_max;
      sge.addr = reinterpret_cast<uintptr_t>(region->base()) + request.local_offset + off;
      sge.length = static_cast<uint32_t>(std::min<uint64_t>(piece_max, len - off));
      sge.lkey = region->lkey();
      wr.wr_id = seq;
      wr.sg_list = &sge;
      wr.num_sge = len == 0 ? 0 : 1;
      wr.opcode = request.opcode == Opcode::kWrite ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
      wr.send_flags = (sig ? IBV_SEND_SIGNALED : 0) | (inline_write ? IBV_SEND_INLINE : 0) |
                      (request.fence && i == 0 ? IBV_SEND_FENCE : 0);
      wr.wr.rdma.remote_addr = request.remote.address + request.remote_offset + off;
      wr.wr.rdma.rkey = request.remote.rkey;
      ++n;
    }
  }
  for (size_t i = 0; i + 1 < n; ++i) wr_scratch_[i].next = &wr_scratch_[i + 1];
  wr_scratch_[n - 1].next = nullptr;
  return post_chain_locked(std::span(wr_scratch_.data(), n), what, extended);
}

#ifdef PMIRROR_HAVE_IBV_WR_FLUSH
// The chain through the ibv_wr_* API: every WR of it, since ibv_post_send
// cannot carry a FLUSH's type and level. All or nothing: ibv_wr_complete
// posts the whole batch or none of it.
Status RdmaConnection::post_extended_locked(std::span<ibv_send_wr> wrs, size_t* posted) {
  ibv_qp_ex* qpx = endpoint_->qpx;
  *posted = 0;
  ibv_wr_start(qpx);
  for (size_t i = 0; i < wrs.size(); ++i) {
    const ibv_send_wr& wr = wrs[i];
    qpx->wr_id = wr.wr_id;
    // IBV_SEND_INLINE stays: ibv_wr_set_inline_data alone is enough for
    // some providers, but rxe's kernel side reads the flag to tell inline
    // bytes from a scatter list (found in the 6.12 guest).
    qpx->wr_flags = wr.send_flags;
    const uint32_t rkey = wr.wr.rdma.rkey;
    const uint64_t remote = wr.wr.rdma.remote_addr;
    switch (wr.opcode) {
      case IBV_WR_FLUSH:
        ibv_wr_flush(qpx, rkey, remote, wr_extra_scratch_[i], IBV_FLUSH_PERSISTENT,
                     IBV_FLUSH_RANGE);
        continue;
      case IBV_WR_ATOMIC_WRITE:
        ibv_wr_atomic_write(qpx, rkey, remote, &wr_extra_scratch_[i]);
        continue;
      case IBV_WR_RDMA_WRITE:
        ibv_wr_rdma_write(qpx, rkey, remote);
        break;
      case IBV_WR_RDMA_READ:
        ibv_wr_rdma_read(qpx, rkey, remote);
        break;
      default:  // IBV_WR_SEND: the only other opcode post_requests makes
        ibv_wr_send(qpx);
        break;
    }
    if (wr.num_sge == 0) {
      ibv_wr_set_sge_list(qpx, 0, nullptr);
    } else if ((wr.send_flags & IBV_SEND_INLINE) != 0) {
      ibv_wr_set_inline_data(qpx, reinterpret_cast<void*>(wr.sg_list->addr), wr.sg_list->length);
    } else {
      ibv_wr_set_sge(qpx, wr.sg_list->lkey, wr.sg_list->addr, wr.sg_list->length);
    }
  }
  const int err = ibv_wr_complete(qpx);
  if (err == 0) *posted = wrs.size();
  return err == 0 ? Status::Ok()
                  : verbs_error(err == ENOMEM ? Errc::kResourceExhausted : Errc::kIoError,
                                "ibv_wr_complete", endpoint_->id->verbs, err);
}
#else
Status RdmaConnection::post_extended_locked(std::span<ibv_send_wr> /*wrs*/, size_t* posted) {
  *posted = 0;
  return Status(Errc::kUnsupported, "this build cannot post FLUSH or ATOMIC WRITE");
}
#endif

Status RdmaConnection::post_chain_locked(std::span<ibv_send_wr> wrs, std::string_view what,
                                         bool extended) {
  if (extended) {
    size_t posted = 0;
    Status status = post_extended_locked(wrs, &posted);
    if (status.ok()) {
      for (const ibv_send_wr& wr : wrs)
        unsignaled_run_ = (wr.send_flags & IBV_SEND_SIGNALED) != 0 ? 0 : unsignaled_run_ + 1;
      next_seq_ += posted;
      return status;
    }
    for (const ibv_send_wr& wr : wrs) {
      WrRecord& record = ring_[wr.wr_id % sq_depth_];
      if (record.send_slot >= 0)
        free_send_slots_.push_back(static_cast<uint32_t>(record.send_slot));
      record.send_slot = -1;
    }
    return status.with_context(std::string(what));
  }
  ibv_send_wr* bad = nullptr;
  const int err = ibv_post_send(endpoint_->qp.get(), wrs.data(), &bad);
  const size_t posted = err == 0 ? wrs.size() : (bad != nullptr ? bad - wrs.data() : 0);
  for (size_t i = 0; i < posted; ++i)
    unsignaled_run_ = (wrs[i].send_flags & IBV_SEND_SIGNALED) != 0 ? 0 : unsignaled_run_ + 1;
  next_seq_ += posted;
  if (err == 0) return Status::Ok();
  // The send buffers of what was not posted are free again.
  for (size_t i = posted; i < wrs.size(); ++i) {
    WrRecord& record = ring_[wrs[i].wr_id % sq_depth_];
    if (record.send_slot >= 0) free_send_slots_.push_back(static_cast<uint32_t>(record.send_slot));
    record.send_slot = -1;
  }
  // ENOMEM with nothing posted is a full queue (post again later); after
  // part of the list was posted it is not: that part is in flight and cannot
  // be taken back, so the connection is broken, and kResourceExhausted --
  // which post_list reports as "none posted" -- would be a lie.
  Status status =
      verbs_error(err == ENOMEM && posted == 0 ? Errc::kResourceExhausted : Errc::kIoError,
                  "ibv_post_send (" + std::string(what) + ")", endpoint_->id->verbs, err);
  if (posted > 0) {
    mark_broken_locked(Errc::kIoError,
                       status.message() + " after part of the operation was posted");
  }
  return status;
}

void RdmaConnection::reclaim_through_locked(uint64_t seq) {
  if (seq >= tail_seq_ && starved_) room_freed_ = true;
  for (; tail_seq_ <= seq; ++tail_seq_) {
    WrRecord& rec = ring_[tail_seq_ % sq_depth_];
    if (rec.send_slot >= 0) free_send_slots_.push_back(static_cast<uint32_t>(rec.send_slot));
    rec.send_slot = -1;
  }
}

void RdmaConnection::mark_broken_locked(Errc code, std::string reason) {
  if (broken_) return;
  broken_ = true;
  broken_reason_ = Status(code, std::move(reason));
  // Moves our QP to the error state (posted work is flushed) and tells the
  // peer; also completes the handshake when the peer disconnected first.
  rdma_disconnect(endpoint_->id.get());
}

size_t RdmaConnection::drain_cq_locked(std::span<Completion> out) {
  size_t n = 0;
  ibv_wc wcs[16];
  while (n < out.size()) {
    // Each work completion yields at most one Completion, so asking for no
    // more than the room left never loses one.
    const int want = static_cast<int>(std::min<size_t>(16, out.size() - n));
    const int got = ibv_poll_cq(endpoint_->cq.get(), want, wcs);
    if (got < 0) {
      mark_broken_locked(Errc::kIoError, "ibv_poll_cq on " + endpoint_->device + " failed");
      break;
    }
    if (got == 0) break;
    for (int i = 0; i < got; ++i) {
      const ibv_wc& wc = wcs[i];
      const bool ok = wc.status == IBV_WC_SUCCESS;
      const bool flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
      if ((wc.wr_id & kRecvTag) != 0) {
        const auto slot = static_cast<uint32_t>(wc.wr_id & ~kRecvTag);
        // Not posted: its error was already synthesized (see below).
        if (slot >= recv_posted_.size() || !recv_posted_[slot]) continue;
        recv_posted_[slot] = false;
        if (ok) {
          out[n++] = Completion{slot, Opcode::kRecv, Status::Ok(), wc.byte_len};
          continue;
        }
        if (!flushed)
          mark_broken_locked(Errc::kConnectionError, "receive into slot " + std::to_string(slot) +
                                                         " failed on " + endpoint_->device + ": " +
                                                         ibv_wc_status_str(wc.status));
        else
          mark_broken_locked(Errc::kConnectionError,
                             "connection to " + endpoint_->peer + " left the connected state");
        // As verbs does: every posted receive slot completes in error.
        out[n++] = Completion{slot, Opcode::kRecv, flushed_status_locked("receive"), 0};
        continue;
      }
      const uint64_t seq = wc.wr_id;
      if (seq < tail_seq_ || seq >= next_seq_) continue;  // already reported as failed
      const WrRecord rec = ring_[seq % sq_depth_];
      reclaim_through_locked(seq);
      if (ok) {
        if (rec.report)
          out[n++] = Completion{rec.user_wr_id, rec.opcode, Status::Ok(),
                                rec.opcode == Opcode::kRead ? wc.byte_len : 0};
        continue;  // internal signals (unsignaled writes) are swallowed
      }
      std::string own;
      if (!flushed) {
        char vendor[32];
        std::snprintf(vendor, sizeof(vendor), "%#x", wc.vendor_err);
        own = std::string(op_word(rec.opcode)) + " (wr_id " + std::to_string(rec.user_wr_id) +
              ") failed on " + endpoint_->device + ": " + ibv_wc_status_str(wc.status) +
              " (vendor_err " + vendor + "; connection to " + endpoint_->peer + ")";
        mark_broken_locked(Errc::kConnectionError, own);
      } else {
        mark_broken_locked(Errc::kConnectionError,
                           "connection to " + endpoint_->peer + " left the connected state");
      }
      // Errors of a split write's earlier pieces surface on its last piece
      // (every later WR of a broken QP is flushed).
      if (rec.op_end)
        out[n++] = Completion{rec.user_wr_id, rec.opcode,
                              !own.empty() ? Status(Errc::kConnectionError, own)
                                           : flushed_status_locked(op_word(rec.opcode)),
                              0};
    }
  }
  return n;
}

Status RdmaConnection::flushed_status_locked(std::string_view what) const {
  // Like tcp: kClosed when we shut down ourselves, else a connection error.
  const Errc code = broken_reason_.code() == Errc::kClosed ? Errc::kClosed : Errc::kConnectionError;
  return Status(code, std::string(what) + " flushed: " + broken_reason_.message());
}

size_t RdmaConnection::synthesize_errors_locked(std::span<Completion> out) {
  // The connection is broken and the CQ is empty: whatever is still pending
  // fails now (flush completions that arrive later are recognised as stale
  // by their seq / slot and dropped).
  size_t n = 0;
  while (tail_seq_ < next_seq_ && n < out.size()) {
    const WrRecord rec = ring_[tail_seq_ % sq_depth_];
    reclaim_through_locked(tail_seq_);
    if (rec.op_end)
      out[n++] =
          Completion{rec.user_wr_id, rec.opcode, flushed_status_locked(op_word(rec.opcode)), 0};
  }
  for (uint32_t slot = 0; slot < recv_posted_.size() && n < out.size(); ++slot) {
    if (!recv_posted_[slot]) continue;
    recv_posted_[slot] = false;
    out[n++] = Completion{slot, Opcode::kRecv, flushed_status_locked("receive"), 0};
  }
  return n;
}

void RdmaConnection::handle_cm_events_locked() {
  for (;;) {
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(endpoint_->channel.get(), &raw) != 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        mark_broken_locked(Errc::kIoError,
                           std::string("rdma_get_cm_event: ") + std::strerror(errno));
      return;
    }
    CmEvent event(raw);
    const int status = event->status;
    switch (event->event) {
      case RDMA_CM_EVENT_DISCONNECTED:
        mark_broken_locked(Errc::kConnectionError,
                           "peer " + endpoint_->peer + " closed the connection");
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        mark_broken_locked(
            Errc::kConnectionError,
            "device " + endpoint_->device + " was removed (connection to " + endpoint_->peer + ")");
        break;
      case RDMA_CM_EVENT_ADDR_CHANGE:
        mark_broken_locked(Errc::kConnectionError, "the local address moved off " +
                                                       endpoint_->device + " (connection to " +
                                                       endpoint_->peer + ")");
        break;
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_REJECTED:
        mark_broken_locked(Errc::kConnectionError, std::string("rdma_cm reported ") +
                                                       rdma_event_str(event->event) + " (status " +
                                                       std::to_string(status) +
                                                       ") on the connection to " + endpoint_->peer);
        break;
      case RDMA_CM_EVENT_TIMEWAIT_EXIT:  // the QP left timewait after a disconnect
      case RDMA_CM_EVENT_ESTABLISHED:    // repeated; the connection is already up
        break;
      case RDMA_CM_EVENT_ADDR_RESOLVED:
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_CONNECT_REQUEST:
      case RDMA_CM_EVENT_CONNECT_RESPONSE:
      case RDMA_CM_EVENT_MULTICAST_JOIN:
      case RDMA_CM_EVENT_MULTICAST_ERROR:
        // Setup or multicast events cannot occur on an established RC id.
        log::warn("rdma: ignoring unexpected {} on the connection to {}",
                  rdma_event_str(event->event), endpoint_->peer);
        break;
    }
  }
}

Result<size_t> RdmaConnection::poll(std::span<Completion> out, std::chrono::milliseconds timeout) {
  if (out.empty()) return Status(Errc::kInvalidArgument, "poll: no room for completions");
  std::lock_guard poll_lock(poll_mu_);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  // Spin on the CQ until spin_until before arming the channel (PollMode).
  const auto window = spin_.window();
  const auto spin_until = window >= std::chrono::nanoseconds(timeout) ? deadline : start + window;
  bool waited = false;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      size_t n = drain_cq_locked(out);
      if (n > 0) {
        if (waited) spin_.observed(Clock::now() - start);
        return n;
      }
      if (room_freed_locked()) return size_t{0};
      if (take_wake()) return size_t{0};
      handle_cm_events_locked();
      if (broken_) {
        n = synthesize_errors_locked(out);
        if (n > 0) return n;
        return Status(Errc::kClosed, "connection is closed: " + broken_reason_.message());
      }
    }
    auto now = Clock::now();
    if (now >= deadline) return size_t{0};
    waited = true;
    if (now < spin_until) {
      // Back to the top at least every millisecond: CM events (a
      // disconnect) are looked at there.
      const auto slice_end = std::min(spin_until, now + std::chrono::milliseconds(1));
      uint32_t spins = 0;
      while (now < slice_end) {
        {
          std::lock_guard lock(mu_);
          const size_t n = drain_cq_locked(out);
          if (n > 0) {
            spin_.observed(Clock::now() - start);
            return n;
          }
          if (room_freed_locked()) return size_t{0};
        }
        if (take_wake()) return size_t{0};
        relax(spins);
        now = Clock::now();
      }
      continue;
    }
    {
      std::lock_guard lock(mu_);
      if (int err = ibv_req_notify_cq(endpoint_->cq.get(), 0); err != 0)
        return verbs_error(Errc::kIoError, "ibv_req_notify_cq", endpoint_->id->verbs, err);
      // A completion that arrived before arming raises no event: poll again.
      const size_t n = drain_cq_locked(out);
      if (n > 0) {
        spin_.observed(Clock::now() - start);
        return n;
      }
      if (room_freed_locked()) return size_t{0};
    }
    // The wake eventfd last: a wake() after take_wake() above makes it
    // readable, and the loop's top returns.
    pollfd fds[3] = {{endpoint_->comp->fd, POLLIN, 0},
                     {endpoint_->channel->fd, POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    const int rc =
        ::poll(fds, wake_fd_.valid() ? 3 : 2, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (rc < 0 && errno != EINTR) return errno_status(Errc::kIoError, "poll", errno);
    if (rc > 0 && (fds[0].revents & POLLIN) != 0) {
      std::lock_guard lock(mu_);
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      while (ibv_get_cq_event(endpoint_->comp.get(), &cq, &context) == 0)
        ibv_ack_cq_events(cq, 1);  // acked at once: destroy_cq waits for acks
    }
  }
}

void RdmaConnection::wake() {
  wake_requested_.store(true);
  if (wake_fd_.valid()) {
    const uint64_t one = 1;
    // EAGAIN (the counter is full) still leaves it readable: nothing to do.
    [[maybe_unused]] ssize_t written = ::write(wake_fd_.get(), &one, sizeof(one));
  }
}

bool RdmaConnection::take_wake() {
  if (!wake_requested_.load(std::memory_order_relaxed) || !wake_requested_.exchange(false))
    return false;
  if (wake_fd_.valid()) {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t drained = ::read(wake_fd_.get(), &count, sizeof(count));
  }
  return true;
}

bool RdmaConnection::room_freed_locked() {
  // A post was refused for lack of room and internal (swallowed)
  // completions have since made room: wake the caller to retry instead of
  // sleeping until a reportable completion or the timeout.
  if (!room_freed_) return false;
  room_freed_ = starved_ = false;
  return true;
}

std::span<const std::byte> RdmaConnection::recv_data(uint32_t slot, uint32_t byte_len) const {
  if (slot >= options_.recv_slots) return {};
  const size_t len = std::min(byte_len, options_.message_size);
  return {endpoint_->recv_block.get() + size_t{slot} * options_.message_size, len};
}

Status RdmaConnection::repost_recv(uint32_t slot) {
  if (slot >= options_.recv_slots)
    return Status(Errc::kInvalidArgument, "repost_recv: slot " + std::to_string(slot) +
                                              " out of range (recv_slots " +
                                              std::to_string(options_.recv_slots) + ")");
  std::lock_guard lock(mu_);
  PMIRROR_RETURN_IF_ERROR(check_open_locked());
  if (recv_posted_[slot])
    return Status(Errc::kInvalidArgument,
                  "repost_recv: slot " + std::to_string(slot) + " is already posted");
  PMIRROR_RETURN_IF_ERROR(post_recv_slot(*endpoint_, slot, options_.message_size));
  recv_posted_[slot] = true;
  return Status::Ok();
}

void RdmaConnection::shutdown() {
  std::lock_guard lock(mu_);
  shutdown_called_ = true;
  mark_broken_locked(Errc::kClosed, "connection to " + endpoint_->peer + " was shut down locally");
}

}  // namespace pmirror::transport::rdma
