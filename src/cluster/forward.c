/*
 * forward.c: publishes a stand-in forwards to its queue's primary (and the
 * primary's replication stream to its backups, which shares the channel):
 * one confirm channel per (peer, vhost), the answers owed to publishers,
 * and the publishes held while no primary can be reached (proxy.h).
 */
#include "cluster/proxy.h"

#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "amqp/method_gen.h"
#include "amqp/table.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/connection.h"
#include "broker/flow.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/handover.h"
#include "cluster/link.h"
#include "cluster/member.h"
#include "cluster/proxy_int.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/ring.h"
#include "lib/bytes.h"
#include "lib/log.h"

/* One target of a forward: a stand-in and the queue epoch the forward
 * named for it. */
struct forward_target {
    struct queue *stub;           /* one reference */
    uint64_t epoch;
};

/* What one message sent on a forwarder waits for. A forward (message set)
 * may name several queues on its primary broker (targets): one copy of the
 * message, one answer. A replication (notify set) is one backup's. */
struct forward_wait {
    struct confirm_sink *sink;    /* one reference, or NULL */
    uint64_t seq;                 /* the publisher channel's number */
    struct message *message;      /* a forward: one reference; NULL for replication */
    struct forward_target one;    /* the targets when there is one (the common case) */
    struct forward_target *many;  /* owned, when there are more */
    uint32_t targets_count;
    bool dead_lettered;
    bool nack;                    /* a target taken out of it could not be resent */
    uint64_t bytes;               /* counted in member->forward_bytes until answered */
    proxy_notify_fn notify;       /* or a callback (replica.c's stream to a backup) */
    void *notify_ctx;
    uint64_t notify_tag;
    struct forward_origin origin; /* a forward's (proxy_int.h) */
    bool done;
};

#define HELD_FORWARDS_MAX 100000  /* per stand-in; beyond it, publishes are nacked */
/* Targets named by one forward: its method frame (a name and an epoch per
 * target, at most 266 bytes each) stays far under any frame_max. */
#define FORWARD_TARGETS_MAX 64

/* A peer's confirm channels per vhost: one for the publishes forwarded to
 * its queues, one for the replication of ours to it (replication.h). Two,
 * because the peer confirms each channel's publishes in order: an old
 * primary that stays our backup after a handover answers our replication
 * only after the forwards it held for the switch, whose answers wait for
 * our confirms of what it passed on to us, which wait for its replica's
 * answers (a cycle that only the 2 s lag rule broke). */
enum forwarder_kind { FORWARDER_PUBLISH, FORWARDER_REPLICATION };

struct proxy_forwarder {
    struct list_node peer_link;   /* in peer->forwarders */
    struct member_peer *peer;     /* borrowed */
    struct bytes vhost;           /* owned */
    enum forwarder_kind kind;
    uint64_t stream;              /* the origin stream of what is first sent here */
    struct link_channel *ch;      /* NULL once closed */
    struct forward_wait *waits;   /* owned ring, by link sequence number */
    uint32_t head, count, cap;
    uint64_t first_seq;           /* link sequence number of waits[head] */
    /* The targets table of the last forward sent on the channel: the next
     * one with the same targets (a stream fanned out to the same queues)
     * says "same-targets" instead of naming them all again. */
    uint8_t *last_targets;        /* owned */
    uint32_t last_targets_size, last_targets_cap;
};

static struct forward_target *wait_targets(struct forward_wait *w)
{
    return w->targets_count > 1 ? w->many : &w->one;
}

/* ---- forwarding publishes ---- */

static bool hold_forward(struct queue *queue, struct message *message, struct confirm_sink *sink,
                         uint64_t seq, bool dead_lettered, struct forward_origin origin);
static const struct forward_origin NO_ORIGIN = {0, 0};

/* A forward naming the stand-in was answered (or taken out of one). The
 * last of them ends a drain: what was held goes (to the new primary, or,
 * if we are it now, into the real queue that replaced the stand-in). */
static void target_done(struct queue *queue)
{
    struct proxy_stub *stub = stub_of(queue);
    ASSERT(stub->forwards_out > 0);
    if (--stub->forwards_out > 0 || !stub->draining)
        return;
    stub->draining = false;
    if (!queue->deleted)
        forward__release_held(queue, true);
    else
        handover_forwards_drained(stub->member, queue->vhost, queue->name);
}

/* Whether a target the primary did not take for good is sent again (to
 * whoever is the primary by then): its link died before the answer came
 * (lost), or it was nacked by a primary that has since been replaced (a
 * deposed primary discards what it never confirmed; the publisher should
 * not see that). False: the answer stands (or there is nowhere to send it). */
static bool target_resent(const struct forward_wait *w, const struct forward_target *t, bool ack,
                          bool lost)
{
    if (!queue_is_remote(t->stub) || t->stub->deleted)
        return false;
    if (!lost && (ack || proxy_stub_epoch(t->stub) == t->epoch))
        return false;
    return hold_forward(t->stub, w->message, w->sink, w->seq, w->dead_lettered, w->origin);
}

/* Flow: the bytes in flight to each peer (and to all of them). */
static void inflight_add(struct member_peer *peer, uint64_t bytes)
{
    peer->member->forward_bytes += bytes;
    peer->forward_bytes += bytes;
    if (!peer->forward_flow && peer->forward_bytes > MEMBER_FORWARD_HIGH_BYTES) {
        peer->forward_flow = true;
        peer->member->forward_flow_peers++;
    }
}

static void inflight_sub(struct member_peer *peer, uint64_t bytes)
{
    struct member *member = peer->member;
    ASSERT(member->forward_bytes >= bytes && peer->forward_bytes >= bytes);
    member->forward_bytes -= bytes;
    peer->forward_bytes -= bytes;
    if (peer->forward_flow && peer->forward_bytes < MEMBER_FORWARD_LOW_BYTES) {
        peer->forward_flow = false;
        ASSERT(member->forward_flow_peers > 0);
        member->forward_flow_peers--;
        /* (Those waiting for another peer publish again and wait again.) */
        connections_flow_resume(member->broker);
    }
}

/* A forward's answer (ack or nack from its primary; lost: the link died
 * before it came). The sink hears one answer per resent target, plus the
 * primary's for the targets that stand (the channel expects one answer
 * per forward: confirm_sink_expect adds the difference). */
static void forward_answered(struct forward_wait *w, bool ack, bool lost)
{
    struct forward_target *targets = wait_targets(w);
    uint32_t resent = 0;
    bool stands = false;
    for (uint32_t i = 0; i < w->targets_count; i++) {
        if (target_resent(w, &targets[i], ack, lost))
            resent++;
        else
            stands = true;
    }
    bool answer_ack = ack && !lost && !w->nack;
    if (w->nack)
        stands = true;
    if (w->sink) {
        uint32_t answers = resent + (stands ? 1 : 0);
        if (answers > 1)
            confirm_sink_expect(w->sink, w->seq, answers - 1);
        if (stands)
            confirm_sink_answer(w->sink, w->seq, answer_ack);
    }
    for (uint32_t i = 0; i < w->targets_count; i++) {
        target_done(targets[i].stub);
        queue_unref(targets[i].stub);
    }
    free(w->many);
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
    inflight_sub(f->peer, w.bytes);
    if (w.notify)
        w.notify(w.notify_ctx, w.notify_tag, ack && !lost);
    if (w.targets_count > 0)
        forward_answered(&w, ack, lost);
    else if (w.sink)
        confirm_sink_answer(w.sink, w.seq, ack && !lost);
    if (w.sink)
        confirm_sink_unref(w.sink);
    if (w.message)
        message_unref(w.message);
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

/* Our stand-ins of f's vhost whose primary is f's peer: what the peer
 * said of their flow no longer holds once the channel it said it on is
 * gone (broker/flow.h). */
static void forget_flow(struct proxy_forwarder *f)
{
    list_for_each(n, &f->peer->member->stubs) {
        struct proxy_stub *stub = CONTAINER_OF(n, struct proxy_stub, member_link);
        if (stub->primary_id == f->peer->id && stub->queue->flow.congested &&
            bytes_equal(stub->queue->vhost->name, f->vhost))
            flow_queue_hold(stub->queue, FLOW_PRIMARY, false);
    }
}

static void on_forward_closed(void *ctx, uint16_t code, struct bytes text)
{
    struct proxy_forwarder *f = ctx;
    if (code != 0)
        LOG_WARN("cluster: forwarding channel to broker %u closed: %u %.*s", f->peer->id, code,
                 (int)text.len, (const char *)text.ptr);
    f->ch = NULL;
    forwarder_fail_all(f);
    forget_flow(f);
}

/* basic.quay-flow: the primary says one of its queues we forward to is
 * congested, or drained; our stand-in of it holds our publishers to it,
 * or lets them go (broker/flow.h). Only the queue's primary is heard. */
static void on_forward_reply(void *ctx, const struct method *m)
{
    struct proxy_forwarder *f = ctx;
    if (m->id != METHOD_BASIC_QUAY_FLOW)
        return;
    struct vhost *vhost = broker_vhost(f->peer->member->broker, f->vhost);
    struct queue *queue = vhost ? vhost_queue(vhost, m->basic_quay_flow.queue) : NULL;
    if (queue == NULL || !queue_is_remote(queue) || stub_of(queue)->primary_id != f->peer->id)
        return; /* not our stand-in of its queue (any more) */
    flow_queue_hold(queue, FLOW_PRIMARY, !m->basic_quay_flow.active);
}

static const struct link_channel_ops forwarder_ops_template = {
    .confirm = on_forward_confirm,
    .closed = on_forward_closed,
    .reply = on_forward_reply,
};

static void forwarder_free(struct proxy_forwarder *f)
{
    forwarder_fail_all(f);
    if (f->ch)
        link_channel_close(f->ch);
    list_remove(&f->peer_link);
    bytes_free(&f->vhost);
    free(f->waits);
    free(f->last_targets);
    free(f);
}

static struct proxy_forwarder *forwarder_for(struct member_peer *peer, struct bytes vhost,
                                             enum forwarder_kind kind)
{
    list_for_each_safe(n, &peer->forwarders) {
        struct proxy_forwarder *f = CONTAINER_OF(n, struct proxy_forwarder, peer_link);
        if (f->kind != kind || !bytes_equal(f->vhost, vhost))
            continue;
        if (f->ch)
            return f;
        if (f->count == 0) {
            forwarder_free(f); /* closed and answered: open a new one */
            break;
        }
    }
    struct proxy_forwarder *f = xcalloc(1, sizeof *f);
    f->peer = peer;
    f->vhost = bytes_dup(vhost);
    f->kind = kind;
    f->first_seq = 1;
    /* Random, so that no other forwarder (of any broker, before or after a
     * restart) names the same stream; never 0 (no origin). */
    while (f->stream == 0) {
        int ok = RAND_bytes((unsigned char *)&f->stream, sizeof f->stream);
        ASSERT(ok == 1);
    }
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

/* The forwarder to peer for vhost, if the peer can be reached now. */
static struct proxy_forwarder *reachable(struct member_peer *peer, struct bytes vhost,
                                         enum forwarder_kind kind)
{
    /* (Also from a closed callback while the link goes down.) */
    if (peer == NULL || !peer->up || !link_is_up(peer->link))
        return NULL;
    return forwarder_for(peer, vhost, kind);
}

bool proxy_peer_send(struct member_peer *peer, struct bytes vhost, const struct method *m)
{
    struct proxy_forwarder *f = reachable(peer, vhost, FORWARDER_REPLICATION);
    if (f == NULL)
        return false;
    link_send(f->ch, m);
    return true;
}

bool proxy_peer_send_notify(struct member_peer *peer, struct bytes vhost, const struct method *m,
                            struct message *message, proxy_notify_fn notify, void *ctx,
                            uint64_t tag)
{
    struct proxy_forwarder *f = reachable(peer, vhost, FORWARDER_REPLICATION);
    if (f == NULL)
        return false;
    uint64_t link_seq = link_send_content(f->ch, m, message);
    ASSERT(link_seq == f->first_seq + f->count);
    forwarder_push(f, (struct forward_wait){.notify = notify, .notify_ctx = ctx,
                                            .notify_tag = tag,
                                            .bytes = message->body_size});
    inflight_add(peer, message->body_size);
    return true;
}

/* One basic.quay-forward of message to peer, naming stubs[0..count) (all
 * its stand-ins, each under its epoch): one answer for all of them. */
static bool send_forward(struct member_peer *peer, struct queue *const *stubs, uint32_t count,
                         struct message *message, struct confirm_sink *sink, uint64_t seq,
                         bool dead_lettered, struct forward_origin origin)
{
    ASSERT(count > 0 && count <= FORWARD_TARGETS_MAX);
    struct bytes vhost = stubs[0]->vhost->name;
    struct proxy_forwarder *f = reachable(peer, vhost, FORWARDER_PUBLISH);
    if (f == NULL)
        return false;
    uint8_t buf[FORWARD_TARGETS_MAX * (1 + 255 + 1 + 8)];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof buf);
    /* A first send is numbered here; a resend keeps its first origin. */
    bool resent = origin.stream != 0;
    if (!resent)
        origin = (struct forward_origin){f->stream, f->first_seq + f->count};
    struct forward_wait wait = {.sink = sink, .seq = seq, .message = message,
                                .targets_count = count, .dead_lettered = dead_lettered,
                                .bytes = message->body_size, .origin = origin};
    if (count > 1) {
        wait.many = xmalloc(sizeof *wait.many * count);
    }
    struct forward_target *targets = wait_targets(&wait);
    for (uint32_t i = 0; i < count; i++) {
        ASSERT(stubs[i]->vhost == stubs[0]->vhost);
        struct field_value epoch = {.kind = 'l', .i64 = (int64_t)proxy_stub_epoch(stubs[i])};
        table_put_field(&w, stubs[i]->name, &epoch);
        targets[i] = (struct forward_target){stubs[i], (uint64_t)epoch.i64};
        queue_ref(stubs[i]);
        stub_of(stubs[i])->forwards_out++;
    }
    ASSERT(!w.overflow);
    struct method m = {.id = METHOD_BASIC_QUAY_FORWARD};
    m.basic_quay_forward.exchange = message_exchange(message);
    m.basic_quay_forward.routing_key = message_routing_key(message);
    m.basic_quay_forward.dead_lettered = dead_lettered;
    m.basic_quay_forward.origin_stream = origin.stream;
    m.basic_quay_forward.origin_seq = origin.seq;
    m.basic_quay_forward.origin_resent = resent;
    if (w.len == f->last_targets_size && memcmp(buf, f->last_targets, w.len) == 0) {
        m.basic_quay_forward.same_targets = true; /* the receiving channel kept them */
    } else {
        if (w.len > f->last_targets_cap) {
            free(f->last_targets);
            f->last_targets = xmalloc(w.len);
            f->last_targets_cap = (uint32_t)w.len;
        }
        memcpy(f->last_targets, buf, w.len);
        f->last_targets_size = (uint32_t)w.len;
        m.basic_quay_forward.targets = table_writer_table(&w);
    }
    uint64_t link_seq = link_send_content(f->ch, &m, message);
    ASSERT(link_seq == f->first_seq + f->count);
    message_ref(message);
    if (sink)
        confirm_sink_ref(sink);
    forwarder_push(f, wait);
    inflight_add(peer, message->body_size);
    return true;
}

/* Sends one forward per FORWARD_TARGETS_MAX stand-ins of group (all with
 * the same primary); those that cannot be sent are held. Counts answers. */
static void send_group(struct member_peer *peer, struct queue *const *group, uint32_t count,
                       struct queue_forward *fwd)
{
    for (uint32_t i = 0; i < count; i += FORWARD_TARGETS_MAX) {
        uint32_t n = count - i < FORWARD_TARGETS_MAX ? count - i : FORWARD_TARGETS_MAX;
        if (send_forward(peer, group + i, n, fwd->message, fwd->sink, fwd->seq,
                         fwd->dead_lettered, NO_ORIGIN)) {
            fwd->answers++;
            continue;
        }
        for (uint32_t j = i; j < i + n; j++) {
            if (hold_forward(group[j], fwd->message, fwd->sink, fwd->seq, fwd->dead_lettered,
                             NO_ORIGIN))
                fwd->answers++;
            else
                fwd->unavailable++;
        }
    }
}

void forward__stubs(struct queue *const *queues, uint32_t count, struct queue_forward *fwd)
{
    ASSERT(count > 0);
    ASSERT(count <= 256);
    struct queue *group[256];
    uint32_t peers[256];
    uint32_t peers_count = 0;
    /* First what cannot go now; then one forward per primary broker. */
    for (uint32_t i = 0; i < count; i++) {
        struct proxy_stub *stub = stub_of(queues[i]);
        struct member_peer *peer = member_peer(stub->member, stub->primary_id);
        if (!stub->available) {
            fwd->unavailable++;
        } else if (stub->held_count > 0 || stub->draining || peer == NULL || !peer->up) {
            /* In order, behind the held ones, until it can be reached. */
            if (hold_forward(queues[i], fwd->message, fwd->sink, fwd->seq, fwd->dead_lettered,
                             NO_ORIGIN))
                fwd->answers++;
            else
                fwd->unavailable++;
        } else {
            bool seen = false;
            for (uint32_t p = 0; p < peers_count && !seen; p++)
                seen = peers[p] == stub->primary_id;
            if (!seen)
                peers[peers_count++] = stub->primary_id;
        }
    }
    for (uint32_t p = 0; p < peers_count; p++) {
        uint32_t n = 0;
        for (uint32_t i = 0; i < count; i++) {
            struct proxy_stub *stub = stub_of(queues[i]);
            struct member_peer *peer = member_peer(stub->member, stub->primary_id);
            if (stub->primary_id == peers[p] && stub->available && stub->held_count == 0 &&
                !stub->draining && peer != NULL && peer->up)
                group[n++] = queues[i];
        }
        ASSERT(n > 0);
        struct member_peer *peer = member_peer(stub_of(group[0])->member, peers[p]);
        send_group(peer, group, n, fwd);
        fwd->flow |= peer->forward_flow;
    }
}

/* ---- publishes waiting for a primary ---- */

static bool hold_forward(struct queue *queue, struct message *message, struct confirm_sink *sink,
                         uint64_t seq, bool dead_lettered, struct forward_origin origin)
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
        (struct held_forward){message, sink, seq, dead_lettered, origin};
    stub->held_count++;
    return true;
}

/* Sends the held publishes to the primary (send false: nack them all). */
void forward__release_held(struct queue *queue, bool send)
{
    struct proxy_stub *stub = stub_of(queue);
    if (send && stub->draining)
        return; /* behind the forwards still out (target_done) */
    while (stub->held_count > 0) {
        struct member_peer *peer = member_peer(stub->member, stub->primary_id);
        if (send && (peer == NULL || !peer->up))
            return; /* still nowhere to send them */
        struct held_forward h = stub->held[stub->held_head];
        stub->held_head = (stub->held_head + 1) & (stub->held_cap - 1);
        stub->held_count--;
        bool sent = send && send_forward(peer, &queue, 1, h.message, h.sink, h.seq,
                                         h.dead_lettered, h.origin);
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

bool forward__drain(struct queue *queue)
{
    struct proxy_stub *stub = stub_of(queue);
    stub->draining = stub->forwards_out > 0;
    return stub->draining;
}

bool proxy_stub_drain(struct queue *queue)
{
    return forward__drain(queue);
}

void proxy_stub_recall_forwards(struct queue *queue)
{
    forward__redirect(queue, stub_of(queue)->primary_id);
}

uint32_t proxy_stub_take_held(struct queue *queue, struct queue_held_publish **out)
{
    struct proxy_stub *stub = stub_of(queue);
    uint32_t n = stub->held_count;
    *out = NULL;
    if (n == 0)
        return 0;
    *out = xmalloc(sizeof **out * n);
    for (uint32_t i = 0; i < n; i++) {
        struct held_forward h = stub->held[(stub->held_head + i) & (stub->held_cap - 1)];
        (*out)[i] = (struct queue_held_publish){.message = h.message, .sink = h.sink,
                                                .seq = h.seq, .dead_lettered = h.dead_lettered,
                                                .origin_stream = h.origin.stream,
                                                .origin_seq = h.origin.seq};
    }
    stub->held_count = 0;
    stub->held_head = 0;
    return n;
}

/* Takes queue's target out of a forward that names others too: it is
 * held for the queue's new primary (one more answer for the sink), and
 * the forward's own answer goes on covering the rest. */
static void wait_drop_target(struct forward_wait *w, struct queue *queue)
{
    ASSERT(w->targets_count > 1);
    struct forward_target *targets = w->many;
    uint32_t i = 0;
    while (targets[i].stub != queue)
        i++;
    ASSERT(i < w->targets_count);
    if (hold_forward(queue, w->message, w->sink, w->seq, w->dead_lettered, w->origin)) {
        if (w->sink)
            confirm_sink_expect(w->sink, w->seq, 1);
    } else {
        w->nack = true; /* nowhere to send it: the publisher hears a nack */
    }
    target_done(queue);
    queue_unref(queue);
    targets[i] = targets[--w->targets_count];
    if (w->targets_count == 1) {
        w->one = targets[0];
        free(w->many);
        w->many = NULL;
    }
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
            if (w->done || w->targets_count == 0)
                continue;
            struct forward_target *targets = wait_targets(w);
            bool names_it = false;
            for (uint32_t t = 0; t < w->targets_count && !names_it; t++)
                names_it = targets[t].stub == queue;
            if (!names_it)
                continue;
            if (w->targets_count == 1)
                forwarder_answer(f, w, false, true); /* held, for the new primary */
            else
                wait_drop_target(w, queue);
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
