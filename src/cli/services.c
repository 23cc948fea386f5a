/*
 * services.c: see services.h. The wiring broker.c did before the broker
 * stopped including the layers above it (docs/ARCHITECTURE.md section 1).
 */
#include "cli/services.h"

#include <sys/socket.h>

#include "broker/broker.h"
#include "cluster/member.h"
#include "cluster/moves.h"
#include "cluster/node.h"
#include "cluster/raft_tls.h"
#include "lib/assert.h"
#include "lib/log.h"
#include "mgmt/api.h"
#include "mgmt/api_moves.h"

/* Joins or forms the cluster, advertising the first AMQP listener's bound
 * address (with --cluster-tls the first AMQPS one's: the other brokers'
 * links connect there), and puts the data path in the cluster
 * (cluster/member.h) as the broker's cluster_ops. */
int services_start_cluster(struct broker *broker, const struct cluster_node_config *config)
{
    struct cluster_node_config cluster = *config;
    struct sockaddr_storage bound;
    int size = sizeof bound;
    char amqp[128];
    ASSERT(broker->listeners_count > 0);
    struct listener *advertised = &broker->listeners[0];
    if (broker->config.cluster_tls) {
        ASSERT(broker->tls_listeners_count > 0); /* main checks --tls-listen */
        advertised = &broker->tls_listeners[0];
    }
    if (uv_tcp_getsockname(&advertised->tcp, (struct sockaddr *)&bound, &size) != 0)
        return -1;
    cluster_node_amqp_address((struct sockaddr *)&bound, cluster.listen, amqp, sizeof amqp);
    cluster.data_dir = broker->config.data_dir;
    cluster.amqp_address = amqp;
    struct raft_tls raft_tls = {&broker->net, &broker->raft_tls, &broker->cluster_tls};
    if (broker->config.cluster_tls)
        cluster.tls = &raft_tls; /* (copied by the transport) */
    char err[1024];
    struct cluster_node *node;
    if (cluster_node_start(&node, broker->loop, &cluster, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        return -1;
    }
    broker->cluster_secret = cluster_node_secret(node);
    cluster_node_set_default_backups(node, broker->config.default_backups);
    cluster_node_set_auto_rebalance(node, broker->config.auto_rebalance);
    struct member *member = member_new(broker, node, broker->config.default_backups);
    pace_init(&member->catch_up_pace, broker->config.catch_up_rate);
    broker->cluster_ops = &member_cluster_ops;
    broker->cluster_ctx = member;
    return 0;
}

/* The cluster's own endpoints, served by the API on the member's behalf. */
static void route_cluster(struct mgmt_api *api, struct member *member)
{
    mgmt_api_route(api, "/api/cluster", member_cluster_json, member);
    mgmt_api_route(api, "/api/cluster/links", member_write_links_json, member);
    mgmt_api_route(api, "/api/cluster/events", member_events_json, member);
    mgmt_api_route_post(api, "/api/cluster/leave", member_leave, member);
    mgmt_api_route_post(api, "/api/cluster/forget", member_forget, member);
    mgmt_api_route_tree(api, "/api/cluster/move/", api_moves_move, member);
    mgmt_api_route_post(api, "/api/cluster/drain", moves_drain_post, member);
    mgmt_api_route_post(api, "/api/cluster/revive", moves_revive_post, member);
    mgmt_api_route_post(api, "/api/cluster/offload", moves_offload_post, member);
    mgmt_api_route_post(api, "/api/cluster/rebalance", moves_rebalance_post, member);
}

int services_start_http(struct broker *broker)
{
    if (mgmt_api_start(broker, broker->config.http_listen) != 0)
        return -1;
    struct member *member = member_of(broker);
    if (member != NULL)
        route_cluster(mgmt_api_of(broker), member);
    return 0;
}
