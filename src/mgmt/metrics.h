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
 * Cost: one buffer written front to back on the loop thread; each family
 * walks the queue table once (the format wants a family's samples
 * together), with no allocation and no sorting. See metrics.c for the
 * figures measured with 50,000 queues.
 *
 * Access: the monitoring tag (node-level data, as GET /api/cluster).
 */
#ifndef QUAY_MGMT_METRICS_H
#define QUAY_MGMT_METRICS_H

struct broker;
struct http_server;
struct prom;

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Adds GET /metrics to the API's server (before or after it listens). */
void metrics_register(struct http_server *http, struct broker *broker);

/* The cluster's families (metrics_cluster.c); nothing outside a cluster. */
void metrics__write_cluster(struct prom *prom, struct broker *broker);

#endif
