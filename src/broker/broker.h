/*
 * broker.h: one broker process's state, owned by the loop thread.
 *
 * struct broker is the root of ownership: vhosts (and through them every
 * exchange and queue), the users table, the listeners and every client
 * connection. It is passed explicitly; there is no global broker.
 */
#ifndef QUAY_BROKER_BROKER_H
#define QUAY_BROKER_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "broker/alarm.h"
#include "broker/auth.h"
#include "broker/durable.h"
#include "broker/limits.h"
#include "broker/usage.h"
#include "broker/policy.h"
#include "broker/rates.h"
#include "broker/reclaim.h"
#include "lib/hash.h"
#include "lib/list.h"
#include "net/conn.h"
#include "net/listener.h"
#include "net/tls.h"

#define BROKER_LISTENERS_MAX 8

struct cluster_ops;

/* Limits. Every one is enforced with the reply code the spec names. */
struct broker_limits {
    uint32_t frame_max;             /* bytes, whole frame; offered in connection.tune */
    uint16_t channel_max;           /* offered in connection.tune */
    uint16_t heartbeat_s;           /* offered in connection.tune */
    uint32_t handshake_timeout_ms;  /* header to open-ok */
    uint64_t message_size_max;      /* body bytes; larger publishes get 406 */
    uint32_t connections_max;       /* 0 = unlimited */
    uint32_t handshaking_max;       /* connections not logged in yet; 0 = unlimited */
    uint32_t consumers_per_channel_max;
    uint32_t queues_max;
    uint32_t read_batch_us;         /* longest a streaming client waits for a batch; 0 = off */
    uint32_t read_share;            /* a client's input a loop turn; 0 = no limit */
};

/* Where a queue declared through this broker gets its primary, in a
 * cluster (--queue-locator). */
enum queue_locator {
    QUEUE_LOCATOR_RING,   /* the placement ring; a queue that lives with its
                           * connection (exclusive, auto-delete, server-named) here */
    QUEUE_LOCATOR_OTHERS, /* on another broker whenever one is up: a front that
                           * only proxies (and how the tests reach every queue
                           * through a proxy) */
};

struct broker_config {
    uint64_t memory_high_watermark;  /* bytes; 0 = no memory alarm */
    uint64_t disk_free_limit;        /* bytes; 0 = no disk alarm */
    const char *listen[BROKER_LISTENERS_MAX];
    uint32_t listen_count;
    const char *data_dir;
    /* --shared-storage DIR: the journal is journal_dir, DIR/<name>/, and
     * storage_id DIR's id (store/shared_storage.h); NULL without, and the
     * journal is data_dir. */
    const char *shared_storage_dir;
    const char *journal_dir;
    const char *storage_id;
    const char *users_file;
    /* --password-hashing-module, --pbkdf2-iterations: how new passwords
     * are stored (broker/password.h); zero: sha256. */
    struct password_policy password_policy;
    const char *http_listen;         /* management API "ADDR:PORT"; NULL = off */
    const char *http_allowed_hosts;  /* names its Host header may give (mgmt/http_guard.h) */
    bool http_tls;                   /* --https: the API is served over TLS */
    const char *tls_listen[BROKER_LISTENERS_MAX]; /* AMQPS listeners (--tls-listen) */
    uint32_t tls_listen_count;
    /* --tls-cert/--tls-key/--tls-ca/--tls-verify, for AMQPS and HTTPS;
     * cert_file NULL = no TLS configured. */
    struct tls_config tls;
    /* --cluster-tls: links between brokers go over AMQPS with mutual
     * certificate authentication, in addition to the cluster secret. */
    bool cluster_tls;
    /* --cluster-listen: this broker will be in a cluster (quayd's main
     * joins it after broker_start and plugs it in: broker->cluster_ops). */
    bool clustered;
    uint8_t default_backups;         /* cluster: backups of a queue without x-quay-backups */
    enum queue_locator queue_locator; /* cluster: where declared queues live */
    bool auto_rebalance;              /* cluster: the map's rebalance mode if unset */
    bool pause_minority;              /* cluster: --partition-handling pause-minority */
    uint64_t catch_up_rate;           /* cluster: catch-up bytes/s (0: unbounded; 300 MB) */
    struct broker_limits limits;
};

/* What this broker's clients did with messages since it started, counted
 * where it happens (one increment, nothing per queue): GET /metrics
 * exports them as RabbitMQ's rabbitmq_global_messages_*_total. Other
 * brokers' links (connection.cluster_peer) are not counted, so that the
 * brokers of a cluster add up without counting a proxied message twice:
 * a publish counts at the broker its publisher is connected to, a
 * delivery and its ack at the consumer's. */
struct broker_counters {
    uint64_t received;                 /* publishes whose content arrived */
    uint64_t received_confirm;         /* of them, on a channel in confirm mode */
    uint64_t routed;                   /* publishes that reached at least one queue */
    uint64_t unroutable_returned;      /* mandatory publishes that reached no queue */
    uint64_t unroutable_dropped;       /* the others that reached no queue */
    uint64_t confirmed;                /* publishes acked to their publisher */
    union {
        struct {
            uint64_t delivered_consume_ack;    /* basic.deliver to a consumer that acks */
            uint64_t delivered_consume_no_ack; /* basic.deliver with no-ack */
            uint64_t delivered_get_ack;        /* basic.get-ok, to be acked */
            uint64_t delivered_get_no_ack;     /* basic.get-ok with no-ack */
        };
        uint64_t delivered[4];                 /* the same, by (a get) << 1 | (no-ack) */
    };
    uint64_t redelivered;              /* of all those, ones flagged redelivered */
    uint64_t acknowledged;             /* deliveries the client acked */
    uint64_t flow_stops;               /* connections stopped by a congested queue (flow.h) */
    uint64_t forward_duplicates;       /* peers' forwards a queue had taken already (origin.h) */
    uint64_t forward_channels_frozen;  /* peers' forward channels that stopped recording */
};

_Static_assert(offsetof(struct broker_counters, delivered_get_no_ack) ==
                   offsetof(struct broker_counters, delivered) + 3 * sizeof(uint64_t),
               "delivered[] overlays the four delivery counters");

/* The broker_counters the tick samples for rates (rates.h), by index. */
enum broker_rate {
    BROKER_RATE_PUBLISH,
    BROKER_RATE_CONFIRM,
    BROKER_RATE_DELIVER,
    BROKER_RATE_DELIVER_NO_ACK,
    BROKER_RATE_GET,
    BROKER_RATE_GET_NO_ACK,
    BROKER_RATE_REDELIVER,
    BROKER_RATE_ACK,
    BROKER_RATE_RETURN_UNROUTABLE,
    BROKER_RATE_DROP_UNROUTABLE,
    BROKER_RATE_COUNT
};
_Static_assert(BROKER_RATE_COUNT <= RATES_VALUES_MAX, "the broker's samples fit struct rates");

/* The round of samples (rates.h) is taken in this many ticks, 250 ms apart. */
#define BROKER_RATES_PARTS 4

/* The sums of every queue's counts the tick samples (RabbitMQ's
 * /api/overview queue_totals.*_details). */
enum broker_totals_rate {
    BROKER_TOTALS_RATE_MESSAGES,
    BROKER_TOTALS_RATE_READY,
    BROKER_TOTALS_RATE_UNACKED,
    BROKER_TOTALS_RATE_COUNT
};

/* A service quayd's main runs beside the broker (the management API):
 * the broker stops and frees it at its place in the broker's shutdown.
 * stop NULL: none. */
struct vhost;
struct queue;

struct broker_service {
    void (*stop)(void *ctx);  /* idempotent */
    void (*free)(void *ctx);
    void *ctx;                /* owned through free */
};

struct broker {
    uv_loop_t *loop;               /* borrowed */
    struct broker_config config;
    struct net net;
    struct listener listeners[BROKER_LISTENERS_MAX];
    uint32_t listeners_count;
    struct listener tls_listeners[BROKER_LISTENERS_MAX]; /* AMQPS */
    uint32_t tls_listeners_count;
    /* AMQPS's settings (--tls-verify), and HTTPS's: the same files, with
     * no client certificate asked for (the API logs in with passwords).
     * ctx is NULL when not in use. Replaced on SIGHUP (broker_reload_tls). */
    struct tls_context amqps_tls;
    struct tls_context https_tls;
    /* --cluster-tls: our links' client side (our certificate, the CAs
     * peers' certificates must verify against). */
    struct tls_context cluster_tls;
    /* --cluster-tls: the Raft listener's side (a client certificate of the
     * cluster's CAs required; cluster/raft_tls.h). */
    struct tls_context raft_tls;
    struct auth auth;
    struct hmap vhosts;            /* name -> struct vhost (owned) */
    /* Deleted vhosts (broker_retire_vhost), emptied but kept until
     * broker_free: connections and peers' channels closing may still
     * point at them. One small object per deletion. */
    struct vhost **retired_vhosts; /* owned */
    uint32_t retired_vhosts_count;
    struct list_node connections;  /* struct connection.broker_link */
    uint32_t connections_count;
    uint32_t peer_connections_count; /* of them, other brokers' links (not clients) */
    uint32_t handshaking_count;    /* of them, not logged in yet (connection.handshaking) */
    uint64_t handshaking_refused;  /* refused over limits.handshaking_max, ever */
    uint64_t handshaking_logged_ms; /* the last warning about them (one a second) */
    uv_timer_t tick;               /* heartbeats, handshake timeouts, alarms */
    uv_timer_t shutdown_timer;     /* cuts clients that ignore our close */
    struct alarm alarm;
    struct durable durable;        /* the journal: definitions and messages */
    /* Replication policies when not clustered (kept and shown, with no
     * backups to set; in a cluster the map holds them). */
    struct policy_set policies;
    /* Vhost and user limits (broker/limits.h), what connection.open,
     * channel.open and queue.declare check: outside a cluster the record
     * (the journal keeps it), in a cluster a copy of the map's. */
    struct limit_set limits;
    /* What other brokers' clients hold of those limits (usage.h). */
    struct usage usage;
    /* The cluster this broker is in (cluster_ops.h), plugged in by quayd's
     * main once it joined: NULL when single. The broker stops it
     * (ops->stop) and frees it (ops->free) in its own shutdown order. */
    const struct cluster_ops *cluster_ops;
    void *cluster_ctx;             /* owned through cluster_ops->free */
    /* The management API, when quayd's main started one: stopped with the
     * listeners, freed once the loop has closed its handles. */
    struct broker_service http;
    /* The cluster secret (borrowed from the node; empty when not clustered):
     * peer brokers log in with it (mechanism QUAY-CLUSTER, cluster/link.h). */
    struct bytes cluster_secret;
    /* Channels that owe their publishers confirms: sent together at the
     * end of the loop iteration (confirms_hook), one multiple ack each. */
    struct list_node confirms_owed; /* struct channel.confirm_link */
    struct list_node flow_congested; /* struct queue.flow.congested_link (flow.h) */
    struct net_flush_hook confirms_hook;
    struct broker_counters counters;
    struct rates_clock rates_clock; /* when the tick sampled rates (rates.h) */
    struct rates rates;             /* of counters */
    struct rates totals_rates;      /* of every queue's counts (enum broker_totals_rate) */
    uint64_t rates_due_ms;          /* the next round's loop time */
    uint8_t rates_phase;            /* the part of the queues the next tick samples */
    uint8_t rates_next_part;        /* the part a new queue joins (round-robin) */
    /* The owners a round samples (rates.h): the queues in BROKER_RATES_PARTS
     * lists, one a tick, each queue always in the same one. */
    struct rates_active queues_active[BROKER_RATES_PARTS];
    struct rates_active channels_active;
    struct rates_active connections_active;
    /* Every queue's counts as of its newest sample, kept by the deltas of
     * the queues sampled (queue_sample_rates) and taken out when a queue
     * goes (queue.c): exact without walking idle queues. */
    uint32_t rates_totals[BROKER_TOTALS_RATE_COUNT];
    /* Every queue object in any vhost's table, in the order they joined,
     * deleted ones too until they are freed (struct queue.all_link): what
     * a walk that pauses between loop turns follows (queue_walk.h). */
    struct list_node queues_all;
    uint64_t queues_all_serial;     /* the last queue's all_serial */
    /* Copies and queues let go of in bulk, emptied a slice a loop turn. */
    struct reclaim reclaim;
    bool stopping;
};

void broker_config_defaults(struct broker_config *config);
/* Loads users, creates vhosts, opens listeners. Returns 0 or -1 (logged). */
int broker_start(struct broker *broker, uv_loop_t *loop, const struct broker_config *config);
/* Closes listeners, says goodbye to every client (320), and lets the loop
 * run until they are gone (at most a couple of seconds). */
void broker_stop(struct broker *broker);
/* Closes every client's connection (320 CONNECTION_FORCED, reason) and
 * leaves other brokers' links be. */
void broker_close_clients(struct broker *broker, const char *reason);
/* SIGHUP: loads the TLS certificates, keys and CAs again; connections
 * accepted from now on use them. A file that fails to load is logged and
 * the previous settings stay. Returns 0, or -1 if any failed. */
int broker_reload_tls(struct broker *broker);
/* After the loop has finished: frees the rest and checks for leaks. */
void broker_free(struct broker *broker);

/* A queue object entered a vhost's table: it joins broker->queues_all
 * (once: a queue put back keeps its place). vhost.c's. */
void broker_queue_joined(struct broker *broker, struct queue *queue);

struct vhost *broker_vhost(struct broker *broker, struct bytes name);
/* The vhost of that name, created (with its predeclared exchanges) if new. */
struct vhost *broker_add_vhost(struct broker *broker, struct bytes name);
/* Deletes the vhost's queues and exchanges (with their journal records)
 * and its own record, and takes it out of broker->vhosts. Its connections
 * are the caller's to close (broker/users.c). */
void broker_retire_vhost(struct broker *broker, struct vhost *vhost);
/* The tick's share of sampling rates (rates.h), every 250 ms: a round
 * starts once a second, then one part of the active queues a tick. Tests
 * drive it by hand with their own loop times. */
void broker_sample_rates(struct broker *broker, uint64_t now_ms);

/* The queue counts of /api/overview: the sums over the queues of the
 * vhosts sees accepts (every vhost when sees is NULL). O(vhosts + queues
 * whose counts moved in the last rates window), not O(queues): the vhosts'
 * totals (vhost.h) plus, for each queue on the active lists, its change
 * since its newest sample (an unlisted queue holds its newest: rates.h).
 * Sanitized builds check the result against a walk of every queue. */
struct broker_queue_totals {
    uint64_t queues;
    uint64_t consumers;
    uint64_t ready;
    uint64_t unacked;
    uint64_t paged;
};
typedef bool (*broker_vhost_filter)(const struct vhost *vhost, const void *ctx);
void broker_queue_totals(struct broker *broker, broker_vhost_filter sees, const void *ctx,
                         struct broker_queue_totals *totals);
/* A client connection was freed (connection.c). */
void broker__connection_gone(struct broker *broker);
/* Writes a unique name such as "amq.gen-XXXXXXXXXXXXXXXXXXXXXX" (22 chars,
 * like RabbitMQ's base64 of 16 random bytes). */
void broker_generate_name(struct broker *broker, const char *prefix, char *out, size_t out_size);

#endif
