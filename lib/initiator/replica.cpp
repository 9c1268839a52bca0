#include "initiator/replica.h"

#include <algorithm>
#include <thread>

#include "auth/auth.h"
#include "common/log.h"

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// wr_id tags of our own one-sided operations (the Messenger uses bit 63).
constexpr uint64_t kWriteTag = 1ull << 62;
constexpr uint64_t kReadTag = 1ull << 61;
constexpr uint64_t kResyncTag = 1ull << 60;
// The flush Read between two groups of an ordered persist: its completion
// completes nothing (the persist's last Read does).
constexpr uint64_t kGroupFlushTag = 1ull << 59;
// One-sided commit: the ATOMIC WRITE of a persist's sequence into the
// target's commit word, and a FLUSH of the word when the replica is idle.
constexpr uint64_t kCommitWordTag = 1ull << 58;
constexpr uint64_t kCommitWordFlushTag = 1ull << 57;
constexpr uint64_t kSequenceMask = (1ull << 56) - 1;
// The read-after-write flush reads this many bytes (as librpma and librpmem do).
constexpr uint64_t kFlushReadSize = 8;
// While waiting for a receive credit, completions are processed in slices
// of this.
constexpr auto kCreditPoll = 10ms;

}  // namespace

Replica::Replica(const Setup& setup)
    : label_(setup.spec.node.empty() ? setup.spec.address + ":" + std::to_string(setup.spec.port)
                                     : setup.spec.node + " (" + setup.spec.address + ":" +
                                           std::to_string(setup.spec.port) + ")"),
      spec_(setup.spec),
      operation_timeout_(setup.options.operation_timeout) {
  // One pump decodes at most a poll's worth of messages (the Messenger
  // polls 32 completions at a time): no growth on the persist path.
  pumped_.reserve(32);
}

Replica::~Replica() {
  // A collector may still wait on the connection (the reaper destroys
  // dropped sessions without the volume mutex): let it out first.
  if (messenger_) messenger_->quiesce();
  close();
}

Result<std::unique_ptr<Replica>> Replica::connect(const Setup& setup) {
  std::unique_ptr<Replica> replica(new Replica(setup));
  Status done = replica->handshake(setup);
  if (!done.ok()) {
    if (replica->connection_) replica->connection_->shutdown();
    return done.with_context("replica " + replica->label_);
  }
  replica->state_ = ReplicaState::kConnected;
  return replica;
}

Status Replica::handshake(const Setup& setup) {
  transport::ConnectionOptions connection_options;
  connection_options.connect_timeout = setup.options.connect_timeout;
  connection_options.poll_mode = transport_poll_mode(setup.options.poll);
  PMIRROR_ASSIGN_OR_RETURN(transport::Kind kind, replica_transport(spec_.transport));
  auto connection = transport::connect(kind, spec_.address, spec_.port, connection_options);
  if (!connection.ok()) return connection.status();
  connection_ = std::move(connection).value();
  messenger_ = std::make_unique<session::Messenger>(*connection_);

  auto client_nonce = auth::random_nonce();
  if (!client_nonce.ok()) return client_nonce.status();
  protocol::Hello hello;
  hello.volume = setup.options.name;
  hello.identity = setup.options.identity;
  hello.client_nonce = *client_nonce;
  hello.flags = protocol::kHelloCumulativeAcks | protocol::kHelloLineage |
                protocol::kHelloPlacementOrder | protocol::kHelloNativeFlush |
                protocol::kHelloOneSidedCommit;
  if (setup.promoted) hello.flags |= protocol::kHelloPromoted;
  hello.lineage = setup.lineage;
  PMIRROR_RETURN_IF_ERROR(messenger_->send(hello));

  const auto timeout = setup.options.connect_timeout;
  PMIRROR_ASSIGN_OR_RETURN(protocol::Challenge challenge,
                           messenger_->receive_as<protocol::Challenge>(timeout));
  auth::SessionContext context{hello.volume, hello.identity, hello.client_nonce,
                               challenge.server_nonce};
  PMIRROR_RETURN_IF_ERROR(
      messenger_->send(protocol::AuthResponse{auth::initiator_proof(spec_.secret, context)}));

  PMIRROR_ASSIGN_OR_RETURN(protocol::VolumeDescriptor accepted,
                           messenger_->receive_as<protocol::VolumeDescriptor>(timeout));
  const protocol::VolumeDescriptor* descriptor = &accepted;
  if (!auth::macs_equal(descriptor->mac, auth::target_proof(spec_.secret, context))) {
    return Status(Errc::kPermissionDenied,
                  "the target could not prove it knows the volume's secret (is the same secret "
                  "configured on both sides?)");
  }
  if (descriptor->region_size != setup.local_size) {
    return Status(Errc::kInvalidArgument,
                  "the replica's region of volume '" + hello.volume + "' is " +
                      std::to_string(descriptor->region_size) + " bytes, the local copy is " +
                      std::to_string(setup.local_size) + " bytes; they must be equal");
  }
  if (descriptor->recv_slots < 2) {
    return Status(Errc::kProtocolError, "target offers " + std::to_string(descriptor->recv_slots) +
                                            " receive slots; at least 2 are needed");
  }
  bool apm_offered = (descriptor->methods & protocol::kMethodApm) != 0;
  bool gpspm_offered = (descriptor->methods & protocol::kMethodGpspm) != 0;
  if (apm_offered && setup.options.method == MethodPreference::kAuto) {
    apm_ = true;
  } else if (gpspm_offered) {
    apm_ = false;
  } else {
    return Status(Errc::kUnsupported,
                  "the target offers no persistency method this initiator "
                  "can use (methods " +
                      std::to_string(descriptor->methods) + ")");
  }
  // Under APM placed Writes are durable in placement order over rdma (the
  // model APM assumes) and where the target says it persists each Write;
  // elsewhere (tcp onto a plain file) only at a flush Read.
  // Native flush where the target offers it and this side can post FLUSH:
  // durable on any platform, where APM's Read assumes one that writes
  // placed data through (docs/transport-rdma.md, "Native persistence").
  native_flush_ = apm_ && (descriptor->methods & protocol::kMethodNativeFlush) != 0 &&
                  connection_->fabric_persistence().can_post_flush;
  one_sided_commit_ = native_flush_ &&
                      (descriptor->methods & protocol::kMethodOneSidedCommit) != 0 &&
                      connection_->fabric_persistence().can_post_atomic_write;
  if (one_sided_commit_) {
    commit_word_ = {descriptor->commit_address, descriptor->commit_rkey, sizeof(uint64_t)};
    commit_word_posted_ = commit_word_flushed_ = descriptor->last_sequence;
  }
  placed_in_order_ = apm_ && !native_flush_ &&
                     (kind == transport::Kind::kRdma ||
                      (descriptor->methods & protocol::kMethodPlacementOrder) != 0);
  remote_ = {descriptor->remote_address, descriptor->rkey, descriptor->region_size};
  remote_size_ = descriptor->region_size;
  generation_ = descriptor->generation;
  remote_last_sequence_ = descriptor->last_sequence;
  done_upto_ = acknowledged_ = descriptor->last_sequence;
  credits_ = descriptor->recv_slots - 1;  // one slot stays free for a heartbeat
  // Every Commit in flight takes a credit: the ring never holds more.
  unacked_commits_.assign(std::max<uint32_t>(credits_, 1), 0);
  std::get<protocol::Commit>(commit_message_).ranges.reserve(protocol::kMaxRangesPerMessage);
  std::copy(descriptor->copy_uuid.begin(), descriptor->copy_uuid.end(), remote_copy_.uuid.begin());
  remote_copy_.generations.current = descriptor->data_generation;
  for (size_t i = 0;
       i < remote_copy_.generations.history.size() && i < descriptor->generation_history.size();
       ++i) {
    remote_copy_.generations.history[i] = descriptor->generation_history[i];
  }
  remote_copy_.consistent = (descriptor->copy_flags & protocol::kCopyConsistent) != 0;
  remote_copy_.promoted = (descriptor->copy_flags & protocol::kCopyPromoted) != 0;
  remote_unclean_ = (descriptor->copy_flags & protocol::kCopyUnclean) != 0;
  remote_activity_extent_size_ = descriptor->activity_extent_size;
  remote_activity_extents_ = descriptor->activity_extents;

  PMIRROR_ASSIGN_OR_RETURN(
      local_region_,
      connection_->register_memory(setup.local_base, setup.local_size, transport::kLocalOnly));
  PMIRROR_ASSIGN_OR_RETURN(flush_region_,
                           connection_->register_memory(flush_buffer_.data(), flush_buffer_.size(),
                                                        transport::kLocalOnly));
  if (setup.staging_size > 0) {
    PMIRROR_ASSIGN_OR_RETURN(staging_region_,
                             connection_->register_memory(setup.staging_base, setup.staging_size,
                                                          transport::kLocalOnly));
  }
  // Native flush adds up to kMaxFlushSpans FLUSHes per group, one-sided
  // commit an ATOMIC WRITE.
  post_scratch_.reserve(kMaxRangesPerPersist * (native_flush_ ? 2 : 1) + 3);
  last_heard_ = last_sent_ = Clock::now();
  log::debug("replica {}: session open, method {}, session generation {}, last sequence {}", label_,
             placed_in_order_ ? "apm, placement order" : method_name(), generation_,
             remote_last_sequence_);
  return Status::Ok();
}

Status Replica::fail(Status why) {
  if (state_ == ReplicaState::kConnected) {
    state_ = ReplicaState::kFailed;
    error_ = why.with_context("replica " + label_);
    queued_.clear();  // the caller records what was not durable dirty
    log::warn("{}", error_.message());
    // The connection goes down when the session is destroyed, off the
    // volume mutex (SessionReaper): shutting it down may block.
  }
  return error_.ok() ? Status(Errc::kClosed, "replica " + label_ + " is closed") : error_;
}

Status Replica::post_with_retry(const std::function<Status()>& post) {
  auto deadline = Clock::now() + operation_timeout_;
  while (true) {
    Status posted = post();
    if (posted.code() != Errc::kResourceExhausted) return posted;
    // Send queue full: let completions free it.
    PMIRROR_RETURN_IF_ERROR(pump(1ms));
    if (Clock::now() > deadline) return posted;
  }
}

void Replica::track_in(PersistLedger& ledger, size_t index) {
  ledger_ = &ledger;
  index_ = index;
}

Status Replica::await_credit(bool may_wait) {
  if (credits_ > 0) return Status::Ok();
  if (!may_wait) {
    if (Status pumped = pump(0ms); !pumped.ok()) return fail(pumped);
    if (credits_ == 0) {
      return Status(Errc::kResourceExhausted, "replica " + label_ + " has no free receive slot: " +
                                                  std::to_string(in_flight_count()) +
                                                  " persists unacknowledged");
    }
  }
  const auto deadline = Clock::now() + operation_timeout_;
  while (credits_ == 0) {
    if (Status pumped = pump(kCreditPoll); !pumped.ok()) return fail(pumped);
    if (Clock::now() > deadline) {
      return fail(Status(Errc::kTimeout, "the target returned no receive credit within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
  }
  return Status::Ok();
}

namespace {

// A persist's Commit or PersistRequest, filled in place in the message the
// session keeps (its range vector keeps its capacity: no allocation) and
// encoded for a post_list.
template <typename Update>
Result<transport::WorkRequest> encode_update(session::Messenger& messenger, protocol::Message& kept,
                                             uint64_t sequence, uint64_t generation,
                                             std::span<const protocol::Range> ranges) {
  auto& update = std::get<Update>(kept);
  update.sequence = sequence;
  update.generation = generation;
  update.ranges.assign(ranges.begin(), ranges.end());
  return messenger.encode(kept);
}

// Native flush: the spans the FLUSHes of some ranges cover -- sorted,
// merged where less than kFlushMergeGap lies between them (flushing a clean
// line costs less than a work request), then the closest merged until at
// most kMaxFlushSpans remain.
constexpr uint64_t kFlushMergeGap = 64 << 10;
constexpr size_t kMaxFlushSpans = 4;

void flush_spans(std::span<const protocol::Range> ranges, std::vector<protocol::Range>& out) {
  out.assign(ranges.begin(), ranges.end());
  std::sort(out.begin(), out.end(),
            [](const protocol::Range& a, const protocol::Range& b) { return a.offset < b.offset; });
  size_t kept = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t end = out[i].offset + out[i].length;
    if (kept > 0 && out[i].offset <= out[kept - 1].offset + out[kept - 1].length + kFlushMergeGap) {
      protocol::Range& last = out[kept - 1];
      last.length = std::max(last.offset + last.length, end) - last.offset;
    } else {
      out[kept++] = out[i];
    }
  }
  out.resize(kept);
  while (out.size() > kMaxFlushSpans) {
    size_t closest = 1;
    for (size_t i = 2; i < out.size(); ++i) {
      const uint64_t gap = out[i].offset - (out[i - 1].offset + out[i - 1].length);
      if (gap < out[closest].offset - (out[closest - 1].offset + out[closest - 1].length))
        closest = i;
    }
    protocol::Range& before = out[closest - 1];
    before.length = out[closest].offset + out[closest].length - before.offset;
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(closest));
  }
}

}  // namespace

Status Replica::post_write_flush(uint64_t sequence, std::span<const protocol::Range> ranges,
                                 std::optional<size_t> staged_at, bool may_wait,
                                 Clock::time_point now, std::span<const size_t> group_ends) {
  const bool copy = sequence == protocol::kResyncSequence;
  // The whole persist is one post_list (over rdma one doorbell): a Write
  // per range, then under APM the flush -- an 8-byte Read after the Writes
  // on the same connection completes only once they are placed (durable,
  // under APM's platform rules) -- and, every kPersistsPerCommit persists,
  // the Commit carrying the bookkeeping of those since the last one; under
  // GPSPM a PersistRequest instead of the Read. The Writes take their
  // bytes from the snapshot buffer (`staged_at`: the first range's bytes,
  // the others after it) or the local mapping.
  std::vector<transport::WorkRequest>& list = post_scratch_;
  list.clear();
  size_t staged = staged_at.value_or(0);
  size_t next_end = 0;     // group_ends[next_end]: where the current group ends
  size_t group_begin = 0;  // native flush: the current group's first range
  // Native flush: FLUSHes of ranges[from, to), the last one signaled with
  // `tag` if there is one.
  auto push_flushes = [&](size_t from, size_t to, std::optional<uint64_t> tag) {
    flush_spans(ranges.subspan(from, to - from), flush_spans_);
    for (size_t k = 0; k < flush_spans_.size(); ++k) {
      const bool last = k + 1 == flush_spans_.size();
      list.push_back(transport::WorkRequest::flush(
          remote_, flush_spans_[k].offset, flush_spans_[k].length,
          last && tag ? *tag : kGroupFlushTag | (sequence & kSequenceMask), last && tag));
    }
  };
  for (size_t i = 0; i < ranges.size(); ++i) {
    const protocol::Range& range = ranges[i];
    bool fence = native_flush_ && i == 0;
    if (!placed_in_order_ && next_end < group_ends.size() && group_ends[next_end] == i) {
      // The groups before are flushed before anything of this one is placed
      // (over rdma APM placement order is durability order already, as
      // between pipelined persists: docs/protocol.md, "Ordering"). Native
      // flush: FLUSHes of the group, and this group's first Write fenced
      // behind them (placed bytes may reach pmem before a FLUSH does).
      if (native_flush_) {
        push_flushes(group_begin, i, std::nullopt);
        group_begin = i;
        fence = true;
      } else {
        const protocol::Range& last = ranges[i - 1];
        list.push_back(transport::WorkRequest::read(
            *flush_region_, 0, kFlushReadSize, remote_,
            std::min(last.offset, remote_size_ - kFlushReadSize),
            kGroupFlushTag | (sequence & kSequenceMask)));
      }
      ++next_end;
    }
    if (staged_at) {
      list.push_back(transport::WorkRequest::write(*staging_region_, staged, range.length, remote_,
                                                   range.offset,
                                                   kWriteTag | (sequence & kSequenceMask),
                                                   /*signaled=*/false));
      staged += range.length;
    } else {
      list.push_back(transport::WorkRequest::write(*local_region_, range.offset, range.length,
                                                   remote_, range.offset,
                                                   kWriteTag | (sequence & kSequenceMask),
                                                   /*signaled=*/false));
    }
    // A persist's first Write waits for the FLUSHes of the persists before
    // it: without APM's platform a later persist's placed bytes could reach
    // pmem before an earlier one's (the order the initiator keeps: as GPSPM,
    // one round trip per persist in flight, but waited for by the NIC).
    list.back().fence = fence;
  }
  size_t completes_from = list.size() + 1;  // posted requests after which a completion will come
  bool requests = false;  // the last request takes a receive slot on the target
  auto& commit_ranges = std::get<protocol::Commit>(commit_message_).ranges;
  size_t committed_before = commit_ranges.size();
  if (apm_) {
    uint64_t tag = copy ? kResyncTag : kReadTag | (sequence & kSequenceMask);
    if (native_flush_) {
      push_flushes(group_begin, ranges.size(), tag);
      completes_from = list.size();  // the signaled FLUSH is the last of them
      if (one_sided_commit_ && !copy) {
        // The sequence into the target's commit word, fenced: not sent
        // before the FLUSHes before it completed, so the word never names
        // a persist whose bytes are not durable. Off the acknowledgement
        // path: the persist is durable at its last FLUSH's completion.
        list.push_back(transport::WorkRequest::atomic_write(
            commit_word_, 0, sequence, kCommitWordTag | (sequence & kSequenceMask),
            /*fence=*/true));
      }
    } else {
      uint64_t flush_offset = std::min(ranges.back().offset, remote_size_ - kFlushReadSize);
      list.push_back(transport::WorkRequest::read(*flush_region_, 0, kFlushReadSize, remote_,
                                                  flush_offset, tag));
    }
    if (!copy && !one_sided_commit_) {
      // capacity reserved; post_persist made room (post_pending_commit)
      commit_ranges.insert(commit_ranges.end(), ranges.begin(), ranges.end());
      ++uncommitted_persists_;
      last_posted_sequence_ = sequence;
      // Without a free slot the Commit waits for a later persist (a full
      // Commit never does: post_persist waited for its slot).
      if (uncommitted_persists_ >= kPersistsPerCommit && credits_ > 0) {
        auto encoded = encode_commit();
        if (!encoded.ok()) {
          commit_ranges.resize(committed_before);
          --uncommitted_persists_;
          return fail(encoded.status());
        }
        list.push_back(*encoded);
        requests = true;
      }
    }
  } else {
    PMIRROR_ASSIGN_OR_RETURN(auto request, encode_update<protocol::PersistRequest>(
                                               *messenger_, persist_request_message_, sequence,
                                               generation_, ranges));
    list.push_back(request);
    requests = true;
  }
  const size_t count = list.size();

  size_t posted = 0;
  std::optional<Clock::time_point> deadline;
  while (true) {
    auto took = connection_->post_list(std::span(list.data() + posted, count - posted));
    if (!took.ok()) return fail(took.status());
    posted += *took;
    if (posted == count || !may_wait) break;
    // Send queue full: let completions free it.
    if (!deadline) deadline = Clock::now() + operation_timeout_;
    if (Status pumped = pump(1ms); !pumped.ok()) return fail(pumped);
    if (Clock::now() > *deadline) {
      return fail(Status(Errc::kTimeout, "the send queue stayed full for " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
  }
  if (posted < completes_from) {
    // Without may_wait: nothing of it will complete, the replica is as it
    // was (a Write posted alone may still land: harmless, see post_persist).
    if (apm_ && !copy && !one_sided_commit_) {
      commit_ranges.resize(committed_before);
      --uncommitted_persists_;
    }
    return Status(Errc::kResourceExhausted, "replica " + label_ + ": send queue full (" +
                                                std::to_string(in_flight_count()) +
                                                " persists unacknowledged)");
  }
  if (apm_ && !copy) last_persist_posted_ = now;
  if (one_sided_commit_ && !copy && posted == count) commit_word_posted_ = sequence;
  // Under APM without may_wait the Commit may be left out: it is
  // bookkeeping only, and stays pending for a later one; the persist is
  // durable once its Read completes.
  if (requests && posted == count) {
    if (apm_) {
      committed(now);
    } else {
      messenger_->sent();
      --credits_;
      last_sent_ = now;
    }
  }
  return Status::Ok();
}

Status Replica::post_pending_commit(bool may_wait) {
  PMIRROR_RETURN_IF_ERROR(await_credit(may_wait));
  PMIRROR_ASSIGN_OR_RETURN(auto request, encode_commit());
  const auto deadline = Clock::now() + operation_timeout_;
  while (true) {
    auto took = connection_->post_list(std::span(&request, 1));
    if (!took.ok()) return fail(took.status());
    if (*took == 1) break;
    if (!may_wait) {
      return Status(Errc::kResourceExhausted, "replica " + label_ + ": send queue full");
    }
    if (Status pumped = pump(1ms); !pumped.ok()) return fail(pumped);
    if (Clock::now() > deadline) {
      return fail(Status(Errc::kTimeout, "the send queue stayed full for " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
  }
  committed(Clock::now());
  return Status::Ok();
}

Result<transport::WorkRequest> Replica::encode_commit() {
  auto& commit = std::get<protocol::Commit>(commit_message_);
  commit.sequence = last_posted_sequence_;
  commit.generation = generation_;
  return messenger_->encode(commit_message_);
}

void Replica::committed(Clock::time_point now) {
  messenger_->sent();
  std::get<protocol::Commit>(commit_message_).ranges.clear();
  uncommitted_persists_ = 0;
  unacked_commits_[(unacked_head_ + unacked_count_) % unacked_commits_.size()] =
      last_posted_sequence_;
  ++unacked_count_;
  --credits_;
  last_sent_ = now;
}

size_t Replica::uncommitted() const {
  return std::get<protocol::Commit>(commit_message_).ranges.size();
}

Status Replica::commit_if_idle(Clock::time_point now) {
  if (one_sided_commit_) return flush_commit_word_if_idle(now);
  if (failed() || uncommitted() == 0 || credits_ == 0) return Status::Ok();
  // Not behind a persist or copy in flight (a Send after a Read being
  // retransmitted can stall Soft-RoCE, see heartbeat()), and not between
  // persists that come fast: they carry it.
  if (awaits_answer() || now - last_persist_posted_ < kCommitWhenIdleFor) return Status::Ok();
  PMIRROR_ASSIGN_OR_RETURN(auto request, encode_commit());
  auto took = connection_->post_list(std::span(&request, 1));
  if (!took.ok()) return fail(took.status());
  if (*took == 1) committed(now);  // otherwise the send queue is full: later
  return Status::Ok();
}

// One-sided commit: the commit word's last ATOMIC WRITE is made durable by
// a FLUSH of its own once the replica is quiet (as a Commit would be sent),
// so that after a crash of the target the word trails the durable persists
// by no more than those since the last quiet spell. Its completion
// completes nothing: the word is the target's bookkeeping, not a persist.
Status Replica::flush_commit_word_if_idle(Clock::time_point now) {
  if (failed() || commit_word_flushed_ == commit_word_posted_) return Status::Ok();
  if (awaits_answer() || now - last_persist_posted_ < kCommitWhenIdleFor) return Status::Ok();
  transport::WorkRequest flush =
      transport::WorkRequest::flush(commit_word_, 0, sizeof(uint64_t), kCommitWordFlushTag);
  flush.fence = true;  // behind the ATOMIC WRITE it makes durable
  auto took = connection_->post_list(std::span(&flush, 1));
  if (!took.ok()) return fail(took.status());
  if (*took == 1) commit_word_flushed_ = commit_word_posted_;  // otherwise: later
  return Status::Ok();
}

Status Replica::post_persist(uint64_t sequence, std::span<const protocol::Range> ranges,
                             std::optional<size_t> staged_at, bool may_wait,
                             std::span<const size_t> group_ends) {
  if (failed())
    return error_.ok() ? Status(Errc::kClosed, "replica " + label_ + " is closed") : error_;
  if (ledger_ == nullptr) {
    return Status(Errc::kInternal,
                  "replica " + label_ + " takes no persist: no ledger to track it");
  }
  if (ranges.empty() || ranges.size() + group_ends.size() > kMaxRangesPerPersist) {
    return Status(Errc::kInternal, "replica " + label_ + ": a persist of " +
                                       std::to_string(ranges.size()) + " ranges in " +
                                       std::to_string(group_ends.size() + 1) + " groups");
  }
  if (!group_ends.empty() && !apm_) {
    return Status(Errc::kInternal,
                  "replica " + label_ + ": an ordered persist of several groups under GPSPM");
  }
  if (staged_at && !staging_region_) {
    return Status(Errc::kInternal, "replica " + label_ + ": no snapshot buffer registered");
  }
  if (!apm_ && in_flight_count() > 0) {
    // GPSPM keeps the order of persists by waiting: the target's CPU
    // persists a persist's ranges when its PersistRequest arrives, while
    // the next persist's Writes may already be placed -- and on memory
    // that is not persistent as placed (a plain file, fsdax without APM)
    // those could reach the media first (docs/protocol.md, "Ordering").
    // A caller that may not wait leaves the persist queued: the pump that
    // completes the one before posts it.
    if (!may_wait) {
      if (Status pumped = pump(0ms); !pumped.ok()) return fail(pumped);
      if (in_flight_count() > 0) {
        queued_.push_back({sequence, staged_at, Clock::now()});
        return Status::Ok();
      }
    } else {
      PMIRROR_RETURN_IF_ERROR(drain());
    }
  }
  if (apm_ && uncommitted() + ranges.size() > protocol::kMaxRangesPerMessage) {
    // The Commit of the persists before this one goes first: one Commit
    // holds at most kMaxRangesPerMessage ranges.
    PMIRROR_RETURN_IF_ERROR(post_pending_commit(may_wait));
  }
  // A PersistRequest takes a receive slot; under APM only a Commit does,
  // and only a full one must go with this persist.
  if (!apm_ || uncommitted() + ranges.size() >= protocol::kMaxRangesPerMessage) {
    PMIRROR_RETURN_IF_ERROR(await_credit(may_wait));
  }
  const auto now = Clock::now();  // the one clock read of a persist's posting
  PMIRROR_RETURN_IF_ERROR(
      post_write_flush(sequence, ranges, staged_at, may_wait, now, group_ends));
  ledger_->posted(index_, sequence, now);
  return Status::Ok();
}

Status Replica::wait_for(uint64_t sequence) {
  auto deadline = Clock::now() + operation_timeout_;
  while (done_upto_ < sequence && awaiting(sequence)) {
    if (failed()) return error_;
    auto now = Clock::now();
    if (now > deadline) {
      return fail(Status(Errc::kTimeout, "persist " + std::to_string(sequence) +
                                             " not acknowledged within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (Status pumped = pump(std::clamp(left, 1ms, 100ms)); !pumped.ok()) return fail(pumped);
  }
  if (failed()) return error_;
  return Status::Ok();
}

Status Replica::drain() {
  auto newest = ledger_ ? ledger_->newest_pending(index_) : std::nullopt;
  if (!queued_.empty()) newest = queued_.back().sequence;
  if (!newest) return failed() ? error_ : Status::Ok();
  return wait_for(*newest);
}

bool Replica::awaiting(uint64_t sequence) const {
  if (ledger_ == nullptr) return false;
  if (ledger_->is_pending(index_, sequence)) return true;
  return std::any_of(queued_.begin(), queued_.end(), [sequence](const QueuedPersist& queued) {
    return queued.sequence == sequence;
  });
}

uint64_t Replica::in_flight_count() const {
  return ledger_ == nullptr ? 0 : ledger_->pending_count(index_) + queued_.size();
}

Status Replica::post_queued() {
  if (queued_.empty() || failed() || ledger_->pending_count(index_) > 0 || credits_ == 0) {
    return Status::Ok();
  }
  const QueuedPersist next = queued_.front();
  const InFlightPersist* record = ledger_->record(next.sequence);
  if (record == nullptr) {
    return Status(Errc::kInternal, "replica " + label_ + ": queued persist " +
                                       std::to_string(next.sequence) + " has no record");
  }
  const auto now = Clock::now();
  Status posted =
      post_write_flush(next.sequence, ledger_->ranges(*record), next.staged_at, false, now);
  if (posted.code() == Errc::kResourceExhausted) return Status::Ok();  // the next pump
  PMIRROR_RETURN_IF_ERROR(posted);
  ledger_->posted(index_, next.sequence, now);
  queued_.pop_front();
  return Status::Ok();
}

Status Replica::poll(std::chrono::milliseconds timeout) {
  if (failed()) return error_;
  if (Status pumped = pump(timeout); !pumped.ok()) return fail(pumped);
  const auto now = pump_clock();
  const InFlightPersist* oldest = ledger_ ? ledger_->oldest_pending(index_) : nullptr;
  if (oldest != nullptr && now - oldest->posted_at[index_] > operation_timeout_) {
    return fail(Status(Errc::kTimeout,
                       "persist " + std::to_string(oldest->sequence) + " not acknowledged within " +
                           std::to_string(operation_timeout_.count()) + " ms (" +
                           std::to_string(in_flight_count()) + " persists unacknowledged)"));
  }
  if (oldest == nullptr && !queued_.empty() && now - queued_.front().since > operation_timeout_) {
    return fail(
        Status(Errc::kTimeout,
               "persist " + std::to_string(queued_.front().sequence) +
                   " could not be posted (no free receive slot or send queue room) within " +
                   std::to_string(operation_timeout_.count()) + " ms"));
  }
  if (resync_outstanding_ && now - resync_posted_ > operation_timeout_) {
    return fail(Status(Errc::kTimeout, "resync of " + resync_what_ + " not acknowledged within " +
                                           std::to_string(operation_timeout_.count()) + " ms"));
  }
  if (generation_ack_outstanding_ && now - generation_posted_ > operation_timeout_) {
    return fail(Status(Errc::kTimeout, "generation update not acknowledged within " +
                                           std::to_string(operation_timeout_.count()) + " ms"));
  }
  if (ping_outstanding_ && now - ping_sent_ > operation_timeout_) {
    return fail(Status(Errc::kTimeout, "no answer to a heartbeat within " +
                                           std::to_string(operation_timeout_.count()) + " ms"));
  }
  return Status::Ok();
}

Clock::time_point Replica::pump_clock() {
  if (!pump_now_) pump_now_ = Clock::now();
  return *pump_now_;
}

Status Replica::pump(std::chrono::milliseconds timeout) {
  // Everything this pump handles shares one clock read (taken at the first
  // completion or message, or by poll() after it).
  pump_now_.reset();
  // The vector is the member's, borrowed (a handler may pump again), so
  // that its capacity is kept from pump to pump.
  std::vector<protocol::Message> messages;
  messages.swap(pumped_);
  messages.clear();
  Status status = messenger_->pump(
      timeout, messages,
      [this](const transport::Completion& completion) { return handle_completion(completion); });
  for (size_t i = 0; status.ok() && i < messages.size(); ++i) status = handle_message(messages[i]);
  messages.clear();
  if (messages.capacity() > pumped_.capacity()) messages.swap(pumped_);
  if (status.ok()) status = post_queued();
  return status;
}

// The oldest persist pending here is done: completions come in order.
Status Replica::complete_persist(uint64_t sequence, std::string_view what) {
  if (ledger_ == nullptr) {
    return Status(Errc::kProtocolError, std::string(what) + " for sequence " +
                                            std::to_string(sequence) + " with nothing in flight");
  }
  PMIRROR_ASSIGN_OR_RETURN(auto posted_at, ledger_->complete(index_, sequence, what));
  done_upto_ = sequence;
  if (persist_done_) persist_done_(pump_clock() - posted_at);
  return Status::Ok();
}

Status Replica::post_resync(uint64_t offset, uint64_t length) {
  if (failed()) return error_;
  if (resync_outstanding_) {
    return Status(Errc::kInternal, "a resync copy is already in flight to " + label_);
  }
  if (ping_due_ && !ping_outstanding_) PMIRROR_RETURN_IF_ERROR(send_ping());
  PMIRROR_RETURN_IF_ERROR(await_credit(/*may_wait=*/true));
  resync_outstanding_ = true;
  resync_posted_ = Clock::now();
  resync_what_ = "[" + std::to_string(offset) + ", +" + std::to_string(length) + ")";
  const protocol::Range range{offset, length};
  return post_write_flush(protocol::kResyncSequence, std::span(&range, 1), std::nullopt,
                          /*may_wait=*/true,
                          resync_posted_);
}

Result<bool> Replica::resync_done() {
  if (failed()) return error_;
  if (!resync_outstanding_) return true;
  if (Status pumped = pump(0ms); !pumped.ok()) return fail(pumped);
  if (!resync_outstanding_) return true;
  if (Clock::now() - resync_posted_ > operation_timeout_) {
    return fail(Status(Errc::kTimeout, "resync of " + resync_what_ + " not acknowledged within " +
                                           std::to_string(operation_timeout_.count()) + " ms"));
  }
  return false;
}

Status Replica::handle_completion(const transport::Completion& completion) {
  last_heard_ = pump_clock();
  // A persist's flush: the Read after its Writes, or (native flush) its
  // last FLUSH.
  const bool flush = completion.opcode == transport::Opcode::kRead ||
                     completion.opcode == transport::Opcode::kFlush;
  if ((completion.wr_id & kGroupFlushTag) != 0 && flush) return Status::Ok();
  if ((completion.wr_id & kResyncTag) != 0 && flush) {
    resync_outstanding_ = false;
    return Status::Ok();
  }
  if ((completion.wr_id & kCommitWordTag) != 0 &&
      completion.opcode == transport::Opcode::kAtomicWrite) {
    // The word holds this sequence on the target: what it has recorded.
    const InFlightPersist* oldest = ledger_ ? ledger_->oldest_pending(index_) : nullptr;
    uint64_t base = oldest == nullptr ? commit_word_posted_ & ~kSequenceMask
                                      : oldest->sequence & ~kSequenceMask;
    acknowledged_ = std::max(acknowledged_, base | (completion.wr_id & kSequenceMask));
    return Status::Ok();
  }
  if ((completion.wr_id & kReadTag) != 0 && flush) {
    uint64_t sequence = completion.wr_id & kSequenceMask;
    // Sequences beyond 2^56 would need the full value; that is 10^9 years
    // of persists at 2M/s.
    const InFlightPersist* oldest = ledger_ ? ledger_->oldest_pending(index_) : nullptr;
    uint64_t base = oldest == nullptr ? 0 : oldest->sequence & ~kSequenceMask;
    return complete_persist(base | sequence, "flush completion");
  }
  return Status::Ok();  // signaled writes: nothing to do
}

Status Replica::handle_message(const protocol::Message& message) {
  last_heard_ = pump_clock();
  if (auto* ack = std::get_if<protocol::CommitAck>(&message)) {
    // Cumulative: it answers every Commit up to its sequence (the target
    // may answer a run of them with one), each of which returns its credit.
    uint32_t answered = 0;
    while (unacked_count_ > 0 && unacked_commits_[unacked_head_] <= ack->sequence) {
      unacked_head_ = (unacked_head_ + 1) % unacked_commits_.size();
      --unacked_count_;
      ++answered;
    }
    if (answered == 0) {
      return Status(Errc::kProtocolError, "CommitAck for sequence " +
                                              std::to_string(ack->sequence) +
                                              ", which answers no unanswered Commit");
    }
    credits_ += answered;
    acknowledged_ = std::max(acknowledged_, ack->sequence);
    return Status::Ok();
  }
  if (auto* ack = std::get_if<protocol::PersistAck>(&message)) {
    ++credits_;
    if (ack->sequence == protocol::kResyncSequence) {
      resync_outstanding_ = false;
      return Status::Ok();
    }
    acknowledged_ = std::max(acknowledged_, ack->sequence);
    return complete_persist(ack->sequence, "PersistAck");
  }
  if (auto* ack = std::get_if<protocol::GenerationAck>(&message)) {
    ++credits_;
    generation_ack_outstanding_ = false;
    remote_copy_.generations.current = generation_update_.first;
    remote_copy_.consistent = generation_update_.second;
    (void)ack;
    return Status::Ok();
  }
  if (auto* reply = std::get_if<protocol::VerifyReply>(&message)) {
    ++credits_;
    verify_reply_ = *reply;
    return Status::Ok();
  }
  if (auto* pong = std::get_if<protocol::Pong>(&message)) {
    if (pong->token == ping_token_) ping_outstanding_ = false;
    return Status::Ok();
  }
  if (auto* error = std::get_if<protocol::ErrorReply>(&message)) {
    return Status(error->code, "target ended the session: " + error->text);
  }
  return Status(Errc::kProtocolError,
                "unexpected " + std::string(protocol::type_name(protocol::type_of(message))) +
                    " from the target");
}

Status Replica::post_generation(uint64_t generation, bool consistent) {
  if (failed()) return error_;
  if (generation_ack_outstanding_) {
    return Status(Errc::kInternal, "a generation update is already in flight to " + label_);
  }
  PMIRROR_RETURN_IF_ERROR(await_credit(/*may_wait=*/false));
  protocol::SetGeneration update;
  update.generation = generation;
  update.flags = consistent ? uint32_t{protocol::kGenerationConsistent} : 0u;
  if (Status sent = messenger_->send(update); !sent.ok()) {
    if (sent.code() == Errc::kResourceExhausted) return sent;  // send queue full: later
    return fail(sent);
  }
  --credits_;
  last_sent_ = generation_posted_ = Clock::now();
  generation_ack_outstanding_ = true;
  generation_update_ = {generation, consistent};
  return Status::Ok();
}

Result<bool> Replica::generation_done() {
  if (failed()) return error_;
  if (!generation_ack_outstanding_) return true;
  if (Status polled = poll(0ms); !polled.ok()) return polled;
  return !generation_ack_outstanding_;
}

Result<std::vector<uint64_t>> Replica::verify_chunks(uint64_t offset, uint64_t length,
                                                     uint64_t chunk_size) {
  if (failed()) return error_;
  auto deadline = Clock::now() + operation_timeout_;
  PMIRROR_RETURN_IF_ERROR(await_credit(/*may_wait=*/true));
  verify_reply_.reset();
  protocol::VerifyRequest request{offset, length, chunk_size};
  if (Status sent = post_with_retry([&] { return messenger_->send(request); }); !sent.ok()) {
    return fail(sent);
  }
  --credits_;
  last_sent_ = Clock::now();
  while (!verify_reply_) {
    if (Clock::now() > deadline) {
      return fail(Status(Errc::kTimeout, "verify of [" + std::to_string(offset) + ", +" +
                                             std::to_string(length) + ") not answered within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
    if (Status pumped = pump(kCreditPoll); !pumped.ok()) return fail(pumped);
  }
  uint64_t expected = (length + chunk_size - 1) / chunk_size;
  if (verify_reply_->offset != offset || verify_reply_->chunk_size != chunk_size ||
      verify_reply_->hashes.size() != expected) {
    return fail(
        Status(Errc::kProtocolError, "VerifyReply does not match the request (offset " +
                                         std::to_string(verify_reply_->offset) + ", chunk " +
                                         std::to_string(verify_reply_->chunk_size) + ", " +
                                         std::to_string(verify_reply_->hashes.size()) +
                                         " hashes; expected " + std::to_string(expected) + ")"));
  }
  std::vector<uint64_t> hashes = std::move(verify_reply_->hashes);
  verify_reply_.reset();
  return hashes;
}

void Replica::abandon(const Status& why) {
  if (state_ != ReplicaState::kConnected) return;
  if (messenger_->send(protocol::make_error_reply(why)).ok()) (void)messenger_->wait_sends(500ms);
  state_ = ReplicaState::kClosed;
  error_ = why;
  connection_->shutdown();
}

Status Replica::heartbeat() {
  if (failed()) return error_;
  if (ping_outstanding_) {
    if (Status pumped = pump(0ms); !pumped.ok()) return fail(pumped);
  }
  if (ping_outstanding_) {
    if (Clock::now() - ping_sent_ > operation_timeout_) {
      return fail(Status(Errc::kTimeout, "no answer to a heartbeat within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
    return Status::Ok();
  }
  if (awaits_answer()) {
    // Not behind what is outstanding: its answer proves the connection (or
    // it times out after operation_timeout), and Soft-RoCE (rxe, Linux 6.1)
    // can stall a queue pair for good when a Send is posted while it
    // retransmits a Read whose response was lost. The Ping goes out before
    // the next resync copy instead (a resync tells the target nothing else).
    ping_due_ = true;
    return poll(0ms);
  }
  return send_ping();
}

Status Replica::send_ping() {
  ping_due_ = false;
  ping_outstanding_ = true;
  ping_sent_ = Clock::now();
  ++ping_token_;
  if (Status sent = messenger_->send(protocol::Ping{ping_token_}); !sent.ok()) return fail(sent);
  last_sent_ = Clock::now();
  return Status::Ok();
}

void Replica::close() {
  if (state_ != ReplicaState::kConnected) {
    state_ = state_ == ReplicaState::kFailed ? ReplicaState::kFailed : ReplicaState::kClosed;
    return;
  }
  (void)drain();
  if (!failed() && uncommitted() > 0 && await_credit(/*may_wait=*/true).ok()) {
    // The target records how far this session got (a reopened primary's
    // sequences go on from there). A Commit refused here loses nothing:
    // every persist it covers is durable.
    auto request = encode_commit();
    if (request.ok() && post_with_retry([&]() -> Status {
                          auto took = connection_->post_list(std::span(&*request, 1));
                          if (!took.ok()) return took.status();
                          return *took == 1 ? Status::Ok()
                                            : Status(Errc::kResourceExhausted, "send queue full");
                        }).ok()) {
      committed(Clock::now());
    }
  }
  if (!failed()) {
    // Let the Goodbye leave before the connection goes down.
    if (messenger_->send(protocol::Goodbye{}).ok()) (void)messenger_->wait_sends(500ms);
    state_ = ReplicaState::kClosed;
  }
  connection_->shutdown();
}

ReplicaStatus Replica::status() const {
  ReplicaStatus s;
  s.address = spec_.address + ":" + std::to_string(spec_.port);
  s.transport = spec_.transport;
  s.state = state_;
  s.method = method_name();
  s.generation = generation_;
  s.acknowledged_sequence = done_upto_;
  s.last_error = error_.ok() ? "" : error_.message();
  return s;
}

}  // namespace pmirror::initiator
