// Protocol messages over a transport connection: the piece both ends share.
// A Messenger encodes and posts messages, and pumps the connection's
// completions, handing each received message to the caller decoded (the
// receive slot is reposted as soon as it has been decoded). It owns no
// thread: whoever holds it drives it, which keeps one Connection used by one
// thread at a time, as verbs prefer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
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

  // Waits until every message sent so far has left (its send completed),
  // for an orderly close. Messages that arrive meanwhile are kept for the
  // next pump/receive.
  Status wait_sends(std::chrono::milliseconds timeout);

  transport::Connection& connection() { return connection_; }

 private:
  Status poll_once(std::chrono::milliseconds timeout, std::vector<protocol::Message>& messages,
                   const CompletionHandler& on_completion);

  transport::Connection& connection_;
  std::vector<std::byte> encode_buffer_;
  std::vector<protocol::Message> backlog_;  // received beyond what receive() returned
  uint64_t sends_posted_ = 0;
  uint64_t sends_completed_ = 0;
  Status deferred_error_;  // a failure seen after messages that were returned first
};

// Reply an ErrorReply and shut the connection: for refusing a session.
void refuse(Messenger& messenger, Errc code, const std::string& text);

}  // namespace pmirror::session
