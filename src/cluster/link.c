/*
 * link.c: see link.h. This file is the connection: address resolution,
 * connect, the client handshake, heartbeats, connection-level methods,
 * going down and reconnecting. Channels are link_channel.c.
 *
 * Each attempt gets a fresh struct link_conn (a libuv handle cannot be
 * reused before its close callback). The link detaches an attempt before
 * it ends it, so the transport's callbacks for a detached conn do
 * nothing but free it: whatever ended the attempt (lost socket, protocol
 * error, timeout, link_free) reports it exactly once.
 *
 * Re-entrancy: user callbacks may call link_free. The struct link stays
 * allocated until its timer's close callback, so after every callback the
 * code checks link->freed (or lc->link) and touches nothing else.
 */
#include "cluster/link_int.h"

#include <assert.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "amqp/reply_code_gen.h"
#include "amqp/table.h"
#include "broker/auth.h"
#include "broker/frame_out.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"
#include "lib/log.h"

#define RECONNECT_MIN_MS_DEFAULT 100
#define RECONNECT_MAX_MS_DEFAULT 2000
/* Short: a link cut off silently is dropped after two missed beats and
 * opened afresh once the path is back (a TCP connection that outlived a
 * long cut waits out its retransmission backoff: tens of seconds). */
#define HEARTBEAT_S_DEFAULT 2
#define LINK_USER_TIMEOUT_MS 3000 /* see net_tcp_user_timeout */
#define HANDSHAKE_TIMEOUT_MS_DEFAULT 5000
#define LINK_PASSWORD_SIZE_MAX 1024
/* A goodbye (connection.close) is written only when the peer has been
 * reading: behind more than this, the socket is closed at once. */
#define GOODBYE_OUT_MAX CONN_OUT_LOW_WATER

static long on_input(struct conn *conn, const uint8_t *data, size_t size);
static void on_close(struct conn *conn);
static void on_free(struct conn *conn);
static void on_drain(struct conn *conn);
static void on_timer(uv_timer_t *timer);

static const struct conn_ops link_conn_ops = {
    .on_input = on_input,
    .on_close = on_close,
    .on_free = on_free,
    .on_drain = on_drain,
};

static struct link_conn *from_conn(struct conn *conn)
{
    return CONTAINER_OF(conn, struct link_conn, conn);
}

/* ---- configuration -------------------------------------------------- */

static char *str_dup(const char *s, size_t n)
{
    char *copy = xmalloc(n + 1);
    memcpy(copy, s, n);
    copy[n] = '\0';
    return copy;
}

/* "host:port" or "[v6]:port" into host (brackets dropped) and port. */
static int split_address(struct link *link, const char *address)
{
    const char *host = address;
    const char *host_end;
    const char *colon;
    if (address[0] == '[') {
        host = address + 1;
        host_end = strchr(host, ']');
        if (!host_end || host_end[1] != ':')
            return UV_EINVAL;
        colon = host_end + 1;
    } else {
        colon = strrchr(address, ':');
        /* A bare IPv6 literal has more colons: it needs brackets. */
        if (!colon || memchr(address, ':', (size_t)(colon - address)))
            return UV_EINVAL;
        host_end = colon;
    }
    const char *port = colon + 1;
    size_t port_size = strlen(port);
    char *end;
    long number = strtol(port, &end, 10);
    if (host_end == host || port_size == 0 || port_size >= sizeof link->port || *end != '\0' ||
        number <= 0 || number > 65535)
        return UV_EINVAL;
    link->host = str_dup(host, (size_t)(host_end - host));
    memcpy(link->port, port, port_size + 1);
    return 0;
}

int link_new(struct link **out, struct net *net, const struct link_config *config,
             const struct link_ops *ops)
{
    ASSERT(out != NULL);
    ASSERT(ops != NULL);
    size_t name_size = config->self_name ? strlen(config->self_name) : 0;
    bool plain = config->user != NULL;
    if ((!plain && config->secret.len == 0) || name_size == 0 ||
        name_size > AUTH_CLUSTER_NAME_SIZE_MAX || config->vhost.len > 255 ||
        (plain && (strlen(config->user) > 255 || config->password.len > LINK_PASSWORD_SIZE_MAX)))
        return UV_EINVAL;
    struct link *link = xcalloc(1, sizeof *link);
    if (split_address(link, config->address) != 0) {
        free(link);
        return UV_EINVAL;
    }
    link->net = net;
    link->address = str_dup(config->address, strlen(config->address));
    link->self_name = str_dup(config->self_name, name_size);
    link->secret = bytes_dup(config->secret);
    if (plain) {
        link->user = str_dup(config->user, strlen(config->user));
        link->password = bytes_dup(config->password);
    }
    link->vhost = bytes_dup(config->vhost);
    link->reconnect_min_ms = config->reconnect_min_ms ? config->reconnect_min_ms
                                                      : RECONNECT_MIN_MS_DEFAULT;
    link->reconnect_max_ms = config->reconnect_max_ms ? config->reconnect_max_ms
                                                      : RECONNECT_MAX_MS_DEFAULT;
    if (link->reconnect_max_ms < link->reconnect_min_ms)
        link->reconnect_max_ms = link->reconnect_min_ms;
    link->heartbeat_s = config->heartbeat_s ? config->heartbeat_s : HEARTBEAT_S_DEFAULT;
    link->tls = config->tls;
    link->handshake_timeout_ms = config->handshake_timeout_ms ? config->handshake_timeout_ms
                                                              : HANDSHAKE_TIMEOUT_MS_DEFAULT;
    link->ops = *ops;
    link->state = LINK_STATE_IDLE;
    uv_timer_init(net->loop, &link->timer);
    link->timer.data = link;
    /* Waiting to reconnect must not keep a stopping broker's loop alive. */
    uv_unref((uv_handle_t *)&link->timer);
    /* The first attempt starts from the loop: no callback inside link_new. */
    uv_timer_start(&link->timer, on_timer, 0, 0);
    *out = link;
    return 0;
}

uint16_t link_last_close(const struct link *link, const char **text)
{
    *text = link->last_close_text;
    return link->last_close_code;
}

bool link_is_up(const struct link *link)
{
    return link->state == LINK_STATE_UP;
}

void link_get_stats(const struct link *link, struct link_stats *out)
{
    *out = link->stats;
}

/* ---- output --------------------------------------------------------- */

void link__send_method(struct link *link, uint16_t channel, const struct method *m)
{
    if (!link->lc)
        return;
    size_t n = frame_out_method(&link->lc->conn, channel, m);
    if (n > 0) {
        link->stats.frames_out++;
        link->stats.bytes_out += n;
    }
}

static void send_heartbeat(struct link *link)
{
    struct conn *conn = &link->lc->conn;
    uint8_t *out = conn_out_reserve(conn, FRAME_OVERHEAD);
    conn_out_commit(conn, frame_write_heartbeat(out, FRAME_OVERHEAD));
    link->stats.frames_out++;
    link->stats.bytes_out += FRAME_OVERHEAD;
}

/* ---- going down ----------------------------------------------------- */

static void abandon_resolve(struct link *link)
{
    if (!link->resolve)
        return;
    link->resolve->link = NULL;
    /* Its callback still runs (cancelled or not) and frees it. */
    uv_cancel((uv_req_t *)&link->resolve->req);
    link->resolve = NULL;
}

/* Detaches and ends the current attempt's transport. goodbye (optional)
 * is written first when the handshake got far enough for the peer to
 * read frames and the peer has been reading. */
static void end_connection(struct link *link, const struct method *goodbye)
{
    abandon_resolve(link);
    struct link_conn *lc = link->lc;
    if (!lc)
        return;
    link->lc = NULL;
    lc->link = NULL;
    struct conn *conn = &lc->conn;
    if (goodbye && link->state >= LINK_STATE_START && !conn->closing &&
        conn->out_bytes <= GOODBYE_OUT_MAX) {
        frame_out_method(conn, 0, goodbye);
        conn_close_after_flush(conn);
        return;
    }
    conn_close(conn);
}

/* Frees every channel; with tell, open ones hear closed(0) first. */
static void close_channels(struct link *link, bool tell)
{
    for (uint32_t id = 0; id < link->channels_cap; id++) {
        struct link_channel *ch = link->channels[id];
        if (!ch)
            continue;
        link->channels[id] = NULL;
        bool open = ch->state == LINK_CHANNEL_STATE_OPENING || ch->state == LINK_CHANNEL_STATE_OPEN;
        ch->state = LINK_CHANNEL_STATE_GONE;
        if (tell && open && ch->ops.closed)
            ch->ops.closed(ch->ops.ctx, 0, BYTES_LIT(""));
        link__channel_free(ch);
        if (tell && link->freed)
            return; /* link_free (from closed) freed the rest */
    }
    free(link->channels);
    link->channels = NULL;
    link->channels_cap = 0;
}

/* Capped exponential backoff with jitter: each delay is drawn from
 * [d/2, d], so brokers that lost each other at once do not retry in
 * lockstep. */
static uint64_t backoff_ms(const struct link *link)
{
    uint64_t delay = link->reconnect_min_ms;
    for (uint32_t i = 1; i < link->failures && delay < link->reconnect_max_ms; i++)
        delay *= 2;
    if (delay > link->reconnect_max_ms)
        delay = link->reconnect_max_ms;
    uint32_t random = 0;
    RAND_bytes((unsigned char *)&random, sizeof random);
    return delay / 2 + random % (delay / 2 + 1);
}

/* The attempt or connection is over (already detached): channels hear
 * closed(0), the retry is scheduled, then down() if not said yet. */
static void went_down(struct link *link)
{
    ASSERT(link->lc == NULL);
    bool was_up = link->state == LINK_STATE_UP;
    link->state = LINK_STATE_IDLE;
    if (was_up)
        link->stats.disconnects++;
    else
        link->stats.attempts_failed++;
    link->failures++;
    close_channels(link, true);
    if (link->freed)
        return;
    uv_timer_start(&link->timer, on_timer, backoff_ms(link), 0);
    if (link->down_reported)
        return;
    link->down_reported = true;
    if (link->ops.down)
        link->ops.down(link->ops.ctx, link);
}

/* Ends the attempt without a goodbye (lost socket, timeout, refusal). */
static void drop(struct link *link)
{
    end_connection(link, NULL);
    went_down(link);
}

/* Later failures of a link that is already down are only debug noise. */
#define LINK_LOG(link, ...)                                   \
    do {                                                      \
        if ((link)->down_reported)                            \
            LOG_DEBUG(__VA_ARGS__);                           \
        else                                                  \
            LOG_WARN(__VA_ARGS__);                            \
    } while (0)

/* A step of an attempt failed with a libuv error (0: no address). */
static void attempt_failed(struct link *link, const char *step, int status)
{
    LINK_LOG(link, "link=%s %s: %s", link->address, step,
             status ? uv_strerror(status) : "no address");
    drop(link);
}

static const char *state_name(enum link_state state)
{
    static const char *const names[] = {"idle",   "resolving", "connecting", "start",
                                        "secure", "tune",      "open",       "up"};
    static_assert(ARRAY_SIZE(names) == LINK_STATE_UP + 1, "a name per state");
    return (size_t)state < ARRAY_SIZE(names) ? names[state] : "?";
}

void link__fail(struct link *link, uint16_t reply_code, const char *fmt, ...)
{
    char detail[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    const char *name = reply_code_text(reply_code);
    char text[256];
    snprintf(text, sizeof text, "%s - %s", name ? name : "ERROR", detail);
    LINK_LOG(link, "link=%s closing: %u %s", link->address, reply_code, text);
    struct method close = {.id = METHOD_CONNECTION_CLOSE};
    close.connection_close.reply_code = reply_code;
    close.connection_close.reply_text = bytes_of_cstr(text);
    end_connection(link, &close);
    went_down(link);
}

bool link__decode(struct link *link, const struct frame *frame, struct method *out)
{
    int rc = method_decode(out, frame->payload, frame->size);
    if (rc == OK)
        return true;
    if (rc == E_UNKNOWN_METHOD)
        link__fail(link, REPLY_NOT_IMPLEMENTED, "unknown method on channel %u", frame->channel);
    else
        link__fail(link, REPLY_FRAME_ERROR, "cannot decode a method on channel %u",
                   frame->channel);
    return false;
}

static void on_timer_closed(uv_handle_t *handle)
{
    free(handle->data);
}

void link_free(struct link *link)
{
    ASSERT(!link->freed);
    link->freed = true;
    close_channels(link, false);
    struct method close = {.id = METHOD_CONNECTION_CLOSE};
    close.connection_close.reply_code = REPLY_SUCCESS;
    close.connection_close.reply_text = BYTES_LIT("link closed");
    end_connection(link, &close);
    /* The struct outlives this call until the timer's close callback, so
     * a caller up the stack (on_input, went_down) may still look at
     * link->freed. */
    uv_close((uv_handle_t *)&link->timer, on_timer_closed);
    free(link->address);
    free(link->host);
    free(link->self_name);
    bytes_free(&link->secret);
    if (link->password.len > 0)
        OPENSSL_cleanse((void *)link->password.ptr, link->password.len);
    bytes_free(&link->password);
    bytes_free(&link->vhost);
    free(link->user);
    link->address = link->host = link->self_name = NULL;
}

/* ---- connecting ----------------------------------------------------- */

static void on_connected(struct conn *conn, int status)
{
    struct link_conn *lc = from_conn(conn);
    struct link *link = lc->link;
    ASSERT(link != NULL); /* a detached conn was closed: no connected() */
    ASSERT(link->state == LINK_STATE_CONNECTING);
    if (status < 0) {
        attempt_failed(link, "connect", status); /* the transport closes the conn next */
        return;
    }
    net_tcp_user_timeout(&conn->tcp, LINK_USER_TIMEOUT_MS);
    LOG_DEBUG("link=%s conn=%llu connected", link->address, (unsigned long long)conn->id);
    link->reader.frame_max = FRAME_MIN_SIZE;
    conn_out_bytes(conn, PROTOCOL_HEADER, PROTOCOL_HEADER_SIZE);
    link->state = LINK_STATE_START;
}

static void connect_to(struct link *link, const struct sockaddr *addr)
{
    struct link_conn *lc = xcalloc(1, sizeof *lc);
    lc->link = link;
    int rc = conn_connect(&lc->conn, link->net, &link_conn_ops, addr, on_connected);
    lc->conn.peer_reads_always = true; /* the other end is a broker: see conn.h */
    if (rc != 0) {
        free(lc);
        attempt_failed(link, "socket", rc);
        return;
    }
    /* TLS: the protocol header waits in the output for the handshake,
     * which the first flush starts (conn_tls.c). */
    if (link->tls != NULL) {
        int tls_rc = conn_tls_connect(&lc->conn, link->tls);
        ASSERT(tls_rc == 0); /* fails only without memory, as every allocation here */
    }
    link->lc = lc;
    link->state = LINK_STATE_CONNECTING;
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct link_resolve *resolve = CONTAINER_OF(req, struct link_resolve, req);
    struct link *link = resolve->link;
    free(resolve);
    if (!link) {
        uv_freeaddrinfo(res);
        return;
    }
    ASSERT(link->state == LINK_STATE_RESOLVING);
    link->resolve = NULL;
    uint32_t count = 0;
    for (struct addrinfo *ai = res; status == 0 && ai; ai = ai->ai_next)
        count++;
    if (count == 0) {
        uv_freeaddrinfo(res);
        attempt_failed(link, "resolve", status);
        return;
    }
    /* A name with several addresses (localhost: ::1 and 127.0.0.1):
     * successive attempts take them in turn. */
    struct addrinfo *ai = res;
    for (uint32_t i = link->address_turn++ % count; i > 0; i--)
        ai = ai->ai_next;
    struct sockaddr_storage ss;
    ASSERT(ai->ai_addrlen <= sizeof ss);
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    uv_freeaddrinfo(res);
    connect_to(link, (const struct sockaddr *)&ss);
}

static void start_attempt(struct link *link)
{
    ASSERT(link->state == LINK_STATE_IDLE);
    ASSERT(link->lc == NULL);
    uv_timer_start(&link->timer, on_timer, link->handshake_timeout_ms, 0);
    struct sockaddr_storage ss;
    int port = atoi(link->port);
    if (uv_ip4_addr(link->host, port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(link->host, port, (struct sockaddr_in6 *)&ss) == 0) {
        connect_to(link, (const struct sockaddr *)&ss);
        return;
    }
    struct link_resolve *resolve = xcalloc(1, sizeof *resolve);
    resolve->link = link;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    int rc = uv_getaddrinfo(link->net->loop, &resolve->req, on_resolved, link->host, link->port,
                            &hints);
    if (rc != 0) {
        free(resolve);
        attempt_failed(link, "resolve", rc);
        return;
    }
    link->resolve = resolve;
    link->state = LINK_STATE_RESOLVING;
}

/* ---- timer: backoff, handshake timeout, heartbeats ------------------ */

static void heartbeat_tick(struct link *link)
{
    struct conn *conn = &link->lc->conn;
    uint64_t now = uv_now(link->net->loop);
    uint64_t interval_ms = (uint64_t)link->heartbeat_negotiated_s * 1000;
    if (now - conn->last_read_ms > 2 * interval_ms) {
        LOG_WARN("link=%s missed heartbeats: nothing received for %llu ms", link->address,
                 (unsigned long long)(now - conn->last_read_ms));
        drop(link);
        return;
    }
    /* Output that is not draining says enough; do not pile onto it. */
    if (now - conn->last_write_ms >= interval_ms / 2 && conn->out_bytes == 0)
        send_heartbeat(link);
}

static void on_timer(uv_timer_t *timer)
{
    struct link *link = timer->data;
    ASSERT(!link->freed);
    switch (link->state) {
    case LINK_STATE_IDLE:
        start_attempt(link);
        return;
    case LINK_STATE_UP:
        heartbeat_tick(link);
        return;
    default:
        LINK_LOG(link, "link=%s handshake timed out after %u ms", link->address,
                 link->handshake_timeout_ms);
        drop(link);
        return;
    }
}

/* ---- transport callbacks -------------------------------------------- */

static void handle_frame(struct link *link, const struct frame *frame);

static long on_input(struct conn *conn, const uint8_t *data, size_t size)
{
    struct link_conn *lc = from_conn(conn);
    size_t used = 0;
    while (used < size && lc->link) {
        struct link *link = lc->link;
        struct frame frame;
        size_t need = 0;
        int n = frame_parse(&link->reader, data + used, size - used, &frame, &need);
        if (n == 0) {
            conn->in_need = need;
            break;
        }
        if (n < 0) {
            link__fail(link, REPLY_FRAME_ERROR, "malformed frame");
            break;
        }
        used += (size_t)n;
        link->stats.frames_in++;
        link->stats.bytes_in += (uint64_t)n;
        handle_frame(link, &frame);
    }
    /* Detached (dropped or freed while dispatching): the rest is nobody's. */
    return lc->link ? (long)used : (long)size;
}

static void on_close(struct conn *conn)
{
    struct link_conn *lc = from_conn(conn);
    struct link *link = lc->link;
    if (!link)
        return; /* we ended it ourselves and have said so */
    LINK_LOG(link, "link=%s conn=%llu connection lost", link->address,
             (unsigned long long)conn->id);
    if (link->state == LINK_STATE_SECURE)
        link->stats.auth_failures++; /* a broker that does not take QUAY-CLUSTER drops us */
    link->lc = NULL;
    lc->link = NULL;
    went_down(link);
}

static void on_free(struct conn *conn)
{
    struct link_conn *lc = from_conn(conn);
    ASSERT(lc->link == NULL);
    free(lc);
}

static void on_drain(struct conn *conn)
{
    struct link *link = from_conn(conn)->link;
    if (link && link->state == LINK_STATE_UP && link->ops.drained)
        link->ops.drained(link->ops.ctx, link);
}

/* ---- handshake ------------------------------------------------------ */

static void send_start_ok(struct link *link)
{
    uint8_t props[512];
    struct table_writer w;
    table_writer_init(&w, props, sizeof props);
    size_t caps = table_put_table_begin(&w, "capabilities");
    table_put_bool(&w, "publisher_confirms", true);
    table_put_bool(&w, "consumer_cancel_notify", true);
    table_put_bool(&w, "basic.nack", true);
    table_put_bool(&w, "per_consumer_qos", true);
    table_put_bool(&w, "authentication_failure_close", true);
    table_put_table_end(&w, caps);
    table_put_longstr(&w, "product", BYTES_LIT("quay-link"));
    table_put_longstr(&w, "version", BYTES_LIT(QUAY_VERSION));
    table_put_longstr(&w, "platform", BYTES_LIT("C17/libuv"));
    table_put_longstr(&w, "connection_name", bytes_of_cstr(link->self_name));
    ASSERT(!w.overflow);
    struct method m = {.id = METHOD_CONNECTION_START_OK};
    m.connection_start_ok.client_properties = table_writer_table(&w);
    m.connection_start_ok.locale = BYTES_LIT("en_US");
    if (link->user != NULL) {
        /* PLAIN: \0 user \0 password; no challenge follows. */
        size_t user_size = strlen(link->user);
        uint8_t response[2 + 255 + LINK_PASSWORD_SIZE_MAX];
        ASSERT(link->password.len <= LINK_PASSWORD_SIZE_MAX);
        response[0] = '\0';
        memcpy(response + 1, link->user, user_size);
        response[1 + user_size] = '\0';
        memcpy(response + 2 + user_size, link->password.ptr, link->password.len);
        m.connection_start_ok.mechanism = BYTES_LIT("PLAIN");
        m.connection_start_ok.response =
            (struct bytes){response, (uint32_t)(2 + user_size + link->password.len)};
        link__send_method(link, 0, &m);
        OPENSSL_cleanse(response, sizeof response);
        link->state = LINK_STATE_TUNE;
        return;
    }
    m.connection_start_ok.mechanism = BYTES_LIT(AUTH_CLUSTER_MECHANISM);
    m.connection_start_ok.response = bytes_of_cstr(link->self_name);
    link__send_method(link, 0, &m);
    link->state = LINK_STATE_SECURE;
}

static void handle_start(struct link *link, const struct method_connection_start *start)
{
    if (start->version_major != 0 || start->version_minor != 9) {
        link__fail(link, REPLY_NOT_IMPLEMENTED, "AMQP version %u-%u", start->version_major,
                   start->version_minor);
        return;
    }
    send_start_ok(link);
}

/* The peer's challenge: NAME \0 PROOF over its nonce (auth.h). */
static void handle_secure(struct link *link, const struct method_connection_secure *secure)
{
    struct bytes nonce = secure->challenge;
    if (nonce.len != AUTH_CLUSTER_NONCE_SIZE) {
        link->stats.auth_failures++;
        link__fail(link, REPLY_SYNTAX_ERROR, "a cluster challenge of %u bytes", nonce.len);
        return;
    }
    struct bytes name = bytes_of_cstr(link->self_name);
    uint8_t response[AUTH_CLUSTER_NAME_SIZE_MAX + 1 + AUTH_CLUSTER_PROOF_SIZE + 1];
    memcpy(response, name.ptr, name.len);
    response[name.len] = '\0';
    auth_cluster_proof(link->secret, nonce, name, (char *)response + name.len + 1);
    struct method m = {.id = METHOD_CONNECTION_SECURE_OK};
    m.connection_secure_ok.response =
        (struct bytes){response, name.len + 1 + AUTH_CLUSTER_PROOF_SIZE};
    link__send_method(link, 0, &m);
    link->state = LINK_STATE_TUNE;
}

static void handle_tune(struct link *link, const struct method_connection_tune *tune)
{
    uint32_t frame_max = tune->frame_max == 0 || tune->frame_max > LINK_FRAME_MAX
                             ? LINK_FRAME_MAX
                             : tune->frame_max;
    if (frame_max < FRAME_MIN_SIZE) {
        link__fail(link, REPLY_NOT_ALLOWED, "frame_max %u below %u", frame_max, FRAME_MIN_SIZE);
        return;
    }
    /* 0 from the server means "no preference": then ours stands. */
    uint16_t heartbeat_s = link->heartbeat_s;
    if (tune->heartbeat != 0 && tune->heartbeat < heartbeat_s)
        heartbeat_s = tune->heartbeat;
    link->frame_max = frame_max;
    link->channel_max = tune->channel_max ? tune->channel_max : UINT16_MAX;
    link->heartbeat_negotiated_s = heartbeat_s;
    struct method ok = {.id = METHOD_CONNECTION_TUNE_OK};
    ok.connection_tune_ok.channel_max = link->channel_max;
    ok.connection_tune_ok.frame_max = frame_max;
    ok.connection_tune_ok.heartbeat = heartbeat_s;
    link__send_method(link, 0, &ok);
    link->reader.frame_max = frame_max;
    struct method open = {.id = METHOD_CONNECTION_OPEN};
    open.connection_open.virtual_host = link->vhost.len > 0 ? link->vhost : BYTES_LIT("/");
    open.connection_open.reserved_1 = BYTES_LIT("");
    link__send_method(link, 0, &open);
    link->state = LINK_STATE_OPEN_OK;
}

static void handle_open_ok(struct link *link)
{
    link->state = LINK_STATE_UP;
    link->failures = 0;
    link->down_reported = false;
    link->stats.connects++;
    uint64_t tick_ms = (uint64_t)link->heartbeat_negotiated_s * 1000 / 4;
    uv_timer_start(&link->timer, on_timer, tick_ms, tick_ms);
    LOG_INFO("link=%s conn=%llu up: frame_max=%u channel_max=%u heartbeat=%us", link->address,
             (unsigned long long)link->lc->conn.id, link->frame_max, link->channel_max,
             link->heartbeat_negotiated_s);
    if (link->ops.up)
        link->ops.up(link->ops.ctx, link);
}

/* The peer closes: answer close-ok (it closes the socket then). */
static void handle_close(struct link *link, const struct method_connection_close *close)
{
    bool refused = link->state < LINK_STATE_UP && close->reply_code == REPLY_ACCESS_REFUSED;
    if (refused)
        link->stats.auth_failures++;
    link->last_close_code = close->reply_code;
    size_t n = close->reply_text.len < sizeof link->last_close_text - 1
                   ? close->reply_text.len
                   : sizeof link->last_close_text - 1;
    memcpy(link->last_close_text, close->reply_text.ptr, n);
    link->last_close_text[n] = '\0';
    LINK_LOG(link, "link=%s closed by the peer: %u %.*s%s", link->address, close->reply_code,
             (int)close->reply_text.len, (const char *)close->reply_text.ptr,
             refused ? " (wrong cluster secret?)" : "");
    struct method ok = {.id = METHOD_CONNECTION_CLOSE_OK};
    end_connection(link, &ok);
    went_down(link);
}

static void handle_connection_method(struct link *link, const struct method *m)
{
    switch (m->id) {
    case METHOD_CONNECTION_START:
        if (link->state == LINK_STATE_START)
            return handle_start(link, &m->connection_start);
        break;
    case METHOD_CONNECTION_SECURE:
        if (link->state == LINK_STATE_SECURE)
            return handle_secure(link, &m->connection_secure);
        break;
    case METHOD_CONNECTION_TUNE:
        if (link->state == LINK_STATE_TUNE)
            return handle_tune(link, &m->connection_tune);
        break;
    case METHOD_CONNECTION_OPEN_OK:
        if (link->state == LINK_STATE_OPEN_OK)
            return handle_open_ok(link);
        break;
    case METHOD_CONNECTION_CLOSE:
        return handle_close(link, &m->connection_close);
    case METHOD_CONNECTION_BLOCKED:
    case METHOD_CONNECTION_UNBLOCKED:
        /* We do not advertise connection.blocked; a blocked peer simply
         * stops reading, which link_channel_writable reports. */
        return;
    default:
        break;
    }
    const char *name = method_name(m->id);
    link__fail(link, REPLY_COMMAND_INVALID, "unexpected %s in link state %s",
               name ? name : "method", state_name(link->state));
}

static void handle_frame(struct link *link, const struct frame *frame)
{
    if (frame->type == FRAME_HEARTBEAT)
        return; /* the transport noted the read time */
    if (frame->channel == 0) {
        if (frame->type != FRAME_METHOD) {
            link__fail(link, REPLY_UNEXPECTED_FRAME, "frame type %u on channel 0", frame->type);
            return;
        }
        struct method m;
        if (link__decode(link, frame, &m))
            handle_connection_method(link, &m);
        return;
    }
    if (link->state != LINK_STATE_UP) {
        link__fail(link, REPLY_COMMAND_INVALID, "channel %u frame before open-ok",
                   frame->channel);
        return;
    }
    struct link_channel *ch =
        frame->channel < link->channels_cap ? link->channels[frame->channel] : NULL;
    if (!ch) {
        link__fail(link, REPLY_CHANNEL_ERROR, "frame on unopened channel %u", frame->channel);
        return;
    }
    link__channel_frame(ch, frame);
}
