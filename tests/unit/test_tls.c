/*
 * test_tls.c: TLS settings and sessions (net/tls.h) without sockets.
 *
 * Goal: a server context loads its certificate, key and CAs or says which
 * file is wrong; --tls-verify's three modes do what they say (none asks
 * for nothing; peer lets a client without a certificate in and verifies
 * one that is given; require fails the handshake without one); the peer's
 * CN is read only from a verified certificate; a reload that fails keeps
 * the previous SSL_CTX, one that succeeds replaces it while a session made
 * before keeps working; a trimmed idle session gives its buffers back and
 * works on; TLS 1.1 is refused.
 *
 * Method: a CA, a server and two client certificates (one from a CA the
 * server does not trust) are made with the openssl command in a temporary
 * directory; a client and a server session talk through their memory
 * BIOs, the test moving the bytes between them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/buffer.h>
#include <openssl/ssl.h>

#include "net/tls.h"

static char dir[64];

static void sh(const char *format, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, format);
    vsnprintf(cmd, sizeof cmd, format, ap);
    va_end(ap);
    char full[2300];
    snprintf(full, sizeof full, "cd %s && (%s) >/dev/null 2>&1", dir, cmd);
    assert_int_equal(system(full), 0);
}

static const char *file(const char *name)
{
    static char paths[8][128];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 128, "%s/%s", dir, name);
    return p;
}

static void issue(const char *name, const char *ca, const char *cn)
{
    sh("openssl req -newkey rsa:2048 -nodes -keyout %s.key -out %s.csr -subj '/CN=%s' && "
       "openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s.key -CAcreateserial -out %s.pem "
       "-days 2",
       name, name, cn, name, ca, ca, name);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/quay-test-tls-%d", (int)getpid());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
       "-subj '/CN=test CA' && openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key "
       "-out other.pem -days 2 -subj '/CN=other CA'");
    issue("server", "ca", "localhost");
    issue("app", "ca", "app");
    issue("rogue", "other", "app");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void server_init(struct tls_context *tls, enum tls_verify verify)
{
    struct tls_config config = {.cert_file = file("server.pem"), .key_file = file("server.key"),
                                .ca_file = file("ca.pem"), .verify = verify};
    char err[512];
    assert_int_equal(tls_context_init(tls, &config, err, sizeof err), 0);
}

/* A client context: verifies the server with ca.pem; presents name's
 * certificate when name is not NULL. */
static void client_init(struct tls_context *tls, const char *name)
{
    char cert[64], key[64];
    snprintf(cert, sizeof cert, "%s.pem", name ? name : "");
    snprintf(key, sizeof key, "%s.key", name ? name : "");
    struct tls_config config = {.cert_file = name ? file(cert) : NULL,
                                .key_file = name ? file(key) : NULL, .ca_file = file("ca.pem"),
                                .verify = TLS_VERIFY_PEER, .client = true};
    char err[512];
    assert_int_equal(tls_context_init(tls, &config, err, sizeof err), 0);
}

/* Moves what one session wrote to the other's input. */
static size_t carry(struct tls_session *from, struct tls_session *to)
{
    char buf[16384];
    size_t moved = 0;
    int n;
    while ((n = BIO_read(from->out, buf, sizeof buf)) > 0) {
        assert_int_equal(BIO_write(to->in, buf, n), n);
        moved += (size_t)n;
    }
    return moved;
}

/* Runs both handshakes to the end; returns whether both succeeded. */
static bool handshake(struct tls_session *client, struct tls_session *server)
{
    for (int round = 0; round < 20; round++) {
        int c = SSL_do_handshake(client->ssl);
        carry(client, server);
        int s = SSL_do_handshake(server->ssl);
        size_t back = carry(server, client);
        if (c == 1 && s == 1)
            return true;
        if (c <= 0 && SSL_get_error(client->ssl, c) == SSL_ERROR_SSL)
            return false;
        if (s <= 0 && SSL_get_error(server->ssl, s) == SSL_ERROR_SSL)
            return false;
        (void)back;
    }
    return false;
}

/* A client (with name's certificate, or none) against a server in mode
 * verify: whether the handshake and a first byte from the client succeed
 * (TLS 1.3 servers refuse a missing certificate after the client thinks
 * it is done), and the CN the server saw (or "" if none). */
static bool connect_as(const char *name, enum tls_verify verify, char *cn, size_t cn_size)
{
    struct tls_context server_tls, client_tls;
    server_init(&server_tls, verify);
    client_init(&client_tls, name);
    struct tls_session *server = tls_session_new(&server_tls, false, NULL);
    struct tls_session *client = tls_session_new(&client_tls, true, "localhost");
    assert_non_null(server);
    assert_non_null(client);
    bool ok = handshake(client, server);
    if (ok) {
        assert_int_equal(SSL_write(client->ssl, "x", 1), 1);
        carry(client, server);
        char byte;
        ok = SSL_read(server->ssl, &byte, 1) == 1 && byte == 'x';
    }
    cn[0] = '\0';
    if (ok && tls_session_peer_cn(server, cn, cn_size) < 0)
        cn[0] = '\0';
    tls_session_free(client);
    tls_session_free(server);
    tls_context_free(&client_tls);
    tls_context_free(&server_tls);
    return ok;
}

static void test_verify_modes(void **state)
{
    (void)state;
    char cn[256];
    assert_true(connect_as(NULL, TLS_VERIFY_NONE, cn, sizeof cn));
    assert_string_equal(cn, "");
    assert_true(connect_as("app", TLS_VERIFY_NONE, cn, sizeof cn)); /* not asked for */
    assert_string_equal(cn, "");
    assert_true(connect_as(NULL, TLS_VERIFY_PEER, cn, sizeof cn));
    assert_string_equal(cn, "");
    assert_true(connect_as("app", TLS_VERIFY_PEER, cn, sizeof cn));
    assert_string_equal(cn, "app");
    assert_false(connect_as("rogue", TLS_VERIFY_PEER, cn, sizeof cn)); /* untrusted CA */
    assert_false(connect_as(NULL, TLS_VERIFY_REQUIRE, cn, sizeof cn));
    assert_true(connect_as("app", TLS_VERIFY_REQUIRE, cn, sizeof cn));
    assert_string_equal(cn, "app");
    /* A CN that does not fit the caller's buffer is no name at all. */
    assert_true(connect_as("app", TLS_VERIFY_PEER, cn, 3));
    assert_string_equal(cn, "");
}

static void test_verify_parse(void **state)
{
    (void)state;
    enum tls_verify v;
    assert_int_equal(tls_verify_parse("none", &v), 0);
    assert_int_equal(v, TLS_VERIFY_NONE);
    assert_int_equal(tls_verify_parse("peer", &v), 0);
    assert_int_equal(v, TLS_VERIFY_PEER);
    assert_int_equal(tls_verify_parse("require", &v), 0);
    assert_int_equal(v, TLS_VERIFY_REQUIRE);
    assert_int_equal(tls_verify_parse("Peer", &v), -1);
    assert_int_equal(tls_verify_parse("", &v), -1);
}

static void test_bad_files(void **state)
{
    (void)state;
    struct tls_context tls;
    char err[512];
    struct tls_config config = {.cert_file = file("server.pem"), .key_file = file("app.key")};
    assert_int_equal(tls_context_init(&tls, &config, err, sizeof err), -1);
    assert_non_null(strstr(err, "app.key")); /* OpenSSL: key values mismatch */
    config.key_file = file("missing.key");
    assert_int_equal(tls_context_init(&tls, &config, err, sizeof err), -1);
    assert_non_null(strstr(err, "missing.key"));
    config = (struct tls_config){.cert_file = file("server.pem"), .key_file = file("server.key"),
                                 .verify = TLS_VERIFY_PEER};
    assert_int_equal(tls_context_init(&tls, &config, err, sizeof err), -1); /* no CAs */
    config.ca_file = file("nowhere.pem");
    assert_int_equal(tls_context_init(&tls, &config, err, sizeof err), -1);
    assert_non_null(strstr(err, "nowhere.pem"));
}

static void test_reload(void **state)
{
    (void)state;
    sh("cp server.pem live.pem && cp server.key live.key");
    struct tls_config config = {.cert_file = file("live.pem"), .key_file = file("live.key")};
    struct tls_context tls;
    char err[512];
    assert_int_equal(tls_context_init(&tls, &config, err, sizeof err), 0);
    struct tls_session *before = tls_session_new(&tls, false, NULL);
    void *first = tls.ctx;
    sh("echo broken > live.key");
    assert_int_equal(tls_context_reload(&tls, err, sizeof err), -1);
    assert_ptr_equal(tls.ctx, first);
    assert_int_equal(tls.loads_count, 1);
    sh("cp app.pem live.pem && cp app.key live.key");
    assert_int_equal(tls_context_reload(&tls, err, sizeof err), 0);
    assert_ptr_not_equal(tls.ctx, first);
    assert_int_equal(tls.loads_count, 2);
    /* The old session still holds its SSL_CTX: a handshake on it works. */
    struct tls_context client_tls;
    struct tls_config client = {.client = true, .verify = TLS_VERIFY_NONE};
    assert_int_equal(tls_context_init(&client_tls, &client, err, sizeof err), 0);
    struct tls_session *c = tls_session_new(&client_tls, true, NULL);
    assert_true(handshake(c, before));
    tls_session_free(c);
    tls_session_free(before);
    tls_context_free(&client_tls);
    tls_context_free(&tls);
}

/* An idle session gives its buffers back and goes on working after. */
static void test_trim(void **state)
{
    (void)state;
    struct tls_context server_tls, client_tls;
    server_init(&server_tls, TLS_VERIFY_NONE);
    client_init(&client_tls, NULL);
    struct tls_session *server = tls_session_new(&server_tls, false, NULL);
    struct tls_session *client = tls_session_new(&client_tls, true, "localhost");
    assert_true(handshake(client, server));
    static char big[200000], got[200000];
    memset(big, 'b', sizeof big);
    for (int round = 0; round < 3; round++) {
        size_t sent = 0, received = 0;
        while (sent < sizeof big) {
            int n = SSL_write(server->ssl, big + sent, (int)(sizeof big - sent));
            assert_true(n > 0);
            sent += (size_t)n;
        }
        carry(server, client);
        int n;
        while ((n = SSL_read(client->ssl, got + received, (int)(sizeof got - received))) > 0)
            received += (size_t)n;
        assert_int_equal(received, sizeof big);
        assert_memory_equal(got, big, sizeof big);
        tls_session_trim(server);
        tls_session_trim(client);
        BUF_MEM *mem = NULL;
        BIO_get_mem_ptr(server->out, &mem);
        assert_int_equal(mem->max, 0);
    }
    tls_session_free(client);
    tls_session_free(server);
    tls_context_free(&client_tls);
    tls_context_free(&server_tls);
}

static void test_old_protocols_refused(void **state)
{
    (void)state;
    struct tls_context server_tls, client_tls;
    server_init(&server_tls, TLS_VERIFY_NONE);
    client_init(&client_tls, NULL);
    struct tls_session *server = tls_session_new(&server_tls, false, NULL);
    struct tls_session *client = tls_session_new(&client_tls, true, "localhost");
    SSL_set_min_proto_version(client->ssl, TLS1_VERSION);
    SSL_set_max_proto_version(client->ssl, TLS1_1_VERSION);
    SSL_set_security_level(client->ssl, 0);
    assert_false(handshake(client, server));
    tls_session_free(client);
    tls_session_free(server);
    tls_context_free(&client_tls);
    tls_context_free(&server_tls);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_parse),
        cmocka_unit_test(test_verify_modes),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_trim),
        cmocka_unit_test(test_old_protocols_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
