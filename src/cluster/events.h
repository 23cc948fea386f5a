/*
 * events.h: the system exchange amq.quay.cluster and the broker list a
 * client learns from (connection.open-ok's known-hosts). See events.c.
 */
#ifndef QUAY_CLUSTER_EVENTS_H
#define QUAY_CLUSTER_EVENTS_H

#include <stddef.h>

#define EVENTS_EXCHANGE "amq.quay.cluster"

struct cluster_map;
struct map_change;
struct member;
struct vhost;

/* The vhost's amq.quay.cluster (internal topic exchange), made if missing. */
void events_ensure_exchange(struct vhost *vhost);

/* After a committed change: routes its event to the bound queues this
 * broker is primary of. broker_event ("joined", "up", "down", "left", ...)
 * for broker changes, NULL for queue changes. */
void events_map_changed(struct member *member, const struct map_change *change,
                        const char *broker_event);

/* "host:port,host:port" of the brokers that are up, cut to fit cap (a
 * shortstr: 256). Returns the length. */
size_t events_known_hosts(const struct cluster_map *map, char *out, size_t cap);

#endif
