/*
 * test_controller.c: the controller's decisions, end to end on a map.
 *
 * Goal: liveness thresholds and resets give the right state changes; when a
 * broker owning ~2,000 queues dies, every one of them gets its first
 * in-sync backup as primary with epoch + 1 (or becomes unavailable when it
 * has none), every replication factor is restored, and applying the
 * returned commands leaves a consistent map (one primary, distinct backups,
 * none on the dead broker); the broker's return brings its queues back;
 * stale decisions are refused and decided again; draining and joining
 * converge over rounds. Method: build a 5-broker map with 10,000 placed
 * queues, run each decision, apply every command it returns, check.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/adoption.h"
#include "cluster/controller.h"
#include "cluster/map.h"
#include "cluster/placement.h"
#include "lib/errors.h"

#define B(s) bytes_of_cstr(s)
#define QUEUES 10000

static void must_apply(struct cluster_map *map, int build_rc, struct map_cmd *cmd)
{
    assert_int_equal(build_rc, OK);
    struct map_change change;
    int rc = cluster_map_apply(map, cmd->bytes, cmd->size, &change);
    if (rc != OK)
        fail_msg("%s refused: %s", map_op_name(change.op), change.reply_text);
    map_cmd_free(cmd);
}

/* Applies a batch; returns how many were refused (those must say retry). */
static uint32_t apply_all(struct cluster_map *map, struct map_cmd_list *list)
{
    uint32_t refused = 0;
    for (uint32_t i = 0; i < list->count; i++) {
        struct map_change change;
        int rc = cluster_map_apply(map, list->items[i].bytes, list->items[i].size, &change);
        if (rc != OK) {
            assert_int_equal(rc, E_MAP_REFUSED);
            if (!change.retry)
                fail_msg("%s refused: %s", map_op_name(change.op), change.reply_text);
            refused++;
        }
    }
    map_cmd_list_free(list);
    assert_true(cluster_map_verify(map));
    return refused;
}

/* What the brokers and the controller's repair do between controller
 * rounds, simulated: the repair adds the backups moves wait for, every
 * backup catches up (in sync), then every primary with a move that is
 * ready hands over (queue.set_owner planned, handover.c). Returns how many
 * handed over. */
static uint32_t brokers_catch_up_and_hand_over(struct cluster_map *map)
{
    struct map_cmd c;
    uint32_t handed = 0;
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list repairs;
    map_cmd_list_init(&repairs);
    assert_int_equal(controller_repair(map, &config, &repairs), OK);
    apply_all(map, &repairs);
    map_cmd_list_free(&repairs);
    for (uint32_t i = 0; i < map->queues_count; i++) {
        struct map_queue *q = map->queues[i];
        if (q->in_sync_mask != (1u << q->backups_count) - 1)
            must_apply(map, map_cmd_queue_set_in_sync(&c, q->vhost->name, q->name, q->epoch,
                                                      q->backup_ids, NULL, q->backups_count),
                       &c);
    }
    for (uint32_t i = 0; i < map->queues_count; i++) {
        struct map_queue *q = map->queues[i];
        if (map_queue_move_state(map, q) != MAP_MOVE_READY)
            continue;
        must_apply(map, map_cmd_queue_hand_over(&c, q->vhost->name, q->name, q->epoch,
                                                q->move_to),
                   &c);
        handed++;
    }
    return handed;
}

static void join(struct cluster_map *map, uint32_t id)
{
    char name[16];
    snprintf(name, sizeof name, "b%u", id);
    struct map_cmd c;
    must_apply(map, map_cmd_broker_join(&c, id, B(name), B("h:5672"), B("h:4369"), id <= 5, 0), &c);
}

/* Brokers 1..brokers, all up, and the vhost "/": no queues yet. */
static void small_map(struct cluster_map *map, uint32_t brokers)
{
    cluster_map_init(map);
    for (uint32_t id = 1; id <= brokers; id++)
        join(map, id);
    struct map_cmd c;
    must_apply(map, map_cmd_vhost_put(&c, B("/")), &c);
}

static void build(struct cluster_map *map, uint8_t rf)
{
    cluster_map_init(map);
    for (uint32_t id = 1; id <= 5; id++)
        join(map, id);
    struct map_cmd c;
    must_apply(map, map_cmd_vhost_put(&c, B("/")), &c);
    struct placement_config config;
    placement_config_default(&config);
    struct placement p;
    placement_init(&p, &config);
    placement_refresh(&p, map);
    for (uint32_t i = 0; i < QUEUES; i++) {
        char name[32];
        snprintf(name, sizeof name, "jobs.%u", i);
        struct placement_result r;
        assert_int_equal(placement_place_queue(&p, B("/"), B(name), rf, PLACEMENT_PRIMARY_RING, BROKER_ID_NONE, &r), OK);
        struct map_queue_decl d = {.vhost = B("/"), .name = B(name), .durable = true,
                                   .primary_id = r.primary_id, .backups_count = r.backups_count,
                                   .replication_factor = rf};
        memcpy(d.backup_ids, r.backup_ids, sizeof(d.backup_ids));
        must_apply(map, map_cmd_queue_declare(&c, &d, r.primary_id), &c);
    }
    placement_free(&p);
    struct map_exchange_decl x = {.vhost = B("/"), .name = B("jobs"), .type = B("direct"),
                                  .durable = true, .owner_id = 2};
    must_apply(map, map_cmd_exchange_declare(&c, &x), &c);
}

/* The invariants a map must keep whatever the controller did. */
static void assert_consistent(const struct cluster_map *map)
{
    assert_true(cluster_map_verify(map));
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        for (uint8_t b = 0; b < q->backups_count; b++) {
            assert_int_not_equal(q->backup_ids[b], q->primary_id);
            for (uint8_t c = 0; c < b; c++)
                assert_int_not_equal(q->backup_ids[b], q->backup_ids[c]);
        }
    }
}

static void test_liveness(void **state)
{
    (void)state;
    struct cluster_map map;
    cluster_map_init(&map);
    for (uint32_t id = 1; id <= 5; id++)
        join(&map, id);
    struct map_cmd c;
    must_apply(&map, map_cmd_broker_state(&c, 4, BROKER_STATE_SUSPECT), &c);
    must_apply(&map, map_cmd_broker_state(&c, 5, BROKER_STATE_DOWN), &c);
    struct controller_config config;
    controller_config_default(&config);
    uint64_t now = 100000;
    struct controller_heard heard[] = {
        {1, now - 10, false, 0, 0, false},   /* up, fine */
        {2, now - 1500, false, 0, 0, false}, /* up -> suspect */
        {3, now - 100, true, 0, 0, false},   /* reset -> down at once */
        {4, now - 50, false, 0, 0, false},   /* suspect -> up */
        {5, now - 20, false, 0, 0, false},   /* down -> up (restarted) */
        {9, now - 99999, false, 0, 0, false} /* unknown broker: ignored */
    };
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    assert_int_equal(controller_check_liveness(&map, &config, heard, 6, now, &out), OK);
    assert_int_equal(out.count, 4);
    /* Each says why (the log's and the console's reason). */
    static const enum map_reason why[] = {MAP_REASON_SILENCE, MAP_REASON_RESET,
                                          MAP_REASON_HEARD, MAP_REASON_HEARD};
    static const uint64_t silent[] = {1500, 100, 50, 20};
    for (uint32_t i = 0; i < out.count; i++) {
        struct map_change change;
        assert_int_equal(cluster_map_apply(&map, out.items[i].bytes, out.items[i].size, &change),
                         OK);
        assert_int_equal(change.reason, why[i]);
        assert_int_equal(change.silence_ms, silent[i]);
    }
    map_cmd_list_free(&out);
    map_cmd_list_init(&out);
    assert_int_equal(cluster_map_broker(&map, 1)->state, BROKER_STATE_UP);
    assert_int_equal(cluster_map_broker(&map, 2)->state, BROKER_STATE_SUSPECT);
    assert_int_equal(cluster_map_broker(&map, 3)->state, BROKER_STATE_DOWN);
    assert_int_equal(cluster_map_broker(&map, 4)->state, BROKER_STATE_UP);
    assert_int_equal(cluster_map_broker(&map, 5)->state, BROKER_STATE_UP);
    /* Time passes without news from 2: suspect -> down at 2 s. Draining
     * brokers stay draining while heard. A clock step back is "just heard". */
    must_apply(&map, map_cmd_broker_state(&c, 1, BROKER_STATE_DRAINING), &c);
    struct controller_heard later[] = {{1, now + 1900, false, 0, 0, false},
                                       {2, now - 1500, false, 0, 0, false},
                                       {4, now + 5000, false, 0, 0, false}};
    assert_int_equal(controller_check_liveness(&map, &config, later, 3, now + 2000, &out), OK);
    assert_int_equal(out.count, 1);
    apply_all(&map, &out);
    assert_int_equal(cluster_map_broker(&map, 2)->state, BROKER_STATE_DOWN);
    assert_int_equal(cluster_map_broker(&map, 1)->state, BROKER_STATE_DRAINING);
    assert_int_equal(cluster_map_broker(&map, 4)->state, BROKER_STATE_UP);
    cluster_map_free(&map);
}

static void return_and_rebalance(struct cluster_map *mp, const uint32_t *expect,
                                 const uint64_t *epochs, uint32_t unavailable);

static void test_failover_2000_queues(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 3);
    /* Some of broker 2's queues have no in-sync backup (lagging replicas). */
    uint32_t lagging = 0;
    for (uint32_t i = 0; i < map.queues_count; i++) {
        struct map_queue *q = map.queues[i];
        if (q->primary_id == 2 && i % 10 == 0) {
            struct map_cmd c;
            must_apply(&map, map_cmd_queue_set_in_sync(&c, q->vhost->name, q->name, q->epoch,
                                                       NULL, NULL, 0),
                       &c);
            lagging++;
        } else if (q->primary_id == 2 && i % 10 == 1) {
            /* Only the second backup is in sync: it is the one promoted. */
            struct map_cmd c;
            must_apply(&map, map_cmd_queue_set_in_sync(&c, q->vhost->name, q->name, q->epoch,
                                                       &q->backup_ids[1], NULL, 1),
                       &c);
        }
    }
    /* Remember what each queue looked like. */
    uint32_t owned2 = cluster_map_broker(&map, 2)->queues_owned_count;
    uint32_t held2 = cluster_map_broker(&map, 2)->backups_held_count;
    uint32_t *expect = calloc(QUEUES, sizeof(uint32_t));
    uint64_t *epochs = calloc(QUEUES, sizeof(uint64_t));
    for (uint32_t i = 0; i < QUEUES; i++) {
        const struct map_queue *q = map.queues[i];
        epochs[i] = q->epoch;
        expect[i] = q->primary_id;
        if (q->primary_id == 2) {
            expect[i] = BROKER_ID_NONE;
            for (uint8_t b = 0; b < q->backups_count && expect[i] == BROKER_ID_NONE; b++) {
                if (q->in_sync_mask & (1u << b))
                    expect[i] = q->backup_ids[b];
            }
        }
    }
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd c;
    must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_DOWN), &c);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    assert_int_equal(controller_fail_over(&map, &config, 2, &out), OK);
    uint32_t commands = out.count;
    assert_int_equal(apply_all(&map, &out), 0);
    assert_consistent(&map);
    uint32_t promoted = 0, unavailable = 0;
    for (uint32_t i = 0; i < QUEUES; i++) {
        const struct map_queue *q = map.queues[i];
        assert_false(map_queue_has_backup(q, 2));
        if (expect[i] == BROKER_ID_NONE) {
            assert_int_equal(q->primary_id, 2);
            assert_false(q->available);
            assert_int_equal(q->epoch, epochs[i]);
            unavailable++;
            continue;
        }
        assert_true(q->available);
        assert_int_equal(q->primary_id, expect[i]);
        assert_int_equal(q->backups_count, q->replication_factor - 1); /* restored */
        if (q->epoch != epochs[i]) {
            assert_int_equal(q->epoch, epochs[i] + 1);
            promoted++;
        }
    }
    assert_int_equal(unavailable, lagging);
    assert_int_equal(promoted + unavailable, owned2);
    assert_int_equal(cluster_map_broker(&map, 2)->queues_owned_count, unavailable);
    assert_int_equal(cluster_map_broker(&map, 2)->backups_held_count, 0);
    assert_int_equal(cluster_map_exchange(&map, B("/"), B("jobs"))->vhost != NULL, 1);
    assert_int_not_equal(cluster_map_exchange(&map, B("/"), B("jobs"))->owner_id, 2);
    printf("failover of broker 2 (%u primaries, %u backups): %u commands, %u promoted, "
           "%u unavailable; load now:",
           owned2, held2, commands, promoted, unavailable);
    for (uint32_t i = 0; i < map.brokers_count; i++)
        printf(" %u/%u", map.brokers[i]->queues_owned_count, map.brokers[i]->backups_held_count);
    printf(" (owned/held)\n");

    return_and_rebalance(&map, expect, epochs, unavailable);
    free(expect);
    free(epochs);
    cluster_map_free(&map);
}

/* (c) Broker 2 comes back: its queues are available again with epoch + 1,
 * and rebalance rounds give it its share again. */
static void return_and_rebalance(struct cluster_map *mp, const uint32_t *expect,
                                 const uint64_t *epochs, uint32_t unavailable)
{
    struct cluster_map map = *mp;
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd c;
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_UP), &c);
    assert_int_equal(controller_broker_returned(&map, 2, &out), OK);
    assert_int_equal(out.count, unavailable);
    assert_int_equal(apply_all(&map, &out), 0);
    for (uint32_t i = 0; i < QUEUES; i++) {
        const struct map_queue *q = map.queues[i];
        assert_true(q->available);
        if (expect[i] == BROKER_ID_NONE)
            assert_int_equal(q->epoch, epochs[i] + 1);
    }
    /* The returning broker is empty of backups: a rebalance gives it work. */
    uint32_t rounds = 0, pending = 1;
    while (rounds < 20) {
        assert_int_equal(controller_rebalance(&map, &config, UINT32_MAX, &out, &pending), OK);
        if (out.count == 0 && pending == 0)
            break;
        apply_all(&map, &out);
        brokers_catch_up_and_hand_over(&map);
        rounds++;
    }
    map_cmd_list_free(&out);
    assert_consistent(&map);
    printf("after return and %u rebalance rounds:", rounds);
    for (uint32_t i = 0; i < map.brokers_count; i++)
        printf(" %u/%u", map.brokers[i]->queues_owned_count, map.brokers[i]->backups_held_count);
    printf(" (owned/held)\n");
    assert_true(cluster_map_broker(&map, 2)->queues_owned_count > 1500);
    *mp = map;
}

/* Between rounds only some of the brokers' work is done, as when a round
 * runs every 500 ms: backups of every other queue catch up (alternating),
 * and only then may their moves hand over. */
static void brokers_make_some_progress(struct cluster_map *map, uint32_t round)
{
    struct map_cmd c;
    for (uint32_t i = round & 1; i < map->queues_count; i += 2) {
        struct map_queue *q = map->queues[i];
        if (q->in_sync_mask != (1u << q->backups_count) - 1)
            must_apply(map, map_cmd_queue_set_in_sync(&c, q->vhost->name, q->name, q->epoch,
                                                      q->backup_ids, NULL, q->backups_count),
                       &c);
        if (q->move_to != BROKER_ID_NONE && map_queue_backup_in_sync(q, q->move_to))
            must_apply(map, map_cmd_queue_hand_over(&c, q->vhost->name, q->name, q->epoch,
                                                    q->move_to),
                       &c);
    }
}

/* A sixth broker joins five holding 10,000 queues with one backup each;
 * rebalance rounds of at most CONTROLLER_REBALANCE_MOVES (128) moves each, with
 * the brokers' catch-ups and handovers only partly done between rounds, so
 * that later rounds plan afresh while earlier moves go on. It ends with
 * every broker within its share, primaries and backups, every queue with
 * exactly its one backup (nothing left over from a move the planner
 * changed its mind about), and no more primaries moved than the new
 * broker's share (+1%). */
static void test_join_rebalance_with_moves_in_flight(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 2);
    uint32_t *before = malloc(QUEUES * sizeof(uint32_t));
    assert_non_null(before);
    for (uint32_t i = 0; i < QUEUES; i++)
        before[i] = map.queues[i]->primary_id;
    join(&map, 6);
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    uint32_t rounds = 0, pending = 1, steps = 0;
    for (; rounds < 2000; rounds++) {
        assert_int_equal(controller_rebalance(&map, &config, 128, &out, &pending), OK);
        if (out.count == 0 && pending == 0)
            break;
        steps += out.count;
        apply_all(&map, &out);
        brokers_make_some_progress(&map, rounds);
    }
    assert_true(rounds < 2000);
    assert_consistent(&map);
    uint32_t moved = 0;
    for (uint32_t i = 0; i < QUEUES; i++) {
        moved += map.queues[i]->primary_id != before[i];
        assert_int_equal(map.queues[i]->backups_count, 1);
        assert_int_equal(map.queues[i]->move_to, BROKER_ID_NONE);
    }
    printf("6th broker: %u rounds of <= 128 moves, %u steps, %u primaries moved (share %u):",
           rounds, steps, moved, QUEUES / 6);
    for (uint32_t i = 0; i < map.brokers_count; i++)
        printf(" %u/%u", map.brokers[i]->queues_owned_count, map.brokers[i]->backups_held_count);
    printf(" (owned/held)\n");
    assert_true(moved <= QUEUES / 6 + QUEUES / 100);
    uint32_t lo, hi;
    placement_bounds(&config.placement, QUEUES, 6, &lo, &hi);
    for (uint32_t i = 0; i < map.brokers_count; i++) {
        assert_in_range(map.brokers[i]->queues_owned_count, lo, hi);
        assert_in_range(map.brokers[i]->backups_held_count, lo, hi);
    }
    map_cmd_list_free(&out);
    free(before);
    cluster_map_free(&map);
}

static void test_exclusive_queue_dies_with_broker(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    struct map_cmd c;
    struct map_queue_decl d = {.vhost = B("/"), .name = B("amq.gen-x"), .exclusive = true,
                               .exclusive_connection_id = 5, .primary_id = 3,
                               .replication_factor = 1};
    must_apply(&map, map_cmd_queue_declare(&c, &d, 3), &c);
    struct map_queue_decl solo = {.vhost = B("/"), .name = B("solo"), .durable = true,
                                  .primary_id = 3, .replication_factor = 1};
    must_apply(&map, map_cmd_queue_declare(&c, &solo, 3), &c);
    must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_DOWN), &c);
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    controller_fail_over(&map, &config, 3, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_null(cluster_map_queue(&map, B("/"), B("amq.gen-x")));
    assert_false(cluster_map_queue(&map, B("/"), B("solo"))->available);
    /* A second run decides nothing new. */
    controller_fail_over(&map, &config, 3, &out);
    assert_int_equal(out.count, 0);
    /* Not down: nothing. */
    controller_fail_over(&map, &config, 1, &out);
    assert_int_equal(out.count, 0);
    map_cmd_list_free(&out);
    cluster_map_free(&map);
}

/* An exclusive queue whose connection is on another broker than its
 * primary (--queue-locator others): it dies with its connection's broker,
 * and fails over like any queue when only its primary dies. */
static void test_exclusive_queue_lives_apart_from_its_connection(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 4);
    struct map_cmd c;
    struct map_queue_decl d = {.vhost = B("/"), .name = B("excl-a"), .exclusive = true,
                               .exclusive_connection_id = 5, .exclusive_owner_id = 2,
                               .primary_id = 3, .backup_ids = {4}, .backups_count = 1,
                               .replication_factor = 2};
    must_apply(&map, map_cmd_queue_declare(&c, &d, 2), &c);
    d.name = B("excl-b");
    must_apply(&map, map_cmd_queue_declare(&c, &d, 2), &c);
    /* The owner's redeclare is equivalent; another broker's, or another
     * connection's, is locked out. */
    must_apply(&map, map_cmd_queue_declare(&c, &d, 2), &c);
    struct map_change change;
    assert_int_equal(map_cmd_queue_declare(&c, &d, 3), OK);
    assert_int_equal(cluster_map_apply(&map, c.bytes, c.size, &change), E_MAP_REFUSED);
    assert_int_equal(change.reply_code, 405);
    map_cmd_free(&c);
    d.exclusive_connection_id = 6;
    assert_int_equal(map_cmd_queue_declare(&c, &d, 2), OK);
    assert_int_equal(cluster_map_apply(&map, c.bytes, c.size, &change), E_MAP_REFUSED);
    assert_int_equal(change.reply_code, 405);
    map_cmd_free(&c);
    assert_int_equal(cluster_map_queue(&map, B("/"), B("excl-a"))->exclusive_owner_id, 2);

    /* The primary dies: its in-sync backup takes over, the owner keeps it. */
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_DOWN), &c);
    controller_fail_over(&map, &config, 3, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    const struct map_queue *q = cluster_map_queue(&map, B("/"), B("excl-a"));
    assert_non_null(q);
    assert_int_equal(q->primary_id, 4);
    assert_int_equal(q->exclusive_owner_id, 2);
    /* The owner dies: both go, wherever they live. */
    must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_DOWN), &c);
    controller_fail_over(&map, &config, 2, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_null(cluster_map_queue(&map, B("/"), B("excl-a")));
    assert_null(cluster_map_queue(&map, B("/"), B("excl-b")));
    map_cmd_list_free(&out);
    cluster_map_free(&map);
}

/* The repair sweep removes an exclusive queue whose connection's broker is
 * down (a leader that died before its failover finished). */
static void test_repair_drops_exclusive_queue_of_dead_owner(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    struct map_cmd c;
    struct map_queue_decl d = {.vhost = B("/"), .name = B("excl"), .exclusive = true,
                               .exclusive_connection_id = 9, .exclusive_owner_id = 2,
                               .primary_id = 1, .replication_factor = 1};
    must_apply(&map, map_cmd_queue_declare(&c, &d, 2), &c);
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    controller_repair(&map, &config, &out);
    assert_int_equal(out.count, 0);
    must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_DOWN), &c);
    controller_repair(&map, &config, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_null(cluster_map_queue(&map, B("/"), B("excl")));
    map_cmd_list_free(&out);
    cluster_map_free(&map);
}

static void test_stale_decision_is_refused(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 2);
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd c;
    must_apply(&map, map_cmd_broker_state(&c, 4, BROKER_STATE_DOWN), &c);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    controller_fail_over(&map, &config, 4, &out);
    /* Before the batch commits, someone moves one of broker 4's queues. */
    struct map_queue *victim = NULL;
    for (uint32_t i = 0; i < map.queues_count && !victim; i++) {
        if (map.queues[i]->primary_id == 4)
            victim = map.queues[i];
    }
    assert_non_null(victim);
    uint32_t other = victim->backup_ids[0] == 1 ? 3 : 1;
    must_apply(&map, map_cmd_queue_set_owner(&c, victim->vhost->name, victim->name,
                                             victim->epoch, other),
               &c);
    uint32_t refused = apply_all(&map, &out);
    assert_true(refused >= 1);
    assert_int_equal(victim->primary_id, other);
    assert_consistent(&map);
    /* Deciding again on the new map finishes the job with no refusals. */
    controller_fail_over(&map, &config, 4, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_int_equal(cluster_map_broker(&map, 4)->backups_held_count, 0);
    printf("stale batch: %u command(s) refused with retry, redone next round\n", refused);
    cluster_map_free(&map);
}

/* A leader died halfway through a failover, and a promotion it decided is
 * refused (the primary dropped that backup from the in-sync set just
 * before): the next leader's repair sweep finishes the job, and then has
 * nothing left to do. Brokers coming back make full factors possible again. */
static void test_repair_finishes_what_was_left(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 3);
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd c;
    must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_DOWN), &c);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    controller_fail_over(&map, &config, 3, &out);
    uint32_t decided = out.count;
    /* One of broker 3's queues loses its first in-sync backup's sync. */
    struct map_queue *victim = NULL;
    for (uint32_t i = 0; i < map.queues_count && !victim; i++) {
        if (map.queues[i]->primary_id == 3)
            victim = map.queues[i];
    }
    assert_non_null(victim);
    uint32_t first = victim->backup_ids[0];
    must_apply(&map, map_cmd_queue_set_in_sync(&c, victim->vhost->name, victim->name,
                                               victim->epoch, &victim->backup_ids[1], NULL, 1),
               &c);
    /* Only the first half of the batch commits. */
    struct map_cmd_list half;
    map_cmd_list_init(&half);
    for (uint32_t i = 0; i < out.count; i++) {
        if (i < out.count / 2)
            map_cmd_list_push(&half, &out.items[i]);
        else
            map_cmd_free(&out.items[i]);
    }
    out.count = 0;
    map_cmd_list_free(&out);
    apply_all(&map, &half);
    map_cmd_list_init(&out);
    assert_int_equal(controller_repair(&map, &config, &out), OK);
    uint32_t repaired = out.count;
    assert_true(repaired > 0);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_consistent(&map);
    assert_int_equal(cluster_map_broker(&map, 3)->queues_owned_count, 0);
    assert_int_equal(cluster_map_broker(&map, 3)->backups_held_count, 0);
    assert_int_not_equal(victim->primary_id, first); /* never the one out of sync */
    for (uint32_t i = 0; i < map.queues_count; i++)
        assert_int_equal(map.queues[i]->backups_count, 2);
    map_cmd_list_init(&out);
    controller_repair(&map, &config, &out);
    assert_int_equal(out.count, 0); /* nothing left */
    /* Three of five down: only two copies possible; one back: three again. */
    must_apply(&map, map_cmd_broker_state(&c, 4, BROKER_STATE_DOWN), &c);
    must_apply(&map, map_cmd_broker_state(&c, 5, BROKER_STATE_DOWN), &c);
    controller_repair(&map, &config, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    for (uint32_t i = 0; i < map.queues_count; i++) {
        const struct map_queue *q = map.queues[i];
        assert_true(q->primary_id == 1 || q->primary_id == 2 || !q->available);
        assert_true(q->backups_count <= 1 || !q->available);
    }
    must_apply(&map, map_cmd_broker_state(&c, 5, BROKER_STATE_UP), &c);
    controller_repair(&map, &config, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    for (uint32_t i = 0; i < map.queues_count; i++) {
        const struct map_queue *q = map.queues[i];
        if (q->available)
            assert_int_equal(q->backups_count, 2);
    }
    controller_repair(&map, &config, &out);
    assert_int_equal(out.count, 0);
    printf("repair: %u decided, half committed, %u repaired\n", decided, repaired);
    cluster_map_free(&map);
}

/* A broker dead for good is forgotten: everything it had goes elsewhere
 * (promoted, or started again empty with its definition), then it leaves
 * the map. Up, suspect or unknown brokers are refused. */
static void test_forget_a_dead_broker(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    struct map_cmd c;
    struct map_queue_decl ha = {.vhost = B("/"), .name = B("ha"), .durable = true,
                                .primary_id = 3, .backup_ids = {1}, .backups_count = 1,
                                .replication_factor = 2};
    struct map_queue_decl solo = {.vhost = B("/"), .name = B("solo"), .durable = true,
                                  .primary_id = 3, .replication_factor = 1};
    struct map_queue_decl backed = {.vhost = B("/"), .name = B("backed"), .primary_id = 1,
                                    .backup_ids = {3}, .backups_count = 1,
                                    .replication_factor = 2};
    struct map_queue_decl excl = {.vhost = B("/"), .name = B("amq.gen-1"), .exclusive = true,
                                  .exclusive_connection_id = 7, .exclusive_owner_id = 3,
                                  .primary_id = 1, .replication_factor = 1};
    must_apply(&map, map_cmd_queue_declare(&c, &ha, 3), &c);
    must_apply(&map, map_cmd_queue_declare(&c, &solo, 3), &c);
    must_apply(&map, map_cmd_queue_declare(&c, &backed, 1), &c);
    must_apply(&map, map_cmd_queue_declare(&c, &excl, 3), &c);
    struct map_exchange_decl x = {.vhost = B("/"), .name = B("x3"), .type = B("fanout"),
                                  .durable = true, .owner_id = 3};
    must_apply(&map, map_cmd_exchange_declare(&c, &x), &c);
    struct map_binding_decl bind = {.vhost = B("/"), .source = B("x3"),
                                    .destination_kind = MAP_DESTINATION_QUEUE,
                                    .destination = B("solo"), .routing_key = B("")};
    must_apply(&map, map_cmd_bind(&c, &bind), &c);
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    struct controller_forget_report r;
    /* Refused: unknown, up, suspect. Nothing decided. */
    controller_forget(&map, &config, 9, &out, &r);
    assert_int_equal(r.refusal, CONTROLLER_FORGET_UNKNOWN);
    controller_forget(&map, &config, 3, &out, &r);
    assert_int_equal(r.refusal, CONTROLLER_FORGET_NOT_DOWN);
    must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_SUSPECT), &c);
    controller_forget(&map, &config, 3, &out, &r);
    assert_int_equal(r.refusal, CONTROLLER_FORGET_NOT_DOWN);
    assert_int_equal(out.count, 0);
    must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_DOWN), &c);
    uint64_t solo_epoch = cluster_map_queue(&map, B("/"), B("solo"))->epoch;
    uint64_t ha_epoch = cluster_map_queue(&map, B("/"), B("ha"))->epoch;
    controller_forget(&map, &config, 3, &out, &r);
    assert_int_equal(r.refusal, CONTROLLER_FORGET_OK);
    assert_int_equal(r.promoted, 1);
    assert_int_equal(r.emptied, 1);
    assert_int_equal(r.deleted, 1);
    assert_int_equal(r.backups_replaced, 1);
    assert_int_equal(r.exchanges_moved, 1);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_null(cluster_map_broker(&map, 3)); /* left the map */
    assert_consistent(&map);
    const struct map_queue *q = cluster_map_queue(&map, B("/"), B("ha"));
    assert_int_equal(q->primary_id, 1);
    assert_int_equal(q->epoch, ha_epoch + 1);
    assert_int_equal(q->backups_count, 1);
    assert_int_equal(q->backup_ids[0], 2);
    q = cluster_map_queue(&map, B("/"), B("solo"));
    assert_true(q->primary_id == 1 || q->primary_id == 2);
    assert_true(q->available);
    assert_int_equal(q->epoch, solo_epoch + 1); /* a new incarnation */
    const struct map_exchange *mx = cluster_map_exchange(&map, B("/"), B("x3"));
    assert_true(mx->owner_id == 1 || mx->owner_id == 2);
    assert_int_equal(mx->bindings_out_count, 1); /* its binding to solo stays */
    q = cluster_map_queue(&map, B("/"), B("backed"));
    assert_int_equal(q->backups_count, 1);
    assert_int_equal(q->backup_ids[0], 2);
    assert_null(cluster_map_queue(&map, B("/"), B("amq.gen-1")));
    /* Gone: forgetting it again is refused as unknown. */
    controller_forget(&map, &config, 3, &out, &r);
    assert_int_equal(r.refusal, CONTROLLER_FORGET_UNKNOWN);
    /* The last broker up cannot be left with nowhere to put queues. */
    must_apply(&map, map_cmd_broker_state(&c, 1, BROKER_STATE_DOWN), &c);
    must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_DOWN), &c);
    controller_forget(&map, &config, 1, &out, &r);
    assert_int_equal(r.refusal, CONTROLLER_FORGET_NO_ROOM);
    assert_int_equal(out.count, 0);
    map_cmd_list_free(&out);
    cluster_map_free(&map);
}

/* After a failover of 2,000 queues, forgetting the dead broker finds what
 * is left (its unavailable queues) and leaves a consistent map without it;
 * before any failover, it does the failover's work itself. */
static void test_forget_after_and_without_failover(void **state)
{
    (void)state;
    for (int failed_over = 0; failed_over < 2; failed_over++) {
        struct cluster_map map;
        build(&map, 2);
        struct controller_config config;
        controller_config_default(&config);
        struct map_cmd c;
        uint32_t owned = cluster_map_broker(&map, 3)->queues_owned_count;
        /* Some of its queues have no in-sync backup: they start again empty. */
        uint32_t unsynced = 0;
        for (uint32_t i = 0; i < map.queues_count && unsynced < 100; i++) {
            struct map_queue *q = map.queues[i];
            if (q->primary_id != 3)
                continue;
            must_apply(&map, map_cmd_queue_set_in_sync(&c, q->vhost->name, q->name, q->epoch,
                                                       NULL, NULL, 0), &c);
            unsynced++;
        }
        must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_DOWN), &c);
        struct map_cmd_list out;
        map_cmd_list_init(&out);
        if (failed_over) {
            controller_fail_over(&map, &config, 3, &out);
            assert_int_equal(apply_all(&map, &out), 0);
            map_cmd_list_init(&out);
        }
        struct controller_forget_report r;
        controller_forget(&map, &config, 3, &out, &r);
        assert_int_equal(r.refusal, CONTROLLER_FORGET_OK);
        assert_int_equal(r.emptied, unsynced);
        assert_int_equal(r.promoted, failed_over ? 0 : owned - unsynced);
        assert_int_equal(apply_all(&map, &out), 0);
        assert_null(cluster_map_broker(&map, 3));
        assert_consistent(&map);
        assert_int_equal(map.queues_count, QUEUES);
        for (uint32_t i = 0; i < map.queues_count; i++) {
            assert_true(map.queues[i]->available);
            assert_int_equal(map.queues[i]->backups_count, 1);
        }
        map_cmd_list_init(&out);
        controller_repair(&map, &config, &out);
        assert_int_equal(out.count, 0); /* nothing left to repair */
        map_cmd_list_free(&out);
        cluster_map_free(&map);
    }
}

static void test_drain_converges(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 2);
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    bool done = false;
    uint32_t rounds = 0, owners = 0;
    uint32_t owned5 = cluster_map_broker(&map, 5)->queues_owned_count;
    while (!done && rounds < 20) {
        assert_int_equal(controller_drain(&map, &config, 5, UINT32_MAX, &out, &done), OK);
        apply_all(&map, &out);
        owners += brokers_catch_up_and_hand_over(&map);
        rounds++;
    }
    assert_true(done);
    assert_int_equal(cluster_map_broker(&map, 5)->state, BROKER_STATE_DRAINING);
    assert_consistent(&map);
    uint32_t histogram[4] = {0};
    for (uint32_t i = 0; i < map.queues_count; i++)
        histogram[map.queues[i]->backups_count]++;
    printf("backups per queue: 0:%u 1:%u 2:%u 3:%u\n", histogram[0], histogram[1], histogram[2],
           histogram[3]);
    assert_int_equal(histogram[1], map.queues_count); /* factor restored everywhere */
    printf("drain broker 5 (%u primaries): done in %u rounds, %u handovers\n", owned5, rounds,
           owners);
    struct map_cmd c;
    must_apply(&map, map_cmd_broker_leave(&c, 5), &c);
    map_cmd_list_free(&out);
    cluster_map_free(&map);
}

/* Draining one of three brokers: every queue it is primary or backup of
 * ends on the two others with its one backup, the replacement of a backup
 * joining (and catching up) before the drained one leaves, never fewer
 * copies in sync than before. */
static void test_drain_one_of_three(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    struct map_cmd c;
    for (uint32_t i = 0; i < 30; i++) {
        char name[16];
        snprintf(name, sizeof name, "q%u", i);
        struct map_queue_decl d = {.vhost = B("/"), .name = B(name), .durable = true,
                                   .primary_id = 1 + i % 3, .backup_ids = {1 + (i + 1) % 3},
                                   .backups_count = 1, .replication_factor = 2};
        must_apply(&map, map_cmd_queue_declare(&c, &d, 1), &c);
    }
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    bool done = false;
    uint32_t rounds = 0;
    while (!done && rounds < 10) {
        assert_int_equal(controller_drain(&map, &config, 3, UINT32_MAX, &out, &done), OK);
        apply_all(&map, &out);
        for (uint32_t i = 0; i < map.queues_count; i++) {
            const struct map_queue *q = map.queues[i];
            uint32_t copies = 1 + (uint32_t)__builtin_popcount(q->in_sync_mask);
            assert_true(copies >= 2 || q->backups_count > 1); /* a copy left only in sync */
        }
        brokers_catch_up_and_hand_over(&map);
        rounds++;
    }
    assert_true(done);
    for (uint32_t i = 0; i < map.queues_count; i++) {
        const struct map_queue *q = map.queues[i];
        assert_int_not_equal(q->primary_id, 3);
        assert_int_equal(q->backups_count, 1);
        assert_int_not_equal(q->backup_ids[0], 3);
        assert_int_equal(q->move_to, BROKER_ID_NONE);
    }
    printf("drain 1 of 3 brokers (30 queues, factor 2): %u rounds\n", rounds);
    map_cmd_list_free(&out);
    cluster_map_free(&map);
}

/* A move to the queue's only backup: the old primary stays, in sync (its
 * copy is the queue), so the switch keeps the factor and the handover
 * needs no other backup. A draining old primary lets go of its copy: then
 * the handover waits until one more backup joined (the repair adds it)
 * and caught up; with no broker for it, the move goes on as it can. */
static void test_move_keeps_the_factor(void **state)
{
    (void)state;
    for (uint32_t brokers = 2; brokers <= 3; brokers++) {
        struct cluster_map map;
        small_map(&map, brokers);
        struct map_cmd c;
        struct map_queue_decl d = {.vhost = B("/"), .name = B("q"), .durable = true,
                                   .primary_id = 1, .backup_ids = {2}, .backups_count = 1,
                                   .replication_factor = 2};
        must_apply(&map, map_cmd_queue_declare(&c, &d, 1), &c);
        struct map_queue *q = map.queues[0];
        assert_int_equal(map_queue_move_state(&map, q), MAP_MOVE_NONE);
        must_apply(&map, map_cmd_queue_move(&c, B("/"), B("q"), q->epoch, 2), &c);
        assert_true(map_queue_switch_keeps_primary(&map, q));
        assert_int_equal(map_queue_move_state(&map, q), MAP_MOVE_READY);
        /* Draining, broker 1 keeps nothing. */
        must_apply(&map, map_cmd_broker_state(&c, 1, BROKER_STATE_DRAINING), &c);
        assert_false(map_queue_switch_keeps_primary(&map, q));
        if (brokers == 2) { /* (declared in sync; no broker for another copy) */
            assert_int_equal(map_queue_move_state(&map, q), MAP_MOVE_READY);
            must_apply(&map, map_cmd_queue_hand_over(&c, B("/"), B("q"), q->epoch, 2), &c);
            assert_int_equal(q->backups_count, 0);
            cluster_map_free(&map);
            continue;
        }
        assert_int_equal(map_queue_move_state(&map, q), MAP_MOVE_NEEDS_BACKUP);
        struct controller_config config;
        controller_config_default(&config);
        struct map_cmd_list out;
        map_cmd_list_init(&out);
        assert_int_equal(controller_repair(&map, &config, &out), OK);
        apply_all(&map, &out);
        assert_int_equal(q->backups_count, 2); /* one beyond the factor */
        assert_int_equal(q->backup_ids[1], 3);
        assert_int_equal(map_queue_move_state(&map, q), MAP_MOVE_CATCHING_UP);
        assert_int_equal(controller_repair(&map, &config, &out), OK);
        apply_all(&map, &out);
        assert_int_equal(q->backups_count, 2); /* nothing more while it catches up */
        uint32_t both[2] = {2, 3};
        must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("q"), q->epoch, both, NULL, 2), &c);
        assert_int_equal(map_queue_move_state(&map, q), MAP_MOVE_READY);
        must_apply(&map, map_cmd_queue_hand_over(&c, B("/"), B("q"), q->epoch, 2), &c);
        assert_int_equal(q->primary_id, 2);
        assert_int_equal(q->backups_count, 1);
        assert_true(map_queue_backup_in_sync(q, 3)); /* the factor, in sync, at once */
        map_cmd_list_free(&out);
        cluster_map_free(&map);
    }
}

/* A planned switch to the only backup keeps the old primary as a backup,
 * in sync, in the same command: the factor holds with no catch-up. With
 * the factor met without it (a move to a broker that was not a backup:
 * the copy added for it), the old primary lets go, as before. */
static void test_handover_keeps_the_old_primary_in_sync(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    struct map_cmd c;
    struct map_queue_decl d = {.vhost = B("/"), .name = B("q"), .durable = true,
                               .primary_id = 1, .backup_ids = {2, 3}, .backups_count = 2,
                               .replication_factor = 3};
    must_apply(&map, map_cmd_queue_declare(&c, &d, 1), &c);
    struct map_queue *q = map.queues[0];
    uint64_t epoch = q->epoch;
    must_apply(&map, map_cmd_queue_move(&c, B("/"), B("q"), q->epoch, 2), &c);
    assert_int_equal(map_queue_move_state(&map, q), MAP_MOVE_READY);
    must_apply(&map, map_cmd_queue_hand_over(&c, B("/"), B("q"), q->epoch, 2), &c);
    assert_int_equal(q->primary_id, 2);
    assert_int_equal(q->epoch, epoch + 1); /* the switch */
    assert_int_equal(q->backups_count, 2);
    assert_int_equal(q->backup_ids[0], 3);
    assert_int_equal(q->backup_ids[1], 1);
    assert_true(map_queue_backup_in_sync(q, 1) && map_queue_backup_in_sync(q, 3));
    /* Factor 2, a move to broker 3, not a backup: it joins beyond the
     * factor, and at the switch the old primary (2) is not needed. */
    uint32_t one[1] = {1};
    must_apply(&map, map_cmd_queue_set_factor(&c, B("/"), B("q"), q->epoch, 2, one, 1), &c);
    must_apply(&map, map_cmd_queue_move(&c, B("/"), B("q"), q->epoch, 3), &c);
    assert_int_equal(q->backups_count, 2);
    uint32_t both[2] = {1, 3};
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("q"), q->epoch, both, NULL, 2), &c);
    assert_false(map_queue_switch_keeps_primary(&map, q));
    must_apply(&map, map_cmd_queue_hand_over(&c, B("/"), B("q"), q->epoch, 3), &c);
    assert_int_equal(q->primary_id, 3);
    assert_int_equal(q->backups_count, 1);
    assert_int_equal(q->backup_ids[0], 1);
    cluster_map_free(&map);
}

/* ---- (e) replication policies ---- */

static void declare(struct cluster_map *map, const char *name, uint8_t rf, bool exclusive,
                    struct table arguments)
{
    struct map_queue_decl d = {.vhost = B("/"), .name = B(name), .durable = !exclusive,
                               .exclusive = exclusive, .arguments = arguments,
                               .exclusive_connection_id = exclusive ? 7 : 0, .primary_id = 1,
                               .replication_factor = rf};
    for (uint8_t i = 0; i + 1 < rf; i++)
        d.backup_ids[d.backups_count++] = 2u + i;
    struct map_cmd c;
    must_apply(map, map_cmd_queue_declare(&c, &d, 1), &c);
}

/* A backup move (queue.move with from): repair leaves it alone while the
 * new backup catches up, then drops the backup it replaces; the primary
 * stays. */
static void test_repair_finishes_a_backup_move(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    declare(&map, "bq", 2, false, (struct table){NULL, 0});
    struct map_queue *q = cluster_map_queue(&map, B("/"), B("bq"));
    struct map_cmd c;
    must_apply(&map, map_cmd_queue_move_backup(&c, B("/"), B("bq"), q->epoch, 2, 3), &c);
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    assert_int_equal(controller_repair(&map, &config, &out), OK);
    assert_int_equal(out.count, 0); /* still catching up */
    uint32_t both[] = {2, 3};
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("bq"), q->epoch, both, NULL, 2), &c);
    assert_int_equal(controller_repair(&map, &config, &out), OK);
    assert_int_equal(out.count, 1);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_int_equal(q->primary_id, 1);
    assert_int_equal(q->backups_count, 1);
    assert_int_equal(q->backup_ids[0], 3);
    assert_int_equal(q->move_to, BROKER_ID_NONE);
    assert_int_equal(q->move_from, BROKER_ID_NONE);
    assert_int_equal(controller_repair(&map, &config, &out), OK);
    assert_int_equal(out.count, 0);
    cluster_map_free(&map);
}

/* Runs the policy rule and applies what it says; returns the command count. */
static uint32_t policies_round(struct cluster_map *map, const struct controller_config *config)
{
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    assert_int_equal(controller_apply_policies(map, config, &out), OK);
    uint32_t n = out.count;
    assert_int_equal(apply_all(map, &out), 0);
    assert_consistent(map);
    return n;
}

static void test_policies_change_factors(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 5);
    struct map_cmd c;
    uint8_t args[64];
    struct table_writer w;
    table_writer_init(&w, args, sizeof args);
    table_put_int(&w, "x-quay-backups", 0);
    struct table none = {(const uint8_t *)"", 0};
    declare(&map, "ha.a", 2, false, none);
    declare(&map, "ha.own", 1, false, table_writer_table(&w));
    declare(&map, "ha.excl", 1, true, none);
    declare(&map, "plain", 2, false, none);
    struct controller_config config;
    controller_config_default(&config);
    assert_int_equal(config.default_backups, 1);
    /* Nothing to do while every factor is the default's. */
    assert_int_equal(policies_round(&map, &config), 0);
    struct policy_decl ha = {B("/"), B("ha"), B("^ha\\."), 0, 2, 0};
    must_apply(&map, map_cmd_policy_put(&c, &ha), &c);
    assert_int_equal(policies_round(&map, &config), 1);
    const struct map_queue *a = cluster_map_queue(&map, B("/"), B("ha.a"));
    assert_int_equal(a->replication_factor, 3);
    assert_int_equal(a->backups_count, 2);
    assert_int_equal(a->backup_ids[0], 2); /* the existing backup stays */
    assert_int_equal(cluster_map_queue(&map, B("/"), B("ha.own"))->replication_factor, 1);
    assert_int_equal(cluster_map_queue(&map, B("/"), B("ha.excl"))->replication_factor, 1);
    assert_int_equal(cluster_map_queue(&map, B("/"), B("plain"))->replication_factor, 2);
    assert_int_equal(policies_round(&map, &config), 0); /* converged */
    /* Fewer backups keep the in-sync ones: mark only the second in sync. */
    uint32_t second[] = {a->backup_ids[1]};
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("ha.a"), a->epoch, second, NULL, 1), &c);
    ha.backups = 1;
    must_apply(&map, map_cmd_policy_put(&c, &ha), &c);
    assert_int_equal(policies_round(&map, &config), 1);
    assert_int_equal(a->replication_factor, 2);
    assert_int_equal(a->backups_count, 1);
    assert_int_equal(a->backup_ids[0], second[0]);
    assert_int_equal(a->in_sync_mask, 0x1);
    ha.backups = 0;
    must_apply(&map, map_cmd_policy_put(&c, &ha), &c);
    assert_int_equal(policies_round(&map, &config), 1);
    assert_int_equal(a->replication_factor, 1);
    assert_int_equal(a->backups_count, 0);
    /* Deleting the policy brings the default back. */
    must_apply(&map, map_cmd_policy_delete(&c, B("/"), B("ha")), &c);
    assert_int_equal(policies_round(&map, &config), 1);
    assert_int_equal(a->replication_factor, 2);
    assert_int_equal(a->backups_count, 1);
    /* A decision made on an older epoch is refused and made again. */
    must_apply(&map, map_cmd_policy_put(&c, &ha), &c);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    controller_apply_policies(&map, &config, &out);
    assert_int_equal(out.count, 1);
    uint32_t caught_up[] = {a->backup_ids[0]}; /* only an in-sync backup can be promoted */
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("ha.a"), a->epoch, caught_up, NULL, 1),
               &c);
    must_apply(&map, map_cmd_queue_set_owner(&c, B("/"), B("ha.a"), a->epoch, a->backup_ids[0]),
               &c);
    struct map_change change;
    assert_int_equal(cluster_map_apply(&map, out.items[0].bytes, out.items[0].size, &change),
                     E_MAP_REFUSED);
    assert_true(change.retry);
    map_cmd_list_free(&out);
    assert_int_equal(policies_round(&map, &config), 1);
    assert_int_equal(a->replication_factor, 1);
    cluster_map_free(&map);
}

static void storage(struct cluster_map *map, uint32_t id, const char *storage_id)
{
    struct map_cmd c;
    must_apply(map, map_cmd_broker_storage(&c, id, B(storage_id)), &c);
}

static void declare_at(struct cluster_map *map, const char *name, bool durable, uint32_t primary,
                       uint32_t backup, uint8_t rf)
{
    struct map_queue_decl d = {.vhost = B("/"), .name = B(name), .durable = durable,
                               .primary_id = primary, .replication_factor = rf};
    if (backup != BROKER_ID_NONE)
        d.backup_ids[d.backups_count++] = backup;
    struct map_cmd c;
    must_apply(map, map_cmd_queue_declare(&c, &d, primary), &c);
}

/* Takeover from shared storage (controller_takeover_target): a dead
 * broker's durable queues without an in-sync backup go to live brokers
 * sharing its storage, spread by the ring, never to one of their backups;
 * in-sync backups are still promoted; transient queues, and queues whose
 * storage nobody alive shares, stay unavailable until repair finds a
 * broker that shares it. */
static void test_takeover_from_shared_storage(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 5);
    storage(&map, 1, "s");
    storage(&map, 2, "s");
    storage(&map, 3, "s");
    storage(&map, 4, "t"); /* 5: none */
    struct map_cmd c;
    char name[32];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "log.%d", i);
        declare_at(&map, name, true, 1, BROKER_ID_NONE, 1);
    }
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "mirrored.%d", i);
        declare_at(&map, name, true, 1, 2, 2);
        const struct map_queue *q = cluster_map_queue(&map, B("/"), B(name));
        must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B(name), q->epoch,
                                                   q->backup_ids, NULL, 1), &c);
    }
    declare_at(&map, "behind", true, 1, 3, 2);
    uint64_t behind_epoch = cluster_map_queue(&map, B("/"), B("behind"))->epoch;
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("behind"), behind_epoch, NULL, NULL, 0),
               &c); /* 3 out of sync */
    declare_at(&map, "transient", false, 1, BROKER_ID_NONE, 1);
    declare_at(&map, "lonely", true, 4, BROKER_ID_NONE, 1);
    struct controller_config config;
    controller_config_default(&config);
    struct placement p;
    placement_init(&p, &config.placement);
    placement_refresh(&p, &map);
    assert_int_equal(controller_takeover_target(&p, cluster_map_queue(&map, B("/"), B("log.0"))),
                     BROKER_ID_NONE); /* its primary is up */
    placement_free(&p);
    must_apply(&map, map_cmd_broker_state(&c, 1, BROKER_STATE_DOWN), &c);
    must_apply(&map, map_cmd_broker_state(&c, 4, BROKER_STATE_DOWN), &c);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    controller_fail_over(&map, &config, 1, &out);
    controller_fail_over(&map, &config, 4, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_consistent(&map);
    uint32_t on[6] = {0};
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "log.%d", i);
        const struct map_queue *q = cluster_map_queue(&map, B("/"), B(name));
        assert_true(q->primary_id == 2 || q->primary_id == 3);
        assert_int_equal(q->taken_from, 1);
        assert_true(q->available);
        on[q->primary_id]++;
    }
    /* Spread by the ring, within the placement bound. */
    assert_true(on[2] >= 100 && on[3] >= 100);
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "mirrored.%d", i);
        const struct map_queue *q = cluster_map_queue(&map, B("/"), B(name));
        assert_int_equal(q->primary_id, 2); /* promoted, as without shared storage */
        assert_int_equal(q->taken_from, BROKER_ID_NONE);
    }
    const struct map_queue *behind = cluster_map_queue(&map, B("/"), B("behind"));
    assert_int_equal(behind->primary_id, 2); /* not 3: its replica would double the log */
    assert_int_equal(behind->taken_from, 1);
    assert_int_equal(behind->backups_count, 1); /* the factor, refilled */
    assert_int_not_equal(behind->backup_ids[0], 2);
    const struct map_queue *transient = cluster_map_queue(&map, B("/"), B("transient"));
    assert_false(transient->available);
    assert_int_equal(transient->primary_id, 1);
    const struct map_queue *lonely = cluster_map_queue(&map, B("/"), B("lonely"));
    assert_false(lonely->available);
    map_cmd_list_init(&out);
    controller_repair(&map, &config, &out);
    assert_int_equal(out.count, 0); /* decided once */
    /* A broker sharing broker 4's storage joins: repair takes "lonely" over. */
    join(&map, 6);
    storage(&map, 6, "t");
    controller_repair(&map, &config, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_int_equal(lonely->primary_id, 6);
    assert_int_equal(lonely->taken_from, 4);
    assert_true(lonely->available);
    cluster_map_free(&map);
}

/* Four brokers, 1-3 on storage "s", 4 on "t"; on primary 1, each with one
 * backup in sync: "tonly" (x-quay-replicate "transient", backup 2),
 * "tonly-elsewhere" (the same, backup 4) and "all" (backup 2). */
static const char *const three_names[] = {"tonly", "tonly-elsewhere", "all"};
static const uint32_t three_backups[] = {2, 4, 2};

static void three_transient_only_queues(struct cluster_map *map)
{
    small_map(map, 4);
    storage(map, 1, "s");
    storage(map, 2, "s");
    storage(map, 3, "s");
    storage(map, 4, "t");
    uint8_t buf[64];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    table_put_longstr(&w, "x-quay-replicate", B("transient"));
    struct table transient_only = table_writer_table(&w);
    struct map_cmd c;
    for (int i = 0; i < 3; i++) {
        struct map_queue_decl d = {.vhost = B("/"), .name = B(three_names[i]), .durable = true,
                                   .primary_id = 1, .replication_factor = 2,
                                   .arguments = i < 2 ? transient_only : (struct table){0}};
        d.backup_ids[d.backups_count++] = three_backups[i];
        must_apply(map, map_cmd_queue_declare(&c, &d, 1), &c);
        const struct map_queue *q = cluster_map_queue(map, B("/"), B(three_names[i]));
        must_apply(map, map_cmd_queue_set_in_sync(&c, B("/"), B(three_names[i]), q->epoch,
                                                  q->backup_ids, NULL, 1), &c);
    }
}

/* x-quay-replicate "transient" (controller_takes_over_with_replica): the
 * dead primary's in-sync backup takes the queue over keeping its replica
 * (queue.take_over with replica: it merges its transient messages with
 * the log) when it shares the storage, and is promoted as usual when it
 * does not (the primary sent it everything); a queue without the argument
 * is promoted as usual. The factor is refilled after either. */
static void test_transient_only_queue_taken_over_by_its_backup(void **state)
{
    (void)state;
    struct cluster_map map;
    three_transient_only_queues(&map);
    struct map_cmd c;
    const struct map_queue *tonly = cluster_map_queue(&map, B("/"), B("tonly"));
    assert_false(controller_takes_over_with_replica(&map, tonly, 2)); /* 1 is up */
    must_apply(&map, map_cmd_broker_state(&c, 1, BROKER_STATE_DOWN), &c);
    assert_true(controller_takes_over_with_replica(&map, tonly, 2));
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    controller_fail_over(&map, &config, 1, &out);
    assert_int_equal(apply_all(&map, &out), 0);
    assert_consistent(&map);
    assert_int_equal(tonly->primary_id, 2);
    assert_int_equal(tonly->taken_from, 1);
    assert_false(tonly->adopted);
    assert_int_equal(tonly->backups_count, 1); /* refilled */
    assert_int_not_equal(tonly->backup_ids[0], 2);
    const struct map_queue *elsewhere = cluster_map_queue(&map, B("/"), B("tonly-elsewhere"));
    assert_int_equal(elsewhere->primary_id, 4);
    assert_int_equal(elsewhere->taken_from, BROKER_ID_NONE);
    const struct map_queue *all = cluster_map_queue(&map, B("/"), B("all"));
    assert_int_equal(all->primary_id, 2);
    assert_int_equal(all->taken_from, BROKER_ID_NONE);
    cluster_map_free(&map);
}

static void must_refuse(struct cluster_map *map, int build_rc, struct map_cmd *cmd)
{
    assert_int_equal(build_rc, OK);
    struct map_change change;
    assert_int_equal(cluster_map_apply(map, cmd->bytes, cmd->size, &change), E_MAP_REFUSED);
    assert_int_equal(change.reply_code, 406);
    map_cmd_free(cmd);
}

/* A primary restarted before the map saw it down, of a queue that
 * replicates only its transient messages: its in-sync backup that shares
 * its storage takes the queue over with its replica and the restarted
 * broker's log (controller_restart_with_log; queue.take_over with
 * "restarted", the only way the map lets a take-over come from a broker
 * that is not down); one that does not share the storage holds everything
 * and gets a plain hand-off, as a queue without the argument does. */
static void test_restarted_transient_only_queue_handed_with_its_log(void **state)
{
    (void)state;
    struct cluster_map map;
    three_transient_only_queues(&map);
    struct map_cmd c;
    for (uint32_t id = 1; id <= 4; id++)
        must_apply(&map, map_cmd_broker_incarnation(&c, id, 100 + id), &c);
    const char *const *names = three_names;
    const uint32_t *backups = three_backups;
    const bool with_log[] = {true, false, false};
    struct controller_heard heard[4];
    for (uint32_t id = 1; id <= 4; id++)
        heard[id - 1] = (struct controller_heard){.broker_id = id, .incarnation = 100 + id};
    for (int i = 0; i < 3; i++) {
        const struct map_queue *q = cluster_map_queue(&map, B("/"), B(names[i]));
        /* Out of sync: nobody takes it (the map refuses the take-over). */
        must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B(names[i]), q->epoch, NULL,
                                                   NULL, 0), &c);
        must_refuse(&map, map_cmd_queue_hand_to_backup_with_log(&c, B("/"), B(names[i]),
                                                                q->epoch, backups[i], 1), &c);
        must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B(names[i]), q->epoch,
                                                   q->backup_ids, NULL, 1), &c);
        bool wait;
        assert_int_equal(controller_restart_successor(&map, q, heard, 4, UINT64_MAX, &wait),
                         backups[i]);
        assert_int_equal(controller_restart_with_log(&map, q, backups[i]), with_log[i]);
    }
    /* The controller's take-over with the replica needs 1 down; asked by
     * the restarted 1 itself, it applies while 1 is up. */
    const struct map_queue *q = cluster_map_queue(&map, B("/"), B("tonly"));
    must_refuse(&map, map_cmd_queue_take_over_with_replica(&c, B("/"), B("tonly"), q->epoch, 2, 1),
                &c);
    must_apply(&map, map_cmd_queue_hand_to_backup_with_log(&c, B("/"), B("tonly"), q->epoch, 2, 1),
               &c);
    assert_consistent(&map);
    q = cluster_map_queue(&map, B("/"), B("tonly"));
    assert_int_equal(q->primary_id, 2);
    assert_int_equal(q->taken_from, 1);
    assert_false(q->adopted);
    assert_int_equal(q->backups_count, 0); /* (refilled by the repair) */
    /* Another hand-off of the same epoch is refused: it moved on. */
    struct map_change change;
    assert_int_equal(map_cmd_queue_hand_to_backup_with_log(&c, B("/"), B("tonly"), q->epoch - 1,
                                                           2, 1), OK);
    assert_int_equal(cluster_map_apply(&map, c.bytes, c.size, &change), E_MAP_REFUSED);
    map_cmd_free(&c);
    cluster_map_free(&map);
}

/* A set_in_sync naming a backup that holds the transient messages only
 * ("partial"), asked before a policy change made the queue replicate
 * everything and applied after it, is refused: that backup would be in
 * sync again without the persistent messages. Asked while the queue
 * replicates transient messages only, it applies; a full set applies
 * either way. */
static void test_partial_in_sync_refused_once_everything_replicates(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    struct map_cmd c;
    struct policy_decl p = {.vhost = B("/"), .name = B("tonly"), .pattern = B("^t"),
                            .backups = 1, .replicate = POLICY_REPLICATE_TRANSIENT};
    must_apply(&map, map_cmd_policy_put(&c, &p), &c);
    declare_at(&map, "tq", true, 1, 2, 2);
    const struct map_queue *q = cluster_map_queue(&map, B("/"), B("tq"));
    assert_true(map_queue_replicates_transient_only(&map, q));
    uint32_t two[] = {2};
    must_apply(&map, map_cmd_queue_set_in_sync_partial(&c, B("/"), B("tq"), q->epoch, two, NULL,
                                                       1), &c);
    assert_int_equal(q->in_sync_mask, 1);
    /* The policy goes: 2 leaves the set at once (partial_drop). */
    must_apply(&map, map_cmd_policy_delete(&c, B("/"), B("tonly")), &c);
    assert_false(map_queue_replicates_transient_only(&map, q));
    assert_int_equal(q->in_sync_mask, 0);
    struct map_change change;
    assert_int_equal(map_cmd_queue_set_in_sync_partial(&c, B("/"), B("tq"), q->epoch, two, NULL,
                                                       1), OK);
    assert_int_equal(cluster_map_apply(&map, c.bytes, c.size, &change), E_MAP_REFUSED);
    assert_int_equal(change.reply_code, 406);
    map_cmd_free(&c);
    assert_int_equal(q->in_sync_mask, 0);
    /* Caught up in full, the primary asks again without "partial". */
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("tq"), q->epoch, two, NULL, 1), &c);
    assert_int_equal(q->in_sync_mask, 1);
    cluster_map_free(&map);
}

/* A taker says queue.adopted once its copy is synced, never if its
 * journal failed or the queue is no longer its own (a takeover from it
 * then reads the log it took the queue from as well). */
static void test_adopted_said_once_synced(void **state)
{
    (void)state;
    assert_int_equal(adoption_say_when(0, 0, false, true), ADOPTION_SAY_NOW); /* nothing copied */
    assert_int_equal(adoption_say_when(42, 41, false, true), ADOPTION_SAY_WAIT);
    assert_int_equal(adoption_say_when(42, 42, false, true), ADOPTION_SAY_NOW);
    assert_int_equal(adoption_say_when(42, 90, false, true), ADOPTION_SAY_NOW);
    assert_int_equal(adoption_say_when(42, 41, true, true), ADOPTION_SAY_NEVER);
    assert_int_equal(adoption_say_when(42, 90, true, true), ADOPTION_SAY_NEVER);
    assert_int_equal(adoption_say_when(42, 41, false, false), ADOPTION_SAY_NEVER);
    assert_int_equal(adoption_say_when(0, 0, false, false), ADOPTION_SAY_NEVER);
}

/* After a restart: which queues resume an adoption of ours, and which of
 * the logs we had staged someone may still read. */
static void test_leftover_adoptions_and_staged_copies(void **state)
{
    (void)state;
    struct map_queue q;
    memset(&q, 0, sizeof q);
    q.primary_id = 1;
    q.taken_from = 2;
    q.taken_from_before = BROKER_ID_NONE;
    assert_true(adoption_leftover(&q, 1));    /* ours, never said adopted */
    assert_false(adoption_leftover(&q, 3));
    assert_true(adoption_staged_needed(&q, 1));  /* we read it */
    assert_true(adoption_staged_needed(&q, 2));  /* our taker claims it */
    assert_false(adoption_staged_needed(&q, 3));
    q.taken_from_before = 3;
    assert_true(adoption_staged_needed(&q, 3));
    assert_false(adoption_staged_needed(&q, 5));
    q.taken_older[0] = 4; /* further down a chain of dead takers */
    q.taken_older[1] = 5;
    q.taken_older_count = 2;
    assert_true(adoption_staged_needed(&q, 5));
    q.adopted = true; /* our copy was synced: everything is in a log someone reads */
    assert_false(adoption_leftover(&q, 1));
    assert_false(adoption_staged_needed(&q, 1));
    assert_false(adoption_staged_needed(&q, 2));
    q.adopted = false;
    q.taken_from = BROKER_ID_NONE; /* moved or failed over since: no takeover */
    q.taken_from_before = BROKER_ID_NONE;
    assert_false(adoption_leftover(&q, 1));
    assert_false(adoption_staged_needed(&q, 1));
    assert_false(adoption_staged_needed(NULL, 1)); /* deleted */
}

/* The leader's tick (node.c and the simulator run it): liveness first, one
 * command per broker and whose it is; the round is busy while a state is
 * proposed; a state in flight holds liveness back; the follow-up of a
 * committed state is the failover; policies once per change. */
/* What a round plans for queue q: its set_backups, if any (NULL). */
static const struct map_cmd *set_backups_of(const struct map_cmd_list *out)
{
    for (uint32_t i = 0; i < out->count; i++) {
        if (memmem(out->items[i].bytes, out->items[i].size, "queue.set_backups", 17) != NULL)
            return &out->items[i];
    }
    return NULL;
}

/* A queue without backups moved: the switch keeps the old primary, in
 * sync, beyond the factor, so that a target that dies as the switch
 * commits does not take the queue's only copy with it (tests/sim --strict
 * seeds 617, 2975, 3799); the round (its repair, whatever the rebalance
 * mode) releases it only once the new primary's heartbeats say it applied
 * the switch. */
static void test_a_switch_without_backups_keeps_the_old_primary_until_applied(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    struct map_cmd c;
    must_apply(&map, map_cmd_rebalance(&c, MAP_REBALANCE_OFF), &c);
    struct map_queue_decl d = {.vhost = B("/"), .name = B("q"), .durable = true,
                               .primary_id = 1, .replication_factor = 1};
    must_apply(&map, map_cmd_queue_declare(&c, &d, 1), &c);
    struct map_queue *q = map.queues[0];
    must_apply(&map, map_cmd_queue_move(&c, B("/"), B("q"), q->epoch, 2), &c);
    uint32_t two[1] = {2};
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("q"), q->epoch, two, NULL, 1), &c);
    assert_true(map_queue_switch_keeps_primary(&map, q));
    must_apply(&map, map_cmd_queue_hand_over(&c, B("/"), B("q"), q->epoch, 2), &c);
    assert_int_equal(q->primary_id, 2);
    assert_int_equal(q->backups_count, 1);
    assert_true(map_queue_backup_in_sync(q, 1));
    /* The new primary's heartbeats still name a map from before. */
    struct controller_heard heard[3];
    for (uint32_t i = 0; i < 3; i++)
        heard[i] = (struct controller_heard){.broker_id = i + 1, .last_heard_ms = 10000,
                                             .map_version = (uint32_t)map.version};
    heard[1].map_version = (uint32_t)q->owned_since - 1;
    struct controller_observed seen = {.heard = heard, .heard_count = 3};
    struct controller_config config;
    controller_config_default(&config);
    struct controller_round round;
    memset(&round, 0, sizeof round);
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    enum controller_round_kind kind;
    uint32_t pending = 0;
    uint64_t now = 10000;
    for (int i = 0; i < 3; i++, now += CONTROLLER_REBALANCE_SETTLE_MS) {
        controller_round(&map, &config, &round, &seen, now, false, &out, &kind, &pending);
        assert_null(set_backups_of(&out)); /* kept */
    }
    /* Applied: released. */
    heard[1].map_version = (uint32_t)q->owned_since;
    controller_round(&map, &config, &round, &seen, now, false, &out, &kind, &pending);
    assert_non_null(set_backups_of(&out));
    assert_int_equal(apply_all(&map, &out), 0);
    assert_int_equal(q->backups_count, 0);
    map_cmd_list_free(&out);
    cluster_map_free(&map);
}

static void test_leader_tick(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 3);
    struct table none = {(const uint8_t *)"", 0};
    declare(&map, "plain", 2, false, none);
    const struct map_queue *q = cluster_map_queue(&map, B("/"), B("plain"));
    uint32_t dead = q->primary_id;
    struct controller_config config;
    controller_config_default(&config);
    struct controller_leader leader;
    memset(&leader, 0, sizeof leader);
    controller_leader_start(&leader, 1000);
    struct controller_heard heard[3];
    for (uint32_t i = 0; i < 3; i++)
        heard[i] = (struct controller_heard){.broker_id = i + 1,
                                             .last_heard_ms = i + 1 == dead ? 1000 : 3500};
    struct controller_observed seen = {.heard = heard, .heard_count = 3};
    struct controller_actions a;
    controller_actions_init(&a);
    assert_int_equal(controller_leader_tick(&map, &config, &leader, &seen, 3500, &a), OK);
    assert_int_equal(a.states.count, 1);
    assert_int_equal(a.state_ids[0], dead);
    assert_int_equal(a.round.count, 0); /* busy: the state goes first */
    assert_int_equal(a.round_kind, CONTROLLER_ROUND_NOTHING);
    assert_int_equal(a.policies.count, 0); /* the default's factor already */
    assert_false(leader.policies_recheck);
    struct map_cmd_list states = a.states;
    map_cmd_list_init(&a.states);
    assert_int_equal(apply_all(&map, &states), 0);
    controller_actions_free(&a);
    /* A state in flight: no liveness, and the round waits too. */
    controller_actions_init(&a);
    seen.liveness_in_flight = seen.proposals_in_flight = 1;
    heard[dead - 1].last_heard_ms = 3600; /* back: liveness would say up */
    controller_leader_tick(&map, &config, &leader, &seen, 3600, &a);
    assert_int_equal(a.states.count + a.round.count + a.policies.count, 0);
    controller_actions_free(&a);
    /* The state committed: its follow-up is the failover. */
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    assert_int_equal(controller_after_state(&map, &config, dead, &out), OK);
    assert_true(out.count > 0);
    assert_int_equal(apply_all(&map, &out), 0);
    q = cluster_map_queue(&map, B("/"), B("plain"));
    assert_int_not_equal(q->primary_id, dead);
    /* Nothing in flight, the broker heard again: it comes back up. */
    controller_actions_init(&a);
    seen.liveness_in_flight = seen.proposals_in_flight = 0;
    controller_leader_tick(&map, &config, &leader, &seen, 3700, &a);
    assert_int_equal(a.states.count, 1);
    assert_int_equal(a.state_ids[0], dead);
    controller_actions_free(&a);
    /* A policy: the next tick changes the factor, once. */
    struct map_cmd c;
    struct policy_decl ha = {B("/"), B("all"), B(".*"), 0, 2, 0};
    must_apply(&map, map_cmd_policy_put(&c, &ha), &c);
    controller_actions_init(&a);
    seen.liveness_in_flight = 1; /* (no states: only the policies are looked at) */
    controller_leader_tick(&map, &config, &leader, &seen, 3800, &a);
    assert_int_equal(a.policies.count, 1);
    assert_true(leader.policies_recheck);
    controller_actions_free(&a);
    controller_actions_init(&a);
    seen.policy_in_flight = 1;
    controller_leader_tick(&map, &config, &leader, &seen, 3900, &a);
    assert_int_equal(a.policies.count, 0); /* its batch is in flight */
    controller_actions_free(&a);
    cluster_map_free(&map);
}

/* A backup that restarted while no leader could see it go (tests/sim seed
 * 192: its primary, cut off, could not get it dropped) is still in sync in
 * the map, with the replica its restart emptied. Its new incarnation is
 * decided first and alone, before any broker.state: the primary's death
 * then fails the queue over to the other in-sync backup, never to it, and
 * with no other one the queue waits unavailable rather than served
 * empty. */
static void test_restart_leaves_in_sync_before_any_failover(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 4);
    struct table none = {(const uint8_t *)"", 0};
    declare(&map, "three", 3, false, none); /* 1, backups 2 and 3 */
    declare(&map, "two", 2, false, none);   /* 1, backup 2 */
    struct map_cmd c;
    for (uint32_t id = 1; id <= 4; id++)
        must_apply(&map, map_cmd_broker_incarnation(&c, id, 100 + id), &c);
    uint32_t all[] = {2, 3}, two[] = {2};
    const struct map_queue *q3 = cluster_map_queue(&map, B("/"), B("three"));
    const struct map_queue *q2 = cluster_map_queue(&map, B("/"), B("two"));
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("three"), q3->epoch, all, NULL, 2), &c);
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("two"), q2->epoch, two, NULL, 1), &c);
    struct controller_config config;
    controller_config_default(&config);
    struct controller_leader leader;
    memset(&leader, 0, sizeof leader);
    controller_leader_start(&leader, 1000);
    /* 1 silent for 2 s (down due), 2 heard with a new process. */
    struct controller_heard heard[4];
    for (uint32_t i = 0; i < 4; i++)
        heard[i] = (struct controller_heard){.broker_id = i + 1, .last_heard_ms = 3500,
                                             .incarnation = 101 + i};
    heard[0].last_heard_ms = 1000;
    heard[1].incarnation = 202;
    struct controller_observed seen = {.heard = heard, .heard_count = 4};
    struct controller_actions a;
    controller_actions_init(&a);
    assert_int_equal(controller_leader_tick(&map, &config, &leader, &seen, 3500, &a), OK);
    assert_int_equal(a.states.count, 1); /* the restart alone: 1's down waits for it */
    assert_int_equal(a.state_ids[0], 2);
    assert_int_equal(a.round.count, 0);
    struct map_cmd_list states = a.states;
    map_cmd_list_init(&a.states);
    assert_int_equal(apply_all(&map, &states), 0);
    controller_actions_free(&a);
    assert_int_equal(cluster_map_broker(&map, 2)->incarnation, 202);
    assert_false(map_queue_backup_in_sync(q3, 2));
    assert_true(map_queue_backup_in_sync(q3, 3));
    assert_int_equal(q2->in_sync_mask, 0);
    /* Committed (its follow-up finds 2 up: nothing to fail over). Next:
     * 1 goes down, and its failover promotes 3, not 2. */
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    controller_after_state(&map, &config, 2, &out);
    apply_all(&map, &out);
    controller_actions_init(&a);
    controller_leader_tick(&map, &config, &leader, &seen, 3550, &a);
    assert_int_equal(a.states.count, 1);
    assert_int_equal(a.state_ids[0], 1);
    states = a.states;
    map_cmd_list_init(&a.states);
    assert_int_equal(apply_all(&map, &states), 0);
    controller_actions_free(&a);
    map_cmd_list_init(&out);
    assert_int_equal(controller_after_state(&map, &config, 1, &out), OK);
    apply_all(&map, &out);
    q3 = cluster_map_queue(&map, B("/"), B("three"));
    q2 = cluster_map_queue(&map, B("/"), B("two"));
    assert_int_equal(q3->primary_id, 3);
    assert_true(q3->available);
    assert_int_equal(q2->primary_id, 1); /* nothing in sync to promote: it waits for 1 */
    assert_false(q2->available);
    /* Heard again with the incarnation the map has: nothing more. */
    controller_actions_init(&a);
    heard[0].last_heard_ms = 3600;
    controller_leader_liveness(&map, &config, &seen, 3600, &a);
    for (uint32_t i = 0; i < a.states.count; i++)
        assert_int_equal(a.state_ids[i], 1); /* (1 comes back up) */
    controller_actions_free(&a);
    cluster_map_free(&map);
}

/* A primary restarted before the map saw it down hands each queue to an
 * in-sync backup that is up and is the process the map knows (its heard
 * incarnation the map's), the first in the queue's order; none (not in
 * sync, suspect, not heard, heard as a new process, an exclusive
 * queue): it serves the queue itself. */
static void test_restart_successor(void **state)
{
    (void)state;
    struct cluster_map map;
    small_map(&map, 4);
    struct table none = {(const uint8_t *)"", 0};
    declare(&map, "three", 3, false, none); /* 1, backups 2 and 3 */
    struct map_cmd c;
    for (uint32_t id = 1; id <= 4; id++)
        must_apply(&map, map_cmd_broker_incarnation(&c, id, 100 + id), &c);
    const struct map_queue *q = cluster_map_queue(&map, B("/"), B("three"));
    assert_int_equal(q->primary_id, 1);
    struct controller_heard heard[2] = {{.broker_id = 2, .incarnation = 102},
                                        {.broker_id = 3, .incarnation = 103}};
    /* Nothing in sync. */
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("three"), q->epoch, NULL, NULL, 0),
               &c);
    q = cluster_map_queue(&map, B("/"), B("three"));
    assert_int_equal(q->in_sync_mask, 0);
    bool wait;
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, UINT64_MAX, &wait), BROKER_ID_NONE);
    assert_false(wait); /* (nobody to wait for) */
    uint32_t both[] = {2, 3};
    must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("three"), q->epoch, both, NULL, 2),
               &c);
    q = cluster_map_queue(&map, B("/"), B("three"));
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, UINT64_MAX, &wait), 2);
    /* 2 heard as a new process (its replica gone): 3. */
    heard[0].incarnation = 202;
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, UINT64_MAX, &wait), 3);
    /* 3 not heard at all: none yet, and 3 is worth waiting for; 2, a new
     * process, is not. */
    assert_int_equal(controller_restart_successor(&map, q, heard, 1, UINT64_MAX, &wait), BROKER_ID_NONE);
    assert_true(wait);
    heard[1].incarnation = 0; /* (heard of, no heartbeat with an incarnation yet) */
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, UINT64_MAX, &wait), BROKER_ID_NONE);
    assert_true(wait);
    heard[1].incarnation = 203;
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, UINT64_MAX, &wait), BROKER_ID_NONE);
    assert_false(wait); /* (both new processes: serve) */
    heard[1].incarnation = 103;
    /* Given to the present process (the map named it before the queue was
     * ours): it holds all of it. */
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, q->owned_since, &wait),
                     BROKER_ID_NONE);
    assert_false(wait);
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, q->owned_since + 1, &wait),
                     3);
    /* 2 the process the map knows, but suspect: 3. */
    heard[0].incarnation = 102;
    must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_SUSPECT), &c);
    q = cluster_map_queue(&map, B("/"), B("three"));
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, UINT64_MAX, &wait), 3);
    must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_SUSPECT), &c);
    q = cluster_map_queue(&map, B("/"), B("three"));
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, UINT64_MAX, &wait), BROKER_ID_NONE);
    assert_true(wait); /* (a suspect one is up or down soon) */
    must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_DOWN), &c);
    must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_DOWN), &c);
    q = cluster_map_queue(&map, B("/"), B("three"));
    assert_int_equal(controller_restart_successor(&map, q, heard, 2, UINT64_MAX, &wait),
                     BROKER_ID_NONE);
    assert_false(wait); /* (down: nothing to wait for) */
    /* None takes it: a durable queue serves what its journal recovered. */
    assert_false(controller_restart_drops(q, 1, q->owned_since));
    cluster_map_free(&map);
    small_map(&map, 2);
    declare_at(&map, "gone", false, 1, BROKER_ID_NONE, 1); /* non-durable, on 1 */
    q = cluster_map_queue(&map, B("/"), B("gone"));
    assert_false(q->durable);
    assert_true(controller_restart_drops(q, 1, q->owned_since)); /* ours before the restart */
    assert_false(controller_restart_drops(q, 1, q->owned_since - 1)); /* given us since */
    assert_false(controller_restart_drops(q, 2, q->owned_since)); /* not ours */
    cluster_map_free(&map);
}

/* A primary down while its only in-sync backup is suspect (silent, not yet
 * down): the promotion waits, the queue stays available with its primary,
 * until the backup is heard again (promoted) or is down too (the queue is
 * unavailable, back with its primary, which held everything: it may only
 * have been cut off from the leader). Forgetting the primary promotes the
 * suspect backup at once (nothing better will come). Seed 2266 of the
 * simulator: the backup had died, was promoted, and came back empty. */
static void test_promotion_waits_for_a_suspect_backup(void **state)
{
    (void)state;
    struct controller_config config;
    controller_config_default(&config);
    struct map_cmd c;
    struct map_cmd_list out;
    map_cmd_list_init(&out);
    uint32_t two[] = {2};
    for (int ending = 0; ending < 3; ending++) {
        struct cluster_map map;
        small_map(&map, 4);
        declare(&map, "t", 2, false, (struct table){NULL, 0}); /* 1, backup 2 */
        const struct map_queue *q = cluster_map_queue(&map, B("/"), B("t"));
        must_apply(&map, map_cmd_queue_set_in_sync(&c, B("/"), B("t"), q->epoch, two, NULL, 1),
                   &c);
        uint64_t epoch = q->epoch;
        must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_SUSPECT), &c);
        must_apply(&map, map_cmd_broker_state(&c, 1, BROKER_STATE_DOWN), &c);
        if (ending == 2) { /* forgotten */
            struct controller_forget_report report;
            assert_int_equal(controller_forget(&map, &config, 1, &out, &report), OK);
            assert_int_equal(report.promoted, 1);
            assert_int_equal(apply_all(&map, &out), 0);
            q = cluster_map_queue(&map, B("/"), B("t"));
            assert_int_equal(q->primary_id, 2);
            assert_null(cluster_map_broker(&map, 1));
            cluster_map_free(&map);
            continue;
        }
        assert_int_equal(controller_after_state(&map, &config, 1, &out), OK);
        assert_int_equal(apply_all(&map, &out), 0);
        assert_int_equal(controller_repair(&map, &config, &out), OK);
        assert_int_equal(apply_all(&map, &out), 0);
        q = cluster_map_queue(&map, B("/"), B("t"));
        assert_int_equal(q->primary_id, 1); /* waits */
        assert_true(q->available);
        assert_int_equal(q->epoch, epoch);
        if (ending == 0) {
            /* Heard again: the sweep promotes it. */
            must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_UP), &c);
            assert_int_equal(controller_repair(&map, &config, &out), OK);
            assert_int_equal(apply_all(&map, &out), 0);
            assert_int_equal(q->primary_id, 2);
            assert_true(q->available);
            assert_int_equal(q->epoch, epoch + 1); /* promoted (then a new backup) */
            assert_int_equal(q->backups_count, 1);
            assert_int_not_equal(q->backup_ids[0], 1);
        } else {
            /* Down too: unavailable with its primary, which brings it back. */
            must_apply(&map, map_cmd_broker_state(&c, 2, BROKER_STATE_DOWN), &c);
            assert_int_equal(controller_after_state(&map, &config, 2, &out), OK);
            assert_int_equal(apply_all(&map, &out), 0);
            assert_int_equal(controller_repair(&map, &config, &out), OK);
            assert_int_equal(apply_all(&map, &out), 0);
            assert_int_equal(q->primary_id, 1);
            assert_false(q->available);
            must_apply(&map, map_cmd_broker_state(&c, 1, BROKER_STATE_UP), &c);
            assert_int_equal(controller_after_state(&map, &config, 1, &out), OK);
            assert_int_equal(apply_all(&map, &out), 0);
            assert_int_equal(q->primary_id, 1);
            assert_true(q->available);
        }
        assert_int_equal(controller_repair(&map, &config, &out), OK);
        apply_all(&map, &out);
        assert_consistent(&map);
        cluster_map_free(&map);
    }
    map_cmd_list_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_liveness),
        cmocka_unit_test(test_failover_2000_queues),
        cmocka_unit_test(test_exclusive_queue_dies_with_broker),
        cmocka_unit_test(test_exclusive_queue_lives_apart_from_its_connection),
        cmocka_unit_test(test_repair_drops_exclusive_queue_of_dead_owner),
        cmocka_unit_test(test_stale_decision_is_refused),
        cmocka_unit_test(test_repair_finishes_what_was_left),
        cmocka_unit_test(test_forget_a_dead_broker),
        cmocka_unit_test(test_forget_after_and_without_failover),
        cmocka_unit_test(test_drain_converges),
        cmocka_unit_test(test_join_rebalance_with_moves_in_flight),
        cmocka_unit_test(test_drain_one_of_three),
        cmocka_unit_test(test_move_keeps_the_factor),
        cmocka_unit_test(test_handover_keeps_the_old_primary_in_sync),
        cmocka_unit_test(test_policies_change_factors),
        cmocka_unit_test(test_repair_finishes_a_backup_move),
        cmocka_unit_test(test_takeover_from_shared_storage),
        cmocka_unit_test(test_transient_only_queue_taken_over_by_its_backup),
        cmocka_unit_test(test_adopted_said_once_synced),
        cmocka_unit_test(test_leftover_adoptions_and_staged_copies),
        cmocka_unit_test(test_a_switch_without_backups_keeps_the_old_primary_until_applied),
        cmocka_unit_test(test_leader_tick),
        cmocka_unit_test(test_restart_leaves_in_sync_before_any_failover),
        cmocka_unit_test(test_promotion_waits_for_a_suspect_backup),
        cmocka_unit_test(test_restart_successor),
        cmocka_unit_test(test_restarted_transient_only_queue_handed_with_its_log),
        cmocka_unit_test(test_partial_in_sync_refused_once_everything_replicates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
