/*
 * events.c: the system exchange amq.quay.cluster (DESIGN §4) and the
 * broker list clients learn from.
 *
 * Every vhost of a clustered broker has amq.quay.cluster, an internal
 * topic exchange: clients bind queues to it (the binding is a map binding
 * like any other) and cannot publish to it. For every map change that
 * concerns them (a broker joined, changed state or left; a queue was
 * placed, moved, became (un)available or was deleted) a JSON message with
 * the current broker list is routed through it. Every broker applies every
 * change, so each one delivers only to the bound queues it is primary of:
 * every bound queue gets each event exactly once, from its own primary.
 *
 * Routing keys: broker.<joined|up|suspect|down|draining|left>.<broker>
 *               queue.<placed|moved|available|unavailable|deleted>.<vhost>.<queue>
 * Body (content-type application/json):
 *   {"event": "broker.down", "epoch": N, "broker": NAME | "vhost": V, "queue": Q,
 *    "primary": NAME, "brokers": [{"name", "amqp", "state"}, ...]}
 * A queue.moved event says "planned": true for a handover (a move, a drain,
 * a rebalance, an offload), false for a failover.
 */
#include "cluster/events.h"

#include <stdio.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/broker.h"
#include "broker/exchange.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "lib/assert.h"
#include "lib/json.h"

#define ROUTE_MAX 256

void events_ensure_exchange(struct vhost *vhost)
{
    if (vhost_exchange(vhost, BYTES_LIT(EVENTS_EXCHANGE)))
        return;
    vhost_exchange_declare(vhost, BYTES_LIT(EVENTS_EXCHANGE), EXCHANGE_TOPIC, true, false, true,
                           (struct bytes){NULL, 0});
}

static void json_name(struct json *j, const char *key, struct bytes b)
{
    json_key(j, key);
    json_string_n(j, b.ptr, b.len);
}

static void write_brokers(struct json *j, const struct cluster_map *map)
{
    json_key(j, "brokers");
    json_array_begin(j);
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        json_object_begin(j);
        json_name(j, "name", b->name);
        json_name(j, "amqp", b->amqp_address);
        json_kv_string(j, "state", broker_state_name(b->state));
        json_object_end(j);
    }
    json_array_end(j);
}

/* Routes one event through vhost's system exchange to the bound queues
 * this broker is primary of. */
static void deliver(struct vhost *vhost, struct bytes routing_key, struct bytes body)
{
    struct exchange *x = vhost_exchange(vhost, BYTES_LIT(EVENTS_EXCHANGE));
    if (x == NULL || !exchange_has_bindings(x))
        return;
    struct bind_dest *dests[ROUTE_MAX];
    struct route_result result = {.dests = dests, .cap = ROUTE_MAX};
    exchange_route(x, routing_key, (struct table){NULL, 0}, &result);
    struct message *m = NULL;
    for (uint32_t i = 0; i < result.count; i++) {
        struct queue *q = CONTAINER_OF(result.dests[i], struct queue, as_dest);
        if (queue_is_remote(q) || q->deleted)
            continue; /* its primary delivers it */
        if (m == NULL) {
            struct basic_properties props = {
                .flags = BASIC_FLAG_CONTENT_TYPE | BASIC_FLAG_DELIVERY_MODE,
                .content_type = BYTES_LIT("application/json"), .delivery_mode = 1};
            uint8_t encoded[64];
            size_t n = basic_properties_encode(&props, encoded, sizeof encoded);
            ASSERT(n > 0);
            m = message_new(BYTES_LIT(EVENTS_EXCHANGE), routing_key, encoded, (uint32_t)n,
                            &props, body.len);
            ASSERT(m != NULL);
            memcpy(m->body, body.ptr, body.len);
            m->body_received = body.len;
        }
        queue_publish(q, m, NULL);
    }
    if (m)
        message_unref(m);
}

static void emit(struct member *member, struct bytes only_vhost, const char *routing_key,
                 struct json *j)
{
    json_object_end(j);
    struct bytes body = {(const uint8_t *)j->data, (uint32_t)j->size};
    struct bytes key = bytes_of_cstr(routing_key);
    if (key.len > 255)
        key.len = 255;
    if (only_vhost.ptr) {
        struct vhost *vhost = broker_vhost(member->broker, only_vhost);
        if (vhost)
            deliver(vhost, key, body);
        return;
    }
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next(&member->broker->vhosts, &i, &e);)
        deliver(e->value, key, body);
}

static const char *queue_event(const struct map_change *c)
{
    switch (c->op) {
    case MAP_OP_QUEUE_DECLARE: return c->changed ? "placed" : NULL;
    case MAP_OP_QUEUE_SET_OWNER: return "moved";
    case MAP_OP_QUEUE_SET_AVAILABLE:
        return c->queue && c->queue->available ? "available" : "unavailable";
    case MAP_OP_QUEUE_DELETE: return "deleted";
    default: return NULL;
    }
}

void events_map_changed(struct member *member, const struct map_change *c,
                        const char *broker_event)
{
    if (!c->changed)
        return;
    const struct cluster_map *map = member_map(member);
    char key[600];
    struct json j;
    json_init(&j);
    json_object_begin(&j);
    if (broker_event != NULL) {
        const struct map_broker *b = cluster_map_broker(map, c->broker_id);
        struct bytes name = b ? b->name : BYTES_LIT("?");
        snprintf(key, sizeof key, "broker.%s.%.*s", broker_event, (int)name.len,
                 (const char *)name.ptr);
        json_kv_string(&j, "event", key);
        json_kv_uint(&j, "epoch", c->version);
        json_name(&j, "broker", name);
        write_brokers(&j, map);
        emit(member, (struct bytes){NULL, 0}, key, &j);
        json_free(&j);
        return;
    }
    const char *what = queue_event(c);
    if (what == NULL || c->name.ptr == NULL || c->vhost.ptr == NULL) {
        json_free(&j);
        return;
    }
    snprintf(key, sizeof key, "queue.%s.%.*s.%.*s", what, (int)c->vhost.len,
             (const char *)c->vhost.ptr, (int)c->name.len, (const char *)c->name.ptr);
    json_kv_string(&j, "event", what);
    json_kv_uint(&j, "epoch", c->version);
    json_name(&j, "vhost", c->vhost);
    json_name(&j, "queue", c->name);
    const struct map_queue *q = cluster_map_queue(map, c->vhost, c->name);
    const struct map_broker *primary = q ? cluster_map_broker(map, q->primary_id) : NULL;
    if (primary)
        json_name(&j, "primary", primary->name);
    if (c->op == MAP_OP_QUEUE_SET_OWNER)
        json_kv_bool(&j, "planned", c->planned);
    write_brokers(&j, map);
    emit(member, c->vhost, key, &j);
    json_free(&j);
}

size_t events_known_hosts(const struct cluster_map *map, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        if (b->state != BROKER_STATE_UP)
            continue;
        size_t need = b->amqp_address.len + (len ? 1 : 0);
        if (len + need + 1 > cap)
            break; /* a shortstr: the first ones that fit */
        if (len)
            out[len++] = ',';
        memcpy(out + len, b->amqp_address.ptr, b->amqp_address.len);
        len += b->amqp_address.len;
        out[len] = '\0';
    }
    return len;
}
