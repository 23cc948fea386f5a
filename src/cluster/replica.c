/*
 * replica.c: see replica.h.
 */
#include "cluster/replica.h"

#include <stdlib.h>
#include <string.h>

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

/* ---- promotion ---- */

void replica_adopt(struct queue *queue, struct replica *r)
{
    if (r == NULL)
        return;
    for (uint32_t i = 0; i < r->count; i++) {
        if (slot(r, i)->message)
            queue_adopt(queue, slot(r, i)->message, slot(r, i)->seq);
    }
    LOG_DEBUG("vhost=%.*s queue=%.*s: promoted with %u messages from its replica",
             (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
             (int)queue->name.len, (const char *)queue->name.ptr, r->live);
    replica_free(r);
}
