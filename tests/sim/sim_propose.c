/*
 * sim_propose.c: proposing, as node.c's propose, and the follow-ups of its
 * on_proposal_done: a committed barrier makes the leader's controller
 * ready, a committed broker.state gets controller_after_state, and the
 * in-flight counts the controller is given go down.
 */
#include "sim.h"

#include <stdlib.h>

#include "lib/errors.h"

struct sim_apply {
    struct raft_apply req;  /* first: libraft's callback casts back */
    struct sim_broker *broker;
    enum sim_kind kind;
    uint32_t broker_id;     /* SIM_STATE: whose state */
};

static void on_applied(struct raft_apply *req, int status, void *result)
{
    struct sim_apply *a = (struct sim_apply *)req;
    struct sim_broker *b = a->broker;
    struct sim *s = b->sim;
    bool ok = status == 0 && result == NULL;
    bool leads = raft_state(raft_fixture_get(&s->f, b->index)) == RAFT_LEADER;
    b->proposals_in_flight--;
    if (a->kind == SIM_BARRIER) {
        b->barrier_in_flight = false;
        if (status == 0 && leads) {
            b->controller_ready = true;
            b->leader_since_ms = raft_fixture_time(&s->f);
            controller_leader_start(&b->ctl, b->leader_since_ms);
            sim_controller_liveness(b, b->leader_since_ms); /* a dead leader: at once */
        }
    } else if (a->kind == SIM_STATE) {
        b->liveness_in_flight--;
        if (ok && leads) {
            struct map_cmd_list list;
            map_cmd_list_init(&list);
            controller_after_state(&b->map, &s->config, a->broker_id, &list);
            sim_propose_list(b, &list, SIM_OTHER, a->broker_id);
        }
    } else if (a->kind == SIM_POLICY) {
        b->policy_in_flight--;
    } else if (a->kind == SIM_JOIN && a->broker_id <= SIM_SERVERS) {
        b->join_in_flight[a->broker_id] = false;
    }
    free(a);
}

bool sim_propose_entry(struct sim_broker *b, struct map_cmd *cmd, uint64_t request_id,
                       enum sim_kind kind, uint32_t broker_id)
{
    struct sim *s = b->sim;
    struct raft_buffer buf = sim_fsm_entry(cmd, request_id);
    struct sim_apply *a = calloc(1, sizeof *a);
    *a = (struct sim_apply){.broker = b, .kind = kind, .broker_id = broker_id};
    if (raft_apply(raft_fixture_get(&s->f, b->index), &a->req, &buf, 1, on_applied) != 0) {
        raft_free(buf.base);
        free(a);
        return false; /* not the leader any more: decided again by whoever is */
    }
    b->proposals_in_flight++;
    if (kind == SIM_STATE)
        b->liveness_in_flight++;
    else if (kind == SIM_POLICY)
        b->policy_in_flight++;
    s->proposed++;
    return true;
}

bool sim_propose_cmd(struct sim_broker *b, struct map_cmd *cmd, enum sim_kind kind,
                     uint32_t broker_id)
{
    return sim_propose_entry(b, cmd, 0, kind, broker_id);
}

/* Proposes the list's commands (consumed), each alone. */
void sim_propose_list(struct sim_broker *b, struct map_cmd_list *list, enum sim_kind kind,
                      uint32_t broker_id)
{
    for (uint32_t i = 0; i < list->count; i++)
        sim_propose_cmd(b, &list->items[i], kind, broker_id);
    map_cmd_list_free(list);
}

void sim_propose_one(struct sim_broker *b, int build_rc, struct map_cmd *cmd)
{
    if (build_rc != OK) {
        sim_fail(b->sim, "a command could not be built");
        return;
    }
    sim_propose_cmd(b, cmd, SIM_REQUEST, b->id);
}
