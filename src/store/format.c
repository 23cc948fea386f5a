/*
 * format.c: encoders and checkers for the records and file headers that
 * format.h describes. Pure: bytes in, bytes out, no I/O and no state.
 * Writers assert (they sized their own buffers); readers return a verdict.
 */
#include "store/format.h"

#include "lib/assert.h"
#include "store/crc32c.h"

void format_record_encode(uint8_t *out, enum record_type type, const void *a, uint32_t a_size,
                          const void *b, uint32_t b_size)
{
    ASSERT(format_record_type_valid((uint8_t)type));
    ASSERT((uint64_t)a_size + b_size <= FORMAT_RECORD_PAYLOAD_SIZE_MAX);
    uint32_t payload_size = a_size + b_size;
    uint64_t size = format_record_size(payload_size);
    format_put_u32(out + 4, payload_size);
    format_put_u16(out + 8, FORMAT_RECORD_MAGIC);
    out[10] = (uint8_t)type;
    out[11] = 0;
    format_put_u32(out + 12, 0);
    if (a_size > 0)
        memcpy(out + FORMAT_RECORD_HEADER_SIZE, a, a_size);
    if (b_size > 0)
        memcpy(out + FORMAT_RECORD_HEADER_SIZE + a_size, b, b_size);
    uint64_t used = FORMAT_RECORD_HEADER_SIZE + (uint64_t)payload_size;
    memset(out + used, 0, (size_t)(size - used));
    format_put_u32(out, crc32c(0, out + 4, (size_t)(size - 4)));
    /* Pair assertion: what we wrote reads back as the record we meant. */
    struct format_record_header h;
    uint64_t check_size;
    ASSERT(format_record_check(out, size, &h, &check_size) == FORMAT_CHECK_OK);
    ASSERT(h.type == (uint8_t)type && check_size == size);
}

enum format_check format_record_check(const uint8_t *p, uint64_t avail,
                                      struct format_record_header *header,
                                      uint64_t *record_size)
{
    ASSERT(p != NULL);
    if (avail < FORMAT_RECORD_HEADER_SIZE)
        return FORMAT_CHECK_SHORT;
    struct format_record_header h = {
        .crc32c = format_get_u32(p),
        .payload_size = format_get_u32(p + 4),
        .magic = format_get_u16(p + 8),
        .type = p[10],
        .flags = p[11],
        .reserved = format_get_u32(p + 12),
    };
    if (h.magic != FORMAT_RECORD_MAGIC || !format_record_type_valid(h.type) || h.flags != 0 ||
        h.reserved != 0 || h.payload_size > FORMAT_RECORD_PAYLOAD_SIZE_MAX)
        return FORMAT_CHECK_INVALID;
    uint64_t size = format_record_size(h.payload_size);
    if (size > avail)
        return FORMAT_CHECK_SHORT;
    if (crc32c(0, p + 4, (size_t)(size - 4)) != h.crc32c)
        return FORMAT_CHECK_INVALID;
    *header = h;
    *record_size = size;
    return FORMAT_CHECK_OK;
}

void format_file_header_encode(uint8_t out[FORMAT_FILE_HEADER_SIZE], const char *magic,
                               uint64_t queue_id, uint64_t segment_number)
{
    ASSERT(strlen(magic) == 7);
    memset(out, 0, FORMAT_FILE_HEADER_SIZE);
    memcpy(out, magic, 7);
    format_put_u32(out + 8, FORMAT_VERSION);
    format_put_u64(out + 16, queue_id);
    format_put_u64(out + 24, segment_number);
    format_put_u32(out + 12, crc32c(0, out, FORMAT_FILE_HEADER_SIZE));
    struct format_file_header check;
    ASSERT(format_file_header_decode(out, magic, &check));
}

bool format_file_header_decode(const uint8_t in[FORMAT_FILE_HEADER_SIZE], const char *magic,
                               struct format_file_header *out)
{
    ASSERT(strlen(magic) == 7);
    uint8_t copy[FORMAT_FILE_HEADER_SIZE];
    memcpy(copy, in, sizeof(copy));
    memset(copy + 12, 0, 4);
    if (crc32c(0, copy, sizeof(copy)) != format_get_u32(in + 12))
        return false;
    if (memcmp(in, magic, 8) != 0 || format_get_u32(in + 8) != FORMAT_VERSION)
        return false;
    memcpy(out->magic, in, 8);
    out->version = FORMAT_VERSION;
    out->crc32c = format_get_u32(in + 12);
    out->queue_id = format_get_u64(in + 16);
    out->segment_number = format_get_u64(in + 24);
    return true;
}

uint64_t format_queue_id(const uint8_t *vhost, uint32_t vhost_size, const uint8_t *name,
                         uint32_t name_size)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint8_t size_bytes[4];
    const uint8_t *parts[4] = {size_bytes, vhost, size_bytes, name};
    uint32_t sizes[4] = {4, vhost_size, 4, name_size};
    for (int part = 0; part < 4; part++) {
        if (part == 0)
            format_put_u32(size_bytes, vhost_size);
        if (part == 2)
            format_put_u32(size_bytes, name_size);
        for (uint32_t i = 0; i < sizes[part]; i++) {
            h ^= parts[part][i];
            h *= 0x100000001b3ull;
        }
    }
    return h;
}
