/*
 * node.c: see node.h. A broker's membership in the cluster: consensus with
 * the map as its state machine, proposals, the controller loop on the
 * leader, the tick, start and stop. The rest is in node_config.c (options,
 * the secret, the broker id, addresses), node_heartbeat.c (the member
 * heartbeats and the lease), node_request.c (clients' changes, from any
 * broker) and node_json.c (GET /api/cluster's fields); node_int.h holds
 * what they share.
 *
 * Log entries: libraft 0.15's TCP transport sends an entry's bytes as they
 * are but its receiver skips padding to a multiple of 8 after each one, so
 * an entry whose size is not a multiple of 8 is decoded wrongly by the
 * followers (ASan: heap-buffer-overflow in libraft). Every entry is
 * therefore an envelope: the command's size (8 bytes, big-endian), the
 * request id (8 bytes; 0 for the controller's own decisions), the map
 * command, zeros up to a multiple of 8.
 *
 * Timers: one, every NODE_HEARTBEAT_MS: send heartbeats, then (leader
 * only) announce members and check liveness.
 *
 * Must never: propose from a follower; act as controller before its own
 * barrier (its broker.join after election) committed; block the loop after
 * start-up (start-up reads and writes two small files synchronously).
 */
#include "cluster/node.h"
#include "cluster/node_int.h"
#include "cluster/map_log.h"
#include "cluster/map_events.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "amqp/wire.h"
#include "cluster/consensus.h"
#include "cluster/controller.h"
#include "cluster/heartbeat.h"
#include "cluster/outbox.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

#define JOIN_WARN_EVERY_MS 5000
#define PROPOSE_BATCH 256

static_assert(CLUSTER_NAME_SIZE_MAX <= CONSENSUS_ADDRESS_SIZE_MAX, "addresses fit the map");

enum proposal_kind {
    PROPOSAL_BARRIER,
    PROPOSAL_JOIN,
    PROPOSAL_STATE,
    PROPOSAL_OTHER,
    PROPOSAL_POLICY, /* a queue's factor after a policy change */
    PROPOSAL_REQUEST, /* a client's change, ours or forwarded: the apply answers it */
    PROPOSAL_NUDGE,   /* a sync after a follower's request committed (see nudge) */
};

/* One proposal in flight; owned by consensus until its done callback. */
struct proposal {
    struct cluster_node *node;
    enum proposal_kind kind;
    uint32_t broker_id;
};

/* ---- small helpers ---- */

struct peer *node__peer_find(struct cluster_node *node, uint64_t id)
{
    for (uint32_t i = 0; i < node->peers_count; i++) {
        if (node->peers[i].id == id)
            return &node->peers[i];
    }
    return NULL;
}

static const char *broker_name_or(const struct cluster_map *map, uint64_t id, const char *dflt)
{
    static char name[ADDRESS_SIZE];
    const struct map_broker *b = id <= UINT32_MAX ? cluster_map_broker(map, (uint32_t)id) : NULL;
    if (b == NULL)
        return dflt;
    snprintf(name, sizeof name, "%.*s", (int)b->name.len, (const char *)b->name.ptr);
    return name;
}

/* ---- the map as the state machine, and its log ---- */

struct prior_states {
    uint32_t count;
    uint32_t ids[CLUSTER_BROKERS_MAX];
    enum broker_state states[CLUSTER_BROKERS_MAX];
    struct map_event_name names[CLUSTER_BROKERS_MAX]; /* (a leaver's is gone after) */
};

static void format_brokers(const struct cluster_map *map, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < map->brokers_count && used < size; i++) {
        const struct map_broker *b = map->brokers[i];
        int n = snprintf(out + used, size - used, "%s%.*s=%s", i ? " " : "", (int)b->name.len,
                         (const char *)b->name.ptr, broker_state_name(b->state));
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

static uint32_t prior_slot(const struct prior_states *prior, uint32_t id)
{
    uint32_t i = 0;
    while (i < prior->count && prior->ids[i] != id)
        i++;
    return i;
}

static enum broker_state prior_state(const struct prior_states *prior, uint32_t id, bool *found)
{
    uint32_t i = prior_slot(prior, id);
    *found = i < prior->count;
    return *found ? prior->states[i] : BROKER_STATE_UP;
}

/* A broker's event in the recent events (map_events.h). */
static struct map_event *record_broker(struct cluster_node *node, const char *event,
                                       const struct map_change *change,
                                       const struct map_broker *b)
{
    struct map_event *e = map_events_push(&node->events, event, map_reason_name(change->reason),
                                          change->version);
    map_event_name_set(&e->broker, b->name);
    return e;
}

/* broker.state: "up -> down" with why, the key=value words first (the
 * JSON log's members, as map_log.h's lines). */
static void log_broker_state(struct cluster_node *node, const struct map_change *change,
                             const struct map_broker *b, enum broker_state before,
                             const char *brokers)
{
    char who[CLUSTER_NAME_SIZE_MAX * 3 + 1], silence[40] = "";
    map_log_word(b->name, who, sizeof who);
    if (change->silence_ms > 0)
        snprintf(silence, sizeof silence, " silence_ms=%llu",
                 (unsigned long long)change->silence_ms);
    unsigned long long epoch = (unsigned long long)node->map.version;
    LOG_INFO("map_epoch=%llu event=broker_state broker=%s from=%s to=%s reason=%s%s "
             "cluster map epoch=%llu: broker %.*s (id %" PRIu32 ") %s -> %s; brokers: %s",
             epoch, who, broker_state_name(before), broker_state_name(b->state),
             map_reason_name(change->reason), silence, epoch, (int)b->name.len,
             (const char *)b->name.ptr, b->id, broker_state_name(before),
             broker_state_name(b->state), brokers);
    struct map_event *e = record_broker(node, "broker_state", change, b);
    map_event_name_set_cstr(&e->from, broker_state_name(before));
    map_event_name_set_cstr(&e->to, broker_state_name(b->state));
    e->silence_ms = change->silence_ms;
}

/* broker.join, broker.state, broker.leave, broker.incarnation and the rest. */
static void log_broker_change(struct cluster_node *node, const struct map_change *change,
                              const struct prior_states *prior, const char *brokers)
{
    unsigned long long epoch = (unsigned long long)node->map.version;
    const char *op = map_op_name(change->op) ? map_op_name(change->op) : "?";
    const struct map_broker *b = cluster_map_broker(&node->map, change->broker_id);
    bool known = false;
    enum broker_state before = prior_state(prior, change->broker_id, &known);
    if (change->op == MAP_OP_BROKER_JOIN && b != NULL) {
        LOG_INFO("cluster map epoch=%llu: broker %.*s (id %" PRIu32 ") %s: amqp=%.*s "
                 "cluster=%.*s voter=%s; brokers: %s", epoch, (int)b->name.len,
                 (const char *)b->name.ptr, b->id, known ? "rejoined" : "joined",
                 (int)b->amqp_address.len, (const char *)b->amqp_address.ptr,
                 (int)b->cluster_address.len, (const char *)b->cluster_address.ptr,
                 b->voter ? "yes" : "no", brokers);
        if (change->changed)
            record_broker(node, known ? "broker_rejoined" : "broker_joined", change, b);
        return;
    }
    if (change->op == MAP_OP_BROKER_STATE && b != NULL && change->changed) {
        log_broker_state(node, change, b, before, brokers);
        return;
    }
    const char *reason = map_reason_name(change->reason);
    LOG_INFO("cluster map epoch=%llu: %s%s%s%s; brokers: %s", epoch, op,
             change->changed ? "" : " (no change)", change->reason ? " reason=" : "",
             change->reason ? reason : "", brokers);
    if (change->op == MAP_OP_BROKER_INCARNATION && b != NULL && change->changed)
        record_broker(node, "broker_restarted", change, b);
    if (change->op == MAP_OP_BROKER_LEAVE && change->changed && known) {
        struct map_event *e = map_events_push(&node->events, "broker_left", reason,
                                              change->version);
        e->broker = prior->names[prior_slot(prior, change->broker_id)];
    }
}

static void log_change(struct cluster_node *node, int rc, const struct map_change *change,
                       const struct prior_states *prior)
{
    unsigned long long epoch = (unsigned long long)node->map.version;
    const char *op = map_op_name(change->op) ? map_op_name(change->op) : "?";
    if (rc == OK && (change->queue != NULL || change->op == MAP_OP_QUEUE_DELETE ||
                     change->op == MAP_OP_BIND || change->op == MAP_OP_UNBIND)) {
        LOG_DEBUG("cluster map epoch=%llu: %s %.*s%s", epoch, op, (int)change->name.len,
                  (const char *)change->name.ptr, change->changed ? "" : " (no change)");
        /* a line per placement event, with why; and the recent events */
        map_log_change(&node->map, change, &node->events);
        return;
    }
    char brokers[768];
    format_brokers(&node->map, brokers, sizeof brokers);
    if (rc != OK) {
        LOG_WARN("cluster map epoch=%llu: %s refused: %u %s; brokers: %s", epoch, op,
                 change->reply_code, change->reply_text, brokers);
        return;
    }
    log_broker_change(node, change, prior, brokers);
}

/* Whether the map names our process now (known_since). */
static void note_known(struct cluster_node *node)
{
    if (node->known_since != UINT64_MAX)
        return;
    const struct map_broker *self = cluster_map_broker(&node->map, node->id);
    if (self != NULL && self->incarnation == node->peers[0].incarnation)
        node->known_since = node->map.version;
}

static int on_apply(void *ctx, uint64_t index, const uint8_t *cmd, size_t size, void **result)
{
    struct cluster_node *node = ctx;
    ASSERT(node != NULL);
    ASSERT(cmd != NULL || size == 0);
    struct prior_states prior = {.count = node->map.brokers_count};
    for (uint32_t i = 0; i < prior.count; i++) {
        prior.ids[i] = node->map.brokers[i]->id;
        prior.states[i] = node->map.brokers[i]->state;
        map_event_name_set(&prior.names[i], node->map.brokers[i]->name);
    }
    /* The envelope: a malformed one is applied as an empty command, which
     * the map refuses (and counts) like any malformed command. */
    uint64_t cmd_size = size >= ENVELOPE_HEADER_SIZE ? wire_get_u64(cmd) : 0;
    uint64_t request_id = size >= ENVELOPE_HEADER_SIZE ? wire_get_u64(cmd + 8) : 0;
    if (cmd_size > size - ENVELOPE_HEADER_SIZE || size % 8 != 0)
        cmd_size = 0;
    struct map_change change;
    int rc = cluster_map_apply(&node->map, cmd_size ? cmd + ENVELOPE_HEADER_SIZE : cmd,
                               (size_t)cmd_size, &change);
    if (index <= node->restart_index)
        node->restart_version = node->map.version;
    note_known(node);
    if (change.op != MAP_OP_SYNC)
        log_change(node, rc, &change, &prior);
    if (rc == OK && change.op == MAP_OP_BROKER_LEAVE && change.changed &&
        node->leaving_count < CLUSTER_BROKERS_MAX)
        node->leaving[node->leaving_count++] = change.broker_id;
    if (node->hooks.applied != NULL)
        node->hooks.applied(node->hooks.ctx, rc, &change);
    if (request_id != 0 && (uint32_t)(request_id >> 32) == node->id)
        node__request_applied(node, request_id, rc, &change);
    /* The reply code is a small value, not memory (consensus.h). */
    *result = (void *)(uintptr_t)change.reply_code;
    return rc;
}

static int on_snapshot(void *ctx, uint8_t **data, size_t *size)
{
    struct cluster_node *node = ctx;
    ASSERT(node != NULL);
    return cluster_map_snapshot_alloc(&node->map, data, size);
}

static int on_restore(void *ctx, const uint8_t *data, size_t size)
{
    struct cluster_node *node = ctx;
    ASSERT(node != NULL);
    int rc = cluster_map_snapshot_read(&node->map, data, size);
    if (rc == OK) {
        if (node->starting)
            node->restart_version = node->map.version; /* our own, from disk */
        note_known(node); /* (at the latest: no earlier version is known) */
        char brokers[768];
        format_brokers(&node->map, brokers, sizeof brokers);
        LOG_INFO("cluster map epoch=%llu: restored from a snapshot; brokers: %s",
                 (unsigned long long)node->map.version, brokers);
        if (node->hooks.applied != NULL)
            node->hooks.applied(node->hooks.ctx, OK, NULL);
    }
    return rc;
}

static void controller_tick(struct cluster_node *node, uint64_t now);

static void on_leader_changed(void *ctx, uint64_t leader_id, const char *leader_address,
                              bool is_self)
{
    struct cluster_node *node = ctx;
    ASSERT(node != NULL);
    node->leader_id = leader_id;
    node->hurried_for = 0;
    if (leader_id != 0) {
        node->leaderless_term = 0;
        node->leaderless_rounds = 0;
    }
    bool became = is_self && !node->leader;
    if (is_self != node->leader) {
        node->leader = is_self;
        node->controller_ready = false; /* a new leader waits for its barrier */
    }
    LOG_INFO("cluster: leader is %s (id %llu at %s)%s; map epoch=%llu",
             broker_name_or(&node->map, leader_id, leader_id ? "?" : "none"),
             (unsigned long long)leader_id, leader_address ? leader_address : "-",
             is_self ? " (self)" : "", (unsigned long long)node->map.version);
    /* Requests sent to the old leader may have died with it: the next tick
     * sends them to the new one, not REQUEST_RESEND_MS after the first try
     * (a restarted broker's sync, and with it its clients, waited). */
    if (leader_id != 0) {
        list_for_each(n, &node->requests)
            CONTAINER_OF(n, struct cluster_request, link)->sent_ms = 0;
    }
    if (became && !node->stopping)
        controller_tick(node, uv_now(node->loop)); /* the barrier now, not at the next tick */
}

/* ---- proposals (leader only) ---- */

static void after_state(struct cluster_node *node, uint32_t broker_id);
static void controller_liveness(struct cluster_node *node, uint64_t now);
static void propose_list(struct cluster_node *node, struct map_cmd_list *list,
                         enum proposal_kind kind, uint32_t broker_id);

static int propose(struct cluster_node *node, struct map_cmd *cmd, enum proposal_kind kind,
                   uint32_t broker_id);

/* libraft tells followers the commit index only with the next entries or
 * heartbeat (up to NODE_HEARTBEAT_MS later): a follower would answer its
 * client late, and its clients would see a definition changed elsewhere
 * late. An empty entry right after a request committed carries the new
 * commit index at once. */
static void nudge(struct cluster_node *node)
{
    if (node->nudge_in_flight) {
        node->nudge_again = true;
        return;
    }
    struct map_cmd cmd;
    ASSERT(map_cmd_sync(&cmd) == OK);
    if (propose(node, &cmd, PROPOSAL_NUDGE, node->id) == OK)
        node->nudge_in_flight = true;
}

static void on_proposal_done(void *req_ctx, int status, void *result)
{
    struct proposal *p = req_ctx;
    struct cluster_node *node = p->node;
    ASSERT(node->proposals_in_flight > 0);
    node->proposals_in_flight--;
    bool committed = status == OK || status == CONSENSUS_E_APPLY;
    struct peer *peer = node__peer_find(node, p->broker_id);
    switch (p->kind) {
    case PROPOSAL_BARRIER:
        node->barrier_in_flight = false;
        if (peer != NULL)
            peer->join_in_flight = false;
        if (committed && !node->stopping && consensus_is_leader(node->consensus)) {
            node->controller_ready = true;
            node->leader_since_ms = uv_now(node->loop);
            controller_leader_start(&node->ctl, node->leader_since_ms);
            LOG_INFO("cluster: controller active at map epoch=%llu",
                     (unsigned long long)node->map.version);
            controller_liveness(node, uv_now(node->loop)); /* a dead leader: at once */
        }
        break;
    case PROPOSAL_JOIN:
        if (peer != NULL) {
            peer->join_in_flight = false;
            peer->join_refused = status == CONSENSUS_E_APPLY;
            peer->refused_version = node->map.brokers_version;
        }
        break;
    case PROPOSAL_STATE:
        ASSERT(node->liveness_in_flight > 0);
        node->liveness_in_flight--;
        if (status == OK && !node->stopping)
            after_state(node, p->broker_id);
        break;
    case PROPOSAL_NUDGE:
        node->nudge_in_flight = false;
        if (node->nudge_again && status == OK && !node->stopping) {
            node->nudge_again = false;
            nudge(node);
        }
        break;
    case PROPOSAL_POLICY:
        ASSERT(node->policy_in_flight > 0);
        node->policy_in_flight--;
        break;
    case PROPOSAL_REQUEST:
    case PROPOSAL_OTHER:
        break; /* a request not applied is sent again by request_tick */
    }
    /* Followers' clients may depend on the change at once (a declare, a
     * promotion): publish the commit index now. */
    if (status == OK && p->kind != PROPOSAL_NUDGE && !node->stopping)
        nudge(node);
    if (status != OK && status != CONSENSUS_E_SHUTDOWN)
        LOG_DEBUG("cluster: proposal for broker %" PRIu32 ": %s (reply %u)", p->broker_id,
                  consensus_strerror(status), (unsigned)(uintptr_t)result);
    free(p);
}

/* The log entry for cmd: envelope, command, padding. Owned by the caller. */
uint8_t *node__entry_new(const struct map_cmd *cmd, uint64_t request_id, size_t *size_out)
{
    ASSERT(cmd->size > 0 && cmd->size <= CLUSTER_CMD_SIZE_MAX);
    size_t size = ENVELOPE_HEADER_SIZE + (cmd->size + 7) / 8 * 8;
    uint8_t *entry = xcalloc(1, size);
    wire_put_u64(entry, cmd->size);
    wire_put_u64(entry + 8, request_id);
    memcpy(entry + ENVELOPE_HEADER_SIZE, cmd->bytes, cmd->size);
    *size_out = size;
    return entry;
}

/* Proposes cmd (consumed) in its log envelope. OK, or a consensus error
 * (nothing in flight). */
static int propose(struct cluster_node *node, struct map_cmd *cmd, enum proposal_kind kind,
                   uint32_t broker_id)
{
    ASSERT(!node->stopping);
    size_t size;
    uint8_t *entry = node__entry_new(cmd, 0, &size);
    map_cmd_free(cmd);
    struct proposal *p = xcalloc(1, sizeof *p);
    *p = (struct proposal){.node = node, .kind = kind, .broker_id = broker_id};
    int rc = consensus_propose(node->consensus, entry, size, on_proposal_done, p);
    free(entry);
    if (rc != OK) {
        free(p);
        return rc;
    }
    node->proposals_in_flight++;
    return OK;
}

static int propose_join(struct cluster_node *node, struct peer *peer, bool voter,
                        enum proposal_kind kind)
{
    struct map_cmd cmd;
    int rc = map_cmd_broker_join(&cmd, peer->id, bytes_of_cstr(peer->name),
                                 bytes_of_cstr(peer->amqp_address),
                                 bytes_of_cstr(peer->cluster_address), voter,
                                 peer->incarnation);
    ASSERT(rc == OK); /* three short strings */
    rc = propose(node, &cmd, kind, peer->id);
    if (rc == OK)
        peer->join_in_flight = true;
    return rc;
}

/* Up to PROPOSE_BATCH of the controller's commands in one proposal:
 * appended and sent to the followers together (a failover's thousands). */
static uint32_t propose_batch(struct cluster_node *node, struct map_cmd *cmds, uint32_t n,
                              uint32_t broker_id)
{
    if (n > PROPOSE_BATCH)
        n = PROPOSE_BATCH;
    struct consensus_cmd entries[PROPOSE_BATCH];
    for (uint32_t i = 0; i < n; i++) {
        size_t size;
        entries[i].bytes = node__entry_new(&cmds[i], 0, &size);
        entries[i].size = size;
        map_cmd_free(&cmds[i]);
    }
    struct proposal *p = xcalloc(1, sizeof *p);
    *p = (struct proposal){.node = node, .kind = PROPOSAL_OTHER, .broker_id = broker_id};
    int rc = consensus_propose_many(node->consensus, entries, n, on_proposal_done, p);
    for (uint32_t i = 0; i < n; i++)
        free((void *)entries[i].bytes);
    if (rc != OK)
        free(p); /* decided again by the repair sweep */
    else
        node->proposals_in_flight++;
    return n;
}

static void propose_list(struct cluster_node *node, struct map_cmd_list *list,
                         enum proposal_kind kind, uint32_t broker_id)
{
    if (kind == PROPOSAL_OTHER) {
        for (uint32_t i = 0; i < list->count;)
            i += propose_batch(node, &list->items[i], list->count - i, broker_id);
        list->count = 0; /* consumed */
        return;
    }
    for (uint32_t i = 0; i < list->count; i++) {
        if (propose(node, &list->items[i], kind, broker_id) != OK)
            continue; /* decided again at the next tick */
        if (kind == PROPOSAL_STATE)
            node->liveness_in_flight++;
        else if (kind == PROPOSAL_POLICY)
            node->policy_in_flight++;
    }
}

/* The outbox's batch of requests, ours and forwarded ones (see outbox.h). */
static int propose_requests(void *ctx, const struct consensus_cmd *cmds, uint32_t n)
{
    struct cluster_node *node = ctx;
    if (node->stopping || !node->leader)
        return CONSENSUS_E_NOT_LEADER;
    struct proposal *p = xcalloc(1, sizeof *p);
    *p = (struct proposal){.node = node, .kind = PROPOSAL_REQUEST, .broker_id = node->id};
    int rc = consensus_propose_many(node->consensus, cmds, n, on_proposal_done, p);
    if (rc != OK) {
        free(p);
        return rc;
    }
    node->proposals_in_flight++;
    return OK;
}

/* ---- the controller (leader, after its barrier) ---- */

/* A broker.state committed: fail over a broker that went down, give a
 * returning one its queues back (both empty until queues are in the map). */
static void after_state(struct cluster_node *node, uint32_t broker_id)
{
    const struct map_broker *b = cluster_map_broker(&node->map, broker_id);
    if (b == NULL || !consensus_is_leader(node->consensus))
        return;
    struct map_cmd_list list;
    map_cmd_list_init(&list);
    controller_after_state(&node->map, &node->controller, broker_id, &list);
    map_cmd_list_set_reason(&list, 0, b->state == BROKER_STATE_DOWN ? MAP_REASON_FAILOVER
                                                                    : MAP_REASON_RETURN);
    if (list.count > 0)
        LOG_INFO("cluster: controller: broker %.*s is %s: %u change(s) proposed",
                 (int)b->name.len, (const char *)b->name.ptr, broker_state_name(b->state),
                 list.count);
    propose_list(node, &list, PROPOSAL_OTHER, broker_id);
    map_cmd_list_free(&list);
}

static bool map_entry_differs(const struct cluster_map *map, const struct peer *peer, bool voter)
{
    const struct map_broker *b = cluster_map_broker(map, peer->id);
    return b == NULL || !bytes_equal_cstr(b->name, peer->name) ||
           !bytes_equal_cstr(b->amqp_address, peer->amqp_address) ||
           !bytes_equal_cstr(b->cluster_address, peer->cluster_address) || b->voter != voter;
}

static bool departed(const struct cluster_node *node, uint64_t id)
{
    for (uint32_t i = 0; i < node->departed_count; i++) {
        if (node->departed[i] == id)
            return true;
    }
    return false;
}

/* Every Raft member (voter or standby) we have heard from gets a map entry
 * matching its heartbeat: the leader proposes broker.join on its behalf. */
static void controller_announce_members(struct cluster_node *node)
{
    struct consensus_member members[CLUSTER_BROKERS_MAX];
    size_t n = consensus_members(node->consensus, members, CLUSTER_BROKERS_MAX);
    if (n > CLUSTER_BROKERS_MAX)
        n = CLUSTER_BROKERS_MAX;
    for (size_t i = 0; i < n; i++) {
        const struct consensus_member *m = &members[i];
        if (m->role == CONSENSUS_ROLE_SPARE)
            continue; /* transient: its role is being assigned */
        if (departed(node, m->id))
            continue; /* it left: its removal from Raft is under way */
        struct peer *peer = node__peer_find(node, m->id);
        if (peer == NULL || peer->name[0] == '\0' || peer->join_in_flight)
            continue; /* not heard yet */
        if (strcmp(peer->cluster_address, m->address) != 0)
            continue; /* a stale announcement: wait for the member's own */
        if (peer->join_refused && peer->refused_version == node->map.brokers_version)
            continue;
        bool voter = m->role == CONSENSUS_ROLE_VOTER;
        if (map_entry_differs(&node->map, peer, voter))
            propose_join(node, peer, voter, PROPOSAL_JOIN);
    }
}

/* What the leader observed of each broker of the map (controller_heard). */
static uint32_t observe_heard(struct cluster_node *node, uint64_t now,
                              struct controller_heard *heard)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < node->map.brokers_count && n < CLUSTER_BROKERS_MAX; i++) {
        const struct map_broker *b = node->map.brokers[i];
        const struct peer *peer = node__peer_find(node, b->id);
        /* Never heard by this process: silent since it became leader. */
        uint64_t last = node->leader_since_ms;
        if (peer != NULL && peer->last_heard_ms != 0)
            last = peer->last_heard_ms;
        /* A dead process shows at once: its connections drop. Taken as a
         * reset when its heartbeats stopped too (a link that merely
         * reconnects leaves the heartbeats going). */
        bool reset = peer != NULL && peer->reset_at_ms != 0 &&
                     peer->reset_at_ms + NODE_HEARTBEAT_MS >= last &&
                     now >= last + NODE_RESET_SILENCE_MS;
        uint32_t version = peer != NULL ? peer->map_version : 0;
        if (b->id == node->id)
            version = (uint32_t)node->map.version;
        heard[n++] = (struct controller_heard){
            .broker_id = b->id, .last_heard_ms = last,
            .connection_reset = (peer != NULL && peer->stopping) || reset,
            .incarnation = peer != NULL ? peer->incarnation : 0, .map_version = version,
            .stopping = peer != NULL && peer->stopping};
    }
    return n;
}

static struct controller_observed observe(struct cluster_node *node, uint64_t now,
                                          struct controller_heard *heard)
{
    return (struct controller_observed){
        .heard = heard, .heard_count = observe_heard(node, now, heard),
        .liveness_in_flight = node->liveness_in_flight,
        .policy_in_flight = node->policy_in_flight,
        .proposals_in_flight = node->proposals_in_flight};
}

/* Each broker.state alone, so its follow-up (after_state) knows whose it is. */
static void propose_states(struct cluster_node *node, struct controller_actions *a)
{
    for (uint32_t i = 0; i < a->states.count; i++) {
        struct map_cmd_list one = {.items = &a->states.items[i], .count = 1};
        propose_list(node, &one, PROPOSAL_STATE, a->state_ids[i]);
    }
    a->states.count = 0; /* consumed */
}

/* The barrier committed: a dead leader is failed over at once. */
static void controller_liveness(struct cluster_node *node, uint64_t now)
{
    struct controller_heard heard[CLUSTER_BROKERS_MAX];
    struct controller_observed seen = observe(node, now, heard);
    struct controller_actions a;
    controller_actions_init(&a);
    controller_leader_liveness(&node->map, &node->controller, &seen, now, &a);
    propose_states(node, &a);
    controller_actions_free(&a);
}

/* Brokers that left the map leave Raft too (queued behind other
 * membership changes; a follower forgets its list, the leader acts). */
static void controller_remove_leavers(struct cluster_node *node)
{
    for (uint32_t i = 0; i < node->leaving_count; i++) {
        uint32_t id = node->leaving[i];
        int rc = consensus_remove_member(node->consensus, id, NULL, NULL);
        if (node->departed_count < CLUSTER_BROKERS_MAX)
            node->departed[node->departed_count++] = id;
        LOG_INFO("cluster: removing broker %" PRIu32 " from the Raft members: %s", id,
                 rc == OK ? "queued" : consensus_strerror(rc));
    }
    node->leaving_count = 0;
}

/* The log lines of a tick's round and policies. */
static void log_actions(const struct controller_actions *a)
{
    switch (a->round_kind) {
    case CONTROLLER_ROUND_REPAIR:
        LOG_INFO("cluster: controller repairs %u placement(s)", a->round.count);
        break;
    case CONTROLLER_ROUND_DRAIN:
        LOG_INFO("cluster: draining: %u step(s)", a->round.count);
        break;
    case CONTROLLER_ROUND_REBALANCE:
        LOG_INFO("cluster: rebalancing: %u step(s), %u move(s) in progress", a->round.count,
                 a->round_pending);
        break;
    case CONTROLLER_ROUND_REBALANCED:
        LOG_INFO("cluster: rebalanced");
        break;
    case CONTROLLER_ROUND_REBALANCE_MODE:
    case CONTROLLER_ROUND_NOTHING:
        break;
    }
    if (a->policies.count > 0)
        LOG_INFO("cluster: replication policies change the factor of %" PRIu32 " queue(s)",
                 a->policies.count);
}

/* Liveness, then repair, draining and rebalancing (the first that is due
 * and has something to do, once nothing of ours is in flight), then the
 * policies: controller_leader_tick decides, this proposes. */
static void controller_decide(struct cluster_node *node, uint64_t now)
{
    struct controller_heard heard[CLUSTER_BROKERS_MAX];
    struct controller_observed seen = observe(node, now, heard);
    struct controller_actions a;
    controller_actions_init(&a);
    node->ctl.round.auto_rebalance = node->auto_rebalance;
    controller_leader_tick(&node->map, &node->controller, &node->ctl, &seen, now, &a);
    log_actions(&a);
    static const enum map_reason round_reasons[] = {
        [CONTROLLER_ROUND_REPAIR] = MAP_REASON_REPAIR,
        [CONTROLLER_ROUND_DRAIN] = MAP_REASON_DRAIN,
        [CONTROLLER_ROUND_REBALANCE] = MAP_REASON_REBALANCE,
        [CONTROLLER_ROUND_REBALANCED] = MAP_REASON_REBALANCE,
        [CONTROLLER_ROUND_REBALANCE_MODE] = MAP_REASON_REBALANCE,
        [CONTROLLER_ROUND_NOTHING] = MAP_REASON_NONE,
    };
    map_cmd_list_set_reason(&a.round, 0, round_reasons[a.round_kind]);
    map_cmd_list_set_reason(&a.policies, 0, MAP_REASON_POLICY);
    propose_states(node, &a);
    propose_list(node, &a.round, PROPOSAL_OTHER, node->id);
    propose_list(node, &a.policies, PROPOSAL_POLICY, node->id);
    controller_actions_free(&a);
}

static void controller_tick(struct cluster_node *node, uint64_t now)
{
    if (!node->leader || node->stopping) {
        node->leaving_count = 0; /* the leader removes them */
        return;
    }
    if (!node->controller_ready) {
        /* The barrier: our own broker.join. Once it commits, every entry
         * of earlier terms is applied here too. */
        struct peer *self = &node->peers[0];
        if (!node->barrier_in_flight &&
            propose_join(node, self, true, PROPOSAL_BARRIER) == OK)
            node->barrier_in_flight = true;
        return;
    }
    controller_remove_leavers(node);
    controller_announce_members(node);
    controller_decide(node, now);
}

/* ---- the broker's side ---- */

void cluster_node_set_hooks(struct cluster_node *node, const struct cluster_node_hooks *hooks)
{
    node->hooks = *hooks;
}

const struct controller_config *cluster_node_controller_config(const struct cluster_node *node)
{
    return &node->controller;
}

void cluster_node_write_events(const struct cluster_node *node, struct json *body)
{
    map_events_write_json(&node->events, body);
}

uint64_t cluster_node_known_since(const struct cluster_node *node)
{
    /* A first start (no map of our own on disk): whatever the map gives
     * this broker was given to this process, before the map names it too
     * (a queue declared on a broker that just joined was handed to its
     * backup at the sync as if we had restarted: 17's join test, in CI). */
    if (node->restart_version == 0)
        return 0;
    return node->known_since;
}

uint64_t cluster_node_restart_version(const struct cluster_node *node)
{
    return node->restart_version;
}

bool cluster_node_synced(const struct cluster_node *node)
{
    return node->synced;
}

uint32_t cluster_node_peer_incarnation(struct cluster_node *node, uint32_t broker_id)
{
    const struct peer *peer = node__peer_find(node, broker_id);
    return peer != NULL ? peer->incarnation : 0;
}

/* The leader looks dead (its connections dropped, or its heartbeats
 * stopped): a follower stands for election soon instead of after its full
 * election timeout (pre-vote spares a leader that is alive). */
static void hurry_election(struct cluster_node *node)
{
    if (node->leader || node->leader_id == 0 || node->hurried_for == node->leader_id)
        return;
    node->hurried_for = node->leader_id;
    if (consensus_hurry_election(node->consensus, NODE_HURRY_ELECTION_MS))
        LOG_INFO("cluster: the leader (id %llu) looks dead: standing for election soon",
                 (unsigned long long)node->leader_id);
}

/* Each tick: a leader not heard for a while; or none known at all, where
 * candidates retry soon (one that lost a vote to a peer still loyal to a
 * dead leader would otherwise wait a full election timeout). */
static void hurry_if_leader_silent(struct cluster_node *node, uint64_t now)
{
    if (node->leader || node->stopping)
        return;
    if (node->leader_id == 0) {
        if (!node->synced)
            return;
        /* Each term that passes without a leader is an election that came
         * to nothing, most often a split vote: candidates that all hurry
         * with the same window collide again, so the window doubles for
         * every such term, up to the normal election timeout. */
        struct consensus_log log;
        consensus_log_state(node->consensus, &log);
        if (log.term != node->leaderless_term) {
            if (node->leaderless_term != 0 && node->leaderless_rounds < NODE_HURRY_BACKOFF_MAX)
                node->leaderless_rounds++;
            node->leaderless_term = log.term;
        }
        (void)consensus_hurry_election(node->consensus,
                                       NODE_HURRY_ELECTION_MS << node->leaderless_rounds);
        return;
    }
    const struct peer *peer = node__peer_find(node, node->leader_id);
    if (peer != NULL && peer->last_heard_ms != 0 &&
        now - peer->last_heard_ms >= NODE_HURRY_SILENCE_MS)
        hurry_election(node);
}

void cluster_node_peer_lost(struct cluster_node *node, uint32_t broker_id)
{
    struct peer *peer = node__peer_find(node, broker_id);
    if (peer == NULL || node->stopping)
        return;
    peer->reset_at_ms = uv_now(node->loop);
    if (broker_id == node->leader_id)
        hurry_election(node);
}

void cluster_node_set_default_backups(struct cluster_node *node, uint8_t default_backups)
{
    ASSERT(default_backups <= CLUSTER_BACKUPS_MAX);
    node->controller.default_backups = default_backups;
}

void cluster_node_set_auto_rebalance(struct cluster_node *node, bool on)
{
    node->auto_rebalance = on;
}

uint32_t cluster_node_leader(const struct cluster_node *node)
{
    return (uint32_t)node->leader_id;
}

void cluster_node_raft_log(const struct cluster_node *node, struct consensus_log *out)
{
    memset(out, 0, sizeof *out);
    if (!node->stopping)
        consensus_log_state(node->consensus, out);
}

/* ---- the tick ---- */

static void warn_if_not_member(struct cluster_node *node, uint64_t now)
{
    if (!node->joining || now - node->join_warned_ms < JOIN_WARN_EVERY_MS)
        return;
    node->join_warned_ms = now;
    struct consensus_stats stats;
    consensus_stats(node->consensus, &stats);
    LOG_WARN("cluster: not a member yet after %llu join attempts (%llu authentication "
             "failures: wrong cluster secret?)", (unsigned long long)stats.join_attempt_count,
             (unsigned long long)stats.auth_failure_count);
}

static void on_tick(uv_timer_t *timer)
{
    struct cluster_node *node = timer->data;
    ASSERT(!node->stopping);
    uint64_t now = uv_now(node->loop);
    node->peers[0].last_heard_ms = now;
    node__lease_update(node);
    hurry_if_leader_silent(node, now);
    node__heartbeat_send(node, false);
    warn_if_not_member(node, now);
    controller_tick(node, now);
    node__sync_tick(node);
    node__request_tick(node, now);
}

static void on_joined(void *req_ctx, int status, void *result)
{
    struct cluster_node *node = req_ctx;
    (void)result;
    node->joining = false;
    if (status == OK)
        LOG_INFO("cluster: member of the cluster as %s (id %" PRIu32 ")", node->peers[0].name,
                 node->id);
    else if (status != CONSENSUS_E_SHUTDOWN)
        LOG_ERROR("cluster: cannot join the cluster: %s", consensus_strerror(status));
}

/* ---- start and stop ---- */

static void node_free_if_closed(struct cluster_node *node)
{
    if (node->handles_open > 0 || node->consensus_open)
        return;
    ASSERT(node->proposals_in_flight == 0);
    cluster_map_free(&node->map);
    OPENSSL_cleanse(node->secret, sizeof node->secret);
    free(node);
}

static void on_handle_closed(uv_handle_t *handle)
{
    struct cluster_node *node = handle->data;
    ASSERT(node->handles_open > 0);
    node->handles_open--;
    node_free_if_closed(node);
}

static void on_consensus_closed(void *ctx)
{
    struct cluster_node *node = ctx;
    node->consensus_open = false;
    node->consensus = NULL;
    node_free_if_closed(node);
}

static void close_handles(struct cluster_node *node)
{
    uv_timer_stop(&node->timer);
    uv_udp_recv_stop(&node->udp);
    uv_close((uv_handle_t *)&node->timer, on_handle_closed);
    uv_close((uv_handle_t *)&node->udp, on_handle_closed);
    outbox_close(&node->outbox, on_handle_closed);
}

void cluster_node_stop(struct cluster_node *node)
{
    ASSERT(node != NULL);
    ASSERT(!node->stopping);
    LOG_INFO("cluster: leaving (stopping) at map epoch=%llu",
             (unsigned long long)node->map.version);
    node__heartbeat_send(node, true); /* the leader marks us down at once */
    node->stopping = true;
    while (!list_empty(&node->requests))
        node__request_finish(CONTAINER_OF(node->requests.next, struct cluster_request, link),
                             CLUSTER_E_UNAVAILABLE, NULL);
    close_handles(node);
    consensus_stop(node->consensus, on_consensus_closed, node);
}

static void init_self(struct cluster_node *node, const struct cluster_node_config *config)
{
    struct peer *self = &node->peers[0];
    self->id = node->id;
    if (config->name != NULL && config->name[0] != '\0') {
        snprintf(self->name, sizeof self->name, "%s", config->name);
    } else if (gethostname(self->name, sizeof self->name) != 0 || !node__name_ok(self->name)) {
        snprintf(self->name, sizeof self->name, "quay-%" PRIu32, node->id);
    }
    self->name[sizeof self->name - 1] = '\0';
    snprintf(self->amqp_address, sizeof self->amqp_address, "%s", config->amqp_address);
    snprintf(self->cluster_address, sizeof self->cluster_address, "%s", config->listen);
    node->peers_count = 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    node->sequence = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    /* A new process: the controller takes it out of the in-sync sets
     * (broker.incarnation). Random, so a restart is told apart from the
     * process before it but for a 1 in 2^24 draw. */
    uint32_t incarnation = 0;
    if (uv_random(NULL, NULL, &incarnation, sizeof incarnation, 0, NULL) != 0)
        incarnation = (uint32_t)uv_hrtime() ^ (uint32_t)ts.tv_nsec;
    incarnation &= HEARTBEAT_INCARNATION_MAX;
    self->incarnation = incarnation != 0 ? incarnation : 1;
}

/* Allocates the node with its secret, id, map and handles (not started). */
static struct cluster_node *node_new(uv_loop_t *loop, const struct cluster_node_config *config,
                                     char *err, size_t err_size)
{
    struct cluster_node *node = xcalloc(1, sizeof *node);
    node->loop = loop;
    if (node__read_secret(config->secret_file, node->secret, &node->secret_size, err, err_size) ||
        node__load_or_create_id(config->data_dir, &node->id, err, err_size)) {
        OPENSSL_cleanse(node->secret, sizeof node->secret);
        free(node);
        return NULL;
    }
    cluster_map_init(&node->map);
    node->known_since = UINT64_MAX;
    list_init(&node->requests);
    uint32_t start = 0;
    RAND_bytes((uint8_t *)&start, sizeof start); /* ids of an earlier run may still be in the log */
    node->next_request = start;
    controller_config_default(&node->controller);
    node->auto_rebalance = true;
    node->controller.suspect_after_ms = NODE_SUSPECT_AFTER_MS;
    node->controller.down_after_ms = NODE_DOWN_AFTER_MS;
    init_self(node, config);
    uv_udp_init(loop, &node->udp);
    uv_timer_init(loop, &node->timer);
    outbox_init(&node->outbox, loop, propose_requests, node);
    node->udp.data = node->timer.data = node->outbox.idle.data = node;
    node->handles_open = 3;
    return node;
}

static int start_consensus(struct cluster_node *node, const struct cluster_node_config *config,
                           char *err, size_t err_size)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/raft", config->data_dir);
    if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
        snprintf(err, err_size, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    bool bootstrap = config->join == NULL || config->join[0] == '\0';
    struct consensus_config cfg = {
        .id = node->id, .address = config->listen, .dir = dir, .secret = node->secret,
        .secret_size = node->secret_size, .bootstrap = bootstrap,
        .election_timeout_ms = NODE_ELECTION_TIMEOUT_MS, .tls = config->tls};
    struct consensus_callbacks cb = {
        .ctx = node, .apply = on_apply, .snapshot = on_snapshot, .restore = on_restore,
        .leader_changed = on_leader_changed};
    char why[512] = "";
    node->starting = true; /* a snapshot on disk is restored in consensus_start */
    bool started = consensus_start(&node->consensus, node->loop, &cfg, &cb, why, sizeof why) == OK;
    node->starting = false;
    if (!started) {
        snprintf(err, err_size, "cannot start the cluster member: %s", why);
        return -1;
    }
    node->consensus_open = true;
    struct consensus_log log;
    consensus_log_state(node->consensus, &log);
    node->restart_index = log.last_index;
    if (bootstrap)
        return 0;
    char list[CLUSTER_NODE_PEERS_MAX * 32 + 64];
    snprintf(list, sizeof list, "%s", config->join);
    const char *peers[CLUSTER_NODE_PEERS_MAX];
    size_t count = 0;
    char *save = NULL;
    for (char *p = strtok_r(list, ",", &save); p != NULL && count < CLUSTER_NODE_PEERS_MAX;
         p = strtok_r(NULL, ",", &save))
        peers[count++] = p;
    int rc = consensus_join(node->consensus, peers, count, on_joined, node);
    if (rc != OK) {
        snprintf(err, err_size, "cannot join through %s: %s", config->join,
                 consensus_strerror(rc));
        return -1;
    }
    node->joining = true;
    node->join_warned_ms = uv_now(node->loop);
    return 0;
}

int cluster_node_start(struct cluster_node **out, uv_loop_t *loop,
                       const struct cluster_node_config *config, char *err, size_t err_size)
{
    ASSERT(out != NULL && loop != NULL && config != NULL);
    ASSERT(config->data_dir != NULL && config->amqp_address != NULL);
    *out = NULL;
    if (cluster_node_config_check(config, err, err_size) != 0)
        return -1;
    struct cluster_node *node = node_new(loop, config, err, err_size);
    if (node == NULL)
        return -1;
    if (node__open_udp(node, config->listen, err, err_size) != 0 ||
        start_consensus(node, config, err, err_size) != 0) {
        node->stopping = true;
        close_handles(node);
        if (node->consensus_open)
            consensus_stop(node->consensus, on_consensus_closed, node);
        return -1;
    }
    uv_timer_start(&node->timer, on_tick, NODE_HEARTBEAT_MS, NODE_HEARTBEAT_MS);
    LOG_INFO("cluster: broker %s (id %" PRIu32 ") at %s, amqp %s: %s", node->peers[0].name,
             node->id, config->listen, config->amqp_address,
             node->joining ? "joining" : "bootstrapping or restarting");
    *out = node;
    return 0;
}

/* ---- queries ---- */

uint32_t cluster_node_id(const struct cluster_node *node)
{
    ASSERT(node != NULL);
    return node->id;
}

const char *cluster_node_name(const struct cluster_node *node)
{
    return node->peers[0].name;
}

struct bytes cluster_node_secret(const struct cluster_node *node)
{
    return (struct bytes){node->secret, node->secret_size};
}

const struct cluster_map *cluster_node_map(const struct cluster_node *node)
{
    ASSERT(node != NULL);
    return &node->map;
}
