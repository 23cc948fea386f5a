/*
 * test_usage.c: what connection and channel limits count across a cluster
 * (broker/usage.h), without sockets.
 *
 * Goal: a check adds this broker's clients to what each peer last
 * reported; a peer's new report replaces its old one (also when it comes
 * on a new link), and a closed link takes the report it carried, not one
 * a newer link replaced; a malformed report (a negative or non-integer
 * count, a key that is not a table, an empty peer name) is ignored and the
 * peer's previous report kept; this broker's report carries only names
 * with a limit of 0 or more, without zero counts, brokers' links and
 * closing connections left out, and a peer reads it back as written.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amqp/table.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/connection.h"
#include "broker/usage.h"
#include "broker/vhost.h"

#define B(s) bytes_of_cstr(s)

static struct broker broker;
static struct vhost vhost_a, vhost_b;
static struct auth_user alice, bob;
static struct connection conns[4];

static int setup(void **state)
{
    (void)state;
    memset(&broker, 0, sizeof broker);
    list_init(&broker.connections);
    limit_set_init(&broker.limits);
    usage_init(&broker.usage);
    vhost_a.name = B("va");
    vhost_b.name = B("vb");
    alice.name = "alice";
    bob.name = "bob";
    memset(conns, 0, sizeof conns);
    /* alice: two connections in va (3 and 1 channels); bob: one in vb;
     * and a broker's link, which never counts. */
    struct {
        struct vhost *vhost;
        struct auth_user *user;
        uint16_t channels;
        bool peer;
    } spec[4] = {{&vhost_a, &alice, 3, false}, {&vhost_a, &alice, 1, false},
                 {&vhost_b, &bob, 2, false}, {&vhost_a, &alice, 7, true}};
    for (int i = 0; i < 4; i++) {
        conns[i].vhost = spec[i].vhost;
        conns[i].user = spec[i].user;
        conns[i].channels_open = spec[i].channels;
        conns[i].cluster_peer = spec[i].peer;
        list_push_back(&broker.connections, &conns[i].broker_link);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    usage_free(&broker.usage);
    limit_set_free(&broker.limits);
    return 0;
}

/* A report {key: {name: n, ...}} in buf. */
static struct table report(uint8_t *buf, size_t cap, const char *key, const char *name,
                           int64_t n)
{
    struct table_writer w;
    table_writer_init(&w, buf, cap);
    size_t mark = table_put_table_begin(&w, key);
    if (name != NULL)
        table_put_int(&w, name, n);
    table_put_table_end(&w, mark);
    assert_false(w.overflow);
    return table_writer_table(&w);
}

static void test_local_counts(void **state)
{
    (void)state;
    assert_int_equal(usage_local(&broker, LIMIT_SCOPE_VHOST, B("va"), LIMIT_MAX_CONNECTIONS), 2);
    assert_int_equal(usage_local(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CONNECTIONS),
                     2);
    assert_int_equal(usage_local(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS), 4);
    assert_int_equal(usage_local(&broker, LIMIT_SCOPE_USER, B("bob"), LIMIT_MAX_CHANNELS), 2);
    conns[1].conn.closing = true; /* closing: no longer counted */
    assert_int_equal(usage_local(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS), 3);
    conns[1].conn.closing = false;
    conns[2].vhost = NULL; /* not past connection.open */
    assert_int_equal(usage_local(&broker, LIMIT_SCOPE_VHOST, B("vb"), LIMIT_MAX_CONNECTIONS), 0);
    conns[2].vhost = &vhost_b;
}

static void test_reports_add_up_and_go_with_their_link(void **state)
{
    (void)state;
    uint8_t buf[512];
    struct table t = report(buf, sizeof buf, USAGE_USER_CHANNELS, "alice", 5);
    assert_true(usage_heard(&broker, 100, B("b2"), t));
    t = report(buf, sizeof buf, USAGE_USER_CHANNELS, "alice", 6);
    assert_true(usage_heard(&broker, 200, B("b3"), t));
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS),
                     4 + 5 + 6);
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CONNECTIONS),
                     2); /* nobody else reported connections */
    /* b2 says again, on a new link: replaced, not added. */
    t = report(buf, sizeof buf, USAGE_USER_CHANNELS, "alice", 1);
    assert_true(usage_heard(&broker, 101, B("b2"), t));
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS),
                     4 + 1 + 6);
    usage_link_closed(&broker, 100); /* b2's old link: its report is the new link's */
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS),
                     4 + 1 + 6);
    usage_link_closed(&broker, 200); /* b3 died */
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS),
                     4 + 1);
    t = report(buf, sizeof buf, USAGE_VHOST_CONNECTIONS, NULL, 0); /* b2: nothing now */
    assert_true(usage_heard(&broker, 101, B("b2"), t));
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS), 4);
}

static void test_malformed_reports_are_ignored(void **state)
{
    (void)state;
    uint8_t buf[512];
    struct table t = report(buf, sizeof buf, USAGE_VHOST_CONNECTIONS, "va", 3);
    assert_true(usage_heard(&broker, 7, B("b2"), t));
    t = report(buf, sizeof buf, USAGE_VHOST_CONNECTIONS, "va", -1);
    assert_false(usage_heard(&broker, 7, B("b2"), t));
    assert_false(usage_heard(&broker, 7, B(""), report(buf, sizeof buf,
                                                     USAGE_VHOST_CONNECTIONS, "va", 1)));
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, USAGE_VHOST_CONNECTIONS, B("not a table"));
    assert_false(usage_heard(&broker, 7, B("b2"), table_writer_table(&w)));
    table_writer_init(&w, buf, sizeof buf);
    size_t mark = table_put_table_begin(&w, USAGE_USER_CONNECTIONS);
    table_put_longstr(&w, "alice", B("3"));
    table_put_table_end(&w, mark);
    assert_false(usage_heard(&broker, 7, B("b2"), table_writer_table(&w)));
    /* The good report stands. */
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_VHOST, B("va"), LIMIT_MAX_CONNECTIONS),
                     2 + 3);
    /* Keys it does not know are left alone (a newer broker's). */
    t = report(buf, sizeof buf, "vhost-queues", "va", 9);
    assert_true(usage_heard(&broker, 7, B("b2"), t));
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_VHOST, B("va"), LIMIT_MAX_CONNECTIONS), 2);
}

static void test_our_report_round_trips(void **state)
{
    (void)state;
    uint8_t buf[1024];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    usage_write(&broker, &w); /* no limits: nothing to tell */
    struct table t = table_writer_table(&w);
    assert_true(usage_heard(&broker, 9, B("self"), t));
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS), 4);

    limit_set_put(&broker.limits, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS, 10);
    limit_set_put(&broker.limits, LIMIT_SCOPE_VHOST, B("va"), LIMIT_MAX_CONNECTIONS, 0);
    limit_set_put(&broker.limits, LIMIT_SCOPE_USER, B("bob"), LIMIT_MAX_CONNECTIONS, -1);
    table_writer_init(&w, buf, sizeof buf);
    usage_write(&broker, &w);
    assert_false(w.overflow);
    t = table_writer_table(&w);
    struct field_value v, n;
    assert_true(table_get(t, USAGE_USER_CHANNELS, &v));
    assert_true(table_get(v.table, "alice", &n));
    assert_int_equal(n.i64, 4); /* the link's 7 channels left out */
    assert_true(table_get(t, USAGE_VHOST_CONNECTIONS, &v));
    assert_true(table_get(v.table, "va", &n));
    assert_int_equal(n.i64, 2);
    assert_true(table_get(t, USAGE_USER_CONNECTIONS, &v));
    assert_false(table_get(v.table, "bob", &n)); /* -1: no limit, nothing counted */
    assert_false(table_get(v.table, "alice", &n)); /* alice has no connection limit */
    assert_true(usage_heard(&broker, 9, B("self"), t));
    assert_int_equal(usage_count(&broker, LIMIT_SCOPE_USER, B("alice"), LIMIT_MAX_CHANNELS), 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_local_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reports_add_up_and_go_with_their_link, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_malformed_reports_are_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_our_report_round_trips, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
