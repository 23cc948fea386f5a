/*
 * metrics.h: GET /metrics, this broker in Prometheus's text exposition
 * format (version 0.0.4, mgmt/prom.h), for one scrape target per broker.
 *
 * Names: RabbitMQ's rabbitmq_prometheus names where a metric means the
 * same (rabbitmq_queue_messages_ready{vhost,queue}, rabbitmq_connections,
 * rabbitmq_global_messages_received_total{protocol="amqp091"}, ...), so
 * its dashboards and alerts carry over; quay_ names for what RabbitMQ does
 * not have (the cluster map, Raft, each queue's role and backups, links).
 * As RabbitMQ's per-object endpoint, per-queue samples are labelled vhost
 * and queue, and a broker shows the queues it is the primary of: summed
 * over every broker of a cluster they count each queue once. The global
 * counters are this broker's clients' (broker.h: broker_counters), so
 * they add up over a cluster too.
 *
 * Cost, and what a scrape sees: the answer is built on the loop thread a
 * slice of at most ~1 ms a loop turn (METRICS_SLICE_US), so a scrape of
 * 50,000 queues never holds up the message path for longer than that; it
 * is sent once whole, with its Content-Length. The queues are walked
 * with broker/queue_walk.h: a scrape shows every queue that existed when
 * it began and was not deleted before the walk reached it, each once,
 * with its figures as of the moment the walk passed it; queues declared
 * meanwhile wait for the next scrape. The other families are read in
 * the turn the walk ends. metrics.c has the figures and the design.
 *
 * Access: the monitoring tag (node-level data, as GET /api/cluster).
 */
#ifndef QUAY_MGMT_METRICS_H
#define QUAY_MGMT_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"

struct broker;
struct cluster_map;
struct http_server;
struct prom;
struct queue;

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
/* The longest a scrape works in one loop turn before it lets the loop go
 * on (it checks the clock every few dozen queues, so a slice may run a
 * few tens of microseconds over). */
#define METRICS_SLICE_US 1000u

/* Adds GET /metrics to the API's server (before or after it listens). */
void metrics_register(struct http_server *http, struct broker *broker);

/* ---- the cluster's part (metrics_cluster.c) ------------------------------ */

struct map_vhost;

/* What the per-queue reads need, taken again each run of the walk (the
 * map may change between loop turns, never within one). */
struct metrics_cluster_view {
    const struct cluster_map *map; /* borrowed */
    uint32_t self;
    /* The last queue's vhost in the map (queues come mostly vhost by
     * vhost): one lookup a queue, not two. */
    const void *vhost_key;         /* borrowed: the vhost name's bytes looked up */
    const struct map_vhost *map_vhost; /* borrowed, or NULL: not in the map */
};

/* Counted over the queues the walk read. */
struct metrics_cluster_totals {
    uint64_t unavailable;
    uint64_t moving;
};

/* This broker's role for a queue, in quay_queue_role's label. */
enum metrics_role {
    METRICS_ROLE_NONE,             /* not in the map: no cluster sample */
    METRICS_ROLE_PRIMARY,
    METRICS_ROLE_BACKUP,
    METRICS_ROLE_PROXY,
};

/* False outside a cluster. */
bool metrics__cluster_view(struct broker *broker, struct metrics_cluster_view *view);
/* The queue's role here from the map, and for a primary its backups and
 * how many are in sync; counts it into totals. */
enum metrics_role metrics__cluster_queue(struct metrics_cluster_view *view, struct queue *queue,
                                         uint8_t *backups, uint8_t *in_sync,
                                         struct metrics_cluster_totals *totals);
/* The cluster's other families; nothing outside a cluster. */
void metrics__write_cluster(struct prom *prom, struct broker *broker,
                            const struct metrics_cluster_totals *totals);

#endif
