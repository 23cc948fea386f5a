/*
 * frame.h: AMQP 0-9-1 frames: the resumable frame reader, the content
 * header, and the frame writers.
 *
 * Owns the frame layout (type u8, channel u16, size u32, payload, 0xCE).
 * Pure: bytes in, frames out. The reader never copies or allocates; a
 * parsed frame's payload borrows from the caller's input buffer. It never
 * interprets channel state (which channel may carry which frame is the
 * connection's business), only the frame's own well-formedness.
 */
#ifndef QUAY_AMQP_FRAME_H
#define QUAY_AMQP_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "amqp/method_gen.h"

enum frame_type { FRAME_METHOD = 1, FRAME_HEADER = 2, FRAME_BODY = 3, FRAME_HEARTBEAT = 8 };

#define FRAME_END 0xCE
#define FRAME_HEADER_SIZE 7 /* type(1) channel(2) size(4) */
#define FRAME_OVERHEAD 8    /* header + end octet */
#define FRAME_MIN_SIZE 4096 /* spec's frame-min-size; the limit before tune-ok */
#define PROTOCOL_HEADER_SIZE 8
#define CONTENT_HEADER_FIXED_SIZE 14 /* class-id(2) weight(2) body-size(8) flags(2) */

extern const uint8_t PROTOCOL_HEADER[PROTOCOL_HEADER_SIZE]; /* "AMQP\0\0\x09\x01" */

/* One parsed frame; payload is borrowed from the input buffer. */
struct frame {
    uint8_t type;
    uint16_t channel;
    uint32_t size;
    const uint8_t *payload; /* borrowed */
};

/* Reader settings, owned by the connection. The reader keeps no other
 * state: the caller keeps unconsumed bytes, so any split resumes. */
struct frame_reader {
    uint32_t frame_max; /* whole frame incl. 8 bytes overhead, as negotiated
                           in tune; 0 = FRAME_MIN_SIZE; at most INT32_MAX */
};

/*
 * Parses one frame from buf[0..len).
 * Returns >0 = bytes consumed (out filled, payload points into buf);
 * 0 = need more bytes: *need_out (if not NULL) is set to the total number of
 *     bytes this frame needs once its header is in, else to FRAME_OVERHEAD;
 * E_FRAME = unknown frame type, size > frame_max - 8, frame-end octet not
 *     0xCE, heartbeat on a channel other than 0 or with a payload, method
 *     frame shorter than 4 bytes.
 * Errors are reported as soon as the bytes that show them are in: a bad
 * type after 1 byte, a heartbeat's channel after 3, a bad size after 7.
 */
int frame_parse(const struct frame_reader *r, const uint8_t *buf, size_t len,
                struct frame *out, size_t *need_out);

/* Content header payload: class-id(2) weight(2) body-size(8), then the
 * properties (flags word and values, see basic_properties_decode). */
struct content_header {
    uint16_t class_id;
    uint16_t weight;
    uint64_t body_size;
    const uint8_t *properties; /* borrowed */
    uint32_t properties_size;
};

/* E_FRAME if size < 14 or weight != 0; OK otherwise. The properties are not
 * decoded here; class-id is not checked against the preceding method. */
int content_header_decode(struct content_header *out, const uint8_t *payload, uint32_t size);

/* Writers: return bytes written, 0 if cap is too small. */
size_t frame_write_method(uint8_t *out, size_t cap, uint16_t channel, const struct method *m);
/* properties = already-encoded flags+props bytes (basic_properties_encode). */
size_t frame_write_content_header(uint8_t *out, size_t cap, uint16_t channel, uint16_t class_id,
                                  uint64_t body_size, const uint8_t *properties,
                                  uint32_t properties_size);
size_t frame_write_heartbeat(uint8_t *out, size_t cap);
/* The bytes frame_write_method writes for this basic.deliver, without
 * building a struct method (zeroing its union) and dispatching through
 * method_encode: the broker writes one per message delivered. */
size_t frame_write_basic_deliver(uint8_t *out, size_t cap, uint16_t channel,
                                 struct bytes consumer_tag, uint64_t delivery_tag,
                                 bool redelivered, struct bytes exchange,
                                 struct bytes routing_key);
/* What frame_write_basic_deliver writes: at most 790 bytes. */
static inline size_t frame_basic_deliver_size(struct bytes consumer_tag, struct bytes exchange,
                                              struct bytes routing_key)
{
    return FRAME_OVERHEAD + 4 + 1 + (size_t)consumer_tag.len + 8 + 1 + 1 + exchange.len + 1 +
           routing_key.len;
}
/* Writes a body frame's 7-byte header; the caller then writes `size` body
 * bytes (scatter-gather) and one FRAME_END octet. */
void frame_write_body_prefix(uint8_t out[FRAME_HEADER_SIZE], uint16_t channel, uint32_t size);

#endif
