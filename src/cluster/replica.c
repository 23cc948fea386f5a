/*
 * replica.c: see replica.h.
 */
#include "cluster/replica.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/dedup.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/proxy.h"
#include "lib/assert.h"
#include "lib/ring.h"
#include "lib/log.h"

/* ---- the backup's side: a ring sorted by seq, holes for removed ones ---- */

struct replica_entry {
    uint64_t seq;
    struct message *message; /* one reference; NULL once removed */
};

struct replica {
    struct replica_entry *items; /* owned ring */
    uint32_t head, count, cap;   /* count includes holes */
    uint32_t live;
    uint64_t last_seq;
    /* Owned, or NULL (no x-quay-dedup-window): the ids of what the primary
     * enqueued, as the queue's own table would hold them, timed by our
     * clock. A reset does not clear it (ids are about publishes, not
     * contents); promotion hands it to the real queue. */
    struct dedup *dedup;
};

struct replica *replica_new(int64_t dedup_window_ms)
{
    struct replica *r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
    if (dedup_window_ms > 0) {
        r->dedup = malloc(sizeof *r->dedup);
        ASSERT(r->dedup != NULL);
        dedup_init(r->dedup, (uint64_t)dedup_window_ms);
    }
    return r;
}

static struct replica_entry *slot(const struct replica *r, uint32_t i)
{
    return &r->items[(r->head + i) & (r->cap - 1)];
}

static void trim(struct replica *r)
{
    while (r->count > 0 && slot(r, 0)->message == NULL) {
        r->head = (r->head + 1) & (r->cap - 1);
        r->count--;
    }
}

void replica_free(struct replica *r)
{
    if (r == NULL)
        return;
    replica_remove(r, 0);
    free(r->items);
    if (r->dedup) {
        dedup_free(r->dedup);
        free(r->dedup);
    }
    free(r);
}

bool replica_push(struct replica *r, uint64_t seq, struct message *message, uint64_t now_ms)
{
    if (seq <= r->last_seq)
        return true; /* sent again after a reconnect: we have it (or it left) */
    /* After a reset, the snapshot's ids are mostly known already: they keep
     * their first time (dedup_record does not restart a window). */
    if (r->dedup)
        dedup_record(r->dedup, message_id(message), now_ms, 0);
    if (r->count == r->cap)
        r->items = ring_grow(r->items, sizeof *r->items, &r->head, r->count, &r->cap, 64);
    message_ref(message);
    *slot(r, r->count) = (struct replica_entry){seq, message};
    r->count++;
    r->live++;
    r->last_seq = seq;
    return true;
}

void replica_remove(struct replica *r, uint64_t seq)
{
    if (seq == 0) {
        for (uint32_t i = 0; i < r->count; i++) {
            if (slot(r, i)->message)
                message_unref(slot(r, i)->message);
        }
        r->head = r->count = r->live = 0;
        r->last_seq = 0; /* a catch-up starts over from the primary's oldest */
        return;
    }
    /* Binary search: entries are in seq order (holes keep their seq). */
    uint32_t lo = 0, hi = r->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (slot(r, mid)->seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == r->count || slot(r, lo)->seq != seq || slot(r, lo)->message == NULL)
        return;
    message_unref(slot(r, lo)->message);
    slot(r, lo)->message = NULL;
    r->live--;
    trim(r);
}

uint32_t replica_count(const struct replica *r)
{
    return r ? r->live : 0;
}

uint32_t replica_dedup_count(const struct replica *r)
{
    return r && r->dedup ? dedup_count(r->dedup) : 0;
}

/* ---- the primary's side ---- */

struct replication {
    struct member *member;  /* borrowed */
    uint32_t backup_ids[CLUSTER_BACKUPS_MAX];
    uint8_t backups_count;
    uint8_t lagging;        /* bit i: backup i missed a message (reported once) */
    uint64_t epoch;
    uint32_t catching_up[CLUSTER_BACKUPS_MAX]; /* backups whose snapshot is in flight */
};

/* ---- catching up a backup that is not in sync ---- */

struct catch_up {
    struct queue *queue;    /* one reference */
    uint32_t backup_id;
    uint64_t epoch;
};

struct snapshot {
    struct replica_entry *items; /* borrowed messages: sent before the loop runs again */
    uint32_t count, cap;
};

static void snapshot_add(void *ctx, uint64_t seq, struct message *message)
{
    struct snapshot *snap = ctx;
    if (snap->count == snap->cap) {
        snap->cap = snap->cap ? snap->cap * 2 : 256;
        snap->items = realloc(snap->items, sizeof *snap->items * snap->cap);
        ASSERT(snap->items != NULL);
    }
    snap->items[snap->count++] = (struct replica_entry){seq, message};
}

static int by_seq(const void *a, const void *b)
{
    const struct replica_entry *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void catching_up_set(struct replication *rep, uint32_t backup_id, bool on)
{
    for (uint8_t i = 0; i < CLUSTER_BACKUPS_MAX; i++) {
        if (on ? rep->catching_up[i] == BROKER_ID_NONE : rep->catching_up[i] == backup_id) {
            rep->catching_up[i] = on ? backup_id : BROKER_ID_NONE;
            return;
        }
    }
}

static bool is_catching_up(const struct replication *rep, uint32_t backup_id)
{
    for (uint8_t i = 0; i < CLUSTER_BACKUPS_MAX; i++) {
        if (rep->catching_up[i] == backup_id)
            return true;
    }
    return false;
}

/* The backup acked the last message of its snapshot (ack false: it did
 * not, or its link died: the next map change tries again). */
static void caught_up(void *ctx, bool ack)
{
    struct catch_up *c = ctx;
    struct replication *rep = c->queue->replication;
    if (rep != NULL && !c->queue->deleted) {
        catching_up_set(rep, c->backup_id, false);
        if (ack && rep->epoch == c->epoch)
            member_backup_in_sync(rep->member, c->queue, c->backup_id, c->epoch, true);
    }
    queue_unref(c->queue);
    free(c);
}

/* Sends a backup that is not in sync the queue as it is now: a reset, then
 * every message (ready, and delivered but not acked) in seq order, on the
 * channel the stream goes on, so nothing falls between the two. Then, once
 * it acked the last one, it joins the in-sync set. */
static void catch_up(struct queue *queue, uint32_t backup_id)
{
    struct replication *rep = queue->replication;
    struct member_peer *peer = member_peer(rep->member, backup_id);
    if (peer == NULL || !peer->up || is_catching_up(rep, backup_id) || queue->paged_count > 0)
        return; /* (paged messages would need reading back: not yet) */
    struct snapshot snap = {0};
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        const struct queue_ring *ring =
            level == 0 ? &queue->ready : &queue->priority_rings[level - 1];
        for (uint32_t i = 0; i < ring->count; i++) {
            const struct queue_entry *e = &ring->entries[(ring->head + i) & (ring->cap - 1)];
            snapshot_add(&snap, e->seq, e->message);
        }
    }
    channels_each_unacked(queue->vhost->broker, queue, snapshot_add, &snap);
    if (snap.count > 1)
        qsort(snap.items, snap.count, sizeof *snap.items, by_seq);
    struct method reset = {.id = METHOD_BASIC_QUAY_SETTLE};
    reset.basic_quay_settle.queue = queue->name;
    reset.basic_quay_settle.epoch = rep->epoch;
    reset.basic_quay_settle.purge = true;
    struct catch_up *c = calloc(1, sizeof *c);
    ASSERT(c != NULL);
    *c = (struct catch_up){queue, backup_id, rep->epoch};
    queue_ref(queue);
    bool sent = proxy_peer_send(peer, queue->vhost->name, &reset, NULL, NULL, 0);
    struct method m = {.id = METHOD_BASIC_QUAY_REPLICATE};
    m.basic_quay_replicate.queue = queue->name;
    m.basic_quay_replicate.epoch = rep->epoch;
    for (uint32_t i = 0; sent && i + 1 < snap.count; i++) {
        m.basic_quay_replicate.seq = snap.items[i].seq;
        m.basic_quay_replicate.exchange = message_exchange(snap.items[i].message);
        m.basic_quay_replicate.routing_key = message_routing_key(snap.items[i].message);
        sent = proxy_peer_send(peer, queue->vhost->name, &m, snap.items[i].message, NULL, 0);
    }
    if (sent && snap.count > 0) {
        struct replica_entry *last = &snap.items[snap.count - 1];
        m.basic_quay_replicate.seq = last->seq;
        m.basic_quay_replicate.exchange = message_exchange(last->message);
        m.basic_quay_replicate.routing_key = message_routing_key(last->message);
        sent = proxy_peer_send_notify(peer, queue->vhost->name, &m, last->message, caught_up, c);
        if (sent)
            catching_up_set(rep, backup_id, true);
    } else if (sent) {
        /* Nothing to copy: in sync once the reset is on its way. */
        member_backup_in_sync(rep->member, queue, backup_id, rep->epoch, true);
    }
    if (!sent || snap.count == 0) {
        queue_unref(queue);
        free(c);
    }
    LOG_INFO("vhost=%.*s queue=%.*s: catching up backup %u with %u messages%s",
             (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
             (int)queue->name.len, (const char *)queue->name.ptr, backup_id, snap.count,
             sent ? "" : " (failed: retried at the next change)");
    free(snap.items);
}

static void replicated(struct queue *queue, uint64_t seq, struct message *message,
                       struct publish_wait *wait)
{
    struct replication *rep = queue->replication;
    struct method m = {.id = METHOD_BASIC_QUAY_REPLICATE};
    m.basic_quay_replicate.queue = queue->name;
    m.basic_quay_replicate.exchange = message_exchange(message);
    m.basic_quay_replicate.routing_key = message_routing_key(message);
    m.basic_quay_replicate.epoch = rep->epoch;
    m.basic_quay_replicate.seq = seq;
    for (uint8_t i = 0; i < rep->backups_count; i++) {
        if (rep->lagging & (1u << i))
            continue; /* it has a gap already: the next map change says what it is */
        struct member_peer *peer = member_peer(rep->member, rep->backup_ids[i]);
        struct confirm_sink *sink = wait ? wait->sink : NULL;
        if (proxy_peer_send(peer, queue->vhost->name, &m, message, sink, wait ? wait->seq : 0)) {
            if (sink)
                wait->remote++;
        } else {
            /* Unreachable: this message is not on it. It must leave the
             * in-sync set (the controller will see it down too). */
            rep->lagging |= (uint8_t)(1u << i);
            member_backup_in_sync(rep->member, queue, rep->backup_ids[i], rep->epoch, false);
        }
    }
}

static void removed(struct queue *queue, uint64_t seq)
{
    struct replication *rep = queue->replication;
    struct method m = {.id = METHOD_BASIC_QUAY_SETTLE};
    m.basic_quay_settle.queue = queue->name;
    m.basic_quay_settle.epoch = rep->epoch;
    m.basic_quay_settle.seq = seq;
    for (uint8_t i = 0; i < rep->backups_count; i++)
        proxy_peer_send(member_peer(rep->member, rep->backup_ids[i]), queue->vhost->name, &m,
                        NULL, NULL, 0);
}

static const struct queue_replication_ops replication_ops = {
    .published = replicated,
    .removed = removed,
};

void replica_attach(struct member *member, struct queue *queue, const struct map_queue *mq)
{
    if (mq->backups_count == 0) {
        free(queue->replication);
        queue->replication = NULL;
        queue->replication_ops = NULL;
        return;
    }
    struct replication *rep = queue->replication;
    if (rep == NULL) {
        rep = calloc(1, sizeof *rep);
        ASSERT(rep != NULL);
        queue->replication = rep;
        queue->replication_ops = &replication_ops;
    }
    rep->member = member;
    memcpy(rep->backup_ids, mq->backup_ids, sizeof rep->backup_ids);
    rep->backups_count = mq->backups_count;
    rep->epoch = mq->epoch;
    rep->lagging = 0;
    for (uint8_t i = 0; i < mq->backups_count; i++) {
        if (!(mq->in_sync_mask & (1u << i)))
            catch_up(queue, mq->backup_ids[i]);
    }
}

void replica_adopt(struct queue *queue, struct replica *r)
{
    if (r == NULL)
        return;
    queue_adopt_dedup(queue, r->dedup);
    r->dedup = NULL;
    for (uint32_t i = 0; i < r->count; i++) {
        if (slot(r, i)->message)
            queue_adopt(queue, slot(r, i)->message, slot(r, i)->seq);
    }
    LOG_INFO("vhost=%.*s queue=%.*s: promoted with %u messages from its replica",
             (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
             (int)queue->name.len, (const char *)queue->name.ptr, r->live);
    replica_free(r);
}
