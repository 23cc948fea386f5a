/*
 * channel_basic.c: the basic class on a channel (consume, cancel, get,
 * ack, nack, reject, recover, qos), delivery to the client, and tx.
 *
 * Credit: a channel consumer can take a message while its own prefetch,
 * the channel's global prefetch and the connection's output buffer all
 * have room. Settling a delivery (ack, reject, requeue) gives credit back,
 * and the queues involved are dispatched again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/channel_int.h"
#include "broker/connection.h"
#include "broker/durable.h"
#include "broker/frame_out.h"
#include "broker/message.h"
#include "broker/queue_args.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/ring.h"

/* ---- delivery ring -------------------------------------------------- */

static void delivery_ring_grow(struct delivery_ring *r)
{
    r->items = ring_grow(r->items, sizeof *r->items, &r->head, r->count, &r->cap, 8);
}

static void ring_append(struct delivery_ring *r, uint64_t tag, struct delivery d)
{
    if (r->count == 0)
        r->first_tag = tag;
    ASSERT(tag >= r->first_tag + r->count);
    while (r->first_tag + r->count <= tag) {
        if (r->count == r->cap)
            delivery_ring_grow(r);
        r->items[(r->head + r->count) & (r->cap - 1)] = (struct delivery){0};
        r->count++;
    }
    r->items[(r->head + r->count - 1) & (r->cap - 1)] = d;
}

static struct delivery *ring_at(struct delivery_ring *r, uint64_t tag)
{
    if (tag < r->first_tag || tag - r->first_tag >= r->count)
        return NULL;
    return &r->items[(r->head + (uint32_t)(tag - r->first_tag)) & (r->cap - 1)];
}

static void ring_trim(struct delivery_ring *r)
{
    while (r->count > 0 && !r->items[r->head].live) {
        r->head = (r->head + 1) & (r->cap - 1);
        r->count--;
        r->first_tag++;
    }
    if (r->count == 0 && r->cap > 1024) {
        free(r->items);
        r->items = NULL;
        r->cap = 0;
        r->head = 0;
    }
}

/* ---- settling ------------------------------------------------------- */

/* Queues touched by a batch of settlements, dispatched once at its end. */
struct touched {
    struct queue *queues[16];
    uint32_t count;
};

static void touch(struct touched *t, struct queue *queue)
{
    for (uint32_t i = 0; i < t->count; i++) {
        if (t->queues[i] == queue)
            return;
    }
    if (t->count == ARRAY_SIZE(t->queues)) {
        /* Full: dispatch the oldest now; order within a batch only
         * matters for requeues, which are never spread this wide. */
        queue_dispatch(t->queues[0]);
        queue_unref(t->queues[0]);
        memmove(t->queues, t->queues + 1, sizeof t->queues[0] * (t->count - 1));
        t->count--;
    }
    queue_ref(queue);
    t->queues[t->count++] = queue;
}

static void dispatch_touched(struct channel *ch, struct touched *t)
{
    for (uint32_t i = 0; i < t->count; i++) {
        queue_dispatch(t->queues[i]);
        queue_unref(t->queues[i]);
    }
    t->count = 0;
    /* With a channel-wide prefetch, credit freed here may let this
     * channel's consumers on other queues go on too. */
    if (ch && ch->prefetch_global)
        channel_resume_delivery(ch);
}

enum settle_how { SETTLE_ACK, SETTLE_REQUEUE, SETTLE_DROP };

static void settle(struct channel *ch, struct delivery *d, enum settle_how how,
                   struct touched *t)
{
    ASSERT(d->live);
    ASSERT(ch->unacked_count > 0);
    d->live = false;
    ch->unacked_count--;
    if (d->consumer) {
        ASSERT(d->consumer->unacked_count > 0);
        d->consumer->unacked_count--;
    }
    struct queue *queue = d->queue;
    if (how == SETTLE_REQUEUE) {
        /* queue_requeue takes the message reference. */
        queue_requeue(queue, (struct queue_entry){.message = d->message, .seq = d->seq,
                                                  .expires_at_ms = d->expires_at_ms});
    } else if (how == SETTLE_DROP) {
        queue_reject(queue, d->seq, d->message); /* dead-letters it, if configured */
    } else {
        queue->stats.ack++;
        queue_settle(queue, d->seq, d->message);
        message_unref(d->message);
    }
    touch(t, queue);
    queue_unref(queue);
    d->message = NULL;
    d->queue = NULL;
}

/* Settles tag (and with multiple, every live tag below it). Requeues go
 * newest first (each is inserted at its original position, and the scan
 * from the head stays short); the rest oldest first. Returns false if tag
 * is not an unsettled delivery. */
static bool settle_tags(struct channel *ch, uint64_t tag, bool multiple, enum settle_how how)
{
    struct delivery_ring *r = &ch->deliveries;
    struct touched t = {.count = 0};
    if (multiple && tag == 0) {
        if (r->count == 0)
            return true;
        tag = r->first_tag + r->count - 1;
    } else {
        struct delivery *d = ring_at(r, tag);
        if (!d || !d->live)
            return false;
    }
    uint64_t low = multiple ? r->first_tag : tag;
    struct broker_counters *counters = channel__counters(ch);
    uint32_t unacked_before = ch->unacked_count;
    if (how == SETTLE_REQUEUE) {
        for (uint64_t x = tag + 1; x-- > low;) {
            struct delivery *d = ring_at(r, x);
            if (d && d->live)
                settle(ch, d, how, &t);
        }
    } else {
        /* Acks and dead-letterings go oldest first, in publish order. */
        for (uint64_t x = low; x <= tag; x++) {
            struct delivery *d = ring_at(r, x);
            if (d && d->live)
                settle(ch, d, how, &t);
        }
    }
    if (how == SETTLE_ACK) {
        channel__rates_moved(ch);
        ch->stats.counts[CHANNEL_RATE_ACK] += unacked_before - ch->unacked_count;
    }
    if (counters != NULL && how == SETTLE_ACK)
        counters->acknowledged += unacked_before - ch->unacked_count;
    ring_trim(r);
    dispatch_touched(ch, &t);
    return true;
}

uint32_t channels_consumers_count(const struct connection *connection)
{
    uint32_t n = 0;
    for (uint32_t id = 0; id < connection->channels_cap; id++) {
        const struct channel *ch = connection->channels[id];
        if (ch != NULL)
            n += ch->consumers_count;
    }
    return n;
}

void channels_sample_rates(struct rates_active *active, const struct rates_clock *clock)
{
    if (active->count == 0)
        return; /* (perhaps never initialised) */
    list_for_each_safe(node, &active->owners) {
        struct rates *r = CONTAINER_OF(node, struct rates, active_link);
        struct channel *ch = CONTAINER_OF(r, struct channel, rates);
        uint32_t values[CHANNEL_RATE_COUNT];
        for (uint32_t i = 0; i < CHANNEL_RATE_COUNT; i++)
            values[i] = (uint32_t)ch->stats.counts[i];
        rates_sample(r, clock, values, CHANNEL_RATE_COUNT);
        if (rates_still(r))
            rates_leave(active, r);
    }
}

void channels_check_idle(const struct connection *connection)
{
    for (uint32_t id = 0; id < connection->channels_cap; id++) {
        const struct channel *ch = connection->channels[id];
        for (uint32_t i = 0; ch != NULL && !rates_listed(&ch->rates) && i < CHANNEL_RATE_COUNT;
             i++)
            ASSERT(ch->rates.newest[i] == (uint32_t)ch->stats.counts[i]);
    }
}

static void info_of(const struct channel *ch, struct channel_info *out)
{
    *out = (struct channel_info){.connection = ch->connection, .number = ch->id,
                                 .confirm = ch->confirm_mode, .transactional = ch->tx_mode,
                                 .prefetch_count = ch->prefetch_consumer,
                                 .global_prefetch_count = ch->prefetch_global,
                                 .unacked_count = ch->unacked_count,
                                 .consumers_count = ch->consumers_count,
                                 .stats = ch->stats};
    const struct rates_clock *clock = &ch->connection->broker->rates_clock;
    for (uint32_t i = 0; i < CHANNEL_RATE_COUNT; i++)
        out->rates[i] = rates_per_s(&ch->rates, clock, i);
}

uint32_t channels_info(const struct connection *connection, struct channel_info *out,
                       uint32_t cap)
{
    uint32_t n = 0;
    for (uint32_t id = 0; id < connection->channels_cap && n < cap; id++) {
        const struct channel *ch = connection->channels[id];
        if (ch != NULL)
            info_of(ch, &out[n++]);
    }
    return n;
}

static const struct consumer_ops channel_consumer_ops;

bool channel_consumer_info(const struct consumer *consumer, struct channel_info *out)
{
    if (consumer->ops != &channel_consumer_ops || consumer->owner == NULL)
        return false;
    info_of(consumer->owner, out);
    return true;
}

static const struct consumer_ops channel_consumer_ops;

bool channel_consumer_of_peer(const struct consumer *consumer)
{
    const struct channel *ch = consumer->owner;
    return consumer->ops == &channel_consumer_ops && ch != NULL &&
           ch->connection->cluster_peer;
}

bool channels_consume_from(const struct connection *connection, const struct queue *queue)
{
    list_for_each(n, &queue->consumers) {
        const struct consumer *c = CONTAINER_OF(n, struct consumer, queue_link);
        if (c->ops != &channel_consumer_ops)
            continue; /* not a channel's (none are today) */
        const struct channel *ch = c->owner;
        if (ch->connection == connection)
            return true;
    }
    return false;
}

void channels_each_unacked(struct broker *broker, const struct queue *queue,
                           void (*fn)(void *ctx, uint64_t seq, struct message *message),
                           void *ctx)
{
    list_for_each(n, &broker->connections) {
        struct connection *c = CONTAINER_OF(n, struct connection, broker_link);
        for (uint32_t id = 0; id < c->channels_cap; id++) {
            struct channel *ch = c->channels[id];
            struct delivery_ring *r = ch ? &ch->deliveries : NULL;
            for (uint32_t i = 0; r && i < r->count; i++) {
                struct delivery *d = &r->items[(r->head + i) & (r->cap - 1)];
                if (d->live && d->queue == queue)
                    fn(ctx, d->seq, d->message);
            }
        }
    }
}

void channel__requeue_all(struct channel *ch)
{
    struct delivery_ring *r = &ch->deliveries;
    if (r->count == 0)
        return;
    settle_tags(ch, 0, true, SETTLE_REQUEUE);
}

/* ---- delivering ----------------------------------------------------- */

void channel__write_content(struct channel *ch, struct message *m)
{
    frame_out_content(&ch->connection->conn, ch->id, ch->connection->frame_max, m);
}

static uint64_t record_delivery(struct channel *ch, struct consumer *consumer,
                                struct queue *queue, struct queue_entry entry, bool no_ack)
{
    struct message *message = entry.message;
    uint64_t tag = ch->next_delivery_tag++;
    /* The queue counts every delivery, a peer broker's uplink's too (it
     * is the primary's count); the broker's counters only its clients'. */
    struct queue_stats *qs = &queue->stats;
    /* The queue is on its active list already: taking the message out of
     * it (queue_take, a stand-in's uplink) changed its counts in this very
     * call (queue_rates_moved there; ASan builds check it, broker.c). */
    channel__rates_moved(ch);
    /* deliver, deliver_no_ack, get, get_no_ack: an index, not a chain of
     * tests (the message path's cost of the counters, rates.h). */
    uint32_t kind = (uint32_t)(consumer == NULL) << 1 | (uint32_t)no_ack;
    qs->delivered[kind]++;
    ch->stats.counts[CHANNEL_RATE_DELIVER_GET]++;
    struct broker_counters *counters = channel__counters(ch);
    if (counters != NULL)
        counters->delivered[kind]++;
    if (entry.redelivered) {
        qs->redeliver++;
        ch->stats.counts[CHANNEL_RATE_REDELIVER]++;
        if (counters != NULL)
            counters->redelivered++;
    }
    if (no_ack) {
        queue_settle(queue, entry.seq, message);
        return tag;
    }
    queue_ref(queue);
    message_ref(message);
    ring_append(&ch->deliveries, tag,
                (struct delivery){.message = message, .queue = queue, .consumer = consumer,
                                  .seq = entry.seq, .expires_at_ms = entry.expires_at_ms,
                                  .live = true});
    ch->unacked_count++;
    if (consumer)
        consumer->unacked_count++;
    return tag;
}

void channel_adopt_delivery(struct channel *ch, struct queue *queue,
                            const struct queue_entry *entry)
{
    uint64_t tag = ch->next_delivery_tag++;
    if (entry == NULL)
        return; /* settled meanwhile: its tag is a hole (ring_append) */
    queue_ref(queue);
    ring_append(&ch->deliveries, tag,
                (struct delivery){.message = entry->message, .queue = queue, .seq = entry->seq,
                                  .expires_at_ms = entry->expires_at_ms, .live = true});
    ch->unacked_count++;
}

struct channel *channel_find(struct broker *broker, uint64_t connection_id, uint16_t channel_id)
{
    list_for_each(n, &broker->connections) {
        struct connection *c = CONTAINER_OF(n, struct connection, broker_link);
        if (c->conn.id != connection_id)
            continue;
        struct channel *ch = channel_id < c->channels_cap ? c->channels[channel_id] : NULL;
        return ch && ch->state == CHANNEL_STATE_OPEN && !c->conn.closing ? ch : NULL;
    }
    return NULL;
}

uint32_t channels_move_unacked(struct broker *broker, struct queue *from, struct queue *to,
                               uint64_t (*new_seq)(void *ctx, uint64_t seq), void *ctx)
{
    uint32_t moved = 0;
    list_for_each(n, &broker->connections) {
        struct connection *c = CONTAINER_OF(n, struct connection, broker_link);
        for (uint32_t id = 0; id < c->channels_cap; id++) {
            struct channel *ch = c->channels[id];
            struct delivery_ring *r = ch ? &ch->deliveries : NULL;
            for (uint32_t i = 0; r && i < r->count; i++) {
                struct delivery *d = &r->items[(r->head + i) & (r->cap - 1)];
                uint64_t seq = d->live && d->queue == from ? new_seq(ctx, d->seq) : 0;
                if (seq == 0)
                    continue;
                d->seq = seq;
                d->queue = to;
                queue_ref(to);
                queue_unref(from);
                ASSERT(from->unacked_count > 0);
                queue_rates_moved(from);
                queue_rates_moved(to);
                from->unacked_count--;
                to->unacked_count++;
                moved++;
            }
        }
    }
    return moved;
}

uint32_t channel_consumer_credit(const struct consumer *consumer)
{
    const struct channel *ch = consumer->owner;
    if (consumer->no_ack)
        return 0;
    uint32_t credit = consumer->prefetch_count;
    if (ch->prefetch_global && (credit == 0 || ch->prefetch_global < credit))
        credit = ch->prefetch_global;
    return credit;
}

static bool consumer_can_take(struct consumer *consumer)
{
    struct channel *ch = consumer->owner;
    if (ch->state != CHANNEL_STATE_OPEN || !ch->flow_active)
        return false;
    if (conn_out_full(&ch->connection->conn) || ch->connection->conn.closing)
        return false;
    if (consumer->no_ack)
        return true;
    if (consumer->prefetch_count && consumer->unacked_count >= consumer->prefetch_count)
        return false;
    if (ch->prefetch_global && ch->unacked_count >= ch->prefetch_global)
        return false;
    return true;
}

static void consumer_deliver(struct consumer *consumer, struct queue_entry entry)
{
    struct channel *ch = consumer->owner;
    struct queue *queue = consumer->queue;
    uint64_t tag = record_delivery(ch, consumer, queue, entry, consumer->no_ack);
    frame_out_basic_deliver(&ch->connection->conn, ch->id, consumer->tag, tag,
                            entry.redelivered != 0, message_exchange(entry.message),
                            message_routing_key(entry.message));
    channel__write_content(ch, entry.message);
    message_unref(entry.message); /* the queue's reference */
}

static void consumer_free(struct channel *ch, struct consumer *consumer)
{
    /* Deliveries outlive their consumer: they stay ackable on the channel. */
    struct delivery_ring *r = &ch->deliveries;
    for (uint32_t i = 0; i < r->count; i++) {
        struct delivery *d = &r->items[(r->head + i) & (r->cap - 1)];
        if (d->live && d->consumer == consumer)
            d->consumer = NULL;
    }
    list_remove(&consumer->owner_link);
    hmap_remove(&ch->consumers_by_tag, consumer->tag);
    ch->consumers_count--;
    free((void *)consumer->tag.ptr);
    free(consumer);
}

static void consumer_attached(struct consumer *consumer, uint16_t code, struct bytes text);

static void consumer_cancelled(struct consumer *consumer)
{
    struct channel *ch = consumer->owner;
    /* A stand-in's consumer cancelled before its primary answered the
     * consume (the queue was deleted or replaced meanwhile): as on one
     * broker where the consume came first, consume-ok, then the cancel. */
    if (ch->attaching == consumer)
        consumer_attached(consumer, REPLY_SUCCESS, BYTES_LIT(""));
    if (ch->connection->client_cancel_notify && ch->state == CHANNEL_STATE_OPEN) {
        struct method m = {.id = METHOD_BASIC_CANCEL};
        m.basic_cancel.consumer_tag = consumer->tag;
        m.basic_cancel.no_wait = true;
        channel__send(ch, &m);
    }
    consumer_free(ch, consumer);
}

static void consumer_attached(struct consumer *consumer, uint16_t code, struct bytes text)
{
    struct channel *ch = consumer->owner;
    if (ch->attaching != consumer)
        return; /* not waited for */
    ch->attaching = NULL;
    connection_release(ch->connection);
    if (code == REPLY_SUCCESS) {
        if (!ch->attaching_no_wait) {
            struct method ok = {.id = METHOD_BASIC_CONSUME_OK};
            ok.basic_consume_ok.consumer_tag = consumer->tag;
            channel__send(ch, &ok);
        }
        return;
    }
    channel__fail_relayed(ch, code, METHOD_BASIC_CONSUME, text);
}

void channel__forget_attaching(struct channel *ch)
{
    if (ch->attaching == NULL)
        return;
    ch->attaching = NULL;
    connection_release(ch->connection);
}

static const struct consumer_ops channel_consumer_ops = {
    .can_take = consumer_can_take,
    .deliver = consumer_deliver,
    .cancelled = consumer_cancelled,
    .attached = consumer_attached,
};

void channel_resume_delivery(struct channel *ch)
{
    list_for_each_safe(node, &ch->consumers) {
        struct consumer *consumer = CONTAINER_OF(node, struct consumer, owner_link);
        if (consumer->queue)
            queue_dispatch(consumer->queue);
    }
}

/* Detaches a consumer from its queue; deletes an auto-delete queue that
 * lost its last consumer (RabbitMQ semantics). */
static void detach(struct channel *ch, struct consumer *consumer)
{
    struct queue *queue = consumer->queue;
    if (!queue)
        return;
    queue_ref(queue);
    queue_consumer_remove(queue, consumer);
    if (queue->auto_delete && queue->consumers_count == 0 && !queue->deleted) {
        if (!queue_is_remote(queue)) {
            vhost_queue_discard(ch->vhost, queue);
        } else if (!ch->releasing && ch->remote_op == NULL && ch->cluster_wait == NULL) {
            channel__await_auto_delete(ch, queue, METHOD_BASIC_CANCEL); /* its primary decides */
        } else if (ch->client_closing) {
            channel__check_auto_delete_on_close(ch, queue); /* before close-ok */
        }
    }
    queue_unref(queue);
}

void channel__release_consumers(struct channel *ch)
{
    while (!list_empty(&ch->consumers)) {
        struct consumer *consumer =
            CONTAINER_OF(ch->consumers.next, struct consumer, owner_link);
        detach(ch, consumer);
        consumer_free(ch, consumer);
    }
}

/* ---- methods -------------------------------------------------------- */

/* Looks up a queue for basic.consume / basic.get, failing the channel
 * as RabbitMQ does when it is missing or exclusive to someone else. */
static struct queue *usable_queue(struct channel *ch, struct bytes name, uint32_t method_id)
{
    /* basic.consume and basic.get: both read the queue. */
    if (!channel__resolve_queue_name(ch, &name, method_id) ||
        !channel__permitted(ch, AUTH_PERMISSION_READ, "queue", name, method_id))
        return NULL;
    struct queue *queue = vhost_queue(ch->vhost, name);
    if (!queue) {
        channel__fail(ch, REPLY_NOT_FOUND, method_id, "no queue '%.*s' " VHOST_FMT,
                      (int)name.len, (const char *)name.ptr, VHOST_ARG(ch));
        return NULL;
    }
    if (channel__queue_locked(ch, queue, method_id) ||
        channel__queue_unreadable(ch, queue, method_id))
        return NULL;
    return queue;
}

/* A consumer of a stand-in: the primary decides (exclusive use, ...), so
 * consume-ok or its error waits for its answer (consumer_attached). True
 * if handled here; false: answer now (the primary is not reachable yet,
 * the consumer attaches when it is). */
static bool consume_remote(struct channel *ch, struct queue *queue, struct consumer *consumer,
                           bool no_wait)
{
    bool available = true;
    if (queue->remote_ops->consume_waits(queue, &available)) {
        ch->attaching = consumer;
        ch->attaching_no_wait = no_wait;
        connection_hold(ch->connection);
        queue_consumer_add(queue, consumer);
        return true;
    }
    if (available)
        return false;
    consumer_free(ch, consumer);
    channel__fail(ch, REPLY_NOT_FOUND, METHOD_BASIC_CONSUME,
                  "queue '%.*s' " VHOST_FMT " is unavailable: its primary broker is down",
                  (int)queue->name.len, (const char *)queue->name.ptr, VHOST_ARG(ch));
    return true;
}

static void handle_consume(struct channel *ch, const struct method *m)
{
    const struct method_basic_consume *c = &m->basic_consume;
    struct queue *queue = usable_queue(ch, c->queue, m->id);
    if (!queue)
        return;
    char generated[64];
    struct bytes tag = c->consumer_tag;
    if (tag.len == 0) {
        broker_generate_name(ch->connection->broker, "amq.ctag-", generated, sizeof generated);
        tag = bytes_of_cstr(generated);
    } else if (hmap_get(&ch->consumers_by_tag, tag)) {
        channel__connection_fail(ch, REPLY_NOT_ALLOWED, m->id,
                                 "attempt to reuse consumer tag '%.*s'", (int)tag.len,
                                 (const char *)tag.ptr);
        return;
    }
    uint32_t limit = ch->connection->broker->config.limits.consumers_per_channel_max;
    if (limit && ch->consumers_count >= limit) {
        channel__fail(ch, REPLY_RESOURCE_ERROR, m->id, "consumer limit %u reached", limit);
        return;
    }
    int64_t priority = 0;
    uint16_t code;
    char text[256];
    if (!consumer_args_parse(c->arguments, queue->name, ch->vhost->name, &priority, &code, text,
                             sizeof text)) {
        channel__fail(ch, code, m->id, "%s", text);
        return;
    }
    if (queue->exclusive_consumers > 0 || (c->exclusive && queue->consumers_count > 0)) {
        channel__fail(ch, REPLY_ACCESS_REFUSED, m->id,
                      "queue '%.*s' " VHOST_FMT " in exclusive use", (int)queue->name.len,
                      (const char *)queue->name.ptr, VHOST_ARG(ch));
        return;
    }
    struct consumer *consumer = xcalloc(1, sizeof *consumer);
    uint8_t *tag_copy = xmalloc(tag.len ? tag.len : 1);
    memcpy(tag_copy, tag.ptr, tag.len);
    consumer->ops = &channel_consumer_ops;
    consumer->owner = ch;
    consumer->tag = (struct bytes){tag_copy, tag.len};
    consumer->no_ack = c->no_ack;
    consumer->exclusive = c->exclusive;
    consumer->prefetch_count = ch->prefetch_consumer;
    /* RabbitMQ takes any integer; clamping keeps the order of priorities. */
    consumer->priority = priority > INT32_MAX   ? INT32_MAX
                         : priority < INT32_MIN ? INT32_MIN
                                                : (int32_t)priority;
    list_init(&consumer->queue_link);
    list_push_back(&ch->consumers, &consumer->owner_link);
    hmap_put(&ch->consumers_by_tag, consumer->tag, consumer);
    ch->consumers_count++;
    if (queue_is_remote(queue) && consume_remote(ch, queue, consumer, c->no_wait))
        return;
    if (!c->no_wait) {
        struct method ok = {.id = METHOD_BASIC_CONSUME_OK};
        ok.basic_consume_ok.consumer_tag = consumer->tag;
        channel__send(ch, &ok);
    }
    queue_consumer_add(queue, consumer);
    queue_touch(queue);
    queue_dispatch(queue);
}

static void handle_cancel(struct channel *ch, const struct method *m)
{
    const struct method_basic_cancel *c = &m->basic_cancel;
    struct consumer *consumer = hmap_get(&ch->consumers_by_tag, c->consumer_tag);
    if (!c->no_wait) {
        /* Answer first: the tag in the reply is the request's, and the
         * consumer (and its tag copy) may be freed below. */
        struct method ok = {.id = METHOD_BASIC_CANCEL_OK};
        ok.basic_cancel_ok.consumer_tag = c->consumer_tag;
        channel__send(ch, &ok);
    }
    if (!consumer)
        return; /* RabbitMQ answers cancel-ok for unknown tags too */
    detach(ch, consumer);
    consumer_free(ch, consumer);
}

static void send_get_ok(struct channel *ch, struct queue *queue, struct queue_entry entry,
                        bool no_ack, uint32_t message_count)
{
    uint64_t tag = record_delivery(ch, NULL, queue, entry, no_ack);
    struct method ok = {.id = METHOD_BASIC_GET_OK};
    ok.basic_get_ok.delivery_tag = tag;
    ok.basic_get_ok.redelivered = entry.redelivered != 0;
    ok.basic_get_ok.exchange = message_exchange(entry.message);
    ok.basic_get_ok.routing_key = message_routing_key(entry.message);
    ok.basic_get_ok.message_count = message_count;
    channel__send(ch, &ok);
    channel__write_content(ch, entry.message);
    message_unref(entry.message);
}

static void send_get_empty(struct channel *ch)
{
    struct method empty = {.id = METHOD_BASIC_GET_EMPTY};
    empty.basic_get_empty.reserved_1 = BYTES_LIT("");
    channel__send(ch, &empty);
}

static void handle_get(struct channel *ch, const struct method *m);

/* A get asked again, by name, of whatever the vhost holds now (the
 * queue it was asked of stood still, or was replaced), as one broker
 * would have answered it; not on a channel closing meanwhile. */
static void get_again(struct channel *ch, struct bytes name, bool no_ack)
{
    struct method m = {.id = METHOD_BASIC_GET};
    m.basic_get.queue = name;
    m.basic_get.no_ack = no_ack;
    if (ch->state == CHANNEL_STATE_OPEN)
        handle_get(ch, &m);
}

/* The primary answered a basic.get made through a stand-in. */
static void on_remote_get(void *ctx, struct queue *queue, uint16_t reply_code,
                          struct bytes reply_text, struct queue_entry *entry,
                          uint32_t message_count)
{
    struct channel *ch = ctx;
    bool no_ack = ch->remote_no_ack;
    channel__remote_op_done(ch, queue);
    if (entry)
        send_get_ok(ch, queue, *entry, no_ack, message_count);
    else if (reply_code == REPLY_SUCCESS)
        send_get_empty(ch);
    else if (reply_code == 0 && queue->deleted)
        get_again(ch, queue->name, no_ack); /* the stand-in replaced (our backup promoted) */
    else if (reply_code == 0)
        channel__fail_unreachable(ch, queue, METHOD_BASIC_GET);
    else /* gone at its primary (our map has not heard yet), or locked */
        channel__fail_relayed(ch, reply_code, METHOD_BASIC_GET, reply_text);
    queue_unref(queue);
}

/* The queue stood still for a handover: the get is asked again, by name,
 * where the queue is now (here, resumed; or at its new primary through
 * the stand-in that replaced it), before the channel reads on. */
static void retry_get(struct queue_get_wait *wait)
{
    struct channel *ch = CONTAINER_OF(wait, struct channel, get_wait);
    get_again(ch, (struct bytes){ch->get_name, ch->get_name_size}, ch->get_no_ack);
    connection_release(ch->connection);
}

void channel__forget_held_get(struct channel *ch)
{
    if (!list_linked(&ch->get_wait.link))
        return;
    list_remove(&ch->get_wait.link);
    connection_release(ch->connection);
}

static void handle_get(struct channel *ch, const struct method *m)
{
    const struct method_basic_get *g = &m->basic_get;
    struct queue *queue = usable_queue(ch, g->queue, m->id);
    if (!queue)
        return;
    if (queue_is_remote(queue)) {
        /* The connection waits for the primary's answer, as a client of
         * the primary would. */
        ch->remote_op = queue->remote_ops->get(queue, on_remote_get, ch);
        if (ch->remote_op == NULL) {
            channel__fail_unreachable(ch, queue, m->id);
            return;
        }
        ch->remote_no_ack = g->no_ack;
        ch->remote_method = m->id;
        ch->remote_queue = queue;
        queue_ref(queue);
        connection_hold(ch->connection);
        return;
    }
    queue_touch(queue);
    if (queue_paused(queue)) {
        ASSERT(queue->name.len <= sizeof ch->get_name);
        memcpy(ch->get_name, queue->name.ptr, queue->name.len);
        ch->get_name_size = (uint8_t)queue->name.len;
        ch->get_no_ack = g->no_ack;
        ch->get_wait.retry = retry_get;
        queue_hold_get(queue, &ch->get_wait);
        connection_hold(ch->connection);
        return;
    }
    struct queue_entry entry;
    if (!queue_take(queue, &entry)) {
        send_get_empty(ch);
        return;
    }
    send_get_ok(ch, queue, entry, g->no_ack, queue_ready_count(queue));
}

void channel__forget_remote_op(struct channel *ch)
{
    if (ch->remote_op == NULL)
        return;
    ch->remote_queue->remote_ops->op_cancel(ch->remote_op);
    ch->remote_op = NULL;
    queue_unref(ch->remote_queue);
    ch->remote_queue = NULL;
    connection_release(ch->connection);
}

static void settle_or_fail(struct channel *ch, uint32_t method_id, uint64_t tag, bool multiple,
                           enum settle_how how)
{
    if (!settle_tags(ch, tag, multiple, how))
        channel__fail(ch, REPLY_PRECONDITION_FAILED, method_id, "unknown delivery tag %llu",
                      (unsigned long long)tag);
}

static void hold_for_tx(struct channel *ch, const struct method *m, uint64_t tag, bool multiple,
                        bool requeue)
{
    struct tx_op *op = xcalloc(1, sizeof *op);
    op->method_id = m->id;
    op->delivery_tag = tag;
    op->multiple = multiple;
    op->requeue = requeue;
    list_push_back(&ch->tx_ops, &op->link);
}

static void handle_qos(struct channel *ch, const struct method *m)
{
    const struct method_basic_qos *q = &m->basic_qos;
    if (q->prefetch_size != 0) {
        channel__connection_fail(ch, REPLY_NOT_IMPLEMENTED, m->id, "prefetch_size!=0 (%u)",
                                 q->prefetch_size);
        return;
    }
    /* RabbitMQ's reading: global=false limits each consumer created
     * after this on the channel; global=true limits the channel. */
    if (q->global)
        ch->prefetch_global = q->prefetch_count;
    else
        ch->prefetch_consumer = q->prefetch_count;
    struct method ok = {.id = METHOD_BASIC_QOS_OK};
    channel__send(ch, &ok);
    /* A channel-wide limit changes what every consumer here may take now. */
    list_for_each_safe(node, &ch->consumers) {
        struct consumer *consumer = CONTAINER_OF(node, struct consumer, owner_link);
        if (consumer->queue)
            queue_consumer_credit_changed(consumer->queue, consumer);
    }
}

static void handle_recover(struct channel *ch, const struct method *m, bool requeue)
{
    if (!requeue) {
        channel__connection_fail(ch, REPLY_NOT_IMPLEMENTED, m->id, "requeue=false");
        return;
    }
    channel__requeue_all(ch);
    if (m->id == METHOD_BASIC_RECOVER) {
        struct method ok = {.id = METHOD_BASIC_RECOVER_OK};
        channel__send(ch, &ok);
    }
}

void channel__handle_basic(struct channel *ch, const struct method *m)
{
    switch (m->id) {
    case METHOD_BASIC_PUBLISH:
        return channel__begin_publish(ch, m);
    case METHOD_BASIC_QUAY_FORWARD:
    case METHOD_BASIC_QUAY_REPLICATE:
        return channel__begin_forward(ch, m);
    case METHOD_BASIC_QUAY_SETTLE:
        return channel__handle_settle(ch, m);
    case METHOD_BASIC_QUAY_HANDOVER:
        return channel__handle_handover(ch, m);
    case METHOD_BASIC_QUAY_SYNC:
        return channel__handle_sync(ch, m);
    case METHOD_BASIC_QUAY_USAGE:
        return channel__handle_usage(ch, m);
    case METHOD_BASIC_ACK:
        if (ch->tx_mode)
            return hold_for_tx(ch, m, m->basic_ack.delivery_tag, m->basic_ack.multiple, false);
        return settle_or_fail(ch, m->id, m->basic_ack.delivery_tag, m->basic_ack.multiple,
                              SETTLE_ACK);
    case METHOD_BASIC_NACK: {
        const struct method_basic_nack *n = &m->basic_nack;
        if (ch->tx_mode)
            return hold_for_tx(ch, m, n->delivery_tag, n->multiple, n->requeue);
        return settle_or_fail(ch, m->id, n->delivery_tag, n->multiple,
                              n->requeue ? SETTLE_REQUEUE : SETTLE_DROP);
    }
    case METHOD_BASIC_REJECT: {
        const struct method_basic_reject *r = &m->basic_reject;
        if (ch->tx_mode)
            return hold_for_tx(ch, m, r->delivery_tag, false, r->requeue);
        return settle_or_fail(ch, m->id, r->delivery_tag, false,
                              r->requeue ? SETTLE_REQUEUE : SETTLE_DROP);
    }
    case METHOD_BASIC_CONSUME:
        return handle_consume(ch, m);
    case METHOD_BASIC_CANCEL:
        return handle_cancel(ch, m);
    case METHOD_BASIC_GET:
        return handle_get(ch, m);
    case METHOD_BASIC_QOS:
        return handle_qos(ch, m);
    case METHOD_BASIC_RECOVER:
        return handle_recover(ch, m, m->basic_recover.requeue);
    case METHOD_BASIC_RECOVER_ASYNC:
        return handle_recover(ch, m, m->basic_recover_async.requeue);
    default:
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id, "unimplemented method");
    }
}

/* ---- tx ------------------------------------------------------------- */

void channel__drop_tx(struct channel *ch)
{
    while (!list_empty(&ch->tx_ops)) {
        struct tx_op *op = CONTAINER_OF(ch->tx_ops.next, struct tx_op, link);
        list_remove(&op->link);
        if (op->message)
            message_unref(op->message);
        free(op);
    }
}

static bool commit(struct channel *ch)
{
    while (!list_empty(&ch->tx_ops)) {
        struct tx_op *op = CONTAINER_OF(ch->tx_ops.next, struct tx_op, link);
        list_remove(&op->link);
        bool ok = true;
        if (op->method_id == METHOD_BASIC_PUBLISH) {
            channel__route_now(ch, op->message, op->mandatory);
            message_unref(op->message);
        } else {
            enum settle_how how = op->method_id == METHOD_BASIC_ACK ? SETTLE_ACK
                                  : op->requeue                     ? SETTLE_REQUEUE
                                                                    : SETTLE_DROP;
            ok = settle_tags(ch, op->delivery_tag, op->multiple, how);
            if (!ok)
                channel__fail(ch, REPLY_PRECONDITION_FAILED, op->method_id,
                              "unknown delivery tag %llu", (unsigned long long)op->delivery_tag);
        }
        free(op);
        if (!ok)
            return false;
    }
    return true;
}

void channel__handle_tx(struct channel *ch, const struct method *m)
{
    struct method ok = {0};
    switch (m->id) {
    case METHOD_TX_SELECT:
        if (ch->confirm_mode) {
            channel__fail(ch, REPLY_PRECONDITION_FAILED, m->id,
                          "cannot switch from confirm to tx mode");
            return;
        }
        ch->tx_mode = true;
        ok.id = METHOD_TX_SELECT_OK;
        break;
    case METHOD_TX_COMMIT:
    case METHOD_TX_ROLLBACK:
        if (!ch->tx_mode) {
            channel__fail(ch, REPLY_PRECONDITION_FAILED, m->id, "channel is not transactional");
            return;
        }
        if (m->id == METHOD_TX_COMMIT) {
            if (!commit(ch))
                return;
            /* Persistent messages to durable queues must be on disk before
             * commit-ok, as in RabbitMQ: wait for the journal's fsync; and
             * every primary (and backup) the publishes went to must have
             * them. */
            struct broker *broker = ch->connection->broker;
            ch->commit_pending = true;
            if (ch->tx_ticket > durable_synced_ticket(broker))
                durable_wait_for_sync(broker, &ch->durable_link);
            channel__commit_check(ch, durable_synced_ticket(broker), 0);
            return;
        } else {
            channel__drop_tx(ch);
            ok.id = METHOD_TX_ROLLBACK_OK;
        }
        break;
    default:
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id, "unimplemented method");
        return;
    }
    channel__send(ch, &ok);
}
