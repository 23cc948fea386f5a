/*
 * test_limits.c: vhost and user limits as a pure set (broker/limits.h).
 *
 * Goal: the set answers what an operator set, whatever the order of puts
 * (its order is (scope, name, kind), so every broker holds the same set);
 * names are per scope (a vhost and a user of one name do not mix); kinds
 * are checked per scope; a deleted vhost or user takes all its limits; a
 * negative limit allows any count and 0 none; copies compare equal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "broker/limits.h"

#define B(s) bytes_of_cstr(s)

static void test_put_find_delete(void **state)
{
    (void)state;
    struct limit_set set;
    limit_set_init(&set);
    assert_int_equal(limit_set_value(&set, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_QUEUES), -1);
    assert_true(limit_set_put(&set, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_QUEUES, 10));
    assert_true(limit_set_put(&set, LIMIT_SCOPE_USER, B("/"), LIMIT_MAX_CHANNELS, 3));
    assert_true(limit_set_put(&set, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_CONNECTIONS, 0));
    assert_false(limit_set_put(&set, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_QUEUES, 11));
    assert_int_equal(set.count, 3);
    assert_int_equal(limit_set_value(&set, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_QUEUES), 11);
    assert_int_equal(limit_set_value(&set, LIMIT_SCOPE_USER, B("/"), LIMIT_MAX_CHANNELS), 3);
    assert_int_equal(limit_set_value(&set, LIMIT_SCOPE_USER, B("/"), LIMIT_MAX_CONNECTIONS),
                     -1);
    assert_true(limit_set_delete(&set, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_QUEUES));
    assert_false(limit_set_delete(&set, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_QUEUES));
    assert_int_equal(set.count, 2);
    limit_set_free(&set);
}

static void test_order_and_copies(void **state)
{
    (void)state;
    struct limit_set a, b, c;
    limit_set_init(&a);
    limit_set_init(&b);
    limit_set_init(&c);
    const char *names[] = {"zz", "a", "ab", "b", "a\x01"};
    for (int i = 0; i < 5; i++)
        limit_set_put(&a, LIMIT_SCOPE_VHOST, B(names[i]), LIMIT_MAX_QUEUES, i);
    for (int i = 4; i >= 0; i--)
        limit_set_put(&b, LIMIT_SCOPE_VHOST, B(names[i]), LIMIT_MAX_QUEUES, i);
    assert_true(limit_set_equal(&a, &b));
    assert_true(bytes_equal_cstr(a.items[0].name, "a"));
    assert_true(bytes_equal_cstr(a.items[1].name, "a\x01"));
    assert_true(bytes_equal_cstr(a.items[4].name, "zz"));
    limit_set_copy(&c, &a);
    assert_true(limit_set_equal(&a, &c));
    limit_set_put(&c, LIMIT_SCOPE_VHOST, B("a"), LIMIT_MAX_QUEUES, 99);
    assert_false(limit_set_equal(&a, &c));
    limit_set_copy(&c, &b); /* over a set with entries */
    assert_true(limit_set_equal(&c, &a));
    limit_set_free(&a);
    limit_set_free(&b);
    limit_set_free(&c);
}

static void test_delete_all(void **state)
{
    (void)state;
    struct limit_set set;
    limit_set_init(&set);
    limit_set_put(&set, LIMIT_SCOPE_VHOST, B("v"), LIMIT_MAX_QUEUES, 1);
    limit_set_put(&set, LIMIT_SCOPE_VHOST, B("v"), LIMIT_MAX_CONNECTIONS, 2);
    limit_set_put(&set, LIMIT_SCOPE_USER, B("v"), LIMIT_MAX_CONNECTIONS, 3);
    limit_set_put(&set, LIMIT_SCOPE_VHOST, B("w"), LIMIT_MAX_QUEUES, 4);
    assert_int_equal(limit_set_delete_all(&set, LIMIT_SCOPE_VHOST, B("v")), 2);
    assert_int_equal(set.count, 2);
    assert_int_equal(limit_set_value(&set, LIMIT_SCOPE_USER, B("v"), LIMIT_MAX_CONNECTIONS), 3);
    assert_int_equal(limit_set_delete_all(&set, LIMIT_SCOPE_USER, B("nobody")), 0);
    limit_set_free(&set);
}

static void test_kinds_and_allows(void **state)
{
    (void)state;
    assert_int_equal(limit_kind_parse(LIMIT_SCOPE_VHOST, B("max-queues")), LIMIT_MAX_QUEUES);
    assert_int_equal(limit_kind_parse(LIMIT_SCOPE_VHOST, B("max-channels")), -1);
    assert_int_equal(limit_kind_parse(LIMIT_SCOPE_USER, B("max-channels")), LIMIT_MAX_CHANNELS);
    assert_int_equal(limit_kind_parse(LIMIT_SCOPE_USER, B("max-queues")), -1);
    assert_int_equal(limit_kind_parse(LIMIT_SCOPE_USER, B("max-connections")),
                     LIMIT_MAX_CONNECTIONS);
    assert_int_equal(limit_kind_parse(LIMIT_SCOPE_USER, B("max-connection")), -1);
    assert_string_equal(limit_kind_name(LIMIT_MAX_CHANNELS), "max-channels");
    assert_true(limit_allows(-1, 1000000));
    assert_false(limit_allows(0, 0));
    assert_true(limit_allows(2, 1));
    assert_false(limit_allows(2, 2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_find_delete),
        cmocka_unit_test(test_order_and_copies),
        cmocka_unit_test(test_delete_all),
        cmocka_unit_test(test_kinds_and_allows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
