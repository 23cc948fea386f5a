/*
 * api.h: the management HTTP API of one broker (RabbitMQ's management
 * plugin, the read-only part that operators and quayctl need).
 *
 *   GET /api/overview     the broker: product, version, uptime, object and
 *                         message totals, memory and disk alarms, journal
 *   GET /api/queues       every queue of every vhost, with the placement
 *                         fields the cluster will fill (primary, backups,
 *                         in_sync, epoch)
 *   GET /api/connections  every client connection: peer, user, vhost,
 *                         channels
 *   /api/policies         replication policies: GET, and GET/PUT/DELETE of
 *                         /api/policies/{vhost}/{name} (api_policies.h)
 *
 * Responses are JSON (see docs in api.c for each shape). The handlers read
 * broker state through its public headers, on the loop thread; only the
 * policy endpoints change anything (through the cluster map, or the
 * broker's own policies outside a cluster).
 *
 * Memory: struct mgmt_api is owned by the broker (broker->mgmt) and owns
 * its HTTP server.
 */
#ifndef QUAY_MGMT_API_H
#define QUAY_MGMT_API_H

#include "mgmt/http.h"

struct broker;
struct mgmt_api;

/* Serves the API on address ("HOST:PORT") and sets broker->mgmt, which
 * the broker then owns (even when this fails: free it with mgmt_api_free
 * after the loop ran). Returns 0, or -1 if it cannot listen (logged). */
int mgmt_api_start(struct broker *broker, const char *address);
/* Adds a GET endpoint served by another module, e.g. the cluster's
 * GET /api/cluster (cluster_node_write_json); ctx is borrowed and must
 * outlive the API. At most HTTP_ROUTES_MAX endpoints in all. */
/* Adds a POST action (e.g. /api/cluster/leave, registered by the broker). */
void mgmt_api_route_post(struct mgmt_api *api, const char *path, http_action_fn action,
                         void *ctx);
void mgmt_api_route(struct mgmt_api *api, const char *path, http_handler_fn handler,
                    void *ctx);
/* Stops listening and closes every HTTP client. Idempotent. */
void mgmt_api_stop(struct mgmt_api *api);
/* After the loop ran the close callbacks (stops first if needed). */
void mgmt_api_free(struct mgmt_api *api);

#endif
