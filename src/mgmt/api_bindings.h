/*
 * api_bindings.h: RabbitMQ's binding endpoints of the management API.
 *
 *   GET    /api/bindings[/{vhost}]                     every binding
 *   GET    /api/bindings/{vhost}/e/{src}/q/{dst}       those from src to queue dst
 *   POST   /api/bindings/{vhost}/e/{src}/q/{dst}       bind: {"routing_key",
 *                                                      "arguments"}; 201
 *   GET    /api/bindings/{vhost}/e/{src}/q/{dst}/{key} one, by its properties_key
 *   DELETE /api/bindings/{vhost}/e/{src}/q/{dst}/{key} unbind; 204
 *   (and .../e/{src}/e/{dst}... for exchange-to-exchange bindings)
 *
 * A binding: {"source", "vhost", "destination", "destination_type":
 * "queue"|"exchange", "routing_key", "arguments", "properties_key"}. As in
 * RabbitMQ, the default exchange ("") shows one binding to each queue,
 * by the queue's name. properties_key names a binding in a path: its
 * routing key when it has no arguments ("~" for an empty one), else
 * "KEY~HASH" with a hash of its arguments (quay's own hash: stable across
 * brokers and restarts, not RabbitMQ's).
 *
 * Binds and unbinds go over AMQP as the user (api_amqp.h).
 */
#ifndef QUAY_MGMT_API_BINDINGS_H
#define QUAY_MGMT_API_BINDINGS_H

#include <stdbool.h>

#include "mgmt/http.h"

struct broker;
struct exchange;
struct json;
struct queue;
struct vhost;

void api_bindings_register(struct http_server *http, struct broker *broker);

/* GET /api/queues/{vhost}/{name}/bindings */
void api_bindings_of_queue(struct broker *broker, struct http_call *call,
                           const struct http_call_request *req, struct queue *queue);
/* GET /api/exchanges/{vhost}/{name}/bindings/source (as_source) or /destination */
void api_bindings_of_exchange(struct broker *broker, struct http_call *call,
                              const struct http_call_request *req, struct vhost *vhost,
                              struct exchange *exchange, bool as_source);
struct bind_dest;
/* The name of a binding's destination, a queue or an exchange. */
struct bytes api_binding_dest_name(const struct bind_dest *dest);

#endif
