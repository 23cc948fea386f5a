/*
 * connection.c: see connection.h.
 *
 * Frame flow: on_input parses as many whole frames as the buffer holds
 * (a partial frame stays in the transport's buffer for the next read),
 * dispatches each, and stops early when the connection starts closing.
 * Decoded methods borrow from the input buffer, so nothing here keeps a
 * pointer to a frame after dispatch returns.
 */
#include "broker/connection.h"

#include "broker/cluster_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "amqp/table.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/flow.h"
#include "broker/frame_out.h"
#include "broker/login.h"
#include "broker/queue.h"
#include "broker/usage.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "net/tls.h"

#define CLOSE_OK_TIMEOUT_MS 3000
/* How often the kernel is asked about a peer we do not read. */
#define PEER_CHECK_MS 1000
/* A connection quiet this long gives back what its last burst left in
 * the transport (conn_trim_idle: TLS buffers). */
#define IDLE_TRIM_MS 1000

static long on_input(struct conn *conn, const uint8_t *data, size_t size);
static void on_close(struct conn *conn);
static void on_free(struct conn *conn);
static void on_drain(struct conn *conn);

static const struct conn_ops connection_conn_ops = {
    .on_input = on_input,
    .on_close = on_close,
    .on_free = on_free,
    .on_drain = on_drain,
    .on_sink = connection__on_sink,
    .batch_input = true,
    .share_turns = true,
};

static struct connection *from_conn(struct conn *conn)
{
    return CONTAINER_OF(conn, struct connection, conn);
}

/* --max-connections counts clients, not the other brokers' links: a
 * connection is not known to be one before it logs in, so as many slots
 * as there are peers whose link has not come in yet are kept for them,
 * and a client that got one is refused when it logs in (extra: 1). */
static bool over_connection_limit(const struct broker *broker, uint32_t extra)
{
    uint32_t limit = broker->config.limits.connections_max;
    if (limit == 0)
        return false;
    uint32_t others = broker->connections_count - broker->peer_connections_count;
    uint32_t expected =
        broker->cluster_ops ? broker->cluster_ops->peers_expected(broker->cluster_ctx) : 0;
    uint32_t reserved = expected > broker->peer_connections_count
                            ? expected - broker->peer_connections_count
                            : 0;
    return others > limit + (extra ? 0 : reserved);
}

/* --max-handshaking: sockets that have not logged in cost a stranger
 * nothing to open and hold until the handshake timeout; past the limit
 * new ones are closed at once, with one warning a second at most (a
 * flood must not flood the log too). */
static bool over_handshaking_limit(struct broker *broker, uint64_t now_ms)
{
    uint32_t limit = broker->config.limits.handshaking_max;
    if (limit == 0 || broker->handshaking_count < limit)
        return false;
    broker->handshaking_refused++;
    if (broker->handshaking_logged_ms == 0 || now_ms - broker->handshaking_logged_ms >= 1000) {
        broker->handshaking_logged_ms = now_ms;
        LOG_WARN("refusing connections: %u have not logged in yet (--max-handshaking); "
                 "%llu refused so far", broker->handshaking_count,
                 (unsigned long long)broker->handshaking_refused);
    }
    return true;
}

struct conn *connection_accept(struct net *net, void *ctx)
{
    struct broker *broker = ctx;
    struct connection *connection = xcalloc(1, sizeof *connection);
    if (conn_init(&connection->conn, net, &connection_conn_ops) != 0) {
        free(connection);
        return NULL;
    }
    connection->broker = broker;
    connection->state = CONNECTION_STATE_HEADER;
    connection->reader.frame_max = FRAME_MIN_SIZE;
    connection->frame_max = FRAME_MIN_SIZE;
    connection->started_ms = uv_now(net->loop);
    list_init(&connection->exclusive_queues);
    flow_connection_init(connection);
    list_push_back(&broker->connections, &connection->broker_link);
    broker->connections_count++;
    rates_join(&broker->connections_active, &connection->rates); /* its first sample */
    if (over_connection_limit(broker, 0)) {
        /* Over the limit: accept and close at once, as RabbitMQ does, so
         * the client sees a closed socket instead of a hanging connect. */
        LOG_WARN("conn=%llu refused: connection limit %u reached",
                 (unsigned long long)connection->conn.id, broker->config.limits.connections_max);
        connection->conn.refused = true; /* the listener accepts, then closes */
    } else if (over_handshaking_limit(broker, connection->started_ms)) {
        connection->conn.refused = true;
    } else {
        connection->handshaking = true;
        broker->handshaking_count++;
    }
    return &connection->conn;
}

/* Logged in (or gone): no longer counted against --max-handshaking. */
static void end_handshaking(struct connection *connection)
{
    if (!connection->handshaking)
        return;
    ASSERT(connection->broker->handshaking_count > 0);
    connection->handshaking = false;
    connection->broker->handshaking_count--;
}

/* ---- output --------------------------------------------------------- */

void connection_send_method(struct connection *connection, uint16_t channel,
                            const struct method *method)
{
    frame_out_method(&connection->conn, channel, method);
}

static void send_close(struct connection *connection, uint16_t code, uint32_t method_id,
                       const char *text)
{
    struct method m = {.id = METHOD_CONNECTION_CLOSE};
    m.connection_close.reply_code = code;
    m.connection_close.reply_text = (struct bytes){(const uint8_t *)text,
                                                   (uint32_t)strnlen(text, 255)};
    m.connection_close.class_id = METHOD_CLASS_ID(method_id);
    m.connection_close.method_id = METHOD_METHOD_ID(method_id);
    connection_send_method(connection, 0, &m);
}

/* ---- teardown ------------------------------------------------------- */

static void silent_close(struct connection *connection)
{
    connection->state = CONNECTION_STATE_CLOSED;
    conn_close(&connection->conn);
}

/* RabbitMQ's names for the connection states, used in its reply texts. */
static const char *state_name(enum connection_state state)
{
    switch (state) {
    case CONNECTION_STATE_HEADER:
    case CONNECTION_STATE_START_OK:
        return "starting";
    case CONNECTION_STATE_SECURE_OK:
        return "securing";
    case CONNECTION_STATE_TUNE_OK:
        return "tuning";
    case CONNECTION_STATE_OPEN_WAIT:
        return "opening";
    case CONNECTION_STATE_OPEN:
        return "running";
    default:
        return "closing";
    }
}

/* Releases every channel and exclusive queue. Idempotent. */
static void release_everything(struct connection *connection)
{
    flow_connection_release(connection);
    for (uint32_t i = 0; i < connection->channels_cap; i++) {
        struct channel *ch = connection->channels[i];
        if (ch)
            channel_destroy(ch);
    }
    while (!list_empty(&connection->exclusive_queues)) {
        struct queue *queue =
            CONTAINER_OF(connection->exclusive_queues.next, struct queue, owner_link);
        list_remove(&queue->owner_link);
        vhost_queue_discard(queue->vhost, queue);
    }
}

/* The client closes the socket after close-ok (RabbitMQ waits for it
 * too); the tick closes it if the client never does. */
static void send_close_ok(struct connection *connection)
{
    struct method ok = {.id = METHOD_CONNECTION_CLOSE_OK};
    release_everything(connection);
    connection_send_method(connection, 0, &ok);
    connection->state = CONNECTION_STATE_CLOSING;
    connection->closing_since_ms = uv_now(connection->conn.net->loop);
}

void connection_channel_closed(struct connection *connection)
{
    ASSERT(connection->close_ok_owed > 0);
    if (--connection->close_ok_owed == 0 && connection->state == CONNECTION_STATE_OPEN &&
        !connection->conn.closing)
        send_close_ok(connection);
}

size_t connection__reply_text(char *out, size_t size, uint16_t reply_code, const char *fmt,
                              va_list ap)
{
    ASSERT(size >= 256);
    char detail[1024];
    vsnprintf(detail, sizeof detail, fmt, ap);
    const char *name = reply_code_text(reply_code);
    int n = detail[0] ? snprintf(out, size, "%s - %s", name ? name : "ERROR", detail)
                      : snprintf(out, size, "%s", name ? name : "ERROR");
    /* A shortstr holds 255 bytes; RabbitMQ cuts longer texts to 252
     * and marks the cut with "...". */
    if (n > 255)
        memcpy(out + 252, "...", 4);
    return strlen(out);
}

void connection_failv(struct connection *connection, uint16_t reply_code, uint32_t method_id,
                      const char *fmt, va_list ap)
{
    if (connection->state == CONNECTION_STATE_CLOSING ||
        connection->state == CONNECTION_STATE_CLOSED) {
        conn_close(&connection->conn);
        return;
    }
    char text[1280];
    connection__reply_text(text, sizeof text, reply_code, fmt, ap);
    LOG_INFO("conn=%llu peer=%s closing: %u %s", (unsigned long long)connection->conn.id,
             connection->conn.peer_name, reply_code, text);
    bool handshaking = connection->state < CONNECTION_STATE_TUNE_OK;
    release_everything(connection);
    if (handshaking && reply_code == REPLY_ACCESS_REFUSED &&
        !connection->client_auth_failure_close) {
        /* Clients without authentication_failure_close expect the socket
         * to drop after a failed login (AMQP 0-9-1 §4.10.2). */
        connection->state = CONNECTION_STATE_CLOSED;
        conn_close(&connection->conn);
        return;
    }
    send_close(connection, reply_code, method_id, text);
    connection->state = CONNECTION_STATE_CLOSING;
    connection->closing_since_ms = uv_now(connection->conn.net->loop);
}

void connection_fail(struct connection *connection, uint16_t reply_code, uint32_t method_id,
                     const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    connection_failv(connection, reply_code, method_id, fmt, ap);
    va_end(ap);
}

void connection_force_close(struct connection *connection, const char *reason)
{
    if (connection->state == CONNECTION_STATE_OPEN)
        connection_fail(connection, REPLY_CONNECTION_FORCED, 0, "%s", reason);
    else
        conn_close(&connection->conn);
}

static void on_close(struct conn *conn)
{
    struct connection *connection = from_conn(conn);
    if (connection->state == CONNECTION_STATE_OPEN || connection->state == CONNECTION_STATE_CLOSING)
        LOG_INFO("conn=%llu peer=%s user=%s vhost=%.*s closed",
                 (unsigned long long)conn->id, conn->peer_name,
                 connection->user ? connection->user->name : "?",
                 connection->vhost ? (int)connection->vhost->name.len : 1,
                 connection->vhost ? (const char *)connection->vhost->name.ptr : "?");
    connection->state = CONNECTION_STATE_CLOSED;
    release_everything(connection);
    if (connection->cluster_peer)
        usage_link_closed(connection->broker, conn->id);
    else
        usage_changed(connection->broker, connection);
}

static void on_free(struct conn *conn)
{
    struct connection *connection = from_conn(conn);
    for (uint32_t i = 0; i < connection->channels_cap; i++)
        ASSERT(connection->channels[i] == NULL);
    ASSERT(list_empty(&connection->flow_ties));
    if (connection->login != NULL)
        login_cancel(connection->login);
    connection->login = NULL;
    end_handshaking(connection);
    free(connection->channels);
    free(connection->crossed_closes);
    if (connection->user != NULL)
        auth_user_unref(connection->user);
    connection->user = NULL;
    struct broker *broker = connection->broker;
    list_remove(&connection->broker_link);
    broker->connections_count--;
    if (connection->cluster_peer)
        broker->peer_connections_count--;
    rates_leave(&broker->connections_active, &connection->rates);
    rates_free(&connection->rates);
    free(connection);
    broker__connection_gone(broker);
}

void connection__channel_gone(struct connection *connection, uint16_t channel_id)
{
    ASSERT(channel_id < connection->channels_cap);
    ASSERT(connection->channels[channel_id] != NULL);
    connection->channels[channel_id] = NULL;
    connection->channels_open--;
    usage_changed(connection->broker, connection);
}

static void on_drain(struct conn *conn)
{
    struct connection *connection = from_conn(conn);
    for (uint32_t i = 0; i < connection->channels_cap; i++) {
        if (connection->channels[i])
            channel_resume_delivery(connection->channels[i]);
    }
}

/* ---- handshake ------------------------------------------------------ */

static void send_start(struct connection *connection)
{
    uint8_t props[1024];
    struct table_writer w;
    table_writer_init(&w, props, sizeof props);
    size_t caps = table_put_table_begin(&w, "capabilities");
    table_put_bool(&w, "publisher_confirms", true);
    table_put_bool(&w, "exchange_exchange_bindings", true);
    table_put_bool(&w, "basic.nack", true);
    table_put_bool(&w, "consumer_cancel_notify", true);
    table_put_bool(&w, "connection.blocked", true);
    table_put_bool(&w, "consumer_priorities", true);
    table_put_bool(&w, "authentication_failure_close", true);
    table_put_bool(&w, "per_consumer_qos", true);
    table_put_bool(&w, "direct_reply_to", false);
    table_put_table_end(&w, caps);
    table_put_longstr(&w, "cluster_name", BYTES_LIT("quay"));
    table_put_longstr(&w, "copyright", BYTES_LIT("Copyright (c) the quay developers"));
    table_put_longstr(&w, "information", BYTES_LIT("quay: a clustered AMQP 0-9-1 broker"));
    table_put_longstr(&w, "platform", BYTES_LIT("C17/libuv"));
    table_put_longstr(&w, "product", BYTES_LIT("quay"));
    table_put_longstr(&w, "version", BYTES_LIT(QUAY_VERSION) /* CMake project() version */);
    ASSERT(!w.overflow);
    struct method m = {.id = METHOD_CONNECTION_START};
    m.connection_start.version_major = 0;
    m.connection_start.version_minor = 9;
    m.connection_start.server_properties = table_writer_table(&w);
    /* QUAY-CLUSTER is accepted, not offered: a client of a cluster sees
     * what one broker (and RabbitMQ) offers; a peer knows to use it. */
    /* EXTERNAL on every TLS connection, as RabbitMQ's
     * rabbitmq_auth_mechanism_ssl does: one without a certificate gets a
     * refusal that says so, rather than "no acceptable mechanism". */
    m.connection_start.mechanisms = conn_tls(&connection->conn)
                                        ? BYTES_LIT("PLAIN AMQPLAIN EXTERNAL")
                                        : BYTES_LIT("PLAIN AMQPLAIN");
    m.connection_start.locales = BYTES_LIT("en_US");
    connection_send_method(connection, 0, &m);
    connection->state = CONNECTION_STATE_START_OK;
}

static long handle_protocol_header(struct connection *connection, const uint8_t *data,
                                   size_t size)
{
    if (size < PROTOCOL_HEADER_SIZE) {
        /* A prefix that cannot become a valid header is answered at once. */
        if (memcmp(data, PROTOCOL_HEADER, size) == 0)
            return 0;
    } else if (memcmp(data, PROTOCOL_HEADER, PROTOCOL_HEADER_SIZE) == 0) {
        send_start(connection);
        return PROTOCOL_HEADER_SIZE;
    }
    /* Wrong protocol or version: answer with the header we speak, then
     * close (AMQP 0-9-1 §4.2.2). */
    conn_out_bytes(&connection->conn, PROTOCOL_HEADER, PROTOCOL_HEADER_SIZE);
    connection->state = CONNECTION_STATE_CLOSED;
    conn_close_after_flush(&connection->conn);
    return -1;
}

static void read_client_capabilities(struct connection *connection, struct table props)
{
    struct field_value caps;
    if (!table_get(props, "capabilities", &caps) || caps.kind != 'F')
        return;
    struct field_value v;
    if (table_get(caps.table, "consumer_cancel_notify", &v) && v.kind == 't')
        connection->client_cancel_notify = v.boolean;
    if (table_get(caps.table, "authentication_failure_close", &v) && v.kind == 't')
        connection->client_auth_failure_close = v.boolean;
    if (table_get(caps.table, "connection.blocked", &v) && v.kind == 't')
        connection->client_blocked = v.boolean;
}

/* The channels a connection is offered. Another broker's link opens one
 * channel per consumer and per queue it asks on behalf of its clients
 * (cluster/proxy.h), all its clients' together: the client limit would
 * make the 2,048th remote consumer of one primary wait for ever. A peer
 * is known by now (cluster_login precedes the tune). */
static uint16_t offered_channel_max(const struct connection *connection)
{
    return connection->cluster_peer ? UINT16_MAX
                                    : connection->broker->config.limits.channel_max;
}

static void send_tune(struct connection *connection)
{
    const struct broker_limits *limits = &connection->broker->config.limits;
    struct method tune = {.id = METHOD_CONNECTION_TUNE};
    tune.connection_tune.channel_max = offered_channel_max(connection);
    tune.connection_tune.frame_max = limits->frame_max;
    tune.connection_tune.heartbeat = limits->heartbeat_s;
    connection_send_method(connection, 0, &tune);
    connection->state = CONNECTION_STATE_TUNE_OK;
}

static void refuse_login(struct connection *connection, struct bytes mechanism)
{
    connection_fail(connection, REPLY_ACCESS_REFUSED, 0,
                    "Login was refused using authentication mechanism %.*s. For details "
                    "see the broker logfile.",
                    (int)mechanism.len, (const char *)mechanism.ptr);
}

/* Another broker's link (auth.h): its start-ok named QUAY-CLUSTER; it
 * gets a nonce fresh for this connection as the challenge. */
static void challenge_peer(struct connection *connection)
{
    auth_cluster_nonce(connection->cluster_nonce);
    struct method m = {.id = METHOD_CONNECTION_SECURE};
    m.connection_secure.challenge = bytes_of_cstr(connection->cluster_nonce);
    connection_send_method(connection, 0, &m);
    connection->state = CONNECTION_STATE_SECURE_OK;
}

/* Its proof over the nonce: refused exactly like a bad password when it
 * does not match (a wrong or missing cluster secret). */
static void cluster_login(struct connection *connection, const struct method *m)
{
    struct bytes nonce = bytes_of_cstr(connection->cluster_nonce);
    struct bytes name;
    struct tls_session *tls = conn_tls(&connection->conn);
    bool certified = tls != NULL && tls_session_peer_verified(tls);
    if (connection->broker->config.cluster_tls && !certified) {
        /* --cluster-tls: a peer proves itself with a certificate of the
         * cluster's CAs as well as with the secret. */
        LOG_INFO("conn=%llu peer=%s cluster login refused: no verified TLS client certificate "
                 "(--cluster-tls)", (unsigned long long)connection->conn.id,
                 connection->conn.peer_name);
        refuse_login(connection, BYTES_LIT(AUTH_CLUSTER_MECHANISM));
        return;
    }
    connection->user = auth_cluster_check(connection->broker->cluster_secret, nonce,
                                          m->connection_secure_ok.response, &name);
    if (!connection->user) {
        LOG_INFO("conn=%llu peer=%s cluster login refused: wrong cluster secret",
                 (unsigned long long)connection->conn.id, connection->conn.peer_name);
        refuse_login(connection, BYTES_LIT(AUTH_CLUSTER_MECHANISM));
        return;
    }
    end_handshaking(connection);
    connection->cluster_peer = true;
    connection->broker->peer_connections_count++;
    connection->conn.peer_reads_always = true; /* see conn.h */
    /* Peers run consumers on behalf of their clients, which must hear of
     * a cancelled consumer whatever the link advertised. */
    connection->client_cancel_notify = true;
    LOG_INFO("conn=%llu peer=%s cluster peer '%.*s' logged in",
             (unsigned long long)connection->conn.id, connection->conn.peer_name, (int)name.len,
             (const char *)name.ptr);
    send_tune(connection);
}

static void admit_client(struct connection *connection);

/* EXTERNAL (rabbitmq_auth_mechanism_ssl): the user is the verified client
 * certificate's subject CN, and must exist. The client is told only "Login
 * was refused" (refuse_login); the log gets RabbitMQ's reason. */
static const struct auth_user *external_login(struct connection *connection)
{
    struct conn *conn = &connection->conn;
    struct tls_session *tls = conn_tls(conn);
    char name[256];
    if (!tls_session_peer_verified(tls) || tls_session_peer_cn(tls, name, sizeof name) < 0) {
        LOG_INFO("conn=%llu peer=%s EXTERNAL login refused: %s", (unsigned long long)conn->id,
                 conn->peer_name,
                 tls_session_peer_verified(tls)
                     ? "no name found"
                     : "connection peer presented no TLS (x.509) certificate");
        return NULL;
    }
    const struct auth_user *user = auth_find_user(&connection->broker->auth, bytes_of_cstr(name));
    const char *reason = user == NULL ? "invalid credentials"
                         : user->loopback_only && !conn->peer_loopback
                             ? "user can only log in via localhost"
                             : NULL;
    if (reason != NULL) {
        LOG_INFO("conn=%llu peer=%s EXTERNAL login refused: user '%s' - %s",
                 (unsigned long long)conn->id, conn->peer_name, name, reason);
        return NULL;
    }
    LOG_INFO("conn=%llu peer=%s user '%s' logged in with EXTERNAL (TLS client certificate)",
             (unsigned long long)conn->id, conn->peer_name, name);
    return user;
}

/* A password login's answer: tuning, or the refusal (AMQP tells no
 * reason; a right password from the wrong peer is one more refusal). */
static void settle_login(struct connection *connection, enum auth_verdict verdict,
                         const struct auth_user *user)
{
    if (verdict != AUTH_VERDICT_OK) {
        refuse_login(connection, bytes_of_cstr(connection->login_mechanism));
        return;
    }
    connection->user = user;
    admit_client(connection);
}

/* A slow check answered (broker/login.h): the connection is still open
 * (a closed one cancelled its login). */
static void on_login_done(void *ctx, enum auth_verdict verdict, const struct auth_user *user)
{
    struct connection *connection = ctx;
    connection->login = NULL;
    if (connection->conn.closing)
        return;
    settle_login(connection, verdict, user);
    connection_release(connection);
}

static void handle_start_ok(struct connection *connection, const struct method *m)
{
    const struct method_connection_start_ok *ok = &m->connection_start_ok;
    read_client_capabilities(connection, ok->client_properties);
    struct bytes user, password;
    int parsed;
    if (bytes_equal_cstr(ok->mechanism, "PLAIN")) {
        parsed = auth_parse_plain(ok->response, &user, &password);
    } else if (bytes_equal_cstr(ok->mechanism, "AMQPLAIN")) {
        parsed = auth_parse_amqplain(ok->response, &user, &password);
    } else if (connection->broker->cluster_secret.len > 0 &&
               bytes_equal_cstr(ok->mechanism, AUTH_CLUSTER_MECHANISM)) {
        challenge_peer(connection);
        return;
    } else if (conn_tls(&connection->conn) != NULL && bytes_equal_cstr(ok->mechanism, "EXTERNAL")) {
        connection->user = external_login(connection);
        if (connection->user == NULL)
            refuse_login(connection, ok->mechanism);
        else
            admit_client(connection);
        return;
    } else {
        /* RabbitMQ drops the socket without a close for a mechanism it
         * did not offer. */
        LOG_INFO("conn=%llu peer=%s unsupported mechanism '%.*s'",
                 (unsigned long long)connection->conn.id, connection->conn.peer_name,
                 (int)ok->mechanism.len, (const char *)ok->mechanism.ptr);
        silent_close(connection);
        return;
    }
    if (parsed != 0) {
        connection_fail(connection, REPLY_ACCESS_REFUSED, 0,
                        "malformed %.*s response", (int)ok->mechanism.len,
                        (const char *)ok->mechanism.ptr);
        return;
    }
    enum auth_verdict verdict;
    const struct auth_user *u;
    connection->login_mechanism = bytes_equal_cstr(ok->mechanism, "PLAIN") ? "PLAIN" : "AMQPLAIN";
    connection->login = login_start(connection->broker, user, password,
                                    connection->conn.peer_loopback, on_login_done, connection,
                                    &verdict, &u);
    if (connection->login != NULL) {
        connection_hold(connection); /* nothing after start-ok until the answer */
        return;
    }
    settle_login(connection, verdict, u);
}

/* A client that logged in: tuning follows, unless it is over the limit. */
static void admit_client(struct connection *connection)
{
    /* Held until the connection is freed: a user deleted meanwhile stays
     * readable for its logs (auth.h). */
    auth_user_ref(connection->user);
    if (over_connection_limit(connection->broker, 1)) {
        /* A client in a slot kept for a peer's link: refused as at accept. */
        LOG_WARN("conn=%llu refused: connection limit %u reached",
                 (unsigned long long)connection->conn.id,
                 connection->broker->config.limits.connections_max);
        silent_close(connection);
        return;
    }
    end_handshaking(connection);
    send_tune(connection);
}

/* Negotiation: the client's values must lie within what we offered; 0
 * ("no limit") is above any limit we offer, so RabbitMQ refuses it too.
 * The heartbeat is the client's choice (0 turns it off). */
static void handle_tune_ok(struct connection *connection, const struct method *m)
{
    const struct method_connection_tune_ok *ok = &m->connection_tune_ok;
    const struct broker_limits *limits = &connection->broker->config.limits;
    /* Out-of-range values end the connection without a close, as in
     * RabbitMQ: the client has not finished tuning, so it could not
     * read a close frame sized by the values it just got wrong. */
    if (ok->frame_max < FRAME_MIN_SIZE || ok->frame_max > limits->frame_max ||
        ok->channel_max == 0 || ok->channel_max > offered_channel_max(connection)) {
        LOG_INFO("conn=%llu peer=%s tune-ok out of range: frame_max=%u channel_max=%u",
                 (unsigned long long)connection->conn.id, connection->conn.peer_name,
                 ok->frame_max, ok->channel_max);
        silent_close(connection);
        return;
    }
    connection->frame_max = ok->frame_max;
    connection->channel_max = ok->channel_max;
    connection->heartbeat_s = ok->heartbeat;
    connection->reader.frame_max = connection->frame_max;
    connection->state = CONNECTION_STATE_OPEN_WAIT;
}

static void finish_open(struct connection *connection);

/* The vhost's and the user's max-connections, over the whole cluster
 * (broker/usage.h), with RabbitMQ 3.10's refusals (rabbit_reader: 530, the
 * vhost's first). */
static bool within_limits(struct connection *connection, struct vhost *vhost, uint32_t method_id)
{
    struct broker *broker = connection->broker;
    const struct auth_user *user = connection->user;
    int64_t limit = limit_set_value(&broker->limits, LIMIT_SCOPE_VHOST, vhost->name,
                                    LIMIT_MAX_CONNECTIONS);
    if (limit >= 0 &&
        !limit_allows(limit, usage_count(broker, LIMIT_SCOPE_VHOST, vhost->name,
                                         LIMIT_MAX_CONNECTIONS))) {
        connection_fail(connection, REPLY_NOT_ALLOWED, method_id,
                        "access to vhost '%.*s' refused for user '%s': connection limit (%lld) "
                        "is reached", (int)vhost->name.len, (const char *)vhost->name.ptr,
                        user->name, (long long)limit);
        return false;
    }
    struct bytes user_name = bytes_of_cstr(user->name);
    limit = limit_set_value(&broker->limits, LIMIT_SCOPE_USER, user_name, LIMIT_MAX_CONNECTIONS);
    if (limit >= 0 &&
        !limit_allows(limit, usage_count(broker, LIMIT_SCOPE_USER, user_name,
                                         LIMIT_MAX_CONNECTIONS))) {
        connection_fail(connection, REPLY_NOT_ALLOWED, method_id,
                        "connection refused for user '%s': user connection limit (%lld) is "
                        "reached", user->name, (long long)limit);
        return false;
    }
    return true;
}

static void handle_open(struct connection *connection, const struct method *m)
{
    struct bytes name = m->connection_open.virtual_host;
    struct vhost *vhost = broker_vhost(connection->broker, name);
    if (!vhost) {
        connection_fail(connection, REPLY_NOT_ALLOWED, m->id, "vhost %.*s not found",
                        (int)name.len, (const char *)name.ptr);
        return;
    }
    if (!auth_user_may_open(connection->user, name)) {
        connection_fail(connection, REPLY_NOT_ALLOWED, m->id,
                        "access to vhost '%.*s' refused for user '%s'", (int)name.len,
                        (const char *)name.ptr, connection->user->name);
        return;
    }
    if (!connection->cluster_peer && !within_limits(connection, vhost, m->id))
        return;
    connection->vhost = vhost;
    usage_changed(connection->broker, connection); /* other brokers count it now */
    /* A clustered broker that has not applied the map up to the present
     * (a restart replays it from its start) would serve history: its
     * clients wait for open-ok until it has (connection_cluster_synced),
     * or until the handshake timeout. Brokers' links do not wait: the
     * sync itself may travel on them. */
    const struct broker *broker = connection->broker;
    if (broker->cluster_ops && !connection->cluster_peer &&
        broker->cluster_ops->paused(broker->cluster_ctx)) {
        connection_fail(connection, REPLY_CONNECTION_FORCED, m->id,
                        "broker cut off from the cluster's majority (pause-minority): connect "
                        "to another broker");
        return;
    }
    if (broker->cluster_ops && !connection->cluster_peer &&
        !broker->cluster_ops->synced(broker->cluster_ctx)) {
        connection->open_waits_for_sync = true;
        connection_hold(connection);
        return;
    }
    finish_open(connection);
}

void connection_cluster_synced(struct broker *broker)
{
    list_for_each_safe(node, &broker->connections) {
        struct connection *connection = CONTAINER_OF(node, struct connection, broker_link);
        if (!connection->open_waits_for_sync)
            continue;
        connection->open_waits_for_sync = false;
        if (connection->conn.closing)
            continue;
        finish_open(connection);
        connection_release(connection);
    }
}

static void finish_open(struct connection *connection)
{
    struct bytes name = connection->vhost->name;
    connection->state = CONNECTION_STATE_OPEN;
    struct method ok = {.id = METHOD_CONNECTION_OPEN_OK};
    /* known-hosts: in a cluster, where else a client may reconnect. */
    char hosts[256];
    size_t hosts_len = 0;
    const struct broker *broker = connection->broker;
    if (broker->cluster_ops)
        hosts_len = broker->cluster_ops->known_hosts(broker->cluster_ctx, hosts, sizeof hosts);
    ok.connection_open_ok.reserved_1 = (struct bytes){(const uint8_t *)hosts, (uint32_t)hosts_len};
    connection_send_method(connection, 0, &ok);
    if (!connection->cluster_peer) /* (a peer's link says "logged in") */
        LOG_INFO("conn=%llu peer=%s user=%s vhost=%.*s opened",
                 (unsigned long long)connection->conn.id, connection->conn.peer_name,
                 connection->user->name, (int)name.len, (const char *)name.ptr);
}

/* ---- frame errors --------------------------------------------------- */

/* Formats bytes as Erlang prints a binary (<<"abc">> when printable, else
 * <<0,1,2>>), because RabbitMQ's reply texts quote frames that way and
 * clients' logs are compared with RabbitMQ's. Long inputs are cut. */
size_t connection__format_binary(char *out, size_t cap, const uint8_t *p, size_t len)
{
    ASSERT(cap >= 16);
    const size_t shown_max = 64;
    bool printable = len > 0;
    for (size_t i = 0; i < len && i < shown_max; i++) {
        if (p[i] < 0x20 || p[i] > 0x7e || p[i] == '"' || p[i] == '\\')
            printable = false;
    }
    size_t n = (size_t)snprintf(out, cap, "<<%s", printable ? "\"" : "");
    for (size_t i = 0; i < len && i < shown_max && n + 8 < cap; i++) {
        n += (size_t)(printable ? snprintf(out + n, cap - n, "%c", p[i])
                                : snprintf(out + n, cap - n, i ? ",%u" : "%u", p[i]));
    }
    if (len > shown_max && n + 8 < cap)
        n += (size_t)snprintf(out + n, cap - n, "...");
    n += (size_t)snprintf(out + n, cap - n, "%s>>", printable ? "\"" : "");
    return n < cap ? n : cap - 1;
}

/* frame_parse said E_FRAME: work out why from the raw bytes, and answer
 * with RabbitMQ's code and wording (501 for a malformed frame, 505 for a
 * heartbeat on a channel). */
static void fail_bad_frame(struct connection *connection, const uint8_t *p, size_t len)
{
    char octets[320];
    if (len < FRAME_HEADER_SIZE) {
        connection_fail(connection, REPLY_FRAME_ERROR, 0, "malformed frame");
        return;
    }
    uint8_t type = p[0];
    uint16_t channel = (uint16_t)(p[1] << 8 | p[2]);
    uint32_t size = (uint32_t)p[3] << 24 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 8 | p[6];
    uint32_t payload_max = connection->reader.frame_max - FRAME_OVERHEAD;
    if (size > payload_max) {
        connection_fail(connection, REPLY_FRAME_ERROR, 0,
                        "type %u, all octets = <<>>: {frame_too_large,%u,%u}", type, size,
                        payload_max);
        return;
    }
    size_t available = len - FRAME_HEADER_SIZE;
    size_t shown = size < available ? size : available;
    connection__format_binary(octets, sizeof octets, p + FRAME_HEADER_SIZE, shown);
    if (type == FRAME_HEARTBEAT && channel != 0) {
        connection_fail(connection, REPLY_UNEXPECTED_FRAME, 0, "type %u, all octets = %s", type,
                        octets);
        return;
    }
    if (type != FRAME_METHOD && type != FRAME_HEADER && type != FRAME_BODY &&
        type != FRAME_HEARTBEAT) {
        connection_fail(connection, REPLY_FRAME_ERROR, 0, "type %u, all octets = %s: unknown_frame",
                        type, octets);
        return;
    }
    if (type == FRAME_METHOD && size < 4) {
        connection_fail(connection, REPLY_FRAME_ERROR, 0, "type %u, all octets = %s: unknown_frame",
                        type, octets);
        return;
    }
    uint8_t end = available > size ? p[FRAME_HEADER_SIZE + size] : 0;
    connection__fail_frame_end(connection, type, p + FRAME_HEADER_SIZE, shown, end);
}

void connection__fail_frame_end(struct connection *connection, uint8_t type,
                                const uint8_t *payload, size_t shown, uint8_t end)
{
    char octets[320];
    connection__format_binary(octets, sizeof octets, payload, shown);
    connection_fail(connection, REPLY_FRAME_ERROR, 0,
                    "type %u, all octets = %s: {invalid_frame_end_marker,%u}", type, octets, end);
}

/* method_decode failed: 540 for an unknown method, else RabbitMQ's 501
 * "cannot decode" quoting the arguments. */
static void fail_decode(struct connection *connection, const struct frame *frame, int rc)
{
    ASSERT(frame->size >= 4);
    uint32_t method_id = (uint32_t)frame->payload[0] << 24 | (uint32_t)frame->payload[1] << 16 |
                         (uint32_t)frame->payload[2] << 8 | frame->payload[3];
    if (rc == E_UNKNOWN_METHOD) {
        connection_fail(connection, REPLY_NOT_IMPLEMENTED, method_id, "unknown method %u.%u",
                        METHOD_CLASS_ID(method_id), METHOD_METHOD_ID(method_id));
        return;
    }
    char octets[320];
    connection__format_binary(octets, sizeof octets, frame->payload + 4, frame->size - 4);
    connection_fail(connection, REPLY_FRAME_ERROR, method_id, "cannot decode %s", octets);
}

bool connection__decode_method(struct connection *connection, const struct frame *frame,
                               struct method *out)
{
    int rc = method_decode(out, frame->payload, frame->size);
    if (rc != OK)
        fail_decode(connection, frame, rc);
    return rc == OK;
}

/* ---- dispatch ------------------------------------------------------- */

static void handle_connection_method(struct connection *connection, const struct method *m)
{
    enum connection_state state = connection->state;
    if (state == CONNECTION_STATE_CLOSING) {
        /* After our close only close/close-ok matter (§4.2.6). */
        if (m->id == METHOD_CONNECTION_CLOSE_OK || m->id == METHOD_CONNECTION_CLOSE) {
            connection->state = CONNECTION_STATE_CLOSED;
            conn_close(&connection->conn);
        }
        return;
    }
    switch (m->id) {
    case METHOD_CONNECTION_START_OK:
        if (state == CONNECTION_STATE_START_OK)
            return handle_start_ok(connection, m);
        break;
    case METHOD_CONNECTION_SECURE_OK:
        if (state == CONNECTION_STATE_SECURE_OK)
            return cluster_login(connection, m);
        break;
    case METHOD_CONNECTION_TUNE_OK:
        if (state == CONNECTION_STATE_TUNE_OK)
            return handle_tune_ok(connection, m);
        break;
    case METHOD_CONNECTION_OPEN:
        if (state == CONNECTION_STATE_OPEN_WAIT)
            return handle_open(connection, m);
        break;
    case METHOD_CONNECTION_CLOSE:
        if (connection->close_ok_owed > 0)
            return; /* a second one: the first is being answered */
        /* Each channel goes as on its own channel.close: one holding the
         * last consumer of an auto-delete stand-in waits until the queue's
         * primary said whether it went (one broker has deleted it by its
         * close-ok). Input stays held meanwhile. */
        for (uint32_t i = 0; i < connection->channels_cap; i++) {
            struct channel *ch = connection->channels[i];
            if (ch && channel_close_with_connection(ch))
                connection->close_ok_owed++;
        }
        if (connection->close_ok_owed == 0)
            send_close_ok(connection);
        return;
    case METHOD_CONNECTION_CLOSE_OK:
        /* Unsolicited close-ok: nothing was closing. */
        break;
    case METHOD_CONNECTION_UPDATE_SECRET:
        if (state == CONNECTION_STATE_OPEN) {
            /* PLAIN credentials do not expire; the new secret is accepted
             * as RabbitMQ does for its internal backend. */
            struct method ok = {.id = METHOD_CONNECTION_UPDATE_SECRET_OK};
            connection_send_method(connection, 0, &ok);
            return;
        }
        break;
    case METHOD_CONNECTION_BLOCKED:
    case METHOD_CONNECTION_UNBLOCKED:
        break;
    default:
        break;
    }
    connection_fail(connection, REPLY_CHANNEL_ERROR, m->id,
                    "unexpected method in connection state %s", state_name(state));
}

static void handle_frame(struct connection *connection, const struct frame *frame)
{
    if (frame->type == FRAME_HEARTBEAT)
        return;
    if (frame->channel == 0) {
        if (frame->type != FRAME_METHOD) {
            char octets[320];
            connection__format_binary(octets, sizeof octets, frame->payload, frame->size);
            connection_fail(connection, REPLY_UNEXPECTED_FRAME, 0, "type %u, all octets = %s",
                            frame->type, octets);
            return;
        }
        struct method m;
        if (!connection__decode_method(connection, frame, &m))
            return;
        if (METHOD_CLASS_ID(m.id) != CLASS_CONNECTION) {
            connection_fail(connection, REPLY_CHANNEL_ERROR, m.id,
                            "unexpected method in connection state %s",
                            state_name(connection->state));
            return;
        }
        handle_connection_method(connection, &m);
        return;
    }
    if (connection->state == CONNECTION_STATE_CLOSING || connection->close_ok_owed > 0)
        return; /* discard everything after our connection.close, or theirs */
    if (connection->state != CONNECTION_STATE_OPEN) {
        connection_fail(connection, REPLY_COMMAND_INVALID, 0,
                        "channel %u used before connection.open", frame->channel);
        return;
    }
    if (frame->channel > connection->channel_max) {
        /* The spec's rule (usable numbers are 1..channel-max), which
         * RabbitMQ does not apply: a high number would also make the
         * channel table as large as the number. */
        connection_fail(connection, REPLY_CHANNEL_ERROR, 0,
                        "channel %u is above the negotiated channel_max (%u)", frame->channel,
                        connection->channel_max);
        return;
    }
    struct channel *ch = frame->channel < connection->channels_cap
                             ? connection->channels[frame->channel]
                             : NULL;
    if (!ch) {
        channel_handle_unopened(connection, frame);
        return;
    }
    channel_handle_frame(ch, frame);
}

static long on_input(struct conn *conn, const uint8_t *data, size_t size)
{
    struct connection *connection = from_conn(conn);
    size_t used = 0;
    if (connection->state == CONNECTION_STATE_HEADER) {
        long n = handle_protocol_header(connection, data, size);
        if (n <= 0)
            return n;
        used = (size_t)n;
    }
    uint16_t content_channel = 0; /* of the last content frame */
    while (used < size && !conn->closing && connection->state != CONNECTION_STATE_CLOSED &&
           connection->held == 0) {
        if (connection->split.active) {
            content_channel = connection->split.channel;
            long taken = connection__split_input(connection, data + used, size - used);
            if (taken < 0) { /* a bad end octet: as after a bad frame, below */
                conn_pause_reading(conn, CONN_PAUSE_CLOSING);
                return (long)size;
            }
            used += (size_t)taken;
            continue;
        }
        struct frame frame;
        size_t need = 0;
        int n = frame_parse(&connection->reader, data + used, size - used, &frame, &need);
        if (n == 0) {
            /* A large body frame not all in: read straight into its
             * message (connection_body.c), else kept until it is. */
            used += connection__split_begin(connection, data + used, size - used);
            conn->in_need = need;
            break;
        }
        if (n < 0) {
            fail_bad_frame(connection, data + used, size - used);
            /* Nothing after a bad frame can be trusted: drop the rest. */
            conn_pause_reading(conn, CONN_PAUSE_CLOSING);
            return (long)size;
        }
        used += (size_t)n;
        conn->in_units++;
        connection->input_rest = data + used;
        connection->input_rest_size = size - used;
        handle_frame(connection, &frame);
        if (frame.type == FRAME_HEADER || frame.type == FRAME_BODY)
            content_channel = frame.channel;
    }
    connection->input_rest = NULL;
    connection->input_rest_size = 0;
    if (content_channel != 0 && !conn->closing)
        connection__expect_body(connection, content_channel);
    return (long)used;
}

uint64_t connection__body_ahead(const struct connection *connection, uint16_t channel)
{
    const uint8_t *p = connection->input_rest;
    size_t left = connection->input_rest_size;
    uint32_t payload_max = connection->reader.frame_max - FRAME_OVERHEAD;
    uint64_t ahead = 0;
    while (left >= FRAME_HEADER_SIZE && p[0] == FRAME_BODY &&
           (uint16_t)(p[1] << 8 | p[2]) == channel) {
        uint32_t size = (uint32_t)p[3] << 24 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 8 | p[6];
        if (size > payload_max)
            break; /* a bad frame: the reader will say so */
        if (size >= left - FRAME_HEADER_SIZE)
            return ahead + (left - FRAME_HEADER_SIZE); /* cut: what is here of it */
        ahead += size;
        p += FRAME_OVERHEAD + (size_t)size; /* size < left - 7: its end octet is here */
        left -= FRAME_OVERHEAD + (size_t)size;
    }
    return ahead;
}

void connection_flow(struct connection *connection)
{
    if (connection->flow)
        return;
    connection->flow = true;
    conn_pause_reading(&connection->conn, CONN_PAUSE_FLOW);
}

void connections_flow_resume(struct broker *broker)
{
    list_for_each(n, &broker->connections) {
        struct connection *c = CONTAINER_OF(n, struct connection, broker_link);
        if (!c->flow)
            continue;
        c->flow = false;
        conn_resume_reading(&c->conn, CONN_PAUSE_FLOW);
    }
}

void connection_hold(struct connection *connection)
{
    if (connection->held++ == 0)
        conn_hold_input(&connection->conn);
}

void connection_release(struct connection *connection)
{
    ASSERT(connection->held > 0);
    if (--connection->held == 0)
        conn_release_input(&connection->conn);
}

/* ---- timers --------------------------------------------------------- */

/* An open connection we do not read (blocked by an alarm, in flow, or
 * its output unread) would never see its peer's close, which waits
 * behind its unread input: it would hold its channels, queues and
 * half-received messages for ever, and with them maybe the alarm that
 * blocked it. The kernel is asked instead, once a second. True if the
 * peer is gone (the connection is closed: its memory is released). */
static bool unread_peer_gone(struct connection *connection, uint64_t now_ms)
{
    struct conn *conn = &connection->conn;
    if (now_ms - connection->peer_checked_ms < PEER_CHECK_MS)
        return false;
    connection->peer_checked_ms = now_ms;
    uint64_t quiet_ms;
    if (!conn_peer_gone(conn, &quiet_ms)) {
        connection->peer_heard_ms = now_ms > quiet_ms ? now_ms - quiet_ms : 0;
        return false;
    }
    LOG_INFO("conn=%llu peer=%s gone while not read (%s): closing",
             (unsigned long long)conn->id, conn->peer_name,
             connection->blocked ? "blocked" : connection->flow ? "flow" : "paused");
    connection->state = CONNECTION_STATE_CLOSED;
    conn_close(conn);
    return true;
}

/* Bytes that moved since the connection's newest sample put it back on the
 * broker's active list (rates.h). Checked here, in the walk its heartbeats
 * need every tick anyway, rather than on every read and write (net/ knows
 * nothing of rates); the tick samples after this walk (broker.c). */
static void rates_check(struct connection *connection)
{
    const struct rates *r = &connection->rates;
    if (rates_listed(r))
        return;
    if ((uint32_t)connection->conn.bytes_in != r->newest[CONNECTION_RATE_RECV_OCT] ||
        (uint32_t)connection->conn.bytes_out != r->newest[CONNECTION_RATE_SEND_OCT])
        rates_join(&connection->broker->connections_active, &connection->rates);
}

void connection_tick(struct connection *connection, uint64_t now_ms)
{
    struct conn *conn = &connection->conn;
    rates_check(connection);
    if (conn->closing)
        return;
    switch (connection->state) {
    case CONNECTION_STATE_OPEN:
        break;
    case CONNECTION_STATE_CLOSING:
        if (now_ms - connection->closing_since_ms > CLOSE_OK_TIMEOUT_MS)
            conn_close(conn);
        return;
    case CONNECTION_STATE_CLOSED:
        return;
    default:
        uint32_t timeout_ms = connection->broker->config.limits.handshake_timeout_ms;
        if (now_ms - connection->started_ms <= timeout_ms)
            return;
        if (connection->open_waits_for_sync) {
            connection->open_waits_for_sync = false;
            connection_release(connection);
            connection_fail(connection, REPLY_INTERNAL_ERROR, METHOD_CONNECTION_OPEN,
                            "this broker has not caught up with the cluster map: try another");
            return;
        }
        LOG_INFO("conn=%llu peer=%s handshake timeout", (unsigned long long)conn->id,
                 conn->peer_name);
        conn_close(conn);
        return;
    }
    if (!conn->reading && unread_peer_gone(connection, now_ms))
        return;
    if (now_ms - conn->last_read_ms >= IDLE_TRIM_MS && now_ms - conn->last_write_ms >= IDLE_TRIM_MS)
        conn_trim_idle(conn);
    if (connection->heartbeat_s == 0)
        return;
    uint64_t interval_ms = (uint64_t)connection->heartbeat_s * 1000;
    /* Unread, its heartbeats wait in the kernel, which vouches for it
     * (also in the moment after it is read again, before a read). */
    uint64_t heard_ms = conn->last_read_ms;
    if (connection->peer_heard_ms > heard_ms)
        heard_ms = connection->peer_heard_ms;
    /* Two missed heartbeats (plus slack for the tick) mean a dead peer. */
    if (now_ms - heard_ms > interval_ms * 2) {
        LOG_INFO("conn=%llu peer=%s missed heartbeats, closing", (unsigned long long)conn->id,
                 conn->peer_name);
        conn_close(conn);
        return;
    }
    if (now_ms - conn->last_write_ms >= interval_ms / 2 && conn->out_bytes == 0) {
        uint8_t *out = conn_out_reserve(conn, FRAME_OVERHEAD);
        conn_out_commit(conn, frame_write_heartbeat(out, FRAME_OVERHEAD));
    }
}
