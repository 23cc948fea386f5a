/*
 * placement.h: where queues live. A consistent-hashing ring of the brokers
 * that are up, with bounded loads, picks a queue's primary and backups, and
 * a rebalance planner moves as few queues as possible to bring every broker
 * within the bound.
 *
 * Owns the ring (virtual nodes per broker) and a working copy of the
 * per-broker load counts, so that a batch of decisions stays balanced
 * before any of them is committed. Pure: no I/O, no clock, no randomness;
 * the same map gives the same answers on every broker and every run (the
 * hash is a fixed function, unlike lib/hash.h's seeded one).
 *
 * Must never change the map: decisions become commands (map.h) that the
 * caller proposes. Placement runs on the proposing broker only, so it is
 * not part of the replicated state machine and may evolve between versions.
 */
#ifndef QUAY_CLUSTER_PLACEMENT_H
#define QUAY_CLUSTER_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/map.h"

#define PLACEMENT_VIRTUAL_NODES_DEFAULT 128
#define PLACEMENT_EPSILON_PERMILLE_DEFAULT 100 /* bound = ceil(avg * 1.10) */

struct placement_config {
    uint32_t virtual_nodes_count; /* per broker, 1..1024 */
    uint32_t epsilon_permille;    /* allowed excess over the average, in 1/1000 */
};

void placement_config_default(struct placement_config *config);

struct placement_vnode {
    uint64_t hash;
    uint8_t slot; /* index into struct placement's brokers */
};

/*
 * A view of the map for a batch of decisions. Owned by its caller; borrows
 * the map, which must not change while the view is used (refresh after
 * applying commands).
 */
struct placement {
    struct placement_config config;
    const struct cluster_map *map; /* borrowed */
    uint64_t brokers_version;      /* of the map the ring was built from */
    uint32_t brokers_count;        /* brokers that take new work: state up */
    uint32_t broker_ids[CLUSTER_BROKERS_MAX];
    uint32_t owned[CLUSTER_BROKERS_MAX]; /* queues owned, updated by decisions */
    uint32_t held[CLUSTER_BROKERS_MAX];  /* backups held, updated by decisions */
    struct placement_vnode *ring;        /* owned, sorted by hash */
    uint32_t ring_count;
};

void placement_init(struct placement *p, const struct placement_config *config);
void placement_free(struct placement *p);
/* Takes the map's current brokers and counts; rebuilds the ring only when
 * the brokers changed (map->brokers_version). O(brokers) otherwise. */
void placement_refresh(struct placement *p, const struct cluster_map *map);

/* The stable hash of a queue's identity (vhost and name). */
uint64_t placement_queue_hash(struct bytes vhost, struct bytes name);

/* Fills slots[0..brokers_count) with the up brokers in the queue's ring
 * order (its preference list); returns brokers_count. */
uint32_t placement_preference(const struct placement *p, uint64_t queue_hash, uint8_t *slots);

struct placement_result {
    uint32_t primary_id;
    uint32_t backup_ids[CLUSTER_BACKUPS_MAX];
    uint8_t backups_count; /* min(replication_factor - 1, brokers up - 1) */
};

/* Where a new queue's primary goes. */
enum placement_primary {
    PLACEMENT_PRIMARY_RING,  /* the ring's choice, within the load bound */
    PLACEMENT_PRIMARY_AT,    /* broker_id (a queue that stays with its connection) */
    PLACEMENT_PRIMARY_AVOID, /* the ring's choice among the brokers up other than
                              * broker_id; broker_id itself when it is the only one */
};

/*
 * Places a new queue: the first broker of its preference list that is not
 * over the bound becomes primary (as `how` and broker_id say), the next
 * ones backups (each skipping brokers over their own backup bound).
 * Counts the result in the view. OK, or E_LIMIT when no broker is up.
 */
int placement_place_queue(struct placement *p, struct bytes vhost, struct bytes name,
                          uint8_t replication_factor, enum placement_primary how,
                          uint32_t broker_id, struct placement_result *out);

/* One more backup for a queue, never one of exclude[] (pass its primary and
 * current backups). Counts it in the view. BROKER_ID_NONE if none fits. */
uint32_t placement_pick_backup(struct placement *p, struct bytes vhost, struct bytes name,
                               const uint32_t *exclude, uint32_t exclude_count);

/* An owner for an exchange definition (ring order, no bound: exchanges
 * cost nothing to own). BROKER_ID_NONE if no broker is up. */
uint32_t placement_pick_owner(const struct placement *p, struct bytes vhost, struct bytes name);

/* Bounds for n brokers sharing total items: lo = floor(avg * (1 - eps)),
 * hi = ceil(avg * (1 + eps)) (at least 1). */
void placement_bounds(const struct placement_config *config, uint64_t total, uint32_t n,
                      uint32_t *lo, uint32_t *hi);

enum placement_move_kind {
    PLACEMENT_MOVE_PRIMARY, /* the queue's primary becomes to_id */
    PLACEMENT_MOVE_BACKUP,  /* backup from_id (NONE: a missing one) is replaced by to_id
                             * (NONE: from_id only leaves, the others are enough) */
};

struct placement_move {
    enum placement_move_kind kind;
    struct map_queue *queue; /* borrowed from the map */
    uint32_t from_id;
    uint32_t to_id;
    bool mandatory; /* off a draining or down broker, or restoring the factor */
};

struct placement_plan {
    struct placement_move *moves; /* owned */
    uint32_t count;
    uint32_t cap;
    uint32_t primary_moves_count;
    uint32_t backup_moves_count;
};

void placement_plan_init(struct placement_plan *plan);
void placement_plan_free(struct placement_plan *plan);

/*
 * Plans at most moves_max moves, at most one per queue, in this order:
 * primaries off draining brokers; primaries from brokers over the bound (or
 * to brokers under it), preferring each queue's ring order so that a
 * joining broker takes the queues that hash to it; then backups off
 * draining or down brokers, missing backups, and backup balance the same
 * way. Only available, non-exclusive queues move. The plan is a target:
 * the controller turns it into commands over several rounds (a new primary
 * first becomes an in-sync backup). OK.
 */
int placement_rebalance_plan(const struct cluster_map *map, const struct placement_config *config,
                             uint32_t moves_max, struct placement_plan *plan_out);

#endif
