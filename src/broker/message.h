/*
 * message.h: a published message, refcounted and shared.
 *
 * One allocation holds the routing facts, the encoded content properties
 * (exactly as the publisher sent them, so deliveries re-send them without
 * re-encoding) and the body. The body is copied once, from the input
 * buffer, while the message is assembled; after that every queue that the
 * message was routed to holds a reference, as does every output chunk
 * that is writing its body to a socket.
 *
 *   struct message | data[]:
 *                  +--------+----------+-------------+------------+---------+
 *                  | blob   | exchange | routing key | properties | body    |
 *                  | header |          |             | (encoded)  |         |
 *                  +--------+----------+-------------+------------+---------+
 *                  <------------------- message_blob() ------------------->
 *
 * The body's room grows as its frames arrive (message_append_body), never
 * ahead of them: a content header that declares 128 MiB costs the broker
 * nothing until the bytes come, so what a client declares cannot raise
 * the memory alarm; only what it sent can. While it grows the message has
 * one owner (the channel assembling it) and may move (realloc); complete,
 * its room is exactly body_size bytes.
 *
 * data[] is also the message's durable form: the journal stores exactly
 * these bytes (message_blob), and message_from_blob rebuilds a message
 * from them at recovery. The blob header (16 bytes, little-endian):
 *
 *   offset size  field
 *   0      1     format version (1)
 *   1      1     exchange size
 *   2      1     routing key size
 *   3      1     reserved (0)
 *   4      4     properties size
 *   8      8     body size
 *
 * message_unref() asserts refs > 0 and frees at zero.
 */
#ifndef QUAY_BROKER_MESSAGE_H
#define QUAY_BROKER_MESSAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"

struct message {
    uint32_t refs;
    uint32_t properties_size;
    uint64_t body_size;
    uint64_t body_received;       /* assembly progress; == body_size when complete */
    uint64_t body_capacity;       /* room for body bytes; == body_size when complete */
    uint64_t block_size;          /* bytes allocated for the struct and data[] */
    uint8_t exchange_size;
    uint8_t routing_key_size;
    uint8_t priority;
    bool persistent;              /* delivery-mode 2 */
    int64_t expiration_ms;        /* the expiration property; -1 = none */
    struct table headers;         /* points into the properties, may be empty */
    uint8_t *body;                /* points into data[] */
    uint8_t data[];
};

struct basic_properties;

/* Allocates a message with room for body_size bytes of body, refs = 1.
 * props are the decoded properties (basic_properties_decode of the same
 * bytes); the message keeps its own copy of the encoded bytes. */
struct message *message_new(struct bytes exchange, struct bytes routing_key,
                            const uint8_t *properties, uint32_t properties_size,
                            const struct basic_properties *props, uint64_t body_size);
/* The same for a body that is still to arrive: room for body_capacity
 * (<= body_size) bytes now, the rest reserved by message_append_body. */
struct message *message_new_partial(struct bytes exchange, struct bytes routing_key,
                                    const uint8_t *properties, uint32_t properties_size,
                                    const struct basic_properties *props, uint64_t body_size,
                                    uint64_t body_capacity);
/* Appends size bytes of body (at most what is still missing). When the
 * room is short it grows, geometrically so a large body is copied O(1)
 * times on average, but never past body_size, and at least by more_size:
 * body bytes the caller already holds beyond these (the rest of a read).
 * The message may move: *message is updated. Its only reference must be
 * the caller's. OK, or E_NOMEM (the message is unchanged). */
int message_append_body(struct message **message, const uint8_t *data, size_t size,
                        uint64_t more_size);

#define MESSAGE_BLOB_HEADER_SIZE 16

/* The durable form of a complete message: a slice of its own memory. */
struct bytes message_blob(const struct message *message);
/* Rebuilds a message from its durable form; NULL if the blob is malformed
 * (sizes that do not add up, properties that do not decode). */
struct message *message_from_blob(const uint8_t *blob, size_t size);
void message_ref(struct message *message);
void message_unref(struct message *message);

static inline struct bytes message_exchange(const struct message *m)
{
    return (struct bytes){m->data + MESSAGE_BLOB_HEADER_SIZE, m->exchange_size};
}

static inline struct bytes message_routing_key(const struct message *m)
{
    return (struct bytes){m->data + MESSAGE_BLOB_HEADER_SIZE + m->exchange_size,
                          m->routing_key_size};
}

static inline const uint8_t *message_properties(const struct message *m)
{
    return m->data + MESSAGE_BLOB_HEADER_SIZE + m->exchange_size + m->routing_key_size;
}

/* The message-id property (a slice of the message), empty when absent.
 * Decodes the properties: meant for the queues that de-duplicate. */
struct bytes message_id(const struct message *m);

/* Parses the expiration property as RabbitMQ does (a decimal integer of
 * milliseconds, 0..2^32-1 years aside). Returns 0, or -1 with the reason
 * in RabbitMQ's words ("no_integer", "{value_negative,-5}", ...). */
int message_parse_expiration(struct bytes text, int64_t *out, char *reason, size_t reason_size);

/* Makes room for more body bytes beyond those received, to be read
 * straight into m->body + m->body_received: for extra of them, but at most
 * what is still missing and at most MESSAGE_READ_AHEAD_SIZE or as many as
 * were received (the room stays within twice what arrived, as the
 * transport's own buffer for a partial frame would). Grows by
 * message_append_body's rule. The message may move. Its only reference
 * must be the caller's. OK or E_NOMEM. */
#define MESSAGE_READ_AHEAD_SIZE (64u << 10)
int message_reserve_body(struct message **message, uint64_t extra);
/* Body bytes written into the room by the caller (a read straight into
 * it): they count as received. */
void message_body_written(struct message *message, uint64_t size);

/* Large blocks (a message of 32 KiB or more) are kept when freed and
 * reused for the next large message: a fresh block's pages fault in as
 * they are first written (16 per 64 KiB message, measured), a reused one's
 * do not. At most MESSAGE_CACHE_BYTES are kept; message_cache_tick frees
 * them all once none was reused for a while. */
#define MESSAGE_CACHE_MIN_SIZE (32u << 10)
#define MESSAGE_CACHE_SLOTS 32
#define MESSAGE_CACHE_BYTES (32u << 20)
void message_cache_tick(uint64_t now_ms);
/* A large block has this much beyond its body: a read that fills the end
 * of a body may read on into it (what follows the body on the wire, moved
 * out at once: conn_sink's tail). */
#define MESSAGE_TAIL_SIZE 4096u
/* The bytes of m's block after the first end bytes of its body. */
static inline size_t message_block_after(const struct message *m, uint64_t end)
{
    return (size_t)(m->block_size - (sizeof *m + (size_t)(m->body - m->data) + end));
}
/* Frees every kept block (at shutdown, and for tests). */
void message_cache_clear(void);
struct message_cache_stats {
    uint64_t blocks, bytes, hits, misses;
};
struct message_cache_stats message_cache_stats(void);

/* For conn_out_ref's release callback. */
void message_release_callback(void *message);

/* Live messages (a gauge for tests and metrics, and the memory alarm's
 * estimate): their count, and the room their bodies hold. */
extern uint64_t message_live_count;
extern uint64_t message_live_bytes;

#endif
