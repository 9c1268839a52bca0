#include "initiator/verifier.h"

#include <algorithm>
#include <span>
#include <thread>
#include <unordered_map>

#include "common/log.h"
#include "protocol/protocol.h"

namespace pmirror::initiator {
namespace {

// A suspect chunk is looked at again at most this many times before it is
// reported busy (the application keeps storing to it).
constexpr int kVerifyRounds = 8;
// Between two looks at a suspect: time for the application to persist what
// it stored (it may be waiting for the mutex, or between its store and its
// persist): at least kVerifySettle, and until a persist started after the
// last look or kVerifyPatience passed.
constexpr auto kVerifySettle = std::chrono::milliseconds(10);
constexpr auto kVerifyPatience = std::chrono::milliseconds(200);

}  // namespace

Verifier::Verifier(VolumeCore& core, PersistLedger& ledger, Peers& peers, Resyncer& resyncer)
    : core_(core), ledger_(ledger), peers_(peers), resyncer_(resyncer) {}

Result<std::vector<uint64_t>> Verifier::compare_chunks(Peer& peer, uint64_t first, uint64_t count) {
  const uint64_t chunk_size = core_.chunk_size;
  uint64_t offset = first * chunk_size;
  uint64_t length = std::min(count * chunk_size, core_.local->size() - offset);
  auto remote = peer.replica->verify_chunks(offset, length, chunk_size);
  if (!remote.ok()) return remote.status();
  // The same function the target uses, over the local copy.
  std::vector<uint64_t> ours = protocol::hash_chunks(
      std::span<const std::byte>(core_.local->data() + offset, length), chunk_size);
  std::vector<uint64_t> differing;
  for (uint64_t i = 0; i < remote->size() && i < ours.size(); ++i) {
    if ((*remote)[i] != ours[i]) differing.push_back(first + i);
  }
  return differing;
}

Status Verifier::ready(std::unique_lock<std::mutex>& lock, Peer& peer) {
  auto deadline = Clock::now() + 2 * core_.options.operation_timeout + std::chrono::seconds(1);
  while (peer.live() && peer.lagging && Clock::now() < deadline) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    lock.lock();
  }
  if (!peer.live()) {
    return Status(Errc::kConnectionError, "replica " + peer.label + " is not connected");
  }
  if (peer.lagging) {
    return Status(Errc::kTimeout, "replica " + peer.label + " is lagging and did not catch up");
  }
  return Status::Ok();
}

void Verifier::let_application_in(uint64_t looked_at) {
  auto start = Clock::now();
  std::this_thread::sleep_for(kVerifySettle);
  while (Clock::now() - start < kVerifyPatience) {
    {
      std::lock_guard lock(core_.mutex);
      if (ledger_.next_sequence() != looked_at && core_.app_waiting.load() == 0) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::vector<std::pair<uint64_t, uint64_t>> Verifier::chunk_ranges(
    const std::vector<uint64_t>& sorted) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t chunk : sorted) {
    uint64_t offset = chunk * core_.chunk_size;
    uint64_t length = std::min(core_.chunk_size, core_.local->size() - offset);
    if (!ranges.empty() && ranges.back().first + ranges.back().second == offset) {
      ranges.back().second += length;
    } else {
      ranges.emplace_back(offset, length);
    }
  }
  return ranges;
}

// Compares the copies in two steps. First every chunk, a batch per hold of
// the mutex (persists go on between batches): the chunks that differ are
// only suspects -- a persist may be on its way, or the application may have
// stored into the chunk and not persisted yet (stores are not visible to us
// until their persist). Then each suspect, in rounds: with the mutex held
// and nothing in flight to the replica, hash the local chunk, ask the
// replica's hash, hash the local chunk again. Local bytes that changed
// between the two hashes are being written right now; a chunk is reported
// as differing only when it differed in two rounds with the same local
// bytes, and the application had the chance to persist between them.
// Suspects still changing after kVerifyRounds are reported busy (not
// verified), never as differing. Chunks recorded dirty for the replica are
// known to differ and are left to the resync.
VerifyPeerResult Verifier::verify_peer(Peer& peer, bool mark_dirty) {
  const uint64_t chunk_size = core_.chunk_size;
  const uint64_t chunks = core_.chunks;
  VerifyPeerResult result;
  result.peer = peer.label;
  std::vector<uint64_t> suspects;
  const uint64_t batch = protocol::kMaxVerifyChunks;
  for (uint64_t first = 0; first < chunks; first += batch) {
    std::unique_lock lock(core_.mutex);
    if (Status status = ready(lock, peer); !status.ok()) {
      result.status = status;
      return result;
    }
    uint64_t count = std::min(batch, chunks - first);
    auto differing = compare_chunks(peer, first, count);
    if (!differing.ok()) {
      result.status = differing.status();
      peers_.drop(peer, differing.status());
      return result;
    }
    suspects.insert(suspects.end(), differing->begin(), differing->end());
    result.chunks_compared += count;
    result.bytes_compared += std::min(count * chunk_size, core_.local->size() - first * chunk_size);
    peer.verify_done_bytes = result.bytes_compared;
  }

  std::vector<uint64_t> confirmed;
  std::unordered_map<uint64_t, uint64_t> differed;  // chunk -> local hash when it last differed
  uint64_t looked_at = 0;
  for (int round = 0; round < kVerifyRounds && !suspects.empty(); ++round) {
    if (round > 0) let_application_in(looked_at);
    std::vector<uint64_t> again;
    for (size_t group = 0; group < suspects.size(); group += batch) {
      std::unique_lock lock(core_.mutex);
      if (Status status = ready(lock, peer); !status.ok()) {
        result.status = status.with_context("verify");
        return result;
      }
      // A persist on its way is not a difference.
      if (Status drained = peer.replica->drain(); !drained.ok()) {
        result.status = drained;
        peers_.drop(peer, drained);
        return result;
      }
      size_t group_end = std::min(suspects.size(), group + batch);
      for (size_t run = group; run < group_end;) {
        size_t run_end = run + 1;
        while (run_end < group_end && suspects[run_end] == suspects[run_end - 1] + 1) ++run_end;
        uint64_t first = suspects[run];
        uint64_t offset = first * chunk_size;
        uint64_t length = std::min((run_end - run) * chunk_size, core_.local->size() - offset);
        std::span<const std::byte> bytes(core_.local->data() + offset, length);
        std::vector<uint64_t> before = protocol::hash_chunks(bytes, chunk_size);
        auto remote = peer.replica->verify_chunks(offset, length, chunk_size);
        if (!remote.ok()) {
          result.status = remote.status();
          peers_.drop(peer, remote.status());
          return result;
        }
        std::vector<uint64_t> after = protocol::hash_chunks(bytes, chunk_size);
        for (uint64_t i = 0; i < before.size() && i < remote->size(); ++i) {
          uint64_t chunk = first + i;
          if (core_.meta->is_dirty(peer.meta_index, chunk)) {
            differed.erase(chunk);  // known; the resync copies it
          } else if (before[i] != after[i]) {
            differed.erase(chunk);  // being stored to right now
            again.push_back(chunk);
          } else if ((*remote)[i] == before[i]) {
            differed.erase(chunk);
          } else if (auto seen = differed.find(chunk);
                     seen != differed.end() && seen->second == before[i]) {
            confirmed.push_back(chunk);
          } else {
            differed[chunk] = before[i];
            again.push_back(chunk);
          }
        }
        run = run_end;
      }
      looked_at = ledger_.next_sequence();
    }
    suspects = std::move(again);
  }
  std::sort(confirmed.begin(), confirmed.end());  // confirmed in different rounds
  result.mismatches = chunk_ranges(confirmed);
  result.busy = chunk_ranges(suspects);
  if (mark_dirty && !confirmed.empty()) {
    std::lock_guard lock(core_.mutex);
    if (peer.live()) {
      for (uint64_t chunk : confirmed) {
        peers_.mark_missed(peer, chunk * chunk_size, chunk_size);
      }
      result.marked_dirty = confirmed.size();
      // Known to differ: it does not count for acks until repaired. (A
      // lagging replica is resynced once it answers again.)
      peers_.ensure_tracked(peer);
      peer.in_sync = false;
      if (!peer.lagging) {
        resyncer_.start(peer, false,
                        "verify found " + std::to_string(confirmed.size()) + " chunks that differ");
      }
      core_.supervisor_wakeup.wake();
    }
  }
  log::info("volume {}: verify of {}: {} chunks compared, {} differ, {} busy", core_.options.name,
            peer.label, result.chunks_compared, confirmed.size(), suspects.size());
  return result;
}

Result<std::vector<VerifyPeerResult>> Verifier::verify(const std::string& peer, bool mark_dirty) {
  std::vector<Peer*> targets;
  {
    std::lock_guard lock(core_.mutex);
    if (!peer.empty()) {
      PMIRROR_ASSIGN_OR_RETURN(Peer * found, peers_.lookup(peer));
      targets.push_back(found);
    } else {
      for (const auto& each : peers_.all()) {
        if (each->live()) targets.push_back(each.get());
      }
    }
  }
  if (targets.empty()) {
    return Status(Errc::kFailedPrecondition,
                  "no replica of '" + core_.options.name + "' is connected to verify against");
  }
  std::vector<VerifyPeerResult> results;
  for (Peer* target : targets) {
    {
      std::lock_guard lock(core_.mutex);
      target->verifying = true;
      target->verify_done_bytes = 0;
    }
    results.push_back(verify_peer(*target, mark_dirty));
    std::lock_guard lock(core_.mutex);
    target->verifying = false;
  }
  return results;
}

}  // namespace pmirror::initiator
