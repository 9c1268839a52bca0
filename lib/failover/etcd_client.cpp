// etcd_client.h: etcd's v3 API through its JSON gateway, over libcurl.
//
// What etcd 3.4's gateway answers (checked against etcd 3.4.23):
//   - int64 fields come as JSON strings ("ID":"4111120437769175045"); fields
//     at their default value are left out ("succeeded" of a failed txn,
//     "lease" of a key without one, "value" of an empty value, "kvs" of an
//     empty range, "TTL" of a keepalive of an unknown lease);
//   - keepalive of an unknown lease: HTTP 200, {"result":{"header":..,"ID":..}};
//   - revoke or put with an unknown lease: HTTP 404,
//     {"error":"etcdserver: requested lease not found","code":5,"message":..};
//   - a compare on the lease of a key that does not exist compares 0 (so
//     "lease == 0" holds for a missing key): the *_if_held transactions also
//     require the key to exist.
#include "failover/etcd_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

namespace pmirror::failover {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// An answer larger than this is not etcd's (a lying or broken endpoint must
// not make us allocate without limit).
constexpr size_t kMaxAnswerBytes = size_t{64} << 20;

// --- base64 (standard alphabet, padded: what Go's encoding/json uses for
// []byte) ---

constexpr char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t n = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) |
                 uint32_t(uint8_t(in[i + 2]));
    out += kBase64Alphabet[(n >> 18) & 63];
    out += kBase64Alphabet[(n >> 12) & 63];
    out += kBase64Alphabet[(n >> 6) & 63];
    out += kBase64Alphabet[n & 63];
  }
  if (size_t rest = in.size() - i; rest > 0) {
    uint32_t n = uint32_t(uint8_t(in[i])) << 16;
    if (rest == 2) n |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kBase64Alphabet[(n >> 18) & 63];
    out += kBase64Alphabet[(n >> 12) & 63];
    out += rest == 2 ? kBase64Alphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// nullopt: not base64. Accepts missing padding and the URL-safe alphabet too.
std::optional<std::string> base64_decode(std::string_view in) {
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t bits = 0;
  int count = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '+' || c == '-') {
      v = 62;
    } else if (c == '/' || c == '_') {
      v = 63;
    } else {
      return std::nullopt;
    }
    bits = (bits << 6) | uint32_t(v);
    if (++count == 4) {
      out += char((bits >> 16) & 0xff);
      out += char((bits >> 8) & 0xff);
      out += char(bits & 0xff);
      bits = 0;
      count = 0;
    }
  }
  if (count == 2) {
    out += char((bits >> 4) & 0xff);
  } else if (count == 3) {
    out += char((bits >> 10) & 0xff);
    out += char((bits >> 2) & 0xff);
  }
  return out;
}

// --- JSON fields ---

// An int64 field: a string ("123", how the gateway writes int64) or a
// number; absent: 0 (proto3 leaves defaults out). nullopt: malformed.
std::optional<int64_t> int_field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return int64_t{0};
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const auto& text = it->get_ref<const std::string&>();
    int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
    return value;
  }
  return std::nullopt;
}

// A bytes field (base64); absent: empty.
std::optional<std::string> bytes_field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string()) return std::nullopt;
  return base64_decode(it->get_ref<const std::string&>());
}

std::optional<bool> bool_field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return false;
  if (!it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

// A short, printable excerpt of an answer for messages.
std::string excerpt(std::string_view body) {
  std::string out;
  for (char c : body.substr(0, 80)) {
    out += (c >= 0x20 && c < 0x7f) ? c : '.';
  }
  if (body.size() > 80) out += "...";
  return out;
}

// The first key after every key that starts with `prefix` ("\0": no end, as
// etcd reads range_end).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (uint8_t(prefix.back()) != 0xff) {
      prefix.back() = char(uint8_t(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

std::string lease_text(int64_t id) { return std::to_string(id); }

// --- libcurl ---

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

struct Body {
  std::string data;
  bool too_large = false;
};

size_t write_body(char* ptr, size_t size, size_t nmemb, void* userdata) {
  auto* body = static_cast<Body*>(userdata);
  size_t n = size * nmemb;
  if (body->data.size() + n > kMaxAnswerBytes) {
    body->too_large = true;
    return 0;  // CURLE_WRITE_ERROR
  }
  body->data.append(ptr, n);
  return n;
}

// What one endpoint did with one request.
enum class Failure {
  kNone,
  kUnreachable,  // refused, reset, DNS, TLS: kConnectionError
  kTimeout,      // no answer within its share of the time
  kNotEtcd,      // an answer that is not etcd's: kProtocolError
  kUnavailable,  // etcd says it cannot serve now (no leader, ...)
};

// gRPC status codes etcd sends (google.golang.org/grpc/codes) mapped to
// ours; nullopt: another member may do better (try the next endpoint).
std::optional<Errc> final_errc(int64_t grpc_code) {
  switch (grpc_code) {
    case 3:   // InvalidArgument
    case 11:  // OutOfRange
      return Errc::kInvalidArgument;
    case 5:  // NotFound (lease not found)
      return Errc::kNotFound;
    case 6:  // AlreadyExists
      return Errc::kAlreadyExists;
    case 7:   // PermissionDenied
    case 16:  // Unauthenticated
      return Errc::kPermissionDenied;
    case 8:  // ResourceExhausted (database space exceeded, too many requests)
      return Errc::kResourceExhausted;
    case 9:  // FailedPrecondition
      return Errc::kFailedPrecondition;
    case 12:  // Unimplemented
      return Errc::kUnsupported;
    default:  // Canceled, Unknown, DeadlineExceeded, Aborted, Internal, Unavailable
      return std::nullopt;
  }
}

}  // namespace

struct EtcdClient::Impl {
  EtcdOptions options;
  std::unique_ptr<CURL, CurlDeleter> curl;
  std::unique_ptr<curl_slist, SlistDeleter> headers;
  size_t current = 0;  // index of the endpoint that answered last
  std::array<char, CURL_ERROR_SIZE> error_buffer{};

  // One attempt's outcome: an etcd answer (the JSON object), etcd's final
  // error, or why this endpoint is skipped.
  struct Attempt {
    Failure failure = Failure::kNone;
    std::string reason;  // for kFailure != kNone
    json answer;
    std::optional<Status> error;  // etcd answered with a final error
  };

  Attempt attempt(const std::string& endpoint, const std::string& path, const std::string& request,
                  std::chrono::milliseconds budget);

  // POSTs `request` to /v3/<path> (e.g. "kv/range"). The answer's JSON
  // object, or etcd's final error, or why no endpoint answered.
  Result<json> call(const std::string& path, const json& request);
};

EtcdClient::Impl::Attempt EtcdClient::Impl::attempt(const std::string& endpoint,
                                                    const std::string& path,
                                                    const std::string& request,
                                                    std::chrono::milliseconds budget) {
  Attempt out;
  CURL* c = curl.get();
  Body body;
  std::string url = endpoint + "/v3/" + path;
  long ms = std::max<long>(1, static_cast<long>(budget.count()));  // 0 would be "no limit"
  error_buffer[0] = '\0';
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.size()));
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ms);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, nullptr);
  if (rc != CURLE_OK) {
    std::string detail = error_buffer[0] != '\0' ? error_buffer.data() : curl_easy_strerror(rc);
    if (rc == CURLE_OPERATION_TIMEDOUT) {
      out.failure = Failure::kTimeout;
      out.reason = "no answer within " + std::to_string(ms) + " ms";
    } else if (body.too_large || rc == CURLE_FILESIZE_EXCEEDED) {
      out.failure = Failure::kNotEtcd;
      out.reason = "answer larger than " + std::to_string(kMaxAnswerBytes >> 20) + " MiB";
    } else if (rc == CURLE_COULDNT_CONNECT) {
      long os_errno = 0;
      curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
      out.failure = Failure::kUnreachable;
      out.reason = os_errno == ECONNREFUSED ? std::string("connection refused")
                   : os_errno != 0 ? "cannot connect: " + std::string(std::strerror(int(os_errno)))
                                   : "cannot connect: " + detail;
    } else if (rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT) {
      out.failure = Failure::kUnreachable;
      out.reason = "bad endpoint (" + detail + ")";
    } else {
      out.failure = Failure::kUnreachable;
      out.reason = detail;
    }
    return out;
  }
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  json answer = json::parse(body.data, nullptr, /*allow_exceptions=*/false);
  const bool is_object = answer.is_object();
  // etcd's errors: {"error":"..","code":N,"message":".."} with a 4xx/5xx; a
  // streaming call (keepalive) sends {"error":{"grpc_code":N,"message":..}}.
  const json* error = nullptr;
  if (is_object && answer.contains("code") && answer["code"].is_number_integer() &&
      (answer.contains("message") || answer.contains("error"))) {
    error = &answer;
  } else if (is_object && answer.contains("error") && answer["error"].is_object() &&
             answer["error"].contains("grpc_code")) {
    error = &answer["error"];
  }
  if (error != nullptr) {
    int64_t code = 0;
    if (auto it = error->find(error == &answer ? "code" : "grpc_code");
        it != error->end() && it->is_number_integer()) {
      code = it->get<int64_t>();
    }
    std::string message;
    if (auto it = error->find("message"); it != error->end() && it->is_string()) {
      message = it->get<std::string>();
    } else if (auto e = error->find("error"); e != error->end() && e->is_string()) {
      message = e->get<std::string>();
    }
    if (auto errc = final_errc(code)) {
      out.error = Status(*errc, "etcd " + path + ": " + endpoint + " answered: " + message);
    } else {
      out.failure = code == 4 ? Failure::kTimeout : Failure::kUnavailable;
      out.reason = message + " (code " + std::to_string(code) + ")";
    }
    return out;
  }
  if (status < 200 || status > 299) {
    out.failure = Failure::kNotEtcd;
    out.reason = "HTTP " + std::to_string(status) + ": '" + excerpt(body.data) + "'";
    return out;
  }
  if (!is_object || !(answer.contains("header") || answer.contains("result"))) {
    out.failure = Failure::kNotEtcd;
    out.reason = "answer is not etcd's JSON: '" + excerpt(body.data) + "'";
    return out;
  }
  out.answer = std::move(answer);
  return out;
}

Result<json> EtcdClient::Impl::call(const std::string& path, const json& request) {
  const std::string text = request.dump();
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  const size_t n = options.endpoints.size();
  // The endpoints to try, in order, starting with the one that answered last.
  std::vector<size_t> queue;
  for (size_t i = 0; i < n; ++i) queue.push_back((current + i) % n);
  std::string reasons;
  auto add_reason = [&](size_t index, const std::string& reason) {
    reasons += (reasons.empty() ? "" : "; ") + options.endpoints[index] + ": " + reason;
  };
  bool timed_out = false, not_etcd = false, unavailable = false;
  for (size_t next = 0; next < queue.size(); ++next) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      for (size_t i = next; i < queue.size() && i < n; ++i) {
        add_reason(queue[i], "not tried (no time left)");
      }
      break;
    }
    // Each endpoint still to try gets an equal share of the time left, so
    // that one that hangs (a stopped process, a partition) does not eat the
    // whole call; what one that fails fast leaves goes to the others.
    auto budget = left / static_cast<long>(queue.size() - next);
    const size_t index = queue[next];
    Attempt a = attempt(options.endpoints[index], path, text, budget);
    if (a.failure == Failure::kNone) {
      current = index;
      if (a.error) return std::move(*a.error);
      return std::move(a.answer);
    }
    timed_out |= a.failure == Failure::kTimeout;
    not_etcd |= a.failure == Failure::kNotEtcd;
    unavailable |= a.failure == Failure::kUnavailable;
    add_reason(index, a.reason);
    // An endpoint that was slow rather than dead is asked again with what
    // the others left (once: its share then is all the time there is).
    if (a.failure == Failure::kTimeout && queue.size() < 2 * n) queue.push_back(index);
  }
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  if (timed_out) {
    return Status(Errc::kTimeout, "etcd " + path + ": no endpoint answered within " +
                                      std::to_string(options.timeout.count()) + " ms (" + reasons +
                                      ")");
  }
  if (not_etcd) {
    return Status(Errc::kProtocolError,
                  "etcd " + path + ": no endpoint gave an etcd answer (" + reasons + ")");
  }
  return Status(
      Errc::kConnectionError,
      "etcd " + path + ": " +
          (unavailable ? "no endpoint could serve the request" : "no endpoint could be reached") +
          " (after " + std::to_string(took) + " ms: " + reasons + ")");
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::create(EtcdOptions options) {
  if (options.endpoints.empty()) {
    return Status(Errc::kInvalidArgument, "etcd: no endpoints given");
  }
  for (auto& endpoint : options.endpoints) {
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://")) {
      return Status(Errc::kInvalidArgument,
                    "etcd: endpoint '" + endpoint +
                        "' is not a URL such as http://127.0.0.1:2379 or https://host:2379");
    }
  }
  if (options.timeout.count() <= 0) {
    return Status(Errc::kInvalidArgument, "etcd: the timeout must be positive");
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return Status(Errc::kInvalidArgument,
                  "etcd: a client certificate needs its key and the other way round "
                  "(tls_cert and tls_key)");
  }
  global_init();
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->curl.reset(curl_easy_init());
  if (!impl->curl) return Status(Errc::kResourceExhausted, "etcd: curl_easy_init failed");
  // "Expect:": no "100-continue" round trip before larger bodies.
  for (const char* header : {"Content-Type: application/json", "Expect:"}) {
    curl_slist* list = curl_slist_append(impl->headers.get(), header);
    if (list == nullptr) {
      impl->headers.reset();
      break;
    }
    impl->headers.release();
    impl->headers.reset(list);
  }
  if (!impl->headers) return Status(Errc::kResourceExhausted, "etcd: curl_slist_append failed");
  CURL* c = impl->curl.get();
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, impl->headers.get());
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &write_body);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, impl->error_buffer.data());
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(kMaxAnswerBytes));
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  // etcd is reached directly: http_proxy & co. of the environment are not
  // for it.
  curl_easy_setopt(c, CURLOPT_PROXY, "");
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
  const auto& o = impl->options;
  if (!o.tls_ca.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, o.tls_ca.c_str());
  if (!o.tls_cert.empty()) {
    curl_easy_setopt(c, CURLOPT_SSLCERT, o.tls_cert.c_str());
    curl_easy_setopt(c, CURLOPT_SSLKEY, o.tls_key.c_str());
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

const std::string& EtcdClient::current_endpoint() const {
  return impl_->options.endpoints[impl_->current];
}

namespace {

Status malformed(const std::string& what, const json& answer) {
  return Status(Errc::kProtocolError,
                "etcd " + what + ": malformed answer: '" + excerpt(answer.dump()) + "'");
}

// A txn's "succeeded".
Result<bool> txn_succeeded(const json& answer) {
  auto succeeded = bool_field(answer, "succeeded");
  if (!succeeded) return malformed("kv/txn", answer);
  return *succeeded;
}

json put_op(const std::string& key, const std::string& value, int64_t lease_id) {
  json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease_id != 0) put["lease"] = lease_text(lease_id);
  return json{{"request_put", std::move(put)}};
}

// The compares "key exists and is attached to lease_id".
json held_compares(const std::string& key, int64_t lease_id) {
  const std::string k = base64_encode(key);
  return json::array({
      {{"key", k}, {"result", "GREATER"}, {"target", "CREATE"}, {"create_revision", "0"}},
      {{"key", k}, {"result", "EQUAL"}, {"target", "LEASE"}, {"lease", lease_text(lease_id)}},
  });
}

Result<EtcdKeyValue> parse_kv(const json& kv) {
  if (!kv.is_object()) return malformed("kv/range", kv);
  EtcdKeyValue out;
  auto key = bytes_field(kv, "key");
  auto value = bytes_field(kv, "value");
  auto create = int_field(kv, "create_revision");
  auto mod = int_field(kv, "mod_revision");
  auto lease = int_field(kv, "lease");
  if (!key || !value || !create || !mod || !lease) return malformed("kv/range", kv);
  out.key = std::move(*key);
  out.value = std::move(*value);
  out.create_revision = *create;
  out.mod_revision = *mod;
  out.lease = *lease;
  return out;
}

Result<std::vector<EtcdKeyValue>> parse_range(const json& answer) {
  std::vector<EtcdKeyValue> out;
  auto it = answer.find("kvs");
  if (it == answer.end() || it->is_null()) return out;
  if (!it->is_array()) return malformed("kv/range", answer);
  for (const auto& kv : *it) {
    PMIRROR_ASSIGN_OR_RETURN(auto parsed, parse_kv(kv));
    out.push_back(std::move(parsed));
  }
  return out;
}

}  // namespace

Result<EtcdLease> EtcdClient::grant_lease(std::chrono::seconds ttl) {
  if (ttl.count() <= 0) {
    return Status(Errc::kInvalidArgument, "etcd lease/grant: the TTL must be positive");
  }
  PMIRROR_ASSIGN_OR_RETURN(auto answer, impl_->call("lease/grant", {{"TTL", ttl.count()}}));
  if (auto e = answer.find("error"); e != answer.end() && e->is_string() && !e->empty()) {
    return Status(Errc::kFailedPrecondition, "etcd lease/grant: " + e->get<std::string>());
  }
  auto id = int_field(answer, "ID");
  auto granted = int_field(answer, "TTL");
  if (!id || !granted || *id == 0) return malformed("lease/grant", answer);
  return EtcdLease{*id, std::chrono::seconds(*granted)};
}

Result<std::chrono::seconds> EtcdClient::keep_alive(int64_t lease_id) {
  auto answer = impl_->call("lease/keepalive", {{"ID", lease_text(lease_id)}});
  if (!answer.ok()) {
    if (answer.status().code() == Errc::kNotFound) return std::chrono::seconds(0);
    return answer.status();
  }
  auto it = answer->find("result");
  if (it == answer->end() || !it->is_object()) return malformed("lease/keepalive", *answer);
  auto ttl = int_field(*it, "TTL");
  if (!ttl) return malformed("lease/keepalive", *answer);
  return std::chrono::seconds(std::max<int64_t>(0, *ttl));
}

Status EtcdClient::revoke_lease(int64_t lease_id) {
  auto answer = impl_->call("lease/revoke", {{"ID", lease_text(lease_id)}});
  if (!answer.ok() && answer.status().code() != Errc::kNotFound) return answer.status();
  return Status::Ok();
}

Result<bool> EtcdClient::create_if_absent(const std::string& key, const std::string& value,
                                          int64_t lease_id) {
  json request = {
      {"compare", json::array({{{"key", base64_encode(key)},
                                {"result", "EQUAL"},
                                {"target", "CREATE"},
                                {"create_revision", "0"}}})},
      {"success", json::array({put_op(key, value, lease_id)})},
      {"failure", json::array()},
  };
  PMIRROR_ASSIGN_OR_RETURN(auto answer, impl_->call("kv/txn", request));
  return txn_succeeded(answer);
}

Result<bool> EtcdClient::update_if_held(const std::string& key, const std::string& value,
                                        int64_t lease_id) {
  json request = {
      {"compare", held_compares(key, lease_id)},
      {"success", json::array({put_op(key, value, lease_id)})},
      {"failure", json::array()},
  };
  PMIRROR_ASSIGN_OR_RETURN(auto answer, impl_->call("kv/txn", request));
  return txn_succeeded(answer);
}

Result<bool> EtcdClient::delete_if_held(const std::string& key, int64_t lease_id) {
  json request = {
      {"compare", held_compares(key, lease_id)},
      {"success", json::array({{{"request_delete_range", {{"key", base64_encode(key)}}}}})},
      {"failure", json::array()},
  };
  PMIRROR_ASSIGN_OR_RETURN(auto answer, impl_->call("kv/txn", request));
  return txn_succeeded(answer);
}

Status EtcdClient::put(const std::string& key, const std::string& value, int64_t lease_id) {
  json request = put_op(key, value, lease_id)["request_put"];
  return impl_->call("kv/put", request).status();
}

Result<std::optional<EtcdKeyValue>> EtcdClient::get(const std::string& key) {
  PMIRROR_ASSIGN_OR_RETURN(auto answer, impl_->call("kv/range", {{"key", base64_encode(key)}}));
  PMIRROR_ASSIGN_OR_RETURN(auto kvs, parse_range(answer));
  if (kvs.empty()) return std::optional<EtcdKeyValue>();
  if (kvs.size() > 1 || kvs[0].key != key) return malformed("kv/range", answer);
  return std::optional<EtcdKeyValue>(std::move(kvs[0]));
}

Result<std::vector<EtcdKeyValue>> EtcdClient::get_prefix(const std::string& prefix) {
  // etcd refuses an empty key; "\0" is the first key there can be.
  const std::string from = prefix.empty() ? std::string(1, '\0') : prefix;
  json request = {{"key", base64_encode(from)}, {"range_end", base64_encode(prefix_end(prefix))}};
  PMIRROR_ASSIGN_OR_RETURN(auto answer, impl_->call("kv/range", request));
  return parse_range(answer);
}

}  // namespace pmirror::failover
