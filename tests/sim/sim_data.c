/*
 * sim_data.c: the data path's primaries and backups (sim_data.h), as
 * replication.c, replica.c and mirror.c run them. A primary appends a
 * publish under the next seq and streams it to its backups; it confirms a
 * publish once every backup that gates confirms (in sync in the map it
 * applied, or caught up and asking to be) acked it, and only while its
 * lease is fresh (drain). A backup that fails (its link died, it refused
 * the stream, it lags) is dropped from the in-sync set by a map change the
 * primary asks for; until that change is applied, the confirms wait. A
 * backup not in sync is caught up (a reset, everything the queue holds,
 * a probe); once it acked the probe it gates confirms and asks to join.
 * A backup takes a stream only at an epoch its map has reached, into a
 * copy it keeps (fence_replica_accepts), and lets go of its copy once its
 * map no longer names it a backup (fence_replica_kept: unless the stream
 * was started under a map newer than its own). A promoted backup starts
 * from what it holds, its seqs past any the old primary gave (mirror.c's
 * gap).
 */
#include "sim_data.h"

#include <inttypes.h>
#include <string.h>

#include "cluster/fence.h"
#include "lib/errors.h"

static uint64_t now_ms(struct sim *s)
{
    return raft_fixture_time(&s->f);
}

static const struct map_queue *map_queue_of(const struct sim_broker *b, unsigned qi)
{
    return cluster_map_queue(&b->map, B("/"), B(sim_queue_names[qi]));
}

static bool lease_fresh(struct sim *s, unsigned p)
{
    return now_ms(s) < s->data->lease_until[p];
}

/* ---- what a copy holds ---- */

static bool hold(struct sim *s, struct sim_copy *c, uint64_t seq, uint32_t msg)
{
    if (c->held_count == SIM_HELD_CAP) {
        sim_fail(s, "the model's capacity: a copy holds %u messages", SIM_HELD_CAP);
        return false;
    }
    if (c->held_count > 0 && c->held[c->held_count - 1].seq >= seq) {
        sim_fail(s, "a copy's seqs out of order: %" PRIu64 " after %" PRIu64, seq,
                 c->held[c->held_count - 1].seq);
        return false;
    }
    c->held[c->held_count++] = (struct sim_entry){seq, msg};
    return true;
}

static void unhold(struct sim_copy *c, uint64_t seq)
{
    for (uint32_t i = 0; i < c->held_count; i++) {
        if (c->held[i].seq == seq) {
            memmove(&c->held[i], &c->held[i + 1], (c->held_count - i - 1) * sizeof c->held[0]);
            c->held_count--;
            return;
        }
    }
}

/* ---- confirms (replication.c's drain, confirm_when_replicated) ---- */

static void answer(struct sim *s, unsigned p, const struct sim_pending *w, bool ok)
{
    if (w->reply_to == p) {
        sim_client_answer(s, w->msg, w->attempt, ok);
        return;
    }
    /* On the link the forward came on, or nowhere (its channel is gone). */
    if (sim_link_gen(s, p, w->reply_to) != w->reply_gen)
        return;
    struct sim_frame f = {.kind = SIM_F_ANSWER, .msg = w->msg, .attempt = w->attempt, .ok = ok};
    sim_link_send(s, p, w->reply_to, f);
}

static void confirm(struct sim *s, unsigned p, unsigned qi, struct sim_copy *c,
                    const struct sim_pending *w)
{
    sim_data_watch(s, qi, "b%u confirms m%u (seq %" PRIu64 ", epoch %" PRIu64 ")", p + 1,
                   w->msg, w->seq, c->epoch);
    sim_data_confirmed(s, p, qi, c->epoch, w->msg);
    answer(s, p, w, true);
}

/* Whether every backup that gates confirms has seq. */
static bool replicated_everywhere(const struct sim_copy *c, uint64_t seq)
{
    for (uint8_t i = 0; i < c->streams_count; i++) {
        if (c->streams[i].gating && c->streams[i].acked_seq < seq)
            return false;
    }
    return true;
}

static void drain(struct sim *s, unsigned p, unsigned qi, struct sim_copy *c)
{
    if (c->pending_count == 0 || !lease_fresh(s, p))
        return;
    uint32_t n = 0;
    while (n < c->pending_count && replicated_everywhere(c, c->pending[n].seq)) {
        confirm(s, p, qi, c, &c->pending[n]);
        n++;
    }
    memmove(c->pending, c->pending + n, (c->pending_count - n) * sizeof c->pending[0]);
    c->pending_count -= n;
}

/* ---- one backup's stream ---- */

/* replication.c's ask_in_sync: the set we want, asked of the map by the
 * tick (a request to the leader) while it differs from the map's. */
static void ask_in_sync(struct sim_copy *c)
{
    c->ask = true;
}

static void stream_fail(struct sim *s, unsigned qi, struct sim_copy *c, struct sim_stream *st)
{
    if (st->state == SIM_STREAM_FAILED)
        return;
    sim_data_watch(s, qi, "stream to b%u fails (gating %d)", st->backup_id, st->gating);
    st->state = SIM_STREAM_FAILED;
    if (st->gating)
        ask_in_sync(c); /* the confirms wait until the map drops it (its join first) */
}

static bool stream_send(struct sim *s, unsigned p, struct sim_copy *c, struct sim_stream *st,
                        struct sim_frame f)
{
    f.stream = st->id;
    f.epoch = c->epoch;
    if (!sim_link_send(s, p, st->backup_id - 1, f)) {
        stream_fail(s, f.queue, c, st);
        return false;
    }
    if (f.kind == SIM_F_REPLICATE || f.kind == SIM_F_PROBE || f.kind == SIM_F_VERIFY)
        st->sent_seq = f.seq;
    return true;
}

/* What a copy holds, as replica_digest_of and replication.c's send_verify
 * sum it. */
static struct replica_digest digest_of(const struct sim_copy *c)
{
    struct replica_digest d = {0, 0};
    for (uint32_t i = 0; i < c->held_count; i++)
        replica_digest_add(&d, c->held[i].seq);
    return d;
}

static void catch_up(struct sim *s, unsigned p, unsigned qi, struct sim_copy *c,
                     struct sim_stream *st)
{
    if (!sim_link_up(s, p, st->backup_id - 1)) {
        st->state = SIM_STREAM_IDLE;
        return;
    }
    sim_data_watch(s, qi, "catching up b%u: %u messages", st->backup_id, c->held_count);
    /* The answers to what went before the reset are not this catch-up's:
     * replication.c counts them down ahead of its end probe's (catch_up_left);
     * here they are the old stream's, ignored (else an old ack of the newest
     * seq ended the catch-up before the reset had arrived). */
    st->id = ++s->data->stream_ids;
    st->state = SIM_STREAM_CATCHING_UP;
    st->progress_ms = now_ms(s);
    st->acked_seq = 0;
    st->sent_seq = 0;
    if (!stream_send(s, p, c, st, (struct sim_frame){.kind = SIM_F_RESET, .queue = (uint8_t)qi,
                                                     .seq = s->brokers[p].map.version}))
        return;
    for (uint32_t i = 0; i < c->held_count; i++) {
        struct sim_frame f = {.kind = SIM_F_REPLICATE, .queue = (uint8_t)qi,
                              .seq = c->held[i].seq, .msg = c->held[i].msg};
        if (!stream_send(s, p, c, st, f))
            return;
    }
    st->catch_up_end = c->next_seq - 1;
    stream_send(s, p, c, st, (struct sim_frame){.kind = SIM_F_PROBE, .queue = (uint8_t)qi,
                                                .seq = st->catch_up_end});
}

static void caught_up(struct sim *s, unsigned qi, struct sim_copy *c, struct sim_stream *st)
{
    sim_data_watch(s, qi, "b%u caught up", st->backup_id);
    st->state = SIM_STREAM_LIVE;
    st->gating = true; /* from now on, before the map says so */
    st->join_asked = true;
    st->progress_ms = now_ms(s);
    ask_in_sync(c);
}

static struct sim_stream *stream_by_id(struct sim_copy *c, uint32_t id)
{
    for (uint8_t i = 0; i < c->streams_count; i++) {
        if (c->streams[i].id == id)
            return &c->streams[i];
    }
    return NULL;
}

/* replication.c's on_stream_answer. */
static void on_ack(struct sim *s, unsigned p, const struct sim_frame *f)
{
    struct sim_copy *c = &s->data->copies[p][f->queue];
    struct sim_stream *st = c->primary ? stream_by_id(c, f->stream) : NULL;
    if (st == NULL)
        return; /* a stream that went (detached, or its backup changed) */
    if (f->seq > st->sent_seq)
        sim_fail(s, "%s: b%u acked seq %" PRIu64 " on a stream from b%u that sent up to %"
                 PRIu64, sim_queue_names[f->queue], st->backup_id, f->seq, p + 1, st->sent_seq);
    if (!f->ok) {
        stream_fail(s, f->queue, c, st);
    } else if (st->state != SIM_STREAM_FAILED) {
        st->progress_ms = now_ms(s);
        if (f->seq > st->acked_seq)
            st->acked_seq = f->seq;
        if (st->state == SIM_STREAM_CATCHING_UP && st->acked_seq >= st->catch_up_end)
            caught_up(s, f->queue, c, st);
    }
    drain(s, p, f->queue, c);
}

/* ---- a primary following its map (mirror.c, replication_attach) ---- */

/* replication.c's streams_follow. */
static void streams_follow(struct sim *s, const struct sim_broker *b, unsigned qi,
                           const struct map_queue *q, bool fresh, bool recovered)
{
    struct sim_copy *c = &s->data->copies[b->index][qi];
    struct sim_stream next[CLUSTER_BACKUPS_MAX];
    for (uint8_t i = 0; i < q->backups_count; i++) {
        struct sim_stream *st = NULL;
        for (uint8_t k = 0; k < c->streams_count && st == NULL; k++) {
            if (c->streams[k].backup_id == q->backup_ids[i])
                st = &c->streams[k];
        }
        struct sim_stream one = {.id = ++s->data->stream_ids, .backup_id = q->backup_ids[i]};
        if (st == NULL)
            st = &one;
        bool in_sync = (q->in_sync_mask & (1u << i)) != 0;
        const struct map_broker *mb = cluster_map_broker(&b->map, st->backup_id);
        uint32_t incarnation = mb != NULL ? mb->incarnation : 0;
        if (fence_backup_restarted(st->incarnation, incarnation) &&
            st->state != SIM_STREAM_IDLE) {
            sim_data_watch(s, qi, "stream to b%u: restarted, caught up again", st->backup_id);
            st->state = SIM_STREAM_FAILED; /* (stream_follow_process) */
            st->join_asked = false;
        }
        st->incarnation = incarnation;
        if (fresh) {
            /* Promoted (or just declared): an in-sync backup holds what we
             * adopted, under the same seqs, as its answer to our verify
             * says (nothing counts as on it until then). */
            bool in_step = in_sync && !recovered;
            st->state = in_step ? SIM_STREAM_LIVE : in_sync ? SIM_STREAM_FAILED : SIM_STREAM_IDLE;
            st->join_asked = false;
            st->acked_seq = st->sent_seq = 0;
        }
        if (!in_sync && st->state == SIM_STREAM_LIVE)
            st->join_asked = true;
        bool gating = fence_stream_gates(in_sync, st->join_asked);
        if (gating && !st->gating)
            st->progress_ms = now_ms(s);
        st->gating = gating;
        if (in_sync)
            st->join_asked = false;
        next[i] = *st;
    }
    memcpy(c->streams, next, sizeof next[0] * q->backups_count);
    c->streams_count = q->backups_count;
}

/* replication_detach(ack false): the publishes it never confirmed are
 * nacked; what it holds stays as its replica (replica_of_queue). */
static void detach(struct sim *s, unsigned p, unsigned qi, struct sim_copy *c)
{
    sim_data_watch(s, qi, "b%u is not the primary any more (holds %u)", p + 1, c->held_count);
    for (uint32_t i = 0; i < c->pending_count; i++)
        answer(s, p, &c->pending[i], false);
    c->pending_count = 0;
    c->primary = c->quiescing = c->ask = c->journal = c->recovered = false;
    c->streams_count = 0;
    c->last_seq = c->next_seq - 1; /* (replica_of_queue: under no epoch it knows) */
    c->last_epoch = 0;
    c->stream_version = 0;
}

/* proxy_stub_update: a copy the map does not name us a backup of goes
 * (fence_replica_kept), and a new one starts from nothing. */
static void drop_unneeded(struct sim *s, const struct sim_broker *b, unsigned qi,
                          struct sim_copy *c, const struct map_queue *q)
{
    if (fence_replica_kept(q, b->id, b->map.version, c->stream_version) ||
        (c->held_count == 0 && c->last_seq == 0 && c->last_epoch == 0 &&
         c->stream_version == 0))
        return;
    sim_data_watch(s, qi, "b%u is not a backup: its copy goes (holds %u)", b->id, c->held_count);
    c->held_count = 0;
    c->last_seq = c->last_epoch = c->stream_version = 0;
}

static void follow_queue(struct sim *s, struct sim_broker *b, unsigned qi,
                         const struct map_queue *q)
{
    struct sim_copy *c = &s->data->copies[b->index][qi];
    /* (Real here while the map names us its primary, available or not:
     * mirror.c's ensure_queue; its proxies stop forwarding to it. What a
     * restart's journal recovered waits for the sync: keep_for_now.) */
    if (!b->synced)
        return;
    bool mine = q != NULL && q->primary_id == b->id;
    if (!mine) {
        if (c->waking)
            sim_data_restart_settled(s, b, qi, q, false);
        c->waking = c->restart_wait = false; /* (demoted, or a stand-in) */
        c->stood_in |= q != NULL;
        if (c->primary || c->journal)
            detach(s, b->index, qi, c); /* (demote: replica_of_queue) */
        drop_unneeded(s, b, qi, c, q);
        return;
    }
    bool fresh = !c->primary, recovered = c->recovered, waking = c->waking;
    c->waking = c->restart_wait = false;
    c->hand_off_to = BROKER_ID_NONE;
    c->drop_epoch = 0;
    if (fresh && waking) {
        /* mirror.c's hand_off_after_restart: what its journal recovered
         * (or nothing, the map's history made it) lacks what only its
         * memory held; an in-sync backup that is the process the map
         * knows (as b heard it) takes it instead. */
        struct controller_heard heard[CLUSTER_BACKUPS_MAX];
        for (uint8_t i = 0; i < q->backups_count; i++) {
            uint32_t id = q->backup_ids[i];
            heard[i] = (struct controller_heard){
                .broker_id = id, .incarnation = id <= SIM_SERVERS ? b->heard_incarnation[id] : 0};
        }
        bool wait;
        c->hand_off_to = controller_restart_successor(&b->map, q, heard, q->backups_count,
                                                      b->restart_version == 0 ? 0 : b->known_since,
                                                      &wait);
        if (c->hand_off_to == BROKER_ID_NONE && wait &&
            now_ms(s) < b->synced_ms + CONTROLLER_RESTART_WAIT_MS) {
            if (!c->restart_wait)
                sim_data_watch(s, qi, "b%u restarted: waits for an in-sync backup", b->id);
            c->waking = c->restart_wait = true;
            return;
        }
        if (c->hand_off_to != BROKER_ID_NONE) {
            c->epoch = q->epoch;
            sim_data_watch(s, qi, "b%u restarted: hands it to b%u (epoch %" PRIu64 ")", b->id,
                           c->hand_off_to, q->epoch);
            c->waking = true; /* (held: decided again at its next change) */
            return;
        }
        if (controller_restart_drops(q, b->id, b->restart_version)) {
            c->drop_epoch = q->epoch;
            sim_data_watch(s, qi, "b%u restarted, and no backup takes it: deletes it (epoch %"
                           PRIu64 ")", b->id, q->epoch);
            sim_data_check_drop(s, b, qi, q);
            c->waking = true; /* (held till the delete) */
            return;
        }
    }
    if (waking)
        sim_data_restart_settled(s, b, qi, q, true);
    c->recovered = false;
    if (fresh) {
        /* Adopted: what it held as a replica (or, back after a restart, its
         * journal); seqs jump past any the old primary gave to messages
         * that reached another backup but not us. */
        uint64_t top = sim_data_transient(qi) ? 0 : c->last_seq; /* (its log's last) */
        if (c->held_count > 0 && c->held[c->held_count - 1].seq > top)
            top = c->held[c->held_count - 1].seq;
        /* (A queue its journal recovered goes on from its log: follow_queue.) */
        c->next_seq = top + 1 + (c->stood_in && !recovered ? SIM_PROMOTION_SEQ_GAP : 0);
        sim_data_watch(s, qi, "b%u serves it at epoch %" PRIu64 " (holds %u, in sync %x)",
                       b->id, q->epoch, c->held_count, q->in_sync_mask);
        if (c->emptied)
            sim_data_known_loss(s, b->id, qi);
        c->emptied = false;
        c->primary = c->journal = true;
        c->pending_count = 0;
        c->streams_count = 0;
        c->asked_count = 0;
    }
    c->epoch = q->epoch;
    if (q->move_to == BROKER_ID_NONE)
        c->quiescing = false;
    streams_follow(s, b, qi, q, fresh, recovered);
    if (fresh && recovered)
        ask_in_sync(c);
    for (uint8_t i = 0; i < c->streams_count; i++) {
        struct sim_stream *st = &c->streams[i];
        if (fresh && st->state == SIM_STREAM_LIVE &&
            stream_send(s, b->index, c, st, (struct sim_frame){.kind = SIM_F_SYNC,
                                                               .queue = (uint8_t)qi,
                                                               .seq = b->map.version}))
            stream_send(s, b->index, c, st, (struct sim_frame){.kind = SIM_F_VERIFY,
                                                               .queue = (uint8_t)qi,
                                                               .seq = c->next_seq - 1,
                                                               .digest = digest_of(c)});
        if (!st->gating && (st->state == SIM_STREAM_IDLE || st->state == SIM_STREAM_FAILED))
            catch_up(s, b->index, qi, c, st);
    }
    drain(s, b->index, qi, c);
}

/* qi is not in b's map (deleted, or not declared yet): b's copy, if
 * any, goes (vhost_queue_delete), and what waited for its confirms is
 * nacked (sent again, to the queue declared anew). */
static void forget_copy(struct sim *s, struct sim_broker *b, unsigned qi)
{
    static const struct sim_copy fresh = {.hand_off_to = BROKER_ID_NONE};
    struct sim_copy *c = &s->data->copies[b->index][qi];
    if (memcmp(c, &fresh, sizeof fresh) == 0)
        return; /* (what a restart emptied too: a new queue starts anew) */
    sim_data_watch(s, qi, "b%u: not in its map: its copy goes (holds %u)", b->id, c->held_count);
    for (uint32_t i = 0; i < c->pending_count; i++)
        answer(s, b->index, &c->pending[i], false);
    *c = fresh;
}

/* After every apply on b (and its sync): each queue as its map says. */
void sim_data_follow(struct sim *s, struct sim_broker *b)
{
    if (s->data == NULL)
        return;
    bool in_map[SIM_QUEUES] = {false};
    for (uint32_t k = 0; k < b->map.queues_count; k++) {
        int qi = sim_queue_index(b->map.queues[k]->name);
        if (qi >= 0) {
            in_map[qi] = true;
            follow_queue(s, b, (unsigned)qi, b->map.queues[k]);
        }
    }
    for (unsigned qi = 0; qi < SIM_QUEUES && b->synced; qi++) {
        if (!in_map[qi])
            forget_copy(s, b, qi);
    }
}

/* ---- a publish, a consumer's ack ---- */

void sim_data_publish(struct sim *s, unsigned p, unsigned qi, uint32_t msg, uint32_t attempt,
                      unsigned reply_to, uint32_t reply_gen)
{
    struct sim_copy *c = &s->data->copies[p][qi];
    struct sim_pending w = {.msg = msg, .attempt = attempt, .reply_gen = reply_gen,
                            .reply_to = (uint8_t)reply_to, .at_ms = now_ms(s)};
    if (!c->primary || c->quiescing || c->held_count >= SIM_QUEUE_MAX ||
        c->pending_count == SIM_PENDING_MAX) {
        answer(s, p, &w, false);
        return;
    }
    w.seq = c->next_seq++;
    sim_data_watch(s, qi, "b%u takes m%u as seq %" PRIu64, p + 1, msg, w.seq);
    if (!hold(s, c, w.seq, msg))
        return;
    for (uint8_t i = 0; i < c->streams_count; i++) {
        struct sim_stream *st = &c->streams[i];
        if (st->state == SIM_STREAM_LIVE || st->state == SIM_STREAM_CATCHING_UP)
            stream_send(s, p, c, st, (struct sim_frame){.kind = SIM_F_REPLICATE,
                                                        .queue = (uint8_t)qi, .seq = w.seq,
                                                        .msg = msg});
    }
    if (!replicated_everywhere(c, w.seq) || c->pending_count > 0 || !lease_fresh(s, p))
        c->pending[c->pending_count++] = w;
    else
        confirm(s, p, qi, c, &w);
}

/* A consumer acked the oldest message of p's queue: it leaves it, and
 * every backup streamed to is told (basic.quay-settle). */
void sim_data_consume(struct sim *s, unsigned p, unsigned qi)
{
    struct sim_copy *c = &s->data->copies[p][qi];
    if (!c->primary || c->held_count == 0)
        return;
    struct sim_entry e = c->held[0];
    sim_data_watch(s, qi, "b%u: a consumer acks m%u", p + 1, e.msg);
    unhold(c, e.seq);
    s->data->msgs[e.msg].consumed = true;
    s->data->consumed++;
    for (uint8_t i = 0; i < c->streams_count; i++) {
        struct sim_stream *st = &c->streams[i];
        if (st->state == SIM_STREAM_LIVE || st->state == SIM_STREAM_CATCHING_UP)
            stream_send(s, p, c, st, (struct sim_frame){.kind = SIM_F_SETTLE,
                                                        .queue = (uint8_t)qi, .seq = e.seq});
    }
}

bool sim_data_quiet(struct sim *s, unsigned p, unsigned qi, uint32_t target_id)
{
    struct sim_copy *c = &s->data->copies[p][qi];
    if (!c->primary)
        return false;
    c->quiescing = true;
    for (uint8_t i = 0; i < c->streams_count; i++) {
        const struct sim_stream *st = &c->streams[i];
        if (st->backup_id == target_id)
            return c->pending_count == 0 && st->state == SIM_STREAM_LIVE && st->gating &&
                   st->acked_seq >= c->next_seq - 1;
    }
    return false;
}

/* ---- the backup's side (member.c's replica_target, replica.c) ---- */

static void on_stream(struct sim *s, unsigned from, unsigned to, const struct sim_frame *f)
{
    struct sim_broker *b = &s->brokers[to];
    struct sim_copy *c = &s->data->copies[to][f->queue];
    uint64_t stream_version = f->kind == SIM_F_RESET ? f->seq : c->stream_version;
    bool accepts = fence_replica_accepts(map_queue_of(b, f->queue), b->id, f->epoch,
                                         b->map.version, stream_version);
    struct sim_frame ack = {.kind = SIM_F_ACK, .queue = f->queue, .epoch = f->epoch,
                            .seq = f->seq, .stream = f->stream, .ok = accepts};
    if (!accepts) {
        sim_data_watch(s, f->queue, "b%u refuses b%u's stream (kind %u, epoch %" PRIu64 ")",
                       b->id, from + 1, f->kind, f->epoch);
        if (f->kind == SIM_F_REPLICATE || f->kind == SIM_F_PROBE || f->kind == SIM_F_VERIFY)
            sim_link_send(s, to, from, ack);
        return;
    }
    if (c->primary) {
        sim_fail(s, "%s: b%u takes b%u's stream while it is the primary itself",
                 sim_queue_names[f->queue], b->id, from + 1);
        return;
    }
    switch (f->kind) {
    case SIM_F_RESET:
        sim_data_watch(s, f->queue, "b%u resets its replica (from b%u)", b->id, from + 1);
        c->held_count = 0;
        c->last_seq = 0;
        c->stream_version = f->seq;
        c->emptied = false; /* caught up from here */
        c->from = (uint8_t)from;
        c->from_seq = 0;
        return;
    case SIM_F_SETTLE:
        unhold(c, f->seq);
        return;
    case SIM_F_PROBE:
        break;
    case SIM_F_VERIFY: {
        struct replica_digest d = digest_of(c);
        ack.ok = d.count == f->digest.count && d.sum == f->digest.sum;
        sim_data_watch(s, f->queue, "b%u verifies b%u's promotion: %s", b->id, from + 1,
                       ack.ok ? "the same" : "different: to be caught up");
        break;
    }
    default: { /* SIM_F_REPLICATE */
        /* Checker: a stream's seqs only grow (until a reset). */
        if (c->from == from && c->from_epoch == f->epoch && f->seq <= c->from_seq)
            sim_fail(s, "%s: b%u sent seq %" PRIu64 " to b%u after %" PRIu64 " (epoch %" PRIu64
                     ")", sim_queue_names[f->queue], from + 1, f->seq, b->id, c->from_seq,
                     f->epoch);
        c->from = (uint8_t)from;
        c->from_epoch = f->epoch;
        c->from_seq = f->seq;
        enum fence_push fate = fence_replica_push(c->last_seq, c->last_epoch, f->seq, f->epoch);
        sim_data_watch(s, f->queue, "b%u gets m%u (seq %" PRIu64 ") from b%u: %s", b->id,
                       f->msg, f->seq, from + 1,
                       fate == FENCE_PUSH_TAKE ? "new" : fate == FENCE_PUSH_HAVE ? "has it"
                                                                                 : "refused");
        if (fate == FENCE_PUSH_TAKE) {
            hold(s, c, f->seq, f->msg);
            c->last_seq = f->seq;
            c->last_epoch = f->epoch;
        }
        ack.ok = fate != FENCE_PUSH_REFUSE;
        break;
    }
    }
    sim_link_send(s, to, from, ack);
}

void sim_data_receive(struct sim *s, unsigned from, unsigned to, const struct sim_frame *f)
{
    switch (f->kind) {
    case SIM_F_FORWARD: sim_client_forward_arrives(s, from, to, f); return;
    case SIM_F_ANSWER: sim_client_answer(s, f->msg, f->attempt, f->ok); return;
    case SIM_F_SYNC: return; /* (it held the link until the map was there) */
    case SIM_F_ACK: on_ack(s, to, f); return;
    default: on_stream(s, from, to, f); return;
    }
}

/* ---- links, restarts, the tick ---- */

/* The link between i and j died: the streams on it fail. */
void sim_data_link_down(struct sim *s, unsigned i, unsigned j)
{
    for (unsigned k = 0; k < 2; k++) {
        unsigned p = k ? j : i, other = k ? i : j;
        for (unsigned qi = 0; qi < SIM_QUEUES; qi++) {
            struct sim_copy *c = &s->data->copies[p][qi];
            for (uint8_t n = 0; c->primary && n < c->streams_count; n++) {
                struct sim_stream *st = &c->streams[n];
                if (st->backup_id == other + 1 && (st->state == SIM_STREAM_LIVE ||
                                                   st->state == SIM_STREAM_CATCHING_UP))
                    stream_fail(s, qi, c, st);
            }
        }
    }
}

uint64_t sim_data_drop(struct sim *s, unsigned p, unsigned qi)
{
    const struct sim_copy *c = &s->data->copies[p][qi];
    return c->primary ? 0 : c->drop_epoch;
}

uint32_t sim_data_hand_off(struct sim *s, unsigned p, unsigned qi, uint64_t *epoch)
{
    const struct sim_copy *c = &s->data->copies[p][qi];
    *epoch = c->epoch;
    return c->primary ? BROKER_ID_NONE : c->hand_off_to;
}

/* A new process on i's disk: a primary's queue comes back from its
 * journal, and so does a durable queue's replica from its log, as a
 * queue held until the sync (durable_replica_log_open): one the present
 * map makes ours (promoted as we died) serves what the replica had, else
 * it is dropped (detach). A transient queue's copies are gone; and what
 * was in memory (confirms waiting, streams). */
void sim_data_restart(struct sim *s, unsigned i)
{
    for (unsigned qi = 0; qi < SIM_QUEUES; qi++) {
        struct sim_copy *c = &s->data->copies[i][qi];
        bool replica_log = !c->journal && !sim_data_transient(qi) && c->held_count > 0;
        if (replica_log) {
            uint64_t top = c->held[c->held_count - 1].seq;
            c->next_seq = (c->last_seq > top ? c->last_seq : top) + 1; /* (its log's last) */
            c->journal = true;
        }
        bool journal = c->journal && !sim_data_nondurable(qi); /* (nothing on disk) */
        sim_data_watch(s, qi, "b%u restarts (primary %d, holds %u%s)", i + 1, journal && !replica_log,
                       c->held_count, replica_log ? " in its replica log" : "");
        c->primary = c->quiescing = c->ask = false;
        c->hand_off_to = BROKER_ID_NONE;
        c->drop_epoch = 0;
        c->pending_count = 0;
        c->streams_count = 0;
        c->from_seq = 0;
        if (c->journal && sim_data_transient(qi)) { /* (a primary's, durable or not) */
            for (uint32_t k = 0; k < c->held_count; k++)
                s->data->msgs[c->held[k].msg].restart_pending |= 1u << i;
        }
        c->recovered = journal;
        c->waking = true;
        c->restart_wait = false;
        c->stream_version = 0;
        c->emptied = !journal && c->held_count > 0; /* (it lost something) */
        if (!journal || sim_data_transient(qi)) {
            c->held_count = 0;
            c->last_seq = 0;
        } else {
            c->last_seq = c->next_seq - 1;
        }
    }
    s->data->parked_count[i] = 0;
}

/* member_set_in_sync: asked of the leader, if it can be reached, when
 * the map's set differs from the one wanted (fence_stream_wanted: the live
 * streams that gate confirms, and those whose join was asked); the same
 * set is not asked again within SIM_ASK_RETRY_MS. */
static void submit_in_sync(struct sim *s, struct sim_broker *b, unsigned qi, struct sim_copy *c,
                           uint64_t now)
{
    const struct map_queue *q = map_queue_of(b, qi);
    uint32_t ids[CLUSTER_BACKUPS_MAX], incarnations[CLUSTER_BACKUPS_MAX];
    uint8_t n = 0;
    for (uint8_t i = 0; i < c->streams_count; i++) {
        bool in_sync = q != NULL && map_queue_backup_in_sync(q, c->streams[i].backup_id);
        if (fence_stream_wanted(in_sync, c->streams[i].join_asked,
                                c->streams[i].state == SIM_STREAM_LIVE)) {
            incarnations[n] = c->streams[i].incarnation;
            ids[n++] = c->streams[i].backup_id;
        }
    }
    if (n == c->asked_count && memcmp(ids, c->asked, n * sizeof ids[0]) == 0 &&
        now - c->asked_ms < SIM_ASK_RETRY_MS)
        return;
    c->ask = false;
    if (q == NULL || q->epoch != c->epoch)
        return;
    uint8_t mask = 0;
    for (uint8_t i = 0; i < n; i++) {
        for (uint8_t slot = 0; slot < q->backups_count; slot++)
            mask |= q->backup_ids[slot] == ids[i] ? (uint8_t)(1u << slot) : 0;
    }
    unsigned li = raft_fixture_leader_index(&s->f);
    if (mask == q->in_sync_mask || li >= s->f.n || !sim_net_reachable(s, b->index, li))
        return;
    struct map_cmd cmd;
    if (map_cmd_queue_set_in_sync(&cmd, q->vhost->name, q->name, c->epoch, ids, incarnations,
                                  n) != OK)
        return;
    if (!sim_propose_cmd(&s->brokers[li], &cmd, SIM_REQUEST, b->id))
        return;
    c->asked_ms = now;
    memcpy(c->asked, ids, n * sizeof ids[0]);
    c->asked_count = n;
}

/* replication.c's tick_one. */
static void tick_one(struct sim *s, struct sim_broker *b, unsigned qi, struct sim_copy *c,
                     uint64_t now)
{
    unsigned p = b->index;
    uint64_t oldest = c->pending_count > 0 ? c->pending[0].at_ms : now;
    bool lagging = now - oldest >= SIM_LAG_MS && lease_fresh(s, p);
    for (uint8_t i = 0; i < c->streams_count; i++) {
        struct sim_stream *st = &c->streams[i];
        if (lagging && st->gating && st->state != SIM_STREAM_FAILED &&
            st->acked_seq < c->pending[0].seq && now - st->progress_ms >= SIM_LAG_MS)
            stream_fail(s, qi, c, st);
        else if (!st->gating && (st->state == SIM_STREAM_IDLE ||
                                 st->state == SIM_STREAM_FAILED))
            catch_up(s, p, qi, c, st);
        else if (st->state == SIM_STREAM_CATCHING_UP && now - st->progress_ms >= SIM_STALL_MS)
            stream_fail(s, qi, c, st);
    }
    if (c->ask || now - c->checked_ms >= SIM_ASK_RETRY_MS) {
        c->checked_ms = now;
        submit_in_sync(s, b, qi, c, now);
    }
    drain(s, p, qi, c);
}

void sim_data_primaries_tick(struct sim *s, uint64_t now)
{
    struct sim_data *d = s->data;
    for (unsigned i = 0; i < s->f.n; i++) {
        struct sim_broker *b = &s->brokers[i];
        if (!s->f.servers[i].alive)
            continue;
        /* node_heartbeat.c's lease, from what b heard of its map's brokers. */
        uint64_t heard[CLUSTER_BROKERS_MAX];
        uint32_t n = 0;
        bool member = false;
        for (uint32_t k = 0; k < b->map.brokers_count; k++) {
            uint32_t id = b->map.brokers[k]->id;
            if (id == b->id)
                member = true;
            else
                heard[n++] = id <= SIM_SERVERS ? fence_heard_ms(&b->lease_heard[id], b->map.version)
                                               : 0;
        }
        d->lease_until[i] = fence_lease_until(heard, n, member, SIM_LEASE_MS);
        for (unsigned qi = 0; qi < SIM_QUEUES; qi++) {
            if (d->copies[i][qi].primary)
                tick_one(s, b, qi, &d->copies[i][qi], now);
            else if (d->copies[i][qi].restart_wait) /* (mirror_tick) */
                follow_queue(s, b, qi, map_queue_of(b, qi));
        }
    }
}
