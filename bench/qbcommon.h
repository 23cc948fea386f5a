/*
 * qbcommon.h -- small helpers shared by quaybench.c and quayscale.c (header-only, all static
 * inline so each tool compiles on its own: cc -O2 -std=c17 tool.c -lrabbitmq -lpthread).
 *
 * Contents: clocks, endpoint parsing, connection open/close on librabbitmq, reply decoding,
 * and /proc sampling of the broker process (CPU ticks, VmRSS/VmHWM, peak reset).
 */
#ifndef QB_COMMON_H
#define QB_COMMON_H

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char host[256];
    int port;
    char tls_ca[256]; /* AMQPS: the CA file the broker's certificate must verify against; "" = plain */
} qb_endpoint;

typedef struct {
    char user[64], pass[64], vhost[128];
} qb_creds;

static inline uint64_t qb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double qb_now_s(void) { return (double)qb_now_ns() / 1e9; }

static inline void qb_sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* "host:port", ":port", "port" or "host" (port stays as given default) */
static inline void qb_parse_endpoint(const char *s, qb_endpoint *ep)
{
    const char *colon = strrchr(s, ':');
    if (colon) {
        size_t hl = (size_t)(colon - s);
        if (hl >= sizeof ep->host)
            hl = sizeof ep->host - 1;
        if (hl) {
            memcpy(ep->host, s, hl);
            ep->host[hl] = 0;
        }
        ep->port = atoi(colon + 1);
    } else if (s[0] >= '0' && s[0] <= '9' && !strchr(s, '.')) {
        ep->port = atoi(s);
    } else {
        snprintf(ep->host, sizeof ep->host, "%s", s);
    }
}

/* Describe a non-normal RPC reply into buf. Returns 1 if the reply was normal. */
static inline int qb_reply_ok(amqp_rpc_reply_t r, const char *what, char *buf, size_t n)
{
    switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        return 1;
    case AMQP_RESPONSE_NONE:
        snprintf(buf, n, "%s: no reply", what);
        break;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        snprintf(buf, n, "%s: %s", what, amqp_error_string2(r.library_error));
        break;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            const amqp_connection_close_t *m = r.reply.decoded;
            snprintf(buf, n, "%s: connection closed by broker: %u %.*s", what, m->reply_code,
                     (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        } else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            const amqp_channel_close_t *m = r.reply.decoded;
            snprintf(buf, n, "%s: channel closed by broker: %u %.*s", what, m->reply_code,
                     (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        } else {
            snprintf(buf, n, "%s: unexpected method 0x%08x", what, (unsigned)r.reply.id);
        }
        break;
    }
    return 0;
}

/*
 * Open a TCP connection, log in (heartbeats off) and open channel 1.
 * frame_max 0 = librabbitmq's default (131072). Returns NULL with err filled on failure.
 */
static inline amqp_connection_state_t qb_open(const qb_endpoint *ep, const qb_creds *cr, int frame_max,
                                              int timeout_ms, char *err, size_t errn)
{
    amqp_connection_state_t c = amqp_new_connection();
    if (!c) {
        snprintf(err, errn, "amqp_new_connection failed");
        return NULL;
    }
    amqp_socket_t *s = ep->tls_ca[0] ? amqp_ssl_socket_new(c) : amqp_tcp_socket_new(c);
    if (!s || (ep->tls_ca[0] && amqp_ssl_socket_set_cacert(s, ep->tls_ca) != AMQP_STATUS_OK)) {
        snprintf(err, errn, "%s failed", ep->tls_ca[0] ? "amqp_ssl_socket_new/set_cacert" : "amqp_tcp_socket_new");
        amqp_destroy_connection(c);
        return NULL;
    }
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    int rc = amqp_socket_open_noblock(s, ep->host, ep->port, &tv);
    if (rc != AMQP_STATUS_OK) {
        snprintf(err, errn, "connect %s:%d: %s", ep->host, ep->port, amqp_error_string2(rc));
        amqp_destroy_connection(c);
        return NULL;
    }
    amqp_set_handshake_timeout(c, &tv);
    struct timeval rpc = {30, 0};
    amqp_set_rpc_timeout(c, &rpc);
    /* advertise capabilities.connection.blocked so brokers send connection.blocked/unblocked
     * (librabbitmq merges this with its default capabilities) */
    amqp_table_entry_t cap_e = {.key = amqp_cstring_bytes("connection.blocked"),
                                .value = {.kind = AMQP_FIELD_KIND_BOOLEAN, .value = {.boolean = 1}}};
    amqp_table_entry_t prop_e = {.key = amqp_cstring_bytes("capabilities"),
                                 .value = {.kind = AMQP_FIELD_KIND_TABLE, .value = {.table = {1, &cap_e}}}};
    amqp_table_t props = {1, &prop_e};
    amqp_rpc_reply_t r = amqp_login_with_properties(c, cr->vhost, 0, frame_max > 0 ? frame_max : AMQP_DEFAULT_FRAME_SIZE, 0,
                                                    &props, AMQP_SASL_METHOD_PLAIN, cr->user, cr->pass);
    if (!qb_reply_ok(r, "login", err, errn)) {
        amqp_destroy_connection(c);
        return NULL;
    }
    amqp_channel_open(c, 1);
    if (!qb_reply_ok(amqp_get_rpc_reply(c), "channel.open", err, errn)) {
        amqp_destroy_connection(c);
        return NULL;
    }
    return c;
}

static inline void qb_close(amqp_connection_state_t c)
{
    if (!c)
        return;
    amqp_channel_close(c, 1, AMQP_REPLY_SUCCESS);
    amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c);
}

/* ---- /proc sampling of a (broker) process ---- */

/* utime+stime of a process in clock ticks, -1 if unreadable */
static inline long long qb_proc_cpu_ticks(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* comm (field 2) may contain spaces: parse after the last ')' ; field 3 is state */
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p++;
    unsigned long long ut = 0, st = 0;
    /* fields 3..15: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (long long)(ut + st);
}

static inline double qb_ticks_to_us(long long ticks)
{
    static long hz;
    if (!hz)
        hz = sysconf(_SC_CLK_TCK);
    return (double)ticks * 1e6 / (double)(hz > 0 ? hz : 100);
}

/* a "Key:  123 kB" line of /proc/PID/status, in KiB; -1 if unreadable */
static inline long qb_proc_status_kib(int pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t kl = strlen(key);
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = atol(line + kl + 1);
            break;
        }
    fclose(f);
    return v;
}

/* Reset the process' peak RSS (VmHWM) to its current RSS (Linux >= 4.0). 1 on success. */
static inline int qb_proc_reset_hwm(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", pid);
    FILE *f = fopen(path, "w");
    if (!f)
        return 0;
    int ok = fputs("5", f) >= 0;
    if (fclose(f) != 0)
        ok = 0;
    return ok;
}

/* Raise RLIMIT_NOFILE to at least want (soft, and hard if we are allowed). Returns the new soft limit. */
static inline long qb_raise_nofile(long want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    if ((long)rl.rlim_cur >= want)
        return (long)rl.rlim_cur;
    if ((long)rl.rlim_max < want) {
        struct rlimit r2 = {(rlim_t)want, (rlim_t)want};
        if (setrlimit(RLIMIT_NOFILE, &r2) == 0)
            return want;
    }
    rl.rlim_cur = (long)rl.rlim_max < want ? rl.rlim_max : (rlim_t)want;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    return (long)rl.rlim_cur;
}

#endif
