#include "initiator/replica.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "auth/auth.h"

namespace pmirror::initiator {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// wr_id tags of our own one-sided operations (the Messenger uses bit 63).
constexpr uint64_t kWriteTag = 1ull << 62;
constexpr uint64_t kReadTag = 1ull << 61;
constexpr uint64_t kResyncTag = 1ull << 60;
constexpr uint64_t kSequenceMask = (1ull << 56) - 1;
// The read-after-write flush reads this many bytes (as librpma and librpmem do).
constexpr uint64_t kFlushReadSize = 8;

}  // namespace

std::string_view replica_state_name(ReplicaState state) {
  switch (state) {
    case ReplicaState::kConnected:
      return "connected";
    case ReplicaState::kFailed:
      return "failed";
    case ReplicaState::kClosed:
      return "closed";
  }
  return "unknown";
}

Replica::Replica(const Setup& setup)
    : label_(setup.spec.node.empty() ? setup.spec.address + ":" + std::to_string(setup.spec.port)
                                     : setup.spec.node + " (" + setup.spec.address + ":" +
                                           std::to_string(setup.spec.port) + ")"),
      spec_(setup.spec),
      operation_timeout_(setup.options.operation_timeout) {}

Replica::~Replica() { close(); }

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
  auto connection =
      transport::connect(spec_.transport, spec_.address, spec_.port, connection_options);
  if (!connection.ok()) return connection.status();
  connection_ = std::move(connection).value();
  messenger_ = std::make_unique<session::Messenger>(*connection_);

  auto client_nonce = auth::random_nonce();
  if (!client_nonce.ok()) return client_nonce.status();
  protocol::Hello hello;
  hello.volume = setup.options.name;
  hello.identity = setup.options.identity;
  hello.client_nonce = *client_nonce;
  PMIRROR_RETURN_IF_ERROR(messenger_->send(hello));

  const auto timeout = setup.options.connect_timeout;
  PMIRROR_ASSIGN_OR_RETURN(protocol::Message reply, messenger_->receive(timeout, "Challenge"));
  auto* challenge = std::get_if<protocol::Challenge>(&reply);
  if (challenge == nullptr) {
    return Status(
        Errc::kProtocolError,
        "expected Challenge, got " + std::string(protocol::type_name(protocol::type_of(reply))));
  }
  auth::SessionContext context{hello.volume, hello.identity, hello.client_nonce,
                               challenge->server_nonce};
  PMIRROR_RETURN_IF_ERROR(
      messenger_->send(protocol::AuthResponse{auth::initiator_proof(spec_.secret, context)}));

  PMIRROR_ASSIGN_OR_RETURN(protocol::Message accepted,
                           messenger_->receive(timeout, "VolumeDescriptor"));
  auto* descriptor = std::get_if<protocol::VolumeDescriptor>(&accepted);
  if (descriptor == nullptr) {
    return Status(Errc::kProtocolError,
                  "expected VolumeDescriptor, got " +
                      std::string(protocol::type_name(protocol::type_of(accepted))));
  }
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
  remote_ = {descriptor->remote_address, descriptor->rkey, descriptor->region_size};
  remote_size_ = descriptor->region_size;
  generation_ = descriptor->generation;
  remote_last_sequence_ = descriptor->last_sequence;
  done_upto_ = acknowledged_ = descriptor->last_sequence;
  credits_ = descriptor->recv_slots - 1;  // one slot stays free for a heartbeat
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
  spdlog::debug("replica {}: session open, method {}, generation {}, last sequence {}", label_,
                apm_ ? "apm" : "gpspm", generation_, remote_last_sequence_);
  return Status::Ok();
}

Status Replica::fail(Status why) {
  if (state_ == ReplicaState::kConnected) {
    state_ = ReplicaState::kFailed;
    error_ = why.with_context("replica " + label_);
    spdlog::warn("{}", error_.message());
    if (connection_) connection_->shutdown();
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

Status Replica::post_persist(uint64_t sequence, uint64_t offset, uint64_t length) {
  if (failed())
    return error_.ok() ? Status(Errc::kClosed, "replica " + label_ + " is closed") : error_;
  auto deadline = Clock::now() + operation_timeout_;
  while (credits_ == 0) {
    if (Status pumped = pump(10ms); !pumped.ok()) return fail(pumped);
    if (Clock::now() > deadline) {
      return fail(Status(Errc::kTimeout, "the target returned no receive credit within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
  }
  Status posted = post_with_retry([&] {
    return connection_->post_write(*local_region_, offset, length, remote_, offset,
                                   kWriteTag | (sequence & kSequenceMask), /*signaled=*/false);
  });
  if (posted.ok() && apm_) {
    // The flush: a Read after the Writes on the same connection completes
    // only once they are placed (durable, under APM's platform rules).
    uint64_t flush_offset = std::min(offset, remote_size_ - kFlushReadSize);
    posted = post_with_retry([&] {
      return connection_->post_read(*flush_region_, 0, kFlushReadSize, remote_, flush_offset,
                                    kReadTag | (sequence & kSequenceMask));
    });
    if (posted.ok()) {
      protocol::Commit commit{sequence, generation_, {{offset, length}}};
      posted = post_with_retry([&] { return messenger_->send(commit); });
    }
  } else if (posted.ok()) {
    protocol::PersistRequest request{sequence, generation_, {{offset, length}}};
    posted = post_with_retry([&] { return messenger_->send(request); });
  }
  if (!posted.ok()) return fail(posted);
  --credits_;
  in_flight_.push_back(sequence);
  return Status::Ok();
}

Status Replica::wait_for(uint64_t sequence) {
  auto deadline = Clock::now() + operation_timeout_;
  while (done_upto_ < sequence) {
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
  return Status::Ok();
}

Status Replica::pump(std::chrono::milliseconds timeout) {
  std::vector<protocol::Message> messages;
  PMIRROR_RETURN_IF_ERROR(messenger_->pump(
      timeout, messages,
      [this](const transport::Completion& completion) { return handle_completion(completion); }));
  for (const auto& message : messages) PMIRROR_RETURN_IF_ERROR(handle_message(message));
  return Status::Ok();
}

// The persist at the front of in_flight_ is done: completions come in order.
static Status complete_front(std::deque<uint64_t>& in_flight, uint64_t sequence,
                             uint64_t& done_upto, std::string_view what) {
  if (in_flight.empty() || in_flight.front() != sequence) {
    return Status(Errc::kProtocolError,
                  std::string(what) + " for sequence " + std::to_string(sequence) +
                      (in_flight.empty() ? std::string(" with nothing in flight")
                                         : ", expected " + std::to_string(in_flight.front())));
  }
  in_flight.pop_front();
  done_upto = sequence;
  return Status::Ok();
}

Status Replica::post_resync(uint64_t offset, uint64_t length) {
  if (failed()) return error_;
  if (resync_outstanding_) {
    return Status(Errc::kInternal, "a resync copy is already in flight to " + label_);
  }
  auto deadline = Clock::now() + operation_timeout_;
  while (credits_ == 0) {
    if (Status pumped = pump(10ms); !pumped.ok()) return fail(pumped);
    if (Clock::now() > deadline) {
      return fail(Status(Errc::kTimeout, "the target returned no receive credit within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
  }
  resync_outstanding_ = true;
  resync_posted_ = Clock::now();
  resync_what_ = "[" + std::to_string(offset) + ", +" + std::to_string(length) + ")";
  Status posted = post_with_retry([&] {
    return connection_->post_write(*local_region_, offset, length, remote_, offset, kWriteTag,
                                   /*signaled=*/false);
  });
  if (posted.ok() && apm_) {
    uint64_t flush_offset = std::min(offset, remote_size_ - kFlushReadSize);
    posted = post_with_retry([&] {
      return connection_->post_read(*flush_region_, 0, kFlushReadSize, remote_, flush_offset,
                                    kResyncTag);
    });
  } else if (posted.ok()) {
    protocol::PersistRequest request{protocol::kResyncSequence, generation_, {{offset, length}}};
    posted = post_with_retry([&] { return messenger_->send(request); });
    if (posted.ok()) --credits_;
  }
  if (!posted.ok()) return fail(posted);
  return Status::Ok();
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

Status Replica::resync_range(uint64_t offset, uint64_t length) {
  PMIRROR_RETURN_IF_ERROR(post_resync(offset, length));
  while (true) {
    PMIRROR_ASSIGN_OR_RETURN(bool done, resync_done());
    if (done) return Status::Ok();
    if (Status pumped = pump(10ms); !pumped.ok()) return fail(pumped);
  }
}

Status Replica::handle_completion(const transport::Completion& completion) {
  if ((completion.wr_id & kResyncTag) != 0 && completion.opcode == transport::Opcode::kRead) {
    resync_outstanding_ = false;
    return Status::Ok();
  }
  if ((completion.wr_id & kReadTag) != 0 && completion.opcode == transport::Opcode::kRead) {
    uint64_t sequence = completion.wr_id & kSequenceMask;
    // Sequences beyond 2^56 would need the full value; that is 10^9 years
    // of persists at 2M/s.
    uint64_t base = in_flight_.empty() ? 0 : in_flight_.front() & ~kSequenceMask;
    return complete_front(in_flight_, base | sequence, done_upto_, "flush completion");
  }
  return Status::Ok();  // signaled writes: nothing to do
}

Status Replica::handle_message(const protocol::Message& message) {
  if (auto* ack = std::get_if<protocol::CommitAck>(&message)) {
    ++credits_;
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
    return complete_front(in_flight_, ack->sequence, done_upto_, "PersistAck");
  }
  if (auto* ack = std::get_if<protocol::GenerationAck>(&message)) {
    ++credits_;
    generation_ack_outstanding_ = false;
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

// Waits for a receive credit on the target (one is kept for heartbeats).
static constexpr auto kCreditPoll = std::chrono::milliseconds(10);

Status Replica::set_generation(uint64_t generation, bool consistent) {
  if (failed()) return error_;
  auto deadline = Clock::now() + operation_timeout_;
  while (credits_ == 0) {
    if (Status pumped = pump(kCreditPoll); !pumped.ok()) return fail(pumped);
    if (Clock::now() > deadline) {
      return fail(Status(Errc::kTimeout, "the target returned no receive credit within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
  }
  protocol::SetGeneration update;
  update.generation = generation;
  update.flags = consistent ? uint32_t{protocol::kGenerationConsistent} : 0u;
  generation_ack_outstanding_ = true;
  if (Status sent = post_with_retry([&] { return messenger_->send(update); }); !sent.ok()) {
    return fail(sent);
  }
  --credits_;
  while (generation_ack_outstanding_) {
    if (Clock::now() > deadline) {
      return fail(Status(Errc::kTimeout, "generation update not acknowledged within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
    if (Status pumped = pump(kCreditPoll); !pumped.ok()) return fail(pumped);
  }
  remote_copy_.generations.current = generation;
  remote_copy_.consistent = consistent;
  return Status::Ok();
}

Result<std::vector<uint64_t>> Replica::verify_chunks(uint64_t offset, uint64_t length,
                                                     uint64_t chunk_size) {
  if (failed()) return error_;
  auto deadline = Clock::now() + operation_timeout_;
  while (credits_ == 0) {
    if (Status pumped = pump(kCreditPoll); !pumped.ok()) return fail(pumped);
    if (Clock::now() > deadline) {
      return fail(Status(Errc::kTimeout, "the target returned no receive credit within " +
                                             std::to_string(operation_timeout_.count()) + " ms"));
    }
  }
  verify_reply_.reset();
  protocol::VerifyRequest request{offset, length, chunk_size};
  if (Status sent = post_with_retry([&] { return messenger_->send(request); }); !sent.ok()) {
    return fail(sent);
  }
  --credits_;
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
  ping_outstanding_ = true;
  ping_sent_ = Clock::now();
  ++ping_token_;
  if (Status sent = messenger_->send(protocol::Ping{ping_token_}); !sent.ok()) return fail(sent);
  return Status::Ok();
}

void Replica::close() {
  if (state_ != ReplicaState::kConnected) {
    state_ = state_ == ReplicaState::kFailed ? ReplicaState::kFailed : ReplicaState::kClosed;
    return;
  }
  if (!in_flight_.empty()) (void)wait_for(in_flight_.back());
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
  s.method = apm_ ? "apm" : "gpspm";
  s.generation = generation_;
  s.acknowledged_sequence = done_upto_;
  s.last_error = error_.ok() ? "" : error_.message();
  return s;
}

}  // namespace pmirror::initiator
