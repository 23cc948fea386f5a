/*
 * test_replica.c: a backup's copy of a queue (cluster/replica.h) keeps the
 * primary's messages in seq order, forgets removed ones in any order,
 * ignores resends, clears on purge, and holds exactly one reference per
 * message it keeps (message_live_count tells).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/message.h"
#include "cluster/replica.h"

static struct message *make(uint32_t n)
{
    static const uint8_t no_properties[2] = {0, 0};
    struct basic_properties props = {0};
    struct message *m = message_new(BYTES_LIT("x"), BYTES_LIT("k"), no_properties, 2, &props,
                                    sizeof n);
    memcpy(m->body, &n, sizeof n);
    m->body_received = sizeof n;
    return m;
}

/* Pushes seqs from..to (one message each; the replica keeps the only
 * reference). */
static void push_range(struct replica *r, uint64_t from, uint64_t to)
{
    for (uint64_t seq = from; seq <= to; seq++) {
        struct message *m = make((uint32_t)seq);
        assert_true(replica_push(r, seq, m, 0));
        message_unref(m);
    }
}

static void test_push_remove_in_any_order(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1);
    push_range(r, 1, 1000);
    assert_int_equal(replica_count(r), 1000);
    assert_int_equal(message_live_count - live_before, 1000);
    /* Acks come back in any order: every other one, then the rest from the top. */
    for (uint64_t seq = 2; seq <= 1000; seq += 2)
        replica_remove(r, seq);
    assert_int_equal(replica_count(r), 500);
    for (uint64_t seq = 999; seq >= 1 && seq <= 999; seq -= 2)
        replica_remove(r, seq);
    assert_int_equal(replica_count(r), 0);
    assert_int_equal(message_live_count, live_before);
    /* Removing what is not there (twice, or never pushed) changes nothing. */
    replica_remove(r, 5);
    replica_remove(r, 123456);
    /* The ring grows past its first capacity and wraps after removals. */
    push_range(r, 1001, 1100);
    for (uint64_t seq = 1001; seq <= 1050; seq++)
        replica_remove(r, seq);
    push_range(r, 1101, 1300);
    assert_int_equal(replica_count(r), 250);
    replica_free(r);
    assert_int_equal(message_live_count, live_before);
}

static void test_resends_are_ignored(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1);
    push_range(r, 1, 10);
    /* After a reconnect the primary may send some again. */
    push_range(r, 5, 12);
    assert_int_equal(replica_count(r), 12);
    replica_remove(r, 3);
    push_range(r, 3, 3); /* a removed one sent again stays removed */
    assert_int_equal(replica_count(r), 11);
    replica_free(r);
    assert_int_equal(message_live_count, live_before);
}

static void test_purge(void **state)
{
    (void)state;
    uint64_t live_before = message_live_count;
    struct replica *r = replica_new(-1);
    push_range(r, 1, 100);
    replica_remove(r, 0); /* purge */
    assert_int_equal(replica_count(r), 0);
    assert_int_equal(message_live_count, live_before);
    push_range(r, 101, 110); /* the stream goes on after a purge */
    assert_int_equal(replica_count(r), 10);
    replica_free(r);
    replica_free(NULL);
    assert_int_equal(message_live_count, live_before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_remove_in_any_order),
        cmocka_unit_test(test_resends_are_ignored),
        cmocka_unit_test(test_purge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
