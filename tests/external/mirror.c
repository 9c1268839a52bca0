/* An application of libpmirror's C API, built outside the pmirror tree
 * against an installed one only (install_and_mirror.sh). It opens volume
 * c1 from the cluster file and volume c2 through a pmirror_cfg, writes a
 * message into each, and checks what the library reports.
 *
 *   mirror-c CLUSTER_FILE C2_LOCAL_PATH TARGET_PORT SECRET MESSAGE1 MESSAGE2 */
#include <pmirror/pmirror.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "mirror-c: %s: %s: %s\n", what, pmirror_strerror(rc), pmirror_errormsg());
    exit(1);
  }
  return rc;
}

static void expect(int condition, const char *what) {
  if (!condition) {
    fprintf(stderr, "mirror-c: expected %s\n", what);
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: mirror-c CLUSTER_FILE C2_LOCAL_PATH PORT SECRET MESSAGE1 MESSAGE2\n");
    return 2;
  }
  const char *cluster_file = argv[1], *c2_path = argv[2], *secret = argv[4];
  uint16_t port = (uint16_t)atoi(argv[3]);
  const char *message1 = argv[5], *message2 = argv[6];

  int major = 0, minor = 0, patch = 0;
  pmirror_version(&major, &minor, &patch);
  expect(major == PMIRROR_VERSION_MAJOR && minor == PMIRROR_VERSION_MINOR,
         "the library's version to be the headers'");
  printf("mirror-c: libpmirror %s\n", pmirror_version_string());

  /* c1: everything from the cluster file; this is node "app". */
  pmirror_volume *c1 = NULL;
  check(pmirror_open_from_config(cluster_file, "c1", "app", "app", &c1), "open c1");
  check(pmirror_write(c1, 4096, message1, strlen(message1)), "write c1");

  /* c2: the same, spelled out in a pmirror_cfg. */
  struct pmirror_cfg *cfg = NULL;
  check(pmirror_cfg_new(&cfg), "cfg_new");
  check(pmirror_cfg_set_name(cfg, "c2"), "cfg name");
  check(pmirror_cfg_set_local_path(cfg, c2_path), "cfg local_path");
  check(pmirror_cfg_set_size(cfg, 1 << 20), "cfg size");
  check(pmirror_cfg_set_create(cfg, true), "cfg create");
  check(pmirror_cfg_set_identity(cfg, "app"), "cfg identity");
  check(pmirror_cfg_add_replica(cfg, "127.0.0.1", port, "tcp", secret, "target"), "cfg replica");
  check(pmirror_cfg_set_ack(cfg, 1), "cfg ack");
  check(pmirror_cfg_set_on_insufficient(cfg, PMIRROR_ON_INSUFFICIENT_FAIL), "cfg on_insufficient");
  check(pmirror_cfg_set_operation_timeout(cfg, 30000), "cfg operation_timeout");
  expect(pmirror_cfg_set_max_in_flight(cfg, 0) == -PMIRROR_E_INVALID_ARGUMENT,
         "max_in_flight 0 to be refused");
  pmirror_volume *c2 = NULL;
  int rc = pmirror_open(cfg, &c2);
  pmirror_cfg_delete(&cfg);
  check(rc, "open c2");

  /* Asynchronous persists, then a wait for the last. */
  char *data = pmirror_data(c2);
  size_t length = strlen(message2);
  uint64_t sequence = 0;
  memcpy(data + 4096, message2, length);
  check(pmirror_persist_async(c2, 4096, length, &sequence), "persist_async c2");
  for (uint64_t offset = 65536; offset < 131072; offset += 4096) {
    memset(data + offset, (int)(offset >> 12), 4096);
    check(pmirror_persist_async(c2, offset, 4096, &sequence), "persist_async c2");
  }
  check(pmirror_wait(c2, sequence), "wait c2");

  char *json = NULL;
  check(pmirror_status(c2, &json), "status c2");
  expect(strstr(json, "\"state\":\"connected\"") != NULL, "replica target connected in status");
  pmirror_status_free(&json);

  struct pmirror_verify_result *result = NULL;
  size_t mismatches = 1;
  check(pmirror_verify(c2, "target", false, &result), "verify c2");
  check(pmirror_verify_result_get_mismatch_count(result, 0, &mismatches), "mismatch count");
  pmirror_verify_result_delete(&result);
  expect(mismatches == 0, "verify to find the replica equal");

  expect(pmirror_persist(c2, pmirror_size(c2), 1) == -PMIRROR_E_INVALID_ARGUMENT,
         "a persist past the end to be refused");
  check(pmirror_close(&c2), "close c2");
  check(pmirror_close(&c1), "close c1");
  printf("mirror-c: wrote c1 and c2\n");
  return 0;
}
