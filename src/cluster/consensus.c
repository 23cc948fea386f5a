/*
 * consensus.c: consensus.h on libraft 0.15 (libuv disk backend) and the
 * authenticated transport of raft_transport.c.
 *
 * Owns: the struct raft and its raft_io/transport, the queue of membership
 * changes (run one at a time on the leader), the join client (retries,
 * redirects, backoff), the proposals in flight, three loop timers and a
 * prepare handle:
 *
 *   watch  polls libraft for a change of leader (0.15 has no callback for
 *          it) every 10 ms, and notices lost leadership;
 *   ops    runs the next membership step outside libraft's callbacks;
 *   join   paces join attempts;
 *   probe  before each poll, corrects how the leader probes its
 *          followers (see probe_tune).
 *
 * Apply results: libraft stops applying (and retries the same entry
 * forever) if fsm->apply returns non-zero, so our apply always returns 0
 * to libraft and carries the map's status to the proposer by index.
 *
 * Must never: block the loop; call libraft from inside a libraft callback
 * when a deferred call will do (membership steps go through the ops timer);
 * hand libraft memory not from raft_malloc().
 */
#include "cluster/consensus.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <raft.h>
#include <raft/uv.h>

#include "cluster/raft_transport.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/list.h"
#include "lib/log.h"

#define PROPOSALS_MAX 65536
#define MEMBER_OPS_MAX 64
#define JOIN_REDIRECT_HOPS_MAX 3
#define JOIN_BACKOFF_MIN_MS 50
#define JOIN_BACKOFF_MAX_MS 2000
#define CONNECT_RETRY_DELAY_MS 200

static_assert(CONSENSUS_ADDRESS_SIZE_MAX == RAFT_TRANSPORT_ADDRESS_SIZE_MAX, "same limit");

enum op_kind { OP_ADD, OP_REMOVE, OP_PROMOTE };

/* A membership change waiting for, or running on, the leader. Owned by
 * c->ops until completed. */
struct member_op {
    struct list_node link;
    struct consensus *c;
    enum op_kind kind;
    bool waiting;  /* a libraft change request is outstanding */
    bool assign;   /* OP_ADD: added, the role assignment is next */
    uint64_t id;
    char address[CONSENSUS_ADDRESS_SIZE_MAX + 1];
    struct raft_change change;
    consensus_done_fn done; /* may be NULL */
    void *req_ctx;
    struct raft_transport_join *join; /* set for requests from the join RPC */
};

/* One proposal in flight; owned by libraft's request queue until its
 * callback. */
struct proposal {
    struct raft_apply req;
    struct consensus *c;
    consensus_done_fn done;
    void *req_ctx;
};

struct join_client {
    bool active;
    bool in_flight;
    bool already_member;
    char (*peers)[CONSENSUS_ADDRESS_SIZE_MAX + 1];
    size_t peers_count;
    size_t next_index;
    char redirect[CONSENSUS_ADDRESS_SIZE_MAX + 1];
    unsigned redirect_hops;
    unsigned backoff_ms;
    consensus_done_fn done;
    void *req_ctx;
};

struct consensus {
    uv_loop_t *loop; /* borrowed */
    struct raft raft;
    struct raft_io io;
    struct raft_uv_transport transport;
    struct raft_fsm fsm;
    struct consensus_callbacks cb;
    uint64_t id;
    char address[CONSENSUS_ADDRESS_SIZE_MAX + 1];
    unsigned heartbeat_ms;
    uv_timer_t watch_timer;
    uv_timer_t ops_timer;
    uv_timer_t join_timer;
    uv_prepare_t probe_prepare;
    int handles_open;
    bool stopping;
    uint64_t leader_id_seen;
    bool leader_self_seen;
    uint64_t snapshot_busy_since; /* loop ms; 0: no snapshot being stored */
    bool snapshot_busy_warned;
    struct list_node ops;
    size_t ops_count;
    struct member_op *op_running;
    bool promote_after_remove;
    struct join_client join;
    size_t proposals_count;
    uint64_t apply_status_index; /* carries the map's apply status to the proposer */
    int apply_status;
    struct consensus_stats stats;
    void (*closed)(void *ctx);
    void *closed_ctx;
    /* libraft's own raft_io close and the callback raft gave it: see
     * io_close_once. */
    void (*io_close)(struct raft_io *io, raft_io_close_cb cb);
    raft_io_close_cb io_closed_cb;
    bool io_closed;
    bool io_released; /* at once, when raft never started */
    struct list_node remains_link; /* in remains, once closed */
};

/* Consensus objects closed but not freed (consensus_release_remains): what
 * libraft 0.15 may still touch. Its raft_io can report itself closed while
 * an open segment is still being finalized or its writer closed, and then
 * report it again when that completes (upstream tried to stop the second
 * call and reverted it); freeing the I/O in the first report let the
 * finalize run on freed memory (a SEGV at shutdown, ARCHITECTURE.md 12).
 * So the I/O, the transport and the struct that holds them stay until the
 * loop has run dry, and a second report is ignored (io_close_once). One
 * list per process: a broker closes its consensus once, at shutdown or
 * after a failed start. */
static struct list_node remains = LIST_INIT(remains);

/* ---- errors ---- */

static int error_from_raft(int rv)
{
    switch (rv) {
    case 0: return OK;
    case RAFT_NOTLEADER: return CONSENSUS_E_NOT_LEADER;
    case RAFT_LEADERSHIPLOST: return CONSENSUS_E_LEADERSHIP_LOST;
    case RAFT_SHUTDOWN:
    case RAFT_CANCELED: return CONSENSUS_E_SHUTDOWN;
    case RAFT_CANTCHANGE:
    case RAFT_BUSY:
    case RAFT_TOOMANY: return CONSENSUS_E_BUSY;
    case RAFT_DUPLICATEID:
    case RAFT_DUPLICATEADDRESS: return CONSENSUS_E_CONFLICT;
    case RAFT_BADID:
    case RAFT_NOTFOUND: return CONSENSUS_E_NOT_FOUND;
    case RAFT_NOMEM: return E_NOMEM;
    case RAFT_IOERR:
    case RAFT_NOSPACE:
    case RAFT_CORRUPT:
    case RAFT_NOCONNECTION: return CONSENSUS_E_IO;
    default: return CONSENSUS_E_INVALID;
    }
}

const char *consensus_strerror(int error)
{
    switch (error) {
    case OK: return "ok";
    case CONSENSUS_E_NOT_LEADER: return "not the leader";
    case CONSENSUS_E_LEADERSHIP_LOST: return "leadership lost before commit";
    case CONSENSUS_E_SHUTDOWN: return "shutting down";
    case CONSENSUS_E_BUSY: return "busy";
    case CONSENSUS_E_CONFLICT: return "id or address in use";
    case CONSENSUS_E_INVALID: return "invalid argument";
    case CONSENSUS_E_IO: return "I/O error";
    case CONSENSUS_E_APPLY: return "apply failed";
    case CONSENSUS_E_NOT_FOUND: return "no such member";
    case E_NOMEM: return "out of memory";
    default: return "unknown error";
    }
}

/* ---- the state machine bridge ---- */

static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct consensus *c = fsm->data;
    ASSERT(c != NULL);
    ASSERT(buf != NULL);
    uint64_t index = raft_last_applied(&c->raft) + 1;
    ASSERT(index > c->apply_status_index || c->apply_status_index == 0);
    *result = NULL;
    int rv = c->cb.apply(c->cb.ctx, index, buf->base, buf->len, result);
    if (rv != 0)
        LOG_DEBUG("consensus id=%llu: apply of entry %llu failed (%s, %d)",
                  (unsigned long long)c->id, (unsigned long long)index, error_name(rv), rv);
    c->apply_status_index = index;
    c->apply_status = rv;
    c->stats.applied_count++;
    return 0; /* see the file comment */
}

static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct consensus *c = fsm->data;
    ASSERT(c != NULL);
    uint8_t *data = NULL;
    size_t size = 0;
    int rv = c->cb.snapshot(c->cb.ctx, &data, &size);
    if (rv != 0)
        return RAFT_IOERR;
    ASSERT(data != NULL || size == 0);
    struct raft_buffer *b = raft_malloc(sizeof *b);
    void *copy = raft_malloc(size > 0 ? size : 1);
    if (b == NULL || copy == NULL) {
        raft_free(b);
        raft_free(copy);
        free(data);
        return RAFT_NOMEM;
    }
    if (size > 0)
        memcpy(copy, data, size);
    free(data);
    b->base = copy;
    b->len = size;
    *bufs = b;
    *n_bufs = 1;
    c->stats.snapshot_count++;
    LOG_DEBUG("consensus id=%llu: snapshot at %llu, %zu bytes", (unsigned long long)c->id,
              (unsigned long long)raft_last_applied(&c->raft), size);
    return 0;
}

static int fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct consensus *c = fsm->data;
    ASSERT(c != NULL);
    ASSERT(buf != NULL);
    int rv = c->cb.restore(c->cb.ctx, buf->base, buf->len);
    if (rv != 0) {
        LOG_ERROR("consensus id=%llu: restoring a snapshot failed (%s, %d)",
                  (unsigned long long)c->id, error_name(rv), rv);
        return RAFT_CORRUPT; /* libraft keeps ownership of buf on failure */
    }
    raft_free(buf->base);
    c->stats.restore_count++;
    LOG_INFO("consensus id=%llu: restored a snapshot of %zu bytes", (unsigned long long)c->id,
             buf->len);
    return 0;
}

/* ---- membership queries ---- */

static const struct raft_server *config_find(const struct consensus *c, uint64_t id)
{
    const struct raft_configuration *conf = &c->raft.configuration;
    for (unsigned i = 0; i < conf->n; i++) {
        if (conf->servers[i].id == id)
            return &conf->servers[i];
    }
    return NULL;
}

static unsigned config_count(const struct consensus *c, int role)
{
    const struct raft_configuration *conf = &c->raft.configuration;
    unsigned n = 0;
    for (unsigned i = 0; i < conf->n; i++)
        n += conf->servers[i].role == role;
    return n;
}

size_t consensus_members(const struct consensus *c, struct consensus_member *out, size_t max)
{
    ASSERT(c != NULL);
    ASSERT(out != NULL || max == 0);
    const struct raft_configuration *conf = &c->raft.configuration;
    for (unsigned i = 0; i < conf->n && i < max; i++) {
        out[i].id = conf->servers[i].id;
        snprintf(out[i].address, sizeof out[i].address, "%s", conf->servers[i].address);
        out[i].role = conf->servers[i].role == RAFT_VOTER     ? CONSENSUS_ROLE_VOTER
                      : conf->servers[i].role == RAFT_STANDBY ? CONSENSUS_ROLE_STANDBY
                                                              : CONSENSUS_ROLE_SPARE;
    }
    return conf->n;
}

bool consensus_is_leader(const struct consensus *c)
{
    ASSERT(c != NULL);
    return !c->stopping && raft_state((struct raft *)&c->raft) == RAFT_LEADER;
}

uint64_t consensus_leader(const struct consensus *c, const char **address)
{
    ASSERT(c != NULL);
    raft_id id = 0;
    const char *a = NULL;
    if (!c->stopping)
        raft_leader((struct raft *)&c->raft, &id, &a);
    if (address != NULL)
        *address = a;
    return id;
}

uint64_t consensus_last_applied(const struct consensus *c)
{
    ASSERT(c != NULL);
    return raft_last_applied((struct raft *)&c->raft);
}

uint64_t consensus_term(const struct consensus *c)
{
    ASSERT(c != NULL);
    return c->raft.current_term;
}

void consensus_stats(const struct consensus *c, struct consensus_stats *out)
{
    ASSERT(c != NULL);
    ASSERT(out != NULL);
    *out = c->stats;
    struct raft_transport_stats ts;
    raft_transport_stats(&c->transport, &ts);
    out->auth_failure_count = ts.auth_failure_count;
    out->handshake_timeout_count = ts.timeout_count;
    out->malformed_count = ts.malformed_count;
    out->refused_count = ts.refused_count;
}

void consensus_log_state(const struct consensus *c, struct consensus_log *out)
{
    ASSERT(c != NULL);
    ASSERT(out != NULL);
    struct raft *r = (struct raft *)&c->raft;
    *out = (struct consensus_log){.term = r->current_term, .last_index = raft_last_index(r),
                                  .commit_index = r->commit_index,
                                  .applied_index = raft_last_applied(r)};
    if (c->snapshot_busy_since != 0)
        out->snapshot_busy_ms = uv_now(c->loop) - c->snapshot_busy_since + 1;
}

/* libraft's progress states (src/progress.h, not installed). */
#define PROGRESS_PROBE 0
#define PROGRESS_PIPELINE 1
#define PROGRESS_SNAPSHOT 2

size_t consensus_followers(const struct consensus *c, struct consensus_follower *out, size_t max)
{
    ASSERT(c != NULL);
    ASSERT(out != NULL || max == 0);
    if (!consensus_is_leader(c))
        return 0;
    const struct raft_configuration *conf = &c->raft.configuration;
    size_t n = 0;
    for (unsigned i = 0; i < conf->n; i++) {
        if (conf->servers[i].id == c->id)
            continue;
        const struct raft_progress *p = &c->raft.leader_state.progress[i];
        ASSERT(p->state <= PROGRESS_SNAPSHOT);
        if (n < max) {
            out[n] = (struct consensus_follower){
                .id = conf->servers[i].id,
                .state = p->state == PROGRESS_PROBE      ? CONSENSUS_REPLICATION_PROBE
                         : p->state == PROGRESS_PIPELINE ? CONSENSUS_REPLICATION_PIPELINE
                                                         : CONSENSUS_REPLICATION_SNAPSHOT,
                .next_index = p->next_index, .match_index = p->match_index,
                .heard = p->recent_recv};
        }
        n++;
    }
    return n;
}

const char *consensus_replication_name(enum consensus_replication state)
{
    switch (state) {
    case CONSENSUS_REPLICATION_PROBE: return "probe";
    case CONSENSUS_REPLICATION_PIPELINE: return "pipeline";
    case CONSENSUS_REPLICATION_SNAPSHOT: return "snapshot";
    }
    return "?";
}

/* ---- probing followers ---- */

/* Two corrections to libraft 0.15's probing of followers, made on the
 * leader before each poll. struct raft_progress is public in raft.h.
 *
 * Rewind. A send that fails (the follower unreachable: a partition, a
 * restart) puts the follower back to probing from match_index + 1, which
 * is 1 for a follower not heard from in this term; and from 1 libraft goes
 * straight to InstallSnapshot once the log is compacted. So after every
 * partition longer than a connect attempt the follower was sent the whole
 * map instead of the entries it missed, and a snapshot is the fragile
 * path: 0.15 ignores one that arrives while the follower stores a snapshot
 * of its own, and sends it again only after the install timeout (in the
 * cluster soak, seed 1202, a broker behind a healed partition got its map
 * 22 s late that way). A follower not heard from is probed from the end of
 * the log instead, as libraft does for a new leader: its answer carries its
 * last index and the probe jumps there, and only a follower behind the
 * compacted part of the log gets the snapshot.
 *
 * Hurry. A probing follower is sent at most one AppendEntries per
 * heartbeat, and a rejection moves the probe back one entry only when the
 * follower's log ends in entries of a term the leader never had. The
 * leader clears last_send of every probing follower it heard from within
 * the election timeout, so the rejection read in this poll is answered by
 * the next probe at once: the walk back runs at the round trip, not at 10
 * entries a second. A follower not heard from keeps libraft's pace, so a
 * dead one is not sent the log's tail on every new entry. */
static void probe_tune(uv_prepare_t *prepare)
{
    struct consensus *c = prepare->data;
    ASSERT(prepare == &c->probe_prepare);
    if (c->stopping || raft_state(&c->raft) != RAFT_LEADER)
        return;
    const struct raft_configuration *conf = &c->raft.configuration;
    raft_index last = raft_last_index(&c->raft);
    for (unsigned i = 0; i < conf->n; i++) {
        struct raft_progress *p = &c->raft.leader_state.progress[i];
        if (conf->servers[i].id == c->id || p->state != PROGRESS_PROBE)
            continue;
        if (!p->recent_recv) {
            if (p->match_index == 0 && p->next_index == 1 && last > 1) {
                p->next_index = last + 1;
                c->stats.probe_rewind_count++;
            }
        } else if (p->last_send != 0) {
            p->last_send = 0;
            c->stats.probe_hurry_count++;
        }
    }
}

/* ---- proposals ---- */

static void proposal_done(struct raft_apply *req, int status, void *result)
{
    struct proposal *p = req->data;
    struct consensus *c = p->c;
    ASSERT(p != NULL);
    ASSERT(c->proposals_count > 0);
    c->proposals_count--;
    int error = error_from_raft(status);
    if (status == 0 && c->apply_status_index == req->index && c->apply_status != 0)
        error = CONSENSUS_E_APPLY;
    if (p->done != NULL)
        p->done(p->req_ctx, error, error == 0 ? result : NULL);
    free(p);
}

int consensus_propose(struct consensus *c, const uint8_t *cmd, size_t size, consensus_done_fn done,
                      void *req_ctx)
{
    ASSERT(cmd != NULL || size == 0);
    struct consensus_cmd one = {cmd, size};
    return consensus_propose_many(c, &one, 1, done, req_ctx);
}

int consensus_propose_many(struct consensus *c, const struct consensus_cmd *cmds, uint32_t n,
                           consensus_done_fn done, void *req_ctx)
{
    ASSERT(c != NULL);
    ASSERT(cmds != NULL && n > 0);
    if (c->stopping)
        return CONSENSUS_E_SHUTDOWN;
    if (raft_state(&c->raft) != RAFT_LEADER)
        return CONSENSUS_E_NOT_LEADER;
    if (c->proposals_count >= PROPOSALS_MAX)
        return CONSENSUS_E_BUSY;
    struct proposal *p = calloc(1, sizeof *p);
    struct raft_buffer *bufs = calloc(n, sizeof *bufs);
    bool ok = p != NULL && bufs != NULL;
    for (uint32_t i = 0; ok && i < n; i++) {
        bufs[i].len = cmds[i].size;
        bufs[i].base = raft_malloc(cmds[i].size > 0 ? cmds[i].size : 1);
        ok = bufs[i].base != NULL;
        if (ok && cmds[i].size > 0)
            memcpy(bufs[i].base, cmds[i].bytes, cmds[i].size);
    }
    int rv = 0;
    if (ok) {
        p->c = c;
        p->done = done;
        p->req_ctx = req_ctx;
        p->req.data = p;
        /* libraft keeps the buffers (the data), not the array. */
        rv = raft_apply(&c->raft, &p->req, bufs, n, proposal_done);
    }
    if (!ok || rv != 0) {
        for (uint32_t i = 0; bufs != NULL && i < n; i++)
            raft_free(bufs[i].base);
        free(bufs);
        free(p);
        return ok ? error_from_raft(rv) : E_NOMEM;
    }
    free(bufs);
    c->proposals_count++;
    c->stats.proposed_count += n;
    return OK;
}

/* ---- membership changes (leader) ---- */

static void ops_run(uv_timer_t *timer);

/* Run the next membership step from the loop, outside libraft callbacks. */
static void ops_kick(struct consensus *c)
{
    if (!c->stopping)
        uv_timer_start(&c->ops_timer, ops_run, 0, 0);
}

static void op_reply_join(struct consensus *c, struct member_op *op, int status)
{
    ASSERT(op->join != NULL);
    const char *leader_address = NULL;
    uint64_t leader_id = consensus_leader(c, &leader_address);
    enum raft_transport_join_status js = RAFT_TRANSPORT_JOIN_RETRY;
    if (status == OK)
        js = RAFT_TRANSPORT_JOIN_OK;
    else if (status == CONSENSUS_E_CONFLICT)
        js = RAFT_TRANSPORT_JOIN_REFUSED;
    else if ((status == CONSENSUS_E_NOT_LEADER || status == CONSENSUS_E_LEADERSHIP_LOST) &&
             leader_id != c->id)
        js = RAFT_TRANSPORT_JOIN_REDIRECT;
    if (js != RAFT_TRANSPORT_JOIN_REDIRECT) {
        leader_id = 0;
        leader_address = NULL;
    }
    raft_transport_join_reply(op->join, js, leader_id, leader_address);
    op->join = NULL;
}

static void op_complete(struct member_op *op, int status)
{
    struct consensus *c = op->c;
    ASSERT(!op->waiting);
    ASSERT(c->ops_count > 0);
    list_remove(&op->link);
    c->ops_count--;
    if (c->op_running == op)
        c->op_running = NULL;
    LOG_INFO("consensus id=%llu: member change %s %llu: %s", (unsigned long long)c->id,
             op->kind == OP_ADD ? "add" : op->kind == OP_REMOVE ? "remove" : "promote",
             (unsigned long long)op->id, consensus_strerror(status));
    if (op->kind == OP_REMOVE && status == OK)
        c->promote_after_remove = true;
    if (op->join != NULL)
        op_reply_join(c, op, status);
    if (op->done != NULL)
        op->done(op->req_ctx, status, NULL);
    free(op);
    ops_kick(c);
}

static void op_changed(struct raft_change *change, int status)
{
    struct member_op *op = change->data;
    ASSERT(op != NULL);
    ASSERT(op->waiting);
    op->waiting = false;
    if (status == 0 && op->kind == OP_ADD && !op->assign) {
        op->assign = true; /* added as spare; the role comes next */
        ops_kick(op->c);
        return;
    }
    op_complete(op, error_from_raft(status));
}

static int op_step_add(struct consensus *c, struct member_op *op)
{
    const struct raft_server *s = config_find(c, op->id);
    if (s != NULL && strcmp(s->address, op->address) != 0)
        return CONSENSUS_E_CONFLICT;
    if (s == NULL) {
        if (op->assign)
            return CONSENSUS_E_NOT_FOUND; /* removed meanwhile */
        for (unsigned i = 0; i < c->raft.configuration.n; i++) {
            if (strcmp(c->raft.configuration.servers[i].address, op->address) == 0)
                return CONSENSUS_E_CONFLICT;
        }
        return raft_add(&c->raft, &op->change, op->id, op->address, op_changed);
    }
    if (s->role != RAFT_SPARE)
        return AGAIN; /* already a voter or standby: done */
    op->assign = true;
    int role = config_count(c, RAFT_VOTER) < CONSENSUS_VOTERS_MAX ? RAFT_VOTER : RAFT_STANDBY;
    return raft_assign(&c->raft, &op->change, op->id, role, op_changed);
}

static int op_step(struct consensus *c, struct member_op *op)
{
    ASSERT(!op->waiting);
    const struct raft_server *s = NULL;
    switch (op->kind) {
    case OP_ADD: return op_step_add(c, op);
    case OP_REMOVE:
        if (config_find(c, op->id) == NULL)
            return CONSENSUS_E_NOT_FOUND;
        return raft_remove(&c->raft, &op->change, op->id, op_changed);
    case OP_PROMOTE:
        s = config_find(c, op->id);
        if (s == NULL || s->role != RAFT_STANDBY ||
            config_count(c, RAFT_VOTER) >= CONSENSUS_VOTERS_MAX)
            return AGAIN; /* nothing to do any more */
        return raft_assign(&c->raft, &op->change, op->id, RAFT_VOTER, op_changed);
    }
    return CONSENSUS_E_INVALID;
}

static struct member_op *op_new(struct consensus *c, enum op_kind kind, uint64_t id,
                                const char *address)
{
    ASSERT(id != 0);
    ASSERT(address == NULL || strlen(address) <= CONSENSUS_ADDRESS_SIZE_MAX);
    struct member_op *op = calloc(1, sizeof *op);
    if (op == NULL)
        return NULL;
    op->c = c;
    op->kind = kind;
    op->id = id;
    if (address != NULL)
        snprintf(op->address, sizeof op->address, "%s", address);
    op->change.data = op;
    list_push_back(&c->ops, &op->link);
    c->ops_count++;
    return op;
}

/* After a voter left: promote the first standby, if any, to keep up to
 * CONSENSUS_VOTERS_MAX voters. */
static void ops_maybe_promote(struct consensus *c)
{
    if (!c->promote_after_remove || !list_empty(&c->ops))
        return;
    c->promote_after_remove = false;
    if (config_count(c, RAFT_VOTER) >= CONSENSUS_VOTERS_MAX)
        return;
    const struct raft_configuration *conf = &c->raft.configuration;
    for (unsigned i = 0; i < conf->n; i++) {
        if (conf->servers[i].role == RAFT_STANDBY) {
            op_new(c, OP_PROMOTE, conf->servers[i].id, conf->servers[i].address);
            return;
        }
    }
}

static void ops_run(uv_timer_t *timer)
{
    struct consensus *c = timer->data;
    ASSERT(timer == &c->ops_timer);
    if (c->stopping || (c->op_running != NULL && c->op_running->waiting))
        return;
    if (raft_state(&c->raft) != RAFT_LEADER) {
        list_for_each_safe(pos, &c->ops) {
            struct member_op *op = CONTAINER_OF(pos, struct member_op, link);
            ASSERT(!op->waiting);
            op_complete(op, CONSENSUS_E_NOT_LEADER);
        }
        return;
    }
    ops_maybe_promote(c);
    struct list_node *first = list_first(&c->ops);
    if (first == NULL)
        return;
    struct member_op *op = CONTAINER_OF(first, struct member_op, link);
    ASSERT(c->op_running == NULL || c->op_running == op);
    c->op_running = op;
    int rv = op_step(c, op);
    if (rv == 0) {
        op->waiting = true;
    } else if (rv == AGAIN) {
        op_complete(op, OK);
    } else if (rv == RAFT_CANTCHANGE) {
        uv_timer_start(&c->ops_timer, ops_run, c->heartbeat_ms, 0); /* libraft busy */
    } else {
        op_complete(op, rv < 0 ? rv : error_from_raft(rv));
    }
}

/* A caller's member change, its arguments checked: queued on the leader
 * (done called when it is over). */
static int member_op_submit(struct consensus *c, enum op_kind kind, uint64_t id,
                            const char *address, consensus_done_fn done, void *req_ctx)
{
    if (raft_state(&c->raft) != RAFT_LEADER)
        return CONSENSUS_E_NOT_LEADER;
    if (c->ops_count >= MEMBER_OPS_MAX)
        return CONSENSUS_E_BUSY;
    struct member_op *op = op_new(c, kind, id, address);
    if (op == NULL)
        return E_NOMEM;
    op->done = done;
    op->req_ctx = req_ctx;
    ops_kick(c);
    return OK;
}

int consensus_add_member(struct consensus *c, uint64_t id, const char *address,
                         consensus_done_fn done, void *req_ctx)
{
    ASSERT(c != NULL);
    if (c->stopping)
        return CONSENSUS_E_SHUTDOWN;
    if (id == 0 || address == NULL || strlen(address) == 0 ||
        strlen(address) > CONSENSUS_ADDRESS_SIZE_MAX)
        return CONSENSUS_E_INVALID;
    return member_op_submit(c, OP_ADD, id, address, done, req_ctx);
}

int consensus_remove_member(struct consensus *c, uint64_t id, consensus_done_fn done,
                            void *req_ctx)
{
    ASSERT(c != NULL);
    if (c->stopping)
        return CONSENSUS_E_SHUTDOWN;
    if (id == 0)
        return CONSENSUS_E_INVALID;
    return member_op_submit(c, OP_REMOVE, id, NULL, done, req_ctx);
}

/* The server side of the join RPC (called by the transport). */
static void on_join_request(void *ctx, struct raft_transport_join *join, uint64_t id,
                            const char *address)
{
    struct consensus *c = ctx;
    ASSERT(c != NULL);
    ASSERT(join != NULL);
    LOG_INFO("consensus id=%llu: join request from %llu at %s", (unsigned long long)c->id,
             (unsigned long long)id, address);
    if (c->stopping || c->ops_count >= MEMBER_OPS_MAX) {
        raft_transport_join_reply(join, RAFT_TRANSPORT_JOIN_RETRY, 0, NULL);
        return;
    }
    if (id == c->id) {
        raft_transport_join_reply(join, RAFT_TRANSPORT_JOIN_REFUSED, 0, NULL);
        return;
    }
    if (raft_state(&c->raft) != RAFT_LEADER) {
        const char *leader_address = NULL;
        uint64_t leader_id = consensus_leader(c, &leader_address);
        raft_transport_join_reply(join,
                                  leader_id != 0 ? RAFT_TRANSPORT_JOIN_REDIRECT
                                                 : RAFT_TRANSPORT_JOIN_RETRY,
                                  leader_id, leader_address);
        return;
    }
    struct member_op *op = op_new(c, OP_ADD, id, address);
    if (op == NULL) {
        raft_transport_join_reply(join, RAFT_TRANSPORT_JOIN_RETRY, 0, NULL);
        return;
    }
    op->join = join;
    ops_kick(c);
}

/* libraft cannot take a known id under a new address (it asserts), so an
 * authenticated peer that claims one is refused before its stream goes on. */
static bool on_peer_check(void *ctx, uint64_t id, const char *address)
{
    struct consensus *c = ctx;
    ASSERT(c != NULL);
    ASSERT(address != NULL);
    if (id == c->id)
        return false;
    const struct raft_server *s = config_find(c, id);
    return s == NULL || strcmp(s->address, address) == 0;
}

/* ---- the join client ---- */

static void join_attempt(uv_timer_t *timer);

static void join_finish(struct consensus *c, int status)
{
    struct join_client *j = &c->join;
    ASSERT(j->active);
    ASSERT(!j->in_flight);
    j->active = false;
    free(j->peers);
    j->peers = NULL;
    if (j->done != NULL)
        j->done(j->req_ctx, status, NULL);
}

static void join_retry_later(struct consensus *c)
{
    struct join_client *j = &c->join;
    ASSERT(j->active);
    j->redirect[0] = '\0';
    j->redirect_hops = 0;
    j->backoff_ms = j->backoff_ms == 0 ? JOIN_BACKOFF_MIN_MS : j->backoff_ms * 2;
    if (j->backoff_ms > JOIN_BACKOFF_MAX_MS)
        j->backoff_ms = JOIN_BACKOFF_MAX_MS;
    unsigned jitter = (unsigned)rand() % (j->backoff_ms / 2 + 1);
    uv_timer_start(&c->join_timer, join_attempt, j->backoff_ms / 2 + jitter, 0);
}

static void on_join_reply(void *ctx, int status, enum raft_transport_join_status join_status,
                          uint64_t leader_id, const char *leader_address)
{
    struct consensus *c = ctx;
    struct join_client *j = &c->join;
    ASSERT(j->active);
    ASSERT(j->in_flight);
    j->in_flight = false;
    if (c->stopping) {
        join_finish(c, CONSENSUS_E_SHUTDOWN);
        return;
    }
    if (status != 0) {
        join_retry_later(c);
        return;
    }
    switch (join_status) {
    case RAFT_TRANSPORT_JOIN_OK:
        LOG_INFO("consensus id=%llu: joined the cluster", (unsigned long long)c->id);
        join_finish(c, OK);
        return;
    case RAFT_TRANSPORT_JOIN_REDIRECT:
        if (leader_address != NULL && strcmp(leader_address, c->address) != 0 &&
            j->redirect_hops < JOIN_REDIRECT_HOPS_MAX) {
            LOG_DEBUG("consensus id=%llu: join redirected to %llu at %s",
                      (unsigned long long)c->id, (unsigned long long)leader_id, leader_address);
            snprintf(j->redirect, sizeof j->redirect, "%s", leader_address);
            j->redirect_hops++;
            uv_timer_start(&c->join_timer, join_attempt, 0, 0);
            return;
        }
        join_retry_later(c);
        return;
    case RAFT_TRANSPORT_JOIN_REFUSED:
        LOG_ERROR("consensus id=%llu: join refused: id or address conflicts with a member",
                  (unsigned long long)c->id);
        join_finish(c, CONSENSUS_E_CONFLICT);
        return;
    case RAFT_TRANSPORT_JOIN_RETRY:
        join_retry_later(c);
        return;
    }
    join_retry_later(c);
}

static void join_attempt(uv_timer_t *timer)
{
    struct consensus *c = timer->data;
    struct join_client *j = &c->join;
    ASSERT(timer == &c->join_timer);
    ASSERT(j->active);
    ASSERT(!j->in_flight);
    if (j->already_member) {
        join_finish(c, OK);
        return;
    }
    const char *target = j->redirect;
    if (target[0] == '\0') {
        target = j->peers[j->next_index % j->peers_count];
        j->next_index++;
    }
    c->stats.join_attempt_count++;
    int rv = raft_transport_join_send(&c->transport, target, on_join_reply, c);
    if (rv != 0) {
        LOG_WARN("consensus id=%llu: cannot ask %s to join: %s", (unsigned long long)c->id,
                 target, raft_strerror(rv));
        join_retry_later(c);
        return;
    }
    j->in_flight = true;
}

int consensus_join(struct consensus *c, const char *const *peers, size_t peers_count,
                   consensus_done_fn done, void *req_ctx)
{
    ASSERT(c != NULL);
    ASSERT(peers != NULL || peers_count == 0);
    struct join_client *j = &c->join;
    if (c->stopping)
        return CONSENSUS_E_SHUTDOWN;
    if (j->active)
        return CONSENSUS_E_BUSY;
    bool member = config_find(c, c->id) != NULL;
    if (peers_count == 0 && !member)
        return CONSENSUS_E_INVALID;
    j->peers = calloc(peers_count > 0 ? peers_count : 1, sizeof *j->peers);
    if (j->peers == NULL)
        return E_NOMEM;
    size_t n = 0;
    for (size_t i = 0; i < peers_count; i++) {
        if (strlen(peers[i]) > CONSENSUS_ADDRESS_SIZE_MAX || strcmp(peers[i], c->address) == 0)
            continue;
        snprintf(j->peers[n++], sizeof j->peers[0], "%s", peers[i]);
    }
    if (n == 0 && !member) {
        free(j->peers);
        j->peers = NULL;
        return CONSENSUS_E_INVALID;
    }
    j->active = true;
    j->already_member = member;
    j->peers_count = n;
    j->next_index = 0;
    j->redirect[0] = '\0';
    j->redirect_hops = 0;
    j->backoff_ms = 0;
    j->done = done;
    j->req_ctx = req_ctx;
    uv_timer_start(&c->join_timer, join_attempt, 0, 0);
    return OK;
}

/* ---- watching the leader ---- */

/* libraft keeps the request of the snapshot being stored (taken here or
 * installed from the leader) in struct raft, which raft.h makes public;
 * while it is set a leader's InstallSnapshot is ignored. Watched so that a
 * store that does not finish is seen (and shown in /api/cluster). */
static void watch_snapshot(struct consensus *c)
{
    bool busy = c->raft.snapshot.put.data != NULL || c->raft.snapshot.pending.term != 0;
    uint64_t now = uv_now(c->loop);
    if (!busy) {
        if (c->snapshot_busy_warned)
            LOG_INFO("consensus id=%llu: snapshot stored after %llu ms",
                     (unsigned long long)c->id,
                     (unsigned long long)(now - c->snapshot_busy_since));
        c->snapshot_busy_since = 0;
        c->snapshot_busy_warned = false;
        return;
    }
    if (c->snapshot_busy_since == 0)
        c->snapshot_busy_since = now;
    if (!c->snapshot_busy_warned && now - c->snapshot_busy_since >= CONSENSUS_SNAPSHOT_SLOW_MS) {
        c->snapshot_busy_warned = true;
        LOG_WARN("consensus id=%llu: storing a snapshot has taken %llu ms so far (last index "
                 "%llu, applied %llu); the leader's snapshots are ignored meanwhile",
                 (unsigned long long)c->id, (unsigned long long)(now - c->snapshot_busy_since),
                 (unsigned long long)raft_last_index(&c->raft),
                 (unsigned long long)raft_last_applied(&c->raft));
    }
}

static void watch_tick(uv_timer_t *timer)
{
    struct consensus *c = timer->data;
    ASSERT(timer == &c->watch_timer);
    ASSERT(!c->stopping);
    watch_snapshot(c);
    const char *address = NULL;
    uint64_t leader_id = consensus_leader(c, &address);
    bool self = raft_state(&c->raft) == RAFT_LEADER;
    if (leader_id != c->leader_id_seen || self != c->leader_self_seen) {
        bool lost = c->leader_self_seen && !self;
        c->leader_id_seen = leader_id;
        c->leader_self_seen = self;
        c->stats.leader_change_count++;
        LOG_INFO("consensus id=%llu: leader is %llu%s (term %llu)", (unsigned long long)c->id,
                 (unsigned long long)leader_id, self ? " (self)" : "",
                 (unsigned long long)c->raft.current_term);
        if (c->cb.leader_changed != NULL)
            c->cb.leader_changed(c->cb.ctx, leader_id, address, self);
        if (lost && !list_empty(&c->ops))
            ops_kick(c); /* fail queued changes, the joiners will be redirected */
    }
}

void consensus_tune(struct raft *r, const struct consensus_config *cfg)
{
    raft_set_election_timeout(r, cfg->election_timeout_ms ? cfg->election_timeout_ms : 1000);
    raft_set_heartbeat_timeout(r, cfg->heartbeat_ms ? cfg->heartbeat_ms : 100);
    raft_set_pre_vote(r, true);
    raft_set_snapshot_threshold(r, cfg->snapshot_threshold ? cfg->snapshot_threshold : 1024);
    raft_set_snapshot_trailing(r, cfg->snapshot_trailing ? cfg->snapshot_trailing
                                                         : CONSENSUS_SNAPSHOT_TRAILING);
    /* A snapshot sent to a follower that never answers (the link was cut
     * while it travelled) is sent again only after this; libraft's 30 s
     * left a follower behind a healed partition with its old map for 22 s
     * (the cluster soak, seed 1202; the simulator's seed 135 found it too). */
    raft_set_install_snapshot_timeout(r, CONSENSUS_INSTALL_SNAPSHOT_TIMEOUT_MS);
}

bool consensus_hurry_election(struct consensus *c, unsigned timeout_ms)
{
    ASSERT(c != NULL);
    ASSERT(timeout_ms > 0);
    unsigned short state = c->stopping ? RAFT_UNAVAILABLE : raft_state(&c->raft);
    if (state != RAFT_FOLLOWER && state != RAFT_CANDIDATE)
        return false;
    /* libraft 0.15 has no call for this, and raft_set_election_timeout
     * only takes effect at the next reset of the timer (a leader's
     * message, which will not come): the timer is moved back so that it
     * expires in [t, 2t) from now. struct raft is public; its timer fields
     * are documented in raft.h. */
    raft_time now = c->raft.io->time(c->raft.io);
    unsigned wait = timeout_ms + (unsigned)rand() % timeout_ms;
    unsigned total = state == RAFT_FOLLOWER ? c->raft.follower_state.randomized_election_timeout
                                            : c->raft.candidate_state.randomized_election_timeout;
    raft_time elapsed = now - c->raft.election_timer_start;
    if (total <= wait || elapsed + wait >= total)
        return false; /* it expires sooner anyway */
    c->raft.election_timer_start = now - (total - wait);
    return true;
}

/* ---- start and stop ---- */

/* Our handles are closed and raft has reported its I/O closed: the owner
 * is told; the memory libraft may still touch waits in remains. */
static void consensus_free(struct consensus *c)
{
    ASSERT(c->handles_open == 0);
    ASSERT(c->proposals_count == 0);
    ASSERT(list_empty(&c->ops));
    void (*closed)(void *ctx) = c->closed;
    void *closed_ctx = c->closed_ctx;
    list_push_back(&remains, &c->remains_link);
    if (closed != NULL)
        closed(closed_ctx);
}

void consensus_release_remains(void)
{
    list_for_each_safe(pos, &remains) {
        struct consensus *c = CONTAINER_OF(pos, struct consensus, remains_link);
        list_remove(&c->remains_link);
        if (!c->io_released) {
            raft_uv_close(&c->io);
            raft_transport_release(&c->transport);
        }
        free(c);
    }
}

/* raft_io's close, between raft and libraft's: raft's callback runs once,
 * whatever libraft reports after it (see remains). */
static void io_closed_once(struct raft_io *io)
{
    struct consensus *c = CONTAINER_OF(io, struct consensus, io);
    if (c->io_closed) {
        LOG_WARN("consensus id=%llu: raft I/O reported closed twice (libraft); ignored",
                 (unsigned long long)c->id);
        return;
    }
    c->io_closed = true;
    c->io_closed_cb(io);
}

static void io_close_once(struct raft_io *io, raft_io_close_cb cb)
{
    struct consensus *c = CONTAINER_OF(io, struct consensus, io);
    c->io_closed_cb = cb;
    c->io_close(io, io_closed_once);
}

static void on_handle_closed(uv_handle_t *handle)
{
    struct consensus *c = handle->data;
    ASSERT(c->handles_open > 0);
    if (--c->handles_open == 0)
        consensus_free(c);
}

static void close_handles(struct consensus *c)
{
    uv_close((uv_handle_t *)&c->watch_timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->ops_timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->join_timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->probe_prepare, on_handle_closed);
}

static void on_raft_closed(struct raft *r)
{
    struct consensus *c = r->data;
    ASSERT(c->stopping);
    ASSERT(!c->join.in_flight);
    close_handles(c); /* the I/O and transport: consensus_release_remains */
}

void consensus_stop(struct consensus *c, void (*closed)(void *ctx), void *ctx)
{
    ASSERT(c != NULL);
    ASSERT(!c->stopping);
    LOG_INFO("consensus id=%llu: stopping", (unsigned long long)c->id);
    c->stopping = true;
    c->closed = closed;
    c->closed_ctx = ctx;
    uv_timer_stop(&c->watch_timer);
    uv_timer_stop(&c->ops_timer);
    uv_timer_stop(&c->join_timer);
    uv_prepare_stop(&c->probe_prepare);
    list_for_each_safe(pos, &c->ops) {
        struct member_op *op = CONTAINER_OF(pos, struct member_op, link);
        if (!op->waiting)
            op_complete(op, CONSENSUS_E_SHUTDOWN);
    }
    if (c->join.active && !c->join.in_flight)
        join_finish(c, CONSENSUS_E_SHUTDOWN);
    /* Outstanding proposals, the running change and an in-flight join
     * complete from inside raft_close (libraft fails its requests, the
     * transport cancels its connections). */
    raft_close(&c->raft, on_raft_closed);
}

static int start_raft(struct consensus *c, const struct consensus_config *cfg,
                      bool *initialized, char *err, size_t err_size)
{
    ASSERT(!*initialized);
    int rv = raft_init(&c->raft, &c->io, &c->fsm, cfg->id, cfg->address);
    if (rv != 0) {
        snprintf(err, err_size, "raft init: %s", raft_errmsg(&c->raft));
        return rv;
    }
    *initialized = true;
    c->raft.data = c;
    if (cfg->bootstrap) {
        struct raft_configuration conf;
        raft_configuration_init(&conf);
        rv = raft_configuration_add(&conf, cfg->id, cfg->address, RAFT_VOTER);
        if (rv == 0)
            rv = raft_bootstrap(&c->raft, &conf);
        raft_configuration_close(&conf);
        if (rv == RAFT_CANTBOOTSTRAP) {
            rv = 0; /* the dir already holds state: a restart */
        } else if (rv != 0) {
            snprintf(err, err_size, "raft bootstrap: %s", raft_errmsg(&c->raft));
            return rv;
        }
    }
    consensus_tune(&c->raft, cfg);
    rv = raft_start(&c->raft);
    if (rv != 0) {
        /* libraft 0.15 does not copy the transport's message (a listen
         * that failed: the cluster port taken) into its own. */
        const char *why = raft_errmsg(&c->raft);
        snprintf(err, err_size, "raft start: %s", why[0] != '\0' ? why : c->transport.errmsg);
    }
    return rv;
}

static int check_config(const struct consensus_config *cfg, const struct consensus_callbacks *cb,
                        char *err, size_t err_size)
{
    struct sockaddr_in sa;
    if (cfg->id == 0) {
        snprintf(err, err_size, "cluster id must be > 0");
    } else if (cfg->address == NULL || strlen(cfg->address) > CONSENSUS_ADDRESS_SIZE_MAX ||
               raft_transport_parse_address(cfg->address, &sa) != 0) {
        snprintf(err, err_size, "cluster address must be IPv4 'a.b.c.d:port'");
    } else if (cfg->dir == NULL) {
        snprintf(err, err_size, "no cluster data dir");
    } else if (cfg->secret == NULL || cfg->secret_size < RAFT_TRANSPORT_SECRET_SIZE_MIN ||
               cfg->secret_size > RAFT_TRANSPORT_SECRET_SIZE_MAX) {
        snprintf(err, err_size, "cluster secret must be %d..%d bytes",
                 RAFT_TRANSPORT_SECRET_SIZE_MIN, RAFT_TRANSPORT_SECRET_SIZE_MAX);
    } else if (cb->apply == NULL || cb->snapshot == NULL || cb->restore == NULL) {
        snprintf(err, err_size, "apply, snapshot and restore callbacks are required");
    } else {
        return OK;
    }
    return CONSENSUS_E_INVALID;
}

static void on_start_failed_closed(struct raft *r)
{
    struct consensus *c = r->data;
    close_handles(c); /* the I/O and transport: consensus_release_remains */
}

int consensus_start(struct consensus **out, uv_loop_t *loop, const struct consensus_config *cfg,
                    const struct consensus_callbacks *cb, char *err, size_t err_size)
{
    ASSERT(out != NULL);
    ASSERT(loop != NULL && cfg != NULL && cb != NULL);
    *out = NULL;
    int rv = check_config(cfg, cb, err, err_size);
    if (rv != OK)
        return rv;
    struct consensus *c = calloc(1, sizeof *c);
    if (c == NULL)
        return E_NOMEM;
    c->loop = loop;
    c->cb = *cb;
    c->id = cfg->id;
    snprintf(c->address, sizeof c->address, "%s", cfg->address);
    c->heartbeat_ms = cfg->heartbeat_ms ? cfg->heartbeat_ms : 100;
    list_init(&c->ops);
    c->fsm = (struct raft_fsm){.version = 1, .data = c, .apply = fsm_apply,
                               .snapshot = fsm_snapshot, .restore = fsm_restore};
    struct raft_transport_config tcfg = {
        .secret = cfg->secret, .secret_size = cfg->secret_size,
        .handshake_timeout_ms = cfg->handshake_timeout_ms, .join_timeout_ms = cfg->join_timeout_ms,
        .join = on_join_request, .peer_check = on_peer_check, .ctx = c, .tls = cfg->tls};
    rv = raft_transport_init(&c->transport, loop, &tcfg);
    if (rv == 0 && (rv = raft_uv_init(&c->io, loop, cfg->dir, &c->transport)) != 0) {
        snprintf(err, err_size, "raft io: %s", c->io.errmsg);
        raft_transport_release(&c->transport);
        free(c);
        return error_from_raft(rv);
    }
    if (rv != 0) {
        snprintf(err, err_size, "cluster transport: %s", c->transport.errmsg);
        free(c);
        return error_from_raft(rv);
    }
    raft_uv_set_connect_retry_delay(&c->io, CONNECT_RETRY_DELAY_MS);
    c->io_close = c->io.close;
    c->io.close = io_close_once;
    list_init(&c->remains_link);
    c->handles_open = 4;
    uv_timer_init(loop, &c->watch_timer);
    uv_timer_init(loop, &c->ops_timer);
    uv_timer_init(loop, &c->join_timer);
    uv_prepare_init(loop, &c->probe_prepare);
    c->watch_timer.data = c->ops_timer.data = c->join_timer.data = c->probe_prepare.data = c;
    bool raft_initialized = false;
    rv = start_raft(c, cfg, &raft_initialized, err, err_size);
    if (rv != 0) {
        c->stopping = true;
        if (raft_initialized) {
            c->raft.data = c;
            raft_close(&c->raft, on_start_failed_closed);
        } else {
            raft_uv_close(&c->io); /* libraft never ran: nothing of it is pending */
            raft_transport_release(&c->transport);
            c->io_released = true;
            close_handles(c);
        }
        return error_from_raft(rv);
    }
    /* libraft 0.15 has no callback for a change of leader: polled, often
     * enough that a new leader starts its controller at once. */
    uv_timer_start(&c->watch_timer, watch_tick, 10, 10);
    uv_prepare_start(&c->probe_prepare, probe_tune);
    LOG_INFO("consensus id=%llu: started at %s (dir %s)", (unsigned long long)c->id, c->address,
             cfg->dir);
    *out = c;
    return OK;
}
