/*
 * cluster_ops.h: what the broker needs from a cluster, declared here by
 * the broker and implemented by the cluster (cluster/member_ops.c), which
 * quayd's main plugs in at start-up (broker->cluster_ops; cli/services.c).
 * The broker never includes a cluster header: this table, and the queue
 * operations of a stand-in (queue_remote_ops, queue.h), are the whole seam.
 * broker->cluster_ops NULL: a single broker, and none of this is called.
 *
 * Every operation takes the cluster's context (broker->cluster_ctx) first.
 * None allocates on the message path: the forward and replica operations
 * run once per message a peer sent, as direct calls did before.
 *
 * Memory: the table is static in the cluster; the context is the broker's
 * once plugged in, which stops it (stop, in broker_stop) and frees it
 * (free, in broker_free). A wait (struct cluster_ops_wait) is the
 * cluster's until its done callback has run or the broker cancels it.
 */
#ifndef QUAY_BROKER_CLUSTER_OPS_H
#define QUAY_BROKER_CLUSTER_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"

struct confirm_sink;
struct message;
struct queue_forwarded;
struct vhost;

/* The reserved queue name a follower forwards map entries to (a peer's
 * basic.quay-forward with this target is a map entry for the leader). */
#define CLUSTER_OPS_MAP_TARGET "amq.quay.map"

/* A definition change a channel asks for, after its own checks passed;
 * the cluster turns it into a map command. Slices borrow from the caller
 * for the call only (the cluster copies what it keeps). */
enum cluster_ops_change_kind {
    CLUSTER_OPS_EXCHANGE_DECLARE,
    CLUSTER_OPS_EXCHANGE_DELETE,
    CLUSTER_OPS_BIND,
    CLUSTER_OPS_UNBIND,
    CLUSTER_OPS_QUEUE_DECLARE,
    CLUSTER_OPS_QUEUE_DELETE,
};

struct cluster_ops_change {
    enum cluster_ops_change_kind kind;
    struct bytes vhost;
    struct bytes name;          /* the exchange or queue; bind/unbind: the destination */
    struct bytes type;          /* exchange.declare: its type's name */
    struct bytes source;        /* bind/unbind: the source exchange */
    struct bytes routing_key;   /* bind/unbind */
    bool to_queue;              /* bind/unbind: the destination is a queue */
    bool durable;               /* declares */
    bool auto_delete;           /* declares */
    bool internal;              /* exchange.declare */
    bool exclusive;             /* queue.declare */
    bool if_unused;             /* exchange.delete */
    bool pinned;                /* queue.declare: its primary is this broker */
    int32_t backups;            /* queue.declare: x-quay-backups, -1: the default */
    struct table arguments;     /* declares, bind/unbind */
    uint64_t exclusive_connection_id; /* queue.declare: 0 unless exclusive */
    /* queue.declare: the incarnation of a queue of that name its primary
     * deleted and the map has not forgotten (0: none); queue.delete: the
     * incarnation to delete (0: whichever is there). */
    uint64_t epoch;
};

/* What a wait ends with. A change: committed (status OK: applied here,
 * with the map's reply code and text; changed false: it was so already)
 * or not (status < 0: the map cannot commit: no leader, no quorum). A
 * visibility wait: status OK (also when a peer was given up on). A sync
 * wait: status OK, version our map's version now. */
struct cluster_ops_answer {
    int status;
    bool changed;
    uint16_t reply_code;
    const char *reply_text;   /* NUL-terminated; borrowed for the call */
    uint64_t version;         /* the map's version after the change */
};

struct cluster_ops_wait;
typedef void (*cluster_ops_done_fn)(void *ctx, const struct cluster_ops_answer *answer);

struct cluster_ops {
    /* ---- lifetime ---- */
    /* broker_stop: the cluster lets go of the broker's peers (its links
     * close, no callback of it runs after this) and leaves (its consensus
     * node stops). */
    void (*stop)(void *cluster);
    /* broker_free, after the broker's queues (stand-ins are the cluster's
     * too) and before its leak checks. */
    void (*free)(void *cluster);

    /* ---- definitions (the map) ---- */
    /* Submits a change; done runs once it is committed and applied here
     * (a queue placed on a broker the map knows is down is placed again
     * first). NULL: the command could not be built (too large), done
     * will not run. */
    struct cluster_ops_wait *(*submit)(void *cluster, const struct cluster_ops_change *change,
                                       cluster_ops_done_fn done, void *ctx);
    /* Waits until every other broker has applied the map up to version.
     * NULL: nothing to wait for (done will not run). */
    struct cluster_ops_wait *(*await_visible)(void *cluster, uint64_t version,
                                              cluster_ops_done_fn done, void *ctx);
    /* A peer's basic.quay-sync: waits until our map has applied version
     * (or a timeout). NULL: it has already (done will not run). */
    struct cluster_ops_wait *(*await_synced)(void *cluster, uint64_t version,
                                             cluster_ops_done_fn done, void *ctx);
    /* Done will not run. */
    void (*cancel)(void *cluster, struct cluster_ops_wait *wait);
    uint64_t (*map_version)(void *cluster);
    /* Whether the map is applied up to the present (a client's
     * connection.open waits for it: connection_cluster_synced). */
    bool (*synced)(void *cluster);
    /* --partition-handling pause-minority: the broker is cut off from the
     * cluster's majority, its clients' connections closed; a client's
     * connection.open is refused (320) until it hears the majority. */
    bool (*paused)(void *cluster);
    /* connection.open-ok's known-hosts: "host:port,..." of the brokers
     * that are up, cut to fit cap. Returns the length. */
    size_t (*known_hosts)(void *cluster, char *out, size_t cap);
    /* Sends every peer this broker's counts of what connection and
     * channel limits count (a basic.quay-usage; broker/usage.h). counts
     * is borrowed for the call. */
    void (*share_usage)(void *cluster, struct table counts);
    /* How many links from other brokers there should be. */
    uint32_t (*peers_expected)(void *cluster);
    /* One of our queues went away (auto-delete, x-expires, an exclusive
     * owner's end): the map is told. */
    void (*queue_gone)(void *cluster, struct bytes vhost, struct bytes name);

    /* ---- what peers send on their links ---- */
    /* A map entry forwarded to the leader (CLUSTER_OPS_MAP_TARGET). */
    void (*propose_entry)(void *cluster, const uint8_t *entry, uint64_t size);
    /* A forward for (vhost, queue) at epoch: may it be enqueued here (we
     * are its primary at that epoch)? Is our map behind the sender's (then
     * it is parked until ours has caught up)? Does our stand-in relay it
     * (the queue was handed over since)? Was the queue deleted since
     * (forward_gone: routed to a queue that then went, confirmed)? */
    bool (*forward_fresh)(void *cluster, struct bytes vhost, struct bytes queue,
                          uint64_t epoch);
    bool (*map_behind)(void *cluster, struct bytes vhost, struct bytes queue, uint64_t epoch);
    void (*park_forward)(void *cluster, struct vhost *vhost, struct bytes queue, uint64_t epoch,
                         struct message *message, struct confirm_sink *sink, uint64_t seq,
                         const struct queue_forwarded *f);
    bool (*forward_relays)(void *cluster, struct bytes vhost, struct bytes queue,
                           uint64_t epoch);
    bool (*forward_gone)(void *cluster, struct bytes vhost, struct bytes queue, uint64_t epoch);
    /* A primary's replication to us, a backup: false if refused. origin:
     * the forward the primary recorded it as (stream 0: none; origin.h). */
    bool (*replica_push)(void *cluster, struct vhost *vhost, struct bytes name, uint64_t epoch,
                         uint64_t seq, struct message *message, uint64_t origin_stream,
                         uint64_t origin_seq);
    /* basic.quay-settle: one message left the queue (seq), or each of
     * seq..seq_last (a purge's run; seq_last 0: seq alone), or (purge) a
     * catch-up starts over, its seq the map version its primary started
     * it under (0 from a primary from before). And basic.quay-handover. */
    void (*replica_settle)(void *cluster, struct vhost *vhost, struct bytes name,
                           uint64_t epoch, uint64_t seq, uint64_t seq_last);
    void (*replica_reset)(void *cluster, struct vhost *vhost, struct bytes name,
                          uint64_t epoch, uint64_t stream_version);
    void (*handover_notice)(void *cluster, struct vhost *vhost, uint64_t connection_id,
                            uint16_t channel_id, struct bytes name, uint64_t epoch,
                            struct bytes delivered, struct bytes redelivered);
};

#endif
