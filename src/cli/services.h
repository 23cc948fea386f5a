/*
 * services.h: what quayd runs beside the broker, started by main after
 * broker_start and plugged into it: the cluster (its consensus node and
 * the member, the broker's cluster_ops) and the management API with the
 * cluster's endpoints. The broker stops and frees both in its own
 * shutdown order (broker_stop, broker_free), so main's SIGTERM still stops
 * the cluster member before the broker's clients go.
 */
#ifndef QUAY_CLI_SERVICES_H
#define QUAY_CLI_SERVICES_H

struct broker;
struct cluster_node_config;

/* Joins or forms the cluster and plugs it into the broker. Returns 0, or
 * -1 (logged). */
int services_start_cluster(struct broker *broker, const struct cluster_node_config *config);
/* Serves the management API on broker->config.http_listen, with the
 * cluster's endpoints when clustered. Returns 0, or -1 (logged). */
int services_start_http(struct broker *broker);

#endif
