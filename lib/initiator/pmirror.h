/* libpmirror's C API, for PMDK's C users. Every function returns 0 on
 * success or a negative PMIRROR_E_* code; pmirror_errormsg() then says what
 * failed, in words, for the calling thread. No C++ exception crosses it. */
#ifndef PMIRROR_PMIRROR_H
#define PMIRROR_PMIRROR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Negated: the same classes as pmirror::Errc. */
enum pmirror_error {
  PMIRROR_E_INVALID_ARGUMENT = 1,
  PMIRROR_E_NOT_FOUND = 2,
  PMIRROR_E_PERMISSION_DENIED = 3,
  PMIRROR_E_ALREADY_EXISTS = 4,
  PMIRROR_E_IO = 5,
  PMIRROR_E_PROTOCOL = 6,
  PMIRROR_E_CONNECTION = 7,
  PMIRROR_E_TIMEOUT = 8,
  PMIRROR_E_UNSUPPORTED = 9,
  PMIRROR_E_BUSY = 10,
  PMIRROR_E_CONFIG = 11,
  PMIRROR_E_INTERNAL = 12,
  PMIRROR_E_CLOSED = 13,
  PMIRROR_E_RESOURCE_EXHAUSTED = 14
};

struct pmirror_replica {
  const char *address;   /* host name or IP address of the target */
  uint16_t port;         /* 0: 7450 */
  const char *transport; /* "tcp" or "rdma"; NULL: "tcp" */
  const char *secret;    /* the volume's shared secret on that target */
};

struct pmirror_options {
  const char *name;       /* volume name on the targets */
  const char *local_path; /* local copy: devdax, file on fsdax, or plain file */
  uint64_t size;          /* 0: the existing local copy's size */
  int create;             /* non-zero: create the local file if missing */
  const char *identity;   /* who we are to the targets */
  const struct pmirror_replica *replicas;
  size_t replica_count;
  uint32_t max_in_flight; /* 0: 32 */
};

typedef struct pmirror_volume pmirror_volume;

int pmirror_open(const struct pmirror_options *options, pmirror_volume **volume);
/* Drains, disconnects, unmaps. NULL is ignored. */
void pmirror_close(pmirror_volume *volume);

void *pmirror_data(const pmirror_volume *volume);
uint64_t pmirror_size(const pmirror_volume *volume);

/* Returns once [offset, offset+length) is durable locally and on every replica. */
int pmirror_persist(pmirror_volume *volume, uint64_t offset, uint64_t length);
/* memcpy into the mapping, then persist. */
int pmirror_write(pmirror_volume *volume, uint64_t offset, const void *source, uint64_t length);
/* Starts a persist; *sequence identifies it for pmirror_wait. */
int pmirror_persist_async(pmirror_volume *volume, uint64_t offset, uint64_t length,
                          uint64_t *sequence);
int pmirror_wait(pmirror_volume *volume, uint64_t sequence);
int pmirror_drain(pmirror_volume *volume);

/* The last error of the calling thread, "" if none. Valid until its next call. */
const char *pmirror_errormsg(void);

#ifdef __cplusplus
}
#endif

#endif /* PMIRROR_PMIRROR_H */
