/*
 * api_rabbit.h: registers RabbitMQ's resource trees of the management API,
 * so that api.c's route table names them in one line:
 *
 *   /api/queues       api_queues.h       /api/exchanges    api_exchanges.h
 *   /api/bindings     api_bindings.h     /api/connections, /api/channels,
 *   /api/consumers    api_connections.h  /api/nodes, health checks,
 *   /api/aliveness-test                  api_nodes.h
 *   /api/definitions  api_definitions.h
 *
 * The shared parts: api_list.h (paths, sort, columns, pages), api_amqp.h
 * (changes made over AMQP as the user), api_table.h and api_message.h.
 */
#ifndef QUAY_MGMT_API_RABBIT_H
#define QUAY_MGMT_API_RABBIT_H

#include "mgmt/http.h"

struct broker;

void api_rabbit_register(struct http_server *http, struct broker *broker);

#endif
