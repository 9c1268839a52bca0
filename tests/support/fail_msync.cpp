// An LD_PRELOAD shim for fault-injection tests: msync(2) on a mapping of one
// file fails, as it does when the file system reports a write-back error
// (ENOSPC on a thin device, EIO from a dying disk). Other msyncs (the state
// and metadata pools, which libpmemobj aborts on) pass through.
//
//   PMIRROR_FAIL_MSYNC_PATH   the file whose mappings fail (required)
//   PMIRROR_FAIL_MSYNC_WHEN   optional: counting starts only once this file
//                             exists (a test creates it when it wants the
//                             failures to begin)
//   PMIRROR_FAIL_MSYNC_AFTER  msyncs of that file that still succeed once
//                             counting started (default 0)
//   PMIRROR_FAIL_MSYNC_ERRNO  the errno of a failure (default EIO)
//
// The mapping of an address is looked up in /proc/self/maps at every call
// (no cache: a volume reopened after a reload may be mapped elsewhere, and
// its old range reused by a pool).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

struct Settings {
  std::string path;
  std::string when;
  long after = 0;
  int err = EIO;
};

const Settings& settings() {
  static const Settings s = [] {
    Settings out;
    if (const char* p = std::getenv("PMIRROR_FAIL_MSYNC_PATH")) {
      char resolved[PATH_MAX];
      out.path = ::realpath(p, resolved) != nullptr ? resolved : p;
    }
    if (const char* w = std::getenv("PMIRROR_FAIL_MSYNC_WHEN")) out.when = w;
    if (const char* a = std::getenv("PMIRROR_FAIL_MSYNC_AFTER")) out.after = std::atol(a);
    if (const char* e = std::getenv("PMIRROR_FAIL_MSYNC_ERRNO")) out.err = std::atoi(e);
    return out;
  }();
  return s;
}

std::mutex mu;
long counted = 0;

// True when addr lies in a mapping of `path` (per /proc/self/maps).
bool mapped_from(uintptr_t addr, const std::string& path) {
  int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string maps;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) maps.append(buf, static_cast<size_t>(n));
  ::close(fd);
  size_t pos = 0;
  while (pos < maps.size()) {
    size_t eol = maps.find('\n', pos);
    if (eol == std::string::npos) eol = maps.size();
    std::string line = maps.substr(pos, eol - pos);
    pos = eol + 1;
    char* rest = nullptr;
    uintptr_t lo = std::strtoull(line.c_str(), &rest, 16);
    if (rest == nullptr || *rest != '-') continue;
    uintptr_t hi = std::strtoull(rest + 1, nullptr, 16);
    if (addr < lo || addr >= hi) continue;
    size_t slash = line.find('/');
    return slash != std::string::npos && line.substr(slash) == path;
  }
  return false;
}

}  // namespace

extern "C" int msync(void* addr, size_t length, int flags) {
  using Fn = int (*)(void*, size_t, int);
  static Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "msync"));
  const Settings& s = settings();
  if (!s.path.empty()) {
    auto a = reinterpret_cast<uintptr_t>(addr);
    std::lock_guard lock(mu);
    bool ours = mapped_from(a, s.path);
    struct stat st {};
    if (ours && (s.when.empty() || ::stat(s.when.c_str(), &st) == 0)) {
      if (counted++ >= s.after) {
        errno = s.err;
        return -1;
      }
    }
  }
  return real(addr, length, flags);
}
