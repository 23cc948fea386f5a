/*
 * moves.h: planned moves of queues, as the management API asks for them
 * and shows them. The map holds each move (map_queue.move_to); the primary
 * carries it out (handover.h).
 */
#ifndef QUAY_CLUSTER_MOVES_H
#define QUAY_CLUSTER_MOVES_H

#include <stddef.h>

struct json;
struct member;

/* POST /api/cluster/move {"vhost": V, "queue": Q, "to": BROKER}: starts a
 * planned move (queue.move) and answers 202 with what it started, or
 * refuses (400 malformed, 404 no such queue or broker, 409 the broker
 * cannot take it now, 503 the cluster is not served yet) and changes
 * nothing. ctx: the member. */
int moves_post(void *ctx, const char *request, size_t request_size, struct json *body);

/* POST /api/cluster/drain {"broker": NAME}: marks the broker draining
 * (broker.state); the controller then moves every primary and backup off
 * it (controller_drain_step: handovers, replacements caught up first) and
 * it may leave once it holds nothing. 202 with what it holds; 404 unknown,
 * 409 down or suspect (forget it), or too few other brokers up for the
 * factors of its queues; 400 malformed; 503 not serving yet. */
int moves_drain_post(void *ctx, const char *request, size_t request_size, struct json *body);

/* POST /api/cluster/revive {"broker": NAME}: a draining broker is up again
 * (broker.state): the moves off it stop where they are, and a rebalance may
 * give it queues again. 202 with what it holds; 404 unknown, 409 not
 * draining, 400 malformed, 503 not serving yet. */
int moves_revive_post(void *ctx, const char *request, size_t request_size, struct json *body);

/* POST /api/cluster/offload {"broker": B, "to": T, "percent": 1..100 | "queues":
 * REGEX [, "vhost": V]}: moves (queue.move, each a planned handover) the
 * queues B is primary of whose names match REGEX (in V, if given), or
 * percent of them (rounded up; those T holds in sync first), to T. Queues
 * that cannot move now (unavailable, exclusive, moving already, T not a
 * backup and no room for one more) are skipped. 202 with the counts; 400
 * malformed, 404 unknown broker, 409 T not up or B itself; 503 not serving
 * yet. With automatic rebalancing on, a rebalance may move back what an
 * offload leaves beyond the brokers' shares. */
int moves_offload_post(void *ctx, const char *request, size_t request_size, struct json *body);

/* POST /api/cluster/rebalance: {} (or no body) starts one rebalance, which
 * runs until nothing is left to move (the map's mode becomes "once", then
 * "off"; nothing changes while it is "auto"); {"auto": true|false} turns
 * automatic rebalancing on or off for the cluster. 202 with the mode and
 * the moves a round would plan now; 400 malformed; 503 not serving yet. */
int moves_rebalance_post(void *ctx, const char *request, size_t request_size, struct json *body);

/* /api/cluster's "rebalance" (the map's mode) and "moves": every move in
 * progress, its kind (primary, backup) and phase ("catching-up" while the
 * target is a backup not in sync yet, then "handing-over", or "releasing"
 * for a backup move), and on the primary's broker the catch-up's progress
 * (caught_up_bytes, caught_up_messages of catch_up_messages). */
void moves_write_json(struct member *member, struct json *body);

#endif
