/*
 * test_http_guard.c: the management API's header checks (mgmt/http_guard.h),
 * the strict base64 decoder under them (lib/base64.h), and the request
 * parser's keeping of the headers they read (mgmt/http.h).
 *
 * Goal: base64 round-trips every length and refuses every non-canonical
 * spelling (bad length, padding inside, stray bits, other alphabets); Basic
 * credentials split at the first colon and a scheme other than Basic is
 * told apart from a malformed Basic; a Host is allowed only as this
 * server's address, a loopback name on loopback, or an operator's name,
 * with or without a port, and nothing else (DNS rebinding names, ports that
 * are not numbers, unbracketed IPv6); an Origin matches only "http://" +
 * Host; Content-Type is application/json with parameters or nothing; a
 * second Authorization/Origin/Content-Type header is 400.
 *
 * Method: call the pure functions with literal values and compare.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "lib/base64.h"
#include "lib/errors.h"
#include "mgmt/http.h"
#include "mgmt/http_guard.h"

/* ---- base64 --------------------------------------------------------------- */

static void test_base64_vectors(void **state)
{
    (void)state;
    /* RFC 4648 section 10. */
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const coded[] = {"",         "Zg==",     "Zm8=",    "Zm9v",
                                        "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < 7; i++) {
        char out[16];
        size_t n = strlen(plain[i]);
        assert_int_equal(base64_encoded_size(n), strlen(coded[i]));
        base64_encode((const uint8_t *)plain[i], n, out);
        assert_string_equal(out, coded[i]);
        uint8_t back[16];
        size_t back_size = 99;
        assert_int_equal(base64_decode(coded[i], strlen(coded[i]), back, sizeof back, &back_size),
                         OK);
        assert_int_equal(back_size, n);
        assert_memory_equal(back, plain[i], n);
    }
}

static void test_base64_round_trip_every_byte(void **state)
{
    (void)state;
    uint8_t in[256];
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (uint8_t)(255 - i);
    for (size_t n = 0; n <= sizeof in; n++) {
        char coded[400];
        base64_encode(in, n, coded);
        uint8_t out[256];
        size_t out_size = 0;
        assert_int_equal(base64_decode(coded, strlen(coded), out, sizeof out, &out_size), OK);
        assert_int_equal(out_size, n);
        assert_memory_equal(out, in, n);
    }
}

static void test_base64_strict(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "Zg",       /* no padding */
        "Zg=",      /* short padding */
        "Z===",     /* three '=' */
        "====",
        "Zg==Zm8=", /* padding inside */
        "Zm=v",
        "Zh==",     /* stray bits: 'h' leaves 0b0001 over */
        "Zm9=",     /* stray bits under one '=' */
        "Zm9v\n",
        "Zm 9v",
        "Zm-_",     /* the URL-safe alphabet */
        "Zm9v====",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t out[16];
        size_t n;
        assert_int_equal(base64_decode(bad[i], strlen(bad[i]), out, sizeof out, &n), E_SYNTAX);
    }
    uint8_t small[2];
    size_t n;
    assert_int_equal(base64_decode("Zm9v", 4, small, sizeof small, &n), E_LIMIT);
}

/* ---- Authorization: Basic ---------------------------------------------------- */

static enum http_basic basic(const char *value, struct http_credentials *c)
{
    return http_basic_parse(value, strlen(value), c);
}

static void test_basic_credentials(void **state)
{
    (void)state;
    struct http_credentials c;
    assert_int_equal(basic("Basic Z3Vlc3Q6Z3Vlc3Q=", &c), HTTP_BASIC_OK); /* guest:guest */
    assert_int_equal(c.user_size, 5);
    assert_memory_equal(c.user, "guest", 5);
    assert_int_equal(c.password_size, 5);
    assert_memory_equal(c.password, "guest", 5);
    /* The scheme in any case, extra spaces; the password keeps its colons. */
    assert_int_equal(basic("  bAsIc   YTpiOmM= ", &c), HTTP_BASIC_OK); /* a:b:c */
    assert_int_equal(c.user_size, 1);
    assert_int_equal(c.password_size, 3);
    assert_memory_equal(c.password, "b:c", 3);
    /* Empty user and password are well-formed (and refused by the login). */
    assert_int_equal(basic("Basic Og==", &c), HTTP_BASIC_OK); /* ":" */
    assert_int_equal(c.user_size, 0);
    assert_int_equal(c.password_size, 0);

    assert_int_equal(basic("Bearer abc", &c), HTTP_BASIC_OTHER);
    assert_int_equal(basic("", &c), HTTP_BASIC_OTHER);
    assert_int_equal(basic("BasicZ3Vlc3Q6Z3Vlc3Q=", &c), HTTP_BASIC_OTHER);
    assert_int_equal(basic("Basic", &c), HTTP_BASIC_MALFORMED);
    assert_int_equal(basic("Basic   ", &c), HTTP_BASIC_MALFORMED);
    assert_int_equal(basic("Basic !!!!", &c), HTTP_BASIC_MALFORMED);
    assert_int_equal(basic("Basic Z3Vlc3Q6Z3Vlc3Q", &c), HTTP_BASIC_MALFORMED); /* unpadded */
    assert_int_equal(basic("Basic Z3Vlc3Q=", &c), HTTP_BASIC_MALFORMED);  /* "guest": no colon */
    /* Longer than HTTP_CREDENTIALS_SIZE_MAX once decoded. */
    uint8_t big[HTTP_CREDENTIALS_SIZE_MAX + 3];
    memset(big, 'a', sizeof big);
    big[1] = ':';
    char value[2 * sizeof big];
    memcpy(value, "Basic ", 6);
    base64_encode(big, sizeof big, value + 6);
    assert_int_equal(basic(value, &c), HTTP_BASIC_MALFORMED);
    base64_encode(big, HTTP_CREDENTIALS_SIZE_MAX, value + 6);
    assert_int_equal(basic(value, &c), HTTP_BASIC_OK);
}

/* ---- Host ---------------------------------------------------------------- */

static struct sockaddr_storage v4(const char *text)
{
    struct sockaddr_storage ss = {0};
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    sin->sin_family = AF_INET;
    assert_int_equal(inet_pton(AF_INET, text, &sin->sin_addr), 1);
    return ss;
}

static struct sockaddr_storage v6(const char *text)
{
    struct sockaddr_storage ss = {0};
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    sin6->sin6_family = AF_INET6;
    assert_int_equal(inet_pton(AF_INET6, text, &sin6->sin6_addr), 1);
    return ss;
}

static bool host_ok(const char *host, struct sockaddr_storage local, const char *allowed)
{
    return http_host_allowed(host, strlen(host), (const struct sockaddr *)&local, allowed);
}

static void test_host_on_loopback(void **state)
{
    (void)state;
    struct sockaddr_storage lo = v4("127.0.0.1");
    assert_true(host_ok("127.0.0.1:15672", lo, NULL));
    assert_true(host_ok("127.0.0.1", lo, NULL));
    assert_true(host_ok("localhost:15672", lo, NULL));
    assert_true(host_ok("LocalHost", lo, NULL));
    assert_true(host_ok("[::1]:15672", lo, NULL));
    assert_true(host_ok("localhost:", lo, NULL)); /* an empty port is RFC 3986's */
    /* DNS rebinding: a name that resolves here, chosen by someone else. */
    assert_false(host_ok("evil.example:15672", lo, NULL));
    assert_false(host_ok("localhost.evil.example", lo, NULL));
    assert_false(host_ok("localhost.", lo, NULL));
    assert_false(host_ok("", lo, NULL));
    assert_false(host_ok(":15672", lo, NULL));
    assert_false(host_ok("localhost:http", lo, NULL));
    assert_false(host_ok("localhost:156720", lo, NULL));
    assert_false(host_ok("::1", lo, NULL));        /* IPv6 without brackets */
    assert_false(host_ok("[::1", lo, NULL));
    assert_false(host_ok("[::1]x", lo, NULL));
    assert_false(host_ok("192.0.2.7:15672", lo, NULL)); /* another address */
    /* The operator's names, any case, with or without a port. */
    assert_true(host_ok("mq.example:15672", lo, "a.example,MQ.example"));
    assert_true(host_ok("a.example", lo, "a.example,MQ.example"));
    assert_false(host_ok("b.example", lo, "a.example,MQ.example"));
    assert_false(host_ok("example", lo, "a.example,MQ.example"));
    /* The IPv6 loopback (and an IPv4-mapped local address). */
    assert_true(host_ok("[::1]:1", v6("::1"), NULL));
    assert_true(host_ok("[0:0:0:0:0:0:0:1]", v6("::1"), NULL));
    assert_true(host_ok("127.0.0.1:1", v6("::ffff:127.0.0.1"), NULL));
    assert_true(host_ok("localhost", v6("::1"), NULL));
}

static void test_host_beyond_loopback(void **state)
{
    (void)state;
    struct sockaddr_storage here = v4("192.0.2.7");
    assert_true(host_ok("192.0.2.7:15672", here, NULL));
    assert_true(host_ok("192.0.2.7:15672", v6("::ffff:192.0.2.7"), NULL));
    assert_false(host_ok("192.0.2.8:15672", here, NULL));
    assert_false(host_ok("localhost:15672", here, NULL)); /* not how it was reached */
    assert_false(host_ok("127.0.0.1:15672", here, NULL));
    assert_false(host_ok("mq.example:15672", here, NULL));
    assert_true(host_ok("mq.example:15672", here, "mq.example"));
    struct sockaddr_storage here6 = v6("2001:db8::7");
    assert_true(host_ok("[2001:db8::7]:15672", here6, NULL));
    assert_true(host_ok("[2001:DB8:0::7]", here6, NULL));
    assert_false(host_ok("[2001:db8::8]", here6, NULL));
    assert_false(host_ok("[::1]", here6, NULL));
}

/* ---- Origin, Content-Type ---------------------------------------------------- */

static bool own(const char *origin, const char *host)
{
    return http_origin_is_own(origin, strlen(origin), host, strlen(host), false);
}

static void test_origin(void **state)
{
    (void)state;
    assert_true(own("http://127.0.0.1:15672", "127.0.0.1:15672"));
    assert_true(own("HTTP://LocalHost:15672", "localhost:15672"));
    assert_false(own("http://evil.example", "127.0.0.1:15672"));
    assert_false(own("http://127.0.0.1:15673", "127.0.0.1:15672"));
    assert_false(own("https://127.0.0.1:15672", "127.0.0.1:15672"));
    assert_false(own("http://127.0.0.1:15672/", "127.0.0.1:15672"));
    assert_false(own("http://127.0.0.1", "127.0.0.1:15672"));
    assert_false(own("null", "127.0.0.1:15672"));
    assert_false(own("http://", ""));
    /* Over HTTPS the own origin has the https scheme, and only that one. */
    assert_true(http_origin_is_own("https://mq.example:15671", 24, "mq.example:15671", 16, true));
    assert_false(http_origin_is_own("http://mq.example:15671", 23, "mq.example:15671", 16, true));
}

static bool json_type(const char *value)
{
    return http_content_type_is_json(value, strlen(value));
}

static void test_content_type(void **state)
{
    (void)state;
    assert_true(json_type("application/json"));
    assert_true(json_type("Application/JSON; charset=utf-8"));
    assert_true(json_type(" application/json ;charset=utf-8"));
    assert_false(json_type("application/x-www-form-urlencoded"));
    assert_false(json_type("text/plain"));
    assert_false(json_type("multipart/form-data; boundary=x"));
    assert_false(json_type("application/jsonp"));
    assert_false(json_type("application/json-patch+json"));
    assert_false(json_type(""));
}

/* ---- the parser keeps the headers ---------------------------------------------- */

static void test_parser_keeps_guarded_headers(void **state)
{
    (void)state;
    static const char text[] = "PUT /api/x HTTP/1.1\r\nhost:  h:1 \r\nORIGIN: http://h:1\r\n"
                               "Authorization: Basic Og==\r\nContent-Type: application/json\r\n"
                               "\r\n";
    struct http_request req;
    assert_int_equal(http_parse_request(text, sizeof text - 1, &req), OK);
    assert_int_equal(req.host_size, 3);
    assert_memory_equal(req.host, "h:1", 3);
    assert_int_equal(req.origin_size, 10);
    assert_memory_equal(req.origin, "http://h:1", 10);
    assert_int_equal(req.authorization_size, 10);
    assert_memory_equal(req.authorization, "Basic Og==", 10);
    assert_int_equal(req.content_type_size, 16);
    static const char cached[] = "GET / HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"ab\"\r\n\r\n";
    assert_int_equal(http_parse_request(cached, sizeof cached - 1, &req), OK);
    assert_int_equal(req.if_none_match_size, 4);
    assert_memory_equal(req.if_none_match, "\"ab\"", 4);
    static const char plain[] = "GET / HTTP/1.1\r\nHost: h\r\n\r\n";
    assert_int_equal(http_parse_request(plain, sizeof plain - 1, &req), OK);
    assert_null(req.origin);
    assert_null(req.if_none_match);
    assert_null(req.authorization);
    assert_null(req.content_type);
    static const char *const twice[] = {
        "GET / HTTP/1.1\r\nHost: h\r\nAuthorization: a\r\nauthorization: b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nOrigin: http://h\r\nOrigin: http://h\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nContent-Type: a\r\nContent-type: a\r\n\r\n",
    };
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(http_parse_request(twice[i], strlen(twice[i]), &req), E_SYNTAX);
        assert_int_equal(req.status, 400);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64_vectors),
        cmocka_unit_test(test_base64_round_trip_every_byte),
        cmocka_unit_test(test_base64_strict),
        cmocka_unit_test(test_basic_credentials),
        cmocka_unit_test(test_host_on_loopback),
        cmocka_unit_test(test_host_beyond_loopback),
        cmocka_unit_test(test_origin),
        cmocka_unit_test(test_content_type),
        cmocka_unit_test(test_parser_keeps_guarded_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
