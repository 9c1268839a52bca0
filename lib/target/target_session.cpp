// One initiator's session on the target: handshake, then the data path's
// bookkeeping until the initiator leaves. The Writes and Reads of the data
// path never show up here: the transport places them into the registered
// region (the NIC over rdma; the connection's receiver over tcp).
#include <libpmem.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "auth/auth.h"
#include "common/fault.h"
#include "common/log.h"
#include "session/session.h"
#include "target/target_internal.h"

namespace pmirror::target {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// How long an idle session sleeps between looks (never past a quarter of
// session_timeout), and how long a cumulative CommitAck may wait for more
// Commits before it goes out alone.
constexpr std::chrono::milliseconds kIdleTick = 1s;
constexpr std::chrono::milliseconds kAckIdle = 100ms;

struct Bookkeeping {
  uint64_t generation = 0;
  uint64_t last_sequence = 0;
};

// A Commit or PersistRequest must carry the session's generation, a
// sequence beyond the last one, and ranges inside the region.
Status check_update(const Bookkeeping& book, uint64_t generation, uint64_t sequence,
                    std::span<const protocol::Range> ranges, uint64_t region_size) {
  if (generation != book.generation) {
    return Status(Errc::kProtocolError, "generation " + std::to_string(generation) +
                                            " does not match the volume's generation " +
                                            std::to_string(book.generation));
  }
  if (sequence <= book.last_sequence) {
    return Status(Errc::kProtocolError, "sequence " + std::to_string(sequence) +
                                            " is not beyond the last recorded sequence " +
                                            std::to_string(book.last_sequence));
  }
  return protocol::check_ranges(ranges, region_size);
}

// The descriptor's copy fields, from the copy's metadata.
void describe_copy(const metadata::CopyMetadata& md, protocol::VolumeDescriptor& descriptor) {
  metadata::CopyInfo info = md.info();
  descriptor.copy_uuid = info.uuid;
  descriptor.data_generation = info.generations.current;
  size_t used = 0;
  for (uint64_t g : info.generations.history) {
    if (g != 0 && used < descriptor.generation_history.size()) {
      descriptor.generation_history[used++] = g;
    }
  }
  descriptor.copy_flags = 0;
  if (info.consistent) descriptor.copy_flags |= protocol::kCopyConsistent;
  if (info.promoted) descriptor.copy_flags |= protocol::kCopyPromoted;
  descriptor.activity_extent_size = metadata::kActivityExtent;
  if (!info.clean) {
    descriptor.copy_flags |= protocol::kCopyUnclean;
    std::vector<uint64_t> extents = md.activity_extents();
    std::sort(extents.begin(), extents.end());
    extents.erase(std::unique(extents.begin(), extents.end()), extents.end());
    if (extents.size() > protocol::kMaxActivityExtents) {
      extents.resize(protocol::kMaxActivityExtents);  // cannot happen: the log has 64 slots
    }
    descriptor.activity_extents = std::move(extents);
  }
}

// The copy's metadata, open for the session; closed (and status's cached
// view of it refreshed) when the session ends, so that libpmirror on this
// node can open the copy as primary between sessions.
class SessionMetadata {
 public:
  explicit SessionMetadata(ServedVolume& volume) : volume_(volume) {}
  ~SessionMetadata() { close(); }
  SessionMetadata(const SessionMetadata&) = delete;
  SessionMetadata& operator=(const SessionMetadata&) = delete;

  Status open(const std::string& node) {
    std::lock_guard lock(volume_.metadata_mutex);
    auto opened = open_copy_metadata(volume_, node);
    if (!opened.ok()) {
      if (opened.status().code() == Errc::kBusy) {
        // Status shows it at once rather than at its next refresh.
        volume_.copy_status = CopyStatus{.in_use_by_local_primary = true};
        volume_.copy_status_at = std::chrono::steady_clock::now();
      }
      return opened.status();
    }
    md_ = std::shared_ptr<metadata::CopyMetadata>(std::move(opened).value());
    volume_.metadata = md_;
    return Status::Ok();
  }
  void close() {
    if (md_ == nullptr) return;
    std::lock_guard lock(volume_.metadata_mutex);
    volume_.copy_status = CopyStatus{.info = md_->info()};
    volume_.copy_status_at = std::chrono::steady_clock::now();
    volume_.metadata.reset();
    md_.reset();  // the last reference: closes the pool
  }
  metadata::CopyMetadata& operator*() const { return *md_; }
  metadata::CopyMetadata* operator->() const { return md_.get(); }

 private:
  ServedVolume& volume_;
  std::shared_ptr<metadata::CopyMetadata> md_;
};

// SetGeneration: the primary names the generation this copy is to hold.
Status adopt(metadata::CopyMetadata& md, const protocol::SetGeneration& request) {
  bool consistent = (request.flags & protocol::kGenerationConsistent) != 0;
  PMIRROR_RETURN_IF_ERROR(md.adopt_generation(request.generation, consistent));
  if (consistent) {
    // A plain in-sync replica now: whatever this copy recorded as a primary
    // (its activity log, its peers' bitmaps) no longer means anything.
    PMIRROR_RETURN_IF_ERROR(md.set_clean(true));
    PMIRROR_RETURN_IF_ERROR(md.clear_activity_log());
    PMIRROR_RETURN_IF_ERROR(md.forget_peers());
  }
  return Status::Ok();
}

// VerifyRequest: XXH3-64 of each chunk of the range (protocol::hash_chunks,
// computed here chunk by chunk under a fault guard: a chunk the mapping
// cannot deliver -- a truncated file, a media error -- fails the volume, not
// the daemon, and the guard abandons no allocation).
Result<protocol::VerifyReply> verify(const region::Region& region,
                                     const protocol::VerifyRequest& request) {
  PMIRROR_RETURN_IF_ERROR(protocol::check_verify_request(request, region.size()));
  const auto* base = static_cast<const std::byte*>(region.data());
  protocol::VerifyReply reply;
  reply.offset = request.offset;
  reply.chunk_size = request.chunk_size;
  reply.hashes.resize(protocol::chunk_count(request.length, request.chunk_size));
  for (size_t i = 0; i < reply.hashes.size(); ++i) {
    uint64_t at = i * request.chunk_size;
    const std::byte* chunk = base + request.offset + at;
    size_t n = static_cast<size_t>(std::min<uint64_t>(request.chunk_size, request.length - at));
    uint64_t* out = &reply.hashes[i];
    if (auto fault = fault::guarded(chunk, n, [&] { *out = XXH3_64bits(chunk, n); })) {
      return fault::report(*fault);  // fails the region
    }
  }
  return reply;
}

// Why a fenced copy refuses a primary (and tells an ended one).
std::string fenced_text(const std::string& volume, const std::string& node,
                        const std::string& promoted_on, uint64_t generation) {
  return "fenced: volume '" + volume + "' was promoted on node " + promoted_on + " (generation " +
         hex16(generation) + "); its copy on node " + node + " takes writes only from that primary";
}

// Why a failed volume takes no writer, and what the operator does.
std::string failed_volume_text(const std::string& name, const std::string& node,
                               const Status& failure) {
  return "volume '" + name + "' on node " + node +
         " has failed and takes no writer until an operator fixes the cause and reopens it "
         "(`systemctl reload pmirrord` or a restart): " +
         failure.message();
}

// One authenticated initiator's session: open() claims the volume, opens
// its metadata, registers the region and sends the VolumeDescriptor; serve()
// pumps messages, each to its own handler, and checks between them what
// may end the session from outside (promote --force, a reload, a failed
// region, shutdown, silence); close() revokes access, then records.
class Session {
 public:
  Session(SessionContext& context, AdmittedPeer peer)
      : context_(context),
        peer_(std::move(peer)),
        volume_(*peer_.volume),
        record_(*peer_.record),
        messenger_(*peer_.messenger),
        region_(*volume_.region),
        md_(volume_),
        access_seen_(peer_.access_checked) {}

  void run() {
    if ((peer_.hello.flags & protocol::kHelloFence) != 0) {
      fence();
      return;
    }
    if (!open()) return;
    serve();
    close();
  }

 private:
  const std::string& name() const { return volume_.config.name; }
  const std::string& who() const { return peer_.who; }
  const std::string& identity() const { return peer_.hello.identity; }

  // Refused before the session opened: the record says why.
  void refuse_opening(Errc code, const std::string& text) {
    record_.state.transition(supervisor::PeerState::kRefused, text);
    session::refuse(messenger_, code, text);
  }

  // Ends the session from our side: the peer is told why.
  void end(Errc code, const std::string& told, std::string reason,
           std::optional<supervisor::PeerState> state = std::nullopt) {
    session::refuse(messenger_, code, told);
    end_reason_ = std::move(reason);
    end_state_ = state;
    open_ = false;
  }

  bool open() {
    // The handshake (Hello, Challenge, AuthResponse) ran in Admission
    // (target_admission.cpp); the peer has proven the volume's secret, and
    // its connection is active. A failed volume (a write-back error, a
    // fault on its mapping) may have lost acknowledged bytes, and its later
    // flushes prove nothing: no writer until an operator reopens it.
    if (Status failure = region_.failure(); !failure.ok()) {
      std::string text = failed_volume_text(name(), context_.node, failure);
      log::warn("{}: refused: {}", who(), text);
      refuse_opening(Errc::kIoError, text);
      return false;
    }
    std::string holder;
    if (!claim_.try_claim(volume_, who(), holder)) {
      log::warn("{}: volume {}: refused second writer (held by {})", who(), name(), holder);
      refuse_opening(Errc::kBusy, "volume '" + name() + "' already has a writer: " + holder);
      return false;
    }
    {
      // What a fence that arrives during the session asks of it.
      std::lock_guard lock(volume_.mutex);
      volume_.writer_lineage = (peer_.hello.flags & protocol::kHelloLineage) != 0
                                   ? peer_.hello.lineage
                                   : protocol::Lineage{};
    }
    // Checked under the claim: `pmirrorctl down` sets it and then ends the
    // claiming session, so no session slips in between.
    if (volume_.down_by_operator.load()) {
      std::string text = down_text(name(), context_.node);
      log::info("{}: refused: {}", who(), text);
      claim_.release();
      // Busy: the primary goes on without this copy, as without any absent
      // replica, and retries slowly.
      refuse_opening(Errc::kBusy, text);
      return false;
    }
    if (Status opened = md_.open(context_.node); !opened.ok()) {
      if (opened.code() == Errc::kBusy) {
        log::warn("{}: volume {}: refused: {}", who(), name(), opened.message());
      } else {
        log::error("{}: volume {}: {}", who(), name(), opened.message());
      }
      refuse_opening(opened.code(), opened.message());
      return false;
    }
    if (const metadata::Fence fence = md_->info().fence;
        fence.generation != 0 && !((peer_.hello.flags & protocol::kHelloLineage) != 0 &&
                                   peer_.hello.lineage.knows(fence.generation))) {
      std::string text = fenced_text(name(), context_.node, fence.node, fence.generation);
      log::warn("{}: refused: {} (the initiator's copy is at generation {})", who(), text,
                hex16(peer_.hello.lineage.current));
      md_.close();
      claim_.release();
      refuse_opening(Errc::kFenced, text);
      return false;
    }
    if (md_->info().promoted) {
      std::string text = "volume '" + name() + "' was promoted on node " + context_.node +
                         " and accepts no other primary; run `pmirrorctl demote " + name() +
                         "` on " + context_.node + " to make it a replica again";
      log::warn("{}: refused: {}", who(), text);
      md_.close();  // let go first: an operator's demote may follow at once
      claim_.release();
      // Not "busy": waiting will not help. The initiator must not go on
      // without this copy as if it were merely down (docs/replica-recovery.md).
      refuse_opening(Errc::kFailedPrecondition, text);
      return false;
    }

    fence_the_lineage_it_left();

    region::Region& region = region_;
    // Placement order only for an initiator that understands the bit (one
    // that predates it refuses a descriptor carrying it).
    methods_ = volume_.methods;
    if ((peer_.hello.flags & protocol::kHelloPlacementOrder) == 0)
      methods_ &= ~uint32_t{protocol::kMethodPlacementOrder};
    const uint32_t access = transport::kRemoteWrite | transport::kRemoteRead |
                            ((methods_ & protocol::kMethodPlacementOrder) != 0
                                 ? uint32_t{transport::kPersistEachWrite}
                                 : 0u);
    // A FLUSH of the fabric's (native flush, docs/transport-rdma.md): to an
    // initiator that knows it, for a pmem copy, where this connection's
    // device has FLUSH to persistence and grants it on the registration.
    auto persist = [&region](const void* addr, size_t len) {
      // A failure fails the Read that flushes (tcp) and the region for
      // good (region.h), which ends this session and refuses later ones.
      return region.persist_range(addr, len);
    };
    Result<std::unique_ptr<transport::MemoryRegion>> registration =
        Status(Errc::kUnsupported, "not tried");
    const config::NativePersistence native = volume_.config.native_persistence;
    if (native != config::NativePersistence::kOff &&
        (peer_.hello.flags & protocol::kHelloNativeFlush) != 0 &&
        (methods_ & protocol::kMethodApm) != 0 && region.is_pmem() &&
        peer_.connection->fabric_persistence().flush_persistent) {
      // Placement order has nothing to add then (the initiator fences
      // behind FLUSHes instead), nor persisting each Write here.
      registration = peer_.connection->register_memory(
          region.data(), region.size(),
          transport::kRemoteWrite | transport::kRemoteRead | transport::kRemoteFlush, persist);
      if (registration.ok()) {
        methods_ |= protocol::kMethodNativeFlush;
        methods_ &= ~uint32_t{protocol::kMethodPlacementOrder};
      } else {
        log::info("{}: volume {}: no native flush for this session: {}", who(), name(),
                  registration.status().message());
      }
    }
    if (!registration.ok()) {
      registration =
          peer_.connection->register_memory(region.data(), region.size(), access, persist);
    }
    if (!registration.ok()) {
      Status failed = registration.status().with_context("registering " + region.path());
      log::error("{}: volume {}: {}", who(), name(), failed.to_string());
      refuse_opening(failed.code(), failed.message());
      return false;
    }
    registration_ = std::move(registration).value();

    auto recorded = context_.state.get_or_create(name());
    if (!recorded.ok()) {
      log::error("{}: volume {}: state: {}", who(), name(), recorded.status().to_string());
      refuse_opening(Errc::kIoError, "target cannot read its state pool");
      return false;
    }
    book_ = {recorded->generation, recorded->last_sequence};
    // A session before this one that recorded its persists one-sidedly may
    // have got further than the state pool (pmirrord was killed before it
    // read the word): its word counts.
    if (const metadata::CommitWord word = md_->commit_word();
        word.generation == book_.generation && word.sequence > book_.last_sequence) {
      log::info(
          "{}: volume {}: the commit word of an earlier session is at sequence {}, the "
          "state pool at {}; continuing after the word",
          who(), name(), word.sequence, book_.last_sequence);
      book_.last_sequence = word.sequence;
    }
    if ((methods_ & protocol::kMethodNativeFlush) != 0 &&
        volume_.config.native_persistence == config::NativePersistence::kAuto &&
        (peer_.hello.flags & protocol::kHelloOneSidedCommit) != 0) {
      offer_one_sided_commit();
    }
    {
      std::scoped_lock lock(volume_.mutex, volume_.record_mutex);
      volume_.writer_identity = identity();
      volume_.generation.store(book_.generation);
      volume_.applied_sequence.store(book_.last_sequence);
      volume_.recorded_sequence = book_.last_sequence;
    }
    return send_descriptor();
  }

  // One-sided commit (docs/protocol.md, "One-sided commit"): the initiator
  // records each persist's sequence with ATOMIC WRITE into the copy's
  // commit word, behind the persist's FLUSH, and sends no Commits. Offered
  // where this connection's device has ATOMIC WRITE and the metadata pool
  // is pmem (a FLUSH of the word into page cache would promise nothing),
  // and the word registers for it.
  void offer_one_sided_commit() {
    std::string why_not;
    if (!peer_.connection->fabric_persistence().atomic_write) {
      why_not = "the connection's device has no ATOMIC WRITE";
    } else if (!md_->commit_word_is_pmem()) {
      why_not = "its metadata " + md_->path() + " is not on pmem";
    } else if (Status armed = md_->arm_commit_word(book_.generation, book_.last_sequence);
               !armed.ok()) {
      why_not = armed.to_string();
    } else {
      auto registered = peer_.connection->register_memory(
          md_->commit_word_address(), sizeof(uint64_t),
          transport::kRemoteWrite | transport::kRemoteFlush | transport::kRemoteAtomicWrite,
          [](const void* addr, size_t len) {
            pmem_persist(addr, len);
            return Status::Ok();
          });
      if (registered.ok()) {
        commit_word_registration_ = std::move(registered).value();
        methods_ |= protocol::kMethodOneSidedCommit;
        return;
      }
      why_not = "registering its commit word: " + registered.status().message();
    }
    log::info("{}: volume {}: no one-sided commit for this session: {}", who(), name(), why_not);
  }

  // Reads the commit word (one-sided commit) into the bookkeeping: the
  // persists it counts since the last read are recorded (their ranges and
  // bytes only the initiator knows). Called when the session is idle and
  // when it ends, never per persist. True when the word moved on: the
  // initiator is alive (it sends nothing else while persists keep coming).
  bool fold_commit_word() {
    if (commit_word_registration_ == nullptr) return false;
    const metadata::CommitWord word = md_->commit_word();
    if (word.generation != book_.generation || word.sequence <= book_.last_sequence) return false;
    record_.persists += word.sequence - book_.last_sequence;
    book_.last_sequence = word.sequence;
    volume_.applied_sequence.store(book_.last_sequence);
    context_.checkpoint_bell.ring();
    record_.acknowledged = word.sequence;
    return true;
  }

  // A fence (a Hello with kHelloFence) from the node where the volume was
  // just promoted, its identity, authenticated with the volume's secret as
  // one of the volume's nodes (docs/failover.md, section 1). The old
  // primary's session ends -- its registration is revoked and its
  // connection shut (rdma: the queue pair goes to error) -- before the
  // fence is recorded and acknowledged; no writer can claim the volume in
  // between.
  void fence() {
    const uint64_t generation = peer_.hello.lineage.current;  // nonzero: decode checked
    const std::string& promoted_on = identity();
    const std::string text = fenced_text(name(), context_.node, promoted_on, generation);
    bool evicted = false;
    std::string outcome;
    if (record_fence_beside_descendant(generation, promoted_on)) {
      outcome = "the connected primary descends from it";
    } else {
      WriterClaim claim;
      Status claimed = claim.claim_for_command(volume_, "a fence from node " + promoted_on,
                                               /*evict=*/true, text, std::chrono::seconds(10),
                                               Errc::kFenced, &evicted);
      if (!claimed.ok()) {
        log::warn("{}: volume {}: fence refused: {}", who(), name(), claimed.to_string());
        refuse_opening(claimed.code(), claimed.message());
        return;
      }
      std::lock_guard lock(volume_.metadata_mutex);
      auto md = open_copy_metadata(volume_, context_.node);
      Status recorded = md.ok() ? (*md)->set_fence(generation, promoted_on) : md.status();
      if (!recorded.ok()) {
        log::error("{}: volume {}: recording the fence: {}", who(), name(), recorded.to_string());
        refuse_opening(recorded.code(), "recording the fence: " + recorded.message());
        return;
      }
      volume_.copy_status = CopyStatus{.info = (*md)->info()};
      volume_.copy_status_at = std::chrono::steady_clock::now();
      outcome = evicted ? "the old primary's session was ended" : "no primary was connected";
    }
    log::warn("volume {}: fenced: promoted on node {} at generation {}; {}", name(), promoted_on,
              hex16(generation), outcome);
    const auth::SessionContext auth_context{name(), identity(), peer_.hello.client_nonce,
                                            peer_.server_nonce};
    protocol::FenceAck ack;
    ack.generation = generation;
    ack.sessions_ended = evicted ? 1 : 0;
    ack.mac = auth::target_proof(peer_.secret, auth_context);
    Status sent = messenger_.send(ack);
    if (sent.ok()) sent = messenger_.wait_sends(std::chrono::seconds(5));
    // The fence's event (pmirrorctl events): who promoted, at which
    // generation, and whether an old primary was cut off.
    const std::string recorded_text = "fence recorded: promoted on node " + promoted_on +
                                      " at generation " + hex16(generation) + "; " + outcome;
    record_.state.transition(supervisor::PeerState::kClosed,
                             sent.ok() ? recorded_text : recorded_text + "; " + sent.message());
    peer_.connection->shutdown();
  }

  // The first handshake of a promoted primary (Hello flag kHelloPromoted)
  // whose copy descends from this one's generation is a fence when no
  // promotion's fence reached this copy (its node was away, and the
  // promoting pmirrord's retry has not landed): from now on only writers
  // that know the new primary's generation are taken, so the old primary
  // is refused here as soon as the new one has been here
  // (docs/failover.md, section 1). Recorded as a fence from the writer's
  // identity; it follows the generations this writer moves the copy to. A
  // fence already recorded (this writer passed it) stays, naming the
  // promoting node.
  void fence_the_lineage_it_left() {
    const uint32_t needed = protocol::kHelloLineage | protocol::kHelloPromoted;
    if ((peer_.hello.flags & needed) != needed) return;
    const protocol::Lineage& lineage = peer_.hello.lineage;
    const metadata::CopyInfo& info = md_->info();
    const uint64_t mine = info.generations.current;
    if (info.fence.generation != 0 || mine == 0 || lineage.current == 0 || !lineage.knows(mine)) {
      return;
    }
    std::lock_guard lock(volume_.metadata_mutex);
    if (Status recorded = md_->set_fence(lineage.current, identity()); !recorded.ok()) {
      // The session goes on (this writer passes either way); only the
      // earlier refusal of an old writer is lost until the promotion's
      // fence lands.
      log::error("{}: volume {}: recording the fence of the writer's lineage: {}", who(), name(),
                 recorded.to_string());
      return;
    }
    volume_.copy_status = CopyStatus{.info = md_->info()};
    volume_.copy_status_at = std::chrono::steady_clock::now();
    log::info(
        "{}: volume {}: fenced by this writer's first handshake: its copy (generation {}) "
        "descends from this one's ({}); writers that do not know {} are refused from now on",
        who(), name(), hex16(lineage.current), hex16(mine), hex16(lineage.current));
  }

  // A fence that reaches the copy while a writer that descends from it is
  // connected (pmirrord retried it in the background, and the new primary
  // got here first) is recorded beside that session, which goes on: it is
  // the new primary, not the one to cut off. False when no such writer is
  // connected (then the writer, if any, is evicted as usual).
  bool record_fence_beside_descendant(uint64_t generation, const std::string& promoted_on) {
    {
      std::lock_guard lock(volume_.mutex);
      if (volume_.writer.empty() || volume_.writer_leaving ||
          !volume_.writer_lineage.knows(generation)) {
        return false;
      }
    }
    std::lock_guard lock(volume_.metadata_mutex);
    if (volume_.metadata == nullptr) return false;  // it has just left
    if (Status recorded = volume_.metadata->set_fence(generation, promoted_on); !recorded.ok()) {
      log::error("{}: volume {}: recording the fence: {}", who(), name(), recorded.to_string());
      return false;
    }
    volume_.copy_status = CopyStatus{.info = volume_.metadata->info()};
    volume_.copy_status_at = std::chrono::steady_clock::now();
    return true;
  }

  bool send_descriptor() {
    const transport::RemoteKey key = registration_->remote_key();
    protocol::VolumeDescriptor descriptor;
    descriptor.region_size = region_.size();
    descriptor.remote_address = key.address;
    descriptor.rkey = key.rkey;
    descriptor.methods = methods_;
    descriptor.generation = book_.generation;
    descriptor.last_sequence = book_.last_sequence;
    descriptor.recv_slots = peer_.connection->options().recv_slots;
    if (commit_word_registration_ != nullptr) {
      const transport::RemoteKey word = commit_word_registration_->remote_key();
      descriptor.commit_address = word.address;
      descriptor.commit_rkey = word.rkey;
    }
    describe_copy(*md_, descriptor);
    const auth::SessionContext auth_context{name(), identity(), peer_.hello.client_nonce,
                                            peer_.server_nonce};
    descriptor.mac = auth::target_proof(peer_.secret, auth_context);
    if (Status sent = messenger_.send(descriptor); !sent.ok()) {
      log::warn("{}: sending VolumeDescriptor: {}", who(), sent.to_string());
      record_.state.transition(supervisor::PeerState::kDisconnected, sent.message());
      peer_.connection->shutdown();
      return false;
    }
    {
      std::lock_guard lock(volume_.mutex);
      record_.method = (methods_ & protocol::kMethodApm) == 0 ? "gpspm"
                       : (methods_ & protocol::kMethodOneSidedCommit) != 0
                           ? "one-sided-commit+native-flush+apm+gpspm"
                       : (methods_ & protocol::kMethodNativeFlush) != 0 ? "native-flush+apm+gpspm"
                       : (methods_ & protocol::kMethodPlacementOrder) != 0
                           ? "apm+gpspm, placement order"
                           : "apm+gpspm";
    }
    record_.acknowledged = book_.last_sequence;
    record_.state.transition(supervisor::PeerState::kConnected, "session open");
    log::info(
        "{}: volume {}: session open (session generation {}, last sequence {}, methods {:#x}; "
        "copy generation {}{}{})",
        who(), name(), book_.generation, book_.last_sequence, methods_,
        hex16(descriptor.data_generation),
        (descriptor.copy_flags & protocol::kCopyConsistent) != 0 ? "" : ", inconsistent",
        (descriptor.copy_flags & protocol::kCopyUnclean) != 0
            ? ", unclean: " + std::to_string(descriptor.activity_extents.size()) +
                  " activity extent(s) reported"
            : std::string());
    return true;
  }

  void serve() {
    // The volume's poll mode: known only now that the peer named it.
    messenger_.connection().set_poll_mode(volume_.poll.load());
    auto last_heard = Clock::now();
    std::vector<protocol::Message> messages;
    // Woken by whatever ends or changes it from outside (ServingSession).
    const ServingSession serving(volume_, *peer_.connection);
    // An idle session looks around this often: the one-sided commit's word,
    // a silent peer. Long, so that a one-sided session's thread does not
    // tick while persists run (docs/operations.md, "Threads"); a pending
    // cumulative CommitAck goes out after kAckIdle.
    const auto idle_tick = std::min<std::chrono::milliseconds>(
        kIdleTick,
        std::max<std::chrono::milliseconds>(kAckIdle, context_.options.session_timeout / 4));
    while (open_) {
      messages.clear();
      const auto wait = unacked_commits_ > 0 ? kAckIdle : idle_tick;
      if (Status pumped = messenger_.pump(wait, messages); !pumped.ok()) {
        end_reason_ = pumped.to_string();
        return;
      }
      if (ended_from_outside(messages.empty())) return;
      if (messages.empty()) {
        if (fold_commit_word()) last_heard = Clock::now();
        if (Status acked = flush_commit_acks(/*idle=*/true); !acked.ok()) {
          end_reason_ = acked.to_string();
          return;
        }
        if (Clock::now() - last_heard > context_.options.session_timeout) {
          std::string silence = "nothing heard for " +
                                std::to_string(context_.options.session_timeout.count()) + " ms";
          end(Errc::kTimeout, "session timed out: " + silence, silence);
        }
        continue;
      }
      last_heard = Clock::now();
      for (const auto& message : messages) {
        Status handled = std::visit(
            [&](const auto& m) -> Status {
              if constexpr (requires { on(m); }) {
                return on(m);
              } else {
                return Status(Errc::kProtocolError,
                              "unexpected " +
                                  std::string(protocol::type_name(protocol::type_of(message))) +
                                  " during a session");
              }
            },
            message);
        if (!handled.ok()) {
          ++record_.errors;
          end(handled.code(), handled.message(), handled.to_string());
        }
        if (!open_) break;
      }
      if (open_) {
        if (Status acked = flush_commit_acks(/*idle=*/false); !acked.ok()) {
          end_reason_ = acked.to_string();
          return;
        }
      }
    }
  }

  // What ends a session other than its messages: checked after every pump
  // (idle: nothing arrived in it). True when the session has ended.
  bool ended_from_outside(bool idle) {
    if (volume_.evict.load()) {
      // `pmirrorctl promote --force` on this node: this copy becomes the
      // primary; the old primary's session ends now.
      std::string reason;
      Errc code = Errc::kClosed;
      {
        std::lock_guard lock(volume_.mutex);
        reason = volume_.evict_reason;
        code = volume_.evict_code;
      }
      if (code == Errc::kFenced) {
        end(code, reason, reason, supervisor::PeerState::kRefused);
      } else {
        end(code, reason, "ended by promote --force: " + reason, supervisor::PeerState::kClosed);
      }
      return true;
    }
    if (uint64_t access = volume_.access_version.load(); access != access_seen_) {
      // A reload changed allowed_peers: the session goes on while its
      // identity is still in it.
      access_seen_ = access;
      if (!volume_.allows(identity())) {
        std::string text = "access of '" + identity() + "' to volume '" + name() +
                           "' was removed by a configuration reload";
        end(Errc::kPermissionDenied, text, text, supervisor::PeerState::kRefused);
        return true;
      }
    }
    if (region_.failed()) {
      // Found by this session's flush, or by a fault on the mapping.
      std::string text = failed_volume_text(name(), context_.node, region_.failure());
      end(Errc::kIoError, text, text);
      return true;
    }
    if (!idle) return false;
    if (context_.stopping.load()) {
      end(Errc::kClosed, "target is shutting down", "target shutting down");
      return true;
    }
    if (volume_.removed.load()) {
      end(Errc::kClosed, "volume '" + name() + "' was removed from the target's configuration",
          "volume removed by a configuration reload");
      return true;
    }
    return false;
  }

  // ---- one handler per message the initiator may send in a session

  // An update (Commit, or PersistRequest under GPSPM) is recorded: the
  // sequence it carries becomes the last one applied. It holds the ranges
  // of the persists it covers (a Commit covers those since the last one;
  // a persist may have several, so `persists` counts ranges).
  void record_update(uint64_t sequence, const std::vector<protocol::Range>& ranges) {
    book_.last_sequence = sequence;
    volume_.applied_sequence.store(book_.last_sequence);
    context_.checkpoint_bell.ring();
    record_.persists += ranges.size();
    for (const auto& range : ranges) record_.bytes += range.length;
    record_.acknowledged = sequence;
  }

  Status persist_ranges(const std::vector<protocol::Range>& ranges) {
    for (const auto& range : ranges) {
      PMIRROR_RETURN_IF_ERROR(region_.persist(range.offset, range.length));
    }
    return Status::Ok();
  }

  // APM: the data was written and flushed by the transport; record it. An
  // initiator that takes cumulative acks gets one CommitAck per run of
  // Commits (flush_commit_acks); others one per Commit.
  Status on(const protocol::Commit& commit) {
    PMIRROR_RETURN_IF_ERROR(
        check_update(book_, commit.generation, commit.sequence, commit.ranges, region_.size()));
    record_update(commit.sequence, commit.ranges);
    if (!cumulative_acks()) return messenger_.send(protocol::CommitAck{commit.sequence});
    ++unacked_commits_;
    return Status::Ok();
  }

  bool cumulative_acks() const { return (peer_.hello.flags & protocol::kHelloCumulativeAcks) != 0; }

  // Answers the Commits recorded since the last CommitAck with one, when
  // they hold a quarter of the receive slots or the session went idle: the
  // initiator then always has three quarters of its credits (it keeps a few
  // for other requests), and pays one ack, not one per persist.
  Status flush_commit_acks(bool idle) {
    if (unacked_commits_ == 0) return Status::Ok();
    const uint32_t slots = messenger_.connection().options().recv_slots;
    const uint32_t ack_every = slots >= 16 ? slots / 4 : 1;
    if (!idle && unacked_commits_ < ack_every) return Status::Ok();
    unacked_commits_ = 0;
    return messenger_.send(protocol::CommitAck{book_.last_sequence});
  }

  // GPSPM: persist the ranges here, then record them; a resync copy
  // (kResyncSequence) is persisted and recorded nowhere.
  Status on(const protocol::PersistRequest& request) {
    if (request.sequence == protocol::kResyncSequence) {
      PMIRROR_RETURN_IF_ERROR(protocol::check_ranges(request.ranges, region_.size()));
      PMIRROR_RETURN_IF_ERROR(persist_ranges(request.ranges));
      return messenger_.send(protocol::PersistAck{request.sequence});
    }
    PMIRROR_RETURN_IF_ERROR(
        check_update(book_, request.generation, request.sequence, request.ranges, region_.size()));
    PMIRROR_RETURN_IF_ERROR(persist_ranges(request.ranges));
    record_update(request.sequence, request.ranges);
    return messenger_.send(protocol::PersistAck{request.sequence});
  }

  Status on(const protocol::Ping& ping) { return messenger_.send(protocol::Pong{ping.token}); }

  Status on(const protocol::Goodbye&) {
    said_goodbye_ = true;
    open_ = false;
    return Status::Ok();
  }

  Status on(const protocol::SetGeneration& set) {
    bool consistent = (set.flags & protocol::kGenerationConsistent) != 0;
    if (Status adopted = adopt(*md_, set); !adopted.ok()) {
      log::error("{}: volume {}: adopting generation {}: {}", who(), name(), hex16(set.generation),
                 adopted.to_string());
      return adopted;
    }
    log::info(
        "{}: volume {}: copy adopted generation {} ({})", who(), name(), hex16(set.generation),
        consistent ? "consistent: in sync" : "inconsistent until the resync into it completes");
    return messenger_.send(protocol::GenerationAck{set.generation});
  }

  Status on(const protocol::VerifyRequest& request) {
    auto reply = verify(region_, request);
    return reply.ok() ? messenger_.send(*reply) : reply.status();
  }

  // The initiator ends the session with an error of its own.
  Status on(const protocol::ErrorReply& error) {
    // The peer's words: escaped before they reach the log and status.
    std::string text = protocol::printable(error.text, protocol::kMaxErrorText);
    if (error.code == Errc::kSplitBrain) {
      log::error("{}: volume {}: split brain: {}", who(), name(), text);
      end_reason_ = text;
      end_state_ = supervisor::PeerState::kSplitBrain;
    } else {
      end_reason_ = "initiator reported: " + text;
    }
    open_ = false;
    return Status::Ok();
  }

  void close() {
    registration_.reset();  // revoke the initiator's access before anything else
    peer_.connection->shutdown();
    // No ATOMIC WRITE lands after the connection is shut: the word is final.
    fold_commit_word();
    commit_word_registration_.reset();
    claim_.leaving();
    if (Status saved = checkpoint(context_.state, volume_); !saved.ok()) {
      log::error("{}: volume {}: recording sequence {}: {}", who(), name(), book_.last_sequence,
                 saved.to_string());
    }
    md_.close();  // before the claim goes: whoever claims next may open it at once
    claim_.release();
    record_.state.transition(
        end_state_.value_or(said_goodbye_ ? supervisor::PeerState::kClosed
                                          : supervisor::PeerState::kDisconnected),
        end_reason_);
    log::info("{}: volume {}: session closed at sequence {}: {}", who(), name(),
              book_.last_sequence, end_reason_);
  }

  SessionContext& context_;
  AdmittedPeer peer_;  // the connection and its messenger: outlive everything below
  ServedVolume& volume_;
  SessionRecord& record_;
  session::Messenger& messenger_;
  region::Region& region_;
  // Released in reverse: the registration, then the metadata, then the claim.
  WriterClaim claim_;
  SessionMetadata md_;
  std::unique_ptr<transport::MemoryRegion> registration_;
  // One-sided commit: the copy's commit word, registered for this session.
  std::unique_ptr<transport::MemoryRegion> commit_word_registration_;
  uint32_t methods_ = 0;  // declared to this initiator (VolumeDescriptor.methods)
  Bookkeeping book_;
  uint64_t access_seen_;
  bool open_ = true;
  bool said_goodbye_ = false;
  uint32_t unacked_commits_ = 0;  // recorded, not answered yet (cumulative acks)
  std::string end_reason_ = "initiator closed the session";
  // The state the record ends in when it is not a Goodbye (kClosed) or a
  // plain loss (kDisconnected).
  std::optional<supervisor::PeerState> end_state_;
};

}  // namespace

void serve_session(SessionContext& context, AdmittedPeer peer) {
  Session(context, std::move(peer)).run();
}

std::string down_text(const std::string& volume, const std::string& node) {
  return "volume '" + volume + "' is down on node " + node +
         " by an operator (pmirrorctl down); `pmirrorctl up " + volume + "` on " + node +
         " serves it again";
}

}  // namespace pmirror::target
