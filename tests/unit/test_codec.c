/*
 * test_codec.c: the generated method and content-property codec.
 *
 * Goal: every method in the protocol table round-trips, bit packing matches
 * the spec byte for byte, and malformed input is rejected with the error
 * the spec's reply code needs (E_SYNTAX 502, E_UNKNOWN_METHOD 540).
 * Method: a reflection-driven test fills every field of every method with
 * distinct sample values (via METHOD_INFOS), encodes, decodes, compares,
 * and also decodes every truncation and a trailing byte; hand-written
 * vectors pin the wire layout of a few methods independently of the
 * generator.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "amqp/method_gen.h"
#include "amqp/reply_code_gen.h"
#include "amqp/table.h"
#include "lib/errors.h"

/* A small valid field table: {"k": S "v"} */
static const uint8_t SAMPLE_TABLE[] = {1, 'k', 'S', 0, 0, 0, 1, 'v'};
static const char *const SAMPLE_STRINGS[] = {"alpha", "", "routing.key.#", "x"};

/* Fills every field of m (id already set) with a value derived from seed. */
static void fill_sample(struct method *m, const struct method_info *info, unsigned seed)
{
    for (uint8_t i = 0; i < info->field_count; i++) {
        const struct method_field *f = &info->fields[i];
        uint8_t *p = (uint8_t *)m + f->offset;
        unsigned v = seed * 31u + i * 7u + 1u;
        switch (f->type) {
        case METHOD_FIELD_OCTET: *p = (uint8_t)v; break;
        case METHOD_FIELD_SHORT: {
            uint16_t x = (uint16_t)(v * 257u);
            memcpy(p, &x, sizeof(x));
            break;
        }
        case METHOD_FIELD_LONG: {
            uint32_t x = v * 16777619u;
            memcpy(p, &x, sizeof(x));
            break;
        }
        case METHOD_FIELD_LONGLONG:
        case METHOD_FIELD_TIMESTAMP: {
            uint64_t x = (uint64_t)v * 0x9E3779B97F4A7C15ull;
            memcpy(p, &x, sizeof(x));
            break;
        }
        case METHOD_FIELD_BIT: {
            bool x = ((v + seed) & 1u) != 0;
            memcpy(p, &x, sizeof(x));
            break;
        }
        case METHOD_FIELD_SHORTSTR:
        case METHOD_FIELD_LONGSTR: {
            size_t count = sizeof(SAMPLE_STRINGS) / sizeof(SAMPLE_STRINGS[0]);
            struct bytes x = bytes_of_cstr(SAMPLE_STRINGS[v % count]);
            memcpy(p, &x, sizeof(x));
            break;
        }
        case METHOD_FIELD_TABLE: {
            struct table x = {SAMPLE_TABLE, (seed & 1u) ? (uint32_t)sizeof(SAMPLE_TABLE) : 0};
            memcpy(p, &x, sizeof(x));
            break;
        }
        default: fail_msg("unknown field type %u", f->type);
        }
    }
}

static void test_all_methods_round_trip(void **state)
{
    (void)state;
    for (size_t k = 0; k < METHOD_COUNT; k++) {
        const struct method_info *info = &METHOD_INFOS[k];
        for (unsigned seed = 0; seed < 4; seed++) {
            struct method m;
            memset(&m, 0, sizeof(m));
            m.id = info->id;
            fill_sample(&m, info, seed);

            uint8_t buf[1024];
            size_t n = method_encode(&m, buf, sizeof(buf));
            assert_true(n >= 4);
            struct method d;
            assert_int_equal(method_decode(&d, buf, (uint32_t)n), OK);
            assert_true(method_equal(&m, &d));

            /* Re-encoding the decoded method gives the same bytes. */
            uint8_t again[1024];
            assert_int_equal(method_encode(&d, again, sizeof(again)), n);
            assert_memory_equal(buf, again, n);

            /* Every cap below n reports "does not fit". */
            for (size_t cap = 0; cap < n; cap++)
                assert_int_equal(method_encode(&m, again, cap), 0);

            /* Every truncation is a syntax error, and so is a trailing byte. */
            for (size_t cut = 0; cut < n; cut++)
                assert_int_equal(method_decode(&d, buf, (uint32_t)cut), E_SYNTAX);
            buf[n] = 0;
            assert_int_equal(method_decode(&d, buf, (uint32_t)n + 1), E_SYNTAX);
        }
    }
}

static void test_connection_tune_bytes(void **state)
{
    (void)state;
    static const uint8_t want[] = {0x00, 0x0A, 0x00, 0x1E, 0x07, 0xFF, 0x00,
                                   0x02, 0x00, 0x00, 0x00, 0x3C};
    struct method m = {.id = METHOD_CONNECTION_TUNE};
    m.connection_tune.channel_max = 2047;
    m.connection_tune.frame_max = 131072;
    m.connection_tune.heartbeat = 60;
    uint8_t buf[64];
    assert_int_equal(method_encode(&m, buf, sizeof(buf)), sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));

    struct method d;
    assert_int_equal(method_decode(&d, want, sizeof(want)), OK);
    assert_int_equal(d.id, METHOD_CONNECTION_TUNE);
    assert_int_equal(d.connection_tune.channel_max, 2047);
    assert_int_equal(d.connection_tune.frame_max, 131072);
    assert_int_equal(d.connection_tune.heartbeat, 60);
}

static void test_basic_publish_bytes(void **state)
{
    (void)state;
    static const uint8_t want[] = {0x00, 0x3C, 0x00, 0x28, 0x00, 0x00, 3, 'e', 'x', 'c',
                                   2,    'r',  'k',  0x02};
    struct method d;
    assert_int_equal(method_decode(&d, want, sizeof(want)), OK);
    assert_int_equal(d.id, METHOD_BASIC_PUBLISH);
    assert_true(bytes_equal_cstr(d.basic_publish.exchange, "exc"));
    assert_true(bytes_equal_cstr(d.basic_publish.routing_key, "rk"));
    assert_false(d.basic_publish.mandatory);
    assert_true(d.basic_publish.immediate);
    /* Zero-copy: strings point into the payload. */
    assert_ptr_equal(d.basic_publish.exchange.ptr, want + 7);

    uint8_t buf[64];
    assert_int_equal(method_encode(&d, buf, sizeof(buf)), sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));
    assert_true(method_has_content(METHOD_BASIC_PUBLISH));
    assert_false(method_is_synchronous(METHOD_BASIC_PUBLISH));
}

/* queue.declare packs its five bits into one octet, low bit first. */
static void test_queue_declare_bits(void **state)
{
    (void)state;
    struct method m = {.id = METHOD_QUEUE_DECLARE};
    m.queue_declare.queue = BYTES_LIT("q");
    m.queue_declare.durable = true;
    m.queue_declare.auto_delete = true;
    m.queue_declare.no_wait = true;
    static const uint8_t want[] = {0, 50, 0, 10, 0, 0, 1, 'q', 0x1A, 0, 0, 0, 0};
    uint8_t buf[64];
    assert_int_equal(method_encode(&m, buf, sizeof(buf)), sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));

    struct method d;
    assert_int_equal(method_decode(&d, want, sizeof(want)), OK);
    assert_false(d.queue_declare.passive);
    assert_true(d.queue_declare.durable);
    assert_false(d.queue_declare.exclusive);
    assert_true(d.queue_declare.auto_delete);
    assert_true(d.queue_declare.no_wait);

    /* One octet per bit would leave trailing/garbled bytes: rejected. */
    static const uint8_t unpacked[] = {0, 50, 0, 10, 0, 0, 1, 'q', 0, 1, 0, 1, 1, 0, 0, 0, 0};
    assert_int_equal(method_decode(&d, unpacked, sizeof(unpacked)), E_SYNTAX);
}

static void test_exchange_declare_and_consume_bits(void **state)
{
    (void)state;
    /* exchange.declare: passive durable auto-delete internal no-wait */
    static const uint8_t ex[] = {0, 40, 0, 10, 0, 0, 1, 'e', 5, 't', 'o', 'p', 'i', 'c',
                                 0x1E, 0, 0, 0, 0};
    struct method d;
    assert_int_equal(method_decode(&d, ex, sizeof(ex)), OK);
    assert_true(bytes_equal_cstr(d.exchange_declare.type, "topic"));
    assert_false(d.exchange_declare.passive);
    assert_true(d.exchange_declare.durable);
    assert_true(d.exchange_declare.auto_delete);
    assert_true(d.exchange_declare.internal);
    assert_true(d.exchange_declare.no_wait);

    /* basic.consume: no-local no-ack exclusive no-wait */
    static const uint8_t co[] = {0, 60, 0, 20, 0, 0, 1, 'q', 2, 'c', 't', 0x05, 0, 0, 0, 0};
    assert_int_equal(method_decode(&d, co, sizeof(co)), OK);
    assert_true(d.basic_consume.no_local);
    assert_false(d.basic_consume.no_ack);
    assert_true(d.basic_consume.exclusive);
    assert_false(d.basic_consume.no_wait);

    /* Unused high bits are ignored (RabbitMQ does the same), and re-encode clean. */
    static const uint8_t noisy[] = {0, 60, 0, 20, 0, 0, 1, 'q', 2, 'c', 't', 0xF5, 0, 0, 0, 0};
    assert_int_equal(method_decode(&d, noisy, sizeof(noisy)), OK);
    uint8_t buf[64];
    assert_int_equal(method_encode(&d, buf, sizeof(buf)), sizeof(co));
    assert_memory_equal(buf, co, sizeof(co));
}

/* basic.nack: a longlong followed by two bits in one octet. */
static void test_basic_nack_bits(void **state)
{
    (void)state;
    static const uint8_t want[] = {0, 60, 0, 120, 0, 0, 0, 0, 0, 0, 0, 42, 0x02};
    struct method d;
    assert_int_equal(method_decode(&d, want, sizeof(want)), OK);
    assert_int_equal(d.id, METHOD_BASIC_NACK);
    assert_int_equal(d.basic_nack.delivery_tag, 42);
    assert_false(d.basic_nack.multiple);
    assert_true(d.basic_nack.requeue);
}

static void test_errors(void **state)
{
    (void)state;
    struct method d;
    static const uint8_t unknown_method[] = {0, 10, 0, 99};
    assert_int_equal(method_decode(&d, unknown_method, sizeof(unknown_method)),
                     E_UNKNOWN_METHOD);
    static const uint8_t unknown_class[] = {0, 99, 0, 10, 1, 2, 3};
    assert_int_equal(method_decode(&d, unknown_class, sizeof(unknown_class)),
                     E_UNKNOWN_METHOD);
    static const uint8_t access_request[] = {0, 30, 0, 10, 0};
    assert_int_equal(method_decode(&d, access_request, sizeof(access_request)),
                     E_UNKNOWN_METHOD);
    static const uint8_t short_ids[] = {0, 10, 0};
    assert_int_equal(method_decode(&d, short_ids, sizeof(short_ids)), E_SYNTAX);
    assert_int_equal(method_decode(&d, NULL, 0), E_SYNTAX);

    /* queue.declare with a table that claims a bad type letter. */
    static const uint8_t bad_table[] = {0, 50, 0, 10, 0, 0, 1, 'q', 0, 0, 0, 0, 3, 1, 'k', 'Z'};
    assert_int_equal(method_decode(&d, bad_table, sizeof(bad_table)), E_SYNTAX);
    /* A table length past the payload. */
    static const uint8_t long_table[] = {0, 50, 0, 10, 0, 0, 1, 'q', 0, 0, 0, 0, 9, 1, 'k'};
    assert_int_equal(method_decode(&d, long_table, sizeof(long_table)), E_SYNTAX);
    /* A shortstr length past the payload. */
    static const uint8_t long_str[] = {0, 60, 0, 40, 0, 0, 200, 'x'};
    assert_int_equal(method_decode(&d, long_str, sizeof(long_str)), E_SYNTAX);
}

static void test_method_metadata(void **state)
{
    (void)state;
    assert_int_equal(METHOD_BASIC_PUBLISH, 0x003C0028);
    assert_int_equal(METHOD_CLASS_ID(METHOD_BASIC_PUBLISH), 60);
    assert_int_equal(METHOD_METHOD_ID(METHOD_BASIC_PUBLISH), 40);
    assert_string_equal(method_name(METHOD_BASIC_PUBLISH), "basic.publish");
    assert_string_equal(method_name(METHOD_CONFIRM_SELECT_OK), "confirm.select-ok");
    assert_string_equal(method_name(METHOD_EXCHANGE_UNBIND_OK), "exchange.unbind-ok");
    assert_int_equal(METHOD_EXCHANGE_UNBIND_OK, 0x00280033);
    assert_int_equal(METHOD_CONNECTION_UPDATE_SECRET_OK, 0x000A0047);
    assert_null(method_name(0x000A0063));
    assert_true(method_is_synchronous(METHOD_QUEUE_DECLARE));
    assert_false(method_is_synchronous(METHOD_QUEUE_DECLARE_OK));
    assert_true(method_is_synchronous(METHOD_BASIC_GET));
    assert_true(method_has_content(METHOD_BASIC_GET_OK));
    assert_true(method_has_content(METHOD_BASIC_DELIVER));
    assert_true(method_has_content(METHOD_BASIC_RETURN));
    assert_false(method_has_content(METHOD_BASIC_GET_EMPTY));
    assert_true(method_class_known(CLASS_CONFIRM));
    assert_true(method_class_known(CLASS_TX));
    assert_false(method_class_known(30));
    assert_false(method_class_known(0));
    for (size_t i = 1; i < METHOD_COUNT; i++)
        assert_true(METHOD_INFOS[i - 1].id < METHOD_INFOS[i].id);
}

static void test_reply_codes(void **state)
{
    (void)state;
    assert_false(reply_code_is_hard(REPLY_SUCCESS));
    assert_false(reply_code_is_hard(REPLY_NOT_FOUND));
    assert_false(reply_code_is_hard(REPLY_NO_ROUTE));
    assert_false(reply_code_is_hard(REPLY_NO_CONSUMERS));
    assert_false(reply_code_is_hard(REPLY_CONTENT_TOO_LARGE));
    assert_false(reply_code_is_hard(REPLY_PRECONDITION_FAILED));
    assert_true(reply_code_is_hard(REPLY_CONNECTION_FORCED));
    assert_true(reply_code_is_hard(REPLY_FRAME_ERROR));
    assert_true(reply_code_is_hard(REPLY_NOT_IMPLEMENTED));
    assert_true(reply_code_is_hard(REPLY_INTERNAL_ERROR));
    assert_true(reply_code_is_hard(999));
    assert_string_equal(reply_code_text(REPLY_NOT_FOUND), "NOT_FOUND");
    assert_string_equal(reply_code_text(REPLY_PRECONDITION_FAILED), "PRECONDITION_FAILED");
    assert_string_equal(reply_code_text(REPLY_ACCESS_REFUSED), "ACCESS_REFUSED");
    assert_string_equal(reply_code_text(REPLY_FRAME_ERROR), "FRAME_ERROR");
    assert_null(reply_code_text(999));
}

static struct basic_properties full_properties(void)
{
    struct basic_properties p;
    memset(&p, 0, sizeof(p));
    p.flags = BASIC_FLAGS_KNOWN;
    p.content_type = BYTES_LIT("application/json");
    p.content_encoding = BYTES_LIT("gzip");
    p.headers = (struct table){SAMPLE_TABLE, sizeof(SAMPLE_TABLE)};
    p.delivery_mode = 2;
    p.priority = 9;
    p.correlation_id = BYTES_LIT("corr");
    p.reply_to = BYTES_LIT("amq.rabbitmq.reply-to");
    p.expiration = BYTES_LIT("60000");
    p.message_id = BYTES_LIT("m-1");
    p.timestamp = 1700000000;
    p.type = BYTES_LIT("order.created");
    p.user_id = BYTES_LIT("guest");
    p.app_id = BYTES_LIT("shop");
    p.cluster_id = BYTES_LIT("c1");
    return p;
}

static void test_properties_all_fields(void **state)
{
    (void)state;
    assert_int_equal(BASIC_FLAGS_KNOWN, 0xFFFC);
    struct basic_properties p = full_properties();
    uint8_t buf[512];
    size_t n = basic_properties_encode(&p, buf, sizeof(buf));
    assert_true(n > 2);
    assert_int_equal(buf[0], 0xFF);
    assert_int_equal(buf[1], 0xFC);
    struct basic_properties d;
    assert_int_equal(basic_properties_decode(&d, buf, (uint32_t)n), OK);
    assert_true(basic_properties_equal(&p, &d));
    assert_int_equal(d.delivery_mode, 2);
    assert_true(bytes_equal_cstr(d.cluster_id, "c1"));

    for (size_t cap = 0; cap < n; cap++)
        assert_int_equal(basic_properties_encode(&p, buf + 256, cap), 0);
    for (size_t cut = 0; cut < n; cut++)
        assert_int_equal(basic_properties_decode(&d, buf, (uint32_t)cut), E_SYNTAX);
    buf[n] = 0;
    assert_int_equal(basic_properties_decode(&d, buf, (uint32_t)n + 1), E_SYNTAX);
}

static void test_properties_sparse_and_bad(void **state)
{
    (void)state;
    /* delivery-mode 2 only */
    static const uint8_t dm[] = {0x10, 0x00, 2};
    struct basic_properties d;
    assert_int_equal(basic_properties_decode(&d, dm, sizeof(dm)), OK);
    assert_int_equal(d.flags, BASIC_FLAG_DELIVERY_MODE);
    assert_int_equal(d.delivery_mode, 2);
    static const uint8_t none[] = {0, 0};
    assert_int_equal(basic_properties_decode(&d, none, sizeof(none)), OK);
    assert_int_equal(d.flags, 0);
    static const uint8_t continuation[] = {0x00, 0x01, 0, 0};
    assert_int_equal(basic_properties_decode(&d, continuation, sizeof(continuation)), E_SYNTAX);
    static const uint8_t bit1[] = {0x00, 0x02};
    assert_int_equal(basic_properties_decode(&d, bit1, sizeof(bit1)), E_SYNTAX);
    static const uint8_t bad_headers[] = {0x20, 0x00, 0, 0, 0, 3, 1, 'k', '?'};
    assert_int_equal(basic_properties_decode(&d, bad_headers, sizeof(bad_headers)), E_SYNTAX);

    struct basic_properties p;
    memset(&p, 0, sizeof(p));
    p.flags = BASIC_FLAG_DELIVERY_MODE;
    p.delivery_mode = 2;
    p.content_type = BYTES_LIT("ignored: flag not set");
    uint8_t buf[16];
    assert_int_equal(basic_properties_encode(&p, buf, sizeof(buf)), sizeof(dm));
    assert_memory_equal(buf, dm, sizeof(dm));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_methods_round_trip),
        cmocka_unit_test(test_connection_tune_bytes),
        cmocka_unit_test(test_basic_publish_bytes),
        cmocka_unit_test(test_queue_declare_bits),
        cmocka_unit_test(test_exchange_declare_and_consume_bits),
        cmocka_unit_test(test_basic_nack_bits),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_method_metadata),
        cmocka_unit_test(test_reply_codes),
        cmocka_unit_test(test_properties_all_fields),
        cmocka_unit_test(test_properties_sparse_and_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
