/*
 * sim_controller.c: node.c's controller tick on every broker: what it
 * heard, and while Raft says it leads, its member changes, its barrier,
 * then controller_leader_tick (controller.h), the one function node.c's
 * loop calls too; then the requests that reach the leader (sim_requests.c).
 */
#include "sim.h"

#include <stdio.h>

#include "lib/errors.h"
#include "sim_data.h"

/* What b has heard (node.c: the peers' heartbeats, node_heartbeat.c). */
static void hear(struct sim *s, struct sim_broker *b, uint64_t now)
{
    for (unsigned j = 0; j < s->f.n; j++) {
        if (sim_net_reaches(s, j, b->index)) {
            b->last_heard_ms[j + 1] = now;
            b->heard_incarnation[j + 1] = s->brokers[j].incarnation;
            b->heard_map_version[j + 1] = (uint32_t)s->brokers[j].map.version;
            fence_heard_note(&b->lease_heard[j + 1], now, true,
                             (uint32_t)s->brokers[j].map.version, !s->brokers[j].synced,
                             b->map.version);
        }
    }
}

/* node.c's observe: one controller_heard per broker of b's map. */
static struct controller_observed observe(struct sim_broker *b, struct controller_heard *heard)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->map.brokers_count && n < SIM_SERVERS; i++) {
        uint32_t id = b->map.brokers[i]->id;
        uint64_t last = id <= SIM_SERVERS ? b->last_heard_ms[id] : 0;
        if (last == 0)
            last = b->leader_since_ms; /* never heard by this process */
        uint32_t incarnation = id <= SIM_SERVERS ? b->heard_incarnation[id] : 0;
        uint32_t version = id == b->id            ? (uint32_t)b->map.version
                           : id <= SIM_SERVERS ? b->heard_map_version[id]
                                                 : 0;
        heard[n++] = (struct controller_heard){.broker_id = id, .last_heard_ms = last,
                                               .incarnation = incarnation,
                                               .map_version = version};
    }
    return (struct controller_observed){.heard = heard, .heard_count = n,
                                        .liveness_in_flight = b->liveness_in_flight,
                                        .policy_in_flight = b->policy_in_flight,
                                        .proposals_in_flight = b->proposals_in_flight};
}

/* Each broker.state alone: its follow-up (on_applied) knows whose it is. */
static void propose_states(struct sim_broker *b, struct controller_actions *a)
{
    for (uint32_t i = 0; i < a->states.count; i++)
        sim_propose_cmd(b, &a->states.items[i], SIM_STATE, a->state_ids[i]);
}

void sim_controller_liveness(struct sim_broker *b, uint64_t now)
{
    struct controller_heard heard[SIM_SERVERS];
    struct controller_observed seen = observe(b, heard);
    struct controller_actions a;
    controller_actions_init(&a);
    controller_leader_liveness(&b->map, &b->sim->config, &seen, now, &a);
    propose_states(b, &a);
    controller_actions_free(&a);
}

/* node.c's controller_tick for broker b, leader or not. */
static void broker_tick(struct sim *s, struct sim_broker *b, uint64_t now)
{
    bool leads = s->f.servers[b->index].alive &&
                 raft_state(raft_fixture_get(&s->f, b->index)) == RAFT_LEADER;
    if (leads != b->leader) {
        b->leader = leads;
        b->controller_ready = false; /* a new leader waits for its barrier */
    }
    if (!leads) {
        b->leaving_count = 0; /* the leader removes them */
        return;
    }
    sim_member_changes(s, b); /* (consensus.c: whenever it leads) */
    if (!b->controller_ready) {
        /* The barrier: its own broker.join. Once it commits, every entry
         * of earlier terms is applied here too. */
        char name[8];
        snprintf(name, sizeof name, "b%u", b->id);
        struct map_cmd c;
        if (!b->barrier_in_flight &&
            map_cmd_broker_join(&c, b->id, B(name), B("h:5672"), B(name), true,
                                b->incarnation) == OK &&
            sim_propose_cmd(b, &c, SIM_BARRIER, b->id))
            b->barrier_in_flight = true;
        return;
    }
    sim_member_remove_leavers(b);
    sim_member_announce(s, b);
    struct controller_heard heard[SIM_SERVERS];
    struct controller_observed seen = observe(b, heard);
    struct controller_actions a;
    controller_actions_init(&a);
    b->ctl.round.auto_rebalance = true; /* --auto-rebalance */
    controller_leader_tick(&b->map, &s->config, &b->ctl, &seen, now, &a);
    propose_states(b, &a);
    sim_propose_list(b, &a.round, SIM_OTHER, b->id);
    sim_propose_list(b, &a.policies, SIM_POLICY, b->id);
    controller_actions_free(&a);
}

void sim_controller_tick(struct sim *s, uint64_t now)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        hear(s, &s->brokers[i], now);
        broker_tick(s, &s->brokers[i], now);
    }
    sim_requests_tick(s, now);
    /* The data path's timers: replication's tick, parked forwards, clients. */
    sim_link_step(s, now);
    sim_data_primaries_tick(s, now);
    sim_client_parked_tick(s, now);
    sim_client_tick(s, now);
}
