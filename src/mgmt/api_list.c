/*
 * api_list.c: see api_list.h.
 */
#include "mgmt/api_list.h"
#include "mgmt/api_list_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

#define PAGE_SIZE_DEFAULT 100
#define PAGE_SIZE_MAX 500

void api_answer_not_found(struct http_call *call)
{
    http_call_answer_error_as(call, 404, "Object Not Found", "Not Found");
}

void api_answer_bad_request(struct http_call *call, const char *reason)
{
    http_call_answer_error_as(call, 400, "bad_request", reason);
}

bool api_path_parse(struct http_call *call, const struct http_call_request *req,
                    struct api_path *path)
{
    path->count = 0;
    const char *p = req->rest, *end = req->rest + req->rest_size;
    while (p < end) {
        const char *slash = memchr(p, '/', (size_t)(end - p));
        const char *seg_end = slash ? slash : end;
        long n = path->count < API_PATH_SEGMENTS_MAX
                     ? http_percent_decode(p, (size_t)(seg_end - p), path->text[path->count],
                              API_SEGMENT_SIZE_MAX, false)
                     : -1;
        /* An empty segment is only RabbitMQ's empty source of a default
         * exchange binding (".../e//q/...") or amq.default's, kept as "". */
        if (n < 0) {
            api_answer_not_found(call);
            return false;
        }
        path->seg[path->count] = (struct bytes){path->text[path->count], (uint32_t)n};
        path->count++;
        p = slash ? slash + 1 : end;
        if (slash && p == end) { /* a trailing '/' names nothing more */
            break;
        }
    }
    return true;
}

bool api_path_is(const struct api_path *path, uint32_t i, const char *word)
{
    return i < path->count && path->seg[i].len == strlen(word) &&
           memcmp(path->seg[i].ptr, word, path->seg[i].len) == 0;
}

bool api_query_get(const struct http_call_request *req, const char *key, char *out, size_t cap)
{
    size_t key_size = strlen(key);
    const char *p = req->query, *end = req->query + req->query_size;
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *item_end = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(item_end - p));
        if (eq && (size_t)(eq - p) == key_size && memcmp(p, key, key_size) == 0) {
            long n = http_percent_decode(eq + 1, (size_t)(item_end - eq - 1), (uint8_t *)out,
                                         cap - 1, true);
            if (n < 0)
                return false;
            out[n] = '\0';
            return true;
        }
        p = amp ? amp + 1 : end;
    }
    return false;
}

/* ---- writing a tree back ------------------------------------------------- */

void api_write_node(struct json *out, const struct json_tree *tree, const struct json_node *n)
{
    switch (n->kind) {
    case JSON_KIND_NULL: json_null(out); return;
    case JSON_KIND_BOOL: json_bool(out, n->boolean); return;
    case JSON_KIND_NUMBER:
        if (n->is_integer)
            json_int(out, n->integer);
        else
            json_double(out, n->number);
        return;
    case JSON_KIND_STRING: json_string_n(out, n->string, n->string_size); return;
    case JSON_KIND_ARRAY:
    case JSON_KIND_OBJECT: {
        bool object = n->kind == JSON_KIND_OBJECT;
        object ? json_object_begin(out) : json_array_begin(out);
        for (const struct json_node *c = json_tree_first(tree, n); c; c = json_tree_next(tree, c)) {
            if (object)
                json_key(out, c->key);
            api_write_node(out, tree, c);
        }
        object ? json_object_end(out) : json_array_end(out);
        return;
    }
    }
}

void api_list__columns_parse(const struct http_call_request *req, struct columns *c)
{
    c->count = 0;
    if (!api_query_get(req, "columns", c->text, sizeof c->text))
        return;
    char *p = c->text;
    while (*p && c->count < COLUMNS_MAX) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (*p)
            c->name[c->count++] = p;
        if (!comma)
            break;
        p = comma + 1;
    }
}

/* Writes the members of object n that the columns (relative to prefix
 * of prefix_size bytes) select. */
static void write_columns(struct json *out, const struct json_tree *tree,
                          const struct json_node *n, const struct columns *cols,
                          const char *prefix, size_t prefix_size)
{
    json_object_begin(out);
    for (const struct json_node *c = json_tree_first(tree, n); c; c = json_tree_next(tree, c)) {
        bool whole = false, part = false;
        for (uint32_t i = 0; i < cols->count; i++) {
            const char *name = cols->name[i];
            if (strncmp(name, prefix, prefix_size) != 0)
                continue;
            const char *rest = name + prefix_size;
            size_t k = c->key_size;
            if (strncmp(rest, c->key, k) == 0 && rest[k] == '\0')
                whole = true;
            else if (strncmp(rest, c->key, k) == 0 && rest[k] == '.')
                part = true;
        }
        if (whole) {
            json_key(out, c->key);
            api_write_node(out, tree, c);
        } else if (part && c->kind == JSON_KIND_OBJECT) {
            char sub[QUERY_VALUE_SIZE_MAX];
            int m = snprintf(sub, sizeof sub, "%.*s%s.", (int)prefix_size, prefix, c->key);
            if (m > 0 && (size_t)m < sizeof sub) {
                json_key(out, c->key);
                write_columns(out, tree, c, cols, sub, (size_t)m);
            }
        }
    }
    json_object_end(out);
}

void api_list__write_item(struct json *out, const struct json_tree *tree,
                          const struct json_node *n, const struct columns *cols)
{
    if (cols->count > 0 && n->kind == JSON_KIND_OBJECT)
        write_columns(out, tree, n, cols, "", 0);
    else
        api_write_node(out, tree, n);
}

/* ---- sorting --------------------------------------------------------------- */

struct sort_ctx {
    const struct json_tree *tree;
    char keys[QUERY_VALUE_SIZE_MAX]; /* "a.b,c": fields in order of precedence */
    bool reverse;
};

const struct json_node *api_list__field_at(const struct json_tree *tree, const struct json_node *n,
                                        const char *path, size_t path_size)
{
    char part[256];
    while (n != NULL && path_size > 0) {
        const char *dot = memchr(path, '.', path_size);
        size_t k = dot ? (size_t)(dot - path) : path_size;
        if (k >= sizeof part)
            return NULL;
        memcpy(part, path, k);
        part[k] = '\0';
        n = json_tree_get(tree, n, part);
        path += dot ? k + 1 : k;
        path_size -= dot ? k + 1 : k;
    }
    return n;
}

static int compare_values(const struct json_node *a, const struct json_node *b)
{
    if (a == NULL || b == NULL)
        return (a == NULL) - (b == NULL); /* missing last */
    if (a->kind == JSON_KIND_NUMBER && b->kind == JSON_KIND_NUMBER)
        return (a->number > b->number) - (a->number < b->number);
    if (a->kind == JSON_KIND_STRING && b->kind == JSON_KIND_STRING) {
        size_t n = a->string_size < b->string_size ? a->string_size : b->string_size;
        int c = memcmp(a->string, b->string, n);
        return c ? c : (a->string_size > b->string_size) - (a->string_size < b->string_size);
    }
    return (int)a->kind - (int)b->kind;
}

/* Sort keys are looked up once per item, not once per comparison: an
 * object's field is found by a walk over its members (json_tree_get), and
 * sorting 50,000 queues compares each ~16 times, all in one loop turn. */

struct sort_row {
    const struct json_node *item;
    const struct json_node *keys[SORT_KEYS_MAX];
};

static _Thread_local const struct sort_ctx *sort_now; /* qsort has no context argument */
static _Thread_local uint32_t sort_keys_count;

static int compare_rows(const void *x, const void *y)
{
    const struct sort_row *a = x, *b = y;
    for (uint32_t k = 0; k < sort_keys_count; k++) {
        int c = compare_values(a->keys[k], b->keys[k]);
        if (c != 0)
            return sort_now->reverse ? -c : c;
    }
    return 0;
}

/* Sorts items[0, n) by s's keys (at most SORT_KEYS_MAX of them: further
 * ones are ignored). */
static void sort_items(const struct sort_ctx *s, const struct json_node **items, size_t n)
{
    const char *starts[SORT_KEYS_MAX];
    size_t sizes[SORT_KEYS_MAX];
    uint32_t keys = 0;
    for (const char *p = s->keys; *p && keys < SORT_KEYS_MAX;) {
        const char *comma = strchr(p, ',');
        size_t k = comma ? (size_t)(comma - p) : strlen(p);
        starts[keys] = p;
        sizes[keys++] = k;
        p += comma ? k + 1 : k;
    }
    struct sort_row *rows = xmalloc((n + 1) * sizeof *rows);
    for (size_t i = 0; i < n; i++) {
        rows[i].item = items[i];
        for (uint32_t k = 0; k < keys; k++)
            rows[i].keys[k] = api_list__field_at(s->tree, items[i], starts[k], sizes[k]);
    }
    sort_now = s;
    sort_keys_count = keys;
    qsort(rows, n, sizeof *rows, compare_rows);
    sort_now = NULL;
    for (size_t i = 0; i < n; i++)
        items[i] = rows[i].item;
    free(rows);
}

bool api_list__sort_keys(const struct http_call_request *req, const char *default_sort,
                         char keys[QUERY_VALUE_SIZE_MAX], bool *reverse)
{
    bool asked = api_query_get(req, "sort", keys, QUERY_VALUE_SIZE_MAX) && keys[0] != '\0';
    if (!asked)
        snprintf(keys, QUERY_VALUE_SIZE_MAX, "%s", default_sort);
    else if (strlen(keys) + 1 + strlen(default_sort) < QUERY_VALUE_SIZE_MAX)
        /* Ties (and a field the items lack) keep the default order, as in
         * RabbitMQ, not the tables' hash order. */
        snprintf(keys + strlen(keys), QUERY_VALUE_SIZE_MAX - strlen(keys), ",%s", default_sort);
    char text[8];
    *reverse = api_query_get(req, "sort_reverse", text, sizeof text) && strcmp(text, "true") == 0;
    return asked;
}

/* ---- answers --------------------------------------------------------------- */

static bool parse_positive(const char *text, long *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || v < 1)
        return false;
    *out = v;
    return true;
}

bool api_name_filter_parse(const struct http_call_request *req, struct api_name_filter *f)
{
    char flag[8];
    memset(f, 0, sizeof *f);
    if (!api_query_get(req, "name", f->text, sizeof f->text))
        f->text[0] = '\0';
    f->regex = f->text[0] != '\0' && api_query_get(req, "use_regex", flag, sizeof flag) &&
               strcmp(flag, "true") == 0;
    if (f->regex && regcomp(&f->compiled, f->text, REG_EXTENDED | REG_ICASE | REG_NOSUB) != 0) {
        f->regex = false;
        return false;
    }
    return true;
}

void api_name_filter_free(struct api_name_filter *f)
{
    if (f->regex)
        regfree(&f->compiled);
    f->regex = false;
}

static unsigned char lower(unsigned char c)
{
    return c >= 'A' && c <= 'Z' ? (unsigned char)(c - 'A' + 'a') : c;
}

bool api_name_filter_matches(const struct api_name_filter *f, struct bytes name)
{
    if (f->text[0] == '\0')
        return true;
    if (f->regex) {
        char text[1024]; /* (a name is at most 255 bytes; a NUL in one ends it here) */
        size_t n = name.len < sizeof text - 1 ? name.len : sizeof text - 1;
        memcpy(text, name.ptr, n);
        text[n] = '\0';
        return regexec(&f->compiled, text, 0, NULL, 0) == 0;
    }
    size_t want = strlen(f->text);
    for (size_t at = 0; at + want <= name.len; at++) {
        size_t k = 0;
        while (k < want && lower(name.ptr[at + k]) == lower((unsigned char)f->text[k]))
            k++;
        if (k == want)
            return true;
    }
    return false;
}

/* Items whose name f keeps (RabbitMQ's name= filter). */
bool api_list__name_matches(const struct json_tree *tree, const struct json_node *n,
                            const struct api_name_filter *f)
{
    const struct json_node *name = json_tree_get(tree, n, "name");
    if (f->text[0] == '\0')
        return true;
    return name != NULL && name->kind == JSON_KIND_STRING &&
           api_name_filter_matches(f, bytes_of_cstr(name->string));
}

bool api_list__name_parse(struct http_call *call, const struct http_call_request *req,
                          struct api_name_filter *f)
{
    if (api_name_filter_parse(req, f))
        return true;
    api_answer_bad_request(call, "Pagination parameters are invalid");
    return false;
}

/* A query number: 1 valid, 0 absent, -1 not a number. */
static int query_number(const struct http_call_request *req, const char *key, char *text,
                        size_t size, long *out)
{
    if (!api_query_get(req, key, text, size))
        return 0;
    char *end;
    *out = strtol(text, &end, 10);
    return *text != '\0' && *end == '\0' ? 1 : -1;
}

/* page= and page_size=: false once answered 400 with RabbitMQ 3.10's
 * words (a word that is not a number, or numbers out of bounds). */
bool api_list__page_parse(struct http_call *call, const struct http_call_request *req, bool *paged,
                       long *page, long *page_size)
{
    char page_text[32] = "", size_text[32] = "undefined";
    *page = 1;
    *page_size = PAGE_SIZE_DEFAULT;
    int has_page = query_number(req, "page", page_text, sizeof page_text, page);
    int has_size = query_number(req, "page_size", size_text, sizeof size_text, page_size);
    *paged = has_page != 0;
    if (has_page < 0 || has_size < 0) {
        api_answer_bad_request(call, "Pagination parameters are invalid");
        return false;
    }
    if ((*paged && *page < 1) || *page_size < 1 || *page_size > PAGE_SIZE_MAX) {
        char reason[128];
        snprintf(reason, sizeof reason, "Invalid pagination parameters: page number %s, page "
                 "size %s", *paged ? page_text : "undefined", has_size ? size_text : "undefined");
        http_call_answer_error_as(call, 400, "invalid_pagination_parameters", reason);
        return false;
    }
    return true;
}

/* RabbitMQ's bound: a page may start at the list's end, not past it. False
 * once answered 400. */
bool api_list__page_in_range(struct http_call *call, long page, long page_size, size_t filtered)
{
    if ((size_t)(page - 1) * (size_t)page_size <= filtered)
        return true;
    char reason[128];
    snprintf(reason, sizeof reason, "Page out of range, page: %ld page size: %ld, len: %zu", page,
             page_size, filtered);
    http_call_answer_error_as(call, 400, "page_out_of_range", reason);
    return false;
}

/* The page's items are items[from, to). */
static void write_page(struct json *out, const struct json_tree *tree,
                       const struct json_node **items, size_t from, size_t to, size_t total,
                       size_t filtered, long page, long page_size, const struct columns *cols)
{
    json_object_begin(out);
    json_kv_uint(out, "filtered_count", filtered);
    json_kv_uint(out, "item_count", from < to ? to - from : 0);
    json_key(out, "items");
    json_array_begin(out);
    for (size_t i = from; i < to; i++)
        api_list__write_item(out, tree, items[i], cols);
    json_array_end(out);
    json_kv_uint(out, "page", (uint64_t)page);
    json_kv_uint(out, "page_count", (filtered + (size_t)page_size - 1) / (size_t)page_size);
    json_kv_uint(out, "page_size", (uint64_t)page_size);
    json_kv_uint(out, "total_count", total);
    json_object_end(out);
}

/* Our own output (an answer's body, http_body_init): it parses, or the
 * writer is broken. */
static void parse_own(struct json *raw, struct json_tree *tree)
{
    size_t size;
    char *data = json_release(raw, &size);
    /* Written with http_body_init: the headroom's zero bytes come first. */
    size_t skip = 0;
    while (skip < size && data[skip] == '\0')
        skip++;
    char err[160];
    int rc = json_tree_parse(tree, data + skip, size - skip, err, sizeof err);
    free(data);
    ASSERT(rc == OK);
}

/* pages: whether page=, page_size= and name= count (else ignored). */
static void answer_list(struct http_call *call, const struct http_call_request *req,
                        struct json *raw, const char *default_sort, bool pages)
{
    bool paged = false;
    long page = 1, page_size = PAGE_SIZE_DEFAULT;
    struct api_name_filter name = {.text = ""}; /* (only a page is filtered) */
    if (pages && (!api_list__page_parse(call, req, &paged, &page, &page_size) ||
                  (paged && !api_list__name_parse(call, req, &name)))) {
        json_free(raw);
        return;
    }
    struct json_tree tree;
    parse_own(raw, &tree);
    const struct json_node *root = json_tree_root(&tree);
    ASSERT(root->kind == JSON_KIND_ARRAY);
    size_t total = root->children_count, filtered = 0;
    const struct json_node **items = xmalloc((total + 1) * sizeof *items);
    for (const struct json_node *c = json_tree_first(&tree, root); c; c = json_tree_next(&tree, c))
        if (api_list__name_matches(&tree, c, &name))
            items[filtered++] = c;
    api_name_filter_free(&name);
    struct sort_ctx s = {.tree = &tree};
    api_list__sort_keys(req, default_sort, s.keys, &s.reverse);
    sort_items(&s, items, filtered);
    struct columns cols;
    api_list__columns_parse(req, &cols);
    struct json body;
    http_body_init(&body);
    if (paged && !api_list__page_in_range(call, page, page_size, filtered)) {
        free(items);
        json_tree_free(&tree);
        json_free(&body);
        return;
    }
    if (paged) {
        struct api_list_cut cut = {.page = page, .page_size = page_size, .filtered = filtered};
        size_t from, to;
        api_list_cut_range(&cut, &from, &to);
        write_page(&body, &tree, items, from, to, total, filtered, page, page_size, &cols);
    } else {
        json_array_begin(&body);
        for (size_t i = 0; i < filtered; i++)
            api_list__write_item(&body, &tree, items[i], &cols);
        json_array_end(&body);
    }
    free(items);
    json_tree_free(&tree);
    http_call_answer(call, 200, &body);
}

void api_list_answer(struct http_call *call, const struct http_call_request *req,
                     struct json *raw, const char *default_sort)
{
    answer_list(call, req, raw, default_sort, true);
}

void api_list_answer_whole(struct http_call *call, const struct http_call_request *req,
                           struct json *raw, const char *default_sort)
{
    answer_list(call, req, raw, default_sort, false);
}

/* ---- pages cut by the endpoint ------------------------------------------------ */

bool api_list_cut_parse(const struct http_call_request *req, struct api_list_cut *cut)
{
    memset(cut, 0, sizeof *cut);
    char text[32], keys[QUERY_VALUE_SIZE_MAX]; /* as api_list_answer's: the same fallbacks */
    cut->page_size = PAGE_SIZE_DEFAULT;
    if (!api_query_get(req, "page", text, sizeof text) || !parse_positive(text, &cut->page))
        return false;
    if (api_query_get(req, "page_size", text, sizeof text) &&
        (!parse_positive(text, &cut->page_size) || cut->page_size > PAGE_SIZE_MAX))
        return false;
    if (!api_query_get(req, "sort", keys, sizeof keys))
        keys[0] = '\0';
    if (strcmp(keys, "name") == 0 || strcmp(keys, "name,vhost") == 0)
        cut->name_first = true;
    else if (keys[0] != '\0' && strcmp(keys, "vhost") != 0 && strcmp(keys, "vhost,name") != 0)
        return false;
    cut->reverse = api_query_get(req, "sort_reverse", text, sizeof text) &&
                   strcmp(text, "true") == 0;
    return api_name_filter_parse(req, &cut->name);
}

void api_list_cut_free(struct api_list_cut *cut)
{
    api_name_filter_free(&cut->name);
}

bool api_list_cut_matches(const struct api_list_cut *cut, struct bytes name)
{
    return api_name_filter_matches(&cut->name, name);
}

/* As compare_values for two strings. */
static int compare_bytes(struct bytes a, struct bytes b)
{
    size_t n = a.len < b.len ? a.len : b.len;
    int c = n > 0 ? memcmp(a.ptr, b.ptr, n) : 0;
    return c ? c : (a.len > b.len) - (a.len < b.len);
}

int api_list_cut_compare(const struct api_list_cut *cut, struct bytes vhost_a,
                         struct bytes name_a, struct bytes vhost_b, struct bytes name_b)
{
    int c = cut->name_first ? compare_bytes(name_a, name_b) : compare_bytes(vhost_a, vhost_b);
    if (c == 0)
        c = cut->name_first ? compare_bytes(vhost_a, vhost_b) : compare_bytes(name_a, name_b);
    return cut->reverse ? -c : c;
}

void api_list_cut_range(const struct api_list_cut *cut, size_t *from, size_t *to)
{
    *from = (size_t)(cut->page - 1) * (size_t)cut->page_size;
    *to = *from + (size_t)cut->page_size < cut->filtered ? *from + (size_t)cut->page_size
                                                         : cut->filtered;
    if (*from > *to)
        *from = *to;
}

void api_list_answer_cut(struct http_call *call, const struct http_call_request *req,
                         struct json *raw, const struct api_list_cut *cut)
{
    if (!api_list__page_in_range(call, cut->page, cut->page_size, cut->filtered)) {
        json_free(raw);
        return;
    }
    struct json_tree tree;
    parse_own(raw, &tree);
    const struct json_node *root = json_tree_root(&tree);
    ASSERT(root->kind == JSON_KIND_ARRAY);
    size_t count = root->children_count;
    const struct json_node **items = xmalloc((count + 1) * sizeof *items);
    size_t n = 0;
    for (const struct json_node *c = json_tree_first(&tree, root); c; c = json_tree_next(&tree, c))
        items[n++] = c;
    struct columns cols;
    api_list__columns_parse(req, &cols);
    struct json body;
    http_body_init(&body);
    write_page(&body, &tree, items, 0, n, cut->total, cut->filtered, cut->page, cut->page_size,
               &cols);
    free(items);
    json_tree_free(&tree);
    http_call_answer(call, 200, &body);
}

void api_object_answer(struct http_call *call, const struct http_call_request *req,
                       struct json *raw)
{
    struct columns cols;
    api_list__columns_parse(req, &cols);
    if (cols.count == 0) {
        http_call_answer(call, 200, raw);
        return;
    }
    struct json_tree tree;
    parse_own(raw, &tree);
    struct json body;
    http_body_init(&body);
    api_list__write_item(&body, &tree, json_tree_root(&tree), &cols);
    json_tree_free(&tree);
    http_call_answer(call, 200, &body);
}
