/*
 * conn.c: see conn.h. The write path is the broker's hottest loop after
 * the frame parser: chunks are appended during callbacks, and the check
 * phase turns each connection's pending chunks into one uv_try_write
 * (a writev) and, for what the kernel did not take, one uv_write.
 */
#include "net/conn.h"
#include "net/conn_int.h"
#include "net/tls.h"

#include <arpa/inet.h>
#include <assert.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/log.h"

#define SCRATCH_SIZE (256u << 10)
#define IN_SCRATCH_MAX_SIZE (16u << 10) /* a partial frame this small is read in scratch */
#define IN_READ_MORE_SIZE (64u << 10)   /* a larger one's read: this much room beyond it */
static_assert(IN_SCRATCH_MAX_SIZE <= SCRATCH_SIZE / 2, "a read behind a partial frame is large");
/* The read after a filled sink: the end of that frame and the frames
 * before the next body (a publish's method and content header) fit, and
 * little of the next body is read in with them. */
#define SINK_PEEK_SIZE (4u << 10)
#define CHUNK_DATA_SIZE (16u << 10)
#define IOV_BATCH 64

static void on_flush_check(uv_check_t *check);
static void on_flush_idle(uv_idle_t *idle);
static void on_resume_idle(uv_idle_t *idle);
static void schedule_flush(struct conn *conn);

void net_init(struct net *net, uv_loop_t *loop)
{
    memset(net, 0, sizeof *net);
    net->loop = loop;
    list_init(&net->flush_list);
    list_init(&net->flush_hooks);
    list_init(&net->resume_list);
    list_init(&net->conns);
    net->scratch_size = SCRATCH_SIZE;
    net->read_share = NET_READ_SHARE_DEFAULT;
    net->scratch = xmalloc(SCRATCH_SIZE);
    net->next_conn_id = 1;
    pool_init(&net->data_chunks, "output chunk", sizeof(struct out_chunk) + CHUNK_DATA_SIZE, 16);
    pool_init(&net->ref_chunks, "output reference", sizeof(struct out_chunk), 256);
    uv_check_init(loop, &net->flush_check);
    net->flush_check.data = net;
    uv_check_start(&net->flush_check, on_flush_check);
    uv_unref((uv_handle_t *)&net->flush_check);
    uv_idle_init(loop, &net->flush_idle);
    net->flush_idle.data = net;
    uv_idle_init(loop, &net->resume_idle);
    net->resume_idle.data = net;
    read_batch_init(&net->read_batch, loop);
    loop_lag_init(&net->loop_lag, loop);
}

void net_close(struct net *net)
{
    list_for_each_safe(node, &net->conns) {
        conn_close(CONTAINER_OF(node, struct conn, all_link));
    }
    uv_check_stop(&net->flush_check);
    uv_close((uv_handle_t *)&net->flush_check, NULL);
    uv_idle_stop(&net->flush_idle);
    uv_close((uv_handle_t *)&net->flush_idle, NULL);
    uv_idle_stop(&net->resume_idle);
    uv_close((uv_handle_t *)&net->resume_idle, NULL);
    read_batch_close(&net->read_batch);
    free(net->scratch);
    net->scratch = NULL;
}

void net_free(struct net *net)
{
    /* Every chunk came back: no connection holds output any more. */
    pool_destroy(&net->data_chunks);
    pool_destroy(&net->ref_chunks);
}

int conn_init(struct conn *conn, struct net *net, const struct conn_ops *ops)
{
    memset(conn, 0, sizeof *conn);
    int rc = uv_tcp_init(net->loop, &conn->tcp);
    if (rc != 0)
        return rc;
    conn->tcp.data = conn;
    conn->net = net;
    conn->ops = ops;
    conn->id = net->next_conn_id++;
    list_init(&conn->out_chunks);
    list_init(&conn->flush_link);
    list_init(&conn->resume_link);
    list_init(&conn->batch_link);
    list_push_back(&net->conns, &conn->all_link);
    net->conns_count++;
    conn->last_read_ms = conn->last_write_ms = uv_now(net->loop);
    return 0;
}

/* An address's numeric host, into host, and its port; "?" and 0 for a
 * family other than IPv4's and IPv6's. */
static int address_parts(const struct sockaddr_storage *ss, char *host, size_t size)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
        uv_ip4_name(sin, host, size);
        return ntohs(sin->sin_port);
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;
        uv_ip6_name(sin6, host, size);
        return ntohs(sin6->sin6_port);
    }
    snprintf(host, size, "?");
    return 0;
}

static void set_peer_name(struct conn *conn)
{
    struct sockaddr_storage ss = {.ss_family = AF_UNSPEC};
    int len = sizeof ss;
    char host[INET6_ADDRSTRLEN];
    if (uv_tcp_getpeername(&conn->tcp, (struct sockaddr *)&ss, &len) != 0)
        ss.ss_family = AF_UNSPEC;
    int port = address_parts(&ss, host, sizeof host);
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)&ss;
        conn->peer_loopback = (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)&ss;
        static const uint8_t v4mapped_loop[13] = {0, 0, 0, 0, 0,    0,   0,
                                                  0, 0, 0, 0xff, 0xff, 127};
        conn->peer_loopback = IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr) ||
                              memcmp(&sin6->sin6_addr, v4mapped_loop, 13) == 0;
    }
    snprintf(conn->peer_name, sizeof conn->peer_name, "%s:%d", host, port);
}

/* "ip:port" of the local end, "[ip]:port" for IPv6 (as RabbitMQ names a
 * connection's end): fixed once connected, so read once, not by every
 * management list that names the connection. */
static void set_local_name(struct conn *conn)
{
    struct sockaddr_storage ss = {.ss_family = AF_UNSPEC};
    int len = sizeof ss;
    char host[INET6_ADDRSTRLEN];
    if (uv_tcp_getsockname(&conn->tcp, (struct sockaddr *)&ss, &len) != 0)
        ss.ss_family = AF_UNSPEC;
    int port = address_parts(&ss, host, sizeof host);
    snprintf(conn->local_name, sizeof conn->local_name,
             ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, port);
}

/* ---- outbound ------------------------------------------------------- */

/* One conn_connect in flight. Freed by whichever libuv callback ends it:
 * the connect callback, or the timer that reports a connect that failed
 * at once (so that connected() never runs inside conn_connect). */
struct connect_req {
    uv_connect_t req;
    uv_timer_t defer;
    struct conn *conn;            /* NULL once conn_close came first */
    conn_connected_fn connected;
    int status;                   /* the error of a connect that failed at once */
};

static void connect_done(struct connect_req *cr, int status)
{
    struct conn *conn = cr->conn;
    if (conn == NULL)
        return; /* cancelled by conn_close: the protocol already knows */
    ASSERT(conn->connect_req == cr);
    ASSERT(!conn->closing);
    conn->connect_req = NULL;
    if (status == 0)
        conn_start(conn);
    cr->connected(conn, status);
    if (status < 0)
        conn_close(conn);
}

static void on_connect(uv_connect_t *req, int status)
{
    struct connect_req *cr = CONTAINER_OF(req, struct connect_req, req);
    connect_done(cr, status);
    free(cr);
}

static void on_connect_defer_closed(uv_handle_t *handle)
{
    free(handle->data);
}

static void on_connect_failed_at_once(uv_timer_t *timer)
{
    struct connect_req *cr = timer->data;
    connect_done(cr, cr->status);
    uv_close((uv_handle_t *)timer, on_connect_defer_closed);
}

int conn_connect(struct conn *conn, struct net *net, const struct conn_ops *ops,
                 const struct sockaddr *addr, conn_connected_fn connected)
{
    ASSERT(addr != NULL);
    ASSERT(connected != NULL);
    int rc = conn_init(conn, net, ops);
    if (rc != 0)
        return rc;
    struct connect_req *cr = xcalloc(1, sizeof *cr);
    cr->conn = conn;
    cr->connected = connected;
    conn->connect_req = cr;
    rc = uv_tcp_connect(&cr->req, &conn->tcp, addr, on_connect);
    if (rc != 0) {
        /* No socket, no route: reported from the loop like a refusal. */
        cr->status = rc;
        uv_timer_init(net->loop, &cr->defer);
        cr->defer.data = cr;
        uv_timer_start(&cr->defer, on_connect_failed_at_once, 0, 0);
    }
    return 0;
}

/* ---- input ---------------------------------------------------------- */

/*
 * The turn's share. libuv reads a readable socket until it runs dry, up to
 * 32 reads (8 MiB of our scratch buffer) in one callback, so a publisher
 * that never waits (a flood into a queue nobody consumes) could be read
 * for tens of milliseconds each loop turn while every other connection,
 * and the output queued to them, waits behind it: a publisher that waits
 * for its confirms, or a consumer for its deliveries, then gets a turn
 * every few dozen milliseconds. Once a client's connection has been read
 * net.read_share bytes in a turn, while others read too (in this turn or
 * the last), the allocator gives it no buffer: libuv
 * passes UV_ENOBUFS and goes on with the turn, and the socket, readable
 * still (epoll is level-triggered), is read again in the next turn, after
 * everyone else's input and after the output flush. No system call, no
 * state beyond a counter: a share costs nothing until it is spent.
 */
bool conn__turn_spent(struct conn *conn)
{
    struct net *net = conn->net;
    if (net->read_share == 0 || !conn->ops->share_turns || conn->turn_at != net->turn ||
        conn->turn_bytes < net->read_share)
        return false;
    /* Alone (no other connection read in this turn or the last), it may
     * have the loop: more turns would only cost it writes. */
    if (net->turn_readers < 2 && net->last_turn_readers < 2)
        return false;
    net->reads_deferred++;
    return true;
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    struct conn *conn = handle->data;
    (void)suggested;
    if (conn__turn_spent(conn)) {
        conn->sink_read = false;
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    conn->sink_read = conn->sink_size > 0;
    if (conn->sink_read) {
        ASSERT(conn->in_size == 0); /* the protocol took all before it set the sink */
        ASSERT(conn->sink_size < (1u << 30));
        *buf = uv_buf_init((char *)conn->sink, (unsigned)(conn->sink_size + conn->sink_tail));
        return;
    }
    if (conn->in_size == 0) {
        /* Nothing pending: read into the shared scratch buffer (a short
         * read after a sink, see SINK_PEEK_SIZE). */
        size_t size = conn->read_short ? SINK_PEEK_SIZE : conn->net->scratch_size;
        *buf = uv_buf_init((char *)conn->net->scratch, (unsigned)size);
        return;
    }
    if (conn->in_size <= IN_SCRATCH_MAX_SIZE) {
        /* A small partial frame goes back in front of the scratch buffer:
         * the read that completes it is as large as any, and the
         * connection keeps no room for it beyond its bytes (7 bytes that
         * announce a 128 KiB frame do not hold 128 KiB). on_read knows
         * the read by where it landed. */
        memcpy(conn->net->scratch, conn->in, conn->in_size);
        *buf = uv_buf_init((char *)conn->net->scratch + conn->in_size,
                           (unsigned)(conn->net->scratch_size - conn->in_size));
        return;
    }
    /* A large one: 64 KiB more, or toward the whole frame by doubling
     * what arrived (at most twice what a peer sent is held for it). */
    size_t want = conn->in_size + IN_READ_MORE_SIZE;
    if (want < conn->in_need) {
        if (want < conn->in_size * 2)
            want = conn->in_size * 2;
        if (want > conn->in_need)
            want = conn->in_need;
    }
    if (conn->in_cap < want) {
        uint8_t *grown = xrealloc(conn->in, want);
        conn->in = grown;
        conn->in_cap = want;
    }
    *buf = uv_buf_init((char *)conn->in + conn->in_size, (unsigned)(conn->in_cap - conn->in_size));
}

static void keep_leftover(struct conn *conn, const uint8_t *data, size_t size)
{
    if (size == 0) {
        free(conn->in);
        conn->in = NULL;
        conn->in_size = conn->in_cap = 0;
        return;
    }
    if (data != conn->in) {
        if (conn->in_cap < size) {
            size_t cap = size < 4096 ? 4096 : size;
            uint8_t *grown = xrealloc(conn->in, cap);
            conn->in = grown;
            conn->in_cap = cap;
        }
        memmove(conn->in, data, size);
    }
    conn->in_size = size;
}

void conn__keep_leftover(struct conn *conn, const uint8_t *data, size_t size)
{
    keep_leftover(conn, data, size);
}

void conn__after_input(struct conn *conn, size_t nread)
{
    if (conn->out_bytes >= CONN_OUT_READ_PAUSE && !conn->peer_reads_always)
        conn_pause_reading(conn, CONN_PAUSE_OUTPUT);
    /* Large bodies are read by sinks, a body per read: not batched by a
     * low-water mark, which would only add system calls (and the short
     * read right after a sink would look like a dense stream). */
    if (conn->sink_size > 0 || conn->read_short)
        read_batch_drop(&conn->net->read_batch, conn);
    else
        read_batch_after_read(&conn->net->read_batch, conn, nread);
}

bool conn__read_arrived(struct conn *conn, ssize_t nread)
{
    if (nread == UV_ENOBUFS)
        return false; /* conn__turn_spent: the socket is read next turn */
    if (nread < 0) {
        if (nread != UV_EOF)
            LOG_DEBUG("conn=%llu peer=%s read error: %s", (unsigned long long)conn->id,
                      conn->peer_name, uv_strerror((int)nread));
        conn_close(conn);
        return false;
    }
    if (nread == 0 || conn->closing)
        return false;
    conn->net->bytes_in += (uint64_t)nread;
    conn->bytes_in += (uint64_t)nread;
    conn->net->reads++;
    if (conn->turn_at != conn->net->turn) {
        conn->turn_at = conn->net->turn;
        conn->turn_bytes = 0;
        conn->net->turn_readers++;
    }
    conn->turn_bytes += (size_t)nread;
    conn->last_read_ms = uv_now(conn->net->loop);
    return true;
}

bool conn_sink(struct conn *conn, uint8_t *dst, size_t size, size_t tail)
{
    ASSERT(size > 0);
    ASSERT(conn->sink_size == 0);
    if (conn->tls != NULL || conn->closing)
        return false;
    conn->sink = dst;
    conn->sink_size = size;
    conn->sink_tail = tail < SINK_PEEK_SIZE ? tail : SINK_PEEK_SIZE;
    return true;
}

void conn_read_short(struct conn *conn)
{
    if (conn->tls == NULL) /* TLS reads ciphertext: its own sizes */
        conn->read_short = true;
}

void conn_sink_cancel(struct conn *conn)
{
    conn->sink = NULL;
    conn->sink_size = 0;
    conn->sink_tail = 0;
}

/* Input for the protocol; what it does not take is kept. */
static void offer(struct conn *conn, const uint8_t *data, size_t size)
{
    long used = conn->ops->on_input(conn, data, size);
    if (used < 0 || conn->closing)
        return;
    ASSERT((size_t)used <= size);
    ASSERT(conn->sink_size == 0 || (size_t)used == size);
    keep_leftover(conn, data + used, size - (size_t)used);
}

/* A read into the sink. Bytes beyond it (in the tail) are the input that
 * follows: moved to the scratch buffer first (on_sink may free the
 * sink's memory: a complete message is routed), then offered as input. */
static void sink_read(struct conn *conn, size_t nread)
{
    size_t sunk = nread < conn->sink_size ? nread : conn->sink_size;
    size_t extra = nread - sunk;
    ASSERT(extra <= conn->sink_tail);
    if (extra > 0)
        memcpy(conn->net->scratch, conn->sink + sunk, extra);
    conn->sink += sunk;
    conn->sink_size -= sunk;
    if (conn->sink_size == 0) {
        conn->sink = NULL;
        conn->sink_tail = 0;
        conn->read_short = true;
    }
    conn->ops->on_sink(conn, sunk);
    if (conn->closing)
        return;
    if (extra > 0) {
        offer(conn, conn->net->scratch, extra);
        if (conn->closing)
            return;
    }
    conn__after_input(conn, nread);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *conn = stream->data;
    bool into_sink = conn->sink_read;
    conn->sink_read = false;
    if (!conn__read_arrived(conn, nread))
        return;
    if (into_sink) {
        ASSERT((uint8_t *)buf->base == conn->sink);
        sink_read(conn, (size_t)nread);
        return;
    }
    conn->read_short = false;
    const uint8_t *data;
    size_t size;
    if (conn->in_size > 0 && (uint8_t *)buf->base == conn->net->scratch + conn->in_size) {
        /* Behind a copy of the partial frame (on_alloc): conn->in keeps
         * the original until keep_leftover replaces it. */
        data = conn->net->scratch;
        size = conn->in_size + (size_t)nread;
    } else if (conn->in_size > 0) {
        ASSERT((uint8_t *)buf->base == conn->in + conn->in_size);
        conn->in_size += (size_t)nread;
        data = conn->in;
        size = conn->in_size;
    } else {
        data = (const uint8_t *)buf->base;
        size = (size_t)nread;
    }
    offer(conn, data, size);
    if (conn->closing)
        return;
    /* A peer that does not read what we send (confirms, returns, replies)
     * is not read from either, so its output cannot grow without bound. */
    conn__after_input(conn, (size_t)nread);
}

void net_tcp_user_timeout(uv_tcp_t *tcp, unsigned ms)
{
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)tcp, &fd) == 0)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
}

bool conn_peer_gone(struct conn *conn, uint64_t *quiet_ms)
{
    *quiet_ms = 0;
    uv_os_fd_t fd;
    if (conn->closing || uv_fileno((const uv_handle_t *)&conn->tcp, &fd) != 0)
        return false; /* nothing to ask about: the caller's close is under way */
    struct tcp_info info;
    socklen_t size = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0 ||
        size < offsetof(struct tcp_info, tcpi_last_ack_recv) + sizeof info.tcpi_last_ack_recv)
        return false; /* no word from the kernel: assume the best */
    if (info.tcpi_state != TCP_ESTABLISHED)
        return true; /* CLOSE_WAIT: its FIN came; CLOSE: reset, or keepalive gave up */
    uint32_t quiet = info.tcpi_last_data_recv < info.tcpi_last_ack_recv
                         ? info.tcpi_last_data_recv
                         : info.tcpi_last_ack_recv;
    *quiet_ms = quiet;
    return false;
}

void conn_keepalive(struct conn *conn, unsigned idle_s)
{
    if (conn->keepalive || conn->closing)
        return;
    conn->keepalive = true;
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&conn->tcp, &fd) != 0)
        return;
    /* Three probes ten seconds apart: a vanished host is let go about
     * idle_s + 30 s after it fell silent. */
    int on = 1, idle = (int)idle_s, interval = 10, count = 3;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

/* TLS connections read through conn_tls.c, which decrypts first. */
static void start_reading(struct conn *conn)
{
    conn->reading = true;
    if (conn->tls == NULL)
        uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read);
    else
        uv_read_start((uv_stream_t *)&conn->tcp, conn__tls_alloc, conn__tls_read);
}

void conn_start(struct conn *conn)
{
    set_peer_name(conn);
    set_local_name(conn);
    uv_tcp_nodelay(&conn->tcp, 1);
    start_reading(conn);
}

int conn_tls_accept(struct conn *conn, struct tls_context *tls)
{
    ASSERT(conn->tls == NULL);
    conn->tls = tls_session_new(tls, false, NULL);
    return conn->tls != NULL ? 0 : -1;
}

void conn_trim_idle(struct conn *conn)
{
    if (conn->tls != NULL && !conn->closing)
        tls_session_trim(conn->tls);
}

int conn_tls_connect(struct conn *conn, struct tls_context *tls)
{
    ASSERT(conn->tls == NULL);
    ASSERT(!conn->reading); /* before the connect completed */
    conn->tls = tls_session_new(tls, true, NULL);
    return conn->tls != NULL ? 0 : -1;
}

void conn_pause_reading(struct conn *conn, enum conn_pause reason)
{
    conn->read_pauses |= reason;
    read_batch_drop(&conn->net->read_batch, conn);
    if (conn->reading && !conn->closing) {
        uv_read_stop((uv_stream_t *)&conn->tcp);
        conn->reading = false;
    }
}

void conn_resume_reading(struct conn *conn, enum conn_pause reason)
{
    conn->read_pauses &= ~(uint32_t)reason;
    if (conn->read_pauses == 0 && !conn->reading && !conn->closing)
        start_reading(conn);
}

void conn_hold_input(struct conn *conn)
{
    conn_pause_reading(conn, CONN_PAUSE_HOLD);
}

void conn_release_input(struct conn *conn)
{
    if (conn->closing)
        return;
    conn_resume_reading(conn, CONN_PAUSE_HOLD);
    if (conn->in_size == 0 || list_linked(&conn->resume_link))
        return;
    if (list_empty(&conn->net->resume_list))
        uv_idle_start(&conn->net->resume_idle, on_resume_idle);
    list_push_back(&conn->net->resume_list, &conn->resume_link);
}

/* Offers held input again. An idle handle keeps the loop from blocking in
 * poll while input waits, and runs outside whatever callback released it. */
static void on_resume_idle(uv_idle_t *idle)
{
    struct net *net = idle->data;
    while (!list_empty(&net->resume_list)) {
        struct conn *conn = CONTAINER_OF(net->resume_list.next, struct conn, resume_link);
        list_remove(&conn->resume_link);
        if (conn->closing || (conn->read_pauses & CONN_PAUSE_HOLD) || conn->in_size == 0)
            continue;
        long used = conn->ops->on_input(conn, conn->in, conn->in_size);
        if (used < 0 || conn->closing)
            continue;
        ASSERT((size_t)used <= conn->in_size);
        ASSERT(conn->sink_size == 0 || (size_t)used == conn->in_size);
        keep_leftover(conn, conn->in + used, conn->in_size - (size_t)used);
        if (conn->out_bytes >= CONN_OUT_READ_PAUSE && !conn->peer_reads_always)
            conn_pause_reading(conn, CONN_PAUSE_OUTPUT);
    }
    uv_idle_stop(idle);
}

/* ---- output --------------------------------------------------------- */

/* Output is written by the check handle, right after the loop polled.
 * Output queued before the poll (by a timer, an idle callback) would wait
 * for the poll to return, up to the next timer: an active idle handle
 * keeps that poll from blocking. */
static void schedule_flush(struct conn *conn)
{
    if (list_linked(&conn->flush_link))
        return;
    if (list_empty(&conn->net->flush_list))
        uv_idle_start(&conn->net->flush_idle, on_flush_idle);
    list_push_back(&conn->net->flush_list, &conn->flush_link);
}

void conn__schedule_flush(struct conn *conn)
{
    schedule_flush(conn);
}

static void on_flush_idle(uv_idle_t *idle)
{
    (void)idle; /* it only keeps the poll from blocking */
}

/* The peer may wait for what we queue: its next bytes, however few, must
 * not wait for a batch. */
static inline void note_output(struct conn *conn)
{
    conn->last_out_ms = uv_now(conn->net->loop);
    if (conn->batch_mark > 0)
        read_batch_drop(&conn->net->read_batch, conn);
}

void conn_out_owed(struct conn *conn)
{
    note_output(conn);
}

static struct out_chunk *tail_copy_chunk(struct conn *conn, size_t n)
{
    if (!list_empty(&conn->out_chunks)) {
        struct out_chunk *tail = CONTAINER_OF(conn->out_chunks.prev, struct out_chunk, link);
        if (tail->ref == NULL && tail->cap - tail->size >= n)
            return tail;
    }
    /* The common size comes from the pool; only an outsized reservation
     * (a huge method frame) is its own allocation. */
    size_t cap = n > CHUNK_DATA_SIZE ? n : CHUNK_DATA_SIZE;
    struct out_chunk *chunk =
        cap == CHUNK_DATA_SIZE ? pool_get(&conn->net->data_chunks) : xmalloc(sizeof *chunk + cap);
    chunk->ref = NULL;
    chunk->release = NULL;
    chunk->owner = NULL;
    chunk->size = 0;
    chunk->sent = 0;
    chunk->cap = cap;
    list_push_back(&conn->out_chunks, &chunk->link);
    return chunk;
}

uint8_t *conn_out_reserve(struct conn *conn, size_t n)
{
    struct out_chunk *chunk = tail_copy_chunk(conn, n);
    return chunk->data + chunk->size;
}

void conn_out_commit(struct conn *conn, size_t n)
{
    ASSERT(!list_empty(&conn->out_chunks));
    struct out_chunk *tail = CONTAINER_OF(conn->out_chunks.prev, struct out_chunk, link);
    ASSERT(tail->ref == NULL);
    ASSERT(n <= tail->cap - tail->size);
    tail->size += n;
    conn->out_bytes += n;
    note_output(conn);
    if (conn->out_bytes >= CONN_OUT_HIGH_WATER)
        conn->above_high_water = true;
    schedule_flush(conn);
}

void conn_out_bytes(struct conn *conn, const void *data, size_t n)
{
    memcpy(conn_out_reserve(conn, n), data, n);
    conn_out_commit(conn, n);
}

void conn_out_ref(struct conn *conn, const uint8_t *data, size_t n, conn_release_fn release,
                  void *owner)
{
    struct out_chunk *chunk = pool_get(&conn->net->ref_chunks);
    chunk->ref = data;
    chunk->release = release;
    chunk->owner = owner;
    chunk->size = n;
    chunk->sent = 0;
    chunk->cap = 0;
    list_push_back(&conn->out_chunks, &chunk->link);
    conn->out_bytes += n;
    note_output(conn);
    if (conn->out_bytes >= CONN_OUT_HIGH_WATER)
        conn->above_high_water = true;
    schedule_flush(conn);
}

static void chunk_free(struct net *net, struct out_chunk *chunk)
{
    if (chunk->release)
        chunk->release(chunk->owner);
    if (chunk->ref)
        pool_put(&net->ref_chunks, chunk);
    else if (chunk->cap == CHUNK_DATA_SIZE)
        pool_put(&net->data_chunks, chunk);
    else
        free(chunk);
}

/* Marks n written bytes as sent, freeing finished chunks. The tail copy
 * chunk is freed too when fully sent: a new one is cheap, and an idle
 * connection then holds no output memory. */
static void advance(struct conn *conn, size_t n)
{
    conn->out_bytes -= n;
    conn->net->bytes_out += n;
    conn->bytes_out += n;
    while (n > 0) {
        ASSERT(!list_empty(&conn->out_chunks));
        struct out_chunk *chunk = CONTAINER_OF(conn->out_chunks.next, struct out_chunk, link);
        size_t left = chunk->size - chunk->sent;
        size_t take = n < left ? n : left;
        chunk->sent += take;
        n -= take;
        if (chunk->sent == chunk->size) {
            list_remove(&chunk->link);
            chunk_free(conn->net, chunk);
        }
    }
    conn->last_write_ms = uv_now(conn->net->loop);
    /* A TLS conn still has its ciphertext and close_notify to write:
     * conn__tls_flush closes it. */
    if (conn->close_after_flush && conn->out_bytes == 0 && conn->tls == NULL) {
        conn_close(conn);
        return;
    }
    if ((conn->read_pauses & CONN_PAUSE_OUTPUT) && conn->out_bytes <= CONN_OUT_LOW_WATER)
        conn_resume_reading(conn, CONN_PAUSE_OUTPUT);
    if (conn->above_high_water && conn->out_bytes <= CONN_OUT_LOW_WATER) {
        conn->above_high_water = false;
        if (conn->ops->on_drain && !conn->closing)
            conn->ops->on_drain(conn);
    }
}

void conn__advance(struct conn *conn, size_t n)
{
    advance(conn, n);
}

static size_t gather(struct conn *conn, uv_buf_t *iov, size_t iov_cap, size_t *bytes)
{
    size_t count = 0;
    *bytes = 0;
    list_for_each(node, &conn->out_chunks) {
        if (count == iov_cap)
            break;
        struct out_chunk *chunk = CONTAINER_OF(node, struct out_chunk, link);
        const uint8_t *base = chunk->ref ? chunk->ref : chunk->data;
        size_t left = chunk->size - chunk->sent;
        if (left == 0)
            continue;
        iov[count++] = uv_buf_init((char *)base + chunk->sent, (unsigned)left);
        *bytes += left;
    }
    return count;
}

static void flush(struct conn *conn);

static void on_write_done(uv_write_t *req, int status)
{
    struct conn *conn = req->data;
    size_t n = conn->out_in_flight;
    conn->out_in_flight = 0;
    if (status < 0) {
        conn_close(conn);
        return;
    }
    advance(conn, n);
    if (conn->out_bytes > 0 && !conn->closing)
        schedule_flush(conn);
}

static void flush(struct conn *conn)
{
    if (conn->tls != NULL) {
        conn__tls_flush(conn);
        return;
    }
    if (conn->closing || conn->out_in_flight > 0)
        return;
    uv_buf_t iov[IOV_BATCH];
    for (;;) {
        size_t bytes;
        size_t count = gather(conn, iov, IOV_BATCH, &bytes);
        if (count == 0) {
            if (conn->close_after_flush)
                conn_close(conn);
            return;
        }
        int written = uv_try_write((uv_stream_t *)&conn->tcp, iov, (unsigned)count);
        if (written == UV_EAGAIN)
            written = 0;
        if (written < 0) {
            conn_close(conn);
            return;
        }
        advance(conn, (size_t)written);
        if (conn->closing)
            return;
        if ((size_t)written < bytes)
            break;
    }
    /* The kernel buffer is full: hand the rest to libuv, which writes it
     * when the socket is writable. The chunks stay queued (and their
     * memory stable) until on_write_done accounts for them. */
    size_t bytes;
    size_t count = gather(conn, iov, IOV_BATCH, &bytes);
    conn->out_in_flight = bytes;
    conn->write_req.data = conn;
    int rc = uv_write(&conn->write_req, (uv_stream_t *)&conn->tcp, iov, (unsigned)count,
                      on_write_done);
    if (rc < 0) {
        conn->out_in_flight = 0;
        conn_close(conn);
    }
}

void net_flush_hook_add(struct net *net, struct net_flush_hook *hook,
                        void (*fn)(struct net_flush_hook *hook))
{
    hook->fn = fn;
    hook->armed = false;
    list_push_back(&net->flush_hooks, &hook->link);
}

void net_flush_hook_remove(struct net_flush_hook *hook)
{
    if (hook->link.next != NULL && list_linked(&hook->link))
        list_remove(&hook->link);
    hook->armed = false;
}

void net_flush_hook_arm(struct net *net, struct net_flush_hook *hook)
{
    ASSERT(list_linked(&hook->link));
    if (hook->armed)
        return;
    hook->armed = true;
    uv_idle_start(&net->flush_idle, on_flush_idle); /* the poll must not block first */
}

/* Runs the armed hooks until none is (a hook may arm another). */
static void run_flush_hooks(struct net *net)
{
    for (bool again = true; again;) {
        again = false;
        list_for_each_safe(n, &net->flush_hooks) {
            struct net_flush_hook *hook = CONTAINER_OF(n, struct net_flush_hook, link);
            if (!hook->armed)
                continue;
            hook->armed = false;
            hook->fn(hook);
            again = true;
        }
    }
}

static void on_flush_check(uv_check_t *check)
{
    struct net *net = check->data;
    net->turn++; /* the shares (conn__turn_spent) start again */
    net->last_turn_readers = net->turn_readers;
    net->turn_readers = 0;
    loop_lag_sample(&net->loop_lag);
    run_flush_hooks(net);
    while (!list_empty(&net->flush_list)) {
        struct conn *conn = CONTAINER_OF(net->flush_list.next, struct conn, flush_link);
        list_remove(&conn->flush_link);
        flush(conn);
    }
    uv_idle_stop(&net->flush_idle);
}

/* ---- closing -------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *handle)
{
    struct conn *conn = handle->data;
    while (!list_empty(&conn->out_chunks)) {
        struct out_chunk *chunk = CONTAINER_OF(conn->out_chunks.next, struct out_chunk, link);
        list_remove(&chunk->link);
        chunk_free(conn->net, chunk);
    }
    free(conn->in);
    conn->in = NULL;
    tls_session_free(conn->tls);
    conn->tls = NULL;
    conn->net->conns_count--;
    list_remove(&conn->all_link);
    conn->ops->on_free(conn);
}

void conn_close(struct conn *conn)
{
    if (conn->closing)
        return;
    conn->closing = true;
    if (conn->connect_req) {
        /* A connect in flight is cancelled with the handle; its callback
         * must not report to a protocol that is closing. */
        conn->connect_req->conn = NULL;
        conn->connect_req = NULL;
    }
    if (list_linked(&conn->flush_link))
        list_remove(&conn->flush_link);
    conn_sink_cancel(conn);
    read_batch_drop(&conn->net->read_batch, conn);
    if (list_linked(&conn->resume_link))
        list_remove(&conn->resume_link);
    conn->ops->on_close(conn);
    uv_close((uv_handle_t *)&conn->tcp, on_handle_closed);
}

void conn_close_after_flush(struct conn *conn)
{
    if (conn->closing)
        return;
    conn_pause_reading(conn, CONN_PAUSE_CLOSING);
    conn->close_after_flush = true;
    schedule_flush(conn);
}
