/*
 * listener.c: see listener.h. Accept errors (EMFILE under a connection
 * flood) are logged and skipped: the listener keeps serving.
 */
#include "net/listener.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/assert.h"
#include "lib/log.h"

int listener_parse_address(const char *address, struct sockaddr_storage *out)
{
    char host[64];
    const char *port_str;
    memset(out, 0, sizeof *out);
    if (address[0] == '[') {
        const char *end = strchr(address, ']');
        if (!end || end[1] != ':' || (size_t)(end - address - 1) >= sizeof host)
            return -1;
        memcpy(host, address + 1, (size_t)(end - address - 1));
        host[end - address - 1] = '\0';
        port_str = end + 2;
    } else {
        const char *colon = strrchr(address, ':');
        if (!colon) {
            host[0] = '\0';
            port_str = address;
        } else {
            if ((size_t)(colon - address) >= sizeof host)
                return -1;
            memcpy(host, address, (size_t)(colon - address));
            host[colon - address] = '\0';
            port_str = colon + 1;
        }
    }
    char *endp;
    long port = strtol(port_str, &endp, 10);
    if (*port_str == '\0' || *endp != '\0' || port < 0 || port > 65535)
        return -1;
    if (host[0] == '\0' || strcmp(host, "::") == 0 || strcmp(host, "*") == 0)
        return uv_ip6_addr("::", (int)port, (struct sockaddr_in6 *)out);
    if (strcmp(host, "localhost") == 0)
        return uv_ip4_addr("127.0.0.1", (int)port, (struct sockaddr_in *)out);
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)out) == 0)
        return 0;
    return uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)out);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct listener *listener = server->data;
    if (status < 0) {
        LOG_WARN("listener=%s accept: %s", listener->address, uv_strerror(status));
        return;
    }
    struct conn *conn = listener->accept(listener->net, listener->ctx);
    if (!conn)
        return;
    if (uv_accept(server, (uv_stream_t *)&conn->tcp) != 0 || conn->refused) {
        /* Accepted and closed at once: the client sees its connection
         * end instead of hanging in the backlog. */
        conn_close(conn);
        return;
    }
    if (listener->tls != NULL && conn_tls_accept(conn, listener->tls) != 0) {
        LOG_WARN("listener=%s: no memory for a TLS session", listener->address);
        conn_close(conn);
        return;
    }
    conn_start(conn);
}

int listener_open(struct listener *listener, struct net *net, const char *address,
                  net_accept_fn accept, void *ctx)
{
    struct sockaddr_storage ss;
    if (listener_parse_address(address, &ss) != 0)
        return UV_EINVAL;
    memset(listener, 0, sizeof *listener);
    snprintf(listener->address, sizeof listener->address, "%s", address);
    listener->net = net;
    listener->accept = accept;
    listener->ctx = ctx;
    int rc = uv_tcp_init(net->loop, &listener->tcp);
    if (rc != 0)
        return rc;
    listener->tcp.data = listener;
    rc = uv_tcp_bind(&listener->tcp, (const struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&listener->tcp, 1024, on_connection);
    if (rc != 0) {
        uv_close((uv_handle_t *)&listener->tcp, NULL);
        return rc;
    }
    return 0;
}

void listener_close(struct listener *listener)
{
    if (!uv_is_closing((uv_handle_t *)&listener->tcp))
        uv_close((uv_handle_t *)&listener->tcp, NULL);
}
