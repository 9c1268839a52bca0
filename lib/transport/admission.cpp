#include "transport/admission.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "common/log.h"

namespace pmirror::transport {

std::string admission_source(const sockaddr* address, socklen_t length) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address->sa_family == AF_INET && length >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    auto* in = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return text;
  }
  if (address->sa_family == AF_INET6 && length >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    in6_addr a = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      in_addr v4;
      std::memcpy(&v4, a.s6_addr + 12, sizeof v4);
      inet_ntop(AF_INET, &v4, text, sizeof text);
      return text;
    }
    // One host usually holds a whole /64: count the prefix, not the address.
    std::memset(a.s6_addr + 8, 0, 8);
    inet_ntop(AF_INET6, &a, text, sizeof text);
    return std::string(text) + "/64";
  }
  return "?";
}

void AdmissionControl::Ticket::release() {
  if (owner_ == nullptr) return;
  owner_->release(id_);
  owner_.reset();
}

std::shared_ptr<AdmissionControl> AdmissionControl::create(const AdmissionOptions& options) {
  return std::shared_ptr<AdmissionControl>(new AdmissionControl(options));
}

std::unique_ptr<AdmissionControl::Ticket> AdmissionControl::admit(const std::string& source,
                                                                  std::function<void()> on_evict,
                                                                  bool* evicted) {
  std::lock_guard lock(mutex_);
  bool made_room = false;
  auto it = per_source_.find(source);
  size_t from_source = it == per_source_.end() ? 0 : it->second;
  if (from_source >= std::max<uint32_t>(1, options_.max_unauthenticated_per_source)) {
    made_room = evict_locked(&source);
  } else if (entries_.size() >= std::max<uint32_t>(1, options_.max_unauthenticated)) {
    made_room = evict_locked(nullptr);
  }
  if (evicted != nullptr) *evicted = made_room;
  uint64_t id = next_id_++;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  entries_.emplace(id, Entry{source, std::move(on_evict), flag});
  ++per_source_[source];
  return std::unique_ptr<Ticket>(new Ticket(shared_from_this(), id, std::move(flag)));
}

bool AdmissionControl::evict_one() {
  std::lock_guard lock(mutex_);
  return evict_locked(nullptr);
}

bool AdmissionControl::evict_locked(const std::string* source) {
  std::string victim_source;
  if (source != nullptr) {
    victim_source = *source;
  } else {
    // The busiest source; among equals, the one whose oldest connection is
    // the oldest (entries_ is in arrival order, so the first seen).
    size_t most = 0;
    for (const auto& [id, entry] : entries_) {
      size_t n = per_source_[entry.source];
      if (n > most) {
        most = n;
        victim_source = entry.source;
      }
    }
    if (most == 0) return false;
  }
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.source != victim_source) continue;
    Entry entry = std::move(it->second);
    entries_.erase(it);
    if (--per_source_[entry.source] == 0) per_source_.erase(entry.source);
    entry.evicted->store(true);
    if (entry.on_evict) entry.on_evict();
    evicted_.fetch_add(1);
    return true;
  }
  return false;
}

void AdmissionControl::release(uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;  // evicted
  if (--per_source_[it->second.source] == 0) per_source_.erase(it->second.source);
  entries_.erase(it);
}

AdmissionCounters AdmissionControl::counters() const {
  AdmissionCounters c;
  c.unauthenticated = unauthenticated();
  c.evicted = evicted_.load();
  c.timed_out = timed_out_.load();
  c.dropped = dropped_.load();
  c.failed = failed_.load();
  return c;
}

size_t AdmissionControl::unauthenticated() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

size_t AdmissionControl::unauthenticated(const std::string& source) const {
  std::lock_guard lock(mutex_);
  auto it = per_source_.find(source);
  return it == per_source_.end() ? 0 : it->second;
}

void AdmissionControl::warn_evicted(const std::string& listener,
                                    const std::string& newcomer) const {
  log::warn(
      "{}: too many unauthenticated connections (max_unauthenticated {}, "
      "max_unauthenticated_per_source {}): closed the oldest to make room for {}; further ones "
      "are counted (pmirrorctl status: admission)",
      listener, options_.max_unauthenticated, options_.max_unauthenticated_per_source, newcomer);
}

void AdmissionControl::warn_evicted_since(const std::string& listener, uint64_t count,
                                          std::chrono::seconds period) {
  log::warn(
      "{}: closed {} more unauthenticated connection(s) in the last {} s to make room for "
      "newer ones",
      listener, count, period.count());
}

}  // namespace pmirror::transport
