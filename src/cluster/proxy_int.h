/*
 * proxy_int.h: what proxy.c and forward.c share. Not for other modules.
 */
#ifndef QUAY_CLUSTER_PROXY_INT_H
#define QUAY_CLUSTER_PROXY_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "broker/queue.h"
#include "lib/assert.h"
#include "lib/list.h"

struct confirm_sink;
struct member;
struct member_peer;
struct message;
struct replica;
struct uplink;

/* A publish for a stand-in whose primary cannot be reached right now, kept
 * (with its publisher's confirm waiting) until the map says where the
 * queue lives: then it is sent there, or nacked if nobody has the queue. */
/* A forward's origin (broker/origin.h): the stream and link sequence number
 * it was first sent under; {0, 0} until then. A resend keeps it, so the
 * primary can tell a forward it already took. */
struct forward_origin {
    uint64_t stream, seq;
};

struct held_forward {
    struct message *message;      /* one reference */
    struct confirm_sink *sink;    /* one reference, or NULL */
    uint64_t seq;
    bool dead_lettered;
    struct forward_origin origin;
};

/* The proxy state of a stand-in; owned by its queue (queue->remote). */
struct proxy_stub {
    struct queue *queue;          /* borrowed: the stand-in that owns this */
    struct member *member;        /* borrowed */
    struct list_node member_link; /* in member->stubs */
    uint32_t primary_id;
    uint64_t epoch;
    uint64_t map_version;         /* of our map when the queue was made or last moved */
    bool available;
    bool adopting;                /* proxy_stub_adopt_consumers: no consume-ok owed */
    /* Peers' consumers a planned handover left here (proxy_stub_adopt_
     * consumers): given no uplink, as each peer cancels them itself once
     * it applies the handover and consumes at the new primary directly;
     * an uplink here would take messages for a consumer about to go, and
     * give them back flagged redelivered. Borrowed, until removed. */
    struct consumer **parked;     /* owned array */
    uint32_t parked_count, parked_cap;
    struct list_node uplinks;     /* struct uplink.stub_link */
    uint32_t next_uplink_id;
    struct uplink *getter;        /* basic.get's uplink, or NULL */
    uint64_t getter_used_ms;      /* its last request (loop time): idle ones close */
    struct list_node waiting_ops; /* struct queue_remote_op waiting for the primary's link */
    struct replica *replica;      /* owned: our copy, when we are a backup (replica.h) */
    struct held_forward *held;    /* owned ring: publishes waiting for a primary */
    uint32_t held_head, held_count, held_cap;
    /* Forwards naming this stand-in not answered yet, and whether new
     * publishes wait for them all (held) before they go: after a planned
     * handover, those the old primary answers (it passes them on) would
     * otherwise arrive after newer ones sent to the new primary. */
    uint32_t forwards_out;
    bool draining;
};

static inline struct proxy_stub *stub_of(struct queue *queue)
{
    ASSERT(queue->remote != NULL);
    return queue->remote;
}

/* forward.c */
/* remote_ops->forward (queue.h): publishes routed to stand-ins, forwarded
 * to their primaries (one copy per primary broker), or held while none
 * can be reached. */
struct queue_forward;
void forward__stubs(struct queue *const *queues, uint32_t count, struct queue_forward *fwd);
/* The held publishes: sent to the primary the stand-in now names (send),
 * or nacked. */
void forward__release_held(struct queue *queue, bool send);
/* The link to peer is gone: its forwards in flight are held for a resend
 * (a replication is nacked) and its channels forgotten. */
void forward__peer_down(struct member_peer *peer);
/* The queue's primary changed: forwards still unanswered by the old one
 * are held for the new one (a primary cut off silently would keep them
 * until its link timed out; if it did take one, the copy is a duplicate). */
void forward__redirect(struct queue *queue, uint32_t old_primary_id);
/* A planned handover: publishes wait until the forwards to the old
 * primary are answered (true: there are some). */
bool forward__drain(struct queue *queue);

#endif
