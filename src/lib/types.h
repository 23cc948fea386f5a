/*
 * types.h: the value types the AMQP codec hands out, which every layer
 * uses (hence lib/: lib/bytes.h and lib/hash.h take them too).
 *
 * Decoding is zero-copy: strings and tables are slices into the frame
 * payload they were decoded from and stay valid only while that payload
 * does (the connection's input buffer, until the method is dispatched).
 * Whoever needs a value longer must copy it.
 */
#ifndef QUAY_LIB_TYPES_H
#define QUAY_LIB_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A shortstr or longstr: ptr is borrowed, not NUL-terminated. */
struct bytes {
    const uint8_t *ptr;
    uint32_t len;
};

/* An encoded field table (the bytes after its 4-byte length prefix),
 * validated when decoded. Read it with table_iter / table_get. */
struct table {
    const uint8_t *ptr;
    uint32_t len;
};

#define BYTES_LIT(s) ((struct bytes){(const uint8_t *)(s), (uint32_t)(sizeof(s) - 1)})
/* The arguments of a "%.*s" for a struct bytes (it is not NUL-terminated). */
#define BYTES_ARG(b) (int)(b).len, (const char *)(b).ptr

static inline struct bytes bytes_of_cstr(const char *s)
{
    return (struct bytes){(const uint8_t *)s, (uint32_t)strlen(s)};
}

static inline bool bytes_equal(struct bytes a, struct bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

static inline bool bytes_equal_cstr(struct bytes a, const char *s)
{
    return bytes_equal(a, bytes_of_cstr(s));
}

static inline bool bytes_has_prefix(struct bytes a, const char *prefix)
{
    size_t n = strlen(prefix);
    return a.len >= n && memcmp(a.ptr, prefix, n) == 0;
}

#endif
