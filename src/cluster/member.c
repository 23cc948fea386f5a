/*
 * member.c: see member.h. The node's hooks, the links to the peers (one
 * per other broker in the map, following its AMQP address), placement of
 * new queues, and the two ends of a forwarded map entry.
 */
#include "cluster/member.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "amqp/table.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/connection.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/usage.h"
#include "broker/vhost.h"
#include "cluster/adoption.h"
#include "cluster/controller.h"
#include "cluster/fence.h"
#include "cluster/handover.h"
#include "cluster/link.h"
#include "cluster/mirror.h"
#include "cluster/moves.h"
#include "cluster/node.h"
#include "cluster/proxy.h"
#include "cluster/replica.h"
#include "cluster/replication.h"
#include "cluster/visible.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "lib/json.h"
#include "lib/json_read.h"
#include "lib/http_status.h"

/* ---- peers and their links ---- */

static void on_link_up(void *ctx, struct link *link)
{
    struct member_peer *peer = ctx;
    (void)link;
    peer->up = true;
    peer->synced_version = 0; /* a new connection: a restarted peer may lag */
    LOG_INFO("cluster: link to broker %u (%s) is up", peer->id, peer->address);
    proxy_peer_up(peer);
    usage_changed(peer->member->broker, NULL); /* it counts our clients from now */
}

static void on_link_down(void *ctx, struct link *link)
{
    struct member_peer *peer = ctx;
    (void)link;
    bool was_up = peer->up;
    peer->up = false;
    peer->map_channel = NULL; /* closed with the link */
    visible_peer_lost(peer);
    if (was_up) {
        LOG_INFO("cluster: link to broker %u (%s) is down", peer->id, peer->address);
        if (!peer->member->stopping)
            cluster_node_peer_lost(peer->member->node, peer->id);
    }
    proxy_peer_down(peer);
}

static void peer_free(struct member_peer *peer)
{
    proxy_peer_down(peer);
    if (peer->link)
        link_free(peer->link);
    free(peer);
}

static struct member_peer *peer_new(struct member *member, const struct map_broker *b)
{
    struct member_peer *peer = xcalloc(1, sizeof *peer);
    peer->id = b->id;
    peer->map_state = b->state;
    peer->member = member;
    list_init(&peer->forwarders);
    snprintf(peer->address, sizeof peer->address, "%.*s", (int)b->amqp_address.len,
             (const char *)b->amqp_address.ptr);
    struct cluster_node *node = member->node;
    struct link_config config = {
        .address = peer->address,
        .self_name = cluster_node_name(node),
        .secret = cluster_node_secret(node),
        .tls = member->broker->cluster_tls.ctx != NULL ? &member->broker->cluster_tls : NULL,
    };
    struct link_ops ops = {.ctx = peer, .up = on_link_up, .down = on_link_down};
    if (link_new(&peer->link, &member->broker->net, &config, &ops) != OK) {
        LOG_ERROR("cluster: cannot link to broker %u at %s", b->id, peer->address);
        peer->link = NULL;
    }
    return peer;
}

static void on_map_reply(void *ctx, const struct method *m)
{
    struct member_peer *peer = ctx;
    if (m->id == METHOD_BASIC_QUAY_SYNCED)
        visible_peer_answered(peer, m->basic_quay_synced.version);
}

static void on_map_closed(void *ctx, uint16_t reply_code, struct bytes reply_text)
{
    struct member_peer *peer = ctx;
    if (reply_code != 0)
        LOG_WARN("cluster: broker %u closed our map channel: %u %.*s", peer->id, reply_code,
                 (int)reply_text.len, (const char *)reply_text.ptr);
    peer->map_channel = NULL;
    visible_peer_lost(peer);
}

struct link_channel *member_map_channel(struct member_peer *peer)
{
    if (peer->map_channel == NULL && peer->up && link_is_up(peer->link)) {
        static const struct link_channel_ops ops_template = {
            .reply = on_map_reply, .closed = on_map_closed};
        struct link_channel_ops ops = ops_template;
        ops.ctx = peer;
        peer->map_channel = link_channel_open(peer->link, BYTES_LIT("/"), false, &ops);
    }
    return peer->map_channel;
}

struct member_peer *member_peer(struct member *member, uint32_t broker_id)
{
    for (uint32_t i = 0; i < member->peers_count; i++) {
        if (member->peers[i]->id == broker_id)
            return member->peers[i];
    }
    return NULL;
}

/* One link per other broker of the map, to its current AMQP address. */
void member__sync_peers(struct member *member)
{
    if (member->stopping)
        return;
    const struct cluster_map *map = member_map(member);
    for (uint32_t i = 0; i < member->peers_count;) {
        struct member_peer *peer = member->peers[i];
        const struct map_broker *b = cluster_map_broker(map, peer->id);
        /* Gone, moved, or back up while our link still waits out its
         * backoff: a fresh link connects at once. */
        bool back = b != NULL && b->state == BROKER_STATE_UP &&
                    peer->map_state != BROKER_STATE_UP && !peer->up;
        if (b == NULL || !bytes_equal_cstr(b->amqp_address, peer->address) || back) {
            member->peers[i] = member->peers[--member->peers_count];
            peer_free(peer);
            continue;
        }
        peer->map_state = b->state;
        i++;
    }
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        if (b->id == member->self_id || member_peer(member, b->id) != NULL)
            continue;
        ASSERT(member->peers_count < CLUSTER_BROKERS_MAX);
        member->peers[member->peers_count++] = peer_new(member, b);
    }
}

/* ---- the node's hooks ---- */

/* ---- peers waiting for our map (basic.quay-sync) ---- */

/* Ends the waits whose version the map has reached (every one, if all). */
static void end_sync_waits(struct member *member, bool all)
{
    uint64_t version = member_map(member)->version;
    uint64_t now = uv_now(member->broker->loop);
    list_for_each_safe(n, &member->sync_waits) {
        struct member_sync_wait *w = CONTAINER_OF(n, struct member_sync_wait, link);
        bool late = now >= w->deadline_ms;
        if (!all && w->version > version && !late)
            continue;
        if (late && w->version > version)
            LOG_WARN("cluster: a peer's requests waited %u ms for map version %llu (we are at "
                     "%llu): served as we are", MEMBER_SYNC_WAIT_MS,
                     (unsigned long long)w->version, (unsigned long long)version);
        list_remove(&w->link);
        w->done(w);
    }
}

bool member_sync_wait(struct member *member, struct member_sync_wait *w, uint64_t version)
{
    if (member->stopping || member_map(member)->version >= version)
        return false;
    w->version = version;
    w->deadline_ms = uv_now(member->broker->loop) + MEMBER_SYNC_WAIT_MS;
    list_push_back(&member->sync_waits, &w->link);
    return true;
}

void member_sync_cancel(struct member_sync_wait *w)
{
    if (w->link.next != NULL && list_linked(&w->link))
        list_remove(&w->link);
}

static void on_applied(void *ctx, int rc, const struct map_change *change)
{
    struct member *member = ctx;
    if (member->stopping)
        return;
    if (change == NULL) {
        mirror_all(member, cluster_node_synced(member->node));
        return;
    }
    if (rc == OK)
        mirror_change(member, change);
    if (!list_empty(&member->parked))
        member__route_parked(member, false);
    if (!list_empty(&member->sync_waits))
        end_sync_waits(member, false);
}

/* Clients held back until we caught up with the map may open once the
 * transient queues and exchanges this restart lost are gone from it too:
 * each deletion in flight holds them (member__hold_clients). */
void member__hold_clients(struct member *member)
{
    member->transients_pending++;
}

void member__release_clients(struct member *member)
{
    ASSERT(member->transients_pending > 0);
    if (--member->transients_pending == 0 && !member->stopping)
        connection_cluster_synced(member->broker);
}

static void on_transient_gone(void *ctx, int status, const struct map_change *change)
{
    (void)status;
    (void)change;
    member__release_clients(ctx);
}

static void submit_transient_delete(struct member *member, struct map_cmd *cmd, int rc)
{
    if (rc != OK)
        return;
    member__hold_clients(member);
    cluster_node_submit(member->node, cmd, on_transient_gone, member);
}

/* A restarted broker that is still the owner of a non-durable exchange
 * it got before its restart was not replaced while it was away (the
 * controller moves a dead broker's exchanges in well under a second): the
 * whole cluster restarted, or it alone did, and what was not durable is
 * gone, as in RabbitMQ (transient exchanges go with the whole cluster).
 * So the map forgets them too. What the cluster gave us since we are back
 * (declared elsewhere once we were up again) is ours to keep. Our
 * non-durable queues are decided one by one when they wake at the sync
 * (mirror.c drop_after_restart), as they may have survived in a backup. */
static void drop_transient_exchanges(struct member *member)
{
    const struct cluster_map *map = member_map(member);
    uint64_t restart = cluster_node_restart_version(member->node);
    struct map_cmd cmd;
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        if (x->durable || x->owner_id != member->self_id || x->owned_since > restart)
            continue;
        LOG_INFO("cluster: transient exchange '%.*s' did not survive our restart: deleted",
                 (int)x->name.len, (const char *)x->name.ptr);
        submit_transient_delete(member, &cmd,
                                map_cmd_exchange_delete(&cmd, x->vhost->name, x->name, false));
    }
}

static void on_storage_done(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    if (status != OK || change->reply_code != 200)
        LOG_WARN("cluster: our shared storage was not recorded in the map (%s)",
                 status != OK ? "map unavailable" : change->reply_text);
}

/* The map says which storage we share (broker.storage), so that the
 * controller gives our queues to brokers that can read our logs. */
void member__announce_storage(struct member *member)
{
    const char *id = member->broker->config.storage_id;
    struct bytes want = id != NULL ? bytes_of_cstr(id) : (struct bytes){NULL, 0};
    const struct map_broker *self = cluster_map_broker(member_map(member), member->self_id);
    if (self == NULL || bytes_equal(self->storage_id, want))
        return;
    struct map_cmd cmd;
    if (map_cmd_broker_storage(&cmd, member->self_id, want) == OK)
        cluster_node_submit(member->node, &cmd, on_storage_done, member);
}

static void on_synced(void *ctx)
{
    struct member *member = ctx;
    if (member->stopping)
        return;
    member->synced_ms = uv_now(member->broker->loop);
    member__announce_storage(member);
    mirror_all(member, true);
    /* What our journal recovered of queues that the present map gave
     * elsewhere (a backup's replica logs, most of all) went: tens of MB
     * that the allocator would keep. */
    alloc_release_free_pages();
    adoption_sweep_staged(member);
    adoption_resume_leftovers(member); /* (before clients may publish to them) */
    adoption_synced(member);           /* what the replay handed it, if still ours */
    drop_transient_exchanges(member);
    if (member->transients_pending == 0)
        connection_cluster_synced(member->broker); /* clients held back may open now */
}

static bool on_forward(void *ctx, uint32_t leader_id, const uint8_t *entry, size_t size)
{
    struct member *member = ctx;
    struct member_peer *peer = member_peer(member, leader_id);
    /* (The link may be going down right now, its channels being freed:
     * this can run from their closed callbacks.) */
    if (peer == NULL || member_map_channel(peer) == NULL)
        return false; /* the node sends it again */
    struct basic_properties none = {0};
    static const uint8_t no_properties[2] = {0, 0}; /* property flags: none */
    struct message *m = message_new(BYTES_LIT(""), BYTES_LIT(""), no_properties, 2, &none, size);
    ASSERT(m != NULL);
    memcpy(m->body, entry, size);
    m->body_received = size;
    uint8_t targets[64];
    struct table_writer w;
    table_writer_init(&w, targets, sizeof targets);
    table_put_int(&w, MEMBER_MAP_TARGET, 0);
    ASSERT(!w.overflow);
    struct method fwd = {.id = METHOD_BASIC_QUAY_FORWARD};
    fwd.basic_quay_forward.targets = table_writer_table(&w);
    link_send_content(peer->map_channel, &fwd, m);
    message_unref(m);
    return true;
}

void member_propose_entry(struct member *member, const uint8_t *entry, uint64_t size)
{
    int rc = cluster_node_propose_entry(member->node, entry, (size_t)size);
    if (rc != OK)
        LOG_DEBUG("cluster: forwarded map entry not proposed (%s, %d)", error_name(rc), rc);
}

bool member_forward_fresh(struct member *member, struct bytes vhost, struct bytes queue,
                          uint64_t epoch)
{
    return fence_forward_fresh(cluster_map_queue(member_map(member), vhost, queue),
                               member->self_id, epoch);
}

bool member_forward_gone(const struct member *member, struct bytes vhost, struct bytes queue,
                         uint64_t epoch)
{
    const struct cluster_map *map = member_map(member);
    return fence_forward_gone(map, cluster_map_queue(map, vhost, queue), epoch);
}

bool member_forward_relays(const struct member *member, struct bytes vhost, struct bytes queue,
                           uint64_t epoch)
{
    return fence_forward_relays(cluster_map_queue(member_map(member), vhost, queue),
                                member->self_id, epoch) && !member->stopping;
}

/* ---- forwards that arrived before our map had their queue ---- */

/* Parked until the map reaches the forward's epoch. Owned by the member. */
struct parked_forward {
    struct list_node link;
    struct bytes vhost, queue;   /* owned copies */
    uint64_t epoch;
    struct message *message;     /* one reference */
    struct confirm_sink *sink;   /* one reference, or NULL */
    uint64_t seq;
    /* Its origin, kept so that a resend meets the queue's marks and is
     * flagged as any resend (queue_publish_forward); never recorded: the
     * stream's later forwards may have been taken before it. */
    struct queue_forwarded forward;
};

bool member_map_behind(const struct member *member, struct bytes vhost, struct bytes queue,
                       uint64_t epoch)
{
    if (member->stopping)
        return false;
    const struct cluster_map *map = member_map(member);
    return fence_map_behind(map, cluster_map_queue(map, vhost, queue), epoch);
}

void member_park_forward(struct member *member, struct vhost *vhost, struct bytes queue,
                         uint64_t epoch, struct message *message, struct confirm_sink *sink,
                         uint64_t seq, const struct queue_forwarded *f)
{
    struct parked_forward *p = xcalloc(1, sizeof *p);
    p->vhost = bytes_dup(vhost->name);
    p->queue = bytes_dup(queue);
    p->epoch = epoch;
    p->message = message;
    message_ref(message);
    p->sink = sink;
    if (sink)
        confirm_sink_ref(sink);
    p->seq = seq;
    p->forward = *f;
    p->forward.record = false;
    list_push_back(&member->parked, &p->link);
}

static void parked_free(struct parked_forward *p)
{
    list_remove(&p->link);
    bytes_free(&p->vhost);
    bytes_free(&p->queue);
    message_unref(p->message);
    if (p->sink)
        confirm_sink_unref(p->sink);
    free(p);
}

/* After each apply: route what the map now allows (or refuse it for good
 * once the map has passed its epoch without making the queue ours). */
void member__route_parked(struct member *member, bool give_up)
{
    list_for_each_safe(n, &member->parked) {
        struct parked_forward *p = CONTAINER_OF(n, struct parked_forward, link);
        if (!give_up && member_map_behind(member, p->vhost, p->queue, p->epoch))
            continue;
        struct vhost *vhost = broker_vhost(member->broker, p->vhost);
        struct queue *queue = vhost ? vhost_queue(vhost, p->queue) : NULL;
        bool fresh = !give_up && queue != NULL && !queue_is_remote(queue) &&
                     member_forward_fresh(member, p->vhost, p->queue, p->epoch);
        /* Deleted meanwhile: routed to a queue that then went, confirmed
         * (channel.c channel__route_forward). */
        bool ok = fresh || (!give_up && member_forward_gone(member, p->vhost, p->queue,
                                                            p->epoch));
        struct publish_wait wait = {.sink = p->sink, .seq = p->seq, .from_peer = true};
        if (fresh) {
            enum queue_publish_result r = queue_publish_forward(queue, p->message, &p->forward,
                                                                &wait);
            ok = r != QUEUE_PUBLISH_REJECTED && r != QUEUE_PUBLISH_UNAVAILABLE;
        }
        if (p->sink)
            confirm_sink_routed(p->sink, p->seq, &wait, !ok);
        parked_free(p);
    }
}

/* ---- placement and local decisions ---- */

void member_place_queue(struct member *member, struct map_queue_decl *decl, bool pinned,
                        int32_t backups)
{
    if (backups < 0) {
        /* No x-quay-backups: the vhost's best matching policy, else the
         * default (broker/policy.h). */
        const struct policy *policy =
            cluster_map_policy_for(member_map(member), decl->vhost, decl->name);
        backups = policy_effective_backups(-1, policy, member->default_backups);
    }
    /* Where its primary goes: a queue that lives with its connection
     * (exclusive, auto-delete, server-named) stays here, unless this
     * broker places every queue on the others (--queue-locator others). */
    enum placement_primary how = PLACEMENT_PRIMARY_RING;
    if (member->broker->config.queue_locator == QUEUE_LOCATOR_OTHERS)
        how = PLACEMENT_PRIMARY_AVOID;
    else if (pinned)
        how = PLACEMENT_PRIMARY_AT;
    if (decl->exclusive) { /* its connection is ours, wherever the queue lives */
        decl->exclusive_owner_id = member->self_id;
        decl->exclusive_connection_id =
            member_connection_key(member, decl->exclusive_connection_id);
    }
    if ((decl->exclusive && how == PLACEMENT_PRIMARY_AT) || backups > CLUSTER_BACKUPS_MAX)
        backups = 0; /* it dies with its connection (this broker) anyway */
    decl->replication_factor = (uint8_t)(1 + backups);
    placement_refresh(&member->placement, member_map(member));
    struct placement_result result;
    if (placement_place_queue(&member->placement, decl->vhost, decl->name,
                              decl->replication_factor, how, member->self_id, &result) != OK) {
        decl->primary_id = member->self_id;
        decl->backups_count = 0;
        return;
    }
    decl->primary_id = result.primary_id;
    memcpy(decl->backup_ids, result.backup_ids, sizeof decl->backup_ids);
    decl->backups_count = result.backups_count;
}

uint32_t member_peers_expected(const struct member *member)
{
    const struct cluster_map *map = member_map(member);
    uint32_t n = 0;
    for (uint32_t i = 0; i < map->brokers_count; i++)
        n += map->brokers[i]->id != member->self_id && map->brokers[i]->state != BROKER_STATE_DOWN;
    return n;
}

#define CONNECTION_KEY_ID_BITS 40

uint64_t member_connection_key(const struct member *member, uint64_t connection_id)
{
    uint64_t id_mask = (UINT64_C(1) << CONNECTION_KEY_ID_BITS) - 1;
    ASSERT((connection_id & id_mask) != 0);
    /* 23 bits of incarnation: the map reads the key as a non-negative int64. */
    uint64_t incarnation = member->incarnation & ((UINT64_C(1) << 23) - 1);
    return incarnation << CONNECTION_KEY_ID_BITS | (connection_id & id_mask);
}

static void on_in_sync_done(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    if (status != OK || change->reply_code != 200)
        LOG_WARN("cluster: a backup's in-sync state did not change (%s)",
                 status != OK ? "map unavailable" : change->reply_text);
}

bool member_set_in_sync(struct member *member, struct queue *queue, uint64_t epoch,
                        const uint32_t *ids, const uint32_t *incarnations, uint8_t n,
                        bool partial)
{
    if (member->stopping)
        return false;
    const struct map_queue *q = cluster_map_queue(member_map(member), queue->vhost->name,
                                                  queue->name);
    if (q == NULL || q->epoch != epoch)
        return false; /* moved on: the map change on its way says what now */
    uint8_t mask = 0;
    for (uint8_t i = 0; i < n; i++) {
        for (uint8_t slot = 0; slot < q->backups_count; slot++) {
            if (q->backup_ids[slot] == ids[i])
                mask |= (uint8_t)(1u << slot);
        }
    }
    if (mask == q->in_sync_mask)
        return false;
    struct map_cmd cmd;
    int rc = partial ? map_cmd_queue_set_in_sync_partial(&cmd, queue->vhost->name, queue->name,
                                                         epoch, ids, incarnations, n)
                     : map_cmd_queue_set_in_sync(&cmd, queue->vhost->name, queue->name, epoch,
                                                 ids, incarnations, n);
    if (rc != OK)
        return false;
    (void)map_cmd_set_reason(&cmd, MAP_REASON_SYNC);
    cluster_node_submit(member->node, &cmd, on_in_sync_done, member);
    return true;
}

/* The stand-in of a queue whose primary streams to us, at an epoch we
 * accept, into a copy we keep (fence_replica_accepts): stream_version is
 * the map version the primary started the stream under, a reset's, or
 * the one our copy remembers from its last (0: none). Our map may not list
 * us as its backup yet: the primary acts on a change (a promotion, new
 * backups) as soon as it applied it, and ours may lag. */
static struct queue *replica_target(struct member *member, struct vhost *vhost,
                                    struct bytes name, uint64_t epoch,
                                    const uint64_t *stream_version)
{
    const struct cluster_map *map = member_map(member);
    const struct map_queue *q = cluster_map_queue(map, vhost->name, name);
    struct queue *queue = vhost_queue(vhost, name);
    if (q == NULL || queue == NULL || !queue_is_remote(queue))
        return NULL;
    uint64_t version = stream_version != NULL
                           ? *stream_version
                           : replica_stream_version(proxy_stub_replica(queue, false));
    return fence_replica_accepts(q, member->self_id, epoch, map->version, version) ? queue
                                                                                   : NULL;
}

bool member_replica_push(struct member *member, struct vhost *vhost, struct bytes name,
                         uint64_t epoch, uint64_t seq, struct message *message,
                         uint64_t origin_stream, uint64_t origin_seq)
{
    struct queue *queue = replica_target(member, vhost, name, epoch, NULL);
    if (queue == NULL)
        return false;
    /* Paged where the primary pages it (not a priority queue: an adopted
     * paged entry must find its level without its message). */
    bool page = queue->args.max_priority == 0 && queue_pages(queue);
    struct replica *r = proxy_stub_replica(queue, true);
    uint64_t now = uv_now(member->broker->loop);
    bool ok = replica_push(r, epoch, seq, message, now, page);
    if (ok)
        replica_record_origin(r, origin_stream, origin_seq, now);
    else if (seq == 0) /* a verify (replica.h): the primary catches us up */
        LOG_INFO("vhost=%.*s queue=%.*s: our replica differs from what the new primary "
                 "adopted (%u messages here): to be caught up again",
                 (int)vhost->name.len, (const char *)vhost->name.ptr, (int)name.len,
                 (const char *)name.ptr, replica_count(r));
    return ok;
}

void member_replica_settle(struct member *member, struct vhost *vhost, struct bytes name,
                           uint64_t epoch, uint64_t seq, uint64_t seq_last)
{
    if (seq == 0)
        return; /* no message has seq 0 (a reset is the purge flag's) */
    struct queue *queue = replica_target(member, vhost, name, epoch, NULL);
    struct replica *r = queue ? proxy_stub_replica(queue, false) : NULL;
    if (r)
        replica_remove_run(r, seq, seq_last > seq ? seq_last : seq);
}

void member_replica_reset(struct member *member, struct vhost *vhost, struct bytes name,
                          uint64_t epoch, uint64_t stream_version)
{
    struct queue *queue = replica_target(member, vhost, name, epoch, &stream_version);
    if (queue != NULL) /* (made here: it keeps the version, before any push) */
        replica_reset(proxy_stub_replica(queue, true), stream_version);
}

void member_handover_notice(struct member *member, struct vhost *vhost, uint64_t connection_id,
                            uint16_t channel_id, struct bytes name, uint64_t epoch,
                            struct bytes delivered, struct bytes redelivered)
{
    struct queue *queue = replica_target(member, vhost, name, epoch, NULL);
    struct replica *r = queue ? proxy_stub_replica(queue, false) : NULL;
    if (r && !replica_note_handover(r, connection_id, channel_id, epoch, delivered, redelivered))
        LOG_WARN("vhost=%.*s queue=%.*s: a malformed handover notice from its primary: ignored",
                 (int)vhost->name.len, (const char *)vhost->name.ptr, (int)name.len,
                 (const char *)name.ptr);
}

static void on_gone_done(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    (void)change;
    /* A refusal (another broker's declare replaced that incarnation, or a
     * deletion of it came first) leaves nothing to do. */
    if (status != OK)
        LOG_WARN("cluster: a local queue deletion did not reach the map (it will be retried "
                 "when the map is reconciled)");
}

void member_queue_gone(struct member *member, struct bytes vhost, struct bytes name)
{
    if (member->stopping)
        return;
    /* The incarnation we had is the map's present one: only it goes (a
     * declare that replaced it since, through another broker, stays). */
    const struct map_queue *q = cluster_map_queue(member_map(member), vhost, name);
    if (q == NULL)
        return; /* the map never had it, or forgot it already */
    struct map_cmd cmd;
    if (map_cmd_queue_delete(&cmd, vhost, name, q->epoch) != OK)
        return;
    cluster_node_submit(member->node, &cmd, on_gone_done, member);
}

static void on_vhost_done(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    (void)change;
    if (status != OK)
        LOG_WARN("cluster: a vhost could not be published to the map (retried at the next "
                 "reconcile)");
}

void member__publish_vhost(struct member *member, struct bytes vhost)
{
    struct map_cmd cmd;
    if (map_cmd_vhost_put(&cmd, vhost) == OK)
        cluster_node_submit(member->node, &cmd, on_vhost_done, member);
}

/* ---- leaving the cluster ---- */

static void on_leave_done(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    if (status != OK)
        LOG_WARN("cluster: leaving: the map is unavailable; POST /api/cluster/leave again");
    else if (change->reply_code != 200)
        LOG_WARN("cluster: leaving refused: %u %s", change->reply_code, change->reply_text);
    else
        LOG_INFO("cluster: this broker has left the cluster map; it can be stopped");
}

void member_write_links_json(void *ctx, struct json *out)
{
    struct member *member = ctx;
    const struct cluster_map *map = member_map(member);
    json_object_begin(out);
    json_key(out, "links");
    json_array_begin(out);
    for (uint32_t i = 0; i < member->peers_count; i++) {
        const struct member_peer *peer = member->peers[i];
        struct link_stats stats;
        link_get_stats(peer->link, &stats);
        const struct map_broker *b = cluster_map_broker(map, peer->id);
        json_object_begin(out);
        json_kv_uint(out, "id", peer->id);
        json_key(out, "name");
        if (b)
            json_string_n(out, (const char *)b->name.ptr, b->name.len);
        else
            json_null(out);
        json_kv_string(out, "address", peer->address);
        json_kv_bool(out, "up", peer->up);
        json_kv_uint(out, "inflight_bytes", peer->forward_bytes);
        json_kv_bool(out, "flow", peer->forward_flow);
        json_kv_uint(out, "bytes_out", stats.bytes_out);
        json_kv_uint(out, "frames_out", stats.frames_out);
        json_kv_uint(out, "bytes_in", stats.bytes_in);
        json_kv_uint(out, "frames_in", stats.frames_in);
        json_kv_uint(out, "connects", stats.connects);
        json_object_end(out);
    }
    json_array_end(out);
    json_kv_uint(out, "inflight_bytes", member->forward_bytes);
    json_kv_bool(out, "flow", member->forward_flow_peers > 0);
    json_object_end(out);
}

int member_leave(void *ctx, const char *request, size_t request_size, struct json *body)
{
    struct member *member = ctx;
    (void)request; /* no parameters */
    (void)request_size;
    const struct cluster_map *map = member_map(member);
    int refused = member_api_begin(member, body);
    if (refused != 0)
        return refused;
    uint32_t owned = 0, held = 0;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        owned += q->primary_id == member->self_id;
        held += map_queue_has_backup(q, member->self_id);
    }
    if (owned > 0 || held > 0) {
        /* Their messages live here: they move first (drain). */
        char text[160];
        snprintf(text, sizeof text,
                 "this broker is the primary of %u queue(s) and a backup of %u: delete or "
                 "drain them first", owned, held);
        json_kv_uint(body, "queues", owned);
        return member_api_error(body, 409, text);
    }
    /* Exchange definitions are everyone's: their nominal owner moves. */
    uint32_t heir = BROKER_ID_NONE;
    for (uint32_t i = 0; i < map->brokers_count && heir == BROKER_ID_NONE; i++) {
        if (map->brokers[i]->id != member->self_id && map->brokers[i]->state == BROKER_STATE_UP)
            heir = map->brokers[i]->id;
    }
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *x = map->exchanges[i];
        struct map_cmd cmd;
        if (x->owner_id == member->self_id && heir != BROKER_ID_NONE &&
            map_cmd_exchange_set_owner(&cmd, x->vhost->name, x->name, heir) == OK)
            cluster_node_submit(member->node, &cmd, on_leave_done, member);
    }
    struct map_cmd cmd;
    if (map_cmd_broker_leave(&cmd, member->self_id) == OK) {
        (void)map_cmd_set_reason(&cmd, MAP_REASON_LEAVE); /* small: fits */
        cluster_node_submit(member->node, &cmd, on_leave_done, member);
    }
    LOG_INFO("cluster: leaving the cluster (asked through the management API)");
    json_kv_string(body, "leaving", cluster_node_name(member->node));
    json_object_end(body);
    return 202;
}

/* ---- forgetting a dead broker ---- */

/* The steps before broker.leave: a refusal shows in broker.leave's. */
static void on_forget_step(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    (void)status;
    (void)change;
}

static void on_forgotten(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    if (status != OK)
        LOG_WARN("cluster: forgetting a broker: the map is unavailable; POST "
                 "/api/cluster/forget again");
    else if (change->reply_code != 200)
        LOG_WARN("cluster: forgetting broker %u refused: %u %s (the map moved meanwhile: POST "
                 "/api/cluster/forget again)", change->broker_id, change->reply_code,
                 change->reply_text);
    else if (change->changed)
        LOG_INFO("cluster: broker %u is forgotten: out of the map, out of Raft next",
                 change->broker_id);
}

struct broker_request {
    char broker[CLUSTER_NAME_SIZE_MAX + 1];
    bool named;
};

static bool read_broker_member(void *ctx, const struct json_read_member *m, char *err,
                               size_t err_size)
{
    struct broker_request *r = ctx;
    if (strcmp(m->key, "broker") != 0) {
        snprintf(err, err_size, "unknown member '%s' (expected: broker)", m->key);
        return false;
    }
    if (m->kind != JSON_READ_STRING || m->string_size == 0 ||
        m->string_size > CLUSTER_NAME_SIZE_MAX ||
        memchr(m->string, '\0', m->string_size) != NULL) {
        snprintf(err, err_size, "broker: a broker's name, 1..%d bytes", CLUSTER_NAME_SIZE_MAX);
        return false;
    }
    memcpy(r->broker, m->string, m->string_size + 1);
    r->named = true;
    return true;
}

void member_cluster_json(void *ctx, struct json *body)
{
    struct member *member = ctx;
    json_object_begin(body);
    cluster_node_write_fields(member->node, body);
    moves_write_json(member, body);
    json_object_end(body);
}

void member_events_json(void *ctx, struct json *body)
{
    struct member *member = ctx;
    json_object_begin(body);
    cluster_node_write_events(member->node, body);
    json_object_end(body);
}

int member_api_begin(struct member *member, struct json *body)
{
    json_object_begin(body);
    if (member->stopping || !cluster_node_synced(member->node))
        return member_api_error(body, 503, "not serving the cluster yet (or stopping): try again");
    return 0;
}

int member_api_error(struct json *body, int status, const char *text)
{
    json_kv_string(body, "error", http_status_text(status));
    json_kv_string(body, "reason", text);
    json_object_end(body);
    return status;
}

const struct map_broker *member_api_broker(const struct member *member, const char *request,
                                           size_t request_size, struct json *body,
                                           int *status)
{
    const struct cluster_map *map = member_map(member);
    struct broker_request r = {0};
    char err[256];
    if (json_read_object(request, request_size, read_broker_member, &r, err, sizeof err) != OK) {
        *status = member_api_error(body, 400, err);
        return NULL;
    }
    if (!r.named) {
        *status = member_api_error(body, 400, "expected {\"broker\": NAME}");
        return NULL;
    }
    const struct map_broker *b = cluster_map_broker_named(map, r.broker);
    if (b != NULL)
        return b;
    char text[512];
    snprintf(text, sizeof text, "no broker '%s' in the cluster", r.broker);
    *status = member_api_error(body, 404, text);
    return NULL;
}

int member_forget(void *ctx, const char *request, size_t request_size, struct json *body)
{
    struct member *member = ctx;
    const struct cluster_map *map = member_map(member);
    int refused = member_api_begin(member, body);
    if (refused != 0)
        return refused;
    int status;
    const struct map_broker *b = member_api_broker(member, request, request_size, body, &status);
    if (b == NULL)
        return status;
    int name_len = (int)b->name.len;
    const char *name = (const char *)b->name.ptr;
    char text[512];
    struct map_cmd_list list;
    map_cmd_list_init(&list);
    struct controller_forget_report report;
    controller_forget(map, cluster_node_controller_config(member->node), b->id, &list, &report);
    map_cmd_list_set_reason(&list, 0, MAP_REASON_FORGET);
    switch (report.refusal) {
    case CONTROLLER_FORGET_OK:
        break;
    case CONTROLLER_FORGET_NOT_DOWN:
        snprintf(text, sizeof text, "broker '%.*s' is %s, not down: stop it first (forget is for "
                 "a broker dead for good; drain one that runs)", name_len, name,
                 broker_state_name(b->state));
        return member_api_error(body, 409, text);
    case CONTROLLER_FORGET_NO_ROOM:
        return member_api_error(body, 409, "no broker is up to take its queues");
    case CONTROLLER_FORGET_UNKNOWN:
        return member_api_error(body, 404, "no such broker");
    }
    ASSERT(list.count > 0); /* broker.leave comes last */
    for (uint32_t i = 0; i < list.count; i++)
        cluster_node_submit(member->node, &list.items[i],
                            i + 1 == list.count ? on_forgotten : on_forget_step, member);
    map_cmd_list_free(&list);
    LOG_INFO("cluster: forgetting broker '%.*s' (asked through the management API): %u queue(s) "
             "promoted, %u started again empty (their messages were only there), %u deleted "
             "(exclusive), %u backup(s) replaced, %u exchange(s) moved", name_len, name,
             report.promoted, report.emptied, report.deleted, report.backups_replaced,
             report.exchanges_moved);
    json_key(body, "forgetting");
    json_string_n(body, b->name.ptr, b->name.len);
    json_kv_uint(body, "promoted", report.promoted);
    json_kv_uint(body, "emptied", report.emptied);
    json_kv_uint(body, "deleted", report.deleted);
    json_kv_uint(body, "backups_replaced", report.backups_replaced);
    json_kv_uint(body, "exchanges_moved", report.exchanges_moved);
    json_object_end(body);
    return 202;
}

/* ---- lifecycle ---- */

/* Partition handling pause-minority: a broker cut off from the majority
 * confirms nothing and reaches no primary on the other side, while its
 * clients would wait on it for as long as the cut lasts (the fault soak's
 * consumers idled 10 s there). It closes their connections (320) and
 * refuses new ones (connection.open, ops_paused) until it hears the
 * majority again, so they reconnect to a broker of the majority, as
 * RabbitMQ's pause_minority does. Brokers' links stay: the cut heals
 * through them. */
static void pause_minority(struct member *member)
{
    struct broker *broker = member->broker;
    if (!broker->config.pause_minority)
        return;
    bool was = member->pause.paused;
    bool serving = cluster_node_synced(member->node) && member_map(member)->brokers_count > 1;
    fence_pause_step(&member->pause, member_lease_fresh(member), serving, uv_now(broker->loop),
                     MEMBER_PAUSE_AFTER_MS);
    if (member->pause.paused == was)
        return;
    if (member->pause.paused) {
        member->pauses_count++;
        LOG_WARN("cluster: cut off from the majority for %d ms: pausing (partition handling "
                 "pause-minority): clients' connections closed, new ones refused until the "
                 "majority is heard again", MEMBER_PAUSE_AFTER_MS);
        broker_close_clients(broker, "broker cut off from the cluster's majority "
                                     "(pause-minority): reconnect to another broker");
    } else {
        LOG_INFO("cluster: the majority is heard again: taking clients (pause-minority)");
    }
}

/* A slice of each of the tick's walks: true once both are done. */
static bool tick_walk_step(struct member *member)
{
    bool replications = replication_tick_step(member, MEMBER_TICK_SLICE);
    return proxy_tick_step(member, MEMBER_TICK_SLICE) && replications;
}

static void on_tick_walk(uv_idle_t *idle)
{
    struct member *member = idle->data;
    if (member->stopping || tick_walk_step(member))
        uv_idle_stop(idle);
}

static void on_tick(uv_timer_t *timer)
{
    struct member *member = timer->data;
    if (member->stopping)
        return;
    pause_minority(member);
    replication_tick_begin(member);
    proxy_tick_begin(member);
    if (!tick_walk_step(member))
        uv_idle_start(member->tick_walk, on_tick_walk);
    handover_tick(member);
    adoption_tick(member);
    mirror_tick(member);
    /* Alarms are cluster-wide: ours to the others (heartbeats), theirs here. */
    const struct alarm *alarm = &member->broker->alarm;
    cluster_node_set_alarms(member->node, alarm->memory_on, alarm->disk_on);
    bool memory, disk;
    cluster_node_peer_alarms(member->node, &memory, &disk);
    alarm_set_cluster(member->broker, memory, disk);
    if (!list_empty(&member->sync_waits))
        end_sync_waits(member, false); /* the late ones */
    visible_tick(member);
}

static void on_handle_closed(uv_handle_t *handle)
{
    free(handle);
}

bool member_lease_fresh(const struct member *member)
{
    return cluster_node_lease_fresh(member->node);
}

const struct cluster_map *member_map(const struct member *member)
{
    return cluster_node_map(member->node);
}

struct member *member_new(struct broker *broker, struct cluster_node *node,
                          uint8_t default_backups)
{
    struct member *member = xcalloc(1, sizeof *member);
    member->broker = broker;
    member->node = node;
    member->self_id = cluster_node_id(node);
    member->default_backups = default_backups;
    if (uv_random(NULL, NULL, &member->incarnation, sizeof member->incarnation, 0, NULL) != 0)
        member->incarnation = (uint32_t)uv_hrtime();
    list_init(&member->stubs);
    list_init(&member->parked);
    list_init(&member->visible_waits);
    list_init(&member->handovers);
    list_init(&member->adoptions);
    list_init(&member->adopted_unsaid);
    list_init(&member->adoptions_unreadable);
    list_init(&member->staged_kept);
    list_init(&member->restart_waits);
    list_init(&member->replications);
    list_init(&member->releasing);
    list_init(&member->sync_waits);
    net_flush_hook_add(&broker->net, &member->release_hook, proxy_send_releases);
    member->timer = xcalloc(1, sizeof *member->timer);
    uv_timer_init(broker->loop, member->timer);
    member->timer->data = member;
    uv_timer_start(member->timer, on_tick, MEMBER_TICK_MS, MEMBER_TICK_MS);
    member->tick_walk = xcalloc(1, sizeof *member->tick_walk);
    uv_idle_init(broker->loop, member->tick_walk);
    member->tick_walk->data = member;
    member->pace_timer = xcalloc(1, sizeof *member->pace_timer);
    uv_timer_init(broker->loop, member->pace_timer);
    member->pace_timer->data = member;
    struct placement_config pc;
    placement_config_default(&pc);
    placement_init(&member->placement, &pc);
    mirror_hold_recovered(member); /* before the map's replay reaches them */
    struct cluster_node_hooks hooks = {
        .ctx = member, .applied = on_applied, .synced = on_synced, .forward = on_forward};
    cluster_node_set_hooks(node, &hooks);
    return member;
}

void member_stop(struct member *member)
{
    if (member->stopping)
        return;
    member->stopping = true;
    net_flush_hook_remove(&member->release_hook);
    end_sync_waits(member, true);
    visible_stop(member);
    uv_close((uv_handle_t *)member->timer, on_handle_closed);
    member->timer = NULL;
    uv_close((uv_handle_t *)member->tick_walk, on_handle_closed);
    member->tick_walk = NULL;
    uv_close((uv_handle_t *)member->pace_timer, on_handle_closed);
    member->pace_timer = NULL;
    struct cluster_node_hooks none = {0};
    cluster_node_set_hooks(member->node, &none);
    handover_stop_all(member);
    mirror_release_held(member);
    adoption_stop_all(member);
    replication_stop_all(member);
    for (uint32_t i = 0; i < member->peers_count; i++)
        peer_free(member->peers[i]);
    member->peers_count = 0;
    member__route_parked(member, true); /* nacked: the sender resends */
}

void member_free(struct member *member)
{
    if (member == NULL)
        return;
    member_stop(member);
    placement_free(&member->placement);
    free(member);
}
