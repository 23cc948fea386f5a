/*
 * node_int.h: what node.c (consensus, proposals, the controller loop,
 * start and stop), node_config.c, node_heartbeat.c, node_request.c and
 * node_json.c share: the node itself. Not for other modules.
 */
#ifndef QUAY_CLUSTER_NODE_INT_H
#define QUAY_CLUSTER_NODE_INT_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cluster/controller.h"
#include "cluster/fence.h"
#include "cluster/heartbeat.h"
#include "cluster/map.h"
#include "cluster/map_events.h"
#include "cluster/node.h"
#include "cluster/outbox.h"
#include "lib/list.h"

#define SECRET_SIZE_MIN 16
#define SECRET_SIZE_MAX 1024
#define ADDRESS_SIZE (CLUSTER_NAME_SIZE_MAX + 1)
#define ENVELOPE_HEADER_SIZE 16

/* What this node knows of one member (itself included, at index 0), from
 * its heartbeats. Owned by the node. */
struct peer {
    uint32_t id;
    bool stopping;            /* its last heartbeat said it is shutting down */
    uint8_t alarms;           /* HEARTBEAT_FLAG_*_ALARM of its last heartbeat (ours: we send) */
    bool join_in_flight;      /* leader: a broker.join for it is proposed */
    bool join_refused;        /* leader: refused at refused_version; wait for a change */
    uint64_t refused_version; /* map brokers_version when it was refused */
    uint64_t sequence;
    /* Its process (heartbeats' incarnation; ours: drawn at start, random,
     * never 0), 0 until heard from a sender that says. */
    uint32_t incarnation;
    uint64_t last_heard_ms;   /* loop clock; 0 = never */
    uint32_t map_version;     /* its heartbeats': the map it has applied (low bits); 0 = never */
    struct fence_heard lease; /* what its heartbeats count for our lease */
    uint64_t reset_at_ms;     /* our AMQP link to it dropped (EOF or reset) at; 0 = never */
    char name[ADDRESS_SIZE];
    char amqp_address[ADDRESS_SIZE];
    char cluster_address[ADDRESS_SIZE];
};

/* A client's definition change waiting for its entry to be applied here.
 * Owned by the node (node->requests) until done ran or it was cancelled. */
struct cluster_request {
    struct list_node link;
    struct cluster_node *node;
    uint64_t id;
    uint8_t *entry; /* owned: the whole log entry (envelope included) */
    size_t entry_size;
    uint64_t deadline_ms;
    uint64_t sent_ms;   /* last proposal or forward; 0 = not yet */
    bool in_consensus;  /* proposed here, consensus has not answered */
    cluster_submit_fn done; /* never NULL (a cancelled request is freed) */
    void *ctx;
};

/* Each broker's share of the map's queues and how many queues are being
 * moved, as of a map version: /api/cluster and /api/overview show them,
 * and a walk of 50,000 queues to count them cost the loop ~4 ms a
 * request, while the map changes far less often than it is read
 * (node_json.c). */
struct node_shares {
    bool valid;
    uint64_t version;              /* the map's, when counted */
    uint64_t brokers_version;
    uint32_t brokers_count;
    uint32_t primaries[CLUSTER_BROKERS_MAX]; /* by index in map.brokers */
    uint32_t unavailable[CLUSTER_BROKERS_MAX];
    uint32_t backups[CLUSTER_BROKERS_MAX];
    uint32_t moving;               /* queues with a move_to */
};

struct cluster_node {
    uv_loop_t *loop; /* borrowed */
    struct node_shares shares; /* node_json.c's */
    struct cluster_node_hooks hooks;
    struct list_node requests; /* struct cluster_request, oldest first */
    uint64_t next_request;
    bool synced;         /* our sync applied since this process started */
    /* What this process found in its log when it started: the last entry
     * (restart_index), and the map version once the entries up to it are
     * applied here (restart_version). Whatever a map object's owner got
     * after restart_version, it got from this incarnation. */
    bool starting;
    uint64_t restart_index, restart_version;
    /* The map version at which the map first named this process (our
     * incarnation); UINT64_MAX until it does. What a map object's owner
     * got from then on it got from this process; before, from an earlier
     * one of ours that may have held more than we do. */
    uint64_t known_since;
    bool nudge_in_flight; /* leader: a sync proposed to publish the commit index */
    uint32_t leaving[CLUSTER_BROKERS_MAX]; /* left the map: the leader removes them from Raft */
    uint32_t leaving_count;
    uint32_t departed[CLUSTER_BROKERS_MAX]; /* leader: removed, maybe still Raft members */
    uint32_t departed_count;
    bool nudge_again;
    bool sync_pending;
    struct consensus *consensus;
    struct cluster_map map;
    struct map_events events; /* the recent ones, for the console (map_events.h) */
    struct controller_config controller;
    uint32_t id;
    uint8_t secret[SECRET_SIZE_MAX];
    size_t secret_size;
    uv_udp_t udp;
    uv_timer_t timer;
    struct outbox outbox;    /* leader: requests of this loop iteration (outbox.h) */
    int handles_open;        /* udp, timer, outbox */
    bool consensus_open;
    bool stopping;
    bool joining;            /* consensus_join() has not completed */
    uint64_t join_warned_ms;
    uint64_t leader_id;
    uint64_t hurried_for;    /* the leader we stopped waiting for (see hurry_election) */
    uint64_t leaderless_term;   /* the term when no leader was known at the last tick */
    uint8_t leaderless_rounds;  /* terms since then that elected none (backoff) */
    bool leader;             /* this node is the Raft leader */
    bool controller_ready;   /* leader, and its barrier committed */
    bool barrier_in_flight;
    uint64_t leader_since_ms;
    uint32_t liveness_in_flight;
    uint32_t policy_in_flight;     /* controller_apply_policies' commands */
    uint32_t proposals_in_flight;
    struct controller_leader ctl;  /* the round's and the policies' memory (controller.h) */
    bool auto_rebalance;     /* --auto-rebalance */
    uint64_t sequence;
    uint64_t lease_until_ms; /* loop clock: see NODE_LEASE_MS */
    struct peer peers[CLUSTER_BROKERS_MAX]; /* [0] is this node */
    uint32_t peers_count;
    uint64_t heartbeat_dropped_count; /* malformed, bad MAC, replayed: glitches */
    uint8_t recv_buffer[HEARTBEAT_SIZE_MAX + 64];
};

/* ---- node.c ---- */

struct peer *node__peer_find(struct cluster_node *node, uint64_t id);
/* The log entry for cmd: envelope, command, padding. Owned by the caller. */
uint8_t *node__entry_new(const struct map_cmd *cmd, uint64_t request_id, size_t *size_out);

/* ---- node_config.c ---- */

/* "a.b.c.d:port" -> out. 0, or -1 if it is not one. */
int node__parse_ipv4_address(const char *address, struct sockaddr_in *out);
/* A broker name: 1..CLUSTER_NAME_SIZE_MAX bytes, printable, no spaces. */
bool node__name_ok(const char *s);
/* Reads the secret file into out (at least SECRET_SIZE_MIN bytes); with
 * out NULL, only checks it. 0, or -1 with a message in err. */
int node__read_secret(const char *path, uint8_t *out, size_t *size_out, char *err,
                      size_t err_size);
/* The broker id in DATA/cluster-id, created on the first start. 0, or -1
 * with a message in err. */
int node__load_or_create_id(const char *data_dir, uint32_t *id_out, char *err,
                            size_t err_size);

/* ---- node_heartbeat.c ---- */

/* The lease lasts NODE_LEASE_MS past the moment the majority-th broker
 * (counting ourselves) was last heard. */
void node__lease_update(struct cluster_node *node);
/* To every Raft member but ourselves. A lost datagram is only a late one. */
void node__heartbeat_send(struct cluster_node *node, bool stopping);
/* Binds the heartbeat port (udp, the cluster address) and receives. */
int node__open_udp(struct cluster_node *node, const char *address, char *err, size_t err_size);

/* ---- node_request.c ---- */

/* Frees the request, then tells its requester (which may submit again). */
void node__request_finish(struct cluster_request *r, int status,
                          const struct map_change *change);
/* The entry of request id was applied here (if it is ours and pending). */
void node__request_applied(struct cluster_node *node, uint64_t id, int rc,
                           const struct map_change *change);
/* Sends again what was not applied in time; fails what timed out. */
void node__request_tick(struct cluster_node *node, uint64_t now);
/* After a start, a sync through the log tells us when every command
 * committed before it has been applied here. */
void node__sync_tick(struct cluster_node *node);

#endif
