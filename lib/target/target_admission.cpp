// Admission: the handshakes of initiators that have not authenticated yet,
// all driven from the thread that runs Target::run, none of them blocking
// it. A stranger costs a socket and a few hundred bytes here -- no thread,
// no SessionRecord -- and the listener's caps bound how many there are.
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "target/target_internal.h"

namespace pmirror::target {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// How often connections that offer no descriptor to wait on (rdma, the
// fake fabric) are polled.
constexpr std::chrono::milliseconds kTick{10};
// How long a refused handshake waits for its ErrorReply to leave.
constexpr std::chrono::milliseconds kRefusalLinger{1000};
// Connections taken from the listener per step, so that handshakes under
// way progress during a flood too.
constexpr int kAcceptsPerStep = 128;
constexpr std::chrono::seconds kLogInterval{10};
constexpr uint32_t kLogBurst = 5;

}  // namespace

struct Admission::Handshake {
  std::unique_ptr<transport::Connection> connection;
  std::unique_ptr<session::Messenger> messenger;
  std::string peer;  // address
  Clock::time_point deadline;
  bool hello_received = false;
  // Refused: the ErrorReply is posted, the connection closes once it has
  // left (or at `deadline`), so that the peer reads why.
  bool closing = false;
  protocol::Hello hello;
  std::shared_ptr<ServedVolume> volume;
  auth::Nonce server_nonce{};
  std::string who() const { return protocol::printable(hello.identity) + "@" + peer; }
};

Admission::Admission(SessionContext& context, transport::Listener& listener,
                     StartSession start_session)
    : context_(context),
      listener_(listener),
      start_session_(std::move(start_session)),
      refused_log_(kLogInterval, kLogBurst),
      no_session_log_(kLogInterval, kLogBurst) {}

Admission::~Admission() { close_all(); }

void Admission::close_all() {
  for (auto& h : handshakes_) h->connection->shutdown();
  handshakes_.clear();
  context_.admission.unauthenticated = 0;
}

bool Admission::step(std::chrono::milliseconds timeout) {
  // What to wait on: the listener and every handshake with a descriptor;
  // without one, a short tick.
  std::vector<pollfd> fds;
  fds.reserve(handshakes_.size() + 1);
  bool ticking = false;
  const int listener_fd = listener_.wait_fd();
  if (listener_fd >= 0) {
    fds.push_back({listener_fd, POLLIN, 0});
  } else {
    ticking = true;
  }
  auto now = Clock::now();
  auto wake_at = now + timeout;
  std::vector<int> fd_index(handshakes_.size(), -1);
  for (size_t i = 0; i < handshakes_.size(); ++i) {
    // A refused one is looked at every tick: its send's completion may
    // not make the descriptor readable.
    int fd = handshakes_[i]->closing ? -1 : handshakes_[i]->connection->wait_fd();
    if (fd >= 0) {
      fd_index[i] = static_cast<int>(fds.size());
      fds.push_back({fd, POLLIN, 0});
    } else {
      ticking = true;
    }
    wake_at = std::min(wake_at, handshakes_[i]->deadline);
  }
  if (ticking) wake_at = std::min(wake_at, now + kTick);
  auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now);
  int ready = ::poll(fds.data(), fds.size(),
                     static_cast<int>(std::clamp<int64_t>(wait.count(), 0, INT32_MAX)));
  if (ready < 0 && errno != EINTR) {
    log::error("admission: poll: {}", std::strerror(errno));
    std::this_thread::sleep_for(kTick);  // never a busy loop
  }

  // Advance the handshakes that have something (or no descriptor to say so).
  std::vector<std::unique_ptr<Handshake>> kept;
  kept.reserve(handshakes_.size());
  now = Clock::now();
  for (size_t i = 0; i < handshakes_.size(); ++i) {
    Handshake& h = *handshakes_[i];
    bool due = fd_index[i] < 0 || (ready > 0 && fds[fd_index[i]].revents != 0);
    if (due && advance(h) == Outcome::kDone) continue;
    if (now >= h.deadline && h.closing) {
      h.connection->shutdown();  // the reply did not leave in time: close anyway
      continue;
    }
    if (now >= h.deadline) {
      context_.admission.timed_out.fetch_add(1);
      if (no_session_log_.count(now)) {
        log::warn("{}: no session: no {} within {} ms", h.hello_received ? h.who() : h.peer,
                  h.hello_received ? "AuthResponse" : "Hello",
                  context_.options.handshake_timeout.count());
      }
      h.connection->shutdown();
      continue;
    }
    kept.push_back(std::move(handshakes_[i]));
  }
  handshakes_ = std::move(kept);

  // New connections: whatever the listener completed (it also keeps its
  // own deadlines and back-off while we call it).
  bool open = true;
  for (int i = 0; i < kAcceptsPerStep; ++i) {
    auto accepted = listener_.accept(0ms);
    if (!accepted.ok()) {
      if (accepted.status().code() == Errc::kClosed) {
        open = false;
        break;
      }
      // One peer's failed transport hello: not a pmirror peer, mismatched
      // options, or silent. The daemon goes on.
      if (no_session_log_.count()) log::info("{}", accepted.status().to_string());
      continue;
    }
    if (*accepted == nullptr) break;
    auto h = std::make_unique<Handshake>();
    h->connection = std::move(accepted).value();
    h->messenger = std::make_unique<session::Messenger>(*h->connection);
    h->peer = h->connection->peer_address();
    h->deadline = Clock::now() + context_.options.handshake_timeout;
    // The Hello may already be there (and a refusal's reply may linger).
    if (advance(*h) == Outcome::kContinue) handshakes_.push_back(std::move(h));
  }
  context_.admission.unauthenticated = handshakes_.size();
  log_summaries();
  return open;
}

Admission::Outcome Admission::advance(Handshake& h) {
  std::vector<protocol::Message> messages;
  Status pumped = h.messenger->pump(0ms, messages);
  if (h.closing) {
    // Refused: whatever the peer sends now is not read.
    if (!pumped.ok() || h.messenger->sends_done()) {
      h.connection->shutdown();
      return Outcome::kDone;
    }
    return Outcome::kContinue;
  }
  for (auto& message : messages) {
    if (!h.hello_received) {
      if (auto* hello = std::get_if<protocol::Hello>(&message)) {
        if (on_hello(h, *hello) == Outcome::kDone) return Outcome::kDone;
        if (h.closing) return Outcome::kContinue;  // refused: nothing more is read
        continue;
      }
      context_.admission.refused.fetch_add(1);
      if (refused_log_.count()) {
        log::warn("{}: expected Hello, got {}", h.peer,
                  protocol::type_name(protocol::type_of(message)));
      }
      return refuse(h, Errc::kProtocolError, "expected Hello first");
    }
    if (auto* response = std::get_if<protocol::AuthResponse>(&message)) {
      return on_auth(h, *response);
    }
    context_.admission.refused.fetch_add(1);
    if (auto* error = std::get_if<protocol::ErrorReply>(&message)) {
      // The initiator gave up (it could not use our Challenge).
      if (refused_log_.count()) {
        log::warn("{}: volume {}: no session: the initiator refused: {}", h.who(), h.hello.volume,
                  protocol::printable(error->text));
      }
      h.connection->shutdown();
      return Outcome::kDone;
    }
    if (refused_log_.count()) {
      log::warn("{}: volume {}: expected AuthResponse, got {}", h.who(), h.hello.volume,
                protocol::type_name(protocol::type_of(message)));
    }
    return refuse(h, Errc::kProtocolError, "expected AuthResponse");
  }
  if (!pumped.ok()) {
    // kClosed: the listener closed it to make room (it counts and logs
    // those) or we are stopping; anything else is the peer's doing.
    if (pumped.code() != Errc::kClosed && no_session_log_.count()) {
      log::warn("{}: no session: {}", h.hello_received ? h.who() : h.peer, pumped.to_string());
    }
    h.connection->shutdown();
    return Outcome::kDone;
  }
  return Outcome::kContinue;
}

Admission::Outcome Admission::on_hello(Handshake& h, const protocol::Hello& hello) {
  h.hello_received = true;
  h.hello = hello;
  h.volume = context_.find_volume(hello.volume);
  if (h.volume == nullptr) {
    context_.admission.refused.fetch_add(1);
    if (refused_log_.count()) log::warn("{}: refused: no volume '{}'", h.who(), hello.volume);
    return refuse(h, Errc::kNotFound, "no volume '" + hello.volume + "' on this target");
  }
  auto nonce = auth::random_nonce();
  if (!nonce.ok()) {
    log::error("{}: {}", h.who(), nonce.status().to_string());
    return refuse(h, Errc::kInternal, "target cannot make a nonce");
  }
  h.server_nonce = *nonce;
  if (Status sent = h.messenger->send(protocol::Challenge{h.server_nonce}); !sent.ok()) {
    if (no_session_log_.count()) log::warn("{}: sending Challenge: {}", h.who(), sent.to_string());
    h.connection->shutdown();
    return Outcome::kDone;
  }
  return Outcome::kContinue;
}

Admission::Outcome Admission::on_auth(Handshake& h, const protocol::AuthResponse& response) {
  ServedVolume& volume = *h.volume;
  const std::string& name = volume.config.name;
  const std::string& identity = h.hello.identity;
  auth::SessionContext auth_context{name, identity, h.hello.client_nonce, h.server_nonce};
  // As of now: a reload may change both while sessions run.
  const uint64_t access_checked = volume.access_version.load();
  std::string secret;
  const bool fencer = (h.hello.flags & protocol::kHelloFence) != 0;
  bool known = fencer ? volume.allows_fencer(identity, &secret) : volume.allows(identity, &secret);
  bool proven = auth::macs_equal(response.mac, auth::initiator_proof(secret, auth_context));
  if (!known || !proven) {
    context_.admission.authentication_failures.fetch_add(1);
    // The log says which; the peer only learns that it failed.
    if (refused_log_.count()) {
      log::warn("{}: volume {}: authentication failed: {}", h.who(), name,
                known    ? "wrong secret"
                : fencer ? "a fence from an identity that is not one of the volume's nodes"
                         : "identity not in allowed_peers");
    }
    return refuse(h, Errc::kPermissionDenied,
                  "authentication failed for '" + protocol::printable(identity) + "' on volume '" +
                      name + "'");
  }

  // Authenticated: from here on the peer is somebody status may show.
  AdmittedPeer peer;
  peer.who = identity + "@" + h.peer;  // an identity from allowed_peers: a safe charset
  peer.record = std::make_shared<SessionRecord>(name, peer.who, context_.options.on_event);
  {
    std::lock_guard lock(volume.mutex);
    volume.sessions.push_front(peer.record);
    if (volume.sessions.size() > ServedVolume::kKeptSessions) volume.sessions.pop_back();
  }
  peer.connection = std::move(h.connection);
  peer.messenger = std::move(h.messenger);
  peer.volume = h.volume;
  peer.hello = h.hello;
  peer.server_nonce = h.server_nonce;
  peer.secret = std::move(secret);
  peer.access_checked = access_checked;
  // Out of the listener's unauthenticated count (never evicted from now
  // on) and a full connection: its threads start here.
  Status activated = peer.connection->activate();
  if (!activated.ok() && activated.code() != Errc::kResourceExhausted) {
    // Broke meanwhile (the peer left): nothing to answer.
    peer.record->state.transition(supervisor::PeerState::kDisconnected, activated.message());
    peer.connection->shutdown();
    return Outcome::kDone;
  }
  Status started = activated.ok() ? start_session_(peer) : activated;
  if (!started.ok()) {
    // Out of threads (a task limit): refuse this one, keep serving the others.
    context_.admission.refused.fetch_add(1);
    if (refused_log_.count()) {
      log::error("{}: volume {}: refused: {}", peer.who, name, started.to_string());
    }
    std::string text = "target is out of resources (" + started.message() + "); try again";
    peer.record->state.transition(supervisor::PeerState::kRefused, text);
    if (activated.ok()) {
      // Active: its sender thread takes the reply (briefly waited for).
      session::refuse(*peer.messenger, Errc::kResourceExhausted, text);
    } else {
      // Still dormant: the reply leaves in this thread, at once.
      (void)peer.messenger->send(
          protocol::make_error_reply(Status(Errc::kResourceExhausted, text)));
      peer.connection->shutdown();
    }
  }
  return Outcome::kDone;
}

Admission::Outcome Admission::refuse(Handshake& h, Errc code, const std::string& text) {
  // A dormant tcp connection sends in this thread: the ErrorReply is in the
  // kernel when send() returns (it always fits an empty socket buffer) and
  // its completion is there at the next pump, so it closes at once. Over
  // rdma the post may return before the NIC sent it (a hardware NIC, or
  // rxe from 6.12 on, whose requester is a work queue), and closing then
  // would flush it: the peer would read a bare disconnect. The handshake
  // then lingers, reading nothing, until the reply's send completed or for
  // kRefusalLinger at most.
  if (!h.messenger->send(protocol::make_error_reply(Status(code, text))).ok()) {
    h.connection->shutdown();
    return Outcome::kDone;
  }
  std::vector<protocol::Message> ignored;
  if (!h.messenger->pump(0ms, ignored).ok() || h.messenger->sends_done()) {
    h.connection->shutdown();
    return Outcome::kDone;
  }
  h.closing = true;
  h.deadline = std::min(h.deadline, Clock::now() + kRefusalLinger);
  return Outcome::kContinue;
}

void Admission::log_summaries() {
  if (uint64_t n = refused_log_.unreported()) {
    log::warn("admission: {} more initiator(s) refused in the last {} s (not logged one by one)", n,
              kLogInterval.count());
  }
  if (uint64_t n = no_session_log_.unreported()) {
    log::warn(
        "admission: {} more connection(s) ended without a session in the last {} s (not logged "
        "one by one)",
        n, kLogInterval.count());
  }
}

}  // namespace pmirror::target
