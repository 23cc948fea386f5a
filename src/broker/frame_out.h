/*
 * frame_out.h: AMQP frames written to a transport's output, the one way
 * both ends of quay write them: the server side (connection.c, channel*.c)
 * and the client side of the cluster links (cluster/link.c).
 *
 * A method is one frame; content is a header frame, then the body in
 * frames of at most frame_max bytes (none for an empty body). Small body
 * frames are copied into the output; larger ones are queued by reference
 * (zero copy), each holding a message reference until its bytes are on
 * the socket. Writing to a closing conn does nothing.
 *
 * Never: decides what to send or keeps state; the callers do.
 */
#ifndef QUAY_BROKER_FRAME_OUT_H
#define QUAY_BROKER_FRAME_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"

struct conn;
struct message;
struct method;

/* Body frames up to this many bytes are copied rather than referenced: a
 * reference chunk and its message reference cost more than the copy. */
#define FRAME_OUT_BODY_COPY_MAX 8192

/* Writes one method frame. Returns the bytes queued (0 if closing). */
size_t frame_out_method(struct conn *conn, uint16_t channel, const struct method *m);
/* Writes a basic.deliver method frame (the bytes frame_out_method would
 * write for it, built without a struct method: one per message delivered).
 * Returns the bytes queued (0 if closing). */
size_t frame_out_basic_deliver(struct conn *conn, uint16_t channel, struct bytes consumer_tag,
                               uint64_t delivery_tag, bool redelivered, struct bytes exchange,
                               struct bytes routing_key);
/* Writes the message's content header (its properties as encoded) and
 * body frames. frame_max is the negotiated whole-frame size. Returns the
 * number of frames queued (0 if closing). */
size_t frame_out_content(struct conn *conn, uint16_t channel, uint32_t frame_max,
                         struct message *m);

#endif
