/*
 * channel_wait.c: a channel waiting for the cluster (broker/cluster_ops.h)
 * or for a stand-in's primary (queue_remote_ops, queue.h), with its
 * connection's input held (connection_hold) until the answer comes.
 *
 * Definition changes in a cluster: a declare, delete, bind or unbind that
 * passed the channel's own checks goes to the cluster (cluster_ops
 * submit, which makes it a map command), and is answered once applied on
 * this broker, whose mirror then already has the object, exactly as a
 * single broker would, with the map's reply code and text on refusal. A
 * map that cannot commit (no leader, no quorum) is a hard error, 541, as
 * RabbitMQ answers a declare that times out: the client reconnects,
 * ideally to a broker of the majority. A change that succeeded is
 * answered once the other brokers have applied it too (await_visible):
 * what a client was told exists, or is gone, is so through every broker.
 */
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/channel_int.h"
#include "broker/cluster_ops.h"
#include "broker/connection.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"

/* Owned by its channel (ch->cluster_wait). */
struct channel_cluster_wait {
    struct channel *ch;               /* borrowed */
    struct cluster_ops_wait *pending; /* the cluster's, until its answer */
    bool answer;                      /* basic.quay-sync: basic.quay-synced when there */
    uint32_t method_id;
    bool no_wait;
    uint32_t message_count;           /* queue.delete-ok */
    uint8_t name_size;
    uint8_t name[256];                /* queue.declare: the queue's name */
    bool gone_ok;                     /* a refused queue.delete is done too (delete_gone) */
};

static const struct cluster_ops *ops_of(const struct channel *ch)
{
    return ch->connection->broker->cluster_ops;
}

static void *cluster_of(const struct channel *ch)
{
    return ch->connection->broker->cluster_ctx;
}

bool channel__clustered(const struct channel *ch)
{
    return ops_of(ch) != NULL;
}

static void send_reply(struct channel *ch, const struct channel_cluster_wait *w)
{
    struct method ok = {.id = 0};
    switch (w->method_id) {
    case METHOD_EXCHANGE_DECLARE: ok.id = METHOD_EXCHANGE_DECLARE_OK; break;
    case METHOD_EXCHANGE_DELETE: ok.id = METHOD_EXCHANGE_DELETE_OK; break;
    case METHOD_EXCHANGE_BIND: ok.id = METHOD_EXCHANGE_BIND_OK; break;
    case METHOD_EXCHANGE_UNBIND: ok.id = METHOD_EXCHANGE_UNBIND_OK; break;
    case METHOD_QUEUE_BIND: ok.id = METHOD_QUEUE_BIND_OK; break;
    case METHOD_QUEUE_UNBIND: ok.id = METHOD_QUEUE_UNBIND_OK; break;
    case METHOD_QUEUE_DELETE:
        ok.id = METHOD_QUEUE_DELETE_OK;
        ok.queue_delete_ok.message_count = w->message_count;
        break;
    case METHOD_QUEUE_DECLARE: {
        struct bytes name = {w->name, w->name_size};
        struct queue *queue = vhost_queue(ch->vhost, name);
        if (queue == NULL) {
            /* Deleted again before we could answer (a racing delete). */
            channel__fail(ch, REPLY_NOT_FOUND, w->method_id, "no queue '%.*s' in vhost '%.*s'",
                          (int)name.len, (const char *)name.ptr, (int)ch->vhost->name.len,
                          (const char *)ch->vhost->name.ptr);
            return;
        }
        channel__remember_queue(ch, name);
        ok.id = METHOD_QUEUE_DECLARE_OK;
        ok.queue_declare_ok.queue = name;
        ok.queue_declare_ok.message_count = queue_ready_count(queue);
        ok.queue_declare_ok.consumer_count = queue->consumers_count;
        break;
    }
    default:
        ASSERT(false);
    }
    if (!w->no_wait)
        channel__send(ch, &ok);
}

static void finish(struct channel *ch, struct channel_cluster_wait *w, bool close_after)
{
    free(w);
    if (close_after && ch->state == CHANNEL_STATE_OPEN)
        channel__finish_close(ch);
}

static void on_visible(void *ctx, const struct cluster_ops_answer *answer)
{
    (void)answer;
    struct channel_cluster_wait *w = ctx;
    struct channel *ch = w->ch;
    ASSERT(ch->cluster_wait == w && w->pending != NULL);
    ch->cluster_wait = NULL;
    w->pending = NULL;
    connection_release(ch->connection);
    if (ch->state == CHANNEL_STATE_OPEN)
        send_reply(ch, w);
    finish(ch, w, ch->close_pending);
}

static void on_committed(void *ctx, const struct cluster_ops_answer *a)
{
    struct channel_cluster_wait *w = ctx;
    struct channel *ch = w->ch;
    ASSERT(ch != NULL && ch->cluster_wait == w);
    ch->cluster_wait = NULL;
    w->pending = NULL;
    struct connection *connection = ch->connection;
    if (a->status == OK && a->changed && ch->state == CHANNEL_STATE_OPEN &&
        (a->reply_code == REPLY_SUCCESS || w->gone_ok)) {
        /* Answered once every broker has it, input still held. */
        w->pending = ops_of(ch)->await_visible(cluster_of(ch), a->version, on_visible, w);
        if (w->pending != NULL) {
            ch->cluster_wait = w;
            return;
        }
    }
    connection_release(connection);
    bool close_after = ch->close_pending; /* the client's channel.close waited for this */
    if (a->status != OK) {
        close_after = false; /* the connection goes, with the channel */
        connection_fail(connection, REPLY_INTERNAL_ERROR, w->method_id,
                        "the cluster map is unavailable (no leader or no quorum): try another "
                        "broker");
    } else if (a->reply_code != REPLY_SUCCESS && !w->gone_ok) {
        channel__fail(ch, a->reply_code, w->method_id, "%s", a->reply_text);
    } else if (ch->state == CHANNEL_STATE_OPEN) {
        send_reply(ch, w);
    }
    finish(ch, w, close_after);
}

void channel__cluster_submit(struct channel *ch, uint32_t method_id, bool no_wait,
                             const struct cluster_ops_change *change, uint32_t message_count)
{
    ASSERT(ch->cluster_wait == NULL); /* the connection is held while one waits */
    struct channel_cluster_wait *w = xcalloc(1, sizeof *w);
    w->ch = ch;
    w->method_id = method_id;
    w->no_wait = no_wait;
    w->message_count = message_count;
    if (change->kind == CLUSTER_OPS_QUEUE_DECLARE) {
        ASSERT(change->name.len <= 255);
        memcpy(w->name, change->name.ptr, change->name.len);
        w->name_size = (uint8_t)change->name.len;
    }
    /* (done never runs from inside submit) */
    w->pending = ops_of(ch)->submit(cluster_of(ch), change, on_committed, w);
    if (w->pending == NULL) {
        free(w); /* the command could not be made: nothing is answered, as before */
        return;
    }
    ch->cluster_wait = w;
    connection_hold(ch->connection);
}

void channel__cluster_forget(struct channel *ch)
{
    struct channel_cluster_wait *w = ch->cluster_wait;
    if (w == NULL)
        return;
    ch->cluster_wait = NULL;
    ops_of(ch)->cancel(cluster_of(ch), w->pending);
    connection_release(ch->connection);
    free(w);
}

static void answer_synced(struct channel *ch, uint64_t version)
{
    struct method m = {.id = METHOD_BASIC_QUAY_SYNCED};
    m.basic_quay_synced.version = version;
    if (ch->state == CHANNEL_STATE_OPEN)
        channel__send(ch, &m);
}

static void on_synced_through(void *ctx, const struct cluster_ops_answer *answer)
{
    struct channel_cluster_wait *w = ctx;
    struct channel *ch = w->ch;
    ASSERT(ch->cluster_wait == w);
    ch->cluster_wait = NULL;
    connection_release(ch->connection);
    if (w->answer)
        answer_synced(ch, answer->version);
    free(w);
}

void channel__cluster_sync(struct channel *ch, uint64_t version, bool answer)
{
    ASSERT(ch->cluster_wait == NULL); /* the connection is held while one waits */
    struct channel_cluster_wait *w = xcalloc(1, sizeof *w);
    w->ch = ch;
    w->method_id = METHOD_BASIC_QUAY_SYNC;
    w->answer = answer;
    w->pending = ops_of(ch)->await_synced(cluster_of(ch), version, on_synced_through, w);
    if (w->pending == NULL) {
        free(w);
        if (answer)
            answer_synced(ch, ops_of(ch)->map_version(cluster_of(ch))); /* there already */
        return;
    }
    ch->cluster_wait = w;
    connection_hold(ch->connection);
}

/* ---- requests at a stand-in's primary ---- */

void channel__remote_op_done(struct channel *ch, const struct queue *queue)
{
    ASSERT(ch->remote_op != NULL && ch->remote_queue == queue);
    ch->remote_op = NULL;
    ch->remote_queue = NULL; /* the caller drops the reference when done with it */
    connection_release(ch->connection);
}

void channel__fail_relayed(struct channel *ch, uint16_t code, uint32_t method_id,
                           struct bytes text)
{
    /* The primary's text already starts with its own "NAME - ". */
    const uint8_t *dash = text.len > 3 ? memmem(text.ptr, text.len, " - ", 3) : NULL;
    size_t skip = dash ? (size_t)(dash - text.ptr) + 3 : 0;
    channel__fail(ch, code, method_id, "%.*s", (int)(text.len - skip),
                  (const char *)text.ptr + skip);
}

void channel__fail_unreachable(struct channel *ch, const struct queue *queue, uint32_t method_id)
{
    channel__fail(ch, REPLY_NOT_FOUND, method_id,
                  "queue '%.*s' in vhost '%.*s' is unavailable: its primary broker cannot be "
                  "reached", (int)queue->name.len, (const char *)queue->name.ptr,
                  (int)ch->vhost->name.len, (const char *)ch->vhost->name.ptr);
}

/* The stand-in's queue is gone at its primary (auto-delete, x-expires, its
 * exclusive owner left) and our map has not heard yet: the client's
 * declare makes a new one, replacing that incarnation in the map. */
static void redeclare(struct channel *ch, struct queue *stub)
{
    struct cluster_ops_change change = {
        .kind = CLUSTER_OPS_QUEUE_DECLARE, .vhost = ch->vhost->name, .name = stub->name,
        .durable = stub->durable, .auto_delete = stub->auto_delete,
        .arguments = {stub->arguments.ptr, (uint32_t)stub->arguments.len},
        .epoch = stub->remote_ops->epoch(stub), .pinned = stub->auto_delete,
        .backups = stub->args.quay_backups};
    channel__cluster_submit(ch, METHOD_QUEUE_DECLARE, ch->remote_no_wait, &change, 0);
}

/* Likewise for a delete: deleting a queue that is not there succeeds
 * (with no messages), and the map forgets that incarnation now (a refusal
 * means something replaced it already: the delete is done too). */
static void delete_gone(struct channel *ch, struct queue *stub)
{
    struct cluster_ops_change change = {
        .kind = CLUSTER_OPS_QUEUE_DELETE, .vhost = ch->vhost->name, .name = stub->name,
        .epoch = stub->remote_ops->epoch(stub)};
    channel__cluster_submit(ch, METHOD_QUEUE_DELETE, ch->remote_no_wait, &change, 0);
    if (ch->cluster_wait != NULL)
        ch->cluster_wait->gone_ok = true;
}

/* The stand-in asked was replaced meanwhile (this broker is the queue's
 * primary now: its backup promoted) or deleted: the method is asked again
 * by name, of whatever the vhost holds now, as one broker would have
 * answered it. The stand-in's own properties stand for a declare's: they
 * passed its equivalence check. */
static void query_again(struct channel *ch, const struct queue *stub, uint32_t method_id)
{
    struct method m = {.id = method_id};
    if (method_id == METHOD_QUEUE_DECLARE) {
        m.queue_declare.queue = stub->name;
        m.queue_declare.passive = ch->remote_passive;
        m.queue_declare.durable = stub->durable;
        m.queue_declare.exclusive = stub->exclusive;
        m.queue_declare.auto_delete = stub->auto_delete;
        m.queue_declare.no_wait = ch->remote_no_wait;
        m.queue_declare.arguments = (struct table){stub->arguments.ptr,
                                                   (uint32_t)stub->arguments.len};
    } else if (method_id == METHOD_QUEUE_PURGE) {
        m.queue_purge.queue = stub->name;
        m.queue_purge.no_wait = ch->remote_no_wait;
    } else if (method_id == METHOD_QUEUE_DELETE) {
        m.queue_delete.queue = stub->name;
        m.queue_delete.if_unused = ch->remote_if_unused;
        m.queue_delete.if_empty = ch->remote_if_empty;
        m.queue_delete.no_wait = ch->remote_no_wait;
    } else {
        ASSERT(method_id == METHOD_QUEUE_QUAY_COUNTS);
        m.queue_quay_counts.queue = stub->name;
    }
    if (ch->state == CHANNEL_STATE_OPEN)
        channel__handle_queue(ch, &m);
}

static void on_query(void *ctx, struct queue *queue, uint16_t code, struct bytes text,
                     const struct queue_remote_counts *counts)
{
    uint32_t messages = counts->messages, consumers = counts->consumers;
    struct channel *ch = ctx;
    uint32_t method_id = ch->remote_method;
    channel__remote_op_done(ch, queue);
    if (code == 0 && queue->deleted && method_id != METHOD_BASIC_CANCEL &&
        method_id != METHOD_CHANNEL_CLOSE) {
        query_again(ch, queue, method_id);
    } else if (code == REPLY_NOT_FOUND && method_id == METHOD_QUEUE_DECLARE &&
               !ch->remote_passive) {
        redeclare(ch, queue);
    } else if (code == REPLY_NOT_FOUND && method_id == METHOD_QUEUE_DELETE) {
        delete_gone(ch, queue);
    } else if (method_id == METHOD_BASIC_CANCEL || method_id == METHOD_CHANNEL_CLOSE) {
        /* Deleted with its last consumer: the map forgets it before the
         * client's next method (cancel-ok went out; close-ok goes once that
         * is applied). Still there (consumers elsewhere), or unreachable:
         * go on. */
        if (code == REPLY_NOT_FOUND)
            delete_gone(ch, queue);
        if (ch->close_pending && ch->cluster_wait == NULL)
            channel__finish_close(ch);
    } else if (method_id == METHOD_QUEUE_QUAY_COUNTS && code == 0) {
        channel__answer_counts(ch, queue, NULL); /* unreachable: ours, not the primary's */
    } else if (code == 0) {
        channel__fail_unreachable(ch, queue, method_id);
    } else if (code != REPLY_SUCCESS) {
        channel__fail_relayed(ch, code, method_id, text);
    } else if (method_id == METHOD_QUEUE_DECLARE) {
        channel__remember_queue(ch, queue->name);
        struct method ok = {.id = METHOD_QUEUE_DECLARE_OK};
        ok.queue_declare_ok.queue = queue->name;
        ok.queue_declare_ok.message_count = messages;
        ok.queue_declare_ok.consumer_count = consumers;
        if (!ch->remote_no_wait)
            channel__send(ch, &ok);
    } else if (method_id == METHOD_QUEUE_QUAY_COUNTS) {
        channel__answer_counts(ch, queue, counts);
    } else if (method_id == METHOD_QUEUE_PURGE) {
        struct method ok = {.id = METHOD_QUEUE_PURGE_OK};
        ok.queue_purge_ok.message_count = messages;
        if (!ch->remote_no_wait)
            channel__send(ch, &ok);
    } else {
        ASSERT(method_id == METHOD_QUEUE_DELETE);
        if (ch->remote_if_unused && consumers > 0) {
            channel__fail(ch, REPLY_PRECONDITION_FAILED, method_id,
                          "queue '%.*s' in vhost '%.*s' in use", (int)queue->name.len,
                          (const char *)queue->name.ptr, (int)ch->vhost->name.len,
                          (const char *)ch->vhost->name.ptr);
        } else if (ch->remote_if_empty && messages > 0) {
            channel__fail(ch, REPLY_PRECONDITION_FAILED, method_id,
                          "queue '%.*s' in vhost '%.*s' not empty", (int)queue->name.len,
                          (const char *)queue->name.ptr, (int)ch->vhost->name.len,
                          (const char *)ch->vhost->name.ptr);
        } else {
            struct cluster_ops_change change = {.kind = CLUSTER_OPS_QUEUE_DELETE,
                                                 .vhost = ch->vhost->name,
                                                 .name = queue->name};
            channel__cluster_submit(ch, method_id, ch->remote_no_wait, &change, messages);
        }
    }
    queue_unref(queue);
}

void channel__await_auto_delete(struct channel *ch, struct queue *queue, uint32_t method_id)
{
    ASSERT(queue_is_remote(queue) && ch->remote_op == NULL);
    /* Asked on the same link as the upstream cancel, after it: the answer
     * says whether that cancel deleted the queue. */
    ch->remote_op = queue->remote_ops->query(queue, METHOD_QUEUE_DECLARE, on_query, ch);
    if (ch->remote_op == NULL)
        return; /* unreachable: nothing to wait for */
    ch->remote_method = method_id;
    ch->remote_no_wait = true;
    ch->remote_passive = true;
    ch->remote_if_unused = ch->remote_if_empty = false;
    ch->remote_queue = queue;
    queue_ref(queue);
    connection_hold(ch->connection);
}

void channel__remote_query(struct channel *ch, struct queue *queue, const struct method *m)
{
    ASSERT(queue_is_remote(queue) && ch->remote_op == NULL);
    uint32_t ask = m->id == METHOD_QUEUE_PURGE || m->id == METHOD_QUEUE_QUAY_COUNTS
                       ? m->id
                       : METHOD_QUEUE_DECLARE;
    ch->remote_op = queue->remote_ops->query(queue, ask, on_query, ch);
    if (ch->remote_op == NULL && m->id == METHOD_QUEUE_QUAY_COUNTS) {
        channel__answer_counts(ch, queue, NULL); /* unreachable: ours, not the primary's */
        return;
    }
    if (ch->remote_op == NULL) {
        channel__fail_unreachable(ch, queue, m->id);
        return;
    }
    ch->remote_method = m->id;
    ch->remote_no_wait = m->id == METHOD_QUEUE_DECLARE   ? m->queue_declare.no_wait
                         : m->id == METHOD_QUEUE_PURGE   ? m->queue_purge.no_wait
                         : m->id == METHOD_QUEUE_DELETE ? m->queue_delete.no_wait
                                                         : false;
    ch->remote_passive = m->id == METHOD_QUEUE_DECLARE && m->queue_declare.passive;
    ch->remote_if_unused = m->id == METHOD_QUEUE_DELETE && m->queue_delete.if_unused;
    ch->remote_if_empty = m->id == METHOD_QUEUE_DELETE && m->queue_delete.if_empty;
    ch->remote_queue = queue;
    queue_ref(queue);
    connection_hold(ch->connection);
}
