/*
 * frame_out.c: see frame_out.h.
 */
#include "broker/frame_out.h"

#include <string.h>

#include "amqp/frame.h"
#include "broker/message.h"
#include "lib/assert.h"
#include "net/conn.h"

size_t frame_out_method(struct conn *conn, uint16_t channel, const struct method *m)
{
    if (conn->closing)
        return 0;
    /* Most methods fit in 512 bytes; tables can make them much larger. */
    size_t cap = 512;
    for (;;) {
        uint8_t *out = conn_out_reserve(conn, cap);
        size_t n = frame_write_method(out, cap, channel, m);
        if (n > 0) {
            conn_out_commit(conn, n);
            return n;
        }
        ASSERT(cap < (1u << 24));
        cap *= 8;
    }
}

size_t frame_out_basic_deliver(struct conn *conn, uint16_t channel, struct bytes consumer_tag,
                               uint64_t delivery_tag, bool redelivered, struct bytes exchange,
                               struct bytes routing_key)
{
    if (conn->closing)
        return 0;
    size_t n = frame_basic_deliver_size(consumer_tag, exchange, routing_key);
    uint8_t *out = conn_out_reserve(conn, n);
    size_t written = frame_write_basic_deliver(out, n, channel, consumer_tag, delivery_tag,
                                               redelivered, exchange, routing_key);
    ASSERT(written == n);
    conn_out_commit(conn, n);
    return n;
}

size_t frame_out_content(struct conn *conn, uint16_t channel, uint32_t frame_max,
                         struct message *m)
{
    ASSERT(frame_max > FRAME_OVERHEAD);
    ASSERT(m->body_received == m->body_size);
    if (conn->closing)
        return 0;
    size_t header_size = FRAME_OVERHEAD + 12 + (size_t)m->properties_size;
    uint8_t *out = conn_out_reserve(conn, header_size);
    size_t n = frame_write_content_header(out, header_size, channel, CLASS_BASIC, m->body_size,
                                          message_properties(m), m->properties_size);
    ASSERT(n == header_size);
    conn_out_commit(conn, n);
    size_t frames = 1;
    uint64_t payload_max = frame_max - FRAME_OVERHEAD;
    for (uint64_t offset = 0; offset < m->body_size; frames++) {
        uint64_t left = m->body_size - offset;
        uint32_t size = (uint32_t)(left < payload_max ? left : payload_max);
        if (size <= FRAME_OUT_BODY_COPY_MAX) {
            out = conn_out_reserve(conn, size + FRAME_OVERHEAD);
            frame_write_body_prefix(out, channel, size);
            memcpy(out + FRAME_HEADER_SIZE, m->body + offset, size);
            out[FRAME_HEADER_SIZE + size] = FRAME_END;
            conn_out_commit(conn, size + FRAME_OVERHEAD);
        } else {
            out = conn_out_reserve(conn, FRAME_HEADER_SIZE);
            frame_write_body_prefix(out, channel, size);
            conn_out_commit(conn, FRAME_HEADER_SIZE);
            message_ref(m);
            conn_out_ref(conn, m->body + offset, size, message_release_callback, m);
            static const uint8_t end = FRAME_END;
            conn_out_bytes(conn, &end, 1);
        }
        offset += size;
    }
    return frames;
}
