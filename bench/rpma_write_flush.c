// rpma-write-flush: librpma's persist latency, the comparator pmirror's lab
// benchmark (scripts/lab/bench.sh) runs next to pmirror-bench in the same
// guest boot (issue 11). librpma is the discontinued Intel library pmirror
// replaces; this is the smallest honest use of it: one RDMA write of SIZE
// bytes to a registered pmem region, then rpma_flush(RPMA_FLUSH_TYPE_PERSISTENT)
// with a completion, busy-polled; each write + flush pair timed.
//
//   rpma-write-flush server ADDR PORT SIZE ITERATIONS WARMUP PATH
//   rpma-write-flush client ADDR PORT SIZE ITERATIONS WARMUP
//
// server: maps PATH with libpmem (a devdax device such as /dev/dax1.0, or a
//   file, created with 16 MiB when missing), registers its first
//   min(length, max(16 MiB, SIZE)) bytes with librpma for
//   RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_FLUSH_TYPE_PERSISTENT, listens on
//   ADDR:PORT, accepts one connection and hands the client the memory
//   descriptor and its peer configuration (direct write to pmem = whether
//   libpmem says the mapping is pmem) in the connection's private data; waits
//   for the client to disconnect, checks that the mapping holds the client's
//   last write, exits. librpma refuses a persistent flush to memory that is
//   not pmem; PMEM_IS_PMEM_FORCE=1 (libpmem) makes a plain file count as pmem
//   for a functional test.
// client: connects to ADDR:PORT, reads the descriptors, runs WARMUP unmeasured
//   and ITERATIONS measured write + flush pairs, each timed with
//   clock_gettime(CLOCK_MONOTONIC) from before rpma_write to the flush's
//   completion, and prints one line:
//     result tool=librpma-flush size=S iterations=N warmup=W p50_us=..
//       p99_us=.. p999_us=.. min_us=.. max_us=.. mean_us=..
//   (nearest-rank percentiles, like pmirror-bench), then disconnects.
//
// librpma 1.2 has no native RDMA FLUSH: a persistent flush is a read of 8
// bytes from the written range after the write (read-after-write), which is
// what pmirror's APM method does too.
//
// Exit status: 0 ok; 2 the client could not connect (the server may not be
// listening yet: retry); 1 any other failure. Every failure names the call
// and librpma's error string (rpma_err_2str) or errno.
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <libpmem.h>
#include <librpma.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROG "rpma-write-flush"
#define REGION_MIN ((size_t)16 << 20)
#define FILE_SIZE ((size_t)16 << 20)
#define WRITE_ID ((uint64_t)0x57)
#define FLUSH_ID ((uint64_t)0xF1)
#define EXIT_CONNECT 2

// What the server puts into the connection's private data (at most 255 bytes
// in librpma; rdma_accept carries 196 on RoCE).
struct wire {
  uint8_t mr_desc_size;
  uint8_t pcfg_desc_size;
  uint8_t is_pmem;
  uint8_t reserved;
  uint32_t region_size;      // bytes registered (also in the mr descriptor)
  uint8_t descriptors[120];  // mr descriptor, then peer configuration descriptor
};

// "CALL failed: librpma's error string (code)", with errno's text when the
// provider (libibverbs/librdmacm) failed.
static void report_rpma(const char* call, int ret) {
  int e = errno;
  if (ret == RPMA_E_PROVIDER && e != 0) {
    fprintf(stderr, PROG ": %s failed: %s (%d); errno: %s\n", call, rpma_err_2str(ret), ret,
            strerror(e));
  } else {
    fprintf(stderr, PROG ": %s failed: %s (%d)\n", call, rpma_err_2str(ret), ret);
  }
}

static void die_rpma(const char* call, int ret) {
  report_rpma(call, ret);
  exit(1);
}

static unsigned long long parse_num(const char* what, const char* s, unsigned long long min,
                                    unsigned long long max) {
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v < min || v > max) {
    fprintf(stderr, PROG ": %s must be a whole number in [%llu, %llu], got '%s'\n", what, min, max,
            s);
    exit(1);
  }
  return v;
}

// The byte pattern of iteration I's source buffer: fixed bytes, the
// iteration number (little endian) in the first min(8, size) bytes.
static void fill(uint8_t* buf, size_t size, uint64_t i) {
  for (size_t j = 8; j < size; j++) buf[j] = (uint8_t)(j * 7 + 13);
  for (size_t j = 0; j < 8 && j < size; j++) buf[j] = (uint8_t)(i >> (8 * j));
}

static struct rpma_peer* peer_for(const char* addr, enum rpma_util_ibv_context_type type) {
  struct ibv_context* ctx = NULL;
  int ret = rpma_utils_get_ibv_context(addr, type, &ctx);
  if (ret) {
    report_rpma("rpma_utils_get_ibv_context", ret);
    fprintf(stderr, PROG ": no RDMA device for %s: is one (e.g. rxe0) bound to that address?\n",
            addr);
    exit(1);
  }
  struct rpma_peer* peer = NULL;
  ret = rpma_peer_new(ctx, &peer);
  if (ret) die_rpma("rpma_peer_new", ret);
  return peer;
}

static int server(const char* addr, const char* port, size_t size, uint64_t total,
                  const char* path) {
  size_t mapped = 0;
  int is_pmem = 0;
  void* map = pmem_map_file(path, 0, 0, 0, &mapped, &is_pmem);
  if (map == NULL && errno == ENOENT) {
    map = pmem_map_file(path, FILE_SIZE, PMEM_FILE_CREATE, 0600, &mapped, &is_pmem);
  }
  if (map == NULL) {
    fprintf(stderr, PROG ": pmem_map_file(%s) failed: %s\n", path, pmem_errormsg());
    return 1;
  }
  size_t region = size > REGION_MIN ? size : REGION_MIN;
  if (region > mapped) region = mapped;
  if (region < size || region > UINT32_MAX) {
    fprintf(stderr, PROG ": %s maps %zu bytes; need %zu (and at most 4 GiB registered)\n", path,
            mapped, size);
    pmem_unmap(map, mapped);
    return 1;
  }
  fprintf(stderr, PROG " server: %s mapped, %zu bytes, is_pmem=%d; registering %zu bytes\n", path,
          mapped, is_pmem, region);
  if (!is_pmem) {
    fprintf(stderr,
            PROG
            " server: warning: libpmem says %s is not pmem: the client's persistent "
            "flush will be refused (PMEM_IS_PMEM_FORCE=1 overrides for a functional test)\n",
            path);
  }

  struct rpma_peer_cfg* pcfg = NULL;
  int ret = rpma_peer_cfg_new(&pcfg);
  if (ret) die_rpma("rpma_peer_cfg_new", ret);
  ret = rpma_peer_cfg_set_direct_write_to_pmem(pcfg, is_pmem != 0);
  if (ret) die_rpma("rpma_peer_cfg_set_direct_write_to_pmem", ret);

  struct rpma_peer* peer = peer_for(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL);
  struct rpma_ep* ep = NULL;
  ret = rpma_ep_listen(peer, addr, port, &ep);
  if (ret) {
    report_rpma("rpma_ep_listen", ret);
    fprintf(stderr, PROG ": cannot listen on %s:%s\n", addr, port);
    return 1;
  }
  struct rpma_mr_local* mr = NULL;
  ret = rpma_mr_reg(peer, map, region,
                    RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_FLUSH_TYPE_PERSISTENT, &mr);
  if (ret) {
    report_rpma("rpma_mr_reg", ret);
    fprintf(stderr,
            PROG
            ": cannot register %zu bytes of %s (on fsdax that needs on-demand "
            "paging, which rxe lacks: use devdax)\n",
            region, path);
    return 1;
  }

  struct wire w;
  memset(&w, 0, sizeof w);
  size_t mr_desc = 0, pcfg_desc = 0;
  ret = rpma_mr_get_descriptor_size(mr, &mr_desc);
  if (ret) die_rpma("rpma_mr_get_descriptor_size", ret);
  ret = rpma_peer_cfg_get_descriptor_size(pcfg, &pcfg_desc);
  if (ret) die_rpma("rpma_peer_cfg_get_descriptor_size", ret);
  if (mr_desc + pcfg_desc > sizeof w.descriptors) {
    fprintf(stderr, PROG ": descriptors too large (%zu + %zu > %zu)\n", mr_desc, pcfg_desc,
            sizeof w.descriptors);
    return 1;
  }
  w.mr_desc_size = (uint8_t)mr_desc;
  w.pcfg_desc_size = (uint8_t)pcfg_desc;
  w.is_pmem = (uint8_t)(is_pmem != 0);
  w.region_size = (uint32_t)region;
  ret = rpma_mr_get_descriptor(mr, &w.descriptors[0]);
  if (ret) die_rpma("rpma_mr_get_descriptor", ret);
  ret = rpma_peer_cfg_get_descriptor(pcfg, &w.descriptors[mr_desc]);
  if (ret) die_rpma("rpma_peer_cfg_get_descriptor", ret);

  struct rpma_conn_req* req = NULL;
  ret = rpma_ep_next_conn_req(ep, NULL, &req);
  if (ret) die_rpma("rpma_ep_next_conn_req", ret);
  struct rpma_conn_private_data pdata = {.ptr = &w, .len = (uint8_t)sizeof w};
  struct rpma_conn* conn = NULL;
  ret = rpma_conn_req_connect(&req, &pdata, &conn);
  if (ret) die_rpma("rpma_conn_req_connect (accept)", ret);
  enum rpma_conn_event ev = RPMA_CONN_UNDEFINED;
  ret = rpma_conn_next_event(conn, &ev);
  if (ret) die_rpma("rpma_conn_next_event (established)", ret);
  if (ev != RPMA_CONN_ESTABLISHED) {
    fprintf(stderr, PROG ": expected the connection established, got %s\n",
            rpma_utils_conn_event_2str(ev));
    return 1;
  }
  // Nothing to do while the client writes: its writes and reads are one-sided.
  ret = rpma_conn_next_event(conn, &ev);
  if (ret) die_rpma("rpma_conn_next_event (closed)", ret);
  int status = 0;
  if (ev != RPMA_CONN_CLOSED) {
    fprintf(stderr, PROG ": expected the client to close the connection, got %s\n",
            rpma_utils_conn_event_2str(ev));
    status = 1;
  }
  ret = rpma_conn_disconnect(conn);
  if (ret) die_rpma("rpma_conn_disconnect", ret);
  ret = rpma_conn_delete(&conn);
  if (ret) die_rpma("rpma_conn_delete", ret);

  // The client's last write is in the region (it was flushed before the
  // client disconnected).
  if (status == 0 && !is_pmem) {
    fprintf(stderr, PROG ": %s is not pmem: the client does not write to it\n", path);
    status = 1;
  } else if (status == 0 && total > 0) {
    uint8_t* expect = malloc(size);
    if (expect == NULL) {
      fprintf(stderr, PROG ": malloc(%zu) failed\n", size);
      return 1;
    }
    fill(expect, size, total - 1);
    if (memcmp(expect, map, size) != 0) {
      fprintf(stderr, PROG ": the region does not hold the client's last write (%zu bytes)\n",
              size);
      status = 1;
    } else {
      fprintf(stderr, PROG " server: the region holds the client's last write (%zu bytes)\n", size);
    }
    free(expect);
  }

  ret = rpma_mr_dereg(&mr);
  if (ret) die_rpma("rpma_mr_dereg", ret);
  ret = rpma_ep_shutdown(&ep);
  if (ret) die_rpma("rpma_ep_shutdown", ret);
  ret = rpma_peer_delete(&peer);
  if (ret) die_rpma("rpma_peer_delete", ret);
  ret = rpma_peer_cfg_delete(&pcfg);
  if (ret) die_rpma("rpma_peer_cfg_delete", ret);
  pmem_unmap(map, mapped);
  return status;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// Nearest-rank percentile of sorted samples (as pmirror-bench computes them).
static double rank(const double* sorted, size_t n, double p) {
  double r = p * (double)n;
  size_t k = (size_t)r;
  if ((double)k < r) k++;
  if (k < 1) k = 1;
  if (k > n) k = n;
  return sorted[k - 1];
}

static double now_us(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
    fprintf(stderr, PROG ": clock_gettime(CLOCK_MONOTONIC) failed: %s\n", strerror(errno));
    exit(1);
  }
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int client(const char* addr, const char* port, size_t size, uint64_t iters,
                  uint64_t warmup) {
  struct rpma_peer* peer = peer_for(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE);
  struct rpma_conn_req* req = NULL;
  int ret = rpma_conn_req_new(peer, addr, port, NULL, &req);
  if (ret) {
    report_rpma("rpma_conn_req_new", ret);
    fprintf(stderr, PROG ": could not connect to %s:%s\n", addr, port);
    return EXIT_CONNECT;
  }
  struct rpma_conn* conn = NULL;
  ret = rpma_conn_req_connect(&req, NULL, &conn);
  if (ret) {
    report_rpma("rpma_conn_req_connect", ret);
    fprintf(stderr, PROG ": could not connect to %s:%s\n", addr, port);
    return EXIT_CONNECT;
  }
  enum rpma_conn_event ev = RPMA_CONN_UNDEFINED;
  ret = rpma_conn_next_event(conn, &ev);
  if (ret || ev != RPMA_CONN_ESTABLISHED) {
    if (ret) {
      report_rpma("rpma_conn_next_event", ret);
      fprintf(stderr, PROG ": could not connect to %s:%s\n", addr, port);
    } else {
      fprintf(stderr, PROG ": could not connect to %s:%s: %s (is the server listening?)\n", addr,
              port, rpma_utils_conn_event_2str(ev));
    }
    (void)rpma_conn_delete(&conn);
    return EXIT_CONNECT;
  }

  struct rpma_conn_private_data pdata = {0};
  ret = rpma_conn_get_private_data(conn, &pdata);
  if (ret) die_rpma("rpma_conn_get_private_data", ret);
  struct wire w;
  if (pdata.ptr == NULL || pdata.len < sizeof w) {
    fprintf(stderr,
            PROG ": the server's private data has %u bytes, expected %zu (not a " PROG
                 " server?)\n",
            (unsigned)pdata.len, sizeof w);
    return 1;
  }
  memcpy(&w, pdata.ptr, sizeof w);
  if ((size_t)w.mr_desc_size + w.pcfg_desc_size > sizeof w.descriptors) {
    fprintf(stderr, PROG ": the server's descriptors are malformed\n");
    return 1;
  }
  struct rpma_peer_cfg* pcfg = NULL;
  ret = rpma_peer_cfg_from_descriptor(&w.descriptors[w.mr_desc_size], w.pcfg_desc_size, &pcfg);
  if (ret) die_rpma("rpma_peer_cfg_from_descriptor", ret);
  bool direct = false;
  ret = rpma_peer_cfg_get_direct_write_to_pmem(pcfg, &direct);
  if (ret) die_rpma("rpma_peer_cfg_get_direct_write_to_pmem", ret);
  ret = rpma_conn_apply_remote_peer_cfg(conn, pcfg);
  if (ret) die_rpma("rpma_conn_apply_remote_peer_cfg", ret);
  (void)rpma_peer_cfg_delete(&pcfg);
  if (!direct) {
    fprintf(stderr,
            PROG
            ": the server's memory is not pmem (is_pmem=%u): librpma refuses "
            "RPMA_FLUSH_TYPE_PERSISTENT there\n",
            (unsigned)w.is_pmem);
    (void)rpma_conn_disconnect(conn);
    return 1;
  }
  struct rpma_mr_remote* dst = NULL;
  ret = rpma_mr_remote_from_descriptor(&w.descriptors[0], w.mr_desc_size, &dst);
  if (ret) die_rpma("rpma_mr_remote_from_descriptor", ret);
  size_t dst_size = 0;
  ret = rpma_mr_remote_get_size(dst, &dst_size);
  if (ret) die_rpma("rpma_mr_remote_get_size", ret);
  if (dst_size < size) {
    fprintf(stderr, PROG ": the server registered %zu bytes, less than the size %zu\n", dst_size,
            size);
    return 1;
  }
  int flush_type = 0;
  ret = rpma_mr_remote_get_flush_type(dst, &flush_type);
  if (ret) die_rpma("rpma_mr_remote_get_flush_type", ret);
  if (!(flush_type & RPMA_MR_USAGE_FLUSH_TYPE_PERSISTENT)) {
    fprintf(stderr, PROG ": the server's region is not registered for a persistent flush\n");
    return 1;
  }

  long page = sysconf(_SC_PAGESIZE);
  void* buf = NULL;
  int err = posix_memalign(&buf, page > 0 ? (size_t)page : 4096, size);
  if (err != 0) {
    fprintf(stderr, PROG ": posix_memalign(%zu) failed: %s\n", size, strerror(err));
    return 1;
  }
  memset(buf, 0, size);
  struct rpma_mr_local* src = NULL;
  ret = rpma_mr_reg(peer, buf, size, RPMA_MR_USAGE_WRITE_SRC, &src);
  if (ret) die_rpma("rpma_mr_reg (source buffer)", ret);
  struct rpma_cq* cq = NULL;
  ret = rpma_conn_get_cq(conn, &cq);
  if (ret) die_rpma("rpma_conn_get_cq", ret);

  double* lat = malloc((iters > 0 ? iters : 1) * sizeof *lat);
  if (lat == NULL) {
    fprintf(stderr, PROG ": malloc of %" PRIu64 " samples failed\n", iters);
    return 1;
  }
  uint64_t total = warmup + iters;
  for (uint64_t i = 0; i < total; i++) {
    fill(buf, size, i);
    double t0 = now_us();
    // The write asks for a completion only on error; the flush (librpma 1.2:
    // an 8-byte read after the write on the same QP) always: its completion
    // means the write reached the server's persistence domain.
    ret = rpma_write(conn, dst, 0, src, 0, size, RPMA_F_COMPLETION_ON_ERROR,
                     (const void*)(uintptr_t)WRITE_ID);
    if (ret) die_rpma("rpma_write", ret);
    ret = rpma_flush(conn, dst, 0, size, RPMA_FLUSH_TYPE_PERSISTENT, RPMA_F_COMPLETION_ALWAYS,
                     (const void*)(uintptr_t)FLUSH_ID);
    if (ret) die_rpma("rpma_flush(RPMA_FLUSH_TYPE_PERSISTENT)", ret);
    struct ibv_wc wc;
    for (;;) {
      ret = rpma_cq_get_wc(cq, 1, &wc, NULL);
      if (ret == RPMA_E_NO_COMPLETION) continue;
      if (ret) die_rpma("rpma_cq_get_wc", ret);
      if (wc.status != IBV_WC_SUCCESS) {
        fprintf(stderr, PROG ": %s failed at iteration %" PRIu64 ": %s (vendor error %u)\n",
                wc.wr_id == WRITE_ID ? "rpma_write" : "rpma_flush", i, ibv_wc_status_str(wc.status),
                wc.vendor_err);
        return 1;
      }
      if (wc.wr_id == FLUSH_ID) break;
      fprintf(stderr, PROG ": unexpected completion (wr_id 0x%" PRIx64 ", opcode %d)\n",
              (uint64_t)wc.wr_id, (int)wc.opcode);
      return 1;
    }
    double t1 = now_us();
    if (i >= warmup) lat[i - warmup] = t1 - t0;
  }

  if (iters > 0) {
    double sum = 0;
    for (uint64_t i = 0; i < iters; i++) sum += lat[i];
    qsort(lat, iters, sizeof *lat, cmp_double);
    printf("result tool=librpma-flush size=%zu iterations=%" PRIu64 " warmup=%" PRIu64
           " p50_us=%.3f p99_us=%.3f p999_us=%.3f min_us=%.3f max_us=%.3f mean_us=%.3f\n",
           size, iters, warmup, rank(lat, iters, 0.50), rank(lat, iters, 0.99),
           rank(lat, iters, 0.999), lat[0], lat[iters - 1], sum / (double)iters);
    fflush(stdout);
  }
  free(lat);

  ret = rpma_mr_dereg(&src);
  if (ret) die_rpma("rpma_mr_dereg", ret);
  ret = rpma_mr_remote_delete(&dst);
  if (ret) die_rpma("rpma_mr_remote_delete", ret);
  ret = rpma_conn_disconnect(conn);
  if (ret) die_rpma("rpma_conn_disconnect", ret);
  ret = rpma_conn_next_event(conn, &ev);
  if (ret) die_rpma("rpma_conn_next_event (closed)", ret);
  if (ev != RPMA_CONN_CLOSED) {
    fprintf(stderr, PROG ": expected the connection closed, got %s\n",
            rpma_utils_conn_event_2str(ev));
  }
  ret = rpma_conn_delete(&conn);
  if (ret) die_rpma("rpma_conn_delete", ret);
  ret = rpma_peer_delete(&peer);
  if (ret) die_rpma("rpma_peer_delete", ret);
  free(buf);
  return 0;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: " PROG
          " server ADDR PORT SIZE ITERATIONS WARMUP PATH\n"
          "       " PROG
          " client ADDR PORT SIZE ITERATIONS WARMUP\n"
          "librpma write of SIZE bytes + rpma_flush(RPMA_FLUSH_TYPE_PERSISTENT), busy-polled,\n"
          "WARMUP unmeasured + ITERATIONS measured; the client prints\n"
          "  result tool=librpma-flush size=.. p50_us=.. p99_us=.. p999_us=.. min_us=.. max_us=..\n"
          "PATH: a devdax device (e.g. /dev/dax1.0) or a file (created with 16 MiB if missing).\n"
          "Exit status: 0 ok, 2 client could not connect (retry), 1 other failure.\n");
}

int main(int argc, char** argv) {
  if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    usage(stdout);
    return 0;
  }
  bool is_server = argc == 8 && strcmp(argv[1], "server") == 0;
  bool is_client = argc == 7 && strcmp(argv[1], "client") == 0;
  if (!is_server && !is_client) {
    usage(stderr);
    return 1;
  }
  // librpma's own messages (e.g. which verbs call failed) of level error and
  // worse go to stderr too, not only to syslog.
  (void)rpma_log_set_threshold(RPMA_LOG_THRESHOLD_AUX, RPMA_LOG_LEVEL_ERROR);
  const char *addr = argv[2], *port = argv[3];
  (void)parse_num("PORT", port, 1, 65535);
  size_t size = (size_t)parse_num("SIZE", argv[4], 1, (unsigned long long)1 << 30);
  uint64_t iters = parse_num("ITERATIONS", argv[5], 0, 100000000);
  uint64_t warmup = parse_num("WARMUP", argv[6], 0, 100000000);
  if (is_server) return server(addr, port, size, warmup + iters, argv[7]);
  return client(addr, port, size, iters, warmup);
}
