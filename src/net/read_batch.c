/*
 * read_batch.c: see read_batch.h. The mark is the socket's SO_RCVLOWAT;
 * the timer is a timerfd (libuv's timers count milliseconds, and the wait
 * is a fraction of one) armed for the oldest marked connection's last
 * read plus the wait. Marked connections are kept in the order of their
 * last read, so the timer only moves when the oldest one reads.
 */
#include "net/read_batch.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/timerfd.h>
#endif

#include "lib/assert.h"
#include "lib/log.h"
#include "net/conn.h"

void read_batch_init(struct read_batch *rb, uv_loop_t *loop)
{
    memset(rb, 0, sizeof *rb);
    rb->loop = loop;
    rb->timer_fd = -1;
    list_init(&rb->marked);
}

#ifdef __linux__

static void set_mark(struct conn *conn, uint32_t bytes)
{
    uv_os_fd_t fd;
    int value = bytes > 0 ? (int)bytes : 1; /* 1 is the kernel's default */
    if (uv_fileno((const uv_handle_t *)&conn->tcp, &fd) == 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &value, sizeof value);
    conn->batch_mark = bytes;
}

static void arm(struct read_batch *rb)
{
    uint64_t at = 0;
    if (!list_empty(&rb->marked)) {
        struct conn *oldest = CONTAINER_OF(list_first(&rb->marked), struct conn, batch_link);
        at = oldest->batch_read_ns + rb->wait_ns;
    }
    if (at == rb->armed_at_ns)
        return;
    /* uv_hrtime() reads CLOCK_MONOTONIC, the timer's clock. */
    struct itimerspec spec = {
        .it_value = {.tv_sec = (time_t)(at / 1000000000u), .tv_nsec = (long)(at % 1000000000u)},
    };
    if (timerfd_settime(rb->timer_fd, TFD_TIMER_ABSTIME, &spec, NULL) == 0)
        rb->armed_at_ns = at;
}

static void unmark(struct conn *conn)
{
    set_mark(conn, 0);
    list_remove(&conn->batch_link);
}

/* The oldest marked connections have not been read for the whole wait:
 * their peers have stopped (or wait for us), so what they sent is read
 * now, whatever its size. */
static void on_timer(uv_poll_t *poll, int status, int events)
{
    struct read_batch *rb = poll->data;
    (void)status;
    (void)events;
    uint64_t expirations;
    while (read(rb->timer_fd, &expirations, sizeof expirations) < 0 && errno == EINTR) {
    }
    rb->armed_at_ns = 0; /* a one-shot timer that fired is disarmed */
    uint64_t now = uv_hrtime();
    while (!list_empty(&rb->marked)) {
        struct conn *oldest = CONTAINER_OF(list_first(&rb->marked), struct conn, batch_link);
        if (oldest->batch_read_ns + rb->wait_ns > now)
            break;
        unmark(oldest);
        rb->timeout_count++;
    }
    arm(rb);
}

int read_batch_enable(struct read_batch *rb, unsigned wait_us)
{
    ASSERT(rb->timer_fd < 0);
    if (wait_us == 0)
        return 0;
    rb->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (rb->timer_fd < 0) {
        LOG_WARN("read batching off: timerfd_create: %s", strerror(errno));
        return -1;
    }
    uv_poll_init(rb->loop, &rb->timer_poll, rb->timer_fd);
    rb->timer_poll.data = rb;
    uv_poll_start(&rb->timer_poll, UV_READABLE, on_timer);
    uv_unref((uv_handle_t *)&rb->timer_poll);
    rb->timer_open = true;
    rb->wait_ns = (uint64_t)wait_us * 1000u;
    return 0;
}

static void on_timer_closed(uv_handle_t *handle)
{
    struct read_batch *rb = handle->data;
    close(rb->timer_fd);
    rb->timer_fd = -1;
}

void read_batch_close(struct read_batch *rb)
{
    while (!list_empty(&rb->marked))
        unmark(CONTAINER_OF(list_first(&rb->marked), struct conn, batch_link));
    rb->wait_ns = 0;
    if (rb->timer_open) {
        rb->timer_open = false;
        uv_poll_stop(&rb->timer_poll);
        uv_close((uv_handle_t *)&rb->timer_poll, on_timer_closed);
    }
}

void read_batch_after_read(struct read_batch *rb, struct conn *conn, size_t nread)
{
    if (rb->wait_ns == 0 || !conn->ops->batch_input)
        return; /* links, HTTP, or batching off: not even the clock */
    uint64_t now = uv_hrtime();
    uint64_t since = now - conn->batch_read_ns;
    conn->batch_read_ns = now;
    /* Not the peer of a conversation: we have sent it nothing for a
     * while (a confirming publisher gets a confirm with every read, a
     * consumer its deliveries). Not merely since the previous read: a read
     * that ends inside a message confirms nothing, and that message's
     * publisher may wait for its confirm. */
    bool quiet = uv_now(rb->loop) - conn->last_out_ms >= READ_BATCH_QUIET_MS;
    uint64_t units = conn->in_units - conn->batch_units_seen;
    conn->batch_units_seen = conn->in_units;
    if (!conn->reading)
        return; /* paused: the pause dropped the mark */
    /* Rates since the previous read (a first read looks slow, on
     * purpose): dense enough in frames for reads to be worth saving, and
     * what the bytes' rate brings in half the wait. */
    bool dense = units * 1000000000u >= (uint64_t)READ_BATCH_DENSE_PER_S * since;
    uint64_t want = since > 0 ? (uint64_t)nread * (rb->wait_ns / 2) / since : 0;
    if (!quiet || !dense || want < READ_BATCH_MIN) {
        read_batch_drop(rb, conn);
        return;
    }
    uint32_t mark = want > READ_BATCH_MAX ? READ_BATCH_MAX : (uint32_t)want;
    if (conn->batch_mark == 0) {
        rb->raised_count++;
        set_mark(conn, mark);
    } else {
        list_remove(&conn->batch_link);
        /* Resized only when it moved by a quarter: one system call per
         * read at most, usually none. */
        uint32_t old = conn->batch_mark;
        uint32_t delta = mark > old ? mark - old : old - mark;
        if (delta > old / 4)
            set_mark(conn, mark);
    }
    list_push_back(&rb->marked, &conn->batch_link);
    arm(rb);
}

void read_batch_drop(struct read_batch *rb, struct conn *conn)
{
    if (conn->batch_mark == 0)
        return;
    unmark(conn);
    arm(rb);
}

#else /* !__linux__ */

int read_batch_enable(struct read_batch *rb, unsigned wait_us)
{
    (void)rb;
    return wait_us == 0 ? 0 : -1;
}

void read_batch_close(struct read_batch *rb)
{
    (void)rb;
}

void read_batch_after_read(struct read_batch *rb, struct conn *conn, size_t nread)
{
    (void)rb;
    (void)conn;
    (void)nread;
}

void read_batch_drop(struct read_batch *rb, struct conn *conn)
{
    (void)rb;
    (void)conn;
}

#endif
