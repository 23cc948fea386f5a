/*
 * frame.c: the resumable frame reader, content-header decoding and the
 * frame writers.
 *
 * The reader is stateless between calls on purpose: everything it needs is
 * in the caller's buffer, so a frame split at any byte parses the same once
 * the rest arrives, and a fuzzer can drive it directly. It checks type,
 * channel (heartbeats), size against frame_max, and the frame-end octet
 * before handing a frame out. Never allocates, never does I/O.
 */
#include "amqp/frame.h"

#include <assert.h>
#include <string.h>

#include "amqp/wire.h"
#include "lib/assert.h"
#include "lib/errors.h"

static_assert(FRAME_OVERHEAD == FRAME_HEADER_SIZE + 1, "frame overhead is header + end octet");
static_assert(FRAME_END == 206, "spec frame-end");

const uint8_t PROTOCOL_HEADER[PROTOCOL_HEADER_SIZE] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};

static bool frame_type_known(uint8_t type)
{
    return type == FRAME_METHOD || type == FRAME_HEADER || type == FRAME_BODY ||
           type == FRAME_HEARTBEAT;
}

int frame_parse(const struct frame_reader *r, const uint8_t *buf, size_t len,
                struct frame *out, size_t *need_out)
{
    ASSERT(r != NULL);
    ASSERT(buf != NULL || len == 0);
    uint32_t frame_max = r->frame_max == 0 ? FRAME_MIN_SIZE : r->frame_max;
    ASSERT(frame_max >= FRAME_OVERHEAD);
    ASSERT(frame_max <= INT32_MAX); /* the byte count is returned as an int */
    if (need_out != NULL)
        *need_out = FRAME_OVERHEAD;

    if (len >= 1 && !frame_type_known(buf[0]))
        return E_FRAME;
    if (len >= 3 && buf[0] == FRAME_HEARTBEAT && wire_get_u16(buf + 1) != 0)
        return E_FRAME;
    if (len < FRAME_HEADER_SIZE)
        return 0;

    uint8_t type = buf[0];
    uint32_t size = wire_get_u32(buf + 3);
    if (size > frame_max - FRAME_OVERHEAD)
        return E_FRAME;
    if (type == FRAME_METHOD && size < 4)
        return E_FRAME; /* cannot even hold class-id and method-id */
    if (type == FRAME_HEARTBEAT && size != 0)
        return E_FRAME;

    size_t total = (size_t)size + FRAME_OVERHEAD;
    if (need_out != NULL)
        *need_out = total;
    if (!(total <= len))
        return 0;
    if (buf[FRAME_HEADER_SIZE + size] != FRAME_END)
        return E_FRAME;

    out->type = type;
    out->channel = wire_get_u16(buf + 1);
    out->size = size;
    out->payload = buf + FRAME_HEADER_SIZE;
    return (int)total;
}

int content_header_decode(struct content_header *out, const uint8_t *payload, uint32_t size)
{
    ASSERT(out != NULL);
    ASSERT(payload != NULL || size == 0);
    if (size < CONTENT_HEADER_FIXED_SIZE)
        return E_FRAME;
    out->class_id = wire_get_u16(payload);
    out->weight = wire_get_u16(payload + 2);
    out->body_size = wire_get_u64(payload + 4);
    out->properties = payload + 12;
    out->properties_size = size - 12;
    if (out->weight != 0)
        return E_FRAME;
    return OK;
}

/* Writes the 7-byte frame header. */
static void put_frame_header(uint8_t *out, uint8_t type, uint16_t channel, uint32_t size)
{
    out[0] = type;
    wire_put_u16(out + 1, channel);
    wire_put_u32(out + 3, size);
}

size_t frame_write_method(uint8_t *out, size_t cap, uint16_t channel, const struct method *m)
{
    ASSERT(out != NULL || cap == 0);
    ASSERT(m != NULL);
    if (cap < FRAME_OVERHEAD + 4)
        return 0;
    size_t size = method_encode(m, out + FRAME_HEADER_SIZE, cap - FRAME_OVERHEAD);
    if (size == 0)
        return 0;
    ASSERT(size <= UINT32_MAX);
    put_frame_header(out, FRAME_METHOD, channel, (uint32_t)size);
    out[FRAME_HEADER_SIZE + size] = FRAME_END;
    return size + FRAME_OVERHEAD;
}

static uint8_t *put_shortstr(uint8_t *p, struct bytes s)
{
    ASSERT(s.len <= 255);
    *p++ = (uint8_t)s.len;
    if (s.len > 0) /* an empty slice may have no pointer (the default exchange) */
        memcpy(p, s.ptr, s.len);
    return p + s.len;
}

size_t frame_write_basic_deliver(uint8_t *out, size_t cap, uint16_t channel,
                                 struct bytes consumer_tag, uint64_t delivery_tag,
                                 bool redelivered, struct bytes exchange,
                                 struct bytes routing_key)
{
    ASSERT(out != NULL || cap == 0);
    size_t n = frame_basic_deliver_size(consumer_tag, exchange, routing_key);
    if (cap < n)
        return 0;
    put_frame_header(out, FRAME_METHOD, channel, (uint32_t)(n - FRAME_OVERHEAD));
    uint8_t *p = out + FRAME_HEADER_SIZE;
    wire_put_u16(p, METHOD_CLASS_ID(METHOD_BASIC_DELIVER));
    wire_put_u16(p + 2, METHOD_METHOD_ID(METHOD_BASIC_DELIVER));
    p = put_shortstr(p + 4, consumer_tag);
    wire_put_u64(p, delivery_tag);
    p[8] = redelivered ? 0x01 : 0; /* the only bit of the method */
    p = put_shortstr(p + 9, exchange);
    p = put_shortstr(p, routing_key);
    *p++ = FRAME_END;
    ASSERT((size_t)(p - out) == n);
    return n;
}

size_t frame_write_content_header(uint8_t *out, size_t cap, uint16_t channel, uint16_t class_id,
                                  uint64_t body_size, const uint8_t *properties,
                                  uint32_t properties_size)
{
    ASSERT(out != NULL || cap == 0);
    ASSERT(properties != NULL);
    ASSERT(properties_size >= 2); /* at least the flags word */
    ASSERT(properties_size <= UINT32_MAX - 12);
    size_t size = 12 + (size_t)properties_size;
    if (!(FRAME_OVERHEAD <= cap && size <= cap - FRAME_OVERHEAD))
        return 0;
    put_frame_header(out, FRAME_HEADER, channel, (uint32_t)size);
    uint8_t *p = out + FRAME_HEADER_SIZE;
    wire_put_u16(p, class_id);
    wire_put_u16(p + 2, 0); /* weight */
    wire_put_u64(p + 4, body_size);
    memcpy(p + 12, properties, properties_size);
    out[FRAME_HEADER_SIZE + size] = FRAME_END;
    return size + FRAME_OVERHEAD;
}

size_t frame_write_heartbeat(uint8_t *out, size_t cap)
{
    ASSERT(out != NULL || cap == 0);
    if (cap < FRAME_OVERHEAD)
        return 0;
    put_frame_header(out, FRAME_HEARTBEAT, 0, 0);
    out[FRAME_HEADER_SIZE] = FRAME_END;
    return FRAME_OVERHEAD;
}

void frame_write_body_prefix(uint8_t out[FRAME_HEADER_SIZE], uint16_t channel, uint32_t size)
{
    ASSERT(out != NULL);
    put_frame_header(out, FRAME_BODY, channel, size);
}
