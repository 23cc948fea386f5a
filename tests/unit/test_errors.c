/*
 * test_errors.c: the error-code registry (lib/errors.h) and error_name.
 *
 * Goal: every code of QUAY_ERRORS has a value of its own and a name of its
 * own, error_name gives that name back, values not listed are "unknown
 * error", and no released value moved. Method: the table below is built
 * from the same list as the enum and error_name, so a code added there is
 * checked here without an edit; the released values are pinned by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lib/errors.h"

struct code {
    int value;
    const char *name;
};

#define CODE_ROW(name, value) {name, #name},
static const struct code CODES[] = {QUAY_ERRORS(CODE_ROW)};
#define CODES_COUNT (sizeof CODES / sizeof CODES[0])

static void test_distinct(void **state)
{
    (void)state;
    for (size_t i = 0; i < CODES_COUNT; i++) {
        assert_non_null(CODES[i].name);
        for (size_t j = i + 1; j < CODES_COUNT; j++) {
            assert_int_not_equal(CODES[i].value, CODES[j].value);
            assert_string_not_equal(CODES[i].name, CODES[j].name);
        }
    }
}

static void test_names(void **state)
{
    (void)state;
    for (size_t i = 0; i < CODES_COUNT; i++) {
        assert_string_equal(error_name(CODES[i].value), CODES[i].name);
        assert_string_not_equal(CODES[i].name, "unknown error");
    }
    assert_string_equal(error_name(E_JOURNAL_FENCED), "E_JOURNAL_FENCED");
    assert_string_equal(error_name(OK), "OK");
}

static bool registered(int value)
{
    for (size_t i = 0; i < CODES_COUNT; i++)
        if (CODES[i].value == value)
            return true;
    return false;
}

static void test_unknown(void **state)
{
    (void)state;
    const int probes[] = {2, 7, -7, -19, -29, -31, -33, -41, -999, -1003, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        assert_false(registered(probes[i]));
        assert_string_equal(error_name(probes[i]), "unknown error");
    }
    /* Every value from -1100 to 100 that is not a code is unknown. */
    for (int v = -1100; v <= 100; v++)
        if (!registered(v))
            assert_string_equal(error_name(v), "unknown error");
}

/* Released values never change: logs and peers compare them. */
static void test_values_pinned(void **state)
{
    (void)state;
    assert_int_equal(OK, 0);
    assert_int_equal(AGAIN, 1);
    assert_int_equal(E_FRAME, -1);
    assert_int_equal(E_SYNTAX, -2);
    assert_int_equal(E_UNKNOWN_METHOD, -3);
    assert_int_equal(E_NOMEM, -4);
    assert_int_equal(E_LIMIT, -5);
    assert_int_equal(E_IO, -6);
    assert_int_equal(CONSENSUS_E_NOT_LEADER, -20);
    assert_int_equal(CONSENSUS_E_LEADERSHIP_LOST, -21);
    assert_int_equal(CONSENSUS_E_SHUTDOWN, -22);
    assert_int_equal(CONSENSUS_E_BUSY, -23);
    assert_int_equal(CONSENSUS_E_CONFLICT, -24);
    assert_int_equal(CONSENSUS_E_INVALID, -25);
    assert_int_equal(CONSENSUS_E_IO, -26);
    assert_int_equal(CONSENSUS_E_APPLY, -27);
    assert_int_equal(CONSENSUS_E_NOT_FOUND, -28);
    assert_int_equal(E_MAP_REFUSED, -32);
    assert_int_equal(CLUSTER_E_UNAVAILABLE, -40);
    assert_int_equal(E_JOURNAL_CORRUPT, -1000);
    assert_int_equal(E_JOURNAL_NOT_FOUND, -1001);
    assert_int_equal(E_JOURNAL_FENCED, -1002);
    assert_int_equal(CODES_COUNT, 22);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distinct),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_unknown),
        cmocka_unit_test(test_values_pinned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
