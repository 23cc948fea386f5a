/*
 * sim_fault.c: faults and operators' actions drawn from the seed: kills,
 * restarts and resumed stopped processes, isolation, one-way cuts and
 * heals (sim_net.c), joins, drains and their revives, forgetting the dead.
 */
#include "sim.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sim_data.h"


static unsigned count_alive(const struct sim *s)
{
    unsigned n = 0;
    for (unsigned i = 0; i < s->f.n; i++)
        n += s->f.servers[i].alive;
    return n;
}

/* Brokers that are still members (dead ones too), not forgotten. */
static unsigned count_members(const struct sim *s)
{
    unsigned n = 0;
    for (unsigned i = 0; i < s->f.n; i++)
        n += !s->brokers[i].forgotten;
    return n;
}

static void kill_broker(struct sim *s, unsigned i)
{
    struct sim_broker *b = &s->brokers[i];
    raft_fixture_kill(&s->f, i);
    s->net_changes++;
    sim_client_killed(s, i);
    b->killed_ms = raft_fixture_time(&s->f);
    b->version_before = b->map.version;
    memcpy(b->shadows_before, b->shadows, sizeof b->shadows);
}

/* A new process on b's disk: its map and everything node.c keeps start
 * empty; libraft loads the log (term, vote, entries) and replays it into
 * the map as the leader tells it the commit index. */
static void restart(struct sim *s, unsigned i)
{
    struct sim_broker *b = &s->brokers[i];
    struct raft_fixture_server *srv = &s->f.servers[i];
    raft_close(&srv->raft, NULL); /* (fails the old process's proposals) */
    cluster_map_free(&b->map);
    cluster_map_init(&b->map);
    memset(b->shadows, 0, sizeof b->shadows);
    b->leader = b->controller_ready = b->barrier_in_flight = false;
    b->leader_since_ms = 0;
    memset(&b->ctl, 0, sizeof b->ctl);
    b->proposals_in_flight = b->liveness_in_flight = b->policy_in_flight = 0;
    memset(b->last_heard_ms, 0, sizeof b->last_heard_ms);
    memset(b->heard_incarnation, 0, sizeof b->heard_incarnation);
    memset(b->heard_map_version, 0, sizeof b->heard_map_version);
    memset(b->lease_heard, 0, sizeof b->lease_heard);
    b->incarnation += SIM_SERVERS; /* a new process: another incarnation */
    b->known_since = UINT64_MAX;
    b->leaving_count = b->departed_count = 0;
    memset(b->join_in_flight, 0, sizeof b->join_in_flight);
    b->change_waiting = false;
    b->synced = false;
    b->sync_id = 0;
    b->restarted = true;
    sim_data_restart(s, i);
    if (raft_init(&srv->raft, &srv->io, &b->fsm, srv->id, srv->address) != 0)
        sim_fail(s, "b%u: raft_init at a restart", b->id);
    srv->raft.tracer = &srv->tracer;
    sim_tune(&srv->raft);
    b->restart_version = 0;
    b->starting = true;
    if (raft_start(&srv->raft) != 0)
        sim_fail(s, "b%u: raft_start at a restart", b->id);
    b->starting = false;
    b->restart_index = raft_last_index(&srv->raft);
}

/* A killed broker back: a restart (it lost its memory), or, when
 * restart is false, a process that was only stopped (SIGSTOP) and goes on. */
static void revive(struct sim *s, unsigned i, bool restart_it)
{
    struct sim_broker *b = &s->brokers[i];
    /* What it sent and wrote before it died has landed by now (every
     * latency is under SIM_SETTLE_MS): nothing in flight refers to it. */
    if (raft_fixture_time(&s->f) < b->killed_ms + SIM_SETTLE_MS)
        sim_run_until(s, b->killed_ms + SIM_SETTLE_MS);
    if (!sim_disk_idle(&b->disk))
        sim_fail(s, "b%u: its disk is still busy %u ms after it died", b->id, SIM_SETTLE_MS);
    if (restart_it)
        restart(s, i);
    raft_fixture_revive(&s->f, i);
    s->net_changes++;
}

/* An operator's revive (POST /api/cluster/revive) of a draining broker. */
static bool undrain(struct sim *s, unsigned i)
{
    unsigned li = raft_fixture_leader_index(&s->f);
    if (li >= s->f.n || !s->brokers[li].controller_ready ||
        s->brokers[li].proposals_in_flight > 0)
        return false;
    struct sim_broker *leader = &s->brokers[li];
    const struct map_broker *b = cluster_map_broker(&leader->map, i + 1);
    if (b == NULL || b->state != BROKER_STATE_DRAINING)
        return false;
    struct map_cmd c;
    sim_propose_one(leader, map_cmd_broker_state(&c, i + 1, BROKER_STATE_UP), &c);
    return true;
}

/* Whether the leader's map knows broker id (an operator forgets only
 * those: a joiner that died before it was announced is not modelled). */
static bool in_leaders_map(struct sim *s, uint32_t id)
{
    unsigned li = raft_fixture_leader_index(&s->f);
    return li < s->f.n && cluster_map_broker(&s->brokers[li].map, id) != NULL;
}

/* One fault or operator action, drawn from the seed (most draws do
 * nothing: the cluster keeps a majority most of the time). */
void sim_fault_inject(struct sim *s)
{
    unsigned i = (unsigned)sim_random_below(s, s->f.n);
    unsigned j = (unsigned)sim_random_below(s, s->f.n);
    unsigned kind = (unsigned)sim_random_below(s, 9);
    const char *what = NULL;
    if (kind == 0 && s->f.servers[i].alive && count_alive(s) > 3) {
        kill_broker(s, i);
        what = "kill";
    } else if (kind == 7 && count_alive(s) > 3 && sim_join_new(s)) {
        i = s->f.n - 1;
        what = "a new broker joins:";
    } else if (kind == 8 && !s->f.servers[i].alive && !s->brokers[i].forgotten &&
               count_members(s) > 4 && s->forget_asked < 0 && in_leaders_map(s, i + 1)) {
        s->brokers[i].forgotten = true; /* dead for good: never revived */
        s->forget_asked = (int)i;
        what = "forget the dead";
    } else if (kind == 1 && !s->f.servers[i].alive && !s->brokers[i].forgotten) {
        bool restart_it = sim_random_below(s, 4) != 0;
        revive(s, i, restart_it);
        what = restart_it ? "restart" : "resume the stopped";
    } else if (kind == 2 && sim_net_cuts_count(s) == 0) {
        for (unsigned k = 0; k < s->f.n; k++) {
            sim_net_cut(s, i, k, true);
            sim_net_cut(s, k, i, true);
        }
        what = "isolate";
    } else if (kind == 3 && sim_net_cuts_count(s) > 0) {
        for (unsigned k = 0; k < s->f.n; k++) {
            sim_net_cut(s, i, k, false);
            sim_net_cut(s, k, i, false);
        }
        what = "heal";
    } else if (kind == 4 && i != j && sim_net_cuts_count(s) < 2) {
        sim_net_cut(s, i, j, true);
        what = "one-way cut from";
    } else if (kind == 5 && count_alive(s) > 3) {
        s->drain_asked = (int)i;
        what = "drain";
    } else if (kind == 6 && undrain(s, i)) {
        what = "revive the drained";
    }
    if (what == NULL)
        return;
    s->faults++;
    sim_trace(s, kind * 17 + i * 5 + j);
    if (s->verbose && kind == 4)
        printf("  t=%" PRIu64 " %s b%u to b%u\n", (uint64_t)raft_fixture_time(&s->f), what,
               i + 1, j + 1);
    else if (s->verbose)
        printf("  t=%" PRIu64 " %s b%u\n", (uint64_t)raft_fixture_time(&s->f), what, i + 1);
}

void sim_fault_heal_all(struct sim *s)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        for (unsigned k = 0; k < s->f.n; k++)
            sim_net_cut(s, i, k, false);
        if (!s->f.servers[i].alive && !s->brokers[i].forgotten)
            revive(s, i, true);
    }
}

/* After the faults: drained brokers are revived (an operator's step). */
void sim_fault_undrain_all(struct sim *s)
{
    for (unsigned i = 0; i < s->f.n; i++)
        undrain(s, i);
}
