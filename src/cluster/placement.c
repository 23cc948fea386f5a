/*
 * placement.c: the ring, bounded-load placement and the rebalance planner.
 *
 * Owns nothing beyond struct placement's ring and counts. The hash is
 * FNV-1a with a murmur3 finalizer and a fixed seed, so every broker and
 * every release computes the same ring. Virtual node positions depend on
 * the broker id only, so a broker joining or leaving moves only the arcs
 * it gains or loses.
 *
 * Must never read a clock, draw random numbers or change the map.
 */
#include "cluster/placement.h"

#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"

void placement_config_default(struct placement_config *config)
{
    config->virtual_nodes_count = PLACEMENT_VIRTUAL_NODES_DEFAULT;
    config->epsilon_permille = PLACEMENT_EPSILON_PERMILLE_DEFAULT;
}

/* ---- the hash and the ring ------------------------------------------------ */

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define HASH_SEED 0xcbf29ce484222325ull

uint64_t placement_queue_hash(struct bytes vhost, struct bytes name)
{
    /* Length-prefix the vhost so ("a", "bc") and ("ab", "c") differ. */
    uint8_t len[4] = {(uint8_t)(vhost.len >> 24), (uint8_t)(vhost.len >> 16),
                      (uint8_t)(vhost.len >> 8), (uint8_t)vhost.len};
    uint64_t h = fnv(HASH_SEED, len, sizeof(len));
    h = fnv(h, vhost.ptr, vhost.len);
    h = fnv(h, name.ptr, name.len);
    return mix(h);
}

static uint64_t vnode_hash(uint32_t broker_id, uint32_t vnode_index)
{
    return mix(((uint64_t)broker_id << 32 | vnode_index) ^ HASH_SEED);
}

static int vnode_compare(const void *a, const void *b)
{
    const struct placement_vnode *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return (int)x->slot - (int)y->slot; /* a tie is broken the same everywhere */
}

void placement_init(struct placement *p, const struct placement_config *config)
{
    ASSERT(config->virtual_nodes_count >= 1);
    ASSERT(config->virtual_nodes_count <= 1024);
    memset(p, 0, sizeof(*p));
    p->config = *config;
    p->brokers_version = UINT64_MAX; /* forces the first build */
}

void placement_free(struct placement *p)
{
    free(p->ring);
    p->ring = NULL;
    p->ring_count = 0;
}

static void build_ring(struct placement *p, const struct cluster_map *map)
{
    p->brokers_count = 0;
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        if (map->brokers[i]->state == BROKER_STATE_UP)
            p->broker_ids[p->brokers_count++] = map->brokers[i]->id;
    }
    free(p->ring);
    uint32_t vnodes = p->config.virtual_nodes_count;
    p->ring_count = p->brokers_count * vnodes;
    p->ring = xcalloc(p->ring_count ? p->ring_count : 1, sizeof(p->ring[0]));
    for (uint32_t s = 0; s < p->brokers_count; s++) {
        for (uint32_t v = 0; v < vnodes; v++)
            p->ring[s * vnodes + v] =
                (struct placement_vnode){vnode_hash(p->broker_ids[s], v), (uint8_t)s};
    }
    qsort(p->ring, p->ring_count, sizeof(p->ring[0]), vnode_compare);
    p->brokers_version = map->brokers_version;
}

void placement_refresh(struct placement *p, const struct cluster_map *map)
{
    ASSERT(map != NULL);
    if (p->brokers_version != map->brokers_version || p->map != map)
        build_ring(p, map);
    p->map = map;
    for (uint32_t s = 0; s < p->brokers_count; s++) {
        const struct map_broker *b = cluster_map_broker(map, p->broker_ids[s]);
        ASSERT(b != NULL && b->state == BROKER_STATE_UP);
        p->owned[s] = b->queues_owned_count;
        p->held[s] = b->backups_held_count;
    }
}

uint32_t placement_preference(const struct placement *p, uint64_t queue_hash, uint8_t *slots)
{
    uint32_t n = p->brokers_count;
    if (n == 0)
        return 0;
    /* The first virtual node at or after the hash, wrapping around. */
    uint32_t lo = 0, hi = p->ring_count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->ring[mid].hash < queue_hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t seen = 0;
    uint32_t found = 0;
    for (uint32_t k = 0; k < p->ring_count && found < n; k++) {
        uint8_t s = p->ring[(lo + k) % p->ring_count].slot;
        if (!(seen & (1ull << s))) {
            seen |= 1ull << s;
            slots[found++] = s;
        }
    }
    ASSERT(found == n); /* every broker has virtual nodes on the ring */
    return n;
}

static int slot_of(const struct placement *p, uint32_t broker_id)
{
    for (uint32_t s = 0; s < p->brokers_count; s++) {
        if (p->broker_ids[s] == broker_id)
            return (int)s;
    }
    return -1;
}

void placement_bounds(const struct placement_config *config, uint64_t total, uint32_t n,
                      uint32_t *lo, uint32_t *hi)
{
    ASSERT(n > 0);
    uint64_t scale = (uint64_t)n * 1000;
    uint64_t up = total * (1000 + config->epsilon_permille);
    uint64_t down = total * (config->epsilon_permille < 1000 ? 1000 - config->epsilon_permille
                                                            : 0);
    *hi = (uint32_t)((up + scale - 1) / scale);
    *lo = (uint32_t)(down / scale);
    if (*hi == 0)
        *hi = 1;
    ASSERT(*lo <= *hi);
}

static uint64_t sum(const uint32_t *v, uint32_t n)
{
    uint64_t t = 0;
    for (uint32_t i = 0; i < n; i++)
        t += v[i];
    return t;
}

/* ---- placing one queue ---------------------------------------------------- */

static bool excluded(uint32_t id, const uint32_t *exclude, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (exclude[i] == id)
            return true;
    }
    return false;
}

/* The first slot in preference order, not excluded, whose load is under
 * cap; failing that the first not excluded (the bound is a preference, a
 * backup is a necessity). -1 if every broker is excluded. */
static int pick(const struct placement *p, const uint8_t *pref, const uint32_t *load,
                uint32_t cap, const uint32_t *exclude, uint32_t exclude_count)
{
    int fallback = -1;
    for (uint32_t k = 0; k < p->brokers_count; k++) {
        uint8_t s = pref[k];
        if (excluded(p->broker_ids[s], exclude, exclude_count))
            continue;
        if (load[s] < cap)
            return s;
        if (fallback < 0)
            fallback = s;
    }
    return fallback;
}

uint32_t placement_pick_backup(struct placement *p, struct bytes vhost, struct bytes name,
                               const uint32_t *exclude, uint32_t exclude_count)
{
    ASSERT(p->map != NULL);
    if (p->brokers_count == 0)
        return BROKER_ID_NONE;
    uint8_t pref[CLUSTER_BROKERS_MAX];
    placement_preference(p, placement_queue_hash(vhost, name), pref);
    uint32_t lo, hi;
    placement_bounds(&p->config, sum(p->held, p->brokers_count) + 1, p->brokers_count, &lo,
                     &hi);
    int s = pick(p, pref, p->held, hi, exclude, exclude_count);
    if (s < 0)
        return BROKER_ID_NONE;
    p->held[s]++;
    ASSERT(!excluded(p->broker_ids[s], exclude, exclude_count));
    return p->broker_ids[s];
}

int placement_place_queue(struct placement *p, struct bytes vhost, struct bytes name,
                          uint8_t replication_factor, enum placement_primary how,
                          uint32_t broker_id, struct placement_result *out)
{
    ASSERT(p->map != NULL);
    ASSERT(replication_factor >= 1 && replication_factor <= CLUSTER_BACKUPS_MAX + 1);
    ASSERT(how == PLACEMENT_PRIMARY_RING || broker_id != BROKER_ID_NONE);
    memset(out, 0, sizeof(*out));
    if (p->brokers_count == 0 && how != PLACEMENT_PRIMARY_AT)
        return E_LIMIT;
    uint8_t pref[CLUSTER_BROKERS_MAX];
    placement_preference(p, placement_queue_hash(vhost, name), pref);
    if (how == PLACEMENT_PRIMARY_AT) {
        out->primary_id = broker_id;
    } else {
        uint32_t lo, hi;
        placement_bounds(&p->config, sum(p->owned, p->brokers_count) + 1, p->brokers_count,
                         &lo, &hi);
        bool avoid = how == PLACEMENT_PRIMARY_AVOID;
        int s = pick(p, pref, p->owned, hi, avoid ? &broker_id : NULL, avoid ? 1 : 0);
        if (s < 0) /* broker_id is the only broker up */
            s = pick(p, pref, p->owned, hi, NULL, 0);
        ASSERT(s >= 0);
        out->primary_id = p->broker_ids[s];
    }
    int primary_slot = slot_of(p, out->primary_id);
    if (primary_slot >= 0)
        p->owned[primary_slot]++;
    uint32_t exclude[1 + CLUSTER_BACKUPS_MAX] = {out->primary_id};
    for (uint8_t i = 0; i + 1 < replication_factor; i++) {
        uint32_t id = placement_pick_backup(p, vhost, name, exclude, 1u + i);
        if (id == BROKER_ID_NONE)
            break;
        out->backup_ids[out->backups_count++] = id;
        exclude[1 + i] = id;
    }
    ASSERT(out->backups_count < replication_factor);
    return OK;
}

uint32_t placement_pick_owner(const struct placement *p, struct bytes vhost, struct bytes name)
{
    if (p->brokers_count == 0)
        return BROKER_ID_NONE;
    uint8_t pref[CLUSTER_BROKERS_MAX];
    placement_preference(p, placement_queue_hash(vhost, name), pref);
    return p->broker_ids[pref[0]];
}

/* ---- rebalancing ---------------------------------------------------------- */

void placement_plan_init(struct placement_plan *plan)
{
    memset(plan, 0, sizeof(*plan));
}

void placement_plan_free(struct placement_plan *plan)
{
    free(plan->moves);
    placement_plan_init(plan);
}

static void plan_add(struct placement_plan *plan, enum placement_move_kind kind,
                     struct map_queue *q, uint32_t from, uint32_t to, bool mandatory)
{
    ASSERT(to != BROKER_ID_NONE || (kind == PLACEMENT_MOVE_BACKUP && from != BROKER_ID_NONE));
    ASSERT(from != to);
    if (plan->count == plan->cap) {
        plan->cap = plan->cap ? plan->cap * 2 : 64;
        plan->moves = xrealloc(plan->moves, (size_t)plan->cap * sizeof(plan->moves[0]));
    }
    plan->moves[plan->count++] = (struct placement_move){kind, q, from, to, mandatory};
    if (kind == PLACEMENT_MOVE_PRIMARY)
        plan->primary_moves_count++;
    else
        plan->backup_moves_count++;
}

/* Working state of one planning run. */
struct planner {
    struct placement p;
    const struct cluster_map *map;
    struct placement_plan *plan;
    uint32_t moves_max;
    uint32_t n;
    uint8_t *pref;  /* n slots per queue, in queue order */
    bool *touched;  /* one move per queue per plan */
};

static bool room(const struct planner *pl)
{
    return pl->plan->count < pl->moves_max;
}

static enum broker_state state_of(const struct cluster_map *map, uint32_t id)
{
    const struct map_broker *b = cluster_map_broker(map, id);
    ASSERT(b != NULL);
    return b->state;
}

/* A queue whose ownership may move: available, not tied to a connection,
 * owned by a broker that is alive. */
static bool primary_movable(const struct cluster_map *map, const struct map_queue *q)
{
    if (!q->available || q->exclusive)
        return false;
    enum broker_state s = state_of(map, q->primary_id);
    return s == BROKER_STATE_UP || s == BROKER_STATE_DRAINING;
}

/* The receiver of a primary that must leave a draining broker: its first
 * in-sync backup that is up and under the bound (no data to copy), else
 * the queue's ring order under the bound. */
static int drain_receiver(const struct planner *pl, const struct map_queue *q,
                          const uint8_t *pref, uint32_t hi)
{
    for (uint8_t i = 0; i < q->backups_count; i++) {
        int s = slot_of(&pl->p, q->backup_ids[i]);
        if (s >= 0 && (q->in_sync_mask & (1u << i)) && pl->p.owned[s] < hi)
            return s;
    }
    return pick(&pl->p, pref, pl->p.owned, hi, NULL, 0);
}

static bool within(const uint32_t *load, uint32_t n, uint32_t lo, uint32_t hi)
{
    for (uint32_t s = 0; s < n; s++) {
        if (load[s] < lo || load[s] > hi)
            return false;
    }
    return true;
}

/* Moving one item from slot o to slot r helps the balance: o is over the
 * bound, or r is under it and o can spare one without crossing it. */
static bool helps(const uint32_t *load, uint8_t o, uint8_t r, uint32_t lo, uint32_t hi)
{
    if (load[r] + 1 > hi)
        return false;
    return load[o] > hi || (load[r] < lo && load[o] > lo && load[o] > load[r] + 1);
}

static void plan_primaries(struct planner *pl)
{
    const struct cluster_map *map = pl->map;
    uint32_t n = pl->n;
    uint64_t total = sum(pl->p.owned, n);
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        total += primary_movable(map, q) && state_of(map, q->primary_id) != BROKER_STATE_UP;
    }
    uint32_t lo, hi;
    placement_bounds(&pl->p.config, total, n, &lo, &hi);
    for (uint32_t i = 0; i < map->queues_count && room(pl); i++) {
        struct map_queue *q = map->queues[i];
        if (!primary_movable(map, q) || state_of(map, q->primary_id) == BROKER_STATE_UP)
            continue;
        int r = drain_receiver(pl, q, &pl->pref[(size_t)i * n], hi);
        ASSERT(r >= 0);
        plan_add(pl->plan, PLACEMENT_MOVE_PRIMARY, q, q->primary_id, pl->p.broker_ids[r], true);
        pl->p.owned[r]++;
        if (map_queue_has_backup(q, pl->p.broker_ids[r]))
            pl->p.held[r]--; /* a promoted backup stops being one */
        pl->touched[i] = true;
    }
    /* Balance, the queues' first choices first: a joining broker takes the
     * queues that hash to it, which is also where placement would put them. */
    for (uint32_t k = 0; k < n && room(pl) && !within(pl->p.owned, n, lo, hi); k++) {
        for (uint32_t i = 0; i < map->queues_count && room(pl); i++) {
            struct map_queue *q = map->queues[i];
            int o = slot_of(&pl->p, q->primary_id);
            if (pl->touched[i] || o < 0 || !primary_movable(map, q))
                continue;
            uint8_t r = pl->pref[(size_t)i * n + k];
            if (r == o || !helps(pl->p.owned, (uint8_t)o, r, lo, hi))
                continue;
            plan_add(pl->plan, PLACEMENT_MOVE_PRIMARY, q, q->primary_id, pl->p.broker_ids[r],
                     false);
            pl->p.owned[o]--;
            pl->p.owned[r]++;
            pl->touched[i] = true;
        }
    }
}

/* The number of backups a queue should have with n brokers up. */
static uint8_t backups_wanted(const struct map_queue *q, uint32_t n)
{
    uint32_t want = q->replication_factor - 1u;
    uint32_t possible = n > 0 ? n - 1 : 0;
    return (uint8_t)(want < possible ? want : possible);
}

/* A queue with more backups than it wants (none down or draining): a
 * replacement that caught up after the plan that added it changed its
 * mind, or a backup added for a move that ended. Once every backup is in
 * sync (not while one catches up: that is a move going on), the one on the
 * busiest broker leaves, the oldest of equals (the replacement stays). */
static void plan_backup_trim(struct planner *pl, uint32_t i)
{
    struct map_queue *q = pl->map->queues[i];
    if (q->move_to != BROKER_ID_NONE || q->in_sync_mask != (1u << q->backups_count) - 1)
        return;
    int from = -1;
    for (uint8_t b = 0; b < q->backups_count; b++) {
        int s = slot_of(&pl->p, q->backup_ids[b]);
        if (s >= 0 && (from < 0 || pl->p.held[s] > pl->p.held[from]))
            from = s;
    }
    if (from < 0)
        return;
    plan_add(pl->plan, PLACEMENT_MOVE_BACKUP, q, pl->p.broker_ids[from], BROKER_ID_NONE, true);
    pl->p.held[from]--;
    pl->touched[i] = true;
}

/* Mandatory backup moves: off brokers that are draining or down, then the
 * missing ones, and the ones too many. One per queue per plan. */
static void plan_backups_mandatory(struct planner *pl, uint32_t hi)
{
    const struct cluster_map *map = pl->map;
    for (uint32_t i = 0; i < map->queues_count && room(pl); i++) {
        struct map_queue *q = map->queues[i];
        if (pl->touched[i] || !primary_movable(map, q))
            continue;
        uint32_t exclude[1 + CLUSTER_BACKUPS_MAX] = {q->primary_id};
        memcpy(&exclude[1], q->backup_ids, q->backups_count * sizeof(uint32_t));
        uint32_t from = BROKER_ID_NONE;
        uint8_t good = 0;
        for (uint8_t b = 0; b < q->backups_count; b++) {
            enum broker_state s = state_of(map, q->backup_ids[b]);
            if (s != BROKER_STATE_DRAINING && s != BROKER_STATE_DOWN)
                good++;
            else if (from == BROKER_ID_NONE)
                from = q->backup_ids[b];
        }
        if (from == BROKER_ID_NONE && q->backups_count > backups_wanted(q, pl->n)) {
            plan_backup_trim(pl, i);
            continue;
        }
        if (from == BROKER_ID_NONE && q->backups_count == backups_wanted(q, pl->n))
            continue;
        if (from != BROKER_ID_NONE && good >= backups_wanted(q, pl->n)) {
            /* The others are enough (a replacement joined already): it
             * only leaves. */
            plan_add(pl->plan, PLACEMENT_MOVE_BACKUP, q, from, BROKER_ID_NONE, true);
            int f = slot_of(&pl->p, from);
            if (f >= 0)
                pl->p.held[f]--;
            pl->touched[i] = true;
            continue;
        }
        int r = pick(&pl->p, &pl->pref[(size_t)i * pl->n], pl->p.held, hi, exclude,
                     1u + q->backups_count);
        if (r < 0)
            continue;
        plan_add(pl->plan, PLACEMENT_MOVE_BACKUP, q, from, pl->p.broker_ids[r], true);
        pl->p.held[r]++;
        int f = slot_of(&pl->p, from);
        if (f >= 0)
            pl->p.held[f]--;
        pl->touched[i] = true;
    }
}

static void plan_backups(struct planner *pl)
{
    const struct cluster_map *map = pl->map;
    uint32_t n = pl->n;
    uint64_t total = 0;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        total += primary_movable(map, q) ? backups_wanted(q, n) : q->backups_count;
    }
    uint32_t lo, hi;
    placement_bounds(&pl->p.config, total, n, &lo, &hi);
    plan_backups_mandatory(pl, hi);
    for (uint32_t k = 0; k < n && room(pl) && !within(pl->p.held, n, lo, hi); k++) {
        for (uint32_t i = 0; i < map->queues_count && room(pl); i++) {
            struct map_queue *q = map->queues[i];
            if (pl->touched[i] || !primary_movable(map, q))
                continue;
            uint8_t r = pl->pref[(size_t)i * n + k];
            uint32_t to = pl->p.broker_ids[r];
            if (to == q->primary_id || map_queue_has_backup(q, to))
                continue;
            /* Give up the backup on the most loaded broker this helps. */
            int from = -1;
            for (uint8_t b = 0; b < q->backups_count; b++) {
                int o = slot_of(&pl->p, q->backup_ids[b]);
                if (o >= 0 && helps(pl->p.held, (uint8_t)o, r, lo, hi) &&
                    (from < 0 || pl->p.held[o] > pl->p.held[from]))
                    from = o;
            }
            if (from < 0)
                continue;
            plan_add(pl->plan, PLACEMENT_MOVE_BACKUP, q, pl->p.broker_ids[from], to, false);
            pl->p.held[from]--;
            pl->p.held[r]++;
            pl->touched[i] = true;
        }
    }
}

int placement_rebalance_plan(const struct cluster_map *map, const struct placement_config *config,
                             uint32_t moves_max, struct placement_plan *plan_out)
{
    ASSERT(map != NULL);
    ASSERT(plan_out != NULL);
    struct planner pl = {.map = map, .plan = plan_out, .moves_max = moves_max};
    placement_init(&pl.p, config);
    placement_refresh(&pl.p, map);
    pl.n = pl.p.brokers_count;
    if (pl.n == 0 || map->queues_count == 0) {
        placement_free(&pl.p);
        return OK;
    }
    pl.pref = xmalloc((size_t)map->queues_count * pl.n);
    pl.touched = xcalloc(map->queues_count, sizeof(bool));
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        placement_preference(&pl.p, placement_queue_hash(q->vhost->name, q->name),
                             &pl.pref[(size_t)i * pl.n]);
    }
    uint32_t before = plan_out->count;
    plan_primaries(&pl);
    plan_backups(&pl);
    ASSERT(plan_out->count - before <= moves_max);
    free(pl.pref);
    free(pl.touched);
    placement_free(&pl.p);
    return OK;
}
