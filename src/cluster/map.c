/*
 * map.c: the cluster map's objects: their lifecycle and lookups, the
 * derived per-broker counts, removal with its cascades, and the check of
 * every invariant (cluster_map_verify).
 *
 * Owns every object in the map and the derived per-broker counts. The
 * commands that change them are applied by map_apply.c (with
 * map_apply_queues.c) and built by map_cmd.c; snapshots are
 * map_snapshot.c's. What these files share is in map_int.h.
 *
 * Must never do I/O, read a clock, draw random numbers, or let the order of
 * a hash-table walk decide anything (see map.h).
 */
#include "cluster/map.h"
#include "cluster/map_int.h"

#include <stdlib.h>
#include <string.h>

#include "lib/assert.h"
#include "lib/bytes.h"

/* ---- lifecycle and queries ------------------------------------------------ */

uint64_t cluster_map__next_stamp(void)
{
    static uint64_t stamps; /* the loop thread's (sim: one process per job) */
    return ++stamps;
}

void cluster_map_init(struct cluster_map *map)
{
    memset(map, 0, sizeof(*map));
    map->objects_stamp = cluster_map__next_stamp();
    map->brokers = xcalloc(CLUSTER_BROKERS_MAX, sizeof(struct map_broker *));
    hmap_init(&map->vhost_index);
    hmap_init(&map->user_index);
    policy_set_init(&map->policies);
    limit_set_init(&map->limits);
}

struct map_broker *cluster_map_broker(const struct cluster_map *map, uint32_t id)
{
    /* At most CLUSTER_BROKERS_MAX: a scan beats hashing at this size. */
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        if (map->brokers[i]->id == id)
            return map->brokers[i];
    }
    return NULL;
}

struct map_broker *cluster_map_broker_named(const struct cluster_map *map, const char *name)
{
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        if (bytes_equal_cstr(map->brokers[i]->name, name))
            return map->brokers[i];
    }
    return NULL;
}

struct map_vhost *cluster_map_vhost(const struct cluster_map *map, struct bytes name)
{
    return hmap_get(&map->vhost_index, name);
}

struct map_user *cluster_map_user(const struct cluster_map *map, struct bytes name)
{
    return hmap_get(&map->user_index, name);
}

struct map_queue *cluster_map_queue(const struct cluster_map *map, struct bytes vhost,
                                    struct bytes name)
{
    struct map_vhost *v = cluster_map_vhost(map, vhost);
    return v ? hmap_get(&v->queues, name) : NULL;
}

struct map_exchange *cluster_map_exchange(const struct cluster_map *map, struct bytes vhost,
                                          struct bytes name)
{
    struct map_vhost *v = cluster_map_vhost(map, vhost);
    return v ? hmap_get(&v->exchanges, name) : NULL;
}

const struct policy *cluster_map_policy_for(const struct cluster_map *map, struct bytes vhost,
                                            struct bytes queue_name)
{
    return policy_set_match(&map->policies, vhost, queue_name);
}

uint32_t cluster_map_owner_of(const struct cluster_map *map, struct bytes vhost,
                              struct bytes name)
{
    struct map_queue *q = cluster_map_queue(map, vhost, name);
    return q ? q->primary_id : BROKER_ID_NONE;
}

int map__backup_slot(const struct map_queue *queue, uint32_t broker_id)
{
    for (int i = 0; i < queue->backups_count; i++) {
        if (queue->backup_ids[i] == broker_id)
            return i;
    }
    return -1;
}

bool map_queue_has_backup(const struct map_queue *queue, uint32_t broker_id)
{
    return map__backup_slot(queue, broker_id) >= 0;
}

bool map_queue_backup_in_sync(const struct map_queue *queue, uint32_t broker_id)
{
    int i = map__backup_slot(queue, broker_id);
    return i >= 0 && (queue->in_sync_mask & (1u << i)) != 0;
}

static bool broker_up(const struct cluster_map *map, uint32_t id)
{
    const struct map_broker *b = cluster_map_broker(map, id);
    return b != NULL && b->state == BROKER_STATE_UP;
}

enum map_move_state map_queue_move_state(const struct cluster_map *map,
                                         const struct map_queue *q)
{
    if (q->move_to == BROKER_ID_NONE || q->move_from != BROKER_ID_NONE)
        return MAP_MOVE_NONE;
    return map_queue_switch_state(map, q, q->move_to);
}

bool map_queue_switch_keeps_primary(const struct cluster_map *map, const struct map_queue *q)
{
    if (q->backups_count < q->replication_factor)
        return broker_up(map, q->primary_id);
    /* A queue without backups, the target its only one (beyond the factor). */
    const struct map_broker *b = cluster_map_broker(map, q->primary_id);
    return q->replication_factor == 1 && q->backups_count == 1 && b != NULL &&
           (b->state == BROKER_STATE_UP || b->state == BROKER_STATE_DRAINING);
}

enum map_move_state map_queue_switch_state(const struct cluster_map *map,
                                           const struct map_queue *q, uint32_t to)
{
    if (!map_queue_backup_in_sync(q, to))
        return MAP_MOVE_CATCHING_UP;
    /* The target's, and the old primary's if it stays. */
    uint32_t copies = 1u + map_queue_switch_keeps_primary(map, q);
    bool catching_up = false;
    for (uint8_t i = 0; i < q->backups_count; i++) {
        uint32_t id = q->backup_ids[i];
        if (id == to)
            continue;
        if (q->in_sync_mask & (1u << i))
            copies += broker_up(map, id);
        else
            catching_up |= broker_up(map, id);
    }
    if (copies >= q->replication_factor)
        return MAP_MOVE_READY;
    if (catching_up)
        return MAP_MOVE_CATCHING_UP;
    if (q->backups_count == CLUSTER_BACKUPS_MAX)
        return MAP_MOVE_READY;
    for (uint32_t b = 0; b < map->brokers_count; b++) {
        uint32_t id = map->brokers[b]->id;
        if (map->brokers[b]->state == BROKER_STATE_UP && id != q->primary_id &&
            !map_queue_has_backup(q, id))
            return MAP_MOVE_NEEDS_BACKUP;
    }
    return MAP_MOVE_READY;
}

bool map_brokers_share_storage(const struct map_broker *a, const struct map_broker *b)
{
    return a != NULL && b != NULL && a->storage_id.len > 0 &&
           bytes_equal(a->storage_id, b->storage_id);
}

bool map_queue_replicates_transient_only(const struct cluster_map *map,
                                         const struct map_queue *queue)
{
    return policy_replicates_transient_only(&map->policies, queue->vhost->name, queue->name,
                                            queue->arguments.ptr,
                                            (uint32_t)queue->arguments.len);
}

bool map_user_has_vhost(const struct map_user *user, struct bytes vhost)
{
    for (uint32_t i = 0; i < user->vhosts_count; i++) {
        if (bytes_equal(user->vhosts[i], vhost))
            return true;
    }
    return false;
}

/* ---- derived counts ------------------------------------------------------- */

/* Adds (delta +1) or removes (-1) a queue's contribution to broker counts. */
void map__queue_count(struct cluster_map *map, const struct map_queue *q, int delta)
{
    struct map_broker *b = cluster_map_broker(map, q->primary_id);
    ASSERT(b != NULL);
    ASSERT(delta == 1 || b->queues_owned_count > 0);
    b->queues_owned_count = (uint32_t)((int64_t)b->queues_owned_count + delta);
    for (int i = 0; i < q->backups_count; i++) {
        b = cluster_map_broker(map, q->backup_ids[i]);
        ASSERT(b != NULL);
        ASSERT(delta == 1 || b->backups_held_count > 0);
        b->backups_held_count = (uint32_t)((int64_t)b->backups_held_count + delta);
    }
}

void map__exchange_count(struct cluster_map *map, const struct map_exchange *x, int delta)
{
    if (x->owner_id == BROKER_ID_NONE)
        return; /* predeclared: every broker's */
    struct map_broker *b = cluster_map_broker(map, x->owner_id);
    ASSERT(b != NULL);
    ASSERT(delta == 1 || b->exchanges_owned_count > 0);
    b->exchanges_owned_count = (uint32_t)((int64_t)b->exchanges_owned_count + delta);
}

/* ---- object removal (cascades) -------------------------------------------- */

void map__binding_remove(struct cluster_map *map, struct map_binding *b)
{
    struct map_vhost *v = b->source->vhost;
    void *removed = hmap_remove(&v->bindings, b->key);
    ASSERT(removed == b);
    list_remove(&b->source_node);
    list_remove(&b->destination_node);
    ASSERT(b->source->bindings_out_count > 0);
    b->source->bindings_out_count--;
    ASSERT(map->bindings_count > 0);
    map->bindings_count--;
    bytes_free(&b->key);
    free(b);
}

/* Removes every binding in a bindings_out or bindings_in list. */
static uint32_t bindings_remove_all(struct cluster_map *map, struct list_node *head, bool out)
{
    uint32_t n = 0;
    while (!list_empty(head)) {
        struct list_node *node = head->next;
        struct map_binding *b = out ? CONTAINER_OF(node, struct map_binding, source_node)
                                    : CONTAINER_OF(node, struct map_binding, destination_node);
        map__binding_remove(map, b);
        n++;
    }
    return n;
}

/* RabbitMQ's auto-delete: an exchange that lost its last binding (as a
 * source) goes too. */
void map__exchange_maybe_auto_delete(struct cluster_map *map, struct map_exchange *x,
                                     struct removed *out)
{
    if (!x->auto_delete || x->bindings_out_count > 0)
        return;
    map__exchange_remove(map, x, out);
    out->exchanges++;
}

/* Removes every binding into a queue or an exchange (its bindings_in), then
 * the auto-delete sources they leave without a binding, and so on (as
 * RabbitMQ's remove_for_destination does): unbinding, deleting a queue or
 * deleting an exchange all cascade alike. Each source is checked once, after
 * all the bindings are gone. */
static void remove_bindings_in(struct cluster_map *map, struct list_node *head,
                               struct removed *out)
{
    struct map_exchange *few[16];
    struct map_exchange **sources = few;
    uint32_t sources_count = 0, sources_cap = ARRAY_SIZE(few);
    while (!list_empty(head)) {
        struct map_binding *b = CONTAINER_OF(head->next, struct map_binding, destination_node);
        struct map_exchange *source = b->source;
        map__binding_remove(map, b);
        out->bindings++;
        bool seen = !source->auto_delete;
        for (uint32_t i = 0; i < sources_count && !seen; i++)
            seen = sources[i] == source;
        if (seen)
            continue;
        if (sources_count == sources_cap) {
            sources_cap *= 2;
            struct map_exchange **grown = xcalloc(sources_cap, sizeof(*grown));
            memcpy(grown, sources, sizeof(*grown) * sources_count);
            if (sources != few)
                free(sources);
            sources = grown;
        }
        sources[sources_count++] = source;
    }
    /* A source an earlier one's cascade removed is in the graveyard until
     * the command is done (map->removed_exchanges): still readable. */
    for (uint32_t i = 0; i < sources_count; i++) {
        if (!sources[i]->removed)
            map__exchange_maybe_auto_delete(map, sources[i], out);
    }
    if (sources != few)
        free(sources);
}

uint32_t map__queue_remove(struct cluster_map *map, struct map_queue *q,
                           uint32_t *exchanges_removed)
{
    ASSERT(q->index < map->queues_count);
    ASSERT(map->queues[q->index] == q);
    struct removed removed_too = {0};
    remove_bindings_in(map, &q->bindings_in, &removed_too);
    uint32_t bindings = removed_too.bindings;
    *exchanges_removed += removed_too.exchanges;
    map__queue_count(map, q, -1);
    void *removed = hmap_remove(&q->vhost->queues, q->name);
    ASSERT(removed == q);
    struct map_queue *last = map->queues[--map->queues_count];
    map->queues[q->index] = last;
    last->index = q->index;
    bytes_free(&q->name);
    bytes_free(&q->arguments);
    free(q);
    return bindings;
}

/* Its bindings out first (so that no cascade comes back to it), then
 * those into it with their cascade. Freed with the command (graveyard). */
void map__exchange_remove(struct cluster_map *map, struct map_exchange *x,
                          struct removed *out)
{
    ASSERT(!x->removed);
    ASSERT(x->index < map->exchanges_count);
    ASSERT(map->exchanges[x->index] == x);
    out->bindings += bindings_remove_all(map, &x->bindings_out, true);
    remove_bindings_in(map, &x->bindings_in, out);
    ASSERT(x->bindings_out_count == 0);
    map__exchange_count(map, x, -1);
    void *removed = hmap_remove(&x->vhost->exchanges, x->name);
    ASSERT(removed == x);
    struct map_exchange *last = map->exchanges[--map->exchanges_count];
    map->exchanges[x->index] = last;
    last->index = x->index;
    x->removed = true;
    x->next_removed = map->removed_exchanges;
    map->removed_exchanges = x;
}

void map__free_removed_exchanges(struct cluster_map *map)
{
    while (map->removed_exchanges != NULL) {
        struct map_exchange *x = map->removed_exchanges;
        map->removed_exchanges = x->next_removed;
        bytes_free(&x->name);
        bytes_free(&x->type);
        bytes_free(&x->arguments);
        free(x);
    }
}

void map__user_lists_release(struct map_user *u)
{
    for (uint32_t i = 0; i < u->vhosts_count; i++)
        bytes_free(&u->vhosts[i]);
    for (uint32_t i = 0; i < 3 * u->vhosts_count; i++)
        bytes_free(&u->permissions[i]);
    free(u->permissions);
    u->permissions = NULL;
    for (uint32_t i = 0; i < u->tags_count; i++)
        bytes_free(&u->tags[i]);
    free(u->vhosts);
    free(u->tags);
    u->vhosts = NULL;
    u->tags = NULL;
    u->vhosts_count = 0;
    u->tags_count = 0;
}

void map__user_remove(struct cluster_map *map, struct map_user *u)
{
    ASSERT(map->users[u->index] == u);
    void *removed = hmap_remove(&map->user_index, u->name);
    ASSERT(removed == u);
    struct map_user *last = map->users[--map->users_count];
    map->users[u->index] = last;
    last->index = u->index;
    map__user_lists_release(u);
    bytes_free(&u->name);
    bytes_free(&u->password_hash);
    free(u);
}

/* Removes the user's permission for vhosts[j], keeping the others' order. */
void map__user_permission_remove(struct map_user *u, uint32_t j)
{
    ASSERT(j < u->vhosts_count);
    bytes_free(&u->vhosts[j]);
    for (int k = 0; k < 3; k++)
        bytes_free(&u->permissions[3 * j + (uint32_t)k]);
    memmove(&u->vhosts[j], &u->vhosts[j + 1], sizeof(u->vhosts[0]) * (u->vhosts_count - j - 1));
    memmove(&u->permissions[3 * j], &u->permissions[3 * j + 3],
            sizeof(u->permissions[0]) * 3 * (u->vhosts_count - j - 1));
    u->vhosts_count--;
}

/* Deletes a vhost and everything in it. Objects are collected from the
 * dense arrays (not from the vhost's hash indexes) so that the order of
 * removal, and hence the arrays' order afterwards, is the same on every
 * broker. */
void map__vhost_remove(struct cluster_map *map, struct map_vhost *v, struct map_change *c)
{
    for (uint32_t i = map->queues_count; i-- > 0;) {
        if (i < map->queues_count && map->queues[i]->vhost == v) {
            c->bindings_deleted_count += map__queue_remove(map, map->queues[i],
                                                           &c->exchanges_deleted_count);
            c->queues_deleted_count++;
        }
    }
    for (uint32_t i = map->exchanges_count; i-- > 0;) {
        if (i < map->exchanges_count && map->exchanges[i]->vhost == v) {
            struct removed removed = {0};
            map__exchange_remove(map, map->exchanges[i], &removed);
            c->bindings_deleted_count += removed.bindings;
            c->exchanges_deleted_count += 1 + removed.exchanges;
        }
    }
    ASSERT(v->queues.count == 0);
    ASSERT(v->bindings.count == 0);
    limit_set_delete_all(&map->limits, LIMIT_SCOPE_VHOST, v->name);
    uint32_t policies = policy_set_delete_vhost(&map->policies, v->name);
    c->policies_deleted_count += policies;
    map->policies_generation += policies > 0;
    /* Permissions on the vhost go with it, as in RabbitMQ. */
    for (uint32_t i = 0; i < map->users_count; i++) {
        struct map_user *u = map->users[i];
        uint32_t j = 0;
        while (j < u->vhosts_count && !bytes_equal(u->vhosts[j], v->name))
            j++;
        if (j < u->vhosts_count)
            map__user_permission_remove(u, j);
    }
    hmap_remove(&map->vhost_index, v->name);
    struct map_vhost *last = map->vhosts[--map->vhosts_count];
    map->vhosts[v->index] = last;
    last->index = v->index;
    hmap_free(&v->queues);
    hmap_free(&v->exchanges);
    hmap_free(&v->bindings);
    bytes_free(&v->name);
    free(v);
}

void cluster_map_free(struct cluster_map *map)
{
    struct map_change scratch;
    memset(&scratch, 0, sizeof(scratch));
    while (map->vhosts_count > 0)
        map__vhost_remove(map, map->vhosts[map->vhosts_count - 1], &scratch);
    while (map->users_count > 0)
        map__user_remove(map, map->users[map->users_count - 1]);
    map__free_removed_exchanges(map);
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        struct map_broker *b = map->brokers[i];
        bytes_free(&b->name);
        bytes_free(&b->amqp_address);
        bytes_free(&b->cluster_address);
        bytes_free(&b->storage_id);
        free(b);
    }
    free(map->brokers);
    free(map->vhosts);
    free(map->users);
    free(map->exchanges);
    free(map->queues);
    hmap_free(&map->vhost_index);
    hmap_free(&map->user_index);
    policy_set_free(&map->policies);
    limit_set_free(&map->limits);
    memset(map, 0, sizeof(*map));
}

/* ---- verification and accounting ------------------------------------------ */

static bool verify_queue(const struct cluster_map *map, const struct map_queue *q, uint32_t i,
                         uint32_t *owned, uint32_t *held)
{
    if (q->index != i || hmap_get(&q->vhost->queues, q->name) != q)
        return false;
    /* A handover may add one backup beyond the factor for a while. */
    if (q->backups_count > CLUSTER_BACKUPS_MAX || q->replication_factor == 0)
        return false;
    if ((q->in_sync_mask >> q->backups_count) != 0 || q->epoch == 0)
        return false;
    if (q->move_to != BROKER_ID_NONE && map__backup_slot(q, q->move_to) < 0)
        return false;
    if (q->move_from != BROKER_ID_NONE &&
        (q->move_to == BROKER_ID_NONE || map__backup_slot(q, q->move_from) < 0))
        return false;
    int p = -1;
    for (uint32_t b = 0; b < map->brokers_count; b++) {
        if (map->brokers[b]->id == q->primary_id)
            p = (int)b;
    }
    if (p < 0)
        return false;
    owned[p]++;
    for (uint8_t k = 0; k < q->backups_count; k++) {
        if (q->backup_ids[k] == q->primary_id || map__backup_slot(q, q->backup_ids[k]) != k)
            return false;
        int found = -1;
        for (uint32_t b = 0; b < map->brokers_count; b++) {
            if (map->brokers[b]->id == q->backup_ids[k])
                found = (int)b;
        }
        if (found < 0)
            return false;
        held[found]++;
    }
    return true;
}

bool cluster_map_verify(const struct cluster_map *map)
{
    uint32_t owned[CLUSTER_BROKERS_MAX] = {0}, held[CLUSTER_BROKERS_MAX] = {0};
    uint32_t xowned[CLUSTER_BROKERS_MAX] = {0};
    uint32_t queues_in_vhosts = 0, bindings = 0;
    for (uint32_t i = 0; i < map->vhosts_count; i++) {
        const struct map_vhost *v = map->vhosts[i];
        if (v->index != i || cluster_map_vhost(map, v->name) != v)
            return false;
        queues_in_vhosts += v->queues.count;
        bindings += v->bindings.count;
    }
    if (queues_in_vhosts != map->queues_count || bindings != map->bindings_count)
        return false;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        if (!verify_queue(map, map->queues[i], i, owned, held))
            return false;
    }
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        if (x->index != i || hmap_get(&x->vhost->exchanges, x->name) != x)
            return false;
        for (uint32_t b = 0; b < map->brokers_count; b++)
            xowned[b] += map->brokers[b]->id == x->owner_id;
    }
    for (uint32_t i = 0; i < map->users_count; i++) {
        if (map->users[i]->index != i)
            return false;
    }
    for (uint32_t i = 0; i < map->policies.count; i++) {
        const struct policy *p = map->policies.items[i];
        if (cluster_map_vhost(map, p->vhost) == NULL ||
            policy_set_find(&map->policies, p->vhost, p->name) != p)
            return false;
    }
    for (uint32_t i = 0; i < map->limits.count; i++) {
        const struct limit *l = &map->limits.items[i];
        bool owner = l->scope == LIMIT_SCOPE_VHOST ? cluster_map_vhost(map, l->name) != NULL
                                                   : cluster_map_user(map, l->name) != NULL;
        if (!owner || limit_set_find(&map->limits, l->scope, l->name, l->kind) != l)
            return false;
    }
    for (uint32_t b = 0; b < map->brokers_count; b++) {
        const struct map_broker *br = map->brokers[b];
        if (br->queues_owned_count != owned[b] || br->backups_held_count != held[b] ||
            br->exchanges_owned_count != xowned[b])
            return false;
    }
    return true;
}

/* malloc's per-chunk overhead on glibc x86-64, for an honest estimate. */
#define MALLOC_OVERHEAD 16

static size_t heap(size_t n)
{
    return n + MALLOC_OVERHEAD;
}

size_t cluster_map_memory_size(const struct cluster_map *map)
{
    size_t n = heap(CLUSTER_BROKERS_MAX * sizeof(void *));
    n += heap((size_t)map->vhosts_cap * sizeof(void *)) +
         heap((size_t)map->users_cap * sizeof(void *)) +
         heap((size_t)map->exchanges_cap * sizeof(void *)) +
         heap((size_t)map->queues_cap * sizeof(void *));
    n += heap((size_t)map->vhost_index.slots_count * sizeof(struct hmap_entry));
    n += heap((size_t)map->user_index.slots_count * sizeof(struct hmap_entry));
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        n += heap(sizeof(*b)) + heap(b->name.len) + heap(b->amqp_address.len) +
             heap(b->cluster_address.len) + heap(b->storage_id.len);
    }
    for (uint32_t i = 0; i < map->vhosts_count; i++) {
        const struct map_vhost *v = map->vhosts[i];
        n += heap(sizeof(*v)) + heap(v->name.len);
        n += heap((size_t)(v->queues.slots_count + v->exchanges.slots_count +
                           v->bindings.slots_count) *
                  sizeof(struct hmap_entry));
    }
    for (uint32_t i = 0; i < map->users_count; i++) {
        const struct map_user *u = map->users[i];
        n += heap(sizeof(*u)) + heap(u->name.len) + heap(u->password_hash.len);
        n += heap(u->vhosts_count * sizeof(struct bytes)) +
             heap(u->tags_count * sizeof(struct bytes));
        for (uint32_t j = 0; j < u->vhosts_count; j++)
            n += heap(u->vhosts[j].len);
        n += heap(3 * (size_t)u->vhosts_count * sizeof(struct bytes));
        for (uint32_t j = 0; j < 3 * u->vhosts_count; j++)
            n += heap(u->permissions[j].len);
        for (uint32_t j = 0; j < u->tags_count; j++)
            n += heap(u->tags[j].len);
    }
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        n += heap(sizeof(*x)) + heap(x->name.len) + heap(x->type.len) + heap(x->arguments.len);
        list_for_each(node, &x->bindings_out) {
            const struct map_binding *b = CONTAINER_OF(node, struct map_binding, source_node);
            n += heap(sizeof(*b)) + heap(b->key.len);
        }
    }
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        n += heap(sizeof(*q)) + heap(q->name.len) + heap(q->arguments.len);
    }
    n += heap((size_t)map->policies.cap * sizeof(void *));
    for (uint32_t i = 0; i < map->policies.count; i++) {
        const struct policy *p = map->policies.items[i];
        /* The compiled regex's own heap is libc's business: not counted. */
        n += heap(sizeof(*p)) + heap(p->vhost.len) + heap(p->name.len) + heap(p->pattern.len);
    }
    n += heap((size_t)map->limits.cap * sizeof(struct limit));
    for (uint32_t i = 0; i < map->limits.count; i++)
        n += heap(map->limits.items[i].name.len);
    return n;
}
