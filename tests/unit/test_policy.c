/*
 * test_policy.c: replication policies as a pure set (broker/policy.h).
 *
 * Goal: a queue gets the policy an operator expects: per vhost, regex
 * search (anchors mean whole names), highest priority first, ties by name
 * whatever the order of puts; bad patterns are refused with regcomp's
 * reason; the precedence is x-quay-backups > policy > default.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "amqp/table.h"
#include "broker/policy.h"
#include "lib/errors.h"

#define B(s) bytes_of_cstr(s)

static void put(struct policy_set *set, const char *vhost, const char *name,
                const char *pattern, uint32_t priority, uint8_t backups)
{
    struct policy_decl d = {B(vhost), B(name), B(pattern), priority, backups, 0};
    char err[POLICY_ERROR_SIZE];
    assert_int_equal(policy_decl_check(&d, err, sizeof err), OK);
    policy_set_put(set, &d);
}

static const char *match(const struct policy_set *set, const char *vhost, const char *queue)
{
    const struct policy *p = policy_set_match(set, B(vhost), B(queue));
    static char name[POLICY_NAME_SIZE_MAX + 1];
    if (p == NULL)
        return "(none)";
    memcpy(name, p->name.ptr, p->name.len);
    name[p->name.len] = '\0';
    return name;
}

static void test_matching(void **state)
{
    (void)state;
    struct policy_set set;
    policy_set_init(&set);
    put(&set, "/", "ha", "^ha\\.", 0, 2);
    put(&set, "/", "exact", "^orders$", 0, 3);
    put(&set, "other", "any", ".", 0, 1);
    assert_string_equal(match(&set, "/", "ha.x"), "ha");
    assert_string_equal(match(&set, "/", "haha"), "(none)"); /* '.' is escaped */
    assert_string_equal(match(&set, "/", "x.ha.y"), "(none)"); /* anchored */
    assert_string_equal(match(&set, "/", "orders"), "exact");
    assert_string_equal(match(&set, "/", "orders2"), "(none)");
    assert_string_equal(match(&set, "/", "plain"), "(none)");
    assert_string_equal(match(&set, "other", "plain"), "any"); /* per vhost */
    /* Unanchored patterns search anywhere, as RabbitMQ's do. */
    put(&set, "/", "mid", "ord", 0, 1);
    assert_string_equal(match(&set, "/", "reorder"), "mid");
    policy_set_free(&set);
}

static void test_priority_and_ties(void **state)
{
    (void)state;
    /* The same policies put in two orders give the same answers. */
    for (int order = 0; order < 2; order++) {
        struct policy_set set;
        policy_set_init(&set);
        if (order == 0) {
            put(&set, "/", "b-low", "^q", 1, 1);
            put(&set, "/", "c-high", "^q\\.", 5, 3);
            put(&set, "/", "a-low", "^q", 1, 0);
        } else {
            put(&set, "/", "a-low", "^q", 1, 0);
            put(&set, "/", "c-high", "^q\\.", 5, 3);
            put(&set, "/", "b-low", "^q", 1, 1);
        }
        assert_int_equal(set.count, 3);
        assert_string_equal(match(&set, "/", "q.1"), "c-high");
        assert_string_equal(match(&set, "/", "q1"), "a-low"); /* tie: name order */
        /* Replacing keeps one entry and takes the new values. */
        put(&set, "/", "c-high", "^q", 0, 2);
        assert_int_equal(set.count, 3);
        assert_string_equal(match(&set, "/", "q.1"), "a-low");
        assert_true(policy_set_delete(&set, B("/"), B("a-low")));
        assert_false(policy_set_delete(&set, B("/"), B("a-low")));
        assert_string_equal(match(&set, "/", "q.1"), "b-low");
        assert_int_equal(policy_set_delete_vhost(&set, B("/")), 2);
        assert_int_equal(set.count, 0);
        policy_set_free(&set);
    }
}

static void test_bad_input(void **state)
{
    (void)state;
    char err[POLICY_ERROR_SIZE];
    assert_int_equal(policy_pattern_check(B("^(ha"), err, sizeof err), E_SYNTAX);
    assert_non_null(strstr(err, "invalid regular expression '^(ha'"));
    assert_int_equal(policy_pattern_check(B("a**["), err, sizeof err), E_SYNTAX);
    assert_int_equal(policy_pattern_check(B(""), err, sizeof err), E_SYNTAX);
    assert_int_equal(policy_pattern_check((struct bytes){(const uint8_t *)"a\0b", 3}, err,
                                          sizeof err),
                     E_SYNTAX);
    assert_int_equal(policy_pattern_check(B("^ha\\.[0-9]+$"), err, sizeof err), OK);
    struct policy_decl d = {B("/"), B("p"), B("x"), 0, 4, 0};
    assert_int_equal(policy_decl_check(&d, err, sizeof err), E_SYNTAX);
    assert_non_null(strstr(err, "backups"));
    d.backups = 3;
    d.priority = POLICY_PRIORITY_MAX + 1;
    assert_int_equal(policy_decl_check(&d, err, sizeof err), E_SYNTAX);
    d.priority = POLICY_PRIORITY_MAX;
    d.name = B("");
    assert_int_equal(policy_decl_check(&d, err, sizeof err), E_SYNTAX);
    d.name = B("p");
    assert_int_equal(policy_decl_check(&d, err, sizeof err), OK);
}

static void test_precedence(void **state)
{
    (void)state;
    struct policy_set set;
    policy_set_init(&set);
    put(&set, "/", "ha", "^ha\\.", 0, 2);
    const struct policy *p = policy_set_match(&set, B("/"), B("ha.x"));
    assert_int_equal(policy_effective_backups(0, p, 1), 0);   /* own argument first */
    assert_int_equal(policy_effective_backups(3, p, 1), 3);
    assert_int_equal(policy_effective_backups(-1, p, 1), 2);  /* then the policy */
    assert_int_equal(policy_effective_backups(-1, NULL, 1), 1); /* then the default */
    assert_int_equal(policy_effective_backups(-1, NULL, 0), 0);
    /* x-quay-backups read from a queue's encoded arguments. */
    uint8_t buf[128];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    assert_int_equal(policy_queue_own_backups(buf, 0), -1);
    table_put_int(&w, "x-max-length", 10);
    assert_int_equal(policy_queue_own_backups(buf, (uint32_t)w.len), -1);
    table_put_int(&w, "x-quay-backups", 0);
    assert_int_equal(policy_queue_own_backups(buf, (uint32_t)w.len), 0);
    table_writer_init(&w, buf, sizeof buf);
    table_put_int(&w, "x-quay-backups", 2);
    assert_int_equal(policy_queue_own_backups(buf, (uint32_t)w.len), 2);
    policy_set_free(&set);
}

/* quay-replicate: "all"/"transient" only; the x-quay-replicate argument
 * wins over the policy (either way); only the applying policy counts; the
 * key is part of what makes two declarations the same. */
static void test_replicate(void **state)
{
    (void)state;
    assert_int_equal(policy_replicate_parse(B("all")), POLICY_REPLICATE_ALL);
    assert_int_equal(policy_replicate_parse(B("transient")), POLICY_REPLICATE_TRANSIENT);
    assert_int_equal(policy_replicate_parse(B("Transient")), -1);
    assert_int_equal(policy_replicate_parse(B("")), -1);
    struct policy_decl bad = {B("/"), B("p"), B("x"), 0, 1, 3};
    char err[POLICY_ERROR_SIZE];
    assert_int_equal(policy_decl_check(&bad, err, sizeof err), E_SYNTAX);
    struct policy_set set;
    policy_set_init(&set);
    assert_false(policy_replicates_transient_only(&set, B("/"), B("t.1"), NULL, 0));
    struct policy_decl tr = {B("/"), B("tr"), B("^t\\."), 0, 1, POLICY_REPLICATE_TRANSIENT};
    policy_set_put(&set, &tr);
    assert_true(policy_set_same(&set, &tr));
    tr.replicate = POLICY_REPLICATE_ALL;
    assert_false(policy_set_same(&set, &tr));
    tr.replicate = POLICY_REPLICATE_TRANSIENT;
    assert_true(policy_replicates_transient_only(&set, B("/"), B("t.1"), NULL, 0));
    assert_false(policy_replicates_transient_only(&set, B("/"), B("u.1"), NULL, 0));
    assert_false(policy_replicates_transient_only(&set, B("other"), B("t.1"), NULL, 0));
    uint8_t buf[64];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "x-quay-replicate", B("all"));
    struct table all = table_writer_table(&w);
    assert_false(policy_replicates_transient_only(&set, B("/"), B("t.1"), all.ptr,
                                                  (uint32_t)all.len));
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "x-quay-replicate", B("transient"));
    struct table transient = table_writer_table(&w);
    assert_true(policy_replicates_transient_only(&set, B("/"), B("u.1"), transient.ptr,
                                                 (uint32_t)transient.len));
    /* A higher one that does not say it applies: "all". */
    put(&set, "/", "higher", "^t\\.1$", 9, 2);
    assert_false(policy_replicates_transient_only(&set, B("/"), B("t.1"), NULL, 0));
    assert_true(policy_replicates_transient_only(&set, B("/"), B("t.2"), NULL, 0));
    policy_set_free(&set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matching),
        cmocka_unit_test(test_priority_and_ties),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_replicate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
