/*
 * fuzz_table.c: field-table validation, iteration and copying.
 *
 * Goal: table_validate never reads outside its input or recurses without
 * bound; a validated table iterates to its end, nested values validate
 * too, and copying every entry with table_put_field reproduces the bytes.
 * Method: the input is a table's contents (no length prefix).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/table.h"
#include "lib/assert.h"
#include "lib/errors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk_array(struct bytes array, int depth);

static void walk_value(const struct field_value *v, int depth)
{
    ASSERT(depth <= TABLE_DEPTH_MAX);
    int64_t n;
    (void)field_value_as_int(v, &n);
    if (v->kind == 'F') {
        ASSERT(table_validate(v->table.ptr, v->table.len) == OK);
        struct table_iter it;
        table_iter_init(&it, v->table);
        struct bytes key;
        struct field_value inner;
        while (table_iter_next(&it, &key, &inner))
            walk_value(&inner, depth + 1);
    } else if (v->kind == 'A') {
        ASSERT(table_array_validate(v->array.ptr, v->array.len) == OK);
        walk_array(v->array, depth);
    }
}

static void walk_array(struct bytes array, int depth)
{
    struct array_iter it;
    array_iter_init(&it, array);
    struct field_value v;
    while (array_iter_next(&it, &v))
        walk_value(&v, depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > UINT32_MAX)
        return 0;
    int rc = table_validate(data, (uint32_t)size);
    ASSERT(rc == OK || rc == E_SYNTAX);
    (void)table_array_validate(data, (uint32_t)size);
    if (rc != OK)
        return 0;
    uint8_t *copy = malloc(size + 1);
    ASSERT(copy != NULL);
    struct table_writer w;
    table_writer_init(&w, copy, size);
    struct table t = {data, (uint32_t)size};
    struct table_iter it;
    table_iter_init(&it, t);
    struct bytes key;
    struct field_value v;
    while (table_iter_next(&it, &key, &v)) {
        walk_value(&v, 1);
        table_put_field(&w, key, &v);
    }
    ASSERT(it.pos == it.end);
    /* 't' may hold any nonzero octet on input; the copy writes 1. Same length regardless. */
    ASSERT(!w.overflow);
    ASSERT(w.len == size);
    struct table c = table_writer_table(&w);
    ASSERT(table_validate(c.ptr, c.len) == OK);
    free(copy);
    return 0;
}
