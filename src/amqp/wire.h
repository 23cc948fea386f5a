/*
 * wire.h: big-endian primitives for the AMQP codec.
 *
 * Owns the two cursors every decoder and encoder in src/amqp/ uses:
 * struct wire_reader (bounds-checked reads that latch a failure flag) and
 * struct wire_writer (bounded writes that latch an overflow flag). The raw
 * wire_get_* / wire_put_* helpers do no bounds checking: callers check
 * first, always as `n <= end - pos`, never `pos + n <= end` (the latter
 * can overflow the pointer and is undefined behaviour).
 *
 * Must never allocate, do I/O, or read or write outside [pos, end).
 */
#ifndef QUAY_AMQP_WIRE_H
#define QUAY_AMQP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lib/types.h"

static inline uint16_t wire_get_u16(const uint8_t *p)
{
    return (uint16_t)((uint16_t)(p[0] << 8) | p[1]);
}

static inline uint32_t wire_get_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
           (uint32_t)p[3];
}

static inline uint64_t wire_get_u64(const uint8_t *p)
{
    return ((uint64_t)wire_get_u32(p) << 32) | (uint64_t)wire_get_u32(p + 4);
}

static inline void wire_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void wire_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void wire_put_u64(uint8_t *p, uint64_t v)
{
    wire_put_u32(p, (uint32_t)(v >> 32));
    wire_put_u32(p + 4, (uint32_t)v);
}

/*
 * A read cursor over [pos, end). Once a read runs past the end, `failed`
 * stays set, pos stops moving and every later read returns zero/empty, so
 * straight-line decoders check the flag once at the end.
 */
struct wire_reader {
    const uint8_t *pos;
    const uint8_t *end;
    bool failed;
};

static inline void wire_reader_init(struct wire_reader *r, const uint8_t *p, size_t len)
{
    r->pos = p;
    r->end = len == 0 ? p : p + len; /* NULL + 0 is undefined behaviour */
    r->failed = false;
}

/* Bytes left to read (0 once failed). */
static inline size_t wire_reader_left(const struct wire_reader *r)
{
    return r->failed ? 0 : (size_t)(r->end - r->pos);
}

/* Returns a pointer to the next n bytes and advances, or NULL (and fails). */
static inline const uint8_t *wire_read_raw(struct wire_reader *r, size_t n)
{
    if (r->failed || !(n <= (size_t)(r->end - r->pos))) {
        r->failed = true;
        return NULL;
    }
    const uint8_t *p = r->pos;
    r->pos += n;
    return p;
}

static inline uint8_t wire_read_u8(struct wire_reader *r)
{
    const uint8_t *p = wire_read_raw(r, 1);
    return p ? p[0] : 0;
}

static inline uint16_t wire_read_u16(struct wire_reader *r)
{
    const uint8_t *p = wire_read_raw(r, 2);
    return p ? wire_get_u16(p) : 0;
}

static inline uint32_t wire_read_u32(struct wire_reader *r)
{
    const uint8_t *p = wire_read_raw(r, 4);
    return p ? wire_get_u32(p) : 0;
}

static inline uint64_t wire_read_u64(struct wire_reader *r)
{
    const uint8_t *p = wire_read_raw(r, 8);
    return p ? wire_get_u64(p) : 0;
}

/* shortstr: u8 length + bytes; the result borrows from the input. */
static inline struct bytes wire_read_shortstr(struct wire_reader *r)
{
    uint8_t len = wire_read_u8(r);
    const uint8_t *p = wire_read_raw(r, len);
    return p ? (struct bytes){p, len} : (struct bytes){NULL, 0};
}

/* longstr: u32 length + bytes; the result borrows from the input. */
static inline struct bytes wire_read_longstr(struct wire_reader *r)
{
    uint32_t len = wire_read_u32(r);
    const uint8_t *p = wire_read_raw(r, len);
    return p ? (struct bytes){p, len} : (struct bytes){NULL, 0};
}

/*
 * A write cursor over [pos, end). A write that does not fit sets
 * `overflow`, writes nothing, and makes every later write a no-op, so the
 * caller checks once at the end. Writers size their own buffers, so an
 * overflow is an answer ("needs a bigger buffer"), not a peer error.
 */
struct wire_writer {
    uint8_t *start;
    uint8_t *pos;
    uint8_t *end;
    bool overflow;
};

static inline void wire_writer_init(struct wire_writer *w, uint8_t *p, size_t cap)
{
    w->start = p;
    w->pos = p;
    w->end = cap == 0 ? p : p + cap;
    w->overflow = false;
}

static inline size_t wire_writer_len(const struct wire_writer *w)
{
    return (size_t)(w->pos - w->start);
}

/* Reserves n bytes and returns them, or NULL (and sets overflow). */
static inline uint8_t *wire_write_raw(struct wire_writer *w, size_t n)
{
    if (w->overflow || !(n <= (size_t)(w->end - w->pos))) {
        w->overflow = true;
        return NULL;
    }
    uint8_t *p = w->pos;
    w->pos += n;
    return p;
}

static inline void wire_write_u8(struct wire_writer *w, uint8_t v)
{
    uint8_t *p = wire_write_raw(w, 1);
    if (p)
        p[0] = v;
}

static inline void wire_write_u16(struct wire_writer *w, uint16_t v)
{
    uint8_t *p = wire_write_raw(w, 2);
    if (p)
        wire_put_u16(p, v);
}

static inline void wire_write_u32(struct wire_writer *w, uint32_t v)
{
    uint8_t *p = wire_write_raw(w, 4);
    if (p)
        wire_put_u32(p, v);
}

static inline void wire_write_u64(struct wire_writer *w, uint64_t v)
{
    uint8_t *p = wire_write_raw(w, 8);
    if (p)
        wire_put_u64(p, v);
}

static inline void wire_write_bytes(struct wire_writer *w, const uint8_t *src, size_t n)
{
    uint8_t *p = wire_write_raw(w, n);
    if (p && n > 0)
        memcpy(p, src, n);
}

/* The caller asserts len <= 255 first: an over-long shortstr is a writer bug. */
static inline void wire_write_shortstr(struct wire_writer *w, struct bytes s)
{
    wire_write_u8(w, (uint8_t)s.len);
    wire_write_bytes(w, s.ptr, s.len);
}

static inline void wire_write_longstr(struct wire_writer *w, struct bytes s)
{
    wire_write_u32(w, s.len);
    wire_write_bytes(w, s.ptr, s.len);
}

#endif
