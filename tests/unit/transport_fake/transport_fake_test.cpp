// The fake fabric: the transport contract (transport_contract.h), plus what
// only the fake does -- deterministic execution, fault injection, crash
// semantics -- and its registration while a test installs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "transport/fake/fake_fabric.h"
#include "transport/fake/fake_transport.h"
#include "transport/transport.h"
#include "transport_contract.h"

namespace pmirror::transport::fake {
namespace {

using namespace std::chrono_literals;
using contract::bytes_of;
using contract::drain_until_closed;
using contract::Endpoint;

// One fabric per case; listeners are named "target", "target-2", ...
class FakeHarness final : public contract::Harness {
 public:
  contract::Traits traits() const override {
    contract::Traits t;
    t.accept_reports_refused_peers = false;  // connect() refuses; nothing reaches accept()
    t.refused_text = "nobody is listening there";
    return t;
  }
  Result<std::unique_ptr<Listener>> listen(const ConnectionOptions& options) override {
    std::string name = listeners_++ == 0 ? "target" : "target-" + std::to_string(listeners_);
    auto l = fabric_->listen(name, options);
    if (l.ok()) names_[l->get()] = name;
    return l;
  }
  Endpoint endpoint(const Listener& listener) const override {
    return {names_.at(&listener), listener.port()};
  }
  Result<std::unique_ptr<Connection>> connect(const Endpoint& to,
                                              const ConnectionOptions& options) override {
    return fabric_->connect(to.host, options);
  }
  std::string active_peer(const Endpoint& to) const override { return "fake:" + to.host; }
  std::string passive_peer_prefix() const override { return "fake:initiator#"; }
  void hold_execution(bool hold) override { fabric_->set_manual(hold); }

 private:
  std::shared_ptr<FakeFabric> fabric_ = FakeFabric::create();
  std::map<const Listener*, std::string> names_;
  int listeners_ = 0;
};

const contract::TransportUnderTest kFake{"fake", [] { return std::make_unique<FakeHarness>(); }};

}  // namespace
}  // namespace pmirror::transport::fake

namespace pmirror::transport::contract {
INSTANTIATE_TEST_SUITE_P(Fake, TransportContract, ::testing::Values(fake::kFake), transport_name);
INSTANTIATE_TEST_SUITE_P(Fake, ReadFlushContract, ::testing::Values(fake::kFake), transport_name);
INSTANTIATE_TEST_SUITE_P(Fake, RemoteAccess, ::testing::ValuesIn(every_violation(fake::kFake)),
                         remote_access_name);
}  // namespace pmirror::transport::contract

namespace pmirror::transport::fake {
namespace {

// A connected pair on a fabric of its own, for the fake's own cases.
struct Pair {
  std::shared_ptr<FakeFabric> fabric;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> active;   // the connect() side, node "initiator"
  std::unique_ptr<Connection> passive;  // the accept() side, node "target"
};

Pair make_pair(const ConnectionOptions& options = {}, const FabricOptions& fo = {}) {
  Pair p;
  p.fabric = FakeFabric::create(fo);
  auto l = p.fabric->listen("target", options);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  p.listener = std::move(*l);
  auto c = p.fabric->connect("target", options);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  p.active = std::move(*c);
  auto a = p.listener->accept(0ms);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  p.passive = std::move(*a);
  EXPECT_NE(p.passive, nullptr);
  return p;
}

// Up to n completions, waiting `each` per poll (0ms: only what is there).
std::vector<Completion> wait_for(Connection& c, size_t n, std::chrono::milliseconds each = 100ms) {
  std::vector<Completion> got;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  Completion buf[16];
  while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
    auto r = c.poll(std::span(buf, std::min<size_t>(16, n - got.size())), each);
    if (!r.ok()) break;
    if (*r == 0 && each == 0ms) break;
    got.insert(got.end(), buf, buf + *r);
  }
  return got;
}

std::vector<std::byte> copy_of(const std::vector<std::byte>& v, size_t off, size_t len) {
  return std::vector<std::byte>(v.begin() + off, v.begin() + off + len);
}

// ------------------------------------------------- execution in order

// The contract's posting order, with every operation queued before any runs.
TEST(FakeTransport, SteppedOperationsCompleteInPostingOrder) {
  auto p = make_pair();
  p.fabric->set_manual(true);
  std::vector<std::byte> remote(1 << 16), local(1 << 16);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key();
  ASSERT_TRUE(p.active->post_read(**lmr, 0, 32768, key, 0, 10).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 40000, 100, key, 0, 11, true).ok());
  ASSERT_TRUE(p.active->post_write(**lmr, 40000, 100, key, 0, 12, false).ok());
  ASSERT_TRUE(p.active->post_send(bytes_of("hi"), 13).ok());
  ASSERT_TRUE(p.active->post_read(**lmr, 50000, 8, key, 0, 14).ok());
  EXPECT_EQ(p.fabric->pending(), 5u);
  EXPECT_EQ(p.fabric->run_until_idle(), 5u);
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
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(
                            p.passive->recv_data(static_cast<uint32_t>(r[0].wr_id), 2).data()),
                        2),
            "hi");
}

TEST(FakeTransport, ReadIsNotOvertakenByALaterOverlappingWrite) {
  auto p = make_pair();
  p.fabric->set_manual(true);
  constexpr size_t kLen = 1 << 16;
  std::vector<std::byte> remote(kLen, std::byte{0xA1}), src(kLen, std::byte{0xB2}), dst(kLen);
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto dmr = p.active->register_memory(dst.data(), dst.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key();
  ASSERT_TRUE(p.active->post_read(**dmr, 0, kLen, key, 0, 1).ok());
  ASSERT_TRUE(p.active->post_write(**smr, 0, kLen, key, 0, 2, true).ok());
  ASSERT_TRUE(p.fabric->step());
  EXPECT_EQ(dst[0], std::byte{0xA1});
  EXPECT_EQ(remote[0], std::byte{0xA1});  // the write has not executed yet
  ASSERT_TRUE(p.fabric->step());
  EXPECT_FALSE(p.fabric->step());
  EXPECT_EQ(remote[kLen - 1], std::byte{0xB2});
  EXPECT_EQ(dst[kLen - 1], std::byte{0xA1});
}

TEST(FakeTransport, SendWithoutSlotWaitsAndHoldsUpLaterOps) {
  ConnectionOptions opt;
  opt.recv_slots = 1;
  auto p = make_pair(opt);
  std::vector<std::byte> remote(4096), local(4096, std::byte{7});
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite);
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  ASSERT_TRUE(p.active->post_send(bytes_of("one"), 1).ok());
  ASSERT_TRUE(p.active->post_send(bytes_of("two"), 2).ok());  // RNR: no slot
  ASSERT_TRUE(p.active->post_write(**lmr, 0, 16, (*rmr)->remote_key(), 0, 3, true).ok());
  EXPECT_EQ(p.fabric->pending(), 2u);
  EXPECT_EQ(remote[0], std::byte{0});  // held up behind the send
  auto c = wait_for(*p.active, 3, 0ms);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 1u);
  auto r = wait_for(*p.passive, 1);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_TRUE(p.passive->repost_recv(0).ok());  // runs the send and the write
  EXPECT_EQ(p.fabric->pending(), 0u);
  EXPECT_EQ(remote[0], std::byte{7});
  c = wait_for(*p.active, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 2u);
  EXPECT_EQ(c[1].wr_id, 3u);
}

// Writes are durable only once a Read on their connection flushed them.
TEST(FakeTransport, RandomWritesBecomeDurableThroughReads) {
  auto p = make_pair();
  constexpr size_t kRemote = 1 << 20;
  std::vector<std::byte> remote(kRemote), model(kRemote), src(1 << 16), dst(8);
  std::mt19937_64 rng(42);
  for (auto& b : src) b = std::byte(rng());
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  auto dmr = p.active->register_memory(dst.data(), dst.size(), kLocalOnly);
  ASSERT_TRUE(rmr.ok() && smr.ok() && dmr.ok());
  for (int i = 0; i < 100; ++i) {
    size_t len = 1 + rng() % src.size();
    size_t off = rng() % (kRemote - len + 1);
    ASSERT_TRUE(p.active->post_write(**smr, 0, len, (*rmr)->remote_key(), off, i, false).ok());
    std::memcpy(model.data() + off, src.data(), len);
  }
  // Unflushed writes: the medium tracks them (trimmed where they overlap).
  EXPECT_GT(p.fabric->undurable_writes(), 0u);
  EXPECT_FALSE(*p.fabric->durable_bytes(**rmr) == model);
  ASSERT_TRUE(p.active->post_read(**dmr, 0, 8, (*rmr)->remote_key(), 0, 1000).ok());
  ASSERT_EQ(wait_for(*p.active, 1).size(), 1u);
  EXPECT_EQ(p.fabric->undurable_writes(), 0u);
  auto durable = p.fabric->durable_bytes(**rmr);
  ASSERT_TRUE(durable.ok());
  EXPECT_TRUE(*durable == model);
  EXPECT_TRUE(remote == model);
}

// Every object keeps the fabric's hub alive: dropping the fabric first is fine.
TEST(FakeTransport, ObjectsOutliveTheirFabric) {
  auto p = make_pair();
  std::vector<std::byte> mem(4096);
  auto mr = p.passive->register_memory(mem.data(), mem.size(), kRemoteWrite);
  ASSERT_TRUE(mr.ok());
  p.fabric.reset();
  ASSERT_TRUE(p.active->post_send(bytes_of("still here"), 1).ok());
  ASSERT_EQ(wait_for(*p.passive, 1).size(), 1u);
  p.active.reset();
  mr->reset();
  p.passive.reset();
  p.listener.reset();
}

TEST(FakeListener, ConnectAcceptShutdownAndErrors) {
  auto fabric = FakeFabric::create();
  auto nobody = fabric->connect("nowhere", {});
  ASSERT_FALSE(nobody.ok());
  EXPECT_EQ(nobody.status().code(), Errc::kConnectionError);
  auto l = fabric->listen("t");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(fabric->listen("t").status().code(), Errc::kAlreadyExists);
  ConnectionOptions big;
  big.message_size = 8192;
  EXPECT_EQ(fabric->connect("t", big).status().code(), Errc::kConfigError);
  auto none = (*l)->accept(20ms);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  // A connection left in the backlog is closed when the listener goes.
  auto orphan = fabric->connect("t", {});
  ASSERT_TRUE(orphan.ok());
  std::thread waker([&] {
    std::this_thread::sleep_for(20ms);
    (*l)->shutdown();
  });
  std::this_thread::sleep_for(50ms);
  waker.join();
  EXPECT_EQ((*l)->accept(1s).status().code(), Errc::kClosed);
  Status closed;
  drain_until_closed(**orphan, &closed);
  EXPECT_EQ(closed.code(), Errc::kClosed);
  l->reset();
  EXPECT_TRUE(fabric->listen("t").ok());  // the name is free again
}

// ------------------------------------------------------ execution & faults

TEST(FakeFabricControl, ManualStepsInPostingOrderAcrossConnections) {
  auto p = make_pair();
  auto c2 = p.fabric->connect("target", {});
  auto s2 = p.listener->accept(0ms);
  ASSERT_TRUE(c2.ok() && s2.ok() && *s2);
  p.fabric->set_manual(true);
  EXPECT_TRUE(p.fabric->manual());
  ASSERT_TRUE(p.active->post_send(bytes_of("a1"), 1).ok());
  ASSERT_TRUE((*c2)->post_send(bytes_of("b1"), 2).ok());
  ASSERT_TRUE(p.active->post_send(bytes_of("a2"), 3).ok());
  EXPECT_EQ(p.fabric->pending(), 3u);
  EXPECT_TRUE(wait_for(*p.passive, 1, 0ms).empty());
  // step(connection) picks that connection's head.
  ASSERT_TRUE(p.fabric->step(**c2));
  EXPECT_FALSE(p.fabric->step(**c2));
  EXPECT_EQ(wait_for(**s2, 1, 0ms).size(), 1u);
  ASSERT_TRUE(p.fabric->step());
  auto r = wait_for(*p.passive, 2, 0ms);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].byte_len, 2u);
  EXPECT_EQ(p.fabric->pending(), 1u);
  p.fabric->set_manual(false);  // runs the rest
  EXPECT_EQ(p.fabric->pending(), 0u);
  EXPECT_EQ(wait_for(*p.passive, 1, 0ms).size(), 1u);
}

TEST(FakeFabricControl, FailAfterAndDropNextBreakAtThatOperation) {
  auto p = make_pair();
  std::vector<std::byte> remote(4096), src(4096, std::byte{3});
  auto rmr = p.passive->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead);
  auto smr = p.active->register_memory(src.data(), src.size(), kLocalOnly);
  RemoteKey key = (*rmr)->remote_key();
  p.fabric->fail_after(*p.active, 2);
  p.fabric->set_manual(true);
  for (uint64_t i = 0; i < 4; ++i)
    ASSERT_TRUE(p.active->post_write(**smr, 0, 8, key, i * 8, i, true).ok());
  p.fabric->run_until_idle();
  auto c = drain_until_closed(*p.active);
  ASSERT_GE(c.size(), 4u);
  EXPECT_TRUE(c[0].status.ok());
  EXPECT_TRUE(c[1].status.ok());
  EXPECT_EQ(c[2].wr_id, 2u);
  EXPECT_EQ(c[2].status.code(), Errc::kConnectionError);
  EXPECT_NE(c[2].status.message().find("retry counter exceeded"), std::string::npos);
  EXPECT_NE(c[3].status.message().find("flushed"), std::string::npos);
  EXPECT_EQ(remote[15], std::byte{3});
  EXPECT_EQ(remote[16], std::byte{0});  // the dropped write never landed
  EXPECT_EQ(remote[24], std::byte{0});

  auto q = make_pair();
  q.fabric->drop_next(*q.active);
  ASSERT_TRUE(q.active->post_send(bytes_of("lost"), 7).ok());
  auto qc = drain_until_closed(*q.active);
  ASSERT_FALSE(qc.empty());
  EXPECT_EQ(qc[0].wr_id, 7u);
  EXPECT_FALSE(qc[0].status.ok());
  auto qp = drain_until_closed(*q.passive);
  for (auto& x : qp) EXPECT_FALSE(x.status.ok());  // nothing delivered
}

TEST(FakeFabricControl, BreakConnectionFlushesBothEnds) {
  auto p = make_pair();
  p.fabric->set_manual(true);
  ASSERT_TRUE(p.active->post_send(bytes_of("x"), 1).ok());
  p.fabric->break_connection(*p.active);
  Status closed;
  auto c = drain_until_closed(*p.active, &closed);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status.code(), Errc::kConnectionError);
  EXPECT_NE(c[0].status.message().find("link failure"), std::string::npos);
  EXPECT_EQ(closed.code(), Errc::kClosed);
  auto pc = drain_until_closed(*p.passive, &closed);
  EXPECT_EQ(pc.size(), ConnectionOptions{}.recv_slots);
  EXPECT_EQ(p.fabric->pending(), 0u);
}

// ---------------------------------------------------------------- crashes

struct Mirror {
  Pair p;
  std::vector<std::byte> remote, local;
  std::unique_ptr<MemoryRegion> rmr, lmr, flush;
  std::vector<std::byte> flush_buf = std::vector<std::byte>(64);
  RemoteKey key;

  explicit Mirror(size_t size, PersistFn persist = {}, const FabricOptions& fo = {})
      : p(make_pair({}, fo)), remote(size, std::byte{0}), local(size) {
    rmr = p.passive
              ->register_memory(remote.data(), remote.size(), kRemoteWrite | kRemoteRead,
                                std::move(persist))
              .value();
    lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly).value();
    flush = p.active->register_memory(flush_buf.data(), flush_buf.size(), kLocalOnly).value();
    key = rmr->remote_key();
  }
  void write(size_t off, size_t len, std::byte value, uint64_t id = 0) {
    std::fill_n(local.begin() + off, len, value);
    ASSERT_TRUE(p.active->post_write(*lmr, off, len, key, off, id, false).ok());
  }
  void read(uint64_t id = 0) { ASSERT_TRUE(p.active->post_read(*flush, 0, 8, key, 0, id).ok()); }
  std::vector<std::byte> durable() { return *p.fabric->durable_bytes(*rmr); }
};

TEST(FakeCrash, WritesBeforeAReadSurviveLaterOnesAreDropped) {
  Mirror m(4096);
  m.write(0, 100, std::byte{1});
  m.write(200, 100, std::byte{2});
  m.read();
  m.write(50, 100, std::byte{3});  // overlaps the first, after the read
  m.write(1000, 8, std::byte{4});
  EXPECT_EQ(m.remote[60], std::byte{3});  // visible at once
  EXPECT_EQ(m.p.fabric->undurable_writes(), 2u);
  m.p.fabric->crash("target");
  EXPECT_EQ(m.remote[0], std::byte{1});
  EXPECT_EQ(m.remote[60], std::byte{1});
  EXPECT_EQ(m.remote[120], std::byte{0});
  EXPECT_EQ(m.remote[250], std::byte{2});
  EXPECT_EQ(m.remote[1000], std::byte{0});
  EXPECT_TRUE(m.durable() == m.remote);
  EXPECT_EQ(m.p.fabric->undurable_writes(), 0u);
  // The crash broke the connection: both ends see it.
  Status closed;
  drain_until_closed(*m.p.active, &closed);
  EXPECT_EQ(closed.code(), Errc::kClosed);
  auto pc = drain_until_closed(*m.p.passive);
  ASSERT_FALSE(pc.empty());
  EXPECT_NE(pc[0].status.message().find("crashed"), std::string::npos);
}

// With native persistence (FabricOptions::native_persistence, 6.12's rxe
// in the fake): a FLUSH makes exactly its range durable -- not the other
// Writes before it, unlike a Read -- calling the registration's PersistFn
// on it; an ATOMIC WRITE places its word, durable once flushed; a FLUSH the
// registration does not allow fails and breaks the connection. Without it,
// both are refused before anything is posted.
TEST(FakeCrash, NativeFlushMakesItsRangeDurableAndNothingElse) {
  FabricOptions fo;
  fo.native_persistence = true;
  fo.read_flushes = false;
  auto p = make_pair({}, fo);
  ASSERT_TRUE(p.active->fabric_persistence().can_post_flush);
  std::vector<std::byte> remote(4096, std::byte{0}), local(4096, std::byte{7});
  std::vector<std::pair<const void*, size_t>> persisted;
  auto rmr = p.passive->register_memory(
      remote.data(), remote.size(), kRemoteWrite | kRemoteFlush | kRemoteAtomicWrite,
      [&](const void* addr, size_t len) {
        persisted.emplace_back(addr, len);
        return Status::Ok();
      });
  ASSERT_TRUE(rmr.ok()) << rmr.status().to_string();
  auto lmr = p.active->register_memory(local.data(), local.size(), kLocalOnly);
  ASSERT_TRUE(lmr.ok());
  const RemoteKey key = (*rmr)->remote_key();
  const WorkRequest list[] = {
      WorkRequest::write(**lmr, 0, 64, key, 0, 1, false),
      WorkRequest::write(**lmr, 0, 64, key, 1024, 2, false),
      WorkRequest::flush(key, 0, 64, 3),
      WorkRequest::atomic_write(key, 2048, 0x0102030405060708, 4, true),
  };
  auto posted = p.active->post_list(list);
  ASSERT_TRUE(posted.ok()) << posted.status().to_string();
  ASSERT_EQ(*posted, 4u);
  auto c = wait_for(*p.active, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].opcode, Opcode::kFlush);
  EXPECT_EQ(c[1].opcode, Opcode::kAtomicWrite);
  ASSERT_EQ(persisted.size(), 1u);
  EXPECT_EQ(persisted[0].first, remote.data());
  EXPECT_EQ(persisted[0].second, 64u);
  uint64_t word = 0;
  std::memcpy(&word, remote.data() + 2048, 8);
  EXPECT_EQ(word, 0x0102030405060708u);
  p.fabric->crash("target");
  EXPECT_EQ(remote[0], std::byte{7}) << "the flushed Write survives";
  EXPECT_EQ(remote[1024], std::byte{0}) << "the Write no FLUSH covered is dropped";
  EXPECT_EQ(remote[2048], std::byte{0}) << "the word no FLUSH covered is dropped";

  // A registration without kRemoteFlush: the FLUSH fails, the pair breaks.
  auto q = make_pair({}, fo);
  std::vector<std::byte> plain(4096);
  auto pmr = q.passive->register_memory(plain.data(), plain.size(), kRemoteWrite);
  ASSERT_TRUE(pmr.ok());
  const WorkRequest flush = WorkRequest::flush((*pmr)->remote_key(), 0, 64, 9);
  ASSERT_TRUE(q.active->post_list({&flush, 1}).ok());
  auto refused = wait_for(*q.active, 1);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].status.code(), Errc::kPermissionDenied) << refused[0].status.to_string();

  // A fabric without them: refused up front.
  auto r = make_pair();
  EXPECT_FALSE(r.active->fabric_persistence().can_post_flush);
  EXPECT_EQ(r.passive->register_memory(plain.data(), plain.size(), kRemoteWrite | kRemoteFlush)
                .status()
                .code(),
            Errc::kUnsupported);
  auto rmr2 = r.passive->register_memory(plain.data(), plain.size(), kRemoteWrite);
  ASSERT_TRUE(rmr2.ok());
  const WorkRequest no = WorkRequest::flush((*rmr2)->remote_key(), 0, 64, 10);
  EXPECT_EQ(r.active->post_list({&no, 1}).status().code(), Errc::kUnsupported);
}

TEST(FakeCrash, ARegistrationCrashRollsBackOnlyItsMedium) {
  Mirror m(4096);
  std::vector<std::byte> other(4096);
  auto omr = m.p.passive->register_memory(other.data(), other.size(), kRemoteWrite);
  m.write(0, 8, std::byte{1});
  ASSERT_TRUE(m.p.active->post_write(*m.lmr, 0, 8, (*omr)->remote_key(), 0, 0, false).ok());
  m.p.fabric->crash(*m.rmr);
  EXPECT_EQ(m.remote[0], std::byte{0});
  EXPECT_EQ(other[0], std::byte{1});  // another medium: untouched by this crash
  EXPECT_EQ(m.p.active->post_send(bytes_of("x"), 1).code(), Errc::kClosed);
}

TEST(FakeCrash, OwnerPersistCoversWritesWithoutARead) {
  std::vector<std::pair<const void*, size_t>> calls;
  FabricOptions fo;
  fo.read_flushes = false;  // GPSPM only: a Read flushes nothing
  Mirror m(
      4096,
      [&](const void* a, size_t n) {
        calls.emplace_back(a, n);
        return Status::Ok();
      },
      fo);
  m.write(0, 64, std::byte{1});
  m.write(128, 64, std::byte{2});
  m.write(512, 64, std::byte{3});
  m.read();
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(m.p.fabric->undurable_writes(), 3u);
  ASSERT_TRUE(m.p.fabric->persist(m.remote.data(), 64).ok());  // the target's PersistRequest
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(static_cast<const void*>(m.remote.data()), size_t{64}));
  bool real_called = false;
  PersistFn wrapped = m.p.fabric->tracking_persist_fn([&](const void*, size_t) {
    real_called = true;
    return Status::Ok();
  });
  ASSERT_TRUE(wrapped(m.remote.data() + 128, 64).ok());
  EXPECT_TRUE(real_called);
  EXPECT_EQ(calls.size(), 1u);  // the wrapper calls only its own real function
  m.p.fabric->crash("target");
  EXPECT_EQ(m.remote[0], std::byte{1});
  EXPECT_EQ(m.remote[130], std::byte{2});
  EXPECT_EQ(m.remote[512], std::byte{0});
  // Owner stores are tracked the same way: persisted or lost.
  m.remote[3000] = std::byte{9};
  m.remote[3001] = std::byte{9};
  ASSERT_TRUE(m.p.fabric->persist(m.remote.data() + 3000, 1).ok());
  m.p.fabric->crash("target");
  EXPECT_EQ(m.remote[3000], std::byte{9});
  EXPECT_EQ(m.remote[3001], std::byte{0});
}

TEST(FakeCrash, InitiatorCrashKeepsPlacedWritesUntilTheTargetCrashes) {
  Mirror m(4096);
  m.write(0, 8, std::byte{1});
  m.read();
  m.write(8, 8, std::byte{2});
  m.p.fabric->crash("initiator");
  EXPECT_EQ(m.remote[8], std::byte{2});  // placed, still visible on the target
  EXPECT_EQ(m.p.active->post_send(bytes_of("x"), 1).code(), Errc::kClosed);
  m.p.fabric->crash("target");
  EXPECT_EQ(m.remote[0], std::byte{1});
  EXPECT_EQ(m.remote[8], std::byte{0});
}

TEST(FakeCrash, TrackedMemoryOutlivesSessions) {
  auto fabric = FakeFabric::create();
  auto l = fabric->listen("target");
  ASSERT_TRUE(l.ok());
  std::vector<std::byte> pmem(8192, std::byte{0}), src(8192, std::byte{5}), fl(8);
  ASSERT_TRUE(fabric->track("target", pmem.data(), pmem.size()).ok());
  for (int session = 0; session < 2; ++session) {
    auto c = fabric->connect("target", {});
    auto s = (*l)->accept(0ms);
    ASSERT_TRUE(c.ok() && s.ok() && *s);
    auto rmr =
        (*s)->register_memory(pmem.data() + 4096 * session, 4096, kRemoteWrite | kRemoteRead);
    auto smr = (*c)->register_memory(src.data(), src.size(), kLocalOnly);
    auto fmr = (*c)->register_memory(fl.data(), fl.size(), kLocalOnly);
    RemoteKey key = (*rmr)->remote_key();
    ASSERT_TRUE((*c)->post_write(**smr, 0, 100, key, 0, 1, false).ok());
    if (session == 0) {
      ASSERT_TRUE((*c)->post_read(**fmr, 0, 8, key, 0, 2).ok());
    }
    ASSERT_TRUE((*c)->post_write(**smr, 0, 8, key, 1000, 3, false).ok());
  }  // sessions end; the medium stays
  EXPECT_EQ(fabric->undurable_writes(), 3u);
  fabric->crash("target");
  EXPECT_EQ(pmem[0], std::byte{5});
  EXPECT_EQ(pmem[1000], std::byte{0});
  EXPECT_EQ(pmem[4096], std::byte{0});
  auto d = fabric->durable_bytes(pmem.data(), pmem.size());
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(*d == pmem);
  fabric->untrack(pmem.data());
  EXPECT_EQ(fabric->durable_bytes(pmem.data(), 8).status().code(), Errc::kNotFound);
}

// Persist i: Write record i (64 bytes at 64 + 64 i), Write the header word
// (u64 i + 1 at 0), Read 8 bytes -- three operations. The fabric runs k of
// them, the initiator reaps what completed, then the target crashes.
// Whatever k: every acknowledged persist is durable and nothing after the
// first unacknowledged one survives (the prefix property); with torn writes
// the one persist in flight may survive in part, word by word.
constexpr size_t kPersists = 12;

void run_prefix_case(size_t k, const CrashOptions& crash) {
  SCOPED_TRACE("crash after " + std::to_string(k) + " operations");
  Mirror m(64 + 64 * kPersists);
  m.p.fabric->set_manual(true);
  std::vector<std::byte> headers(8 * kPersists);
  auto hmr = m.p.active->register_memory(headers.data(), headers.size(), kLocalOnly);
  for (size_t i = 0; i < kPersists; ++i) {
    std::fill_n(m.local.begin() + 64 + 64 * i, 64, std::byte(0x10 + i));
    uint64_t h = i + 1;
    std::memcpy(headers.data() + 8 * i, &h, 8);
    ASSERT_TRUE(m.p.active->post_write(*m.lmr, 64 + 64 * i, 64, m.key, 64 + 64 * i, 0, false).ok());
    ASSERT_TRUE(m.p.active->post_write(**hmr, 8 * i, 8, m.key, 0, 0, false).ok());
    ASSERT_TRUE(m.p.active->post_read(*m.flush, 0, 8, m.key, 0, 100 + i).ok());
  }
  for (size_t s = 0; s < k; ++s) ASSERT_TRUE(m.p.fabric->step());
  size_t acked = 0;
  for (auto& c : wait_for(*m.p.active, kPersists, 0ms)) {
    ASSERT_TRUE(c.status.ok());
    ASSERT_EQ(c.wr_id, 100 + acked);  // in order
    ++acked;
  }
  EXPECT_EQ(acked, k / 3);
  m.p.fabric->crash("target", crash);
  auto d = m.durable();
  EXPECT_TRUE(d == m.remote);
  uint64_t header;
  std::memcpy(&header, d.data(), 8);
  EXPECT_GE(header, acked);
  EXPECT_LE(header, acked + 1);
  if (!crash.tear) {
    EXPECT_EQ(header, acked);  // the unflushed persist is dropped whole
  }
  for (size_t i = 0; i < kPersists; ++i) {
    auto rec = copy_of(d, 64 + 64 * i, 64);
    auto all = [&](size_t from, size_t n, std::byte v) {
      return std::all_of(rec.begin() + from, rec.begin() + from + n,
                         [&](std::byte b) { return b == v; });
    };
    if (i < acked) {
      EXPECT_TRUE(all(0, 64, std::byte(0x10 + i))) << "acknowledged persist " << i << " lost";
    } else if (i == acked && crash.tear) {
      for (size_t w = 0; w < 64; w += 8)  // each word old or new, never mixed
        EXPECT_TRUE(all(w, 8, std::byte{0}) || all(w, 8, std::byte(0x10 + i)))
            << "persist " << i << " word " << w;
    } else {
      EXPECT_TRUE(all(0, 64, std::byte{0})) << "persist " << i << " survived without its flush";
    }
  }
}

TEST(FakeCrash, PrefixPropertyAtEveryStep) {
  for (size_t k = 0; k <= 3 * kPersists; ++k) run_prefix_case(k, {});
}

TEST(FakeCrash, PrefixPropertyAtEveryStepWithTornWrites) {
  for (uint64_t seed = 1; seed <= 4; ++seed)
    for (size_t k = 0; k <= 3 * kPersists; ++k) run_prefix_case(k, CrashOptions{true, seed});
}

TEST(FakeCrash, TornWritesKeepSomeWordsAndDropOthers) {
  bool saw_partial = false;
  for (uint64_t seed = 1; seed <= 8 && !saw_partial; ++seed) {
    Mirror m(4096);
    m.write(0, 4096, std::byte{0xEE});
    m.p.fabric->crash("target", CrashOptions{true, seed});
    size_t kept = 0;
    for (size_t w = 0; w < 4096; w += 8) {
      bool all_new = std::all_of(m.remote.begin() + w, m.remote.begin() + w + 8,
                                 [](std::byte b) { return b == std::byte{0xEE}; });
      bool all_old = std::all_of(m.remote.begin() + w, m.remote.begin() + w + 8,
                                 [](std::byte b) { return b == std::byte{0}; });
      ASSERT_TRUE(all_new || all_old) << "word " << w << " is torn inside";
      kept += all_new;
    }
    EXPECT_TRUE(m.durable() == m.remote);
    saw_partial = kept > 0 && kept < 512;
  }
  EXPECT_TRUE(saw_partial);
  // Deterministic: the same seed tears the same way.
  std::vector<std::byte> first;
  for (int run = 0; run < 2; ++run) {
    Mirror m(4096);
    m.write(0, 4096, std::byte{0xEE});
    m.p.fabric->crash("target", CrashOptions{true, 77});
    if (run == 0)
      first = m.remote;
    else
      EXPECT_TRUE(first == m.remote);
  }
}

TEST(FakeCrash, CrashAllDropsEverythingUnflushedEverywhere) {
  Mirror m(4096);
  std::vector<std::byte> back(4096), src(16, std::byte{6});
  auto amr = m.p.active->register_memory(back.data(), back.size(), kRemoteWrite);
  auto smr = m.p.passive->register_memory(src.data(), src.size(), kLocalOnly);
  ASSERT_TRUE(m.p.passive->post_write(**smr, 0, 16, (*amr)->remote_key(), 0, 1, false).ok());
  m.write(0, 8, std::byte{1});
  EXPECT_EQ(back[0], std::byte{6});
  m.p.fabric->crash_all();
  EXPECT_EQ(back[0], std::byte{0});
  EXPECT_EQ(m.remote[0], std::byte{0});
}

// ------------------------------------------- crash_after, mark_durable

TEST(FakeCrash, CrashAfterFiresAtThatOperationOfThatNode) {
  Mirror m(4096);
  m.p.fabric->crash_after(3, "target", {}, "initiator");
  m.write(0, 8, std::byte{1});  // 1
  m.read();                     // 2: flushes the first write
  m.write(8, 8, std::byte{2});  // 3: the crash, right after it
  EXPECT_EQ(m.p.fabric->crashes(), 1u);
  EXPECT_EQ(m.remote[0], std::byte{1});
  EXPECT_EQ(m.remote[8], std::byte{0});  // executed, never flushed
  EXPECT_EQ(m.p.active->post_send(bytes_of("x"), 1).code(), Errc::kClosed);
  EXPECT_EQ(m.p.fabric->executed("initiator"), 3u);
  EXPECT_EQ(m.p.fabric->executed(), 3u);
  // The Read's completion was queued before the crash's flush errors.
  auto got = drain_until_closed(*m.p.active);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0].opcode, Opcode::kRead);
  EXPECT_TRUE(got[0].status.ok());
}

TEST(FakeCrash, CrashAfterCountsOnlyTheCountedNodeAndCanBeCancelled) {
  Mirror m(4096);
  m.p.fabric->crash_after(2, "", {}, "initiator");
  ASSERT_TRUE(m.p.passive->post_send(bytes_of("ack"), 9).ok());  // the target's: not counted
  m.write(0, 8, std::byte{1});
  EXPECT_EQ(m.p.fabric->crashes(), 0u);
  m.p.fabric->cancel_crash();
  m.read();
  m.write(8, 8, std::byte{2});
  EXPECT_EQ(m.p.fabric->crashes(), 0u);
  EXPECT_EQ(m.p.fabric->executed("target"), 1u);
  EXPECT_EQ(m.p.fabric->executed("initiator"), 3u);
  m.p.fabric->crash_after(0, "", CrashOptions{});  // 0: now, everything
  EXPECT_EQ(m.p.fabric->crashes(), 1u);
  EXPECT_EQ(m.remote[0], std::byte{1});
  EXPECT_EQ(m.remote[8], std::byte{0});
}

// As over tcp: a PersistFn that fails (a write-back error) fails the Read
// that flushes and breaks the connection; the owner's persist() returns it.
TEST(FakeCrash, AFailedPersistFailsTheReadThatFlushes) {
  bool failing = false;
  Mirror m(4096, [&](const void*, size_t) {
    return failing ? Status(Errc::kIoError, "volume 'v' (/v.img): msync failed: Input/output error")
                   : Status::Ok();
  });
  m.write(0, 8, std::byte{1});
  m.read(1);
  auto c = wait_for(*m.p.active, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status.to_string();

  failing = true;
  EXPECT_EQ(m.p.fabric->persist(m.remote.data(), 8).code(), Errc::kIoError);
  m.write(8, 8, std::byte{2});
  m.read(2);
  Status closed;
  c = drain_until_closed(*m.p.active, &closed);
  ASSERT_GE(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 2u);
  EXPECT_EQ(c[0].status.code(), Errc::kIoError) << c[0].status.to_string();
  EXPECT_NE(c[0].status.message().find("msync failed: Input/output error"), std::string::npos)
      << c[0].status.message();
  EXPECT_EQ(closed.code(), Errc::kClosed);
  auto pc = drain_until_closed(*m.p.passive);
  ASSERT_FALSE(pc.empty());
  EXPECT_NE(pc[0].status.message().find("refused a read"), std::string::npos)
      << pc[0].status.message();
}

TEST(FakeCrash, MarkDurableIsTheOwnersPersistAndIsReentrantFromAPersistFn) {
  // A PersistFn that calls mark_durable (as the target's region persist
  // does when a test routes pmem_msync to the fabric) must not deadlock.
  std::shared_ptr<FakeFabric>* fabric_of_mirror = nullptr;
  int calls = 0;
  Mirror m(4096, [&](const void* a, size_t n) {
    ++calls;
    (*fabric_of_mirror)->mark_durable(a, n);
    return Status::Ok();
  });
  fabric_of_mirror = &m.p.fabric;
  m.write(0, 8, std::byte{1});
  m.read();  // flushes, calls the PersistFn, which calls mark_durable
  EXPECT_EQ(calls, 1);
  m.write(8, 8, std::byte{2});
  m.write(16, 8, std::byte{3});
  m.p.fabric->mark_durable(m.remote.data() + 8, 8);  // GPSPM: the target persists
  EXPECT_EQ(calls, 1);                               // ... without PersistFn callbacks
  m.p.fabric->crash("target");
  EXPECT_EQ(m.remote[0], std::byte{1});
  EXPECT_EQ(m.remote[8], std::byte{2});
  EXPECT_EQ(m.remote[16], std::byte{0});
}

// ------------------------------------------------ Kind::kFake registration

TEST(FakeKind, NamedNeverParsedRegisteredOnlyWhileInstalled) {
  EXPECT_EQ(kind_name(Kind::kFake), "fake");
  EXPECT_EQ(parse_kind("fake").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(kind_for_name("fake").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(capabilities(Kind::kFake).status().code(), Errc::kFailedPrecondition);
  auto outer = FakeFabric::create();
  {
    ScopedFabric installed(outer);
    EXPECT_EQ(*kind_for_name("fake"), Kind::kFake);
    // rdma's: a target over the fake offers APM only by `apm:` or on pmem.
    ASSERT_TRUE(capabilities(Kind::kFake).ok());
    EXPECT_FALSE(capabilities(Kind::kFake)->read_flushes_writes_on_any_backing);
    {
      ScopedFabric inner(FakeFabric::create(), "other-node");
      auto l = transport::listen(Kind::kFake, "t", 0, {});
      ASSERT_TRUE(l.ok()) << l.status().to_string();
      EXPECT_FALSE(outer->port_of("t").ok()) << "reached the outer fabric";
    }
    // The outer one is back, registered again.
    auto l = transport::listen(Kind::kFake, "t", 0, {});
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    EXPECT_TRUE(outer->port_of("t").ok());
    // Still never what a configuration can name.
    EXPECT_EQ(parse_kind("fake").status().code(), Errc::kInvalidArgument);
  }
  EXPECT_EQ(kind_for_name("fake").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(capabilities(Kind::kFake).status().code(), Errc::kFailedPrecondition);
}

TEST(FakeKind, ListenAndConnectReachTheInstalledFabric) {
  auto none = transport::listen(Kind::kFake, "target", 0, {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Errc::kFailedPrecondition);
  EXPECT_EQ(transport::connect(Kind::kFake, "target", 1, {}).status().code(),
            Errc::kFailedPrecondition);

  auto fabric = FakeFabric::create();
  {
    ScopedFabric installed(fabric, "app-node");
    EXPECT_EQ(installed_fabric(), fabric);
    auto listener = transport::listen(Kind::kFake, "target", 7450, {});
    ASSERT_TRUE(listener.ok()) << listener.status().to_string();
    EXPECT_EQ((*listener)->port(), 7450);
    EXPECT_EQ(*fabric->port_of("target"), 7450);
    auto wrong = transport::connect(Kind::kFake, "target", 7451, {});
    ASSERT_FALSE(wrong.ok());
    EXPECT_EQ(wrong.status().code(), Errc::kConnectionError);
    EXPECT_EQ(transport::connect(Kind::kFake, "elsewhere", 7450, {}).status().code(),
              Errc::kConnectionError);
    auto active = transport::connect(Kind::kFake, "target", 7450, {});
    ASSERT_TRUE(active.ok()) << active.status().to_string();
    auto passive = (*listener)->accept(1000ms);
    ASSERT_TRUE(passive.ok() && *passive);
    EXPECT_EQ((*active)->peer_address(), "fake:target");
    EXPECT_EQ((*passive)->peer_address().rfind("fake:app-node#", 0), 0u);
    // The ends belong to the nodes: crashing "app-node" breaks the pair.
    fabric->crash("app-node");
    EXPECT_EQ((*active)->post_send(bytes_of("x"), 1).code(), Errc::kClosed);
    // A port of 0 at listen: the fabric numbers it; 0 at connect: any.
    auto second = transport::listen(Kind::kFake, "other", 0, {});
    ASSERT_TRUE(second.ok());
    EXPECT_NE((*second)->port(), 0);
    EXPECT_TRUE(transport::connect(Kind::kFake, "other", 0, {}).ok());
  }
  EXPECT_EQ(installed_fabric(), nullptr);
  // owner_persisted without a fabric: nothing, no crash.
  std::byte b{};
  owner_persisted(&b, 1);
}

}  // namespace
}  // namespace pmirror::transport::fake
