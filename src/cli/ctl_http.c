/*
 * ctl_http.c: quayctl's one blocking HTTP request to the management API:
 * resolve and connect within the deadline, the TLS handshake with
 * --https (the server's certificate verified for the host it was given),
 * send the request with its Basic credentials, read the answer until the
 * server closes, and split it into status and body.
 *
 * Owns the socket and the TLS session of one request; links none of the
 * broker's code (no libuv).
 */
#include "cli/ctl_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
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

#define RESPONSE_SIZE_MAX (256u << 20)

/* ---- the HTTP GET ------------------------------------------------------ */

/* The connection to the API: a socket, and its TLS session with --https. */
struct stream {
    int fd;
    SSL_CTX *ctx;            /* owned, or NULL */
    SSL *ssl;                /* owned, or NULL */
};

int ctl__parse_endpoint(const char *text, struct endpoint *out)
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

int64_t ctl__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for `events` or the deadline passes. */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - ctl__now_ms();
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
bool ctl__quiet_connect;

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
    if (fd < 0 && !ctl__quiet_connect) {
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
int ctl__http_request(const struct endpoint *ep, const char *method, const char *path,
                      const char *body, const char *authorization, int timeout_ms,
                      struct buffer *in, struct response *res)
{
    int64_t deadline_ms = ctl__now_ms() + timeout_ms;
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
