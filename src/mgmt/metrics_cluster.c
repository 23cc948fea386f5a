/*
 * metrics_cluster.c: the cluster's families of GET /metrics (metrics.h),
 * all named quay_: the map (epoch, brokers and their states, moves),
 * Raft (term, indexes, whether this broker leads), every queue's role
 * here and, for the queues this broker is the primary of, their backups
 * and how many are in sync; the links to the other brokers. Read from the
 * map and the member as they are, on the loop thread; nothing is kept
 * between scrapes.
 *
 * Every broker of a cluster answers the map's families alike (it is one
 * map); the per-queue ones differ (a queue's role is per broker), and so
 * do Raft's indexes and the links.
 *
 * The per-queue families (quay_queue_role, quay_queue_backups,
 * quay_queue_backups_in_sync) are written by metrics.c with RabbitMQ's,
 * from the same walk over this broker's queue objects, a slice a loop
 * turn (metrics.c says why): every queue of the map has one here (its
 * primary's queue, or a stand-in: cluster/mirror.c), and this file only
 * reads each one's entry in the map (metrics__cluster_queue). So do the
 * unavailable and moving counts, which count the queues walked: all of
 * the map's once this broker has applied it.
 */
#include <stddef.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/adoption.h"
#include "cluster/consensus.h"
#include "cluster/link.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "lib/assert.h"
#include "lib/hash.h"
#include "lib/json.h"
#include "mgmt/metrics.h"
#include "mgmt/prom.h"

static const enum broker_state broker_states[] = {
    BROKER_STATE_UP,
    BROKER_STATE_SUSPECT,
    BROKER_STATE_DOWN,
    BROKER_STATE_DRAINING,
};

static void write_raft(struct prom *prom, const struct cluster_node *node)
{
    struct consensus_log log;
    cluster_node_raft_log(node, &log);
    uint32_t self = cluster_node_id(node);
    prom_gauge(prom, "quay_raft_term", "The Raft term this broker is in", log.term);
    prom_gauge(prom, "quay_raft_commit_index", "The highest Raft log index known committed",
               log.commit_index);
    prom_gauge(prom, "quay_raft_applied_index",
               "The highest Raft log index applied to this broker's map", log.applied_index);
    prom_gauge(prom, "quay_raft_last_index", "The last Raft log index here, committed or not",
               log.last_index);
    prom_gauge(prom, "quay_cluster_leader",
               "is 1 if this broker is the Raft leader (the cluster's controller)",
               self != 0 && cluster_node_leader(node) == self);
    prom_gauge(prom, "quay_cluster_lease_fresh",
               "is 1 if this broker's lease is fresh (it may confirm as a primary)",
               cluster_node_lease_fresh(node));
}

static void broker_label(struct prom *prom, const struct map_broker *b)
{
    prom_sample_begin(prom);
    prom_label(prom, "broker", b->name);
}

static void write_brokers(struct prom *prom, const struct cluster_map *map)
{
    prom_family(prom, "quay_cluster_broker_state", PROM_TYPE_GAUGE,
                "is 1 for each broker of the map in the state it is in (up, suspect, down, "
                "draining)");
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        for (size_t s = 0; s < sizeof broker_states / sizeof broker_states[0]; s++) {
            broker_label(prom, b);
            prom_label_str(prom, "state", broker_state_name(broker_states[s]));
            prom_sample_end(prom, b->state == broker_states[s]);
        }
    }
    prom_family(prom, "quay_cluster_broker_primaries", PROM_TYPE_GAUGE,
                "Queues each broker of the map is the primary of");
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        broker_label(prom, map->brokers[i]);
        prom_sample_end(prom, map->brokers[i]->queues_owned_count);
    }
    prom_family(prom, "quay_cluster_broker_backups", PROM_TYPE_GAUGE,
                "Queues each broker of the map is a backup of");
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        broker_label(prom, map->brokers[i]);
        prom_sample_end(prom, map->brokers[i]->backups_held_count);
    }
}

static uint32_t in_sync_count(const struct map_queue *mq)
{
    uint32_t n = 0;
    for (uint8_t i = 0; i < mq->backups_count; i++)
        n += (mq->in_sync_mask >> i) & 1u;
    return n;
}

bool metrics__cluster_view(struct broker *broker, struct metrics_cluster_view *view)
{
    const struct cluster_node *node = member_node_of(broker);
    if (node == NULL || member_of(broker) == NULL)
        return false;
    view->map = cluster_node_map(node);
    view->self = cluster_node_id(node);
    view->vhost_key = NULL;
    view->map_vhost = NULL;
    ASSERT(view->self != BROKER_ID_NONE);
    return true;
}

/* queue's entry in the map, or NULL: the one kept on the queue while the
 * map's objects are those it was found among, else looked up by name
 * (its vhost's, then its own) and kept. */
static const struct map_queue *map_entry(struct metrics_cluster_view *view, struct queue *queue)
{
    if (queue->cluster_entry_stamp == view->map->objects_stamp)
        return queue->cluster_entry;
    /* The name's bytes are the broker vhost's own: the same pointer is the
     * same vhost (within a run: nothing is freed meanwhile). */
    struct bytes vhost = queue->vhost->name;
    if (view->vhost_key != vhost.ptr) {
        view->vhost_key = vhost.ptr;
        view->map_vhost = cluster_map_vhost(view->map, vhost);
    }
    const struct map_queue *mq =
        view->map_vhost != NULL ? hmap_get(&view->map_vhost->queues, queue->name) : NULL;
    queue->cluster_entry = mq;
    queue->cluster_entry_stamp = view->map->objects_stamp;
    return mq;
}

enum metrics_role metrics__cluster_queue(struct metrics_cluster_view *view, struct queue *queue,
                                         uint8_t *backups, uint8_t *in_sync,
                                         struct metrics_cluster_totals *totals)
{
    const struct map_queue *mq = map_entry(view, queue);
    if (mq == NULL)
        return METRICS_ROLE_NONE; /* not in the map (yet, or any more) */
    totals->unavailable += !mq->available;
    totals->moving += mq->move_to != BROKER_ID_NONE;
    if (mq->primary_id != view->self)
        return map_queue_has_backup(mq, view->self) ? METRICS_ROLE_BACKUP : METRICS_ROLE_PROXY;
    *backups = mq->backups_count;
    *in_sync = (uint8_t)in_sync_count(mq);
    return METRICS_ROLE_PRIMARY;
}

/* One family of the links' figures, a sample per peer. */
static void write_link_family(struct prom *prom, const struct member *member, const char *name,
                              enum prom_type type, const char *help, size_t offset)
{
    const struct cluster_map *map = cluster_node_map(member->node);
    prom_family(prom, name, type, help);
    for (uint32_t i = 0; i < member->peers_count; i++) {
        const struct member_peer *peer = member->peers[i];
        const struct map_broker *b = cluster_map_broker(map, peer->id);
        struct link_stats stats;
        link_get_stats(peer->link, &stats);
        uint64_t value;
        memcpy(&value, (const char *)&stats + offset, sizeof value);
        prom_sample_begin(prom);
        prom_label(prom, "peer", b != NULL ? b->name : bytes_of_cstr("?"));
        prom_sample_end(prom, value);
    }
}

static void write_links(struct prom *prom, const struct member *member)
{
    prom_family(prom, "quay_cluster_link_up", PROM_TYPE_GAUGE,
                "is 1 if this broker's link to the peer is up");
    const struct cluster_map *map = cluster_node_map(member->node);
    for (uint32_t i = 0; i < member->peers_count; i++) {
        const struct member_peer *peer = member->peers[i];
        const struct map_broker *b = cluster_map_broker(map, peer->id);
        prom_sample_begin(prom);
        prom_label(prom, "peer", b != NULL ? b->name : bytes_of_cstr("?"));
        prom_sample_end(prom, peer->up);
    }
    write_link_family(prom, member, "quay_cluster_link_sent_bytes_total", PROM_TYPE_COUNTER,
                      "Bytes this broker queued on its link to the peer",
                      offsetof(struct link_stats, bytes_out));
    write_link_family(prom, member, "quay_cluster_link_received_bytes_total",
                      PROM_TYPE_COUNTER, "Bytes of whole frames received from the peer",
                      offsetof(struct link_stats, bytes_in));
    write_link_family(prom, member, "quay_cluster_link_connects_total", PROM_TYPE_COUNTER,
                      "Times the link to the peer came up", offsetof(struct link_stats, connects));
    prom_gauge(prom, "quay_cluster_forward_inflight_bytes",
               "Bytes sent to other brokers (forwards, replication) not yet answered",
               member->forward_bytes);
}

void metrics__write_cluster(struct prom *prom, struct broker *broker,
                            const struct metrics_cluster_totals *totals)
{
    if (member_node_of(broker) == NULL || member_of(broker) == NULL)
        return;
    const struct cluster_node *node = member_node_of(broker);
    const struct cluster_map *map = cluster_node_map(node);
    uint32_t self = cluster_node_id(node);
    ASSERT(self != BROKER_ID_NONE);
    prom_gauge(prom, "quay_cluster_map_epoch",
               "The cluster map's version (commands applied): the same on every broker once "
               "in step",
               map->version);
    write_raft(prom, node);
    write_brokers(prom, map);
    prom_gauge(prom, "quay_cluster_queues", "Queues in the cluster map", map->queues_count);
    prom_gauge(prom, "quay_cluster_queues_unavailable",
               "Queues of the map with no primary serving (down, no backup could take over)",
               totals->unavailable);
    prom_gauge(prom, "quay_cluster_moves_in_progress",
               "Queues of the map being moved (a handover or a backup replaced)",
               totals->moving);
    prom_counter(prom, "quay_cluster_queue_moves_total",
                 "Queues handed over to another primary on purpose (moves, drains, "
                 "rebalancing), in the map changes this broker applied since it started",
                 member_of(broker)->queue_moves_count);
    prom_counter(prom, "quay_cluster_queue_failovers_total",
                 "Queues that failed over to a backup, in the map changes this broker "
                 "applied since it started",
                 member_of(broker)->queue_failovers_count);
    prom_counter(prom, "quay_replication_catch_ups_total",
                 "Catch-ups of a backup this broker started as a queue's primary (a reset, "
                 "then every message the queue holds), since it started",
                 member_of(broker)->catch_ups_count);
    prom_gauge(prom, "quay_cluster_paused",
               "1 while this broker, cut off from the majority, sends its clients away "
               "(--partition-handling pause-minority)",
               member_of(broker)->pause.paused ? 1 : 0);
    prom_counter(prom, "quay_cluster_pauses_total",
                 "Times this broker paused for pause-minority since it started",
                 member_of(broker)->pauses_count);
    prom_gauge(prom, "quay_cluster_adoptions_pending",
               "Queues this broker took over from a dead broker's log on shared storage and "
               "has not adopted yet (they wait, paused)",
               adoption_pending_count(member_of(broker)));
    prom_gauge(prom, "quay_cluster_adoptions_unreadable",
               "Queues taken over from a dead broker's log that could not be read whole: "
               "unavailable, tried again every 1 s to 30 s",
               adoption_unreadable_count(member_of(broker)));
    write_links(prom, member_of(broker));
}
