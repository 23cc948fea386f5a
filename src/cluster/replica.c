/*
 * replica.c: see replica.h.
 */
#include "cluster/replica.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/wire.h"
#include "broker/channel.h"
#include "broker/dedup.h"
#include "broker/message.h"
#include "broker/origin.h"
#include "broker/queue.h"
#include "broker/reclaim.h"
#include "broker/vhost.h"
#include "cluster/fence.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/ring.h"
#include "lib/log.h"
#include "store/journal.h"

/* ---- the backup's side: a ring sorted by seq, holes for removed ones ----
 *
 * The entries are the queue's own (struct queue_entry, already marked
 * redelivered), so a promotion hands the whole ring to the queue instead
 * of copying a message at a time: O(holes), never touching a message. */

struct replica {
    struct queue_ring ring;      /* owned; count includes holes (see hole()) */
    uint32_t live;
    uint32_t persistent;         /* live ones with delivery mode 2 */
    uint32_t paged;              /* live ones kept in the log only (their message NULL) */
    uint64_t live_bytes;         /* their body bytes */
    uint64_t last_seq;
    uint64_t last_epoch;         /* of the stream last_seq came on (0: unknown) */
    uint64_t stream_version;     /* replica_reset's: the primary's map then (0: unknown) */
    /* Owned, or NULL (a transient queue, or no journal): the log of the
     * persistent messages, the records the primary's journal has, so a
     * promotion need not write them again. Not fsync'ed before our ack:
     * the primary's disk and our memory already hold a confirmed one. */
    struct journal_queue *log;
    /* Owned, or NULL (no x-quay-dedup-window): the ids of what the primary
     * enqueued, as the queue's own table would hold them, timed by our
     * clock. A reset does not clear it (ids are about publishes, not
     * contents); promotion hands it to the real queue. */
    struct dedup *dedup;
    /* Owned, lazily, or NULL: the primary's marks of the forwarding streams
     * (broker/origin.h), with the newest log ticket; a reset keeps them. */
    struct origin_marks *origins;
    uint64_t last_ticket;        /* of the newest message written to log */
    struct replica_handover *handover; /* owned, or NULL: see replica_note_handover */
    struct reclaim *reclaim;     /* borrowed, or NULL */
};

struct replica *replica_new(int64_t dedup_window_ms, struct journal_queue *log,
                            struct reclaim *reclaim)
{
    struct replica *r = xcalloc(1, sizeof *r);
    r->reclaim = reclaim;
    /* Nothing of another life of this name belongs in it. */
    r->log = log && journal_queue_seq_last(log) > 0 ? journal_queue_recreate(log) : log;
    if (dedup_window_ms > 0) {
        r->dedup = xmalloc(sizeof *r->dedup);
        dedup_init(r->dedup, (uint64_t)dedup_window_ms);
    }
    return r;
}

static struct queue_entry *slot(const struct replica *r, uint32_t i)
{
    return &r->ring.entries[(r->ring.head + i) & (r->ring.cap - 1)];
}

/* A removed entry (a paged one's message field holds its size). */
static bool hole(const struct queue_entry *e)
{
    return !e->paged && e->message == NULL;
}

static uint64_t body_size(const struct queue_entry *e)
{
    return e->paged ? e->paged_body_size : e->message->body_size;
}

static void trim(struct replica *r)
{
    while (r->ring.count > 0 && hole(slot(r, 0))) {
        r->ring.head = (r->ring.head + 1) & (r->ring.cap - 1);
        r->ring.count--;
    }
}

void replica_free(struct replica *r)
{
    if (r == NULL)
        return;
    replica_remove(r, 0);
    replica_handover_free(r->handover);
    free(r->ring.entries);
    if (r->log)
        journal_queue_delete(r->log);
    if (r->dedup) {
        dedup_free(r->dedup);
        free(r->dedup);
    }
    free(r->origins);
    free(r);
}

void replica_record_origin(struct replica *r, uint64_t stream, uint64_t seq, uint64_t now_ms)
{
    if (stream == 0)
        return;
    if (r->origins == NULL) {
        r->origins = xcalloc(1, sizeof *r->origins);
    }
    /* The newest ticket covers this message's write (the log is unsynced
     * until then: a promoted queue's duplicate waits for it). */
    origin_record(r->origins, stream, seq, now_ms, r->last_ticket);
}

/* ---- digests (replica.h) ---- */

static const uint8_t VERIFY_MAGIC[4] = {'Q', 'Y', 'V', 'F'};

void replica_digest_add(struct replica_digest *d, uint64_t seq)
{
    uint64_t x = seq + UINT64_C(0x9E3779B97F4A7C15); /* splitmix64's finalizer */
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    d->count++;
    d->sum += x ^ (x >> 31);
}

struct replica_digest replica_digest_of(const struct replica *r)
{
    struct replica_digest d = {0, 0};
    for (uint32_t i = 0; r != NULL && i < r->ring.count; i++) {
        const struct queue_entry *e = slot((struct replica *)r, i);
        if (!hole(e))
            replica_digest_add(&d, e->seq);
    }
    return d;
}

void replica_verify_encode(const struct replica_digest *d, uint8_t out[REPLICA_VERIFY_SIZE])
{
    memcpy(out, VERIFY_MAGIC, sizeof VERIFY_MAGIC);
    wire_put_u64(out + 4, d->count);
    wire_put_u64(out + 12, d->sum);
}

/* A verify message (replica.h): whether what we hold is what it names. */
static bool verify_matches(const struct replica *r, const struct message *m)
{
    struct replica_digest d = replica_digest_of(r);
    return wire_get_u64(m->body + 4) == d.count && wire_get_u64(m->body + 12) == d.sum;
}

static bool is_verify(const struct message *m)
{
    return m->body_size == REPLICA_VERIFY_SIZE &&
           memcmp(m->body, VERIFY_MAGIC, sizeof VERIFY_MAGIC) == 0;
}

bool replica_push(struct replica *r, uint64_t epoch, uint64_t seq, struct message *message,
                  uint64_t now_ms, bool page)
{
    if (seq == 0) {
        /* Not a message: a promoted primary's verify, a catch-up's dedup
         * id, a mark (replica_record_origin), or its empty probe. */
        if (is_verify(message))
            return verify_matches(r, message);
        if (r->dedup)
            dedup_record(r->dedup, message_id(message), now_ms, 0);
        return true;
    }
    enum fence_push fate = fence_replica_push(r->last_seq, r->last_epoch, seq, epoch);
    if (fate != FENCE_PUSH_TAKE)
        return fate == FENCE_PUSH_HAVE; /* sent again after a reconnect, or a collision */
    /* After a reset, the snapshot's ids are mostly known already: they keep
     * their first time (dedup_record does not restart a window). */
    if (r->dedup)
        dedup_record(r->dedup, message_id(message), now_ms, 0);
    if (r->ring.count == r->ring.cap)
        r->ring.entries = ring_grow(r->ring.entries, sizeof *r->ring.entries, &r->ring.head,
                                    r->ring.count, &r->ring.cap, 64);
    /* Redelivered: the old primary may have delivered it by the time we
     * are promoted, and nothing tells us which ones it did. */
    struct queue_entry entry = {.message = message, .seq = seq, .redelivered = 1};
    if (r->log && message->persistent) {
        struct bytes blob = message_blob(message);
        r->last_ticket = journal_publish(r->log, seq, blob.ptr, blob.len);
        if (page) { /* as the primary keeps it: on disk only */
            entry.paged = 1;
            entry.paged_body_size = message->body_size;
            r->paged++;
        }
    }
    if (!entry.paged)
        message_ref(message);
    *slot(r, r->ring.count) = entry;
    r->ring.count++;
    r->live++;
    r->live_bytes += message->body_size;
    r->persistent += message->persistent;
    r->last_seq = seq;
    r->last_epoch = epoch;
    return true;
}

void replica_remove(struct replica *r, uint64_t seq)
{
    if (seq == 0) {
        reclaim_ring(r->reclaim, &r->ring); /* (its array too: regrown as it fills) */
        r->live = r->persistent = r->paged = 0;
        r->live_bytes = 0;
        r->last_seq = 0; /* a catch-up starts over from the primary's oldest */
        /* ... so the log's seqs must be able to as well. */
        if (r->log && journal_queue_seq_last(r->log) > 0)
            r->log = journal_queue_recreate(r->log);
        return;
    }
    replica_remove_run(r, seq, seq);
}

/* A run that takes the ring from slot lo to its end (a purge of a queue
 * whose few unacked messages are at its head) hands the ring to the
 * reclaim as it is, what stays before lo moved to a new one: the counts
 * are those of what stays, so no message of the run is read here (a
 * million of them, one cache miss each, held the loop ~60 ms). */
#define RUN_SPLIT_MIN 1024u

static void remove_tail(struct replica *r, uint32_t lo, uint64_t first, uint64_t last)
{
    struct queue_ring kept = {0};
    r->live = r->persistent = r->paged = 0;
    r->live_bytes = 0;
    for (uint32_t i = 0; i < lo; i++) {
        struct queue_entry *e = slot(r, i);
        if (hole(e))
            continue;
        if (kept.count == kept.cap)
            kept.entries = ring_grow(kept.entries, sizeof *kept.entries, &kept.head, kept.count,
                                     &kept.cap, 64);
        kept.entries[kept.count++] = *e;
        r->live++;
        r->live_bytes += body_size(e);
        r->persistent += e->paged || e->message->persistent;
        r->paged += e->paged;
        *e = (struct queue_entry){.seq = e->seq}; /* a hole: the reclaim skips it */
    }
    if (r->log)
        journal_ack_range(r->log, first, last);
    struct queue_ring gone = r->ring;
    r->ring = kept;
    reclaim_ring(r->reclaim, &gone);
}

void replica_remove_run(struct replica *r, uint64_t first, uint64_t last)
{
    ASSERT(first > 0 && first <= last);
    /* Binary search: entries are in seq order (holes keep their seq). */
    uint32_t lo = 0, hi = r->ring.count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (slot(r, mid)->seq < first)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (r->ring.count - lo > RUN_SPLIT_MIN && slot(r, r->ring.count - 1)->seq <= last) {
        remove_tail(r, lo, first, last);
        return;
    }
    /* A run's messages go to the reclaim (a purge's may be a million:
     * unreferenced here, they held this loop as long as the primary's). */
    struct queue_ring gone = {0};
    bool logged = false;
    for (uint32_t i = lo; i < r->ring.count && slot(r, i)->seq <= last; i++) {
        struct queue_entry *e = slot(r, i);
        if (hole(e))
            continue;
        bool persistent = e->paged || e->message->persistent; /* only persistent ones page */
        r->live--;
        r->live_bytes -= body_size(e);
        r->persistent -= persistent;
        r->paged -= e->paged;
        logged |= persistent;
        if (first == last && !e->paged) {
            message_unref(e->message);
        } else if (!e->paged) {
            if (gone.count == gone.cap)
                gone.entries = ring_grow(gone.entries, sizeof *gone.entries, &gone.head,
                                         gone.count, &gone.cap, 64);
            gone.entries[gone.count++] = *e;
        }
        *e = (struct queue_entry){.seq = e->seq}; /* a hole */
    }
    if (r->log && logged)
        journal_ack_range(r->log, first, last); /* (one seq: journal_ack) */
    reclaim_ring(r->reclaim, &gone); /* (empty: frees nothing) */
    trim(r);
    while (r->ring.count > 0 && hole(slot(r, r->ring.count - 1)))
        r->ring.count--; /* (a run at the tail: no slot kept for it) */
}

void replica_reset(struct replica *r, uint64_t stream_version)
{
    replica_remove(r, 0);
    r->stream_version = stream_version;
}

uint64_t replica_stream_version(const struct replica *r)
{
    return r ? r->stream_version : 0;
}

void replica_forget_log(struct replica *r)
{
    if (r)
        r->log = NULL;
}

bool replica_logged(const struct replica *r)
{
    return r != NULL && r->log != NULL;
}

uint32_t replica_count(const struct replica *r)
{
    return r ? r->live : 0;
}

uint64_t replica_bytes(const struct replica *r)
{
    return r ? r->live_bytes : 0;
}

uint32_t replica_dedup_count(const struct replica *r)
{
    return r && r->dedup ? dedup_count(r->dedup) : 0;
}

/* ---- promotion ---- */

/* Closes the holes: the live entries move, in order, to slots 0..live-1
 * (a wrapped ring into a fresh array: in place, its tail would be
 * overwritten before it is read). Touches entries, never messages. */
static void compact(struct replica *r)
{
    struct queue_ring *ring = &r->ring;
    bool wrapped = ring->head + ring->count > ring->cap;
    struct queue_entry *to = wrapped ? xmalloc(sizeof *to * ring->cap) : ring->entries;
    uint32_t out = 0;
    if (!wrapped && r->live == ring->count) {
        memmove(to, slot(r, 0), sizeof *to * ring->count);
        out = ring->count;
    } else {
        for (uint32_t i = 0; i < ring->count; i++) {
            if (!hole(slot(r, i)))
                to[out++] = *slot(r, i);
        }
    }
    if (wrapped) {
        free(ring->entries);
        ring->entries = to;
    }
    ASSERT(out == r->live);
    ring->head = 0;
    ring->count = out;
}

void replica_adopt(struct queue *queue, struct replica *r)
{
    if (r == NULL)
        return;
    queue_adopt_dedup(queue, r->dedup);
    r->dedup = NULL;
    queue_adopt_origins(queue, r->origins);
    r->origins = NULL;
    uint32_t live = r->live;
    if (r->ring.cap > 0)
        compact(r);
    /* The queue opened its log by name: ours, which is handed over. */
    bool journaled = r->log != NULL && r->log == queue->journal;
    if (journaled)
        r->log = NULL;
    ASSERT(journaled || r->paged == 0); /* paged ones are in the log only */
    struct queue_adoption adoption = {.ring = r->ring, .bytes = r->live_bytes,
                                      .persistent = journaled ? 0 : r->persistent,
                                      .paged = r->paged};
    r->ring = (struct queue_ring){0};
    r->live = r->persistent = r->paged = 0;
    r->live_bytes = 0;
    queue_adopt(queue, &adoption);
    LOG_DEBUG("vhost=%.*s queue=%.*s: promoted with %u messages from its replica",
             (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
             (int)queue->name.len, (const char *)queue->name.ptr, live);
    replica_free(r);
}

/* ---- an old primary staying a backup ---- */

struct entries {
    struct queue_entry *items;
    uint32_t count, cap;
};

static void add_delivered(void *ctx, uint64_t seq, struct message *message)
{
    struct entries *e = ctx;
    if (e->count == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 64;
        e->items = xrealloc(e->items, sizeof *e->items * e->cap);
    }
    message_ref(message); /* the channel keeps its own */
    e->items[e->count++] = (struct queue_entry){.message = message, .seq = seq};
}

static int by_seq(const void *a, const void *b)
{
    uint64_t x = ((const struct queue_entry *)a)->seq, y = ((const struct queue_entry *)b)->seq;
    return x < y ? -1 : x > y;
}

/* Whether seq is among the n entries (ascending). */
static bool has_seq(const struct queue_entry *e, uint32_t n, uint64_t seq)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (e[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && e[lo].seq == seq;
}

/* The held settles' messages (see replica_of_queue) that neither the queue
 * nor a channel holds any more, added to delivered. */
static void add_settled(struct entries *delivered, const struct queue_surrender *s,
                        const struct queue_held_settle *settles, uint32_t count)
{
    uint32_t known = delivered->count;
    if (known > 1)
        qsort(delivered->items, known, sizeof *delivered->items, by_seq);
    for (uint32_t i = 0; i < count; i++) {
        const struct queue_entry *e = &settles[i].entry;
        if (e->message == NULL || has_seq(s->entries, s->count, e->seq) ||
            has_seq(delivered->items, known, e->seq))
            continue;
        add_delivered(delivered, e->seq, e->message);
    }
}

struct replica *replica_of_queue(struct queue *queue, const struct queue_held_settle *settles,
                                 uint32_t settles_count)
{
    uint64_t last_seq = queue->next_seq - 1;
    struct queue_surrender s;
    queue_surrender(queue, &s);
    struct entries delivered = {0};
    channels_each_unacked(queue->vhost->broker, queue, add_delivered, &delivered);
    add_settled(&delivered, &s, settles, settles_count);
    uint32_t n = s.count + delivered.count;
    struct replica *r = xcalloc(1, sizeof *r);
    r->log = s.log;
    r->dedup = s.dedup;
    r->origins = s.origins;
    r->last_seq = last_seq;
    uint32_t cap = 64;
    while (cap < n)
        cap *= 2;
    r->ring.entries = xrealloc(s.entries, sizeof *r->ring.entries * cap);
    r->ring.cap = cap;
    if (delivered.count > 0) {
        memcpy(r->ring.entries + s.count, delivered.items,
               sizeof *delivered.items * delivered.count);
        qsort(r->ring.entries, n, sizeof *r->ring.entries, by_seq);
    }
    free(delivered.items);
    r->ring.count = n;
    for (uint32_t i = 0; i < n; i++) {
        struct queue_entry *e = slot(r, i);
        ASSERT(i == 0 || slot(r, i - 1)->seq < e->seq);
        ASSERT(e->seq <= last_seq);
        e->redelivered = 1; /* as any replica's: replica_push */
        r->live++;
        r->live_bytes += body_size(e);
        r->persistent += e->paged || e->message->persistent;
        r->paged += e->paged;
    }
    ASSERT(r->paged == 0 || r->log != NULL); /* paged ones are in the log only */
    return r;
}

uint32_t replica_take_for_merge(struct queue *queue, struct replica *r,
                                struct queue_entry **out)
{
    *out = NULL;
    if (r == NULL)
        return 0;
    queue_adopt_dedup(queue, r->dedup);
    r->dedup = NULL;
    queue_adopt_origins(queue, r->origins);
    r->origins = NULL;
    if (r->log != NULL && r->log == queue->journal)
        r->log = NULL; /* the queue's now (durable_adopt_step starts it over) */
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->ring.count; i++) {
        const struct queue_entry *e = slot(r, i);
        if (!hole(e) && !e->paged)
            n++;
    }
    if (n > 0) {
        *out = xmalloc(sizeof **out * n);
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < r->ring.count; i++) {
        const struct queue_entry *e = slot(r, i);
        if (hole(e) || e->paged)
            continue;
        message_ref(e->message);
        (*out)[k++] = *e;
    }
    LOG_DEBUG("vhost=%.*s queue=%.*s: taken over with %u messages from its replica",
              (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
              (int)queue->name.len, (const char *)queue->name.ptr, n);
    replica_free(r);
    return n;
}

/* ---- a planned handover ---- */

void replica_handover_free(struct replica_handover *h)
{
    if (h == NULL)
        return;
    free(h->delivered);
    free(h->redelivered);
    free(h);
}

/* Appends packed seqs (big-endian u64, ascending, after those there). */
static bool append_seqs(uint64_t **seqs, uint32_t *count, uint32_t *cap, struct bytes packed)
{
    if (packed.len % 8 != 0 || packed.len / 8 > UINT32_MAX - *count)
        return false;
    uint32_t n = (uint32_t)(packed.len / 8);
    if (*count + n > *cap) {
        uint32_t want = *cap ? *cap : 256;
        while (want < *count + n)
            want *= 2;
        *seqs = xrealloc(*seqs, sizeof **seqs * want);
        *cap = want;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int b = 0; b < 8; b++)
            v = v << 8 | packed.ptr[i * 8 + (uint32_t)b];
        if (v == 0 || (*count > 0 && v <= (*seqs)[*count - 1]))
            return false;
        (*seqs)[(*count)++] = v;
    }
    return true;
}

bool replica_note_handover(struct replica *r, uint64_t connection_id, uint16_t channel_id,
                           uint64_t epoch, struct bytes delivered, struct bytes redelivered)
{
    struct replica_handover *h = r->handover;
    if (h == NULL || h->connection_id != connection_id || h->channel_id != channel_id ||
        h->epoch != epoch) {
        replica_handover_free(h);
        h = r->handover = xcalloc(1, sizeof *h);
        h->connection_id = connection_id;
        h->channel_id = channel_id;
        h->epoch = epoch;
    }
    if (!append_seqs(&h->delivered, &h->delivered_count, &h->delivered_cap, delivered) ||
        !append_seqs(&h->redelivered, &h->redelivered_count, &h->redelivered_cap,
                     redelivered)) {
        replica_handover_free(h);
        r->handover = NULL;
        return false;
    }
    return true;
}

struct replica_handover *replica_take_handover(struct replica *r)
{
    struct replica_handover *h = r ? r->handover : NULL;
    if (r)
        r->handover = NULL;
    return h;
}
