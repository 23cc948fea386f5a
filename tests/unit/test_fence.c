/*
 * test_fence.c: the fences a deposed primary meets (cluster/fence.h).
 * Goal: a forward is taken only by the primary at a current epoch, relayed
 * only to a newer primary, parked only when our map lags; a backup takes a
 * stream only at an epoch its map has reached or passed, never as the
 * primary, and acks an old seq only from the epoch it came on; it keeps a
 * copy (and takes a stream into it) only while its map names it a backup,
 * or while the stream was started under a map newer than its own; the lease
 * needs a majority heard within its length, by heartbeats whose sender's
 * map ours has reached.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cluster/fence.h"

static struct map_queue queue_at(uint32_t primary, uint64_t epoch)
{
    return (struct map_queue){.primary_id = primary, .epoch = epoch, .available = true,
                              .backup_ids = {2, 3}, .backups_count = 2};
}

static void forward_fresh_only_at_the_primary_and_current_epoch(void **state)
{
    (void)state;
    struct map_queue q = queue_at(1, 10);
    assert_true(fence_forward_fresh(&q, 1, 10));
    assert_true(fence_forward_fresh(&q, 1, 11)); /* the sender saw a newer map: ours follows */
    assert_false(fence_forward_fresh(&q, 1, 9)); /* named an older incarnation */
    assert_false(fence_forward_fresh(&q, 2, 10)); /* not ours */
    assert_false(fence_forward_fresh(NULL, 1, 10));
}

static void forward_relays_to_a_newer_available_primary(void **state)
{
    (void)state;
    struct map_queue q = queue_at(2, 10);
    assert_true(fence_forward_relays(&q, 1, 9));
    assert_false(fence_forward_relays(&q, 1, 10)); /* the same epoch: not a lagging sender */
    assert_false(fence_forward_relays(&q, 2, 9));  /* we are its primary */
    q.available = false;
    assert_false(fence_forward_relays(&q, 1, 9));
    assert_false(fence_forward_relays(NULL, 1, 9));
}

static void map_behind_by_epoch_or_version(void **state)
{
    (void)state;
    struct cluster_map map;
    cluster_map_init(&map);
    map.version = 20;
    struct map_queue q = queue_at(1, 10);
    assert_true(fence_map_behind(&map, &q, 11));
    assert_false(fence_map_behind(&map, &q, 10));
    assert_false(fence_map_behind(&map, &q, 9));
    /* Unknown here: behind only if its epoch is past our map's version. */
    assert_true(fence_map_behind(&map, NULL, 21));
    assert_false(fence_map_behind(&map, NULL, 20));
    cluster_map_free(&map);
}

static void forward_gone_once_the_map_deleted_its_queue(void **state)
{
    (void)state;
    struct cluster_map map;
    cluster_map_init(&map);
    map.version = 20;
    struct map_queue q = queue_at(1, 10);
    assert_true(fence_forward_gone(&map, NULL, 20)); /* deleted at or after 20 */
    assert_true(fence_forward_gone(&map, NULL, 9));
    assert_false(fence_forward_gone(&map, NULL, 21)); /* not declared yet here: parked */
    assert_false(fence_forward_gone(&map, &q, 9));    /* still there (another incarnation) */
    cluster_map_free(&map);
}

static void replica_takes_streams_at_its_epoch_or_newer(void **state)
{
    (void)state;
    struct map_queue q = queue_at(1, 10);
    assert_true(fence_replica_accepts(&q, 2, 10, 20, 0));
    assert_true(fence_replica_accepts(&q, 2, 11, 20, 0)); /* a promotion we have not applied */
    assert_false(fence_replica_accepts(&q, 2, 9, 20, 0)); /* a deposed primary's stream */
    assert_false(fence_replica_accepts(&q, 1, 10, 20, 0)); /* we are its primary */
    assert_false(fence_replica_accepts(NULL, 2, 10, 20, 0));
    /* Not a backup here: only a stream started under a newer map. */
    assert_false(fence_replica_accepts(&q, 4, 10, 20, 0));
    assert_false(fence_replica_accepts(&q, 4, 10, 20, 20));
    assert_true(fence_replica_accepts(&q, 4, 10, 20, 21));
    assert_false(fence_replica_accepts(&q, 4, 9, 20, 21)); /* (the epoch still counts) */
}

static void replica_kept_while_named_or_fed_from_a_newer_map(void **state)
{
    (void)state;
    struct map_queue q = queue_at(1, 10); /* backups 2 and 3 */
    /* A backup keeps its copy, whatever its stream's version. */
    assert_true(fence_replica_kept(&q, 2, 20, 0));
    assert_true(fence_replica_kept(&q, 3, 20, 30));
    assert_true(fence_replica_kept(&q, 3, 20, 5));
    /* No longer named (a move released us, a rebalance moved the backup):
     * the copy goes, once our map is as new as the stream's start (or the
     * primary said no version: one from before). */
    assert_false(fence_replica_kept(&q, 4, 20, 0));
    assert_false(fence_replica_kept(&q, 4, 20, 19));
    assert_false(fence_replica_kept(&q, 4, 20, 20));
    /* Named in a map we have not applied yet (the primary caught us up at
     * version 21): kept until our map has come that far. */
    assert_true(fence_replica_kept(&q, 4, 20, 21));
    /* Never at the primary, nor of a queue our map does not have. */
    assert_false(fence_replica_kept(&q, 1, 20, 21));
    assert_false(fence_replica_kept(NULL, 4, 20, 21));
}

static void replica_push_takes_newer_refuses_collisions(void **state)
{
    (void)state;
    assert_int_equal(fence_replica_push(10, 3, 11, 3), FENCE_PUSH_TAKE);
    assert_int_equal(fence_replica_push(10, 3, 11, 4), FENCE_PUSH_TAKE);
    assert_int_equal(fence_replica_push(10, 3, 10, 3), FENCE_PUSH_HAVE); /* a resend */
    assert_int_equal(fence_replica_push(10, 3, 4, 4), FENCE_PUSH_REFUSE); /* a new primary's */
    assert_int_equal(fence_replica_push(10, 3, 4, 2), FENCE_PUSH_REFUSE); /* a deposed one's */
    assert_int_equal(fence_replica_push(0, 0, 1, 7), FENCE_PUSH_TAKE); /* after a reset */
}

static void lease_needs_a_majority_heard(void **state)
{
    (void)state;
    /* Five brokers: ourselves and two others make a majority; the lease
     * runs from the second newest of the four others. */
    uint64_t heard[] = {100, 900, 0, 500};
    assert_int_equal(fence_lease_until(heard, 4, true, 1000), 1500);
    uint64_t one[] = {0, 0, 0, 700};
    assert_int_equal(fence_lease_until(one, 4, true, 1000), 0); /* one other: no majority */
    /* Three brokers: one other is enough. */
    uint64_t three[] = {0, 300};
    assert_int_equal(fence_lease_until(three, 2, true, 1000), 1300);
    /* Alone in the map, or not in it: nobody else could confirm. */
    assert_true(fence_lease_until(NULL, 0, true, 1000) == UINT64_MAX);
    uint64_t some[] = {0, 0};
    assert_true(fence_lease_until(some, 2, false, 1000) == UINT64_MAX);
    /* Two brokers: the other must be heard. */
    uint64_t two[] = {0};
    assert_int_equal(fence_lease_until(two, 1, true, 1000), 0);
}

static void pause_minority_after_a_stale_lease_while_serving(void **state)
{
    (void)state;
    struct fence_pause p = {0};
    fence_pause_step(&p, true, true, 1000, 3000);
    assert_false(p.paused);
    /* Not serving yet (catching up after a start): not counted. */
    fence_pause_step(&p, false, false, 2000, 3000);
    fence_pause_step(&p, false, false, 9000, 3000);
    assert_false(p.paused);
    /* Serving, cut off: counted from the first stale tick. */
    fence_pause_step(&p, false, true, 10000, 3000);
    fence_pause_step(&p, false, true, 12999, 3000);
    assert_false(p.paused);
    fence_pause_step(&p, false, true, 13000, 3000);
    assert_true(p.paused);
    /* Still paused while not serving; back once the lease is. */
    fence_pause_step(&p, false, false, 14000, 3000);
    assert_true(p.paused);
    fence_pause_step(&p, true, true, 15000, 3000);
    assert_false(p.paused);
    assert_int_equal(p.stale_since_ms, 0);
    /* A blip shorter than the wait does not pause, and does not add up. */
    fence_pause_step(&p, false, true, 20000, 3000);
    fence_pause_step(&p, true, true, 22000, 3000);
    fence_pause_step(&p, false, true, 23000, 3000);
    fence_pause_step(&p, false, true, 25500, 3000);
    assert_false(p.paused);
}

/* A heartbeat counts for the lease once our map reached its sender's
 * (tests/sim seed 888: a deposed primary back in touch renewed its lease
 * from the heartbeats of brokers whose maps had moved its queue away). */
static void lease_counts_a_heartbeat_once_our_map_reached_its_senders(void **state)
{
    (void)state;
    struct fence_heard h = {0};
    fence_heard_note(&h, 100, true, 50, false, 50); /* the same map: counts */
    assert_int_equal(fence_heard_ms(&h, 50), 100);
    fence_heard_note(&h, 150, true, 40, false, 50); /* behind ours: counts */
    assert_int_equal(fence_heard_ms(&h, 50), 150);
    fence_heard_note(&h, 200, true, 60, false, 50); /* ahead: waits */
    assert_int_equal(fence_heard_ms(&h, 50), 150);
    assert_int_equal(fence_heard_ms(&h, 59), 150);
    fence_heard_note(&h, 250, true, 70, false, 55); /* the oldest that waits stays */
    assert_int_equal(fence_heard_ms(&h, 60), 200); /* ours reached 60: it counts, as of 200 */
    assert_int_equal(fence_heard_ms(&h, 80), 200); /* (the one at 250 did not wait) */
    fence_heard_note(&h, 300, false, 0, false, 1); /* a sender that does not say: at once */
    assert_int_equal(fence_heard_ms(&h, 1), 300);
    /* The low 32 bits, compared serially across a wrap. */
    struct fence_heard w = {0};
    uint64_t ours = (UINT64_C(7) << 32) | 0xFFFFFFF0u;
    fence_heard_note(&w, 10, true, 0x00000005u, false, ours); /* ahead, past the wrap */
    assert_int_equal(fence_heard_ms(&w, ours), 0);
    assert_int_equal(fence_heard_ms(&w, ours + 0x15), 10);
    fence_heard_note(&w, 20, true, 0xFFFFFFE0u, false, ours + 0x15); /* behind, before the wrap */
    assert_int_equal(fence_heard_ms(&w, ours + 0x15), 20);
    /* With the lease: a majority of 3 others (2) must count. */
    struct fence_heard peers[3] = {{0}, {0}, {0}};
    fence_heard_note(&peers[0], 1000, true, 9, false, 5);
    fence_heard_note(&peers[1], 1000, true, 9, false, 5);
    fence_heard_note(&peers[2], 1000, true, 5, false, 5);
    uint64_t heard[3];
    for (int i = 0; i < 3; i++)
        heard[i] = fence_heard_ms(&peers[i], 5);
    assert_int_equal(fence_lease_until(heard, 3, true, 1000), 0); /* one counts: no lease */
    for (int i = 0; i < 3; i++)
        heard[i] = fence_heard_ms(&peers[i], 9);
    assert_int_equal(fence_lease_until(heard, 3, true, 1000), 2000);
}

/* A backup's stream is out of step once the map shows another process of
 * the backup than when the stream last followed it; a first report (0
 * before) is not a restart (broker.incarnation records it only). */
static void backup_restarted_only_on_a_new_process(void **state)
{
    (void)state;
    assert_false(fence_backup_restarted(0, 0));
    assert_false(fence_backup_restarted(0, 77)); /* the first report */
    assert_false(fence_backup_restarted(77, 77));
    assert_true(fence_backup_restarted(77, 78));
    assert_true(fence_backup_restarted(77, 0)); /* (the map forgot it: not the same) */
}

/* A heartbeat from a broker still catching up after a start counts for
 * nothing, whatever version it names (tests/sim seed 756410383: a deposed
 * primary, cut off for long, took its lease from brokers restarted
 * meanwhile whose applied maps still had it primary though their logs had
 * its deposition). Once the sender has caught up it counts again. */
static void lease_ignores_a_sender_catching_up(void **state)
{
    (void)state;
    struct fence_heard h = {0};
    fence_heard_note(&h, 100, true, 40, true, 50); /* behind ours, but catching up */
    assert_int_equal(fence_heard_ms(&h, 50), 0);
    fence_heard_note(&h, 200, true, 40, true, 50);
    assert_int_equal(fence_heard_ms(&h, 90), 0); /* nothing waits either */
    uint64_t heard[3] = {fence_heard_ms(&h, 50), 1000, 0};
    assert_int_equal(fence_lease_until(heard, 3, true, 1000), 0); /* one of the two needed */
    fence_heard_note(&h, 300, true, 50, false, 50); /* caught up */
    assert_int_equal(fence_heard_ms(&h, 50), 300);
    fence_heard_note(&h, 400, true, 45, true, 50); /* restarted again: keeps the last that counted */
    assert_int_equal(fence_heard_ms(&h, 50), 300);
}

/* A backup's stream gates confirms while the map may promote it: in sync,
 * or its join asked, failed since or not (tests/sim seed 4169: the primary
 * confirmed without a backup whose stream failed just after its join was
 * asked; the join landed after, and the controller promoted it without
 * those messages). The set asked for keeps a join until the map shows it,
 * and leaves out an in-sync stream that failed (the map drops it). */
static void stream_gates_while_the_map_may_promote_it(void **state)
{
    (void)state;
    assert_false(fence_stream_gates(false, false)); /* being caught up, or failed before its join */
    assert_true(fence_stream_gates(true, false));
    assert_true(fence_stream_gates(false, true)); /* live or failed: its join may land */
    assert_true(fence_stream_wanted(true, false, true));
    assert_false(fence_stream_wanted(true, false, false)); /* failed: to be dropped */
    assert_true(fence_stream_wanted(false, true, true));
    assert_true(fence_stream_wanted(false, true, false)); /* the join lands, then it leaves */
    assert_false(fence_stream_wanted(false, false, true));
    assert_false(fence_stream_wanted(false, false, false));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forward_fresh_only_at_the_primary_and_current_epoch),
        cmocka_unit_test(forward_relays_to_a_newer_available_primary),
        cmocka_unit_test(map_behind_by_epoch_or_version),
        cmocka_unit_test(forward_gone_once_the_map_deleted_its_queue),
        cmocka_unit_test(replica_takes_streams_at_its_epoch_or_newer),
        cmocka_unit_test(replica_kept_while_named_or_fed_from_a_newer_map),
        cmocka_unit_test(replica_push_takes_newer_refuses_collisions),
        cmocka_unit_test(lease_needs_a_majority_heard),
        cmocka_unit_test(pause_minority_after_a_stale_lease_while_serving),
        cmocka_unit_test(lease_counts_a_heartbeat_once_our_map_reached_its_senders),
        cmocka_unit_test(lease_ignores_a_sender_catching_up),
        cmocka_unit_test(backup_restarted_only_on_a_new_process),
        cmocka_unit_test(stream_gates_while_the_map_may_promote_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
