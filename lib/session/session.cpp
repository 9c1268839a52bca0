#include "session/session.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <utility>

namespace pmirror::session {

Status Messenger::send(const protocol::Message& message) {
  PMIRROR_ASSIGN_OR_RETURN(transport::WorkRequest request, encode(message));
  PMIRROR_RETURN_IF_ERROR(connection_.post_send(request.message, request.wr_id));
  sent();
  return Status::Ok();
}

Result<transport::WorkRequest> Messenger::encode(const protocol::Message& message) {
  Status encoded = protocol::encode(message, encode_buffer_);
  if (!encoded.ok()) {
    return Status(Errc::kInternal, "encoding " + std::string(protocol::type_name(
                                                     protocol::type_of(message))) +
                                       ": " + encoded.message());
  }
  return transport::WorkRequest::send(encode_buffer_, kSendTag | sends_posted_);
}

Status Messenger::pump(std::chrono::milliseconds timeout, std::vector<protocol::Message>& messages,
                       const CompletionHandler& on_completion) {
  if (!backlog_.empty()) {
    for (auto& m : backlog_) messages.push_back(std::move(m));
    backlog_.clear();
    return Status::Ok();
  }
  if (!deferred_error_.ok()) return deferred_error_;
  size_t before = messages.size();
  Status polled = poll_once(timeout, messages, on_completion);
  if (!polled.ok() && messages.size() > before) {
    // Messages that arrived before the failure come first: a peer's
    // ErrorReply followed by its disconnect must be read as the reason.
    deferred_error_ = polled;
    return Status::Ok();
  }
  return polled;
}

void Messenger::collect(std::chrono::milliseconds timeout) {
  // The caller holds the reservation (collect_mutex_).
  if (polled_count_ > 0 || !polled_error_.ok()) return;
  auto polled = connection_.poll(polled_, timeout);
  if (polled.ok()) {
    polled_count_ = *polled;
  } else {
    polled_error_ = polled.status();
  }
}

Status Messenger::poll_once(std::chrono::milliseconds timeout,
                            std::vector<protocol::Message>& messages,
                            const CompletionHandler& on_completion) {
  std::unique_lock reservation(collect_mutex_, std::defer_lock);
  if (timeout.count() == 0) {
    if (!reservation.try_lock()) return Status::Ok();  // a collector is waiting: it leaves them
  } else {
    reservation.lock();
  }
  if (!polled_error_.ok()) return std::exchange(polled_error_, Status::Ok());
  if (polled_count_ == 0) {
    auto polled = connection_.poll(polled_, timeout);
    if (!polled.ok()) return polled.status();
    polled_count_ = *polled;
  }
  // Handled after the reservation is let go: handling may send (refuse()
  // waits for its reply to leave, which pumps again).
  std::array<transport::Completion, 32> completions;
  const size_t count = std::exchange(polled_count_, 0);
  std::move(polled_.begin(), polled_.begin() + static_cast<std::ptrdiff_t>(count),
            completions.begin());
  reservation.unlock();
  Status first_error;
  for (size_t i = 0; i < count; ++i) {
    const transport::Completion& c = completions[i];
    if (!c.status.ok()) {
      if (first_error.ok()) first_error = c.status;
      continue;
    }
    switch (c.opcode) {
      case transport::Opcode::kRecv: {
        auto slot = static_cast<uint32_t>(c.wr_id);
        auto decoded = protocol::decode(connection_.recv_data(slot, c.byte_len));
        Status reposted = connection_.repost_recv(slot);
        if (!decoded.ok()) {
          if (first_error.ok()) {
            refuse(*this, decoded.status().code(), decoded.status().message());
            first_error = decoded.status().with_context("malformed message from " +
                                                        connection_.peer_address());
          }
          continue;
        }
        if (!reposted.ok() && first_error.ok()) first_error = reposted;
        messages.push_back(std::move(decoded).value());
        break;
      }
      case transport::Opcode::kSend:
        if ((c.wr_id & kSendTag) != 0) {
          ++sends_completed_;
          break;
        }
        [[fallthrough]];
      default:
        if (on_completion) {
          Status handled = on_completion(c);
          if (!handled.ok() && first_error.ok()) first_error = handled;
        }
        break;
    }
  }
  return first_error;
}

Result<protocol::Message> Messenger::receive(std::chrono::milliseconds timeout,
                                             std::string_view expecting) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<protocol::Message> messages;
  while (messages.empty()) {
    if (!deferred_error_.ok()) return deferred_error_;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status(Errc::kTimeout, "no " + std::string(expecting) + " from " +
                                        connection_.peer_address() + " within " +
                                        std::to_string(timeout.count()) + " ms");
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    PMIRROR_RETURN_IF_ERROR(pump(std::max(left, std::chrono::milliseconds(1)), messages));
  }
  protocol::Message first = std::move(messages.front());
  for (size_t i = 1; i < messages.size(); ++i) backlog_.push_back(std::move(messages[i]));
  if (auto* error = std::get_if<protocol::ErrorReply>(&first)) {
    return Status(error->code, connection_.peer_address() + " refused: " + error->text);
  }
  return first;
}

Status Messenger::wait_sends(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (sends_completed_ < sends_posted_) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status(Errc::kTimeout, "messages to " + connection_.peer_address() +
                                        " did not leave within " +
                                        std::to_string(timeout.count()) + " ms");
    }
    std::vector<protocol::Message> arrived;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    PMIRROR_RETURN_IF_ERROR(poll_once(std::max(left, std::chrono::milliseconds(1)), arrived, {}));
    for (auto& m : arrived) backlog_.push_back(std::move(m));
  }
  return Status::Ok();
}

void refuse(Messenger& messenger, Errc code, const std::string& text) {
  protocol::ErrorReply reply = protocol::make_error_reply(Status(code, text));
  // Let the reply leave before the connection goes down, so the peer reads
  // the reason instead of a bare disconnect.
  if (messenger.send(reply).ok()) (void)messenger.wait_sends(std::chrono::milliseconds(500));
  messenger.connection().shutdown();
}

}  // namespace pmirror::session
