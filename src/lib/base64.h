/*
 * base64.h: RFC 4648 section 4 base64 (the standard alphabet, padded), for
 * HTTP Basic credentials (mgmt/http_guard.h) and password hashes.
 *
 * The decoder is strict, because its input comes from strangers and a
 * lenient one gives two spellings to one value: the length must be a
 * multiple of 4, '=' may only end the last quartet (one or two of them),
 * nothing outside the alphabet (no whitespace, no URL-safe letters), and
 * the bits a padded quartet leaves over must be zero, so every byte
 * string has exactly one encoding that decodes. Pure: no allocation.
 */
#ifndef QUAY_LIB_BASE64_H
#define QUAY_LIB_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* Characters base64_encode writes for size bytes (without the NUL). */
size_t base64_encoded_size(size_t size);
/* Writes base64_encoded_size(size) characters and a NUL into out, which
 * holds at least that plus one. */
void base64_encode(const uint8_t *in, size_t size, char *out);
/* Decodes in[0..size) into out (out_cap bytes). Returns OK with *out_size
 * set, or E_SYNTAX for anything but a canonical encoding (above) and
 * E_LIMIT if the bytes do not fit out. */
int base64_decode(const char *in, size_t size, uint8_t *out, size_t out_cap, size_t *out_size);

#endif
