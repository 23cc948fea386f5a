/*
 * base64.c: see base64.h.
 */
#include "lib/base64.h"

#include <stdbool.h>

#include "lib/assert.h"
#include "lib/errors.h"

static const char alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t base64_encoded_size(size_t size)
{
    ASSERT(size <= SIZE_MAX / 4 * 3 - 2);
    return (size + 2) / 3 * 4;
}

void base64_encode(const uint8_t *in, size_t size, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < size; i += 3) {
        uint32_t left = (uint32_t)(size - i);
        uint32_t v = (uint32_t)in[i] << 16;
        if (left > 1)
            v |= (uint32_t)in[i + 1] << 8;
        if (left > 2)
            v |= in[i + 2];
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = left > 1 ? alphabet[(v >> 6) & 63] : '=';
        out[o++] = left > 2 ? alphabet[v & 63] : '=';
    }
    out[o] = '\0';
    ASSERT(o == base64_encoded_size(size));
}

/* The 6-bit value of c, or -1 outside the alphabet ('=' included). */
static int sextet(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

int base64_decode(const char *in, size_t size, uint8_t *out, size_t out_cap, size_t *out_size)
{
    if (size % 4 != 0)
        return E_SYNTAX;
    size_t o = 0;
    for (size_t i = 0; i < size; i += 4) {
        bool last = i + 4 == size;
        /* Padding: "xx==" or "xxx=", in the last quartet only. */
        size_t pad = 0;
        if (last && in[i + 3] == '=')
            pad = in[i + 2] == '=' ? 2 : 1;
        uint32_t v = 0;
        for (size_t k = 0; k < 4 - pad; k++) {
            int s = sextet(in[i + k]);
            if (s < 0)
                return E_SYNTAX;
            v = v << 6 | (uint32_t)s;
        }
        v <<= 6 * pad;
        /* Canonical: the bits the padding leaves over are zero. */
        if ((pad == 1 && (v & 0xff) != 0) || (pad == 2 && (v & 0xffff) != 0))
            return E_SYNTAX;
        size_t n = 3 - pad;
        if (n > out_cap - o)
            return E_LIMIT;
        out[o++] = (uint8_t)(v >> 16);
        if (n > 1)
            out[o++] = (uint8_t)(v >> 8);
        if (n > 2)
            out[o++] = (uint8_t)v;
    }
    *out_size = o;
    return OK;
}
