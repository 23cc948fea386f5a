/*
 * test_json.c: the management API's JSON writer (lib/json.h), and its
 * pure request parser (mgmt/http.h), which has no sockets to need a file
 * of its own.
 *
 * Goal: every document the writer produces is valid JSON with the exact
 * bytes expected: separators in the right places at every nesting level,
 * strings escaped as RFC 8259 demands (quote, backslash, every control
 * character), valid UTF-8 passed through byte for byte and invalid UTF-8
 * replaced (U+FFFD per bad byte), integers at their extremes, and a
 * buffer that grows without losing bytes. For the parser: complete,
 * partial and malformed request heads give OK, AGAIN and the right status.
 *
 * Method: write small documents and compare the buffer with literal
 * expected text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "lib/errors.h"
#include "mgmt/http.h"
#include "lib/json.h"
#include "lib/json_read.h"
#include "lib/utf8.h"

/* Compares the writer's buffer with `expected`, then frees it. */
static void expect_json(struct json *j, const char *expected)
{
    assert_true(json_complete(j));
    size_t size;
    char *data = json_release(j, &size);
    char *text = malloc(size + 1);
    assert_non_null(text);
    memcpy(text, data, size);
    text[size] = '\0';
    assert_string_equal(text, expected);
    assert_int_equal(size, strlen(expected));
    free(text);
    free(data);
    assert_null(j->data); /* released: the writer is empty again */
}

static void test_scalars(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    json_null(&j);
    expect_json(&j, "null");
    json_bool(&j, true);
    expect_json(&j, "true");
    json_bool(&j, false);
    expect_json(&j, "false");
    json_int(&j, 0);
    expect_json(&j, "0");
    json_int(&j, -42);
    expect_json(&j, "-42");
    json_int(&j, INT64_MIN);
    expect_json(&j, "-9223372036854775808");
    json_int(&j, INT64_MAX);
    expect_json(&j, "9223372036854775807");
    json_uint(&j, UINT64_MAX);
    expect_json(&j, "18446744073709551615");
    json_string(&j, "");
    expect_json(&j, "\"\"");
    /* Floats read back as floats, in their shortest exact text. */
    json_double(&j, 0.0);
    expect_json(&j, "0.0");
    json_double(&j, 2.0);
    expect_json(&j, "2.0");
    json_double(&j, 19.95);
    expect_json(&j, "19.95");
    json_double(&j, 0.1 + 0.2);
    expect_json(&j, "0.30000000000000004");
    json_double(&j, 1e300);
    expect_json(&j, "1e+300");
    /* Rates: two decimals, always a fraction. */
    json_decimal(&j, 19.949999);
    expect_json(&j, "19.95");
    json_decimal(&j, 3.0);
    expect_json(&j, "3.0");
    json_decimal(&j, 0.2);
    expect_json(&j, "0.2");
    json_decimal(&j, -1.5);
    expect_json(&j, "-1.5");
}

static void test_empty_containers(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    json_object_begin(&j);
    json_object_end(&j);
    expect_json(&j, "{}");
    json_array_begin(&j);
    json_array_end(&j);
    expect_json(&j, "[]");
    json_array_begin(&j);
    json_array_begin(&j);
    json_array_end(&j);
    json_object_begin(&j);
    json_object_end(&j);
    json_array_end(&j);
    expect_json(&j, "[[],{}]");
}

/* Room reserved in the middle of a text keeps the text and the writer's
 * state (the next member still gets its comma), and needs no growth. */
static void test_reserve_mid_text(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    json_array_begin(&j);
    json_uint(&j, 1);
    json_reserve(&j, 100000);
    assert_true(j.cap - j.size >= 100000);
    char *data = j.data;
    size_t cap = j.cap;
    for (int i = 0; i < 1000; i++)
        json_string(&j, "0123456789");
    assert_ptr_equal(j.data, data);
    assert_int_equal(j.cap, cap);
    json_array_end(&j);
    assert_true(json_complete(&j));
    assert_memory_equal(j.data, "[1,\"0123456789\",", 16);
    json_free(&j);
}

/* Commas and colons at every level, and a level's "has members" state
 * restored after a nested container closes. */
static void test_nesting_separators(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    json_object_begin(&j);
    json_kv_string(&j, "a", "x");
    json_key(&j, "b");
    json_array_begin(&j);
    json_uint(&j, 1);
    json_object_begin(&j);
    json_kv_bool(&j, "c", true);
    json_key(&j, "d");
    json_null(&j);
    json_object_end(&j);
    json_array_begin(&j);
    json_array_end(&j);
    json_int(&j, -2);
    json_array_end(&j);
    json_kv_uint(&j, "e", 3);
    json_key(&j, "f");
    json_object_begin(&j);
    json_object_end(&j);
    json_object_end(&j);
    expect_json(&j, "{\"a\":\"x\",\"b\":[1,{\"c\":true,\"d\":null},[],-2],\"e\":3,\"f\":{}}");
}

static void test_deep_nesting(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    char expected[2 * JSON_DEPTH_MAX + 1];
    for (int i = 0; i < JSON_DEPTH_MAX; i++) {
        json_array_begin(&j);
        expected[i] = '[';
        expected[2 * JSON_DEPTH_MAX - 1 - i] = ']';
    }
    expected[2 * JSON_DEPTH_MAX] = '\0';
    assert_false(json_complete(&j));
    for (int i = 0; i < JSON_DEPTH_MAX; i++)
        json_array_end(&j);
    expect_json(&j, expected);
}

static void test_string_escapes(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    json_string(&j, "say \"hi\" \\ bye/");
    expect_json(&j, "\"say \\\"hi\\\" \\\\ bye/\"");
    json_string(&j, "\b\f\n\r\t");
    expect_json(&j, "\"\\b\\f\\n\\r\\t\"");
    json_string(&j, "\x01\x1f\x7f x");
    expect_json(&j, "\"\\u0001\\u001f\x7f x\"");
    /* An embedded NUL is data, written with its length. */
    json_string_n(&j, "a\0b", 3);
    expect_json(&j, "\"a\\u0000b\"");
    /* Keys are strings too. */
    json_object_begin(&j);
    json_kv_string(&j, "k\"\n", "v");
    json_object_end(&j);
    expect_json(&j, "{\"k\\\"\\n\":\"v\"}");
}

/* Every control character has an escape, and nothing else is escaped. */
static void test_every_byte_below_0x80(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    for (unsigned c = 0; c < 0x80; c++) {
        char in = (char)c;
        json_string_n(&j, &in, 1);
        size_t size;
        char *out = json_release(&j, &size);
        if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' ||
            c == '\t') {
            assert_int_equal(size, 4);
            assert_int_equal(out[1], '\\');
        } else if (c < 0x20) {
            assert_int_equal(size, 8);
            assert_memory_equal(out + 1, "\\u00", 4);
        } else {
            assert_int_equal(size, 3);
            assert_int_equal((unsigned char)out[1], c);
        }
        free(out);
    }
}

static void test_utf8_pass_through(void **state)
{
    (void)state;
    /* 2-, 3- and 4-byte sequences, at the edges of their ranges. */
    static const char *valid[] = {
        "h\xC3\xA9llo",            /* é */
        "\xE2\x82\xAC",            /* € */
        "\xF0\x9D\x84\x9E",        /* 𝄞, U+1D11E */
        "\xC2\x80\xDF\xBF",        /* U+0080, U+07FF */
        "\xE0\xA0\x80\xEF\xBF\xBF", /* U+0800, U+FFFF */
        "\xED\x9F\xBF\xEE\x80\x80", /* U+D7FF, U+E000: around the surrogates */
        "\xF0\x90\x80\x80\xF4\x8F\xBF\xBF", /* U+10000, U+10FFFF */
    };
    struct json j;
    json_init(&j);
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        json_string(&j, valid[i]);
        char expected[64];
        snprintf(expected, sizeof expected, "\"%s\"", valid[i]);
        expect_json(&j, expected);
    }
}

static void test_invalid_utf8_replaced(void **state)
{
    (void)state;
#define FFFD "\xEF\xBF\xBD"
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"\xFF", "\"" FFFD "\""},                         /* never valid */
        {"a\x80z", "\"a" FFFD "z\""},                      /* lone continuation */
        {"\xC0\xAF", "\"" FFFD FFFD "\""},                 /* overlong '/' */
        {"\xE0\x80\xAF", "\"" FFFD FFFD FFFD "\""},        /* overlong, 3 bytes */
        {"\xED\xA0\x80", "\"" FFFD FFFD FFFD "\""},        /* surrogate U+D800 */
        {"\xF4\x90\x80\x80", "\"" FFFD FFFD FFFD FFFD "\""}, /* above U+10FFFF */
        {"\xF5\x80", "\"" FFFD FFFD "\""},
        {"x\xE2\x82", "\"x" FFFD FFFD "\""},               /* cut short at the end */
        {"\xE2\x82x", "\"" FFFD FFFD "x\""},               /* cut short by ASCII */
        {"\xC3\xA9\xFF\xC3\xA9", "\"\xC3\xA9" FFFD "\xC3\xA9\""},
    };
#undef FFFD
    struct json j;
    json_init(&j);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_string(&j, cases[i].in);
        expect_json(&j, cases[i].out);
    }
}

/* Growth: many reallocations keep every byte. */
static bool keep_string(void *ctx, const struct json_read_member *m, char *err, size_t err_size)
{
    (void)err;
    (void)err_size;
    memcpy(ctx, m->string, m->string_size + 1);
    return true;
}

/* The reader takes strings as UTF-8 only (RFC 8259): raw bytes that are
 * not (a lone continuation byte, an overlong form, a surrogate, a cut
 * sequence) are refused; escapes and valid sequences are kept. */
static void test_reader_takes_utf8_only(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"a\": \"\x9f\"}", "{\"a\": \"\xc0\xaf\"}", "{\"a\": \"\xed\xa0\x80\"}",
        "{\"a\": \"\xe2\x82\"}", "{\"a\": \"x\xff\"}",
    };
    char out[JSON_READ_STRING_SIZE], err[128];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(json_read_object(bad[i], strlen(bad[i]), keep_string, out, err,
                                          sizeof err),
                         E_SYNTAX);
        assert_non_null(strstr(err, "UTF-8"));
    }
    const char *good = "{\"a\": \"caf\xc3\xa9 \xe2\x82\xac \\u00e9 \xf0\x9f\x98\x80\"}";
    assert_int_equal(json_read_object(good, strlen(good), keep_string, out, err, sizeof err), OK);
    assert_string_equal(out, "caf\xc3\xa9 \xe2\x82\xac \xc3\xa9 \xf0\x9f\x98\x80");
}

/* One string escape (json_read_escape, the flat reader's and the tree
 * parser's): its code point, a surrogate pair joined, and where it ends;
 * or why it is none, with the position where reading stopped. */
static void test_reader_escapes(void **state)
{
    (void)state;
    static const struct {
        const char *text; /* after the backslash */
        uint32_t cp;
        const char *why;  /* NULL: an escape */
        size_t read;      /* bytes consumed */
    } cases[] = {
        {"n", '\n', NULL, 1},
        {"/x", '/', NULL, 1},
        {"u00e9", 0xe9, NULL, 5},
        {"u20AC", 0x20ac, NULL, 5},
        {"ud83d\\ude00.", 0x1f600, NULL, 11},
        {"", 0, "unterminated string", 0},
        {"x", 0, "bad escape", 1},
        {"u12", 0, "short \\u escape", 1},
        {"u12G4", 0, "bad \\u escape", 4},
        {"udc00", 0, "lone low surrogate", 5},
        {"ud83d", 0, "lone high surrogate", 5},
        {"ud83d\\u0041", 0, "bad surrogate pair", 11},
        {"ud83d\\uZZZZ", 0, "bad \\u escape", 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = cases[i].text, *end = p + strlen(p);
        uint32_t cp = 0;
        const char *why = json_read_escape(&p, end, &cp);
        if (cases[i].why == NULL) {
            assert_null(why);
            assert_int_equal(cp, cases[i].cp);
        } else {
            assert_non_null(why);
            assert_string_equal(why, cases[i].why);
        }
        assert_int_equal(p - cases[i].text, cases[i].read);
    }
    /* The code point as UTF-8: 1 to 4 bytes, a valid sequence. */
    static const struct {
        uint32_t cp;
        const char *utf8;
    } encoded[] = {{0x41, "A"}, {0xe9, "\xc3\xa9"}, {0x20ac, "\xe2\x82\xac"},
                   {0x1f600, "\xf0\x9f\x98\x80"}, {0x10ffff, "\xf4\x8f\xbf\xbf"}};
    for (size_t i = 0; i < sizeof encoded / sizeof encoded[0]; i++) {
        char out[4];
        size_t k = utf8_encode(encoded[i].cp, out);
        assert_int_equal(k, strlen(encoded[i].utf8));
        assert_memory_equal(out, encoded[i].utf8, k);
        if (k > 1) /* (utf8_sequence_size is for what is past ASCII) */
            assert_int_equal(utf8_sequence_size((const uint8_t *)out, k), k);
    }
}

struct kept {
    enum json_read_kind kind;
    char string[JSON_READ_STRING_SIZE];
};

static bool keep_member(void *ctx, const struct json_read_member *m, char *err, size_t err_size)
{
    (void)err;
    (void)err_size;
    struct kept *k = ctx;
    k->kind = m->kind;
    memcpy(k->string, m->string, m->string_size + 1);
    return true;
}

/* An array of strings (RabbitMQ 3.10's "tags") comes joined with ','; an
 * element with a ',' in it, a number in it, or an object is refused. */
static void test_reader_string_lists(void **state)
{
    (void)state;
    struct kept k;
    char err[128];
    const char *good = "{\"tags\": [\"administrator\", \"management\"]}";
    assert_int_equal(json_read_object(good, strlen(good), keep_member, &k, err, sizeof err), OK);
    assert_int_equal(k.kind, JSON_READ_STRING_LIST);
    assert_string_equal(k.string, "administrator,management");
    const char *empty = "{\"tags\": [ ]}";
    assert_int_equal(json_read_object(empty, strlen(empty), keep_member, &k, err, sizeof err),
                     OK);
    assert_string_equal(k.string, "");
    static const char *const bad[] = {"{\"t\": [\"a,b\"]}", "{\"t\": [1]}", "{\"t\": {}}",
                                      "{\"t\": [\"a\" \"b\"]}", "{\"t\": [\"a\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(json_read_object(bad[i], strlen(bad[i]), keep_member, &k, err,
                                          sizeof err),
                         E_SYNTAX);
}

static void test_growth(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    json_array_begin(&j);
    for (int i = 0; i < 20000; i++)
        json_int(&j, i % 10);
    json_array_end(&j);
    assert_true(json_complete(&j));
    size_t size;
    char *data = json_release(&j, &size);
    assert_int_equal(size, 2 + 20000 + 19999);
    assert_int_equal(data[0], '[');
    assert_int_equal(data[size - 1], ']');
    for (size_t i = 1; i + 1 < size; i++)
        assert_int_equal(data[i], (i % 2) ? (char)('0' + (i / 2) % 10) : ',');
    free(data);

    /* One long string across many growth steps. */
    size_t n = 300000;
    char *big = malloc(n);
    assert_non_null(big);
    for (size_t i = 0; i < n; i++)
        big[i] = (i % 100 == 99) ? '\n' : (char)('a' + i % 26);
    json_init(&j);
    json_string_n(&j, big, n);
    data = json_release(&j, &size);
    assert_int_equal(size, n + n / 100 + 2);
    free(data);
    free(big);
}

/* Raw headroom before the document (the HTTP head goes there). */
static void test_raw_headroom(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    json_raw(&j, "HEADROOM", 8);
    assert_false(json_complete(&j));
    json_object_begin(&j);
    json_kv_uint(&j, "n", 1);
    json_object_end(&j);
    expect_json(&j, "HEADROOM{\"n\":1}");
    /* json_free on an unfinished document releases the buffer. */
    json_array_begin(&j);
    json_string(&j, "x");
    json_free(&j);
    assert_null(j.data);
    assert_int_equal(j.size, 0);
}

/* json_adopt: what was written moves into the caller's buffer, writing
 * goes on there, and it grows from there when it must. */
static void test_adopt(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    json_raw(&j, "HEAD", 4);
    char *warm = malloc(64);
    assert_non_null(warm);
    memset(warm, 'x', 64);
    json_adopt(&j, warm, 64);
    assert_ptr_equal(j.data, warm);
    assert_int_equal(j.cap, 64);
    json_raw(&j, "body", 4);
    assert_ptr_equal(j.data, warm);
    char big[100];
    memset(big, 'b', sizeof big);
    json_raw(&j, big, sizeof big); /* past the adopted cap: grown by realloc */
    assert_int_equal(j.size, 108);
    assert_memory_equal(j.data, "HEADbody", 8);
    assert_memory_equal(j.data + 8, big, sizeof big);
    json_free(&j);
    json_init(&j); /* an empty writer adopts too */
    json_adopt(&j, malloc(16), 16);
    json_raw(&j, "ab", 2);
    assert_memory_equal(j.data, "ab", 2);
    json_free(&j);
}

/* ---- http_parse_request ------------------------------------------------- */

static int parse(const char *text, struct http_request *req)
{
    return http_parse_request(text, strlen(text), req);
}

static void test_http_complete_requests(void **state)
{
    (void)state;
    struct http_request req;
    assert_int_equal(parse("GET /api/queues HTTP/1.1\r\nHost: x\r\n\r\n", &req), OK);
    assert_int_equal(req.method_size, 3);
    assert_memory_equal(req.method, "GET", 3);
    assert_int_equal(req.target_size, 11);
    assert_memory_equal(req.target, "/api/queues", 11);
    assert_int_equal(req.version_minor, 1);
    /* HTTP/1.0 needs no Host; bare LF line ends; leading empty lines. */
    assert_int_equal(parse("\r\nHEAD /?a=b HTTP/1.0\n\n", &req), OK);
    assert_int_equal(req.target_size, 5);
    assert_int_equal(req.version_minor, 0);
    /* Anything after the head is ignored. */
    assert_int_equal(parse("POST / HTTP/1.1\r\nHost: h\r\nX-A:\t b \r\n\r\nbody", &req), OK);
    assert_memory_equal(req.method, "POST", 4);
}

static void test_http_partial_requests(void **state)
{
    (void)state;
    static const char full[] = "GET /api/overview HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\n";
    struct http_request req;
    for (size_t n = 0; n < sizeof full - 1; n++) {
        assert_int_equal(http_parse_request(full, n, &req), AGAIN);
        assert_int_equal(req.line_complete, n >= strlen("GET /api/overview HTTP/1.1\r\n"));
    }
    assert_int_equal(http_parse_request(full, sizeof full - 1, &req), OK);
}

static void test_http_malformed_requests(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int status;
    } cases[] = {
        {"GET\r\n\r\n", 400},
        {"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400},     /* two spaces */
        {"GET / HTTP/1.1 \r\nHost: h\r\n\r\n", 400},
        {"GET /\r\n\r\n", 400},                         /* HTTP/0.9 */
        {"GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n", 400}, /* absolute form */
        {"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505},
        {"GET / HTTP/1.10\r\nHost: h\r\n\r\n", 400},
        {"GET / http/1.1\r\nHost: h\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\n\r\n", 400},                 /* no Host */
        {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400},     /* space before ':' */
        {"GET / HTTP/1.1\r\nHost: h\r\nNoColon\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: h\x01\r\n\r\n", 400},
        {"G\xC3\xA9T / HTTP/1.1\r\n", 400},              /* non-token method */
    };
    struct http_request req;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(parse(cases[i].text, &req), E_SYNTAX);
        assert_int_equal(req.status, cases[i].status);
        assert_non_null(req.reason);
    }
    /* Garbage is refused before its line ends. */
    assert_int_equal(http_parse_request("\x16\x03\x01\x02", 4, &req), E_SYNTAX); /* TLS */
    assert_int_equal(http_parse_request("GET /\0", 6, &req), E_SYNTAX);
    char long_method[64];
    memset(long_method, 'A', sizeof long_method);
    assert_int_equal(http_parse_request(long_method, sizeof long_method, &req), E_SYNTAX);
    /* A long but plausible request line is merely unfinished. */
    assert_int_equal(parse("GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", &req), AGAIN);
    assert_false(req.line_complete);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_empty_containers),
        cmocka_unit_test(test_reserve_mid_text),
        cmocka_unit_test(test_nesting_separators),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_string_escapes),
        cmocka_unit_test(test_every_byte_below_0x80),
        cmocka_unit_test(test_utf8_pass_through),
        cmocka_unit_test(test_reader_takes_utf8_only),
        cmocka_unit_test(test_reader_escapes),
        cmocka_unit_test(test_reader_string_lists),
        cmocka_unit_test(test_invalid_utf8_replaced),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_raw_headroom),
        cmocka_unit_test(test_adopt),
        cmocka_unit_test(test_http_complete_requests),
        cmocka_unit_test(test_http_partial_requests),
        cmocka_unit_test(test_http_malformed_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
