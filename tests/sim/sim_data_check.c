/*
 * sim_data_check.c: the data path's checkers (the soak's, tests/crash/
 * cluster_soak.py, here on every seed):
 *   - no two epochs confirm at once: once a queue's primary confirmed under
 *     an epoch, no primary confirms under an older one (a deposed primary
 *     that goes on confirming beside its successor: a split brain);
 *   - no confirmed message lost: after the faults heal, every message a
 *     publisher saw confirmed and no consumer acked is at its queue's
 *     primary (unless an operator gave the queue's messages up by
 *     forgetting the broker that held them: controller_forget);
 *   - and, where they happen (sim_data.c), a stream's seqs only grow and
 *     a backup acks only what was sent to it.
 */
#include "sim_data.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

int sim_watch_queue = -1;
bool sim_data_strict;

void sim_data_watch(struct sim *s, unsigned qi, const char *fmt, ...)
{
    if ((int)qi != sim_watch_queue)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("  t=%" PRIu64 " %s: ", (uint64_t)raft_fixture_time(&s->f), sim_queue_names[qi]);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static bool held_at(const struct sim_copy *c, uint32_t msg)
{
    for (uint32_t i = 0; i < c->held_count; i++) {
        if (c->held[i].msg == msg)
            return true;
    }
    return false;
}

void sim_data_confirmed(struct sim *s, unsigned p, unsigned qi, uint64_t epoch, uint32_t msg)
{
    struct sim_data *d = s->data;
    uint64_t now = raft_fixture_time(&s->f);
    d->confirms++;
    sim_trace(s, (uint64_t)msg * 31 + p);
    if (epoch < d->confirm_epoch[qi]) {
        /* A deposed primary confirms beside its successor (seed 888 did,
         * renewing its lease from heartbeats of maps that had moved its
         * queue away: fence_heard_note). */
        bool held = d->msgs[msg].consumed || held_at(&d->copies[d->confirm_by[qi]][qi], msg);
        sim_fail(s, "%s: b%u confirmed message %u under epoch %" PRIu64 " after b%u had "
                 "confirmed under epoch %" PRIu64 " (at t=%" PRIu64 "), %s: two epochs confirm "
                 "at once", sim_queue_names[qi], p + 1, msg, epoch, d->confirm_by[qi] + 1,
                 d->confirm_epoch[qi], d->confirm_epoch_ms[qi],
                 held ? "which has it" : "which does not have it");
        return;
    }
    if (epoch > d->confirm_epoch[qi]) {
        d->confirm_epoch[qi] = epoch;
        d->confirm_epoch_ms[qi] = now;
        d->confirm_by[qi] = p;
    }
}

/* An operator forgot the broker that held the queue without an in-sync
 * backup: it starts again empty (sim_check.c sees it). */
void sim_data_given_up(struct sim *s, unsigned qi)
{
    if (s->data != NULL)
        s->data->given_up_ms[qi] = raft_fixture_time(&s->f);
}

/* Whether a process alive holds msg in its copy of qi (a transient queue:
 * a dead process's copy died with it, whether it restarts or not). */
static bool held_alive(const struct sim *s, unsigned qi, uint32_t msg)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        if (s->f.servers[i].alive && !s->brokers[i].forgotten &&
            held_at(&s->data->copies[i][qi], msg))
            return true;
    }
    return false;
}

void sim_data_known_loss(struct sim *s, uint32_t id, unsigned qi)
{
    struct sim_data *d = s->data;
    d->known_losses++;
    /* Under --strict, what is lost only because both its copies died is
     * not counted: the primary that confirmed it died (seed 6562: killed,
     * then forgotten), then its one in-sync backup, before the failover
     * that promoted it committed; a transient queue with one backup
     * survives one failure, and no decision brings back what was only in
     * two dead processes. A message a live process still holds is counted:
     * the promotion lost a copy that was there (seed 2266: the primary,
     * only cut off from the leader, deposed for a backup the leader
     * suspected, dead: controller.c's fail_over_primary waits now). */
    uint32_t died = 0;
    for (uint32_t k = 0; k < d->msgs_count; k++) {
        struct sim_msg *m = &d->msgs[k];
        if (m->queue == qi && m->state == SIM_MSG_CONFIRMED && !m->consumed &&
            !m->restarted_away && !m->copies_died && !held_alive(s, qi, k)) {
            m->copies_died = true;
            died++;
        }
    }
    if (s->verbose)
        printf("  t=%" PRIu64 " known loss: b%u serves %s, promoted as it died, from a transient "
               "replica its restart emptied (%u confirmed message(s) had no copy left alive)\n",
               (uint64_t)raft_fixture_time(&s->f), id, sim_queue_names[qi], died);
    if (!sim_data_strict)
        d->given_up_ms[qi] = raft_fixture_time(&s->f);
}

void sim_data_deleted(struct sim *s, unsigned qi, uint64_t version)
{
    struct sim_data *d = s->data;
    if (d == NULL || version <= d->deleted_version[qi])
        return; /* (another broker applied it first) */
    d->deleted_version[qi] = version;
    d->deletions++;
    uint32_t gone = 0;
    for (uint32_t k = 0; k < d->msgs_count; k++) {
        struct sim_msg *m = &d->msgs[k];
        if (m->queue != qi || m->state != SIM_MSG_CONFIRMED || m->consumed || m->deleted)
            continue;
        m->deleted = true;
        gone++;
    }
    d->deleted_msgs += gone;
    sim_data_watch(s, qi, "deleted at map v%" PRIu64 ": %u confirmed message(s) went with it",
                   version, gone);
}

/* An in-sync backup of q (as a map has it) alive that holds message msg
 * of qi: its id, or 0. */
static uint32_t in_sync_holder(const struct sim *s, const struct map_queue *q, unsigned qi,
                               uint32_t msg)
{
    for (uint8_t i = 0; i < q->backups_count; i++) {
        unsigned k = q->backup_ids[i] - 1;
        if (map_queue_backup_in_sync(q, q->backup_ids[i]) && k < s->f.n &&
            s->f.servers[k].alive && held_at(&s->data->copies[k][qi], msg))
            return k + 1;
    }
    return 0;
}

void sim_data_restart_settled(struct sim *s, const struct sim_broker *b, unsigned qi,
                              const struct map_queue *q, bool serves)
{
    struct sim_data *d = s->data;
    for (uint32_t n = 0; n < d->msgs_count; n++) {
        struct sim_msg *m = &d->msgs[n];
        if (m->queue != qi || !(m->restart_pending & (1u << b->index)))
            continue;
        m->restart_pending &= ~(1u << b->index);
        if (!serves)
            continue; /* (the backup that took the queue holds it) */
        m->restarted_away = true;
        uint32_t holder = sim_data_strict && !m->consumed ? in_sync_holder(s, q, qi, n) : 0;
        if (holder != 0) {
            sim_fail(s, "%s: b%u serves it again without message %u, which its in-sync "
                     "backup b%u holds", sim_queue_names[qi], b->id, n, holder);
            return;
        }
    }
}

void sim_data_check_drop(struct sim *s, const struct sim_broker *b, unsigned qi,
                         const struct map_queue *q)
{
    struct sim_data *d = s->data;
    for (uint32_t n = 0; n < d->msgs_count && sim_data_strict; n++) {
        const struct sim_msg *m = &d->msgs[n];
        if (m->queue != qi || m->state != SIM_MSG_CONFIRMED || m->consumed || m->deleted)
            continue;
        uint32_t holder = in_sync_holder(s, q, qi, n);
        if (holder != 0) {
            sim_fail(s, "%s: b%u deletes it as a transient queue of its last process, while "
                     "its in-sync backup b%u holds confirmed message %u", sim_queue_names[qi],
                     b->id, holder, n);
            return;
        }
    }
}

bool sim_data_check_settled(struct sim *s, char *why, size_t why_size)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        const struct sim_broker *b = &s->brokers[i];
        if (b->forgotten)
            continue;
        if (!b->synced) {
            snprintf(why, why_size, "b%u has not caught up (its sync)", b->id);
            return false;
        }
        for (uint32_t k = 0; k < b->map.queues_count; k++) {
            const struct map_queue *q = b->map.queues[k];
            int qi = sim_queue_index(q->name);
            if (q->primary_id == b->id && qi >= 0 && !s->data->copies[i][qi].primary) {
                snprintf(why, why_size, "b%u does not serve %s yet", b->id, sim_queue_names[qi]);
                return false;
            }
        }
    }
    return true;
}

void sim_data_check_messages(struct sim *s)
{
    struct sim_data *d = s->data;
    unsigned first = 0;
    while (s->brokers[first].forgotten)
        first++;
    const struct cluster_map *map = &s->brokers[first].map;
    for (uint32_t k = 0; k < d->msgs_count && !sim_failed(s); k++) {
        const struct sim_msg *m = &d->msgs[k];
        if (m->state != SIM_MSG_CONFIRMED || m->consumed || m->restarted_away || m->copies_died ||
            m->deleted || m->confirmed_ms < d->given_up_ms[m->queue])
            continue;
        const struct map_queue *q = cluster_map_queue(map, B("/"), B(sim_queue_names[m->queue]));
        unsigned p = q != NULL ? q->primary_id - 1 : 0;
        if (q == NULL)
            sim_fail(s, "%s: message %u, confirmed at t=%" PRIu64 ", has no queue: lost",
                     sim_queue_names[m->queue], k, m->confirmed_ms);
        else if (!held_at(&d->copies[p][m->queue], k))
            sim_fail(s, "%s: message %u, confirmed at t=%" PRIu64 ", is not at its primary b%u "
                     "(epoch %" PRIu64 "): a confirmed message lost", sim_queue_names[m->queue],
                     k, m->confirmed_ms, q->primary_id, q->epoch);
    }
}
