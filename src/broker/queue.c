/*
 * queue.c: see queue.h. Dispatch is the hot path: one ring pop and one
 * consumer call per message. Consumers are kept sorted by priority
 * (highest first); after a delivery the chosen consumer moves behind the
 * others of its priority, so equals share a queue round-robin while a
 * lower priority only gets what higher ones cannot take (RabbitMQ's
 * consumer priorities).
 *
 * Expiry (x-message-ttl, per-message expiration) happens at the head, as
 * in RabbitMQ: a message behind an unexpired one waits for it. A timer,
 * allocated only for queues that need it, fires at the earliest head
 * expiry or x-expires deadline so expired messages leave promptly even
 * when nobody reads the queue.
 */
#include "broker/queue.h"

#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/dead_letter.h"
#include "broker/dedup.h"
#include "broker/origin.h"
#include "broker/message.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/ring.h"
#include "lib/bytes.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "store/journal.h"

static uint64_t now_ms(const struct queue *queue)
{
    return uv_now(queue->vhost->broker->loop);
}

/* ---- ring ----------------------------------------------------------- */

static void queue_ring_grow(struct queue_ring *ring)
{
    ring->entries = ring_grow(ring->entries, sizeof *ring->entries, &ring->head, ring->count,
              &ring->cap, 16);
}

static struct queue_entry *ring_slot(struct queue_ring *ring, uint32_t index)
{
    return &ring->entries[(ring->head + index) & (ring->cap - 1)];
}

static void ring_push_back(struct queue_ring *ring, struct queue_entry entry)
{
    if (ring->count == ring->cap)
        queue_ring_grow(ring);
    *ring_slot(ring, ring->count) = entry;
    ring->count++;
}

/* Inserts by seq. Requeued messages are nearly always older than all
 * ready ones, so the scan from the head stops after a few entries. */
static void ring_insert_by_seq(struct queue_ring *ring, struct queue_entry entry)
{
    uint32_t index = 0;
    while (index < ring->count && ring_slot(ring, index)->seq < entry.seq)
        index++;
    if (ring->count == ring->cap)
        queue_ring_grow(ring);
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

/* The ring for a message priority (clamped to the queue's maximum). */
static struct queue_ring *ring_for(struct queue *queue, uint8_t priority)
{
    uint8_t max = queue->args.max_priority;
    if (max == 0 || priority == 0)
        return &queue->ready;
    if (priority > max)
        priority = max;
    return &queue->priority_rings[priority - 1];
}

/* The non-empty ring of highest priority, or NULL. */
static struct queue_ring *head_ring(struct queue *queue)
{
    for (uint32_t level = queue->args.max_priority; level > 0; level--) {
        if (queue->priority_rings[level - 1].count > 0)
            return &queue->priority_rings[level - 1];
    }
    return queue->ready.count > 0 ? &queue->ready : NULL;
}

static uint64_t entry_body_size(const struct queue_entry *entry)
{
    return entry->paged ? entry->paged_body_size : entry->message->body_size;
}

static struct queue_entry pop_entry(struct queue *queue, struct queue_ring *ring)
{
    struct queue_entry entry = ring_pop_front(ring);
    ASSERT(queue->ready_count > 0);
    queue_rates_moved(queue); /* (and what its caller does with it: unacked) */
    queue->ready_count--;
    queue->ready_bytes -= entry_body_size(&entry);
    return entry;
}

/* ---- the journal ---------------------------------------------------- */

/* Only persistent messages on durable queues are logged (RabbitMQ). */
static bool logged(const struct queue *queue, const struct message *message)
{
    return queue->journal != NULL && message->persistent;
}

/* A message left the queue for good: its backups are told (those that
 * hold only transient messages: of a transient one). */
static void replicate_removal(struct queue *queue, uint64_t seq, bool persistent)
{
    if (queue->replication_ops)
        queue->replication_ops->removed(queue, seq, persistent);
}

/* The message leaves the queue for good (ack, reject, expiry, overflow). */
static void forget(struct queue *queue, uint64_t seq, const struct message *message)
{
    if (logged(queue, message))
        journal_ack(queue->journal, seq);
    replicate_removal(queue, seq, message->persistent);
}

/* Reads a paged-out message back from the journal (a synchronous pread on
 * the loop: paging trades that for bounded memory). NULL if the journal
 * cannot produce it, which it reports. */
static struct message *page_in(struct queue *queue, uint64_t seq)
{
    struct journal_location where;
    if (!queue->journal || journal_locate(queue->journal, seq, &where) != OK)
        return NULL;
    uint8_t *blob = xmalloc(where.blob_size ? where.blob_size : 1);
    struct message *message = NULL;
    if (journal_read(queue->journal, seq, blob, where.blob_size) == OK)
        message = message_from_blob(blob, where.blob_size);
    free(blob);
    if (!message)
        LOG_ERROR("vhost=%.*s queue=%.*s cannot read message %llu back from the journal",
                  (int)queue->vhost->name.len, (const char *)queue->vhost->name.ptr,
                  (int)queue->name.len, (const char *)queue->name.ptr, (unsigned long long)seq);
    return message;
}

bool queue_pages(const struct queue *queue)
{
    return queue->args.lazy || alarm_over_paging_limit(&queue->vhost->broker->alarm);
}

struct message *queue_read_paged(struct queue *queue, uint64_t seq)
{
    return page_in(queue, seq);
}

/* Every change of a queue's paged_count goes through these: its vhost's
 * totals follow (vhost.h). */
static void paged_add(struct queue *queue, uint32_t n)
{
    queue->paged_count += n;
    queue->vhost->totals.paged += n;
}

static void paged_remove(struct queue *queue)
{
    ASSERT(queue->paged_count > 0);
    ASSERT(queue->vhost->totals.paged > 0);
    queue->paged_count--;
    queue->vhost->totals.paged--;
}

static void paged_remove_all(struct queue *queue)
{
    ASSERT(queue->vhost->totals.paged >= queue->paged_count);
    queue->vhost->totals.paged -= queue->paged_count;
    queue->paged_count = 0;
}

/* Makes a popped entry's message resident. False if it is lost. */
static bool resident(struct queue *queue, struct queue_entry *entry)
{
    if (!entry->paged)
        return true;
    struct message *message = page_in(queue, entry->seq);
    paged_remove(queue);
    if (!message)
        return false;
    entry->paged = 0;
    entry->message = message;
    return true;
}

/* A ready entry leaves without being delivered (expiry, overflow). */
static void discard(struct queue *queue, struct queue_entry entry, enum dead_letter_reason reason)
{
    if (entry.paged) {
        if (queue->journal)
            journal_ack(queue->journal, entry.seq);
        replicate_removal(queue, entry.seq, true); /* (only persistent ones page) */
        /* Only a dead-letter exchange needs the body back. */
        if (!queue->args.has_dead_letter_exchange) {
            paged_remove(queue);
            return;
        }
        if (!resident(queue, &entry))
            return;
        dead_letter(queue, entry.message, reason);
        return;
    }
    forget(queue, entry.seq, entry.message);
    dead_letter(queue, entry.message, reason);
}

uint64_t queue_page_out(struct queue *queue, uint64_t wanted)
{
    if (!queue->journal || queue->deleted)
        return 0;
    uint64_t released = 0;
    for (uint32_t level = 0; level <= queue->args.max_priority && released < wanted; level++) {
        struct queue_ring *ring =
            level == 0 ? &queue->ready : &queue->priority_rings[level - 1];
        for (uint32_t i = ring->count; i-- > 0 && released < wanted;) {
            struct queue_entry *entry = ring_slot(ring, i);
            if (entry->paged || !logged(queue, entry->message))
                continue;
            uint64_t size = entry->message->body_size;
            if (queue->replication_ops)
                queue->replication_ops->paged(queue, entry->seq);
            message_unref(entry->message);
            entry->paged_body_size = size;
            entry->paged = 1;
            paged_add(queue, 1);
            released += size;
        }
    }
    return released;
}

/* ---- lifecycle ------------------------------------------------------ */

struct queue *queue_new(struct vhost *vhost, struct bytes name, bool durable, bool exclusive,
                        bool auto_delete, struct bytes arguments)
{
    struct queue *queue = xcalloc(1, sizeof *queue);
    bind_dest_init(&queue->as_dest, BIND_DEST_QUEUE);
    queue->vhost = vhost;
    queue->name = bytes_dup(name);
    queue->durable = durable;
    queue->exclusive = exclusive;
    queue->auto_delete = auto_delete;
    queue->arguments = bytes_dup(arguments);
    uint16_t code;
    char text[256];
    /* Parse the queue's own copy so the parsed slices live as long as it. */
    bool ok = queue_args_parse((struct table){queue->arguments.ptr, queue->arguments.len},
                               queue->name, vhost->name, &queue->args, &code, text, sizeof text);
    ASSERT(ok); /* the channel validated the same bytes before declaring */
    if (queue->args.max_priority > 0) {
        queue->priority_rings = xcalloc(queue->args.max_priority, sizeof *queue->priority_rings);
    }
    list_init(&queue->consumers);
    flow_queue_init(queue);
    list_init(&queue->owner_link);
    list_init(&queue->all_link); /* joins broker->queues_all with a table (vhost.c) */
    queue->refs = 1;
    queue->next_seq = 1; /* 0 is "none" to the journal */
    queue->last_used_ms = now_ms(queue);
    struct broker *broker = vhost->broker;
    queue->rates.part = broker->rates_next_part;
    broker->rates_next_part = (uint8_t)((broker->rates_next_part + 1) % BROKER_RATES_PARTS);
    queue_rates_join(queue); /* its first sample: the values its rates start from */
    return queue;
}

void queue_rates_join(struct queue *queue)
{
    if (queue->deleted)
        return; /* retired (queue_delete): its counts are no one's total */
    struct broker *broker = queue->vhost->broker;
    rates_join(&broker->queues_active[queue->rates.part], &queue->rates);
}

/* The queue leaves the totals and its active list for good: deleted, or
 * freed. Twice is harmless (its newest is zero after the first). */
static void rates_retire(struct queue *queue)
{
    struct broker *broker = queue->vhost->broker;
    rates_leave(&broker->queues_active[queue->rates.part], &queue->rates);
    broker->rates_totals[BROKER_TOTALS_RATE_READY] -= queue->rates.newest[QUEUE_RATE_READY];
    broker->rates_totals[BROKER_TOTALS_RATE_UNACKED] -= queue->rates.newest[QUEUE_RATE_UNACKED];
    struct vhost_totals *vt = &queue->vhost->totals;
    ASSERT(vt->ready_sampled >= queue->rates.newest[QUEUE_RATE_READY]);
    ASSERT(vt->unacked_sampled >= queue->rates.newest[QUEUE_RATE_UNACKED]);
    vt->ready_sampled -= queue->rates.newest[QUEUE_RATE_READY];
    vt->unacked_sampled -= queue->rates.newest[QUEUE_RATE_UNACKED];
    memset(queue->rates.newest, 0, sizeof queue->rates.newest);
    rates_free(&queue->rates);
}

static void on_timer_closed(uv_handle_t *handle)
{
    free(handle);
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
    ASSERT(queue->ready_count == 0);
    ASSERT(list_empty(&queue->consumers));
    ASSERT(queue->as_dest.bindings_in_count == 0);
    ASSERT(queue->pause == NULL);
    flow_queue_release(queue);
    if (queue->remote_ops)
        queue->remote_ops->free(queue);
    if (queue->replication_ops)
        queue->replication_ops->detach(queue);
    if (queue->dedup) {
        dedup_free(queue->dedup);
        free(queue->dedup);
    }
    free(queue->origins);
    if (queue->timer) {
        queue->timer->data = NULL;
        uv_close((uv_handle_t *)queue->timer, on_timer_closed);
    }
    free(queue->ready.entries);
    for (uint32_t i = 0; i < queue->args.max_priority; i++)
        free(queue->priority_rings[i].entries);
    free(queue->priority_rings);
    if (queue->deleted)
        rates_free(&queue->rates); /* retired already (its vhost may be gone) */
    else
        rates_retire(queue);       /* never in a table, or never deleted */
    list_remove(&queue->all_link); /* only now: queue_walk.h says why */
    bytes_free(&queue->name);
    bytes_free(&queue->arguments);
    free(queue);
}

void queue_sample_rates(struct queue *queue, const struct rates_clock *clock, uint32_t *totals)
{
    const struct queue_stats *s = &queue->stats;
    uint32_t values[QUEUE_RATE_COUNT] = {
        [QUEUE_RATE_PUBLISH] = (uint32_t)s->publish,
        [QUEUE_RATE_DELIVER] = (uint32_t)s->deliver,
        [QUEUE_RATE_DELIVER_NO_ACK] = (uint32_t)s->deliver_no_ack,
        [QUEUE_RATE_GET] = (uint32_t)s->get,
        [QUEUE_RATE_GET_NO_ACK] = (uint32_t)s->get_no_ack,
        [QUEUE_RATE_REDELIVER] = (uint32_t)s->redeliver,
        [QUEUE_RATE_ACK] = (uint32_t)s->ack,
        [QUEUE_RATE_MESSAGES] = queue->ready_count + queue->unacked_count,
        [QUEUE_RATE_READY] = queue->ready_count,
        [QUEUE_RATE_UNACKED] = queue->unacked_count,
    };
    uint32_t ready = queue->rates.newest[QUEUE_RATE_READY];
    uint32_t unacked = queue->rates.newest[QUEUE_RATE_UNACKED];
    rates_sample(&queue->rates, clock, values, QUEUE_RATE_COUNT);
    totals[BROKER_TOTALS_RATE_READY] += queue->rates.newest[QUEUE_RATE_READY] - ready;
    totals[BROKER_TOTALS_RATE_UNACKED] += queue->rates.newest[QUEUE_RATE_UNACKED] - unacked;
    struct vhost_totals *vt = &queue->vhost->totals;
    vt->ready_sampled = vt->ready_sampled - ready + queue->rates.newest[QUEUE_RATE_READY];
    vt->unacked_sampled = vt->unacked_sampled - unacked + queue->rates.newest[QUEUE_RATE_UNACKED];
}

/* ---- expiry and timers ---------------------------------------------- */

static void schedule_timer(struct queue *queue);

/* Drops expired messages at the head of each level; returns how many. */
static uint32_t drop_expired(struct queue *queue, uint64_t now)
{
    uint32_t dropped = 0;
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        struct queue_ring *ring =
            level == 0 ? &queue->ready : &queue->priority_rings[level - 1];
        while (ring->count > 0) {
            struct queue_entry *head = ring_slot(ring, 0);
            if (head->expires_at_ms == 0 || head->expires_at_ms > now)
                break;
            discard(queue, pop_entry(queue, ring), DEAD_LETTER_EXPIRED);
            dropped++;
        }
    }
    return dropped;
}

static bool expires_applies(const struct queue *queue)
{
    return queue->args.expires_ms > 0 && queue->consumers_count == 0;
}

static void on_timer(uv_timer_t *timer)
{
    struct queue *queue = timer->data;
    if (!queue || queue->deleted)
        return;
    uint64_t now = now_ms(queue);
    if (expires_applies(queue) &&
        now >= queue->last_used_ms + (uint64_t)queue->args.expires_ms) {
        /* Unused for x-expires: delete it, as RabbitMQ does. */
        vhost_queue_discard(queue->vhost, queue);
        return;
    }
    drop_expired(queue, now);
    schedule_timer(queue);
}

static void schedule_timer(struct queue *queue)
{
    uint64_t deadline = UINT64_MAX;
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        struct queue_ring *ring =
            level == 0 ? &queue->ready : &queue->priority_rings[level - 1];
        if (ring->count > 0 && ring_slot(ring, 0)->expires_at_ms != 0 &&
            ring_slot(ring, 0)->expires_at_ms < deadline)
            deadline = ring_slot(ring, 0)->expires_at_ms;
    }
    if (expires_applies(queue)) {
        uint64_t unused_deadline = queue->last_used_ms + (uint64_t)queue->args.expires_ms;
        if (unused_deadline < deadline)
            deadline = unused_deadline;
    }
    if (deadline == UINT64_MAX) {
        if (queue->timer)
            uv_timer_stop(queue->timer);
        return;
    }
    if (!queue->timer) {
        queue->timer = xmalloc(sizeof *queue->timer);
        uv_timer_init(queue->vhost->broker->loop, queue->timer);
        /* While serving, the listeners keep the loop alive; a pending TTL
         * alone must not keep a stopping broker from exiting. */
        uv_unref((uv_handle_t *)queue->timer);
        queue->timer->data = queue;
    }
    uint64_t now = now_ms(queue);
    uv_timer_start(queue->timer, on_timer, deadline > now ? deadline - now : 0, 0);
}

void queue_touch(struct queue *queue)
{
    if (queue->remote_ops)
        return; /* x-expires is the primary's business */
    queue->last_used_ms = now_ms(queue);
    if (queue->args.expires_ms > 0)
        schedule_timer(queue);
}

/* ---- messages ------------------------------------------------------- */

static bool over_limit(const struct queue *queue, uint32_t extra_count, uint64_t extra_bytes)
{
    const struct queue_args *a = &queue->args;
    if (a->max_length >= 0 && (int64_t)(queue->ready_count + extra_count) > a->max_length)
        return true;
    if (a->max_length_bytes >= 0 &&
        (int64_t)(queue->ready_bytes + extra_bytes) > a->max_length_bytes)
        return true;
    return false;
}

/* The loop time at which the message expires in this queue (0: never):
 * the smaller of the queue's x-message-ttl and the message's expiration. */
static uint64_t expiry_for(const struct queue *queue, const struct message *message)
{
    int64_t ttl = queue->args.message_ttl_ms;
    if (message->expiration_ms >= 0 && (ttl < 0 || message->expiration_ms < ttl))
        ttl = message->expiration_ms;
    if (ttl < 0)
        return 0;
    uint64_t at = now_ms(queue) + (uint64_t)ttl;
    return at == 0 ? 1 : at;
}

/* ---- de-duplication (x-quay-dedup-window) --------------------------- */

static bool dedups(const struct queue *queue)
{
    return queue->args.quay_dedup_window_ms > 0;
}

/* The message-id this queue de-duplicates on: empty if it has no window
 * (other queues never decode the properties for it). */
static struct bytes dedup_id(const struct queue *queue, const struct message *message)
{
    return dedups(queue) ? message_id(message) : (struct bytes){0};
}

/* Was id enqueued here within the window? Then the publisher's confirm
 * waits for the original's fsync, as the original's own confirm does (it
 * may still be in flight on another channel). */
static bool is_duplicate(struct queue *queue, struct bytes id, struct publish_wait *wait)
{
    uint64_t ticket = 0;
    if (queue->dedup == NULL || !dedup_seen(queue->dedup, id, now_ms(queue), &ticket))
        return false;
    if (wait && ticket > wait->ticket)
        wait->ticket = ticket;
    /* ... and for the original's backups: what this queue holds so far. */
    if (queue->replication_ops && queue->next_seq > 1)
        queue->replication_ops->wait_for(queue, queue->next_seq - 1, wait);
    return true;
}

static void remember_id(struct queue *queue, struct bytes id, uint64_t ticket)
{
    if (id.len == 0)
        return; /* no id (or no window): do not even allocate a table */
    if (queue->dedup == NULL) {
        queue->dedup = xmalloc(sizeof *queue->dedup);
        dedup_init(queue->dedup, (uint64_t)queue->args.quay_dedup_window_ms);
    }
    dedup_record(queue->dedup, id, now_ms(queue), ticket);
}

void queue_adopt_dedup(struct queue *queue, struct dedup *table)
{
    if (table == NULL)
        return;
    ASSERT(dedups(queue) && table->window_ms == (uint64_t)queue->args.quay_dedup_window_ms);
    if (queue->dedup) {
        dedup_free(queue->dedup);
        free(queue->dedup);
    }
    queue->dedup = table;
}

/* ---- forwards sent again (origin.h) -------------------------------- */

bool queue_origin_duplicate(struct queue *queue, uint64_t stream, uint64_t seq,
                            struct publish_wait *wait)
{
    uint64_t ticket = 0;
    if (queue->origins == NULL ||
        !origin_seen(queue->origins, stream, seq, now_ms(queue), &ticket))
        return false;
    if (wait && ticket > wait->ticket)
        wait->ticket = ticket;
    if (queue->replication_ops && queue->next_seq > 1)
        queue->replication_ops->wait_for(queue, queue->next_seq - 1, wait);
    return true;
}

void queue_origin_record(struct queue *queue, uint64_t stream, uint64_t seq, uint64_t ticket)
{
    if (stream == 0)
        return;
    if (queue->origins == NULL) {
        queue->origins = xcalloc(1, sizeof *queue->origins);
    }
    origin_record(queue->origins, stream, seq, now_ms(queue), ticket);
}

enum queue_publish_result queue_publish_forward(struct queue *queue, struct message *message,
                                                const struct queue_forwarded *f,
                                                struct publish_wait *wait)
{
    ASSERT(wait != NULL);
    bool local = !queue_is_remote(queue);
    if (local && f->origin_stream != 0 &&
        queue_origin_duplicate(queue, f->origin_stream, f->origin_seq, wait)) {
        queue->vhost->broker->counters.forward_duplicates++;
        return QUEUE_PUBLISH_DUPLICATE;
    }
    /* (Not what a paused queue holds: it may refuse it when it resumes.) */
    bool records = local && f->record && !f->resent && f->origin_stream != 0 &&
                   !queue_paused(queue);
    if (records) { /* the backups record it too (replication.c) */
        wait->origin_stream = f->origin_stream;
        wait->origin_seq = f->origin_seq;
    }
    wait->maybe_delivered = f->resent;
    enum queue_publish_result r = f->dead_lettered
                                      ? queue_publish_dead_lettered(queue, message, wait)
                                      : queue_publish(queue, message, wait);
    wait->origin_stream = wait->origin_seq = 0;
    wait->maybe_delivered = false;
    if (records && r != QUEUE_PUBLISH_REJECTED && r != QUEUE_PUBLISH_UNAVAILABLE)
        queue_origin_record(queue, f->origin_stream, f->origin_seq, wait->ticket);
    return r;
}

void queue_adopt_origins(struct queue *queue, struct origin_marks *marks)
{
    if (marks == NULL)
        return;
    free(queue->origins);
    queue->origins = marks;
}

/* ---- publishing ----------------------------------------------------- */

static enum queue_publish_result enqueue(struct queue *queue, struct message *message,
                                         struct publish_wait *wait, bool holds_back_duplicates)
{
    ASSERT(!queue->deleted);
    ASSERT(!queue->remote_ops); /* a stand-in forwards (queue_publish) */
    /* Before the length limit: the original is in (or went through) the
     * queue, so a resend is confirmed even when the queue is full now. */
    struct bytes id = dedup_id(queue, message); /* borrows from the message */
    if (holds_back_duplicates && is_duplicate(queue, id, wait))
        return QUEUE_PUBLISH_DUPLICATE;
    if (queue->args.overflow != QUEUE_OVERFLOW_DROP_HEAD &&
        over_limit(queue, 1, message->body_size)) {
        if (queue->args.overflow == QUEUE_OVERFLOW_REJECT_PUBLISH_DLX) {
            message_ref(message);
            dead_letter(queue, message, DEAD_LETTER_MAXLEN);
        }
        return QUEUE_PUBLISH_REJECTED;
    }
    message_ref(message);
    struct queue_entry entry = {.message = message, .seq = queue->next_seq++,
                                .redelivered = wait != NULL && wait->maybe_delivered,
                                .expires_at_ms = expiry_for(queue, message)};
    uint64_t t = 0;
    if (logged(queue, message)) {
        struct bytes blob = message_blob(message);
        t = journal_publish(queue->journal, entry.seq, blob.ptr, blob.len);
        if (wait && t > wait->ticket)
            wait->ticket = t;
    }
    remember_id(queue, id, t);
    if (queue->replication_ops)
        queue->replication_ops->published(queue, entry.seq, message, wait);
    ring_push_back(ring_for(queue, message->priority), entry);
    queue_rates_moved(queue);
    queue->stats.publish += holds_back_duplicates; /* a dead-lettering is no publish */
    queue->ready_count++;
    queue->ready_bytes += message->body_size;
    flow_queue_published(queue, message->body_size); /* before dispatch may take it */
    /* drop-head: the oldest ready messages make room (and are dead-lettered). */
    while (queue->ready_count > 0 && over_limit(queue, 0, 0)) {
        discard(queue, pop_entry(queue, head_ring(queue)), DEAD_LETTER_MAXLEN);
    }
    queue_dispatch(queue);
    /* A lazy queue keeps its backlog on disk only (x-queue-mode=lazy); any
     * durable queue does once memory is past the paging limit. Both page
     * the tail, which is this message: O(1). */
    if (queue->ready_count > queue->paged_count && queue->journal &&
        queue_pages(queue))
        queue_page_out(queue, message->body_size);
    if (entry.expires_at_ms != 0) {
        /* A TTL of 0 means "deliver now or never" (RabbitMQ): dispatch
         * above could still take it; the sweep at "now" drops it if not. */
        drop_expired(queue, now_ms(queue));
        schedule_timer(queue);
    }
    return QUEUE_PUBLISH_OK;
}

/* Stand-ins forward (their primary enqueues); each forward's answer is
 * one more the publisher's confirm waits for. */
static void forward(struct queue *const *stubs, uint32_t count, struct message *message,
                    struct publish_wait *wait, bool dead_lettered,
                    struct queue_publish_summary *out)
{
    ASSERT(count > 0 && stubs[0]->remote_ops != NULL);
    struct queue_forward fwd = {.message = message, .sink = wait ? wait->sink : NULL,
                                .seq = wait ? wait->seq : 0, .dead_lettered = dead_lettered};
    stubs[0]->remote_ops->forward(stubs, count, &fwd);
    for (uint32_t i = 0; i < count && !dead_lettered; i++) {
        queue_rates_moved(stubs[i]);
        stubs[i]->stats.publish++;
    }
    ASSERT(fwd.unavailable <= count);
    if (fwd.sink)
        wait->remote += fwd.answers;
    if (wait)
        wait->flow |= fwd.flow;
    out->unavailable += fwd.unavailable;
}

/* A paused queue holds the publish; its publisher's confirm owes one more
 * answer, given when it is enqueued here or sent on (queue_pause). */
static void hold_publish(struct queue *queue, struct message *message, struct publish_wait *wait,
                         bool dead_lettered)
{
    struct queue_pause *p = queue->pause;
    if (p->count == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->held = xrealloc(p->held, sizeof *p->held * p->cap);
    }
    struct confirm_sink *sink = wait ? wait->sink : NULL;
    message_ref(message);
    if (sink) {
        confirm_sink_ref(sink);
        wait->remote++;
    }
    p->held[p->count++] = (struct queue_held_publish){
        .message = message, .sink = sink, .seq = wait ? wait->seq : 0,
        .dead_lettered = dead_lettered, .maybe_delivered = wait && wait->maybe_delivered};
}

static enum queue_publish_result publish_one(struct queue *queue, struct message *message,
                                             struct publish_wait *wait, bool dead_lettered)
{
    bool from_peer = wait != NULL && wait->from_peer;
    if (queue->unreadable)
        return QUEUE_PUBLISH_UNAVAILABLE;
    if (queue->pause != NULL && (queue->pause->standing || !from_peer)) {
        hold_publish(queue, message, wait, dead_lettered);
        return QUEUE_PUBLISH_OK;
    }
    if (queue->remote_ops == NULL)
        return enqueue(queue, message, wait, !dead_lettered);
    struct queue_publish_summary summary = {0};
    forward(&queue, 1, message, wait, dead_lettered, &summary);
    return summary.unavailable ? QUEUE_PUBLISH_UNAVAILABLE : QUEUE_PUBLISH_OK;
}

enum queue_publish_result queue_publish(struct queue *queue, struct message *message,
                                        struct publish_wait *wait)
{
    return publish_one(queue, message, wait, false);
}

enum queue_publish_result queue_publish_dead_lettered(struct queue *queue,
                                                      struct message *message,
                                                      struct publish_wait *wait)
{
    return publish_one(queue, message, wait, true);
}

#define ROUTED_STUBS_BATCH 256

void queue_publish_routed(struct queue *const *queues, uint32_t count, struct message *message,
                          struct publish_wait *wait, bool dead_lettered,
                          struct queue_publish_summary *out)
{
    *out = (struct queue_publish_summary){0};
    struct queue *stubs[ROUTED_STUBS_BATCH];
    uint32_t stubs_count = 0;
    for (uint32_t i = 0; i < count; i++) {
        struct queue *queue = queues[i];
        if (queue->remote_ops != NULL) {
            /* Gathered: every stand-in has the proxy's ops. */
            ASSERT(stubs_count == 0 || stubs[0]->remote_ops == queue->remote_ops);
            stubs[stubs_count++] = queue;
            if (stubs_count == ROUTED_STUBS_BATCH) {
                forward(stubs, stubs_count, message, wait, dead_lettered, out);
                stubs_count = 0;
            }
            continue;
        }
        if (queue->unreadable)
            out->unavailable++;
        else if (queue->pause != NULL)
            hold_publish(queue, message, wait, dead_lettered);
        else if (enqueue(queue, message, wait, !dead_lettered) == QUEUE_PUBLISH_REJECTED)
            out->rejected++;
    }
    if (stubs_count > 0)
        forward(stubs, stubs_count, message, wait, dead_lettered, out);
}

/* A paused queue's delivery is settled: held, in order (its message
 * reference with it). True if held. */
static bool hold_settle(struct queue *queue, enum queue_settle_kind kind,
                        struct queue_entry entry)
{
    struct queue_pause *p = queue->pause;
    if (p == NULL || !p->standing || queue->remote_ops != NULL || queue->deleted)
        return false;
    if (p->settles_count == p->settles_cap) {
        p->settles_cap = p->settles_cap ? p->settles_cap * 2 : 64;
        p->settles = xrealloc(p->settles, sizeof *p->settles * p->settles_cap);
    }
    p->settles[p->settles_count++] = (struct queue_held_settle){kind, entry};
    return true;
}

void queue_requeue(struct queue *queue, struct queue_entry entry)
{
    ASSERT(queue->unacked_count > 0);
    if (hold_settle(queue, QUEUE_SETTLE_REQUEUE, entry))
        return;
    queue_rates_moved(queue);
    queue->unacked_count--;
    /* A stand-in replaced meanwhile (a promotion here, a handover) still
     * gives it back where it came from: its primary, or its relay. */
    if (queue->remote_ops)
        queue->remote_ops->release(queue, entry.seq);
    if (queue->deleted || queue->remote_ops) {
        message_unref(entry.message);
        return;
    }
    entry.redelivered = 1;
    ring_insert_by_seq(ring_for(queue, entry.message->priority), entry);
    queue->ready_count++;
    queue->ready_bytes += entry.message->body_size;
    if (entry.expires_at_ms != 0)
        schedule_timer(queue);
}

void queue_adopt(struct queue *queue, struct queue_adoption *adoption)
{
    ASSERT(!queue->deleted && !queue->remote_ops);
    struct queue_adoption a = *adoption;
    *adoption = (struct queue_adoption){0};
    if (a.ring.count == 0) {
        free(a.ring.entries);
        return;
    }
    /* Into a fresh queue (its seqs may already be past them: the log it
     * opened is the replica's, with these very messages in it). */
    ASSERT(queue->ready_count == 0 && queue->unacked_count == 0);
    uint64_t last = ring_slot(&a.ring, a.ring.count - 1)->seq;
    if (queue->next_seq <= last)
        queue->next_seq = last + 1;
    for (uint32_t i = 0; queue->journal && a.persistent > 0 && i < a.ring.count; i++) {
        struct message *message = ring_slot(&a.ring, i)->message;
        if (message->persistent) {
            struct bytes blob = message_blob(message);
            journal_publish(queue->journal, ring_slot(&a.ring, i)->seq, blob.ptr, blob.len);
            a.persistent--;
        }
    }
    queue_rates_moved(queue);
    queue->ready_count += a.ring.count;
    queue->ready_bytes += a.bytes;
    paged_add(queue, a.paged);
    ASSERT(a.paged == 0 || (queue->journal && queue->args.max_priority == 0));
    if (queue->args.max_priority == 0 && queue->ready.count == 0) {
        free(queue->ready.entries);
        queue->ready = a.ring; /* O(1): the usual case, a fresh queue */
        return;
    }
    for (uint32_t i = 0; i < a.ring.count; i++) {
        struct queue_entry entry = *ring_slot(&a.ring, i);
        ring_push_back(ring_for(queue, entry.message->priority), entry);
    }
    free(a.ring.entries);
}

static struct queue_ring *level_ring(struct queue *queue, uint32_t level);

static int entry_seq_order(const void *a, const void *b)
{
    uint64_t x = ((const struct queue_entry *)a)->seq, y = ((const struct queue_entry *)b)->seq;
    return x < y ? -1 : x > y;
}

void queue_surrender(struct queue *queue, struct queue_surrender *out)
{
    ASSERT(!queue->deleted && !queue->remote_ops);
    *out = (struct queue_surrender){0};
    uint32_t n = queue->ready_count;
    out->entries = xmalloc(sizeof *out->entries * (n ? n : 1));
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        struct queue_ring *ring = level_ring(queue, level);
        for (uint32_t i = 0; i < ring->count; i++)
            out->entries[out->count++] = *ring_slot(ring, i);
        ring->head = ring->count = 0;
    }
    ASSERT(out->count == n);
    if (queue->args.max_priority > 0 && n > 1) /* one ring per priority */
        qsort(out->entries, n, sizeof *out->entries, entry_seq_order);
    queue_rates_moved(queue);
    queue->ready_count = 0;
    queue->ready_bytes = 0;
    queue->paged_count = 0;
    out->log = queue->journal;
    queue->journal = NULL;
    out->dedup = queue->dedup;
    queue->dedup = NULL;
    out->origins = queue->origins;
    queue->origins = NULL;
}

void queue_recover_message(struct queue *queue, struct message *message, uint64_t seq,
                           bool delivered)
{
    ASSERT(!queue->deleted);
    ASSERT(seq >= queue->next_seq); /* the journal hands them over in order */
    message_ref(message);
    /* The original publish time is not stored: TTLs count from recovery,
     * and so does the dedup window of the ids still in the queue (those
     * of messages consumed before the restart are forgotten). */
    remember_id(queue, dedup_id(queue, message), 0);
    ring_push_back(ring_for(queue, message->priority),
                   (struct queue_entry){.message = message, .seq = seq, .redelivered = delivered,
                                        .expires_at_ms = expiry_for(queue, message)});
    queue_rates_moved(queue);
    queue->ready_count++;
    queue->ready_bytes += message->body_size;
    queue->next_seq = seq + 1;
    schedule_timer(queue);
}

void queue_settle(struct queue *queue, uint64_t seq, const struct message *message)
{
    ASSERT(queue->unacked_count > 0);
    if (queue_paused(queue) && !queue->deleted) {
        message_ref((struct message *)message); /* the caller keeps its own */
        hold_settle(queue, QUEUE_SETTLE_ACK,
                    (struct queue_entry){.message = (struct message *)message, .seq = seq});
        return;
    }
    queue_rates_moved(queue);
    queue->unacked_count--;
    if (queue->remote_ops)
        queue->remote_ops->ack(queue, seq); /* (a replaced stand-in's too: see requeue) */
    else if (!queue->deleted)
        forget(queue, seq, message);
}

void queue_reject(struct queue *queue, uint64_t seq, struct message *message)
{
    if (queue->remote_ops) {
        ASSERT(queue->unacked_count > 0);
        queue_rates_moved(queue);
        queue->unacked_count--;
        queue->remote_ops->reject(queue, seq);
        message_unref(message);
        return;
    }
    if (hold_settle(queue, QUEUE_SETTLE_REJECT,
                    (struct queue_entry){.message = message, .seq = seq}))
        return;
    queue_settle(queue, seq, message);
    if (queue->deleted) {
        message_unref(message);
        return;
    }
    dead_letter(queue, message, DEAD_LETTER_REJECTED);
}

bool queue_take(struct queue *queue, struct queue_entry *out)
{
    if (queue->ready_count == 0 || queue_paused(queue))
        return false; /* (paused: standing still for a handover) */
    uint64_t now = now_ms(queue);
    for (;;) {
        struct queue_ring *ring = head_ring(queue);
        if (!ring)
            return false;
        *out = pop_entry(queue, ring);
        /* Strictly after its stamp: a TTL-0 message may still be taken
         * in the very millisecond it was published. */
        if (out->expires_at_ms != 0 && out->expires_at_ms < now) {
            discard(queue, *out, DEAD_LETTER_EXPIRED);
            continue;
        }
        if (!resident(queue, out)) {
            /* The journal could not give it back (and said why); it is
             * acked there so recovery does not return it in a loop. */
            journal_ack(queue->journal, out->seq);
            replicate_removal(queue, out->seq, true);
            continue;
        }
        break;
    }
    flow_queue_taken(queue, out->message->body_size);
    /* Recovery marks it redelivered if it was handed out before a crash. */
    if (logged(queue, out->message) && !out->redelivered)
        journal_delivered(queue->journal, out->seq);
    queue->unacked_count++;
    return true;
}

/* Whether seq is in seqs[0..n) (ascending); *at: where. */
static bool find_seq(const uint64_t *seqs, uint32_t n, uint64_t seq, uint32_t *at)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (seqs[mid] < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    *at = lo;
    return lo < n && seqs[lo] == seq;
}

static struct queue_ring *level_ring(struct queue *queue, uint32_t level)
{
    return level == 0 ? &queue->ready : &queue->priority_rings[level - 1];
}

void queue_take_delivered(struct queue *queue, const uint64_t *seqs, uint32_t n,
                          struct queue_entry *out, bool *found)
{
    memset(found, 0, sizeof *found * n);
    for (uint32_t level = 0; n > 0 && level <= queue->args.max_priority; level++) {
        struct queue_ring *ring = level_ring(queue, level);
        uint32_t kept = 0;
        for (uint32_t i = 0; i < ring->count; i++) {
            struct queue_entry e = *ring_slot(ring, i);
            uint32_t k;
            if (!find_seq(seqs, n, e.seq, &k)) {
                *ring_slot(ring, kept++) = e;
                continue;
            }
            queue_rates_moved(queue);
            queue->ready_count--;
            queue->ready_bytes -= entry_body_size(&e);
            if (!resident(queue, &e)) {
                journal_ack(queue->journal, e.seq); /* lost from the journal (logged) */
                replicate_removal(queue, e.seq, true);
                continue;
            }
            if (logged(queue, e.message) && !e.redelivered)
                journal_delivered(queue->journal, e.seq);
            queue->unacked_count++;
            out[k] = e;
            found[k] = true;
        }
        ring->count = kept;
    }
}

void queue_set_redelivered(struct queue *queue, const uint64_t *seqs, uint32_t n)
{
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        struct queue_ring *ring = level_ring(queue, level);
        for (uint32_t i = 0; i < ring->count; i++) {
            uint32_t k;
            ring_slot(ring, i)->redelivered = find_seq(seqs, n, ring_slot(ring, i)->seq, &k);
        }
    }
}

static int seq_order(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint32_t queue_redelivered_seqs(struct queue *queue, uint64_t **out)
{
    uint32_t n = 0, cap = 0;
    *out = NULL;
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        struct queue_ring *ring = level_ring(queue, level);
        for (uint32_t i = 0; i < ring->count; i++) {
            if (!ring_slot(ring, i)->redelivered)
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                *out = xrealloc(*out, sizeof **out * cap);
            }
            (*out)[n++] = ring_slot(ring, i)->seq;
        }
    }
    if (n > 1)
        qsort(*out, n, sizeof **out, seq_order); /* (one ring per priority) */
    return n;
}

bool queue_holds_ready(struct queue *queue, uint64_t seq)
{
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        struct queue_ring *ring = level_ring(queue, level);
        uint32_t lo = 0, hi = ring->count; /* a ring is in seq order */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (ring_slot(ring, mid)->seq < seq)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < ring->count && ring_slot(ring, lo)->seq == seq)
            return true;
    }
    return false;
}

/* The ready messages of seqs first..last, all of them, leave the queue
 * (a purge's run): the backups and the log are told in one record each. */
static void forget_run(struct queue *queue, uint64_t first, uint64_t last)
{
    if (queue->journal)
        journal_ack_range(queue->journal, first, last); /* (transient ones are not in it) */
    if (queue->replication_ops)
        queue->replication_ops->removed_run(queue, first, last);
}

/* The ready messages in seq order across the priority levels (each level's
 * ring is in seq order): the next one's seq, or 0 when none is left.
 * at[level] is that level's cursor. A scan of the levels a message, which
 * for a purge costs its levels x its messages, once. */
static uint64_t next_ready_seq(struct queue *queue, uint32_t *at)
{
    uint64_t best = 0;
    uint32_t best_level = 0;
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        struct queue_ring *ring = level_ring(queue, level);
        if (at[level] < ring->count) {
            uint64_t seq = ring_slot(ring, at[level])->seq;
            if (best == 0 || seq < best) {
                best = seq;
                best_level = level;
            }
        }
    }
    if (best != 0)
        at[best_level]++;
    return best;
}

/* A purge's run being found: seqs first..last so far (first 0: none). */
struct purge_run {
    uint64_t first, last;
};

static void purge_run_add(struct queue *queue, struct purge_run *run, uint64_t seq)
{
    if (run->first != 0 && seq == run->last + 1) {
        run->last = seq;
        return;
    }
    if (run->first != 0)
        forget_run(queue, run->first, run->last);
    run->first = run->last = seq;
}

uint32_t queue_purge(struct queue *queue)
{
    uint32_t count = queue->ready_count;
    /* The unacked messages survive a purge (RabbitMQ), so what goes is told
     * as runs of consecutive seqs, every one of them ready: no other
     * message can be inside one. A queue nobody consumes is one run, and
     * one consumed is usually one behind its unacked ones; a priority
     * queue's levels are merged first, or its runs would be single
     * messages. A message at a time, a million took the log and the
     * backups 0.1-0.35 s of the primary's loop and as long of each
     * backup's. */
    struct purge_run run = {0, 0};
    if (queue->args.max_priority == 0) {
        for (uint32_t i = 0; i < queue->ready.count; i++)
            purge_run_add(queue, &run, ring_slot(&queue->ready, i)->seq);
    } else {
        uint32_t at[256] = {0}; /* (max_priority <= 255) */
        for (uint64_t seq; (seq = next_ready_seq(queue, at)) != 0;)
            purge_run_add(queue, &run, seq);
    }
    if (run.first != 0)
        forget_run(queue, run.first, run.last);
    /* The messages go to the broker's reclaim, a slice at a time: a deep
     * queue let go of in one loop turn held the loop ~10 ms for 200,000
     * (the old primary of a planned move, a purge, a delete). Every
     * paged entry is a ready one: none is left. */
    for (uint32_t level = 0; level <= queue->args.max_priority; level++) {
        struct queue_ring *ring = level_ring(queue, level);
        queue->ready_count -= ring->count;
        reclaim_ring(&queue->vhost->broker->reclaim, ring);
    }
    paged_remove_all(queue);
    queue_rates_moved(queue);
    ASSERT(queue->ready_count == 0);
    queue->ready_bytes = 0;
    return count;
}

/* The consumer to deliver to next, or NULL. With single-active-consumer
 * only the active one may take messages. */
static struct consumer *choose_consumer(struct queue *queue)
{
    if (queue->args.single_active_consumer) {
        struct consumer *active = queue->active_consumer;
        return active && active->ops->can_take(active) ? active : NULL;
    }
    list_for_each(node, &queue->consumers) {
        struct consumer *consumer = CONTAINER_OF(node, struct consumer, queue_link);
        if (consumer->ops->can_take(consumer))
            return consumer;
    }
    return NULL;
}

/* Moves a consumer behind the others of its priority (round-robin). */
static void rotate(struct queue *queue, struct consumer *consumer)
{
    struct list_node *pos = consumer->queue_link.next;
    while (pos != &queue->consumers &&
           CONTAINER_OF(pos, struct consumer, queue_link)->priority == consumer->priority)
        pos = pos->next;
    if (pos == consumer->queue_link.next)
        return;
    list_remove(&consumer->queue_link);
    list_insert_after(pos->prev, &consumer->queue_link);
}

void queue_hold_publishes(struct queue *queue)
{
    ASSERT(queue->remote_ops == NULL && !queue->deleted);
    if (queue->pause == NULL) {
        queue->pause = xcalloc(1, sizeof *queue->pause);
        list_init(&queue->pause->gets);
    }
}

void queue_pause(struct queue *queue)
{
    queue_hold_publishes(queue);
    queue->pause->standing = true;
}

void queue_hold_get(struct queue *queue, struct queue_get_wait *wait)
{
    ASSERT(queue_paused(queue) && !list_linked(&wait->link));
    list_push_back(&queue->pause->gets, &wait->link);
}

void queue_take_held_gets(struct queue *queue, struct list_node *out)
{
    ASSERT(list_empty(out));
    if (queue->pause != NULL)
        list_move_all(out, &queue->pause->gets);
}

void queue_retry_gets(struct list_node *gets)
{
    /* One at a time from the head: a retry may take others off the list
     * (its channel's connection failing closes their channels). */
    struct list_node *n;
    while ((n = list_first(gets)) != NULL) {
        list_remove(n);
        struct queue_get_wait *wait = CONTAINER_OF(n, struct queue_get_wait, link);
        wait->retry(wait);
    }
}

uint32_t queue_take_held(struct queue *queue, struct queue_held_publish **out)
{
    struct queue_pause *p = queue->pause;
    *out = NULL;
    if (p == NULL)
        return 0;
    uint32_t n = p->count;
    *out = p->held;
    p->held = NULL;
    p->count = p->cap = 0;
    return n;
}

uint32_t queue_take_held_settles(struct queue *queue, struct queue_held_settle **out)
{
    struct queue_pause *p = queue->pause;
    queue->pause = NULL;
    *out = NULL;
    if (p == NULL)
        return 0;
    ASSERT(p->held == NULL); /* queue_take_held first */
    ASSERT(list_empty(&p->gets)); /* and queue_take_held_gets */
    uint32_t n = p->settles_count;
    *out = p->settles;
    ASSERT(queue->unacked_count >= n);
    queue_rates_moved(queue);
    queue->unacked_count -= n;
    free(p);
    return n;
}

void queue_held_settles_free(struct queue_held_settle *settles, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++)
        message_unref(settles[i].entry.message);
    free(settles);
}

/* The held settles, applied as they would have been. */
static void apply_held_settles(struct queue *queue, struct queue_held_settle *settles,
                               uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        struct queue_entry e = settles[i].entry;
        if (settles[i].kind == QUEUE_SETTLE_REQUEUE) {
            queue_requeue(queue, e);
        } else if (settles[i].kind == QUEUE_SETTLE_REJECT) {
            queue_reject(queue, e.seq, e.message);
        } else {
            queue_settle(queue, e.seq, e.message);
            message_unref(e.message);
        }
    }
    free(settles);
}

/* The pause ends: held settles applied, held publishes enqueued (refuse:
 * nacked instead, not enqueued), dispatch and the waiting gets go on. */
static void end_pause(struct queue *queue, bool refuse)
{
    struct list_node gets;
    list_init(&gets);
    queue_take_held_gets(queue, &gets);
    struct queue_held_publish *held;
    uint32_t n = queue_take_held(queue, &held);
    struct queue_held_settle *settles;
    uint32_t settles_count = queue_take_held_settles(queue, &settles);
    queue_rates_moved(queue);
    queue->unacked_count += settles_count; /* (taken back: applied below) */
    apply_held_settles(queue, settles, settles_count);
    for (uint32_t i = 0; i < n; i++) {
        /* (Deleted meanwhile: routed to a queue that then went, as on
         * RabbitMQ: confirmed, and gone.) */
        struct publish_wait wait = {.sink = held[i].sink, .seq = held[i].seq,
                                    .maybe_delivered = held[i].maybe_delivered};
        bool rejected = refuse || (!queue->deleted &&
                                   enqueue(queue, held[i].message, &wait,
                                           !held[i].dead_lettered) == QUEUE_PUBLISH_REJECTED);
        if (held[i].sink) {
            confirm_sink_routed(held[i].sink, held[i].seq, &wait, rejected);
            confirm_sink_unref(held[i].sink);
        }
        message_unref(held[i].message);
    }
    free(held);
    queue_dispatch(queue);
    queue_retry_gets(&gets); /* after what was published meanwhile */
}

void queue_resume(struct queue *queue)
{
    end_pause(queue, false);
}

void queue_resume_refusing(struct queue *queue)
{
    end_pause(queue, true);
}

void queue_dispatch(struct queue *queue)
{
    if (queue->dispatching || queue->deleted || queue_paused(queue) || queue->unreadable)
        return;
    if (queue->remote_ops) {
        queue->remote_ops->dispatch(queue);
        return;
    }
    queue->dispatching = true;
    while (queue->ready_count > 0 && queue->consumers_count > 0) {
        struct consumer *chosen = choose_consumer(queue);
        if (!chosen)
            break;
        struct queue_entry entry;
        if (!queue_take(queue, &entry))
            break;
        if (!queue->args.single_active_consumer)
            rotate(queue, chosen);
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
    /* Sorted by priority, highest first; a newcomer goes last among equals. */
    struct list_node *pos = queue->consumers.next;
    while (pos != &queue->consumers &&
           CONTAINER_OF(pos, struct consumer, queue_link)->priority >= consumer->priority)
        pos = pos->next;
    list_insert_after(pos->prev, &consumer->queue_link);
    queue->consumers_count++;
    queue->vhost->totals.consumers++;
    if (consumer->exclusive)
        queue->exclusive_consumers++;
    if (queue->args.single_active_consumer && !queue->active_consumer)
        queue->active_consumer = consumer;
    queue->had_consumers = true;
    if (queue->timer)
        schedule_timer(queue); /* x-expires no longer applies */
    if (queue->remote_ops)
        queue->remote_ops->consumer_added(queue, consumer);
}

void queue_consumer_credit_changed(struct queue *queue, struct consumer *consumer)
{
    ASSERT(consumer->queue == queue);
    if (queue->remote_ops)
        queue->remote_ops->consumer_credit(queue, consumer);
    queue_dispatch(queue);
}

void queue_consumer_remove(struct queue *queue, struct consumer *consumer)
{
    ASSERT(consumer->queue == queue);
    ASSERT(queue->consumers_count > 0);
    if (queue->remote_ops)
        queue->remote_ops->consumer_removed(queue, consumer);
    list_remove(&consumer->queue_link);
    queue->consumers_count--;
    ASSERT(queue->vhost->totals.consumers > 0);
    queue->vhost->totals.consumers--;
    if (consumer->exclusive)
        queue->exclusive_consumers--;
    consumer->queue = NULL;
    if (queue->active_consumer == consumer) {
        /* Hand over to the longest-waiting consumer (SAC). */
        struct list_node *next = list_first(&queue->consumers);
        queue->active_consumer = next ? CONTAINER_OF(next, struct consumer, queue_link) : NULL;
    }
    if (queue->consumers_count == 0) {
        flow_queue_unconsumed(queue);
        if (!queue->deleted)
            queue_touch(queue);
    }
    queue_unref(queue);
}

uint32_t queue_delete(struct queue *queue)
{
    ASSERT(!queue->deleted);
    /* The backups delete their copies when the map says so; a purge
     * streamed now could reach a backup promoted meanwhile. */
    if (queue->replication_ops)
        queue->replication_ops->detach(queue);
    uint32_t dropped = queue_purge(queue);
    queue->deleted = true;
    flow_queue_release(queue);
    if (queue->pause != NULL)
        queue_resume(queue); /* what it held is answered, not enqueued */
    if (queue->timer)
        uv_timer_stop(queue->timer);
    queue_ref(queue); /* keep it alive while consumers detach */
    while (!list_empty(&queue->consumers)) {
        struct consumer *consumer =
            CONTAINER_OF(queue->consumers.next, struct consumer, queue_link);
        queue_consumer_remove(queue, consumer);
        consumer->ops->cancelled(consumer);
    }
    bind_dest_unbind_all(&queue->as_dest, NULL, NULL);
    rates_retire(queue); /* (after the consumers' requeues above: no longer counted) */
    queue_unref(queue);
    return dropped;
}
