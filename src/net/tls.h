/*
 * tls.h: TLS settings (OpenSSL) and one TLS session per connection.
 *
 * A tls_context is what an operator configures: a certificate and key, the
 * CAs that sign client certificates, and whether a client certificate is
 * asked for. It wraps an SSL_CTX, which tls_context_reload replaces
 * whole (SIGHUP): sessions already open keep the SSL_CTX they started with
 * (OpenSSL counts its references), new ones get the new files.
 *
 * A tls_session is the OpenSSL state of one connection over two memory
 * BIOs: the transport (conn_tls.c) writes what the socket read into
 * `in` and SSL_read()s plaintext for the protocol; what the protocol
 * queues is SSL_write()n and the ciphertext taken from `out`. OpenSSL
 * never touches a socket, so libuv keeps doing all I/O.
 *
 * Never: a session without a context, or a context half-loaded (a failed
 * load or reload leaves the previous SSL_CTX in place).
 *
 * Ownership: struct tls_context is owned by whoever configured it (the
 * broker, the management API); struct tls_session by its conn.
 */
#ifndef QUAY_NET_TLS_H
#define QUAY_NET_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* Whether a server asks its clients for a certificate (--tls-verify). */
enum tls_verify {
    TLS_VERIFY_NONE,    /* no client certificate is asked for */
    TLS_VERIFY_PEER,    /* asked for and verified if given; a client without one is let in */
    TLS_VERIFY_REQUIRE, /* the handshake fails without a verified client certificate */
};

struct tls_config {
    const char *cert_file;   /* PEM, the leaf first, then its chain (borrowed) */
    const char *key_file;    /* PEM private key (borrowed) */
    const char *ca_file;     /* PEM CAs for verifying peers; NULL = none (borrowed) */
    enum tls_verify verify;
    bool client;             /* a client's context (quayctl, links): verifies the server */
};

struct ssl_ctx_st;
struct ssl_st;
struct bio_st;

struct tls_context {
    struct ssl_ctx_st *ctx;  /* owned reference; sessions hold their own */
    struct tls_config config;
    uint32_t loads_count;    /* successful loads, the first included */
};

/* The cipher suites offered: forward secret AEAD only, as Mozilla's
 * "intermediate" profile, AES-128 first (cheaper per record than AES-256,
 * and as strong as anything else in the handshake). */
#define TLS_CIPHERS_TLS13 \
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define TLS_CIPHERS_TLS12                                                              \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"                       \
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"                       \
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

/* "none", "peer" or "require". Returns 0, or -1 for anything else. */
int tls_verify_parse(const char *text, enum tls_verify *out);
/* Loads the files into a new SSL_CTX (TLS 1.2 at least). Returns 0, or -1
 * with OpenSSL's reason in err (the context is then unusable). */
int tls_context_init(struct tls_context *tls, const struct tls_config *config, char *err,
                     size_t err_size);
/* Loads the same files again; on failure the old SSL_CTX stays in use. */
int tls_context_reload(struct tls_context *tls, char *err, size_t err_size);
/* Seconds from now until the loaded certificate's notAfter (negative once
 * expired) into *seconds: 0, or -1 with no certificate loaded. */
int tls_context_cert_seconds_left(const struct tls_context *tls, int64_t *seconds);
void tls_context_free(struct tls_context *tls);

/* One connection's TLS state. */
struct tls_session {
    struct ssl_st *ssl;      /* owned; owns in and out */
    struct bio_st *in;       /* ciphertext read from the socket, not yet decrypted */
    struct bio_st *out;      /* ciphertext produced, not yet handed to the socket */
    uint8_t *writing;        /* owned: ciphertext handed to uv_write, or NULL */
    size_t writing_size;
    uv_write_t write_req;
    bool shutdown_sent;      /* our close_notify is queued */
    bool failed;             /* the handshake or a record failed: closing */
};

/* NULL when OpenSSL cannot make a session (out of memory). client: start
 * the handshake as a client (servername for SNI, may be NULL). */
struct tls_session *tls_session_new(struct tls_context *tls, bool client, const char *servername);
void tls_session_free(struct tls_session *session);
/* For a session that has been idle a while: frees OpenSSL's record
 * buffers (allocated again with the next record) and replaces its empty
 * memory BIOs, which keep the largest buffer they ever held (a 256 KiB
 * read, a batch of ciphertext). Not done on the data path: a streaming
 * connection would allocate them again at once. */
void tls_session_trim(struct tls_session *session);
/* Whether the peer presented a certificate that verified against our CAs. */
bool tls_session_peer_verified(const struct tls_session *session);
/* The verified peer certificate's subject common name, as UTF-8 without
 * NUL bytes, into out (NUL-ended). Returns its length, or -1 when there is
 * no verified certificate, no CN, or one that does not fit. */
int tls_session_peer_cn(const struct tls_session *session, char *out, size_t out_size);
/* The protocol version and cipher, for logs ("TLSv1.3 TLS_AES_256_GCM_SHA384"). */
void tls_session_describe(const struct tls_session *session, char *out, size_t out_size);
/* The first error on OpenSSL's queue as text (emptying the queue). */
void tls_error_text(char *out, size_t out_size);

#endif
