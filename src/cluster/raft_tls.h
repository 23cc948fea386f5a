/*
 * raft_tls.h: TLS under the Raft transport (--cluster-tls).
 *
 * libraft reads and writes a plain libuv stream, and so does the
 * transport's own handshake before it (raft_transport.c). With TLS that
 * stream is one end of a socketpair; a tunnel owns the other end and
 * pumps it to and from a TLS connection to the peer (net/conn.h, the same
 * TLS the AMQP links use), so neither the handshake nor libraft knows.
 * Both sides prove themselves with certificates of the cluster's CAs (the
 * accepting side requires the dialer's), in addition to the secret the
 * handshake still checks.
 *
 * Back-pressure both ways: the tunnel stops reading the plaintext end
 * while the TLS connection's output is full, and stops reading the TLS
 * connection while what it wrote to the plaintext end is not taken.
 *
 * Ownership: the plaintext end (a raft_malloc'd uv_pipe_t) is the
 * caller's, then libraft's, which closes and raft_frees it. The tunnel
 * frees itself once both its end and its TLS connection are closed;
 * either side closing closes the other (libraft sees EOF, the peer a
 * close).
 */
#ifndef QUAY_CLUSTER_RAFT_TLS_H
#define QUAY_CLUSTER_RAFT_TLS_H

#include <stddef.h>

#include <uv.h>

struct net;
struct tls_context;

struct raft_tls {
    struct net *net;            /* borrowed: the broker's */
    struct tls_context *server; /* accepting: requires a client certificate */
    struct tls_context *client; /* dialing: verifies the peer's certificate */
};

/* A TLS connection to addr: *stream, the plaintext end, is ready to be
 * written at once (what is written waits for the TLS handshake); a failed
 * connect or handshake shows as its EOF. 0, or a negative libuv error. */
int raft_tls_dial(const struct raft_tls *tls, uv_loop_t *loop, const struct sockaddr *addr,
                  uv_stream_t **stream);
/* Accepts the connection waiting on server as a TLS server: *stream as
 * for a dial; peer gets "ip:port". 0, or a negative libuv error (the
 * connection is then closed). */
int raft_tls_accept(const struct raft_tls *tls, uv_loop_t *loop, uv_stream_t *server,
                    uv_stream_t **stream, char *peer, size_t peer_size);

#endif
