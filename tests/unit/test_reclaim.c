/*
 * test_reclaim.c: many messages let go of in slices (broker/reclaim.h).
 *
 * Goal: a deep ring handed over is emptied RECLAIM_SLICE_MESSAGES a timer
 * expiry (at most one a loop turn), oldest ring first, not in the turn
 * that hands it over; paged entries and holes are skipped (they hold no
 * reference); a small ring goes at once; once stopped, rings go at once
 * and reclaim_free empties what was waiting; a replica reset and a
 * replica free go this way. Method: messages counted by
 * message_live_count, the loop run one turn at a time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <uv.h>

#include "amqp/method_gen.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/reclaim.h"
#include "cluster/replica.h"
#include "lib/alloc.h"

static struct message *make(void)
{
    struct basic_properties none = {0};
    static const uint8_t no_properties[2] = {0, 0};
    struct message *m =
        message_new(BYTES_LIT("x"), BYTES_LIT("k"), no_properties, 2, &none, 100);
    m->body_received = 100;
    return m;
}

/* A ring of n entries (cap a power of two, wrapped: head near the end),
 * every tenth a hole and every tenth (offset 5) paged: 8 in 10 hold a
 * message. */
static struct queue_ring ring_of(uint32_t n)
{
    uint32_t cap = 1;
    while (cap < n)
        cap *= 2;
    struct queue_ring r = {.entries = xcalloc(cap, sizeof(struct queue_entry)),
                           .head = cap - 7, .count = n, .cap = cap};
    for (uint32_t i = 0; i < n; i++) {
        struct queue_entry *e = &r.entries[(r.head + i) & (cap - 1)];
        e->seq = i + 1;
        if (i % 10 == 5) {
            e->paged = 1;
            e->paged_body_size = 100;
        } else if (i % 10 != 0) {
            e->message = make();
        }
    }
    return r;
}

/* The messages ring_of(n) holds. */
static uint64_t held_by(uint32_t n)
{
    uint64_t held = 0;
    for (uint32_t i = 0; i < n; i++)
        held += i % 10 != 0 && i % 10 != 5;
    return held;
}

/* One turn that does not wait (a timer not yet due does not run). */
static void one_turn(uv_loop_t *loop)
{
    uv_run(loop, UV_RUN_NOWAIT);
}

/* A loop and the reclaim on it; the end stops it (if the test did not),
 * empties it and closes the loop. */
struct fixture {
    uv_loop_t loop;
    struct reclaim rc;
};

static void begin(struct fixture *f)
{
    uv_loop_init(&f->loop);
    reclaim_init(&f->rc, &f->loop);
}

static void end(struct fixture *f)
{
    reclaim_stop(&f->rc);
    reclaim_free(&f->rc);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&f->loop), 0);
}

static void a_deep_ring_goes_a_slice_a_tick(void **state)
{
    (void)state;
    struct fixture f;
    begin(&f);
    uint64_t before = message_live_count;
    uint32_t n = 3 * RECLAIM_SLICE_MESSAGES + 100; /* 4 slices */
    struct queue_ring a = ring_of(n), b = ring_of(100);
    uint64_t held = message_live_count - before;
    assert_int_equal(held, held_by(n) + held_by(100));
    reclaim_ring(&f.rc, &a);
    assert_null(a.entries);
    assert_int_equal(a.count, 0);
    assert_int_equal(message_live_count - before, held); /* nothing yet */
    reclaim_ring(&f.rc, &b); /* small: at once */
    assert_int_equal(message_live_count - before, held - 80);
    /* Turns without the timer due drop nothing (the loop could sleep). */
    uint32_t slices = 0;
    while (message_live_count > before) {
        uint64_t live = message_live_count;
        one_turn(&f.loop);
        assert_true(live - message_live_count <= RECLAIM_SLICE_MESSAGES);
        slices += message_live_count < live;
        assert_true(slices <= 4);
    }
    assert_int_equal(slices, 4);
    assert_true(list_empty(&f.rc.rings));
    assert_false(uv_is_active((uv_handle_t *)f.rc.timer)); /* nothing left: it stopped */
    end(&f);
}

static void stopped_it_lets_go_at_once(void **state)
{
    (void)state;
    struct fixture f;
    begin(&f);
    uint64_t before = message_live_count;
    struct queue_ring a = ring_of(2 * RECLAIM_SLICE_MESSAGES);
    reclaim_ring(&f.rc, &a); /* waits for the loop */
    assert_true(message_live_count > before);
    reclaim_stop(&f.rc);
    struct queue_ring b = ring_of(2 * RECLAIM_SLICE_MESSAGES);
    uint64_t waiting = message_live_count;
    reclaim_ring(&f.rc, &b); /* stopped: at once */
    assert_true(message_live_count < waiting);
    reclaim_free(&f.rc); /* what waited */
    assert_int_equal(message_live_count, before);
    end(&f);
}

/* A replica's reset (a catch-up starting over) and its free hand their
 * messages to the reclaim; it takes new ones meanwhile. */
static void a_replica_lets_go_through_it(void **state)
{
    (void)state;
    struct fixture f;
    begin(&f);
    uint64_t before = message_live_count;
    struct replica *r = replica_new(-1, NULL, &f.rc);
    uint32_t n = 2 * RECLAIM_SLICE_MESSAGES + 1;
    for (uint64_t seq = 1; seq <= n; seq++) {
        struct message *m = make();
        assert_true(replica_push(r, 1, seq, m, 0, false));
        message_unref(m);
    }
    replica_remove(r, 0);
    assert_int_equal(replica_count(r), 0);
    assert_int_equal(message_live_count - before, n); /* still held, by the reclaim */
    struct message *m = make();
    assert_true(replica_push(r, 2, 1, m, 0, false)); /* the catch-up goes on */
    message_unref(m);
    assert_int_equal(replica_count(r), 1);
    replica_free(r); /* one message: at once */
    assert_int_equal(message_live_count - before, n);
    while (message_live_count > before)
        one_turn(&f.loop);
    end(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_deep_ring_goes_a_slice_a_tick),
        cmocka_unit_test(stopped_it_lets_go_at_once),
        cmocka_unit_test(a_replica_lets_go_through_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
