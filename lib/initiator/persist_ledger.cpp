#include "initiator/persist_ledger.h"

#include <algorithm>
#include <string>

namespace pmirror::initiator {

void PersistLedger::acknowledge(uint64_t sequence) {
  acknowledged_ = std::max(acknowledged_, sequence);
}

void PersistLedger::continue_after(uint64_t sequence) {
  next_ = sequence + 1;
  acknowledged_ = sequence;
}

bool PersistLedger::quiet() const { return last_started() == acknowledged_ && !has_unsettled(); }

uint64_t PersistLedger::start(std::span<const protocol::Range> ranges, uint64_t staged_end) {
  InFlightPersist persist;
  persist.sequence = next_++;
  persist.first_range = ranges_base_ + ranges_.size();
  persist.range_count = static_cast<uint32_t>(ranges.size());
  persist.staged_end = staged_end;
  ranges_.insert(ranges_.end(), ranges.begin(), ranges.end());
  persists_.push_back(persist);
  return persist.sequence;
}

void PersistLedger::settle(uint64_t upto) {
  settled_ = std::max(settled_, upto);
  release();
}

PersistLedger::Records::const_iterator PersistLedger::find(uint64_t sequence) const {
  return std::lower_bound(
      persists_.begin() + static_cast<ptrdiff_t>(head_), persists_.end(), sequence,
      [](const InFlightPersist& persist, uint64_t wanted) { return persist.sequence < wanted; });
}

PersistLedger::Records::iterator PersistLedger::find(uint64_t sequence) {
  return std::lower_bound(
      persists_.begin() + static_cast<ptrdiff_t>(head_), persists_.end(), sequence,
      [](const InFlightPersist& persist, uint64_t wanted) { return persist.sequence < wanted; });
}

void PersistLedger::posted(size_t replica, uint64_t sequence,
                           std::chrono::steady_clock::time_point at) {
  // Posting follows start: the persist is the newest, or close to it.
  auto it =
      size() > 0 && persists_.back().sequence == sequence ? persists_.end() - 1 : find(sequence);
  if (it == persists_.end() || it->sequence != sequence || it->pending.test(replica)) return;
  if (pending_[replica] == 0) pending_from_[replica] = sequence;
  it->pending.set(replica);
  it->posted_at[replica] = at;
  ++pending_[replica];
}

const InFlightPersist* PersistLedger::oldest_pending(size_t replica) const {
  if (pending_[replica] == 0) return nullptr;
  for (auto it = find(pending_from_[replica]); it != persists_.end(); ++it) {
    if (it->pending.test(replica)) {
      pending_from_[replica] = it->sequence;
      return &*it;
    }
  }
  return nullptr;
}

std::optional<uint64_t> PersistLedger::newest_pending(size_t replica) const {
  if (pending_[replica] == 0) return std::nullopt;
  const auto oldest = std::make_reverse_iterator(persists_.begin() + static_cast<ptrdiff_t>(head_));
  for (auto it = persists_.rbegin(); it != oldest; ++it) {
    if (it->pending.test(replica)) return it->sequence;
  }
  return std::nullopt;
}

bool PersistLedger::is_pending(size_t replica, uint64_t sequence) const {
  if (pending_[replica] == 0) return false;
  auto it = find(sequence);
  return it != persists_.end() && it->sequence == sequence && it->pending.test(replica);
}

Result<std::chrono::steady_clock::time_point> PersistLedger::complete(size_t replica,
                                                                      uint64_t sequence,
                                                                      std::string_view what) {
  const InFlightPersist* oldest = oldest_pending(replica);
  if (oldest == nullptr || oldest->sequence != sequence) {
    return Status(Errc::kProtocolError,
                  std::string(what) + " for sequence " + std::to_string(sequence) +
                      (oldest == nullptr ? std::string(" with nothing in flight")
                                         : ", expected " + std::to_string(oldest->sequence)));
  }
  auto it = find(sequence);
  it->pending.reset(replica);
  --pending_[replica];
  pending_from_[replica] = sequence + 1;
  auto posted_at = it->posted_at[replica];
  release();
  return posted_at;
}

void PersistLedger::forget(size_t replica) {
  if (pending_[replica] == 0) return;
  for (auto it = find(0); it != persists_.end(); ++it) it->pending.reset(replica);
  pending_[replica] = 0;
  release();
}

void PersistLedger::release() {
  while (head_ < persists_.size() && persists_[head_].sequence <= settled_ &&
         persists_[head_].pending.none()) {
    if (persists_[head_].staged_end != 0) staging_released_ = persists_[head_].staged_end;
    ++head_;
  }
  if (head_ == persists_.size()) {
    persists_.clear();
    head_ = 0;
    ranges_base_ += ranges_.size();
    ranges_.clear();
  } else if (head_ >= 64 && head_ * 2 >= persists_.size()) {
    persists_.erase(persists_.begin(), persists_.begin() + static_cast<ptrdiff_t>(head_));
    head_ = 0;
    const uint64_t first = persists_.front().first_range;
    ranges_.erase(ranges_.begin(), ranges_.begin() + static_cast<ptrdiff_t>(first - ranges_base_));
    ranges_base_ = first;
  }
}

}  // namespace pmirror::initiator
