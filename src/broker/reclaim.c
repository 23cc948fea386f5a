/*
 * reclaim.c: see reclaim.h. Each ring handed over keeps its own array and
 * a cursor; the timer, repeating while some wait, drops one slice from the
 * oldest ring at each expiry (libuv runs a repeating timer at most once a
 * loop turn), and is stopped when none is left.
 */
#include "broker/reclaim.h"

#include "broker/message.h"
#include "broker/queue.h"
#include "lib/alloc.h"
#include "lib/assert.h"

struct reclaim_ring {
    struct list_node link;        /* struct reclaim.rings */
    struct queue_ring ring;       /* owned */
    uint32_t next;                /* entries before it are dropped */
};

/* Drops entries [from, to) of ring; returns the body bytes they held. */
static uint64_t drop(const struct queue_ring *ring, uint32_t from, uint32_t to)
{
    uint64_t bytes = 0;
    for (uint32_t i = from; i < to; i++) {
        struct queue_entry *e = &ring->entries[(ring->head + i) & (ring->cap - 1)];
        if (e->paged || e->message == NULL)
            continue;
        bytes += e->message->body_size;
        message_unref(e->message);
    }
    return bytes;
}

static void trim_maybe(struct reclaim *rc, bool done)
{
    /* Done: what is left under the mark goes back too (the last slice). */
    if (rc->freed_bytes >= RECLAIM_TRIM_BYTES || (done && rc->freed_bytes > 0)) {
        rc->freed_bytes = 0;
        alloc_release_free_pages();
    }
}

static void ring_done(struct reclaim_ring *r)
{
    list_remove(&r->link);
    free(r->ring.entries);
    free(r);
}

static void on_timer(uv_timer_t *timer)
{
    struct reclaim *rc = timer->data;
    ASSERT(!list_empty(&rc->rings));
    struct reclaim_ring *r = CONTAINER_OF(list_first(&rc->rings), struct reclaim_ring, link);
    uint32_t left = r->ring.count - r->next;
    uint32_t n = left < RECLAIM_SLICE_MESSAGES ? left : RECLAIM_SLICE_MESSAGES;
    rc->freed_bytes += drop(&r->ring, r->next, r->next + n);
    r->next += n;
    if (r->next == r->ring.count)
        ring_done(r);
    bool done = list_empty(&rc->rings);
    trim_maybe(rc, done);
    if (done)
        uv_timer_stop(timer);
}

void reclaim_init(struct reclaim *rc, uv_loop_t *loop)
{
    *rc = (struct reclaim){0};
    list_init(&rc->rings);
    rc->timer = xcalloc(1, sizeof *rc->timer);
    uv_timer_init(loop, rc->timer);
    rc->timer->data = rc;
}

static void on_timer_closed(uv_handle_t *handle)
{
    free(handle);
}

void reclaim_stop(struct reclaim *rc)
{
    if (rc->timer == NULL)
        return;
    uv_close((uv_handle_t *)rc->timer, on_timer_closed);
    rc->timer = NULL;
}

void reclaim_free(struct reclaim *rc)
{
    ASSERT(rc->timer == NULL);
    while (!list_empty(&rc->rings)) {
        struct reclaim_ring *r = CONTAINER_OF(list_first(&rc->rings), struct reclaim_ring, link);
        drop(&r->ring, r->next, r->ring.count);
        ring_done(r);
    }
}

void reclaim_ring(struct reclaim *rc, struct queue_ring *ring)
{
    if (ring->count == 0) {
        free(ring->entries);
    } else if (rc == NULL || rc->timer == NULL || ring->count <= RECLAIM_SLICE_MESSAGES) {
        uint64_t bytes = drop(ring, 0, ring->count);
        free(ring->entries);
        if (rc != NULL) {
            rc->freed_bytes += bytes;
            trim_maybe(rc, false);
        }
    } else {
        struct reclaim_ring *r = xcalloc(1, sizeof *r);
        r->ring = *ring;
        list_push_back(&rc->rings, &r->link);
        if (!uv_is_active((uv_handle_t *)rc->timer))
            uv_timer_start(rc->timer, on_timer, RECLAIM_EVERY_MS, RECLAIM_EVERY_MS);
    }
    *ring = (struct queue_ring){0};
}
