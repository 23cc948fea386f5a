/*
 * flow.h: flow control per publishing connection.
 *
 * A queue exists to buffer, so a backlog alone never slows anyone: a queue
 * without consumers takes publishes up to its length limits and the
 * memory and disk alarms (alarm.h). What flow control bounds is the rate
 * mismatch of a queue that is being consumed: what was published to it,
 * since it got consumers, beyond what they took (the excess; it never
 * goes below 0, so a fast consumer banks no credit). Once the excess
 * passes the queue's high mark the queue is congested, and each
 * connection that publishes to it is not read until the excess falls
 * below the low mark (half the high). Other connections go on. The high
 * mark follows the consumers: FLOW_TARGET_MS worth of what they took
 * lately, never under FLOW_MIN_MESSAGES (and FLOW_MIN_BYTES), so a
 * healthy stream, whose excess only jitters, is never stopped, and a
 * stopped publisher's queue never runs dry before it is read again.
 *
 * Consumers that took nothing for FLOW_STALL_MS (stuck, or waiting for
 * their own connection, which is not read) make the queue a buffer
 * again: its publishers go on, and the excess counts from 0. A connection
 * that consumes from the queue it publishes to is never stopped for it:
 * its acks would wait with its publishes, and the queue could not drain.
 *
 * A queue with backups is congested too while a backup owes answers for
 * more than FLOW_BACKUP_MESSAGES of its replication stream (a slow
 * backup slows the publishers, not the broker's memory). That bound is
 * below what a proxy forwards unanswered before it stops all its
 * publishers (MEMBER_FORWARD_HIGH_BYTES, for 1 KiB messages), so only
 * this queue's publishers wait.
 *
 * Through a cluster: a publish that reaches a congested queue from
 * another broker (a forward over its link) cannot stop that link, which
 * carries every other queue's traffic and the acks that drain this one.
 * The primary tells the forwarding broker instead (basic.quay-flow,
 * active=false, once per queue and link channel), whose stand-in of the
 * queue is then congested, so that broker's publishers to it wait; the
 * primary says active=true when the queue drains (or goes). A stand-in
 * whose primary changed, or whose link went down, forgets what it was
 * told (flow_queue_hold).
 *
 * Ownership: a tie (connection waits for queue) belongs to both and goes
 * with whichever goes first: the queue (flow_queue_release, on delete or
 * free) or the connection (flow_connection_release, on close). Ties hold
 * no references.
 */
#ifndef QUAY_BROKER_FLOW_H
#define QUAY_BROKER_FLOW_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/list.h"

struct broker;
struct connection;
struct queue;

#define FLOW_TARGET_MS 20          /* the high mark: this long of the consumers' rate */
#define FLOW_MIN_MESSAGES 2000     /* ... but never fewer messages */
#define FLOW_MIN_BYTES (8u << 20)  /* ... or bytes */
#define FLOW_STALL_MS 1000         /* consumers that took nothing this long: a buffer */
#define FLOW_RATE_WINDOW_MS 100    /* the consumers' rate is measured over windows */
#define FLOW_BACKUP_MESSAGES 2048  /* replicated, unanswered by a backup (replication.c) */

/* Why a queue is congested (any of them). */
enum flow_reason {
    FLOW_CONSUMERS = 1u << 0,      /* its publishers outrun its consumers */
    FLOW_BACKUPS = 1u << 1,        /* its backups have not answered FLOW_BACKUP_MESSAGES */
    FLOW_PRIMARY = 1u << 2,        /* a stand-in: its primary said so (basic.quay-flow) */
};

/* A queue's side (struct queue.flow). */
struct queue_flow {
    uint64_t excess;               /* messages published beyond what consumers took */
    uint64_t excess_bytes;
    uint64_t rate;                 /* messages taken per second, smoothed */
    uint64_t byte_rate;
    uint64_t window_start_ms;
    uint64_t window_taken, window_bytes;
    uint64_t last_take_ms;
    bool congested;                /* reasons != 0 */
    uint8_t reasons;               /* enum flow_reason bits */
    bool stalled;                  /* its consumers took nothing for FLOW_STALL_MS: a buffer */
    struct list_node ties;         /* struct flow_tie.queue_link: who waits */
    struct list_node congested_link; /* in broker->flow_congested while FLOW_CONSUMERS */
};

/* A connection's side (struct connection.flow_ties and flow_waits). */
void flow_queue_init(struct queue *queue);
void flow_connection_init(struct connection *connection);

/* A message entered the queue (local, consumed or not). */
void flow_queue_published(struct queue *queue, uint64_t bytes);
/* A message left the ready set for a consumer or a get. */
void flow_queue_taken(struct queue *queue, uint64_t bytes);
/* The queue lost its last consumer: a buffer again. */
void flow_queue_unconsumed(struct queue *queue);
/* Whoever waits for the queue goes on (the queue is deleted or freed). */
void flow_queue_release(struct queue *queue);
/* A reason other than FLOW_CONSUMERS (which is the queue's own) starts or
 * ends: FLOW_BACKUPS from the queue's replication, FLOW_PRIMARY for a
 * stand-in whose primary said so (or whose word no longer holds: another
 * primary, a lost link). */
void flow_queue_hold(struct queue *queue, enum flow_reason reason, bool on);

/* connection published to queue on channel and the queue is congested:
 * a client's connection is not read until every queue it waits for is
 * drained; a peer broker's link is told instead (basic.quay-flow). */
void flow_wait(struct connection *connection, uint16_t channel, struct queue *queue);
/* The connection goes: it waits for nothing any more. */
void flow_connection_release(struct connection *connection);
/* Whether the connection is not read because of flow (the API's "flow"). */
bool flow_connection_waits(const struct connection *connection);

/* Every tick: congested queues whose consumers stalled become buffers. */
void flow_tick(struct broker *broker, uint64_t now_ms);

#endif
