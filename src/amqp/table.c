/*
 * table.c: field-table validation, iteration and writing.
 *
 * One value reader (read_value) serves both the validator and the
 * iterators, so what validates is exactly what iterates. Validation
 * recurses into F and A values with an explicit depth bound, so a hostile
 * peer cannot exhaust the stack. Never allocates, never does I/O; readers
 * return E_SYNTAX / false on bad input, the writer asserts on its own bugs
 * and flags overflow when the caller's buffer is too small.
 */
#include "amqp/table.h"

#include <stdint.h>
#include <string.h>

#include "amqp/wire.h"
#include "lib/assert.h"
#include "lib/errors.h"

#define MARK_NONE SIZE_MAX

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static uint64_t double_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

/* Reads one typed value (letter + payload). OK, or E_SYNTAX on a bad type
 * letter or truncation. Nested F/A contents are not validated here. */
static int read_value(struct wire_reader *r, struct field_value *v)
{
    memset(v, 0, sizeof(*v));
    v->kind = wire_read_u8(r);
    switch (v->kind) {
    case 't': v->boolean = wire_read_u8(r) != 0; break;
    case 'b': v->i64 = (int8_t)wire_read_u8(r); break;
    case 'B': v->u64 = wire_read_u8(r); break;
    case 's': v->i64 = (int16_t)wire_read_u16(r); break;
    case 'u': v->u64 = wire_read_u16(r); break;
    case 'I': v->i64 = (int32_t)wire_read_u32(r); break;
    case 'i': v->u64 = wire_read_u32(r); break;
    case 'l': v->i64 = (int64_t)wire_read_u64(r); break;
    case 'T': v->u64 = wire_read_u64(r); break;
    case 'f': {
        uint32_t u = wire_read_u32(r);
        memcpy(&v->f32, &u, sizeof(u));
        break;
    }
    case 'd': {
        uint64_t u = wire_read_u64(r);
        memcpy(&v->f64, &u, sizeof(u));
        break;
    }
    case 'D':
        v->decimal.scale = wire_read_u8(r);
        v->decimal.value = wire_read_u32(r);
        break;
    case 'S':
    case 'x': v->str = wire_read_longstr(r); break;
    case 'A': v->array = wire_read_longstr(r); break;
    case 'F': {
        struct bytes b = wire_read_longstr(r);
        v->table = (struct table){b.ptr, b.len};
        break;
    }
    case 'V': break;
    default: return E_SYNTAX;
    }
    return r->failed ? E_SYNTAX : OK;
}

static int validate_array(const uint8_t *p, uint32_t len, uint32_t depth);

static int validate_table(const uint8_t *p, uint32_t len, uint32_t depth);

/* Validates the nested contents of an F or A value read at `depth`. */
static int validate_nested(const struct field_value *v, uint32_t depth)
{
    if (v->kind == 'F')
        return validate_table(v->table.ptr, v->table.len, depth + 1);
    if (v->kind == 'A')
        return validate_array(v->array.ptr, v->array.len, depth + 1);
    return OK;
}

static int validate_table(const uint8_t *p, uint32_t len, uint32_t depth)
{
    if (depth > TABLE_DEPTH_MAX)
        return E_SYNTAX;
    struct wire_reader r;
    wire_reader_init(&r, p, len);
    while (wire_reader_left(&r) > 0) {
        wire_read_shortstr(&r);
        if (r.failed)
            return E_SYNTAX;
        struct field_value v;
        int rc = read_value(&r, &v);
        if (rc != OK)
            return rc;
        rc = validate_nested(&v, depth);
        if (rc != OK)
            return rc;
    }
    return r.failed ? E_SYNTAX : OK;
}

static int validate_array(const uint8_t *p, uint32_t len, uint32_t depth)
{
    if (depth > TABLE_DEPTH_MAX)
        return E_SYNTAX;
    struct wire_reader r;
    wire_reader_init(&r, p, len);
    while (wire_reader_left(&r) > 0) {
        struct field_value v;
        int rc = read_value(&r, &v);
        if (rc != OK)
            return rc;
        rc = validate_nested(&v, depth);
        if (rc != OK)
            return rc;
    }
    return r.failed ? E_SYNTAX : OK;
}

int table_validate(const uint8_t *p, uint32_t len)
{
    ASSERT(p != NULL || len == 0);
    return validate_table(p, len, 1);
}

int table_array_validate(const uint8_t *p, uint32_t len)
{
    ASSERT(p != NULL || len == 0);
    return validate_array(p, len, 1);
}

void table_iter_init(struct table_iter *it, struct table t)
{
    ASSERT(t.ptr != NULL || t.len == 0);
    it->pos = t.ptr;
    it->end = t.len == 0 ? t.ptr : t.ptr + t.len; /* NULL + 0 is UB */
}

bool table_iter_next(struct table_iter *it, struct bytes *key, struct field_value *value)
{
    if (it->pos == it->end)
        return false;
    struct wire_reader r;
    wire_reader_init(&r, it->pos, (size_t)(it->end - it->pos));
    *key = wire_read_shortstr(&r);
    /* The table was validated when decoded: a failure here is a caller bug
     * (an unvalidated table); stop rather than read garbage. */
    if (NEVER(r.failed) || NEVER(read_value(&r, value) != OK)) {
        it->pos = it->end;
        return false;
    }
    it->pos = r.pos;
    return true;
}

bool table_get(struct table t, const char *key, struct field_value *out)
{
    ASSERT(key != NULL);
    struct table_iter it;
    table_iter_init(&it, t);
    struct bytes k;
    struct field_value v;
    while (table_iter_next(&it, &k, &v)) {
        if (bytes_equal_cstr(k, key)) {
            *out = v;
            return true;
        }
    }
    return false;
}

void array_iter_init(struct array_iter *it, struct bytes array)
{
    ASSERT(array.ptr != NULL || array.len == 0);
    it->pos = array.ptr;
    it->end = array.len == 0 ? array.ptr : array.ptr + array.len;
}

bool array_iter_next(struct array_iter *it, struct field_value *value)
{
    if (it->pos == it->end)
        return false;
    struct wire_reader r;
    wire_reader_init(&r, it->pos, (size_t)(it->end - it->pos));
    if (NEVER(read_value(&r, value) != OK)) {
        it->pos = it->end;
        return false;
    }
    it->pos = r.pos;
    return true;
}

bool field_value_as_int(const struct field_value *v, int64_t *out)
{
    switch (v->kind) {
    case 'b':
    case 's':
    case 'I':
    case 'l': *out = v->i64; return true;
    case 'B':
    case 'u':
    case 'i':
    case 'T':
        if (v->u64 > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)v->u64;
        return true;
    default: return false;
    }
}

size_t field_value_size(const struct field_value *v)
{
    switch (v->kind) {
    case 't':
    case 'b':
    case 'B': return 2;
    case 's':
    case 'u': return 3;
    case 'I':
    case 'i':
    case 'f': return 5;
    case 'l':
    case 'T':
    case 'd': return 9;
    case 'D': return 6;
    case 'S':
    case 'x': return 5 + (size_t)v->str.len;
    case 'A': return 5 + (size_t)v->array.len;
    case 'F': return 5 + (size_t)v->table.len;
    case 'V': return 1;
    default: ASSERT(0 && "unknown field value kind"); return 0;
    }
}

/* ---- writer ---- */

void table_writer_init(struct table_writer *w, uint8_t *buf, size_t cap)
{
    ASSERT(buf != NULL || cap == 0);
    w->buf = buf;
    w->cap = cap;
    w->len = 0;
    w->overflow = false;
    w->open_count = 0;
}

/* Reserves n bytes, or sets overflow and returns NULL. */
static uint8_t *reserve(struct table_writer *w, size_t n)
{
    ASSERT(w->len <= w->cap);
    if (w->overflow || !(n <= w->cap - w->len)) {
        w->overflow = true;
        return NULL;
    }
    uint8_t *p = w->buf + w->len;
    w->len += n;
    return p;
}

static void put_key(struct table_writer *w, struct bytes key)
{
    ASSERT(key.len <= 255);
    uint8_t *p = reserve(w, 1 + (size_t)key.len);
    if (p == NULL)
        return;
    p[0] = (uint8_t)key.len;
    if (key.len > 0)
        memcpy(p + 1, key.ptr, key.len);
}

static void put_sized(struct table_writer *w, uint8_t kind, const uint8_t *src, uint32_t len)
{
    uint8_t *p = reserve(w, 5 + (size_t)len);
    if (p == NULL)
        return;
    p[0] = kind;
    wire_put_u32(p + 1, len);
    if (len > 0)
        memcpy(p + 5, src, len);
}

/* Writes one typed value (letter + payload). */
static void put_value(struct table_writer *w, const struct field_value *v)
{
    if (v->kind == 'S' || v->kind == 'x') {
        put_sized(w, v->kind, v->str.ptr, v->str.len);
        return;
    }
    if (v->kind == 'A') {
        put_sized(w, 'A', v->array.ptr, v->array.len);
        return;
    }
    if (v->kind == 'F') {
        put_sized(w, 'F', v->table.ptr, v->table.len);
        return;
    }
    uint8_t *p = reserve(w, field_value_size(v));
    if (p == NULL)
        return;
    p[0] = v->kind;
    switch (v->kind) {
    case 't': p[1] = v->boolean ? 1 : 0; break;
    case 'b': p[1] = (uint8_t)(int8_t)v->i64; break;
    case 'B': p[1] = (uint8_t)v->u64; break;
    case 's': wire_put_u16(p + 1, (uint16_t)(int16_t)v->i64); break;
    case 'u': wire_put_u16(p + 1, (uint16_t)v->u64); break;
    case 'I': wire_put_u32(p + 1, (uint32_t)(int32_t)v->i64); break;
    case 'i': wire_put_u32(p + 1, (uint32_t)v->u64); break;
    case 'l': wire_put_u64(p + 1, (uint64_t)v->i64); break;
    case 'T': wire_put_u64(p + 1, v->u64); break;
    case 'f': wire_put_u32(p + 1, float_bits(v->f32)); break;
    case 'd': wire_put_u64(p + 1, double_bits(v->f64)); break;
    case 'D':
        p[1] = v->decimal.scale;
        wire_put_u32(p + 2, v->decimal.value);
        break;
    case 'V': break;
    default: ASSERT(0 && "unknown field value kind");
    }
}

void table_put_field(struct table_writer *w, struct bytes key, const struct field_value *v)
{
    put_key(w, key);
    put_value(w, v);
}

void table_put_bool(struct table_writer *w, const char *key, bool v)
{
    struct field_value f = {.kind = 't', .boolean = v};
    table_put_field(w, bytes_of_cstr(key), &f);
}

void table_put_int(struct table_writer *w, const char *key, int64_t v)
{
    struct field_value f = {.kind = 'l', .i64 = v};
    table_put_field(w, bytes_of_cstr(key), &f);
}

void table_put_i32(struct table_writer *w, const char *key, int32_t v)
{
    struct field_value f = {.kind = 'I', .i64 = v};
    table_put_field(w, bytes_of_cstr(key), &f);
}

void table_put_longstr(struct table_writer *w, const char *key, struct bytes v)
{
    struct field_value f = {.kind = 'S', .str = v};
    table_put_field(w, bytes_of_cstr(key), &f);
}

void table_put_timestamp(struct table_writer *w, const char *key, uint64_t v)
{
    struct field_value f = {.kind = 'T', .u64 = v};
    table_put_field(w, bytes_of_cstr(key), &f);
}

/* Writes the letter and a 4-byte length placeholder; returns the mark (the
 * placeholder's offset) or MARK_NONE once overflowed. */
static size_t begin_nested(struct table_writer *w, uint8_t kind)
{
    w->open_count++;
    uint8_t *p = reserve(w, 5);
    if (p == NULL)
        return MARK_NONE;
    p[0] = kind;
    wire_put_u32(p + 1, 0);
    return w->len - 4;
}

static void end_nested(struct table_writer *w, size_t mark, uint8_t kind)
{
    ASSERT(w->open_count > 0);
    w->open_count--;
    if (w->overflow)
        return;
    ASSERT(mark != MARK_NONE);
    ASSERT(mark >= 1 && w->buf[mark - 1] == kind);
    ASSERT(4 <= w->len - mark);
    size_t size = w->len - mark - 4;
    ASSERT(size <= UINT32_MAX);
    wire_put_u32(w->buf + mark, (uint32_t)size);
}

size_t table_put_table_begin(struct table_writer *w, const char *key)
{
    put_key(w, bytes_of_cstr(key));
    return begin_nested(w, 'F');
}

void table_put_table_end(struct table_writer *w, size_t mark)
{
    end_nested(w, mark, 'F');
}

size_t table_put_array_begin(struct table_writer *w, const char *key)
{
    put_key(w, bytes_of_cstr(key));
    return begin_nested(w, 'A');
}

void table_put_array_end(struct table_writer *w, size_t mark)
{
    end_nested(w, mark, 'A');
}

void table_array_put_field(struct table_writer *w, const struct field_value *v)
{
    put_value(w, v);
}

void table_array_put_int(struct table_writer *w, int64_t v)
{
    struct field_value f = {.kind = 'l', .i64 = v};
    put_value(w, &f);
}

void table_array_put_longstr(struct table_writer *w, struct bytes v)
{
    struct field_value f = {.kind = 'S', .str = v};
    put_value(w, &f);
}

size_t table_array_put_table_begin(struct table_writer *w)
{
    return begin_nested(w, 'F');
}

size_t table_array_put_array_begin(struct table_writer *w)
{
    return begin_nested(w, 'A');
}

struct table table_writer_table(const struct table_writer *w)
{
    ASSERT(w->open_count == 0);
    if (w->overflow)
        return (struct table){NULL, 0};
    ASSERT(w->len <= UINT32_MAX);
    return (struct table){w->buf, (uint32_t)w->len};
}
