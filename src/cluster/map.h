/*
 * map.h: the cluster map, the replicated state machine every broker holds.
 *
 * Owns the cluster-wide definitions: brokers (with their liveness state),
 * vhosts, users, exchanges with their bindings, and for every queue its
 * owner ("primary"), its ordered backups, the in-sync subset, its
 * replication factor and its epoch. Every change is a command: an AMQP
 * field table built by one of the map_cmd_*() functions, committed through
 * consensus (cluster/consensus.h) and applied in log order by
 * cluster_map_apply() on every broker. Snapshots are table-encoded too.
 *
 * Must never do I/O, read a clock, or use randomness: applying the same
 * commands in the same order gives the same map, byte for byte in its
 * snapshot, on every broker. In particular, nothing that changes state may
 * depend on hash-table iteration order (the hash is seeded per process):
 * objects are kept in dense arrays whose order only depends on the
 * commands, and the hash tables are only indexes.
 *
 * Commands come off the network: apply validates every one and answers a
 * malformed command with E_SYNTAX, never a crash. A well-formed command
 * that cannot be applied (an inequivalent redeclare, a missing vhost, a
 * stale epoch) is refused with an AMQP reply code, and the map is left
 * exactly as it was, so that every broker refuses it identically.
 *
 * Memory: allocation failure aborts (as hmap does); limits on counts are
 * refusals with reply code 406.
 */
#ifndef QUAY_CLUSTER_MAP_H
#define QUAY_CLUSTER_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "amqp/table.h"
#include "lib/errors.h"
#include "lib/types.h"
#include "broker/limits.h"
#include "broker/policy.h"
#include "lib/hash.h"
#include "lib/list.h"

/* ---- limits ---------------------------------------------------------------- */

#define CLUSTER_BROKERS_MAX 64      /* members, voting or not */
#define CLUSTER_VOTERS_MAX 5        /* DESIGN §3: up to 5 brokers vote */
#define CLUSTER_BACKUPS_MAX 3       /* x-quay-backups 0..3 */
#define CLUSTER_NAME_SIZE_MAX 255   /* names and addresses are shortstrs */
#define CLUSTER_ARGUMENTS_SIZE_MAX (64u * 1024)
#define CLUSTER_CMD_SIZE_MAX (1u << 20)     /* a single command */
#define CLUSTER_QUEUES_MAX (1u << 20)
#define CLUSTER_EXCHANGES_MAX (1u << 20)
#define CLUSTER_BINDINGS_MAX (1u << 22)
#define CLUSTER_VHOSTS_MAX (1u << 16)
#define CLUSTER_USERS_MAX (1u << 16)
#define CLUSTER_USER_LIST_MAX 1024  /* vhosts or tags of one user */
#define MAP_REPLY_TEXT_SIZE 256
#define MAP_STORAGE_ID_SIZE_MAX 64  /* broker.storage */

/* Broker id 0 means "none" everywhere (no owner, no backup). */
#define BROKER_ID_NONE 0u

/* cluster_map_apply's refusal (E_MAP_REFUSED) is in lib/errors.h. */

/* ---- the objects ----------------------------------------------------------- */

/* Liveness, decided by the controller (controller.h). Only UP brokers get
 * new queues, backups or moves; SUSPECT ones keep what they have. */
enum broker_state {
    BROKER_STATE_UP = 0,
    BROKER_STATE_SUSPECT = 1,  /* missed heartbeats, not yet failed over */
    BROKER_STATE_DOWN = 2,     /* failed over: owns only unavailable queues */
    BROKER_STATE_DRAINING = 3, /* alive, giving everything away */
};

/* Owned by the map. Strings are owned copies. */
struct map_broker {
    uint32_t id; /* never BROKER_ID_NONE */
    enum broker_state state;
    bool voter;
    struct bytes name;
    struct bytes amqp_address;    /* "host:port" clients connect to */
    struct bytes cluster_address; /* "host:port" brokers connect to */
    /* --shared-storage's id (broker.storage): brokers with the same
     * non-empty id mount the same directory and can take over each other's
     * queue logs (docs/ARCHITECTURE.md, shared storage). Empty: none. */
    struct bytes storage_id;
    /* The broker's process as the controller last heard it (its
     * heartbeats' incarnation, broker.incarnation): a new one is a restart,
     * which lost the replicas in memory, so applying it takes the broker
     * out of every in-sync set (not the first: 0, never reported). */
    uint32_t incarnation;
    /* Derived counts, maintained by apply (checked by cluster_map_verify). */
    uint32_t queues_owned_count;    /* queues whose primary it is */
    uint32_t backups_held_count;    /* queues it is a backup of */
    uint32_t exchanges_owned_count;
};

/* Owned by the map. The three indexes borrow keys from the objects. */
struct map_vhost {
    struct bytes name;
    struct hmap queues;    /* name -> struct map_queue */
    struct hmap exchanges; /* name -> struct map_exchange */
    struct hmap bindings;  /* binding key -> struct map_binding */
    uint32_t index;        /* in map->vhosts */
};

/* Owned by the map. */
struct map_user {
    struct bytes name;
    struct bytes password_hash; /* RabbitMQ's base64 of salt || sha256 */
    struct bytes *vhosts; /* owned array of owned names: where it has a permission */
    uint32_t vhosts_count;
    /* Owned, 3 per vhost (configure, write, read), regexes as given ("" =
     * nothing): vhosts[i]'s are permissions[3 * i ..]. */
    struct bytes *permissions;
    struct bytes *tags; /* owned array of owned strings ("administrator", ...) */
    uint32_t tags_count;
    bool loopback;  /* may only log in from a loopback peer */
    bool any_vhost; /* a users file's "*": every vhost, full access where no permission */
    uint32_t index; /* in map->users */
};

/* Owned by the map. */
struct map_exchange {
    struct map_vhost *vhost; /* borrowed */
    struct bytes name;
    struct bytes type; /* "direct", "topic", ...: checked by the proposer */
    bool durable;
    bool auto_delete;
    bool internal;
    struct bytes arguments; /* an encoded field table */
    uint32_t owner_id;      /* the broker that owns the definition */
    /* The map version at which owner_id got it (declare or set_owner); 0
     * in a snapshot written before this was kept. A restarted broker tells
     * by it what it owned before its restart (member.c's drop_transient_exchanges). */
    uint64_t owned_since;
    struct list_node bindings_out; /* struct map_binding.source_node, in bind order */
    struct list_node bindings_in;  /* struct map_binding.destination_node */
    uint32_t bindings_out_count;
    uint32_t index; /* in map->exchanges */
    /* Removed by the command being applied (a cascade may still look at
     * it): freed once the command is done. */
    bool removed;
    struct map_exchange *next_removed;
};

enum map_destination_kind {
    MAP_DESTINATION_QUEUE = 0,
    MAP_DESTINATION_EXCHANGE = 1,
};

/* Owned by the map. destination, routing_key and arguments are slices of
 * key, the binding's own encoding (source, kind, destination, routing key,
 * arguments), which is also its index key in vhost->bindings. Arguments
 * are compared byte for byte. */
struct map_binding {
    struct map_exchange *source; /* borrowed */
    enum map_destination_kind destination_kind;
    struct bytes destination;
    struct bytes routing_key;
    struct bytes arguments;
    struct bytes key;                  /* owned */
    struct list_node source_node;      /* in source->bindings_out */
    struct list_node destination_node; /* in the destination's bindings_in */
};

/* Owned by the map. The backups are ordered (the first in-sync one is
 * promoted when the primary fails); in_sync_mask bit i says backup_ids[i]
 * holds every message the primary confirmed. */
struct map_queue {
    struct map_vhost *vhost; /* borrowed */
    struct bytes name;
    bool durable;
    bool exclusive;
    bool auto_delete;
    bool available; /* false: the primary is down and no backup could take over */
    struct bytes arguments;   /* an encoded field table */
    /* An exclusive queue's connection: opaque to the map, meaningful on the
     * broker it is on (exclusive_owner_id, which need not be the primary). */
    uint64_t exclusive_connection_id;
    uint32_t exclusive_owner_id;      /* BROKER_ID_NONE unless exclusive */
    uint32_t primary_id;
    uint32_t backup_ids[CLUSTER_BACKUPS_MAX];
    uint8_t backups_count;
    uint8_t in_sync_mask;
    uint8_t replication_factor; /* copies wanted: 1 + backups wanted, 1..4 */
    uint64_t epoch;             /* grows with every change of ownership */
    /* The map version at which primary_id got this incarnation (declare,
     * set_owner, set_available); 0 in a snapshot written before this was
     * kept. See map_exchange.owned_since. */
    uint64_t owned_since;
    /* A planned move in progress (queue.move): the broker the primary hands
     * the queue to once it is an in-sync backup, or BROKER_ID_NONE. Always
     * one of backup_ids; set_owner and a set_backups without it end it. */
    uint32_t move_to;
    /* A backup move instead (queue.move with "from"): the backup that
     * leaves once move_to, its replacement, is in sync (the controller then
     * drops it: controller_repair); the primary stays. BROKER_ID_NONE for a
     * primary move or none; else one of backup_ids, and move_to is set. */
    uint32_t move_from;
    /* Why the move in progress was started (enum map_reason), for the log
     * of its handover; kept by every broker's apply alike, not in
     * snapshots (a restored map's move logs "move"). */
    uint8_t move_reason;
    /* queue.take_over: the dead broker whose log on shared storage the
     * primary adopted when it got the queue, or BROKER_ID_NONE. Any later
     * change of primary clears it. */
    uint32_t taken_from;
    /* The primary said it adopted taken_from's log (queue.adopted). */
    bool adopted;
    /* A queue.take_over from a broker that had itself taken the queue over
     * and not said it adopted it (it may have died first: two brokers
     * dying at once) keeps that one's source here: the log may still be
     * in its directory, and the new taker reads both (cluster/adoption.c).
     * Cleared with taken_from. */
    uint32_t taken_from_before;
    /* The sources before that, newest first, while each taker in the
     * chain died without saying queue.adopted (o -> t -> u -> v -> w dying
     * one after another: w's queue has taken_from v, before u, older t, o):
     * the next taker reads their logs in this order, and looks for them in
     * the adopted/ directories of the takers that claimed them. Cleared
     * with taken_from; at most CLUSTER_BACKUPS_MAX (the oldest dropped). */
    uint32_t taken_older[CLUSTER_BACKUPS_MAX];
    uint8_t taken_older_count;
    struct list_node bindings_in; /* struct map_binding.destination_node */
    uint32_t index;               /* in map->queues */
};

/* Whether the leader keeps primaries and backups spread over the brokers
 * (controller_rebalance); a cluster-wide setting, so that a new leader
 * goes on as the old one did. */
enum map_rebalance {
    MAP_REBALANCE_UNSET = 0, /* never set: the leader sets its --auto-rebalance */
    MAP_REBALANCE_AUTO,      /* always: after joins, returns and failovers */
    MAP_REBALANCE_OFF,
    MAP_REBALANCE_ONCE,      /* off, but one rebalance runs until nothing is left to move */
};
const char *map_rebalance_name(enum map_rebalance mode);

/* The map. Owned by the broker's cluster layer; objects are reached through
 * the arrays (deterministic order) or the name indexes (O(1)). */
struct cluster_map {
    uint64_t version; /* number of commands applied (refusals included: see apply) */
    uint64_t brokers_version; /* bumped on any broker join/leave/state change */
    /* Unique to this map's objects as they are: a new value (from one
     * process-wide counter, never 0) at init, at every command applied and
     * at a snapshot restored, the only times objects are freed or
     * replaced. A pointer to a map object kept with the stamp it was read
     * at is valid while the stamps are equal (struct queue.cluster_entry). */
    uint64_t objects_stamp;
    struct map_broker **brokers;
    uint32_t brokers_count;
    struct map_vhost **vhosts;
    uint32_t vhosts_count, vhosts_cap;
    struct hmap vhost_index; /* name -> struct map_vhost */
    struct map_user **users;
    uint32_t users_count, users_cap;
    /* The map has had users (a bootstrap or any change): from then on
     * they are the cluster's, and no users file is read for them. */
    bool users_defined;
    struct hmap user_index; /* name -> struct map_user */
    struct map_exchange **exchanges;
    uint32_t exchanges_count, exchanges_cap;
    struct map_queue **queues;
    uint32_t queues_count, queues_cap;
    uint32_t bindings_count;
    struct map_exchange *removed_exchanges; /* within one apply (map_exchange.removed) */
    struct policy_set policies; /* every vhost's, sorted by (vhost, name) */
    enum map_rebalance rebalance;
    /* Bumped by every change to the policies (and by a snapshot restore):
     * the controller re-applies them to existing queues when it moves. Not
     * part of the map's state (snapshots do not carry it). */
    uint64_t policies_generation;
    /* Vhost and user limits (broker/limits.h); a vhost's or user's go
     * with it. Snapshots carry them as "limits" (absent: none). */
    struct limit_set limits;
};

/* ---- lifecycle and queries --------------------------------------------------- */

void cluster_map_init(struct cluster_map *map);
void cluster_map_free(struct cluster_map *map);

struct map_broker *cluster_map_broker(const struct cluster_map *map, uint32_t id);
/* The broker named name (a C string), or NULL. */
struct map_broker *cluster_map_broker_named(const struct cluster_map *map, const char *name);
struct map_vhost *cluster_map_vhost(const struct cluster_map *map, struct bytes name);
struct map_user *cluster_map_user(const struct cluster_map *map, struct bytes name);
struct map_queue *cluster_map_queue(const struct cluster_map *map, struct bytes vhost,
                                    struct bytes name);
struct map_exchange *cluster_map_exchange(const struct cluster_map *map, struct bytes vhost,
                                          struct bytes name);
/* The replication policy that applies to a queue of that name (it need
 * not exist yet), or NULL; see broker/policy.h for the precedence. */
const struct policy *cluster_map_policy_for(const struct cluster_map *map, struct bytes vhost,
                                            struct bytes queue_name);
/* The primary of a queue, BROKER_ID_NONE if there is no such queue. */
uint32_t cluster_map_owner_of(const struct cluster_map *map, struct bytes vhost,
                              struct bytes name);
bool map_queue_has_backup(const struct map_queue *queue, uint32_t broker_id);
bool map_queue_backup_in_sync(const struct map_queue *queue, uint32_t broker_id);
/* Whether a planned switch of the queue to one of its backups keeps the
 * old primary as an in-sync backup (queue.set_owner planned): when the
 * backups left would be fewer than the factor wants and the old primary's
 * broker is up (not draining, not suspect); and, beyond the factor, for a
 * queue without backups (the move's target its only one) whose old
 * primary is up or draining, so that a target that dies as the switch
 * commits does not take the queue's only copy with it: the repair
 * releases it once the new primary has applied the switch, and the drain
 * and the rebalance do not touch the queue before (controller_round). Its
 * copy is the queue itself, so it is in sync at the switch with no
 * catch-up (cluster/mirror.c turns the queue into its replica). */
bool map_queue_switch_keeps_primary(const struct cluster_map *map,
                                    const struct map_queue *queue);
/* Where a planned move of a queue (map_queue.move_to, a primary move)
 * stands. The target being in sync is not always enough: with fewer
 * copies in sync than the factor after the switch (the target, the other
 * in-sync backups on brokers that are up, and the old primary if it stays:
 * map_queue_switch_keeps_primary), one more backup joins and catches up
 * first, when a broker can take it (the controller adds it:
 * controller_repair). A move is READY when the switch keeps the factor, or
 * nothing more can be done for it (no room, no broker). Pure: the
 * handover (handover.c) starts on READY, the controller adds the backup
 * on NEEDS_BACKUP. */
enum map_move_state {
    MAP_MOVE_NONE,          /* no primary move */
    MAP_MOVE_CATCHING_UP,   /* the target, or the backup added for it, not in sync yet */
    MAP_MOVE_NEEDS_BACKUP,  /* the switch would leave the queue short: add one */
    MAP_MOVE_READY,
};
enum map_move_state map_queue_move_state(const struct cluster_map *map,
                                         const struct map_queue *queue);
/* The same for a switch to broker `to` now, whether a move names it or
 * not (a planner asks before it commits to a move). */
enum map_move_state map_queue_switch_state(const struct cluster_map *map,
                                           const struct map_queue *queue, uint32_t to);
/* Both brokers announced the same shared storage (broker.storage). */
bool map_brokers_share_storage(const struct map_broker *a, const struct map_broker *b);
/* The queue replicates its transient messages only: its x-quay-replicate
 * argument, else the map's applying policy (policy_replicates_transient_only). */
bool map_queue_replicates_transient_only(const struct cluster_map *map,
                                         const struct map_queue *queue);
bool map_user_has_vhost(const struct map_user *user, struct bytes vhost);
const char *broker_state_name(enum broker_state state);

/* Iteration in the map's deterministic order:
 *   for (uint32_t i = 0; i < map->queues_count; i++) { map->queues[i] ... }
 * Same for brokers, vhosts, users, exchanges; bindings through each
 * exchange's bindings_out list. Do not apply while iterating. */

/* Recomputes every derived count and index and checks every invariant
 * (O(n)). True if the map is consistent; for tests and debug builds. */
bool cluster_map_verify(const struct cluster_map *map);

/* Bytes the map holds on the heap (objects, strings, arrays, indexes). */
size_t cluster_map_memory_size(const struct cluster_map *map);

/* ---- applying commands --------------------------------------------------------- */

enum map_op {
    MAP_OP_NONE = 0,
    MAP_OP_BROKER_JOIN,
    MAP_OP_BROKER_LEAVE,
    MAP_OP_BROKER_STATE,
    MAP_OP_VHOST_PUT,
    MAP_OP_VHOST_DELETE,
    MAP_OP_USER_PUT,
    MAP_OP_USER_DELETE,
    MAP_OP_EXCHANGE_DECLARE,
    MAP_OP_EXCHANGE_DELETE,
    MAP_OP_EXCHANGE_SET_OWNER,
    MAP_OP_BIND,
    MAP_OP_UNBIND,
    MAP_OP_QUEUE_DECLARE,
    MAP_OP_QUEUE_DELETE,
    MAP_OP_QUEUE_SET_OWNER,
    MAP_OP_QUEUE_SET_BACKUPS,
    MAP_OP_QUEUE_SET_IN_SYNC,
    MAP_OP_QUEUE_SET_AVAILABLE,
    MAP_OP_SYNC, /* changes nothing: a broker's barrier (every earlier command is applied) */
    MAP_OP_POLICY_PUT,
    MAP_OP_POLICY_DELETE,
    MAP_OP_QUEUE_MOVE,
    MAP_OP_CLUSTER_REBALANCE,
    MAP_OP_BROKER_STORAGE,
    MAP_OP_QUEUE_TAKE_OVER,
    MAP_OP_PERMISSION_PUT,
    MAP_OP_PERMISSION_DELETE,
    MAP_OP_USERS_BOOTSTRAP,
    MAP_OP_LIMIT_PUT,
    MAP_OP_LIMIT_DELETE,
    MAP_OP_QUEUE_ADOPTED,
    MAP_OP_BROKER_INCARNATION,
    MAP_OP_USERS_IMPORT,
    MAP_OP_COUNT
};

/* The wire name of an op ("queue.declare"), NULL for an unknown one. */
const char *map_op_name(enum map_op op);

/* Why a queue's placement (or a broker's state) changed: a command's
 * optional "reason", set by whoever proposed it (map_cmd_set_reason), read
 * back into map_change for the log of every map change (map_log.c,
 * node.c) and the recent events (map_events.h). Old commands have none. */
enum map_reason {
    MAP_REASON_NONE = 0,
    MAP_REASON_FAILOVER,  /* the primary (or a backup) went down */
    MAP_REASON_RETURN,    /* a broker came back: its queues given back */
    MAP_REASON_REPAIR,    /* the controller's sweep: copies short, or a move's end */
    MAP_REASON_MOVE,      /* an operator's move (/api/cluster/...: cluster/moves.c) */
    MAP_REASON_REBALANCE,
    MAP_REASON_DRAIN,
    MAP_REASON_POLICY,    /* a replication policy changed the factor */
    MAP_REASON_FORGET,    /* a dead broker was forgotten */
    MAP_REASON_SYNC,      /* the primary reports its backups' sync */
    /* A broker's state (broker.*), as the controller or a request decides it: */
    MAP_REASON_SILENCE,   /* heartbeats_missed: silent for silence_ms */
    MAP_REASON_RESET,     /* connection_reset: its links dropped, its heartbeats stopped */
    MAP_REASON_STOPPED,   /* stopped: it said it is stopping */
    MAP_REASON_HEARD,     /* heard_again: its heartbeats are back */
    MAP_REASON_RESTART,   /* restarted: heard with a new incarnation (a new process) */
    MAP_REASON_REVIVE,    /* revive: a drain undone (POST /api/cluster/revive) */
    MAP_REASON_LEAVE,     /* leave: it asked to leave (POST /api/cluster/leave) */
    MAP_REASON_COUNT
};
const char *map_reason_name(enum map_reason reason);

struct map_binding_decl {
    struct bytes vhost;
    struct bytes source;
    enum map_destination_kind destination_kind;
    struct bytes destination;
    struct bytes routing_key;
    struct table arguments;
};

/*
 * What one apply did, for the proposer to answer its client and for every
 * broker to react (start serving a queue it now owns, drop a replica...).
 * Pointers borrow from the map and stay valid until the next apply.
 */
struct map_change {
    enum map_op op;
    bool changed;        /* false: already so (equivalent redeclare, delete of nothing) */
    bool retry;          /* refused because the proposer's view was stale: re-decide */
    uint16_t reply_code; /* REPLY_SUCCESS (200) when applied, else why not */
    char reply_text[MAP_REPLY_TEXT_SIZE]; /* NUL-terminated, without "NAME - " */
    uint64_t version;                     /* map->version after this command */
    /* The command's "vhost" and "name" fields when it has them (slices of
     * the command: valid during the apply only); deletes say what went. */
    struct bytes vhost, name;
    uint32_t broker_id;                   /* broker.*: the broker */
    struct map_queue *queue;        /* queue.* (not delete): the queue as it now is */
    struct map_exchange *exchange;  /* exchange.declare/set_owner, bind/unbind: source */
    struct map_binding_decl binding; /* bind/unbind: the binding (slices of the command) */
    /* queue.delete / queue.set_owner: what it was before. */
    uint32_t previous_primary_id;
    uint64_t previous_epoch;
    bool planned; /* queue.set_owner: a planned handover (the old primary handed it
                   * over, nothing pending), not a failover */
    bool with_replica; /* queue.take_over: by an in-sync backup keeping its replica */
    enum map_reason reason; /* the command's "reason", if any */
    uint64_t silence_ms;    /* broker.state: how long it had been silent (0: not said) */
    /* A queue.* command on an existing queue: its placement before (logs). */
    bool has_before;
    struct {
        uint32_t primary_id, move_to;
        uint32_t backup_ids[CLUSTER_BACKUPS_MAX];
        uint8_t backups_count, in_sync_mask, move_reason;
        bool available;
    } before;
    /* Cascades (vhost.delete, exchange.delete, queue.delete). */
    uint32_t queues_deleted_count;
    uint32_t exchanges_deleted_count;
    uint32_t bindings_deleted_count;
    uint32_t policies_deleted_count; /* policy.delete, vhost.delete */
};

/*
 * Applies one committed command. Returns OK (change_out->reply_code 200),
 * E_MAP_REFUSED (a reply code and text; the map is unchanged) or E_SYNTAX
 * (malformed: reply code 541; the map is unchanged). change_out may be
 * NULL. map->version grows by one for every command, refused or not, so
 * that versions stay equal to log positions of state-machine commands.
 */
int cluster_map_apply(struct cluster_map *map, const uint8_t *cmd, size_t size,
                      struct map_change *change_out);

/* ---- building commands ------------------------------------------------------------ */

/* One encoded command: the bytes of a field table. Owned; map_cmd_free. */
struct map_cmd {
    uint8_t *bytes;
    size_t size;
};

void map_cmd_free(struct map_cmd *cmd);

/* A batch of commands (what the controller proposes). Owned. */
struct map_cmd_list {
    struct map_cmd *items;
    uint32_t count;
    uint32_t cap;
};

void map_cmd_list_init(struct map_cmd_list *list);
void map_cmd_list_free(struct map_cmd_list *list);
/* Moves cmd into the list (cmd is emptied). */
void map_cmd_list_push(struct map_cmd_list *list, struct map_cmd *cmd);
/* Adds "reason" to a built command (to each of a list's from index from
 * on): OK, or E_LIMIT (the command unchanged). */
int map_cmd_set_reason(struct map_cmd *cmd, enum map_reason reason);
void map_cmd_list_set_reason(struct map_cmd_list *list, uint32_t from, enum map_reason reason);

/* The arguments of queue.declare (and of a queue in a snapshot). */
struct map_queue_decl {
    struct bytes vhost;
    struct bytes name;
    bool durable;
    bool exclusive;
    bool auto_delete;
    struct table arguments;
    uint64_t exclusive_connection_id; /* 0 unless exclusive */
    uint32_t exclusive_owner_id;      /* the connection's broker (absent in an older
                                       * entry: the primary) */
    uint32_t primary_id;              /* decided by placement */
    uint32_t backup_ids[CLUSTER_BACKUPS_MAX];
    uint8_t backups_count;
    uint8_t replication_factor; /* 1..4 */
    /* Non-zero: the incarnation (epoch) of a queue of that name that its
     * primary deleted and the map has not forgotten yet: the declare
     * removes it first, and declares anew. */
    uint64_t replaces_epoch;
};

struct map_exchange_decl {
    struct bytes vhost;
    struct bytes name;
    struct bytes type;
    bool durable;
    bool auto_delete;
    bool internal;
    struct table arguments;
    uint32_t owner_id;
};


/* Each builder returns OK, or E_LIMIT if the command would exceed
 * CLUSTER_CMD_SIZE_MAX (out is then empty). Builders do not validate
 * beyond asserting their own preconditions: apply decides. */
/* broker.join: incarnation is the joining process's (its heartbeats'; 0:
 * not known), so the map knows a broker's process from its first entry and
 * any later one is a restart (as broker.incarnation's). */
int map_cmd_broker_join(struct map_cmd *out, uint32_t id, struct bytes name,
                        struct bytes amqp_address, struct bytes cluster_address, bool voter,
                        uint32_t incarnation);
int map_cmd_broker_leave(struct map_cmd *out, uint32_t id);
int map_cmd_broker_state(struct map_cmd *out, uint32_t id, enum broker_state state);
/* The same with why (MAP_REASON_NONE: not said) and, if not 0, how long the
 * broker had been silent. */
int map_cmd_broker_state_why(struct map_cmd *out, uint32_t id, enum broker_state state,
                             enum map_reason reason, uint64_t silence_ms);
/* broker.incarnation: the broker's process is `incarnation` (not 0). A
 * change (a restart) takes it out of every queue's in-sync set: its
 * replicas did not survive the restart, so it may be promoted only once
 * its primary caught it up again. The first one the map hears (a broker
 * that joined without one: an upgrade) is only recorded. */
int map_cmd_broker_incarnation(struct map_cmd *out, uint32_t id, uint32_t incarnation);
/* broker.storage: the broker's shared-storage id (1..64 bytes; empty: none). */
int map_cmd_broker_storage(struct map_cmd *out, uint32_t id, struct bytes storage_id);
int map_cmd_vhost_put(struct map_cmd *out, struct bytes name);
int map_cmd_vhost_delete(struct map_cmd *out, struct bytes name);
int map_cmd_user_put(struct map_cmd *out, struct bytes name, struct bytes password_hash,
                     const struct bytes *vhosts, uint32_t vhosts_count,
                     const struct bytes *tags, uint32_t tags_count);
int map_cmd_user_delete(struct map_cmd *out, struct bytes name);
/* user.put without "vhosts": a new user has no permission, an existing one
 * keeps its permissions (RabbitMQ's PUT /api/users/{name}). */
int map_cmd_user_set(struct map_cmd *out, struct bytes name, struct bytes password_hash,
                     const struct bytes *tags, uint32_t tags_count);
/* permission.put: the user's three regexes for vhost (both must exist: 404;
 * a regex that does not compile: 406). permission.delete: 404 if none. */
int map_cmd_permission_put(struct map_cmd *out, struct bytes user, struct bytes vhost,
                           const struct bytes regexes[3]);
int map_cmd_permission_delete(struct map_cmd *out, struct bytes user, struct bytes vhost);
/* users.bootstrap: a broker's users file, for a map that has never had
 * users (users_defined false; otherwise refused with 406, which is no
 * error: another broker's file came first). Every user is put with its
 * permissions, and the vhosts they name are created. users are tables as
 * a snapshot's (the users array of cluster_map_snapshot_write). */
int map_cmd_users_bootstrap(struct map_cmd *out, const struct map_user *const *users,
                            uint32_t count);
/* users.import: a definitions import's users, vhosts and permissions
 * (mgmt/api_definitions_users.c), applied all or nothing: users are put
 * as user.put without "vhosts" puts them (an existing one keeps its other
 * permissions), vhosts are created if new, then the permissions set; a
 * permission may name a user or vhost of the same command. */
struct map_import_user {
    struct bytes name, password_hash;
    const struct bytes *tags;
    uint32_t tags_count;
};
struct map_import_permission {
    struct bytes user, vhost;
    struct bytes regexes[3];
};
int map_cmd_users_import(struct map_cmd *out, const struct map_import_user *users,
                         uint32_t users_count, const struct bytes *vhosts, uint32_t vhosts_count,
                         const struct map_import_permission *permissions,
                         uint32_t permissions_count);
int map_cmd_exchange_declare(struct map_cmd *out, const struct map_exchange_decl *decl);
int map_cmd_exchange_delete(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            bool if_unused);
int map_cmd_exchange_set_owner(struct map_cmd *out, struct bytes vhost, struct bytes name,
                               uint32_t owner_id);
int map_cmd_bind(struct map_cmd *out, const struct map_binding_decl *decl);
int map_cmd_unbind(struct map_cmd *out, const struct map_binding_decl *decl);
/* origin_id: the broker whose client declared it (an exclusive queue may
 * only be redeclared from the same broker and connection). */
int map_cmd_queue_declare(struct map_cmd *out, const struct map_queue_decl *decl,
                          uint32_t origin_id);
/* expected_epoch 0: delete whatever incarnation exists; otherwise only
 * that one (a primary fencing its if-empty/if-unused check). */
int map_cmd_queue_delete(struct map_cmd *out, struct bytes vhost, struct bytes name,
                         uint64_t expected_epoch);
/* The queue.set_* commands are compare-and-set on the queue's epoch: they
 * are refused (retry) if the queue's epoch is no longer expected_epoch. */
int map_cmd_queue_set_owner(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            uint64_t expected_epoch, uint32_t primary_id);
/* A planned handover to an in-sync backup, proposed by the primary once it
 * holds nothing the new one lacks (cluster/handover.c): like set_owner, but
 * refused (retry) unless primary_id is an in-sync backup and the queue's
 * move_to. */
int map_cmd_queue_hand_over(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            uint64_t expected_epoch, uint32_t primary_id);
/* A primary restarted before the map saw it down hands the queue to an
 * in-sync backup (mirror.c hand_off_after_restart): like set_owner, but
 * refused (retry) unless primary_id is an in-sync backup when it applies
 * (a set_backups at the same epoch may have dropped it meanwhile; plain
 * set_owner makes a non-backup the primary of a queue started again
 * empty). */
int map_cmd_queue_hand_to_backup(struct map_cmd *out, struct bytes vhost, struct bytes name,
                                 uint64_t expected_epoch, uint32_t primary_id);
/* Starts a planned move of the queue to broker `to` (which becomes a backup
 * first if it is not one), or ends one (to = BROKER_ID_NONE): see
 * map_queue.move_to. */
int map_cmd_queue_move(struct map_cmd *out, struct bytes vhost, struct bytes name,
                       uint64_t expected_epoch, uint32_t to);
/* Starts a backup move: `to` (not a backup yet) replaces backup `from`
 * once caught up (map_queue.move_from). */
int map_cmd_queue_move_backup(struct map_cmd *out, struct bytes vhost, struct bytes name,
                              uint64_t expected_epoch, uint32_t from, uint32_t to);
/* cluster.rebalance: sets map->rebalance (not UNSET). */
int map_cmd_rebalance(struct map_cmd *out, enum map_rebalance mode);
/* The leader found nothing left to move: ONCE becomes OFF (any other mode
 * stays, so an operator's change meanwhile is not undone). */
int map_cmd_rebalance_done(struct map_cmd *out);
int map_cmd_queue_set_backups(struct map_cmd *out, struct bytes vhost, struct bytes name,
                              uint64_t expected_epoch, const uint32_t *backup_ids,
                              uint8_t backups_count);
/* incarnations (may be NULL): beside each id, its process as the primary's
 * stream knew it (0: not known); one the map has replaced since is not put
 * in sync (map_apply_queues.c). */
int map_cmd_queue_set_in_sync(struct map_cmd *out, struct bytes vhost, struct bytes name,
                              uint64_t expected_epoch, const uint32_t *in_sync_ids,
                              const uint32_t *incarnations, uint8_t in_sync_count);
/* The same, for a set with a backup whose stream sends it the transient
 * messages only (x-quay-replicate "transient"): refused once the queue
 * replicates everything (a policy changed since the primary asked): such
 * a backup cannot be in sync then, and a promotion would lose the
 * persistent messages it lacks. */
int map_cmd_queue_set_in_sync_partial(struct map_cmd *out, struct bytes vhost,
                                      struct bytes name, uint64_t expected_epoch,
                                      const uint32_t *in_sync_ids, const uint32_t *incarnations,
                                      uint8_t in_sync_count);
/* queue.set_backups that also sets the replication factor (1..4): a policy
 * changed what the queue wants. backups_count < factor. */
int map_cmd_queue_set_factor(struct map_cmd *out, struct bytes vhost, struct bytes name,
                             uint64_t expected_epoch, uint8_t replication_factor,
                             const uint32_t *backup_ids, uint8_t backups_count);
int map_cmd_queue_set_available(struct map_cmd *out, struct bytes vhost, struct bytes name,
                                uint64_t expected_epoch, bool available);
/* queue.take_over: a durable queue whose primary `from` is down gets
 * primary_id, a broker that is up, is not one of its backups and shares
 * from's storage; it adopts from's log of the queue (durable.h). The
 * backups (none in sync, else the controller would promote one) are
 * dropped; epoch + 1, available. */
int map_cmd_queue_take_over(struct map_cmd *out, struct bytes vhost, struct bytes name,
                            uint64_t expected_epoch, uint32_t primary_id, uint32_t from);
/* queue.take_over by an in-sync backup of a queue with x-quay-replicate
 * "transient" (its replica holds the transient messages; the persistent
 * ones are in from's log only): primary_id keeps its replica and merges
 * it with the log by seq (mirror.c, durable_adopt_step). The other backups are
 * dropped as above (the repair sweep adds them back, caught up). */
int map_cmd_queue_take_over_with_replica(struct map_cmd *out, struct bytes vhost,
                                         struct bytes name, uint64_t expected_epoch,
                                         uint32_t primary_id, uint32_t from);
/* The same, asked by the queue's primary self_id, restarted before the
 * map saw it down (controller_restart_with_log): its log has the
 * persistent messages, primary_id's replica the transient ones; self_id
 * need not be down ("restarted"). */
int map_cmd_queue_hand_to_backup_with_log(struct map_cmd *out, struct bytes vhost,
                                          struct bytes name, uint64_t expected_epoch,
                                          uint32_t primary_id, uint32_t self_id);
/* queue.adopted: primary_id, which took the queue over, has adopted what
 * it took (while primary_id is still its primary; otherwise nothing
 * changes): a later take-over from it reads its log only. No epoch:
 * backups added since moved it on, and this changes nothing a
 * compare-and-set protects. */
int map_cmd_queue_adopted(struct map_cmd *out, struct bytes vhost, struct bytes name,
                          uint32_t primary_id);

/* policy.put adds or replaces a vhost's policy (the pattern is compiled
 * at apply; a bad one is refused with 406); policy.delete removes one
 * (a missing one is refused with 404). */
int map_cmd_policy_put(struct map_cmd *out, const struct policy_decl *decl);
int map_cmd_policy_delete(struct map_cmd *out, struct bytes vhost, struct bytes name);
/* limit.put {scope: "vhost" | "user", name, kind: "max-connections" ...,
 * value} (put) or limit.delete {scope, name, kind}: refused 404 when the
 * vhost or user does not exist; a delete of no limit changes nothing. */
int map_cmd_limit(struct map_cmd *out, bool put, enum limit_scope scope, struct bytes name,
                  enum limit_kind kind, int64_t value);

/* A no-op: once a broker sees its own sync applied, it has applied every
 * command committed before it (node_request.c uses it after a start). */
int map_cmd_sync(struct map_cmd *out);

/* ---- snapshots ------------------------------------------------------------------ */

/* Writes the whole map as one field table into buf. OK with *size_out, or
 * E_NOMEM if cap is too small (*size_out is then 0). */
int cluster_map_snapshot_write(const struct cluster_map *map, uint8_t *buf, size_t cap,
                               size_t *size_out);
/* The same into a malloc'ed buffer the caller frees. */
int cluster_map_snapshot_alloc(const struct cluster_map *map, uint8_t **buf_out,
                               size_t *size_out);
/* Replaces *map with the snapshot's contents. OK, or E_SYNTAX if the
 * snapshot is malformed or inconsistent (the map is then unchanged). */
int cluster_map_snapshot_read(struct cluster_map *map, const uint8_t *buf, size_t size);

#endif
