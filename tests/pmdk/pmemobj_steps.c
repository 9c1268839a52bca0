/*
 * pmemobj-steps: a libpmemobj program driven one step at a time from its
 * standard input, so that a test can place a fault between two steps
 * (tests/pmdk/observation_point_test.sh). Knows nothing of pmirror.
 *
 *   pmemobj-steps POOL     (created at 16 MiB if it does not exist)
 *
 * One step a line: "tx" (a transaction: the root's counter + 1), "sleep MS",
 * "say TEXT" (TEXT and a newline to standard output with write(2): under
 * pmirror-run an observation point). Input is read with read(2), which is
 * none. Ends at the end of its input; exit 1 on a failed step.
 */
#include <libpmemobj.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LAYOUT "pmirror-steps"
#define NEW_POOL_SIZE (16u << 20)

struct root {
  uint64_t counter;
};

/* One line of standard input without its newline; 0 at the end. */
static int read_line(char* line, size_t size) {
  size_t n = 0;
  char c = 0;
  while (read(STDIN_FILENO, &c, 1) == 1) {
    if (c == '\n') break;
    if (n + 1 < size) line[n++] = c;
  }
  line[n] = '\0';
  return n > 0 || c == '\n';
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: pmemobj-steps POOL (steps on stdin: tx, sleep MS, say TEXT)\n");
    return 2;
  }
  PMEMobjpool* pop = pmemobj_open(argv[1], LAYOUT);
  if (pop == NULL) {
    struct stat st;
    int exists = stat(argv[1], &st) == 0;
    pop = pmemobj_create(argv[1], LAYOUT, exists ? 0 : NEW_POOL_SIZE, 0600);
  }
  if (pop == NULL) {
    fprintf(stderr, "pmemobj-steps: %s: %s\n", argv[1], pmemobj_errormsg());
    return 1;
  }
  PMEMoid root_oid = pmemobj_root(pop, sizeof(struct root));
  struct root* r = pmemobj_direct(root_oid);
  char line[256];
  int status = 0;
  while (status == 0 && read_line(line, sizeof(line))) {
    if (strcmp(line, "tx") == 0) {
      TX_BEGIN(pop) {
        pmemobj_tx_add_range(root_oid, 0, sizeof(struct root));
        r->counter++;
      }
      TX_ONABORT { status = 1; }
      TX_END
    } else if (strncmp(line, "sleep ", 6) == 0) {
      long ms = atol(line + 6);
      struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    } else if (strncmp(line, "say ", 4) == 0) {
      size_t n = strlen(line);
      line[n] = '\n';
      if (write(STDOUT_FILENO, line + 4, n - 3) != (ssize_t)(n - 3)) status = 1;
    } else if (line[0] != '\0') {
      fprintf(stderr, "pmemobj-steps: unknown step '%s'\n", line);
      status = 1;
    }
  }
  pmemobj_close(pop);
  return status;
}
