/*
 * crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum
 * of every journal record. Uses the SSE4.2 crc32 instruction when the CPU has
 * it and a slicing-by-8 table otherwise; both give the same answer, which the
 * unit tests check against the RFC 3720 vectors.
 */
#ifndef QUAY_STORE_CRC32C_H
#define QUAY_STORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a crc: crc32c(crc32c(0, a), b) == crc32c(0, a ++ b). */
uint32_t crc32c(uint32_t crc, const void *data, size_t size);

/* The portable path alone, for tests and for CPUs without SSE4.2. */
uint32_t crc32c_portable(uint32_t crc, const void *data, size_t size);

#endif
