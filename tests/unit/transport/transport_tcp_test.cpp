// The tcp transport on loopback: listener + connection in one process.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "transport/tcp/wire.h"
#include "transport/transport.h"

namespace pmirror::transport {
namespace {

using namespace std::chrono_literals;

struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> active;   // the connect() side
  std::unique_ptr<Connection> passive;  // the accept() side
};

Pair make_pair(const ConnectionOptions& options = {}) {
  Pair p;
  auto l = listen(Kind::kTcp, "127.0.0.1", 0, options);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  p.listener = std::move(*l);
  Result<std::unique_ptr<Connection>> accepted(Errc::kInternal, "not run");
  std::thread t([&] { accepted = p.listener->accept(5s); });
  auto c = connect(Kind::kTcp, "127.0.0.1", p.listener->port(), options);
  t.join();
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(accepted.ok()) << accepted.status().to_string();
  p.active = std::move(*c);
  p.passive = std::move(*accepted);
  EXPECT_NE(p.passive, nullptr);
  return p;
}

// Polls until n completions arrived (or the connection closed / 10 s).
std::vector<Completion> wait_for(Connection& c, size_t n) {
  std::vector<Completion> got;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  Completion buf[16];
  while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
    auto r = c.poll(std::span(buf, std::min<size_t>(16, n - got.size())), 100ms);
    if (!r.ok()) break;
    got.insert(got.end(), buf, buf + *r);
  }
  return got;
}

// Drains a connection until poll reports kClosed; returns what came before.
std::vector<Completion> drain_until_closed(Connection& c, Status* closed = nullptr) {
  std::vector<Completion> got;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  Completion buf[16];
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = c.poll(buf, 100ms);
    if (!r.ok()) {
      if (closed) *closed = r.status();
      return got;
    }
    got.insert(got.end(), buf, buf + *r);
  }
  ADD_FAILURE() << "connection did not close";
  return got;
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

TEST(TransportNames, KindAndOpcode) {
  EXPECT_EQ(kind_name(Kind::kTcp), "tcp");
  EXPECT_EQ(kind_name(Kind::kRdma), "rdma");
  EXPECT_EQ(*parse_kind("tcp"), Kind::kTcp);
  EXPECT_EQ(*parse_kind("rdma"), Kind::kRdma);
  EXPECT_EQ(parse_kind("udp").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(opcode_name(Opcode::kRecv), "recv");
}

TEST(TcpTransport, WriteThenReadBack) {
  auto p = make_pair();
  std::vector<std::byte> remote(1 << 20), src(8192), dst(8192);
  std::mt19937 rng(1);
  for (auto& b : src) b = std::byte(rng());
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  ASSERT_TRUE(rmr.ok());
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto dmr = p.active->register_memory(dst.data(), dst.size(), kLocalOnly);
  ASSERT_TRUE(smr.ok() && dmr.ok());
  RemoteKey key = (*rmr)->remote_key();
  EXPECT_EQ(key.address, reinterpret_cast<uint64_t>(remote.data()));
  EXPECT_NE(key.rkey, 0u);
  EXPECT_EQ(key.length, remote.size());

  ASSERT_TRUE(p.active->post_write(**smr, 0, src.size(), key, 100, 1, true).ok());
  ASSERT_TRUE(p.active->post_read(**dmr, 0, dst.size(), key, 100, 2).ok());
  auto c = wait_for(*p.active, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].opcode, Opcode::kWrite);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status.to_string();
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(c[1].opcode, Opcode::kRead);
  EXPECT_TRUE(c[1].status.ok()) << c[1].status.to_string();
  EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), src.size()));
  EXPECT_EQ(0, std::memcmp(remote.data() + 100, src.data(), src.size()));
  EXPECT_EQ(p.active->kind(), Kind::kTcp);
  EXPECT_NE(p.active->peer_address().find("127.0.0.1:"), std::string::npos);
}

TEST(TcpTransport, CompletionsInPostingOrder) {
  auto p = make_pair();
  std::vector<std::byte> remote(1 << 16), local(1 << 16);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key();
  // A Read, then Writes and a Send that hit the socket before the read
  // response arrives: still reported after the Read.
  ASSERT_TRUE(p.active->post_read(**lmr, 0, 32768, key, 0, 10).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 40000, 100, key, 0, 11, true).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 40000, 100, key, 0, 12, false).ok());
  ASSERT_TRUE(p.active->post_send(bytes_of("hi"), 13).ok());
  ASSERT_TRUE(p.active->post_read(**lmr, 50000, 8, key, 0, 14).ok());
  auto c = wait_for(*p.active, 4);
  ASSERT_EQ(c.size(), 4u);
  std::vector<uint64_t> ids;
  for (auto& x : c) {
    EXPECT_TRUE(x.status.ok()) << x.status.to_string();
    ids.push_back(x.wr_id);
  }
  EXPECT_EQ(ids, (std::vector<uint64_t>{10, 11, 13, 14}));
  auto r = wait_for(*p.passive, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].opcode, Opcode::kRecv);
  EXPECT_EQ(r[0].byte_len, 2u);
}

TEST(TcpTransport, ReadIsNotOvertakenByALaterOverlappingWrite) {
  auto p = make_pair();
  constexpr size_t kLen = 4 << 20;
  std::vector<std::byte> remote(kLen, std::byte{0xA1}), src(kLen, std::byte{0xB2}), dst(kLen);
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

TEST(TcpTransport, ManyRandomWritesThenReadEachBack) {
  ConnectionOptions opt;
  opt.max_outstanding = 32;
  auto p = make_pair(opt);
  constexpr size_t kRemote = 16 << 20, kMaxLen = 1 << 20;
  std::vector<std::byte> remote(kRemote), model(kRemote), src(4 * kMaxLen), dst(kMaxLen);
  std::mt19937_64 rng(42);
  for (auto& b : src) b = std::byte(rng());
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto dmr = p.active->register_memory(dst.data(), dst.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key();

  struct Op {
    size_t off, len;
  };
  std::vector<Op> ops;
  size_t inflight = 0;
  for (int i = 0; i < 300; ++i) {
    size_t len = 1 + rng() % (i % 3 == 0 ? kMaxLen : 4096);
    size_t off = rng() % (kRemote - len + 1);
    size_t soff = rng() % (src.size() - len + 1);
    bool signaled = i % 4 == 0;
    Status s = p.active->post_write(**smr, soff, len, key, off, i, signaled);
    while (s.code() == Errc::kResourceExhausted) {  // full queue: reap, retry
      auto c = wait_for(*p.active, 1);
      ASSERT_EQ(c.size(), 1u);
      ASSERT_TRUE(c[0].status.ok());
      s = p.active->post_write(**smr, soff, len, key, off, i, signaled);
    }
    ASSERT_TRUE(s.ok()) << s.to_string();
    if (signaled) ++inflight;
    std::memcpy(model.data() + off, src.data() + soff, len);
    ops.push_back({off, len});
  }
  (void)inflight;
  for (size_t i = 0; i < ops.size(); ++i) {
    Status s = p.active->post_read(**dmr, 0, ops[i].len, key, ops[i].off, 1000 + i);
    while (s.code() == Errc::kResourceExhausted) {  // signaled writes not yet reaped
      auto c = wait_for(*p.active, 1);
      ASSERT_EQ(c.size(), 1u);
      ASSERT_TRUE(c[0].status.ok());
      ASSERT_EQ(c[0].opcode, Opcode::kWrite);
      s = p.active->post_read(**dmr, 0, ops[i].len, key, ops[i].off, 1000 + i);
    }
    ASSERT_TRUE(s.ok()) << s.to_string();
    // Signaled writes still queued may come first; wait for our read.
    for (;;) {
      auto c = wait_for(*p.active, 1);
      ASSERT_EQ(c.size(), 1u);
      ASSERT_TRUE(c[0].status.ok()) << c[0].status.to_string();
      if (c[0].opcode == Opcode::kRead) {
        ASSERT_EQ(c[0].wr_id, 1000 + i);
        break;
      }
    }
    ASSERT_EQ(0, std::memcmp(dst.data(), model.data() + ops[i].off, ops[i].len)) << "op " << i;
  }
  EXPECT_EQ(0, std::memcmp(remote.data(), model.data(), kRemote));
}

TEST(TcpTransport, ReadPersistsExactlyTheWrittenRangesFirst) {
  auto p = make_pair();
  std::vector<std::byte> remote(1 << 20), other(1 << 16), local(1 << 16);
  std::mutex mu;
  std::vector<std::pair<uintptr_t, size_t>> calls;
  std::atomic<bool> read_done{false};
  std::atomic<int> calls_after_read{0};
  auto record = [&](const void* a, size_t n) {
    if (read_done) ++calls_after_read;
    std::lock_guard lk(mu);
    calls.emplace_back(reinterpret_cast<uintptr_t>(a), n);
  };
  auto rmr =
      p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead, record);
  auto omr = p.passive->register_memory(other.data(), other.size(), kRemoteWrite, record);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key(), okey = (*omr)->remote_key();
  auto base = reinterpret_cast<uintptr_t>(remote.data());
  auto obase = reinterpret_cast<uintptr_t>(other.data());

  // Two adjacent writes (coalesced), one overlapping pair, one alone, and one
  // into a second registration: a Read persists all of them.
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 100, key, 1000, 1, false).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 50, key, 1100, 2, false).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 300, key, 5000, 3, false).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 300, key, 4900, 4, false).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 7, key, 90000, 5, false).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 64, okey, 128, 6, false).ok());
  ASSERT_TRUE(p.active->post_read(**lmr, 32768, 16, key, 0, 7).ok());
  auto c = wait_for(*p.active, 1);
  read_done = true;
  ASSERT_EQ(c.size(), 1u);
  ASSERT_TRUE(c[0].status.ok()) << c[0].status.to_string();
  EXPECT_EQ(c[0].wr_id, 7u);
  {
    std::lock_guard lk(mu);
    std::set<std::pair<uintptr_t, size_t>> got(calls.begin(), calls.end());
    std::set<std::pair<uintptr_t, size_t>> want = {
        {base + 1000, 150}, {base + 4900, 400}, {base + 90000, 7}, {obase + 128, 64}};
    EXPECT_EQ(got, want);
    EXPECT_EQ(calls.size(), want.size());
    calls.clear();
  }
  EXPECT_EQ(calls_after_read, 0);

  // Nothing written since: a second Read persists nothing.
  read_done = false;
  ASSERT_TRUE(p.active->post_read(**lmr, 32768, 16, key, 0, 8).ok());
  ASSERT_EQ(wait_for(*p.active, 1).size(), 1u);
  read_done = true;
  {
    std::lock_guard lk(mu);
    EXPECT_TRUE(calls.empty());
  }
  // A Write after the Read is persisted only by the next Read.
  read_done = false;
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 10, key, 20, 9, false).ok());
  ASSERT_TRUE(p.active->post_read(**lmr, 32768, 16, key, 0, 10).ok());
  ASSERT_EQ(wait_for(*p.active, 1).size(), 1u);
  read_done = true;
  {
    std::lock_guard lk(mu);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0], std::make_pair(base + 20, size_t{10}));
  }
  EXPECT_EQ(calls_after_read, 0);
}

TEST(TcpTransport, SendRecvWithSlotReuseAndBackPressure) {
  ConnectionOptions opt;
  opt.recv_slots = 4;
  opt.message_size = 64;
  opt.max_outstanding = 16;
  auto p = make_pair(opt);
  constexpr int kMessages = 500;
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) {
      std::string m = "message " + std::to_string(i);
      Status s = p.active->post_send(bytes_of(m), i);
      while (s.code() == Errc::kResourceExhausted) {
        auto c = wait_for(*p.active, 1);
        ASSERT_EQ(c.size(), 1u);
        ASSERT_TRUE(c[0].status.ok());
        s = p.active->post_send(bytes_of(m), i);
      }
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
  });
  std::set<uint64_t> slots_seen;
  for (int i = 0; i < kMessages; ++i) {
    auto c = wait_for(*p.passive, 1);
    ASSERT_EQ(c.size(), 1u) << "message " << i;
    ASSERT_TRUE(c[0].status.ok()) << c[0].status.to_string();
    ASSERT_EQ(c[0].opcode, Opcode::kRecv);
    slots_seen.insert(c[0].wr_id);
    auto data = p.passive->recv_data(static_cast<uint32_t>(c[0].wr_id), c[0].byte_len);
    std::string got(reinterpret_cast<const char*>(data.data()), data.size());
    ASSERT_EQ(got, "message " + std::to_string(i));
    if (i % 50 == 0) std::this_thread::sleep_for(5ms);  // let the sender hit RNR
    ASSERT_TRUE(p.passive->repost_recv(static_cast<uint32_t>(c[0].wr_id)).ok());
  }
  sender.join();
  EXPECT_EQ(slots_seen, (std::set<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.passive->repost_recv(0).code(), Errc::kInvalidArgument);  // already posted
  EXPECT_EQ(p.passive->repost_recv(9).code(), Errc::kInvalidArgument);
  std::string big(65, 'x');
  EXPECT_EQ(p.active->post_send(bytes_of(big), 1).code(), Errc::kInvalidArgument);
}

TEST(TcpTransport, SymmetricPassiveSideWritesIntoActive) {
  auto p = make_pair();
  std::vector<std::byte> mem(4096), src(4096);
  std::fill(src.begin(), src.end(), std::byte{0x5a});
  auto amr = p.active->register_memory(mem.data(), mem.size(), kRemoteWrite);
  auto smr = p.passive->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(p.passive->post_write(**smr, 0, 4096, (*amr)->remote_key(), 0, 5, true).ok());
  auto c = wait_for(*p.passive, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].status.ok());
  ASSERT_TRUE(p.passive->post_send(bytes_of("done"), 6).ok());  // ordered after the write
  ASSERT_EQ(wait_for(*p.active, 1).size(), 1u);
  EXPECT_EQ(0, std::memcmp(mem.data(), src.data(), 4096));
}

enum class Violation { kOutOfBounds, kBeforeStart, kWrongRkey, kNoWriteAccess, kNoReadAccess };

class RemoteAccessTest : public ::testing::TestWithParam<Violation> {};

TEST_P(RemoteAccessTest, ErrorCompletionAndNothingOutsideTouched) {
  auto p = make_pair();
  constexpr size_t kGuard = 4096, kLen = 8192;
  std::vector<std::byte> mem(kGuard + kLen + kGuard, std::byte{0xAA});
  std::vector<std::byte> src(3 * kLen, std::byte{0x11});
  Violation v = GetParam();
  uint32_t access = kRemoteWrite | kRemoteRead;
  if (v == Violation::kNoWriteAccess) access = kRemoteRead;
  if (v == Violation::kNoReadAccess) access = kRemoteWrite;
  auto rmr = p.passive->register_memory(mem.data() + kGuard, kLen, access);
  std::vector<std::byte> fine(4096);
  auto fmr = p.passive->register_memory(fine.data(), fine.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key(), fine_key = (*fmr)->remote_key();
  // A legitimate write first: it completes fine before the bad one.
  ASSERT_TRUE(p.active->post_write(**smr, 0, 16, fine_key, 0, 1, true).ok());
  Opcode bad_op = Opcode::kWrite;
  RemoteKey bad = key;
  uint64_t off = 0;
  size_t len = 512;
  switch (v) {
    case Violation::kOutOfBounds:  // a forged, longer key
      bad.length = kLen * 2;
      off = kLen - 100;
      break;
    case Violation::kBeforeStart:
      bad.address -= 64;
      break;
    case Violation::kWrongRkey:
      bad.rkey ^= 0x5a5a5a5a;
      break;
    case Violation::kNoWriteAccess:
      break;
    case Violation::kNoReadAccess:
      bad_op = Opcode::kRead;
      break;
  }
  if (bad_op == Opcode::kWrite) {
    ASSERT_TRUE(p.active->post_write(**smr, 0, len, bad, off, 2, false).ok());
  } else {
    ASSERT_TRUE(p.active->post_read(**smr, 0, len, bad, off, 2).ok());
  }
  // Posted behind the bad one: flushed (or refused at once if the error
  // already came back).
  Status third = p.active->post_read(**smr, kLen, 64, fine_key, 0, 3);
  if (!third.ok()) {
    EXPECT_EQ(third.code(), Errc::kClosed);
  }

  Status closed;
  auto c = drain_until_closed(*p.active, &closed);
  EXPECT_EQ(closed.code(), Errc::kClosed);
  ASSERT_GE(c.size(), third.ok() ? 3u : 2u);
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status.to_string();
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(c[1].opcode, bad_op);
  EXPECT_EQ(c[1].status.code(), Errc::kPermissionDenied) << c[1].status.to_string();
  EXPECT_NE(c[1].status.message().find("remote access error"), std::string::npos)
      << c[1].status.message();
  const char* expect_word = v == Violation::kWrongRkey       ? "not registered"
                            : v == Violation::kNoWriteAccess ? "kRemoteWrite"
                            : v == Violation::kNoReadAccess  ? "kRemoteRead"
                                                             : "outside";
  EXPECT_NE(c[1].status.message().find(expect_word), std::string::npos) << c[1].status.message();
  size_t next = 2;
  if (third.ok()) {
    EXPECT_EQ(c[2].wr_id, 3u);
    EXPECT_EQ(c[2].status.code(), Errc::kConnectionError);
    EXPECT_NE(c[2].status.message().find("flushed"), std::string::npos);
    next = 3;
  }
  for (size_t i = next; i < c.size(); ++i) EXPECT_EQ(c[i].opcode, Opcode::kRecv);  // flushed slots

  EXPECT_EQ(p.active->post_write(**smr, 0, 1, key, 0, 4, true).code(), Errc::kClosed);
  // The passive side breaks too (its receive slots are flushed).
  Status pclosed;
  auto pc = drain_until_closed(*p.passive, &pclosed);
  EXPECT_EQ(pc.size(), ConnectionOptions{}.recv_slots);
  for (auto& x : pc) EXPECT_FALSE(x.status.ok());
  EXPECT_EQ(pclosed.code(), Errc::kClosed);

  for (size_t i = 0; i < kGuard; ++i) {
    ASSERT_EQ(mem[i], std::byte{0xAA}) << "guard before, byte " << i;
    ASSERT_EQ(mem[kGuard + kLen + i], std::byte{0xAA}) << "guard after, byte " << i;
  }
  for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(mem[kGuard + i], std::byte{0xAA}) << i;
  for (size_t i = 0; i < 16; ++i) ASSERT_EQ(fine[i], std::byte{0x11});
}

INSTANTIATE_TEST_SUITE_P(Violations, RemoteAccessTest,
                         ::testing::Values(Violation::kOutOfBounds, Violation::kBeforeStart,
                                           Violation::kWrongRkey, Violation::kNoWriteAccess,
                                           Violation::kNoReadAccess));

TEST(TcpTransport, DeregisteredMemoryIsNoLongerReachable) {
  auto p = make_pair();
  std::vector<std::byte> mem(4096, std::byte{0}), src(4096, std::byte{1});
  auto rmr = p.passive->register_memory(mem.data(), mem.size(), kRemoteWrite);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key();
  rmr->reset();
  ASSERT_TRUE(p.active->post_write(**smr, 0, 100, key, 0, 1, true).ok());
  auto c = drain_until_closed(*p.active);
  bool refused = false;
  for (auto& x : c)
    if (x.wr_id == 1 && x.opcode == Opcode::kWrite && x.status.code() == Errc::kPermissionDenied)
      refused = true;
  EXPECT_TRUE(refused);
  for (auto b : mem) ASSERT_EQ(b, std::byte{0});
}

TEST(TcpTransport, PeerDiesOutstandingOpsFailAndPostsReturnClosed) {
  ConnectionOptions opt;
  opt.recv_slots = 1;
  auto p = make_pair(opt);
  std::vector<std::byte> local(4096);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  std::vector<std::byte> remote(4096);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteRead);
  RemoteKey key = (*rmr)->remote_key();
  // The first send fills the only slot, the second blocks the passive side's
  // receiver (RNR: nobody reposts), so the reads behind it stay outstanding.
  ASSERT_TRUE(p.active->post_send(bytes_of("one"), 1).ok());
  ASSERT_TRUE(p.active->post_send(bytes_of("two"), 2).ok());
  for (uint64_t i = 0; i < 5; ++i)
    ASSERT_TRUE(p.active->post_read(**lmr, 0, 64, key, 0, 10 + i).ok());
  auto sends = wait_for(*p.active, 2);
  ASSERT_EQ(sends.size(), 2u);
  Completion none[1];
  auto r = p.active->poll(none, 100ms);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u) << "reads completed although the peer's receiver is blocked";

  p.passive->shutdown();
  p.passive->shutdown();  // idempotent

  Status closed;
  auto c = drain_until_closed(*p.active, &closed);
  std::vector<uint64_t> failed_reads;
  for (auto& x : c) {
    EXPECT_FALSE(x.status.ok());
    if (x.opcode == Opcode::kRead) {
      failed_reads.push_back(x.wr_id);
      EXPECT_EQ(x.status.code(), Errc::kConnectionError) << x.status.to_string();
      EXPECT_NE(x.status.message().find(p.active->peer_address()), std::string::npos)
          << x.status.message();
    }
  }
  EXPECT_EQ(failed_reads, (std::vector<uint64_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(closed.code(), Errc::kClosed);
  EXPECT_EQ(p.active->post_read(**lmr, 0, 64, key, 0, 99).code(), Errc::kClosed);
  EXPECT_EQ(p.active->post_send(bytes_of("x"), 100).code(), Errc::kClosed);
  EXPECT_EQ(p.active->poll(none, 10ms).status().code(), Errc::kClosed);

  // The side that shut down: one delivered message, then kClosed.
  Status pclosed;
  auto pc = drain_until_closed(*p.passive, &pclosed);
  ASSERT_GE(pc.size(), 1u);
  EXPECT_TRUE(pc[0].status.ok());
  EXPECT_EQ(pclosed.code(), Errc::kClosed);
}

TEST(TcpTransport, ShutdownWithNothingPendingAndDestroyOrder) {
  auto p = make_pair();
  std::vector<std::byte> mem(4096);
  auto mr = p.active->register_memory(mem.data(), mem.size(), kRemoteWrite);
  p.active->shutdown();
  Status closed;
  auto c = drain_until_closed(*p.active, &closed);
  EXPECT_EQ(c.size(), ConnectionOptions{}.recv_slots);  // flushed receive slots
  EXPECT_EQ(closed.code(), Errc::kClosed);
  auto pc = drain_until_closed(*p.passive, &closed);
  ASSERT_FALSE(pc.empty());
  EXPECT_EQ(pc[0].status.code(), Errc::kConnectionError);
  EXPECT_NE(pc[0].status.message().find("closed the connection"), std::string::npos)
      << pc[0].status.message();
  // The region outlives its connection.
  p.active.reset();
  mr->reset();
}

TEST(TcpTransport, ResourceExhaustedBeyondMaxOutstanding) {
  ConnectionOptions opt;
  opt.max_outstanding = 8;
  auto p = make_pair(opt);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(p.active->post_send(bytes_of("m"), i).ok());
  Status s = p.active->post_send(bytes_of("m"), 8);
  EXPECT_EQ(s.code(), Errc::kResourceExhausted);
  EXPECT_NE(s.message().find("max_outstanding 8"), std::string::npos) << s.message();
  auto c = wait_for(*p.active, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_TRUE(p.active->post_send(bytes_of("m"), 9).ok());
  EXPECT_TRUE(p.active->post_send(bytes_of("m"), 10).ok());
  EXPECT_EQ(p.active->post_send(bytes_of("m"), 11).code(), Errc::kResourceExhausted);
}

TEST(TcpTransport, LocalArgumentChecks) {
  auto p = make_pair();
  auto q = make_pair();
  std::vector<std::byte> mem(4096);
  auto mr = p.active->register_memory(mem.data(), mem.size(), kLocalOnly);
  auto foreign = q.active->register_memory(mem.data(), mem.size(), kLocalOnly);
  RemoteKey key{};
  EXPECT_EQ(p.active->post_write(**mr, 4000, 200, key, 0, 1, true).code(), Errc::kInvalidArgument);
  EXPECT_EQ(p.active->post_write(**foreign, 0, 1, key, 0, 1, true).code(), Errc::kInvalidArgument);
  EXPECT_EQ(p.active->register_memory(nullptr, 10, kRemoteRead).status().code(),
            Errc::kInvalidArgument);
}

TEST(TcpTransport, ConnectToClosedPortIsConnectionError) {
  // A port that was just free: bind, read it, close.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  uint16_t port = ntohs(a.sin_port);
  auto c = connect(Kind::kTcp, "127.0.0.1", port, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Errc::kConnectionError);
  EXPECT_EQ(c.status().message(), "connect to 127.0.0.1:" + std::to_string(port) +
                                      ": Connection refused — is pmirrord running and listening "
                                      "there?");
}

TEST(TcpTransport, AcceptTimeoutReturnsNullAndShutdownWakesAccept) {
  auto l = listen(Kind::kTcp, "127.0.0.1", 0, {});
  ASSERT_TRUE(l.ok());
  EXPECT_NE((*l)->port(), 0);
  auto t0 = std::chrono::steady_clock::now();
  auto c = (*l)->accept(50ms);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, nullptr);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 45ms);
  std::thread waker([&] {
    std::this_thread::sleep_for(50ms);
    (*l)->shutdown();
  });
  auto c2 = (*l)->accept(10s);
  waker.join();
  EXPECT_EQ(c2.status().code(), Errc::kClosed);
  (*l)->shutdown();
}

TEST(TcpTransport, Ipv6Loopback) {
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

TEST(TcpTransport, MessageSizeMismatchRejectedOnBothSides) {
  ConnectionOptions a, b;
  b.message_size = 8192;
  auto l = listen(Kind::kTcp, "127.0.0.1", 0, a);
  ASSERT_TRUE(l.ok());
  Result<std::unique_ptr<Connection>> accepted(Errc::kInternal, "not run");
  std::thread t([&] { accepted = (*l)->accept(5s); });
  auto c = connect(Kind::kTcp, "127.0.0.1", (*l)->port(), b);
  t.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Errc::kConfigError);
  EXPECT_NE(c.status().message().find("message_size mismatch"), std::string::npos);
  ASSERT_FALSE(accepted.ok());
  EXPECT_EQ(accepted.status().code(), Errc::kConfigError);
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

TEST(TcpTransport, GarbageInsteadOfHelloFailsThatAcceptOnly) {
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

std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> connect_pair(Listener& l) {
  Result<std::unique_ptr<Connection>> accepted(Errc::kInternal, "not run");
  std::thread t([&] { accepted = l.accept(5s); });
  auto c = connect(Kind::kTcp, "127.0.0.1", l.port(), {});
  t.join();
  EXPECT_TRUE(c.ok() && accepted.ok());
  if (!c.ok() || !accepted.ok()) return {};
  return {std::move(c).value(), std::move(accepted).value()};
}

TEST(TcpTransport, RkeyOfAnotherConnectionIsRefused) {
  auto l = listen(Kind::kTcp, "127.0.0.1", 0, {});
  ASSERT_TRUE(l.ok());
  auto [c1, s1] = connect_pair(**l);
  auto [c2, s2] = connect_pair(**l);
  ASSERT_TRUE(c1 && s1 && c2 && s2);
  std::vector<std::byte> mem(4096, std::byte{0}), src(4096, std::byte{9});
  auto mr1 = s1->register_memory(mem.data(), mem.size(), kRemoteWrite | kRemoteRead);
  auto smr2 = c2->register_memory(src.data(), src.size(), kLocalOnly);
  // s1's key used on c2 (whose peer is s2): unknown there.
  ASSERT_TRUE(c2->post_write(**smr2, 0, 16, (*mr1)->remote_key(), 0, 2, false).ok());
  auto c = drain_until_closed(*c2);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0].wr_id, 2u);
  EXPECT_EQ(c[0].status.code(), Errc::kPermissionDenied) << c[0].status.to_string();
  for (auto b : mem) ASSERT_EQ(b, std::byte{0});
  // c1 is unaffected.
  auto smr1 = c1->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(c1->post_write(**smr1, 0, 16, (*mr1)->remote_key(), 0, 3, true).ok());
  ASSERT_TRUE(c1->post_read(**smr1, 100, 16, (*mr1)->remote_key(), 0, 4).ok());
  auto ok = wait_for(*c1, 2);
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_TRUE(ok[1].status.ok()) << ok[1].status.to_string();
}

}  // namespace
}  // namespace pmirror::transport
