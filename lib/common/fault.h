// Memory faults on a volume's mapping -- SIGBUS from a backing file that was
// truncated, a media error on pmem, a hole the file system cannot allocate
// -- turned into errors of that volume instead of the death of the process.
//
// Two parts:
//  * A registry of mapped volumes (region::Region registers each mapping):
//    report() names the volume a fault address lies in and tells its owner,
//    which marks the volume failed.
//  * Guarded accesses: guarded(addr, len, access) runs `access` with a
//    thread-local recovery point; a SIGBUS at an address in [addr, +len)
//    while it runs makes guarded() return the fault instead of killing the
//    process. The cost is a sigsetjmp without the signal mask and a
//    thread-local store and clear: no system call.
//
// The SIGBUS handler is installed only by a program that wants this
// (install_fault_handler(); pmirrord does): libpmirror never installs signal
// handlers, the application owns its signals. Without the handler a guard
// changes nothing and a fault kills the process as before. A fault outside
// every guarded access still kills the process (the default action), after
// one line on stderr naming the volume when the address lies in one.
#pragma once

#include <atomic>
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"

namespace pmirror::fault {

struct Fault {
  uintptr_t address = 0;
  int si_code = 0;  // of the SIGBUS (BUS_ADRERR, BUS_MCEERR_AR, ...); 0 when err is set
  int err = 0;      // errno when a system call, not a signal, found the fault (EFAULT)
};

// ------------------------------------------------------------ the registry

// A mapping's registration; removing it (destruction) waits for nothing and
// must happen before the memory is unmapped.
class Registration {
 public:
  Registration() = default;
  ~Registration() { reset(); }
  Registration(Registration&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }
  Registration& operator=(Registration&& other) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  void reset();

 private:
  friend Registration register_mapping(const void*, size_t, const std::string&,
                                       std::function<void(const Status&)>);
  int slot_ = -1;
};

// Registers [base, +length) as a volume's mapping. `label` names it in
// messages ("volume 'db0' (/mnt/pmem/db0)"); `on_fault` is called, in
// ordinary context, by report() for a fault inside it and must not call
// back into this registry. Beyond kMaxMappings at once, mappings are not
// registered (their faults are then reported without a name).
inline constexpr int kMaxMappings = 1024;
Registration register_mapping(const void* base, size_t length, const std::string& label,
                              std::function<void(const Status&)> on_fault);

// The error for a fault a guard caught (kIoError): "volume 'db0' (/path):
// memory fault at offset N (si_code BUS_ADRERR): the backing file was
// truncated or the medium failed"; tells the mapping's owner.
Status report(const Fault& fault);

// ------------------------------------------------------- guarded accesses

namespace detail {
struct RecoveryPoint {
  sigjmp_buf env;
  uintptr_t begin = 0;
  uintptr_t end = 0;
};
// The innermost guarded access of this thread (null outside one), and the
// fault the handler caught there. Constant-initialised: the handler reads
// them without any TLS initialisation.
extern constinit thread_local RecoveryPoint* t_recovery_point;
extern constinit thread_local Fault t_fault;
// After a jump out of the handler: a handler that wraps ours (ThreadSanitizer
// installs its own and ignores SA_NODEFER) leaves SIGBUS blocked, and a
// blocked SIGBUS kills at the next fault. One syscall, on the fault path only.
void unblock_sigbus();
}  // namespace detail

// Runs access(); a SIGBUS at an address in [addr, addr+len) during it ends
// it early and returns the fault (std::nullopt when it ran through).
// `access` must not hold locks or own resources across the faulting
// instruction (it is abandoned with siglongjmp): a memcpy, a hash, a cache
// flush. Nests.
template <typename Access>
std::optional<Fault> guarded(const void* addr, size_t len, Access&& access) {
  detail::RecoveryPoint point;
  point.begin = reinterpret_cast<uintptr_t>(addr);
  point.end = point.begin + len;
  detail::RecoveryPoint* const outer = detail::t_recovery_point;
  // savemask 0: no sigprocmask; the handler runs with SA_NODEFER, so SIGBUS
  // is not left blocked when it jumps back here.
  if (sigsetjmp(point.env, 0) != 0) {
    detail::t_recovery_point = outer;
    detail::unblock_sigbus();
    return detail::t_fault;
  }
  detail::t_recovery_point = &point;
  // Compiler barriers: the handler (this thread) must see the recovery point
  // set for every access inside, and the store must not be dropped as dead.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  access();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  detail::t_recovery_point = outer;
  return std::nullopt;
}

// Installs the process's SIGBUS handler (sigaction, SA_SIGINFO). For
// programs only (pmirrord, tests), never for a library. Idempotent.
Status install_fault_handler();

// "BUS_ADRERR" etc., for messages.
std::string si_code_name(int si_code);

}  // namespace pmirror::fault
