/*
 * dedup.h: the message-ids a queue enqueued within its de-duplication
 * window (x-quay-dedup-window, quay's own queue argument).
 *
 * A FIFO of (first seen, id) in time order plus a hash set over the ids:
 * recording and looking up are O(1), and expiry pops from the FIFO's head,
 * so memory is bounded by window x publish rate. An id is forgotten
 * window_ms after it was first seen; seeing it again does not restart its
 * window (a publisher that keeps resending cannot keep an id alive, and
 * the table needs no reordering).
 *
 * The table is about publishes, not contents: consuming or purging a
 * message does not forget its id. Times are the caller's monotonic clock
 * (the broker's loop time) and must not go backwards.
 *
 * Each entry also keeps the journal sync ticket of the message that
 * recorded it (0: none), so a duplicate's confirm can wait for the fsync
 * of the original it stands for.
 *
 * Memory: the table owns a copy of every id it holds; dedup_free releases
 * them. Not thread-safe (the loop thread owns it, like its queue).
 */
#ifndef QUAY_BROKER_DEDUP_H
#define QUAY_BROKER_DEDUP_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"
#include "lib/hash.h"

/* One allocation per id: the hash set points at it, so it must not move
 * when the FIFO grows. */
struct dedup_id {
    uint64_t ticket;   /* the original's journal sync ticket, 0 if none */
    uint8_t len;       /* a shortstr: <= 255 */
    uint8_t bytes[];
};

struct dedup_entry {
    uint64_t seen_ms;  /* first seen: the entry expires at seen_ms + window_ms */
    struct dedup_id *id; /* owned */
};

struct dedup {
    uint64_t window_ms;        /* > 0 */
    struct dedup_entry *items; /* owned ring in seen_ms order */
    uint32_t head, count, cap;
    struct hmap ids;           /* id bytes -> its struct dedup_id (the key borrows it) */
};

void dedup_init(struct dedup *dedup, uint64_t window_ms);
void dedup_free(struct dedup *dedup);

/* Forgets the ids first seen at or before now_ms - window_ms. */
void dedup_expire(struct dedup *dedup, uint64_t now_ms);
/* Was id seen within the window (expiring first)? An empty id is never
 * seen. *ticket (may be NULL) gets the original's ticket. */
bool dedup_seen(struct dedup *dedup, struct bytes id, uint64_t now_ms, uint64_t *ticket);
/* Remembers id as seen at now_ms, unless it is already remembered (its
 * window is not restarted) or empty. True if it was added. */
bool dedup_record(struct dedup *dedup, struct bytes id, uint64_t now_ms, uint64_t ticket);

static inline uint32_t dedup_count(const struct dedup *dedup)
{
    return dedup->count;
}

#endif
