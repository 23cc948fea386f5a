/*
 * sim.h: what the pieces of the control-plane simulator share (tests/sim;
 * sim_control.c says what it simulates and checks). One simulated cluster
 * is a struct sim; each module below owns one part of a run:
 *   sim.c             one seed: its randomness, its failure, the fixture's
 *                     servers, simulated time and the controller ticks;
 *   sim_net.c         the network as the controller sees it (cuts);
 *   sim_fsm.c         the FSM: every broker applies the log to its own map;
 *   sim_propose.c     proposing (node.c's propose, on_proposal_done);
 *   sim_controller.c  node.c's controller tick on every broker;
 *   sim_member.c      consensus.c's member changes, node.c's announce;
 *   sim_requests.c    clients, operators and the data path: requests to
 *                     the leader;
 *   sim_fault.c       faults and operators' actions drawn from the seed;
 *   sim_check.c       the checkers, after every apply and at the end;
 *   sim_link.c        the data path's links over the network (sim_data.h);
 *   sim_data.c        the data path's primaries and backups: replication;
 *   sim_client.c      publishers, proxies' forwards, consumers;
 *   sim_data_check.c  the data path's checkers (no confirmed message lost,
 *                     no two epochs confirming at once, streams in order);
 *   sim_disk.c        the seam over the fixture's disk (sim_disk.h);
 *   sim_control.c     the program: which seeds, in how many processes.
 */
#ifndef QUAY_SIM_H
#define QUAY_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <raft.h>
#include <raft/fixture.h>

#include "cluster/controller.h"
#include "cluster/fence.h"
#include "cluster/map.h"
#include "sim_disk.h"

#define SIM_BROKERS 5              /* at the start; others join */
#define SIM_SERVERS RAFT_FIXTURE_MAX_SERVERS /* ever started: up to 3 joiners */
#define SIM_QUEUES 40
#define SIM_TICK_MS 100
#define SIM_FAULT_MIN_MS 1500
#define SIM_FAULT_MAX_MS 5000
#define SIM_HEAL_BOUND_MS 30000     /* after the last fault: converged by then */
#define SIM_DRAIN_MOVES 8        /* an operator's first drain call */
#define SIM_EPOCHS_MAX 65536        /* (queue, epoch) pairs remembered */
#define SIM_SNAPSHOT_EVERY 64       /* entries (quayd: 1024) */
#define SIM_SETTLE_MS 1000          /* a dead server's last I/O has landed by then */

#define B(s) bytes_of_cstr(s)

struct sim;

/* What the checkers remember of one queue as one broker last saw it. */
struct shadow {
    bool known;
    bool available;
    uint32_t primary_id;
    uint64_t epoch;
    uint32_t in_sync[CLUSTER_BACKUPS_MAX];
    uint8_t in_sync_count;
};

struct sim_broker {
    struct sim *sim;
    unsigned index;                /* in the fixture */
    uint32_t id;                   /* map and Raft id: index + 1 */
    struct cluster_map map;
    struct raft_fsm fsm;
    struct sim_disk disk;          /* its Raft log's disk (sim_disk.h) */
    struct shadow shadows[SIM_QUEUES];
    /* node.c's controller state (node_int.h), kept as node.c keeps it. */
    bool leader;                   /* Raft leader at the last tick */
    bool controller_ready;         /* leader, and its barrier committed */
    bool barrier_in_flight;
    uint64_t leader_since_ms;
    struct controller_leader ctl;  /* controller_leader_tick's memory */
    uint32_t proposals_in_flight, liveness_in_flight, policy_in_flight;
    uint64_t last_heard_ms[SIM_SERVERS + 1]; /* its peers' heartbeats */
    /* Its process (node.c's peers[0].incarnation: a restart draws another)
     * and, per peer, the one its heartbeats last said. */
    uint32_t incarnation;
    uint64_t known_since; /* node.c's: the map version that first named it */
    /* node.c's restart_index, restart_version: the last entry of its log
     * when this process started, and the map version once it is applied */
    uint64_t restart_index, restart_version;
    bool starting;        /* inside raft_start (a snapshot restored is our own) */
    uint32_t heard_incarnation[SIM_SERVERS + 1];
    uint32_t heard_map_version[SIM_SERVERS + 1]; /* the map its heartbeats say it applied */
    /* What its peers' heartbeats count for its lease (node.c's peer->lease:
     * a heartbeat counts once its map reached the sender's version). */
    struct fence_heard lease_heard[SIM_SERVERS + 1];
    bool forgotten;                /* dead for good: an operator forgot it (its disk is gone) */
    bool joining;                  /* started empty: asks to join the Raft members */
    /* node.c's leaving and departed (broker.leave applied: the leader
     * removes it from Raft) and consensus.c's one member change at a time. */
    uint32_t leaving[SIM_SERVERS], leaving_count;
    uint32_t departed[SIM_SERVERS], departed_count;
    bool join_in_flight[SIM_SERVERS + 1]; /* leader: a broker.join proposed for it */
    struct raft_change change;
    bool change_waiting;
    /* node_request.c's sync: a process serves (its queues, its clients)
     * once its own sync, sent through the leader, is applied here. */
    bool synced;
    uint64_t sync_id;               /* the request id of the sync in flight; 0: none */
    uint64_t sync_sent_ms, syncs;
    uint64_t synced_ms; /* when (member.c's synced_ms) */
    /* What the last incarnation had applied, and so may have acted on
     * (served, answered): a restarted one serves from a map at least as new. */
    bool restarted;
    uint64_t killed_ms;
    uint64_t version_before;
    struct shadow shadows_before[SIM_QUEUES];
};

/* (queue, epoch) -> the primary every broker's map must agree on. */
struct epoch_record {
    uint32_t queue;
    uint64_t epoch;
    uint32_t primary_id;
};

struct sim_data; /* sim_data.h */

struct sim {
    uint64_t seed;
    uint64_t rng;
    bool verbose;
    struct raft_fixture f;
    struct sim_broker brokers[SIM_SERVERS];
    bool cut[SIM_SERVERS][SIM_SERVERS]; /* [i][j]: what i sends j is lost */
    int forget_asked;                   /* a broker index an operator forgets, or -1 */
    int drain_asked;                    /* a broker index an operator drains, or -1 */
    struct controller_config config;
    bool declared;
    struct epoch_record *epochs;
    uint32_t epochs_count;
    struct sim_data *data;         /* the data path (sim_data.h) */
    uint64_t net_changes;          /* grows with every cut, mend, kill and revive */
    uint64_t watch_version;        /* --watch: the newest map version printed */
    char failure[512];
    uint64_t trace;                /* a hash of what happened: equal for equal seeds */
    uint64_t applied, proposed, faults;
};

/* --watch Q: the data path prints what happens to queue Q (sim_data_check.c). */
extern int sim_watch_queue;
/* --strict: a known loss (sim_data_known_loss) fails the seed too. */
extern bool sim_data_strict;

/* q0 .. q39, set once before any seed runs (sim_control.c's main). */
extern char sim_queue_names[SIM_QUEUES][16];

/* sim.c */
uint64_t sim_random_below(struct sim *s, uint64_t n);
/* Folds v into the seed's trace (equal seeds, equal traces). */
void sim_trace(struct sim *s, uint64_t v);
bool sim_failed(const struct sim *s);
/* The seed's first failure (later ones are dropped), at the simulated time. */
__attribute__((format(printf, 2, 3))) void sim_fail(struct sim *s, const char *fmt, ...);
/* sim_queue_names' index of name, or -1. */
int sim_queue_index(struct bytes name);
void sim_tune(struct raft *r);
bool sim_join_new(struct sim *s);
void sim_run_until(struct sim *s, uint64_t until_ms);
int sim_run_seed(uint64_t seed, uint64_t seconds, bool verbose, uint64_t *trace_out);

/* sim_net.c: cut[i][j] over the fixture's links. */
bool sim_net_reaches(const struct sim *s, unsigned i, unsigned j);
bool sim_net_reachable(const struct sim *s, unsigned i, unsigned j);
void sim_net_cut(struct sim *s, unsigned i, unsigned j, bool on);
unsigned sim_net_cuts_count(const struct sim *s);

/* sim_fsm.c */
void sim_fsm_init(struct sim_broker *b);
struct raft_buffer sim_fsm_entry(struct map_cmd *cmd, uint64_t request_id);

/* sim_propose.c: what a proposal is for (its follow-up in on_applied). */
enum sim_kind { SIM_BARRIER, SIM_STATE, SIM_POLICY, SIM_JOIN, SIM_OTHER, SIM_REQUEST };

bool sim_propose_entry(struct sim_broker *b, struct map_cmd *cmd, uint64_t request_id,
                       enum sim_kind kind, uint32_t broker_id);
bool sim_propose_cmd(struct sim_broker *b, struct map_cmd *cmd, enum sim_kind kind,
                     uint32_t broker_id);
void sim_propose_list(struct sim_broker *b, struct map_cmd_list *list, enum sim_kind kind,
                      uint32_t broker_id);
void sim_propose_one(struct sim_broker *b, int build_rc, struct map_cmd *cmd);

/* sim_controller.c */
void sim_controller_liveness(struct sim_broker *b, uint64_t now);
void sim_controller_tick(struct sim *s, uint64_t now);

/* sim_member.c */
const struct raft_server *sim_member_of(struct raft *r, uint32_t id);
void sim_member_changes(struct sim *s, struct sim_broker *b);
void sim_member_remove_leavers(struct sim_broker *b);
void sim_member_announce(struct sim *s, struct sim_broker *b);

/* sim_requests.c */
void sim_requests_tick(struct sim *s, uint64_t now);

/* sim_fault.c */
void sim_fault_inject(struct sim *s);
void sim_fault_heal_all(struct sim *s);
void sim_fault_undrain_all(struct sim *s);

/* sim_check.c */
void sim_check_queues(struct sim *s, struct sim_broker *b);
bool sim_check_converged(struct sim *s, char *why, size_t why_size);

#endif
