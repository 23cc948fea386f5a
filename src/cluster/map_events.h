/*
 * map_events.h: the recent cluster events this broker applied, for the
 * console (GET /api/cluster/events): the last MAP_EVENTS_MAX, oldest
 * dropped first. Filled where the map's changes are logged (node.c's
 * log_change and map_log.c: the same events, with the same reasons, as the
 * log lines), so an event costs a copy of a few names and nothing is
 * computed per request.
 *
 * Events (reason: enum map_reason's names):
 *   primary_moved   vhost, queue, from, to (brokers): a failover (reason
 *                   failover, forget) or a planned handover (move, drain,
 *                   rebalance)
 *   move_started    vhost, queue, from (its primary), to (the target)
 *   move_ended      vhost, queue, from, to: cancelled, or a backup move done
 *   available, unavailable   vhost, queue
 *   broker_state    broker, from, to (states: up, suspect, down, draining),
 *                   silence_ms when the controller said how long it was silent
 *   broker_joined, broker_rejoined, broker_left, broker_restarted   broker
 * Each has seq (1, 2, ...: this broker's numbering, to see what is new),
 * time_ms (this broker's wall clock when it applied the change) and epoch
 * (the map's version after it).
 */
#ifndef QUAY_CLUSTER_MAP_EVENTS_H
#define QUAY_CLUSTER_MAP_EVENTS_H

#include <stdint.h>

#include "cluster/map.h"

#define MAP_EVENTS_MAX 100

struct json;

struct map_event_name {
    uint16_t len;
    char s[CLUSTER_NAME_SIZE_MAX];
};

struct map_event {
    uint64_t seq, time_ms, epoch, silence_ms;
    const char *event;  /* static */
    const char *reason; /* static: map_reason_name */
    struct map_event_name broker, vhost, queue, from, to;
};

struct map_events {
    struct map_event items[MAP_EVENTS_MAX]; /* a ring: seq n at (n - 1) % MAP_EVENTS_MAX */
    uint64_t seq;                           /* the last one's (0: none yet) */
};

/* A new event (the oldest dropped when full), its names empty: the caller
 * fills those it has. event and reason must be static strings. */
struct map_event *map_events_push(struct map_events *events, const char *event,
                                  const char *reason, uint64_t epoch);
void map_event_name_set(struct map_event_name *name, struct bytes value);
void map_event_name_set_cstr(struct map_event_name *name, const char *value);

/* {"now_ms": this broker's wall clock, "events": [oldest .. newest]} members
 * into an object the caller began. */
void map_events_write_json(const struct map_events *events, struct json *out);

#endif
