/*
 * pool.c: see pool.h. Slabs are never returned to the system before
 * pool_destroy; a broker's working set of entries is reused in place.
 */
#include "lib/pool.h"

#include <stdlib.h>

#include "lib/alloc.h"
#include "lib/assert.h"

struct slab {
    struct slab *next;
    /* objects follow, aligned to max_align_t */
};

#define SLAB_HEADER_SIZE ((sizeof(struct slab) + _Alignof(max_align_t) - 1) & \
                          ~(_Alignof(max_align_t) - 1))

void pool_init(struct pool *pool, const char *name, size_t object_size, size_t slab_objects)
{
    ASSERT(object_size > 0);
    ASSERT(slab_objects > 0);
    size_t align = _Alignof(max_align_t);
    if (object_size < sizeof(void *))
        object_size = sizeof(void *);
    pool->name = name;
    pool->object_size = (object_size + align - 1) & ~(align - 1);
    pool->slab_objects = slab_objects;
    pool->free_list = NULL;
    pool->slabs = NULL;
    pool->in_use = 0;
    pool->allocated = 0;
}

void pool_destroy(struct pool *pool)
{
    ASSERT(pool->in_use == 0);
    struct slab *slab = pool->slabs;
    while (slab) {
        struct slab *next = slab->next;
        free(slab);
        slab = next;
    }
    pool->slabs = NULL;
    pool->free_list = NULL;
}

/* Under AddressSanitizer every object is its own allocation, so a
 * use-after-free of a pooled object is still caught. */
#if defined(__SANITIZE_ADDRESS__)
void *pool_get(struct pool *pool)
{
    void *object = xmalloc(pool->object_size);
    pool->in_use++;
    pool->allocated++;
    return object;
}

void pool_put(struct pool *pool, void *object)
{
    ASSERT(object != NULL);
    ASSERT(pool->in_use > 0);
    pool->in_use--;
    free(object);
}
#else
static void refill(struct pool *pool)
{
    struct slab *slab = xmalloc(SLAB_HEADER_SIZE + pool->object_size * pool->slab_objects);
    slab->next = pool->slabs;
    pool->slabs = slab;
    char *objects = (char *)slab + SLAB_HEADER_SIZE;
    for (size_t i = pool->slab_objects; i-- > 0;) {
        void **object = (void **)(void *)(objects + i * pool->object_size);
        *object = pool->free_list;
        pool->free_list = object;
    }
    pool->allocated += pool->slab_objects;
}

void *pool_get(struct pool *pool)
{
    if (!pool->free_list)
        refill(pool);
    void **object = pool->free_list;
    pool->free_list = *object;
    pool->in_use++;
    return object;
}

void pool_put(struct pool *pool, void *object)
{
    ASSERT(object != NULL);
    ASSERT(pool->in_use > 0);
    *(void **)object = pool->free_list;
    pool->free_list = object;
    pool->in_use--;
}
#endif
