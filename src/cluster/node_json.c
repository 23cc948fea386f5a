/*
 * node_json.c: the cluster's fields of GET /api/cluster
 * (cluster_node_write_fields): this broker, the leader, the map's size,
 * each broker's share of the queues, and the Raft log with, on the leader,
 * each follower's progress. The shares are counted once per map version
 * (struct node_shares says why).
 */
#include "cluster/node.h"
#include "cluster/node_int.h"

#include <string.h>

#include "cluster/consensus.h"
#include "lib/assert.h"
#include "lib/json.h"

static void json_bytes(struct json *body, const char *key, struct bytes b)
{
    json_key(body, key);
    json_string_n(body, b.ptr, b.len);
}

/* The "raft" member of /api/cluster: this broker's log and, on the leader,
 * how far each follower is (a follower stuck in "probe" is one that has
 * not caught up with the map). */
static void write_raft_json(const struct cluster_node *node, struct json *body)
{
    struct consensus_log log;
    consensus_log_state(node->consensus, &log);
    struct consensus_follower followers[CLUSTER_BROKERS_MAX];
    size_t n = consensus_followers(node->consensus, followers, CLUSTER_BROKERS_MAX);
    json_key(body, "raft");
    json_object_begin(body);
    json_kv_uint(body, "term", log.term);
    json_kv_uint(body, "last_index", log.last_index);
    json_kv_uint(body, "commit_index", log.commit_index);
    json_kv_uint(body, "applied_index", log.applied_index);
    json_kv_uint(body, "snapshot_busy_ms", log.snapshot_busy_ms);
    struct consensus_stats stats;
    consensus_stats(node->consensus, &stats);
    json_kv_uint(body, "snapshots_taken", stats.snapshot_count);
    json_kv_uint(body, "snapshots_restored", stats.restore_count);
    json_kv_uint(body, "probe_rewinds", stats.probe_rewind_count);
    json_kv_uint(body, "probe_hurries", stats.probe_hurry_count);
    json_key(body, "followers");
    json_array_begin(body);
    for (size_t i = 0; i < n && i < CLUSTER_BROKERS_MAX; i++) {
        const struct consensus_follower *f = &followers[i];
        const struct map_broker *b =
            f->id <= UINT32_MAX ? cluster_map_broker(&node->map, (uint32_t)f->id) : NULL;
        json_object_begin(body);
        json_kv_uint(body, "id", f->id);
        json_key(body, "name");
        if (b != NULL)
            json_string_n(body, b->name.ptr, b->name.len);
        else
            json_null(body);
        json_kv_string(body, "state", consensus_replication_name(f->state));
        json_kv_uint(body, "next_index", f->next_index);
        json_kv_uint(body, "match_index", f->match_index);
        json_kv_bool(body, "heard", f->heard);
        json_object_end(body);
    }
    json_array_end(body);
    json_object_end(body);
}

/* The shares as of the map's version: counted again only when the map
 * changed (every command applied bumps its version; broker joins, leaves
 * and states bump brokers_version too). */
static const struct node_shares *shares_now(struct cluster_node *node)
{
    const struct cluster_map *map = &node->map;
    struct node_shares *s = &node->shares;
    if (s->valid && s->version == map->version && s->brokers_version == map->brokers_version &&
        s->brokers_count == map->brokers_count)
        return s;
    memset(s, 0, sizeof *s);
    for (uint32_t q = 0; q < map->queues_count; q++) {
        const struct map_queue *mq = map->queues[q];
        s->moving += mq->move_to != BROKER_ID_NONE;
        for (uint32_t i = 0; i < map->brokers_count; i++) {
            uint32_t id = map->brokers[i]->id;
            if (mq->primary_id == id) {
                s->primaries[i]++;
                s->unavailable[i] += !mq->available;
            } else if (map_queue_has_backup(mq, id)) {
                s->backups[i]++;
            }
        }
    }
    s->valid = true;
    s->version = map->version;
    s->brokers_version = map->brokers_version;
    s->brokers_count = map->brokers_count;
    return s;
}

uint32_t cluster_node_moves_count(struct cluster_node *node)
{
    return shares_now(node)->moving;
}

void cluster_node_write_fields(struct cluster_node *node, struct json *body)
{
    ASSERT(node != NULL);
    ASSERT(body != NULL);
    const struct cluster_map *map = &node->map;
    uint64_t leader_id = node->stopping ? 0 : consensus_leader(node->consensus, NULL);
    const struct map_broker *leader =
        leader_id != 0 && leader_id <= UINT32_MAX ? cluster_map_broker(map, (uint32_t)leader_id)
                                                  : NULL;
    json_kv_string(body, "self", node->peers[0].name);
    json_kv_uint(body, "id", node->id);
    json_key(body, "leader");
    if (leader != NULL)
        json_string_n(body, leader->name.ptr, leader->name.len);
    else
        json_null(body);
    json_kv_uint(body, "epoch", map->version);
    json_kv_bool(body, "lease", !node->stopping && cluster_node_lease_fresh(node));
    json_kv_uint(body, "queues", map->queues_count);
    json_kv_uint(body, "exchanges", map->exchanges_count);
    json_kv_uint(body, "bindings", map->bindings_count);
    json_kv_uint(body, "map_bytes", cluster_map_memory_size(map));
    /* Each broker's share of the queues: what an operator watches while a
     * failover or a rebalance moves them. */
    const struct node_shares *shares = shares_now(node);
    json_key(body, "brokers");
    json_array_begin(body);
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        json_object_begin(body);
        json_kv_uint(body, "id", b->id);
        json_bytes(body, "name", b->name);
        json_bytes(body, "amqp", b->amqp_address);
        json_bytes(body, "cluster", b->cluster_address);
        json_kv_string(body, "state", broker_state_name(b->state));
        json_kv_bool(body, "voter", b->voter);
        if (b->storage_id.len > 0)
            json_bytes(body, "storage", b->storage_id); /* --shared-storage's id */
        json_kv_uint(body, "primaries", shares->primaries[i]);
        json_kv_uint(body, "unavailable", shares->unavailable[i]);
        json_kv_uint(body, "backups", shares->backups[i]);
        json_object_end(body);
    }
    json_array_end(body);
    if (!node->stopping)
        write_raft_json(node, body);
}
