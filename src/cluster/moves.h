/*
 * moves.h: planned moves of queues, as the management API asks for them
 * and shows them. The map holds each move (map_queue.move_to); the primary
 * carries it out (handover.h).
 */
#ifndef QUAY_CLUSTER_MOVES_H
#define QUAY_CLUSTER_MOVES_H

#include <stdbool.h>
#include <stddef.h>

#include "cluster/map.h"

struct json;
struct map_cmd;
struct member;

/* What POST /api/cluster/move answers once the map has the move. */
struct move_answer {
    bool backup;   /* a backup move (backup_of), else the primary's */
    bool catch_up; /* the target is not an in-sync backup: caught up first */
    char vhost[CLUSTER_NAME_SIZE_MAX + 1];
    char queue[CLUSTER_NAME_SIZE_MAX + 1];
    char from[CLUSTER_NAME_SIZE_MAX + 1];
    char to[CLUSTER_NAME_SIZE_MAX + 1];
};

/* POST /api/cluster/move {"vhost": V, "queue": Q, "to": BROKER[, "backup_of":
 * BROKER]}: checks the request against this broker's map and builds the
 * planned move (queue.move) into cmd and what to answer into answer:
 * returns 0, and body holds an unfinished object the caller discards; or
 * refuses (400 malformed, 404 no such queue or broker, 409 the broker
 * cannot take it now, 503 the cluster is not served yet) with the error
 * in body, and nothing to submit. The management API (mgmt/api_moves.c)
 * submits cmd and answers 202 once this broker applied it, so that a GET
 * of /api/cluster that follows shows the move. */
int moves_prepare(struct member *member, const char *request, size_t request_size,
                  struct json *body, struct move_answer *answer, struct map_cmd *cmd);
/* {"kind", "vhost", "queue", "from", "to", "catch_up"}: the 202's body. */
void moves_write_answer(const struct move_answer *answer, struct json *body);

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
