/*
 * sim_check.c: the checkers (sim_control.c lists them): after every apply
 * on every broker, each queue against what that broker saw before and
 * against every other map; at the end, convergence.
 */
#include "sim.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/placement.h"
#include "sim_data.h"

static void check_epoch(struct sim *s, uint32_t queue, uint64_t epoch, uint32_t primary_id)
{
    for (uint32_t i = 0; i < s->epochs_count; i++) {
        struct epoch_record *r = &s->epochs[i];
        if (r->queue == queue && r->epoch == epoch) {
            if (r->primary_id != primary_id)
                sim_fail(s, "%s epoch %" PRIu64 ": primary %u on one map, %u on another",
                         sim_queue_names[queue], epoch, r->primary_id, primary_id);
            return;
        }
    }
    if (s->epochs_count == SIM_EPOCHS_MAX)
        return;
    s->epochs[s->epochs_count++] = (struct epoch_record){queue, epoch, primary_id};
}

static bool shadow_in_sync(const struct shadow *sh, uint32_t id)
{
    for (uint8_t i = 0; i < sh->in_sync_count; i++) {
        if (sh->in_sync[i] == id)
            return true;
    }
    return false;
}

/* A promotion the map decided knowing that the new primary restarted
 * (its incarnation is the process's) since its replica was emptied: the
 * restart should have taken it out of the in-sync set first
 * (broker.incarnation, seed 192). One decided before the map knew (an
 * entry of an older term committed after the restart, or a backup that
 * died as it was promoted) is the known loss sim_data_known_loss counts. */
static void check_not_restarted(struct sim *s, const struct sim_broker *b, unsigned qi,
                                const struct map_queue *q)
{
    if (s->data == NULL || q->primary_id < 1 || q->primary_id > s->f.n)
        return;
    const struct sim_broker *p = &s->brokers[q->primary_id - 1];
    const struct map_broker *mb = cluster_map_broker(&b->map, q->primary_id);
    if (s->data->copies[p->index][qi].emptied && mb != NULL && mb->incarnation == p->incarnation)
        sim_fail(s, "%s: b%u promoted b%u (epoch %" PRIu64 ") after its map knew that it had "
                 "restarted, its replica emptied", sim_queue_names[qi], b->id, p->id, q->epoch);
}

/* After every apply on broker b: compares each queue with what b saw
 * before, then remembers it. */
void sim_check_queues(struct sim *s, struct sim_broker *b)
{
    const struct cluster_map *map = &b->map;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        int qi = sim_queue_index(q->name);
        if (qi < 0) {
            sim_fail(s, "a queue nobody declared: %.*s", (int)q->name.len,
                     (const char *)q->name.ptr);
            return;
        }
        struct shadow *sh = &b->shadows[qi];
        bool owners_known = cluster_map_broker(map, q->primary_id) != NULL &&
                            (q->move_to == BROKER_ID_NONE ||
                             cluster_map_broker(map, q->move_to) != NULL);
        for (uint8_t k = 0; k < q->backups_count; k++)
            owners_known &= cluster_map_broker(map, q->backup_ids[k]) != NULL;
        if (!owners_known)
            sim_fail(s, "%s on b%u: held by a broker that left the map", sim_queue_names[qi],
                     b->id);
        if (q->available)
            check_epoch(s, (uint32_t)qi, q->epoch, q->primary_id);
        if (sh->known && q->epoch < sh->epoch)
            sim_fail(s, "%s: epoch fell from %" PRIu64 " to %" PRIu64 " on broker %u",
                     sim_queue_names[qi], sh->epoch, q->epoch, b->id);
        /* A new primary of the same incarnation line: it must have held
         * everything confirmed, i.e. been in sync (or be the primary that
         * comes back to its own unavailable queue). */
        /* (Forgetting a broker starts its queues that had no in-sync
         * backup again empty elsewhere: the operator gave their messages up.) */
        bool forgotten = sh->primary_id >= 1 && sh->primary_id <= s->f.n &&
                         s->brokers[sh->primary_id - 1].forgotten;
        if (sh->known && q->primary_id != sh->primary_id && q->available &&
            !shadow_in_sync(sh, q->primary_id) && forgotten)
            sim_data_given_up(s, (unsigned)qi);
        else if (sh->known && q->primary_id != sh->primary_id && q->available &&
                 !shadow_in_sync(sh, q->primary_id))
            sim_fail(s, "%s: broker %u became primary (epoch %" PRIu64 ") without being in sync "
                     "(primary was %u, in sync: %u of them)", sim_queue_names[qi], q->primary_id,
                     q->epoch, sh->primary_id, sh->in_sync_count);
        else if (sh->known && q->primary_id != sh->primary_id)
            check_not_restarted(s, b, (unsigned)qi, q);
        sh->known = true;
        sh->available = q->available;
        sh->primary_id = q->primary_id;
        sh->epoch = q->epoch;
        sh->in_sync_count = 0;
        for (uint8_t k = 0; k < q->backups_count; k++) {
            if (map_queue_backup_in_sync(q, q->backup_ids[k]))
                sh->in_sync[sh->in_sync_count++] = q->backup_ids[k];
        }
    }
    /* A queue deleted (a non-durable one: sim_data_nondurable): one
     * declared again is a new line, its epochs above. */
    for (unsigned qi = 0; qi < SIM_QUEUES; qi++) {
        if (b->shadows[qi].known && cluster_map_queue(map, B("/"), B(sim_queue_names[qi])) == NULL)
            b->shadows[qi].known = false;
    }
}

/* Whether the membership is what the faults left: every broker not
 * forgotten is in ref's map and a Raft member that votes or stands by, a
 * forgotten one in neither, and the queues are balanced (a joiner got its
 * share: placement plans no move). */
static bool members_settled(struct sim *s, const struct cluster_map *ref, char *why,
                            size_t why_size)
{
    unsigned li = raft_fixture_leader_index(&s->f);
    if (li >= s->f.n) {
        snprintf(why, why_size, "no leader");
        return false;
    }
    struct raft *r = raft_fixture_get(&s->f, li);
    for (unsigned i = 0; i < s->f.n; i++) {
        const struct sim_broker *b = &s->brokers[i];
        const struct raft_server *m = sim_member_of(r, b->id);
        bool in_map = cluster_map_broker(ref, b->id) != NULL;
        bool member = m != NULL && m->role != RAFT_SPARE;
        if (in_map == b->forgotten || member == b->forgotten) {
            snprintf(why, why_size, "b%u (%s): in the map %d, a Raft member %d", b->id,
                     b->forgotten ? "forgotten" : "a member", in_map, member);
            return false;
        }
    }
    struct placement_plan plan;
    placement_plan_init(&plan);
    placement_rebalance_plan(ref, &s->config.placement, CONTROLLER_REBALANCE_MOVES, &plan);
    uint32_t moves = plan.count;
    placement_plan_free(&plan);
    if (moves > 0)
        snprintf(why, why_size, "not balanced: %u move(s) planned", moves);
    return moves == 0;
}

/* Empty when the cluster has converged; else what is still off. */
bool sim_check_converged(struct sim *s, char *why, size_t why_size)
{
    unsigned first = 0;
    while (s->brokers[first].forgotten)
        first++;
    const struct cluster_map *ref = &s->brokers[first].map;
    for (unsigned i = first + 1; i < s->f.n; i++) {
        if (!s->brokers[i].forgotten && s->brokers[i].map.version != ref->version) {
            snprintf(why, why_size, "b%u's map is at version %" PRIu64 ", b%u's at %" PRIu64,
                     i + 1, s->brokers[i].map.version, first + 1, ref->version);
            return false;
        }
    }
    if (ref->queues_count != SIM_QUEUES) {
        snprintf(why, why_size, "%u queues of %u", ref->queues_count, SIM_QUEUES);
        return false;
    }
    for (uint32_t i = 0; i < ref->brokers_count; i++) {
        if (ref->brokers[i]->state != BROKER_STATE_UP) {
            snprintf(why, why_size, "b%u is %s", ref->brokers[i]->id,
                     broker_state_name(ref->brokers[i]->state));
            return false;
        }
    }
    for (uint32_t i = 0; i < ref->queues_count; i++) {
        const struct map_queue *q = ref->queues[i];
        bool all_in_sync = q->in_sync_mask == (1u << q->backups_count) - 1;
        if (!q->available || q->backups_count + 1 != q->replication_factor || !all_in_sync) {
            snprintf(why, why_size, "%.*s: available %d, %u backups of %u, in sync mask %x",
                     (int)q->name.len, (const char *)q->name.ptr, q->available,
                     q->backups_count, q->replication_factor - 1, q->in_sync_mask);
            return false;
        }
    }
    if (!members_settled(s, ref, why, why_size))
        return false;
    /* Same versions: the same maps, byte for byte. */
    uint8_t *a, *b;
    size_t a_size, b_size;
    cluster_map_snapshot_alloc(ref, &a, &a_size);
    bool same = true;
    for (unsigned i = first + 1; i < s->f.n && same; i++) {
        if (s->brokers[i].forgotten)
            continue;
        cluster_map_snapshot_alloc(&s->brokers[i].map, &b, &b_size);
        same = a_size == b_size && memcmp(a, b, a_size) == 0;
        free(b);
        if (!same)
            snprintf(why, why_size, "b%u's map differs from b%u's at the same version", i + 1,
                     first + 1);
    }
    free(a);
    return same;
}
