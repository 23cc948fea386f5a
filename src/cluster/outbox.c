/*
 * outbox.c: single-entry proposals gathered per loop iteration. See
 * outbox.h for why.
 */
#include "cluster/outbox.h"

#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/list.h" /* CONTAINER_OF */

/* The entries' copies and their array. */
static void items_free(struct consensus_cmd *items, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++)
        free((void *)items[i].bytes);
    free(items);
}

static void outbox_flush(uv_idle_t *idle)
{
    struct outbox *box = CONTAINER_OF(idle, struct outbox, idle);
    uv_idle_stop(idle);
    /* Taken out first: what a proposal adds (libraft does not call back
     * from inside it, but nothing here relies on that) waits for the next
     * flush instead of being dropped with these. */
    struct consensus_cmd *items = box->items;
    uint32_t count = box->count;
    box->items = NULL;
    box->count = box->capacity = 0;
    for (uint32_t i = 0; i < count; i += OUTBOX_BATCH) {
        uint32_t n = count - i < OUTBOX_BATCH ? count - i : OUTBOX_BATCH;
        (void)box->propose(box->ctx, &items[i], n); /* a failure: see outbox.h */
    }
    items_free(items, count);
}

void outbox_init(struct outbox *box, uv_loop_t *loop, outbox_propose_fn propose, void *ctx)
{
    ASSERT(box != NULL && loop != NULL && propose != NULL);
    *box = (struct outbox){.propose = propose, .ctx = ctx};
    uv_idle_init(loop, &box->idle);
}

void outbox_add(struct outbox *box, const uint8_t *entry, size_t size)
{
    ASSERT(entry != NULL && size > 0);
    if (box->count == box->capacity) {
        uint32_t capacity = box->capacity ? box->capacity * 2 : 64;
        struct consensus_cmd *items = xrealloc(box->items, capacity * sizeof *items);
        box->items = items;
        box->capacity = capacity;
    }
    uint8_t *copy = xmalloc(size);
    memcpy(copy, entry, size);
    box->items[box->count++] = (struct consensus_cmd){copy, size};
    if (box->count == 1)
        uv_idle_start(&box->idle, outbox_flush);
}

void outbox_close(struct outbox *box, uv_close_cb close_cb)
{
    items_free(box->items, box->count);
    box->items = NULL;
    box->count = box->capacity = 0;
    uv_idle_stop(&box->idle);
    uv_close((uv_handle_t *)&box->idle, close_cb);
}
