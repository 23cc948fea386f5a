/*
 * origin.h: what a queue took from each forwarding stream, so that a
 * forward sent again (its answer was lost with the link that carried it)
 * is not enqueued twice.
 *
 * A proxy forwards publishes to a queue's primary on one link channel per
 * (peer, vhost); each forwarder picks a random 64-bit stream id when it is
 * opened and numbers its forwards (the link sequence number), so a forward's
 * origin is (stream, seq), and a resend carries its original origin. A
 * stream's forwards arrive in order on their channel, so the primary keeps,
 * per queue, one mark per stream: the highest seq the queue took from it.
 * A forward at or below its stream's mark was taken already: a duplicate
 * (the receiving channel stops recording once it refused any forward,
 * channel.c, so a refused seq never hides under a later mark).
 *
 * Bounded: at most ORIGIN_MARKS_MAX streams per queue (the least recently
 * seen is forgotten first), and a stream not seen for ORIGIN_IDLE_MS is
 * forgotten. Forgetting can only let a duplicate through (the resend is
 * taken again), never refuse a new publish. 16 marks of 32 bytes: 516 bytes
 * per queue that took a forward, allocated at the first one.
 *
 * Each mark keeps the journal sync ticket of the newest message it
 * recorded, so a duplicate's confirm can wait for the original's fsync (the
 * newest one's covers it: tickets only grow). Times are the caller's
 * monotonic clock. Pure (no I/O); the loop thread owns it, like its queue.
 */
#ifndef QUAY_BROKER_ORIGIN_H
#define QUAY_BROKER_ORIGIN_H

#include <stdbool.h>
#include <stdint.h>

#define ORIGIN_MARKS_MAX 16
#define ORIGIN_IDLE_MS (5u * 60u * 1000u)

struct origin_mark {
    uint64_t stream;   /* never 0 (0: no origin) */
    uint64_t seq;      /* the highest seq taken from the stream */
    uint64_t ticket;   /* the journal ticket of the newest message recorded, 0 if none */
    uint64_t seen_ms;  /* last recorded or matched */
};

struct origin_marks {
    uint32_t count;
    struct origin_mark marks[ORIGIN_MARKS_MAX];
};

/* Was (stream, seq) taken already (at or below its stream's mark)? Forgets
 * idle streams first; a match counts as seen. *ticket (may be NULL) gets
 * the mark's ticket. Stream 0 is never seen. */
bool origin_seen(struct origin_marks *m, uint64_t stream, uint64_t seq, uint64_t now_ms,
                 uint64_t *ticket);
/* Records (stream, seq) as taken, with its message's journal ticket (the
 * mark keeps the highest seq and ticket). Stream 0 is ignored. */
void origin_record(struct origin_marks *m, uint64_t stream, uint64_t seq, uint64_t now_ms,
                   uint64_t ticket);

#endif
