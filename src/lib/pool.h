/*
 * pool.h: counted pools of fixed-size objects.
 *
 * Hot objects (queue entries, deliveries) are taken from a pool instead of
 * malloc: a free list of previously released objects, refilled a slab at a
 * time. `in_use` counts live objects so shutdown can assert that every
 * object came back (a leak check that costs nothing at run time).
 */
#ifndef QUAY_LIB_POOL_H
#define QUAY_LIB_POOL_H

#include <stddef.h>
#include <stdint.h>

struct pool {
    const char *name;
    size_t object_size;
    size_t slab_objects;   /* objects carved out of each slab */
    void *free_list;       /* singly linked through the objects' first word */
    void *slabs;           /* singly linked list of slabs, owned */
    uint64_t in_use;
    uint64_t allocated;    /* objects carved out of slabs in total */
};

void pool_init(struct pool *pool, const char *name, size_t object_size, size_t slab_objects);
/* Frees every slab. Asserts that no object is still in use. */
void pool_destroy(struct pool *pool);
void *pool_get(struct pool *pool);  /* never NULL: aborts on OOM */
void pool_put(struct pool *pool, void *object);

#endif
