/*
 * api_nodes.h: RabbitMQ's node and health endpoints of the management API.
 *
 *   GET /api/nodes[/{name}]          one per broker: this one alone, or every
 *                                    broker of the cluster map. RabbitMQ's name,
 *                                    type ("disc"), running, uptime, and for this
 *                                    broker mem_used, mem_limit, mem_alarm,
 *                                    disk_free, disk_free_limit, disk_free_alarm;
 *                                    quay's state, voter, queues_owned,
 *                                    backups_held, amqp_address (clustered).
 *                                    Another broker's memory and disk are not
 *                                    known here and are left out.
 *   GET /api/healthchecks/node       {"status": "ok"}, or 503 with "failed"
 *   GET /api/health/checks/alarms    no alarm anywhere in the cluster
 *   GET /api/health/checks/local-alarms   no alarm of this broker
 *   GET /api/aliveness-test/{vhost}  declares queue "aliveness-test", publishes
 *                                    to it and gets the message back, over AMQP
 *                                    as the user: {"status": "ok"}
 */
#ifndef QUAY_MGMT_API_NODES_H
#define QUAY_MGMT_API_NODES_H

#include "mgmt/http.h"

struct broker;

void api_nodes_register(struct http_server *http, struct broker *broker);

/* GET /api/overview's RabbitMQ fields, added to quay's (api.c): versions,
 * cluster_name, node, object_totals, queue_totals (this broker's counts,
 * as /api/overview's own totals), message_stats (the broker's totals
 * since start, of its clients, each with its rate: api_stats.h),
 * rates_mode "basic", listeners, exchange_types. */
struct json;
struct auth_user;
struct broker_queue_totals;
/* queues: the queue totals user sees (broker_queue_totals). */
void api_overview_write_rabbit(struct json *out, struct broker *broker,
                               const struct auth_user *user,
                               const struct broker_queue_totals *queues);

#endif
