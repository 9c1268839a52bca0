#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "initiator/initiator.h"
#include "initiator/replica.h"
#include "region/region.h"

namespace pmirror::initiator {

using Clock = std::chrono::steady_clock;

class Volume::Impl {
 public:
  VolumeOptions options;
  std::unique_ptr<region::Region> local;
  std::vector<std::unique_ptr<Replica>> replicas;  // guarded by mutex

  mutable std::mutex mutex;
  uint64_t next_sequence = 1;    // guarded by mutex
  uint64_t last_completed = 0;   // every persist up to here is durable everywhere
  Clock::time_point last_activity = Clock::now();

  std::mutex heartbeat_mutex;
  std::condition_variable heartbeat_wake;
  bool stopping = false;  // guarded by heartbeat_mutex
  std::thread heartbeat_thread;

  Status check_range(uint64_t offset, uint64_t length) const {
    if (offset > local->size() || length > local->size() - offset) {
      return Status(Errc::kInvalidArgument,
                    "range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                        ") is outside volume '" + options.name + "' of " +
                        std::to_string(local->size()) + " bytes");
    }
    return Status::Ok();
  }

  // Waits (mutex held) until `sequence` is durable on every replica.
  Status wait_locked(uint64_t sequence) {
    if (sequence <= last_completed) return Status::Ok();
    if (sequence >= next_sequence) {
      return Status(Errc::kInvalidArgument,
                    "sequence " + std::to_string(sequence) + " was never started");
    }
    Status first_error;
    std::string errors;
    for (auto& replica : replicas) {
      Status waited = replica->wait_for(sequence);
      if (!waited.ok()) {
        if (first_error.ok()) first_error = waited;
        if (!errors.empty()) errors += "; ";
        errors += waited.message();
      }
    }
    last_activity = Clock::now();
    if (!first_error.ok()) return Status(first_error.code(), errors);
    last_completed = sequence;
    return Status::Ok();
  }

  Result<uint64_t> start_locked(uint64_t offset, uint64_t length) {
    // Keep at most max_in_flight persists outstanding.
    if (next_sequence - 1 - last_completed >= options.max_in_flight) {
      PMIRROR_RETURN_IF_ERROR(wait_locked(next_sequence - options.max_in_flight));
    }
    uint64_t sequence = next_sequence++;
    Status first_error;
    std::string errors;
    for (auto& replica : replicas) {
      Status posted = replica->post_persist(sequence, offset, length);
      if (!posted.ok()) {
        if (first_error.ok()) first_error = posted;
        if (!errors.empty()) errors += "; ";
        errors += posted.message();
      }
    }
    // The local copy is persisted while the replicas work.
    Status local_persist = local->persist(offset, length);
    last_activity = Clock::now();
    if (!first_error.ok()) return Status(first_error.code(), errors);
    if (!local_persist.ok()) return local_persist.with_context("local copy");
    return sequence;
  }

  void heartbeat_loop() {
    std::unique_lock wake_lock(heartbeat_mutex);
    const auto interval = options.heartbeat_interval;
    while (!stopping) {
      heartbeat_wake.wait_for(wake_lock, interval / 2);
      if (stopping) break;
      // Never make the application wait for a heartbeat.
      std::unique_lock lock(mutex, std::try_to_lock);
      if (!lock.owns_lock() || Clock::now() - last_activity < interval) continue;
      for (auto& replica : replicas) {
        if (!replica->failed()) (void)replica->heartbeat();
      }
      last_activity = Clock::now();
    }
  }
};

Volume::Volume(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Volume::~Volume() {
  {
    std::lock_guard lock(impl_->heartbeat_mutex);
    impl_->stopping = true;
  }
  impl_->heartbeat_wake.notify_all();
  if (impl_->heartbeat_thread.joinable()) impl_->heartbeat_thread.join();
  std::lock_guard lock(impl_->mutex);
  for (auto& replica : impl_->replicas) replica->close();
}

Result<std::unique_ptr<Volume>> Volume::open(const VolumeOptions& options) {
  if (options.name.empty()) return Status(Errc::kInvalidArgument, "volume name is empty");
  if (options.identity.empty()) {
    return Status(Errc::kInvalidArgument, "identity is empty: targets admit peers by identity");
  }
  if (options.max_in_flight == 0) {
    return Status(Errc::kInvalidArgument, "max_in_flight must be at least 1");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;

  region::OpenOptions region_options{options.local_path, options.size, options.create};
  auto local = region::Region::open(region_options);
  if (!local.ok()) return local.status().with_context("local copy of '" + options.name + "'");
  impl->local = std::move(local).value();

  // Connect to every replica at once: a slow one should not delay the rest.
  std::vector<std::future<Result<std::unique_ptr<Replica>>>> pending;
  for (const auto& spec : options.replicas) {
    pending.push_back(std::async(std::launch::async, [&options, &spec, &impl] {
      return Replica::connect({options, spec, impl->local->data(), impl->local->size()});
    }));
  }
  std::string errors;
  Errc first_code = Errc::kOk;
  for (auto& future : pending) {
    auto replica = future.get();
    if (!replica.ok()) {
      if (first_code == Errc::kOk) first_code = replica.status().code();
      if (!errors.empty()) errors += "; ";
      errors += replica.status().message();
      continue;
    }
    impl->replicas.push_back(std::move(replica).value());
  }
  if (first_code != Errc::kOk) {
    for (auto& replica : impl->replicas) replica->close();
    return Status(first_code, "opening volume '" + options.name + "': " + errors);
  }
  uint64_t highest = 0;
  for (auto& replica : impl->replicas) highest = std::max(highest, replica->last_sequence());
  // Sequences continue past whatever any replica recorded, so that each
  // target sees them rise.
  impl->next_sequence = highest + 1;
  impl->last_completed = highest;

  Impl* raw = impl.get();
  impl->heartbeat_thread = std::thread([raw] { raw->heartbeat_loop(); });
  return std::unique_ptr<Volume>(new Volume(std::move(impl)));
}

std::byte* Volume::data() const { return impl_->local->data(); }
uint64_t Volume::size() const { return impl_->local->size(); }
bool Volume::is_pmem() const { return impl_->local->is_pmem(); }

Status Volume::persist(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  if (length == 0) return Status::Ok();
  std::lock_guard lock(impl_->mutex);
  PMIRROR_ASSIGN_OR_RETURN(uint64_t sequence, impl_->start_locked(offset, length));
  return impl_->wait_locked(sequence);
}

Status Volume::write(uint64_t offset, const void* source, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  std::memcpy(impl_->local->data() + offset, source, length);
  return persist(offset, length);
}

Result<uint64_t> Volume::persist_async(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(impl_->check_range(offset, length));
  if (length == 0) {
    return Status(Errc::kInvalidArgument, "persist_async of an empty range");
  }
  std::lock_guard lock(impl_->mutex);
  return impl_->start_locked(offset, length);
}

Status Volume::wait(uint64_t sequence) {
  std::lock_guard lock(impl_->mutex);
  return impl_->wait_locked(sequence);
}

Status Volume::drain() {
  std::lock_guard lock(impl_->mutex);
  return impl_->wait_locked(impl_->next_sequence - 1);
}

std::vector<ReplicaStatus> Volume::replicas() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<ReplicaStatus> out;
  for (const auto& replica : impl_->replicas) out.push_back(replica->status());
  return out;
}

}  // namespace pmirror::initiator
