/*
 * queue_walk.h: a walk over every queue of a broker that may stop between
 * loop turns and go on later, while queues are declared and deleted in
 * between: GET /metrics writes 50,000 queues a slice at a time so that
 * the message path never waits for the whole (mgmt/metrics.c).
 *
 * A hash table's slot index is no cursor: a put may grow and rehash the
 * table and a delete shifts entries back, so a walk resumed by index
 * could skip queues or see one twice. The walk follows
 * broker->queues_all instead, a list every queue object joins when it
 * first enters a vhost's table and leaves only when it is freed, and the
 * walk holds a reference on the queue it stands on. So that queue is
 * never freed under it, and stays linked (deleted or not), and its
 * successor in the list is where the walk goes on. Deleted queues are
 * passed over.
 *
 * What a walk sees: every queue that was in a vhost's table when the walk
 * began and is not deleted by the time the walk reaches it, each once, in
 * the order they joined. Queues that join after it began (declared, or a
 * queue's object replaced, as a cluster does when this broker stops or
 * starts being its primary) are not visited: they are at the list's tail,
 * after every queue the walk owes, so it stops at the first of them. A
 * queue is read when the walk reaches it, not all at one instant.
 *
 * Owned by its user; the loop thread only. A walk must end
 * (queue_walk_end) before the broker frees its queues.
 */
#ifndef QUAY_BROKER_QUEUE_WALK_H
#define QUAY_BROKER_QUEUE_WALK_H

#include <stdbool.h>
#include <stdint.h>

struct broker;
struct queue;

struct queue_walk {
    struct broker *broker;  /* borrowed */
    struct queue *at;       /* referenced: the queue last returned, or NULL */
    uint64_t serial_last;   /* queues that joined after this one are not visited */
    bool done;
};

void queue_walk_begin(struct queue_walk *walk, struct broker *broker);
/* The walk's next queue (live: not deleted), or NULL once there is none.
 * It stays valid until the next call or queue_walk_end, across loop turns
 * too: the walk holds a reference on it. */
struct queue *queue_walk_next(struct queue_walk *walk);
/* Drops the walk's reference. Idempotent; the walk is done afterwards. */
void queue_walk_end(struct queue_walk *walk);

#endif
