// The tcp transport on loopback: the transport contract
// (transport_contract.h) and what only tcp does -- a Read never overtaken by
// a later Write, faults on registered memory, IPv6, its wire format's hello.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "common/fault.h"
#include "transport/tcp/wire.h"
#include "transport/transport.h"
#include "transport_contract.h"

namespace pmirror::transport {
namespace {

using namespace std::chrono_literals;
using contract::bytes_of;
using contract::drain_until_closed;
using contract::Endpoint;
using contract::wait_for;

class TcpHarness final : public contract::Harness {
 public:
  contract::Traits traits() const override {
    contract::Traits t;
    t.send_completes_before_delivery = true;  // a Send completes once the kernel has it
    t.refused_text = "Connection refused — is pmirrord running and listening there?";
    return t;
  }
  Result<std::unique_ptr<Listener>> listen(const ConnectionOptions& options) override {
    return transport::listen(Kind::kTcp, "127.0.0.1", 0, options);
  }
  Endpoint endpoint(const Listener& listener) const override {
    return {"127.0.0.1", listener.port()};
  }
  Result<std::unique_ptr<Connection>> connect(const Endpoint& to,
                                              const ConnectionOptions& options) override {
    return transport::connect(Kind::kTcp, to.host, to.port, options);
  }
  std::string active_peer(const Endpoint& to) const override {
    return to.host + ":" + std::to_string(to.port);
  }
  std::string passive_peer_prefix() const override { return "127.0.0.1:"; }
};

const contract::TransportUnderTest kTcp{"tcp", [] { return std::make_unique<TcpHarness>(); }};

}  // namespace

namespace contract {
INSTANTIATE_TEST_SUITE_P(Tcp, TransportContract, ::testing::Values(kTcp), transport_name);
INSTANTIATE_TEST_SUITE_P(Tcp, ReadFlushContract, ::testing::Values(kTcp), transport_name);
INSTANTIATE_TEST_SUITE_P(Tcp, RemoteAccess, ::testing::ValuesIn(every_violation(kTcp)),
                         remote_access_name);
}  // namespace contract

namespace {

class TcpTransport : public contract::HarnessFixture, public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(start(kTcp), ""); }
};

TEST_F(TcpTransport, ReadIsNotOvertakenByALaterOverlappingWrite) {
  constexpr size_t kLen = 4 << 20;
  std::vector<std::byte> remote(kLen, std::byte{0xA1}), src(kLen, std::byte{0xB2}), dst(kLen);
  auto p = make_pair();  // after the buffers, so it is destroyed before them
  ASSERT_TRUE(p.active && p.passive);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto dmr = p.active->register_memory(dst.data(), dst.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key();
  for (int round = 0; round < 5; ++round) {
    std::byte old = round == 0 ? std::byte{0xA1} : std::byte(0xB0 + round - 1);
    std::fill(src.begin(), src.end(), std::byte(0xB0 + round));
    ASSERT_TRUE(p.active->post_read(**dmr, 0, kLen, key, 0, 1).ok());
    ASSERT_TRUE(p.active->post_write(**smr, 0, kLen, key, 0, 2, true).ok());
    auto c = wait_for(*p.active, 2);
    ASSERT_EQ(c.size(), 2u);
    ASSERT_TRUE(c[0].status.ok() && c[1].status.ok());
    for (size_t i = 0; i < kLen; i += 4096) ASSERT_EQ(dst[i], old) << "round " << round;
    ASSERT_EQ(dst[kLen - 1], old);
  }
}

// A small Read (a flush Read is 8 bytes) is answered with the bytes as
// the Read found them, copied when it executes, although a Write to the
// same bytes posted right after it is applied before the answer leaves:
// the Write does not wait for it (an ordered persist's groups put a flush
// Read and then a Write to the same bytes in one list).
TEST_F(TcpTransport, ASmallReadAnswersWithTheBytesItFoundBeforeALaterWrite) {
  constexpr size_t kLen = 64;
  std::vector<std::byte> remote(4096, std::byte{0xA1}), src(kLen), dst(2 * kLen);
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto dmr = p.active->register_memory(dst.data(), dst.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && smr.ok() && dmr.ok());
  RemoteKey key = (*rmr)->remote_key();
  for (int round = 0; round < 50; ++round) {
    const std::byte old = round == 0 ? std::byte{0xA1} : std::byte(round - 1);
    std::fill(src.begin(), src.end(), std::byte(round));
    const size_t len = round % 2 == 0 ? 8 : kLen;
    const WorkRequest list[] = {
        WorkRequest::read(**dmr, 0, len, key, 512, 1),
        WorkRequest::write(**smr, 0, kLen, key, 512, 2, /*signaled=*/false),
        WorkRequest::read(**dmr, kLen, len, key, 512, 3),
    };
    auto posted = p.active->post_list(list);
    ASSERT_TRUE(posted.ok() && *posted == 3u) << posted.status().to_string();
    auto c = wait_for(*p.active, 1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_TRUE(c[0].status.ok()) << c[0].status.to_string();
    ASSERT_EQ(c[0].wr_id, 1u);
    for (size_t i = 0; i < len; ++i) ASSERT_EQ(dst[i], old) << "round " << round << " byte " << i;
    c = wait_for(*p.active, 1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_TRUE(c[0].status.ok()) << c[0].status.to_string();
    for (size_t i = 0; i < len; ++i) {
      ASSERT_EQ(dst[kLen + i], std::byte(round)) << "round " << round;
    }
    ASSERT_EQ(remote[512 + kLen - 1], std::byte(round));
  }
}

// After a post was refused for max_outstanding, poll() returns once an
// unsignaled Write leaving the queue made room, although no completion
// comes: a caller waiting for room does not sleep to its timeout (before,
// a 3000-write run at max_outstanding 16 spent 120 s in such sleeps).
TEST_F(TcpTransport, APollAfterResourceExhaustedReturnsOnceRoomIsMade) {
  // The buffers outlive the connections: unsignaled Writes still queued when
  // the test ends are being sent from them by the connection's sender thread.
  std::vector<std::byte> remote(1 << 20), src(1 << 20, std::byte{1});
  ConnectionOptions opt;
  opt.max_outstanding = 4;
  auto p = make_pair(opt);
  ASSERT_TRUE(p.active && p.passive);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && smr.ok());
  Status posted;
  for (uint64_t i = 0; i < 100000 && posted.ok(); ++i)
    posted = p.active->post_write(**smr, 0, src.size(), (*rmr)->remote_key(), 0, i, false);
  ASSERT_EQ(posted.code(), Errc::kResourceExhausted) << posted.to_string();

  std::promise<Result<size_t>> polled;
  auto returned = polled.get_future();
  std::thread poller([&] {
    Completion buf[4];
    polled.set_value(p.active->poll(buf, std::chrono::hours(1)));  // no completion will come
  });
  // A guard against the hang, not a timing: without the wake-up it waits an hour.
  const bool woke = returned.wait_for(30s) == std::future_status::ready;
  if (!woke) p.active->shutdown();  // unblocks the poller
  poller.join();
  ASSERT_TRUE(woke) << "poll() slept although room was made";
  auto r = returned.get();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, 0u);  // unsignaled: nothing to report
  ASSERT_TRUE(p.active->post_write(**smr, 0, 8, (*rmr)->remote_key(), 0, 7, true).ok())
      << "room was made";
  // Writes complete in order: once this one has, none is left in flight.
  auto done = wait_for(*p.active, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, 7u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status.to_string();
}

// The posting thread sends a persist's frames itself when the socket is
// free, but never blocks on it: with the peer not reading (its receiver
// waits for a receive slot: RNR), Writes beyond what the socket buffers
// hold still return at once (small ones sent in part and the rest copied
// for the sender, a large one left to the sender whole), the sender
// finishes them once the peer reads again, and every byte arrives.
TEST_F(TcpTransport, APostNeverBlocksOnAPeerThatStopsReading) {
  constexpr size_t kLen = 40 << 20;
  constexpr size_t kSmall = 128 << 10;
  constexpr size_t kSmallWrites = 192;  // 24 MiB, beyond loopback's buffers
  std::vector<std::byte> remote(kLen), src(kLen), flushed(8);
  for (size_t i = 0; i < kLen; ++i) src[i] = std::byte((i * 131 + i / 4096) & 0xff);
  ConnectionOptions opt;
  opt.recv_slots = 1;
  auto p = make_pair(opt);
  ASSERT_TRUE(p.active && p.passive);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto fmr = p.active->register_memory(flushed.data(), flushed.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && smr.ok() && fmr.ok());
  // The first Send takes the passive side's only slot, which it keeps; the
  // receiver then stops reading at the second.
  const std::byte message[8] = {};
  ASSERT_TRUE(p.active->post_send(message, 1).ok());
  ASSERT_TRUE(p.active->post_send(message, 2).ok());
  auto first = wait_for(*p.passive, 1);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0].opcode, Opcode::kRecv);

  auto posted = std::async(std::launch::async, [&] {
    for (size_t i = 0; i < kSmallWrites; ++i) {
      Status small = p.active->post_write(**smr, i * kSmall, kSmall, (*rmr)->remote_key(),
                                          i * kSmall, 100 + i, false);
      if (!small.ok()) return small;
    }
    const size_t rest = kSmallWrites * kSmall;
    return p.active->post_write(**smr, rest, kLen - rest, (*rmr)->remote_key(), rest, 3, true);
  });
  // A guard against the hang, not a timing: a blocking post never returns.
  const bool returned = posted.wait_for(30s) == std::future_status::ready;
  const auto slot = static_cast<uint32_t>(first[0].wr_id);
  ASSERT_TRUE(p.passive->repost_recv(slot).ok());  // the peer reads again
  ASSERT_TRUE(returned) << "post_write blocked on a peer that did not read";
  ASSERT_TRUE(posted.get().ok());
  auto second = wait_for(*p.passive, 1);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].opcode, Opcode::kRecv);
  ASSERT_TRUE(p.active->post_read(**fmr, 0, 8, (*rmr)->remote_key(), kLen - 8, 4).ok());
  std::vector<Completion> done;
  while (done.size() < 4) {
    auto more = wait_for(*p.active, 1);
    ASSERT_EQ(more.size(), 1u) << "after " << done.size() << " completions";
    ASSERT_TRUE(more[0].status.ok()) << more[0].status.to_string();
    done.push_back(more[0]);
  }
  EXPECT_EQ(done.back().wr_id, 4u) << "the flushing Read completes last";
  EXPECT_TRUE(std::equal(remote.begin(), remote.end(), src.begin())) << "bytes differ";
  EXPECT_TRUE(std::equal(flushed.begin(), flushed.end(), src.end() - 8));
}

// A registration backed by a file truncated under it (what a volume whose
// backing file shrank looks like): a Write into it is refused with the
// volume named, the connection breaks, and the process lives on -- for a
// small Write copied by the receiver (SIGBUS, caught by the guard) and for a
// large one received by the kernel (EFAULT).
TEST_F(TcpTransport, AWriteIntoAFaultingMappingIsRefusedNotFatal) {
  ASSERT_TRUE(fault::install_fault_handler().ok());
  std::string path =
      (std::filesystem::temp_directory_path() / ("pmirror-tcp-fault-" + std::to_string(::getpid())))
          .string();
  constexpr size_t kLen = 4 << 20;
  constexpr size_t kKept = 8192 + (128 << 10);  // the file's size after truncation
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kLen), 0);
  void* map = ::mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  auto* mem = static_cast<std::byte*>(map);
  fault::Registration named = fault::register_mapping(mem, kLen, "volume 'v' (" + path + ")", {});
  ASSERT_EQ(::truncate(path.c_str(), kKept), 0);
  std::vector<std::byte> src(1 << 20, std::byte{3});

  struct Case {
    size_t offset, len;
    const char* how;
  };
  // A small Write beyond the end is copied by the receiver from its buffer:
  // a SIGBUS the guard catches. A large one starting inside is received by
  // the kernel straight into the mapping (after at most a buffer's worth of
  // copying, which still lands inside the file): EFAULT from recv.
  for (Case c : {Case{kKept + 4096, 100, "(si_code BUS_ADRERR)"},
                 Case{8192, 1 << 20, "(the kernel returned Bad address)"}}) {
    SCOPED_TRACE("write of " + std::to_string(c.len) + " bytes");
    auto p = make_pair();
    ASSERT_TRUE(p.active && p.passive);
    auto rmr = p.passive->register_memory(mem, kLen, kRemoteWrite | kRemoteRead);
    auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
    RemoteKey key = (*rmr)->remote_key();
    ASSERT_TRUE(p.active->post_write(**smr, 0, c.len, key, c.offset, 1, true).ok());
    Status closed;
    auto completions = drain_until_closed(*p.active, &closed);
    bool refused = false;
    for (auto& x : completions) {
      if (x.wr_id == 1 && x.status.code() == Errc::kIoError) {
        refused = true;
        EXPECT_NE(x.status.message().find("volume 'v' (" + path + "): memory fault at offset "),
                  std::string::npos)
            << x.status.message();
        EXPECT_NE(x.status.message().find(c.how), std::string::npos) << x.status.message();
      }
    }
    std::string seen;
    for (auto& x : completions) {
      seen += "\n  wr_id " + std::to_string(x.wr_id) + ": " + x.status.to_string();
    }
    EXPECT_TRUE(refused) << "the write into the truncated mapping was not refused; completions:"
                         << seen << "\nclosed: " << closed.to_string();
  }
  // A small Read there (its answer is copied when it executes) is refused
  // the same way.
  {
    SCOPED_TRACE("read of 8 bytes");
    std::vector<std::byte> dst(8);
    auto p = make_pair();
    ASSERT_TRUE(p.active && p.passive);
    auto rmr = p.passive->register_memory(mem, kLen, kRemoteWrite | kRemoteRead);
    auto dmr = p.active->register_memory(dst.data(), dst.size(), kLocalOnly);
    ASSERT_TRUE(p.active->post_read(**dmr, 0, 8, (*rmr)->remote_key(), kKept + 4096, 1).ok());
    Status closed;
    auto completions = drain_until_closed(*p.active, &closed);
    bool refused = false;
    for (auto& x : completions) {
      if (x.wr_id == 1 && x.status.code() == Errc::kIoError) {
        refused = x.status.message().find("volume 'v' (" + path + "): memory fault at offset ") !=
                  std::string::npos;
      }
    }
    EXPECT_TRUE(refused) << "the read of the truncated mapping was not refused: "
                         << closed.to_string();
  }
  named.reset();
  ::munmap(map, kLen);
  ::unlink(path.c_str());
}

TEST_F(TcpTransport, Ipv6Loopback) {
  auto l = listen(Kind::kTcp, "::1", 0, {});
  if (!l.ok()) GTEST_SKIP() << "no IPv6 loopback: " << l.status().to_string();
  Result<std::unique_ptr<Connection>> accepted(Errc::kInternal, "not run");
  std::thread t([&] { accepted = (*l)->accept(5s); });
  auto c = connect(Kind::kTcp, "::1", (*l)->port(), {});
  t.join();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE(accepted.ok() && *accepted);
  EXPECT_EQ((*c)->peer_address(), "[::1]:" + std::to_string((*l)->port()));
}

// A raw client: connect to the listener's port.
int raw_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

void send_garbage(int fd, size_t n, uint32_t seed) {
  std::vector<uint8_t> junk(n);
  std::mt19937 rng(seed);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(n));
}

void expect_good_connection(Listener& l) {
  Result<std::unique_ptr<Connection>> accepted(Errc::kInternal, "not run");
  std::thread t([&] { accepted = l.accept(5s); });
  auto c = connect(Kind::kTcp, "127.0.0.1", l.port(), {});
  t.join();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE(accepted.ok() && *accepted) << accepted.status().to_string();
  ASSERT_TRUE((*c)->post_send(bytes_of("ping"), 1).ok());
  ASSERT_EQ(wait_for(**accepted, 1).size(), 1u);
}

TEST_F(TcpTransport, GarbageInsteadOfHelloFailsThatAcceptOnly) {
  auto l = listen(Kind::kTcp, "127.0.0.1", 0, {});
  ASSERT_TRUE(l.ok());
  int fd = raw_connect((*l)->port());
  send_garbage(fd, 4096, 7);
  auto bad = (*l)->accept(5s);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Errc::kProtocolError) << bad.status().to_string();
  ::close(fd);
  expect_good_connection(**l);
}

class GarbageAfterHandshake : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GarbageAfterHandshake, ConnectionEndsWithErrorListenerKeepsWorking) {
  auto l = listen(Kind::kTcp, "127.0.0.1", 0, {});
  ASSERT_TRUE(l.ok());
  int fd = raw_connect((*l)->port());
  // A valid hello, then noise.
  ConnectionOptions o;
  uint8_t hello[tcp::kHeaderSize + tcp::kHelloPayloadSize];
  tcp::FrameHeader h;
  h.type = tcp::FrameType::kHello;
  h.length = tcp::kHelloPayloadSize;
  tcp::encode(h, hello);
  tcp::encode(tcp::Hello{tcp::kProtocolVersion, o.message_size, o.recv_slots, o.max_outstanding},
              hello + tcp::kHeaderSize);
  ASSERT_EQ(::send(fd, hello, sizeof hello, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof hello));
  auto conn = (*l)->accept(5s);
  ASSERT_TRUE(conn.ok() && *conn) << conn.status().to_string();
  std::vector<std::byte> mem(1 << 16, std::byte{0x33});
  auto mr = (**conn).register_memory(mem.data(), mem.size(), kRemoteWrite | kRemoteRead);
  send_garbage(fd, 64 * 1024, GetParam());
  Status closed;
  auto c = drain_until_closed(**conn, &closed);
  ASSERT_FALSE(c.empty());
  EXPECT_FALSE(c[0].status.ok());
  EXPECT_EQ(closed.code(), Errc::kClosed);
  for (auto b : mem) ASSERT_EQ(b, std::byte{0x33});
  ::close(fd);
  expect_good_connection(**l);
}

INSTANTIATE_TEST_SUITE_P(Seeds, GarbageAfterHandshake, ::testing::Values(1u, 2u, 3u, 4u));

}  // namespace
}  // namespace pmirror::transport
