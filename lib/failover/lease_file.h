// The lease deadline file (docs/failover.md, section 2): pmirror-promoter,
// holding a volume's leader key in etcd under a lease, writes after every
// successful renewal the CLOCK_MONOTONIC instant before which this node may
// still write, into <lease_dir>/<volume>.lease; libpmirror maps the file
// and every persist compares its clock read with that deadline (one atomic
// load: no syscall, no lock). CLOCK_MONOTONIC is the same clock in every
// process of a boot, so the two need no agreement beyond the file.
//
//   // pmirror-promoter
//   auto writer = LeaseFileWriter::create("/run/pmirror/db1.lease", "db1", "a");
//   writer->publish(sent_ns + ttl_ns - margin_ns, lease_id);  // after each renewal
//   writer->withdraw();                                       // hand-over
//   // libpmirror
//   auto reader = LeaseFileReader::open("/run/pmirror/db1.lease", "db1", "a");
//   if (!reader->holds_at(monotonic_now_ns())) ...            // kLeaseLost
//
// One page, fixed layout (LeaseFileLayout); the deadline is an 8-aligned
// lock-free std::atomic<uint64_t> that the writer stores with release after
// the fields that go with it, and readers load with acquire. 0: no lease.
// Neither side has threads or locks; a writer and readers in any processes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/unique_fd.h"

namespace pmirror::failover {

inline constexpr char kLeaseMagic[8] = {'P', 'M', 'L', 'E', 'A', 'S', 'E', '1'};
inline constexpr uint32_t kLeaseLayoutVersion = 1;
inline constexpr size_t kLeaseFileSize = 4096;
inline constexpr size_t kLeaseNameSize = 64;  // volume and node: NUL-padded, not terminated at 64

// The file, as both sides map it. Offsets are fixed (static_asserts in
// lease_file.cpp); a change of meaning bumps kLeaseLayoutVersion.
struct LeaseFileLayout {
  char magic[8];                         //   0: kLeaseMagic
  std::atomic<uint32_t> version;         //   8: kLeaseLayoutVersion, stored last at create
  uint32_t size;                         //  12: kLeaseFileSize
  char volume[kLeaseNameSize];           //  16
  char node[kLeaseNameSize];             //  80: the promoter's node
  std::atomic<int64_t> lease_id;         // 144: etcd's lease id (0: none)
  std::atomic<uint64_t> deadline_ns;     // 152: CLOCK_MONOTONIC ns; 0: no lease
  std::atomic<int64_t> renewed_unix_ms;  // 160: wall clock of the last publish (for people)
  std::atomic<int32_t> holder_pid;       // 168: the promoter's pid
  uint8_t reserved[kLeaseFileSize - 172];
};

// CLOCK_MONOTONIC now, in ns: the clock of the deadline (vDSO, no syscall).
uint64_t monotonic_now_ns();

// A shared mapping of one file: unmapped when it goes; moves, never copies.
class LeaseMapping {
 public:
  LeaseMapping() = default;
  LeaseMapping(void* address, size_t size) : address_(address), size_(size) {}
  LeaseMapping(LeaseMapping&& other) noexcept;
  LeaseMapping& operator=(LeaseMapping&& other) noexcept;
  LeaseMapping(const LeaseMapping&) = delete;
  LeaseMapping& operator=(const LeaseMapping&) = delete;
  ~LeaseMapping();

  LeaseFileLayout* layout() const { return static_cast<LeaseFileLayout*>(address_); }

 private:
  void* address_ = nullptr;
  size_t size_ = 0;
};

// pmirror-promoter's side: one per volume whose key it holds.
class LeaseFileWriter {
 public:
  // Creates `path` (0644) or takes over the one there (a promoter that
  // restarted), writes its header for `volume` and `node` with no lease
  // (deadline 0) and maps it shared. The directory must exist (kNotFound
  // naming it otherwise: it is /run/pmirror, systemd's RuntimeDirectory,
  // or daemon.lease_dir). kInvalidArgument: a name empty or longer than 64
  // bytes; kIoError: the file could not be created, sized or mapped.
  static Result<LeaseFileWriter> create(const std::string& path, std::string_view volume,
                                        std::string_view node);

  // After a renewal that succeeded: this node may write until
  // `deadline_ns` (CLOCK_MONOTONIC). The other fields are stored first,
  // the deadline last (release). 0 is withdraw().
  void publish(uint64_t deadline_ns, int64_t lease_id);
  // The lease is given up (handed over, or the key is gone): the
  // application's persists fail from the next one on.
  void withdraw();
  uint64_t deadline_ns() const;
  const std::string& path() const { return path_; }

  // Going away does not withdraw: a deadline published stays true (etcd
  // keeps the lease until it), and passes by itself.
  LeaseFileWriter(LeaseFileWriter&&) = default;
  LeaseFileWriter& operator=(LeaseFileWriter&&) = default;

 private:
  LeaseFileWriter(std::string path, UniqueFd fd, LeaseMapping mapping)
      : path_(std::move(path)), fd_(std::move(fd)), mapping_(std::move(mapping)) {}

  std::string path_;
  UniqueFd fd_;
  LeaseMapping mapping_;
};

// libpmirror's side: the file mapped read-only.
class LeaseFileReader {
 public:
  // Maps `path` and checks that it is a lease file of `expected_volume` on
  // `expected_node` (empty: any node). kNotFound: no such file (the
  // promoter holds no lease of the volume here, or never ran);
  // kInvalidArgument: not a lease file (short, another magic or layout
  // version); kFailedPrecondition: another volume's or node's; kIoError:
  // it could not be opened or mapped.
  static Result<LeaseFileReader> open(const std::string& path, std::string_view expected_volume,
                                      std::string_view expected_node);

  // The deadline published last (acquire); 0: no lease.
  uint64_t deadline_ns() const {
    return mapping_.layout()->deadline_ns.load(std::memory_order_acquire);
  }
  // Whether the lease holds at `now_ns` (CLOCK_MONOTONIC).
  bool holds_at(uint64_t now_ns) const {
    const uint64_t deadline = deadline_ns();
    return deadline != 0 && now_ns < deadline;
  }
  int64_t lease_id() const;
  int64_t renewed_unix_ms() const;
  int32_t holder_pid() const;
  const std::string& path() const { return path_; }
  const std::string& volume() const { return volume_; }
  const std::string& node() const { return node_; }  // the file's

  LeaseFileReader(LeaseFileReader&&) = default;
  LeaseFileReader& operator=(LeaseFileReader&&) = default;

 private:
  LeaseFileReader(std::string path, std::string volume, std::string node, LeaseMapping mapping)
      : path_(std::move(path)),
        volume_(std::move(volume)),
        node_(std::move(node)),
        mapping_(std::move(mapping)) {}

  std::string path_;
  std::string volume_;
  std::string node_;
  LeaseMapping mapping_;
};

}  // namespace pmirror::failover
