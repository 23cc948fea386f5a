/*
 * test_journal_crash.c: the journal on a fault disk that crashes, after
 * SQLite's test6.c. Lives in tests/unit so CTest runs it; tests/crash/run.sh
 * runs it longer.
 *
 * Goal: after any crash, recovery hands back every message whose publish
 * ticket was reported synced and that was never acked (an ack issued but not
 * reported synced may or may not have reached the disk);
 * an acked-and-synced message never comes back; messages come back in seq
 * order with their bodies intact and, if DELIVERED was synced, flagged
 * delivered; definitions come back as of their last synced change (or a
 * later one). A bit flipped in the last record of a queue's last segment is
 * cut and reported; a bit flipped anywhere before a valid record is
 * E_JOURNAL_CORRUPT naming that file and offset, never skipped. What was
 * synced is the crashed life's last report (until 2026-12-06 the checks read
 * the next life's, reset to 0 by then, and held the journal to nothing but
 * what an earlier life had recovered).
 * Method: per round, a seed drives random publishes, deliveries, acks,
 * acks of runs (journal_ack_range), purges and definition changes on a few queues with tiny segments (so
 * rolls, reclamation and compaction happen), crashes the disk at a random
 * point (dropping unsynced bytes, optionally tearing them), optionally flips
 * a bit, recovers, checks, and goes on living on the same disk for a few
 * lives. The seed fixes the operations and faults; the journal thread's
 * timing is real, so a failing seed may need a few runs to reproduce.
 * QUAY_CRASH_ROUNDS and QUAY_CRASH_SEED override the defaults.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "lib/errors.h"
#include "lib/log.h"
#include "store/disk_fault.h"
#include "store/format.h"
#include "store/journal.h"

#define DIR "/crash"
#define QUEUES 3
#define DEF_KEYS 6
#define LIVES 3

struct msg {
    uint64_t seq;
    uint32_t size;
    bool durable;             /* on disk before this life began */
    uint64_t publish_ticket;  /* this life; 0: from an earlier life */
    uint64_t ack_ticket;      /* this life; 0: not acked */
    uint64_t delivered_ticket;
    bool delivered_durable;
    bool present;             /* scratch for checking */
};

struct model_queue {
    char name[16];
    struct journal_queue *q;
    struct msg *msgs;
    size_t count;
    uint64_t seq_last;
};

struct def_change {
    uint64_t ticket; /* 0: the state this life started with */
    int value;       /* -1: deleted */
};

struct world {
    uint64_t seed;
    uint64_t rng;
    uv_loop_t loop;
    struct disk_fault *disk;
    struct journal_options opts;
    struct journal *j;
    uint64_t synced;      /* this life's journal's highest synced ticket */
    /* The crashed life's, which the checks of what came back hold it to
     * (open_and_recover starts synced over for the next life). */
    uint64_t life_synced;
    struct model_queue queues[QUEUES];
    struct def_change *defs[DEF_KEYS];
    size_t defs_count[DEF_KEYS];
    /* What recovery handed back. */
    struct { int queue; uint64_t seq; bool delivered; uint32_t size; bool blob_ok; } *got;
    size_t got_count;
    int def_seen[DEF_KEYS];
};

static uint64_t rnd(struct world *w)
{
    uint64_t z = (w->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t below(struct world *w, uint64_t n)
{
    return rnd(w) % n;
}

#define CHECK(w, cond)                                                                    \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            printf("crash test failed: %s (seed %llu, line %d)\n", #cond,                   \
                   (unsigned long long)(w)->seed, __LINE__);                              \
            fflush(stdout);                                                               \
            fail();                                                                       \
        }                                                                                 \
    } while (0)

static void fill(uint8_t *blob, uint32_t size, int queue, uint64_t seq)
{
    for (uint32_t i = 0; i < size; i++)
        blob[i] = (uint8_t)(seq * 131 + (uint64_t)queue * 7 + i);
}

static void on_synced(void *ctx, uint64_t ticket, int status)
{
    struct world *w = ctx;
    if (ticket > w->synced)
        w->synced = ticket;
}

static int queue_index(struct world *w, struct bytes name)
{
    for (int i = 0; i < QUEUES; i++) {
        if (bytes_equal_cstr(name, w->queues[i].name))
            return i;
    }
    return -1;
}

static void on_recover(void *ctx, struct journal_queue *q, struct bytes vhost,
                       struct bytes queue, uint64_t seq, bool delivered, const void *blob,
                       uint32_t size)
{
    struct world *w = ctx;
    int qi = queue_index(w, queue);
    CHECK(w, qi >= 0);
    w->got = realloc(w->got, (w->got_count + 1) * sizeof(*w->got));
    uint8_t *want = malloc(size + 1);
    fill(want, size, qi, seq);
    w->got[w->got_count].queue = qi;
    w->got[w->got_count].seq = seq;
    w->got[w->got_count].delivered = delivered;
    w->got[w->got_count].size = size;
    w->got[w->got_count].blob_ok = memcmp(want, blob, size) == 0;
    w->got_count++;
    free(want);
}

static void on_definition(void *ctx, enum journal_def_kind kind, struct bytes key,
                          struct bytes value)
{
    struct world *w = ctx;
    CHECK(w, kind == JOURNAL_DEF_EXCHANGE && key.len == 1 && key.ptr[0] < DEF_KEYS);
    CHECK(w, value.len == 4);
    w->def_seen[key.ptr[0]] = (int)format_get_u32(value.ptr);
}

static struct msg *find_msg(struct model_queue *mq, uint64_t seq)
{
    for (size_t i = 0; i < mq->count; i++) {
        if (mq->msgs[i].seq == seq)
            return &mq->msgs[i];
    }
    return NULL;
}

static int life_now;
static void check_queues(struct world *w, int relaxed_queue)
{
    uint64_t last_seq[QUEUES] = {0};
    for (int qi = 0; qi < QUEUES; qi++) {
        for (size_t i = 0; i < w->queues[qi].count; i++)
            w->queues[qi].msgs[i].present = false;
    }
    for (size_t i = 0; i < w->got_count; i++) {
        int qi = w->got[i].queue;
        struct msg *m = find_msg(&w->queues[qi], w->got[i].seq);
        CHECK(w, w->got[i].seq > last_seq[qi]); /* seq order, no duplicates */
        last_seq[qi] = w->got[i].seq;
        CHECK(w, w->got[i].blob_ok);
        if (qi == relaxed_queue) {
            /* The flipped record may have been an ACK or a DELIVERED: cutting
             * it brings an acked message back or forgets a delivery, which
             * at-least-once allows. Nothing else may change. */
            CHECK(w, w->got[i].seq <= w->queues[qi].seq_last);
            if (m != NULL)
                m->present = true;
            continue;
        }
        if (m == NULL)
            printf("life %d unknown: queue %d seq %llu\n", life_now, qi,
                   (unsigned long long)w->got[i].seq);
        CHECK(w, m != NULL); /* never invented, never resurrected */
        CHECK(w, w->got[i].size == m->size);
        bool delivered_synced = m->delivered_durable ||
                                (m->delivered_ticket != 0 && m->delivered_ticket <= w->life_synced);
        CHECK(w, !delivered_synced || w->got[i].delivered);
        m->present = true;
    }
    for (int qi = 0; qi < QUEUES; qi++) {
        for (size_t i = 0; i < w->queues[qi].count; i++) {
            struct msg *m = &w->queues[qi].msgs[i];
            bool publish_synced =
                m->durable || (m->publish_ticket != 0 && m->publish_ticket <= w->life_synced);
            bool ack_synced = m->ack_ticket != 0 && m->ack_ticket <= w->life_synced;
            /* (The flipped queue's cut may have been an ACK: see above.) */
            if (ack_synced && qi != relaxed_queue)
                CHECK(w, !m->present); /* acked and synced: gone for good */
            else if (publish_synced && m->ack_ticket == 0 && qi != relaxed_queue) {
                if (!m->present)
                    printf("lost: queue %d seq %llu durable %d publish %llu ack %llu "
                            "synced %llu\n", qi, (unsigned long long)m->seq, m->durable,
                            (unsigned long long)m->publish_ticket,
                            (unsigned long long)m->ack_ticket, (unsigned long long)w->life_synced);
                CHECK(w, m->present); /* confirmed: never lost */
            }
        }
    }
}

static int compare_msg(const void *a, const void *b)
{
    uint64_t x = ((const struct msg *)a)->seq;
    uint64_t y = ((const struct msg *)b)->seq;
    return x < y ? -1 : x > y;
}

/* Recovered state becomes the model: what is present is durable now. */
static void rebase_model(struct world *w)
{
    for (int qi = 0; qi < QUEUES; qi++) {
        struct model_queue *mq = &w->queues[qi];
        size_t kept = 0;
        for (size_t i = 0; i < mq->count; i++) {
            struct msg m = mq->msgs[i];
            if (!m.present)
                continue;
            m.durable = true;
            m.publish_ticket = 0;
            m.ack_ticket = 0;
            m.delivered_durable = false;
            m.delivered_ticket = 0;
            for (size_t k = 0; k < w->got_count; k++) {
                if (w->got[k].queue == qi && w->got[k].seq == m.seq)
                    m.delivered_durable = w->got[k].delivered;
            }
            mq->msgs[kept++] = m;
        }
        mq->count = kept;
        for (size_t k = 0; k < w->got_count; k++) {
            if (w->got[k].queue != qi || find_msg(mq, w->got[k].seq) != NULL)
                continue;
            mq->msgs = realloc(mq->msgs, (mq->count + 1) * sizeof(*mq->msgs));
            struct msg *m = &mq->msgs[mq->count++];
            memset(m, 0, sizeof(*m));
            m->seq = w->got[k].seq;
            m->size = w->got[k].size;
            m->durable = true;
            m->delivered_durable = w->got[k].delivered;
        }
        qsort(mq->msgs, mq->count, sizeof(*mq->msgs), compare_msg);
    }
    for (int k = 0; k < DEF_KEYS; k++) {
        w->defs_count[k] = 1;
        w->defs[k][0] = (struct def_change){0, w->def_seen[k]};
    }
}

static void check_definitions(struct world *w)
{
    for (int k = 0; k < DEF_KEYS; k++) {
        /* Acceptable: the last synced state or any later one. */
        size_t first = 0;
        for (size_t i = 0; i < w->defs_count[k]; i++) {
            if (w->defs[k][i].ticket <= w->life_synced)
                first = i;
        }
        bool ok = false;
        for (size_t i = first; i < w->defs_count[k]; i++)
            ok = ok || w->defs[k][i].value == w->def_seen[k];
        CHECK(w, ok);
    }
}

static void do_ops(struct world *w, int count)
{
    for (int n = 0; n < count; n++) {
        struct model_queue *mq = &w->queues[below(w, QUEUES)];
        uint64_t r = below(w, 100);
        if (r < 45) {
            uint32_t size = (uint32_t)below(w, 700);
            uint8_t blob[700];
            fill(blob, size, (int)(mq - w->queues), mq->seq_last + 1);
            mq->msgs = realloc(mq->msgs, (mq->count + 1) * sizeof(*mq->msgs));
            struct msg *m = &mq->msgs[mq->count++];
            memset(m, 0, sizeof(*m));
            m->seq = ++mq->seq_last;
            m->size = size;
            m->publish_ticket = journal_publish(mq->q, m->seq, blob, size);
        } else if (r < 80 && mq->count > 0) {
            struct msg *m = &mq->msgs[below(w, mq->count)];
            if (m->ack_ticket == 0)
                m->ack_ticket = journal_ack(mq->q, m->seq);
        } else if (r < 90 && mq->count > 0) {
            struct msg *m = &mq->msgs[below(w, mq->count)];
            if (m->ack_ticket == 0 && m->delivered_ticket == 0 && !m->delivered_durable)
                m->delivered_ticket = journal_delivered(mq->q, m->seq);
        } else if (r < 91 && mq->count > 0) {
            uint64_t below_seq = mq->msgs[below(w, mq->count)].seq;
            uint64_t t = journal_purge(mq->q, below_seq);
            for (size_t i = 0; i < mq->count; i++) {
                if (mq->msgs[i].seq < below_seq && mq->msgs[i].ack_ticket == 0)
                    mq->msgs[i].ack_ticket = t;
            }
        } else if (r < 93 && mq->count > 0) {
            /* A purge's run: every message of it not acked yet goes. */
            uint64_t a = mq->msgs[below(w, mq->count)].seq;
            uint64_t b = mq->msgs[below(w, mq->count)].seq;
            uint64_t first = a < b ? a : b, last = a < b ? b : a;
            uint64_t t = journal_ack_range(mq->q, first, last);
            for (size_t i = 0; i < mq->count; i++) {
                struct msg *m = &mq->msgs[i];
                if (m->seq >= first && m->seq <= last && m->ack_ticket == 0)
                    m->ack_ticket = t;
            }
        } else if (r < 97) {
            int k = (int)below(w, DEF_KEYS);
            uint8_t key = (uint8_t)k;
            int value = below(w, 4) == 0 ? -1 : (int)below(w, 1000);
            uint8_t v[4];
            format_put_u32(v, (uint32_t)value);
            uint64_t t = value < 0
                             ? journal_undefine(w->j, JOURNAL_DEF_EXCHANGE, (struct bytes){&key, 1})
                             : journal_define(w->j, JOURNAL_DEF_EXCHANGE,
                                              (struct bytes){&key, 1}, (struct bytes){v, 4});
            w->defs[k] = realloc(w->defs[k], (w->defs_count[k] + 1) * sizeof(**w->defs));
            w->defs[k][w->defs_count[k]++] = (struct def_change){t, value};
        } else {
            uv_run(&w->loop, UV_RUN_NOWAIT); /* collect synced tickets */
        }
    }
}

struct record_pos {
    char path[256];
    uint64_t offset;
    bool tail; /* the last valid record of a queue's last segment */
    int queue;
};

/* Lists every valid record of every segment, as an independent reader. */
static struct record_pos *list_records(struct world *w, size_t *count)
{
    struct record_pos *out = NULL;
    *count = 0;
    for (int qi = 0; qi < QUEUES; qi++) {
        size_t files_count = 0;
        char **files = disk_fault_list_files(w->disk, ".seg", &files_count);
        char prefix[128];
        struct bytes name = bytes_of_cstr(w->queues[qi].name);
        snprintf(prefix, sizeof(prefix), DIR "/queues/%016llx/",
                 (unsigned long long)format_queue_id((const uint8_t *)"v", 1, name.ptr,
                                                     name.len));
        char *last_file = NULL;
        for (size_t f = 0; f < files_count; f++) {
            if (strncmp(files[f], prefix, strlen(prefix)) == 0)
                last_file = files[f];
        }
        for (size_t f = 0; f < files_count; f++) {
            if (strncmp(files[f], prefix, strlen(prefix)) != 0)
                continue;
            size_t size = 0;
            uint8_t *data = disk_fault_read_file(w->disk, files[f], &size);
            uint64_t off = FORMAT_FILE_HEADER_SIZE;
            size_t first = *count;
            while (off < size) {
                struct format_record_header h;
                uint64_t rs;
                if (format_record_check(data + off, size - off, &h, &rs) != FORMAT_CHECK_OK)
                    break;
                out = realloc(out, (*count + 1) * sizeof(*out));
                snprintf(out[*count].path, sizeof(out[*count].path), "%s", files[f]);
                out[*count].offset = off;
                out[*count].tail = false;
                out[*count].queue = qi;
                (*count)++;
                off += rs;
            }
            if (files[f] == last_file && *count > first)
                out[*count - 1].tail = true;
            free(data);
        }
        for (size_t f = 0; f < files_count; f++)
            free(files[f]);
        free(files);
    }
    return out;
}

static int open_and_recover(struct world *w, struct journal_recovery_stats *stats)
{
    char err[256];
    w->synced = 0;
    int rc = journal_open(&w->j, &w->loop, DIR, &w->opts, err, sizeof(err));
    CHECK(w, rc == OK);
    journal_set_synced_callback(w->j, on_synced, w);
    w->got_count = 0;
    for (int k = 0; k < DEF_KEYS; k++)
        w->def_seen[k] = -1;
    journal_recover_definitions(w->j, on_definition, w);
    return journal_recover(w->j, on_recover, w, stats);
}

static void close_journal(struct world *w)
{
    journal_close(w->j);
    w->j = NULL;
    uv_run(&w->loop, UV_RUN_DEFAULT);
}

/* One round: a fresh disk and a few lives on it. Returns after a middle
 * flip, which ends the round (the journal refuses to start, as it should). */
static void run_round(uint64_t seed)
{
    struct world w0 = {0};
    struct world *w = &w0;
    w->seed = seed;
    w->rng = seed;
    uv_loop_init(&w->loop);
    w->disk = disk_fault_new(seed);
    uint64_t sizes[] = {1024, 2048, 4096, 16384};
    w->opts.disk = disk_fault_ops(w->disk);
    w->opts.segment_size_max = sizes[below(w, 4)];
    /* Half the rounds compact in small slices (several a segment). */
    w->opts.compact_slice_bytes = below(w, 2) ? 0 : 128 + (uint32_t)below(w, 1024);
    w->opts.definitions_compact_size = 512;
    for (int qi = 0; qi < QUEUES; qi++)
        snprintf(w->queues[qi].name, sizeof(w->queues[qi].name), "q%d", qi);
    for (int k = 0; k < DEF_KEYS; k++) {
        w->defs[k] = calloc(1, sizeof(**w->defs));
        w->defs[k][0] = (struct def_change){0, -1};
        w->defs_count[k] = 1;
    }
    struct journal_recovery_stats stats;
    CHECK(w, open_and_recover(w, &stats) == OK);
    for (int life = 0; life < LIVES; life++) {
        for (int qi = 0; qi < QUEUES; qi++) {
            struct model_queue *mq = &w->queues[qi];
            mq->q = journal_queue_open(w->j, BYTES_LIT("v"), bytes_of_cstr(mq->name));
            if (journal_queue_seq_last(mq->q) > mq->seq_last)
                mq->seq_last = journal_queue_seq_last(mq->q);
        }
        do_ops(w, 50 + (int)below(w, 400));
        bool tear = below(w, 2) == 0;
        disk_fault_crash(w->disk, tear);
        close_journal(w); /* the thread sees EIO from now on; synced stays as reported */
        w->life_synced = w->synced;
        disk_fault_restart(w->disk);

        int flip = (int)below(w, 6); /* 0: tail flip, 1: middle flip, else none */
        size_t records_count = 0;
        struct record_pos *records = flip <= 1 ? list_records(w, &records_count) : NULL;
        struct record_pos *target = NULL;
        for (size_t tries = 0; records_count > 0 && tries < 20 && target == NULL; tries++) {
            struct record_pos *p = &records[below(w, records_count)];
            if (p->tail == (flip == 0))
                target = p;
        }
        if (target != NULL) {
            uint64_t offset = target->offset + below(w, FORMAT_RECORD_HEADER_SIZE + 8);
            CHECK(w, disk_fault_flip_bit(w->disk, target->path, offset,
                                         (unsigned)below(w, 8)) == 0);
        }
        life_now = life;
        int rc = open_and_recover(w, &stats);
        if (target != NULL && flip == 1) {
            CHECK(w, rc == E_JOURNAL_CORRUPT);
            CHECK(w, strcmp(stats.corrupt_path, target->path) == 0);
            CHECK(w, stats.corrupt_offset == target->offset);
            free(records);
            close_journal(w);
            break;
        }
        CHECK(w, rc == OK);
        if (target != NULL)
            CHECK(w, stats.truncated_count >= 1);
        check_queues(w, target != NULL ? target->queue : -1);
        check_definitions(w);
        rebase_model(w);
        free(records);
        if (life == LIVES - 1)
            close_journal(w);
    }
    for (int qi = 0; qi < QUEUES; qi++)
        free(w->queues[qi].msgs);
    for (int k = 0; k < DEF_KEYS; k++)
        free(w->defs[k]);
    free(w->got);
    disk_fault_free(w->disk);
    uv_loop_close(&w->loop);
}

static void test_crash_rounds(void **state)
{
    const char *env_rounds = getenv("QUAY_CRASH_ROUNDS");
    const char *env_seed = getenv("QUAY_CRASH_SEED");
    uint64_t rounds = env_rounds ? strtoull(env_rounds, NULL, 10) : 2000;
    uint64_t seed = env_seed ? strtoull(env_seed, NULL, 10) : 20240601;
    /* Every crash makes the journal log its I/O errors: expected, so quiet
     * unless asked; failures are printed to stdout. */
    if (getenv("QUAY_CRASH_LOG") == NULL)
        freopen("/dev/null", "w", stderr);
    for (uint64_t i = 0; i < rounds; i++)
        run_round(seed + i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crash_rounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
