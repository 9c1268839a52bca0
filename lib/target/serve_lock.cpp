#include "target/serve_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "common/unique_fd.h"

namespace pmirror::target {
namespace {

// The byte every serving pmirrord locks: beyond the end of any file or
// device (no data is ever there), and a range no other program locks.
constexpr off_t kServeByte = off_t{1} << 62;
// Just after it, the byte kPidBase + pid names the holder: pids stay below
// 2^22 (the kernel's PID_MAX_LIMIT).
constexpr off_t kPidBase = kServeByte + 1;
constexpr off_t kPidRange = off_t{1} << 22;

struct flock write_lock(off_t start, off_t length) {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = start;
  lock.l_len = length;
  return lock;
}

// The pid of the process whose pmirrord lock conflicts with one on `fd`,
// read from its pid lock; nothing if none is held (any more).
std::optional<pid_t> holder_pid(int fd) {
  struct flock probe = write_lock(kPidBase, kPidRange);
  if (::fcntl(fd, F_OFD_GETLK, &probe) != 0 || probe.l_type == F_UNLCK) return std::nullopt;
  return static_cast<pid_t>(probe.l_start - kPidBase);
}

// "pmirrord -n r1 --config /etc/x.yaml", from /proc/<pid>/cmdline; empty
// when it cannot be read (another user's process under hidepid).
std::string command_line(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  for (char& c : text) {
    if (c == '\0') c = ' ';
  }
  return text;
}

Status served_elsewhere(const std::string& volume, const std::string& path,
                        std::optional<pid_t> pid) {
  std::string holder = "another pmirrord";
  if (pid) {
    std::string command = command_line(*pid);
    holder += " (pid " + std::to_string(*pid) + (command.empty() ? "" : ": " + command) + ")";
  }
  return Status(Errc::kBusy, "volume '" + volume + "': its copy " + path +
                                 " is already served by " + holder +
                                 "; a copy is served by one pmirrord at a time");
}

// The file or device at `path`, opened without blocking (a FIFO) or
// becoming a controlling terminal.
Result<UniqueFd> open_copy(const std::string& path, int access) {
  UniqueFd fd(::open(path.c_str(), access | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd.valid()) return errno_status(Errc::kIoError, "cannot open " + path, errno);
  return fd;
}

// This process's locks, one per copy, with how many volumes share each.
struct Held {
  UniqueFd fd;
  size_t users = 0;
};
std::mutex held_mutex;
std::map<std::pair<dev_t, ino_t>, Held>& held() {
  static std::map<std::pair<dev_t, ino_t>, Held> locks;
  return locks;
}

}  // namespace

Result<std::unique_ptr<ServeLock>> ServeLock::take(const std::string& volume,
                                                   const std::string& path) {
  auto opened = open_copy(path, O_RDWR);
  if (!opened.ok()) {
    return opened.status().with_context("volume '" + volume + "': locking its copy");
  }
  UniqueFd fd = std::move(opened).value();
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return errno_status(Errc::kIoError, "volume '" + volume + "': cannot stat " + path, errno);
  }
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  std::lock_guard guard(held_mutex);
  auto& locks = held();
  if (auto it = locks.find(id); it != locks.end()) {
    ++it->second.users;
    return std::unique_ptr<ServeLock>(new ServeLock(id.first, id.second));
  }
  struct flock serve = write_lock(kServeByte, 1);
  if (::fcntl(fd.get(), F_OFD_SETLK, &serve) != 0) {
    int err = errno;
    if (err != EAGAIN && err != EACCES) {
      return errno_status(Errc::kIoError, "volume '" + volume + "': cannot lock its copy " + path,
                          err);
    }
    return served_elsewhere(volume, path, holder_pid(fd.get()));
  }
  // Best effort: without it, a refused daemon names no pid.
  struct flock name = write_lock(kPidBase + ::getpid(), 1);
  (void)::fcntl(fd.get(), F_OFD_SETLK, &name);
  locks[id] = Held{std::move(fd), 1};
  return std::unique_ptr<ServeLock>(new ServeLock(id.first, id.second));
}

ServeLock::~ServeLock() {
  std::lock_guard guard(held_mutex);
  auto& locks = held();
  auto it = locks.find({device_, inode_});
  if (it != locks.end() && --it->second.users == 0) locks.erase(it);  // closing releases it
}

Status check_not_served_elsewhere(const std::string& volume, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode))) {
    return Status::Ok();  // nothing to serve yet: the start creates it, or refuses it
  }
  auto fd = open_copy(path, O_RDONLY);
  if (!fd.ok()) return Status::Ok();  // unreadable here: not this check's to say
  struct flock probe = write_lock(kServeByte, 1);
  if (::fcntl(fd->get(), F_OFD_GETLK, &probe) != 0 || probe.l_type == F_UNLCK) {
    return Status::Ok();
  }
  auto pid = holder_pid(fd->get());
  if (pid == ::getpid()) return Status::Ok();  // this daemon's own (a reload's dry run)
  return served_elsewhere(volume, path, pid);
}

}  // namespace pmirror::target
