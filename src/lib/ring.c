/*
 * ring.c: see ring.h.
 */
#include "lib/ring.h"

#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"

void *ring_grow(void *items, size_t elem_size, uint32_t *head, uint32_t count, uint32_t *cap,
                uint32_t first_cap)
{
    ASSERT(first_cap > 0 && (first_cap & (first_cap - 1)) == 0);
    ASSERT(count <= *cap);
    uint32_t new_cap = *cap ? *cap * 2 : first_cap;
    ASSERT(new_cap > *cap);
    uint8_t *grown = xmalloc(elem_size * new_cap);
    /* The elements from head to the end of the array, then the wrapped
     * ones from slot 0: two copies. */
    uint32_t first = *cap ? (count < *cap - *head ? count : *cap - *head) : 0;
    if (first > 0)
        memcpy(grown, (uint8_t *)items + (size_t)*head * elem_size, (size_t)first * elem_size);
    if (count > first)
        memcpy(grown + (size_t)first * elem_size, items, (size_t)(count - first) * elem_size);
    free(items);
    *head = 0;
    *cap = new_cap;
    return grown;
}
