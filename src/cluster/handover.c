/*
 * handover.c: see handover.h.
 */
#include "cluster/handover.h"

#include <stdlib.h>

#include "broker/broker.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/replication.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/json.h"

enum handover_phase {
    HANDOVER_QUIESCING,  /* paused, waiting for the backups to have everything */
    HANDOVER_PROPOSED,   /* queue.set_owner planned on its way: its outcome decides */
    HANDOVER_CANCELLING, /* no outcome came: queue.move to none first, then resume */
};

struct handover {
    struct list_node link;          /* in member->handovers */
    struct member *member;          /* borrowed */
    struct queue *queue;            /* one reference */
    uint32_t to;
    uint64_t epoch;                 /* the queue's, when it began */
    uint64_t started_ms;
    enum handover_phase phase;
    struct cluster_request *request; /* the proposal or the cancel in flight, or NULL */
};

static const char *const phase_names[] = {"quiescing", "proposed", "cancelling"};

static uint64_t now_ms(const struct member *member)
{
    return uv_now(member->broker->loop);
}

static struct handover *find(struct member *member, const struct queue *queue)
{
    list_for_each(n, &member->handovers) {
        struct handover *h = CONTAINER_OF(n, struct handover, link);
        if (h->queue == queue)
            return h;
    }
    return NULL;
}

static void log_queue(const struct handover *h, const char *what)
{
    LOG_INFO("vhost=%.*s queue=%.*s: handover to broker %u %s",
             (int)h->queue->vhost->name.len, (const char *)h->queue->vhost->name.ptr,
             (int)h->queue->name.len, (const char *)h->queue->name.ptr, h->to, what);
}

/* Over. resume: the queue goes on here (its held publishes enqueued);
 * else the caller takes them (it became a stand-in). */
static void end(struct handover *h, bool resume)
{
    list_remove(&h->link);
    if (h->request != NULL)
        cluster_request_cancel(h->request);
    struct queue *queue = h->queue;
    free(h);
    replication_quiesce_end(queue);
    if (resume && queue_paused(queue))
        queue_resume(queue);
    queue_unref(queue);
}

/* The cancel of a handover already over (it gave up): whatever becomes
 * of it, the map says. */
static void on_cancel_sent(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    (void)status;
    (void)change;
}

static void on_cancelled(void *ctx, int status, const struct map_change *change)
{
    struct handover *h = ctx;
    h->request = NULL;
    /* Applied: the map change (move_to none) already ended it here
     * (handover_follow). Refused: the queue moved on (a new epoch), and
     * that change ends it. No answer: the tick asks again. */
    (void)status;
    (void)change;
}

/* Cancels the move in the map. While the queue stays paused, a proposed
 * handover still on its way is refused once this applies before it. */
static void cancel_move(struct handover *h)
{
    struct map_cmd cmd;
    if (map_cmd_queue_move(&cmd, h->queue->vhost->name, h->queue->name, h->epoch,
                           BROKER_ID_NONE) != OK)
        return;
    h->request = cluster_node_submit(h->member->node, &cmd, on_cancelled, h);
}

static void on_proposed(void *ctx, int status, const struct map_change *change)
{
    struct handover *h = ctx;
    h->request = NULL;
    if (status == OK && change->reply_code == 200)
        return; /* the mirror made the queue a stand-in: handover_done */
    if (status == OK) {
        /* Refused (the target left the in-sync set, the epoch moved): it
         * will not apply later; the queue goes on here. */
        log_queue(h, change->reply_text);
        end(h, true);
        return;
    }
    /* No answer: it may still commit. Cancel first, resume after. */
    log_queue(h, "not answered: cancelling the move");
    h->phase = HANDOVER_CANCELLING;
    cancel_move(h);
}

static void propose(struct handover *h)
{
    struct map_cmd cmd;
    if (map_cmd_queue_hand_over(&cmd, h->queue->vhost->name, h->queue->name, h->epoch, h->to) !=
        OK)
        return;
    h->phase = HANDOVER_PROPOSED;
    h->request = cluster_node_submit(h->member->node, &cmd, on_proposed, h);
    LOG_DEBUG("queue %.*s: quiet after %llu ms: handing over to broker %u",
              (int)h->queue->name.len, (const char *)h->queue->name.ptr,
              (unsigned long long)(now_ms(h->member) - h->started_ms), h->to);
}

void handover_quiet(struct member *member, struct queue *queue)
{
    struct handover *h = find(member, queue);
    if (h != NULL && h->phase == HANDOVER_QUIESCING && replication_quiesce(queue))
        propose(h);
}

static void start(struct member *member, struct queue *queue, const struct map_queue *mq)
{
    struct handover *h = calloc(1, sizeof *h);
    ASSERT(h != NULL);
    h->member = member;
    h->queue = queue;
    queue_ref(queue);
    h->to = mq->move_to;
    h->epoch = mq->epoch;
    h->started_ms = now_ms(member);
    h->phase = HANDOVER_QUIESCING;
    list_push_back(&member->handovers, &h->link);
    queue_pause(queue);
    handover_quiet(member, queue);
}

void handover_follow(struct member *member, struct queue *queue, const struct map_queue *mq)
{
    bool wanted = !member->stopping && mq->available && mq->move_to != BROKER_ID_NONE &&
                  map_queue_backup_in_sync(mq, mq->move_to);
    struct handover *h = find(member, queue);
    if (h != NULL) {
        bool same = wanted && h->to == mq->move_to && h->epoch == mq->epoch;
        if ((h->phase == HANDOVER_QUIESCING && same) || h->phase == HANDOVER_PROPOSED)
            return; /* going on, or its outcome decides */
        if (h->phase == HANDOVER_CANCELLING && mq->move_to != BROKER_ID_NONE &&
            mq->epoch == h->epoch)
            return; /* the cancel has not applied yet */
        end(h, true);
    }
    if (wanted)
        start(member, queue, mq);
}

bool handover_done(struct member *member, struct queue *queue, uint32_t new_primary)
{
    struct handover *h = find(member, queue);
    if (h == NULL)
        return false;
    bool planned = h->phase == HANDOVER_PROPOSED && h->to == new_primary;
    end(h, false);
    return planned;
}

void handover_tick(struct member *member)
{
    uint64_t now = now_ms(member);
    list_for_each_safe(n, &member->handovers) {
        struct handover *h = CONTAINER_OF(n, struct handover, link);
        if (h->phase == HANDOVER_QUIESCING && now - h->started_ms >= HANDOVER_QUIESCE_MS) {
            /* Its backups do not settle (a stalled link, a stream of
             * settles): nothing was proposed, so the queue goes on here. */
            log_queue(h, "gave up: the backups did not settle");
            struct map_cmd cmd;
            if (map_cmd_queue_move(&cmd, h->queue->vhost->name, h->queue->name, h->epoch,
                                   BROKER_ID_NONE) == OK)
                cluster_node_submit(member->node, &cmd, on_cancel_sent, NULL);
            end(h, true);
        } else if (h->phase == HANDOVER_CANCELLING && h->request == NULL) {
            cancel_move(h);
        }
    }
}

void handover_stop_all(struct member *member)
{
    while (!list_empty(&member->handovers))
        end(CONTAINER_OF(member->handovers.next, struct handover, link), true);
}

void handover_write_json(struct member *member, struct json *out)
{
    uint64_t now = now_ms(member);
    json_array_begin(out);
    list_for_each(n, &member->handovers) {
        const struct handover *h = CONTAINER_OF(n, struct handover, link);
        json_object_begin(out);
        json_key(out, "vhost");
        json_string_n(out, h->queue->vhost->name.ptr, h->queue->vhost->name.len);
        json_key(out, "queue");
        json_string_n(out, h->queue->name.ptr, h->queue->name.len);
        json_kv_uint(out, "to", h->to);
        json_kv_string(out, "phase", phase_names[h->phase]);
        json_kv_uint(out, "ms", now - h->started_ms);
        json_object_end(out);
    }
    json_array_end(out);
}
