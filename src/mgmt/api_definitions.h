/*
 * api_definitions.h: RabbitMQ's definitions (its JSON export of a broker's
 * topology) through the management API.
 *
 *   GET  /api/definitions          {"rabbit_version", "rabbitmq_version",
 *                                  "product_name", "product_version", "users",
 *                                  "vhosts", "permissions", "topic_permissions",
 *                                  "parameters", "global_parameters", "policies",
 *                                  "queues", "exchanges", "bindings"}
 *   GET  /api/definitions/{vhost}  one vhost's parameters, policies, queues,
 *                                  exchanges and bindings (no "vhost" fields)
 *   POST /api/definitions[/{vhost}]  import: 204
 *
 * Export: what the broker has, in RabbitMQ's shape: the users, vhosts and
 * permissions (api_definitions_users.h), the
 * replication policies as RabbitMQ's classic mirroring ("ha-mode":
 * "exactly", "ha-params": backups + 1, which RabbitMQ 3.10 takes), every
 * queue but exclusive ones, every exchange but the default and amq.* ones,
 * every binding but the default exchange's implicit ones. In a cluster,
 * any broker exports the whole cluster's. Copied out in the request's
 * turn and written in slices (api_definitions_export.c).
 *
 * Import, all or nothing as far as quay can tell before it starts: the
 * whole body is parsed (a malformed one is refused with where it went
 * wrong) and checked first: every field's type, every vhost exists, every
 * binding's ends exist or are in the file, every vhost exists or is in
 * the file, an existing queue or exchange is declared the same way
 * (durable, auto_delete, type), the importing user may open every vhost
 * it fills (now or by the file's grant), the users, vhosts and
 * permissions are well formed (api_definitions_users.h), and the
 * policies and parameters sections hold nothing quay would have to
 * create; any refusal is a 400 naming the item ("queues[3]: ..."), and
 * nothing is applied. Then the users, vhosts and permissions are applied
 * (whole: one map command in a cluster), then the exchanges, queues and
 * bindings are declared over AMQP as the user (api_amqp.h), one vhost at
 * a time: the same checks a client's declare gets. The only failures left
 * once applying has started are those (an x-argument the broker
 * refuses), or the map unavailable for the users part (503, nothing
 * applied): a declaration's is answered 400 with the broker's reason, and
 * what came before it stays.
 */
#ifndef QUAY_MGMT_API_DEFINITIONS_H
#define QUAY_MGMT_API_DEFINITIONS_H

#include "mgmt/http.h"

struct broker;

void api_definitions_register(struct http_server *http, struct broker *broker);

/* quayd --definitions FILE, as RabbitMQ's load_definitions: text (the
 * file's bytes; source names it in logs) is checked now, as an import
 * is; then it is applied over AMQP as the broker's internal user
 * (auth_add_internal), from the loop, once the broker serves, and the
 * outcome is logged. Call once, after broker_start and before the loop
 * runs. Returns 0, or -1 with why in err (at least 400 bytes): the
 * broker should not start. */
int api_definitions_load(struct broker *broker, const char *source, const char *text,
                         size_t size, char *err, size_t err_size);

#endif
