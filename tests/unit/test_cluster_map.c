/*
 * test_cluster_map.c: the cluster map as a replicated state machine.
 *
 * Goal: every command applies as documented and keeps the derived counts
 * right; refusals carry the AMQP reply code a client would get and leave
 * the map unchanged; malformed, truncated and bit-flipped commands never
 * crash (run under ASan/UBSan) and never corrupt the map; a snapshot of a
 * map with 10,000 queues reads back to a map whose snapshot is the same
 * bytes. Method: build commands with the map_cmd_* builders, apply them,
 * check the objects and cluster_map_verify(); cut and flip bytes with a
 * fixed-seed generator; time apply and snapshot for the report.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "amqp/reply_code_gen.h"
#include "amqp/table.h"
#include "cluster/map.h"
#include "lib/errors.h"

#define B(s) bytes_of_cstr(s)

static struct map_change last;

static void assert_round_trip(const struct cluster_map *map, struct cluster_map *copy);

static int apply(struct cluster_map *map, int build_rc, struct map_cmd *cmd)
{
    assert_int_equal(build_rc, OK);
    int rc = cluster_map_apply(map, cmd->bytes, cmd->size, &last);
    map_cmd_free(cmd);
    assert_true(cluster_map_verify(map));
    return rc;
}

/* Both expect a `struct map_cmd c_` in scope for the builder to fill. */
#define APPLY_OK(map, call)                          \
    do {                                             \
        int r_ = apply((map), call, &c_);            \
        if (r_ != OK)                                \
            fail_msg("refused: %s", last.reply_text); \
    } while (0)

#define APPLY_RC(map, call) apply((map), call, &c_)

static void join(struct cluster_map *map, uint32_t id, bool voter)
{
    char name[32], addr[32];
    snprintf(name, sizeof name, "b%u", id);
    snprintf(addr, sizeof addr, "10.0.0.%u:5672", id);
    struct map_cmd c_;
    APPLY_OK(map, map_cmd_broker_join(&c_, id, B(name), B(addr), B(addr), voter, 0));
}

static struct map_queue_decl queue_decl(const char *vhost, const char *name, uint32_t primary,
                                        uint32_t backup)
{
    struct map_queue_decl d = {.vhost = B(vhost), .name = B(name), .durable = true,
                               .primary_id = primary, .replication_factor = 3};
    if (backup) {
        d.backup_ids[0] = backup;
        d.backups_count = 1;
    }
    return d;
}

/* A map with brokers 1..3, vhost "/", an exchange and a queue. */
static void setup_small(struct cluster_map *map)
{
    struct map_cmd c_;
    cluster_map_init(map);
    for (uint32_t id = 1; id <= 3; id++)
        join(map, id, true);
    APPLY_OK(map, map_cmd_vhost_put(&c_, B("/")));
}

static void test_brokers(void **state)
{
    (void)state;
    struct cluster_map map;
    cluster_map_init(&map);
    for (uint32_t id = 1; id <= 5; id++)
        join(&map, id, true);
    assert_int_equal(map.brokers_count, 5);
    struct map_cmd c_;
    /* A sixth voter is refused; a non-voter is fine. */
    assert_int_equal(APPLY_RC(&map, map_cmd_broker_join(&c_, 6, B("b6"), B("a"), B("c"), true, 0)),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    join(&map, 6, false);
    /* Names are unique. */
    assert_int_equal(APPLY_RC(&map, map_cmd_broker_join(&c_, 7, B("b1"), B("a"), B("c"), false, 0)),
                     E_MAP_REFUSED);
    /* Rejoin updates the address and keeps the state. */
    APPLY_OK(&map, map_cmd_broker_state(&c_, 2, BROKER_STATE_DOWN));
    assert_true(last.changed);
    uint64_t bv = map.brokers_version;
    APPLY_OK(&map, map_cmd_broker_join(&c_, 2, B("b2"), B("10.9.9.9:5672"), B("x:1"), true, 0));
    assert_int_equal(cluster_map_broker(&map, 2)->state, BROKER_STATE_DOWN);
    assert_true(bytes_equal_cstr(cluster_map_broker(&map, 2)->amqp_address, "10.9.9.9:5672"));
    assert_true(map.brokers_version > bv);
    APPLY_OK(&map, map_cmd_broker_state(&c_, 2, BROKER_STATE_DOWN));
    assert_false(last.changed);
    /* Leave: refused while owning a queue, fine afterwards. */
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("/")));
    struct map_queue_decl d = queue_decl("/", "q", 3, 4);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 3));
    assert_int_equal(APPLY_RC(&map, map_cmd_broker_leave(&c_, 4)), E_MAP_REFUSED);
    assert_int_equal(cluster_map_broker(&map, 4)->backups_held_count, 1);
    APPLY_OK(&map, map_cmd_queue_delete(&c_, B("/"), B("q"), 0));
    APPLY_OK(&map, map_cmd_broker_leave(&c_, 4));
    assert_null(cluster_map_broker(&map, 4));
    assert_int_equal(map.brokers_count, 5);
    assert_int_equal(map.brokers[3]->id, 5); /* join order kept */
    APPLY_OK(&map, map_cmd_broker_leave(&c_, 4)); /* idempotent */
    assert_false(last.changed);
    cluster_map_free(&map);
}

/* broker.incarnation: a restarted broker (an incarnation other than the
 * one the map has) leaves every in-sync set it was in, and only those; a
 * first report is only recorded (a new cluster's queues placed before the
 * leader heard a broker keep their in-sync backups); the same incarnation
 * again changes nothing; a snapshot keeps it; a primary's in-sync request
 * naming a process the map has replaced does not put it back.
 * (tests/sim seed 192: a restart the map never saw as down left the
 * broker in sync, and a failover promoted it with its replica gone.) */
static void test_broker_incarnation(void **state)
{
    (void)state;
    struct cluster_map map;
    struct map_cmd c_;
    cluster_map_init(&map);
    for (uint32_t id = 1; id <= 4; id++)
        join(&map, id, true);
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("/")));
    struct map_queue_decl d = queue_decl("/", "q", 1, 2);
    d.backup_ids[1] = 3;
    d.backups_count = 2;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue_decl d2 = queue_decl("/", "q2", 2, 3);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d2, 2));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("q"));
    struct map_queue *q2 = cluster_map_queue(&map, B("/"), B("q2"));
    assert_int_equal(q->in_sync_mask, 0x3);
    assert_int_equal(q2->in_sync_mask, 0x1);
    uint64_t epoch = q->epoch, bv = map.brokers_version;
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 3, 6)); /* the first: recorded */
    assert_true(last.changed);
    assert_int_equal(cluster_map_broker(&map, 3)->incarnation, 6);
    assert_int_equal(q->in_sync_mask, 0x3);
    assert_int_equal(q2->in_sync_mask, 0x1);
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 2, 8));
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 3, 7)); /* a restart */
    assert_true(last.changed);
    assert_int_equal(last.broker_id, 3);
    assert_int_equal(cluster_map_broker(&map, 3)->incarnation, 7);
    assert_int_equal(q->in_sync_mask, 0x1); /* 2 stays */
    assert_int_equal(q2->in_sync_mask, 0);
    assert_int_equal(q->epoch, epoch); /* the primary is not fenced: it catches 3 up */
    assert_true(map.brokers_version > bv);
    uint32_t both[] = {2, 3};
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), q->epoch, both, NULL, 2));
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 3, 7));
    assert_false(last.changed);
    assert_int_equal(q->in_sync_mask, 0x3);
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 2, 9)); /* another broker's restart */
    assert_int_equal(q->in_sync_mask, 0x2);
    assert_int_equal(cluster_map_broker(&map, 3)->incarnation, 7);
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 3, 8));
    assert_int_equal(q->in_sync_mask, 0);
    /* The primary names the process each stream knew: one the map has
     * replaced since (a request sent before the restart was heard) is not
     * put in sync; 0 (not known) is taken at its word. */
    uint32_t known[] = {9, 7};
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), q->epoch, both, known, 2));
    assert_int_equal(q->in_sync_mask, 0x1);
    known[1] = 8;
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), q->epoch, both, known, 2));
    assert_int_equal(q->in_sync_mask, 0x3);
    uint32_t unknown = 0;
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), q->epoch, &both[1], &unknown,
                                             1));
    assert_int_equal(q->in_sync_mask, 0x2);
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 2, 10));
    assert_int_equal(APPLY_RC(&map, map_cmd_broker_incarnation(&c_, 5, 1)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    struct cluster_map copy;
    assert_round_trip(&map, &copy);
    assert_int_equal(cluster_map_broker(&copy, 3)->incarnation, 8);
    assert_int_equal(cluster_map_broker(&copy, 2)->incarnation, 10);
    assert_int_equal(cluster_map_broker(&copy, 1)->incarnation, 0);
    cluster_map_free(&copy);
    cluster_map_free(&map);
}

/* broker.join carries the joining process's incarnation, so a restart is
 * seen from the first report on: a new cluster's brokers restarted before
 * the controller reported them (the join and the queue's first seconds)
 * leave the in-sync sets. (CI: a whole 3-broker cluster killed a second
 * after it formed, a tx committed; the restarted primary handed its queue
 * to a backup the map still had in sync, restarted too and empty: 0 of 500
 * persistent messages.) A rejoin naming another process is a restart too;
 * the same one is not. */
static void test_join_carries_incarnation(void **state)
{
    (void)state;
    struct cluster_map map;
    struct map_cmd c_;
    cluster_map_init(&map);
    for (uint32_t id = 1; id <= 3; id++) {
        char name[4];
        snprintf(name, sizeof name, "b%u", id);
        APPLY_OK(&map, map_cmd_broker_join(&c_, id, B(name), B("h:1"), B("h:2"), true, 10 * id));
        assert_int_equal(cluster_map_broker(&map, id)->incarnation, 10 * id);
    }
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("/")));
    struct map_queue_decl d = queue_decl("/", "q", 1, 2);
    d.backup_ids[1] = 3;
    d.backups_count = 2;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("q"));
    assert_int_equal(q->in_sync_mask, 0x3);
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 2, 20)); /* the same process */
    assert_false(last.changed);
    assert_int_equal(q->in_sync_mask, 0x3);
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 2, 21)); /* its first report: a restart */
    assert_int_equal(q->in_sync_mask, 0x2);
    APPLY_OK(&map, map_cmd_broker_join(&c_, 3, B("b3"), B("h:1"), B("h:2"), true, 30));
    assert_int_equal(q->in_sync_mask, 0x2); /* a rejoin of the same process */
    APPLY_OK(&map, map_cmd_broker_join(&c_, 3, B("b3"), B("h:9"), B("h:2"), true, 31));
    assert_true(last.changed);
    assert_int_equal(cluster_map_broker(&map, 3)->incarnation, 31);
    assert_int_equal(q->in_sync_mask, 0);
    APPLY_OK(&map, map_cmd_broker_join(&c_, 3, B("b3"), B("h:1"), B("h:2"), true, 0));
    assert_int_equal(cluster_map_broker(&map, 3)->incarnation, 31); /* not said: kept */
    /* A broker that joined without one (an upgrade): its first is recorded. */
    APPLY_OK(&map, map_cmd_broker_join(&c_, 4, B("b4"), B("h:1"), B("h:2"), false, 0));
    uint32_t four = 4;
    APPLY_OK(&map, map_cmd_queue_set_backups(&c_, B("/"), B("q"), q->epoch, &four, 1));
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), q->epoch, &four, NULL, 1));
    assert_int_equal(q->in_sync_mask, 0x1);
    APPLY_OK(&map, map_cmd_broker_incarnation(&c_, 4, 40));
    assert_int_equal(q->in_sync_mask, 0x1);
    struct cluster_map copy;
    assert_round_trip(&map, &copy);
    assert_int_equal(cluster_map_broker(&copy, 2)->incarnation, 21);
    assert_int_equal(cluster_map_broker(&copy, 4)->incarnation, 40);
    cluster_map_free(&copy);
    cluster_map_free(&map);
}

static void test_vhosts_users(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("/")));
    assert_false(last.changed);
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("prod")));
    struct bytes vhosts[] = {B("/"), B("prod")};
    struct bytes tags[] = {B("administrator")};
    APPLY_OK(&map, map_cmd_user_put(&c_, B("guest"), B("hash"), vhosts, 2, tags, 1));
    struct map_user *u = cluster_map_user(&map, B("guest"));
    assert_non_null(u);
    assert_true(map_user_has_vhost(u, B("prod")));
    assert_int_equal(u->tags_count, 1);
    /* Permission on a missing vhost: 404. */
    struct bytes bad[] = {B("nope")};
    assert_int_equal(APPLY_RC(&map, map_cmd_user_put(&c_, B("x"), B("h"), bad, 1, NULL, 0)),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    assert_null(cluster_map_user(&map, B("x")));
    /* Deleting a vhost takes its objects and permissions. */
    struct map_queue_decl d = queue_decl("prod", "orders", 1, 2);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    APPLY_OK(&map, map_cmd_vhost_delete(&c_, B("prod")));
    assert_int_equal(last.queues_deleted_count, 1);
    assert_false(map_user_has_vhost(u, B("prod")));
    assert_true(map_user_has_vhost(u, B("/")));
    assert_int_equal(map.queues_count, 0);
    assert_int_equal(APPLY_RC(&map, map_cmd_vhost_delete(&c_, B("prod"))), E_MAP_REFUSED);
    APPLY_OK(&map, map_cmd_user_delete(&c_, B("guest")));
    assert_int_equal(APPLY_RC(&map, map_cmd_user_delete(&c_, B("guest"))), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    cluster_map_free(&map);
}

static void test_exchanges_bindings(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    struct map_exchange_decl x = {.vhost = B("/"), .name = B("logs"), .type = B("topic"),
                                  .durable = true, .owner_id = 1};
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &x));
    assert_true(last.changed);
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &x));
    assert_false(last.changed);
    struct map_exchange_decl other = x;
    other.type = B("fanout");
    assert_int_equal(APPLY_RC(&map, map_cmd_exchange_declare(&c_, &other)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    assert_string_equal(last.reply_text, "inequivalent arg 'type' for exchange 'logs' in vhost "
                                         "'/': received 'fanout' but current is 'topic'");
    struct map_exchange_decl x2 = {.vhost = B("/"), .name = B("audit"), .type = B("fanout"),
                                   .owner_id = 2};
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &x2));
    struct map_queue_decl q = queue_decl("/", "q1", 1, 2);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &q, 1));
    struct map_binding_decl bq = {.vhost = B("/"), .source = B("logs"),
                                  .destination_kind = MAP_DESTINATION_QUEUE,
                                  .destination = B("q1"), .routing_key = B("a.*")};
    APPLY_OK(&map, map_cmd_bind(&c_, &bq));
    APPLY_OK(&map, map_cmd_bind(&c_, &bq));
    assert_false(last.changed);
    struct map_binding_decl be = {.vhost = B("/"), .source = B("logs"),
                                  .destination_kind = MAP_DESTINATION_EXCHANGE,
                                  .destination = B("audit"), .routing_key = B("#")};
    APPLY_OK(&map, map_cmd_bind(&c_, &be));
    assert_int_equal(map.bindings_count, 2);
    struct map_binding_decl missing = bq;
    missing.destination = B("nope");
    assert_int_equal(APPLY_RC(&map, map_cmd_bind(&c_, &missing)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    assert_string_equal(last.reply_text, "no queue 'nope' in vhost '/'");
    /* if_unused refuses while it routes somewhere. */
    assert_int_equal(APPLY_RC(&map, map_cmd_exchange_delete(&c_, B("/"), B("logs"), true)),
                     E_MAP_REFUSED);
    APPLY_OK(&map, map_cmd_unbind(&c_, &bq));
    assert_int_equal(last.bindings_deleted_count, 1);
    APPLY_OK(&map, map_cmd_unbind(&c_, &bq));
    assert_false(last.changed);
    /* Ownership moves; deleting the destination exchange drops the e2e binding. */
    APPLY_OK(&map, map_cmd_exchange_set_owner(&c_, B("/"), B("logs"), 3));
    assert_int_equal(cluster_map_broker(&map, 3)->exchanges_owned_count, 1);
    assert_int_equal(cluster_map_broker(&map, 1)->exchanges_owned_count, 0);
    APPLY_OK(&map, map_cmd_exchange_delete(&c_, B("/"), B("audit"), false));
    assert_int_equal(last.bindings_deleted_count, 1);
    assert_int_equal(map.bindings_count, 0);
    APPLY_OK(&map, map_cmd_exchange_delete(&c_, B("/"), B("audit"), false));
    assert_false(last.changed);
    /* Deleting a queue drops the bindings to it. */
    APPLY_OK(&map, map_cmd_bind(&c_, &bq));
    APPLY_OK(&map, map_cmd_queue_delete(&c_, B("/"), B("q1"), 0));
    assert_int_equal(last.bindings_deleted_count, 1);
    assert_int_equal(cluster_map_exchange(&map, B("/"), B("logs"))->bindings_out_count, 0);
    cluster_map_free(&map);
}

/* RabbitMQ's auto-delete exchanges, decided by the map so that every
 * broker agrees: one goes with its last binding as a source, whether an
 * unbind or its destination's deletion (a queue or an exchange) removed
 * it, in the same command, and so on down a chain; a new one without
 * bindings stays. */
static void test_auto_delete_exchanges(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    struct map_exchange_decl ad = {.vhost = B("/"), .name = B("ad"), .type = B("direct"),
                                   .auto_delete = true, .owner_id = 1};
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &ad));
    struct map_queue_decl q1 = queue_decl("/", "q1", 1, 2);
    struct map_queue_decl q2 = queue_decl("/", "q2", 2, 3);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &q1, 1));
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &q2, 2));
    assert_non_null(cluster_map_exchange(&map, B("/"), B("ad"))); /* no binding yet: stays */
    struct map_binding_decl b1 = {.vhost = B("/"), .source = B("ad"),
                                  .destination_kind = MAP_DESTINATION_QUEUE,
                                  .destination = B("q1"), .routing_key = B("k")};
    struct map_binding_decl b1b = b1;
    b1b.routing_key = B("k2");
    struct map_binding_decl b2 = b1;
    b2.destination = B("q2");
    APPLY_OK(&map, map_cmd_bind(&c_, &b1));
    APPLY_OK(&map, map_cmd_bind(&c_, &b1b));
    APPLY_OK(&map, map_cmd_bind(&c_, &b2));
    /* The queue with two of its bindings goes: one is left, so it stays. */
    APPLY_OK(&map, map_cmd_queue_delete(&c_, B("/"), B("q1"), 0));
    assert_int_equal(last.bindings_deleted_count, 2);
    assert_int_equal(last.exchanges_deleted_count, 0);
    assert_non_null(cluster_map_exchange(&map, B("/"), B("ad")));
    /* Its last binding unbound: gone in the same command. */
    APPLY_OK(&map, map_cmd_unbind(&c_, &b2));
    assert_int_equal(last.exchanges_deleted_count, 1);
    assert_null(cluster_map_exchange(&map, B("/"), B("ad")));
    /* Through an exchange's deletion: ad is bound to dest and to q2;
     * deleting dest leaves it the binding to q2 (it stays); deleting q2
     * then takes it. */
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &ad));
    struct map_exchange_decl dest = {.vhost = B("/"), .name = B("dest"), .type = B("fanout"),
                                     .owner_id = 2};
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &dest));
    struct map_binding_decl be = {.vhost = B("/"), .source = B("ad"),
                                  .destination_kind = MAP_DESTINATION_EXCHANGE,
                                  .destination = B("dest"), .routing_key = B("e")};
    APPLY_OK(&map, map_cmd_bind(&c_, &be));
    APPLY_OK(&map, map_cmd_bind(&c_, &b2));
    APPLY_OK(&map, map_cmd_exchange_delete(&c_, B("/"), B("dest"), false));
    assert_int_equal(last.exchanges_deleted_count, 1);
    assert_non_null(cluster_map_exchange(&map, B("/"), B("ad")));
    APPLY_OK(&map, map_cmd_queue_delete(&c_, B("/"), B("q2"), 0));
    assert_int_equal(last.exchanges_deleted_count, 1);
    assert_null(cluster_map_exchange(&map, B("/"), B("ad")));
    assert_int_equal(map.bindings_count, 0);
    /* A chain, as RabbitMQ 3.10 cascades it: ad -> ad2 -> q3 and
     * ad -> plain; deleting q3 takes ad2, whose deletion takes ad's
     * binding to it, but ad keeps its binding to plain; deleting plain
     * then takes ad. A cycle of auto-delete exchanges ends too. */
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &ad));
    struct map_exchange_decl ad2 = ad;
    ad2.name = B("ad2");
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &ad2));
    dest.name = B("plain");
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &dest));
    struct map_queue_decl q3 = queue_decl("/", "q3", 3, 1);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &q3, 3));
    struct map_binding_decl chain[] = {
        {.vhost = B("/"), .source = B("ad"), .destination_kind = MAP_DESTINATION_EXCHANGE,
         .destination = B("ad2"), .routing_key = B("x")},
        {.vhost = B("/"), .source = B("ad2"), .destination_kind = MAP_DESTINATION_QUEUE,
         .destination = B("q3"), .routing_key = B("x")},
        {.vhost = B("/"), .source = B("ad"), .destination_kind = MAP_DESTINATION_EXCHANGE,
         .destination = B("plain"), .routing_key = B("y")},
        {.vhost = B("/"), .source = B("ad2"), .destination_kind = MAP_DESTINATION_EXCHANGE,
         .destination = B("ad"), .routing_key = B("z")}, /* a cycle */
    };
    for (size_t i = 0; i < sizeof chain / sizeof chain[0]; i++)
        APPLY_OK(&map, map_cmd_bind(&c_, &chain[i]));
    APPLY_OK(&map, map_cmd_queue_delete(&c_, B("/"), B("q3"), 0));
    assert_non_null(cluster_map_exchange(&map, B("/"), B("ad2"))); /* still bound to ad */
    APPLY_OK(&map, map_cmd_exchange_delete(&c_, B("/"), B("plain"), false));
    /* ad's last binding out is now to ad2, ad2's to ad: both stay (as in
     * RabbitMQ, a cycle keeps itself). */
    assert_non_null(cluster_map_exchange(&map, B("/"), B("ad")));
    APPLY_OK(&map, map_cmd_exchange_delete(&c_, B("/"), B("ad2"), false));
    /* ad2 went with its binding into ad (ad -> ad2 removed as its
     * destination's): ad has none left. */
    assert_null(cluster_map_exchange(&map, B("/"), B("ad")));
    assert_int_equal(last.exchanges_deleted_count, 2);
    assert_int_equal(map.bindings_count, 0);
    cluster_map_free(&map);
}

/* Every vhost has the predeclared exchanges, owned by no broker: bindings
 * from them are map bindings, and a snapshot leaves them to the vhost. */
static void test_predeclared_exchanges(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    const char *names[] = {"amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match",
                           "amq.rabbitmq.trace", "amq.quay.cluster"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct map_exchange *x = cluster_map_exchange(&map, B("/"), B(names[i]));
        assert_non_null(x);
        assert_int_equal(x->owner_id, BROKER_ID_NONE);
    }
    assert_true(cluster_map_exchange(&map, B("/"), B("amq.quay.cluster"))->internal);
    for (uint32_t id = 1; id <= 3; id++)
        assert_int_equal(cluster_map_broker(&map, id)->exchanges_owned_count, 0);
    struct map_queue_decl q = queue_decl("/", "q1", 1, 0);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &q, 1));
    struct map_binding_decl b = {.vhost = B("/"), .source = B("amq.direct"),
                                 .destination_kind = MAP_DESTINATION_QUEUE,
                                 .destination = B("q1"), .routing_key = B("q1")};
    APPLY_OK(&map, map_cmd_bind(&c_, &b));
    assert_true(last.changed); /* (last.binding sliced the command, freed by now) */
    /* A dead broker owns none of them: failover leaves them alone. */
    APPLY_OK(&map, map_cmd_broker_state(&c_, 1, BROKER_STATE_DOWN));
    uint8_t *snap;
    size_t size;
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    struct cluster_map copy;
    cluster_map_init(&copy);
    assert_int_equal(cluster_map_snapshot_read(&copy, snap, size), OK);
    assert_true(cluster_map_verify(&copy));
    assert_int_equal(copy.exchanges_count, map.exchanges_count);
    assert_int_equal(copy.bindings_count, 1);
    assert_int_equal(cluster_map_exchange(&copy, B("/"), B("amq.direct"))->bindings_out_count, 1);
    free(snap);
    cluster_map_free(&copy);
    cluster_map_free(&map);
}

static void test_queue_declare_races(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    /* Arguments: x-message-ttl 1000. */
    uint8_t args_buf[64];
    struct table_writer w;
    table_writer_init(&w, args_buf, sizeof args_buf);
    table_put_int(&w, "x-message-ttl", 1000);
    struct map_queue_decl d = queue_decl("/", "orders", 1, 2);
    d.arguments = table_writer_table(&w);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("orders"));
    assert_non_null(q);
    assert_ptr_equal(last.queue, q);
    assert_int_equal(q->epoch, map.version);
    assert_int_equal(q->in_sync_mask, 1);
    assert_true(q->available);
    assert_int_equal(cluster_map_owner_of(&map, B("/"), B("orders")), 1);
    /* Broker 3's client declares the same queue equivalently: OK, no change,
     * and the answer says where it lives. */
    struct map_queue_decl same = d;
    same.primary_id = 3;
    same.backup_ids[0] = 1;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &same, 3));
    assert_false(last.changed);
    assert_int_equal(last.queue->primary_id, 1);
    /* Inequivalent: the second committed loses with 406. */
    struct map_queue_decl nd = d;
    nd.durable = false;
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_declare(&c_, &nd, 2)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    assert_string_equal(last.reply_text, "inequivalent arg 'durable' for queue 'orders' in vhost "
                                         "'/': received 'false' but current is 'true'");
    uint8_t args2[64];
    table_writer_init(&w, args2, sizeof args2);
    table_put_int(&w, "x-message-ttl", 2000);
    struct map_queue_decl na = d;
    na.arguments = table_writer_table(&w);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_declare(&c_, &na, 2)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    assert_non_null(strstr(last.reply_text, "inequivalent arg 'x-message-ttl'"));
    /* Exclusive queues belong to one connection on one broker. */
    struct map_queue_decl ex = queue_decl("/", "amq.gen-1", 2, 0);
    ex.exclusive = true;
    ex.exclusive_connection_id = 77;
    ex.replication_factor = 1;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &ex, 2));
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &ex, 2));
    ex.exclusive_connection_id = 78;
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_declare(&c_, &ex, 2)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_RESOURCE_LOCKED);
    /* A placement on a broker that went down meanwhile: retry. */
    APPLY_OK(&map, map_cmd_broker_state(&c_, 3, BROKER_STATE_DOWN));
    struct map_queue_decl late = queue_decl("/", "late", 3, 1);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_declare(&c_, &late, 3)), E_MAP_REFUSED);
    assert_true(last.retry);
    late = queue_decl("/", "late", 1, 3);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_declare(&c_, &late, 1)), E_MAP_REFUSED);
    assert_true(last.retry);
    /* Backups never include the primary. */
    late = queue_decl("/", "late", 1, 1);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_declare(&c_, &late, 1)), E_MAP_REFUSED);
    assert_false(last.retry);
    assert_null(cluster_map_queue(&map, B("/"), B("late")));
    /* No vhost: 404. */
    late = queue_decl("nope", "late", 1, 2);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_declare(&c_, &late, 1)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    cluster_map_free(&map);
}

static void test_queue_ownership(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    join(&map, 4, true);
    struct map_cmd c_;
    struct map_queue_decl d = queue_decl("/", "q", 1, 2);
    d.backup_ids[1] = 3;
    d.backup_ids[2] = 4;
    d.backups_count = 3;
    d.replication_factor = 4;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("q"));
    uint64_t e = q->epoch;
    assert_int_equal(q->owned_since, map.version); /* a restarted primary's yardstick */
    /* In-sync: only 2 and 4. */
    uint32_t sync[] = {2, 4};
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), e, sync, NULL, 2));
    assert_int_equal(q->in_sync_mask, 0x5);
    uint32_t not_backup[] = {1};
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), e,
                                                              not_backup, NULL, 1)),
                     E_MAP_REFUSED);
    /* 3 is out of sync: it may lack confirmed messages, never promoted. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_set_owner(&c_, B("/"), B("q"), e, 3)),
                     E_MAP_REFUSED);
    assert_true(last.retry);
    assert_int_equal(q->primary_id, 1);
    assert_int_equal(q->epoch, e);
    /* Promote 2 (first in sync); 3 and 4 stay, 4 in sync. */
    uint64_t declared = q->owned_since;
    APPLY_OK(&map, map_cmd_queue_set_owner(&c_, B("/"), B("q"), e, 2));
    assert_int_equal(q->primary_id, 2);
    assert_int_equal(q->epoch, e + 1);
    assert_int_equal(q->owned_since, map.version); /* 2 has it since now */
    assert_true(q->owned_since > declared);
    assert_int_equal(q->backups_count, 2);
    assert_int_equal(q->backup_ids[0], 3);
    assert_int_equal(q->backup_ids[1], 4);
    assert_int_equal(q->in_sync_mask, 0x2);
    assert_int_equal(last.previous_primary_id, 1);
    assert_int_equal(cluster_map_broker(&map, 1)->queues_owned_count, 0);
    assert_int_equal(cluster_map_broker(&map, 2)->queues_owned_count, 1);
    assert_int_equal(cluster_map_broker(&map, 2)->backups_held_count, 0);
    /* A stale epoch (a deposed primary, an old controller decision): retry. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_set_owner(&c_, B("/"), B("q"), e, 3)),
                     E_MAP_REFUSED);
    assert_true(last.retry);
    assert_int_equal(q->primary_id, 2);
    /* New backups keep the in-sync status of those that stay (and the
     * primary its queue since when it got it). */
    uint64_t promoted = q->owned_since;
    uint32_t nb[] = {4, 1};
    APPLY_OK(&map, map_cmd_queue_set_backups(&c_, B("/"), B("q"), e + 1, nb, 2));
    assert_int_equal(q->owned_since, promoted);
    assert_int_equal(q->in_sync_mask, 0x1);
    assert_int_equal(cluster_map_broker(&map, 3)->backups_held_count, 0);
    uint32_t dup[] = {4, 4};
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_set_backups(&c_, B("/"), B("q"), e + 1, dup,
                                                              2)),
                     E_MAP_REFUSED);
    /* Unavailable and back: epoch + 1 on return only. */
    APPLY_OK(&map, map_cmd_queue_set_available(&c_, B("/"), B("q"), e + 1, false));
    assert_false(q->available);
    assert_int_equal(q->epoch, e + 1);
    APPLY_OK(&map, map_cmd_queue_set_available(&c_, B("/"), B("q"), e + 1, true));
    assert_true(q->available);
    assert_int_equal(q->epoch, e + 2);
    assert_int_equal(q->owned_since, map.version);
    /* A fenced delete with a stale epoch is refused; the right one works. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_delete(&c_, B("/"), B("q"), e)),
                     E_MAP_REFUSED);
    APPLY_OK(&map, map_cmd_queue_delete(&c_, B("/"), B("q"), e + 2));
    assert_int_equal(last.queues_deleted_count, 1);
    APPLY_OK(&map, map_cmd_queue_delete(&c_, B("/"), B("q"), 0));
    assert_false(last.changed);
    /* A new incarnation has a higher epoch than the old one ever reached. */
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    assert_true(last.queue->epoch > e + 2);
    cluster_map_free(&map);
}

/* ---- malformed input ------------------------------------------------------------------ */

/* Every kind of command, valid in this order against setup_small's map
 * (4 commands, so queue.declare is the 9th and the queue's epoch is 9). */
/* A planned move: queue.move makes its target a backup (beyond the factor
 * for the time of the move), the primary hands over to it once in sync
 * (queue.set_owner planned), and the move ends with the handover, with a
 * set_backups that drops the target, or when cancelled (the extra backup
 * goes). A planned handover goes only to an in-sync backup. */
/* objects_stamp: a pointer to a map object kept with the stamp it was read
 * at is valid while the stamps are equal (GET /metrics keeps each queue's
 * map entry so: mgmt/metrics_cluster.c). So every command applied (refused
 * or changing nothing included) and every snapshot restored gives a new
 * stamp, and no two maps or moments share one. */
static void test_objects_stamp(void **state)
{
    (void)state;
    struct cluster_map map, other;
    cluster_map_init(&map);
    cluster_map_init(&other);
    assert_true(map.objects_stamp != 0);
    assert_true(other.objects_stamp != map.objects_stamp);
    struct map_cmd c_;
    join(&map, 1, true);
    uint64_t seen = map.objects_stamp;
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("/")));
    struct map_queue_decl d = queue_decl("/", "q", 1, 0);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    assert_true(map.objects_stamp != seen);
    seen = map.objects_stamp;
    const struct map_queue *kept = cluster_map_queue(&map, B("/"), B("q"));
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1)); /* equivalent: no change */
    assert_false(last.changed);
    assert_true(map.objects_stamp != seen);
    seen = map.objects_stamp;
    /* Deleted and declared again: a new object, maybe at the same address. */
    APPLY_OK(&map, map_cmd_queue_delete(&c_, B("/"), B("q"), 0));
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    assert_true(map.objects_stamp != seen);
    (void)kept; /* (not read: it was freed) */
    seen = map.objects_stamp;
    assert_int_equal(APPLY_RC(&map, map_cmd_broker_leave(&c_, 1)), E_MAP_REFUSED);
    assert_true(map.objects_stamp != seen);
    seen = map.objects_stamp;
    uint8_t *snap;
    size_t size;
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    assert_int_equal(cluster_map_snapshot_read(&map, snap, size), OK); /* same version */
    assert_true(map.objects_stamp != seen);
    assert_true(map.objects_stamp != other.objects_stamp);
    free(snap);
    cluster_map_free(&other);
    cluster_map_free(&map);
}

static void test_queue_move(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    join(&map, 4, true);
    struct map_cmd c_;
    struct map_queue_decl d = queue_decl("/", "q", 1, 2);
    d.replication_factor = 2;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("q"));
    uint64_t e = q->epoch;
    /* Refused: its primary, an unknown broker, a stale epoch. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e, 1)),
                     E_MAP_REFUSED);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e, 9)),
                     E_MAP_REFUSED);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e + 1, 3)),
                     E_MAP_REFUSED);
    assert_true(last.retry);
    assert_int_equal(q->move_to, 0);
    /* To 3: a backup not in sync, beyond the factor; the epoch stays. */
    APPLY_OK(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e, 3));
    assert_true(last.changed);
    assert_int_equal(q->move_to, 3);
    assert_int_equal(q->backups_count, 2);
    assert_int_equal(q->backup_ids[1], 3);
    assert_int_equal(q->in_sync_mask, 0x1);
    assert_int_equal(q->epoch, e);
    assert_int_equal(cluster_map_broker(&map, 3)->backups_held_count, 1);
    /* The same again changes nothing; a planned handover to it waits for
     * it to be in sync (retry), and never goes to a non-backup. */
    APPLY_OK(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e, 3));
    assert_false(last.changed);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_hand_over(&c_, B("/"), B("q"), e, 3)),
                     E_MAP_REFUSED);
    assert_true(last.retry);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_hand_over(&c_, B("/"), B("q"), e, 4)),
                     E_MAP_REFUSED);
    /* Cancelled: the extra backup goes too. */
    APPLY_OK(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e, 0));
    assert_int_equal(q->move_to, 0);
    assert_int_equal(q->backups_count, 1);
    assert_int_equal(q->backup_ids[0], 2);
    /* Again, to 3; in sync; the handover ends the move. */
    APPLY_OK(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e, 3));
    uint32_t both[] = {2, 3};
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), e, both, NULL, 2));
    APPLY_OK(&map, map_cmd_queue_hand_over(&c_, B("/"), B("q"), e, 3));
    assert_true(last.planned);
    assert_int_equal(last.previous_primary_id, 1);
    assert_int_equal(q->primary_id, 3);
    assert_int_equal(q->epoch, e + 1);
    assert_int_equal(q->move_to, 0);
    assert_int_equal(q->backups_count, 1);
    assert_int_equal(q->backup_ids[0], 2);
    assert_int_equal(q->in_sync_mask, 0x1);
    /* A failover's set_owner is not planned. */
    APPLY_OK(&map, map_cmd_queue_set_owner(&c_, B("/"), B("q"), e + 1, 2));
    assert_false(last.planned);
    /* A move to an existing backup keeps the backups; a set_backups
     * without the target ends it. */
    uint32_t four[] = {4};
    APPLY_OK(&map, map_cmd_queue_set_backups(&c_, B("/"), B("q"), e + 2, four, 1));
    APPLY_OK(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e + 2, 4));
    assert_int_equal(q->backups_count, 1);
    assert_int_equal(q->move_to, 4);
    uint32_t one[] = {1};
    APPLY_OK(&map, map_cmd_queue_set_backups(&c_, B("/"), B("q"), e + 2, one, 1));
    assert_int_equal(q->move_to, 0);
    /* Three backups already and a target among none of them: refused. */
    uint32_t three[] = {1, 3, 4};
    APPLY_OK(&map, map_cmd_queue_set_backups(&c_, B("/"), B("q"), e + 2, three, 3));
    join(&map, 5, false);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e + 2, 5)),
                     E_MAP_REFUSED);
    assert_false(last.retry);
    /* A restarted primary's hand-off: only to a backup in sync when it
     * applies (a plain set_owner would make 5 the primary of an empty
     * queue). */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_hand_to_backup(&c_, B("/"), B("q"), e + 2, 5)),
                     E_MAP_REFUSED);
    uint32_t synced[] = {1};
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), e + 2, synced, NULL, 1));
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_hand_to_backup(&c_, B("/"), B("q"), e + 2, 3)),
                     E_MAP_REFUSED);
    assert_int_equal(q->primary_id, 2);
    APPLY_OK(&map, map_cmd_queue_hand_to_backup(&c_, B("/"), B("q"), e + 2, 1));
    assert_false(last.planned);
    assert_int_equal(q->primary_id, 1);
    assert_int_equal(q->epoch, e + 3);
    assert_int_equal(q->backups_count, 2); /* 3 and 4 stay, out of sync */
    cluster_map_free(&map);
}

/* A backup move: the new backup joins beyond the factor and the primary
 * stays; the set_backups without the replaced one ends it. */
static void test_queue_move_backup(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    join(&map, 4, true);
    struct map_cmd c_;
    struct map_queue_decl d = queue_decl("/", "q", 1, 2);
    d.replication_factor = 2;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("q"));
    uint64_t e = q->epoch;
    /* From a broker that is not a backup, or to one that is: refused. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_move_backup(&c_, B("/"), B("q"), e, 3, 4)),
                     E_MAP_REFUSED);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_move_backup(&c_, B("/"), B("q"), e, 2, 1)),
                     E_MAP_REFUSED);
    APPLY_OK(&map, map_cmd_queue_move_backup(&c_, B("/"), B("q"), e, 2, 4));
    assert_int_equal(q->move_to, 4);
    assert_int_equal(q->move_from, 2);
    assert_int_equal(q->backups_count, 2);
    assert_true(cluster_map_verify(&map));
    /* A snapshot keeps it. */
    uint8_t *snap;
    size_t size;
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    struct cluster_map copy;
    cluster_map_init(&copy);
    assert_int_equal(cluster_map_snapshot_read(&copy, snap, size), OK);
    struct map_queue *cq = cluster_map_queue(&copy, B("/"), B("q"));
    assert_int_equal(cq->move_from, 2);
    assert_int_equal(cq->move_to, 4);
    free(snap);
    cluster_map_free(&copy);
    /* Caught up; the replaced backup leaves: done, the primary unchanged. */
    uint32_t both[] = {2, 4};
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), e, both, NULL, 2));
    uint32_t four[] = {4};
    APPLY_OK(&map, map_cmd_queue_set_backups(&c_, B("/"), B("q"), e, four, 1));
    assert_int_equal(q->move_to, 0);
    assert_int_equal(q->move_from, 0);
    assert_int_equal(q->primary_id, 1);
    assert_int_equal(q->in_sync_mask, 0x1);
    /* Cancelled (queue.move to none): the new backup goes again. */
    APPLY_OK(&map, map_cmd_queue_move_backup(&c_, B("/"), B("q"), e, 4, 3));
    APPLY_OK(&map, map_cmd_queue_move(&c_, B("/"), B("q"), e, 0));
    assert_int_equal(q->move_from, 0);
    assert_int_equal(q->backups_count, 1);
    assert_int_equal(q->backup_ids[0], 4);
    cluster_map_free(&map);
}

static uint32_t valid_commands(struct map_cmd *cmds)
{
    uint32_t n = 0;
    static const uint8_t args[] = {13, 'x', '-', 'm', 'a', 'x', '-', 'l', 'e', 'n', 'g',
                                   't', 'h', 0, 'I', 0, 0, 0, 10};
    struct map_queue_decl q = queue_decl("/", "q", 1, 2);
    q.arguments = (struct table){args + 1, sizeof(args) - 1};
    q.arguments.len = 0;
    struct map_exchange_decl x = {.vhost = B("/"), .name = B("x"), .type = B("direct"),
                                  .owner_id = 1};
    struct map_binding_decl b = {.vhost = B("/"), .source = B("x"),
                                 .destination_kind = MAP_DESTINATION_QUEUE,
                                 .destination = B("q"), .routing_key = B("k")};
    struct bytes vh[] = {B("/")};
    uint32_t ids[] = {3};
    assert_int_equal(map_cmd_broker_join(&cmds[n++], 9, B("b9"), B("h:1"), B("h:2"), false, 0), OK);
    assert_int_equal(map_cmd_vhost_put(&cmds[n++], B("v2")), OK);
    assert_int_equal(map_cmd_user_put(&cmds[n++], B("u"), B("h"), vh, 1, vh, 1), OK);
    assert_int_equal(map_cmd_exchange_declare(&cmds[n++], &x), OK);
    assert_int_equal(map_cmd_queue_declare(&cmds[n++], &q, 1), OK);
    assert_int_equal(map_cmd_bind(&cmds[n++], &b), OK);
    assert_int_equal(map_cmd_queue_set_backups(&cmds[n++], B("/"), B("q"), 9, ids, 1), OK);
    assert_int_equal(map_cmd_queue_set_in_sync(&cmds[n++], B("/"), B("q"), 9, ids, NULL, 1), OK);
    assert_int_equal(map_cmd_queue_move(&cmds[n++], B("/"), B("q"), 9, 3), OK);
    assert_int_equal(map_cmd_queue_hand_over(&cmds[n++], B("/"), B("q"), 9, 3), OK);
    assert_int_equal(map_cmd_queue_set_available(&cmds[n++], B("/"), B("q"), 10, false), OK);
    assert_int_equal(map_cmd_broker_state(&cmds[n++], 2, BROKER_STATE_SUSPECT), OK);
    assert_int_equal(map_cmd_exchange_set_owner(&cmds[n++], B("/"), B("x"), 2), OK);
    struct policy_decl p = {B("/"), B("p"), B("^q\\.|^q$"), 5, 2, 0};
    uint32_t two[] = {2};
    assert_int_equal(map_cmd_policy_put(&cmds[n++], &p), OK);
    assert_int_equal(map_cmd_queue_set_factor(&cmds[n++], B("/"), B("q"), 10, 2, two, 1), OK);
    assert_int_equal(map_cmd_policy_delete(&cmds[n++], B("/"), B("p")), OK);
    assert_int_equal(map_cmd_unbind(&cmds[n++], &b), OK);
    assert_int_equal(map_cmd_exchange_delete(&cmds[n++], B("/"), B("x"), true), OK);
    assert_int_equal(map_cmd_queue_delete(&cmds[n++], B("/"), B("q"), 0), OK);
    /* (epochs above count commands: the user commands come last) */
    struct bytes texts[] = {B("^a"), B(""), B(".*")};
    assert_int_equal(map_cmd_user_set(&cmds[n++], B("u"), B("h2"), vh, 1), OK);
    assert_int_equal(map_cmd_permission_put(&cmds[n++], B("u"), B("v2"), texts), OK);
    assert_int_equal(map_cmd_permission_delete(&cmds[n++], B("u"), B("v2")), OK);
    assert_int_equal(map_cmd_user_delete(&cmds[n++], B("u")), OK);
    assert_int_equal(map_cmd_vhost_delete(&cmds[n++], B("v2")), OK);
    assert_int_equal(map_cmd_broker_storage(&cmds[n++], 9, B("0123abcd")), OK);
    assert_int_equal(map_cmd_broker_incarnation(&cmds[n++], 9, 77), OK);
    assert_int_equal(map_cmd_broker_leave(&cmds[n++], 9), OK);
    return n;
}

/* ---- replication policies ------------------------------------------------------------ */

static void test_policies(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("prod")));
    /* Refusals leave the map alone: no vhost, a bad regex. */
    struct policy_decl d = {B("nowhere"), B("ha"), B("^ha\\."), 0, 2, 0};
    assert_int_equal(APPLY_RC(&map, map_cmd_policy_put(&c_, &d)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    d.vhost = B("/");
    d.pattern = B("^(ha");
    assert_int_equal(APPLY_RC(&map, map_cmd_policy_put(&c_, &d)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    assert_non_null(strstr(last.reply_text, "invalid regular expression"));
    assert_int_equal(map.policies.count, 0);
    assert_int_equal(map.policies_generation, 0);
    /* Out of range is malformed: no builder-made command carries it. */
    d.pattern = B("^ha\\.");
    d.backups = 4;
    assert_int_equal(APPLY_RC(&map, map_cmd_policy_put(&c_, &d)), E_SYNTAX);
    d.backups = 2;
    APPLY_OK(&map, map_cmd_policy_put(&c_, &d));
    assert_true(last.changed);
    assert_int_equal(map.policies_generation, 1);
    APPLY_OK(&map, map_cmd_policy_put(&c_, &d));
    assert_false(last.changed); /* the same again */
    assert_int_equal(map.policies_generation, 1);
    /* Matching: per vhost, by the highest priority, ties by name. */
    const struct policy *p = cluster_map_policy_for(&map, B("/"), B("ha.x"));
    assert_non_null(p);
    assert_true(bytes_equal_cstr(p->name, "ha"));
    assert_null(cluster_map_policy_for(&map, B("/"), B("plain")));
    assert_null(cluster_map_policy_for(&map, B("prod"), B("ha.x")));
    struct policy_decl all = {B("/"), B("all"), B("."), 0, 3, 0};
    APPLY_OK(&map, map_cmd_policy_put(&c_, &all));
    p = cluster_map_policy_for(&map, B("/"), B("ha.x"));
    assert_true(bytes_equal_cstr(p->name, "all")); /* 0 = 0: "all" < "ha" */
    d.priority = 1;
    APPLY_OK(&map, map_cmd_policy_put(&c_, &d));
    assert_int_equal(map.policies.count, 2);
    p = cluster_map_policy_for(&map, B("/"), B("ha.x"));
    assert_true(bytes_equal_cstr(p->name, "ha"));
    assert_int_equal(p->backups, 2);
    assert_true(bytes_equal_cstr(cluster_map_policy_for(&map, B("/"), B("plain"))->name, "all"));
    /* Delete: a missing one is 404. */
    assert_int_equal(APPLY_RC(&map, map_cmd_policy_delete(&c_, B("/"), B("nope"))),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    APPLY_OK(&map, map_cmd_policy_delete(&c_, B("/"), B("all")));
    assert_int_equal(last.policies_deleted_count, 1);
    assert_null(cluster_map_policy_for(&map, B("/"), B("plain")));
    /* Deleting a vhost deletes its policies, and only its. */
    struct policy_decl p1 = {B("prod"), B("a"), B("x"), 0, 1, 0};
    struct policy_decl p2 = {B("prod"), B("b"), B("y"), 0, 0, 0};
    APPLY_OK(&map, map_cmd_policy_put(&c_, &p1));
    APPLY_OK(&map, map_cmd_policy_put(&c_, &p2));
    uint64_t gen = map.policies_generation;
    APPLY_OK(&map, map_cmd_vhost_delete(&c_, B("prod")));
    assert_int_equal(last.policies_deleted_count, 2);
    assert_int_equal(map.policies.count, 1);
    assert_true(map.policies_generation > gen);
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("prod")));
    assert_null(cluster_map_policy_for(&map, B("prod"), B("x")));
    cluster_map_free(&map);
}

static void test_queue_set_factor(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    struct map_queue_decl d = queue_decl("/", "q", 1, 2);
    d.replication_factor = 2;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue *q = last.queue;
    uint64_t e = q->epoch;
    /* Up to 3 backups: factor 4, a new backup (not in sync yet). */
    uint32_t ids[] = {2, 3};
    APPLY_OK(&map, map_cmd_queue_set_factor(&c_, B("/"), B("q"), e, 4, ids, 2));
    assert_int_equal(q->replication_factor, 4);
    assert_int_equal(q->backups_count, 2);
    assert_int_equal(q->in_sync_mask, 0x1);
    assert_int_equal(q->epoch, e); /* ownership did not change */
    /* Down to none. */
    APPLY_OK(&map, map_cmd_queue_set_factor(&c_, B("/"), B("q"), e, 1, ids, 0));
    assert_int_equal(q->replication_factor, 1);
    assert_int_equal(q->backups_count, 0);
    assert_int_equal(cluster_map_broker(&map, 2)->backups_held_count, 0);
    /* More backups than the factor allows is malformed; a stale epoch is retried. */
    uint8_t buf[256];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "op", B("queue.set_backups"));
    table_put_longstr(&w, "vhost", B("/"));
    table_put_longstr(&w, "name", B("q"));
    table_put_int(&w, "epoch", (int64_t)e);
    table_put_int(&w, "replication_factor", 1);
    size_t a = table_put_array_begin(&w, "backups");
    table_array_put_int(&w, 2);
    table_put_array_end(&w, a);
    assert_int_equal(cluster_map_apply(&map, buf, w.len, &last), E_SYNTAX);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_set_factor(&c_, B("/"), B("q"), e + 1, 2,
                                                             ids, 1)),
                     E_MAP_REFUSED);
    assert_true(last.retry);
    assert_int_equal(q->replication_factor, 1);
    cluster_map_free(&map);
}

/* limit.put / limit.delete: refused for a vhost or user that does not
 * exist, malformed for a kind the scope lacks; a vhost's and a user's
 * limits go with it; snapshots carry them byte for byte. */
static void test_limits(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("prod")));
    APPLY_OK(&map, map_cmd_user_put(&c_, B("u"), B("hash"), NULL, 0, NULL, 0));
    APPLY_OK(&map, map_cmd_limit(&c_, true, LIMIT_SCOPE_VHOST, B("prod"), LIMIT_MAX_QUEUES, 5));
    assert_true(last.changed);
    APPLY_OK(&map, map_cmd_limit(&c_, true, LIMIT_SCOPE_VHOST, B("prod"), LIMIT_MAX_QUEUES, 5));
    assert_false(last.changed);
    APPLY_OK(&map, map_cmd_limit(&c_, true, LIMIT_SCOPE_USER, B("u"), LIMIT_MAX_CHANNELS, -1));
    APPLY_OK(&map, map_cmd_limit(&c_, true, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_CONNECTIONS, 0));
    assert_int_equal(APPLY_RC(&map, map_cmd_limit(&c_, true, LIMIT_SCOPE_VHOST, B("nope"),
                                                  LIMIT_MAX_QUEUES, 1)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    assert_int_equal(APPLY_RC(&map, map_cmd_limit(&c_, true, LIMIT_SCOPE_USER, B("nope"),
                                                  LIMIT_MAX_CHANNELS, 1)), E_MAP_REFUSED);
    assert_int_equal(map.limits.count, 3);
    assert_int_equal(limit_set_value(&map.limits, LIMIT_SCOPE_USER, B("u"), LIMIT_MAX_CHANNELS),
                     -1);
    assert_non_null(limit_set_find(&map.limits, LIMIT_SCOPE_USER, B("u"), LIMIT_MAX_CHANNELS));
    uint8_t *snap;
    size_t size;
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    struct cluster_map copy;
    cluster_map_init(&copy);
    assert_int_equal(cluster_map_snapshot_read(&copy, snap, size), OK);
    assert_true(limit_set_equal(&copy.limits, &map.limits));
    uint8_t *again;
    size_t again_size;
    assert_int_equal(cluster_map_snapshot_alloc(&copy, &again, &again_size), OK);
    assert_int_equal(again_size, size);
    assert_memory_equal(again, snap, size);
    free(again);
    free(snap);
    cluster_map_free(&copy);
    APPLY_OK(&map, map_cmd_limit(&c_, false, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_CONNECTIONS, 0));
    assert_true(last.changed);
    APPLY_OK(&map, map_cmd_limit(&c_, false, LIMIT_SCOPE_VHOST, B("/"), LIMIT_MAX_CONNECTIONS, 0));
    assert_false(last.changed);
    /* max-queues is checked where the count is the cluster's: a declare
     * beyond it is refused however many brokers passed it on. */
    APPLY_OK(&map, map_cmd_limit(&c_, true, LIMIT_SCOPE_VHOST, B("prod"), LIMIT_MAX_QUEUES, 2));
    const char *names[] = {"q1", "q2", "q3"};
    for (int i = 0; i < 3; i++) {
        struct map_queue_decl d = queue_decl("prod", names[i], 1, 2);
        int rc = APPLY_RC(&map, map_cmd_queue_declare(&c_, &d, 3));
        assert_int_equal(rc, i < 2 ? OK : E_MAP_REFUSED);
    }
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    assert_string_equal(last.reply_text, "cannot declare queue 'q3': queue limit in vhost "
                                         "'prod' (2) is reached");
    struct map_queue_decl redeclared = queue_decl("prod", "q1", 1, 2);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &redeclared, 3)); /* not a new queue */
    APPLY_OK(&map, map_cmd_limit(&c_, true, LIMIT_SCOPE_VHOST, B("prod"), LIMIT_MAX_QUEUES, -1));
    struct map_queue_decl third = queue_decl("prod", "q3", 1, 2);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &third, 3));
    APPLY_OK(&map, map_cmd_vhost_delete(&c_, B("prod")));
    APPLY_OK(&map, map_cmd_user_delete(&c_, B("u")));
    assert_int_equal(map.limits.count, 0);
    cluster_map_free(&map);
}

static void test_policy_snapshots(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("prod")));
    struct policy_decl ds[] = {{B("prod"), B("z"), B("^z"), 7, 3, POLICY_REPLICATE_TRANSIENT},
                               {B("/"), B("ha"), B("^ha\\."), 1, 2, 0},
                               {B("prod"), B("a"), B("a|b"), 0, 0, 0}};
    for (size_t i = 0; i < 3; i++)
        APPLY_OK(&map, map_cmd_policy_put(&c_, &ds[i]));
    uint8_t *snap;
    size_t size;
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    struct cluster_map copy;
    cluster_map_init(&copy);
    uint64_t gen = copy.policies_generation;
    assert_int_equal(cluster_map_snapshot_read(&copy, snap, size), OK);
    assert_true(copy.policies_generation > gen); /* the controller looks again */
    assert_int_equal(copy.policies.count, 3);
    const struct policy *p = cluster_map_policy_for(&copy, B("prod"), B("zebra"));
    assert_non_null(p);
    assert_int_equal(p->priority, 7);
    assert_int_equal(p->backups, 3);
    assert_int_equal(p->replicate, POLICY_REPLICATE_TRANSIENT); /* (quay-replicate) */
    assert_int_equal(cluster_map_policy_for(&copy, B("/"), B("ha.1"))->replicate,
                     POLICY_REPLICATE_UNSET);
    assert_true(bytes_equal_cstr(cluster_map_policy_for(&copy, B("/"), B("ha.1"))->pattern,
                                 "^ha\\."));
    uint8_t *again;
    size_t again_size;
    assert_int_equal(cluster_map_snapshot_alloc(&copy, &again, &again_size), OK);
    assert_int_equal(again_size, size);
    assert_memory_equal(again, snap, size);
    free(again);
    free(snap);
    cluster_map_free(&copy);
    /* A format 1 snapshot (before policies) still loads. */
    uint8_t buf[512];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_int(&w, "format", 1);
    table_put_int(&w, "version", 42);
    table_put_int(&w, "brokers_version", 3);
    const char *parts[] = {"brokers", "users", "exchanges", "queues", "bindings"};
    for (size_t i = 0; i < 5; i++)
        table_put_array_end(&w, table_put_array_begin(&w, parts[i]));
    size_t a = table_put_array_begin(&w, "vhosts");
    table_array_put_longstr(&w, B("/"));
    table_put_array_end(&w, a);
    assert_false(w.overflow);
    assert_int_equal(cluster_map_snapshot_read(&map, buf, w.len), OK);
    assert_int_equal(map.version, 42);
    assert_int_equal(map.policies.count, 0);
    assert_non_null(cluster_map_vhost(&map, B("/")));
    /* A format it does not know is refused. */
    table_writer_init(&w, buf, sizeof buf);
    table_put_int(&w, "format", 3);
    assert_int_equal(cluster_map_snapshot_read(&map, buf, w.len), E_SYNTAX);
    cluster_map_free(&map);
}

static void test_all_valid_commands_apply(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd cmds[32];
    uint32_t n = valid_commands(cmds);
    for (uint32_t i = 0; i < n; i++) {
        int rc = cluster_map_apply(&map, cmds[i].bytes, cmds[i].size, &last);
        if (rc != OK)
            fail_msg("command %u (%s) refused: %s", i, map_op_name(last.op), last.reply_text);
        assert_true(cluster_map_verify(&map));
        map_cmd_free(&cmds[i]);
    }
    assert_int_equal(map.queues_count, 0);
    assert_int_equal(map.brokers_count, 3);
    cluster_map_free(&map);
}

static void test_malformed(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    uint64_t v = map.version;
    /* Not a table, no op, unknown op, wrong types, missing fields. */
    static const uint8_t junk[] = {0xff, 0x00, 0x13};
    assert_int_equal(cluster_map_apply(&map, junk, sizeof junk, &last), E_SYNTAX);
    assert_int_equal(last.reply_code, REPLY_INTERNAL_ERROR);
    assert_int_equal(cluster_map_apply(&map, NULL, 0, &last), E_SYNTAX);
    uint8_t buf[256];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "op", B("queue.explode"));
    assert_int_equal(cluster_map_apply(&map, buf, w.len, &last), E_SYNTAX);
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "op", B("vhost.put"));
    table_put_int(&w, "name", 5);
    assert_int_equal(cluster_map_apply(&map, buf, w.len, &last), E_SYNTAX);
    assert_non_null(strstr(last.reply_text, "'name'"));
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "op", B("broker.state"));
    table_put_int(&w, "id", 1);
    table_put_longstr(&w, "state", B("sleepy"));
    assert_int_equal(cluster_map_apply(&map, buf, w.len, &last), E_SYNTAX);
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "op", B("queue.set_owner"));
    table_put_longstr(&w, "vhost", B("/"));
    table_put_longstr(&w, "name", B("q"));
    table_put_int(&w, "primary", -1);
    table_put_int(&w, "epoch", 1);
    assert_int_equal(cluster_map_apply(&map, buf, w.len, &last), E_SYNTAX);
    /* Four backups. */
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "op", B("queue.set_backups"));
    table_put_longstr(&w, "vhost", B("/"));
    table_put_longstr(&w, "name", B("q"));
    table_put_int(&w, "epoch", 1);
    size_t a = table_put_array_begin(&w, "backups");
    for (int i = 1; i <= 4; i++)
        table_array_put_int(&w, i);
    table_put_array_end(&w, a);
    assert_int_equal(cluster_map_apply(&map, buf, w.len, &last), E_SYNTAX);
    assert_int_equal(map.version, v + 7); /* every apply counts, refused or not */
    assert_int_equal(map.vhosts_count, 1);
    /* Every truncation of every valid command. */
    struct map_cmd cmds[32];
    uint32_t n = valid_commands(cmds);
    uint32_t syntax = 0, total = 0;
    for (uint32_t i = 0; i < n; i++) {
        for (size_t len = 0; len < cmds[i].size; len++) {
            uint8_t *copy = malloc(len ? len : 1); /* exact size: ASan sees overreads */
            memcpy(copy, cmds[i].bytes, len);
            int rc = cluster_map_apply(&map, copy, len, &last);
            assert_true(rc == OK || rc == E_SYNTAX || rc == E_MAP_REFUSED);
            syntax += rc == E_SYNTAX;
            total++;
            free(copy);
            assert_true(cluster_map_verify(&map));
        }
        map_cmd_free(&cmds[i]);
    }
    /* A cut at a field boundary can leave a valid command when only
     * optional fields follow; everything else is a syntax error. */
    assert_true(syntax * 100 >= total * 95);
    cluster_map_free(&map);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void test_fuzz_flips(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd cmds[32];
    uint32_t n = valid_commands(cmds);
    uint32_t outcomes[3] = {0};
    for (uint32_t iter = 0; iter < 40000; iter++) {
        const struct map_cmd *c = &cmds[rng() % n];
        uint8_t *copy = malloc(c->size);
        memcpy(copy, c->bytes, c->size);
        uint32_t flips = 1 + (uint32_t)(rng() % 4);
        for (uint32_t f = 0; f < flips; f++)
            copy[rng() % c->size] ^= (uint8_t)(1u << (rng() % 8));
        int rc = cluster_map_apply(&map, copy, c->size, &last);
        assert_true(rc == OK || rc == E_SYNTAX || rc == E_MAP_REFUSED);
        outcomes[rc == OK ? 0 : rc == E_SYNTAX ? 1 : 2]++;
        free(copy);
        if (iter % 97 == 0)
            assert_true(cluster_map_verify(&map));
    }
    assert_true(cluster_map_verify(&map));
    printf("fuzz: 40000 flipped commands: %u applied, %u malformed, %u refused\n", outcomes[0],
           outcomes[1], outcomes[2]);
    for (uint32_t i = 0; i < n; i++)
        map_cmd_free(&cmds[i]);
    cluster_map_free(&map);
}

/* ---- snapshots at scale ------------------------------------------------------------------ */

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define QUEUES 10000

static void build_big(struct cluster_map *map, double *apply_us)
{
    cluster_map_init(map);
    for (uint32_t id = 1; id <= 5; id++)
        join(map, id, true);
    struct map_cmd c_;
    APPLY_OK(map, map_cmd_vhost_put(&c_, B("/")));
    APPLY_OK(map, map_cmd_vhost_put(&c_, B("prod")));
    struct bytes vh[] = {B("/"), B("prod")};
    APPLY_OK(map, map_cmd_user_put(&c_, B("guest"), B("sha256:abc"), vh, 2, NULL, 0));
    struct map_exchange_decl x = {.vhost = B("prod"), .name = B("events"), .type = B("topic"),
                                  .durable = true, .owner_id = 2};
    APPLY_OK(map, map_cmd_exchange_declare(&c_, &x));
    struct map_cmd *cmds = calloc(QUEUES, sizeof(*cmds));
    for (uint32_t i = 0; i < QUEUES; i++) {
        char name[32];
        snprintf(name, sizeof name, "queue-%05u", i);
        struct map_queue_decl d = queue_decl("prod", name, 1 + i % 5, 1 + (i + 1) % 5);
        d.backup_ids[1] = 1 + (i + 2) % 5;
        d.backups_count = 2;
        assert_int_equal(map_cmd_queue_declare(&cmds[i], &d, 1 + i % 5), OK);
    }
    double t0 = seconds();
    for (uint32_t i = 0; i < QUEUES; i++)
        assert_int_equal(cluster_map_apply(map, cmds[i].bytes, cmds[i].size, NULL), OK);
    *apply_us = (seconds() - t0) * 1e6 / QUEUES;
    for (uint32_t i = 0; i < QUEUES; i++)
        map_cmd_free(&cmds[i]);
    free(cmds);
    for (uint32_t i = 0; i < QUEUES; i += 10) {
        char name[32];
        snprintf(name, sizeof name, "queue-%05u", i);
        struct map_binding_decl b = {.vhost = B("prod"), .source = B("events"),
                                     .destination_kind = MAP_DESTINATION_QUEUE,
                                     .destination = B(name), .routing_key = B("order.*")};
        APPLY_OK(map, map_cmd_bind(&c_, &b));
    }
}

/* cluster.rebalance: the modes, and "done" ending only a "once". */
static void test_rebalance_mode(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    assert_int_equal(map.rebalance, MAP_REBALANCE_UNSET);
    APPLY_OK(&map, map_cmd_rebalance_done(&c_));
    assert_false(last.changed);
    assert_int_equal(map.rebalance, MAP_REBALANCE_UNSET);
    APPLY_OK(&map, map_cmd_rebalance(&c_, MAP_REBALANCE_AUTO));
    assert_true(last.changed);
    APPLY_OK(&map, map_cmd_rebalance_done(&c_));
    assert_int_equal(map.rebalance, MAP_REBALANCE_AUTO); /* an operator's change stays */
    APPLY_OK(&map, map_cmd_rebalance(&c_, MAP_REBALANCE_ONCE));
    assert_int_equal(map.rebalance, MAP_REBALANCE_ONCE);
    APPLY_OK(&map, map_cmd_rebalance_done(&c_));
    assert_true(last.changed);
    assert_int_equal(map.rebalance, MAP_REBALANCE_OFF);
    /* A mode nobody knows is malformed, and changes nothing. */
    uint8_t buf[128];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "op", B("cluster.rebalance"));
    table_put_longstr(&w, "mode", B("sometimes"));
    struct table t = table_writer_table(&w);
    struct map_change change;
    assert_int_not_equal(cluster_map_apply(&map, t.ptr, t.len, &change), OK);
    assert_int_equal(map.rebalance, MAP_REBALANCE_OFF);
    cluster_map_free(&map);
}

static void test_snapshot_round_trip(void **state)
{
    (void)state;
    struct cluster_map map;
    double apply_us;
    build_big(&map, &apply_us);
    assert_true(cluster_map_verify(&map));
    /* Make some state that only the snapshot carries. */
    struct map_cmd c_;
    struct map_queue *q7 = cluster_map_queue(&map, B("prod"), B("queue-00007"));
    uint32_t none[1];
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("prod"), B("queue-00007"), q7->epoch, none, NULL,
                                             0));
    uint32_t target = q7->primary_id == 5 ? 1 : q7->primary_id + 1;
    if (map_queue_has_backup(q7, target))
        target = target == 5 ? 1 : target + 1;
    if (target == q7->primary_id)
        target = target == 5 ? 1 : target + 1;
    APPLY_OK(&map, map_cmd_queue_move(&c_, B("prod"), B("queue-00007"), q7->epoch, target));
    APPLY_OK(&map, map_cmd_broker_state(&c_, 4, BROKER_STATE_DRAINING));
    APPLY_OK(&map, map_cmd_rebalance(&c_, MAP_REBALANCE_ONCE));
    /* A replacement backup catching up beyond the factor (a backup move). */
    struct map_queue *q8 = cluster_map_queue(&map, B("prod"), B("queue-00008"));
    uint32_t ids8[2] = {q8->backup_ids[0], q8->backup_ids[1]};
    APPLY_OK(&map, map_cmd_queue_set_factor(&c_, B("prod"), B("queue-00008"), q8->epoch, 2,
                                            ids8, 1));
    APPLY_OK(&map, map_cmd_queue_set_backups(&c_, B("prod"), B("queue-00008"), q8->epoch, ids8,
                                             2));
    assert_int_equal(q8->backups_count, 2);
    struct map_exchange_decl xd = {.vhost = B("prod"), .name = B("moved"), .type = B("topic"),
                                   .owner_id = 1};
    APPLY_OK(&map, map_cmd_exchange_declare(&c_, &xd));
    APPLY_OK(&map, map_cmd_exchange_set_owner(&c_, B("prod"), B("moved"), 2));
    uint64_t moved_at = map.version;
    assert_int_equal(cluster_map_exchange(&map, B("prod"), B("moved"))->owned_since, moved_at);
    uint8_t *snap;
    size_t size;
    double t0 = seconds();
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    double write_ms = (seconds() - t0) * 1e3;
    struct cluster_map copy;
    cluster_map_init(&copy);
    t0 = seconds();
    assert_int_equal(cluster_map_snapshot_read(&copy, snap, size), OK);
    double read_ms = (seconds() - t0) * 1e3;
    assert_true(cluster_map_verify(&copy));
    assert_int_equal(copy.queues_count, QUEUES);
    assert_int_equal(copy.version, map.version);
    assert_int_equal(copy.bindings_count, QUEUES / 10);
    assert_int_equal(cluster_map_broker(&copy, 4)->state, BROKER_STATE_DRAINING);
    assert_int_equal(copy.rebalance, MAP_REBALANCE_ONCE);
    struct map_queue *c8 = cluster_map_queue(&copy, B("prod"), B("queue-00008"));
    assert_int_equal(c8->backups_count, 2);
    assert_int_equal(c8->replication_factor, 2);
    struct map_queue *c7 = cluster_map_queue(&copy, B("prod"), B("queue-00007"));
    assert_int_equal(c7->epoch, q7->epoch);
    assert_int_equal(c7->owned_since, q7->owned_since);
    assert_int_equal(c7->in_sync_mask, 0);
    assert_int_equal(c7->move_to, target);
    assert_int_equal(c7->backups_count, q7->backups_count);
    assert_int_equal(cluster_map_exchange(&copy, B("prod"), B("moved"))->owned_since, moved_at);
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(copy.brokers[i]->queues_owned_count, map.brokers[i]->queues_owned_count);
    uint8_t *again;
    size_t again_size;
    assert_int_equal(cluster_map_snapshot_alloc(&copy, &again, &again_size), OK);
    assert_int_equal(again_size, size);
    assert_memory_equal(again, snap, size);
    /* A too-small buffer says so. */
    size_t small_size = 1;
    assert_int_equal(cluster_map_snapshot_write(&map, again, 100, &small_size), E_NOMEM);
    assert_int_equal(small_size, 0);
    /* A corrupt or inconsistent snapshot is refused and the map is kept. */
    assert_int_equal(cluster_map_snapshot_read(&copy, snap, size - 3), E_SYNTAX);
    assert_int_equal(copy.queues_count, QUEUES);
    for (int i = 0; i < 40; i++) {
        memcpy(again, snap, size);
        again[rng() % size] ^= (uint8_t)(1u << (rng() % 8));
        int rc = cluster_map_snapshot_read(&copy, again, size);
        assert_true(rc == OK || rc == E_SYNTAX);
        assert_true(cluster_map_verify(&copy));
    }
    printf("map: 10,000 queues: apply %.2f us/queue.declare, snapshot %zu bytes "
           "(%.1f B/queue), write %.1f ms, read %.1f ms, memory %zu bytes (%.0f B/queue)\n",
           apply_us, size, (double)size / QUEUES, write_ms, read_ms,
           cluster_map_memory_size(&map), (double)cluster_map_memory_size(&map) / QUEUES);
    free(snap);
    free(again);
    cluster_map_free(&copy);
    cluster_map_free(&map);
}

/* Shared storage: brokers announce it (broker.storage) and a dead
 * broker's durable queue goes only to a live broker sharing it, which is
 * not a backup (queue.take_over); both survive a snapshot. */
static void test_shared_storage_take_over(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    join(&map, 4, true);
    struct map_cmd c_;
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 1, B("s1")));
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 2, B("s1")));
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 3, B("s2")));
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 4, B("s1")));
    assert_true(last.changed);
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 4, B("s1")));
    assert_false(last.changed);
    assert_true(map_brokers_share_storage(cluster_map_broker(&map, 1),
                                          cluster_map_broker(&map, 2)));
    assert_false(map_brokers_share_storage(cluster_map_broker(&map, 1),
                                           cluster_map_broker(&map, 3)));
    struct map_queue_decl d = queue_decl("/", "q", 1, 4); /* 4: a backup out of sync */
    d.replication_factor = 2;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue_decl t = queue_decl("/", "t", 1, 0);
    t.durable = false;
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &t, 1));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("q"));
    uint64_t e = q->epoch;
    /* Not while its primary is up. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), e, 2, 1)),
                     E_MAP_REFUSED);
    APPLY_OK(&map, map_cmd_broker_state(&c_, 1, BROKER_STATE_DOWN));
    /* Not to another storage, not to a backup, not a transient queue. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), e, 3, 1)),
                     E_MAP_REFUSED);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), e, 4, 1)),
                     E_MAP_REFUSED);
    struct map_queue *tq = cluster_map_queue(&map, B("/"), B("t"));
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over(&c_, B("/"), B("t"), tq->epoch, 2,
                                                            1)),
                     E_MAP_REFUSED);
    /* Not from a broker that is not the primary, not at a stale epoch. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), e, 2, 3)),
                     E_MAP_REFUSED);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), e + 1, 2, 1)),
                     E_MAP_REFUSED);
    assert_int_equal(q->primary_id, 1);
    APPLY_OK(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), e, 2, 1));
    assert_true(last.changed);
    assert_int_equal(q->primary_id, 2);
    assert_int_equal(q->taken_from, 1);
    assert_int_equal(q->backups_count, 0);
    assert_int_equal(q->epoch, e + 1);
    assert_true(q->available);
    assert_int_equal(cluster_map_broker(&map, 4)->backups_held_count, 0);
    /* The snapshot carries the storage ids and taken_from. */
    uint8_t *snap;
    size_t size;
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    struct cluster_map copy;
    cluster_map_init(&copy);
    assert_int_equal(cluster_map_snapshot_read(&copy, snap, size), OK);
    assert_true(cluster_map_verify(&copy));
    assert_true(bytes_equal(cluster_map_broker(&copy, 2)->storage_id, B("s1")));
    assert_true(bytes_equal(cluster_map_broker(&copy, 3)->storage_id, B("s2")));
    struct map_queue *cq = cluster_map_queue(&copy, B("/"), B("q"));
    assert_int_equal(cq->taken_from, 1);
    assert_int_equal(cq->primary_id, 2);
    uint8_t *again;
    size_t again_size;
    assert_int_equal(cluster_map_snapshot_alloc(&copy, &again, &again_size), OK);
    assert_int_equal(again_size, size);
    assert_memory_equal(again, snap, size);
    free(snap);
    free(again);
    /* The taker dies before it said it adopted: a takeover from it keeps
     * the first source too (taken_from_before), which a snapshot carries. */
    assert_int_equal(q->taken_from_before, BROKER_ID_NONE);
    assert_false(q->adopted);
    APPLY_OK(&map, map_cmd_broker_state(&c_, 2, BROKER_STATE_DOWN));
    APPLY_OK(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), q->epoch, 4, 2));
    assert_int_equal(q->taken_from, 2);
    assert_int_equal(q->taken_from_before, 1);
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    struct cluster_map chained;
    cluster_map_init(&chained);
    assert_int_equal(cluster_map_snapshot_read(&chained, snap, size), OK);
    assert_int_equal(cluster_map_queue(&chained, B("/"), B("q"))->taken_from_before, 1);
    free(snap);
    cluster_map_free(&chained);
    /* queue.adopted: only from its primary; then a takeover from it reads
     * its log alone. */
    APPLY_OK(&map, map_cmd_queue_adopted(&c_, B("/"), B("q"), 2));
    assert_false(last.changed);
    APPLY_OK(&map, map_cmd_queue_adopted(&c_, B("/"), B("q"), 4));
    assert_true(last.changed);
    assert_true(q->adopted);
    APPLY_OK(&map, map_cmd_queue_adopted(&c_, B("/"), B("q"), 4));
    assert_false(last.changed);
    APPLY_OK(&map, map_cmd_broker_state(&c_, 2, BROKER_STATE_UP));
    APPLY_OK(&map, map_cmd_broker_state(&c_, 4, BROKER_STATE_DOWN));
    APPLY_OK(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), q->epoch, 2, 4));
    assert_int_equal(q->taken_from, 4);
    assert_int_equal(q->taken_from_before, BROKER_ID_NONE);
    assert_false(q->adopted);
    /* A later change of primary forgets where it came from; a broker
     * restarted without shared storage says so. */
    APPLY_OK(&map, map_cmd_queue_set_owner(&c_, B("/"), B("q"), q->epoch, 3));
    assert_int_equal(q->taken_from, BROKER_ID_NONE);
    assert_int_equal(q->taken_from_before, BROKER_ID_NONE);
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 3, (struct bytes){NULL, 0}));
    assert_int_equal(cluster_map_broker(&map, 3)->storage_id.len, 0);
    assert_false(map_brokers_share_storage(cluster_map_broker(&map, 3),
                                           cluster_map_broker(&map, 3)));
    cluster_map_free(&copy);
    cluster_map_free(&map);
}

/* queue.take_over with replica: only by an in-sync backup of a queue with
 * x-quay-replicate "transient" that shares the dead primary's storage;
 * the change says so (the mirror keeps the replica), the other backups
 * go. */
static void test_take_over_with_replica(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    join(&map, 4, true);
    struct map_cmd c_;
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 1, B("s1")));
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 2, B("s1")));
    APPLY_OK(&map, map_cmd_broker_storage(&c_, 3, B("s1")));
    uint8_t buf[64];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "x-quay-replicate", B("transient"));
    struct map_queue_decl d = queue_decl("/", "q", 1, 2);
    d.backup_ids[1] = 3;
    d.backups_count = 2;
    d.arguments = table_writer_table(&w);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue_decl plain = queue_decl("/", "plain", 1, 2);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &plain, 1));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("q"));
    struct map_queue *pq = cluster_map_queue(&map, B("/"), B("plain"));
    uint32_t two = 2;
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("q"), q->epoch, &two, NULL, 1));
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("plain"), pq->epoch, &two, NULL, 1));
    APPLY_OK(&map, map_cmd_broker_state(&c_, 1, BROKER_STATE_DOWN));
    uint64_t e = q->epoch;
    /* Not by a backup out of sync (3), not of a queue without the argument. */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over_with_replica(&c_, B("/"), B("q"), e,
                                                                         3, 1)),
                     E_MAP_REFUSED);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over_with_replica(
                                        &c_, B("/"), B("plain"), pq->epoch, 2, 1)),
                     E_MAP_REFUSED);
    /* Nor by a broker that is not a backup (the plain take_over's case). */
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over_with_replica(&c_, B("/"), B("q"), e,
                                                                         4, 1)),
                     E_MAP_REFUSED);
    APPLY_OK(&map, map_cmd_queue_take_over_with_replica(&c_, B("/"), B("q"), e, 2, 1));
    assert_true(last.changed);
    assert_true(last.with_replica);
    assert_int_equal(q->primary_id, 2);
    assert_int_equal(q->taken_from, 1);
    assert_int_equal(q->backups_count, 0);
    assert_int_equal(q->epoch, e + 1);
    cluster_map_free(&map);
}

/* The policy key quay-replicate: a queue without the argument whose
 * applying policy says "transient" is taken over with its replica as if
 * it had the argument; a policy change that turns it back to "all" drops
 * its backups from the in-sync set in the same command (they hold its
 * transient messages only: promoted as usual, they would lose the
 * persistent ones), and only its: not those of a queue whose argument
 * says "transient", nor those of a queue the change leaves alone. */
static void test_policy_replicate(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    for (uint32_t id = 1; id <= 3; id++)
        APPLY_OK(&map, map_cmd_broker_storage(&c_, id, B("s1")));
    uint8_t buf[64];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "x-quay-replicate", B("transient"));
    const char *names[] = {"tr.q", "tr.arg", "other"};
    struct map_queue *qs[3];
    for (int i = 0; i < 3; i++) {
        struct map_queue_decl d = queue_decl("/", names[i], 1, 2);
        if (i == 1)
            d.arguments = table_writer_table(&w);
        APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
        qs[i] = cluster_map_queue(&map, B("/"), B(names[i]));
        uint32_t two = 2;
        APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B(names[i]), qs[i]->epoch,
                                                 &two, NULL, 1));
    }
    assert_false(map_queue_replicates_transient_only(&map, qs[0]));
    struct policy_decl tr = {B("/"), B("tr"), B("^tr\\."), 0, 1, POLICY_REPLICATE_TRANSIENT};
    APPLY_OK(&map, map_cmd_policy_put(&c_, &tr));
    assert_true(map_queue_replicates_transient_only(&map, qs[0]));
    assert_true(map_queue_replicates_transient_only(&map, qs[1]));
    assert_false(map_queue_replicates_transient_only(&map, qs[2]));
    for (int i = 0; i < 3; i++)
        assert_int_equal(qs[i]->in_sync_mask, 1); /* "all" -> "transient": nothing to drop */
    /* A higher policy that does not say it: "all" for tr.q, whose backup
     * leaves the in-sync set; tr.arg keeps its argument's "transient". */
    struct policy_decl over = {B("/"), B("over"), B("q$"), 5, 1, POLICY_REPLICATE_UNSET};
    APPLY_OK(&map, map_cmd_policy_put(&c_, &over));
    assert_false(map_queue_replicates_transient_only(&map, qs[0]));
    assert_int_equal(qs[0]->in_sync_mask, 0);
    assert_int_equal(qs[1]->in_sync_mask, 1);
    assert_int_equal(qs[2]->in_sync_mask, 1);
    APPLY_OK(&map, map_cmd_policy_delete(&c_, B("/"), B("over")));
    uint32_t two = 2;
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("tr.q"), qs[0]->epoch, &two, NULL, 1));
    /* Deleting the policy: the same. */
    APPLY_OK(&map, map_cmd_policy_delete(&c_, B("/"), B("tr")));
    assert_int_equal(qs[0]->in_sync_mask, 0);
    assert_int_equal(qs[1]->in_sync_mask, 1);
    /* By the policy alone, the takeover with the replica is accepted. */
    APPLY_OK(&map, map_cmd_policy_put(&c_, &tr));
    APPLY_OK(&map, map_cmd_queue_set_in_sync(&c_, B("/"), B("tr.q"), qs[0]->epoch, &two, NULL, 1));
    APPLY_OK(&map, map_cmd_broker_state(&c_, 1, BROKER_STATE_DOWN));
    APPLY_OK(&map, map_cmd_queue_take_over_with_replica(&c_, B("/"), B("tr.q"), qs[0]->epoch,
                                                        2, 1));
    assert_int_equal(qs[0]->primary_id, 2);
    assert_int_equal(APPLY_RC(&map, map_cmd_queue_take_over_with_replica(
                                        &c_, B("/"), B("other"), qs[2]->epoch, 2, 1)),
                     E_MAP_REFUSED);
    cluster_map_free(&map);
}

/* A chain of takers that die one after another without saying
 * queue.adopted: each queue.take_over moves the sources the map names one
 * down (taken_from, taken_from_before, taken_older newest first), the
 * oldest beyond CLUSTER_BACKUPS_MAX older ones forgotten; a snapshot keeps
 * the chain; a dead primary that had said queue.adopted ends it. */
static void test_take_over_chain(void **state)
{
    (void)state;
    struct cluster_map map;
    cluster_map_init(&map);
    struct map_cmd c_;
    for (uint32_t id = 1; id <= 7; id++) {
        join(&map, id, id <= 5);
        APPLY_OK(&map, map_cmd_broker_storage(&c_, id, B("s1")));
    }
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("/")));
    struct map_queue_decl d = queue_decl("/", "q", 1, 0);
    APPLY_OK(&map, map_cmd_queue_declare(&c_, &d, 1));
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("q"));
    for (uint32_t to = 2; to <= 7; to++) { /* 1 -> 2 -> ... -> 7, each dying */
        APPLY_OK(&map, map_cmd_broker_state(&c_, to - 1, BROKER_STATE_DOWN));
        APPLY_OK(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), q->epoch, to, to - 1));
        assert_int_equal(q->taken_from, to - 1);
        assert_int_equal(q->taken_from_before, to > 2 ? to - 2 : BROKER_ID_NONE);
        uint8_t older = to > 3 ? (uint8_t)(to - 3) : 0;
        older = older > CLUSTER_BACKUPS_MAX ? CLUSTER_BACKUPS_MAX : older;
        assert_int_equal(q->taken_older_count, older);
        for (uint8_t i = 0; i < older; i++)
            assert_int_equal(q->taken_older[i], to - 3 - i); /* newest first */
    }
    /* 7 took it from 6: before 5, older 4, 3, 2 (1 forgotten). */
    uint8_t *snap;
    size_t size;
    assert_int_equal(cluster_map_snapshot_alloc(&map, &snap, &size), OK);
    struct cluster_map copy;
    cluster_map_init(&copy);
    assert_int_equal(cluster_map_snapshot_read(&copy, snap, size), OK);
    free(snap);
    const struct map_queue *cq = cluster_map_queue(&copy, B("/"), B("q"));
    assert_int_equal(cq->taken_older_count, 3);
    assert_int_equal(cq->taken_older[0], 4);
    assert_int_equal(cq->taken_older[2], 2);
    cluster_map_free(&copy);
    /* 7 says it adopted and dies: the next taker reads 7's log alone. */
    APPLY_OK(&map, map_cmd_queue_adopted(&c_, B("/"), B("q"), 7));
    APPLY_OK(&map, map_cmd_broker_state(&c_, 7, BROKER_STATE_DOWN));
    APPLY_OK(&map, map_cmd_broker_state(&c_, 1, BROKER_STATE_UP));
    APPLY_OK(&map, map_cmd_queue_take_over(&c_, B("/"), B("q"), q->epoch, 1, 7));
    assert_int_equal(q->taken_from, 7);
    assert_int_equal(q->taken_from_before, BROKER_ID_NONE);
    assert_int_equal(q->taken_older_count, 0);
    cluster_map_free(&map);
}

static void test_lookup_is_constant_time(void **state)
{
    (void)state;
    struct cluster_map map;
    double apply_us;
    build_big(&map, &apply_us);
    double t0 = seconds();
    uint32_t found = 0;
    for (uint32_t r = 0; r < 10; r++) {
        for (uint32_t i = 0; i < QUEUES; i++) {
            char name[32];
            snprintf(name, sizeof name, "queue-%05u", i);
            found += cluster_map_queue(&map, B("prod"), B(name)) != NULL;
        }
    }
    double us = (seconds() - t0) * 1e6 / (10.0 * QUEUES);
    assert_int_equal(found, 10 * QUEUES);
    assert_null(cluster_map_queue(&map, B("/"), B("queue-00001")));
    printf("map: lookup %.3f us/queue (10,000 queues)\n", us);
    cluster_map_free(&map);
}

/* Snapshot bytes of map, compared after a read (a round trip is exact). */
static void assert_round_trip(const struct cluster_map *map, struct cluster_map *copy)
{
    uint8_t *snap, *again;
    size_t size, again_size;
    assert_int_equal(cluster_map_snapshot_alloc(map, &snap, &size), OK);
    cluster_map_init(copy);
    assert_int_equal(cluster_map_snapshot_read(copy, snap, size), OK);
    assert_true(cluster_map_verify(copy));
    assert_int_equal(cluster_map_snapshot_alloc(copy, &again, &again_size), OK);
    assert_int_equal(again_size, size);
    assert_memory_equal(again, snap, size);
    free(snap);
    free(again);
}

static void assert_permission(const struct map_user *u, const char *vhost, const char *c,
                              const char *w, const char *r)
{
    uint32_t j = 0;
    while (j < u->vhosts_count && !bytes_equal(u->vhosts[j], B(vhost)))
        j++;
    assert_true(j < u->vhosts_count);
    assert_true(bytes_equal(u->permissions[3 * j], B(c)));
    assert_true(bytes_equal(u->permissions[3 * j + 1], B(w)));
    assert_true(bytes_equal(u->permissions[3 * j + 2], B(r)));
}

/* users.bootstrap, user.put without vhosts (user_set), permission.put and
 * .delete: what each changes, what each refuses leaving the map as it was,
 * and the snapshot carrying permissions, flags and users_defined. */
static void test_permissions_and_bootstrap(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("/")));
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("prod")));
    assert_false(map.users_defined);
    struct bytes vhosts[] = {B("/"), B("made-by-boot")};
    struct bytes texts[] = {B("^a"), B(""), B(".*"), B(".*"), B(".*"), B(".*")};
    struct bytes tags[] = {B("administrator")};
    struct map_user boot = {.name = B("boot"), .password_hash = B("h1"), .vhosts = vhosts,
                            .vhosts_count = 2, .permissions = texts, .tags = tags,
                            .tags_count = 1, .loopback = true};
    struct map_user star = {.name = B("star"), .password_hash = B("h2"), .any_vhost = true};
    const struct map_user *list[] = {&boot, &star};
    APPLY_OK(&map, map_cmd_users_bootstrap(&c_, list, 2));
    assert_true(map.users_defined);
    assert_non_null(cluster_map_vhost(&map, B("made-by-boot")));
    struct map_user *u = cluster_map_user(&map, B("boot"));
    assert_non_null(u);
    assert_true(u->loopback);
    assert_permission(u, "/", "^a", "", ".*");
    assert_true(cluster_map_user(&map, B("star"))->any_vhost);
    /* A second file (another broker's) is refused: the first one won. */
    struct map_user other = {.name = B("other"), .password_hash = B("h3")};
    const struct map_user *list2[] = {&other};
    assert_int_equal(APPLY_RC(&map, map_cmd_users_bootstrap(&c_, list2, 1)), E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    assert_null(cluster_map_user(&map, B("other")));
    /* A changed password and tags keep the permissions. */
    APPLY_OK(&map, map_cmd_user_set(&c_, B("boot"), B("h9"), NULL, 0));
    assert_true(bytes_equal(u->password_hash, B("h9")));
    assert_int_equal(u->tags_count, 0);
    assert_permission(u, "/", "^a", "", ".*");
    APPLY_OK(&map, map_cmd_user_set(&c_, B("carl"), B("h4"), tags, 1));
    struct map_user *carl = cluster_map_user(&map, B("carl"));
    assert_int_equal(carl->vhosts_count, 0);
    struct bytes mine[] = {B("^c-"), B("^c-"), B("")};
    APPLY_OK(&map, map_cmd_permission_put(&c_, B("carl"), B("prod"), mine));
    assert_true(last.changed);
    assert_permission(carl, "prod", "^c-", "^c-", "");
    APPLY_OK(&map, map_cmd_permission_put(&c_, B("carl"), B("prod"), mine));
    assert_false(last.changed);
    /* Refusals change nothing: a bad regex, an unknown user or vhost. */
    struct bytes bad[] = {B("("), B(".*"), B(".*")};
    assert_int_equal(APPLY_RC(&map, map_cmd_permission_put(&c_, B("carl"), B("prod"), bad)),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    assert_permission(carl, "prod", "^c-", "^c-", "");
    assert_int_equal(APPLY_RC(&map, map_cmd_permission_put(&c_, B("nobody"), B("prod"), mine)),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    assert_int_equal(APPLY_RC(&map, map_cmd_permission_put(&c_, B("carl"), B("none"), mine)),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    assert_int_equal(carl->vhosts_count, 1);
    /* The snapshot carries all of it, byte for byte. */
    struct cluster_map copy;
    assert_round_trip(&map, &copy);
    assert_true(copy.users_defined);
    assert_permission(cluster_map_user(&copy, B("boot")), "/", "^a", "", ".*");
    assert_true(cluster_map_user(&copy, B("boot"))->loopback);
    assert_true(cluster_map_user(&copy, B("star"))->any_vhost);
    assert_permission(cluster_map_user(&copy, B("carl")), "prod", "^c-", "^c-", "");
    cluster_map_free(&copy);
    /* Deletes: a permission, then its vhost takes the others on it. */
    APPLY_OK(&map, map_cmd_permission_delete(&c_, B("carl"), B("prod")));
    assert_int_equal(carl->vhosts_count, 0);
    assert_int_equal(APPLY_RC(&map, map_cmd_permission_delete(&c_, B("carl"), B("prod"))),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    APPLY_OK(&map, map_cmd_vhost_delete(&c_, B("made-by-boot")));
    assert_int_equal(u->vhosts_count, 1);
    assert_permission(u, "/", "^a", "", ".*");
    /* No users left: the map still says they are its own. */
    APPLY_OK(&map, map_cmd_user_delete(&c_, B("boot")));
    APPLY_OK(&map, map_cmd_user_delete(&c_, B("star")));
    APPLY_OK(&map, map_cmd_user_delete(&c_, B("carl")));
    assert_round_trip(&map, &copy);
    assert_true(copy.users_defined);
    assert_int_equal(copy.users_count, 0);
    cluster_map_free(&copy);
    cluster_map_free(&map);
}

/* users.import: users, vhosts and permissions of one definitions import,
 * whole or not at all; a permission may name the command's own user and
 * vhost; an existing user keeps the permissions the command leaves out. */
static void test_users_import(void **state)
{
    (void)state;
    struct cluster_map map;
    setup_small(&map);
    struct map_cmd c_;
    APPLY_OK(&map, map_cmd_vhost_put(&c_, B("/")));
    struct bytes tags[] = {B("management")};
    /* A map without users yet still takes a broker's users file after an
     * import (quayd --definitions at a first start comes first). */
    struct map_import_user early[] = {{B("early"), B("h9"), NULL, 0}};
    APPLY_OK(&map, map_cmd_users_import(&c_, early, 1, NULL, 0, NULL, 0));
    assert_false(map.users_defined);
    struct map_user file_user = {.name = B("guest"), .password_hash = B("hg")};
    const struct map_user *file[] = {&file_user};
    APPLY_OK(&map, map_cmd_users_bootstrap(&c_, file, 1));
    assert_true(map.users_defined);
    assert_non_null(cluster_map_user(&map, B("guest")));
    assert_non_null(cluster_map_user(&map, B("early")));
    APPLY_OK(&map, map_cmd_user_set(&c_, B("old"), B("h0"), NULL, 0));
    struct bytes all[] = {B(".*"), B(".*"), B(".*")};
    APPLY_OK(&map, map_cmd_permission_put(&c_, B("old"), B("/"), all));
    struct map_import_user users[] = {{B("new"), B("h1"), tags, 1}, {B("old"), B("h2"), tags, 1}};
    struct bytes vhosts[] = {B("v1"), B("/")};
    struct map_import_permission perms[] = {{B("new"), B("v1"), {B("^n-"), B(""), B(".*")}},
                                            {B("old"), B("v1"), {B(".*"), B(".*"), B(".*")}}};
    /* One bad item (a regex, an unknown user, an unknown vhost): nothing. */
    struct map_import_permission bad[] = {perms[0], {B("old"), B("v1"), {B("("), B(""), B("")}}};
    struct map_import_permission nobody[] = {{B("nobody"), B("/"), {B(""), B(""), B("")}}};
    struct map_import_permission nowhere[] = {{B("new"), B("v9"), {B(""), B(""), B("")}}};
    uint32_t version = (uint32_t)map.version;
    assert_int_equal(APPLY_RC(&map, map_cmd_users_import(&c_, users, 2, vhosts, 2, bad, 2)),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_PRECONDITION_FAILED);
    assert_int_equal(APPLY_RC(&map, map_cmd_users_import(&c_, users, 2, vhosts, 2, nobody, 1)),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    assert_int_equal(APPLY_RC(&map, map_cmd_users_import(&c_, users, 2, vhosts, 2, nowhere, 1)),
                     E_MAP_REFUSED);
    assert_int_equal(last.reply_code, REPLY_NOT_FOUND);
    assert_int_equal(map.version, version + 3);
    assert_null(cluster_map_user(&map, B("new")));
    assert_null(cluster_map_vhost(&map, B("v1")));
    assert_true(bytes_equal(cluster_map_user(&map, B("old"))->password_hash, B("h0")));
    /* The whole: a new user, a changed one keeping its permission on /. */
    APPLY_OK(&map, map_cmd_users_import(&c_, users, 2, vhosts, 2, perms, 2));
    assert_true(last.changed);

    assert_non_null(cluster_map_vhost(&map, B("v1")));
    struct map_user *n = cluster_map_user(&map, B("new"));
    assert_non_null(n);
    assert_true(bytes_equal(n->password_hash, B("h1")));
    assert_int_equal(n->tags_count, 1);
    assert_permission(n, "v1", "^n-", "", ".*");
    struct map_user *o = cluster_map_user(&map, B("old"));
    assert_true(bytes_equal(o->password_hash, B("h2")));
    assert_int_equal(o->vhosts_count, 2);
    assert_permission(o, "/", ".*", ".*", ".*");
    assert_permission(o, "v1", ".*", ".*", ".*");
    struct cluster_map copy;
    assert_round_trip(&map, &copy);
    assert_permission(cluster_map_user(&copy, B("new")), "v1", "^n-", "", ".*");
    cluster_map_free(&copy);
    cluster_map_free(&map);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_brokers),
        cmocka_unit_test(test_broker_incarnation),
        cmocka_unit_test(test_join_carries_incarnation),
        cmocka_unit_test(test_vhosts_users),
        cmocka_unit_test(test_permissions_and_bootstrap),
        cmocka_unit_test(test_exchanges_bindings),
        cmocka_unit_test(test_auto_delete_exchanges),
        cmocka_unit_test(test_predeclared_exchanges),
        cmocka_unit_test(test_queue_declare_races),
        cmocka_unit_test(test_queue_ownership),
        cmocka_unit_test(test_queue_move),
        cmocka_unit_test(test_objects_stamp),
        cmocka_unit_test(test_policies),
        cmocka_unit_test(test_queue_set_factor),
        cmocka_unit_test(test_policy_snapshots),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_all_valid_commands_apply),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_fuzz_flips),
        cmocka_unit_test(test_rebalance_mode),
        cmocka_unit_test(test_queue_move_backup),
        cmocka_unit_test(test_snapshot_round_trip),
        cmocka_unit_test(test_shared_storage_take_over),
        cmocka_unit_test(test_take_over_with_replica),
        cmocka_unit_test(test_policy_replicate),
        cmocka_unit_test(test_take_over_chain),
        cmocka_unit_test(test_lookup_is_constant_time),
        cmocka_unit_test(test_users_import),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
