/*
 * map_log.c: see map_log.h.
 */
#include "cluster/map_log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cluster/map.h"
#include "cluster/map_events.h"
#include "lib/log.h"

/* (as in the API's paths, so that a JSON log keeps it whole) */
void map_log_word(struct bytes name, char *out, size_t size)
{
    size_t n = 0;
    for (uint32_t i = 0; i < name.len && n + 4 < size; i++) {
        unsigned char ch = name.ptr[i];
        if (ch <= ' ' || ch == '%' || ch == 0x7f)
            n += (size_t)snprintf(out + n, size - n, "%%%02X", ch);
        else
            out[n++] = (char)ch;
    }
    out[n] = '\0';
}

static void broker_word(const struct cluster_map *map, uint32_t id, char *out, size_t size)
{
    const struct map_broker *b = id != BROKER_ID_NONE ? cluster_map_broker(map, id) : NULL;
    if (b != NULL)
        map_log_word(b->name, out, size);
    else if (id == BROKER_ID_NONE)
        snprintf(out, size, "none");
    else
        snprintf(out, size, "id%" PRIu32, id);
}

/* "b,c" (or "-"): the backups in ids[0..n) whose bit is in mask (all: 0xff). */
static void list_of(const struct cluster_map *map, const uint32_t *ids, uint8_t n, uint8_t mask,
                    char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (uint8_t i = 0; i < n && used + 2 < size; i++) {
        if (!(mask & (1u << i)))
            continue;
        char one[CLUSTER_NAME_SIZE_MAX * 3 + 1];
        broker_word(map, ids[i], one, sizeof one);
        int k = snprintf(out + used, size - used, "%s%s", used ? "," : "", one);
        if (k < 0)
            break;
        used += (size_t)k;
    }
    if (used == 0)
        snprintf(out, size, "-");
}

static int slot_of(const uint32_t *ids, uint8_t n, uint32_t id)
{
    for (uint8_t i = 0; i < n; i++) {
        if (ids[i] == id)
            return i;
    }
    return -1;
}

struct line {
    const struct cluster_map *map;
    const struct map_change *change;
    const struct map_queue *q;
    char vhost[CLUSTER_NAME_SIZE_MAX * 3 + 1];
    char name[CLUSTER_NAME_SIZE_MAX * 3 + 1];
    const char *reason;
    struct map_events *events; /* or NULL */
};

static void set_broker(const struct cluster_map *map, struct map_event_name *out, uint32_t id)
{
    const struct map_broker *b = id != BROKER_ID_NONE ? cluster_map_broker(map, id) : NULL;
    if (b != NULL)
        map_event_name_set(out, b->name);
}

/* The event also in the recent events (map_events.h), as the line says it. */
static void record(const struct line *l, const char *event, uint32_t from, uint32_t to)
{
    if (l->events == NULL)
        return;
    struct map_event *e = map_events_push(l->events, event, l->reason, l->change->version);
    map_event_name_set(&e->vhost, l->q->vhost->name);
    map_event_name_set(&e->queue, l->q->name);
    set_broker(l->map, &e->from, from);
    set_broker(l->map, &e->to, to);
}

/* One event: the fields every line has, then the event's own. */
static void emit(const struct line *l, const char *event, const char *fields)
{
    char backups[512], in_sync[512], primary[CLUSTER_NAME_SIZE_MAX * 3 + 1];
    const struct map_queue *q = l->q;
    broker_word(l->map, q->primary_id, primary, sizeof primary);
    list_of(l->map, q->backup_ids, q->backups_count, 0xff, backups, sizeof backups);
    list_of(l->map, q->backup_ids, q->backups_count, q->in_sync_mask, in_sync, sizeof in_sync);
    LOG_INFO("map_epoch=%llu event=%s vhost=%s queue=%s %s reason=%s queue_epoch=%llu "
             "primary=%s backups=%s in_sync=%s cluster map change",
             (unsigned long long)l->change->version, event, l->vhost, l->name, fields, l->reason,
             (unsigned long long)q->epoch, primary, backups, in_sync);
}

static void emit_broker(const struct line *l, const char *event, const char *key, uint32_t id)
{
    char who[CLUSTER_NAME_SIZE_MAX * 3 + 1], fields[CLUSTER_NAME_SIZE_MAX * 3 + 16];
    broker_word(l->map, id, who, sizeof who);
    snprintf(fields, sizeof fields, "%s=%s", key, who);
    emit(l, event, fields);
}

/* The backups added, removed, gone in and out of sync (not the primary's
 * own change of role: a promoted backup is the primary_moved line). */
static void backup_events(const struct line *l)
{
    const struct map_change *c = l->change;
    const struct map_queue *q = l->q;
    for (uint8_t i = 0; i < q->backups_count; i++) {
        uint32_t id = q->backup_ids[i];
        int was = slot_of(c->before.backup_ids, c->before.backups_count, id);
        bool now_in_sync = (q->in_sync_mask & (1u << i)) != 0;
        bool was_in_sync = was >= 0 && (c->before.in_sync_mask & (1u << was)) != 0;
        if (was < 0 && id != c->before.primary_id)
            emit_broker(l, "backup_added", "broker", id);
        if (now_in_sync && !was_in_sync && id != c->before.primary_id)
            emit_broker(l, "backup_in_sync", "broker", id);
        else if (!now_in_sync && was_in_sync)
            emit_broker(l, "backup_out_of_sync", "broker", id);
    }
    for (uint8_t i = 0; i < c->before.backups_count; i++) {
        uint32_t id = c->before.backup_ids[i];
        if (slot_of(q->backup_ids, q->backups_count, id) < 0 && id != q->primary_id)
            emit_broker(l, "backup_removed", "broker", id);
    }
}

/* Why the primary changed: a planned handover ends a move and says the
 * move's reason; any other change of primary is a failover (a dead
 * broker's queues), unless the command said more (forget). */
static const char *primary_reason(const struct map_change *c)
{
    if (c->op == MAP_OP_QUEUE_SET_OWNER && c->planned)
        return map_reason_name(c->before.move_reason ? (enum map_reason)c->before.move_reason
                                                     : MAP_REASON_MOVE);
    if (c->reason == MAP_REASON_FORGET)
        return map_reason_name(MAP_REASON_FORGET);
    return map_reason_name(MAP_REASON_FAILOVER);
}

void map_log_change(const struct cluster_map *map, const struct map_change *c,
                    struct map_events *events)
{
    const struct map_queue *q = c->queue;
    if (q == NULL || !c->changed || !c->has_before || c->op == MAP_OP_QUEUE_DECLARE)
        return; /* declares and deletes: map.h's debug line */
    struct line l = {.map = map, .change = c, .q = q, .reason = map_reason_name(c->reason),
                     .events = events};
    map_log_word(q->vhost->name, l.vhost, sizeof l.vhost);
    map_log_word(q->name, l.name, sizeof l.name);
    char from[CLUSTER_NAME_SIZE_MAX * 3 + 1], to[CLUSTER_NAME_SIZE_MAX * 3 + 1];
    char fields[sizeof from + sizeof to + 16];
    if (q->primary_id != c->before.primary_id) {
        struct line p = l;
        p.reason = primary_reason(c);
        broker_word(map, c->before.primary_id, from, sizeof from);
        broker_word(map, q->primary_id, to, sizeof to);
        snprintf(fields, sizeof fields, "from=%s to=%s", from, to);
        emit(&p, "primary_moved", fields);
        record(&p, "primary_moved", c->before.primary_id, q->primary_id);
        if (c->before.move_to != BROKER_ID_NONE && c->before.move_to != q->primary_id)
            l.reason = p.reason; /* a failover overtook a move: the backups' changes too */
        else if (c->reason == MAP_REASON_NONE)
            l.reason = p.reason;
    }
    if (q->move_to != c->before.move_to && q->move_to != BROKER_ID_NONE) {
        struct line m = l;
        m.reason = map_reason_name((enum map_reason)q->move_reason);
        emit_broker(&m, "move_started", "to", q->move_to);
        record(&m, "move_started", q->primary_id, q->move_to);
        l.reason = m.reason;
    } else if (q->move_to == BROKER_ID_NONE && c->before.move_to != BROKER_ID_NONE &&
               q->primary_id == c->before.primary_id) {
        struct line m = l;
        m.reason = map_reason_name((enum map_reason)c->before.move_reason);
        emit_broker(&m, "move_ended", "to", c->before.move_to);
        record(&m, "move_ended", q->primary_id, c->before.move_to);
    }
    backup_events(&l);
    if (q->available != c->before.available) {
        emit(&l, q->available ? "available" : "unavailable", "");
        record(&l, q->available ? "available" : "unavailable", BROKER_ID_NONE, BROKER_ID_NONE);
    }
}
