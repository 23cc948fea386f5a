/*
 * moves.c: see moves.h.
 */
#include "cluster/moves.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/controller.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/placement.h"
#include "cluster/replication.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "lib/json.h"
#include "lib/json_read.h"

struct move_request {
    char vhost[CLUSTER_NAME_SIZE_MAX + 1];
    char queue[CLUSTER_NAME_SIZE_MAX + 1];
    char to[CLUSTER_NAME_SIZE_MAX + 1];
    char backup_of[CLUSTER_NAME_SIZE_MAX + 1];
    bool has_vhost, has_queue, has_to, has_backup_of;
};

/* A request's string member, when names lists it: copied, NUL-terminated,
 * into its buffer. Names in the map are never empty (a queue's may be on
 * the wire, but server-named ones have names), nor hold a NUL. */
struct name_member {
    const char *key;
    char *out; /* CLUSTER_NAME_SIZE_MAX + 1 bytes */
    bool *seen;
};

static bool read_name_member(const struct json_read_member *m, const struct name_member *names,
                             size_t count, const char *expected, char *err, size_t err_size)
{
    for (size_t i = 0; i < count; i++) {
        if (strcmp(m->key, names[i].key) != 0)
            continue;
        if (m->kind != JSON_READ_STRING || m->string_size == 0 ||
            m->string_size > CLUSTER_NAME_SIZE_MAX ||
            memchr(m->string, '\0', m->string_size) != NULL) {
            snprintf(err, err_size, "%s: a name, 1..%d bytes", m->key, CLUSTER_NAME_SIZE_MAX);
            return false;
        }
        memcpy(names[i].out, m->string, m->string_size + 1);
        *names[i].seen = true;
        return true;
    }
    snprintf(err, err_size, "unknown member '%s' (expected: %s)", m->key, expected);
    return false;
}

static bool read_move_member(void *ctx, const struct json_read_member *m, char *err,
                             size_t err_size)
{
    struct move_request *r = ctx;
    const struct name_member names[] = {{"vhost", r->vhost, &r->has_vhost},
                                        {"queue", r->queue, &r->has_queue},
                                        {"to", r->to, &r->has_to},
                                        {"backup_of", r->backup_of, &r->has_backup_of}};
    return read_name_member(m, names, sizeof names / sizeof names[0],
                            "vhost, queue, to, backup_of", err, err_size);
}

static void on_moved(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    if (status != OK)
        LOG_WARN("cluster: a move did not commit (the map is unavailable): POST "
                 "/api/cluster/move again");
    else if (change->reply_code != 200)
        LOG_WARN("cluster: a move was refused: %u %s", change->reply_code, change->reply_text);
}

/* Why the map would refuse moving q to b now (its backup `from`, if not
 * NULL: a backup move), or NULL. */
static const char *refusal(const struct map_queue *q, const struct map_broker *b,
                           const struct map_broker *from)
{
    if (b->state != BROKER_STATE_UP)
        return "is not up";
    if (from != NULL && !map_queue_has_backup(q, from->id))
        return "cannot replace a broker that is not a backup of the queue (backup_of)";
    if (from != NULL && (map_queue_has_backup(q, b->id) || q->primary_id == b->id))
        return "holds the queue already";
    if (q->primary_id == b->id)
        return "is the queue's primary already";
    if (!q->available)
        return "cannot take it: the queue is unavailable (its primary is down)";
    if (!map_queue_has_backup(q, b->id) && q->backups_count == CLUSTER_BACKUPS_MAX)
        return "is not among the queue's 3 backups (move it to one of them)";
    return NULL;
}

int moves_prepare(struct member *member, const char *request, size_t request_size,
                  struct json *body, struct move_answer *answer, struct map_cmd *cmd)
{
    const struct cluster_map *map = member_map(member);
    int refused = member_api_begin(member, body);
    if (refused != 0)
        return refused;
    struct move_request r = {.vhost = "/"};
    char err[256];
    if (json_read_object(request, request_size, read_move_member, &r, err, sizeof err) != OK)
        return member_api_error(body, 400, err);
    if (!r.has_queue || !r.has_to)
        return member_api_error(body, 400, "expected {\"vhost\": V, \"queue\": Q, \"to\": BROKER"
                                "[, \"backup_of\": BROKER]}");
    char text[900];
    const struct map_queue *q =
        cluster_map_queue(map, bytes_of_cstr(r.vhost), bytes_of_cstr(r.queue));
    if (q == NULL) {
        snprintf(text, sizeof text, "no queue '%s' in vhost '%s'", r.queue, r.vhost);
        return member_api_error(body, 404, text);
    }
    const struct map_broker *to = cluster_map_broker_named(map, r.to);
    if (to == NULL) {
        snprintf(text, sizeof text, "no broker '%s' in the cluster", r.to);
        return member_api_error(body, 404, text);
    }
    const struct map_broker *replaced =
        r.has_backup_of ? cluster_map_broker_named(map, r.backup_of) : NULL;
    if (r.has_backup_of && replaced == NULL) {
        snprintf(text, sizeof text, "no broker '%s' in the cluster", r.backup_of);
        return member_api_error(body, 404, text);
    }
    const char *why = refusal(q, to, replaced);
    if (why != NULL) {
        snprintf(text, sizeof text, "broker '%s' %s", r.to, why);
        return member_api_error(body, 409, text);
    }
    int rc = replaced ? map_cmd_queue_move_backup(cmd, q->vhost->name, q->name, q->epoch,
                                                  replaced->id, to->id)
                      : map_cmd_queue_move(cmd, q->vhost->name, q->name, q->epoch, to->id);
    if (rc == OK)
        rc = map_cmd_set_reason(cmd, MAP_REASON_MOVE);
    if (rc != OK)
        return member_api_error(body, 400, "the names do not fit a map command");
    const struct map_broker *from = replaced ? replaced : cluster_map_broker(map, q->primary_id);
    *answer = (struct move_answer){.backup = replaced != NULL,
                                   .catch_up = !map_queue_backup_in_sync(q, to->id)};
    memcpy(answer->vhost, r.vhost, sizeof answer->vhost);
    memcpy(answer->queue, r.queue, sizeof answer->queue);
    memcpy(answer->to, r.to, sizeof answer->to);
    if (from != NULL)
        snprintf(answer->from, sizeof answer->from, "%.*s", BYTES_ARG(from->name));
    LOG_INFO("cluster: moving queue '%s' in vhost '%s' to broker '%s' (asked through the "
             "management API)", r.queue, r.vhost, r.to);
    return 0;
}

void moves_write_answer(const struct move_answer *answer, struct json *body)
{
    json_object_begin(body);
    json_kv_string(body, "kind", answer->backup ? "backup" : "primary");
    json_kv_string(body, "vhost", answer->vhost);
    json_kv_string(body, "queue", answer->queue);
    json_kv_string(body, "from", answer->from);
    json_kv_string(body, "to", answer->to);
    json_kv_bool(body, "catch_up", answer->catch_up);
    json_object_end(body);
}

/* ---- draining ---- */

static void on_draining(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    if (status != OK)
        LOG_WARN("cluster: a drain did not commit (the map is unavailable): POST "
                 "/api/cluster/drain again");
    else if (change->reply_code != 200)
        LOG_WARN("cluster: a drain was refused: %u %s", change->reply_code, change->reply_text);
}

/* Queues whose factor the brokers left (up, not draining, not b) cannot
 * give. */
static uint32_t short_of_brokers(const struct cluster_map *map, const struct map_broker *b)
{
    uint32_t left = 0;
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *o = map->brokers[i];
        left += o != b && o->state == BROKER_STATE_UP;
    }
    uint32_t count = 0;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        bool involved = q->primary_id == b->id || map_queue_has_backup(q, b->id);
        count += involved && q->replication_factor > left;
    }
    return count + (left == 0 && b->exchanges_owned_count > 0);
}

int moves_drain_post(void *ctx, const char *request, size_t request_size, struct json *body)
{
    struct member *member = ctx;
    const struct cluster_map *map = member_map(member);
    int refused = member_api_begin(member, body);
    if (refused != 0)
        return refused;
    int status;
    const struct map_broker *b = member_api_broker(member, request, request_size, body, &status);
    if (b == NULL)
        return status;
    int name_len = (int)b->name.len;
    const char *name = (const char *)b->name.ptr;
    char text[600];
    if (b->state == BROKER_STATE_DOWN || b->state == BROKER_STATE_SUSPECT) {
        snprintf(text, sizeof text, "broker '%.*s' is %s: a drain moves what a running broker "
                 "holds (forget one that is dead for good)", name_len, name,
                 broker_state_name(b->state));
        return member_api_error(body, 409, text);
    }
    uint32_t short_count = short_of_brokers(map, b);
    if (short_count > 0) {
        snprintf(text, sizeof text, "draining broker '%.*s' would leave %u queue(s) below their "
                 "replication factor: too few other brokers are up", name_len, name,
                 short_count);
        return member_api_error(body, 409, text);
    }
    json_key(body, "draining");
    json_string_n(body, name, (size_t)name_len);
    json_kv_uint(body, "primaries", b->queues_owned_count);
    json_kv_uint(body, "backups", b->backups_held_count);
    json_kv_uint(body, "exchanges", b->exchanges_owned_count);
    json_object_end(body);
    if (b->state == BROKER_STATE_DRAINING)
        return 202; /* going on already */
    struct map_cmd cmd;
    if (map_cmd_broker_state_why(&cmd, b->id, BROKER_STATE_DRAINING, MAP_REASON_DRAIN, 0) == OK)
        cluster_node_submit(member->node, &cmd, on_draining, member);
    LOG_INFO("cluster: draining broker '%.*s' (asked through the management API): %u primaries, "
             "%u backups", name_len, name, b->queues_owned_count, b->backups_held_count);
    return 202;
}

/* POST /api/cluster/revive: a drain undone. */
int moves_revive_post(void *ctx, const char *request, size_t request_size, struct json *body)
{
    struct member *member = ctx;
    int refused = member_api_begin(member, body);
    if (refused != 0)
        return refused;
    int status;
    const struct map_broker *b = member_api_broker(member, request, request_size, body, &status);
    if (b == NULL)
        return status;
    int name_len = (int)b->name.len;
    const char *name = (const char *)b->name.ptr;
    if (b->state != BROKER_STATE_DRAINING) {
        char text[600];
        snprintf(text, sizeof text, "broker '%.*s' is %s, not draining", name_len, name,
                 broker_state_name(b->state));
        return member_api_error(body, 409, text);
    }
    json_key(body, "revived");
    json_string_n(body, name, (size_t)name_len);
    json_kv_uint(body, "primaries", b->queues_owned_count);
    json_kv_uint(body, "backups", b->backups_held_count);
    json_object_end(body);
    struct map_cmd cmd;
    if (map_cmd_broker_state_why(&cmd, b->id, BROKER_STATE_UP, MAP_REASON_REVIVE, 0) == OK)
        cluster_node_submit(member->node, &cmd, on_draining, member);
    LOG_INFO("cluster: broker '%.*s' revived: it no longer drains (asked through the management "
             "API)", name_len, name);
    return 202;
}

/* ---- offloading ---- */

struct offload_request {
    char broker[CLUSTER_NAME_SIZE_MAX + 1];
    char to[CLUSTER_NAME_SIZE_MAX + 1];
    char vhost[CLUSTER_NAME_SIZE_MAX + 1];
    char pattern[CLUSTER_NAME_SIZE_MAX + 1];
    int64_t percent;
    bool has_broker, has_to, has_vhost, has_pattern, has_percent;
};

static bool read_offload_member(void *ctx, const struct json_read_member *m, char *err,
                                size_t err_size)
{
    struct offload_request *r = ctx;
    if (strcmp(m->key, "percent") == 0) {
        if (m->kind != JSON_READ_INT || m->integer < 1 || m->integer > 100) {
            snprintf(err, err_size, "percent: a whole number 1..100");
            return false;
        }
        r->percent = m->integer;
        r->has_percent = true;
        return true;
    }
    const struct name_member names[] = {{"broker", r->broker, &r->has_broker},
                                        {"to", r->to, &r->has_to},
                                        {"vhost", r->vhost, &r->has_vhost},
                                        {"queues", r->pattern, &r->has_pattern}};
    return read_name_member(m, names, sizeof names / sizeof names[0],
                            "broker, to, percent or queues, vhost", err, err_size);
}

/* Whether q (whose primary is the offloading broker) can move to `to` now. */
static bool offloadable(const struct map_queue *q, const struct map_broker *to)
{
    return q->available && !q->exclusive && q->move_to == BROKER_ID_NONE &&
           (map_queue_has_backup(q, to->id) || q->backups_count < CLUSTER_BACKUPS_MAX);
}

/* The queues an offload moves: those the pattern matches (and the vhost,
 * if given), or percent of the broker's primaries, those whose target is
 * an in-sync backup first (nothing to catch up). Marked in picked. */
static uint32_t offload_pick(const struct cluster_map *map, const struct offload_request *r,
                             const regex_t *re, const struct map_broker *from,
                             const struct map_broker *to, bool *picked, uint32_t *skipped)
{
    uint32_t count = 0;
    uint32_t want = (uint32_t)((from->queues_owned_count * (uint64_t)r->percent + 99) / 100);
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < map->queues_count; i++) {
            const struct map_queue *q = map->queues[i];
            if (q->primary_id != from->id || picked[i])
                continue;
            if (r->has_pattern) {
                char name[CLUSTER_NAME_SIZE_MAX + 1];
                memcpy(name, q->name.ptr, q->name.len);
                name[q->name.len] = '\0';
                if (pass == 1 || (r->has_vhost && !bytes_equal_cstr(q->vhost->name, r->vhost)) ||
                    regexec(re, name, 0, NULL, 0) != 0)
                    continue;
            } else if (count == want || (pass == 0) != map_queue_backup_in_sync(q, to->id)) {
                continue;
            }
            if (!offloadable(q, to)) {
                (*skipped)++; /* (each queue is looked at in one pass only) */
                continue;
            }
            picked[i] = true;
            count++;
        }
    }
    return count;
}

int moves_offload_post(void *ctx, const char *request, size_t request_size, struct json *body)
{
    struct member *member = ctx;
    const struct cluster_map *map = member_map(member);
    int refused = member_api_begin(member, body);
    if (refused != 0)
        return refused;
    struct offload_request r = {0};
    char err[256];
    if (json_read_object(request, request_size, read_offload_member, &r, err, sizeof err) != OK)
        return member_api_error(body, 400, err);
    if (!r.has_broker || !r.has_to || r.has_pattern == r.has_percent)
        return member_api_error(body, 400, "expected {\"broker\": B, \"to\": B, and "
                                "\"percent\": 1..100 or \"queues\": REGEX [, \"vhost\": V]}");
    char text[900];
    const struct map_broker *from = cluster_map_broker_named(map, r.broker);
    const struct map_broker *to = cluster_map_broker_named(map, r.to);
    if (from == NULL || to == NULL) {
        snprintf(text, sizeof text, "no broker '%s' in the cluster", from ? r.to : r.broker);
        return member_api_error(body, 404, text);
    }
    if (from == to || to->state != BROKER_STATE_UP) {
        snprintf(text, sizeof text, "broker '%s' %s", r.to,
                 from == to ? "is the one offloading" : "is not up");
        return member_api_error(body, 409, text);
    }
    regex_t re;
    memset(&re, 0, sizeof re);
    if (r.has_pattern && regcomp(&re, r.pattern, REG_EXTENDED | REG_NOSUB) != 0)
        return member_api_error(body, 400, "queues: not a valid regular expression");
    bool *picked = xcalloc(map->queues_count + 1u, sizeof(bool));
    uint32_t skipped = 0;
    uint32_t count = offload_pick(map, &r, &re, from, to, picked, &skipped);
    if (r.has_pattern)
        regfree(&re);
    json_kv_string(body, "broker", r.broker);
    json_kv_string(body, "to", r.to);
    json_kv_uint(body, "moves", count);
    json_kv_uint(body, "skipped", skipped);
    json_object_end(body);
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        struct map_cmd cmd;
        if (picked[i] && map_cmd_queue_move(&cmd, q->vhost->name, q->name, q->epoch, to->id) == OK)
            cluster_node_submit(member->node, &cmd, on_moved, member); /* no reason: "move" */
    }
    free(picked);
    LOG_INFO("cluster: offloading %u queue(s) from broker '%s' to '%s' (asked through the "
             "management API; %u skipped)", count, r.broker, r.to, skipped);
    return 202;
}

/* ---- rebalancing ---- */

struct rebalance_request {
    bool has_auto, auto_on;
};

static bool read_rebalance_member(void *ctx, const struct json_read_member *m, char *err,
                                  size_t err_size)
{
    struct rebalance_request *r = ctx;
    if (strcmp(m->key, "auto") != 0 || m->kind != JSON_READ_BOOL) {
        snprintf(err, err_size, "expected {} or {\"auto\": true|false}");
        return false;
    }
    r->has_auto = true;
    r->auto_on = m->boolean;
    return true;
}

static void on_rebalance_set(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    if (status != OK)
        LOG_WARN("cluster: a rebalance setting did not commit (the map is unavailable): POST "
                 "/api/cluster/rebalance again");
    else if (change->reply_code != 200)
        LOG_WARN("cluster: a rebalance setting was refused: %u %s", change->reply_code,
                 change->reply_text);
}

/* An empty body is {}. */
static bool blank(const char *text, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\n')
            return false;
    }
    return true;
}

int moves_rebalance_post(void *ctx, const char *request, size_t request_size, struct json *body)
{
    struct member *member = ctx;
    const struct cluster_map *map = member_map(member);
    int refused = member_api_begin(member, body);
    if (refused != 0)
        return refused;
    struct rebalance_request r = {0};
    char err[256];
    if (!blank(request, request_size) &&
        json_read_object(request, request_size, read_rebalance_member, &r, err, sizeof err) != OK)
        return member_api_error(body, 400, err);
    enum map_rebalance mode = map->rebalance == MAP_REBALANCE_AUTO ? MAP_REBALANCE_AUTO
                                                                   : MAP_REBALANCE_ONCE;
    if (r.has_auto)
        mode = r.auto_on ? MAP_REBALANCE_AUTO : MAP_REBALANCE_OFF;
    /* What a round would plan now, for the answer (the leader plans anew). */
    struct placement_plan plan;
    placement_plan_init(&plan);
    if (mode != MAP_REBALANCE_OFF)
        placement_rebalance_plan(map, &cluster_node_controller_config(member->node)->placement,
                                 UINT32_MAX, &plan);
    json_kv_string(body, "rebalance", map_rebalance_name(mode));
    json_kv_uint(body, "primary_moves", plan.primary_moves_count);
    json_kv_uint(body, "backup_moves", plan.backup_moves_count);
    json_object_end(body);
    placement_plan_free(&plan);
    struct map_cmd cmd;
    if (mode != map->rebalance && map_cmd_rebalance(&cmd, mode) == OK)
        cluster_node_submit(member->node, &cmd, on_rebalance_set, member);
    LOG_INFO("cluster: rebalance %s (asked through the management API)",
             map_rebalance_name(mode));
    return 202;
}

/* A move's catch-up, as its primary sees it: only the primary's broker
 * knows (the others show the phase). */
static void write_progress(struct member *member, const struct map_queue *q, struct json *body)
{
    if (q->primary_id != member->self_id)
        return;
    struct vhost *vhost = broker_vhost(member->broker, q->vhost->name);
    struct queue *queue = vhost ? vhost_queue(vhost, q->name) : NULL;
    struct replication_progress p;
    if (queue == NULL || queue_is_remote(queue) ||
        !replication_catch_up_progress(queue, q->move_to, &p))
        return;
    json_kv_uint(body, "caught_up_bytes", p.bytes);
    json_kv_uint(body, "caught_up_messages", p.sent);
    json_kv_uint(body, "catch_up_messages", p.total);
}

void moves_write_json(struct member *member, struct json *body)
{
    const struct cluster_map *map = member_map(member);
    json_kv_string(body, "rebalance", map_rebalance_name(map->rebalance));
    json_key(body, "moves");
    json_array_begin(body);
    /* Nearly always none: then no walk of the map's queues (node_shares). */
    uint32_t moving = cluster_node_moves_count(member->node);
    for (uint32_t i = 0; moving > 0 && i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        if (q->move_to == BROKER_ID_NONE)
            continue;
        bool backup = q->move_from != BROKER_ID_NONE;
        const struct map_broker *from =
            cluster_map_broker(map, backup ? q->move_from : q->primary_id);
        const struct map_broker *to = cluster_map_broker(map, q->move_to);
        json_object_begin(body);
        json_kv_string(body, "kind", backup ? "backup" : "primary");
        json_key(body, "vhost");
        json_string_n(body, q->vhost->name.ptr, q->vhost->name.len);
        json_key(body, "queue");
        json_string_n(body, q->name.ptr, q->name.len);
        json_key(body, "from");
        json_string_n(body, from ? from->name.ptr : NULL, from ? from->name.len : 0);
        json_key(body, "to");
        json_string_n(body, to ? to->name.ptr : NULL, to ? to->name.len : 0);
        /* (A primary move also waits for the backup that keeps the
         * factor: map_queue_move_state.) */
        bool caught_up = backup ? map_queue_backup_in_sync(q, q->move_to)
                                : map_queue_move_state(map, q) == MAP_MOVE_READY;
        json_kv_string(body, "phase", !caught_up ? "catching-up"
                                      : backup   ? "releasing"
                                                 : "handing-over");
        if (!caught_up)
            write_progress(member, q, body);
        json_object_end(body);
    }
    json_array_end(body);
}
