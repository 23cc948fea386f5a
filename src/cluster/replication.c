/*
 * replication.c: see replication.h.
 */
#include "cluster/replication.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "amqp/method_gen.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/dedup.h"
#include "broker/flow.h"
#include "broker/message.h"
#include "broker/origin.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/fence.h"
#include "cluster/handover.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/proxy.h"
#include "cluster/replica.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "lib/ring.h"
#include "lib/json.h"

/* How often the in-sync set we want is asked for again while the map
 * does not show it (no quorum, a lost request, a change in flight). */
#define REPLICATION_RETRY_MS 500
/* A catch-up whose backup acked nothing for this long starts over (its
 * answers were lost somewhere; nothing else would notice). */
#define REPLICATION_STALL_MS 5000
/* A catch-up keeps at most this many messages unanswered on the link, so
 * a deep queue is sent while it serves, at the pace the backup takes it,
 * not all at once on the loop (and in the link's output buffer). */
#define CATCH_UP_WINDOW 512
/* A probe's answer is told from a message's by this bit in its tag. */
#define PROBE_TAG (UINT64_C(1) << 63)

enum stream_state {
    STREAM_IDLE,        /* not in sync and not being caught up (its link is down) */
    STREAM_CATCHING_UP, /* reset sent, its backlog being sent; then the stream follows */
    STREAM_LIVE,        /* it has everything sent so far, or will in order */
    STREAM_FAILED,      /* a message did not reach it: it needs a catch-up */
};

/* One backup, as its primary streams to it. Allocated apart from struct
 * replication: each message in flight on the link counts in inflight and
 * its answer finds the stream, even after the stream was detached. */
struct replica_stream {
    struct replication *rep;  /* borrowed back; NULL once detached */
    uint32_t backup_id;
    uint32_t incarnation;     /* the backup's process, as the map said when last followed */
    enum stream_state state;
    bool gating;              /* confirms wait for its acks (in sync, or just caught up) */
    bool join_asked;          /* caught up: the map was asked to put it in sync, and has
                               * not shown it yet (kept if it fails: fence_stream_gates) */
    uint32_t inflight;        /* answers the link owes */
    uint64_t acked_seq;       /* everything up to here is on it (or not for it: below) */
    /* x-quay-replicate "transient" (see transient_only_wanted): decided when
     * its catch-up starts; a live backup that has everything switches to
     * it at once (full_until: the newest seq then; it holds the persistent
     * ones up to there, and is told when they leave); back to everything
     * only by a catch-up. Its persistent messages are not sent; one counts
     * as acked once everything sent before it is: last_sent is the highest
     * tag sent, skipped_to the highest seq not sent since. */
    bool transient_only;
    uint64_t full_until, last_sent, skipped_to;
    uint32_t catch_up_left;   /* catching up, backlog sent: answers owed up to its end */
    bool throttled;           /* its catch-up waits for the byte budget (member.h) */
    uint64_t catch_up_bytes;  /* sent by the catch-up going on */
    uint64_t progress_ms;     /* its last ack, or when it started gating */
    struct backlog *backlog;  /* owned while a catch-up has some left to send, else NULL */
    struct backlog *room;     /* owned: a deep backlog's array readied before its catch-up */
    /* A handover's probes (replication_quiesce): frames sent to it so far,
     * and how many had been sent when the last answered probe went. */
    uint64_t sent, clean_at;
    bool probe_out;
};

/* A publish whose confirm waits for the backups (or the lease). */
struct pending_confirm {
    uint64_t seq;               /* the queue's */
    struct confirm_sink *sink;  /* one reference */
    uint64_t publish_seq;       /* the publisher channel's (0: a transaction's) */
    uint64_t at_ms;
};

struct replication {
    struct member *member;    /* borrowed */
    struct queue *queue;      /* borrowed: the owner */
    struct list_node member_link; /* in member->replications */
    uint64_t epoch;
    struct replica_stream *streams[CLUSTER_BACKUPS_MAX];
    uint8_t streams_count;
    struct pending_confirm *pending; /* owned ring, in seq order */
    uint32_t head, count, cap;
    uint64_t asked_ms;        /* the map was last asked for our in-sync set */
    uint32_t asked[CLUSTER_BACKUPS_MAX]; /* ... which was this */
    uint8_t asked_count;
    uint64_t checked_ms;      /* the tick last compared the map with what we want */
    bool quiescing; /* a handover waits for the backups (replication_quiesce) */
    bool transient_wanted; /* transient_only_wanted, as of the last attach */
    /* Confirms this broker gave as primary in this epoch (split-brain checks). */
    uint64_t confirms_epoch, confirms_count, first_confirm_ms, last_confirm_ms;
};

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t loop_ms(const struct replication *rep)
{
    return uv_now(rep->member->broker->loop);
}

static void log_queue(const struct queue *queue, const char *what, uint32_t backup_id)
{
    LOG_WARN("vhost=%.*s queue=%.*s: backup %u %s", (int)queue->vhost->name.len,
             (const char *)queue->vhost->name.ptr, (int)queue->name.len,
             (const char *)queue->name.ptr, backup_id, what);
}

/* ---- confirms ---- */

static struct pending_confirm *pending_at(const struct replication *rep, uint32_t i)
{
    return &rep->pending[(rep->head + i) & (rep->cap - 1)];
}

static void pending_push(struct replication *rep, uint64_t seq, const struct publish_wait *wait)
{
    /* Confirms leave in seq order (drain): they wait in it. Not strictly:
     * a resent forward or a de-duplicated publish waits for the newest seq
     * (wait_for), which a publish before it may wait for too (the soak
     * found that with a strict assertion). */
    ASSERT(rep->count == 0 || pending_at(rep, rep->count - 1)->seq <= seq);
    if (rep->count == rep->cap)
        rep->pending = ring_grow(rep->pending, sizeof *rep->pending, &rep->head, rep->count,
                                 &rep->cap, 64);
    confirm_sink_ref(wait->sink);
    *pending_at(rep, rep->count) =
        (struct pending_confirm){seq, wait->sink, wait->seq, loop_ms(rep)};
    rep->count++;
}

static void pending_pop(struct replication *rep, bool ack)
{
    struct pending_confirm *p = pending_at(rep, 0);
    confirm_sink_answer(p->sink, p->publish_seq, ack);
    confirm_sink_unref(p->sink);
    rep->head = (rep->head + 1) & (rep->cap - 1);
    rep->count--;
}

/* Whether every backup that gates confirms has seq. */
static bool replicated_everywhere(const struct replication *rep, uint64_t seq)
{
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        const struct replica_stream *s = rep->streams[i];
        if (s->gating && s->acked_seq < seq)
            return false;
    }
    return true;
}

/* Confirms the waiting publishes the backups and the lease now allow. */
static void drain(struct replication *rep)
{
    if (rep->count == 0 || !member_lease_fresh(rep->member))
        return;
    uint64_t confirmed = 0;
    while (rep->count > 0 && replicated_everywhere(rep, pending_at(rep, 0)->seq)) {
        pending_pop(rep, true);
        confirmed++;
    }
    if (confirmed == 0)
        return;
    uint64_t now = wall_ms();
    if (rep->confirms_epoch != rep->epoch) {
        rep->confirms_epoch = rep->epoch;
        rep->confirms_count = 0;
        rep->first_confirm_ms = now;
    }
    rep->confirms_count += confirmed;
    rep->last_confirm_ms = now;
}

/* The publisher's confirm (wait) owes one more answer, given once seq is on
 * every backup that gates confirms, unless it can be given now: already
 * there, nothing waiting ahead of it, and the lease fresh. */
static void confirm_when_replicated(struct replication *rep, uint64_t seq,
                                    struct publish_wait *wait, bool replicated)
{
    if (wait == NULL || wait->sink == NULL)
        return;
    if (!replicated || rep->count > 0 || !member_lease_fresh(rep->member)) {
        pending_push(rep, seq, wait);
        wait->remote++;
    }
}

/* ---- one backup's stream ---- */

/* Asks the map for the in-sync set we want (fence_stream_wanted): the
 * backups that are live and gate confirms, and those whose join we asked
 * (an in-sync one that failed is left out: until the map drops it, the
 * confirms wait). The whole set each time, so two changes cannot undo one
 * another; asked again by the tick while the map differs. */
static void ask_in_sync(struct replication *rep)
{
    const struct map_queue *mq = cluster_map_queue(member_map(rep->member),
                                                   rep->queue->vhost->name, rep->queue->name);
    uint32_t ids[CLUSTER_BACKUPS_MAX], incarnations[CLUSTER_BACKUPS_MAX];
    uint8_t n = 0;
    bool partial = false; /* (a backup with the transient messages only) */
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        const struct replica_stream *s = rep->streams[i];
        bool in_sync = mq != NULL && map_queue_backup_in_sync(mq, s->backup_id);
        if (fence_stream_wanted(in_sync, s->join_asked, s->state == STREAM_LIVE)) {
            incarnations[n] = s->incarnation;
            ids[n++] = s->backup_id;
            partial |= s->transient_only;
        }
    }
    /* The same set while that request may still be on its way: wait. */
    uint64_t now = loop_ms(rep);
    if (n == rep->asked_count && memcmp(ids, rep->asked, n * sizeof ids[0]) == 0 &&
        now - rep->asked_ms < REPLICATION_RETRY_MS)
        return;
    if (member_set_in_sync(rep->member, rep->queue, rep->epoch, ids, incarnations, n, partial)) {
        rep->asked_ms = now;
        memcpy(rep->asked, ids, n * sizeof ids[0]);
        rep->asked_count = n;
    }
}

static void backlog_free(struct backlog *b);

/* Flow control (broker/flow.h): a live backup that owes answers for more
 * than FLOW_BACKUP_MESSAGES messages slows the queue's publishers, until
 * every one owes at most half that. */
static void backups_flow(struct replication *rep)
{
    bool over = false, under = true;
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        const struct replica_stream *s = rep->streams[i];
        if (s->state != STREAM_LIVE)
            continue;
        over |= s->inflight > FLOW_BACKUP_MESSAGES;
        under &= s->inflight <= FLOW_BACKUP_MESSAGES / 2;
    }
    if (over || under)
        flow_queue_hold(rep->queue, FLOW_BACKUPS, over);
}

static void stream_fail(struct replication *rep, struct replica_stream *s, const char *why)
{
    if (s->state == STREAM_FAILED)
        return;
    backlog_free(s->backlog); /* the next catch-up takes the queue as it is then */
    s->backlog = NULL;
    s->state = STREAM_FAILED;
    log_queue(rep->queue, why, s->backup_id);
    if (s->gating)
        ask_in_sync(rep); /* the confirms wait until the map drops it (its join first) */
    backups_flow(rep);
}

static void stream_caught_up(struct replication *rep, struct replica_stream *s)
{
    s->state = STREAM_LIVE;
    s->gating = true; /* from now on, before the map says so */
    s->join_asked = true;
    s->progress_ms = loop_ms(rep);
    LOG_DEBUG("queue %.*s: backup %u caught up: joining the in-sync set",
              (int)rep->queue->name.len, (const char *)rep->queue->name.ptr, s->backup_id);
    ask_in_sync(rep);
}

static void catch_up_answered(struct replication *rep, struct replica_stream *s);

/* A handover waits for this queue's backups: tell it when nothing is owed
 * any more (it decides with replication_quiesce). */
static void quiet_maybe(struct replication *rep)
{
    if (rep->quiescing && rep->count == 0)
        handover_quiet(rep->member, rep->queue);
}

static void on_stream_answer(void *ctx, uint64_t tag, bool ack)
{
    struct replica_stream *s = ctx;
    ASSERT(s->inflight > 0);
    s->inflight--;
    struct replication *rep = s->rep;
    if (rep == NULL) {
        if (s->inflight == 0)
            free(s);
        return;
    }
    bool probe = (tag & PROBE_TAG) != 0;
    if (probe) {
        if (s->probe_out) {
            s->probe_out = false;
            if (ack)
                s->clean_at = tag & ~PROBE_TAG; /* what it had been sent: see send_probe */
        }
        drain(rep);
        quiet_maybe(rep);
        return;
    }
    if (!ack) {
        stream_fail(rep, s, "lost or refused a message: leaving the in-sync set");
    } else if (s->state != STREAM_FAILED) {
        s->progress_ms = loop_ms(rep); /* any answer: it is working through its input */
        ASSERT(tag <= s->last_sent); /* (an answer to what we sent: the link's tag) */
        if (tag > s->acked_seq)
            s->acked_seq = tag;
        if (s->acked_seq >= s->last_sent && s->skipped_to > s->acked_seq)
            s->acked_seq = s->skipped_to; /* what it was not sent since: see skip */
        if (s->state == STREAM_CATCHING_UP)
            catch_up_answered(rep, s);
    }
    if (rep->queue->flow.reasons & FLOW_BACKUPS)
        backups_flow(rep);
    drain(rep);
    quiet_maybe(rep);
}

/* basic.quay-settle of seqs seq..seq_last (0: seq alone) of rep's queue. */
static struct method settle_method(const struct replication *rep, uint64_t seq,
                                   uint64_t seq_last)
{
    struct method m = {.id = METHOD_BASIC_QUAY_SETTLE};
    m.basic_quay_settle.queue = rep->queue->name;
    m.basic_quay_settle.epoch = rep->epoch;
    m.basic_quay_settle.seq = seq;
    m.basic_quay_settle.seq_last = seq_last;
    return m;
}

/* Sends m (and message, tagged: its ack means everything up to tag is
 * there). False: the link is down (the stream failed). */
static bool stream_send(struct replication *rep, struct replica_stream *s, const struct method *m,
                        struct message *message, uint64_t tag)
{
    struct member_peer *peer = member_peer(rep->member, s->backup_id);
    struct bytes vhost = rep->queue->vhost->name;
    bool sent = message ? proxy_peer_send_notify(peer, vhost, m, message, on_stream_answer, s, tag)
                        : proxy_peer_send(peer, vhost, m);
    if (!sent) {
        stream_fail(rep, s, "cannot be reached");
        return false;
    }
    s->sent++;
    s->inflight += message != NULL;
    if (message != NULL && (tag & PROBE_TAG) == 0 && tag > s->last_sent)
        s->last_sent = tag;
    return true;
}

static struct method replicate_method(const struct queue *queue, uint64_t epoch, uint64_t seq,
                                      const struct message *message)
{
    struct method m = {.id = METHOD_BASIC_QUAY_REPLICATE};
    m.basic_quay_replicate.queue = queue->name;
    m.basic_quay_replicate.exchange = message_exchange(message);
    m.basic_quay_replicate.routing_key = message_routing_key(message);
    m.basic_quay_replicate.epoch = epoch;
    m.basic_quay_replicate.seq = seq;
    return m;
}

/* ---- catching a backup up ----
 *
 * A backup not in sync gets the queue as it is now: a reset, the dedup
 * ids, then every message in seq order, on the stream's channel so nothing
 * falls between. What is to be sent waits in the stream's backlog (the
 * queue's messages when the catch-up began, then what is published while
 * it goes on, so the backup receives seqs in order) and leaves it
 * CATCH_UP_WINDOW unanswered messages at a time. A message removed from
 * the queue before it was sent leaves the backlog unsent; one already sent
 * is settled as usual. Paged-out messages are read back as they are sent.
 * Once the backlog is empty, an empty probe tagged with the queue's newest
 * seq follows: when that is acked, the backup has everything up to there
 * (what it lacks has left the queue). */

struct backlog_item {
    uint64_t seq;
    /* NULL: paged (read back when sent). Borrowed from the queue (taken
     * with the backlog) unless owned (published since): the queue tells
     * the backlog of every message it lets go of, through the removed and
     * paged hooks, before the memory goes. */
    struct message *message;
    bool owned;   /* message is a reference of the backlog's */
    bool removed; /* left the queue before it was sent */
};

struct backlog {
    struct backlog_item *items; /* owned */
    uint32_t next, count, cap;  /* items[next..count) are still to send */
    uint32_t touched;           /* room readied: items[0..touched) written once */
};

/* A deep queue's backlog array is written once, a slice at a time, before
 * its catch-up begins (catch_up, room_ready): fresh memory costs its first
 * touch, 2-20 ms for the 4.8 MB of 200,000 items on this machine
 * (bench/RESULTS.md), and backlog_take fills the array in one loop turn. */
#define BACKLOG_ROOM_SLICE_BYTES (256u << 10)

static void backlog_push(struct backlog *b, struct backlog_item item)
{
    if (b->count == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 256;
        b->items = xrealloc(b->items, sizeof *b->items * b->cap);
    }
    b->items[b->count++] = item;
}

/* A message published while the catch-up goes on: referenced. */
static void backlog_add(struct backlog *b, uint64_t seq, struct message *message)
{
    message_ref(message);
    backlog_push(b, (struct backlog_item){seq, message, true, false});
}

/* What the queue holds as the catch-up begins (each_held; message NULL:
 * paged): borrowed, not referenced. Referencing 200,000 messages wrote as
 * many cache lines in one loop turn (~3 ms, bench/RESULTS.md); this reads
 * the queue's ring in order. */
static void backlog_borrow(void *ctx, uint64_t seq, struct message *message)
{
    backlog_push(ctx, (struct backlog_item){seq, message, false, false});
}

static void backlog_free(struct backlog *b)
{
    if (b == NULL)
        return;
    for (uint32_t i = b->next; i < b->count; i++) {
        if (b->items[i].owned)
            message_unref(b->items[i].message);
    }
    free(b->items);
    free(b);
}

/* The index of the first item still to send whose seq is >= seq. */
static uint32_t backlog_lower_bound(const struct backlog *b, uint64_t seq)
{
    uint32_t lo = b->next, hi = b->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (b->items[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The item of seq still to send, or NULL. */
static struct backlog_item *backlog_find(struct backlog *b, uint64_t seq)
{
    uint32_t i = backlog_lower_bound(b, seq);
    return i < b->count && b->items[i].seq == seq ? &b->items[i] : NULL;
}

/* The item's message left the queue before it was sent: it never will be. */
static void backlog_item_remove(struct backlog_item *it)
{
    if (it->owned)
        message_unref(it->message);
    *it = (struct backlog_item){.seq = it->seq, .removed = true};
}

/* Seq left the queue: true if it was still to send (it will not be). */
static bool backlog_remove(struct backlog *b, uint64_t seq)
{
    struct backlog_item *it = backlog_find(b, seq);
    if (it == NULL)
        return false;
    backlog_item_remove(it);
    return true;
}

/* Seqs first..last left the queue: how many of them were still to send. */
static uint32_t backlog_remove_run(struct backlog *b, uint64_t first, uint64_t last)
{
    uint32_t removed = 0;
    for (uint32_t i = backlog_lower_bound(b, first); i < b->count && b->items[i].seq <= last;
         i++) {
        if (b->items[i].removed)
            continue;
        backlog_item_remove(&b->items[i]);
        removed++;
    }
    return removed;
}

/* Seq's message went to disk only: a borrowed one is read back when sent
 * (an owned one stays as it is, in memory). */
static void backlog_paged(struct backlog *b, uint64_t seq)
{
    struct backlog_item *it = backlog_find(b, seq);
    if (it != NULL && !it->owned)
        it->message = NULL;
}

static int by_seq(const void *a, const void *b)
{
    const struct backlog_item *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* backlog_borrow for a transient-only backup: the transient ones only
 * (paged ones are persistent). */
static void backlog_borrow_transient(void *ctx, uint64_t seq, struct message *message)
{
    if (message != NULL && !message->persistent)
        backlog_borrow(ctx, seq, message);
}

/* Every message the queue holds, ready (resident or paged) or delivered
 * and unacked, in seq order, each with a reference (transient_only: the
 * transient ones). */
/* A message of no exchange, key or properties, with room for body_size
 * bytes (the caller writes them): what a stream sends under seq 0 to a
 * replica that is not a message of the queue (a mark, a probe, a verify). */
static struct message *control_message(uint64_t body_size)
{
    static const uint8_t no_properties[2] = {0, 0}; /* property flags: none */
    struct basic_properties none = {0};
    struct message *m =
        message_new(BYTES_LIT(""), BYTES_LIT(""), no_properties, 2, &none, body_size);
    ASSERT(m != NULL);
    m->body_received = body_size;
    return m;
}

/* Every message the queue holds, ready or delivered and not settled:
 * each(ctx, seq, message or NULL when paged): each priority level's ready
 * ones in seq order, then the delivered ones in no particular order. */
static void each_held(struct queue *queue, void (*each)(void *, uint64_t, struct message *),
                      void *ctx)
{
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        const struct queue_ring *ring =
            level == 0 ? &queue->ready : &queue->priority_rings[level - 1];
        for (uint32_t i = 0; i < ring->count; i++) {
            const struct queue_entry *e = &ring->entries[(ring->head + i) & (ring->cap - 1)];
            each(ctx, e->seq, e->paged ? NULL : e->message);
        }
    }
    channels_each_unacked(queue->vhost->broker, queue, each, ctx);
}

/* Items [0, count) in seq order, given that they came as ascending runs
 * (each_held): only what breaks the first run is sorted, then merged
 * with it, unless that is most of them (several priority levels). The
 * common case, one level and a few deliveries unacked, is linear. */
static void backlog_sort(struct backlog *b)
{
    if (b->count < 2)
        return;
    uint32_t run = 1;
    while (run < b->count && b->items[run - 1].seq < b->items[run].seq)
        run++;
    if (run == b->count)
        return;
    uint32_t rest = b->count - run;
    if (rest > b->count / 4) {
        qsort(b->items, b->count, sizeof *b->items, by_seq);
        return;
    }
    qsort(b->items + run, rest, sizeof *b->items, by_seq);
    struct backlog_item *tail = xmalloc(sizeof *tail * rest);
    memcpy(tail, b->items + run, sizeof *tail * rest);
    /* Merge from the back: the first run's items move right, in place. */
    uint32_t i = run, j = rest, k = b->count;
    while (j > 0) {
        if (i > 0 && b->items[i - 1].seq > tail[j - 1].seq)
            b->items[--k] = b->items[--i];
        else
            b->items[--k] = tail[--j];
    }
    free(tail);
}

/* The queue's messages as the catch-up begins, in one turn of the loop,
 * in every publisher's way: sized at once, into room readied beforehand
 * if it is deep (room: NULL, or taken), sorted only where out of order,
 * borrowed. 200,000 messages: 34 ms when grown by doubling, sorted whole
 * and referenced; ~6 ms referenced; now a walk of ~0.5 ms. What is
 * published meanwhile grows it, referenced. */
static struct backlog *backlog_take(struct queue *queue, bool transient_only,
                                    struct backlog *room)
{
    struct backlog *b = room != NULL ? room : xcalloc(1, sizeof *b);
    uint32_t held = queue->ready_count + queue->unacked_count;
    if (held > b->cap) { /* (more came while the room was readied) */
        b->cap = held;
        b->items = xrealloc(b->items, sizeof *b->items * b->cap);
    }
    each_held(queue, transient_only ? backlog_borrow_transient : backlog_borrow, b);
    backlog_sort(b);
    return b;
}

/* With x-quay-dedup-window, the ids the queue remembers go first, each as
 * an empty message carrying it under seq 0 (which a replica records and
 * does not keep): a backup caught up now holds them back after a failover
 * too. Their windows restart on the backup's clock (they last longer
 * there, never shorter). */
static bool send_dedup_ids(struct replication *rep, struct replica_stream *s)
{
    const struct dedup *d = rep->queue->dedup;
    for (uint32_t i = 0; d != NULL && i < d->count; i++) {
        const struct dedup_id *id = d->items[(d->head + i) & (d->cap - 1)].id;
        uint8_t raw[3 + 255] = {BASIC_FLAG_MESSAGE_ID >> 8, BASIC_FLAG_MESSAGE_ID & 0xff, id->len};
        memcpy(raw + 3, id->bytes, id->len);
        struct basic_properties props;
        int rc = basic_properties_decode(&props, raw, 3u + id->len);
        ASSERT(rc == OK);
        struct message *m = message_new(BYTES_LIT(""), BYTES_LIT(""), raw, 3u + id->len, &props,
                                        0);
        ASSERT(m != NULL);
        struct method method = replicate_method(rep->queue, rep->epoch, 0, m);
        bool sent = stream_send(rep, s, &method, m, 0);
        message_unref(m);
        if (!sent)
            return false;
    }
    return true;
}

/* The queue's marks of the forwarding streams (broker/origin.h), each as
 * an empty message under seq 0 carrying the stream and its mark: a backup
 * caught up holds back a forward resent to it once promoted, though the
 * messages the marks stand for may be consumed (never sent to it). Sent
 * after the reset and again before the end probe (for the forwards taken
 * while the backlog went, which it sends without their origins). */
static bool send_origin_marks(struct replication *rep, struct replica_stream *s)
{
    const struct origin_marks *marks = rep->queue->origins;
    for (uint32_t i = 0; marks != NULL && i < marks->count; i++) {
        struct message *m = control_message(0);
        struct method method = replicate_method(rep->queue, rep->epoch, 0, m);
        method.basic_quay_replicate.origin_stream = marks->marks[i].stream;
        method.basic_quay_replicate.origin_seq = marks->marks[i].seq;
        bool sent = stream_send(rep, s, &method, m, 0);
        message_unref(m);
        if (!sent)
            return false;
    }
    return true;
}

/* The end of the backlog: an empty message under seq 0 (a replica takes it
 * as one it has), tagged with the queue's newest seq. It is also how an
 * empty queue's backup is heard to have taken the reset (its link may be
 * dead and not know it yet). */
static void send_end_probe(struct replication *rep, struct replica_stream *s)
{
    struct message *probe = control_message(0);
    struct method m = replicate_method(rep->queue, rep->epoch, 0, probe);
    bool sent = stream_send(rep, s, &m, probe, rep->queue->next_seq - 1);
    message_unref(probe);
    if (sent)
        s->catch_up_left = s->inflight; /* (what was sent before the reset included) */
}

static void on_pace(uv_timer_t *timer);

/* The pace timer (on_pace) in ms, unless it is set already (it serves
 * every catch-up of the broker) or the member is stopping. */
static void pace_timer_arm(struct member *member, uint64_t ms)
{
    if (member->pace_timer != NULL && !uv_is_active((uv_handle_t *)member->pace_timer))
        uv_timer_start(member->pace_timer, on_pace, ms, 0);
}

/* Sends from the backlog while the window and the byte rate allow (the
 * pace timer resumes a throttled one); at its end, the probe. */
static void catch_up_pump(struct replication *rep, struct replica_stream *s)
{
    struct backlog *b = s->backlog;
    struct member *member = rep->member;
    while (b->next < b->count && s->inflight < CATCH_UP_WINDOW) {
        if (member->catch_up_pace.rate > 0 && !pace_ready(&member->catch_up_pace, uv_hrtime())) {
            s->throttled = true;
            uint64_t ms = pace_wait_ns(&member->catch_up_pace) / 1000000u;
            pace_timer_arm(member, ms > 0 ? ms : 1);
            return;
        }
        struct backlog_item *it = &b->items[b->next++];
        if (it->removed)
            continue;
        struct message *message = it->message;
        if (message == NULL)
            message = queue_read_paged(rep->queue, it->seq); /* (a reference) */
        else if (!it->owned)
            message_ref(message);
        it->message = NULL;
        it->owned = false;
        if (message == NULL)
            continue; /* lost from the journal: the queue cannot deliver it either */
        struct method m = replicate_method(rep->queue, rep->epoch, it->seq, message);
        uint64_t size = message->body_size + message->properties_size;
        pace_spend(&member->catch_up_pace, size);
        s->catch_up_bytes += size;
        bool sent = stream_send(rep, s, &m, message, it->seq);
        message_unref(message);
        if (!sent)
            return; /* failed: the backlog is gone */
    }
    if (b->next < b->count)
        return;
    backlog_free(b);
    s->backlog = NULL;
    if (send_origin_marks(rep, s))
        send_end_probe(rep, s);
}

/* An answer while catching up: more from the backlog, or, once its probe
 * went, count down to it (answers come in order). */
static void catch_up_answered(struct replication *rep, struct replica_stream *s)
{
    if (s->backlog != NULL) {
        if (s->inflight <= CATCH_UP_WINDOW / 2)
            catch_up_pump(rep, s);
        return;
    }
    ASSERT(s->catch_up_left > 0);
    if (--s->catch_up_left == 0)
        stream_caught_up(rep, s);
}

/* Readies the room for the backlog of what the queue holds, and an eighth
 * more, a slice a call: true once it is ready (at once if it fits in one
 * slice: backlog_take sizes it). */
static bool room_ready(struct replica_stream *s, const struct queue *queue)
{
    uint64_t held = (uint64_t)queue->ready_count + queue->unacked_count;
    if (s->room == NULL && held * sizeof(struct backlog_item) <= BACKLOG_ROOM_SLICE_BYTES)
        return true;
    struct backlog *b = s->room;
    if (b == NULL) {
        b = s->room = xcalloc(1, sizeof *b);
        b->cap = (uint32_t)(held + held / 8);
        b->items = xmalloc(sizeof *b->items * b->cap);
    }
    uint32_t slice = BACKLOG_ROOM_SLICE_BYTES / sizeof *b->items;
    uint32_t n = b->cap - b->touched < slice ? b->cap - b->touched : slice;
    memset(b->items + b->touched, 0, sizeof *b->items * n);
    b->touched += n;
    return b->touched == b->cap;
}

static void catch_up(struct replication *rep, struct replica_stream *s)
{
    struct queue *queue = rep->queue;
    struct member *member = rep->member;
    struct member_peer *peer = member_peer(member, s->backup_id);
    if (peer == NULL || !peer->up) {
        s->state = STREAM_IDLE;
        return;
    }
    if (!room_ready(s, queue)) {
        /* The next slice at the pace timer; nothing is sent to the backup
         * until the catch-up begins. */
        pace_timer_arm(member, 1);
        return;
    }
    /* A purge's seq names our map's version: the backup keeps what this
     * stream sends it while its own map, behind ours, does not name it a
     * backup yet (fence_replica_kept). */
    struct method reset = settle_method(rep, member_map(rep->member)->version, 0);
    reset.basic_quay_settle.purge = true;
    s->state = STREAM_CATCHING_UP;
    s->progress_ms = loop_ms(rep);
    s->catch_up_left = 0;
    s->catch_up_bytes = 0;
    s->transient_only = rep->transient_wanted;
    s->full_until = s->skipped_to = 0;
    ASSERT(s->backlog == NULL);
    if (!stream_send(rep, s, &reset, NULL, 0) || !send_dedup_ids(rep, s) ||
        !send_origin_marks(rep, s))
        return;
    LOG_DEBUG("queue %.*s: catching up backup %u", (int)queue->name.len,
              (const char *)queue->name.ptr, s->backup_id);
    member->catch_ups_count++;
    s->backlog = backlog_take(queue, s->transient_only, s->room);
    s->room = NULL;
    catch_up_pump(rep, s);
}

/* ---- the queue's hooks ---- */

/* A persistent message not sent to a transient-only backup: it has it
 * (for confirms) once it has acked everything sent before it. (While a
 * catch-up's backlog is being sent, older seqs are still to go: its end
 * probe, tagged with the newest seq, covers the message instead.) */
static void skip(struct replica_stream *s, uint64_t seq)
{
    if (s->backlog != NULL)
        return;
    s->skipped_to = seq;
    if (s->state == STREAM_LIVE && s->acked_seq >= s->last_sent)
        s->acked_seq = seq;
}

static void published(struct queue *queue, uint64_t seq, struct message *message,
                      struct publish_wait *wait)
{
    struct replication *rep = queue->replication;
    struct method m = replicate_method(queue, rep->epoch, seq, message);
    if (wait) { /* a peer's forward the queue recorded (origin.h) */
        m.basic_quay_replicate.origin_stream = wait->origin_stream;
        m.basic_quay_replicate.origin_seq = wait->origin_seq;
    }
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        struct replica_stream *s = rep->streams[i];
        if (s->transient_only && message->persistent)
            skip(s, seq);
        else if (s->backlog)
            backlog_add(s->backlog, seq, message); /* after what the catch-up still sends */
        else if (s->state == STREAM_LIVE || s->state == STREAM_CATCHING_UP)
            stream_send(rep, s, &m, message, seq);
    }
    backups_flow(rep);
    if (wait && rep->member->forward_flow_peers > 0) {
        for (uint8_t i = 0; i < rep->streams_count; i++) {
            const struct member_peer *peer = member_peer(rep->member, rep->streams[i]->backup_id);
            wait->flow |= peer != NULL && peer->forward_flow;
        }
    }
    confirm_when_replicated(rep, seq, wait, replicated_everywhere(rep, seq));
}

static void wait_for(struct queue *queue, uint64_t seq, struct publish_wait *wait)
{
    struct replication *rep = queue->replication;
    confirm_when_replicated(rep, seq, wait, replicated_everywhere(rep, seq));
}

static void removed(struct queue *queue, uint64_t seq, bool persistent)
{
    struct replication *rep = queue->replication;
    struct method m = settle_method(rep, seq, 0);
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        struct replica_stream *s = rep->streams[i];
        if (s->transient_only && persistent && seq > s->full_until)
            continue; /* never sent to it */
        if (s->backlog && backlog_remove(s->backlog, seq))
            continue; /* never sent: the backup never hears of it */
        if (s->state == STREAM_LIVE || s->state == STREAM_CATCHING_UP)
            stream_send(rep, s, &m, NULL, 0);
    }
}

/* One settle for the run (a backup drops what it holds of it), where the
 * backlog did not hold all of it still unsent. */
static void removed_run(struct queue *queue, uint64_t first, uint64_t last)
{
    struct replication *rep = queue->replication;
    struct method m = settle_method(rep, first, last);
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        struct replica_stream *s = rep->streams[i];
        if (s->backlog && backlog_remove_run(s->backlog, first, last) == last - first + 1)
            continue; /* never sent any of it */
        if (s->state == STREAM_LIVE || s->state == STREAM_CATCHING_UP)
            stream_send(rep, s, &m, NULL, 0);
    }
}

static void paged(struct queue *queue, uint64_t seq)
{
    struct replication *rep = queue->replication;
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        if (rep->streams[i]->backlog != NULL)
            backlog_paged(rep->streams[i]->backlog, seq);
    }
}

static void detach_hook(struct queue *queue)
{
    replication_detach(queue, true);
}

static const struct queue_replication_ops replication_ops = {
    .published = published,
    .removed = removed,
    .removed_run = removed_run,
    .paged = paged,
    .detach = detach_hook,
    .wait_for = wait_for,
};

/* ---- a handover's wait ---- */

/* An empty message under seq 0 (which a replica takes as one it has),
 * tagged with the stream's frame count including itself: once answered,
 * the backup has processed everything sent before it, settles included
 * (they travel on the same channel, in order). */
static void send_probe(struct replication *rep, struct replica_stream *s)
{
    struct message *probe = control_message(0);
    struct method m = replicate_method(rep->queue, rep->epoch, 0, probe);
    s->probe_out = stream_send(rep, s, &m, probe, PROBE_TAG | (s->sent + 1));
    message_unref(probe);
}

bool replication_quiesce(struct queue *queue)
{
    struct replication *rep = queue->replication;
    if (rep == NULL)
        return true;
    rep->quiescing = true;
    if (rep->count > 0)
        return false; /* confirms still wait for some backup */
    bool quiet = true;
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        struct replica_stream *s = rep->streams[i];
        if (!s->gating)
            continue; /* (the new primary catches it up) */
        if (s->state != STREAM_LIVE || s->probe_out) {
            quiet = false; /* failed (the map drops it first), or answering */
        } else if (s->clean_at != s->sent) {
            send_probe(rep, s);
            quiet = false;
        }
    }
    return quiet;
}

void replication_probe_again(struct queue *queue)
{
    struct replication *rep = queue->replication;
    for (uint8_t i = 0; rep != NULL && i < rep->streams_count; i++)
        rep->streams[i]->clean_at = UINT64_MAX;
}

void replication_quiesce_end(struct queue *queue)
{
    struct replication *rep = queue->replication;
    if (rep != NULL)
        rep->quiescing = false;
}

/* ---- following the map ---- */

static void stream_release(struct replica_stream *s)
{
    backlog_free(s->backlog);
    s->backlog = NULL;
    backlog_free(s->room);
    s->room = NULL;
    s->rep = NULL;
    if (s->inflight == 0)
        free(s);
}

static struct replica_stream *stream_take(struct replication *rep, uint32_t id)
{
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        struct replica_stream *s = rep->streams[i];
        if (s != NULL && s->backup_id == id) {
            rep->streams[i] = NULL;
            return s;
        }
    }
    return NULL;
}

/* The streams for mq's backups: kept ones keep their progress, new ones
 * start idle; a stream whose broker is no longer a backup goes. */
/* A stream that starts live on a promotion: the backup may not have
 * applied the map change yet (an old primary that stays a backup still
 * holds the queue itself until it does, and would refuse the stream), so
 * it is asked to apply our map first: basic.quay-sync without an answer,
 * ahead of everything on the stream's channel. */
static void stream_sync(struct replication *rep, struct replica_stream *s)
{
    struct method m = {.id = METHOD_BASIC_QUAY_SYNC};
    m.basic_quay_sync.version = member_map(rep->member)->version;
    m.basic_quay_sync.answer = false;
    stream_send(rep, s, &m, NULL, 0);
}

/* The backup restarted since the stream last followed the map
 * (fence_backup_restarted): what we sent it is gone; caught up again
 * (replication_attach starts it once the stream no longer gates: the same
 * map change took the backup out of the in-sync set). */
static void stream_follow_process(struct replication *rep, struct replica_stream *s,
                                  const struct cluster_map *map)
{
    const struct map_broker *b = cluster_map_broker(map, s->backup_id);
    uint32_t incarnation = b != NULL ? b->incarnation : 0;
    if (fence_backup_restarted(s->incarnation, incarnation) && s->state != STREAM_IDLE) {
        backlog_free(s->backlog);
        s->backlog = NULL;
        s->state = STREAM_FAILED;
        s->join_asked = false;
        log_queue(rep->queue, "restarted: caught up again", s->backup_id);
    }
    s->incarnation = incarnation;
}

/* Whether a promoted primary verifies the backups its streams start in
 * step with (replica.h, struct replica_digest). Not a queue whose backups
 * hold only its transient messages: theirs and ours differ by design (a
 * promotion there merges the shared log, mirror.c). */
static bool verifies(const struct replication *rep)
{
    return !rep->transient_wanted;
}

static void digest_add(void *ctx, uint64_t seq, struct message *message)
{
    (void)message;
    replica_digest_add(ctx, seq);
}

/* What we adopted (each_held, as a catch-up's backlog takes it), as a
 * verify message tagged with our newest seq: its ack says the backup holds
 * the same, so everything up to there is on it (on_stream_answer); a
 * refusal fails the stream. */
static void send_verify(struct replication *rep, struct replica_stream *s)
{
    struct queue *queue = rep->queue;
    struct replica_digest d = {0, 0};
    each_held(queue, digest_add, &d);
    struct message *m = control_message(REPLICA_VERIFY_SIZE);
    replica_verify_encode(&d, m->body);
    struct method method = replicate_method(queue, rep->epoch, 0, m);
    (void)stream_send(rep, s, &method, m, queue->next_seq - 1);
    message_unref(m);
}

static void streams_follow(struct replication *rep, const struct map_queue *mq, bool fresh,
                           bool recovered)
{
    const struct cluster_map *map = member_map(rep->member);
    struct replica_stream *next[CLUSTER_BACKUPS_MAX] = {0};
    for (uint8_t i = 0; i < mq->backups_count; i++) {
        struct replica_stream *s = stream_take(rep, mq->backup_ids[i]);
        if (s == NULL) {
            s = xcalloc(1, sizeof *s);
            *s = (struct replica_stream){.rep = rep, .backup_id = mq->backup_ids[i]};
        }
        bool in_sync = (mq->in_sync_mask & (1u << i)) != 0;
        stream_follow_process(rep, s, map);
        if (fresh) {
            /* Promoted (or just declared): an in-sync backup holds what we
             * adopted, under the same seqs. (A stream we already had keeps
             * what it knows: one that failed is not in step, whatever an
             * epoch change says.) */
            bool in_step = in_sync && !recovered;
            s->state = in_step ? STREAM_LIVE : in_sync ? STREAM_FAILED : STREAM_IDLE;
            s->join_asked = false;
            /* ... which its answer to our verify says (verifies): until
             * then nothing counts as on it. */
            s->acked_seq = in_step && !verifies(rep) ? rep->queue->next_seq - 1 : 0;
        }
        /* Live (everything sent so far is on its way to it, nothing lost)
         * but not in sync in the map: a stale request of ours landed after
         * a newer one. It is in step: ask again (the tick does). */
        if (!in_sync && s->state == STREAM_LIVE)
            s->join_asked = true;
        bool gating = fence_stream_gates(in_sync, s->join_asked);
        if (gating && !s->gating)
            s->progress_ms = loop_ms(rep);
        s->gating = gating;
        if (in_sync)
            s->join_asked = false;
        next[i] = s;
    }
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        if (rep->streams[i] != NULL)
            stream_release(rep->streams[i]);
    }
    memcpy(rep->streams, next, sizeof next);
    rep->streams_count = mq->backups_count;
}

/* x-quay-replicate "transient" (or the policy's quay-replicate, read from
 * the map at each attach: a policy change re-attaches, mirror.c): the
 * backups get the transient messages only, when the persistent ones are
 * safe without them. Each is confirmed
 * once our own journal synced it, through a fenced sync on the shared
 * storage (so it is in the log a taker reads: the fence makes a write
 * after the taker's rename fail, unconfirmed), with our lease fresh and
 * every message before it on the in-sync backups (confirms go in order).
 * If we die, the in-sync backup the controller would promote takes the
 * queue over keeping its replica (queue.take_over with replica), reads our
 * log and merges by seq. So only when that backup can read our log: every
 * backup shares our storage (the map's broker.storage). Not while the
 * queue moves: a planned handover gives the target the queue as its
 * replica holds it, and the backups that stay go on from what they hold
 * (the target's log of the persistent ones was not synced when it acked
 * them, so it cannot stand in for theirs at once); so they are all caught
 * up again in full, and switch back once the move is over (replication_attach). */
static bool transient_only_wanted(const struct member *member, const struct queue *queue,
                                  const struct map_queue *mq)
{
    /* (Not an exclusive queue: nobody takes one over, its backup is promoted
     * as usual: controller_takes_over_with_replica.) */
    const struct cluster_map *map = member_map(member);
    if (!queue->durable || queue->exclusive || queue->journal == NULL ||
        member->broker->config.shared_storage_dir == NULL || mq->move_to != BROKER_ID_NONE ||
        !map_queue_replicates_transient_only(map, mq))
        return false;
    const struct map_broker *self = cluster_map_broker(map, member->self_id);
    for (uint8_t i = 0; i < mq->backups_count; i++) {
        if (!map_brokers_share_storage(self, cluster_map_broker(map, mq->backup_ids[i])))
            return false;
    }
    return self != NULL;
}

bool replication_holds_everything(const struct queue *queue, uint32_t backup_id)
{
    const struct replication *rep = queue->replication;
    for (uint8_t i = 0; rep != NULL && i < rep->streams_count; i++) {
        if (rep->streams[i]->backup_id == backup_id)
            return !rep->streams[i]->transient_only;
    }
    return true;
}

void replication_attach(struct member *member, struct queue *queue, const struct map_queue *mq,
                        bool recovered)
{
    struct replication *rep = queue->replication;
    if (mq->backups_count == 0 && (rep == NULL || rep->count == 0)) {
        replication_detach(queue, true);
        return;
    }
    bool fresh = rep == NULL;
    if (rep == NULL) {
        rep = xcalloc(1, sizeof *rep);
        rep->member = member;
        rep->queue = queue;
        list_push_back(&member->replications, &rep->member_link);
        member->replications_count++;
        queue->replication = rep;
        queue->replication_ops = &replication_ops;
    }
    ASSERT(fresh || mq->epoch >= rep->epoch); /* a queue's epoch never falls */
    rep->epoch = mq->epoch;
    rep->transient_wanted = transient_only_wanted(member, queue, mq);
    streams_follow(rep, mq, fresh, recovered);
    if (fresh && recovered)
        ask_in_sync(rep); /* without those not in step (the tick asks again) */
    for (uint8_t i = 0; fresh && i < rep->streams_count; i++) {
        if (rep->streams[i]->state != STREAM_LIVE)
            continue;
        stream_sync(rep, rep->streams[i]);
        if (verifies(rep))
            send_verify(rep, rep->streams[i]);
    }
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        struct replica_stream *s = rep->streams[i];
        if (s->transient_only && !rep->transient_wanted) {
            stream_fail(rep, s, "must hold the persistent messages too (a move, storage "
                                "not shared, or a policy): caught up again in full");
            /* A policy change dropped it from the in-sync set already
             * (map_apply.c partial_before): no map change will come to
             * end its gating, so it ends here and the catch-up starts.
             * Its join, if asked, said it holds transient messages only:
             * refused once the queue replicates everything
             * (map_cmd_queue_set_in_sync_partial), else it lands first. */
            bool join_refused = !map_queue_replicates_transient_only(member_map(member), mq);
            if ((mq->in_sync_mask & (1u << i)) == 0 && (!s->join_asked || join_refused)) {
                s->join_asked = false;
                s->gating = false;
            }
        } else if (!s->transient_only && rep->transient_wanted && s->state == STREAM_LIVE) {
            s->transient_only = true; /* it has everything so far: the new ones suffice */
            s->full_until = queue->next_seq - 1;
            s->skipped_to = 0;
        }
        if (!s->gating && (s->state == STREAM_IDLE || s->state == STREAM_FAILED))
            catch_up(rep, s);
    }
    drain(rep);
}

void replication_detach(struct queue *queue, bool ack)
{
    struct replication *rep = queue->replication;
    queue->replication = NULL;
    queue->replication_ops = NULL;
    if (rep == NULL)
        return;
    flow_queue_hold(queue, FLOW_BACKUPS, false);
    while (rep->count > 0)
        pending_pop(rep, ack);
    for (uint8_t i = 0; i < rep->streams_count; i++)
        stream_release(rep->streams[i]);
    list_remove(&rep->member_link);
    ASSERT(rep->member->replications_count > 0);
    rep->member->replications_count--;
    free(rep->pending);
    free(rep);
}

void replication_stop_all(struct member *member)
{
    while (!list_empty(&member->replications)) {
        struct replication *rep =
            CONTAINER_OF(member->replications.next, struct replication, member_link);
        replication_detach(rep->queue, false);
    }
}

/* ---- the tick ---- */

/* A catch-up that waited for the byte budget goes on; with nothing left
 * in flight it was waiting, not stalled. */
static void catch_up_resume(struct replication *rep, struct replica_stream *s, uint64_t now)
{
    s->throttled = false;
    if (s->inflight == 0)
        s->progress_ms = now;
    if (s->backlog != NULL)
        catch_up_pump(rep, s);
}

/* The byte rate allows more: every catch-up that waited for it goes on;
 * one readying its room (catch_up) takes its next slice. */
static void on_pace(uv_timer_t *timer)
{
    struct member *member = timer->data;
    uint64_t now = uv_now(member->broker->loop);
    list_for_each_safe(n, &member->replications) {
        struct replication *rep = CONTAINER_OF(n, struct replication, member_link);
        for (uint8_t i = 0; i < rep->streams_count; i++) {
            struct replica_stream *s = rep->streams[i];
            if (s->state == STREAM_CATCHING_UP && s->throttled)
                catch_up_resume(rep, s, now);
            else if (s->room != NULL && !s->gating &&
                     (s->state == STREAM_IDLE || s->state == STREAM_FAILED))
                catch_up(rep, s);
        }
    }
}

static void tick_one(struct replication *rep, uint64_t now)
{
    uint64_t oldest = rep->count > 0 ? pending_at(rep, 0)->at_ms : now;
    bool lagging = now - oldest >= REPLICATION_LAG_MS && member_lease_fresh(rep->member);
    for (uint8_t i = 0; i < rep->streams_count; i++) {
        struct replica_stream *s = rep->streams[i];
        /* Lagging: something has waited for it, and it acked nothing, for
         * REPLICATION_LAG_MS (a backup still working through a long
         * catch-up or a burst is not lagging). */
        if (lagging && s->gating && s->state != STREAM_FAILED &&
            s->acked_seq < pending_at(rep, 0)->seq &&
            now - s->progress_ms >= REPLICATION_LAG_MS)
            stream_fail(rep, s, "lags: leaving the in-sync set");
        else if (!s->gating && (s->state == STREAM_IDLE || s->state == STREAM_FAILED))
            catch_up(rep, s);
        else if (s->state == STREAM_CATCHING_UP && s->throttled)
            catch_up_resume(rep, s, now);
        else if (s->state == STREAM_CATCHING_UP && now - s->progress_ms >= REPLICATION_STALL_MS)
            stream_fail(rep, s, "stalled while catching up: starting over");
    }
    if (now - rep->checked_ms >= REPLICATION_RETRY_MS) {
        rep->checked_ms = now;
        ask_in_sync(rep); /* a change the map did not take (no quorum, lost): again */
    }
    drain(rep);
    quiet_maybe(rep);
}

void replication_tick_begin(struct member *member)
{
    member->replications_tick_left = member->replications_count;
}

/* (list_walk_next: tick_one may detach the one it visits.) */
bool replication_tick_step(struct member *member, uint32_t budget)
{
    uint64_t now = uv_now(member->broker->loop);
    struct list_node *n;
    for (; budget > 0; budget--) {
        if ((n = list_walk_next(&member->replications, &member->replications_tick_left)) == NULL)
            break;
        tick_one(CONTAINER_OF(n, struct replication, member_link), now);
    }
    return member->replications_tick_left == 0;
}

uint32_t replication_confirms_waiting(const struct queue *queue)
{
    const struct replication *rep = queue->replication;
    return rep != NULL ? rep->count : 0;
}

bool replication_catch_up_progress(const struct queue *queue, uint32_t backup_id,
                                   struct replication_progress *out)
{
    const struct replication *rep = queue->replication;
    for (uint8_t i = 0; rep != NULL && i < rep->streams_count; i++) {
        const struct replica_stream *s = rep->streams[i];
        if (s->backup_id != backup_id || s->state != STREAM_CATCHING_UP)
            continue;
        const struct backlog *b = s->backlog;
        *out = (struct replication_progress){b ? b->next : 0, b ? b->count : 0,
                                             s->catch_up_bytes};
        return true;
    }
    return false;
}

void replication_write_json(const struct queue *queue, struct json *out)
{
    const struct replication *rep = queue->replication;
    if (rep == NULL)
        return;
    json_kv_bool(out, "serving", member_lease_fresh(rep->member));
    /* x-quay-replicate in effect: "transient" while the backups get the
     * transient messages only (transient_only_wanted), else "all". */
    json_kv_string(out, "replicating", rep->transient_wanted ? "transient" : "all");
    json_kv_uint(out, "confirms_waiting", rep->count);
    json_key(out, "confirms");
    json_object_begin(out);
    bool current = rep->confirms_epoch == rep->epoch;
    json_kv_uint(out, "epoch", rep->epoch);
    json_kv_uint(out, "count", current ? rep->confirms_count : 0);
    json_kv_uint(out, "first_ms", current ? rep->first_confirm_ms : 0);
    json_kv_uint(out, "last_ms", current ? rep->last_confirm_ms : 0);
    json_object_end(out);
}
