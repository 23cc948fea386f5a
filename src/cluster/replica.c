/*
 * replica.c: see replica.h.
 */
#include "cluster/replica.h"

#include <stdlib.h>
#include <string.h>

#include "broker/dedup.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
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
    if (seq == 0) {
        /* Not a message: a catch-up's dedup id (or its empty probe). */
        if (r->dedup)
            dedup_record(r->dedup, message_id(message), now_ms, 0);
        return true;
    }
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

/* ---- promotion ---- */

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
    LOG_DEBUG("vhost=%.*s queue=%.*s: promoted with %u messages from its replica",
             (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
             (int)queue->name.len, (const char *)queue->name.ptr, r->live);
    replica_free(r);
}
