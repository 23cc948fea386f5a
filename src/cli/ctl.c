/*
 * ctl.c: quayctl, the admin tool. It asks a running quayd's management
 * API (quayd --http ADDR:PORT, or --https) with one blocking HTTP request
 * over a plain socket, or over TLS with OpenSSL, and prints the answer:
 * the JSON as it came with --json, else a table for people.
 *
 * It owns nothing beyond the process; it changes broker state only
 * through the API's own verbs (leave, forget, set-policy, clear-policy) and links
 * none of the broker's code (no libuv), so it runs anywhere the socket
 * reaches. It logs in with HTTP Basic: --user/--password, else the
 * environment's QUAY_USER/QUAY_PASSWORD, else guest/guest (the default
 * broker's administrator, from loopback). Exit codes follow sysexits.h,
 * as rabbitmqctl's do: 0 done, 64 usage, 69 the broker is unreachable,
 * 76 a bad or non-200 answer, 77 the login or its rights were refused.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "cli/ctl_json.h"
#include "lib/base64.h"

#define EXIT_USAGE 64
#define EXIT_DATAERR 65
#define EXIT_UNAVAILABLE 69
#define EXIT_PROTOCOL 76
#define EXIT_NOPERM 77

#define DEFAULT_HTTP "127.0.0.1:15672"
#define DEFAULT_USER "guest" /* and its password: quayd's default user */
#define CREDENTIALS_SIZE_MAX 1024 /* user:password, as quayd takes them */
#define DEFAULT_TIMEOUT_MS 10000
#define RESPONSE_SIZE_MAX (256u << 20)

/* usage(): the commands of one broker and its cluster. */
static const char usage_head[] =
    "usage: quayctl [--http HOST:PORT | --https HOST:PORT [--cacert FILE]]\n"
    "               [--user NAME] [--password PW] [--json] [--timeout SECONDS]\n"
    "               COMMAND [ARGS]\n"
    "\n"
    "Asks a running quayd (started with --http) through its management API.\n"
    "\n"
    "commands:\n"
    "  status        the broker: version, uptime, totals, alarms (GET /api/overview)\n"
    "  queues        every queue with its message counts (GET /api/queues)\n"
    "  connections   every client connection (GET /api/connections)\n"
    "  cluster       the cluster: leader, map epoch, brokers (GET /api/cluster)\n"
    "  leave         this broker leaves the cluster (POST /api/cluster/leave)\n"
    "  forget BROKER a broker that is down for good leaves the map: its queues\n"
    "                go to their backups (or start again empty where it had\n"
    "                the only copy), its backups and exchanges elsewhere\n"
    "                (POST /api/cluster/forget)\n"
    "  drain BROKER  every queue BROKER is primary or backup of moves to other\n"
    "                brokers while they serve; then it may leave\n"
    "                (POST /api/cluster/drain)\n"
    "  revive BROKER a draining broker takes queues again (POST\n"
    "                /api/cluster/revive)\n"
    "  rebalance [on|off]\n"
    "                without an argument: move queues until every broker holds\n"
    "                its share; on/off: keep doing so automatically, or stop\n"
    "                (POST /api/cluster/rebalance)\n"
    "  offload BROKER --to BROKER (--fraction F | --queues REGEX [--vhost V])\n"
    "                move a fraction F (0..1] of the queues BROKER is primary\n"
    "                of, or those whose names match REGEX, to the --to broker\n"
    "                while they serve (POST /api/cluster/offload)\n"
    "  move QUEUE --to BROKER [--vhost VHOST] [--backup-of B]\n"
    "                hand QUEUE (of VHOST, default /) over to BROKER while it\n"
    "                serves: BROKER catches up as a backup, then takes over;\n"
    "                with --backup-of, BROKER replaces the queue's backup B once\n"
    "                caught up; 'cluster' shows the moves in progress\n"
    "                (POST /api/cluster/move)\n";

/* usage(): replication policies. */
static const char usage_policies[] =
    "  policies      every replication policy (GET /api/policies)\n"
    "  set-policy VHOST NAME PATTERN BACKUPS [PRIORITY]\n"
    "                queues of VHOST whose name matches the regular expression\n"
    "                PATTERN get BACKUPS backups (0..3) unless their x-quay-backups\n"
    "                says otherwise; the highest PRIORITY (default 0) wins\n"
    "                (PUT /api/policies/VHOST/NAME)\n"
    "  clear-policy VHOST NAME   (DELETE /api/policies/VHOST/NAME)\n";

/* usage(): users, vhosts and permissions. */
static const char usage_users[] =
    "  list-users    every user and its tags (GET /api/users)\n"
    "  add-user NAME PASSWORD [--tags TAG,...]   (PUT /api/users/NAME)\n"
    "  delete-user NAME   its connections are closed (DELETE /api/users/NAME)\n"
    "  change-password NAME PASSWORD   its tags stay\n"
    "  set-user-tags NAME [TAG...]   its password stays (none: no tags)\n"
    "  list-vhosts   (GET /api/vhosts)\n"
    "  add-vhost NAME / delete-vhost NAME   deleting one deletes its queues,\n"
    "                exchanges and permissions and closes its connections\n"
    "  list-permissions [-p VHOST]   every user's permissions, in every vhost or\n"
    "                in VHOST (GET /api/permissions, /api/vhosts/VHOST/permissions)\n"
    "  set-permissions [-p VHOST] USER CONFIGURE WRITE READ   three regular\n"
    "                expressions (\"\" matches nothing); VHOST defaults to /\n"
    "  clear-permissions [-p VHOST] USER\n"
    "  set-vhost-limits [-p VHOST] '{\"max-connections\": N, \"max-queues\": N}'\n"
    "                one or both (negative: no limit; PUT /api/vhost-limits/VHOST/NAME)\n"
    "  clear-vhost-limits [-p VHOST]   both\n"
    "  set-user-limits USER '{\"max-connections\": N, \"max-channels\": N}'\n"
    "  clear-user-limits USER NAME|all\n"
    "  list-vhost-limits [-p VHOST] / list-user-limits   (GET /api/vhost-limits ...)\n"
    "\n";

/* usage(): as rabbitmqctl names them. */
static const char usage_rabbit[] =
    "  as rabbitmqctl and rabbitmq-diagnostics name them (RabbitMQ's API paths):\n"
    "  list-queues [COLUMN...]       default: name messages_ready\n"
    "                                messages_unacknowledged consumers\n"
    "  list-exchanges [COLUMN...]    default: name type\n"
    "  list-bindings [COLUMN...]     default: source destination_type destination\n"
    "                                routing_key\n"
    "  list-connections [COLUMN...]  default: name user vhost channels state\n"
    "                (COLUMN: any field of the API's objects; --vhost V: one vhost)\n"
    "  cluster-status                every broker: name, running, state (GET /api/nodes)\n"
    "  export-definitions FILE       RabbitMQ's definitions JSON to FILE (- = stdout)\n"
    "  import-definitions FILE       apply a definitions file (all or nothing)\n"
    "  await-startup                 wait (up to --timeout) until the API answers\n"
    "  ping                          is the broker up? (GET /api/healthchecks/node)\n"
    "\n";

/* usage(): the options and exit statuses. */
static const char usage_options[] =
    "options:\n"
    "  --http HOST:PORT   the API's address (default " DEFAULT_HTTP "); [V6]:PORT\n"
    "  --https HOST:PORT  the API over TLS (quayd --https); its certificate must\n"
    "                     verify and name HOST\n"
    "  --cacert FILE      PEM CAs to verify it with (default: the system's)\n"
    "  --user NAME        log in as NAME (default: $QUAY_USER, else " DEFAULT_USER ")\n"
    "  --password PW      its password (default: $QUAY_PASSWORD; " DEFAULT_USER "'s\n"
    "                     when no user is given either);\n"
    "                     prefer the variable: other users can see a command line\n"
    "  --json             print the API's JSON as it is\n"
    "  --timeout SECONDS  give up after this long (default 10)\n"
    "  --help             this text\n"
    "\n"
    "The user needs a management tag on the broker (administrator for leave and\n"
    "forget, policymaker for set-policy and clear-policy, monitoring for cluster,\n"
    "administrator for the user, vhost and permission commands).\n"
    "\n"
    "exit status: 0 done, 64 usage, 65 a file that cannot be read or written,\n"
    "69 broker unreachable (or not started within --timeout), 76 bad answer\n"
    "(a definitions file refused too), 77 login or right refused\n";

static void usage(FILE *out)
{
    fputs(usage_head, out);
    fputs(usage_policies, out);
    fputs(usage_users, out);
    fputs(usage_rabbit, out);
    fputs(usage_options, out);
}

/* ---- the HTTP GET ------------------------------------------------------ */

struct endpoint {
    char host[256];
    char port[8];
    bool tls;                /* --https */
    const char *cacert;      /* --cacert, or NULL: the system's CAs */
};

/* The connection to the API: a socket, and its TLS session with --https. */
struct stream {
    int fd;
    SSL_CTX *ctx;            /* owned, or NULL */
    SSL *ssl;                /* owned, or NULL */
};

static int parse_endpoint(const char *text, struct endpoint *out)
{
    const char *host = text, *host_end, *port;
    if (text[0] == '[') {
        host = text + 1;
        host_end = strchr(host, ']');
        if (!host_end || host_end[1] != ':')
            return -1;
        port = host_end + 2;
    } else {
        host_end = strrchr(text, ':');
        if (!host_end)
            return -1;
        port = host_end + 1;
    }
    size_t host_size = (size_t)(host_end - host);
    size_t port_size = strlen(port);
    if (host_size >= sizeof out->host || port_size == 0 || port_size >= sizeof out->port)
        return -1;
    if (strspn(port, "0123456789") != port_size)
        return -1;
    memcpy(out->host, host, host_size);
    out->host[host_size] = '\0';
    if (host_size == 0)
        snprintf(out->host, sizeof out->host, "127.0.0.1");
    memcpy(out->port, port, port_size + 1);
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for `events` or the deadline passes. */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, (int)left);
        if (rc > 0)
            return 0;
        if (rc == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

/* A non-blocking connect to one address, bounded by the deadline. */
static int connect_one(const struct addrinfo *ai, int64_t deadline_ms)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
    if (fd < 0)
        return -errno;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        int err = errno;
        if (err == EINPROGRESS)
            err = -wait_fd(fd, POLLOUT, deadline_ms);
        if (err == 0) {
            socklen_t len = sizeof err;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
        }
        if (err != 0) {
            close(fd);
            return -err;
        }
    }
    return fd;
}

/* await-startup's attempts before the last: a refused connection is
 * expected, not news. */
static bool quiet_connect;

static int connect_endpoint(const struct endpoint *ep, int64_t deadline_ms)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *list;
    int rc = getaddrinfo(ep->host, ep->port, &hints, &list);
    if (rc != 0) {
        fprintf(stderr, "quayctl: cannot resolve %s: %s\n", ep->host, gai_strerror(rc));
        return -1;
    }
    int fd = -ECONNREFUSED;
    for (struct addrinfo *ai = list; ai; ai = ai->ai_next) {
        fd = connect_one(ai, deadline_ms);
        if (fd >= 0)
            break;
    }
    freeaddrinfo(list);
    if (fd < 0 && !quiet_connect) {
        fprintf(stderr, "quayctl: cannot connect to %s:%s: %s (is quayd running with --http?)\n",
                ep->host, ep->port, strerror(-fd));
    }
    return fd < 0 ? -1 : fd;
}

/* One send or receive: bytes moved, 0 at the end of the stream (a
 * receive), -EAGAIN with *events set to what to wait for, or -errno. */
static ssize_t io_once(struct stream *s, bool sending, char *data, size_t size, short *events)
{
    if (s->ssl == NULL) {
        ssize_t n = sending ? send(s->fd, data, size, MSG_NOSIGNAL) : recv(s->fd, data, size, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            *events = sending ? POLLOUT : POLLIN;
            return -EAGAIN;
        }
        return n < 0 ? -errno : n;
    }
    int cap = size > INT_MAX ? INT_MAX : (int)size;
    ERR_clear_error();
    int n = sending ? SSL_write(s->ssl, data, cap) : SSL_read(s->ssl, data, cap);
    if (n > 0)
        return n;
    switch (SSL_get_error(s->ssl, n)) {
    case SSL_ERROR_WANT_READ:
        *events = POLLIN;
        return -EAGAIN;
    case SSL_ERROR_WANT_WRITE:
        *events = POLLOUT;
        return -EAGAIN;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    default:
        return -EPROTO;
    }
}

static int send_all(struct stream *s, const char *data, size_t size, int64_t deadline_ms)
{
    while (size > 0) {
        short events;
        ssize_t n = io_once(s, true, (char *)data, size, &events);
        if (n == -EAGAIN) {
            int rc = wait_fd(s->fd, events, deadline_ms);
            if (rc != 0)
                return rc;
            continue;
        }
        if (n < 0)
            return (int)n;
        data += n;
        size -= (size_t)n;
    }
    return 0;
}

struct buffer {
    char *data;    /* owned, NUL-terminated */
    size_t size;
    size_t cap;
};

/* Reads until the server closes (it always answers with Connection: close). */
static int receive_all(struct stream *s, struct buffer *in, int64_t deadline_ms)
{
    for (;;) {
        if (in->cap - in->size < 4096 + 1) {
            if (in->cap >= RESPONSE_SIZE_MAX)
                return -EFBIG;
            size_t cap = in->cap ? in->cap * 2 : 65536;
            char *grown = realloc(in->data, cap);
            if (!grown)
                return -ENOMEM;
            in->data = grown;
            in->cap = cap;
        }
        short events;
        ssize_t n = io_once(s, false, in->data + in->size, in->cap - in->size - 1, &events);
        if (n == -EAGAIN) {
            int rc = wait_fd(s->fd, events, deadline_ms);
            if (rc != 0)
                return rc;
            continue;
        }
        if (n < 0)
            return (int)n;
        in->data[in->size + (size_t)n] = '\0';
        if (n == 0)
            return 0;
        in->size += (size_t)n;
    }
}

struct response {
    int status;
    const char *body;  /* borrowed from the receive buffer */
    size_t body_size;
};

/* Splits "HTTP/1.1 200 OK\r\n...headers...\r\n\r\nbody". */
static int parse_response(char *data, size_t size, struct response *out)
{
    int minor, status;
    if (sscanf(data, "HTTP/1.%d %3d", &minor, &status) != 2)
        return -1;
    char *end = strstr(data, "\r\n\r\n");
    if (!end)
        return -1;
    *end = '\0';
    out->status = status;
    out->body = end + 4;
    out->body_size = size - (size_t)(out->body - data);
    for (char *line = strstr(data, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
        if (strncasecmp(line + 2, "Content-Length:", 15) == 0) {
            unsigned long long n = strtoull(line + 17, NULL, 10);
            if (n != out->body_size)
                return -1; /* cut short */
        } else if (strncasecmp(line + 2, "Transfer-Encoding:", 18) == 0) {
            return -1; /* quayd never chunks: this is not quayd */
        }
    }
    return 0;
}

/* --https: a TLS handshake on s->fd, the server's certificate verified
 * against --cacert (else the system's CAs) and for the host (name or
 * address) we were told. Returns 0, or -1 (printed). */
static int tls_start(struct stream *s, const struct endpoint *ep, int64_t deadline_ms)
{
    s->ctx = SSL_CTX_new(TLS_client_method());
    s->ssl = s->ctx ? SSL_new(s->ctx) : NULL;
    if (s->ssl == NULL) {
        fprintf(stderr, "quayctl: no memory for TLS\n");
        return -1;
    }
    SSL_set_min_proto_version(s->ssl, TLS1_2_VERSION);
    SSL_set_verify(s->ssl, SSL_VERIFY_PEER, NULL);
    int loaded = ep->cacert ? SSL_CTX_load_verify_locations(s->ctx, ep->cacert, NULL)
                            : SSL_CTX_set_default_verify_paths(s->ctx);
    if (loaded != 1) {
        fprintf(stderr, "quayctl: cannot load the CAs of %s\n",
                ep->cacert ? ep->cacert : "the system");
        return -1;
    }
    /* An address is checked against the certificate's IP names, a name
     * against its DNS names (and sent as SNI). */
    struct in6_addr address;
    if (inet_pton(AF_INET, ep->host, &address) == 1 ||
        inet_pton(AF_INET6, ep->host, &address) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s->ssl), ep->host);
    } else if (SSL_set_tlsext_host_name(s->ssl, ep->host) != 1 ||
               SSL_set1_host(s->ssl, ep->host) != 1) {
        fprintf(stderr, "quayctl: bad host name '%s'\n", ep->host);
        return -1;
    }
    SSL_set_fd(s->ssl, s->fd);
    for (;;) {
        ERR_clear_error();
        int rc = SSL_connect(s->ssl);
        if (rc == 1)
            return 0;
        int err = SSL_get_error(s->ssl, rc);
        if ((err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) &&
            wait_fd(s->fd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_ms) == 0)
            continue;
        long verify = SSL_get_verify_result(s->ssl);
        char reason[256];
        ERR_error_string_n(ERR_get_error(), reason, sizeof reason);
        fprintf(stderr, "quayctl: TLS handshake with %s:%s failed: %s\n", ep->host, ep->port,
                verify != X509_V_OK ? X509_verify_cert_error_string(verify) : reason);
        return -1;
    }
}

static void stream_close(struct stream *s)
{
    if (s->ssl != NULL)
        SSL_shutdown(s->ssl); /* our close_notify; the server's is not awaited */
    SSL_free(s->ssl);
    SSL_CTX_free(s->ctx);
    close(s->fd);
}

/* Sends method path (with body, or none) and reads the answer: on
 * success *in holds the response and *res points into it. authorization
 * is the Basic credentials' base64. Returns 0 or an exit status (the
 * error is printed). */
static int http_request(const struct endpoint *ep, const char *method, const char *path,
                        const char *body, const char *authorization, int timeout_ms,
                        struct buffer *in, struct response *res)
{
    int64_t deadline_ms = now_ms() + timeout_ms;
    struct stream s = {.fd = connect_endpoint(ep, deadline_ms)};
    if (s.fd < 0)
        return EXIT_UNAVAILABLE;
    if (ep->tls && tls_start(&s, ep, deadline_ms) != 0) {
        stream_close(&s);
        return EXIT_UNAVAILABLE;
    }
    char request[8192];
    bool v6 = strchr(ep->host, ':') != NULL;
    int n = snprintf(request, sizeof request,
                     "%s %s HTTP/1.1\r\nHost: %s%s%s:%s\r\nAccept: application/json\r\n"
                     "User-Agent: quayctl\r\nConnection: close\r\n"
                     "Authorization: Basic %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, v6 ? "[" : "", ep->host, v6 ? "]" : "", ep->port,
                     authorization, body ? strlen(body) : 0);
    if (n < 0 || (size_t)n >= sizeof request) {
        explicit_bzero(request, sizeof request);
        stream_close(&s);
        fprintf(stderr, "quayctl: %s %s: the request is too long\n", method, path);
        return EXIT_USAGE;
    }
    int rc = send_all(&s, request, (size_t)n, deadline_ms);
    explicit_bzero(request, sizeof request); /* the credentials */
    if (rc == 0 && body != NULL) /* apart: a definitions file may be megabytes */
        rc = send_all(&s, body, strlen(body), deadline_ms);
    if (rc == 0)
        rc = receive_all(&s, in, deadline_ms);
    stream_close(&s);
    if (rc != 0) {
        fprintf(stderr, "quayctl: %s %s from %s:%s: %s\n", method, path, ep->host, ep->port,
                strerror(-rc));
        return rc == -ETIMEDOUT ? EXIT_UNAVAILABLE : EXIT_PROTOCOL;
    }
    if (in->size == 0 || parse_response(in->data, in->size, res) != 0) {
        fprintf(stderr, "quayctl: %s %s from %s:%s: not an HTTP answer from quayd\n", method,
                path, ep->host, ep->port);
        return EXIT_PROTOCOL;
    }
    return 0;
}

/* ---- printing ---------------------------------------------------------- */

/* A value as one table cell: control characters shown as '?', so a name
 * cannot break the table or the terminal. Returns a new string. */
static char *cell_text(const struct jvalue *v)
{
    const char *s = "-";
    char joined[1024];
    if (v && (v->type == J_STRING || v->type == J_NUMBER)) {
        s = v->text;
    } else if (v && v->type == J_BOOL) {
        s = v->boolean ? "yes" : "no";
    } else if (v && v->type == J_ARRAY) {
        size_t n = 0;
        joined[0] = '\0';
        for (const struct jvalue *e = v->child; e; e = e->next) {
            const char *t = e->text ? e->text : "?";
            n += (size_t)snprintf(joined + n, sizeof joined - n, "%s%s", n ? "," : "", t);
            if (n >= sizeof joined)
                break;
        }
        s = n ? joined : "-";
    } else if (v && v->type == J_OBJECT) { /* {"max-queues": 4} -> max-queues=4 */
        size_t n = 0;
        joined[0] = '\0';
        for (const struct jvalue *e = v->child; e; e = e->next) {
            n += (size_t)snprintf(joined + n, sizeof joined - n, "%s%s=%s", n ? "," : "",
                                  e->key, e->text ? e->text : "?");
            if (n >= sizeof joined)
                break;
        }
        s = n ? joined : "-";
    }
    char *out = strdup(s);
    if (!out)
        abort();
    for (char *p = out; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    }
    return out;
}

/* Display width: UTF-8 code points (every one taken as one column). */
static size_t text_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

struct column {
    const char *key;
    const char *title;
    bool right;          /* numbers are right-aligned */
};

static void print_cell(const char *text, size_t width, bool right, bool last)
{
    size_t w = text_width(text);
    size_t pad = width > w ? width - w : 0;
    if (right)
        printf("%*s%s", (int)pad, "", text);
    else
        printf("%s%*s", text, last ? 0 : (int)pad, "");
    fputs(last ? "\n" : "  ", stdout);
}

static int compare_rows(const void *a, const void *b)
{
    char *const *ra = a, *const *rb = b;
    int c = strcmp(ra[0], rb[0]);
    return c ? c : strcmp(ra[1], rb[1]);
}

/* An array of objects as an aligned table, sorted by its first two
 * columns (the API lists in table order). */
static int print_table(const struct jvalue *array, const struct column *cols, size_t ncols)
{
    if (!array || array->type != J_ARRAY)
        return -1;
    size_t nrows = 0;
    for (const struct jvalue *e = array->child; e; e = e->next)
        nrows++;
    char **cells = calloc((nrows + 1) * ncols, sizeof *cells);
    size_t *width = calloc(ncols, sizeof *width);
    if (!cells || !width)
        abort();
    size_t r = 0;
    for (const struct jvalue *e = array->child; e; e = e->next, r++) {
        for (size_t c = 0; c < ncols; c++)
            cells[r * ncols + c] = cell_text(jget(e, cols[c].key));
    }
    qsort(cells, nrows, ncols * sizeof *cells, compare_rows);
    for (size_t c = 0; c < ncols; c++) {
        width[c] = text_width(cols[c].title);
        for (r = 0; r < nrows; r++) {
            size_t w = text_width(cells[r * ncols + c]);
            width[c] = w > width[c] ? w : width[c];
        }
    }
    for (size_t c = 0; c < ncols; c++)
        print_cell(cols[c].title, width[c], cols[c].right, c + 1 == ncols);
    for (r = 0; r < nrows; r++) {
        for (size_t c = 0; c < ncols; c++)
            print_cell(cells[r * ncols + c], width[c], cols[c].right, c + 1 == ncols);
    }
    for (size_t i = 0; i < nrows * ncols; i++)
        free(cells[i]);
    free(cells);
    free(width);
    return 0;
}

/* An object as "key  value" lines, nested objects flattened with dots. */
static void collect_pairs(const struct jvalue *object, const char *prefix, char ***pairs,
                          size_t *count)
{
    for (const struct jvalue *m = object->child; m; m = m->next) {
        char key[256];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", m->key);
        if (m->type == J_OBJECT) {
            collect_pairs(m, key, pairs, count);
            continue;
        }
        if (m->type == J_ARRAY && m->child && m->child->type == J_OBJECT)
            continue; /* a table of its own (print_object_arrays) */
        char **grown = realloc(*pairs, (*count + 2) * sizeof **pairs);
        if (!grown)
            abort();
        *pairs = grown;
        grown[(*count)++] = strdup(key);
        grown[(*count)++] = cell_text(m);
    }
}

/* Arrays of objects (a cluster's brokers, its moves) as tables after the
 * pairs, titled by their keys, with the first element's scalar members as
 * columns. */
static void print_object_arrays(const struct jvalue *object, const char *prefix)
{
    for (const struct jvalue *m = object->child; m; m = m->next) {
        char key[256];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", m->key);
        if (m->type == J_OBJECT) {
            print_object_arrays(m, key);
            continue;
        }
        if (m->type != J_ARRAY || !m->child || m->child->type != J_OBJECT)
            continue;
        struct column cols[32];
        char titles[32][64];
        size_t ncols = 0;
        for (const struct jvalue *f = m->child->child; f && ncols < 32; f = f->next) {
            if (f->type == J_OBJECT || (f->type == J_ARRAY && f->child &&
                                        f->child->type == J_OBJECT))
                continue;
            size_t i = 0;
            for (; f->key[i] && i + 1 < sizeof titles[0]; i++)
                titles[ncols][i] = (char)toupper((unsigned char)f->key[i]);
            titles[ncols][i] = '\0';
            cols[ncols] = (struct column){f->key, titles[ncols], f->type == J_NUMBER};
            ncols++;
        }
        printf("\n%s:\n", key);
        print_table(m, cols, ncols);
    }
}

static int print_pairs(const struct jvalue *object)
{
    if (!object || object->type != J_OBJECT)
        return -1;
    char **pairs = NULL;
    size_t count = 0, width = 0;
    collect_pairs(object, "", &pairs, &count);
    for (size_t i = 0; i < count; i += 2) {
        size_t w = text_width(pairs[i]);
        width = w > width ? w : width;
    }
    for (size_t i = 0; i < count; i += 2) {
        print_cell(pairs[i], width, false, false);
        print_cell(pairs[i + 1], 0, false, true);
        free(pairs[i]);
        free(pairs[i + 1]);
    }
    free(pairs);
    print_object_arrays(object, "");
    return 0;
}

/* ---- commands ---------------------------------------------------------- */

static const struct column queue_columns[] = {
    {"vhost", "VHOST", false},       {"name", "NAME", false},
    {"messages_ready", "READY", true}, {"messages_unacknowledged", "UNACKED", true},
    {"consumers", "CONSUMERS", true}, {"paged", "PAGED", true},
    {"durable", "DURABLE", false},   {"exclusive", "EXCLUSIVE", false},
    {"auto_delete", "AUTO_DELETE", false}, {"primary", "PRIMARY", false},
};

static const struct column connection_columns[] = {
    {"peer", "PEER", false},         {"user", "USER", false},
    {"vhost", "VHOST", false},       {"channels", "CHANNELS", true},
    {"state", "STATE", false},
};

static const struct column user_columns[] = {
    {"name", "NAME", false}, {"tags", "TAGS", false},
};

static const struct column vhost_columns[] = {
    {"name", "NAME", false},
};

static const struct column permission_columns[] = {
    {"user", "USER", false},         {"vhost", "VHOST", false},
    {"configure", "CONFIGURE", false}, {"write", "WRITE", false},
    {"read", "READ", false},
};

static const struct column vhost_limit_columns[] = {
    {"vhost", "VHOST", false}, {"value", "LIMITS", false},
};

static const struct column user_limit_columns[] = {
    {"user", "USER", false}, {"value", "LIMITS", false},
};

static const struct column policy_columns[] = {
    {"vhost", "VHOST", false},       {"name", "NAME", false},
    {"pattern", "PATTERN", false},   {"priority", "PRIORITY", true},
    {"backups", "BACKUPS", true},
};

#define LIST_COLUMNS_MAX 16

static const struct column node_columns[] = {
    {"name", "NAME", false}, {"running", "RUNNING", false}, {"state", "STATE", false},
    {"queues_owned", "PRIMARIES", true}, {"backups_held", "BACKUPS", true},
};

struct command {
    const char *name;
    const char *method;
    const char *path;                /* for commands with arguments: a prefix */
    const struct column *columns;    /* NULL: key/value pairs */
    size_t columns_count;
    int args_min, args_max;          /* positional arguments after the command */
};

static const struct command commands[] = {
    {"status", "GET", "/api/overview", NULL, 0, 0, 0},
    {"cluster", "GET", "/api/cluster", NULL, 0, 0, 0},
    {"queues", "GET", "/api/queues", queue_columns,
     sizeof queue_columns / sizeof queue_columns[0], 0, 0},
    {"connections", "GET", "/api/connections", connection_columns,
     sizeof connection_columns / sizeof connection_columns[0], 0, 0},
    {"leave", "POST", "/api/cluster/leave", NULL, 0, 0, 0},
    {"forget", "POST", "/api/cluster/forget", NULL, 0, 1, 1},
    {"move", "POST", "/api/cluster/move", NULL, 0, 1, 1},
    {"drain", "POST", "/api/cluster/drain", NULL, 0, 1, 1},
    {"revive", "POST", "/api/cluster/revive", NULL, 0, 1, 1},
    {"offload", "POST", "/api/cluster/offload", NULL, 0, 1, 1},
    {"rebalance", "POST", "/api/cluster/rebalance", NULL, 0, 0, 1},
    {"policies", "GET", "/api/policies", policy_columns,
     sizeof policy_columns / sizeof policy_columns[0], 0, 0},
    {"set-policy", "PUT", "/api/policies/", NULL, 0, 4, 5},
    {"clear-policy", "DELETE", "/api/policies/", NULL, 0, 2, 2},
    {"list-queues", "GET", "/api/queues", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"list-exchanges", "GET", "/api/exchanges", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"list-bindings", "GET", "/api/bindings", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"list-connections", "GET", "/api/connections", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"cluster-status", "GET", "/api/nodes", node_columns,
     sizeof node_columns / sizeof node_columns[0], 0, 0},
    {"export-definitions", "GET", "/api/definitions", NULL, 0, 1, 1},
    {"import-definitions", "POST", "/api/definitions", NULL, 0, 1, 1},
    {"await-startup", "GET", "/api/overview", NULL, 0, 0, 0},
    {"ping", "GET", "/api/healthchecks/node", NULL, 0, 0, 0},
    {"list-users", "GET", "/api/users", user_columns,
     sizeof user_columns / sizeof user_columns[0], 0, 0},
    {"add-user", "PUT", "/api/users/", NULL, 0, 2, 2},
    {"delete-user", "DELETE", "/api/users/", NULL, 0, 1, 1},
    {"change-password", "PUT", "/api/users/", NULL, 0, 2, 2},
    {"set-user-tags", "PUT", "/api/users/", NULL, 0, 1, 5},
    {"list-vhosts", "GET", "/api/vhosts", vhost_columns,
     sizeof vhost_columns / sizeof vhost_columns[0], 0, 0},
    {"add-vhost", "PUT", "/api/vhosts/", NULL, 0, 1, 1},
    {"delete-vhost", "DELETE", "/api/vhosts/", NULL, 0, 1, 1},
    {"list-permissions", "GET", "/api/permissions", permission_columns,
     sizeof permission_columns / sizeof permission_columns[0], 0, 0},
    {"set-permissions", "PUT", "/api/permissions/", NULL, 0, 4, 4},
    {"clear-permissions", "DELETE", "/api/permissions/", NULL, 0, 1, 1},
    {"list-vhost-limits", "GET", "/api/vhost-limits", vhost_limit_columns,
     sizeof vhost_limit_columns / sizeof vhost_limit_columns[0], 0, 0},
    {"list-user-limits", "GET", "/api/user-limits", user_limit_columns,
     sizeof user_limit_columns / sizeof user_limit_columns[0], 0, 0},
    {"set-vhost-limits", "PUT", "/api/vhost-limits/", NULL, 0, 1, 1},
    {"clear-vhost-limits", "DELETE", "/api/vhost-limits/", NULL, 0, 0, 0},
    {"set-user-limits", "PUT", "/api/user-limits/", NULL, 0, 2, 2},
    {"clear-user-limits", "DELETE", "/api/user-limits/", NULL, 0, 2, 2},
};

struct options {
    struct endpoint endpoint;
    const char *user;
    const char *password;
    bool json;
    int timeout_ms;
    const struct command *command;
    char *args[LIST_COLUMNS_MAX];    /* the command's positional arguments */
    int args_count;
    const char *to, *vhost;          /* move's and offload's --to and --vhost */
    const char *fraction, *queues;   /* offload's --fraction or --queues */
    const char *backup_of;           /* move's --backup-of */
    const char *tags;                /* add-user's --tags */
};

/* ---- set-policy and clear-policy ------------------------------------------- */

/* Appends s %-encoded as a path segment (RabbitMQ's "/" vhost is %2F). */
static bool append_segment(char *out, size_t cap, const char *s)
{
    size_t n = strlen(out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool plain = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                     (c >= 'A' && c <= 'Z') || strchr("-._~", c) != NULL;
        int w = plain ? snprintf(out + n, cap - n, "%c", c)
                      : snprintf(out + n, cap - n, "%%%02X", c);
        if (w < 0 || (size_t)w >= cap - n)
            return false;
        n += (size_t)w;
    }
    return true;
}

/* Appends s as a JSON string. */
static bool append_json_string(char *out, size_t cap, const char *s)
{
    size_t n = strlen(out);
    if (n + 1 >= cap)
        return false;
    out[n++] = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int w = c == '"' || c == '\\' ? snprintf(out + n, cap - n, "\\%c", c)
                : c < 0x20 ? snprintf(out + n, cap - n, "\\u%04x", c)
                           : snprintf(out + n, cap - n, "%c", c);
        if (w < 0 || (size_t)w >= cap - n)
            return false;
        n += (size_t)w;
    }
    if (n + 1 >= cap)
        return false;
    out[n++] = '"';
    out[n] = '\0';
    return true;
}

static bool is_number(const char *s)
{
    if (*s == '\0' || strlen(s) > 9)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
    }
    return true;
}

/* move QUEUE --to BROKER [--vhost VHOST] [--backup-of B]: the names in a
 * JSON body. */
static int build_move(const char *queue, const char *to, const char *vhost,
                      const char *backup_of, char *body, size_t body_cap)
{
    if (to == NULL) {
        fprintf(stderr, "quayctl: move needs --to BROKER\n");
        return EXIT_USAGE;
    }
    snprintf(body, body_cap, "{\"vhost\": ");
    if (!append_json_string(body, body_cap, vhost ? vhost : "/") ||
        strlen(body) + 12 >= body_cap)
        goto too_long;
    strcat(body, ", \"queue\": ");
    if (!append_json_string(body, body_cap, queue) || strlen(body) + 9 >= body_cap)
        goto too_long;
    strcat(body, ", \"to\": ");
    if (!append_json_string(body, body_cap, to) || strlen(body) + 16 >= body_cap)
        goto too_long;
    if (backup_of != NULL) {
        strcat(body, ", \"backup_of\": ");
        if (!append_json_string(body, body_cap, backup_of) || strlen(body) + 2 >= body_cap)
            goto too_long;
    }
    strcat(body, "}");
    return 0;
too_long:
    fprintf(stderr, "quayctl: move: an argument is too long\n");
    return EXIT_USAGE;
}

/* offload BROKER --to T (--fraction F | --queues REGEX [--vhost V]): the
 * names in JSON, F as a whole percent (the API takes integers only). */
static int build_offload(const struct options *opt, char *body, size_t body_cap)
{
    if (opt->to == NULL || (opt->fraction == NULL) == (opt->queues == NULL)) {
        fprintf(stderr, "quayctl: offload needs --to BROKER and --fraction F or --queues REGEX\n");
        return EXIT_USAGE;
    }
    snprintf(body, body_cap, "{\"broker\": ");
    if (!append_json_string(body, body_cap, opt->args[0]) || strlen(body) + 10 >= body_cap)
        goto too_long;
    strcat(body, ", \"to\": ");
    if (!append_json_string(body, body_cap, opt->to) || strlen(body) + 24 >= body_cap)
        goto too_long;
    if (opt->fraction != NULL) {
        char *end;
        double f = strtod(opt->fraction, &end);
        if (*opt->fraction == '\0' || *end != '\0' || !(f > 0.0 && f <= 1.0)) {
            fprintf(stderr, "quayctl: --fraction takes a number in (0, 1]\n");
            return EXIT_USAGE;
        }
        long percent = (long)(f * 100.0 + 0.5);
        size_t n = strlen(body);
        snprintf(body + n, body_cap - n, ", \"percent\": %ld}", percent < 1 ? 1 : percent);
        return 0;
    }
    strcat(body, ", \"queues\": ");
    if (!append_json_string(body, body_cap, opt->queues) || strlen(body) + 12 >= body_cap)
        goto too_long;
    if (opt->vhost != NULL) {
        strcat(body, ", \"vhost\": ");
        if (!append_json_string(body, body_cap, opt->vhost) || strlen(body) + 2 >= body_cap)
            goto too_long;
    }
    strcat(body, "}");
    return 0;
too_long:
    fprintf(stderr, "quayctl: offload: an argument is too long\n");
    return EXIT_USAGE;
}

/* rebalance [on|off]: {} or {"auto": true|false}. */
static int build_rebalance(char **args, int args_count, char *body, size_t body_cap)
{
    bool on = args_count > 0 && strcmp(args[0], "on") == 0;
    if (args_count > 0 && !on && strcmp(args[0], "off") != 0) {
        fprintf(stderr, "quayctl: rebalance takes on, off or nothing\n");
        return EXIT_USAGE;
    }
    snprintf(body, body_cap, "%s", args_count == 0 ? "{}" : on ? "{\"auto\": true}"
                                                               : "{\"auto\": false}");
    return 0;
}

/* The path (and the body, for set-policy and forget) of a command with
 * arguments.
 * Returns 0 or EXIT_USAGE (printed). */
static int build_request(const struct command *cmd, char **args, int args_count, char *path,
                         size_t path_cap, char *body, size_t body_cap)
{
    snprintf(path, path_cap, "%s", cmd->path);
    if (strcmp(cmd->method, "POST") == 0) { /* forget/drain/revive BROKER: the name, JSON */
        snprintf(body, body_cap, "{\"broker\": ");
        if (!append_json_string(body, body_cap, args[0]) || strlen(body) + 2 >= body_cap)
            goto too_long;
        strcat(body, "}");
        return 0;
    }
    if (!append_segment(path, path_cap, args[0]) || strlen(path) + 2 >= path_cap)
        goto too_long;
    size_t end = strlen(path);
    path[end] = '/';
    path[end + 1] = '\0';
    if (!append_segment(path, path_cap, args[1]))
        goto too_long;
    if (cmd->args_max == 2)
        return 0;
    const char *priority = args_count > 4 ? args[4] : "0";
    if (!is_number(args[3]) || !is_number(priority)) {
        fprintf(stderr, "quayctl: BACKUPS and PRIORITY must be whole numbers\n");
        return EXIT_USAGE;
    }
    snprintf(body, body_cap, "{\"pattern\": ");
    if (!append_json_string(body, body_cap, args[2]))
        goto too_long;
    size_t n = strlen(body);
    int w = snprintf(body + n, body_cap - n, ", \"priority\": %s, \"backups\": %s}", priority,
                     args[3]);
    if (w < 0 || (size_t)w >= body_cap - n)
        goto too_long;
    return 0;
too_long:
    fprintf(stderr, "quayctl: %s: an argument is too long\n", cmd->name);
    return EXIT_USAGE;
}

/* Prints the answer; returns the exit status. */
static int show(const struct command *cmd, const struct response *res, bool raw_json)
{
    const char *error = NULL;
    if (res->status == 204 || (res->status == 201 && res->body_size == 0))
        return 0; /* done: RabbitMQ answers a PUT or DELETE without a body */
    struct jvalue *doc = json_parse(res->body, res->body_size, &error);
    if (res->status != 200 && res->status != 201 && res->status != 202) {
        const struct jvalue *reason = jget(doc, "reason");
        if (reason == NULL)
            reason = jget(doc, "error");
        fprintf(stderr, "quayctl: %s %s: HTTP %d%s%s\n", cmd->method, cmd->path, res->status,
                reason && reason->text ? ": " : "", reason && reason->text ? reason->text : "");
        jfree(doc);
        if (res->status == 401 || res->status == 403) {
            fprintf(stderr, "quayctl: log in with --user and QUAY_PASSWORD (or --password) as "
                    "a user with the right tag\n");
            return EXIT_NOPERM;
        }
        return EXIT_PROTOCOL;
    }
    if (!doc) {
        fprintf(stderr, "quayctl: GET %s: bad JSON (%s)\n", cmd->path, error ? error : "?");
        return EXIT_PROTOCOL;
    }
    int rc;
    if (raw_json) {
        fwrite(res->body, 1, res->body_size, stdout);
        if (res->body_size == 0 || res->body[res->body_size - 1] != '\n')
            putchar('\n');
        rc = 0;
    } else if (cmd->columns) {
        rc = print_table(doc, cmd->columns, cmd->columns_count);
    } else {
        rc = print_pairs(doc);
    }
    jfree(doc);
    if (rc != 0) {
        fprintf(stderr, "quayctl: GET %s: unexpected JSON shape\n", cmd->path);
        return EXIT_PROTOCOL;
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

/* ---- users, vhosts and permissions ------------------------------------------ */

static bool is_user_command(const struct command *cmd)
{
    return strcmp(cmd->method, "GET") != 0 &&
           (strcmp(cmd->path, "/api/users/") == 0 || strcmp(cmd->path, "/api/vhosts/") == 0 ||
            strcmp(cmd->path, "/api/permissions/") == 0);
}

/* Appends ", \"key\": value" (or the first member, after "{"). */
static bool append_member(char *body, size_t cap, const char *key, const char *value)
{
    size_t n = strlen(body);
    int w = snprintf(body + n, cap - n, "%s\"%s\": ", n > 1 ? ", " : "", key);
    return w > 0 && (size_t)w < cap - n && append_json_string(body, cap, value);
}

/* The user's tags ("a,b") and password hash as the API has them now:
 * change-password keeps the one, set-user-tags the other. */
static int fetch_user(const struct options *opt, const char *authorization, const char *path,
                      char *tags, size_t tags_cap, char *hash, size_t hash_cap)
{
    struct buffer in = {0};
    struct response res;
    int rc = http_request(&opt->endpoint, "GET", path, NULL, authorization, opt->timeout_ms,
                          &in, &res);
    struct jvalue *doc = NULL;
    if (rc == 0 && res.status != 200) {
        const struct command get = {opt->command->name, "GET", path, NULL, 0, 0, 0};
        rc = show(&get, &res, false);
    } else if (rc == 0) {
        const char *error = NULL;
        doc = json_parse(res.body, res.body_size, &error);
        const struct jvalue *t = jget(doc, "tags"), *h = jget(doc, "password_hash");
        char *joined = cell_text(t);
        snprintf(tags, tags_cap, "%s", strcmp(joined, "-") == 0 ? "" : joined);
        free(joined);
        snprintf(hash, hash_cap, "%s", h && h->type == J_STRING ? h->text : "");
        if (t == NULL || hash[0] == '\0') {
            fprintf(stderr, "quayctl: GET %s: unexpected JSON shape\n", path);
            rc = EXIT_PROTOCOL;
        }
    }
    jfree(doc);
    free(in.data);
    return rc;
}

/* The PUT or DELETE of a user, vhost or permission command: its path and
 * body. Returns 0 or an exit status (printed). */
static int build_user_request(const struct options *opt, const char *authorization, char *path,
                              size_t path_cap, char *body, size_t body_cap)
{
    const char *name = opt->command->name;
    char *const *args = opt->args;
    snprintf(path, path_cap, "%s", opt->command->path);
    if (strcmp(opt->command->path, "/api/permissions/") == 0 &&
        (!append_segment(path, path_cap, opt->vhost ? opt->vhost : "/") ||
         strlen(path) + 2 >= path_cap || !strcat(path, "/")))
        goto too_long;
    if (!append_segment(path, path_cap, args[0]))
        goto too_long;
    snprintf(body, body_cap, "{");
    bool ok = true;
    if (strcmp(name, "set-permissions") == 0) {
        ok = append_member(body, body_cap, "configure", args[1]) &&
             append_member(body, body_cap, "write", args[2]) &&
             append_member(body, body_cap, "read", args[3]);
    } else if (strcmp(name, "add-user") == 0) {
        ok = append_member(body, body_cap, "password", args[1]) &&
             append_member(body, body_cap, "tags", opt->tags ? opt->tags : "");
    } else if (strcmp(name, "change-password") == 0 || strcmp(name, "set-user-tags") == 0) {
        char tags[1024], hash[256];
        int rc = fetch_user(opt, authorization, path, tags, sizeof tags, hash, sizeof hash);
        if (rc != 0)
            return rc;
        bool password = strcmp(name, "change-password") == 0;
        if (!password) { /* the tags are the arguments after NAME */
            tags[0] = '\0';
            for (int i = 1; i < opt->args_count; i++)
                snprintf(tags + strlen(tags), sizeof tags - strlen(tags), "%s%s",
                         i > 1 ? "," : "", args[i]);
        }
        /* The hash as it is, in whichever form: the broker tells the form
         * from the text (broker/password.h). */
        ok = password ? append_member(body, body_cap, "password", args[1])
                      : append_member(body, body_cap, "password_hash", hash);
        ok = ok && append_member(body, body_cap, "tags", tags);
    }
    if (!ok || strlen(body) + 2 >= body_cap)
        goto too_long;
    strcat(body, "}");
    return 0;
too_long:
    fprintf(stderr, "quayctl: %s: an argument is too long\n", name);
    return EXIT_USAGE;
}

/* ---- vhost and user limits --------------------------------------------------- */

/* The limit names of set-*-limits' JSON object (NAME: integer) into
 * names[] and values[]; returns how many, or -1 (printed). */
static int limits_of(const char *command, const struct jvalue *doc, const char **names,
                     const char **values, int cap)
{
    int n = 0;
    bool bad = doc == NULL || doc->type != J_OBJECT || doc->child == NULL;
    for (const struct jvalue *m = bad ? NULL : doc->child; m; m = m->next) {
        if (m->type != J_NUMBER || strlen(m->text) > 20 || n == cap) {
            bad = true;
            break;
        }
        names[n] = m->key;
        values[n++] = m->text;
    }
    if (bad) {
        fprintf(stderr, "quayctl: %s: the limits are a JSON object of integers, such as "
                "'{\"max-connections\": 10}'\n", command);
        return -1;
    }
    return n;
}

/* set-vhost-limits [-p V] JSON and set-user-limits USER JSON: one PUT per
 * limit; clear-vhost-limits [-p V] and clear-user-limits USER NAME|all:
 * one DELETE per limit (a DELETE of no limit is 204). */
static int run_limits(const struct options *opt, const char *authorization)
{
    const char *command = opt->command->name;
    bool vhost = strstr(command, "vhost") != NULL;
    bool set = strncmp(command, "set-", 4) == 0;
    char base[1024];
    snprintf(base, sizeof base, "%s", opt->command->path);
    const char *owner = vhost ? (opt->vhost ? opt->vhost : "/") : opt->args[0];
    if (!append_segment(base, sizeof base, owner) || strlen(base) + 2 >= sizeof base) {
        fprintf(stderr, "quayctl: %s: an argument is too long\n", command);
        return EXIT_USAGE;
    }
    strcat(base, "/");
    const char *names[4] = {"max-connections", vhost ? "max-queues" : "max-channels"};
    const char *values[4] = {NULL, NULL};
    int n = 2;
    struct jvalue *doc = NULL;
    if (set) {
        const char *text = opt->args[vhost ? 0 : 1], *error = NULL;
        doc = json_parse(text, strlen(text), &error);
        n = limits_of(command, doc, names, values, 4);
    } else if (!vhost && strcmp(opt->args[1], "all") != 0) {
        names[0] = opt->args[1];
        n = 1;
    }
    int rc = n < 0 ? EXIT_USAGE : 0;
    for (int i = 0; i < n && rc == 0; i++) {
        char path[2048], body[64] = "";
        snprintf(path, sizeof path, "%s", base);
        if (!append_segment(path, sizeof path, names[i])) {
            fprintf(stderr, "quayctl: %s: an argument is too long\n", command);
            rc = EXIT_USAGE;
            break;
        }
        if (set)
            snprintf(body, sizeof body, "{\"value\": %s}", values[i]);
        struct buffer in = {0};
        struct response res;
        rc = http_request(&opt->endpoint, opt->command->method, path, set ? body : NULL,
                          authorization, opt->timeout_ms, &in, &res);
        if (rc == 0)
            rc = show(opt->command, &res, opt->json);
        free(in.data);
    }
    jfree(doc);
    return rc;
}

/* Where an option that takes a string goes, or NULL if a is none. */
static const char **string_option(struct options *opt, const char *a)
{
    static const struct {
        const char *name;
        size_t offset;
    } options[] = {
        {"--to", offsetof(struct options, to)},
        {"--vhost", offsetof(struct options, vhost)},
        {"-p", offsetof(struct options, vhost)}, /* rabbitmqctl's spelling */
        {"--backup-of", offsetof(struct options, backup_of)},
        {"--fraction", offsetof(struct options, fraction)},
        {"--queues", offsetof(struct options, queues)},
        {"--tags", offsetof(struct options, tags)},
    };
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        if (strcmp(a, options[i].name) == 0)
            return (const char **)((char *)opt + options[i].offset);
    }
    return NULL;
}

/* Returns -1 to go on, or an exit status. */
static int parse_options(int argc, char **argv, struct options *opt)
{
    const char *http = DEFAULT_HTTP, *cacert = NULL;
    bool https = false;
    opt->timeout_ms = DEFAULT_TIMEOUT_MS;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            opt->json = true;
        } else if (string_option(opt, a) != NULL && i + 1 < argc) {
            *string_option(opt, a) = argv[++i];
        } else if (strcmp(a, "--user") == 0 && i + 1 < argc) {
            opt->user = argv[++i];
        } else if (strcmp(a, "--password") == 0 && i + 1 < argc) {
            opt->password = argv[++i];
        } else if (strcmp(a, "--cacert") == 0 && i + 1 < argc) {
            cacert = argv[++i];
        } else if ((strcmp(a, "--http") == 0 || strcmp(a, "--https") == 0 ||
                    strcmp(a, "--timeout") == 0) && i + 1 < argc) {
            if (strcmp(a, "--timeout") != 0) {
                https = strcmp(a, "--https") == 0;
                http = argv[++i];
                continue;
            }
            char *end;
            long s = strtol(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end != '\0' || s <= 0 || s > 3600) {
                fprintf(stderr, "quayctl: bad value for --timeout: '%s'\n", argv[i]);
                return EXIT_USAGE;
            }
            opt->timeout_ms = (int)s * 1000;
        } else if (opt->command && opt->args_count < opt->command->args_max) {
            opt->args[opt->args_count++] = argv[i];
        } else if ((a[0] == '-' && a[1] != '\0') || opt->command) {
            fprintf(stderr, "quayctl: unexpected argument '%s'\n", a);
            usage(stderr);
            return EXIT_USAGE;
        } else {
            for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++) {
                if (strcmp(a, commands[c].name) == 0)
                    opt->command = &commands[c];
            }
            if (!opt->command) {
                fprintf(stderr, "quayctl: unknown command '%s'\n", a);
                usage(stderr);
                return EXIT_USAGE;
            }
        }
    }
    if (!opt->command) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (opt->args_count < opt->command->args_min) {
        fprintf(stderr, "quayctl: %s needs %d arguments\n", opt->command->name,
                opt->command->args_min);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (parse_endpoint(http, &opt->endpoint) != 0) {
        fprintf(stderr, "quayctl: bad value for --http%s: '%s' (HOST:PORT)\n", https ? "s" : "",
                http);
        return EXIT_USAGE;
    }
    if (cacert != NULL && !https) {
        fprintf(stderr, "quayctl: --cacert is for --https\n");
        return EXIT_USAGE;
    }
    opt->endpoint.tls = https;
    opt->endpoint.cacert = cacert;
    return -1;
}

/* The Basic credentials: the options, else the environment, else guest's.
 * Returns 0, or EXIT_USAGE (printed). */
static int credentials(const struct options *opt, char *out, size_t out_cap)
{
    const char *user = opt->user ? opt->user : getenv("QUAY_USER");
    const char *password = opt->password ? opt->password : getenv("QUAY_PASSWORD");
    if (user != NULL && password == NULL) {
        fprintf(stderr, "quayctl: %s needs a password: QUAY_PASSWORD or --password\n", user);
        return EXIT_USAGE;
    }
    if (user == NULL)
        user = DEFAULT_USER;
    if (password == NULL)
        password = DEFAULT_USER;
    char plain[CREDENTIALS_SIZE_MAX + 1];
    int n = snprintf(plain, sizeof plain, "%s:%s", user, password);
    if (strchr(user, ':') != NULL || n < 0 || (size_t)n >= sizeof plain ||
        base64_encoded_size((size_t)n) >= out_cap) {
        explicit_bzero(plain, sizeof plain);
        fprintf(stderr, "quayctl: the user name has a ':' or the credentials are over %d "
                "bytes\n", CREDENTIALS_SIZE_MAX);
        return EXIT_USAGE;
    }
    base64_encode((const uint8_t *)plain, (size_t)n, out);
    explicit_bzero(plain, sizeof plain);
    return 0;
}

/* ---- rabbitmqctl's verbs ------------------------------------------------------ */

static const char *const *default_columns(const char *name)
{
    static const char *const queues[] = {"name", "messages_ready", "messages_unacknowledged",
                                         "consumers", NULL};
    static const char *const exchanges[] = {"name", "type", NULL};
    static const char *const bindings[] = {"source", "destination_type", "destination",
                                           "routing_key", NULL};
    static const char *const connections[] = {"name", "user", "vhost", "channels", "state",
                                              NULL};
    return strcmp(name, "list-queues") == 0      ? queues
           : strcmp(name, "list-exchanges") == 0 ? exchanges
           : strcmp(name, "list-bindings") == 0  ? bindings
                                                 : connections;
}

/* list-*: the path with ?columns=..., and the table's columns (titles as
 * the API names them; right-aligned when every value is a number). */
static int build_list(const struct options *opt, char *path, size_t path_cap,
                      struct column *cols, size_t *ncols)
{
    const char *const *defaults = default_columns(opt->command->name);
    size_t n = 0;
    for (; n < LIST_COLUMNS_MAX; n++) {
        const char *key = opt->args_count ? (n < (size_t)opt->args_count ? opt->args[n] : NULL)
                                          : defaults[n];
        if (key == NULL)
            break;
        cols[n] = (struct column){key, key, false};
    }
    *ncols = n;
    snprintf(path, path_cap, "%s", opt->command->path);
    if (opt->vhost != NULL) {
        strcat(path, "/");
        if (!append_segment(path, path_cap, opt->vhost))
            return EXIT_USAGE;
    }
    size_t len = strlen(path);
    for (size_t i = 0; i < n; i++) {
        int w = snprintf(path + len, path_cap - len, "%s", i ? "," : "?columns=");
        if (w < 0 || (size_t)w >= path_cap - len || !append_segment(path, path_cap, cols[i].key))
            return EXIT_USAGE;
        len = strlen(path);
    }
    return 0;
}

static void align_numbers(const struct jvalue *doc, struct column *cols, size_t ncols)
{
    for (size_t c = 0; c < ncols; c++) {
        bool numbers = doc && doc->child;
        for (const struct jvalue *e = doc ? doc->child : NULL; e; e = e->next) {
            const struct jvalue *v = jget(e, cols[c].key);
            numbers = numbers && v && v->type == J_NUMBER;
        }
        cols[c].right = numbers;
    }
}

static int run_list(const struct options *opt, const char *authorization)
{
    char path[2048];
    struct column cols[LIST_COLUMNS_MAX];
    size_t ncols;
    if (build_list(opt, path, sizeof path, cols, &ncols) != 0) {
        fprintf(stderr, "quayctl: %s: the columns are too long\n", opt->command->name);
        return EXIT_USAGE;
    }
    struct buffer in = {0};
    struct response res;
    int rc = http_request(&opt->endpoint, "GET", path, NULL, authorization, opt->timeout_ms,
                          &in, &res);
    if (rc == 0 && !opt->json && res.status == 200) {
        const char *error = NULL;
        struct jvalue *doc = json_parse(res.body, res.body_size, &error);
        align_numbers(doc, cols, ncols);
        struct command cmd = *opt->command;
        cmd.columns = cols, cmd.columns_count = ncols;
        jfree(doc);
        rc = show(&cmd, &res, false);
    } else if (rc == 0) {
        rc = show(opt->command, &res, opt->json);
    }
    free(in.data);
    return rc;
}

/* Reads a whole file (at most the API's 16 MiB); NULL on failure (printed). */
static char *read_file(const char *name)
{
    FILE *f = strcmp(name, "-") == 0 ? stdin : fopen(name, "rb");
    char *data = NULL;
    size_t size = 0, cap = 0, n;
    if (f == NULL) {
        fprintf(stderr, "quayctl: cannot read %s: %s\n", name, strerror(errno));
        return NULL;
    }
    do {
        if (size + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 131072;
            data = realloc(data, cap);
            if (!data)
                abort();
        }
        n = fread(data + size, 1, cap - size - 1, f);
        size += n;
    } while (n > 0 && size <= (16u << 20));
    bool bad = ferror(f) || size > (16u << 20) || memchr(data, '\0', size) != NULL;
    if (f != stdin)
        fclose(f);
    if (bad) {
        fprintf(stderr, "quayctl: %s: unreadable, over 16 MiB, or not text\n", name);
        free(data);
        return NULL;
    }
    data[size] = '\0';
    return data;
}

static int run_definitions(const struct options *opt, const char *authorization)
{
    bool import = strcmp(opt->command->name, "import-definitions") == 0;
    const char *file = opt->args[0];
    char *body = import ? read_file(file) : NULL;
    if (import && body == NULL)
        return EXIT_DATAERR;
    struct buffer in = {0};
    struct response res;
    int rc = http_request(&opt->endpoint, opt->command->method, opt->command->path, body,
                          authorization, opt->timeout_ms, &in, &res);
    free(body);
    if (rc == 0 && import && res.status == 204) {
        fprintf(stderr, "quayctl: imported %s\n", file);
    } else if (rc == 0 && !import && res.status == 200) {
        FILE *f = strcmp(file, "-") == 0 ? stdout : fopen(file, "wb");
        bool ok = f != NULL && fwrite(res.body, 1, res.body_size, f) == res.body_size;
        ok = (f == stdout ? fflush(f) == 0 : f != NULL && fclose(f) == 0) && ok;
        if (!ok) {
            fprintf(stderr, "quayctl: cannot write %s: %s\n", file, strerror(errno));
            rc = EXIT_DATAERR;
        }
    } else if (rc == 0) {
        rc = show(opt->command, &res, false); /* the refusal, with its reason */
    }
    free(in.data);
    return rc;
}

/* ping: one try. await-startup: tries until the API answers 200 or the
 * timeout passes (a broker still starting refuses the connection). */
static int run_probe(const struct options *opt, const char *authorization)
{
    bool wait = strcmp(opt->command->name, "await-startup") == 0;
    int64_t deadline = now_ms() + opt->timeout_ms;
    for (;;) {
        struct buffer in = {0};
        struct response res;
        struct options once = *opt;
        once.timeout_ms = (int)(deadline - now_ms() > 1000 ? 1000 : deadline - now_ms());
        if (once.timeout_ms <= 0)
            once.timeout_ms = 1;
        quiet_connect = wait && deadline - now_ms() > 1200;
        int rc = http_request(&once.endpoint, "GET", opt->command->path, NULL, authorization,
                              once.timeout_ms, &in, &res);
        if (rc == 0 && res.status != 200) {
            rc = show(opt->command, &res, false);
        } else if (rc == 0) {
            if (opt->json)
                rc = show(opt->command, &res, true);
            else
                printf("%s\n", wait ? "the broker is up" : "Ping succeeded");
        }
        free(in.data);
        if (rc != EXIT_UNAVAILABLE || !wait || now_ms() >= deadline)
            return rc;
        usleep(200 * 1000);
    }
}

static bool is_command(const struct options *opt, const char *prefix)
{
    return strncmp(opt->command->name, prefix, strlen(prefix)) == 0;
}

/* rabbitmqctl's list-* with COLUMN arguments (run_list); list-users,
 * list-vhosts and list-permissions have columns of their own. */
static bool is_listing(const struct options *opt)
{
    return is_command(opt, "list-") && opt->command->columns == NULL;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN); /* OpenSSL writes to the socket with write() */
    struct options opt = {0};
    int rc = parse_options(argc, argv, &opt);
    if (rc >= 0)
        return rc;
    char authorization[2 * CREDENTIALS_SIZE_MAX];
    rc = credentials(&opt, authorization, sizeof authorization);
    if (rc != 0)
        return rc;
    struct buffer in = {0};
    struct response res;
    char path[2048], body[1536] = "";
    if (is_listing(&opt) || is_command(&opt, "export-definitions") ||
        is_command(&opt, "import-definitions") || is_command(&opt, "await-startup") ||
        is_command(&opt, "ping")) {
        rc = is_listing(&opt)           ? run_list(&opt, authorization)
             : is_command(&opt, "ping") ? run_probe(&opt, authorization)
             : is_command(&opt, "await") ? run_probe(&opt, authorization)
                                         : run_definitions(&opt, authorization);
        explicit_bzero(authorization, sizeof authorization);
        return rc;
    }
    if (strstr(opt.command->name, "-limits") != NULL && !is_command(&opt, "list-")) {
        rc = run_limits(&opt, authorization);
        explicit_bzero(authorization, sizeof authorization);
        return rc;
    }
    if (strcmp(opt.command->name, "move") == 0) {
        snprintf(path, sizeof path, "%s", opt.command->path);
        rc = build_move(opt.args[0], opt.to, opt.vhost, opt.backup_of, body, sizeof body);
        if (rc != 0)
            return rc;
    } else if (strcmp(opt.command->name, "offload") == 0) {
        snprintf(path, sizeof path, "%s", opt.command->path);
        rc = build_offload(&opt, body, sizeof body);
        if (rc != 0)
            return rc;
    } else if (strcmp(opt.command->name, "rebalance") == 0) {
        snprintf(path, sizeof path, "%s", opt.command->path);
        rc = build_rebalance(opt.args, opt.args_count, body, sizeof body);
        if (rc != 0)
            return rc;
    } else if (is_user_command(opt.command)) {
        rc = build_user_request(&opt, authorization, path, sizeof path, body, sizeof body);
        if (rc != 0)
            return rc;
        if (strcmp(opt.command->method, "DELETE") == 0)
            body[0] = '\0';
    } else if (opt.command->args_max > 0) {
        rc = build_request(opt.command, opt.args, opt.args_count, path, sizeof path, body,
                           sizeof body);
        if (rc != 0)
            return rc;
    } else if (strcmp(opt.command->name, "list-vhost-limits") == 0 && opt.vhost != NULL) {
        snprintf(path, sizeof path, "/api/vhost-limits/");
        if (!append_segment(path, sizeof path, opt.vhost)) {
            fprintf(stderr, "quayctl: list-vhost-limits: the vhost is too long\n");
            return EXIT_USAGE;
        }
    } else if (strcmp(opt.command->name, "list-permissions") == 0 && opt.vhost != NULL) {
        snprintf(path, sizeof path, "/api/vhosts/");
        if (!append_segment(path, sizeof path, opt.vhost) || strlen(path) + 13 >= sizeof path) {
            fprintf(stderr, "quayctl: list-permissions: the vhost is too long\n");
            return EXIT_USAGE;
        }
        strcat(path, "/permissions");
    } else {
        snprintf(path, sizeof path, "%s", opt.command->path);
    }
    rc = http_request(&opt.endpoint, opt.command->method, path, body[0] ? body : NULL,
                      authorization, opt.timeout_ms, &in, &res);
    explicit_bzero(authorization, sizeof authorization);
    if (rc == 0)
        rc = show(opt.command, &res, opt.json);
    free(in.data);
    return rc;
}
