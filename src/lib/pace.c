/*
 * pace.c: see pace.h.
 */
#include "lib/pace.h"

static int64_t burst(const struct pace *p)
{
    int64_t b = (int64_t)(p->rate * PACE_BURST_NS / 1000000000u);
    return b > 0 ? b : 1;
}

void pace_init(struct pace *p, uint64_t rate)
{
    *p = (struct pace){.rate = rate};
}

bool pace_ready(struct pace *p, uint64_t now_ns)
{
    if (p->rate == 0)
        return true;
    if (p->at_ns == 0) {
        p->at_ns = now_ns;
        p->tokens = burst(p);
    } else if (now_ns > p->at_ns) {
        /* Whole bytes only: the time short of one more stays counted (a
         * low rate checked often still fills). In µs: no overflow below
         * 18 TB/s. */
        uint64_t elapsed = now_ns - p->at_ns;
        uint64_t refill = elapsed >= 1000000000u ? p->rate : p->rate * (elapsed / 1000u) / 1000000u;
        int64_t max = burst(p);
        if (p->tokens + (int64_t)refill >= max) {
            p->tokens = max;
            p->at_ns = now_ns;
        } else if (refill > 0) {
            p->tokens += (int64_t)refill;
            p->at_ns += refill * 1000000000u / p->rate;
        }
    }
    return p->tokens > 0;
}

void pace_spend(struct pace *p, uint64_t bytes)
{
    if (p->rate > 0)
        p->tokens -= (int64_t)bytes;
}

uint64_t pace_wait_ns(const struct pace *p)
{
    if (p->rate == 0 || p->tokens > 0)
        return 0;
    return (uint64_t)(1 - p->tokens) * 1000000000u / p->rate + 1;
}
