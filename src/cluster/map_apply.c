/*
 * map_apply.c: the cluster map's command interpreter (cluster_map_apply):
 * the names of ops, states and modes, typed reads of a command's fields,
 * refusals, the dispatch, and the ops on brokers, vhosts, users and their
 * permissions, policies, limits and the cluster-wide settings. The ops on
 * exchanges, bindings and queues are map_apply_queues.c's.
 *
 * Applies commands in two phases: read and check everything, then mutate,
 * so a refusal (or a malformed command) leaves the map untouched. Snapshot
 * restore (map_snapshot.c) reuses the same per-op handlers in "restoring"
 * mode, so a snapshot is checked exactly as strictly as the commands that
 * built it.
 *
 * Must never do I/O, read a clock, draw random numbers, or let the order of
 * a hash-table walk decide anything (see map.h).
 */
#include "cluster/map.h"
#include "cluster/map_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/auth.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"

/* ---- names ---------------------------------------------------------------- */

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
    [MAP_OP_USERS_IMPORT] = "users.import",
    [MAP_OP_LIMIT_PUT] = "limit.put",
    [MAP_OP_LIMIT_DELETE] = "limit.delete",
    [MAP_OP_QUEUE_ADOPTED] = "queue.adopted",
    [MAP_OP_BROKER_INCARNATION] = "broker.incarnation",
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

bool map__rebalance_parse(struct bytes name, enum map_rebalance *out)
{
    for (int m = MAP_REBALANCE_AUTO; m <= MAP_REBALANCE_ONCE; m++) {
        if (bytes_equal_cstr(name, map_rebalance_name((enum map_rebalance)m))) {
            *out = (enum map_rebalance)m;
            return true;
        }
    }
    return false;
}

static const char *const reason_names[MAP_REASON_COUNT] = {
    [MAP_REASON_NONE] = "none",         [MAP_REASON_FAILOVER] = "failover",
    [MAP_REASON_RETURN] = "return",     [MAP_REASON_REPAIR] = "repair",
    [MAP_REASON_MOVE] = "move",         [MAP_REASON_REBALANCE] = "rebalance",
    [MAP_REASON_DRAIN] = "drain",       [MAP_REASON_POLICY] = "policy",
    [MAP_REASON_FORGET] = "forget",     [MAP_REASON_SYNC] = "sync",
    [MAP_REASON_SILENCE] = "heartbeats_missed", [MAP_REASON_RESET] = "connection_reset",
    [MAP_REASON_STOPPED] = "stopped",   [MAP_REASON_HEARD] = "heard_again",
    [MAP_REASON_RESTART] = "restarted", [MAP_REASON_REVIVE] = "revive",
    [MAP_REASON_LEAVE] = "leave",
};

const char *map_reason_name(enum map_reason reason)
{
    return (unsigned)reason < MAP_REASON_COUNT ? reason_names[reason] : "none";
}

static enum map_reason reason_parse(struct bytes text)
{
    for (int i = 1; i < MAP_REASON_COUNT; i++) {
        if (bytes_equal_cstr(text, reason_names[i]))
            return (enum map_reason)i;
    }
    return MAP_REASON_NONE;
}

const char *map_op_name(enum map_op op)
{
    return (unsigned)op < MAP_OP_COUNT ? op_names[op] : NULL;
}

/* ---- reading command fields ----------------------------------------------- */

void map__reader_fail(struct cmd_reader *r, const char *key)
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
        map__reader_fail(r, key);
    return false;
}

/* A string of min..max bytes ('S' or 'x'). */
struct bytes map__read_str(struct cmd_reader *r, const char *key, uint32_t min, uint32_t max)
{
    struct field_value v;
    if (!read_value(r, key, &v, false))
        return (struct bytes){(const uint8_t *)"", 0};
    if ((v.kind != 'S' && v.kind != 'x') || v.str.len < min || v.str.len > max) {
        map__reader_fail(r, key);
        return (struct bytes){(const uint8_t *)"", 0};
    }
    return v.str;
}

struct bytes map__read_name(struct cmd_reader *r, const char *key)
{
    return map__read_str(r, key, 1, CLUSTER_NAME_SIZE_MAX);
}

uint64_t map__read_uint(struct cmd_reader *r, const char *key, uint64_t max, bool optional,
                        uint64_t dflt)
{
    struct field_value v;
    if (!read_value(r, key, &v, optional))
        return dflt;
    int64_t i;
    if (!field_value_as_int(&v, &i) || i < 0 || (uint64_t)i > max) {
        map__reader_fail(r, key);
        return dflt;
    }
    return (uint64_t)i;
}

uint32_t map__read_broker_id(struct cmd_reader *r, const char *key)
{
    uint32_t id = (uint32_t)map__read_uint(r, key, UINT32_MAX, false, 0);
    if (id == BROKER_ID_NONE)
        map__reader_fail(r, key);
    return id;
}

bool map__read_bool(struct cmd_reader *r, const char *key, bool optional)
{
    struct field_value v;
    if (!read_value(r, key, &v, optional))
        return false;
    if (v.kind != 't') {
        map__reader_fail(r, key);
        return false;
    }
    return v.boolean;
}

struct table map__read_table(struct cmd_reader *r, const char *key)
{
    struct field_value v;
    if (!read_value(r, key, &v, true))
        return (struct table){(const uint8_t *)"", 0};
    if (v.kind != 'F' || v.table.len > CLUSTER_ARGUMENTS_SIZE_MAX) {
        map__reader_fail(r, key);
        return (struct table){(const uint8_t *)"", 0};
    }
    return v.table;
}

/* An array of up to CLUSTER_BACKUPS_MAX non-zero broker ids. */
static uint8_t read_u32s(struct cmd_reader *r, const char *key, uint32_t *out, int64_t min,
                         bool optional);

uint8_t map__read_ids(struct cmd_reader *r, const char *key, uint32_t *ids)
{
    return read_u32s(r, key, ids, 1, false);
}

uint8_t map__read_incarnations(struct cmd_reader *r, const char *key, uint32_t *out)
{
    return read_u32s(r, key, out, 0, true);
}

/* An array of at most CLUSTER_BACKUPS_MAX integers in [min, UINT32_MAX]
 * (optional: 0 entries when absent). */
static uint8_t read_u32s(struct cmd_reader *r, const char *key, uint32_t *out, int64_t min,
                         bool optional)
{
    struct field_value v;
    if (!read_value(r, key, &v, optional))
        return 0;
    if (v.kind != 'A') {
        map__reader_fail(r, key);
        return 0;
    }
    struct array_iter it;
    array_iter_init(&it, v.array);
    uint8_t n = 0;
    struct field_value e;
    while (array_iter_next(&it, &e)) {
        int64_t i;
        if (n == CLUSTER_BACKUPS_MAX || !field_value_as_int(&e, &i) || i < min ||
            i > UINT32_MAX) {
            map__reader_fail(r, key);
            return 0;
        }
        out[n++] = (uint32_t)i;
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
        map__reader_fail(r, key);
        return 0;
    }
    struct array_iter it;
    array_iter_init(&it, v.array);
    uint32_t n = 0;
    struct field_value e;
    while (array_iter_next(&it, &e)) {
        if (n == CLUSTER_USER_LIST_MAX || e.kind != 'S' || e.str.len == 0 ||
            e.str.len > CLUSTER_NAME_SIZE_MAX) {
            map__reader_fail(r, key);
            return 0;
        }
        if (out)
            out[n] = e.str;
        n++;
    }
    return n;
}

/* ---- apply context and refusals ------------------------------------------- */

int map__refuse(struct apply_ctx *ctx, uint16_t code, bool retry, const char *fmt, ...)
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

int map__malformed(struct apply_ctx *ctx)
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
int map__check_broker_usable(struct apply_ctx *ctx, uint32_t id, const char *what,
                             struct bytes name)
{
    const struct map_broker *b = cluster_map_broker(ctx->map, id);
    if (b == NULL)
        return map__refuse(ctx, REPLY_NOT_FOUND, true, "broker %u chosen for %s '%.*s' is unknown",
                           id, what, BYTES_ARG(name));
    if (!ctx->restoring && b->state == BROKER_STATE_DOWN)
        return map__refuse(ctx, REPLY_NOT_FOUND, true,
                           "broker %u chosen for %s '%.*s' is down or inaccessible", id, what,
                           BYTES_ARG(name));
    return OK;
}

struct map_vhost *map__need_vhost(struct apply_ctx *ctx, struct bytes name, int *rc)
{
    struct map_vhost *v = cluster_map_vhost(ctx->map, name);
    *rc = v ? OK : map__refuse(ctx, REPLY_NOT_FOUND, false, "no vhost '%.*s'", BYTES_ARG(name));
    return v;
}

/* ---- brokers -------------------------------------------------------------- */

/* Broker b's process is incarnation (0: not said). Another one than the
 * map knew restarted it: whatever it held as a replica was in the memory or
 * the replica logs of the process before (a restart recreates them), so it
 * is no longer in sync anywhere, and its primaries catch it up and ask for
 * it again. Without this a restart the map never saw as down (no leader
 * while it was dead) left it in sync, and a failover promoted it empty. The
 * first one the map hears of a broker that joined without one (an upgrade)
 * is only recorded: the queues placed on it meanwhile would all lose their
 * in-sync backups at once. */
static void note_process(struct cluster_map *map, struct map_broker *b, uint32_t incarnation)
{
    if (incarnation == 0 || b->incarnation == incarnation)
        return;
    bool restarted = b->incarnation != 0;
    b->incarnation = incarnation;
    for (uint32_t i = 0; restarted && i < map->queues_count; i++) {
        struct map_queue *q = map->queues[i];
        int slot = map__backup_slot(q, b->id);
        if (slot >= 0)
            q->in_sync_mask &= (uint8_t)~(1u << slot);
    }
}

static int op_broker_join(struct apply_ctx *ctx)
{
    struct cmd_reader *r = &ctx->reader;
    uint32_t id = map__read_broker_id(r, "id");
    struct bytes name = map__read_name(r, "name");
    struct bytes amqp_address = map__read_name(r, "amqp_address");
    struct bytes cluster_address = map__read_name(r, "cluster_address");
    bool voter = map__read_bool(r, "voter", false);
    enum broker_state state = BROKER_STATE_UP;
    if (ctx->restoring && !broker_state_parse(map__read_name(r, "state"), &state))
        map__reader_fail(r, "state");
    struct bytes storage_id = {(const uint8_t *)"", 0};
    if (ctx->restoring && table_get(r->table, "storage", &(struct field_value){0}))
        storage_id = map__read_str(r, "storage", 1, MAP_STORAGE_ID_SIZE_MAX);
    uint32_t incarnation = (uint32_t)map__read_uint(r, "incarnation", UINT32_MAX, true, 0);
    if (r->bad_key)
        return map__malformed(ctx);
    struct cluster_map *map = ctx->map;
    struct map_broker *b = cluster_map_broker(map, id);
    if (ctx->restoring && b)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "broker %u twice", id);
    uint32_t voters = 0;
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *o = map->brokers[i];
        if (o != b && bytes_equal(o->name, name))
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                               "broker name '%.*s' is taken by broker %u", BYTES_ARG(name), o->id);
        voters += (o != b && o->voter);
    }
    if (voter && voters >= CLUSTER_VOTERS_MAX)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "already %u voting brokers",
                           voters);
    if (!b && map->brokers_count == CLUSTER_BROKERS_MAX)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "cluster is full (%u brokers)",
                           map->brokers_count);
    if (b) {
        /* A rejoin (restart, new address): the state stays the controller's;
         * a new process is a restart (broker.incarnation's). */
        bytes_free(&b->name);
        bytes_free(&b->amqp_address);
        bytes_free(&b->cluster_address);
        note_process(map, b, incarnation);
    } else {
        b = xcalloc(1, sizeof(*b));
        b->id = id;
        b->state = state;
        map->brokers[map->brokers_count++] = b;
        if (storage_id.len > 0)
            b->storage_id = bytes_dup(storage_id);
        b->incarnation = incarnation;
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
    uint32_t id = map__read_broker_id(&ctx->reader, "id");
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    struct cluster_map *map = ctx->map;
    ctx->change->broker_id = id;
    struct map_broker *b = cluster_map_broker(map, id);
    if (b == NULL)
        return OK; /* already gone */
    if (b->queues_owned_count || b->backups_held_count || b->exchanges_owned_count)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
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

/* The broker a broker.* change names (its fields read): NULL with *rc
 * set when the command is malformed or there is no such broker. */
static struct map_broker *named_broker(struct apply_ctx *ctx, uint32_t id, int *rc)
{
    if (ctx->reader.bad_key) {
        *rc = map__malformed(ctx);
        return NULL;
    }
    ctx->change->broker_id = id;
    struct map_broker *b = cluster_map_broker(ctx->map, id);
    if (b == NULL)
        *rc = map__refuse(ctx, REPLY_NOT_FOUND, false, "no broker %u", id);
    return b;
}

static int op_broker_state(struct apply_ctx *ctx)
{
    uint32_t id = map__read_broker_id(&ctx->reader, "id");
    enum broker_state state = BROKER_STATE_UP;
    if (!broker_state_parse(map__read_name(&ctx->reader, "state"), &state))
        map__reader_fail(&ctx->reader, "state");
    ctx->change->silence_ms = map__read_uint(&ctx->reader, "silence_ms", UINT32_MAX, true, 0);
    int rc;
    struct map_broker *b = named_broker(ctx, id, &rc);
    if (b == NULL)
        return rc;
    if (b->state != state) {
        b->state = state;
        ctx->map->brokers_version++;
        ctx->change->changed = true;
    }
    return OK;
}

/* The controller heard a new process of the broker (its heartbeats'
 * incarnation): note_process. */
static int op_broker_incarnation(struct apply_ctx *ctx)
{
    uint32_t id = map__read_broker_id(&ctx->reader, "id");
    uint64_t incarnation = map__read_uint(&ctx->reader, "incarnation", UINT32_MAX, false, 0);
    if (incarnation == 0)
        map__reader_fail(&ctx->reader, "incarnation");
    int rc;
    struct map_broker *b = named_broker(ctx, id, &rc);
    if (b == NULL)
        return rc;
    if (b->incarnation == incarnation)
        return OK;
    note_process(ctx->map, b, (uint32_t)incarnation);
    ctx->map->brokers_version++;
    ctx->change->changed = true;
    return OK;
}

/* A broker announces the shared storage it keeps its journal on (or none):
 * the controller gives a dead broker's queues only to brokers that share
 * its storage (queue.take_over). */
static int op_broker_storage(struct apply_ctx *ctx)
{
    uint32_t id = map__read_broker_id(&ctx->reader, "id");
    struct bytes storage_id = map__read_str(&ctx->reader, "storage", 0, MAP_STORAGE_ID_SIZE_MAX);
    int rc;
    struct map_broker *b = named_broker(ctx, id, &rc);
    if (b == NULL)
        return rc;
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

static void add_predeclared(struct cluster_map *map, struct map_vhost *v)
{
    for (size_t i = 0; i < sizeof predeclared_exchanges / sizeof predeclared_exchanges[0]; i++) {
        struct map_exchange_decl d = {
            .vhost = v->name, .name = bytes_of_cstr(predeclared_exchanges[i].name),
            .type = bytes_of_cstr(predeclared_exchanges[i].type), .durable = true,
            .internal = predeclared_exchanges[i].internal, .owner_id = BROKER_ID_NONE};
        map__exchange_insert(map, v, &d);
    }
}

static struct map_vhost *vhost_insert(struct cluster_map *map, struct bytes name);

static int op_vhost_put(struct apply_ctx *ctx)
{
    struct bytes name = map__read_name(&ctx->reader, "name");
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    struct cluster_map *map = ctx->map;
    if (cluster_map_vhost(map, name)) {
        if (ctx->restoring)
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "vhost twice");
        return OK;
    }
    if (map->vhosts_count == CLUSTER_VHOSTS_MAX)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "vhost limit reached");
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
    struct bytes name = map__read_name(&ctx->reader, "name");
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    int rc;
    struct map_vhost *v = map__need_vhost(ctx, name, &rc);
    if (v == NULL)
        return rc;
    map__vhost_remove(ctx->map, v, ctx->change);
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

const char *const map__permission_keys[3] = {"configure", "write", "read"};

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
    f->name = map__read_name(r, "name");
    f->hash = map__read_str(r, "password_hash", 0, CLUSTER_NAME_SIZE_MAX);
    f->tags_count = read_str_list(r, "tags", tags);
    struct field_value v;
    f->has_vhosts = table_get(r->table, "vhosts", &v);
    f->vhosts_count = f->has_vhosts ? read_str_list(r, "vhosts", vhosts) : 0;
    f->loopback = map__read_bool(r, "loopback", true);
    f->any_vhost = map__read_bool(r, "any_vhost", true);
    for (uint32_t i = 0; texts != NULL && i < 3 * f->vhosts_count; i++)
        texts[i] = BYTES_LIT(".*");
    if (!table_get(r->table, "permissions", &v))
        return;
    if (v.kind != 'A' || !f->has_vhosts) {
        map__reader_fail(r, "permissions");
        return;
    }
    struct array_iter it;
    array_iter_init(&it, v.array);
    struct field_value e;
    while (array_iter_next(&it, &e)) {
        if (e.kind != 'F') {
            map__reader_fail(r, "permissions");
            return;
        }
        struct cmd_reader pr = {e.table, NULL};
        struct bytes vhost = map__read_name(&pr, "vhost");
        struct bytes found[3];
        for (int k = 0; k < 3; k++)
            found[k] = map__read_str(&pr, map__permission_keys[k], 0, CLUSTER_NAME_SIZE_MAX);
        if (pr.bad_key != NULL) {
            map__reader_fail(r, "permissions");
            return;
        }
        uint32_t j = 0;
        while (vhosts != NULL && j < f->vhosts_count && !bytes_equal(vhosts[j], vhost))
            j++;
        if (vhosts != NULL && j == f->vhosts_count) {
            map__reader_fail(r, "permissions"); /* a permission for a vhost it lacks */
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
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "a regex with a NUL");
        memcpy(text, texts[i].ptr, texts[i].len);
        text[texts[i].len] = '\0';
        char err[200];
        if (text[0] != '\0' && auth_regex_check(text, err, sizeof err) != 0)
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "%s", err);
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
        return map__malformed(ctx);
    }
    struct bytes *tags = xcalloc(f.tags_count, sizeof(struct bytes));
    struct bytes *vhosts = xcalloc(f.vhosts_count, sizeof(struct bytes));
    struct bytes *texts = xcalloc(3 * (size_t)f.vhosts_count, sizeof(struct bytes));
    read_user(r, &f, tags, vhosts, texts);
    int rc = OK;
    if (r->bad_key) {
        ctx->reader.bad_key = r->bad_key;
        rc = map__malformed(ctx);
    }
    for (uint32_t i = 0; i < f.vhosts_count && rc == OK && !bootstrap; i++)
        map__need_vhost(ctx, vhosts[i], &rc);
    if (rc == OK)
        rc = check_regexes(ctx, texts, 3 * f.vhosts_count);
    struct cluster_map *map = ctx->map;
    struct map_user *u = cluster_map_user(map, f.name);
    if (rc == OK && u && ctx->restoring)
        rc = map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "user twice");
    if (rc == OK && !u && map->users_count == CLUSTER_USERS_MAX)
        rc = map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "user limit reached");
    if (rc == OK && !check_only) {
        for (uint32_t i = 0; i < f.vhosts_count && bootstrap; i++)
            vhost_insert(map, vhosts[i]);
        if (u && f.has_vhosts) {
            map__user_lists_release(u); /* tags, vhosts, permissions */
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
    struct bytes name = map__read_name(&ctx->reader, "name");
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    struct map_user *u = cluster_map_user(ctx->map, name);
    if (u == NULL)
        return map__refuse(ctx, REPLY_NOT_FOUND, false, "no user '%.*s'", BYTES_ARG(name));
    limit_set_delete_all(&ctx->map->limits, LIMIT_SCOPE_USER, name);
    map__user_remove(ctx->map, u);
    ctx->map->users_defined = true;
    ctx->change->changed = true;
    return OK;
}

/* Sets the permission r reads (permission.put's fields). */
static int permission_put(struct apply_ctx *ctx, struct cmd_reader *r)
{
    struct bytes user = map__read_name(r, "user");
    struct bytes vhost = map__read_name(r, "vhost");
    struct bytes texts[3];
    for (int k = 0; k < 3; k++)
        texts[k] = map__read_str(r, map__permission_keys[k], 0, CLUSTER_NAME_SIZE_MAX);
    if (r->bad_key) {
        ctx->reader.bad_key = r->bad_key;
        return map__malformed(ctx);
    }
    struct map_user *u = cluster_map_user(ctx->map, user);
    if (u == NULL)
        return map__refuse(ctx, REPLY_NOT_FOUND, false, "no user '%.*s'", BYTES_ARG(user));
    int rc;
    if (map__need_vhost(ctx, vhost, &rc) == NULL)
        return rc;
    if ((rc = check_regexes(ctx, texts, 3)) != OK)
        return rc;
    ctx->map->users_defined = true;
    uint32_t j = 0;
    while (j < u->vhosts_count && !bytes_equal(u->vhosts[j], vhost))
        j++;
    if (j == u->vhosts_count) {
        u->vhosts = xrealloc(u->vhosts, sizeof(u->vhosts[0]) * (j + 1));
        u->permissions = xrealloc(u->permissions, sizeof(u->permissions[0]) * 3 * (j + 1));
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

static int op_permission_put(struct apply_ctx *ctx)
{
    return permission_put(ctx, &ctx->reader);
}

static int op_permission_delete(struct apply_ctx *ctx)
{
    struct bytes user = map__read_name(&ctx->reader, "user");
    struct bytes vhost = map__read_name(&ctx->reader, "vhost");
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    struct map_user *u = cluster_map_user(ctx->map, user);
    uint32_t j = 0;
    while (u != NULL && j < u->vhosts_count && !bytes_equal(u->vhosts[j], vhost))
        j++;
    if (u == NULL || j == u->vhosts_count)
        return map__refuse(ctx, REPLY_NOT_FOUND, false, "no permission for user '%.*s' in vhost "
                           "'%.*s'", BYTES_ARG(user), BYTES_ARG(vhost));
    map__user_permission_remove(u, j);
    ctx->map->users_defined = true;
    ctx->change->changed = true;
    return OK;
}

/* users.bootstrap {users: [..]}: all or nothing, checked first. */
static int op_users_bootstrap(struct apply_ctx *ctx)
{
    struct field_value v;
    if (!table_get(ctx->reader.table, "users", &v) || v.kind != 'A') {
        map__reader_fail(&ctx->reader, "users");
        return map__malformed(ctx);
    }
    if (ctx->map->users_defined)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "users are already defined");
    for (int pass = 0; pass < 2; pass++) {
        struct array_iter it;
        array_iter_init(&it, v.array);
        struct field_value e;
        uint32_t count = 0;
        uint64_t vhosts_named = 0; /* an upper bound of the vhosts it creates */
        while (array_iter_next(&it, &e)) {
            if (e.kind != 'F' || ++count > CLUSTER_USERS_MAX) {
                map__reader_fail(&ctx->reader, "users");
                return map__malformed(ctx);
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
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "vhost limit reached");
    }
    ctx->map->users_defined = true;
    ctx->change->changed = true;
    return OK;
}

/* users.import's arrays: each present, an array. */
struct import_lists {
    struct field_value users, vhosts, permissions;
};

static bool import_array(struct apply_ctx *ctx, const char *key, struct field_value *out)
{
    if (table_get(ctx->reader.table, key, out) && out->kind == 'A')
        return true;
    map__reader_fail(&ctx->reader, key);
    return false;
}

/* Whether the import's users (a table each) or vhosts (strings) name it. */
static bool import_names(const struct field_value *list, bool tables, struct bytes name)
{
    struct array_iter it;
    array_iter_init(&it, list->array);
    struct field_value e;
    while (array_iter_next(&it, &e)) {
        struct bytes b = e.str;
        if (tables) {
            struct cmd_reader r = {e.table, NULL};
            b = map__read_name(&r, "name");
        }
        if (bytes_equal(b, name))
            return true;
    }
    return false;
}

/* The check pass of users.import: every item well formed, every limit
 * kept, every permission's user and vhost in the map or the command. */
static int import_check(struct apply_ctx *ctx, const struct import_lists *l)
{
    struct cluster_map *map = ctx->map;
    uint64_t new_users = 0, new_vhosts = 0;
    struct array_iter it;
    struct field_value e;
    array_iter_init(&it, l->users.array);
    while (array_iter_next(&it, &e)) {
        struct cmd_reader r = {e.kind == 'F' ? e.table : (struct table){NULL, 0}, NULL};
        struct user_fields f;
        read_user(&r, &f, NULL, NULL, NULL);
        if (e.kind != 'F' || f.has_vhosts) {
            map__reader_fail(&ctx->reader, "users");
            return map__malformed(ctx);
        }
        r.bad_key = NULL;
        int rc = user_apply(ctx, &r, false, true);
        if (rc != OK)
            return rc;
        new_users += cluster_map_user(map, f.name) == NULL;
    }
    array_iter_init(&it, l->vhosts.array);
    while (array_iter_next(&it, &e)) {
        if (e.kind != 'S' || e.str.len == 0 || e.str.len > CLUSTER_NAME_SIZE_MAX) {
            map__reader_fail(&ctx->reader, "vhosts");
            return map__malformed(ctx);
        }
        new_vhosts += cluster_map_vhost(map, e.str) == NULL;
    }
    if (map->users_count + new_users > CLUSTER_USERS_MAX)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "user limit reached");
    if (map->vhosts_count + new_vhosts > CLUSTER_VHOSTS_MAX)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "vhost limit reached");
    array_iter_init(&it, l->permissions.array);
    while (array_iter_next(&it, &e)) {
        struct cmd_reader r = {e.kind == 'F' ? e.table : (struct table){NULL, 0}, NULL};
        struct bytes user = map__read_name(&r, "user");
        struct bytes vhost = map__read_name(&r, "vhost");
        struct bytes texts[3];
        for (int k = 0; k < 3; k++)
            texts[k] = map__read_str(&r, map__permission_keys[k], 0, CLUSTER_NAME_SIZE_MAX);
        if (e.kind != 'F' || r.bad_key != NULL) {
            map__reader_fail(&ctx->reader, "permissions");
            return map__malformed(ctx);
        }
        if (cluster_map_user(map, user) == NULL && !import_names(&l->users, true, user))
            return map__refuse(ctx, REPLY_NOT_FOUND, false, "no user '%.*s'", BYTES_ARG(user));
        if (cluster_map_vhost(map, vhost) == NULL && !import_names(&l->vhosts, false, vhost))
            return map__refuse(ctx, REPLY_NOT_FOUND, false, "no vhost '%.*s'",
                               BYTES_ARG(vhost));
        int rc = check_regexes(ctx, texts, 3);
        if (rc != OK)
            return rc;
    }
    return OK;
}

/* users.import {users, vhosts, permissions}: all or nothing, checked first
 * (map.h). */
static int op_users_import(struct apply_ctx *ctx)
{
    struct import_lists l;
    if (!import_array(ctx, "users", &l.users) || !import_array(ctx, "vhosts", &l.vhosts) ||
        !import_array(ctx, "permissions", &l.permissions))
        return map__malformed(ctx);
    int rc = import_check(ctx, &l);
    if (rc != OK)
        return rc;
    /* An import does not make the map's users the brokers' (users_defined):
     * one at a first start (quayd --definitions) may come before the
     * users.bootstrap of a broker's users file, which must still apply. */
    bool users_defined = ctx->map->users_defined;
    struct array_iter it;
    struct field_value e;
    array_iter_init(&it, l.vhosts.array);
    while (array_iter_next(&it, &e)) {
        if (cluster_map_vhost(ctx->map, e.str) == NULL) {
            vhost_insert(ctx->map, e.str);
            ctx->change->changed = true;
        }
    }
    array_iter_init(&it, l.users.array);
    while (array_iter_next(&it, &e)) {
        struct cmd_reader r = {e.table, NULL};
        rc = user_apply(ctx, &r, false, false);
        ASSERT(rc == OK); /* checked */
    }
    array_iter_init(&it, l.permissions.array);
    while (array_iter_next(&it, &e)) {
        struct cmd_reader r = {e.table, NULL};
        rc = permission_put(ctx, &r);
        ASSERT(rc == OK); /* checked */
    }
    ctx->map->users_defined = users_defined;
    return OK;
}

/* ---- policies ------------------------------------------------------------- */

static void read_policy_decl(struct cmd_reader *r, struct policy_decl *d)
{
    d->vhost = map__read_name(r, "vhost");
    d->name = map__read_name(r, "name");
    d->pattern = map__read_name(r, "pattern");
    d->priority = (uint32_t)map__read_uint(r, "priority", POLICY_PRIORITY_MAX, false, 0);
    d->backups = (uint8_t)map__read_uint(r, "backups", CLUSTER_BACKUPS_MAX, false, 0);
    d->replicate = (uint8_t)map__read_uint(r, "replicate", POLICY_REPLICATE_TRANSIENT, true,
                                           POLICY_REPLICATE_UNSET);
}

/* A policy change may turn a queue from transient-only replication to
 * everything (its applying policy's quay-replicate goes from "transient"
 * to "all" or unset, or another policy applies now). Its in-sync backups
 * then hold its transient messages only, and the controller would promote
 * one as usual (controller_takes_over_with_replica is false now) without
 * reading the primary's log: the persistent messages lost. So the same
 * command drops them from the in-sync set, on every broker alike; the
 * primary (mirror.c, replication_attach) catches them up in full and asks
 * for them back. Meanwhile a dead primary's queue is taken over from its
 * log by a broker that is not a backup (its transient messages lost, as
 * for any queue whose backups are out of sync). The other way needs
 * nothing: a full backup serves a transient-only takeover as well.
 * Only when a policy of the vhost says "transient" before the change
 * (else no queue's mode can drop): a scan of the vhost's queues then. */
struct partial_backups {
    struct map_queue **queues; /* owned; each in the map */
    uint32_t count;
};

static void partial_before(const struct cluster_map *map, const struct map_vhost *v,
                           struct partial_backups *out)
{
    *out = (struct partial_backups){0};
    bool any = false;
    for (uint32_t i = 0; i < map->policies.count && !any; i++) {
        const struct policy *p = map->policies.items[i];
        any = p->replicate == POLICY_REPLICATE_TRANSIENT && bytes_equal(p->vhost, v->name);
    }
    for (uint32_t i = 0; any && i < map->queues_count; i++) {
        struct map_queue *q = map->queues[i];
        if (q->vhost != v || q->in_sync_mask == 0 || !q->durable ||
            !map_queue_replicates_transient_only(map, q))
            continue;
        if (out->queues == NULL)
            out->queues = xcalloc(map->queues_count, sizeof *out->queues);
        out->queues[out->count++] = q;
    }
}

static void partial_drop(struct cluster_map *map, struct partial_backups *b)
{
    for (uint32_t i = 0; i < b->count; i++) {
        struct map_queue *q = b->queues[i];
        if (!map_queue_replicates_transient_only(map, q))
            q->in_sync_mask = 0;
    }
    free(b->queues);
    *b = (struct partial_backups){0};
}

static int op_policy_put(struct apply_ctx *ctx)
{
    struct policy_decl d;
    read_policy_decl(&ctx->reader, &d);
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    int rc;
    if (map__need_vhost(ctx, d.vhost, &rc) == NULL)
        return rc;
    /* regcomp is deterministic for a given pattern, so every broker
     * refuses (or accepts) the same command alike. */
    char err[POLICY_ERROR_SIZE];
    if (policy_decl_check(&d, err, sizeof err) != OK)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "policy '%.*s': %s",
                           BYTES_ARG(d.name), err);
    struct policy_set *set = &ctx->map->policies;
    bool exists = policy_set_find(set, d.vhost, d.name) != NULL;
    if (exists && ctx->restoring)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "policy twice");
    if (!exists && set->count == POLICY_COUNT_MAX)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "policy limit reached");
    if (policy_set_same(set, &d))
        return OK;
    struct partial_backups partial;
    partial_before(ctx->map, cluster_map_vhost(ctx->map, d.vhost), &partial);
    policy_set_put(set, &d);
    partial_drop(ctx->map, &partial);
    ctx->map->policies_generation++;
    ctx->change->changed = true;
    return OK;
}

static int op_policy_delete(struct apply_ctx *ctx)
{
    struct bytes vhost = map__read_name(&ctx->reader, "vhost");
    struct bytes name = map__read_name(&ctx->reader, "name");
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    int rc;
    const struct map_vhost *v = map__need_vhost(ctx, vhost, &rc);
    if (v == NULL)
        return rc;
    if (policy_set_find(&ctx->map->policies, vhost, name) == NULL)
        return map__refuse(ctx, REPLY_NOT_FOUND, false, "no policy '%.*s' in vhost '%.*s'",
                           BYTES_ARG(name), BYTES_ARG(vhost));
    struct partial_backups partial;
    partial_before(ctx->map, v, &partial);
    policy_set_delete(&ctx->map->policies, vhost, name);
    partial_drop(ctx->map, &partial);
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
    struct bytes scope_text = map__read_name(r, "scope");
    struct bytes name = map__read_name(r, "name");
    struct bytes kind_text = map__read_name(r, "kind");
    int64_t value = -1;
    struct field_value v;
    if (put && read_value(r, "value", &v, false) &&
        (!field_value_as_int(&v, &value) || value > LIMIT_VALUE_MAX ||
         value < -LIMIT_VALUE_MAX))
        map__reader_fail(r, "value");
    enum limit_scope scope = LIMIT_SCOPE_VHOST;
    if (bytes_equal_cstr(scope_text, "user"))
        scope = LIMIT_SCOPE_USER;
    else if (!bytes_equal_cstr(scope_text, "vhost"))
        map__reader_fail(r, "scope");
    int kind = limit_kind_parse(scope, kind_text);
    if (kind < 0)
        map__reader_fail(r, "kind");
    if (r->bad_key)
        return map__malformed(ctx);
    int rc = OK;
    if (scope == LIMIT_SCOPE_VHOST && map__need_vhost(ctx, name, &rc) == NULL)
        return rc;
    if (scope == LIMIT_SCOPE_USER && cluster_map_user(ctx->map, name) == NULL)
        return map__refuse(ctx, REPLY_NOT_FOUND, false, "no user '%.*s'", BYTES_ARG(name));
    struct limit_set *set = &ctx->map->limits;
    const struct limit *old = limit_set_find(set, scope, name, kind);
    if (!put) {
        ctx->change->changed = limit_set_delete(set, scope, name, kind);
        return OK;
    }
    if (old != NULL && ctx->restoring)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "limit twice");
    if (old == NULL && set->count == LIMIT_COUNT_MAX)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "too many limits");
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
    struct bytes name = map__read_name(&ctx->reader, "mode");
    enum map_rebalance mode = ctx->map->rebalance;
    if (bytes_equal_cstr(name, "done")) {
        if (mode == MAP_REBALANCE_ONCE)
            mode = MAP_REBALANCE_OFF;
    } else if (!map__rebalance_parse(name, &mode)) {
        map__reader_fail(&ctx->reader, "mode");
    }
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    ctx->change->changed = mode != ctx->map->rebalance;
    ctx->map->rebalance = mode;
    return OK;
}

/* ---- dispatch ------------------------------------------------------------- */

int map__dispatch(struct apply_ctx *ctx)
{
    switch (ctx->change->op) {
    case MAP_OP_BROKER_JOIN: return op_broker_join(ctx);
    case MAP_OP_BROKER_LEAVE: return op_broker_leave(ctx);
    case MAP_OP_BROKER_STATE: return op_broker_state(ctx);
    case MAP_OP_VHOST_PUT: return op_vhost_put(ctx);
    case MAP_OP_VHOST_DELETE: return op_vhost_delete(ctx);
    case MAP_OP_USER_PUT: return op_user_put(ctx);
    case MAP_OP_USER_DELETE: return op_user_delete(ctx);
    case MAP_OP_EXCHANGE_DECLARE: return map__op_exchange_declare(ctx);
    case MAP_OP_EXCHANGE_DELETE: return map__op_exchange_delete(ctx);
    case MAP_OP_EXCHANGE_SET_OWNER: return map__op_exchange_set_owner(ctx);
    case MAP_OP_BIND: return map__op_bind(ctx, true);
    case MAP_OP_UNBIND: return map__op_bind(ctx, false);
    case MAP_OP_QUEUE_DECLARE: return map__op_queue_declare(ctx);
    case MAP_OP_QUEUE_DELETE: return map__op_queue_delete(ctx);
    case MAP_OP_QUEUE_SET_OWNER: return map__op_queue_set_owner(ctx);
    case MAP_OP_QUEUE_SET_BACKUPS: return map__op_queue_set_backups(ctx);
    case MAP_OP_QUEUE_SET_IN_SYNC: return map__op_queue_set_in_sync(ctx);
    case MAP_OP_QUEUE_SET_AVAILABLE: return map__op_queue_set_available(ctx);
    case MAP_OP_SYNC: return OK;
    case MAP_OP_POLICY_PUT: return op_policy_put(ctx);
    case MAP_OP_POLICY_DELETE: return op_policy_delete(ctx);
    case MAP_OP_QUEUE_MOVE: return map__op_queue_move(ctx);
    case MAP_OP_CLUSTER_REBALANCE: return op_cluster_rebalance(ctx);
    case MAP_OP_BROKER_STORAGE: return op_broker_storage(ctx);
    case MAP_OP_BROKER_INCARNATION: return op_broker_incarnation(ctx);
    case MAP_OP_QUEUE_TAKE_OVER: return map__op_queue_take_over(ctx);
    case MAP_OP_QUEUE_ADOPTED: return map__op_queue_adopted(ctx);
    case MAP_OP_PERMISSION_PUT: return op_permission_put(ctx);
    case MAP_OP_PERMISSION_DELETE: return op_permission_delete(ctx);
    case MAP_OP_USERS_BOOTSTRAP: return op_users_bootstrap(ctx);
    case MAP_OP_USERS_IMPORT: return op_users_import(ctx);
    case MAP_OP_LIMIT_PUT: return op_limit(ctx, true);
    case MAP_OP_LIMIT_DELETE: return op_limit(ctx, false);
    case MAP_OP_NONE:
    case MAP_OP_COUNT: break;
    }
    return map__malformed(ctx);
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
    map->objects_stamp = cluster_map__next_stamp();
    c->version = map->version;
    struct apply_ctx ctx = {.map = map, .change = c};
    if (size > CLUSTER_CMD_SIZE_MAX || table_validate(cmd, (uint32_t)size) != OK)
        return map__malformed(&ctx);
    ctx.reader.table = (struct table){cmd, (uint32_t)size};
    c->op = op_parse(ctx.reader.table);
    struct field_value v;
    if (table_get(ctx.reader.table, "vhost", &v) && v.kind == 'S')
        c->vhost = v.str;
    if (table_get(ctx.reader.table, "name", &v) && v.kind == 'S')
        c->name = v.str;
    if (table_get(ctx.reader.table, "reason", &v) && v.kind == 'S')
        c->reason = reason_parse(v.str);
    int rc = map__dispatch(&ctx);
    map__free_removed_exchanges(map);
    ASSERT(rc == OK || rc == E_MAP_REFUSED || rc == E_SYNTAX);
    ASSERT((rc == OK) == (c->reply_code == REPLY_SUCCESS));
    /* O(n): only while the map is small enough for it to stay cheap. */
    DEBUG_ASSERT(map->queues_count > 256 || cluster_map_verify(map));
    return rc;
}
