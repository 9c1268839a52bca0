// Admission on the tcp listener (loopback): the transport hello without
// blocking anyone, the caps and which connection gives way, deadlines; and
// dormant connections: Send/Recv in the caller's thread, no thread until
// activate(), one-sided frames refused before it.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "common/log_limit.h"
#include "transport/admission.h"
#include "transport/tcp/wire.h"
#include "transport/transport.h"

namespace pmirror::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr size_t kHelloSize = tcp::kHeaderSize + tcp::kHelloPayloadSize;

std::vector<uint8_t> hello_bytes() {
  ConnectionOptions o;
  std::vector<uint8_t> out(kHelloSize);
  tcp::FrameHeader h;
  h.type = tcp::FrameType::kHello;
  h.length = tcp::kHelloPayloadSize;
  tcp::encode(h, out.data());
  tcp::encode(tcp::Hello{tcp::kProtocolVersion, o.message_size, o.recv_slots, o.max_outstanding},
              out.data() + tcp::kHeaderSize);
  return out;
}

// A blocking TCP connection to 127.0.0.1:port from `source` (127.x.y.z).
int connect_from(const std::string& source, uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local), 0) << source;
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(port);
  remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof remote), 0);
  return fd;
}

uint16_t local_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// True once the listener closed fd (EOF or reset), reading past its hello;
// false if still open after `wait`.
bool closed_by_listener(int fd, std::chrono::milliseconds wait = 0ms) {
  auto deadline = Clock::now() + wait;
  for (;;) {
    char buffer[256];
    ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    if (n > 0) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
}

// Calls accept until `done` holds (10 s guard); keeps what it returns.
struct Driver {
  explicit Driver(Listener& l) : listener(l) {}
  Listener& listener;
  std::vector<std::unique_ptr<Connection>> accepted;
  std::vector<Status> failures;
  bool until(const std::function<bool()>& done) {
    auto deadline = Clock::now() + 10s;
    while (!done()) {
      if (Clock::now() > deadline) return false;
      auto r = listener.accept(20ms);
      if (!r.ok()) {
        failures.push_back(r.status());
      } else if (*r != nullptr) {
        accepted.push_back(std::move(r).value());
      }
    }
    return true;
  }
};

std::unique_ptr<Listener> make_listener(const AdmissionOptions& admission = {}) {
  auto l = listen(Kind::kTcp, "127.0.0.1", 0, {}, admission);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return l.ok() ? std::move(l).value() : nullptr;
}

size_t tasks_listed() {
  size_t n = 0;
  DIR* dir = ::opendir("/proc/self/task");
  while (dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
  ::closedir(dir);
  return n;
}

// The threads of this process once the count holds still: a thread just
// joined may still be listed for a moment (its tid is cleared before the
// kernel reaps it), which would make a baseline one too high.
size_t thread_count() {
  size_t last = tasks_listed();
  int steady = 0;
  for (int i = 0; i < 400 && steady < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    size_t now = tasks_listed();
    steady = now == last ? steady + 1 : 0;
    last = now;
  }
  return last;
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// The next completion of `c` (5 s guard).
Result<Completion> next_completion(Connection& c) {
  Completion out[1];
  auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    auto r = c.poll(out, 100ms);
    if (!r.ok()) return r.status();
    if (*r == 1) return out[0];
  }
  return Status(Errc::kTimeout, "no completion");
}

// A peer that sends its hello one byte at a time, the last one only when
// told, must not hold up another initiator: the listener assembles hellos
// incrementally, the good one is accepted first, the slow one after.
TEST(ListenerAdmission, SlowLorisHelloHoldsUpNobody) {
  auto listener = make_listener();
  ASSERT_NE(listener, nullptr);
  const uint16_t port = listener->port();
  int slow = connect_from("127.0.0.2", port);
  std::atomic<bool> last_byte{false};
  std::thread slow_sender([&] {
    auto hello = hello_bytes();
    for (size_t i = 0; i + 1 < hello.size(); ++i) {
      ASSERT_EQ(::send(slow, &hello[i], 1, MSG_NOSIGNAL), 1);
      std::this_thread::sleep_for(5ms);
    }
    while (!last_byte.load()) std::this_thread::sleep_for(5ms);
    ASSERT_EQ(::send(slow, &hello.back(), 1, MSG_NOSIGNAL), 1);
  });
  std::this_thread::sleep_for(50ms);  // the slow one is part way through
  Result<std::unique_ptr<Connection>> good(Errc::kInternal, "not run");
  std::thread good_client([&] { good = connect(Kind::kTcp, "127.0.0.1", port, {}); });
  auto first = listener->accept(10s);
  last_byte = true;
  good_client.join();
  auto second = listener->accept(10s);
  slow_sender.join();
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_NE(*first, nullptr);
  // The good one (from 127.0.0.1), while the slow one (127.0.0.2) waits.
  EXPECT_EQ((*first)->peer_address().rfind("127.0.0.1:", 0), 0u) << (*first)->peer_address();
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  ASSERT_NE(*second, nullptr);
  EXPECT_EQ((*second)->peer_address(), "127.0.0.2:" + std::to_string(local_port(slow)));
  ::close(slow);
}

TEST(ListenerAdmission, TheOldestGivesWayWhenTheTotalCapIsReached) {
  AdmissionOptions caps;
  caps.max_unauthenticated = 3;
  caps.max_unauthenticated_per_source = 3;
  auto listener = make_listener(caps);
  Driver drive(*listener);
  std::vector<int> fds;
  for (const char* source : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
    fds.push_back(connect_from(source, listener->port()));
    size_t want = fds.size();
    ASSERT_TRUE(drive.until([&] { return listener->admission().unauthenticated == want; }));
  }
  fds.push_back(connect_from("127.0.0.5", listener->port()));
  ASSERT_TRUE(drive.until([&] { return listener->admission().evicted == 1; }));
  EXPECT_TRUE(closed_by_listener(fds[0], 5s)) << "the oldest was not closed";
  for (size_t i = 1; i < fds.size(); ++i) EXPECT_FALSE(closed_by_listener(fds[i])) << i;
  EXPECT_EQ(listener->admission().unauthenticated, 3u);
  for (int fd : fds) ::close(fd);
}

TEST(ListenerAdmission, TheBusiestSourceGivesWayUnderTheTotalCap) {
  AdmissionOptions caps;
  caps.max_unauthenticated = 4;
  caps.max_unauthenticated_per_source = 4;
  auto listener = make_listener(caps);
  Driver drive(*listener);
  // The oldest is alone on its address; .2 holds two.
  std::vector<int> fds;
  for (const char* source : {"127.0.0.3", "127.0.0.2", "127.0.0.2", "127.0.0.4"}) {
    fds.push_back(connect_from(source, listener->port()));
    size_t want = fds.size();
    ASSERT_TRUE(drive.until([&] { return listener->admission().unauthenticated == want; }));
  }
  fds.push_back(connect_from("127.0.0.5", listener->port()));
  ASSERT_TRUE(drive.until([&] { return listener->admission().evicted == 1; }));
  EXPECT_TRUE(closed_by_listener(fds[1], 5s)) << "the oldest of the busiest source stayed";
  EXPECT_FALSE(closed_by_listener(fds[0])) << "the lone (older) peer was closed";
  for (size_t i = 2; i < fds.size(); ++i) EXPECT_FALSE(closed_by_listener(fds[i])) << i;
  for (int fd : fds) ::close(fd);
}

TEST(ListenerAdmission, ThePerSourceCapClosesThatSourcesOldest) {
  AdmissionOptions caps;
  caps.max_unauthenticated = 10;
  caps.max_unauthenticated_per_source = 2;
  auto listener = make_listener(caps);
  Driver drive(*listener);
  std::vector<int> fds;
  for (const char* source : {"127.0.0.2", "127.0.0.3", "127.0.0.2"}) {
    fds.push_back(connect_from(source, listener->port()));
    size_t want = fds.size();
    ASSERT_TRUE(drive.until([&] { return listener->admission().unauthenticated == want; }));
  }
  fds.push_back(connect_from("127.0.0.2", listener->port()));
  ASSERT_TRUE(drive.until([&] { return listener->admission().evicted == 1; }));
  EXPECT_TRUE(closed_by_listener(fds[0], 5s));
  EXPECT_FALSE(closed_by_listener(fds[1])) << "another source's connection was closed";
  EXPECT_FALSE(closed_by_listener(fds[2]));
  EXPECT_FALSE(closed_by_listener(fds[3]));
  EXPECT_EQ(listener->admission().unauthenticated, 3u);
  for (int fd : fds) ::close(fd);
}

TEST(ListenerAdmission, AHelloNotCompletedInTimeFailsThatPeerOnly) {
  AdmissionOptions caps;
  caps.handshake_timeout = 200ms;
  auto listener = make_listener(caps);
  Driver drive(*listener);
  int silent = connect_from("127.0.0.2", listener->port());
  ASSERT_TRUE(drive.until([&] { return !drive.failures.empty(); }));
  EXPECT_EQ(drive.failures[0].code(), Errc::kTimeout) << drive.failures[0].to_string();
  EXPECT_EQ(listener->admission().timed_out, 1u);
  EXPECT_EQ(listener->admission().unauthenticated, 0u);
  EXPECT_TRUE(closed_by_listener(silent, 5s));
  ::close(silent);
  // The listener goes on.
  Result<std::unique_ptr<Connection>> good(Errc::kInternal, "not run");
  std::thread client([&] { good = connect(Kind::kTcp, "127.0.0.1", listener->port(), {}); });
  ASSERT_TRUE(drive.until([&] { return !drive.accepted.empty(); }));
  client.join();
  EXPECT_TRUE(good.ok()) << good.status().to_string();
}

// Dormant connections count as unauthenticated until activate(); an
// activated one is never evicted, a dormant one is, and learns why.
TEST(ListenerAdmission, DormantConnectionsCountUntilActivated) {
  AdmissionOptions caps;
  caps.max_unauthenticated = 2;
  caps.max_unauthenticated_per_source = 2;
  auto listener = make_listener(caps);
  Driver drive(*listener);
  std::vector<std::unique_ptr<Connection>> clients;
  auto connect_one = [&] {
    Result<std::unique_ptr<Connection>> c(Errc::kInternal, "not run");
    size_t before = drive.accepted.size();
    std::thread t([&] { c = connect(Kind::kTcp, "127.0.0.1", listener->port(), {}); });
    EXPECT_TRUE(drive.until([&] { return drive.accepted.size() == before + 1; }));
    t.join();
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (c.ok()) clients.push_back(std::move(c).value());
  };
  connect_one();
  connect_one();
  EXPECT_EQ(listener->admission().unauthenticated, 2u);
  ASSERT_TRUE(drive.accepted[0]->activate().ok());
  EXPECT_EQ(listener->admission().unauthenticated, 1u);
  connect_one();  // one dormant + this one: no room needed yet
  connect_one();  // now the oldest dormant one (accepted[1]) gives way
  EXPECT_EQ(listener->admission().evicted, 1u);
  auto evicted = next_completion(*drive.accepted[1]);
  Status why = evicted.ok() ? evicted->status : evicted.status();
  EXPECT_FALSE(why.ok());
  EXPECT_NE(why.message().find("make room"), std::string::npos) << why.to_string();
  // The activated one still works.
  ASSERT_TRUE(clients[0]->post_send(bytes_of("still here"), 1).ok());
  auto got = next_completion(*drive.accepted[0]);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(got->status.ok()) << got->status.to_string();
  EXPECT_EQ(got->opcode, Opcode::kRecv);
}

struct DormantPair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> client;   // connect(): active
  std::unique_ptr<Connection> dormant;  // accept(): dormant
};

DormantPair dormant_pair() {
  DormantPair p;
  p.listener = make_listener();
  Result<std::unique_ptr<Connection>> c(Errc::kInternal, "not run");
  std::thread t([&] { c = connect(Kind::kTcp, "127.0.0.1", p.listener->port(), {}); });
  auto accepted = p.listener->accept(10s);
  t.join();
  EXPECT_TRUE(c.ok() && accepted.ok() && *accepted);
  if (c.ok()) p.client = std::move(c).value();
  if (accepted.ok()) p.dormant = std::move(accepted).value();
  return p;
}

TEST(DormantConnection, SendsAndReceivesInTheCallersThreadThenActivates) {
  auto p = dormant_pair();
  ASSERT_TRUE(p.client && p.dormant);
  const size_t threads = thread_count();
  EXPECT_GE(p.dormant->wait_fd(), 0);

  // Recv and Send, in this thread: no thread appears.
  ASSERT_TRUE(p.client->post_send(bytes_of("hello"), 7).ok());
  pollfd readable{p.dormant->wait_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&readable, 1, 5000), 1) << "wait_fd never became readable";
  auto got = next_completion(*p.dormant);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->opcode, Opcode::kRecv);
  auto data = p.dormant->recv_data(static_cast<uint32_t>(got->wr_id), got->byte_len);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.data()), data.size()), "hello");
  ASSERT_TRUE(p.dormant->repost_recv(static_cast<uint32_t>(got->wr_id)).ok());
  ASSERT_TRUE(p.dormant->post_send(bytes_of("world"), 9).ok());
  auto sent = next_completion(*p.dormant);
  ASSERT_TRUE(sent.ok());
  EXPECT_EQ(sent->opcode, Opcode::kSend);
  EXPECT_EQ(sent->wr_id, 9u);
  EXPECT_TRUE(sent->status.ok());
  // The client's Send completion (wr_id 7) and its Recv of the answer come
  // in either order: the Send completes when its bytes are handed over, which
  // can be noticed after the answer arrived. Wait for both.
  std::optional<Completion> answer;
  bool send_done = false;
  while (!answer || !send_done) {
    auto c = next_completion(*p.client);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    if (c->opcode == Opcode::kRecv) answer = *c;
    if (c->opcode == Opcode::kSend && c->wr_id == 7) send_done = true;
  }
  auto reply = p.client->recv_data(static_cast<uint32_t>(answer->wr_id), answer->byte_len);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(reply.data()), reply.size()), "world");
  EXPECT_EQ(thread_count(), threads) << "a dormant connection started a thread";

  // One-sided operations wait for activation.
  std::vector<std::byte> memory(4096);
  auto mr = p.dormant->register_memory(memory.data(), memory.size(), kLocalOnly);
  ASSERT_TRUE(mr.ok());
  EXPECT_EQ(p.dormant->post_write(**mr, 0, 8, RemoteKey{1, 1, 8}, 0, 1, true).code(),
            Errc::kFailedPrecondition);

  ASSERT_TRUE(p.dormant->activate().ok());
  EXPECT_EQ(thread_count(), threads + 2);  // its sender and receiver
  EXPECT_EQ(p.dormant->wait_fd(), -1);
  EXPECT_TRUE(p.dormant->activate().ok()) << "activate is idempotent";
  // Now the peer may write into registered memory.
  auto target =
      p.dormant->register_memory(memory.data(), memory.size(), kRemoteWrite | kRemoteRead);
  ASSERT_TRUE(target.ok());
  std::string text = "written remotely";
  auto source = p.client->register_memory(text.data(), text.size(), kLocalOnly);
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE(
      p.client->post_write(**source, 0, text.size(), (*target)->remote_key(), 100, 5, true).ok());
  ASSERT_TRUE(p.client->post_read(**source, 0, text.size(), (*target)->remote_key(), 100, 6).ok());
  // The Read (wr_id 6) completes after the Write it follows was placed.
  for (bool read_done = false; !read_done;) {
    auto c = next_completion(*p.client);
    ASSERT_TRUE(c.ok() && c->status.ok()) << (c.ok() ? c->status : c.status()).to_string();
    read_done = c->opcode == Opcode::kRead && c->wr_id == 6;
  }
  EXPECT_EQ(std::memcmp(memory.data() + 100, text.data(), text.size()), 0);
}

TEST(DormantConnection, AOneSidedFrameBeforeActivationClosesIt) {
  auto p = dormant_pair();
  ASSERT_TRUE(p.client && p.dormant);
  std::vector<std::byte> victim(4096, std::byte{0x5a});
  auto registered = p.dormant->register_memory(victim.data(), victim.size(), kRemoteWrite);
  ASSERT_TRUE(registered.ok());
  std::string text = "not yet";
  auto source = p.client->register_memory(text.data(), text.size(), kLocalOnly);
  ASSERT_TRUE(source.ok());
  // The rkey is right: only the state is wrong.
  ASSERT_TRUE(
      p.client->post_write(**source, 0, text.size(), (*registered)->remote_key(), 0, 1, true).ok());
  auto got = next_completion(*p.dormant);
  Status why = got.ok() ? got->status : got.status();
  ASSERT_FALSE(why.ok());
  EXPECT_NE(why.message().find("before the connection was activated"), std::string::npos)
      << why.to_string();
  for (auto b : victim) ASSERT_EQ(b, std::byte{0x5a});
  EXPECT_FALSE(p.dormant->activate().ok());
}

TEST(DormantConnection, AFrameHalfSentWhenActivatedIsRefused) {
  auto listener = make_listener();
  int raw = connect_from("127.0.0.2", listener->port());
  auto hello = hello_bytes();
  ASSERT_EQ(::send(raw, hello.data(), hello.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(hello.size()));
  auto accepted = listener->accept(10s);
  ASSERT_TRUE(accepted.ok() && *accepted);
  uint8_t header[tcp::kHeaderSize];
  tcp::FrameHeader h;
  h.type = tcp::FrameType::kSend;
  h.length = 100;
  tcp::encode(h, header);
  ASSERT_EQ(::send(raw, header, sizeof header, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof header));
  ASSERT_EQ(::send(raw, "partial", 7, MSG_NOSIGNAL), 7);  // 7 of 100 payload bytes
  Completion out[4];
  for (int i = 0; i < 50; ++i) (void)(*accepted)->poll(out, 10ms);  // reads what is there
  Status activated = (*accepted)->activate();
  EXPECT_EQ(activated.code(), Errc::kProtocolError) << activated.to_string();
  ::close(raw);
}

TEST(AdmissionSource, Ipv4AddressesAndIpv6Prefixes) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  ::inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr);
  EXPECT_EQ(admission_source(reinterpret_cast<sockaddr*>(&v4), sizeof v4), "10.1.2.3");
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  ::inet_pton(AF_INET6, "2001:db8:1:2:aaaa:bbbb:cccc:dddd", &v6.sin6_addr);
  EXPECT_EQ(admission_source(reinterpret_cast<sockaddr*>(&v6), sizeof v6), "2001:db8:1:2::/64");
  ::inet_pton(AF_INET6, "::ffff:10.1.2.3", &v6.sin6_addr);
  EXPECT_EQ(admission_source(reinterpret_cast<sockaddr*>(&v6), sizeof v6), "10.1.2.3");
}

TEST(LogLimiter, ABurstThenOneSummaryPerInterval) {
  LogLimiter limiter(10s, 3);
  auto t0 = Clock::now();
  int logged = 0;
  for (int i = 0; i < 1000; ++i) logged += limiter.count(t0 + std::chrono::milliseconds(i));
  EXPECT_EQ(logged, 3);
  EXPECT_EQ(limiter.unreported(t0 + 2s), 0u) << "a summary before its interval";
  EXPECT_EQ(limiter.unreported(t0 + 11s), 997u);
  EXPECT_EQ(limiter.unreported(t0 + 12s), 0u);
  // A new interval: a new burst.
  EXPECT_TRUE(limiter.count(t0 + 20s));
  EXPECT_EQ(limiter.total(), 1001u);
}

}  // namespace
}  // namespace pmirror::transport
