/*
 * fuzz_properties.c: content header + basic properties round trip.
 *
 * Goal: content_header_decode and basic_properties_decode never read
 * outside their input, and accepted properties re-encode to the same bytes
 * and decode equal. Method: the input is a content header frame payload.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/frame.h"
#include "amqp/method_gen.h"
#include "amqp/table.h"
#include "lib/assert.h"
#include "lib/errors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > UINT32_MAX)
        return 0;
    struct content_header h;
    if (content_header_decode(&h, data, (uint32_t)size) != OK)
        return 0;
    struct basic_properties p;
    int rc = basic_properties_decode(&p, h.properties, h.properties_size);
    ASSERT(rc == OK || rc == E_SYNTAX);
    if (rc != OK)
        return 0;
    if (p.flags & BASIC_FLAG_HEADERS)
        ASSERT(table_validate(p.headers.ptr, p.headers.len) == OK);
    uint8_t *buf = malloc((size_t)h.properties_size + 1);
    ASSERT(buf != NULL);
    size_t n = basic_properties_encode(&p, buf, (size_t)h.properties_size + 1);
    ASSERT(n == h.properties_size);
    ASSERT(memcmp(buf, h.properties, n) == 0); /* no bits to normalise here */
    struct basic_properties d;
    ASSERT(basic_properties_decode(&d, buf, (uint32_t)n) == OK);
    ASSERT(basic_properties_equal(&p, &d));
    free(buf);
    return 0;
}
