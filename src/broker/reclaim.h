/*
 * reclaim.h: letting go of many messages without stalling the loop.
 *
 * A copy of a queue that goes all at once (a backup let go after a move, a
 * replica reset for a new catch-up), or a queue's ready messages (a purge,
 * a delete: the old primary of a planned move lets go of its queue that
 * way), may be hundreds of thousands of messages. Unreferencing them and
 * giving their pages back to the system took 10 ms and 25 ms of one loop
 * turn for 200,000 x 1 KiB (bench/RESULTS.md), and no confirm on this
 * broker went out meanwhile: the p99 of a queue whose publisher came
 * through this broker tripled in that second. A ring handed here is
 * emptied RECLAIM_SLICE_MESSAGES at a time, one slice every
 * RECLAIM_EVERY_MS (a timer: the loop sleeps or serves its clients in
 * between; slices in every turn, back to back, made every turn ~1 ms
 * longer for as long as it lasted, and every confirm passing through that
 * much later), and the allocator's free pages are given back
 * (alloc_release_free_pages) after every RECLAIM_TRIM_BYTES freed. For
 * 1 KiB messages that is a million a second, a third of the loop.
 *
 * Owned by the broker. Once stopped (the loop is closing its handles), a
 * ring handed here is emptied at once, and reclaim_free empties what was
 * left: every message is unreferenced before the broker checks that none
 * is live.
 */
#ifndef QUAY_BROKER_RECLAIM_H
#define QUAY_BROKER_RECLAIM_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "lib/list.h"

struct queue_ring;

/* Messages unreferenced a slice: ~0.1 ms of free() for 1 KiB ones. */
#define RECLAIM_SLICE_MESSAGES 1024u
#define RECLAIM_EVERY_MS 1u
/* Freed bytes after which the free pages go back: a trim costs ~0.15 ms a
 * MiB here (madvise), 0.7-1.2 ms for 4 MiB, 2.5-3.3 ms for 16. */
#define RECLAIM_TRIM_BYTES (4u << 20)

struct reclaim {
    uv_timer_t *timer;        /* owned: active while rings wait; NULL once stopped */
    struct list_node rings;   /* struct reclaim_ring, oldest first */
    uint64_t freed_bytes;     /* body bytes unreferenced since the last trim */
};

void reclaim_init(struct reclaim *rc, uv_loop_t *loop);
/* Closes the timer (the loop's handles are closing); what waits, and
 * what is handed later, goes at once. */
void reclaim_stop(struct reclaim *rc);
/* Unreferences what is left (after reclaim_stop). */
void reclaim_free(struct reclaim *rc);

/* Takes ring's entries (each holds one reference to its message unless it
 * is paged or a hole: message NULL) and leaves *ring empty. A ring of at
 * most RECLAIM_SLICE_MESSAGES entries goes at once. rc may be NULL (unit
 * tests): at once too. */
void reclaim_ring(struct reclaim *rc, struct queue_ring *ring);

#endif
