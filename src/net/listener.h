/*
 * listener.h: TCP listening sockets. Each accepted socket is handed to the
 * accept callback, which creates the protocol object embedding a struct
 * conn (conn_init), and the listener then accepts into it and starts it.
 */
#ifndef QUAY_NET_LISTENER_H
#define QUAY_NET_LISTENER_H

#include <uv.h>

#include "net/conn.h"

struct tls_context;

struct listener {
    uv_tcp_t tcp;
    struct net *net;          /* borrowed */
    /* Set after listener_open for a TLS listener (AMQPS, HTTPS): every
     * accepted conn is a TLS server with its current settings. */
    struct tls_context *tls;  /* borrowed; NULL = plain TCP */
    net_accept_fn accept;
    void *ctx;
    char address[80];
};

/* address is "HOST:PORT", "[V6]:PORT" or ":PORT"/"PORT" (all interfaces:
 * binds :: dual-stack, so IPv4 and IPv6 are both served). */
int listener_open(struct listener *listener, struct net *net, const char *address,
                  net_accept_fn accept, void *ctx);
void listener_close(struct listener *listener);
/* Parses an address as above into a sockaddr (used by tests and cluster). */
int listener_parse_address(const char *address, struct sockaddr_storage *out);

#endif
