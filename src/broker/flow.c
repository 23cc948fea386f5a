/*
 * flow.c: flow control per publishing connection (see flow.h).
 */
#include "broker/flow.h"

#include <stdlib.h>

#include "amqp/method_gen.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/connection.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/log.h"

/* One connection waiting for one congested queue. */
struct flow_tie {
    struct list_node queue_link;      /* in queue->flow.ties */
    struct list_node conn_link;       /* in connection->flow_ties */
    struct queue *queue;              /* borrowed: the tie goes before it */
    struct connection *connection;    /* borrowed: likewise */
    uint16_t channel;                 /* a peer's: the channel that was told */
    bool exempt;                      /* the connection consumes from the queue too */
};

static uint64_t loop_now(const struct queue *queue)
{
    return uv_now(queue->vhost->broker->loop);
}

void flow_queue_init(struct queue *queue)
{
    list_init(&queue->flow.ties);
    list_init(&queue->flow.congested_link);
}

void flow_connection_init(struct connection *connection)
{
    list_init(&connection->flow_ties);
}

/* ---- marks ----------------------------------------------------------- */

static uint64_t high_mark(const struct queue_flow *f)
{
    uint64_t by_rate = f->rate * FLOW_TARGET_MS / 1000;
    return by_rate > FLOW_MIN_MESSAGES ? by_rate : FLOW_MIN_MESSAGES;
}

static uint64_t high_mark_bytes(const struct queue_flow *f)
{
    uint64_t by_rate = f->byte_rate * FLOW_TARGET_MS / 1000;
    return by_rate > FLOW_MIN_BYTES ? by_rate : FLOW_MIN_BYTES;
}

/* ---- ties ------------------------------------------------------------ */

static void send_notice(struct connection *connection, uint16_t channel, struct queue *queue,
                        bool active)
{
    if (connection->state != CONNECTION_STATE_OPEN || connection->conn.closing)
        return;
    if (channel >= connection->channels_cap || connection->channels[channel] == NULL)
        return; /* its channel closed: nobody there to tell */
    struct method m = {.id = METHOD_BASIC_QUAY_FLOW};
    m.basic_quay_flow.queue = queue->name;
    m.basic_quay_flow.active = active;
    connection_send_method(connection, channel, &m);
}

/* Unlinks and frees a tie; a client's connection is read again once it
 * waits for nothing, a peer's link is told the queue flows again (if
 * tell: not when the connection itself goes). */
static void untie(struct flow_tie *tie, bool tell)
{
    struct connection *connection = tie->connection;
    list_remove(&tie->queue_link);
    list_remove(&tie->conn_link);
    if (connection->cluster_peer) {
        if (tell)
            send_notice(connection, tie->channel, tie->queue, true);
    } else if (!tie->exempt) {
        ASSERT(connection->flow_waits > 0);
        if (--connection->flow_waits == 0)
            conn_resume_reading(&connection->conn, CONN_PAUSE_QUEUE);
    }
    free(tie);
}

static void release_ties(struct queue *queue)
{
    while (!list_empty(&queue->flow.ties))
        untie(CONTAINER_OF(queue->flow.ties.next, struct flow_tie, queue_link), true);
}

static void set_reason(struct queue *queue, enum flow_reason reason, bool on)
{
    struct queue_flow *f = &queue->flow;
    if (((f->reasons & reason) != 0) == on)
        return;
    f->reasons ^= reason;
    if (reason == FLOW_CONSUMERS) {
        list_remove(&f->congested_link);
        if (on)
            list_push_back(&queue->vhost->broker->flow_congested, &f->congested_link);
    }
    f->congested = f->reasons != 0;
    if (!f->congested)
        release_ties(queue);
}

void flow_wait(struct connection *connection, uint16_t channel, struct queue *queue)
{
    ASSERT(queue->flow.congested);
    list_for_each(n, &connection->flow_ties) {
        struct flow_tie *t = CONTAINER_OF(n, struct flow_tie, conn_link);
        if (t->queue == queue && (!connection->cluster_peer || t->channel == channel))
            return; /* waits already (or was told already) */
    }
    struct flow_tie *tie = xcalloc(1, sizeof *tie);
    tie->queue = queue;
    tie->connection = connection;
    tie->channel = channel;
    list_push_back(&queue->flow.ties, &tie->queue_link);
    list_push_back(&connection->flow_ties, &tie->conn_link);
    if (connection->cluster_peer) {
        send_notice(connection, channel, queue, false);
        return;
    }
    /* Its own consumer would wait too (its acks unread): the queue could
     * not drain. Remembered, so the next publish does not ask again. */
    tie->exempt = channels_consume_from(connection, queue);
    if (tie->exempt)
        return;
    if (connection->flow_waits++ == 0) {
        connection->broker->counters.flow_stops++;
        conn_pause_reading(&connection->conn, CONN_PAUSE_QUEUE);
    }
}

void flow_connection_release(struct connection *connection)
{
    while (!list_empty(&connection->flow_ties))
        untie(CONTAINER_OF(connection->flow_ties.next, struct flow_tie, conn_link), false);
}

bool flow_connection_waits(const struct connection *connection)
{
    return connection->flow_waits > 0;
}

/* ---- a queue's excess ------------------------------------------------ */

void flow_queue_published(struct queue *queue, uint64_t bytes)
{
    struct queue_flow *f = &queue->flow;
    if (queue->consumers_count == 0 || f->stalled)
        return; /* a buffer */
    f->excess++;
    f->excess_bytes += bytes;
    if (!f->congested && (f->excess > high_mark(f) || f->excess_bytes > high_mark_bytes(f))) {
        if (f->last_take_ms == 0)
            f->last_take_ms = loop_now(queue); /* the stall clock starts here */
        set_reason(queue, FLOW_CONSUMERS, true);
    }
}

static void measure(struct queue_flow *f, uint64_t bytes, uint64_t now)
{
    if (f->window_start_ms == 0)
        f->window_start_ms = now;
    f->window_taken++;
    f->window_bytes += bytes;
    uint64_t elapsed = now - f->window_start_ms;
    if (elapsed < FLOW_RATE_WINDOW_MS)
        return;
    uint64_t rate = f->window_taken * 1000 / elapsed;
    uint64_t byte_rate = f->window_bytes * 1000 / elapsed;
    f->rate = f->rate ? (f->rate + rate) / 2 : rate;
    f->byte_rate = f->byte_rate ? (f->byte_rate + byte_rate) / 2 : byte_rate;
    f->window_start_ms = now;
    f->window_taken = 0;
    f->window_bytes = 0;
}

void flow_queue_taken(struct queue *queue, uint64_t bytes)
{
    struct queue_flow *f = &queue->flow;
    uint64_t now = loop_now(queue);
    f->last_take_ms = now;
    f->stalled = false; /* its consumers are back: the excess counts again */
    measure(f, bytes, now);
    f->excess = f->excess > 0 ? f->excess - 1 : 0;
    f->excess_bytes = f->excess_bytes > bytes ? f->excess_bytes - bytes : 0;
    if ((f->reasons & FLOW_CONSUMERS) && f->excess <= high_mark(f) / 2 &&
        f->excess_bytes <= high_mark_bytes(f) / 2)
        set_reason(queue, FLOW_CONSUMERS, false);
}

void flow_queue_unconsumed(struct queue *queue)
{
    struct queue_flow *f = &queue->flow;
    f->excess = 0;
    f->excess_bytes = 0;
    f->stalled = false;
    set_reason(queue, FLOW_CONSUMERS, false);
}

void flow_queue_release(struct queue *queue)
{
    struct queue_flow *f = &queue->flow;
    f->excess = 0;
    f->excess_bytes = 0;
    set_reason(queue, FLOW_CONSUMERS, false);
    set_reason(queue, FLOW_BACKUPS, false);
    set_reason(queue, FLOW_PRIMARY, false);
    ASSERT(list_empty(&f->ties) && list_empty(&f->congested_link));
}

void flow_queue_hold(struct queue *queue, enum flow_reason reason, bool on)
{
    ASSERT(reason == FLOW_BACKUPS || reason == FLOW_PRIMARY);
    ASSERT(reason != FLOW_PRIMARY || queue_is_remote(queue));
    set_reason(queue, reason, on);
}

void flow_tick(struct broker *broker, uint64_t now_ms)
{
    list_for_each_safe(n, &broker->flow_congested) {
        struct queue *queue = CONTAINER_OF(n, struct queue, flow.congested_link);
        struct queue_flow *f = &queue->flow;
        if (now_ms - f->last_take_ms < FLOW_STALL_MS)
            continue;
        LOG_DEBUG("queue %.*s: consumers took nothing for %llu ms: flow off",
                  (int)queue->name.len, (const char *)queue->name.ptr,
                  (unsigned long long)(now_ms - f->last_take_ms));
        f->stalled = true;
        f->excess = 0;
        f->excess_bytes = 0;
        set_reason(queue, FLOW_CONSUMERS, false);
    }
}
