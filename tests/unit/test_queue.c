/*
 * test_queue.c: queue logic without sockets. Goal: dispatch, credit,
 * consumer priorities, single active consumer, requeue order, length
 * limits with each overflow mode, TTL expiry and dead-lettering behave as
 * RabbitMQ's do. Method: a vhost on a real libuv loop (for timers), fake
 * consumers through the consumer_ops seam that record what they receive.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "amqp/method_gen.h"
#include "amqp/table.h"
#include "bare_broker.h"
#include "broker/broker.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/replica.h"

struct fake_consumer {
    struct consumer base;
    uint32_t credit;               /* messages it may still take */
    uint32_t received;
    struct queue_entry got[64];    /* holds message references until settled */
    bool cancelled;
};

static bool fake_can_take(struct consumer *c)
{
    return ((struct fake_consumer *)c)->credit > 0;
}

static void fake_deliver(struct consumer *c, struct queue_entry entry)
{
    struct fake_consumer *f = (struct fake_consumer *)c;
    assert_true(f->received < 64);
    f->credit--;
    f->got[f->received++] = entry;
}

static void fake_cancelled(struct consumer *c)
{
    ((struct fake_consumer *)c)->cancelled = true;
}

static const struct consumer_ops fake_ops = {
    .can_take = fake_can_take, .deliver = fake_deliver, .cancelled = fake_cancelled};

static void fake_init(struct fake_consumer *f, uint32_t credit, int32_t priority)
{
    memset(f, 0, sizeof *f);
    f->base.ops = &fake_ops;
    f->base.priority = priority;
    f->credit = credit;
    list_init(&f->base.queue_link);
}

/* Settles everything a fake consumer holds (ack). */
static void fake_ack_all(struct fake_consumer *f, struct queue *q)
{
    for (uint32_t i = 0; i < f->received; i++) {
        queue_settle(q, f->got[i].seq, f->got[i].message);
        message_unref(f->got[i].message);
    }
    f->received = 0;
}

static struct broker broker;
static struct vhost *vhost;

static int setup(void **state)
{
    (void)state;
    bare_broker_init(&broker);
    vhost = vhost_new(&broker, BYTES_LIT("/"));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    vhost_free(vhost);
    uv_run(broker.loop, UV_RUN_NOWAIT); /* let closed timers go */
    assert_int_equal(message_live_count, 0);
    return 0;
}

/* A message whose body is its number, with optional priority/expiration. */
static struct message *make(uint32_t n, uint8_t priority, const char *expiration)
{
    struct basic_properties props = {0};
    if (priority) {
        props.flags |= BASIC_FLAG_PRIORITY;
        props.priority = priority;
    }
    if (expiration) {
        props.flags |= BASIC_FLAG_EXPIRATION;
        props.expiration = bytes_of_cstr(expiration);
    }
    uint8_t buf[64];
    size_t size = basic_properties_encode(&props, buf, sizeof buf);
    assert_true(size > 0);
    struct basic_properties decoded;
    assert_int_equal(basic_properties_decode(&decoded, buf, (uint32_t)size), 0);
    struct message *m = message_new(BYTES_LIT(""), BYTES_LIT("k"), buf, (uint32_t)size, &decoded,
                                    sizeof n);
    memcpy(m->body, &n, sizeof n);
    m->body_received = sizeof n;
    return m;
}

static uint32_t number_of(const struct message *m)
{
    uint32_t n;
    memcpy(&n, m->body, sizeof n);
    return n;
}

static void publish(struct queue *q, uint32_t n, uint8_t priority, const char *expiration,
                    enum queue_publish_result expected)
{
    struct message *m = make(n, priority, expiration);
    assert_int_equal(queue_publish(q, m, NULL), expected);
    message_unref(m);
}

/* Builds an arguments table with one integer (or string) argument. */
static struct queue *declare(const char *name, const char *key, int64_t value, const char *str)
{
    static uint8_t buf[256];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    if (key && str)
        table_put_longstr(&w, key, bytes_of_cstr(str));
    else if (key)
        table_put_int(&w, key, value);
    struct table t = table_writer_table(&w);
    return vhost_queue_declare(vhost, bytes_of_cstr(name), false, false, false,
                               (struct bytes){t.ptr, t.len});
}

/* A peer's forward sent again (the answer lost with a primary that went,
 * which may have delivered it) goes in flagged redelivered; a first one
 * does not. */
static void resent_forward_is_redelivered(void **state)
{
    (void)state;
    struct queue *q = declare("resent", NULL, 0, NULL);
    for (uint32_t i = 0; i < 2; i++) {
        struct message *m = make(i, 0, NULL);
        struct publish_wait wait = {.from_peer = true, .maybe_delivered = i == 1};
        assert_int_equal(queue_publish(q, m, &wait), QUEUE_PUBLISH_OK);
        message_unref(m);
    }
    for (uint32_t i = 0; i < 2; i++) {
        struct queue_entry e;
        assert_true(queue_take(q, &e));
        assert_int_equal(number_of(e.message), i);
        assert_int_equal(e.redelivered, i == 1);
        queue_settle(q, e.seq, e.message);
        message_unref(e.message);
    }
}

static void round_robin_and_credit(void **state)
{
    (void)state;
    struct queue *q = declare("rr", NULL, 0, NULL);
    struct fake_consumer a, b;
    fake_init(&a, 2, 0);
    fake_init(&b, 10, 0);
    queue_consumer_add(q, &a.base);
    queue_consumer_add(q, &b.base);
    for (uint32_t i = 0; i < 6; i++)
        publish(q, i, 0, NULL, QUEUE_PUBLISH_OK);
    /* a takes 0 and 2, then its credit is gone and b takes the rest. */
    assert_int_equal(a.received, 2);
    assert_int_equal(number_of(a.got[0].message), 0);
    assert_int_equal(number_of(a.got[1].message), 2);
    assert_int_equal(b.received, 4);
    assert_int_equal(number_of(b.got[0].message), 1);
    assert_int_equal(q->unacked_count, 6);
    fake_ack_all(&a, q);
    fake_ack_all(&b, q);
    queue_consumer_remove(q, &a.base);
    queue_consumer_remove(q, &b.base);
    vhost_queue_delete(vhost, q);
}

static void consumer_priorities(void **state)
{
    (void)state;
    struct queue *q = declare("prio", NULL, 0, NULL);
    struct fake_consumer low, high1, high2;
    fake_init(&low, 10, 1);
    fake_init(&high1, 2, 5);
    fake_init(&high2, 1, 5);
    queue_consumer_add(q, &low.base);
    queue_consumer_add(q, &high1.base);
    queue_consumer_add(q, &high2.base);
    for (uint32_t i = 0; i < 5; i++)
        publish(q, i, 0, NULL, QUEUE_PUBLISH_OK);
    /* The two priority-5 consumers alternate until full; only then low. */
    assert_int_equal(high1.received, 2);
    assert_int_equal(high2.received, 1);
    assert_int_equal(low.received, 2);
    assert_int_equal(number_of(high1.got[0].message), 0);
    assert_int_equal(number_of(high2.got[0].message), 1);
    assert_int_equal(number_of(high1.got[1].message), 2);
    fake_ack_all(&low, q);
    fake_ack_all(&high1, q);
    fake_ack_all(&high2, q);
    vhost_queue_delete(vhost, q);
    assert_true(low.cancelled && high1.cancelled && high2.cancelled);
}

static void single_active_consumer_hands_over(void **state)
{
    (void)state;
    struct table_writer w;
    uint8_t buf[64];
    table_writer_init(&w, buf, sizeof buf);
    table_put_bool(&w, "x-single-active-consumer", true);
    struct table t = table_writer_table(&w);
    struct queue *q = vhost_queue_declare(vhost, BYTES_LIT("sac"), false, false, false,
                                          (struct bytes){t.ptr, t.len});
    struct fake_consumer first, second;
    fake_init(&first, 2, 0);
    fake_init(&second, 10, 0);
    queue_consumer_add(q, &first.base);
    queue_consumer_add(q, &second.base);
    for (uint32_t i = 0; i < 4; i++)
        publish(q, i, 0, NULL, QUEUE_PUBLISH_OK);
    assert_int_equal(first.received, 2);
    assert_int_equal(second.received, 0); /* waits although it has credit */
    fake_ack_all(&first, q);
    queue_consumer_remove(q, &first.base);
    queue_dispatch(q);
    assert_int_equal(second.received, 2);
    assert_int_equal(number_of(second.got[0].message), 2);
    fake_ack_all(&second, q);
    vhost_queue_delete(vhost, q);
}

static void requeue_restores_original_order(void **state)
{
    (void)state;
    struct queue *q = declare("order", NULL, 0, NULL);
    for (uint32_t i = 0; i < 5; i++)
        publish(q, i, 0, NULL, QUEUE_PUBLISH_OK);
    struct queue_entry taken[3];
    for (int i = 0; i < 3; i++)
        assert_true(queue_take(q, &taken[i]));
    /* Requeue out of order: 2, then 0, then 1. */
    queue_requeue(q, taken[2]);
    queue_requeue(q, taken[0]);
    queue_requeue(q, taken[1]);
    for (uint32_t i = 0; i < 5; i++) {
        struct queue_entry e;
        assert_true(queue_take(q, &e));
        assert_int_equal(number_of(e.message), i);
        assert_int_equal(e.redelivered, i < 3);
        queue_settle(q, e.seq, e.message);
        message_unref(e.message);
    }
    vhost_queue_delete(vhost, q);
}

static void max_length_drop_head_and_reject_publish(void **state)
{
    (void)state;
    struct queue *q = declare("maxlen", "x-max-length", 2, NULL);
    for (uint32_t i = 0; i < 5; i++)
        publish(q, i, 0, NULL, QUEUE_PUBLISH_OK);
    assert_int_equal(queue_ready_count(q), 2);
    struct queue_entry e;
    assert_true(queue_take(q, &e));
    assert_int_equal(number_of(e.message), 3); /* the oldest were dropped */
    queue_settle(q, e.seq, e.message);
    message_unref(e.message);
    vhost_queue_delete(vhost, q);

    static uint8_t buf[128];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_int(&w, "x-max-length", 2);
    table_put_longstr(&w, "x-overflow", BYTES_LIT("reject-publish"));
    struct table t = table_writer_table(&w);
    q = vhost_queue_declare(vhost, BYTES_LIT("reject"), false, false, false,
                            (struct bytes){t.ptr, t.len});
    publish(q, 0, 0, NULL, QUEUE_PUBLISH_OK);
    publish(q, 1, 0, NULL, QUEUE_PUBLISH_OK);
    publish(q, 2, 0, NULL, QUEUE_PUBLISH_REJECTED);
    assert_int_equal(queue_ready_count(q), 2);
    vhost_queue_delete(vhost, q);
}

static void priority_queue_delivers_highest_first(void **state)
{
    (void)state;
    struct queue *q = declare("pq", "x-max-priority", 5, NULL);
    publish(q, 0, 0, NULL, QUEUE_PUBLISH_OK);
    publish(q, 1, 3, NULL, QUEUE_PUBLISH_OK);
    publish(q, 2, 9, NULL, QUEUE_PUBLISH_OK); /* above the max: counts as 5 */
    publish(q, 3, 3, NULL, QUEUE_PUBLISH_OK);
    uint32_t expected[] = {2, 1, 3, 0};
    for (int i = 0; i < 4; i++) {
        struct queue_entry e;
        assert_true(queue_take(q, &e));
        assert_int_equal(number_of(e.message), expected[i]);
        queue_settle(q, e.seq, e.message);
        message_unref(e.message);
    }
    vhost_queue_delete(vhost, q);
}

static void on_alive(uv_timer_t *timer)
{
    (void)timer;
}

static void ttl_expires_without_readers_and_dead_letters(void **state)
{
    (void)state;
    static uint8_t buf[128];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_int(&w, "x-message-ttl", 20);
    table_put_longstr(&w, "x-dead-letter-exchange", BYTES_LIT(""));
    table_put_longstr(&w, "x-dead-letter-routing-key", BYTES_LIT("dead"));
    struct table t = table_writer_table(&w);
    struct queue *q = vhost_queue_declare(vhost, BYTES_LIT("ttl"), false, false, false,
                                          (struct bytes){t.ptr, t.len});
    struct queue *dead = declare("dead", NULL, 0, NULL);
    publish(q, 7, 0, NULL, QUEUE_PUBLISH_OK);
    publish(q, 8, 0, "5", QUEUE_PUBLISH_OK); /* per-message, behind the head */
    assert_int_equal(queue_ready_count(q), 2);
    /* Nobody reads: the queue's timer must expire them. Queue timers do
     * not keep the loop alive (a broker's listeners do), so a referenced
     * timer stands in for them here. */
    uv_timer_t alive;
    uv_timer_init(broker.loop, &alive);
    uv_timer_start(&alive, on_alive, 10, 10);
    uint64_t start = uv_now(broker.loop);
    while (queue_ready_count(q) > 0 && uv_now(broker.loop) - start < 2000) {
        uv_run(broker.loop, UV_RUN_ONCE);
        uv_update_time(broker.loop);
    }
    uv_close((uv_handle_t *)&alive, NULL);
    uv_run(broker.loop, UV_RUN_NOWAIT); /* finish the close before `alive` goes */
    assert_int_equal(queue_ready_count(q), 0);
    assert_int_equal(queue_ready_count(dead), 2);
    struct queue_entry e;
    assert_true(queue_take(dead, &e));
    assert_int_equal(number_of(e.message), 7);
    struct field_value deaths, first, reason;
    assert_true(table_get(e.message->headers, "x-death", &deaths));
    assert_int_equal(deaths.kind, 'A');
    struct array_iter it;
    array_iter_init(&it, deaths.array);
    assert_true(array_iter_next(&it, &first));
    assert_true(table_get(first.table, "reason", &reason));
    assert_true(bytes_equal_cstr(reason.str, "expired"));
    assert_true(bytes_equal_cstr(message_routing_key(e.message), "dead"));
    queue_settle(dead, e.seq, e.message);
    message_unref(e.message);
    vhost_queue_delete(vhost, q);
    vhost_queue_delete(vhost, dead);
}

static void zero_ttl_delivers_now_or_never(void **state)
{
    (void)state;
    struct queue *q = declare("ttl0", "x-message-ttl", 0, NULL);
    publish(q, 1, 0, NULL, QUEUE_PUBLISH_OK);
    assert_int_equal(queue_ready_count(q), 0); /* nobody could take it */
    struct fake_consumer c;
    fake_init(&c, 5, 0);
    queue_consumer_add(q, &c.base);
    publish(q, 2, 0, NULL, QUEUE_PUBLISH_OK);
    assert_int_equal(c.received, 1);
    assert_int_equal(number_of(c.got[0].message), 2);
    fake_ack_all(&c, q);
    vhost_queue_delete(vhost, q);
}

/* A message whose body is its number, with a message-id (NULL: none). */
static struct message *make_id(uint32_t n, const char *id)
{
    struct basic_properties props = {0};
    if (id) {
        props.flags |= BASIC_FLAG_MESSAGE_ID;
        props.message_id = bytes_of_cstr(id);
    }
    uint8_t buf[64];
    size_t size = basic_properties_encode(&props, buf, sizeof buf);
    struct basic_properties decoded;
    assert_int_equal(basic_properties_decode(&decoded, buf, (uint32_t)size), 0);
    struct message *m = message_new(BYTES_LIT(""), BYTES_LIT("k"), buf, (uint32_t)size, &decoded,
                                    sizeof n);
    memcpy(m->body, &n, sizeof n);
    m->body_received = sizeof n;
    return m;
}

static enum queue_publish_result publish_id(struct queue *q, uint32_t n, const char *id)
{
    struct message *m = make_id(n, id);
    enum queue_publish_result r = queue_publish(q, m, NULL);
    message_unref(m);
    return r;
}

/* Lets the loop clock move on by at least ms. */
static void wait_ms(uint64_t ms)
{
    uint64_t start = uv_now(broker.loop);
    while (uv_now(broker.loop) - start < ms) {
        uv_sleep(5);
        uv_update_time(broker.loop);
    }
}

static void dedup_window_holds_back_resends(void **state)
{
    (void)state;
    struct queue *q = declare("dd", "x-quay-dedup-window", 200, NULL);
    assert_int_equal(publish_id(q, 1, "a"), QUEUE_PUBLISH_OK);
    assert_int_equal(publish_id(q, 2, "a"), QUEUE_PUBLISH_DUPLICATE);
    assert_int_equal(publish_id(q, 3, "b"), QUEUE_PUBLISH_OK);
    assert_int_equal(publish_id(q, 4, NULL), QUEUE_PUBLISH_OK); /* no id: never held */
    assert_int_equal(publish_id(q, 5, NULL), QUEUE_PUBLISH_OK);
    assert_int_equal(publish_id(q, 6, ""), QUEUE_PUBLISH_OK);   /* empty: no id */
    assert_int_equal(publish_id(q, 7, ""), QUEUE_PUBLISH_OK);
    assert_int_equal(queue_ready_count(q), 6);
    /* Consuming the original does not let its duplicate in... */
    struct queue_entry e;
    assert_true(queue_take(q, &e));
    assert_int_equal(number_of(e.message), 1);
    queue_settle(q, e.seq, e.message);
    message_unref(e.message);
    assert_int_equal(publish_id(q, 8, "a"), QUEUE_PUBLISH_DUPLICATE);
    /* ...nor does a purge. */
    assert_int_equal(queue_purge(q), 5);
    assert_int_equal(publish_id(q, 9, "b"), QUEUE_PUBLISH_DUPLICATE);
    assert_int_equal(queue_ready_count(q), 0);
    /* A dead-lettered message is never held back (a DLX retry loop through
     * this queue must not lose it), but it is remembered. */
    struct message *m = make_id(10, "a");
    assert_int_equal(queue_publish_dead_lettered(q, m, NULL), QUEUE_PUBLISH_OK);
    message_unref(m);
    m = make_id(11, "c");
    assert_int_equal(queue_publish_dead_lettered(q, m, NULL), QUEUE_PUBLISH_OK);
    message_unref(m);
    assert_int_equal(publish_id(q, 12, "c"), QUEUE_PUBLISH_DUPLICATE);
    assert_int_equal(queue_ready_count(q), 2);
    /* Once the window has passed, the id is welcome again. */
    wait_ms(210);
    assert_int_equal(publish_id(q, 13, "a"), QUEUE_PUBLISH_OK);
    assert_int_equal(publish_id(q, 14, "a"), QUEUE_PUBLISH_DUPLICATE);
    vhost_queue_delete(vhost, q);
    /* Without the argument nothing is held back and no table is made. */
    q = declare("plain", NULL, 0, NULL);
    assert_int_equal(publish_id(q, 1, "a"), QUEUE_PUBLISH_OK);
    assert_int_equal(publish_id(q, 2, "a"), QUEUE_PUBLISH_OK);
    assert_null(q->dedup);
    vhost_queue_delete(vhost, q);
}

static void dedup_duplicate_of_a_full_queue_is_still_confirmed(void **state)
{
    (void)state;
    static uint8_t buf[128];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_int(&w, "x-quay-dedup-window", 60000);
    table_put_int(&w, "x-max-length", 1);
    table_put_longstr(&w, "x-overflow", BYTES_LIT("reject-publish"));
    struct table t = table_writer_table(&w);
    struct queue *q = vhost_queue_declare(vhost, BYTES_LIT("full"), false, false, false,
                                          (struct bytes){t.ptr, t.len});
    assert_int_equal(publish_id(q, 1, "a"), QUEUE_PUBLISH_OK);
    /* The original is in: its resend is a duplicate, not a rejection. */
    assert_int_equal(publish_id(q, 2, "a"), QUEUE_PUBLISH_DUPLICATE);
    /* A refused publish was not enqueued, so its id is not remembered. */
    assert_int_equal(publish_id(q, 3, "b"), QUEUE_PUBLISH_REJECTED);
    struct queue_entry e;
    assert_true(queue_take(q, &e));
    queue_settle(q, e.seq, e.message);
    message_unref(e.message);
    assert_int_equal(publish_id(q, 4, "b"), QUEUE_PUBLISH_OK);
    vhost_queue_delete(vhost, q);
}

/* A backup's replica keeps the table from the stream, through a reset,
 * and a promoted queue starts with it. */
static void dedup_table_moves_with_a_promotion(void **state)
{
    (void)state;
    struct replica *r = replica_new(60000, NULL, NULL);
    uint64_t now = uv_now(broker.loop);
    for (uint32_t i = 1; i <= 3; i++) {
        char id[8];
        snprintf(id, sizeof id, "m%u", i);
        struct message *m = make_id(i, id);
        assert_true(replica_push(r, 1, i, m, now, false));
        message_unref(m);
    }
    struct message *m = make_id(4, NULL);
    assert_true(replica_push(r, 1, 4, m, now, false));
    message_unref(m);
    assert_int_equal(replica_dedup_count(r), 3);
    /* Acks and a catch-up's reset clear messages, not ids. */
    replica_remove(r, 1);
    replica_remove(r, 0);
    assert_int_equal(replica_count(r), 0);
    assert_int_equal(replica_dedup_count(r), 3);
    m = make_id(3, "m3"); /* the snapshot: what the primary still holds */
    assert_true(replica_push(r, 1, 3, m, now, false));
    message_unref(m);
    assert_int_equal(replica_dedup_count(r), 3);
    /* Promotion: the real queue (same arguments) takes messages and ids. */
    struct queue *q = declare("promoted", "x-quay-dedup-window", 60000, NULL);
    replica_adopt(q, r);
    assert_int_equal(queue_ready_count(q), 1);
    assert_int_equal(publish_id(q, 5, "m1"), QUEUE_PUBLISH_DUPLICATE); /* consumed, still known */
    assert_int_equal(publish_id(q, 6, "m3"), QUEUE_PUBLISH_DUPLICATE);
    assert_int_equal(publish_id(q, 7, "m4"), QUEUE_PUBLISH_OK);
    assert_int_equal(queue_ready_count(q), 2);
    vhost_queue_delete(vhost, q);
}

/* A backup's replica keeps the forwarding streams' marks (origin.h) from
 * the stream, through a reset, and a promoted queue holds back a forward
 * resent to it: at or below its stream's mark, even once consumed. */
static void origin_marks_move_with_a_promotion(void **state)
{
    (void)state;
    struct replica *r = replica_new(-1, NULL, NULL);
    uint64_t now = uv_now(broker.loop);
    for (uint32_t i = 1; i <= 3; i++) {
        struct message *m = make_id(i, NULL);
        assert_true(replica_push(r, 1, i, m, now, false));
        replica_record_origin(r, 77, 10 + i, now); /* stream 77, link seqs 11..13 */
        message_unref(m);
    }
    replica_remove(r, 1);
    replica_remove(r, 0); /* a catch-up's reset: messages go, marks stay */
    replica_record_origin(r, 88, 5, now); /* a catch-up's mark (seq 0) */
    struct queue *q = declare("promoted-origins", NULL, 0, NULL);
    replica_adopt(q, r);
    assert_true(queue_origin_duplicate(q, 77, 11, NULL));
    assert_true(queue_origin_duplicate(q, 77, 13, NULL));
    assert_false(queue_origin_duplicate(q, 77, 14, NULL));
    assert_true(queue_origin_duplicate(q, 88, 5, NULL));
    assert_false(queue_origin_duplicate(q, 99, 1, NULL));
    vhost_queue_delete(vhost, q);
}

/* A peer's forward, whichever way it reaches the queue (a link channel, a
 * park until our map caught up, a stand-in's held ones at a promotion):
 * one at or below its stream's mark is held back; a resend enqueued is
 * flagged redelivered (the primary it first went to may have delivered it:
 * the fault soak's one unflagged duplicate was a resend parked at the new
 * primary and enqueued as new); only a first send the caller lets record
 * moves the mark. */
static void forwards_meet_the_marks_and_resends_are_flagged(void **state)
{
    (void)state;
    struct queue *q = declare("forwarded", NULL, 0, NULL);
    struct message *m = make_id(1, NULL);
    struct publish_wait wait = {0};
    struct queue_forwarded first = {.origin_stream = 5, .origin_seq = 10, .record = true};
    assert_int_equal(queue_publish_forward(q, m, &first, &wait), QUEUE_PUBLISH_OK);
    assert_true(queue_origin_duplicate(q, 5, 10, NULL));
    struct queue_forwarded again = {.origin_stream = 5, .origin_seq = 10, .resent = true};
    assert_int_equal(queue_publish_forward(q, m, &again, &wait), QUEUE_PUBLISH_DUPLICATE);
    assert_int_equal(queue_ready_count(q), 1);
    /* Not recorded (parked, or held): the mark stays where it was. */
    struct queue_forwarded parked = {.origin_stream = 5, .origin_seq = 11};
    assert_int_equal(queue_publish_forward(q, m, &parked, &wait), QUEUE_PUBLISH_OK);
    assert_false(queue_origin_duplicate(q, 5, 11, NULL));
    /* A resend the queue never took: enqueued, flagged, not recorded. */
    struct queue_forwarded resent = {.origin_stream = 6, .origin_seq = 3, .resent = true,
                                     .record = true};
    assert_int_equal(queue_publish_forward(q, m, &resent, &wait), QUEUE_PUBLISH_OK);
    assert_false(queue_origin_duplicate(q, 6, 3, NULL));
    assert_false(wait.maybe_delivered); /* the wait is the caller's again */
    assert_int_equal(queue_ready_count(q), 3);
    bool flags[3];
    for (int i = 0; i < 3; i++) {
        struct queue_entry e;
        assert_true(queue_take(q, &e));
        flags[i] = e.redelivered;
        queue_settle(q, e.seq, e.message);
        message_unref(e.message);
    }
    assert_false(flags[0]);
    assert_false(flags[1]);
    assert_true(flags[2]);
    message_unref(m);
    vhost_queue_delete(vhost, q);
}

/* A promoted replica's messages: in seq order whatever holes acks left
 * and wherever its ring wrapped, redelivered, counted with their bytes,
 * and the queue's own seqs go on after them. With priorities each goes to
 * its level. */
static void adopt_replica(const char *name, const char *key, int64_t value)
{
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1, NULL, NULL);
    uint64_t now = uv_now(broker.loop);
    for (uint32_t seq = 1; seq <= 100; seq++) {
        struct message *m = make(seq, (uint8_t)(seq % 3), NULL);
        assert_true(replica_push(r, 1, seq, m, now, false));
        message_unref(m);
    }
    for (uint32_t seq = 1; seq <= 60; seq++)
        replica_remove(r, seq); /* the head moves on: the next pushes wrap */
    for (uint32_t seq = 101; seq <= 120; seq++) {
        struct message *m = make(seq, (uint8_t)(seq % 3), NULL);
        assert_true(replica_push(r, 1, seq, m, now, false));
        message_unref(m);
    }
    for (uint32_t seq = 70; seq <= 110; seq += 10)
        replica_remove(r, seq); /* holes */
    assert_int_equal(replica_count(r), 55);
    struct queue *q = declare(name, key, value, NULL);
    replica_adopt(q, r);
    assert_int_equal(queue_ready_count(q), 55);
    assert_int_equal(q->ready_bytes, 55 * sizeof(uint32_t));
    struct queue_entry e;
    uint32_t last[3] = {0, 0, 0}, taken = 0;
    while (queue_take(q, &e)) {
        uint32_t n = number_of(e.message);
        assert_int_equal(e.seq, n);
        assert_true(e.redelivered);
        assert_true(n > 60 && (n % 10 != 0 || n == 120)); /* 70..110 were acked */
        uint32_t level = key ? n % 3 : 0; /* FIFO within each level */
        assert_true(n > last[level]);
        last[level] = n;
        queue_settle(q, e.seq, e.message);
        message_unref(e.message);
        taken++;
    }
    assert_int_equal(taken, 55);
    assert_int_equal(q->next_seq, 121);
    vhost_queue_delete(vhost, q);
    assert_int_equal(message_live_count, live_before);
}

static void promotion_adopts_the_replica_in_order(void **state)
{
    (void)state;
    adopt_replica("adopted", NULL, 0);
    adopt_replica("adopted-prio", "x-max-priority", 2);
}

static void delete_cancels_consumers_and_reports_count(void **state)
{
    (void)state;
    struct queue *q = declare("del", NULL, 0, NULL);
    struct fake_consumer c;
    fake_init(&c, 0, 0);
    queue_consumer_add(q, &c.base);
    for (uint32_t i = 0; i < 3; i++)
        publish(q, i, 0, NULL, QUEUE_PUBLISH_OK);
    assert_int_equal(vhost_queue_delete(vhost, q), 3);
    assert_true(c.cancelled);
    assert_int_equal(message_live_count, 0);
}

/* ---- flow control (broker/flow.h) ---- */

/* Lets the fake consumer take up to n messages (64 at a time), acking each batch. */
static void take(struct fake_consumer *f, struct queue *q, uint32_t n)
{
    while (n > 0) {
        uint32_t batch = n < 64 ? n : 64;
        f->credit = batch;
        queue_dispatch(q);
        assert_int_equal(f->received, batch);
        fake_ack_all(f, q);
        f->credit = 0;
        n -= batch;
    }
}

static void publish_many(struct queue *q, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        publish(q, i, 0, NULL, QUEUE_PUBLISH_OK);
}

static void flow_bounds_what_publishers_add_beyond_what_consumers_take(void **state)
{
    (void)state;
    struct queue *q = declare("flow", NULL, 0, NULL);
    /* Without consumers a queue is a buffer. */
    publish_many(q, FLOW_MIN_MESSAGES * 2);
    assert_false(q->flow.congested);
    struct fake_consumer c;
    fake_init(&c, 0, 0);
    queue_consumer_add(q, &c.base);
    /* The backlog from before does not count; what is added beyond what
     * the consumer takes does, up to the high mark. */
    publish_many(q, FLOW_MIN_MESSAGES);
    assert_false(q->flow.congested);
    publish(q, 0, 0, NULL, QUEUE_PUBLISH_OK);
    assert_true(q->flow.congested);
    assert_true(q->flow.reasons == FLOW_CONSUMERS);
    /* Down to half the mark: not yet at one over, yes at half. */
    take(&c, q, FLOW_MIN_MESSAGES / 2);
    assert_true(q->flow.congested);
    take(&c, q, 1);
    assert_false(q->flow.congested);
    /* A consumer that keeps up banks no credit for later. */
    take(&c, q, q->ready_count);
    publish_many(q, FLOW_MIN_MESSAGES + 1);
    assert_true(q->flow.congested);
    /* Losing its consumers makes it a buffer again. */
    queue_consumer_remove(q, &c.base);
    assert_false(q->flow.congested);
    vhost_queue_delete(vhost, q);
}

static void flow_gives_up_on_consumers_that_take_nothing(void **state)
{
    (void)state;
    struct queue *q = declare("flow-stall", NULL, 0, NULL);
    struct fake_consumer c;
    fake_init(&c, 0, 0);
    queue_consumer_add(q, &c.base);
    publish_many(q, FLOW_MIN_MESSAGES + 1);
    assert_true(q->flow.congested);
    uint64_t now = uv_now(broker.loop);
    flow_tick(&broker, now + FLOW_STALL_MS / 2);
    assert_true(q->flow.congested);
    flow_tick(&broker, now + FLOW_STALL_MS + 1);
    assert_false(q->flow.congested);
    assert_true(q->flow.stalled);
    /* Stalled: a buffer until its consumer takes again. */
    publish_many(q, FLOW_MIN_MESSAGES * 2);
    assert_false(q->flow.congested);
    take(&c, q, 1);
    assert_false(q->flow.stalled);
    publish_many(q, FLOW_MIN_MESSAGES + 1);
    assert_true(q->flow.congested);
    /* Deleting it lets everyone go. */
    queue_consumer_remove(q, &c.base);
    vhost_queue_delete(vhost, q);
}

static void flow_mark_follows_the_consumers_rate(void **state)
{
    (void)state;
    struct queue *q = declare("flow-rate", NULL, 0, NULL);
    struct fake_consumer c;
    fake_init(&c, 0, 0);
    queue_consumer_add(q, &c.base);
    /* Measured: 1,000,000 a second; the mark is 20 ms of that. */
    q->flow.rate = 1000000;
    publish_many(q, 20000);
    assert_false(q->flow.congested);
    publish(q, 0, 0, NULL, QUEUE_PUBLISH_OK);
    assert_true(q->flow.congested);
    queue_consumer_remove(q, &c.base);
    vhost_queue_delete(vhost, q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(round_robin_and_credit, setup, teardown),
        cmocka_unit_test_setup_teardown(resent_forward_is_redelivered, setup, teardown),
        cmocka_unit_test_setup_teardown(consumer_priorities, setup, teardown),
        cmocka_unit_test_setup_teardown(single_active_consumer_hands_over, setup, teardown),
        cmocka_unit_test_setup_teardown(requeue_restores_original_order, setup, teardown),
        cmocka_unit_test_setup_teardown(max_length_drop_head_and_reject_publish, setup, teardown),
        cmocka_unit_test_setup_teardown(priority_queue_delivers_highest_first, setup, teardown),
        cmocka_unit_test_setup_teardown(ttl_expires_without_readers_and_dead_letters, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(zero_ttl_delivers_now_or_never, setup, teardown),
        cmocka_unit_test_setup_teardown(delete_cancels_consumers_and_reports_count, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(dedup_window_holds_back_resends, setup, teardown),
        cmocka_unit_test_setup_teardown(dedup_duplicate_of_a_full_queue_is_still_confirmed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(dedup_table_moves_with_a_promotion, setup, teardown),
        cmocka_unit_test_setup_teardown(origin_marks_move_with_a_promotion, setup, teardown),
        cmocka_unit_test_setup_teardown(forwards_meet_the_marks_and_resends_are_flagged, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(promotion_adopts_the_replica_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(flow_bounds_what_publishers_add_beyond_what_consumers_take,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(flow_gives_up_on_consumers_that_take_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(flow_mark_follows_the_consumers_rate, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
