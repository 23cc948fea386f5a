/*
 * api_connections.h: RabbitMQ's client endpoints of the management API.
 *
 *   GET /api/connections[/{name}]   client connections: RabbitMQ's fields (name
 *                                   "PEER -> LOCAL", user, vhost, channels,
 *                                   state, peer_host, peer_port, host, port,
 *                                   protocol, node, ssl, connected_at, frame_max,
 *                                   channel_max, timeout) and quay's (id, peer,
 *                                   blocked)
 *   GET /api/channels               their channels ("PEER -> LOCAL (N)")
 *   GET /api/consumers[/{vhost}]    every consumer of a client channel
 *
 * A management user sees its own connections (and their channels and
 * consumers), a monitoring user all. Lists take api_list.h's parameters.
 * Cluster links between brokers are not clients and are not listed.
 */
#ifndef QUAY_MGMT_API_CONNECTIONS_H
#define QUAY_MGMT_API_CONNECTIONS_H

#include "mgmt/http.h"

struct broker;

void api_connections_register(struct http_server *http, struct broker *broker);

#endif
