/*
 * replica.c: see replica.h.
 */
#include "cluster/replica.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
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
};

struct replica *replica_new(void)
{
    struct replica *r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
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
    free(r);
}

bool replica_push(struct replica *r, uint64_t seq, struct message *message)
{
    if (seq <= r->last_seq)
        return true; /* sent again after a reconnect: we have it (or it left) */
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

/* ---- the primary's side ---- */

struct replication {
    struct member *member;  /* borrowed */
    uint32_t backup_ids[CLUSTER_BACKUPS_MAX];
    uint8_t backups_count;
    uint8_t lagging;        /* bit i: backup i missed a message (reported once) */
    uint64_t epoch;
};

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
            member_backup_lagging(rep->member, queue, rep->backup_ids[i], rep->epoch);
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
    m.basic_quay_settle.purge = seq == 0;
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
}

void replica_adopt(struct queue *queue, struct replica *r)
{
    if (r == NULL)
        return;
    for (uint32_t i = 0; i < r->count; i++) {
        if (slot(r, i)->message)
            queue_adopt(queue, slot(r, i)->message, slot(r, i)->seq);
    }
    LOG_INFO("vhost=%.*s queue=%.*s: promoted with %u messages from its replica",
             (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
             (int)queue->name.len, (const char *)queue->name.ptr, r->live);
    replica_free(r);
    queue_dispatch(queue);
}
