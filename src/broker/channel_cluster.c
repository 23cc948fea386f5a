/*
 * channel_cluster.c: definition changes in a cluster. A declare, delete,
 * bind or unbind that passed the channel's own checks becomes a cluster
 * map command (cluster/map.h); the channel's connection holds its input
 * (connection_hold) until the command has been applied on this broker,
 * whose mirror then already has the object, and answers exactly as a
 * single broker would, with the map's reply code and text on refusal.
 * A map that cannot commit (no leader, no quorum) is a hard error, 541,
 * as RabbitMQ answers a declare that times out: the client reconnects,
 * ideally to a broker of the majority. A change that succeeded is answered
 * once the other brokers have applied it too (cluster/visible.h): what a
 * client was told exists, or is gone, is so through every broker.
 */
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/channel_int.h"
#include "broker/connection.h"
#include "broker/vhost.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/visible.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"

struct cluster_wait {
    struct channel *ch;               /* borrowed; the channel owns the wait */
    struct cluster_request *request;  /* owned by the node until it answers */
    struct member_sync_wait sync;     /* basic.quay-sync: waits for our map instead */
    struct visible_wait visible;      /* committed: waits for the other brokers' maps */
    bool visible_pending;
    bool answer;                      /* basic.quay-sync: basic.quay-synced when there */
    uint32_t method_id;
    bool no_wait;
    uint32_t message_count;           /* queue.delete-ok */
    uint8_t name_size;
    uint8_t name[256];                /* queue.declare: the queue's name */
    /* queue.declare, to decide the placement again when the map says the
     * broker we chose is down (a stale view: change->retry). */
    struct map_queue_decl decl;       /* vhost and name borrow from the channel and above */
    struct bytes arguments;           /* owned copy */
    bool pinned;
    int32_t backups;                  /* x-quay-backups, -1: the default */
    uint8_t retries;
    bool gone_ok;                     /* a refused queue.delete is done too (delete_gone) */
};

#define PLACEMENT_RETRIES_MAX 3

bool channel__clustered(const struct channel *ch)
{
    return ch->connection->broker->member != NULL;
}

static void send_reply(struct channel *ch, const struct cluster_wait *w)
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

static void finish(struct channel *ch, struct cluster_wait *w, bool close_after);
static void on_visible(struct visible_wait *visible);

static void on_committed(void *ctx, int status, const struct map_change *change)
{
    struct cluster_wait *w = ctx;
    struct channel *ch = w->ch;
    ASSERT(ch != NULL && ch->cluster_wait == w);
    ch->cluster_wait = NULL;
    struct connection *connection = ch->connection;
    if (status == OK && change->retry && w->method_id == METHOD_QUEUE_DECLARE &&
        w->decl.name.len > 0 && w->retries < PLACEMENT_RETRIES_MAX) {
        /* Placed on a broker the map now knows is down: place again on
         * the map as it is now, still holding the client's input. */
        struct broker *broker = connection->broker;
        w->retries++;
        w->decl.name = (struct bytes){w->name, w->name_size};
        w->decl.arguments = (struct table){w->arguments.ptr, (uint32_t)w->arguments.len};
        member_place_queue(broker->member, &w->decl, w->pinned, w->backups);
        struct map_cmd cmd;
        if (map_cmd_queue_declare(&cmd, &w->decl, cluster_node_id(broker->cluster)) == OK) {
            ch->cluster_wait = w;
            w->request = cluster_node_submit(broker->cluster, &cmd, on_committed, w);
            return;
        }
    }
    if (status == OK && change->changed && ch->state == CHANNEL_STATE_OPEN &&
        (change->reply_code == REPLY_SUCCESS || w->gone_ok)) {
        /* Answered once every broker has it (visible.h), input still held. */
        w->visible.done = on_visible;
        if (visible_wait(connection->broker->member, &w->visible, change->version)) {
            ch->cluster_wait = w;
            w->visible_pending = true;
            return;
        }
    }
    connection_release(connection);
    bool close_after = ch->close_pending; /* the client's channel.close waited for this */
    if (status != OK) {
        close_after = false; /* the connection goes, with the channel */
        connection_fail(connection, REPLY_INTERNAL_ERROR, w->method_id,
                        "the cluster map is unavailable (no leader or no quorum): try another "
                        "broker");
    } else if (change->reply_code != REPLY_SUCCESS && !w->gone_ok) {
        channel__fail(ch, change->reply_code, w->method_id, "%s", change->reply_text);
    } else if (ch->state == CHANNEL_STATE_OPEN) {
        send_reply(ch, w);
    }
    finish(ch, w, close_after);
}

static void finish(struct channel *ch, struct cluster_wait *w, bool close_after)
{
    bytes_free(&w->arguments);
    free(w);
    if (close_after && ch->state == CHANNEL_STATE_OPEN)
        channel__finish_close(ch);
}

static void on_visible(struct visible_wait *visible)
{
    struct cluster_wait *w = CONTAINER_OF(visible, struct cluster_wait, visible);
    struct channel *ch = w->ch;
    ASSERT(ch->cluster_wait == w && w->visible_pending);
    ch->cluster_wait = NULL;
    connection_release(ch->connection);
    if (ch->state == CHANNEL_STATE_OPEN)
        send_reply(ch, w);
    finish(ch, w, ch->close_pending);
}

void channel__cluster_declare(struct channel *ch, struct map_queue_decl *decl, bool pinned,
                              int32_t backups, bool no_wait)
{
    struct map_cmd cmd;
    struct broker *broker = ch->connection->broker;
    member_place_queue(broker->member, decl, pinned, backups);
    if (map_cmd_queue_declare(&cmd, decl, cluster_node_id(broker->cluster)) != OK)
        return;
    channel__cluster_submit(ch, METHOD_QUEUE_DECLARE, no_wait, &cmd, decl->name, 0);
    struct cluster_wait *w = ch->cluster_wait;
    w->decl = *decl;
    w->decl.vhost = ch->vhost->name;
    w->arguments = bytes_dup((struct bytes){decl->arguments.ptr, decl->arguments.len});
    w->pinned = pinned;
    w->backups = backups;
}

void channel__cluster_submit(struct channel *ch, uint32_t method_id, bool no_wait,
                             struct map_cmd *cmd, struct bytes queue_name, uint32_t message_count)
{
    ASSERT(ch->cluster_wait == NULL); /* the connection is held while one waits */
    struct cluster_wait *w = calloc(1, sizeof *w);
    ASSERT(w != NULL);
    w->ch = ch;
    w->method_id = method_id;
    w->no_wait = no_wait;
    w->message_count = message_count;
    ASSERT(queue_name.len <= 255);
    memcpy(w->name, queue_name.ptr, queue_name.len);
    w->name_size = (uint8_t)queue_name.len;
    struct broker *broker = ch->connection->broker;
    ch->cluster_wait = w;
    connection_hold(ch->connection);
    w->request = cluster_node_submit(broker->cluster, cmd, on_committed, w);
}

void channel__cluster_forget(struct channel *ch)
{
    struct cluster_wait *w = ch->cluster_wait;
    if (w == NULL)
        return;
    ch->cluster_wait = NULL;
    if (w->method_id == METHOD_BASIC_QUAY_SYNC)
        member_sync_cancel(&w->sync);
    else if (w->visible_pending)
        visible_cancel(&w->visible);
    else
        cluster_request_cancel(w->request);
    connection_release(ch->connection);
    bytes_free(&w->arguments);
    free(w);
}

static void answer_synced(struct channel *ch, uint64_t version)
{
    struct method m = {.id = METHOD_BASIC_QUAY_SYNCED};
    m.basic_quay_synced.version = version;
    if (ch->state == CHANNEL_STATE_OPEN)
        channel__send(ch, &m);
}

static void on_synced_through(struct member_sync_wait *sync)
{
    struct cluster_wait *w = CONTAINER_OF(sync, struct cluster_wait, sync);
    struct channel *ch = w->ch;
    ASSERT(ch->cluster_wait == w);
    ch->cluster_wait = NULL;
    connection_release(ch->connection);
    if (w->answer)
        answer_synced(ch, member_map(ch->connection->broker->member)->version);
    free(w);
}

void channel__cluster_sync(struct channel *ch, uint64_t version, bool answer)
{
    ASSERT(ch->cluster_wait == NULL); /* the connection is held while one waits */
    struct broker *broker = ch->connection->broker;
    struct cluster_wait *w = calloc(1, sizeof *w);
    ASSERT(w != NULL);
    w->ch = ch;
    w->method_id = METHOD_BASIC_QUAY_SYNC;
    w->answer = answer;
    w->sync.done = on_synced_through;
    if (!member_sync_wait(broker->member, &w->sync, version)) {
        free(w);
        if (answer)
            answer_synced(ch, member_map(broker->member)->version); /* there already */
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
    struct map_queue_decl decl = {
        .vhost = ch->vhost->name, .name = stub->name, .durable = stub->durable,
        .auto_delete = stub->auto_delete,
        .arguments = {stub->arguments.ptr, (uint32_t)stub->arguments.len},
        .replaces_epoch = stub->remote_ops->epoch(stub)};
    channel__cluster_declare(ch, &decl, stub->auto_delete, stub->args.quay_backups,
                             ch->remote_no_wait);
}

/* Likewise for a delete: deleting a queue that is not there succeeds
 * (with no messages), and the map forgets that incarnation now (a refusal
 * means something replaced it already: the delete is done too). */
static void delete_gone(struct channel *ch, struct queue *stub)
{
    struct map_cmd cmd;
    if (map_cmd_queue_delete(&cmd, ch->vhost->name, stub->name, stub->remote_ops->epoch(stub)) != OK)
        return;
    channel__cluster_submit(ch, METHOD_QUEUE_DELETE, ch->remote_no_wait, &cmd, BYTES_LIT(""),
                            0);
    ch->cluster_wait->gone_ok = true;
}

static void on_query(void *ctx, struct queue *queue, uint16_t code, struct bytes text,
                     uint32_t messages, uint32_t consumers)
{
    struct channel *ch = ctx;
    uint32_t method_id = ch->remote_method;
    channel__remote_op_done(ch, queue);
    if (code == REPLY_NOT_FOUND && method_id == METHOD_QUEUE_DECLARE && !ch->remote_passive) {
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
            struct map_cmd cmd;
            if (map_cmd_queue_delete(&cmd, ch->vhost->name, queue->name, 0) == OK)
                channel__cluster_submit(ch, method_id, ch->remote_no_wait, &cmd,
                                        BYTES_LIT(""), messages);
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
    uint32_t ask = m->id == METHOD_QUEUE_PURGE ? METHOD_QUEUE_PURGE : METHOD_QUEUE_DECLARE;
    ch->remote_op = queue->remote_ops->query(queue, ask, on_query, ch);
    if (ch->remote_op == NULL) {
        channel__fail_unreachable(ch, queue, m->id);
        return;
    }
    ch->remote_method = m->id;
    ch->remote_no_wait = m->id == METHOD_QUEUE_DECLARE ? m->queue_declare.no_wait
                         : m->id == METHOD_QUEUE_PURGE ? m->queue_purge.no_wait
                                                       : m->queue_delete.no_wait;
    ch->remote_passive = m->id == METHOD_QUEUE_DECLARE && m->queue_declare.passive;
    ch->remote_if_unused = m->id == METHOD_QUEUE_DELETE && m->queue_delete.if_unused;
    ch->remote_if_empty = m->id == METHOD_QUEUE_DELETE && m->queue_delete.if_empty;
    ch->remote_queue = queue;
    queue_ref(queue);
    connection_hold(ch->connection);
}
