/*
 * test_rates.c: broker/rates.h, the once-a-second samples behind the
 * management API's "X_details": {"rate": R}.
 *
 * Goal: a steady counter reads its rate per second over the 5 s window
 * (and over what was sampled of it while young); a count that falls reads
 * a negative rate; an owner read before its late sample keeps its window
 * and the ticks an owner missed (off its list) count as its newest values;
 * a value that stood still for a window reads 0.0 and
 * its older samples are freed (idle owners cost nothing but their embedded
 * struct); a 32-bit wrap of a sample does not disturb a difference.
 *
 * Method: drive a rates_clock by hand with chosen loop times and sample
 * chosen values; ASan reports a leaked or doubly freed ring.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "broker/rates.h"

static void tick(struct rates_clock *clock, struct rates *r, uint64_t at_ms, uint32_t a,
                 uint32_t b)
{
    rates_clock_tick(clock, at_ms);
    uint32_t values[2] = {a, b};
    rates_sample(r, clock, values, 2);
}

static void steady_rate_over_the_window(void **state)
{
    (void)state;
    struct rates_clock clock = {0};
    struct rates r = {0};
    tick(&clock, &r, 1000, 0, 100);
    assert_true(rates_per_s(&r, &clock, 0) == 0.0); /* one sample: no rate */
    tick(&clock, &r, 2000, 10, 100);
    assert_true(rates_per_s(&r, &clock, 0) == 10.0); /* young: over what was sampled */
    for (uint32_t s = 3; s <= 20; s++)
        tick(&clock, &r, s * 1000, (s - 1) * 10, 100 - (s - 1));
    assert_true(rates_per_s(&r, &clock, 0) == 10.0);
    assert_true(rates_per_s(&r, &clock, 1) == -1.0); /* a count that falls */
    /* An uneven tick: the rate divides by the loop time between samples. */
    tick(&clock, &r, 21500, 20 * 10 + 15, 81);
    assert_true(rates_per_s(&r, &clock, 0) > 10.0);
    rates_free(&r);
}

static void still_values_free_their_ring(void **state)
{
    (void)state;
    struct rates_clock clock = {0};
    struct rates r = {0};
    tick(&clock, &r, 1000, 5, 5);
    tick(&clock, &r, 2000, 5, 5);
    assert_null(r.ring); /* never moved: nothing allocated */
    tick(&clock, &r, 3000, 6, 5);
    assert_non_null(r.ring);
    assert_true(rates_per_s(&r, &clock, 0) == 0.5); /* 1 over the 2 s sampled */
    for (uint32_t s = 4; s < 4 + RATES_WINDOW_S - 1; s++) {
        tick(&clock, &r, s * 1000, 6, 5);
        assert_non_null(r.ring);
        assert_true(rates_per_s(&r, &clock, 0) > 0.0);
    }
    tick(&clock, &r, (4 + RATES_WINDOW_S - 1) * 1000, 6, 5);
    assert_null(r.ring); /* a flat window */
    assert_true(rates_per_s(&r, &clock, 0) == 0.0);
    tick(&clock, &r, (4 + RATES_WINDOW_S) * 1000, 11, 5); /* moves again */
    assert_true(rates_per_s(&r, &clock, 0) == 1.0);
    rates_free(&r);
}

static void wrap_of_a_sample(void **state)
{
    (void)state;
    struct rates_clock clock = {0};
    struct rates r = {0};
    tick(&clock, &r, 0, UINT32_MAX - 9, 0);
    tick(&clock, &r, 1000, 10, 0); /* the 64-bit counter went past 2^32 */
    assert_true(rates_per_s(&r, &clock, 0) == 20.0);
    rates_free(&r);
}

/* The broker samples its queues in parts after each tick: an owner read
 * between the tick and its part still has its previous window. An owner
 * not sampled at a tick was off its list (rates.h), its values unchanged:
 * the ticks it missed count as samples equal to its newest. */
static void late_owners_and_skipped_ticks(void **state)
{
    (void)state;
    struct rates_clock clock = {0};
    struct rates r = {0};
    for (uint32_t s = 1; s <= 8; s++)
        tick(&clock, &r, s * 1000, s * 4, 0);
    assert_true(rates_per_s(&r, &clock, 0) == 4.0);
    rates_clock_tick(&clock, 9000); /* its part has not come yet */
    assert_true(rates_per_s(&r, &clock, 0) == 4.0);
    uint32_t values[2] = {9 * 4, 0};
    rates_sample(&r, &clock, values, 2);
    assert_true(rates_per_s(&r, &clock, 0) == 4.0);
    rates_clock_tick(&clock, 10000);
    tick(&clock, &r, 11000, 40, 0); /* missed tick 10: 36 then */
    /* 24, 28, 32, 36, (36), 40 */
    assert_true(rates_per_s(&r, &clock, 0) == 16.0 / 5);
    for (uint32_t s = 12; s <= 30; s++)
        rates_clock_tick(&clock, s * 1000); /* 19 ticks missed, its ring kept */
    tick(&clock, &r, 31000, 100, 0);
    assert_true(rates_per_s(&r, &clock, 0) == 60.0 / 5);
    rates_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(steady_rate_over_the_window),
        cmocka_unit_test(still_values_free_their_ring),
        cmocka_unit_test(wrap_of_a_sample),
        cmocka_unit_test(late_owners_and_skipped_ticks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
