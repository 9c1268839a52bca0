/*
 * pmemlog-records: appends numbered, checksummed records to a libpmemlog
 * pool. It knows nothing of pmirror: run it under pmirror-run and the log
 * is mirrored (docs/pmdk.md).
 *
 *   pmemlog-records run POOL LOG COUNT
 *       COUNT appends (pmemlog_append); after each, "committed K" is
 *       appended to LOG. POOL is created if it is not a log pool yet (an
 *       existing zero-filled file: pmirror's `create: true`).
 *   pmemlog-records check POOL [LOG]
 *       walks the log: records 1..N in order, each whole (its checksum),
 *       and with LOG, N at least the last one logged.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libpmemlog.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RECORD_SIZE 64
#define NEW_POOL_SIZE (16u << 20)

struct record {
	uint64_t number;
	uint64_t checksum;
	char text[RECORD_SIZE - 2 * sizeof(uint64_t)];
};

static uint64_t
checksum_of(const struct record *r)
{
	uint64_t sum = r->number * 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < sizeof(r->text); i++)
		sum = (sum ^ (unsigned char)r->text[i]) * 0x100000001b3ull;
	return sum;
}

static PMEMlogpool *
open_or_create(const char *path)
{
	PMEMlogpool *plp = pmemlog_open(path);
	if (plp != NULL)
		return plp;
	struct stat st;
	int exists = stat(path, &st) == 0;
	plp = pmemlog_create(path, exists ? 0 : NEW_POOL_SIZE, 0600);
	if (plp == NULL)
		fprintf(stderr, "pmemlog-records: %s: %s\n", path, pmemlog_errormsg());
	return plp;
}

struct walk {
	uint64_t next;
	int bad;
};

static int
walk_one(const void *buf, size_t len, void *arg)
{
	struct walk *w = arg;
	const struct record *r = buf;
	if (len != sizeof(*r) || r->number != w->next || r->checksum != checksum_of(r)) {
		fprintf(stderr, "torn or out of order at record %" PRIu64 "\n", w->next);
		w->bad = 1;
		return 0;
	}
	w->next++;
	return 1;
}

static uint64_t
count_records(PMEMlogpool *plp, int *bad)
{
	struct walk w = {1, 0};
	pmemlog_walk(plp, sizeof(struct record), walk_one, &w);
	*bad = w.bad;
	return w.next - 1;
}

static int
run(const char *pool, const char *log, uint64_t count)
{
	PMEMlogpool *plp = open_or_create(pool);
	if (plp == NULL)
		return 1;
	int log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (log_fd < 0) {
		fprintf(stderr, "pmemlog-records: %s: %s\n", log, strerror(errno));
		pmemlog_close(plp);
		return 1;
	}
	int bad;
	uint64_t next = count_records(plp, &bad) + 1;
	int status = bad;
	for (uint64_t i = 0; i < count && status == 0; i++, next++) {
		struct record r;
		memset(&r, 0, sizeof(r));
		r.number = next;
		snprintf(r.text, sizeof(r.text), "record %" PRIu64, next);
		r.checksum = checksum_of(&r);
		if (pmemlog_append(plp, &r, sizeof(r)) != 0) {
			fprintf(stderr, "pmemlog-records: append: %s\n", pmemlog_errormsg());
			status = 1;
			break;
		}
		char line[64];
		int n = snprintf(line, sizeof(line), "committed %" PRIu64 "\n", next);
		if (write(log_fd, line, (size_t)n) != n)
			status = 1;
	}
	if (status == 0)
		printf("records %" PRIu64 "\n", next - 1);
	close(log_fd);
	pmemlog_close(plp);
	return status;
}

static uint64_t
last_logged(const char *log)
{
	FILE *f = fopen(log, "r");
	uint64_t last = 0, k;
	if (f == NULL)
		return 0;
	while (fscanf(f, "committed %" SCNu64 "\n", &k) == 1)
		last = k;
	fclose(f);
	return last;
}

static int
check(const char *pool, const char *log)
{
	PMEMlogpool *plp = pmemlog_open(pool);
	if (plp == NULL) {
		fprintf(stderr, "pmemlog-records: cannot open %s: %s\n", pool,
			pmemlog_errormsg());
		return 1;
	}
	int bad;
	uint64_t n = count_records(plp, &bad);
	if (log != NULL) {
		uint64_t logged = last_logged(log);
		if (n < logged) {
			fprintf(stderr, "lost: the program saw record %" PRIu64
				" appended; the log holds %" PRIu64 "\n", logged, n);
			bad = 1;
		}
		printf("records %" PRIu64 " (last logged %" PRIu64 ")\n", n, logged);
	} else {
		printf("records %" PRIu64 "\n", n);
	}
	pmemlog_close(plp);
	return bad;
}

int
main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "run") == 0)
		return run(argv[2], argv[3], strtoull(argv[4], NULL, 10));
	if ((argc == 3 || argc == 4) && strcmp(argv[1], "check") == 0)
		return check(argv[2], argc == 4 ? argv[3] : NULL);
	fprintf(stderr, "usage: pmemlog-records run POOL LOG COUNT\n"
			"       pmemlog-records check POOL [LOG]\n");
	return 2;
}
