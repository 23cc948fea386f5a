/*
 * test_queue_args.c: queue.declare / basic.consume / exchange.declare
 * arguments, checked against RabbitMQ 3.10.8.
 *
 * Goal: every accepted value parses to the right field, and every refused
 * one gives RabbitMQ's reply code and exact text; redeclare equivalence
 * compares the keys RabbitMQ compares, in its order, with its wording; field
 * values print as Erlang prints them.
 * Method: build argument tables with struct table_writer and compare with
 * the texts recorded from a live RabbitMQ node in
 * tests/integration/RABBITMQ-ARGS.md (queue names there were different;
 * here the queue is 'q' in vhost '/').
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "amqp/reply_code_gen.h"
#include "amqp/table.h"
#include "broker/queue_args.h"

/* ---- building tables ------------------------------------------------------ */

struct args {
    uint8_t buf[2048];
    struct table_writer w;
};

static struct table_writer *args_begin(struct args *a)
{
    table_writer_init(&a->w, a->buf, sizeof(a->buf));
    return &a->w;
}

static struct table args_table(const struct args *a)
{
    assert_false(a->w.overflow);
    return table_writer_table(&a->w);
}

static struct field_value int_value(uint8_t kind, int64_t n)
{
    struct field_value v;
    memset(&v, 0, sizeof(v));
    v.kind = kind;
    if (kind == 'B' || kind == 'u' || kind == 'i' || kind == 'T')
        v.u64 = (uint64_t)n;
    else
        v.i64 = n;
    return v;
}

static struct field_value str_value(uint8_t kind, const char *s)
{
    struct field_value v;
    memset(&v, 0, sizeof(v));
    v.kind = kind;
    v.str = bytes_of_cstr(s);
    return v;
}

static struct field_value double_value(double d)
{
    struct field_value v;
    memset(&v, 0, sizeof(v));
    v.kind = 'd';
    v.f64 = d;
    return v;
}

/* One value of each non-integer kind, as the probes sent them. */
static struct field_value other_value(uint8_t kind)
{
    static const uint8_t empty[1];
    struct field_value v;
    memset(&v, 0, sizeof(v));
    v.kind = kind;
    switch (kind) {
    case 'T': v.u64 = 5; break;
    case 'f': v.f32 = 1.5f; break;
    case 'd': v.f64 = 1.5; break;
    case 'D':
        v.decimal.scale = 1;
        v.decimal.value = 5;
        break;
    case 'S':
    case 'x': v.str = BYTES_LIT("5"); break;
    case 't': v.boolean = true; break;
    case 'F': v.table = (struct table){empty, 0}; break;
    case 'A': v.array = (struct bytes){empty, 0}; break;
    case 'V': break;
    default: fail();
    }
    return v;
}

static void put(struct table_writer *w, const char *key, struct field_value v)
{
    table_put_field(w, bytes_of_cstr(key), &v);
}

/* ---- running the parsers -------------------------------------------------- */

#define Q BYTES_LIT("q")
#define VHOST BYTES_LIT("/")

static char text[512];
static uint16_t code;

static bool parse(const struct args *a, struct queue_args *out)
{
    memset(text, 'X', sizeof(text));
    code = 0;
    return queue_args_parse(args_table(a), Q, VHOST, out, &code, text, sizeof(text));
}

static void expect_refused(const struct args *a, const char *expected)
{
    struct queue_args out;
    assert_false(parse(a, &out));
    assert_int_equal(code, REPLY_PRECONDITION_FAILED);
    assert_string_equal(text, expected);
}

/* One key with one value must be refused with `expected`. */
static void expect_one_refused(const char *key, struct field_value v, const char *expected)
{
    struct args a;
    put(args_begin(&a), key, v);
    expect_refused(&a, expected);
}

static struct queue_args expect_one_ok(const char *key, struct field_value v)
{
    struct args a;
    struct queue_args out;
    put(args_begin(&a), key, v);
    if (!parse(&a, &out))
        fail_msg("%s refused: %u %s", key, code, text);
    return out;
}

/* ---- queue.declare: accepted values -------------------------------------- */

static void test_defaults(void **state)
{
    (void)state;
    struct args a;
    struct queue_args out;
    args_begin(&a);
    assert_true(parse(&a, &out));
    assert_int_equal(out.message_ttl_ms, -1);
    assert_int_equal(out.expires_ms, -1);
    assert_int_equal(out.max_length, -1);
    assert_int_equal(out.max_length_bytes, -1);
    assert_int_equal(out.overflow, QUEUE_OVERFLOW_DROP_HEAD);
    assert_false(out.has_dead_letter_exchange);
    assert_false(out.has_dead_letter_routing_key);
    assert_int_equal(out.max_priority, 0);
    assert_false(out.single_active_consumer);
    assert_false(out.lazy);
    assert_int_equal(out.type, QUEUE_TYPE_CLASSIC);
    assert_int_equal(out.quay_backups, -1);
    assert_int_equal(out.quay_dedup_window_ms, -1);
}

static void test_all_valid(void **state)
{
    (void)state;
    struct args a;
    struct queue_args out;
    struct table_writer *w = args_begin(&a);
    put(w, "x-message-ttl", int_value('I', 0));
    put(w, "x-expires", int_value('l', 315360000000));
    put(w, "x-max-length", int_value('l', INT64_MAX));
    put(w, "x-max-length-bytes", int_value('i', 4294967295));
    put(w, "x-overflow", str_value('S', "reject-publish-dlx"));
    put(w, "x-dead-letter-exchange", str_value('S', "dlx"));
    put(w, "x-dead-letter-routing-key", str_value('S', "rk"));
    put(w, "x-max-priority", int_value('B', 255));
    put(w, "x-single-active-consumer", other_value('t'));
    put(w, "x-queue-mode", str_value('S', "lazy"));
    put(w, "x-queue-type", str_value('S', "classic"));
    put(w, "x-queue-master-locator", str_value('S', "min-masters"));
    put(w, "x-quay-backups", int_value('b', 3));
    put(w, "x-quay-dedup-window", int_value('I', 60000));
    put(w, "x-unknown", int_value('I', -1));
    put(w, "not-x", other_value('F'));
    assert_true(parse(&a, &out));
    assert_int_equal(out.message_ttl_ms, 0);
    assert_int_equal(out.expires_ms, 315360000000);
    assert_int_equal(out.max_length, INT64_MAX);
    assert_int_equal(out.max_length_bytes, 4294967295);
    assert_int_equal(out.overflow, QUEUE_OVERFLOW_REJECT_PUBLISH_DLX);
    assert_true(out.has_dead_letter_exchange);
    assert_true(bytes_equal_cstr(out.dead_letter_exchange, "dlx"));
    assert_true(out.has_dead_letter_routing_key);
    assert_true(bytes_equal_cstr(out.dead_letter_routing_key, "rk"));
    assert_int_equal(out.max_priority, 255);
    assert_true(out.single_active_consumer);
    assert_true(out.lazy);
    assert_int_equal(out.quay_backups, 3);
    assert_int_equal(out.quay_dedup_window_ms, 60000);
    assert_false(out.quay_replicate_transient);
}

/* x-quay-replicate: "all" (the default) or "transient", a longstr. */
static void test_quay_replicate(void **state)
{
    (void)state;
    assert_true(expect_one_ok("x-quay-replicate", str_value('S', "transient"))
                    .quay_replicate_transient);
    assert_false(expect_one_ok("x-quay-replicate", str_value('S', "all"))
                     .quay_replicate_transient);
    expect_one_refused("x-quay-replicate", str_value('S', "persistent"),
                       "invalid arg 'x-quay-replicate' for queue 'q' in vhost '/': "
                       "\"unsupported replication 'persistent'\"");
    expect_one_refused("x-quay-replicate", int_value('I', 1),
                       "invalid arg 'x-quay-replicate' for queue 'q' in vhost '/': "
                       "{unacceptable_type,signedint}");
}

/* Every integer kind is an integer (timestamp is not); empty DLX names,
 * "default" mode, the other overflow modes and locators are accepted. */
static void test_accepted_variants(void **state)
{
    (void)state;
    static const char kinds[] = "bBsuIil";
    for (const char *k = kinds; *k != '\0'; k++) {
        assert_int_equal(expect_one_ok("x-message-ttl", int_value((uint8_t)*k, 5)).message_ttl_ms,
                         5);
        assert_int_equal(expect_one_ok("x-max-priority", int_value((uint8_t)*k, 5)).max_priority,
                         5);
    }
    assert_int_equal(expect_one_ok("x-overflow", str_value('S', "drop-head")).overflow,
                     QUEUE_OVERFLOW_DROP_HEAD);
    assert_int_equal(expect_one_ok("x-overflow", str_value('S', "reject-publish")).overflow,
                     QUEUE_OVERFLOW_REJECT_PUBLISH);
    assert_false(expect_one_ok("x-queue-mode", str_value('S', "default")).lazy);
    assert_true(
        expect_one_ok("x-dead-letter-exchange", str_value('S', "")).has_dead_letter_exchange);
    assert_false(expect_one_ok("x-single-active-consumer", (struct field_value){.kind = 't'})
                     .single_active_consumer);
    assert_int_equal(expect_one_ok("x-max-length", int_value('I', 0)).max_length, 0);
    expect_one_ok("x-queue-master-locator", str_value('S', "client-local"));
    expect_one_ok("x-queue-master-locator", str_value('S', "random"));
    assert_int_equal(expect_one_ok("x-queue-type", str_value('S', "quorum")).type,
                     QUEUE_TYPE_QUORUM);
    assert_int_equal(expect_one_ok("x-queue-type", str_value('S', "stream")).type,
                     QUEUE_TYPE_STREAM);
    /* RabbitMQ 3.10 ignores keys it does not know, whatever their value. */
    expect_one_ok("x-ha-policy", int_value('I', -1));
    expect_one_ok("x-priority", str_value('S', "x"));
    expect_one_ok("x-message-ttl ", int_value('I', -1));
}

/* ---- queue.declare: refused values ---------------------------------------- */

static void test_integer_args_wrong_type(void **state)
{
    (void)state;
    static const char *const keys[] = {"x-message-ttl", "x-expires", "x-max-length",
                                       "x-max-length-bytes", "x-max-priority",
                                       "x-quay-backups", "x-quay-dedup-window"};
    static const char others[] = "TfdDSxtFAV";
    char expected[256];
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        for (const char *k = others; *k != '\0'; k++) {
            snprintf(expected, sizeof(expected),
                     "invalid arg '%s' for queue 'q' in vhost '/': \"expected integer, got %s\"",
                     keys[i], field_kind_name((uint8_t)*k));
            expect_one_refused(keys[i], other_value((uint8_t)*k), expected);
        }
    }
    expect_one_refused("x-message-ttl", str_value('S', "5"),
                       "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "
                       "\"expected integer, got longstr\"");
}

static void test_integer_ranges(void **state)
{
    (void)state;
    expect_one_refused("x-message-ttl", int_value('I', -1),
                       "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "
                       "{value_negative,-1}");
    expect_one_refused("x-message-ttl", int_value('l', INT64_MIN),
                       "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "
                       "{value_negative,-9223372036854775808}");
    expect_one_refused("x-message-ttl", int_value('l', 315360000001),
                       "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "
                       "{value_too_large,315360000001}");
    expect_one_refused("x-message-ttl", int_value('l', INT64_MAX),
                       "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "
                       "{value_too_large,9223372036854775807}");
    expect_one_refused("x-expires", int_value('I', 0),
                       "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}");
    expect_one_refused("x-expires", int_value('b', -1),
                       "invalid arg 'x-expires' for queue 'q' in vhost '/': "
                       "{value_negative,-1}");
    expect_one_refused("x-expires", int_value('l', 4611686018427387904),
                       "invalid arg 'x-expires' for queue 'q' in vhost '/': "
                       "{value_too_large,4611686018427387904}");
    expect_one_refused("x-max-length", int_value('l', -5),
                       "invalid arg 'x-max-length' for queue 'q' in vhost '/': "
                       "{value_negative,-5}");
    expect_one_refused("x-max-length-bytes", int_value('I', -1),
                       "invalid arg 'x-max-length-bytes' for queue 'q' in vhost '/': "
                       "{value_negative,-1}");
    expect_one_refused("x-max-priority", int_value('I', -1),
                       "invalid arg 'x-max-priority' for queue 'q' in vhost '/': "
                       "{value_negative,-1}");
    expect_one_refused("x-max-priority", int_value('I', 256),
                       "invalid arg 'x-max-priority' for queue 'q' in vhost '/': "
                       "{max_value_exceeded,256}");
    expect_one_refused("x-max-priority", int_value('i', 4294967295),
                       "invalid arg 'x-max-priority' for queue 'q' in vhost '/': "
                       "{max_value_exceeded,4294967295}");
    assert_int_equal(expect_one_ok("x-message-ttl", int_value('l', 4294967296)).message_ttl_ms,
                     4294967296);
}

static void test_string_and_bool_args(void **state)
{
    (void)state;
    expect_one_refused("x-overflow", str_value('S', "DROP-HEAD"),
                       "invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow");
    expect_one_refused("x-overflow", str_value('S', ""),
                       "invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow");
    expect_one_refused("x-overflow", int_value('I', 5),
                       "invalid arg 'x-overflow' for queue 'q' in vhost '/': "
                       "{unacceptable_type,signedint}");
    expect_one_refused("x-overflow", str_value('x', "drop-head"),
                       "invalid arg 'x-overflow' for queue 'q' in vhost '/': "
                       "{unacceptable_type,binary}");
    expect_one_refused("x-queue-mode", str_value('S', "LAZY"),
                       "invalid arg 'x-queue-mode' for queue 'q' in vhost '/': "
                       "\"unsupported queue mode 'LAZY'\"");
    expect_one_refused("x-queue-mode", str_value('S', ""),
                       "invalid arg 'x-queue-mode' for queue 'q' in vhost '/': "
                       "\"unsupported queue mode ''\"");
    expect_one_refused("x-queue-mode", str_value('S', "a\"b\\c\n\xc3\xa9"),
                       "invalid arg 'x-queue-mode' for queue 'q' in vhost '/': "
                       "\"unsupported queue mode 'a\\\"b\\\\c\\n\xc3\xa9'\"");
    expect_one_refused("x-queue-mode", str_value('S', "a\"b\x01"),
                       "invalid arg 'x-queue-mode' for queue 'q' in vhost '/': "
                       "[117,110,115,117,112,112,111,114,116,101,100,32,113,117,101,117,101,"
                       "32,109,111,100,101,32,39,97,34,98,1,39]");
    expect_one_refused("x-queue-mode", other_value('V'),
                       "invalid arg 'x-queue-mode' for queue 'q' in vhost '/': "
                       "{unacceptable_type,void}");
    expect_one_refused("x-queue-type", str_value('S', "Classic"),
                       "invalid arg 'x-queue-type' for queue 'q' in vhost '/': "
                       "\"unsupported queue type 'Classic'\"");
    expect_one_refused("x-queue-type", str_value('S', "\xc3\xa9\t"),
                       "invalid arg 'x-queue-type' for queue 'q' in vhost '/': "
                       "\"unsupported queue type '\xc3\xa9\\t'\"");
    expect_one_refused("x-queue-type", other_value('T'),
                       "invalid arg 'x-queue-type' for queue 'q' in vhost '/': "
                       "{unacceptable_type,timestamp}");
    expect_one_refused("x-single-active-consumer", str_value('S', "true"),
                       "invalid arg 'x-single-active-consumer' for queue 'q' in vhost '/': "
                       "{unacceptable_type,longstr}");
    expect_one_refused("x-single-active-consumer", int_value('b', 1),
                       "invalid arg 'x-single-active-consumer' for queue 'q' in vhost '/': "
                       "{unacceptable_type,byte}");
}

static void test_dead_letter_args(void **state)
{
    (void)state;
    expect_one_refused("x-dead-letter-exchange", int_value('I', 5),
                       "invalid type 'signedint' for arg 'x-dead-letter-exchange' in "
                       "queue 'q' in vhost '/'");
    expect_one_refused("x-dead-letter-exchange", str_value('x', "dlx"),
                       "invalid type 'binary' for arg 'x-dead-letter-exchange' in "
                       "queue 'q' in vhost '/'");
    expect_one_refused("x-dead-letter-routing-key", str_value('S', "rk"),
                       "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': "
                       "routing_key_but_no_dlx_defined");
    /* The type is checked before the missing exchange. */
    expect_one_refused("x-dead-letter-routing-key", int_value('I', 5),
                       "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': "
                       "{unacceptable_type,signedint}");

    struct args a;
    struct queue_args out;
    struct table_writer *w = args_begin(&a);
    put(w, "x-dead-letter-routing-key", str_value('S', ""));
    put(w, "x-dead-letter-exchange", str_value('S', ""));
    assert_true(parse(&a, &out));
    assert_true(out.has_dead_letter_exchange);
    assert_int_equal(out.dead_letter_exchange.len, 0);
    assert_true(out.has_dead_letter_routing_key);

    w = args_begin(&a);
    put(w, "x-dead-letter-routing-key", str_value('S', "rk"));
    put(w, "x-dead-letter-exchange", int_value('I', 1));
    expect_refused(&a, "invalid type 'signedint' for arg 'x-dead-letter-exchange' in "
                       "queue 'q' in vhost '/'");
}

/* RabbitMQ checks in its own order, not the table's. */
static void test_check_order(void **state)
{
    (void)state;
    struct args a;
    struct table_writer *w = args_begin(&a);
    put(w, "x-message-ttl", int_value('I', -1));
    put(w, "x-expires", int_value('I', -1));
    expect_refused(&a, "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_negative,-1}");

    w = args_begin(&a);
    put(w, "x-max-priority", int_value('I', -1));
    put(w, "x-overflow", str_value('S', "no"));
    put(w, "x-queue-mode", str_value('S', "no"));
    put(w, "x-single-active-consumer", int_value('I', 1));
    put(w, "x-max-length-bytes", int_value('I', -1));
    expect_refused(&a, "invalid arg 'x-max-length-bytes' for queue 'q' in vhost '/': "
                       "{value_negative,-1}");

    w = args_begin(&a);
    put(w, "x-queue-mode", str_value('S', "no"));
    put(w, "x-queue-type", str_value('S', "no"));
    expect_refused(&a, "invalid arg 'x-queue-type' for queue 'q' in vhost '/': "
                       "\"unsupported queue type 'no'\"");

    w = args_begin(&a);
    put(w, "x-dead-letter-routing-key", str_value('S', "rk"));
    put(w, "x-max-length", int_value('I', -1));
    expect_refused(&a, "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': "
                       "routing_key_but_no_dlx_defined");

    w = args_begin(&a);
    put(w, "x-queue-type", str_value('S', "no"));
    put(w, "x-dead-letter-exchange", int_value('I', 1));
    expect_refused(&a, "invalid type 'signedint' for arg 'x-dead-letter-exchange' in "
                       "queue 'q' in vhost '/'");

    /* Value checks come before the per-type check. */
    w = args_begin(&a);
    put(w, "x-max-age", int_value('I', 1));
    put(w, "x-message-ttl", int_value('I', -1));
    expect_refused(&a, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "
                       "{value_negative,-1}");
}

/* A repeated key counts at its first occurrence. */
static void test_duplicate_keys(void **state)
{
    (void)state;
    struct args a;
    struct queue_args out;
    struct table_writer *w = args_begin(&a);
    put(w, "x-message-ttl", int_value('I', 5));
    put(w, "x-message-ttl", str_value('S', "a"));
    assert_true(parse(&a, &out));
    assert_int_equal(out.message_ttl_ms, 5);

    w = args_begin(&a);
    put(w, "x-message-ttl", str_value('S', "a"));
    put(w, "x-message-ttl", int_value('I', 5));
    expect_refused(&a, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "
                       "\"expected integer, got longstr\"");
}

static void test_other_queue_types_args(void **state)
{
    (void)state;
    static const char *const keys[] = {
        "x-max-age", "x-quorum-initial-group-size", "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size", "x-queue-leader-locator", "x-delivery-limit",
        "x-dead-letter-strategy", "x-max-in-memory-length", "x-max-in-memory-bytes"};
    char expected[256];
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        snprintf(expected, sizeof(expected),
                 "invalid arg '%s' for queue 'q' in vhost '/' of queue type rabbit_classic_queue",
                 keys[i]);
        expect_one_refused(keys[i], int_value('I', -1), expected);
    }
    /* The first such key in the table is named. */
    struct args a;
    struct table_writer *w = args_begin(&a);
    put(w, "x-delivery-limit", int_value('I', 1));
    put(w, "x-max-age", int_value('I', 1));
    expect_refused(&a, "invalid arg 'x-delivery-limit' for queue 'q' in vhost '/' of queue "
                       "type rabbit_classic_queue");

    w = args_begin(&a);
    put(w, "x-queue-type", str_value('S', "quorum"));
    put(w, "x-max-priority", int_value('I', 5));
    expect_refused(&a, "invalid arg 'x-max-priority' for queue 'q' in vhost '/' of queue "
                       "type rabbit_quorum_queue");

    w = args_begin(&a);
    put(w, "x-queue-type", str_value('S', "quorum"));
    put(w, "x-delivery-limit", str_value('S', "a"));
    struct queue_args out;
    assert_true(parse(&a, &out));
}

static void test_master_locator_crash(void **state)
{
    (void)state;
    struct args a;
    struct queue_args out;
    put(args_begin(&a), "x-queue-master-locator", str_value('S', "balanced"));
    assert_false(parse(&a, &out));
    assert_int_equal(code, REPLY_INTERNAL_ERROR);
    assert_string_equal(text, "");
    put(args_begin(&a), "x-queue-master-locator", int_value('I', 1));
    assert_false(parse(&a, &out));
    assert_int_equal(code, REPLY_INTERNAL_ERROR);

    struct table_writer *w = args_begin(&a);
    put(w, "x-queue-master-locator", str_value('S', "bad"));
    put(w, "x-max-age", int_value('I', 1));
    expect_refused(&a, "invalid arg 'x-max-age' for queue 'q' in vhost '/' of queue type "
                       "rabbit_classic_queue");
}

static void test_quay_args(void **state)
{
    (void)state;
    assert_int_equal(expect_one_ok("x-quay-backups", int_value('I', 0)).quay_backups, 0);
    expect_one_refused("x-quay-backups", int_value('I', 4),
                       "invalid arg 'x-quay-backups' for queue 'q' in vhost '/': "
                       "{max_value_exceeded,4}");
    expect_one_refused("x-quay-backups", int_value('I', -1),
                       "invalid arg 'x-quay-backups' for queue 'q' in vhost '/': "
                       "{value_negative,-1}");
    assert_int_equal(expect_one_ok("x-quay-dedup-window", int_value('I', 0)).quay_dedup_window_ms,
                     0);
    expect_one_refused("x-quay-dedup-window", int_value('l', -7),
                       "invalid arg 'x-quay-dedup-window' for queue 'q' in vhost '/': "
                       "{value_negative,-7}");
}

static void test_text_truncated(void **state)
{
    (void)state;
    struct args a;
    struct queue_args out;
    char small[16];
    put(args_begin(&a), "x-message-ttl", int_value('I', -1));
    assert_false(queue_args_parse(args_table(&a), Q, VHOST, &out, &code, small, sizeof(small)));
    assert_string_equal(small, "invalid arg 'x-");
}

/* ---- equivalence ------------------------------------------------------------ */

static void expect_equivalent(const struct args *cur, const struct args *rec)
{
    code = 0;
    if (!queue_args_equivalent(args_table(cur), args_table(rec), Q, VHOST, &code, text,
                               sizeof(text)))
        fail_msg("not equivalent: %s", text);
}

static void expect_inequivalent(const struct args *cur, const struct args *rec,
                                const char *expected)
{
    code = 0;
    assert_false(queue_args_equivalent(args_table(cur), args_table(rec), Q, VHOST, &code,
                                       text, sizeof(text)));
    assert_int_equal(code, REPLY_PRECONDITION_FAILED);
    assert_string_equal(text, expected);
}

/* current {key: c} (or nothing if c.kind == 0) against received {key: r}. */
static void check_pair(const char *key, struct field_value c, struct field_value r,
                       const char *expected)
{
    struct args cur, rec;
    struct table_writer *w = args_begin(&cur);
    if (c.kind != 0)
        put(w, key, c);
    w = args_begin(&rec);
    if (r.kind != 0)
        put(w, key, r);
    if (expected == NULL)
        expect_equivalent(&cur, &rec);
    else
        expect_inequivalent(&cur, &rec, expected);
}

static const struct field_value none;

static void test_equivalence_values(void **state)
{
    (void)state;
    const char *ttl = "x-message-ttl";
    check_pair(ttl, int_value('I', 1000), int_value('I', 2000),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received '2000' but current is '1000'");
    check_pair(ttl, int_value('I', 1000), int_value('l', 1000), NULL);
    check_pair(ttl, int_value('I', 1000), int_value('T', 1000), NULL);
    check_pair(ttl, int_value('I', 1000), int_value('b', 100),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received '100' but current is '1000'");
    check_pair(ttl, int_value('I', 1000), str_value('S', "1000"),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received '1000' but current is '1000'");
    check_pair(ttl, int_value('I', 1000), double_value(1000.0),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received '1.0e3' but current is '1000'");
    check_pair(ttl, int_value('I', 1), double_value(1.5),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received '1.5' but current is '1'");
    check_pair(ttl, int_value('I', 1), other_value('t'),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received 'true' but current is '1'");
    check_pair(ttl, int_value('I', 1), other_value('F'),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received '[]' but current is '1'");
    check_pair(ttl, int_value('I', 1), other_value('V'),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received none but current is '1'");
    check_pair(ttl, int_value('I', 1000), none,
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received none but current is the value '1000' of type 'signedint'");
    check_pair(ttl, none, int_value('I', 1000),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received the value '1000' of type 'signedint' but current is none");
    check_pair(ttl, none, int_value('l', -5),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received the value '-5' of type 'long' but current is none");
    check_pair(ttl, none, str_value('S', "abc"),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received the value 'abc' of type 'longstr' but current is none");
    check_pair(ttl, none, other_value('V'),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received the value 'undefined' of type 'void' but current is none");
    check_pair(ttl, none, other_value('D'),
               "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
               "received the value '{1,5}' of type 'decimal' but current is none");
    check_pair("x-overflow", str_value('S', "drop-head"), str_value('x', "drop-head"), NULL);
    check_pair("x-overflow", str_value('S', "drop-head"), str_value('S', "reject-publish"),
               "inequivalent arg 'x-overflow' for queue 'q' in vhost '/': "
               "received 'reject-publish' but current is 'drop-head'");
    check_pair("x-single-active-consumer", other_value('t'), int_value('I', 1),
               "inequivalent arg 'x-single-active-consumer' for queue 'q' in vhost '/': "
               "received '1' but current is 'true'");
    check_pair("x-single-active-consumer", other_value('t'), (struct field_value){.kind = 't'},
               "inequivalent arg 'x-single-active-consumer' for queue 'q' in vhost '/': "
               "received 'false' but current is 'true'");
    check_pair("x-dead-letter-routing-key", str_value('S', "r1"), none,
               "inequivalent arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': "
               "received none but current is the value 'r1' of type 'longstr'");
    check_pair("x-queue-master-locator", str_value('S', "random"), str_value('S', "min-masters"),
               "inequivalent arg 'x-queue-master-locator' for queue 'q' in vhost '/': "
               "received 'min-masters' but current is 'random'");
    check_pair("x-quay-backups", int_value('I', 1), int_value('I', 2),
               "inequivalent arg 'x-quay-backups' for queue 'q' in vhost '/': "
               "received '2' but current is '1'");
    check_pair("x-quay-dedup-window", none, int_value('I', 10),
               "inequivalent arg 'x-quay-dedup-window' for queue 'q' in vhost '/': "
               "received the value '10' of type 'signedint' but current is none");
    /* Not compared: unknown keys, and other queue types' keys. */
    check_pair("x-foo", str_value('S', "a"), str_value('S', "b"), NULL);
    check_pair("x-max-age", none, str_value('S', "1D"), NULL);
}

static void test_equivalence_decimal_crash(void **state)
{
    (void)state;
    struct args cur, rec;
    put(args_begin(&cur), "x-max-priority", int_value('I', 1));
    put(args_begin(&rec), "x-max-priority", other_value('D'));
    assert_false(queue_args_equivalent(args_table(&cur), args_table(&rec), Q, VHOST, &code,
                                       text, sizeof(text)));
    assert_int_equal(code, REPLY_INTERNAL_ERROR);
    assert_string_equal(text, "");
}

static void test_equivalence_queue_type(void **state)
{
    (void)state;
    const char *key = "x-queue-type";
    check_pair(key, none, str_value('S', "classic"), NULL);
    check_pair(key, str_value('S', "classic"), none, NULL);
    check_pair(key, str_value('S', "classic"), str_value('x', "classic"), NULL);
    check_pair(key, none, str_value('x', "classic"),
               "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
               "received the value 'classic' of type 'binary' but current is none");
    check_pair(key, none, str_value('S', "quorum"),
               "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
               "received the value 'quorum' of type 'longstr' but current is none");
    check_pair(key, str_value('S', "classic"), str_value('S', "stream"),
               "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
               "received 'stream' but current is 'classic'");
    check_pair(key, str_value('S', "classic"), other_value('V'),
               "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
               "received none but current is 'classic'");
}

/* Keys are compared in RabbitMQ's order, not the table's. */
static void test_equivalence_order(void **state)
{
    (void)state;
    static const char *const order[] = {
        "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
        "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
        "x-single-active-consumer", "x-queue-type", "x-queue-master-locator",
        "x-quay-backups", "x-quay-dedup-window"};
    size_t count = sizeof(order) / sizeof(order[0]);
    char expected[256];
    for (size_t first = 0; first < count; first++) {
        struct args cur, rec;
        args_begin(&cur);
        struct table_writer *w = args_begin(&rec);
        for (size_t i = count; i-- > first;)
            put(w, order[i], int_value('I', 99));
        snprintf(expected, sizeof(expected),
                 "inequivalent arg '%s' for queue 'q' in vhost '/': received the value '99' "
                 "of type 'signedint' but current is none",
                 order[first]);
        if (strcmp(order[first], "x-queue-type") == 0)
            continue; /* compared the same way, covered above */
        expect_inequivalent(&cur, &rec, expected);
    }
}

/* ---- basic.consume and exchange.declare ---------------------------------- */

static void test_consumer_args(void **state)
{
    (void)state;
    struct args a;
    int64_t priority = -99;
    args_begin(&a);
    assert_true(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                    sizeof(text)));
    assert_int_equal(priority, 0);

    static const char kinds[] = "bBsuIil";
    for (const char *k = kinds; *k != '\0'; k++) {
        put(args_begin(&a), "x-priority", int_value((uint8_t)*k, 7));
        assert_true(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                        sizeof(text)));
        assert_int_equal(priority, 7);
    }
    put(args_begin(&a), "x-priority", int_value('l', 4611686018427387904));
    assert_true(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                    sizeof(text)));
    assert_int_equal(priority, 4611686018427387904);

    put(args_begin(&a), "x-priority", other_value('T'));
    assert_false(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                     sizeof(text)));
    assert_int_equal(code, REPLY_PRECONDITION_FAILED);
    assert_string_equal(text, "invalid arg 'x-priority' for queue 'q' in vhost '/': "
                              "\"expected integer, got timestamp\"");

    struct table_writer *w = args_begin(&a);
    put(w, "x-cancel-on-ha-failover", str_value('S', "x"));
    put(w, "x-priority", str_value('S', "x"));
    assert_false(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                     sizeof(text)));
    assert_string_equal(text, "invalid arg 'x-priority' for queue 'q' in vhost '/': "
                              "\"expected integer, got longstr\"");

    w = args_begin(&a);
    put(w, "x-stream-offset", int_value('I', 1));
    put(w, "x-cancel-on-ha-failover", int_value('I', 1));
    assert_false(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                     sizeof(text)));
    assert_string_equal(text, "invalid arg 'x-cancel-on-ha-failover' for queue 'q' in "
                              "vhost '/': {unacceptable_type,signedint}");

    w = args_begin(&a);
    put(w, "x-stream-offset", int_value('I', 1));
    put(w, "x-credit", int_value('I', 1));
    assert_false(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                     sizeof(text)));
    assert_string_equal(text, "invalid arg 'x-stream-offset' for queue 'q' in vhost '/' of "
                              "queue type rabbit_classic_queue");

    put(args_begin(&a), "x-credit", str_value('S', "x"));
    assert_false(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                     sizeof(text)));
    assert_int_equal(code, REPLY_INTERNAL_ERROR);
    put(args_begin(&a), "x-credit", other_value('F'));
    assert_true(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                    sizeof(text)));
    put(args_begin(&a), "x-foo", other_value('V'));
    assert_true(consumer_args_parse(args_table(&a), Q, VHOST, &priority, &code, text,
                                    sizeof(text)));
}

static void test_exchange_args(void **state)
{
    (void)state;
    struct args a;
    bool has = true;
    struct bytes alternate;
    const struct bytes x = BYTES_LIT("xa");
    args_begin(&a);
    assert_true(exchange_args_parse(args_table(&a), x, VHOST, &has, &alternate, &code, text,
                                    sizeof(text)));
    assert_false(has);

    put(args_begin(&a), "alternate-exchange", str_value('S', ""));
    assert_true(exchange_args_parse(args_table(&a), x, VHOST, &has, &alternate, &code, text,
                                    sizeof(text)));
    assert_true(has);
    assert_int_equal(alternate.len, 0);

    static const char kinds[] = "xIltFAVdT";
    char expected[256];
    for (const char *k = kinds; *k != '\0'; k++) {
        struct field_value v = *k == 'x'   ? str_value('x', "ae")
                               : *k == 'I' || *k == 'l' ? int_value((uint8_t)*k, 1)
                                                        : other_value((uint8_t)*k);
        put(args_begin(&a), "alternate-exchange", v);
        assert_false(exchange_args_parse(args_table(&a), x, VHOST, &has, &alternate, &code,
                                         text, sizeof(text)));
        assert_int_equal(code, REPLY_PRECONDITION_FAILED);
        snprintf(expected, sizeof(expected),
                 "invalid type '%s' for arg 'alternate-exchange' in exchange 'xa' in vhost '/'",
                 field_kind_name((uint8_t)*k));
        assert_string_equal(text, expected);
    }
    put(args_begin(&a), "x-alternate-exchange", int_value('I', 1));
    assert_true(exchange_args_parse(args_table(&a), x, VHOST, &has, &alternate, &code, text,
                                    sizeof(text)));

    struct args cur, rec;
    put(args_begin(&cur), "alternate-exchange", str_value('S', "a"));
    put(args_begin(&rec), "alternate-exchange", str_value('S', "b"));
    assert_false(exchange_args_equivalent(args_table(&cur), args_table(&rec), x, VHOST, &code,
                                          text, sizeof(text)));
    assert_string_equal(text, "inequivalent arg 'alternate-exchange' for exchange 'xa' in "
                              "vhost '/': received 'b' but current is 'a'");
    args_begin(&rec);
    assert_false(exchange_args_equivalent(args_table(&cur), args_table(&rec), x, VHOST, &code,
                                          text, sizeof(text)));
    assert_string_equal(text, "inequivalent arg 'alternate-exchange' for exchange 'xa' in "
                              "vhost '/': received none but current is the value 'a' of "
                              "type 'longstr'");
    put(args_begin(&rec), "alternate-exchange", str_value('x', "a"));
    assert_true(exchange_args_equivalent(args_table(&cur), args_table(&rec), x, VHOST, &code,
                                         text, sizeof(text)));
}

/* ---- formatting -------------------------------------------------------------- */

static void expect_format(struct field_value v, const char *expected)
{
    char out[256];
    size_t n = field_value_format(&v, out, sizeof(out));
    assert_string_equal(out, expected);
    assert_int_equal(n, strlen(expected));
}

/* Expected strings are Erlang/OTP 25's io_lib:format("~p", [F]). */
static void test_format_floats(void **state)
{
    (void)state;
    static const struct {
        double d;
        const char *text;
    } cases[] = {
        {1000.0, "1.0e3"}, {100.0, "100.0"}, {10.0, "10.0"}, {0.1, "0.1"},
        {1e-5, "1.0e-5"}, {123456.0, "123456.0"}, {1e21, "1.0e21"}, {0.001, "0.001"},
        {0.0001, "0.0001"}, {12345.678, "12345.678"}, {-0.0, "-0.0"}, {0.0, "0.0"},
        {2.5e-10, "2.5e-10"}, {1234567.0, "1234567.0"},
        {1.7976931348623157e308, "1.7976931348623157e308"}, {5e-324, "5.0e-324"},
        {3.14159, "3.14159"}, {1e15, "1.0e15"}, {123456789012345680.0, "1.2345678901234568e17"},
        {99999.0, "99999.0"}, {999999.0, "999999.0"}, {1234.5, "1234.5"}, {0.01, "0.01"},
        {120.0, "120.0"}, {1200.0, "1.2e3"}, {12000.0, "1.2e4"}, {0.012, "0.012"},
        {0.0012, "0.0012"}, {-1000.0, "-1.0e3"}, {1.0, "1.0"}, {1.5, "1.5"}, {3.4e38, "3.4e38"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        expect_format(double_value(cases[i].d), cases[i].text);
    struct field_value f = {.kind = 'f', .f32 = 0.1f};
    expect_format(f, "0.10000000149011612");
}

static void test_format_terms(void **state)
{
    (void)state;
    expect_format(int_value('I', 1000), "1000");
    expect_format(int_value('l', INT64_MIN), "-9223372036854775808");
    expect_format(int_value('T', 1700000000), "1700000000");
    expect_format(int_value('i', 4294967295), "4294967295");
    expect_format(str_value('S', "it's \"q\""), "it's \"q\"");
    expect_format(str_value('x', "\x01\xff"), "\x01\xff");
    expect_format(other_value('t'), "true");
    expect_format(other_value('V'), "undefined");
    expect_format(other_value('D'), "{1,5}");
    expect_format(other_value('F'), "[]");
    expect_format(other_value('A'), "[]");

    struct args a;
    struct table_writer *w = args_begin(&a);
    size_t t = table_put_table_begin(w, "v");
    put(w, "a", str_value('S', "b"));
    put(w, "n", int_value('I', 1));
    table_put_table_end(w, t);
    size_t arr = table_put_array_begin(w, "w");
    struct field_value e = str_value('S', "a");
    table_array_put_field(w, &e);
    e = int_value('I', 1);
    table_array_put_field(w, &e);
    size_t inner = table_array_put_table_begin(w);
    put(w, "a", int_value('b', -1));
    table_put_table_end(w, inner);
    e = str_value('x', "a\"b\\c\n\x01");
    table_array_put_field(w, &e);
    e = str_value('x', "\xe9");
    table_array_put_field(w, &e);
    e = str_value('S', "\t");
    table_array_put_field(w, &e);
    e = str_value('x', "");
    table_array_put_field(w, &e);
    e = other_value('V');
    table_array_put_field(w, &e);
    table_put_array_end(w, arr);

    struct field_value v;
    assert_true(table_get(args_table(&a), "v", &v));
    expect_format(v, "[{<<\"a\">>,longstr,<<\"b\">>},{<<\"n\">>,signedint,1}]");
    assert_true(table_get(args_table(&a), "w", &v));
    expect_format(v, "[{longstr,<<\"a\">>},{signedint,1},{table,[{<<\"a\">>,byte,-1}]},"
                     "{binary,<<97,34,98,92,99,10,1>>},{binary,<<\"\xe9\">>},"
                     "{longstr,<<\"\\t\">>},{binary,<<>>},{void,undefined}]");
}

static void test_kind_names(void **state)
{
    (void)state;
    static const char *const names[] = {
        "t", "bool", "b", "byte", "B", "unsignedbyte", "s", "short", "u", "unsignedshort",
        "I", "signedint", "i", "unsignedint", "l", "long", "f", "float", "d", "double",
        "D", "decimal", "S", "longstr", "x", "binary", "A", "array", "T", "timestamp",
        "F", "table", "V", "void"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i += 2)
        assert_string_equal(field_kind_name((uint8_t)names[i][0]), names[i + 1]);
}

/* Nested values compare by type and value; [] as a table equals [] as an
 * array. */
static void test_equivalence_nested(void **state)
{
    (void)state;
    struct args cur, rec;
    struct table_writer *w = args_begin(&cur);
    size_t t = table_put_table_begin(w, "x-message-ttl");
    put(w, "a", int_value('I', 1));
    table_put_table_end(w, t);
    w = args_begin(&rec);
    t = table_put_table_begin(w, "x-message-ttl");
    put(w, "a", int_value('I', 1));
    table_put_table_end(w, t);
    expect_equivalent(&cur, &rec);
    w = args_begin(&rec);
    t = table_put_table_begin(w, "x-message-ttl");
    put(w, "a", int_value('l', 1));
    table_put_table_end(w, t);
    expect_inequivalent(&cur, &rec, "inequivalent arg 'x-message-ttl' for queue 'q' in "
                                    "vhost '/': received '[{<<\"a\">>,long,1}]' but current "
                                    "is '[{<<\"a\">>,signedint,1}]'");
    put(args_begin(&cur), "x-message-ttl", other_value('F'));
    put(args_begin(&rec), "x-message-ttl", other_value('A'));
    expect_equivalent(&cur, &rec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_all_valid),
        cmocka_unit_test(test_accepted_variants),
        cmocka_unit_test(test_quay_replicate),
        cmocka_unit_test(test_integer_args_wrong_type),
        cmocka_unit_test(test_integer_ranges),
        cmocka_unit_test(test_string_and_bool_args),
        cmocka_unit_test(test_dead_letter_args),
        cmocka_unit_test(test_check_order),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_other_queue_types_args),
        cmocka_unit_test(test_master_locator_crash),
        cmocka_unit_test(test_quay_args),
        cmocka_unit_test(test_text_truncated),
        cmocka_unit_test(test_equivalence_values),
        cmocka_unit_test(test_equivalence_decimal_crash),
        cmocka_unit_test(test_equivalence_queue_type),
        cmocka_unit_test(test_equivalence_order),
        cmocka_unit_test(test_equivalence_nested),
        cmocka_unit_test(test_consumer_args),
        cmocka_unit_test(test_exchange_args),
        cmocka_unit_test(test_format_floats),
        cmocka_unit_test(test_format_terms),
        cmocka_unit_test(test_kind_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
