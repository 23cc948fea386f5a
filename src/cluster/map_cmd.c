/*
 * map_cmd.c: building map commands (map.h's map_cmd_*()): each one a field
 * table, encoded into a heap buffer that grows until it fits. Builders do
 * not validate beyond their own preconditions: apply (map_apply.c)
 * decides. The encoders of the commands that create objects also write a
 * snapshot's elements (map_snapshot.c).
 *
 * Pure: no I/O, no clock, no randomness.
 */
#include "cluster/map.h"
#include "cluster/map_int.h"

#include <stdlib.h>
#include <string.h>

#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"

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
        list->items = xrealloc(list->items, (size_t)list->cap * sizeof(list->items[0]));
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
        uint8_t *buf = xmalloc(cap);
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

int map_cmd_set_reason(struct map_cmd *cmd, enum map_reason reason)
{
    uint8_t field[64];
    struct table_writer w;
    table_writer_init(&w, field, sizeof field);
    table_put_longstr(&w, "reason", bytes_of_cstr(map_reason_name(reason)));
    ASSERT(!w.overflow);
    if (cmd->size + w.len > CLUSTER_CMD_SIZE_MAX)
        return E_LIMIT;
    /* A command is a table's fields, end to end: one more is appended. */
    uint8_t *grown = xrealloc(cmd->bytes, cmd->size + w.len);
    memcpy(grown + cmd->size, field, w.len);
    cmd->bytes = grown;
    cmd->size += w.len;
    DEBUG_ASSERT(table_validate(cmd->bytes, (uint32_t)cmd->size) == OK);
    return OK;
}

void map_cmd_list_set_reason(struct map_cmd_list *list, uint32_t from, enum map_reason reason)
{
    for (uint32_t i = from; i < list->count; i++)
        (void)map_cmd_set_reason(&list->items[i], reason); /* too big: logged without */
}

static void put_op(struct table_writer *w, enum map_op op)
{
    table_put_longstr(w, "op", bytes_of_cstr(map_op_name(op)));
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
    const char *bool2_key; /* and another (true) */
    const char *ids_key; /* an extra id array */
    const uint32_t *ids;
    uint8_t ids_count;
    const char *ids2_key; /* and one beside it, of as many integers */
    const uint32_t *ids2;
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
    if (s->bool2_key)
        table_put_bool(w, s->bool2_key, true);
    if (s->ids_key)
        put_ids(w, s->ids_key, s->ids, s->ids_count);
    if (s->ids2_key)
        put_ids(w, s->ids2_key, s->ids2, s->ids_count);
}

void map__encode_join(struct table_writer *w, const void *arg)
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
    uint32_t incarnation = a->broker ? a->broker->incarnation : a->incarnation;
    if (incarnation != 0)
        table_put_int(w, "incarnation", incarnation);
}

int map_cmd_broker_join(struct map_cmd *out, uint32_t id, struct bytes name,
                        struct bytes amqp_address, struct bytes cluster_address, bool voter,
                        uint32_t incarnation)
{
    ASSERT(id != BROKER_ID_NONE);
    struct join_args a = {id, name, amqp_address, cluster_address, voter, incarnation, NULL};
    return build(out, map__encode_join, &a);
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

int map_cmd_broker_state_why(struct map_cmd *out, uint32_t id, enum broker_state state,
                             enum map_reason reason, uint64_t silence_ms)
{
    ASSERT(id != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_BROKER_STATE, .id = id, .str_key = "state",
                           .str_value = bytes_of_cstr(broker_state_name(state))};
    if (silence_ms > 0) {
        s.int_key = "silence_ms";
        s.int_value = silence_ms < UINT32_MAX ? silence_ms : UINT32_MAX;
    }
    int rc = build(out, encode_simple, &s);
    if (rc == OK && reason != MAP_REASON_NONE)
        rc = map_cmd_set_reason(out, reason); /* small: fits */
    return rc;
}

int map_cmd_broker_incarnation(struct map_cmd *out, uint32_t id, uint32_t incarnation)
{
    ASSERT(id != BROKER_ID_NONE);
    ASSERT(incarnation != 0);
    struct simple_cmd s = {.op = MAP_OP_BROKER_INCARNATION, .id = id,
                           .int_key = "incarnation", .int_value = incarnation};
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
                table_put_longstr(w, map__permission_keys[k], u->permissions[3 * i + (uint32_t)k]);
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
void map__encode_map_user(struct table_writer *w, const struct map_user *u)
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
        table_put_longstr(w, map__permission_keys[k], a->regexes[k]);
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
        map__encode_map_user(w, a->users[i]);
    table_put_array_end(w, mark);
}

int map_cmd_users_bootstrap(struct map_cmd *out, const struct map_user *const *users,
                            uint32_t count)
{
    struct bootstrap_args a = {users, count};
    return build(out, encode_bootstrap, &a);
}

struct import_args {
    const struct map_import_user *users;
    const struct bytes *vhosts;
    const struct map_import_permission *permissions;
    uint32_t users_count, vhosts_count, permissions_count;
};

static void encode_import(struct table_writer *w, const void *arg)
{
    const struct import_args *a = arg;
    put_op(w, MAP_OP_USERS_IMPORT);
    size_t mark = table_put_array_begin(w, "users");
    for (uint32_t i = 0; i < a->users_count; i++) {
        const struct map_import_user *u = &a->users[i];
        size_t t = table_array_put_table_begin(w);
        table_put_longstr(w, "name", u->name);
        table_put_longstr(w, "password_hash", u->password_hash);
        put_str_list(w, "tags", u->tags, u->tags_count);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, mark);
    mark = table_put_array_begin(w, "vhosts");
    for (uint32_t i = 0; i < a->vhosts_count; i++)
        table_array_put_longstr(w, a->vhosts[i]);
    table_put_array_end(w, mark);
    mark = table_put_array_begin(w, "permissions");
    for (uint32_t i = 0; i < a->permissions_count; i++) {
        const struct map_import_permission *p = &a->permissions[i];
        size_t t = table_array_put_table_begin(w);
        table_put_longstr(w, "user", p->user);
        table_put_longstr(w, "vhost", p->vhost);
        for (int k = 0; k < 3; k++)
            table_put_longstr(w, map__permission_keys[k], p->regexes[k]);
        table_put_table_end(w, t);
    }
    table_put_array_end(w, mark);
}

int map_cmd_users_import(struct map_cmd *out, const struct map_import_user *users,
                         uint32_t users_count, const struct bytes *vhosts, uint32_t vhosts_count,
                         const struct map_import_permission *permissions,
                         uint32_t permissions_count)
{
    struct import_args a = {users, vhosts, permissions, users_count, vhosts_count,
                            permissions_count};
    return build(out, encode_import, &a);
}

void map__encode_exchange(struct table_writer *w, const void *arg)
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
    return build(out, map__encode_exchange, &a);
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

void map__encode_binding(struct table_writer *w, const void *arg)
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
    return build(out, map__encode_binding, &a);
}

int map_cmd_unbind(struct map_cmd *out, const struct map_binding_decl *decl)
{
    struct binding_args a = {MAP_OP_UNBIND, decl};
    return build(out, map__encode_binding, &a);
}

void map__encode_queue(struct table_writer *w, const void *arg)
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
    if (q->taken_older_count > 0) /* (else as before the chain was kept) */
        put_ids(w, "taken_older", q->taken_older, q->taken_older_count);
    if (q->adopted)
        table_put_bool(w, "adopted", true);
}

int map_cmd_queue_declare(struct map_cmd *out, const struct map_queue_decl *decl,
                          uint32_t origin_id)
{
    ASSERT(decl->backups_count <= CLUSTER_BACKUPS_MAX);
    ASSERT(origin_id != BROKER_ID_NONE);
    struct queue_args_enc a = {decl, origin_id, NULL};
    return build(out, map__encode_queue, &a);
}

int map_cmd_queue_delete(struct map_cmd *out, struct bytes vhost, struct bytes name,
                         uint64_t expected_epoch)
{
    struct simple_cmd s = {.op = MAP_OP_QUEUE_DELETE, .vhost = vhost, .name = name,
                           .epoch = expected_epoch};
    return build(out, encode_simple, &s);
}

/* queue.set_owner, and its kinds: flag (NULL: a failover's) is the
 * command's one bool key, set. */
static int set_owner(struct map_cmd *out, struct bytes vhost, struct bytes name,
                     uint64_t expected_epoch, uint32_t primary_id, const char *flag)
{
    ASSERT(expected_epoch != 0);
    ASSERT(primary_id != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_SET_OWNER, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .int_key = "primary",
                           .int_value = primary_id, .bool_key = flag, .bool_value = true};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_set_owner(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            uint64_t expected_epoch, uint32_t primary_id)
{
    return set_owner(out, vhost, name, expected_epoch, primary_id, NULL);
}

int map_cmd_queue_hand_to_backup(struct map_cmd *out, struct bytes vhost, struct bytes name,
                                 uint64_t expected_epoch, uint32_t primary_id)
{
    return set_owner(out, vhost, name, expected_epoch, primary_id, "backup_only");
}

int map_cmd_queue_hand_over(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            uint64_t expected_epoch, uint32_t primary_id)
{
    return set_owner(out, vhost, name, expected_epoch, primary_id, "planned");
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

static int set_in_sync(struct map_cmd *out, struct bytes vhost, struct bytes name,
                       uint64_t expected_epoch, const uint32_t *in_sync_ids,
                       const uint32_t *incarnations, uint8_t in_sync_count, bool partial)
{
    ASSERT(expected_epoch != 0);
    ASSERT(in_sync_count <= CLUSTER_BACKUPS_MAX);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_SET_IN_SYNC, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .ids_key = "in_sync", .ids = in_sync_ids,
                           .ids_count = in_sync_count, .bool2_key = partial ? "partial" : NULL};
    if (incarnations != NULL && in_sync_count > 0) {
        s.ids2_key = "in_sync_incarnations";
        s.ids2 = incarnations;
    }
    return build(out, encode_simple, &s);
}

int map_cmd_queue_set_in_sync(struct map_cmd *out, struct bytes vhost, struct bytes name,
                              uint64_t expected_epoch, const uint32_t *in_sync_ids,
                              const uint32_t *incarnations, uint8_t in_sync_count)
{
    return set_in_sync(out, vhost, name, expected_epoch, in_sync_ids, incarnations,
                       in_sync_count, false);
}

int map_cmd_queue_set_in_sync_partial(struct map_cmd *out, struct bytes vhost,
                                      struct bytes name, uint64_t expected_epoch,
                                      const uint32_t *in_sync_ids, const uint32_t *incarnations,
                                      uint8_t in_sync_count)
{
    return set_in_sync(out, vhost, name, expected_epoch, in_sync_ids, incarnations,
                       in_sync_count, true);
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

void map__encode_policy(struct table_writer *w, const void *arg)
{
    const struct policy_args *a = arg;
    if (a->with_op)
        put_op(w, MAP_OP_POLICY_PUT);
    table_put_longstr(w, "vhost", a->decl->vhost);
    table_put_longstr(w, "name", a->decl->name);
    table_put_longstr(w, "pattern", a->decl->pattern);
    table_put_int(w, "priority", a->decl->priority);
    table_put_int(w, "backups", a->decl->backups);
    if (a->decl->replicate != POLICY_REPLICATE_UNSET) /* (else as before the key) */
        table_put_int(w, "replicate", a->decl->replicate);
}

int map_cmd_policy_put(struct map_cmd *out, const struct policy_decl *decl)
{
    struct policy_args a = {true, decl};
    return build(out, map__encode_policy, &a);
}

int map_cmd_policy_delete(struct map_cmd *out, struct bytes vhost, struct bytes name)
{
    struct simple_cmd s = {.op = MAP_OP_POLICY_DELETE, .vhost = vhost, .name = name};
    return build(out, encode_simple, &s);
}

void map__encode_limit(struct table_writer *w, const void *arg)
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
    return build(out, map__encode_limit, &a);
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

static int take_over_with_replica(struct map_cmd *out, struct bytes vhost, struct bytes name,
                                  uint64_t expected_epoch, uint32_t primary_id, uint32_t from,
                                  bool restarted)
{
    ASSERT(expected_epoch != 0);
    ASSERT(primary_id != BROKER_ID_NONE && from != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_TAKE_OVER, .vhost = vhost, .name = name,
                           .epoch = expected_epoch, .int_key = "primary",
                           .int_value = primary_id, .int2_key = "from", .int2_value = from,
                           .bool_key = "replica", .bool_value = true,
                           .bool2_key = restarted ? "restarted" : NULL};
    return build(out, encode_simple, &s);
}

int map_cmd_queue_take_over_with_replica(struct map_cmd *out, struct bytes vhost,
                                         struct bytes name, uint64_t expected_epoch,
                                         uint32_t primary_id, uint32_t from)
{
    return take_over_with_replica(out, vhost, name, expected_epoch, primary_id, from, false);
}

int map_cmd_queue_hand_to_backup_with_log(struct map_cmd *out, struct bytes vhost,
                                          struct bytes name, uint64_t expected_epoch,
                                          uint32_t primary_id, uint32_t self_id)
{
    return take_over_with_replica(out, vhost, name, expected_epoch, primary_id, self_id, true);
}

int map_cmd_queue_adopted(struct map_cmd *out, struct bytes vhost, struct bytes name,
                          uint32_t primary_id)
{
    ASSERT(primary_id != BROKER_ID_NONE);
    struct simple_cmd s = {.op = MAP_OP_QUEUE_ADOPTED, .vhost = vhost, .name = name,
                           .int_key = "primary", .int_value = primary_id};
    return build(out, encode_simple, &s);
}
