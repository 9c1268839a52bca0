// The rdma_cm flows: active (resolve address, resolve route, build the QP,
// connect) and passive (bind, listen, and per CONNECT_REQUEST: move the id to
// its own event channel, build the QP, accept). Both wait on non-blocking
// event channels with poll(2), so every wait honours a deadline.
#include "transport/rdma/rdma_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>

#include "common/log.h"
#include "common/log_limit.h"
#include "transport/admission.h"
#include "transport/rdma/rdma_connection.h"
#include "transport/rdma/verbs.h"
#include "transport/registry.h"

namespace pmirror::transport {
namespace rdma {
namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

std::string endpoint_text(const std::string& address, uint16_t port) {
  return (address.find(':') != std::string::npos ? "[" + address + "]" : address) + ":" +
         std::to_string(port);
}

Status validate(const ConnectionOptions& o) {
  if (o.recv_slots == 0 || o.message_size == 0 || o.max_outstanding == 0)
    return Status(Errc::kInvalidArgument,
                  "rdma: recv_slots, message_size and max_outstanding must be at least 1");
  return Status::Ok();
}

// rdma_cm only reports "No such device" when no RDMA device exists; say why.
Status require_device() {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list != nullptr) ibv_free_device_list(list);
  if (count > 0) return Status::Ok();
  return Status(Errc::kUnsupported,
                "no RDMA device found (ibv_get_device_list is empty): load a NIC driver or "
                "create a Soft-RoCE device (modprobe rdma_rxe; rdma link add rxe0 type rxe "
                "netdev <if>), or use the tcp transport");
}

Result<addrinfo> resolve(const std::string& address, uint16_t port, bool passive,
                         sockaddr_storage* storage) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const char* node = address.empty() ? nullptr : address.c_str();
  if (int rc = getaddrinfo(node, service.c_str(), &hints, &res); rc != 0)
    return Status(Errc::kNotFound,
                  "cannot resolve " + endpoint_text(address, port) + ": " + gai_strerror(rc));
  std::memcpy(storage, res->ai_addr, res->ai_addrlen);
  addrinfo out = *res;
  out.ai_addr = reinterpret_cast<sockaddr*>(storage);
  out.ai_next = nullptr;
  out.ai_canonname = nullptr;
  freeaddrinfo(res);
  return out;
}

Result<EventChannel> make_channel() {
  EventChannel channel(rdma_create_event_channel());
  if (!channel) return errno_status(Errc::kIoError, "rdma_create_event_channel", errno);
  PMIRROR_RETURN_IF_ERROR(set_nonblocking(channel->fd, "the rdma_cm event channel"));
  return channel;
}

// Next event on `channel`, or kTimeout naming what was awaited.
Result<CmEvent> next_event(rdma_event_channel* channel, Clock::time_point deadline,
                           std::string_view awaited, int wake_fd = -1) {
  for (;;) {
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(channel, &raw) == 0) return CmEvent(raw);
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return errno_status(Errc::kIoError, "rdma_get_cm_event", errno);
    pollfd fds[2] = {{channel->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int left = ms_left(deadline);
    const int rc = ::poll(fds, wake_fd >= 0 ? 2 : 1, left);
    if (rc < 0 && errno != EINTR) return errno_status(Errc::kIoError, "poll", errno);
    if (wake_fd >= 0 && (fds[1].revents & POLLIN) != 0)
      return Status(Errc::kClosed, "listener shut down");
    if (rc == 0 && left == 0)
      return Status(Errc::kTimeout, "timed out waiting for " + std::string(awaited));
  }
}

// IB CM reject reasons rdma_cm passes in REJECTED's status (RoCE too).
std::string reject_reason(int status) {
  switch (status) {
    case 8:
      return "no listener on that port (reject reason 8: invalid service ID)";
    case 28:
      return "rejected by the peer application (reject reason 28)";
    default:
      return "reject reason " + std::to_string(status);
  }
}

std::string peer_reject_text(const WireParams& p) {
  switch (p.kind) {
    case WireParams::kRejectProtocol:
      return "the target refused our connection parameters (version or sizes)";
    case WireParams::kRejectResources:
      return "the target could not set up the connection (resources; see its log)";
    case WireParams::kRejectMessageSize:
      return "message_size mismatch: the target uses " + std::to_string(p.message_size) + " bytes";
    default:
      return "the target rejected the connection";
  }
}

// ---- active side --------------------------------------------------------

// One resolution step of the active side (rdma_resolve_addr, then
// rdma_resolve_route): the event that completes it and the one that fails it.
struct ResolveStep {
  rdma_cm_event_type resolved;
  rdma_cm_event_type failed;
  std::string_view doing;  // "resolving the address", for messages
  std::string failure;     // what a failed step's errno is reported with
};

// Waits for the outcome of `step`: ok, or why it failed (`on_timeout` when
// the deadline passed or the step itself timed out).
Status await_resolved(rdma_event_channel* channel, rdma_cm_id* id, Clock::time_point deadline,
                      const std::string& target, const Status& on_timeout,
                      const ResolveStep& step) {
  auto event = next_event(channel, deadline, step.doing);
  if (!event.ok()) return event.status().code() == Errc::kTimeout ? on_timeout : event.status();
  const rdma_cm_event_type type = (*event)->event;
  const int status = (*event)->status;
  if (type == step.resolved) return Status::Ok();
  if (type == step.failed) {
    if (-status == ETIMEDOUT) return on_timeout;
    return errno_status(Errc::kConnectionError, step.failure, -status);
  }
  switch (type) {
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return Status(Errc::kConnectionError, "rdma connect to " + target + ": device " +
                                                device_name(id->verbs) + " was removed");
    case RDMA_CM_EVENT_ADDR_CHANGE:
      return Status(Errc::kConnectionError, "rdma connect to " + target +
                                                ": the local address changed while " +
                                                std::string(step.doing) + "; retry");
    case RDMA_CM_EVENT_ADDR_RESOLVED:  // the other step's
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_REQUEST:
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_ESTABLISHED:
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_MULTICAST_JOIN:
    case RDMA_CM_EVENT_MULTICAST_ERROR:
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      break;
  }
  return Status(Errc::kConnectionError, "rdma connect to " + target + ": unexpected " +
                                            rdma_event_str(type) + " while " +
                                            std::string(step.doing));
}

Result<std::unique_ptr<Connection>> connect_impl(const std::string& address, uint16_t port,
                                                 const ConnectionOptions& options) {
  const std::string target = endpoint_text(address, port);
  const auto deadline = Clock::now() + options.connect_timeout;
  const auto timed_out = [&](std::string_view step) {
    return Status(Errc::kTimeout, "rdma connect to " + target + ": no answer within " +
                                      std::to_string(options.connect_timeout.count()) +
                                      " ms while " + std::string(step) +
                                      " (is the target up and the address on an RDMA netdev?)");
  };

  PMIRROR_ASSIGN_OR_RETURN(EventChannel channel, make_channel());
  rdma_cm_id* raw_id = nullptr;
  if (rdma_create_id(channel.get(), &raw_id, nullptr, RDMA_PS_TCP) != 0)
    return errno_status(Errc::kIoError, "rdma_create_id", errno);
  CmId id(raw_id);

  sockaddr_storage storage{};
  PMIRROR_ASSIGN_OR_RETURN(addrinfo ai, resolve(address, port, false, &storage));

  if (rdma_resolve_addr(id.get(), nullptr, ai.ai_addr, ms_left(deadline)) != 0)
    return errno_status(Errc::kConnectionError, "rdma_resolve_addr " + target, errno);
  PMIRROR_RETURN_IF_ERROR(await_resolved(
      channel.get(), id.get(), deadline, target, timed_out("resolving the address"),
      {RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_CM_EVENT_ADDR_ERROR, "resolving the address",
       "rdma_resolve_addr " + target + " (no RDMA device reaches that address?)"}));

  if (rdma_resolve_route(id.get(), ms_left(deadline)) != 0)
    return errno_status(Errc::kConnectionError,
                        "rdma_resolve_route " + target + " on " + device_name(id->verbs), errno);
  PMIRROR_RETURN_IF_ERROR(await_resolved(
      channel.get(), id.get(), deadline, target, timed_out("resolving the route"),
      {RDMA_CM_EVENT_ROUTE_RESOLVED, RDMA_CM_EVENT_ROUTE_ERROR, "resolving the route",
       "rdma_resolve_route " + target + " on " + device_name(id->verbs)}));

  // The endpoint owns channel and id from here on.
  auto ep = std::make_shared<Endpoint>();
  ep->channel = std::move(channel);
  ep->id = std::move(id);
  rdma_cm_id* cm = ep->id.get();
  rdma_event_channel* ch = ep->channel.get();
  PMIRROR_RETURN_IF_ERROR(build_endpoint(*ep, options).with_context("rdma connect to " + target));
  ep->peer = target;

  WireParams ours;
  ours.message_size = options.message_size;
  ours.recv_slots = options.recv_slots;
  const auto wire = ours.encode();
  rdma_conn_param param{};
  param.private_data = wire.data();
  param.private_data_len = static_cast<uint8_t>(wire.size());
  device_rd_atomic(*ep, &param.initiator_depth, &param.responder_resources);
  param.retry_count = 7;      // transport retries before a WR fails
  param.rnr_retry_count = 7;  // 7 = retry forever while the peer has no receive posted
  if (rdma_connect(cm, &param) != 0)
    return errno_status(Errc::kConnectionError, "rdma_connect " + target + " on " + ep->device,
                        errno);

  auto event = next_event(ch, deadline, "the connection to be established");
  if (!event.ok()) {
    if (event.status().code() == Errc::kTimeout)
      return timed_out("waiting for the target to accept");
    return event.status();
  }
  const rdma_cm_event& ev = *event->get();
  switch (ev.event) {
    case RDMA_CM_EVENT_ESTABLISHED: {
      auto peer = WireParams::decode(ev.param.conn.private_data, ev.param.conn.private_data_len);
      if (!peer.ok() || peer->kind != WireParams::kParams)
        return (peer.ok() ? Status(Errc::kProtocolError, "bad connection parameters")
                          : peer.status())
            .with_context("rdma connect to " + target);
      if (peer->message_size != options.message_size)
        return Status(Errc::kConfigError,
                      "rdma connect to " + target + ": message_size mismatch: ours " +
                          std::to_string(options.message_size) + ", the target's " +
                          std::to_string(peer->message_size));
      return std::unique_ptr<Connection>(new RdmaConnection(ep, options, *peer));
    }
    case RDMA_CM_EVENT_REJECTED: {
      auto peer = WireParams::decode(ev.param.conn.private_data, ev.param.conn.private_data_len);
      if (peer.ok() && peer->kind == WireParams::kRejectMessageSize)
        return Status(Errc::kConfigError, "rdma connect to " + target +
                                              " rejected: " + peer_reject_text(*peer) +
                                              ", we use " + std::to_string(options.message_size));
      if (peer.ok() && peer->kind != WireParams::kParams)
        return Status(Errc::kConnectionError,
                      "rdma connect to " + target + " rejected: " + peer_reject_text(*peer));
      return Status(Errc::kConnectionError,
                    "rdma connect to " + target + " refused: " + reject_reason(ev.status));
    }
    case RDMA_CM_EVENT_UNREACHABLE:
      if (-ev.status == ETIMEDOUT) return timed_out("waiting for the target to answer");
      return errno_status(Errc::kConnectionError,
                          "rdma connect to " + target + ": target unreachable", -ev.status);
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return errno_status(Errc::kConnectionError,
                          "rdma connect to " + target + ": connection error", -ev.status);
    case RDMA_CM_EVENT_DISCONNECTED:
      return Status(Errc::kConnectionError,
                    "rdma connect to " + target + ": the target disconnected during setup");
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return Status(Errc::kConnectionError,
                    "rdma connect to " + target + ": device " + ep->device + " was removed");
    case RDMA_CM_EVENT_ADDR_RESOLVED:
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_REQUEST:
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
    case RDMA_CM_EVENT_MULTICAST_JOIN:
    case RDMA_CM_EVENT_MULTICAST_ERROR:
    case RDMA_CM_EVENT_ADDR_CHANGE:
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      break;
  }
  return Status(Errc::kConnectionError, "rdma connect to " + target + ": unexpected " +
                                            rdma_event_str(ev.event) + " while connecting");
}

// ---- passive side -------------------------------------------------------

// Registers and deregisters [addr, len) on `ctx` with a PD of its own: the
// start-up probe behind Listener::check_registrable.
Status probe_registration(ibv_context* ctx, void* addr, size_t len, uint32_t access) {
  Pd pd(ibv_alloc_pd(ctx));
  if (!pd) return verbs_error(Errc::kIoError, "ibv_alloc_pd", ctx, errno);
  PMIRROR_ASSIGN_OR_RETURN(const int flags, access_flags(access));
  // The caller names the volume and path; file_backed is true so that an
  // EINVAL on a file mapping is read as the fsdax case too.
  auto mr = register_memory_region(pd.get(), ctx, device_has_rc_odp(ctx), addr, len, flags,
                                   /*file_backed=*/true, device_name(ctx) + " cannot register it");
  return mr.ok() ? Status::Ok() : mr.status();
}

// The passive side. A CONNECT_REQUEST takes an admission ticket (caps, as
// the tcp listener), gets its QP and rdma_accept at once, and then waits
// for ESTABLISHED in pending_ with a deadline -- never on the accepting
// thread. One epoll set watches the listening channel, the shutdown eventfd
// and every pending connection's channel.
class RdmaListener final : public Listener {
 public:
  Status check_registrable(void* addr, size_t len, uint32_t access) override {
    if (id_->verbs != nullptr) return probe_registration(id_->verbs, addr, len, access);
    // Bound to a wildcard address: any device may carry a connection.
    int count = 0;
    ibv_context** contexts = rdma_get_devices(&count);
    if (contexts == nullptr || count == 0) {
      if (contexts != nullptr) rdma_free_devices(contexts);
      return Status(Errc::kUnsupported, "no RDMA device to register memory with");
    }
    Status result;
    for (int i = 0; i < count && result.ok(); ++i) {
      result = probe_registration(contexts[i], addr, len, access);
    }
    rdma_free_devices(contexts);
    return result;
  }

  RdmaListener(UniqueFd wake, UniqueFd epoll, EventChannel channel, CmId id,
               ConnectionOptions options, std::string where, const AdmissionOptions& admission)
      : wake_(std::move(wake)),
        epoll_(std::move(epoll)),
        channel_(std::move(channel)),
        id_(std::move(id)),
        options_(options),
        where_(std::move(where)),
        control_(AdmissionControl::create(admission)) {}

  ~RdmaListener() override {
    shutdown();
    pending_.clear();  // before the listening id and channel go
  }

  Result<std::unique_ptr<Connection>> accept(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (bool first = true;; first = false) {
      if (closed_.load())
        return Status(Errc::kClosed, "rdma listener on " + where_ + " is shut down");
      const auto now = Clock::now();
      expire(now);
      if (uint64_t n = evicted_log_.unreported(now))
        AdmissionControl::warn_evicted_since("rdma listener on " + where_, n, kLogInterval);
      if (!ready_.empty()) {
        std::unique_ptr<Connection> c = std::move(ready_.front());
        ready_.pop_front();
        return c;
      }
      if (!failures_.empty()) {
        Status failed = std::move(failures_.front());
        failures_.pop_front();
        return failed;
      }
      if (!first && now >= deadline) return std::unique_ptr<Connection>();
      auto wake_at = deadline;
      for (auto& [fd, p] : pending_) wake_at = std::min(wake_at, p->deadline);
      epoll_event events[32];
      const int n = ::epoll_wait(epoll_.get(), events, 32, ms_left(wake_at));
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno_status(Errc::kIoError, "rdma listener on " + where_ + ": epoll_wait", errno);
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_.get())
          return Status(Errc::kClosed, "rdma listener on " + where_ + " is shut down");
        if (fd == channel_->fd) {
          if (Status listened = drain_listener(); !listened.ok()) return listened;
        } else {
          progress(fd);
        }
      }
    }
  }

  int wait_fd() const override { return epoll_.get(); }
  AdmissionCounters admission() const override { return control_->counters(); }
  uint16_t port() const override { return ntohs(rdma_get_src_port(id_.get())); }

  void shutdown() override {
    if (closed_.exchange(true)) return;
    const uint64_t one = 1;
    if (::write(wake_.get(), &one, sizeof(one)) < 0)
      log::warn("rdma listener on {}: cannot wake accept: {}", where_, std::strerror(errno));
  }

 private:
  static constexpr std::chrono::seconds kLogInterval{10};
  static constexpr size_t kMaxQueuedFailures = 64;

  // Accepted (rdma_accept sent), waiting for ESTABLISHED.
  struct Pending {
    std::shared_ptr<Endpoint> ep;
    WireParams theirs;
    std::string context;
    Clock::time_point deadline;
    // Last: destroyed first, before the id its eviction disconnects.
    std::unique_ptr<AdmissionControl::Ticket> ticket;
  };

  void failed(Status why) {
    control_->count_failed();
    if (failures_.size() < kMaxQueuedFailures) failures_.push_back(std::move(why));
  }

  // Every event of the listening channel (non-blocking).
  Status drain_listener() {
    for (;;) {
      rdma_cm_event* raw = nullptr;
      if (rdma_get_cm_event(channel_.get(), &raw) != 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
        return errno_status(Errc::kIoError, "rdma listener on " + where_ + ": rdma_get_cm_event",
                            errno);
      }
      CmEvent event(raw);
      switch (event->event) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
          if (Status started = accept_request(std::move(event)); !started.ok()) failed(started);
          break;
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
          return Status(Errc::kConnectionError, "rdma listener on " + where_ + ": device " +
                                                    device_name(event->id->verbs) +
                                                    " was removed; recreate the listener");
        case RDMA_CM_EVENT_ADDR_CHANGE:  // the bound address moved; listening continues
        case RDMA_CM_EVENT_TIMEWAIT_EXIT:
          break;
        case RDMA_CM_EVENT_ADDR_RESOLVED:
        case RDMA_CM_EVENT_ADDR_ERROR:
        case RDMA_CM_EVENT_ROUTE_RESOLVED:
        case RDMA_CM_EVENT_ROUTE_ERROR:
        case RDMA_CM_EVENT_CONNECT_RESPONSE:
        case RDMA_CM_EVENT_CONNECT_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_REJECTED:
        case RDMA_CM_EVENT_ESTABLISHED:
        case RDMA_CM_EVENT_DISCONNECTED:
        case RDMA_CM_EVENT_MULTICAST_JOIN:
        case RDMA_CM_EVENT_MULTICAST_ERROR:
          // Accepted ids live on their own channels; only a request that
          // failed before migration could leave an event here.
          log::debug("rdma listener on {}: ignoring {}", where_, rdma_event_str(event->event));
          break;
      }
    }
  }

  // Builds the connection for one CONNECT_REQUEST and accepts it; the
  // ESTABLISHED that completes it is awaited in pending_. Errors concern
  // that initiator only: the listener stays usable.
  Status accept_request(CmEvent event) {
    CmId id(event->id);  // a request's id is ours to destroy
    const sockaddr* sa = rdma_get_peer_addr(id.get());
    const std::string peer = [&] {
      char host[INET6_ADDRSTRLEN] = "?";
      uint16_t p = 0;
      if (sa->sa_family == AF_INET) {
        auto* in = reinterpret_cast<const sockaddr_in*>(sa);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        p = ntohs(in->sin_port);
      } else if (sa->sa_family == AF_INET6) {
        auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        p = ntohs(in6->sin6_port);
      }
      return endpoint_text(host, p);
    }();
    const std::string source = admission_source(
        sa, sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    const std::string context = "accepting rdma connection from " + peer;
    auto theirs =
        WireParams::decode(event->param.conn.private_data, event->param.conn.private_data_len);
    const uint8_t their_initiator_depth = event->param.conn.initiator_depth;
    const uint8_t their_responder_resources = event->param.conn.responder_resources;
    // Private data points into the event: copied above, now acknowledge it
    // (rdma_migrate_id waits for every event of the id to be acknowledged).
    event.reset();

    const auto reject = [&](WireParams::Kind why, const Status& status) {
      WireParams r;
      r.kind = why;
      const auto wire = r.encode();
      rdma_reject(id.get(), wire.data(), static_cast<uint8_t>(wire.size()));
      return status.with_context(context);
    };
    if (!theirs.ok() || theirs->kind != WireParams::kParams)
      return reject(
          WireParams::kRejectProtocol,
          theirs.ok() ? Status(Errc::kProtocolError, "not a connection request") : theirs.status());

    if (theirs->message_size != options_.message_size) {
      WireParams r;
      r.kind = WireParams::kRejectMessageSize;
      r.message_size = options_.message_size;
      r.recv_slots = options_.recv_slots;
      const auto wire = r.encode();
      rdma_reject(id.get(), wire.data(), static_cast<uint8_t>(wire.size()));
      return Status(Errc::kConfigError, "message_size mismatch: the initiator uses " +
                                            std::to_string(theirs->message_size) +
                                            " bytes, we use " +
                                            std::to_string(options_.message_size))
          .with_context(context);
    }
    // Counted from here on (the QP is the expensive part); a full house
    // makes room by closing the oldest unauthenticated connection.
    rdma_cm_id* raw_id = id.get();
    bool made_room = false;
    auto ticket = control_->admit(
        source, [raw_id] { rdma_disconnect(raw_id); }, &made_room);
    if (made_room) {
      sweep_evicted();
      if (evicted_log_.count()) control_->warn_evicted("rdma listener on " + where_, peer);
    }
    auto channel = make_channel();
    if (!channel.ok()) {
      // Out of descriptors or memory (nothing else fails there): the
      // oldest stranger gives its up for the next initiator.
      if (control_->evict_one()) sweep_evicted();
      return reject(WireParams::kRejectResources, channel.status());
    }
    rdma_event_channel* ch = channel->get();
    // Each connection gets its own channel so its poll() sees its events only.
    if (rdma_migrate_id(id.get(), ch) != 0)
      return reject(WireParams::kRejectResources,
                    errno_status(Errc::kIoError, "rdma_migrate_id", errno));
    auto ep = std::make_shared<Endpoint>();
    ep->channel = std::move(*channel);
    ep->id = std::move(id);
    rdma_cm_id* cm = ep->id.get();
    if (Status built = build_endpoint(*ep, options_); !built.ok()) {
      // Answer, so the initiator hears "rejected" rather than timing out.
      WireParams r;
      r.kind = WireParams::kRejectResources;
      const auto wire = r.encode();
      rdma_reject(cm, wire.data(), static_cast<uint8_t>(wire.size()));
      return built.with_context(context);
    }
    ep->peer = peer;

    WireParams ours;
    ours.message_size = options_.message_size;
    ours.recv_slots = options_.recv_slots;
    const auto wire = ours.encode();
    rdma_conn_param param{};
    param.private_data = wire.data();
    param.private_data_len = static_cast<uint8_t>(wire.size());
    uint8_t init = 0;
    uint8_t resp = 0;
    device_rd_atomic(*ep, &init, &resp);
    // Never promise more than the initiator can use or asked for.
    param.responder_resources = std::max<uint8_t>(1, std::min(resp, their_initiator_depth));
    param.initiator_depth = std::max<uint8_t>(1, std::min(init, their_responder_resources));
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    if (rdma_accept(cm, &param) != 0)
      return errno_status(Errc::kConnectionError, "rdma_accept on " + ep->device, errno)
          .with_context(context);

    const int fd = ep->channel->fd;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      return errno_status(Errc::kResourceExhausted, "epoll_ctl", errno).with_context(context);
    auto p = std::make_unique<Pending>();
    p->ep = std::move(ep);
    p->theirs = *theirs;
    p->context = context;
    p->deadline = Clock::now() + control_->options().handshake_timeout;
    p->ticket = std::move(ticket);
    pending_[fd] = std::move(p);
    return Status::Ok();
  }

  // The next event of a pending connection's channel.
  void progress(int fd) {
    auto it = pending_.find(fd);
    if (it == pending_.end()) return;
    Pending& p = *it->second;
    if (p.ticket->evicted()) {
      pending_.erase(it);
      return;
    }
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(p.ep->channel.get(), &raw) != 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      failed(errno_status(Errc::kIoError, "rdma_get_cm_event", errno).with_context(p.context));
      pending_.erase(it);
      return;
    }
    CmEvent event(raw);
    const rdma_cm_event& ev = *event.get();
    Status why;
    switch (ev.event) {
      case RDMA_CM_EVENT_ESTABLISHED: {
        event.reset();
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
        auto node = pending_.extract(it);
        Pending& done = *node.mapped();
        ready_.push_back(std::unique_ptr<Connection>(
            new RdmaConnection(done.ep, options_, done.theirs, std::move(done.ticket))));
        return;
      }
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
        why =
            errno_status(Errc::kConnectionError, std::string(rdma_event_str(ev.event)), -ev.status);
        break;
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_DISCONNECTED:
        why = Status(Errc::kConnectionError,
                     std::string("the initiator went away: ") + rdma_event_str(ev.event));
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        why = Status(Errc::kConnectionError, "device " + p.ep->device + " was removed");
        break;
      case RDMA_CM_EVENT_ADDR_RESOLVED:
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_CONNECT_REQUEST:
      case RDMA_CM_EVENT_CONNECT_RESPONSE:
      case RDMA_CM_EVENT_MULTICAST_JOIN:
      case RDMA_CM_EVENT_MULTICAST_ERROR:
      case RDMA_CM_EVENT_ADDR_CHANGE:
      case RDMA_CM_EVENT_TIMEWAIT_EXIT:
        why = Status(Errc::kConnectionError, std::string("unexpected ") + rdma_event_str(ev.event) +
                                                 " during the handshake");
        break;
    }
    event.reset();
    failed(why.with_context(p.context));
    pending_.erase(it);
  }

  void expire(Clock::time_point now) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (now < it->second->deadline) {
        ++it;
        continue;
      }
      control_->count_timed_out();
      if (failures_.size() < kMaxQueuedFailures)
        failures_.push_back(
            Status(Errc::kTimeout, "timed out waiting for the initiator to complete the handshake")
                .with_context(it->second->context));
      it = pending_.erase(it);
    }
  }

  void sweep_evicted() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->ticket->evicted()) {
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  UniqueFd wake_;   // eventfd: shutdown() wakes a blocked accept()
  UniqueFd epoll_;  // the listening channel, wake_, every pending channel
  EventChannel channel_;
  CmId id_;
  const ConnectionOptions options_;
  const std::string where_;
  std::shared_ptr<AdmissionControl> control_;
  std::atomic<bool> closed_{false};
  // Below: only the thread in accept() touches these.
  std::map<int, std::unique_ptr<Pending>> pending_;  // by channel descriptor
  std::deque<std::unique_ptr<Connection>> ready_;
  std::deque<Status> failures_;
  LogLimiter evicted_log_{kLogInterval, 1};
};

Result<std::unique_ptr<Listener>> listen_impl(const std::string& address, uint16_t port,
                                              const ConnectionOptions& options,
                                              const AdmissionOptions& admission) {
  const std::string where = endpoint_text(address, port);
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (wake.get() < 0) return errno_status(Errc::kIoError, "eventfd", errno);
  UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (epoll.get() < 0) return errno_status(Errc::kIoError, "epoll_create1", errno);
  PMIRROR_ASSIGN_OR_RETURN(EventChannel channel, make_channel());
  for (int watched : {wake.get(), channel->fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = watched;
    if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, watched, &ev) != 0)
      return errno_status(Errc::kIoError, "epoll_ctl", errno);
  }
  rdma_cm_id* raw_id = nullptr;
  if (rdma_create_id(channel.get(), &raw_id, nullptr, RDMA_PS_TCP) != 0)
    return errno_status(Errc::kIoError, "rdma_create_id", errno);
  CmId id(raw_id);

  sockaddr_storage storage{};
  PMIRROR_ASSIGN_OR_RETURN(addrinfo ai, resolve(address, port, true, &storage));
  if (rdma_bind_addr(id.get(), ai.ai_addr) != 0)
    return errno_status(Errc::kConnectionError,
                        "rdma_bind_addr " + where +
                            " (the address must be on an RDMA-capable netdev, e.g. the rxe "
                            "device's interface, or 0.0.0.0)",
                        errno);
  if (rdma_listen(id.get(), 64) != 0)
    return errno_status(Errc::kConnectionError,
                        "rdma_listen " + where + " on " + device_name(id->verbs), errno);
  return std::unique_ptr<Listener>(new RdmaListener(std::move(wake), std::move(epoll),
                                                    std::move(channel), std::move(id), options,
                                                    where, admission));
}

}  // namespace
}  // namespace rdma

Result<std::unique_ptr<Listener>> rdma_listen(const std::string& address, uint16_t port,
                                              const ConnectionOptions& options,
                                              const AdmissionOptions& admission) {
  PMIRROR_RETURN_IF_ERROR(rdma::validate(options));
  PMIRROR_RETURN_IF_ERROR(rdma::require_device());
  return rdma::listen_impl(address, port, options, admission);
}

Result<std::unique_ptr<Connection>> rdma_connect(const std::string& address, uint16_t port,
                                                 const ConnectionOptions& options) {
  PMIRROR_RETURN_IF_ERROR(rdma::validate(options));
  PMIRROR_RETURN_IF_ERROR(rdma::require_device());
  return rdma::connect_impl(address, port, options);
}

void register_rdma(Registry& registry) {
  Provider rdma;
  rdma.kind = Kind::kRdma;
  // A Read proves the Writes were placed; durable only on pmem with a
  // platform that writes through (target::offered_methods decides per volume).
  rdma.capabilities.read_flushes_writes_on_any_backing = false;
  rdma.listen = rdma_listen;
  rdma.connect = rdma_connect;
  registry.add(std::move(rdma));
}

}  // namespace pmirror::transport
