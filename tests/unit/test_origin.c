/*
 * test_origin.c: a queue's marks of the forwarding streams
 * (broker/origin.h). Goal: a seq at or below its stream's mark is seen
 * (with the newest ticket recorded), one above it or of another stream is
 * not; stream 0 (no origin) is never recorded nor seen; a stream idle for
 * ORIGIN_IDLE_MS is forgotten, a matched one is kept; a full table forgets
 * the stream seen least recently, and forgetting only ever makes a seq
 * unseen (a resend taken again), never a new one seen.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "broker/origin.h"

static void test_mark_covers_what_was_taken(void **state)
{
    (void)state;
    struct origin_marks m = {0};
    uint64_t ticket = 99;
    assert_false(origin_seen(&m, 7, 1, 0, &ticket));
    assert_int_equal(ticket, 99); /* untouched when not seen */
    origin_record(&m, 7, 1, 0, 10);
    origin_record(&m, 7, 3, 1, 30);
    origin_record(&m, 7, 2, 2, 0); /* out of order: the mark stays at 3 */
    assert_true(origin_seen(&m, 7, 1, 3, &ticket));
    assert_int_equal(ticket, 30); /* the newest recorded covers the original */
    assert_true(origin_seen(&m, 7, 3, 3, NULL));
    assert_false(origin_seen(&m, 7, 4, 3, NULL));
    assert_false(origin_seen(&m, 8, 1, 3, NULL)); /* another stream */
    assert_int_equal(m.count, 1);
}

static void test_stream_zero_is_no_origin(void **state)
{
    (void)state;
    struct origin_marks m = {0};
    origin_record(&m, 0, 5, 0, 1);
    assert_int_equal(m.count, 0);
    assert_false(origin_seen(&m, 0, 1, 0, NULL));
}

static void test_idle_streams_are_forgotten(void **state)
{
    (void)state;
    struct origin_marks m = {0};
    origin_record(&m, 1, 10, 0, 0);
    origin_record(&m, 2, 10, 0, 0);
    /* A match keeps stream 2 alive; stream 1 goes idle. */
    assert_true(origin_seen(&m, 2, 5, ORIGIN_IDLE_MS - 1, NULL));
    assert_false(origin_seen(&m, 1, 5, ORIGIN_IDLE_MS, NULL));
    assert_int_equal(m.count, 1);
    assert_true(origin_seen(&m, 2, 5, 2 * ORIGIN_IDLE_MS - 2, NULL));
    assert_false(origin_seen(&m, 2, 5, 3 * ORIGIN_IDLE_MS, NULL));
    assert_int_equal(m.count, 0);
}

static void test_full_table_forgets_the_least_recent(void **state)
{
    (void)state;
    struct origin_marks m = {0};
    for (uint64_t s = 1; s <= ORIGIN_MARKS_MAX; s++)
        origin_record(&m, s, 100, s, 0);
    assert_int_equal(m.count, ORIGIN_MARKS_MAX);
    assert_true(origin_seen(&m, 1, 50, 100, NULL)); /* stream 1 is now the most recent */
    origin_record(&m, 1000, 1, 101, 0);             /* full: stream 2 goes */
    assert_int_equal(m.count, ORIGIN_MARKS_MAX);
    assert_false(origin_seen(&m, 2, 50, 102, NULL));
    assert_true(origin_seen(&m, 1, 50, 102, NULL));
    assert_true(origin_seen(&m, 3, 100, 102, NULL));
    assert_true(origin_seen(&m, 1000, 1, 102, NULL));
    assert_false(origin_seen(&m, 1000, 2, 102, NULL));
    /* Stream 2 comes back: it starts a new mark, nothing above it is seen. */
    origin_record(&m, 2, 60, 103, 0);
    assert_true(origin_seen(&m, 2, 60, 104, NULL));
    assert_false(origin_seen(&m, 2, 61, 104, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mark_covers_what_was_taken),
        cmocka_unit_test(test_stream_zero_is_no_origin),
        cmocka_unit_test(test_idle_streams_are_forgotten),
        cmocka_unit_test(test_full_table_forgets_the_least_recent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
