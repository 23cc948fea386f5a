/*
 * rates.c: see rates.h. Pure: no I/O, no clock of its own.
 */
#include "broker/rates.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"

void rates_clock_tick(struct rates_clock *clock, uint64_t now_ms)
{
    ASSERT(clock->ticks == 0 ||
           now_ms >= clock->at_ms[(clock->ticks - 1) % ARRAY_SIZE(clock->at_ms)]);
    clock->at_ms[clock->ticks % ARRAY_SIZE(clock->at_ms)] = now_ms;
    clock->ticks++;
}

static uint32_t *slot(uint32_t *ring, uint64_t tick)
{
    return ring + (tick % RATES_SLOTS) * RATES_VALUES_MAX;
}

void rates_sample(struct rates *r, const struct rates_clock *clock, const uint32_t *values,
                  uint32_t n)
{
    ASSERT(n <= RATES_VALUES_MAX);
    ASSERT(clock->ticks > 0);
    uint64_t tick = clock->ticks - 1;
    if (r->held > 0 && r->tick == tick)
        return; /* sampled at this tick already */
    if (r->held > 0 && r->tick + 1 != tick) {
        /* Ticks it was off its list at: its values were newest then. */
        ASSERT(r->tick < tick);
        uint64_t gap = tick - r->tick - 1;
        for (uint64_t k = 1; r->ring != NULL && k <= gap && k < RATES_SLOTS; k++)
            memcpy(slot(r->ring, r->tick + k), r->newest, n * sizeof *values);
        r->held = r->held + gap < RATES_SLOTS ? r->held + gap : RATES_SLOTS;
        r->still = (uint8_t)(r->still + gap < RATES_SLOTS ? r->still + gap : RATES_SLOTS);
    }
    r->tick = tick;
    bool moved = r->held > 0 && memcmp(r->newest, values, n * sizeof *values) != 0;
    if (moved && r->ring == NULL) {
        /* The values stood still at newest for every tick held until now. */
        r->ring = xcalloc(RATES_SLOTS * RATES_VALUES_MAX, sizeof *r->ring);
        for (uint64_t k = 1; k <= r->held && k < RATES_SLOTS; k++)
            memcpy(slot(r->ring, tick - k), r->newest, n * sizeof *values);
    }
    memcpy(r->newest, values, n * sizeof *values);
    if (r->held < RATES_SLOTS)
        r->held++;
    r->still = moved ? 0 : (uint8_t)(r->still < RATES_SLOTS ? r->still + 1 : RATES_SLOTS);
    if (r->ring == NULL)
        return;
    memcpy(slot(r->ring, tick), values, n * sizeof *values);
    if (r->still >= RATES_SLOTS - 1) { /* a flat window: every rate is 0 */
        free(r->ring);
        r->ring = NULL;
    }
}

double rates_per_s(const struct rates *r, const struct rates_clock *clock, uint32_t index)
{
    ASSERT(index < RATES_VALUES_MAX);
    if (r->ring == NULL || r->held < 2)
        return 0.0;
    uint64_t newest = r->tick;
    uint64_t oldest = newest - (r->held - 1);
    if (clock->ticks - oldest > ARRAY_SIZE(clock->at_ms))
        return 0.0; /* not sampled for a while: its clock times are gone */
    uint64_t dt_ms = clock->at_ms[newest % ARRAY_SIZE(clock->at_ms)] -
                     clock->at_ms[oldest % ARRAY_SIZE(clock->at_ms)];
    if (dt_ms == 0)
        return 0.0;
    int32_t change = (int32_t)(slot(r->ring, newest)[index] - slot(r->ring, oldest)[index]);
    return (double)change * 1000.0 / (double)dt_ms;
}

void rates_join(struct rates_active *active, struct rates *r)
{
    ASSERT(!rates_listed(r));
    if (active->owners.next == NULL)
        list_init(&active->owners); /* zero-initialised */
    list_push_back(&active->owners, &r->active_link);
    active->count++;
}

void rates_leave(struct rates_active *active, struct rates *r)
{
    if (!rates_listed(r))
        return;
    ASSERT(active->count > 0);
    list_remove(&r->active_link);
    r->active_link = (struct list_node){NULL, NULL};
    active->count--;
}

void rates_free(struct rates *r)
{
    free(r->ring);
    r->ring = NULL;
}
