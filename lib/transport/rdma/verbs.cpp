#include "transport/rdma/verbs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/log.h"

namespace pmirror::transport::rdma {

void destroy_event_channel(rdma_event_channel* channel) { rdma_destroy_event_channel(channel); }

void destroy_cm_id(rdma_cm_id* id) {
  if (rdma_destroy_id(id) != 0) log::warn("rdma: rdma_destroy_id: {}", std::strerror(errno));
}

void destroy_pd(ibv_pd* pd) {
  const std::string device = device_name(pd->context);
  if (int err = ibv_dealloc_pd(pd); err != 0)
    log::warn("rdma: ibv_dealloc_pd on {}: {} (a memory region still registered?)", device,
              std::strerror(err));
}

void destroy_comp_channel(ibv_comp_channel* channel) {
  if (int err = ibv_destroy_comp_channel(channel); err != 0)
    log::warn("rdma: ibv_destroy_comp_channel: {}", std::strerror(err));
}

void destroy_cq(ibv_cq* cq) {
  const std::string device = device_name(cq->context);
  if (int err = ibv_destroy_cq(cq); err != 0)
    log::warn("rdma: ibv_destroy_cq on {}: {}", device, std::strerror(err));
}

void destroy_mr(ibv_mr* mr) {
  const std::string device = device_name(mr->context);
  if (int err = ibv_dereg_mr(mr); err != 0)
    log::warn("rdma: ibv_dereg_mr on {}: {}", device, std::strerror(err));
}

AlignedBuffer allocate_aligned(size_t length) {
  constexpr size_t kPage = 4096;
  const size_t rounded = (length + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded == 0 ? kPage : rounded);
  if (p != nullptr) std::memset(p, 0, rounded == 0 ? kPage : rounded);
  return AlignedBuffer(static_cast<std::byte*>(p));
}

std::string device_name(const ibv_context* context) {
  if (context == nullptr || context->device == nullptr) return "no device";
  const char* name = ibv_get_device_name(context->device);
  return name != nullptr ? name : "unnamed device";
}

Status verbs_error(Errc code, std::string_view call, const ibv_context* context, int err) {
  std::string what(call);
  what += " on ";
  what += device_name(context);
  return errno_status(code, what, err);
}

Status set_nonblocking(int fd, std::string_view what) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return errno_status(Errc::kIoError, std::string("fcntl(O_NONBLOCK) on ") + std::string(what),
                        errno);
  return Status::Ok();
}

bool device_has_rc_odp(ibv_context* context) {
  ibv_device_attr_ex attr{};
  if (ibv_query_device_ex(context, nullptr, &attr) != 0) return false;
  const uint32_t rc = attr.odp_caps.per_transport_caps.rc_odp_caps;
  return (attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0 &&
         (rc & IBV_ODP_SUPPORT_WRITE) != 0 && (rc & IBV_ODP_SUPPORT_READ) != 0;
}

FabricPersistence device_fabric_persistence(ibv_context* context) {
  // The kernel's uapi values (rdma/ib_user_verbs.h, ib_user_ioctl_verbs.h):
  // an ABI, so spelled out here for rdma-core 44, whose headers lack them.
  constexpr uint64_t kDeviceFlushGlobal = uint64_t{1} << 38;
  constexpr uint64_t kDeviceFlushPersistent = uint64_t{1} << 39;
  constexpr uint64_t kDeviceAtomicWrite = uint64_t{1} << 40;
  constexpr uint32_t kOdpSupportFlush = 1u << 6;
  constexpr uint32_t kOdpSupportAtomicWrite = 1u << 7;
  FabricPersistence out;
#ifdef PMIRROR_HAVE_IBV_WR_FLUSH
  out.verbs_api = true;
#endif
  ibv_device_attr_ex attr{};
  if (ibv_query_device_ex(context, nullptr, &attr) != 0) return out;
  out.flush_global = (attr.device_cap_flags_ex & kDeviceFlushGlobal) != 0;
  out.flush_persistent = (attr.device_cap_flags_ex & kDeviceFlushPersistent) != 0;
  out.atomic_write = (attr.device_cap_flags_ex & kDeviceAtomicWrite) != 0;
  const uint32_t rc = attr.odp_caps.per_transport_caps.rc_odp_caps;
  const bool odp = (attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0;
  out.odp_flush = odp && (rc & kOdpSupportFlush) != 0;
  out.odp_atomic_write = odp && (rc & kOdpSupportAtomicWrite) != 0;
  return out;
}

Result<int> access_flags(uint32_t access) {
  constexpr uint32_t kKnown = kRemoteWrite | kRemoteRead | kRemoteFlush | kRemoteAtomicWrite;
  if ((access & ~kKnown) != 0)
    return Status(Errc::kInvalidArgument, "register_memory: unknown access bits");
  int flags = IBV_ACCESS_LOCAL_WRITE;  // also the destination of our reads
  if ((access & kRemoteWrite) != 0) flags |= IBV_ACCESS_REMOTE_WRITE;
  if ((access & kRemoteRead) != 0) flags |= IBV_ACCESS_REMOTE_READ;
  // Devices differ in which permission they check for an ATOMIC WRITE (it
  // writes, and it is an atomic): both.
  if ((access & kRemoteAtomicWrite) != 0) {
    flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  }
  if ((access & kRemoteFlush) != 0) {
#ifdef PMIRROR_HAVE_IBV_WR_FLUSH
    flags |= IBV_ACCESS_FLUSH_PERSISTENT;
#else
    return Status(Errc::kUnsupported,
                  "register_memory: this build of pmirror (against rdma-core < 45) cannot "
                  "register memory for FLUSH");
#endif
  }
  return flags;
}

bool odp_misplaces_written_bytes(ibv_context* context) {
  // Soft-RoCE (rxe, vendor id 0xFFFFFF) copies a packet into or out of an
  // ODP registration from the start of each page and without advancing the
  // packet's side of the copy (__rxe_odp_mr_copy, seen on Linux 7.3.4): a
  // Write lands wrong and still completes with success. Its ATOMIC WRITE
  // and FLUSH apply the offset: a one-page registration (the commit word,
  // which takes nothing else) is safe.
  constexpr uint32_t kRxeVendorId = 0xFFFFFF;
  const char* trust = std::getenv("PMIRROR_RXE_ODP");
  if (trust != nullptr && std::string_view(trust) == "trust") return false;
  ibv_device_attr attr{};
  if (ibv_query_device(context, &attr) != 0) return false;
  return attr.vendor_id == kRxeVendorId;
}

Result<Mr> register_memory_region(ibv_pd* pd, ibv_context* context, bool odp, void* addr,
                                  size_t len, int flags, bool file_backed,
                                  const std::string& what) {
  Mr mr(ibv_reg_mr(pd, addr, len, flags));
  if (mr) return mr;
  const int err = errno;
  const std::string device = device_name(context);
  if (err == EOPNOTSUPP || (err == EINVAL && file_backed)) {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const bool crosses_a_page = reinterpret_cast<uintptr_t>(addr) % page + len > page;
    if (odp && crosses_a_page && odp_misplaces_written_bytes(context)) {
      // A commit word (8 bytes, ATOMIC WRITE and FLUSH only) still registers.
      return Status(Errc::kUnsupported,
                    what + ": ibv_reg_mr: " + std::strerror(err) +
                        "; the kernel cannot pin fsdax pages, and " + device +
                        " is Soft-RoCE, whose on-demand paging (ODP) misplaces the bytes of "
                        "RDMA Writes; use a devdax device (/dev/daxX.Y) or a NIC with ODP");
    }
    if (odp) {
      mr = Mr(ibv_reg_mr(pd, addr, len, flags | IBV_ACCESS_ON_DEMAND));
      if (mr) return mr;
      return errno_status(Errc::kIoError, what + ": ibv_reg_mr with IBV_ACCESS_ON_DEMAND", errno);
    }
    return Status(Errc::kUnsupported,
                  what + ": ibv_reg_mr: " + std::strerror(err) +
                      "; the kernel cannot pin fsdax pages and " + device +
                      " has no on-demand paging (ODP); use a devdax device (/dev/daxX.Y) or a "
                      "NIC with ODP");
  }
  std::string hint;
  if (err == ENOMEM) {
    hint = " (raise the locked-memory limit: ulimit -l, LimitMEMLOCK=infinity in the unit)";
  } else if (err == EFAULT) {
    hint = " (the range is not mapped in this process)";
  }
#ifdef PMIRROR_HAVE_IBV_WR_FLUSH
  if (err == EINVAL && (flags & IBV_ACCESS_FLUSH_PERSISTENT) != 0)
    hint = " (FLUSH to persistence is granted on pmem only: a devdax device or an fs-dax file)";
#endif
  return Status(Errc::kIoError, what + ": ibv_reg_mr: " + std::strerror(err) + hint);
}

}  // namespace pmirror::transport::rdma
