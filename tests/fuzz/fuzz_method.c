/*
 * fuzz_method.c: method decode and the decode -> encode -> decode round trip.
 *
 * Goal: method_decode never reads outside its input, and whatever it
 * accepts re-encodes into bytes that decode to an equal method and that
 * re-encode identically (unused bits in bit octets are the only bytes that
 * may differ from the input). Method: the input is a method frame payload.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "lib/assert.h"
#include "lib/errors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > UINT32_MAX)
        return 0;
    struct method m;
    int rc = method_decode(&m, data, (uint32_t)size);
    ASSERT(rc == OK || rc == E_SYNTAX || rc == E_UNKNOWN_METHOD);
    if (rc != OK)
        return 0;
    ASSERT(method_name(m.id) != NULL);
    uint8_t *buf = malloc(size + 1);
    ASSERT(buf != NULL);
    size_t n = method_encode(&m, buf, size + 1);
    ASSERT(n == size); /* same length: only unused bits may differ */
    ASSERT(method_encode(&m, buf, size - 1) == 0);
    struct method d;
    ASSERT(method_decode(&d, buf, (uint32_t)n) == OK);
    ASSERT(method_equal(&m, &d));
    uint8_t *again = malloc(n);
    ASSERT(again != NULL);
    ASSERT(method_encode(&d, again, n) == n);
    ASSERT(memcmp(buf, again, n) == 0);
    free(again);
    free(buf);
    return 0;
}
