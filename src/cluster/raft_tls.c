/*
 * raft_tls.c: a tunnel between a plaintext socketpair end and a TLS
 * connection, under the Raft transport (see raft_tls.h).
 */
#include "cluster/raft_tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <raft.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/log.h"
#include "net/conn.h"
#include "net/tls.h"

/* What was written to the plaintext end and not taken yet, beyond which
 * the TLS side is not read. */
#define TUNNEL_PENDING_HIGH (1u << 20)
#define TUNNEL_PENDING_LOW (256u << 10)
#define TUNNEL_READ_SIZE (64u << 10)

struct tunnel {
    struct conn conn;        /* first: conn callbacks cast back; the TLS side */
    uv_pipe_t end;           /* our end of the socketpair */
    bool end_open;           /* end was initialized (make_ends) */
    bool conn_freed;         /* conn's on_free ran */
    bool end_closed;         /* end's close callback ran */
    bool end_closing;
    bool end_reading;
    size_t pending;          /* written to end, not completed */
    uint8_t buf[TUNNEL_READ_SIZE];
};

struct tunnel_write {
    uv_write_t req;
    struct tunnel *tunnel;
    size_t size;
    uint8_t data[];
};

static struct tunnel *from_conn(struct conn *conn)
{
    return (struct tunnel *)conn;
}

static void maybe_free(struct tunnel *t)
{
    if (t->conn_freed && (!t->end_open || t->end_closed))
        free(t);
}

static void on_end_closed(uv_handle_t *handle)
{
    struct tunnel *t = handle->data;
    t->end_closed = true;
    maybe_free(t);
}

static void close_end(struct tunnel *t)
{
    if (!t->end_open || t->end_closing)
        return;
    t->end_closing = true;
    uv_close((uv_handle_t *)&t->end, on_end_closed);
}

/* ---- plaintext end -> TLS ------------------------------------------- */

static void end_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct tunnel *t = handle->data;
    *buf = uv_buf_init((char *)t->buf, sizeof t->buf);
}

static void end_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    struct tunnel *t = stream->data;
    if (nread == 0)
        return;
    if (nread < 0) {
        /* libraft (or the handshake) closed its end: the peer is told. */
        uv_read_stop(stream);
        t->end_reading = false;
        if (!t->conn.closing)
            conn_close_after_flush(&t->conn);
        close_end(t);
        return;
    }
    if (t->conn.closing)
        return;
    conn_out_bytes(&t->conn, t->buf, (size_t)nread);
    if (conn_out_full(&t->conn)) {
        uv_read_stop(stream);
        t->end_reading = false; /* until on_drain */
    }
}

static void end_read(struct tunnel *t)
{
    if (t->end_reading || t->end_closing)
        return;
    if (uv_read_start((uv_stream_t *)&t->end, end_alloc, end_on_read) == 0)
        t->end_reading = true;
}

static void conn_drained(struct conn *conn)
{
    end_read(from_conn(conn));
}

/* ---- TLS -> plaintext end ------------------------------------------- */

static void on_end_written(uv_write_t *req, int status)
{
    struct tunnel_write *w = CONTAINER_OF(req, struct tunnel_write, req);
    struct tunnel *t = w->tunnel;
    ASSERT(t->pending >= w->size);
    t->pending -= w->size;
    free(w);
    if (status != 0) {
        if (!t->conn.closing)
            conn_close(&t->conn);
        close_end(t);
        return;
    }
    if (!t->conn.closing && (t->conn.read_pauses & CONN_PAUSE_TUNNEL) &&
        t->pending <= TUNNEL_PENDING_LOW)
        conn_resume_reading(&t->conn, CONN_PAUSE_TUNNEL);
}

static long conn_input(struct conn *conn, const uint8_t *data, size_t size)
{
    struct tunnel *t = from_conn(conn);
    if (t->end_closing)
        return (long)size; /* nobody to give it to: the close follows */
    size_t done = 0;
    if (t->pending == 0) {
        uv_buf_t buf = uv_buf_init((char *)data, (unsigned)size);
        int n = uv_try_write((uv_stream_t *)&t->end, &buf, 1);
        if (n > 0)
            done = (size_t)n;
    }
    if (done < size) {
        size_t rest = size - done;
        struct tunnel_write *w = xmalloc(sizeof *w + rest);
        w->tunnel = t;
        w->size = rest;
        memcpy(w->data, data + done, rest);
        uv_buf_t buf = uv_buf_init((char *)w->data, (unsigned)rest);
        if (uv_write(&w->req, (uv_stream_t *)&t->end, &buf, 1, on_end_written) != 0) {
            free(w);
            conn_close(conn);
            close_end(t);
            return -1;
        }
        t->pending += rest;
        if (t->pending > TUNNEL_PENDING_HIGH)
            conn_pause_reading(conn, CONN_PAUSE_TUNNEL);
    }
    return (long)size;
}

static void conn_closed(struct conn *conn)
{
    /* The peer or the TLS handshake is gone: libraft sees its end close. */
    close_end(from_conn(conn));
}

static void conn_freed(struct conn *conn)
{
    struct tunnel *t = from_conn(conn);
    t->conn_freed = true;
    maybe_free(t);
}

static const struct conn_ops tunnel_conn_ops = {
    .on_input = conn_input,
    .on_close = conn_closed,
    .on_free = conn_freed,
    .on_drain = conn_drained,
};

/* ---- set-up ---------------------------------------------------------- */

/* The socketpair: our end opened in t->end, the other in a raft_malloc'd
 * pipe for the caller. */
static int make_ends(struct tunnel *t, uv_loop_t *loop, uv_stream_t **stream)
{
    uv_os_sock_t fds[2];
    int rc = uv_socketpair(SOCK_STREAM, 0, fds, UV_NONBLOCK_PIPE, UV_NONBLOCK_PIPE);
    if (rc != 0)
        return rc;
    uv_pipe_t *theirs = raft_malloc(sizeof *theirs);
    ASSERT(theirs != NULL);
    uv_pipe_init(loop, &t->end, 0);
    uv_pipe_init(loop, theirs, 0);
    t->end.data = t;
    t->end_open = true;
    if ((rc = uv_pipe_open(&t->end, fds[0])) != 0 || (rc = uv_pipe_open(theirs, fds[1])) != 0) {
        LOG_ERROR("cluster transport: a TLS tunnel's socketpair: %s", uv_strerror(rc));
        ASSERT(!"uv_pipe_open of a fresh socketpair failed");
    }
    *stream = (uv_stream_t *)theirs;
    return 0;
}

static struct tunnel *tunnel_alloc(void)
{
    struct tunnel *t = xcalloc(1, sizeof *t);
    return t;
}

static void on_connected(struct conn *conn, int status)
{
    struct tunnel *t = from_conn(conn);
    if (status != 0) {
        LOG_DEBUG("cluster transport: TLS connect to %s: %s", conn->peer_name,
                  uv_strerror(status));
        return; /* the transport closes conn: conn_closed closes the end */
    }
    end_read(t);
}

int raft_tls_dial(const struct raft_tls *tls, uv_loop_t *loop, const struct sockaddr *addr,
                  uv_stream_t **stream)
{
    struct tunnel *t = tunnel_alloc();
    int rc = conn_connect(&t->conn, tls->net, &tunnel_conn_ops, addr, on_connected);
    if (rc != 0) {
        free(t);
        return rc;
    }
    t->conn.peer_reads_always = true; /* the other end is a broker: see conn.h */
    if (conn_tls_connect(&t->conn, tls->client) != 0 || make_ends(t, loop, stream) != 0) {
        conn_close(&t->conn);
        return UV_ENOMEM;
    }
    net_tcp_user_timeout(&t->conn.tcp, 3000);
    return 0;
}

int raft_tls_accept(const struct raft_tls *tls, uv_loop_t *loop, uv_stream_t *server,
                    uv_stream_t **stream, char *peer, size_t peer_size)
{
    struct tunnel *t = tunnel_alloc();
    int rc = conn_init(&t->conn, tls->net, &tunnel_conn_ops);
    if (rc != 0) {
        free(t);
        return rc;
    }
    t->conn.peer_reads_always = true;
    if ((rc = uv_accept(server, (uv_stream_t *)&t->conn.tcp)) != 0 ||
        (rc = conn_tls_accept(&t->conn, tls->server) != 0 ? UV_ENOMEM : 0) != 0 ||
        (rc = make_ends(t, loop, stream)) != 0) {
        conn_close(&t->conn);
        return rc;
    }
    conn_start(&t->conn);
    net_tcp_user_timeout(&t->conn.tcp, 3000);
    snprintf(peer, peer_size, "%s", t->conn.peer_name);
    end_read(t);
    return 0;
}
