/*
 * alloc.h: the allocation helper. quay does not go on without memory: an
 * allocation that fails is an assertion (on in release builds), as
 * everywhere an `ASSERT(p != NULL)` follows a malloc. These say it once.
 * A size or count of 0 allocates one byte, so that a NULL always means
 * failure (calloc(0, n) may return NULL). Code that answers running out
 * of memory with an error (a reply code, E_NOMEM) calls malloc itself.
 */
#ifndef QUAY_LIB_ALLOC_H
#define QUAY_LIB_ALLOC_H

#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "lib/assert.h"

/* After a bulk free (a restart's recovered queues that the cluster gave to
 * others): the free pages go back to the system, which glibc's malloc
 * does not do by itself for pages below its heap's top. */
static inline void alloc_release_free_pages(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

static inline void *xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    ASSERT(p != NULL);
    return p;
}

static inline void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    ASSERT(p != NULL);
    return p;
}

/* realloc that keeps p's contents or aborts (never frees p: size 0 is 1). */
static inline void *xrealloc(void *p, size_t size)
{
    void *q = realloc(p, size ? size : 1);
    ASSERT(q != NULL);
    return q;
}

static inline char *xstrdup(const char *s)
{
    char *p = strdup(s);
    ASSERT(p != NULL);
    return p;
}

#endif
