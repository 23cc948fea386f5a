/*
 * node.h: this broker's membership in the cluster (the glue between the
 * broker, consensus.h and the cluster map).
 *
 * Owns: the consensus instance, the cluster map it drives as its state
 * machine (map.h; empty at every process start, libraft replays the log or
 * installs a snapshot), the broker's stable cluster id (DATA/cluster-id),
 * the Raft data directory (DATA/raft), and the member heartbeats.
 *
 * Membership. Without peers to join the broker bootstraps a one-member
 * cluster (a restart on a populated DATA/raft is just a restart); with
 * peers it joins through consensus_join(). Followers cannot propose, and
 * the join RPC only tells the leader a member's id and cluster address, so
 * every member announces itself in its heartbeat (name, AMQP address,
 * cluster address); the leader proposes broker.join for each Raft member
 * whose map entry is missing or differs. The leader proposes its own
 * broker.join whenever it is elected: once that entry commits, every
 * earlier entry is applied here, and only then does it act as controller.
 *
 * Liveness. libraft keeps its followers' progress private and consensus.h
 * does not expose it, so members send an authenticated heartbeat datagram
 * (HMAC-SHA256 with the cluster secret, strictly increasing sequence
 * against replays) every NODE_HEARTBEAT_MS to every Raft member, on the UDP
 * port with the same number as the cluster TCP port. Every member records
 * what it hears, so a newly elected leader already knows who is silent. The
 * leader (the controller) feeds the last-heard times to
 * controller_check_liveness() and proposes broker.state up/suspect/down; a
 * broker that stops cleanly says so in its last heartbeat and is marked
 * down at once.
 *
 * Every map change is logged at info level with the map epoch (the map's
 * version: commands applied) and the resulting broker list.
 *
 * Requests: a client's definition change (declare, bind, delete) is
 * submitted on whichever broker the client is on; see node_request.c.
 *
 * Must never: touch the AMQP data path itself (the broker mirrors the map
 * through hooks); block the loop after start-up; propose when not the
 * leader.
 */
#ifndef QUAY_CLUSTER_NODE_H
#define QUAY_CLUSTER_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "cluster/map.h"
#include "lib/errors.h"

#define CLUSTER_NODE_PEERS_MAX 16 /* addresses in --join */
#define NODE_HEARTBEAT_MS 50
#define NODE_SUSPECT_AFTER_MS 800
#define NODE_DOWN_AFTER_MS 1500
/* libraft randomizes it in [t, 2t): a dead leader is replaced within about
 * 1.7 s, and by then its silence already exceeds NODE_DOWN_AFTER_MS. */
#define NODE_ELECTION_TIMEOUT_MS 800
/* ... unless the leader's connections dropped (a dead process): then a
 * follower stands for election after [t, 2t) of this (a vote takes a
 * round trip on a LAN; pre-vote keeps a false alarm harmless). */
#define NODE_HURRY_ELECTION_MS 50
/* With no leader known, the window doubles for every term that elected
 * none, this many times at most (50 ms -> 800 ms, the election timeout). */
#define NODE_HURRY_BACKOFF_MAX 4
/* ... or when its heartbeats have not been heard for this long. */
#define NODE_HURRY_SILENCE_MS 400
/* A broker whose connections dropped and that has been silent this long
 * is down (a dead process), without waiting for NODE_DOWN_AFTER_MS. */
#define NODE_RESET_SILENCE_MS 150
/* A broker's lease: it has heard, within this long, the heartbeats of a
 * majority of the map's brokers (itself included). Shorter than
 * NODE_DOWN_AFTER_MS, so a broker cut off from the majority stops
 * confirming as a primary before the majority can mark it down. */
#define NODE_LEASE_MS 1000
/* The leader's periodic round (repair, draining, rebalancing) is paced by
 * controller.h's CONTROLLER_*_EVERY_MS. */

#define CLUSTER_SUBMIT_TIMEOUT_MS 5000
/* CLUSTER_E_UNAVAILABLE (no commit in time) is in lib/errors.h. */

struct raft_tls; /* raft_tls.h */

/* Borrowed by cluster_node_start() for the duration of the call. */
struct cluster_node_config {
    const char *name;          /* broker name; NULL or "" = the host name */
    const char *listen;        /* cluster address "a.b.c.d:port" (TCP Raft, UDP heartbeats) */
    const char *join;          /* "a.b.c.d:port[,...]"; NULL or "": bootstrap */
    const char *secret_file;   /* required: its bytes are the secret (16..1024) */
    const char *data_dir;      /* the broker's data dir (holds cluster-id and raft/) */
    const char *amqp_address;  /* advertised to clients, "host:port" */
    const struct raft_tls *tls; /* --cluster-tls: Raft in TLS (raft_tls.h); NULL: plain */
};

/* Owned by its broker; freed by itself once cluster_node_stop() finishes. */
struct cluster_node;

/* Checks the options without side effects (addresses, name, the secret
 * file's presence and size). OK, or -1 with a message in err. */
int cluster_node_config_check(const struct cluster_node_config *config, char *err,
                              size_t err_size);

/* Reads the secret and the cluster id (creating it on first start), opens
 * the heartbeat socket and starts consensus (bootstrap or join). OK, or -1
 * with a message in err (*out is then NULL). */
int cluster_node_start(struct cluster_node **out, uv_loop_t *loop,
                       const struct cluster_node_config *config, char *err, size_t err_size);

/* Announces the stop to the other members, stops consensus and closes the
 * handles; the node frees itself once they are closed. No call on node is
 * allowed after this one. */
void cluster_node_stop(struct cluster_node *node);

uint32_t cluster_node_id(const struct cluster_node *node);
const char *cluster_node_name(const struct cluster_node *node); /* this broker's */
/* The cluster secret (borrowed; valid until the node is freed): brokers
 * authenticate their AMQP links with it too. */
struct bytes cluster_node_secret(const struct cluster_node *node);
const struct cluster_map *cluster_node_map(const struct cluster_node *node);

/* ---- the broker's side ---- */

/* What the broker does with the map. Every callback runs on the loop,
 * inside the consensus apply callback: none may propose or submit
 * synchronously. */
struct cluster_node_hooks {
    void *ctx;
    /* After every applied command (refused ones too; change->reply_code
     * says which), and with change NULL after a snapshot replaced the map:
     * mirror the map into the broker's own objects. */
    void (*applied)(void *ctx, int rc, const struct map_change *change);
    /* This process has applied everything committed before its start. */
    void (*synced)(void *ctx);
    /* Hand a log entry (a follower's request) to the leader; the node sends
     * it again if it is not applied within a second. False: not sent (no
     * link to the leader yet): tried again at the next tick. */
    bool (*forward)(void *ctx, uint32_t leader_id, const uint8_t *entry, size_t size);
};
void cluster_node_set_hooks(struct cluster_node *node, const struct cluster_node_hooks *hooks);

/* The outcome of a submitted change: status OK once the command has been
 * applied *here* (so the broker's mirror already reflects it; change
 * says whether the map accepted it: reply_code 200, or the refusal's code
 * and text), CLUSTER_E_UNAVAILABLE when it did not commit within
 * CLUSTER_SUBMIT_TIMEOUT_MS or the node is stopping (change NULL). */
typedef void (*cluster_submit_fn)(void *ctx, int status, const struct map_change *change);
/* Owned by the node until its callback ran or it is cancelled. */
struct cluster_request;

/* A definition change from a client of this broker (any broker: the
 * leader proposes it, a follower forwards it). Consumes cmd. done is never
 * called from inside this call. */
struct cluster_request *cluster_node_submit(struct cluster_node *node, struct map_cmd *cmd,
                                            cluster_submit_fn done, void *ctx);
/* The requester is gone: done will not be called (the change may still
 * commit). */
void cluster_request_cancel(struct cluster_request *request);
/* The leader's side of hooks.forward: propose an entry a peer sent. OK, or
 * CONSENSUS_E_NOT_LEADER / _INVALID / _BUSY (the sender tries again). */
int cluster_node_propose_entry(struct cluster_node *node, const uint8_t *entry, size_t size);
bool cluster_node_synced(const struct cluster_node *node);
/* The process (incarnation) a peer's heartbeats name, 0 if not heard since
 * this process started. */
uint32_t cluster_node_peer_incarnation(struct cluster_node *node, uint32_t broker_id);
/* The map version this process's own log reached before it started (0 on
 * a first start): a queue or exchange this broker owns since a later
 * version was given to this incarnation. Exact once synced, but for one
 * rare case: entries a new leader writes over an uncommitted tail of our
 * log count as before. */
uint64_t cluster_node_restart_version(const struct cluster_node *node);
/* The map version at which the map first named this process (its
 * broker.incarnation); UINT64_MAX until then. What this broker owns since
 * then was given to this process (a queue declared on it once it was
 * back), not to an earlier one of this broker that held more than this
 * one recovered (controller_restart_successor). 0 on a first start
 * (cluster_node_restart_version 0): everything was given to this process. */
uint64_t cluster_node_known_since(const struct cluster_node *node);
/* The controller's settings (timeouts, default backups, placement), for
 * decisions taken outside the leader's rounds (member_forget). */
struct controller_config;
const struct controller_config *cluster_node_controller_config(const struct cluster_node *node);
/* The memory and disk alarms are cluster-wide, as in RabbitMQ: ours go out
 * in our heartbeats; a broker blocks its publishers while any broker it
 * hears from (within NODE_DOWN_AFTER_MS) has one on. */
void cluster_node_set_alarms(struct cluster_node *node, bool memory, bool disk);
void cluster_node_peer_alarms(const struct cluster_node *node, bool *memory, bool *disk);
/* Our AMQP link to that broker dropped (EOF or reset): if its heartbeats
 * stop too, the controller takes it as dead at once. */
void cluster_node_peer_lost(struct cluster_node *node, uint32_t broker_id);
uint32_t cluster_node_leader(const struct cluster_node *node); /* 0: none known */
struct consensus_log;
/* The Raft log's term and indexes here (all 0 once stopping): GET /metrics. */
void cluster_node_raft_log(const struct cluster_node *node, struct consensus_log *out);
/* Whether the lease (NODE_LEASE_MS) is fresh; always, alone in the map. */
bool cluster_node_lease_fresh(const struct cluster_node *node);
/* --default-backups, for the controller re-applying replication policies
 * to existing queues (controller_apply_policies); 1 until set. */
void cluster_node_set_default_backups(struct cluster_node *node, uint8_t default_backups);
/* --auto-rebalance: what this broker, as the leader, sets the map's
 * rebalance mode to while the cluster never set it (on until set). */
void cluster_node_set_auto_rebalance(struct cluster_node *node, bool on);

/* The node's view, for GET /api/cluster (member_cluster_json writes the
 * object around it, and the moves): these members of it
 *   {"self": NAME, "id": N, "leader": NAME|null, "epoch": N, "lease": bool,
 *    "queues": N, "exchanges": N, "bindings": N, "map_bytes": N,
 *    "brokers": [{"id", "name", "amqp", "cluster", "state", "voter",
 *                 "primaries", "unavailable", "backups"}, ...],
 *    "raft": {"term", "last_index", "commit_index", "applied_index",
 *             "snapshot_busy_ms", "snapshots_taken", "snapshots_restored",
 *             "probe_rewinds", "probe_hurries",
 *             "followers": [{"id", "name", "state", "next_index",
 *                            "match_index", "heard"}, ...]}}
 * "epoch" is the map's version (commands applied); a broker's "primaries"
 * counts the queues it is primary of ("unavailable": of those, the ones
 * waiting for it with no backup to promote), "backups" those it backs up.
 * "raft" is this broker's log (consensus_log_state); "snapshots_restored"
 * counts the snapshot loaded at start as well as those the leader sent;
 * "followers" is empty except on the leader, where a follower's "state" is
 * probe, pipeline or snapshot (consensus_followers). */
struct json;
void cluster_node_write_fields(struct cluster_node *node, struct json *body);
/* GET /api/cluster/events: the recent cluster events this broker applied
 * (map_events.h), members of an object the caller began. */
void cluster_node_write_events(const struct cluster_node *node, struct json *body);
/* Queues of the map with a move in progress (map_queue.move_to), counted
 * once per map version. */
uint32_t cluster_node_moves_count(struct cluster_node *node);

/* The AMQP address to advertise: the bound address of the first listener;
 * a wildcard host (0.0.0.0, ::) is replaced by the cluster address's host. */
void cluster_node_amqp_address(const struct sockaddr *bound, const char *cluster_address,
                               char *out, size_t out_size);

#endif
