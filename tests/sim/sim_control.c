/*
 * sim_control.c: a deterministic simulator of a quay cluster's control
 * plane (issue 19, a first increment).
 *
 * Goal: the cluster decisions (controller.h: liveness, failover, a
 * returning broker, repair, rebalancing; placement.h) and the map they
 * change (map.h), run by several brokers over real Raft (libraft's
 * in-memory fixture: simulated time, network and disks), keep their
 * invariants under crashes, restarts and partitions, for every seed:
 *   - one primary per queue and epoch, on every broker's map (agreement);
 *   - a queue's new primary was an in-sync backup of it (or its primary
 *     coming back to an unavailable queue): no promotion of a copy that
 *     may miss confirmed messages;
 *   - every map passes cluster_map_verify after every apply;
 *   - a restarted broker serves (once its own sync is applied, as
 *     node_request.c's) from a map at least as new as the one its last
 *     incarnation had applied, every queue at an epoch at least as high;
 *   - no queue is held (primary, backup, move target) by a broker that
 *     left the map;
 *   - after the faults heal: every broker's map is the same, every queue
 *     is available on a live primary with its replication factor, all in
 *     sync; every broker not forgotten is in the map and a Raft voter or
 *     standby, a forgotten one in neither; placement plans no move (a
 *     joiner got its share through the rebalance); all within a bound of
 *     simulated time.
 *
 * Method: SIM_BROKERS brokers at first (up to SIM_SERVERS with joiners),
 * each a Raft server whose FSM applies map commands to its own map. Every
 * broker runs node.c's controller tick (broker_tick, every SIM_TICK_MS):
 * while Raft says it leads, consensus.c's member changes one at a time
 * (add a joiner, make it a voter or a standby, remove a leaver, promote a
 * standby), its barrier (its own broker.join), the removal of brokers
 * that left the map and broker.join for Raft members it heard that the
 * map lacks (node.c's, copied), then controller_leader_tick (controller.h), the
 * one function node.c calls too: liveness from the heartbeats it hears
 * while the network lets them through, the periodic round, the policies,
 * with node.c's in-flight counts; a committed broker.state's follow-up is
 * controller_after_state, as in node.c's on_proposal_done. Clients'
 * declarations and what the data path would ask go to the leader as
 * requests: a primary puts its reachable backups in sync (and drops
 * unreachable ones, as its replication does when one stops answering)
 * and hands a moving queue over once the target is in sync (a restarted
 * primary only once it is synced). Faults drawn from the seed: kill a
 * broker; bring it back, mostly as a restart (a new process on the same
 * disk: its map and node.c's state start empty, libraft loads term, vote
 * and log, and replays the log into the map as the leader tells it the
 * commit index, as quayd's FSM apply does at a start), sometimes as a
 * stopped process that goes on (SIGSTOP, SIGCONT: its memory kept);
 * isolate one, cut one direction between two, heal; a new broker joins
 * (an empty disk, added by the leader as quayd's join is); and an
 * operator's drain of a broker and its revive, and forgetting a dead one
 * (controller_forget, asked again until it is gone from the map; then
 * broker.leave takes it out of Raft; it never comes back).
 * Everything, the fixture's elections included, follows from the seed: a
 * failing seed prints itself, and `sim_control --seed N -v` replays it
 * step by step. Raft snapshots are taken every SIM_SNAPSHOT_EVERY entries
 * (a restart loads the latest, a lagging follower gets one installed).
 * sim_disk.c is a seam over the fixture's disk: truncates wait for the
 * appends in flight, as libraft's real I/O does, and the entries a load
 * returns start where the disk's really do.
 *
 * What it does not model yet: the data path itself (links, forwards,
 * replication streams: their checkers are the soak's), a write lost in a
 * crash (the fixture completes a dead server's disk writes in flight), a
 * drained broker that leaves, a joiner that fails to start or is forgotten
 * before it joined, policies (the queues carry their own x-quay-backups),
 * node.c's nudges (an empty entry after each commit: here the fixture's
 * heartbeats carry the commit index) and its batching of a round's
 * commands into one entry. The membership steps (consensus.c's ops,
 * node.c's announce and removal of leavers) are copied, not shared: they
 * need the Raft configuration.
 *
 * Found so far: a rebalance move to a broker that is not a backup of a
 * queue already at CLUSTER_BACKUPS_MAX backups, refused by the map and
 * proposed again every round for ever (seed 443; controller.c make_room);
 * libraft's 30 s snapshot-install timeout leaving a follower behind after
 * a heal (seed 135 with snapshots on; the soak had found it too). In the
 * test fixture only (libraft 0.15's stub I/O; worked around in sim_disk.c
 * and here): its disk truncating behind appends in flight (a heap
 * overflow, seed 329 once deposed leaders proposed too; likely also the
 * overflow installing a snapshot, seed 165, that had kept snapshots off);
 * its load misplacing the entries kept behind a snapshot (a restarted
 * broker replayed the wrong entries: seed 161); its election timeout fixed
 * per server (four servers split the vote for ever: seed 110; drawn
 * again every tick now).
 *
 * Usage: sim_control [--seed N | --seeds FIRST COUNT | --for SECONDS] [--seconds S]
 *                    [--jobs N] [-v]
 * --for runs seeds from a random first one until SECONDS of wall time
 * have passed (CI's random batch; it prints where it started). --jobs N
 * runs them in N processes (every N-th seed each). Exit 0 when every seed
 * passes, 1 on the first that fails (each process stops at its first).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <raft.h>
#include <raft/fixture.h>

#include "amqp/table.h"
#include "cluster/consensus.h"
#include "cluster/controller.h"
#include "cluster/map.h"
#include "cluster/placement.h"
#include "lib/errors.h"
#include "sim_disk.h"

#define SIM_BROKERS 5              /* at the start; others join */
#define SIM_SERVERS RAFT_FIXTURE_MAX_SERVERS /* ever started: up to 3 joiners */
#define SIM_QUEUES 40
#define SIM_TICK_MS 100
#define SIM_FAULT_MIN_MS 1500
#define SIM_FAULT_MAX_MS 5000
#define SIM_HEAL_BOUND_MS 30000     /* after the last fault: converged by then */
#define SIM_DRAIN_MOVES 8        /* an operator's first drain call */
#define SIM_EPOCHS_MAX 65536        /* (queue, epoch) pairs remembered */
#define SIM_SNAPSHOT_EVERY 64       /* entries (quayd: 1024) */
#define SIM_SETTLE_MS 1000          /* a dead server's last I/O has landed by then */

#define B(s) bytes_of_cstr(s)

struct sim;

/* What the checkers remember of one queue as one broker last saw it. */
struct shadow {
    bool known;
    bool available;
    uint32_t primary_id;
    uint64_t epoch;
    uint32_t in_sync[CLUSTER_BACKUPS_MAX];
    uint8_t in_sync_count;
};

struct sim_broker {
    struct sim *sim;
    unsigned index;                /* in the fixture */
    uint32_t id;                   /* map and Raft id: index + 1 */
    struct cluster_map map;
    struct raft_fsm fsm;
    struct sim_disk disk;          /* its Raft log's disk (sim_disk.h) */
    struct shadow shadows[SIM_QUEUES];
    /* node.c's controller state (node_int.h), kept as node.c keeps it. */
    bool leader;                   /* Raft leader at the last tick */
    bool controller_ready;         /* leader, and its barrier committed */
    bool barrier_in_flight;
    uint64_t leader_since_ms;
    struct controller_leader ctl;  /* controller_leader_tick's memory */
    uint32_t proposals_in_flight, liveness_in_flight, policy_in_flight;
    uint64_t last_heard_ms[SIM_SERVERS + 1]; /* its peers' heartbeats */
    bool forgotten;                /* dead for good: an operator forgot it (its disk is gone) */
    bool joining;                  /* started empty: asks to join the Raft members */
    /* node.c's leaving and departed (broker.leave applied: the leader
     * removes it from Raft) and consensus.c's one member change at a time. */
    uint32_t leaving[SIM_SERVERS], leaving_count;
    uint32_t departed[SIM_SERVERS], departed_count;
    bool join_in_flight[SIM_SERVERS + 1]; /* leader: a broker.join proposed for it */
    struct raft_change change;
    bool change_waiting;
    /* node_request.c's sync: a process serves (its queues, its clients)
     * once its own sync, sent through the leader, is applied here. */
    bool synced;
    uint64_t sync_id;               /* the request id of the sync in flight; 0: none */
    uint64_t sync_sent_ms, syncs;
    /* What the last incarnation had applied, and so may have acted on
     * (served, answered): a restarted one serves from a map at least as new. */
    bool restarted;
    uint64_t killed_ms;
    uint64_t version_before;
    struct shadow shadows_before[SIM_QUEUES];
};

/* (queue, epoch) -> the primary every broker's map must agree on. */
struct epoch_record {
    uint32_t queue;
    uint64_t epoch;
    uint32_t primary_id;
};

struct sim {
    uint64_t seed;
    uint64_t rng;
    bool verbose;
    struct raft_fixture f;
    struct sim_broker brokers[SIM_SERVERS];
    bool cut[SIM_SERVERS][SIM_SERVERS]; /* [i][j]: what i sends j is lost */
    int forget_asked;                   /* a broker index an operator forgets, or -1 */
    int drain_asked;                    /* a broker index an operator drains, or -1 */
    struct controller_config config;
    bool declared;
    struct epoch_record *epochs;
    uint32_t epochs_count;
    char failure[512];
    uint64_t trace;                /* a hash of what happened: equal for equal seeds */
    uint64_t applied, proposed, faults;
};

static char queue_names[SIM_QUEUES][16];

/* ---- randomness and failure -------------------------------------------- */

static uint64_t next_random(struct sim *s)
{
    /* xorshift64*: enough for drawing faults, and all ours. */
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 2685821657736338717ull;
}

static uint64_t random_below(struct sim *s, uint64_t n)
{
    return next_random(s) % n;
}

static void trace(struct sim *s, uint64_t v)
{
    s->trace = (s->trace ^ v) * 1099511628211ull;
}

static bool failed(const struct sim *s)
{
    return s->failure[0] != '\0';
}

__attribute__((format(printf, 2, 3))) static void fail(struct sim *s, const char *fmt, ...)
{
    if (failed(s))
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(s->failure, sizeof s->failure, "t=%" PRIu64 "ms: ",
                     (uint64_t)raft_fixture_time(&s->f));
    vsnprintf(s->failure + n, sizeof s->failure - (size_t)n, fmt, ap);
    va_end(ap);
}

static int queue_index(struct bytes name)
{
    for (int i = 0; i < SIM_QUEUES; i++) {
        if (bytes_equal_cstr(name, queue_names[i]))
            return i;
    }
    return -1;
}

/* ---- checkers ---------------------------------------------------------- */

static void check_epoch(struct sim *s, uint32_t queue, uint64_t epoch, uint32_t primary_id)
{
    for (uint32_t i = 0; i < s->epochs_count; i++) {
        struct epoch_record *r = &s->epochs[i];
        if (r->queue == queue && r->epoch == epoch) {
            if (r->primary_id != primary_id)
                fail(s, "%s epoch %" PRIu64 ": primary %u on one map, %u on another",
                     queue_names[queue], epoch, r->primary_id, primary_id);
            return;
        }
    }
    if (s->epochs_count == SIM_EPOCHS_MAX)
        return;
    s->epochs[s->epochs_count++] = (struct epoch_record){queue, epoch, primary_id};
}

static bool shadow_in_sync(const struct shadow *sh, uint32_t id)
{
    for (uint8_t i = 0; i < sh->in_sync_count; i++) {
        if (sh->in_sync[i] == id)
            return true;
    }
    return false;
}

/* After every apply on broker b: compares each queue with what b saw
 * before, then remembers it. */
static void check_queues(struct sim *s, struct sim_broker *b)
{
    const struct cluster_map *map = &b->map;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        int qi = queue_index(q->name);
        if (qi < 0) {
            fail(s, "a queue nobody declared: %.*s", (int)q->name.len, (const char *)q->name.ptr);
            return;
        }
        struct shadow *sh = &b->shadows[qi];
        bool owners_known = cluster_map_broker(map, q->primary_id) != NULL &&
                            (q->move_to == BROKER_ID_NONE ||
                             cluster_map_broker(map, q->move_to) != NULL);
        for (uint8_t k = 0; k < q->backups_count; k++)
            owners_known &= cluster_map_broker(map, q->backup_ids[k]) != NULL;
        if (!owners_known)
            fail(s, "%s on b%u: held by a broker that left the map", queue_names[qi], b->id);
        if (q->available)
            check_epoch(s, (uint32_t)qi, q->epoch, q->primary_id);
        if (sh->known && q->epoch < sh->epoch)
            fail(s, "%s: epoch fell from %" PRIu64 " to %" PRIu64 " on broker %u",
                 queue_names[qi], sh->epoch, q->epoch, b->id);
        /* A new primary of the same incarnation line: it must have held
         * everything confirmed, i.e. been in sync (or be the primary that
         * comes back to its own unavailable queue). */
        /* (Forgetting a broker starts its queues that had no in-sync
         * backup again empty elsewhere: the operator gave their messages up.) */
        bool forgotten = sh->primary_id >= 1 && sh->primary_id <= s->f.n &&
                         s->brokers[sh->primary_id - 1].forgotten;
        if (sh->known && q->primary_id != sh->primary_id && q->available &&
            !shadow_in_sync(sh, q->primary_id) && !forgotten)
            fail(s, "%s: broker %u became primary (epoch %" PRIu64 ") without being in sync "
                 "(primary was %u, in sync: %u of them)", queue_names[qi], q->primary_id,
                 q->epoch, sh->primary_id, sh->in_sync_count);
        sh->known = true;
        sh->available = q->available;
        sh->primary_id = q->primary_id;
        sh->epoch = q->epoch;
        sh->in_sync_count = 0;
        for (uint8_t k = 0; k < q->backups_count; k++) {
            if (map_queue_backup_in_sync(q, q->backup_ids[k]))
                sh->in_sync[sh->in_sync_count++] = q->backup_ids[k];
        }
    }
}

/* ---- the FSM: every broker applies the log to its own map --------------- */

/* The log entry's envelope, as node.c's (node__entry_new): the command's
 * size and a request id (its origin broker in the high half; 0 for the
 * leader's own). */
#define SIM_ENVELOPE 16

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* A restarted broker's own sync came back: it serves from now on, from a
 * map that must hold everything its last incarnation had applied. */
static void synced(struct sim *s, struct sim_broker *b)
{
    b->synced = true;
    b->sync_id = 0;
    if (!b->restarted)
        return;
    if (b->map.version < b->version_before)
        fail(s, "b%u serves from map version %" PRIu64 " after a restart, older than the %"
             PRIu64 " it had applied", b->id, b->map.version, b->version_before);
    for (int qi = 0; qi < SIM_QUEUES; qi++) {
        const struct shadow *was = &b->shadows_before[qi];
        const struct shadow *now = &b->shadows[qi];
        if (was->known && (!now->known || now->epoch < was->epoch))
            fail(s, "b%u serves %s at epoch %" PRIu64 " after a restart, older than the %"
                 PRIu64 " it had", b->id, queue_names[qi], now->epoch, was->epoch);
    }
}

static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct sim_broker *b = fsm->data;
    struct sim *s = b->sim;
    struct map_change change;
    const uint8_t *entry = buf->base;
    uint64_t size = buf->len >= SIM_ENVELOPE ? get_u64(entry) : 0;
    uint64_t request_id = buf->len >= SIM_ENVELOPE ? get_u64(entry + 8) : 0;
    if (size > buf->len - SIM_ENVELOPE)
        fail(s, "broker %u: an entry without its envelope", b->id);
    int rc = cluster_map_apply(&b->map, entry + SIM_ENVELOPE, (size_t)size, &change);
    if (request_id != 0 && request_id == b->sync_id)
        synced(s, b);
    if (rc == OK && change.op == MAP_OP_BROKER_LEAVE && change.changed &&
        b->leaving_count < SIM_SERVERS)
        b->leaving[b->leaving_count++] = change.broker_id; /* (node.c's on_apply) */
    *result = rc == OK ? NULL : (void *)1; /* (node.c: CONSENSUS_E_APPLY when refused) */
    s->applied++;
    trace(s, b->id * 131 + (uint64_t)change.op * 7 + (uint64_t)(rc == OK));
    if (s->verbose && b->index == 0)
        printf("  t=%" PRIu64 " b1 applies %s %.*s: %s%s\n", (uint64_t)raft_fixture_time(&s->f),
               map_op_name(change.op), (int)change.name.len, (const char *)change.name.ptr,
               rc == OK ? "ok" : "refused: ", rc == OK ? "" : change.reply_text);
    if (rc == E_SYNTAX)
        fail(s, "broker %u: a malformed command in the log", b->id);
    if (!cluster_map_verify(&b->map))
        fail(s, "broker %u: the map fails verification after %s", b->id,
             map_op_name(change.op));
    check_queues(s, b);
    return 0;
}

static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct sim_broker *b = fsm->data;
    uint8_t *data;
    size_t size;
    if (cluster_map_snapshot_alloc(&b->map, &data, &size) != OK)
        return RAFT_NOMEM;
    *bufs = raft_malloc(sizeof **bufs);
    (*bufs)[0].base = raft_malloc(size);
    memcpy((*bufs)[0].base, data, size);
    (*bufs)[0].len = size;
    *n_bufs = 1;
    free(data);
    return 0;
}

static int fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct sim_broker *b = fsm->data;
    cluster_map_free(&b->map);
    cluster_map_init(&b->map);
    int rc = cluster_map_snapshot_read(&b->map, buf->base, buf->len);
    if (rc != OK) {
        fail(b->sim, "broker %u: its snapshot does not restore", b->id);
        return RAFT_CORRUPT; /* (libraft keeps the buffer) */
    }
    raft_free(buf->base);
    /* A restore jumps: nothing to compare with; what it holds is known now. */
    memset(b->shadows, 0, sizeof b->shadows);
    check_queues(b->sim, b);
    return 0;
}

/* ---- proposing (node.c's propose, and its on_proposal_done) ------------ */

enum sim_kind { SIM_BARRIER, SIM_STATE, SIM_POLICY, SIM_JOIN, SIM_OTHER, SIM_REQUEST };

struct sim_apply {
    struct raft_apply req;  /* first: libraft's callback casts back */
    struct sim_broker *broker;
    enum sim_kind kind;
    uint32_t broker_id;     /* SIM_STATE: whose state */
};

static void propose_list(struct sim_broker *b, struct map_cmd_list *list, enum sim_kind kind,
                         uint32_t broker_id);
static void leader_liveness(struct sim_broker *b, uint64_t now);

static void on_applied(struct raft_apply *req, int status, void *result)
{
    struct sim_apply *a = (struct sim_apply *)req;
    struct sim_broker *b = a->broker;
    struct sim *s = b->sim;
    bool ok = status == 0 && result == NULL;
    bool leads = raft_state(raft_fixture_get(&s->f, b->index)) == RAFT_LEADER;
    b->proposals_in_flight--;
    if (a->kind == SIM_BARRIER) {
        b->barrier_in_flight = false;
        if (status == 0 && leads) {
            b->controller_ready = true;
            b->leader_since_ms = raft_fixture_time(&s->f);
            controller_leader_start(&b->ctl, b->leader_since_ms);
            leader_liveness(b, b->leader_since_ms); /* a dead leader: at once */
        }
    } else if (a->kind == SIM_STATE) {
        b->liveness_in_flight--;
        if (ok && leads) {
            struct map_cmd_list list;
            map_cmd_list_init(&list);
            controller_after_state(&b->map, &s->config, a->broker_id, &list);
            propose_list(b, &list, SIM_OTHER, a->broker_id);
        }
    } else if (a->kind == SIM_POLICY) {
        b->policy_in_flight--;
    } else if (a->kind == SIM_JOIN && a->broker_id <= SIM_SERVERS) {
        b->join_in_flight[a->broker_id] = false;
    }
    free(a);
}

static bool propose_entry(struct sim_broker *b, struct map_cmd *cmd, uint64_t request_id,
                          enum sim_kind kind, uint32_t broker_id)
{
    struct sim *s = b->sim;
    struct raft_buffer buf = {.len = SIM_ENVELOPE + (cmd->size + 7) / 8 * 8};
    buf.base = raft_calloc(1, buf.len);
    put_u64(buf.base, cmd->size);
    put_u64((uint8_t *)buf.base + 8, request_id);
    memcpy((uint8_t *)buf.base + SIM_ENVELOPE, cmd->bytes, cmd->size);
    map_cmd_free(cmd);
    struct sim_apply *a = calloc(1, sizeof *a);
    *a = (struct sim_apply){.broker = b, .kind = kind, .broker_id = broker_id};
    if (raft_apply(raft_fixture_get(&s->f, b->index), &a->req, &buf, 1, on_applied) != 0) {
        raft_free(buf.base);
        free(a);
        return false; /* not the leader any more: decided again by whoever is */
    }
    b->proposals_in_flight++;
    if (kind == SIM_STATE)
        b->liveness_in_flight++;
    else if (kind == SIM_POLICY)
        b->policy_in_flight++;
    s->proposed++;
    return true;
}

static bool propose_cmd(struct sim_broker *b, struct map_cmd *cmd, enum sim_kind kind,
                        uint32_t broker_id)
{
    return propose_entry(b, cmd, 0, kind, broker_id);
}

/* Proposes the list's commands (consumed), each alone. */
static void propose_list(struct sim_broker *b, struct map_cmd_list *list, enum sim_kind kind,
                         uint32_t broker_id)
{
    for (uint32_t i = 0; i < list->count; i++)
        propose_cmd(b, &list->items[i], kind, broker_id);
    map_cmd_list_free(list);
}

static void propose_one(struct sim_broker *b, int build_rc, struct map_cmd *cmd)
{
    if (build_rc != OK) {
        fail(b->sim, "a command could not be built");
        return;
    }
    propose_cmd(b, cmd, SIM_REQUEST, b->id);
}

/* ---- the network as the controller sees it ------------------------------ */

/* Whether what i sends reaches j. */
static bool reaches(const struct sim *s, unsigned i, unsigned j)
{
    return s->f.servers[i].alive && s->f.servers[j].alive && (i == j || !s->cut[i][j]);
}

/* Both ways (a replication stream and its acks). */
static bool reachable(const struct sim *s, unsigned i, unsigned j)
{
    return reaches(s, i, j) && reaches(s, j, i);
}

/* ---- clients: declarations, as requests to the leader --------------------- */

static void declare_queues(struct sim_broker *leader)
{
    struct map_cmd c;
    struct map_cmd_list list;
    map_cmd_list_init(&list);
    if (map_cmd_vhost_put(&c, B("/")) == OK)
        map_cmd_list_push(&list, &c);
    propose_list(leader, &list, SIM_REQUEST, leader->id);
}

static void place_queues(struct sim *s, struct sim_broker *leader)
{
    struct placement p;
    placement_init(&p, &s->config.placement);
    placement_refresh(&p, &leader->map);
    struct map_cmd_list list;
    map_cmd_list_init(&list);
    for (int i = 0; i < SIM_QUEUES; i++) {
        if (cluster_map_queue(&leader->map, B("/"), B(queue_names[i])) != NULL)
            continue;
        uint8_t factor = (uint8_t)(1 + i % 3); /* 0, 1 and 2 backups */
        struct placement_result r;
        if (placement_place_queue(&p, B("/"), B(queue_names[i]), factor, PLACEMENT_PRIMARY_RING,
                                  BROKER_ID_NONE, &r) != OK)
            continue;
        /* A client's own x-quay-backups: the policies leave it alone. */
        uint8_t args[64];
        struct table_writer w;
        table_writer_init(&w, args, sizeof args);
        table_put_int(&w, "x-quay-backups", factor - 1);
        struct map_queue_decl d = {.vhost = B("/"), .name = B(queue_names[i]), .durable = true,
                                   .arguments = table_writer_table(&w),
                                   .primary_id = r.primary_id, .backups_count = r.backups_count,
                                   .replication_factor = factor};
        memcpy(d.backup_ids, r.backup_ids, sizeof d.backup_ids);
        struct map_cmd c;
        if (map_cmd_queue_declare(&c, &d, r.primary_id) == OK)
            map_cmd_list_push(&list, &c);
    }
    placement_free(&p);
    propose_list(leader, &list, SIM_REQUEST, leader->id);
}

/* What the data path would ask for: a primary puts the backups it can
 * reach in sync and drops those it cannot (as replication.c asks the map
 * after a catch-up, or when a backup stops answering), and hands a
 * moving queue over once the move is ready (handover.c). Only from a
 * primary the leader can hear: its request reaches the leader. */
static void data_path(struct sim *s, struct sim_broker *leader)
{
    const struct cluster_map *map = &leader->map;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        unsigned p = q->primary_id - 1;
        if (!q->available || q->primary_id > s->f.n || !reachable(s, p, leader->index) ||
            !s->brokers[p].synced)
            continue; /* (a restarted primary serves once it caught up) */
        const struct map_broker *pb = cluster_map_broker(map, q->primary_id);
        if (pb == NULL || pb->state == BROKER_STATE_DOWN)
            continue;
        uint32_t want[CLUSTER_BACKUPS_MAX];
        uint8_t n = 0;
        bool differs = false;
        for (uint8_t k = 0; k < q->backups_count; k++) {
            bool ok = reachable(s, p, q->backup_ids[k] - 1);
            if (ok)
                want[n++] = q->backup_ids[k];
            differs |= ok != map_queue_backup_in_sync(q, q->backup_ids[k]);
        }
        struct map_cmd c;
        if (differs) {
            propose_one(leader, map_cmd_queue_set_in_sync(&c, q->vhost->name, q->name,
                                                              q->epoch, want, n), &c);
        } else if (map_queue_move_state(map, q) == MAP_MOVE_READY) {
            propose_one(leader, map_cmd_queue_hand_over(&c, q->vhost->name, q->name,
                                                            q->epoch, q->move_to), &c);
        }
    }
}

/* ---- the controller: node.c's controller_tick -------------------------- */

/* What b has heard (node.c: the peers' heartbeats, node_heartbeat.c). */
static void hear(struct sim *s, struct sim_broker *b, uint64_t now)
{
    for (unsigned j = 0; j < s->f.n; j++) {
        if (reaches(s, j, b->index))
            b->last_heard_ms[j + 1] = now;
    }
}

/* node.c's observe: one controller_heard per broker of b's map. */
static struct controller_observed observe(struct sim_broker *b, struct controller_heard *heard)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->map.brokers_count && n < SIM_SERVERS; i++) {
        uint32_t id = b->map.brokers[i]->id;
        uint64_t last = id <= SIM_SERVERS ? b->last_heard_ms[id] : 0;
        if (last == 0)
            last = b->leader_since_ms; /* never heard by this process */
        heard[n++] = (struct controller_heard){.broker_id = id, .last_heard_ms = last};
    }
    return (struct controller_observed){.heard = heard, .heard_count = n,
                                        .liveness_in_flight = b->liveness_in_flight,
                                        .policy_in_flight = b->policy_in_flight,
                                        .proposals_in_flight = b->proposals_in_flight};
}

/* Each broker.state alone: its follow-up (on_applied) knows whose it is. */
static void propose_states(struct sim_broker *b, struct controller_actions *a)
{
    for (uint32_t i = 0; i < a->states.count; i++)
        propose_cmd(b, &a->states.items[i], SIM_STATE, a->state_ids[i]);
}

static void leader_liveness(struct sim_broker *b, uint64_t now)
{
    struct controller_heard heard[SIM_SERVERS];
    struct controller_observed seen = observe(b, heard);
    struct controller_actions a;
    controller_actions_init(&a);
    controller_leader_liveness(&b->map, &b->sim->config, &seen, now, &a);
    propose_states(b, &a);
    controller_actions_free(&a);
}

/* ---- membership: consensus.c's member changes, node.c's announce ------- */

static const struct raft_server *member_of(struct raft *r, uint32_t id)
{
    for (unsigned k = 0; k < r->configuration.n; k++) {
        if (r->configuration.servers[k].id == id)
            return &r->configuration.servers[k];
    }
    return NULL;
}

static unsigned voters_of(struct raft *r)
{
    unsigned n = 0;
    for (unsigned k = 0; k < r->configuration.n; k++)
        n += r->configuration.servers[k].role == RAFT_VOTER;
    return n;
}

static void on_changed(struct raft_change *change, int status)
{
    (void)status;
    struct sim_broker *b = change->data;
    b->change_waiting = false;
}

/* consensus.c's ops_run, reduced: the leader's one membership change at a
 * time: a broker that left the map is removed; a joiner is added (spare),
 * then made a voter (a standby past CONSENSUS_VOTERS_MAX); a standby is
 * promoted when a voter left. RAFT_CANTCHANGE: again at the next tick. */
static void member_changes(struct sim *s, struct sim_broker *b)
{
    struct raft *r = raft_fixture_get(&s->f, b->index);
    if (b->change_waiting)
        return;
    b->change.data = b;
    int rv = -1;
    for (uint32_t k = 0; k < b->departed_count && rv != 0; k++) {
        if (member_of(r, b->departed[k]) != NULL)
            rv = raft_remove(r, &b->change, b->departed[k], on_changed);
    }
    for (unsigned i = 0; i < s->f.n && rv != 0; i++) {
        const struct sim_broker *j = &s->brokers[i];
        const struct raft_server *m = member_of(r, j->id);
        if (!j->joining || j->forgotten || !reaches(s, i, b->index))
            continue;
        if (m == NULL)
            rv = raft_add(r, &b->change, j->id, s->f.servers[i].address, on_changed);
        else if (m->role == RAFT_SPARE)
            rv = raft_assign(r, &b->change, j->id,
                             voters_of(r) < CONSENSUS_VOTERS_MAX ? RAFT_VOTER : RAFT_STANDBY,
                             on_changed);
    }
    for (unsigned k = 0; k < r->configuration.n && rv != 0; k++) {
        if (r->configuration.servers[k].role == RAFT_STANDBY &&
            voters_of(r) < CONSENSUS_VOTERS_MAX)
            rv = raft_assign(r, &b->change, r->configuration.servers[k].id, RAFT_VOTER,
                             on_changed);
    }
    b->change_waiting = rv == 0;
}

static bool departed(const struct sim_broker *b, uint32_t id)
{
    for (uint32_t k = 0; k < b->departed_count; k++) {
        if (b->departed[k] == id)
            return true;
    }
    return false;
}

/* node.c's controller_remove_leavers: brokers that left the map leave
 * Raft too (queued as member changes). */
static void remove_leavers(struct sim_broker *b)
{
    for (uint32_t k = 0; k < b->leaving_count; k++) {
        if (!departed(b, b->leaving[k]) && b->departed_count < SIM_SERVERS)
            b->departed[b->departed_count++] = b->leaving[k];
    }
    b->leaving_count = 0;
}

/* node.c's controller_announce_members: every Raft member (voter or
 * standby) it has heard gets a map entry saying what it is. */
static void announce_members(struct sim *s, struct sim_broker *b)
{
    struct raft *r = raft_fixture_get(&s->f, b->index);
    for (unsigned k = 0; k < r->configuration.n; k++) {
        const struct raft_server *m = &r->configuration.servers[k];
        uint32_t id = (uint32_t)m->id;
        if (m->role == RAFT_SPARE || departed(b, id) || id > SIM_SERVERS ||
            b->last_heard_ms[id] == 0 || b->join_in_flight[id])
            continue;
        bool voter = m->role == RAFT_VOTER;
        const struct map_broker *mb = cluster_map_broker(&b->map, id);
        if (mb != NULL && mb->voter == voter)
            continue;
        char name[8];
        snprintf(name, sizeof name, "b%u", id);
        struct map_cmd c;
        if (map_cmd_broker_join(&c, id, B(name), B("h:5672"), B(name), voter) == OK &&
            propose_cmd(b, &c, SIM_JOIN, id))
            b->join_in_flight[id] = true;
    }
}

/* node.c's controller_tick for broker b, leader or not. */
static void broker_tick(struct sim *s, struct sim_broker *b, uint64_t now)
{
    bool leads = s->f.servers[b->index].alive &&
                 raft_state(raft_fixture_get(&s->f, b->index)) == RAFT_LEADER;
    if (leads != b->leader) {
        b->leader = leads;
        b->controller_ready = false; /* a new leader waits for its barrier */
    }
    if (!leads) {
        b->leaving_count = 0; /* the leader removes them */
        return;
    }
    member_changes(s, b); /* (consensus.c: whenever it leads) */
    if (!b->controller_ready) {
        /* The barrier: its own broker.join. Once it commits, every entry
         * of earlier terms is applied here too. */
        char name[8];
        snprintf(name, sizeof name, "b%u", b->id);
        struct map_cmd c;
        if (!b->barrier_in_flight &&
            map_cmd_broker_join(&c, b->id, B(name), B("h:5672"), B(name), true) == OK &&
            propose_cmd(b, &c, SIM_BARRIER, b->id))
            b->barrier_in_flight = true;
        return;
    }
    remove_leavers(b);
    announce_members(s, b);
    struct controller_heard heard[SIM_SERVERS];
    struct controller_observed seen = observe(b, heard);
    struct controller_actions a;
    controller_actions_init(&a);
    b->ctl.round.auto_rebalance = true; /* --auto-rebalance */
    controller_leader_tick(&b->map, &s->config, &b->ctl, &seen, now, &a);
    propose_states(b, &a);
    propose_list(b, &a.round, SIM_OTHER, b->id);
    propose_list(b, &a.policies, SIM_POLICY, b->id);
    controller_actions_free(&a);
}

/* node__sync_tick: a broker that has not caught up since it started
 * sends a sync through the leader it knows (again after a second, as
 * node_request.c resends). */
static void sync_requests(struct sim *s, struct sim_broker *leader, uint64_t now)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        struct sim_broker *b = &s->brokers[i];
        raft_id known;
        const char *address;
        raft_leader(raft_fixture_get(&s->f, i), &known, &address);
        if (b->synced || known != leader->id || !reaches(s, i, leader->index) ||
            (b->sync_id != 0 && now < b->sync_sent_ms + 1000))
            continue;
        struct map_cmd c;
        if (map_cmd_sync(&c) != OK)
            continue;
        uint64_t id = (uint64_t)b->id << 32 | ++b->syncs;
        if (propose_entry(leader, &c, id, SIM_REQUEST, leader->id)) {
            b->sync_id = id;
            b->sync_sent_ms = now;
        }
    }
}

/* Clients and operators: requests that reach the leader (the fixture's),
 * one batch at a time, as the data path's own requests. */
static void requests_tick(struct sim *s, uint64_t now)
{
    unsigned li = raft_fixture_leader_index(&s->f);
    if (li >= s->f.n)
        return;
    struct sim_broker *leader = &s->brokers[li];
    sync_requests(s, leader, now);
    if (!leader->controller_ready || leader->proposals_in_flight > 0)
        return;
    if (!s->declared) {
        s->declared = true;
        declare_queues(leader);
        return;
    }
    if (leader->map.queues_count < SIM_QUEUES && raft_fixture_time(&s->f) > 1000) {
        place_queues(s, leader);
        return;
    }
    if (s->forget_asked >= 0) {
        /* An operator forgets a dead broker (POST /api/cluster/forget),
         * again until it is gone from the map (refused while it is not
         * down yet, or when the map moved under the decision). */
        uint32_t id = (uint32_t)s->forget_asked + 1;
        struct map_cmd_list list;
        map_cmd_list_init(&list);
        struct controller_forget_report report;
        controller_forget(&leader->map, &s->config, id, &list, &report);
        if (cluster_map_broker(&leader->map, id) == NULL)
            s->forget_asked = -1;
        propose_list(leader, &list, SIM_REQUEST, leader->id);
        if (list.count > 0 || report.refusal != CONTROLLER_FORGET_NOT_DOWN)
            return;
    }
    if (s->drain_asked >= 0) {
        /* An operator's drain (POST /api/cluster/drain): marks it draining. */
        struct map_cmd_list list;
        map_cmd_list_init(&list);
        bool done;
        controller_drain(&leader->map, &s->config, (uint32_t)s->drain_asked + 1,
                         SIM_DRAIN_MOVES, &list, &done);
        s->drain_asked = -1;
        propose_list(leader, &list, SIM_REQUEST, leader->id);
        return;
    }
    data_path(s, leader);
}

static void controller_tick(struct sim *s, uint64_t now)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        hear(s, &s->brokers[i], now);
        broker_tick(s, &s->brokers[i], now);
    }
    requests_tick(s, now);
}

/* ---- faults ------------------------------------------------------------- */

/* As a broker runs it (consensus.c), with snapshots more often than
 * quayd's 1,024 entries: they happen in every seed, and the fixture,
 * which copies and compares the leader's whole log at every step, stays
 * fast (five times faster than with snapshots off). */
static void sim_tune(struct raft *r)
{
    struct consensus_config tuning = {.election_timeout_ms = 1000,
                                      .snapshot_threshold = SIM_SNAPSHOT_EVERY,
                                      .snapshot_trailing = SIM_SNAPSHOT_EVERY / 2};
    consensus_tune(r, &tuning);
}

static void run_until(struct sim *s, uint64_t until_ms);
static bool join_new(struct sim *s);

static unsigned count_alive(const struct sim *s)
{
    unsigned n = 0;
    for (unsigned i = 0; i < s->f.n; i++)
        n += s->f.servers[i].alive;
    return n;
}

/* Brokers that are still members (dead ones too), not forgotten. */
static unsigned count_members(const struct sim *s)
{
    unsigned n = 0;
    for (unsigned i = 0; i < s->f.n; i++)
        n += !s->brokers[i].forgotten;
    return n;
}

static void set_cut(struct sim *s, unsigned i, unsigned j, bool on)
{
    if (i == j || s->cut[i][j] == on)
        return;
    s->cut[i][j] = on;
    if (on)
        raft_fixture_disconnect(&s->f, i, j);
    else
        raft_fixture_reconnect(&s->f, i, j);
}

static unsigned count_cuts(const struct sim *s)
{
    unsigned n = 0;
    for (unsigned i = 0; i < s->f.n; i++) {
        for (unsigned j = 0; j < s->f.n; j++)
            n += s->cut[i][j];
    }
    return n;
}

static void kill_broker(struct sim *s, unsigned i)
{
    struct sim_broker *b = &s->brokers[i];
    raft_fixture_kill(&s->f, i);
    b->killed_ms = raft_fixture_time(&s->f);
    b->version_before = b->map.version;
    memcpy(b->shadows_before, b->shadows, sizeof b->shadows);
}

/* A new process on b's disk: its map and everything node.c keeps start
 * empty; libraft loads the log (term, vote, entries) and replays it into
 * the map as the leader tells it the commit index. */
static void restart(struct sim *s, unsigned i)
{
    struct sim_broker *b = &s->brokers[i];
    struct raft_fixture_server *srv = &s->f.servers[i];
    raft_close(&srv->raft, NULL); /* (fails the old process's proposals) */
    cluster_map_free(&b->map);
    cluster_map_init(&b->map);
    memset(b->shadows, 0, sizeof b->shadows);
    b->leader = b->controller_ready = b->barrier_in_flight = false;
    b->leader_since_ms = 0;
    memset(&b->ctl, 0, sizeof b->ctl);
    b->proposals_in_flight = b->liveness_in_flight = b->policy_in_flight = 0;
    memset(b->last_heard_ms, 0, sizeof b->last_heard_ms);
    b->leaving_count = b->departed_count = 0;
    memset(b->join_in_flight, 0, sizeof b->join_in_flight);
    b->change_waiting = false;
    b->synced = false;
    b->sync_id = 0;
    b->restarted = true;
    if (raft_init(&srv->raft, &srv->io, &b->fsm, srv->id, srv->address) != 0)
        fail(s, "b%u: raft_init at a restart", b->id);
    srv->raft.tracer = &srv->tracer;
    sim_tune(&srv->raft);
    if (raft_start(&srv->raft) != 0)
        fail(s, "b%u: raft_start at a restart", b->id);
}

/* A killed broker back: a restart (it lost its memory), or, when
 * restart is false, a process that was only stopped (SIGSTOP) and goes on. */
static void revive(struct sim *s, unsigned i, bool restart_it)
{
    struct sim_broker *b = &s->brokers[i];
    /* What it sent and wrote before it died has landed by now (every
     * latency is under SIM_SETTLE_MS): nothing in flight refers to it. */
    if (raft_fixture_time(&s->f) < b->killed_ms + SIM_SETTLE_MS)
        run_until(s, b->killed_ms + SIM_SETTLE_MS);
    if (!sim_disk_idle(&b->disk))
        fail(s, "b%u: its disk is still busy %u ms after it died", b->id, SIM_SETTLE_MS);
    if (restart_it)
        restart(s, i);
    raft_fixture_revive(&s->f, i);
}

/* An operator's revive (POST /api/cluster/revive) of a draining broker. */
static bool undrain(struct sim *s, unsigned i)
{
    unsigned li = raft_fixture_leader_index(&s->f);
    if (li >= s->f.n || !s->brokers[li].controller_ready ||
        s->brokers[li].proposals_in_flight > 0)
        return false;
    struct sim_broker *leader = &s->brokers[li];
    const struct map_broker *b = cluster_map_broker(&leader->map, i + 1);
    if (b == NULL || b->state != BROKER_STATE_DRAINING)
        return false;
    struct map_cmd c;
    propose_one(leader, map_cmd_broker_state(&c, i + 1, BROKER_STATE_UP), &c);
    return true;
}

/* Whether the leader's map knows broker id (an operator forgets only
 * those: a joiner that died before it was announced is not modelled). */
static bool in_leaders_map(struct sim *s, uint32_t id)
{
    unsigned li = raft_fixture_leader_index(&s->f);
    return li < s->f.n && cluster_map_broker(&s->brokers[li].map, id) != NULL;
}

/* One fault or operator action, drawn from the seed (most draws do
 * nothing: the cluster keeps a majority most of the time). */
static void inject_fault(struct sim *s)
{
    unsigned i = (unsigned)random_below(s, s->f.n);
    unsigned j = (unsigned)random_below(s, s->f.n);
    unsigned kind = (unsigned)random_below(s, 9);
    const char *what = NULL;
    if (kind == 0 && s->f.servers[i].alive && count_alive(s) > 3) {
        kill_broker(s, i);
        what = "kill";
    } else if (kind == 7 && count_alive(s) > 3 && join_new(s)) {
        i = s->f.n - 1;
        what = "a new broker joins:";
    } else if (kind == 8 && !s->f.servers[i].alive && !s->brokers[i].forgotten &&
               count_members(s) > 4 && s->forget_asked < 0 && in_leaders_map(s, i + 1)) {
        s->brokers[i].forgotten = true; /* dead for good: never revived */
        s->forget_asked = (int)i;
        what = "forget the dead";
    } else if (kind == 1 && !s->f.servers[i].alive && !s->brokers[i].forgotten) {
        bool restart_it = random_below(s, 4) != 0;
        revive(s, i, restart_it);
        what = restart_it ? "restart" : "resume the stopped";
    } else if (kind == 2 && count_cuts(s) == 0) {
        for (unsigned k = 0; k < s->f.n; k++) {
            set_cut(s, i, k, true);
            set_cut(s, k, i, true);
        }
        what = "isolate";
    } else if (kind == 3 && count_cuts(s) > 0) {
        for (unsigned k = 0; k < s->f.n; k++) {
            set_cut(s, i, k, false);
            set_cut(s, k, i, false);
        }
        what = "heal";
    } else if (kind == 4 && i != j && count_cuts(s) < 2) {
        set_cut(s, i, j, true);
        what = "one-way cut from";
    } else if (kind == 5 && count_alive(s) > 3) {
        s->drain_asked = (int)i;
        what = "drain";
    } else if (kind == 6 && undrain(s, i)) {
        what = "revive the drained";
    }
    if (what == NULL)
        return;
    s->faults++;
    trace(s, kind * 17 + i * 5 + j);
    if (s->verbose && kind == 4)
        printf("  t=%" PRIu64 " %s b%u to b%u\n", (uint64_t)raft_fixture_time(&s->f), what,
               i + 1, j + 1);
    else if (s->verbose)
        printf("  t=%" PRIu64 " %s b%u\n", (uint64_t)raft_fixture_time(&s->f), what, i + 1);
}

static void heal_all(struct sim *s)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        for (unsigned k = 0; k < s->f.n; k++)
            set_cut(s, i, k, false);
        if (!s->f.servers[i].alive && !s->brokers[i].forgotten)
            revive(s, i, true);
    }
}

/* After the faults: drained brokers are revived (an operator's step). */
static void undrain_all(struct sim *s)
{
    for (unsigned i = 0; i < s->f.n; i++)
        undrain(s, i);
}

/* ---- the end state -------------------------------------------------------- */

/* Whether the membership is what the faults left: every broker not
 * forgotten is in ref's map and a Raft member that votes or stands by, a
 * forgotten one in neither, and the queues are balanced (a joiner got its
 * share: placement plans no move). */
static bool members_settled(struct sim *s, const struct cluster_map *ref, char *why,
                            size_t why_size)
{
    unsigned li = raft_fixture_leader_index(&s->f);
    if (li >= s->f.n) {
        snprintf(why, why_size, "no leader");
        return false;
    }
    struct raft *r = raft_fixture_get(&s->f, li);
    for (unsigned i = 0; i < s->f.n; i++) {
        const struct sim_broker *b = &s->brokers[i];
        const struct raft_server *m = member_of(r, b->id);
        bool in_map = cluster_map_broker(ref, b->id) != NULL;
        bool member = m != NULL && m->role != RAFT_SPARE;
        if (in_map == b->forgotten || member == b->forgotten) {
            snprintf(why, why_size, "b%u (%s): in the map %d, a Raft member %d", b->id,
                     b->forgotten ? "forgotten" : "a member", in_map, member);
            return false;
        }
    }
    struct placement_plan plan;
    placement_plan_init(&plan);
    placement_rebalance_plan(ref, &s->config.placement, CONTROLLER_REBALANCE_MOVES, &plan);
    uint32_t moves = plan.count;
    placement_plan_free(&plan);
    if (moves > 0)
        snprintf(why, why_size, "not balanced: %u move(s) planned", moves);
    return moves == 0;
}

/* Empty when the cluster has converged; else what is still off. */
static bool converged(struct sim *s, char *why, size_t why_size)
{
    unsigned first = 0;
    while (s->brokers[first].forgotten)
        first++;
    const struct cluster_map *ref = &s->brokers[first].map;
    for (unsigned i = first + 1; i < s->f.n; i++) {
        if (!s->brokers[i].forgotten && s->brokers[i].map.version != ref->version) {
            snprintf(why, why_size, "b%u's map is at version %" PRIu64 ", b%u's at %" PRIu64,
                     i + 1, s->brokers[i].map.version, first + 1, ref->version);
            return false;
        }
    }
    if (ref->queues_count != SIM_QUEUES) {
        snprintf(why, why_size, "%u queues of %u", ref->queues_count, SIM_QUEUES);
        return false;
    }
    for (uint32_t i = 0; i < ref->brokers_count; i++) {
        if (ref->brokers[i]->state != BROKER_STATE_UP) {
            snprintf(why, why_size, "b%u is %s", ref->brokers[i]->id,
                     broker_state_name(ref->brokers[i]->state));
            return false;
        }
    }
    for (uint32_t i = 0; i < ref->queues_count; i++) {
        const struct map_queue *q = ref->queues[i];
        bool all_in_sync = q->in_sync_mask == (1u << q->backups_count) - 1;
        if (!q->available || q->backups_count + 1 != q->replication_factor || !all_in_sync) {
            snprintf(why, why_size, "%.*s: available %d, %u backups of %u, in sync mask %x",
                     (int)q->name.len, (const char *)q->name.ptr, q->available,
                     q->backups_count, q->replication_factor - 1, q->in_sync_mask);
            return false;
        }
    }
    if (!members_settled(s, ref, why, why_size))
        return false;
    /* Same versions: the same maps, byte for byte. */
    uint8_t *a, *b;
    size_t a_size, b_size;
    cluster_map_snapshot_alloc(ref, &a, &a_size);
    bool same = true;
    for (unsigned i = first + 1; i < s->f.n && same; i++) {
        if (s->brokers[i].forgotten)
            continue;
        cluster_map_snapshot_alloc(&s->brokers[i].map, &b, &b_size);
        same = a_size == b_size && memcmp(a, b, a_size) == 0;
        free(b);
        if (!same)
            snprintf(why, why_size, "b%u's map differs from b%u's at the same version", i + 1,
                     first + 1);
    }
    free(a);
    return same;
}

/* ---- one seed ---------------------------------------------------------------- */

/* Broker i's server: a new one in the fixture (connected to every live
 * one), its map empty. Not started. */
static void add_server(struct sim *s, unsigned i)
{
    struct sim_broker *b = &s->brokers[i];
    b->sim = s;
    b->index = i;
    b->id = i + 1;
    cluster_map_init(&b->map);
    b->fsm = (struct raft_fsm){.version = 1, .data = b, .apply = fsm_apply,
                               .snapshot = fsm_snapshot, .restore = fsm_restore};
    raft_fixture_grow(&s->f, &b->fsm);
    for (unsigned j = 0; j < i; j++) {
        if (!s->f.servers[j].alive) { /* (grow connects it to the dead too) */
            raft_fixture_saturate(&s->f, i, j);
            raft_fixture_saturate(&s->f, j, i);
        }
    }
    sim_disk_attach(&b->disk, &s->f.servers[i].io);
    sim_tune(raft_fixture_get(&s->f, i));
    /* Election timeouts drawn from the seed: the fixture's own are
     * fixed per server, so elections would not vary between seeds. */
    raft_fixture_set_randomized_election_timeout(&s->f, i, 1000 + random_below(s, 1000));
    raft_fixture_set_network_latency(&s->f, i, 5 + random_below(s, 20));
    raft_fixture_set_disk_latency(&s->f, i, 1 + random_below(s, 10));
}

static void sim_init(struct sim *s, uint64_t seed, bool verbose)
{
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    s->verbose = verbose;
    s->trace = 1469598103934665603ull;
    s->epochs = calloc(SIM_EPOCHS_MAX, sizeof *s->epochs);
    s->drain_asked = -1;
    s->forget_asked = -1;
    controller_config_default(&s->config);
    raft_fixture_initialize(&s->f);
    for (unsigned i = 0; i < SIM_BROKERS; i++)
        add_server(s, i);
    struct raft_configuration conf;
    raft_fixture_configuration(&s->f, SIM_BROKERS, &conf);
    raft_fixture_bootstrap(&s->f, &conf);
    raft_configuration_close(&conf);
    raft_fixture_start(&s->f);
}

/* A new broker, its disk empty (quayd --join): it starts, and asks the
 * members to add it (consensus_join; the leader's add_member runs it). */
static bool join_new(struct sim *s)
{
    unsigned i = s->f.n;
    if (i >= SIM_SERVERS)
        return false;
    add_server(s, i);
    s->brokers[i].joining = true;
    if (raft_start(raft_fixture_get(&s->f, i)) != 0)
        fail(s, "b%u: raft_start at its join", i + 1);
    return true;
}

static void sim_close(struct sim *s)
{
    unsigned n = s->f.n;
    raft_fixture_close(&s->f);
    for (unsigned i = 0; i < n; i++) {
        sim_disk_detach(&s->brokers[i].disk);
        cluster_map_free(&s->brokers[i].map);
    }
    free(s->epochs);
}

/* Runs simulated time up to until_ms, a controller tick every SIM_TICK_MS. */
static void run_until(struct sim *s, uint64_t until_ms)
{
    while (!failed(s) && raft_fixture_time(&s->f) < until_ms) {
        uint64_t next = (raft_fixture_time(&s->f) / SIM_TICK_MS + 1) * SIM_TICK_MS;
        while (raft_fixture_time(&s->f) < next && !failed(s))
            raft_fixture_step(&s->f);
        controller_tick(s, raft_fixture_time(&s->f));
        /* libraft draws an election timeout in [t, 2t) each time it
         * resets the timer; the fixture's is fixed per server, and four
         * servers within a network latency of each other split the vote
         * for ever (seed 110): drawn again from the seed every tick. */
        for (unsigned i = 0; i < s->f.n; i++)
            raft_fixture_set_randomized_election_timeout(&s->f, i, 1000 + random_below(s, 1000));
    }
}

/* Where each broker is (after a failure, with -v). */
static void print_brokers(struct sim *s)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        struct raft *r = raft_fixture_get(&s->f, i);
        const struct sim_broker *b = &s->brokers[i];
        printf("  b%u: %s%s, raft state %d term %llu, applied %llu of %llu, %u members, "
               "map version %" PRIu64 ", synced %d\n", b->id,
               s->f.servers[i].alive ? "alive" : "dead", b->forgotten ? " (forgotten)" : "",
               raft_state(r), (unsigned long long)r->current_term,
               (unsigned long long)raft_last_applied(r), (unsigned long long)raft_last_index(r),
               r->configuration.n, b->map.version, b->synced);
    }
}

/* 0: passed. */
static int run_seed(uint64_t seed, uint64_t seconds, bool verbose, uint64_t *trace_out)
{
    struct sim *s = calloc(1, sizeof *s);
    sim_init(s, seed, verbose);
    uint64_t end = seconds * 1000;
    uint64_t next_fault = 3000;
    while (!failed(s) && raft_fixture_time(&s->f) < end) {
        run_until(s, next_fault < end ? next_fault : end);
        if (raft_fixture_time(&s->f) >= next_fault) {
            inject_fault(s);
            next_fault += SIM_FAULT_MIN_MS + random_below(s, SIM_FAULT_MAX_MS - SIM_FAULT_MIN_MS);
        }
    }
    heal_all(s);
    char why[256] = "";
    uint64_t healed = raft_fixture_time(&s->f);
    while (!failed(s) && !converged(s, why, sizeof why)) {
        if (raft_fixture_time(&s->f) - healed > SIM_HEAL_BOUND_MS) {
            fail(s, "not converged %u s after the faults healed: %s",
                 SIM_HEAL_BOUND_MS / 1000, why);
            break;
        }
        undrain_all(s);
        run_until(s, raft_fixture_time(&s->f) + SIM_TICK_MS);
    }
    int rc = failed(s) ? 1 : 0;
    if (rc != 0)
        printf("FAIL seed %" PRIu64 ": %s (replay: sim_control --seed %" PRIu64 " -v)\n", seed,
               s->failure, seed);
    if (rc != 0 && verbose)
        print_brokers(s);
    else if (verbose)
        printf("ok seed %" PRIu64 ": %" PRIu64 " faults, %" PRIu64 " commands proposed, %" PRIu64
               " applied, converged %" PRIu64 " ms after healing\n", seed, s->faults,
               s->proposed, s->applied, (uint64_t)raft_fixture_time(&s->f) - healed);
    *trace_out = s->trace;
    sim_close(s);
    free(s);
    return rc;
}

struct run_options {
    uint64_t first, count, seconds, wall_s;
    unsigned jobs;
    bool verbose;
};

/* Seeds first, first + stride, ... (count of them in all, or until
 * wall_s); *ran counts those that passed. 0, or 1 on the first failure. */
static int run_range(const struct run_options *o, uint64_t first, uint64_t stride,
                     uint64_t *ran)
{
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    *ran = 0;
    for (uint64_t seed = first; seed - o->first < o->count; seed += stride) {
        if (o->wall_s > 0) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((uint64_t)(now.tv_sec - start.tv_sec) >= o->wall_s)
                break;
        }
        uint64_t t1, t2;
        if (run_seed(seed, o->seconds, o->verbose, &t1) != 0)
            return 1;
        if (seed == o->first) {
            /* Determinism: the same seed runs the same way again. */
            run_seed(seed, o->seconds, false, &t2);
            if (t1 != t2) {
                printf("FAIL seed %" PRIu64 ": two runs differ (trace %016" PRIx64
                       " then %016" PRIx64 ")\n", seed, t1, t2);
                return 1;
            }
        }
        (*ran)++;
    }
    return 0;
}

/* --jobs N: N processes, worker k running every N-th seed from first + k;
 * each tells the parent how many passed through a pipe. */
static int run_jobs(const struct run_options *o, uint64_t *ran)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    fflush(stdout);
    for (unsigned k = 0; k < o->jobs; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            uint64_t mine;
            int rc = run_range(o, o->first + k, o->jobs, &mine);
            fflush(stdout);
            if (write(fds[1], &mine, sizeof mine) != (ssize_t)sizeof mine)
                rc = 1;
            _exit(rc);
        }
        if (pid < 0)
            return 1;
    }
    close(fds[1]);
    int rc = 0;
    *ran = 0;
    uint64_t mine;
    while (read(fds[0], &mine, sizeof mine) == (ssize_t)sizeof mine)
        *ran += mine;
    close(fds[0]);
    for (unsigned k = 0; k < o->jobs; k++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            rc = 1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    struct run_options o = {.first = 1, .count = 20, .seconds = 60, .jobs = 1};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            o.first = strtoull(argv[++i], NULL, 10);
            o.count = 1;
        } else if (strcmp(argv[i], "--seeds") == 0 && i + 2 < argc) {
            o.first = strtoull(argv[++i], NULL, 10);
            o.count = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--for") == 0 && i + 1 < argc) {
            o.wall_s = strtoull(argv[++i], NULL, 10);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            o.first = ((uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec) % 1000000000u + 1000;
            o.count = UINT64_MAX - o.first;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            o.seconds = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--jobs") == 0 && i + 1 < argc) {
            o.jobs = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "-v") == 0) {
            o.verbose = true;
        } else {
            fprintf(stderr, "usage: sim_control [--seed N | --seeds FIRST COUNT | --for S] "
                            "[--seconds S] [--jobs N] [-v]\n");
            return 2;
        }
    }
    if (o.jobs < 1 || o.jobs > 64)
        o.jobs = 1;
    for (int i = 0; i < SIM_QUEUES; i++)
        snprintf(queue_names[i], sizeof queue_names[i], "q%d", i);
    if (o.wall_s > 0)
        printf("sim_control: random seeds from %" PRIu64 " for %" PRIu64 " s\n", o.first,
               o.wall_s);
    uint64_t ran = 0;
    int rc = o.jobs > 1 ? run_jobs(&o, &ran) : run_range(&o, o.first, 1, &ran);
    if (rc != 0)
        return 1;
    printf("sim_control: %" PRIu64 " seed(s) from %" PRIu64 " passed (%" PRIu64
           " simulated s each, %d brokers at first, %d queues)\n", ran, o.first, o.seconds,
           SIM_BROKERS, SIM_QUEUES);
    return 0;
}
