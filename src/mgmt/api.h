/*
 * api.h: the management HTTP API of one broker (RabbitMQ's management
 * plugin: what operators, rabbitmqadmin and quayctl need).
 *
 *   GET /api/overview     the broker: product, version, uptime, object and
 *                         message totals, memory and disk alarms, journal,
 *                         and RabbitMQ's overview fields (api_nodes.h)
 *   /api/queues, /api/exchanges, /api/bindings, /api/connections,
 *   /api/channels, /api/consumers, /api/nodes, /api/definitions, health
 *                         RabbitMQ's resources (api_rabbit.h registers them;
 *                         docs/MANAGEMENT-API.md)
 *   /api/policies         replication policies: GET, and GET/PUT/DELETE of
 *                         /api/policies/{vhost}/{name} (api_policies.h)
 *
 * Responses are JSON (see docs in api.c and each api_*.h for each shape).
 * The handlers read broker state through its public headers, on the loop
 * thread; the policy endpoints change the map (or the broker's own
 * policies outside a cluster), and RabbitMQ's resources change only over
 * AMQP as the user who asked (api_amqp.h).
 *
 * Access, as RabbitMQ's management plugin grants it. Every request but an
 * unknown path's and the web console's files (console.h: no data in them)
 * needs HTTP Basic credentials of a user of the broker's
 * users file (broker/auth.h; the loopback restriction holds here too)
 * with a management tag; what it may then do:
 *
 *   endpoint                          needs (a tag includes the ones below it:
 *                                     administrator > monitoring, policymaker
 *                                     > management)
 *   GET /api/overview                 management: totals of what it may see;
 *                                     journal, network and cluster need monitoring
 *   GET /api/queues, exchanges,       management: those of the vhosts it may
 *       bindings, consumers           open (administrator: all)
 *   changes of those (PUT, DELETE,    management, then the user's AMQP
 *       POST), aliveness-test         permissions (done over AMQP as the user)
 *   GET /api/connections, channels    management: its own; monitoring: all
 *   GET /api/nodes, health checks     monitoring
 *   /api/definitions                  administrator
 *   GET /api/policies[/{vhost}/{n}]   management, of the vhosts it may open
 *   PUT/DELETE /api/policies/{v}/{n}  policymaker, of a vhost it may open
 *                                     (administrator: any)
 *   GET /api/cluster, /cluster/links  monitoring (node-level, like RabbitMQ's /api/nodes)
 *   GET /api/cluster/placement        monitoring (api_placement.h)
 *   GET /metrics                      monitoring (Prometheus text: metrics.h)
 *   POST /api/cluster/leave, /forget  administrator
 *
 * Refusals are RabbitMQ's: 401 with WWW-Authenticate and {"error":
 * "not_authorized", "reason": "Login failed"} for missing, unknown or
 * wrong credentials, 401 {"error": "not_authorised", "reason": "Not
 * management user"} (or "Not monitor user", "Not administrator user",
 * "User not authorised to access object", "... virtual host", "User can
 * only log in via localhost") for a login without the right. Requests
 * from another origin or naming a foreign Host are 403 before any of this
 * (http_guard.h).
 *
 * Memory: struct mgmt_api is owned by the broker (broker->http, a service
 * the broker stops and frees in its shutdown order) and owns its HTTP
 * server.
 */
#ifndef QUAY_MGMT_API_H
#define QUAY_MGMT_API_H

#include <stdbool.h>

#include "lib/types.h"
#include "mgmt/http.h"

struct broker;
struct listener;
struct mgmt_api;

/* What a route needs: its http_route.access, which the admission hook
 * (api.c) reads. */
enum mgmt_access {
    MGMT_ACCESS_MANAGEMENT,    /* any management user (the view filters by user) */
    MGMT_ACCESS_MONITORING,    /* node-level data */
    MGMT_ACCESS_POLICIES,      /* read: management; PUT, DELETE: policymaker */
    MGMT_ACCESS_ADMINISTRATOR, /* cluster actions */
};

/* Whether the API shows user a vhost's objects: administrators see every
 * vhost, other users the ones they may open (NULL: no admission, all). */
bool mgmt_user_sees_vhost(const struct auth_user *user, struct bytes vhost);
/* The same, else call answered with RabbitMQ's refusal: 401 {"error":
 * "not_authorised", "reason": "User not authorised to access virtual
 * host"}. */
bool mgmt_user_sees_vhost_or_401(struct http_call *call, const struct auth_user *user,
                                 struct bytes vhost);

/* Serves the API on address ("HOST:PORT") and plugs it into the broker
 * (broker->http), which then owns it, even when this fails (broker_free
 * frees it after the loop ran). Returns 0, or -1 if it cannot listen
 * (logged). quayd's main calls it after broker_start. */
int mgmt_api_start(struct broker *broker, const char *address);
/* The API the broker serves, or NULL. */
struct mgmt_api *mgmt_api_of(const struct broker *broker);
/* Adds a GET endpoint served by another module, e.g. the cluster's
 * GET /api/cluster (member_cluster_json); ctx is borrowed and must
 * outlive the API. At most HTTP_ROUTES_MAX endpoints in all. Such
 * endpoints are node-level: reading one needs the monitoring tag. */
void mgmt_api_route(struct mgmt_api *api, const char *path, http_handler_fn handler,
                    void *ctx);
/* Adds a POST action (e.g. /api/cluster/leave, registered by the broker):
 * it needs the administrator tag. */
void mgmt_api_route_post(struct mgmt_api *api, const char *path, http_action_fn action,
                         void *ctx);
/* Adds a resource tree served by another module that answers now or
 * later (http_server_route_tree), e.g. POST /api/cluster/move
 * (mgmt/api_moves.h): it needs the administrator tag. */
void mgmt_api_route_tree(struct mgmt_api *api, const char *prefix, http_prefix_fn handler,
                         void *ctx);
/* The API's listener (for its port), or NULL without an API. */
const struct listener *mgmt_api_listener(const struct mgmt_api *api);
/* How long the API has been serving (the broker's uptime). */
uint64_t mgmt_api_uptime_ms(const struct mgmt_api *api);
/* Stops listening and closes every HTTP client. Idempotent. */
void mgmt_api_stop(struct mgmt_api *api);
/* After the loop ran the close callbacks (stops first if needed). */
void mgmt_api_free(struct mgmt_api *api);

#endif
