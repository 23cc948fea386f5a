/*
 * map_snapshot.c: the whole cluster map as one field table, and back.
 *
 * Each element is the table of the command that creates the object
 * (written by map_cmd.c's encoders), and is read back by that command's
 * handler in "restoring" mode (map_apply.c's dispatch), so a snapshot is
 * checked exactly as strictly as the commands that built it. Reading
 * builds a fresh map and only replaces the old one when all of it applied.
 *
 * Must never do I/O, read a clock, draw random numbers, or let the order of
 * a hash-table walk decide anything (see map.h).
 */
#include "cluster/map.h"
#include "cluster/map_int.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"
#include "lib/log.h"

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
        struct policy_decl d = {p->vhost, p->name, p->pattern, p->priority, p->backups,
                                p->replicate};
        struct policy_args pa = {false, &d};
        size_t t = table_array_put_table_begin(w);
        map__encode_policy(w, &pa);
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
        map__encode_limit(w, &la);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, a);
}

static void encode_snapshot_objects(struct table_writer *w, const struct cluster_map *map)
{
    size_t a = table_put_array_begin(w, "brokers");
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        struct join_args j = {b->id, b->name, b->amqp_address, b->cluster_address, b->voter, 0, b};
        size_t t = table_array_put_table_begin(w);
        map__encode_join(w, &j);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, a);
    a = table_put_array_begin(w, "vhosts");
    for (uint32_t i = 0; i < map->vhosts_count; i++)
        table_array_put_longstr(w, map->vhosts[i]->name);
    table_put_array_end(w, a);
    a = table_put_array_begin(w, "users");
    for (uint32_t i = 0; i < map->users_count; i++)
        map__encode_map_user(w, map->users[i]);
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
        map__encode_exchange(w, &ea);
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
        map__encode_queue(w, &qa);
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
            map__encode_binding(w, &ba);
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
        uint8_t *buf = xmalloc(cap);
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
        if (map__dispatch(&ctx) != OK) {
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
    uint64_t format = map__read_uint(&r, "format", INT64_MAX, false, 0);
    uint64_t version = map__read_uint(&r, "version", INT64_MAX, false, 0);
    uint64_t brokers_version = map__read_uint(&r, "brokers_version", INT64_MAX, false, 0);
    enum map_rebalance rebalance = MAP_REBALANCE_UNSET;
    struct field_value rv;
    if (table_get(top, "rebalance", &rv) &&
        (rv.kind != 'S' || !map__rebalance_parse(rv.str, &rebalance)))
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
    fresh.users_defined = fresh.users_count > 0 || map__read_bool(&r, "users_defined", true);
    /* The policies may differ from what the controller last applied. */
    fresh.policies_generation = map->policies_generation + 1;
    ASSERT(cluster_map_verify(&fresh));
    cluster_map_free(map);
    *map = fresh;
    map->objects_stamp = cluster_map__next_stamp(); /* every object is new */
    return OK;
}
