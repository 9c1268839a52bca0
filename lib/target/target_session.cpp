// One initiator's session on the target: handshake, then the data path's
// bookkeeping until the initiator leaves. The Writes and Reads of the data
// path never show up here: the transport places them into the registered
// region (the NIC over rdma; the connection's receiver over tcp).
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "auth/auth.h"
#include "common/fault.h"
#include "session/session.h"
#include "target/target_internal.h"

namespace pmirror::target {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

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
        volume_.copy_status = {{"in_use_by_local_primary", true}};
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
    volume_.copy_status = copy_json(md_->info());
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

// Why a failed volume takes no writer, and what the operator does.
std::string failed_volume_text(const std::string& name, const std::string& node,
                               const Status& failure) {
  return "volume '" + name + "' on node " + node +
         " has failed and takes no writer until an operator fixes the cause and reopens it "
         "(`systemctl reload pmirrord` or a restart): " +
         failure.message();
}

}  // namespace

void serve_session(SessionContext& context, AdmittedPeer peer) {
  // The handshake (Hello, Challenge, AuthResponse) ran in Admission
  // (target_admission.cpp); the peer has proven the volume's secret, and
  // its connection is active.
  std::unique_ptr<transport::Connection> connection = std::move(peer.connection);
  session::Messenger& messenger = *peer.messenger;
  const std::string& identity = peer.hello.identity;
  const std::string& who = peer.who;
  std::shared_ptr<ServedVolume> volume = std::move(peer.volume);
  std::shared_ptr<SessionRecord> record = std::move(peer.record);
  const std::string& name = volume->config.name;
  auth::SessionContext auth_context{name, identity, peer.hello.client_nonce, peer.server_nonce};
  auto refuse_session = [&](Errc code, const std::string& text) {
    record->state.transition(supervisor::PeerState::kRefused, text);
    session::refuse(messenger, code, text);
  };
  const std::string& secret = peer.secret;
  const uint64_t access_checked = peer.access_checked;
  // A failed volume (a write-back error, a fault on its mapping) may have
  // lost acknowledged bytes, and its later flushes prove nothing: no writer
  // until an operator reopens it.
  if (Status failure = volume->region->failure(); !failure.ok()) {
    std::string text = failed_volume_text(name, context.node, failure);
    spdlog::warn("{}: refused: {}", who, text);
    refuse_session(Errc::kIoError, text);
    return;
  }
  WriterClaim claim;
  std::string holder;
  if (!claim.try_claim(*volume, who, holder)) {
    spdlog::warn("{}: volume {}: refused second writer (held by {})", who, name, holder);
    refuse_session(Errc::kBusy, "volume '" + name + "' already has a writer: " + holder);
    return;
  }

  SessionMetadata md(*volume);
  if (Status opened = md.open(context.node); !opened.ok()) {
    if (opened.code() == Errc::kBusy) {
      spdlog::warn("{}: volume {}: refused: {}", who, name, opened.message());
    } else {
      spdlog::error("{}: volume {}: {}", who, name, opened.message());
    }
    refuse_session(opened.code(), opened.message());
    return;
  }
  if (md->info().promoted) {
    std::string text = "volume '" + name + "' was promoted on node " + context.node +
                       " and accepts no other primary; run `pmirrorctl demote " + name + "` on " +
                       context.node + " to make it a replica again";
    spdlog::warn("{}: refused: {}", who, text);
    md.close();  // let go first: an operator's demote may follow at once
    claim.release();
    // Not "busy": waiting will not help. The initiator must not go on
    // without this copy as if it were merely down (docs/replica-recovery.md).
    refuse_session(Errc::kFailedPrecondition, text);
    return;
  }

  region::Region& region = *volume->region;
  auto registration = connection->register_memory(
      region.data(), region.size(), transport::kRemoteWrite | transport::kRemoteRead,
      // A failure fails the Read that flushes (tcp) and the region for good
      // (region.h), which ends this session below and refuses later ones.
      [&region](const void* addr, size_t len) { return region.persist_range(addr, len); });
  if (!registration.ok()) {
    Status failed = registration.status().with_context("registering " + region.path());
    spdlog::error("{}: volume {}: {}", who, name, failed.to_string());
    refuse_session(failed.code(), failed.message());
    return;
  }

  auto recorded = context.state.get_or_create(name);
  if (!recorded.ok()) {
    spdlog::error("{}: volume {}: state: {}", who, name, recorded.status().to_string());
    refuse_session(Errc::kIoError, "target cannot read its state pool");
    return;
  }
  Bookkeeping book{recorded->generation, recorded->last_sequence};
  {
    std::scoped_lock lock(volume->mutex, volume->record_mutex);
    volume->writer_identity = identity;
    volume->generation.store(book.generation);
    volume->applied_sequence.store(book.last_sequence);
    volume->recorded_sequence = book.last_sequence;
  }

  const transport::RemoteKey key = (*registration)->remote_key();
  protocol::VolumeDescriptor descriptor;
  descriptor.region_size = region.size();
  descriptor.remote_address = key.address;
  descriptor.rkey = key.rkey;
  descriptor.methods = volume->methods;
  descriptor.generation = book.generation;
  descriptor.last_sequence = book.last_sequence;
  descriptor.recv_slots = connection->options().recv_slots;
  describe_copy(*md, descriptor);
  descriptor.mac = auth::target_proof(secret, auth_context);
  if (Status sent = messenger.send(descriptor); !sent.ok()) {
    spdlog::warn("{}: sending VolumeDescriptor: {}", who, sent.to_string());
    record->state.transition(supervisor::PeerState::kDisconnected, sent.message());
    connection->shutdown();
    return;
  }
  {
    std::lock_guard lock(volume->mutex);
    record->method = (volume->methods & protocol::kMethodApm) != 0 ? "apm+gpspm" : "gpspm";
  }
  record->acknowledged = book.last_sequence;
  record->state.transition(supervisor::PeerState::kConnected, "session open");
  spdlog::info(
      "{}: volume {}: session open (generation {}, last sequence {}, methods {:#x}; copy "
      "generation {}{}{})",
      who, name, book.generation, book.last_sequence, volume->methods,
      hex16(descriptor.data_generation),
      (descriptor.copy_flags & protocol::kCopyConsistent) != 0 ? "" : ", inconsistent",
      (descriptor.copy_flags & protocol::kCopyUnclean) != 0
          ? ", unclean: " + std::to_string(descriptor.activity_extents.size()) +
                " activity extent(s) reported"
          : std::string());

  std::string end_reason = "initiator closed the session";
  bool said_goodbye = false;
  // The state the session record ends in when it is not a Goodbye
  // (kClosed) or a plain loss (kDisconnected).
  std::optional<supervisor::PeerState> end_state;
  auto last_heard = Clock::now();
  std::vector<protocol::Message> messages;
  uint64_t access_seen = access_checked;
  bool open = true;
  while (open) {
    messages.clear();
    Status pumped = messenger.pump(100ms, messages);
    if (!pumped.ok()) {
      end_reason = pumped.to_string();
      break;
    }
    if (volume->evict.load()) {
      // `pmirrorctl promote --force` on this node: this copy becomes the
      // primary; the old primary's session ends now.
      std::string reason;
      {
        std::lock_guard lock(volume->mutex);
        reason = volume->evict_reason;
      }
      session::refuse(messenger, Errc::kClosed, reason);
      end_reason = "ended by promote --force: " + reason;
      end_state = supervisor::PeerState::kClosed;
      break;
    }
    if (uint64_t access = volume->access_version.load(); access != access_seen) {
      // A reload changed allowed_peers: the session goes on while its
      // identity is still in it.
      access_seen = access;
      if (!volume->allows(identity)) {
        end_reason = "access of '" + identity + "' to volume '" + name +
                     "' was removed by a configuration reload";
        session::refuse(messenger, Errc::kPermissionDenied, end_reason);
        end_state = supervisor::PeerState::kRefused;
        break;
      }
    }
    if (region.failed()) {
      // Found by this session's flush, or by a fault on the mapping.
      std::string text = failed_volume_text(name, context.node, region.failure());
      session::refuse(messenger, Errc::kIoError, text);
      end_reason = text;
      break;
    }
    if (messages.empty()) {
      if (context.stopping.load()) {
        session::refuse(messenger, Errc::kClosed, "target is shutting down");
        end_reason = "target shutting down";
        break;
      }
      if (volume->removed.load()) {
        session::refuse(messenger, Errc::kClosed,
                        "volume '" + name + "' was removed from the target's configuration");
        end_reason = "volume removed by a configuration reload";
        break;
      }
      if (Clock::now() - last_heard > context.options.session_timeout) {
        end_reason =
            "nothing heard for " + std::to_string(context.options.session_timeout.count()) + " ms";
        session::refuse(messenger, Errc::kTimeout, "session timed out: " + end_reason);
        break;
      }
      continue;
    }
    last_heard = Clock::now();
    for (auto& message : messages) {
      Status handled;
      if (auto* commit = std::get_if<protocol::Commit>(&message)) {
        handled =
            check_update(book, commit->generation, commit->sequence, commit->ranges, region.size());
        if (handled.ok()) {
          book.last_sequence = commit->sequence;
          volume->applied_sequence.store(book.last_sequence);
          ++record->persists;
          for (const auto& range : commit->ranges) record->bytes += range.length;
          record->acknowledged = commit->sequence;
          handled = messenger.send(protocol::CommitAck{commit->sequence});
        }
      } else if (auto* request = std::get_if<protocol::PersistRequest>(&message);
                 request != nullptr && request->sequence == protocol::kResyncSequence) {
        // A resync copy: persist the ranges, record nothing.
        handled = protocol::check_ranges(request->ranges, region.size());
        for (const auto& range : request->ranges) {
          if (!handled.ok()) break;
          handled = region.persist(range.offset, range.length);
        }
        if (handled.ok()) handled = messenger.send(protocol::PersistAck{request->sequence});
      } else if (request != nullptr) {
        handled = check_update(book, request->generation, request->sequence, request->ranges,
                               region.size());
        for (const auto& range : request->ranges) {
          if (!handled.ok()) break;
          handled = region.persist(range.offset, range.length);
        }
        if (handled.ok()) {
          book.last_sequence = request->sequence;
          volume->applied_sequence.store(book.last_sequence);
          ++record->persists;
          for (const auto& range : request->ranges) record->bytes += range.length;
          record->acknowledged = request->sequence;
          handled = messenger.send(protocol::PersistAck{request->sequence});
        }
      } else if (auto* ping = std::get_if<protocol::Ping>(&message)) {
        handled = messenger.send(protocol::Pong{ping->token});
      } else if (std::holds_alternative<protocol::Goodbye>(message)) {
        said_goodbye = true;
        open = false;
        break;
      } else if (auto* set = std::get_if<protocol::SetGeneration>(&message)) {
        bool consistent = (set->flags & protocol::kGenerationConsistent) != 0;
        handled = adopt(*md, *set);
        if (handled.ok()) {
          spdlog::info("{}: volume {}: copy adopted generation {} ({})", who, name,
                       hex16(set->generation),
                       consistent ? "consistent: in sync"
                                  : "inconsistent until the resync into it completes");
          handled = messenger.send(protocol::GenerationAck{set->generation});
        } else {
          spdlog::error("{}: volume {}: adopting generation {}: {}", who, name,
                        hex16(set->generation), handled.to_string());
        }
      } else if (auto* verify_request = std::get_if<protocol::VerifyRequest>(&message)) {
        auto reply = verify(region, *verify_request);
        handled = reply.ok() ? messenger.send(*reply) : reply.status();
      } else if (auto* error = std::get_if<protocol::ErrorReply>(&message)) {
        // The peer's words: escaped before they reach the log and status.
        std::string text = protocol::printable(error->text, protocol::kMaxErrorText);
        if (error->code == Errc::kSplitBrain) {
          spdlog::error("{}: volume {}: split brain: {}", who, name, text);
          end_reason = text;
          end_state = supervisor::PeerState::kSplitBrain;
        } else {
          end_reason = "initiator reported: " + text;
        }
        open = false;
        break;
      } else {
        handled =
            Status(Errc::kProtocolError,
                   "unexpected " + std::string(protocol::type_name(protocol::type_of(message))) +
                       " during a session");
      }
      if (!handled.ok()) {
        ++record->errors;
        end_reason = handled.to_string();
        session::refuse(messenger, handled.code(), handled.message());
        open = false;
        break;
      }
    }
  }
  registration->reset();  // revoke the initiator's access before anything else
  connection->shutdown();
  claim.leaving();
  if (Status saved = checkpoint(context.state, *volume); !saved.ok()) {
    spdlog::error("{}: volume {}: recording sequence {}: {}", who, name, book.last_sequence,
                  saved.to_string());
  }
  md.close();  // before the claim goes: whoever claims next may open it at once
  claim.release();
  record->state.transition(end_state.value_or(said_goodbye ? supervisor::PeerState::kClosed
                                                           : supervisor::PeerState::kDisconnected),
                           end_reason);
  spdlog::info("{}: volume {}: session closed at sequence {}: {}", who, name, book.last_sequence,
               end_reason);
}

}  // namespace pmirror::target
