// One pmirrord serves a copy at a time. Two daemons writing one copy (a
// second `pmirrord -n r1` with its own port, socket and state pool, started
// beside the first) would interleave two primaries' writes and checkpoint
// two progress records for the same bytes.
//
// The copy's metadata pool cannot tell them apart: libpmemobj's lock on it
// is also taken by a local application that opens the copy as primary
// (legitimate on the same node), and a target holds the pool only while a
// session runs. So pmirrord takes a lock of its own on the copy's file or
// device: an OFD write lock on a byte far beyond any file's end, which
// follows the inode whichever path names it (a symbolic or hard link, a bind
// mount) and goes when the process does, however it ends. A second lock,
// at an offset that encodes the holder's pid, lets a refused daemon name the
// one that serves the copy (the kernel reports no pid for OFD locks).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace pmirror::target {

// Held while a ServedVolume lives. Every volume of this process naming the
// same copy shares the one lock (OFD locks of two open file descriptions
// conflict even within a process: a reload that reopens a changed volume
// maps the copy again while the old mapping still serves).
class ServeLock {
 public:
  // Takes the lock on the existing copy at `path`. kBusy, naming the pmirrord
  // that holds it (pid, command line), when another process serves it.
  static Result<std::unique_ptr<ServeLock>> take(const std::string& volume,
                                                 const std::string& path);
  ~ServeLock();
  ServeLock(const ServeLock&) = delete;
  ServeLock& operator=(const ServeLock&) = delete;

 private:
  ServeLock(dev_t device, ino_t inode) : device_(device), inode_(inode) {}
  dev_t device_;
  ino_t inode_;
};

// What ServeLock::take would refuse, without taking anything (for
// `pmirrord --check-config` and a reload's dry run): kBusy with the same
// message when a process other than this one serves the copy at `path`; Ok
// when none does, or when there is nothing at `path` to serve yet.
Status check_not_served_elsewhere(const std::string& volume, const std::string& path);

}  // namespace pmirror::target
