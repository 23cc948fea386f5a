/*
 * recover_queues.c: journal_recover alone over many queues, for an A/B of
 * recovery builds on one log (the shape of a takeover's staged logs, or of
 * a broker's restart with many durable queues).
 *
 * Usage: recover_queues DIR QUEUES MESSAGES [blob_size=1024] [reps=5]
 * When DIR holds no journal yet, first writes QUEUES queues sharing
 * MESSAGES messages (round robin, all synced, none acked) and closes it.
 * Then opens and recovers DIR reps times (the page cache warm), printing
 * one line each: seconds, messages, segments, bytes read. Built by
 * recover_queues.sh against one source tree's src/store and src/lib, so two
 * builds (main's and a branch's) can take turns on the same DIR. Recovery
 * writes nothing to a clean log, so every run reads the same files.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include <uv.h>

#include "lib/errors.h"
#include "store/journal.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* User and system CPU seconds of the process (less disturbed than the wall
 * clock by other processes on a busy machine). */
static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

static void on_synced(void *ctx, uint64_t ticket, int status)
{
    if (status != OK) {
        fprintf(stderr, "journal failed: %d\n", status);
        exit(1);
    }
    *(uint64_t *)ctx = ticket;
}

static struct journal *open_recovered(uv_loop_t *loop, const char *dir,
                                      struct journal_recovery_stats *stats,
                                      journal_recover_fn fn, void *ctx)
{
    struct journal *j;
    char err[256];
    if (journal_open(&j, loop, dir, NULL, err, sizeof(err)) != OK) {
        fprintf(stderr, "journal_open: %s\n", err);
        exit(1);
    }
    if (journal_recover(j, fn, ctx, stats) != OK) {
        fprintf(stderr, "journal_recover failed\n");
        exit(1);
    }
    return j;
}

static void write_queues(uv_loop_t *loop, const char *dir, uint64_t queues, uint64_t messages,
                         uint32_t size)
{
    struct journal_recovery_stats stats;
    struct journal *j = open_recovered(loop, dir, &stats, NULL, NULL);
    uint64_t synced = 0;
    journal_set_synced_callback(j, on_synced, &synced);
    struct journal_queue **q = calloc(queues, sizeof(*q));
    for (uint64_t k = 0; k < queues; k++) {
        char name[32];
        int len = snprintf(name, sizeof(name), "q-%llu", (unsigned long long)k);
        q[k] = journal_queue_open(j, BYTES_LIT("/"), (struct bytes){(uint8_t *)name,
                                                                    (uint32_t)len});
    }
    uint8_t *blob = malloc(size);
    memset(blob, 'm', size);
    uint64_t ticket = 0;
    for (uint64_t i = 0; i < messages; i++) {
        ticket = journal_publish(q[i % queues], i / queues + 1, blob, size);
        while (journal_backlog_size(j) > 64u * 1024 * 1024)
            uv_run(loop, UV_RUN_ONCE);
    }
    while (synced < ticket)
        uv_run(loop, UV_RUN_ONCE);
    journal_close(j);
    uv_run(loop, UV_RUN_DEFAULT);
    free(blob);
    free(q);
}

static void on_recover(void *ctx, struct journal_queue *q, struct bytes vhost,
                       struct bytes queue, uint64_t seq, bool delivered, const void *blob,
                       uint32_t size)
{
    (void)q, (void)vhost, (void)queue, (void)seq, (void)delivered;
    /* Touch the bytes, as a broker decoding them would. */
    *(uint64_t *)ctx += ((const uint8_t *)blob)[size - 1];
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIR QUEUES MESSAGES [blob_size] [reps]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    uint64_t queues = strtoull(argv[2], NULL, 10);
    uint64_t messages = strtoull(argv[3], NULL, 10);
    uint32_t size = argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 10) : 1024;
    int reps = argc > 5 ? atoi(argv[5]) : 5;
    uv_loop_t loop;
    uv_loop_init(&loop);
    char marker[600];
    snprintf(marker, sizeof(marker), "%s/definitions", dir);
    struct stat st;
    if (stat(marker, &st) != 0)
        write_queues(&loop, dir, queues, messages, size);
    for (int rep = 0; rep < reps; rep++) {
        struct journal_recovery_stats stats;
        uint64_t sum = 0;
        double t0 = now_s();
        double cpu0 = cpu_s();
        struct journal *j = open_recovered(&loop, dir, &stats, on_recover, &sum);
        double elapsed = now_s() - t0;
        double cpu = cpu_s() - cpu0;
        printf("RESULT recover_s=%.4f cpu_s=%.4f queues=%llu messages=%llu segments=%llu "
               "read_mb=%.1f\n",
               elapsed, cpu, (unsigned long long)stats.queue_count,
               (unsigned long long)stats.message_count,
               (unsigned long long)stats.segment_count, (double)stats.byte_count / 1e6);
        journal_close(j);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
    uv_loop_close(&loop);
    return 0;
}
