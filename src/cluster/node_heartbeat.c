/*
 * node_heartbeat.c: the member heartbeats (see node.h, Liveness) and the
 * lease they give: every NODE_HEARTBEAT_MS a datagram to every Raft member;
 * what each member last said and when (its struct peer); the alarms they
 * carry; the lease (a majority heard lately).
 *
 * Heartbeat datagram (UDP, to every Raft member's cluster address; all
 * integers big-endian):
 *
 *     0   4  magic "QYHB"
 *     4   1  version (1)
 *     5   1  flags (heartbeat.h HEARTBEAT_FLAG_*): stopping (the sender is
 *              shutting down cleanly), its alarms, process fields set, its
 *              map catching up after a start
 *     6   1  name_size (1..255)
 *     7   1  amqp_size (1..255)
 *     8   1  cluster_size (1..255)
 *     9   7  zero
 *    16   8  sender id (its Raft id; map broker ids are 32-bit)
 *    24   8  sequence: strictly increasing per sender, across restarts too
 *              (it starts at the wall clock in microseconds)
 *    32   n  name, AMQP address, cluster address (not NUL-terminated)
 *  32+n  32  HMAC-SHA256(secret, bytes 0 .. 32+n)
 *
 * A datagram that is malformed, fails the MAC or does not advance its
 * sender's sequence is dropped and counted. The MAC input starts with
 * "QYHB", so it cannot be confused with the transport's proofs (which are
 * over "quay-raft ..." labels). Like the transport, this authenticates the
 * sender; it does not hide anything.
 */
#include "cluster/node.h"
#include "cluster/node_int.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/consensus.h"
#include "cluster/fence.h"
#include "cluster/heartbeat.h"
#include "lib/assert.h"
#include "lib/log.h"

static_assert(HEARTBEAT_SIZE_MAX < 1200, "a heartbeat fits one datagram on any link");

/* ---- the lease ---- */

/* The lease lasts NODE_LEASE_MS past the moment the majority-th broker
 * (counting ourselves) was last heard, by a heartbeat that counts: one
 * whose sender's map ours has reached (fence_heard_note). */
void node__lease_update(struct cluster_node *node)
{
    const struct cluster_map *map = &node->map;
    uint64_t heard[CLUSTER_BROKERS_MAX];
    uint32_t n = 0;
    bool member = false;
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        uint32_t id = map->brokers[i]->id;
        if (id == node->id) {
            member = true;
            continue;
        }
        struct peer *peer = node__peer_find(node, id);
        heard[n++] = peer ? fence_heard_ms(&peer->lease, map->version) : 0;
    }
    node->lease_until_ms = fence_lease_until(heard, n, member, NODE_LEASE_MS);
}

bool cluster_node_lease_fresh(const struct cluster_node *node)
{
    return uv_now(node->loop) < node->lease_until_ms;
}

/* ---- heartbeats ---- */

static size_t heartbeat_of_self(struct cluster_node *node, bool stopping, uint8_t *out)
{
    const struct peer *self = &node->peers[0];
    struct heartbeat hb = {.id = node->id, .sequence = ++node->sequence, .stopping = stopping,
                           .alarms = self->alarms, .incarnation = self->incarnation,
                           .map_version = (uint32_t)node->map.version,
                           .catching_up = !node->synced};
    memcpy(hb.name, self->name, sizeof hb.name);
    memcpy(hb.amqp_address, self->amqp_address, sizeof hb.amqp_address);
    memcpy(hb.cluster_address, self->cluster_address, sizeof hb.cluster_address);
    return heartbeat_encode(&hb, node->secret, node->secret_size, out);
}

/* To every Raft member but ourselves. A lost datagram is only a late one. */
void node__heartbeat_send(struct cluster_node *node, bool stopping)
{
    struct consensus_member members[CLUSTER_BROKERS_MAX];
    size_t n = consensus_members(node->consensus, members, CLUSTER_BROKERS_MAX);
    if (n > CLUSTER_BROKERS_MAX)
        n = CLUSTER_BROKERS_MAX;
    if (n == 0)
        return; /* not a member yet */
    uint8_t datagram[HEARTBEAT_SIZE_MAX];
    size_t size = heartbeat_of_self(node, stopping, datagram);
    uv_buf_t buf = uv_buf_init((char *)datagram, (unsigned)size);
    for (size_t i = 0; i < n; i++) {
        struct sockaddr_in sa;
        if (members[i].id == node->id || node__parse_ipv4_address(members[i].address, &sa) != 0)
            continue;
        (void)uv_udp_try_send(&node->udp, &buf, 1, (const struct sockaddr *)&sa);
    }
}

static void heartbeat_received(struct cluster_node *node, const struct heartbeat *hb)
{
    struct peer *peer = node__peer_find(node, hb->id);
    if (peer == &node->peers[0]) {
        LOG_WARN("cluster: a heartbeat from %s claims our id %" PRIu32, hb->cluster_address,
                 hb->id);
        return;
    }
    if (peer == NULL) {
        if (node->peers_count == CLUSTER_BROKERS_MAX) {
            node->heartbeat_dropped_count++;
            return;
        }
        peer = &node->peers[node->peers_count++];
        *peer = (struct peer){.id = hb->id};
        LOG_INFO("cluster: hearing from %s (id %" PRIu32 ") at %s", hb->name, hb->id,
                 hb->cluster_address);
    }
    if (hb->sequence <= peer->sequence) {
        node->heartbeat_dropped_count++; /* replayed or reordered */
        return;
    }
    bool changed = strcmp(peer->name, hb->name) != 0 ||
                   strcmp(peer->amqp_address, hb->amqp_address) != 0 ||
                   strcmp(peer->cluster_address, hb->cluster_address) != 0;
    if (hb->stopping && !peer->stopping)
        LOG_INFO("cluster: %s (id %" PRIu32 ") is stopping", hb->name, hb->id);
    if (hb->alarms != peer->alarms)
        LOG_INFO("cluster: %s (id %" PRIu32 ") alarms: memory %s, disk %s", hb->name, hb->id,
                 hb->alarms & HEARTBEAT_FLAG_MEMORY_ALARM ? "on" : "off",
                 hb->alarms & HEARTBEAT_FLAG_DISK_ALARM ? "on" : "off");
    if (hb->incarnation != 0 && hb->incarnation != peer->incarnation && peer->incarnation != 0)
        LOG_INFO("cluster: %s (id %" PRIu32 ") restarted (incarnation %" PRIu32 " after %" PRIu32
                 ")", hb->name, hb->id, hb->incarnation, peer->incarnation);
    peer->incarnation = hb->incarnation;
    peer->sequence = hb->sequence;
    peer->stopping = hb->stopping;
    peer->alarms = hb->alarms;
    peer->last_heard_ms = uv_now(node->loop);
    peer->map_version = hb->map_version;
    fence_heard_note(&peer->lease, peer->last_heard_ms, hb->incarnation != 0, hb->map_version,
                     hb->catching_up, node->map.version);
    node__lease_update(node);
    if (changed) {
        memcpy(peer->name, hb->name, sizeof peer->name);
        memcpy(peer->amqp_address, hb->amqp_address, sizeof peer->amqp_address);
        memcpy(peer->cluster_address, hb->cluster_address, sizeof peer->cluster_address);
        peer->join_refused = false;
    }
}

static void on_udp_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    struct cluster_node *node = handle->data;
    (void)suggested;
    *buf = uv_buf_init((char *)node->recv_buffer, sizeof node->recv_buffer);
}

static void on_udp_recv(uv_udp_t *udp, ssize_t nread, const uv_buf_t *buf,
                        const struct sockaddr *addr, unsigned flags)
{
    struct cluster_node *node = udp->data;
    if (nread <= 0 || addr == NULL || node->stopping)
        return; /* nothing, or a socket error: heartbeats are best effort */
    struct heartbeat hb;
    if ((flags & UV_UDP_PARTIAL) ||
        !heartbeat_decode(node->secret, node->secret_size, (const uint8_t *)buf->base,
                          (size_t)nread, &hb)) {
        if (node->heartbeat_dropped_count++ % 100 == 0)
            LOG_WARN("cluster: dropped a bad heartbeat datagram (wrong cluster secret?); "
                     "%llu so far", (unsigned long long)node->heartbeat_dropped_count);
        return;
    }
    heartbeat_received(node, &hb);
}

int node__open_udp(struct cluster_node *node, const char *address, char *err, size_t err_size)
{
    struct sockaddr_in sa;
    ASSERT(node__parse_ipv4_address(address, &sa) == 0); /* checked by config_check */
    int rc = uv_udp_bind(&node->udp, (const struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_udp_recv_start(&node->udp, on_udp_alloc, on_udp_recv);
    if (rc != 0)
        snprintf(err, err_size, "cannot open the cluster heartbeat port udp/%s: %s", address,
                 uv_strerror(rc));
    return rc;
}

void cluster_node_set_alarms(struct cluster_node *node, bool memory, bool disk)
{
    node->peers[0].alarms = (uint8_t)((memory ? HEARTBEAT_FLAG_MEMORY_ALARM : 0) |
                                      (disk ? HEARTBEAT_FLAG_DISK_ALARM : 0));
}

void cluster_node_peer_alarms(const struct cluster_node *node, bool *memory, bool *disk)
{
    uint64_t now = uv_now(node->loop);
    uint8_t alarms = 0;
    for (uint32_t i = 1; i < node->peers_count; i++) {
        const struct peer *peer = &node->peers[i];
        /* A broker we have not heard from lately is down or cut off: its
         * alarm no longer blocks anyone (RabbitMQ forgets a down node's). */
        if (peer->last_heard_ms != 0 && now - peer->last_heard_ms <= NODE_DOWN_AFTER_MS)
            alarms |= peer->alarms;
    }
    *memory = (alarms & HEARTBEAT_FLAG_MEMORY_ALARM) != 0;
    *disk = (alarms & HEARTBEAT_FLAG_DISK_ALARM) != 0;
}
