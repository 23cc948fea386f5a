/*
 * format.h: the journal's on-disk format, and nothing else.
 *
 * This header owns the byte layout of every file under the data dir: fixed
 * on-disk structs, their sizes (static_assert'ed) and the encode/decode
 * helpers that turn them into bytes. It must never hold in-memory state; the
 * journal's runtime structs live in journal_int.h. All integers are
 * little-endian. Every change here is a format change: bump
 * FORMAT_VERSION and keep a reader for the old version.
 *
 * DIRECTORY LAYOUT
 *
 *   DIR/definitions                    definitions log (file header + records)
 *   DIR/definitions.tmp                a snapshot being written (removed at start)
 *   DIR/queues/<id>/                   one durable queue, <id> = 16 lowercase hex
 *   DIR/queues/<id>/queue              queue header file: which vhost and queue
 *   DIR/queues/<id>/<number>.seg       message log segment, <number> = 16 hex
 *   DIR/queues/<id>.deleted-<n>/       a deleted queue being removed (removed at start)
 *
 *   <id> = FNV-1a 64 over (u32 vhost_size, vhost, u32 name_size, name), printed
 *   as %016llx. On a collision with another (vhost, name) the journal probes
 *   <id>+1, <id>+2, ... so <id> is stable for a name but not derivable from it
 *   alone: another broker taking over a queue reads the header file, not the hash.
 *
 * FILE HEADER (32 bytes, at offset 0 of every file)
 *
 *   offset size description
 *   0      8    magic: "QUAYSEG\0" (segment), "QUAYQUE\0" (queue header),
 *               "QUAYDEF\0" (definitions)
 *   8      4    version (FORMAT_VERSION)
 *   12     4    crc32c of bytes 0..31 computed with this field set to 0
 *   16     8    queue id (0 for definitions)
 *   24     8    segment number (0 for queue header and definitions)
 *
 * RECORD (header 16 bytes, payload, zero padding to a multiple of 8)
 *
 *   offset size description
 *   0      4    crc32c of bytes 4 .. end of padding (the whole record but this field)
 *   4      4    payload size in bytes (padding excluded)
 *   8      2    magic 0x5152 ("RQ" little-endian)
 *   10     1    type (enum record_type)
 *   11     1    flags, 0
 *   12     4    reserved, 0
 *   16     n    payload
 *   16+n   p    zero padding, p = (8 - (16+n) % 8) % 8
 *
 *   +--------+--------+----+--+--+--------+-------------------+-----+
 *   | crc32c |  size  |mag |ty|fl| resvd  |  payload (size)   | pad |
 *   +--------+--------+----+--+--+--------+-------------------+-----+
 *   0        4        8    10 11 12       16               16+size  align 8
 *
 * A segment:
 *
 *   +-------------+----------+----------+-----+----------+
 *   | file header | record 0 | record 1 | ... | record k |  (rolled near segment_size_max)
 *   +-------------+----------+----------+-----+----------+
 *   0             32
 *
 * PAYLOADS, queue segments
 *
 *   RECORD_PUBLISH    0  8  queue-local seq        8  n  message blob (opaque to the journal)
 *   RECORD_DELIVERED  0  8  seq (recovery sets redelivered = true)
 *   RECORD_ACK        0  8  seq (the message is gone)
 *   RECORD_PURGE      0  8  seq_below (every seq < seq_below is gone)
 *   RECORD_ACK_RANGE  0  8  first   8  8  last (every seq in [first, last]
 *                     is gone; first <= last)
 *   RECORD_DELETE     (empty) the queue is deleted; recovery finishes removing it
 *
 * PAYLOAD, queue header file (one record after the file header)
 *
 *   RECORD_QUEUE_NAME 0  4  vhost_size   4  v  vhost   4+v  n  queue name (rest)
 *
 * PAYLOADS, definitions
 *
 *   RECORD_DEF_PUT    0  4  kind (enum journal_def_kind)  4  4  key_size
 *                     8  k  key   8+k  n  value (rest, opaque)
 *   RECORD_DEF_DELETE 0  4  kind  4  4  key_size  8  k  key
 *
 * COMPATIBILITY NOTES
 *   - A record is self-contained (its crc covers everything but the crc
 *     field), so compaction copies records between segments byte for byte.
 *   - A PUBLISH may appear more than once for one seq (original and compacted
 *     copies); the last one in (segment number, offset) order wins. An ACK,
 *     ACK_RANGE, DELIVERED or PURGE always follows every copy of what it
 *     names.
 *   - A torn record can only be at the tail of a queue's last segment or of
 *     the definitions file: a segment is fdatasync'ed before the next one is
 *     written, and snapshots are renamed into place after their fdatasync.
 */
#ifndef QUAY_STORE_FORMAT_H
#define QUAY_STORE_FORMAT_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define FORMAT_VERSION 1u
#define FORMAT_FILE_HEADER_SIZE 32u
#define FORMAT_RECORD_HEADER_SIZE 16u
#define FORMAT_RECORD_MAGIC 0x5152u
#define FORMAT_RECORD_ALIGN 8u
/* The largest payload a reader accepts: bigger sizes are corruption. */
#define FORMAT_RECORD_PAYLOAD_SIZE_MAX (1024u * 1024u * 1024u)

#define FORMAT_MAGIC_SEGMENT "QUAYSEG"
#define FORMAT_MAGIC_QUEUE "QUAYQUE"
#define FORMAT_MAGIC_DEFINITIONS "QUAYDEF"

enum record_type {
    RECORD_PUBLISH = 1,
    RECORD_DELIVERED = 2,
    RECORD_ACK = 3,
    RECORD_PURGE = 4,
    RECORD_DELETE = 5,
    RECORD_ACK_RANGE = 6,
    RECORD_QUEUE_NAME = 16,
    RECORD_DEF_PUT = 32,
    RECORD_DEF_DELETE = 33,
};

/* On disk, at offset 0 of every file. Encoded field by field (see below). */
struct format_file_header {
    uint8_t magic[8];
    uint32_t version;
    uint32_t crc32c;
    uint64_t queue_id;
    uint64_t segment_number;
};
static_assert(sizeof(struct format_file_header) == FORMAT_FILE_HEADER_SIZE,
              "file header is 32 bytes on disk");

/* On disk, before every record's payload. */
struct format_record_header {
    uint32_t crc32c;
    uint32_t payload_size;
    uint16_t magic;
    uint8_t type;
    uint8_t flags;
    uint32_t reserved;
};
static_assert(sizeof(struct format_record_header) == FORMAT_RECORD_HEADER_SIZE,
              "record header is 16 bytes on disk");
static_assert(FORMAT_FILE_HEADER_SIZE % FORMAT_RECORD_ALIGN == 0,
              "records start aligned after the file header");
static_assert(FORMAT_RECORD_HEADER_SIZE % FORMAT_RECORD_ALIGN == 0,
              "payloads start aligned");

static inline void format_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void format_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void format_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t format_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t format_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static inline uint64_t format_get_u64(const uint8_t *p)
{
    return (uint64_t)format_get_u32(p) | ((uint64_t)format_get_u32(p + 4) << 32);
}

/* The on-disk size of a record with this payload size, padding included. */
static inline uint64_t format_record_size(uint64_t payload_size)
{
    uint64_t n = FORMAT_RECORD_HEADER_SIZE + payload_size;
    return (n + FORMAT_RECORD_ALIGN - 1) & ~(uint64_t)(FORMAT_RECORD_ALIGN - 1);
}

static inline bool format_record_type_valid(uint8_t type)
{
    return (type >= RECORD_PUBLISH && type <= RECORD_ACK_RANGE) || type == RECORD_QUEUE_NAME ||
           type == RECORD_DEF_PUT || type == RECORD_DEF_DELETE;
}

/* Encoders write whole records and file headers into caller-sized buffers
 * (writers assert; see format.c). Decoders return false on bad input. */

/* Writes a record with a payload made of two parts (either may be empty) into
 * out, which has room for format_record_size(a_size + b_size) bytes. */
void format_record_encode(uint8_t *out, enum record_type type, const void *a, uint32_t a_size,
                          const void *b, uint32_t b_size);

/* The result of checking the bytes at a record position. */
enum format_check {
    FORMAT_CHECK_OK,
    FORMAT_CHECK_SHORT,   /* fewer bytes available than the header or its size claim */
    FORMAT_CHECK_INVALID, /* bad magic, type, size or crc */
};

/* Checks the record at p with avail bytes available; on OK fills *header and
 * *record_size (padding included). */
enum format_check format_record_check(const uint8_t *p, uint64_t avail,
                                      struct format_record_header *header,
                                      uint64_t *record_size);

void format_file_header_encode(uint8_t out[FORMAT_FILE_HEADER_SIZE], const char *magic,
                               uint64_t queue_id, uint64_t segment_number);
bool format_file_header_decode(const uint8_t in[FORMAT_FILE_HEADER_SIZE], const char *magic,
                               struct format_file_header *out);

/* FNV-1a 64 over (u32 vhost_size, vhost, u32 name_size, name): the queue id. */
uint64_t format_queue_id(const uint8_t *vhost, uint32_t vhost_size, const uint8_t *name,
                         uint32_t name_size);

#endif
