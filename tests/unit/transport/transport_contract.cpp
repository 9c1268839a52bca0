// The transport contract's cases (transport_contract.h): what transport.h
// promises, checked the same way on every implementation.
#include "transport_contract.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <ostream>
#include <random>
#include <set>
#include <thread>

namespace pmirror::transport::contract {

using Clock = std::chrono::steady_clock;

void PrintTo(const TransportUnderTest& transport, std::ostream* os) { *os << transport.name; }

std::string transport_name(const ::testing::TestParamInfo<TransportUnderTest>& info) {
  return info.param.name;
}

std::vector<Completion> wait_for(Connection& c, size_t n) {
  std::vector<Completion> got;
  const auto deadline = Clock::now() + 20s;
  Completion buf[16];
  while (got.size() < n && Clock::now() < deadline) {
    auto r = c.poll(std::span(buf, std::min<size_t>(16, n - got.size())), 100ms);
    if (!r.ok()) break;
    got.insert(got.end(), buf, buf + *r);
  }
  return got;
}

std::vector<Completion> drain_until_closed(Connection& c, Status* closed) {
  std::vector<Completion> got;
  const auto deadline = Clock::now() + 20s;
  Completion buf[16];
  while (Clock::now() < deadline) {
    auto r = c.poll(buf, 100ms);
    if (!r.ok()) {
      if (closed != nullptr) *closed = r.status();
      return got;
    }
    got.insert(got.end(), buf, buf + *r);
  }
  ADD_FAILURE() << "connection did not close";
  return got;
}

std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

Status post_retrying(Connection& c, const std::function<Status()>& post,
                     std::vector<Completion>* seen) {
  for (;;) {
    Status s = post();
    if (s.code() != Errc::kResourceExhausted) return s;
    Completion buf[16];
    auto r = c.poll(buf, 1s);
    if (!r.ok()) return r.status();
    seen->insert(seen->end(), buf, buf + *r);
  }
}

std::string HarnessFixture::start(const TransportUnderTest& transport) {
  harness_ = transport.make();
  return harness_->skip_reason();
}

std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> HarnessFixture::connect_pair(
    Listener& listener, const ConnectionOptions& options) {
  Result<std::unique_ptr<Connection>> accepted(Errc::kInternal, "not run");
  std::thread t([&] { accepted = listener.accept(10s); });
  auto c = harness_->connect(harness_->endpoint(listener), options);
  t.join();
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(accepted.ok() && *accepted != nullptr)
      << (accepted.ok() ? "accept timed out" : accepted.status().to_string());
  if (!c.ok() || !accepted.ok() || *accepted == nullptr) return {};
  // The accepted side is dormant (Send/Recv only) until activated.
  EXPECT_TRUE((*accepted)->activate().ok());
  return {std::move(c).value(), std::move(accepted).value()};
}

Pair HarnessFixture::make_pair(const ConnectionOptions& options) {
  Pair p;
  auto l = harness_->listen(options);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return p;
  p.listener = std::move(l).value();
  std::tie(p.active, p.passive) = connect_pair(*p.listener, options);
  return p;
}

// ----------------------------------------------------- TransportContract

TEST_P(TransportContract, ConnectAcceptAndPeerAddresses) {
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  EXPECT_NE(p.listener->port(), 0);
  EXPECT_EQ(p.active->peer_address(), harness().active_peer(harness().endpoint(*p.listener)));
  EXPECT_EQ(p.passive->peer_address().rfind(harness().passive_peer_prefix(), 0), 0u)
      << p.passive->peer_address();
  ASSERT_TRUE(p.active->post_send(bytes_of("ping"), 1).ok());
  auto got = wait_for(*p.passive, 1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].status.ok()) << got[0].status.to_string();
  EXPECT_EQ(got[0].opcode, Opcode::kRecv);
  auto data = p.passive->recv_data(static_cast<uint32_t>(got[0].wr_id), got[0].byte_len);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.data()), data.size()), "ping");
}

TEST_P(TransportContract, WriteThenReadBack) {
  std::vector<std::byte> remote(1 << 20), src(8192), dst(8192);
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  std::mt19937 rng(1);
  for (auto& b : src) b = std::byte(rng());
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  ASSERT_TRUE(rmr.ok()) << rmr.status().to_string();
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
}

TEST_P(TransportContract, CompletionsInPostingOrder) {
  std::vector<std::byte> remote(1 << 16), local(1 << 16);
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && lmr.ok());
  RemoteKey key = (*rmr)->remote_key();
  // A Read, then Writes and a Send that may reach the peer before the read
  // response comes back: still reported after the Read.
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

TEST_P(TransportContract, PostListPostsWritesReadAndSendInOrder) {
  std::vector<std::byte> remote(1 << 16), local(1 << 16), flushed(64);
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  std::mt19937 rng(7);
  for (auto& b : local) b = std::byte(rng());
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  auto fmr = p.active->register_memory(flushed.data(), flushed.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && lmr.ok() && fmr.ok());
  RemoteKey key = (*rmr)->remote_key();
  // A small Write (inline over rdma), a large one, unsignaled both, then a
  // Read of the first one's bytes and a Send: one list.
  const std::string hello = "committed";
  const WorkRequest list[] = {
      WorkRequest::write(**lmr, 0, 64, key, 128, 1, /*signaled=*/false),
      WorkRequest::write(**lmr, 4096, 20000, key, 8192, 2, /*signaled=*/false),
      WorkRequest::read(**fmr, 0, 64, key, 128, 3),
      WorkRequest::send(bytes_of(hello), 4),
  };
  auto posted = p.active->post_list(list);
  ASSERT_TRUE(posted.ok()) << posted.status().to_string();
  ASSERT_EQ(*posted, 4u);
  auto c = wait_for(*p.active, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 3u);
  EXPECT_EQ(c[0].opcode, Opcode::kRead);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status.to_string();
  EXPECT_EQ(c[1].wr_id, 4u);
  EXPECT_EQ(c[1].opcode, Opcode::kSend);
  EXPECT_EQ(0, std::memcmp(flushed.data(), local.data(), 64)) << "the Read saw the Write";
  EXPECT_EQ(0, std::memcmp(remote.data() + 128, local.data(), 64));
  EXPECT_EQ(0, std::memcmp(remote.data() + 8192, local.data() + 4096, 20000));
  auto r = wait_for(*p.passive, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].opcode, Opcode::kRecv);
  auto data = p.passive->recv_data(static_cast<uint32_t>(r[0].wr_id), r[0].byte_len);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.data()), data.size()), hello);
}

TEST_P(TransportContract, PostListBeyondRoomPostsAPrefixAndTheRestLater) {
  ConnectionOptions opt;
  opt.max_outstanding = 8;
  auto p = make_pair(opt);
  ASSERT_TRUE(p.active && p.passive);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(p.active->post_send(bytes_of("m"), i).ok());
  const std::string m = "m";
  std::vector<WorkRequest> list;
  for (int i = 6; i < 10; ++i) list.push_back(WorkRequest::send(bytes_of(m), i));
  auto posted = p.active->post_list(list);
  ASSERT_TRUE(posted.ok()) << posted.status().to_string();
  ASSERT_LT(*posted, list.size()) << "8 may be outstanding, 10 were posted";
  std::vector<Completion> seen;
  size_t done = *posted;
  const auto deadline = Clock::now() + 20s;
  while (done < list.size() && Clock::now() < deadline) {
    Completion buf[16];
    auto r = p.active->poll(buf, 100ms);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    seen.insert(seen.end(), buf, buf + *r);
    auto more = p.active->post_list(std::span(list).subspan(done));
    ASSERT_TRUE(more.ok()) << more.status().to_string();
    done += *more;
  }
  ASSERT_EQ(done, list.size());
  auto rest = wait_for(*p.active, 10 - seen.size());
  seen.insert(seen.end(), rest.begin(), rest.end());
  ASSERT_EQ(seen.size(), 10u);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i].wr_id, i) << "in posting order";
  auto r = wait_for(*p.passive, 10);
  EXPECT_EQ(r.size(), 10u) << "each message arrived once";
}

TEST_P(TransportContract, EveryPollModeDeliversCompletionsAndWaitsOutItsTimeout) {
  for (PollMode mode : {PollMode::kEvent, PollMode::kAdaptive, PollMode::kBusy}) {
    SCOPED_TRACE(std::string(poll_mode_name(mode)));
    std::vector<std::byte> remote(4096), local(4096), back(64);
    ConnectionOptions options;
    options.poll_mode = mode;
    auto p = make_pair(options);
    ASSERT_TRUE(p.active && p.passive);
    p.passive->set_poll_mode(mode);
    auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
    auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
    auto bmr = p.active->register_memory(back.data(), back.size(), kLocalOnly);
    ASSERT_TRUE(rmr.ok() && lmr.ok() && bmr.ok());
    const RemoteKey key = (*rmr)->remote_key();
    Completion got[4];
    // Nothing in flight: the wait lasts its timeout and finds nothing.
    const auto start = Clock::now();
    auto none = p.active->poll(got, 30ms);
    ASSERT_TRUE(none.ok()) << none.status().to_string();
    EXPECT_EQ(*none, 0u);
    EXPECT_GE(Clock::now() - start, 29ms);
    // Round trips: each Read completes, after its Write, whatever the mode.
    for (int i = 0; i < 50; ++i) {
      std::memset(local.data(), i, 64);
      const WorkRequest list[] = {WorkRequest::write(**lmr, 0, 64, key, 256, 1, false),
                                  WorkRequest::read(**bmr, 0, 64, key, 256, 2)};
      auto posted = p.active->post_list(list);
      ASSERT_TRUE(posted.ok() && *posted == 2u);
      auto c = wait_for(*p.active, 1);
      ASSERT_EQ(c.size(), 1u);
      ASSERT_EQ(c[0].wr_id, 2u);
      ASSERT_TRUE(c[0].status.ok()) << c[0].status.to_string();
      ASSERT_EQ(back[63], std::byte(i));
    }
    // And the passive side receives under it.
    ASSERT_TRUE(p.active->post_send(bytes_of("mode"), 3).ok());
    auto r = wait_for(*p.passive, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].opcode, Opcode::kRecv);
  }
}

// wake() (transport.h): what a target's idle session sleeps on. The bounds
// below are the poll's timeout, far above any wake's latency: a busy
// machine cannot fail them, a wake that does not wake can.
TEST_P(TransportContract, WakeEndsAPollUnderWayOrElseTheNextOneOnce) {
  for (PollMode mode : {PollMode::kEvent, PollMode::kAdaptive, PollMode::kBusy}) {
    SCOPED_TRACE(std::string(poll_mode_name(mode)));
    ConnectionOptions options;
    options.poll_mode = mode;
    auto p = make_pair(options);
    ASSERT_TRUE(p.active && p.passive);
    p.passive->set_poll_mode(mode);
    Completion got[4];
    // A poll under way, woken from another thread.
    std::atomic<bool> polling{false};
    Result<size_t> woken(Errc::kInternal, "not run");
    Clock::duration waited{};
    std::thread poller([&] {
      polling = true;
      const auto start = Clock::now();
      woken = p.passive->poll(got, 60s);
      waited = Clock::now() - start;
    });
    while (!polling) std::this_thread::yield();
    std::this_thread::sleep_for(20ms);  // most likely asleep by now; either way it must return
    p.passive->wake();
    poller.join();
    ASSERT_TRUE(woken.ok()) << woken.status().to_string();
    EXPECT_EQ(*woken, 0u);
    EXPECT_LT(waited, 50s) << "the poll slept to its timeout: wake() did not end it";
    // A wake with no poll under way is kept for the next poll, and spent by it.
    p.passive->wake();
    auto start = Clock::now();
    auto next = p.passive->poll(got, 60s);
    ASSERT_TRUE(next.ok()) << next.status().to_string();
    EXPECT_EQ(*next, 0u);
    EXPECT_LT(Clock::now() - start, 50s) << "a wake before the poll was lost";
    start = Clock::now();
    auto after = p.passive->poll(got, 30ms);
    ASSERT_TRUE(after.ok()) << after.status().to_string();
    EXPECT_EQ(*after, 0u);
    EXPECT_GE(Clock::now() - start, 29ms) << "one wake ended two polls";
    // Completions still come as before.
    ASSERT_TRUE(p.active->post_send(bytes_of("after wake"), 7).ok());
    auto r = wait_for(*p.passive, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].opcode, Opcode::kRecv);
  }
}

TEST_P(TransportContract, ManyRandomWritesThenReadEachBack) {
  ConnectionOptions opt;
  opt.max_outstanding = 32;
  constexpr size_t kRemote = 16 << 20, kMaxLen = 1 << 20;
  std::vector<std::byte> remote(kRemote), model(kRemote), src(4 * kMaxLen), dst(kMaxLen);
  auto p = make_pair(opt);
  ASSERT_TRUE(p.active && p.passive);
  std::mt19937_64 rng(42);
  for (auto& b : src) b = std::byte(rng());
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto dmr = p.active->register_memory(dst.data(), dst.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && smr.ok() && dmr.ok());
  RemoteKey key = (*rmr)->remote_key();

  struct Op {
    size_t off, len;
  };
  std::vector<Op> ops;
  std::vector<Completion> seen;  // signaled writes reaped while the queue was full
  for (int i = 0; i < 300; ++i) {
    size_t len = 1 + rng() % (i % 3 == 0 ? kMaxLen : 4096);
    size_t off = rng() % (kRemote - len + 1);
    size_t soff = rng() % (src.size() - len + 1);
    bool signaled = i % 4 == 0;
    Status s = post_retrying(
        *p.active, [&] { return p.active->post_write(**smr, soff, len, key, off, i, signaled); },
        &seen);
    ASSERT_TRUE(s.ok()) << s.to_string();
    std::memcpy(model.data() + off, src.data() + soff, len);
    ops.push_back({off, len});
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    Status s = post_retrying(
        *p.active,
        [&] { return p.active->post_read(**dmr, 0, ops[i].len, key, ops[i].off, 1000 + i); },
        &seen);
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
  for (auto& c : seen) {
    EXPECT_TRUE(c.status.ok()) << c.status.to_string();
    EXPECT_EQ(c.opcode, Opcode::kWrite);
  }
  EXPECT_EQ(0, std::memcmp(remote.data(), model.data(), kRemote));
}

TEST_P(TransportContract, ManyRandomWritesMostlyUnsignaledThenReadBack) {
  ConnectionOptions opt;
  opt.max_outstanding = 16;  // small: back-pressure, internal signalling
  constexpr size_t kTarget = 1 << 20;
  std::vector<std::byte> target(kTarget);
  auto p = make_pair(opt);
  ASSERT_TRUE(p.active && p.passive);
  auto tmr = p.passive->register_memory(target.data(), target.size(), kRemoteWrite | kRemoteRead);
  ASSERT_TRUE(tmr.ok());
  const RemoteKey key = (*tmr)->remote_key();

  std::vector<std::byte> src(256 << 10), back(kTarget), shadow(kTarget);
  std::mt19937 rng(42);
  for (auto& b : src) b = std::byte(rng());
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto bmr = p.active->register_memory(back.data(), back.size(), kLocalOnly);
  ASSERT_TRUE(smr.ok() && bmr.ok());

  std::vector<Completion> seen;
  size_t signaled = 0;
  for (uint64_t i = 0; i < 3000; ++i) {
    const size_t len = 1 + rng() % 8192;
    const size_t soff = rng() % (src.size() - len);
    const size_t doff = rng() % (kTarget - len);
    const bool sig = i % 50 == 0;
    signaled += sig;
    ASSERT_TRUE(post_retrying(
                    *p.active,
                    [&] { return p.active->post_write(**smr, soff, len, key, doff, i, sig); },
                    &seen)
                    .ok());
    std::memcpy(shadow.data() + doff, src.data() + soff, len);
  }
  // An 8-byte read after the writes: its completion means they are placed.
  ASSERT_TRUE(post_retrying(
                  *p.active, [&] { return p.active->post_read(**bmr, 0, 8, key, 0, 99999); }, &seen)
                  .ok());
  auto rest = wait_for(*p.active, signaled + 1 - seen.size());
  seen.insert(seen.end(), rest.begin(), rest.end());
  ASSERT_EQ(seen.size(), signaled + 1) << "only the signaled writes and the read report";
  for (size_t k = 0; k < seen.size(); ++k) {
    ASSERT_TRUE(seen[k].status.ok()) << seen[k].status.to_string();
    if (k + 1 < seen.size()) {
      EXPECT_EQ(seen[k].opcode, Opcode::kWrite);
      EXPECT_EQ(seen[k].wr_id % 50, 0u);
      if (k > 0) {
        EXPECT_GT(seen[k].wr_id, seen[k - 1].wr_id) << "posting order";
      }
    }
  }
  EXPECT_EQ(seen.back().wr_id, 99999u);
  EXPECT_EQ(std::memcmp(target.data(), shadow.data(), kTarget), 0);

  // Read the whole region back in 64 KiB pieces.
  std::vector<Completion> reads;
  for (size_t off = 0; off < kTarget; off += 64 << 10)
    ASSERT_TRUE(post_retrying(
                    *p.active,
                    [&] { return p.active->post_read(**bmr, off, 64 << 10, key, off, off); },
                    &reads)
                    .ok());
  auto more = wait_for(*p.active, 16 - reads.size());
  reads.insert(reads.end(), more.begin(), more.end());
  ASSERT_EQ(reads.size(), 16u);
  for (auto& r : reads) EXPECT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(std::memcmp(back.data(), shadow.data(), kTarget), 0);
}

TEST_P(TransportContract, SendRecvWithSlotReuseAndBackPressure) {
  ConnectionOptions opt;
  opt.recv_slots = 4;
  opt.message_size = 64;
  opt.max_outstanding = 16;
  auto p = make_pair(opt);
  ASSERT_TRUE(p.active && p.passive);
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
    if (i % 50 == 0) std::this_thread::sleep_for(5ms);  // let the sender meet no slot (RNR)
    ASSERT_TRUE(p.passive->repost_recv(static_cast<uint32_t>(c[0].wr_id)).ok());
  }
  sender.join();
  EXPECT_EQ(slots_seen, (std::set<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.passive->repost_recv(0).code(), Errc::kInvalidArgument);  // already posted
  EXPECT_EQ(p.passive->repost_recv(9).code(), Errc::kInvalidArgument);
  std::string big(65, 'x');
  EXPECT_EQ(p.active->post_send(bytes_of(big), 1).code(), Errc::kInvalidArgument);
}

TEST_P(TransportContract, SymmetricPassiveSideWritesIntoActive) {
  std::vector<std::byte> mem(4096), src(4096, std::byte{0x5a});
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  auto amr = p.active->register_memory(mem.data(), mem.size(), kRemoteWrite);
  auto smr = p.passive->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(amr.ok() && smr.ok());
  ASSERT_TRUE(p.passive->post_write(**smr, 0, 4096, (*amr)->remote_key(), 0, 5, true).ok());
  auto c = wait_for(*p.passive, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status.to_string();
  ASSERT_TRUE(p.passive->post_send(bytes_of("done"), 6).ok());  // ordered after the write
  ASSERT_EQ(wait_for(*p.active, 1).size(), 1u);
  EXPECT_EQ(0, std::memcmp(mem.data(), src.data(), 4096));
}

TEST_P(TransportContract, DeregisteredMemoryIsNoLongerReachable) {
  std::vector<std::byte> mem(4096, std::byte{0}), src(4096, std::byte{1});
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  auto rmr = p.passive->register_memory(mem.data(), mem.size(), kRemoteWrite);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && smr.ok());
  RemoteKey key = (*rmr)->remote_key();
  rmr->reset();
  ASSERT_TRUE(p.active->post_write(**smr, 0, 100, key, 0, 1, true).ok());
  auto c = drain_until_closed(*p.active);
  // (tcp completes a Write when sent: its refusal may follow as an extra
  // completion with the same wr_id.)
  auto refused = std::find_if(c.begin(), c.end(), [](const Completion& x) {
    return x.wr_id == 1 && x.opcode == Opcode::kWrite && !x.status.ok();
  });
  ASSERT_NE(refused, c.end());
  EXPECT_EQ(refused->status.code(), harness().traits().remote_access_error)
      << refused->status.to_string();
  for (auto b : mem) ASSERT_EQ(b, std::byte{0});
}

// What a target does to the old primary's session when it is fenced
// (docs/failover.md): the registration is destroyed, then the connection
// shut down. A Write and a Read the old primary posts afterwards fail, and
// the memory keeps the bytes it had.
TEST_P(TransportContract, AFencedPeersWritesFailAndLandNowhere) {
  std::vector<std::byte> mem(4096, std::byte{7}), src(4096, std::byte{1});
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  auto rmr = p.passive->register_memory(mem.data(), mem.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && smr.ok());
  RemoteKey key = (*rmr)->remote_key();
  // Before the fence the Write lands (the key is good).
  ASSERT_TRUE(p.active->post_write(**smr, 0, 16, key, 0, 1, true).ok());
  ASSERT_TRUE(p.active->post_read(**smr, 2048, 8, key, 0, 2).ok());
  auto before = wait_for(*p.active, 2);
  ASSERT_EQ(before.size(), 2u);
  ASSERT_TRUE(before[1].status.ok()) << before[1].status.to_string();
  ASSERT_EQ(mem[0], std::byte{1});
  std::fill(mem.begin(), mem.end(), std::byte{7});

  rmr->reset();
  p.passive->shutdown();
  std::fill(src.begin(), src.end(), std::byte{2});
  // The post itself may already be refused (the connection is known
  // closed); if it is taken, its completion fails.
  Status write = p.active->post_write(**smr, 0, 4096, key, 0, 3, true);
  if (write.ok()) (void)p.active->post_read(**smr, 0, 8, key, 0, 4);
  if (write.ok()) {
    auto c = drain_until_closed(*p.active);
    for (const Completion& x : c) {
      if (x.wr_id == 4) {
        EXPECT_FALSE(x.status.ok()) << "the flush of a fenced peer completed";
      }
    }
  }
  for (auto b : mem) ASSERT_EQ(b, std::byte{7}) << "a fenced peer's Write landed";
}

TEST_P(TransportContract, RkeyOfAnotherConnectionIsRefused) {
  auto l = harness().listen({});
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto [c1, s1] = connect_pair(**l);
  auto [c2, s2] = connect_pair(**l);
  ASSERT_TRUE(c1 && s1 && c2 && s2);
  std::vector<std::byte> mem(4096, std::byte{0}), src(4096, std::byte{9});
  auto mr1 = s1->register_memory(mem.data(), mem.size(), kRemoteWrite | kRemoteRead);
  auto smr2 = c2->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(mr1.ok() && smr2.ok());
  // s1's key used on c2 (whose peer is s2): unknown there.
  ASSERT_TRUE(c2->post_write(**smr2, 0, 16, (*mr1)->remote_key(), 0, 2, false).ok());
  auto c = drain_until_closed(*c2);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0].wr_id, 2u);
  EXPECT_EQ(c[0].status.code(), harness().traits().remote_access_error) << c[0].status.to_string();
  for (auto b : mem) ASSERT_EQ(b, std::byte{0});
  // c1 is unaffected.
  auto smr1 = c1->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(smr1.ok());
  ASSERT_TRUE(c1->post_write(**smr1, 0, 16, (*mr1)->remote_key(), 0, 3, true).ok());
  ASSERT_TRUE(c1->post_read(**smr1, 100, 16, (*mr1)->remote_key(), 0, 4).ok());
  auto ok = wait_for(*c1, 2);
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_TRUE(ok[0].status.ok()) << ok[0].status.to_string();
  EXPECT_TRUE(ok[1].status.ok()) << ok[1].status.to_string();
  EXPECT_EQ(mem[0], std::byte{9});
}

TEST_P(TransportContract, PeerShutdownFailsOutstandingOpsAndPostsReturnClosed) {
  const Traits traits = harness().traits();
  ConnectionOptions opt;
  opt.recv_slots = 1;
  std::vector<std::byte> local(4096), remote(4096);
  auto p = make_pair(opt);
  ASSERT_TRUE(p.active && p.passive);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteRead);
  ASSERT_TRUE(lmr.ok() && rmr.ok());
  RemoteKey key = (*rmr)->remote_key();
  // The first send fills the only slot; the second finds none (RNR: nobody
  // reposts), so the reads behind it stay outstanding.
  ASSERT_TRUE(p.active->post_send(bytes_of("one"), 1).ok());
  ASSERT_TRUE(p.active->post_send(bytes_of("two"), 2).ok());
  for (uint64_t i = 0; i < 5; ++i)
    ASSERT_TRUE(p.active->post_read(**lmr, 0, 64, key, 0, 10 + i).ok());
  const size_t sends_done = traits.send_completes_before_delivery ? 2 : 1;
  auto sends = wait_for(*p.active, sends_done);
  ASSERT_EQ(sends.size(), sends_done);
  EXPECT_EQ(sends[0].wr_id, 1u);
  for (auto& s : sends) EXPECT_TRUE(s.status.ok()) << s.status.to_string();
  Completion none[1];
  auto r = p.active->poll(none, 200ms);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u) << "work behind a send the peer has no slot for completed";

  p.passive->shutdown();
  p.passive->shutdown();  // idempotent

  Status closed;
  auto c = drain_until_closed(*p.active, &closed);
  std::vector<uint64_t> failed;
  for (auto& x : c) {
    EXPECT_EQ(x.status.code(), Errc::kConnectionError) << x.status.to_string();
    if (x.opcode != Opcode::kRecv) failed.push_back(x.wr_id);
    if (x.opcode == Opcode::kRead && traits.flushes_say_the_peer_closed) {
      EXPECT_NE(x.status.message().find(p.active->peer_address()), std::string::npos)
          << x.status.message();
      EXPECT_NE(x.status.message().find("closed the connection"), std::string::npos)
          << x.status.message();
    }
  }
  const std::vector<uint64_t> expected_failed = sends_done == 2
                                                    ? std::vector<uint64_t>{10, 11, 12, 13, 14}
                                                    : std::vector<uint64_t>{2, 10, 11, 12, 13, 14};
  EXPECT_EQ(failed, expected_failed);
  EXPECT_EQ(closed.code(), Errc::kClosed);
  EXPECT_EQ(p.active->post_read(**lmr, 0, 64, key, 0, 99).code(), Errc::kClosed);
  EXPECT_EQ(p.active->post_send(bytes_of("x"), 100).code(), Errc::kClosed);
  EXPECT_EQ(p.active->poll(none, 10ms).status().code(), Errc::kClosed);

  // The side that shut down: the delivered message (its only slot, not
  // reposted, so no flushed one), then kClosed.
  Status pclosed;
  auto pc = drain_until_closed(*p.passive, &pclosed);
  ASSERT_EQ(pc.size(), 1u);
  EXPECT_TRUE(pc[0].status.ok()) << pc[0].status.to_string();
  EXPECT_EQ(pclosed.code(), Errc::kClosed);
}

TEST_P(TransportContract, ShutdownWithNothingPendingAndDestroyOrder) {
  std::vector<std::byte> mem(4096);
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  auto mr = p.active->register_memory(mem.data(), mem.size(), kRemoteWrite);
  ASSERT_TRUE(mr.ok());
  p.active->shutdown();
  Status closed;
  auto c = drain_until_closed(*p.active, &closed);
  EXPECT_EQ(c.size(), ConnectionOptions{}.recv_slots);  // the flushed receive slots
  for (auto& x : c) EXPECT_EQ(x.status.code(), Errc::kClosed) << x.status.to_string();
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

TEST_P(TransportContract, DestroyedPeerIsNoticedWithNothingPending) {
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  p.active.reset();  // the destructor disconnects
  Status closed;
  auto c = drain_until_closed(*p.passive, &closed);
  ASSERT_FALSE(c.empty()) << "the flushed receive slots report the break";
  EXPECT_EQ(c.size(), ConnectionOptions{}.recv_slots);
  EXPECT_EQ(c[0].status.code(), Errc::kConnectionError);
  EXPECT_NE(c[0].status.message().find("closed the connection"), std::string::npos)
      << c[0].status.message();
  EXPECT_EQ(closed.code(), Errc::kClosed);
}

TEST_P(TransportContract, RegionOutlivesItsConnection) {
  std::vector<std::byte> mem(4096);
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  auto mr = p.passive->register_memory(mem.data(), mem.size(), kRemoteWrite);
  ASSERT_TRUE(mr.ok());
  const RemoteKey key = (*mr)->remote_key();
  p.passive.reset();
  mr->reset();  // deregisters after its connection is gone
  // The peer's key reaches nothing any more.
  std::vector<std::byte> src(16, std::byte{1});
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(smr.ok());
  Status posted = p.active->post_write(**smr, 0, 16, key, 0, 1, true);
  if (!posted.ok()) {
    EXPECT_EQ(posted.code(), Errc::kClosed) << posted.to_string();
  }
  Status closed;
  drain_until_closed(*p.active, &closed);  // the peer is gone: the connection ends
  EXPECT_EQ(closed.code(), Errc::kClosed);
  for (auto b : mem) ASSERT_EQ(b, std::byte{0});
}

TEST_P(TransportContract, ResourceExhaustedBeyondMaxOutstanding) {
  ConnectionOptions opt;
  opt.max_outstanding = 8;
  auto p = make_pair(opt);
  ASSERT_TRUE(p.active && p.passive);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(p.active->post_send(bytes_of("m"), i).ok());
  Status s = p.active->post_send(bytes_of("m"), 8);
  EXPECT_EQ(s.code(), Errc::kResourceExhausted);
  EXPECT_NE(s.message().find("max_outstanding 8"), std::string::npos) << s.message();
  auto c = wait_for(*p.active, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 0u);
  EXPECT_EQ(c[1].wr_id, 1u);
  EXPECT_TRUE(p.active->post_send(bytes_of("m"), 9).ok());
  EXPECT_TRUE(p.active->post_send(bytes_of("m"), 10).ok());
  EXPECT_EQ(p.active->post_send(bytes_of("m"), 11).code(), Errc::kResourceExhausted);
}

TEST_P(TransportContract, LocalArgumentChecks) {
  std::vector<std::byte> mem(4096);
  auto p = make_pair();
  auto q = make_pair();
  ASSERT_TRUE(p.active && p.passive && q.active && q.passive);
  auto mr = p.active->register_memory(mem.data(), mem.size(), kLocalOnly);
  auto foreign = q.active->register_memory(mem.data(), mem.size(), kLocalOnly);
  auto other_end = p.passive->register_memory(mem.data(), mem.size(), kLocalOnly);
  ASSERT_TRUE(mr.ok() && foreign.ok() && other_end.ok());
  RemoteKey key = (*mr)->remote_key();
  EXPECT_EQ(p.active->post_write(**mr, 4000, 200, key, 0, 1, true).code(), Errc::kInvalidArgument)
      << "past the end of the local region";
  EXPECT_EQ(p.active->post_write(**foreign, 0, 1, key, 0, 1, true).code(), Errc::kInvalidArgument)
      << "a region of another connection";
  EXPECT_EQ(p.active->post_write(**other_end, 0, 1, key, 0, 1, true).code(), Errc::kInvalidArgument)
      << "a region of the other end";
  EXPECT_EQ(p.active->register_memory(nullptr, 10, kRemoteRead).status().code(),
            Errc::kInvalidArgument);
  EXPECT_EQ(p.active->register_memory(mem.data(), 10, 0x80).status().code(),
            Errc::kInvalidArgument);
  EXPECT_EQ(p.active->repost_recv(1000).code(), Errc::kInvalidArgument);
}

TEST_P(TransportContract, ConnectWithoutListenerIsRefused) {
  Endpoint gone;
  {
    auto l = harness().listen({});
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    gone = harness().endpoint(**l);
  }
  auto c = harness().connect(gone, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Errc::kConnectionError) << c.status().to_string();
  EXPECT_NE(c.status().message().find(harness().active_peer(gone)), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find(harness().traits().refused_text), std::string::npos)
      << c.status().message();
}

TEST_P(TransportContract, MessageSizeMismatchRefusedListenerStaysUsable) {
  const Traits traits = harness().traits();
  ConnectionOptions a, b;
  b.message_size = 8192;
  auto l = harness().listen(a);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  Result<std::unique_ptr<Connection>> accepted(Errc::kInternal, "not run");
  std::thread t(
      [&] { accepted = (*l)->accept(traits.accept_reports_refused_peers ? 10s : 100ms); });
  auto c = harness().connect(harness().endpoint(**l), b);
  t.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Errc::kConfigError) << c.status().to_string();
  EXPECT_NE(c.status().message().find("message_size mismatch"), std::string::npos)
      << c.status().message();
  if (traits.accept_reports_refused_peers) {
    ASSERT_FALSE(accepted.ok());
    EXPECT_EQ(accepted.status().code(), Errc::kConfigError) << accepted.status().to_string();
  } else {
    ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
    EXPECT_EQ(*accepted, nullptr);
  }
  auto [active, passive] = connect_pair(**l, a);
  EXPECT_TRUE(active && passive) << "the listener stays usable";
}

TEST_P(TransportContract, AcceptTimeoutReturnsNullAndShutdownWakesAccept) {
  auto l = harness().listen({});
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  const auto t0 = Clock::now();
  auto c = (*l)->accept(50ms);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c, nullptr);
  EXPECT_GE(Clock::now() - t0, 45ms) << "accept returned before its timeout";
  std::thread waker([&] {
    std::this_thread::sleep_for(50ms);
    (*l)->shutdown();
  });
  auto c2 = (*l)->accept(20s);
  waker.join();
  EXPECT_EQ(c2.status().code(), Errc::kClosed) << c2.status().to_string();
  (*l)->shutdown();  // idempotent
}

// ---------------------------------------------------------- RemoteAccess

std::string violation_name(Violation v) {
  switch (v) {
    case Violation::kOutOfBounds:
      return "OutOfBounds";
    case Violation::kBeforeStart:
      return "BeforeStart";
    case Violation::kWrongRkey:
      return "WrongRkey";
    case Violation::kNoWriteAccess:
      return "NoWriteAccess";
    case Violation::kNoReadAccess:
      return "NoReadAccess";
    case Violation::kReadOutOfBounds:
      return "ReadOutOfBounds";
  }
  return "Unknown";
}

void PrintTo(Violation v, std::ostream* os) { *os << violation_name(v); }

std::vector<std::tuple<TransportUnderTest, Violation>> every_violation(
    const TransportUnderTest& transport) {
  std::vector<std::tuple<TransportUnderTest, Violation>> all;
  for (Violation v :
       {Violation::kOutOfBounds, Violation::kBeforeStart, Violation::kWrongRkey,
        Violation::kNoWriteAccess, Violation::kNoReadAccess, Violation::kReadOutOfBounds})
    all.emplace_back(transport, v);
  return all;
}

std::string remote_access_name(
    const ::testing::TestParamInfo<std::tuple<TransportUnderTest, Violation>>& info) {
  return std::get<0>(info.param).name + "_" + violation_name(std::get<1>(info.param));
}

TEST_P(RemoteAccess, ErrorCompletionBreaksBothEndsAndNothingOutsideIsTouched) {
  const Traits traits = harness().traits();
  const Violation v = std::get<1>(GetParam());
  constexpr size_t kGuard = 4096, kLen = 8192;
  std::vector<std::byte> mem(kGuard + kLen + kGuard, std::byte{0xAA});
  std::vector<std::byte> src(3 * kLen, std::byte{0x11});
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  uint32_t access = kRemoteWrite | kRemoteRead;
  if (v == Violation::kNoWriteAccess) access = kRemoteRead;
  if (v == Violation::kNoReadAccess) access = kRemoteWrite;
  auto rmr = p.passive->register_memory(mem.data() + kGuard, kLen, access);
  std::vector<std::byte> fine(4096);
  auto fmr = p.passive->register_memory(fine.data(), fine.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && fmr.ok() && smr.ok());
  RemoteKey key = (*rmr)->remote_key(), fine_key = (*fmr)->remote_key();
  // Where the transport can, nothing executes until all three are posted,
  // so that the third is surely flushed rather than refused at its post.
  harness().hold_execution(true);
  // A legitimate write first: it completes fine before the bad one.
  ASSERT_TRUE(p.active->post_write(**smr, 0, 16, fine_key, 0, 1, true).ok());
  Opcode bad_op = Opcode::kWrite;
  RemoteKey bad = key;
  uint64_t off = 0;
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
    case Violation::kReadOutOfBounds:
      bad_op = Opcode::kRead;
      off = kLen - 32;
      break;
  }
  if (bad_op == Opcode::kWrite) {
    ASSERT_TRUE(p.active->post_write(**smr, 0, 512, bad, off, 2, false).ok());
  } else {
    ASSERT_TRUE(p.active->post_read(**smr, 0, 512, bad, off, 2).ok());
  }
  // Posted behind the bad one: flushed (or refused at once if the error
  // already came back).
  Status third = p.active->post_read(**smr, kLen, 64, fine_key, 0, 3);
  if (!third.ok()) {
    EXPECT_EQ(third.code(), Errc::kClosed);
  }
  harness().hold_execution(false);

  Status closed;
  auto c = drain_until_closed(*p.active, &closed);
  EXPECT_EQ(closed.code(), Errc::kClosed);
  ASSERT_GE(c.size(), third.ok() ? 3u : 2u);
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status.to_string();
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(c[1].opcode, bad_op);
  EXPECT_EQ(c[1].status.code(), traits.remote_access_error) << c[1].status.to_string();
  EXPECT_NE(c[1].status.message().find("remote"), std::string::npos) << c[1].status.message();
  if (traits.explains_remote_access_errors) {
    EXPECT_NE(c[1].status.message().find("remote access error"), std::string::npos)
        << c[1].status.message();
    const char* why = v == Violation::kWrongRkey       ? "not registered"
                      : v == Violation::kNoWriteAccess ? "kRemoteWrite"
                      : v == Violation::kNoReadAccess  ? "kRemoteRead"
                                                       : "outside";
    EXPECT_NE(c[1].status.message().find(why), std::string::npos) << c[1].status.message();
  }
  // After it: the third (flushed) and every posted receive slot, in error.
  size_t flushed_slots = 0;
  bool third_flushed = false;
  for (size_t i = 2; i < c.size(); ++i) {
    EXPECT_FALSE(c[i].status.ok());
    if (c[i].opcode == Opcode::kRecv) {
      ++flushed_slots;
    } else {
      EXPECT_EQ(c[i].wr_id, 3u);
      EXPECT_EQ(c[i].status.code(), Errc::kConnectionError) << c[i].status.to_string();
      EXPECT_NE(c[i].status.message().find("flushed"), std::string::npos) << c[i].status.message();
      third_flushed = true;
    }
  }
  EXPECT_EQ(third_flushed, third.ok());
  EXPECT_EQ(flushed_slots, ConnectionOptions{}.recv_slots);
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

// ----------------------------------------------------- ReadFlushContract

// Only transports whose Read calls the passive side's PersistFn instantiate it.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ReadFlushContract);

TEST_P(ReadFlushContract, ReadPersistsExactlyTheWrittenRangesFirst) {
  std::vector<std::byte> remote(1 << 20), other(1 << 16), local(1 << 16);
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  std::mutex mu;
  std::vector<std::pair<uintptr_t, size_t>> calls;
  std::atomic<bool> read_done{false};
  std::atomic<int> calls_after_read{0};
  auto record = [&](const void* a, size_t n) {
    if (read_done) ++calls_after_read;
    std::lock_guard lk(mu);
    calls.emplace_back(reinterpret_cast<uintptr_t>(a), n);
    return Status::Ok();
  };
  auto rmr =
      p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead, record);
  auto omr = p.passive->register_memory(other.data(), other.size(), kRemoteWrite, record);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && omr.ok() && lmr.ok());
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
  {
    std::lock_guard lk(mu);
    EXPECT_TRUE(calls.empty()) << "persisted before any Read";
  }
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

// kPersistEachWrite (placement order, docs/protocol.md "Ordering"): each
// Write is persisted as it lands, before the next operation executes, so a
// later Write is never placed while an earlier one is not yet durable; the
// Read after them has nothing left to persist. A persist that fails fails
// the Write's connection.
TEST_P(ReadFlushContract, APersistEachWriteRegistrationPersistsEveryWriteBeforeTheNext) {
  std::vector<std::byte> remote(1 << 16), local(8192);
  for (size_t i = 0; i < local.size(); ++i) local[i] = std::byte(1 + i % 251);
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  EXPECT_EQ(p.passive
                ->register_memory(remote.data(), remote.size(), kRemoteRead | kPersistEachWrite,
                                  [](const void*, size_t) { return Status::Ok(); })
                .status()
                .code(),
            Errc::kInvalidArgument)
      << "kPersistEachWrite without kRemoteWrite";
  EXPECT_EQ(p.passive
                ->register_memory(remote.data(), remote.size(), kRemoteWrite | kPersistEachWrite)
                .status()
                .code(),
            Errc::kInvalidArgument)
      << "kPersistEachWrite without a persist function";

  std::mutex mu;
  struct Call {
    uintptr_t addr;
    size_t len;
    bool next_placed;  // the following Write's first byte was already there
  };
  std::vector<Call> calls;
  auto base = reinterpret_cast<uintptr_t>(remote.data());
  std::atomic<bool> failing{false};
  // Writes go to 0, 4096, 8192, ...: at the persist of the one at k*4096,
  // the one at (k+1)*4096 must not be placed yet.
  auto record = [&](const void* a, size_t n) {
    auto at = reinterpret_cast<uintptr_t>(a);
    size_t next = at - base + 4096;
    std::lock_guard lk(mu);
    calls.push_back({at, n, next < remote.size() && remote[next] != std::byte{0}});
    if (failing)
      return Status(Errc::kIoError, "volume 'v': persist of a Write failed (test)");
    return Status::Ok();
  };
  auto rmr = p.passive->register_memory(remote.data(), remote.size(),
                                        kRemoteWrite | kRemoteRead | kPersistEachWrite, record);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok()) << rmr.status().to_string();
  ASSERT_TRUE(lmr.ok());
  RemoteKey key = (*rmr)->remote_key();
  harness().hold_execution(true);
  for (uint64_t i = 0; i < 4; ++i)
    ASSERT_TRUE(p.active->post_write(**lmr, i, 100 + i, key, i * 4096, i + 1, false).ok());
  ASSERT_TRUE(p.active->post_read(**lmr, 4096, 8, key, 0, 9).ok());
  harness().hold_execution(false);
  auto c = wait_for(*p.active, 1);
  ASSERT_EQ(c.size(), 1u);
  ASSERT_TRUE(c[0].status.ok()) << c[0].status.to_string();
  {
    std::lock_guard lk(mu);
    ASSERT_EQ(calls.size(), 4u) << "one persist per Write, none more at the Read";
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].addr, base + i * 4096) << i;
      EXPECT_EQ(calls[i].len, 100 + i) << i;
      EXPECT_FALSE(calls[i].next_placed) << "Write " << i + 1 << " was placed before Write " << i
                                         << " was persisted";
    }
  }
  EXPECT_EQ(0, std::memcmp(remote.data() + 3 * 4096, local.data() + 3, 103));

  // A persist that fails refuses its Write: the connection breaks and says why.
  failing = true;
  harness().hold_execution(true);
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 64, key, 5 * 4096, 20, false).ok());
  // The Read may find the connection already broken by the Write's failure
  // (the tcp receiver is not held while the active side posts): then it is
  // refused as closed, and the Write's completion below still says why.
  Status read_posted = p.active->post_read(**lmr, 4096, 8, key, 0, 21);
  EXPECT_TRUE(read_posted.ok() || read_posted.code() == Errc::kClosed ||
              read_posted.code() == Errc::kConnectionError)
      << read_posted.to_string();
  harness().hold_execution(false);
  Status closed;
  c = drain_until_closed(*p.active, &closed);
  ASSERT_GE(c.size(), 1u);
  EXPECT_FALSE(c[0].status.ok());
  EXPECT_NE(c[0].status.message().find("persist of a Write failed (test)"), std::string::npos)
      << c[0].status.to_string();
}

// A write-back error on the passive side: the Read that flushes is refused
// with the PersistFn's message (not answered as if durable), the connection
// breaks, and a later flush cannot succeed either.
TEST_P(ReadFlushContract, AFailedPersistRefusesTheReadThatFlushes) {
  std::vector<std::byte> remote(1 << 16), local(4096, std::byte{7});
  auto p = make_pair();
  ASSERT_TRUE(p.active && p.passive);
  std::atomic<bool> failing{false};
  std::atomic<int> calls{0};
  auto persist = [&](const void*, size_t) {
    ++calls;
    if (!failing) return Status::Ok();
    return Status(Errc::kIoError,
                  "volume 'v' (/data/v.img): msync of [0, +64) failed: "
                  "Input/output error (errno 5); the data may not be durable");
  };
  auto rmr =
      p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead, persist);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && lmr.ok());
  RemoteKey key = (*rmr)->remote_key();
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 64, key, 0, 1, false).ok());
  ASSERT_TRUE(p.active->post_read(**lmr, 1024, 8, key, 0, 2).ok());
  auto c = wait_for(*p.active, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status.to_string();

  failing = true;
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 64, key, 4096, 3, false).ok());
  ASSERT_TRUE(p.active->post_read(**lmr, 1024, 8, key, 4096, 4).ok());
  Status closed;
  c = drain_until_closed(*p.active, &closed);
  ASSERT_GE(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 4u);
  EXPECT_EQ(c[0].opcode, Opcode::kRead);
  EXPECT_EQ(c[0].status.code(), Errc::kIoError) << c[0].status.to_string();
  EXPECT_NE(c[0].status.message().find("volume 'v' (/data/v.img): msync of [0, +64) failed: "
                                       "Input/output error (errno 5)"),
            std::string::npos)
      << c[0].status.message();
  EXPECT_EQ(closed.code(), Errc::kClosed);
  EXPECT_EQ(p.active->post_read(**lmr, 1024, 8, key, 0, 5).code(), Errc::kClosed);
  EXPECT_GE(calls.load(), 2);
}

}  // namespace pmirror::transport::contract
