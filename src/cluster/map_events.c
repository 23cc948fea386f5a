/*
 * map_events.c: see map_events.h.
 */
#include "cluster/map_events.h"

#include <string.h>
#include <time.h>

#include "lib/json.h"

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct map_event *map_events_push(struct map_events *events, const char *event,
                                  const char *reason, uint64_t epoch)
{
    events->seq++;
    struct map_event *e = &events->items[(events->seq - 1) % MAP_EVENTS_MAX];
    e->seq = events->seq;
    e->time_ms = wall_ms();
    e->epoch = epoch;
    e->silence_ms = 0;
    e->event = event;
    e->reason = reason;
    e->broker.len = e->vhost.len = e->queue.len = e->from.len = e->to.len = 0;
    return e;
}

void map_event_name_set(struct map_event_name *name, struct bytes value)
{
    name->len = (uint16_t)(value.len < sizeof name->s ? value.len : sizeof name->s);
    if (name->len > 0)
        memcpy(name->s, value.ptr, name->len);
}

void map_event_name_set_cstr(struct map_event_name *name, const char *value)
{
    map_event_name_set(name, bytes_of_cstr(value));
}

static void put_name(struct json *out, const char *key, const struct map_event_name *name)
{
    if (name->len == 0)
        return;
    json_key(out, key);
    json_string_n(out, name->s, name->len);
}

static void write_one(const struct map_event *e, struct json *out)
{
    json_object_begin(out);
    json_kv_uint(out, "seq", e->seq);
    json_kv_uint(out, "time_ms", e->time_ms);
    json_kv_uint(out, "epoch", e->epoch);
    json_kv_string(out, "event", e->event);
    json_kv_string(out, "reason", e->reason);
    put_name(out, "broker", &e->broker);
    put_name(out, "vhost", &e->vhost);
    put_name(out, "queue", &e->queue);
    put_name(out, "from", &e->from);
    put_name(out, "to", &e->to);
    if (e->silence_ms > 0)
        json_kv_uint(out, "silence_ms", e->silence_ms);
    json_object_end(out);
}

void map_events_write_json(const struct map_events *events, struct json *out)
{
    json_kv_uint(out, "now_ms", wall_ms());
    json_key(out, "events");
    json_array_begin(out);
    uint64_t first = events->seq > MAP_EVENTS_MAX ? events->seq - MAP_EVENTS_MAX + 1 : 1;
    for (uint64_t seq = first; seq <= events->seq; seq++)
        write_one(&events->items[(seq - 1) % MAP_EVENTS_MAX], out);
    json_array_end(out);
}
