/*
 * mirror.c: see mirror.h.
 */
#include "cluster/mirror.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/message.h"
#include "broker/connection.h"
#include "broker/durable.h"
#include "broker/exchange.h"
#include "broker/queue.h"
#include "broker/queue_walk.h"
#include "broker/users.h"
#include "broker/vhost.h"
#include "cluster/adoption.h"
#include "cluster/controller.h"
#include "cluster/events.h"
#include "cluster/handover.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/proxy.h"
#include "cluster/replica.h"
#include "cluster/replication.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"
#include "lib/log.h"

/* How far a promoted primary's seqs jump (see ensure_queue): more than
 * any number of messages in flight to a backup. */
#define PROMOTION_SEQ_GAP (1ull << 32)

/* Predeclared exchanges are every vhost's own; the map never holds them. */
static bool predeclared(struct bytes name)
{
    return name.len == 0 || bytes_has_prefix(name, "amq.");
}

static struct vhost *vhost_for(struct member *member, struct bytes name)
{
    struct vhost *vhost = broker_add_vhost(member->broker, name);
    events_ensure_exchange(vhost);
    return vhost;
}

/* ---- exchanges ---- */

static bool exchange_matches(const struct exchange *x, const struct map_exchange *mx)
{
    return bytes_equal_cstr(mx->type, exchange_type_name(x->type)) && x->durable == mx->durable &&
           x->auto_delete == mx->auto_delete && x->internal == mx->internal &&
           bytes_equal(x->arguments, mx->arguments);
}

static void ensure_exchange(struct member *member, const struct map_exchange *mx)
{
    if (predeclared(mx->name))
        return;
    struct vhost *vhost = vhost_for(member, mx->vhost->name);
    struct exchange *x = vhost_exchange(vhost, mx->name);
    if (x && exchange_matches(x, mx))
        return;
    if (x)
        vhost_exchange_remove(vhost, x); /* recovered from an older definition */
    enum exchange_type type;
    if (exchange_type_parse(mx->type, &type) != 0) {
        LOG_WARN("cluster: exchange '%.*s' has unknown type '%.*s'; not mirrored",
                 (int)mx->name.len, (const char *)mx->name.ptr, (int)mx->type.len,
                 (const char *)mx->type.ptr);
        return;
    }
    vhost_exchange_declare(vhost, mx->name, type, mx->durable, mx->auto_delete, mx->internal,
                           mx->arguments);
}

/* The map deleted it: so do we, with the cascade the map applied too (it
 * decides the same from the same bindings). */
static void drop_exchange(struct member *member, struct bytes vhost_name, struct bytes name)
{
    struct vhost *vhost = broker_vhost(member->broker, vhost_name);
    struct exchange *x = vhost ? vhost_exchange(vhost, name) : NULL;
    if (x && !predeclared(name))
        vhost_exchange_delete(vhost, x);
}

/* ---- queues ---- */

static struct connection *connection_by_key(struct member *member, uint64_t key)
{
    list_for_each(n, &member->broker->connections) {
        struct connection *c = CONTAINER_OF(n, struct connection, broker_link);
        if (member_connection_key(member, c->conn.id) == key)
            return c;
    }
    return NULL;
}

/* A new local object (stand-in or real) for an exclusive queue: the owning
 * connection, if it is ours, holds it (it goes when the connection does);
 * on other brokers nobody does, so their clients are locked out (405).
 * False: its connection closed before the declare committed, and the
 * queue is gone. */
static bool claim_exclusive(struct member *member, struct vhost *vhost, struct queue *q,
                            const struct map_queue *mq)
{
    if (!mq->exclusive || mq->exclusive_owner_id != member->self_id)
        return true;
    struct connection *owner = connection_by_key(member, mq->exclusive_connection_id);
    if (owner == NULL || owner->conn.closing) {
        vhost_queue_delete(vhost, q);
        member_queue_gone(member, mq->vhost->name, mq->name);
        return false;
    }
    q->exclusive_owner = owner;
    list_push_back(&owner->exclusive_queues, &q->owner_link);
    return true;
}

/* A restart applies the map's log from its start (or a snapshot) before it
 * is synced: changes from before we stopped, history rather than the
 * present. A real queue our journal recovered may hold messages history
 * must not destroy (it was deposed or deleted in the past, and may be ours
 * again at present), and history must not start its replication or a
 * handover either: a catch-up sent to a broker that was its backup then
 * would reset that broker's copy with ours. So such a queue is held, paused
 * (its peers' forwards, gets and consumers wait), from the member's start
 * until the sync, when mirror_all decides with the present map
 * (drop_strays included). Only those: a queue made real here since the
 * start (a promotion) serves and follows the map at once, even before the
 * sync (the map changes it sees then are live ones). */
void mirror_hold_recovered(struct member *member)
{
    struct queue_walk walk;
    queue_walk_begin(&walk, member->broker);
    for (struct queue *q; (q = queue_walk_next(&walk)) != NULL;) {
        ASSERT(!queue_is_remote(q) && q->pause == NULL); /* nothing runs yet */
        q->held_until_synced = true;
        queue_pause(q);
    }
    queue_walk_end(&walk);
}

/* A queue held at the sync that an in-sync backup may yet take: one this
 * process has not heard yet (its first heartbeat after our restart may
 * come after our sync), or one the map suspects (hand_off_after_restart).
 * Decided again at every tick (mirror_tick), for up to
 * CONTROLLER_RESTART_WAIT_MS after the sync. In member->restart_waits. */
struct restart_wait {
    struct list_node link;
    struct bytes vhost, name; /* owned */
};

static void restart_wait_free(struct restart_wait *w)
{
    list_remove(&w->link);
    bytes_free(&w->vhost);
    bytes_free(&w->name);
    free(w);
}

/* The member stops before it caught up: what peers forwarded to a held
 * queue is nacked (their publishers send it again, to whoever holds the
 * queue then: the map never let us confirm it), and the queue is a plain
 * local one for the rest of the stop. */
void mirror_release_held(struct member *member)
{
    while (!list_empty(&member->restart_waits))
        restart_wait_free(CONTAINER_OF(member->restart_waits.next, struct restart_wait, link));
    struct queue_walk walk;
    queue_walk_begin(&walk, member->broker);
    for (struct queue *q; (q = queue_walk_next(&walk)) != NULL;) {
        if (!q->held_until_synced)
            continue;
        q->held_until_synced = false;
        ASSERT(q->pause->settles_count == 0); /* held from the start: it delivered nothing */
        queue_resume_refusing(q);
    }
    queue_walk_end(&walk);
}

static bool keep_for_now(const struct member *member, const struct queue *q)
{
    return q != NULL && q->held_until_synced && !cluster_node_synced(member->node);
}

static void drop_queue(struct member *member, struct bytes vhost_name, struct bytes name)
{
    struct vhost *vhost = broker_vhost(member->broker, vhost_name);
    struct queue *q = vhost ? vhost_queue(vhost, name) : NULL;
    if (q && !keep_for_now(member, q))
        vhost_queue_delete(vhost, q);
}

/* Promotion: the stand-in's local consumers move to the real queue (their
 * upstream consumers are cancelled; what they hold unacked comes back
 * redelivered from the replica). Returns how many; *out is malloc'ed. */
static uint32_t take_consumers(struct queue *stub, struct consumer ***out)
{
    uint32_t n = stub->consumers_count, i = 0;
    *out = n ? xmalloc(sizeof **out * n) : NULL;
    while (!list_empty(&stub->consumers)) {
        struct consumer *c = CONTAINER_OF(stub->consumers.next, struct consumer, queue_link);
        queue_consumer_remove(stub, c);
        (*out)[i++] = c;
    }
    return i;
}

/* Publishes held for the queue's primary: by our stand-in for a dead
 * primary when we are promoted (ours now, after the replica's messages:
 * they are newer), or by our queue while we handed it over (for the new
 * primary, through our stand-in). */
static void route_held(struct queue *queue, struct queue_held_publish *held, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++) {
        struct publish_wait wait = {.sink = held[i].sink, .seq = held[i].seq};
        /* One with an origin is a forward our stand-in had sent to the old
         * primary, which may have taken it (then its origin is under the
         * mark our replica brought along) and delivered it, then died or
         * was cut off before answering: a resend (queue_publish_forward),
         * ours now or sent on; so is one a paused queue held as a resend.
         * Not recorded: the held ones of a stream may have gaps (origin.h). */
        struct queue_forwarded f = {.origin_stream = held[i].origin_stream,
                                  .origin_seq = held[i].origin_seq,
                                  .resent = held[i].origin_stream != 0 ||
                                            held[i].maybe_delivered,
                                  .dead_lettered = held[i].dead_lettered};
        enum queue_publish_result r = queue_publish_forward(queue, held[i].message, &f, &wait);
        bool rejected = r == QUEUE_PUBLISH_REJECTED;
        if (held[i].sink) {
            confirm_sink_routed(held[i].sink, held[i].seq, &wait, rejected);
            confirm_sink_unref(held[i].sink);
        }
        message_unref(held[i].message);
    }
    free(held);
}

static void apply_binding(struct member *member, const struct map_binding_decl *d, bool bind);

/* A queue object made anew (promotion, demotion, a restart's stale kind)
 * gets the map's bindings to it back: deleting the old object removed
 * them. */
static void rebind_queue(struct member *member, struct map_queue *mq)
{
    list_for_each(n, &mq->bindings_in) {
        const struct map_binding *b = CONTAINER_OF(n, struct map_binding, destination_node);
        struct map_binding_decl d = {
            .vhost = mq->vhost->name, .source = b->source->name,
            .destination_kind = MAP_DESTINATION_QUEUE, .destination = mq->name,
            .routing_key = b->routing_key,
            .arguments = {b->arguments.ptr, (uint32_t)b->arguments.len}};
        apply_binding(member, &d, true);
    }
}

/* Demoted: the map gave our queue to another broker. Its held publishes
 * (a handover's, or a promotion's on the way) go to the new primary
 * through the stand-in that replaces it. After a planned handover
 * (nothing is pending: the backups have all of it) the queue's consumers,
 * ours and the peers' upstream ones, go on on the stand-in, without a
 * cancel. After a failover (we were cut off) what we never confirmed is
 * nacked (its publishers send it again, to the new primary), nothing more
 * reaches the backups (one of which may be the new primary already), and
 * the consumers are cancelled. */
static void demote(struct member *member, struct vhost *vhost, struct queue *q,
                   struct map_queue *mq)
{
    if (mq->taken_from == member->self_id)
        durable_abandon_log(member->broker, q); /* the taker's now: not a write more */
    struct handover_relay relay;
    bool planned = handover_done(member, q, mq->primary_id, &relay);
    struct list_node gets;
    list_init(&gets);
    queue_take_held_gets(q, &gets);
    struct queue_held_publish *held;
    uint32_t held_count = queue_take_held(q, &held);
    struct queue_held_settle *settles;
    uint32_t settles_count = queue_take_held_settles(q, &settles);
    struct consumer **moving = NULL;
    uint32_t moving_count = planned ? take_consumers(q, &moving) : 0;
    replication_detach(q, planned);
    /* Kept as an in-sync backup (map_queue_switch_keeps_primary): the
     * queue, as it was handed over, is the replica; before the relay
     * renumbers its deliveries. */
    struct replica *kept = planned && map_queue_backup_in_sync(mq, member->self_id)
                               ? replica_of_queue(q, settles, settles_count)
                               : NULL;
    struct queue *stub = proxy_stub_new(member, vhost, mq);
    if (kept != NULL)
        proxy_stub_give_replica(stub, kept);
    /* What was delivered from here stays delivered; settling it settles
     * it at the new primary (failed over: it redelivers them). */
    if (relay.channel != NULL)
        proxy_stub_relay(stub, q, &relay, settles, settles_count);
    else
        queue_held_settles_free(settles, settles_count);
    vhost_queue_delete(vhost, q);
    vhost_queue_insert(vhost, stub);
    /* The queue's log is the kept replica's now: defined as a replica's
     * (the deletion just undefined the queue's), so a restart keeps it. */
    if (kept != NULL)
        durable_replica_log_open(member->broker, stub);
    if (claim_exclusive(member, vhost, stub, mq))
        rebind_queue(member, mq);
    proxy_stub_adopt_consumers(stub, moving, moving_count);
    free(moving);
    route_held(stub, held, held_count);
    queue_retry_gets(&gets); /* asked of the new primary, after the held publishes */
}

/* What a stand-in (or NULL) becoming the real queue brings: its replica,
 * if this broker was a backup. Not for a queue taken over: its content is
 * the dead primary's log, and a replica here is a stale one (a takeover
 * never goes to a backup; this broker was one once): adopting it instead
 * of the log served the queue empty. Unless the takeover says we keep it
 * (with_replica: we were in sync, and it has the transient messages of a
 * queue that replicates only those: merged with the log). */
static struct replica *replica_of(struct queue *stand_in, const struct map_queue *mq,
                                  bool with_replica)
{
    struct replica *r = stand_in ? proxy_stub_take_replica(stand_in) : NULL;
    if (r != NULL && mq->taken_from != BROKER_ID_NONE && !with_replica) {
        replica_free(r);
        r = NULL;
    }
    return r;
}

/* What a restarted primary asked of the map for a queue it holds (a
 * hand-off, hand_off_after_restart, or a deletion, drop_after_restart).
 * Refused (the map moved on meanwhile, or could not be reached), the queue
 * is decided again with the map as it is now. */
struct restart_ask {
    struct member *member;
    struct bytes vhost, name; /* owned */
    bool holds_clients;       /* a deletion: member__hold_clients */
};

static void follow_queue(struct member *member, struct queue *q, const struct map_queue *mq);

/* The wait of mq's queue, if it waits (wait_for_backup), or NULL. */
static struct restart_wait *restart_wait_of(struct member *member, const struct map_queue *mq)
{
    list_for_each(n, &member->restart_waits) {
        struct restart_wait *w = CONTAINER_OF(n, struct restart_wait, link);
        if (bytes_equal(w->vhost, mq->vhost->name) && bytes_equal(w->name, mq->name))
            return w;
    }
    return NULL;
}

static void on_asked(void *ctx, int status, const struct map_change *change)
{
    struct restart_ask *a = ctx;
    struct member *member = a->member;
    bool refused = status != OK || change->reply_code != 200;
    struct vhost *vhost = refused ? broker_vhost(member->broker, a->vhost) : NULL;
    struct queue *q = vhost != NULL ? vhost_queue(vhost, a->name) : NULL;
    const struct map_queue *mq = cluster_map_queue(member_map(member), a->vhost, a->name);
    if (!member->stopping && q != NULL && !queue_is_remote(q) && q->held_until_synced &&
        mq != NULL && mq->primary_id == member->self_id)
        follow_queue(member, q, mq);
    if (a->holds_clients)
        member__release_clients(member);
    bytes_free(&a->vhost);
    bytes_free(&a->name);
    free(a);
}

/* Submits cmd for q (of mq), which stays held meanwhile. */
static void ask_after_restart(struct member *member, struct queue *q, const struct map_queue *mq,
                              struct map_cmd *cmd, bool holds_clients)
{
    struct restart_ask *a = xcalloc(1, sizeof *a);
    *a = (struct restart_ask){.member = member, .vhost = bytes_dup(mq->vhost->name),
                              .name = bytes_dup(mq->name), .holds_clients = holds_clients};
    if (holds_clients)
        member__hold_clients(member);
    q->held_until_synced = true; /* (still held: decided again at its next change) */
    /* Waiting for a backup, and decided by a map change meanwhile: the
     * answer decides it now, not the next tick too (it would ask again). */
    struct restart_wait *w = restart_wait_of(member, mq);
    if (w != NULL)
        restart_wait_free(w);
    cluster_node_submit(member->node, cmd, on_asked, a);
}

static void wait_for_backup(struct member *member, struct queue *q, const struct map_queue *mq)
{
    q->held_until_synced = true; /* (still held) */
    if (restart_wait_of(member, mq) != NULL)
        return; /* (a change of the queue decided it again meanwhile) */
    LOG_INFO("cluster: queue '%.*s': we restarted, and an in-sync backup may yet take it (not "
             "heard yet, or suspect): held (up to %d ms)", (int)mq->name.len,
             (const char *)mq->name.ptr, CONTROLLER_RESTART_WAIT_MS);
    struct restart_wait *w = xcalloc(1, sizeof *w);
    w->vhost = bytes_dup(mq->vhost->name);
    w->name = bytes_dup(mq->name);
    list_push_back(&member->restart_waits, &w->link);
}

void mirror_tick(struct member *member)
{
    struct list_node due;
    list_move_all(&due, &member->restart_waits); /* (what is decided again may wait again) */
    while (!list_empty(&due)) {
        struct restart_wait *w = CONTAINER_OF(due.next, struct restart_wait, link);
        struct vhost *vhost = broker_vhost(member->broker, w->vhost);
        struct queue *q = vhost != NULL ? vhost_queue(vhost, w->name) : NULL;
        const struct map_queue *mq = cluster_map_queue(member_map(member), w->vhost, w->name);
        restart_wait_free(w);
        if (q != NULL && !queue_is_remote(q) && q->held_until_synced && mq != NULL &&
            mq->primary_id == member->self_id)
            follow_queue(member, q, mq);
    }
}

/* We restarted, and the present map (we just caught up) still names us
 * the primary of q, which our journal recovered: it lacks what only our
 * memory held (transient messages), which an in-sync backup holds, with
 * everything we ever confirmed (or, x-quay-replicate "transient", with
 * the transient ones only: it then reads our log for the others). So that
 * backup takes the queue (map_cmd_queue_hand_to_backup: a set_owner, as a
 * failover's, that only an in-sync backup may take, or a takeover with
 * its replica; controller_restart_successor picks it),
 * and q stays held meanwhile (its peers' forwards wait, and go to the new
 * primary when the change demotes it); served from what we recovered, its
 * first act was to catch that backup up, resetting its copy to ours. True
 * while so; false: serve it (no backup qualifies). */
static bool hand_off_after_restart(struct member *member, struct queue *q,
                                   const struct map_queue *mq)
{
    const struct cluster_map *map = member_map(member);
    struct controller_heard heard[CLUSTER_BACKUPS_MAX];
    for (uint8_t i = 0; i < mq->backups_count; i++)
        heard[i] = (struct controller_heard){
            .broker_id = mq->backup_ids[i],
            .incarnation = cluster_node_peer_incarnation(member->node, mq->backup_ids[i])};
    bool wait;
    uint32_t next = controller_restart_successor(map, mq, heard, mq->backups_count,
                                                 cluster_node_known_since(member->node),
                                                 &wait);
    if (next == BROKER_ID_NONE && wait &&
        uv_now(member->broker->loop) < member->synced_ms + CONTROLLER_RESTART_WAIT_MS) {
        wait_for_backup(member, q, mq);
        return true;
    }
    if (next == BROKER_ID_NONE)
        return false;
    /* Its backup holds the transient messages only: it reads our log too
     * (a takeover with its replica; we close the log as it reaches us). */
    bool with_log = controller_restart_with_log(map, mq, next);
    struct map_cmd cmd;
    int rc = with_log ? map_cmd_queue_hand_to_backup_with_log(&cmd, mq->vhost->name, mq->name,
                                                              mq->epoch, next, member->self_id)
                      : map_cmd_queue_hand_to_backup(&cmd, mq->vhost->name, mq->name,
                                                     mq->epoch, next);
    if (rc != OK)
        return false;
    const struct map_broker *b = cluster_map_broker(map, next);
    LOG_INFO("cluster: queue '%.*s': we restarted, and its in-sync backup %.*s holds what our "
             "journal could not (transient messages): handing it over there%s",
             (int)mq->name.len, (const char *)mq->name.ptr, (int)b->name.len,
             (const char *)b->name.ptr, with_log ? ", with our log to read" : "");
    ask_after_restart(member, q, mq, &cmd, false);
    return true;
}

/* We restarted, no backup takes mq (hand_off_after_restart), and it is a
 * non-durable queue we owned before our restart (controller_restart_drops):
 * what it held went with that process, as RabbitMQ's transient queue goes
 * with its node, and the map deletes it; q stays held till then. True
 * while so; false: it serves (durable: what our journal recovered; or
 * given to us since we are back). */
static bool drop_after_restart(struct member *member, struct queue *q, const struct map_queue *mq)
{
    if (!controller_restart_drops(mq, member->self_id,
                                  cluster_node_restart_version(member->node)))
        return false;
    struct map_cmd cmd;
    if (map_cmd_queue_delete(&cmd, mq->vhost->name, mq->name, mq->epoch) != OK)
        return false;
    LOG_INFO("cluster: transient queue '%.*s' did not survive our restart, and no backup of it "
             "can take it: deleted", (int)mq->name.len, (const char *)mq->name.ptr);
    ask_after_restart(member, q, mq, &cmd, true);
    return true;
}

/* Our queue stays ours: its backups, a move, may have changed. One held
 * since our start (mirror_hold_recovered, or made while we caught up:
 * ensure_queue) serves from now on, unless an in-sync backup takes it
 * (hand_off_after_restart) or it was a transient queue of the process
 * before us (drop_after_restart). */
static void follow_queue(struct member *member, struct queue *q, const struct map_queue *mq)
{
    bool waking = q->held_until_synced;
    q->held_until_synced = false;
    if (adoption_pending(member, q)) {
        ASSERT(!waking); /* (adoption starts only once synced) */
        return; /* its adoption starts these, with the map as it is then */
    }
    /* Our takeover, cut short by our restart: it goes on first, the queue
     * paused into it (what waited must not take the seqs it adds). */
    if (waking && adoption_leftover(mq, member->self_id) &&
        adoption_resume_leftover(member, q, mq))
        return;
    if (waking && hand_off_after_restart(member, q, mq))
        return;
    if (waking && drop_after_restart(member, q, mq))
        return;
    if (q->from_replica_log) {
        /* A backup's log a restart kept (durable_replica_log_open), ours
         * now: defined as the queue's from here on. */
        q->from_replica_log = false;
        durable_queue_declared(member->broker, q->vhost, q);
    }
    replication_attach(member, q, mq, waking);
    if (waking)
        queue_resume(q); /* what waited is replicated like any publish */
    handover_follow(member, q, mq);
}

/* A policy of vhost changed: our queues there whose replication may
 * follow it (quay-replicate) re-attach, which switches a live stream to
 * transient-only at once, or catches a transient-only one up in full (the
 * map dropped it from the in-sync set in the same command: map_apply.c
 * partial_before). A queue held or adopting attaches later anyway. */
static void follow_policies(struct member *member, const struct map_change *c)
{
    const struct cluster_map *map = member_map(member);
    struct bytes vhost_name = c->vhost;
    struct vhost *vhost = c->changed ? broker_vhost(member->broker, vhost_name) : NULL;
    for (uint32_t i = 0; vhost != NULL && i < map->queues_count; i++) {
        const struct map_queue *mq = map->queues[i];
        if (mq->primary_id != member->self_id || !bytes_equal(mq->vhost->name, vhost_name) ||
            mq->backups_count == 0)
            continue;
        struct queue *q = vhost_queue(vhost, mq->name);
        if (q != NULL && !queue_is_remote(q) && !q->deleted && !keep_for_now(member, q) &&
            !q->held_until_synced && !adoption_pending(member, q))
            replication_attach(member, q, mq, false);
    }
}

/* q, taken over from shared storage, adopts the dead primary's log soon;
 * kept (a takeover with the replica, else NULL; freed): the replica whose
 * messages go in by seq among the log's. */
static void start_adoption(struct member *member, struct queue *q, const struct map_queue *mq,
                           struct replica *kept)
{
    struct queue_entry *merge;
    uint32_t merge_count = replica_take_for_merge(q, kept, &merge);
    adoption_start(member, q, mq, merge, merge_count);
}

/* A backup's log a restart kept (durable_replica_log_open) is not the
 * content of a queue taken over from shared storage (the dead primary's
 * log is: replica_of), nor our takeover cut short (adoption_resume_leftovers):
 * it goes (NULL: the takeover adopts the log as from a stand-in). Else q.
 * What it held meanwhile (held since our start, it took the forwards our
 * map let in while we caught up) is not a deleted queue's to answer: it is
 * the queue's, *held and *gets, for the object that replaces it. (Before,
 * the deletion confirmed those forwards and dropped them: CI's 38 saw one
 * confirmed message of 142 missing.) */
static struct queue *unless_stale_replica_log(struct vhost *vhost, struct queue *q,
                                              const struct map_queue *mq, bool primary,
                                              struct queue_held_publish **held,
                                              uint32_t *held_count, struct list_node *gets)
{
    if (q == NULL || queue_is_remote(q) || !q->from_replica_log || !primary ||
        mq->taken_from == BROKER_ID_NONE)
        return q;
    *held_count = queue_take_held(q, held);
    queue_take_held_gets(q, gets);
    vhost_queue_delete(vhost, q);
    return NULL;
}

/* A stand-in made anew (q was deleted). */
static void new_stand_in(struct member *member, struct vhost *vhost, struct map_queue *mq)
{
    struct queue *q = proxy_stub_new(member, vhost, mq);
    vhost_queue_insert(vhost, q);
    if (claim_exclusive(member, vhost, q, mq))
        rebind_queue(member, mq);
}

/* q, made real here (not to adopt a log), serves: its replication starts.
 * Unless it was made while we catch up after a restart: the map's history
 * made it (we are its primary in a past the present may have left), and
 * we hold nothing of it, where its in-sync backups may hold everything.
 * Then it is held like a queue our journal recovered
 * (mirror_hold_recovered), decided at the sync with the present map
 * (follow_queue): attached now, its replication would catch those backups
 * up to our empty copy. True: it serves. */
static bool start_made_real(struct member *member, struct queue *q, const struct map_queue *mq)
{
    if (!cluster_node_synced(member->node)) {
        q->held_until_synced = true;
        queue_pause(q);
        return false;
    }
    replication_attach(member, q, mq, false);
    return true;
}

/* The local object for a map queue: real here if we are its primary, a
 * stand-in otherwise. A local object of the wrong kind (a restart found a
 * queue that has moved, a stand-in for a queue that came to us) is
 * replaced. planned: the change was a planned handover. */
static void ensure_queue(struct member *member, struct map_queue *mq, bool planned,
                         bool with_replica)
{
    struct vhost *vhost = vhost_for(member, mq->vhost->name);
    struct queue *q = vhost_queue(vhost, mq->name);
    bool primary = mq->primary_id == member->self_id;
    if (keep_for_now(member, q))
        return;
    struct queue_held_publish *held = NULL;
    uint32_t held_count = 0;
    struct list_node gets;
    list_init(&gets);
    q = unless_stale_replica_log(vhost, q, mq, primary, &held, &held_count, &gets);
    if (q && queue_is_remote(q) == !primary) {
        if (primary)
            follow_queue(member, q, mq);
        else
            proxy_stub_update(q, mq, planned);
        return;
    }
    if (q)
        q->held_until_synced = false; /* (synced: it goes now) */
    if (q && !primary) {
        demote(member, vhost, q, mq);
        return;
    }
    /* A backup promoted (or a restart's stale kind): the stand-in's
     * replica, if any, becomes the queue's content. */
    struct replica *promoted = replica_of(q, mq, with_replica);
    bool promoted_epoch = q != NULL;
    /* In flight to the old primary: ours now; after a planned handover it
     * answers them itself, and newer publishes wait for that. */
    bool draining = q && planned && proxy_stub_drain(q);
    if (q && !planned)
        proxy_stub_recall_forwards(q);
    if (q)
        held_count = proxy_stub_take_held(q, &held);
    struct consumer **moving = NULL;
    uint32_t moving_count = q ? take_consumers(q, &moving) : 0;
    if (q)
        vhost_queue_delete(vhost, q);
    if (!primary) {
        new_stand_in(member, vhost, mq);
        return;
    }
    q = vhost_queue_declare(vhost, mq->name, mq->durable, mq->exclusive, mq->auto_delete,
                            mq->arguments);
    rebind_queue(member, mq);
    /* Adopted first: catching up the backups that are not in sync (in
     * replication_attach) copies what the queue now holds. Our seqs then
     * jump past any the old primary may have given to messages that never
     * reached us but did reach another backup: one seq, one message. */
    struct replica_handover *note = planned ? replica_take_handover(promoted) : NULL;
    /* A queue taken over from shared storage: its log, in the dead
     * primary's directory, is adopted soon (adoption.h); the queue waits
     * for it, paused, and so do its replication and handovers. */
    if (mq->taken_from != BROKER_ID_NONE && (promoted == NULL || with_replica)) {
        start_adoption(member, q, mq, promoted);
        promoted = NULL;
    }
    bool adopting = adoption_pending(member, q);
    replica_adopt(q, promoted);
    handover_adopt(member, q, note, mq->epoch - 1); /* its deliveries stay delivered */
    /* (An adopted log numbers what comes after it: durable_adopt_step. A taken
     * over queue has no backup whose seqs we could collide with.) */
    if (promoted_epoch && !adopting)
        q->next_seq += PROMOTION_SEQ_GAP;
    bool serving = !adopting && start_made_real(member, q, mq);
    if (draining)
        queue_hold_publishes(q);
    route_held(q, held, held_count);
    queue_retry_gets(&gets); /* a replaced log's (after what it held) */
    for (uint32_t i = 0; i < moving_count; i++)
        queue_consumer_add(q, moving[i]); /* our clients go on, on the real queue */
    free(moving);
    if (claim_exclusive(member, vhost, q, mq))
        queue_dispatch(q);
    if (serving)
        handover_follow(member, q, mq);
}

/* ---- bindings ---- */

static struct bind_dest *binding_dest(struct vhost *vhost, enum map_destination_kind kind,
                                      struct bytes name)
{
    if (kind == MAP_DESTINATION_QUEUE) {
        struct queue *q = vhost_queue(vhost, name);
        return q ? &q->as_dest : NULL;
    }
    struct exchange *x = vhost_exchange(vhost, name);
    return x ? &x->as_dest : NULL;
}

static void apply_binding(struct member *member, const struct map_binding_decl *d, bool bind)
{
    struct vhost *vhost = broker_vhost(member->broker, d->vhost);
    struct exchange *source = vhost ? vhost_exchange(vhost, d->source) : NULL;
    struct bind_dest *dest = vhost ? binding_dest(vhost, d->destination_kind, d->destination)
                                   : NULL;
    if (source == NULL || dest == NULL)
        return;
    struct bytes args = {d->arguments.ptr, d->arguments.len};
    if (bind) {
        struct binding *existing = exchange_find_binding(source, dest, d->routing_key, args);
        struct binding *b = exchange_bind(source, dest, d->routing_key, args);
        if (b != existing)
            durable_binding_added(member->broker, vhost, b);
        return;
    }
    struct binding *b = exchange_find_binding(source, dest, d->routing_key, args);
    if (b) {
        durable_binding_removed(member->broker, vhost, b);
        exchange_unbind(source, dest, d->routing_key, args);
    }
}

/* ---- one change ---- */

static void mirror_apply(struct member *member, const struct map_change *c);

/* broker.incarnation took broker_id out of the in-sync sets: each queue
 * it backs up follows its map again (a primary here stops waiting for it
 * and catches it up). */
static void follow_backup_of(struct member *member, uint32_t broker_id)
{
    const struct cluster_map *map = member_map(member);
    for (uint32_t i = 0; i < map->queues_count; i++) {
        if (map_queue_has_backup(map->queues[i], broker_id))
            ensure_queue(member, map->queues[i], false, false);
    }
}

static const char *broker_event(const struct member *member, const struct map_change *c)
{
    if (c->op == MAP_OP_BROKER_JOIN)
        return "joined";
    if (c->op == MAP_OP_BROKER_LEAVE)
        return "left";
    const struct map_broker *b = cluster_map_broker(member_map(member), c->broker_id);
    return b ? broker_state_name(b->state) : "unknown";
}

void mirror_change(struct member *member, const struct map_change *c)
{
    mirror_apply(member, c);
    if (c->op == MAP_OP_BROKER_INCARNATION && c->changed)
        follow_backup_of(member, c->broker_id);
    if (c->op == MAP_OP_QUEUE_SET_OWNER && c->changed) {
        member->queue_moves_count += c->planned;
        member->queue_failovers_count += !c->planned;
    }
    switch (c->op) {
    case MAP_OP_BROKER_JOIN:
    case MAP_OP_BROKER_LEAVE:
    case MAP_OP_BROKER_STATE:
        events_map_changed(member, c, broker_event(member, c));
        break;
    default:
        events_map_changed(member, c, NULL);
    }
}

/* users.bootstrap and users.import made vhosts (no vhost.put of their
 * own) and users. */
static void mirror_bootstrap(struct member *member, const struct map_change *c)
{
    if (!c->changed)
        return;
    for (uint32_t i = 0; i < member_map(member)->vhosts_count; i++)
        vhost_for(member, member_map(member)->vhosts[i]->name);
    mirror_users(member);
}

static void mirror_apply(struct member *member, const struct map_change *c)
{
    switch (c->op) {
    case MAP_OP_BROKER_JOIN:
    case MAP_OP_BROKER_LEAVE:
    case MAP_OP_BROKER_STATE:
        member__sync_peers(member);
        if (c->op == MAP_OP_BROKER_JOIN && c->broker_id == member->self_id)
            member__announce_storage(member);
        return;
    case MAP_OP_BROKER_INCARNATION: /* (mirror_change) */
    case MAP_OP_CLUSTER_REBALANCE:
    case MAP_OP_BROKER_STORAGE:
    case MAP_OP_QUEUE_ADOPTED:
        return; /* read from the map: the controller, the next queue.take_over */
    case MAP_OP_VHOST_PUT:
        vhost_for(member, c->name);
        return;
    case MAP_OP_EXCHANGE_DECLARE:
    case MAP_OP_EXCHANGE_SET_OWNER:
        if (c->changed && c->exchange)
            ensure_exchange(member, c->exchange);
        return;
    case MAP_OP_EXCHANGE_DELETE:
        if (c->changed)
            drop_exchange(member, c->vhost, c->name);
        return;
    case MAP_OP_BIND:
    case MAP_OP_UNBIND:
        if (c->changed)
            apply_binding(member, &c->binding, c->op == MAP_OP_BIND);
        if (c->op == MAP_OP_UNBIND && c->exchanges_deleted_count > 0)
            drop_exchange(member, c->binding.vhost, c->binding.source); /* auto-delete */
        return;
    case MAP_OP_QUEUE_DECLARE:
        if (c->changed && c->queues_deleted_count > 0)
            drop_queue(member, c->vhost, c->name); /* it replaced a deleted incarnation */
        if (c->changed && c->queue)
            ensure_queue(member, c->queue, false, false);
        return;
    case MAP_OP_QUEUE_SET_OWNER:
    case MAP_OP_QUEUE_SET_BACKUPS:
    case MAP_OP_QUEUE_SET_IN_SYNC:
    case MAP_OP_QUEUE_SET_AVAILABLE:
    case MAP_OP_QUEUE_MOVE:
    case MAP_OP_QUEUE_TAKE_OVER:
        if (c->changed && c->queue)
            ensure_queue(member, c->queue, c->planned, c->with_replica); /* (their ops') */
        return;
    case MAP_OP_QUEUE_DELETE:
        if (c->changed)
            drop_queue(member, c->vhost, c->name);
        return;
    case MAP_OP_POLICY_PUT:
    case MAP_OP_POLICY_DELETE: follow_policies(member, c); return; /* (else read where used) */
    case MAP_OP_LIMIT_PUT:
    case MAP_OP_LIMIT_DELETE: mirror_limits(member); return; /* (a no-op if unchanged) */
    case MAP_OP_VHOST_DELETE:
        /* A restart's replay is history: a vhost of that name may exist
         * again at present (mirror_all decides once synced). */
        if (c->changed && cluster_node_synced(member->node))
            users_vhost_delete(member->broker, c->name);
        mirror_users(member); /* its permissions went with it */
        return;
    case MAP_OP_USERS_BOOTSTRAP:
    case MAP_OP_USERS_IMPORT: mirror_bootstrap(member, c); return;
    case MAP_OP_USER_PUT:
    case MAP_OP_USER_DELETE:
    case MAP_OP_PERMISSION_PUT:
    case MAP_OP_PERMISSION_DELETE:
        if (c->changed)
            mirror_users(member);
        return;
    case MAP_OP_SYNC:
    case MAP_OP_NONE:
    case MAP_OP_COUNT:
        return;
    }
}

/* ---- everything ---- */

/* Local exchanges and queues the map does not have (a restart recovered
 * them from the journal, and they were deleted meanwhile) go. */
static void drop_strays(struct member *member, struct vhost *vhost)
{
    const struct cluster_map *map = member_map(member);
    struct hmap_entry *e;
    uint32_t count = 0;
    void **doomed = xmalloc(sizeof *doomed * (vhost->queues.count + vhost->exchanges.count + 1));
    for (uint32_t i = 0; hmap_next(&vhost->queues, &i, &e);) {
        struct queue *q = e->value;
        if (!cluster_map_queue(map, vhost->name, q->name))
            doomed[count++] = q;
    }
    for (uint32_t i = 0; i < count; i++) {
        LOG_INFO("cluster: queue '%.*s' is not in the map: deleted here",
                 (int)((struct queue *)doomed[i])->name.len,
                 (const char *)((struct queue *)doomed[i])->name.ptr);
        vhost_queue_delete(vhost, doomed[i]);
    }
    count = 0;
    for (uint32_t i = 0; hmap_next(&vhost->exchanges, &i, &e);) {
        struct exchange *x = e->value;
        if (!predeclared(x->name) && !cluster_map_exchange(map, vhost->name, x->name))
            doomed[count++] = x;
    }
    for (uint32_t i = 0; i < count; i++)
        vhost_exchange_remove(vhost, doomed[i]);
    free(doomed);
}

/* Rebuilds the local bindings of every exchange from the map. */
static void rebind_all(struct member *member, struct vhost *vhost)
{
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next(&vhost->exchanges, &i, &e);) {
        struct exchange *x = e->value;
        while (!list_empty(&x->bindings)) {
            struct binding *b = CONTAINER_OF(x->bindings.next, struct binding, source_link);
            exchange_unbind(x, b->dest, b->routing_key, b->arguments);
        }
    }
    const struct cluster_map *map = member_map(member);
    for (uint32_t i = 0; i < map->exchanges_count; i++) {
        const struct map_exchange *mx = map->exchanges[i];
        if (!bytes_equal(mx->vhost->name, vhost->name))
            continue;
        list_for_each(n, &mx->bindings_out) {
            const struct map_binding *b = CONTAINER_OF(n, struct map_binding, source_node);
            struct map_binding_decl d = {
                .vhost = vhost->name, .source = mx->name,
                .destination_kind = b->destination_kind, .destination = b->destination,
                .routing_key = b->routing_key,
                .arguments = {b->arguments.ptr, (uint32_t)b->arguments.len}};
            apply_binding(member, &d, true);
        }
    }
}

void mirror_all(struct member *member, bool drop_strays_too)
{
    const struct cluster_map *map = member_map(member);
    member__sync_peers(member);
    for (uint32_t i = 0; i < map->vhosts_count; i++)
        vhost_for(member, map->vhosts[i]->name);
    for (uint32_t i = 0; i < map->exchanges_count; i++)
        ensure_exchange(member, map->exchanges[i]);
    for (uint32_t i = 0; i < map->queues_count; i++)
        ensure_queue(member, map->queues[i], false, false);
    struct hmap_entry *e;
    /* Once the map has users its vhosts are the cluster's: a local one it
     * lacks was deleted while we were away. Before, ours join it. */
    bool map_decides = map->users_defined && drop_strays_too;
    for (bool again = true; again;) {
        again = false;
        for (uint32_t i = 0; !again && hmap_next(&member->broker->vhosts, &i, &e);) {
            struct vhost *vhost = e->value;
            if (map_decides && !cluster_map_vhost(map, vhost->name)) {
                users_vhost_delete(member->broker, vhost->name);
                again = true; /* the table changed under the walk */
            }
        }
    }
    for (uint32_t i = 0; hmap_next(&member->broker->vhosts, &i, &e);) {
        struct vhost *vhost = e->value;
        events_ensure_exchange(vhost);
        if (drop_strays_too)
            drop_strays(member, vhost);
        rebind_all(member, vhost);
        if (!cluster_map_vhost(map, vhost->name))
            member__publish_vhost(member, vhost->name);
    }
    mirror_users(member);
    if (drop_strays_too)
        mirror_users_bootstrap(member);
}
