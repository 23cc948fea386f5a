/*
 * durable.c: see durable.h. Definitions are journal key/value records:
 *
 *   kind      key                                   value (field table)
 *   EXCHANGE  vhost "\0" name                        type, auto_delete, internal, arguments
 *   QUEUE     vhost "\0" name                        auto_delete, arguments; replica:
 *                                                   a backup's log (durable_replica_log_open)
 *   BINDING   table: vhost, source, dest_kind,        (empty)
 *             destination, routing_key, arguments
 *   VHOST     name                                  (empty table)
 *   USER      name                                  password_hash (base64), tags,
 *                                                   loopback, any_vhost
 *   USER      "" (no user has an empty name)        (empty): the users are here
 *   PERMISSION user "\0" vhost                      configure, write, read
 *
 * A binding is durable when both its ends are (RabbitMQ); deleting a queue
 * or exchange undefines its bindings first, so a later queue of the same
 * name does not inherit them.
 */
#include "broker/durable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/table.h"
#include "broker/broker.h"
#include "broker/channel_int.h"
#include "broker/exchange.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "store/journal.h"

#define KEY_MAX (2 * 256 + 2)

/* ---- encoding ------------------------------------------------------- */

static struct bytes name_key(uint8_t *buf, struct bytes vhost, struct bytes name)
{
    ASSERT(vhost.len <= 255 && name.len <= 255);
    memcpy(buf, vhost.ptr, vhost.len);
    buf[vhost.len] = 0;
    memcpy(buf + vhost.len + 1, name.ptr, name.len);
    return (struct bytes){buf, vhost.len + 1 + name.len};
}

static bool split_key(struct bytes key, struct bytes *vhost, struct bytes *name)
{
    const uint8_t *zero = memchr(key.ptr, 0, key.len);
    if (!zero)
        return false;
    *vhost = (struct bytes){key.ptr, (uint32_t)(zero - key.ptr)};
    *name = (struct bytes){zero + 1, (uint32_t)(key.len - vhost->len - 1)};
    return true;
}

static struct bytes binding_key(struct table_writer *w, struct vhost *vhost,
                                const struct binding *binding)
{
    struct exchange *source = binding->source;
    bool to_queue = binding->dest->kind == BIND_DEST_QUEUE;
    struct bytes dest = to_queue ? CONTAINER_OF(binding->dest, struct queue, as_dest)->name
                                 : CONTAINER_OF(binding->dest, struct exchange, as_dest)->name;
    table_put_longstr(w, "vhost", vhost->name);
    table_put_longstr(w, "source", source->name);
    table_put_longstr(w, "dest_kind", to_queue ? BYTES_LIT("queue") : BYTES_LIT("exchange"));
    table_put_longstr(w, "destination", dest);
    table_put_longstr(w, "routing_key", binding->routing_key);
    table_put_longstr(w, "arguments", binding->arguments);
    ASSERT(!w->overflow);
    struct table t = table_writer_table(w);
    return (struct bytes){t.ptr, t.len};
}

static bool binding_durable(const struct binding *binding)
{
    if (!binding->source->durable)
        return false;
    if (binding->dest->kind == BIND_DEST_QUEUE) {
        const struct queue *q = CONTAINER_OF(binding->dest, struct queue, as_dest);
        return q->durable && !q->exclusive && !queue_is_remote(q);
    }
    return CONTAINER_OF(binding->dest, struct exchange, as_dest)->durable;
}

/* Attaches a durable queue to its log; new seqs continue after the log's
 * last one even when every message in it was acked. */
static void attach_log(struct durable *d, struct vhost *vhost, struct queue *queue)
{
    queue->journal = journal_queue_open(d->journal, vhost->name, queue->name);
    uint64_t last = journal_queue_seq_last(queue->journal);
    if (queue->next_seq <= last)
        queue->next_seq = last + 1;
}

static bool queue_durable(const struct queue *queue)
{
    /* An exclusive queue dies with its connection, so it never outlives a
     * restart even when declared durable. */
    return queue->durable && !queue->exclusive && !queue_is_remote(queue);
}

/* ---- hooks ---------------------------------------------------------- */

static struct durable *active(struct broker *broker)
{
    struct durable *d = &broker->durable;
    return d->journal && !d->replaying ? d : NULL;
}

void durable_exchange_declared(struct broker *broker, struct vhost *vhost,
                               struct exchange *exchange)
{
    struct durable *d = active(broker);
    if (!d || !exchange->durable || bytes_has_prefix(exchange->name, "amq.") ||
        exchange->name.len == 0)
        return;
    uint8_t key[KEY_MAX];
    uint8_t value[1024 + 65536];
    struct table_writer w;
    table_writer_init(&w, value, sizeof value);
    table_put_longstr(&w, "type", bytes_of_cstr(exchange_type_name(exchange->type)));
    table_put_bool(&w, "auto_delete", exchange->auto_delete);
    table_put_bool(&w, "internal", exchange->internal);
    table_put_longstr(&w, "arguments", exchange->arguments);
    if (w.overflow) {
        LOG_WARN("exchange '%.*s': arguments too large to keep durably",
                 (int)exchange->name.len, (const char *)exchange->name.ptr);
        return;
    }
    struct table t = table_writer_table(&w);
    journal_define(d->journal, JOURNAL_DEF_EXCHANGE, name_key(key, vhost->name, exchange->name),
                   (struct bytes){t.ptr, t.len});
}

static void undefine_bindings_in(struct vhost *vhost, struct bind_dest *dest)
{
    list_for_each(node, &dest->bindings_in) {
        struct binding *binding = CONTAINER_OF(node, struct binding, dest_link);
        durable_binding_removed(vhost->broker, vhost, binding);
    }
}

void durable_exchange_deleted(struct broker *broker, struct vhost *vhost,
                              struct exchange *exchange)
{
    struct durable *d = active(broker);
    if (!d || !exchange->durable)
        return;
    list_for_each(node, &exchange->bindings) {
        struct binding *binding = CONTAINER_OF(node, struct binding, source_link);
        durable_binding_removed(broker, vhost, binding);
    }
    undefine_bindings_in(vhost, &exchange->as_dest);
    uint8_t key[KEY_MAX];
    journal_undefine(d->journal, JOURNAL_DEF_EXCHANGE, name_key(key, vhost->name, exchange->name));
}

/* The value of a QUEUE definition: the queue's, or its backup's log's. */
static struct table queue_value(struct table_writer *w, uint8_t *buf, size_t size,
                                const struct queue *queue, bool replica)
{
    table_writer_init(w, buf, size);
    table_put_bool(w, "auto_delete", queue->auto_delete);
    table_put_longstr(w, "arguments", queue->arguments);
    if (replica)
        table_put_bool(w, "replica", true);
    ASSERT(!w->overflow); /* arguments come from one frame: < frame_max */
    return table_writer_table(w);
}

void durable_queue_declared(struct broker *broker, struct vhost *vhost, struct queue *queue)
{
    struct durable *d = &broker->durable;
    if (!d->journal || !queue_durable(queue))
        return;
    if (d->replaying)
        return; /* durable_open attaches the log once messages are recovered */
    attach_log(d, vhost, queue);
    uint8_t key[KEY_MAX];
    uint8_t value[1024 + 65536];
    struct table_writer w;
    struct table t = queue_value(&w, value, sizeof value, queue, false);
    journal_define(d->journal, JOURNAL_DEF_QUEUE, name_key(key, vhost->name, queue->name),
                   (struct bytes){t.ptr, t.len});
}

struct journal_queue *durable_replica_log_open(struct broker *broker, struct queue *stand_in)
{
    struct durable *d = &broker->durable;
    if (!d->journal || !stand_in->durable || stand_in->exclusive)
        return NULL;
    uint8_t key[KEY_MAX];
    uint8_t value[1024 + 65536];
    struct table_writer w;
    struct table t = queue_value(&w, value, sizeof value, stand_in, true);
    struct bytes vhost = stand_in->vhost->name;
    journal_define(d->journal, JOURNAL_DEF_QUEUE, name_key(key, vhost, stand_in->name),
                   (struct bytes){t.ptr, t.len});
    return journal_queue_open(d->journal, vhost, stand_in->name);
}

void durable_replica_log_deleted(struct broker *broker, struct queue *stand_in)
{
    struct durable *d = active(broker);
    if (!d)
        return;
    uint8_t key[KEY_MAX];
    journal_undefine(d->journal, JOURNAL_DEF_QUEUE,
                     name_key(key, stand_in->vhost->name, stand_in->name));
}

void durable_queue_deleted(struct broker *broker, struct vhost *vhost, struct queue *queue)
{
    struct durable *d = active(broker);
    if (!d || !queue_durable(queue))
        return;
    undefine_bindings_in(vhost, &queue->as_dest);
    uint8_t key[KEY_MAX];
    /* A log left to a taker (durable_abandon_log) keeps its queue defined
     * here: a restart before the taker renamed it away must reopen it, not
     * delete it as a deleted queue's (journal_queue_delete_unopened). That
     * restart holds it, and its sync gives it up again, or undefines it
     * once nobody reads it (the taker renamed it: we reopen an empty one). */
    if (!queue->log_left)
        journal_undefine(d->journal, JOURNAL_DEF_QUEUE, name_key(key, vhost->name, queue->name));
    if (queue->journal) {
        journal_queue_delete(queue->journal);
        queue->journal = NULL;
    }
}

void durable_binding_added(struct broker *broker, struct vhost *vhost, struct binding *binding)
{
    struct durable *d = active(broker);
    if (!d || !binding_durable(binding))
        return;
    uint8_t buf[4 * 512 + 65536];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    struct bytes key = binding_key(&w, vhost, binding);
    journal_define(d->journal, JOURNAL_DEF_BINDING, key, (struct bytes){NULL, 0});
}

void durable_binding_removed(struct broker *broker, struct vhost *vhost,
                             struct binding *binding)
{
    struct durable *d = active(broker);
    if (!d || !binding_durable(binding))
        return;
    uint8_t buf[4 * 512 + 65536];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    journal_undefine(d->journal, JOURNAL_DEF_BINDING, binding_key(&w, vhost, binding));
}

/* ---- paging --------------------------------------------------------- */

void durable_policy_put(struct broker *broker, const struct policy *policy)
{
    struct durable *d = active(broker);
    if (!d)
        return;
    uint8_t key[KEY_MAX];
    uint8_t value[512];
    struct table_writer w;
    table_writer_init(&w, value, sizeof value);
    table_put_longstr(&w, "pattern", policy->pattern);
    table_put_int(&w, "priority", policy->priority);
    table_put_int(&w, "backups", policy->backups);
    if (policy->replicate != POLICY_REPLICATE_UNSET)
        table_put_int(&w, "replicate", policy->replicate);
    ASSERT(!w.overflow); /* a pattern is at most 255 bytes */
    struct table t = table_writer_table(&w);
    journal_define(d->journal, JOURNAL_DEF_POLICY, name_key(key, policy->vhost, policy->name),
                   (struct bytes){t.ptr, t.len});
}

void durable_policy_deleted(struct broker *broker, struct bytes vhost, struct bytes name)
{
    struct durable *d = active(broker);
    if (!d)
        return;
    uint8_t key[KEY_MAX];
    journal_undefine(d->journal, JOURNAL_DEF_POLICY, name_key(key, vhost, name));
}

static struct bytes limit_key(uint8_t *buf, int scope, struct bytes name, int kind)
{
    ASSERT(name.len >= 1 && name.len <= LIMIT_NAME_SIZE_MAX);
    buf[0] = (uint8_t)scope;
    buf[1] = (uint8_t)kind;
    memcpy(buf + 2, name.ptr, name.len);
    return (struct bytes){buf, name.len + 2};
}

void durable_limit_put(struct broker *broker, int scope, struct bytes name, int kind,
                       int64_t value)
{
    struct durable *d = active(broker);
    if (!d)
        return;
    uint8_t key[KEY_MAX];
    uint8_t buf[64];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_int(&w, "value", value);
    ASSERT(!w.overflow);
    struct table t = table_writer_table(&w);
    journal_define(d->journal, JOURNAL_DEF_LIMIT, limit_key(key, scope, name, kind),
                   (struct bytes){t.ptr, t.len});
}

void durable_limit_deleted(struct broker *broker, int scope, struct bytes name, int kind)
{
    struct durable *d = active(broker);
    if (!d)
        return;
    uint8_t key[KEY_MAX];
    journal_undefine(d->journal, JOURNAL_DEF_LIMIT, limit_key(key, scope, name, kind));
}

void durable_vhost_put(struct broker *broker, struct bytes name)
{
    struct durable *d = active(broker);
    if (d)
        journal_define(d->journal, JOURNAL_DEF_VHOST, name, (struct bytes){NULL, 0});
}

void durable_vhost_deleted(struct broker *broker, struct bytes name)
{
    struct durable *d = active(broker);
    if (d)
        journal_undefine(d->journal, JOURNAL_DEF_VHOST, name);
}

void durable_user_put(struct broker *broker, const struct auth_user *user)
{
    struct durable *d = active(broker);
    if (!d)
        return;
    if (!d->users_recorded) {
        journal_define(d->journal, JOURNAL_DEF_USER, (struct bytes){NULL, 0},
                       (struct bytes){NULL, 0});
        d->users_recorded = true;
    }
    char hash[PASSWORD_TEXT_MAX + 1];
    auth_user_hash_text(user, hash);
    uint8_t value[512];
    struct table_writer w;
    table_writer_init(&w, value, sizeof value);
    table_put_longstr(&w, "password_hash", bytes_of_cstr(hash));
    table_put_int(&w, "tags", user->tags);
    table_put_bool(&w, "loopback", user->loopback_only);
    table_put_bool(&w, "any_vhost", user->any_vhost);
    ASSERT(!w.overflow);
    struct table t = table_writer_table(&w);
    journal_define(d->journal, JOURNAL_DEF_USER, bytes_of_cstr(user->name),
                   (struct bytes){t.ptr, t.len});
}

void durable_user_deleted(struct broker *broker, struct bytes name)
{
    struct durable *d = active(broker);
    if (d)
        journal_undefine(d->journal, JOURNAL_DEF_USER, name);
}

void durable_permission_put(struct broker *broker, const struct auth_user *user,
                            const struct auth_permission *permission)
{
    struct durable *d = active(broker);
    if (!d)
        return;
    uint8_t key[KEY_MAX];
    uint8_t value[1024];
    struct table_writer w;
    table_writer_init(&w, value, sizeof value);
    static const char *const keys[AUTH_PERMISSION_KIND_COUNT] = {"configure", "write", "read"};
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++)
        table_put_longstr(&w, keys[kind], bytes_of_cstr(permission->texts[kind]));
    ASSERT(!w.overflow); /* each regex is at most 255 bytes (users.c) */
    struct table t = table_writer_table(&w);
    journal_define(d->journal, JOURNAL_DEF_PERMISSION,
                   name_key(key, bytes_of_cstr(user->name), bytes_of_cstr(permission->vhost)),
                   (struct bytes){t.ptr, t.len});
}

void durable_permission_deleted(struct broker *broker, struct bytes user, struct bytes vhost)
{
    struct durable *d = active(broker);
    if (!d)
        return;
    uint8_t key[KEY_MAX];
    journal_undefine(d->journal, JOURNAL_DEF_PERMISSION, name_key(key, user, vhost));
}

uint64_t durable_page_out(struct broker *broker, uint64_t wanted)
{
    uint64_t released = 0;
    struct hmap_entry *ve;
    for (uint32_t i = 0; released < wanted && hmap_next(&broker->vhosts, &i, &ve);) {
        struct hmap_entry *qe;
        struct vhost *vhost = ve->value;
        for (uint32_t k = 0; released < wanted && hmap_next(&vhost->queues, &k, &qe);) {
            struct queue *queue = qe->value;
            if (queue->journal && queue->ready_count > queue->paged_count)
                released += queue_page_out(queue, wanted - released);
        }
    }
    return released;
}

/* ---- confirms ------------------------------------------------------- */

bool durable_failed(const struct broker *broker)
{
    const struct durable *d = &broker->durable;
    return d->status < 0 || (d->journal != NULL && journal_status(d->journal) != OK);
}

uint64_t durable_synced_ticket(const struct broker *broker)
{
    return broker->durable.synced_ticket;
}

void durable_wait_for_sync(struct broker *broker, struct list_node *channel_link)
{
    if (!list_linked(channel_link))
        list_push_back(&broker->durable.confirm_waiters, channel_link);
}

static void on_synced(void *ctx, uint64_t ticket, int status)
{
    struct broker *broker = ctx;
    struct durable *d = &broker->durable;
    if (status < 0 && d->status == 0) {
        d->status = status;
        LOG_ERROR("journal failed (%s, %d): publishes waiting for the disk are nacked",
                  error_name(status), status);
    }
    if (ticket > d->synced_ticket)
        d->synced_ticket = ticket;
    /* Before any confirm: while a staged copy exists, nothing published
     * to the queue after its adoption has been confirmed. */
    if (status == 0)
        durable__adopted_synced(broker, ticket);
    list_for_each_safe(node, &d->confirm_waiters) {
        struct channel *ch = CONTAINER_OF(node, struct channel, durable_link);
        channel__journal_synced(ch, ticket, status);
    }
}

/* ---- recovery ------------------------------------------------------- */

struct replay {
    struct broker *broker;
    uint64_t vhosts; /* VHOST records: none in a journal from before them */
    uint64_t users;
    uint64_t exchanges;
    uint64_t queues;
    uint64_t bindings;
    uint64_t messages;
    uint64_t dropped;
    struct durable_reading reading;
    /* Replicas' QUEUE keys to undefine once journal_recover_definitions
     * returns (it walks the entries an undefine frees). Owned, each one. */
    struct bytes *undefine;
    size_t undefine_count;
};

static void undefine_later(struct replay *r, struct bytes key)
{
    r->undefine = xrealloc(r->undefine, (r->undefine_count + 1) * sizeof(*r->undefine));
    uint8_t *copy = xmalloc(key.len);
    memcpy(copy, key.ptr, key.len);
    r->undefine[r->undefine_count++] = (struct bytes){copy, key.len};
}

static void undefine_collected(struct replay *r)
{
    for (size_t i = 0; i < r->undefine_count; i++) {
        journal_undefine(r->broker->durable.journal, JOURNAL_DEF_QUEUE, r->undefine[i]);
        free((void *)r->undefine[i].ptr);
    }
    free(r->undefine);
    r->undefine = NULL;
    r->undefine_count = 0;
}

static bool get_str(struct table t, const char *key, struct bytes *out)
{
    struct field_value v;
    if (!table_get(t, key, &v) || v.kind != 'S')
        return false;
    *out = v.str;
    return true;
}

static bool get_bool(struct table t, const char *key)
{
    struct field_value v;
    return table_get(t, key, &v) && v.kind == 't' && v.boolean;
}

static void replay_exchange(struct replay *r, struct vhost *vhost, struct bytes name,
                            struct table value)
{
    struct bytes type_name, args;
    enum exchange_type type;
    if (!get_str(value, "type", &type_name) || exchange_type_parse(type_name, &type) != 0 ||
        !get_str(value, "arguments", &args) || vhost_exchange(vhost, name)) {
        r->dropped++;
        return;
    }
    vhost_exchange_declare(vhost, name, type, true, get_bool(value, "auto_delete"),
                           get_bool(value, "internal"), args);
    r->exchanges++;
}

static void replay_queue(struct replay *r, struct vhost *vhost, struct bytes name,
                         struct table value)
{
    struct bytes args;
    struct queue_args parsed;
    uint16_t code;
    char text[256];
    if (!get_str(value, "arguments", &args) || vhost_queue(vhost, name) ||
        !queue_args_parse((struct table){args.ptr, args.len}, name, vhost->name, &parsed, &code,
                          text, sizeof text)) {
        r->dropped++;
        return;
    }
    bool replica = get_bool(value, "replica");
    if (replica && !r->broker->config.clustered) {
        /* A backup's log, and no cluster to say whose queue it is now:
         * dropped (its log with it: no queue opens it). */
        uint8_t key[KEY_MAX];
        undefine_later(r, name_key(key, vhost->name, name));
        r->dropped++;
        return;
    }
    struct queue *queue = vhost_queue_declare(vhost, name, true, false,
                                              get_bool(value, "auto_delete"), args);
    /* A backup's log comes back as a queue too, held, like every queue a
     * restart recovers, until the cluster's present map says whose it is
     * (cluster/mirror.c): ours if the map promoted us as we died. */
    queue->from_replica_log = replica;
    r->queues++;
}

static void replay_binding(struct replay *r, struct table key)
{
    struct bytes vhost_name, source, kind, destination, routing_key, args;
    if (!get_str(key, "vhost", &vhost_name) || !get_str(key, "source", &source) ||
        !get_str(key, "dest_kind", &kind) || !get_str(key, "destination", &destination) ||
        !get_str(key, "routing_key", &routing_key) || !get_str(key, "arguments", &args)) {
        r->dropped++;
        return;
    }
    struct vhost *vhost = broker_vhost(r->broker, vhost_name);
    struct exchange *x = vhost ? vhost_exchange(vhost, source) : NULL;
    struct bind_dest *dest = NULL;
    if (vhost && bytes_equal_cstr(kind, "queue")) {
        struct queue *q = vhost_queue(vhost, destination);
        dest = q ? &q->as_dest : NULL;
    } else if (vhost) {
        struct exchange *dx = vhost_exchange(vhost, destination);
        dest = dx ? &dx->as_dest : NULL;
    }
    if (!x || !dest) {
        r->dropped++;
        return;
    }
    exchange_bind(x, dest, routing_key, args);
    r->bindings++;
}

static void replay_policy(struct replay *r, struct vhost *vhost, struct bytes name,
                          struct table value)
{
    struct field_value priority, backups;
    int64_t prio = -1, n = -1;
    struct policy_decl d = {.vhost = vhost->name, .name = name};
    if (!get_str(value, "pattern", &d.pattern) || !table_get(value, "priority", &priority) ||
        !field_value_as_int(&priority, &prio) || !table_get(value, "backups", &backups) ||
        !field_value_as_int(&backups, &n) || prio < 0 || prio > POLICY_PRIORITY_MAX || n < 0 ||
        n > POLICY_BACKUPS_MAX) {
        r->dropped++;
        return;
    }
    d.priority = (uint32_t)prio;
    d.backups = (uint8_t)n;
    struct field_value replicate;
    int64_t mode = POLICY_REPLICATE_UNSET;
    if (table_get(value, "replicate", &replicate) &&
        (!field_value_as_int(&replicate, &mode) || mode < 0 ||
         mode > POLICY_REPLICATE_TRANSIENT)) {
        r->dropped++;
        return;
    }
    d.replicate = (uint8_t)mode;
    char err[POLICY_ERROR_SIZE];
    if (policy_decl_check(&d, err, sizeof err) != OK) {
        LOG_WARN("journal: policy '%.*s' dropped: %s", (int)name.len, (const char *)name.ptr,
                 err);
        r->dropped++;
        return;
    }
    policy_set_put(&r->broker->policies, &d);
}

static void replay_user(struct replay *r, struct bytes name, struct table value)
{
    struct bytes hash64;
    struct field_value tags;
    int64_t tag_bits = -1;
    struct password_hash hash;
    if (name.len == 0) {
        r->broker->durable.users_recorded = true;
        return;
    }
    if (name.len > 255 || !get_str(value, "password_hash", &hash64) ||
        password_hash_parse(NULL, (const char *)hash64.ptr, hash64.len, &hash) != 0 ||
        !table_get(value, "tags", &tags) || !field_value_as_int(&tags, &tag_bits) ||
        tag_bits < 0 || tag_bits > 15) {
        r->dropped++;
        return;
    }
    bool created;
    struct auth_user *u =
        auth_user_put(&r->broker->auth, name, &hash, (unsigned)tag_bits, &created);
    u->loopback_only = get_bool(value, "loopback");
    u->any_vhost = get_bool(value, "any_vhost");
    r->users++;
}

static void replay_permission(struct replay *r, struct bytes key, struct table value)
{
    struct bytes user_name, vhost;
    static const char *const keys[AUTH_PERMISSION_KIND_COUNT] = {"configure", "write", "read"};
    char texts[AUTH_PERMISSION_KIND_COUNT][256];
    const char *ptrs[AUTH_PERMISSION_KIND_COUNT];
    struct auth_user *u = NULL;
    if (split_key(key, &user_name, &vhost) && vhost.len > 0)
        u = (struct auth_user *)auth_find_user(&r->broker->auth, user_name);
    for (int kind = 0; u != NULL && kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
        struct bytes text;
        if (!get_str(value, keys[kind], &text) || text.len >= sizeof texts[kind] ||
            memchr(text.ptr, 0, text.len) != NULL) {
            u = NULL;
            break;
        }
        memcpy(texts[kind], text.ptr, text.len);
        texts[kind][text.len] = '\0';
        ptrs[kind] = texts[kind];
    }
    char err[256];
    if (u == NULL || auth_permission_put(u, vhost, ptrs, err, sizeof err) < 0)
        r->dropped++;
}

/* A limit whose vhost or user is gone was deleted with it; one that
 * still names nothing here is dropped. */
static void replay_limit(struct replay *r, struct bytes key, struct bytes value)
{
    struct field_value v;
    int64_t n;
    if (key.len < 3 || key.len > 2 + LIMIT_NAME_SIZE_MAX || key.ptr[0] > LIMIT_SCOPE_USER ||
        key.ptr[1] >= LIMIT_KIND_COUNT ||
        !limit_kind_valid((enum limit_scope)key.ptr[0], (enum limit_kind)key.ptr[1]) ||
        table_validate(value.ptr, value.len) != OK ||
        !table_get((struct table){value.ptr, value.len}, "value", &v) ||
        !field_value_as_int(&v, &n) || n > LIMIT_VALUE_MAX) {
        r->dropped++;
        return;
    }
    struct bytes name = {key.ptr + 2, key.len - 2};
    limit_set_put(&r->broker->limits, (enum limit_scope)key.ptr[0], name,
                  (enum limit_kind)key.ptr[1], n);
}

static void on_definition(void *ctx, enum journal_def_kind kind, struct bytes key,
                          struct bytes value)
{
    struct replay *r = ctx;
    struct table value_table = {value.ptr, value.len};
    if (kind == JOURNAL_DEF_LIMIT) {
        replay_limit(r, key, value);
        return;
    }
    if (kind == JOURNAL_DEF_VHOST) {
        if (key.len == 0 || key.len > 255) {
            r->dropped++;
            return;
        }
        broker_add_vhost(r->broker, key);
        r->vhosts++;
        return;
    }
    if (kind == JOURNAL_DEF_USER || kind == JOURNAL_DEF_PERMISSION) {
        if (table_validate(value.ptr, value.len) != OK) {
            r->dropped++;
        } else if (kind == JOURNAL_DEF_USER) {
            replay_user(r, key, value_table);
        } else {
            replay_permission(r, key, value_table);
        }
        return;
    }
    if (kind == JOURNAL_DEF_BINDING) {
        if (table_validate(key.ptr, key.len) != OK) {
            r->dropped++;
            return;
        }
        replay_binding(r, (struct table){key.ptr, key.len});
        return;
    }
    struct bytes vhost_name = {NULL, 0}, name = {NULL, 0};
    struct vhost *vhost = NULL;
    if (split_key(key, &vhost_name, &name))
        vhost = broker_vhost(r->broker, vhost_name);
    /* A journal from before vhost records: its vhosts were the users
     * file's, and users.c records them once the journal is open. */
    if (!vhost && r->vhosts == 0 && vhost_name.len > 0 && vhost_name.len <= 255)
        vhost = broker_add_vhost(r->broker, vhost_name);
    if (!vhost || table_validate(value.ptr, value.len) != OK) {
        /* A vhost no longer in the users file: its definitions wait. */
        r->dropped++;
        return;
    }
    if (kind == JOURNAL_DEF_POLICY)
        replay_policy(r, vhost, name, value_table);
    else if (kind == JOURNAL_DEF_EXCHANGE)
        replay_exchange(r, vhost, name, value_table);
    else if (kind == JOURNAL_DEF_QUEUE)
        replay_queue(r, vhost, name, value_table);
}

static void on_message(void *ctx, struct journal_queue *jq, struct bytes vhost_name,
                       struct bytes queue_name, uint64_t seq, bool delivered, const void *blob,
                       uint32_t size)
{
    struct replay *r = ctx;
    struct vhost *vhost = broker_vhost(r->broker, vhost_name);
    struct queue *queue = vhost ? vhost_queue(vhost, queue_name) : NULL;
    if (!queue || !queue_durable(queue)) {
        r->dropped++; /* its queue was deleted: delete_unopened removes the log */
        return;
    }
    ASSERT(queue->journal == NULL || queue->journal == jq);
    queue->journal = jq;
    struct message *message = message_from_blob(blob, size);
    if (!message) {
        /* The record's checksum was good, so this is a format bug. */
        LOG_ERROR("queue '%.*s': journal record %llu does not decode; skipped",
                  (int)queue_name.len, (const char *)queue_name.ptr, (unsigned long long)seq);
        r->dropped++;
        return;
    }
    /* A replica's messages are all flagged: the primary may have
     * delivered them (replica_push). */
    queue_recover_message(queue, message, seq, delivered || queue->from_replica_log);
    message_unref(message);
    r->messages++;
    durable__bound_memory_while_reading(r->broker, &r->reading, size);
}

void durable__bound_memory_while_reading(struct broker *broker, struct durable_reading *reading,
                                 uint64_t size)
{
    reading->bytes += size;
    if (++reading->messages % 4096 != 0 && reading->bytes < DURABLE_READING_CHECK_BYTES)
        return;
    reading->bytes = 0;
    if (broker->durable.journal != NULL)
        journal_wait_backlog(broker->durable.journal, DURABLE_READING_BACKLOG_MAX);
    struct alarm *alarm = &broker->alarm;
    uint64_t limit = alarm->memory_high_watermark / 2;
    uint64_t estimate = alarm_memory_estimate(alarm);
    if (alarm->memory_high_watermark && estimate > limit)
        durable_page_out(broker, estimate - limit);
}

int durable_open(struct broker *broker, char *err, size_t err_size)
{
    struct durable *d = &broker->durable;
    memset(d, 0, sizeof *d);
    list_init(&d->confirm_waiters);
    uint64_t started = uv_hrtime();
    const char *dir = broker->config.journal_dir ? broker->config.journal_dir
                                                 : broker->config.data_dir;
    /* On shared storage a taker renames our queue logs away (journal_adopt):
     * the journal checks at every sync that its directories are its own. */
    struct journal_options opts = {.fenced = broker->config.shared_storage_dir != NULL};
    if (journal_open(&d->journal, broker->loop, dir, &opts, err, err_size) != OK) {
        d->journal = NULL;
        return -1;
    }
    journal_set_synced_callback(d->journal, on_synced, broker);
    d->replaying = true;
    struct replay r = {.broker = broker};
    journal_recover_definitions(d->journal, on_definition, &r);
    undefine_collected(&r);
    struct journal_recovery_stats stats;
    memset(&stats, 0, sizeof stats);
    int rc = journal_recover(d->journal, on_message, &r, &stats);
    if (rc != OK) {
        if (rc == E_JOURNAL_CORRUPT)
            snprintf(err, err_size, "journal corrupt at %s offset %llu: refusing to start",
                     stats.corrupt_path, (unsigned long long)stats.corrupt_offset);
        else
            snprintf(err, err_size, "journal recovery failed (%s, %d)", error_name(rc), rc);
        return -1;
    }
    /* Every durable queue gets its log now (the recovered one, or a new
     * one); what nobody opened belonged to queues deleted before a crash. */
    struct hmap_entry *ve;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &ve);) {
        struct vhost *vhost = ve->value;
        struct hmap_entry *qe;
        for (uint32_t k = 0; hmap_next(&vhost->queues, &k, &qe);) {
            struct queue *queue = qe->value;
            if (queue_durable(queue))
                attach_log(d, vhost, queue);
        }
    }
    journal_queue_delete_unopened(d->journal);
    d->replaying = false;
    if (stats.truncated_count)
        LOG_WARN("journal: cut %llu torn tail(s), first in %s at offset %llu",
                 (unsigned long long)stats.truncated_count, stats.truncated_path,
                 (unsigned long long)stats.truncated_offset);
    LOG_INFO("recovered %llu vhosts, %llu users", (unsigned long long)r.vhosts,
             (unsigned long long)r.users);
    LOG_INFO("recovered %llu exchanges, %llu queues, %llu bindings, %llu messages in %.3f s"
             " (%llu records dropped)",
             (unsigned long long)r.exchanges, (unsigned long long)r.queues,
             (unsigned long long)r.bindings, (unsigned long long)r.messages,
             (double)(uv_hrtime() - started) / 1e9, (unsigned long long)r.dropped);
    return 0;
}

void durable_close(struct broker *broker)
{
    struct durable *d = &broker->durable;
    if (!d->journal)
        return;
    /* Queues freed after this must not touch their (closed) logs: a
     * shutdown is not a deletion. */
    struct hmap_entry *ve;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &ve);) {
        struct hmap_entry *qe;
        for (uint32_t k = 0; hmap_next(&((struct vhost *)ve->value)->queues, &k, &qe);) {
            struct queue *queue = qe->value;
            queue->journal = NULL;
            if (queue->remote_ops && queue->remote_ops->journal_closing)
                queue->remote_ops->journal_closing(queue); /* a backup's log */
        }
    }
    journal_close(d->journal);
    d->journal = NULL;
    durable__adopted_free(broker);
}
