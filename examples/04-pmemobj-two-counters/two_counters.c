/*
 * pmemobj-two-counters: each libpmemobj transaction adds one to two counters
 * that must always be equal, kept far apart in the pool. It knows nothing of
 * pmirror: run it under pmirror-run and its pool is mirrored (docs/pmdk.md;
 * tests/pmdk/kill_test.sh kills it and checks the replicas).
 *
 *   pmemobj-two-counters run POOL LOG COUNT
 *       COUNT transactions; after each commit, "committed K" is appended to
 *       LOG (one write: the commit made visible outside the process). POOL
 *       is created if it is not a pool yet: an existing zero-filled file of
 *       at least 16 MiB (pmirror's `create: true`) or a new 16 MiB file.
 *       With TWO_COUNTERS_LOG_IN_TX=1 in the environment, the line of
 *       transaction K is written inside transaction K+1 instead (the last
 *       one after the loop): a write inside a libpmemobj transaction, which
 *       pmirror-run's observed mode serves from its own thread.
 *   pmemobj-two-counters check POOL [LOG]
 *       opens POOL (a copy: libpmemobj's recovery writes to it) and checks
 *       that the two counters are equal and that the newest node holds their
 *       value, and with LOG, that the pool holds at least the last
 *       transaction logged.
 *
 * Transaction K sets counter a (in the root object) and counter b (the last
 * word of a 6 MiB object allocated with the pool, so that b lies more than
 * 4 MiB after a: other 64 KiB chunks and another 4 MiB activity-log extent
 * of pmirror's) to K, and replaces the root's node (a small object holding K)
 * by a new one: pmemobj_tx_alloc and pmemobj_tx_free, so the allocator's
 * redo log is in every transaction besides the undo log of the counters. A
 * copy that kept part of a transaction shows a != b, or a node that
 * disagrees with them.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libpmemobj.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LAYOUT "pmirror-two-counters"
#define FAR_SIZE (6u << 20)
#define NEW_POOL_SIZE (16u << 20)
#define TYPE_FAR 1
#define TYPE_NODE 2

struct root {
  uint64_t a;
  PMEMoid far; /* FAR_SIZE bytes; counter b is its last word */
  PMEMoid node;
};

struct node {
  uint64_t value;
};

static uint64_t* counter_b(PMEMoid far) {
  return (uint64_t*)((char*)pmemobj_direct(far) + FAR_SIZE - sizeof(uint64_t));
}

static PMEMobjpool* open_or_create(const char* path) {
  PMEMobjpool* pop = pmemobj_open(path, LAYOUT);
  if (pop != NULL) return pop;
  struct stat st;
  int exists = stat(path, &st) == 0;
  pop = pmemobj_create(path, LAYOUT, exists ? 0 : NEW_POOL_SIZE, 0600);
  if (pop == NULL) fprintf(stderr, "pmemobj-two-counters: %s: %s\n", path, pmemobj_errormsg());
  return pop;
}

/* The far object, once per pool (a transaction of its own): 0 or -1. */
static int prepare(PMEMobjpool* pop, PMEMoid root_oid) {
  struct root* r = pmemobj_direct(root_oid);
  if (!OID_IS_NULL(r->far)) return 0;
  volatile int failed = 0;
  TX_BEGIN(pop) {
    pmemobj_tx_add_range(root_oid, offsetof(struct root, far), sizeof(PMEMoid));
    r->far = pmemobj_tx_zalloc(FAR_SIZE, TYPE_FAR);
  }
  TX_ONABORT { failed = 1; }
  TX_END
  return failed ? -1 : 0;
}

/*
 * One transaction: 0, or -1 if it aborted. Locals that a transaction
 * changes and that are read after it are volatile (TX_BEGIN is a setjmp).
 */
static int transaction(PMEMobjpool* pop, PMEMoid root_oid, uint64_t* committed, int log_fd,
                       const char* line_before) {
  struct root* r = pmemobj_direct(root_oid);
  volatile uint64_t k = 0;
  volatile int failed = 0;
  TX_BEGIN(pop) {
    if (line_before != NULL && line_before[0] != '\0') {
      size_t n = strlen(line_before);
      if (write(log_fd, line_before, n) != (ssize_t)n) pmemobj_tx_abort(errno != 0 ? errno : EIO);
    }
    k = r->a + 1;
    pmemobj_tx_add_range(root_oid, offsetof(struct root, a), sizeof(uint64_t));
    pmemobj_tx_add_range(r->far, FAR_SIZE - sizeof(uint64_t), sizeof(uint64_t));
    pmemobj_tx_add_range(root_oid, offsetof(struct root, node), sizeof(PMEMoid));
    PMEMoid fresh = pmemobj_tx_alloc(sizeof(struct node), TYPE_NODE);
    ((struct node*)pmemobj_direct(fresh))->value = k;
    if (!OID_IS_NULL(r->node)) pmemobj_tx_free(r->node);
    r->node = fresh;
    r->a = k;
    *counter_b(r->far) = k;
  }
  TX_ONABORT { failed = 1; }
  TX_END
  *committed = k;
  return failed ? -1 : 0;
}

static int run(const char* pool, const char* log, uint64_t count) {
  PMEMobjpool* pop = open_or_create(pool);
  if (pop == NULL) return 1;
  int log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (log_fd < 0) {
    fprintf(stderr, "pmemobj-two-counters: %s: %s\n", log, strerror(errno));
    pmemobj_close(pop);
    return 1;
  }
  PMEMoid root_oid = pmemobj_root(pop, sizeof(struct root));
  int status = 0;
  if (OID_IS_NULL(root_oid) || prepare(pop, root_oid) != 0) {
    fprintf(stderr, "pmemobj-two-counters: cannot prepare the pool: %s\n", pmemobj_errormsg());
    status = 1;
  }
  const char* in_tx = getenv("TWO_COUNTERS_LOG_IN_TX");
  const int log_in_tx = in_tx != NULL && strcmp(in_tx, "1") == 0;
  char line[64] = "";
  for (uint64_t i = 0; i < count && status == 0; i++) {
    uint64_t k;
    if (transaction(pop, root_oid, &k, log_fd, log_in_tx ? line : NULL) != 0) {
      fprintf(stderr, "pmemobj-two-counters: transaction aborted: %s\n", pmemobj_errormsg());
      status = 1;
      break;
    }
    int n = snprintf(line, sizeof(line), "committed %" PRIu64 "\n", k);
    if (!log_in_tx && write(log_fd, line, (size_t)n) != n) {
      fprintf(stderr, "pmemobj-two-counters: %s: %s\n", log, strerror(errno));
      status = 1;
    }
  }
  if (log_in_tx && status == 0 && line[0] != '\0' &&
      write(log_fd, line, strlen(line)) != (ssize_t)strlen(line)) {
    fprintf(stderr, "pmemobj-two-counters: %s: %s\n", log, strerror(errno));
    status = 1;
  }
  if (status == 0) {
    const struct root* r = pmemobj_direct(root_oid);
    printf("transactions %" PRIu64 "\n", r->a);
  }
  close(log_fd);
  pmemobj_close(pop);
  return status;
}

static uint64_t last_logged(const char* log) {
  FILE* f = fopen(log, "r");
  uint64_t last = 0, k;
  if (f == NULL) return 0;
  while (fscanf(f, "committed %" SCNu64 "\n", &k) == 1) last = k;
  fclose(f);
  return last;
}

static int check(const char* pool, const char* log) {
  PMEMobjpool* pop = pmemobj_open(pool, LAYOUT);
  if (pop == NULL) {
    fprintf(stderr, "pmemobj-two-counters: cannot open %s: %s\n", pool, pmemobj_errormsg());
    return 1;
  }
  const struct root* r = pmemobj_direct(pmemobj_root(pop, sizeof(struct root)));
  int bad = 0;
  uint64_t a = r->a;
  if (OID_IS_NULL(r->far)) {
    /* Killed before its first transaction: nothing may have committed. */
    if (a != 0 || !OID_IS_NULL(r->node)) {
      fprintf(stderr, "torn: counter a is %" PRIu64 " and the far object is missing\n", a);
      bad = 1;
    }
  } else {
    uint64_t b = *counter_b(r->far);
    if (a != b) {
      fprintf(stderr, "unequal: counter a is %" PRIu64 ", counter b %" PRIu64 "\n", a, b);
      bad = 1;
    }
    if (a == 0 ? !OID_IS_NULL(r->node) : OID_IS_NULL(r->node)) {
      fprintf(stderr, "torn: counter a is %" PRIu64 " and the root %s a node\n", a,
              OID_IS_NULL(r->node) ? "has no" : "has");
      bad = 1;
    } else if (a != 0) {
      uint64_t value = ((const struct node*)pmemobj_direct(r->node))->value;
      if (value != a) {
        fprintf(stderr, "torn: the node holds %" PRIu64 ", the counters %" PRIu64 "\n", value, a);
        bad = 1;
      }
    }
  }
  if (log != NULL) {
    uint64_t logged = last_logged(log);
    if (a < logged) {
      fprintf(stderr,
              "lost: the program saw transaction %" PRIu64 " committed; the pool holds %" PRIu64
              "\n",
              logged, a);
      bad = 1;
    }
    printf("transactions %" PRIu64 " (last logged %" PRIu64 ")\n", a, logged);
  } else {
    printf("transactions %" PRIu64 "\n", a);
  }
  pmemobj_close(pop);
  return bad;
}

int main(int argc, char** argv) {
  if (argc == 5 && strcmp(argv[1], "run") == 0)
    return run(argv[2], argv[3], strtoull(argv[4], NULL, 10));
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "check") == 0)
    return check(argv[2], argc == 4 ? argv[3] : NULL);
  fprintf(stderr,
          "usage: pmemobj-two-counters run POOL LOG COUNT\n"
          "       pmemobj-two-counters check POOL [LOG]\n");
  return 2;
}
