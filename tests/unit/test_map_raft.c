/*
 * test_map_raft.c: the cluster map as libraft's state machine, on libraft's
 * deterministic fixture (raft/fixture.h: in-memory I/O, simulated time and
 * network), so elections, partitions and crashes are reproducible.
 *
 * Goal: whatever Raft does (a leader cut off mid-stream, a new leader, a
 * follower down and back, entries that never commit), every member that
 * applied the same log holds the same map, byte for byte in its snapshot;
 * and a command proposed by a leader that loses its quorum is not applied
 * anywhere.
 * Method: three fixture servers, each with its own struct cluster_map as
 * the FSM (apply = cluster_map_apply, snapshot/restore = the map's
 * snapshot). Commands are built with map_cmd_*.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <raft.h>
#include <raft/fixture.h>

#include "cluster/map.h"
#include "lib/errors.h"

#define N 3
#define B(s) bytes_of_cstr(s)
#define STEP_MS 20000

static struct cluster_map maps[N];

static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct cluster_map *map = fsm->data;
    /* Refused commands count as applied too (like node.c): Raft cannot skip. */
    cluster_map_apply(map, buf->base, buf->len, NULL);
    *result = NULL;
    return 0;
}

static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct cluster_map *map = fsm->data;
    uint8_t *data;
    size_t size;
    if (cluster_map_snapshot_alloc(map, &data, &size) != OK)
        return RAFT_NOMEM;
    *bufs = raft_malloc(sizeof **bufs);
    (*bufs)[0].base = raft_malloc(size);
    memcpy((*bufs)[0].base, data, size);
    (*bufs)[0].len = size;
    free(data);
    *n_bufs = 1;
    return 0;
}

static int fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct cluster_map *map = fsm->data;
    int rc = cluster_map_snapshot_read(map, buf->base, buf->len);
    raft_free(buf->base);
    return rc == OK ? 0 : RAFT_MALFORMED;
}

static struct raft_fsm fsms[N];
static struct raft_fixture fixture;

static void on_applied(struct raft_apply *req, int status, void *result)
{
    (void)status;
    (void)result;
    free(req);
}

/* Proposes cmd (consumed) on server i; returns raft_apply's result. */
static int propose(unsigned i, struct map_cmd *cmd)
{
    struct raft_buffer buf = {.base = raft_malloc(cmd->size), .len = cmd->size};
    memcpy(buf.base, cmd->bytes, cmd->size);
    map_cmd_free(cmd);
    struct raft_apply *req = malloc(sizeof *req);
    int rc = raft_apply(raft_fixture_get(&fixture, i), req, &buf, 1, on_applied);
    if (rc != 0) {
        raft_free(buf.base);
        free(req);
    }
    return rc;
}

static void declare_queue(unsigned leader, const char *name, uint32_t primary)
{
    struct map_queue_decl d = {.vhost = B("/"), .name = B(name), .durable = true,
                               .primary_id = primary, .replication_factor = 1};
    struct map_cmd cmd;
    assert_int_equal(map_cmd_queue_declare(&cmd, &d, primary), OK);
    assert_int_equal(propose(leader, &cmd), 0);
}

static unsigned leader_index(void)
{
    assert_true(raft_fixture_step_until_has_leader(&fixture, STEP_MS));
    return raft_fixture_leader_index(&fixture);
}

static void all_applied(raft_index index)
{
    assert_true(raft_fixture_step_until_applied(&fixture, N, index, STEP_MS));
}

static void maps_identical(void)
{
    uint8_t *first = NULL;
    size_t first_size = 0;
    for (unsigned i = 0; i < N; i++) {
        assert_true(cluster_map_verify(&maps[i]));
        uint8_t *snap;
        size_t size;
        assert_int_equal(cluster_map_snapshot_alloc(&maps[i], &snap, &size), OK);
        if (i == 0) {
            first = snap;
            first_size = size;
            continue;
        }
        assert_int_equal(size, first_size);
        assert_memory_equal(snap, first, size);
        free(snap);
    }
    free(first);
}

static int setup(void **state)
{
    (void)state;
    assert_int_equal(raft_fixture_initialize(&fixture), 0);
    for (unsigned i = 0; i < N; i++) {
        cluster_map_init(&maps[i]);
        fsms[i] = (struct raft_fsm){.version = 1, .data = &maps[i], .apply = fsm_apply,
                                    .snapshot = fsm_snapshot, .restore = fsm_restore};
        assert_int_equal(raft_fixture_grow(&fixture, &fsms[i]), 0);
    }
    struct raft_configuration conf;
    assert_int_equal(raft_fixture_configuration(&fixture, N, &conf), 0);
    assert_int_equal(raft_fixture_bootstrap(&fixture, &conf), 0);
    raft_configuration_close(&conf);
    assert_int_equal(raft_fixture_start(&fixture), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    raft_fixture_close(&fixture);
    for (unsigned i = 0; i < N; i++)
        cluster_map_free(&maps[i]);
    return 0;
}

static void test_same_map_through_elections_and_partitions(void **state)
{
    (void)state;
    unsigned leader = leader_index();
    struct map_cmd cmd;
    for (uint32_t id = 1; id <= N; id++) {
        char name[8];
        snprintf(name, sizeof name, "b%u", id);
        assert_int_equal(map_cmd_broker_join(&cmd, id, B(name), B(name), B(name), true, 0), OK);
        assert_int_equal(propose(leader, &cmd), 0);
    }
    assert_int_equal(map_cmd_vhost_put(&cmd, B("/")), OK);
    assert_int_equal(propose(leader, &cmd), 0);
    for (int q = 0; q < 20; q++) {
        char name[16];
        snprintf(name, sizeof name, "q%d", q);
        declare_queue(leader, name, 1 + (uint32_t)(q % N));
    }
    raft_index index = raft_last_index(raft_fixture_get(&fixture, leader));
    all_applied(index);
    maps_identical();
    assert_int_equal(maps[0].queues_count, 20);

    /* The leader is cut off: what it proposes alone never commits. */
    for (unsigned j = 0; j < N; j++) {
        if (j != leader) {
            raft_fixture_disconnect(&fixture, leader, j);
            raft_fixture_disconnect(&fixture, j, leader);
        }
    }
    declare_queue(leader, "lost", 1);
    raft_fixture_step_until_elapsed(&fixture, 3000);
    unsigned next = N;
    for (unsigned j = 0; j < N && next == N; j++) {
        if (j != leader && raft_state(raft_fixture_get(&fixture, j)) == RAFT_LEADER)
            next = j;
    }
    assert_true(next < N); /* the majority elected another leader */
    declare_queue(next, "kept", 2);
    assert_int_equal(map_cmd_queue_delete(&cmd, B("/"), B("q0"), 0), OK);
    assert_int_equal(propose(next, &cmd), 0);
    /* Heal: the old leader's lone entry is overwritten by the new term. */
    for (unsigned j = 0; j < N; j++) {
        if (j != leader) {
            raft_fixture_reconnect(&fixture, leader, j);
            raft_fixture_reconnect(&fixture, j, leader);
        }
    }
    index = raft_last_index(raft_fixture_get(&fixture, next));
    all_applied(index);
    maps_identical();
    for (unsigned i = 0; i < N; i++) {
        assert_null(cluster_map_queue(&maps[i], B("/"), B("lost")));
        assert_non_null(cluster_map_queue(&maps[i], B("/"), B("kept")));
        assert_null(cluster_map_queue(&maps[i], B("/"), B("q0")));
    }

    /* A follower dies, misses changes, comes back and catches up. */
    leader = leader_index();
    unsigned follower = (leader + 1) % N;
    raft_fixture_kill(&fixture, follower);
    for (int q = 0; q < 10; q++) {
        char name[16];
        snprintf(name, sizeof name, "late%d", q);
        declare_queue(leader, name, 1 + (uint32_t)leader);
    }
    raft_fixture_step_until_elapsed(&fixture, 1000);
    raft_fixture_revive(&fixture, follower);
    index = raft_last_index(raft_fixture_get(&fixture, leader));
    all_applied(index);
    maps_identical();
    assert_int_equal(maps[follower].queues_count, 20 - 1 + 1 + 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_map_through_elections_and_partitions, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
