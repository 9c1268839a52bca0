#include "transport/tcp/registration.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <random>
#include <string>

namespace pmirror::transport::tcp {

namespace {
std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}
}  // namespace

RegistrationTable::RegistrationTable() {
  std::random_device rd;
  salt_ = rd();
}

uint32_t RegistrationTable::add(std::byte* base, size_t length, uint32_t access,
                                PersistFn persist) {
  std::lock_guard lk(mu_);
  uint32_t rkey = 0;
  // Random-looking, nonzero, unique on this connection: a stale or guessed
  // rkey from another connection is very unlikely to hit a live one.
  do {
    rkey = (++counter_ * 0x9E3779B1u) ^ salt_;
  } while (rkey == 0 || regs_.count(rkey) != 0);
  auto reg = std::make_unique<Reg>();
  reg->rkey = rkey;
  reg->base = base;
  reg->length = length;
  reg->access = access;
  reg->persist = std::move(persist);
  regs_.emplace(rkey, std::move(reg));
  return rkey;
}

Status RegistrationTable::remove(uint32_t rkey) {
  std::unique_ptr<Reg> reg;
  {
    std::unique_lock lk(mu_);
    auto it = regs_.find(rkey);
    if (it == regs_.end()) return Status::Ok();
    Reg* r = it->second.get();
    // Unlisted first so no new pin can start; then wait out the current ones.
    reg = std::move(it->second);
    regs_.erase(it);
    unpinned_.wait(lk, [&] { return r->pins == 0; });
  }
  reg->flushing.swap(reg->dirty);
  return persist_ranges(*reg);
}

Result<RegistrationTable::Reg*> RegistrationTable::pin(uint32_t rkey, uint64_t addr, uint64_t len,
                                                       uint32_t need, std::string_view op) {
  std::lock_guard lk(mu_);
  auto it = regs_.find(rkey);
  if (it == regs_.end())
    return Status(Errc::kPermissionDenied, "remote access error: " + std::string(op) +
                                               " with rkey " + hex(rkey) +
                                               ", which is not registered on this connection");
  Reg* reg = it->second.get();
  if ((reg->access & need) == 0)
    return Status(Errc::kPermissionDenied,
                  "remote access error: " + std::string(op) +
                      (need == kRemoteWrite ? " into" : " from") + " rkey " + hex(rkey) +
                      ", which was registered without " +
                      (need == kRemoteWrite ? "kRemoteWrite" : "kRemoteRead") + " access");
  auto base = reinterpret_cast<uint64_t>(reg->base);
  // Overflow-safe: addr - base is checked before it is used in a sum.
  if (addr < base || addr - base > reg->length || len > reg->length - (addr - base))
    return Status(Errc::kPermissionDenied,
                  "remote access error: " + std::string(op) + " of " + std::to_string(len) +
                      " bytes at " + hex(addr) + " is outside registration rkey " + hex(rkey) +
                      " [" + hex(base) + ", +" + std::to_string(reg->length) + ")");
  ++reg->pins;
  return reg;
}

void RegistrationTable::unpin(Reg* reg) {
  std::lock_guard lk(mu_);
  if (--reg->pins == 0) unpinned_.notify_all();
}

bool RegistrationTable::unpin_written(Reg* reg, uint64_t addr, uint64_t len) {
  std::lock_guard lk(mu_);
  bool too_many = false;
  if (len > 0) {
    uint64_t off = addr - reinterpret_cast<uint64_t>(reg->base);
    auto& d = reg->dirty;
    if (!d.empty() && d.back().first + d.back().second == off) {
      d.back().second += len;  // the common sequential case stays one range
    } else {
      d.emplace_back(off, len);
      if (d.size() > kMaxDirtyRanges) {
        merge(d);
        too_many = d.size() > kMaxDirtyRanges / 2;
      }
    }
  }
  if (--reg->pins == 0) unpinned_.notify_all();
  return too_many;
}

Status RegistrationTable::unpin_persisted(Reg* reg, uint64_t addr, uint64_t len) {
  Status persisted;
  // Pinned meanwhile: remove() waits for us. Nothing else calls this
  // registration's PersistFn concurrently (the receiver thread does all).
  if (len > 0 && reg->persist) persisted = reg->persist(reinterpret_cast<const void*>(addr), len);
  unpin(reg);
  return persisted;
}

Status RegistrationTable::persist_all() {
  {
    std::lock_guard lk(mu_);
    persist_batch_.clear();
    for (auto& [rkey, reg] : regs_) {
      if (reg->dirty.empty()) continue;
      ++reg->pins;  // keeps remove() from returning while we persist
      reg->flushing.swap(reg->dirty);
      reg->dirty.clear();
      persist_batch_.push_back(reg.get());
    }
  }
  for (Reg* reg : persist_batch_) {
    Status persisted = persist_ranges(*reg);
    if (!persisted.ok() && persist_failure_.ok()) persist_failure_ = std::move(persisted);
  }
  std::lock_guard lk(mu_);
  for (Reg* reg : persist_batch_)
    if (--reg->pins == 0) unpinned_.notify_all();
  persist_batch_.clear();
  return persist_failure_;
}

Status RegistrationTable::persist_ranges(Reg& reg) {
  merge(reg.flushing);
  Status first;
  if (reg.persist) {
    // Every range is tried even after a failure: what can still be made
    // durable should be.
    for (auto [off, len] : reg.flushing) {
      Status persisted = reg.persist(reg.base + off, len);
      if (!persisted.ok() && first.ok()) first = std::move(persisted);
    }
  }
  reg.flushing.clear();
  return first;
}

void RegistrationTable::merge(std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  if (ranges.size() < 2) return;
  std::sort(ranges.begin(), ranges.end());
  size_t out = 0;
  for (size_t i = 1; i < ranges.size(); ++i) {
    auto& cur = ranges[out];
    if (ranges[i].first <= cur.first + cur.second) {
      cur.second = std::max(cur.first + cur.second, ranges[i].first + ranges[i].second) - cur.first;
    } else {
      ranges[++out] = ranges[i];
    }
  }
  ranges.resize(out + 1);
}

}  // namespace pmirror::transport::tcp
