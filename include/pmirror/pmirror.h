/* libpmirror's C API: a volume mirrored to pmirrord targets, for C users
 * (PMDK's among them). It offers what the C++ API (pmirror.hpp) does.
 *
 *   struct pmirror_cfg *cfg = NULL;
 *   pmirror_cfg_new(&cfg);
 *   pmirror_cfg_set_name(cfg, "db0");
 *   pmirror_cfg_set_local_path(cfg, "/mnt/pmem/db0");
 *   pmirror_cfg_set_identity(cfg, "app1");
 *   pmirror_cfg_add_replica(cfg, "10.0.0.2", 7450, "rdma", secret, NULL);
 *   pmirror_volume *volume = NULL;
 *   int rc = pmirror_open(cfg, &volume);
 *   pmirror_cfg_delete(&cfg);
 *   if (rc) fprintf(stderr, "%s: %s\n", pmirror_strerror(rc), pmirror_errormsg());
 *   memcpy((char *)pmirror_data(volume) + 4096, record, n);
 *   rc = pmirror_persist(volume, 4096, n);  // durable locally and on the replicas
 *   pmirror_close(&volume);
 *
 * Link with -lpmirror. libpmirror(3) and /usr/share/doc/libpmirror-dev/initiator.md
 * describe the API and its errors.
 *
 * Errors. Every function that can fail returns 0 on success or a negative
 * PMIRROR_E_* code (-PMIRROR_E_TIMEOUT, say); pmirror_strerror() names the
 * code and pmirror_errormsg() says what failed, in words, for the calling
 * thread. Every function returns -PMIRROR_E_INVALID_ARGUMENT for a NULL
 * object or out-pointer (not repeated below) and -PMIRROR_E_INTERNAL if
 * the library hit a bug; no C++ exception crosses this API.
 *
 * Objects are opaque and made by *_new or pmirror_open*, released by
 * *_delete or pmirror_close, which take the pointer's address and set it to
 * NULL (a NULL pointer there is accepted and ignored). Options live in a
 * struct pmirror_cfg with a setter and a getter per field, so that fields
 * can be added without breaking the ABI.
 *
 * Threads: a pmirror_volume may be used from several threads at once
 * (persists are then serialised); a pmirror_cfg or pmirror_verify_result
 * by one thread at a time. */
#ifndef PMIRROR_PMIRROR_H
#define PMIRROR_PMIRROR_H

#include <pmirror/export.h>
#include <pmirror/version.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* In C++ the option enums take int as their underlying type, as they have
 * in C: a C caller may pass any int, and the setters refuse the unknown
 * ones with PMIRROR_E_INVALID_ARGUMENT (without a fixed type, an unknown
 * value would be undefined behaviour in the library's C++). */
#ifdef __cplusplus
#define PMIRROR_ENUM_INT : int
#else
#define PMIRROR_ENUM_INT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ errors */

/* Returned negated. The same classes, with the same numbers, as the C++
 * API's pmirror::Errc. */
enum pmirror_error {
  PMIRROR_E_INVALID_ARGUMENT = 1,     /* an argument out of range or malformed */
  PMIRROR_E_NOT_FOUND = 2,            /* file, volume, replica, node does not exist */
  PMIRROR_E_PERMISSION_DENIED = 3,    /* file mode, identity or secret refused */
  PMIRROR_E_ALREADY_EXISTS = 4,       /* create over something that exists */
  PMIRROR_E_IO = 5,                   /* a system call on a file or device failed */
  PMIRROR_E_PROTOCOL = 6,             /* a peer sent something malformed */
  PMIRROR_E_CONNECTION = 7,           /* connect failed, a replica was lost */
  PMIRROR_E_TIMEOUT = 8,              /* no answer in time */
  PMIRROR_E_UNSUPPORTED = 9,          /* the device or target cannot do it */
  PMIRROR_E_BUSY = 10,                /* the volume has another writer */
  PMIRROR_E_CONFIG = 11,              /* the cluster file is wrong */
  PMIRROR_E_INTERNAL = 12,            /* a bug in libpmirror */
  PMIRROR_E_CLOSED = 13,              /* the object was shut down */
  PMIRROR_E_RESOURCE_EXHAUSTED = 14,  /* out of memory, slots or space */
  PMIRROR_E_SPLIT_BRAIN = 15,         /* both copies moved on from a common generation */
  PMIRROR_E_FAILED_PRECONDITION = 16, /* not in a state that allows it (e.g. not connected) */
  PMIRROR_E_FENCED = 17,              /* another copy was promoted: this one may no longer write */
  PMIRROR_E_LEASE_LOST = 18 /* the failover lease ran out: this primary must stop writing */
};

/* The name of an error code, e.g. "timeout", for `error` given either as a
 * function returned it (-PMIRROR_E_TIMEOUT) or as PMIRROR_E_TIMEOUT; "ok"
 * for 0, "unknown error" for anything else. Never NULL; static storage. */
PMIRROR_EXPORT const char* pmirror_strerror(int error);

/* What the calling thread's last failed call said: the object at fault
 * and what to do; "" after a call that returned 0 (functions that return
 * no error code leave it as it is). Valid until the thread's next call
 * into libpmirror. */
PMIRROR_EXPORT const char* pmirror_errormsg(void);

/* ----------------------------------------------------------------- version */

/* The library's version (PMIRROR_VERSION_* are the headers'). Any of the
 * pointers may be NULL. */
PMIRROR_EXPORT void pmirror_version(int* major, int* minor, int* patch);
/* "MAJOR.MINOR.PATCH" of the library; static storage. */
PMIRROR_EXPORT const char* pmirror_version_string(void);

/* --------------------------------------------------------------------- log */

/* libpmirror logs what it does (connections, replica states, resyncs) and
 * what goes wrong. By default the lines go to stderr, never stdout, at the
 * threshold that the environment variable PMIRROR_LOG_LEVEL names (trace,
 * debug, info -- the default --, warn, error, critical or off). */
enum pmirror_log_level PMIRROR_ENUM_INT {
  PMIRROR_LOG_TRACE = 0,
  PMIRROR_LOG_DEBUG = 1,
  PMIRROR_LOG_INFO = 2,
  PMIRROR_LOG_WARN = 3,
  PMIRROR_LOG_ERROR = 4,
  PMIRROR_LOG_CRITICAL = 5,
  PMIRROR_LOG_OFF = 6 /* as a threshold only: nothing is logged */
};

/* Receives one line: its level and its text (no time stamp, no level, no
 * newline), valid during the call only. Called from any of libpmirror's
 * threads, one line at a time; it must not call libpmirror. */
typedef void pmirror_log_function(enum pmirror_log_level level, const char* message, void* arg);

/* Sends the lines at or above the threshold to `function` (with `arg`)
 * instead of stderr; NULL sends them to stderr again. The threshold is kept. */
PMIRROR_EXPORT int pmirror_log_set_function(pmirror_log_function* function, void* arg);
/* Lines below `threshold` are dropped; PMIRROR_LOG_OFF drops all.
 * Overrides PMIRROR_LOG_LEVEL. */
PMIRROR_EXPORT int pmirror_log_set_threshold(enum pmirror_log_level threshold);
PMIRROR_EXPORT int pmirror_log_get_threshold(enum pmirror_log_level* threshold);

/* ----------------------------------------------------------------- options */

enum pmirror_method PMIRROR_ENUM_INT {
  PMIRROR_METHOD_AUTO = 0, /* APM where the target guarantees it, GPSPM otherwise */
  PMIRROR_METHOD_GPSPM = 1 /* always ask the target to persist (Send/Recv) */
};

/* How a thread waiting for a replica's completions waits. */
enum pmirror_poll PMIRROR_ENUM_INT {
  PMIRROR_POLL_ADAPTIVE = 0, /* spin about twice as long as recent waits took (<= 1 ms) */
  PMIRROR_POLL_EVENT = 1,    /* sleep at once: no CPU while waiting */
  PMIRROR_POLL_BUSY = 2      /* spin until done: a core per waiting thread */
};

/* A persist that cannot reach `ack` in-sync replicas. */
enum pmirror_on_insufficient PMIRROR_ENUM_INT {
  PMIRROR_ON_INSUFFICIENT_FAIL = 0, /* fails at once */
  PMIRROR_ON_INSUFFICIENT_BLOCK = 1 /* waits until enough replicas are back in sync */
};

/* A replica whose copy was also written since the two last agreed. */
enum pmirror_split_brain PMIRROR_ENUM_INT {
  PMIRROR_SPLIT_BRAIN_REFUSE = 0,           /* refuse it; an operator decides */
  PMIRROR_SPLIT_BRAIN_OVERWRITE_REPLICA = 1 /* copy the whole volume over it */
};

/* The options of pmirror_open. A new cfg holds the defaults given below
 * with each setter; name, local_path, identity and the replicas are for
 * the caller to set. */
struct pmirror_cfg;

/* Errors: -PMIRROR_E_RESOURCE_EXHAUSTED (no memory). */
PMIRROR_EXPORT int pmirror_cfg_new(struct pmirror_cfg** cfg_ptr);
/* Frees *cfg_ptr and sets it to NULL. Errors: none but a NULL cfg_ptr. */
PMIRROR_EXPORT int pmirror_cfg_delete(struct pmirror_cfg** cfg_ptr);

/* Strings are copied. A getter's string belongs to the cfg and is valid
 * until that field is set again or the cfg is deleted. Every setter
 * returns -PMIRROR_E_INVALID_ARGUMENT for a value out of the range it
 * states, and leaves the field as it was. */

/* The volume's name on the targets. Not NULL or "". */
PMIRROR_EXPORT int pmirror_cfg_set_name(struct pmirror_cfg* cfg, const char* name);
PMIRROR_EXPORT int pmirror_cfg_get_name(const struct pmirror_cfg* cfg, const char** name);
/* The local copy: devdax, a file on fsdax, or a plain file. Not NULL or "". */
PMIRROR_EXPORT int pmirror_cfg_set_local_path(struct pmirror_cfg* cfg, const char* path);
PMIRROR_EXPORT int pmirror_cfg_get_local_path(const struct pmirror_cfg* cfg, const char** path);
/* The volume's size; 0 (default): the existing local copy's size. */
PMIRROR_EXPORT int pmirror_cfg_set_size(struct pmirror_cfg* cfg, uint64_t size);
PMIRROR_EXPORT int pmirror_cfg_get_size(const struct pmirror_cfg* cfg, uint64_t* size);
/* Create the local file if it is missing (default false). */
PMIRROR_EXPORT int pmirror_cfg_set_create(struct pmirror_cfg* cfg, bool create);
PMIRROR_EXPORT int pmirror_cfg_get_create(const struct pmirror_cfg* cfg, bool* create);
/* Who we are to the targets (their allowed_peers). Not NULL or "". */
PMIRROR_EXPORT int pmirror_cfg_set_identity(struct pmirror_cfg* cfg, const char* identity);
PMIRROR_EXPORT int pmirror_cfg_get_identity(const struct pmirror_cfg* cfg, const char** identity);

/* Adds a replica: the target at `address` (host name or IP address) and
 * `port` (0: 7450) over `transport` ("tcp" or "rdma"; NULL: "tcp"), with
 * the volume's shared `secret` there (NULL: none), called `node` in status
 * and logs (NULL or "": by its address). Errors: -PMIRROR_E_INVALID_ARGUMENT
 * (address NULL or "", an unknown transport, more than 8 replicas: the
 * most a copy's metadata tracks). */
PMIRROR_EXPORT int pmirror_cfg_add_replica(struct pmirror_cfg* cfg, const char* address,
                                           uint16_t port, const char* transport, const char* secret,
                                           const char* node);
/* Removes every replica added so far. */
PMIRROR_EXPORT int pmirror_cfg_clear_replicas(struct pmirror_cfg* cfg);
PMIRROR_EXPORT int pmirror_cfg_get_replica_count(const struct pmirror_cfg* cfg, size_t* count);
/* The replica at `index` (in the order added); any out-pointer may be
 * NULL. node is "" when none was given. The secret is not handed back.
 * Errors: -PMIRROR_E_INVALID_ARGUMENT (index >= the count). */
PMIRROR_EXPORT int pmirror_cfg_get_replica(const struct pmirror_cfg* cfg, size_t index,
                                           const char** address, uint16_t* port,
                                           const char** transport, const char** node);

/* Replicas that must acknowledge a persist before it succeeds; 0 (default):
 * every replica. Not more than the replicas configured (checked by
 * pmirror_open). */
PMIRROR_EXPORT int pmirror_cfg_set_ack(struct pmirror_cfg* cfg, uint32_t ack);
PMIRROR_EXPORT int pmirror_cfg_get_ack(const struct pmirror_cfg* cfg, uint32_t* ack);
/* Default PMIRROR_ON_INSUFFICIENT_FAIL. */
PMIRROR_EXPORT int pmirror_cfg_set_on_insufficient(struct pmirror_cfg* cfg,
                                                   enum pmirror_on_insufficient policy);
PMIRROR_EXPORT int pmirror_cfg_get_on_insufficient(const struct pmirror_cfg* cfg,
                                                   enum pmirror_on_insufficient* policy);
/* Default PMIRROR_SPLIT_BRAIN_REFUSE. */
PMIRROR_EXPORT int pmirror_cfg_set_split_brain(struct pmirror_cfg* cfg,
                                               enum pmirror_split_brain policy);
PMIRROR_EXPORT int pmirror_cfg_get_split_brain(const struct pmirror_cfg* cfg,
                                               enum pmirror_split_brain* policy);
/* Default PMIRROR_METHOD_AUTO. */
PMIRROR_EXPORT int pmirror_cfg_set_method(struct pmirror_cfg* cfg, enum pmirror_method method);
PMIRROR_EXPORT int pmirror_cfg_get_method(const struct pmirror_cfg* cfg,
                                          enum pmirror_method* method);
/* Asynchronous persists outstanding before pmirror_persist_async waits;
 * at least 1 (default 32). */
PMIRROR_EXPORT int pmirror_cfg_set_max_in_flight(struct pmirror_cfg* cfg, uint32_t max_in_flight);
PMIRROR_EXPORT int pmirror_cfg_get_max_in_flight(const struct pmirror_cfg* cfg,
                                                 uint32_t* max_in_flight);
/* Bytes set aside for persists started with a snapshot
 * (pmirror_persist_ranges_async with `snapshot`); every replica session
 * registers them. 0 (default): none. */
PMIRROR_EXPORT int pmirror_cfg_set_snapshot_buffer(struct pmirror_cfg* cfg, uint64_t bytes);
PMIRROR_EXPORT int pmirror_cfg_get_snapshot_buffer(const struct pmirror_cfg* cfg,
                                                   uint64_t* bytes);

/* Default PMIRROR_POLL_ADAPTIVE. */
PMIRROR_EXPORT int pmirror_cfg_set_poll(struct pmirror_cfg* cfg, enum pmirror_poll poll);
PMIRROR_EXPORT int pmirror_cfg_get_poll(const struct pmirror_cfg* cfg, enum pmirror_poll* poll);

/* Timers, in milliseconds, each at least 1. connect: per replica, connect
 * and handshake (default 5000). operation: a replica that does not complete
 * a persist or answer a ping in this time is lost (default 10000).
 * heartbeat: an idle volume pings its replicas this often (default 2000). */
PMIRROR_EXPORT int pmirror_cfg_set_connect_timeout(struct pmirror_cfg* cfg, uint32_t timeout_ms);
PMIRROR_EXPORT int pmirror_cfg_get_connect_timeout(const struct pmirror_cfg* cfg,
                                                   uint32_t* timeout_ms);
PMIRROR_EXPORT int pmirror_cfg_set_operation_timeout(struct pmirror_cfg* cfg, uint32_t timeout_ms);
PMIRROR_EXPORT int pmirror_cfg_get_operation_timeout(const struct pmirror_cfg* cfg,
                                                     uint32_t* timeout_ms);
PMIRROR_EXPORT int pmirror_cfg_set_heartbeat_interval(struct pmirror_cfg* cfg,
                                                      uint32_t interval_ms);
PMIRROR_EXPORT int pmirror_cfg_get_heartbeat_interval(const struct pmirror_cfg* cfg,
                                                      uint32_t* interval_ms);
/* Backoff between reconnect attempts to a lost replica, with +-20% jitter:
 * from initial_ms (at least 1, default 200) doubling up to max_ms (at least
 * initial_ms, default 10000). */
PMIRROR_EXPORT int pmirror_cfg_set_reconnect_backoff(struct pmirror_cfg* cfg, uint32_t initial_ms,
                                                     uint32_t max_ms);
PMIRROR_EXPORT int pmirror_cfg_get_reconnect_backoff(const struct pmirror_cfg* cfg,
                                                     uint32_t* initial_ms, uint32_t* max_ms);
/* How long pmirror_open waits for replicas that need an initial or
 * catch-up resync before `ack` of them are in sync; 0: not at all (default
 * 600000). */
PMIRROR_EXPORT int pmirror_cfg_set_open_sync_timeout(struct pmirror_cfg* cfg, uint32_t timeout_ms);
PMIRROR_EXPORT int pmirror_cfg_get_open_sync_timeout(const struct pmirror_cfg* cfg,
                                                     uint32_t* timeout_ms);

/* The local copy's metadata pool (generations, dirty maps, activity log).
 * NULL or "" (default): next to the local copy, <local_path>.pmirror (for
 * devdax /var/lib/pmirror/<name>.pmirror). */
PMIRROR_EXPORT int pmirror_cfg_set_metadata_path(struct pmirror_cfg* cfg, const char* path);
/* "" when the default applies. */
PMIRROR_EXPORT int pmirror_cfg_get_metadata_path(const struct pmirror_cfg* cfg, const char** path);
/* Bytes per dirty bit: a power of two from 4096 to 1048576 (default 65536).
 * A copy keeps the chunk it was created with. */
PMIRROR_EXPORT int pmirror_cfg_set_chunk_size(struct pmirror_cfg* cfg, uint64_t chunk_size);
PMIRROR_EXPORT int pmirror_cfg_get_chunk_size(const struct pmirror_cfg* cfg, uint64_t* chunk_size);
/* Bytes per second a resync may copy; 0: unlimited (default 104857600). */
PMIRROR_EXPORT int pmirror_cfg_set_resync_rate(struct pmirror_cfg* cfg, uint64_t bytes_per_second);
PMIRROR_EXPORT int pmirror_cfg_get_resync_rate(const struct pmirror_cfg* cfg,
                                               uint64_t* bytes_per_second);
/* Bytes a resync copies per step, persists running between steps; at
 * least 1 (default 1048576). */
PMIRROR_EXPORT int pmirror_cfg_set_resync_step(struct pmirror_cfg* cfg, uint64_t bytes);
PMIRROR_EXPORT int pmirror_cfg_get_resync_step(const struct pmirror_cfg* cfg, uint64_t* bytes);
/* This node is not the volume's configured primary: open only a copy that
 * was promoted here (`pmirrorctl promote`) (default false). */
PMIRROR_EXPORT int pmirror_cfg_set_require_promoted(struct pmirror_cfg* cfg, bool require);
PMIRROR_EXPORT int pmirror_cfg_get_require_promoted(const struct pmirror_cfg* cfg, bool* require);

/* ------------------------------------------------------------------ volume */

typedef struct pmirror_volume pmirror_volume;

/* Maps the local copy, connects and authenticates to every replica in
 * parallel, and returns once `ack` of them are in sync (after a resync if
 * they need one). The cfg is not kept: it may be deleted at once.
 * Errors: -PMIRROR_E_INVALID_ARGUMENT (a required option missing, ack
 * above the replica count, a replica's region of another size),
 * -PMIRROR_E_PERMISSION_DENIED (wrong identity or secret; a copy that must
 * be promoted first), -PMIRROR_E_NOT_FOUND (the target has no such volume),
 * -PMIRROR_E_BUSY (another writer), -PMIRROR_E_SPLIT_BRAIN,
 * -PMIRROR_E_FAILED_PRECONDITION (a replica was promoted: this copy is no
 * longer the primary), -PMIRROR_E_CONNECTION / -PMIRROR_E_TIMEOUT (fewer
 * than `ack` replicas in sync in time), -PMIRROR_E_IO (the local copy or
 * its metadata), -PMIRROR_E_FENCED (a target fenced this copy's lineage
 * out: another copy was promoted), -PMIRROR_E_LEASE_LOST (failover by
 * etcd: this node's pmirror-promoter does not hold the volume's lease).
 * pmirror_errormsg() names each replica at fault and why.
 * On error *volume_ptr is NULL and nothing is left open. A cfg with no
 * replica opens (0) but mirrors nothing: every persist is durable on the
 * local copy only; the open logs a warning and status says "local only". */
PMIRROR_EXPORT int pmirror_open(const struct pmirror_cfg* cfg, pmirror_volume** volume_ptr);

/* Opens `volume` as the cluster file at `config_path` describes it: this
 * node (`node`; NULL or "": the node named like this host) must hold a copy
 * of it; the replicas, secret, ack policy and timers come from the file.
 * `identity` is who we are to the targets. Errors: as pmirror_open, and
 * -PMIRROR_E_CONFIG (the file cannot be read or is wrong, or it has no such
 * node or volume, or this node holds no copy of it). */
PMIRROR_EXPORT int pmirror_open_from_config(const char* config_path, const char* volume,
                                            const char* identity, const char* node,
                                            pmirror_volume** volume_ptr);

/* Drains, gives a replica that is connected but behind (lagging, being
 * resynced) up to the operation timeout to catch up, says goodbye to the
 * replicas, disconnects, unmaps, and sets *volume_ptr to NULL. A persist that fails while draining is not reported:
 * call pmirror_drain first to know. Errors: none but a NULL volume_ptr. */
PMIRROR_EXPORT int pmirror_close(pmirror_volume** volume_ptr);

/* The local mapping, its size, and whether it is real pmem (pmem_persist)
 * rather than a file synced with msync. NULL / 0 / false for a NULL volume. */
PMIRROR_EXPORT void* pmirror_data(const pmirror_volume* volume);
PMIRROR_EXPORT uint64_t pmirror_size(const pmirror_volume* volume);
PMIRROR_EXPORT bool pmirror_is_pmem(const pmirror_volume* volume);

/* Returns once [offset, offset+length) is durable locally and on `ack`
 * in-sync replicas (default every replica). length 0 succeeds at once.
 * Errors: -PMIRROR_E_INVALID_ARGUMENT (range outside the volume),
 * -PMIRROR_E_CONNECTION / -PMIRROR_E_TIMEOUT (fewer than `ack` replicas
 * acknowledged it; the message names each and why), -PMIRROR_E_FENCED
 * (another copy was promoted and a target fenced this primary out),
 * -PMIRROR_E_LEASE_LOST (failover by etcd: the promoter's lease ran out
 * or was given up; final for this opening). After either of the last two
 * every later persist fails the same way: close the volume. */
PMIRROR_EXPORT int pmirror_persist(pmirror_volume* volume, uint64_t offset, uint64_t length);
/* Copies `length` bytes from `source` into the mapping at `offset`, then
 * persists them. Errors: as pmirror_persist; source may be NULL only when
 * length is 0. */
PMIRROR_EXPORT int pmirror_write(pmirror_volume* volume, uint64_t offset, const void* source,
                                 uint64_t length);
/* Starts a persist and returns without waiting for it; *sequence (may be
 * NULL) identifies it for pmirror_wait. Ordered: on every replica a
 * persist is durable only after every persist started before it, so a
 * program may start its ordering points this way and wait (pmirror_wait,
 * pmirror_drain) only where its state is seen outside it. The replicas
 * get the bytes the range holds when the persist is posted: do not store
 * to it before it is waited for (or use a snapshot:
 * pmirror_persist_ranges_async). Waits first if max_in_flight persists
 * are outstanding. Errors: as pmirror_persist, and
 * -PMIRROR_E_INVALID_ARGUMENT for length 0. */
PMIRROR_EXPORT int pmirror_persist_async(pmirror_volume* volume, uint64_t offset, uint64_t length,
                                         uint64_t* sequence);
/* One range of a persist of several. */
struct pmirror_range {
  uint64_t offset;
  uint64_t length;
};
/* Starts one persist of `count` ranges (one sequence, one flush, one
 * commit record), ordered as pmirror_persist_async; empty ranges are
 * skipped, but not all may be empty. `snapshot` (may be NULL): the ranges'
 * bytes, concatenated in range order; the replicas get these, copied
 * before it returns, so the program may store to the ranges again at once
 * (needs pmirror_cfg_set_snapshot_buffer: -PMIRROR_E_FAILED_PRECONDITION
 * without; -PMIRROR_E_INVALID_ARGUMENT for a range larger than the
 * buffer). Errors: as pmirror_persist_async. */
PMIRROR_EXPORT int pmirror_persist_ranges_async(pmirror_volume* volume,
                                                const struct pmirror_range* ranges, size_t count,
                                                const void* snapshot, uint64_t* sequence);
/* Several persists started as one: `groups` groups, group i being the next
 * group_sizes[i] of the `count` ranges (the sizes must add up to count).
 * Each group is durable on a replica only once the groups before it are,
 * as if each were a pmirror_persist_ranges_async of its own, yet over APM
 * they share one sequence, one commit record and one wait; a replica using
 * GPSPM takes them as a persist each. `*sequence` stands for them all.
 * Ranges and snapshot as pmirror_persist_ranges_async. Errors: as
 * pmirror_persist_ranges_async; -PMIRROR_E_INVALID_ARGUMENT when the sizes
 * do not add up. */
PMIRROR_EXPORT int pmirror_persist_ordered_async(pmirror_volume* volume,
                                                 const struct pmirror_range* ranges, size_t count,
                                                 const uint32_t* group_sizes, size_t groups,
                                                 const void* snapshot, uint64_t* sequence);
/* Returns once every persist up to `sequence` is durable. Errors: as
 * pmirror_persist; -PMIRROR_E_INVALID_ARGUMENT for a sequence never started. */
PMIRROR_EXPORT int pmirror_wait(pmirror_volume* volume, uint64_t sequence);
/* Waits for every persist started so far. Errors: as pmirror_persist. */
PMIRROR_EXPORT int pmirror_drain(pmirror_volume* volume);

/* The volume's status as JSON (the object pmirror_status(3) describes, role
 * "primary": each replica's connection state, since when and why,
 * acknowledged sequence, lag, latency, resync progress). *json_ptr is
 * allocated: free it with pmirror_status_free. Errors:
 * -PMIRROR_E_RESOURCE_EXHAUSTED (no memory). */
PMIRROR_EXPORT int pmirror_status(const pmirror_volume* volume, char** json_ptr);
/* Frees a string from pmirror_status and sets *json_ptr to NULL. */
PMIRROR_EXPORT void pmirror_status_free(char** json_ptr);

/* Starts a resync of replica `peer` (its node name, or host:port) now: its
 * dirty chunks, or with `full` every chunk. Returns once it has started.
 * Errors: -PMIRROR_E_INVALID_ARGUMENT (peer NULL or ""),
 * -PMIRROR_E_NOT_FOUND (no such replica), -PMIRROR_E_FAILED_PRECONDITION
 * (it is not connected; a resync starts by itself when it reconnects). */
PMIRROR_EXPORT int pmirror_resync(pmirror_volume* volume, const char* peer, bool full);

/* ------------------------------------------------------------------ verify */

/* What pmirror_verify found, per replica compared. */
struct pmirror_verify_result;

/* Compares the local copy with replica `peer` (NULL or "": every connected
 * replica) chunk by chunk, by XXH3-64 computed on each side. Chunks that
 * differ are compared again after the persists in flight drain; those that
 * still differ are reported and, with `mark_dirty`, marked for resync
 * (which then starts). *result_ptr is allocated: release it with
 * pmirror_verify_result_delete. A replica lost during the comparison is
 * reported in its own entry (pmirror_verify_result_get_error), not here.
 * Errors: -PMIRROR_E_NOT_FOUND (no such replica),
 * -PMIRROR_E_FAILED_PRECONDITION (no connected replica to compare). */
PMIRROR_EXPORT int pmirror_verify(pmirror_volume* volume, const char* peer, bool mark_dirty,
                                  struct pmirror_verify_result** result_ptr);
PMIRROR_EXPORT int pmirror_verify_result_delete(struct pmirror_verify_result** result_ptr);

/* Replicas compared; `peer` below is an index below this count, and the
 * getters return -PMIRROR_E_INVALID_ARGUMENT for another. Strings belong to
 * the result. */
PMIRROR_EXPORT int pmirror_verify_result_get_peer_count(const struct pmirror_verify_result* result,
                                                        size_t* count);
/* The replica's name (node name, or host:port). */
PMIRROR_EXPORT int pmirror_verify_result_get_peer(const struct pmirror_verify_result* result,
                                                  size_t peer, const char** name);
/* 0 if the replica was compared; otherwise the negative PMIRROR_E_* code
 * and a message saying why not. message may be NULL. */
PMIRROR_EXPORT int pmirror_verify_result_get_error(const struct pmirror_verify_result* result,
                                                   size_t peer, int* error, const char** message);
PMIRROR_EXPORT int pmirror_verify_result_get_chunks_compared(
    const struct pmirror_verify_result* result, size_t peer, uint64_t* chunks);
PMIRROR_EXPORT int pmirror_verify_result_get_bytes_compared(
    const struct pmirror_verify_result* result, size_t peer, uint64_t* bytes);
/* Chunks marked for resync (with mark_dirty). */
PMIRROR_EXPORT int pmirror_verify_result_get_marked_dirty(
    const struct pmirror_verify_result* result, size_t peer, uint64_t* chunks);
/* Ranges that differ, merged where adjacent, in ascending order. */
PMIRROR_EXPORT int pmirror_verify_result_get_mismatch_count(
    const struct pmirror_verify_result* result, size_t peer, size_t* count);
/* Errors: -PMIRROR_E_INVALID_ARGUMENT (index >= the mismatch count). */
PMIRROR_EXPORT int pmirror_verify_result_get_mismatch(const struct pmirror_verify_result* result,
                                                      size_t peer, size_t index, uint64_t* offset,
                                                      uint64_t* length);

#ifdef __cplusplus
}
#endif

#endif /* PMIRROR_PMIRROR_H */
