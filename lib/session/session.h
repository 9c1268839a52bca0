// Protocol messages over a transport connection: the piece both ends share.
// A Messenger encodes and posts messages, and pumps the connection's
// completions, handing each received message to the caller decoded (the
// receive slot is reposted as soon as it has been decoded). It owns no
// thread: whoever holds it drives it, under the owner's lock; the one
// exception is collect() (below), which waits for completions without it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "protocol/protocol.h"
#include "transport/transport.h"

namespace pmirror::session {

// Tags the wr_id of the operations a Messenger posts so that completions of
// the caller's own one-sided operations can be told apart.
inline constexpr uint64_t kSendTag = 1ull << 63;

class Messenger {
 public:
  explicit Messenger(transport::Connection& connection) : connection_(connection) {}

  // Encodes and posts one message. Errors: kInternal (encoding: a bug),
  // whatever post_send returns.
  Status send(const protocol::Message& message);

  // For a message posted as part of a Connection::post_list: encodes it and
  // returns its request (valid until the next encode or send); the caller
  // calls sent() once it is posted.
  Result<transport::WorkRequest> encode(const protocol::Message& message);
  void sent() { ++sends_posted_; }

  // Processes completions for up to `timeout`, returning as soon as at least
  // one message has arrived or `on_completion` asked to stop.
  //  * received messages are appended to `messages` (decode errors: the
  //    offending message is answered with an ErrorReply and kProtocolError
  //    is returned -- the session must end);
  //  * completions of the caller's own operations (Write/Read, not tagged
  //    kSendTag) go to on_completion, if given;
  //  * a failed completion of any kind returns its status.
  // Returns ok with nothing appended on timeout.
  using CompletionHandler = std::function<Status(const transport::Completion&)>;
  Status pump(std::chrono::milliseconds timeout, std::vector<protocol::Message>& messages,
              const CompletionHandler& on_completion = {});

  // Waits for the next message, at most `timeout`. Times out with kTimeout
  // naming `expecting`. An ErrorReply from the peer comes back as its own
  // code and text.
  Result<protocol::Message> receive(std::chrono::milliseconds timeout, std::string_view expecting);
  // receive(), for a message of type T only: any other is kProtocolError
  // "expected T, got U".
  template <typename T>
  Result<T> receive_as(std::chrono::milliseconds timeout) {
    const std::string_view expected = protocol::type_name(protocol::type_of(protocol::Message(T{})));
    PMIRROR_ASSIGN_OR_RETURN(protocol::Message message, receive(timeout, expected));
    if (auto* wanted = std::get_if<T>(&message)) return std::move(*wanted);
    return Status(Errc::kProtocolError,
                  "expected " + std::string(expected) + ", got " +
                      std::string(protocol::type_name(protocol::type_of(message))));
  }

  // Waits until every message sent so far has left (its send completed),
  // for an orderly close. Messages that arrive meanwhile are kept for the
  // next pump/receive.
  Status wait_sends(std::chrono::milliseconds timeout);
  // Whether every message sent so far has left (as known from the
  // completions pumped so far).
  bool sends_done() const { return sends_completed_ >= sends_posted_; }

  transport::Connection& connection() { return connection_; }

  // Collecting: one thread waits on the connection for completions without
  // the lock that guards the session (so that other threads post meanwhile)
  // and leaves them for the next pump, which handles them in order.
  //  * reserve_collect() is called with the session's lock held; the
  //    reservation keeps every pump of this Messenger (and its destruction)
  //    out until it is released;
  //  * collect() then runs without the session's lock: it waits up to
  //    `timeout` for completions and keeps them, touching nothing else;
  //  * a pump with timeout 0 that finds a reservation returns at once with
  //    nothing (the collector will leave what arrives); a pump that waits
  //    waits for the reservation's release first.
  std::unique_lock<std::mutex> reserve_collect() { return std::unique_lock(collect_mutex_); }
  void collect(std::chrono::milliseconds timeout);
  // Waits until no collector is inside (for the owner's destructor).
  void quiesce() { std::lock_guard wait_out(collect_mutex_); }

 private:
  Status poll_once(std::chrono::milliseconds timeout, std::vector<protocol::Message>& messages,
                   const CompletionHandler& on_completion);

  transport::Connection& connection_;
  // Completions polled and not handled yet (by collect(), or by a
  // poll_once that is handling them): guarded by collect_mutex_.
  std::mutex collect_mutex_;
  std::array<transport::Completion, 32> polled_;
  size_t polled_count_ = 0;
  Status polled_error_;  // collect()'s poll failed: reported by the next pump
  std::vector<std::byte> encode_buffer_;
  std::vector<protocol::Message> backlog_;  // received beyond what receive() returned
  uint64_t sends_posted_ = 0;
  uint64_t sends_completed_ = 0;
  Status deferred_error_;  // a failure seen after messages that were returned first
};

// Reply an ErrorReply and shut the connection: for refusing a session.
void refuse(Messenger& messenger, Errc code, const std::string& text);

}  // namespace pmirror::session
