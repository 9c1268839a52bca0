/* Compiled as C: proves pmirror.h is a C header and the API works from C.
 * Each function returns 0, or non-zero with what went wrong in `error`;
 * c_api_test_main.cpp runs them against a real pmirrord and checks the
 * replica's bytes. */
#include <limits.h>
#include <pmirror/pmirror.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int failed(char* error, size_t error_size, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(error, error_size, format, args);
  va_end(args);
  return -1;
}

/* Fails the calling function unless `call` returned `expected`. */
#define EXPECT_RC(call, expected)                                                               \
  do {                                                                                          \
    int rc_ = (call);                                                                           \
    if (rc_ != (expected))                                                                      \
      return failed(error, error_size, "%s:%d: %s returned %d (%s: %s), expected %d", __FILE__, \
                    __LINE__, #call, rc_, pmirror_strerror(rc_), pmirror_errormsg(),            \
                    (int)(expected));                                                           \
  } while (0)

#define EXPECT_TRUE(condition)                                                                \
  do {                                                                                        \
    if (!(condition))                                                                         \
      return failed(error, error_size, "%s:%d: expected %s", __FILE__, __LINE__, #condition); \
  } while (0)

/* A bad value: -PMIRROR_E_INVALID_ARGUMENT with a message naming `word`. */
#define EXPECT_INVALID(call, word)                                                                \
  do {                                                                                            \
    EXPECT_RC(call, -PMIRROR_E_INVALID_ARGUMENT);                                                 \
    if (strstr(pmirror_errormsg(), (word)) == NULL)                                               \
      return failed(error, error_size, "%s:%d: %s: message '%s' does not mention '%s'", __FILE__, \
                    __LINE__, #call, pmirror_errormsg(), (word));                                 \
  } while (0)

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Mismatching ranges of replica "target", or -1 on error. */
static long mismatches(pmirror_volume* volume, char* error, size_t error_size) {
  struct pmirror_verify_result* result = NULL;
  if (pmirror_verify(volume, "target", false, &result) != 0) {
    failed(error, error_size, "verify: %s", pmirror_errormsg());
    return -1;
  }
  size_t count = 0;
  int rc = pmirror_verify_result_get_mismatch_count(result, 0, &count);
  pmirror_verify_result_delete(&result);
  if (rc != 0) return -1;
  /* verify skips chunks still recorded dirty (a resync under way will copy
   * them): the replica matches once nothing is dirty for it any more. */
  char* json = NULL;
  if (pmirror_status(volume, &json) != 0) {
    failed(error, error_size, "status: %s", pmirror_errormsg());
    return -1;
  }
  long dirty = strstr(json, "\"dirty_chunks\":0") == NULL || strstr(json, "\"resync\":") != NULL;
  pmirror_status_free(&json);
  return (long)count + dirty;
}

int c_api_mirror(const char *local_path, uint16_t port, const char *secret, char *error,
                 size_t error_size) {
  struct pmirror_cfg* cfg = NULL;
  EXPECT_RC(pmirror_cfg_new(&cfg), 0);
  EXPECT_RC(pmirror_cfg_set_name(cfg, "vol"), 0);
  EXPECT_RC(pmirror_cfg_set_local_path(cfg, local_path), 0);
  EXPECT_RC(pmirror_cfg_set_size(cfg, 1 << 20), 0);
  EXPECT_RC(pmirror_cfg_set_create(cfg, true), 0);
  EXPECT_RC(pmirror_cfg_set_identity(cfg, "app"), 0);
  EXPECT_RC(pmirror_cfg_add_replica(cfg, "127.0.0.1", port, "tcp", secret, "target"), 0);
  EXPECT_RC(pmirror_cfg_set_ack(cfg, 1), 0);
  EXPECT_RC(pmirror_cfg_set_max_in_flight(cfg, 4), 0);
  EXPECT_RC(pmirror_cfg_set_resync_rate(cfg, 0), 0);
  EXPECT_RC(pmirror_cfg_set_snapshot_buffer(cfg, 64 << 10), 0);
  uint64_t snapshot_buffer = 0;
  EXPECT_RC(pmirror_cfg_get_snapshot_buffer(cfg, &snapshot_buffer), 0);
  EXPECT_TRUE(snapshot_buffer == 64 << 10);

  pmirror_volume *volume = NULL;
  int rc = pmirror_open(cfg, &volume);
  EXPECT_RC(pmirror_cfg_delete(&cfg), 0); /* the volume does not keep it */
  EXPECT_TRUE(cfg == NULL);
  if (rc != 0) return failed(error, error_size, "open: %d %s", rc, pmirror_errormsg());
  EXPECT_TRUE(pmirror_size(volume) == 1 << 20);

  const char message[] = "hello from C";
  EXPECT_RC(pmirror_write(volume, 4096, message, sizeof message), 0);
  char* data = pmirror_data(volume);
  memcpy(data + 8192, message, sizeof message);
  uint64_t sequence = 0;
  EXPECT_RC(pmirror_persist_async(volume, 8192, sizeof message, &sequence), 0);
  EXPECT_RC(pmirror_wait(volume, sequence), 0);
  EXPECT_RC(pmirror_drain(volume), 0);

  /* Several ranges, one persist; then the same from a snapshot (the
   * mapping holds the same bytes, so that verify below finds them equal). */
  memcpy(data + 12288, message, sizeof message);
  memcpy(data + 20480, message, sizeof message);
  struct pmirror_range ranges[3] = {{12288, sizeof message}, {16384, 0}, {20480, sizeof message}};
  uint64_t ranges_sequence = 0;
  EXPECT_RC(pmirror_persist_ranges_async(volume, ranges, 3, NULL, &ranges_sequence), 0);
  EXPECT_TRUE(ranges_sequence == sequence + 1);
  char snapshot[2 * sizeof message];
  memcpy(snapshot, message, sizeof message);
  memcpy(snapshot + sizeof message, message, sizeof message);
  EXPECT_RC(pmirror_persist_ranges_async(volume, ranges, 3, snapshot, &ranges_sequence), 0);
  EXPECT_TRUE(ranges_sequence == sequence + 2);
  EXPECT_RC(pmirror_drain(volume), 0);
  EXPECT_INVALID(pmirror_persist_ranges_async(volume, ranges, 0, NULL, NULL), "no ranges");
  EXPECT_INVALID(pmirror_persist_ranges_async(volume, NULL, 2, NULL, NULL), "ranges is NULL");
  struct pmirror_range empty = {4096, 0};
  EXPECT_INVALID(pmirror_persist_ranges_async(volume, &empty, 1, NULL, NULL), "empty ranges");

  /* Ordered groups as one persist (one sequence): a "log record", then
   * two "data" ranges (one empty), from a snapshot; verify below finds the
   * replica equal, so the bytes arrived. */
  memcpy(data + 24576, message, sizeof message);
  memcpy(data + 28672, message, sizeof message);
  memcpy(data + 32768, message, sizeof message);
  struct pmirror_range grouped[4] = {
      {24576, sizeof message}, {28672, sizeof message}, {30000, 0}, {32768, sizeof message}};
  const uint32_t sizes[2] = {1, 3};
  char three[3 * sizeof message];
  for (int i = 0; i < 3; ++i) memcpy(three + i * sizeof message, message, sizeof message);
  uint64_t ordered_sequence = 0;
  EXPECT_RC(pmirror_persist_ordered_async(volume, grouped, 4, sizes, 2, three, &ordered_sequence),
            0);
  EXPECT_TRUE(ordered_sequence == ranges_sequence + 1);
  EXPECT_RC(pmirror_wait(volume, ordered_sequence), 0);
  const uint32_t wrong[2] = {1, 2};
  EXPECT_INVALID(pmirror_persist_ordered_async(volume, grouped, 4, wrong, 2, NULL, NULL),
                 "add up to 3 ranges, not 4");
  EXPECT_INVALID(pmirror_persist_ordered_async(volume, grouped, 4, NULL, 2, NULL, NULL),
                 "group_sizes is NULL");
  EXPECT_INVALID(pmirror_persist_ordered_async(volume, grouped, 4, sizes, 0, NULL, NULL),
                 "no groups");

  /* Out of range: a clear error, not a crash. */
  EXPECT_INVALID(pmirror_persist(volume, pmirror_size(volume), 1), "outside");

  /* Status: the object of docs/control.md, the replica connected. */
  char* json = NULL;
  EXPECT_RC(pmirror_status(volume, &json), 0);
  EXPECT_TRUE(json != NULL && strstr(json, "\"name\":\"target\"") != NULL);
  EXPECT_TRUE(strstr(json, "\"state\":\"connected\"") != NULL);
  pmirror_status_free(&json);
  EXPECT_TRUE(json == NULL);

  /* Verify: every chunk compared, none differs. */
  struct pmirror_verify_result* result = NULL;
  EXPECT_RC(pmirror_verify(volume, NULL, false, &result), 0);
  size_t peers = 0, count = 0;
  const char *name = NULL, *why = NULL;
  uint64_t chunks = 0, bytes = 0;
  int peer_error = 1;
  EXPECT_RC(pmirror_verify_result_get_peer_count(result, &peers), 0);
  EXPECT_TRUE(peers == 1);
  EXPECT_RC(pmirror_verify_result_get_peer(result, 0, &name), 0);
  EXPECT_TRUE(strcmp(name, "target") == 0);
  EXPECT_RC(pmirror_verify_result_get_error(result, 0, &peer_error, &why), 0);
  EXPECT_TRUE(peer_error == 0);
  EXPECT_RC(pmirror_verify_result_get_chunks_compared(result, 0, &chunks), 0);
  EXPECT_TRUE(chunks == (1 << 20) / 65536);
  EXPECT_RC(pmirror_verify_result_get_bytes_compared(result, 0, &bytes), 0);
  EXPECT_TRUE(bytes == 1 << 20);
  EXPECT_RC(pmirror_verify_result_get_mismatch_count(result, 0, &count), 0);
  EXPECT_TRUE(count == 0);
  EXPECT_INVALID(pmirror_verify_result_get_peer(result, 1, &name), "out of range");
  EXPECT_INVALID(pmirror_verify_result_get_mismatch(result, 0, 0, &chunks, &bytes), "out of range");
  EXPECT_RC(pmirror_verify_result_delete(&result), 0);
  EXPECT_TRUE(result == NULL);

  /* A store never persisted: verify finds its chunk and marks it dirty;
   * the resync that follows brings it to the replica. */
  const char stray[] = "stored, never persisted";
  memcpy(data + 200000, stray, sizeof stray);
  EXPECT_RC(pmirror_verify(volume, "target", true, &result), 0);
  uint64_t offset = 0, length = 0, marked = 0;
  EXPECT_RC(pmirror_verify_result_get_mismatch_count(result, 0, &count), 0);
  EXPECT_TRUE(count == 1);
  EXPECT_RC(pmirror_verify_result_get_mismatch(result, 0, 0, &offset, &length), 0);
  EXPECT_TRUE(offset == 196608 && length == 65536); /* the 64 KiB chunk holding 200000 */
  EXPECT_RC(pmirror_verify_result_get_marked_dirty(result, 0, &marked), 0);
  EXPECT_TRUE(marked == 1);
  pmirror_verify_result_delete(&result);

  /* Resync by name; an unknown or missing peer is an error. */
  EXPECT_RC(pmirror_resync(volume, "target", true), 0);
  EXPECT_RC(pmirror_resync(volume, "nobody", false), -PMIRROR_E_NOT_FOUND);
  EXPECT_TRUE(strstr(pmirror_errormsg(), "nobody") != NULL);
  EXPECT_INVALID(pmirror_resync(volume, NULL, false), "peer");
  EXPECT_RC(pmirror_verify(volume, "nobody", false, &result), -PMIRROR_E_NOT_FOUND);
  EXPECT_TRUE(result == NULL);

  /* The resyncs run in the background: wait (a guard against hanging,
   * not a measure) until the replica matches. */
  long left = -1;
  for (int attempt = 0; attempt < 1200 && left != 0; ++attempt) {
    left = mismatches(volume, error, error_size);
    if (left < 0) return -1;
    if (left != 0) sleep_ms(100);
  }
  EXPECT_TRUE(left == 0);

  EXPECT_RC(pmirror_close(&volume), 0);
  EXPECT_TRUE(volume == NULL);
  EXPECT_RC(pmirror_close(&volume), 0); /* NULL: nothing to do */
  return 0;
}

int c_api_open_from_config(const char* config_path, char* error, size_t error_size) {
  pmirror_volume* volume = NULL;
  EXPECT_RC(pmirror_open_from_config(config_path, "vol", "app", "app", &volume), 0);
  const char message[] = "hello from the cluster file";
  EXPECT_RC(pmirror_write(volume, 12288, message, sizeof message), 0);
  EXPECT_RC(pmirror_close(&volume), 0);

  EXPECT_RC(pmirror_open_from_config(config_path, "no-such-volume", "app", "app", &volume),
            -PMIRROR_E_CONFIG);
  EXPECT_TRUE(volume == NULL && strstr(pmirror_errormsg(), "no-such-volume") != NULL);
  EXPECT_INVALID(pmirror_open_from_config(NULL, "vol", "app", "app", &volume), "NULL");
  return 0;
}

int c_api_cfg_rejects_bad_values(char* error, size_t error_size) {
  struct pmirror_cfg* cfg = NULL;
  EXPECT_RC(pmirror_cfg_new(&cfg), 0);

  /* Defaults, as pmirror.h states them. */
  uint32_t u32 = 0, u32b = 0;
  uint64_t u64 = 0;
  bool flag = true;
  const char* text = NULL;
  enum pmirror_method method = PMIRROR_METHOD_GPSPM;
  enum pmirror_on_insufficient insufficient = PMIRROR_ON_INSUFFICIENT_BLOCK;
  enum pmirror_split_brain split = PMIRROR_SPLIT_BRAIN_OVERWRITE_REPLICA;
  EXPECT_RC(pmirror_cfg_get_max_in_flight(cfg, &u32), 0);
  EXPECT_TRUE(u32 == 32);
  EXPECT_RC(pmirror_cfg_get_connect_timeout(cfg, &u32), 0);
  EXPECT_TRUE(u32 == 5000);
  EXPECT_RC(pmirror_cfg_get_operation_timeout(cfg, &u32), 0);
  EXPECT_TRUE(u32 == 10000);
  EXPECT_RC(pmirror_cfg_get_heartbeat_interval(cfg, &u32), 0);
  EXPECT_TRUE(u32 == 2000);
  EXPECT_RC(pmirror_cfg_get_reconnect_backoff(cfg, &u32, &u32b), 0);
  EXPECT_TRUE(u32 == 200 && u32b == 10000);
  EXPECT_RC(pmirror_cfg_get_open_sync_timeout(cfg, &u32), 0);
  EXPECT_TRUE(u32 == 600000);
  EXPECT_RC(pmirror_cfg_get_ack(cfg, &u32), 0);
  EXPECT_TRUE(u32 == 0);
  EXPECT_RC(pmirror_cfg_get_chunk_size(cfg, &u64), 0);
  EXPECT_TRUE(u64 == 65536);
  EXPECT_RC(pmirror_cfg_get_resync_rate(cfg, &u64), 0);
  EXPECT_TRUE(u64 == 100u << 20);
  EXPECT_RC(pmirror_cfg_get_resync_step(cfg, &u64), 0);
  EXPECT_TRUE(u64 == 1u << 20);
  EXPECT_RC(pmirror_cfg_get_create(cfg, &flag), 0);
  EXPECT_TRUE(!flag);
  EXPECT_RC(pmirror_cfg_get_method(cfg, &method), 0);
  EXPECT_TRUE(method == PMIRROR_METHOD_AUTO);
  EXPECT_RC(pmirror_cfg_get_on_insufficient(cfg, &insufficient), 0);
  EXPECT_TRUE(insufficient == PMIRROR_ON_INSUFFICIENT_FAIL);
  EXPECT_RC(pmirror_cfg_get_split_brain(cfg, &split), 0);
  EXPECT_TRUE(split == PMIRROR_SPLIT_BRAIN_REFUSE);
  EXPECT_RC(pmirror_cfg_get_metadata_path(cfg, &text), 0);
  EXPECT_TRUE(strcmp(text, "") == 0);

  /* Bad values: refused with a message naming the field, field kept. */
  EXPECT_RC(pmirror_cfg_set_name(cfg, "vol"), 0);
  EXPECT_INVALID(pmirror_cfg_set_name(cfg, NULL), "name");
  EXPECT_INVALID(pmirror_cfg_set_name(cfg, ""), "name");
  EXPECT_RC(pmirror_cfg_get_name(cfg, &text), 0);
  EXPECT_TRUE(strcmp(text, "vol") == 0);
  EXPECT_INVALID(pmirror_cfg_set_local_path(cfg, ""), "local_path");
  EXPECT_INVALID(pmirror_cfg_set_identity(cfg, NULL), "identity");
  EXPECT_INVALID(pmirror_cfg_set_max_in_flight(cfg, 0), "max_in_flight");
  EXPECT_RC(pmirror_cfg_get_max_in_flight(cfg, &u32), 0);
  EXPECT_TRUE(u32 == 32);
  EXPECT_INVALID(pmirror_cfg_set_chunk_size(cfg, 2048), "chunk_size");
  EXPECT_INVALID(pmirror_cfg_set_chunk_size(cfg, 12288), "power of two");
  EXPECT_INVALID(pmirror_cfg_set_chunk_size(cfg, 2u << 20), "chunk_size");
  EXPECT_RC(pmirror_cfg_set_chunk_size(cfg, 4096), 0);
  EXPECT_RC(pmirror_cfg_get_chunk_size(cfg, &u64), 0);
  EXPECT_TRUE(u64 == 4096);
  EXPECT_INVALID(pmirror_cfg_set_connect_timeout(cfg, 0), "connect_timeout");
  EXPECT_INVALID(pmirror_cfg_set_operation_timeout(cfg, 0), "operation_timeout");
  EXPECT_INVALID(pmirror_cfg_set_heartbeat_interval(cfg, 0), "heartbeat_interval");
  EXPECT_RC(pmirror_cfg_set_open_sync_timeout(cfg, 0), 0); /* 0: do not wait */
  EXPECT_INVALID(pmirror_cfg_set_reconnect_backoff(cfg, 0, 100), "initial_ms");
  EXPECT_INVALID(pmirror_cfg_set_reconnect_backoff(cfg, 500, 100), "below");
  EXPECT_RC(pmirror_cfg_get_reconnect_backoff(cfg, &u32, &u32b), 0);
  EXPECT_TRUE(u32 == 200 && u32b == 10000);
  EXPECT_INVALID(pmirror_cfg_set_resync_step(cfg, 0), "resync_step");
  EXPECT_INVALID(pmirror_cfg_set_method(cfg, (enum pmirror_method)7), "method");
  EXPECT_INVALID(pmirror_cfg_set_on_insufficient(cfg, (enum pmirror_on_insufficient)9),
                 "on_insufficient");
  EXPECT_INVALID(pmirror_cfg_set_split_brain(cfg, (enum pmirror_split_brain) - 1), "split_brain");
  EXPECT_RC(pmirror_cfg_set_method(cfg, PMIRROR_METHOD_GPSPM), 0);
  EXPECT_RC(pmirror_cfg_get_method(cfg, &method), 0);
  EXPECT_TRUE(method == PMIRROR_METHOD_GPSPM);
  enum pmirror_poll poll = PMIRROR_POLL_BUSY;
  EXPECT_RC(pmirror_cfg_get_poll(cfg, &poll), 0);
  EXPECT_TRUE(poll == PMIRROR_POLL_ADAPTIVE); /* the default */
  EXPECT_INVALID(pmirror_cfg_set_poll(cfg, (enum pmirror_poll)3), "poll");
  EXPECT_RC(pmirror_cfg_set_poll(cfg, PMIRROR_POLL_BUSY), 0);
  EXPECT_RC(pmirror_cfg_get_poll(cfg, &poll), 0);
  EXPECT_TRUE(poll == PMIRROR_POLL_BUSY);
  EXPECT_RC(pmirror_cfg_set_poll(cfg, PMIRROR_POLL_EVENT), 0);
  EXPECT_RC(pmirror_cfg_get_poll(cfg, &poll), 0);
  EXPECT_TRUE(poll == PMIRROR_POLL_EVENT);

  /* Replicas: tcp or rdma only -- never the tests' in-process fake. */
  EXPECT_INVALID(pmirror_cfg_add_replica(cfg, NULL, 7450, "tcp", "s", NULL), "address");
  EXPECT_INVALID(pmirror_cfg_add_replica(cfg, "10.0.0.2", 7450, "udp", "s", NULL), "udp");
  EXPECT_INVALID(pmirror_cfg_add_replica(cfg, "10.0.0.2", 7450, "fake", "s", NULL), "fake");
  EXPECT_RC(pmirror_cfg_add_replica(cfg, "10.0.0.2", 0, NULL, NULL, NULL), 0);
  EXPECT_RC(pmirror_cfg_add_replica(cfg, "10.0.0.3", 7460, "rdma", "s", "node3"), 0);
  size_t count = 0;
  uint16_t port = 0;
  const char *address = NULL, *transport = NULL, *node = NULL;
  EXPECT_RC(pmirror_cfg_get_replica_count(cfg, &count), 0);
  EXPECT_TRUE(count == 2);
  EXPECT_RC(pmirror_cfg_get_replica(cfg, 0, &address, &port, &transport, &node), 0);
  EXPECT_TRUE(strcmp(address, "10.0.0.2") == 0 && port == 7450 && strcmp(transport, "tcp") == 0 &&
              strcmp(node, "") == 0);
  EXPECT_RC(pmirror_cfg_get_replica(cfg, 1, &address, &port, &transport, &node), 0);
  EXPECT_TRUE(strcmp(address, "10.0.0.3") == 0 && port == 7460 && strcmp(transport, "rdma") == 0 &&
              strcmp(node, "node3") == 0);
  EXPECT_INVALID(pmirror_cfg_get_replica(cfg, 2, &address, NULL, NULL, NULL), "out of range");
  for (int i = 2; i < 8; ++i) EXPECT_RC(pmirror_cfg_add_replica(cfg, "h", 1, "tcp", "s", NULL), 0);
  EXPECT_INVALID(pmirror_cfg_add_replica(cfg, "h", 1, "tcp", "s", NULL), "at most 8");
  EXPECT_RC(pmirror_cfg_clear_replicas(cfg), 0);
  EXPECT_RC(pmirror_cfg_get_replica_count(cfg, &count), 0);
  EXPECT_TRUE(count == 0);

  /* ack above the replica count: refused by open, nothing created. */
  EXPECT_RC(pmirror_cfg_set_local_path(cfg, "/nonexistent-dir/never-created.img"), 0);
  EXPECT_RC(pmirror_cfg_set_identity(cfg, "app"), 0);
  EXPECT_RC(pmirror_cfg_add_replica(cfg, "127.0.0.1", 1, "tcp", "s", NULL), 0);
  EXPECT_RC(pmirror_cfg_set_ack(cfg, 2), 0);
  static char sentinel;
  pmirror_volume* volume = (pmirror_volume*)&sentinel; /* open sets it to NULL */
  EXPECT_INVALID(pmirror_open(cfg, &volume), "ack 2");
  EXPECT_TRUE(volume == NULL);

  /* NULL objects and out-pointers. */
  EXPECT_INVALID(pmirror_cfg_get_max_in_flight(cfg, NULL), "NULL");
  EXPECT_INVALID(pmirror_cfg_set_size(NULL, 1), "cfg is NULL");
  EXPECT_INVALID(pmirror_cfg_new(NULL), "NULL");
  EXPECT_RC(pmirror_cfg_delete(&cfg), 0);
  EXPECT_TRUE(cfg == NULL);
  EXPECT_RC(pmirror_cfg_delete(&cfg), 0); /* NULL: nothing to do */
  EXPECT_INVALID(pmirror_cfg_delete(NULL), "NULL");
  return 0;
}

int c_api_names_every_error(char* error, size_t error_size) {
  static const int codes[] = {PMIRROR_E_INVALID_ARGUMENT,
                              PMIRROR_E_NOT_FOUND,
                              PMIRROR_E_PERMISSION_DENIED,
                              PMIRROR_E_ALREADY_EXISTS,
                              PMIRROR_E_IO,
                              PMIRROR_E_PROTOCOL,
                              PMIRROR_E_CONNECTION,
                              PMIRROR_E_TIMEOUT,
                              PMIRROR_E_UNSUPPORTED,
                              PMIRROR_E_BUSY,
                              PMIRROR_E_CONFIG,
                              PMIRROR_E_INTERNAL,
                              PMIRROR_E_CLOSED,
                              PMIRROR_E_RESOURCE_EXHAUSTED,
                              PMIRROR_E_SPLIT_BRAIN,
                              PMIRROR_E_FAILED_PRECONDITION,
                              PMIRROR_E_FENCED,
                              PMIRROR_E_LEASE_LOST};
  size_t n = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n; ++i) {
    /* Every code from 1 up is named, as returned (negative) and as defined. */
    EXPECT_TRUE(codes[i] == (int)i + 1);
    EXPECT_TRUE(strcmp(pmirror_strerror(-codes[i]), "unknown error") != 0);
    EXPECT_TRUE(strcmp(pmirror_strerror(-codes[i]), pmirror_strerror(codes[i])) == 0);
    for (size_t j = 0; j < i; ++j) {
      EXPECT_TRUE(strcmp(pmirror_strerror(codes[i]), pmirror_strerror(codes[j])) != 0);
    }
  }
  /* The code after the last has no name: a new error class must get one
   * here and in pmirror.h. */
  EXPECT_TRUE(strcmp(pmirror_strerror(-(int)n - 1), "unknown error") == 0);
  EXPECT_TRUE(strcmp(pmirror_strerror(-PMIRROR_E_SPLIT_BRAIN), "split brain") == 0);
  EXPECT_TRUE(strcmp(pmirror_strerror(-PMIRROR_E_FAILED_PRECONDITION), "failed precondition") == 0);
  EXPECT_TRUE(strcmp(pmirror_strerror(-PMIRROR_E_FENCED), "fenced") == 0);
  EXPECT_TRUE(strcmp(pmirror_strerror(-PMIRROR_E_LEASE_LOST), "lease lost") == 0);
  EXPECT_TRUE(strcmp(pmirror_strerror(0), "ok") == 0);
  EXPECT_TRUE(strcmp(pmirror_strerror(INT_MIN), "unknown error") == 0);
  EXPECT_TRUE(strcmp(pmirror_strerror(INT_MAX), "unknown error") == 0);
  return 0;
}

int c_api_version(char* error, size_t error_size) {
  int major = -1, minor = -1, patch = -1;
  pmirror_version(&major, &minor, &patch);
  EXPECT_TRUE(major == PMIRROR_VERSION_MAJOR && minor == PMIRROR_VERSION_MINOR &&
              patch == PMIRROR_VERSION_PATCH);
  pmirror_version(NULL, NULL, NULL); /* NULL pointers are skipped */
  char expected[64];
  snprintf(expected, sizeof expected, "%d.%d.%d", major, minor, patch);
  EXPECT_TRUE(strcmp(pmirror_version_string(), expected) == 0);
  return 0;
}

/* What the log function below received. */
struct log_lines {
  int count;
  int below_info; /* lines under the threshold that got through */
  char first_new_copy[512];
};

static void collect_line(enum pmirror_log_level level, const char* message, void* arg) {
  struct log_lines* lines = arg;
  lines->count++;
  if (level < PMIRROR_LOG_INFO) lines->below_info++;
  if (lines->first_new_copy[0] == '\0' && strstr(message, "new copy") != NULL)
    snprintf(lines->first_new_copy, sizeof lines->first_new_copy, "%s", message);
}

static int open_new_copy(const char* name, const char* local_path, uint16_t port,
                         const char* secret, char* error, size_t error_size) {
  struct pmirror_cfg* cfg = NULL;
  EXPECT_RC(pmirror_cfg_new(&cfg), 0);
  EXPECT_RC(pmirror_cfg_set_name(cfg, name), 0);
  EXPECT_RC(pmirror_cfg_set_local_path(cfg, local_path), 0);
  EXPECT_RC(pmirror_cfg_set_size(cfg, 1 << 20), 0);
  EXPECT_RC(pmirror_cfg_set_create(cfg, true), 0);
  EXPECT_RC(pmirror_cfg_set_identity(cfg, "app"), 0);
  EXPECT_RC(pmirror_cfg_add_replica(cfg, "127.0.0.1", port, "tcp", secret, "target"), 0);
  pmirror_volume* volume = NULL;
  int rc = pmirror_open(cfg, &volume);
  pmirror_cfg_delete(&cfg);
  if (rc != 0) return failed(error, error_size, "open: %d %s", rc, pmirror_errormsg());
  EXPECT_RC(pmirror_persist(volume, 0, 64), 0);
  EXPECT_RC(pmirror_close(&volume), 0);
  return 0;
}

/* The application's log function receives the library's lines at or above
 * the threshold, and none at PMIRROR_LOG_OFF. The target serves "vol" and
 * "vol2", both new. */
int c_api_log_function(const char* first_path, const char* second_path, uint16_t port,
                       const char* secret, char* error, size_t error_size) {
  EXPECT_INVALID(pmirror_log_set_threshold((enum pmirror_log_level)7), "threshold");
  EXPECT_INVALID(pmirror_log_set_threshold((enum pmirror_log_level) - 1), "threshold");
  EXPECT_INVALID(pmirror_log_get_threshold(NULL), "threshold");

  struct log_lines lines = {0, 0, ""};
  EXPECT_RC(pmirror_log_set_function(collect_line, &lines), 0);
  EXPECT_RC(pmirror_log_set_threshold(PMIRROR_LOG_INFO), 0);
  enum pmirror_log_level threshold = PMIRROR_LOG_OFF;
  EXPECT_RC(pmirror_log_get_threshold(&threshold), 0);
  EXPECT_TRUE(threshold == PMIRROR_LOG_INFO);
  if (open_new_copy("vol", first_path, port, secret, error, error_size) != 0) return -1;
  EXPECT_TRUE(lines.count > 0);
  EXPECT_TRUE(lines.below_info == 0);
  /* The bare text: it names the volume and carries no time stamp or level. */
  EXPECT_TRUE(strncmp(lines.first_new_copy, "volume vol: new copy", 20) == 0);

  EXPECT_RC(pmirror_log_set_threshold(PMIRROR_LOG_OFF), 0);
  int before = lines.count;
  if (open_new_copy("vol2", second_path, port, secret, error, error_size) != 0) return -1;
  EXPECT_TRUE(lines.count == before);

  /* Back to stderr, at info; the function is not called again. */
  EXPECT_RC(pmirror_log_set_function(NULL, NULL), 0);
  EXPECT_RC(pmirror_log_set_threshold(PMIRROR_LOG_INFO), 0);
  return 0;
}

int c_api_open_null(void) { return pmirror_open(NULL, NULL); }

struct warnings {
  int no_replicas; /* warnings saying the volume mirrors nothing */
};

static void collect_warning(enum pmirror_log_level level, const char* message, void* arg) {
  struct warnings* seen = arg;
  if (level == PMIRROR_LOG_WARN && strstr(message, "no replicas") != NULL &&
      strstr(message, "nothing is mirrored") != NULL)
    seen->no_replicas++;
}

/* A volume with no replica opens and persists, but says so: a warning at
 * open, and local_only in its status. */
int c_api_no_replicas(const char* local_path, char* error, size_t error_size) {
  struct warnings seen = {0};
  EXPECT_RC(pmirror_log_set_function(collect_warning, &seen), 0);
  EXPECT_RC(pmirror_log_set_threshold(PMIRROR_LOG_INFO), 0);
  struct pmirror_cfg* cfg = NULL;
  EXPECT_RC(pmirror_cfg_new(&cfg), 0);
  EXPECT_RC(pmirror_cfg_set_name(cfg, "alone"), 0);
  EXPECT_RC(pmirror_cfg_set_local_path(cfg, local_path), 0);
  EXPECT_RC(pmirror_cfg_set_size(cfg, 1 << 20), 0);
  EXPECT_RC(pmirror_cfg_set_create(cfg, true), 0);
  EXPECT_RC(pmirror_cfg_set_identity(cfg, "app"), 0);
  pmirror_volume* volume = NULL;
  int rc = pmirror_open(cfg, &volume);
  pmirror_cfg_delete(&cfg);
  EXPECT_RC(pmirror_log_set_function(NULL, NULL), 0);
  if (rc != 0) return failed(error, error_size, "open: %d %s", rc, pmirror_errormsg());
  EXPECT_TRUE(seen.no_replicas == 1);
  EXPECT_RC(pmirror_persist(volume, 0, 64), 0);
  char* status = NULL;
  EXPECT_RC(pmirror_status(volume, &status), 0);
  EXPECT_TRUE(status != NULL && strstr(status, "\"local_only\":true") != NULL);
  pmirror_status_free(&status);
  EXPECT_RC(pmirror_close(&volume), 0);
  return 0;
}
