/*
 * queue_walk.c: see queue_walk.h. Stepping takes the reference on the
 * next queue before dropping the one on the queue left: dropping it may
 * free that queue (it was deleted while the walk stood on it), which
 * unlinks it from the list, and its successor must not be read after.
 */
#include "broker/queue_walk.h"

#include <stddef.h>

#include "broker/broker.h"
#include "broker/queue.h"
#include "lib/assert.h"
#include "lib/list.h"

void queue_walk_begin(struct queue_walk *walk, struct broker *broker)
{
    ASSERT(broker != NULL);
    ASSERT(broker->queues_all.next != NULL);
    walk->broker = broker;
    walk->at = NULL;
    walk->serial_last = broker->queues_all_serial;
    walk->done = false;
}

struct queue *queue_walk_next(struct queue_walk *walk)
{
    if (walk->done)
        return NULL;
    const struct list_node *head = &walk->broker->queues_all;
    /* The queue stood on is still linked: the walk's reference kept it. */
    ASSERT(walk->at == NULL || list_linked(&walk->at->all_link));
    struct list_node *node = walk->at != NULL ? walk->at->all_link.next : head->next;
    struct queue *found = NULL;
    for (; node != head; node = node->next) {
        struct queue *queue = CONTAINER_OF(node, struct queue, all_link);
        if (queue->all_serial > walk->serial_last)
            break; /* joined after the walk began: so did every one after it */
        if (!queue->deleted) {
            found = queue;
            break;
        }
    }
    if (found != NULL)
        queue_ref(found);
    struct queue *left = walk->at;
    walk->at = found;
    walk->done = found == NULL;
    if (left != NULL)
        queue_unref(left); /* may free it (deleted meanwhile): nothing of it is read after */
    return found;
}

void queue_walk_end(struct queue_walk *walk)
{
    struct queue *left = walk->at;
    walk->at = NULL;
    walk->done = true;
    if (left != NULL)
        queue_unref(left);
}
