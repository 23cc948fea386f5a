/*
 * controller.h: the decisions of the controller (the Raft leader), as pure
 * functions from (map, event, now) to a list of commands.
 *
 * Owns the rules: when a broker becomes suspect or down, who takes over
 * each of a failed broker's queues, how replication factors are restored,
 * what a returning broker gets back, and how draining and rebalancing turn
 * a placement plan into commands. Every queue command carries the epoch it
 * was decided at (compare-and-set), so a decision made on a map that has
 * moved on is refused at apply time and simply decided again next round.
 *
 * Must never do I/O, read a clock (now_ms is a parameter), draw random
 * numbers, or change the map: the caller proposes the commands through
 * consensus and applies them when they commit, like everyone else.
 */
#ifndef QUAY_CLUSTER_CONTROLLER_H
#define QUAY_CLUSTER_CONTROLLER_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster/map.h"
#include "cluster/placement.h"

struct controller_config {
    uint64_t suspect_after_ms; /* silence before a broker is suspect (1 s) */
    uint64_t down_after_ms;    /* silence before it is down and failed over (2 s) */
    uint8_t default_backups;   /* --default-backups: no x-quay-backups, no policy (1) */
    struct placement_config placement;
};

void controller_config_default(struct controller_config *config);

/* What the controller's broker knows about a peer's liveness. */
struct controller_heard {
    uint32_t broker_id;
    uint64_t last_heard_ms;  /* last heartbeat or message, controller's clock */
    bool connection_reset;   /* the cluster link was reset: down at once */
    uint32_t incarnation;    /* its process, from its heartbeats (0: not heard) */
    /* The map version it has applied, as its heartbeats say (their low 32
     * bits; the leader's own: its map's), 0 if not heard. */
    uint32_t map_version;
    bool stopping;           /* it said it is stopping (connection_reset is set too) */
};

/*
 * (a) Liveness. For each broker in heard[] (others are left alone):
 * up -> suspect after suspect_after_ms of silence; up/suspect/draining ->
 * down after down_after_ms or on a connection reset; suspect -> up when
 * heard again; down -> up when heard again (restart). Appends broker.state
 * commands to out. OK.
 */
int controller_check_liveness(const struct cluster_map *map, const struct controller_config *config,
                              const struct controller_heard *heard, uint32_t heard_count,
                              uint64_t now_ms, struct map_cmd_list *out);

/*
 * (a') Restarts. For each broker in heard[] whose incarnation is known and
 * is not the map's: broker.incarnation, which takes it out of every
 * in-sync set (its replicas went with its process). Appends to out. OK.
 */
int controller_check_incarnations(const struct cluster_map *map,
                                  const struct controller_heard *heard, uint32_t heard_count,
                                  struct map_cmd_list *out);

/*
 * (b) Failover, once the map says broker_id is down. For each queue it
 * owned: an exclusive queue is deleted (its connection is gone); otherwise
 * its first in-sync backup that is alive becomes primary (epoch + 1) and
 * the backups are refilled to the replication factor; with no in-sync
 * backup the queue is marked unavailable. For each queue it backed up: it
 * is replaced by a new backup from placement. Exchanges it owned get a new
 * owner. Does nothing unless the broker is down. OK.
 */
int controller_fail_over(const struct cluster_map *map, const struct controller_config *config,
                         uint32_t broker_id, struct map_cmd_list *out);

/*
 * (b0) A primary restarted before the map saw it down (its map still names
 * it the queue's primary once it caught up): its journal recovered the
 * persistent messages (a non-durable queue: nothing), what only its memory
 * held is gone, and its in-sync backups hold everything it ever confirmed.
 * The backup it hands the queue to (queue.set_owner, as a failover would)
 * rather than serve what it recovered: the first in-sync backup, in the
 * queue's order, that is up or draining and whose process is the one the
 * map knows (heard[]: the restarted broker's view of its peers'
 * incarnations; one not heard, or heard with another incarnation, may
 * have restarted too, its replica gone with it, before the map cleared it
 * from the in-sync set).
 *
 * BROKER_ID_NONE: serve it. None qualifies; or the queue was given to the
 * present process (owned since known_since, the map version at which the
 * map first named it: cluster_node_known_since), which holds all it ever
 * had; or it is exclusive, or a takeover from shared storage not said
 * adopted yet (which resumes). A queue whose backups hold only its
 * transient messages (x-quay-replicate "transient") goes to such a backup
 * as a takeover that reads the restarted broker's log too
 * (controller_restart_with_log). *wait, with none: an in-sync backup may
 * yet take it, one that is up or draining but not heard at all yet
 * (incarnation 0, or not in heard[]: its first heartbeat after the restart
 * may still be to come) or one the map suspects (it is up or down within
 * the controller's down_after_ms); the caller waits for that, up to
 * CONTROLLER_RESTART_WAIT_MS after its sync, before serving (or dropping:
 * controller_restart_drops) without it. Pure.
 */
#define CONTROLLER_RESTART_WAIT_MS 3000
uint32_t controller_restart_successor(const struct cluster_map *map, const struct map_queue *q,
                                      const struct controller_heard *heard,
                                      uint32_t heard_count, uint64_t known_since,
                                      bool *wait);

/*
 * (b0'') The hand-off of (b0) to successor, when successor holds the
 * transient messages only (x-quay-replicate "transient") and shares the
 * restarted primary's storage: the persistent ones are in the restarted
 * broker's log, which it closes without a write (durable_abandon_log) as
 * successor takes the queue over with its replica (queue.take_over,
 * replica and restarted): successor reads that log and merges, as after
 * its primary's death ((b''), controller_takes_over_with_replica). False:
 * a plain hand-off (successor holds everything: the primary replicates
 * all of it to a backup that does not share its storage). Pure.
 */
bool controller_restart_with_log(const struct cluster_map *map, const struct map_queue *q,
                                 uint32_t successor);

/*
 * (b0') Such a queue that no backup takes (controller_restart_successor:
 * none), on broker self_id once it caught up: true if it is not durable
 * and was self_id's before its restart (owned since at most
 * restart_version: cluster_node_restart_version). What it held went with
 * the process that held it, as RabbitMQ's transient queue goes with its
 * node, and the map deletes it. False: it serves (durable: what its
 * journal recovered; or given to self_id since it was back). Pure.
 */
bool controller_restart_drops(const struct map_queue *q, uint32_t self_id,
                              uint64_t restart_version);

/*
 * (b') Takeover from shared storage, part of (b): a durable queue whose
 * primary is down with no in-sync backup to promote goes, when the dead
 * broker announced a shared storage (broker.storage), to a broker that is
 * up and shares it and is not one of the queue's backups: the first in the
 * queue's ring order that is under the placement bound (else the first).
 * That broker adopts the dead one's log of the queue (queue.take_over);
 * backups for the factor follow. Counts the choice in p. BROKER_ID_NONE
 * when no broker qualifies (the queue is then marked unavailable, as
 * without shared storage, and repair tries again when one comes up).
 */
uint32_t controller_takeover_target(struct placement *p, const struct map_queue *q);
/* (b'') A queue with x-quay-replicate "transient" whose primary is down:
 * its in-sync backup (promotion's choice) holds the transient messages
 * only. When it shares the dead primary's storage it takes the queue over
 * keeping its replica (queue.take_over with replica) and merges it with
 * the log, which holds the persistent ones; else it is promoted as any
 * backup (the primary replicated everything to a backup that does not
 * share its storage: replication.c). */
bool controller_takes_over_with_replica(const struct cluster_map *map, const struct map_queue *q,
                                        uint32_t backup);

/* (c) A broker is up again: its unavailable queues become available with
 * epoch + 1. Does nothing unless the broker is up. OK. */
int controller_broker_returned(const struct cluster_map *map, uint32_t broker_id,
                               struct map_cmd_list *out);

/*
 * (c') Repair: what (b) and (c) would have decided and the map does not
 * show yet (a decision refused because the map moved meanwhile, a leader
 * that died halfway through a failover, a broker that came back and makes
 * a full replication factor possible again): queues whose primary is down,
 * unavailable queues whose primary is up, backups on brokers that are
 * down, fewer backups than the factor wants while a broker could take
 * one. Exchanges owned by a broker that is down get a new owner. A backup
 * move whose new backup is in sync ends: the backup it replaces leaves
 * (map_queue.move_from). Idempotent on a map that needs nothing (no
 * commands). OK.
 */
int controller_repair(const struct cluster_map *map, const struct controller_config *config,
                      struct map_cmd_list *out);

/*
 * (d) One rebalancing round: plans at most moves_max moves
 * (placement_rebalance_plan; moves in progress are planned again and
 * count) and emits the next step of each:
 *   primary move -> queue.move to the target (the primary hands over once
 *     it is an in-sync backup: handover.h); a queue already moving keeps
 *     its move;
 *   backup move -> queue.set_backups adding the replacement beyond the
 *     factor; once it is in sync, queue.set_backups without the backup it
 *     replaces (at once if that one is on a broker that is down, or not
 *     in sync; swapped if there is no room for both).
 * Exchanges owned by brokers that are not up get an owner that is.
 * Call it again after the commands commit (and after in-sync changes);
 * *pending_out (may be NULL) counts moves still waiting. OK.
 */
int controller_rebalance(const struct cluster_map *map, const struct controller_config *config,
                         uint32_t moves_max, struct map_cmd_list *out, uint32_t *pending_out);

/* (d) Draining: the first call marks the broker draining; later calls are
 * rounds of the moves that take everything off it (only those: no
 * balancing among the others). *done_out says it owns and holds nothing
 * any more (then broker.leave may follow). OK. */
int controller_drain(const struct cluster_map *map, const struct controller_config *config,
                     uint32_t broker_id, uint32_t moves_max, struct map_cmd_list *out,
                     bool *done_out);
/* The leader's round for every draining broker that still holds
 * something (its mandatory moves, at most moves_max in progress). OK. */
int controller_drain_step(const struct cluster_map *map, const struct controller_config *config,
                          uint32_t moves_max, struct map_cmd_list *out);

/*
 * (f) Forgetting a broker that is dead for good (down in the map; a broker
 * that is up, suspect or draining, or unknown, is refused: report->refusal).
 * Everything it still has goes elsewhere: each queue it was primary of
 * fails over as in (b) to an in-sync backup (promoted), or, with none,
 * starts again empty on a broker placement picks (emptied: its messages
 * were only on the forgotten broker), with its definition and bindings;
 * an exclusive queue of one of its connections is deleted; each queue it
 * backed up gets a replacement backup; each exchange it owned an owner
 * that is up. Then broker.leave, which the leader follows by removing it
 * from the Raft members (and so from every majority). Commands carry
 * epochs as in (b): one refused because the map moved makes broker.leave
 * refused too ("still owns"), and forgetting again decides afresh. OK.
 */
enum controller_forget_refusal {
    CONTROLLER_FORGET_OK = 0,
    CONTROLLER_FORGET_UNKNOWN,  /* no such broker in the map */
    CONTROLLER_FORGET_NOT_DOWN, /* up, suspect or draining: stop it or drain it */
    CONTROLLER_FORGET_NO_ROOM,  /* no broker that is up to take its queues */
};
struct controller_forget_report {
    enum controller_forget_refusal refusal;
    uint32_t promoted, emptied, deleted, backups_replaced, exchanges_moved;
};
int controller_forget(const struct cluster_map *map, const struct controller_config *config,
                      uint32_t broker_id, struct map_cmd_list *out,
                      struct controller_forget_report *report);

/*
 * (e) Replication policies (map policies, broker/policy.h), after they
 * changed: every queue that is not exclusive and has no x-quay-backups of
 * its own, whose replication factor is not what its best matching policy
 * (or default_backups) asks for, gets one queue.set_backups with the new
 * factor: fewer backups keep the in-sync ones first; more are picked by
 * placement (the primary then catches them up, replica.c). OK.
 */
int controller_apply_policies(const struct cluster_map *map,
                              const struct controller_config *config, struct map_cmd_list *out);

/* The leader's periodic round (below). */
#define CONTROLLER_REPAIR_EVERY_MS 500
/* Draining: a round of moves every 100 ms, each keeping at most
 * CONTROLLER_DRAIN_MOVES moves in progress (a move is a catch-up, then a
 * handover of a few ms). */
#define CONTROLLER_DRAIN_EVERY_MS 100
#define CONTROLLER_DRAIN_MOVES 128
/* Rebalancing (the map's rebalance mode) goes as draining does; a round
 * that found nothing to do is not run again until the map changes. When
 * automatic, it waits until the brokers' states have been still for
 * CONTROLLER_REBALANCE_SETTLE_MS: a failover in progress or a flapping
 * broker is no reason to move queues about. */
#define CONTROLLER_REBALANCE_EVERY_MS 100
#define CONTROLLER_REBALANCE_MOVES 128
#define CONTROLLER_REBALANCE_SETTLE_MS 3000

/* What the leader remembers between rounds. Zeroed once; leader_since_ms
 * set whenever it becomes the leader. */
struct controller_round {
    uint64_t leader_since_ms;
    uint64_t repaired_ms, drained_ms, rebalanced_ms; /* the last round of each */
    uint64_t balanced_version;       /* the map's version when nothing was left to move */
    uint64_t brokers_seen;           /* the map's brokers_version at the last round ... */
    uint64_t brokers_still_since_ms; /* ... and since when it has been so */
    bool auto_rebalance;             /* --auto-rebalance: a map that never set the mode */
};

enum controller_round_kind {
    CONTROLLER_ROUND_NOTHING,
    CONTROLLER_ROUND_REPAIR,
    CONTROLLER_ROUND_DRAIN,
    CONTROLLER_ROUND_REBALANCE,
    CONTROLLER_ROUND_REBALANCED,     /* a "once" rebalance found nothing left: done */
    CONTROLLER_ROUND_REBALANCE_MODE, /* a map that never set the mode gets the default */
};

/*
 * (f) The leader's periodic round, every tick after liveness and the
 * failovers: the first, in this order, that is due and has something to
 * do of repair (every CONTROLLER_REPAIR_EVERY_MS), the draining brokers'
 * next moves and rebalancing as the map's mode says. busy: the leader's
 * own proposals are still in flight (then only the brokers' stillness is
 * followed: decide on the map they make). node.c and the simulator
 * (tests/sim) both run it. *kind and *pending (may be NULL: moves still
 * in progress) say what it did, for the caller's log. seen (or NULL: all
 * settled): the drain and the rebalance leave alone a queue whose primary
 * has not yet applied the change that made it so (its heartbeats' map
 * version below the queue's owned_since), and the repair releases the old
 * primary that a switch kept beyond the factor of a queue without backups
 * (map_queue_switch_keeps_primary) only once it has. OK.
 */
struct controller_observed;
int controller_round(const struct cluster_map *map, const struct controller_config *config,
                     struct controller_round *round, const struct controller_observed *seen,
                     uint64_t now_ms, bool busy, struct map_cmd_list *out,
                     enum controller_round_kind *kind, uint32_t *pending);

/*
 * (g) The leader's tick: what node.c's controller loop and the simulator
 * (tests/sim) both run, in one order, so the simulator tests what a
 * broker does. Given the map, what the leader observed (heard[]: one
 * entry per broker of the map) and what it has in flight, it returns the
 * actions; the caller proposes them in this order:
 *   states   - restarts (a'), else liveness (a), unless one of either is
 *              still in flight; one command per broker (states.items[i] is
 *              about state_ids[i]): once one commits, its follow-up is
 *              controller_after_state. A restart goes first and alone, so
 *              every failover decided after it (its follow-ups, the
 *              round) comes later in the log and finds the restarted
 *              broker out of the in-sync sets: it is never promoted with
 *              the replicas it lost;
 *   round    - the periodic round (f), busy when anything of the leader's
 *              is in flight or states has commands;
 *   policies - (e), when the map's policies changed since the last batch
 *              or the last batch had commands (or the leader is new),
 *              unless a batch is in flight.
 * Joins of new Raft members and removals of leavers come before it (they
 * need the Raft membership: the caller's). OK.
 */
struct controller_leader {
    struct controller_round round;
    uint64_t policies_applied; /* the map's policies_generation they followed */
    bool policies_recheck;     /* look again (a new leader, or a batch had commands) */
};

struct controller_observed {
    const struct controller_heard *heard;
    uint32_t heard_count;
    uint32_t liveness_in_flight; /* broker.state proposals not answered yet */
    uint32_t policy_in_flight;   /* policies' commands not answered yet */
    uint32_t proposals_in_flight; /* everything of the leader's, those included */
};

struct controller_actions {
    struct map_cmd_list states;
    uint32_t state_ids[CLUSTER_BROKERS_MAX];
    struct map_cmd_list round;
    enum controller_round_kind round_kind;
    uint32_t round_pending; /* moves still in progress (for the log) */
    struct map_cmd_list policies;
};

void controller_actions_init(struct controller_actions *a);
void controller_actions_free(struct controller_actions *a);

/* A leader's barrier committed: it starts deciding (a fresh round). */
void controller_leader_start(struct controller_leader *leader, uint64_t now_ms);

/* Only the liveness part of the tick (the leader runs it at once when its
 * barrier commits: a dead leader is failed over without waiting). OK. */
int controller_leader_liveness(const struct cluster_map *map,
                               const struct controller_config *config,
                               const struct controller_observed *seen, uint64_t now_ms,
                               struct controller_actions *out);

int controller_leader_tick(const struct cluster_map *map, const struct controller_config *config,
                           struct controller_leader *leader, const struct controller_observed *seen,
                           uint64_t now_ms, struct controller_actions *out);

/* A broker.state the tick proposed committed: a broker now down is failed
 * over (b), one up again gets its queues back (c); otherwise nothing. OK. */
int controller_after_state(const struct cluster_map *map, const struct controller_config *config,
                           uint32_t broker_id, struct map_cmd_list *out);

#endif
