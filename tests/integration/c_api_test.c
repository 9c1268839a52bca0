/* Compiled as C: proves pmirror.h is a C header and the API works from C. */
#include <pmirror/pmirror.h>
#include <stdio.h>
#include <string.h>

int c_api_mirror(const char *local_path, uint16_t port, const char *secret, char *error,
                 size_t error_size) {
  struct pmirror_replica replica = {"127.0.0.1", port, "tcp", secret};
  struct pmirror_options options;
  memset(&options, 0, sizeof options);
  options.name = "vol";
  options.local_path = local_path;
  options.size = 1 << 20;
  options.create = 1;
  options.identity = "app";
  options.replicas = &replica;
  options.replica_count = 1;

  pmirror_volume *volume = NULL;
  int rc = pmirror_open(&options, &volume);
  if (rc != 0) {
    snprintf(error, error_size, "open: %d %s", rc, pmirror_errormsg());
    return rc;
  }
  const char message[] = "hello from C";
  rc = pmirror_write(volume, 4096, message, sizeof message);
  if (rc == 0) {
    char *data = pmirror_data(volume);
    memcpy(data + 8192, message, sizeof message);
    uint64_t sequence = 0;
    rc = pmirror_persist_async(volume, 8192, sizeof message, &sequence);
    if (rc == 0) rc = pmirror_wait(volume, sequence);
  }
  if (rc == 0) {
    /* Out of range: a clear error, not a crash. */
    int bad = pmirror_persist(volume, pmirror_size(volume), 1);
    if (bad != -PMIRROR_E_INVALID_ARGUMENT || strstr(pmirror_errormsg(), "outside") == NULL) {
      snprintf(error, error_size, "out-of-range persist gave %d '%s'", bad, pmirror_errormsg());
      rc = -1;
    }
  } else {
    snprintf(error, error_size, "write: %d %s", rc, pmirror_errormsg());
  }
  pmirror_close(volume);
  return rc;
}

int c_api_open_null(void) { return pmirror_open(NULL, NULL); }
