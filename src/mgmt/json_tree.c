/*
 * json_tree.c: see json_tree.h. A recursive-descent parser; recursion is
 * bounded by JSON_TREE_DEPTH_MAX. Unescaped strings go into one buffer of
 * the input's size (unescaping never grows a string, and each string's
 * NUL takes the place of at least its closing quote).
 */
#include "mgmt/json_tree.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/json_read.h"
#include "lib/utf8.h"

struct parser {
    struct json_tree *tree;
    const char *start, *p, *end;
    char *err;
    size_t err_size;
    bool failed;
};

/* Where the parser stands, as a person counts: line and column from 1. */
static bool fail(struct parser *ps, const char *why)
{
    if (ps->failed)
        return false;
    ps->failed = true;
    size_t line = 1, column = 1;
    for (const char *c = ps->start; c < ps->p && c < ps->end; c++) {
        if (*c == '\n')
            line++, column = 1;
        else
            column++;
    }
    snprintf(ps->err, ps->err_size, "malformed JSON at line %zu, column %zu (byte %zu): %s",
             line, column, (size_t)(ps->p - ps->start), why);
    return false;
}

static void skip_space(struct parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static uint32_t new_node(struct parser *ps, enum json_kind kind)
{
    struct json_tree *t = ps->tree;
    if (t->count == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->nodes = xrealloc(t->nodes, t->cap * sizeof *t->nodes);
    }
    uint32_t i = t->count++;
    t->nodes[i] = (struct json_node){.kind = kind, .first_child = JSON_TREE_NONE,
                                     .next = JSON_TREE_NONE};
    return i;
}

/* Unescaped into the tree's buffer: the escape's UTF-8 is never longer
 * than the escape (a 4-byte sequence comes of a 12-byte pair). */
static bool read_escape(struct parser *ps)
{
    uint32_t cp;
    const char *why = json_read_escape(&ps->p, ps->end, &cp);
    if (why != NULL)
        return fail(ps, why);
    struct json_tree *t = ps->tree;
    t->strings_size += utf8_encode(cp, t->strings + t->strings_size);
    return true;
}

/* A string, unescaped into the tree's buffer. */
static bool read_string(struct parser *ps, const char **out, uint32_t *out_size)
{
    struct json_tree *t = ps->tree;
    if (ps->p == ps->end || *ps->p != '"')
        return fail(ps, "a string expected");
    ps->p++;
    size_t begin = t->strings_size;
    for (;;) {
        if (ps->p == ps->end)
            return fail(ps, "unterminated string");
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"')
            break;
        if (c < 0x20)
            return fail(ps, "control character in a string");
        if (c == '\\') {
            ps->p++;
            if (!read_escape(ps))
                return false;
            continue;
        }
        size_t k = c < 0x80 ? 1
                            : utf8_sequence_size((const uint8_t *)ps->p,
                                                 (size_t)(ps->end - ps->p));
        if (k == 0)
            return fail(ps, "a string that is not UTF-8");
        memcpy(t->strings + t->strings_size, ps->p, k);
        t->strings_size += k;
        ps->p += k;
    }
    ps->p++;
    t->strings[t->strings_size++] = '\0';
    *out = t->strings + begin;
    *out_size = (uint32_t)(t->strings_size - begin - 1);
    return true;
}

static bool read_literal(struct parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return fail(ps, "unexpected character (a value expected)");
    ps->p += n;
    return true;
}

/* RFC 8259's number grammar; the integer value too when there is one. */
static bool read_number(struct parser *ps, struct json_node *n)
{
    const char *begin = ps->p;
    if (ps->p < ps->end && *ps->p == '-')
        ps->p++;
    if (ps->p == ps->end || *ps->p < '0' || *ps->p > '9')
        return fail(ps, "unexpected character (a value expected)");
    if (*ps->p == '0' && ps->end - ps->p > 1 && ps->p[1] >= '0' && ps->p[1] <= '9')
        return fail(ps, "a number with a leading zero");
    bool integer = true;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
        ps->p++;
    if (ps->p < ps->end && *ps->p == '.') {
        integer = false;
        ps->p++;
        if (ps->p == ps->end || *ps->p < '0' || *ps->p > '9')
            return fail(ps, "a digit expected after '.'");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        integer = false;
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (ps->p == ps->end || *ps->p < '0' || *ps->p > '9')
            return fail(ps, "a digit expected in the exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    char buf[64];
    size_t len = (size_t)(ps->p - begin);
    if (len >= sizeof buf)
        return fail(ps, "a number too long");
    memcpy(buf, begin, len);
    buf[len] = '\0';
    n->number = strtod(buf, NULL);
    if (integer && len <= 18) {
        n->is_integer = true;
        n->integer = strtoll(buf, NULL, 10);
    }
    if (!isfinite(n->number))
        return fail(ps, "a number out of range");
    return true;
}

static bool read_value(struct parser *ps, uint32_t depth, uint32_t *out);

/* The members of an object or the items of an array, after its '{'/'['. */
static bool read_children(struct parser *ps, uint32_t parent, bool object, uint32_t depth)
{
    char close = object ? '}' : ']';
    uint32_t last = JSON_TREE_NONE;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return true;
    }
    for (;;) {
        skip_space(ps);
        const char *key = NULL;
        uint32_t key_size = 0;
        if (object) {
            if (!read_string(ps, &key, &key_size))
                return false;
            skip_space(ps);
            if (ps->p == ps->end || *ps->p != ':')
                return fail(ps, "':' expected after a member name");
            ps->p++;
            skip_space(ps);
        }
        uint32_t child;
        if (!read_value(ps, depth + 1, &child))
            return false;
        struct json_node *nodes = ps->tree->nodes;
        nodes[child].key = key;
        nodes[child].key_size = key_size;
        if (last == JSON_TREE_NONE)
            nodes[parent].first_child = child;
        else
            nodes[last].next = child;
        last = child;
        nodes[parent].children_count++;
        skip_space(ps);
        if (ps->p == ps->end)
            return fail(ps, object ? "unterminated object" : "unterminated array");
        char c = *ps->p++;
        if (c == close)
            return true;
        if (c != ',') {
            ps->p--;
            return fail(ps, object ? "',' or '}' expected" : "',' or ']' expected");
        }
    }
}

static bool read_value(struct parser *ps, uint32_t depth, uint32_t *out)
{
    if (depth > JSON_TREE_DEPTH_MAX)
        return fail(ps, "nested too deeply");
    if (ps->p == ps->end)
        return fail(ps, "a value expected");
    char c = *ps->p;
    uint32_t i;
    switch (c) {
    case '{':
    case '[':
        i = new_node(ps, c == '{' ? JSON_KIND_OBJECT : JSON_KIND_ARRAY);
        ps->p++;
        *out = i;
        return read_children(ps, i, c == '{', depth);
    case '"': {
        i = new_node(ps, JSON_KIND_STRING);
        const char *s;
        uint32_t size;
        if (!read_string(ps, &s, &size))
            return false;
        ps->tree->nodes[i].string = s;
        ps->tree->nodes[i].string_size = size;
        *out = i;
        return true;
    }
    case 't':
    case 'f':
        i = new_node(ps, JSON_KIND_BOOL);
        ps->tree->nodes[i].boolean = c == 't';
        *out = i;
        return read_literal(ps, c == 't' ? "true" : "false");
    case 'n':
        *out = new_node(ps, JSON_KIND_NULL);
        return read_literal(ps, "null");
    default:
        i = new_node(ps, JSON_KIND_NUMBER);
        *out = i;
        return read_number(ps, &ps->tree->nodes[i]);
    }
}

int json_tree_parse(struct json_tree *tree, const char *text, size_t size, char *err,
                    size_t err_size)
{
    ASSERT(tree != NULL);
    memset(tree, 0, sizeof *tree);
    tree->strings = xmalloc(size + 1);
    struct parser ps = {tree, text, text, text + size, err, err_size, false};
    skip_space(&ps);
    uint32_t root;
    bool ok = read_value(&ps, 1, &root);
    if (ok) {
        ASSERT(root == 0);
        skip_space(&ps);
        if (ps.p != ps.end)
            ok = fail(&ps, "data after the document");
    }
    if (!ok) {
        json_tree_free(tree);
        return E_SYNTAX;
    }
    ASSERT(tree->strings_size <= size + 1);
    return OK;
}

void json_tree_free(struct json_tree *tree)
{
    free(tree->nodes);
    free(tree->strings);
    memset(tree, 0, sizeof *tree);
}

const struct json_node *json_tree_first(const struct json_tree *tree, const struct json_node *n)
{
    return n->first_child == JSON_TREE_NONE ? NULL : &tree->nodes[n->first_child];
}

const struct json_node *json_tree_next(const struct json_tree *tree, const struct json_node *c)
{
    return c->next == JSON_TREE_NONE ? NULL : &tree->nodes[c->next];
}

const struct json_node *json_tree_get(const struct json_tree *tree, const struct json_node *obj,
                                      const char *key)
{
    if (obj == NULL || obj->kind != JSON_KIND_OBJECT)
        return NULL;
    const struct json_node *found = NULL;
    for (const struct json_node *c = json_tree_first(tree, obj); c; c = json_tree_next(tree, c)) {
        if (strcmp(c->key, key) == 0)
            found = c; /* the last one wins, as in most readers */
    }
    return found;
}

bool json_tree_get_bool(const struct json_tree *tree, const struct json_node *obj,
                        const char *key, bool dflt, bool *out)
{
    const struct json_node *n = json_tree_get(tree, obj, key);
    *out = dflt;
    if (n == NULL || n->kind == JSON_KIND_NULL)
        return true;
    if (n->kind == JSON_KIND_BOOL) {
        *out = n->boolean;
        return true;
    }
    if (n->kind == JSON_KIND_STRING && (strcmp(n->string, "true") == 0 ||
                                        strcmp(n->string, "false") == 0)) {
        *out = n->string[0] == 't';
        return true;
    }
    return false;
}
