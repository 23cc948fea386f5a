/*
 * json.h: a tiny streaming JSON writer into a growable buffer, for the
 * management API's responses (and the cluster's endpoints and records:
 * in lib/ so that cluster/ needs nothing from mgmt/).
 *
 * Values are written in document order: json_object_begin, json_key and a
 * value, ..., json_object_end. The writer inserts the commas and colons, so
 * a caller never formats JSON by hand. Strings are escaped as RFC 8259
 * requires (quote, backslash, control characters); valid UTF-8 passes
 * through unchanged and each byte of an invalid sequence becomes U+FFFD,
 * so the output is always valid JSON even for arbitrary AMQP names.
 *
 * Misuse (a value where a key is due, unbalanced ends, nesting beyond
 * JSON_DEPTH_MAX) is a programmer error and asserts: the caller decides
 * the document's shape, not its input. Running out of memory aborts, as
 * everywhere in quay.
 *
 * Memory: struct json owns its buffer until json_free, or until
 * json_release hands it to the caller. The buffer is not NUL-terminated.
 * json.c does no I/O and keeps no global state.
 */
#ifndef QUAY_LIB_JSON_H
#define QUAY_LIB_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_DEPTH_MAX 32

struct json {
    char *data;                /* owned; NULL until the first byte */
    size_t size;               /* bytes written */
    size_t cap;
    uint32_t depth;            /* open objects and arrays */
    uint32_t in_object;        /* bit d: level d+1 is an object (else an array) */
    uint32_t has_items;        /* bit d: level d+1 has at least one member */
    bool key_pending;          /* a key was written, its value is due */
    bool done;                 /* a complete top-level value was written */
};

void json_init(struct json *json);
void json_free(struct json *json);
/* Hands the buffer to the caller (free() it) and resets the writer. */
char *json_release(struct json *json, size_t *size);
/* Moves what json holds into data (malloc'd, cap >= json's size; json
 * owns it now) and frees json's own buffer: a caller's buffer, kept warm
 * from an earlier use, for a large text (json_raw only so far). */
void json_adopt(struct json *json, char *data, size_t cap);
/* True once one complete top-level value has been written. */
bool json_complete(const struct json *json);

/* Appends bytes as they are, outside the JSON grammar: space an envelope
 * (an HTTP header) will fill in later. Only before the first value. */
void json_raw(struct json *json, const void *data, size_t size);

/* Room for size more raw bytes, under json_raw's rules: returns where to
 * write them; json_raw_advance(json, n) then counts the n <= size written.
 * For writers of other text formats that write piece by piece (prom.c). */
char *json_raw_space(struct json *json, size_t size);
void json_raw_advance(struct json *json, size_t n);
/* Room for size more bytes at any point of the text: a writer that can
 * tell how long its text will be grows the buffer once, early, instead
 * of by doubling, each a copy of all so far (MBs, for a long list). */
void json_reserve(struct json *json, size_t size);

/* One complete JSON value written by another writer (trusted: not
 * checked), as the next value here: an array's items kept as text. */
void json_value_text(struct json *json, const char *text, size_t size);
void json_object_begin(struct json *json);
void json_object_end(struct json *json);
void json_array_begin(struct json *json);
void json_array_end(struct json *json);
/* A member name inside an object; the next call writes its value. */
void json_key(struct json *json, const char *key);

void json_string(struct json *json, const char *s);
void json_string_n(struct json *json, const void *s, size_t len);
void json_int(struct json *json, int64_t v);
void json_uint(struct json *json, uint64_t v);
/* Finite only; the shortest text that reads back as v, always with a
 * fraction or an exponent ("2.0", "19.95", "1e+300"). */
void json_double(struct json *json, double v);
/* Finite, to two decimals and always with a fraction ("3.0", "0.25"), as
 * RabbitMQ's rates read; -0.0 reads "-0.0". */
void json_decimal(struct json *json, double v);
void json_bool(struct json *json, bool v);
void json_null(struct json *json);


/* Shorthands for one object member. */
static inline void json_kv_string(struct json *json, const char *key, const char *s)
{
    json_key(json, key);
    json_string(json, s);
}
static inline void json_kv_uint(struct json *json, const char *key, uint64_t v)
{
    json_key(json, key);
    json_uint(json, v);
}
static inline void json_kv_bool(struct json *json, const char *key, bool v)
{
    json_key(json, key);
    json_bool(json, v);
}

#endif
