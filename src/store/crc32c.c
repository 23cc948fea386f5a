/*
 * crc32c.c: see crc32c.h. The table is built once (thread-safe through
 * pthread_once) because the journal thread and the loop thread both checksum.
 */
#include "store/crc32c.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "lib/assert.h"

#define CRC32C_POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static bool have_sse42;

static void table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
    }
    ASSERT(table[0][1] == 0xF26B8303u); /* a known entry of the Castagnoli table */
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

uint32_t crc32c_portable(uint32_t crc, const void *data, size_t size)
{
    pthread_once(&table_once, table_init);
    const uint8_t *p = data;
    uint32_t c = ~crc;
    while (size >= 8) {
        uint32_t lo;
        uint32_t hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c; /* little-endian hosts only; asserted in crc32c() */
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^
            table[4][lo >> 24] ^ table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^
            table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
        p += 8;
        size -= 8;
    }
    while (size > 0) {
        c = table[0][(c ^ *p) & 0xFF] ^ (c >> 8);
        p++;
        size--;
    }
    return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data,
                                                                size_t size)
{
    const uint8_t *p = data;
    uint64_t c = ~crc;
    while (size >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        size -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (size > 0) {
        c32 = __builtin_ia32_crc32qi(c32, *p);
        p++;
        size--;
    }
    return ~c32;
}
#endif

uint32_t crc32c(uint32_t crc, const void *data, size_t size)
{
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the slicing tables assume LE");
    ASSERT(data != NULL || size == 0);
    pthread_once(&table_once, table_init);
#if defined(__x86_64__)
    if (have_sse42)
        return crc32c_sse42(crc, data, size);
#endif
    return crc32c_portable(crc, data, size);
}
