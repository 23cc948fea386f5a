/*
 * pace.h: a byte rate kept smooth: a token bucket refilled by the time
 * that passed, holding at most PACE_BURST_NS worth of the rate.
 *
 * The catch-up's budget used to be refilled once per 100 ms tick: a
 * catch-up ran at full speed for part of each tick and then waited, and
 * the full-speed part took both cores of a small machine from the
 * publishers it was meant to spare. Refilled at every check, a bucket of
 * 2 ms lets the sender go a few hundred KiB at a time, all the time.
 * Pure: the caller gives the time (uv_hrtime) and arms its own timer for
 * pace_wait_ns.
 */
#ifndef QUAY_LIB_PACE_H
#define QUAY_LIB_PACE_H

#include <stdbool.h>
#include <stdint.h>

#define PACE_BURST_NS 2000000u

struct pace {
    uint64_t rate;    /* bytes a second; 0: unbounded */
    int64_t tokens;   /* what may go now; negative: overspent */
    uint64_t at_ns;   /* when tokens were last refilled (0: never) */
};

void pace_init(struct pace *p, uint64_t rate);
/* Refills to now_ns; whether anything may go (always, unbounded). */
bool pace_ready(struct pace *p, uint64_t now_ns);
/* bytes went (they may overspend: the next ones wait longer). */
void pace_spend(struct pace *p, uint64_t bytes);
/* After pace_ready said no: how long until it says yes (the time the
 * rate takes to pay the debt off). */
uint64_t pace_wait_ns(const struct pace *p);

#endif
