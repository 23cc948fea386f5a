/*
 * test_frame.c: the resumable frame reader, content headers and writers.
 *
 * Goal: frame_parse hands out exactly the frames in a byte stream however
 * the stream is split, and rejects every malformation the spec calls a
 * frame error (501). Method: build a stream of several frames with the
 * writers, then feed every prefix of it, as a connection's input buffer
 * would see it after each read, and check the result against the whole
 * frames in that prefix; then corrupt single bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "amqp/frame.h"
#include "amqp/method_gen.h"
#include "lib/errors.h"

/* A stream: method (basic.publish), content header, body, heartbeat. */
static size_t build_stream(uint8_t *buf, size_t cap, size_t ends[4])
{
    size_t len = 0;
    struct method m = {.id = METHOD_BASIC_PUBLISH};
    m.basic_publish.exchange = BYTES_LIT("amq.direct");
    m.basic_publish.routing_key = BYTES_LIT("rk");
    m.basic_publish.mandatory = true;
    size_t n = frame_write_method(buf, cap, 1, &m);
    assert_true(n > 0);
    len += n;
    ends[0] = len;

    struct basic_properties props;
    memset(&props, 0, sizeof(props));
    props.flags = BASIC_FLAG_DELIVERY_MODE | BASIC_FLAG_CONTENT_TYPE;
    props.delivery_mode = 2;
    props.content_type = BYTES_LIT("text/plain");
    uint8_t encoded[64];
    size_t pn = basic_properties_encode(&props, encoded, sizeof(encoded));
    assert_true(pn > 0);
    n = frame_write_content_header(buf + len, cap - len, 1, CLASS_BASIC, 5, encoded,
                                   (uint32_t)pn);
    assert_true(n > 0);
    len += n;
    ends[1] = len;

    frame_write_body_prefix(buf + len, 1, 5);
    memcpy(buf + len + FRAME_HEADER_SIZE, "hello", 5);
    buf[len + FRAME_HEADER_SIZE + 5] = FRAME_END;
    len += FRAME_OVERHEAD + 5;
    ends[2] = len;

    n = frame_write_heartbeat(buf + len, cap - len);
    assert_int_equal(n, FRAME_OVERHEAD);
    len += n;
    ends[3] = len;
    return len;
}

static void check_frames(const struct frame *f, size_t count)
{
    static const uint8_t types[] = {FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT};
    for (size_t i = 0; i < count; i++) {
        assert_int_equal(f[i].type, types[i]);
        assert_int_equal(f[i].channel, i == 3 ? 0 : 1);
    }
    if (count >= 1) {
        struct method m;
        assert_int_equal(method_decode(&m, f[0].payload, f[0].size), OK);
        assert_int_equal(m.id, METHOD_BASIC_PUBLISH);
        assert_true(bytes_equal_cstr(m.basic_publish.exchange, "amq.direct"));
        assert_true(m.basic_publish.mandatory);
    }
    if (count >= 2) {
        struct content_header h;
        assert_int_equal(content_header_decode(&h, f[1].payload, f[1].size), OK);
        assert_int_equal(h.class_id, CLASS_BASIC);
        assert_int_equal(h.body_size, 5);
        struct basic_properties p;
        assert_int_equal(basic_properties_decode(&p, h.properties, h.properties_size), OK);
        assert_int_equal(p.delivery_mode, 2);
        assert_true(bytes_equal_cstr(p.content_type, "text/plain"));
    }
    if (count >= 3) {
        assert_int_equal(f[2].size, 5);
        assert_memory_equal(f[2].payload, "hello", 5);
    }
    if (count >= 4)
        assert_int_equal(f[3].size, 0);
}

/* Parses as many frames as buf[0..len) holds; returns the count. */
static size_t parse_all(const uint8_t *buf, size_t len, struct frame out[4], size_t *used)
{
    struct frame_reader r = {.frame_max = 0};
    size_t count = 0;
    size_t pos = 0;
    for (;;) {
        size_t need = 0;
        int rc = frame_parse(&r, buf + pos, len - pos, &out[count], &need);
        assert_true(rc >= 0);
        if (rc == 0) {
            assert_true(need > len - pos);
            break;
        }
        pos += (size_t)rc;
        count++;
    }
    *used = pos;
    return count;
}

static void test_every_split_point(void **state)
{
    (void)state;
    uint8_t buf[512];
    size_t ends[4];
    size_t len = build_stream(buf, sizeof(buf), ends);
    for (size_t prefix = 0; prefix <= len; prefix++) {
        struct frame f[4];
        size_t used;
        size_t count = parse_all(buf, prefix, f, &used);
        size_t want = 0;
        while (want < 4 && ends[want] <= prefix)
            want++;
        assert_int_equal(count, want);
        assert_int_equal(used, want == 0 ? 0 : ends[want - 1]);
        check_frames(f, count);
    }
}

static void test_need_out(void **state)
{
    (void)state;
    uint8_t buf[512];
    size_t ends[4];
    build_stream(buf, sizeof(buf), ends);
    struct frame_reader r = {0};
    struct frame f;
    size_t need = 0;
    assert_int_equal(frame_parse(&r, buf, 3, &f, &need), 0);
    assert_int_equal(need, FRAME_OVERHEAD);
    assert_int_equal(frame_parse(&r, buf, FRAME_HEADER_SIZE, &f, &need), 0);
    assert_int_equal(need, ends[0]);
    assert_int_equal(frame_parse(&r, buf, ends[0] - 1, &f, NULL), 0);
}

static void test_many_frames(void **state)
{
    (void)state;
    uint8_t buf[FRAME_OVERHEAD * 100];
    size_t len = 0;
    for (int i = 0; i < 100; i++)
        len += frame_write_heartbeat(buf + len, sizeof(buf) - len);
    struct frame_reader r = {0};
    size_t pos = 0;
    int count = 0;
    struct frame f;
    while (pos < len) {
        int rc = frame_parse(&r, buf + pos, len - pos, &f, NULL);
        assert_int_equal(rc, FRAME_OVERHEAD);
        assert_int_equal(f.type, FRAME_HEARTBEAT);
        pos += (size_t)rc;
        count++;
    }
    assert_int_equal(count, 100);
}

static void test_frame_max(void **state)
{
    (void)state;
    uint8_t hdr[FRAME_HEADER_SIZE];
    struct frame f;
    size_t need = 0;
    struct frame_reader def = {0};
    frame_write_body_prefix(hdr, 1, FRAME_MIN_SIZE - FRAME_OVERHEAD);
    assert_int_equal(frame_parse(&def, hdr, sizeof(hdr), &f, &need), 0);
    assert_int_equal(need, FRAME_MIN_SIZE);
    frame_write_body_prefix(hdr, 1, FRAME_MIN_SIZE - FRAME_OVERHEAD + 1);
    assert_int_equal(frame_parse(&def, hdr, sizeof(hdr), &f, &need), E_FRAME);

    struct frame_reader big = {.frame_max = 131072};
    assert_int_equal(frame_parse(&big, hdr, sizeof(hdr), &f, &need), 0);
    frame_write_body_prefix(hdr, 1, 131072 - FRAME_OVERHEAD + 1);
    assert_int_equal(frame_parse(&big, hdr, sizeof(hdr), &f, &need), E_FRAME);
    frame_write_body_prefix(hdr, 1, UINT32_MAX);
    assert_int_equal(frame_parse(&big, hdr, sizeof(hdr), &f, &need), E_FRAME);
}

static void test_bad_frames(void **state)
{
    (void)state;
    struct frame_reader r = {0};
    struct frame f;
    uint8_t buf[64];
    size_t n = frame_write_heartbeat(buf, sizeof(buf));

    buf[n - 1] = 0xCD; /* frame-end */
    assert_int_equal(frame_parse(&r, buf, n, &f, NULL), E_FRAME);
    buf[n - 1] = FRAME_END;

    for (unsigned type = 0; type < 256; type++) {
        uint8_t one = (uint8_t)type;
        int rc = frame_parse(&r, &one, 1, &f, NULL);
        bool known = type == 1 || type == 2 || type == 3 || type == 8;
        assert_int_equal(rc, known ? 0 : E_FRAME);
    }

    static const uint8_t hb_channel[] = {8, 0, 1};
    assert_int_equal(frame_parse(&r, hb_channel, sizeof(hb_channel), &f, NULL), E_FRAME);
    static const uint8_t hb_payload[] = {8, 0, 0, 0, 0, 0, 1, 0, FRAME_END};
    assert_int_equal(frame_parse(&r, hb_payload, sizeof(hb_payload), &f, NULL), E_FRAME);
    static const uint8_t short_method[] = {1, 0, 1, 0, 0, 0, 3, 0, 10, 0, FRAME_END};
    assert_int_equal(frame_parse(&r, short_method, sizeof(short_method), &f, NULL), E_FRAME);
    static const uint8_t empty_body[] = {3, 0, 1, 0, 0, 0, 0, FRAME_END};
    assert_int_equal(frame_parse(&r, empty_body, sizeof(empty_body), &f, NULL), 8);
    assert_int_equal(f.size, 0);
}

static void test_content_header(void **state)
{
    (void)state;
    static const uint8_t ok[] = {0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0x10, 0x00, 1};
    struct content_header h;
    assert_int_equal(content_header_decode(&h, ok, sizeof(ok)), OK);
    assert_int_equal(h.class_id, 60);
    assert_int_equal(h.body_size, 256);
    assert_int_equal(h.properties_size, 3);
    assert_ptr_equal(h.properties, ok + 12);
    assert_int_equal(content_header_decode(&h, ok, 13), E_FRAME);
    static const uint8_t weight[] = {0, 60, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(content_header_decode(&h, weight, sizeof(weight)), E_FRAME);
}

static void test_writers_cap(void **state)
{
    (void)state;
    struct method m = {.id = METHOD_CONNECTION_TUNE};
    m.connection_tune.frame_max = 131072;
    uint8_t buf[64];
    size_t n = frame_write_method(buf, sizeof(buf), 0, &m);
    assert_int_equal(n, 12 + FRAME_OVERHEAD);
    static const uint8_t want[] = {1, 0, 0, 0, 0, 0, 12, 0, 10, 0, 30, 0, 0,
                                   0, 2, 0, 0, 0, 0, FRAME_END};
    assert_memory_equal(buf, want, sizeof(want));
    uint8_t small[64];
    for (size_t cap = 0; cap < n; cap++)
        assert_int_equal(frame_write_method(small, cap, 0, &m), 0);
    for (size_t cap = 0; cap < FRAME_OVERHEAD; cap++)
        assert_int_equal(frame_write_heartbeat(small, cap), 0);
    static const uint8_t props[] = {0, 0};
    size_t hn = frame_write_content_header(buf, sizeof(buf), 3, CLASS_BASIC, 0, props, 2);
    assert_int_equal(hn, 14 + FRAME_OVERHEAD);
    for (size_t cap = 0; cap < hn; cap++)
        assert_int_equal(frame_write_content_header(small, cap, 3, CLASS_BASIC, 0, props, 2), 0);
    assert_memory_equal(PROTOCOL_HEADER, "AMQP\0\0\x09\x01", PROTOCOL_HEADER_SIZE);
}

/* The basic.deliver fast path writes exactly what the generated encoder
 * writes, for empty (pointer-less) and 255-byte shortstrs, both values of
 * the redelivered bit and tags that use all 8 bytes; it refuses a short
 * buffer as the other writers do. */
static void test_basic_deliver_writer(void **state)
{
    (void)state;
    static uint8_t long_name[255];
    memset(long_name, 'x', sizeof long_name);
    const struct bytes names[] = {{NULL, 0}, BYTES_LIT("ctag-1"), {long_name, 255}};
    for (size_t i = 0; i < 27; i++) {
        struct method m = {.id = METHOD_BASIC_DELIVER};
        m.basic_deliver.consumer_tag = names[i % 3];
        m.basic_deliver.exchange = names[(i / 3) % 3];
        m.basic_deliver.routing_key = names[i / 9];
        m.basic_deliver.delivery_tag = i % 2 ? UINT64_C(0x0102030405060708) : i;
        m.basic_deliver.redelivered = i % 2 == 0;
        uint8_t want[1024], got[1024];
        size_t want_n = frame_write_method(want, sizeof want, 7, &m);
        const struct method_basic_deliver *d = &m.basic_deliver;
        size_t n = frame_basic_deliver_size(d->consumer_tag, d->exchange, d->routing_key);
        assert_int_equal(n, want_n);
        assert_int_equal(frame_write_basic_deliver(got, sizeof got, 7, d->consumer_tag,
                                                   d->delivery_tag, d->redelivered,
                                                   d->exchange, d->routing_key),
                         want_n);
        assert_memory_equal(got, want, want_n);
        assert_int_equal(frame_write_basic_deliver(got, n - 1, 7, d->consumer_tag,
                                                   d->delivery_tag, d->redelivered,
                                                   d->exchange, d->routing_key),
                         0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_split_point),
        cmocka_unit_test(test_need_out),
        cmocka_unit_test(test_many_frames),
        cmocka_unit_test(test_frame_max),
        cmocka_unit_test(test_bad_frames),
        cmocka_unit_test(test_content_header),
        cmocka_unit_test(test_writers_cap),
        cmocka_unit_test(test_basic_deliver_writer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
