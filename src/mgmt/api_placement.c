/*
 * api_placement.c: see api_placement.h. Reads the cluster map on the loop
 * thread; changes nothing.
 */
#include "mgmt/api_placement.h"

#include <stdlib.h>

#include "broker/broker.h"
#include "cluster/map.h"
#include "cluster/node.h"
#include "cluster/member.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "mgmt/api.h"
#include "lib/json.h"

/* Counts of one (primary, backup) pair, by the brokers' index in the map. */
struct pair_count {
    uint32_t queues;
    uint32_t in_sync;
};

/* The index of broker id in map->brokers, or brokers_count if unknown
 * (linear: at most CLUSTER_BROKERS_MAX). */
static uint32_t broker_index(const struct cluster_map *map, uint32_t id)
{
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        if (map->brokers[i]->id == id)
            return i;
    }
    return map->brokers_count;
}

static void write_name(struct json *out, const char *key, const struct map_broker *b)
{
    json_key(out, key);
    json_string_n(out, (const char *)b->name.ptr, b->name.len);
}

/* pairs[p * n + b] and alone[p] filled in from map's queues. */
static uint32_t count_pairs(const struct cluster_map *map, struct pair_count *pairs,
                            uint32_t *alone)
{
    uint32_t n = map->brokers_count;
    uint32_t unavailable = 0;
    for (uint32_t q = 0; q < map->queues_count; q++) {
        const struct map_queue *mq = map->queues[q];
        unavailable += !mq->available;
        uint32_t p = broker_index(map, mq->primary_id);
        if (p == n)
            continue; /* no primary (cannot last: the controller repairs it) */
        if (mq->backups_count == 0)
            alone[p]++;
        for (uint8_t i = 0; i < mq->backups_count; i++) {
            uint32_t b = broker_index(map, mq->backup_ids[i]);
            if (b == n)
                continue;
            pairs[p * n + b].queues++;
            pairs[p * n + b].in_sync += (mq->in_sync_mask >> i) & 1u;
        }
    }
    return unavailable;
}

static void write_pairs(struct json *out, const struct cluster_map *map)
{
    uint32_t n = map->brokers_count;
    ASSERT(n <= CLUSTER_BROKERS_MAX);
    struct pair_count *pairs = xcalloc((size_t)n * n + 1, sizeof *pairs);
    uint32_t *alone = xcalloc((size_t)n + 1, sizeof *alone);
    uint32_t unavailable = count_pairs(map, pairs, alone);
    json_kv_uint(out, "unavailable", unavailable);
    json_key(out, "pairs");
    json_array_begin(out);
    for (uint32_t p = 0; p < n; p++) {
        for (uint32_t b = 0; b < n; b++) {
            const struct pair_count *c = &pairs[p * n + b];
            if (c->queues == 0)
                continue;
            json_object_begin(out);
            write_name(out, "primary", map->brokers[p]);
            write_name(out, "backup", map->brokers[b]);
            json_kv_uint(out, "queues", c->queues);
            json_kv_uint(out, "in_sync", c->in_sync);
            json_object_end(out);
        }
    }
    json_array_end(out);
    json_key(out, "alone");
    json_array_begin(out);
    for (uint32_t p = 0; p < n; p++) {
        if (alone[p] == 0)
            continue;
        json_object_begin(out);
        write_name(out, "primary", map->brokers[p]);
        json_kv_uint(out, "queues", alone[p]);
        json_object_end(out);
    }
    json_array_end(out);
    free(pairs);
    free(alone);
}

static void handle_placement(void *ctx, struct json *out)
{
    struct broker *broker = ctx;
    const struct cluster_node *node = member_node_of(broker);
    const struct cluster_map *map = node ? cluster_node_map(node) : NULL;
    json_object_begin(out);
    json_kv_uint(out, "epoch", map ? map->version : 0);
    json_kv_uint(out, "queues", map ? map->queues_count : 0);
    if (map != NULL) {
        write_pairs(out, map);
    } else {
        json_kv_uint(out, "unavailable", 0);
        json_key(out, "pairs");
        json_array_begin(out);
        json_array_end(out);
        json_key(out, "alone");
        json_array_begin(out);
        json_array_end(out);
    }
    json_object_end(out);
}

void api_placement_register(struct http_server *server, struct broker *broker)
{
    ASSERT(broker != NULL);
    http_server_route(server, "/api/cluster/placement", handle_placement, broker,
                      MGMT_ACCESS_MONITORING);
}
