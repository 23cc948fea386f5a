/*
 * recover_bench.c: the journal's three numbers on this machine.
 *
 *   1. fsync latency: fdatasync after each 4 KiB append, in a loop (p50/p99).
 *   2. append throughput: 1 KiB publishes as fast as the journal takes them,
 *      group commit doing its work (messages/s, and fsyncs saved).
 *   3. recovery: N messages (default 1M x 1 KiB) written, one in ten acked,
 *      closed; then journal_open + journal_recover timed.
 *
 * Usage: recover_bench DIR [messages] [blob_size]. Built by run.sh. DIR is
 * wiped first. Owns nothing beyond its process; prints one line per figure.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "lib/errors.h"
#include "store/journal.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_fsync(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/fsync-probe", dir);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    enum { ROUNDS = 1000 };
    static double lat[ROUNDS];
    char block[4096];
    memset(block, 'x', sizeof(block));
    for (int i = 0; i < ROUNDS; i++) {
        double t0 = now_s();
        if (pwrite(fd, block, sizeof(block), (off_t)i * 4096) != (ssize_t)sizeof(block) ||
            fdatasync(fd) != 0) {
            perror("pwrite/fdatasync");
            exit(1);
        }
        lat[i] = (now_s() - t0) * 1e6;
    }
    close(fd);
    unlink(path);
    qsort(lat, ROUNDS, sizeof(lat[0]), compare_double);
    printf("fsync: 4 KiB append + fdatasync, %d rounds: p50 %.0f us, p99 %.0f us, max %.0f us\n",
           ROUNDS, lat[ROUNDS / 2], lat[ROUNDS * 99 / 100], lat[ROUNDS - 1]);
}

struct sync_state {
    uint64_t synced;
    uint64_t callbacks;
};

static void on_synced(void *ctx, uint64_t ticket, int status)
{
    struct sync_state *s = ctx;
    if (status != OK) {
        fprintf(stderr, "journal failed: %d\n", status);
        exit(1);
    }
    s->synced = ticket;
    s->callbacks++;
}

static struct journal *open_journal(uv_loop_t *loop, const char *dir)
{
    struct journal *j;
    char err[256];
    if (journal_open(&j, loop, dir, NULL, err, sizeof(err)) != OK) {
        fprintf(stderr, "journal_open: %s\n", err);
        exit(1);
    }
    return j;
}

/* Publishes count messages, keeping the backlog bounded as a broker would
 * (connection.blocked), then waits for the last ticket; acks one in ten. */
static void write_messages(uv_loop_t *loop, const char *dir, uint64_t count, uint32_t size,
                           bool report)
{
    struct journal *j = open_journal(loop, dir);
    struct sync_state st = {0};
    journal_set_synced_callback(j, on_synced, &st);
    struct journal_recovery_stats stats;
    if (journal_recover(j, NULL, NULL, &stats) != OK)
        exit(1);
    struct journal_queue *q = journal_queue_open(j, BYTES_LIT("/"), BYTES_LIT("bench"));
    uint8_t *blob = malloc(size);
    memset(blob, 'm', size);
    double t0 = now_s();
    uint64_t ticket = 0;
    for (uint64_t seq = 1; seq <= count; seq++) {
        memcpy(blob, &seq, sizeof(seq) < size ? sizeof(seq) : size);
        ticket = journal_publish(q, seq, blob, size);
        if (seq % 10 == 0)
            ticket = journal_ack(q, seq - 5);
        while (journal_backlog_size(j) > 64u * 1024 * 1024)
            uv_run(loop, UV_RUN_ONCE);
        if (seq % 256 == 0)
            uv_run(loop, UV_RUN_NOWAIT);
    }
    while (st.synced < ticket)
        uv_run(loop, UV_RUN_ONCE);
    double elapsed = now_s() - t0;
    if (report)
        printf("append: %llu x %u B publishes (+10%% acks), all synced in %.2f s: %.0f msgs/s, "
               "%.1f MB/s, %llu group commits reported\n",
               (unsigned long long)count, size, elapsed, (double)count / elapsed,
               (double)count * size / elapsed / 1e6, (unsigned long long)st.callbacks);
    journal_close(j);
    uv_run(loop, UV_RUN_DEFAULT);
    free(blob);
}

struct recover_count {
    uint64_t messages;
    uint64_t bytes;
};

static void on_recover(void *ctx, struct journal_queue *q, struct bytes vhost,
                       struct bytes queue, uint64_t seq, bool delivered, const void *blob,
                       uint32_t size)
{
    struct recover_count *c = ctx;
    c->messages++;
    c->bytes += size;
}

static void bench_recover(uv_loop_t *loop, const char *dir, const char *label)
{
    double t0 = now_s();
    struct journal *j = open_journal(loop, dir);
    struct journal_recovery_stats stats;
    struct recover_count count = {0};
    int rc = journal_recover(j, on_recover, &count, &stats);
    double elapsed = now_s() - t0;
    if (rc != OK) {
        fprintf(stderr, "journal_recover: %d\n", rc);
        exit(1);
    }
    printf("recover (%s): %llu live messages (%.0f MB) from %llu segments, %.0f MB read, "
           "in %.2f s\n", label, (unsigned long long)count.messages, (double)count.bytes / 1e6,
           (unsigned long long)stats.segment_count, (double)stats.byte_count / 1e6, elapsed);
    journal_close(j);
    uv_run(loop, UV_RUN_DEFAULT);
}

static void drop_caches(void)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (f == NULL)
        return;
    fputs("3\n", f);
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [messages] [blob_size]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    uint64_t count = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000000;
    uint32_t size = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 1024;
    uv_loop_t loop;
    uv_loop_init(&loop);
    char sub[512];
    snprintf(sub, sizeof(sub), "%s/throughput", dir);
    bench_fsync(dir);
    write_messages(&loop, sub, count / 5, size, true);
    snprintf(sub, sizeof(sub), "%s/recovery", dir);
    write_messages(&loop, sub, count, size, true);
    bench_recover(&loop, sub, "page cache warm");
    drop_caches();
    bench_recover(&loop, sub, "after drop_caches, if permitted");
    uv_loop_close(&loop);
    return 0;
}
