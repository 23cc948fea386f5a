/*
 * test_dedup.c: the de-duplication table (broker/dedup.h). Goal: an id is
 * remembered for exactly window ms from when it was first seen (a repeat
 * does not extend it), an empty id is never remembered, the FIFO and the
 * hash set stay consistent through growth, wrap-around and expiry, an
 * emptied large table gives its memory back, and freeing a full table
 * leaks nothing (the ASan build checks).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "broker/dedup.h"

static struct bytes id_of(char *buf, size_t size, uint32_t n)
{
    int len = snprintf(buf, size, "id-%u", n);
    return (struct bytes){(const uint8_t *)buf, (uint32_t)len};
}

static void test_window_is_from_first_sight(void **state)
{
    (void)state;
    struct dedup d;
    dedup_init(&d, 100);
    assert_false(dedup_seen(&d, BYTES_LIT("a"), 0, NULL));
    assert_true(dedup_record(&d, BYTES_LIT("a"), 0, 0));
    assert_true(dedup_seen(&d, BYTES_LIT("a"), 50, NULL));
    /* A repeat does not restart the window. */
    assert_false(dedup_record(&d, BYTES_LIT("a"), 50, 0));
    assert_true(dedup_seen(&d, BYTES_LIT("a"), 99, NULL));
    assert_int_equal(dedup_count(&d), 1);
    /* Forgotten exactly window ms after it was first seen. */
    assert_false(dedup_seen(&d, BYTES_LIT("a"), 100, NULL));
    assert_int_equal(dedup_count(&d), 0);
    /* And welcome again, with a new window. */
    assert_true(dedup_record(&d, BYTES_LIT("a"), 100, 0));
    assert_true(dedup_seen(&d, BYTES_LIT("a"), 199, NULL));
    assert_false(dedup_seen(&d, BYTES_LIT("b"), 199, NULL));
    dedup_free(&d);
}

static void test_no_id_is_never_remembered(void **state)
{
    (void)state;
    struct dedup d;
    dedup_init(&d, 1000);
    struct bytes none = {0};
    assert_false(dedup_record(&d, none, 1, 0));
    assert_false(dedup_seen(&d, none, 2, NULL));
    assert_int_equal(dedup_count(&d), 0);
    dedup_free(&d);
}

static void test_ids_are_bytes_and_tickets_come_back(void **state)
{
    (void)state;
    struct dedup d;
    dedup_init(&d, 1000);
    /* Binary ids (a NUL inside), a prefix of another, the longest shortstr. */
    static const uint8_t with_nul[] = {'x', 0, 'y'};
    uint8_t longest[255];
    memset(longest, 'L', sizeof longest);
    assert_true(dedup_record(&d, (struct bytes){with_nul, 3}, 1, 7));
    assert_true(dedup_record(&d, (struct bytes){with_nul, 1}, 1, 0));
    assert_true(dedup_record(&d, (struct bytes){longest, 255}, 2, 9));
    uint64_t ticket = 123;
    assert_true(dedup_seen(&d, (struct bytes){with_nul, 3}, 3, &ticket));
    assert_int_equal(ticket, 7);
    assert_true(dedup_seen(&d, (struct bytes){with_nul, 1}, 3, &ticket));
    assert_int_equal(ticket, 0);
    assert_true(dedup_seen(&d, (struct bytes){longest, 255}, 3, &ticket));
    assert_int_equal(ticket, 9);
    assert_false(dedup_seen(&d, (struct bytes){longest, 254}, 3, NULL));
    assert_false(dedup_seen(&d, (struct bytes){with_nul, 2}, 3, NULL));
    dedup_free(&d);
}

static void test_growth_wrap_and_expiry(void **state)
{
    (void)state;
    char buf[32];
    struct dedup d;
    dedup_init(&d, 1000);
    /* 50,000 ids, one per 0.01 ms of "time" (50 per ms): the FIFO and the
     * set grow many times over. */
    for (uint32_t i = 0; i < 50000; i++)
        assert_true(dedup_record(&d, id_of(buf, sizeof buf, i), i / 50, 0));
    assert_int_equal(dedup_count(&d), 50000);
    assert_int_equal(d.ids.count, 50000);
    for (uint32_t i = 0; i < 50000; i += 997)
        assert_true(dedup_seen(&d, id_of(buf, sizeof buf, i), 999, NULL));
    /* At 1000 ms, the ids of ms 0 (the first 50) are gone, the rest stay. */
    dedup_expire(&d, 1000);
    assert_int_equal(dedup_count(&d), 50000 - 50);
    assert_false(dedup_seen(&d, id_of(buf, sizeof buf, 49), 1000, NULL));
    assert_true(dedup_seen(&d, id_of(buf, sizeof buf, 50), 1000, NULL));
    /* Steady state: new ids at the tail while old ones leave the head, so
     * the ring wraps; the count stays bounded by window x rate. */
    uint32_t cap = d.cap;
    for (uint32_t i = 50000; i < 150000; i++) {
        uint64_t now = 1000 + (i - 50000) / 50;
        assert_true(dedup_record(&d, id_of(buf, sizeof buf, i), now, 0));
        assert_true(dedup_count(&d) <= 50000);
    }
    assert_int_equal(d.cap, cap);
    assert_int_equal(dedup_count(&d), d.ids.count);
    assert_false(dedup_seen(&d, id_of(buf, sizeof buf, 100000), 3000, NULL));
    assert_true(dedup_seen(&d, id_of(buf, sizeof buf, 149999), 3000, NULL));
    /* Everything expires: a large emptied table gives its memory back. */
    dedup_expire(&d, 1000000);
    assert_int_equal(dedup_count(&d), 0);
    assert_int_equal(d.cap, 0);
    assert_null(d.items);
    assert_int_equal(d.ids.slots_count, 0);
    /* And works again afterwards. */
    assert_true(dedup_record(&d, BYTES_LIT("again"), 1000000, 0));
    assert_true(dedup_seen(&d, BYTES_LIT("again"), 1000001, NULL));
    dedup_free(&d);
}

static void test_free_releases_everything(void **state)
{
    (void)state;
    char buf[32];
    struct dedup d;
    dedup_init(&d, 60000);
    dedup_free(&d); /* empty */
    for (uint32_t i = 0; i < 5000; i++)
        dedup_record(&d, id_of(buf, sizeof buf, i), i, 0);
    dedup_free(&d); /* full: ASan reports any id copy left behind */
    assert_int_equal(dedup_count(&d), 0);
    assert_int_equal(d.window_ms, 60000); /* reusable after free */
    assert_true(dedup_record(&d, BYTES_LIT("x"), 1, 0));
    dedup_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_is_from_first_sight),
        cmocka_unit_test(test_no_id_is_never_remembered),
        cmocka_unit_test(test_ids_are_bytes_and_tickets_come_back),
        cmocka_unit_test(test_growth_wrap_and_expiry),
        cmocka_unit_test(test_free_releases_everything),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
