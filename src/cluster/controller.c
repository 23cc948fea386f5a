/*
 * controller.c: liveness, failover, return, rebalancing and draining as
 * functions from the map to commands. See controller.h for the rules.
 *
 * Owns nothing that outlives a call. Must never read a clock, do I/O or
 * change the map; decisions are batched per call and use a placement view
 * whose counts follow the batch, so a batch stays balanced before any of it
 * is committed.
 */
#include "cluster/controller.h"

#include <string.h>

#include "broker/policy.h"
#include "lib/assert.h"
#include "lib/errors.h"

void controller_config_default(struct controller_config *config)
{
    config->suspect_after_ms = 1000;
    config->down_after_ms = 2000;
    config->default_backups = 1;
    placement_config_default(&config->placement);
}

static void push(struct map_cmd_list *out, int rc, struct map_cmd *cmd)
{
    /* Controller commands are small: only a bug can make one exceed the limit. */
    ASSERT(rc == OK);
    map_cmd_list_push(out, cmd);
}

/* ---- (a) liveness --------------------------------------------------------- */

static enum broker_state next_state(enum broker_state state, uint64_t silence_ms, bool reset,
                                    const struct controller_config *config)
{
    bool down = reset || silence_ms >= config->down_after_ms;
    bool suspect = silence_ms >= config->suspect_after_ms;
    switch (state) {
    case BROKER_STATE_UP: return down ? BROKER_STATE_DOWN : suspect ? BROKER_STATE_SUSPECT : state;
    case BROKER_STATE_SUSPECT: return down ? BROKER_STATE_DOWN : suspect ? state : BROKER_STATE_UP;
    case BROKER_STATE_DRAINING: return down ? BROKER_STATE_DOWN : state;
    case BROKER_STATE_DOWN: return down || suspect ? state : BROKER_STATE_UP;
    }
    return state;
}

/* Why next_state went to s: the log's and the events' reason. */
static enum map_reason state_reason(const struct controller_heard *heard, enum broker_state s,
                                    uint64_t silence_ms, const struct controller_config *config)
{
    if (s == BROKER_STATE_UP)
        return MAP_REASON_HEARD;
    if (s == BROKER_STATE_DOWN && silence_ms < config->down_after_ms && heard->connection_reset)
        return heard->stopping ? MAP_REASON_STOPPED : MAP_REASON_RESET;
    return MAP_REASON_SILENCE;
}

int controller_check_liveness(const struct cluster_map *map, const struct controller_config *config,
                              const struct controller_heard *heard, uint32_t heard_count,
                              uint64_t now_ms, struct map_cmd_list *out)
{
    ASSERT(config->suspect_after_ms <= config->down_after_ms);
    ASSERT(heard != NULL || heard_count == 0);
    for (uint32_t i = 0; i < heard_count; i++) {
        const struct map_broker *b = cluster_map_broker(map, heard[i].broker_id);
        if (b == NULL)
            continue;
        /* A timestamp from the future (clock step) counts as just heard. */
        uint64_t last = heard[i].last_heard_ms;
        uint64_t silence = now_ms > last ? now_ms - last : 0;
        enum broker_state s = next_state(b->state, silence, heard[i].connection_reset, config);
        if (s == b->state)
            continue;
        struct map_cmd cmd;
        push(out, map_cmd_broker_state_why(&cmd, b->id, s, state_reason(&heard[i], s, silence,
                                                                          config), silence),
             &cmd);
    }
    return OK;
}

int controller_check_incarnations(const struct cluster_map *map,
                                  const struct controller_heard *heard, uint32_t heard_count,
                                  struct map_cmd_list *out)
{
    ASSERT(heard != NULL || heard_count == 0);
    for (uint32_t i = 0; i < heard_count; i++) {
        const struct map_broker *b = cluster_map_broker(map, heard[i].broker_id);
        if (b == NULL || heard[i].incarnation == 0 || heard[i].incarnation == b->incarnation)
            continue;
        struct map_cmd cmd;
        int rc = map_cmd_broker_incarnation(&cmd, b->id, heard[i].incarnation);
        push(out, rc == OK ? map_cmd_set_reason(&cmd, MAP_REASON_RESTART) : rc, &cmd);
    }
    return OK;
}

/* ---- (b) failover --------------------------------------------------------- */

static bool alive(const struct cluster_map *map, uint32_t id)
{
    const struct map_broker *b = cluster_map_broker(map, id);
    return b != NULL && b->state != BROKER_STATE_DOWN;
}

static int slot_in(const struct placement *p, uint32_t id)
{
    for (uint32_t s = 0; s < p->brokers_count; s++) {
        if (p->broker_ids[s] == id)
            return (int)s;
    }
    return -1;
}

/* The backups of q that stay: alive and not `promoted`, in order; then
 * refilled from placement up to what the replication factor asks for.
 * Returns the count written to ids. */
static uint8_t refill_backups(struct placement *p, const struct map_queue *q, uint32_t primary,
                              uint32_t *ids)
{
    uint8_t n = 0;
    for (uint8_t i = 0; i < q->backups_count; i++) {
        uint32_t id = q->backup_ids[i];
        if (id != primary && alive(p->map, id))
            ids[n++] = id;
    }
    uint32_t wanted = q->replication_factor - 1u;
    while (n < wanted) {
        uint32_t exclude[1 + CLUSTER_BACKUPS_MAX] = {primary};
        memcpy(&exclude[1], ids, n * sizeof(uint32_t));
        uint32_t id = placement_pick_backup(p, q->vhost->name, q->name, exclude, 1u + n);
        if (id == BROKER_ID_NONE)
            break;
        ids[n++] = id;
    }
    ASSERT(n <= CLUSTER_BACKUPS_MAX);
    return n;
}

static bool same_ids(const uint32_t *a, uint8_t an, const uint32_t *b, uint8_t bn)
{
    return an == bn && memcmp(a, b, an * sizeof(uint32_t)) == 0;
}

/* The first in-sync backup to promote: one that is up, else one that is
 * draining (alive: it gives its queues away, but holds them), else one
 * that is at least not known to be down (suspect: fail_over_primary says
 * when that one waits). BROKER_ID_NONE if none. */
static uint32_t promotion_candidate(const struct cluster_map *map, const struct map_queue *q)
{
    static const enum broker_state preferred[] = {BROKER_STATE_UP, BROKER_STATE_DRAINING,
                                                  BROKER_STATE_SUSPECT};
    for (size_t k = 0; k < sizeof preferred / sizeof preferred[0]; k++) {
        for (uint8_t i = 0; i < q->backups_count; i++) {
            const struct map_broker *b = cluster_map_broker(map, q->backup_ids[i]);
            if ((q->in_sync_mask & (1u << i)) && b->state == preferred[k])
                return b->id;
        }
    }
    return BROKER_ID_NONE;
}

/* The sum of the queues owned over the view's brokers. */
static uint64_t owned_total(const struct placement *p)
{
    uint64_t n = 0;
    for (uint32_t s = 0; s < p->brokers_count; s++)
        n += p->owned[s];
    return n;
}

/* What the restarted broker heard of broker_id's process: 0 if nothing. */
static uint32_t heard_incarnation(const struct controller_heard *heard, uint32_t heard_count,
                                  uint32_t broker_id)
{
    for (uint32_t h = 0; h < heard_count; h++) {
        if (heard[h].broker_id == broker_id)
            return heard[h].incarnation;
    }
    return 0;
}

uint32_t controller_restart_successor(const struct cluster_map *map, const struct map_queue *q,
                                      const struct controller_heard *heard,
                                      uint32_t heard_count, uint64_t known_since,
                                      bool *wait)
{
    *wait = false;
    if (q->owned_since >= known_since || q->exclusive || !q->available ||
        q->taken_from != BROKER_ID_NONE)
        return BROKER_ID_NONE; /* (a takeover not said adopted: adoption_resume_leftovers) */
    static const enum broker_state preferred[] = {BROKER_STATE_UP, BROKER_STATE_DRAINING};
    for (size_t k = 0; k < sizeof preferred / sizeof preferred[0]; k++) {
        for (uint8_t i = 0; i < q->backups_count; i++) {
            const struct map_broker *b = cluster_map_broker(map, q->backup_ids[i]);
            if (!(q->in_sync_mask & (1u << i)) || b == NULL || b->state != preferred[k] ||
                b->incarnation == 0)
                continue;
            uint32_t incarnation = heard_incarnation(heard, heard_count, b->id);
            if (incarnation == b->incarnation)
                return b->id;
            *wait |= incarnation == 0;
        }
    }
    for (uint8_t i = 0; i < q->backups_count; i++) {
        const struct map_broker *b = cluster_map_broker(map, q->backup_ids[i]);
        *wait |= (q->in_sync_mask & (1u << i)) && b != NULL && b->state == BROKER_STATE_SUSPECT;
    }
    return BROKER_ID_NONE;
}

bool controller_restart_drops(const struct map_queue *q, uint32_t self_id,
                              uint64_t restart_version)
{
    return !q->durable && q->primary_id == self_id && q->owned_since <= restart_version;
}

/* backup, in sync, holds the transient messages of q only, and can read
 * the persistent ones in its primary's log (they share storage). */
static bool backup_reads_the_log(const struct cluster_map *map, const struct map_queue *q,
                                 uint32_t backup)
{
    const struct map_broker *primary = cluster_map_broker(map, q->primary_id);
    return q->durable && !q->exclusive && primary != NULL &&
           map_queue_replicates_transient_only(map, q) &&
           map_brokers_share_storage(primary, cluster_map_broker(map, backup));
}

bool controller_takes_over_with_replica(const struct cluster_map *map, const struct map_queue *q,
                                        uint32_t backup)
{
    const struct map_broker *dead = cluster_map_broker(map, q->primary_id);
    return dead != NULL && dead->state == BROKER_STATE_DOWN &&
           backup_reads_the_log(map, q, backup);
}

bool controller_restart_with_log(const struct cluster_map *map, const struct map_queue *q,
                                 uint32_t successor)
{
    return backup_reads_the_log(map, q, successor);
}

uint32_t controller_takeover_target(struct placement *p, const struct map_queue *q)
{
    const struct map_broker *dead = cluster_map_broker(p->map, q->primary_id);
    if (!q->durable || q->exclusive || dead == NULL || dead->state != BROKER_STATE_DOWN ||
        dead->storage_id.len == 0 || p->brokers_count == 0)
        return BROKER_ID_NONE;
    uint8_t pref[CLUSTER_BROKERS_MAX];
    placement_preference(p, placement_queue_hash(q->vhost->name, q->name), pref);
    uint32_t lo, hi;
    placement_bounds(&p->config, owned_total(p) + 1, p->brokers_count, &lo, &hi);
    /* The ring's order among those that share the storage, under the
     * bound if one is; a queue back in service beats a perfect balance. */
    int chosen = -1;
    for (uint32_t k = 0; k < p->brokers_count; k++) {
        uint8_t s = pref[k];
        uint32_t id = p->broker_ids[s];
        if (map_queue_has_backup(q, id) ||
            !map_brokers_share_storage(dead, cluster_map_broker(p->map, id)))
            continue;
        if (p->owned[s] < hi) {
            chosen = s;
            break;
        }
        if (chosen < 0)
            chosen = s;
    }
    if (chosen < 0)
        return BROKER_ID_NONE;
    p->owned[chosen]++;
    return p->broker_ids[chosen];
}

/* A queue taken over from shared storage has no backups left: later gets
 * the ones its factor wants (epoch + 1: after the take-over). */
static void take_over(struct placement *p, const struct map_queue *q, uint32_t taker,
                      bool with_replica, struct map_cmd_list *out, struct map_cmd_list *later)
{
    struct map_cmd cmd;
    if (with_replica)
        push(out, map_cmd_queue_take_over_with_replica(&cmd, q->vhost->name, q->name, q->epoch,
                                                       taker, q->primary_id), &cmd);
    else
        push(out, map_cmd_queue_take_over(&cmd, q->vhost->name, q->name, q->epoch, taker,
                                          q->primary_id), &cmd);
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = 0;
    while (n + 1u < q->replication_factor) {
        uint32_t exclude[1 + CLUSTER_BACKUPS_MAX] = {taker};
        memcpy(&exclude[1], ids, n * sizeof(uint32_t));
        uint32_t id = placement_pick_backup(p, q->vhost->name, q->name, exclude, 1u + n);
        if (id == BROKER_ID_NONE)
            break;
        ids[n++] = id;
    }
    if (n > 0)
        push(later, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch + 1, ids,
                                              n), &cmd);
}

/* out gets the promotion; later the backups that restore the factor.
 * A candidate the leader suspects (silent, not yet down) waits, unless the
 * primary is gone for good (forgotten: the best copy there will be): it
 * may have died, and promoting it would depose the primary, which is only
 * down as far as the leader hears (a cut may hide it) and holds what was
 * confirmed, for a copy that would come back empty (a transient queue's
 * replica dies with its process). Within down_after - suspect_after the
 * candidate is heard again (repair promotes it: the queue is left
 * available, its primary down) or is down too (then the queue is marked
 * unavailable, and returns with its primary). Seed 2266 of the simulator:
 * its primary cut off from a new leader, its one in-sync backup killed 2 s
 * before, promoted as suspect, back empty. */
static void fail_over_primary(struct placement *p, const struct map_queue *q, bool forgotten,
                              struct map_cmd_list *out, struct map_cmd_list *later)
{
    struct map_cmd cmd;
    struct bytes vhost = q->vhost->name;
    if (q->exclusive && q->exclusive_owner_id == q->primary_id) {
        /* Its connection died with the primary. */
        push(out, map_cmd_queue_delete(&cmd, vhost, q->name, q->epoch), &cmd);
        return;
    }
    uint32_t next = promotion_candidate(p->map, q);
    if (next != BROKER_ID_NONE && !forgotten &&
        cluster_map_broker(p->map, next)->state == BROKER_STATE_SUSPECT)
        return;
    if (next != BROKER_ID_NONE && controller_takes_over_with_replica(p->map, q, next)) {
        int s = slot_in(p, next);
        if (s >= 0) {
            p->owned[s]++;
            p->held[s] -= p->held[s] > 0;
        }
        take_over(p, q, next, true, out, later);
        return;
    }
    uint32_t taker = next == BROKER_ID_NONE ? controller_takeover_target(p, q) : BROKER_ID_NONE;
    if (taker != BROKER_ID_NONE) {
        take_over(p, q, taker, false, out, later);
        return;
    }
    if (next == BROKER_ID_NONE) {
        if (q->available)
            push(out, map_cmd_queue_set_available(&cmd, vhost, q->name, q->epoch, false), &cmd);
        return;
    }
    push(out, map_cmd_queue_set_owner(&cmd, vhost, q->name, q->epoch, next), &cmd);
    int s = slot_in(p, next);
    if (s >= 0) {
        p->owned[s]++;
        p->held[s] -= p->held[s] > 0;
    }
    /* What set_owner leaves: the backups without the promoted one. */
    uint32_t left[CLUSTER_BACKUPS_MAX];
    uint8_t left_count = 0;
    for (uint8_t i = 0; i < q->backups_count; i++) {
        if (q->backup_ids[i] != next)
            left[left_count++] = q->backup_ids[i];
    }
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = refill_backups(p, q, next, ids);
    if (!same_ids(ids, n, left, left_count))
        push(later, map_cmd_queue_set_backups(&cmd, vhost, q->name, q->epoch + 1, ids, n), &cmd);
}

int controller_fail_over(const struct cluster_map *map, const struct controller_config *config,
                         uint32_t broker_id, struct map_cmd_list *out)
{
    ASSERT(map != NULL);
    ASSERT(out != NULL);
    const struct map_broker *dead = cluster_map_broker(map, broker_id);
    if (dead == NULL || dead->state != BROKER_STATE_DOWN)
        return OK;
    struct placement p;
    placement_init(&p, &config->placement);
    placement_refresh(&p, map);
    /* Every promotion first, the backups that restore factors after them:
     * the queues serve again as soon as the first third of a failover's
     * commands (of thousands of queues: tens of proposals) has committed.
     * Each queue's own commands keep their order (and epochs). */
    struct map_cmd_list later;
    map_cmd_list_init(&later);
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        if (q->exclusive && q->exclusive_owner_id == broker_id) {
            /* Its connection died with the broker, wherever the queue lives. */
            struct map_cmd cmd;
            push(out, map_cmd_queue_delete(&cmd, q->vhost->name, q->name, q->epoch), &cmd);
        } else if (q->primary_id == broker_id) {
            fail_over_primary(&p, q, false, out, &later);
        } else if (map_queue_has_backup(q, broker_id)) {
            uint32_t ids[CLUSTER_BACKUPS_MAX];
            uint8_t n = refill_backups(&p, q, q->primary_id, ids);
            struct map_cmd cmd;
            push(&later,
                 map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch, ids, n),
                 &cmd);
        }
    }
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        if (x->owner_id != broker_id)
            continue;
        uint32_t owner = placement_pick_owner(&p, x->vhost->name, x->name);
        if (owner == BROKER_ID_NONE)
            continue;
        struct map_cmd cmd;
        push(out, map_cmd_exchange_set_owner(&cmd, x->vhost->name, x->name, owner), &cmd);
    }
    for (uint32_t i = 0; i < later.count; i++)
        map_cmd_list_push(out, &later.items[i]);
    map_cmd_list_free(&later); /* (emptied commands) */
    placement_free(&p);
    return OK;
}

/* ---- (c) a broker returns ------------------------------------------------- */

int controller_broker_returned(const struct cluster_map *map, uint32_t broker_id,
                               struct map_cmd_list *out)
{
    ASSERT(map != NULL);
    ASSERT(broker_id != BROKER_ID_NONE);
    const struct map_broker *b = cluster_map_broker(map, broker_id);
    if (b == NULL || b->state != BROKER_STATE_UP)
        return OK;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        if (q->primary_id != broker_id || q->available)
            continue;
        struct map_cmd cmd;
        push(out, map_cmd_queue_set_available(&cmd, q->vhost->name, q->name, q->epoch, true),
             &cmd);
    }
    return OK;
}

/* ---- (c') repair ----------------------------------------------------------- */

static bool broker_down(const struct cluster_map *map, uint32_t id)
{
    const struct map_broker *b = cluster_map_broker(map, id);
    return b == NULL || b->state == BROKER_STATE_DOWN;
}

/* Whether the queue's backups need a change: one is down, or there are
 * fewer than the factor wants and a broker could take one. */
static bool backups_short(const struct cluster_map *map, const struct map_queue *q,
                          uint32_t usable)
{
    for (uint8_t i = 0; i < q->backups_count; i++) {
        if (broker_down(map, q->backup_ids[i]))
            return true;
    }
    uint32_t wanted = q->replication_factor - 1u;
    return q->backups_count < wanted && usable > 1u + q->backups_count;
}

static uint32_t usable_brokers(const struct cluster_map *map)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < map->brokers_count; i++)
        n += map->brokers[i]->state == BROKER_STATE_UP;
    return n;
}

/* A backup move whose new backup caught up: the one it replaces leaves
 * (map_queue.move_from; that set_backups ends the move). */
static void finish_backup_move(const struct map_queue *q, struct map_cmd_list *out)
{
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = 0;
    for (uint8_t b = 0; b < q->backups_count; b++) {
        if (q->backup_ids[b] != q->move_from)
            ids[n++] = q->backup_ids[b];
    }
    struct map_cmd cmd;
    push(out, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch, ids, n), &cmd);
}

/* A primary move whose switch would leave the queue with fewer copies in
 * sync than its factor (a draining old primary lets go of its own:
 * map_queue_switch_keeps_primary; a backup is out of sync): one more
 * backup joins, beyond the factor, and catches up before the handover
 * (which waits for it: map_queue_move_state). The ring's pick if one fits
 * its bounds, else any broker that is up: the move must not wait on the
 * balance (a rebalance evens it out later). */
static void add_move_backup(const struct cluster_map *map, struct placement *p,
                            const struct map_queue *q, struct map_cmd_list *out)
{
    ASSERT(q->backups_count < CLUSTER_BACKUPS_MAX);
    uint32_t exclude[1 + CLUSTER_BACKUPS_MAX] = {q->primary_id};
    memcpy(&exclude[1], q->backup_ids, q->backups_count * sizeof(uint32_t));
    uint32_t id = placement_pick_backup(p, q->vhost->name, q->name, exclude,
                                        1u + q->backups_count);
    for (uint32_t b = 0; b < map->brokers_count && id == BROKER_ID_NONE; b++) {
        const struct map_broker *broker = map->brokers[b];
        if (broker->state == BROKER_STATE_UP && broker->id != q->primary_id &&
            !map_queue_has_backup(q, broker->id))
            id = broker->id;
    }
    ASSERT(id != BROKER_ID_NONE); /* MAP_MOVE_NEEDS_BACKUP says there is one */
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    memcpy(ids, q->backup_ids, sizeof(ids));
    uint8_t n = q->backups_count;
    ids[n++] = id;
    struct map_cmd cmd;
    push(out, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch, ids, n), &cmd);
}

/* The placement view, made on first use in a sweep (*placed says so). */
static void lazy_placement(struct placement *p, bool *placed, const struct cluster_map *map,
                           const struct controller_config *config)
{
    if (*placed)
        return;
    placement_init(p, &config->placement);
    placement_refresh(p, map);
    *placed = true;
}

/* Whether the queue's primary has applied the change that made it so
 * (controller_round). Unknown (not heard, or no seen): settled. */
static bool primary_settled(const struct controller_observed *seen, const struct map_queue *q)
{
    for (uint32_t i = 0; seen != NULL && i < seen->heard_count; i++) {
        const struct controller_heard *h = &seen->heard[i];
        if (h->broker_id == q->primary_id)
            return h->map_version == 0 || (int32_t)(h->map_version - (uint32_t)q->owned_since) >= 0;
    }
    return true;
}

/* A switch kept the old primary of a queue without backups beyond the
 * factor (map_queue_switch_keeps_primary): it goes once the new primary
 * has applied the switch, whatever the rebalance mode. (Such a queue has
 * a backup outside a move for no other reason: a move's target joins
 * with move_to set, and the copy a move adds first to keep the factor,
 * add_move_backup, is for factors above 1.) */
static bool release_surplus(const struct map_queue *q, const struct controller_observed *seen,
                            struct map_cmd_list *out)
{
    if (q->replication_factor != 1 || q->backups_count == 0 || q->move_to != BROKER_ID_NONE ||
        q->move_from != BROKER_ID_NONE || !q->available || !primary_settled(seen, q))
        return false;
    struct map_cmd cmd;
    push(out, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch, NULL, 0), &cmd);
    return true;
}

static void repair(const struct cluster_map *map, const struct controller_config *config,
                   const struct controller_observed *seen, struct map_cmd_list *out);

int controller_repair(const struct cluster_map *map, const struct controller_config *config,
                      struct map_cmd_list *out)
{
    ASSERT(map != NULL);
    ASSERT(out != NULL);
    repair(map, config, NULL, out);
    return OK;
}

static void repair(const struct cluster_map *map, const struct controller_config *config,
                   const struct controller_observed *seen, struct map_cmd_list *out)
{
    uint32_t usable = usable_brokers(map);
    struct placement p;
    bool placed = false;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        if (q->move_from != BROKER_ID_NONE && map_queue_backup_in_sync(q, q->move_to) &&
            !broker_down(map, q->primary_id)) {
            finish_backup_move(q, out);
            continue;
        }
        if (!broker_down(map, q->primary_id) && release_surplus(q, seen, out))
            continue;
        if (!broker_down(map, q->primary_id) && q->available &&
            map_queue_move_state(map, q) == MAP_MOVE_NEEDS_BACKUP) {
            lazy_placement(&p, &placed, map, config);
            add_move_backup(map, &p, q, out);
            continue;
        }
        if (q->exclusive && broker_down(map, q->exclusive_owner_id)) {
            /* Its connection is gone with its broker (a failover that did
             * not finish, or a broker that left). */
            struct map_cmd cmd;
            push(out, map_cmd_queue_delete(&cmd, q->vhost->name, q->name, q->epoch), &cmd);
            continue;
        }
        bool primary_down = broker_down(map, q->primary_id);
        bool returned = !primary_down && !q->available &&
                        cluster_map_broker(map, q->primary_id)->state == BROKER_STATE_UP;
        bool refill = !primary_down && q->available && backups_short(map, q, usable);
        /* Unavailable for want of a broker sharing its storage, until now. */
        bool take = primary_down && !q->available && q->durable &&
                    cluster_map_broker(map, q->primary_id) != NULL &&
                    cluster_map_broker(map, q->primary_id)->storage_id.len > 0;
        if (!(primary_down && q->available) && !returned && !refill && !take)
            continue;
        lazy_placement(&p, &placed, map, config);
        if (primary_down) {
            fail_over_primary(&p, q, false, out, out); /* (a sweep: in order) */
            continue;
        }
        struct map_cmd cmd;
        uint64_t epoch = q->epoch;
        if (returned) { /* its new incarnation: epoch + 1 */
            push(out, map_cmd_queue_set_available(&cmd, q->vhost->name, q->name, epoch, true),
                 &cmd);
            epoch++;
        }
        uint32_t ids[CLUSTER_BACKUPS_MAX];
        uint8_t n = refill_backups(&p, q, q->primary_id, ids);
        if (!same_ids(ids, n, q->backup_ids, q->backups_count))
            push(out, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, epoch, ids, n),
                 &cmd);
    }
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        if (x->owner_id == BROKER_ID_NONE || !broker_down(map, x->owner_id))
            continue;
        lazy_placement(&p, &placed, map, config);
        uint32_t owner = placement_pick_owner(&p, x->vhost->name, x->name);
        struct map_cmd cmd;
        if (owner != BROKER_ID_NONE)
            push(out, map_cmd_exchange_set_owner(&cmd, x->vhost->name, x->name, owner), &cmd);
    }
    if (placed)
        placement_free(&p);
}

/* ---- (f) forgetting a dead broker ------------------------------------------ */

/* A queue whose only copies were on the forgotten broker: a new, empty
 * incarnation on the broker the ring picks (set_owner to a broker that is
 * not its backup makes it available, epoch + 1). Backups first (the
 * pick may be one of the backups out of sync, which set_owner refuses to
 * promote): the refill without it, then the owner. */
static bool start_again_empty(struct placement *p, const struct map_queue *q, uint32_t dead,
                              struct map_cmd_list *out)
{
    struct bytes vhost = q->vhost->name;
    struct placement_result r; /* the ring's primary among the brokers up (counted) */
    if (placement_place_queue(p, vhost, q->name, 1, PLACEMENT_PRIMARY_RING, BROKER_ID_NONE,
                              &r) != OK)
        return false;
    uint32_t next = r.primary_id;
    ASSERT(next != dead);
    struct map_cmd cmd;
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = refill_backups(p, q, next, ids);
    if (!same_ids(ids, n, q->backup_ids, q->backups_count))
        push(out, map_cmd_queue_set_backups(&cmd, vhost, q->name, q->epoch, ids, n), &cmd);
    push(out, map_cmd_queue_set_owner(&cmd, vhost, q->name, q->epoch, next), &cmd);
    return true;
}

int controller_forget(const struct cluster_map *map, const struct controller_config *config,
                      uint32_t broker_id, struct map_cmd_list *out,
                      struct controller_forget_report *report)
{
    ASSERT(map != NULL && out != NULL && report != NULL);
    memset(report, 0, sizeof *report);
    const struct map_broker *dead = cluster_map_broker(map, broker_id);
    if (dead == NULL) {
        report->refusal = CONTROLLER_FORGET_UNKNOWN;
        return OK;
    }
    if (dead->state != BROKER_STATE_DOWN) {
        report->refusal = CONTROLLER_FORGET_NOT_DOWN;
        return OK;
    }
    if (usable_brokers(map) == 0) {
        report->refusal = CONTROLLER_FORGET_NO_ROOM;
        return OK;
    }
    struct placement p;
    placement_init(&p, &config->placement);
    placement_refresh(&p, map);
    struct map_cmd cmd;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        struct bytes vhost = q->vhost->name;
        if (q->exclusive && q->exclusive_owner_id == broker_id) {
            push(out, map_cmd_queue_delete(&cmd, vhost, q->name, q->epoch), &cmd);
            report->deleted++;
        } else if (q->primary_id == broker_id) {
            if (promotion_candidate(map, q) != BROKER_ID_NONE) {
                fail_over_primary(&p, q, true, out, out);
                report->promoted++;
            } else if (start_again_empty(&p, q, broker_id, out)) {
                report->emptied++;
            }
        } else if (map_queue_has_backup(q, broker_id)) {
            uint32_t ids[CLUSTER_BACKUPS_MAX];
            uint8_t n = refill_backups(&p, q, q->primary_id, ids);
            push(out, map_cmd_queue_set_backups(&cmd, vhost, q->name, q->epoch, ids, n), &cmd);
            report->backups_replaced++;
        }
    }
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        if (x->owner_id != broker_id)
            continue;
        uint32_t owner = placement_pick_owner(&p, x->vhost->name, x->name);
        if (owner != BROKER_ID_NONE) {
            push(out, map_cmd_exchange_set_owner(&cmd, x->vhost->name, x->name, owner), &cmd);
            report->exchanges_moved++;
        }
    }
    push(out, map_cmd_broker_leave(&cmd, broker_id), &cmd);
    placement_free(&p);
    return OK;
}

/* ---- (d) rebalancing and draining ----------------------------------------- */

/* The next step of a primary move; returns true if it is still pending.
 * The primary carries a move out (handover.c): the map only names the
 * target (queue.move), which catches up as a backup first. A queue with a
 * move in progress keeps it. The backup that keeps the factor after the
 * switch joins as for any move (controller_repair, map_queue_move_state),
 * here before the move is committed. */
/* A move to a broker that is not a backup makes it one more backup first,
 * which a queue with CLUSTER_BACKUPS_MAX already cannot take (the map
 * refuses the move; proposed every round, it would never end). One beyond
 * the factor leaves first (one out of sync if any: it holds nothing the
 * others lack), and the move follows next round. With the factor itself at
 * the maximum there is nothing to spare: the move waits (false: not
 * pending) for a plan that targets one of its backups. The simulator found
 * this (tests/sim, seed 443). */
static bool make_room(const struct map_queue *q, struct map_cmd_list *out)
{
    if (q->backups_count < q->replication_factor)
        return false;
    uint8_t drop = q->backups_count - 1;
    for (uint8_t i = 0; i < q->backups_count; i++) {
        if (!(q->in_sync_mask & (1u << i))) {
            drop = i;
            break;
        }
    }
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = 0;
    for (uint8_t i = 0; i < q->backups_count; i++) {
        if (i != drop)
            ids[n++] = q->backup_ids[i];
    }
    struct map_cmd cmd;
    push(out, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch, ids, n), &cmd);
    return true;
}

static bool primary_move_step(const struct cluster_map *map, struct placement *p,
                              const struct placement_move *m, struct map_cmd_list *out)
{
    const struct map_queue *q = m->queue;
    if (q->move_to != BROKER_ID_NONE)
        return true;
    struct map_cmd cmd;
    if (!map_queue_has_backup(q, m->to_id) && q->backups_count == CLUSTER_BACKUPS_MAX)
        return make_room(q, out);
    /* To an in-sync backup, the copy that keeps the factor joins before the
     * move is committed (as the repair would add it after): a later plan
     * may still drop the move, and a committed move would be carried out. */
    if (map_queue_backup_in_sync(q, m->to_id)) {
        enum map_move_state state = map_queue_switch_state(map, q, m->to_id);
        if (state == MAP_MOVE_NEEDS_BACKUP)
            add_move_backup(map, p, q, out);
        if (state != MAP_MOVE_READY)
            return true; /* (the one added is catching up) */
    }
    push(out, map_cmd_queue_move(&cmd, q->vhost->name, q->name, q->epoch, m->to_id), &cmd);
    return true;
}

/* The next step of a backup move; returns true if it is still pending. A
 * replacement joins first, beyond the factor, and catches up; the backup
 * it replaces leaves once the replacement is in sync (a copy is not given
 * up before another has everything), or at once if it is on a broker that
 * is down or was not in sync itself. Without room for both, they swap. */
static bool backup_move_step(const struct cluster_map *map, const struct placement_move *m,
                             struct map_cmd_list *out)
{
    const struct map_queue *q = m->queue;
    struct map_cmd cmd;
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = 0;
    if (!map_queue_has_backup(q, m->from_id)) { /* restoring the factor: add one */
        if (m->to_id == BROKER_ID_NONE || map_queue_has_backup(q, m->to_id) ||
            q->backups_count == CLUSTER_BACKUPS_MAX)
            return false;
        memcpy(ids, q->backup_ids, sizeof(ids));
        n = q->backups_count;
        ids[n++] = m->to_id;
        push(out, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch, ids, n),
             &cmd);
        return false;
    }
    uint32_t last = q->backup_ids[q->backups_count - 1];
    bool has_replacement = q->backups_count >= q->replication_factor && last != m->from_id;
    const struct map_broker *from = cluster_map_broker(map, m->from_id);
    bool from_dead = from == NULL || from->state == BROKER_STATE_DOWN;
    bool room = q->backups_count < CLUSTER_BACKUPS_MAX && m->to_id != BROKER_ID_NONE &&
                !map_queue_has_backup(q, m->to_id);
    if (!has_replacement && room && !from_dead) {
        memcpy(ids, q->backup_ids, sizeof(ids));
        n = q->backups_count;
        ids[n++] = m->to_id; /* caught up by the primary, then from leaves */
        push(out, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch, ids, n),
             &cmd);
        return true;
    }
    if (has_replacement && !from_dead && map_queue_backup_in_sync(q, m->from_id) &&
        !map_queue_backup_in_sync(q, last))
        return true; /* still catching up */
    for (uint8_t i = 0; i < q->backups_count; i++) {
        if (q->backup_ids[i] != m->from_id)
            ids[n++] = q->backup_ids[i];
    }
    if (!has_replacement && m->to_id != BROKER_ID_NONE && !map_queue_has_backup(q, m->to_id))
        ids[n++] = m->to_id; /* no room for both, or from holds nothing: swapped */
    push(out, map_cmd_queue_set_backups(&cmd, q->vhost->name, q->name, q->epoch, ids, n), &cmd);
    return false;
}

/* One round of moves: every planned move's next step (mandatory ones only:
 * off draining or down brokers, restoring factors). */
static uint32_t move_steps(const struct cluster_map *map, const struct controller_config *config,
                           uint32_t moves_max, bool mandatory_only,
                           const struct controller_observed *seen, struct map_cmd_list *out)
{
    struct placement_plan plan;
    placement_plan_init(&plan);
    placement_rebalance_plan(map, &config->placement, moves_max, &plan);
    struct placement p;
    placement_init(&p, &config->placement);
    placement_refresh(&p, map);
    uint32_t pending = 0;
    for (uint32_t i = 0; i < plan.count; i++) {
        const struct placement_move *m = &plan.moves[i];
        if (mandatory_only && !m->mandatory)
            continue;
        if (!primary_settled(seen, m->queue)) {
            pending++; /* (the round comes back to it) */
            continue;
        }
        if (m->kind == PLACEMENT_MOVE_PRIMARY)
            pending += primary_move_step(map, &p, m, out);
        else
            pending += backup_move_step(map, m, out);
    }
    placement_free(&p);
    placement_plan_free(&plan);
    return pending;
}

/* Exchanges owned by brokers that are not up get an owner that is. */
static void exchange_owners(const struct cluster_map *map, const struct controller_config *config,
                            struct map_cmd_list *out)
{
    struct placement p;
    placement_init(&p, &config->placement);
    placement_refresh(&p, map);
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        const struct map_broker *owner = cluster_map_broker(map, x->owner_id);
        if (owner == NULL)
            continue; /* predeclared: owned by no broker */
        uint32_t next = placement_pick_owner(&p, x->vhost->name, x->name);
        if (owner->state == BROKER_STATE_UP || next == BROKER_ID_NONE)
            continue;
        struct map_cmd cmd;
        push(out, map_cmd_exchange_set_owner(&cmd, x->vhost->name, x->name, next), &cmd);
    }
    placement_free(&p);
}

static uint32_t rebalance(const struct cluster_map *map, const struct controller_config *config,
                          uint32_t moves_max, const struct controller_observed *seen,
                          struct map_cmd_list *out)
{
    uint32_t pending = move_steps(map, config, moves_max, false, seen, out);
    exchange_owners(map, config, out);
    return pending;
}

int controller_rebalance(const struct cluster_map *map, const struct controller_config *config,
                         uint32_t moves_max, struct map_cmd_list *out, uint32_t *pending_out)
{
    ASSERT(map != NULL);
    ASSERT(out != NULL);
    uint32_t pending = rebalance(map, config, moves_max, NULL, out);
    if (pending_out)
        *pending_out = pending;
    return OK;
}

int controller_drain(const struct cluster_map *map, const struct controller_config *config,
                     uint32_t broker_id, uint32_t moves_max, struct map_cmd_list *out,
                     bool *done_out)
{
    ASSERT(map != NULL);
    ASSERT(done_out != NULL);
    const struct map_broker *b = cluster_map_broker(map, broker_id);
    *done_out = b == NULL || (b->queues_owned_count == 0 && b->backups_held_count == 0 &&
                              b->exchanges_owned_count == 0);
    if (b == NULL || *done_out)
        return OK;
    if (b->state != BROKER_STATE_DRAINING) {
        struct map_cmd cmd;
        push(out, map_cmd_broker_state_why(&cmd, broker_id, BROKER_STATE_DRAINING,
                                           MAP_REASON_DRAIN, 0), &cmd);
        return OK;
    }
    move_steps(map, config, moves_max, true, NULL, out);
    exchange_owners(map, config, out);
    return OK;
}

static void drain_step(const struct cluster_map *map, const struct controller_config *config,
                       uint32_t moves_max, const struct controller_observed *seen,
                       struct map_cmd_list *out)
{
    bool draining = false;
    for (uint32_t i = 0; i < map->brokers_count && !draining; i++) {
        const struct map_broker *b = map->brokers[i];
        draining = b->state == BROKER_STATE_DRAINING &&
                   (b->queues_owned_count > 0 || b->backups_held_count > 0 ||
                    b->exchanges_owned_count > 0);
    }
    if (!draining)
        return;
    move_steps(map, config, moves_max, true, seen, out);
    exchange_owners(map, config, out);
}

int controller_drain_step(const struct cluster_map *map, const struct controller_config *config,
                          uint32_t moves_max, struct map_cmd_list *out)
{
    ASSERT(map != NULL);
    drain_step(map, config, moves_max, NULL, out);
    return OK;
}

/* ---- (e) replication policies --------------------------------------------- */

/* The factor a queue should have now; 0 if the policies do not decide it
 * (exclusive, or its own x-quay-backups). */
static uint8_t policy_factor(const struct cluster_map *map, const struct controller_config *config,
                             const struct map_queue *q)
{
    if (q->exclusive)
        return 0; /* factor 1 for good: it dies with its connection */
    int32_t own = policy_queue_own_backups(q->arguments.ptr, q->arguments.len);
    if (own >= 0)
        return 0;
    const struct policy *best = cluster_map_policy_for(map, q->vhost->name, q->name);
    return (uint8_t)(1 + policy_effective_backups(-1, best, config->default_backups));
}

/* Backups for a new factor: the alive ones, in-sync first (they already
 * hold every message), cut to fit; then refilled from placement. */
static uint8_t backups_for_factor(struct placement *p, const struct map_queue *q, uint8_t factor,
                                  uint32_t *ids)
{
    uint8_t n = 0;
    uint32_t wanted = factor - 1u;
    for (int pass = 0; pass < 2; pass++) {
        for (uint8_t i = 0; i < q->backups_count && n < wanted; i++) {
            bool in_sync = (q->in_sync_mask & (1u << i)) != 0;
            if (in_sync == (pass == 0) && alive(p->map, q->backup_ids[i]))
                ids[n++] = q->backup_ids[i];
        }
    }
    while (n < wanted) {
        uint32_t exclude[1 + CLUSTER_BACKUPS_MAX] = {q->primary_id};
        memcpy(&exclude[1], ids, n * sizeof(uint32_t));
        uint32_t id = placement_pick_backup(p, q->vhost->name, q->name, exclude, 1u + n);
        if (id == BROKER_ID_NONE)
            break;
        ids[n++] = id;
    }
    ASSERT(n < factor);
    return n;
}

int controller_apply_policies(const struct cluster_map *map,
                              const struct controller_config *config, struct map_cmd_list *out)
{
    ASSERT(map != NULL);
    ASSERT(out != NULL);
    ASSERT(config->default_backups <= CLUSTER_BACKUPS_MAX);
    struct placement p;
    placement_init(&p, &config->placement);
    placement_refresh(&p, map);
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        uint8_t factor = policy_factor(map, config, q);
        if (factor == 0 || factor == q->replication_factor)
            continue;
        uint32_t ids[CLUSTER_BACKUPS_MAX];
        uint8_t n = backups_for_factor(&p, q, factor, ids);
        struct map_cmd cmd;
        push(out,
             map_cmd_queue_set_factor(&cmd, q->vhost->name, q->name, q->epoch, factor, ids, n),
             &cmd);
    }
    placement_free(&p);
    return OK;
}

/* ---- the leader's round ---- */

/* Whether an automatic rebalance may run: the brokers' states have been
 * still for CONTROLLER_REBALANCE_SETTLE_MS (counted from this leader's
 * start). */
static bool brokers_settled(const struct cluster_map *map, struct controller_round *r,
                            uint64_t now)
{
    if (r->brokers_seen != map->brokers_version || r->brokers_still_since_ms == 0 ||
        r->brokers_still_since_ms < r->leader_since_ms) {
        r->brokers_seen = map->brokers_version;
        r->brokers_still_since_ms = now;
    }
    return now - r->brokers_still_since_ms >= CONTROLLER_REBALANCE_SETTLE_MS;
}

static void round_rebalance(const struct cluster_map *map, const struct controller_config *config,
                            struct controller_round *r, const struct controller_observed *seen,
                            struct map_cmd_list *out, enum controller_round_kind *kind,
                            uint32_t *pending)
{
    struct map_cmd cmd;
    if (map->rebalance == MAP_REBALANCE_UNSET) {
        push(out, map_cmd_rebalance(&cmd, r->auto_rebalance ? MAP_REBALANCE_AUTO
                                                            : MAP_REBALANCE_OFF), &cmd);
        *kind = CONTROLLER_ROUND_REBALANCE_MODE;
        return;
    }
    *pending = rebalance(map, config, CONTROLLER_REBALANCE_MOVES, seen, out);
    *kind = out->count > 0 ? CONTROLLER_ROUND_REBALANCE : CONTROLLER_ROUND_NOTHING;
    if (out->count == 0 && *pending == 0)
        r->balanced_version = map->version;
    if (out->count == 0 && *pending == 0 && map->rebalance == MAP_REBALANCE_ONCE) {
        push(out, map_cmd_rebalance_done(&cmd), &cmd);
        *kind = CONTROLLER_ROUND_REBALANCED;
    }
}

int controller_round(const struct cluster_map *map, const struct controller_config *config,
                     struct controller_round *round, const struct controller_observed *seen,
                     uint64_t now_ms, bool busy, struct map_cmd_list *out,
                     enum controller_round_kind *kind, uint32_t *pending)
{
    uint32_t pending_local = 0;
    if (pending == NULL)
        pending = &pending_local;
    *pending = 0;
    *kind = CONTROLLER_ROUND_NOTHING;
    bool settled = brokers_settled(map, round, now_ms);
    if (busy)
        return OK;
    if (now_ms - round->repaired_ms >= CONTROLLER_REPAIR_EVERY_MS) {
        round->repaired_ms = now_ms;
        repair(map, config, seen, out);
        if (out->count > 0) {
            *kind = CONTROLLER_ROUND_REPAIR;
            return OK;
        }
    }
    if (now_ms - round->drained_ms >= CONTROLLER_DRAIN_EVERY_MS) {
        round->drained_ms = now_ms;
        drain_step(map, config, CONTROLLER_DRAIN_MOVES, seen, out);
        if (out->count > 0) {
            *kind = CONTROLLER_ROUND_DRAIN;
            return OK;
        }
    }
    enum map_rebalance mode = map->rebalance;
    if (now_ms - round->rebalanced_ms < CONTROLLER_REBALANCE_EVERY_MS ||
        mode == MAP_REBALANCE_OFF || (mode == MAP_REBALANCE_AUTO && !settled) ||
        round->balanced_version == map->version)
        return OK;
    round->rebalanced_ms = now_ms;
    round_rebalance(map, config, round, seen, out, kind, pending);
    return OK;
}

/* ---- (g) the leader's tick ---- */

void controller_actions_init(struct controller_actions *a)
{
    memset(a, 0, sizeof *a);
    map_cmd_list_init(&a->states);
    map_cmd_list_init(&a->round);
    map_cmd_list_init(&a->policies);
}

void controller_actions_free(struct controller_actions *a)
{
    map_cmd_list_free(&a->states);
    map_cmd_list_free(&a->round);
    map_cmd_list_free(&a->policies);
}

void controller_leader_start(struct controller_leader *leader, uint64_t now_ms)
{
    leader->round.leader_since_ms = now_ms;
    leader->policies_recheck = true; /* the last leader may not have finished */
}

/* One broker at a time, so each broker.state command knows whose it is
 * (its follow-up is that broker's failover or return). */
int controller_leader_liveness(const struct cluster_map *map,
                               const struct controller_config *config,
                               const struct controller_observed *seen, uint64_t now_ms,
                               struct controller_actions *out)
{
    if (seen->liveness_in_flight > 0)
        return OK; /* decide on the map those changes produce */
    for (uint32_t i = 0; i < seen->heard_count; i++) {
        uint32_t before = out->states.count;
        controller_check_incarnations(map, &seen->heard[i], 1, &out->states);
        if (out->states.count > before)
            out->state_ids[before] = seen->heard[i].broker_id;
    }
    if (out->states.count > 0)
        return OK; /* restarts first: no failover may promote what they lost */
    for (uint32_t i = 0; i < seen->heard_count; i++) {
        uint32_t before = out->states.count;
        controller_check_liveness(map, config, &seen->heard[i], 1, now_ms, &out->states);
        ASSERT(out->states.count <= before + 1 && out->states.count <= CLUSTER_BROKERS_MAX);
        if (out->states.count > before)
            out->state_ids[before] = seen->heard[i].broker_id;
    }
    return OK;
}

int controller_leader_tick(const struct cluster_map *map, const struct controller_config *config,
                           struct controller_leader *leader, const struct controller_observed *seen,
                           uint64_t now_ms, struct controller_actions *out)
{
    ASSERT(map != NULL && config != NULL && leader != NULL && seen != NULL && out != NULL);
    controller_leader_liveness(map, config, seen, now_ms, out);
    bool busy = seen->proposals_in_flight > 0 || out->states.count > 0;
    controller_round(map, config, &leader->round, seen, now_ms, busy, &out->round,
                     &out->round_kind, &out->round_pending);
    if (seen->policy_in_flight > 0)
        return OK;
    if (leader->policies_applied == map->policies_generation && !leader->policies_recheck)
        return OK;
    leader->policies_applied = map->policies_generation;
    controller_apply_policies(map, config, &out->policies);
    leader->policies_recheck = out->policies.count > 0;
    return OK;
}

int controller_after_state(const struct cluster_map *map, const struct controller_config *config,
                           uint32_t broker_id, struct map_cmd_list *out)
{
    const struct map_broker *b = cluster_map_broker(map, broker_id);
    if (b == NULL)
        return OK;
    if (b->state == BROKER_STATE_DOWN)
        return controller_fail_over(map, config, broker_id, out);
    if (b->state == BROKER_STATE_UP)
        return controller_broker_returned(map, broker_id, out);
    return OK;
}
