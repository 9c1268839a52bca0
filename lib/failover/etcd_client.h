// A client of etcd's v3 API through its JSON gateway (POST /v3/<service>/<call>
// with JSON bodies; keys and values base64 in the JSON, int64 as strings), over
// libcurl: the calls pmirror-promoter needs and nothing else
// (docs/failover.md, section 2).
//
//   auto client = EtcdClient::create({.endpoints = {"http://127.0.0.1:2379"}});
//   auto lease = client->grant_lease(std::chrono::seconds(10));
//   auto won = client->create_if_absent("/pmirror/c/volumes/db1/leader", "{...}", lease->id);
//   auto ttl = client->keep_alive(lease->id);   // 0: the lease is gone
//
// Every call tries the endpoints in order, starting with the one that answered
// last, until one answers or `timeout` (for the whole call) has passed. An
// endpoint that cannot be reached, answers a non-2xx status or a body that is
// not etcd's is skipped; an answer that is etcd's (even an error such as
// "lease not found") is final. Errors: kTimeout (no endpoint answered in time),
// kConnectionError (every endpoint refused or failed), kProtocolError (an
// answer that is not etcd's JSON), kNotFound (lease not found). One client is
// used by one thread at a time.
//
// Each endpoint still to try gets an equal share of the time left (one that
// hangs cannot eat the whole call; one that timed out is asked again with
// what fast-failing ones left). etcd errors that another member may not give
// (no leader, request timed out: gRPC Unavailable, DeadlineExceeded, ...)
// also move on to the next endpoint. A transaction whose answer was lost
// (timeout) may have been applied: its retry on the next endpoint then
// answers false (create_if_absent: check get()'s lease). Proxies from the
// environment (http_proxy, ...) are not used. Answers over 64 MiB are
// refused (kProtocolError).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pmirror::failover {

// Every member has a default ({}): designated initializers may leave any out
// without gcc 12's -Wmissing-field-initializers.
struct EtcdOptions {
  std::vector<std::string> endpoints{};     // "http://127.0.0.1:2379", "https://host:2379"
  std::chrono::milliseconds timeout{2000};  // one call, all endpoints tried
  std::string tls_ca{};                     // PEM file; empty: the system's CAs
  std::string tls_cert{};                   // client certificate (PEM), with tls_key
  std::string tls_key{};
};

struct EtcdLease {
  int64_t id = 0;
  std::chrono::seconds ttl{0};  // as granted
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: not attached to a lease
};

class EtcdClient {
 public:
  static Result<std::unique_ptr<EtcdClient>> create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // POST /v3/lease/grant.
  Result<EtcdLease> grant_lease(std::chrono::seconds ttl);
  // POST /v3/lease/keepalive (one renewal): the TTL left after it; 0 when
  // etcd no longer knows the lease (expired or revoked).
  Result<std::chrono::seconds> keep_alive(int64_t lease_id);
  // POST /v3/lease/revoke: the lease and every key attached to it go.
  // A lease etcd does not know is not an error.
  Status revoke_lease(int64_t lease_id);

  // A transaction: if `key` does not exist (create_revision == 0), put it
  // with `value` attached to `lease_id` (0: none). True if this call
  // created it, false if the key existed (nothing changed).
  Result<bool> create_if_absent(const std::string& key, const std::string& value, int64_t lease_id);
  // A transaction: if `key` is attached to `lease_id`, put `value` (keeping
  // the lease). False if the key is gone or held under another lease.
  Result<bool> update_if_held(const std::string& key, const std::string& value, int64_t lease_id);
  // A transaction: delete `key` if it is attached to `lease_id`. False if
  // it was not (gone, or another lease's).
  Result<bool> delete_if_held(const std::string& key, int64_t lease_id);

  // POST /v3/kv/put: `key` = `value`, attached to `lease_id` (0: none,
  // the key outlives every lease).
  Status put(const std::string& key, const std::string& value, int64_t lease_id);

  // POST /v3/kv/range of one key: nullopt when it does not exist.
  Result<std::optional<EtcdKeyValue>> get(const std::string& key);
  // Every key under `prefix` (range_end = prefix with its last byte + 1),
  // in key order.
  Result<std::vector<EtcdKeyValue>> get_prefix(const std::string& prefix);

  // The endpoint that answered last ("http://127.0.0.1:2379"), for logs.
  const std::string& current_endpoint() const;

 private:
  struct Impl;
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pmirror::failover
