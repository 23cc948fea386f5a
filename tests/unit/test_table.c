/*
 * test_table.c: field tables and arrays.
 *
 * Goal: every RabbitMQ type letter is validated, read and written with the
 * same layout; nesting and arrays of tables (x-death) work; malformed or
 * over-deep input is E_SYNTAX; the writer never writes past its buffer.
 * Method: write values with the writer, validate and iterate them back;
 * compare a few hand-written byte vectors; cut and corrupt bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "amqp/table.h"
#include "lib/errors.h"

static struct field_value value_of(uint8_t kind)
{
    static const uint8_t nested_table[] = {1, 'n', 'b', 0xFF};
    static const uint8_t nested_array[] = {'I', 0, 0, 0, 7, 'V'};
    struct field_value v;
    memset(&v, 0, sizeof(v));
    v.kind = kind;
    switch (kind) {
    case 't': v.boolean = true; break;
    case 'b': v.i64 = -5; break;
    case 'B': v.u64 = 250; break;
    case 's': v.i64 = -30000; break;
    case 'u': v.u64 = 65000; break;
    case 'I': v.i64 = -2000000000; break;
    case 'i': v.u64 = 4000000000u; break;
    case 'l': v.i64 = INT64_MIN + 1; break;
    case 'T': v.u64 = 1700000000; break;
    case 'f': v.f32 = 1.5f; break;
    case 'd': v.f64 = -2.25; break;
    case 'D':
        v.decimal.scale = 2;
        v.decimal.value = 12345;
        break;
    case 'S': v.str = BYTES_LIT("hello"); break;
    case 'x': v.str = BYTES_LIT("\x00\x01\x02"); break;
    case 'A': v.array = (struct bytes){nested_array, sizeof(nested_array)}; break;
    case 'F': v.table = (struct table){nested_table, sizeof(nested_table)}; break;
    case 'V': break;
    default: fail();
    }
    return v;
}

static void assert_value_equal(const struct field_value *a, const struct field_value *b)
{
    assert_int_equal(a->kind, b->kind);
    switch (a->kind) {
    case 't': assert_int_equal(a->boolean, b->boolean); break;
    case 'b':
    case 's':
    case 'I':
    case 'l': assert_true(a->i64 == b->i64); break;
    case 'B':
    case 'u':
    case 'i':
    case 'T': assert_true(a->u64 == b->u64); break;
    case 'f': assert_true(a->f32 == b->f32); break;
    case 'd': assert_true(a->f64 == b->f64); break;
    case 'D':
        assert_int_equal(a->decimal.scale, b->decimal.scale);
        assert_int_equal(a->decimal.value, b->decimal.value);
        break;
    case 'S':
    case 'x': assert_true(bytes_equal(a->str, b->str)); break;
    case 'A': assert_true(bytes_equal(a->array, b->array)); break;
    case 'F':
        assert_int_equal(a->table.len, b->table.len);
        assert_memory_equal(a->table.ptr, b->table.ptr, a->table.len);
        break;
    case 'V': break;
    default: fail();
    }
}

static const char KINDS[] = "tbBsuIilTfdDSxAFV";

static void test_every_type_round_trip(void **state)
{
    (void)state;
    uint8_t buf[512];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof(buf));
    for (size_t i = 0; KINDS[i] != '\0'; i++) {
        char key[2] = {KINDS[i], '\0'};
        struct field_value v = value_of((uint8_t)KINDS[i]);
        table_put_field(&w, bytes_of_cstr(key), &v);
    }
    assert_false(w.overflow);
    struct table t = table_writer_table(&w);
    assert_int_equal(table_validate(t.ptr, t.len), OK);

    struct table_iter it;
    table_iter_init(&it, t);
    struct bytes key;
    struct field_value got;
    size_t i = 0;
    while (table_iter_next(&it, &key, &got)) {
        assert_int_equal(key.len, 1);
        assert_int_equal(key.ptr[0], KINDS[i]);
        struct field_value want = value_of((uint8_t)KINDS[i]);
        assert_value_equal(&want, &got);
        assert_int_equal(field_value_size(&got), field_value_size(&want));
        i++;
    }
    assert_int_equal(i, strlen(KINDS));

    struct field_value v;
    assert_true(table_get(t, "D", &v));
    assert_int_equal(v.decimal.value, 12345);
    assert_false(table_get(t, "missing", &v));
}

static void test_known_bytes(void **state)
{
    (void)state;
    uint8_t buf[128];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof(buf));
    table_put_bool(&w, "b", true);
    table_put_i32(&w, "i", -2);
    table_put_int(&w, "l", 1);
    table_put_longstr(&w, "s", BYTES_LIT("ab"));
    table_put_timestamp(&w, "t", 0x0102030405060708ull);
    static const uint8_t want[] = {
        1, 'b', 't', 1,
        1, 'i', 'I', 0xFF, 0xFF, 0xFF, 0xFE,
        1, 'l', 'l', 0, 0, 0, 0, 0, 0, 0, 1,
        1, 's', 'S', 0, 0, 0, 2, 'a', 'b',
        1, 't', 'T', 1, 2, 3, 4, 5, 6, 7, 8,
    };
    struct table t = table_writer_table(&w);
    assert_int_equal(t.len, sizeof(want));
    assert_memory_equal(t.ptr, want, sizeof(want));
    assert_int_equal(table_validate(want, sizeof(want)), OK);
}

/* x-death: an array of tables, each holding an array of longstrs. */
static void test_nesting_and_arrays(void **state)
{
    (void)state;
    uint8_t buf[512];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof(buf));
    size_t a = table_put_array_begin(&w, "x-death");
    for (int i = 0; i < 2; i++) {
        size_t t = table_array_put_table_begin(&w);
        table_put_int(&w, "count", i + 1);
        table_put_longstr(&w, "queue", BYTES_LIT("orders"));
        size_t keys = table_put_array_begin(&w, "routing-keys");
        table_array_put_longstr(&w, BYTES_LIT("rk1"));
        table_array_put_longstr(&w, BYTES_LIT("rk2"));
        table_put_array_end(&w, keys);
        table_put_table_end(&w, t);
    }
    table_array_put_int(&w, 99);
    table_put_array_end(&w, a);
    size_t f = table_put_table_begin(&w, "nested");
    size_t inner = table_put_array_begin(&w, "empty");
    table_put_array_end(&w, inner);
    table_put_table_end(&w, f);
    assert_false(w.overflow);
    struct table t = table_writer_table(&w);
    assert_int_equal(table_validate(t.ptr, t.len), OK);

    struct field_value deaths;
    assert_true(table_get(t, "x-death", &deaths));
    assert_int_equal(deaths.kind, 'A');
    struct array_iter it;
    array_iter_init(&it, deaths.array);
    struct field_value e;
    for (int i = 0; i < 2; i++) {
        assert_true(array_iter_next(&it, &e));
        assert_int_equal(e.kind, 'F');
        struct field_value count;
        assert_true(table_get(e.table, "count", &count));
        int64_t n;
        assert_true(field_value_as_int(&count, &n));
        assert_int_equal(n, i + 1);
        struct field_value keys;
        assert_true(table_get(e.table, "routing-keys", &keys));
        struct array_iter kit;
        array_iter_init(&kit, keys.array);
        struct field_value k;
        assert_true(array_iter_next(&kit, &k));
        assert_true(bytes_equal_cstr(k.str, "rk1"));
        assert_true(array_iter_next(&kit, &k));
        assert_true(bytes_equal_cstr(k.str, "rk2"));
        assert_false(array_iter_next(&kit, &k));
    }
    assert_true(array_iter_next(&it, &e));
    assert_int_equal(e.i64, 99);
    assert_false(array_iter_next(&it, &e));

    struct field_value nested;
    assert_true(table_get(t, "nested", &nested));
    struct field_value empty;
    assert_true(table_get(nested.table, "empty", &empty));
    assert_int_equal(empty.kind, 'A');
    assert_int_equal(empty.array.len, 0);
}

/* Builds depth-many nested single-entry tables {"k": F {...}} in buf. */
static uint32_t nested_tables(uint8_t *buf, size_t cap, int depth)
{
    struct table_writer w;
    table_writer_init(&w, buf, cap);
    size_t marks[100];
    for (int i = 0; i < depth - 1; i++)
        marks[i] = table_put_table_begin(&w, "k");
    table_put_bool(&w, "leaf", true);
    for (int i = depth - 2; i >= 0; i--)
        table_put_table_end(&w, marks[i]);
    assert_false(w.overflow);
    return table_writer_table(&w).len;
}

static void test_depth_limit(void **state)
{
    (void)state;
    uint8_t buf[2048];
    uint32_t len = nested_tables(buf, sizeof(buf), TABLE_DEPTH_MAX);
    assert_int_equal(table_validate(buf, len), OK);
    len = nested_tables(buf, sizeof(buf), TABLE_DEPTH_MAX + 1);
    assert_int_equal(table_validate(buf, len), E_SYNTAX);

    /* Arrays count too: 'A' holding 'A' holding ... */
    uint8_t arr[1024];
    size_t n = 0;
    int levels = TABLE_DEPTH_MAX + 5;
    for (int i = 0; i < levels; i++) {
        uint32_t rest = (uint32_t)((levels - 1 - i) * 5);
        arr[n++] = 'A';
        arr[n++] = (uint8_t)(rest >> 24);
        arr[n++] = (uint8_t)(rest >> 16);
        arr[n++] = (uint8_t)(rest >> 8);
        arr[n++] = (uint8_t)rest;
    }
    assert_int_equal(table_array_validate(arr, (uint32_t)n), E_SYNTAX);
    assert_int_equal(table_array_validate(arr + 5 * 10, (uint32_t)n - 5 * 10), OK);
}

static void test_malformed(void **state)
{
    (void)state;
    /* Each entry alone, cut at every byte, is E_SYNTAX (never a shorter valid table). */
    for (size_t i = 0; KINDS[i] != '\0'; i++) {
        uint8_t buf[64];
        struct table_writer w;
        table_writer_init(&w, buf, sizeof(buf));
        struct field_value v = value_of((uint8_t)KINDS[i]);
        table_put_field(&w, BYTES_LIT("key"), &v);
        struct table t = table_writer_table(&w);
        assert_int_equal(table_validate(t.ptr, t.len), OK);
        for (uint32_t cut = 1; cut < t.len; cut++)
            assert_int_equal(table_validate(t.ptr, cut), E_SYNTAX);
    }
    static const uint8_t bad_type[] = {1, 'k', 'Z', 0};
    assert_int_equal(table_validate(bad_type, sizeof(bad_type)), E_SYNTAX);
    static const uint8_t bad_nested[] = {1, 'k', 'F', 0, 0, 0, 3, 1, 'x', 'Q'};
    assert_int_equal(table_validate(bad_nested, sizeof(bad_nested)), E_SYNTAX);
    static const uint8_t bad_array[] = {1, 'k', 'A', 0, 0, 0, 2, 'l', 1};
    assert_int_equal(table_validate(bad_array, sizeof(bad_array)), E_SYNTAX);
    static const uint8_t huge_len[] = {1, 'k', 'S', 0xFF, 0xFF, 0xFF, 0xFF};
    assert_int_equal(table_validate(huge_len, sizeof(huge_len)), E_SYNTAX);
    assert_int_equal(table_validate(NULL, 0), OK);
}

static void test_as_int(void **state)
{
    (void)state;
    const char *ints = "bBsuIilT";
    for (size_t i = 0; ints[i] != '\0'; i++) {
        struct field_value v = value_of((uint8_t)ints[i]);
        int64_t n;
        assert_true(field_value_as_int(&v, &n));
    }
    struct field_value v = {.kind = 'T', .u64 = UINT64_MAX};
    int64_t n;
    assert_false(field_value_as_int(&v, &n));
    v = value_of('S');
    assert_false(field_value_as_int(&v, &n));
    v = value_of('b');
    assert_true(field_value_as_int(&v, &n));
    assert_int_equal(n, -5);
}

static void test_writer_overflow(void **state)
{
    (void)state;
    uint8_t full[256];
    size_t need = 0;
    for (size_t cap = 0;; cap++) {
        uint8_t buf[256];
        memset(buf, 0xAA, sizeof(buf));
        struct table_writer w;
        table_writer_init(&w, buf, cap);
        table_put_longstr(&w, "a", BYTES_LIT("abc"));
        size_t m = table_put_table_begin(&w, "t");
        table_put_int(&w, "n", 1);
        table_put_table_end(&w, m);
        size_t arr = table_put_array_begin(&w, "x");
        table_array_put_int(&w, 2);
        table_put_array_end(&w, arr);
        assert_true(w.len <= cap);
        for (size_t i = cap; i < sizeof(buf); i++)
            assert_int_equal(buf[i], 0xAA); /* nothing past cap */
        if (!w.overflow) {
            need = cap;
            struct table t = table_writer_table(&w);
            memcpy(full, t.ptr, t.len);
            assert_int_equal(t.len, cap);
            assert_int_equal(table_validate(t.ptr, t.len), OK);
            break;
        }
        struct table t = table_writer_table(&w);
        assert_int_equal(t.len, 0);
    }
    assert_int_equal(need, 1 + 1 + 5 + 3 + 1 + 1 + 5 + 1 + 1 + 9 + 1 + 1 + 5 + 9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_round_trip),
        cmocka_unit_test(test_known_bytes),
        cmocka_unit_test(test_nesting_and_arrays),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_as_int),
        cmocka_unit_test(test_writer_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
