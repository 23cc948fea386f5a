/*
 * raft_transport.c: libraft's struct raft_uv_transport over libuv TCP, with a
 * mutual HMAC-SHA256 challenge-response before libraft sees a stream, and
 * the join RPC on the same port. The wire format is in raft_transport.h.
 *
 * Owns: the listening socket, every connection until its handshake ends
 * (struct handshake), the copy of the secret. Hands each authenticated
 * stream to libraft, which owns it from then on.
 *
 * Each handshake is a strictly sequential state machine: it writes one
 * message and, once the write completed, reads exactly the bytes of the
 * next one (the alloc callback never offers more), so no byte that belongs
 * to libraft is ever consumed here. One timer per handshake bounds every step.
 *
 * Must never: call a libraft callback synchronously from a libraft call
 * (libraft's send path asserts on that); free a handshake before both of its
 * handles are closed.
 */
#include "cluster/raft_transport.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "cluster/raft_tls.h"
#include "lib/assert.h"
#include "lib/list.h"
#include "lib/log.h"
#include "net/conn.h"

#define MAGIC "QYRA"
#define VERSION 1
#define NONCE_SIZE 32
#define MAC_SIZE 32
#define HELLO_SIZE 56
/* A silently cut connection breaks after this (see net_tcp_user_timeout);
 * the leader's heartbeats always leave data in flight. */
#define TRANSPORT_USER_TIMEOUT_MS 3000
#define CHALLENGE_SIZE 80
#define PROOF_SIZE MAC_SIZE
#define ACCEPT_SIZE 8
#define JOIN_REPLY_SIZE 16
#define MESSAGE_SIZE_MAX (HELLO_SIZE + RAFT_TRANSPORT_ADDRESS_SIZE_MAX)

#define KIND_RAFT 1
#define KIND_JOIN 2

#define ACCEPT_OK 0
#define ACCEPT_DENIED 1
#define ACCEPT_REFUSED 2

static_assert(CHALLENGE_SIZE == 8 + 8 + NONCE_SIZE + MAC_SIZE, "challenge layout");
static_assert(HELLO_SIZE == 8 + 8 + 8 + NONCE_SIZE, "hello layout");
static_assert(MESSAGE_SIZE_MAX >= JOIN_REPLY_SIZE + RAFT_TRANSPORT_ADDRESS_SIZE_MAX,
              "buffers hold a join reply");
static_assert(RAFT_TRANSPORT_ADDRESS_SIZE_MAX <= UINT16_MAX, "address size fits u16");

/* Where a handshake is. Client: the side that connected. */
enum step {
    STEP_CONNECT,           /* client: TCP connect in flight */
    STEP_SEND_HELLO,        /* client */
    STEP_READ_CHALLENGE,    /* client */
    STEP_SEND_PROOF,        /* client */
    STEP_READ_ACCEPT,       /* client */
    STEP_READ_JOIN_REPLY,   /* client, kind join: fixed part then address */
    STEP_READ_HELLO,        /* server: fixed part then address */
    STEP_SEND_CHALLENGE,    /* server */
    STEP_READ_PROOF,        /* server */
    STEP_SEND_ACCEPT,       /* server */
    STEP_AWAIT_JOIN,        /* server: the join handler has not replied yet */
    STEP_SEND_JOIN_REPLY,   /* server */
    STEP_CLOSING,           /* handles closing; finalize when both are closed */
};

struct transport;

/* One connection between accept/connect and handing it over (or closing).
 * Owned by its transport (linked in t->handshakes) until finalized. */
struct handshake {
    struct transport *t; /* NULL once orphaned (transport gone, join reply pending) */
    struct list_node link;
    bool client;
    uint8_t kind;
    enum step step;
    /* raft_malloc'd: a uv_tcp_t, or with TLS the plaintext end of a tunnel
     * (a uv_pipe_t, raft_tls.h); NULL once handed over or closed. */
    uv_stream_t *stream;
    uv_timer_t timer;
    uv_connect_t connect;
    uv_write_t write;
    int handles_open;
    uint8_t out[MESSAGE_SIZE_MAX];
    uint8_t in[MESSAGE_SIZE_MAX];
    size_t in_have;
    size_t in_need;
    uint8_t transcript[HELLO_SIZE + RAFT_TRANSPORT_ADDRESS_SIZE_MAX + 8 + NONCE_SIZE];
    size_t transcript_size;
    uint8_t nonce[NONCE_SIZE];
    uint64_t peer_id;
    uint64_t expected_peer_id;
    char peer_address[RAFT_TRANSPORT_ADDRESS_SIZE_MAX + 1];
    int result; /* status handed to the client callback at finalize */
    /* client, kind raft */
    struct raft_uv_connect *req;
    raft_uv_connect_cb connect_cb;
    /* client, kind join */
    raft_transport_join_done_fn join_done;
    void *join_ctx;
    uint8_t join_status;
    uint64_t join_leader_id;
    char join_leader_address[RAFT_TRANSPORT_ADDRESS_SIZE_MAX + 1];
    /* server, kind join: set while the join handler owes a reply */
    bool join_pending;
};

struct raft_transport_join {
    struct handshake hs; /* a join handshake is allocated as this */
};

/* Owned by the struct raft_uv_transport (impl), released by
 * raft_transport_release(). */
struct transport {
    struct raft_uv_transport *raft; /* borrowed back pointer */
    uv_loop_t *loop;                /* borrowed */
    uint64_t id;
    char address[RAFT_TRANSPORT_ADDRESS_SIZE_MAX + 1];
    uint8_t secret[RAFT_TRANSPORT_SECRET_SIZE_MAX];
    size_t secret_size;
    unsigned handshake_timeout_ms;
    unsigned join_timeout_ms;
    raft_transport_join_fn join;
    raft_transport_peer_check_fn peer_check;
    void *ctx;
    uv_tcp_t listener;
    bool listener_open;
    bool listening;
    bool closing;
    raft_uv_accept_cb accept_cb;
    raft_uv_transport_close_cb close_cb;
    bool tls_on;
    struct raft_tls tls;            /* when tls_on */
    struct list_node handshakes;
    size_t handshake_count;
    struct raft_transport_stats stats;
};

static void handshake_fail(struct handshake *hs, int result);
static void handshake_read(struct handshake *hs, size_t size, enum step step);
static void handshake_write(struct handshake *hs, size_t size, enum step step);
static void transport_maybe_closed(struct transport *t);

/* ---- encoding helpers ---- */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* HMAC-SHA256(secret, label || transcript) into mac[MAC_SIZE]. */
static void compute_proof(const struct transport *t, const char *label,
                          const uint8_t *transcript, size_t transcript_size, uint8_t *mac)
{
    ASSERT(t->secret_size >= RAFT_TRANSPORT_SECRET_SIZE_MIN);
    ASSERT(transcript_size > HELLO_SIZE);
    uint8_t data[16 + sizeof ((struct handshake *)0)->transcript];
    size_t label_size = strlen(label);
    ASSERT(label_size == 16);
    memcpy(data, label, label_size);
    memcpy(data + label_size, transcript, transcript_size);
    unsigned mac_size = 0;
    uint8_t *r = HMAC(EVP_sha256(), t->secret, (int)t->secret_size, data,
                      label_size + transcript_size, mac, &mac_size);
    ASSERT(r != NULL);
    ASSERT(mac_size == MAC_SIZE);
    OPENSSL_cleanse(data, sizeof data);
}

int raft_transport_parse_address(const char *address, struct sockaddr_in *out)
{
    ASSERT(address != NULL);
    ASSERT(out != NULL);
    const char *colon = strrchr(address, ':');
    if (colon == NULL || colon == address || (size_t)(colon - address) >= 64)
        return RAFT_INVALID;
    char host[64];
    memcpy(host, address, (size_t)(colon - address));
    host[colon - address] = '\0';
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || port <= 0 || port > 65535)
        return RAFT_INVALID;
    if (uv_ip4_addr(host, (int)port, out) != 0)
        return RAFT_INVALID;
    return 0;
}

/* ---- handshake lifetime ---- */

static struct handshake *handshake_new(struct transport *t, bool client, uint8_t kind)
{
    ASSERT(!t->closing);
    ASSERT(kind == KIND_RAFT || kind == KIND_JOIN || kind == 0);
    /* A server does not know the kind before HELLO, so every incoming
     * handshake is allocated as a (slightly larger) join. */
    struct raft_transport_join *j = calloc(1, sizeof *j);
    if (j == NULL)
        return NULL;
    struct handshake *hs = &j->hs;
    hs->t = t;
    hs->client = client;
    hs->kind = kind;
    hs->result = RAFT_NOCONNECTION;
    uv_timer_init(t->loop, &hs->timer);
    hs->timer.data = hs;
    hs->handles_open = 1;
    list_push_back(&t->handshakes, &hs->link);
    t->handshake_count++;
    return hs;
}

/* The handshake's stream (it closes it, unless it hands it over). */
static void handshake_set_stream(struct handshake *hs, uv_stream_t *stream)
{
    ASSERT(hs->stream == NULL);
    hs->stream = stream;
    stream->data = hs;
    hs->handles_open++;
}

/* A TCP stream for the handshake, or NULL (out of memory). */
static uv_tcp_t *handshake_tcp(struct handshake *hs)
{
    uv_tcp_t *tcp = raft_malloc(sizeof *tcp);
    if (tcp == NULL)
        return NULL;
    uv_tcp_init(hs->t->loop, tcp);
    handshake_set_stream(hs, (uv_stream_t *)tcp);
    return tcp;
}

/* Both handles closed: report to the client's owner and free, unless a
 * join handler still holds this handshake (then it is orphaned and freed by
 * raft_transport_join_reply). */
static void handshake_finalize(struct handshake *hs)
{
    ASSERT(hs->handles_open == 0);
    ASSERT(hs->stream == NULL);
    struct transport *t = hs->t;
    if (t != NULL) {
        list_remove(&hs->link);
        ASSERT(t->handshake_count > 0);
        t->handshake_count--;
    }
    int result = hs->result;
    if (t == NULL || t->closing)
        result = RAFT_CANCELED; /* libraft asserts on any other status once closing */
    ASSERT(result != 0 || hs->connect_cb == NULL); /* a pending connect failed */
    if (hs->connect_cb != NULL) {
        /* libraft: status != 0 means stream NULL. */
        hs->connect_cb(hs->req, NULL, result);
    } else if (hs->join_done != NULL) {
        bool has_leader = result == 0 && hs->join_leader_address[0] != '\0';
        hs->join_done(hs->join_ctx, result, (enum raft_transport_join_status)hs->join_status,
                      hs->join_leader_id, has_leader ? hs->join_leader_address : NULL);
    }
    if (hs->join_pending) {
        hs->t = NULL; /* orphan: raft_transport_join_reply frees it */
    } else {
        free(CONTAINER_OF(hs, struct raft_transport_join, hs));
    }
    if (t != NULL)
        transport_maybe_closed(t);
}

static void handshake_handle_closed(uv_handle_t *handle)
{
    struct handshake *hs = handle->data;
    ASSERT(hs->handles_open > 0);
    if (hs->stream != NULL && handle == (uv_handle_t *)hs->stream) {
        raft_free(hs->stream);
        hs->stream = NULL;
    }
    if (--hs->handles_open == 0)
        handshake_finalize(hs);
}

/* Close the handles (the stream too unless it was handed over). */
static void handshake_close(struct handshake *hs)
{
    ASSERT(hs->step != STEP_CLOSING);
    hs->step = STEP_CLOSING;
    uv_timer_stop(&hs->timer);
    uv_close((uv_handle_t *)&hs->timer, handshake_handle_closed);
    if (hs->stream != NULL)
        uv_close((uv_handle_t *)hs->stream, handshake_handle_closed);
}

static const char *handshake_peer(const struct handshake *hs)
{
    return hs->peer_address[0] != '\0' ? hs->peer_address : "?";
}

static void handshake_fail(struct handshake *hs, int result)
{
    ASSERT(result != 0);
    if (hs->step == STEP_CLOSING)
        return;
    hs->result = result;
    handshake_close(hs);
}

static void handshake_timeout(uv_timer_t *timer)
{
    struct handshake *hs = timer->data;
    ASSERT(hs->step != STEP_CLOSING);
    if (hs->step == STEP_AWAIT_JOIN) {
        /* The handler is slow; the client gave up by now. Close the
         * connection, the reply will be dropped. */
        LOG_WARN("cluster transport: join from %s not answered in time", handshake_peer(hs));
    } else {
        LOG_WARN("cluster transport: %s %s timed out at step %d",
                 hs->client ? "connection to" : "connection from", handshake_peer(hs),
                 (int)hs->step);
    }
    if (hs->t != NULL)
        hs->t->stats.timeout_count++;
    handshake_fail(hs, RAFT_NOCONNECTION);
}

static void handshake_arm(struct handshake *hs, unsigned timeout_ms)
{
    ASSERT(timeout_ms > 0);
    uv_timer_start(&hs->timer, handshake_timeout, timeout_ms, 0);
}

/* ---- reading and writing exactly one message ---- */

static void handshake_on_message(struct handshake *hs);

static void handshake_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct handshake *hs = handle->data;
    ASSERT(hs->in_have < hs->in_need);
    ASSERT(hs->in_need <= sizeof hs->in);
    buf->base = (char *)hs->in + hs->in_have;
    buf->len = hs->in_need - hs->in_have;
}

static void handshake_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    struct handshake *hs = stream->data;
    if (hs->step == STEP_CLOSING)
        return;
    if (nread < 0) {
        if (hs->step == STEP_READ_PROOF && hs->t != NULL) {
            /* A client closes here when our proof did not verify on its
             * side: count it, the operator wants to see wrong secrets. */
            LOG_WARN("cluster transport: %s (id %llu) left after our challenge "
                     "(wrong cluster secret on its side?)",
                     hs->peer_address, (unsigned long long)hs->peer_id);
            hs->t->stats.auth_failure_count++;
        } else if (nread != UV_EOF || hs->step != STEP_READ_HELLO || hs->in_have != 0) {
            LOG_INFO("cluster transport: %s closed during handshake: %s", handshake_peer(hs),
                     uv_strerror((int)nread));
        }
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    ASSERT((size_t)nread <= hs->in_need - hs->in_have);
    hs->in_have += (size_t)nread;
    if (hs->in_have < hs->in_need)
        return;
    uv_read_stop(stream);
    handshake_on_message(hs);
}

static void handshake_read(struct handshake *hs, size_t size, enum step step)
{
    ASSERT(size > 0);
    ASSERT(size <= sizeof hs->in);
    hs->step = step;
    hs->in_have = 0;
    hs->in_need = size;
    handshake_arm(hs, step == STEP_READ_JOIN_REPLY ? hs->t->join_timeout_ms
                                                   : hs->t->handshake_timeout_ms);
    int rv = uv_read_start(hs->stream, handshake_alloc, handshake_on_read);
    if (rv != 0)
        handshake_fail(hs, RAFT_NOCONNECTION);
}

/* Read more bytes of the same message (the variable-size tail). */
static void handshake_read_more(struct handshake *hs, size_t extra)
{
    ASSERT(hs->in_have == hs->in_need);
    ASSERT(hs->in_need + extra <= sizeof hs->in);
    hs->in_need += extra;
    int rv = uv_read_start(hs->stream, handshake_alloc, handshake_on_read);
    if (rv != 0)
        handshake_fail(hs, RAFT_NOCONNECTION);
}

static void handshake_on_written(uv_write_t *req, int status);

static void handshake_write(struct handshake *hs, size_t size, enum step step)
{
    ASSERT(size > 0);
    ASSERT(size <= sizeof hs->out);
    hs->step = step;
    handshake_arm(hs, hs->t->handshake_timeout_ms);
    uv_buf_t buf = uv_buf_init((char *)hs->out, (unsigned)size);
    hs->write.data = hs;
    int rv = uv_write(&hs->write, hs->stream, &buf, 1, handshake_on_written);
    if (rv != 0)
        handshake_fail(hs, RAFT_NOCONNECTION);
}

/* ---- client side ---- */

static void client_send_hello(struct handshake *hs)
{
    struct transport *t = hs->t;
    size_t address_size = strlen(t->address);
    ASSERT(address_size > 0 && address_size <= RAFT_TRANSPORT_ADDRESS_SIZE_MAX);
    RAND_bytes(hs->nonce, NONCE_SIZE);
    uint8_t *p = hs->out;
    memcpy(p, MAGIC, 4);
    p[4] = VERSION;
    p[5] = hs->kind;
    put_u16(p + 6, (uint16_t)address_size);
    put_u64(p + 8, t->id);
    put_u64(p + 16, hs->expected_peer_id);
    memcpy(p + 24, hs->nonce, NONCE_SIZE);
    memcpy(p + HELLO_SIZE, t->address, address_size);
    hs->transcript_size = HELLO_SIZE + address_size;
    memcpy(hs->transcript, hs->out, hs->transcript_size);
    handshake_write(hs, hs->transcript_size, STEP_SEND_HELLO);
}

static void client_on_connected(uv_connect_t *req, int status)
{
    struct handshake *hs = req->data;
    if (hs->step == STEP_CLOSING)
        return; /* canceled by close */
    ASSERT(hs->step == STEP_CONNECT);
    if (status != 0) {
        LOG_DEBUG("cluster transport: connect to %s: %s", handshake_peer(hs), uv_strerror(status));
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    uv_tcp_nodelay((uv_tcp_t *)hs->stream, 1);
    net_tcp_user_timeout((uv_tcp_t *)hs->stream, TRANSPORT_USER_TIMEOUT_MS);
    client_send_hello(hs);
}

static void client_on_challenge(struct handshake *hs)
{
    struct transport *t = hs->t;
    const uint8_t *p = hs->in;
    if (memcmp(p, MAGIC, 4) != 0 || p[4] != VERSION) {
        LOG_WARN("cluster transport: %s is not a quay cluster port", handshake_peer(hs));
        t->stats.malformed_count++;
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    hs->peer_id = get_u64(p + 8);
    memcpy(hs->transcript + hs->transcript_size, p + 8, 8 + NONCE_SIZE);
    hs->transcript_size += 8 + NONCE_SIZE;
    uint8_t expect[MAC_SIZE];
    compute_proof(t, "quay-raft server", hs->transcript, hs->transcript_size, expect);
    if (CRYPTO_memcmp(expect, p + 48, MAC_SIZE) != 0) {
        LOG_WARN("cluster transport: %s failed authentication (wrong cluster secret?)",
                 handshake_peer(hs));
        t->stats.auth_failure_count++;
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    if (hs->expected_peer_id != 0 && hs->peer_id != hs->expected_peer_id) {
        /* Checked after the proof, so the claim is authenticated. */
        LOG_WARN("cluster transport: %s is server %llu, expected %llu", handshake_peer(hs),
                 (unsigned long long)hs->peer_id, (unsigned long long)hs->expected_peer_id);
        t->stats.refused_count++;
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    compute_proof(t, "quay-raft client", hs->transcript, hs->transcript_size, hs->out);
    handshake_write(hs, PROOF_SIZE, STEP_SEND_PROOF);
}

static void client_on_accept(struct handshake *hs)
{
    struct transport *t = hs->t;
    const uint8_t *p = hs->in;
    if (memcmp(p, MAGIC, 4) != 0 || p[4] != ACCEPT_OK) {
        LOG_WARN("cluster transport: %s %s us", handshake_peer(hs),
                 p[4] == ACCEPT_REFUSED ? "refused" : "did not authenticate");
        if (p[4] == ACCEPT_DENIED)
            t->stats.auth_failure_count++;
        else
            t->stats.refused_count++;
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    if (hs->kind == KIND_JOIN) {
        handshake_read(hs, JOIN_REPLY_SIZE, STEP_READ_JOIN_REPLY);
        return;
    }
    /* Hand the stream over: libraft owns it from here. */
    uv_stream_t *stream = hs->stream;
    struct raft_uv_connect *req = hs->req;
    raft_uv_connect_cb cb = hs->connect_cb;
    hs->stream = NULL;
    hs->handles_open--;
    hs->connect_cb = NULL;
    stream->data = NULL;
    t->stats.connected_count++;
    /* Rare (a start, or after a fault) and the first thing to look for
     * when a follower does not catch up. */
    LOG_INFO("cluster transport: connected to %s (id %llu)", handshake_peer(hs),
             (unsigned long long)hs->peer_id);
    handshake_close(hs);
    cb(req, stream, 0);
}

static void client_on_join_reply(struct handshake *hs)
{
    const uint8_t *p = hs->in;
    if (hs->in_need == JOIN_REPLY_SIZE) {
        size_t address_size = get_u16(p + 6);
        if (memcmp(p, MAGIC, 4) != 0 || p[4] > RAFT_TRANSPORT_JOIN_REFUSED ||
            address_size > RAFT_TRANSPORT_ADDRESS_SIZE_MAX) {
            hs->t->stats.malformed_count++;
            handshake_fail(hs, RAFT_NOCONNECTION);
            return;
        }
        if (address_size > 0) {
            handshake_read_more(hs, address_size);
            return;
        }
    }
    size_t address_size = hs->in_need - JOIN_REPLY_SIZE;
    hs->join_status = p[4];
    hs->join_leader_id = get_u64(p + 8);
    memcpy(hs->join_leader_address, p + JOIN_REPLY_SIZE, address_size);
    hs->join_leader_address[address_size] = '\0';
    hs->result = 0;
    handshake_close(hs);
}

/* ---- server side ---- */

static void server_deny(struct handshake *hs, uint8_t status)
{
    ASSERT(status != ACCEPT_OK);
    memcpy(hs->out, MAGIC, 4);
    memset(hs->out + 4, 0, 4);
    hs->out[4] = status;
    hs->result = RAFT_UNAUTHORIZED; /* non-zero: close once this is written */
    handshake_write(hs, ACCEPT_SIZE, STEP_SEND_ACCEPT);
}

static void server_on_hello(struct handshake *hs)
{
    struct transport *t = hs->t;
    const uint8_t *p = hs->in;
    size_t address_size = get_u16(p + 6);
    if (hs->in_need == HELLO_SIZE) {
        if (memcmp(p, MAGIC, 4) != 0 || p[4] != VERSION ||
            (p[5] != KIND_RAFT && p[5] != KIND_JOIN) || address_size == 0 ||
            address_size > RAFT_TRANSPORT_ADDRESS_SIZE_MAX || get_u64(p + 8) == 0) {
            LOG_WARN("cluster transport: malformed greeting from %s", handshake_peer(hs));
            t->stats.malformed_count++;
            handshake_fail(hs, RAFT_NOCONNECTION);
            return;
        }
        handshake_read_more(hs, address_size);
        return;
    }
    ASSERT(hs->in_need == HELLO_SIZE + address_size);
    hs->kind = p[5];
    hs->peer_id = get_u64(p + 8);
    uint64_t expected = get_u64(p + 16);
    memcpy(hs->peer_address, p + HELLO_SIZE, address_size);
    hs->peer_address[address_size] = '\0';
    if (memchr(hs->peer_address, '\0', address_size) != NULL) {
        t->stats.malformed_count++;
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    memcpy(hs->transcript, p, hs->in_need);
    hs->transcript_size = hs->in_need;
    if (expected != 0 && expected != t->id) {
        /* Still authenticate first: an unauthenticated peer learns nothing. */
        LOG_WARN("cluster transport: %s expected server %llu, we are %llu", hs->peer_address,
                 (unsigned long long)expected, (unsigned long long)t->id);
        hs->expected_peer_id = expected; /* remembered to refuse after the proof */
    }
    RAND_bytes(hs->nonce, NONCE_SIZE);
    uint8_t *o = hs->out;
    memcpy(o, MAGIC, 4);
    o[4] = VERSION;
    memset(o + 5, 0, 3);
    put_u64(o + 8, t->id);
    memcpy(o + 16, hs->nonce, NONCE_SIZE);
    memcpy(hs->transcript + hs->transcript_size, o + 8, 8 + NONCE_SIZE);
    hs->transcript_size += 8 + NONCE_SIZE;
    compute_proof(t, "quay-raft server", hs->transcript, hs->transcript_size, o + 48);
    handshake_write(hs, CHALLENGE_SIZE, STEP_SEND_CHALLENGE);
}

static void server_on_proof(struct handshake *hs)
{
    struct transport *t = hs->t;
    uint8_t expect[MAC_SIZE];
    compute_proof(t, "quay-raft client", hs->transcript, hs->transcript_size, expect);
    if (CRYPTO_memcmp(expect, hs->in, MAC_SIZE) != 0) {
        LOG_WARN("cluster transport: %s (id %llu) failed authentication (wrong cluster secret?)",
                 hs->peer_address, (unsigned long long)hs->peer_id);
        t->stats.auth_failure_count++;
        server_deny(hs, ACCEPT_DENIED);
        return;
    }
    bool refused = hs->expected_peer_id != 0 && hs->expected_peer_id != t->id;
    if (!refused && hs->kind == KIND_RAFT && t->peer_check != NULL &&
        !t->peer_check(t->ctx, hs->peer_id, hs->peer_address)) {
        LOG_WARN("cluster transport: refused %s (id %llu): conflicts with a member",
                 hs->peer_address, (unsigned long long)hs->peer_id);
        refused = true;
    }
    if (refused) {
        t->stats.refused_count++;
        server_deny(hs, ACCEPT_REFUSED);
        return;
    }
    memcpy(hs->out, MAGIC, 4);
    memset(hs->out + 4, 0, 4);
    hs->result = 0;
    handshake_write(hs, ACCEPT_SIZE, STEP_SEND_ACCEPT);
}

static void server_after_accept(struct handshake *hs)
{
    struct transport *t = hs->t;
    ASSERT(hs->result == 0);
    if (hs->kind == KIND_RAFT) {
        uv_stream_t *stream = hs->stream;
        hs->stream = NULL;
        hs->handles_open--;
        stream->data = NULL;
        t->stats.accepted_count++;
        LOG_INFO("cluster transport: accepted %s (id %llu)", handshake_peer(hs),
                 (unsigned long long)hs->peer_id);
        handshake_close(hs);
        ASSERT(t->accept_cb != NULL);
        t->accept_cb(t->raft, hs->peer_id, hs->peer_address, stream);
        return;
    }
    ASSERT(hs->kind == KIND_JOIN);
    t->stats.join_received_count++;
    hs->step = STEP_AWAIT_JOIN;
    hs->join_pending = true;
    handshake_arm(hs, t->join_timeout_ms);
    struct raft_transport_join *join = CONTAINER_OF(hs, struct raft_transport_join, hs);
    if (t->join == NULL) {
        raft_transport_join_reply(join, RAFT_TRANSPORT_JOIN_RETRY, 0, NULL);
        return;
    }
    t->join(t->ctx, join, hs->peer_id, hs->peer_address);
}

void raft_transport_join_reply(struct raft_transport_join *join,
                               enum raft_transport_join_status status, uint64_t leader_id,
                               const char *leader_address)
{
    ASSERT(join != NULL);
    struct handshake *hs = &join->hs;
    ASSERT(hs->join_pending);
    hs->join_pending = false;
    if (hs->t == NULL) { /* orphaned: connection and transport gone */
        free(join);
        return;
    }
    if (hs->step != STEP_AWAIT_JOIN) {
        ASSERT(hs->step == STEP_CLOSING); /* timed out; finalize will free */
        return;
    }
    size_t address_size = leader_address != NULL ? strlen(leader_address) : 0;
    if (address_size > RAFT_TRANSPORT_ADDRESS_SIZE_MAX)
        address_size = 0;
    uint8_t *o = hs->out;
    memcpy(o, MAGIC, 4);
    o[4] = (uint8_t)status;
    o[5] = 0;
    put_u16(o + 6, (uint16_t)address_size);
    put_u64(o + 8, leader_id);
    if (address_size > 0)
        memcpy(o + JOIN_REPLY_SIZE, leader_address, address_size);
    handshake_write(hs, JOIN_REPLY_SIZE + address_size, STEP_SEND_JOIN_REPLY);
}

/* ---- dispatch ---- */

static void handshake_on_message(struct handshake *hs)
{
    switch (hs->step) {
    case STEP_READ_CHALLENGE: client_on_challenge(hs); break;
    case STEP_READ_ACCEPT: client_on_accept(hs); break;
    case STEP_READ_JOIN_REPLY: client_on_join_reply(hs); break;
    case STEP_READ_HELLO: server_on_hello(hs); break;
    case STEP_READ_PROOF: server_on_proof(hs); break;
    default: ASSERT(!"read in a write step");
    }
}

static void handshake_on_written(uv_write_t *req, int status)
{
    struct handshake *hs = req->data;
    if (hs->step == STEP_CLOSING)
        return;
    if (status != 0) {
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    switch (hs->step) {
    case STEP_SEND_HELLO: handshake_read(hs, CHALLENGE_SIZE, STEP_READ_CHALLENGE); break;
    case STEP_SEND_PROOF: handshake_read(hs, ACCEPT_SIZE, STEP_READ_ACCEPT); break;
    case STEP_SEND_CHALLENGE: handshake_read(hs, PROOF_SIZE, STEP_READ_PROOF); break;
    case STEP_SEND_ACCEPT:
        if (hs->result != 0)
            handshake_fail(hs, hs->result);
        else
            server_after_accept(hs);
        break;
    case STEP_SEND_JOIN_REPLY: handshake_close(hs); break;
    default: ASSERT(!"write completed in a read step");
    }
}

/* ---- struct raft_uv_transport implementation ---- */

static int transport_init(struct raft_uv_transport *rt, raft_id id, const char *address)
{
    struct transport *t = rt->impl;
    ASSERT(id != 0);
    ASSERT(address != NULL);
    size_t size = strlen(address);
    if (size == 0 || size > RAFT_TRANSPORT_ADDRESS_SIZE_MAX) {
        snprintf(rt->errmsg, sizeof rt->errmsg, "address too long");
        return RAFT_NAMETOOLONG;
    }
    struct sockaddr_in sa;
    if (raft_transport_parse_address(address, &sa) != 0) {
        snprintf(rt->errmsg, sizeof rt->errmsg, "address %.64s is not IPv4 a.b.c.d:port",
                 address);
        return RAFT_INVALID;
    }
    t->id = id;
    memcpy(t->address, address, size + 1);
    return 0;
}

static void transport_on_connection(uv_stream_t *server, int status)
{
    struct transport *t = server->data;
    ASSERT(server == (uv_stream_t *)&t->listener);
    if (status != 0 || t->closing) {
        LOG_WARN("cluster transport: accept: %s", uv_strerror(status));
        return;
    }
    struct handshake *hs = handshake_new(t, false, 0);
    if (hs == NULL) {
        LOG_ERROR("cluster transport: out of memory accepting a connection");
        return; /* the connection stays in the backlog; libuv retries */
    }
    if (t->tls_on) {
        /* The TLS handshake comes first, in the tunnel; ours follows on
         * the plaintext it hands us. */
        uv_stream_t *stream;
        if (raft_tls_accept(&t->tls, t->loop, server, &stream, hs->peer_address,
                            sizeof hs->peer_address) != 0) {
            handshake_fail(hs, RAFT_NOCONNECTION);
            return;
        }
        handshake_set_stream(hs, stream);
        handshake_read(hs, HELLO_SIZE, STEP_READ_HELLO);
        return;
    }
    uv_tcp_t *tcp = handshake_tcp(hs);
    if (tcp == NULL || uv_accept(server, (uv_stream_t *)tcp) != 0) {
        handshake_fail(hs, RAFT_NOCONNECTION);
        return;
    }
    uv_tcp_nodelay(tcp, 1);
    net_tcp_user_timeout(tcp, TRANSPORT_USER_TIMEOUT_MS);
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) == 0 &&
        ss.ss_family == AF_INET) {
        char ip[32];
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
        snprintf(hs->peer_address, sizeof hs->peer_address, "%s:%d", ip,
                 ntohs(((struct sockaddr_in *)&ss)->sin_port));
    }
    handshake_read(hs, HELLO_SIZE, STEP_READ_HELLO);
}

static int transport_listen(struct raft_uv_transport *rt, raft_uv_accept_cb cb)
{
    struct transport *t = rt->impl;
    ASSERT(cb != NULL);
    ASSERT(!t->listening);
    struct sockaddr_in sa;
    if (raft_transport_parse_address(t->address, &sa) != 0)
        return RAFT_INVALID;
    t->accept_cb = cb;
    int rv = uv_tcp_bind(&t->listener, (const struct sockaddr *)&sa, 0);
    if (rv == 0)
        rv = uv_listen((uv_stream_t *)&t->listener, 128, transport_on_connection);
    if (rv != 0) {
        snprintf(rt->errmsg, sizeof rt->errmsg, "listen on %.64s: %s", t->address, uv_strerror(rv));
        return RAFT_IOERR;
    }
    t->listening = true;
    return 0;
}

static struct handshake *transport_dial(struct transport *t, uint8_t kind, uint64_t expected_id,
                                        const char *address, int *error)
{
    ASSERT(kind == KIND_RAFT || kind == KIND_JOIN);
    struct sockaddr_in sa;
    *error = raft_transport_parse_address(address, &sa);
    if (*error != 0)
        return NULL;
    struct handshake *hs = handshake_new(t, true, kind);
    if (hs == NULL) {
        *error = RAFT_NOMEM;
        return NULL;
    }
    hs->expected_peer_id = expected_id;
    snprintf(hs->peer_address, sizeof hs->peer_address, "%s", address);
    hs->step = STEP_CONNECT;
    hs->connect.data = hs;
    handshake_arm(hs, t->handshake_timeout_ms);
    if (t->tls_on) {
        /* The tunnel connects and runs TLS; what we write meanwhile waits
         * in it. A failure shows as the end's EOF, which fails this. */
        uv_stream_t *stream;
        if (raft_tls_dial(&t->tls, t->loop, (const struct sockaddr *)&sa, &stream) != 0) {
            handshake_fail(hs, RAFT_NOCONNECTION);
            return hs;
        }
        handshake_set_stream(hs, stream);
        client_send_hello(hs);
        return hs;
    }
    uv_tcp_t *tcp = handshake_tcp(hs);
    int rv = tcp != NULL ? uv_tcp_connect(&hs->connect, tcp, (const struct sockaddr *)&sa,
                                          client_on_connected)
                         : UV_ENOMEM;
    if (rv != 0) {
        /* Report through the normal asynchronous path. */
        handshake_fail(hs, RAFT_NOCONNECTION);
    }
    return hs;
}

static int transport_connect(struct raft_uv_transport *rt, struct raft_uv_connect *req,
                             raft_id id, const char *address, raft_uv_connect_cb cb)
{
    struct transport *t = rt->impl;
    ASSERT(req != NULL);
    ASSERT(cb != NULL);
    if (t->closing)
        return RAFT_CANCELED;
    int error = 0;
    struct handshake *hs = transport_dial(t, KIND_RAFT, id, address, &error);
    if (hs == NULL)
        return error;
    hs->req = req;
    hs->connect_cb = cb;
    return 0;
}

int raft_transport_join_send(struct raft_uv_transport *rt, const char *address,
                             raft_transport_join_done_fn done, void *ctx)
{
    struct transport *t = rt->impl;
    ASSERT(done != NULL);
    ASSERT(t->id != 0); /* t->init ran */
    if (t->closing)
        return RAFT_CANCELED;
    int error = 0;
    struct handshake *hs = transport_dial(t, KIND_JOIN, 0, address, &error);
    if (hs == NULL)
        return error;
    hs->join_done = done;
    hs->join_ctx = ctx;
    return 0;
}

static void transport_on_listener_closed(uv_handle_t *handle)
{
    struct transport *t = handle->data;
    t->listener_open = false;
    transport_maybe_closed(t);
}

static void transport_maybe_closed(struct transport *t)
{
    if (!t->closing || t->listener_open || t->handshake_count > 0 || t->close_cb == NULL)
        return;
    raft_uv_transport_close_cb cb = t->close_cb;
    t->close_cb = NULL;
    cb(t->raft);
}

static void transport_close(struct raft_uv_transport *rt, raft_uv_transport_close_cb cb)
{
    struct transport *t = rt->impl;
    ASSERT(!t->closing);
    ASSERT(cb != NULL);
    t->closing = true;
    t->close_cb = cb;
    list_for_each_safe(pos, &t->handshakes) {
        struct handshake *hs = CONTAINER_OF(pos, struct handshake, link);
        if (hs->step != STEP_CLOSING) {
            hs->result = RAFT_CANCELED;
            handshake_close(hs);
        }
    }
    /* Closing the listener also makes the close callback asynchronous. */
    uv_close((uv_handle_t *)&t->listener, transport_on_listener_closed);
}

int raft_transport_init(struct raft_uv_transport *rt, uv_loop_t *loop,
                        const struct raft_transport_config *cfg)
{
    ASSERT(rt != NULL);
    ASSERT(loop != NULL);
    ASSERT(cfg != NULL);
    memset(rt, 0, sizeof *rt);
    if (cfg->secret == NULL || cfg->secret_size < RAFT_TRANSPORT_SECRET_SIZE_MIN ||
        cfg->secret_size > RAFT_TRANSPORT_SECRET_SIZE_MAX) {
        snprintf(rt->errmsg, sizeof rt->errmsg, "cluster secret must be %d..%d bytes",
                 RAFT_TRANSPORT_SECRET_SIZE_MIN, RAFT_TRANSPORT_SECRET_SIZE_MAX);
        return RAFT_INVALID;
    }
    struct transport *t = calloc(1, sizeof *t);
    if (t == NULL)
        return RAFT_NOMEM;
    t->raft = rt;
    t->loop = loop;
    memcpy(t->secret, cfg->secret, cfg->secret_size);
    t->secret_size = cfg->secret_size;
    t->handshake_timeout_ms = cfg->handshake_timeout_ms != 0 ? cfg->handshake_timeout_ms : 2000;
    t->join_timeout_ms = cfg->join_timeout_ms != 0 ? cfg->join_timeout_ms : 30000;
    t->join = cfg->join;
    t->peer_check = cfg->peer_check;
    if (cfg->tls != NULL) {
        t->tls_on = true;
        t->tls = *cfg->tls;
    }
    t->ctx = cfg->ctx;
    list_init(&t->handshakes);
    uv_tcp_init(loop, &t->listener);
    t->listener.data = t;
    t->listener_open = true;
    rt->impl = t;
    rt->init = transport_init;
    rt->listen = transport_listen;
    rt->connect = transport_connect;
    rt->close = transport_close;
    return 0;
}

static void transport_on_unused_closed(uv_handle_t *handle)
{
    struct transport *t = handle->data;
    ASSERT(t->handshake_count == 0);
    free(t);
}

void raft_transport_release(struct raft_uv_transport *rt)
{
    ASSERT(rt != NULL);
    struct transport *t = rt->impl;
    if (t == NULL)
        return;
    ASSERT(t->handshake_count == 0);
    ASSERT(t->closing || !t->listening);
    OPENSSL_cleanse(t->secret, sizeof t->secret);
    rt->impl = NULL;
    if (t->listener_open) {
        /* Never closed by libraft: close the listener handle first; the
         * memory goes when the loop runs its close callback. */
        ASSERT(!t->closing);
        t->closing = true;
        uv_close((uv_handle_t *)&t->listener, transport_on_unused_closed);
        return;
    }
    free(t);
}

void raft_transport_stats(const struct raft_uv_transport *rt, struct raft_transport_stats *out)
{
    ASSERT(rt != NULL);
    ASSERT(out != NULL);
    const struct transport *t = rt->impl;
    if (t == NULL) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = t->stats;
}
