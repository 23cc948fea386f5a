/*
 * api_list_slices.c: a long list answered a slice at a time (api_list.h,
 * api_list_answer_slices).
 *
 * Why: api_list_answer writes the whole list, parses it back and writes
 * it again, all in one loop turn: ~2-3 s for 50,000 queues (rabbitmqadmin
 * list queues asks for all of them), every client of the broker held
 * that long. Here a timer does at most API_LIST_SLICE_US of work a
 * slice, and the next slice waits at least API_LIST_GAP_MS: the message
 * path runs between slices and gets at least half the loop while lists
 * are built back to back (a slice every loop turn, as /metrics's idle
 * handle does, left it ~10%: 22,000 of 105,000 1 KiB msg/s, bench/
 * RESULTS.md "Lists in slices"); a list takes about twice its CPU time:
 *
 *   ORDER  the source's items put in the default order (its compare), a
 *          merge sort of an index a few thousand steps per turn: a qsort
 *          of 50,000 queues by name took 45-220 ms in one turn (every
 *          comparison follows two pointers to names far apart);
 *   ITEMS  each item is written by its source, in that order. The common
 *          request (the default order, no columns=, no page) writes
 *          straight into the answer. Otherwise the item is written alone,
 *          parsed (a small tree), filtered by name=, its sort keys copied
 *          out, its columns= written, and the text kept as a row;
 *   SORT   the rows by their copied keys (sort=), the same merge sort;
 *   EMIT   the rows (the page's, with page=) copied into the answer.
 *
 * Built then sent, as /metrics is (metrics.c says why not chunked). The
 * answer is the one api_list_answer would give for the same items.
 *
 * The sources: queues (api_queues.c: each holds a reference, written as
 * it is when its turn comes); exchanges, bindings, connections, channels
 * and consumers (copied out in the request's turn, api_list_keep: no
 * reference holds them, and copying is a memcpy a field where writing
 * escapes every byte; the last three's counters, rates and state as of
 * the request). api_answer_slices runs the ITEMS phase alone for an
 * answer that is not a list (the definitions: api_definitions_export.c).
 */
#include "mgmt/api_list.h"
#include "mgmt/api_list_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/json.h"
#include "lib/log.h"
#include "mgmt/json_tree.h"

/* At most this much work a slice (as a /metrics scrape's slice), then a
 * pause of at least this long (libuv's timers count whole ms). */
#define API_LIST_SLICE_US 1000u
#define API_LIST_GAP_MS 1u
/* Items between looks at the clock (an item costs a few us to ~20 us). */
#define API_LIST_RUN 8u

enum slices_phase { PHASE_ORDER, PHASE_ITEMS, PHASE_SORT, PHASE_EMIT, PHASE_DONE };

/* Merge steps (one element placed each) between looks at the clock. */
#define MERGE_RUN 256u

typedef int (*compare_fn)(void *ctx, size_t a, size_t b);

/* A bottom-up merge sort of the indexes 0..n-1 that stops and resumes
 * anywhere: stable, n log n comparisons, two index arrays. */
struct merge_sort {
    size_t *order, *spare;         /* owned; order holds the result */
    size_t n, width;               /* runs of width are sorted */
    size_t at;                     /* the pair of runs being merged starts here */
    size_t left, right, out;       /* the merge's positions */
    bool merging;
};

static void merge_begin(struct merge_sort *m, size_t n)
{
    *m = (struct merge_sort){.n = n, .width = 1};
    m->order = xmalloc((n + 1) * sizeof *m->order);
    m->spare = xmalloc((n + 1) * sizeof *m->spare);
    for (size_t i = 0; i < n; i++)
        m->order[i] = i;
}

static void merge_free(struct merge_sort *m)
{
    free(m->order);
    free(m->spare);
    m->order = m->spare = NULL;
}

/* At most steps merge steps; false once sorted. */
static bool merge_run(struct merge_sort *m, unsigned steps, compare_fn compare, void *ctx)
{
    while (m->width < m->n) {
        if (!m->merging) {
            if (m->at >= m->n) { /* a pass is over */
                size_t *t = m->order;
                m->order = m->spare;
                m->spare = t;
                m->width *= 2;
                m->at = 0;
                continue;
            }
            m->left = m->out = m->at;
            m->right = m->at + m->width < m->n ? m->at + m->width : m->n;
            m->merging = true;
        }
        size_t mid = m->at + m->width < m->n ? m->at + m->width : m->n;
        size_t end = m->at + 2 * m->width < m->n ? m->at + 2 * m->width : m->n;
        for (; steps > 0 && m->out < end; steps--) {
            bool take_left = m->left < mid &&
                             (m->right >= end ||
                              compare(ctx, m->order[m->left], m->order[m->right]) <= 0);
            m->spare[m->out++] = take_left ? m->order[m->left++] : m->order[m->right++];
        }
        if (m->out < end)
            return true;
        m->merging = false;
        m->at = end;
        if (steps == 0)
            return true;
    }
    return false;
}

/* A sort key copied out of its item: a number, a string (in key_text),
 * another kind (compared by kind only), or missing (last). */
struct key {
    int kind; /* enum json_kind, or KEY_MISSING */
    double number;
    size_t at, size;
};
#define KEY_MISSING (-1)

struct row {
    size_t at, size; /* its text in store */
    size_t keys_at;  /* its keys: keys[keys_at ..] */
};

/* Owned by itself from api_list_answer_slices until answered or its
 * client is gone; freed once its timer has closed. */
struct slices {
    struct http_call *call;        /* borrowed, until answered or cancelled */
    struct http_call_request req;  /* slices valid until the call is answered */
    struct api_list_source source;
    uv_timer_t timer;
    enum slices_phase phase;
    bool direct;                   /* items straight into body */
    bool whole;                    /* the items are the whole answer (api_answer_slices) */
    bool reserved;                 /* direct: the answer's room was reserved */
    bool needs_tree;               /* columns=, sort= or name= read each item */
    bool sorting;
    bool backwards;                /* the default order reversed */
    bool paged;
    long page, page_size;
    struct api_name_filter name;   /* paged: name=, use_regex= (owned) */
    struct columns cols;
    char sort_text[QUERY_VALUE_SIZE_MAX];
    bool reverse;
    struct merge_sort merge;       /* ORDER, SORT: the order of items or rows */
    bool ordered;                  /* the items are written in merge.order */
    const char *key_path[SORT_KEYS_MAX];
    size_t key_path_size[SORT_KEYS_MAX];
    uint32_t keys_count;
    size_t next;                   /* ITEMS: the next item; EMIT: the next row */
    size_t total;                  /* the items written (none skipped by the source) */
    size_t from, to;               /* EMIT: rows [from, to) */
    struct json store;             /* the rows' texts, raw */
    struct json key_text;          /* the keys' strings, raw */
    struct row *rows;
    size_t rows_count, rows_cap;
    struct key *keys;              /* keys_count per row */
    struct json body;              /* the answer */
    uint64_t began_ns, slice_max_ns;
    uint32_t slices_count;
};

static void on_closed(uv_handle_t *handle)
{
    free(handle->data);
}

/* The source's items are released, and the handle closed (then s freed). */
static void slices_finish(struct slices *s)
{
    s->phase = PHASE_DONE;
    s->source.done(s->source.ctx);
    json_free(&s->store);
    json_free(&s->key_text);
    json_free(&s->body);
    free(s->rows);
    free(s->keys);
    merge_free(&s->merge);
    api_name_filter_free(&s->name);
    s->rows = NULL;
    s->keys = NULL;
    uv_timer_stop(&s->timer);
    uv_close((uv_handle_t *)&s->timer, on_closed);
}

static void on_cancel(void *arg)
{
    struct slices *s = arg;
    s->call = NULL;
    slices_finish(s);
}

static void copy_key(struct slices *s, const struct json_node *n, struct key *k)
{
    *k = (struct key){.kind = n != NULL ? (int)n->kind : KEY_MISSING};
    if (n != NULL && n->kind == JSON_KIND_NUMBER)
        k->number = n->number;
    if (n != NULL && n->kind == JSON_KIND_STRING) {
        k->at = s->key_text.size;
        k->size = n->string_size;
        json_raw(&s->key_text, n->string, n->string_size);
    }
}

/* Keeps text (one item, as the answer shows it) as a row with the keys
 * of tree's root (sorting only). */
static void add_row(struct slices *s, const char *text, size_t size,
                    const struct json_tree *tree)
{
    if (s->rows_count == s->rows_cap) {
        s->rows_cap = 2 * s->rows_cap + 256;
        s->rows = xrealloc(s->rows, s->rows_cap * sizeof *s->rows);
        s->keys = xrealloc(s->keys, (s->rows_cap * s->keys_count + 1) * sizeof *s->keys);
    }
    struct row *r = &s->rows[s->rows_count++];
    *r = (struct row){.at = s->store.size, .size = size, .keys_at = (r - s->rows) * s->keys_count};
    json_raw(&s->store, text, size);
    for (uint32_t k = 0; s->sorting && k < s->keys_count; k++)
        copy_key(s, api_list__field_at(tree, json_tree_root(tree), s->key_path[k],
                                       s->key_path_size[k]), &s->keys[r->keys_at + k]);
}

/* Item i, alone: parsed, filtered, its keys and columns taken. */
static void read_item(struct slices *s, size_t i)
{
    struct json one;
    json_init(&one);
    if (!s->source.write(s->source.ctx, i, &one)) {
        json_free(&one);
        return;
    }
    s->total++;
    if (!s->needs_tree) {
        add_row(s, one.data, one.size, NULL);
        json_free(&one);
        return;
    }
    struct json_tree tree;
    char err[160];
    int rc = json_tree_parse(&tree, one.data, one.size, err, sizeof err);
    ASSERT(rc == OK); /* our own writer's */
    json_free(&one);
    const struct json_node *root = json_tree_root(&tree);
    if (!s->paged || api_list__name_matches(&tree, root, &s->name)) {
        json_init(&one);
        api_list__write_item(&one, &tree, root, &s->cols);
        add_row(s, one.data, one.size, &tree);
        json_free(&one);
    }
    json_tree_free(&tree);
}

/* ---- sorting: the copied keys, as api_list.c compares fields ---------------- */

static int compare_keys(const struct slices *s, const struct key *a, const struct key *b)
{
    if (a->kind == KEY_MISSING || b->kind == KEY_MISSING)
        return (a->kind == KEY_MISSING) - (b->kind == KEY_MISSING);
    if (a->kind == JSON_KIND_NUMBER && b->kind == JSON_KIND_NUMBER)
        return (a->number > b->number) - (a->number < b->number);
    if (a->kind == JSON_KIND_STRING && b->kind == JSON_KIND_STRING) {
        size_t n = a->size < b->size ? a->size : b->size;
        int c = n ? memcmp(s->key_text.data + a->at, s->key_text.data + b->at, n) : 0;
        return c ? c : (a->size > b->size) - (a->size < b->size);
    }
    return a->kind - b->kind;
}

static int compare_rows(void *ctx, size_t x, size_t y)
{
    const struct slices *s = ctx;
    const struct row *a = &s->rows[x], *b = &s->rows[y];
    for (uint32_t k = 0; k < s->keys_count; k++) {
        int c = compare_keys(s, &s->keys[a->keys_at + k], &s->keys[b->keys_at + k]);
        if (c != 0)
            return s->reverse ? -c : c;
    }
    return 0;
}

/* ---- the phases ----------------------------------------------------------------- */

/* The answer's head: an array, or a page's object up to its "items". False
 * once answered (a page out of range: 400). */
static bool emit_begin(struct slices *s)
{
    http_body_init(&s->body);
    /* Room for every row at once: grown by doubling, the buffer would be
     * copied whole (tens of MB) within a single slice. */
    json_raw_space(&s->body, s->store.size + s->rows_count + 512);
    s->from = 0;
    s->to = s->rows_count;
    if (!s->paged) {
        json_array_begin(&s->body);
        return true;
    }
    if (!api_list__page_in_range(s->call, s->page, s->page_size, s->rows_count)) {
        s->call = NULL; /* answered 400 */
        s->phase = PHASE_DONE;
        return false;
    }
    struct api_list_cut cut = {.page = s->page, .page_size = s->page_size,
                               .filtered = s->rows_count};
    api_list_cut_range(&cut, &s->from, &s->to);
    json_object_begin(&s->body);
    json_kv_uint(&s->body, "filtered_count", s->rows_count);
    json_kv_uint(&s->body, "item_count", s->from < s->to ? s->to - s->from : 0);
    json_key(&s->body, "items");
    json_array_begin(&s->body);
    return true;
}

static void emit_end(struct slices *s)
{
    json_array_end(&s->body);
    if (!s->paged)
        return;
    json_kv_uint(&s->body, "page", (uint64_t)s->page);
    json_kv_uint(&s->body, "page_count",
                 (s->rows_count + (size_t)s->page_size - 1) / (size_t)s->page_size);
    json_kv_uint(&s->body, "page_size", (uint64_t)s->page_size);
    json_kv_uint(&s->body, "total_count", s->total);
    json_object_end(&s->body);
}

/* The direct answer's room, once its first items tell about how long
 * one is (an eighth more, for longer ones later): grown by doubling, the
 * buffer was copied whole inside a slice (2.2-2.4 ms for 4 MB of 50,000
 * consumers' 19 MB, release). */
static void direct_reserve(struct slices *s)
{
    s->reserved = true;
    if (s->next == 0 || s->next >= s->source.count)
        return;
    size_t each = s->body.size / s->next + 1;
    size_t left = s->source.count - s->next;
    json_reserve(&s->body, each * left + each * left / 8);
}

/* A run of the phase s is in; false when the answer was given (or refused). */
static bool run(struct slices *s)
{
    switch (s->phase) {
    case PHASE_ORDER:
        if (merge_run(&s->merge, MERGE_RUN, s->source.compare, s->source.ctx))
            return true;
        s->ordered = true;
        s->phase = PHASE_ITEMS;
        return true;
    case PHASE_ITEMS:
        for (unsigned n = 0; n < API_LIST_RUN && s->next < s->source.count; n++, s->next++) {
            size_t i = s->ordered ? s->merge.order[s->next] : s->next;
            if (s->direct)
                s->total += s->source.write(s->source.ctx, i, &s->body);
            else
                read_item(s, i);
        }
        if (s->direct && !s->reserved)
            direct_reserve(s);
        if (s->next < s->source.count)
            return true;
        if (s->direct) {
            if (!s->whole)
                json_array_end(&s->body);
            s->phase = PHASE_DONE;
            return false;
        }
        merge_free(&s->merge);
        s->ordered = false;
        if (s->sorting) {
            merge_begin(&s->merge, s->rows_count);
            s->phase = PHASE_SORT;
            return true;
        }
        s->phase = PHASE_EMIT;
        if (!emit_begin(s))
            return false;
        s->next = s->from;
        return true;
    case PHASE_SORT:
        if (merge_run(&s->merge, MERGE_RUN, compare_rows, s))
            return true;
        s->ordered = true;
        s->phase = PHASE_EMIT;
        if (!emit_begin(s))
            return false;
        s->next = s->from;
        return true;
    case PHASE_EMIT:
        for (unsigned n = 0; n < 64 && s->next < s->to; n++, s->next++) {
            size_t i = s->backwards ? s->to - 1 - (s->next - s->from) : s->next;
            i = s->ordered ? s->merge.order[i] : i;
            json_value_text(&s->body, s->store.data + s->rows[i].at, s->rows[i].size);
        }
        if (s->next < s->to)
            return true;
        emit_end(s);
        s->phase = PHASE_DONE;
        return false;
    case PHASE_DONE:
        break;
    }
    return false;
}

static void on_slice(uv_timer_t *timer)
{
    struct slices *s = timer->data;
    uint64_t began_ns = uv_hrtime();
    uint64_t deadline_ns = began_ns + API_LIST_SLICE_US * 1000u;
    while (run(s) && uv_hrtime() < deadline_ns)
        ;
    uint64_t took_ns = uv_hrtime() - began_ns;
    if (s->call != NULL && s->phase != PHASE_DONE)
        http_call_progress(s->call); /* slow (a loaded host, a sanitizer), not stuck */
    s->slices_count++;
    if (took_ns > s->slice_max_ns)
        s->slice_max_ns = took_ns;
    if (s->phase != PHASE_DONE) {
        uv_timer_start(&s->timer, on_slice, API_LIST_GAP_MS, 0);
        return;
    }
    LOG_DEBUG("http list: %zu items gathered in %llu us (one turn), then %zu bytes in %llu "
              "us, %u slices, the longest %llu us", s->total,
              (unsigned long long)(s->source.began_ns ? (s->began_ns - s->source.began_ns) / 1000u
                                                      : 0),
              s->body.size, (unsigned long long)((uv_hrtime() - s->began_ns) / 1000u),
              s->slices_count, (unsigned long long)(s->slice_max_ns / 1000u));
    if (s->call != NULL) {
        http_call_answer(s->call, 200, &s->body);
        s->call = NULL;
    }
    slices_finish(s);
}

/* The sort keys' paths, split at ','. */
static void split_keys(struct slices *s)
{
    for (const char *p = s->sort_text; *p && s->keys_count < SORT_KEYS_MAX;) {
        const char *comma = strchr(p, ',');
        size_t k = comma ? (size_t)(comma - p) : strlen(p);
        s->key_path[s->keys_count] = p;
        s->key_path_size[s->keys_count++] = k;
        p += comma ? k + 1 : k;
    }
}

/* The first slice in the next loop turn. */
static void slices_start(struct uv_loop_s *loop, struct slices *s)
{
    uv_timer_init(loop, &s->timer);
    s->timer.data = s;
    uv_timer_start(&s->timer, on_slice, 0, 0);
    http_call_on_cancel(s->call, on_cancel, s);
}

void api_list_answer_slices(struct uv_loop_s *loop, struct http_call *call,
                            const struct http_call_request *req, const char *default_sort,
                            const struct api_list_source *source)
{
    struct slices *s = xcalloc(1, sizeof *s);
    s->call = call;
    s->req = *req;
    s->began_ns = uv_hrtime();
    s->source = *source;
    if (!api_list__page_parse(call, req, &s->paged, &s->page, &s->page_size) ||
        (s->paged && !api_list__name_parse(call, req, &s->name))) {
        source->done(source->ctx);
        free(s);
        return;
    }
    api_list__columns_parse(req, &s->cols);
    bool asked = api_list__sort_keys(req, default_sort, s->sort_text, &s->reverse);
    s->sorting = asked;
    /* With no default order (the tables' own), sort_reverse= alone has
     * nothing to reverse in api_list_answer either. */
    s->backwards = !s->sorting && s->reverse && default_sort[0] != '\0';
    if (s->sorting)
        split_keys(s);
    s->needs_tree = s->cols.count > 0 || s->sorting || s->name.text[0] != '\0';
    s->direct = !s->needs_tree && !s->paged && !s->backwards;
    json_init(&s->store);
    json_init(&s->key_text);
    if (s->direct) {
        http_body_init(&s->body);
        json_array_begin(&s->body);
    }
    /* The default order first, unless sort= asks for another (then the
     * rows are sorted with the default keys last). */
    s->phase = PHASE_ITEMS;
    if (!s->sorting && source->compare != NULL) {
        merge_begin(&s->merge, source->count);
        s->phase = PHASE_ORDER;
    }
    slices_start(loop, s);
}

void api_answer_slices(struct uv_loop_s *loop, struct http_call *call, struct json *body,
                       const struct api_list_source *source)
{
    struct slices *s = xcalloc(1, sizeof *s);
    s->call = call;
    s->began_ns = uv_hrtime();
    s->source = *source;
    s->direct = s->whole = true;
    s->body = *body;
    json_init(body);
    json_init(&s->store);
    json_init(&s->key_text);
    s->phase = PHASE_ITEMS;
    slices_start(loop, s);
}

size_t api_list_keep(struct api_list_text *t, struct bytes b)
{
    if (t->size + b.len > t->cap) {
        while (t->size + b.len > t->cap)
            t->cap = 2 * t->cap + 4096;
        t->data = xrealloc(t->data, t->cap);
    }
    size_t at = t->size;
    if (b.len > 0)
        memcpy(t->data + at, b.ptr, b.len);
    t->size += b.len;
    return at;
}
