/*
 * test_pace.c: the catch-up's byte rate (lib/pace.h).
 *
 * Goal: a paced sender gets its rate over time, smoothly (never more than
 * the 2 ms burst ahead of it, however long it waited), low rates checked
 * often still fill, overspending is paid back by a wait pace_wait_ns
 * names exactly, and rate 0 never holds anything back. Method: a sender
 * simulated against a clock the test moves.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "lib/pace.h"

#define MS 1000000ull
#define SEC 1000000000ull

/* Sends chunk-byte pieces as fast as the pace allows, the clock moving
 * step_ns between checks, for duration_ns: the bytes sent. */
static uint64_t simulate(uint64_t rate, uint64_t chunk, uint64_t step_ns, uint64_t duration_ns,
                         uint64_t *most_in_a_ms)
{
    struct pace p;
    pace_init(&p, rate);
    uint64_t sent = 0, window_start = 1, in_window = 0;
    *most_in_a_ms = 0;
    for (uint64_t now = 1; now < duration_ns; now += step_ns) {
        if (now - window_start >= MS) {
            window_start = now;
            in_window = 0;
        }
        while (pace_ready(&p, now)) {
            pace_spend(&p, chunk);
            sent += chunk;
            in_window += chunk;
        }
        if (in_window > *most_in_a_ms)
            *most_in_a_ms = in_window;
    }
    return sent;
}

static void the_rate_is_kept_smoothly(void **state)
{
    (void)state;
    uint64_t rate = 200000000, most; /* 200 MB/s, 1 KiB pieces, checked every 50 µs */
    uint64_t sent = simulate(rate, 1024, 50000, SEC, &most);
    assert_true(sent >= rate * 99 / 100 && sent <= rate * 101 / 100 + 2 * rate / 500);
    /* Never more in a millisecond than the burst and a millisecond's rate. */
    assert_true(most <= rate / 500 + rate / 1000 + 1024);
}

static void a_long_wait_buys_no_more_than_the_burst(void **state)
{
    (void)state;
    struct pace p;
    pace_init(&p, 100000000); /* 100 MB/s: a 2 ms burst is 200,000 bytes */
    assert_true(pace_ready(&p, 1));
    pace_spend(&p, 1);
    uint64_t sent = 0;
    while (pace_ready(&p, 10 * SEC)) { /* ten seconds later */
        pace_spend(&p, 1000);
        sent += 1000;
    }
    assert_true(sent <= 200000 + 1000);
    assert_true(sent >= 200000 - 1000);
}

static void a_low_rate_checked_often_still_fills(void **state)
{
    (void)state;
    uint64_t most;
    /* 500 bytes a second checked every 10 µs: 0.005 bytes per check. */
    uint64_t sent = simulate(500, 100, 10000, 4 * SEC, &most);
    assert_true(sent >= 1900 && sent <= 2100);
}

static void the_wait_pays_off_the_debt(void **state)
{
    (void)state;
    struct pace p;
    pace_init(&p, 1000000); /* 1 MB/s: 1 byte a µs */
    assert_true(pace_ready(&p, SEC));
    pace_spend(&p, 2000 + 10000); /* the 2,000-byte burst and 10,000 more */
    assert_false(pace_ready(&p, SEC));
    uint64_t wait = pace_wait_ns(&p);
    assert_true(wait >= 10 * MS && wait <= 10 * MS + 10000);
    assert_false(pace_ready(&p, SEC + wait - 100000)); /* 0.1 ms early */
    assert_true(pace_ready(&p, SEC + wait + 1000));
}

static void rate_zero_holds_nothing_back(void **state)
{
    (void)state;
    struct pace p;
    pace_init(&p, 0);
    for (int i = 0; i < 1000; i++) {
        assert_true(pace_ready(&p, 5));
        pace_spend(&p, 1u << 30);
    }
    assert_int_equal(pace_wait_ns(&p), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_rate_is_kept_smoothly),
        cmocka_unit_test(a_long_wait_buys_no_more_than_the_burst),
        cmocka_unit_test(a_low_rate_checked_often_still_fills),
        cmocka_unit_test(the_wait_pays_off_the_debt),
        cmocka_unit_test(rate_zero_holds_nothing_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
