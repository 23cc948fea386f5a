/*
 * api_placement.h: GET /api/cluster/placement, where the cluster's queues
 * are, summed per pair of brokers: what the web console's cluster map
 * draws (console.h), and what an operator asks during a failover or a
 * rebalance. A per-queue list (GET /api/queues) does not scale to
 * thousands of queues refreshed every second; this is one pass over the
 * map, O(queues x backups), whose answer grows with the brokers only.
 *
 *   {"epoch": N, "queues": N, "unavailable": N,
 *    "pairs": [{"primary": "b1", "backup": "b2", "queues": N, "in_sync": N}],
 *    "alone": [{"primary": "b1", "queues": N}]}
 *
 * A pair counts the queues whose primary is "primary" with "backup" among
 * their backups; in_sync of them hold every confirmed message there (the
 * rest are catching up). "alone" counts queues without a backup. Pairs and
 * brokers with no queue are left out. Not clustered: zeros and empty
 * lists. Monitoring tag (it is node-level, like GET /api/cluster).
 */
#ifndef QUAY_MGMT_API_PLACEMENT_H
#define QUAY_MGMT_API_PLACEMENT_H

#include "mgmt/http.h"

struct broker;

void api_placement_register(struct http_server *server, struct broker *broker);

#endif
