#include "state/state.h"

#include <fcntl.h>
#include <libpmemobj.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string_view>

#include "common/preflight.h"
#include "state/pool_file.h"

namespace pmirror::state {
namespace {

// "PMSTATE1": set once the root header has been initialised.
constexpr uint64_t kRootMagic = 0x3145544154534d50ULL;
constexpr uint32_t kRootVersion = 1;
constexpr size_t kNameField = kMaxVolumeName + 8;  // NUL-terminated, padded to 8
constexpr size_t kWriterField = kMaxWriterName + 8;

// One volume's record, as stored. Fixed-size and trivially copyable so a
// transaction can snapshot it whole. Field order and sizes are the on-media
// format of layout pmirror-state-v1: append into `reserved` only.
struct Slot {
  uint64_t in_use;  // 1: this slot holds a record; 0: free (all fields 0)
  uint64_t generation;
  uint64_t last_sequence;
  uint64_t created_unix_ns;
  uint64_t updated_unix_ns;
  uint8_t uuid[16];
  char name[kNameField];
  char writer[kWriterField];
  uint8_t reserved[56];
};
static_assert(sizeof(Slot) == 256, "on-media layout of pmirror-state-v1");

uint64_t now_unix_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

Status check_name(std::string_view what, const std::string& name, size_t max, bool allow_empty) {
  if (name.empty() && !allow_empty) {
    return Status(Errc::kInvalidArgument, std::string(what) + " must not be empty");
  }
  if (name.size() > max) {
    return Status(Errc::kInvalidArgument, std::string(what) + " \"" + name.substr(0, 80) +
                                              "...\" is " + std::to_string(name.size()) +
                                              " bytes; at most " + std::to_string(max) +
                                              " are allowed");
  }
  if (name.find('\0') != std::string::npos) {
    return Status(Errc::kInvalidArgument, std::string(what) + " must not contain NUL bytes");
  }
  return Status::Ok();
}

void copy_name(char* field, size_t field_size, const std::string& value) {
  std::memset(field, 0, field_size);
  std::memcpy(field, value.data(), std::min(value.size(), field_size - 1));
}

VolumeState to_state(const Slot& slot) {
  VolumeState state;
  state.name = read_name(slot.name, sizeof(slot.name));
  state.generation = slot.generation;
  state.last_sequence = slot.last_sequence;
  state.last_writer = read_name(slot.writer, sizeof(slot.writer));
  std::memcpy(state.uuid.data(), slot.uuid, state.uuid.size());
  state.created_unix_ns = slot.created_unix_ns;
  state.updated_unix_ns = slot.updated_unix_ns;
  return state;
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status permission_error(const std::string& path, const std::string& reason) {
  return Status(Errc::kPermissionDenied,
                "cannot open state pool " + path + ": " + reason +
                    "; it must be readable and writable by the user pmirrord runs as (uid " +
                    std::to_string(::geteuid()) + ")");
}

// Why pmemobj_open failed on a file that passed precheck_pool_file.
Status diagnose_open_failure(const std::string& path, int err, const std::string& reason) {
  if (err == EACCES || err == EPERM || err == EROFS) return permission_error(path, reason);
  if (err == EWOULDBLOCK || err == EAGAIN) {
    return Status(Errc::kBusy,
                  "state pool " + path +
                      " is already open (by another pmirrord, or twice in one process); stop it "
                      "or give this daemon its own state_pool");
  }
  // With no layout given, pmemobj_open skips the layout check, so success
  // here means a healthy pool of someone else's.
  if (PMEMobjpool* other = pmemobj_open(path.c_str(), nullptr)) {
    pmemobj_close(other);
    return Status(Errc::kInvalidArgument, "state pool " + path + " belongs to another program (" +
                                              reason + "; pmirrord expects layout " + kLayoutName +
                                              "); give pmirrord a path of its own");
  }
  return Status(Errc::kIoError, "state pool " + path + " cannot be opened: " + reason +
                                    "; it may be corrupt: run `pmempool check -v " + path +
                                    "` (`pmempool check -r` repairs), or restore it");
}

}  // namespace

struct StateStore::Root {
  uint64_t magic;       // kRootMagic once initialised (0 in a fresh pool)
  uint32_t version;     // kRootVersion
  uint32_t slot_count;  // kMaxVolumes
  uint64_t reserved[6];
  Slot slots[kMaxVolumes];
};

std::string uuid_to_string(const Uuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[uuid[i] >> 4];
    out += kHex[uuid[i] & 0x0f];
  }
  return out;
}

void StateStore::PoolCloser::operator()(PMEMobjpool* pop) const { pmemobj_close(pop); }

StateStore::~StateStore() = default;

Result<std::unique_ptr<StateStore>> StateStore::open(const std::string& pool_path,
                                                     bool create_if_missing) {
  if (pool_path.empty()) {
    return Status(Errc::kInvalidArgument, "state pool path is empty; set daemon.state_pool");
  }
  // Its directory, its type: what the checks (`pmirrorctl config check`,
  // `pmirrord --check-config`) also ask, in the same words.
  if (create_if_missing) preflight::make_default_directory(pool_path);
  PMIRROR_RETURN_IF_ERROR(preflight::pool_path(pool_path, "state pool", create_if_missing));
  std::unique_ptr<StateStore> store(new StateStore());
  store->path_ = pool_path;

  struct stat st {};
  if (::stat(pool_path.c_str(), &st) != 0) {
    int err = errno;
    if (err == EACCES) return permission_error(pool_path, std::strerror(err));
    if (err != ENOENT) {
      return errno_status(err == ENOTDIR ? Errc::kNotFound : Errc::kIoError,
                          "cannot look up state pool " + pool_path, err);
    }
    std::string parent = parent_dir(pool_path);
    if (!create_if_missing) {
      return Status(Errc::kNotFound, "state pool " + pool_path +
                                         " does not exist; let pmirrord create it, or create it "
                                         "with `pmempool create --layout=" +
                                         kLayoutName + " obj " + pool_path + "`");
    }
    PMEMobjpool* pop = pmemobj_create(pool_path.c_str(), kLayoutName, kPoolSize, 0600);
    if (pop == nullptr) {
      int cerr = errno;
      std::string reason = pmemobj_reason(cerr);
      if (cerr == EACCES || cerr == EPERM || cerr == EROFS) {
        return Status(Errc::kPermissionDenied, "cannot create state pool " + pool_path + ": " +
                                                   reason + "; the directory " + parent +
                                                   " must be writable by pmirrord");
      }
      return Status(cerr == ENOSPC ? Errc::kResourceExhausted : Errc::kIoError,
                    "cannot create state pool " + pool_path + " (" + std::to_string(kPoolSize) +
                        " bytes): " + reason);
    }
    store->pool_.reset(pop);
  } else {
    PMIRROR_RETURN_IF_ERROR(precheck_pool_file(
        pool_path, st,
        {"state pool",
         "; point state_pool at a new path (pmirrord creates it) or move this file away",
         permission_error}));
    PMEMobjpool* pop = pmemobj_open(pool_path.c_str(), kLayoutName);
    if (pop == nullptr) {
      int err = errno;
      return diagnose_open_failure(pool_path, err, pmemobj_reason(err));
    }
    store->pool_.reset(pop);
  }

  PMIRROR_RETURN_IF_ERROR(store->init_root());
  return store;
}

Status StateStore::init_root() {
  static_assert(sizeof(Root) == 64 + sizeof(Slot) * kMaxVolumes, "on-media layout");
  PMEMobjpool* pop = pool_.get();
  size_t existing = pmemobj_root_size(pop);
  if (existing != 0 && existing != sizeof(Root)) {
    return Status(Errc::kUnsupported, "state pool " + path_ + " has a root object of " +
                                          std::to_string(existing) + " bytes, expected " +
                                          std::to_string(sizeof(Root)) +
                                          "; it was written by an incompatible pmirror version");
  }
  // Allocated zeroed, atomically, on first use: all slots start free.
  PMEMoid oid = pmemobj_root(pop, sizeof(Root));
  if (OID_IS_NULL(oid)) {
    return Status(Errc::kIoError, "state pool " + path_ + ": cannot allocate the root object: " +
                                      pmemobj_reason(errno));
  }
  root_ = static_cast<Root*>(pmemobj_direct(oid));

  if (root_->magic == 0) {
    Root* root = root_;
    PMIRROR_RETURN_IF_ERROR(run_tx(pop, "initialising state pool " + path_, [root] {
      if (int err = snapshot(root, offsetof(Root, slots))) return err;
      root->magic = kRootMagic;
      root->version = kRootVersion;
      root->slot_count = kMaxVolumes;
      return 0;
    }));
  }
  if (root_->magic != kRootMagic) {
    return Status(Errc::kIoError, "state pool " + path_ +
                                      " has a damaged header (bad magic); restore it or move it "
                                      "away to start with empty state");
  }
  if (root_->version != kRootVersion || root_->slot_count != kMaxVolumes) {
    return Status(Errc::kUnsupported,
                  "state pool " + path_ + " has format version " + std::to_string(root_->version) +
                      " with " + std::to_string(root_->slot_count) +
                      " slots; this pmirror reads version " + std::to_string(kRootVersion) +
                      " with " + std::to_string(kMaxVolumes));
  }

  index_.clear();
  for (size_t i = 0; i < kMaxVolumes; ++i) {
    const Slot& slot = root_->slots[i];
    if (slot.in_use == 0) continue;
    std::string name = read_name(slot.name, sizeof(slot.name));
    if (slot.in_use != 1 || name.empty() || name.size() > kMaxVolumeName ||
        !index_.emplace(name, static_cast<int>(i)).second) {
      return Status(Errc::kIoError, "state pool " + path_ + ": slot " + std::to_string(i) +
                                        " is damaged (bad flag, name or a duplicate); run "
                                        "`pmempool check -v " +
                                        path_ + "`");
    }
  }
  return Status::Ok();
}

int StateStore::find_slot(const std::string& volume) const {
  auto it = index_.find(volume);
  return it == index_.end() ? -1 : it->second;
}

Result<VolumeState> StateStore::get_or_create(const std::string& volume) {
  PMIRROR_RETURN_IF_ERROR(check_name("volume name", volume, kMaxVolumeName, false));
  std::lock_guard lock(mutex_);
  if (int i = find_slot(volume); i >= 0) return to_state(root_->slots[i]);

  Slot* slot = nullptr;
  int index = -1;
  for (size_t i = 0; i < kMaxVolumes; ++i) {
    if (root_->slots[i].in_use == 0) {
      slot = &root_->slots[i];
      index = static_cast<int>(i);
      break;
    }
  }
  if (slot == nullptr) {
    return Status(Errc::kResourceExhausted,
                  "state pool " + path_ + " already holds " + std::to_string(kMaxVolumes) +
                      " volumes; remove the records of volumes that are no longer configured");
  }
  Uuid uuid = random_uuid();
  uint64_t now = now_unix_ns();
  PMIRROR_RETURN_IF_ERROR(run_tx(pool_.get(), "recording new volume " + volume, [&] {
    if (int err = snapshot(slot, sizeof(Slot))) return err;
    std::memset(slot, 0, sizeof(Slot));
    copy_name(slot->name, sizeof(slot->name), volume);
    slot->generation = 1;
    slot->last_sequence = 0;
    std::memcpy(slot->uuid, uuid.data(), uuid.size());
    slot->created_unix_ns = now;
    slot->updated_unix_ns = now;
    slot->in_use = 1;
    return 0;
  }));
  index_.emplace(volume, index);
  return to_state(*slot);
}

Result<VolumeState> StateStore::get(const std::string& volume) const {
  std::lock_guard lock(mutex_);
  int i = find_slot(volume);
  if (i < 0) {
    return Status(Errc::kNotFound, "volume " + volume + " has no record in state pool " + path_);
  }
  return to_state(root_->slots[i]);
}

Status StateStore::record(const std::string& volume, uint64_t generation, uint64_t sequence,
                          const std::string& writer) {
  PMIRROR_RETURN_IF_ERROR(check_name("writer identity", writer, kMaxWriterName, true));
  std::lock_guard lock(mutex_);
  int i = find_slot(volume);
  if (i < 0) {
    return Status(Errc::kNotFound, "volume " + volume + " has no record in state pool " + path_ +
                                       "; get_or_create it first");
  }
  Slot* slot = &root_->slots[i];
  if (generation < slot->generation) {
    return Status(Errc::kInvalidArgument, "stale generation for volume " + volume + ": " +
                                              std::to_string(generation) + " < current " +
                                              std::to_string(slot->generation) + " (writer " +
                                              writer + " was superseded)");
  }
  if (generation == slot->generation && sequence < slot->last_sequence) {
    return Status(Errc::kInvalidArgument,
                  "sequence for volume " + volume + " would go backwards in generation " +
                      std::to_string(generation) + ": " + std::to_string(sequence) + " < " +
                      std::to_string(slot->last_sequence));
  }
  uint64_t now = now_unix_ns();
  return run_tx(pool_.get(), "recording sequence for volume " + volume, [&] {
    if (int err = snapshot(slot, sizeof(Slot))) return err;
    slot->generation = generation;
    slot->last_sequence = sequence;
    copy_name(slot->writer, sizeof(slot->writer), writer);
    slot->updated_unix_ns = now;
    return 0;
  });
}

Status StateStore::set_generation(const std::string& volume, uint64_t generation) {
  std::lock_guard lock(mutex_);
  int i = find_slot(volume);
  if (i < 0) {
    return Status(Errc::kNotFound, "volume " + volume + " has no record in state pool " + path_ +
                                       "; get_or_create it first");
  }
  Slot* slot = &root_->slots[i];
  if (generation < slot->generation) {
    return Status(Errc::kInvalidArgument,
                  "generation of volume " + volume +
                      " cannot go backwards: " + std::to_string(generation) + " < current " +
                      std::to_string(slot->generation));
  }
  if (generation == slot->generation) return Status::Ok();
  uint64_t now = now_unix_ns();
  return run_tx(pool_.get(), "setting generation of volume " + volume, [&] {
    if (int err = snapshot(slot, sizeof(Slot))) return err;
    slot->generation = generation;
    slot->last_sequence = 0;
    slot->updated_unix_ns = now;
    return 0;
  });
}

Result<uint64_t> StateStore::bump_generation(const std::string& volume, const std::string& writer) {
  PMIRROR_RETURN_IF_ERROR(check_name("writer identity", writer, kMaxWriterName, true));
  std::lock_guard lock(mutex_);
  int i = find_slot(volume);
  if (i < 0) {
    return Status(Errc::kNotFound, "volume " + volume + " has no record in state pool " + path_ +
                                       "; get_or_create it first");
  }
  Slot* slot = &root_->slots[i];
  if (slot->generation == UINT64_MAX) {
    return Status(Errc::kResourceExhausted, "generation of volume " + volume + " is exhausted");
  }
  uint64_t next = slot->generation + 1;
  uint64_t now = now_unix_ns();
  PMIRROR_RETURN_IF_ERROR(run_tx(pool_.get(), "raising generation of volume " + volume, [&] {
    if (int err = snapshot(slot, sizeof(Slot))) return err;
    slot->generation = next;
    slot->last_sequence = 0;
    copy_name(slot->writer, sizeof(slot->writer), writer);
    slot->updated_unix_ns = now;
    return 0;
  }));
  return next;
}

std::vector<VolumeState> StateStore::list() const {
  std::vector<VolumeState> out;
  {
    std::lock_guard lock(mutex_);
    out.reserve(index_.size());
    for (const auto& [name, i] : index_) out.push_back(to_state(root_->slots[i]));
  }
  std::sort(out.begin(), out.end(),
            [](const VolumeState& a, const VolumeState& b) { return a.name < b.name; });
  return out;
}

Status StateStore::remove(const std::string& volume) {
  std::lock_guard lock(mutex_);
  int i = find_slot(volume);
  if (i < 0) {
    return Status(Errc::kNotFound, "volume " + volume + " has no record in state pool " + path_);
  }
  Slot* slot = &root_->slots[i];
  PMIRROR_RETURN_IF_ERROR(run_tx(pool_.get(), "removing volume " + volume, [&] {
    if (int err = snapshot(slot, sizeof(Slot))) return err;
    std::memset(slot, 0, sizeof(Slot));
    return 0;
  }));
  index_.erase(volume);
  return Status::Ok();
}

}  // namespace pmirror::state
