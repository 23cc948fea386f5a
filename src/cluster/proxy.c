/*
 * proxy.c: see proxy.h. Stand-ins, their uplinks (upstream consumers and
 * the getter) and their updates; forwarding publishes is forward.c's.
 */
#include "cluster/proxy.h"

#include "cluster/proxy_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "amqp/reply_code_gen.h"
#include "amqp/table.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/durable.h"
#include "broker/flow.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/fence.h"
#include "cluster/handover.h"
#include "cluster/link.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/replica.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/ring.h"
#include "lib/bytes.h"
#include "lib/log.h"

#define TAG_BITS 40
#define TAG_MASK ((UINT64_C(1) << TAG_BITS) - 1)
#define UPLINK_ID_MAX ((UINT32_C(1) << (62 - TAG_BITS)) - 1)

/* A message received from upstream that the local consumer could not take
 * yet. */
struct held {
    struct queue_entry entry;
};

struct uplink {
    struct list_node stub_link;
    struct proxy_stub *stub;      /* borrowed: the owner */
    uint32_t id;
    uint32_t peer_id;             /* the broker ch goes to: the primary when opened,
                                   * the old one for an uplink a handover retired */
    struct link_channel *ch;      /* NULL once the upstream channel is gone */
    struct consumer *consumer;    /* the local consumer; NULL for the getter or once gone */
    struct held *held;            /* owned ring */
    uint32_t held_head, held_count, held_cap;
    uint64_t outstanding;         /* upstream deliveries not yet settled upstream */
    struct list_node ops;         /* the getter's struct queue_remote_op, in request order */
    /* Upstream deliveries to give back (basic.nack requeue), sent together
     * once the local batch of settles is done (the stand-in's dispatch, or
     * the end of the loop iteration): as one basic.nack(multiple) when they
     * are all the uplink holds, which the primary requeues at once, each at
     * its place, before it dispatches again; else one by one in upstream tag
     * order (the primary redelivers each as it comes: a batch released
     * newest first, as a channel requeues, would come back reversed).
     * Counted in outstanding until sent. */
    uint64_t *releasing;          /* owned */
    uint32_t releasing_count, releasing_cap;
    struct list_node release_link; /* in member->releasing while releasing_count > 0 */
    uint32_t credit;              /* the prefetch its upstream consumer has */
    bool busy;                    /* inside a callback that uses it: not freed */
    bool attaching;               /* its local consumer waits for consume-ok */
};

/* A request to the primary answered on the getter uplink, in order. */
enum proxy_op_kind { PROXY_OP_GET, PROXY_OP_QUERY };

struct queue_remote_op {
    struct list_node link;        /* in uplink->ops, or the stub's waiting_ops */
    enum proxy_op_kind kind;
    uint32_t method_id;           /* PROXY_OP_QUERY: queue.declare or queue.purge */
    queue_remote_get_fn get_done;        /* NULL once cancelled (with query_done) */
    queue_remote_query_fn query_done;
    void *ctx;
    uint64_t deadline_ms;         /* waiting for the primary's link: until then */
    bool cancelled;
};

/* How long a request waits for its primary's link to come up (after a
 * restart, links reconnect after the brokers caught up; after a primary's
 * death, until the map names its successor): then it is answered as
 * unreachable. */
#define PROXY_OP_WAIT_MS 5000

/* A getter (the uplink of a stand-in's basic.get and passive declares) is
 * kept for the next request, as a client polls: one that has not been
 * used for this long closes, so a proxy whose clients once asked about
 * every queue does not hold a channel per queue at each primary for ever
 * (a link has 65,535). */
#define PROXY_GETTER_IDLE_MS 5000


/* ---- uplinks ---- */

static struct uplink *uplink_find(struct proxy_stub *stub, uint32_t id)
{
    list_for_each(n, &stub->uplinks) {
        struct uplink *u = CONTAINER_OF(n, struct uplink, stub_link);
        if (u->id == id)
            return u;
    }
    return NULL;
}

static struct uplink *uplink_of_consumer(struct proxy_stub *stub, struct consumer *consumer)
{
    list_for_each(n, &stub->uplinks) {
        struct uplink *u = CONTAINER_OF(n, struct uplink, stub_link);
        if (u->consumer == consumer && u->ch)
            return u;
    }
    return NULL;
}

static void send_settle(struct uplink *u, uint32_t method_id, uint64_t tag, bool requeue)
{
    if (u->ch == NULL)
        return; /* the upstream channel is gone: the primary requeued it already */
    struct method m = {.id = method_id};
    if (method_id == METHOD_BASIC_ACK) {
        m.basic_ack.delivery_tag = tag;
    } else if (method_id == METHOD_BASIC_REJECT) {
        m.basic_reject.delivery_tag = tag;
        m.basic_reject.requeue = requeue;
    } else {
        m.basic_nack.delivery_tag = tag;
        m.basic_nack.requeue = requeue;
    }
    link_send(u->ch, &m);
}

/* The upstream channel is gone (the primary requeued everything it
 * held): nothing is left to give back. */
static void uplink_forget_releases(struct uplink *u)
{
    u->releasing_count = 0;
    if (list_linked(&u->release_link))
        list_remove(&u->release_link);
}

static void uplink_free(struct uplink *u)
{
    ASSERT(u->held_count == 0);
    ASSERT(u->releasing_count == 0 || u->ch == NULL);
    uplink_forget_releases(u);
    if (u->stub->getter == u)
        u->stub->getter = NULL;
    if (u->ch)
        link_channel_close(u->ch);
    list_remove(&u->stub_link);
    free(u->held);
    free(u->releasing);
    free(u);
}

/* Frees the uplink once nothing refers to it: no local consumer, no
 * pending get, and every upstream delivery settled (given back too). */
static void uplink_maybe_free(struct uplink *u)
{
    if (u->busy || u->stub->getter == u)
        return; /* the getter is kept for the next basic.get */
    if (u->consumer == NULL && list_empty(&u->ops) && u->outstanding == 0 &&
        u->held_count == 0)
        uplink_free(u);
}

/* Gives upstream delivery tag back to the primary (requeue) with the
 * uplink's other releases of this batch (uplink_send_releases). */
static void release_later(struct uplink *u, uint64_t tag)
{
    if (u->ch == NULL)
        return; /* the upstream channel is gone: the primary requeued it already */
    if (u->releasing_count == u->releasing_cap) {
        u->releasing_cap = u->releasing_cap ? u->releasing_cap * 2 : 16;
        u->releasing = xrealloc(u->releasing, sizeof *u->releasing * u->releasing_cap);
    }
    u->releasing[u->releasing_count++] = tag;
    u->outstanding++; /* until sent: the uplink must outlive it */
    struct member *member = u->stub->member;
    if (!list_linked(&u->release_link)) {
        list_push_back(&member->releasing, &u->release_link);
        net_flush_hook_arm(&member->broker->net, &member->release_hook);
    }
}

static int tag_order(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sends the batch's releases. May free u. */
static void uplink_send_releases(struct uplink *u)
{
    if (u->releasing_count == 0)
        return;
    list_remove(&u->release_link);
    qsort(u->releasing, u->releasing_count, sizeof *u->releasing, tag_order);
    ASSERT(u->outstanding >= u->releasing_count);
    if (u->releasing_count == u->outstanding && u->releasing_count > 1 && u->ch) {
        /* Everything the primary delivered here and not yet settled. */
        struct method m = {.id = METHOD_BASIC_NACK};
        m.basic_nack.delivery_tag = u->releasing[u->releasing_count - 1];
        m.basic_nack.multiple = true;
        m.basic_nack.requeue = true;
        link_send(u->ch, &m);
    } else {
        for (uint32_t i = 0; i < u->releasing_count; i++)
            send_settle(u, METHOD_BASIC_NACK, u->releasing[i], true);
    }
    u->outstanding -= u->releasing_count;
    u->releasing_count = 0;
    uplink_maybe_free(u);
}

void proxy_send_releases(struct net_flush_hook *hook)
{
    struct member *member = CONTAINER_OF(hook, struct member, release_hook);
    while (!list_empty(&member->releasing)) {
        struct uplink *u = CONTAINER_OF(member->releasing.next, struct uplink, release_link);
        uplink_send_releases(u);
    }
}

/* Gives back what waits in the uplink (requeued at the primary). */
static void uplink_release_held(struct uplink *u)
{
    while (u->held_count > 0) {
        struct queue_entry e = u->held[u->held_head].entry;
        u->held_head = (u->held_head + 1) & (u->held_cap - 1);
        u->held_count--;
        ASSERT(u->outstanding > 0);
        u->outstanding--;
        release_later(u, e.seq & TAG_MASK);
        message_unref(e.message);
    }
}

static void hold(struct uplink *u, struct queue_entry e)
{
    if (u->held_count == u->held_cap)
        u->held = ring_grow(u->held, sizeof *u->held, &u->held_head, u->held_count,
                  &u->held_cap, 16);
    u->held[(u->held_head + u->held_count) & (u->held_cap - 1)].entry = e;
    u->held_count++;
}

static void give(struct uplink *u, struct queue_entry e)
{
    struct queue *queue = u->stub->queue;
    queue_rates_moved(queue);
    queue->unacked_count++; /* settled through queue_settle & co. like any delivery */
    u->consumer->ops->deliver(u->consumer, e);
}

static void uplink_drain(struct uplink *u)
{
    while (u->held_count > 0 && u->consumer && u->consumer->ops->can_take(u->consumer)) {
        struct queue_entry e = u->held[u->held_head].entry;
        u->held_head = (u->held_head + 1) & (u->held_cap - 1);
        u->held_count--;
        give(u, e);
    }
}

static void on_uplink_deliver(void *ctx, struct bytes consumer_tag, uint64_t tag,
                              bool redelivered, struct message *message)
{
    struct uplink *u = ctx;
    (void)consumer_tag;
    ASSERT(tag <= TAG_MASK);
    u->outstanding++;
    struct queue_entry e = {.message = message, .seq = (uint64_t)u->id << TAG_BITS | tag,
                            .redelivered = redelivered};
    if (u->consumer == NULL || u->stub->queue->deleted) {
        send_settle(u, METHOD_BASIC_NACK, tag, true);
        u->outstanding--;
        message_unref(message);
        return;
    }
    if (u->held_count == 0 && u->consumer->ops->can_take(u->consumer))
        give(u, e);
    else
        hold(u, e);
}

/* The local consumer is told its queue went away (queue-deleted cancel). */
static void cancel_local(struct uplink *u)
{
    struct consumer *consumer = u->consumer;
    if (consumer == NULL)
        return;
    uplink_release_held(u);
    u->consumer = NULL; /* queue_consumer_remove must not cancel upstream again */
    struct queue *queue = u->stub->queue;
    queue_ref(queue);
    /* The client's channel requeues what it held, which settles through u:
     * u must outlive that (the caller frees it if it can). */
    bool busy = u->busy;
    u->busy = true;
    queue_consumer_remove(queue, consumer);
    consumer->ops->cancelled(consumer);
    u->busy = busy;
    queue_unref(queue);
}

static void on_uplink_cancelled(void *ctx, struct bytes consumer_tag)
{
    struct uplink *u = ctx;
    (void)consumer_tag;
    cancel_local(u);
    uplink_maybe_free(u);
}

static void on_get_reply(void *ctx, uint64_t tag, bool redelivered, uint32_t message_count,
                         struct message *message);
static void fail_ops(struct uplink *u, uint16_t code, struct bytes text);
static void fail_first_op(struct uplink *u, uint16_t code, struct bytes text);
static void ask_again(struct uplink *u);
static void uplink_closed(struct uplink *u, uint16_t code, struct bytes text);
static void on_query_reply(void *ctx, const struct method *m);

static void on_uplink_closed(void *ctx, uint16_t code, struct bytes text)
{
    struct uplink *u = ctx;
    /* The askers' answers may drop the last references on a stand-in
     * deleted meanwhile: ours keeps it, and so u, alive until we are done. */
    struct queue *queue = u->stub->queue;
    queue_ref(queue);
    uplink_closed(u, code, text);
    queue_unref(queue);
}

static void uplink_closed(struct uplink *u, uint16_t code, struct bytes text)
{
    u->ch = NULL;
    if (u->stub->getter == u)
        u->stub->getter = NULL; /* the next basic.get opens another */
    /* The primary requeued everything this channel held. */
    while (u->held_count > 0) {
        message_unref(u->held[u->held_head].entry.message);
        u->held_head = (u->held_head + 1) & (u->held_cap - 1);
        u->held_count--;
    }
    u->outstanding = 0;
    uplink_forget_releases(u);
    u->busy = true;
    if (code != 0)
        fail_first_op(u, code, text); /* the request the primary refused */
    ask_again(u); /* the others: a lost link is not their answer */
    u->busy = false;
    if (u->attaching && u->consumer) {
        /* The primary refused the consume (exclusive use, ...): the local
         * channel answers its basic.consume with the same error. A lost
         * link (0) is not a refusal: consume-ok, and re-attach later. */
        struct consumer *consumer = u->consumer;
        u->attaching = false;
        if (code != 0)
            u->consumer = NULL; /* the channel's failure removes it */
        if (consumer->ops->attached)
            consumer->ops->attached(consumer, code ? code : 200, text);
        uplink_maybe_free(u);
        return;
    }
    if (code != 0) {
        /* Refused (exclusive use, no such queue, ...): the local consumer
         * cannot go on. A lost link (0) is re-attached when it returns. */
        LOG_INFO("cluster: upstream consumer of '%.*s' closed by its primary: %u %.*s",
                 (int)u->stub->queue->name.len, (const char *)u->stub->queue->name.ptr, code,
                 (int)text.len, (const char *)text.ptr);
        cancel_local(u);
    }
    uplink_maybe_free(u);
}

static const struct link_channel_ops uplink_ops_template = {
    .deliver = on_uplink_deliver,
    .cancelled = on_uplink_cancelled,
    .closed = on_uplink_closed,
    .get_reply = on_get_reply,
    .reply = on_query_reply,
};

static struct uplink *uplink_open(struct proxy_stub *stub)
{
    struct member_peer *peer = member_peer(stub->member, stub->primary_id);
    if (peer == NULL || !peer->up || !stub->available || stub->queue->deleted)
        return NULL;
    struct uplink *u = xcalloc(1, sizeof *u);
    u->stub = stub;
    list_init(&u->ops);
    u->id = ++stub->next_uplink_id;
    ASSERT(u->id <= UPLINK_ID_MAX);
    u->peer_id = stub->primary_id;
    list_init(&u->release_link);
    struct link_channel_ops ops = uplink_ops_template;
    ops.ctx = u;
    u->ch = link_channel_open(peer->link, stub->queue->vhost->name, false, &ops);
    if (u->ch == NULL) {
        free(u);
        return NULL;
    }
    list_init(&u->ops);
    list_push_back(&stub->uplinks, &u->stub_link);
    return u;
}

/* The upstream consumer's prefetch: the local consumer's credit (its
 * prefetch, or its channel's if smaller), PROXY_CREDIT_UNLIMITED if none. */
static uint32_t upstream_credit(const struct consumer *consumer)
{
    uint32_t credit = channel_consumer_credit(consumer);
    return credit == 0 || credit > UINT16_MAX ? PROXY_CREDIT_UNLIMITED : credit;
}

/* Channel-wide (global) on the uplink's channel, which has this one
 * consumer: unlike a per-consumer prefetch, it applies to the consumer
 * already there when it changes. */
static void send_credit(struct uplink *u)
{
    u->credit = upstream_credit(u->consumer);
    struct method qos = {.id = METHOD_BASIC_QOS};
    qos.basic_qos.prefetch_count = (uint16_t)u->credit;
    qos.basic_qos.global = true;
    link_send(u->ch, &qos);
}

/* Our next requests on u name the stand-in's queue as our map has it: a
 * primary whose map lags behind that (the queue was just declared, or
 * moved to it) applies that far before it looks at them, as basic.quay-sync
 * holds the link's input there. Sent once per map version and link. */
static void sync_primary(struct uplink *u)
{
    struct proxy_stub *stub = u->stub;
    struct member_peer *peer = member_peer(stub->member, stub->primary_id);
    if (peer == NULL || u->ch == NULL || stub->map_version <= peer->synced_version)
        return;
    struct method m = {.id = METHOD_BASIC_QUAY_SYNC};
    m.basic_quay_sync.version = stub->map_version;
    link_send(u->ch, &m);
    peer->synced_version = stub->map_version;
}

/* Starts the upstream consumer of a local consumer. waits: the local
 * channel waits for the primary's answer (consumer->ops->attached). */
static void attach(struct proxy_stub *stub, struct consumer *consumer, bool waits)
{
    struct uplink *u = uplink_open(stub);
    struct member_peer *peer = member_peer(stub->member, stub->primary_id);
    if (u == NULL && stub->available && peer != NULL && peer->up && link_is_up(peer->link)) {
        /* The link is up but has no channel left (65,535 consumers and
         * getters of this broker's clients at that primary): refused, as
         * a broker out of a resource refuses, rather than waiting for a
         * channel nobody promised. */
        LOG_WARN("cluster: no channel left on the link to broker %u for a consumer of '%.*s'",
                 stub->primary_id, (int)stub->queue->name.len,
                 (const char *)stub->queue->name.ptr);
        if (waits) {
            consumer->ops->attached(consumer, REPLY_RESOURCE_ERROR,
                                    BYTES_LIT("RESOURCE_ERROR - no channel left on the link to "
                                              "the queue's primary"));
        } else {
            queue_consumer_remove(stub->queue, consumer);
            consumer->ops->cancelled(consumer);
        }
        return;
    }
    if (u == NULL)
        return; /* attached when the primary's link comes up */
    sync_primary(u);
    u->consumer = consumer;
    u->attaching = waits;
    send_credit(u);
    uint8_t args[64];
    struct table_writer w;
    table_writer_init(&w, args, sizeof args);
    if (consumer->priority != 0)
        table_put_int(&w, "x-priority", consumer->priority);
    char tag[32];
    snprintf(tag, sizeof tag, "quay-proxy-%u", u->id);
    struct method m = {.id = METHOD_BASIC_CONSUME};
    m.basic_consume.queue = stub->queue->name;
    m.basic_consume.consumer_tag = bytes_of_cstr(tag);
    m.basic_consume.exclusive = consumer->exclusive;
    m.basic_consume.arguments = table_writer_table(&w);
    link_send(u->ch, &m);
}

static bool parked(const struct proxy_stub *stub, const struct consumer *consumer)
{
    for (uint32_t i = 0; i < stub->parked_count; i++) {
        if (stub->parked[i] == consumer)
            return true;
    }
    return false;
}

static void unpark(struct proxy_stub *stub, const struct consumer *consumer)
{
    for (uint32_t i = 0; i < stub->parked_count; i++) {
        if (stub->parked[i] == consumer) {
            stub->parked[i] = stub->parked[--stub->parked_count];
            return;
        }
    }
}

static void stub_consumer_added(struct queue *queue, struct consumer *consumer)
{
    bool available;
    struct proxy_stub *stub = stub_of(queue);
    if (stub->adopting && channel_consumer_of_peer(consumer)) {
        if (stub->parked_count == stub->parked_cap) {
            stub->parked_cap = stub->parked_cap ? stub->parked_cap * 2 : 4;
            stub->parked = xrealloc(stub->parked, sizeof *stub->parked * stub->parked_cap);
        }
        stub->parked[stub->parked_count++] = consumer;
        return;
    }
    attach(stub, consumer, !stub->adopting && proxy_consume_waits(queue, &available));
}

/* The relay's seqs as the stand-in's: the relay uplink's id and the tag
 * the new primary gave each (its index in the notice, from 1). */
struct relay_seqs {
    const uint64_t *seqs;
    uint32_t count;
    uint32_t uplink_id;
};

static bool relay_tag(const struct relay_seqs *r, uint64_t seq, uint64_t *tag)
{
    uint32_t lo = 0, hi = r->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (r->seqs[mid] < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == r->count || r->seqs[lo] != seq)
        return false;
    *tag = (uint64_t)lo + 1;
    return true;
}

static uint64_t relay_seq(void *ctx, uint64_t seq)
{
    const struct relay_seqs *r = ctx;
    uint64_t tag;
    return relay_tag(r, seq, &tag) ? (uint64_t)r->uplink_id << TAG_BITS | tag : 0;
}

void proxy_stub_relay(struct queue *queue, struct queue *old, struct handover_relay *relay,
                      struct queue_held_settle *settles, uint32_t settles_count)
{
    struct proxy_stub *stub = stub_of(queue);
    struct uplink *u = xcalloc(1, sizeof *u);
    u->stub = stub;
    u->id = ++stub->next_uplink_id;
    list_init(&u->ops);
    list_init(&u->release_link);
    u->ch = relay->channel;
    struct link_channel_ops ops = uplink_ops_template;
    ops.ctx = u;
    link_channel_set_ops(u->ch, &ops);
    list_push_back(&stub->uplinks, &u->stub_link);
    /* The new primary may not have applied the handover yet: it reads
     * what follows once it has (its deliveries are made then). */
    struct method sync = {.id = METHOD_BASIC_QUAY_SYNC};
    sync.basic_quay_sync.version = member_map(stub->member)->version;
    link_send(u->ch, &sync);
    struct relay_seqs r = {relay->delivered, relay->delivered_count, u->id};
    u->outstanding = channels_move_unacked(stub->member->broker, old, queue, relay_seq, &r);
    for (uint32_t i = 0; i < settles_count; i++) {
        uint64_t tag;
        if (relay_tag(&r, settles[i].entry.seq, &tag)) {
            enum queue_settle_kind kind = settles[i].kind;
            send_settle(u, kind == QUEUE_SETTLE_ACK      ? METHOD_BASIC_ACK
                           : kind == QUEUE_SETTLE_REJECT ? METHOD_BASIC_REJECT
                                                         : METHOD_BASIC_NACK,
                        tag, kind == QUEUE_SETTLE_REQUEUE);
        }
        message_unref(settles[i].entry.message);
    }
    free(settles);
    free(relay->delivered);
    relay->delivered = NULL;
    uplink_maybe_free(u); /* nothing left to settle: the channel closes */
}

void proxy_stub_adopt_consumers(struct queue *queue, struct consumer **consumers, uint32_t count)
{
    struct proxy_stub *stub = stub_of(queue);
    stub->adopting = true;
    for (uint32_t i = 0; i < count; i++)
        queue_consumer_add(queue, consumers[i]);
    stub->adopting = false;
}

bool proxy_consume_waits(struct queue *queue, bool *available)
{
    struct proxy_stub *stub = stub_of(queue);
    struct member_peer *peer = member_peer(stub->member, stub->primary_id);
    *available = stub->available;
    return stub->available && peer != NULL && peer->up;
}

static void stub_consumer_credit(struct queue *queue, struct consumer *consumer)
{
    struct uplink *u = uplink_of_consumer(stub_of(queue), consumer);
    if (u != NULL && u->credit != upstream_credit(consumer))
        send_credit(u); /* basic.qos applies to the consumer at once, upstream too */
}

static void stub_consumer_removed(struct queue *queue, struct consumer *consumer)
{
    struct proxy_stub *stub = stub_of(queue);
    unpark(stub, consumer);
    list_for_each_safe(n, &stub->uplinks) {
        struct uplink *u = CONTAINER_OF(n, struct uplink, stub_link);
        if (u->consumer != consumer)
            continue;
        uplink_release_held(u); /* sent with the channel's requeues, if it closes */
        u->consumer = NULL;
        if (u->ch) {
            char tag[32];
            snprintf(tag, sizeof tag, "quay-proxy-%u", u->id);
            struct method m = {.id = METHOD_BASIC_CANCEL};
            m.basic_cancel.consumer_tag = bytes_of_cstr(tag);
            m.basic_cancel.no_wait = true;
            link_send(u->ch, &m);
        }
        uplink_maybe_free(u);
    }
}

static void settle_upstream(struct queue *queue, uint64_t seq, uint32_t method_id, bool requeue)
{
    struct uplink *u = uplink_find(stub_of(queue), (uint32_t)(seq >> TAG_BITS));
    if (u == NULL)
        return; /* its channel went away; the primary requeued the message */
    if (u->outstanding > 0)
        u->outstanding--;
    if (requeue)
        release_later(u, seq & TAG_MASK);
    else
        send_settle(u, method_id, seq & TAG_MASK, false);
    uplink_maybe_free(u);
}

static void stub_ack(struct queue *queue, uint64_t seq)
{
    settle_upstream(queue, seq, METHOD_BASIC_ACK, false);
}

static void stub_reject(struct queue *queue, uint64_t seq)
{
    settle_upstream(queue, seq, METHOD_BASIC_REJECT, false);
}

static void stub_release(struct queue *queue, uint64_t seq)
{
    settle_upstream(queue, seq, METHOD_BASIC_NACK, true);
}

/* The end of a batch of settles (and any time local consumers may take
 * more): what was given back goes upstream, in order, then what waits in
 * the uplinks goes to the local consumers. */
static void stub_dispatch(struct queue *queue)
{
    struct proxy_stub *stub = stub_of(queue);
    list_for_each_safe(n, &stub->uplinks) {
        uplink_send_releases(CONTAINER_OF(n, struct uplink, stub_link));
    }
    list_for_each_safe(n, &stub->uplinks) {
        uplink_drain(CONTAINER_OF(n, struct uplink, stub_link));
    }
}

/* Our copy goes, with its log and the log's definition (which a restart
 * would recover it by: durable_replica_log_open). */
static void drop_replica(struct proxy_stub *stub)
{
    if (stub->replica == NULL)
        return;
    struct queue *queue = stub->queue;
    if (replica_logged(stub->replica))
        durable_replica_log_deleted(queue->vhost->broker, queue);
    replica_free(stub->replica); /* (in slices: broker/reclaim.h) */
    stub->replica = NULL;
}

static void stub_free(struct queue *queue)
{
    struct proxy_stub *stub = stub_of(queue);
    while (!list_empty(&stub->uplinks)) {
        struct uplink *u = CONTAINER_OF(stub->uplinks.next, struct uplink, stub_link);
        uplink_release_held(u);
        uplink_forget_releases(u); /* its channel closes: the primary requeues them */
        while (!list_empty(&u->ops)) { /* askers hold a reference: only cancelled ones */
            struct queue_remote_op *op =
                CONTAINER_OF(list_first(&u->ops), struct queue_remote_op, link);
            ASSERT(op->cancelled);
            list_remove(&op->link);
            free(op);
        }
        u->consumer = NULL;
        uplink_free(u);
    }
    while (!list_empty(&stub->waiting_ops)) { /* askers hold a reference: cancelled ones */
        struct queue_remote_op *op =
            CONTAINER_OF(list_first(&stub->waiting_ops), struct queue_remote_op, link);
        ASSERT(op->cancelled);
        list_remove(&op->link);
        free(op);
    }
    forward__release_held(queue, false);
    free(stub->held);
    free(stub->parked);
    list_remove(&stub->member_link);
    ASSERT(stub->member->stubs_count > 0);
    stub->member->stubs_count--;
    drop_replica(stub);
    free(stub);
    queue->remote = NULL;
}

static void stub_journal_closing(struct queue *queue)
{
    replica_forget_log(stub_of(queue)->replica);
}

static const struct queue_remote_ops stub_ops = {
    .forward = forward__stubs,
    .consumer_added = stub_consumer_added,
    .consumer_removed = stub_consumer_removed,
    .consumer_credit = stub_consumer_credit,
    .ack = stub_ack,
    .reject = stub_reject,
    .release = stub_release,
    .dispatch = stub_dispatch,
    .free = stub_free,
    .journal_closing = stub_journal_closing,
    .consume_waits = proxy_consume_waits,
    .get = proxy_get,
    .query = proxy_query,
    .op_cancel = proxy_op_cancel,
    .epoch = proxy_stub_epoch,
};

/* ---- basic.get, passive declare, purge ---- */

static struct queue_remote_op *pop_op(struct uplink *u, enum proxy_op_kind kind)
{
    struct list_node *first = list_first(&u->ops);
    if (first == NULL)
        return NULL;
    struct queue_remote_op *op = CONTAINER_OF(first, struct queue_remote_op, link);
    if (op->kind != kind)
        return NULL; /* an answer out of order: the peer is confused */
    list_remove(&op->link);
    return op;
}

static void on_get_reply(void *ctx, uint64_t tag, bool redelivered, uint32_t message_count,
                         struct message *message)
{
    struct uplink *u = ctx;
    struct queue_remote_op *op = pop_op(u, PROXY_OP_GET);
    if (op == NULL || op->cancelled) {
        if (message) { /* nobody waits for it (any more) */
            send_settle(u, METHOD_BASIC_NACK, tag, true);
            message_unref(message);
        }
        free(op);
        return;
    }
    struct queue *queue = u->stub->queue;
    if (message) {
        u->outstanding++;
        queue_rates_moved(queue);
        queue->unacked_count++;
    }
    struct queue_entry e = {.message = message, .seq = (uint64_t)u->id << TAG_BITS | tag,
                            .redelivered = redelivered};
    /* done may settle the message at once (no-ack), and drop the asker's
     * reference on a stand-in deleted meanwhile: ours keeps u alive. */
    queue_ref(queue);
    u->busy = true;
    op->get_done(op->ctx, queue, 200, BYTES_LIT(""), message ? &e : NULL, message_count);
    u->busy = false;
    free(op);
    uplink_maybe_free(u);
    queue_unref(queue);
}

static void on_query_reply(void *ctx, const struct method *m)
{
    struct uplink *u = ctx;
    if (m->id == METHOD_BASIC_CONSUME_OK && u->attaching) {
        u->attaching = false;
        if (u->consumer && u->consumer->ops->attached)
            u->consumer->ops->attached(u->consumer, 200, BYTES_LIT(""));
        return;
    }
    struct queue_remote_counts counts = {0};
    if (m->id == METHOD_QUEUE_DECLARE_OK) {
        counts.messages = m->queue_declare_ok.message_count;
        counts.consumers = m->queue_declare_ok.consumer_count;
    } else if (m->id == METHOD_QUEUE_PURGE_OK) {
        counts.messages = m->queue_purge_ok.message_count;
    } else if (m->id == METHOD_QUEUE_QUAY_COUNTS_OK) {
        const struct method_queue_quay_counts_ok *ok = &m->queue_quay_counts_ok;
        counts = (struct queue_remote_counts){ok->messages_ready, ok->consumers,
                                              ok->messages_unacknowledged, ok->primary,
                                              ok->down};
    } else {
        return; /* basic.qos-ok and the like */
    }
    struct queue_remote_op *op = pop_op(u, PROXY_OP_QUERY);
    if (op == NULL)
        return;
    if (!op->cancelled)
        op->query_done(op->ctx, u->stub->queue, 200, BYTES_LIT(""), &counts);
    free(op);
}

static void answer_op(struct queue *queue, struct queue_remote_op *op, uint16_t code,
                      struct bytes text)
{
    if (op->cancelled)
        return;
    if (op->kind == PROXY_OP_GET)
        op->get_done(op->ctx, queue, code, text, NULL, 0);
    else
        op->query_done(op->ctx, queue, code, text, &(struct queue_remote_counts){0});
}

/* Every request on u not answered yet gets code (0: unreachable). */
static void fail_ops(struct uplink *u, uint16_t code, struct bytes text)
{
    while (!list_empty(&u->ops)) {
        struct queue_remote_op *op =
            CONTAINER_OF(list_first(&u->ops), struct queue_remote_op, link);
        list_remove(&op->link);
        answer_op(u->stub->queue, op, code, text);
        free(op);
    }
}

/* The getter's channel was closed by its primary: the first request not
 * answered caused it (code, text). */
static void fail_first_op(struct uplink *u, uint16_t code, struct bytes text)
{
    struct list_node *first = list_first(&u->ops);
    if (first == NULL)
        return;
    struct queue_remote_op *op = CONTAINER_OF(first, struct queue_remote_op, link);
    list_remove(&op->link);
    answer_op(u->stub->queue, op, code, text);
    free(op);
}

/* u's channel is gone with requests on it not answered: the link to the
 * primary fell, a failover closed it, or the primary refused another
 * request on it. On one broker they would have had their answers, so they
 * are not answered "unreachable" now: they go back to the stand-in's
 * waiting requests, ahead of those (asked before them), and are asked
 * again where the map names the primary once it can be reached
 * (resume_waiting_ops: at once, on the next tick, when the link comes up,
 * or when the map moves the queue), PROXY_OP_WAIT_MS at most. Asked twice
 * is safe: a get the first primary served is unacked on a channel gone
 * (the new primary redelivers it), a passive declare or counts only
 * reads, and a purge repeated removes nothing the first one left. */
static void ask_again(struct uplink *u)
{
    struct proxy_stub *stub = u->stub;
    uint64_t deadline = uv_now(stub->member->broker->loop) + PROXY_OP_WAIT_MS;
    struct list_node *at = &stub->waiting_ops;
    while (!list_empty(&u->ops)) {
        struct queue_remote_op *op =
            CONTAINER_OF(list_first(&u->ops), struct queue_remote_op, link);
        list_remove(&op->link);
        if (op->cancelled) {
            free(op);
            continue;
        }
        op->deadline_ms = deadline;
        list_insert_after(at, &op->link);
        at = &op->link;
    }
}

static void send_op(struct uplink *u, struct queue_remote_op *op)
{
    struct queue *queue = u->stub->queue;
    list_push_back(&u->ops, &op->link);
    sync_primary(u);
    struct method m = {.id = op->kind == PROXY_OP_GET ? METHOD_BASIC_GET : op->method_id};
    if (op->kind == PROXY_OP_GET) {
        m.basic_get.queue = queue->name;
    } else if (op->method_id == METHOD_QUEUE_DECLARE) {
        m.queue_declare.queue = queue->name;
        m.queue_declare.passive = true;
    } else if (op->method_id == METHOD_QUEUE_QUAY_COUNTS) {
        m.queue_quay_counts.queue = queue->name;
    } else {
        m.queue_purge.queue = queue->name;
    }
    link_send(u->ch, &m);
}

/* The primary's link is not up (it reconnects, after a restart say, or
 * the map has yet to name a dead one's successor): the request waits for
 * it, at most PROXY_OP_WAIT_MS. Not on a stand-in gone from its vhost (the
 * queue deleted, or real here now): its askers ask by name again. */
static bool may_wait(const struct proxy_stub *stub)
{
    struct member_peer *peer = member_peer(stub->member, stub->primary_id);
    return stub->available && !stub->queue->deleted && peer != NULL && !peer->up;
}

static struct queue_remote_op *op_start(struct queue *queue, enum proxy_op_kind kind,
                                 uint32_t method_id, void *ctx)
{
    struct proxy_stub *stub = stub_of(queue);
    if (stub->getter == NULL || stub->getter->ch == NULL)
        stub->getter = uplink_open(stub);
    stub->getter_used_ms = uv_now(stub->member->broker->loop);
    struct uplink *u = stub->getter;
    if (u == NULL && !may_wait(stub))
        return NULL;
    struct queue_remote_op *op = xcalloc(1, sizeof *op);
    op->kind = kind;
    op->method_id = method_id;
    op->ctx = ctx;
    if (u != NULL) {
        send_op(u, op);
    } else {
        op->deadline_ms = uv_now(stub->member->broker->loop) + PROXY_OP_WAIT_MS;
        list_push_back(&stub->waiting_ops, &op->link);
    }
    return op;
}

/* The waiting requests: sent once the primary can be reached (then), or
 * answered as unreachable past their deadline, or when the queue has no
 * primary any more (all), or the stand-in is gone from its vhost (its
 * askers ask by name again: channel_wait.c). */
static void resume_waiting_ops(struct proxy_stub *stub, bool fail_all)
{
    if (list_empty(&stub->waiting_ops))
        return;
    uint64_t now = uv_now(stub->member->broker->loop);
    fail_all = fail_all || stub->queue->deleted;
    /* An answer may drop the last reference but ours on a stand-in gone
     * from its vhost: ours keeps stub alive until we are done. */
    struct queue *queue = stub->queue;
    queue_ref(queue);
    while (!list_empty(&stub->waiting_ops)) {
        if (!fail_all && (stub->getter == NULL || stub->getter->ch == NULL))
            stub->getter = uplink_open(stub);
        struct queue_remote_op *op =
            CONTAINER_OF(list_first(&stub->waiting_ops), struct queue_remote_op, link);
        if (!fail_all && stub->getter != NULL) {
            list_remove(&op->link);
            if (op->cancelled)
                free(op);
            else
                send_op(stub->getter, op);
            continue;
        }
        if (!fail_all && now < op->deadline_ms && may_wait(stub))
            break; /* in order: the first still waits, so do the others */
        list_remove(&op->link);
        answer_op(queue, op, 0, BYTES_LIT(""));
        free(op);
    }
    queue_unref(queue); /* (stub may be gone from here on) */
}

struct queue_remote_op *proxy_get(struct queue *queue, queue_remote_get_fn done, void *ctx)
{
    struct queue_remote_op *op = op_start(queue, PROXY_OP_GET, 0, ctx);
    if (op != NULL)
        op->get_done = done;
    return op;
}

struct queue_remote_op *proxy_query(struct queue *queue, uint32_t method_id,
                                    queue_remote_query_fn done, void *ctx)
{
    ASSERT(method_id == METHOD_QUEUE_DECLARE || method_id == METHOD_QUEUE_PURGE ||
           method_id == METHOD_QUEUE_QUAY_COUNTS);
    struct queue_remote_op *op = op_start(queue, PROXY_OP_QUERY, method_id, ctx);
    if (op != NULL)
        op->query_done = done;
    return op;
}

void proxy_tick_begin(struct member *member)
{
    member->stubs_tick_left = member->stubs_count;
}

bool proxy_tick_step(struct member *member, uint32_t budget)
{
    uint64_t now = uv_now(member->broker->loop);
    struct list_node *n;
    for (; budget > 0; budget--) {
        if ((n = list_walk_next(&member->stubs, &member->stubs_tick_left)) == NULL)
            break;
        struct proxy_stub *stub = CONTAINER_OF(n, struct proxy_stub, member_link);
        if (stub->getter != NULL && now - stub->getter_used_ms >= PROXY_GETTER_IDLE_MS)
            proxy_stub_release_getter(stub->queue); /* (not if a request is out) */
        resume_waiting_ops(stub, false); /* (last: it may free a deleted stub) */
    }
    return member->stubs_tick_left == 0;
}

bool proxy_stub_has_getter(const struct queue *queue)
{
    return stub_of((struct queue *)queue)->getter != NULL;
}

bool proxy_stub_reachable(const struct queue *queue)
{
    const struct proxy_stub *stub = stub_of((struct queue *)queue);
    const struct member_peer *peer = member_peer(stub->member, stub->primary_id);
    return stub->available && peer != NULL && peer->up;
}

void proxy_stub_release_getter(struct queue *queue)
{
    struct proxy_stub *stub = stub_of(queue);
    struct uplink *u = stub->getter;
    if (u == NULL || u->busy || !list_empty(&u->ops))
        return; /* in use: it is kept */
    stub->getter = NULL;
    uplink_maybe_free(u); /* now, or once its outstanding gets are settled */
}

void proxy_op_cancel(struct queue_remote_op *op)
{
    op->cancelled = true; /* freed when its answer (or the channel's end) comes */
}

/* ---- stand-ins ---- */

struct queue *proxy_stub_new(struct member *member, struct vhost *vhost,
                             const struct map_queue *mq)
{
    struct queue *queue = queue_new(vhost, mq->name, mq->durable, mq->exclusive,
                                    mq->auto_delete, mq->arguments);
    struct proxy_stub *stub = xcalloc(1, sizeof *stub);
    stub->queue = queue;
    stub->member = member;
    stub->primary_id = mq->primary_id;
    stub->epoch = mq->epoch;
    stub->map_version = member_map(member)->version;
    stub->available = mq->available;
    list_init(&stub->uplinks);
    list_init(&stub->waiting_ops);
    list_push_back(&member->stubs, &stub->member_link);
    member->stubs_count++;
    queue->remote_ops = &stub_ops;
    queue->remote = stub;
    return queue;
}

/* A durable queue's replica logs its persistent messages, as the primary
 * does (replica.h), in the log the real queue opens when we are promoted,
 * defined as a replica's so that a restart keeps it (durable.h). */
struct replica *proxy_stub_replica(struct queue *queue, bool create)
{
    struct proxy_stub *stub = stub_of(queue);
    if (stub->replica == NULL && create)
        stub->replica = replica_new(queue->args.quay_dedup_window_ms,
                                    durable_replica_log_open(queue->vhost->broker, queue),
                                    &queue->vhost->broker->reclaim);
    return stub->replica;
}

void proxy_stub_give_replica(struct queue *queue, struct replica *replica)
{
    struct proxy_stub *stub = stub_of(queue);
    ASSERT(stub->replica == NULL);
    stub->replica = replica;
}

struct replica *proxy_stub_take_replica(struct queue *queue)
{
    struct proxy_stub *stub = stub_of(queue);
    struct replica *r = stub->replica;
    stub->replica = NULL;
    return r;
}

/* Every local consumer without a live uplink gets one. */
static void reattach_all(struct proxy_stub *stub)
{
    struct queue *queue = stub->queue;
    list_for_each_safe(n, &queue->consumers) {
        struct consumer *c = CONTAINER_OF(n, struct consumer, queue_link);
        if (uplink_of_consumer(stub, c) == NULL && !parked(stub, c))
            attach(stub, c, false);
    }
}

/* Drops every uplink's channel: their messages go back to the primary.
 * The getter's requests not answered are asked again where the map now
 * names the primary (again), or answered as unreachable. */
static void detach_all(struct proxy_stub *stub, bool again)
{
    list_for_each_safe(n, &stub->uplinks) {
        struct uplink *u = CONTAINER_OF(n, struct uplink, stub_link);
        uplink_release_held(u);
        uplink_forget_releases(u);
        if (u->ch) {
            link_channel_close(u->ch);
            u->ch = NULL;
        }
        u->outstanding = 0;
        if (stub->getter == u)
            stub->getter = NULL;
        u->busy = true;
        if (again)
            ask_again(u);
        else
            fail_ops(u, 0, BYTES_LIT(""));
        u->busy = false;
        uplink_maybe_free(u);
    }
}

/* A planned handover: each upstream consumer on the old primary is
 * cancelled there, and its uplink stays while what it delivered is not
 * settled (the old primary passes the settles on); its local consumer gets
 * an uplink to the new primary (reattach_all). */
static void retire_all(struct proxy_stub *stub)
{
    stub->getter = NULL; /* the next basic.get asks the new primary */
    struct uplink *last = list_empty(&stub->uplinks)
                              ? NULL
                              : CONTAINER_OF(stub->uplinks.prev, struct uplink, stub_link);
    list_for_each_safe(n, &stub->uplinks) {
        struct uplink *u = CONTAINER_OF(n, struct uplink, stub_link);
        bool done = u == last; /* (uplinks attached below come after it) */
        struct consumer *consumer = u->consumer;
        bool waits = u->attaching;
        if (consumer != NULL && u->ch != NULL) {
            char tag[32];
            snprintf(tag, sizeof tag, "quay-proxy-%u", u->id);
            struct method m = {.id = METHOD_BASIC_CANCEL};
            m.basic_cancel.consumer_tag = bytes_of_cstr(tag);
            m.basic_cancel.no_wait = true;
            link_send(u->ch, &m);
        }
        uplink_release_held(u); /* not delivered here yet: back, through the old primary */
        u->consumer = NULL;
        u->attaching = false;
        uplink_maybe_free(u);
        if (consumer != NULL) {
            /* A consume-ok still owed comes from the new primary, or now
             * if it cannot be reached yet (attached when it can). */
            bool reachable;
            if (waits && !proxy_consume_waits(stub->queue, &reachable)) {
                waits = false;
                consumer->ops->attached(consumer, 200, BYTES_LIT(""));
            }
            attach(stub, consumer, waits);
        }
        if (done)
            break;
    }
}

void proxy_stub_update(struct queue *queue, const struct map_queue *mq, bool planned)
{
    struct proxy_stub *stub = stub_of(queue);
    struct member *member = stub->member;
    /* Not a backup of it any more (a move, a release of a surplus backup,
     * a rebalance), unless our map lags the stream that feeds the copy. */
    if (stub->replica != NULL &&
        !fence_replica_kept(mq, member->self_id, member_map(member)->version,
                            replica_stream_version(stub->replica))) {
        LOG_DEBUG("vhost=%.*s queue=%.*s: not a backup any more: our copy goes (%u messages)",
                  (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
                  (int)queue->name.len, (const char *)queue->name.ptr,
                  replica_count(stub->replica));
        drop_replica(stub);
    }
    bool moved = stub->primary_id != mq->primary_id || stub->epoch != mq->epoch;
    bool was_available = stub->available;
    if (moved || mq->available != was_available)
        stub->map_version = member_map(stub->member)->version;
    uint32_t old_primary_id = stub->primary_id;
    if (moved && queue->flow.congested)
        flow_queue_hold(queue, FLOW_PRIMARY, false); /* the old primary's word */
    stub->primary_id = mq->primary_id;
    stub->epoch = mq->epoch;
    stub->available = mq->available;
    if (!mq->available && was_available) {
        /* Its broker is down and nobody could take over: consumers are
         * told (cancel notifications), publishes are nacked. */
        forward__release_held(queue, false);
        resume_waiting_ops(stub, true);
        detach_all(stub, false);
        /* A cancel reaches the client's channel, which may settle (and
         * so free) any uplink: start over after each one. */
        for (bool again = true; again;) {
            again = false;
            list_for_each(n, &stub->uplinks) {
                struct uplink *u = CONTAINER_OF(n, struct uplink, stub_link);
                if (u->consumer == NULL)
                    continue;
                cancel_local(u);
                uplink_maybe_free(u);
                again = true;
                break;
            }
        }
        list_for_each_safe(n, &stub->uplinks) {
            uplink_maybe_free(CONTAINER_OF(n, struct uplink, stub_link));
        }
        while (!list_empty(&queue->consumers)) {
            struct consumer *c = CONTAINER_OF(queue->consumers.next, struct consumer, queue_link);
            queue_consumer_remove(queue, c);
            c->ops->cancelled(c);
        }
        return;
    }
    if (moved) {
        /* A planned handover's old primary answers every forward it got
         * (what it held it sends on) and settles what it delivered at the
         * new primary: nothing is sent again, the uplinks to it are kept
         * until what they delivered is settled. */
        if (old_primary_id != mq->primary_id && !planned)
            forward__redirect(queue, old_primary_id);
        if (old_primary_id != mq->primary_id && planned)
            forward__drain(queue); /* newer publishes wait for those answers */
        if (planned) {
            retire_all(stub);
        } else {
            detach_all(stub, true); /* (a failover: the new primary answers) */
            reattach_all(stub);
        }
    }
    forward__release_held(queue, true); /* to the primary the map now names */
    resume_waiting_ops(stub, false);
}

void proxy_peer_up(struct member_peer *peer)
{
    struct member *member = peer->member;
    list_for_each_safe(n, &member->stubs) {
        struct proxy_stub *stub = CONTAINER_OF(n, struct proxy_stub, member_link);
        if (stub->primary_id == peer->id) {
            reattach_all(stub);
            forward__release_held(stub->queue, true);
            resume_waiting_ops(stub, false);
        }
    }
}

/* The first uplink of stub whose channel to broker peer_id is still
 * open, or NULL. */
static struct uplink *open_uplink_to(struct proxy_stub *stub, uint32_t peer_id)
{
    list_for_each(n, &stub->uplinks) {
        struct uplink *u = CONTAINER_OF(n, struct uplink, stub_link);
        if (u->ch && u->peer_id == peer_id)
            return u;
    }
    return NULL;
}

void proxy_peer_down(struct member_peer *peer)
{
    forward__peer_down(peer);
    struct member *member = peer->member;
    /* Every uplink whose channel went to that broker is closed: those of
     * the stand-ins it is primary of, and those a planned handover left
     * open to it, the old primary, until their deliveries are settled
     * (its stand-in names the new primary now). An uplink to another
     * broker is not touched: its channel is open, and its link would tell
     * it later.
     * Closing an uplink answers its askers, whose callbacks may delete
     * queues and so free other stand-ins and uplinks than the one closed:
     * each stand-in concerned is held by a reference (its proxy state
     * lives as long as its queue) and its uplinks are looked up afresh
     * after every close. */
    uint32_t count = 0;
    list_for_each(n, &member->stubs) {
        count += open_uplink_to(CONTAINER_OF(n, struct proxy_stub, member_link), peer->id) !=
                 NULL;
    }
    if (count == 0)
        return;
    struct queue **queues = xmalloc(count * sizeof *queues);
    uint32_t i = 0;
    list_for_each(n, &member->stubs) {
        struct proxy_stub *stub = CONTAINER_OF(n, struct proxy_stub, member_link);
        if (open_uplink_to(stub, peer->id) != NULL) {
            queues[i++] = stub->queue;
            queue_ref(stub->queue);
        }
    }
    ASSERT(i == count);
    for (i = 0; i < count; i++) {
        /* At most as many closes as it has uplinks now: one that a callback
         * opened meanwhile (from peer_free, the link may still be up) is
         * left alone, as it was when the loop walked the list once. */
        uint32_t left = list_count(&stub_of(queues[i])->uplinks);
        struct uplink *u;
        while (left-- > 0 && queues[i]->remote != NULL &&
               (u = open_uplink_to(stub_of(queues[i]), peer->id)) != NULL) {
            /* (From peer_free the link is still there: the channel must
             * not call u back once u is gone.) */
            link_channel_close(u->ch);
            on_uplink_closed(u, 0, BYTES_LIT("")); /* u->ch is NULL after */
        }
    }
    for (i = 0; i < count; i++)
        queue_unref(queues[i]);
    free(queues);
}
