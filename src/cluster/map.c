/*
 * map.c: the cluster map's objects, its command interpreter and snapshots.
 *
 * Owns every object in the map and the derived per-broker counts. Applies
 * commands in two phases: read and check everything, then mutate, so a
 * refusal (or a malformed command) leaves the map untouched. Snapshot
 * restore reuses the same per-op handlers in "restoring" mode, so a
 * snapshot is checked exactly as strictly as the commands that built it.
 *
 * Must never do I/O, read a clock, draw random numbers, or let the order of
 * a hash-table walk decide anything (see map.h).
 *
 * Size: over STYLE's ~1,500 lines. The seams are ready for a split into
 * map.c (objects, apply), map_cmd.c (builders) and map_snapshot.c; it was
 * not done here only because this change was limited to map.{c,h}.
 */
#include "cluster/map.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/auth.h"
#include "broker/queue_args.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"
#include "lib/log.h"

#define NAME_ARG(b) (int)(b).len, (const char *)(b).ptr

/* ---- small helpers -------------------------------------------------------- */

static void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size);
    ASSERT(p != NULL);
    return p;
}

/* Grows a pointer array to hold one more. */
static void ptr_array_reserve(void ***items, uint32_t count, uint32_t *cap)
{
    if (count < *cap)
        return;
    uint32_t new_cap = *cap ? *cap * 2 : 16;
    void **p = realloc(*items, (size_t)new_cap * sizeof(void *));
    ASSERT(p != NULL);
    *items = p;
    *cap = new_cap;
}

const char *broker_state_name(enum broker_state state)
{
    switch (state) {
    case BROKER_STATE_UP: return "up";
    case BROKER_STATE_SUSPECT: return "suspect";
    case BROKER_STATE_DOWN: return "down";
    case BROKER_STATE_DRAINING: return "draining";
    }
    return "?";
}

static bool broker_state_parse(struct bytes name, enum broker_state *out)
{
    for (int s = BROKER_STATE_UP; s <= BROKER_STATE_DRAINING; s++) {
        if (bytes_equal_cstr(name, broker_state_name((enum broker_state)s))) {
            *out = (enum broker_state)s;
            return true;
        }
    }
    return false;
}

static const char *const op_names[MAP_OP_COUNT] = {
    [MAP_OP_NONE] = NULL,
    [MAP_OP_BROKER_JOIN] = "broker.join",
    [MAP_OP_BROKER_LEAVE] = "broker.leave",
    [MAP_OP_BROKER_STATE] = "broker.state",
    [MAP_OP_VHOST_PUT] = "vhost.put",
    [MAP_OP_VHOST_DELETE] = "vhost.delete",
    [MAP_OP_USER_PUT] = "user.put",
    [MAP_OP_USER_DELETE] = "user.delete",
    [MAP_OP_EXCHANGE_DECLARE] = "exchange.declare",
    [MAP_OP_EXCHANGE_DELETE] = "exchange.delete",
    [MAP_OP_EXCHANGE_SET_OWNER] = "exchange.set_owner",
    [MAP_OP_BIND] = "bind",
    [MAP_OP_UNBIND] = "unbind",
    [MAP_OP_QUEUE_DECLARE] = "queue.declare",
    [MAP_OP_QUEUE_DELETE] = "queue.delete",
    [MAP_OP_QUEUE_SET_OWNER] = "queue.set_owner",
    [MAP_OP_QUEUE_SET_BACKUPS] = "queue.set_backups",
    [MAP_OP_QUEUE_SET_IN_SYNC] = "queue.set_in_sync",
    [MAP_OP_QUEUE_SET_AVAILABLE] = "queue.set_available",
    [MAP_OP_SYNC] = "sync",
    [MAP_OP_POLICY_PUT] = "policy.put",
    [MAP_OP_POLICY_DELETE] = "policy.delete",
    [MAP_OP_QUEUE_MOVE] = "queue.move",
    [MAP_OP_CLUSTER_REBALANCE] = "cluster.rebalance",
    [MAP_OP_BROKER_STORAGE] = "broker.storage",
    [MAP_OP_QUEUE_TAKE_OVER] = "queue.take_over",
    [MAP_OP_PERMISSION_PUT] = "permission.put",
    [MAP_OP_PERMISSION_DELETE] = "permission.delete",
    [MAP_OP_USERS_BOOTSTRAP] = "users.bootstrap",
    [MAP_OP_LIMIT_PUT] = "limit.put",
    [MAP_OP_LIMIT_DELETE] = "limit.delete",
    [MAP_OP_QUEUE_ADOPTED] = "queue.adopted",
};

const char *map_rebalance_name(enum map_rebalance mode)
{
    switch (mode) {
    case MAP_REBALANCE_UNSET: return "unset";
    case MAP_REBALANCE_AUTO: return "auto";
    case MAP_REBALANCE_OFF: return "off";
    case MAP_REBALANCE_ONCE: return "once";
    }
    return "?";
}

static bool rebalance_parse(struct bytes name, enum map_rebalance *out)
{
    for (int m = MAP_REBALANCE_AUTO; m <= MAP_REBALANCE_ONCE; m++) {
        if (bytes_equal_cstr(name, map_rebalance_name((enum map_rebalance)m))) {
            *out = (enum map_rebalance)m;
            return true;
        }
    }
    return false;
}

const char *map_op_name(enum map_op op)
{
    return (unsigned)op < MAP_OP_COUNT ? op_names[op] : NULL;
}

/* ---- lifecycle and queries ------------------------------------------------ */

void cluster_map_init(struct cluster_map *map)
{
    memset(map, 0, sizeof(*map));
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

static int backup_slot(const struct map_queue *queue, uint32_t broker_id)
{
    for (int i = 0; i < queue->backups_count; i++) {
        if (queue->backup_ids[i] == broker_id)
            return i;
    }
    return -1;
}

bool map_queue_has_backup(const struct map_queue *queue, uint32_t broker_id)
{
    return backup_slot(queue, broker_id) >= 0;
}

bool map_queue_backup_in_sync(const struct map_queue *queue, uint32_t broker_id)
{
    int i = backup_slot(queue, broker_id);
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

enum map_move_state map_queue_switch_state(const struct cluster_map *map,
                                           const struct map_queue *q, uint32_t to)
{
    if (!map_queue_backup_in_sync(q, to))
        return MAP_MOVE_CATCHING_UP;
    uint32_t copies = 1; /* the target's */
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
static void queue_count(struct cluster_map *map, const struct map_queue *q, int delta)
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

static void exchange_count(struct cluster_map *map, const struct map_exchange *x, int delta)
{
    if (x->owner_id == BROKER_ID_NONE)
        return; /* predeclared: every broker's */
    struct map_broker *b = cluster_map_broker(map, x->owner_id);
    ASSERT(b != NULL);
    ASSERT(delta == 1 || b->exchanges_owned_count > 0);
    b->exchanges_owned_count = (uint32_t)((int64_t)b->exchanges_owned_count + delta);
}

/* ---- object removal (cascades) -------------------------------------------- */

static void binding_remove(struct cluster_map *map, struct map_binding *b)
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
        binding_remove(map, b);
        n++;
    }
    return n;
}

/* What a removal took with it. */
struct removed {
    uint32_t bindings;
    uint32_t exchanges;
};

static void exchange_remove(struct cluster_map *map, struct map_exchange *x,
                            struct removed *out);

/* RabbitMQ's auto-delete: an exchange that lost its last binding (as a
 * source) goes too. */
static void exchange_maybe_auto_delete(struct cluster_map *map, struct map_exchange *x,
                                       struct removed *out)
{
    if (!x->auto_delete || x->bindings_out_count > 0)
        return;
    exchange_remove(map, x, out);
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
        binding_remove(map, b);
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
            exchange_maybe_auto_delete(map, sources[i], out);
    }
    if (sources != few)
        free(sources);
}

static uint32_t queue_remove(struct cluster_map *map, struct map_queue *q,
                             uint32_t *exchanges_removed)
{
    ASSERT(q->index < map->queues_count);
    ASSERT(map->queues[q->index] == q);
    struct removed removed_too = {0};
    remove_bindings_in(map, &q->bindings_in, &removed_too);
    uint32_t bindings = removed_too.bindings;
    *exchanges_removed += removed_too.exchanges;
    queue_count(map, q, -1);
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
static void exchange_remove(struct cluster_map *map, struct map_exchange *x,
                            struct removed *out)
{
    ASSERT(!x->removed);
    ASSERT(x->index < map->exchanges_count);
    ASSERT(map->exchanges[x->index] == x);
    out->bindings += bindings_remove_all(map, &x->bindings_out, true);
    remove_bindings_in(map, &x->bindings_in, out);
    ASSERT(x->bindings_out_count == 0);
    exchange_count(map, x, -1);
    void *removed = hmap_remove(&x->vhost->exchanges, x->name);
    ASSERT(removed == x);
    struct map_exchange *last = map->exchanges[--map->exchanges_count];
    map->exchanges[x->index] = last;
    last->index = x->index;
    x->removed = true;
    x->next_removed = map->removed_exchanges;
    map->removed_exchanges = x;
}

static void free_removed_exchanges(struct cluster_map *map)
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

static void user_lists_release(struct map_user *u)
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

static void user_remove(struct cluster_map *map, struct map_user *u)
{
    ASSERT(map->users[u->index] == u);
    void *removed = hmap_remove(&map->user_index, u->name);
    ASSERT(removed == u);
    struct map_user *last = map->users[--map->users_count];
    map->users[u->index] = last;
    last->index = u->index;
    user_lists_release(u);
    bytes_free(&u->name);
    bytes_free(&u->password_hash);
    free(u);
}

/* Removes the user's permission for vhosts[j], keeping the others' order. */
static void user_permission_remove(struct map_user *u, uint32_t j)
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
static void vhost_remove(struct cluster_map *map, struct map_vhost *v, struct map_change *c)
{
    for (uint32_t i = map->queues_count; i-- > 0;) {
        if (i < map->queues_count && map->queues[i]->vhost == v) {
            c->bindings_deleted_count += queue_remove(map, map->queues[i],
                                                      &c->exchanges_deleted_count);
            c->queues_deleted_count++;
        }
    }
    for (uint32_t i = map->exchanges_count; i-- > 0;) {
        if (i < map->exchanges_count && map->exchanges[i]->vhost == v) {
            struct removed removed = {0};
            exchange_remove(map, map->exchanges[i], &removed);
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
            user_permission_remove(u, j);
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
        vhost_remove(map, map->vhosts[map->vhosts_count - 1], &scratch);
    while (map->users_count > 0)
        user_remove(map, map->users[map->users_count - 1]);
    free_removed_exchanges(map);
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

/* ---- reading command fields ----------------------------------------------- */

/* Typed, bounded reads of a validated table. The first failure is latched
 * in bad_key, so a handler reads every field and checks once. */
struct cmd_reader {
    struct table table;
    const char *bad_key;
};

static void reader_fail(struct cmd_reader *r, const char *key)
{
    if (r->bad_key == NULL)
        r->bad_key = key;
}

static bool read_value(struct cmd_reader *r, const char *key, struct field_value *v,
                       bool optional)
{
    if (table_get(r->table, key, v))
        return true;
    if (!optional)
        reader_fail(r, key);
    return false;
}

/* A string of min..max bytes ('S' or 'x'). */
static struct bytes read_str(struct cmd_reader *r, const char *key, uint32_t min, uint32_t max)
{
    struct field_value v;
    if (!read_value(r, key, &v, false))
        return (struct bytes){(const uint8_t *)"", 0};
    if ((v.kind != 'S' && v.kind != 'x') || v.str.len < min || v.str.len > max) {
        reader_fail(r, key);
        return (struct bytes){(const uint8_t *)"", 0};
    }
    return v.str;
}

static struct bytes read_name(struct cmd_reader *r, const char *key)
{
    return read_str(r, key, 1, CLUSTER_NAME_SIZE_MAX);
}

static uint64_t read_uint(struct cmd_reader *r, const char *key, uint64_t max, bool optional,
                          uint64_t dflt)
{
    struct field_value v;
    if (!read_value(r, key, &v, optional))
        return dflt;
    int64_t i;
    if (!field_value_as_int(&v, &i) || i < 0 || (uint64_t)i > max) {
        reader_fail(r, key);
        return dflt;
    }
    return (uint64_t)i;
}

static uint32_t read_broker_id(struct cmd_reader *r, const char *key)
{
    uint32_t id = (uint32_t)read_uint(r, key, UINT32_MAX, false, 0);
    if (id == BROKER_ID_NONE)
        reader_fail(r, key);
    return id;
}

static bool read_bool(struct cmd_reader *r, const char *key, bool optional)
{
    struct field_value v;
    if (!read_value(r, key, &v, optional))
        return false;
    if (v.kind != 't') {
        reader_fail(r, key);
        return false;
    }
    return v.boolean;
}

static struct table read_table(struct cmd_reader *r, const char *key)
{
    struct field_value v;
    if (!read_value(r, key, &v, true))
        return (struct table){(const uint8_t *)"", 0};
    if (v.kind != 'F' || v.table.len > CLUSTER_ARGUMENTS_SIZE_MAX) {
        reader_fail(r, key);
        return (struct table){(const uint8_t *)"", 0};
    }
    return v.table;
}

/* An array of up to CLUSTER_BACKUPS_MAX non-zero broker ids. */
static uint8_t read_ids(struct cmd_reader *r, const char *key, uint32_t *ids)
{
    struct field_value v;
    if (!read_value(r, key, &v, false))
        return 0;
    if (v.kind != 'A') {
        reader_fail(r, key);
        return 0;
    }
    struct array_iter it;
    array_iter_init(&it, v.array);
    uint8_t n = 0;
    struct field_value e;
    while (array_iter_next(&it, &e)) {
        int64_t i;
        if (n == CLUSTER_BACKUPS_MAX || !field_value_as_int(&e, &i) || i <= 0 ||
            i > UINT32_MAX) {
            reader_fail(r, key);
            return 0;
        }
        ids[n++] = (uint32_t)i;
    }
    return n;
}

/* An array of strings, each 1..255 bytes, at most CLUSTER_USER_LIST_MAX.
 * Returns the count; fills out[] if out is not NULL. */
static uint32_t read_str_list(struct cmd_reader *r, const char *key, struct bytes *out)
{
    struct field_value v;
    if (!read_value(r, key, &v, true))
        return 0;
    if (v.kind != 'A') {
        reader_fail(r, key);
        return 0;
    }
    struct array_iter it;
    array_iter_init(&it, v.array);
    uint32_t n = 0;
    struct field_value e;
    while (array_iter_next(&it, &e)) {
        if (n == CLUSTER_USER_LIST_MAX || e.kind != 'S' || e.str.len == 0 ||
            e.str.len > CLUSTER_NAME_SIZE_MAX) {
            reader_fail(r, key);
            return 0;
        }
        if (out)
            out[n] = e.str;
        n++;
    }
    return n;
}

/* ---- apply context and refusals ------------------------------------------- */

struct apply_ctx {
    struct cluster_map *map;
    struct map_change *change;
    struct cmd_reader reader;
    bool restoring; /* reading a snapshot: no liveness checks, no redeclares */
};

static int refuse(struct apply_ctx *ctx, uint16_t code, bool retry, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int refuse(struct apply_ctx *ctx, uint16_t code, bool retry, const char *fmt, ...)
{
    ASSERT(code != REPLY_SUCCESS);
    struct map_change *c = ctx->change;
    c->reply_code = code;
    c->retry = retry;
    c->changed = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->reply_text, sizeof(c->reply_text), fmt, ap);
    va_end(ap);
    return E_MAP_REFUSED;
}

static int malformed(struct apply_ctx *ctx)
{
    struct map_change *c = ctx->change;
    c->reply_code = REPLY_INTERNAL_ERROR;
    c->retry = false;
    c->changed = false;
    snprintf(c->reply_text, sizeof(c->reply_text), "malformed cluster command %s: field '%s'",
             map_op_name(c->op) ? map_op_name(c->op) : "?",
             ctx->reader.bad_key ? ctx->reader.bad_key : "op");
    return E_SYNTAX;
}

/* The broker exists, and (unless restoring) may take new work: not down. */
static int check_broker_usable(struct apply_ctx *ctx, uint32_t id, const char *what,
                               struct bytes name)
{
    const struct map_broker *b = cluster_map_broker(ctx->map, id);
    if (b == NULL)
        return refuse(ctx, REPLY_NOT_FOUND, true, "broker %u chosen for %s '%.*s' is unknown",
                      id, what, NAME_ARG(name));
    if (!ctx->restoring && b->state == BROKER_STATE_DOWN)
        return refuse(ctx, REPLY_NOT_FOUND, true,
                      "broker %u chosen for %s '%.*s' is down or inaccessible", id, what,
                      NAME_ARG(name));
    return OK;
}

static struct map_vhost *need_vhost(struct apply_ctx *ctx, struct bytes name, int *rc)
{
    struct map_vhost *v = cluster_map_vhost(ctx->map, name);
    *rc = v ? OK : refuse(ctx, REPLY_NOT_FOUND, false, "no vhost '%.*s'", NAME_ARG(name));
    return v;
}

/* ---- brokers -------------------------------------------------------------- */

static int op_broker_join(struct apply_ctx *ctx)
{
    struct cmd_reader *r = &ctx->reader;
    uint32_t id = read_broker_id(r, "id");
    struct bytes name = read_name(r, "name");
    struct bytes amqp_address = read_name(r, "amqp_address");
    struct bytes cluster_address = read_name(r, "cluster_address");
    bool voter = read_bool(r, "voter", false);
    enum broker_state state = BROKER_STATE_UP;
    if (ctx->restoring && !broker_state_parse(read_name(r, "state"), &state))
        reader_fail(r, "state");
    struct bytes storage_id = {(const uint8_t *)"", 0};
    if (ctx->restoring && table_get(r->table, "storage", &(struct field_value){0}))
        storage_id = read_str(r, "storage", 1, MAP_STORAGE_ID_SIZE_MAX);
    if (r->bad_key)
        return malformed(ctx);
    struct cluster_map *map = ctx->map;
    struct map_broker *b = cluster_map_broker(map, id);
    if (ctx->restoring && b)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "broker %u twice", id);
    uint32_t voters = 0;
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *o = map->brokers[i];
        if (o != b && bytes_equal(o->name, name))
            return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                          "broker name '%.*s' is taken by broker %u", NAME_ARG(name), o->id);
        voters += (o != b && o->voter);
    }
    if (voter && voters >= CLUSTER_VOTERS_MAX)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "already %u voting brokers",
                      voters);
    if (!b && map->brokers_count == CLUSTER_BROKERS_MAX)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "cluster is full (%u brokers)",
                      map->brokers_count);
    if (b) {
        /* A rejoin (restart, new address): the state stays the controller's. */
        bytes_free(&b->name);
        bytes_free(&b->amqp_address);
        bytes_free(&b->cluster_address);
    } else {
        b = xcalloc(1, sizeof(*b));
        b->id = id;
        b->state = state;
        map->brokers[map->brokers_count++] = b;
        if (storage_id.len > 0)
            b->storage_id = bytes_dup(storage_id);
    }
    b->name = bytes_dup(name);
    b->amqp_address = bytes_dup(amqp_address);
    b->cluster_address = bytes_dup(cluster_address);
    b->voter = voter;
    map->brokers_version++;
    ctx->change->broker_id = id;
    ctx->change->changed = true;
    return OK;
}

static int op_broker_leave(struct apply_ctx *ctx)
{
    uint32_t id = read_broker_id(&ctx->reader, "id");
    if (ctx->reader.bad_key)
        return malformed(ctx);
    struct cluster_map *map = ctx->map;
    ctx->change->broker_id = id;
    struct map_broker *b = cluster_map_broker(map, id);
    if (b == NULL)
        return OK; /* already gone */
    if (b->queues_owned_count || b->backups_held_count || b->exchanges_owned_count)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                      "broker %u still owns %u queues and %u exchanges and holds %u backups",
                      id, b->queues_owned_count, b->exchanges_owned_count,
                      b->backups_held_count);
    uint32_t i = 0;
    while (map->brokers[i] != b)
        i++;
    /* Keep join order: the brokers array is small. */
    memmove(&map->brokers[i], &map->brokers[i + 1],
            (size_t)(map->brokers_count - i - 1) * sizeof(map->brokers[0]));
    map->brokers_count--;
    bytes_free(&b->name);
    bytes_free(&b->amqp_address);
    bytes_free(&b->cluster_address);
    bytes_free(&b->storage_id);
    free(b);
    map->brokers_version++;
    ctx->change->changed = true;
    return OK;
}

static int op_broker_state(struct apply_ctx *ctx)
{
    uint32_t id = read_broker_id(&ctx->reader, "id");
    enum broker_state state = BROKER_STATE_UP;
    if (!broker_state_parse(read_name(&ctx->reader, "state"), &state))
        reader_fail(&ctx->reader, "state");
    if (ctx->reader.bad_key)
        return malformed(ctx);
    ctx->change->broker_id = id;
    struct map_broker *b = cluster_map_broker(ctx->map, id);
    if (b == NULL)
        return refuse(ctx, REPLY_NOT_FOUND, false, "no broker %u", id);
    if (b->state != state) {
        b->state = state;
        ctx->map->brokers_version++;
        ctx->change->changed = true;
    }
    return OK;
}

/* A broker announces the shared storage it keeps its journal on (or none):
 * the controller gives a dead broker's queues only to brokers that share
 * its storage (queue.take_over). */
static int op_broker_storage(struct apply_ctx *ctx)
{
    uint32_t id = read_broker_id(&ctx->reader, "id");
    struct bytes storage_id = read_str(&ctx->reader, "storage", 0, MAP_STORAGE_ID_SIZE_MAX);
    if (ctx->reader.bad_key)
        return malformed(ctx);
    ctx->change->broker_id = id;
    struct map_broker *b = cluster_map_broker(ctx->map, id);
    if (b == NULL)
        return refuse(ctx, REPLY_NOT_FOUND, false, "no broker %u", id);
    if (bytes_equal(b->storage_id, storage_id))
        return OK;
    bytes_free(&b->storage_id);
    if (storage_id.len > 0)
        b->storage_id = bytes_dup(storage_id);
    ctx->map->brokers_version++;
    ctx->change->changed = true;
    return OK;
}

/* ---- vhosts and users ----------------------------------------------------- */

/* Every vhost has RabbitMQ's predeclared exchanges, owned by no broker
 * (each broker has its own copy), so bindings from them are map bindings
 * like any other. Snapshots leave them out: the vhost makes them. */
static const struct {
    const char *name, *type;
    bool internal;
} predeclared_exchanges[] = {
    {"amq.direct", "direct", false}, {"amq.fanout", "fanout", false},
    {"amq.topic", "topic", false},   {"amq.headers", "headers", false},
    {"amq.match", "headers", false}, {"amq.rabbitmq.trace", "topic", true},
    {"amq.quay.cluster", "topic", true}, /* cluster/events.c */
};

static struct map_exchange *exchange_insert(struct cluster_map *map, struct map_vhost *v,
                                            const struct map_exchange_decl *d);

static void add_predeclared(struct cluster_map *map, struct map_vhost *v)
{
    for (size_t i = 0; i < sizeof predeclared_exchanges / sizeof predeclared_exchanges[0]; i++) {
        struct map_exchange_decl d = {
            .vhost = v->name, .name = bytes_of_cstr(predeclared_exchanges[i].name),
            .type = bytes_of_cstr(predeclared_exchanges[i].type), .durable = true,
            .internal = predeclared_exchanges[i].internal, .owner_id = BROKER_ID_NONE};
        exchange_insert(map, v, &d);
    }
}

static struct map_vhost *vhost_insert(struct cluster_map *map, struct bytes name);

static int op_vhost_put(struct apply_ctx *ctx)
{
    struct bytes name = read_name(&ctx->reader, "name");
    if (ctx->reader.bad_key)
        return malformed(ctx);
    struct cluster_map *map = ctx->map;
    if (cluster_map_vhost(map, name)) {
        if (ctx->restoring)
            return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "vhost twice");
        return OK;
    }
    if (map->vhosts_count == CLUSTER_VHOSTS_MAX)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "vhost limit reached");
    vhost_insert(map, name);
    ctx->change->changed = true;
    return OK;
}

/* The vhost of that name, made (with its predeclared exchanges) if new. */
static struct map_vhost *vhost_insert(struct cluster_map *map, struct bytes name)
{
    struct map_vhost *v = cluster_map_vhost(map, name);
    if (v != NULL)
        return v;
    ASSERT(map->vhosts_count < CLUSTER_VHOSTS_MAX);
    v = xcalloc(1, sizeof(*v));
    v->name = bytes_dup(name);
    hmap_init(&v->queues);
    hmap_init(&v->exchanges);
    hmap_init(&v->bindings);
    ptr_array_reserve((void ***)&map->vhosts, map->vhosts_count, &map->vhosts_cap);
    v->index = map->vhosts_count;
    map->vhosts[map->vhosts_count++] = v;
    hmap_put(&map->vhost_index, v->name, v);
    add_predeclared(map, v);
    return v;
}

static int op_vhost_delete(struct apply_ctx *ctx)
{
    struct bytes name = read_name(&ctx->reader, "name");
    if (ctx->reader.bad_key)
        return malformed(ctx);
    int rc;
    struct map_vhost *v = need_vhost(ctx, name, &rc);
    if (v == NULL)
        return rc;
    vhost_remove(ctx->map, v, ctx->change);
    ctx->change->changed = true;
    return OK;
}

static struct bytes *dup_list(const struct bytes *src, uint32_t count)
{
    struct bytes *out = xcalloc(count, sizeof(*out));
    for (uint32_t i = 0; i < count; i++)
        out[i] = bytes_dup(src[i]);
    return out;
}

/* ---- users and permissions ------------------------------------------------ */

static const char *const permission_keys[3] = {"configure", "write", "read"};

/* A user as user.put, a snapshot and users.bootstrap carry it. */
struct user_fields {
    struct bytes name, hash;
    uint32_t tags_count, vhosts_count;
    bool has_vhosts; /* absent in user.put from the API: permissions stay */
    bool loopback, any_vhost;
};

/* Reads a user. With NULL arrays it only counts; with arrays (sized by a
 * counting pass) it fills tags, vhosts and their 3 regexes each: ".*"
 * unless the "permissions" tables ({vhost, configure, write, read}) say. */
static void read_user(struct cmd_reader *r, struct user_fields *f, struct bytes *tags,
                      struct bytes *vhosts, struct bytes *texts)
{
    f->name = read_name(r, "name");
    f->hash = read_str(r, "password_hash", 0, CLUSTER_NAME_SIZE_MAX);
    f->tags_count = read_str_list(r, "tags", tags);
    struct field_value v;
    f->has_vhosts = table_get(r->table, "vhosts", &v);
    f->vhosts_count = f->has_vhosts ? read_str_list(r, "vhosts", vhosts) : 0;
    f->loopback = read_bool(r, "loopback", true);
    f->any_vhost = read_bool(r, "any_vhost", true);
    for (uint32_t i = 0; texts != NULL && i < 3 * f->vhosts_count; i++)
        texts[i] = BYTES_LIT(".*");
    if (!table_get(r->table, "permissions", &v))
        return;
    if (v.kind != 'A' || !f->has_vhosts) {
        reader_fail(r, "permissions");
        return;
    }
    struct array_iter it;
    array_iter_init(&it, v.array);
    struct field_value e;
    while (array_iter_next(&it, &e)) {
        if (e.kind != 'F') {
            reader_fail(r, "permissions");
            return;
        }
        struct cmd_reader pr = {e.table, NULL};
        struct bytes vhost = read_name(&pr, "vhost");
        struct bytes found[3];
        for (int k = 0; k < 3; k++)
            found[k] = read_str(&pr, permission_keys[k], 0, CLUSTER_NAME_SIZE_MAX);
        if (pr.bad_key != NULL) {
            reader_fail(r, "permissions");
            return;
        }
        uint32_t j = 0;
        while (vhosts != NULL && j < f->vhosts_count && !bytes_equal(vhosts[j], vhost))
            j++;
        if (vhosts != NULL && j == f->vhosts_count) {
            reader_fail(r, "permissions"); /* a permission for a vhost it lacks */
            return;
        }
        for (int k = 0; texts != NULL && k < 3; k++)
            texts[3 * j + (uint32_t)k] = found[k];
    }
}

/* regcomp is deterministic for a given text, so every broker refuses (or
 * accepts) alike. "" (nothing) and ".*" are not compiled by the broker. */
static int check_regexes(struct apply_ctx *ctx, const struct bytes *texts, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++) {
        char text[CLUSTER_NAME_SIZE_MAX + 1];
        if (memchr(texts[i].ptr, 0, texts[i].len) != NULL)
            return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "a regex with a NUL");
        memcpy(text, texts[i].ptr, texts[i].len);
        text[texts[i].len] = '\0';
        char err[200];
        if (text[0] != '\0' && auth_regex_check(text, err, sizeof err) != 0)
            return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "%s", err);
    }
    return OK;
}

/* Puts one user read by r (a command, or an element of a snapshot or a
 * bootstrap). bootstrap: the vhosts it names are created, not required.
 * check_only: decides, changes nothing. */
static int user_apply(struct apply_ctx *ctx, struct cmd_reader *r, bool bootstrap,
                      bool check_only)
{
    struct user_fields f;
    memset(&f, 0, sizeof f);
    read_user(r, &f, NULL, NULL, NULL);
    if (r->bad_key) {
        ctx->reader.bad_key = r->bad_key;
        return malformed(ctx);
    }
    struct bytes *tags = xcalloc(f.tags_count, sizeof(struct bytes));
    struct bytes *vhosts = xcalloc(f.vhosts_count, sizeof(struct bytes));
    struct bytes *texts = xcalloc(3 * (size_t)f.vhosts_count, sizeof(struct bytes));
    read_user(r, &f, tags, vhosts, texts);
    int rc = OK;
    if (r->bad_key) {
        ctx->reader.bad_key = r->bad_key;
        rc = malformed(ctx);
    }
    for (uint32_t i = 0; i < f.vhosts_count && rc == OK && !bootstrap; i++)
        need_vhost(ctx, vhosts[i], &rc);
    if (rc == OK)
        rc = check_regexes(ctx, texts, 3 * f.vhosts_count);
    struct cluster_map *map = ctx->map;
    struct map_user *u = cluster_map_user(map, f.name);
    if (rc == OK && u && ctx->restoring)
        rc = refuse(ctx, REPLY_PRECONDITION_FAILED, false, "user twice");
    if (rc == OK && !u && map->users_count == CLUSTER_USERS_MAX)
        rc = refuse(ctx, REPLY_PRECONDITION_FAILED, false, "user limit reached");
    if (rc == OK && !check_only) {
        for (uint32_t i = 0; i < f.vhosts_count && bootstrap; i++)
            vhost_insert(map, vhosts[i]);
        if (u && f.has_vhosts) {
            user_lists_release(u); /* tags, vhosts, permissions */
            bytes_free(&u->password_hash);
        } else if (u) { /* its permissions stay */
            for (uint32_t i = 0; i < u->tags_count; i++)
                bytes_free(&u->tags[i]);
            free(u->tags);
            bytes_free(&u->password_hash);
        } else {
            u = xcalloc(1, sizeof(*u));
            u->name = bytes_dup(f.name);
            ptr_array_reserve((void ***)&map->users, map->users_count, &map->users_cap);
            u->index = map->users_count;
            map->users[map->users_count++] = u;
            hmap_put(&map->user_index, u->name, u);
        }
        u->password_hash = bytes_dup(f.hash);
        u->tags = dup_list(tags, f.tags_count);
        u->tags_count = f.tags_count;
        if (f.has_vhosts) { /* a whole user: a snapshot's, a bootstrap's */
            u->vhosts = dup_list(vhosts, f.vhosts_count);
            u->permissions = dup_list(texts, 3 * f.vhosts_count);
            u->vhosts_count = f.vhosts_count;
            u->loopback = f.loopback;
            u->any_vhost = f.any_vhost;
        }
        map->users_defined = true;
        ctx->change->changed = true;
    }
    free(tags);
    free(vhosts);
    free(texts);
    return rc;
}

static int op_user_put(struct apply_ctx *ctx)
{
    return user_apply(ctx, &ctx->reader, false, false);
}

static int op_user_delete(struct apply_ctx *ctx)
{
    struct bytes name = read_name(&ctx->reader, "name");
    if (ctx->reader.bad_key)
        return malformed(ctx);
    struct map_user *u = cluster_map_user(ctx->map, name);
    if (u == NULL)
        return refuse(ctx, REPLY_NOT_FOUND, false, "no user '%.*s'", NAME_ARG(name));
    limit_set_delete_all(&ctx->map->limits, LIMIT_SCOPE_USER, name);
    user_remove(ctx->map, u);
    ctx->map->users_defined = true;
    ctx->change->changed = true;
    return OK;
}

static int op_permission_put(struct apply_ctx *ctx)
{
    struct cmd_reader *r = &ctx->reader;
    struct bytes user = read_name(r, "user");
    struct bytes vhost = read_name(r, "vhost");
    struct bytes texts[3];
    for (int k = 0; k < 3; k++)
        texts[k] = read_str(r, permission_keys[k], 0, CLUSTER_NAME_SIZE_MAX);
    if (r->bad_key)
        return malformed(ctx);
    struct map_user *u = cluster_map_user(ctx->map, user);
    if (u == NULL)
        return refuse(ctx, REPLY_NOT_FOUND, false, "no user '%.*s'", NAME_ARG(user));
    int rc;
    if (need_vhost(ctx, vhost, &rc) == NULL)
        return rc;
    if ((rc = check_regexes(ctx, texts, 3)) != OK)
        return rc;
    ctx->map->users_defined = true;
    uint32_t j = 0;
    while (j < u->vhosts_count && !bytes_equal(u->vhosts[j], vhost))
        j++;
    if (j == u->vhosts_count) {
        u->vhosts = realloc(u->vhosts, sizeof(u->vhosts[0]) * (j + 1));
        u->permissions = realloc(u->permissions, sizeof(u->permissions[0]) * 3 * (j + 1));
        ASSERT(u->vhosts != NULL && u->permissions != NULL);
        u->vhosts[j] = bytes_dup(vhost);
        for (int k = 0; k < 3; k++)
            u->permissions[3 * j + (uint32_t)k] = bytes_dup(texts[k]);
        u->vhosts_count++;
        ctx->change->changed = true;
        return OK;
    }
    for (int k = 0; k < 3; k++) {
        struct bytes *old = &u->permissions[3 * j + (uint32_t)k];
        if (!bytes_equal(*old, texts[k])) {
            bytes_free(old);
            *old = bytes_dup(texts[k]);
            ctx->change->changed = true;
        }
    }
    return OK;
}

static int op_permission_delete(struct apply_ctx *ctx)
{
    struct bytes user = read_name(&ctx->reader, "user");
    struct bytes vhost = read_name(&ctx->reader, "vhost");
    if (ctx->reader.bad_key)
        return malformed(ctx);
    struct map_user *u = cluster_map_user(ctx->map, user);
    uint32_t j = 0;
    while (u != NULL && j < u->vhosts_count && !bytes_equal(u->vhosts[j], vhost))
        j++;
    if (u == NULL || j == u->vhosts_count)
        return refuse(ctx, REPLY_NOT_FOUND, false, "no permission for user '%.*s' in vhost "
                      "'%.*s'", NAME_ARG(user), NAME_ARG(vhost));
    user_permission_remove(u, j);
    ctx->map->users_defined = true;
    ctx->change->changed = true;
    return OK;
}

/* users.bootstrap {users: [..]}: all or nothing, checked first. */
static int op_users_bootstrap(struct apply_ctx *ctx)
{
    struct field_value v;
    if (!table_get(ctx->reader.table, "users", &v) || v.kind != 'A') {
        reader_fail(&ctx->reader, "users");
        return malformed(ctx);
    }
    if (ctx->map->users_defined)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "users are already defined");
    for (int pass = 0; pass < 2; pass++) {
        struct array_iter it;
        array_iter_init(&it, v.array);
        struct field_value e;
        uint32_t count = 0;
        uint64_t vhosts_named = 0; /* an upper bound of the vhosts it creates */
        while (array_iter_next(&it, &e)) {
            if (e.kind != 'F' || ++count > CLUSTER_USERS_MAX) {
                reader_fail(&ctx->reader, "users");
                return malformed(ctx);
            }
            struct cmd_reader r = {e.table, NULL};
            struct user_fields f;
            read_user(&r, &f, NULL, NULL, NULL);
            vhosts_named += f.vhosts_count;
            r.bad_key = NULL;
            int rc = user_apply(ctx, &r, true, pass == 0);
            ASSERT(pass == 0 || rc == OK);
            if (rc != OK)
                return rc;
        }
        if (pass == 0 && ctx->map->vhosts_count + vhosts_named > CLUSTER_VHOSTS_MAX)
            return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "vhost limit reached");
    }
    ctx->map->users_defined = true;
    ctx->change->changed = true;
    return OK;
}

/* ---- exchanges and bindings ----------------------------------------------- */

static int exchange_equivalent(struct apply_ctx *ctx, const struct map_exchange *x,
                               const struct map_exchange_decl *d)
{
    struct exchange_decl current = {x->type, x->durable, x->auto_delete, x->internal,
                                    {x->arguments.ptr, x->arguments.len}};
    struct exchange_decl received = {d->type, d->durable, d->auto_delete, d->internal,
                                     d->arguments};
    uint16_t code = 0;
    char text[MAP_REPLY_TEXT_SIZE];
    if (!exchange_redeclare_equivalent(&current, &received, d->name, d->vhost, &code, text,
                                       sizeof(text)))
        return refuse(ctx, code, false, "%s", text);
    return OK;
}

static void read_exchange_decl(struct cmd_reader *r, struct map_exchange_decl *d)
{
    d->vhost = read_name(r, "vhost");
    d->name = read_name(r, "name");
    d->type = read_name(r, "type");
    d->durable = read_bool(r, "durable", false);
    d->auto_delete = read_bool(r, "auto_delete", false);
    d->internal = read_bool(r, "internal", false);
    d->arguments = read_table(r, "arguments");
    d->owner_id = read_broker_id(r, "owner");
}

static struct map_exchange *exchange_insert(struct cluster_map *map, struct map_vhost *v,
                                            const struct map_exchange_decl *d)
{
    struct map_exchange *x = xcalloc(1, sizeof(*x));
    x->vhost = v;
    x->name = bytes_dup(d->name);
    x->type = bytes_dup(d->type);
    x->durable = d->durable;
    x->auto_delete = d->auto_delete;
    x->internal = d->internal;
    x->arguments = bytes_dup((struct bytes){d->arguments.ptr, d->arguments.len});
    x->owner_id = d->owner_id;
    list_init(&x->bindings_out);
    list_init(&x->bindings_in);
    ptr_array_reserve((void ***)&map->exchanges, map->exchanges_count, &map->exchanges_cap);
    x->index = map->exchanges_count;
    map->exchanges[map->exchanges_count++] = x;
    hmap_put(&v->exchanges, x->name, x);
    exchange_count(map, x, +1);
    return x;
}

static int op_exchange_declare(struct apply_ctx *ctx)
{
    struct map_exchange_decl d;
    read_exchange_decl(&ctx->reader, &d);
    if (ctx->reader.bad_key)
        return malformed(ctx);
    int rc;
    struct map_vhost *v = need_vhost(ctx, d.vhost, &rc);
    if (v == NULL)
        return rc;
    struct cluster_map *map = ctx->map;
    struct map_exchange *x = hmap_get(&v->exchanges, d.name);
    if (x && ctx->restoring)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "exchange twice");
    if (x) {
        ctx->change->exchange = x;
        return exchange_equivalent(ctx, x, &d);
    }
    rc = check_broker_usable(ctx, d.owner_id, "exchange", d.name);
    if (rc != OK)
        return rc;
    if (map->exchanges_count == CLUSTER_EXCHANGES_MAX)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "exchange limit reached");
    uint64_t since = map->version;
    if (ctx->restoring) {
        since = read_uint(&ctx->reader, "since", INT64_MAX, true, 0);
        if (ctx->reader.bad_key)
            return malformed(ctx);
    }
    x = exchange_insert(map, v, &d);
    x->owned_since = since;
    ctx->change->exchange = x;
    ctx->change->changed = true;
    return OK;
}

static int op_exchange_delete(struct apply_ctx *ctx)
{
    struct cmd_reader *r = &ctx->reader;
    struct bytes vhost = read_name(r, "vhost");
    struct bytes name = read_name(r, "name");
    bool if_unused = read_bool(r, "if_unused", true);
    if (r->bad_key)
        return malformed(ctx);
    struct map_exchange *x = cluster_map_exchange(ctx->map, vhost, name);
    if (x == NULL)
        return OK;
    if (if_unused && x->bindings_out_count > 0)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                      "exchange '%.*s' in vhost '%.*s' in use", NAME_ARG(name),
                      NAME_ARG(vhost));
    struct removed removed = {0};
    exchange_remove(ctx->map, x, &removed);
    ctx->change->bindings_deleted_count = removed.bindings;
    ctx->change->exchanges_deleted_count = 1 + removed.exchanges;
    ctx->change->changed = true;
    return OK;
}

static int op_exchange_set_owner(struct apply_ctx *ctx)
{
    struct cmd_reader *r = &ctx->reader;
    struct bytes vhost = read_name(r, "vhost");
    struct bytes name = read_name(r, "name");
    uint32_t owner = read_broker_id(r, "owner");
    if (r->bad_key)
        return malformed(ctx);
    struct map_exchange *x = cluster_map_exchange(ctx->map, vhost, name);
    if (x == NULL)
        return refuse(ctx, REPLY_NOT_FOUND, false, "no exchange '%.*s' in vhost '%.*s'",
                      NAME_ARG(name), NAME_ARG(vhost));
    int rc = check_broker_usable(ctx, owner, "exchange", name);
    if (rc != OK)
        return rc;
    ctx->change->exchange = x;
    if (x->owner_id == owner)
        return OK;
    exchange_count(ctx->map, x, -1);
    x->owner_id = owner;
    x->owned_since = ctx->map->version;
    exchange_count(ctx->map, x, +1);
    ctx->change->changed = true;
    return OK;
}

static void read_binding_decl(struct cmd_reader *r, struct map_binding_decl *d)
{
    d->vhost = read_name(r, "vhost");
    d->source = read_name(r, "source");
    struct bytes kind = read_name(r, "destination_kind");
    if (bytes_equal_cstr(kind, "queue"))
        d->destination_kind = MAP_DESTINATION_QUEUE;
    else if (bytes_equal_cstr(kind, "exchange"))
        d->destination_kind = MAP_DESTINATION_EXCHANGE;
    else
        reader_fail(r, "destination_kind");
    d->destination = read_name(r, "destination");
    d->routing_key = read_str(r, "routing_key", 0, CLUSTER_NAME_SIZE_MAX);
    d->arguments = read_table(r, "arguments");
}

/* The binding's identity: every part length-prefixed, so distinct
 * bindings never share a key. */
static size_t binding_key(const struct map_binding_decl *d, uint8_t *out, size_t cap)
{
    size_t n = 1 + d->source.len + 1 + 1 + d->destination.len + 1 + d->routing_key.len +
               d->arguments.len;
    if (out == NULL || cap < n)
        return n;
    uint8_t *p = out;
    *p++ = (uint8_t)d->source.len;
    memcpy(p, d->source.ptr, d->source.len);
    p += d->source.len;
    *p++ = (uint8_t)d->destination_kind;
    *p++ = (uint8_t)d->destination.len;
    memcpy(p, d->destination.ptr, d->destination.len);
    p += d->destination.len;
    *p++ = (uint8_t)d->routing_key.len;
    if (d->routing_key.len)
        memcpy(p, d->routing_key.ptr, d->routing_key.len);
    p += d->routing_key.len;
    if (d->arguments.len)
        memcpy(p, d->arguments.ptr, d->arguments.len);
    p += d->arguments.len;
    ASSERT((size_t)(p - out) == n);
    return n;
}

/* Finds source and destination; the list the binding joins at the
 * destination goes in *dest_list. */
static int binding_ends(struct apply_ctx *ctx, const struct map_binding_decl *d,
                        struct map_exchange **source, struct list_node **dest_list)
{
    int rc;
    struct map_vhost *v = need_vhost(ctx, d->vhost, &rc);
    if (v == NULL)
        return rc;
    *source = hmap_get(&v->exchanges, d->source);
    if (*source == NULL)
        return refuse(ctx, REPLY_NOT_FOUND, false, "no exchange '%.*s' in vhost '%.*s'",
                      NAME_ARG(d->source), NAME_ARG(d->vhost));
    if (d->destination_kind == MAP_DESTINATION_QUEUE) {
        struct map_queue *q = hmap_get(&v->queues, d->destination);
        if (q == NULL)
            return refuse(ctx, REPLY_NOT_FOUND, false, "no queue '%.*s' in vhost '%.*s'",
                          NAME_ARG(d->destination), NAME_ARG(d->vhost));
        *dest_list = &q->bindings_in;
    } else {
        struct map_exchange *x = hmap_get(&v->exchanges, d->destination);
        if (x == NULL)
            return refuse(ctx, REPLY_NOT_FOUND, false, "no exchange '%.*s' in vhost '%.*s'",
                          NAME_ARG(d->destination), NAME_ARG(d->vhost));
        *dest_list = &x->bindings_in;
    }
    ctx->change->exchange = *source;
    return OK;
}

static int op_bind(struct apply_ctx *ctx, bool bind)
{
    struct map_binding_decl d;
    read_binding_decl(&ctx->reader, &d);
    if (ctx->reader.bad_key)
        return malformed(ctx);
    ctx->change->binding = d;
    struct map_exchange *source = NULL;
    struct list_node *dest_list = NULL;
    int rc = binding_ends(ctx, &d, &source, &dest_list);
    if (rc != OK)
        return rc;
    struct cluster_map *map = ctx->map;
    size_t key_size = binding_key(&d, NULL, 0);
    uint8_t *key = malloc(key_size);
    ASSERT(key != NULL);
    binding_key(&d, key, key_size);
    struct bytes kb = {key, (uint32_t)key_size};
    struct map_binding *b = hmap_get(&source->vhost->bindings, kb);
    if (!bind || b) {
        free(key);
        if (b && ctx->restoring)
            return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "binding twice");
        if (b && !bind) {
            binding_remove(map, b);
            ctx->change->bindings_deleted_count = 1;
            ctx->change->changed = true;
            struct removed removed = {0};
            exchange_maybe_auto_delete(map, source, &removed);
            ctx->change->bindings_deleted_count += removed.bindings;
            ctx->change->exchanges_deleted_count = removed.exchanges;
            if (removed.exchanges > 0)
                ctx->change->exchange = NULL; /* gone: the mirror drops it too */
        }
        return OK;
    }
    if (map->bindings_count == CLUSTER_BINDINGS_MAX) {
        free(key);
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "binding limit reached");
    }
    b = xcalloc(1, sizeof(*b));
    b->source = source;
    b->destination_kind = d.destination_kind;
    b->key = kb;
    /* The parts are slices of the key (see binding_key for the layout). */
    const uint8_t *p = key + 1 + d.source.len + 1;
    b->destination = (struct bytes){p + 1, d.destination.len};
    p += 1 + d.destination.len;
    b->routing_key = (struct bytes){p + 1, d.routing_key.len};
    p += 1 + d.routing_key.len;
    b->arguments = (struct bytes){p, d.arguments.len};
    ASSERT(bytes_equal(b->destination, d.destination));
    list_push_back(&source->bindings_out, &b->source_node);
    list_push_back(dest_list, &b->destination_node);
    source->bindings_out_count++;
    map->bindings_count++;
    hmap_put(&source->vhost->bindings, b->key, b);
    ctx->change->changed = true;
    return OK;
}

/* ---- queues --------------------------------------------------------------- */

static void read_queue_decl(struct cmd_reader *r, struct map_queue_decl *d)
{
    d->vhost = read_name(r, "vhost");
    d->name = read_name(r, "name");
    d->durable = read_bool(r, "durable", false);
    d->exclusive = read_bool(r, "exclusive", false);
    d->auto_delete = read_bool(r, "auto_delete", false);
    d->arguments = read_table(r, "arguments");
    d->exclusive_connection_id = read_uint(r, "connection", INT64_MAX, true, 0);
    d->exclusive_owner_id = (uint32_t)read_uint(r, "owner", UINT32_MAX, true, 0);
    d->primary_id = read_broker_id(r, "primary");
    if (d->exclusive_owner_id == BROKER_ID_NONE)
        d->exclusive_owner_id = d->primary_id; /* written before queues could live
                                                * apart from their connection */
    d->backups_count = read_ids(r, "backups", d->backup_ids);
    d->replication_factor =
        (uint8_t)read_uint(r, "replication_factor", CLUSTER_BACKUPS_MAX + 1, false, 1);
    d->replaces_epoch = read_uint(r, "replaces", INT64_MAX, true, 0);
    if (d->replication_factor == 0)
        reader_fail(r, "replication_factor");
}

/* Backups are distinct, never the primary, and usable brokers; so is the
 * primary if check_primary (a new queue; a queue whose primary is down may
 * still have its backups changed). */
static int check_placement(struct apply_ctx *ctx, struct bytes name, uint32_t primary,
                           bool check_primary, const uint32_t *backups, uint8_t count)
{
    int rc = check_primary ? check_broker_usable(ctx, primary, "queue", name) : OK;
    for (uint8_t i = 0; i < count && rc == OK; i++) {
        if (backups[i] == primary)
            return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                          "broker %u is both primary and backup of queue '%.*s'", primary,
                          NAME_ARG(name));
        for (uint8_t j = 0; j < i; j++) {
            if (backups[j] == backups[i])
                return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                              "broker %u is a backup of queue '%.*s' twice", backups[i],
                              NAME_ARG(name));
        }
        rc = check_broker_usable(ctx, backups[i], "queue", name);
    }
    return rc;
}

static int queue_equivalent(struct apply_ctx *ctx, const struct map_queue *q,
                            const struct map_queue_decl *d, uint32_t origin_id)
{
    bool other_owner = q->exclusive && (q->exclusive_owner_id != origin_id ||
                                        q->exclusive_connection_id != d->exclusive_connection_id);
    if (other_owner || q->exclusive != d->exclusive)
        return refuse(ctx, REPLY_RESOURCE_LOCKED, false,
                      "cannot obtain exclusive access to locked queue '%.*s' in vhost '%.*s'. "
                      "It could be originally declared on another connection or the exclusive "
                      "property value does not match that of the original declaration.",
                      NAME_ARG(d->name), NAME_ARG(d->vhost));
    struct queue_decl current = {q->durable, q->auto_delete,
                                 {q->arguments.ptr, q->arguments.len}};
    struct queue_decl received = {d->durable, d->auto_delete, d->arguments};
    uint16_t code = 0;
    char text[MAP_REPLY_TEXT_SIZE];
    if (!queue_redeclare_equivalent(&current, &received, d->name, d->vhost, &code, text,
                                    sizeof(text)))
        return refuse(ctx, code, false, "%s", text);
    return OK;
}

/* Snapshot-only queue fields: epoch, availability and the in-sync set. */
static void read_queue_state(struct cmd_reader *r, struct map_queue *q)
{
    q->epoch = read_uint(r, "epoch", INT64_MAX, false, 0);
    q->owned_since = read_uint(r, "since", INT64_MAX, true, 0);
    q->available = read_bool(r, "available", false);
    q->move_to = (uint32_t)read_uint(r, "move_to", UINT32_MAX, true, BROKER_ID_NONE);
    if (q->move_to != BROKER_ID_NONE && backup_slot(q, q->move_to) < 0)
        reader_fail(r, "move_to");
    q->move_from = (uint32_t)read_uint(r, "move_from", UINT32_MAX, true, BROKER_ID_NONE);
    q->taken_from = (uint32_t)read_uint(r, "taken_from", UINT32_MAX, true, BROKER_ID_NONE);
    q->taken_from_before =
        (uint32_t)read_uint(r, "taken_from_before", UINT32_MAX, true, BROKER_ID_NONE);
    q->adopted = read_bool(r, "adopted", true);
    if (q->move_from != BROKER_ID_NONE &&
        (backup_slot(q, q->move_from) < 0 || q->move_to == BROKER_ID_NONE))
        reader_fail(r, "move_from");
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = read_ids(r, "in_sync", ids);
    q->in_sync_mask = 0;
    for (uint8_t i = 0; i < n; i++) {
        int slot = backup_slot(q, ids[i]);
        if (slot < 0 || (q->in_sync_mask & (1u << slot)))
            reader_fail(r, "in_sync");
        else
            q->in_sync_mask |= (uint8_t)(1u << slot);
    }
    if (q->epoch == 0)
        reader_fail(r, "epoch");
}

/* The vhost's max-queues, checked here where the count is the cluster's
 * and agreed: two brokers that each checked their own copy of the map
 * before proposing could otherwise both take the last place. (A snapshot
 * holds what was already allowed.) RabbitMQ's words. */
static int check_max_queues(struct apply_ctx *ctx, const struct map_vhost *v, struct bytes name)
{
    int64_t max = limit_set_value(&ctx->map->limits, LIMIT_SCOPE_VHOST, v->name,
                                  LIMIT_MAX_QUEUES);
    if (limit_allows(max, v->queues.count))
        return OK;
    return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                  "cannot declare queue '%.*s': queue limit in vhost '%.*s' (%lld) is reached",
                  NAME_ARG(name), NAME_ARG(v->name), (long long)max);
}

static int op_queue_declare(struct apply_ctx *ctx)
{
    struct map_queue_decl d;
    struct cmd_reader *r = &ctx->reader;
    read_queue_decl(r, &d);
    uint32_t origin = ctx->restoring ? d.primary_id : read_broker_id(r, "origin");
    /* A snapshot may hold one backup beyond the factor: a move's target, or a
     * replacement catching up (queue.move, queue.set_backups). */
    if (!r->bad_key && d.backups_count >= d.replication_factor && !ctx->restoring)
        reader_fail(r, "backups");
    if (r->bad_key)
        return malformed(ctx);
    int rc;
    struct map_vhost *v = need_vhost(ctx, d.vhost, &rc);
    if (v == NULL)
        return rc;
    struct cluster_map *map = ctx->map;
    struct map_queue *q = hmap_get(&v->queues, d.name);
    if (q && ctx->restoring)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "queue twice");
    if (q && d.replaces_epoch != 0 && q->epoch == d.replaces_epoch) {
        /* Gone at its primary already: this declare is a new queue. */
        ctx->change->bindings_deleted_count =
            queue_remove(map, q, &ctx->change->exchanges_deleted_count);
        ctx->change->queues_deleted_count = 1;
        q = NULL;
    }
    if (q) {
        ctx->change->queue = q;
        return queue_equivalent(ctx, q, &d, origin);
    }
    rc = check_placement(ctx, d.name, d.primary_id, true, d.backup_ids, d.backups_count);
    if (rc != OK)
        return rc;
    if (map->queues_count == CLUSTER_QUEUES_MAX)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "queue limit reached");
    if (!ctx->restoring && (rc = check_max_queues(ctx, v, d.name)) != OK)
        return rc;
    q = xcalloc(1, sizeof(*q));
    q->vhost = v;
    q->durable = d.durable;
    q->exclusive = d.exclusive;
    q->auto_delete = d.auto_delete;
    q->exclusive_connection_id = d.exclusive ? d.exclusive_connection_id : 0;
    q->exclusive_owner_id = d.exclusive ? d.exclusive_owner_id : BROKER_ID_NONE;
    q->primary_id = d.primary_id;
    memcpy(q->backup_ids, d.backup_ids, sizeof(q->backup_ids));
    q->backups_count = d.backups_count;
    q->replication_factor = d.replication_factor;
    /* A new queue is empty, so every backup is trivially in sync. Its epoch
     * is the map version: higher than any epoch an earlier queue of the
     * same name reached (epochs grow by one per command at most). */
    q->in_sync_mask = (uint8_t)((1u << d.backups_count) - 1);
    q->epoch = map->version;
    q->owned_since = map->version;
    q->available = true;
    if (ctx->restoring) {
        read_queue_state(r, q);
        if (r->bad_key) {
            free(q);
            return malformed(ctx);
        }
    }
    q->name = bytes_dup(d.name);
    q->arguments = bytes_dup((struct bytes){d.arguments.ptr, d.arguments.len});
    list_init(&q->bindings_in);
    ptr_array_reserve((void ***)&map->queues, map->queues_count, &map->queues_cap);
    q->index = map->queues_count;
    map->queues[map->queues_count++] = q;
    hmap_put(&v->queues, q->name, q);
    queue_count(map, q, +1);
    ctx->change->queue = q;
    ctx->change->changed = true;
    return OK;
}

/* Reads vhost, name and the expected epoch of a queue.set_* command and
 * finds the queue. expected 0 (only allowed for delete) matches any. */
static struct map_queue *find_queue_cas(struct apply_ctx *ctx, bool epoch_required, int *rc)
{
    struct cmd_reader *r = &ctx->reader;
    struct bytes vhost = read_name(r, "vhost");
    struct bytes name = read_name(r, "name");
    uint64_t expected = read_uint(r, "epoch", INT64_MAX, !epoch_required, 0);
    if (epoch_required && expected == 0)
        reader_fail(r, "epoch");
    *rc = OK;
    if (r->bad_key) {
        *rc = malformed(ctx);
        return NULL;
    }
    struct map_queue *q = cluster_map_queue(ctx->map, vhost, name);
    if (q == NULL) {
        if (epoch_required)
            *rc = refuse(ctx, REPLY_NOT_FOUND, false, "no queue '%.*s' in vhost '%.*s'",
                         NAME_ARG(name), NAME_ARG(vhost));
        return NULL;
    }
    ctx->change->previous_epoch = q->epoch;
    ctx->change->previous_primary_id = q->primary_id;
    if (expected != 0 && q->epoch != expected) {
        *rc = refuse(ctx, REPLY_PRECONDITION_FAILED, true,
                     "queue '%.*s' in vhost '%.*s' is at epoch %llu, not %llu", NAME_ARG(name),
                     NAME_ARG(vhost), (unsigned long long)q->epoch,
                     (unsigned long long)expected);
        return NULL;
    }
    ctx->change->queue = q;
    return q;
}

static int op_queue_delete(struct apply_ctx *ctx)
{
    int rc;
    struct map_queue *q = find_queue_cas(ctx, false, &rc);
    if (q == NULL)
        return rc;
    ctx->change->queue = NULL;
    ctx->change->bindings_deleted_count =
        queue_remove(ctx->map, q, &ctx->change->exchanges_deleted_count);
    ctx->change->queues_deleted_count = 1;
    ctx->change->changed = true;
    return OK;
}

/* Takes the backup in slot out; the others keep their order and sync.
 * The caller keeps the counts (queue_count) right. */
static void drop_backup_slot(struct map_queue *q, int slot)
{
    ASSERT(slot >= 0 && slot < q->backups_count);
    uint8_t low = (uint8_t)(q->in_sync_mask & ((1u << slot) - 1));
    uint8_t high = (uint8_t)((q->in_sync_mask >> (slot + 1)) << slot);
    memmove(&q->backup_ids[slot], &q->backup_ids[slot + 1],
            (size_t)(q->backups_count - slot - 1) * sizeof(uint32_t));
    q->backups_count--;
    q->backup_ids[q->backups_count] = BROKER_ID_NONE;
    q->in_sync_mask = low | high;
}

static int op_queue_set_owner(struct apply_ctx *ctx)
{
    uint32_t primary = read_broker_id(&ctx->reader, "primary");
    bool planned = read_bool(&ctx->reader, "planned", true);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    rc = check_broker_usable(ctx, primary, "queue", q->name);
    if (rc != OK)
        return rc;
    /* A backup out of sync may lack confirmed messages: never promoted
     * (the primary may have dropped it from the set just before). A
     * planned handover goes only to the in-sync backup the move names: a
     * primary that gave up waiting cancels the move first (queue.move to
     * none), so a handover still on its way can no longer apply. */
    int slot = backup_slot(q, primary);
    if ((slot >= 0 && !(q->in_sync_mask & (1u << slot))) ||
        (planned && (slot < 0 || q->move_to != primary)))
        return refuse(ctx, REPLY_PRECONDITION_FAILED, true,
                      "broker %u is not an in-sync backup of queue '%.*s'", primary,
                      NAME_ARG(q->name));
    struct cluster_map *map = ctx->map;
    queue_count(map, q, -1);
    /* The new primary leaves the backups; the others keep order and sync. */
    if (slot >= 0)
        drop_backup_slot(q, slot);
    q->primary_id = primary;
    q->epoch++;
    q->owned_since = map->version;
    q->available = true;
    q->move_to = BROKER_ID_NONE; /* done, or overtaken by a failover */
    q->move_from = BROKER_ID_NONE;
    q->taken_from = BROKER_ID_NONE;
    q->taken_from_before = BROKER_ID_NONE;
    q->adopted = false;
    queue_count(map, q, +1);
    ASSERT(!map_queue_has_backup(q, primary));
    ctx->change->planned = planned;
    ctx->change->changed = true;
    return OK;
}

static int op_queue_set_backups(struct apply_ctx *ctx)
{
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = read_ids(&ctx->reader, "backups", ids);
    /* Optional: a policy changed the factor (0 = unchanged). */
    uint8_t factor = (uint8_t)read_uint(&ctx->reader, "replication_factor",
                                        CLUSTER_BACKUPS_MAX + 1, true, 0);
    if (factor != 0 && n >= factor)
        reader_fail(&ctx->reader, "replication_factor");
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    rc = check_placement(ctx, q->name, q->primary_id, false, ids, n);
    if (rc != OK)
        return rc;
    if (factor != 0)
        q->replication_factor = factor;
    uint8_t mask = 0;
    for (uint8_t i = 0; i < n; i++) {
        if (map_queue_backup_in_sync(q, ids[i]))
            mask |= (uint8_t)(1u << i);
    }
    queue_count(ctx->map, q, -1);
    memset(q->backup_ids, 0, sizeof(q->backup_ids));
    memcpy(q->backup_ids, ids, n * sizeof(uint32_t));
    q->backups_count = n;
    q->in_sync_mask = mask;
    /* The move ends when its target is no longer a backup, and a backup
     * move when the backup it replaces left (done). */
    if (!map_queue_has_backup(q, q->move_to) ||
        (q->move_from != BROKER_ID_NONE && !map_queue_has_backup(q, q->move_from))) {
        q->move_to = BROKER_ID_NONE;
        q->move_from = BROKER_ID_NONE;
    }
    queue_count(ctx->map, q, +1);
    ctx->change->changed = true;
    return OK;
}

/* queue.move: see map_queue.move_to. A target that is not a backup yet
 * becomes one (not in sync: its primary catches it up), beyond the factor
 * for the time of the move; ending a move takes such an extra backup away
 * again. */
static int op_queue_move(struct apply_ctx *ctx)
{
    uint32_t to = (uint32_t)read_uint(&ctx->reader, "to", UINT32_MAX, false, 0);
    uint32_t from = (uint32_t)read_uint(&ctx->reader, "from", UINT32_MAX, true, BROKER_ID_NONE);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    if (to == BROKER_ID_NONE) {
        int slot = backup_slot(q, q->move_to);
        ctx->change->changed = q->move_to != BROKER_ID_NONE;
        q->move_to = BROKER_ID_NONE;
        q->move_from = BROKER_ID_NONE;
        if (slot >= 0 && q->backups_count >= q->replication_factor) {
            queue_count(ctx->map, q, -1);
            drop_backup_slot(q, slot);
            queue_count(ctx->map, q, +1);
        }
        return OK;
    }
    if (to == q->primary_id)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                      "broker %u is already the primary of queue '%.*s'", to, NAME_ARG(q->name));
    rc = check_broker_usable(ctx, to, "queue", q->name);
    if (rc != OK)
        return rc;
    if (from != BROKER_ID_NONE && (!map_queue_has_backup(q, from) || map_queue_has_backup(q, to)))
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                      "a backup move of queue '%.*s' goes from one of its backups (%u) to a "
                      "broker that is not one (%u)", NAME_ARG(q->name), from, to);
    if (!map_queue_has_backup(q, to)) {
        if (q->backups_count == CLUSTER_BACKUPS_MAX)
            return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                          "queue '%.*s' has %u backups already: move it to one of them",
                          NAME_ARG(q->name), CLUSTER_BACKUPS_MAX);
        queue_count(ctx->map, q, -1);
        q->backup_ids[q->backups_count++] = to;
        queue_count(ctx->map, q, +1);
        ctx->change->changed = true;
    }
    ctx->change->changed |= q->move_to != to || q->move_from != from;
    q->move_to = to;
    q->move_from = from;
    return OK;
}

static int op_queue_set_in_sync(struct apply_ctx *ctx)
{
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = read_ids(&ctx->reader, "in_sync", ids);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    uint8_t mask = 0;
    for (uint8_t i = 0; i < n; i++) {
        int slot = backup_slot(q, ids[i]);
        if (slot < 0)
            return refuse(ctx, REPLY_PRECONDITION_FAILED, true,
                          "broker %u is not a backup of queue '%.*s'", ids[i],
                          NAME_ARG(q->name));
        mask |= (uint8_t)(1u << slot);
    }
    ctx->change->changed = mask != q->in_sync_mask;
    q->in_sync_mask = mask;
    return OK;
}

static int op_queue_set_available(struct apply_ctx *ctx)
{
    bool available = read_bool(&ctx->reader, "available", false);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    if (q->available == available)
        return OK;
    if (available) {
        rc = check_broker_usable(ctx, q->primary_id, "queue", q->name);
        if (rc != OK)
            return rc;
        /* The returning primary starts a new incarnation of the queue. */
        q->epoch++;
        q->owned_since = ctx->map->version;
    }
    q->available = available;
    ctx->change->changed = true;
    return OK;
}

/* The dead primary's log is adopted from shared storage by the new one
 * (queue.take_over): only a durable queue, from a broker that is down, to
 * one that is up, shares its storage and is not a backup (its replica
 * would hold a second copy of what the log gives back). */
static int op_queue_take_over(struct apply_ctx *ctx)
{
    uint32_t primary = read_broker_id(&ctx->reader, "primary");
    uint32_t from = read_broker_id(&ctx->reader, "from");
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    rc = check_broker_usable(ctx, primary, "queue", q->name);
    if (rc != OK)
        return rc;
    const struct map_broker *dead = cluster_map_broker(ctx->map, from);
    if (q->primary_id != from || dead->state != BROKER_STATE_DOWN)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, true,
                      "queue '%.*s' is not owned by broker %u, down", NAME_ARG(q->name), from);
    if (!q->durable || q->exclusive || map_queue_has_backup(q, primary) ||
        !map_brokers_share_storage(dead, cluster_map_broker(ctx->map, primary)))
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                      "broker %u cannot take queue '%.*s' over from broker %u", primary,
                      NAME_ARG(q->name), from);
    struct cluster_map *map = ctx->map;
    queue_count(map, q, -1);
    memset(q->backup_ids, 0, sizeof(q->backup_ids)); /* none in sync: see controller.h */
    q->backups_count = 0;
    q->in_sync_mask = 0;
    q->primary_id = primary;
    q->epoch++;
    q->owned_since = map->version;
    q->available = true;
    q->move_to = BROKER_ID_NONE;
    q->move_from = BROKER_ID_NONE;
    /* (NONE unless from took it over itself and never said it adopted.) */
    q->taken_from_before = q->adopted ? BROKER_ID_NONE : q->taken_from;
    q->taken_from = from;
    q->adopted = false;
    queue_count(map, q, +1);
    ctx->change->changed = true;
    return OK;
}

static int op_queue_adopted(struct apply_ctx *ctx)
{
    uint32_t primary = read_broker_id(&ctx->reader, "primary");
    int rc;
    struct map_queue *q = find_queue_cas(ctx, false, &rc);
    if (q == NULL || q->primary_id != primary || q->taken_from == BROKER_ID_NONE ||
        q->adopted)
        return rc; /* gone, or moved on, or said already: no change */
    q->adopted = true;
    ctx->change->changed = true;
    return OK;
}

/* ---- policies ------------------------------------------------------------- */

static void read_policy_decl(struct cmd_reader *r, struct policy_decl *d)
{
    d->vhost = read_name(r, "vhost");
    d->name = read_name(r, "name");
    d->pattern = read_name(r, "pattern");
    d->priority = (uint32_t)read_uint(r, "priority", POLICY_PRIORITY_MAX, false, 0);
    d->backups = (uint8_t)read_uint(r, "backups", CLUSTER_BACKUPS_MAX, false, 0);
}

static int op_policy_put(struct apply_ctx *ctx)
{
    struct policy_decl d;
    read_policy_decl(&ctx->reader, &d);
    if (ctx->reader.bad_key)
        return malformed(ctx);
    int rc;
    if (need_vhost(ctx, d.vhost, &rc) == NULL)
        return rc;
    /* regcomp is deterministic for a given pattern, so every broker
     * refuses (or accepts) the same command alike. */
    char err[POLICY_ERROR_SIZE];
    if (policy_decl_check(&d, err, sizeof err) != OK)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "policy '%.*s': %s",
                      NAME_ARG(d.name), err);
    struct policy_set *set = &ctx->map->policies;
    bool exists = policy_set_find(set, d.vhost, d.name) != NULL;
    if (exists && ctx->restoring)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "policy twice");
    if (!exists && set->count == POLICY_COUNT_MAX)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "policy limit reached");
    if (policy_set_same(set, &d))
        return OK;
    policy_set_put(set, &d);
    ctx->map->policies_generation++;
    ctx->change->changed = true;
    return OK;
}

static int op_policy_delete(struct apply_ctx *ctx)
{
    struct bytes vhost = read_name(&ctx->reader, "vhost");
    struct bytes name = read_name(&ctx->reader, "name");
    if (ctx->reader.bad_key)
        return malformed(ctx);
    int rc;
    if (need_vhost(ctx, vhost, &rc) == NULL)
        return rc;
    if (!policy_set_delete(&ctx->map->policies, vhost, name))
        return refuse(ctx, REPLY_NOT_FOUND, false, "no policy '%.*s' in vhost '%.*s'",
                      NAME_ARG(name), NAME_ARG(vhost));
    ctx->map->policies_generation++;
    ctx->change->policies_deleted_count = 1;
    ctx->change->changed = true;
    return OK;
}

/* ---- limits --------------------------------------------------------------- */

/* limit.put / limit.delete: see map_cmd_limit. */
static int op_limit(struct apply_ctx *ctx, bool put)
{
    struct cmd_reader *r = &ctx->reader;
    struct bytes scope_text = read_name(r, "scope");
    struct bytes name = read_name(r, "name");
    struct bytes kind_text = read_name(r, "kind");
    int64_t value = -1;
    struct field_value v;
    if (put && read_value(r, "value", &v, false) &&
        (!field_value_as_int(&v, &value) || value > LIMIT_VALUE_MAX ||
         value < -LIMIT_VALUE_MAX))
        reader_fail(r, "value");
    enum limit_scope scope = LIMIT_SCOPE_VHOST;
    if (bytes_equal_cstr(scope_text, "user"))
        scope = LIMIT_SCOPE_USER;
    else if (!bytes_equal_cstr(scope_text, "vhost"))
        reader_fail(r, "scope");
    int kind = limit_kind_parse(scope, kind_text);
    if (kind < 0)
        reader_fail(r, "kind");
    if (r->bad_key)
        return malformed(ctx);
    int rc = OK;
    if (scope == LIMIT_SCOPE_VHOST && need_vhost(ctx, name, &rc) == NULL)
        return rc;
    if (scope == LIMIT_SCOPE_USER && cluster_map_user(ctx->map, name) == NULL)
        return refuse(ctx, REPLY_NOT_FOUND, false, "no user '%.*s'", NAME_ARG(name));
    struct limit_set *set = &ctx->map->limits;
    const struct limit *old = limit_set_find(set, scope, name, kind);
    if (!put) {
        ctx->change->changed = limit_set_delete(set, scope, name, kind);
        return OK;
    }
    if (old != NULL && ctx->restoring)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "limit twice");
    if (old == NULL && set->count == LIMIT_COUNT_MAX)
        return refuse(ctx, REPLY_PRECONDITION_FAILED, false, "too many limits");
    if (old != NULL && old->value == value)
        return OK;
    limit_set_put(set, scope, name, kind, value);
    ctx->change->changed = true;
    return OK;
}

/* ---- cluster-wide settings ------------------------------------------------ */

/* cluster.rebalance {mode}: "auto", "off", "once", or "done" (the leader's
 * end of a "once"). */
static int op_cluster_rebalance(struct apply_ctx *ctx)
{
    struct bytes name = read_name(&ctx->reader, "mode");
    enum map_rebalance mode = ctx->map->rebalance;
    if (bytes_equal_cstr(name, "done")) {
        if (mode == MAP_REBALANCE_ONCE)
            mode = MAP_REBALANCE_OFF;
    } else if (!rebalance_parse(name, &mode)) {
        reader_fail(&ctx->reader, "mode");
    }
    if (ctx->reader.bad_key)
        return malformed(ctx);
    ctx->change->changed = mode != ctx->map->rebalance;
    ctx->map->rebalance = mode;
    return OK;
}

/* ---- dispatch ------------------------------------------------------------- */

static int dispatch(struct apply_ctx *ctx)
{
    switch (ctx->change->op) {
    case MAP_OP_BROKER_JOIN: return op_broker_join(ctx);
    case MAP_OP_BROKER_LEAVE: return op_broker_leave(ctx);
    case MAP_OP_BROKER_STATE: return op_broker_state(ctx);
    case MAP_OP_VHOST_PUT: return op_vhost_put(ctx);
    case MAP_OP_VHOST_DELETE: return op_vhost_delete(ctx);
    case MAP_OP_USER_PUT: return op_user_put(ctx);
    case MAP_OP_USER_DELETE: return op_user_delete(ctx);
    case MAP_OP_EXCHANGE_DECLARE: return op_exchange_declare(ctx);
    case MAP_OP_EXCHANGE_DELETE: return op_exchange_delete(ctx);
    case MAP_OP_EXCHANGE_SET_OWNER: return op_exchange_set_owner(ctx);
    case MAP_OP_BIND: return op_bind(ctx, true);
    case MAP_OP_UNBIND: return op_bind(ctx, false);
    case MAP_OP_QUEUE_DECLARE: return op_queue_declare(ctx);
    case MAP_OP_QUEUE_DELETE: return op_queue_delete(ctx);
    case MAP_OP_QUEUE_SET_OWNER: return op_queue_set_owner(ctx);
    case MAP_OP_QUEUE_SET_BACKUPS: return op_queue_set_backups(ctx);
    case MAP_OP_QUEUE_SET_IN_SYNC: return op_queue_set_in_sync(ctx);
    case MAP_OP_QUEUE_SET_AVAILABLE: return op_queue_set_available(ctx);
    case MAP_OP_SYNC: return OK;
    case MAP_OP_POLICY_PUT: return op_policy_put(ctx);
    case MAP_OP_POLICY_DELETE: return op_policy_delete(ctx);
    case MAP_OP_QUEUE_MOVE: return op_queue_move(ctx);
    case MAP_OP_CLUSTER_REBALANCE: return op_cluster_rebalance(ctx);
    case MAP_OP_BROKER_STORAGE: return op_broker_storage(ctx);
    case MAP_OP_QUEUE_TAKE_OVER: return op_queue_take_over(ctx);
    case MAP_OP_QUEUE_ADOPTED: return op_queue_adopted(ctx);
    case MAP_OP_PERMISSION_PUT: return op_permission_put(ctx);
    case MAP_OP_PERMISSION_DELETE: return op_permission_delete(ctx);
    case MAP_OP_USERS_BOOTSTRAP: return op_users_bootstrap(ctx);
    case MAP_OP_LIMIT_PUT: return op_limit(ctx, true);
    case MAP_OP_LIMIT_DELETE: return op_limit(ctx, false);
    case MAP_OP_NONE:
    case MAP_OP_COUNT: break;
    }
    return malformed(ctx);
}

static enum map_op op_parse(struct table t)
{
    struct field_value v;
    if (!table_get(t, "op", &v) || v.kind != 'S')
        return MAP_OP_NONE;
    for (int op = 1; op < MAP_OP_COUNT; op++) {
        if (bytes_equal_cstr(v.str, op_names[op]))
            return (enum map_op)op;
    }
    return MAP_OP_NONE;
}

int cluster_map_apply(struct cluster_map *map, const uint8_t *cmd, size_t size,
                      struct map_change *change_out)
{
    ASSERT(map != NULL);
    ASSERT(cmd != NULL || size == 0);
    struct map_change scratch;
    struct map_change *c = change_out ? change_out : &scratch;
    memset(c, 0, sizeof(*c));
    c->reply_code = REPLY_SUCCESS;
    map->version++;
    c->version = map->version;
    struct apply_ctx ctx = {.map = map, .change = c};
    if (size > CLUSTER_CMD_SIZE_MAX || table_validate(cmd, (uint32_t)size) != OK)
        return malformed(&ctx);
    ctx.reader.table = (struct table){cmd, (uint32_t)size};
    c->op = op_parse(ctx.reader.table);
    struct field_value v;
    if (table_get(ctx.reader.table, "vhost", &v) && v.kind == 'S')
        c->vhost = v.str;
    if (table_get(ctx.reader.table, "name", &v) && v.kind == 'S')
        c->name = v.str;
    int rc = dispatch(&ctx);
    free_removed_exchanges(map);
    ASSERT(rc == OK || rc == E_MAP_REFUSED || rc == E_SYNTAX);
    ASSERT((rc == OK) == (c->reply_code == REPLY_SUCCESS));
    /* O(n): only while the map is small enough for it to stay cheap. */
    DEBUG_ASSERT(map->queues_count > 256 || cluster_map_verify(map));
    return rc;
}

/* ---- building commands ---------------------------------------------------- */

void map_cmd_free(struct map_cmd *cmd)
{
    free(cmd->bytes);
    cmd->bytes = NULL;
    cmd->size = 0;
}

void map_cmd_list_init(struct map_cmd_list *list)
{
    memset(list, 0, sizeof(*list));
}

void map_cmd_list_free(struct map_cmd_list *list)
{
    for (uint32_t i = 0; i < list->count; i++)
        map_cmd_free(&list->items[i]);
    free(list->items);
    map_cmd_list_init(list);
}

void map_cmd_list_push(struct map_cmd_list *list, struct map_cmd *cmd)
{
    ASSERT(cmd->bytes != NULL);
    if (list->count == list->cap) {
        list->cap = list->cap ? list->cap * 2 : 16;
        list->items = realloc(list->items, (size_t)list->cap * sizeof(list->items[0]));
        ASSERT(list->items != NULL);
    }
    list->items[list->count++] = *cmd;
    cmd->bytes = NULL;
    cmd->size = 0;
}

typedef void encode_fn(struct table_writer *w, const void *arg);

/* Encodes into a growing heap buffer until it fits. */
static int build(struct map_cmd *out, encode_fn *encode, const void *arg)
{
    out->bytes = NULL;
    out->size = 0;
    for (size_t cap = 256; cap <= CLUSTER_CMD_SIZE_MAX; cap *= 2) {
        uint8_t *buf = malloc(cap);
        ASSERT(buf != NULL);
        struct table_writer w;
        table_writer_init(&w, buf, cap);
        encode(&w, arg);
        if (!w.overflow) {
            out->bytes = buf;
            out->size = w.len;
            DEBUG_ASSERT(table_validate(buf, (uint32_t)w.len) == OK);
            return OK;
        }
        free(buf);
    }
    return E_LIMIT;
}

static void put_op(struct table_writer *w, enum map_op op)
{
    table_put_longstr(w, "op", bytes_of_cstr(op_names[op]));
}

static void put_ids(struct table_writer *w, const char *key, const uint32_t *ids, uint8_t n)
{
    size_t mark = table_put_array_begin(w, key);
    for (uint8_t i = 0; i < n; i++)
        table_array_put_int(w, ids[i]);
    table_put_array_end(w, mark);
}

static void put_table(struct table_writer *w, const char *key, struct table t)
{
    struct field_value v = {.kind = 'F'};
    v.table = t;
    table_put_field(w, bytes_of_cstr(key), &v);
}

static void put_str_list(struct table_writer *w, const char *key, const struct bytes *s,
                         uint32_t n)
{
    size_t mark = table_put_array_begin(w, key);
    for (uint32_t i = 0; i < n; i++)
        table_array_put_longstr(w, s[i]);
    table_put_array_end(w, mark);
}

/* Generic small commands: an op plus up to a few named values. */
struct simple_cmd {
    enum map_op op;
    struct bytes vhost, name;
    uint64_t epoch; /* 0: not written */
    uint32_t id;    /* "id" for broker.*, 0: not written */
    const char *int_key; /* an extra integer */
    uint64_t int_value;
    const char *int2_key; /* and another */
    uint64_t int2_value;
    const char *str_key; /* an extra string */
    struct bytes str_value;
    const char *bool_key; /* an extra bool */
    bool bool_value;
    const char *ids_key; /* an extra id array */
    const uint32_t *ids;
    uint8_t ids_count;
};

static void encode_simple(struct table_writer *w, const void *arg)
{
    const struct simple_cmd *s = arg;
    put_op(w, s->op);
    if (s->id)
        table_put_int(w, "id", s->id);
    if (s->vhost.ptr)
        table_put_longstr(w, "vhost", s->vhost);
    if (s->name.ptr)
        table_put_longstr(w, "name", s->name);
    if (s->epoch)
        table_put_int(w, "epoch", (int64_t)s->epoch);
    if (s->int_key)
        table_put_int(w, s->int_key, (int64_t)s->int_value);
    if (s->int2_key)
        table_put_int(w, s->int2_key, (int64_t)s->int2_value);
    if (s->str_key)
        table_put_longstr(w, s->str_key, s->str_value);
    if (s->bool_key)
        table_put_bool(w, s->bool_key, s->bool_value);
    if (s->ids_key)
        put_ids(w, s->ids_key, s->ids, s->ids_count);
}

struct join_args {
    uint32_t id;
    struct bytes name, amqp_address, cluster_address;
    bool voter;
    const struct map_broker *broker; /* snapshot: also the state */
};

static void encode_join(struct table_writer *w, const void *arg)
{
    const struct join_args *a = arg;
    if (a->broker == NULL)
        put_op(w, MAP_OP_BROKER_JOIN);
    table_put_int(w, "id", a->id);
    table_put_longstr(w, "name", a->name);
    table_put_longstr(w, "amqp_address", a->amqp_address);
    table_put_longstr(w, "cluster_address", a->cluster_address);
    table_put_bool(w, "voter", a->voter);
    if (a->broker)
        table_put_longstr(w, "state", bytes_of_cstr(broker_state_name(a->broker->state)));
    if (a->broker && a->broker->storage_id.len > 0)
        table_put_longstr(w, "storage", a->broker->storage_id);
}

int map_cmd_broker_join(struct map_cmd *out, uint32_t id, struct bytes name,
                        struct bytes amqp_address, struct bytes cluster_address, bool voter)
{
    ASSERT(id != BROKER_ID_NONE);
    struct join_args a = {id, name, amqp_address, cluster_address, voter, NULL};
    return build(out, encode_join, &a);
}

int map_cmd_broker_leave(struct map_cmd *out, uint32_t id)
{
    ASSERT(id != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_BROKER_LEAVE, .id = id};
    return build(out, encode_simple, &s);
}

int map_cmd_broker_state(struct map_cmd *out, uint32_t id, enum broker_state state)
{
    ASSERT(id != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_BROKER_STATE, .id = id, .str_key = "state",
                           .str_value = bytes_of_cstr(broker_state_name(state))};
    return build(out, encode_simple, &s);
}

int map_cmd_broker_storage(struct map_cmd *out, uint32_t id, struct bytes storage_id)
{
    ASSERT(storage_id.len <= MAP_STORAGE_ID_SIZE_MAX);
    struct simple_cmd s = {.op = MAP_OP_BROKER_STORAGE, .id = id, .str_key = "storage",
                           .str_value = storage_id};
    return build(out, encode_simple, &s);
}

int map_cmd_sync(struct map_cmd *out)
{
    struct simple_cmd s = {.op = MAP_OP_SYNC};
    return build(out, encode_simple, &s);
}

int map_cmd_vhost_put(struct map_cmd *out, struct bytes name)
{
    struct simple_cmd s = {.op = MAP_OP_VHOST_PUT, .name = name};
    return build(out, encode_simple, &s);
}

int map_cmd_vhost_delete(struct map_cmd *out, struct bytes name)
{
    struct simple_cmd s = {.op = MAP_OP_VHOST_DELETE, .name = name};
    return build(out, encode_simple, &s);
}

struct user_args {
    bool with_op;
    struct bytes name, hash;
    const struct bytes *vhosts, *tags;
    uint32_t vhosts_count, tags_count;
    bool has_vhosts;             /* writes "vhosts" (user.set does not) */
    const struct map_user *user; /* a snapshot's or bootstrap's: its permissions too */
};

static void encode_user_extras(struct table_writer *w, const struct map_user *u)
{
    if (u->vhosts_count > 0) {
        size_t a = table_put_array_begin(w, "permissions");
        for (uint32_t i = 0; i < u->vhosts_count; i++) {
            size_t t = table_array_put_table_begin(w);
            table_put_longstr(w, "vhost", u->vhosts[i]);
            for (int k = 0; k < 3; k++)
                table_put_longstr(w, permission_keys[k], u->permissions[3 * i + (uint32_t)k]);
            table_put_table_end(w, t);
        }
        table_put_array_end(w, a);
    }
    if (u->loopback)
        table_put_bool(w, "loopback", true);
    if (u->any_vhost)
        table_put_bool(w, "any_vhost", true);
}

static void encode_user(struct table_writer *w, const void *arg)
{
    const struct user_args *a = arg;
    if (a->with_op)
        put_op(w, MAP_OP_USER_PUT);
    table_put_longstr(w, "name", a->name);
    table_put_longstr(w, "password_hash", a->hash);
    if (a->has_vhosts)
        put_str_list(w, "vhosts", a->vhosts, a->vhosts_count);
    put_str_list(w, "tags", a->tags, a->tags_count);
    if (a->user != NULL)
        encode_user_extras(w, a->user);
}

/* One map user as a snapshot (or a bootstrap) writes it. */
static void encode_map_user(struct table_writer *w, const struct map_user *u)
{
    struct user_args ua = {false, u->name, u->password_hash, u->vhosts, u->tags,
                           u->vhosts_count, u->tags_count, true, u};
    size_t t = table_array_put_table_begin(w);
    encode_user(w, &ua);
    table_put_table_end(w, t);
}

int map_cmd_user_put(struct map_cmd *out, struct bytes name, struct bytes password_hash,
                     const struct bytes *vhosts, uint32_t vhosts_count,
                     const struct bytes *tags, uint32_t tags_count)
{
    struct user_args a = {true, name, password_hash, vhosts, tags, vhosts_count, tags_count,
                          true, NULL};
    return build(out, encode_user, &a);
}

int map_cmd_user_set(struct map_cmd *out, struct bytes name, struct bytes password_hash,
                     const struct bytes *tags, uint32_t tags_count)
{
    struct user_args a = {true, name, password_hash, NULL, tags, 0, tags_count, false, NULL};
    return build(out, encode_user, &a);
}

int map_cmd_user_delete(struct map_cmd *out, struct bytes name)
{
    struct simple_cmd s = {.op = MAP_OP_USER_DELETE, .name = name};
    return build(out, encode_simple, &s);
}

struct permission_args {
    bool put;
    struct bytes user, vhost;
    const struct bytes *regexes;
};

static void encode_permission(struct table_writer *w, const void *arg)
{
    const struct permission_args *a = arg;
    put_op(w, a->put ? MAP_OP_PERMISSION_PUT : MAP_OP_PERMISSION_DELETE);
    table_put_longstr(w, "user", a->user);
    table_put_longstr(w, "vhost", a->vhost);
    for (int k = 0; a->put && k < 3; k++)
        table_put_longstr(w, permission_keys[k], a->regexes[k]);
}

int map_cmd_permission_put(struct map_cmd *out, struct bytes user, struct bytes vhost,
                           const struct bytes regexes[3])
{
    struct permission_args a = {true, user, vhost, regexes};
    return build(out, encode_permission, &a);
}

int map_cmd_permission_delete(struct map_cmd *out, struct bytes user, struct bytes vhost)
{
    struct permission_args a = {false, user, vhost, NULL};
    return build(out, encode_permission, &a);
}

struct bootstrap_args {
    const struct map_user *const *users;
    uint32_t count;
};

static void encode_bootstrap(struct table_writer *w, const void *arg)
{
    const struct bootstrap_args *a = arg;
    put_op(w, MAP_OP_USERS_BOOTSTRAP);
    size_t mark = table_put_array_begin(w, "users");
    for (uint32_t i = 0; i < a->count; i++)
        encode_map_user(w, a->users[i]);
    table_put_array_end(w, mark);
}

int map_cmd_users_bootstrap(struct map_cmd *out, const struct map_user *const *users,
                            uint32_t count)
{
    struct bootstrap_args a = {users, count};
    return build(out, encode_bootstrap, &a);
}

struct exchange_args {
    bool with_op;
    const struct map_exchange_decl *decl;
};

static void encode_exchange(struct table_writer *w, const void *arg)
{
    const struct exchange_args *a = arg;
    const struct map_exchange_decl *d = a->decl;
    if (a->with_op)
        put_op(w, MAP_OP_EXCHANGE_DECLARE);
    table_put_longstr(w, "vhost", d->vhost);
    table_put_longstr(w, "name", d->name);
    table_put_longstr(w, "type", d->type);
    table_put_bool(w, "durable", d->durable);
    table_put_bool(w, "auto_delete", d->auto_delete);
    table_put_bool(w, "internal", d->internal);
    put_table(w, "arguments", d->arguments);
    table_put_int(w, "owner", d->owner_id);
}

int map_cmd_exchange_declare(struct map_cmd *out, const struct map_exchange_decl *decl)
{
    struct exchange_args a = {true, decl};
    return build(out, encode_exchange, &a);
}

int map_cmd_exchange_delete(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            bool if_unused)
{
    struct simple_cmd s = {.op = MAP_OP_EXCHANGE_DELETE, .vhost = vhost, .name = name,
                           .bool_key = "if_unused", .bool_value = if_unused};
    return build(out, encode_simple, &s);
}

int map_cmd_exchange_set_owner(struct map_cmd *out, struct bytes vhost, struct bytes name,
                               uint32_t owner_id)
{
    struct simple_cmd s = {.op = MAP_OP_EXCHANGE_SET_OWNER, .vhost = vhost, .name = name,
                           .int_key = "owner", .int_value = owner_id};
    return build(out, encode_simple, &s);
}

struct binding_args {
    enum map_op op; /* MAP_OP_NONE: snapshot */
    const struct map_binding_decl *decl;
};

static void encode_binding(struct table_writer *w, const void *arg)
{
    const struct binding_args *a = arg;
    const struct map_binding_decl *d = a->decl;
    if (a->op != MAP_OP_NONE)
        put_op(w, a->op);
    table_put_longstr(w, "vhost", d->vhost);
    table_put_longstr(w, "source", d->source);
    table_put_longstr(w, "destination_kind",
                      bytes_of_cstr(d->destination_kind == MAP_DESTINATION_QUEUE ? "queue"
                                                                                 : "exchange"));
    table_put_longstr(w, "destination", d->destination);
    table_put_longstr(w, "routing_key", d->routing_key);
    put_table(w, "arguments", d->arguments);
}

int map_cmd_bind(struct map_cmd *out, const struct map_binding_decl *decl)
{
    struct binding_args a = {MAP_OP_BIND, decl};
    return build(out, encode_binding, &a);
}

int map_cmd_unbind(struct map_cmd *out, const struct map_binding_decl *decl)
{
    struct binding_args a = {MAP_OP_UNBIND, decl};
    return build(out, encode_binding, &a);
}

struct queue_args_enc {
    const struct map_queue_decl *decl;
    uint32_t origin_id;             /* command only */
    const struct map_queue *queue;  /* snapshot only */
};

static void encode_queue(struct table_writer *w, const void *arg)
{
    const struct queue_args_enc *a = arg;
    const struct map_queue_decl *d = a->decl;
    if (a->queue == NULL)
        put_op(w, MAP_OP_QUEUE_DECLARE);
    table_put_longstr(w, "vhost", d->vhost);
    table_put_longstr(w, "name", d->name);
    table_put_bool(w, "durable", d->durable);
    table_put_bool(w, "exclusive", d->exclusive);
    table_put_bool(w, "auto_delete", d->auto_delete);
    put_table(w, "arguments", d->arguments);
    if (d->exclusive) {
        table_put_int(w, "connection", (int64_t)d->exclusive_connection_id);
        table_put_int(w, "owner", d->exclusive_owner_id);
    }
    table_put_int(w, "primary", d->primary_id);
    put_ids(w, "backups", d->backup_ids, d->backups_count);
    table_put_int(w, "replication_factor", d->replication_factor);
    if (a->queue == NULL) {
        table_put_int(w, "origin", a->origin_id);
        if (d->replaces_epoch != 0)
            table_put_int(w, "replaces", (int64_t)d->replaces_epoch);
        return;
    }
    const struct map_queue *q = a->queue;
    uint32_t in_sync[CLUSTER_BACKUPS_MAX];
    uint8_t n = 0;
    for (uint8_t i = 0; i < q->backups_count; i++) {
        if (q->in_sync_mask & (1u << i))
            in_sync[n++] = q->backup_ids[i];
    }
    put_ids(w, "in_sync", in_sync, n);
    table_put_int(w, "epoch", (int64_t)q->epoch);
    table_put_int(w, "since", (int64_t)q->owned_since);
    table_put_bool(w, "available", q->available);
    if (q->move_to != BROKER_ID_NONE)
        table_put_int(w, "move_to", q->move_to);
    if (q->move_from != BROKER_ID_NONE)
        table_put_int(w, "move_from", q->move_from);
    if (q->taken_from != BROKER_ID_NONE)
        table_put_int(w, "taken_from", q->taken_from);
    if (q->taken_from_before != BROKER_ID_NONE)
        table_put_int(w, "taken_from_before", q->taken_from_before);
    if (q->adopted)
        table_put_bool(w, "adopted", true);
}

int map_cmd_queue_declare(struct map_cmd *out, const struct map_queue_decl *decl,
                          uint32_t origin_id)
{
    ASSERT(decl->backups_count <= CLUSTER_BACKUPS_MAX);
    ASSERT(origin_id != BROKER_ID_NONE);
    struct queue_args_enc a = {decl, origin_id, NULL};
    return build(out, encode_queue, &a);
}

int map_cmd_queue_delete(struct map_cmd *out, struct bytes vhost, struct bytes name,
                         uint64_t expected_epoch)
{
    struct simple_cmd s = {.op = MAP_OP_QUEUE_DELETE, .vhost = vhost, .name = name,
                           .epoch = expected_epoch};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_set_owner(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            uint64_t expected_epoch, uint32_t primary_id)
{
    ASSERT(expected_epoch != 0);
    ASSERT(primary_id != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_SET_OWNER, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .int_key = "primary",
                           .int_value = primary_id};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_hand_over(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            uint64_t expected_epoch, uint32_t primary_id)
{
    ASSERT(expected_epoch != 0);
    ASSERT(primary_id != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_SET_OWNER, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .int_key = "primary",
                           .int_value = primary_id, .bool_key = "planned", .bool_value = true};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_move(struct map_cmd *out, struct bytes vhost, struct bytes name,
                       uint64_t expected_epoch, uint32_t to)
{
    ASSERT(expected_epoch != 0);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_MOVE, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .int_key = "to", .int_value = to};
    return build(out, encode_simple, &s);
}

int map_cmd_rebalance(struct map_cmd *out, enum map_rebalance mode)
{
    ASSERT(mode != MAP_REBALANCE_UNSET);
    struct simple_cmd s = {.op = MAP_OP_CLUSTER_REBALANCE, .str_key = "mode",
                           .str_value = bytes_of_cstr(map_rebalance_name(mode))};
    return build(out, encode_simple, &s);
}

int map_cmd_rebalance_done(struct map_cmd *out)
{
    struct simple_cmd s = {.op = MAP_OP_CLUSTER_REBALANCE, .str_key = "mode",
                           .str_value = BYTES_LIT("done")};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_move_backup(struct map_cmd *out, struct bytes vhost, struct bytes name,
                              uint64_t expected_epoch, uint32_t from, uint32_t to)
{
    ASSERT(expected_epoch != 0);
    ASSERT(from != BROKER_ID_NONE && to != BROKER_ID_NONE && from != to);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_MOVE, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .int_key = "to", .int_value = to,
                           .int2_key = "from", .int2_value = from};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_set_backups(struct map_cmd *out, struct bytes vhost, struct bytes name,
                              uint64_t expected_epoch, const uint32_t *backup_ids,
                              uint8_t backups_count)
{
    ASSERT(expected_epoch != 0);
    ASSERT(backups_count <= CLUSTER_BACKUPS_MAX);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_SET_BACKUPS, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .ids_key = "backups", .ids = backup_ids,
                           .ids_count = backups_count};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_set_in_sync(struct map_cmd *out, struct bytes vhost, struct bytes name,
                              uint64_t expected_epoch, const uint32_t *in_sync_ids,
                              uint8_t in_sync_count)
{
    ASSERT(expected_epoch != 0);
    ASSERT(in_sync_count <= CLUSTER_BACKUPS_MAX);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_SET_IN_SYNC, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .ids_key = "in_sync", .ids = in_sync_ids,
                           .ids_count = in_sync_count};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_set_factor(struct map_cmd *out, struct bytes vhost, struct bytes name,
                             uint64_t expected_epoch, uint8_t replication_factor,
                             const uint32_t *backup_ids, uint8_t backups_count)
{
    ASSERT(expected_epoch != 0);
    ASSERT(replication_factor >= 1 && replication_factor <= CLUSTER_BACKUPS_MAX + 1);
    ASSERT(backups_count < replication_factor);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_SET_BACKUPS, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .int_key = "replication_factor",
                           .int_value = replication_factor, .ids_key = "backups",
                           .ids = backup_ids, .ids_count = backups_count};
    return build(out, encode_simple, &s);
}

struct policy_args {
    bool with_op;
    const struct policy_decl *decl;
};

static void encode_policy(struct table_writer *w, const void *arg)
{
    const struct policy_args *a = arg;
    if (a->with_op)
        put_op(w, MAP_OP_POLICY_PUT);
    table_put_longstr(w, "vhost", a->decl->vhost);
    table_put_longstr(w, "name", a->decl->name);
    table_put_longstr(w, "pattern", a->decl->pattern);
    table_put_int(w, "priority", a->decl->priority);
    table_put_int(w, "backups", a->decl->backups);
}

int map_cmd_policy_put(struct map_cmd *out, const struct policy_decl *decl)
{
    struct policy_args a = {true, decl};
    return build(out, encode_policy, &a);
}

int map_cmd_policy_delete(struct map_cmd *out, struct bytes vhost, struct bytes name)
{
    struct simple_cmd s = {.op = MAP_OP_POLICY_DELETE, .vhost = vhost, .name = name};
    return build(out, encode_simple, &s);
}

struct limit_args {
    enum map_op op; /* MAP_OP_NONE in a snapshot */
    enum limit_scope scope;
    struct bytes name;
    enum limit_kind kind;
    int64_t value;
};

static void encode_limit(struct table_writer *w, const void *arg)
{
    const struct limit_args *a = arg;
    if (a->op != MAP_OP_NONE)
        put_op(w, a->op);
    table_put_longstr(w, "scope", bytes_of_cstr(limit_scope_name(a->scope)));
    table_put_longstr(w, "name", a->name);
    table_put_longstr(w, "kind", bytes_of_cstr(limit_kind_name(a->kind)));
    if (a->op != MAP_OP_LIMIT_DELETE)
        table_put_int(w, "value", a->value);
}

int map_cmd_limit(struct map_cmd *out, bool put, enum limit_scope scope, struct bytes name,
                  enum limit_kind kind, int64_t value)
{
    ASSERT(limit_kind_valid(scope, kind));
    struct limit_args a = {put ? MAP_OP_LIMIT_PUT : MAP_OP_LIMIT_DELETE, scope, name, kind,
                           value};
    return build(out, encode_limit, &a);
}

int map_cmd_queue_set_available(struct map_cmd *out, struct bytes vhost, struct bytes name,
                                uint64_t expected_epoch, bool available)
{
    ASSERT(expected_epoch != 0);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_SET_AVAILABLE, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .bool_key = "available",
                           .bool_value = available};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_take_over(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            uint64_t expected_epoch, uint32_t primary_id, uint32_t from)
{
    ASSERT(expected_epoch != 0);
    ASSERT(primary_id != BROKER_ID_NONE && from != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_TAKE_OVER, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .int_key = "primary",
                           .int_value = primary_id, .int2_key = "from", .int2_value = from};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_adopted(struct map_cmd *out, struct bytes vhost, struct bytes name,
                          uint32_t primary_id)
{
    ASSERT(primary_id != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_ADOPTED, .vhost = vhost, .name = name,
                           .int_key = "primary", .int_value = primary_id};
    return build(out, encode_simple, &s);
}

/* ---- snapshots ------------------------------------------------------------ */

/*
 * A snapshot is one table: {format, version, brokers_version, [rebalance,] brokers: [..],
 * vhosts: [..], users: [..], policies: [..], exchanges: [..], queues: [..],
 * bindings: [..]}. Format 1 (before policies) has no "policies" and still
 * loads, as a map without policies.
 * Each element is the table its creating command would carry (without
 * "op"), plus the state commands changed since: a broker's "state", a
 * queue's "epoch", "available" and "in_sync". Arrays keep the map's order,
 * so reading a snapshot rebuilds the same arrays and writing it again gives
 * the same bytes.
 */
#define SNAPSHOT_FORMAT 2
#define SNAPSHOT_FORMAT_NO_POLICIES 1

static void encode_snapshot_policies(struct table_writer *w, const struct cluster_map *map)
{
    size_t a = table_put_array_begin(w, "policies");
    for (uint32_t i = 0; i < map->policies.count; i++) {
        const struct policy *p = map->policies.items[i];
        struct policy_decl d = {p->vhost, p->name, p->pattern, p->priority, p->backups};
        struct policy_args pa = {false, &d};
        size_t t = table_array_put_table_begin(w);
        encode_policy(w, &pa);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, a);
}

static void encode_snapshot_limits(struct table_writer *w, const struct cluster_map *map)
{
    if (map->limits.count == 0)
        return; /* (a snapshot reads as before limits) */
    size_t a = table_put_array_begin(w, "limits");
    for (uint32_t i = 0; i < map->limits.count; i++) {
        const struct limit *l = &map->limits.items[i];
        struct limit_args la = {MAP_OP_NONE, l->scope, l->name, l->kind, l->value};
        size_t t = table_array_put_table_begin(w);
        encode_limit(w, &la);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, a);
}

static void encode_snapshot_objects(struct table_writer *w, const struct cluster_map *map)
{
    size_t a = table_put_array_begin(w, "brokers");
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        struct join_args j = {b->id, b->name, b->amqp_address, b->cluster_address, b->voter, b};
        size_t t = table_array_put_table_begin(w);
        encode_join(w, &j);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, a);
    a = table_put_array_begin(w, "vhosts");
    for (uint32_t i = 0; i < map->vhosts_count; i++)
        table_array_put_longstr(w, map->vhosts[i]->name);
    table_put_array_end(w, a);
    a = table_put_array_begin(w, "users");
    for (uint32_t i = 0; i < map->users_count; i++)
        encode_map_user(w, map->users[i]);
    table_put_array_end(w, a);
}

static void encode_snapshot_exchanges(struct table_writer *w, const struct cluster_map *map)
{
    size_t a = table_put_array_begin(w, "exchanges");
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        if (x->owner_id == BROKER_ID_NONE)
            continue; /* predeclared: its vhost makes it again */
        struct map_exchange_decl d = {x->vhost->name, x->name,        x->type,
                                      x->durable,     x->auto_delete, x->internal,
                                      {x->arguments.ptr, x->arguments.len}, x->owner_id};
        struct exchange_args ea = {false, &d};
        size_t t = table_array_put_table_begin(w);
        encode_exchange(w, &ea);
        table_put_int(w, "since", (int64_t)x->owned_since);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, a);
}

static void encode_snapshot_queues(struct table_writer *w, const struct cluster_map *map)
{
    size_t a = table_put_array_begin(w, "queues");
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        struct map_queue_decl d = {
            .vhost = q->vhost->name, .name = q->name, .durable = q->durable,
            .exclusive = q->exclusive, .auto_delete = q->auto_delete,
            .arguments = {q->arguments.ptr, q->arguments.len},
            .exclusive_connection_id = q->exclusive_connection_id,
            .exclusive_owner_id = q->exclusive_owner_id,
            .primary_id = q->primary_id, .backups_count = q->backups_count,
            .replication_factor = q->replication_factor};
        memcpy(d.backup_ids, q->backup_ids, sizeof(d.backup_ids));
        struct queue_args_enc qa = {&d, 0, q};
        size_t t = table_array_put_table_begin(w);
        encode_queue(w, &qa);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, a);
    a = table_put_array_begin(w, "bindings");
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        list_for_each(node, &x->bindings_out) {
            const struct map_binding *b = CONTAINER_OF(node, struct map_binding, source_node);
            struct map_binding_decl d = {x->vhost->name,   x->name,        b->destination_kind,
                                         b->destination,   b->routing_key,
                                         {b->arguments.ptr, b->arguments.len}};
            struct binding_args ba = {MAP_OP_NONE, &d};
            size_t t = table_array_put_table_begin(w);
            encode_binding(w, &ba);
            table_put_table_end(w, t);
        }
    }
    table_put_array_end(w, a);
}

int cluster_map_snapshot_write(const struct cluster_map *map, uint8_t *buf, size_t cap,
                               size_t *size_out)
{
    ASSERT(map != NULL);
    ASSERT(size_out != NULL);
    struct table_writer w;
    table_writer_init(&w, buf, cap);
    table_put_int(&w, "format", SNAPSHOT_FORMAT);
    table_put_int(&w, "version", (int64_t)map->version);
    table_put_int(&w, "brokers_version", (int64_t)map->brokers_version);
    if (map->rebalance != MAP_REBALANCE_UNSET)
        table_put_longstr(&w, "rebalance", bytes_of_cstr(map_rebalance_name(map->rebalance)));
    if (map->users_defined)
        table_put_bool(&w, "users_defined", true);
    encode_snapshot_objects(&w, map);
    encode_snapshot_policies(&w, map);
    encode_snapshot_limits(&w, map);
    encode_snapshot_exchanges(&w, map);
    encode_snapshot_queues(&w, map);
    *size_out = w.overflow ? 0 : w.len;
    return w.overflow ? E_NOMEM : OK;
}

int cluster_map_snapshot_alloc(const struct cluster_map *map, uint8_t **buf_out,
                               size_t *size_out)
{
    /* Start from a generous estimate so that one pass usually fits. */
    size_t cap = 4096 + (size_t)map->queues_count * 256 + (size_t)map->exchanges_count * 256 +
                 (size_t)map->bindings_count * 160 + (size_t)map->users_count * 256 +
                 (size_t)map->policies.count * 640;
    for (;;) {
        uint8_t *buf = malloc(cap);
        ASSERT(buf != NULL);
        int rc = cluster_map_snapshot_write(map, buf, cap, size_out);
        if (rc == OK) {
            *buf_out = buf;
            return OK;
        }
        free(buf);
        ASSERT(cap < SIZE_MAX / 2);
        cap *= 2;
    }
}

/* Applies each table of a snapshot array with one op, in restoring mode. */
static int restore_array(struct cluster_map *map, struct table top, const char *key,
                         enum map_op op)
{
    struct field_value v;
    if (!table_get(top, key, &v) || v.kind != 'A')
        return E_SYNTAX;
    struct array_iter it;
    array_iter_init(&it, v.array);
    struct field_value e;
    while (array_iter_next(&it, &e)) {
        struct map_change change;
        memset(&change, 0, sizeof(change));
        change.op = op;
        change.reply_code = REPLY_SUCCESS;
        struct apply_ctx ctx = {.map = map, .change = &change, .restoring = true};
        uint8_t buf[CLUSTER_NAME_SIZE_MAX + 16];
        if (op == MAP_OP_VHOST_PUT) {
            /* vhosts are bare names: wrap the name as the command would. */
            if (e.kind != 'S' || e.str.len == 0 || e.str.len > CLUSTER_NAME_SIZE_MAX)
                return E_SYNTAX;
            struct table_writer w;
            table_writer_init(&w, buf, sizeof(buf));
            table_put_longstr(&w, "name", e.str);
            ctx.reader.table = table_writer_table(&w);
        } else {
            if (e.kind != 'F')
                return E_SYNTAX;
            ctx.reader.table = e.table;
        }
        if (dispatch(&ctx) != OK) {
            LOG_ERROR("cluster map: a snapshot's %s does not apply: %s", key, change.reply_text);
            return E_SYNTAX;
        }
    }
    return OK;
}

int cluster_map_snapshot_read(struct cluster_map *map, const uint8_t *buf, size_t size)
{
    ASSERT(map != NULL);
    ASSERT(buf != NULL || size == 0);
    if (size > UINT32_MAX || table_validate(buf, (uint32_t)size) != OK)
        return E_SYNTAX;
    struct table top = {buf, (uint32_t)size};
    struct cmd_reader r = {top, NULL};
    uint64_t format = read_uint(&r, "format", INT64_MAX, false, 0);
    uint64_t version = read_uint(&r, "version", INT64_MAX, false, 0);
    uint64_t brokers_version = read_uint(&r, "brokers_version", INT64_MAX, false, 0);
    enum map_rebalance rebalance = MAP_REBALANCE_UNSET;
    struct field_value rv;
    if (table_get(top, "rebalance", &rv) &&
        (rv.kind != 'S' || !rebalance_parse(rv.str, &rebalance)))
        return E_SYNTAX;
    if (r.bad_key || (format != SNAPSHOT_FORMAT && format != SNAPSHOT_FORMAT_NO_POLICIES))
        return E_SYNTAX;
    struct cluster_map fresh;
    cluster_map_init(&fresh);
    static const struct {
        const char *key;
        enum map_op op;
    } parts[] = {
        {"brokers", MAP_OP_BROKER_JOIN},        {"vhosts", MAP_OP_VHOST_PUT},
        {"users", MAP_OP_USER_PUT},             {"policies", MAP_OP_POLICY_PUT},
        {"exchanges", MAP_OP_EXCHANGE_DECLARE}, {"queues", MAP_OP_QUEUE_DECLARE},
        {"bindings", MAP_OP_BIND},
    };
    for (size_t i = 0; i < ARRAY_SIZE(parts); i++) {
        if (parts[i].op == MAP_OP_POLICY_PUT && format == SNAPSHOT_FORMAT_NO_POLICIES)
            continue;
        if (restore_array(&fresh, top, parts[i].key, parts[i].op) != OK) {
            cluster_map_free(&fresh);
            return E_SYNTAX;
        }
    }
    /* Optional: a snapshot from before limits has none. */
    struct field_value lv;
    if (table_get(top, "limits", &lv) &&
        restore_array(&fresh, top, "limits", MAP_OP_LIMIT_PUT) != OK) {
        cluster_map_free(&fresh);
        return E_SYNTAX;
    }
    fresh.version = version;
    fresh.brokers_version = brokers_version;
    fresh.rebalance = rebalance;
    /* Restoring its users set it; a map whose users were all deleted says so. */
    fresh.users_defined = fresh.users_count > 0 || read_bool(&r, "users_defined", true);
    /* The policies may differ from what the controller last applied. */
    fresh.policies_generation = map->policies_generation + 1;
    ASSERT(cluster_map_verify(&fresh));
    cluster_map_free(map);
    *map = fresh;
    return OK;
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
    if (q->move_to != BROKER_ID_NONE && backup_slot(q, q->move_to) < 0)
        return false;
    if (q->move_from != BROKER_ID_NONE &&
        (q->move_to == BROKER_ID_NONE || backup_slot(q, q->move_from) < 0))
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
        if (q->backup_ids[k] == q->primary_id || backup_slot(q, q->backup_ids[k]) != k)
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
