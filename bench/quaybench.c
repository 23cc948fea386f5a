/*
 * quaybench -- quay's AMQP 0-9-1 load generator (throughput, latency, correctness).
 *
 * Producers and consumers are threads, each with its own TCP connection and channel 1.
 * Producer i publishes to queue i % Q through the default exchange; consumer j consumes from
 * queue j % Q. The tool declares the queues itself (non-exclusive, <prefix>-0 .. <prefix>-(Q-1),
 * deleted and re-declared at the start, deleted at the end unless --keep).
 *
 * Every body starts with a 16-byte header (native byte order; both ends run on this machine):
 *     bytes 0..7   send time, CLOCK_MONOTONIC ns (taken just before basic.publish)
 *     bytes 8..11  producer id
 *     bytes 12..15 per-producer sequence number, 0, 1, 2, ...
 * Consumers use it for end-to-end latency and to verify: every published message is consumed
 * (lost), none twice (dup), and a consumer never sees an older message of a producer after a
 * newer one (reorder). After the producers stop (and their confirms are in), consumers drain
 * until every published message has been seen or nothing arrived for --drain-timeout seconds.
 *
 * --watch-pid samples the broker's /proc/PID/stat (utime+stime) at start and end and its
 * VmRSS every 100 ms (plus VmHWM, reset at start through /proc/PID/clear_refs when allowed).
 *
 * --qarg/--dlx/--consume-queue give the published queues x-arguments and let consumers read
 * another queue (e.g. the target of a dead-letter exchange). -C 0 publishes only (filling a
 * queue, flooding a broker into its memory alarm); connection.blocked/unblocked are counted
 * (the tool advertises the capability) and publish stalls > 100 ms are summed. With --confirm,
 * conf_p50_us/conf_p99_us are publish -> confirm latencies (from the same clock reading as the
 * body's send time to the basic.ack being read).
 *
 * Output: one line starting with "RESULT " of key=value pairs (see print_result()).
 * Exit status: 0 ok, 1 lost/dup/reorder/foreign != 0, 2 error (connection, broker refused...).
 *
 * Build: cc -O2 -std=c17 -Wall -Wextra quaybench.c $(pkg-config --cflags --libs librabbitmq) -lpthread
 */
#define _GNU_SOURCE
#include "qbcommon.h"

#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>

#define HDR_LEN 16
#define MAX_WATCH 8
#define MAX_QARGS 16

/* ------------------------------------------------------------------ configuration */

static struct {
    qb_endpoint pub, cons;
    qb_creds cr;
    int producers, consumers, queues;
    size_t size;
    double duration;
    long count; /* per producer; 0 = run for duration */
    bool auto_ack;
    int prefetch, multi_ack;
    bool confirm;
    int window;
    bool persistent, durable;
    double rate; /* total msg/s over all producers; 0 = unlimited */
    double consumer_rate; /* total msg/s over all consumers; 0 = as fast as they can */
    int watch[MAX_WATCH], nwatch;
    char prefix[128];
    double drain_timeout, max_drain;
    bool keep, verbose, no_setup;
    int fault; /* FAULT_*: deliberate misbehaviour to test the checker */
    char qkey[MAX_QARGS][64], qval[MAX_QARGS][256]; /* --qarg: arguments of the published queues */
    int nqargs;
    char dlx[128];           /* --dlx: fanout exchange, x-dead-letter-exchange of the published queues */
    char consume_queue[192]; /* --consume-queue: consumers read this queue instead of <prefix>-i */
    double confirm_timeout;  /* longest wait for a publisher confirm (s) */
} cfg;

enum { FAULT_NONE, FAULT_LOSS, FAULT_DUP, FAULT_REORDER };

/* ------------------------------------------------------------------ failure handling */

static atomic_bool g_abort;
static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_err[512];

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    pthread_mutex_lock(&g_err_mu);
    if (!g_err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g_err, sizeof g_err, fmt, ap);
        va_end(ap);
        fprintf(stderr, "quaybench: %s\n", g_err);
    }
    pthread_mutex_unlock(&g_err_mu);
    atomic_store(&g_abort, true);
}

static _Noreturn void die_now(const char *msg)
{
    fprintf(stderr, "quaybench: %s\n", msg);
    /* keep the result line parseable: no spaces inside the value */
    char clean[512];
    snprintf(clean, sizeof clean, "%s", msg);
    for (char *p = clean; *p; p++)
        if (*p == ' ' || *p == '\n' || *p == '\t')
            *p = '_';
    printf("RESULT status=error error=%s\n", clean);
    fflush(stdout);
    _exit(2);
}

/* ------------------------------------------------------------------ sequence sets */

/* One bit per sequence number, in lazily allocated chunks so sets can be shared between
 * consumer threads without locks (chunk installation by CAS, bits by atomic fetch_or). */
#define SS_CHUNK_SHIFT 20 /* 1 Mi sequence numbers = 128 KiB per chunk */
#define SS_NCHUNK (1u << (32 - SS_CHUNK_SHIFT))
typedef struct {
    _Atomic(uint64_t *) chunk[SS_NCHUNK];
} seqset;

static uint64_t *ss_word(seqset *s, uint32_t seq, bool create)
{
    uint32_t ci = seq >> SS_CHUNK_SHIFT;
    uint64_t *c = atomic_load_explicit(&s->chunk[ci], memory_order_acquire);
    if (!c && create) {
        uint64_t *fresh = calloc((1u << SS_CHUNK_SHIFT) / 64, sizeof(uint64_t));
        if (!fresh)
            die_now("out of memory");
        uint64_t *expected = NULL;
        if (atomic_compare_exchange_strong(&s->chunk[ci], &expected, fresh))
            c = fresh;
        else {
            free(fresh);
            c = expected;
        }
    }
    return c ? &c[(seq & ((1u << SS_CHUNK_SHIFT) - 1)) >> 6] : NULL;
}

/* returns true if seq was already in the set */
static bool ss_add(seqset *s, uint32_t seq)
{
    uint64_t bit = 1ull << (seq & 63);
    uint64_t old = __atomic_fetch_or(ss_word(s, seq, true), bit, __ATOMIC_RELAXED);
    return (old & bit) != 0;
}

static bool ss_has(seqset *s, uint32_t seq)
{
    uint64_t *w = ss_word(s, seq, false);
    return w && (__atomic_load_n(w, __ATOMIC_RELAXED) >> (seq & 63)) & 1;
}

/* ------------------------------------------------------------------ latency histogram */

/* Log-linear buckets over microseconds: exact below 1024 us, then 512 sub-buckets per power
 * of two (< 0.2 % relative error) up to 2^32 us. */
#define H_EXACT 1024
#define H_SUB 512
#define H_BUCKETS (H_EXACT + (32 - 10) * H_SUB)

static unsigned h_index(uint64_t us)
{
    if (us > UINT32_MAX)
        us = UINT32_MAX;
    if (us < H_EXACT)
        return (unsigned)us;
    unsigned e = 63u - (unsigned)__builtin_clzll(us); /* 10..31 */
    unsigned shift = e - 9;
    return H_EXACT + (e - 10) * H_SUB + (unsigned)((us >> shift) - H_SUB);
}

static uint64_t h_value(unsigned idx)
{
    if (idx < H_EXACT)
        return idx;
    unsigned e = (idx - H_EXACT) / H_SUB + 10, sub = (idx - H_EXACT) % H_SUB;
    return (uint64_t)(H_SUB + sub) << (e - 9);
}

/* ------------------------------------------------------------------ threads' state */

typedef struct {
    int id;
    pthread_t th;
    _Alignas(64) atomic_long published;
    atomic_long confirmed, nacked;
    atomic_bool done;
    double t_done;  /* when its last message was sent (and, with confirms, settled) */
    seqset *nacks;  /* sequence numbers the broker nacked (not counted as lost) */
    long unsettled; /* confirms still missing at the end */
    atomic_long blocked, unblocked;   /* connection.blocked / connection.unblocked received */
    _Atomic uint64_t stall_ns, stall_max_ns; /* gaps > 100 ms between two publishes: total, longest */
    uint64_t *conf_hist; /* publish -> confirm (ack or nack) latency, us */
    FILE *conf_log; /* QB_CONFIRM_LOG: a line per confirm (sent at, CLOCK_MONOTONIC ns; waited, us) */
} producer_t;

typedef struct {
    int id;
    pthread_t th;
    _Alignas(64) atomic_long consumed;
    atomic_long unique, dup, reorder, foreign, redelivered;
    _Atomic uint64_t last_ns;
    atomic_bool done;
    uint32_t *next_seq; /* per producer: highest sequence number seen + 1 */
    uint64_t *hist;
} consumer_t;

static producer_t *g_prod;
static consumer_t *g_cons;
static seqset **g_seen; /* per producer, shared by all consumers */
static atomic_int g_ready;
static atomic_bool g_go;
static uint64_t g_t0_ns;

static void queue_name(int i, char *buf, size_t n) { snprintf(buf, n, "%s-%d", cfg.prefix, i); }

static long sum_published(void)
{
    long s = 0;
    for (int i = 0; i < cfg.producers; i++)
        s += atomic_load_explicit(&g_prod[i].published, memory_order_relaxed);
    return s;
}

static bool producers_done(void)
{
    for (int i = 0; i < cfg.producers; i++)
        if (!atomic_load(&g_prod[i].done))
            return false;
    return true;
}

static long sum_unique(void)
{
    long s = 0;
    for (int i = 0; i < cfg.consumers; i++)
        s += atomic_load_explicit(&g_cons[i].unique, memory_order_relaxed);
    return s;
}

/* ------------------------------------------------------------------ queue setup */

static bool all_digits(const char *s)
{
    if (*s == '-')
        s++;
    if (!*s)
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* x-arguments of the published queues: --qarg K=V (integer if numeric) and --dlx */
static amqp_table_t published_queue_args(amqp_table_entry_t *ents)
{
    int n = 0;
    for (int i = 0; i < cfg.nqargs; i++, n++) {
        ents[n].key = amqp_cstring_bytes(cfg.qkey[i]);
        if (all_digits(cfg.qval[i])) {
            ents[n].value.kind = AMQP_FIELD_KIND_I64;
            ents[n].value.value.i64 = atoll(cfg.qval[i]);
        } else {
            ents[n].value.kind = AMQP_FIELD_KIND_UTF8;
            ents[n].value.value.bytes = amqp_cstring_bytes(cfg.qval[i]);
        }
    }
    if (cfg.dlx[0]) {
        ents[n].key = amqp_cstring_bytes("x-dead-letter-exchange");
        ents[n].value.kind = AMQP_FIELD_KIND_UTF8;
        ents[n].value.value.bytes = amqp_cstring_bytes(cfg.dlx);
        n++;
    }
    return (amqp_table_t){.num_entries = n, .entries = ents};
}

/* after a channel error (e.g. 404 on deleting an absent queue): reopen channel 1 */
static bool reopen_channel(amqp_connection_state_t c, amqp_rpc_reply_t r, char *err, size_t n)
{
    if (r.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION || r.reply.id != AMQP_CHANNEL_CLOSE_METHOD)
        return false;
    amqp_channel_close_ok_t ok = {0};
    amqp_send_method(c, 1, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
    amqp_channel_open(c, 1);
    return qb_reply_ok(amqp_get_rpc_reply(c), "channel.open", err, n);
}

static void setup_queues(bool declare)
{
    char err[512], q[192];
    amqp_connection_state_t c = qb_open(&cfg.pub, &cfg.cr, 0, 5000, err, sizeof err);
    if (!c) {
        if (!declare)
            return; /* best effort at the end */
        die_now(err);
    }
    /* the dead-letter target first (queue, exchange, binding), so nothing dead-lettered is dropped */
    if (cfg.consume_queue[0]) {
        amqp_bytes_t cq = amqp_cstring_bytes(cfg.consume_queue);
        amqp_queue_delete(c, 1, cq, 0, 0);
        amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
        if (!qb_reply_ok(r, "queue.delete", err, sizeof err) && !reopen_channel(c, r, err, sizeof err) && declare)
            die_now(err);
        if (declare) {
            amqp_queue_declare(c, 1, cq, 0, cfg.durable, 0, 0, amqp_empty_table);
            if (!qb_reply_ok(amqp_get_rpc_reply(c), "queue.declare (consume queue)", err, sizeof err))
                die_now(err);
        }
    }
    if (cfg.dlx[0]) {
        if (declare) {
            amqp_exchange_declare(c, 1, amqp_cstring_bytes(cfg.dlx), amqp_cstring_bytes("fanout"), 0, cfg.durable, 0,
                                  0, amqp_empty_table);
            if (!qb_reply_ok(amqp_get_rpc_reply(c), "exchange.declare (dlx)", err, sizeof err))
                die_now(err);
            if (cfg.consume_queue[0]) {
                amqp_queue_bind(c, 1, amqp_cstring_bytes(cfg.consume_queue), amqp_cstring_bytes(cfg.dlx),
                                amqp_empty_bytes, amqp_empty_table);
                if (!qb_reply_ok(amqp_get_rpc_reply(c), "queue.bind (dlx)", err, sizeof err))
                    die_now(err);
            }
        } else {
            amqp_exchange_delete(c, 1, amqp_cstring_bytes(cfg.dlx), 0);
            amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
            if (!qb_reply_ok(r, "exchange.delete", err, sizeof err))
                reopen_channel(c, r, err, sizeof err);
        }
    }
    amqp_table_entry_t ents[MAX_QARGS + 1];
    amqp_table_t qargs = published_queue_args(ents);
    for (int i = 0; i < cfg.queues; i++) {
        queue_name(i, q, sizeof q);
        amqp_queue_delete(c, 1, amqp_cstring_bytes(q), 0, 0);
        amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
        if (!qb_reply_ok(r, "queue.delete", err, sizeof err)) {
            /* some brokers answer 404 for an absent queue: reopen the channel and go on */
            if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
                amqp_channel_close_ok_t ok = {0};
                amqp_send_method(c, 1, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
                amqp_channel_open(c, 1);
                if (!qb_reply_ok(amqp_get_rpc_reply(c), "channel.open", err, sizeof err))
                    die_now(err);
            } else if (declare)
                die_now(err);
            else
                break;
        }
        if (!declare)
            continue;
        amqp_queue_declare(c, 1, amqp_cstring_bytes(q), 0, cfg.durable, 0, 0, qargs);
        if (!qb_reply_ok(amqp_get_rpc_reply(c), "queue.declare", err, sizeof err))
            die_now(err);
    }
    qb_close(c);
}

/* ------------------------------------------------------------------ producer */

typedef struct {
    uint8_t *settled; /* ring indexed by delivery tag */
    uint64_t *sent_ns; /* when that tag was published: confirm latency */
    uint64_t mask, low, next; /* low = lowest unsettled tag, next = tag of the next publish */
} confirm_ring;

/* The longest publish -> confirm wait since the last -v progress line, us,
 * and those waits' histogram (its p99 goes on the line too). */
static _Atomic uint64_t g_conf_max_window_us;
static _Atomic uint64_t g_conf_window_hist[H_BUCKETS];
static void hist_pcts(const uint64_t *hist, uint64_t pct[5]);

static void settle_one(producer_t *p, confirm_ring *cr, uint64_t tag, bool ack)
{
    if (tag < cr->low || tag >= cr->next || cr->settled[tag & cr->mask])
        return;
    cr->settled[tag & cr->mask] = 1;
    uint64_t now = qb_now_ns(), sent = cr->sent_ns[tag & cr->mask];
    uint64_t waited_us = now > sent ? (now - sent) / 1000 : 0;
    p->conf_hist[h_index(waited_us)]++;
    if (p->conf_log != NULL)
        fprintf(p->conf_log, "%" PRIu64 " %" PRIu64 "\n", sent, waited_us);
    if (cfg.verbose)
        atomic_fetch_add_explicit(&g_conf_window_hist[h_index(waited_us)], 1,
                                  memory_order_relaxed);
    uint64_t seen = atomic_load_explicit(&g_conf_max_window_us, memory_order_relaxed);
    while (waited_us > seen &&
           !atomic_compare_exchange_weak_explicit(&g_conf_max_window_us, &seen, waited_us,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
    if (ack)
        atomic_fetch_add_explicit(&p->confirmed, 1, memory_order_relaxed);
    else {
        atomic_fetch_add_explicit(&p->nacked, 1, memory_order_relaxed);
        ss_add(p->nacks, (uint32_t)(tag - 1)); /* tag n carries sequence n-1 */
    }
}

static void settle(producer_t *p, confirm_ring *cr, uint64_t tag, bool multiple, bool ack)
{
    if (multiple)
        for (uint64_t t = cr->low; t <= tag && t < cr->next; t++)
            settle_one(p, cr, t, ack);
    else
        settle_one(p, cr, tag, ack);
    while (cr->low < cr->next && cr->settled[cr->low & cr->mask])
        cr->low++;
}

/* Read and handle incoming frames on a producer connection. wait_us <= 0: only what is already
 * readable (non-blocking); otherwise wait up to wait_us for the first frame. Returns false on
 * a fatal condition (already reported through fail()). */
static bool producer_pump(producer_t *p, amqp_connection_state_t c, confirm_ring *cr, long wait_us)
{
    bool first = true;
    for (;;) {
        amqp_frame_t f;
        struct timeval tv = {0, 0};
        if (first && wait_us > 0) {
            tv.tv_sec = wait_us / 1000000;
            tv.tv_usec = wait_us % 1000000;
        }
        first = false;
        int rc = amqp_simple_wait_frame_noblock(c, &f, &tv);
        if (rc == AMQP_STATUS_TIMEOUT)
            break;
        if (rc != AMQP_STATUS_OK) {
            fail("producer %d: reading from broker: %s", p->id, amqp_error_string2(rc));
            return false;
        }
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue;
        switch (f.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
            const amqp_basic_ack_t *m = f.payload.method.decoded;
            if (cr)
                settle(p, cr, m->delivery_tag, m->multiple, true);
            break;
        }
        case AMQP_BASIC_NACK_METHOD: {
            const amqp_basic_nack_t *m = f.payload.method.decoded;
            if (cr)
                settle(p, cr, m->delivery_tag, m->multiple, false);
            break;
        }
        case AMQP_CHANNEL_CLOSE_METHOD: {
            const amqp_channel_close_t *m = f.payload.method.decoded;
            fail("producer %d: broker closed the channel: %u %.*s", p->id, m->reply_code, (int)m->reply_text.len,
                 (const char *)m->reply_text.bytes);
            return false;
        }
        case AMQP_CONNECTION_CLOSE_METHOD: {
            const amqp_connection_close_t *m = f.payload.method.decoded;
            fail("producer %d: broker closed the connection: %u %.*s", p->id, m->reply_code, (int)m->reply_text.len,
                 (const char *)m->reply_text.bytes);
            return false;
        }
        case AMQP_CONNECTION_BLOCKED_METHOD:
            atomic_fetch_add(&p->blocked, 1);
            break;
        case AMQP_CONNECTION_UNBLOCKED_METHOD:
            atomic_fetch_add(&p->unblocked, 1);
            break;
        default:
            break; /* returns (mandatory is off), ... */
        }
    }
    amqp_maybe_release_buffers(c);
    return true;
}

static void *producer_main(void *arg)
{
    producer_t *p = arg;
    char err[512], q[192];
    amqp_connection_state_t c = qb_open(&cfg.pub, &cfg.cr, 0, 5000, err, sizeof err);
    if (!c) {
        fail("producer %d: %s", p->id, err);
        atomic_fetch_add(&g_ready, 1);
        atomic_store(&p->done, true);
        return NULL;
    }
    confirm_ring ring = {0}, *cr = NULL;
    if (cfg.confirm) {
        amqp_confirm_select(c, 1);
        if (!qb_reply_ok(amqp_get_rpc_reply(c), "confirm.select", err, sizeof err))
            fail("producer %d: %s", p->id, err);
        uint64_t n = 1;
        while (n < (uint64_t)cfg.window + 2)
            n <<= 1;
        ring.settled = calloc(n, 1);
        ring.sent_ns = calloc(n, sizeof(uint64_t));
        if (!ring.settled || !ring.sent_ns)
            die_now("out of memory");
        ring.mask = n - 1;
        ring.low = ring.next = 1;
        cr = &ring;
    }
    queue_name(p->id % cfg.queues, q, sizeof q);
    amqp_bytes_t rk = amqp_cstring_bytes(q);
    unsigned char *body = malloc(cfg.size);
    for (size_t i = 0; i < cfg.size; i++)
        body[i] = (unsigned char)(' ' + i % 95);
    uint32_t pid32 = (uint32_t)p->id;
    memcpy(body + 8, &pid32, 4);
    amqp_basic_properties_t props = {0};
    if (cfg.persistent) {
        props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
        props.delivery_mode = 2;
    }
    amqp_bytes_t bb = {cfg.size, body};

    atomic_fetch_add(&g_ready, 1);
    while (!atomic_load(&g_go) && !atomic_load(&g_abort))
        qb_sleep_s(0.0005);

    const uint64_t stop_ns = g_t0_ns + (uint64_t)(cfg.duration * 1e9);
    const uint64_t period_ns = cfg.rate > 0 ? (uint64_t)(1e9 * cfg.producers / cfg.rate) : 0;
    uint64_t next_ns = g_t0_ns + (period_ns ? period_ns * (uint64_t)p->id / (uint64_t)cfg.producers : 0);
    uint32_t seq = 0;
    uint64_t last_pub_ns = 0;
    bool ok = true;
    while (ok && !atomic_load_explicit(&g_abort, memory_order_relaxed)) {
        uint64_t now = qb_now_ns();
        if (cfg.count ? (long)seq >= cfg.count : now >= stop_ns)
            break;
        if (period_ns) {
            /* with confirms, read them as they arrive while waiting for the next slot (so the
             * confirm latency is not rounded up to the period): ppoll has ns resolution */
            while (cr && ok && now < next_ns) {
                struct pollfd pfd = {.fd = amqp_get_sockfd(c), .events = POLLIN};
                uint64_t left = next_ns - now;
                struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
                if (amqp_frames_enqueued(c) || ppoll(&pfd, 1, &ts, NULL) > 0)
                    ok = producer_pump(p, c, cr, -1);
                now = qb_now_ns();
            }
            if (!ok)
                break;
            if (now < next_ns) {
                struct timespec ts = {(time_t)(next_ns / 1000000000ull), (long)(next_ns % 1000000000ull)};
                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
                }
                now = qb_now_ns();
            } else if (now - next_ns > 1000000000ull) {
                next_ns = now; /* far behind: do not burst to catch up */
            }
            next_ns += period_ns;
            if (!cfg.count && now >= stop_ns)
                break;
        }
        if (last_pub_ns && now - last_pub_ns > 100000000ull) {
            uint64_t gap = now - last_pub_ns;
            atomic_fetch_add_explicit(&p->stall_ns, gap, memory_order_relaxed);
            if (gap > atomic_load_explicit(&p->stall_max_ns, memory_order_relaxed))
                atomic_store_explicit(&p->stall_max_ns, gap, memory_order_relaxed);
        }
        last_pub_ns = now;
        memcpy(body, &now, 8);
        /* --selftest-fault: producer 0 misbehaves around sequence 100 so the checks can be tested */
        uint32_t wire = seq;
        int copies = 1;
        if (p->id == 0 && cfg.fault && (seq == 100 || seq == 101)) {
            if (cfg.fault == FAULT_REORDER)
                wire = seq ^ 1u; /* 101 goes out before 100 */
            else if (seq == 100)
                copies = cfg.fault == FAULT_LOSS ? 0 : 2;
        }
        memcpy(body + 12, &wire, 4);
        for (int k = 0; k < copies && ok; k++) {
            int rc = amqp_basic_publish(c, 1, amqp_empty_bytes, rk, 0, 0, &props, bb);
            if (rc < 0) {
                fail("producer %d: basic.publish: %s", p->id, amqp_error_string2(rc));
                ok = false;
            }
            if (cr) {
                ring.settled[ring.next & ring.mask] = 0;
                ring.sent_ns[ring.next & ring.mask] = now;
                ring.next++;
            }
        }
        if (!ok)
            break;
        seq++;
        atomic_store_explicit(&p->published, (long)seq, memory_order_relaxed);
        if (cr) {
            if (ring.next - ring.low >= (uint64_t)cfg.window) {
                double give_up = qb_now_s() + cfg.confirm_timeout;
                bool past_end = false;
                while (ok && ring.next - ring.low >= (uint64_t)cfg.window) {
                    ok = producer_pump(p, c, cr, 200000);
                    /* publish-only (-C 0) timed runs, e.g. a flood against a memory alarm: a
                     * blocked publisher stops at the deadline instead of failing */
                    if (cfg.consumers == 0 && !cfg.count && qb_now_ns() >= stop_ns) {
                        past_end = true;
                        break;
                    }
                    if (cfg.consumers == 0 && !cfg.count)
                        give_up = qb_now_s() + cfg.confirm_timeout; /* waits until the deadline */
                    if (qb_now_s() > give_up || atomic_load(&g_abort)) {
                        if (ok)
                            fail("producer %d: no publisher confirm for %.0f s", p->id, cfg.confirm_timeout);
                        ok = false;
                    }
                }
                if (past_end)
                    break;
            } else if (period_ns || (seq & 63) == 0) {
                ok = producer_pump(p, c, cr, -1);
            }
        } else if ((seq & 4095) == 0) {
            ok = producer_pump(p, c, NULL, -1); /* notice a channel.close early */
        }
    }
    if (last_pub_ns) { /* a stall that lasted until the end (a publisher blocked for good) */
        uint64_t end = qb_now_ns();
        if (!cfg.count && end > stop_ns)
            end = stop_ns;
        if (end > last_pub_ns && end - last_pub_ns > 100000000ull) {
            atomic_fetch_add(&p->stall_ns, end - last_pub_ns);
            if (end - last_pub_ns > atomic_load(&p->stall_max_ns))
                atomic_store(&p->stall_max_ns, end - last_pub_ns);
        }
    }
    if (ok && cr) {
        double give_up = qb_now_s() + cfg.confirm_timeout;
        while (ok && ring.low < ring.next && qb_now_s() < give_up && !atomic_load(&g_abort))
            ok = producer_pump(p, c, cr, 200000);
        p->unsettled = (long)(ring.next - ring.low);
        if (p->unsettled)
            fprintf(stderr, "quaybench: producer %d: %ld publisher confirms missing\n", p->id, p->unsettled);
    }
    p->t_done = qb_now_s();
    atomic_store(&p->done, true);
    qb_close(c);
    free(body);
    free(ring.settled);
    free(ring.sent_ns);
    return NULL;
}

/* ------------------------------------------------------------------ consumer */

static bool consumers_may_stop(double idle_since, double drain_start)
{
    if (atomic_load(&g_abort))
        return true;
    if (!producers_done())
        return false;
    if (sum_unique() >= sum_published())
        return true;
    double now = qb_now_s();
    if (idle_since > 0 && now - idle_since > cfg.drain_timeout)
        return true;
    return drain_start > 0 && now - drain_start > cfg.max_drain;
}

static void *consumer_main(void *arg)
{
    consumer_t *me = arg;
    char err[512], q[192];
    amqp_connection_state_t c = qb_open(&cfg.cons, &cfg.cr, 0, 5000, err, sizeof err);
    if (!c) {
        fail("consumer %d: %s", me->id, err);
        atomic_fetch_add(&g_ready, 1);
        atomic_store(&me->done, true);
        return NULL;
    }
    if (cfg.consume_queue[0])
        snprintf(q, sizeof q, "%s", cfg.consume_queue);
    else
        queue_name(me->id % cfg.queues, q, sizeof q);
    if (cfg.prefetch > 0) {
        amqp_basic_qos(c, 1, 0, (uint16_t)(cfg.prefetch > 65535 ? 65535 : cfg.prefetch), 0);
        if (!qb_reply_ok(amqp_get_rpc_reply(c), "basic.qos", err, sizeof err))
            fail("consumer %d: %s", me->id, err);
    }
    amqp_basic_consume(c, 1, amqp_cstring_bytes(q), amqp_empty_bytes, 0, cfg.auto_ack, 0, amqp_empty_table);
    if (!qb_reply_ok(amqp_get_rpc_reply(c), "basic.consume", err, sizeof err))
        fail("consumer %d: %s", me->id, err);
    int ack_every = cfg.multi_ack > 1 ? cfg.multi_ack : 1;
    const int np = cfg.producers;
    long consumed = 0, unique = 0, dup = 0, reorder = 0, foreign = 0, redelivered = 0;
    int pending = 0;
    uint64_t last_tag = 0;
    double idle_since = 0, drain_start = 0;
    /* --consumer-rate: each delivery is taken no sooner than its slot. */
    const uint64_t period_ns =
        cfg.consumer_rate > 0 ? (uint64_t)(1e9 * cfg.consumers / cfg.consumer_rate) : 0;
    uint64_t next_take_ns = 0;
    atomic_fetch_add(&g_ready, 1);

    while (!atomic_load_explicit(&g_abort, memory_order_relaxed)) {
        amqp_envelope_t env;
        struct timeval tv = {0, 100000};
        amqp_maybe_release_buffers(c);
        amqp_rpc_reply_t r = amqp_consume_message(c, &env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_NORMAL) {
            uint64_t now = qb_now_ns();
            if (period_ns > 0) {
                if (next_take_ns == 0 || next_take_ns + 100 * period_ns < now)
                    next_take_ns = now; /* no burst to catch up after an idle spell */
                if (next_take_ns > now)
                    qb_sleep_s((double)(next_take_ns - now) / 1e9);
                next_take_ns += period_ns;
                now = qb_now_ns();
            }
            idle_since = 0;
            const unsigned char *b = env.message.body.bytes;
            if (env.message.body.len >= HDR_LEN) {
                uint64_t ts;
                uint32_t pid, seq;
                memcpy(&ts, b, 8);
                memcpy(&pid, b + 8, 4);
                memcpy(&seq, b + 12, 4);
                if (pid >= (uint32_t)np || ts < g_t0_ns || ts > now) {
                    foreign++;
                } else {
                    me->hist[h_index((now - ts) / 1000)]++;
                    if (ss_add(g_seen[pid], seq)) {
                        dup++;
                    } else {
                        unique++;
                        if (seq < me->next_seq[pid])
                            reorder++;
                        else
                            me->next_seq[pid] = seq + 1;
                    }
                }
            } else {
                foreign++;
            }
            if (env.redelivered)
                redelivered++;
            consumed++;
            if (!cfg.auto_ack) {
                last_tag = env.delivery_tag;
                int rc = 0;
                if (ack_every == 1)
                    rc = amqp_basic_ack(c, 1, last_tag, 0);
                else if (++pending >= ack_every) {
                    rc = amqp_basic_ack(c, 1, last_tag, 1);
                    pending = 0;
                }
                if (rc < 0) {
                    fail("consumer %d: basic.ack: %s", me->id, amqp_error_string2(rc));
                    amqp_destroy_envelope(&env);
                    break;
                }
            }
            amqp_destroy_envelope(&env);
            atomic_store_explicit(&me->consumed, consumed, memory_order_relaxed);
            atomic_store_explicit(&me->unique, unique, memory_order_relaxed);
            atomic_store_explicit(&me->last_ns, now, memory_order_relaxed);
            if ((consumed & 1023) == 0) {
                atomic_store_explicit(&me->dup, dup, memory_order_relaxed);
                atomic_store_explicit(&me->reorder, reorder, memory_order_relaxed);
                atomic_store_explicit(&me->foreign, foreign, memory_order_relaxed);
                if (consumers_may_stop(0, drain_start))
                    break;
            }
            continue;
        }
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) {
            if (pending) { /* partial batch of acks: flush it when the stream pauses */
                amqp_basic_ack(c, 1, last_tag, 1);
                pending = 0;
            }
            double now = qb_now_s();
            if (producers_done()) {
                if (!idle_since)
                    idle_since = now;
                if (!drain_start)
                    drain_start = now;
            }
            if (consumers_may_stop(idle_since, drain_start))
                break;
            continue;
        }
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            amqp_frame_t f;
            if (amqp_simple_wait_frame(c, &f) != AMQP_STATUS_OK) {
                fail("consumer %d: connection lost", me->id);
                break;
            }
            if (f.frame_type == AMQP_FRAME_METHOD) {
                amqp_method_number_t id = f.payload.method.id;
                if (id == AMQP_CHANNEL_CLOSE_METHOD || id == AMQP_CONNECTION_CLOSE_METHOD) {
                    fail("consumer %d: broker closed the %s", me->id, id == AMQP_CHANNEL_CLOSE_METHOD ? "channel" : "connection");
                    break;
                }
                if (id == AMQP_BASIC_CANCEL_METHOD) {
                    fail("consumer %d: broker cancelled the consumer", me->id);
                    break;
                }
            }
            continue;
        }
        qb_reply_ok(r, "basic.consume stream", err, sizeof err);
        fail("consumer %d: %s", me->id, err);
        break;
    }
    if (pending)
        amqp_basic_ack(c, 1, last_tag, 1);
    atomic_store(&me->consumed, consumed);
    atomic_store(&me->unique, unique);
    atomic_store(&me->dup, dup);
    atomic_store(&me->reorder, reorder);
    atomic_store(&me->foreign, foreign);
    atomic_store(&me->redelivered, redelivered);
    atomic_store(&me->done, true);
    qb_close(c);
    return NULL;
}

/* ------------------------------------------------------------------ broker monitor */

static atomic_bool g_mon_stop;
static double g_client_cpu_s;
static long g_rss_max[MAX_WATCH], g_rss_start[MAX_WATCH];

static void *monitor_main(void *arg)
{
    (void)arg;
    long last_pub = 0, last_cons = 0;
    double last_t = qb_now_s();
    int tick = 0;
    while (!atomic_load(&g_mon_stop)) {
        qb_sleep_s(0.1);
        for (int i = 0; i < cfg.nwatch; i++) {
            long r = qb_proc_status_kib(cfg.watch[i], "VmRSS");
            if (r > g_rss_max[i])
                g_rss_max[i] = r;
        }
        if (cfg.verbose && ++tick % 10 == 0) {
            double t = qb_now_s();
            long pub = sum_published(), cons = 0;
            for (int i = 0; i < cfg.consumers; i++)
                cons += atomic_load(&g_cons[i].consumed);
            uint64_t conf_max = atomic_exchange(&g_conf_max_window_us, 0);
            uint64_t window[H_BUCKETS], wpct[5];
            for (unsigned k = 0; k < H_BUCKETS; k++)
                window[k] = atomic_exchange(&g_conf_window_hist[k], 0);
            hist_pcts(window, wpct);
            fprintf(stderr, "[%5.1fs] published %8.0f/s  consumed %8.0f/s  backlog %ld  confirm max %.1f ms  p99 %.1f ms\n",
                    t - (double)g_t0_ns / 1e9, (double)(pub - last_pub) / (t - last_t),
                    (double)(cons - last_cons) / (t - last_t), pub - cons, (double)conf_max / 1000,
                    (double)wpct[2] / 1000);
            last_pub = pub;
            last_cons = cons;
            last_t = t;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ CLI */

static void usage(int code)
{
    fprintf(code ? stderr : stdout,
            "usage: quaybench [options]\n"
            "  -H, --host H             producers' broker host (default 127.0.0.1)\n"
            "  -p, --port P             producers' broker port (default 5672)\n"
            "      --consumer-host H    consumers' broker host (default: --host)\n"
            "      --consumer-port P    consumers' broker port (default: --port)\n"
            "      --tls-ca FILE        AMQPS: connect with TLS, the broker's certificate verified\n"
            "                           against the CAs in FILE (and for the host name)\n"
            "  -P, --producers N        producer threads, one connection each (default 1)\n"
            "  -C, --consumers N        consumer threads, one connection each (default 1)\n"
            "      --queues N           queues <prefix>-0..N-1; producer/consumer i uses queue i%%N (default 1)\n"
            "      --prefix NAME        queue name prefix (default quaybench)\n"
            "  -s, --size BYTES         body size, >= 16 (default 1024)\n"
            "  -d, --duration S         seconds of publishing (default 10)\n"
            "  -n, --count N            publish N messages per producer instead of -d\n"
            "      --auto-ack           consume with no-ack (default: manual acks)\n"
            "      --prefetch N         basic.qos prefetch-count (default 0 = unlimited)\n"
            "      --multi-ack N        ack every N deliveries with multiple=true (default 1: single acks)\n"
            "      --confirm            publisher confirms\n"
            "  -w, --window N           max unconfirmed messages per producer (default 1000)\n"
            "      --persistent         delivery-mode 2\n"
            "      --durable            durable queues\n"
            "      --rate R             fixed total publish rate, msg/s over all producers (default unlimited)\n"
            "      --consumer-rate R    consumers take at most R msg/s in total (a standing backlog stays)\n"
            "      --watch-pid PID[,..] broker process(es): CPU us per consumed message, peak RSS\n"
            "      --drain-timeout S    after producers stop, give up when nothing arrived for S s (default 5)\n"
            "      --max-drain S        ... or after S s of draining in total (default 120)\n"
            "      --keep               keep the queues at the end\n"
            "      --no-setup           use the queues as they are (no delete and declare first)\n"
            "      --user U --pass P --vhost V   (default guest guest /)\n"
            "  -v, --verbose            progress every second on stderr\n"
            "      --selftest-fault K   loss|dup|reorder: producer 0 drops / doubles / swaps sequence 100\n"
            "                           (tests the checker: the run must then exit 1)\n"
            "      --qarg K=V           argument of the published queues (integer if numeric), repeatable\n"
            "      --dlx NAME           declare fanout exchange NAME, make it the published queues'\n"
            "                           x-dead-letter-exchange, bind --consume-queue (if any) to it\n"
            "      --consume-queue NAME consumers read queue NAME (declared, no arguments) instead of <prefix>-i\n"
            "      --confirm-timeout S  longest wait for a publisher confirm (default 60)\n"
            "  -C 0                     publish only: no consumers, no loss checks (lost=dup=reorder=-1);\n"
            "                           with -d, blocked publishers stop at the deadline (memory-alarm floods)\n"
            "                           and the run ends at most --confirm-timeout + 5 s later\n"
            "Environment: QB_CONFIRM_LOG=PATH writes PATH.<producer>, a line per confirm: when the\n"
            "message was published (CLOCK_MONOTONIC ns, as quayd's uv_hrtime) and its wait in us\n");
    exit(code);
}

/* p50, p90, p99, p99.9, max of a histogram */
static void hist_pcts(const uint64_t *hist, uint64_t pct[5])
{
    uint64_t n = 0;
    for (unsigned i = 0; i < H_BUCKETS; i++)
        n += hist[i];
    const double qs[5] = {0.50, 0.90, 0.99, 0.999, 1.0};
    for (int k = 0; k < 5; k++) {
        pct[k] = 0;
        if (!n)
            continue;
        uint64_t rank = (uint64_t)(qs[k] * (double)(n - 1)) + 1, acc = 0;
        for (unsigned i = 0; i < H_BUCKETS; i++) {
            acc += hist[i];
            if (acc >= rank) {
                pct[k] = h_value(i);
                break;
            }
        }
    }
}

static void print_result(double wall, double pub_el, double cons_el, long published, long consumed, long lost,
                         long dup, long reorder, long foreign, long redelivered, long nacked, long unsettled,
                         const uint64_t *hist, double cpu_us, long rss_kib, long rss_start_kib, const char *extra)
{
    uint64_t pct[5];
    hist_pcts(hist, pct);
    double cons_rate = cons_el > 0 ? (double)consumed / cons_el : 0;
    long per = cfg.consumers ? consumed : published; /* CPU per message: per published one when publish-only */
    char ack[32];
    if (cfg.auto_ack)
        snprintf(ack, sizeof ack, "auto");
    else if (cfg.multi_ack > 1)
        snprintf(ack, sizeof ack, "every%d", cfg.multi_ack);
    else
        snprintf(ack, sizeof ack, "single");
    printf("RESULT pub_rate=%.0f cons_rate=%.0f lat_p50_us=%" PRIu64 " lat_p99_us=%" PRIu64
           " lost=%ld dup=%ld reorder=%ld srv_cpu_us_per_msg=%.2f srv_rss_kib=%ld"
           " status=%s producers=%d consumers=%d queues=%d size=%zu ack=%s prefetch=%d confirm=%d window=%d"
           " persistent=%d durable=%d rate=%.0f published=%ld consumed=%ld cons_MBps=%.1f"
           " lat_p90_us=%" PRIu64 " lat_p999_us=%" PRIu64 " lat_max_us=%" PRIu64
           " foreign=%ld redelivered=%ld nacked=%ld unconfirmed=%ld elapsed_s=%.2f srv_cpu_pct=%.1f srv_rss_start_kib=%ld client_cpu_pct=%.1f%s\n",
           pub_el > 0 ? (double)published / pub_el : 0, cons_rate, pct[0], pct[2], lost, dup, reorder,
           cfg.nwatch && per ? cpu_us / (double)per : -1.0, cfg.nwatch ? rss_kib : -1L,
           (lost > 0 || dup > 0 || reorder > 0 || foreign > 0) ? "fail" : "ok", cfg.producers, cfg.consumers, cfg.queues, cfg.size, ack,
           cfg.prefetch, cfg.confirm, cfg.window, cfg.persistent, cfg.durable, cfg.rate, published, consumed,
           cons_rate * (double)cfg.size / 1e6, pct[1], pct[3], pct[4], foreign, redelivered, nacked, unsettled, wall,
           cfg.nwatch && wall > 0 ? 100.0 * cpu_us / 1e6 / wall : -1.0, cfg.nwatch ? rss_start_kib : -1L,
           wall > 0 ? 100.0 * g_client_cpu_s / wall : -1.0, extra);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    snprintf(cfg.pub.host, sizeof cfg.pub.host, "127.0.0.1");
    cfg.pub.port = 5672;
    cfg.cons.port = -1;
    snprintf(cfg.cr.user, sizeof cfg.cr.user, "guest");
    snprintf(cfg.cr.pass, sizeof cfg.cr.pass, "guest");
    snprintf(cfg.cr.vhost, sizeof cfg.cr.vhost, "/");
    snprintf(cfg.prefix, sizeof cfg.prefix, "quaybench");
    cfg.producers = cfg.consumers = cfg.queues = 1;
    cfg.size = 1024;
    cfg.duration = 10;
    cfg.window = 1000;
    cfg.multi_ack = 1;
    cfg.drain_timeout = 5;
    cfg.max_drain = 120;
    cfg.confirm_timeout = 60;

    enum {
        O_CHOST = 256, O_CPORT, O_QUEUES, O_PREFIX, O_AUTOACK, O_PREFETCH, O_MULTIACK, O_CONFIRM, O_PERSIST,
        O_DURABLE, O_RATE, O_CONSUMER_RATE, O_WATCH, O_DRAIN, O_MAXDRAIN, O_KEEP, O_NO_SETUP, O_USER, O_PASS, O_VHOST, O_HELP, O_FAULT,
        O_QARG, O_DLX, O_CQUEUE, O_CTIMEOUT, O_TLS_CA
    };
    static const struct option lo[] = {
        {"host", required_argument, 0, 'H'},          {"port", required_argument, 0, 'p'},
        {"consumer-host", required_argument, 0, O_CHOST}, {"consumer-port", required_argument, 0, O_CPORT},
        {"producers", required_argument, 0, 'P'},     {"consumers", required_argument, 0, 'C'},
        {"queues", required_argument, 0, O_QUEUES},   {"prefix", required_argument, 0, O_PREFIX},
        {"size", required_argument, 0, 's'},          {"duration", required_argument, 0, 'd'},
        {"count", required_argument, 0, 'n'},         {"auto-ack", no_argument, 0, O_AUTOACK},
        {"prefetch", required_argument, 0, O_PREFETCH}, {"multi-ack", required_argument, 0, O_MULTIACK},
        {"confirm", no_argument, 0, O_CONFIRM},       {"window", required_argument, 0, 'w'},
        {"persistent", no_argument, 0, O_PERSIST},    {"durable", no_argument, 0, O_DURABLE},
        {"rate", required_argument, 0, O_RATE},
        {"consumer-rate", required_argument, 0, O_CONSUMER_RATE},       {"watch-pid", required_argument, 0, O_WATCH},
        {"drain-timeout", required_argument, 0, O_DRAIN}, {"max-drain", required_argument, 0, O_MAXDRAIN},
        {"keep", no_argument, 0, O_KEEP},             {"no-setup", no_argument, 0, O_NO_SETUP},             {"user", required_argument, 0, O_USER},
        {"pass", required_argument, 0, O_PASS},       {"vhost", required_argument, 0, O_VHOST},
        {"verbose", no_argument, 0, 'v'},             {"help", no_argument, 0, O_HELP},
        {"selftest-fault", required_argument, 0, O_FAULT},
        {"qarg", required_argument, 0, O_QARG},       {"dlx", required_argument, 0, O_DLX},
        {"consume-queue", required_argument, 0, O_CQUEUE}, {"confirm-timeout", required_argument, 0, O_CTIMEOUT},
        {"tls-ca", required_argument, 0, O_TLS_CA},
        {0, 0, 0, 0}};
    char chost[256] = "";
    int o;
    while ((o = getopt_long(argc, argv, "H:p:P:C:s:d:n:w:v", lo, NULL)) != -1) {
        switch (o) {
        case 'H': snprintf(cfg.pub.host, sizeof cfg.pub.host, "%s", optarg); break;
        case 'p': cfg.pub.port = atoi(optarg); break;
        case O_CHOST: snprintf(chost, sizeof chost, "%s", optarg); break;
        case O_CPORT: cfg.cons.port = atoi(optarg); break;
        case 'P': cfg.producers = atoi(optarg); break;
        case 'C': cfg.consumers = atoi(optarg); break;
        case O_QUEUES: cfg.queues = atoi(optarg); break;
        case O_PREFIX: snprintf(cfg.prefix, sizeof cfg.prefix, "%s", optarg); break;
        case 's': cfg.size = strtoul(optarg, NULL, 10); break;
        case 'd': cfg.duration = atof(optarg); break;
        case 'n': cfg.count = atol(optarg); break;
        case O_AUTOACK: cfg.auto_ack = true; break;
        case O_PREFETCH: cfg.prefetch = atoi(optarg); break;
        case O_MULTIACK: cfg.multi_ack = atoi(optarg); break;
        case O_CONFIRM: cfg.confirm = true; break;
        case 'w': cfg.window = atoi(optarg); break;
        case O_PERSIST: cfg.persistent = true; break;
        case O_DURABLE: cfg.durable = true; break;
        case O_RATE: cfg.rate = atof(optarg); break;
        case O_CONSUMER_RATE: cfg.consumer_rate = atof(optarg); break;
        case O_WATCH: {
            char *dup = strdup(optarg), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && cfg.nwatch < MAX_WATCH; t = strtok_r(NULL, ",", &save))
                if (atoi(t) > 0)
                    cfg.watch[cfg.nwatch++] = atoi(t);
            free(dup);
            break;
        }
        case O_DRAIN: cfg.drain_timeout = atof(optarg); break;
        case O_MAXDRAIN: cfg.max_drain = atof(optarg); break;
        case O_KEEP: cfg.keep = true; break;
        case O_NO_SETUP: cfg.no_setup = true; break;
        case O_USER: snprintf(cfg.cr.user, sizeof cfg.cr.user, "%s", optarg); break;
        case O_PASS: snprintf(cfg.cr.pass, sizeof cfg.cr.pass, "%s", optarg); break;
        case O_VHOST: snprintf(cfg.cr.vhost, sizeof cfg.cr.vhost, "%s", optarg); break;
        case 'v': cfg.verbose = true; break;
        case O_FAULT:
            cfg.fault = !strcmp(optarg, "loss") ? FAULT_LOSS : !strcmp(optarg, "dup") ? FAULT_DUP
                      : !strcmp(optarg, "reorder") ? FAULT_REORDER : -1;
            if (cfg.fault < 0)
                usage(2);
            break;
        case O_QARG: {
            const char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || cfg.nqargs >= MAX_QARGS) {
                fprintf(stderr, "quaybench: --qarg K=V (at most %d)\n", MAX_QARGS);
                usage(2);
            }
            snprintf(cfg.qkey[cfg.nqargs], sizeof cfg.qkey[0], "%.*s", (int)(eq - optarg), optarg);
            snprintf(cfg.qval[cfg.nqargs], sizeof cfg.qval[0], "%s", eq + 1);
            cfg.nqargs++;
            break;
        }
        case O_DLX: snprintf(cfg.dlx, sizeof cfg.dlx, "%s", optarg); break;
        case O_CQUEUE: snprintf(cfg.consume_queue, sizeof cfg.consume_queue, "%s", optarg); break;
        case O_CTIMEOUT: cfg.confirm_timeout = atof(optarg); break;
        case O_TLS_CA:
            snprintf(cfg.pub.tls_ca, sizeof cfg.pub.tls_ca, "%s", optarg);
            snprintf(cfg.cons.tls_ca, sizeof cfg.cons.tls_ca, "%s", optarg);
            break;
        case O_HELP: usage(0); break;
        default: usage(2);
        }
    }
    if (optind < argc || cfg.producers < 1 || cfg.producers > 1024 || cfg.consumers < 0 || cfg.consumers > 1024 ||
        cfg.confirm_timeout <= 0 ||
        cfg.queues < 1 || cfg.size < HDR_LEN || cfg.size > 128u * 1024 * 1024 || cfg.window < 1 || cfg.multi_ack < 1 ||
        (cfg.duration <= 0 && cfg.count <= 0) || cfg.count > (long)UINT32_MAX)
        usage(2);
    if (!cfg.auto_ack && cfg.prefetch > 0 && cfg.multi_ack > cfg.prefetch) {
        fprintf(stderr, "quaybench: --multi-ack %d > --prefetch %d would stall; using %d\n", cfg.multi_ack, cfg.prefetch,
                cfg.prefetch);
        cfg.multi_ack = cfg.prefetch;
    }
    snprintf(cfg.cons.host, sizeof cfg.cons.host, "%s", chost[0] ? chost : cfg.pub.host);
    if (cfg.cons.port <= 0)
        cfg.cons.port = cfg.pub.port;
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);

    if (!cfg.no_setup)
        setup_queues(true);

    g_prod = calloc((size_t)cfg.producers, sizeof *g_prod);
    g_cons = calloc((size_t)(cfg.consumers ? cfg.consumers : 1), sizeof *g_cons);
    g_seen = calloc((size_t)cfg.producers, sizeof *g_seen);
    if (!g_prod || !g_cons || !g_seen)
        die_now("out of memory");
    for (int i = 0; i < cfg.producers; i++) {
        g_prod[i].id = i;
        g_seen[i] = calloc(1, sizeof(seqset));
        g_prod[i].nacks = calloc(1, sizeof(seqset));
        g_prod[i].conf_hist = calloc(H_BUCKETS, sizeof(uint64_t));
        if (!g_seen[i] || !g_prod[i].nacks || !g_prod[i].conf_hist)
            die_now("out of memory");
        const char *log = getenv("QB_CONFIRM_LOG");
        if (log != NULL && *log != '\0') {
            char path[4096];
            snprintf(path, sizeof path, "%s.%d", log, i);
            if ((g_prod[i].conf_log = fopen(path, "w")) == NULL)
                die_now("QB_CONFIRM_LOG: cannot open");
        }
    }
    for (int i = 0; i < cfg.consumers; i++) {
        g_cons[i].id = i;
        g_cons[i].next_seq = calloc((size_t)cfg.producers, sizeof(uint32_t));
        g_cons[i].hist = calloc(H_BUCKETS, sizeof(uint64_t));
        if (!g_cons[i].next_seq || !g_cons[i].hist)
            die_now("out of memory");
    }

    /* consumers first (so nothing piles up before they listen), then producers; start together */
    for (int i = 0; i < cfg.consumers; i++)
        pthread_create(&g_cons[i].th, NULL, consumer_main, &g_cons[i]);
    while (atomic_load(&g_ready) < cfg.consumers)
        qb_sleep_s(0.001);
    for (int i = 0; i < cfg.producers; i++)
        pthread_create(&g_prod[i].th, NULL, producer_main, &g_prod[i]);
    while (atomic_load(&g_ready) < cfg.consumers + cfg.producers)
        qb_sleep_s(0.001);
    if (atomic_load(&g_abort))
        die_now(g_err);

    bool hwm_reset[MAX_WATCH] = {0};
    long long cpu0[MAX_WATCH] = {0};
    for (int i = 0; i < cfg.nwatch; i++) {
        hwm_reset[i] = qb_proc_reset_hwm(cfg.watch[i]);
        g_rss_start[i] = g_rss_max[i] = qb_proc_status_kib(cfg.watch[i], "VmRSS");
        cpu0[i] = qb_proc_cpu_ticks(cfg.watch[i]);
        if (cpu0[i] < 0 || g_rss_start[i] < 0)
            fprintf(stderr, "quaybench: cannot read /proc/%d (watch-pid)\n", cfg.watch[i]);
    }
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    g_t0_ns = qb_now_ns();
    pthread_t mon;
    pthread_create(&mon, NULL, monitor_main, NULL);
    atomic_store(&g_go, true);

    /* wait for everyone, with a watchdog: a thread blocked in a write to a stalled broker
     * cannot notice g_abort, so after an error give the threads a few seconds, then bail */
    double hard_deadline = qb_now_s() + (cfg.count ? 3600 : cfg.duration) + 60 + cfg.max_drain + 60;
    double abort_seen = 0;
    const bool publish_only = cfg.consumers == 0;
    const double stuck_deadline = qb_now_s() + cfg.duration + cfg.confirm_timeout + 5;
    int stuck = 0;
    for (;;) {
        bool all = producers_done();
        for (int i = 0; all && i < cfg.consumers; i++)
            all = atomic_load(&g_cons[i].done);
        if (all)
            break;
        double now = qb_now_s();
        if (publish_only && !cfg.count && now > stuck_deadline && !atomic_load(&g_abort)) {
            /* a producer blocked in a socket write (the broker stopped reading: memory alarm) */
            for (int i = 0; i < cfg.producers; i++)
                if (!atomic_load(&g_prod[i].done)) {
                    stuck++;
                    g_prod[i].t_done = now;
                }
            break;
        }
        if (atomic_load(&g_abort) && !abort_seen)
            abort_seen = now;
        if ((abort_seen && now - abort_seen > 5) || now > hard_deadline) {
            if (!g_err[0])
                fail("run did not finish in time");
            die_now(g_err);
        }
        qb_sleep_s(0.01);
    }
    /* publish-only: producers may still hang in connection.close on a blocked connection; they
     * are done (counters final), so do not join them: exit() ends them */
    for (int i = 0; !publish_only && i < cfg.producers; i++)
        pthread_join(g_prod[i].th, NULL);
    for (int i = 0; i < cfg.producers; i++)
        if (g_prod[i].conf_log != NULL)
            fflush(g_prod[i].conf_log); /* (its thread may still be in a close) */
    for (int i = 0; i < cfg.consumers; i++)
        pthread_join(g_cons[i].th, NULL);
    double t_end = qb_now_s();
    getrusage(RUSAGE_SELF, &ru1);
    g_client_cpu_s = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) + (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                     (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6 +
                     (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    double cpu_us = 0;
    long rss_kib = 0, rss_start = 0;
    for (int i = 0; i < cfg.nwatch; i++) {
        long long c1 = qb_proc_cpu_ticks(cfg.watch[i]);
        if (c1 >= 0 && cpu0[i] >= 0)
            cpu_us += qb_ticks_to_us(c1 - cpu0[i]);
        long r = qb_proc_status_kib(cfg.watch[i], "VmRSS");
        if (r > g_rss_max[i])
            g_rss_max[i] = r;
        if (hwm_reset[i]) {
            long h = qb_proc_status_kib(cfg.watch[i], "VmHWM");
            if (h > g_rss_max[i])
                g_rss_max[i] = h;
        }
        rss_kib += g_rss_max[i];
        rss_start += g_rss_start[i];
    }
    atomic_store(&g_mon_stop, true);
    pthread_join(mon, NULL);
    if (atomic_load(&g_abort))
        die_now(g_err);
    if (!cfg.keep)
        setup_queues(false);

    /* tally */
    const double t0 = (double)g_t0_ns / 1e9;
    long published = 0, consumed = 0, dup = 0, reorder = 0, foreign = 0, redelivered = 0, nacked = 0, unsettled = 0;
    double pub_end = t0;
    uint64_t last_ns = 0;
    for (int i = 0; i < cfg.producers; i++) {
        published += atomic_load(&g_prod[i].published);
        nacked += atomic_load(&g_prod[i].nacked);
        unsettled += g_prod[i].unsettled;
        if (g_prod[i].t_done > pub_end)
            pub_end = g_prod[i].t_done;
    }
    static uint64_t hist[H_BUCKETS];
    for (int i = 0; i < cfg.consumers; i++) {
        consumer_t *c = &g_cons[i];
        consumed += atomic_load(&c->consumed);
        dup += atomic_load(&c->dup);
        reorder += atomic_load(&c->reorder);
        foreign += atomic_load(&c->foreign);
        redelivered += atomic_load(&c->redelivered);
        uint64_t l = atomic_load(&c->last_ns);
        if (l > last_ns)
            last_ns = l;
        for (unsigned k = 0; k < H_BUCKETS; k++)
            hist[k] += c->hist[k];
    }
    long lost = 0, blocked = 0, unblocked = 0, confirmed = 0;
    double stall_s = 0, stall_max_s = 0;
    for (int i = 0; i < cfg.producers; i++) {
        blocked += atomic_load(&g_prod[i].blocked);
        unblocked += atomic_load(&g_prod[i].unblocked);
        confirmed += atomic_load(&g_prod[i].confirmed);
        stall_s += (double)atomic_load(&g_prod[i].stall_ns) / 1e9;
        double m = (double)atomic_load(&g_prod[i].stall_max_ns) / 1e9;
        if (m > stall_max_s)
            stall_max_s = m;
    }
    static uint64_t conf_hist[H_BUCKETS];
    for (int i = 0; i < cfg.producers; i++)
        for (unsigned k = 0; k < H_BUCKETS; k++)
            conf_hist[k] += g_prod[i].conf_hist[k];
    uint64_t cpct[5];
    hist_pcts(conf_hist, cpct);
    char extra[640];
    snprintf(extra, sizeof extra,
             " conf_p50_us=%" PRIu64 " conf_p99_us=%" PRIu64 " conf_max_us=%" PRIu64 " confirmed=%ld blocked=%ld unblocked=%ld stall_s=%.2f stall_max_s=%.2f stuck=%d publish_only=%d qargs=%d%s%s%s%s",
             cpct[0], cpct[2], cpct[4], confirmed, blocked, unblocked, stall_s, stall_max_s, stuck, publish_only, cfg.nqargs + (cfg.dlx[0] != 0),
             cfg.dlx[0] ? " dlx=" : "", cfg.dlx, cfg.consume_queue[0] ? " consume_queue=" : "", cfg.consume_queue);
    for (int p = 0; !publish_only && p < cfg.producers; p++) {
        long n = atomic_load(&g_prod[p].published);
        for (long s = 0; s < n; s++)
            if (!ss_has(g_seen[p], (uint32_t)s) && !ss_has(g_prod[p].nacks, (uint32_t)s))
                lost++;
    }
    double cons_el = last_ns > g_t0_ns ? (double)(last_ns - g_t0_ns) / 1e9 : 0;
    if (publish_only) /* nothing consumed: nothing to check */
        lost = dup = reorder = -1;
    print_result(t_end - t0, pub_end - t0, cons_el, published, consumed, lost, dup, reorder, foreign, redelivered,
                 nacked, unsettled, hist, cpu_us, rss_kib, rss_start, extra);
    fflush(stdout);
    if (publish_only)
        _exit(0); /* producers may be parked in librabbitmq on a blocked connection */
    return (lost || dup || reorder || foreign) ? 1 : 0;
}
