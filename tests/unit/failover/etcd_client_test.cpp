// EtcdClient against a real 3-member etcd cluster on loopback
// (tests/support/etcd_cluster.h). Timing is never asserted tightly: waits
// poll with generous deadlines and the tests check order and outcome.
#include "failover/etcd_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "support/etcd_cluster.h"

namespace pmirror::failover {
namespace {

using namespace std::chrono_literals;
using testing::EtcdCluster;

// A key of this test's own (tests share a cluster).
std::string test_key(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string("/t/") + info->test_suite_name() + "/" + info->name() + "/" + name;
}

std::unique_ptr<EtcdClient> make_client(std::vector<std::string> endpoints,
                                        std::chrono::milliseconds timeout = 5000ms) {
  auto client = EtcdClient::create({.endpoints = std::move(endpoints), .timeout = timeout});
  EXPECT_TRUE(client.ok()) << client.status().to_string();
  return client.ok() ? std::move(client).value() : nullptr;
}

// Polls `condition` until it holds or `deadline` passes.
template <typename F>
bool eventually(F condition, std::chrono::milliseconds deadline = 30s) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return condition();
}

// A local HTTP server that answers every request with `response` (a full
// HTTP answer) and closes the connection.
class FakeHttpServer {
 public:
  explicit FakeHttpServer(std::string response) : response_(std::move(response)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeHttpServer() {
    done_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_; }

 private:
  void serve() {
    while (!done_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      // Reads the request (headers, then Content-Length bytes of body) so
      // that closing does not reset the connection under the answer.
      std::string request;
      char buffer[4096];
      size_t need = std::string::npos;
      while (request.size() < need) {
        pollfd c{conn, POLLIN, 0};
        if (::poll(&c, 1, 2000) <= 0) break;
        ssize_t n = ::recv(conn, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        request.append(buffer, static_cast<size_t>(n));
        size_t end = request.find("\r\n\r\n");
        if (end != std::string::npos && need == std::string::npos) {
          size_t body = 0;
          size_t cl = request.find("Content-Length: ");
          if (cl != std::string::npos && cl < end) body = std::stoul(request.substr(cl + 16));
          need = end + 4 + body;
        }
      }
      ++requests_;
      (void)!::send(conn, response_.data(), response_.size(), MSG_NOSIGNAL);
      ::shutdown(conn, SHUT_WR);
      ::close(conn);
    }
  }

  std::string response_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> done_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

std::string http_answer(const std::string& status, const std::string& body) {
  return "HTTP/1.1 " + status +
         "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// --- one cluster for the suite: tests that do not harm it ---

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = EtcdCluster::start(3, &error_).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr) << error_;
    client_ = make_client(cluster_->endpoints());
    ASSERT_NE(client_, nullptr);
  }

  static EtcdCluster* cluster_;
  static std::string error_;
  std::unique_ptr<EtcdClient> client_;
};
EtcdCluster* EtcdClientTest::cluster_ = nullptr;
std::string EtcdClientTest::error_;

TEST_F(EtcdClientTest, GrantAndKeepAliveReturnTheTtl) {
  auto lease = client_->grant_lease(10s);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_NE(lease->id, 0);
  EXPECT_EQ(lease->ttl, 10s);
  auto ttl = client_->keep_alive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().to_string();
  EXPECT_GT(*ttl, 0s);
  EXPECT_LE(*ttl, 10s);
  // Revoked: keep_alive says 0, and a second revoke is not an error.
  ASSERT_TRUE(client_->revoke_lease(lease->id).ok());
  ttl = client_->keep_alive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().to_string();
  EXPECT_EQ(*ttl, 0s);
  EXPECT_TRUE(client_->revoke_lease(lease->id).ok());
}

TEST_F(EtcdClientTest, UnknownLeaseKeepAliveIsZeroAndRevokeIsOk) {
  auto ttl = client_->keep_alive(0x1234567890abcdef);
  ASSERT_TRUE(ttl.ok()) << ttl.status().to_string();
  EXPECT_EQ(*ttl, 0s);
  auto status = client_->revoke_lease(0x1234567890abcdef);
  EXPECT_TRUE(status.ok()) << status.to_string();
}

TEST_F(EtcdClientTest, GrantRejectsANonPositiveTtl) {
  EXPECT_EQ(client_->grant_lease(0s).status().code(), Errc::kInvalidArgument);
}

TEST_F(EtcdClientTest, CreateIfAbsentOnlyOnce) {
  auto a = client_->grant_lease(30s);
  auto b = client_->grant_lease(30s);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string key = test_key("leader");
  auto first = client_->create_if_absent(key, "one", a->id);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_TRUE(*first);
  auto second = client_->create_if_absent(key, "two", b->id);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_FALSE(*second);
  auto got = client_->get(key);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key, key);
  EXPECT_EQ((*got)->value, "one");
  EXPECT_EQ((*got)->lease, a->id);
  EXPECT_GT((*got)->create_revision, 0);
  EXPECT_EQ((*got)->mod_revision, (*got)->create_revision);
  EXPECT_TRUE(client_->revoke_lease(a->id).ok());
  EXPECT_TRUE(client_->revoke_lease(b->id).ok());
}

TEST_F(EtcdClientTest, CreateIfAbsentWithoutALease) {
  const std::string key = test_key("plain");
  auto created = client_->create_if_absent(key, "v", 0);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  EXPECT_TRUE(*created);
  auto got = client_->get(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->lease, 0);
  // Held "under lease 0": update and delete work with 0.
  auto updated = client_->update_if_held(key, "w", 0);
  ASSERT_TRUE(updated.ok());
  EXPECT_TRUE(*updated);
  auto deleted = client_->delete_if_held(key, 0);
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(*deleted);
  // A missing key is not "held under lease 0": nothing is created.
  updated = client_->update_if_held(key, "x", 0);
  ASSERT_TRUE(updated.ok());
  EXPECT_FALSE(*updated);
  got = client_->get(key);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
}

// put overwrites whatever is there; without a lease the key outlives every
// lease, with one it goes with it.
TEST_F(EtcdClientTest, PutOverwritesAndFollowsItsLease) {
  const std::string key = test_key("put");
  ASSERT_TRUE(client_->put(key, "one", 0).ok());
  ASSERT_TRUE(client_->put(key, "two", 0).ok());
  auto got = client_->get(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, "two");
  EXPECT_EQ((*got)->lease, 0);
  auto lease = client_->grant_lease(std::chrono::seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  ASSERT_TRUE(client_->put(key, "three", lease->id).ok());
  got = client_->get(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, "three");
  EXPECT_EQ((*got)->lease, lease->id);
  ASSERT_TRUE(client_->revoke_lease(lease->id).ok());
  got = client_->get(key);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  EXPECT_EQ(client_->put(key, "four", 0x7777777777).code(), Errc::kNotFound);
}

TEST_F(EtcdClientTest, CreateIfAbsentWithAnUnknownLeaseIsNotFound) {
  auto created = client_->create_if_absent(test_key("k"), "v", 0x7777777777);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), Errc::kNotFound) << created.status().to_string();
  EXPECT_NE(created.status().message().find("lease not found"), std::string::npos)
      << created.status().message();
}

TEST_F(EtcdClientTest, UpdateAndDeleteOnlyForTheHolder) {
  auto a = client_->grant_lease(30s);
  auto b = client_->grant_lease(30s);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string key = test_key("leader");
  ASSERT_TRUE(client_->create_if_absent(key, "one", a->id).value());

  auto updated = client_->update_if_held(key, "by-b", b->id);
  ASSERT_TRUE(updated.ok()) << updated.status().to_string();
  EXPECT_FALSE(*updated);
  EXPECT_EQ(client_->get(key).value()->value, "one");

  updated = client_->update_if_held(key, "two", a->id);
  ASSERT_TRUE(updated.ok()) << updated.status().to_string();
  EXPECT_TRUE(*updated);
  auto got = client_->get(key).value();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->value, "two");
  EXPECT_EQ(got->lease, a->id);
  EXPECT_GT(got->mod_revision, got->create_revision);

  auto deleted = client_->delete_if_held(key, b->id);
  ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
  EXPECT_FALSE(*deleted);
  EXPECT_TRUE(client_->get(key).value().has_value());

  deleted = client_->delete_if_held(key, a->id);
  ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
  EXPECT_TRUE(*deleted);
  EXPECT_FALSE(client_->get(key).value().has_value());

  // Gone: neither update (which would re-create it) nor delete happens.
  EXPECT_FALSE(client_->update_if_held(key, "three", a->id).value());
  EXPECT_FALSE(client_->delete_if_held(key, a->id).value());
  EXPECT_FALSE(client_->get(key).value().has_value());
  EXPECT_TRUE(client_->revoke_lease(a->id).ok());
  EXPECT_TRUE(client_->revoke_lease(b->id).ok());
}

TEST_F(EtcdClientTest, RevokeRemovesTheLeasesKeys) {
  auto lease = client_->grant_lease(30s);
  ASSERT_TRUE(lease.ok());
  const std::string key = test_key("leader");
  ASSERT_TRUE(client_->create_if_absent(key, "v", lease->id).value());
  ASSERT_TRUE(client_->get(key).value().has_value());
  ASSERT_TRUE(client_->revoke_lease(lease->id).ok());
  auto got = client_->get(key);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_FALSE(got->has_value());
  // The key is free again for another holder.
  EXPECT_TRUE(client_->create_if_absent(key, "w", 0).value());
}

TEST_F(EtcdClientTest, ExpiryRemovesTheLeasesKeys) {
  auto lease = client_->grant_lease(2s);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  const std::string key = test_key("leader");
  ASSERT_TRUE(client_->create_if_absent(key, "v", lease->id).value());
  auto got = client_->get(key);
  ASSERT_TRUE(got.ok() && got->has_value()) << "present first";
  bool gone = eventually([&] {
    auto r = client_->get(key);
    return r.ok() && !r->has_value();
  });
  EXPECT_TRUE(gone) << "the key outlived its lease by 30 s";
  auto ttl = client_->keep_alive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().to_string();
  EXPECT_EQ(*ttl, 0s);
}

TEST_F(EtcdClientTest, GetOfAMissingKeyIsNullopt) {
  auto got = client_->get(test_key("nothing"));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_FALSE(got->has_value());
}

TEST_F(EtcdClientTest, GetPrefixListsTheKeysUnderThePrefixInOrder) {
  const std::string base = test_key("");
  // Written out of order; "a/bc" starts with "a/b" too (a prefix is bytes,
  // not path components); "a/a" and "a/c" do not.
  for (const char* k : {"a/c", "a/b/2", "a/bc", "a/a", "a/b", "a/b/1"}) {
    ASSERT_TRUE(client_->create_if_absent(base + k, std::string("v-") + k, 0).value()) << k;
  }
  auto listed = client_->get_prefix(base + "a/b");
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  std::vector<std::string> keys;
  for (const auto& kv : *listed) {
    keys.push_back(kv.key.substr(base.size()));
    EXPECT_EQ(kv.value, "v-" + keys.back());
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"a/b", "a/b/1", "a/b/2", "a/bc"}));

  listed = client_->get_prefix(base + "a/b/");
  ASSERT_TRUE(listed.ok());
  keys.clear();
  for (const auto& kv : *listed) keys.push_back(kv.key.substr(base.size()));
  EXPECT_EQ(keys, (std::vector<std::string>{"a/b/1", "a/b/2"}));

  listed = client_->get_prefix(base + "z");
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());

  // The empty prefix: every key.
  listed = client_->get_prefix("");
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  EXPECT_GE(listed->size(), 6u);
}

TEST_F(EtcdClientTest, BinaryKeysAndValuesRoundTrip) {
  const std::string base = test_key("");
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes += char(i);
  // Values of every length mod 3 (base64 padding), empty included.
  for (size_t len = 0; len < 8; ++len) {
    const std::string key = base + std::string("len\0\xff", 5) + char('0' + len);
    const std::string value = all_bytes.substr(256 - len);
    ASSERT_TRUE(client_->create_if_absent(key, value, 0).value()) << len;
    auto got = client_->get(key);
    ASSERT_TRUE(got.ok() && got->has_value()) << len;
    EXPECT_EQ((*got)->key, key);
    EXPECT_EQ((*got)->value, value) << len;
  }
  const std::string key = base + "\x80\xfe\xff";
  ASSERT_TRUE(client_->create_if_absent(key, all_bytes, 0).value());
  auto got = client_->get(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, all_bytes);

  // A prefix ending in 0xff: its range ends after the byte before.
  const std::string p = base + "p\xff";
  for (const std::string& k :
       {p, p + std::string(1, '\0'), p + "\xff\xff", base + "p\xfe", base + "q"}) {
    ASSERT_TRUE(client_->create_if_absent(k, "x", 0).value());
  }
  auto listed = client_->get_prefix(p);
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  std::vector<std::string> keys;
  for (const auto& kv : *listed) keys.push_back(kv.key);
  EXPECT_EQ(keys, (std::vector<std::string>{p, p + std::string(1, '\0'), p + "\xff\xff"}));
}

TEST_F(EtcdClientTest, TheFirstAnsweringEndpointIsUsed) {
  auto endpoints = cluster_->endpoints();
  auto client = make_client(endpoints);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->get(test_key("k")).ok());
  EXPECT_EQ(client->current_endpoint(), endpoints[0]);
}

TEST_F(EtcdClientTest, AnEndpointAnsweringGarbageIsSkipped) {
  FakeHttpServer garbage(http_answer("200 OK", "not json"));
  auto endpoints = cluster_->endpoints();
  endpoints.insert(endpoints.begin(), garbage.endpoint());
  auto client = make_client(endpoints);
  ASSERT_NE(client, nullptr);
  auto got = client->get(test_key("k"));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(garbage.requests(), 1);
  EXPECT_EQ(client->current_endpoint(), cluster_->endpoint(0));
  // Only garbage: a protocol error that quotes it.
  auto alone = make_client({garbage.endpoint()});
  got = alone->get(test_key("k"));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Errc::kProtocolError) << got.status().to_string();
  EXPECT_NE(got.status().message().find("not json"), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find(garbage.endpoint()), std::string::npos);
}

TEST_F(EtcdClientTest, AnEndpointAnsweringJsonThatIsNotEtcdsIsAProtocolError) {
  FakeHttpServer other(http_answer("200 OK", "{\"hello\":\"world\"}"));
  auto got = make_client({other.endpoint()})->get(test_key("k"));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Errc::kProtocolError) << got.status().to_string();
}

TEST_F(EtcdClientTest, ANon2xxAnswerThatIsNotEtcdsIsSkipped) {
  FakeHttpServer not_found(http_answer("404 Not Found", "Not Found"));
  auto endpoints = cluster_->endpoints();
  endpoints.insert(endpoints.begin(), not_found.endpoint());
  auto client = make_client(endpoints);
  auto got = client->get(test_key("k"));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  got = make_client({not_found.endpoint()})->get(test_key("k"));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Errc::kProtocolError) << got.status().to_string();
  EXPECT_NE(got.status().message().find("HTTP 404"), std::string::npos);
}

TEST_F(EtcdClientTest, AnOversizedAnswerIsRefused) {
  // Announces 100 MiB (more than the client accepts) and sends a little.
  FakeHttpServer liar(
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n"
      "\r\n{\"header\":{}");
  auto got = make_client({liar.endpoint()})->get(test_key("k"));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Errc::kProtocolError) << got.status().to_string();
  EXPECT_NE(got.status().message().find("MiB"), std::string::npos) << got.status().message();
}

TEST(EtcdClientNoCluster, UnreachableEndpointsFail) {
  // Ports nobody listens on: bound, read back, closed.
  std::vector<std::string> endpoints;
  for (int i = 0; i < 2; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    ::close(fd);
    endpoints.push_back("http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  }
  auto client = make_client(endpoints, 1000ms);
  ASSERT_NE(client, nullptr);
  const auto start = std::chrono::steady_clock::now();
  auto lease = client->grant_lease(10s);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(lease.ok());
  EXPECT_TRUE(lease.status().code() == Errc::kConnectionError ||
              lease.status().code() == Errc::kTimeout)
      << lease.status().to_string();
  for (const auto& e : endpoints) {
    EXPECT_NE(lease.status().message().find(e), std::string::npos) << lease.status().message();
  }
  EXPECT_LT(took, 30s);  // it returns; how fast is not the point
}

TEST(EtcdClientNoCluster, BadOptionsAreRefused) {
  EXPECT_EQ(EtcdClient::create({}).status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(EtcdClient::create({.endpoints = {"127.0.0.1:2379"}}).status().code(),
            Errc::kInvalidArgument);
  EXPECT_EQ(
      EtcdClient::create({.endpoints = {"http://127.0.0.1:2379"}, .timeout = 0ms}).status().code(),
      Errc::kInvalidArgument);
  EXPECT_EQ(EtcdClient::create({.endpoints = {"https://127.0.0.1:2379"}, .tls_cert = "/c.pem"})
                .status()
                .code(),
            Errc::kInvalidArgument);
  auto ok = EtcdClient::create({.endpoints = {"http://127.0.0.1:2379/"}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->current_endpoint(), "http://127.0.0.1:2379");
}

// --- a cluster per test: tests that kill or stop members ---

class EtcdClientFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    cluster_ = EtcdCluster::start(3, &error);
    ASSERT_NE(cluster_, nullptr) << error;
  }
  std::unique_ptr<EtcdCluster> cluster_;
};

TEST_F(EtcdClientFaultTest, FailsOverWhenTheFirstEndpointIsKilled) {
  auto client = make_client(cluster_->endpoints());
  auto lease = client->grant_lease(30s);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  const std::string key = test_key("leader");
  ASSERT_TRUE(client->create_if_absent(key, "v", lease->id).value());
  EXPECT_EQ(client->current_endpoint(), cluster_->endpoint(0));

  cluster_->kill(0);
  // Member 0 may have been the leader: the first call may meet an election.
  std::string last;
  bool answered = eventually([&] {
    auto r = client->get(key);
    if (!r.ok()) last = r.status().to_string();
    return r.ok();
  });
  ASSERT_TRUE(answered) << last;
  EXPECT_NE(client->current_endpoint(), cluster_->endpoint(0));
  auto got = client->get(key);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->lease, lease->id);
  auto ttl = client->keep_alive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().to_string();
  EXPECT_GT(*ttl, 0s);
  EXPECT_TRUE(client->update_if_held(key, "w", lease->id).value());

  // A new client that lists the dead member first still gets answers.
  auto fresh = make_client(cluster_->endpoints());
  got = fresh->get(key);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_NE(fresh->current_endpoint(), cluster_->endpoint(0));
}

TEST_F(EtcdClientFaultTest, FailsOverWhenTheFirstEndpointHangs) {
  auto client = make_client(cluster_->endpoints(), 6000ms);
  const std::string key = test_key("k");
  ASSERT_TRUE(client->create_if_absent(key, "v", 0).value());
  cluster_->stop(0);  // accepts connections, never answers
  std::string last;
  bool answered = eventually([&] {
    auto r = client->get(key);
    if (!r.ok()) last = r.status().to_string();
    return r.ok() && r->has_value();
  });
  ASSERT_TRUE(answered) << last;
  EXPECT_NE(client->current_endpoint(), cluster_->endpoint(0));
  // Later calls start with the member that answered.
  auto lease = client->grant_lease(10s);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_NE(client->current_endpoint(), cluster_->endpoint(0));
  cluster_->resume(0);
}

TEST_F(EtcdClientFaultTest, AStoppedMajorityTimesOut) {
  auto client = make_client(cluster_->endpoints(), 1500ms);
  const std::string key = test_key("k");
  ASSERT_TRUE(client->create_if_absent(key, "v", 0).value());
  cluster_->stop(1);
  cluster_->stop(2);
  const auto start = std::chrono::steady_clock::now();
  auto created = client->create_if_absent(test_key("other"), "v", 0);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), Errc::kTimeout) << created.status().to_string();
  for (const auto& e : cluster_->endpoints()) {
    EXPECT_NE(created.status().message().find(e), std::string::npos) << created.status().message();
  }
  EXPECT_LT(took, 30s);
  auto got = client->get(key);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Errc::kTimeout) << got.status().to_string();

  // Resumed, the cluster serves again.
  cluster_->resume(1);
  cluster_->resume(2);
  std::string error;
  ASSERT_TRUE(cluster_->wait_ready(60s, &error)) << error;
  std::string last;
  bool answered = eventually([&] {
    auto r = client->get(key);
    if (!r.ok()) last = r.status().to_string();
    return r.ok() && r->has_value();
  });
  EXPECT_TRUE(answered) << last;
}

TEST_F(EtcdClientFaultTest, ARestartedMemberServesAgain) {
  auto client = make_client(cluster_->endpoints());
  const std::string key = test_key("k");
  ASSERT_TRUE(client->create_if_absent(key, "v", 0).value());
  std::string error;
  ASSERT_TRUE(cluster_->restart(0, &error)) << error;
  auto only0 = make_client({cluster_->endpoint(0)});
  auto got = only0->get(key);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "v");
}

}  // namespace
}  // namespace pmirror::failover
