/*
 * json_read.c: see json_read.h. A recursive-descent reader over one level:
 * whitespace, '{', then "key": value pairs separated by commas, '}', and
 * nothing but whitespace after it.
 */
#include "lib/json_read.h"

#include <stdio.h>
#include <string.h>

#include "lib/errors.h"
#include "lib/utf8.h"

struct reader {
    const char *p, *end;
    char *err;
    size_t err_size;
};

static bool fail(struct reader *r, const char *why)
{
    snprintf(r->err, r->err_size, "bad JSON body: %s", why);
    return false;
}

static void skip_space(struct reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static const char *read_hex4(const char **p, const char *end, uint32_t *out)
{
    if (end - *p < 4)
        return "short \\u escape";
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *(*p)++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return "bad \\u escape";
    }
    *out = v;
    return NULL;
}

const char *json_read_escape(const char **p, const char *end, uint32_t *cp)
{
    if (*p == end)
        return "unterminated string";
    char c = *(*p)++;
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *hit = c ? strchr(from, c) : NULL;
    if (hit != NULL) {
        *cp = (uint8_t)to[hit - from];
        return NULL;
    }
    if (c != 'u')
        return "bad escape";
    const char *why = read_hex4(p, end, cp);
    if (why != NULL)
        return why;
    if (*cp >= 0xdc00 && *cp <= 0xdfff)
        return "lone low surrogate";
    if (*cp >= 0xd800 && *cp <= 0xdbff) {
        uint32_t low;
        if (end - *p < 2 || (*p)[0] != '\\' || (*p)[1] != 'u')
            return "lone high surrogate";
        *p += 2;
        why = read_hex4(p, end, &low);
        if (why != NULL)
            return why;
        if (low < 0xdc00 || low > 0xdfff)
            return "bad surrogate pair";
        *cp = 0x10000 + ((*cp - 0xd800) << 10) + (low - 0xdc00);
    }
    return NULL;
}

static bool read_escape(struct reader *r, char *out, size_t cap, size_t *n)
{
    uint32_t cp;
    const char *why = json_read_escape(&r->p, r->end, &cp);
    if (why != NULL)
        return fail(r, why);
    char b[4];
    size_t k = utf8_encode(cp, b);
    if (*n + k >= cap)
        return fail(r, "string too long");
    memcpy(out + *n, b, k);
    *n += k;
    return true;
}

/* A string into out[cap] (NUL-terminated); *size_out its length. */
static bool read_string(struct reader *r, char *out, size_t cap, size_t *size_out)
{
    if (r->p == r->end || *r->p != '"')
        return fail(r, "a string expected");
    r->p++;
    size_t n = 0;
    for (;;) {
        if (r->p == r->end)
            return fail(r, "unterminated string");
        unsigned char c = (unsigned char)*r->p++;
        if (c == '"')
            break;
        if (c < 0x20)
            return fail(r, "control character in a string");
        if (c == '\\') {
            if (!read_escape(r, out, cap, &n))
                return false;
            continue;
        }
        size_t k = c < 0x80 ? 1
                            : utf8_sequence_size((const uint8_t *)r->p - 1,
                                                 (size_t)(r->end - r->p) + 1);
        if (k == 0)
            return fail(r, "a string that is not UTF-8");
        if (n + k >= cap)
            return fail(r, "string too long");
        memcpy(out + n, r->p - 1, k);
        n += k;
        r->p += k - 1;
    }
    out[n] = '\0';
    *size_out = n;
    return true;
}

static bool read_literal(struct reader *r, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0)
        return fail(r, "unexpected value");
    r->p += n;
    return true;
}

static bool read_integer(struct reader *r, int64_t *out)
{
    bool negative = r->p < r->end && *r->p == '-';
    r->p += negative;
    if (r->p == r->end || *r->p < '0' || *r->p > '9')
        return fail(r, "a number expected");
    int64_t v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        if (v > (INT64_MAX - 9) / 10)
            return fail(r, "number out of range");
        v = v * 10 + (*r->p++ - '0');
    }
    if (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E'))
        return fail(r, "numbers must be integers");
    *out = negative ? -v : v;
    return true;
}

/* ["a", "b"] as "a,b" in m->string. */
static bool read_string_list(struct reader *r, struct json_read_member *m)
{
    r->p++; /* '[' */
    size_t n = 0;
    skip_space(r);
    while (r->p < r->end && *r->p != ']') {
        if (n > 0 && *r->p++ != ',')
            return fail(r, "',' or ']' expected");
        skip_space(r);
        char one[JSON_READ_STRING_SIZE];
        size_t size;
        if (!read_string(r, one, sizeof one, &size))
            return false;
        if (memchr(one, ',', size) != NULL)
            return fail(r, "a list element with ','");
        if ((n > 0) + n + size >= sizeof m->string)
            return fail(r, "list too long");
        if (n > 0)
            m->string[n++] = ',';
        memcpy(m->string + n, one, size);
        n += size;
        skip_space(r);
    }
    if (r->p == r->end)
        return fail(r, "unterminated array");
    r->p++;
    m->string[n] = '\0';
    m->string_size = n;
    m->kind = JSON_READ_STRING_LIST;
    return true;
}

static bool read_value(struct reader *r, struct json_read_member *m)
{
    if (r->p == r->end)
        return fail(r, "a value expected");
    switch (*r->p) {
    case '"':
        m->kind = JSON_READ_STRING;
        return read_string(r, m->string, sizeof m->string, &m->string_size);
    case 't':
    case 'f':
        m->kind = JSON_READ_BOOL;
        m->boolean = *r->p == 't';
        return read_literal(r, m->boolean ? "true" : "false");
    case 'n':
        m->kind = JSON_READ_NULL;
        return read_literal(r, "null");
    case '[':
        return read_string_list(r, m);
    case '{':
        return fail(r, "nested objects are not accepted here");
    default:
        m->kind = JSON_READ_INT;
        return read_integer(r, &m->integer);
    }
}

int json_read_object(const char *text, size_t size, json_read_fn fn, void *ctx, char *err,
                     size_t err_size)
{
    struct reader r = {text, text + size, err, err_size};
    struct json_read_member m;
    skip_space(&r);
    if (r.p == r.end || *r.p++ != '{')
        return fail(&r, "an object expected"), E_SYNTAX;
    skip_space(&r);
    bool first = true;
    while (r.p < r.end && *r.p != '}') {
        if (!first && *r.p++ != ',')
            return fail(&r, "',' or '}' expected"), E_SYNTAX;
        first = false;
        skip_space(&r);
        size_t key_size;
        memset(&m, 0, sizeof m);
        if (!read_string(&r, m.key, sizeof m.key, &key_size))
            return E_SYNTAX;
        skip_space(&r);
        if (r.p == r.end || *r.p++ != ':')
            return fail(&r, "':' expected"), E_SYNTAX;
        skip_space(&r);
        if (!read_value(&r, &m))
            return E_SYNTAX;
        if (!fn(ctx, &m, err, err_size))
            return E_SYNTAX;
        skip_space(&r);
    }
    if (r.p == r.end)
        return fail(&r, "unterminated object"), E_SYNTAX;
    r.p++;
    skip_space(&r);
    if (r.p != r.end)
        return fail(&r, "data after the object"), E_SYNTAX;
    return OK;
}
