/*
 * handover.c: see handover.h.
 */
#include "cluster/handover.h"

#include <stdlib.h>

#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "amqp/method_gen.h"
#include "cluster/link.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/replica.h"
#include "cluster/replication.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "lib/json.h"

enum handover_phase {
    HANDOVER_QUIESCING,  /* paused, waiting for the backups to have everything */
    HANDOVER_NOTIFYING,  /* the target told what is delivered: waiting for it to have read it */
    HANDOVER_PROPOSED,   /* queue.set_owner planned on its way: its outcome decides */
    HANDOVER_CANCELLING, /* no outcome came: queue.move to none first, then resume */
};

/* Seqs per basic.quay-handover frame (8 bytes each, two lists: 64 KiB at
 * most, within any frame_max a link offers). */
#define NOTICE_CHUNK 4096

struct handover {
    struct list_node link;          /* in member->handovers */
    struct member *member;          /* borrowed */
    struct queue *queue;            /* one reference */
    uint32_t to;
    uint64_t epoch;                 /* the queue's, when it began */
    uint64_t started_ms;
    enum handover_phase phase;
    struct cluster_request *request; /* the proposal or the cancel in flight, or NULL */
    /* From the notice on: the channel to the target its deliveries will
     * be on, and the seqs it was told are delivered (ascending). */
    struct link_channel *relay;
    uint64_t *delivered;            /* owned */
    uint32_t delivered_count;
};

static const char *const phase_names[] = {"quiescing", "notifying", "proposed", "cancelling"};

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
    if (h->relay != NULL)
        link_channel_close(h->relay); /* the target requeues anything on it */
    struct queue *queue = h->queue;
    free(h->delivered);
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

/* Gives up before anything was proposed: the queue goes on here, and the
 * move is cancelled (whatever becomes of that, the map says). */
static void give_up(struct handover *h, const char *why)
{
    log_queue(h, why);
    struct map_cmd cmd;
    if (map_cmd_queue_move(&cmd, h->queue->vhost->name, h->queue->name, h->epoch,
                           BROKER_ID_NONE) == OK)
        cluster_node_submit(h->member->node, &cmd, on_cancel_sent, NULL);
    end(h, true);
}

static void on_relay_closed(void *ctx, uint16_t code, struct bytes text)
{
    struct handover *h = ctx;
    (void)code;
    (void)text;
    h->relay = NULL;
    if (h->phase == HANDOVER_QUIESCING || h->phase == HANDOVER_NOTIFYING)
        give_up(h, "gave up: its channel to the target closed");
    /* Proposed: the outcome decides; the deliveries then come back to the
     * new primary redelivered (its end of the channel requeued them). */
}

struct seqs {
    uint64_t *items;
    uint32_t count, cap;
};

static void add_seq(void *ctx, uint64_t seq, struct message *message)
{
    struct seqs *v = ctx;
    (void)message;
    if (v->count == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 256;
        v->items = xrealloc(v->items, sizeof *v->items * v->cap);
    }
    v->items[v->count++] = seq;
}

static int seq_order(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void pack(uint8_t *out, const uint64_t *seqs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        for (int b = 0; b < 8; b++)
            out[i * 8 + (uint32_t)b] = (uint8_t)(seqs[i] >> (56 - 8 * b));
    }
}

/* Tells the target what it will need to serve the queue as it stands: the
 * seqs delivered and not settled here (live deliveries, and the settles
 * the paused queue holds) and the ready ones delivered before, on a
 * channel of its own, where the target will keep those deliveries. */
static bool notify(struct handover *h)
{
    struct member_peer *peer = member_peer(h->member, h->to);
    if (peer == NULL || !peer->up)
        return false;
    struct queue *queue = h->queue;
    struct seqs delivered = {0};
    channels_each_unacked(h->member->broker, queue, add_seq, &delivered);
    struct queue_held_settle *settles = queue->pause ? queue->pause->settles : NULL;
    for (uint32_t i = 0; settles && i < queue->pause->settles_count; i++)
        add_seq(&delivered, settles[i].entry.seq, NULL);
    if (delivered.count > 1)
        qsort(delivered.items, delivered.count, sizeof *delivered.items, seq_order);
    uint64_t *redelivered;
    uint32_t redelivered_count = queue_redelivered_seqs(queue, &redelivered);
    struct link_channel_ops ops = {.ctx = h, .closed = on_relay_closed};
    h->relay = link_channel_open(peer->link, queue->vhost->name, false, &ops);
    if (h->relay != NULL) {
        uint8_t *buf = xmalloc(2 * 8 * NOTICE_CHUNK);
        uint32_t d = 0, r = 0;
        do { /* at least one frame, empty lists and all */
            uint32_t dn = delivered.count - d < NOTICE_CHUNK ? delivered.count - d : NOTICE_CHUNK;
            uint32_t rn = redelivered_count - r < NOTICE_CHUNK ? redelivered_count - r
                                                                : NOTICE_CHUNK;
            pack(buf, delivered.items + d, dn);
            pack(buf + 8 * NOTICE_CHUNK, redelivered + r, rn);
            struct method m = {.id = METHOD_BASIC_QUAY_HANDOVER};
            m.basic_quay_handover.queue = queue->name;
            m.basic_quay_handover.epoch = h->epoch;
            m.basic_quay_handover.delivered = (struct bytes){buf, 8 * dn};
            m.basic_quay_handover.redelivered = (struct bytes){buf + 8 * NOTICE_CHUNK, 8 * rn};
            link_send(h->relay, &m);
            d += dn;
            r += rn;
        } while (d < delivered.count || r < redelivered_count);
        free(buf);
    }
    free(redelivered);
    h->delivered = delivered.items;
    h->delivered_count = delivered.count;
    return h->relay != NULL;
}

void handover_quiet(struct member *member, struct queue *queue)
{
    struct handover *h = find(member, queue);
    if (h == NULL || !replication_quiesce(queue))
        return;
    if (h->phase == HANDOVER_QUIESCING) {
        if (!notify(h)) {
            give_up(h, "gave up: the target cannot be reached");
            return;
        }
        /* Proposed once the target answered a probe sent after it. */
        h->phase = HANDOVER_NOTIFYING;
        replication_probe_again(queue);
        if (!replication_quiesce(queue))
            return;
    }
    if (h->phase == HANDOVER_NOTIFYING)
        propose(h);
}

static void start(struct member *member, struct queue *queue, const struct map_queue *mq)
{
    struct handover *h = xcalloc(1, sizeof *h);
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
    /* (Ready: the target in sync, and the factor kept after the switch.) */
    bool wanted = !member->stopping && mq->available &&
                  map_queue_move_state(member_map(member), mq) == MAP_MOVE_READY &&
                  replication_holds_everything(queue, mq->move_to);
    struct handover *h = find(member, queue);
    if (h != NULL) {
        bool same = wanted && h->to == mq->move_to && h->epoch == mq->epoch;
        bool waiting = h->phase == HANDOVER_QUIESCING || h->phase == HANDOVER_NOTIFYING;
        if ((waiting && same) || h->phase == HANDOVER_PROPOSED)
            return; /* going on, or its outcome decides */
        if (h->phase == HANDOVER_CANCELLING && mq->move_to != BROKER_ID_NONE &&
            mq->epoch == h->epoch)
            return; /* the cancel has not applied yet */
        end(h, true);
    }
    if (wanted)
        start(member, queue, mq);
}

bool handover_done(struct member *member, struct queue *queue, uint32_t new_primary,
                   struct handover_relay *relay)
{
    *relay = (struct handover_relay){0};
    struct handover *h = find(member, queue);
    if (h == NULL)
        return false;
    bool planned = h->phase == HANDOVER_PROPOSED && h->to == new_primary;
    if (planned)
        LOG_INFO("vhost=%.*s queue=%.*s: handed over to broker %u after standing still %llu ms "
                 "(%u deliveries kept)", (int)queue->vhost->name.len,
                 (const char *)queue->vhost->name.ptr, (int)queue->name.len,
                 (const char *)queue->name.ptr, new_primary,
                 (unsigned long long)(now_ms(member) - h->started_ms), h->delivered_count);
    if (planned && h->relay != NULL) {
        relay->channel = h->relay;
        relay->delivered = h->delivered;
        relay->delivered_count = h->delivered_count;
        h->relay = NULL;
        h->delivered = NULL;
        static const struct link_channel_ops none = {0};
        link_channel_set_ops(relay->channel, &none); /* the caller's from now on */
    }
    end(h, false);
    return planned;
}

void handover_adopt(struct member *member, struct queue *queue, struct replica_handover *note,
                    uint64_t previous_epoch)
{
    struct channel *ch = note && note->epoch == previous_epoch
                             ? channel_find(member->broker, note->connection_id, note->channel_id)
                             : NULL;
    if (ch != NULL) {
        uint32_t n = note->delivered_count;
        struct queue_entry *entries = xmalloc(sizeof *entries * (n ? n : 1));
        bool *found = xmalloc(sizeof *found * (n ? n : 1));
        queue_take_delivered(queue, note->delivered, n, entries, found);
        for (uint32_t k = 0; k < n; k++)
            channel_adopt_delivery(ch, queue, found[k] ? &entries[k] : NULL);
        queue_set_redelivered(queue, note->redelivered, note->redelivered_count);
        free(entries);
        free(found);
    }
    replica_handover_free(note);
}

void handover_forwards_drained(struct member *member, struct vhost *vhost, struct bytes name)
{
    (void)member;
    struct queue *queue = vhost_queue(vhost, name);
    /* (Standing still for a handover of its own: that one resumes it.) */
    if (queue != NULL && !queue_is_remote(queue) && queue->pause != NULL &&
        !queue->pause->standing)
        queue_resume(queue);
}

void handover_tick(struct member *member)
{
    uint64_t now = now_ms(member);
    list_for_each_safe(n, &member->handovers) {
        struct handover *h = CONTAINER_OF(n, struct handover, link);
        bool waiting = h->phase == HANDOVER_QUIESCING || h->phase == HANDOVER_NOTIFYING;
        if (waiting && now - h->started_ms >= HANDOVER_QUIESCE_MS) {
            /* Its backups do not answer (a stalled link): nothing was
             * proposed, so the queue goes on here. */
            give_up(h, "gave up: the backups did not answer in time");
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
