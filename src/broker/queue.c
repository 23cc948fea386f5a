/*
 * queue.c: see queue.h. Dispatch is the hot path: one ring pop and one
 * consumer call per message, with the consumer rotated to the back of the
 * list after each delivery so consumers share a queue round-robin.
 */
#include "broker/queue.h"

#include <stdlib.h>
#include <string.h>

#include "broker/message.h"
#include "lib/assert.h"

static struct bytes bytes_dup(struct bytes b)
{
    uint8_t *copy = malloc(b.len ? b.len : 1);
    ASSERT(copy != NULL);
    if (b.len)
        memcpy(copy, b.ptr, b.len);
    return (struct bytes){copy, b.len};
}

/* ---- ring ----------------------------------------------------------- */

static void ring_grow(struct queue_ring *ring)
{
    uint32_t cap = ring->cap ? ring->cap * 2 : 16;
    struct queue_entry *entries = malloc(sizeof *entries * cap);
    ASSERT(entries != NULL);
    for (uint32_t i = 0; i < ring->count; i++)
        entries[i] = ring->entries[(ring->head + i) & (ring->cap - 1)];
    free(ring->entries);
    ring->entries = entries;
    ring->head = 0;
    ring->cap = cap;
}

static void ring_push_back(struct queue_ring *ring, struct queue_entry entry)
{
    if (ring->count == ring->cap)
        ring_grow(ring);
    ring->entries[(ring->head + ring->count) & (ring->cap - 1)] = entry;
    ring->count++;
}

static struct queue_entry *ring_slot(struct queue_ring *ring, uint32_t index)
{
    return &ring->entries[(ring->head + index) & (ring->cap - 1)];
}

/* Inserts by seq. Requeued messages are nearly always older than all
 * ready ones, so the scan from the head stops after a few entries. */
static void ring_insert_by_seq(struct queue_ring *ring, struct queue_entry entry)
{
    uint32_t index = 0;
    while (index < ring->count && ring_slot(ring, index)->seq < entry.seq)
        index++;
    if (ring->count == ring->cap)
        ring_grow(ring);
    ring->head = (ring->head - 1) & (ring->cap - 1);
    ring->count++;
    for (uint32_t k = 0; k < index; k++)
        *ring_slot(ring, k) = *ring_slot(ring, k + 1);
    *ring_slot(ring, index) = entry;
}

static struct queue_entry ring_pop_front(struct queue_ring *ring)
{
    ASSERT(ring->count > 0);
    struct queue_entry entry = ring->entries[ring->head];
    ring->head = (ring->head + 1) & (ring->cap - 1);
    ring->count--;
    /* Give memory back when a large backlog has drained. */
    if (ring->count == 0 && ring->cap > 1024) {
        free(ring->entries);
        ring->entries = NULL;
        ring->cap = 0;
        ring->head = 0;
    }
    return entry;
}

/* ---- lifecycle ------------------------------------------------------ */

struct queue *queue_new(struct vhost *vhost, struct bytes name, bool durable, bool exclusive,
                        bool auto_delete, struct bytes arguments)
{
    struct queue *queue = calloc(1, sizeof *queue);
    ASSERT(queue != NULL);
    bind_dest_init(&queue->as_dest, BIND_DEST_QUEUE);
    queue->vhost = vhost;
    queue->name = bytes_dup(name);
    queue->durable = durable;
    queue->exclusive = exclusive;
    queue->auto_delete = auto_delete;
    queue->arguments = bytes_dup(arguments);
    list_init(&queue->consumers);
    list_init(&queue->owner_link);
    queue->refs = 1;
    return queue;
}

void queue_ref(struct queue *queue)
{
    ASSERT(queue->refs > 0);
    queue->refs++;
}

void queue_unref(struct queue *queue)
{
    ASSERT(queue->refs > 0);
    if (--queue->refs > 0)
        return;
    ASSERT(queue->ready.count == 0);
    ASSERT(list_empty(&queue->consumers));
    ASSERT(queue->as_dest.bindings_in_count == 0);
    free(queue->ready.entries);
    free((void *)queue->name.ptr);
    free((void *)queue->arguments.ptr);
    free(queue);
}

/* ---- messages ------------------------------------------------------- */

void queue_publish(struct queue *queue, struct message *message)
{
    ASSERT(!queue->deleted);
    message_ref(message);
    ring_push_back(&queue->ready,
                   (struct queue_entry){.message = message, .seq = queue->next_seq++});
    queue->ready_bytes += message->body_size;
    queue_dispatch(queue);
}

void queue_requeue(struct queue *queue, struct message *message, uint64_t seq)
{
    ASSERT(queue->unacked_count > 0);
    queue->unacked_count--;
    if (queue->deleted) {
        message_unref(message);
        return;
    }
    ring_insert_by_seq(&queue->ready,
                       (struct queue_entry){.message = message, .seq = seq, .redelivered = 1});
    queue->ready_bytes += message->body_size;
}

void queue_settle(struct queue *queue)
{
    ASSERT(queue->unacked_count > 0);
    queue->unacked_count--;
}

bool queue_take(struct queue *queue, struct queue_entry *out)
{
    if (queue->ready.count == 0)
        return false;
    *out = ring_pop_front(&queue->ready);
    queue->ready_bytes -= out->message->body_size;
    queue->unacked_count++;
    return true;
}

uint32_t queue_purge(struct queue *queue)
{
    uint32_t count = queue->ready.count;
    while (queue->ready.count > 0) {
        struct queue_entry entry = ring_pop_front(&queue->ready);
        message_unref(entry.message);
    }
    queue->ready_bytes = 0;
    return count;
}

void queue_dispatch(struct queue *queue)
{
    if (queue->dispatching || queue->deleted)
        return;
    queue->dispatching = true;
    while (queue->ready.count > 0 && queue->consumers_count > 0) {
        struct consumer *chosen = NULL;
        list_for_each(node, &queue->consumers) {
            struct consumer *consumer = CONTAINER_OF(node, struct consumer, queue_link);
            if (consumer->ops->can_take(consumer)) {
                chosen = consumer;
                break;
            }
        }
        if (!chosen)
            break;
        /* Round-robin: the chosen consumer goes to the back. */
        list_remove(&chosen->queue_link);
        list_push_back(&queue->consumers, &chosen->queue_link);
        struct queue_entry entry;
        bool taken = queue_take(queue, &entry);
        ASSERT(taken);
        chosen->ops->deliver(chosen, entry);
    }
    queue->dispatching = false;
}

/* ---- consumers ------------------------------------------------------ */

void queue_consumer_add(struct queue *queue, struct consumer *consumer)
{
    ASSERT(!queue->deleted);
    ASSERT(consumer->queue == NULL);
    consumer->queue = queue;
    queue_ref(queue);
    list_push_back(&queue->consumers, &consumer->queue_link);
    queue->consumers_count++;
    if (consumer->exclusive)
        queue->exclusive_consumers++;
    queue->had_consumers = true;
}

void queue_consumer_remove(struct queue *queue, struct consumer *consumer)
{
    ASSERT(consumer->queue == queue);
    ASSERT(queue->consumers_count > 0);
    list_remove(&consumer->queue_link);
    queue->consumers_count--;
    if (consumer->exclusive)
        queue->exclusive_consumers--;
    consumer->queue = NULL;
    queue_unref(queue);
}

uint32_t queue_delete(struct queue *queue)
{
    ASSERT(!queue->deleted);
    uint32_t dropped = queue_purge(queue);
    queue->deleted = true;
    queue_ref(queue); /* keep it alive while consumers detach */
    while (!list_empty(&queue->consumers)) {
        struct consumer *consumer =
            CONTAINER_OF(queue->consumers.next, struct consumer, queue_link);
        queue_consumer_remove(queue, consumer);
        consumer->ops->cancelled(consumer);
    }
    bind_dest_unbind_all(&queue->as_dest, NULL, NULL);
    queue_unref(queue);
    return dropped;
}
