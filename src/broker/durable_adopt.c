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

#include <uv.h>

#include "broker/broker.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
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
    struct durable_reading reading;
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
    durable__bound_memory_while_reading(queue->vhost->broker, &a->reading, size);
}

/* Where a log a takeover reads was staged from (for the log line). */
enum from { FROM_OWNER, FROM_OURS, FROM_TAKER };

/* One log of a plan. */
struct slot {
    bool tried;        /* its claim ran and did not fail (else reading stops there) */
    enum from from;
    char staged[512];  /* where it is staged now; "": there was none */
};

/* Each source's log of the queue is in exactly one place (every move is a
 * rename): where its broker left it, staged in the adopted/ directory of a
 * taker after it in the chain, or in ours. Sources the map no longer names
 * (a chain longer than it keeps) are read last, in no known order: a
 * message a later taker's consumer acked may come back. */
#define ADOPT_OLDER_MAX 8

struct older {
    uint32_t count;
    char source[ADOPT_OLDER_MAX][JOURNAL_SOURCE_SIZE];
    char staged[ADOPT_OLDER_MAX][512];
};

/* What durable_adopt_stage staged for a queue, in the order durable_adopt
 * reads it: for each source (the owner, then earlier[0], ...), slot 2i
 * what was staged of it before (by us before a restart, or by a taker
 * that died), slot 2i + 1 its log where its broker left it; then older. */
struct durable_adopt_plan {
    struct durable_adopt_plan *next; /* durable.adopt_staging, until committed */
    struct queue *queue;             /* borrowed: the caller holds a reference */
    bool active;                     /* shared storage, our journal, the queue's log */
    bool resume;
    bool committed;                  /* durable_adopt_commit ran since its renames */
    bool failed;                     /* that commit failed: nothing of it is read */
    bool chain_failed;               /* a claim of the chain failed: the owner's only */
    uint32_t sources;
    char source[1 + DURABLE_ADOPT_CHAIN_MAX][JOURNAL_SOURCE_SIZE];
    struct slot slot[2 * (1 + DURABLE_ADOPT_CHAIN_MAX)];
    struct older older;
    /* Reading it (durable_adopt_step), one log at a time, in steps. */
    bool begun;
    uint32_t next_slot;              /* of slot[], then of older */
    uint32_t next_older;
    uint64_t seq_min;                /* what the next log adds lies above it */
    int64_t count;                   /* messages adopted so far */
    uint64_t ticket;                 /* our copy's last record so far */
    struct journal_reading *reading; /* owned: the log being read, or NULL */
    struct slot current;             /* its slot */
    char current_source[JOURNAL_SOURCE_SIZE];
    struct adoption adoption;        /* on_adopted's, for it */
};

/* Starts reading a staged log of the queue (source: the broker whose log
 * it is), its messages from p->seq_min on. */
static void begin_log(struct broker *broker, struct durable_adopt_plan *p, const char *source,
                      const struct slot *slot)
{
    p->current = *slot;
    snprintf(p->current_source, sizeof p->current_source, "%s", source);
    p->adoption = (struct adoption){.queue = p->queue, .seq_min = p->seq_min};
    p->reading = journal_adopt_read_start(broker->durable.journal, slot->staged, on_adopted,
                                          &p->adoption);
}

/* The log being read is read (status: its last step's, OK or an error):
 * OK, or -1 (logged). p->ticket covers what went in before a failure too. */
static int end_log(struct broker *broker, struct durable_adopt_plan *p, int status)
{
    struct durable *d = &broker->durable;
    struct queue *queue = p->queue;
    const struct adoption *a = &p->adoption;
    struct journal_adoption *out = xmalloc(sizeof *out);
    int rc = journal_adopt_read_finish(p->reading, out);
    p->reading = NULL;
    if (a->ticket > p->ticket)
        p->ticket = a->ticket; /* (what went in before a failure is copied too) */
    if (rc != OK || status != OK) {
        int code = rc != OK ? rc : status;
        LOG_ERROR("queue '%.*s': cannot read %s's log, staged in %s (%s, %d), after %lld of its "
                  "messages", (int)queue->name.len, (const char *)queue->name.ptr,
                  p->current_source, p->current.staged, error_name(code), code,
                  (long long)a->count);
        free(out);
        return -1;
    }
    /* (Transient ones between the last live message and the log's end
     * first: seqs go up.) */
    merge_below(broker, queue, out->seq_last + 1, false);
    if (queue->next_seq <= out->seq_last)
        queue->next_seq = out->seq_last + 1;
    if (a->ticket == 0) {
        journal_adopt_finish(d->journal, out->staged); /* nothing to copy */
    } else {
        struct durable_adopted *staged = xcalloc(1, sizeof *staged);
        staged->ticket = a->ticket;
        snprintf(staged->staged, sizeof staged->staged, "%s", out->staged);
        staged->next = d->adopted;
        d->adopted = staged;
    }
    LOG_INFO("queue '%.*s': took over %lld messages from %s's log%s (%llu dropped)",
             (int)queue->name.len, (const char *)queue->name.ptr, (long long)a->count,
             p->current_source,
             p->current.from == FROM_OWNER ? ""
             : p->current.from == FROM_OURS ? ", staged by us before a restart"
                                            : ", staged by a taker that died",
             (unsigned long long)a->dropped);
    free(out);
    p->count += a->count;
    if (p->seq_min < queue->next_seq)
        p->seq_min = queue->next_seq;
    return OK;
}

/* Claims source's log of the queue staged in taker's adopted/ (NULL:
 * ours, left by a takeover of ours that a crash or a restart cut short)
 * into staged ("" if none). */
static int claim_staged(struct broker *broker, struct queue *queue, const char *taker,
                        const char *source, char *staged)
{
    char taker_dir[1024];
    if (taker != NULL)
        snprintf(taker_dir, sizeof taker_dir, "%s/%s", broker->config.shared_storage_dir,
                 taker);
    int rc = journal_adopt_claim_staged(broker->durable.journal, taker ? taker_dir : NULL,
                                        source, queue->vhost->name, queue->name, staged);
    if (rc != OK)
        LOG_ERROR("queue '%.*s': cannot claim %s's log staged in %s's directory",
                  (int)queue->name.len,
                  (const char *)queue->name.ptr, source, taker != NULL ? taker : "our");
    return rc;
}

/* Source i's log where its broker left it, into its slot 2i + 1. */
static int stage_own(struct broker *broker, struct durable_adopt_plan *p, uint32_t i)
{
    char foreign[1024];
    snprintf(foreign, sizeof foreign, "%s/%s", broker->config.shared_storage_dir,
             p->source[i]);
    struct slot *slot = &p->slot[2 * i + 1];
    slot->from = FROM_OWNER;
    int rc = journal_adopt_stage(broker->durable.journal, foreign, p->queue->vhost->name,
                                 p->queue->name, slot->staged);
    slot->tried = rc == OK;
    if (rc != OK)
        LOG_ERROR("queue '%.*s': cannot take over %s's log", (int)p->queue->name.len,
                  (const char *)p->queue->name.ptr, p->source[i]);
    return rc;
}

static bool in_chain(const struct durable_adopt_plan *p, const char *name)
{
    for (uint32_t i = 0; i < p->sources; i++) {
        if (strcmp(name, p->source[i]) == 0)
            return true;
    }
    return false;
}

/* Claims what taker's adopted/ (NULL: ours) holds staged for the queue
 * from sources the chain does not name. */
static int claim_older(struct broker *broker, struct durable_adopt_plan *p, const char *taker)
{
    enum { SOURCES_MAX = 32 };
    char (*sources)[JOURNAL_SOURCE_SIZE] = xmalloc(sizeof *sources * SOURCES_MAX);
    char taker_dir[1024];
    if (taker != NULL)
        snprintf(taker_dir, sizeof taker_dir, "%s/%s", broker->config.shared_storage_dir,
                 taker);
    int n = journal_adopt_staged_sources(broker->durable.journal,
                                         taker != NULL ? taker_dir : NULL, sources,
                                         SOURCES_MAX);
    int rc = n < 0 ? E_IO : OK;
    struct older *o = &p->older;
    for (int i = 0; rc == OK && i < n && o->count < ADOPT_OLDER_MAX; i++) {
        if (in_chain(p, sources[i]))
            continue;
        rc = claim_staged(broker, p->queue, taker, sources[i], o->staged[o->count]);
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

/* Every staged copy the queue's chain may have left, claimed into our
 * adopted/ before any broker's own log is (durable_adopt_stage): a
 * restarted taker removes what it staged only once its own copy passed a
 * fenced sync (durable_adopt's resume), so when it did before our claim,
 * its log that we claim next has the copy. Source i (i >= 1) may be
 * staged in ours or in the adopted/ of any taker after it: sources 0 to
 * i - 1. */
static int stage_chain(struct broker *broker, struct durable_adopt_plan *p)
{
    int rc = OK;
    for (uint32_t i = 1; rc == OK && i < p->sources; i++) {
        struct slot *slot = &p->slot[2 * i];
        slot->from = FROM_OURS;
        rc = claim_staged(broker, p->queue, NULL, p->source[i], slot->staged);
        for (uint32_t t = 0; rc == OK && slot->staged[0] == '\0' && t < i; t++) {
            slot->from = FROM_TAKER;
            rc = claim_staged(broker, p->queue, p->source[t], p->source[i], slot->staged);
        }
        slot->tried = rc == OK;
    }
    if (rc == OK)
        rc = claim_older(broker, p, NULL);
    for (uint32_t t = 0; rc == OK && t + 1 < p->sources; t++) /* the takers: all but the last */
        rc = claim_older(broker, p, p->source[t]);
    return rc;
}

struct durable_adopt_plan *durable_adopt_stage(struct broker *broker, struct queue *queue,
                                               const char *owner_name,
                                               const char *const *earlier,
                                               uint32_t earlier_count, bool resume)
{
    struct durable *d = &broker->durable;
    ASSERT(earlier_count <= DURABLE_ADOPT_CHAIN_MAX);
    struct durable_adopt_plan *p = xcalloc(1, sizeof *p);
    p->queue = queue;
    p->resume = resume;
    p->active = d->journal != NULL && broker->config.shared_storage_dir != NULL &&
                queue->journal != NULL;
    p->committed = !p->active; /* (nothing to make durable) */
    if (!p->active)
        return p;
    p->sources = 1 + earlier_count;
    snprintf(p->source[0], sizeof p->source[0], "%s", owner_name);
    for (uint32_t i = 0; i < earlier_count; i++)
        snprintf(p->source[1 + i], sizeof p->source[0], "%s", earlier[i]);
    if (earlier_count > 0)
        p->chain_failed = stage_chain(broker, p) != OK;
    p->slot[0].from = FROM_OURS;
    int rc = claim_staged(broker, queue, NULL, owner_name, p->slot[0].staged);
    p->slot[0].tried = rc == OK;
    for (uint32_t i = 0; rc == OK && i < p->sources && (i == 0 || !p->chain_failed); i++)
        rc = stage_own(broker, p, i);
    p->next = d->adopt_staging;
    d->adopt_staging = p;
    return p;
}

void durable_adopt_commit(struct broker *broker)
{
    struct durable *d = &broker->durable;
    if (d->adopt_staging == NULL)
        return;
    int rc = journal_adopt_commit(d->journal);
    while (d->adopt_staging != NULL) {
        struct durable_adopt_plan *p = d->adopt_staging;
        d->adopt_staging = p->next;
        p->committed = true;
        p->failed = rc != OK;
    }
}

/* Reads what the plan staged, newest source first, each above the seqs
 * read before: the owner's log holds what it adopted from earlier[0] under
 * the same seqs, written before anything newer (the journal appends in
 * order), and, for the seqs it copied, the queue as it left it (its
 * consumers' acks); so each earlier log adds what lies above. Works until
 * until_ns (0: to the end): AGAIN while there is more, OK once all is
 * read, -1 where a claim failed or a log could not be read whole (what
 * was claimed stays staged: read again by a plan with resume). */
static int plan_step(struct broker *broker, struct durable_adopt_plan *p, uint64_t until_ns)
{
    struct queue *queue = p->queue;
    if (!p->begun) {
        p->begun = true;
        if (!p->resume) {
            ASSERT(queue->ready_count == 0 && queue->unacked_count == 0); /* just made real */
            if (journal_queue_seq_last(queue->journal) > 0) {
                /* A stale log of ours under that name (we owned the queue
                 * once): the adopted one is the queue's content now. */
                queue->journal = journal_queue_recreate(queue->journal);
                queue->next_seq = 1;
            }
        }
        if (p->failed)
            return -1; /* (logged by the commit; staged, not known durable: not read) */
        /* Resumed: our log is the queue's content, and what it lacks of
         * the copy we had staged lies above its last seq. */
        p->seq_min = p->resume ? queue->next_seq : 0;
    }
    for (;;) {
        if (p->reading != NULL) {
            int rc = journal_adopt_read_step(p->reading, until_ns);
            if (rc == AGAIN)
                return AGAIN;
            if (end_log(broker, p, rc) != OK)
                return -1;
            if (until_ns != 0 && uv_hrtime() >= until_ns)
                return AGAIN;
            continue;
        }
        if (p->next_slot < 2 * p->sources) {
            uint32_t k = p->next_slot++;
            const struct slot *slot = &p->slot[k];
            if (!slot->tried || (k >= 2 && p->chain_failed))
                return -1;
            if (k >= 2 && k % 2 == 0)
                p->seq_min = queue->next_seq;
            if (slot->staged[0] != '\0')
                begin_log(broker, p, p->source[k / 2], slot);
        } else if (p->next_older < p->older.count) {
            uint32_t i = p->next_older++;
            struct slot slot = {.tried = true, .from = FROM_TAKER};
            snprintf(slot.staged, sizeof slot.staged, "%s", p->older.staged[i]);
            p->seq_min = queue->next_seq;
            begin_log(broker, p, p->older.source[i], &slot);
        } else {
            return OK;
        }
    }
}

/* What the merge still holds: above every log's last seq. */
static void merge_rest(struct broker *broker, struct queue *queue)
{
    struct durable_merge *m = broker->durable.merge;
    while (m != NULL && m->next < m->count)
        merge_one(queue, &m->entries[m->next++]);
}

int durable_adopt_step(struct broker *broker, struct durable_adopt_plan *plan,
                       struct durable_merge *merge, uint64_t until_ns)
{
    ASSERT(plan->committed); /* the fence: every rename durable before a read */
    if (!plan->active)
        return OK;
    struct durable *d = &broker->durable;
    d->merge = merge;
    int rc = plan_step(broker, plan, until_ns);
    d->merge = NULL;
    return rc;
}

int64_t durable_adopt_finish(struct broker *broker, struct durable_adopt_plan *plan,
                             struct durable_merge *merge, int status, uint64_t *ticket)
{
    ASSERT(status != AGAIN && plan->reading == NULL);
    struct durable *d = &broker->durable;
    struct queue *queue = plan->queue;
    *ticket = plan->ticket;
    int64_t count = status == OK ? plan->count : -1;
    /* Not read whole: the merge's rest waits for the next try (its seqs
     * lie among what is still to read). */
    if (count >= 0) {
        d->merge = merge;
        merge_rest(broker, queue);
        d->merge = NULL;
        queue_dispatch(queue);
    }
    free(plan);
    return count;
}

void durable_adopt_discard(struct broker *broker, struct durable_adopt_plan *plan)
{
    (void)broker;
    if (plan == NULL)
        return;
    ASSERT(plan->committed);
    if (plan->reading != NULL) { /* (cut short: what it staged stays) */
        struct journal_adoption out;
        journal_adopt_read_finish(plan->reading, &out);
    }
    free(plan);
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
    queue->log_left = true;
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
