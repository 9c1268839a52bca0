#include "common/preflight.h"

#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace pmirror::preflight {
namespace {

// Volumes are whole pages (region::kPageSize, which region.cpp asserts equal).
constexpr uint64_t kPageSize = 4096;

std::string errno_text(int err) { return std::strerror(err); }

// A character device is devdax when sysfs files it under the dax subsystem
// (/sys/class/dax on older kernels, /sys/bus/dax on newer: both end "/dax").
bool is_devdax(const struct stat& st, std::string* subsystem_out) {
  std::string link = "/sys/dev/char/" + std::to_string(major(st.st_rdev)) + ":" +
                     std::to_string(minor(st.st_rdev)) + "/subsystem";
  char resolved[PATH_MAX];
  if (::realpath(link.c_str(), resolved) == nullptr) {
    *subsystem_out = "(none)";
    return false;
  }
  std::string subsystem(resolved);
  *subsystem_out = subsystem;
  auto slash = subsystem.find_last_of('/');
  return subsystem.substr(slash == std::string::npos ? 0 : slash + 1) == "dax";
}

Status check_page_multiple(const std::string& label, uint64_t size, const char* what) {
  if (size % kPageSize != 0) {
    return Status(Errc::kInvalidArgument, std::string(what) + " of " + label + " is " +
                                              std::to_string(size) + " bytes, not a multiple of " +
                                              std::to_string(kPageSize) +
                                              "; volumes are whole 4 KiB pages (e.g. 64MiB)");
  }
  return Status::Ok();
}

// stat(path) failed with err, not ENOENT; `named` says what the file is.
Status lookup_failure(const std::string& path, const std::string& named, int err);

}  // namespace

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string permission_hint(const std::string& path) {
  return "check that the user pmirror runs as (uid " + std::to_string(::geteuid()) +
         ") can read and write " + path + " and search its directories, and that the " +
         "filesystem is not mounted read-only";
}

std::string volume_label(const std::string& name, const std::string& path) {
  if (name.empty()) return "volume " + path;
  return "volume '" + name + "' (" + path + ")";
}

void make_default_directory(const std::string& path) {
  struct stat st {};
  if (parent_dir(path) == kDefaultDirectory && ::stat(kDefaultDirectory, &st) != 0 &&
      errno == ENOENT) {
    ::mkdir(kDefaultDirectory, 0755);
  }
}

namespace {
Status lookup_failure(const std::string& path, const std::string& named, int err) {
  if (err == EACCES) {
    return Status(Errc::kPermissionDenied, "cannot look up " + named + ": " + errno_text(err) +
                                               "; " + permission_hint(path));
  }
  if (err == ENOTDIR) {
    return Status(Errc::kNotFound,
                  "cannot look up " + named + ": a component of the path is not a directory");
  }
  return errno_status(Errc::kIoError, "cannot look up " + named, err);
}
}  // namespace

Status parent_directory(const std::string& path, const std::string& what, bool will_create,
                        bool default_made_by_open) {
  const std::string parent = parent_dir(path);
  struct stat st {};
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    // Checked before the open, which would make it (make_default_directory).
    const bool made_by_open = will_create && default_made_by_open && errno == ENOENT &&
                              parent == kDefaultDirectory &&
                              ::access(parent_dir(parent).c_str(), W_OK | X_OK) == 0;
    if (made_by_open) return Status::Ok();
    return Status(Errc::kNotFound, "directory " + parent + " for " + what +
                                       " does not exist; create it (mkdir -p " + parent + ")");
  }
  if (will_create && ::access(parent.c_str(), W_OK | X_OK) != 0) {
    int err = errno;
    return Status(err == ENOENT ? Errc::kNotFound : Errc::kPermissionDenied,
                  "cannot create " + what + ": the directory " + parent +
                      " is not writable: " + errno_text(err) + "; " + permission_hint(parent));
  }
  return Status::Ok();
}

Result<VolumePath> volume_path(const std::string& name, const std::string& path, uint64_t size,
                               bool create) {
  if (path.empty()) {
    return Status(Errc::kInvalidArgument,
                  "volume path is empty; give a file path or a devdax device such as /dev/dax0.0");
  }
  const std::string label = volume_label(name, path);
  PMIRROR_RETURN_IF_ERROR(check_page_multiple(label, size, "requested size"));

  VolumePath found;
  struct stat& st = found.st;
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err != ENOENT) return lookup_failure(path, label, err);
    PMIRROR_RETURN_IF_ERROR(parent_directory(path, label, /*will_create=*/false));
    if (!create) {
      return Status(Errc::kNotFound,
                    label +
                        " does not exist; use create: true with a size, or create it with "
                        "`truncate -s <size> " +
                        path + "` (or point path at a devdax device such as /dev/dax0.0)");
    }
    if (size == 0) {
      return Status(Errc::kInvalidArgument,
                    "cannot create " + label + " with size 0; give a size (e.g. size: 64MiB)");
    }
    PMIRROR_RETURN_IF_ERROR(parent_directory(path, label, /*will_create=*/true));
    return found;
  }
  found.exists = true;

  if (S_ISDIR(st.st_mode)) {
    return Status(Errc::kInvalidArgument,
                  label + ": the path is a directory; give a file inside it (e.g. " + path +
                      "/volume.img) or a devdax device such as /dev/dax0.0");
  }
  if (S_ISBLK(st.st_mode)) {
    return Status(Errc::kInvalidArgument,
                  label +
                      ": the path is a block device; pmirror maps a devdax character device "
                      "(/dev/daxX.Y, see `ndctl create-namespace -m devdax`) or a file on a "
                      "DAX-mounted filesystem (mount -o dax)");
  }
  if (S_ISCHR(st.st_mode)) {
    std::string subsystem;
    if (!is_devdax(st, &subsystem)) {
      return Status(Errc::kInvalidArgument,
                    label + ": the path is a character device that is not devdax (its " +
                        "sysfs subsystem is " + subsystem +
                        "); use /dev/daxX.Y, a file on a DAX filesystem, or a plain file");
    }
    found.devdax = true;
  } else if (!S_ISREG(st.st_mode)) {
    return Status(Errc::kInvalidArgument,
                  label +
                      ": the path is not a regular file or devdax device (a FIFO or socket?); "
                      "give a file or /dev/daxX.Y");
  } else {
    uint64_t file_size = static_cast<uint64_t>(st.st_size);
    if (file_size == 0) {
      return Status(
          Errc::kInvalidArgument,
          label +
              ": the file is empty (0 bytes), not a volume; an existing file is never resized: "
              "remove it and use create: true with a size, or `truncate -s <size> " +
              path + "`");
    }
    if (size != 0 && size != file_size) {
      return Status(Errc::kInvalidArgument,
                    label + ": the file is " + std::to_string(file_size) +
                        " bytes but the configured size is " + std::to_string(size) +
                        " bytes; existing files are never resized: fix size: or use another "
                        "path");
    }
    PMIRROR_RETURN_IF_ERROR(check_page_multiple(label, file_size, "file size"));
  }
  if (::access(path.c_str(), R_OK | W_OK) != 0) {
    int err = errno;
    return Status(Errc::kPermissionDenied,
                  "cannot open " + label + ": " + errno_text(err) + "; " + permission_hint(path));
  }
  return found;
}

Status pool_path(const std::string& path, const std::string& what, bool will_create) {
  const std::string named = what + " " + path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) {
      return parent_directory(path, named, will_create, /*default_made_by_open=*/true);
    }
    return lookup_failure(path, named, err);
  }
  if (S_ISDIR(st.st_mode)) {
    return Status(Errc::kInvalidArgument, named + " is a directory; give a file path inside it");
  }
  if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
    return Status(Errc::kInvalidArgument, named + " is not a regular file or devdax device");
  }
  return Status::Ok();
}

}  // namespace pmirror::preflight
