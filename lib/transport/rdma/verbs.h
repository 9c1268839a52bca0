// RAII owners for the librdmacm / libibverbs objects the rdma transport
// creates, and the error helpers every step uses. Owners are move-only; a
// struct that holds several declares them in creation order so that the
// implicit destructor tears them down in reverse (QP before CQ before PD ...),
// which replaces the goto-unwinding of the C examples.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"
#include "common/unique_fd.h"
#include "transport/transport.h"

namespace pmirror::transport::rdma {

// Move-only owner of T*, released with Destroy(T*).
template <typename T, void (*Destroy)(T*)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T* p) : p_(p) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  ~Handle() { reset(); }

  void reset() {
    if (p_ != nullptr) Destroy(std::exchange(p_, nullptr));
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

// Destroyers. A failure to destroy is logged (nothing else can be done in a
// destructor); it usually means a dependent object is still alive.
void destroy_event_channel(rdma_event_channel* channel);
void destroy_cm_id(rdma_cm_id* id);
void destroy_pd(ibv_pd* pd);
void destroy_comp_channel(ibv_comp_channel* channel);
void destroy_cq(ibv_cq* cq);
void destroy_mr(ibv_mr* mr);

using EventChannel = Handle<rdma_event_channel, destroy_event_channel>;
using CmId = Handle<rdma_cm_id, destroy_cm_id>;
using Pd = Handle<ibv_pd, destroy_pd>;
using CompChannel = Handle<ibv_comp_channel, destroy_comp_channel>;
using Cq = Handle<ibv_cq, destroy_cq>;
using Mr = Handle<ibv_mr, destroy_mr>;

// The QP of an rdma_cm_id (rdma_create_qp / rdma_destroy_qp). It does not own
// the id, which must outlive it (declare the CmId first).
class Qp {
 public:
  Qp() = default;
  explicit Qp(rdma_cm_id* id) : id_(id) {}
  Qp(const Qp&) = delete;
  Qp& operator=(const Qp&) = delete;
  Qp(Qp&& other) noexcept : id_(std::exchange(other.id_, nullptr)) {}
  Qp& operator=(Qp&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, nullptr);
    }
    return *this;
  }
  ~Qp() { reset(); }
  void reset() {
    if (id_ != nullptr) rdma_destroy_qp(std::exchange(id_, nullptr));
  }
  ibv_qp* get() const { return id_ != nullptr ? id_->qp : nullptr; }
  explicit operator bool() const { return get() != nullptr; }

 private:
  rdma_cm_id* id_ = nullptr;
};

// An event taken from an event channel; acknowledged on destruction.
// rdma_destroy_id blocks until every event of its id is acknowledged, so an
// event must not outlive the scope that handles it.
class CmEvent {
 public:
  CmEvent() = default;
  explicit CmEvent(rdma_cm_event* event) : event_(event) {}
  CmEvent(const CmEvent&) = delete;
  CmEvent& operator=(const CmEvent&) = delete;
  CmEvent(CmEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  CmEvent& operator=(CmEvent&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  ~CmEvent() { reset(); }
  void reset() {
    if (event_ != nullptr) rdma_ack_cm_event(std::exchange(event_, nullptr));
  }
  rdma_cm_event* operator->() const { return event_; }
  rdma_cm_event* get() const { return event_; }

 private:
  rdma_cm_event* event_ = nullptr;
};

// Page-aligned, zeroed heap block (send ring, receive slots).
struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;
AlignedBuffer allocate_aligned(size_t length);

// "rxe0", or "no device" before the id is bound to one.
std::string device_name(const ibv_context* context);

// "<call> on <device>: <strerror(err)>" -- the shape of every verbs error.
Status verbs_error(Errc code, std::string_view call, const ibv_context* context, int err);

// Whether the device can register RC memory for remote read and write
// without pinning it (on-demand paging): what fsdax mappings need.
bool device_has_rc_odp(ibv_context* context);

// True on Soft-RoCE, whose ODP copy misplaces the bytes of Writes
// (docs/transport-rdma.md, "fs-dax over ODP"); PMIRROR_RXE_ODP=trust, for a
// lab kernel that fixes it, says false.
bool odp_misplaces_written_bytes(ibv_context* context);

// The device's FLUSH / ATOMIC WRITE capabilities (ibv_query_device_ex:
// device_cap_flags_ex bits 38-40, the RC ODP caps' FLUSH and ATOMIC_WRITE
// bits), whatever the rdma-core this is built against names; all false
// when the query fails or an older kernel does not know them.
FabricPersistence device_fabric_persistence(ibv_context* context);

// The ibv access flags for transport Access bits: kUnsupported for FLUSH
// when this build cannot post it (rdma-core < 45), kInvalidArgument for
// bits it does not know.
Result<int> access_flags(uint32_t access);

// ibv_reg_mr of [addr, +len) on `pd`. Where the kernel refuses to pin the
// pages (fsdax: EOPNOTSUPP, or EINVAL from some drivers on file mappings)
// it retries with IBV_ACCESS_ON_DEMAND if `odp`; otherwise kUnsupported
// says why and what to use instead. `what` ("cannot register ...") starts
// every error message.
Result<Mr> register_memory_region(ibv_pd* pd, ibv_context* context, bool odp, void* addr,
                                  size_t len, int flags, bool file_backed,
                                  const std::string& what);

// Makes an fd non-blocking so rdma_get_cm_event / ibv_get_cq_event can be
// drained after poll(2) without ever sleeping inside the library.
Status set_nonblocking(int fd, std::string_view what);

}  // namespace pmirror::transport::rdma
