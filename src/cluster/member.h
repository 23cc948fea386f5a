/*
 * member.h: the broker's side of the cluster: what a clustered quayd does
 * with the map (cluster/node.h) on the AMQP data path.
 *
 * Owns the links to the other brokers (one outbound AMQP connection per
 * peer, cluster/link.h), the placement view used for new queues, and the
 * proxy state of every queue whose primary is elsewhere (cluster/proxy.h).
 * It installs the node's hooks:
 *   applied  -> mirror.c: the broker's exchanges, bindings and queues follow
 *               the map (a queue is real where this broker is its primary,
 *               a stand-in everywhere else);
 *   synced   -> mirror.c: a full reconcile once the log is caught up;
 *   forward  -> a follower's definition change goes to the leader over the
 *               link, as basic.quay-forward to the reserved name
 *               "amq.quay.map" (the leader proposes the body).
 *
 * Rule: in a cluster the broker's object graph changes only by applying
 * the map, except deletions decided locally (an exclusive queue's
 * connection closed, auto-delete, x-expires), which are applied at once
 * and submitted (member_queue_gone).
 *
 * Memory: made by quayd's main and owned by the broker from then on
 * (broker->cluster_ctx, through member_cluster_ops): stopped by broker_stop
 * and freed by broker_free after the loop stopped running callbacks for it.
 */
#ifndef QUAY_CLUSTER_MEMBER_H
#define QUAY_CLUSTER_MEMBER_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "lib/types.h"
#include "broker/cluster_ops.h"
#include "lib/list.h"
#include "lib/pace.h"
#include "cluster/fence.h"
#include "cluster/map.h"
#include "cluster/placement.h"
#include "net/conn.h"

struct broker;
struct cluster_node;
struct link;
struct link_channel;
struct vhost;
struct queue;

/* The reserved queue name a follower forwards map entries to. */
#define MEMBER_MAP_TARGET CLUSTER_OPS_MAP_TARGET

/* The member as the broker's cluster (broker/cluster_ops.h; member_ops.c):
 * the context of these operations is the struct member. */
extern const struct cluster_ops member_cluster_ops;
/* For the layers above (mgmt/): the member a broker is plugged into, and
 * its node (NULL once the member stops, as the node is going: what the
 * broker's own pointer to it said before the cut), or NULL when single. */
struct member *member_of(const struct broker *broker);
struct cluster_node *member_node_of(const struct broker *broker);

struct member_peer {
    uint32_t id;                     /* map broker id */
    char address[CLUSTER_NAME_SIZE_MAX + 1]; /* its AMQP address */
    struct member *member;           /* borrowed: the owner */
    struct link *link;               /* owned */
    bool up;                         /* the link's handshake is done */
    enum broker_state map_state;     /* its state in the map when last synced */
    struct link_channel *map_channel; /* forwards map entries (no confirms) */
    struct list_node forwarders;     /* struct proxy_forwarder.peer_link */
    /* Flow control: the bytes sent to it (forwards, replication) and not
     * answered yet, and whether they are over MEMBER_FORWARD_HIGH_BYTES. */
    uint64_t forward_bytes;
    bool forward_flow;
    /* The highest map version we asked the peer to apply before our next
     * requests on this link (basic.quay-sync; proxy.c). */
    uint64_t synced_version;
    /* On the map channel (visible.c): the highest version the peer said
     * it applied, and the highest we asked it about. */
    uint64_t applied_version, asked_version;
};

struct member {
    struct broker *broker;           /* borrowed */
    struct cluster_node *node;       /* borrowed: quayd's main starts it, the member's
                                      * stop (member_cluster_ops) stops it */
    uint32_t self_id;
    struct member_peer *peers[CLUSTER_BROKERS_MAX]; /* owned, unordered */
    uint32_t peers_count;
    struct placement placement;
    struct list_node stubs;          /* struct proxy_stub.member_link: every stand-in */
    uint32_t stubs_count;
    uint8_t default_backups;         /* --default-backups */
    uint32_t incarnation;            /* random per process: see member_connection_key */
    struct list_node parked;         /* struct parked_forward: forwards ahead of our map */
    struct list_node replications;   /* struct replication: our queues with backups */
    uint32_t replications_count;
    /* The tick's walks of both (replication_tick_step, proxy_tick_step):
     * what is left to visit this tick, a slice a loop turn (tick_walk). */
    uint32_t replications_tick_left, stubs_tick_left;
    uv_idle_t *tick_walk;            /* owned: active while a walk has some left */
    /* The catch-ups' byte rate (--catch-up-rate; 0: unbounded), all
     * queues together, and the timer that resumes those that waited for
     * it (replication.c). */
    struct pace catch_up_pace;
    uv_timer_t *pace_timer;          /* owned (closed by member_stop) */
    struct list_node releasing;      /* uplinks with upstream requeues to send (proxy.c) */
    struct list_node sync_waits;     /* struct member_sync_wait: peers waiting for our map */
    struct list_node visible_waits;  /* struct visible_wait: our changes, for the peers' maps */
    struct list_node handovers;      /* struct handover: our queues being handed over */
    struct list_node adoptions;      /* struct adoption: taken-over queues to adopt */
    uv_idle_t *adoption_idle;        /* owned while adoptions wait (adoption.c), or NULL */
    uint64_t adoption_queue_ns;      /* the last batch's time per queue (adoption.c), 0: none */
    uint32_t adoption_batch_left;    /* the current batch's queues not adopted yet (at the
                                      * head of adoptions, staged) */
    uint32_t adoption_batch_count;   /* its size */
    uint64_t adoption_batch_ns;      /* the time it took so far, in slices before this one */
    uint32_t adoption_batches;       /* since the list was last empty (logged then) */
    uint32_t adoption_batched;       /* queues in those batches */
    struct list_node adopted_unsaid; /* struct adoption: adopted, queue.adopted once synced */
    struct list_node adoptions_unreadable; /* struct adoption: a log not read whole, tried
                                            * again later (adoption.c) */
    struct list_node staged_kept;    /* struct staged_kept: what the sweep left (adoption.c) */
    struct list_node restart_waits;  /* struct restart_wait: held queues decided again (mirror.c) */
    uint64_t synced_ms;              /* loop time of our sync (0 before) */
    uint64_t staged_kept_version;    /* the map version they were last judged at */
    /* Flow control of our publishers: the bytes of messages sent to other
     * brokers (forwards to primaries, replication to backups) and not yet
     * answered, all peers together (each peer's: member_peer), and how many
     * peers are over the high mark (MEMBER_FORWARD_*). */
    uint64_t forward_bytes;
    uint32_t forward_flow_peers;
    /* Deletions of what a restart lost (transient queues and exchanges)
     * that clients wait for before they may open (member.c). */
    uint32_t transients_pending;
    /* Queues that changed primary in the map changes this broker applied
     * since it started (a restart counts again what it replays): handed
     * over on purpose (a move, a drain, a rebalance) or failed over.
     * GET /metrics exports them. */
    uint64_t queue_moves_count;
    uint64_t queue_failovers_count;
    /* Catch-ups of a backup this broker started as a primary (a reset,
     * then the queue's whole content: replication.c). GET /metrics. */
    uint64_t catch_ups_count;
    struct net_flush_hook release_hook; /* sends them at the end of the loop iteration */
    uv_timer_t *timer;               /* owned: MEMBER_TICK_MS (closed by member_stop) */
    /* --partition-handling pause-minority (fence_pause_step): cut off from
     * the majority, the broker sends its clients away. */
    struct fence_pause pause;
    uint64_t pauses_count;
    bool stopping;
};

#define MEMBER_TICK_MS 100
/* Queues (replicated ones, stand-ins) a tick visits in one loop turn: with
 * 10,000 queues a whole walk held each broker's loop ~2 ms every tick. */
#define MEMBER_TICK_SLICE 512
/* How long a serving broker is cut off from the majority before it pauses
 * (pause-minority): past the 1.5 s in which the majority marks it down,
 * so its clients go once their queues can have moved, not on a blip. */
#define MEMBER_PAUSE_AFTER_MS 3000

/* Messages in flight to another broker (forwards to primaries, replication
 * to backups: sent, not yet answered): a publisher whose publish adds to
 * them while they are over the high mark is not read until they are below
 * the low mark (connection_flow). Per peer: a slow or stopped primary
 * stops the publishers to its queues, not those to other brokers' queues.
 * A proxy holds what its primaries have not confirmed, a primary what its
 * backups have not, and neither may hold it without bound (a memory alarm
 * would flap as the backlog drains). */
#define MEMBER_FORWARD_HIGH_BYTES (4u << 20)
#define MEMBER_FORWARD_LOW_BYTES (2u << 20)

/* Whether this broker may confirm as a primary now: its cluster lease
 * (cluster_node_lease_fresh). */
bool member_lease_fresh(const struct member *member);

/* Creates the member and installs the node's hooks. */
struct member *member_new(struct broker *broker, struct cluster_node *node,
                          uint8_t default_backups);
/* Closes the links (no callback runs after this returns). */
void member_stop(struct member *member);
void member_free(struct member *member);

const struct cluster_map *member_map(const struct member *member);
/* The peer with this map id, or NULL (self, unknown, or no link yet). */
struct member_peer *member_peer(struct member *member, uint32_t broker_id);
/* The peer's map channel (forwarded map entries, basic.quay-sync with an
 * answer), opened on first use; NULL while its link is down. */
struct link_channel *member_map_channel(struct member_peer *peer);

/* A local decision to delete a queue (see the rule above): the queue is
 * already gone here; tell the map. */
void member_queue_gone(struct member *member, struct bytes vhost, struct bytes name);

/* The leader's side of a forwarded map entry (ignored elsewhere: the
 * sender sends it again to whoever leads). */
void member_propose_entry(struct member *member, const uint8_t *entry, uint64_t size);
/* basic.quay-handover from a queue's primary, on our link channel
 * (connection_id, channel_id): one chunk of what it had delivered, kept in
 * our replica for the promotion to come (replica_note_handover). */
void member_handover_notice(struct member *member, struct vhost *vhost, uint64_t connection_id,
                            uint16_t channel_id, struct bytes name, uint64_t epoch,
                            struct bytes delivered, struct bytes redelivered);
/* A forward for a queue our map deleted since (fence_forward_gone). */
bool member_forward_gone(const struct member *member, struct bytes vhost, struct bytes queue,
                         uint64_t epoch);
/* A forward naming an older epoch of a queue whose primary is now another
 * broker (the sender's map lags ours: the queue was handed over, or failed
 * over): relayed through our stand-in rather than refused. */
bool member_forward_relays(const struct member *member, struct bytes vhost, struct bytes queue,
                           uint64_t epoch);
/* Whether a peer's forward for (vhost, queue) at epoch may be enqueued
 * here: this broker is the queue's primary and the epoch is current. */
bool member_forward_fresh(struct member *member, struct bytes vhost, struct bytes queue,
                          uint64_t epoch);

/* POST /api/cluster/leave (an http_action_fn; ctx is the member): this
 * broker leaves the cluster map and its Raft membership. 202 once the
 * changes are submitted (the broker can be stopped when it is gone from
 * /api/cluster), 409 while it is the primary or a backup of any queue
 * (their messages are here), 503 before it has caught up. */
struct json;
int member_leave(void *ctx, const char *request, size_t request_size, struct json *body);
/* POST /api/cluster/forget {"broker": NAME} (an http_action_fn; ctx is the
 * member): a broker that is down for good leaves the map, everything it
 * had going elsewhere first (controller_forget). 202 with what was
 * decided; 400 for a bad body, 404 for an unknown broker, 409 for one that
 * is not down (or no broker up to take its queues), 503 before this broker
 * serves the cluster. Completion shows in the map (GET /api/cluster). */
/* GET /api/cluster (an http_handler_fn; ctx: the member): the node's view
 * (cluster_node_write_fields) and the moves (moves_write_json). */
void member_cluster_json(void *ctx, struct json *body);
/* GET /api/cluster/events (an http_handler_fn; ctx: the member): the recent
 * cluster events (cluster_node_write_events). */
void member_events_json(void *ctx, struct json *body);
/* Every cluster action of the management API begins so: the answer's
 * object begun, and 503 (written, returned) if this broker does not serve
 * the cluster yet or is stopping; else 0. */
int member_api_begin(struct member *member, struct json *body);
/* The management API's refusals, as RabbitMQ's: {"error": the status text,
 * "reason": text} with status (returned);
 * the body's object was begun by the caller. */
int member_api_error(struct json *body, int status, const char *text);
/* A {"broker": NAME} request body (forget, drain): the broker it names, or
 * NULL with the answer written (400 malformed, 404 unknown) and its status
 * in *status. */
struct map_broker;
const struct map_broker *member_api_broker(const struct member *member, const char *request,
                                           size_t request_size, struct json *body,
                                           int *status);
int member_forget(void *ctx, const char *request, size_t request_size, struct json *body);

/* GET /api/cluster/links (an http_handler_fn; ctx is the member): our link
 * to each peer, [{"id", "name", "address", "up", "bytes_out", "frames_out",
 * "bytes_in", "frames_in", "connects"}], and the messages in flight to
 * other brokers ({"links": [...], "inflight_bytes": N, "flow": bool}). */
void member_write_links_json(void *ctx, struct json *out);

/* A peer's forward names a map epoch ours has not reached (the queue was
 * just declared, or moved to us): it is parked, its confirm waiting, and
 * routed once we have applied that far. */
struct confirm_sink;
struct message;
struct queue_forwarded;
bool member_map_behind(const struct member *member, struct bytes vhost, struct bytes queue,
                       uint64_t epoch);
void member_park_forward(struct member *member, struct vhost *vhost, struct bytes queue,
                         uint64_t epoch, struct message *message, struct confirm_sink *sink,
                         uint64_t seq, const struct queue_forwarded *f);

/* Places a new queue (decl's vhost, name, exclusive set): its primary,
 * backups and replication factor. pinned: an exclusive, auto-delete or
 * server-named queue stays with its connection. backups: x-quay-backups,
 * or -1 for the vhost's matching replication policy, else the default. */
void member_place_queue(struct member *member, struct map_queue_decl *decl, bool pinned,
                        int32_t backups);

/* A peer's basic.quay-sync: its next requests name map objects as of map
 * version `version` (a queue it just declared, or that moved to us), so
 * its link's input waits until our map has applied that far (at most
 * MEMBER_SYNC_WAIT_MS: then the requests are answered with the map we
 * have). member_sync_wait returns false when the map is there already;
 * else done(w) runs once it is (or the wait timed out), unless
 * member_sync_cancel came first. w is the caller's. */
#define MEMBER_SYNC_WAIT_MS 2000
struct member_sync_wait {
    struct list_node link;           /* in member->sync_waits */
    uint64_t version;
    uint64_t deadline_ms;
    void (*done)(struct member_sync_wait *w);
};
bool member_sync_wait(struct member *member, struct member_sync_wait *w, uint64_t version);
void member_sync_cancel(struct member_sync_wait *w);

/* How many links from other brokers we should have (the map's brokers
 * but us): --max-connections keeps slots for those not in yet. */
uint32_t member_peers_expected(const struct member *member);

/* The map's name for one of our connections (an exclusive queue's owner):
 * its id with this process's incarnation, so that a restarted broker never
 * takes an earlier process's exclusive queue for its own. Idempotent. */
uint64_t member_connection_key(const struct member *member, uint64_t connection_id);

/* The in-sync set the primary of queue (ours, at epoch) wants: the map is
 * asked for it (compare-and-set on the epoch) unless it already says so;
 * incarnations[i]: ids[i]'s process as the stream to it knew it (one the
 * map has replaced since is not put in sync); partial: one of them holds
 * the queue's transient messages only (map_cmd_queue_set_in_sync_partial).
 * True: a change was submitted. */
bool member_set_in_sync(struct member *member, struct queue *queue, uint64_t epoch,
                        const uint32_t *ids, const uint32_t *incarnations, uint8_t n,
                        bool partial);

/* A primary's replication stream (replica.h), received here as a backup:
 * push answers false when we are not a backup of it at that epoch, or
 * keep no copy of it (fence_replica_accepts). A reset (a catch-up's
 * start) names the map version its primary started the stream under. */
struct message;
bool member_replica_push(struct member *member, struct vhost *vhost, struct bytes name,
                         uint64_t epoch, uint64_t seq, struct message *message,
                         uint64_t origin_stream, uint64_t origin_seq);
void member_replica_settle(struct member *member, struct vhost *vhost, struct bytes name,
                           uint64_t epoch, uint64_t seq, uint64_t seq_last);
void member_replica_reset(struct member *member, struct vhost *vhost, struct bytes name,
                          uint64_t epoch, uint64_t stream_version);

/* mirror.c's helpers (module-internal). */
void member__sync_peers(struct member *member);
/* Proposes broker.storage when the map's record of our shared storage
 * differs from ours (after a sync, and when our broker entry changes). */
void member__announce_storage(struct member *member);
void member__publish_vhost(struct member *member, struct bytes vhost);
void member__route_parked(struct member *member, bool give_up);
/* Clients held back until our sync stay held while what our restart lost
 * is deleted from the map: one hold per deletion in flight. */
void member__hold_clients(struct member *member);
void member__release_clients(struct member *member);

#endif
