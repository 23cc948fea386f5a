/*
 * map_apply_queues.c: the map ops on exchanges, bindings and queues:
 * declare, delete, set_owner, bind and unbind with their cascades, and the
 * queues' compare-and-set changes of ownership and replicas (set_owner,
 * set_backups, set_in_sync, move, set_available, take_over, adopted).
 * Dispatched by map_apply.c, and like every op there, checks everything
 * before it changes anything.
 *
 * Must never do I/O, read a clock, draw random numbers, or let the order of
 * a hash-table walk decide anything (see map.h).
 */
#include "cluster/map.h"
#include "cluster/map_int.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/policy.h"
#include "broker/queue_args.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"

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
        return map__refuse(ctx, code, false, "%s", text);
    return OK;
}

static void read_exchange_decl(struct cmd_reader *r, struct map_exchange_decl *d)
{
    d->vhost = map__read_name(r, "vhost");
    d->name = map__read_name(r, "name");
    d->type = map__read_name(r, "type");
    d->durable = map__read_bool(r, "durable", false);
    d->auto_delete = map__read_bool(r, "auto_delete", false);
    d->internal = map__read_bool(r, "internal", false);
    d->arguments = map__read_table(r, "arguments");
    d->owner_id = map__read_broker_id(r, "owner");
}

struct map_exchange *map__exchange_insert(struct cluster_map *map, struct map_vhost *v,
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
    map__exchange_count(map, x, +1);
    return x;
}

int map__op_exchange_declare(struct apply_ctx *ctx)
{
    struct map_exchange_decl d;
    read_exchange_decl(&ctx->reader, &d);
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    int rc;
    struct map_vhost *v = map__need_vhost(ctx, d.vhost, &rc);
    if (v == NULL)
        return rc;
    struct cluster_map *map = ctx->map;
    struct map_exchange *x = hmap_get(&v->exchanges, d.name);
    if (x && ctx->restoring)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "exchange twice");
    if (x) {
        ctx->change->exchange = x;
        return exchange_equivalent(ctx, x, &d);
    }
    rc = map__check_broker_usable(ctx, d.owner_id, "exchange", d.name);
    if (rc != OK)
        return rc;
    if (map->exchanges_count == CLUSTER_EXCHANGES_MAX)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "exchange limit reached");
    uint64_t since = map->version;
    if (ctx->restoring) {
        since = map__read_uint(&ctx->reader, "since", INT64_MAX, true, 0);
        if (ctx->reader.bad_key)
            return map__malformed(ctx);
    }
    x = map__exchange_insert(map, v, &d);
    x->owned_since = since;
    ctx->change->exchange = x;
    ctx->change->changed = true;
    return OK;
}

int map__op_exchange_delete(struct apply_ctx *ctx)
{
    struct cmd_reader *r = &ctx->reader;
    struct bytes vhost = map__read_name(r, "vhost");
    struct bytes name = map__read_name(r, "name");
    bool if_unused = map__read_bool(r, "if_unused", true);
    if (r->bad_key)
        return map__malformed(ctx);
    struct map_exchange *x = cluster_map_exchange(ctx->map, vhost, name);
    if (x == NULL)
        return OK;
    if (if_unused && x->bindings_out_count > 0)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                           "exchange '%.*s' in vhost '%.*s' in use", BYTES_ARG(name),
                           BYTES_ARG(vhost));
    struct removed removed = {0};
    map__exchange_remove(ctx->map, x, &removed);
    ctx->change->bindings_deleted_count = removed.bindings;
    ctx->change->exchanges_deleted_count = 1 + removed.exchanges;
    ctx->change->changed = true;
    return OK;
}

int map__op_exchange_set_owner(struct apply_ctx *ctx)
{
    struct cmd_reader *r = &ctx->reader;
    struct bytes vhost = map__read_name(r, "vhost");
    struct bytes name = map__read_name(r, "name");
    uint32_t owner = map__read_broker_id(r, "owner");
    if (r->bad_key)
        return map__malformed(ctx);
    struct map_exchange *x = cluster_map_exchange(ctx->map, vhost, name);
    if (x == NULL)
        return map__refuse(ctx, REPLY_NOT_FOUND, false, "no exchange '%.*s' in vhost '%.*s'",
                           BYTES_ARG(name), BYTES_ARG(vhost));
    int rc = map__check_broker_usable(ctx, owner, "exchange", name);
    if (rc != OK)
        return rc;
    ctx->change->exchange = x;
    if (x->owner_id == owner)
        return OK;
    map__exchange_count(ctx->map, x, -1);
    x->owner_id = owner;
    x->owned_since = ctx->map->version;
    map__exchange_count(ctx->map, x, +1);
    ctx->change->changed = true;
    return OK;
}

static void read_binding_decl(struct cmd_reader *r, struct map_binding_decl *d)
{
    d->vhost = map__read_name(r, "vhost");
    d->source = map__read_name(r, "source");
    struct bytes kind = map__read_name(r, "destination_kind");
    if (bytes_equal_cstr(kind, "queue"))
        d->destination_kind = MAP_DESTINATION_QUEUE;
    else if (bytes_equal_cstr(kind, "exchange"))
        d->destination_kind = MAP_DESTINATION_EXCHANGE;
    else
        map__reader_fail(r, "destination_kind");
    d->destination = map__read_name(r, "destination");
    d->routing_key = map__read_str(r, "routing_key", 0, CLUSTER_NAME_SIZE_MAX);
    d->arguments = map__read_table(r, "arguments");
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
    struct map_vhost *v = map__need_vhost(ctx, d->vhost, &rc);
    if (v == NULL)
        return rc;
    *source = hmap_get(&v->exchanges, d->source);
    if (*source == NULL)
        return map__refuse(ctx, REPLY_NOT_FOUND, false, "no exchange '%.*s' in vhost '%.*s'",
                           BYTES_ARG(d->source), BYTES_ARG(d->vhost));
    if (d->destination_kind == MAP_DESTINATION_QUEUE) {
        struct map_queue *q = hmap_get(&v->queues, d->destination);
        if (q == NULL)
            return map__refuse(ctx, REPLY_NOT_FOUND, false, "no queue '%.*s' in vhost '%.*s'",
                               BYTES_ARG(d->destination), BYTES_ARG(d->vhost));
        *dest_list = &q->bindings_in;
    } else {
        struct map_exchange *x = hmap_get(&v->exchanges, d->destination);
        if (x == NULL)
            return map__refuse(ctx, REPLY_NOT_FOUND, false, "no exchange '%.*s' in vhost '%.*s'",
                               BYTES_ARG(d->destination), BYTES_ARG(d->vhost));
        *dest_list = &x->bindings_in;
    }
    ctx->change->exchange = *source;
    return OK;
}

int map__op_bind(struct apply_ctx *ctx, bool bind)
{
    struct map_binding_decl d;
    read_binding_decl(&ctx->reader, &d);
    if (ctx->reader.bad_key)
        return map__malformed(ctx);
    ctx->change->binding = d;
    struct map_exchange *source = NULL;
    struct list_node *dest_list = NULL;
    int rc = binding_ends(ctx, &d, &source, &dest_list);
    if (rc != OK)
        return rc;
    struct cluster_map *map = ctx->map;
    size_t key_size = binding_key(&d, NULL, 0);
    uint8_t *key = xmalloc(key_size);
    binding_key(&d, key, key_size);
    struct bytes kb = {key, (uint32_t)key_size};
    struct map_binding *b = hmap_get(&source->vhost->bindings, kb);
    if (!bind || b) {
        free(key);
        if (b && ctx->restoring)
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "binding twice");
        if (b && !bind) {
            map__binding_remove(map, b);
            ctx->change->bindings_deleted_count = 1;
            ctx->change->changed = true;
            struct removed removed = {0};
            map__exchange_maybe_auto_delete(map, source, &removed);
            ctx->change->bindings_deleted_count += removed.bindings;
            ctx->change->exchanges_deleted_count = removed.exchanges;
            if (removed.exchanges > 0)
                ctx->change->exchange = NULL; /* gone: the mirror drops it too */
        }
        return OK;
    }
    if (map->bindings_count == CLUSTER_BINDINGS_MAX) {
        free(key);
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "binding limit reached");
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
    d->vhost = map__read_name(r, "vhost");
    d->name = map__read_name(r, "name");
    d->durable = map__read_bool(r, "durable", false);
    d->exclusive = map__read_bool(r, "exclusive", false);
    d->auto_delete = map__read_bool(r, "auto_delete", false);
    d->arguments = map__read_table(r, "arguments");
    d->exclusive_connection_id = map__read_uint(r, "connection", INT64_MAX, true, 0);
    d->exclusive_owner_id = (uint32_t)map__read_uint(r, "owner", UINT32_MAX, true, 0);
    d->primary_id = map__read_broker_id(r, "primary");
    if (d->exclusive_owner_id == BROKER_ID_NONE)
        d->exclusive_owner_id = d->primary_id; /* written before queues could live
                                                * apart from their connection */
    d->backups_count = map__read_ids(r, "backups", d->backup_ids);
    d->replication_factor =
        (uint8_t)map__read_uint(r, "replication_factor", CLUSTER_BACKUPS_MAX + 1, false, 1);
    d->replaces_epoch = map__read_uint(r, "replaces", INT64_MAX, true, 0);
    if (d->replication_factor == 0)
        map__reader_fail(r, "replication_factor");
}

/* Backups are distinct, never the primary, and usable brokers; so is the
 * primary if check_primary (a new queue; a queue whose primary is down may
 * still have its backups changed). */
static int check_placement(struct apply_ctx *ctx, struct bytes name, uint32_t primary,
                           bool check_primary, const uint32_t *backups, uint8_t count)
{
    int rc = check_primary ? map__check_broker_usable(ctx, primary, "queue", name) : OK;
    for (uint8_t i = 0; i < count && rc == OK; i++) {
        if (backups[i] == primary)
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                               "broker %u is both primary and backup of queue '%.*s'", primary,
                               BYTES_ARG(name));
        for (uint8_t j = 0; j < i; j++) {
            if (backups[j] == backups[i])
                return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                                   "broker %u is a backup of queue '%.*s' twice", backups[i],
                                   BYTES_ARG(name));
        }
        rc = map__check_broker_usable(ctx, backups[i], "queue", name);
    }
    return rc;
}

static int queue_equivalent(struct apply_ctx *ctx, const struct map_queue *q,
                            const struct map_queue_decl *d, uint32_t origin_id)
{
    bool other_owner = q->exclusive && (q->exclusive_owner_id != origin_id ||
                                        q->exclusive_connection_id != d->exclusive_connection_id);
    if (other_owner || q->exclusive != d->exclusive)
        return map__refuse(ctx, REPLY_RESOURCE_LOCKED, false,
                           "cannot obtain exclusive access to locked queue '%.*s' in vhost '%.*s'. "
                           "It could be originally declared on another connection or the exclusive "
                           "property value does not match that of the original declaration.",
                           BYTES_ARG(d->name), BYTES_ARG(d->vhost));
    struct queue_decl current = {q->durable, q->auto_delete,
                                 {q->arguments.ptr, q->arguments.len}};
    struct queue_decl received = {d->durable, d->auto_delete, d->arguments};
    uint16_t code = 0;
    char text[MAP_REPLY_TEXT_SIZE];
    if (!queue_redeclare_equivalent(&current, &received, d->name, d->vhost, &code, text,
                                    sizeof(text)))
        return map__refuse(ctx, code, false, "%s", text);
    return OK;
}

/* Snapshot-only queue fields: epoch, availability and the in-sync set. */
static void read_queue_state(struct cmd_reader *r, struct map_queue *q)
{
    q->epoch = map__read_uint(r, "epoch", INT64_MAX, false, 0);
    q->owned_since = map__read_uint(r, "since", INT64_MAX, true, 0);
    q->available = map__read_bool(r, "available", false);
    q->move_to = (uint32_t)map__read_uint(r, "move_to", UINT32_MAX, true, BROKER_ID_NONE);
    if (q->move_to != BROKER_ID_NONE && map__backup_slot(q, q->move_to) < 0)
        map__reader_fail(r, "move_to");
    q->move_from = (uint32_t)map__read_uint(r, "move_from", UINT32_MAX, true, BROKER_ID_NONE);
    q->taken_from = (uint32_t)map__read_uint(r, "taken_from", UINT32_MAX, true, BROKER_ID_NONE);
    q->taken_from_before =
        (uint32_t)map__read_uint(r, "taken_from_before", UINT32_MAX, true, BROKER_ID_NONE);
    struct field_value older;
    q->taken_older_count = table_get(r->table, "taken_older", &older)
                               ? map__read_ids(r, "taken_older", q->taken_older)
                               : 0;
    q->adopted = map__read_bool(r, "adopted", true);
    if (q->move_from != BROKER_ID_NONE &&
        (map__backup_slot(q, q->move_from) < 0 || q->move_to == BROKER_ID_NONE))
        map__reader_fail(r, "move_from");
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = map__read_ids(r, "in_sync", ids);
    q->in_sync_mask = 0;
    for (uint8_t i = 0; i < n; i++) {
        int slot = map__backup_slot(q, ids[i]);
        if (slot < 0 || (q->in_sync_mask & (1u << slot)))
            map__reader_fail(r, "in_sync");
        else
            q->in_sync_mask |= (uint8_t)(1u << slot);
    }
    if (q->epoch == 0)
        map__reader_fail(r, "epoch");
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
    return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                       "cannot declare queue '%.*s': queue limit in vhost '%.*s' (%lld) is reached",
                       BYTES_ARG(name), BYTES_ARG(v->name), (long long)max);
}

int map__op_queue_declare(struct apply_ctx *ctx)
{
    struct map_queue_decl d;
    struct cmd_reader *r = &ctx->reader;
    read_queue_decl(r, &d);
    uint32_t origin = ctx->restoring ? d.primary_id : map__read_broker_id(r, "origin");
    /* A snapshot may hold one backup beyond the factor: a move's target, or a
     * replacement catching up (queue.move, queue.set_backups). */
    if (!r->bad_key && d.backups_count >= d.replication_factor && !ctx->restoring)
        map__reader_fail(r, "backups");
    if (r->bad_key)
        return map__malformed(ctx);
    int rc;
    struct map_vhost *v = map__need_vhost(ctx, d.vhost, &rc);
    if (v == NULL)
        return rc;
    struct cluster_map *map = ctx->map;
    struct map_queue *q = hmap_get(&v->queues, d.name);
    if (q && ctx->restoring)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "queue twice");
    if (q && d.replaces_epoch != 0 && q->epoch == d.replaces_epoch) {
        /* Gone at its primary already: this declare is a new queue. */
        ctx->change->bindings_deleted_count =
            map__queue_remove(map, q, &ctx->change->exchanges_deleted_count);
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
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false, "queue limit reached");
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
            return map__malformed(ctx);
        }
    }
    q->name = bytes_dup(d.name);
    q->arguments = bytes_dup((struct bytes){d.arguments.ptr, d.arguments.len});
    list_init(&q->bindings_in);
    ptr_array_reserve((void ***)&map->queues, map->queues_count, &map->queues_cap);
    q->index = map->queues_count;
    map->queues[map->queues_count++] = q;
    hmap_put(&v->queues, q->name, q);
    map__queue_count(map, q, +1);
    ctx->change->queue = q;
    ctx->change->changed = true;
    return OK;
}

/* Reads vhost, name and the expected epoch of a queue.set_* command and
 * finds the queue. expected 0 (only allowed for delete) matches any. */
static struct map_queue *find_queue_cas(struct apply_ctx *ctx, bool epoch_required, int *rc)
{
    struct cmd_reader *r = &ctx->reader;
    struct bytes vhost = map__read_name(r, "vhost");
    struct bytes name = map__read_name(r, "name");
    uint64_t expected = map__read_uint(r, "epoch", INT64_MAX, !epoch_required, 0);
    if (epoch_required && expected == 0)
        map__reader_fail(r, "epoch");
    *rc = OK;
    if (r->bad_key) {
        *rc = map__malformed(ctx);
        return NULL;
    }
    struct map_queue *q = cluster_map_queue(ctx->map, vhost, name);
    if (q == NULL) {
        if (epoch_required)
            *rc = map__refuse(ctx, REPLY_NOT_FOUND, false, "no queue '%.*s' in vhost '%.*s'",
                              BYTES_ARG(name), BYTES_ARG(vhost));
        return NULL;
    }
    ctx->change->previous_epoch = q->epoch;
    ctx->change->previous_primary_id = q->primary_id;
    struct map_change *c = ctx->change;
    c->has_before = true;
    c->before.primary_id = q->primary_id;
    c->before.move_to = q->move_to;
    memcpy(c->before.backup_ids, q->backup_ids, sizeof q->backup_ids);
    c->before.backups_count = q->backups_count;
    c->before.in_sync_mask = q->in_sync_mask;
    c->before.move_reason = q->move_reason;
    c->before.available = q->available;
    if (expected != 0 && q->epoch != expected) {
        *rc = map__refuse(ctx, REPLY_PRECONDITION_FAILED, true,
                          "queue '%.*s' in vhost '%.*s' is at epoch %llu, not %llu",
                          BYTES_ARG(name), BYTES_ARG(vhost), (unsigned long long)q->epoch,
                          (unsigned long long)expected);
        return NULL;
    }
    ctx->change->queue = q;
    return q;
}

int map__op_queue_delete(struct apply_ctx *ctx)
{
    int rc;
    struct map_queue *q = find_queue_cas(ctx, false, &rc);
    if (q == NULL)
        return rc;
    ctx->change->queue = NULL;
    ctx->change->bindings_deleted_count =
        map__queue_remove(ctx->map, q, &ctx->change->exchanges_deleted_count);
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

int map__op_queue_set_owner(struct apply_ctx *ctx)
{
    uint32_t primary = map__read_broker_id(&ctx->reader, "primary");
    bool planned = map__read_bool(&ctx->reader, "planned", true);
    bool backup_only = planned || map__read_bool(&ctx->reader, "backup_only", true);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    rc = map__check_broker_usable(ctx, primary, "queue", q->name);
    if (rc != OK)
        return rc;
    /* A backup out of sync may lack confirmed messages: never promoted
     * (the primary may have dropped it from the set just before). A
     * planned handover goes only to the in-sync backup the move names: a
     * primary that gave up waiting cancels the move first (queue.move to
     * none), so a handover still on its way can no longer apply; a
     * restarted primary's hand-off only to a backup still in sync. */
    int slot = map__backup_slot(q, primary);
    if ((slot >= 0 && !(q->in_sync_mask & (1u << slot))) || (backup_only && slot < 0) ||
        (planned && q->move_to != primary))
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, true,
                           "broker %u is not an in-sync backup of queue '%.*s'", primary,
                           BYTES_ARG(q->name));
    struct cluster_map *map = ctx->map;
    uint32_t old_primary = q->primary_id;
    bool keep_old = planned && map_queue_switch_keeps_primary(map, q);
    map__queue_count(map, q, -1);
    /* The new primary leaves the backups; the others keep order and sync.
     * After a planned handover the old primary may stay, in sync: its
     * copy is the queue as it was handed over. */
    if (slot >= 0)
        drop_backup_slot(q, slot);
    if (keep_old) {
        ASSERT(q->backups_count < CLUSTER_BACKUPS_MAX);
        q->in_sync_mask |= (uint8_t)(1u << q->backups_count);
        q->backup_ids[q->backups_count++] = old_primary;
    }
    q->primary_id = primary;
    q->epoch++;
    q->owned_since = map->version;
    q->available = true;
    q->move_to = BROKER_ID_NONE; /* done, or overtaken by a failover */
    q->move_from = BROKER_ID_NONE;
    q->taken_from = BROKER_ID_NONE;
    q->taken_from_before = BROKER_ID_NONE;
    q->taken_older_count = 0;
    q->adopted = false;
    map__queue_count(map, q, +1);
    ASSERT(!map_queue_has_backup(q, primary));
    ctx->change->planned = planned;
    ctx->change->changed = true;
    return OK;
}

int map__op_queue_set_backups(struct apply_ctx *ctx)
{
    uint32_t ids[CLUSTER_BACKUPS_MAX];
    uint8_t n = map__read_ids(&ctx->reader, "backups", ids);
    /* Optional: a policy changed the factor (0 = unchanged). */
    uint8_t factor = (uint8_t)map__read_uint(&ctx->reader, "replication_factor",
                                             CLUSTER_BACKUPS_MAX + 1, true, 0);
    if (factor != 0 && n >= factor)
        map__reader_fail(&ctx->reader, "replication_factor");
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
    map__queue_count(ctx->map, q, -1);
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
    map__queue_count(ctx->map, q, +1);
    ctx->change->changed = true;
    return OK;
}

/* queue.move: see map_queue.move_to. A target that is not a backup yet
 * becomes one (not in sync: its primary catches it up), beyond the factor
 * for the time of the move; ending a move takes such an extra backup away
 * again. */
int map__op_queue_move(struct apply_ctx *ctx)
{
    uint32_t to = (uint32_t)map__read_uint(&ctx->reader, "to", UINT32_MAX, false, 0);
    uint32_t from = (uint32_t)map__read_uint(&ctx->reader, "from", UINT32_MAX, true,
                                             BROKER_ID_NONE);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    if (to == BROKER_ID_NONE) {
        int slot = map__backup_slot(q, q->move_to);
        ctx->change->changed = q->move_to != BROKER_ID_NONE;
        q->move_to = BROKER_ID_NONE;
        q->move_from = BROKER_ID_NONE;
        if (slot >= 0 && q->backups_count >= q->replication_factor) {
            map__queue_count(ctx->map, q, -1);
            drop_backup_slot(q, slot);
            map__queue_count(ctx->map, q, +1);
        }
        return OK;
    }
    if (to == q->primary_id)
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                           "broker %u is already the primary of queue '%.*s'", to,
                           BYTES_ARG(q->name));
    rc = map__check_broker_usable(ctx, to, "queue", q->name);
    if (rc != OK)
        return rc;
    if (from != BROKER_ID_NONE && (!map_queue_has_backup(q, from) || map_queue_has_backup(q, to)))
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                           "a backup move of queue '%.*s' goes from one of its backups (%u) to a "
                           "broker that is not one (%u)", BYTES_ARG(q->name), from, to);
    if (!map_queue_has_backup(q, to)) {
        if (q->backups_count == CLUSTER_BACKUPS_MAX)
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                               "queue '%.*s' has %u backups already: move it to one of them",
                               BYTES_ARG(q->name), CLUSTER_BACKUPS_MAX);
        map__queue_count(ctx->map, q, -1);
        q->backup_ids[q->backups_count++] = to;
        map__queue_count(ctx->map, q, +1);
        ctx->change->changed = true;
    }
    ctx->change->changed |= q->move_to != to || q->move_from != from;
    if (q->move_to != to)
        q->move_reason = ctx->change->reason != MAP_REASON_NONE ? ctx->change->reason
                                                                : MAP_REASON_MOVE;
    q->move_to = to;
    q->move_from = from;
    return OK;
}

/* Whether the process of broker id the primary's stream knew (0: not
 * known) is the map's: one that restarted since holds nothing of it. */
static bool same_process(const struct cluster_map *map, uint32_t id, uint32_t incarnation)
{
    const struct map_broker *b = cluster_map_broker(map, id);
    return incarnation == 0 || b == NULL || b->incarnation == incarnation;
}

/* The primary's whole wanted set. A backup it names with the incarnation
 * its stream knew, which the map has replaced since (broker.incarnation
 * came first: the request was on its way), is left out: what the stream
 * caught up died with that process. (Without this a request sent before
 * the restart was heard put the new, empty process back in sync.) */
int map__op_queue_set_in_sync(struct apply_ctx *ctx)
{
    uint32_t ids[CLUSTER_BACKUPS_MAX], incarnations[CLUSTER_BACKUPS_MAX];
    uint8_t n = map__read_ids(&ctx->reader, "in_sync", ids);
    uint8_t known = map__read_incarnations(&ctx->reader, "in_sync_incarnations", incarnations);
    if (known != 0 && known != n)
        map__reader_fail(&ctx->reader, "in_sync_incarnations");
    bool partial = map__read_bool(&ctx->reader, "partial", true);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    /* Asked before a policy change made the queue replicate everything
     * (which dropped such backups from the set: map_apply.c partial_drop),
     * and applied after it: a backup with the transient messages only
     * would be in sync again. The primary asks anew, its streams caught up
     * in full first. */
    if (partial && n > 0 && !map_queue_replicates_transient_only(ctx->map, q))
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                           "queue '%.*s' replicates everything now: a backup holding its "
                           "transient messages only cannot be in sync", BYTES_ARG(q->name));
    uint8_t mask = 0;
    for (uint8_t i = 0; i < n; i++) {
        int slot = map__backup_slot(q, ids[i]);
        if (slot < 0)
            return map__refuse(ctx, REPLY_PRECONDITION_FAILED, true,
                               "broker %u is not a backup of queue '%.*s'", ids[i],
                               BYTES_ARG(q->name));
        if (known == 0 || same_process(ctx->map, ids[i], incarnations[i]))
            mask |= (uint8_t)(1u << slot);
    }
    ctx->change->changed = mask != q->in_sync_mask;
    q->in_sync_mask = mask;
    return OK;
}

int map__op_queue_set_available(struct apply_ctx *ctx)
{
    bool available = map__read_bool(&ctx->reader, "available", false);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    if (q->available == available)
        return OK;
    if (available) {
        rc = map__check_broker_usable(ctx, q->primary_id, "queue", q->name);
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

/* A new taker: the sources the map names move down the chain (the oldest
 * beyond CLUSTER_BACKUPS_MAX older ones is forgotten: its log, if anyone
 * still holds it staged, is then read in no known order, durable_adopt.c),
 * or the chain ends when the dead primary had said queue.adopted. */
static void take_chain_push(struct map_queue *q)
{
    if (q->adopted || q->taken_from == BROKER_ID_NONE) {
        q->taken_from_before = BROKER_ID_NONE;
        q->taken_older_count = 0;
        return;
    }
    if (q->taken_from_before != BROKER_ID_NONE) {
        uint8_t n = q->taken_older_count < CLUSTER_BACKUPS_MAX ? q->taken_older_count
                                                              : CLUSTER_BACKUPS_MAX - 1;
        memmove(&q->taken_older[1], &q->taken_older[0], n * sizeof q->taken_older[0]);
        q->taken_older[0] = q->taken_from_before;
        q->taken_older_count = (uint8_t)(n + 1);
    }
    q->taken_from_before = q->taken_from;
}

/* The dead primary's log is adopted from shared storage by the new one
 * (queue.take_over): only a durable queue, from a broker that is down, to
 * one that is up, shares its storage and is not a backup (its replica
 * would hold a second copy of what the log gives back). Or, with the
 * replica, to an in-sync backup; then also from a primary that restarted
 * before the map saw it down and asks it itself ("restarted": it closes
 * its log without a write as the change reaches it). */
int map__op_queue_take_over(struct apply_ctx *ctx)
{
    uint32_t primary = map__read_broker_id(&ctx->reader, "primary");
    uint32_t from = map__read_broker_id(&ctx->reader, "from");
    bool with_replica = map__read_bool(&ctx->reader, "replica", true);
    bool restarted = map__read_bool(&ctx->reader, "restarted", true);
    int rc;
    struct map_queue *q = find_queue_cas(ctx, true, &rc);
    if (q == NULL)
        return rc;
    rc = map__check_broker_usable(ctx, primary, "queue", q->name);
    if (rc != OK)
        return rc;
    const struct map_broker *dead = cluster_map_broker(ctx->map, from);
    if (q->primary_id != from ||
        (dead->state != BROKER_STATE_DOWN && !(restarted && with_replica)))
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, true,
                           "queue '%.*s' is not owned by broker %u, down", BYTES_ARG(q->name),
                           from);
    /* With its replica: an in-sync backup of a queue that replicates its
     * transient messages only (the log has the persistent ones). */
    int slot = map__backup_slot(q, primary);
    bool backup_ok = with_replica ? slot >= 0 && (q->in_sync_mask & (1u << slot)) != 0 &&
                                        map_queue_replicates_transient_only(ctx->map, q)
                                  : slot < 0;
    if (!q->durable || q->exclusive || !backup_ok ||
        !map_brokers_share_storage(dead, cluster_map_broker(ctx->map, primary)))
        return map__refuse(ctx, REPLY_PRECONDITION_FAILED, false,
                           "broker %u cannot take queue '%.*s' over from broker %u", primary,
                           BYTES_ARG(q->name), from);
    struct cluster_map *map = ctx->map;
    map__queue_count(map, q, -1);
    memset(q->backup_ids, 0, sizeof(q->backup_ids)); /* none in sync: see controller.h */
    q->backups_count = 0;
    q->in_sync_mask = 0;
    q->primary_id = primary;
    q->epoch++;
    q->owned_since = map->version;
    q->available = true;
    q->move_to = BROKER_ID_NONE;
    q->move_from = BROKER_ID_NONE;
    /* (NONE unless from took it over itself and never said it adopted;
     * then the chain before it moves down one: taken_older.) */
    take_chain_push(q);
    q->taken_from = from;
    q->adopted = false;
    map__queue_count(map, q, +1);
    ctx->change->changed = true;
    ctx->change->with_replica = with_replica;
    return OK;
}

int map__op_queue_adopted(struct apply_ctx *ctx)
{
    uint32_t primary = map__read_broker_id(&ctx->reader, "primary");
    int rc;
    struct map_queue *q = find_queue_cas(ctx, false, &rc);
    if (q == NULL || q->primary_id != primary || q->taken_from == BROKER_ID_NONE ||
        q->adopted)
        return rc; /* gone, or moved on, or said already: no change */
    q->adopted = true;
    ctx->change->changed = true;
    return OK;
}
