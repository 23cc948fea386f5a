/*
 * test_rates_active.c: the broker's active lists of rates owners (rates.h,
 * broker.c broker_sample_rates): a round samples only the queues whose
 * values moved.
 *
 * Goal: a queue that stood still for a window leaves its list and reads
 * 0.0; when it moves again it joins, and its first new window reads the
 * change since it went still over the window's clock (a burst of N after a
 * long pause reads N / 5 s: no spike, no negative rate, not 0.0); a late
 * ack brings a still queue back; a queue
 * deleted while on its list leaves it (ASan: no dangling pointer) and
 * leaves the totals; the totals of the queues' counts stay exact with
 * thousands of idle queues that are never walked.
 *
 * Method: a broker struct with one vhost on a real libuv loop (as
 * test_queue.c), queues fed with queue_publish and emptied with
 * queue_purge, and broker_sample_rates driven by hand with loop times 250
 * ms apart (a round is four calls, one second). This build is sanitized,
 * so every round also runs broker.c's check_idle_queues: each queue off
 * its list must hold its newest sample, and the totals must be the sums.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "amqp/method_gen.h"
#include "bare_broker.h"
#include "broker/broker.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"

static struct broker broker;
static struct vhost *vhost;
static uint64_t now_ms;

static int setup(void **state)
{
    (void)state;
    bare_broker_init(&broker);
    vhost = vhost_new(&broker, BYTES_LIT("/"));
    hmap_put(&broker.vhosts, vhost->name, vhost);
    now_ms = 1000;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    vhost_free(vhost);
    hmap_free(&broker.vhosts);
    uv_run(broker.loop, UV_RUN_NOWAIT); /* let closed timers go */
    assert_int_equal(message_live_count, 0);
    for (uint32_t i = 0; i < BROKER_RATES_PARTS; i++)
        assert_int_equal(broker.queues_active[i].count, 0);
    rates_free(&broker.rates);
    rates_free(&broker.totals_rates);
    return 0;
}

/* One second: a round of four parts. */
static void round_of_samples(void)
{
    for (uint32_t part = 0; part < BROKER_RATES_PARTS; part++) {
        broker_sample_rates(&broker, now_ms);
        now_ms += 250;
    }
}

static void rounds(uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        round_of_samples();
}

static struct queue *declare(const char *name)
{
    return vhost_queue_declare(vhost, bytes_of_cstr(name), false, false, false, BYTES_LIT(""));
}

static void publish(struct queue *q, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        struct basic_properties props = {0};
        uint8_t buf[16];
        size_t size = basic_properties_encode(&props, buf, sizeof buf);
        struct message *m = message_new(BYTES_LIT(""), BYTES_LIT("k"), buf, (uint32_t)size,
                                        &props, 1);
        m->body[0] = 'x';
        m->body_received = 1;
        assert_int_equal(queue_publish(q, m, NULL), QUEUE_PUBLISH_OK);
        message_unref(m);
    }
}

static double rate(const struct queue *q, enum queue_rate index)
{
    return rates_per_s(&q->rates, &broker.rates_clock, index);
}

static uint32_t active_count(void)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < BROKER_RATES_PARTS; i++)
        n += broker.queues_active[i].count;
    return n;
}

/* New queues are sampled once (their baseline) and leave; one that moves
 * joins, and leaves again once its window is flat, reading 0.0. */
static void still_queue_leaves_and_reads_zero(void **state)
{
    (void)state;
    struct queue *q = declare("q");
    assert_true(rates_listed(&q->rates)); /* for its first sample */
    round_of_samples();
    assert_false(rates_listed(&q->rates));
    assert_int_equal(active_count(), 0);
    for (uint32_t s = 0; s < 3; s++) {
        publish(q, 10);
        assert_true(rates_listed(&q->rates));
        round_of_samples();
    }
    /* 30 over the 3 s since its first sample */
    assert_true(rate(q, QUEUE_RATE_PUBLISH) == 10.0);
    assert_true(rate(q, QUEUE_RATE_READY) == 10.0);
    rounds(4);
    assert_true(rates_listed(&q->rates)); /* the window still holds a change */
    round_of_samples();
    assert_false(rates_listed(&q->rates));
    assert_int_equal(active_count(), 0);
    assert_null(q->rates.ring);
    assert_true(rate(q, QUEUE_RATE_PUBLISH) == 0.0);
    assert_true(rate(q, QUEUE_RATE_READY) == 0.0);
    queue_purge(q);
}

/* Off its list for 20 s, then 50 in one second: its first new window is
 * the change since it went still, per second of the window: 10.0, for as
 * long as the window holds the change; then 0.0, and off the list. */
static void comes_back_with_its_first_window(void **state)
{
    (void)state;
    struct queue *q = declare("q");
    rounds(20);
    assert_false(rates_listed(&q->rates));
    publish(q, 50);
    round_of_samples();
    assert_true(rate(q, QUEUE_RATE_PUBLISH) == 10.0);
    assert_true(rate(q, QUEUE_RATE_MESSAGES) == 10.0);
    assert_true(rate(q, QUEUE_RATE_UNACKED) == 0.0);
    rounds(4);
    assert_true(rate(q, QUEUE_RATE_PUBLISH) == 10.0);
    round_of_samples(); /* the change slid out of the window */
    assert_true(rate(q, QUEUE_RATE_PUBLISH) == 0.0);
    assert_false(rates_listed(&q->rates));
    assert_int_equal(broker.rates_totals[BROKER_TOTALS_RATE_READY], 50);
    queue_purge(q);
}

/* Steady traffic, an hour still, then a burst of 1000: 200.0 (1000 over
 * the 5 s window), neither 1000.0 (over one second) nor negative; the
 * purge that follows reads as a fall only of what the window held. */
static void burst_after_a_long_pause(void **state)
{
    (void)state;
    struct queue *q = declare("q");
    for (uint32_t s = 0; s < 8; s++) {
        publish(q, 4);
        round_of_samples();
    }
    assert_true(rate(q, QUEUE_RATE_PUBLISH) == 4.0);
    queue_purge(q);
    rounds(3600);
    assert_false(rates_listed(&q->rates));
    assert_true(rate(q, QUEUE_RATE_READY) == 0.0);
    publish(q, 1000);
    round_of_samples();
    assert_true(rate(q, QUEUE_RATE_PUBLISH) == 200.0);
    assert_true(rate(q, QUEUE_RATE_READY) == 200.0);
    queue_purge(q);
    round_of_samples();
    assert_true(rate(q, QUEUE_RATE_PUBLISH) == 200.0);
    assert_true(rate(q, QUEUE_RATE_READY) == 0.0); /* back where the window began */
    rounds(5);
    assert_false(rates_listed(&q->rates));
}

/* An ack long after its delivery (the queue off its list meanwhile): the
 * settle puts it back, and its unacked count falls by 1 over the window. */
static void late_ack_brings_it_back(void **state)
{
    (void)state;
    struct queue *q = declare("q");
    publish(q, 1);
    struct queue_entry entry;
    assert_true(queue_take(q, &entry));
    rounds(8);
    assert_false(rates_listed(&q->rates));
    assert_int_equal(broker.rates_totals[BROKER_TOTALS_RATE_UNACKED], 1);
    queue_settle(q, entry.seq, entry.message);
    message_unref(entry.message);
    assert_true(rates_listed(&q->rates));
    round_of_samples();
    assert_true(rate(q, QUEUE_RATE_UNACKED) == -0.2);
    assert_true(rate(q, QUEUE_RATE_MESSAGES) == -0.2);
    assert_int_equal(broker.rates_totals[BROKER_TOTALS_RATE_UNACKED], 0);
    rounds(5);
    assert_false(rates_listed(&q->rates));
}

/* Deleted while on its list (sampled in a part still to come, and in one
 * already walked): it leaves the list and the totals at once. */
static void deleted_while_listed(void **state)
{
    (void)state;
    struct queue *q[8];
    char name[16];
    for (uint32_t i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "q%u", i);
        q[i] = declare(name);
    }
    round_of_samples();
    for (uint32_t i = 0; i < 8; i++)
        publish(q[i], i + 1);
    assert_int_equal(active_count(), 8);
    broker_sample_rates(&broker, now_ms); /* a round's first part */
    now_ms += 250;
    queue_purge(q[0]);
    vhost_queue_delete(vhost, q[0]); /* its part was walked */
    queue_purge(q[3]);
    vhost_queue_delete(vhost, q[3]); /* its part comes next */
    assert_int_equal(active_count(), 6);
    for (uint32_t part = 1; part < BROKER_RATES_PARTS; part++) {
        broker_sample_rates(&broker, now_ms);
        now_ms += 250;
    }
    rounds(7);
    assert_int_equal(active_count(), 0);
    /* 2 + 3 + 5 + 6 + 7 + 8 */
    assert_int_equal(broker.rates_totals[BROKER_TOTALS_RATE_READY], 31);
    assert_int_equal(broker.rates_totals[BROKER_TOTALS_RATE_MESSAGES], 31);
    for (uint32_t i = 1; i < 8; i++) {
        if (i != 3)
            queue_purge(q[i]);
    }
}

/* 5,000 idle queues and one busy one: a round samples one queue, and the
 * totals and their rates are those of all of them. */
static void totals_exact_with_idle_queues(void **state)
{
    (void)state;
    char name[16];
    struct queue *idle[5000];
    for (uint32_t i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "idle%u", i);
        idle[i] = declare(name);
        if (i % 10 == 0)
            publish(idle[i], 1);
    }
    struct queue *busy = declare("busy");
    rounds(2);
    assert_int_equal(active_count(), 0);
    assert_int_equal(broker.rates_totals[BROKER_TOTALS_RATE_READY], 500);
    for (uint32_t s = 0; s < 6; s++) {
        publish(busy, 20);
        round_of_samples();
        assert_int_equal(active_count(), 1);
    }
    assert_true(rate(busy, QUEUE_RATE_PUBLISH) == 20.0);
    assert_true(rates_per_s(&broker.totals_rates, &broker.rates_clock,
                            BROKER_TOTALS_RATE_READY) == 20.0);
    assert_int_equal(broker.rates_totals[BROKER_TOTALS_RATE_READY], 500 + 120);
    assert_true(rate(idle[10], QUEUE_RATE_READY) == 0.0);
    queue_purge(busy);
    for (uint32_t i = 0; i < 5000; i += 10)
        queue_purge(idle[i]);
    round_of_samples();
    assert_int_equal(broker.rates_totals[BROKER_TOTALS_RATE_READY], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(still_queue_leaves_and_reads_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(comes_back_with_its_first_window, setup, teardown),
        cmocka_unit_test_setup_teardown(burst_after_a_long_pause, setup, teardown),
        cmocka_unit_test_setup_teardown(late_ack_brings_it_back, setup, teardown),
        cmocka_unit_test_setup_teardown(deleted_while_listed, setup, teardown),
        cmocka_unit_test_setup_teardown(totals_exact_with_idle_queues, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
