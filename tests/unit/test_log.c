/*
 * test_log.c: the log line formats (lib/log.c), byte for byte: text, and
 * JSON with the message's leading key=value words as members, escaped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lib/log.h"

#define STAMP "2026-12-02T12:00:00.000Z"

static void expect_line(enum log_format format, enum log_level level, const char *message,
                        const char *want)
{
    char out[512];
    size_t n = log_format_line(out, sizeof out, format, level, STAMP, message);
    assert_int_equal(n, strlen(out));
    assert_string_equal(out, want);
}

static void test_text(void **state)
{
    (void)state;
    expect_line(LOG_FORMAT_TEXT, LOG_LEVEL_INFO, "conn=1 peer=a:1 opened",
                STAMP " info  conn=1 peer=a:1 opened");
    expect_line(LOG_FORMAT_TEXT, LOG_LEVEL_WARN, "x", STAMP " warn  x");
}

static void test_json_fields_and_message(void **state)
{
    (void)state;
    expect_line(LOG_FORMAT_JSON, LOG_LEVEL_INFO,
                "conn=42 peer=127.0.0.1:5 user=guest vhost=/ opened",
                "{\"time\":\"" STAMP "\",\"level\":\"info\",\"conn\":\"42\","
                "\"peer\":\"127.0.0.1:5\",\"user\":\"guest\",\"vhost\":\"/\","
                "\"message\":\"opened\"}");
    /* Words after the first that is not key=value stay in the message. */
    expect_line(LOG_FORMAT_JSON, LOG_LEVEL_ERROR, "cluster: a=b failed",
                "{\"time\":\"" STAMP "\",\"level\":\"error\","
                "\"message\":\"cluster: a=b failed\"}");
    /* A key must be [a-z_]+ and the value may not be empty of a word. */
    expect_line(LOG_FORMAT_JSON, LOG_LEVEL_DEBUG, "Conn=1 x",
                "{\"time\":\"" STAMP "\",\"level\":\"debug\",\"message\":\"Conn=1 x\"}");
    expect_line(LOG_FORMAT_JSON, LOG_LEVEL_INFO, "queue=",
                "{\"time\":\"" STAMP "\",\"level\":\"info\",\"queue\":\"\",\"message\":\"\"}");
}

static void test_json_escapes(void **state)
{
    (void)state;
    expect_line(LOG_FORMAT_JSON, LOG_LEVEL_INFO, "queue=a\"b\\c said \"hi\"\n\x01",
                "{\"time\":\"" STAMP "\",\"level\":\"info\",\"queue\":\"a\\\"b\\\\c\","
                "\"message\":\"said \\\"hi\\\"\\u000a\\u0001\"}");
}

static void test_json_keeps_utf8_and_replaces_the_rest(void **state)
{
    (void)state;
    expect_line(LOG_FORMAT_JSON, LOG_LEVEL_INFO, "queue=caf\xc3\xa9 \xff\xc3 \xe2\x82\xac",
                "{\"time\":\"" STAMP "\",\"level\":\"info\",\"queue\":\"caf\xc3\xa9\","
                "\"message\":\"\\ufffd\\ufffd \xe2\x82\xac\"}");
}

static void test_json_never_overflows(void **state)
{
    (void)state;
    char message[1024];
    memset(message, '"', sizeof message - 1);
    message[sizeof message - 1] = '\0';
    char out[200];
    size_t n = log_format_line(out, sizeof out, LOG_FORMAT_JSON, LOG_LEVEL_INFO, STAMP, message);
    assert_true(n < sizeof out);
    assert_int_equal(strlen(out), n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_json_fields_and_message),
        cmocka_unit_test(test_json_escapes),
        cmocka_unit_test(test_json_keeps_utf8_and_replaces_the_rest),
        cmocka_unit_test(test_json_never_overflows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
