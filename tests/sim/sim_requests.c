/*
 * sim_requests.c: what reaches the leader as requests, one batch at a
 * time: clients' declarations, operators' forget and drain, a restarted
 * broker's sync, and what the data path would ask (in sync, hand over).
 */
#include "sim.h"

#include <string.h>

#include "amqp/table.h"
#include "cluster/placement.h"
#include "lib/errors.h"
#include "sim_data.h"

static void declare_queues(struct sim_broker *leader)
{
    struct map_cmd c;
    struct map_cmd_list list;
    map_cmd_list_init(&list);
    if (map_cmd_vhost_put(&c, B("/")) == OK)
        map_cmd_list_push(&list, &c);
    sim_propose_list(leader, &list, SIM_REQUEST, leader->id);
}

static void place_queues(struct sim *s, struct sim_broker *leader)
{
    struct placement p;
    placement_init(&p, &s->config.placement);
    placement_refresh(&p, &leader->map);
    struct map_cmd_list list;
    map_cmd_list_init(&list);
    for (int i = 0; i < SIM_QUEUES; i++) {
        if (cluster_map_queue(&leader->map, B("/"), B(sim_queue_names[i])) != NULL)
            continue;
        uint8_t factor = (uint8_t)(1 + i % 3); /* 0, 1 and 2 backups */
        struct placement_result r;
        if (placement_place_queue(&p, B("/"), B(sim_queue_names[i]), factor, PLACEMENT_PRIMARY_RING,
                                  BROKER_ID_NONE, &r) != OK)
            continue;
        /* A client's own x-quay-backups: the policies leave it alone. */
        uint8_t args[64];
        struct table_writer w;
        table_writer_init(&w, args, sizeof args);
        table_put_int(&w, "x-quay-backups", factor - 1);
        struct map_queue_decl d = {.vhost = B("/"), .name = B(sim_queue_names[i]),
                                   .durable = !sim_data_nondurable((unsigned)i),
                                   .arguments = table_writer_table(&w),
                                   .primary_id = r.primary_id, .backups_count = r.backups_count,
                                   .replication_factor = factor};
        memcpy(d.backup_ids, r.backup_ids, sizeof d.backup_ids);
        struct map_cmd c;
        if (map_cmd_queue_declare(&c, &d, r.primary_id) == OK)
            map_cmd_list_push(&list, &c);
    }
    placement_free(&p);
    sim_propose_list(leader, &list, SIM_REQUEST, leader->id);
}

/* A primary hands a moving queue over once the move is ready and its
 * copy is quiet (handover.c: no confirm waits, the target has everything;
 * sim_data_quiet). Only from a primary the leader can hear: its request
 * reaches the leader. (The in-sync changes are the data path's own
 * requests: sim_data.c.) */
static void data_path(struct sim *s, struct sim_broker *leader)
{
    const struct cluster_map *map = &leader->map;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        unsigned p = q->primary_id - 1;
        if (!q->available || q->primary_id > s->f.n || !sim_net_reachable(s, p, leader->index) ||
            !s->brokers[p].synced)
            continue; /* (a restarted primary serves once it caught up) */
        const struct map_broker *pb = cluster_map_broker(map, q->primary_id);
        int qi = sim_queue_index(q->name);
        if (pb == NULL || pb->state == BROKER_STATE_DOWN || qi < 0)
            continue;
        struct map_cmd c;
        uint64_t epoch;
        if (sim_data_drop(s, p, (unsigned)qi) == q->epoch) {
            /* mirror.c drop_after_restart's */
            sim_propose_one(leader, map_cmd_queue_delete(&c, q->vhost->name, q->name, q->epoch),
                            &c);
            continue;
        }
        uint32_t to = sim_data_hand_off(s, p, (unsigned)qi, &epoch);
        if (to != BROKER_ID_NONE && epoch == q->epoch) {
            /* mirror.c hand_off_after_restart's */
            sim_propose_one(leader, map_cmd_queue_hand_to_backup(&c, q->vhost->name, q->name,
                                                                 q->epoch, to), &c);
            continue;
        }
        if (map_queue_move_state(map, q) == MAP_MOVE_READY &&
            sim_data_quiet(s, p, (unsigned)qi, q->move_to)) {
            sim_propose_one(leader, map_cmd_queue_hand_over(&c, q->vhost->name, q->name,
                                                            q->epoch, q->move_to), &c);
        }
    }
}

/* node__sync_tick: a broker that has not caught up since it started
 * sends a sync through the leader it knows (again after a second, as
 * node_request.c resends). */
static void sync_requests(struct sim *s, struct sim_broker *leader, uint64_t now)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        struct sim_broker *b = &s->brokers[i];
        raft_id known;
        const char *address;
        raft_leader(raft_fixture_get(&s->f, i), &known, &address);
        if (b->synced || known != leader->id || !sim_net_reaches(s, i, leader->index) ||
            (b->sync_id != 0 && now < b->sync_sent_ms + 1000))
            continue;
        struct map_cmd c;
        if (map_cmd_sync(&c) != OK)
            continue;
        uint64_t id = (uint64_t)b->id << 32 | ++b->syncs;
        if (sim_propose_entry(leader, &c, id, SIM_REQUEST, leader->id)) {
            b->sync_id = id;
            b->sync_sent_ms = now;
        }
    }
}

/* Clients and operators: requests that reach the leader (the fixture's),
 * one batch at a time, as the data path's own requests. */
void sim_requests_tick(struct sim *s, uint64_t now)
{
    unsigned li = raft_fixture_leader_index(&s->f);
    if (li >= s->f.n)
        return;
    struct sim_broker *leader = &s->brokers[li];
    sync_requests(s, leader, now);
    if (!leader->controller_ready || leader->proposals_in_flight > 0)
        return;
    if (!s->declared) {
        s->declared = true;
        declare_queues(leader);
        return;
    }
    if (leader->map.queues_count < SIM_QUEUES && raft_fixture_time(&s->f) > 1000) {
        place_queues(s, leader);
        return;
    }
    if (s->forget_asked >= 0) {
        /* An operator forgets a dead broker (POST /api/cluster/forget),
         * again until it is gone from the map (refused while it is not
         * down yet, or when the map moved under the decision). */
        uint32_t id = (uint32_t)s->forget_asked + 1;
        struct map_cmd_list list;
        map_cmd_list_init(&list);
        struct controller_forget_report report;
        controller_forget(&leader->map, &s->config, id, &list, &report);
        if (cluster_map_broker(&leader->map, id) == NULL)
            s->forget_asked = -1;
        sim_propose_list(leader, &list, SIM_REQUEST, leader->id);
        if (list.count > 0 || report.refusal != CONTROLLER_FORGET_NOT_DOWN)
            return;
    }
    if (s->drain_asked >= 0) {
        /* An operator's drain (POST /api/cluster/drain): marks it draining. */
        struct map_cmd_list list;
        map_cmd_list_init(&list);
        bool done;
        controller_drain(&leader->map, &s->config, (uint32_t)s->drain_asked + 1,
                         SIM_DRAIN_MOVES, &list, &done);
        s->drain_asked = -1;
        sim_propose_list(leader, &list, SIM_REQUEST, leader->id);
        return;
    }
    data_path(s, leader);
}
