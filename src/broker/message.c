/*
 * message.c: see message.h. Properties are decoded once here to pick out
 * what the broker acts on (delivery mode, priority, headers); the encoded
 * bytes are what deliveries send.
 */
#include "broker/message.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "lib/assert.h"

uint64_t message_live_count;
uint64_t message_live_bytes;

struct message *message_new(struct bytes exchange, struct bytes routing_key,
                            const uint8_t *properties, uint32_t properties_size,
                            const struct basic_properties *props, uint64_t body_size)
{
    ASSERT(exchange.len <= 255);
    ASSERT(routing_key.len <= 255);
    size_t head = (size_t)exchange.len + routing_key.len + properties_size;
    struct message *m = malloc(sizeof *m + head + body_size);
    if (!m)
        return NULL;
    m->refs = 1;
    m->properties_size = properties_size;
    m->body_size = body_size;
    m->body_received = 0;
    m->exchange_size = (uint8_t)exchange.len;
    m->routing_key_size = (uint8_t)routing_key.len;
    if (exchange.len)
        memcpy(m->data, exchange.ptr, exchange.len);
    if (routing_key.len)
        memcpy(m->data + exchange.len, routing_key.ptr, routing_key.len);
    uint8_t *props_copy = m->data + exchange.len + routing_key.len;
    memcpy(props_copy, properties, properties_size);
    m->body = props_copy + properties_size;
    m->persistent = (props->flags & BASIC_FLAG_DELIVERY_MODE) && props->delivery_mode == 2;
    m->priority = (props->flags & BASIC_FLAG_PRIORITY) ? props->priority : 0;
    m->headers = (struct table){NULL, 0};
    if ((props->flags & BASIC_FLAG_HEADERS) && props->headers.len > 0) {
        /* Re-point the headers slice at our own copy of the properties. */
        m->headers.ptr = props_copy + (props->headers.ptr - properties);
        m->headers.len = props->headers.len;
    }
    message_live_count++;
    message_live_bytes += body_size;
    return m;
}

void message_ref(struct message *message)
{
    ASSERT(message->refs > 0);
    message->refs++;
}

void message_unref(struct message *message)
{
    ASSERT(message->refs > 0);
    if (--message->refs == 0) {
        message_live_count--;
        message_live_bytes -= message->body_size;
        free(message);
    }
}

void message_release_callback(void *message)
{
    message_unref(message);
}
