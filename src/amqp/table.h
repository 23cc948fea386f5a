/*
 * table.h: AMQP field tables and field arrays (RabbitMQ's dialect).
 *
 * Owns the field-value type letters, the validator, the zero-copy readers
 * (table_iter, array_iter, table_get) and the writer (struct table_writer).
 * Never allocates and never does I/O. Readers trust only validated input:
 * table_validate() runs once when a method or content header is decoded
 * (method_decode and basic_properties_decode call it), after which the
 * iterators may walk the bytes without reporting errors.
 *
 * Type letters, as RabbitMQ and its clients use them (not the 0-9-1 spec
 * errata letters):
 *   t bool(u8)   b int8    B uint8   s int16   u uint16   I int32
 *   i uint32     l int64   f float   d double  D decimal (scale u8, value u32)
 *   S longstr    x byte array (u32 length + bytes, like S)
 *   A array (u32 length + values)   T timestamp (u64)   F table   V void
 *
 * Value storage in struct field_value: t -> boolean; b s I l -> i64 (sign
 * extended); B u i T -> u64; f -> f32; d -> f64; D -> decimal; S x -> str;
 * F -> table; A -> array (the raw contents after its length); V -> nothing.
 */
#ifndef QUAY_AMQP_TABLE_H
#define QUAY_AMQP_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"

/* Deepest nesting of F/A values table_validate accepts (the top table is 1). */
#define TABLE_DEPTH_MAX 64

struct field_value {
    uint8_t kind; /* the type letter, e.g. 'S' */
    union {
        bool boolean;
        int64_t i64;
        uint64_t u64;
        float f32;
        double f64;
        struct {
            uint8_t scale;
            uint32_t value;
        } decimal;
        struct bytes str;   /* S and x, borrowed */
        struct table table; /* F, borrowed */
        struct bytes array; /* A: raw encoded values after the length, borrowed */
    };
};

/* Validates a whole encoded table (without its 4-byte length prefix),
 * recursively: keys are shortstrs, type letters are known, lengths stay in
 * bounds, nesting is at most TABLE_DEPTH_MAX. OK or E_SYNTAX. */
int table_validate(const uint8_t *p, uint32_t len);

/* The same for the contents of an array value (a sequence of typed values). */
int table_array_validate(const uint8_t *p, uint32_t len);

/* Walks a validated table in wire order. Keys and values borrow from it. */
struct table_iter {
    const uint8_t *pos;
    const uint8_t *end;
};
void table_iter_init(struct table_iter *it, struct table t);
bool table_iter_next(struct table_iter *it, struct bytes *key, struct field_value *value);

/* First entry named key (NUL-terminated) in a validated table. */
bool table_get(struct table t, const char *key, struct field_value *out);

/* Walks the values of a validated array (field_value.array). */
struct array_iter {
    const uint8_t *pos;
    const uint8_t *end;
};
void array_iter_init(struct array_iter *it, struct bytes array);
bool array_iter_next(struct array_iter *it, struct field_value *value);

/* Any integer kind (b B s u I i l T) -> int64; false for other kinds and
 * for unsigned values above INT64_MAX. */
bool field_value_as_int(const struct field_value *v, int64_t *out);

/* Number of bytes v takes on the wire, including its type letter. */
size_t field_value_size(const struct field_value *v);

/*
 * Table writer into a caller buffer. The bytes produced are a table's
 * contents (no outer length prefix), i.e. exactly what struct table holds.
 * A write that would pass cap sets `overflow`; the writer then ignores
 * every later write, so the caller checks `overflow` once at the end and
 * retries with a bigger buffer. Keys longer than 255 bytes are a writer
 * bug and assert.
 *
 * Nesting: *_begin() writes the key (if any), the type letter and a length
 * placeholder and returns a mark; the matching *_end(mark) patches the
 * length. Inside an array, use the table_array_put_* functions (values
 * without keys); inside a table, the keyed table_put_* functions. An array
 * of tables (e.g. RabbitMQ's x-death header) is written as:
 *
 *     size_t a = table_put_array_begin(w, "x-death");
 *     size_t t = table_array_put_table_begin(w);
 *     table_put_int(w, "count", 1);
 *     table_put_table_end(w, t);
 *     table_put_array_end(w, a);
 */
struct table_writer {
    uint8_t *buf; /* borrowed */
    size_t cap;
    size_t len;
    bool overflow;
    uint32_t open_count; /* begun but not yet ended F/A values */
};

void table_writer_init(struct table_writer *w, uint8_t *buf, size_t cap);
void table_put_bool(struct table_writer *w, const char *key, bool v);              /* 't' */
void table_put_int(struct table_writer *w, const char *key, int64_t v);            /* 'l' */
void table_put_i32(struct table_writer *w, const char *key, int32_t v);            /* 'I' */
void table_put_longstr(struct table_writer *w, const char *key, struct bytes v);   /* 'S' */
void table_put_timestamp(struct table_writer *w, const char *key, uint64_t v);     /* 'T' */
/* Copies any value, including nested F and A values from their raw bytes. */
void table_put_field(struct table_writer *w, struct bytes key, const struct field_value *v);
size_t table_put_table_begin(struct table_writer *w, const char *key);
void table_put_table_end(struct table_writer *w, size_t mark);
size_t table_put_array_begin(struct table_writer *w, const char *key);
void table_put_array_end(struct table_writer *w, size_t mark);

/* Array element writers (no key). */
void table_array_put_field(struct table_writer *w, const struct field_value *v);
void table_array_put_int(struct table_writer *w, int64_t v);          /* 'l' */
void table_array_put_longstr(struct table_writer *w, struct bytes v); /* 'S' */
size_t table_array_put_table_begin(struct table_writer *w); /* end with table_put_table_end */
size_t table_array_put_array_begin(struct table_writer *w); /* end with table_put_array_end */

/* The table written so far. Asserts every begun value was ended; if the
 * writer overflowed, returns an empty table (check w->overflow first). */
struct table table_writer_table(const struct table_writer *w);

#endif
