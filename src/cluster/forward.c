/*
 * forward.c: publishes a stand-in forwards to its queue's primary (and the
 * primary's replication stream to its backups, which shares the channel):
 * one confirm channel per (peer, vhost), the answers owed to publishers,
 * and the publishes held while no primary can be reached (proxy.h).
 */
#include "cluster/proxy.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/channel.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "cluster/member.h"
#include "cluster/proxy_int.h"
#include "lib/assert.h"
#include "lib/ring.h"
#include "lib/bytes.h"
#include "lib/log.h"

/* One confirm channel per (peer, vhost): forwarded publishes. */
struct forward_wait {
    struct confirm_sink *sink;    /* one reference, or NULL */
    uint64_t seq;                 /* the publisher channel's number */
    struct queue *stub;           /* a forward: its stand-in (one reference), for a resend */
    struct message *message;      /* a forward: one reference; NULL for replication */
    uint64_t epoch;               /* a forward: the queue's epoch it was sent under */
    proxy_notify_fn notify;       /* or a callback (replica.c's stream to a backup) */
    void *notify_ctx;
    uint64_t notify_tag;
    bool done;
};

#define HELD_FORWARDS_MAX 100000  /* per stand-in; beyond it, publishes are nacked */

struct proxy_forwarder {
    struct list_node peer_link;   /* in peer->forwarders */
    struct member_peer *peer;     /* borrowed */
    struct bytes vhost;           /* owned */
    struct link_channel *ch;      /* NULL once closed */
    struct forward_wait *waits;   /* owned ring, by link sequence number */
    uint32_t head, count, cap;
    uint64_t first_seq;           /* link sequence number of waits[head] */
};

/* ---- forwarding publishes ---- */

static bool hold_forward(struct queue *queue, struct message *message, struct confirm_sink *sink,
                         uint64_t seq);

/* A forward the primary did not take for good is sent again (to whoever is
 * the primary by then): its link died before the answer came, or it was
 * nacked by a primary that has since been replaced (a deposed primary
 * discards what it never confirmed; the publisher should not see that). */
static bool forward_resend(const struct forward_wait *w, bool ack, bool lost)
{
    if (w->stub == NULL || !queue_is_remote(w->stub) || w->stub->deleted)
        return false;
    if (!lost && (ack || proxy_stub_epoch(w->stub) == w->epoch))
        return false;
    return hold_forward(w->stub, w->message, w->sink, w->seq);
}

/* answer: the primary's ack or nack; lost: the link died before it came
 * (a replication's callback hears a nack). The wait is taken out of its
 * slot first: a callback may send on this forwarder again (a catch-up
 * sends more as answers come), which can grow, and so move, the ring. */
static void forwarder_answer(struct proxy_forwarder *f, struct forward_wait *slot, bool ack,
                             bool lost)
{
    if (slot->done)
        return;
    struct forward_wait w = *slot;
    *slot = (struct forward_wait){.done = true};
    bool resent = forward_resend(&w, ack, lost);
    if (w.notify)
        w.notify(w.notify_ctx, w.notify_tag, ack && !lost);
    if (w.sink) {
        if (!resent)
            confirm_sink_answer(w.sink, w.seq, ack);
        confirm_sink_unref(w.sink);
    }
    if (w.message)
        message_unref(w.message);
    if (w.stub)
        queue_unref(w.stub);
    (void)f;
}

static void forwarder_trim(struct proxy_forwarder *f)
{
    while (f->count > 0 && f->waits[f->head].done) {
        f->head = (f->head + 1) & (f->cap - 1);
        f->count--;
        f->first_seq++;
    }
}

static void forwarder_fail_all(struct proxy_forwarder *f)
{
    for (uint32_t i = 0; i < f->count; i++)
        forwarder_answer(f, &f->waits[(f->head + i) & (f->cap - 1)], false, true);
    forwarder_trim(f);
}

static void on_forward_confirm(void *ctx, uint64_t seq, bool multiple, bool ack)
{
    struct proxy_forwarder *f = ctx;
    if (f->count == 0 || seq < f->first_seq || seq - f->first_seq >= f->count)
        return; /* not ours to answer (a peer bug): ignore */
    uint64_t from = multiple ? 0 : seq - f->first_seq;
    for (uint64_t i = from; i <= seq - f->first_seq; i++)
        forwarder_answer(f, &f->waits[(f->head + i) & (f->cap - 1)], ack, false);
    forwarder_trim(f);
}

static void on_forward_closed(void *ctx, uint16_t code, struct bytes text)
{
    struct proxy_forwarder *f = ctx;
    if (code != 0)
        LOG_WARN("cluster: forwarding channel to broker %u closed: %u %.*s", f->peer->id, code,
                 (int)text.len, (const char *)text.ptr);
    f->ch = NULL;
    forwarder_fail_all(f);
}

static const struct link_channel_ops forwarder_ops_template = {
    .confirm = on_forward_confirm,
    .closed = on_forward_closed,
};

static void forwarder_free(struct proxy_forwarder *f)
{
    forwarder_fail_all(f);
    if (f->ch)
        link_channel_close(f->ch);
    list_remove(&f->peer_link);
    bytes_free(&f->vhost);
    free(f->waits);
    free(f);
}

static struct proxy_forwarder *forwarder_for(struct member_peer *peer, struct bytes vhost)
{
    list_for_each_safe(n, &peer->forwarders) {
        struct proxy_forwarder *f = CONTAINER_OF(n, struct proxy_forwarder, peer_link);
        if (!bytes_equal(f->vhost, vhost))
            continue;
        if (f->ch)
            return f;
        if (f->count == 0) {
            forwarder_free(f); /* closed and answered: open a new one */
            break;
        }
    }
    struct proxy_forwarder *f = calloc(1, sizeof *f);
    ASSERT(f != NULL);
    f->peer = peer;
    f->vhost = bytes_dup(vhost);
    f->first_seq = 1;
    struct link_channel_ops ops = forwarder_ops_template;
    ops.ctx = f;
    f->ch = link_channel_open(peer->link, vhost, true, &ops);
    list_push_back(&peer->forwarders, &f->peer_link);
    if (f->ch == NULL) {
        forwarder_free(f);
        return NULL;
    }
    return f;
}

static void forwarder_push(struct proxy_forwarder *f, struct forward_wait w)
{
    if (f->count == f->cap)
        f->waits = ring_grow(f->waits, sizeof *f->waits, &f->head, f->count, &f->cap, 64);
    f->waits[(f->head + f->count) & (f->cap - 1)] = w;
    f->count++;
}

/* Sends m (and message's content) to peer; for a content, w says who
 * waits for the answer: the sink and seq (referenced here), the stand-in
 * to resend for (ditto), or a callback. */
static bool peer_send(struct member_peer *peer, struct bytes vhost, const struct method *m,
                      struct message *message, struct forward_wait w)
{
    /* (Also from a closed callback while the link goes down.) */
    if (peer == NULL || !peer->up || !link_is_up(peer->link))
        return false;
    struct proxy_forwarder *f = forwarder_for(peer, vhost);
    if (f == NULL)
        return false;
    if (message == NULL) {
        link_send(f->ch, m);
        return true;
    }
    uint64_t link_seq = link_send_content(f->ch, m, message);
    ASSERT(link_seq == f->first_seq + f->count);
    if (w.sink)
        confirm_sink_ref(w.sink);
    if (w.stub) {
        queue_ref(w.stub);
        message_ref(message);
        w.message = message;
    }
    forwarder_push(f, w);
    return true;
}

bool proxy_peer_send(struct member_peer *peer, struct bytes vhost, const struct method *m,
                     struct message *message, struct confirm_sink *sink, uint64_t seq)
{
    return peer_send(peer, vhost, m, message, (struct forward_wait){.sink = sink, .seq = seq});
}

bool proxy_peer_send_notify(struct member_peer *peer, struct bytes vhost, const struct method *m,
                            struct message *message, proxy_notify_fn notify, void *ctx,
                            uint64_t tag)
{
    return peer_send(peer, vhost, m, message,
                     (struct forward_wait){.notify = notify, .notify_ctx = ctx, .notify_tag = tag});
}

bool forward__stub(struct queue *queue, struct message *message, struct confirm_sink *sink,
                         uint64_t seq)
{
    struct proxy_stub *stub = stub_of(queue);
    if (!stub->available)
        return false;
    struct member_peer *peer = member_peer(stub->member, stub->primary_id);
    if (stub->held_count > 0 || peer == NULL || !peer->up)
        return hold_forward(queue, message, sink, seq); /* in order, behind the held ones */
    struct method m = {.id = METHOD_BASIC_QUAY_FORWARD};
    m.basic_quay_forward.queue = queue->name;
    m.basic_quay_forward.exchange = message_exchange(message);
    m.basic_quay_forward.routing_key = message_routing_key(message);
    m.basic_quay_forward.epoch = stub->epoch;
    return peer_send(peer, queue->vhost->name, &m, message,
                     (struct forward_wait){.sink = sink, .seq = seq, .stub = queue,
                                           .epoch = stub->epoch});
}

/* ---- publishes waiting for a primary ---- */

static bool hold_forward(struct queue *queue, struct message *message, struct confirm_sink *sink,
                         uint64_t seq)
{
    struct proxy_stub *stub = stub_of(queue);
    if (!stub->available || stub->held_count >= HELD_FORWARDS_MAX)
        return false;
    if (stub->held_count == stub->held_cap)
        stub->held = ring_grow(stub->held, sizeof *stub->held, &stub->held_head, stub->held_count,
                  &stub->held_cap, 64);
    message_ref(message);
    if (sink)
        confirm_sink_ref(sink);
    stub->held[(stub->held_head + stub->held_count) & (stub->held_cap - 1)] =
        (struct held_forward){message, sink, seq};
    stub->held_count++;
    return true;
}

/* Sends the held publishes to the primary (ack: false: nack them all). */
void forward__release_held(struct queue *queue, bool send)
{
    struct proxy_stub *stub = stub_of(queue);
    while (stub->held_count > 0) {
        struct member_peer *peer = member_peer(stub->member, stub->primary_id);
        if (send && (peer == NULL || !peer->up))
            return; /* still nowhere to send them */
        struct held_forward h = stub->held[stub->held_head];
        stub->held_head = (stub->held_head + 1) & (stub->held_cap - 1);
        stub->held_count--;
        bool sent = false;
        if (send) {
            struct method m = {.id = METHOD_BASIC_QUAY_FORWARD};
            m.basic_quay_forward.queue = queue->name;
            m.basic_quay_forward.exchange = message_exchange(h.message);
            m.basic_quay_forward.routing_key = message_routing_key(h.message);
            m.basic_quay_forward.epoch = stub->epoch;
            sent = peer_send(peer, queue->vhost->name, &m, h.message,
                             (struct forward_wait){.sink = h.sink, .seq = h.seq, .stub = queue,
                                                   .epoch = stub->epoch});
        }
        if (!sent && h.sink)
            confirm_sink_answer(h.sink, h.seq, false);
        if (h.sink)
            confirm_sink_unref(h.sink);
        message_unref(h.message);
    }
}

uint64_t proxy_stub_epoch(const struct queue *queue)
{
    return stub_of((struct queue *)queue)->epoch;
}

void proxy_stub_recall_forwards(struct queue *queue)
{
    forward__redirect(queue, stub_of(queue)->primary_id);
}

uint32_t proxy_stub_take_held(struct queue *queue, struct proxy_held **out)
{
    struct proxy_stub *stub = stub_of(queue);
    uint32_t n = stub->held_count;
    *out = NULL;
    if (n == 0)
        return 0;
    *out = malloc(sizeof **out * n);
    ASSERT(*out != NULL);
    for (uint32_t i = 0; i < n; i++) {
        struct held_forward h = stub->held[(stub->held_head + i) & (stub->held_cap - 1)];
        (*out)[i] = (struct proxy_held){h.message, h.sink, h.seq};
    }
    stub->held_count = 0;
    stub->held_head = 0;
    return n;
}

void forward__redirect(struct queue *queue, uint32_t old_primary_id)
{
    struct proxy_stub *stub = stub_of(queue);
    struct member_peer *peer = member_peer(stub->member, old_primary_id);
    if (peer == NULL)
        return;
    list_for_each_safe(n, &peer->forwarders) {
        struct proxy_forwarder *f = CONTAINER_OF(n, struct proxy_forwarder, peer_link);
        if (!bytes_equal(f->vhost, queue->vhost->name))
            continue;
        for (uint32_t i = 0; i < f->count; i++) {
            struct forward_wait *w = &f->waits[(f->head + i) & (f->cap - 1)];
            if (!w->done && w->stub == queue)
                forwarder_answer(f, w, false, true); /* held, for the new primary */
        }
        forwarder_trim(f);
    }
}

void forward__peer_down(struct member_peer *peer)
{
    while (!list_empty(&peer->forwarders)) {
        struct proxy_forwarder *f =
            CONTAINER_OF(peer->forwarders.next, struct proxy_forwarder, peer_link);
        forwarder_fail_all(f);
        f->ch = NULL; /* gone with the link */
        forwarder_free(f);
    }
}
