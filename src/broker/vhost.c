/*
 * vhost.c: see vhost.h.
 */
#include "broker/vhost.h"

#include "broker/broker.h"
#include "broker/cluster_ops.h"

#include <stdlib.h>
#include <string.h>

#include "broker/durable.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"

static const struct {
    const char *name;
    enum exchange_type type;
    bool internal;
} predeclared[] = {
    {"", EXCHANGE_DIRECT, false},
    {"amq.direct", EXCHANGE_DIRECT, false},
    {"amq.fanout", EXCHANGE_FANOUT, false},
    {"amq.topic", EXCHANGE_TOPIC, false},
    {"amq.headers", EXCHANGE_HEADERS, false},
    {"amq.match", EXCHANGE_HEADERS, false},
    {"amq.rabbitmq.trace", EXCHANGE_TOPIC, true},
};

bool vhost_predeclared(struct bytes name)
{
    for (size_t i = 0; i < ARRAY_SIZE(predeclared); i++) {
        if (bytes_equal_cstr(name, predeclared[i].name))
            return true;
    }
    return false;
}

struct vhost *vhost_new(struct broker *broker, struct bytes name)
{
    struct vhost *vhost = xcalloc(1, sizeof *vhost);
    vhost->name = bytes_dup(name);
    vhost->broker = broker;
    hmap_init(&vhost->exchanges);
    hmap_init(&vhost->queues);
    for (size_t i = 0; i < ARRAY_SIZE(predeclared); i++) {
        vhost_exchange_declare(vhost, bytes_of_cstr(predeclared[i].name), predeclared[i].type,
                               true, false, predeclared[i].internal, (struct bytes){NULL, 0});
    }
    vhost->default_exchange = vhost_exchange(vhost, BYTES_LIT(""));
    ASSERT(vhost->default_exchange != NULL);
    return vhost;
}

void vhost_free(struct vhost *vhost)
{
    /* Queues first: deleting them unbinds them from the exchanges. */
    struct queue **queues = xmalloc(sizeof *queues * (vhost->queues.count + 1));
    uint32_t count = 0;
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next(&vhost->queues, &i, &e);)
        queues[count++] = e->value;
    for (uint32_t i = 0; i < count; i++)
        vhost_queue_delete(vhost, queues[i]);
    free(queues);
    struct exchange **exchanges = xmalloc(sizeof *exchanges * (vhost->exchanges.count + 1));
    count = 0;
    for (uint32_t i = 0; hmap_next(&vhost->exchanges, &i, &e);)
        exchanges[count++] = e->value;
    for (uint32_t i = 0; i < count; i++)
        exchange_free(exchanges[i]);
    free(exchanges);
    hmap_free(&vhost->exchanges);
    hmap_free(&vhost->queues);
    bytes_free(&vhost->name);
    free(vhost);
}

struct exchange *vhost_exchange_declare(struct vhost *vhost, struct bytes name,
                                        enum exchange_type type, bool durable, bool auto_delete,
                                        bool internal, struct bytes arguments)
{
    ASSERT(vhost_exchange(vhost, name) == NULL);
    struct exchange *exchange = exchange_new(name, type, durable, auto_delete, internal, arguments);
    exchange->user = vhost;
    hmap_put(&vhost->exchanges, exchange->name, exchange);
    durable_exchange_declared(vhost->broker, vhost, exchange);
    return exchange;
}

void vhost_exchange_remove(struct vhost *vhost, struct exchange *exchange)
{
    durable_exchange_deleted(vhost->broker, vhost, exchange);
    void *removed = hmap_remove(&vhost->exchanges, exchange->name);
    ASSERT(removed == exchange);
    exchange_free(exchange);
}

static void on_exchange_unused(struct exchange *exchange, void *ctx)
{
    vhost_exchange_maybe_auto_delete(ctx, exchange);
}

void vhost_exchange_delete(struct vhost *vhost, struct exchange *exchange)
{
    durable_exchange_deleted(vhost->broker, vhost, exchange);
    void *removed = hmap_remove(&vhost->exchanges, exchange->name);
    ASSERT(removed == exchange);
    /* Its bindings out first, so that no cascade comes back to it; then
     * those into it, whose sources go if they are auto-delete and that was
     * their last binding (RabbitMQ's remove_for_destination). An exchange
     * reported unused has no binding left, so no cascade reaches it before
     * its turn. */
    exchange_unbind_all(exchange);
    bind_dest_unbind_all(&exchange->as_dest, on_exchange_unused, vhost);
    exchange_free(exchange);
}

void vhost_exchange_maybe_auto_delete(struct vhost *vhost, struct exchange *exchange)
{
    if (exchange->auto_delete && !exchange_has_bindings(exchange))
        vhost_exchange_delete(vhost, exchange);
}

struct queue *vhost_queue_declare(struct vhost *vhost, struct bytes name, bool durable,
                                  bool exclusive, bool auto_delete, struct bytes arguments)
{
    ASSERT(vhost_queue(vhost, name) == NULL);
    struct queue *queue = queue_new(vhost, name, durable, exclusive, auto_delete, arguments);
    hmap_put(&vhost->queues, queue->name, queue);
    broker_queue_joined(vhost->broker, queue);
    durable_queue_declared(vhost->broker, vhost, queue);
    /* Unused from now on: x-expires counts from here, however the queue
     * came to be (a client's declare, the cluster map, recovery). */
    queue_touch(queue);
    return queue;
}

void vhost_queue_insert(struct vhost *vhost, struct queue *queue)
{
    ASSERT(vhost_queue(vhost, queue->name) == NULL);
    hmap_put(&vhost->queues, queue->name, queue);
    broker_queue_joined(vhost->broker, queue);
}

uint32_t vhost_queue_delete(struct vhost *vhost, struct queue *queue)
{
    ASSERT(!queue->deleted);
    void *removed = hmap_remove(&vhost->queues, queue->name);
    ASSERT(removed == queue);
    durable_queue_deleted(vhost->broker, vhost, queue);
    bind_dest_unbind_all(&queue->as_dest, on_exchange_unused, vhost);
    if (list_linked(&queue->owner_link))
        list_remove(&queue->owner_link);
    uint32_t dropped = queue_delete(queue);
    queue_unref(queue);
    return dropped;
}

void vhost_queue_discard(struct vhost *vhost, struct queue *queue)
{
    struct broker *broker = vhost->broker;
    if (broker->cluster_ops)
        broker->cluster_ops->queue_gone(broker->cluster_ctx, vhost->name, queue->name);
    vhost_queue_delete(vhost, queue);
}

void vhost_route(struct vhost *vhost, struct exchange *exchange, struct bytes routing_key,
                 struct table headers, struct route_result *result)
{
    if (exchange == vhost->default_exchange) {
        struct queue *queue = vhost_queue(vhost, routing_key);
        if (queue && result->count < result->cap)
            result->dests[result->count++] = &queue->as_dest;
        return;
    }
    exchange_route(exchange, routing_key, headers, result);
}
