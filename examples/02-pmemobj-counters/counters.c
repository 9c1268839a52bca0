/*
 * pmemobj-counters: libpmemobj transactions over an array of counters. It
 * knows nothing of pmirror: run it under pmirror-run and its pool is
 * mirrored (docs/pmdk.md).
 *
 *   pmemobj-counters run POOL LOG COUNT
 *       COUNT transactions; after each commit, "committed K" is appended to
 *       LOG (one write: what the program saw committed, for a checker that
 *       kills it). POOL is created if it is not a pool yet: an existing
 *       zero-filled file of the right size (pmirror's `create: true`) or a
 *       new 16 MiB file.
 *   pmemobj-counters bench POOL COUNT [LOG]
 *       COUNT transactions, timed one by one: transactions per second, p50
 *       and p99 (scripts/bench-pmdk.sh). With LOG, each transaction is
 *       followed by its "committed K" line appended to LOG with one
 *       write(2), as in `run` (the commit made visible outside the
 *       process), and the time of one transaction includes that write.
 *   pmemobj-counters check POOL [LOG]
 *       opens POOL (a copy: libpmemobj's recovery writes to it) and checks
 *       that its state is the one left by some whole number of
 *       transactions, and with LOG, at least the last one logged.
 *
 * Transaction K sets transactions = K, slot[K % 64] = K and checksum =
 * transactions + the sum of the slots: a torn transaction breaks the sum or
 * the slots.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libpmemobj.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LAYOUT "pmirror-counters"
#define SLOTS 64
#define NEW_POOL_SIZE (16u << 20)

struct root {
  uint64_t transactions;
  uint64_t slot[SLOTS];
  uint64_t checksum;
};

static uint64_t checksum_of(const struct root* r) {
  uint64_t sum = r->transactions;
  for (int i = 0; i < SLOTS; i++) sum += r->slot[i];
  return sum;
}

static PMEMobjpool* open_or_create(const char* path) {
  PMEMobjpool* pop = pmemobj_open(path, LAYOUT);
  if (pop != NULL) return pop;
  struct stat st;
  int exists = stat(path, &st) == 0;
  pop = pmemobj_create(path, LAYOUT, exists ? 0 : NEW_POOL_SIZE, 0600);
  if (pop == NULL) fprintf(stderr, "pmemobj-counters: %s: %s\n", path, pmemobj_errormsg());
  return pop;
}

/*
 * One transaction: 0, or -1 if it aborted. Locals that a transaction
 * changes and that are read after it are volatile (TX_BEGIN is a setjmp).
 */
static int transaction(PMEMobjpool* pop, PMEMoid root_oid, uint64_t* committed) {
  struct root* r = pmemobj_direct(root_oid);
  volatile uint64_t k = 0;
  volatile int failed = 0;
  TX_BEGIN(pop) {
    pmemobj_tx_add_range(root_oid, 0, sizeof(struct root));
    k = r->transactions + 1;
    r->transactions = k;
    r->slot[k % SLOTS] = k;
    r->checksum = checksum_of(r);
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
    fprintf(stderr, "pmemobj-counters: %s: %s\n", log, strerror(errno));
    pmemobj_close(pop);
    return 1;
  }
  PMEMoid root_oid = pmemobj_root(pop, sizeof(struct root));
  int status = 0;
  for (uint64_t i = 0; i < count && status == 0; i++) {
    uint64_t k;
    if (transaction(pop, root_oid, &k) != 0) {
      fprintf(stderr, "pmemobj-counters: transaction aborted: %s\n", pmemobj_errormsg());
      status = 1;
      break;
    }
    char line[64];
    int n = snprintf(line, sizeof(line), "committed %" PRIu64 "\n", k);
    if (write(log_fd, line, (size_t)n) != n) {
      fprintf(stderr, "pmemobj-counters: %s: %s\n", log, strerror(errno));
      status = 1;
    }
  }
  if (status == 0) {
    const struct root* r = pmemobj_direct(root_oid);
    printf("transactions %" PRIu64 "\n", r->transactions);
  }
  close(log_fd);
  pmemobj_close(pop);
  return status;
}

static int compare_u64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * COUNT transactions, each timed from before the transaction to after its
 * log line's write (LOG given) or its commit (LOG NULL):
 * "transactions_per_s=R p50_us=A p99_us=B" (scripts/bench-pmdk.sh;
 * docs/benchmarks.md). bench/pmirror_counters.cpp times the same way.
 */
static int bench(const char* pool, uint64_t count, const char* log) {
  PMEMobjpool* pop = open_or_create(pool);
  if (pop == NULL) return 1;
  int log_fd = -1;
  if (log != NULL && (log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600)) < 0) {
    fprintf(stderr, "pmemobj-counters: %s: %s\n", log, strerror(errno));
    pmemobj_close(pop);
    return 1;
  }
  uint64_t* latency = count > 0 ? calloc(count, sizeof(*latency)) : NULL;
  if (latency == NULL) {
    if (log_fd >= 0) close(log_fd);
    pmemobj_close(pop);
    return 1;
  }
  PMEMoid root_oid = pmemobj_root(pop, sizeof(struct root));
  uint64_t start = now_ns();
  for (uint64_t i = 0; i < count; i++) {
    uint64_t k, t0 = now_ns();
    int failed = transaction(pop, root_oid, &k) != 0;
    if (!failed && log_fd >= 0) {
      char line[64];
      int n = snprintf(line, sizeof(line), "committed %" PRIu64 "\n", k);
      if (write(log_fd, line, (size_t)n) != n) {
        fprintf(stderr, "pmemobj-counters: %s: %s\n", log, strerror(errno));
        failed = 1;
      }
    }
    if (failed) {
      free(latency);
      if (log_fd >= 0) close(log_fd);
      pmemobj_close(pop);
      return 1;
    }
    latency[i] = now_ns() - t0;
  }
  double seconds = (double)(now_ns() - start) / 1e9;
  qsort(latency, count, sizeof(*latency), compare_u64);
  printf("transactions_per_s=%.0f p50_us=%.1f p99_us=%.1f\n", (double)count / seconds,
         (double)latency[count / 2] / 1e3, (double)latency[(count * 99) / 100] / 1e3);
  free(latency);
  if (log_fd >= 0) close(log_fd);
  pmemobj_close(pop);
  return 0;
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
    fprintf(stderr, "pmemobj-counters: cannot open %s: %s\n", pool, pmemobj_errormsg());
    return 1;
  }
  const struct root* r = pmemobj_direct(pmemobj_root(pop, sizeof(struct root)));
  int bad = 0;
  uint64_t k = r->transactions;
  if (r->checksum != checksum_of(r)) {
    fprintf(stderr, "torn: checksum %" PRIu64 ", expected %" PRIu64 "\n", r->checksum,
            checksum_of(r));
    bad = 1;
  }
  for (uint64_t j = 0; j < SLOTS; j++) {
    /* The last transaction up to k that wrote slot j. */
    uint64_t want = k >= j ? k - ((k - j) % SLOTS) : 0;
    if (r->slot[j] != want) {
      fprintf(stderr,
              "torn: slot %" PRIu64 " holds %" PRIu64 ", expected %" PRIu64 " after %" PRIu64
              " transactions\n",
              j, r->slot[j], want, k);
      bad = 1;
      break;
    }
  }
  if (log != NULL) {
    uint64_t logged = last_logged(log);
    if (k < logged) {
      fprintf(stderr,
              "lost: the program saw transaction %" PRIu64 " committed; the pool holds %" PRIu64
              "\n",
              logged, k);
      bad = 1;
    }
    printf("transactions %" PRIu64 " (last logged %" PRIu64 ")\n", k, logged);
  } else {
    printf("transactions %" PRIu64 "\n", k);
  }
  pmemobj_close(pop);
  return bad;
}

int main(int argc, char** argv) {
  if (argc == 5 && strcmp(argv[1], "run") == 0)
    return run(argv[2], argv[3], strtoull(argv[4], NULL, 10));
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "check") == 0)
    return check(argv[2], argc == 4 ? argv[3] : NULL);
  if ((argc == 4 || argc == 5) && strcmp(argv[1], "bench") == 0)
    return bench(argv[2], strtoull(argv[3], NULL, 10), argc == 5 ? argv[4] : NULL);
  fprintf(stderr,
          "usage: pmemobj-counters run POOL LOG COUNT\n"
          "       pmemobj-counters check POOL [LOG]\n"
          "       pmemobj-counters bench POOL COUNT [LOG]\n");
  return 2;
}
