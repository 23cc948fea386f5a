/*
 * member_ops.c: the cluster's side of broker/cluster_ops.h, with the
 * member as its context. Most operations hand on to member.c; a
 * definition change a channel submits becomes a map command here (what
 * broker/channel_cluster.c did while the broker built map commands
 * itself): the command is submitted to the node, a queue placed on a
 * broker the map knows is down is placed again (at most
 * PLACEMENT_RETRIES_MAX times), and the channel is told once the command
 * is applied on this broker. Waiting for the other brokers (visible.h)
 * and for our own map (a peer's basic.quay-sync) are waits too.
 *
 * Must never answer a client itself: the broker's channel does, with the
 * answer given here.
 *
 * Memory: a struct cluster_ops_wait is allocated here and freed here,
 * after its done ran or when the broker cancels it.
 */
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "amqp/method_gen.h"
#include "broker/cluster_ops.h"
#include "cluster/events.h"
#include "cluster/link.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/visible.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"

#define PLACEMENT_RETRIES_MAX 3

enum wait_kind { WAIT_CHANGE, WAIT_VISIBLE, WAIT_SYNCED };

struct cluster_ops_wait {
    enum wait_kind kind;
    struct member *member;            /* borrowed */
    cluster_ops_done_fn done;
    void *ctx;
    struct cluster_request *request;  /* WAIT_CHANGE: owned by the node until it answers */
    struct visible_wait visible;      /* WAIT_VISIBLE */
    struct member_sync_wait sync;     /* WAIT_SYNCED */
    /* A queue.declare, to decide the placement again when the map says
     * the broker we chose is down (a stale view: change->retry). */
    bool is_queue_declare;
    struct map_queue_decl decl;       /* vhost, name and arguments point into the copies */
    uint8_t vhost[256];
    uint8_t name[256];
    struct bytes arguments;           /* owned copy */
    bool pinned;
    int32_t backups;
    uint8_t retries;
};

static struct cluster_ops_wait *wait_new(struct member *member, enum wait_kind kind,
                                         cluster_ops_done_fn done, void *ctx)
{
    struct cluster_ops_wait *w = xcalloc(1, sizeof *w);
    w->kind = kind;
    w->member = member;
    w->done = done;
    w->ctx = ctx;
    return w;
}

static void wait_free(struct cluster_ops_wait *w)
{
    bytes_free(&w->arguments);
    free(w);
}

/* ---- lifetime ---- */

static void ops_stop(void *cluster)
{
    struct member *member = cluster;
    member_stop(member);               /* closes the links; freed after the queues */
    cluster_node_stop(member->node);   /* frees itself once closed */
}

static void ops_free(void *cluster)
{
    member_free(cluster);
}

struct member *member_of(const struct broker *broker)
{
    return broker->cluster_ops == &member_cluster_ops ? broker->cluster_ctx : NULL;
}

struct cluster_node *member_node_of(const struct broker *broker)
{
    struct member *member = member_of(broker);
    return member != NULL && !member->stopping ? member->node : NULL;
}

/* ---- definition changes ---- */

static int build_exchange(struct member *member, const struct cluster_ops_change *c,
                          struct map_cmd *cmd)
{
    if (c->kind == CLUSTER_OPS_EXCHANGE_DELETE)
        return map_cmd_exchange_delete(cmd, c->vhost, c->name, c->if_unused);
    struct map_exchange_decl decl = {
        .vhost = c->vhost, .name = c->name, .type = c->type, .durable = c->durable,
        .auto_delete = c->auto_delete, .internal = c->internal, .arguments = c->arguments,
        .owner_id = cluster_node_id(member->node)};
    return map_cmd_exchange_declare(cmd, &decl);
}

static int build_binding(const struct cluster_ops_change *c, struct map_cmd *cmd)
{
    struct map_binding_decl decl = {
        .vhost = c->vhost, .source = c->source,
        .destination_kind = c->to_queue ? MAP_DESTINATION_QUEUE : MAP_DESTINATION_EXCHANGE,
        .destination = c->name, .routing_key = c->routing_key, .arguments = c->arguments};
    return c->kind == CLUSTER_OPS_BIND ? map_cmd_bind(cmd, &decl) : map_cmd_unbind(cmd, &decl);
}

/* Keeps what a queue.declare needs to be placed again (copies: the
 * change's slices are the channel's, valid during the call only). */
static void keep_queue_decl(struct cluster_ops_wait *w, const struct cluster_ops_change *c)
{
    ASSERT(c->vhost.len <= sizeof w->vhost && c->name.len <= sizeof w->name);
    memcpy(w->vhost, c->vhost.ptr, c->vhost.len);
    memcpy(w->name, c->name.ptr, c->name.len);
    w->is_queue_declare = true;
    w->decl = (struct map_queue_decl){
        .vhost = {w->vhost, c->vhost.len}, .name = {w->name, c->name.len},
        .durable = c->durable, .exclusive = c->exclusive, .auto_delete = c->auto_delete,
        .exclusive_connection_id = c->exclusive_connection_id, .replaces_epoch = c->epoch};
    w->arguments = bytes_dup((struct bytes){c->arguments.ptr, c->arguments.len});
    w->pinned = c->pinned;
    w->backups = c->backups;
}

/* Places the kept queue.declare on the map as it is now, and builds it. */
static int build_queue_declare(struct cluster_ops_wait *w, struct map_cmd *cmd)
{
    w->decl.arguments = (struct table){w->arguments.ptr, (uint32_t)w->arguments.len};
    member_place_queue(w->member, &w->decl, w->pinned, w->backups);
    return map_cmd_queue_declare(cmd, &w->decl, cluster_node_id(w->member->node));
}

static void on_committed(void *ctx, int status, const struct map_change *change)
{
    struct cluster_ops_wait *w = ctx;
    ASSERT(w->kind == WAIT_CHANGE);
    if (status == OK && change->retry && w->is_queue_declare &&
        w->retries < PLACEMENT_RETRIES_MAX) {
        /* Placed on a broker the map now knows is down: place again on
         * the map as it is now (the channel still holds its input). */
        w->retries++;
        struct map_cmd cmd;
        if (build_queue_declare(w, &cmd) == OK) {
            w->request = cluster_node_submit(w->member->node, &cmd, on_committed, w);
            return;
        }
    }
    struct cluster_ops_answer answer = {.status = status};
    if (status == OK) {
        answer.changed = change->changed;
        answer.reply_code = change->reply_code;
        answer.reply_text = change->reply_text;
        answer.version = change->version;
    }
    cluster_ops_done_fn done = w->done;
    void *done_ctx = w->ctx;
    wait_free(w); /* before done: the channel may submit again from it */
    done(done_ctx, &answer);
}

static struct cluster_ops_wait *ops_submit(void *cluster, const struct cluster_ops_change *c,
                                           cluster_ops_done_fn done, void *ctx)
{
    struct member *member = cluster;
    if (member->stopping)
        return NULL; /* the node is going: no client waits for it any more */
    struct cluster_ops_wait *w = wait_new(member, WAIT_CHANGE, done, ctx);
    struct map_cmd cmd;
    int rc;
    switch (c->kind) {
    case CLUSTER_OPS_EXCHANGE_DECLARE:
    case CLUSTER_OPS_EXCHANGE_DELETE: rc = build_exchange(member, c, &cmd); break;
    case CLUSTER_OPS_BIND:
    case CLUSTER_OPS_UNBIND: rc = build_binding(c, &cmd); break;
    case CLUSTER_OPS_QUEUE_DECLARE:
        keep_queue_decl(w, c);
        rc = build_queue_declare(w, &cmd);
        break;
    case CLUSTER_OPS_QUEUE_DELETE:
        rc = map_cmd_queue_delete(&cmd, c->vhost, c->name, c->epoch);
        break;
    default: ASSERT(false); rc = E_SYNTAX;
    }
    if (rc != OK) {
        wait_free(w);
        return NULL;
    }
    w->request = cluster_node_submit(member->node, &cmd, on_committed, w);
    return w;
}

/* ---- waits for the maps ---- */

/* version: what the answer says (basic.quay-synced tells the peer ours). */
static void finish_wait(struct cluster_ops_wait *w, uint64_t version)
{
    struct cluster_ops_answer answer = {.status = OK, .reply_code = 200, .version = version};
    cluster_ops_done_fn done = w->done;
    void *done_ctx = w->ctx;
    wait_free(w);
    done(done_ctx, &answer);
}

static void on_visible(struct visible_wait *visible)
{
    finish_wait(CONTAINER_OF(visible, struct cluster_ops_wait, visible), visible->version);
}

static struct cluster_ops_wait *ops_await_visible(void *cluster, uint64_t version,
                                                  cluster_ops_done_fn done, void *ctx)
{
    struct cluster_ops_wait *w = wait_new(cluster, WAIT_VISIBLE, done, ctx);
    w->visible.done = on_visible;
    if (visible_wait(cluster, &w->visible, version))
        return w;
    wait_free(w);
    return NULL;
}

static void on_synced_through(struct member_sync_wait *sync)
{
    struct cluster_ops_wait *w = CONTAINER_OF(sync, struct cluster_ops_wait, sync);
    finish_wait(w, member_map(w->member)->version);
}

static struct cluster_ops_wait *ops_await_synced(void *cluster, uint64_t version,
                                                 cluster_ops_done_fn done, void *ctx)
{
    struct cluster_ops_wait *w = wait_new(cluster, WAIT_SYNCED, done, ctx);
    w->sync.done = on_synced_through;
    if (member_sync_wait(cluster, &w->sync, version))
        return w;
    wait_free(w);
    return NULL;
}

static void ops_cancel(void *cluster, struct cluster_ops_wait *w)
{
    (void)cluster;
    switch (w->kind) {
    case WAIT_CHANGE: cluster_request_cancel(w->request); break;
    case WAIT_VISIBLE: visible_cancel(&w->visible); break;
    case WAIT_SYNCED: member_sync_cancel(&w->sync); break;
    }
    wait_free(w);
}

static uint64_t ops_map_version(void *cluster)
{
    return member_map(cluster)->version;
}

/* Once stopping, the node is going away (cluster_node_stop): the broker
 * then behaves as a single one would for these. */
static bool ops_synced(void *cluster)
{
    struct member *member = cluster;
    return member->stopping || cluster_node_synced(member->node);
}

static bool ops_paused(void *cluster)
{
    const struct member *member = cluster;
    return member->pause.paused;
}

static size_t ops_known_hosts(void *cluster, char *out, size_t cap)
{
    struct member *member = cluster;
    if (member->stopping)
        return 0;
    return events_known_hosts(cluster_node_map(member->node), out, cap);
}

static uint32_t ops_peers_expected(void *cluster)
{
    return member_peers_expected(cluster);
}

static void ops_queue_gone(void *cluster, struct bytes vhost, struct bytes name)
{
    member_queue_gone(cluster, vhost, name);
}

/* ---- peers' methods: straight to member.c ---- */

static void ops_propose_entry(void *cluster, const uint8_t *entry, uint64_t size)
{
    member_propose_entry(cluster, entry, size);
}

static bool ops_forward_fresh(void *cluster, struct bytes vhost, struct bytes queue,
                              uint64_t epoch)
{
    return member_forward_fresh(cluster, vhost, queue, epoch);
}

static bool ops_map_behind(void *cluster, struct bytes vhost, struct bytes queue,
                           uint64_t epoch)
{
    return member_map_behind(cluster, vhost, queue, epoch);
}

static void ops_park_forward(void *cluster, struct vhost *vhost, struct bytes queue,
                             uint64_t epoch, struct message *message,
                             struct confirm_sink *sink, uint64_t seq,
                             const struct queue_forwarded *f)
{
    member_park_forward(cluster, vhost, queue, epoch, message, sink, seq, f);
}

static bool ops_forward_relays(void *cluster, struct bytes vhost, struct bytes queue,
                               uint64_t epoch)
{
    return member_forward_relays(cluster, vhost, queue, epoch);
}

static bool ops_forward_gone(void *cluster, struct bytes vhost, struct bytes queue,
                             uint64_t epoch)
{
    return member_forward_gone(cluster, vhost, queue, epoch);
}

static bool ops_replica_push(void *cluster, struct vhost *vhost, struct bytes name,
                             uint64_t epoch, uint64_t seq, struct message *message,
                             uint64_t origin_stream, uint64_t origin_seq)
{
    return member_replica_push(cluster, vhost, name, epoch, seq, message, origin_stream,
                               origin_seq);
}

static void ops_replica_settle(void *cluster, struct vhost *vhost, struct bytes name,
                               uint64_t epoch, uint64_t seq, uint64_t seq_last)
{
    member_replica_settle(cluster, vhost, name, epoch, seq, seq_last);
}

static void ops_replica_reset(void *cluster, struct vhost *vhost, struct bytes name,
                              uint64_t epoch, uint64_t stream_version)
{
    member_replica_reset(cluster, vhost, name, epoch, stream_version);
}

static void ops_handover_notice(void *cluster, struct vhost *vhost, uint64_t connection_id,
                                uint16_t channel_id, struct bytes name, uint64_t epoch,
                                struct bytes delivered, struct bytes redelivered)
{
    member_handover_notice(cluster, vhost, connection_id, channel_id, name, epoch, delivered,
                           redelivered);
}

/* ---- what limits count (broker/usage.h) ---- */

static void ops_share_usage(void *cluster, struct table counts)
{
    struct member *member = cluster;
    if (member->stopping)
        return;
    struct method m = {.id = METHOD_BASIC_QUAY_USAGE};
    m.basic_quay_usage.broker = bytes_of_cstr(cluster_node_name(member->node));
    m.basic_quay_usage.counts = counts;
    for (uint32_t i = 0; i < member->peers_count; i++) {
        struct link_channel *ch = member_map_channel(member->peers[i]);
        if (ch != NULL)
            link_send(ch, &m);
    }
}

const struct cluster_ops member_cluster_ops = {
    .stop = ops_stop,
    .free = ops_free,
    .submit = ops_submit,
    .await_visible = ops_await_visible,
    .await_synced = ops_await_synced,
    .cancel = ops_cancel,
    .map_version = ops_map_version,
    .synced = ops_synced,
    .paused = ops_paused,
    .known_hosts = ops_known_hosts,
    .share_usage = ops_share_usage,
    .peers_expected = ops_peers_expected,
    .queue_gone = ops_queue_gone,
    .propose_entry = ops_propose_entry,
    .forward_fresh = ops_forward_fresh,
    .map_behind = ops_map_behind,
    .park_forward = ops_park_forward,
    .forward_relays = ops_forward_relays,
    .forward_gone = ops_forward_gone,
    .replica_push = ops_replica_push,
    .replica_settle = ops_replica_settle,
    .replica_reset = ops_replica_reset,
    .handover_notice = ops_handover_notice,
};
