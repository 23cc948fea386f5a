/*
 * utf8.h: what every writer of text a stranger's bytes reach needs (the
 * JSON writer and reader, the Prometheus writer, the JSON log): whether
 * bytes are UTF-8.
 */
#ifndef QUAY_LIB_UTF8_H
#define QUAY_LIB_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence at p (at most left > 0 bytes), or 0
 * if the bytes there are not one (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
size_t utf8_sequence_size(const uint8_t *p, size_t left);
/* Writes code point cp (at most U+10FFFF) into out as UTF-8; returns how
 * many bytes that took, 1 to 4. */
size_t utf8_encode(uint32_t cp, char out[4]);

#endif
