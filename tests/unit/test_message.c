/*
 * test_message.c: a message's body room grows with what arrived.
 *
 * Goal: a message made for a 128 MiB body with nothing arrived holds (and
 * counts in message_live_bytes) no body room; appending grows the room
 * geometrically, never past the body, at least by what the caller says
 * has arrived beyond; the headers slice and the bytes survive the moves;
 * the finished message is byte for byte its blob; a message freed half
 * received gives its room back. Method: appends of chosen sizes, checking
 * capacity, the gauge and the contents after each.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "amqp/method_gen.h"
#include "amqp/table.h"
#include "broker/message.h"
#include "lib/errors.h"

/* Properties with a headers table, so the test sees the slice move. */
static size_t make_properties(uint8_t *out, size_t cap, struct basic_properties *props)
{
    uint8_t table_buf[64];
    struct table_writer w;
    table_writer_init(&w, table_buf, sizeof table_buf);
    table_put_longstr(&w, "k", BYTES_LIT("v"));
    assert_false(w.overflow);
    memset(props, 0, sizeof *props);
    props->flags = BASIC_FLAG_HEADERS;
    props->headers = table_writer_table(&w);
    size_t n = basic_properties_encode(props, out, cap);
    assert_true(n > 0);
    assert_int_equal(basic_properties_decode(props, out, (uint32_t)n), OK);
    return n;
}

static struct message *make(uint64_t body_size, uint64_t capacity)
{
    static uint8_t encoded[128];
    struct basic_properties props;
    size_t n = make_properties(encoded, sizeof encoded, &props);
    return message_new_partial(BYTES_LIT("ex"), BYTES_LIT("rk"), encoded, (uint32_t)n, &props,
                               body_size, capacity);
}

static void test_declared_size_reserves_nothing(void **state)
{
    (void)state;
    uint64_t before = message_live_bytes;
    struct message *m = make(128u << 20, 0);
    assert_non_null(m);
    assert_int_equal(m->body_capacity, 0);
    assert_int_equal(message_live_bytes, before);
    /* One byte: the minimum step, not the declared size. */
    assert_int_equal(message_append_body(&m, (const uint8_t *)"x", 1, 0), OK);
    assert_int_equal(m->body_capacity, 4096);
    assert_int_equal(message_live_bytes, before + 4096);
    message_unref(m); /* freed half received: its room goes back */
    assert_int_equal(message_live_bytes, before);
}

static void test_growth_is_geometric_and_bounded(void **state)
{
    (void)state;
    enum { SIZE = 1000000 };
    static uint8_t body[SIZE];
    for (size_t i = 0; i < SIZE; i++)
        body[i] = (uint8_t)(i * 7 + 3);
    uint64_t before = message_live_bytes;
    struct message *m = make(SIZE, 10);
    assert_non_null(m);
    size_t at = 0;
    unsigned moves = 0;
    while (at < SIZE) {
        size_t piece = SIZE - at < 1000 ? SIZE - at : 1000;
        uint64_t capacity = m->body_capacity;
        assert_int_equal(message_append_body(&m, body + at, piece, 0), OK);
        at += piece;
        if (m->body_capacity != capacity) {
            moves++;
            /* Doubled (or the minimum step, or capped at the body). */
            assert_true(m->body_capacity == SIZE || m->body_capacity == 2 * capacity ||
                        m->body_capacity == 4096);
        }
        assert_true(m->body_capacity <= SIZE);
        assert_true(m->body_capacity < 2 * at + 4096); /* never far ahead of the bytes */
        assert_int_equal(message_live_bytes, before + m->body_capacity);
    }
    assert_true(moves <= 10);
    assert_int_equal(m->body_received, SIZE);
    assert_int_equal(m->body_capacity, SIZE);
    assert_memory_equal(m->body, body, SIZE);
    /* The headers slice moved with the message. */
    struct field_value v;
    assert_true(table_get(m->headers, "k", &v));
    assert_int_equal(v.kind, 'S');
    assert_memory_equal(v.str.ptr, "v", 1);
    /* Complete: its blob rebuilds the same message. */
    struct bytes blob = message_blob(m);
    struct message *copy = message_from_blob(blob.ptr, blob.len);
    assert_non_null(copy);
    assert_memory_equal(copy->body, body, SIZE);
    message_unref(copy);
    message_unref(m);
    assert_int_equal(message_live_bytes, before);
}

static void test_room_covers_what_arrived_beyond(void **state)
{
    (void)state;
    static uint8_t body[300000];
    memset(body, 'b', sizeof body);
    struct message *m = make(sizeof body, 0);
    assert_non_null(m);
    /* The caller holds 200,000 more: one growth covers them... */
    assert_int_equal(message_append_body(&m, body, 1000, 200000), OK);
    assert_int_equal(m->body_capacity, 201000);
    assert_int_equal(message_append_body(&m, body, 200000, 0), OK);
    assert_int_equal(m->body_capacity, 201000);
    /* ...and never past the body. */
    assert_int_equal(message_append_body(&m, body, 1000, 1u << 30), OK);
    assert_int_equal(m->body_capacity, sizeof body);
    assert_int_equal(message_append_body(&m, body, sizeof body - 202000, 0), OK);
    assert_int_equal(m->body_received, sizeof body);
    message_unref(m);
}

static void test_whole_body_is_one_allocation(void **state)
{
    (void)state;
    struct message *m = make(5000, 5000);
    assert_non_null(m);
    struct message *was = m;
    static uint8_t body[5000];
    assert_int_equal(message_append_body(&m, body, sizeof body, 0), OK);
    assert_ptr_equal(m, was); /* no move */
    assert_int_equal(m->body_capacity, 5000);
    message_unref(m);
}

/* Read straight into the room (message_reserve_body): the room stays
 * within 64 KiB, or what arrived, beyond what arrived. */
static void test_reserved_room_stays_near_what_arrived(void **state)
{
    (void)state;
    enum { SIZE = 1u << 20 };
    struct message *m = make(SIZE, 0);
    assert_non_null(m);
    uint64_t received = 0;
    while (received < SIZE) {
        assert_int_equal(message_reserve_body(&m, SIZE), OK);
        uint64_t room = m->body_capacity - m->body_received;
        assert_true(room > 0);
        uint64_t ahead = received > MESSAGE_READ_AHEAD_SIZE ? received : MESSAGE_READ_AHEAD_SIZE;
        assert_true(m->body_capacity <= 2 * (received + ahead)); /* by doubling, at most */
        assert_true(m->body_capacity <= SIZE);
        memset(m->body + m->body_received, (int)(received >> 16), (size_t)room);
        message_body_written(m, room);
        received += room;
        assert_int_equal(m->body_received, received);
    }
    assert_int_equal(m->body_capacity, SIZE);
    message_unref(m);
}

/* A large block comes back for the next large message, with a tail for
 * a read that goes on past the body; the cache lets go when unused. */
static void test_large_blocks_are_reused(void **state)
{
    (void)state;
    message_cache_clear();
    struct message *m = make(65536, 65536);
    assert_non_null(m);
    assert_true(message_block_after(m, 65536) >= MESSAGE_TAIL_SIZE);
    uint8_t *block = (uint8_t *)m;
    message_unref(m);
    struct message_cache_stats s = message_cache_stats();
    assert_int_equal(s.blocks, 1);
    struct message *again = make(65536, 1000); /* partial: still the whole block */
    assert_ptr_equal((uint8_t *)again, block);
    assert_int_equal(again->body_capacity, 1000);
    assert_int_equal(message_cache_stats().hits, s.hits + 1);
    /* Growing within the block does not move it. */
    static uint8_t body[65536];
    assert_int_equal(message_append_body(&again, body, sizeof body, 0), OK);
    assert_ptr_equal((uint8_t *)again, block);
    message_unref(again);
    /* Small ones are not kept; the kept ones go after two idle seconds. */
    message_unref(make(100, 100));
    assert_int_equal(message_cache_stats().blocks, 1);
    message_cache_tick(1000000);
    message_cache_tick(1001000);
    assert_int_equal(message_cache_stats().blocks, 1);
    message_cache_tick(1002100);
    assert_int_equal(message_cache_stats().blocks, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declared_size_reserves_nothing),
        cmocka_unit_test(test_growth_is_geometric_and_bounded),
        cmocka_unit_test(test_room_covers_what_arrived_beyond),
        cmocka_unit_test(test_whole_body_is_one_allocation),
        cmocka_unit_test(test_reserved_room_stays_near_what_arrived),
        cmocka_unit_test(test_large_blocks_are_reused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
