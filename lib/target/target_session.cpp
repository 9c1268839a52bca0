// One initiator's session on the target: handshake, then the data path's
// bookkeeping until the initiator leaves. The Writes and Reads of the data
// path never show up here: the transport places them into the registered
// region (the NIC over rdma; the connection's receiver over tcp).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "auth/auth.h"
#include "session/session.h"
#include "target/target_internal.h"

namespace pmirror::target {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Releases a volume's writer claim when the session ends, however it ends.
class WriterClaim {
 public:
  WriterClaim() = default;
  ~WriterClaim() { release(); }
  void release() {
    if (volume_ == nullptr) return;
    {
      std::lock_guard lock(volume_->mutex);
      volume_->writer.clear();
      volume_->writer_leaving = false;
    }
    volume_->writer_released.notify_all();
    volume_ = nullptr;
  }
  // The session is over; only its last checkpoint is left to write.
  void leaving() {
    if (volume_ == nullptr) return;
    std::lock_guard lock(volume_->mutex);
    volume_->writer_leaving = true;
  }
  WriterClaim(const WriterClaim&) = delete;
  WriterClaim& operator=(const WriterClaim&) = delete;

  // false: somebody else writes; `holder` says who.
  bool try_claim(ServedVolume& volume, const std::string& who, std::string& holder) {
    std::unique_lock lock(volume.mutex);
    volume.writer_released.wait_for(lock, std::chrono::seconds(5),
                                    [&] { return volume.writer.empty() || !volume.writer_leaving; });
    if (!volume.writer.empty()) {
      holder = volume.writer;
      return false;
    }
    volume.writer = who;
    volume_ = &volume;
    return true;
  }

 private:
  ServedVolume* volume_ = nullptr;
};

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

}  // namespace

void serve_session(SessionContext& context, std::unique_ptr<transport::Connection> connection) {
  const std::string peer = connection->peer_address();
  session::Messenger messenger(*connection);

  auto first = messenger.receive(context.options.handshake_timeout, "Hello");
  if (!first.ok()) {
    spdlog::warn("{}: no session: {}", peer, first.status().to_string());
    connection->shutdown();
    return;
  }
  auto* hello = std::get_if<protocol::Hello>(&*first);
  if (hello == nullptr) {
    spdlog::warn("{}: expected Hello, got {}", peer,
                 protocol::type_name(protocol::type_of(*first)));
    session::refuse(messenger, Errc::kProtocolError, "expected Hello first");
    return;
  }
  const std::string identity = hello->identity;
  const std::string who = identity + "@" + peer;
  std::shared_ptr<ServedVolume> volume = context.find_volume(hello->volume);
  if (volume == nullptr) {
    spdlog::warn("{}: refused: no volume '{}'", who, hello->volume);
    session::refuse(messenger, Errc::kNotFound,
                    "no volume '" + hello->volume + "' on this target");
    return;
  }
  const std::string& name = volume->config.name;
  auto record = std::make_shared<SessionRecord>(name, who, context.options.on_event);
  {
    std::lock_guard lock(volume->mutex);
    volume->sessions.push_front(record);
    if (volume->sessions.size() > ServedVolume::kKeptSessions) volume->sessions.pop_back();
  }
  auto refuse_session = [&](Errc code, const std::string& text) {
    record->state.transition(supervisor::PeerState::kRefused, text);
    session::refuse(messenger, code, text);
  };

  auto server_nonce = auth::random_nonce();
  if (!server_nonce.ok()) {
    spdlog::error("{}: {}", who, server_nonce.status().to_string());
    refuse_session(Errc::kInternal, "target cannot make a nonce");
    return;
  }
  if (Status sent = messenger.send(protocol::Challenge{*server_nonce}); !sent.ok()) {
    spdlog::warn("{}: sending Challenge: {}", who, sent.to_string());
    record->state.transition(supervisor::PeerState::kDisconnected, sent.message());
    connection->shutdown();
    return;
  }
  auto answer = messenger.receive(context.options.handshake_timeout, "AuthResponse");
  if (!answer.ok()) {
    spdlog::warn("{}: volume {}: no session: {}", who, name, answer.status().to_string());
    record->state.transition(supervisor::PeerState::kDisconnected, answer.status().message());
    connection->shutdown();
    return;
  }
  auto* response = std::get_if<protocol::AuthResponse>(&*answer);
  if (response == nullptr) {
    refuse_session(Errc::kProtocolError, "expected AuthResponse");
    return;
  }
  auth::SessionContext auth_context{name, identity, hello->client_nonce, *server_nonce};
  const auto& allowed = volume->config.allowed_peers;
  bool known = std::find(allowed.begin(), allowed.end(), identity) != allowed.end();
  bool proven =
      auth::macs_equal(response->mac, auth::initiator_proof(volume->config.secret, auth_context));
  if (!known || !proven) {
    // The log says which; the peer only learns that it failed.
    spdlog::warn("{}: volume {}: authentication failed: {}", who, name,
                 known ? "wrong secret" : "identity not in allowed_peers");
    refuse_session(Errc::kPermissionDenied,
                   "authentication failed for '" + identity + "' on volume '" + name + "'");
    return;
  }

  WriterClaim claim;
  std::string holder;
  if (!claim.try_claim(*volume, who, holder)) {
    spdlog::warn("{}: volume {}: refused second writer (held by {})", who, name, holder);
    refuse_session(Errc::kBusy, "volume '" + name + "' already has a writer: " + holder);
    return;
  }

  region::Region& region = *volume->region;
  auto registration = connection->register_memory(
      region.data(), region.size(), transport::kRemoteWrite | transport::kRemoteRead,
      [&region](const void* addr, size_t len) { region.persist_range(addr, len); });
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
  descriptor.mac = auth::target_proof(volume->config.secret, auth_context);
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
  spdlog::info("{}: volume {}: session open (generation {}, last sequence {}, methods {:#x})",
               who, name, book.generation, book.last_sequence, volume->methods);

  std::string end_reason = "initiator closed the session";
  bool said_goodbye = false;
  auto last_heard = Clock::now();
  std::vector<protocol::Message> messages;
  bool open = true;
  while (open) {
    messages.clear();
    Status pumped = messenger.pump(100ms, messages);
    if (!pumped.ok()) {
      end_reason = pumped.to_string();
      break;
    }
    if (messages.empty()) {
      if (context.stopping.load()) {
        session::refuse(messenger, Errc::kClosed, "target is shutting down");
        end_reason = "target shutting down";
        break;
      }
      if (volume->removed.load()) {
        session::refuse(messenger, Errc::kClosed, "volume '" + name +
                                                      "' was removed from the target's configuration");
        end_reason = "volume removed by a configuration reload";
        break;
      }
      if (Clock::now() - last_heard > context.options.session_timeout) {
        end_reason = "nothing heard for " +
                     std::to_string(context.options.session_timeout.count()) + " ms";
        session::refuse(messenger, Errc::kTimeout, "session timed out: " + end_reason);
        break;
      }
      continue;
    }
    last_heard = Clock::now();
    for (auto& message : messages) {
      Status handled;
      if (auto* commit = std::get_if<protocol::Commit>(&message)) {
        handled = check_update(book, commit->generation, commit->sequence, commit->ranges,
                               region.size());
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
      } else if (auto* error = std::get_if<protocol::ErrorReply>(&message)) {
        end_reason = "initiator reported: " + error->text;
        open = false;
        break;
      } else {
        handled = Status(Errc::kProtocolError,
                         "unexpected " +
                             std::string(protocol::type_name(protocol::type_of(message))) +
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
  claim.release();
  record->state.transition(
      said_goodbye ? supervisor::PeerState::kClosed : supervisor::PeerState::kDisconnected,
      end_reason);
  spdlog::info("{}: volume {}: session closed at sequence {}: {}", who, name, book.last_sequence,
               end_reason);
}

}  // namespace pmirror::target
