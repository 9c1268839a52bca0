/*
 * pmemblk-records: writes numbered, checksummed blocks to a libpmemblk
 * pool (record K into block K mod the block count). It knows nothing of
 * pmirror: run it under pmirror-run and the pool is mirrored (docs/pmdk.md).
 *
 *   pmemblk-records run POOL LOG COUNT
 *       COUNT block writes (pmemblk_write: atomic per block); after each,
 *       "committed K" is appended to LOG. POOL is created if it is not a
 *       block pool yet (an existing zero-filled file: `create: true`).
 *   pmemblk-records check POOL [LOG]
 *       reads every block: each is empty or a whole record of its own
 *       block; the highest record N, and with LOG, every logged record's
 *       block holds it or a later one.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libpmemblk.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLOCK_SIZE 512
#define NEW_POOL_SIZE (32u << 20)

struct block {
	uint64_t number; /* 0: never written */
	uint64_t checksum;
	unsigned char fill[BLOCK_SIZE - 2 * sizeof(uint64_t)];
};

static uint64_t
checksum_of(const struct block *b)
{
	uint64_t sum = b->number * 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < sizeof(b->fill); i++)
		sum = (sum ^ b->fill[i]) * 0x100000001b3ull;
	return sum;
}

static PMEMblkpool *
open_or_create(const char *path)
{
	PMEMblkpool *pbp = pmemblk_open(path, BLOCK_SIZE);
	if (pbp != NULL)
		return pbp;
	struct stat st;
	int exists = stat(path, &st) == 0;
	pbp = pmemblk_create(path, BLOCK_SIZE, exists ? 0 : NEW_POOL_SIZE, 0600);
	if (pbp == NULL)
		fprintf(stderr, "pmemblk-records: %s: %s\n", path, pmemblk_errormsg());
	return pbp;
}

/* The highest record in the pool; -1 if a block is torn or misplaced. */
static int64_t
highest(PMEMblkpool *pbp, uint64_t *out)
{
	size_t blocks = pmemblk_nblock(pbp);
	uint64_t top = 0;
	for (size_t i = 0; i < blocks; i++) {
		struct block b;
		if (pmemblk_read(pbp, &b, (long long)i) != 0)
			return -1;
		if (b.number == 0)
			continue;
		if (b.checksum != checksum_of(&b) || b.number % blocks != i) {
			fprintf(stderr, "torn or misplaced block %zu (record %" PRIu64 ")\n",
				i, b.number);
			return -1;
		}
		if (b.number > top)
			top = b.number;
	}
	*out = top;
	return 0;
}

static int
run(const char *pool, const char *log, uint64_t count)
{
	PMEMblkpool *pbp = open_or_create(pool);
	if (pbp == NULL)
		return 1;
	int log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (log_fd < 0) {
		fprintf(stderr, "pmemblk-records: %s: %s\n", log, strerror(errno));
		pmemblk_close(pbp);
		return 1;
	}
	uint64_t top = 0;
	int status = highest(pbp, &top) == 0 ? 0 : 1;
	size_t blocks = pmemblk_nblock(pbp);
	uint64_t next = top + 1;
	for (uint64_t i = 0; i < count && status == 0; i++, next++) {
		struct block b;
		b.number = next;
		memset(b.fill, (int)(next & 0xff), sizeof(b.fill));
		b.checksum = checksum_of(&b);
		if (pmemblk_write(pbp, &b, (long long)(next % blocks)) != 0) {
			fprintf(stderr, "pmemblk-records: write: %s\n", pmemblk_errormsg());
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
	pmemblk_close(pbp);
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
	PMEMblkpool *pbp = pmemblk_open(pool, BLOCK_SIZE);
	if (pbp == NULL) {
		fprintf(stderr, "pmemblk-records: cannot open %s: %s\n", pool,
			pmemblk_errormsg());
		return 1;
	}
	uint64_t top = 0;
	int bad = highest(pbp, &top) != 0;
	if (!bad && log != NULL) {
		uint64_t logged = last_logged(log);
		size_t blocks = pmemblk_nblock(pbp);
		/* Each of the last logged records (up to one per block) is in
		 * its block, or a later record of the same block is. */
		for (uint64_t k = logged; k > 0 && k + blocks > logged; k--) {
			struct block b;
			if (pmemblk_read(pbp, &b, (long long)(k % blocks)) != 0 ||
			    b.number < k) {
				fprintf(stderr, "lost: record %" PRIu64 " was logged; its "
					"block holds %" PRIu64 "\n", k, b.number);
				bad = 1;
				break;
			}
		}
		printf("records %" PRIu64 " (last logged %" PRIu64 ")\n", top, logged);
	} else if (!bad) {
		printf("records %" PRIu64 "\n", top);
	}
	pmemblk_close(pbp);
	return bad;
}

int
main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "run") == 0)
		return run(argv[2], argv[3], strtoull(argv[4], NULL, 10));
	if ((argc == 3 || argc == 4) && strcmp(argv[1], "check") == 0)
		return check(argv[2], argc == 4 ? argv[3] : NULL);
	fprintf(stderr, "usage: pmemblk-records run POOL LOG COUNT\n"
			"       pmemblk-records check POOL [LOG]\n");
	return 2;
}
