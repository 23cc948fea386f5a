/*
 * test_placement.c: the ring, bounded-load placement and rebalance plans.
 *
 * Goal: 10,000 queues on 5 brokers land within ceil(avg * (1 + eps)) for
 * primaries and backups, backups are distinct and never the primary, the
 * answer is the same on every run (the ring hash is fixed), pinned queues
 * stay local, and when a sixth broker joins or one is drained the plan
 * moves close to the ideal share and leaves every broker within the bound.
 * Method: place queues through placement_place_queue and apply the
 * declares to a map; apply plans directly (set_owner / set_backups) and
 * check the counts; print the movement figures for the report.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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

static void join(struct cluster_map *map, uint32_t id)
{
    char name[16];
    snprintf(name, sizeof name, "b%u", id);
    struct map_cmd c;
    must_apply(map, map_cmd_broker_join(&c, id, B(name), B("h:5672"), B("h:4369"), id <= 5, 0), &c);
}

static void queue_name(char *out, size_t size, uint32_t i)
{
    snprintf(out, size, "orders.%u", i);
}

/* A map with brokers 1..n and QUEUES queues placed with factor rf. */
static void build(struct cluster_map *map, uint32_t n, uint8_t rf)
{
    cluster_map_init(map);
    for (uint32_t id = 1; id <= n; id++)
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
        queue_name(name, sizeof name, i);
        struct placement_result r;
        assert_int_equal(placement_place_queue(&p, B("/"), B(name), rf, PLACEMENT_PRIMARY_RING, BROKER_ID_NONE, &r), OK);
        struct map_queue_decl d = {.vhost = B("/"), .name = B(name), .durable = true,
                                   .primary_id = r.primary_id, .backups_count = r.backups_count,
                                   .replication_factor = rf};
        memcpy(d.backup_ids, r.backup_ids, sizeof(d.backup_ids));
        must_apply(map, map_cmd_queue_declare(&c, &d, r.primary_id), &c);
    }
    placement_free(&p);
    assert_true(cluster_map_verify(map));
}

/* Every up broker within [lo, hi] of its share, for primaries and backups. */
static void assert_balanced(const struct cluster_map *map, const char *label)
{
    struct placement_config config;
    placement_config_default(&config);
    uint32_t up = 0;
    uint64_t owned = 0, held = 0;
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        up += b->state == BROKER_STATE_UP;
        owned += b->queues_owned_count;
        held += b->backups_held_count;
    }
    uint32_t lo, hi, blo, bhi;
    placement_bounds(&config, owned, up, &lo, &hi);
    placement_bounds(&config, held, up, &blo, &bhi);
    printf("%s: primaries in [%u, %u]:", label, lo, hi);
    for (uint32_t i = 0; i < map->brokers_count; i++)
        printf(" %u", map->brokers[i]->queues_owned_count);
    printf("; backups in [%u, %u]:", blo, bhi);
    for (uint32_t i = 0; i < map->brokers_count; i++)
        printf(" %u", map->brokers[i]->backups_held_count);
    printf("\n");
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        if (b->state != BROKER_STATE_UP)
            continue;
        assert_in_range(b->queues_owned_count, lo, hi);
        assert_in_range(b->backups_held_count, blo, bhi);
    }
}

static void assert_backups_sane(const struct cluster_map *map)
{
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        for (uint8_t b = 0; b < q->backups_count; b++) {
            assert_int_not_equal(q->backup_ids[b], q->primary_id);
            for (uint8_t c = 0; c < b; c++)
                assert_int_not_equal(q->backup_ids[b], q->backup_ids[c]);
        }
    }
}

static void test_balanced_and_distinct(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 5, 3);
    assert_balanced(&map, "place 5x10000 rf=3");
    assert_backups_sane(&map);
    for (uint32_t i = 0; i < map.queues_count; i++)
        assert_int_equal(map.queues[i]->backups_count, 2);
    cluster_map_free(&map);
}

static void test_deterministic(void **state)
{
    (void)state;
    /* The ring is a fixed function: these values must never change, or
     * upgrading a broker would move queues. */
    assert_true(placement_queue_hash(B("/"), B("orders.1")) == 0xd669a0ed6306a742ull ||
                (printf("hash is now 0x%016llx\n",
                        (unsigned long long)placement_queue_hash(B("/"), B("orders.1"))),
                 0));
    assert_true(placement_queue_hash(B("a"), B("bc")) != placement_queue_hash(B("ab"), B("c")));
    struct cluster_map a, b;
    build(&a, 5, 2);
    build(&b, 5, 2);
    for (uint32_t i = 0; i < QUEUES; i++) {
        assert_int_equal(a.queues[i]->primary_id, b.queues[i]->primary_id);
        assert_int_equal(a.queues[i]->backup_ids[0], b.queues[i]->backup_ids[0]);
    }
    cluster_map_free(&a);
    cluster_map_free(&b);
}

static void test_pinned_and_small(void **state)
{
    (void)state;
    struct cluster_map map;
    cluster_map_init(&map);
    join(&map, 7);
    struct placement_config config;
    placement_config_default(&config);
    struct placement p;
    placement_init(&p, &config);
    placement_refresh(&p, &map);
    struct placement_result r;
    /* One broker: no backups however many are asked for. */
    assert_int_equal(placement_place_queue(&p, B("/"), B("q"), 4, PLACEMENT_PRIMARY_RING, BROKER_ID_NONE, &r), OK);
    assert_int_equal(r.primary_id, 7);
    assert_int_equal(r.backups_count, 0);
    join(&map, 8);
    join(&map, 9);
    placement_refresh(&p, &map);
    assert_int_equal(p.brokers_count, 3);
    assert_int_equal(placement_place_queue(&p, B("/"), B("q"), 4, PLACEMENT_PRIMARY_RING, BROKER_ID_NONE, &r), OK);
    assert_int_equal(r.backups_count, 2);
    /* Pinned to the declaring connection's broker. */
    for (int i = 0; i < 50; i++) {
        char name[32];
        snprintf(name, sizeof name, "amq.gen-%d", i);
        assert_int_equal(placement_place_queue(&p, B("/"), B(name), 2, PLACEMENT_PRIMARY_AT, 9, &r), OK);
        assert_int_equal(r.primary_id, 9);
        assert_int_equal(r.backups_count, 1);
        assert_int_not_equal(r.backup_ids[0], 9);
    }
    /* Only up brokers take work. */
    struct map_cmd c;
    must_apply(&map, map_cmd_broker_state(&c, 8, BROKER_STATE_DRAINING), &c);
    must_apply(&map, map_cmd_broker_state(&c, 9, BROKER_STATE_DOWN), &c);
    placement_refresh(&p, &map);
    assert_int_equal(p.brokers_count, 1);
    assert_int_equal(placement_place_queue(&p, B("/"), B("z"), 3, PLACEMENT_PRIMARY_RING, BROKER_ID_NONE, &r), OK);
    assert_int_equal(r.primary_id, 7);
    assert_int_equal(r.backups_count, 0);
    must_apply(&map, map_cmd_broker_state(&c, 7, BROKER_STATE_SUSPECT), &c);
    placement_refresh(&p, &map);
    assert_int_equal(placement_place_queue(&p, B("/"), B("z"), 3, PLACEMENT_PRIMARY_RING, BROKER_ID_NONE, &r), E_LIMIT);
    placement_free(&p);
    cluster_map_free(&map);
}

/* Applies a plan the direct way (no catch-up): set_owner / set_backups. */
static void apply_plan(struct cluster_map *map, const struct placement_plan *plan)
{
    for (uint32_t i = 0; i < plan->count; i++) {
        const struct placement_move *m = &plan->moves[i];
        struct map_queue *q = m->queue;
        struct map_cmd c;
        if (m->kind == PLACEMENT_MOVE_PRIMARY) {
            must_apply(map, map_cmd_queue_set_owner(&c, q->vhost->name, q->name, q->epoch,
                                                    m->to_id),
                       &c);
            continue;
        }
        uint32_t ids[CLUSTER_BACKUPS_MAX];
        memcpy(ids, q->backup_ids, sizeof ids);
        uint8_t n = q->backups_count;
        bool replaced = false;
        for (uint8_t b = 0; b < n; b++) {
            if (ids[b] == m->from_id) {
                ids[b] = m->to_id;
                replaced = true;
            }
        }
        if (!replaced)
            ids[n++] = m->to_id;
        must_apply(map, map_cmd_queue_set_backups(&c, q->vhost->name, q->name, q->epoch, ids, n),
                   &c);
    }
}

static void test_join_moves_little(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 5, 2);
    uint32_t before[QUEUES];
    for (uint32_t i = 0; i < QUEUES; i++)
        before[i] = map.queues[i]->primary_id;
    join(&map, 6);
    struct placement_config config;
    placement_config_default(&config);
    struct placement_plan plan;
    placement_plan_init(&plan);
    assert_int_equal(placement_rebalance_plan(&map, &config, UINT32_MAX, &plan), OK);
    uint32_t to_new = 0;
    for (uint32_t i = 0; i < plan.count; i++) {
        if (plan.moves[i].kind == PLACEMENT_MOVE_PRIMARY) {
            to_new += plan.moves[i].to_id == 6;
            assert_false(plan.moves[i].mandatory);
        }
    }
    printf("join 6th broker: %u primary moves (%u to the new broker; ideal %u = 1/6), "
           "%u backup moves (ideal %u)\n",
           plan.primary_moves_count, to_new, QUEUES / 6, plan.backup_moves_count, QUEUES / 6);
    /* Almost all go to the new broker; a few even out the old ones. */
    assert_true(to_new * 100 >= plan.primary_moves_count * 95);
    assert_true(plan.primary_moves_count <= QUEUES / 6 + QUEUES / 100);
    apply_plan(&map, &plan);
    placement_plan_free(&plan);
    assert_true(cluster_map_verify(&map));
    assert_backups_sane(&map);
    assert_balanced(&map, "after join");
    uint32_t moved = 0;
    for (uint32_t i = 0; i < QUEUES; i++)
        moved += map.queues[i]->primary_id != before[i];
    assert_true(moved <= QUEUES / 6 + QUEUES / 100);
    /* A second plan only restores factors (a backup promoted by set_owner
     * leaves the backups); a third has nothing left to do. */
    placement_plan_init(&plan);
    placement_rebalance_plan(&map, &config, UINT32_MAX, &plan);
    for (uint32_t i = 0; i < plan.count; i++) {
        assert_true(plan.moves[i].mandatory);
        assert_int_equal(plan.moves[i].from_id, BROKER_ID_NONE);
    }
    printf("join: second plan restores %u backups\n", plan.count);
    apply_plan(&map, &plan);
    placement_plan_free(&plan);
    placement_plan_init(&plan);
    placement_rebalance_plan(&map, &config, UINT32_MAX, &plan);
    assert_int_equal(plan.count, 0);
    placement_plan_free(&plan);
    assert_balanced(&map, "after join, settled");

    /* For comparison: placing the same names from scratch on 6 brokers. */
    struct cluster_map fresh;
    build(&fresh, 6, 2);
    uint32_t differ = 0;
    for (uint32_t i = 0; i < QUEUES; i++)
        differ += fresh.queues[i]->primary_id != before[i];
    printf("fresh placement on 6 brokers differs from 5 for %u primaries (ideal %u)\n", differ,
           QUEUES / 6);
    cluster_map_free(&fresh);
    cluster_map_free(&map);
}

static void test_drain_moves_only_its_queues(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 5, 2);
    uint32_t owned3 = cluster_map_broker(&map, 3)->queues_owned_count;
    uint32_t held3 = cluster_map_broker(&map, 3)->backups_held_count;
    struct map_cmd c;
    must_apply(&map, map_cmd_broker_state(&c, 3, BROKER_STATE_DRAINING), &c);
    struct placement_config config;
    placement_config_default(&config);
    struct placement_plan plan;
    uint32_t primary_moves = 0, backup_moves = 0, rounds = 0, off3 = 0;
    for (;;) {
        placement_plan_init(&plan);
        placement_rebalance_plan(&map, &config, UINT32_MAX, &plan);
        if (plan.count == 0)
            break;
        for (uint32_t i = 0; i < plan.count; i++) {
            const struct placement_move *m = &plan.moves[i];
            if (m->kind == PLACEMENT_MOVE_PRIMARY && m->from_id == 3) {
                assert_true(m->mandatory);
                off3++;
            }
        }
        primary_moves += plan.primary_moves_count;
        backup_moves += plan.backup_moves_count;
        apply_plan(&map, &plan);
        placement_plan_free(&plan);
        assert_true(++rounds < 10);
    }
    placement_plan_free(&plan);
    printf("drain broker 3 (%u primaries, %u backups): %u primary moves (%u off it), "
           "%u backup moves in %u rounds (ideal %u + %u)\n",
           owned3, held3, primary_moves, off3, backup_moves, rounds, owned3, owned3 + held3);
    assert_int_equal(off3, owned3);
    assert_true(primary_moves - off3 <= owned3 / 10);
    assert_int_equal(cluster_map_broker(&map, 3)->queues_owned_count, 0);
    assert_int_equal(cluster_map_broker(&map, 3)->backups_held_count, 0);
    assert_backups_sane(&map);
    assert_balanced(&map, "after drain");
    for (uint32_t i = 0; i < map.queues_count; i++)
        assert_int_equal(map.queues[i]->backups_count, 1);
    must_apply(&map, map_cmd_broker_leave(&c, 3), &c);
    cluster_map_free(&map);
}

static void test_moves_max(void **state)
{
    (void)state;
    struct cluster_map map;
    build(&map, 5, 2);
    join(&map, 6);
    struct placement_config config;
    placement_config_default(&config);
    struct placement_plan plan;
    placement_plan_init(&plan);
    placement_rebalance_plan(&map, &config, 100, &plan);
    assert_int_equal(plan.count, 100);
    placement_plan_free(&plan);
    cluster_map_free(&map);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_balanced_and_distinct),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_pinned_and_small),
        cmocka_unit_test(test_join_moves_little),
        cmocka_unit_test(test_drain_moves_only_its_queues),
        cmocka_unit_test(test_moves_max),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
