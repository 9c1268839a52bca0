// The transport contract: one parameterized suite that every implementation
// of the seam (transport.h) passes -- tcp on loopback, rdma on a device (the
// lab), the fake fabric in process. Each transport's test binary links
// transport_contract.cpp (the cases), supplies a Harness (how to listen and
// connect, and what the transport may do differently) and instantiates the
// suites it honours:
//
//   TransportContract  every transport
//   RemoteAccess       every transport, once per kind of violation
//   ReadFlushContract  transports whose Read after Writes calls the
//                      passive side's PersistFn first (tcp, the fake)
//
//   const TransportUnderTest tcp{"tcp", [] { return std::make_unique<TcpHarness>(); }};
//   INSTANTIATE_TEST_SUITE_P(Tcp, TransportContract, ::testing::Values(tcp), transport_name);
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "transport/transport.h"

namespace pmirror::transport::contract {

using namespace std::chrono_literals;

// Where a listener is reached.
struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

// What the contract lets transports do differently.
struct Traits {
  // The error a remote access violation completes the operation with.
  Errc remote_access_error = Errc::kPermissionDenied;
  // Its message says "remote access error: ..." and why (not registered,
  // outside the registration, kRemoteWrite/kRemoteRead missing). rdma: the
  // NIC reports "remote access error" and no more.
  bool explains_remote_access_errors = true;
  // A Send completes once handed to the network, before the peer has a
  // receive posted for it (tcp).
  bool send_completes_before_delivery = false;
  // Operations flushed because the peer closed say so ("... closed the
  // connection", naming the peer). rdma: the flush may come from the QP
  // leaving the connected state before the disconnect event is read.
  bool flushes_say_the_peer_closed = true;
  // accept() returns the error of a peer whose hello was refused (a
  // message_size mismatch). The fake refuses at connect(): accept sees none.
  bool accept_reports_refused_peers = true;
  // What a connect() to an endpoint nobody listens on says.
  std::string refused_text;
};

class Harness {
 public:
  virtual ~Harness() = default;
  // Non-empty: the transport cannot run here (no RDMA device); every case skips.
  virtual std::string skip_reason() const { return {}; }
  virtual Traits traits() const = 0;
  virtual Result<std::unique_ptr<Listener>> listen(const ConnectionOptions& options) = 0;
  virtual Endpoint endpoint(const Listener& listener) const = 0;
  virtual Result<std::unique_ptr<Connection>> connect(const Endpoint& to,
                                                      const ConnectionOptions& options) = 0;
  // peer_address() of the active end of a connection to `to` (also named by
  // a refused connect); the passive end's starts with passive_peer_prefix().
  virtual std::string active_peer(const Endpoint& to) const = 0;
  virtual std::string passive_peer_prefix() const = 0;
  // true: posted operations queue until hold_execution(false), so a case
  // can post a run of them before any executes (the fake's manual mode).
  // Transports that cannot hold do nothing.
  virtual void hold_execution(bool /*hold*/) {}
};

struct TransportUnderTest {
  std::string name;  // the instance's name in test names: tcp, rdma, fake
  std::function<std::unique_ptr<Harness>()> make;
};
std::string transport_name(const ::testing::TestParamInfo<TransportUnderTest>& info);
void PrintTo(const TransportUnderTest& transport, std::ostream* os);

struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> active;   // the connect() side
  std::unique_ptr<Connection> passive;  // the accept() side, activated
};

// Polls until n completions arrived, the connection closed, or 20 s.
std::vector<Completion> wait_for(Connection& c, size_t n);
// Polls until poll() fails (kClosed); returns the completions before it.
std::vector<Completion> drain_until_closed(Connection& c, Status* closed = nullptr);
std::span<const std::byte> bytes_of(std::string_view s);
// Retries `post` while the send queue is full, polling in between; the
// completions that arrive meanwhile are appended to *seen.
Status post_retrying(Connection& c, const std::function<Status()>& post,
                     std::vector<Completion>* seen);

// Holds the harness of one case.
class HarnessFixture {
 protected:
  // Returns why the case must skip ("" to run).
  std::string start(const TransportUnderTest& transport);
  Harness& harness() { return *harness_; }
  // listen, accept while connecting, activate the accepted end.
  // Declare the buffers a test registers before its pair, so the pair is
  // destroyed (its threads joined, its queues drained) before the memory its
  // unsignaled or unfinished operations still point at, as with verbs.
  Pair make_pair(const ConnectionOptions& options = {});
  // A second connection to `listener`: {active, passive (activated)}.
  std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> connect_pair(
      Listener& listener, const ConnectionOptions& options = {});

 private:
  std::unique_ptr<Harness> harness_;
};

class TransportContract : public HarnessFixture,
                          public ::testing::TestWithParam<TransportUnderTest> {
 protected:
  void SetUp() override {
    if (std::string why = start(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

class ReadFlushContract : public TransportContract {};

enum class Violation {
  kOutOfBounds,      // a Write running past the end (forged longer key)
  kBeforeStart,      // a Write below the registration
  kWrongRkey,        // a Write with an rkey nobody registered
  kNoWriteAccess,    // a Write into a registration without kRemoteWrite
  kNoReadAccess,     // a Read of a registration without kRemoteRead
  kReadOutOfBounds,  // a Read running past the end
};
std::string violation_name(Violation v);
void PrintTo(Violation v, std::ostream* os);

class RemoteAccess : public HarnessFixture,
                     public ::testing::TestWithParam<std::tuple<TransportUnderTest, Violation>> {
 protected:
  void SetUp() override {
    if (std::string why = start(std::get<0>(GetParam())); !why.empty()) GTEST_SKIP() << why;
  }
};

// `transport` with every Violation:
//   INSTANTIATE_TEST_SUITE_P(Tcp, RemoteAccess, ::testing::ValuesIn(every_violation(tcp)),
//                            remote_access_name);
std::vector<std::tuple<TransportUnderTest, Violation>> every_violation(
    const TransportUnderTest& transport);
std::string remote_access_name(
    const ::testing::TestParamInfo<std::tuple<TransportUnderTest, Violation>>& info);

}  // namespace pmirror::transport::contract
