/*
 * test_journal.c: the journal's round trips, on the fault disk (fast and
 * inspectable) and once on the real disk.
 *
 * Goal: crc32c matches the standard vectors on both code paths; records
 * and file headers survive encode/check and any flipped bit is caught;
 * publish/delivered/ack/purge/delete come back through recovery as they
 * were left; segments roll; fully acked segments are deleted; compaction
 * moves live messages forward and keeps seq order and delivered flags;
 * paging reads bodies back; definitions put/delete/replay/compact; a torn
 * tail is cut and reported, a bad record in the middle is an error;
 * recovery hands back exactly a model of the logs (whatever segment its
 * second pass starts from) and reads a one-segment queue once; a disk
 * error stops the journal and is reported through the synced callback.
 * Method: drive the API from a uv loop, close, reopen on the same disk and
 * compare what recovery hands back with what the test remembers.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "lib/errors.h"
#include "store/crc32c.h"
#include "store/disk_fault.h"
#include "store/format.h"
#include "store/journal.h"

#define DIR "/j"

struct message {
    char queue[32];
    uint64_t seq;
    bool delivered;
    uint32_t size;
    uint8_t *blob;
};

struct harness {
    uv_loop_t loop;
    struct disk_fault *disk;
    struct journal_options opts;
    struct journal *j;
    uint64_t synced;
    int status;
    struct message *recovered;
    size_t recovered_count;
    struct journal_recovery_stats stats;
};

static void on_synced(void *ctx, uint64_t ticket, int status)
{
    struct harness *h = ctx;
    assert_true(ticket >= h->synced);
    h->synced = ticket;
    if (status != OK)
        h->status = status;
}

static void on_recover(void *ctx, struct journal_queue *q, struct bytes vhost,
                       struct bytes queue, uint64_t seq, bool delivered, const void *blob,
                       uint32_t size)
{
    struct harness *h = ctx;
    h->recovered = realloc(h->recovered, (h->recovered_count + 1) * sizeof(*h->recovered));
    struct message *m = &h->recovered[h->recovered_count++];
    memset(m, 0, sizeof(*m));
    snprintf(m->queue, sizeof(m->queue), "%.*s", (int)queue.len, queue.ptr);
    m->seq = seq;
    m->delivered = delivered;
    m->size = size;
    m->blob = malloc(size + 1);
    memcpy(m->blob, blob, size);
}

static void recovered_clear(struct harness *h)
{
    for (size_t i = 0; i < h->recovered_count; i++)
        free(h->recovered[i].blob);
    free(h->recovered);
    h->recovered = NULL;
    h->recovered_count = 0;
}

static int h_open(struct harness *h)
{
    char err[256] = "";
    h->synced = 0;
    h->status = OK;
    int rc = journal_open(&h->j, &h->loop, DIR, &h->opts, err, sizeof(err));
    if (rc != OK)
        return rc;
    journal_set_synced_callback(h->j, on_synced, h);
    recovered_clear(h);
    return journal_recover(h->j, on_recover, h, &h->stats);
}

static void h_close(struct harness *h)
{
    journal_close(h->j);
    h->j = NULL;
    uv_run(&h->loop, UV_RUN_DEFAULT);
}

static void h_wait(struct harness *h, uint64_t ticket)
{
    while (h->synced < ticket && h->status == OK)
        uv_run(&h->loop, UV_RUN_ONCE);
}

static struct harness *h_new(uint64_t segment_size)
{
    struct harness *h = calloc(1, sizeof(*h));
    assert_int_equal(uv_loop_init(&h->loop), 0);
    h->disk = disk_fault_new(1);
    h->opts.disk = disk_fault_ops(h->disk);
    h->opts.segment_size_max = segment_size;
    assert_int_equal(h_open(h), OK);
    return h;
}

static void h_free(struct harness *h)
{
    if (h->j != NULL)
        h_close(h);
    recovered_clear(h);
    disk_fault_free(h->disk);
    assert_int_equal(uv_loop_close(&h->loop), 0);
    free(h);
}

static void fill_blob(uint8_t *blob, uint32_t size, uint64_t seq)
{
    for (uint32_t i = 0; i < size; i++)
        blob[i] = (uint8_t)(seq * 31 + i);
}

static uint64_t publish(struct journal_queue *q, uint64_t seq, uint32_t size)
{
    uint8_t *blob = malloc(size + 1);
    fill_blob(blob, size, seq);
    uint64_t ticket = journal_publish(q, seq, blob, size);
    free(blob);
    return ticket;
}

static void check_blob(const struct message *m)
{
    uint8_t *want = malloc(m->size + 1);
    fill_blob(want, m->size, m->seq);
    assert_memory_equal(m->blob, want, m->size);
    free(want);
}

static size_t count_files(struct harness *h, const char *suffix)
{
    size_t count = 0;
    char **files = disk_fault_list_files(h->disk, suffix, &count);
    for (size_t i = 0; i < count; i++)
        free(files[i]);
    free(files);
    return count;
}

/* ---- crc32c and format ----------------------------------------------------- */

static void test_crc32c_vectors(void **state)
{
    uint8_t buf[32];
    assert_int_equal(crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c_portable(0, "123456789", 9), 0xE3069283u);
    memset(buf, 0, sizeof(buf)); /* RFC 3720 B.4 */
    assert_int_equal(crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xFF, sizeof(buf));
    assert_int_equal(crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    assert_int_equal(crc32c(0, buf, 32), 0x46DD794Eu);
    assert_int_equal(crc32c_portable(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    assert_int_equal(crc32c(0, buf, 32), 0x113FDB5Cu);
    uint8_t big[1000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (uint8_t)(i * 7 + 3);
    for (size_t split = 0; split < sizeof(big); split += 37) {
        uint32_t a = crc32c(crc32c(0, big, split), big + split, sizeof(big) - split);
        assert_int_equal(a, crc32c_portable(0, big, sizeof(big)));
    }
}

static void test_format_record(void **state)
{
    uint8_t seq[8];
    format_put_u64(seq, 42);
    const char *body = "hello, journal";
    uint64_t size = format_record_size(8 + strlen(body));
    assert_int_equal(size % 8, 0);
    uint8_t *rec = calloc(1, size);
    format_record_encode(rec, RECORD_PUBLISH, seq, 8, body, (uint32_t)strlen(body));
    struct format_record_header h;
    uint64_t got;
    assert_int_equal(format_record_check(rec, size, &h, &got), FORMAT_CHECK_OK);
    assert_int_equal(got, size);
    assert_int_equal(h.type, RECORD_PUBLISH);
    assert_int_equal(format_record_check(rec, size - 1, &h, &got), FORMAT_CHECK_SHORT);
    for (uint64_t bit = 0; bit < size * 8; bit++) {
        rec[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_int_not_equal(format_record_check(rec, size, &h, &got), FORMAT_CHECK_OK);
        rec[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    free(rec);
    uint8_t fh[FORMAT_FILE_HEADER_SIZE];
    struct format_file_header out;
    format_file_header_encode(fh, FORMAT_MAGIC_SEGMENT, 7, 9);
    assert_true(format_file_header_decode(fh, FORMAT_MAGIC_SEGMENT, &out));
    assert_int_equal(out.queue_id, 7);
    assert_int_equal(out.segment_number, 9);
    assert_false(format_file_header_decode(fh, FORMAT_MAGIC_QUEUE, &out));
    fh[20] ^= 1;
    assert_false(format_file_header_decode(fh, FORMAT_MAGIC_SEGMENT, &out));
}

/* ---- Queue logs ------------------------------------------------------------- */

/* A bulk copy (an adoption) waits for the writer: journal_wait_backlog
 * returns once no more than its bound is appended and unwritten. */
static void test_wait_backlog(void **state)
{
    (void)state;
    struct harness *h = h_new(0);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("/"), BYTES_LIT("bulk"));
    uint64_t last = 0;
    for (uint64_t seq = 1; seq <= 2000; seq++)
        last = publish(q, seq, 4096);
    journal_wait_backlog(h->j, 64 * 1024);
    assert_true(journal_backlog_size(h->j) <= 64 * 1024);
    journal_wait_backlog(h->j, 0);
    assert_int_equal(journal_backlog_size(h->j), 0);
    h_wait(h, last);
    h_close(h);
    h_free(h);
}

static void test_round_trip(void **state)
{
    struct harness *h = h_new(0);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("/"), BYTES_LIT("orders"));
    struct journal_queue *q2 = journal_queue_open(h->j, BYTES_LIT("/"), BYTES_LIT("other"));
    uint64_t last = 0;
    for (uint64_t seq = 1; seq <= 20; seq++) {
        uint64_t t = publish(q, seq, (uint32_t)(seq * 13));
        assert_true(t > last);
        last = t;
    }
    publish(q2, 5, 100);
    journal_delivered(q, 3);
    journal_delivered(q, 4);
    journal_ack(q, 4);
    journal_ack(q, 10);
    last = journal_purge(q, 3); /* 1 and 2 go */
    h_wait(h, last);
    assert_int_equal(h->synced, last);
    assert_int_equal(journal_queue_live_count(q), 16);
    h_close(h);

    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.queue_count, 2);
    assert_int_equal(h->stats.message_count, 17);
    assert_int_equal(h->stats.truncated_count, 0);
    size_t k = 0;
    for (uint64_t seq = 3; seq <= 20; seq++) {
        if (seq == 4 || seq == 10)
            continue;
        while (strcmp(h->recovered[k].queue, "orders") != 0)
            k++;
        struct message *m = &h->recovered[k++];
        assert_int_equal(m->seq, seq);
        assert_int_equal(m->delivered, seq == 3);
        assert_int_equal(m->size, seq * 13);
        check_blob(m);
    }
    q = journal_queue_open(h->j, BYTES_LIT("/"), BYTES_LIT("orders"));
    assert_int_equal(journal_queue_seq_last(q), 20);
    assert_int_equal(journal_queue_live_count(q), 16);
    q2 = journal_queue_open(h->j, BYTES_LIT("/"), BYTES_LIT("other"));
    uint64_t t = journal_queue_delete(q2);
    h_wait(h, t);
    h_close(h);

    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.queue_count, 1);
    assert_int_equal(h->stats.message_count, 16);
    /* A recovered queue the broker does not open again is deleted on request. */
    journal_queue_delete_unopened(h->j);
    h_close(h);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.queue_count, 0);
    assert_int_equal(count_files(h, ".seg"), 0);
    h_free(h);
}

static void test_roll_and_reclaim(void **state)
{
    struct harness *h = h_new(4096);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("roll"));
    for (uint64_t seq = 1; seq <= 200; seq++)
        publish(q, seq, 200);
    h_wait(h, journal_ack(q, 1));
    size_t segments = count_files(h, ".seg");
    assert_true(segments >= 10);
    /* Ack in order: every old segment becomes dead and is deleted. */
    uint64_t t = 0;
    for (uint64_t seq = 2; seq <= 190; seq++)
        t = journal_ack(q, seq);
    h_wait(h, t);
    assert_true(count_files(h, ".seg") <= 2);
    h_close(h);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.message_count, 10);
    for (size_t i = 0; i < 10; i++) {
        assert_int_equal(h->recovered[i].seq, 191 + i);
        check_blob(&h->recovered[i]);
    }
    h_free(h);
}

/* journal_ack_range: one record acks every seq of a run the log holds (a
 * purge's), skipping what it does not hold or was acked already; segments
 * it empties go, and recovery applies it, a range wider than the queue too. */
static void test_ack_range(void **state)
{
    (void)state;
    struct harness *h = h_new(4096);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("runs"));
    for (uint64_t seq = 1; seq <= 200; seq++) {
        if (seq % 7 != 0) /* (a transient one: never in the log) */
            publish(q, seq, 200);
    }
    journal_delivered(q, 150);
    h_wait(h, journal_ack(q, 101));
    size_t segments = count_files(h, ".seg");
    assert_true(segments >= 10);
    uint64_t before = journal_ack(q, 102);
    assert_int_equal(journal_queue_live_count(q), 200 - 28 - 2);
    /* Nothing of it held: no record, the last ticket. */
    assert_int_equal(journal_ack_range(q, 101, 102), before);
    assert_int_equal(journal_ack_range(q, 7, 7), before);
    /* A run across the old segments, with holes in it. */
    uint64_t t = journal_ack_range(q, 1, 99);
    assert_true(t > before);
    assert_int_equal(journal_queue_live_count(q), 200 - 28 - 2 - (99 - 14));
    /* One held: a plain ack. Overlapping what went already. */
    journal_ack_range(q, 98, 100);
    journal_ack_range(q, 120, 160);
    t = journal_ack_range(q, 190, UINT64_MAX - 1); /* past the newest */
    assert_int_equal(journal_queue_live_count(q), 14 + 24); /* 103..119, 161..189 */
    h_wait(h, t);
    assert_true(count_files(h, ".seg") < segments);
    h_close(h);

    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.message_count, 14 + 24);
    size_t k = 0;
    for (uint64_t seq = 103; seq <= 189; seq++) {
        if (seq % 7 == 0 || (seq >= 120 && seq <= 160))
            continue;
        assert_int_equal(h->recovered[k].seq, seq);
        check_blob(&h->recovered[k++]);
    }
    assert_int_equal(k, 14 + 24);
    h_free(h);
}

/* Bytes in the files whose name ends with suffix. */
static size_t bytes_of_files(struct harness *h, const char *suffix)
{
    size_t count = 0, total = 0;
    char **files = disk_fault_list_files(h->disk, suffix, &count);
    for (size_t i = 0; i < count; i++) {
        size_t size = 0;
        free(disk_fault_read_file(h->disk, files[i], &size));
        total += size;
        free(files[i]);
    }
    free(files);
    return total;
}

/* A drained queue leaves no dead segment behind, though its current one
 * never filled: all acked past an eighth of segment_size_max, it rolls and
 * the dead one goes. Below that it stays (no file per message). */
static void test_drained_queue_reclaims_its_segment(void **state)
{
    struct harness *h = h_new(64 * 1024);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("drained"));
    for (uint64_t seq = 1; seq <= 4; seq++)
        publish(q, seq, 1000);
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 4; seq++)
        t = journal_ack(q, seq);
    h_wait(h, t);
    assert_int_equal(count_files(h, ".seg"), 1); /* 4 KiB: kept, no roll */
    for (uint64_t seq = 5; seq <= 40; seq++)
        publish(q, seq, 1000);
    for (uint64_t seq = 5; seq <= 39; seq++)
        t = journal_ack(q, seq);
    h_wait(h, t);
    assert_true(bytes_of_files(h, ".seg") > 40 * 1000); /* one live: all kept */
    journal_ack(q, 40);
    /* (The unlink comes after the ack's ticket: wait for a later one.) */
    h_wait(h, publish(q, 41, 1000));
    assert_int_equal(count_files(h, ".seg"), 1);
    assert_true(bytes_of_files(h, ".seg") < 2048); /* a header and message 41 */
    h_close(h);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.message_count, 1);
    assert_int_equal(h->recovered[0].seq, 41);
    check_blob(&h->recovered[0]);
    h_free(h);
}

/* The fault disk, its ftruncate calls counted (the journal thread's). */
static struct {
    struct disk_ops ops;
    const struct disk_ops *real;
    _Atomic int truncates;
} stepped;

static int stepped_ftruncate(void *ctx, int fd, uint64_t size)
{
    stepped.truncates++;
    return stepped.real->ftruncate(ctx, fd, size);
}

/* A directory sync that waits while hold_dir_syncs is set (the test
 * crashes the disk meanwhile). */
static _Atomic bool hold_dir_syncs;
static _Atomic int dir_syncs_held;

static int held_fsync_dir(void *ctx, const char *path)
{
    if (hold_dir_syncs) {
        dir_syncs_held++;
        while (hold_dir_syncs)
            usleep(1000);
    }
    return stepped.real->fsync_dir(ctx, path);
}

/* A data sync that waits while hold_data_syncs is set. */
static _Atomic bool hold_data_syncs;

static int held_fdatasync(void *ctx, int fd)
{
    while (hold_data_syncs)
        usleep(1000);
    return stepped.real->fdatasync(ctx, fd);
}

static void stepped_disk(struct harness *h)
{
    h_close(h);
    stepped.real = disk_fault_ops(h->disk);
    stepped.ops = *stepped.real;
    stepped.ops.ftruncate = stepped_ftruncate;
    stepped.ops.fsync_dir = held_fsync_dir;
    stepped.ops.fdatasync = held_fdatasync;
    h->opts.disk = &stepped.ops;
    assert_int_equal(h_open(h), OK);
}

/* Waits (up to 5 s) until count files end with suffix: the journal
 * thread's removals run on their own time. */
static void wait_files(struct harness *h, const char *suffix, size_t count)
{
    for (int i = 0; i < 5000 && count_files(h, suffix) != count; i++)
        usleep(1000);
}

/* A deleted log over 8 MiB is not unlinked whole (its blocks freed by one
 * commit stalled every fsync on the device): the journal thread shrinks
 * it 8 MiB at a time, then unlinks it; a stop removes what is left at
 * once. Neither comes back in recovery. */
static void test_deleted_log_goes_in_steps(void **state)
{
    (void)state;
    struct harness *h = h_new(0); /* 64 MiB segments: 20 MiB is one file */
    stepped_disk(h);
    /* Two deleted together: one after the other (one descriptor open). */
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("deep"));
    struct journal_queue *q1 = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("deep1"));
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 320; seq++) {
        publish(q, seq, 64 * 1024);
        t = publish(q1, seq, 64 * 1024);
    }
    h_wait(h, t);
    assert_int_equal(count_files(h, ".seg"), 2);
    stepped.truncates = 0;
    journal_queue_delete(q);
    h_wait(h, journal_queue_delete(q1));
    wait_files(h, ".seg", 0);
    assert_int_equal(count_files(h, ".seg"), 0);
    assert_int_equal(stepped.truncates, 4); /* each 20 -> 12 -> 4 MiB, then the unlink */
    /* Deleted as the journal stops: all of it goes with the stop. */
    q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("deep2"));
    for (uint64_t seq = 1; seq <= 320; seq++)
        t = publish(q, seq, 64 * 1024);
    h_wait(h, t);
    journal_queue_delete(q);
    h_close(h);
    assert_int_equal(count_files(h, ".seg"), 0);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.message_count, 0);
    h_free(h);
}

/* A live queue's dead segment over 8 MiB goes the same way: renamed to
 * *.dead, its directory synced, shrunk 8 MiB at a time, unlinked. What a
 * crash leaves of it is removed by recovery, which never reads it. */
static void test_dead_segment_goes_in_steps(void **state)
{
    (void)state;
    struct harness *h = h_new(16u << 20);
    stepped_disk(h);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("consumed"));
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 300; seq++) /* ~19 MiB: a full segment and a bit */
        t = publish(q, seq, 64 * 1024);
    h_wait(h, t);
    assert_int_equal(count_files(h, ".seg"), 2);
    stepped.truncates = 0;
    for (uint64_t seq = 1; seq <= 280; seq++)
        journal_ack(q, seq);
    h_wait(h, publish(q, 301, 64 * 1024)); /* the unlink comes after the acks */
    wait_files(h, ".dead", 0);
    assert_int_equal(count_files(h, ".dead"), 0);
    assert_int_equal(count_files(h, ".seg"), 1);
    assert_int_equal(stepped.truncates, 1); /* 16 -> 8 MiB, then the unlink */

    /* A queue deleted right after its segment died: the directory the
     * removal would sync is gone, its tree's removal takes the file. */
    struct journal_queue *q2 = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("gone"));
    for (uint64_t seq = 1; seq <= 300; seq++)
        t = publish(q2, seq, 64 * 1024);
    h_wait(h, t);
    for (uint64_t seq = 1; seq <= 280; seq++)
        journal_ack(q2, seq);
    journal_queue_delete(q2);
    h_wait(h, publish(q, 302, 64 * 1024)); /* a ticket after the deletion's */
    wait_files(h, ".dead", 0);
    wait_files(h, ".seg", 1);
    assert_int_equal(count_files(h, ".dead"), 0);
    assert_int_equal(count_files(h, ".seg"), 1);
    assert_int_equal(h->status, OK);

    /* Another, and a crash while it waits for its directory's sync. */
    for (uint64_t seq = 303; seq <= 600; seq++)
        t = publish(q, seq, 64 * 1024);
    h_wait(h, t);
    hold_dir_syncs = true;
    dir_syncs_held = 0;
    for (uint64_t seq = 281; seq <= 580; seq++)
        journal_ack(q, seq);
    publish(q, 601, 64 * 1024);
    wait_files(h, ".dead", 1);
    assert_int_equal(count_files(h, ".dead"), 1);
    for (int i = 0; i < 5000 && dir_syncs_held == 0; i++)
        usleep(1000);
    disk_fault_crash(h->disk, false);
    hold_dir_syncs = false;
    h_close(h);
    disk_fault_restart(h->disk);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(count_files(h, ".dead"), 0);
    /* A tail from past the dead segment (its acks were synced before its
     * rename: ~255 messages a segment) to 600 or 601: acks after the
     * rename, and the last publish, may be lost with the crash. */
    size_t n = h->stats.message_count;
    assert_true(n >= 20 && n < 100);
    uint64_t first = h->recovered[0].seq;
    assert_true(first > 500 && first <= 581);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(h->recovered[i].seq, first + i);
        check_blob(&h->recovered[i]);
    }
    assert_true(first + n - 1 >= 600);
    h_free(h);
}

static void test_compaction(void **state)
{
    struct harness *h = h_new(4096);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("compact"));
    for (uint64_t seq = 1; seq <= 300; seq++)
        publish(q, seq, 100);
    for (uint64_t seq = 1; seq <= 300; seq += 7)
        journal_delivered(q, seq);
    /* Keep one message in ten: every old segment is mostly acked. */
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 300; seq++) {
        if (seq % 10 != 0)
            t = journal_ack(q, seq);
    }
    h_wait(h, t);
    /* 30 live messages of 128 bytes and the ACK records fill a few segments;
     * the 10 segments the publishes filled are gone. */
    assert_true(count_files(h, ".seg") <= 4);
    struct journal_location loc;
    assert_int_equal(journal_locate(q, 10, &loc), OK);
    assert_true(loc.segment_number > 0); /* it moved */
    uint8_t buf[100];
    assert_int_equal(journal_read(q, 10, buf, sizeof(buf)), OK);
    uint8_t want[100];
    fill_blob(want, 100, 10);
    assert_memory_equal(buf, want, 100);
    assert_int_equal(journal_read(q, 11, buf, sizeof(buf)), E_JOURNAL_NOT_FOUND);
    h_close(h);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.message_count, 30);
    for (size_t i = 0; i < 30; i++) {
        uint64_t seq = 10 * (i + 1);
        assert_int_equal(h->recovered[i].seq, seq);
        assert_int_equal(h->recovered[i].delivered, seq % 7 == 1);
        check_blob(&h->recovered[i]);
    }
    h_free(h);
}

/* A compaction goes in slices of compact_slice_bytes, one per synced
 * report, so what is appended meanwhile waits for one slice, not for the
 * whole segment's live bytes; messages acked between slices are not
 * copied; the result is the same log. */
static void test_compaction_in_slices(void **state)
{
    struct harness *h = h_new(64 * 1024);
    h_close(h);
    h->opts.compact_slice_bytes = 2048;
    assert_int_equal(h_open(h), OK);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("sliced"));
    /* 1,000-byte bodies: about 62 to a segment; 1..120 fill segments 0 and 1. */
    for (uint64_t seq = 1; seq <= 120; seq++)
        publish(q, seq, 1000);
    for (uint64_t seq = 1; seq <= 60; seq += 3)
        journal_delivered(q, seq);
    struct journal_location loc;
    assert_int_equal(journal_locate(q, 40, &loc), OK);
    assert_int_equal(loc.segment_number, 0);
    /* Segment 0 is under 25% live once 1..48 are acked: 49..~62 (14 KB)
     * are left to copy, 2 KB a slice. */
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 48; seq++)
        t = journal_ack(q, seq);
    assert_int_equal(journal_locate(q, 49, &loc), OK);
    assert_true(loc.segment_number > 0); /* the first slice moved it */
    assert_int_equal(journal_locate(q, 60, &loc), OK);
    assert_int_equal(loc.segment_number, 0); /* a later slice will */
    /* A publish after the first slice is synced while the compaction
     * still has slices to go. */
    t = publish(q, 121, 1000);
    h_wait(h, t);
    assert_int_equal(journal_locate(q, 60, &loc), OK);
    assert_int_equal(loc.segment_number, 0);
    /* Acked before its slice: never copied (its entry is gone). */
    journal_ack(q, 60);
    for (int k = 0; k < 100 && count_files(h, "0000000000000000.seg") > 0; k++)
        h_wait(h, publish(q, 122 + (uint64_t)k, 10));
    assert_int_equal(count_files(h, "0000000000000000.seg"), 0);
    assert_int_equal(journal_locate(q, 59, &loc), OK);
    assert_true(loc.segment_number > 0);
    uint8_t buf[1000], want[1000];
    assert_int_equal(journal_read(q, 59, buf, sizeof(buf)), OK);
    fill_blob(want, 1000, 59);
    assert_memory_equal(buf, want, 1000);
    size_t live = 120 - 48 - 1 + 1; /* 49..120 but 60, and 121 */
    h_close(h);
    assert_int_equal(h_open(h), OK);
    assert_true(h->stats.message_count >= live);
    for (size_t i = 0; i < live; i++) {
        uint64_t seq = h->recovered[i].seq;
        assert_int_equal(seq, i < 11 ? 49 + i : 50 + i); /* 49..59, 61..121 */
        assert_int_equal(h->recovered[i].delivered, seq <= 60 && seq % 3 == 1);
        check_blob(&h->recovered[i]);
    }
    h_free(h);
}

/* An ack's record lives as long as any copy of what it acks: a message
 * copied forward by a compaction still in slices is also in the segment
 * being compacted, and a segment holding its ACK that died first took the
 * ACK with it (recovery brought the acked message back). */
static void test_an_ack_outlives_the_original_of_a_copy(void **state)
{
    (void)state;
    struct harness *h = h_new(16 * 1024);
    h_close(h);
    h->opts.compact_slice_bytes = 1000; /* a message a slice */
    assert_int_equal(h_open(h), OK);
    stepped_disk(h);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("copied"));
    /* 1,000-byte bodies, 15 to a segment: 1..15 are segment 0, and their
     * acks too. */
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 15; seq++)
        publish(q, seq, 1000);
    for (uint64_t seq = 1; seq <= 12; seq++)
        t = journal_ack(q, seq);
    h_wait(h, t);
    struct journal_location loc;
    assert_int_equal(journal_locate(q, 13, &loc), OK);
    assert_int_equal(loc.segment_number, 0);
    /* Nothing is synced from here: the compaction's next slices wait. */
    hold_data_syncs = true;
    publish(q, 16, 1000); /* segment 1; segment 0 is sparse: 13 is copied */
    assert_int_equal(journal_locate(q, 13, &loc), OK);
    assert_int_equal(loc.segment_number, 1);
    assert_int_equal(journal_locate(q, 14, &loc), OK);
    assert_int_equal(loc.segment_number, 0);
    journal_ack(q, 13); /* its ACK in segment 1, with the copy */
    for (uint64_t seq = 17; seq <= 30; seq++)
        publish(q, seq, 1000); /* segment 1 fills, segment 2 starts */
    assert_int_equal(journal_locate(q, 30, &loc), OK);
    assert_true(loc.segment_number >= 2);
    for (uint64_t seq = 16; seq <= 29; seq++)
        journal_ack(q, seq); /* segment 1 holds nothing live now */
    hold_data_syncs = false;
    h_close(h);

    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.message_count, 3);
    assert_int_equal(h->recovered[0].seq, 14);
    assert_int_equal(h->recovered[1].seq, 15);
    assert_int_equal(h->recovered[2].seq, 30);
    h_free(h);
}

/* One message stuck in the oldest segment must not pin the rest of the log. */
static void test_stuck_message(void **state)
{
    struct harness *h = h_new(4096);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("stuck"));
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 2000; seq++) {
        publish(q, seq, 200);
        if (seq > 1)
            t = journal_ack(q, seq);
    }
    h_wait(h, t);
    assert_true(count_files(h, ".seg") <= 4);
    h_close(h);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.message_count, 1);
    assert_int_equal(h->recovered[0].seq, 1);
    check_blob(&h->recovered[0]);
    h_free(h);
}

static void test_paging(void **state)
{
    struct harness *h = h_new(8192);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("page"));
    for (uint64_t seq = 1; seq <= 100; seq++)
        publish(q, seq, (uint32_t)(50 + seq));
    /* Readable before its fsync completes: journal_read waits for the write. */
    uint8_t buf[256];
    uint8_t want[256];
    for (uint64_t seq = 1; seq <= 100; seq += 9) {
        assert_int_equal(journal_read(q, seq, buf, sizeof(buf)), OK);
        fill_blob(want, (uint32_t)(50 + seq), seq);
        assert_memory_equal(buf, want, 50 + seq);
    }
    h_close(h);
    assert_int_equal(h_open(h), OK);
    q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("page"));
    assert_int_equal(journal_read(q, 77, buf, sizeof(buf)), OK);
    fill_blob(want, 127, 77);
    assert_memory_equal(buf, want, 127);
    /* A flipped bit under a paged-out message is reported, never returned. */
    struct journal_location loc;
    assert_int_equal(journal_locate(q, 78, &loc), OK);
    char path[128];
    char **files;
    size_t count;
    files = disk_fault_list_files(h->disk, ".seg", &count);
    snprintf(path, sizeof(path), "%s", files[loc.segment_number]);
    for (size_t i = 0; i < count; i++)
        free(files[i]);
    free(files);
    assert_int_equal(disk_fault_flip_bit(h->disk, path, loc.offset + 30, 2), 0);
    assert_int_equal(journal_read(q, 78, buf, sizeof(buf)), E_JOURNAL_CORRUPT);
    h_free(h);
}

static void test_torn_tail_and_corruption(void **state)
{
    struct harness *h = h_new(0);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("torn"));
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 10; seq++)
        t = publish(q, seq, 64);
    h_wait(h, t);
    h_close(h);
    char **files;
    size_t count;
    files = disk_fault_list_files(h->disk, ".seg", &count);
    assert_int_equal(count, 1);
    char path[128];
    snprintf(path, sizeof(path), "%s", files[0]);
    free(files[0]);
    free(files);
    uint64_t record = format_record_size(8 + 64);
    /* A bit flipped in the last record: a torn tail, cut and reported. */
    assert_int_equal(disk_fault_flip_bit(h->disk, path, 32 + 9 * record + 40, 0), 0);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.truncated_count, 1);
    assert_string_equal(h->stats.truncated_path, path);
    assert_int_equal(h->stats.truncated_offset, 32 + 9 * record);
    assert_int_equal(h->stats.message_count, 9);
    h_close(h);
    /* A bit flipped in the middle: an error naming file and offset. */
    assert_int_equal(disk_fault_flip_bit(h->disk, path, 32 + 4 * record + 20, 5), 0);
    assert_int_equal(h_open(h), E_JOURNAL_CORRUPT);
    assert_string_equal(h->stats.corrupt_path, path);
    assert_int_equal(h->stats.corrupt_offset, 32 + 4 * record);
    h_free(h);
}

/* ---- Recovery against a model ------------------------------------------------ */

/* What one queue's log must give back. Blobs carry the queue's salt, so
 * that two queues' messages of the same seq and size differ (segment
 * numbers, and seqs, are per queue). */
#define MODEL_SEQ_MAX 300

struct model_queue {
    const char *name; /* no name is part of another: the_log_of() looks them up */
    uint8_t salt;
    struct journal_queue *q;
    uint32_t size[MODEL_SEQ_MAX + 1]; /* 0: never published, or cut with a torn tail */
    bool delivered[MODEL_SEQ_MAX + 1];
    bool acked[MODEL_SEQ_MAX + 1];
    uint64_t purge_below;
    bool deleted;
};

static void fill_salted(uint8_t *blob, uint32_t size, uint8_t salt, uint64_t seq)
{
    for (uint32_t i = 0; i < size; i++)
        blob[i] = (uint8_t)(salt * 101u + seq * 31 + i);
}

static uint64_t model_publish(struct model_queue *m, uint64_t seq, uint32_t size)
{
    assert_true(seq <= MODEL_SEQ_MAX && size > 0);
    uint8_t *blob = malloc(size);
    fill_salted(blob, size, m->salt, seq);
    uint64_t ticket = journal_publish(m->q, seq, blob, size);
    free(blob);
    m->size[seq] = size;
    return ticket;
}

/* Recovery handed back exactly the model: per queue, its live messages in
 * seq order with their sizes, bytes and delivered flags, and nothing else. */
static void check_model(struct harness *h, struct model_queue *models, size_t count)
{
    size_t expected = 0;
    for (size_t k = 0; k < count; k++) {
        const struct model_queue *m = &models[k];
        size_t i = 0;
        while (i < h->recovered_count && strcmp(h->recovered[i].queue, m->name) != 0)
            i++;
        for (uint64_t seq = 1; seq <= MODEL_SEQ_MAX && !m->deleted; seq++) {
            if (m->size[seq] == 0 || m->acked[seq] || seq < m->purge_below)
                continue;
            assert_true(i < h->recovered_count);
            const struct message *got = &h->recovered[i++];
            assert_string_equal(got->queue, m->name);
            assert_int_equal(got->seq, seq);
            assert_int_equal(got->size, m->size[seq]);
            assert_int_equal(got->delivered, m->delivered[seq]);
            uint8_t *want = malloc(got->size);
            fill_salted(want, got->size, m->salt, seq);
            assert_memory_equal(got->blob, want, got->size);
            free(want);
            expected++;
        }
        /* A queue's messages come together: the next one is another queue's. */
        assert_true(i == h->recovered_count || strcmp(h->recovered[i].queue, m->name) != 0);
    }
    assert_int_equal(h->recovered_count, expected);
    assert_int_equal(h->stats.message_count, expected);
}

/* The path of the last segment of the queue named name (malloc'ed). */
static char *last_segment_of(struct harness *h, const char *name)
{
    size_t count = 0;
    char **files = disk_fault_list_files(h->disk, ".seg", &count);
    char *found = NULL;
    for (size_t i = 0; i < count; i++) {
        char header[256];
        snprintf(header, sizeof(header), "%.*s/queue",
                 (int)(strrchr(files[i], '/') - files[i]), files[i]);
        size_t size = 0;
        uint8_t *bytes = disk_fault_read_file(h->disk, header, &size);
        assert_non_null(bytes);
        if (memmem(bytes, size, name, strlen(name)) != NULL) {
            free(found); /* sorted: the last one listed is the last segment */
            found = files[i];
        } else {
            free(files[i]);
        }
        free(bytes);
    }
    free(files);
    assert_non_null(found);
    return found;
}

/* Tears the last record of a queue whose log ends with publishes of size
 * bytes: a bit flipped in it, as a crash mid-write leaves it. */
static void tear_last_publish(struct harness *h, struct model_queue *m, uint64_t seq)
{
    char *path = last_segment_of(h, m->name);
    size_t size = 0;
    free(disk_fault_read_file(h->disk, path, &size));
    uint64_t record = format_record_size(8 + (uint64_t)m->size[seq]);
    assert_int_equal(disk_fault_flip_bit(h->disk, path, size - record + 40, 3), 0);
    m->size[seq] = 0;
    free(path);
}

/* The records of test_recovery_matches_the_logs, in models (see there):
 * returns the last sync ticket. "fresh" fills a segment, then rolls one
 * record into a new one. */
static uint64_t write_model_logs(struct model_queue *models, uint64_t fresh_count)
{
    struct model_queue *solo = &models[0], *run = &models[1], *many = &models[2];
    uint64_t t = 0;
    /* solo: fewer live messages than make pass 2 read a whole segment. */
    for (uint64_t seq = 1; seq <= 12; seq++)
        t = model_publish(solo, seq, 100);
    journal_delivered(solo->q, 3);
    solo->delivered[3] = true;
    journal_delivered(solo->q, 5);
    solo->delivered[5] = true;
    journal_ack(solo->q, 4);
    solo->acked[4] = true;
    /* run: one segment of 40, a run pass 2 would read whole. */
    for (uint64_t seq = 1; seq <= 40; seq++)
        t = model_publish(run, seq, 60);
    for (uint64_t seq = 2; seq <= 40; seq += 9) {
        journal_delivered(run->q, seq);
        run->delivered[seq] = true;
    }
    /* many: about fifteen segments; every third acked, a purge below 20. */
    for (uint64_t seq = 1; seq <= MODEL_SEQ_MAX; seq++)
        t = model_publish(many, seq, (uint32_t)(120 + seq % 50));
    for (uint64_t seq = 1; seq <= MODEL_SEQ_MAX; seq++) {
        if (seq % 5 == 0) {
            journal_delivered(many->q, seq);
            many->delivered[seq] = true;
        }
        if (seq % 3 == 0) {
            t = journal_ack(many->q, seq);
            many->acked[seq] = true;
        }
    }
    t = journal_purge(many->q, 20);
    many->purge_below = 20;
    /* torn1 and tornN: publishes only, their last one torn later. */
    for (uint64_t seq = 1; seq <= 10; seq++)
        t = model_publish(&models[3], seq, 64);
    for (uint64_t seq = 1; seq <= 100; seq++)
        t = model_publish(&models[4], seq, 200);
    for (uint64_t seq = 1; seq <= 20; seq++)
        model_publish(&models[5], seq, 80);
    t = journal_queue_delete(models[5].q);
    models[5].deleted = true;
    for (uint64_t seq = 1; seq <= fresh_count; seq++)
        t = model_publish(&models[6], seq, 100);
    return t;
}

/* Goal: recovery hands back exactly what the logs hold, whatever segment
 * its second pass finds in its buffer: queues of one segment with short
 * and long runs of live messages, queues of many (rolled, acked out of
 * order, purged, compacted), a torn tail in a queue of one segment and in
 * the last of many, a last segment torn from its header on (removed), a
 * deleted queue, the same seqs and segment numbers in several queues.
 * Method: a model of every queue, checked after a restart that cuts the
 * torn tails and again after one more. */
static void test_recovery_matches_the_logs(void **state)
{
    struct harness *h = h_new(4096);
    struct model_queue models[] = {
        {.name = "solo"}, {.name = "run"}, {.name = "many"},
        {.name = "torn1"}, {.name = "tornN"}, {.name = "gone"}, {.name = "fresh"},
    };
    size_t count = sizeof(models) / sizeof(models[0]);
    for (size_t k = 0; k < count; k++) {
        models[k].salt = (uint8_t)(k + 1);
        models[k].q = journal_queue_open(h->j, BYTES_LIT("v"),
                                         (struct bytes){(const uint8_t *)models[k].name,
                                                        (uint32_t)strlen(models[k].name)});
    }
    uint64_t fresh_record = format_record_size(8 + 100);
    uint64_t fresh_count = (4096 - FORMAT_FILE_HEADER_SIZE) / fresh_record + 1;
    assert_true(fresh_count > 16 && fresh_count <= MODEL_SEQ_MAX);
    h_wait(h, write_model_logs(models, fresh_count));
    assert_int_equal(h->status, OK);
    h_close(h);
    assert_true(count_files(h, ".seg") > 10);
    tear_last_publish(h, &models[3], 10);
    tear_last_publish(h, &models[4], 100);
    /* fresh's new segment torn before its first sync, header and all: it
     * goes, and the one before comes back from its own bytes, not the torn
     * ones pass 1 read last. */
    char *path = last_segment_of(h, "fresh");
    size_t size = 0;
    free(disk_fault_read_file(h->disk, path, &size));
    assert_int_equal(size, FORMAT_FILE_HEADER_SIZE + fresh_record);
    assert_int_equal(disk_fault_flip_bit(h->disk, path, 4, 1), 0);
    tear_last_publish(h, &models[6], fresh_count);
    free(path);

    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.truncated_count, 3);
    assert_int_equal(h->stats.queue_count, 6);
    check_model(h, models, count);
    h_close(h);
    /* Again, cut and (maybe) compacted: the same messages. */
    assert_int_equal(h_open(h), OK);
    assert_int_equal(h->stats.truncated_count, 0);
    check_model(h, models, count);
    h_free(h);
}

/* Goal: a queue of one segment is read once (pass 2 starts from the segment
 * pass 1 left in its buffer), with few live messages or many. Method: the
 * bytes recovery reports read are the bytes of the queue headers and
 * segments, once each. */
static void test_recovery_reads_one_segment_once(void **state)
{
    struct harness *h = h_new(0);
    struct model_queue models[] = {{.name = "few"}, {.name = "lots"}};
    for (size_t k = 0; k < 2; k++) {
        models[k].salt = (uint8_t)(k + 1);
        models[k].q = journal_queue_open(h->j, BYTES_LIT("/"),
                                         (struct bytes){(const uint8_t *)models[k].name,
                                                        (uint32_t)strlen(models[k].name)});
    }
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 5; seq++)
        t = model_publish(&models[0], seq, 300);
    for (uint64_t seq = 1; seq <= 200; seq++)
        t = model_publish(&models[1], seq, 500);
    journal_ack(models[1].q, 7);
    models[1].acked[7] = true;
    h_wait(h, t);
    h_close(h);
    assert_int_equal(count_files(h, ".seg"), 2);
    size_t files_size = bytes_of_files(h, "/queue") + bytes_of_files(h, ".seg");
    assert_int_equal(h_open(h), OK);
    check_model(h, models, 2);
    assert_int_equal(h->stats.byte_count, files_size);
    h_free(h);
}

/* ---- Definitions ------------------------------------------------------------ */

struct defs_seen {
    char text[4096];
    size_t count;
};

static void on_definition(void *ctx, enum journal_def_kind kind, struct bytes key,
                          struct bytes value)
{
    struct defs_seen *s = ctx;
    size_t n = strlen(s->text);
    snprintf(s->text + n, sizeof(s->text) - n, "%d:%.*s=%.*s;", (int)kind, (int)key.len,
             key.ptr, (int)value.len, value.ptr);
    s->count++;
}

static void test_definitions(void **state)
{
    struct harness *h = calloc(1, sizeof(*h));
    assert_int_equal(uv_loop_init(&h->loop), 0);
    h->disk = disk_fault_new(1);
    h->opts.disk = disk_fault_ops(h->disk);
    h->opts.definitions_compact_size = 2048;
    assert_int_equal(h_open(h), OK);
    journal_define(h->j, JOURNAL_DEF_BINDING, BYTES_LIT("/|x|q"), BYTES_LIT("b1"));
    journal_define(h->j, JOURNAL_DEF_QUEUE, BYTES_LIT("/|q"), BYTES_LIT("args1"));
    journal_define(h->j, JOURNAL_DEF_EXCHANGE, BYTES_LIT("/|x"), BYTES_LIT("topic"));
    journal_define(h->j, JOURNAL_DEF_VHOST, BYTES_LIT("/"), BYTES_LIT(""));
    journal_define(h->j, JOURNAL_DEF_QUEUE, BYTES_LIT("/|gone"), BYTES_LIT("x"));
    journal_undefine(h->j, JOURNAL_DEF_QUEUE, BYTES_LIT("/|gone"));
    uint64_t t = journal_define(h->j, JOURNAL_DEF_QUEUE, BYTES_LIT("/|q"), BYTES_LIT("args2"));
    h_wait(h, t);
    h_close(h);
    assert_int_equal(h_open(h), OK);
    struct defs_seen seen = {0};
    journal_recover_definitions(h->j, on_definition, &seen);
    assert_int_equal(seen.count, 4);
    assert_string_equal(seen.text, "1:/=;4:/|x=topic;5:/|q=args2;6:/|x|q=b1;");
    /* Churn past the compaction size: the log is rewritten as a snapshot. */
    for (int i = 0; i < 200; i++) {
        char value[32];
        snprintf(value, sizeof(value), "v%d", i);
        t = journal_define(h->j, JOURNAL_DEF_USER, BYTES_LIT("guest"), bytes_of_cstr(value));
    }
    h_wait(h, t);
    h_close(h);
    size_t size = 0;
    uint8_t *file = disk_fault_read_file(h->disk, DIR "/definitions", &size);
    free(file);
    assert_true(size < 4096);
    assert_int_equal(h_open(h), OK);
    memset(&seen, 0, sizeof(seen));
    journal_recover_definitions(h->j, on_definition, &seen);
    assert_int_equal(seen.count, 5);
    assert_non_null(strstr(seen.text, "2:guest=v199;"));
    t = journal_define(h->j, JOURNAL_DEF_USER, BYTES_LIT("admin"), BYTES_LIT("pw"));
    h_wait(h, t);
    h_close(h);
    /* A torn last record is cut; the rest stays. */
    file = disk_fault_read_file(h->disk, DIR "/definitions", &size);
    free(file);
    assert_int_equal(disk_fault_flip_bit(h->disk, DIR "/definitions", size - 3, 1), 0);
    assert_int_equal(h_open(h), OK);
    assert_int_equal(journal_definitions_count(h->j), 5);
    h_close(h);
    /* Corruption before valid records fails the open with a message. */
    assert_int_equal(disk_fault_flip_bit(h->disk, DIR "/definitions", 40, 1), 0);
    char err[256] = "";
    struct journal *j = NULL;
    assert_int_equal(journal_open(&j, &h->loop, DIR, &h->opts, err, sizeof(err)),
                     E_JOURNAL_CORRUPT);
    assert_non_null(strstr(err, "offset 32"));
    h_free(h);
}

/* ---- Failure and the real disk ---------------------------------------------- */

static void test_disk_error_stops_journal(void **state)
{
    struct harness *h = h_new(0);
    struct journal_queue *q = journal_queue_open(h->j, BYTES_LIT("v"), BYTES_LIT("err"));
    h_wait(h, publish(q, 1, 10));
    disk_fault_fail_after(h->disk, 1, -ENOSPC);
    publish(q, 2, 10);
    while (h->status == OK)
        uv_run(&h->loop, UV_RUN_ONCE);
    assert_int_equal(h->status, E_IO);
    assert_int_equal(journal_status(h->j), E_IO);
    assert_int_equal(publish(q, 3, 10), 0); /* ticket 0: never durable */
    h_free(h);
}

static int remove_tree(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    return system(cmd);
}

static void test_posix_disk(void **state)
{
    char dir[] = "/tmp/quay-journal-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char jdir[128];
    snprintf(jdir, sizeof(jdir), "%s/data", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct harness h = {0};
    char err[256];
    struct journal_options opts = {.segment_size_max = 64 * 1024};
    for (int round = 0; round < 2; round++) {
        struct journal *j;
        assert_int_equal(journal_open(&j, &loop, jdir, &opts, err, sizeof(err)), OK);
        journal_set_synced_callback(j, on_synced, &h);
        recovered_clear(&h);
        h.synced = 0;
        assert_int_equal(journal_recover(j, on_recover, &h, &h.stats), OK);
        struct journal_queue *q = journal_queue_open(j, BYTES_LIT("/"), BYTES_LIT("q"));
        if (round == 0) {
            uint64_t t = 0;
            for (uint64_t seq = 1; seq <= 1000; seq++)
                t = publish(q, seq, 500);
            for (uint64_t seq = 1; seq <= 900; seq++)
                t = journal_ack(q, seq);
            while (h.synced < t)
                uv_run(&loop, UV_RUN_ONCE);
        } else {
            assert_int_equal(h.stats.message_count, 100);
            assert_int_equal(h.recovered[0].seq, 901);
            check_blob(&h.recovered[99]);
        }
        journal_close(j);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
    recovered_clear(&h);
    uv_loop_close(&loop);
    assert_int_equal(remove_tree(dir), 0);
}

static void wait_status(uv_loop_t *loop, struct harness *h, uint64_t ticket)
{
    while (h->synced < ticket && h->status == OK)
        uv_run(loop, UV_RUN_ONCE);
}

/* Appends a DELETE record to the highest segment under dir/queues/: what
 * an old owner deleting the queue it lost writes through its descriptor. */
static void append_stray_delete(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s/queues/*/*.seg | awk -F/ '{print $NF, $0}' | sort | "
             "tail -1 | cut -d' ' -f2", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char path[256] = "";
    assert_non_null(fgets(path, sizeof path, p));
    pclose(p);
    path[strcspn(path, "\n")] = '\0';
    uint8_t record[64];
    uint64_t size = format_record_size(0);
    assert_true(size <= sizeof record);
    format_record_encode(record, RECORD_DELETE, NULL, 0, NULL, 0);
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    assert_int_equal(fwrite(record, 1, size, f), size);
    fclose(f);
}

/* Brokers on one shared directory: journals in dir/a, dir/b and (n 3)
 * dir/c, opened with opts and recovered empty; a's syncs reach ha (a test
 * points the others' at theirs). The test closes each journal; shared_end
 * runs the loop dry, clears what the harnesses recovered and removes the
 * directory. */
struct shared {
    char dir[32], adir[128], bdir[128], cdir[128];
    struct journal_options opts;
    uv_loop_t loop;
    struct harness ha, hb, hc;
    struct journal *a, *b, *c;
};

static void shared_start(struct shared *s, int n, struct journal_options opts)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/quay-shared-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->adir, sizeof s->adir, "%s/a", s->dir);
    snprintf(s->bdir, sizeof s->bdir, "%s/b", s->dir);
    snprintf(s->cdir, sizeof s->cdir, "%s/c", s->dir);
    s->opts = opts;
    assert_int_equal(uv_loop_init(&s->loop), 0);
    const char *dirs[3] = {s->adir, s->bdir, s->cdir};
    struct journal **j[3] = {&s->a, &s->b, &s->c};
    struct harness *h[3] = {&s->ha, &s->hb, &s->hc};
    char err[256];
    for (int i = 0; i < n; i++)
        assert_int_equal(journal_open(j[i], &s->loop, dirs[i], &s->opts, err, sizeof err), OK);
    journal_set_synced_callback(s->a, on_synced, &s->ha);
    for (int i = 0; i < n; i++)
        assert_int_equal(journal_recover(*j[i], on_recover, h[i], &h[i]->stats), OK);
}

static void shared_end(struct shared *s)
{
    uv_run(&s->loop, UV_RUN_DEFAULT);
    recovered_clear(&s->ha);
    recovered_clear(&s->hb);
    recovered_clear(&s->hc);
    assert_int_equal(uv_loop_close(&s->loop), 0);
    assert_int_equal(remove_tree(s->dir), 0);
}

/* A taker reads a log whose owner died in the middle of a compaction (its
 * slices go one per sync, so a crash between them is ordinary): the
 * reader journal recovers it as it is, moving and marking nothing (it has
 * no writer), and gets every live message once, delivered ones marked. */
static void test_adopt_a_log_left_mid_compaction(void **state)
{
    (void)state;
    struct shared s;
    shared_start(&s, 2,
                 (struct journal_options){.segment_size_max = 4096, .compact_slice_bytes = 256,
                                          .fenced = true});
    uv_loop_t *loop = &s.loop;
    struct harness *ha = &s.ha, *hb = &s.hb;
    struct journal *a = s.a, *b = s.b;
    journal_set_synced_callback(b, on_synced, hb);
    struct journal_queue *q = journal_queue_open(a, BYTES_LIT("/"), BYTES_LIT("q"));
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 60; seq++) /* ~30 to a segment */
        t = publish(q, seq, 100);
    for (uint64_t seq = 1; seq <= 30; seq++)
        t = journal_delivered(q, seq);
    wait_status(loop, ha, t);
    /* Segment 0 under 25% live: its compaction starts, one slice of 256
     * bytes; A stops before the next (no synced report runs it). */
    for (uint64_t seq = 1; seq <= 24; seq++)
        t = journal_ack(q, seq);
    struct journal_location loc;
    assert_int_equal(journal_locate(q, 25, &loc), OK);
    assert_true(loc.segment_number > 0); /* moved by the first slice */
    assert_int_equal(journal_locate(q, 28, &loc), OK);
    assert_int_equal(loc.segment_number, 0); /* not yet */
    journal_close(a);
    uv_run(loop, UV_RUN_NOWAIT); /* (B's handle keeps the loop: close A's) */
    struct journal_adoption out;
    assert_int_equal(journal_adopt(b, s.adir, BYTES_LIT("/"), BYTES_LIT("q"), on_recover, hb,
                                   &out), OK);
    assert_int_equal(out.seq_last, 60);
    assert_int_equal(hb->recovered_count, 36);
    for (size_t i = 0; i < hb->recovered_count; i++) {
        assert_int_equal(hb->recovered[i].seq, 25 + i);
        assert_int_equal(hb->recovered[i].delivered, 25 + i <= 30);
        check_blob(&hb->recovered[i]);
    }
    recovered_clear(hb);
    journal_close(b);
    shared_end(&s);
}

/* Shared storage: broker B takes over broker A's log of one queue
 * (journal_adopt): it gets every live message as A left it (acked ones
 * gone, delivered ones marked; a DELETE that A wrote after losing the
 * queue is ignored), A's other queue stays A's, and A, cut off
 * but still running, can no longer confirm anything: its next sync fails
 * the fence (E_JOURNAL_FENCED) although its descriptors still write. */
static void test_shared_storage_fence_and_adopt(void **state)
{
    (void)state;
    struct shared s;
    shared_start(&s, 2,
                 (struct journal_options){.segment_size_max = 16 * 1024, .fenced = true});
    uv_loop_t *loop = &s.loop;
    struct harness *ha = &s.ha, *hb = &s.hb;
    struct journal *a = s.a, *b = s.b;
    char err[256];
    journal_set_synced_callback(b, on_synced, hb);
    struct journal_queue *q = journal_queue_open(a, BYTES_LIT("/"), BYTES_LIT("q"));
    struct journal_queue *other = journal_queue_open(a, BYTES_LIT("/"), BYTES_LIT("other"));
    struct journal_queue *third = journal_queue_open(a, BYTES_LIT("/"), BYTES_LIT("third"));
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 100; seq++) /* several segments */
        t = publish(q, seq, 300);
    for (uint64_t seq = 1; seq <= 10; seq++)
        t = journal_delivered(q, seq);
    for (uint64_t seq = 1; seq <= 5; seq++)
        t = journal_ack(q, seq);
    t = publish(other, 1, 100);
    t = publish(third, 1, 100);
    wait_status(loop, ha, t);
    assert_int_equal(ha->status, OK);
    /* B takes q over, a stray DELETE of A's at its tail (ignored there). */
    append_stray_delete(s.adir);
    struct journal_adoption out;
    assert_int_equal(journal_adopt(b, s.adir, BYTES_LIT("/"), BYTES_LIT("q"), on_recover, hb,
                                   &out), OK);
    assert_true(out.staged[0] != '\0');
    assert_int_equal(out.seq_last, 100);
    assert_int_equal(hb->recovered_count, 95);
    for (size_t i = 0; i < hb->recovered_count; i++) {
        assert_string_equal(hb->recovered[i].queue, "q");
        assert_int_equal(hb->recovered[i].seq, 6 + i);
        assert_int_equal(hb->recovered[i].delivered, 6 + i <= 10);
        check_blob(&hb->recovered[i]);
    }
    /* Nothing left to take over there; a queue A never had: nothing. */
    struct journal_adoption again;
    recovered_clear(hb);
    assert_int_equal(journal_adopt(b, s.adir, BYTES_LIT("/"), BYTES_LIT("q"), on_recover, hb,
                                   &again), OK);
    assert_int_equal(again.staged[0], '\0');
    assert_int_equal(journal_adopt(b, s.adir, BYTES_LIT("/"), BYTES_LIT("none"), on_recover, hb,
                                   &again), OK);
    assert_int_equal(hb->recovered_count, 0);
    /* A log B's index of A's directory names but that went since (A deleted
     * the queue): B looks again and finds none. */
    t = journal_queue_delete(third);
    wait_status(loop, ha, t);
    assert_int_equal(journal_adopt(b, s.adir, BYTES_LIT("/"), BYTES_LIT("third"), on_recover, hb,
                                   &again), OK);
    assert_int_equal(again.staged[0], '\0');
    assert_int_equal(hb->recovered_count, 0);
    /* A, cut off, appends through its old descriptors: never confirmed. */
    uint64_t stray = publish(q, 101, 300);
    wait_status(loop, ha, stray);
    assert_int_equal(ha->status, E_JOURNAL_FENCED);
    assert_true(ha->synced < stray);
    assert_int_equal(journal_status(a), E_JOURNAL_FENCED);
    assert_int_equal(journal_publish(other, 2, "x", 1), 0); /* stopped for good */
    /* B's own journal goes on; the staged copy goes when B says so. */
    struct journal_queue *mine = journal_queue_open(b, BYTES_LIT("/"), BYTES_LIT("q"));
    t = publish(mine, 6, 300);
    wait_status(loop, hb, t);
    assert_int_equal(hb->status, OK);
    journal_adopt_finish(b, out.staged); /* on B's journal thread, in order */
    t = publish(mine, 7, 300);
    wait_status(loop, hb, t);
    assert_int_equal(access(out.staged, F_OK), -1);
    char other_dir[256];
    snprintf(other_dir, sizeof other_dir, "%s/queues", s.adir);
    assert_int_equal(access(other_dir, F_OK), 0);
    journal_close(a);
    journal_close(b);
    uv_run(loop, UV_RUN_DEFAULT);
    /* A restarted recovers its other queue only: q's log is not its own. */
    struct harness hr = {0};
    s.opts.fenced = true;
    assert_int_equal(journal_open(&a, loop, s.adir, &s.opts, err, sizeof err), OK);
    assert_int_equal(journal_recover(a, on_recover, &hr, &hr.stats), OK);
    assert_int_equal(hr.recovered_count, 1);
    assert_string_equal(hr.recovered[0].queue, "other");
    journal_close(a);
    recovered_clear(&hr);
    shared_end(&s);
}

/* The real disk, its directory fsyncs and renames counted (either thread). */
static struct {
    struct disk_ops ops;
    pthread_mutex_t mutex;
    int fsyncs;
    int renames_after_fsync; /* renames once a fsync was made: staging after a sync */
    char synced[32][256];    /* the paths fsynced */
} counted = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static int counted_fsync_dir(void *ctx, const char *path)
{
    (void)ctx;
    pthread_mutex_lock(&counted.mutex);
    if (counted.fsyncs < 32)
        snprintf(counted.synced[counted.fsyncs], sizeof counted.synced[0], "%s", path);
    counted.fsyncs++;
    pthread_mutex_unlock(&counted.mutex);
    return disk_posix()->fsync_dir(disk_posix()->ctx, path);
}

static int counted_rename(void *ctx, const char *from, const char *to)
{
    (void)ctx;
    pthread_mutex_lock(&counted.mutex);
    counted.renames_after_fsync += counted.fsyncs > 0;
    pthread_mutex_unlock(&counted.mutex);
    return disk_posix()->rename(disk_posix()->ctx, from, to);
}

static void counted_reset(void)
{
    pthread_mutex_lock(&counted.mutex);
    counted.fsyncs = 0;
    counted.renames_after_fsync = 0;
    pthread_mutex_unlock(&counted.mutex);
}

/* A batch of takeovers (cluster/adoption.c stages a slice's queues, then
 * commits, then reads): staging renames only, and the commit fsyncs each
 * directory the renames changed once: A's queues/, B's adopted/, and each
 * staged log's new root (which gained queues/) and queues/ (which gained
 * the log), 2 x 8 + 2 for 8 queues (four per queue, 32, when every rename
 * was made durable on its own). Then each is read whole. A takeover on its
 * own (journal_adopt) costs four. */
static void test_adopt_batch_fsyncs_each_directory_once(void **state)
{
    (void)state;
    enum { QUEUES = 8 };
    char dir[] = "/tmp/quay-shared-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char adir[128], bdir[128];
    snprintf(adir, sizeof adir, "%s/a", dir);
    snprintf(bdir, sizeof bdir, "%s/b", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct harness ha = {0}, hb = {0};
    char err[256];
    counted.ops = *disk_posix();
    counted.ops.fsync_dir = counted_fsync_dir;
    counted.ops.rename = counted_rename;
    struct journal_options opts = {.segment_size_max = 16 * 1024, .fenced = true};
    struct journal *a, *b;
    assert_int_equal(journal_open(&a, &loop, adir, &opts, err, sizeof err), OK);
    opts.disk = &counted.ops;
    assert_int_equal(journal_open(&b, &loop, bdir, &opts, err, sizeof err), OK);
    journal_set_synced_callback(a, on_synced, &ha);
    assert_int_equal(journal_recover(a, on_recover, &ha, &ha.stats), OK);
    assert_int_equal(journal_recover(b, on_recover, &hb, &hb.stats), OK);
    char names[QUEUES + 1][8];
    uint64_t t = 0;
    for (int i = 0; i <= QUEUES; i++) {
        snprintf(names[i], sizeof names[i], "q%d", i);
        struct journal_queue *q =
            journal_queue_open(a, BYTES_LIT("/"), (struct bytes){(uint8_t *)names[i], 2});
        for (uint64_t seq = 1; seq <= 5; seq++)
            t = publish(q, seq, 100);
    }
    wait_status(&loop, &ha, t);
    journal_close(a); /* A dies */
    uv_run(&loop, UV_RUN_NOWAIT);
    counted_reset();
    char staged[QUEUES][512];
    for (int i = 0; i < QUEUES; i++) {
        assert_int_equal(journal_adopt_stage(b, adir, BYTES_LIT("/"),
                                             (struct bytes){(uint8_t *)names[i], 2}, staged[i]),
                         OK);
        assert_non_null(strstr(staged[i], "/b/adopted/a."));
    }
    assert_int_equal(counted.fsyncs, 0); /* nothing durable yet: nothing may be read */
    assert_int_equal(journal_adopt_commit(b), OK);
    assert_int_equal(counted.fsyncs, 2 * QUEUES + 2);
    assert_int_equal(counted.renames_after_fsync, 0);
    for (int i = 0; i < 2 * QUEUES + 2 && i < 32; i++) {
        for (int k = 0; k < i; k++)
            assert_string_not_equal(counted.synced[i], counted.synced[k]);
    }
    assert_int_equal(journal_adopt_commit(b), OK); /* nothing staged since: no fsync */
    assert_int_equal(counted.fsyncs, 2 * QUEUES + 2);
    for (int i = 0; i < QUEUES; i++) {
        struct journal_adoption out;
        recovered_clear(&hb);
        assert_int_equal(journal_adopt_read(b, staged[i], on_recover, &hb, &out), OK);
        assert_int_equal(hb.recovered_count, 5);
        assert_string_equal(hb.recovered[4].queue, names[i]);
        check_blob(&hb.recovered[4]);
    }
    counted_reset();
    struct journal_adoption out;
    recovered_clear(&hb);
    assert_int_equal(journal_adopt(b, adir, BYTES_LIT("/"),
                                   (struct bytes){(uint8_t *)names[QUEUES], 2}, on_recover,
                                   &hb, &out), OK);
    assert_int_equal(hb.recovered_count, 5);
    assert_int_equal(counted.fsyncs, 4);
    recovered_clear(&ha);
    recovered_clear(&hb);
    journal_close(b);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(remove_tree(dir), 0);
}

static bool sweep_all(void *ctx, struct bytes vhost, struct bytes name, const char *staged)
{
    (void)vhost;
    assert_true(name.len == 1 && name.ptr[0] == 'p');
    assert_non_null(strstr(staged, "/adopted/"));
    (*(int *)ctx)++;
    return true;
}

/* A taker (B) that died before its copy was synced left A's log staged in
 * B/adopted/: the next taker (C) claims it from there (a rename into its
 * own adopted/, only for the source it names) and reads every live
 * message of it, as journal_adopt would have from A's directory. */
static void test_shared_storage_claim_staged(void **state)
{
    (void)state;
    struct shared s;
    shared_start(&s, 3,
                 (struct journal_options){.segment_size_max = 16 * 1024, .fenced = true});
    uv_loop_t *loop = &s.loop;
    struct harness *ha = &s.ha, *hb = &s.hb, *hc = &s.hc;
    struct journal *a = s.a, *b = s.b, *c = s.c;
    struct journal_queue *q = journal_queue_open(a, BYTES_LIT("/"), BYTES_LIT("q"));
    struct journal_queue *p = journal_queue_open(a, BYTES_LIT("/"), BYTES_LIT("p"));
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 60; seq++)
        t = publish(q, seq, 300);
    for (uint64_t seq = 1; seq <= 10; seq++)
        t = journal_ack(q, seq);
    t = publish(p, 1, 100);
    wait_status(loop, ha, t);
    journal_close(a); /* A dies */
    struct journal_adoption out;
    for (int i = 0; i < 2; i++) /* B stages both, copies nothing (it dies) */
        assert_int_equal(journal_adopt(b, s.adir, BYTES_LIT("/"), i ? BYTES_LIT("p") :
                                       BYTES_LIT("q"), on_recover, hb, &out), OK);
    journal_close(b);
    char staged[512];
    assert_int_equal(journal_adopt_claim_staged(c, s.bdir, "x", BYTES_LIT("/"), BYTES_LIT("q"),
                                                staged), OK);
    assert_int_equal(staged[0], '\0'); /* not from x */
    assert_int_equal(journal_adopt_claim_staged(c, s.bdir, "a", BYTES_LIT("/"), BYTES_LIT("q"),
                                                staged), OK);
    assert_non_null(strstr(staged, "/c/adopted/a."));
    assert_int_equal(journal_adopt_commit(c), OK); /* (the claim's rename durable) */
    assert_int_equal(journal_adopt_read(c, staged, on_recover, hc, &out), OK);
    assert_string_equal(out.staged, staged);
    assert_int_equal(out.seq_last, 60);
    assert_int_equal(hc->recovered_count, 50);
    for (size_t i = 0; i < hc->recovered_count; i++) {
        assert_string_equal(hc->recovered[i].queue, "q");
        assert_int_equal(hc->recovered[i].seq, 11 + i);
        check_blob(&hc->recovered[i]);
    }
    /* Gone from B's adopted/ (p's is still there); claimed once only. */
    char staged_p[512];
    assert_int_equal(journal_adopt_claim_staged(c, s.bdir, "a", BYTES_LIT("/"), BYTES_LIT("q"),
                                                staged_p), OK);
    assert_int_equal(staged_p[0], '\0');
    assert_int_equal(journal_adopt_claim_staged(c, s.bdir, "a", BYTES_LIT("/"), BYTES_LIT("p"),
                                                staged_p), OK);
    assert_true(staged_p[0] != '\0');
    /* A sweep after a restart removes what nobody needs: both, here (a
     * removal cut short, <staged>.gone, is finished too). */
    char gone[600];
    snprintf(gone, sizeof gone, "%s.gone", staged);
    assert_int_equal(rename(staged, gone), 0);
    int swept = 0;
    journal_adopt_sweep(c, sweep_all, &swept);
    assert_int_equal(swept, 1); /* p's; the .gone one is not asked about */
    journal_set_synced_callback(c, on_synced, hc);
    struct journal_queue *z = journal_queue_open(c, BYTES_LIT("/"), BYTES_LIT("z"));
    t = publish(z, 1, 10); /* after the removals, in order */
    wait_status(loop, hc, t);
    assert_int_equal(access(gone, F_OK), -1);
    assert_int_equal(access(staged_p, F_OK), -1);
    char p_gone[600];
    snprintf(p_gone, sizeof p_gone, "%s.gone", staged_p);
    assert_int_equal(access(p_gone, F_OK), -1);
    journal_close(c);
    shared_end(&s);
}

/* A taker whose read of a staged log failed (cluster/adoption.c tries
 * again, resumed) finds what it staged itself in its own adopted/, though
 * its index of that directory was built before the stage: the claim of
 * ours comes first, and misses, for every queue it adopts. */
static void test_shared_storage_own_staged_claimed_again(void **state)
{
    (void)state;
    struct shared s;
    shared_start(&s, 2,
                 (struct journal_options){.segment_size_max = 16 * 1024, .fenced = true});
    uv_loop_t *loop = &s.loop;
    struct harness *ha = &s.ha, *hb = &s.hb;
    struct journal *a = s.a, *b = s.b;
    struct journal_queue *q = journal_queue_open(a, BYTES_LIT("/"), BYTES_LIT("q"));
    uint64_t t = 0;
    for (uint64_t seq = 1; seq <= 20; seq++)
        t = publish(q, seq, 100);
    wait_status(loop, ha, t);
    journal_close(a); /* A dies */
    char ours[512], staged[512], again[512];
    assert_int_equal(journal_adopt_claim_staged(b, NULL, "a", BYTES_LIT("/"), BYTES_LIT("q"),
                                                ours), OK);
    assert_int_equal(ours[0], '\0'); /* nothing staged yet: ours is indexed empty */
    assert_int_equal(journal_adopt_stage(b, s.adir, BYTES_LIT("/"), BYTES_LIT("q"), staged), OK);
    assert_non_null(strstr(staged, "/b/adopted/a."));
    assert_int_equal(journal_adopt_commit(b), OK);
    for (int i = 0; i < 2; i++) { /* (each claim takes it out of the index, and back) */
        assert_int_equal(journal_adopt_claim_staged(b, NULL, "a", BYTES_LIT("/"),
                                                    BYTES_LIT("q"), again), OK);
        assert_string_equal(again, staged);
    }
    assert_int_equal(journal_adopt_commit(b), OK);
    struct journal_adoption out;
    assert_int_equal(journal_adopt_read(b, again, on_recover, hb, &out), OK);
    assert_int_equal(hb->recovered_count, 20);
    journal_close(b);
    shared_end(&s);
}

/* A deep staged log read in steps (journal_adopt_read_step with a
 * deadline already past: 16 units a step, a unit a segment or a message)
 * hands over exactly what one read hands over, in seq order, over many
 * steps; a reading given up half way (its queue went) is closed. */
static void test_shared_storage_read_in_steps(void **state)
{
    (void)state;
    struct shared s;
    shared_start(&s, 2,
                 (struct journal_options){.segment_size_max = 16 * 1024, .fenced = true});
    uv_loop_t *loop = &s.loop;
    struct harness *ha = &s.ha, *hb = &s.hb;
    struct journal *a = s.a, *b = s.b;
    uint64_t t = 0;
    for (int k = 0; k < 2; k++) {
        struct journal_queue *q = journal_queue_open(a, BYTES_LIT("/"),
                                                     k ? BYTES_LIT("p") : BYTES_LIT("q"));
        for (uint64_t seq = 1; seq <= 200; seq++)
            t = publish(q, seq, 300); /* (several segments of 16 KiB) */
        for (uint64_t seq = 1; seq <= 20; seq++)
            t = journal_ack(q, seq);
    }
    wait_status(loop, ha, t);
    journal_close(a); /* A dies */
    char staged[2][512];
    for (int k = 0; k < 2; k++)
        assert_int_equal(journal_adopt_stage(b, s.adir, BYTES_LIT("/"),
                                             k ? BYTES_LIT("p") : BYTES_LIT("q"), staged[k]),
                         OK);
    assert_int_equal(journal_adopt_commit(b), OK);
    struct journal_reading *rd = journal_adopt_read_start(b, staged[0], on_recover, hb);
    int steps = 0, rc;
    while ((rc = journal_adopt_read_step(rd, 1)) == AGAIN)
        steps++;
    assert_int_equal(rc, OK);
    assert_true(steps >= 180 / 16);
    struct journal_adoption out;
    assert_int_equal(journal_adopt_read_finish(rd, &out), OK);
    assert_int_equal(out.seq_last, 200);
    assert_int_equal(out.stats.message_count, 180);
    assert_int_equal(hb->recovered_count, 180);
    for (size_t i = 0; i < hb->recovered_count; i++) {
        assert_string_equal(hb->recovered[i].queue, "q");
        assert_int_equal(hb->recovered[i].seq, 21 + i);
        check_blob(&hb->recovered[i]);
    }
    recovered_clear(hb);
    rd = journal_adopt_read_start(b, staged[1], on_recover, hb);
    assert_int_equal(journal_adopt_read_step(rd, 1), AGAIN);
    assert_int_equal(journal_adopt_read_finish(rd, &out), E_IO); /* cut short */
    assert_true(hb->recovered_count < 180);
    journal_close(b);
    shared_end(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_format_record),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_wait_backlog),
        cmocka_unit_test(test_roll_and_reclaim),
        cmocka_unit_test(test_ack_range),
        cmocka_unit_test(test_drained_queue_reclaims_its_segment),
        cmocka_unit_test(test_deleted_log_goes_in_steps),
        cmocka_unit_test(test_dead_segment_goes_in_steps),
        cmocka_unit_test(test_compaction),
        cmocka_unit_test(test_compaction_in_slices),
        cmocka_unit_test(test_stuck_message),
        cmocka_unit_test(test_an_ack_outlives_the_original_of_a_copy),
        cmocka_unit_test(test_paging),
        cmocka_unit_test(test_torn_tail_and_corruption),
        cmocka_unit_test(test_recovery_matches_the_logs),
        cmocka_unit_test(test_recovery_reads_one_segment_once),
        cmocka_unit_test(test_definitions),
        cmocka_unit_test(test_disk_error_stops_journal),
        cmocka_unit_test(test_posix_disk),
        cmocka_unit_test(test_shared_storage_fence_and_adopt),
        cmocka_unit_test(test_adopt_a_log_left_mid_compaction),
        cmocka_unit_test(test_shared_storage_claim_staged),
        cmocka_unit_test(test_shared_storage_own_staged_claimed_again),
        cmocka_unit_test(test_shared_storage_read_in_steps),
        cmocka_unit_test(test_adopt_batch_fsyncs_each_directory_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
