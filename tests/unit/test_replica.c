/*
 * test_replica.c: a backup's copy of a queue (cluster/replica.h) keeps the
 * primary's messages in seq order, forgets removed ones in any order,
 * ignores resends (refuses a seq it has under another epoch), clears on purge (a
 * reset keeps the map version its stream names), and holds exactly one reference per
 * message it keeps (message_live_count tells). Of a durable queue it logs
 * the persistent messages it keeps, and nothing else, in a real journal
 * (a temporary directory): what a restart would read back is exactly them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "amqp/method_gen.h"
#include "broker/message.h"
#include "cluster/replica.h"
#include "lib/errors.h"
#include "store/journal.h"

static struct message *make_mode(uint32_t n, bool persistent)
{
    struct basic_properties props = {0};
    if (persistent) {
        props.flags = BASIC_FLAG_DELIVERY_MODE;
        props.delivery_mode = 2;
    }
    uint8_t encoded[16];
    size_t size = basic_properties_encode(&props, encoded, sizeof encoded);
    assert_true(size > 0);
    struct message *m = message_new(BYTES_LIT("x"), BYTES_LIT("k"), encoded, (uint32_t)size,
                                    &props, sizeof n);
    memcpy(m->body, &n, sizeof n);
    m->body_received = sizeof n;
    return m;
}

static struct message *make(uint32_t n)
{
    return make_mode(n, false);
}

/* Pushes seqs from..to (one message each; the replica keeps the only
 * reference). */
static void push_range(struct replica *r, uint64_t from, uint64_t to)
{
    for (uint64_t seq = from; seq <= to; seq++) {
        struct message *m = make((uint32_t)seq);
        assert_true(replica_push(r, 1, seq, m, 0, false));
        message_unref(m);
    }
}

/* A verify message (replica.h): taken only when the replica holds the
 * very seqs it names, whatever the order they were pushed and removed in. */
static bool push_verify(struct replica *r, const struct replica_digest *d)
{
    struct basic_properties none = {0};
    static const uint8_t no_properties[2] = {0, 0};
    struct message *m = message_new(BYTES_LIT(""), BYTES_LIT(""), no_properties, 2, &none,
                                    REPLICA_VERIFY_SIZE);
    replica_verify_encode(d, m->body);
    m->body_received = REPLICA_VERIFY_SIZE;
    bool taken = replica_push(r, 1, 0, m, 0, false);
    message_unref(m);
    return taken;
}

static void test_a_verify_is_taken_only_by_the_same_content(void **state)
{
    (void)state;
    struct replica *r = replica_new(0, NULL, NULL);
    push_range(r, 1, 5);
    replica_remove(r, 3);
    struct replica_digest want = {0, 0};
    uint64_t held[] = {5, 1, 4, 2}; /* any order */
    for (int i = 0; i < 4; i++)
        replica_digest_add(&want, held[i]);
    struct replica_digest got = replica_digest_of(r);
    assert_int_equal(got.count, 4);
    assert_true(got.sum == want.sum);
    assert_true(push_verify(r, &want));
    /* The primary holds 3 still (our copy got a settle it did not), or
     * lacks 5 (a push reached us only): refused either way. */
    struct replica_digest more = want, fewer = {0, 0};
    replica_digest_add(&more, 3);
    for (int i = 1; i < 4; i++)
        replica_digest_add(&fewer, held[i]);
    assert_false(push_verify(r, &more));
    assert_false(push_verify(r, &fewer));
    /* Same count, another seq: the sum tells. */
    struct replica_digest other = fewer;
    replica_digest_add(&other, 6);
    assert_int_equal(other.count, want.count);
    assert_false(push_verify(r, &other));
    assert_int_equal(replica_count(r), 4); /* a verify is not a message */
    replica_free(r);
    /* An empty replica (a backup of a queue that holds nothing). */
    struct replica *e = replica_new(0, NULL, NULL);
    struct replica_digest empty = {0, 0};
    assert_true(push_verify(e, &empty));
    assert_false(push_verify(e, &want));
    replica_free(e);
}

static void test_push_remove_in_any_order(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1, NULL, NULL);
    push_range(r, 1, 1000);
    assert_int_equal(replica_count(r), 1000);
    assert_int_equal(message_live_count - live_before, 1000);
    /* Acks come back in any order: every other one, then the rest from the top. */
    for (uint64_t seq = 2; seq <= 1000; seq += 2)
        replica_remove(r, seq);
    assert_int_equal(replica_count(r), 500);
    for (uint64_t seq = 999; seq >= 1 && seq <= 999; seq -= 2)
        replica_remove(r, seq);
    assert_int_equal(replica_count(r), 0);
    assert_int_equal(message_live_count, live_before);
    /* Removing what is not there (twice, or never pushed) changes nothing. */
    replica_remove(r, 5);
    replica_remove(r, 123456);
    /* The ring grows past its first capacity and wraps after removals. */
    push_range(r, 1001, 1100);
    for (uint64_t seq = 1001; seq <= 1050; seq++)
        replica_remove(r, seq);
    push_range(r, 1101, 1300);
    assert_int_equal(replica_count(r), 250);
    replica_free(r);
    assert_int_equal(message_live_count, live_before);
}

static void test_resends_are_ignored(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1, NULL, NULL);
    push_range(r, 1, 10);
    /* After a reconnect the primary may send some again. */
    push_range(r, 5, 12);
    assert_int_equal(replica_count(r), 12);
    replica_remove(r, 3);
    push_range(r, 3, 3); /* a removed one sent again stays removed */
    assert_int_equal(replica_count(r), 11);
    replica_free(r);
    assert_int_equal(message_live_count, live_before);
}

/* A new primary whose seqs start below ours (it was caught up from a reset,
 * or held nothing and has no log, when it was promoted): its messages are
 * not the ones we have under those seqs. Acking them would confirm what we
 * do not hold (tests/sim found it: seed 12, queue q35); refused, so the
 * primary catches us up again. */
static void test_a_colliding_seq_from_another_epoch_is_refused(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1, NULL, NULL);
    push_range(r, 1, 10); /* (epoch 1) */
    struct message *m = make(99);
    assert_false(replica_push(r, 2, 5, m, 0, false));
    assert_false(replica_push(r, 2, 10, m, 0, false));
    assert_int_equal(replica_count(r), 10);
    assert_true(replica_push(r, 1, 7, m, 0, false)); /* the same epoch: a resend */
    assert_true(replica_push(r, 2, 11, m, 0, false)); /* past ours: taken */
    assert_false(replica_push(r, 1, 11, m, 0, false)); /* the old epoch now collides */
    assert_int_equal(replica_count(r), 11);
    replica_remove(r, 0); /* a reset: whatever comes next is taken */
    assert_true(replica_push(r, 3, 1, m, 0, false));
    assert_int_equal(replica_count(r), 1);
    message_unref(m);
    replica_free(r);
    assert_int_equal(message_live_count, live_before);
}

static void test_purge(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1, NULL, NULL);
    push_range(r, 1, 100);
    replica_remove(r, 0); /* purge */
    assert_int_equal(replica_count(r), 0);
    assert_int_equal(message_live_count, live_before);
    push_range(r, 101, 110); /* the stream goes on after a purge */
    assert_int_equal(replica_count(r), 10);
    replica_free(r);
    replica_free(NULL);
    assert_int_equal(message_live_count, live_before);
}

/* A purge's run: every seq of it the copy holds goes (holes, seqs never
 * pushed and ones removed before are skipped), the rest stays in order;
 * a run at the tail leaves no slot behind, so pushes go on after it. */
static void test_remove_runs(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1, NULL, NULL);
    push_range(r, 1, 100);
    replica_remove(r, 50);
    replica_remove_run(r, 40, 60); /* (50 went already) */
    assert_int_equal(replica_count(r), 79);
    replica_remove_run(r, 95, 1000); /* past the newest */
    assert_int_equal(replica_count(r), 73);
    replica_remove_run(r, 7, 7);
    replica_remove_run(r, 200, 300); /* none of it held */
    assert_int_equal(replica_count(r), 72);
    assert_int_equal(message_live_count - live_before, 72);
    push_range(r, 101, 110);
    struct replica_digest want = {0, 0};
    for (uint64_t seq = 1; seq <= 110; seq++) {
        if (seq != 7 && !(seq >= 40 && seq <= 60) && !(seq >= 95 && seq <= 100))
            replica_digest_add(&want, seq);
    }
    assert_true(push_verify(r, &want));
    replica_remove_run(r, 1, 110); /* all of it, holes and all */
    assert_int_equal(replica_count(r), 0);
    assert_int_equal(replica_bytes(r), 0);
    assert_int_equal(message_live_count, live_before);
    push_range(r, 111, 112);
    assert_int_equal(replica_count(r), 2);
    /* A long run to the tail: the ring goes whole, what is before it stays
     * (its counts are what stays: nothing of the run is read). */
    push_range(r, 113, 5000);
    replica_remove(r, 115);
    replica_remove_run(r, 120, 6000);
    assert_int_equal(replica_count(r), 8); /* 111..119 but 115 */
    assert_int_equal(replica_bytes(r), 8 * sizeof(uint32_t));
    assert_int_equal(message_live_count - live_before, 8);
    push_range(r, 5001, 5002);
    want = (struct replica_digest){0, 0};
    for (uint64_t seq = 111; seq <= 5002; seq++) {
        if ((seq <= 119 && seq != 115) || seq > 5000)
            replica_digest_add(&want, seq);
    }
    assert_true(push_verify(r, &want));
    replica_free(r);
    assert_int_equal(message_live_count, live_before);
}

/* A catch-up's reset empties the copy, as a purge, and the copy keeps
 * the map version its primary named (fence_replica_kept reads it) until
 * the next reset; pushes do not change it. */
static void test_a_reset_remembers_the_streams_map_version(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    assert_int_equal(replica_stream_version(NULL), 0);
    assert_int_equal(replica_bytes(NULL), 0);
    struct replica *r = replica_new(-1, NULL, NULL);
    assert_int_equal(replica_stream_version(r), 0); /* (none yet: a primary from before) */
    push_range(r, 1, 10);
    assert_int_equal(replica_bytes(r), 10 * sizeof(uint32_t));
    replica_reset(r, 42);
    assert_int_equal(replica_count(r), 0);
    assert_int_equal(replica_bytes(r), 0);
    assert_int_equal(message_live_count, live_before);
    assert_int_equal(replica_stream_version(r), 42);
    push_range(r, 1, 5); /* the catch-up starts from the primary's oldest */
    assert_int_equal(replica_count(r), 5);
    assert_int_equal(replica_stream_version(r), 42);
    replica_reset(r, 0); /* a primary from before names none */
    assert_int_equal(replica_stream_version(r), 0);
    replica_free(r);
    assert_int_equal(message_live_count, live_before);
}

/* ---- the log of a durable queue's replica ---- */

struct recovered {
    uint64_t seqs[64];
    uint32_t count;
};

static void on_recover(void *ctx, struct journal_queue *q, struct bytes vhost,
                       struct bytes queue, uint64_t seq, bool delivered, const void *blob,
                       uint32_t size)
{
    (void)q, (void)vhost, (void)queue, (void)delivered, (void)blob, (void)size;
    struct recovered *r = ctx;
    assert_true(r->count < 64);
    r->seqs[r->count++] = seq;
}

static struct journal *journal_at(uv_loop_t *loop, const char *dir, struct recovered *out)
{
    struct journal *j = NULL;
    char err[256];
    assert_int_equal(journal_open(&j, loop, dir, NULL, err, sizeof err), OK);
    struct journal_recovery_stats stats;
    struct recovered none = {0};
    assert_int_equal(journal_recover(j, on_recover, out ? out : &none, &stats), OK);
    return j;
}

static void journal_done(uv_loop_t *loop, struct journal *j)
{
    journal_close(j);
    uv_run(loop, UV_RUN_DEFAULT);
}

static void push_mode(struct replica *r, uint64_t seq, bool persistent)
{
    struct message *m = make_mode((uint32_t)seq, persistent);
    assert_true(replica_push(r, 1, seq, m, 0, false));
    message_unref(m);
}

/* Paged (a lazy queue's): in the log only, no message kept in memory. */
static void push_paged(struct replica *r, uint64_t seq)
{
    uint64_t live_before = message_live_count;
    struct message *m = make_mode((uint32_t)seq, true);
    assert_true(replica_push(r, 1, seq, m, 0, true));
    message_unref(m);
    assert_int_equal(message_live_count, live_before);
}

static void test_a_durable_replica_logs_its_persistent_messages(void **state)
{
    (void)state;
    char dir[] = "/tmp/quay-test-replica-XXXXXX";
    assert_non_null(mkdtemp(dir));
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct journal *j = journal_at(&loop, dir, NULL);
    /* A log left from another life of the name is started over. */
    struct journal_queue *old = journal_queue_open(j, BYTES_LIT("/"), BYTES_LIT("q"));
    journal_publish(old, 100, "old", 3);
    struct replica *r = replica_new(-1, old, NULL);
    push_mode(r, 1, true);
    push_mode(r, 2, false); /* transient: memory only */
    push_mode(r, 3, true);
    /* A reset (a catch-up) starts the log over: seqs may go back. */
    replica_remove(r, 0);
    for (uint64_t seq = 2; seq <= 9; seq++)
        push_mode(r, seq, seq % 2 == 0);
    replica_remove(r, 4);
    replica_remove(r, 5);
    push_paged(r, 10);
    push_paged(r, 11);
    replica_remove(r, 10);
    push_mode(r, 12, true);
    push_mode(r, 13, false);
    push_paged(r, 14);
    push_mode(r, 15, true);
    replica_remove_run(r, 12, 14); /* a purge's run: its log entries go too */
    for (uint64_t seq = 16; seq <= 2100; seq++)
        push_mode(r, seq, seq % 3 != 0);
    replica_remove_run(r, 16, 2100); /* one to the tail: the ring goes whole */
    struct journal_queue *log = journal_queue_open(j, BYTES_LIT("/"), BYTES_LIT("q"));
    assert_int_equal(journal_queue_live_count(log), 5); /* 2, 6, 8, 11, 15 */
    assert_int_equal(replica_count(r), 8);
    /* A shutdown: the log stays on disk as it is. */
    replica_forget_log(r);
    journal_done(&loop, j);
    replica_free(r);
    struct recovered got = {0};
    j = journal_at(&loop, dir, &got);
    assert_int_equal(got.count, 5);
    assert_int_equal(got.seqs[0], 2);
    assert_int_equal(got.seqs[1], 6);
    assert_int_equal(got.seqs[2], 8);
    assert_int_equal(got.seqs[3], 11);
    assert_int_equal(got.seqs[4], 15);
    /* Freed (the queue deleted, or no longer ours to back up): gone. */
    r = replica_new(-1, journal_queue_open(j, BYTES_LIT("/"), BYTES_LIT("q")), NULL);
    push_mode(r, 1, true);
    replica_free(r);
    journal_done(&loop, j);
    got.count = 0;
    j = journal_at(&loop, dir, &got);
    assert_int_equal(got.count, 0);
    journal_done(&loop, j);
    uv_loop_close(&loop);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_remove_in_any_order),
        cmocka_unit_test(test_a_verify_is_taken_only_by_the_same_content),
        cmocka_unit_test(test_resends_are_ignored),
        cmocka_unit_test(test_a_colliding_seq_from_another_epoch_is_refused),
        cmocka_unit_test(test_purge),
        cmocka_unit_test(test_remove_runs),
        cmocka_unit_test(test_a_reset_remembers_the_streams_map_version),
        cmocka_unit_test(test_a_durable_replica_logs_its_persistent_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
