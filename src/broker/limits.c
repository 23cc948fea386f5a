/*
 * limits.c: see limits.h.
 */
#include "broker/limits.h"

#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"

static const char *const kind_names[LIMIT_KIND_COUNT] = {
    [LIMIT_MAX_CONNECTIONS] = "max-connections",
    [LIMIT_MAX_QUEUES] = "max-queues",
    [LIMIT_MAX_CHANNELS] = "max-channels",
};

void limit_set_init(struct limit_set *set)
{
    *set = (struct limit_set){0};
}

void limit_set_free(struct limit_set *set)
{
    for (uint32_t i = 0; i < set->count; i++)
        free((void *)set->items[i].name.ptr);
    free(set->items);
    limit_set_init(set);
}

static struct bytes copy_name(struct bytes name)
{
    ASSERT(name.len >= 1 && name.len <= LIMIT_NAME_SIZE_MAX);
    uint8_t *p = xmalloc(name.len);
    memcpy(p, name.ptr, name.len);
    return (struct bytes){p, name.len};
}

void limit_set_copy(struct limit_set *dst, const struct limit_set *src)
{
    ASSERT(dst != src);
    limit_set_free(dst);
    if (src->count == 0)
        return;
    dst->items = xcalloc(src->count, sizeof *dst->items);
    dst->cap = src->count;
    for (uint32_t i = 0; i < src->count; i++) {
        dst->items[i] = src->items[i];
        dst->items[i].name = copy_name(src->items[i].name);
    }
    dst->count = src->count;
}

bool limit_set_equal(const struct limit_set *a, const struct limit_set *b)
{
    if (a->count != b->count)
        return false;
    for (uint32_t i = 0; i < a->count; i++) {
        const struct limit *x = &a->items[i], *y = &b->items[i];
        if (x->scope != y->scope || x->kind != y->kind || x->value != y->value ||
            !bytes_equal(x->name, y->name))
            return false;
    }
    return true;
}

bool limit_kind_valid(enum limit_scope scope, enum limit_kind kind)
{
    if (kind == LIMIT_MAX_CONNECTIONS)
        return true;
    if (scope == LIMIT_SCOPE_VHOST)
        return kind == LIMIT_MAX_QUEUES;
    return scope == LIMIT_SCOPE_USER && kind == LIMIT_MAX_CHANNELS;
}

int limit_kind_parse(enum limit_scope scope, struct bytes text)
{
    for (int k = 0; k < LIMIT_KIND_COUNT; k++) {
        if (bytes_equal_cstr(text, kind_names[k]) && limit_kind_valid(scope, k))
            return k;
    }
    return -1;
}

const char *limit_kind_name(enum limit_kind kind)
{
    ASSERT((unsigned)kind < LIMIT_KIND_COUNT);
    return kind_names[kind];
}

const char *limit_scope_name(enum limit_scope scope)
{
    return scope == LIMIT_SCOPE_VHOST ? "vhost" : "user";
}

/* Byte order of names, shorter first on a common prefix. */
static int compare(enum limit_scope scope, struct bytes name, enum limit_kind kind,
                   const struct limit *l)
{
    if (scope != l->scope)
        return scope < l->scope ? -1 : 1;
    uint32_t n = name.len < l->name.len ? name.len : l->name.len;
    int c = n ? memcmp(name.ptr, l->name.ptr, n) : 0;
    if (c != 0)
        return c;
    if (name.len != l->name.len)
        return name.len < l->name.len ? -1 : 1;
    if (kind != l->kind)
        return kind < l->kind ? -1 : 1;
    return 0;
}

/* The index of the entry, or where it would go (*found says which). */
static uint32_t search(const struct limit_set *set, enum limit_scope scope, struct bytes name,
                       enum limit_kind kind, bool *found)
{
    uint32_t lo = 0, hi = set->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = compare(scope, name, kind, &set->items[mid]);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    *found = false;
    return lo;
}

const struct limit *limit_set_find(const struct limit_set *set, enum limit_scope scope,
                                   struct bytes name, enum limit_kind kind)
{
    bool found;
    uint32_t i = search(set, scope, name, kind, &found);
    return found ? &set->items[i] : NULL;
}

int64_t limit_set_value(const struct limit_set *set, enum limit_scope scope, struct bytes name,
                        enum limit_kind kind)
{
    const struct limit *l = limit_set_find(set, scope, name, kind);
    return l != NULL ? l->value : -1;
}

bool limit_set_put(struct limit_set *set, enum limit_scope scope, struct bytes name,
                   enum limit_kind kind, int64_t value)
{
    ASSERT(limit_kind_valid(scope, kind));
    bool found;
    uint32_t i = search(set, scope, name, kind, &found);
    if (found) {
        set->items[i].value = value;
        return false;
    }
    ASSERT(set->count < LIMIT_COUNT_MAX);
    if (set->count == set->cap) {
        set->cap = set->cap ? 2 * set->cap : 8;
        set->items = xrealloc(set->items, set->cap * sizeof *set->items);
    }
    memmove(&set->items[i + 1], &set->items[i], (set->count - i) * sizeof *set->items);
    set->items[i] = (struct limit){scope, copy_name(name), kind, value};
    set->count++;
    return true;
}

static void remove_at(struct limit_set *set, uint32_t i)
{
    ASSERT(i < set->count);
    free((void *)set->items[i].name.ptr);
    memmove(&set->items[i], &set->items[i + 1], (set->count - i - 1) * sizeof *set->items);
    set->count--;
}

bool limit_set_delete(struct limit_set *set, enum limit_scope scope, struct bytes name,
                      enum limit_kind kind)
{
    bool found;
    uint32_t i = search(set, scope, name, kind, &found);
    if (found)
        remove_at(set, i);
    return found;
}

uint32_t limit_set_delete_all(struct limit_set *set, enum limit_scope scope, struct bytes name)
{
    uint32_t n = 0;
    for (uint32_t i = set->count; i-- > 0;) {
        if (set->items[i].scope == scope && bytes_equal(set->items[i].name, name)) {
            remove_at(set, i);
            n++;
        }
    }
    return n;
}
