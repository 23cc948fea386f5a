/*
 * heartbeat.h: the brokers' liveness datagram (UDP, DESIGN §3), its codec.
 *
 * A heartbeat says who sends it (id, name, AMQP and cluster addresses), a
 * sequence that only grows (a replayed or reordered datagram is dropped),
 * whether the broker is stopping and which of its alarms are on. It is
 * authenticated with HMAC-SHA256 under the cluster secret:
 *
 *   "QYHB" | version 1 | flags | name size | amqp size | cluster size |
 *   incarnation (u24 BE) | map version (its low 32 bits, BE) |
 *   id (u64 BE) | sequence (u64 BE) | name | amqp | cluster |
 *   HMAC-SHA256(secret, all that precedes)
 *
 * The incarnation and map version are there when flags has
 * HEARTBEAT_FLAG_PROCESS; a sender from before them sends zeros there and
 * no flag, and a decoder from before them ignores both (so the version
 * stays 1 and mixed clusters keep hearing each other).
 *
 * Pure (no I/O, no clock): node_heartbeat.c sends and receives, tests and
 * the fuzzer (tests/fuzz/fuzz_heartbeat.c) call it directly.
 */
#ifndef QUAY_CLUSTER_HEARTBEAT_H
#define QUAY_CLUSTER_HEARTBEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/map.h"

#define HEARTBEAT_FLAG_STOPPING 1u
#define HEARTBEAT_FLAG_MEMORY_ALARM 2u /* its memory alarm is on: every broker blocks publishers */
#define HEARTBEAT_FLAG_DISK_ALARM 4u
#define HEARTBEAT_FLAG_PROCESS 8u      /* incarnation and map version are set */
/* Its map has not caught up since it started (its sync not applied yet):
 * the version it says is not all its log holds, so it gives no lease
 * (fence_heard_note). Set, not cleared, so a sender from before it counts. */
#define HEARTBEAT_FLAG_CATCHING_UP 16u
#define HEARTBEAT_INCARNATION_MAX 0xFFFFFFu
#define HEARTBEAT_HEADER_SIZE 32
#define HEARTBEAT_MAC_SIZE 32
#define HEARTBEAT_SIZE_MAX (HEARTBEAT_HEADER_SIZE + 3 * CLUSTER_NAME_SIZE_MAX + HEARTBEAT_MAC_SIZE)

struct heartbeat {
    uint32_t id;       /* the sender's broker id, not 0 */
    uint64_t sequence;
    bool stopping;
    uint8_t alarms;    /* HEARTBEAT_FLAG_*_ALARM */
    /* The sender's process: random per start, 1..HEARTBEAT_INCARNATION_MAX
     * (0 from a sender that does not say: then map_version is 0 too). */
    uint32_t incarnation;
    uint32_t map_version; /* the low 32 bits of the map version it applied */
    bool catching_up;     /* HEARTBEAT_FLAG_CATCHING_UP */
    /* NUL-terminated, 1..CLUSTER_NAME_SIZE_MAX bytes, no NUL inside */
    char name[CLUSTER_NAME_SIZE_MAX + 1];
    char amqp_address[CLUSTER_NAME_SIZE_MAX + 1];
    char cluster_address[CLUSTER_NAME_SIZE_MAX + 1];
};

/* Writes hb into out (HEARTBEAT_SIZE_MAX bytes); returns the size. The
 * strings must be 1..CLUSTER_NAME_SIZE_MAX bytes (asserted). */
size_t heartbeat_encode(const struct heartbeat *hb, const uint8_t *secret, size_t secret_size,
                        uint8_t *out);
/* Whether data is a heartbeat signed with the secret, well formed (sizes
 * that add up, names without NUL, an id that is a broker's); fills *out if
 * so. Any bytes are safe to pass. */
bool heartbeat_decode(const uint8_t *secret, size_t secret_size, const uint8_t *data,
                      size_t size, struct heartbeat *out);

#endif
