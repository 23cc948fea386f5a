/*
 * api_health.h: RabbitMQ 3.10's health checks under /api/health/checks/,
 * each answering 200 {"status": "ok", ...} or 503 {"status": "failed",
 * "reason": ..., ...} as its plugin does (monitoring tag):
 *   alarms, local-alarms       memory or disk alarms in the cluster, here
 *   virtual-hosts              every vhost is running (always, in quay)
 *   port-listener/{port}       this broker listens on port (AMQP, AMQPS,
 *                              the API, the cluster's Raft port)
 *   protocol-listener/{name}   amqp (amqp091, amqp0-9-1), amqp/ssl (amqps),
 *                              http, https, clustering
 *   certificate-expiration/{n}/{days|weeks|months|years}  the certificate
 *                              of --tls-cert outlives that
 *   node-is-mirror-sync-critical  no queue this broker is the primary of
 *                              has backups wanted but none in sync (stopping
 *                              it would leave such a queue unavailable)
 *   node-is-quorum-critical    stopping this broker leaves the cluster's
 *                              Raft voters a majority (quay's map is its
 *                              one quorum: no queue type of its own)
 * Outside a cluster the last two answer "single node cluster", as RabbitMQ.
 */
#ifndef QUAY_MGMT_API_HEALTH_H
#define QUAY_MGMT_API_HEALTH_H

#include "mgmt/http.h"

struct broker;

void api_health_register(struct http_server *http, struct broker *broker);

#endif
