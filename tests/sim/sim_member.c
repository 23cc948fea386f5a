/*
 * sim_member.c: membership, copied from consensus.c's member changes and
 * node.c's announce and removal of leavers, not shared: they need the
 * Raft configuration, which the fixture's servers hold.
 */
#include "sim.h"

#include <stdio.h>

#include "cluster/consensus.h"
#include "lib/errors.h"

const struct raft_server *sim_member_of(struct raft *r, uint32_t id)
{
    for (unsigned k = 0; k < r->configuration.n; k++) {
        if (r->configuration.servers[k].id == id)
            return &r->configuration.servers[k];
    }
    return NULL;
}

static unsigned voters_of(struct raft *r)
{
    unsigned n = 0;
    for (unsigned k = 0; k < r->configuration.n; k++)
        n += r->configuration.servers[k].role == RAFT_VOTER;
    return n;
}

static void on_changed(struct raft_change *change, int status)
{
    (void)status;
    struct sim_broker *b = change->data;
    b->change_waiting = false;
}

/* consensus.c's ops_run, reduced: the leader's one membership change at a
 * time: a broker that left the map is removed; a joiner is added (spare),
 * then made a voter (a standby past CONSENSUS_VOTERS_MAX); a standby is
 * promoted when a voter left. RAFT_CANTCHANGE: again at the next tick. */
void sim_member_changes(struct sim *s, struct sim_broker *b)
{
    struct raft *r = raft_fixture_get(&s->f, b->index);
    if (b->change_waiting)
        return;
    b->change.data = b;
    int rv = -1;
    for (uint32_t k = 0; k < b->departed_count && rv != 0; k++) {
        if (sim_member_of(r, b->departed[k]) != NULL)
            rv = raft_remove(r, &b->change, b->departed[k], on_changed);
    }
    for (unsigned i = 0; i < s->f.n && rv != 0; i++) {
        const struct sim_broker *j = &s->brokers[i];
        const struct raft_server *m = sim_member_of(r, j->id);
        if (!j->joining || j->forgotten || !sim_net_reaches(s, i, b->index))
            continue;
        if (m == NULL)
            rv = raft_add(r, &b->change, j->id, s->f.servers[i].address, on_changed);
        else if (m->role == RAFT_SPARE)
            rv = raft_assign(r, &b->change, j->id,
                             voters_of(r) < CONSENSUS_VOTERS_MAX ? RAFT_VOTER : RAFT_STANDBY,
                             on_changed);
    }
    for (unsigned k = 0; k < r->configuration.n && rv != 0; k++) {
        if (r->configuration.servers[k].role == RAFT_STANDBY &&
            voters_of(r) < CONSENSUS_VOTERS_MAX)
            rv = raft_assign(r, &b->change, r->configuration.servers[k].id, RAFT_VOTER,
                             on_changed);
    }
    b->change_waiting = rv == 0;
}

static bool departed(const struct sim_broker *b, uint32_t id)
{
    for (uint32_t k = 0; k < b->departed_count; k++) {
        if (b->departed[k] == id)
            return true;
    }
    return false;
}

/* node.c's controller_remove_leavers: brokers that left the map leave
 * Raft too (queued as member changes). */
void sim_member_remove_leavers(struct sim_broker *b)
{
    for (uint32_t k = 0; k < b->leaving_count; k++) {
        if (!departed(b, b->leaving[k]) && b->departed_count < SIM_SERVERS)
            b->departed[b->departed_count++] = b->leaving[k];
    }
    b->leaving_count = 0;
}

/* node.c's controller_announce_members: every Raft member (voter or
 * standby) it has heard gets a map entry saying what it is. */
void sim_member_announce(struct sim *s, struct sim_broker *b)
{
    struct raft *r = raft_fixture_get(&s->f, b->index);
    for (unsigned k = 0; k < r->configuration.n; k++) {
        const struct raft_server *m = &r->configuration.servers[k];
        uint32_t id = (uint32_t)m->id;
        if (m->role == RAFT_SPARE || departed(b, id) || id > SIM_SERVERS ||
            b->last_heard_ms[id] == 0 || b->join_in_flight[id])
            continue;
        bool voter = m->role == RAFT_VOTER;
        const struct map_broker *mb = cluster_map_broker(&b->map, id);
        if (mb != NULL && mb->voter == voter)
            continue;
        char name[8];
        snprintf(name, sizeof name, "b%u", id);
        struct map_cmd c;
        if (map_cmd_broker_join(&c, id, B(name), B("h:5672"), B(name), voter,
                                b->heard_incarnation[id]) == OK &&
            sim_propose_cmd(b, &c, SIM_JOIN, id))
            b->join_in_flight[id] = true;
    }
}
