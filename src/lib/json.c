/*
 * json.c: see json.h. The separator logic keeps two bits per nesting
 * level (object or array; first member or not) so nothing is allocated
 * besides the output buffer itself.
 */
#include "lib/json.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/utf8.h"

#define JSON_INITIAL_CAP 512

_Static_assert(JSON_DEPTH_MAX <= 32, "nesting bits live in uint32_t masks");

void json_init(struct json *json)
{
    memset(json, 0, sizeof *json);
}

void json_free(struct json *json)
{
    free(json->data);
    json->data = NULL;
    json_init(json);
}

char *json_release(struct json *json, size_t *size)
{
    char *data = json->data;
    *size = json->size;
    json_init(json);
    return data;
}

void json_adopt(struct json *json, char *data, size_t cap)
{
    ASSERT(data != NULL);
    ASSERT(json->depth == 0);
    ASSERT(json->size <= cap);
    if (json->size > 0)
        memcpy(data, json->data, json->size);
    free(json->data);
    json->data = data;
    json->cap = cap;
}

bool json_complete(const struct json *json)
{
    return json->done && json->depth == 0;
}

static void reserve(struct json *json, size_t n)
{
    if (json->cap - json->size >= n)
        return;
    size_t cap = json->cap ? json->cap : JSON_INITIAL_CAP;
    while (cap - json->size < n) {
        ASSERT(cap <= SIZE_MAX / 2);
        cap *= 2;
    }
    char *grown = xrealloc(json->data, cap);
    json->data = grown;
    json->cap = cap;
}

static void put(struct json *json, const void *p, size_t n)
{
    if (n == 0)
        return; /* (an empty text: its buffer may not exist yet, nor p) */
    reserve(json, n);
    memcpy(json->data + json->size, p, n);
    json->size += n;
}

static void put_char(struct json *json, char c)
{
    reserve(json, 1);
    json->data[json->size++] = c;
}

void json_raw(struct json *json, const void *data, size_t size)
{
    ASSERT(json->depth == 0);
    ASSERT(!json->done);
    put(json, data, size);
}

char *json_raw_space(struct json *json, size_t size)
{
    ASSERT(json->depth == 0);
    ASSERT(!json->done);
    reserve(json, size);
    return json->data + json->size;
}

void json_reserve(struct json *json, size_t size)
{
    if (json->cap - json->size >= size)
        return;
    ASSERT(size <= SIZE_MAX - json->size);
    size_t cap = json->size + size; /* exactly: the caller's estimate has its margin */
    char *grown = xrealloc(json->data, cap);
    json->data = grown;
    json->cap = cap;
}

void json_raw_advance(struct json *json, size_t n)
{
    ASSERT(n <= json->cap - json->size);
    json->size += n;
}

static bool level_is_object(const struct json *json)
{
    return json->depth > 0 && (json->in_object >> (json->depth - 1)) & 1u;
}

/* Before any value: the separator its position needs, and a check that a
 * value may stand here at all. */
static void before_value(struct json *json)
{
    if (json->depth == 0) {
        ASSERT(!json->done);      /* one top-level value per document */
        return;
    }
    if (level_is_object(json)) {
        ASSERT(json->key_pending); /* an object member needs its key first */
        json->key_pending = false;
        return;
    }
    uint32_t bit = 1u << (json->depth - 1);
    if (json->has_items & bit)
        put_char(json, ',');
    json->has_items |= bit;
}

static void after_value(struct json *json)
{
    if (json->depth == 0)
        json->done = true;
}

static void open_level(struct json *json, char c, bool object)
{
    before_value(json);
    ASSERT(json->depth < JSON_DEPTH_MAX);
    uint32_t bit = 1u << json->depth;
    json->depth++;
    if (object)
        json->in_object |= bit;
    else
        json->in_object &= ~bit;
    json->has_items &= ~bit;
    put_char(json, c);
}

static void close_level(struct json *json, char c, bool object)
{
    ASSERT(json->depth > 0);
    ASSERT(level_is_object(json) == object);
    ASSERT(!json->key_pending);  /* a key without its value */
    json->depth--;
    put_char(json, c);
    after_value(json);
}

void json_value_text(struct json *json, const char *text, size_t size)
{
    before_value(json);
    put(json, text, size);
    after_value(json);
}

void json_object_begin(struct json *json)
{
    open_level(json, '{', true);
}

void json_object_end(struct json *json)
{
    close_level(json, '}', true);
}

void json_array_begin(struct json *json)
{
    open_level(json, '[', false);
}

void json_array_end(struct json *json)
{
    close_level(json, ']', false);
}

void json_string_n(struct json *json, const void *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *p = s;
    before_value(json);
    put_char(json, '"');
    size_t i = 0;
    while (i < len) {
        /* Copy the longest run that needs no escaping in one go. */
        size_t run = i;
        while (run < len && p[run] >= 0x20 && p[run] < 0x80 && p[run] != '"' && p[run] != '\\')
            run++;
        put(json, p + i, run - i);
        i = run;
        if (i == len)
            break;
        uint8_t c = p[i];
        if (c >= 0x80) {
            size_t n = utf8_sequence_size(p + i, len - i);
            if (n == 0) {
                put(json, "\xEF\xBF\xBD", 3); /* U+FFFD for one bad byte */
                i++;
            } else {
                put(json, p + i, n);
                i += n;
            }
            continue;
        }
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t esc_size = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            ASSERT(c < 0x20);
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            esc_size = 6;
            break;
        }
        put(json, esc, esc_size);
        i++;
    }
    put_char(json, '"');
    after_value(json);
}

void json_string(struct json *json, const char *s)
{
    ASSERT(s != NULL);
    json_string_n(json, s, strlen(s));
}

void json_key(struct json *json, const char *key)
{
    ASSERT(level_is_object(json));
    ASSERT(!json->key_pending);
    uint32_t bit = 1u << (json->depth - 1);
    if (json->has_items & bit)
        put_char(json, ',');
    json->has_items |= bit;
    /* The key is written by the string writer, which consumes key_pending
     * as a member value would; then the value proper is due. */
    json->key_pending = true;
    json_string(json, key);
    put_char(json, ':');
    json->key_pending = true;
}

static void put_number(struct json *json, const char *text, int n)
{
    ASSERT(n > 0);
    before_value(json);
    put(json, text, (size_t)n);
    after_value(json);
}

void json_int(struct json *json, int64_t v)
{
    char text[24];
    put_number(json, text, snprintf(text, sizeof text, "%" PRId64, v));
}

void json_uint(struct json *json, uint64_t v)
{
    char text[24];
    put_number(json, text, snprintf(text, sizeof text, "%" PRIu64, v));
}

void json_double(struct json *json, double v)
{
    ASSERT(isfinite(v)); /* JSON has no NaN or infinity */
    char text[40];
    int n = 0;
    /* The shortest text that reads back as v (19.95, not 19.949999999999999). */
    for (int digits = 15; digits <= 17; digits++) {
        n = snprintf(text, sizeof text, "%.*g", digits, v);
        if (strtod(text, NULL) == v)
            break;
    }
    ASSERT(n > 0 && (size_t)n + 2 < sizeof text);
    if (strpbrk(text, ".e") == NULL) { /* still a float when read back: "2.0", not "2" */
        memcpy(text + n, ".0", 3);
        n += 2;
    }
    put_number(json, text, n);
}

void json_decimal(struct json *json, double v)
{
    ASSERT(isfinite(v));
    char text[40];
    int n = snprintf(text, sizeof text, "%.2f", v);
    ASSERT(n > 0 && (size_t)n < sizeof text);
    while (text[n - 1] == '0' && text[n - 2] != '.')
        n--; /* "0.20" -> "0.2", "3.00" -> "3.0" */
    put_number(json, text, n);
}

void json_bool(struct json *json, bool v)
{
    before_value(json);
    put(json, v ? "true" : "false", v ? 4 : 5);
    after_value(json);
}

void json_null(struct json *json)
{
    before_value(json);
    put(json, "null", 4);
    after_value(json);
}
