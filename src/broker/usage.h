/*
 * usage.h: what a connection or channel limit counts, across the cluster.
 *
 * A vhost's or user's max-connections and a user's max-channels
 * (broker/limits.h) count clients' connections and channels on every
 * broker of a cluster, as RabbitMQ counts them cluster-wide. This broker
 * counts its own from its connections. Every peer broker tells us its own
 * counts for the names that have such a limit (basic.quay-usage on its
 * link: the cluster ships the table usage_write gives, cluster_ops.h
 * share_usage), each time they change; we keep the last report of each
 * peer until the link it came on closes. A check adds them up.
 *
 * Eventually consistent, as RabbitMQ's tracking is: a peer's count reaches
 * us one hop after its client was let in, so two clients taking the last
 * place on two brokers at the same instant may both get in. A client that
 * opens one after the other, on any brokers, is counted: a handshake takes
 * several round trips, a report one hop. A peer whose link to us is cut
 * counts nothing here until it links again (availability first, as
 * RabbitMQ in a partition).
 *
 * Owns struct usage (broker->usage): the peers' reports, each a limit set
 * whose values are counts (an absent name counts 0), and the flush hook
 * that sends ours once per loop iteration however many changes it saw.
 * Brokers' own links are never counted.
 */
#ifndef QUAY_BROKER_USAGE_H
#define QUAY_BROKER_USAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "broker/limits.h"
#include "lib/list.h"
#include "lib/types.h"
#include "net/conn.h"

struct broker;
struct connection;
struct table_writer;

/* The keys of a report: one nested table each, name -> count ('l'). */
#define USAGE_VHOST_CONNECTIONS "vhost-connections"
#define USAGE_USER_CONNECTIONS "user-connections"
#define USAGE_USER_CHANNELS "user-channels"

struct usage {
    struct list_node reports;    /* struct usage_report.link: one per peer */
    struct net_flush_hook hook;  /* shares ours at the end of the loop iteration */
    bool hook_added;
};

void usage_init(struct usage *usage);
void usage_free(struct usage *usage);

/* Clients' connections open on this broker of the vhost or the user
 * (LIMIT_MAX_CONNECTIONS), or the user's open channels
 * (LIMIT_MAX_CHANNELS). */
uint64_t usage_local(const struct broker *broker, enum limit_scope scope, struct bytes name,
                     enum limit_kind kind);
/* usage_local plus what every peer last reported. */
uint64_t usage_count(const struct broker *broker, enum limit_scope scope, struct bytes name,
                     enum limit_kind kind);

/* This broker's counts for every name with a connection or channel limit
 * of 0 or more, as a report's table contents (zero counts left out). */
void usage_write(const struct broker *broker, struct table_writer *w);
/* A peer's basic.quay-usage, on the link connection connection_id:
 * replaces that broker's report. A malformed table is ignored (false). */
bool usage_heard(struct broker *broker, uint64_t connection_id, struct bytes peer,
                 struct table counts);
/* A peer's link closed: the report it carried goes. */
void usage_link_closed(struct broker *broker, uint64_t connection_id);

/* A count may have changed (connection NULL: the limits changed, or a
 * peer linked and wants ours): the cluster is told at the end of this loop
 * iteration. Nothing happens when single, or when nothing connection
 * touches has a limit. */
void usage_changed(struct broker *broker, const struct connection *connection);

#endif
