/*
 * api_limits.h: RabbitMQ's vhost and user limits in the management API
 * (broker/limits.h says what they are and how they are enforced).
 *
 *   GET    /api/vhost-limits                [{"vhost": "/", "value": {"max-connections": 10}}]
 *   GET    /api/vhost-limits/{vhost}        the same, of one vhost ([] if it has none)
 *   PUT    /api/vhost-limits/{vhost}/{name} {"value": N}: 204
 *   DELETE /api/vhost-limits/{vhost}/{name} 204 (also when there was none)
 *   GET    /api/user-limits[/{user}]        [{"user": "u", "value": {"max-channels": 5}}]
 *   PUT    /api/user-limits/{user}/{name}   {"value": N}: 204
 *   DELETE /api/user-limits/{user}/{name}   204
 *
 * name is max-connections or max-queues for a vhost, max-connections or
 * max-channels for a user; N an integer, negative for no limit. Errors:
 * 400 bad body or name, 404 unknown vhost or user, 503 when the cluster
 * map cannot commit. Reading a vhost's limits (and the list, filtered)
 * needs management and the vhost; the rest administrator, as in RabbitMQ.
 *
 * In a cluster a change is a map command (limit.put, limit.delete in
 * cluster/map.h), answered once applied here; outside a cluster the
 * broker keeps them in its journal (broker/durable.h).
 */
#ifndef QUAY_MGMT_API_LIMITS_H
#define QUAY_MGMT_API_LIMITS_H

#include <stdbool.h>
#include <stddef.h>

#include "lib/types.h"
#include "mgmt/http.h"

struct broker;
struct limit_set;

/* Adds the routes; broker is borrowed and outlives the server. */
void api_limits_register(struct http_server *http, struct broker *broker);

/* The limits in force: the map's in a cluster, else the broker's. */
const struct limit_set *api_limits_of(const struct broker *broker);

/* Definitions (RabbitMQ's format): a user's "limits" object, and the
 * "parameters" items of component "vhost-limits" (name "limits"), of every
 * vhost or of only (len 0: all; then without "vhost" fields). */
struct json;
struct json_tree;
struct json_node;
void api_limits_write_user(struct json *out, const struct broker *broker, struct bytes user);
void api_limits_write_parameters(struct json *out, const struct broker *broker,
                                 struct bytes only);
/* The same items as GET /api/parameters lists them: each with its
 * "vhost", of the vhosts user sees (NULL: all), of only (len 0: all). */
void api_limits_write_parameters_seen(struct json *out, const struct broker *broker,
                                      struct bytes only, const struct auth_user *user);
/* Whether vhost has limits (then GET /api/parameters/vhost-limits/VHOST/limits
 * is that one item). */
bool api_limits_vhost_has(const struct broker *broker, struct bytes vhost);

#endif
