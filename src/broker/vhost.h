/*
 * vhost.h: a virtual host: the namespace of exchanges and queues.
 *
 * Owns its exchanges and queues (name -> object tables keyed by the
 * objects' own name copies). A new vhost has the predeclared exchanges
 * RabbitMQ has: the default exchange "" and amq.direct, amq.fanout,
 * amq.topic, amq.headers, amq.match, amq.rabbitmq.trace.
 */
#ifndef QUAY_BROKER_VHOST_H
#define QUAY_BROKER_VHOST_H

#include "lib/types.h"
#include "broker/exchange.h"
#include "broker/queue.h"
#include "lib/hash.h"

struct broker;

/* The sums of the vhost's queues' counts, kept so that /api/overview
 * need not walk the queues (broker_queue_totals). consumers and paged are
 * exact, changed where a queue's own counts change (queue.c); ready and
 * unacked are the sums of each queue's newest rates sample (rates.h), kept
 * by the samples' deltas as the broker's rates_totals are: a queue whose
 * counts moved since is on the broker's active lists, which
 * broker_queue_totals walks for the rest. A deleted queue takes its part
 * out. */
struct vhost_totals {
    uint64_t consumers;
    uint64_t paged;
    uint64_t ready_sampled;
    uint64_t unacked_sampled;
};

struct vhost {
    struct bytes name;           /* owned copy */
    struct broker *broker;       /* borrowed */
    struct hmap exchanges;       /* name -> struct exchange (owned) */
    struct hmap queues;          /* name -> struct queue (one reference each) */
    struct exchange *default_exchange; /* borrowed from exchanges */
    struct vhost_totals totals;
};

struct vhost *vhost_new(struct broker *broker, struct bytes name);
/* Whether every new vhost has an exchange of that name (the default one
 * "" and amq.*). */
bool vhost_predeclared(struct bytes name);
void vhost_free(struct vhost *vhost);

static inline struct exchange *vhost_exchange(struct vhost *vhost, struct bytes name)
{
    return hmap_get(&vhost->exchanges, name);
}

static inline struct queue *vhost_queue(struct vhost *vhost, struct bytes name)
{
    return hmap_get(&vhost->queues, name);
}

struct exchange *vhost_exchange_declare(struct vhost *vhost, struct bytes name,
                                        enum exchange_type type, bool durable, bool auto_delete,
                                        bool internal, struct bytes arguments);
/* Deletes an exchange as RabbitMQ does: with every binding from and to it,
 * and the auto-delete exchanges that lose their last binding by that
 * (recursively; a queue's deletion cascades the same way). */
void vhost_exchange_delete(struct vhost *vhost, struct exchange *exchange);
/* Removes just this exchange and its bindings (a cluster broker following
 * the map, which decided any cascade itself). */
void vhost_exchange_remove(struct vhost *vhost, struct exchange *exchange);
/* Deletes the exchange if it is auto-delete and has no bindings left. */
void vhost_exchange_maybe_auto_delete(struct vhost *vhost, struct exchange *exchange);

struct queue *vhost_queue_declare(struct vhost *vhost, struct bytes name, bool durable,
                                  bool exclusive, bool auto_delete, struct bytes arguments);
/* Adds a queue made elsewhere (a cluster stand-in: queue_is_remote) to the
 * table, which takes the caller's reference. Nothing is journaled. */
void vhost_queue_insert(struct vhost *vhost, struct queue *queue);

/* Unbinds, cancels consumers, drops the table's reference. Returns the
 * number of ready messages the queue held. */
uint32_t vhost_queue_delete(struct vhost *vhost, struct queue *queue);

/* A deletion this broker decided (exclusive owner gone, auto-delete,
 * x-expires): in a cluster the map is told too (cluster/member.h). */
void vhost_queue_discard(struct vhost *vhost, struct queue *queue);

/* Routes one publish: the default exchange maps the routing key to the
 * queue of that name; others go through exchange_route. */
void vhost_route(struct vhost *vhost, struct exchange *exchange, struct bytes routing_key,
                 struct table headers, struct route_result *result);

#endif
