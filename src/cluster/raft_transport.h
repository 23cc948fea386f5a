/*
 * raft_transport.h: an authenticated struct raft_uv_transport for libraft,
 * and the join RPC that rides on the same cluster port.
 *
 * libraft's own TCP transport lets anyone who can reach the port speak Raft.
 * This one runs a mutual challenge-response on every new connection before
 * the stream is handed to libraft: both sides send a random nonce and prove
 * knowledge of the cluster secret with HMAC-SHA256 over the whole exchange,
 * checked in constant time. A peer with a wrong or missing secret, a
 * malformed greeting or a stall at any step is closed, logged and counted;
 * its stream never reaches libraft. After the handshake the bytes on the
 * stream are libraft's own RPC encoding (no further framing, no encryption:
 * see "Limits" below).
 *
 * Wire format (all integers big-endian):
 *
 *   HELLO      client -> server, 56 bytes + address
 *     0   4  magic "QYRA"
 *     4   1  version (1)
 *     5   1  kind: 1 = raft stream, 2 = join request
 *     6   2  address_size (1..RAFT_TRANSPORT_ADDRESS_SIZE_MAX)
 *     8   8  client id (the sender's raft id)
 *    16   8  expected server id (0 = any; join requests use 0)
 *    24  32  client nonce
 *    56   n  client's cluster address "host:port", not NUL-terminated
 *
 *   CHALLENGE  server -> client, 80 bytes
 *     0   4  magic "QYRA"
 *     4   1  version (1)
 *     5   3  zero
 *     8   8  server id
 *    16  32  server nonce
 *    48  32  server proof = HMAC-SHA256(secret, "quay-raft server" || T)
 *
 *   PROOF      client -> server, 32 bytes
 *     0  32  client proof = HMAC-SHA256(secret, "quay-raft client" || T)
 *
 *   ACCEPT     server -> client, 8 bytes
 *     0   4  magic "QYRA"
 *     4   1  status: 0 = accepted, 1 = denied (bad proof), 2 = refused (peer check)
 *     5   3  zero
 *
 *   where T = HELLO (all of it) || server id (8) || server nonce (32): the
 *   proofs bind both nonces, both ids, the kind and the client's address,
 *   and the two labels keep a server proof from being replayed as a client
 *   proof. Then, for kind 1, libraft's messages follow on the same stream;
 *   for kind 2 the server answers once and closes:
 *
 *   JOIN_REPLY server -> client, 16 bytes + address
 *     0   4  magic "QYRA"
 *     4   1  status (enum raft_transport_join_status)
 *     5   1  zero
 *     6   2  address_size (0..RAFT_TRANSPORT_ADDRESS_SIZE_MAX)
 *     8   8  leader id (0 = unknown)
 *    16   n  leader address (status REDIRECT), not NUL-terminated
 *
 * Timeouts: every step (connect, each read, each write) must finish within
 * handshake_timeout_ms; a join request waits at most join_timeout_ms for its
 * reply. Either side drops a connection that stalls.
 *
 * Memory: streams handed to libraft are uv_tcp_t allocated with
 * raft_malloc(), as libraft frees them with raft_free() after uv_close().
 *
 * Limits: this authenticates the connection, it does not protect the bytes
 * that follow. An attacker on the path can inject after the handshake; TLS
 * (or a per-message MAC) would be needed for that threat.
 *
 * Must never: hand libraft a stream whose peer did not prove the secret;
 * block; keep a reference to libraft's stream after handing it over.
 */
#ifndef QUAY_CLUSTER_RAFT_TRANSPORT_H
#define QUAY_CLUSTER_RAFT_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

#define RAFT_TRANSPORT_ADDRESS_SIZE_MAX 255
#define RAFT_TRANSPORT_SECRET_SIZE_MIN 16
#define RAFT_TRANSPORT_SECRET_SIZE_MAX 1024

enum raft_transport_join_status {
    RAFT_TRANSPORT_JOIN_OK = 0,       /* the joiner is a member (change committed) */
    RAFT_TRANSPORT_JOIN_REDIRECT = 1, /* not the leader; leader id/address given (id 0: unknown) */
    RAFT_TRANSPORT_JOIN_RETRY = 2,    /* transient failure (busy, leadership lost): try again */
    RAFT_TRANSPORT_JOIN_REFUSED = 3,  /* permanent: id or address conflicts with a member */
};

/* One join request received by a server. Owned by the transport until the
 * server calls raft_transport_join_reply(), which it must do exactly once,
 * even if the client has gone away meanwhile (the reply is then dropped). */
struct raft_transport_join;

/* The server side of the join RPC: a peer that proved the secret asks to be
 * added as (id, address). Called on the loop thread. */
typedef void (*raft_transport_join_fn)(void *ctx, struct raft_transport_join *join, uint64_t id,
                                       const char *address);

/* Optional check of an authenticated peer's claimed identity before its
 * stream goes to libraft: return false to refuse (for example the id is a
 * member under another address, which libraft cannot cope with). */
typedef bool (*raft_transport_peer_check_fn)(void *ctx, uint64_t id, const char *address);

struct raft_tls; /* raft_tls.h */

struct raft_transport_config {
    const uint8_t *secret; /* copied; RAFT_TRANSPORT_SECRET_SIZE_MIN..MAX bytes */
    size_t secret_size;
    unsigned handshake_timeout_ms; /* per step; 0 = 2000 */
    unsigned join_timeout_ms;      /* wait for a join reply; 0 = 30000 */
    raft_transport_join_fn join;   /* NULL: join requests get RETRY */
    raft_transport_peer_check_fn peer_check; /* NULL: accept any authenticated peer */
    void *ctx;                     /* for join and peer_check */
    /* --cluster-tls: every connection in a TLS tunnel (raft_tls.h), or
     * NULL for plain TCP. Copied (its pointers borrowed: they outlive the
     * transport). */
    const struct raft_tls *tls;
};

/* Counters of odd peer behaviour ("glitches") and of work done. */
struct raft_transport_stats {
    uint64_t accepted_count;          /* incoming streams handed to libraft */
    uint64_t connected_count;         /* outgoing streams handed to libraft */
    uint64_t auth_failure_count;      /* bad proof, either direction */
    uint64_t timeout_count;           /* a step did not finish in time */
    uint64_t malformed_count;         /* bad magic, version, kind or size */
    uint64_t refused_count;           /* peer_check said no, or wrong expected id */
    uint64_t join_received_count;     /* join requests that passed authentication */
};

/* Fill *t for raft_uv_init(). Does not listen yet: libraft calls t->init
 * (with this server's id and address) and t->listen itself. Returns 0 or
 * a RAFT_* error (RAFT_INVALID for a bad secret size). */
int raft_transport_init(struct raft_uv_transport *t, uv_loop_t *loop,
                        const struct raft_transport_config *cfg);

/* Release the memory of a transport that libraft has closed (its close
 * callback fired) or that was never handed to raft_uv_init(). Wipes the
 * secret. */
void raft_transport_release(struct raft_uv_transport *t);

void raft_transport_stats(const struct raft_uv_transport *t, struct raft_transport_stats *out);

/* Server side: answer a join request. leader_address may be NULL. */
void raft_transport_join_reply(struct raft_transport_join *join,
                               enum raft_transport_join_status status, uint64_t leader_id,
                               const char *leader_address);

/* Client side: the result of a join request. status is 0 when a JOIN_REPLY
 * arrived (then join_status/leader_* are meaningful), else a RAFT_* error:
 * RAFT_NOCONNECTION (connect, handshake, auth or timeout failure) or
 * RAFT_CANCELED (the transport closed). leader_address is only valid during
 * the call and may be NULL. */
typedef void (*raft_transport_join_done_fn)(void *ctx, int status,
                                            enum raft_transport_join_status join_status,
                                            uint64_t leader_id, const char *leader_address);

/* Ask the server at address ("host:port") to add this server (the id and
 * address given to t->init). Needs t->init to have run (raft_init did it).
 * done is called exactly once, never synchronously. */
int raft_transport_join_send(struct raft_uv_transport *t, const char *address,
                             raft_transport_join_done_fn done, void *ctx);

/* Parse "a.b.c.d:port" (IPv4 only, like libraft's TCP transport). */
int raft_transport_parse_address(const char *address, struct sockaddr_in *out);

#endif
