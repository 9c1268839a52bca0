#include "initiator/session_reaper.h"

#include "initiator/replica.h"

namespace pmirror::initiator {

SessionReaper::SessionReaper() = default;

SessionReaper::~SessionReaper() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
  queue_.clear();  // none left unless the thread never started
}

void SessionReaper::reap(std::unique_ptr<Replica> session) {
  if (!session) return;
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(session));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  work_.notify_one();
}

void SessionReaper::drain() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && ending_ == 0; });
}

size_t SessionReaper::pending() const {
  std::lock_guard lock(mutex_);
  return queue_.size() + ending_;
}

void SessionReaper::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    work_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left to end
    std::unique_ptr<Replica> session = std::move(queue_.front());
    queue_.pop_front();
    ++ending_;
    lock.unlock();
    session.reset();  // the teardown that may block
    lock.lock();
    --ending_;
    idle_.notify_all();
  }
}

}  // namespace pmirror::initiator
