/*
 * ctl_json.c: see ctl_json.h. Recursive descent, depth at most
 * JSON_DEPTH_MAX; the input is the broker's answer, still checked as
 * untrusted (bad input is an error, never a crash).
 */
#include "cli/ctl_json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_DEPTH_MAX 64

struct jparser {
    const char *p;
    const char *end;
    const char *error;
};

void jfree(struct jvalue *v)
{
    while (v) {
        struct jvalue *next = v->next;
        jfree(v->child);
        free(v->text);
        free(v->key);
        free(v);
        v = next;
    }
}

static void skip_space(struct jparser *jp)
{
    while (jp->p < jp->end && *jp->p && strchr(" \t\r\n", *jp->p))
        jp->p++;
}

static bool jfail(struct jparser *jp, const char *why)
{
    if (!jp->error)
        jp->error = why;
    return false;
}

static void put_utf8(char **out, uint32_t cp)
{
    unsigned char *o = (unsigned char *)*out;
    if (cp < 0x80) {
        *o++ = (unsigned char)cp;
    } else if (cp < 0x800) {
        *o++ = (unsigned char)(0xC0 | (cp >> 6));
        *o++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (unsigned char)(0xE0 | (cp >> 12));
        *o++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (unsigned char)(0xF0 | (cp >> 18));
        *o++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (unsigned char)(0x80 | (cp & 0x3F));
    }
    *out = (char *)o;
}

static bool read_hex4(struct jparser *jp, uint32_t *out)
{
    if (jp->end - jp->p < 4)
        return jfail(jp, "truncated \\u escape");
    *out = 0;
    for (int i = 0; i < 4; i++) {
        char c = *jp->p++;
        uint32_t d = c >= '0' && c <= '9'   ? (uint32_t)(c - '0')
                     : c >= 'a' && c <= 'f' ? (uint32_t)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (uint32_t)(c - 'A' + 10)
                                            : 16;
        if (d == 16)
            return jfail(jp, "bad \\u escape");
        *out = *out << 4 | d;
    }
    return true;
}

static bool read_escape(struct jparser *jp, char **o)
{
    char c = *jp->p++;
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *hit = c ? strchr(from, c) : NULL;
    if (hit) {
        *(*o)++ = to[hit - from];
        return true;
    }
    if (c != 'u')
        return jfail(jp, "bad escape");
    uint32_t cp;
    if (!read_hex4(jp, &cp))
        return false;
    if (cp >= 0xD800 && cp < 0xDC00 && jp->end - jp->p >= 6 && jp->p[0] == '\\' &&
        jp->p[1] == 'u') {
        uint32_t low;
        jp->p += 2;
        if (!read_hex4(jp, &low))
            return false;
        cp = (low >= 0xDC00 && low < 0xE000) ? 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                                              : 0xFFFD;
    } else if (cp >= 0xD800 && cp < 0xE000) {
        cp = 0xFFFD;
    }
    put_utf8(o, cp);
    return true;
}

/* A string at jp->p (after its opening quote); returns a new C string. */
static char *read_string(struct jparser *jp)
{
    /* The decoded form is never longer than the escaped one. */
    const char *close = jp->p;
    while (close < jp->end && *close != '"')
        close += (*close == '\\' && close + 1 < jp->end) ? 2 : 1;
    if (close >= jp->end) {
        jfail(jp, "unterminated string");
        return NULL;
    }
    char *s = malloc((size_t)(close - jp->p) + 1), *o = s;
    if (!s) {
        jfail(jp, "out of memory");
        return NULL;
    }
    while (jp->p < close) {
        unsigned char c = (unsigned char)*jp->p;
        if (c < 0x20) {
            jfail(jp, "control character in a string");
            break;
        }
        if (c == '\\') {
            jp->p++;
            if (!read_escape(jp, &o))
                break;
            continue;
        }
        *o++ = (char)c;
        jp->p++;
    }
    if (jp->error || jp->p != close) {
        jfail(jp, "bad string");
        free(s);
        return NULL;
    }
    *o = '\0';
    jp->p = close + 1;
    return s;
}

static struct jvalue *read_value(struct jparser *jp, int depth);

/* Elements of an array or members of an object, after the bracket. */
static bool read_children(struct jparser *jp, struct jvalue *parent, char close, int depth)
{
    struct jvalue **tail = &parent->child;
    skip_space(jp);
    if (jp->p < jp->end && *jp->p == close) {
        jp->p++;
        return true;
    }
    for (;;) {
        char *key = NULL;
        skip_space(jp);
        if (close == '}') {
            if (jp->p >= jp->end || *jp->p != '"')
                return jfail(jp, "expected a member name");
            jp->p++;
            if (!(key = read_string(jp)))
                return false;
            skip_space(jp);
            if (jp->p >= jp->end || *jp->p != ':') {
                free(key);
                return jfail(jp, "expected ':'");
            }
            jp->p++;
        }
        struct jvalue *child = read_value(jp, depth + 1);
        if (!child) {
            free(key);
            return false;
        }
        child->key = key;
        *tail = child;
        tail = &child->next;
        skip_space(jp);
        if (jp->p < jp->end && *jp->p == ',') {
            jp->p++;
            continue;
        }
        if (jp->p < jp->end && *jp->p == close) {
            jp->p++;
            return true;
        }
        return jfail(jp, "expected ',' or a closing bracket");
    }
}

static bool read_scalar(struct jparser *jp, struct jvalue *v)
{
    static const struct { const char *word; enum jtype type; bool value; } words[] = {
        {"true", J_BOOL, true}, {"false", J_BOOL, false}, {"null", J_NULL, false}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(jp->end - jp->p) >= n && memcmp(jp->p, words[i].word, n) == 0) {
            v->type = words[i].type;
            v->boolean = words[i].value;
            jp->p += n;
            return true;
        }
    }
    const char *start = jp->p;
    while (jp->p < jp->end && *jp->p && strchr("+-0123456789.eE", *jp->p))
        jp->p++;
    if (jp->p == start)
        return jfail(jp, "unexpected character");
    v->type = J_NUMBER;
    v->text = strndup(start, (size_t)(jp->p - start));
    return v->text != NULL || jfail(jp, "out of memory");
}

static struct jvalue *read_value(struct jparser *jp, int depth)
{
    if (depth > JSON_DEPTH_MAX) {
        jfail(jp, "nested too deeply");
        return NULL;
    }
    skip_space(jp);
    if (jp->p >= jp->end) {
        jfail(jp, "unexpected end");
        return NULL;
    }
    struct jvalue *v = calloc(1, sizeof *v);
    if (!v) {
        jfail(jp, "out of memory");
        return NULL;
    }
    bool ok;
    char c = *jp->p;
    if (c == '{' || c == '[') {
        jp->p++;
        v->type = c == '{' ? J_OBJECT : J_ARRAY;
        ok = read_children(jp, v, c == '{' ? '}' : ']', depth);
    } else if (c == '"') {
        jp->p++;
        v->type = J_STRING;
        ok = (v->text = read_string(jp)) != NULL;
    } else {
        ok = read_scalar(jp, v);
    }
    if (!ok) {
        jfree(v);
        return NULL;
    }
    return v;
}

struct jvalue *json_parse(const char *text, size_t size, const char **error)
{
    struct jparser jp = {.p = text, .end = text + size};
    struct jvalue *v = read_value(&jp, 0);
    skip_space(&jp);
    if (v && jp.p != jp.end) {
        jfail(&jp, "trailing bytes");
        jfree(v);
        v = NULL;
    }
    *error = jp.error;
    return v;
}

/* An object's member by a key of len bytes (not terminated), or NULL. */
static const struct jvalue *member(const struct jvalue *object, const char *key, size_t len)
{
    if (!object || object->type != J_OBJECT)
        return NULL;
    for (const struct jvalue *m = object->child; m; m = m->next) {
        if (strncmp(m->key, key, len) == 0 && m->key[len] == '\0')
            return m;
    }
    return NULL;
}

const struct jvalue *jget_path(const struct jvalue *object, const char *path)
{
    const char *dot;
    while (object != NULL && (dot = strchr(path, '.')) != NULL) {
        object = member(object, path, (size_t)(dot - path));
        path = dot + 1;
    }
    return jget(object, path);
}

const struct jvalue *jget(const struct jvalue *object, const char *key)
{
    return member(object, key, strlen(key));
}

