// The rdma_cm flows: active (resolve address, resolve route, build the QP,
// connect) and passive (bind, listen, and per CONNECT_REQUEST: move the id to
// its own event channel, build the QP, accept). Both wait on non-blocking
// event channels with poll(2), so every wait honours a deadline.
#include "transport/rdma/rdma_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "transport/rdma/rdma_connection.h"
#include "transport/rdma/verbs.h"

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
  {
    auto event = next_event(channel.get(), deadline, "address resolution");
    if (!event.ok()) {
      if (event.status().code() == Errc::kTimeout) return timed_out("resolving the address");
      return event.status();
    }
    const int status = (*event)->status;
    switch ((*event)->event) {
      case RDMA_CM_EVENT_ADDR_RESOLVED:
        break;
      case RDMA_CM_EVENT_ADDR_ERROR:
        if (-status == ETIMEDOUT) return timed_out("resolving the address");
        return errno_status(
            Errc::kConnectionError,
            "rdma_resolve_addr " + target + " (no RDMA device reaches that address?)", -status);
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_CONNECT_REQUEST:
      case RDMA_CM_EVENT_CONNECT_RESPONSE:
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_ESTABLISHED:
      case RDMA_CM_EVENT_DISCONNECTED:
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
      case RDMA_CM_EVENT_MULTICAST_JOIN:
      case RDMA_CM_EVENT_MULTICAST_ERROR:
      case RDMA_CM_EVENT_ADDR_CHANGE:
      case RDMA_CM_EVENT_TIMEWAIT_EXIT:
        return Status(Errc::kConnectionError, "rdma connect to " + target + ": unexpected " +
                                                  rdma_event_str((*event)->event) +
                                                  " while resolving the address");
    }
  }

  if (rdma_resolve_route(id.get(), ms_left(deadline)) != 0)
    return errno_status(Errc::kConnectionError,
                        "rdma_resolve_route " + target + " on " + device_name(id->verbs), errno);
  {
    auto event = next_event(channel.get(), deadline, "route resolution");
    if (!event.ok()) {
      if (event.status().code() == Errc::kTimeout) return timed_out("resolving the route");
      return event.status();
    }
    const int status = (*event)->status;
    switch ((*event)->event) {
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
        break;
      case RDMA_CM_EVENT_ROUTE_ERROR:
        if (-status == ETIMEDOUT) return timed_out("resolving the route");
        return errno_status(Errc::kConnectionError,
                            "rdma_resolve_route " + target + " on " + device_name(id->verbs),
                            -status);
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        return Status(Errc::kConnectionError, "rdma connect to " + target + ": device " +
                                                  device_name(id->verbs) + " was removed");
      case RDMA_CM_EVENT_ADDR_CHANGE:
        return Status(Errc::kConnectionError, "rdma connect to " + target +
                                                  ": the local address changed while resolving "
                                                  "the route; retry");
      case RDMA_CM_EVENT_ADDR_RESOLVED:
      case RDMA_CM_EVENT_ADDR_ERROR:
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
        return Status(Errc::kConnectionError, "rdma connect to " + target + ": unexpected " +
                                                  rdma_event_str((*event)->event) +
                                                  " while resolving the route");
    }
  }

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
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if ((access & kRemoteWrite) != 0) flags |= IBV_ACCESS_REMOTE_WRITE;
  if ((access & kRemoteRead) != 0) flags |= IBV_ACCESS_REMOTE_READ;
  // The caller names the volume and path; file_backed is true so that an
  // EINVAL on a file mapping is read as the fsdax case too.
  auto mr = register_memory_region(pd.get(), ctx, device_has_rc_odp(ctx), addr, len, flags,
                                   /*file_backed=*/true, device_name(ctx) + " cannot register it");
  return mr.ok() ? Status::Ok() : mr.status();
}

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

  RdmaListener(Fd wake, EventChannel channel, CmId id, ConnectionOptions options, std::string where)
      : wake_(std::move(wake)),
        channel_(std::move(channel)),
        id_(std::move(id)),
        options_(options),
        where_(std::move(where)) {}

  ~RdmaListener() override { shutdown(); }

  Result<std::unique_ptr<Connection>> accept(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (closed_.load())
        return Status(Errc::kClosed, "rdma listener on " + where_ + " is shut down");
      auto event = next_event(channel_.get(), deadline, "an initiator", wake_.get());
      if (!event.ok()) {
        if (event.status().code() == Errc::kTimeout) return std::unique_ptr<Connection>();
        if (event.status().code() == Errc::kClosed)
          return Status(Errc::kClosed, "rdma listener on " + where_ + " is shut down");
        return event.status().with_context("rdma listener on " + where_);
      }
      switch ((*event)->event) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
          return accept_request(std::move(*event));
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
          return Status(Errc::kConnectionError, "rdma listener on " + where_ + ": device " +
                                                    device_name((*event)->id->verbs) +
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
          spdlog::debug("rdma listener on {}: ignoring {}", where_,
                        rdma_event_str((*event)->event));
          break;
      }
    }
  }

  uint16_t port() const override { return ntohs(rdma_get_src_port(id_.get())); }

  void shutdown() override {
    if (closed_.exchange(true)) return;
    const uint64_t one = 1;
    if (::write(wake_.get(), &one, sizeof(one)) < 0)
      spdlog::warn("rdma listener on {}: cannot wake accept: {}", where_, std::strerror(errno));
  }

 private:
  // Builds the connection for one CONNECT_REQUEST. Errors concern that
  // initiator only: the listener stays usable.
  Result<std::unique_ptr<Connection>> accept_request(CmEvent event) {
    CmId id(event->id);  // a request's id is ours to destroy
    const std::string peer = [&] {
      const sockaddr* sa = rdma_get_peer_addr(id.get());
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
    auto channel = make_channel();
    if (!channel.ok()) return reject(WireParams::kRejectResources, channel.status());
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

    const auto deadline = Clock::now() + options_.connect_timeout;
    auto established = next_event(ch, deadline, "the initiator to complete the handshake");
    if (!established.ok()) return established.status().with_context(context);
    const rdma_cm_event& ev = *established->get();
    switch (ev.event) {
      case RDMA_CM_EVENT_ESTABLISHED:
        return std::unique_ptr<Connection>(new RdmaConnection(ep, options_, *theirs));
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
        return errno_status(Errc::kConnectionError, std::string(rdma_event_str(ev.event)),
                            -ev.status)
            .with_context(context);
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_DISCONNECTED:
        return Status(Errc::kConnectionError,
                      std::string("the initiator went away: ") + rdma_event_str(ev.event))
            .with_context(context);
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        return Status(Errc::kConnectionError, "device " + ep->device + " was removed")
            .with_context(context);
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
    return Status(Errc::kConnectionError,
                  std::string("unexpected ") + rdma_event_str(ev.event) + " during the handshake")
        .with_context(context);
  }

  Fd wake_;  // eventfd: shutdown() wakes a blocked accept()
  EventChannel channel_;
  CmId id_;
  const ConnectionOptions options_;
  const std::string where_;
  std::atomic<bool> closed_{false};
};

Result<std::unique_ptr<Listener>> listen_impl(const std::string& address, uint16_t port,
                                              const ConnectionOptions& options) {
  const std::string where = endpoint_text(address, port);
  Fd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (wake.get() < 0) return errno_status(Errc::kIoError, "eventfd", errno);
  PMIRROR_ASSIGN_OR_RETURN(EventChannel channel, make_channel());
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
  return std::unique_ptr<Listener>(
      new RdmaListener(std::move(wake), std::move(channel), std::move(id), options, where));
}

}  // namespace
}  // namespace rdma

Result<std::unique_ptr<Listener>> rdma_listen(const std::string& address, uint16_t port,
                                              const ConnectionOptions& options) {
  PMIRROR_RETURN_IF_ERROR(rdma::validate(options));
  PMIRROR_RETURN_IF_ERROR(rdma::require_device());
  return rdma::listen_impl(address, port, options);
}

Result<std::unique_ptr<Connection>> rdma_connect(const std::string& address, uint16_t port,
                                                 const ConnectionOptions& options) {
  PMIRROR_RETURN_IF_ERROR(rdma::validate(options));
  PMIRROR_RETURN_IF_ERROR(rdma::require_device());
  return rdma::connect_impl(address, port, options);
}

}  // namespace pmirror::transport
