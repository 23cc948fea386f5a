/*
 * durable_adopt.c: a durable queue taken over from a dead broker's log on
 * shared storage (queue.take_over; store/journal_adopt.c for the disk
 * side and the fence).
 *
 * Every live message of the adopted log is put in the queue, as recovery
 * does, and appended to the queue's own log under the same seq (so the
 * order and the seqs stay, and new publishes are numbered above the dead
 * broker's last). Messages it had delivered and not seen acked come back
 * with redelivered set. Transient messages were only in the dead broker's
 * memory: they are gone, unless we were an in-sync backup of a queue that
 * replicates only those (x-quay-replicate "transient"): our replica's go in
 * by seq among the log's (struct durable_merge). The staged copy is
 * removed once our own log is synced past the last copied record.
 */
#include "broker/durable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "store/journal.h"

/* A staged copy waiting for our copy of it to be synced. Owned by the
 * durable's list. */
struct durable_adopted {
    struct durable_adopted *next;
    uint64_t ticket; /* our copy's last record */
    char staged[512];
};

struct adoption {
    struct queue *queue; /* borrowed */
    uint64_t seq_min;    /* below it: adopted from another log already */
    uint64_t ticket;
    int64_t count;
    uint64_t dropped;
};

/* One of the merge's transient messages into the queue, at its seq (the
 * logs are read in seq order, so it is above what went in before; were it
 * not, it goes in next rather than be lost). */
static void merge_one(struct queue *queue, const struct queue_entry *e)
{
    uint64_t seq = e->seq >= queue->next_seq ? e->seq : queue->next_seq;
    queue_recover_message(queue, e->message, seq, e->redelivered);
}

/* The merge's messages below seq go into the queue before the logged one
 * at seq; logged: there is one at seq, and a merge entry at seq too (a
 * persistent one the replica had) is dropped: the log's copy wins. */
static void merge_below(struct broker *broker, struct queue *queue, uint64_t seq, bool logged)
{
    struct durable_merge *m = broker->durable.merge;
    while (m != NULL && m->next < m->count && m->entries[m->next].seq <= seq) {
        if (m->entries[m->next].seq == seq && !logged)
            break;
        const struct queue_entry *e = &m->entries[m->next++];
        if (e->seq < seq)
            merge_one(queue, e);
    }
}

static void on_adopted(void *ctx, struct journal_queue *jq, struct bytes vhost_name,
                       struct bytes queue_name, uint64_t seq, bool delivered, const void *blob,
                       uint32_t size)
{
    (void)jq;
    (void)vhost_name;
    struct adoption *a = ctx;
    struct queue *queue = a->queue;
    if (seq < a->seq_min)
        return;
    merge_below(queue->vhost->broker, queue, seq, true);
    struct message *message = message_from_blob(blob, size);
    if (message == NULL) {
        LOG_ERROR("queue '%.*s': adopted record %llu does not decode; skipped",
                  (int)queue_name.len, (const char *)queue_name.ptr, (unsigned long long)seq);
        a->dropped++;
        return;
    }
    queue_recover_message(queue, message, seq, delivered);
    message_unref(message);
    uint64_t t = journal_publish(queue->journal, seq, blob, size);
    if (delivered)
        t = journal_delivered(queue->journal, seq);
    if (t > a->ticket)
        a->ticket = t;
    a->count++;
}

/* Adopts a log of the queue, its messages from seq_min on: owner_name's
 * (in its queues/ directory), or, with staged, one we claimed already
 * (journal_adopt_claim_staged; owner_name names it in the log; ours: from
 * our own adopted/ directory). ticket:
 * raised to our copy's last record. */
static int64_t adopt_from(struct broker *broker, struct vhost *vhost, struct queue *queue,
                          const char *owner_name, const char *staged, bool ours,
                          uint64_t seq_min, uint64_t *ticket)
{
    struct durable *d = &broker->durable;
    char foreign[1024];
    snprintf(foreign, sizeof foreign, "%s/%s", broker->config.shared_storage_dir, owner_name);
    struct adoption a = {.queue = queue, .seq_min = seq_min};
    struct journal_adoption *out = malloc(sizeof *out);
    ASSERT(out != NULL);
    int rc = staged != NULL
                 ? journal_adopt_read(d->journal, staged, on_adopted, &a, out)
                 : journal_adopt(d->journal, foreign, vhost->name, queue->name, on_adopted, &a,
                                 out);
    if (rc != OK) {
        LOG_ERROR("queue '%.*s': cannot take over %s's log (%d)%s%s: it serves without "
                  "those messages", (int)queue->name.len, (const char *)queue->name.ptr,
                  owner_name, rc, out->staged[0] ? "; kept in " : "", out->staged);
        free(out);
        return -1;
    }
    /* (Transient ones between the last live message and the log's end
     * first: seqs go up.) */
    merge_below(broker, queue, out->seq_last + 1, false);
    if (queue->next_seq <= out->seq_last)
        queue->next_seq = out->seq_last + 1;
    if (out->staged[0] != '\0' && a.ticket == 0) {
        journal_adopt_finish(d->journal, out->staged); /* nothing to copy */
    } else if (out->staged[0] != '\0') {
        struct durable_adopted *p = calloc(1, sizeof *p);
        ASSERT(p != NULL);
        p->ticket = a.ticket;
        snprintf(p->staged, sizeof p->staged, "%s", out->staged);
        p->next = d->adopted;
        d->adopted = p;
    }
    if (a.ticket > *ticket)
        *ticket = a.ticket;
    LOG_INFO("queue '%.*s': took over %lld messages from %s's log%s (%llu dropped)",
             (int)queue->name.len, (const char *)queue->name.ptr, (long long)a.count,
             owner_name, staged == NULL ? "" : ours ? ", staged by us before a restart"
                                                   : ", staged by a taker that died",
             (unsigned long long)a.dropped);
    free(out);
    return a.count;
}

/* Claims source's log of the queue staged in taker_dir's adopted/ (NULL:
 * ours, left by a takeover of ours that a crash or a restart cut short)
 * into staged ("" if none). */
static int claim_staged(struct broker *broker, struct queue *queue, const char *taker,
                        const char *source, char *staged)
{
    char taker_dir[1024];
    if (taker != NULL)
        snprintf(taker_dir, sizeof taker_dir, "%s/%s", broker->config.shared_storage_dir,
                 taker);
    return journal_adopt_claim_staged(broker->durable.journal, taker ? taker_dir : NULL,
                                      source, queue->vhost->name, queue->name, staged);
}

/* source's log of the queue, from seq_min on: staged in our adopted/ (own,
 * "" if none: ours, where we staged it before a restart, we died or
 * restarted before our copy was synced; else claimed from a dead taker's,
 * claim_chain), or where source left it (at most one of them exists). */
static int64_t read_source(struct broker *broker, struct vhost *vhost, struct queue *queue,
                           const char *source, const char *own, bool ours, uint64_t seq_min,
                           uint64_t *ticket)
{
    int64_t count = 0;
    if (own[0] != '\0') {
        count = adopt_from(broker, vhost, queue, source, own, ours, seq_min, ticket);
        if (count < 0)
            return -1;
        if (seq_min < queue->next_seq)
            seq_min = queue->next_seq;
    }
    int64_t more = adopt_from(broker, vhost, queue, source, NULL, false, seq_min, ticket);
    return more < 0 ? more : count + more;
}

static int64_t adopt_source(struct broker *broker, struct vhost *vhost, struct queue *queue,
                            const char *source, uint64_t seq_min, uint64_t *ticket)
{
    char own[512];
    if (claim_staged(broker, queue, NULL, source, own) != OK)
        return -1;
    return read_source(broker, vhost, queue, source, own, true, seq_min, ticket);
}

/* A chain of takers that all died before their copies were durable
 * (o -> t -> u -> v, then w takes over from v): the map names v, then u,
 * t, o, newest first (taken_from, taken_from_before, taken_older). Each
 * one's log is in exactly one place (every move is a rename): where its
 * broker left it, staged in the adopted/ directory of a taker after it in
 * the chain (a taker claims its source's log, and what its source had
 * staged, into its own adopted/), or in ours (a restart of ours after we
 * claimed it). Read newest first, each above the seqs read before: a
 * later taker's log holds, for the seqs it copied, the queue as that
 * taker left it (its consumers' acks). Sources the map no longer names
 * (a chain longer than it keeps) are read last, in no known order: a
 * message a later taker's consumer acked may come back. */
#define ADOPT_OLDER_MAX 8

struct older {
    uint32_t count;
    char source[ADOPT_OLDER_MAX][JOURNAL_SOURCE_SIZE];
    char staged[ADOPT_OLDER_MAX][512];
};

static bool in_chain(const char *name, const char *owner_name, const char *const *earlier,
                     uint32_t earlier_count)
{
    if (strcmp(name, owner_name) == 0)
        return true;
    for (uint32_t i = 0; i < earlier_count; i++) {
        if (strcmp(name, earlier[i]) == 0)
            return true;
    }
    return false;
}

/* Claims what taker's adopted/ (NULL: ours) holds staged for the queue
 * from sources the chain does not name. */
static int claim_older(struct broker *broker, struct queue *queue, const char *taker,
                       const char *owner_name, const char *const *earlier,
                       uint32_t earlier_count, struct older *o)
{
    enum { SOURCES_MAX = 32 };
    char (*sources)[JOURNAL_SOURCE_SIZE] = malloc(sizeof *sources * SOURCES_MAX);
    ASSERT(sources != NULL);
    char taker_dir[1024];
    if (taker != NULL)
        snprintf(taker_dir, sizeof taker_dir, "%s/%s", broker->config.shared_storage_dir,
                 taker);
    int n = journal_adopt_staged_sources(broker->durable.journal,
                                         taker != NULL ? taker_dir : NULL, sources,
                                         SOURCES_MAX);
    int rc = n < 0 ? E_IO : OK;
    for (int i = 0; rc == OK && i < n && o->count < ADOPT_OLDER_MAX; i++) {
        if (in_chain(sources[i], owner_name, earlier, earlier_count))
            continue;
        rc = claim_staged(broker, queue, taker, sources[i], o->staged[o->count]);
        bool twice = false;
        for (uint32_t k = 0; k < o->count; k++)
            twice |= strcmp(o->staged[k], o->staged[o->count]) == 0;
        if (rc == OK && o->staged[o->count][0] != '\0' && !twice) {
            snprintf(o->source[o->count], sizeof o->source[0], "%s", sources[i]);
            o->count++;
        }
    }
    free(sources);
    return rc;
}

/* Where each earlier source's log is staged, if it is ("" if not). */
struct chain {
    char staged[DURABLE_ADOPT_CHAIN_MAX][512];
    bool ours[DURABLE_ADOPT_CHAIN_MAX]; /* staged by us (before a restart), else by a taker */
    struct older older;
};

/* Every staged copy the queue's chain may have left, claimed into our
 * adopted/ before any broker's own log is (below): a restarted taker
 * removes what it staged only once its own copy passed a fenced sync
 * (durable_adopt's resume), so when it did before our claim, its log that
 * we claim next has the copy. Source earlier[i] may be staged in ours or
 * in the adopted/ of any taker after it: owner_name, earlier[0..i-1]. */
static int claim_chain(struct broker *broker, struct queue *queue, const char *owner_name,
                       const char *const *earlier, uint32_t earlier_count, struct chain *c)
{
    int rc = OK;
    for (uint32_t i = 0; rc == OK && i < earlier_count; i++) {
        rc = claim_staged(broker, queue, NULL, earlier[i], c->staged[i]);
        c->ours[i] = c->staged[i][0] != '\0';
        for (uint32_t t = 0; rc == OK && c->staged[i][0] == '\0' && t <= i; t++)
            rc = claim_staged(broker, queue, t == 0 ? owner_name : earlier[t - 1], earlier[i],
                              c->staged[i]);
    }
    if (rc == OK)
        rc = claim_older(broker, queue, NULL, owner_name, earlier, earlier_count, &c->older);
    for (uint32_t t = 0; rc == OK && t < earlier_count; t++) /* the takers: all but the last */
        rc = claim_older(broker, queue, t == 0 ? owner_name : earlier[t - 1], owner_name,
                         earlier, earlier_count, &c->older);
    return rc;
}

/* owner_name had taken the queue over from earlier[0] (and so on down the
 * chain) and died before it said it adopted: what it did adopt is in its
 * log, under the same seqs, and was written before anything newer (the
 * journal appends in order), so each earlier log adds what lies above. */
static int64_t adopt_with_earlier(struct broker *broker, struct vhost *vhost,
                                  struct queue *queue, const char *owner_name,
                                  const char *const *earlier, uint32_t earlier_count,
                                  uint64_t seq_min, uint64_t *ticket)
{
    ASSERT(earlier_count > 0 && earlier_count <= DURABLE_ADOPT_CHAIN_MAX);
    struct chain *c = calloc(1, sizeof *c);
    ASSERT(c != NULL);
    int rc = claim_chain(broker, queue, owner_name, earlier, earlier_count, c);
    int64_t count = adopt_source(broker, vhost, queue, owner_name, seq_min, ticket);
    if (count < 0 || rc != OK) {
        free(c);
        return -1; /* (what was claimed stays staged, reported at our restart) */
    }
    int64_t more = 0;
    for (uint32_t i = 0; more >= 0 && i < earlier_count; i++) {
        int64_t also = read_source(broker, vhost, queue, earlier[i], c->staged[i],
                                   c->ours[i], queue->next_seq, ticket);
        more = also < 0 ? also : more + also;
    }
    for (uint32_t i = 0; more >= 0 && i < c->older.count; i++) {
        int64_t also = adopt_from(broker, vhost, queue, c->older.source[i],
                                  c->older.staged[i], false, queue->next_seq, ticket);
        more = also < 0 ? also : more + also;
    }
    free(c);
    return more < 0 ? more : count + more;
}

static int64_t adopt_logs(struct broker *broker, struct vhost *vhost, struct queue *queue,
                          const char *owner_name, const char *const *earlier,
                          uint32_t earlier_count, bool resume, uint64_t *ticket)
{
    if (!resume) {
        ASSERT(queue->ready_count == 0 && queue->unacked_count == 0); /* just made real */
        if (journal_queue_seq_last(queue->journal) > 0) {
            /* A stale log of ours under that name (we owned the queue
             * once): the adopted one is the queue's content now. */
            queue->journal = journal_queue_recreate(queue->journal);
            queue->next_seq = 1;
        }
    }
    /* Resumed: our log is the queue's content, and what it lacks of the
     * copy we had staged lies above its last seq. */
    uint64_t seq_min = resume ? queue->next_seq : 0;
    int64_t count = earlier_count > 0
                        ? adopt_with_earlier(broker, vhost, queue, owner_name, earlier,
                                             earlier_count, seq_min, ticket)
                        : adopt_source(broker, vhost, queue, owner_name, seq_min, ticket);
    return count;
}

/* What the merge still holds: above every log's last seq. */
static void merge_rest(struct broker *broker, struct queue *queue)
{
    struct durable_merge *m = broker->durable.merge;
    while (m != NULL && m->next < m->count)
        merge_one(queue, &m->entries[m->next++]);
}

int64_t durable_adopt(struct broker *broker, struct vhost *vhost, struct queue *queue,
                      const char *owner_name, const char *const *earlier,
                      uint32_t earlier_count, bool resume, struct durable_merge *merge,
                      uint64_t *ticket)
{
    struct durable *d = &broker->durable;
    *ticket = 0;
    d->merge = merge;
    int64_t count = 0;
    if (d->journal != NULL && broker->config.shared_storage_dir != NULL &&
        queue->journal != NULL)
        count = adopt_logs(broker, vhost, queue, owner_name, earlier, earlier_count, resume,
                           ticket);
    merge_rest(broker, queue);
    d->merge = NULL;
    queue_dispatch(queue);
    return count;
}

void durable_abandon_log(struct broker *broker, struct queue *queue)
{
    (void)broker;
    if (queue->journal == NULL || journal_queue_seq_last(queue->journal) == 0)
        return;
    LOG_WARN("queue '%.*s' was taken over from our log on the shared storage: we leave "
             "that log to its new owner", (int)queue->name.len, (const char *)queue->name.ptr);
    journal_queue_abandon(queue->journal);
    queue->journal = NULL;
}

void durable__adopted_synced(struct broker *broker, uint64_t ticket)
{
    struct durable *d = &broker->durable;
    struct durable_adopted **at = &d->adopted;
    while (*at != NULL) {
        struct durable_adopted *p = *at;
        if (p->ticket > ticket) {
            at = &p->next;
            continue;
        }
        journal_adopt_finish(d->journal, p->staged);
        *at = p->next;
        free(p);
    }
}

void durable__adopted_free(struct broker *broker)
{
    struct durable *d = &broker->durable;
    while (d->adopted != NULL) {
        struct durable_adopted *p = d->adopted;
        d->adopted = p->next;
        free(p);
    }
}
