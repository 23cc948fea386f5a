/*
 * api_parameters.h: RabbitMQ's read-only lists of what quay has little or
 * none of, so that rabbitmqadmin's "list parameters", "list
 * operator_policies" and tools that read them work (GET; sort, columns and
 * pages as every list):
 *   /api/parameters[/{component}[/{vhost}[/{name}]]]  the vhost limits, as
 *       RabbitMQ lists them (component "vhost-limits", name "limits"); quay
 *       has no other runtime parameters (no federation, no shovels)
 *   /api/operator-policies[/{vhost}]  [] (none in quay)
 *   /api/topic-permissions[/{vhost}]  [] (none in quay)
 *   /api/global-parameters   []
 *   /api/cluster-name        {"name": the broker's node name}
 * Changing them is not done (405).
 */
#ifndef QUAY_MGMT_API_PARAMETERS_H
#define QUAY_MGMT_API_PARAMETERS_H

#include "mgmt/http.h"

struct broker;

void api_parameters_register(struct http_server *http, struct broker *broker);

#endif
