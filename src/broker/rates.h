/*
 * rates.h: message rates for the management API (RabbitMQ's
 * "X_details": {"rate": R}), computed away from the message path.
 *
 * The counters themselves are plain integers in their owners (a queue's
 * struct queue_stats and counts, the broker's broker_counters, a channel's
 * channel_stats, a connection's bytes), bumped on the message path by one
 * increment each, with no allocation, no lock, no clock. Once a second the
 * broker's tick (broker.c, broker_sample_rates; the queues in four parts,
 * one each 250 ms) copies the values of the owners that MOVED into their
 * struct rates; a rate is the change of a value between the newest sample
 * and the one RATES_WINDOW_S seconds older, per second of the loop's clock
 * between them. RabbitMQ shows the change over its last 5 s statistics
 * interval; ours slides by one second, so it lags by at most a second and
 * covers the same 5 s.
 *
 * Only active owners are sampled. An owner is on its broker's active list
 * (struct rates_active) from the first change of one of its values after
 * it went still until a sample finds its whole window flat (every rate
 * 0): the place that bumps a counter or changes a count tests one pointer
 * (RATES_UNLISTED) and, if the owner is off the list, links it (rates_join:
 * no allocation, no clock): queue_rates_moved (queue.h) wherever a queue's
 * stats or counts change, channel__rates_moved at a channel's bumps. A
 * connection's bytes are counted in net/, which knows nothing of rates:
 * connection_tick, which visits every connection each tick for its
 * heartbeats anyway, puts one whose bytes moved back on its list before
 * the tick samples. New owners join at creation, for their first sample.
 * So the sampling costs in proportion to the owners whose values moved in
 * the last window: with 50,000 idle queues the tick walks none of them
 * (bench/RESULTS.md, "sampling only the owners that moved": ~7.3 M
 * instructions a second and ~0.9% of a core before, ~0.03% now; the
 * pauses that raised the p99 latency of a 2,000 msg/s stream are gone
 * with it). The message
 * path pays one compare and a branch per mark (the join is cold); the
 * counters' other costs were cut alongside (channel__counters inline,
 * delivery counters by index), so a message costs ~7 instructions less
 * than before the lists (bench/RESULTS.md).
 *
 * The broker's queue_totals (overview) are kept without a walk too: each
 * sample adds the change of the queue's counts since its newest, and a
 * deleted queue takes its newest out (queue.c, rates_retire).
 *
 * The invariant that makes skipping exact: an owner off the list holds
 * the values of its newest sample. When it comes back, the ticks it
 * missed are taken as samples equal to newest (they were), so its first
 * window after a pause is the change since the pause over the window's
 * real clock times: a burst of N after an hour reads N / 5 s, never more
 * nor a negative rate. Whoever changes a value without marking its owner
 * breaks this; ASan builds (the tests) check it every round for queues,
 * channels and the totals (broker.c, check_idle_queues).
 *
 * Memory: an owner embeds struct rates, the newest sample, a pointer and
 * the list link; the older samples (RATES_SLOTS of them) are allocated
 * only while the owner's values change and freed once they have stood
 * still for a whole window (when it also leaves the list). 50,000 idle
 * queues cost sizeof(struct rates) each and nothing more.
 *
 * Samples are 32-bit: a difference over one window is exact while a value
 * moves by less than 2^31 in 5 s. Counts that go down (messages ready)
 * are read as signed differences.
 */
#ifndef QUAY_BROKER_RATES_H
#define QUAY_BROKER_RATES_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/list.h"

#define RATES_WINDOW_S 5
#define RATES_SLOTS (RATES_WINDOW_S + 1) /* samples 1 s apart: 5 s from oldest to newest */
#define RATES_VALUES_MAX 10
#define RATES_SAMPLE_MS 1000

/* The broker's sample times, shared by every owner: an owner's ring's
 * slots line up with these (a tick it was not sampled at is filled in). */
struct rates_clock {
    /* Loop time of tick t at [t % (RATES_SLOTS + 1)]: one more than an
     * owner holds, for an owner sampled a tick late (its part of the walk
     * comes after the tick, broker.c). */
    uint64_t at_ms[RATES_SLOTS + 1];
    uint64_t ticks;              /* ticks taken */
};

/* Embedded in its owner; zero-initialised is valid (no samples yet, off
 * every list). */
struct rates {
    uint32_t newest[RATES_VALUES_MAX]; /* the last sample (zero until held > 0) */
    uint32_t *ring;    /* owned while values move: RATES_SLOTS * RATES_VALUES_MAX, or NULL */
    uint64_t held;     /* consecutive ticks whose values are known, up to RATES_SLOTS */
    uint64_t tick;     /* the clock's tick of newest (valid when held > 0) */
    uint8_t still;     /* ticks since a value last changed, up to RATES_SLOTS */
    uint8_t part;      /* which of its owner kind's lists it joins (broker.c) */
    struct list_node active_link; /* in a struct rates_active, or {NULL, NULL} */
};

/* The owners that may have moved since their newest sample (the only ones
 * a tick samples). Zero-initialised is valid (empty). Owned by the broker. */
struct rates_active {
    struct list_node owners; /* struct rates.active_link */
    uint32_t count;
};

/* The message path's test: one load and a branch. */
static inline bool rates_listed(const struct rates *r)
{
    return r->active_link.next != NULL;
}
/* For the message path's "if (!rates_listed(r)) join": the join is rare
 * (an owner that went still), so the compiler keeps it and the registers
 * it needs out of the callers' common path (measured: without it,
 * queue_settle saved two more registers on every call). */
#define RATES_UNLISTED(r) __builtin_expect(!rates_listed(r), 0)
#define RATES_COLD __attribute__((cold, noinline))
/* Puts r on the list (it must not be on one). */
void rates_join(struct rates_active *active, struct rates *r);
/* Takes r off its list, if it is on one. */
void rates_leave(struct rates_active *active, struct rates *r);
/* After a sample: whether every rate of r reads 0 now and will until a
 * value moves (then it may leave its list). */
static inline bool rates_still(const struct rates *r)
{
    return r->ring == NULL;
}

/* A new tick at now_ms: call before sampling the owners. */
void rates_clock_tick(struct rates_clock *clock, uint64_t now_ms);
/* The owner's values at the clock's newest tick (n <= RATES_VALUES_MAX);
 * a second sample at the same tick is ignored. The ticks since its newest
 * sample that it was not sampled at count as samples equal to newest
 * (it was off its list: its values had not moved). */
void rates_sample(struct rates *r, const struct rates_clock *clock, const uint32_t *values,
                  uint32_t n);
/* Per second over the window (or what of it was sampled); 0.0 if the value
 * stood still or fewer than two samples exist. */
double rates_per_s(const struct rates *r, const struct rates_clock *clock, uint32_t index);
void rates_free(struct rates *r);

#endif
