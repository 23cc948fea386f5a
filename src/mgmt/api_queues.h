/*
 * api_queues.h: RabbitMQ's queue endpoints of the management API.
 *
 *   GET    /api/queues[/{vhost}]             the queues (api_list.h: sort, columns, pages)
 *   GET    /api/queues/{vhost}/{name}        one (404 {"error": "Object Not Found"})
 *   PUT    /api/queues/{vhost}/{name}        declare: {"durable", "auto_delete",
 *                                            "arguments"}; 201 created, 204 existed
 *   DELETE /api/queues/{vhost}/{name}        204 (?if-empty=true, ?if-unused=true)
 *   DELETE /api/queues/{vhost}/{name}/contents   purge, 204
 *   POST   /api/queues/{vhost}/{name}/get    {"count", "ackmode", "encoding", "truncate"}
 *   GET    /api/queues/{vhost}/{name}/bindings   its bindings
 *
 * A queue's fields are RabbitMQ's (name, vhost, durable, auto_delete,
 * exclusive, arguments, messages = ready + unacknowledged, messages_ready,
 * messages_unacknowledged, consumers, memory, message_bytes_ready, state,
 * type, node = its primary, policy) plus quay's own: paged, dedup_ids,
 * primary, role, backups, in_sync, epoch, replication_factor, available,
 * "counts_from": "primary" or "local" (below), and "message_stats_from".
 *
 * message_stats are RabbitMQ's (publish, deliver, deliver_no_ack, get,
 * get_no_ack, deliver_get, redeliver, ack; each with "X_details":
 * {"rate": R}, per second over the last 5 s, broker/rates.h), with
 * messages_details, messages_ready_details and
 * messages_unacknowledged_details (the rates of change of the counts).
 * They are this broker's own counters of the queue (struct queue_stats),
 * always shown (RabbitMQ leaves message_stats out until there is traffic).
 * On the primary ("message_stats_from": "primary") they count the queue's
 * whole traffic, the stand-ins' forwards and uplinks included; on a
 * stand-in ("local") only what passed through this broker: its local
 * publishers, consumers and getters (nothing new is asked of the primary:
 * its queue.declare-ok carries no counters). The stand-ins' uplinks
 * consume and get in ack mode, so a no-ack client behind a stand-in counts
 * as deliver/get and ack on the primary. The *_details of the counts are of
 * this broker's counts too (a stand-in's are its own, usually 0). The
 * counters are not replicated or journalled: they start at 0 when the
 * broker starts, and a promotion or a demotion (failover, move) makes the
 * queue object anew (cluster/mirror.c), whose counters start at 0 too.
 *
 * In a cluster every broker lists every queue (each has a stand-in for
 * the queues other brokers are primary of). The counts of a queue whose
 * primary is elsewhere are asked of the primary through the stand-in
 * (proxy_query, the passive queue.declare a client's would send):
 * messages_ready and consumers are then the primary's ("counts_from":
 * "primary"); messages_unacknowledged stays this broker's own (the
 * primary's queue.declare-ok does not carry it). If the primary cannot be
 * asked now (proxy_stub_reachable), or has not answered within 3 s, the
 * local counts are shown ("counts_from": "local").
 *
 * Changes go over AMQP as the user (api_amqp.h).
 */
#ifndef QUAY_MGMT_API_QUEUES_H
#define QUAY_MGMT_API_QUEUES_H

#include "lib/types.h"
#include "mgmt/http.h"

struct broker;
struct json;
struct queue;
struct vhost;

void api_queues_register(struct http_server *http, struct broker *broker);

/* The vhost exists here: a 404 of RabbitMQ's shape otherwise (answered). */
struct vhost *api_vhost_or_404(struct broker *broker, struct http_call *call, struct bytes name);

/* This broker's node name in RabbitMQ's fields ("node"): its cluster name,
 * or "local" alone. */
const char *api_node_name(const struct broker *broker);

#endif
