/*
 * api_rabbit.c: see api_rabbit.h.
 */
#include "mgmt/api_rabbit.h"

#include "mgmt/api_bindings.h"
#include "mgmt/api_connections.h"
#include "mgmt/api_definitions.h"
#include "mgmt/api_exchanges.h"
#include "mgmt/api_health.h"
#include "mgmt/api_nodes.h"
#include "mgmt/api_parameters.h"
#include "mgmt/api_queues.h"

void api_rabbit_register(struct http_server *http, struct broker *broker)
{
    api_queues_register(http, broker);
    api_exchanges_register(http, broker);
    api_bindings_register(http, broker);
    api_connections_register(http, broker);
    api_nodes_register(http, broker);
    api_health_register(http, broker);
    api_parameters_register(http, broker);
    api_definitions_register(http, broker);
}
