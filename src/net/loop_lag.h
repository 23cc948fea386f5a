/*
 * loop_lag.h: how long the loop thread goes without looking for new
 * events, the delay a message or request arriving at the wrong moment
 * waits before anything reads it: quay_event_loop_lag_seconds.
 *
 * Measured at every loop iteration, with no timer of its own (an idle
 * broker wakes no more often): net's check handle (after the poll's I/O
 * callbacks) samples the wall clock and libuv's idle time (the time spent
 * blocked in epoll, UV_METRICS_IDLE_TIME); an iteration's busy time is the
 * wall time since the last sample minus the idle time in it. Kept: the
 * longest iteration of the current and the previous window
 * (LOOP_LAG_WINDOW_NS each, so a reading covers the last 5 to 10 s
 * whoever reads it, and no reader resets it), and the busy time in all.
 * Owned by its struct net; the loop thread only.
 */
#ifndef QUAY_NET_LOOP_LAG_H
#define QUAY_NET_LOOP_LAG_H

#include <stdint.h>
#include <uv.h>

#define LOOP_LAG_WINDOW_NS 5000000000ull

struct loop_lag {
    uv_loop_t *loop;           /* borrowed; NULL until loop_lag_init */
    uint64_t last_ns;          /* uv_hrtime() at the last sample */
    uint64_t last_idle_ns;     /* uv_metrics_idle_time() then */
    uint64_t window_start_ns;
    uint64_t max_ns[2];        /* the longest iteration: this window, the last one */
    uint64_t busy_ns_total;    /* every iteration's busy time, since init */
};

/* Turns on libuv's idle-time accounting for loop (harmless if on). */
void loop_lag_init(struct loop_lag *lag, uv_loop_t *loop);
/* One iteration ended: called once per loop iteration (net's check). */
void loop_lag_sample(struct loop_lag *lag);
/* The longest iteration of the last 5-10 s, in ns. */
uint64_t loop_lag_max_ns(const struct loop_lag *lag);

#endif
