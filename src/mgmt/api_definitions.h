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
 * Import, all or nothing: the whole body is parsed (a malformed one is
 * refused with where it went wrong) and checked first with the checks
 * the API's own paths make: every field's type, every vhost exists or
 * is in the file, every binding's ends exist or are in the file, a new
 * queue's or exchange's arguments as queue.declare and exchange.declare
 * check them, an existing one declared equivalently (as a redeclare is
 * judged: queue_args.h), the importing user may open every vhost it
 * fills (now or by the file's grant), the users, vhosts and permissions
 * well formed (api_definitions_users.h), the policies as PUT
 * /api/policies reads them and the vhost and user limits as the limits
 * endpoints do (api_definitions_settings.h); any refusal is a 400 naming
 * the item ("queues[3]: ..."), and nothing is applied. Then the users,
 * vhosts and permissions are applied (whole: one map command in a
 * cluster), then the policies and limits, then the exchanges, queues and
 * bindings are declared over AMQP with the request's credentials
 * (api_amqp.h), one vhost at a time. Each change applied records what
 * takes it back; a refusal once applying started (an AMQP refusal the
 * check could not foresee, a map command refused, no quorum) undoes
 * them, the latest first, before it is answered, naming the item.
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
