/*
 * rates.h: message rates for the management API (RabbitMQ's
 * "X_details": {"rate": R}), computed away from the message path.
 *
 * The counters themselves are plain integers in their owners (a queue's
 * struct queue_stats, the broker's broker_counters, a channel's
 * channel_stats), bumped on the message path by one increment each, with
 * no allocation, no lock, no clock. Once a second the broker's tick
 * (broker.c, sample_rates; the queues in four parts, one each 250 ms)
 * copies every owner's values into the owner's struct rates; a rate is
 * the change of a value between the newest sample and the one
 * RATES_WINDOW_S seconds older, per second of the loop's clock between
 * them. RabbitMQ shows the change over its last
 * 5 s statistics interval; ours slides by one second, so it lags by at
 * most a second and covers the same 5 s.
 *
 * Memory: an owner embeds struct rates, the newest sample and a pointer;
 * the older samples (RATES_SLOTS of them) are allocated only while the
 * owner's values change and freed once they have stood still for a whole
 * window (its rates are 0 then). 50,000 idle queues cost
 * sizeof(struct rates) each and nothing more; the tick walks them all
 * once a second (bench/RESULTS.md: about 0.7% of a core for 50,000, and
 * a p99 latency of ~1-1.7 ms instead of ~0.2 ms at 2,000 msg/s then: the
 * messages that arrive during a part's pause).
 *
 * Samples are 32-bit: a difference over one window is exact while a value
 * moves by less than 2^31 in 5 s. Counts that go down (messages ready)
 * are read as signed differences.
 */
#ifndef QUAY_BROKER_RATES_H
#define QUAY_BROKER_RATES_H

#include <stdint.h>

#define RATES_WINDOW_S 5
#define RATES_SLOTS (RATES_WINDOW_S + 1) /* samples 1 s apart: 5 s from oldest to newest */
#define RATES_VALUES_MAX 10
#define RATES_SAMPLE_MS 1000

/* The broker's sample times, shared by every owner: each owner is sampled
 * at every tick, so its ring's slots line up with these. */
struct rates_clock {
    /* Loop time of tick t at [t % (RATES_SLOTS + 1)]: one more than an
     * owner holds, for an owner sampled a tick late (its part of the walk
     * comes after the tick, broker.c). */
    uint64_t at_ms[RATES_SLOTS + 1];
    uint64_t ticks;              /* ticks taken */
};

/* Embedded in its owner; zero-initialised is valid (no samples yet). */
struct rates {
    uint32_t newest[RATES_VALUES_MAX]; /* the last sample (valid when held > 0) */
    uint32_t *ring;    /* owned while values move: RATES_SLOTS * RATES_VALUES_MAX, or NULL */
    uint64_t held;     /* consecutive ticks sampled, up to RATES_SLOTS */
    uint64_t tick;     /* the clock's tick of newest (valid when held > 0) */
    uint8_t still;     /* ticks since a value last changed, up to RATES_SLOTS */
};

/* A new tick at now_ms: call before sampling the owners. */
void rates_clock_tick(struct rates_clock *clock, uint64_t now_ms);
/* The owner's values at the clock's newest tick (n <= RATES_VALUES_MAX);
 * a second sample at the same tick is ignored. An owner not sampled at the
 * tick before starts over (its rates read 0.0 until two samples are held
 * again). */
void rates_sample(struct rates *r, const struct rates_clock *clock, const uint32_t *values,
                  uint32_t n);
/* Per second over the window (or what of it was sampled); 0.0 if the value
 * stood still or fewer than two samples exist. */
double rates_per_s(const struct rates *r, const struct rates_clock *clock, uint32_t index);
void rates_free(struct rates *r);

#endif
