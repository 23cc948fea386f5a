/*
 * sim_fsm.c: the FSM: every broker applies the log to its own map, the
 * checkers (sim_check.c) looking on after every apply; its snapshots are
 * the map's own. Also the log entry's envelope, written and read here.
 */
#include "sim.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/errors.h"
#include "sim_data.h"

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
    b->synced_ms = raft_fixture_time(&s->f);
    b->sync_id = 0;
    if (!b->restarted)
        return;
    if (b->map.version < b->version_before)
        sim_fail(s, "b%u serves from map version %" PRIu64 " after a restart, older than the %"
                 PRIu64 " it had applied", b->id, b->map.version, b->version_before);
    for (int qi = 0; qi < SIM_QUEUES; qi++) {
        const struct shadow *was = &b->shadows_before[qi];
        const struct shadow *now = &b->shadows[qi];
        /* (A queue its map lacks, as new as the last one's: deleted.) */
        if (was->known && now->known && now->epoch < was->epoch)
            sim_fail(s, "b%u serves %s at epoch %" PRIu64 " after a restart, older than the %"
                     PRIu64 " it had", b->id, sim_queue_names[qi], now->epoch, was->epoch);
    }
}

/* node.c's note_known. */
static void note_known(struct sim_broker *b)
{
    const struct map_broker *self = cluster_map_broker(&b->map, b->id);
    if (b->known_since == UINT64_MAX && self != NULL && self->incarnation == b->incarnation)
        b->known_since = b->map.version;
}

/* A log entry: cmd (consumed) in its envelope. */
struct raft_buffer sim_fsm_entry(struct map_cmd *cmd, uint64_t request_id)
{
    struct raft_buffer buf = {.len = SIM_ENVELOPE + (cmd->size + 7) / 8 * 8};
    buf.base = raft_calloc(1, buf.len);
    put_u64(buf.base, cmd->size);
    put_u64((uint8_t *)buf.base + 8, request_id);
    memcpy((uint8_t *)buf.base + SIM_ENVELOPE, cmd->bytes, cmd->size);
    map_cmd_free(cmd);
    return buf;
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
        sim_fail(s, "broker %u: an entry without its envelope", b->id);
    int rc = cluster_map_apply(&b->map, entry + SIM_ENVELOPE, (size_t)size, &change);
    if (raft_last_applied(raft_fixture_get(&s->f, b->index)) + 1 <= b->restart_index)
        b->restart_version = b->map.version; /* (node.c's on_apply) */
    note_known(b);
    if (request_id != 0 && request_id == b->sync_id)
        synced(s, b);
    if (rc == OK && change.op == MAP_OP_BROKER_LEAVE && change.changed &&
        b->leaving_count < SIM_SERVERS)
        b->leaving[b->leaving_count++] = change.broker_id; /* (node.c's on_apply) */
    if (rc == OK && change.op == MAP_OP_QUEUE_DELETE && change.changed &&
        sim_queue_index(change.name) >= 0)
        sim_data_deleted(s, (unsigned)sim_queue_index(change.name), b->map.version);
    *result = rc == OK ? NULL : (void *)1; /* (node.c: CONSENSUS_E_APPLY when refused) */
    s->applied++;
    sim_trace(s, b->id * 131 + (uint64_t)change.op * 7 + (uint64_t)(rc == OK));
    if (s->verbose && b->index == 0)
        printf("  t=%" PRIu64 " b1 applies %s %.*s: %s%s\n", (uint64_t)raft_fixture_time(&s->f),
               map_op_name(change.op), (int)change.name.len, (const char *)change.name.ptr,
               rc == OK ? "ok" : "refused: ", rc == OK ? "" : change.reply_text);
    if (rc == OK && change.queue != NULL && sim_queue_index(change.queue->name) == sim_watch_queue &&
        b->map.version > s->watch_version) {
        /* --watch: each change of the watched queue, once (its first apply). */
        const struct map_queue *q = change.queue;
        s->watch_version = b->map.version;
        char backups[64] = "";
        for (uint8_t i = 0, n = 0; i < q->backups_count; i++)
            n += (uint8_t)snprintf(backups + n, sizeof backups - n, "%sb%u%s", i ? " " : "",
                                   q->backup_ids[i], q->in_sync_mask & (1u << i) ? "*" : "");
        sim_data_watch(s, (unsigned)sim_watch_queue,
                       "map v%" PRIu64 " (b%u applies) %s: primary b%u epoch %" PRIu64
                       " backups [%s] (*: in sync) move_to %u available %d",
                       b->map.version, b->id, map_op_name(change.op), q->primary_id, q->epoch,
                       backups, q->move_to, q->available);
    }
    if (rc == OK && sim_watch_queue >= 0 && change.op == MAP_OP_BROKER_STATE &&
        change.changed && b->map.version > s->watch_version) {
        const struct map_broker *mb = cluster_map_broker(&b->map, change.broker_id);
        static const char *const states[] = {"up", "suspect", "down", "draining"};
        s->watch_version = b->map.version;
        sim_data_watch(s, (unsigned)sim_watch_queue, "map v%" PRIu64 " (b%u applies): b%u is %s",
                       b->map.version, b->id, change.broker_id,
                       mb != NULL && mb->state < 4 ? states[mb->state] : "?");
    }
    if (rc == E_SYNTAX)
        sim_fail(s, "broker %u: a malformed command in the log", b->id);
    if (!cluster_map_verify(&b->map))
        sim_fail(s, "broker %u: the map fails verification after %s", b->id,
                 map_op_name(change.op));
    sim_check_queues(s, b);
    sim_data_follow(s, b);
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
        sim_fail(b->sim, "broker %u: its snapshot does not restore", b->id);
        return RAFT_CORRUPT; /* (libraft keeps the buffer) */
    }
    raft_free(buf->base);
    if (b->starting)
        b->restart_version = b->map.version; /* our own, from disk (node.c's on_restore) */
    note_known(b);
    /* A restore jumps: nothing to compare with; what it holds is known now. */
    memset(b->shadows, 0, sizeof b->shadows);
    sim_check_queues(b->sim, b);
    sim_data_follow(b->sim, b);
    return 0;
}

void sim_fsm_init(struct sim_broker *b)
{
    b->fsm = (struct raft_fsm){.version = 1, .data = b, .apply = fsm_apply,
                               .snapshot = fsm_snapshot, .restore = fsm_restore};
}
