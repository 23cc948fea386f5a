/*
 * visible.h: a definition change is answered once every broker applied it.
 *
 * A broker answers a client's declare, delete, bind or unbind when the map
 * command is applied here. The other brokers apply it a moment later (when
 * they hear it is committed), and a client told of the change (by the
 * client that made it) could meanwhile publish to the new queue, or
 * declare it passively, through one of them and find nothing: one broker
 * never does that, and RabbitMQ commits its metadata on every node before
 * it answers. So before the answer, the broker asks each peer it has a link
 * to for the version (basic.quay-sync with answer set on the peer's map
 * channel; the peer answers basic.quay-synced once its map is there) and
 * waits for all of them, at most VISIBLE_WAIT_MS: a peer that does not
 * answer by then, or whose link goes down, is not waited for (it is
 * stalled or cut off, and learns the map when it is back).
 */
#ifndef QUAY_CLUSTER_VISIBLE_H
#define QUAY_CLUSTER_VISIBLE_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/list.h"

struct member;
struct member_peer;

#define VISIBLE_WAIT_MS 2000

/* The caller's. done runs once (from a link or timer callback) unless
 * visible_cancel came first. */
struct visible_wait {
    struct list_node link; /* in member->visible_waits */
    uint64_t version;
    uint64_t deadline_ms;
    void (*done)(struct visible_wait *w);
};

/* False: every peer we reach has applied version already (nothing to wait
 * for, done will not run). */
bool visible_wait(struct member *member, struct visible_wait *w, uint64_t version);
void visible_cancel(struct visible_wait *w);

/* The member's: a peer's basic.quay-synced, its link or map channel gone,
 * the periodic tick (late waits), and the member stopping (every wait
 * done). */
void visible_peer_answered(struct member_peer *peer, uint64_t version);
void visible_peer_lost(struct member_peer *peer);
void visible_tick(struct member *member);
void visible_stop(struct member *member);

#endif
