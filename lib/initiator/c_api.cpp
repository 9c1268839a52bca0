// The C API (include/pmirror/pmirror.h) over pmirror::Volume. Every entry
// point that can fail runs in guarded(): an exception (std::bad_alloc, say)
// must not unwind into C frames.
#include <pmirror/pmirror.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>

#include "common/log.h"
#include "common/version.h"
#include "initiator/initiator.h"
#include "metadata/metadata.h"

struct pmirror_cfg {
  pmirror::VolumeOptions options;
};

struct pmirror_volume {
  std::unique_ptr<pmirror::Volume> volume;
};

struct pmirror_verify_result {
  std::vector<pmirror::VerifyPeerResult> peers;
};

namespace {

using pmirror::Errc;
using pmirror::Status;

// The C codes are Errc negated: one table of classes for both APIs.
constexpr int c_code(Errc code) { return static_cast<int>(code); }
static_assert(c_code(Errc::kInvalidArgument) == PMIRROR_E_INVALID_ARGUMENT);
static_assert(c_code(Errc::kNotFound) == PMIRROR_E_NOT_FOUND);
static_assert(c_code(Errc::kPermissionDenied) == PMIRROR_E_PERMISSION_DENIED);
static_assert(c_code(Errc::kAlreadyExists) == PMIRROR_E_ALREADY_EXISTS);
static_assert(c_code(Errc::kIoError) == PMIRROR_E_IO);
static_assert(c_code(Errc::kProtocolError) == PMIRROR_E_PROTOCOL);
static_assert(c_code(Errc::kConnectionError) == PMIRROR_E_CONNECTION);
static_assert(c_code(Errc::kTimeout) == PMIRROR_E_TIMEOUT);
static_assert(c_code(Errc::kUnsupported) == PMIRROR_E_UNSUPPORTED);
static_assert(c_code(Errc::kBusy) == PMIRROR_E_BUSY);
static_assert(c_code(Errc::kConfigError) == PMIRROR_E_CONFIG);
static_assert(c_code(Errc::kInternal) == PMIRROR_E_INTERNAL);
static_assert(c_code(Errc::kClosed) == PMIRROR_E_CLOSED);
static_assert(c_code(Errc::kResourceExhausted) == PMIRROR_E_RESOURCE_EXHAUSTED);
static_assert(c_code(Errc::kSplitBrain) == PMIRROR_E_SPLIT_BRAIN);
static_assert(c_code(Errc::kFailedPrecondition) == PMIRROR_E_FAILED_PRECONDITION);
static_assert(c_code(Errc::kFenced) == PMIRROR_E_FENCED);
static_assert(c_code(Errc::kLeaseLost) == PMIRROR_E_LEASE_LOST);
// A class appended to Errc gets its PMIRROR_E_* name and an assert here
// (c_api_test checks that the code after the last is unknown).

constexpr uint16_t kDefaultPort = 7450;

thread_local std::string last_error;

int fail(const Status& status) {
  last_error = status.message();
  return -c_code(status.code());
}

int invalid(std::string message) {
  return fail(Status(Errc::kInvalidArgument, std::move(message)));
}

int ok() {
  last_error.clear();
  return 0;
}

template <typename F>
int guarded(F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
    return -PMIRROR_E_RESOURCE_EXHAUSTED;
  } catch (const std::exception& e) {
    last_error = std::string("internal error: ") + e.what();
  } catch (...) {
    last_error = "internal error: unknown exception";
  }
  return -PMIRROR_E_INTERNAL;
}

int check_volume(const pmirror_volume* volume) {
  if (volume == nullptr || !volume->volume) return invalid("volume is NULL");
  return 0;
}

// A getter: `out` must not be NULL; copies the field through `get`.
template <typename Object, typename T, typename Get>
int get_field(const Object* object, const char* object_name, T* out, const char* field, Get get) {
  return guarded([&] {
    if (object == nullptr) return invalid(std::string(object_name) + " is NULL");
    if (out == nullptr) return invalid(std::string(field) + " (the out-pointer) is NULL");
    *out = get(*object);
    return ok();
  });
}

template <typename T, typename Get>
int get_cfg(const pmirror_cfg* cfg, T* out, const char* field, Get get) {
  return get_field(cfg, "cfg", out, field, get);
}

// A setter: runs `set` on the options; it returns 0 or invalid(...).
template <typename Set>
int set_cfg(pmirror_cfg* cfg, Set set) {
  return guarded([&] {
    if (cfg == nullptr) return invalid("cfg is NULL");
    int rc = set(cfg->options);
    return rc == 0 ? ok() : rc;
  });
}

int set_required_string(pmirror_cfg* cfg, std::string pmirror::VolumeOptions::*field,
                        const char* value, const char* name) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (value == nullptr || *value == '\0') {
      return invalid(std::string(name) + " must not be NULL or empty");
    }
    o.*field = value;
    return 0;
  });
}

int set_milliseconds(pmirror_cfg* cfg, std::chrono::milliseconds pmirror::VolumeOptions::*field,
                     uint32_t value, const char* name, bool zero_allowed) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (value == 0 && !zero_allowed) return invalid(std::string(name) + " must be at least 1 ms");
    o.*field = std::chrono::milliseconds(value);
    return 0;
  });
}

uint32_t milliseconds(std::chrono::milliseconds value) {
  return static_cast<uint32_t>(
      std::min<int64_t>(value.count(), std::numeric_limits<uint32_t>::max()));
}

const pmirror::VerifyPeerResult* verify_peer(const pmirror_verify_result* result, size_t peer) {
  if (result == nullptr) {
    (void)invalid("result is NULL");
    return nullptr;
  }
  if (peer >= result->peers.size()) {
    (void)invalid("peer index " + std::to_string(peer) + " is out of range: the result has " +
                  std::to_string(result->peers.size()) + " peers");
    return nullptr;
  }
  return &result->peers[peer];
}

// A getter of one compared peer's field.
template <typename T, typename Get>
int get_verify(const pmirror_verify_result* result, size_t peer, T* out, const char* field,
               Get get) {
  return guarded([&] {
    const pmirror::VerifyPeerResult* entry = verify_peer(result, peer);
    if (entry == nullptr) return -PMIRROR_E_INVALID_ARGUMENT;
    if (out == nullptr) return invalid(std::string(field) + " (the out-pointer) is NULL");
    *out = get(*entry);
    return ok();
  });
}

}  // namespace

extern "C" {

// ----------------------------------------------------------------- errors

const char* pmirror_strerror(int error) {
  // Compared as a long: -INT_MIN does not fit an int.
  long code = error < 0 ? -static_cast<long>(error) : error;
  if (code > std::numeric_limits<uint16_t>::max()) return "unknown error";
  // errc_name's views are of string literals: NUL-terminated, static.
  return pmirror::errc_name(static_cast<Errc>(code)).data();
}

const char* pmirror_errormsg(void) { return last_error.c_str(); }

// ---------------------------------------------------------------- version

void pmirror_version(int* major, int* minor, int* patch) {
  if (major != nullptr) *major = PMIRROR_VERSION_MAJOR;
  if (minor != nullptr) *minor = PMIRROR_VERSION_MINOR;
  if (patch != nullptr) *patch = PMIRROR_VERSION_PATCH;
}

const char* pmirror_version_string(void) { return PMIRROR_VERSION_STRING; }

// -------------------------------------------------------------------- log

// The C levels are spdlog's, in the same order.
static_assert(PMIRROR_LOG_TRACE == static_cast<int>(spdlog::level::trace));
static_assert(PMIRROR_LOG_INFO == static_cast<int>(spdlog::level::info));
static_assert(PMIRROR_LOG_OFF == static_cast<int>(spdlog::level::off));

int pmirror_log_set_function(pmirror_log_function* function, void* arg) {
  return guarded([&] {
    if (function == nullptr) {
      pmirror::log::set_function({});
      return ok();
    }
    pmirror::log::set_function(
        [function, arg](spdlog::level::level_enum level, std::string_view message) {
          std::string line(message);  // NUL-terminated for C
          function(static_cast<pmirror_log_level>(level), line.c_str(), arg);
        });
    return ok();
  });
}

int pmirror_log_set_threshold(enum pmirror_log_level threshold) {
  return guarded([&] {
    int level = static_cast<int>(threshold);
    if (level < PMIRROR_LOG_TRACE || level > PMIRROR_LOG_OFF) {
      return invalid("log threshold " + std::to_string(level) +
                     " is not a pmirror_log_level (PMIRROR_LOG_TRACE .. PMIRROR_LOG_OFF)");
    }
    pmirror::log::set_level(static_cast<spdlog::level::level_enum>(level));
    return ok();
  });
}

int pmirror_log_get_threshold(enum pmirror_log_level* threshold) {
  return guarded([&] {
    if (threshold == nullptr) return invalid("threshold (the out-pointer) is NULL");
    *threshold = static_cast<pmirror_log_level>(pmirror::log::level());
    return ok();
  });
}

// -------------------------------------------------------------------- cfg

int pmirror_cfg_new(struct pmirror_cfg** cfg_ptr) {
  return guarded([&] {
    if (cfg_ptr == nullptr) return invalid("cfg_ptr is NULL");
    *cfg_ptr = new pmirror_cfg{};
    return ok();
  });
}

int pmirror_cfg_delete(struct pmirror_cfg** cfg_ptr) {
  return guarded([&] {
    if (cfg_ptr == nullptr) return invalid("cfg_ptr is NULL");
    delete *cfg_ptr;
    *cfg_ptr = nullptr;
    return ok();
  });
}

int pmirror_cfg_set_name(struct pmirror_cfg* cfg, const char* name) {
  return set_required_string(cfg, &pmirror::VolumeOptions::name, name, "name");
}
int pmirror_cfg_get_name(const struct pmirror_cfg* cfg, const char** name) {
  return get_cfg(cfg, name, "name", [](const pmirror_cfg& c) { return c.options.name.c_str(); });
}

int pmirror_cfg_set_local_path(struct pmirror_cfg* cfg, const char* path) {
  return set_required_string(cfg, &pmirror::VolumeOptions::local_path, path, "local_path");
}
int pmirror_cfg_get_local_path(const struct pmirror_cfg* cfg, const char** path) {
  return get_cfg(cfg, path, "path",
                 [](const pmirror_cfg& c) { return c.options.local_path.c_str(); });
}

int pmirror_cfg_set_size(struct pmirror_cfg* cfg, uint64_t size) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    o.size = size;
    return 0;
  });
}
int pmirror_cfg_get_size(const struct pmirror_cfg* cfg, uint64_t* size) {
  return get_cfg(cfg, size, "size", [](const pmirror_cfg& c) { return c.options.size; });
}

int pmirror_cfg_set_create(struct pmirror_cfg* cfg, bool create) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    o.create = create;
    return 0;
  });
}
int pmirror_cfg_get_create(const struct pmirror_cfg* cfg, bool* create) {
  return get_cfg(cfg, create, "create", [](const pmirror_cfg& c) { return c.options.create; });
}

int pmirror_cfg_set_identity(struct pmirror_cfg* cfg, const char* identity) {
  return set_required_string(cfg, &pmirror::VolumeOptions::identity, identity, "identity");
}
int pmirror_cfg_get_identity(const struct pmirror_cfg* cfg, const char** identity) {
  return get_cfg(cfg, identity, "identity",
                 [](const pmirror_cfg& c) { return c.options.identity.c_str(); });
}

int pmirror_cfg_add_replica(struct pmirror_cfg* cfg, const char* address, uint16_t port,
                            const char* transport, const char* secret, const char* node) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (address == nullptr || *address == '\0') {
      return invalid("replica address must not be NULL or empty");
    }
    if (o.replicas.size() >= pmirror::metadata::kMaxPeers) {
      return invalid("replica " + std::string(address) + ": a volume has at most " +
                     std::to_string(pmirror::metadata::kMaxPeers) + " replicas");
    }
    pmirror::ReplicaSpec spec;
    spec.address = address;
    spec.port = port != 0 ? port : kDefaultPort;
    spec.transport = transport != nullptr ? transport : "tcp";
    // Only what a configuration can name (tcp, rdma); never the tests' fake.
    if (auto kind = pmirror::transport::parse_kind(spec.transport); !kind.ok()) {
      return fail(kind.status().with_context("replica " + spec.address));
    }
    spec.secret = secret != nullptr ? secret : "";
    spec.node = node != nullptr ? node : "";
    o.replicas.push_back(std::move(spec));
    return 0;
  });
}

int pmirror_cfg_clear_replicas(struct pmirror_cfg* cfg) {
  return set_cfg(cfg, [](pmirror::VolumeOptions& o) {
    o.replicas.clear();
    return 0;
  });
}

int pmirror_cfg_get_replica_count(const struct pmirror_cfg* cfg, size_t* count) {
  return get_cfg(cfg, count, "count",
                 [](const pmirror_cfg& c) { return c.options.replicas.size(); });
}

int pmirror_cfg_get_replica(const struct pmirror_cfg* cfg, size_t index, const char** address,
                            uint16_t* port, const char** transport, const char** node) {
  return guarded([&] {
    if (cfg == nullptr) return invalid("cfg is NULL");
    if (index >= cfg->options.replicas.size()) {
      return invalid("replica index " + std::to_string(index) + " is out of range: the cfg has " +
                     std::to_string(cfg->options.replicas.size()) + " replicas");
    }
    const pmirror::ReplicaSpec& spec = cfg->options.replicas[index];
    if (address != nullptr) *address = spec.address.c_str();
    if (port != nullptr) *port = spec.port;
    if (transport != nullptr) *transport = spec.transport.c_str();
    if (node != nullptr) *node = spec.node.c_str();
    return ok();
  });
}

int pmirror_cfg_set_ack(struct pmirror_cfg* cfg, uint32_t ack) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    o.ack = ack;
    return 0;
  });
}
int pmirror_cfg_get_ack(const struct pmirror_cfg* cfg, uint32_t* ack) {
  return get_cfg(cfg, ack, "ack", [](const pmirror_cfg& c) { return c.options.ack; });
}

int pmirror_cfg_set_on_insufficient(struct pmirror_cfg* cfg, enum pmirror_on_insufficient policy) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (policy != PMIRROR_ON_INSUFFICIENT_FAIL && policy != PMIRROR_ON_INSUFFICIENT_BLOCK) {
      return invalid("on_insufficient " + std::to_string(static_cast<int>(policy)) +
                     " is not PMIRROR_ON_INSUFFICIENT_FAIL or PMIRROR_ON_INSUFFICIENT_BLOCK");
    }
    o.block_when_insufficient = policy == PMIRROR_ON_INSUFFICIENT_BLOCK;
    return 0;
  });
}
int pmirror_cfg_get_on_insufficient(const struct pmirror_cfg* cfg,
                                    enum pmirror_on_insufficient* policy) {
  return get_cfg(cfg, policy, "policy", [](const pmirror_cfg& c) {
    return c.options.block_when_insufficient ? PMIRROR_ON_INSUFFICIENT_BLOCK
                                             : PMIRROR_ON_INSUFFICIENT_FAIL;
  });
}

int pmirror_cfg_set_split_brain(struct pmirror_cfg* cfg, enum pmirror_split_brain policy) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (policy != PMIRROR_SPLIT_BRAIN_REFUSE && policy != PMIRROR_SPLIT_BRAIN_OVERWRITE_REPLICA) {
      return invalid("split_brain " + std::to_string(static_cast<int>(policy)) +
                     " is not PMIRROR_SPLIT_BRAIN_REFUSE or "
                     "PMIRROR_SPLIT_BRAIN_OVERWRITE_REPLICA");
    }
    o.overwrite_split_brain = policy == PMIRROR_SPLIT_BRAIN_OVERWRITE_REPLICA;
    return 0;
  });
}
int pmirror_cfg_get_split_brain(const struct pmirror_cfg* cfg, enum pmirror_split_brain* policy) {
  return get_cfg(cfg, policy, "policy", [](const pmirror_cfg& c) {
    return c.options.overwrite_split_brain ? PMIRROR_SPLIT_BRAIN_OVERWRITE_REPLICA
                                           : PMIRROR_SPLIT_BRAIN_REFUSE;
  });
}

int pmirror_cfg_set_method(struct pmirror_cfg* cfg, enum pmirror_method method) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (method != PMIRROR_METHOD_AUTO && method != PMIRROR_METHOD_GPSPM) {
      return invalid("method " + std::to_string(static_cast<int>(method)) +
                     " is not PMIRROR_METHOD_AUTO or PMIRROR_METHOD_GPSPM");
    }
    o.method = method == PMIRROR_METHOD_GPSPM ? pmirror::MethodPreference::kGpspm
                                              : pmirror::MethodPreference::kAuto;
    return 0;
  });
}
int pmirror_cfg_get_method(const struct pmirror_cfg* cfg, enum pmirror_method* method) {
  return get_cfg(cfg, method, "method", [](const pmirror_cfg& c) {
    return c.options.method == pmirror::MethodPreference::kGpspm ? PMIRROR_METHOD_GPSPM
                                                                 : PMIRROR_METHOD_AUTO;
  });
}

int pmirror_cfg_set_max_in_flight(struct pmirror_cfg* cfg, uint32_t max_in_flight) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (max_in_flight == 0) return invalid("max_in_flight must be at least 1");
    o.max_in_flight = max_in_flight;
    return 0;
  });
}
int pmirror_cfg_get_max_in_flight(const struct pmirror_cfg* cfg, uint32_t* max_in_flight) {
  return get_cfg(cfg, max_in_flight, "max_in_flight",
                 [](const pmirror_cfg& c) { return c.options.max_in_flight; });
}

int pmirror_cfg_set_snapshot_buffer(struct pmirror_cfg* cfg, uint64_t bytes) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    o.snapshot_buffer = bytes;
    return 0;
  });
}
int pmirror_cfg_get_snapshot_buffer(const struct pmirror_cfg* cfg, uint64_t* bytes) {
  return get_cfg(cfg, bytes, "bytes",
                 [](const pmirror_cfg& c) { return c.options.snapshot_buffer; });
}

int pmirror_cfg_set_poll(struct pmirror_cfg* cfg, enum pmirror_poll poll) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    switch (poll) {
      case PMIRROR_POLL_ADAPTIVE:
        o.poll = pmirror::PollMode::kAdaptive;
        return 0;
      case PMIRROR_POLL_EVENT:
        o.poll = pmirror::PollMode::kEvent;
        return 0;
      case PMIRROR_POLL_BUSY:
        o.poll = pmirror::PollMode::kBusy;
        return 0;
    }
    return invalid("poll " + std::to_string(static_cast<int>(poll)) +
                   " is not PMIRROR_POLL_ADAPTIVE, PMIRROR_POLL_EVENT or PMIRROR_POLL_BUSY");
  });
}
int pmirror_cfg_get_poll(const struct pmirror_cfg* cfg, enum pmirror_poll* poll) {
  return get_cfg(cfg, poll, "poll", [](const pmirror_cfg& c) {
    switch (c.options.poll) {
      case pmirror::PollMode::kEvent:
        return PMIRROR_POLL_EVENT;
      case pmirror::PollMode::kBusy:
        return PMIRROR_POLL_BUSY;
      case pmirror::PollMode::kAdaptive:
        break;
    }
    return PMIRROR_POLL_ADAPTIVE;
  });
}

int pmirror_cfg_set_connect_timeout(struct pmirror_cfg* cfg, uint32_t timeout_ms) {
  return set_milliseconds(cfg, &pmirror::VolumeOptions::connect_timeout, timeout_ms,
                          "connect_timeout", false);
}
int pmirror_cfg_get_connect_timeout(const struct pmirror_cfg* cfg, uint32_t* timeout_ms) {
  return get_cfg(cfg, timeout_ms, "timeout_ms",
                 [](const pmirror_cfg& c) { return milliseconds(c.options.connect_timeout); });
}

int pmirror_cfg_set_operation_timeout(struct pmirror_cfg* cfg, uint32_t timeout_ms) {
  return set_milliseconds(cfg, &pmirror::VolumeOptions::operation_timeout, timeout_ms,
                          "operation_timeout", false);
}
int pmirror_cfg_get_operation_timeout(const struct pmirror_cfg* cfg, uint32_t* timeout_ms) {
  return get_cfg(cfg, timeout_ms, "timeout_ms",
                 [](const pmirror_cfg& c) { return milliseconds(c.options.operation_timeout); });
}

int pmirror_cfg_set_heartbeat_interval(struct pmirror_cfg* cfg, uint32_t interval_ms) {
  return set_milliseconds(cfg, &pmirror::VolumeOptions::heartbeat_interval, interval_ms,
                          "heartbeat_interval", false);
}
int pmirror_cfg_get_heartbeat_interval(const struct pmirror_cfg* cfg, uint32_t* interval_ms) {
  return get_cfg(cfg, interval_ms, "interval_ms",
                 [](const pmirror_cfg& c) { return milliseconds(c.options.heartbeat_interval); });
}

int pmirror_cfg_set_reconnect_backoff(struct pmirror_cfg* cfg, uint32_t initial_ms,
                                      uint32_t max_ms) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (initial_ms == 0) return invalid("reconnect backoff: initial_ms must be at least 1 ms");
    if (max_ms < initial_ms) {
      return invalid("reconnect backoff: max_ms " + std::to_string(max_ms) +
                     " is below initial_ms " + std::to_string(initial_ms));
    }
    o.reconnect_initial = std::chrono::milliseconds(initial_ms);
    o.reconnect_max = std::chrono::milliseconds(max_ms);
    return 0;
  });
}
int pmirror_cfg_get_reconnect_backoff(const struct pmirror_cfg* cfg, uint32_t* initial_ms,
                                      uint32_t* max_ms) {
  return guarded([&] {
    if (cfg == nullptr) return invalid("cfg is NULL");
    if (initial_ms == nullptr || max_ms == nullptr) {
      return invalid("initial_ms and max_ms (the out-pointers) must not be NULL");
    }
    *initial_ms = milliseconds(cfg->options.reconnect_initial);
    *max_ms = milliseconds(cfg->options.reconnect_max);
    return ok();
  });
}

int pmirror_cfg_set_open_sync_timeout(struct pmirror_cfg* cfg, uint32_t timeout_ms) {
  return set_milliseconds(cfg, &pmirror::VolumeOptions::open_sync_timeout, timeout_ms,
                          "open_sync_timeout", true);
}
int pmirror_cfg_get_open_sync_timeout(const struct pmirror_cfg* cfg, uint32_t* timeout_ms) {
  return get_cfg(cfg, timeout_ms, "timeout_ms",
                 [](const pmirror_cfg& c) { return milliseconds(c.options.open_sync_timeout); });
}

int pmirror_cfg_set_metadata_path(struct pmirror_cfg* cfg, const char* path) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    o.metadata_path = path != nullptr ? path : "";
    return 0;
  });
}
int pmirror_cfg_get_metadata_path(const struct pmirror_cfg* cfg, const char** path) {
  return get_cfg(cfg, path, "path",
                 [](const pmirror_cfg& c) { return c.options.metadata_path.c_str(); });
}

int pmirror_cfg_set_chunk_size(struct pmirror_cfg* cfg, uint64_t chunk_size) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    using pmirror::metadata::kMaxChunk;
    using pmirror::metadata::kMinChunk;
    if (chunk_size < kMinChunk || chunk_size > kMaxChunk || !std::has_single_bit(chunk_size)) {
      return invalid("chunk_size " + std::to_string(chunk_size) + " must be a power of two from " +
                     std::to_string(kMinChunk) + " to " + std::to_string(kMaxChunk));
    }
    o.chunk_size = chunk_size;
    return 0;
  });
}
int pmirror_cfg_get_chunk_size(const struct pmirror_cfg* cfg, uint64_t* chunk_size) {
  return get_cfg(cfg, chunk_size, "chunk_size",
                 [](const pmirror_cfg& c) { return c.options.chunk_size; });
}

int pmirror_cfg_set_resync_rate(struct pmirror_cfg* cfg, uint64_t bytes_per_second) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    o.resync_rate = bytes_per_second;
    return 0;
  });
}
int pmirror_cfg_get_resync_rate(const struct pmirror_cfg* cfg, uint64_t* bytes_per_second) {
  return get_cfg(cfg, bytes_per_second, "bytes_per_second",
                 [](const pmirror_cfg& c) { return c.options.resync_rate; });
}

int pmirror_cfg_set_resync_step(struct pmirror_cfg* cfg, uint64_t bytes) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    if (bytes == 0) return invalid("resync_step must be at least 1 byte");
    o.resync_step = bytes;
    return 0;
  });
}
int pmirror_cfg_get_resync_step(const struct pmirror_cfg* cfg, uint64_t* bytes) {
  return get_cfg(cfg, bytes, "bytes", [](const pmirror_cfg& c) { return c.options.resync_step; });
}

int pmirror_cfg_set_require_promoted(struct pmirror_cfg* cfg, bool require) {
  return set_cfg(cfg, [&](pmirror::VolumeOptions& o) {
    o.require_promoted = require;
    return 0;
  });
}
int pmirror_cfg_get_require_promoted(const struct pmirror_cfg* cfg, bool* require) {
  return get_cfg(cfg, require, "require",
                 [](const pmirror_cfg& c) { return c.options.require_promoted; });
}

// ----------------------------------------------------------------- volume

int pmirror_open(const struct pmirror_cfg* cfg, pmirror_volume** volume_ptr) {
  return guarded([&] {
    if (volume_ptr == nullptr) return invalid("volume_ptr is NULL");
    *volume_ptr = nullptr;
    if (cfg == nullptr) return invalid("cfg is NULL");
    auto opened = pmirror::Volume::open(cfg->options);
    if (!opened.ok()) return fail(opened.status());
    *volume_ptr = new pmirror_volume{std::move(opened).value()};
    return ok();
  });
}

int pmirror_open_from_config(const char* config_path, const char* volume, const char* identity,
                             const char* node, pmirror_volume** volume_ptr) {
  return guarded([&] {
    if (volume_ptr == nullptr) return invalid("volume_ptr is NULL");
    *volume_ptr = nullptr;
    if (config_path == nullptr || volume == nullptr || identity == nullptr) {
      return invalid("config_path, volume and identity must not be NULL");
    }
    auto opened =
        pmirror::Volume::open_from_config(config_path, volume, identity, node ? node : "");
    if (!opened.ok()) return fail(opened.status());
    *volume_ptr = new pmirror_volume{std::move(opened).value()};
    return ok();
  });
}

int pmirror_close(pmirror_volume** volume_ptr) {
  return guarded([&] {
    if (volume_ptr == nullptr) return invalid("volume_ptr is NULL");
    delete *volume_ptr;
    *volume_ptr = nullptr;
    return ok();
  });
}

void* pmirror_data(const pmirror_volume* volume) {
  return volume && volume->volume ? volume->volume->data() : nullptr;
}

uint64_t pmirror_size(const pmirror_volume* volume) {
  return volume && volume->volume ? volume->volume->size() : 0;
}

bool pmirror_is_pmem(const pmirror_volume* volume) {
  return volume && volume->volume ? volume->volume->is_pmem() : false;
}

int pmirror_persist(pmirror_volume* volume, uint64_t offset, uint64_t length) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    Status s = volume->volume->persist(offset, length);
    return s.ok() ? ok() : fail(s);
  });
}

int pmirror_write(pmirror_volume* volume, uint64_t offset, const void* source, uint64_t length) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    if (source == nullptr && length > 0) return invalid("source is NULL");
    Status s = volume->volume->write(offset, source, length);
    return s.ok() ? ok() : fail(s);
  });
}

int pmirror_persist_async(pmirror_volume* volume, uint64_t offset, uint64_t length,
                          uint64_t* sequence) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    auto started = volume->volume->persist_async(offset, length);
    if (!started.ok()) return fail(started.status());
    if (sequence != nullptr) *sequence = *started;
    return ok();
  });
}

int pmirror_persist_ranges_async(pmirror_volume* volume, const struct pmirror_range* ranges,
                                 size_t count, const void* snapshot, uint64_t* sequence) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    if (ranges == nullptr && count > 0) return invalid("ranges is NULL");
    if (count == 0) return invalid("no ranges");
    // The C ranges as the C++ API's (kept per thread: no allocation once grown).
    thread_local std::vector<pmirror::PersistRange> list;
    list.resize(count);
    for (size_t i = 0; i < count; ++i) list[i] = {ranges[i].offset, ranges[i].length};
    auto started = volume->volume->persist_async(list.data(), count, snapshot);
    if (!started.ok()) return fail(started.status());
    if (sequence != nullptr) *sequence = *started;
    return ok();
  });
}

int pmirror_persist_ordered_async(pmirror_volume* volume, const struct pmirror_range* ranges,
                                  size_t count, const uint32_t* group_sizes, size_t groups,
                                  const void* snapshot, uint64_t* sequence) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    if (ranges == nullptr && count > 0) return invalid("ranges is NULL");
    if (count == 0) return invalid("no ranges");
    if (group_sizes == nullptr && groups > 0) return invalid("group_sizes is NULL");
    if (groups == 0) return invalid("no groups");
    thread_local std::vector<pmirror::PersistRange> list;
    list.resize(count);
    for (size_t i = 0; i < count; ++i) list[i] = {ranges[i].offset, ranges[i].length};
    auto started =
        volume->volume->persist_ordered_async(list.data(), count, group_sizes, groups, snapshot);
    if (!started.ok()) return fail(started.status());
    if (sequence != nullptr) *sequence = *started;
    return ok();
  });
}

int pmirror_wait(pmirror_volume* volume, uint64_t sequence) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    Status s = volume->volume->wait(sequence);
    return s.ok() ? ok() : fail(s);
  });
}

int pmirror_drain(pmirror_volume* volume) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    Status s = volume->volume->drain();
    return s.ok() ? ok() : fail(s);
  });
}

int pmirror_status(const pmirror_volume* volume, char** json_ptr) {
  return guarded([&] {
    if (json_ptr == nullptr) return invalid("json_ptr is NULL");
    *json_ptr = nullptr;
    if (int bad = check_volume(volume)) return bad;
    std::string json = volume->volume->status_json();
    // malloc, not new[]: the one allocator a C caller could also free with.
    auto* copy = static_cast<char*>(std::malloc(json.size() + 1));
    if (copy == nullptr) {
      return fail(Status(Errc::kResourceExhausted, "status: out of memory"));
    }
    std::memcpy(copy, json.c_str(), json.size() + 1);
    *json_ptr = copy;
    return ok();
  });
}

void pmirror_status_free(char** json_ptr) {
  if (json_ptr == nullptr) return;
  std::free(*json_ptr);
  *json_ptr = nullptr;
}

int pmirror_resync(pmirror_volume* volume, const char* peer, bool full) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    if (peer == nullptr || *peer == '\0') {
      return invalid("resync needs a peer: a replica's node name or host:port");
    }
    Status s = volume->volume->resync(peer, full);
    return s.ok() ? ok() : fail(s);
  });
}

// ----------------------------------------------------------------- verify

int pmirror_verify(pmirror_volume* volume, const char* peer, bool mark_dirty,
                   struct pmirror_verify_result** result_ptr) {
  return guarded([&] {
    if (result_ptr == nullptr) return invalid("result_ptr is NULL");
    *result_ptr = nullptr;
    if (int bad = check_volume(volume)) return bad;
    auto verified = volume->volume->verify(peer != nullptr ? peer : "", mark_dirty);
    if (!verified.ok()) return fail(verified.status());
    *result_ptr = new pmirror_verify_result{std::move(verified).value()};
    return ok();
  });
}

int pmirror_verify_result_delete(struct pmirror_verify_result** result_ptr) {
  return guarded([&] {
    if (result_ptr == nullptr) return invalid("result_ptr is NULL");
    delete *result_ptr;
    *result_ptr = nullptr;
    return ok();
  });
}

int pmirror_verify_result_get_peer_count(const struct pmirror_verify_result* result,
                                         size_t* count) {
  return get_field(result, "result", count, "count",
                   [](const pmirror_verify_result& r) { return r.peers.size(); });
}

int pmirror_verify_result_get_peer(const struct pmirror_verify_result* result, size_t peer,
                                   const char** name) {
  return get_verify(result, peer, name, "name",
                    [](const pmirror::VerifyPeerResult& p) { return p.peer.c_str(); });
}

int pmirror_verify_result_get_error(const struct pmirror_verify_result* result, size_t peer,
                                    int* error, const char** message) {
  return get_verify(result, peer, error, "error", [&](const pmirror::VerifyPeerResult& p) {
    if (message != nullptr) *message = p.status.message().c_str();
    return -c_code(p.status.code());
  });
}

int pmirror_verify_result_get_chunks_compared(const struct pmirror_verify_result* result,
                                              size_t peer, uint64_t* chunks) {
  return get_verify(result, peer, chunks, "chunks",
                    [](const pmirror::VerifyPeerResult& p) { return p.chunks_compared; });
}

int pmirror_verify_result_get_bytes_compared(const struct pmirror_verify_result* result,
                                             size_t peer, uint64_t* bytes) {
  return get_verify(result, peer, bytes, "bytes",
                    [](const pmirror::VerifyPeerResult& p) { return p.bytes_compared; });
}

int pmirror_verify_result_get_marked_dirty(const struct pmirror_verify_result* result, size_t peer,
                                           uint64_t* chunks) {
  return get_verify(result, peer, chunks, "chunks",
                    [](const pmirror::VerifyPeerResult& p) { return p.marked_dirty; });
}

int pmirror_verify_result_get_mismatch_count(const struct pmirror_verify_result* result,
                                             size_t peer, size_t* count) {
  return get_verify(result, peer, count, "count",
                    [](const pmirror::VerifyPeerResult& p) { return p.mismatches.size(); });
}

int pmirror_verify_result_get_mismatch(const struct pmirror_verify_result* result, size_t peer,
                                       size_t index, uint64_t* offset, uint64_t* length) {
  return guarded([&] {
    const pmirror::VerifyPeerResult* entry = verify_peer(result, peer);
    if (entry == nullptr) return -PMIRROR_E_INVALID_ARGUMENT;
    if (index >= entry->mismatches.size()) {
      return invalid("mismatch index " + std::to_string(index) + " is out of range: peer " +
                     entry->peer + " has " + std::to_string(entry->mismatches.size()) +
                     " mismatching ranges");
    }
    if (offset != nullptr) *offset = entry->mismatches[index].first;
    if (length != nullptr) *length = entry->mismatches[index].second;
    return ok();
  });
}

}  // extern "C"
