/*
 * api_message.h: messages through the management API, as RabbitMQ's:
 *
 *   POST /api/exchanges/{vhost}/{name}/publish
 *        {"routing_key", "payload", "payload_encoding": "string"|"base64",
 *         "properties": {"delivery_mode": 2, "headers": {...}, ...}}
 *        -> {"routed": bool}   ("amq.default" names the default exchange)
 *   POST /api/queues/{vhost}/{name}/get
 *        {"count": N, "ackmode": "ack_requeue_true"|"ack_requeue_false"|
 *         "reject_requeue_true"|"reject_requeue_false", "encoding":
 *         "auto"|"base64", "truncate": N}
 *        -> [{"payload_bytes", "redelivered", "exchange", "routing_key",
 *             "message_count", "properties", "payload", "payload_encoding"}]
 *
 * Both are an AMQP client's: the publish is mandatory, on a channel in
 * confirm mode, and "routed" is false when it came back (basic.return
 * arrives before its ack); the gets are basic.get without no-ack, and
 * are then acked (requeue false) or nacked with requeue, as ackmode says,
 * before the answer.
 */
#ifndef QUAY_MGMT_API_MESSAGE_H
#define QUAY_MGMT_API_MESSAGE_H

#include "lib/types.h"
#include "mgmt/http.h"

struct broker;
struct vhost;

void api_message_publish(struct broker *broker, struct http_call *call,
                         const struct http_call_request *req, struct vhost *vhost,
                         struct bytes exchange);
void api_message_get(struct broker *broker, struct http_call *call,
                     const struct http_call_request *req, struct vhost *vhost,
                     struct bytes queue);

#endif
