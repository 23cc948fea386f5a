/*
 * policy.c: see policy.h. The set is a sorted array: lookups scan it (a
 * handful of policies per vhost is the normal case, and the scan's order
 * is what makes ties deterministic), puts and deletes keep it sorted.
 */
#include "broker/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/table.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"

void policy_set_init(struct policy_set *set)
{
    memset(set, 0, sizeof *set);
}

static void policy_free(struct policy *p)
{
    regfree(&p->regex);
    bytes_free(&p->vhost);
    bytes_free(&p->name);
    bytes_free(&p->pattern);
    free(p);
}

void policy_set_free(struct policy_set *set)
{
    for (uint32_t i = 0; i < set->count; i++)
        policy_free(set->items[i]);
    free(set->items);
    policy_set_init(set);
}

/* Byte order, shorter first on a common prefix: the same on every broker. */
static int bytes_compare(struct bytes a, struct bytes b)
{
    uint32_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c != 0)
        return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

static int key_compare(const struct policy *p, struct bytes vhost, struct bytes name)
{
    int c = bytes_compare(p->vhost, vhost);
    return c ? c : bytes_compare(p->name, name);
}

/* Compiles pattern into *out (regfree it). regcomp wants a C string: a
 * pattern with a NUL inside is refused. */
static int compile(struct bytes pattern, regex_t *out, char *err, size_t err_size)
{
    char text[POLICY_NAME_SIZE_MAX + 1];
    if (pattern.len == 0 || pattern.len > POLICY_NAME_SIZE_MAX ||
        memchr(pattern.ptr, '\0', pattern.len) != NULL) {
        snprintf(err, err_size, "the pattern must be 1..%d bytes without NUL",
                 POLICY_NAME_SIZE_MAX);
        return E_SYNTAX;
    }
    memcpy(text, pattern.ptr, pattern.len);
    text[pattern.len] = '\0';
    int rc = regcomp(out, text, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char why[POLICY_ERROR_SIZE];
        regerror(rc, out, why, sizeof why);
        /* At most the first 64 bytes of the pattern: the reason must fit
         * in POLICY_ERROR_SIZE too. */
        snprintf(err, err_size, "invalid regular expression '%.64s': %.60s", text, why);
        regfree(out);
        return E_SYNTAX;
    }
    return OK;
}

int policy_pattern_check(struct bytes pattern, char *err, size_t err_size)
{
    regex_t re;
    int rc = compile(pattern, &re, err, err_size);
    if (rc == OK)
        regfree(&re);
    return rc;
}

int policy_decl_check(const struct policy_decl *d, char *err, size_t err_size)
{
    if (d->vhost.len == 0 || d->vhost.len > POLICY_NAME_SIZE_MAX || d->name.len == 0 ||
        d->name.len > POLICY_NAME_SIZE_MAX) {
        snprintf(err, err_size, "vhost and policy names must be 1..%d bytes",
                 POLICY_NAME_SIZE_MAX);
        return E_SYNTAX;
    }
    if (d->priority > POLICY_PRIORITY_MAX) {
        snprintf(err, err_size, "priority must be 0..%d", POLICY_PRIORITY_MAX);
        return E_SYNTAX;
    }
    if (d->backups > POLICY_BACKUPS_MAX) {
        snprintf(err, err_size, "backups must be 0..%d", POLICY_BACKUPS_MAX);
        return E_SYNTAX;
    }
    if (d->replicate > POLICY_REPLICATE_TRANSIENT) {
        snprintf(err, err_size, "quay-replicate must be \"all\" or \"transient\"");
        return E_SYNTAX;
    }
    return policy_pattern_check(d->pattern, err, err_size);
}

/* The index of (vhost, name), or where it would go (*found false). */
static uint32_t locate(const struct policy_set *set, struct bytes vhost, struct bytes name,
                       bool *found)
{
    uint32_t lo = 0, hi = set->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = key_compare(set->items[mid], vhost, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

struct policy *policy_set_find(const struct policy_set *set, struct bytes vhost,
                               struct bytes name)
{
    bool found;
    uint32_t i = locate(set, vhost, name, &found);
    return found ? set->items[i] : NULL;
}

bool policy_set_same(const struct policy_set *set, const struct policy_decl *d)
{
    const struct policy *p = policy_set_find(set, d->vhost, d->name);
    return p != NULL && bytes_equal(p->pattern, d->pattern) && p->priority == d->priority &&
           p->backups == d->backups && p->replicate == d->replicate;
}

void policy_set_put(struct policy_set *set, const struct policy_decl *d)
{
    struct policy *p = xcalloc(1, sizeof *p);
    char err[POLICY_ERROR_SIZE];
    int rc = compile(d->pattern, &p->regex, err, sizeof err);
    ASSERT(rc == OK); /* the caller checked the declaration */
    p->vhost = bytes_dup(d->vhost);
    p->name = bytes_dup(d->name);
    p->pattern = bytes_dup(d->pattern);
    p->priority = d->priority;
    p->backups = d->backups;
    p->replicate = d->replicate;
    bool found;
    uint32_t i = locate(set, d->vhost, d->name, &found);
    if (found) {
        policy_free(set->items[i]);
        set->items[i] = p;
        return;
    }
    if (set->count == set->cap) {
        set->cap = set->cap ? set->cap * 2 : 8;
        set->items = xrealloc(set->items, (size_t)set->cap * sizeof *set->items);
    }
    memmove(&set->items[i + 1], &set->items[i], (size_t)(set->count - i) * sizeof *set->items);
    set->items[i] = p;
    set->count++;
}

static void remove_at(struct policy_set *set, uint32_t i)
{
    ASSERT(i < set->count);
    policy_free(set->items[i]);
    memmove(&set->items[i], &set->items[i + 1],
            (size_t)(set->count - i - 1) * sizeof *set->items);
    set->count--;
}

bool policy_set_delete(struct policy_set *set, struct bytes vhost, struct bytes name)
{
    bool found;
    uint32_t i = locate(set, vhost, name, &found);
    if (found)
        remove_at(set, i);
    return found;
}

uint32_t policy_set_delete_vhost(struct policy_set *set, struct bytes vhost)
{
    uint32_t n = 0;
    for (uint32_t i = set->count; i-- > 0;) {
        if (bytes_equal(set->items[i]->vhost, vhost)) {
            remove_at(set, i);
            n++;
        }
    }
    return n;
}

const struct policy *policy_set_match(const struct policy_set *set, struct bytes vhost,
                                      struct bytes name)
{
    /* Queue names are shortstrs; regexec wants a C string. A name with a
     * NUL inside is matched up to it. */
    char text[POLICY_NAME_SIZE_MAX + 1];
    uint32_t len = name.len < POLICY_NAME_SIZE_MAX ? name.len : POLICY_NAME_SIZE_MAX;
    if (len)
        memcpy(text, name.ptr, len);
    text[len] = '\0';
    const struct policy *best = NULL;
    for (uint32_t i = 0; i < set->count; i++) {
        const struct policy *p = set->items[i];
        /* Strictly higher only: in name order, the first of equals wins. */
        if (!bytes_equal(p->vhost, vhost) || (best && p->priority <= best->priority))
            continue;
        if (regexec(&p->regex, text, 0, NULL, 0) == 0)
            best = p;
    }
    return best;
}

uint8_t policy_effective_backups(int32_t own, const struct policy *best,
                                 uint8_t default_backups)
{
    if (own >= 0)
        return (uint8_t)(own > POLICY_BACKUPS_MAX ? POLICY_BACKUPS_MAX : own);
    if (best != NULL)
        return best->backups;
    return default_backups;
}

int32_t policy_queue_own_backups(const uint8_t *arguments, uint32_t size)
{
    struct field_value v;
    int64_t n;
    if (size == 0 || !table_get((struct table){arguments, size}, "x-quay-backups", &v) ||
        !field_value_as_int(&v, &n) || n < 0 || n > POLICY_BACKUPS_MAX)
        return -1;
    return (int32_t)n;
}

int policy_replicate_parse(struct bytes value)
{
    if (bytes_equal_cstr(value, "all"))
        return POLICY_REPLICATE_ALL;
    if (bytes_equal_cstr(value, "transient"))
        return POLICY_REPLICATE_TRANSIENT;
    return -1;
}

const char *policy_replicate_name(uint8_t replicate)
{
    return replicate == POLICY_REPLICATE_TRANSIENT ? "transient" : "all";
}

bool policy_replicates_transient_only(const struct policy_set *set, struct bytes vhost,
                                      struct bytes name, const uint8_t *arguments,
                                      uint32_t size)
{
    struct field_value v;
    if (size > 0 && table_get((struct table){arguments, size}, "x-quay-replicate", &v))
        return v.kind == 'S' && bytes_equal_cstr(v.str, "transient"); /* the argument wins */
    if (set == NULL || set->count == 0)
        return false;
    const struct policy *best = policy_set_match(set, vhost, name);
    return best != NULL && best->replicate == POLICY_REPLICATE_TRANSIENT;
}
