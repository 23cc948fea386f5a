/*
 * tls.c: see tls.h. Everything here is OpenSSL configuration and
 * inspection; the byte pumping between the BIOs and libuv is conn_tls.c's.
 */
#include "net/tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "lib/assert.h"

int tls_verify_parse(const char *text, enum tls_verify *out)
{
    if (strcmp(text, "none") == 0)
        *out = TLS_VERIFY_NONE;
    else if (strcmp(text, "peer") == 0)
        *out = TLS_VERIFY_PEER;
    else if (strcmp(text, "require") == 0)
        *out = TLS_VERIFY_REQUIRE;
    else
        return -1;
    return 0;
}

void tls_error_text(char *out, size_t out_size)
{
    unsigned long code = ERR_get_error();
    if (code == 0)
        snprintf(out, out_size, "unknown error");
    else
        ERR_error_string_n(code, out, out_size);
    ERR_clear_error();
}

static int fail(const char *what, const char *file, char *err, size_t err_size)
{
    char reason[256];
    tls_error_text(reason, sizeof reason);
    snprintf(err, err_size, "TLS: %s %s: %s", what, file ? file : "", reason);
    return -1;
}

/* The files of config into ctx: certificate chain and key (a server's, or
 * a client's own for mutual authentication), the CAs and the verify mode. */
static int load_files(struct ssl_ctx_st *ctx, const struct tls_config *config, char *err,
                      size_t err_size)
{
    if (config->cert_file != NULL &&
        SSL_CTX_use_certificate_chain_file(ctx, config->cert_file) != 1)
        return fail("cannot load certificate", config->cert_file, err, err_size);
    if (config->key_file != NULL &&
        SSL_CTX_use_PrivateKey_file(ctx, config->key_file, SSL_FILETYPE_PEM) != 1)
        return fail("cannot load private key", config->key_file, err, err_size);
    if (config->cert_file != NULL && SSL_CTX_check_private_key(ctx) != 1)
        return fail("private key does not match certificate", config->key_file, err, err_size);
    if (config->ca_file != NULL) {
        if (SSL_CTX_load_verify_locations(ctx, config->ca_file, NULL) != 1)
            return fail("cannot load CA file", config->ca_file, err, err_size);
        if (!config->client) {
            /* Tells clients which CAs we accept their certificates from. */
            STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(config->ca_file);
            if (names != NULL)
                SSL_CTX_set_client_CA_list(ctx, names);
        }
    }
    int mode = SSL_VERIFY_NONE;
    if (config->client)
        mode = config->verify == TLS_VERIFY_NONE ? SSL_VERIFY_NONE : SSL_VERIFY_PEER;
    else if (config->verify == TLS_VERIFY_PEER)
        mode = SSL_VERIFY_PEER;
    else if (config->verify == TLS_VERIFY_REQUIRE)
        mode = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
    SSL_CTX_set_verify(ctx, mode, NULL);
    return 0;
}

static struct ssl_ctx_st *build(const struct tls_config *config, char *err, size_t err_size)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(config->client ? TLS_client_method() : TLS_server_method());
    if (ctx == NULL) {
        fail("cannot create a context", NULL, err, err_size);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* No renegotiation (a client could make us do handshakes forever), no
     * compression (CRIME); the server's cipher order wins. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* Measured per message (bench/RESULTS.md, "TLS"): neither read-ahead
     * nor SSL_MODE_RELEASE_BUFFERS (a malloc and free of the record
     * buffers per record) paid; AES-128 before AES-256 did. */
    if (SSL_CTX_set_ciphersuites(ctx, TLS_CIPHERS_TLS13) != 1) {
        fail("cannot set the TLS 1.3 cipher suites", NULL, err, err_size);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_set_cipher_list(ctx, TLS_CIPHERS_TLS12) != 1 ||
        load_files(ctx, config, err, err_size) != 0) {
        if (err[0] == '\0')
            fail("cannot set the cipher list", NULL, err, err_size);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (!config->client)
        SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"quay", 4);
    return ctx;
}

int tls_context_init(struct tls_context *tls, const struct tls_config *config, char *err,
                     size_t err_size)
{
    memset(tls, 0, sizeof *tls);
    tls->config = *config;
    if (err_size > 0)
        err[0] = '\0';
    if (!config->client && (config->cert_file == NULL || config->key_file == NULL)) {
        snprintf(err, err_size, "TLS: a server needs --tls-cert and --tls-key");
        return -1;
    }
    if (config->verify != TLS_VERIFY_NONE && config->ca_file == NULL && !config->client) {
        snprintf(err, err_size, "TLS: --tls-verify peer or require needs --tls-ca");
        return -1;
    }
    tls->ctx = build(config, err, err_size);
    if (tls->ctx == NULL)
        return -1;
    tls->loads_count = 1;
    return 0;
}

int tls_context_reload(struct tls_context *tls, char *err, size_t err_size)
{
    ASSERT(tls->ctx != NULL);
    if (err_size > 0)
        err[0] = '\0';
    SSL_CTX *fresh = build(&tls->config, err, err_size);
    if (fresh == NULL)
        return -1;
    SSL_CTX_free(tls->ctx); /* open sessions hold their own reference */
    tls->ctx = fresh;
    tls->loads_count++;
    return 0;
}

void tls_context_free(struct tls_context *tls)
{
    SSL_CTX_free(tls->ctx);
    tls->ctx = NULL;
}

static BIO *new_memory_bio(void)
{
    BIO *bio = BIO_new(BIO_s_mem());
    /* An empty memory BIO reads as "retry later", not end of file. */
    if (bio != NULL)
        BIO_set_mem_eof_return(bio, -1);
    return bio;
}

/* Whether bio is empty but holds a buffer. */
static bool holds_memory(BIO *bio)
{
    BUF_MEM *mem = NULL;
    BIO_get_mem_ptr(bio, &mem);
    return mem != NULL && mem->max > 0 && BIO_ctrl_pending(bio) == 0;
}

void tls_session_trim(struct tls_session *session)
{
    if (session->writing != NULL)
        return; /* not idle */
    (void)SSL_free_buffers(session->ssl); /* refused while they hold data */
    if (holds_memory(session->in)) {
        BIO *fresh = new_memory_bio();
        if (fresh != NULL) {
            SSL_set0_rbio(session->ssl, fresh); /* frees the old one */
            session->in = fresh;
        }
    }
    if (holds_memory(session->out)) {
        BIO *fresh = new_memory_bio();
        if (fresh != NULL) {
            SSL_set0_wbio(session->ssl, fresh);
            session->out = fresh;
        }
    }
}

struct tls_session *tls_session_new(struct tls_context *tls, bool client, const char *servername)
{
    ASSERT(tls->ctx != NULL);
    struct tls_session *session = calloc(1, sizeof *session);
    if (session == NULL)
        return NULL;
    session->ssl = SSL_new(tls->ctx);
    session->in = new_memory_bio();
    session->out = new_memory_bio();
    if (session->ssl == NULL || session->in == NULL || session->out == NULL) {
        BIO_free(session->in);
        BIO_free(session->out);
        SSL_free(session->ssl);
        free(session);
        return NULL;
    }
    SSL_set_bio(session->ssl, session->in, session->out);
    if (client) {
        if (servername != NULL)
            SSL_set_tlsext_host_name(session->ssl, servername);
        SSL_set_connect_state(session->ssl);
    } else {
        SSL_set_accept_state(session->ssl);
    }
    return session;
}

void tls_session_free(struct tls_session *session)
{
    if (session == NULL)
        return;
    SSL_free(session->ssl); /* and the BIOs */
    free(session->writing);
    free(session);
}

bool tls_session_peer_verified(const struct tls_session *session)
{
    X509 *cert = SSL_get0_peer_certificate(session->ssl);
    return cert != NULL && SSL_get_verify_result(session->ssl) == X509_V_OK;
}

int tls_session_peer_cn(const struct tls_session *session, char *out, size_t out_size)
{
    if (!tls_session_peer_verified(session))
        return -1;
    X509_NAME *subject = X509_get_subject_name(SSL_get0_peer_certificate(session->ssl));
    int index = subject ? X509_NAME_get_index_by_NID(subject, NID_commonName, -1) : -1;
    if (index < 0)
        return -1;
    ASN1_STRING *data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
    unsigned char *utf8 = NULL;
    int len = ASN1_STRING_to_UTF8(&utf8, data);
    int result = -1;
    if (len > 0 && (size_t)len < out_size && memchr(utf8, '\0', (size_t)len) == NULL) {
        memcpy(out, utf8, (size_t)len);
        out[len] = '\0';
        result = len;
    }
    OPENSSL_free(utf8);
    return result;
}

void tls_session_describe(const struct tls_session *session, char *out, size_t out_size)
{
    snprintf(out, out_size, "%s %s", SSL_get_version(session->ssl),
             SSL_get_cipher_name(session->ssl));
}

int tls_context_cert_seconds_left(const struct tls_context *tls, int64_t *seconds)
{
    X509 *cert = tls->ctx != NULL ? SSL_CTX_get0_certificate(tls->ctx) : NULL;
    int days = 0, secs = 0;
    if (cert == NULL || ASN1_TIME_diff(&days, &secs, NULL, X509_get0_notAfter(cert)) != 1)
        return -1;
    *seconds = (int64_t)days * 86400 + secs;
    return 0;
}
