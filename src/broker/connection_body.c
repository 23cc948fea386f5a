/*
 * connection_body.c: large body frames taken in parts and read straight
 * into their message.
 *
 * on_input parses whole frames, and a frame that is not all in waits in
 * the transport's buffer until it is: a 64 KiB body was read into the
 * scratch buffer, kept as the connection's leftover while the rest came,
 * and then copied into its message. A body frame whose header is in but
 * at least SPLIT_MIN_SIZE of whose payload is not, for a channel that is
 * assembling a message this frame continues, is taken in parts instead:
 * its header and the payload at hand at once; then the message makes room
 * for the rest by its own rule (what arrived, not what was declared:
 * message_reserve_body) and the transport reads the rest straight into
 * that room (conn_sink), in as many reads as it takes; then the end octet
 * is checked as for any frame. The body's bytes are copied by the kernel
 * only. Over TLS (no sink) the rest comes through on_input and is appended
 * as it arrives.
 *
 * Small frames, frames in error and frames for a closing channel stay on
 * the whole-frame path: their outcome (an error, a discard) is decided
 * there, once.
 */
#include "broker/connection.h"

#include "amqp/wire.h"
#include "broker/channel.h"
#include "broker/message.h"
#include "lib/assert.h"

/* Less than this missing: the frame is waited for whole (a few reads of
 * a small frame cost less than a sink and the short read after it). */
#define SPLIT_MIN_SIZE (16u << 10)

static struct connection *from_conn(struct conn *conn)
{
    return CONTAINER_OF(conn, struct connection, conn);
}

static struct channel *split_channel(const struct connection *connection)
{
    uint16_t id = connection->split.channel;
    return id < connection->channels_cap ? connection->channels[id] : NULL;
}

/* Room for the next part of the payload, and the transport told to read
 * it there (a TLS conn declines: the bytes come through on_input). */
static void sink_next(struct connection *connection)
{
    ASSERT(connection->split.active && !connection->split.sinking);
    if (connection->split.discard || connection->split.left == 0)
        return;
    size_t room = 0, after = 0;
    uint8_t *dst =
        channel_body_room(split_channel(connection), connection->split.left, &room, &after);
    if (dst == NULL)
        return; /* the channel failed: connection__body_dropped set discard */
    /* The read that ends the frame may go on into the block's tail: the
     * end octet and the next publish's frames come with it. */
    size_t tail = room == connection->split.left ? after : 0;
    connection->split.sinking = conn_sink(&connection->conn, dst, room, tail);
}

size_t connection__split_begin(struct connection *connection, const uint8_t *data, size_t size)
{
    ASSERT(!connection->split.active);
    if (size < FRAME_HEADER_SIZE || data[0] != FRAME_BODY)
        return 0;
    uint16_t channel = wire_get_u16(data + 1);
    uint32_t payload = wire_get_u32(data + 3);
    size_t have = size - FRAME_HEADER_SIZE;
    if (have >= payload || payload - have < SPLIT_MIN_SIZE)
        return 0;
    if (connection->state != CONNECTION_STATE_OPEN || connection->close_ok_owed > 0 ||
        connection->held > 0 || channel == 0 || channel > connection->channel_max)
        return 0;
    struct channel *ch = channel < connection->channels_cap ? connection->channels[channel] : NULL;
    if (ch == NULL || !channel_body_accepts(ch, payload))
        return 0;
    connection->split.active = true;
    connection->split.sinking = false;
    connection->split.discard = false;
    connection->split.channel = channel;
    connection->split.size = payload;
    connection->split.left = payload - (uint32_t)have;
    /* (A failure closes the channel, which sets discard.) */
    if (have > 0)
        (void)channel_body_append(ch, data + FRAME_HEADER_SIZE, have, 0);
    sink_next(connection);
    return size;
}

void connection__expect_body(struct connection *connection, uint16_t channel)
{
    if (connection->split.active || channel >= connection->channels_cap)
        return;
    struct channel *ch = connection->channels[channel];
    if (ch != NULL && channel_body_missing(ch) >= SPLIT_MIN_SIZE)
        conn_read_short(&connection->conn);
}

void connection__on_sink(struct conn *conn, size_t size)
{
    struct connection *connection = from_conn(conn);
    ASSERT(connection->split.active && connection->split.sinking);
    ASSERT(!connection->split.discard); /* a discard cancels the sink */
    ASSERT(size <= connection->split.left);
    channel_body_written(split_channel(connection), size);
    connection->split.left -= (uint32_t)size;
    if (conn->sink_size > 0)
        return; /* more of this part to come */
    connection->split.sinking = false;
    sink_next(connection);
}

/* The end octet of a split frame. False if it is wrong (the connection
 * is failed, as frame_parse's E_FRAME would have it). */
static bool split_end(struct connection *connection, uint8_t end)
{
    struct channel *ch = connection->split.discard ? NULL : split_channel(connection);
    connection->split.active = false;
    if (end != FRAME_END) {
        const struct message *m = ch ? channel_assembling(ch) : NULL;
        const uint8_t *payload = m ? m->body + m->body_received - connection->split.size : NULL;
        connection__fail_frame_end(connection, FRAME_BODY, payload,
                                   payload ? connection->split.size : 0, end);
        return false;
    }
    connection->conn.in_units++;
    if (ch != NULL)
        channel_body_frame_done(ch);
    return true;
}

long connection__split_input(struct connection *connection, const uint8_t *data, size_t size)
{
    ASSERT(connection->split.active && !connection->split.sinking);
    size_t used = 0;
    if (connection->split.left > 0) {
        used = size < connection->split.left ? size : connection->split.left;
        if (!connection->split.discard)
            (void)channel_body_append(split_channel(connection), data, used, 0);
        connection->split.left -= (uint32_t)used;
    }
    if (used == size)
        return (long)used;
    ASSERT(connection->split.left == 0);
    if (!split_end(connection, data[used]))
        return -1;
    return (long)used + 1;
}

void connection__body_dropped(struct connection *connection, uint16_t channel)
{
    if (!connection->split.active || connection->split.channel != channel)
        return;
    connection->split.discard = true;
    if (connection->split.sinking) {
        conn_sink_cancel(&connection->conn);
        connection->split.sinking = false;
    }
}
