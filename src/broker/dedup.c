/*
 * dedup.c: see dedup.h. The FIFO is in seen_ms order because ids are only
 * ever appended at the caller's current time, which does not go back; so
 * expiry only looks at the head. Every id is in the FIFO once and in the
 * hash set once (count == ids.count): a duplicate adds nothing.
 */
#include "broker/dedup.h"

#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/ring.h"

/* Past this many slots, an emptied table gives its memory back (as a
 * queue's ring does after a backlog drained). */
#define DEDUP_KEEP_SLOTS 1024

void dedup_init(struct dedup *dedup, uint64_t window_ms)
{
    ASSERT(window_ms > 0);
    *dedup = (struct dedup){.window_ms = window_ms};
    hmap_init(&dedup->ids);
}

static struct dedup_entry *entry_at(const struct dedup *dedup, uint32_t index)
{
    return &dedup->items[(dedup->head + index) & (dedup->cap - 1)];
}

static struct bytes id_bytes(const struct dedup_id *id)
{
    return (struct bytes){id->bytes, id->len};
}

void dedup_free(struct dedup *dedup)
{
    for (uint32_t i = 0; i < dedup->count; i++)
        free(entry_at(dedup, i)->id);
    free(dedup->items);
    hmap_free(&dedup->ids);
    dedup_init(dedup, dedup->window_ms);
}

void dedup_expire(struct dedup *dedup, uint64_t now_ms)
{
    while (dedup->count > 0) {
        struct dedup_entry *oldest = entry_at(dedup, 0);
        if (oldest->seen_ms + dedup->window_ms > now_ms)
            break;
        void *was = hmap_remove(&dedup->ids, id_bytes(oldest->id));
        ASSERT(was == oldest->id);
        free(oldest->id);
        dedup->head = (dedup->head + 1) & (dedup->cap - 1);
        dedup->count--;
    }
    ASSERT(dedup->count == dedup->ids.count);
    if (dedup->count == 0 && dedup->cap > DEDUP_KEEP_SLOTS)
        dedup_free(dedup);
}

bool dedup_seen(struct dedup *dedup, struct bytes id, uint64_t now_ms, uint64_t *ticket)
{
    if (id.len == 0)
        return false;
    dedup_expire(dedup, now_ms);
    const struct dedup_id *found = hmap_get(&dedup->ids, id);
    if (found == NULL)
        return false;
    if (ticket)
        *ticket = found->ticket;
    return true;
}

bool dedup_record(struct dedup *dedup, struct bytes id, uint64_t now_ms, uint64_t ticket)
{
    ASSERT(id.len <= UINT8_MAX); /* message-id is a shortstr */
    if (id.len == 0)
        return false;
    dedup_expire(dedup, now_ms);
    if (hmap_get(&dedup->ids, id) != NULL)
        return false; /* its window is not restarted */
    /* Appending in time order is what lets expiry look only at the head. */
    ASSERT(dedup->count == 0 || entry_at(dedup, dedup->count - 1)->seen_ms <= now_ms);
    if (dedup->count == dedup->cap)
        dedup->items = ring_grow(dedup->items, sizeof *dedup->items, &dedup->head, dedup->count,
                                 &dedup->cap, 16);
    struct dedup_id *copy = xmalloc(sizeof *copy + id.len);
    copy->ticket = ticket;
    copy->len = (uint8_t)id.len;
    memcpy(copy->bytes, id.ptr, id.len);
    *entry_at(dedup, dedup->count) = (struct dedup_entry){now_ms, copy};
    dedup->count++;
    hmap_put(&dedup->ids, id_bytes(copy), copy);
    return true;
}
