/*
 * bytes.c: see bytes.h.
 */
#include "lib/bytes.h"

#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"

struct bytes bytes_dup(struct bytes b)
{
    uint8_t *copy = xmalloc(b.len ? b.len : 1);
    if (b.len > 0)
        memcpy(copy, b.ptr, b.len);
    return (struct bytes){copy, b.len};
}

void bytes_free(struct bytes *b)
{
    free((void *)b->ptr);
    b->ptr = NULL;
    b->len = 0;
}
