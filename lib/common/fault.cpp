#include "common/fault.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace pmirror::fault {

namespace detail {
constinit thread_local RecoveryPoint* t_recovery_point = nullptr;
constinit thread_local Fault t_fault{};
}  // namespace detail

namespace {

constexpr size_t kLabelMax = 512;

// begin/end and label are read by the signal handler without the lock:
// begin is published last and withdrawn first, so a slot with begin != 0
// has its label written.
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  char label[kLabelMax] = {};
  std::function<void(const Status&)> on_fault;  // guarded by g_mutex
  bool used = false;                            // guarded by g_mutex
};

Slot g_slots[kMaxMappings];
std::atomic<int> g_slots_in_use{0};  // slots [0, n) may be used
std::mutex g_mutex;

const char* si_code_cstr(int code) {
  switch (code) {
    case BUS_ADRALN:
      return "BUS_ADRALN";
    case BUS_ADRERR:
      return "BUS_ADRERR";
    case BUS_OBJERR:
      return "BUS_OBJERR";
#ifdef BUS_MCEERR_AR
    case BUS_MCEERR_AR:
      return "BUS_MCEERR_AR";
    case BUS_MCEERR_AO:
      return "BUS_MCEERR_AO";
#endif
    case SI_USER:
      return "SI_USER";
    case SI_TKILL:
      return "SI_TKILL";
    case SI_QUEUE:
      return "SI_QUEUE";
    default:
      return nullptr;
  }
}

// ---- async-signal-safe output for the handler

struct Line {
  char buf[1024];
  size_t len = 0;
  void add(const char* s) {
    while (*s != '\0' && len < sizeof buf) buf[len++] = *s++;
  }
  void add_number(uint64_t v, unsigned base) {
    char digits[24];
    size_t n = 0;
    do {
      digits[n++] = "0123456789abcdef"[v % base];
      v /= base;
    } while (v != 0 && n < sizeof digits);
    if (base == 16) add("0x");
    while (n > 0 && len < sizeof buf) buf[len++] = digits[--n];
  }
  void flush() const {
    size_t done = 0;
    while (done < len) {
      ssize_t w = ::write(STDERR_FILENO, buf + done, len - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;
      done += static_cast<size_t>(w);
    }
  }
};

// One line naming the volume a fatal fault hit, if it hit one.
void write_fatal_line(uintptr_t address, int code) {
  int n = g_slots_in_use.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    uintptr_t begin = g_slots[i].begin.load(std::memory_order_acquire);
    uintptr_t end = g_slots[i].end.load(std::memory_order_acquire);
    if (begin == 0 || address < begin || address >= end) continue;
    Line line;
    line.add("pmirror: fatal memory fault (SIGBUS, si_code ");
    if (const char* name = si_code_cstr(code)) {
      line.add(name);
    } else {
      line.add_number(static_cast<uint64_t>(static_cast<unsigned>(code)), 10);
    }
    line.add(") in ");
    line.add(g_slots[i].label);
    line.add(" at offset ");
    line.add_number(address - begin, 10);
    line.add(
        ", outside any guarded access: the process dies; the backing file was truncated or "
        "the medium failed\n");
    line.flush();
    return;
  }
}

void on_sigbus(int signo, siginfo_t* info, void* /*context*/) {
  int saved_errno = errno;
  auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  detail::RecoveryPoint* point = detail::t_recovery_point;
  if (point != nullptr && address >= point->begin && address < point->end) {
    detail::t_fault = Fault{address, info->si_code, 0};
    detail::t_recovery_point = nullptr;  // guarded() restores the outer one
    errno = saved_errno;
    siglongjmp(point->env, 1);
  }
  write_fatal_line(address, info->si_code);
  // The default action, as without this handler: a fault re-executes the
  // access on return and dies of it; a SIGBUS sent with kill is raised again.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(signo, &dfl, nullptr);
  if (info->si_code <= 0) ::raise(signo);
  errno = saved_errno;
}

}  // namespace

Registration& Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    reset();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

void Registration::reset() {
  if (slot_ < 0) return;
  std::lock_guard lock(g_mutex);
  Slot& slot = g_slots[slot_];
  slot.begin.store(0, std::memory_order_release);
  slot.end.store(0, std::memory_order_release);
  slot.on_fault = nullptr;
  slot.used = false;
  slot_ = -1;
}

Registration register_mapping(const void* base, size_t length, const std::string& label,
                              std::function<void(const Status&)> on_fault) {
  Registration registration;
  std::lock_guard lock(g_mutex);
  for (int i = 0; i < kMaxMappings; ++i) {
    Slot& slot = g_slots[i];
    if (slot.used) continue;
    slot.used = true;
    size_t n = std::min(label.size(), kLabelMax - 1);
    std::memcpy(slot.label, label.data(), n);
    slot.label[n] = '\0';
    slot.on_fault = std::move(on_fault);
    auto begin = reinterpret_cast<uintptr_t>(base);
    slot.end.store(begin + length, std::memory_order_release);
    slot.begin.store(begin, std::memory_order_release);
    if (g_slots_in_use.load() <= i) g_slots_in_use.store(i + 1, std::memory_order_release);
    registration.slot_ = i;
    break;
  }
  return registration;
}

std::string si_code_name(int si_code) {
  const char* name = si_code_cstr(si_code);
  return name != nullptr ? name : std::to_string(si_code);
}

Status report(const Fault& fault) {
  std::string how = fault.err != 0 ? std::string("the kernel returned ") + std::strerror(fault.err)
                                   : "si_code " + si_code_name(fault.si_code);
  std::lock_guard lock(g_mutex);
  for (int i = 0; i < kMaxMappings; ++i) {
    Slot& slot = g_slots[i];
    if (!slot.used) continue;
    uintptr_t begin = slot.begin.load();
    if (fault.address < begin || fault.address >= slot.end.load()) continue;
    Status status(Errc::kIoError, std::string(slot.label) + ": memory fault at offset " +
                                      std::to_string(fault.address - begin) + " (" + how +
                                      "): the backing file was truncated or the medium failed");
    if (slot.on_fault) slot.on_fault(status);
    return status;
  }
  char address[32];
  std::snprintf(address, sizeof address, "%#llx", static_cast<unsigned long long>(fault.address));
  return Status(Errc::kIoError, std::string("memory fault at address ") + address + " (" + how +
                                    "), outside every registered volume mapping");
}

namespace detail {
void unblock_sigbus() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGBUS);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}
}  // namespace detail

Status install_fault_handler() {
  static std::mutex mutex;
  static bool installed = false;
  std::lock_guard lock(mutex);
  if (installed) return Status::Ok();
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  sigemptyset(&action.sa_mask);
  // SA_NODEFER: a guard jumps out of the handler without restoring the
  // signal mask, so SIGBUS must not be blocked while it runs.
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  if (::sigaction(SIGBUS, &action, nullptr) != 0) {
    return errno_status(Errc::kInternal, "installing the SIGBUS handler", errno);
  }
  installed = true;
  return Status::Ok();
}

}  // namespace pmirror::fault
