/*
 * adoption.c: see adoption.h.
 */
#include "cluster/adoption.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/durable.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/handover.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/replication.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"
#include "lib/list.h"
#include "lib/log.h"
#include "store/journal.h"

_Static_assert(1 + CLUSTER_BACKUPS_MAX <= DURABLE_ADOPT_CHAIN_MAX,
               "a taker reads the whole chain the map keeps");

/* One queue waiting. Owned by member->adoptions. */
struct adoption {
    struct list_node link;
    struct queue *queue;                    /* one reference */
    char owner[CLUSTER_NAME_SIZE_MAX + 1];  /* the dead broker's name: its directory */
    /* taken_from_before's, then taken_older's, newest first: the chain of
     * takers before the dead one that never said queue.adopted */
    char earlier[1 + CLUSTER_BACKUPS_MAX][CLUSTER_NAME_SIZE_MAX + 1];
    uint32_t earlier_count;
    uint64_t ticket; /* our copy's last journal record (member->adopted_unsaid) */
    bool resume;     /* durable_adopt_stage's: a takeover of ours a restart cut short, or a
                      * try that could not read every log (our log holds what it read) */
    bool staged;     /* its batch staged and committed: plan (NULL: gone meanwhile) */
    uint64_t retry_at_ms; /* in adoptions_unreadable: when it is tried again */
    uint32_t retry_ms;    /* the wait before that try (doubles, to ADOPTION_RETRY_MS_MAX) */
    struct durable_adopt_plan *plan; /* owned: staged in this batch (stage_batch), or NULL */
    struct durable_merge merge; /* its entries owned: a kept replica's (adoption_start) */
};

/* The merge's references go (the queue took its own of those it holds). */
static void merge_free(struct durable_merge *m)
{
    for (uint32_t i = 0; i < m->count; i++)
        message_unref(m->entries[i].message);
    free(m->entries);
    *m = (struct durable_merge){0};
}

static void broker_name(const struct member *member, uint32_t id, char *out, size_t size)
{
    const struct map_broker *b = cluster_map_broker(member_map(member), id);
    if (b == NULL)
        out[0] = '\0';
    else
        snprintf(out, size, "%.*s", (int)b->name.len, (const char *)b->name.ptr);
}

static void on_idle(uv_idle_t *idle);

static struct adoption *find_in(const struct list_node *list, const struct queue *queue)
{
    list_for_each(n, list) {
        struct adoption *a = CONTAINER_OF(n, struct adoption, link);
        if (a->queue == queue)
            return a;
    }
    return NULL;
}

/* Waiting (being read too), or waiting to be tried again. */
static struct adoption *find(const struct member *member, const struct queue *queue)
{
    struct adoption *a = find_in(&member->adoptions, queue);
    return a != NULL ? a : find_in(&member->adoptions_unreadable, queue);
}

static void start(struct member *member, struct queue *queue, const struct map_queue *mq,
                  bool resume, struct durable_merge merge)
{
    ASSERT(!queue_is_remote(queue) && !queue->deleted);
    ASSERT(find(member, queue) == NULL);
    char owner[CLUSTER_NAME_SIZE_MAX + 1];
    broker_name(member, mq->taken_from, owner, sizeof owner);
    if (owner[0] == '\0') {
        /* Forgotten meanwhile: nobody's directory to read; the replica's
         * messages we kept are the queue's content. */
        for (uint32_t i = 0; i < merge.count; i++) {
            const struct queue_entry *e = &merge.entries[i];
            queue_recover_message(queue, e->message,
                                  e->seq >= queue->next_seq ? e->seq : queue->next_seq,
                                  e->redelivered);
        }
        merge_free(&merge);
        return;
    }
    struct adoption *a = xcalloc(1, sizeof *a);
    a->queue = queue;
    a->merge = merge;
    queue_ref(queue);
    memcpy(a->owner, owner, sizeof owner);
    a->resume = resume;
    uint32_t chain[1 + CLUSTER_BACKUPS_MAX];
    uint32_t n = 0;
    if (mq->taken_from_before != BROKER_ID_NONE) {
        chain[n++] = mq->taken_from_before;
        for (uint8_t i = 0; i < mq->taken_older_count; i++)
            chain[n++] = mq->taken_older[i];
    }
    for (uint32_t i = 0; i < n; i++) { /* (a forgotten broker: nobody's directory) */
        broker_name(member, chain[i], a->earlier[a->earlier_count], sizeof a->earlier[0]);
        a->earlier_count += a->earlier[a->earlier_count][0] != '\0';
    }
    queue_pause(queue);
    list_push_back(&member->adoptions, &a->link);
    if (member->adoption_idle == NULL) {
        member->adoption_idle = xcalloc(1, sizeof *member->adoption_idle);
        uv_idle_init(member->broker->loop, member->adoption_idle);
        member->adoption_idle->data = member;
    }
    adoption_synced(member);
}

void adoption_start(struct member *member, struct queue *queue, const struct map_queue *mq,
                    struct queue_entry *merge, uint32_t merge_count)
{
    start(member, queue, mq, false, (struct durable_merge){.entries = merge, .count = merge_count});
}

bool adoption_leftover(const struct map_queue *mq, uint32_t self)
{
    return mq->primary_id == self && mq->taken_from != BROKER_ID_NONE && !mq->adopted;
}

bool adoption_resume_leftover(struct member *member, struct queue *queue,
                              const struct map_queue *mq)
{
    ASSERT(adoption_leftover(mq, member->self_id));
    if (queue->deleted || find(member, queue) != NULL)
        return find(member, queue) != NULL;
    LOG_INFO("queue '%.*s': our takeover of it was cut short by a restart before the map "
             "learnt queue.adopted: resuming it", (int)mq->name.len, (const char *)mq->name.ptr);
    start(member, queue, mq, true, (struct durable_merge){0});
    return find(member, queue) != NULL;
}

void adoption_resume_leftovers(struct member *member)
{
    const struct cluster_map *map = member_map(member);
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *mq = map->queues[i];
        if (!adoption_leftover(mq, member->self_id))
            continue;
        struct vhost *vhost = broker_vhost(member->broker, mq->vhost->name);
        struct queue *queue = vhost != NULL ? vhost_queue(vhost, mq->name) : NULL;
        if (queue != NULL && !queue_is_remote(queue))
            (void)adoption_resume_leftover(member, queue, mq);
    }
}

bool adoption_staged_needed(const struct map_queue *mq, uint32_t self)
{
    if (mq == NULL || mq->adopted || mq->taken_from == BROKER_ID_NONE)
        return false;
    bool named = mq->primary_id == self || mq->taken_from == self ||
                 mq->taken_from_before == self;
    for (uint8_t i = 0; i < mq->taken_older_count; i++)
        named |= mq->taken_older[i] == self;
    return named;
}

/* A staged copy the last sweep kept: someone may still read it. Owned by
 * member->staged_kept. */
struct staged_kept {
    struct list_node link;
    struct bytes vhost, name; /* owned */
    char staged[];            /* its root in our adopted/ */
};

static void kept_free(struct staged_kept *k)
{
    list_remove(&k->link);
    free((void *)k->vhost.ptr);
    free((void *)k->name.ptr);
    free(k);
}

static void log_removed(struct bytes name)
{
    LOG_INFO("queue '%.*s': a copy we had staged for its takeover is no longer needed: "
             "removed", (int)name.len, (const char *)name.ptr);
}

static bool staged_unneeded(void *ctx, struct bytes vhost, struct bytes name,
                            const char *staged)
{
    struct member *member = ctx;
    const struct map_queue *mq = cluster_map_queue(member_map(member), vhost, name);
    if (!adoption_staged_needed(mq, member->self_id)) {
        log_removed(name);
        return true;
    }
    size_t size = strlen(staged) + 1;
    struct staged_kept *k = xmalloc(sizeof *k + size);
    k->vhost = bytes_dup(vhost);
    k->name = bytes_dup(name);
    memcpy(k->staged, staged, size);
    list_push_back(&member->staged_kept, &k->link);
    return false;
}

void adoption_sweep_staged(struct member *member)
{
    struct journal *journal = member->broker->durable.journal;
    while (!list_empty(&member->staged_kept))
        kept_free(CONTAINER_OF(member->staged_kept.next, struct staged_kept, link));
    member->staged_kept_version = member_map(member)->version;
    if (journal != NULL && member->broker->config.shared_storage_dir != NULL)
        journal_adopt_sweep(journal, staged_unneeded, member);
}

/* What the sweep kept waits for a map change that makes it unneeded: a
 * taker of ours said queue.adopted without claiming it (we had said it
 * before we died, so it read our log alone), the queue was deleted or
 * promoted elsewhere before a taker claimed it. Without this it stayed
 * until our next start. adoption_staged_needed judges each with the map
 * as it is, which only ever moves past the point where a taker could
 * still read the copy (see there); a taker claiming it meanwhile renamed
 * it away, and our removal then finds nothing (journal__remove_staged).
 * No disk access: the kept ones are few and known by queue. */
static void kept_recheck(struct member *member)
{
    const struct cluster_map *map = member_map(member);
    if (list_empty(&member->staged_kept) || map->version == member->staged_kept_version)
        return;
    member->staged_kept_version = map->version;
    struct journal *journal = member->broker->durable.journal;
    list_for_each_safe(n, &member->staged_kept) {
        struct staged_kept *k = CONTAINER_OF(n, struct staged_kept, link);
        if (adoption_staged_needed(cluster_map_queue(map, k->vhost, k->name), member->self_id))
            continue;
        log_removed(k->name);
        if (journal != NULL && !durable_failed(member->broker))
            journal_adopt_finish(journal, k->staged);
        kept_free(k);
    }
}

/* Not before we caught up with the map: a restart replays the map's
 * history, and a queue.take_over in it (to us, then long since moved on)
 * made the queue real here for a moment. Adopting it then renamed the
 * log of the queue's owner now (a broker it was taken from came back and
 * got it again, or opened a fresh log for it at its restart) out from
 * under it: its journal failed for good (38 restarting the brokers of
 * two_brokers_dying_at_once: c nacked every publish). Once caught up,
 * such a queue is no longer real here and its adoption is skipped. */
void adoption_synced(struct member *member)
{
    if (member->adoption_idle != NULL && !list_empty(&member->adoptions) &&
        cluster_node_synced(member->node) && !uv_is_active((uv_handle_t *)member->adoption_idle))
        uv_idle_start(member->adoption_idle, on_idle);
}

bool adoption_pending(const struct member *member, const struct queue *queue)
{
    return find(member, queue) != NULL;
}

uint32_t adoption_pending_count(const struct member *member)
{
    return list_count(&member->adoptions);
}

uint32_t adoption_unreadable_count(const struct member *member)
{
    return list_count(&member->adoptions_unreadable);
}

static void adoption_free(struct adoption *a)
{
    merge_free(&a->merge);
    queue_unref(a->queue);
    free(a);
}

static void on_adopted_said(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    (void)change;
    if (status != OK)
        LOG_WARN("cluster: a queue.adopted did not commit: a later takeover of that queue "
                 "also reads the log it came from (harmless)");
}

enum adoption_say adoption_say_when(uint64_t ticket, uint64_t synced, bool journal_failed,
                                    bool ours)
{
    if (!ours || journal_failed)
        return ADOPTION_SAY_NEVER;
    return synced >= ticket ? ADOPTION_SAY_NOW : ADOPTION_SAY_WAIT;
}

/* The map learns that a takeover from us would find everything in our
 * log (queue.adopted): until then a takeover from us also reads the log
 * we took it from (and claims it where we staged it). */
static void say_adopted(struct member *member, struct queue *queue)
{
    if (member->stopping)
        return;
    struct map_cmd cmd;
    if (map_cmd_queue_adopted(&cmd, queue->vhost->name, queue->name, member->self_id) == OK)
        cluster_node_submit(member->node, &cmd, on_adopted_said, member);
}

/* Is a's queue still ours, as the adoption left it? */
static bool still_ours(const struct member *member, const struct adoption *a)
{
    const struct queue *queue = a->queue;
    if (queue->deleted || queue_is_remote(queue))
        return false;
    const struct map_queue *mq =
        cluster_map_queue(member_map(member), queue->vhost->name, queue->name);
    return mq != NULL && mq->primary_id == member->self_id && mq->taken_from != BROKER_ID_NONE;
}

/* Says queue.adopted for a's queue once its copy is durable (true: said,
 * or never to be; a is done with). Said before (once the copy was queued),
 * a taker crashing before its sync left the map saying "adopted", and the
 * next taker read only its log, which may lack the copy: the confirmed
 * messages were in the staged copy nobody read again (38's
 * a_taker_killed_before_its_copy_was_synced_loses_nothing). A taker that
 * stops (or whose journal fails) first never says it: a takeover from it
 * then reads both logs (durable_adopt_step). */
static bool settle(struct member *member, const struct adoption *a)
{
    enum adoption_say say =
        adoption_say_when(a->ticket, durable_synced_ticket(member->broker),
                          durable_failed(member->broker), still_ours(member, a));
    if (say == ADOPTION_SAY_NOW)
        say_adopted(member, a->queue);
    return say != ADOPTION_SAY_WAIT;
}

/* a's log could not be read whole (durable_adopt_step): the queue gives
 * nothing rather than serve without those messages, as a broker whose
 * own journal cannot be read does not start; what waited is refused
 * (publishes nacked, gets and consumes 404, as for a queue whose primary
 * is down); the adoption is tried again, resumed, after a wait that
 * doubles: an I/O error of a shared filesystem may pass, a log an
 * operator repairs is read then. The queue stays ours meanwhile: its
 * handovers and replication wait (adoption_pending), and it can be
 * deleted. */
static void wait_for_retry(struct member *member, struct adoption *a)
{
    struct queue *queue = a->queue;
    a->resume = true;
    a->staged = false;
    a->retry_ms = !queue->unreadable ? ADOPTION_RETRY_MS_MIN
                  : a->retry_ms >= ADOPTION_RETRY_MS_MAX / 2 ? ADOPTION_RETRY_MS_MAX
                                                             : 2 * a->retry_ms;
    a->retry_at_ms = uv_now(member->broker->loop) + a->retry_ms;
    LOG_ERROR("queue '%.*s': the log it was taken over from cannot be read whole: unavailable "
              "until it can (tried again in %u ms)", (int)queue->name.len,
              (const char *)queue->name.ptr, a->retry_ms);
    queue->unreadable = true;
    queue_resume_refusing(queue);
    list_push_back(&member->adoptions_unreadable, &a->link);
}

/* Those whose wait is over go back to adoptions (paused again), those
 * whose queue went are forgotten. */
static void retry_unreadable(struct member *member)
{
    uint64_t now = uv_now(member->broker->loop);
    list_for_each_safe(n, &member->adoptions_unreadable) {
        struct adoption *a = CONTAINER_OF(n, struct adoption, link);
        if (a->queue->deleted || queue_is_remote(a->queue)) {
            list_remove(&a->link);
            adoption_free(a);
        } else if (now >= a->retry_at_ms) {
            list_remove(&a->link);
            queue_pause(a->queue);
            list_push_back(&member->adoptions, &a->link);
        }
    }
    adoption_synced(member);
}

void adoption_tick(struct member *member)
{
    if (cluster_node_synced(member->node))
        kept_recheck(member);
    retry_unreadable(member);
    list_for_each_safe(n, &member->adopted_unsaid) {
        struct adoption *a = CONTAINER_OF(n, struct adoption, link);
        if (settle(member, a)) {
            list_remove(&a->link);
            queue_unref(a->queue);
            free(a);
        }
    }
}

/* Stages every log of a's queue (durable_adopt_stage: renames only, made
 * durable by the batch's commit), unless the queue went (deleted, moved
 * away: the object that stood for it is deleted). */
static void stage(struct member *member, struct adoption *a)
{
    struct queue *queue = a->queue;
    a->staged = true;
    if (queue->deleted || queue_is_remote(queue))
        return;
    const char *earlier[1 + CLUSTER_BACKUPS_MAX];
    for (uint32_t i = 0; i < a->earlier_count; i++)
        earlier[i] = a->earlier[i];
    a->plan = durable_adopt_stage(member->broker, queue, a->owner, earlier, a->earlier_count,
                                  a->resume);
}

static bool gone(const struct queue *queue)
{
    return queue->deleted || queue_is_remote(queue);
}

/* a's reading is over (status: durable_adopt_step's last, OK or -1; its
 * queue may have gone meanwhile): the queue is adopted, or waits to be
 * tried again (follow; -1). follow: start what waited for it
 * (replication, a handover), as the map has the queue now. a then waits
 * in adopted_unsaid for our copy's sync, or is freed. */
static void adopt(struct member *member, struct adoption *a, int status, bool follow)
{
    list_remove(&a->link);
    struct queue *queue = a->queue;
    if (a->plan != NULL && !gone(queue)) {
        uint64_t ticket;
        int64_t n = durable_adopt_finish(member->broker, a->plan, &a->merge, status, &ticket);
        a->plan = NULL;
        if (ticket > a->ticket)
            a->ticket = ticket;
        if (n < 0 && follow) {
            wait_for_retry(member, a);
            return;
        }
        if (queue->unreadable)
            LOG_INFO("queue '%.*s': the log it was taken over from is read whole at last: "
                     "available", (int)queue->name.len, (const char *)queue->name.ptr);
        queue->unreadable = false;
        queue_resume(queue); /* publishes and gets that waited go in after */
        const struct map_queue *mq =
            cluster_map_queue(member_map(member), queue->vhost->name, queue->name);
        if (follow && mq != NULL && mq->primary_id == member->self_id) {
            /* (Resumed: our restart recovered the queue, which no stream
             * has attached yet: its backups are not in step with it.) */
            replication_attach(member, queue, mq, a->resume);
            handover_follow(member, queue, mq);
        }
        queue_dispatch(queue);
        merge_free(&a->merge);
        if (n >= 0 && follow && !settle(member, a)) { /* nothing copied: said at once */
            list_push_back(&member->adopted_unsaid, &a->link);
            return;
        }
    }
    /* (Gone between its stage and now: what was staged stays in our
     * adopted/, reported and swept at our start. A reading cut short is
     * closed by the discard.) */
    durable_adopt_discard(member->broker, a->plan);
    adoption_free(a); /* done with, or gone: deleted or moved away before its turn */
}

/* Stages the first n waiting queues (at least one) as one batch: every
 * log of theirs is staged (renamed) first, and the renames are made
 * durable together (durable_adopt_commit: one fsync per directory they
 * changed, not three per queue); only then is any of them read, served or
 * copied into our log. Each rename alone is the fence (an old owner's
 * sync fails from the rename on, durable or not); its durability, which a
 * crash needs, comes before anything is done with the queue's log, as it
 * did queue by queue. The batch stays at the head of member->adoptions
 * until each is adopted (adoption_pending holds meanwhile). */
static void stage_batch(struct member *member, uint32_t n)
{
    uint32_t count = 0;
    list_for_each(node, &member->adoptions) {
        struct adoption *a = CONTAINER_OF(node, struct adoption, link);
        if (count == n || count == ADOPTION_BATCH_MAX || a->staged)
            break;
        stage(member, a);
        count++;
    }
    durable_adopt_commit(member->broker);
    member->adoption_batch_left = count;
    member->adoption_batches++;
    member->adoption_batched += count;
}

/* Reads the head adoption (its batch staged) until until_ns (0: to the
 * end), and adopts it once read: false while more is left. */
static bool read_head(struct member *member, uint64_t until_ns, bool follow)
{
    struct adoption *a = CONTAINER_OF(member->adoptions.next, struct adoption, link);
    ASSERT(a->staged);
    int status = OK;
    if (a->plan != NULL && !gone(a->queue)) {
        status = durable_adopt_step(member->broker, a->plan, &a->merge, until_ns);
        if (status == AGAIN)
            return false;
    }
    adopt(member, a, status, follow);
    ASSERT(member->adoption_batch_left > 0);
    member->adoption_batch_left--;
    return true;
}

/* How many queues the next batch takes to fill a slice, at the last
 * batch's time per queue (its commit shared out): one while unknown. */
static uint32_t batch_size(const struct member *member)
{
    uint64_t slice_ns = (uint64_t)ADOPTION_SLICE_MS * 1000000u;
    if (member->adoption_queue_ns == 0)
        return 1;
    uint64_t n = (slice_ns + member->adoption_queue_ns - 1) / member->adoption_queue_ns;
    return n < 1 ? 1 : n > ADOPTION_BATCH_MAX ? ADOPTION_BATCH_MAX : (uint32_t)n;
}

/* Adopts queues for about ADOPTION_SLICE_MS, a batch at a time; a deep
 * queue's log is read over as many turns of the loop as it takes
 * (durable_adopt_step), so heartbeats, Raft and clients go on meanwhile. */
static void on_idle(uv_idle_t *idle)
{
    struct member *member = idle->data;
    uint64_t start = uv_hrtime();
    uint64_t until = start + (uint64_t)ADOPTION_SLICE_MS * 1000000u;
    while (!list_empty(&member->adoptions) && uv_hrtime() < until) {
        if (member->adoption_batch_left == 0) {
            member->adoption_batch_count = batch_size(member);
            member->adoption_batch_ns = 0;
            stage_batch(member, member->adoption_batch_count);
            member->adoption_batch_count = member->adoption_batch_left;
        }
        if (!read_head(member, until, true))
            break;
        if (member->adoption_batch_left == 0) { /* (its time includes this slice's so far) */
            uint64_t ns = member->adoption_batch_ns + (uv_hrtime() - start);
            member->adoption_queue_ns = ns / member->adoption_batch_count + 1;
            member->adoption_batch_ns = 0;
            start = uv_hrtime();
        }
    }
    member->adoption_batch_ns += uv_hrtime() - start;
    if (list_empty(&member->adoptions)) {
        LOG_INFO("cluster: adopted %u queue(s) in %u batch(es)", member->adoption_batched,
                 member->adoption_batches);
        member->adoption_batches = member->adoption_batched = 0;
        uv_idle_stop(idle);
    }
}

static void on_idle_closed(uv_handle_t *handle)
{
    free(handle);
}

void adoption_stop_all(struct member *member)
{
    while (!list_empty(&member->adoptions)) {
        if (member->adoption_batch_left == 0)
            stage_batch(member, ADOPTION_BATCH_MAX);
        read_head(member, 0, false);
    }
    while (!list_empty(&member->adoptions_unreadable)) { /* (stays staged, and unsaid) */
        struct adoption *a =
            CONTAINER_OF(member->adoptions_unreadable.next, struct adoption, link);
        list_remove(&a->link);
        adoption_free(a);
    }
    while (!list_empty(&member->adopted_unsaid)) { /* never said: safe (settle) */
        struct adoption *a =
            CONTAINER_OF(member->adopted_unsaid.next, struct adoption, link);
        list_remove(&a->link);
        queue_unref(a->queue);
        free(a);
    }
    while (!list_empty(&member->staged_kept))
        kept_free(CONTAINER_OF(member->staged_kept.next, struct staged_kept, link));
    if (member->adoption_idle != NULL) {
        uv_close((uv_handle_t *)member->adoption_idle, on_idle_closed);
        member->adoption_idle = NULL;
    }
}
