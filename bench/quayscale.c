/*
 * quayscale -- quay's scale probes: what a queue and a connection cost a broker.
 *
 *   quayscale queues -n N [-k CONNS] [-w WINDOW] ...
 *       Declares N classic queues <prefix>-0..N-1, each with one binding to amq.direct
 *       (routing key = queue name), as fast as the broker takes them: CONNS connections in
 *       parallel (default 4), each keeping up to WINDOW methods in flight (default 128, sent with
 *       amqp_send_method without waiting for each declare-ok/bind-ok). Reports declares/s
 *       (queue + binding pairs per second, first send to last -ok) and the broker's RSS delta
 *       per queue (VmRSS after a settle pause minus VmRSS before, with the connections already
 *       open), then deletes the queues the same way (unless --keep) and reports deletes/s.
 *
 *   quayscale conns -n N [-t THREADS]
 *       Opens N idle connections with one channel each (THREADS at a time, default 8; no
 *       heartbeats), waits --settle seconds, reports the broker's RSS delta per connection, then
 *       closes them. RLIMIT_NOFILE is raised as needed.
 *
 *   quayscale fill --names FILE -n N [-s SIZE] [-w WINDOW]
 *       Publishes N persistent messages of SIZE bytes (default 1024) to each queue named in
 *       FILE (one name per line; the queues must exist), round robin through the default
 *       exchange on one connection with publisher confirms, up to WINDOW unconfirmed (default
 *       1000). Reports messages, seconds and msg/s once every confirm is in; exit 1 on a nack.
 *
 *   quayscale wait-queue --queue NAME -n N [--timeout S]
 *       Polls (every 10 ms) until a connection opens and a passive queue.declare of NAME reports
 *       at least N messages, e.g. while a broker restarts and recovers. Reports ready_s (seconds
 *       from the tool's start), ready_epoch (CLOCK_REALTIME then, to compare with `date +%s.%N`
 *       taken when the broker was launched), first_connect_s (first successful AMQP login), messages and the
 *       number of attempts. Exit 1 (with the last count seen) if not ready after S s (default 300).
 *
 * Output: one "RESULT mode=... key=value ..." line. Exit 0 ok, 1 incomplete, 2 error.
 * Build: cc -O2 -std=c17 -Wall -Wextra quayscale.c $(pkg-config --cflags --libs librabbitmq) -lpthread
 */
#define _GNU_SOURCE
#include "qbcommon.h"

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>

static struct {
    qb_endpoint ep;
    qb_creds cr;
    long n;
    int conns, window, threads;
    int watch;
    double settle, hold, timeout;
    char prefix[128], queue[192], names[512];
    long size;
    bool durable, keep, verbose;
} cfg;

static _Noreturn void die_now(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die_now(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "quayscale: %s\n", msg);
    for (char *p = msg; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '\n')
            *p = '_';
    printf("RESULT status=error error=%s\n", msg);
    fflush(stdout);
    _exit(2);
}

static long rss_kib(void) { return cfg.watch > 0 ? qb_proc_status_kib(cfg.watch, "VmRSS") : -1; }

/* ------------------------------------------------------------------ queues */

enum { OP_DECLARE, OP_DELETE };

typedef struct {
    int id;
    pthread_t th;
    amqp_connection_state_t c;
    long first, count; /* queue indexes [first, first+count) */
    int op;
    long done_ops;
    char err[512];
} qworker_t;

/* Send request k of this worker: for declares, 2 per queue (queue.declare, queue.bind);
 * for deletes, 1 per queue. */
static int send_request(qworker_t *w, long k)
{
    char name[192];
    long qi = w->first + (w->op == OP_DECLARE ? k / 2 : k);
    snprintf(name, sizeof name, "%s-%ld", cfg.prefix, qi);
    amqp_bytes_t qn = amqp_cstring_bytes(name);
    if (w->op == OP_DELETE) {
        amqp_queue_delete_t m = {.queue = qn};
        return amqp_send_method(w->c, 1, AMQP_QUEUE_DELETE_METHOD, &m);
    }
    if (k % 2 == 0) {
        amqp_queue_declare_t m = {.queue = qn, .durable = cfg.durable, .arguments = amqp_empty_table};
        return amqp_send_method(w->c, 1, AMQP_QUEUE_DECLARE_METHOD, &m);
    }
    amqp_queue_bind_t m = {.queue = qn, .exchange = amqp_cstring_bytes("amq.direct"), .routing_key = qn,
                           .arguments = amqp_empty_table};
    return amqp_send_method(w->c, 1, AMQP_QUEUE_BIND_METHOD, &m);
}

static void *qworker_main(void *arg)
{
    qworker_t *w = arg;
    const long total = w->op == OP_DECLARE ? 2 * w->count : w->count;
    long sent = 0, got = 0;
    while (got < total) {
        while (sent < total && sent - got < cfg.window) {
            int rc = send_request(w, sent);
            if (rc != AMQP_STATUS_OK) {
                snprintf(w->err, sizeof w->err, "send: %s", amqp_error_string2(rc));
                return NULL;
            }
            sent++;
        }
        amqp_frame_t f;
        struct timeval tv = {60, 0};
        int rc = amqp_simple_wait_frame_noblock(w->c, &f, &tv);
        if (rc != AMQP_STATUS_OK) {
            snprintf(w->err, sizeof w->err, "waiting for replies (%ld/%ld): %s", got, total, amqp_error_string2(rc));
            return NULL;
        }
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue;
        switch (f.payload.method.id) {
        case AMQP_QUEUE_DECLARE_OK_METHOD:
        case AMQP_QUEUE_BIND_OK_METHOD:
        case AMQP_QUEUE_DELETE_OK_METHOD:
            got++;
            w->done_ops = got;
            break;
        case AMQP_CHANNEL_CLOSE_METHOD: {
            const amqp_channel_close_t *m = f.payload.method.decoded;
            snprintf(w->err, sizeof w->err, "broker closed the channel after %ld replies: %u %.*s", got, m->reply_code,
                     (int)m->reply_text.len, (const char *)m->reply_text.bytes);
            return NULL;
        }
        case AMQP_CONNECTION_CLOSE_METHOD: {
            const amqp_connection_close_t *m = f.payload.method.decoded;
            snprintf(w->err, sizeof w->err, "broker closed the connection after %ld replies: %u %.*s", got,
                     m->reply_code, (int)m->reply_text.len, (const char *)m->reply_text.bytes);
            return NULL;
        }
        default:
            break;
        }
        if ((got & 63) == 0)
            amqp_maybe_release_buffers(w->c);
    }
    amqp_maybe_release_buffers(w->c);
    return NULL;
}

/* run op over all queues on the given workers; returns elapsed seconds, exits on error */
static double run_queue_op(qworker_t *ws, int op)
{
    double t0 = qb_now_s();
    for (int i = 0; i < cfg.conns; i++) {
        ws[i].op = op;
        ws[i].done_ops = 0;
        ws[i].err[0] = 0;
        pthread_create(&ws[i].th, NULL, qworker_main, &ws[i]);
    }
    for (int i = 0; i < cfg.conns; i++)
        pthread_join(ws[i].th, NULL);
    double el = qb_now_s() - t0;
    for (int i = 0; i < cfg.conns; i++)
        if (ws[i].err[0])
            die_now("%s connection %d: %s", op == OP_DECLARE ? "declare" : "delete", i, ws[i].err);
    return el;
}

static int mode_queues(void)
{
    char err[512];
    if (cfg.conns > cfg.n)
        cfg.conns = (int)cfg.n;
    qworker_t *ws = calloc((size_t)cfg.conns, sizeof *ws);
    for (int i = 0; i < cfg.conns; i++) {
        ws[i].id = i;
        ws[i].first = cfg.n * i / cfg.conns;
        ws[i].count = cfg.n * (i + 1) / cfg.conns - ws[i].first;
        ws[i].c = qb_open(&cfg.ep, &cfg.cr, 0, 5000, err, sizeof err);
        if (!ws[i].c)
            die_now("%s", err);
    }
    qb_sleep_s(cfg.settle);
    long rss0 = rss_kib();
    double el = run_queue_op(ws, OP_DECLARE);
    qb_sleep_s(cfg.settle);
    long rss1 = rss_kib();
    double del_el = 0;
    if (!cfg.keep)
        del_el = run_queue_op(ws, OP_DELETE);
    long rss2 = rss_kib();
    for (int i = 0; i < cfg.conns; i++)
        qb_close(ws[i].c);
    printf("RESULT mode=queues status=ok queues=%ld conns=%d window=%d durable=%d declare_s=%.2f declares_per_s=%.0f"
           " rss_before_kib=%ld rss_after_kib=%ld rss_per_queue_kib=%.2f delete_s=%.2f deletes_per_s=%.0f"
           " rss_after_delete_kib=%ld\n",
           cfg.n, cfg.conns, cfg.window, cfg.durable, el, (double)cfg.n / el, rss0, rss1,
           rss0 >= 0 && rss1 >= 0 ? (double)(rss1 - rss0) / (double)cfg.n : -1.0, del_el,
           del_el > 0 ? (double)cfg.n / del_el : 0, rss2);
    free(ws);
    return 0;
}

/* ------------------------------------------------------------------ connections */

static amqp_connection_state_t *g_conns;
static atomic_long g_next, g_opened, g_failed;
static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_err[600];

static void *opener_main(void *arg)
{
    (void)arg;
    char err[512];
    for (;;) {
        long i = atomic_fetch_add(&g_next, 1);
        if (i >= cfg.n)
            break;
        g_conns[i] = qb_open(&cfg.ep, &cfg.cr, 0, 10000, err, sizeof err);
        if (g_conns[i])
            atomic_fetch_add(&g_opened, 1);
        else {
            atomic_fetch_add(&g_failed, 1);
            pthread_mutex_lock(&g_err_mu);
            if (!g_err[0])
                snprintf(g_err, sizeof g_err, "connection %ld: %s", i, err);
            pthread_mutex_unlock(&g_err_mu);
        }
    }
    return NULL;
}

static void *closer_main(void *arg)
{
    (void)arg;
    for (;;) {
        long i = atomic_fetch_add(&g_next, 1);
        if (i >= cfg.n)
            break;
        if (g_conns[i])
            qb_close(g_conns[i]);
        g_conns[i] = NULL;
    }
    return NULL;
}

static void run_threads(void *(*fn)(void *))
{
    pthread_t *th = calloc((size_t)cfg.threads, sizeof *th);
    atomic_store(&g_next, 0);
    for (int i = 0; i < cfg.threads; i++)
        pthread_create(&th[i], NULL, fn, NULL);
    for (int i = 0; i < cfg.threads; i++)
        pthread_join(th[i], NULL);
    free(th);
}

static int mode_conns(void)
{
    long lim = qb_raise_nofile(cfg.n + 64);
    if (lim < cfg.n + 16)
        die_now("RLIMIT_NOFILE is %ld, need about %ld", lim, cfg.n + 64);
    g_conns = calloc((size_t)cfg.n, sizeof *g_conns);
    if (!g_conns)
        die_now("out of memory");
    long rss0 = rss_kib();
    double t0 = qb_now_s();
    run_threads(opener_main);
    double el = qb_now_s() - t0;
    long opened = atomic_load(&g_opened), failed = atomic_load(&g_failed);
    if (failed)
        fprintf(stderr, "quayscale: %ld connections failed, first: %s\n", failed, g_err);
    qb_sleep_s(cfg.settle);
    long rss1 = rss_kib();
    qb_sleep_s(cfg.hold);
    double t1 = qb_now_s();
    run_threads(closer_main);
    double close_el = qb_now_s() - t1;
    printf("RESULT mode=conns status=%s conns=%ld opened=%ld failed=%ld open_s=%.2f opens_per_s=%.0f"
           " rss_before_kib=%ld rss_after_kib=%ld rss_per_conn_kib=%.2f close_s=%.2f\n",
           opened == cfg.n ? "ok" : "incomplete", cfg.n, opened, failed, el, el > 0 ? (double)opened / el : 0, rss0,
           rss1, rss0 >= 0 && rss1 >= 0 && opened ? (double)(rss1 - rss0) / (double)opened : -1.0, close_el);
    return opened == cfg.n ? 0 : 1;
}

/* ------------------------------------------------------------------ fill */

/* The names in cfg.names, one per line (empty lines skipped). */
static char **read_names(long *count)
{
    FILE *f = fopen(cfg.names, "r");
    if (!f)
        die_now("cannot open %s", cfg.names);
    char **names = NULL;
    long n = 0, cap = 0;
    char line[300];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0])
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            names = realloc(names, (size_t)cap * sizeof *names);
            if (!names)
                die_now("out of memory");
        }
        names[n++] = strdup(line);
    }
    fclose(f);
    *count = n;
    return names;
}

/* Reads frames until the confirms outstanding are at most want; false on a nack. */
static bool fill_wait_confirms(amqp_connection_state_t c, long *unconfirmed, long *confirmed,
                               long want)
{
    while (*unconfirmed > want) {
        amqp_frame_t f;
        struct timeval tv = {60, 0};
        int rc = amqp_simple_wait_frame_noblock(c, &f, &tv);
        if (rc != AMQP_STATUS_OK)
            die_now("waiting for confirms (%ld out): %s", *unconfirmed, amqp_error_string2(rc));
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue;
        if (f.payload.method.id == AMQP_BASIC_NACK_METHOD)
            return false;
        if (f.payload.method.id != AMQP_BASIC_ACK_METHOD)
            die_now("unexpected method 0x%08x", f.payload.method.id);
        const amqp_basic_ack_t *ack = f.payload.method.decoded;
        long upto = (long)ack->delivery_tag;
        long settled = ack->multiple ? upto - *confirmed : 1;
        *confirmed += settled;
        *unconfirmed -= settled;
    }
    return true;
}

static int mode_fill(void)
{
    long queues = 0;
    char **names = read_names(&queues);
    if (queues == 0)
        die_now("no queue names in %s", cfg.names);
    char err[512];
    amqp_connection_state_t c = qb_open(&cfg.ep, &cfg.cr, 0, 5000, err, sizeof err);
    if (!c)
        die_now("%s", err);
    amqp_confirm_select(c, 1);
    if (!qb_reply_ok(amqp_get_rpc_reply(c), "confirm.select", err, sizeof err))
        die_now("%s", err);
    char *body = malloc((size_t)cfg.size);
    if (!body)
        die_now("out of memory");
    memset(body, 'x', (size_t)cfg.size);
    amqp_basic_properties_t props = {._flags = AMQP_BASIC_DELIVERY_MODE_FLAG, .delivery_mode = 2};
    const double t0 = qb_now_s();
    long unconfirmed = 0, confirmed = 0, total = cfg.n * queues;
    for (long k = 0; k < total; k++) {
        if (!fill_wait_confirms(c, &unconfirmed, &confirmed, cfg.window - 1))
            die_now("a publish was nacked after %ld confirms", confirmed);
        amqp_bytes_t b = {(size_t)cfg.size, body};
        int rc = amqp_basic_publish(c, 1, amqp_empty_bytes, amqp_cstring_bytes(names[k % queues]), 0,
                                    0, &props, b);
        if (rc != AMQP_STATUS_OK)
            die_now("publish: %s", amqp_error_string2(rc));
        unconfirmed++;
    }
    if (!fill_wait_confirms(c, &unconfirmed, &confirmed, 0))
        die_now("a publish was nacked after %ld confirms", confirmed);
    double took = qb_now_s() - t0;
    printf("RESULT mode=fill status=ok queues=%ld messages=%ld size=%ld fill_s=%.2f msgs_per_s=%.0f\n",
           queues, total, cfg.size, took, (double)total / took);
    qb_close(c);
    free(body);
    for (long i = 0; i < queues; i++)
        free(names[i]);
    free(names);
    return 0;
}

/* ------------------------------------------------------------------ wait-queue */

static int mode_wait_queue(void)
{
    const double t0 = qb_now_s();
    double first_connect = -1;
    long attempts = 0, last_count = -1;
    char err[512] = "", last_err[512] = "";
    amqp_connection_state_t c = NULL;
    while (qb_now_s() - t0 < cfg.timeout) {
        attempts++;
        if (!c) {
            c = qb_open(&cfg.ep, &cfg.cr, 0, 1000, err, sizeof err);
            if (!c) {
                snprintf(last_err, sizeof last_err, "%s", err);
                qb_sleep_s(0.01);
                continue;
            }
            if (first_connect < 0)
                first_connect = qb_now_s() - t0;
        }
        amqp_queue_declare_ok_t *ok =
            amqp_queue_declare(c, 1, amqp_cstring_bytes(cfg.queue), 1, 0, 0, 0, amqp_empty_table);
        if (qb_reply_ok(amqp_get_rpc_reply(c), "queue.declare passive", err, sizeof err) && ok) {
            last_count = (long)ok->message_count;
            if (last_count >= cfg.n) {
                double ready = qb_now_s() - t0;
                struct timespec rt;
                clock_gettime(CLOCK_REALTIME, &rt);
                printf("RESULT mode=wait-queue status=ok ready_s=%.3f ready_epoch=%lld.%09ld first_connect_s=%.3f"
                       " messages=%ld attempts=%ld\n",
                       ready, (long long)rt.tv_sec, rt.tv_nsec, first_connect, last_count, attempts);
                qb_close(c);
                return 0;
            }
        } else {
            /* 404 (not recovered yet) closes the channel: start over on a new connection */
            snprintf(last_err, sizeof last_err, "%s", err);
            amqp_destroy_connection(c);
            c = NULL;
        }
        qb_sleep_s(0.01);
    }
    for (char *p = last_err; *p; p++)
        if (*p == ' ')
            *p = '_';
    printf("RESULT mode=wait-queue status=timeout ready_s=-1 first_connect_s=%.3f messages=%ld attempts=%ld last_error=%s\n",
           first_connect, last_count, attempts, last_err[0] ? last_err : "none");
    if (c)
        amqp_destroy_connection(c);
    return 1;
}

/* ------------------------------------------------------------------ CLI */

static void usage(int code)
{
    fprintf(code ? stderr : stdout,
            "usage: quayscale queues|conns|fill|wait-queue [options]\n"
            "  -H, --host H          broker host (default 127.0.0.1)\n"
            "  -p, --port P          broker port (default 5672)\n"
            "  -n, --count N         queues or connections (default 1000)\n"
            "      --watch-pid PID   broker process whose VmRSS is measured\n"
            "      --settle S        pause before each RSS reading (default 2)\n"
            "  queues:\n"
            "  -k, --conns K         connections declaring in parallel (default 4)\n"
            "  -w, --window W        methods in flight per connection (default 128)\n"
            "      --prefix NAME     queue name prefix (default quayscale)\n"
            "      --durable         durable queues\n"
            "      --keep            do not delete the queues afterwards\n"
            "  conns:\n"
            "  -t, --threads T       connections opened concurrently (default 8)\n"
            "      --hold S          keep the connections open S more seconds (default 0)\n"
            "  fill:\n"
            "      --names FILE      the queues, one name per line (-n: messages per queue)\n"
            "  -s, --size BYTES      message size (default 1024)\n"
            "  -w, --window W        unconfirmed publishes (default 1000)\n"
            "  wait-queue:\n"
            "  -q, --queue NAME      queue to declare passively; ready when it holds >= -n messages\n"
            "      --timeout S       give up after S s (default 300)\n"
            "      --user U --pass P --vhost V   (default guest guest /)\n");
    exit(code);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage(2);
    const char *mode = argv[1];
    if (!strcmp(mode, "-h") || !strcmp(mode, "--help"))
        usage(0);
    snprintf(cfg.ep.host, sizeof cfg.ep.host, "127.0.0.1");
    cfg.ep.port = 5672;
    snprintf(cfg.cr.user, sizeof cfg.cr.user, "guest");
    snprintf(cfg.cr.pass, sizeof cfg.cr.pass, "guest");
    snprintf(cfg.cr.vhost, sizeof cfg.cr.vhost, "/");
    snprintf(cfg.prefix, sizeof cfg.prefix, "quayscale");
    cfg.n = 1000;
    cfg.conns = 4;
    cfg.window = 0; /* the mode's default: 128 declares, 1000 publishes */
    cfg.threads = 8;
    cfg.settle = 2;
    cfg.timeout = 300;
    cfg.size = 1024;
    enum { O_TIMEOUT = 255, O_WATCH = 256, O_SETTLE, O_HOLD, O_PREFIX, O_DURABLE, O_KEEP, O_USER, O_PASS, O_VHOST, O_HELP, O_NAMES };
    static const struct option lo[] = {
        {"host", required_argument, 0, 'H'},       {"port", required_argument, 0, 'p'},
        {"count", required_argument, 0, 'n'},      {"conns", required_argument, 0, 'k'},
        {"window", required_argument, 0, 'w'},     {"threads", required_argument, 0, 't'},
        {"watch-pid", required_argument, 0, O_WATCH}, {"settle", required_argument, 0, O_SETTLE},
        {"hold", required_argument, 0, O_HOLD},    {"prefix", required_argument, 0, O_PREFIX},
        {"durable", no_argument, 0, O_DURABLE},    {"keep", no_argument, 0, O_KEEP},
        {"user", required_argument, 0, O_USER},    {"pass", required_argument, 0, O_PASS},
        {"vhost", required_argument, 0, O_VHOST},  {"help", no_argument, 0, O_HELP},
        {"queue", required_argument, 0, 'q'},      {"timeout", required_argument, 0, O_TIMEOUT},
        {"names", required_argument, 0, O_NAMES},  {"size", required_argument, 0, 's'},
        {0, 0, 0, 0}};
    int o;
    optind = 2;
    while ((o = getopt_long(argc, argv, "H:p:n:k:w:t:q:s:", lo, NULL)) != -1) {
        switch (o) {
        case 'H': snprintf(cfg.ep.host, sizeof cfg.ep.host, "%s", optarg); break;
        case 'p': cfg.ep.port = atoi(optarg); break;
        case 'n': cfg.n = atol(optarg); break;
        case 'k': cfg.conns = atoi(optarg); break;
        case 'w': cfg.window = atoi(optarg); break;
        case 't': cfg.threads = atoi(optarg); break;
        case O_WATCH: cfg.watch = atoi(optarg); break;
        case O_SETTLE: cfg.settle = atof(optarg); break;
        case O_HOLD: cfg.hold = atof(optarg); break;
        case O_PREFIX: snprintf(cfg.prefix, sizeof cfg.prefix, "%s", optarg); break;
        case O_DURABLE: cfg.durable = true; break;
        case O_KEEP: cfg.keep = true; break;
        case O_USER: snprintf(cfg.cr.user, sizeof cfg.cr.user, "%s", optarg); break;
        case O_PASS: snprintf(cfg.cr.pass, sizeof cfg.cr.pass, "%s", optarg); break;
        case O_VHOST: snprintf(cfg.cr.vhost, sizeof cfg.cr.vhost, "%s", optarg); break;
        case 'q': snprintf(cfg.queue, sizeof cfg.queue, "%s", optarg); break;
        case O_TIMEOUT: cfg.timeout = atof(optarg); break;
        case O_NAMES: snprintf(cfg.names, sizeof cfg.names, "%s", optarg); break;
        case 's': cfg.size = atol(optarg); break;
        case O_HELP: usage(0); break;
        default: usage(2);
        }
    }
    if (cfg.window == 0)
        cfg.window = !strcmp(mode, "fill") ? 1000 : 128;
    if (optind < argc || cfg.n < 1 || cfg.conns < 1 || cfg.window < 1 || cfg.threads < 1)
        usage(2);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "queues"))
        return mode_queues();
    if (!strcmp(mode, "conns"))
        return mode_conns();
    if (!strcmp(mode, "fill")) {
        if (!cfg.names[0] || cfg.size < 1)
            usage(2);
        return mode_fill();
    }
    if (!strcmp(mode, "wait-queue")) {
        if (!cfg.queue[0])
            usage(2);
        return mode_wait_queue();
    }
    usage(2);
}
