/*
 * channel_declare.c: the exchange and queue classes on a channel:
 * declare (with RabbitMQ's equivalence checks), delete, bind, unbind,
 * purge. Reply texts follow RabbitMQ's wording, since applications and
 * client libraries match on them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/channel_int.h"
#include "broker/cluster_ops.h"
#include "broker/connection.h"
#include "amqp/table.h"
#include "broker/durable.h"
#include "broker/exchange.h"
#include "broker/queue_args.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"

/* ---- exchanges ------------------------------------------------------ */

/* A headers exchange's binding must name a known x-match mode. */
static bool bind_arguments_valid(struct channel *ch, const struct exchange *source,
                                 struct table args, uint32_t method_id)
{
    struct field_value v;
    if (source->type != EXCHANGE_HEADERS || !table_get(args, "x-match", &v))
        return true;
    if ((v.kind == 'S' || v.kind == 'x') &&
        (bytes_equal_cstr(v.str, "all") || bytes_equal_cstr(v.str, "any") ||
         bytes_equal_cstr(v.str, "all-with-x") || bytes_equal_cstr(v.str, "any-with-x")))
        return true;
    char shown[320] = "<<>>";
    if (v.kind == 'S' || v.kind == 'x')
        connection__format_binary(shown, sizeof shown, v.str.ptr, v.str.len);
    channel__fail(ch, REPLY_PRECONDITION_FAILED, method_id,
                  "Invalid x-match field value %s; expected all, any, all-with-x, or any-with-x",
                  shown);
    return false;
}

static struct exchange *existing_exchange(struct channel *ch, struct bytes name,
                                          uint32_t method_id)
{
    struct exchange *exchange = vhost_exchange(ch->vhost, name);
    if (!exchange)
        channel__fail(ch, REPLY_NOT_FOUND, method_id, "no exchange '%.*s' " VHOST_FMT,
                      BYTES_ARG(name), VHOST_ARG(ch));
    return exchange;
}

static bool exchange_equivalent(struct channel *ch, const struct exchange *x,
                                const struct method_exchange_declare *d, enum exchange_type type,
                                uint32_t method_id)
{
    struct exchange_decl current = {bytes_of_cstr(exchange_type_name(x->type)), x->durable,
                                    x->auto_delete, x->internal,
                                    {x->arguments.ptr, x->arguments.len}};
    struct exchange_decl received = {bytes_of_cstr(exchange_type_name(type)), d->durable,
                                     d->auto_delete, d->internal, d->arguments};
    uint16_t code;
    char text[512];
    if (exchange_redeclare_equivalent(&current, &received, d->exchange, ch->vhost->name, &code,
                                      text, sizeof text))
        return true;
    channel__fail(ch, code, method_id, "%s", text);
    return false;
}

static void exchange_declare(struct channel *ch, const struct method *m)
{
    const struct method_exchange_declare *d = &m->exchange_declare;
    enum exchange_type type = EXCHANGE_DIRECT;
    if (exchange_type_parse(d->type, &type) != 0 && !d->passive) {
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id,
                                 "unknown exchange type '%.*s'", BYTES_ARG(d->type));
        return;
    }
    struct exchange *x = vhost_exchange(ch->vhost, d->exchange);
    if (d->exchange.len == 0) {
        /* Even a passive declare of the default exchange is refused. */
        channel__fail(ch, REPLY_ACCESS_REFUSED, m->id,
                      "operation not permitted on the default exchange");
        return;
    }
    if (!d->passive &&
        !channel__permitted(ch, AUTH_PERMISSION_CONFIGURE, "exchange", d->exchange, m->id))
        return;
    if (d->passive) {
        if (!x) {
            channel__fail(ch, REPLY_NOT_FOUND, m->id, "no exchange '%.*s' " VHOST_FMT,
                          BYTES_ARG(d->exchange), VHOST_ARG(ch));
            return;
        }
    } else if (bytes_has_prefix(d->exchange, "amq.")) {
        /* Redeclaring a predeclared amq.* exchange equivalently is fine. */
        if (!x) {
            channel__fail(ch, REPLY_ACCESS_REFUSED, m->id,
                          "exchange name '%.*s' contains reserved prefix 'amq.*'",
                          BYTES_ARG(d->exchange));
            return;
        }
        if (!exchange_equivalent(ch, x, d, type, m->id))
            return;
    } else if (x) {
        if (!exchange_equivalent(ch, x, d, type, m->id))
            return;
    } else {
        bool has_alternate;
        struct bytes alternate;
        uint16_t code;
        char text[512];
        if (!exchange_args_parse(d->arguments, d->exchange, ch->vhost->name, &has_alternate,
                                 &alternate, &code, text, sizeof text)) {
            channel__fail(ch, code, m->id, "%s", text);
            return;
        }
        struct bytes args = {d->arguments.ptr, d->arguments.len};
        if (channel__clustered(ch)) {
            struct cluster_ops_change change = {
                .kind = CLUSTER_OPS_EXCHANGE_DECLARE, .vhost = ch->vhost->name,
                .name = d->exchange, .type = bytes_of_cstr(exchange_type_name(type)),
                .durable = d->durable, .auto_delete = d->auto_delete, .internal = d->internal,
                .arguments = d->arguments};
            channel__cluster_submit(ch, m->id, d->no_wait, &change, 0);
            return;
        }
        vhost_exchange_declare(ch->vhost, d->exchange, type, d->durable, d->auto_delete,
                               d->internal, args);
    }
    if (!d->no_wait) {
        struct method ok = {.id = METHOD_EXCHANGE_DECLARE_OK};
        channel__send(ch, &ok);
    }
}

static bool exchange_modifiable(struct channel *ch, struct bytes name, uint32_t method_id)
{
    if (name.len == 0) {
        channel__fail(ch, REPLY_ACCESS_REFUSED, method_id,
                      "operation not permitted on the default exchange");
        return false;
    }
    if (bytes_has_prefix(name, "amq.")) {
        channel__fail(ch, REPLY_ACCESS_REFUSED, method_id,
                      "operation not permitted on exchange '%.*s' " VHOST_FMT, BYTES_ARG(name),
                      VHOST_ARG(ch));
        return false;
    }
    return true;
}

static void exchange_delete(struct channel *ch, const struct method *m)
{
    const struct method_exchange_delete *d = &m->exchange_delete;
    if (d->exchange.len > 0 && bytes_has_prefix(d->exchange, "amq.")) {
        channel__fail(ch, REPLY_ACCESS_REFUSED, m->id,
                      "deletion of system exchange '%.*s' " VHOST_FMT " not allowed",
                      BYTES_ARG(d->exchange), VHOST_ARG(ch));
        return;
    }
    if (!exchange_modifiable(ch, d->exchange, m->id) ||
        !channel__permitted(ch, AUTH_PERMISSION_CONFIGURE, "exchange", d->exchange, m->id))
        return;
    if (channel__clustered(ch)) {
        struct cluster_ops_change change = {.kind = CLUSTER_OPS_EXCHANGE_DELETE,
                                             .vhost = ch->vhost->name, .name = d->exchange,
                                             .if_unused = d->if_unused};
        channel__cluster_submit(ch, m->id, d->no_wait, &change, 0);
        return;
    }
    struct exchange *x = vhost_exchange(ch->vhost, d->exchange);
    if (x) {
        if (d->if_unused && exchange_has_bindings(x)) {
            channel__fail(ch, REPLY_PRECONDITION_FAILED, m->id,
                          "exchange '%.*s' " VHOST_FMT " in use", BYTES_ARG(d->exchange),
                          VHOST_ARG(ch));
            return;
        }
        vhost_exchange_delete(ch->vhost, x);
    }
    /* Deleting a missing exchange succeeds (RabbitMQ 3.x is idempotent). */
    if (!d->no_wait) {
        struct method ok = {.id = METHOD_EXCHANGE_DELETE_OK};
        channel__send(ch, &ok);
    }
}

static void exchange_bind_unbind(struct channel *ch, const struct method *m)
{
    bool bind = m->id == METHOD_EXCHANGE_BIND;
    struct bytes dest_name = bind ? m->exchange_bind.destination : m->exchange_unbind.destination;
    struct bytes source_name = bind ? m->exchange_bind.source : m->exchange_unbind.source;
    struct bytes key = bind ? m->exchange_bind.routing_key : m->exchange_unbind.routing_key;
    struct table args = bind ? m->exchange_bind.arguments : m->exchange_unbind.arguments;
    bool nowait = bind ? m->exchange_bind.no_wait : m->exchange_unbind.no_wait;
    if (dest_name.len == 0 || source_name.len == 0) {
        channel__fail(ch, REPLY_ACCESS_REFUSED, m->id,
                      "operation not permitted on the default exchange");
        return;
    }
    /* RabbitMQ: write on the destination, read on the source. */
    if (!channel__permitted(ch, AUTH_PERMISSION_WRITE, "exchange", dest_name, m->id) ||
        !channel__permitted(ch, AUTH_PERMISSION_READ, "exchange", source_name, m->id))
        return;
    struct exchange *dest = existing_exchange(ch, dest_name, m->id);
    if (!dest)
        return;
    struct exchange *source = existing_exchange(ch, source_name, m->id);
    if (!source)
        return;
    struct bytes arg_bytes = {args.ptr, args.len};
    if (bind && !bind_arguments_valid(ch, source, args, m->id))
        return;
    if (channel__clustered(ch)) {
        struct cluster_ops_change change = {
            .kind = bind ? CLUSTER_OPS_BIND : CLUSTER_OPS_UNBIND, .vhost = ch->vhost->name,
            .source = source_name, .to_queue = false, .name = dest_name, .routing_key = key,
            .arguments = args};
        channel__cluster_submit(ch, m->id, nowait, &change, 0);
        return;
    }
    if (bind) {
        struct binding *binding = exchange_bind(source, &dest->as_dest, key, arg_bytes);
        durable_binding_added(ch->connection->broker, ch->vhost, binding);
    } else {
        struct binding *binding = exchange_find_binding(source, &dest->as_dest, key, arg_bytes);
        if (binding) {
            durable_binding_removed(ch->connection->broker, ch->vhost, binding);
            exchange_unbind(source, &dest->as_dest, key, arg_bytes);
            vhost_exchange_maybe_auto_delete(ch->vhost, source);
        }
    }
    if (!nowait) {
        struct method ok = {.id = bind ? METHOD_EXCHANGE_BIND_OK : METHOD_EXCHANGE_UNBIND_OK};
        channel__send(ch, &ok);
    }
}

void channel__handle_exchange(struct channel *ch, const struct method *m)
{
    switch (m->id) {
    case METHOD_EXCHANGE_DECLARE:
        return exchange_declare(ch, m);
    case METHOD_EXCHANGE_DELETE:
        return exchange_delete(ch, m);
    case METHOD_EXCHANGE_BIND:
    case METHOD_EXCHANGE_UNBIND:
        return exchange_bind_unbind(ch, m);
    default:
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id, "unimplemented method");
    }
}

/* ---- queues --------------------------------------------------------- */

static void fail_locked(struct channel *ch, struct bytes name, uint32_t method_id)
{
    channel__fail(ch, REPLY_RESOURCE_LOCKED, method_id,
                  "cannot obtain exclusive access to locked queue '%.*s' " VHOST_FMT
                  ". It could be originally declared on another connection or the exclusive "
                  "property value does not match that of the original declaration.",
                  BYTES_ARG(name), VHOST_ARG(ch));
}

bool channel__queue_locked(struct channel *ch, struct queue *queue, uint32_t method_id)
{
    /* A peer broker acts for the queue's owner: the exclusive lock was
     * checked where the owning connection is (its broker's stand-in). */
    if (queue->exclusive && queue->exclusive_owner != ch->connection &&
        !ch->connection->cluster_peer) {
        fail_locked(ch, queue->name, method_id);
        return true;
    }
    return false;
}

bool channel__queue_unreadable(struct channel *ch, const struct queue *queue, uint32_t method_id)
{
    if (!queue->unreadable)
        return false;
    channel__fail(ch, REPLY_NOT_FOUND, method_id,
                  "queue '%.*s' " VHOST_FMT " is unavailable: its log cannot be read yet",
                  BYTES_ARG(queue->name), VHOST_ARG(ch));
    return true;
}

bool channel__resolve_queue_name(struct channel *ch, struct bytes *name, uint32_t method_id)
{
    if (name->len > 0)
        return true;
    if (!ch->has_last_queue) {
        channel__fail(ch, REPLY_NOT_FOUND, method_id, "no previously declared queue");
        return false;
    }
    *name = (struct bytes){ch->last_queue, ch->last_queue_size};
    return true;
}

void channel__remember_queue(struct channel *ch, struct bytes name)
{
    if (!ch->last_queue) {
        ch->last_queue = xmalloc(256);
    }
    ASSERT(name.len <= 255);
    memmove(ch->last_queue, name.ptr, name.len);
    ch->last_queue_size = (uint8_t)name.len;
    ch->has_last_queue = true;
}

/* The queue called name in the channel's vhost, or NULL once the channel
 * failed with 404. (A deleted queue is out of the table before it is
 * marked: vhost_queue_delete.) */
static struct queue *named_queue(struct channel *ch, struct bytes name, uint32_t method_id)
{
    struct queue *queue = vhost_queue(ch->vhost, name);
    if (queue == NULL || NEVER(queue->deleted)) {
        channel__fail(ch, REPLY_NOT_FOUND, method_id, "no queue '%.*s' " VHOST_FMT,
                      BYTES_ARG(name), VHOST_ARG(ch));
        return NULL;
    }
    return queue;
}

/* A client's queue: "" is the channel's last one; another connection's
 * exclusive queue is locked. */
static struct queue *existing_queue(struct channel *ch, struct bytes name, uint32_t method_id)
{
    if (!channel__resolve_queue_name(ch, &name, method_id))
        return NULL;
    struct queue *queue = named_queue(ch, name, method_id);
    if (queue == NULL || channel__queue_locked(ch, queue, method_id) ||
        channel__queue_unreadable(ch, queue, method_id))
        return NULL;
    return queue;
}

/* queue.quay-counts: a peer's management listing asks for a queue's
 * counts as its primary has them (a passive declare's lack the unacked
 * ones). A peer names the queue itself, and exclusive ones are counted
 * too. A stand-in here (the queue moved, and the asker's map is behind)
 * asks its primary in turn, as a passive declare would (channel_wait.c). */
static void queue_quay_counts(struct channel *ch, const struct method *m)
{
    if (!channel__peer_only(ch, m->id))
        return;
    struct queue *queue = named_queue(ch, m->queue_quay_counts.queue, m->id);
    if (queue == NULL)
        return;
    if (queue_is_remote(queue)) {
        channel__remote_query(ch, queue, m);
        return;
    }
    channel__answer_counts(ch, queue, NULL);
}

static bool queue_equivalent(struct channel *ch, const struct queue *q,
                             const struct method_queue_declare *d, uint32_t method_id)
{
    if (q->exclusive != d->exclusive) {
        /* RabbitMQ reports an exclusive mismatch as a lock, not as 406. */
        fail_locked(ch, q->name, method_id);
        return false;
    }
    struct queue_decl current = {q->durable, q->auto_delete,
                                 {q->arguments.ptr, q->arguments.len}};
    struct queue_decl received = {d->durable, d->auto_delete, d->arguments};
    uint16_t code;
    char text[512];
    if (queue_redeclare_equivalent(&current, &received, q->name, ch->vhost->name, &code, text,
                                   sizeof text))
        return true;
    channel__fail(ch, code, method_id, "%s", text);
    return false;
}

static void send_declare_ok(struct channel *ch, const struct queue *queue)
{
    struct method ok = {.id = METHOD_QUEUE_DECLARE_OK};
    ok.queue_declare_ok.queue = queue->name;
    ok.queue_declare_ok.message_count = queue_ready_count(queue);
    ok.queue_declare_ok.consumer_count = queue->consumers_count;
    channel__send(ch, &ok);
}

/* A new queue in a cluster: placed (pinned here when exclusive,
 * auto-delete or server-named), then declared through the map. */
static void declare_in_cluster(struct channel *ch, const struct method *m, struct bytes name,
                               bool server_named, int32_t backups)
{
    const struct method_queue_declare *d = &m->queue_declare;
    bool pinned = d->exclusive || d->auto_delete || server_named;
    struct cluster_ops_change change = {
        .kind = CLUSTER_OPS_QUEUE_DECLARE, .vhost = ch->vhost->name, .name = name,
        .durable = d->durable, .exclusive = d->exclusive, .auto_delete = d->auto_delete,
        .arguments = d->arguments,
        .exclusive_connection_id = d->exclusive ? ch->connection->conn.id : 0,
        .pinned = pinned, .backups = backups};
    channel__cluster_submit(ch, m->id, d->no_wait, &change, 0);
}

/* The broker's and the vhost's queue limits leave room for one more
 * (else the channel fails 406). */
static bool room_for_queue(struct channel *ch, struct bytes name, uint32_t method_id)
{
    struct broker *broker = ch->connection->broker;
    uint32_t limit = broker->config.limits.queues_max;
    if (limit && ch->vhost->queues.count >= limit) {
        channel__fail(ch, REPLY_PRECONDITION_FAILED, method_id,
                      "cannot declare queue '%.*s': queue limit " VHOST_FMT " (%u) is reached",
                      BYTES_ARG(name), VHOST_ARG(ch), limit);
        return false;
    }
    /* The vhost's max-queues (RabbitMQ's words): in a cluster the vhost
     * holds a stand-in for every queue of the map, so this counts the
     * cluster's queues. */
    int64_t vhost_limit = limit_set_value(&broker->limits, LIMIT_SCOPE_VHOST,
                                          ch->vhost->name, LIMIT_MAX_QUEUES);
    if (!limit_allows(vhost_limit, ch->vhost->queues.count)) {
        channel__fail(ch, REPLY_PRECONDITION_FAILED, method_id,
                      "cannot declare queue '%.*s': queue limit " VHOST_FMT " (%lld) is "
                      "reached", BYTES_ARG(name), VHOST_ARG(ch), (long long)vhost_limit);
        return false;
    }
    return true;
}

static void queue_declare(struct channel *ch, const struct method *m)
{
    const struct method_queue_declare *d = &m->queue_declare;
    struct connection *connection = ch->connection;
    struct broker *broker = connection->broker;
    char generated[64];
    struct bytes name = d->queue;
    struct queue *queue = vhost_queue(ch->vhost, name);
    if (d->passive) {
        if (!queue) {
            channel__fail(ch, REPLY_NOT_FOUND, m->id, "no queue '%.*s' " VHOST_FMT,
                          BYTES_ARG(name), VHOST_ARG(ch));
            return;
        }
        if (channel__queue_locked(ch, queue, m->id))
            return;
    } else if (bytes_has_prefix(name, "amq.")) {
        /* Checked before existence: even a server-named queue cannot be
         * redeclared actively (RabbitMQ). */
        channel__fail(ch, REPLY_ACCESS_REFUSED, m->id,
                      "queue name '%.*s' contains reserved prefix 'amq.*'", BYTES_ARG(name));
        return;
    } else if (queue) {
        if (!channel__permitted(ch, AUTH_PERMISSION_CONFIGURE, "queue", name, m->id) ||
            channel__queue_locked(ch, queue, m->id) || !queue_equivalent(ch, queue, d, m->id))
            return;
    } else {
        if (name.len == 0) {
            broker_generate_name(broker, "amq.gen-", generated, sizeof generated);
            name = bytes_of_cstr(generated);
        }
        if (!channel__permitted(ch, AUTH_PERMISSION_CONFIGURE, "queue", name, m->id))
            return;
        struct queue_args parsed;
        uint16_t code;
        char text[512];
        if (!queue_args_parse(d->arguments, name, ch->vhost->name, &parsed, &code, text,
                              sizeof text)) {
            channel__fail(ch, code, m->id, "%s", text);
            return;
        }
        if (!room_for_queue(ch, name, m->id))
            return;
        struct bytes args = {d->arguments.ptr, d->arguments.len};
        if (channel__clustered(ch)) {
            declare_in_cluster(ch, m, name, d->queue.len == 0, parsed.quay_backups);
            return;
        }
        queue = vhost_queue_declare(ch->vhost, name, d->durable, d->exclusive, d->auto_delete,
                                    args);
        if (d->exclusive) {
            queue->exclusive_owner = connection;
            list_push_back(&connection->exclusive_queues, &queue->owner_link);
        }
    }
    if (channel__queue_unreadable(ch, queue, m->id))
        return;
    if (queue_is_remote(queue)) {
        channel__remote_query(ch, queue, m); /* the counts are the primary's */
        return;
    }
    queue_touch(queue);
    channel__remember_queue(ch, queue->name);
    if (!d->no_wait)
        send_declare_ok(ch, queue);
}

static void queue_bind_unbind(struct channel *ch, const struct method *m)
{
    bool bind = m->id == METHOD_QUEUE_BIND;
    struct bytes queue_name = bind ? m->queue_bind.queue : m->queue_unbind.queue;
    struct bytes exchange_name = bind ? m->queue_bind.exchange : m->queue_unbind.exchange;
    struct bytes key = bind ? m->queue_bind.routing_key : m->queue_unbind.routing_key;
    struct table args = bind ? m->queue_bind.arguments : m->queue_unbind.arguments;
    if (exchange_name.len == 0) {
        channel__fail(ch, REPLY_ACCESS_REFUSED, m->id,
                      "operation not permitted on the default exchange");
        return;
    }
    if (!channel__resolve_queue_name(ch, &queue_name, m->id))
        return;
    /* RabbitMQ: write on the queue, read on the exchange. */
    if (!channel__permitted(ch, AUTH_PERMISSION_WRITE, "queue", queue_name, m->id) ||
        !channel__permitted(ch, AUTH_PERMISSION_READ, "exchange", exchange_name, m->id))
        return;
    struct queue *queue = vhost_queue(ch->vhost, queue_name);
    if (!queue) {
        channel__fail(ch, REPLY_NOT_FOUND, m->id, "no queue '%.*s' " VHOST_FMT,
                      BYTES_ARG(queue_name), VHOST_ARG(ch));
        return;
    }
    struct exchange *exchange = existing_exchange(ch, exchange_name, m->id);
    if (!exchange)
        return;
    struct bytes arg_bytes = {args.ptr, args.len};
    /* RabbitMQ checks the exclusive lock on unbind only when the binding
     * exists; unbinding nothing succeeds for anyone. */
    struct binding *existing = exchange_find_binding(exchange, &queue->as_dest, key, arg_bytes);
    if (!bind && !existing) {
        struct method ok = {.id = METHOD_QUEUE_UNBIND_OK};
        channel__send(ch, &ok);
        return;
    }
    if (channel__queue_locked(ch, queue, m->id))
        return;
    if (bind && !bind_arguments_valid(ch, exchange, args, m->id))
        return;
    if (channel__clustered(ch)) {
        struct cluster_ops_change change = {
            .kind = bind ? CLUSTER_OPS_BIND : CLUSTER_OPS_UNBIND, .vhost = ch->vhost->name,
            .source = exchange_name, .to_queue = true, .name = queue_name, .routing_key = key,
            .arguments = args};
        bool no_wait = bind && m->queue_bind.no_wait;
        channel__cluster_submit(ch, m->id, no_wait, &change, 0);
        return;
    }
    if (bind) {
        struct binding *binding = exchange_bind(exchange, &queue->as_dest, key, arg_bytes);
        if (binding != existing)
            durable_binding_added(ch->connection->broker, ch->vhost, binding);
        if (!m->queue_bind.no_wait) {
            struct method ok = {.id = METHOD_QUEUE_BIND_OK};
            channel__send(ch, &ok);
        }
        return;
    }
    durable_binding_removed(ch->connection->broker, ch->vhost, existing);
    exchange_unbind(exchange, &queue->as_dest, key, arg_bytes);
    vhost_exchange_maybe_auto_delete(ch->vhost, exchange);
    struct method ok = {.id = METHOD_QUEUE_UNBIND_OK};
    channel__send(ch, &ok);
}

static void queue_purge_method(struct channel *ch, const struct method *m)
{
    struct bytes name = m->queue_purge.queue;
    /* RabbitMQ: purging takes read permission on the queue. */
    if (!channel__resolve_queue_name(ch, &name, m->id) ||
        !channel__permitted(ch, AUTH_PERMISSION_READ, "queue", name, m->id))
        return;
    struct queue *queue = existing_queue(ch, name, m->id);
    if (!queue)
        return;
    if (queue_is_remote(queue)) {
        channel__remote_query(ch, queue, m);
        return;
    }
    uint32_t count = queue_purge(queue);
    if (!m->queue_purge.no_wait) {
        struct method ok = {.id = METHOD_QUEUE_PURGE_OK};
        ok.queue_purge_ok.message_count = count;
        channel__send(ch, &ok);
    }
}

static void queue_delete_method(struct channel *ch, const struct method *m)
{
    const struct method_queue_delete *d = &m->queue_delete;
    struct bytes name = d->queue;
    if (!channel__resolve_queue_name(ch, &name, m->id) ||
        !channel__permitted(ch, AUTH_PERMISSION_CONFIGURE, "queue", name, m->id))
        return;
    struct queue *queue = vhost_queue(ch->vhost, name);
    uint32_t count = 0;
    if (queue) {
        if (channel__queue_locked(ch, queue, m->id))
            return;
        if (queue_is_remote(queue)) {
            channel__remote_query(ch, queue, m); /* its checks and count, then the map */
            return;
        }
        if (d->if_unused && queue->consumers_count > 0) {
            channel__fail(ch, REPLY_PRECONDITION_FAILED, m->id,
                          "queue '%.*s' " VHOST_FMT " in use", BYTES_ARG(name), VHOST_ARG(ch));
            return;
        }
        if (d->if_empty && queue_ready_count(queue) > 0) {
            channel__fail(ch, REPLY_PRECONDITION_FAILED, m->id,
                          "queue '%.*s' " VHOST_FMT " not empty", BYTES_ARG(name),
                          VHOST_ARG(ch));
            return;
        }
        if (channel__clustered(ch)) {
            struct cluster_ops_change change = {.kind = CLUSTER_OPS_QUEUE_DELETE,
                                                 .vhost = ch->vhost->name, .name = name};
            channel__cluster_submit(ch, m->id, d->no_wait, &change, queue_ready_count(queue));
            return;
        }
        count = vhost_queue_delete(ch->vhost, queue);
    }
    if (!d->no_wait) {
        struct method ok = {.id = METHOD_QUEUE_DELETE_OK};
        ok.queue_delete_ok.message_count = count;
        channel__send(ch, &ok);
    }
}

void channel__handle_queue(struct channel *ch, const struct method *m)
{
    switch (m->id) {
    case METHOD_QUEUE_DECLARE:
        return queue_declare(ch, m);
    case METHOD_QUEUE_BIND:
    case METHOD_QUEUE_UNBIND:
        return queue_bind_unbind(ch, m);
    case METHOD_QUEUE_PURGE:
        return queue_purge_method(ch, m);
    case METHOD_QUEUE_DELETE:
        return queue_delete_method(ch, m);
    case METHOD_QUEUE_QUAY_COUNTS:
        return queue_quay_counts(ch, m);
    default:
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id, "unimplemented method");
    }
}
