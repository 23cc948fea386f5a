/*
 * message.c: see message.h. Properties are decoded once here to pick out
 * what the broker acts on (delivery mode, priority, headers); the encoded
 * bytes are what deliveries send.
 */
#include "broker/message.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "lib/errors.h"
#include "lib/assert.h"

/* A body that outgrows its room gets at least this much more: bodies
 * trickled in tiny frames are not copied on every frame. */
#define BODY_GROWTH_MIN_SIZE 4096

uint64_t message_live_count;
uint64_t message_live_bytes;

#define PAGE_SIZE_ROUND 4096u

/* Kept large blocks (message.h). Best fit by a linear scan: at most
 * MESSAGE_CACHE_SLOTS entries, against a body of 32 KiB or more to copy. */
static struct {
    void *blocks[MESSAGE_CACHE_SLOTS];
    size_t sizes[MESSAGE_CACHE_SLOTS];
    uint32_t count;
    uint64_t bytes;
    uint64_t hits, misses;
    uint64_t hits_seen;           /* hits at the last tick that saw one */
    uint64_t idle_since_ms;
} cache;

/* Kept blocks go back to the allocator after this long without a reuse. */
#define CACHE_IDLE_MS 2000

/* A large block: whole pages, with MESSAGE_TAIL_SIZE beyond the body. */
static size_t round_block(size_t size)
{
    if (size < MESSAGE_CACHE_MIN_SIZE)
        return size;
    size += MESSAGE_TAIL_SIZE;
    return (size + PAGE_SIZE_ROUND - 1) & ~(size_t)(PAGE_SIZE_ROUND - 1);
}

/* A kept block of at least need bytes and at most a quarter more than
 * want (the whole message: a block that fits it is never grown again), or
 * NULL. A message whose body has not all arrived takes one too: the
 * block is memory already held. */
static void *cache_take(size_t need, size_t want, size_t *got)
{
    if (want < MESSAGE_CACHE_MIN_SIZE)
        return NULL;
    need += MESSAGE_TAIL_SIZE;
    want += MESSAGE_TAIL_SIZE;
    size_t limit = want + want / 4;
    uint32_t best = cache.count;
    for (uint32_t i = 0; i < cache.count; i++) {
        if (cache.sizes[i] >= need && cache.sizes[i] <= limit &&
            (best == cache.count || cache.sizes[i] < cache.sizes[best]))
            best = i;
    }
    if (best == cache.count) {
        cache.misses++;
        return NULL;
    }
    void *block = cache.blocks[best];
    *got = cache.sizes[best];
    cache.bytes -= *got;
    cache.count--;
    cache.blocks[best] = cache.blocks[cache.count];
    cache.sizes[best] = cache.sizes[cache.count];
    cache.hits++;
    return block;
}

static void block_put(void *block, size_t size)
{
    if (size >= MESSAGE_CACHE_MIN_SIZE && cache.count < MESSAGE_CACHE_SLOTS &&
        cache.bytes + size <= MESSAGE_CACHE_BYTES) {
        cache.blocks[cache.count] = block;
        cache.sizes[cache.count] = size;
        cache.count++;
        cache.bytes += size;
        return;
    }
    free(block);
}

void message_cache_clear(void)
{
    for (uint32_t i = 0; i < cache.count; i++)
        free(cache.blocks[i]);
    cache.count = 0;
    cache.bytes = 0;
}

void message_cache_tick(uint64_t now_ms)
{
    if (cache.hits != cache.hits_seen) {
        cache.hits_seen = cache.hits;
        cache.idle_since_ms = now_ms;
        return;
    }
    if (cache.count > 0 && now_ms - cache.idle_since_ms >= CACHE_IDLE_MS)
        message_cache_clear();
}

struct message_cache_stats message_cache_stats(void)
{
    return (struct message_cache_stats){cache.count, cache.bytes, cache.hits, cache.misses};
}

struct message *message_new(struct bytes exchange, struct bytes routing_key,
                            const uint8_t *properties, uint32_t properties_size,
                            const struct basic_properties *props, uint64_t body_size)
{
    return message_new_partial(exchange, routing_key, properties, properties_size, props,
                               body_size, body_size);
}

struct message *message_new_partial(struct bytes exchange, struct bytes routing_key,
                                    const uint8_t *properties, uint32_t properties_size,
                                    const struct basic_properties *props, uint64_t body_size,
                                    uint64_t body_capacity)
{
    ASSERT(exchange.len <= 255);
    ASSERT(routing_key.len <= 255);
    ASSERT(body_capacity <= body_size);
    size_t head = MESSAGE_BLOB_HEADER_SIZE + (size_t)exchange.len + routing_key.len +
                  properties_size;
    size_t block_size = 0;
    struct message *m = cache_take(sizeof *m + head + body_capacity,
                                   sizeof *m + head + body_size, &block_size);
    if (!m) {
        block_size = round_block(sizeof *m + head + body_capacity);
        m = malloc(block_size);
    }
    if (!m)
        return NULL;
    m->block_size = block_size;
    uint8_t *h = m->data;
    h[0] = 1;
    h[1] = (uint8_t)exchange.len;
    h[2] = (uint8_t)routing_key.len;
    h[3] = 0;
    for (int i = 0; i < 4; i++)
        h[4 + i] = (uint8_t)(properties_size >> (8 * i));
    for (int i = 0; i < 8; i++)
        h[8 + i] = (uint8_t)(body_size >> (8 * i));
    m->refs = 1;
    m->properties_size = properties_size;
    m->body_size = body_size;
    m->body_received = 0;
    m->body_capacity = body_capacity;
    m->exchange_size = (uint8_t)exchange.len;
    m->routing_key_size = (uint8_t)routing_key.len;
    uint8_t *names = m->data + MESSAGE_BLOB_HEADER_SIZE;
    if (exchange.len)
        memcpy(names, exchange.ptr, exchange.len);
    if (routing_key.len)
        memcpy(names + exchange.len, routing_key.ptr, routing_key.len);
    uint8_t *props_copy = names + exchange.len + routing_key.len;
    memcpy(props_copy, properties, properties_size);
    m->body = props_copy + properties_size;
    m->persistent = (props->flags & BASIC_FLAG_DELIVERY_MODE) && props->delivery_mode == 2;
    m->priority = (props->flags & BASIC_FLAG_PRIORITY) ? props->priority : 0;
    m->expiration_ms = -1;
    if (props->flags & BASIC_FLAG_EXPIRATION) {
        char reason[8];
        if (message_parse_expiration(props->expiration, &m->expiration_ms, reason,
                                     sizeof reason) != 0)
            m->expiration_ms = -1; /* the channel refuses these before here */
    }
    m->headers = (struct table){NULL, 0};
    if ((props->flags & BASIC_FLAG_HEADERS) && props->headers.len > 0) {
        /* Re-point the headers slice at our own copy of the properties. */
        m->headers.ptr = props_copy + (props->headers.ptr - properties);
        m->headers.len = props->headers.len;
    }
    message_live_count++;
    message_live_bytes += body_capacity;
    return m;
}

/* The room to grow to for need bytes of body: double, at least the
 * minimum step, never more than the body. */
static uint64_t grown_capacity(const struct message *m, uint64_t need)
{
    uint64_t capacity = m->body_capacity * 2;
    if (capacity < BODY_GROWTH_MIN_SIZE)
        capacity = BODY_GROWTH_MIN_SIZE;
    if (capacity < need)
        capacity = need;
    return capacity < m->body_size ? capacity : m->body_size;
}

/* A block for m with room for capacity body bytes, its bytes so far
 * moved over: a kept one that fits the whole message if there is one,
 * else realloc. NULL when out of memory (m is unchanged). */
static struct message *move_block(struct message *m, size_t body_offset, uint64_t capacity)
{
    size_t need = sizeof *m + body_offset + capacity;
    size_t got = 0;
    struct message *moved = cache_take(need, sizeof *m + body_offset + m->body_size, &got);
    if (moved) {
        memcpy(moved, m, sizeof *m + body_offset + m->body_received);
        block_put(m, m->block_size);
    } else {
        got = round_block(need);
        moved = realloc(m, got);
        if (!moved)
            return NULL;
    }
    moved->block_size = got;
    return moved;
}

static int grow(struct message **message, uint64_t need)
{
    struct message *m = *message;
    uint64_t capacity = grown_capacity(m, need);
    ASSERT(capacity >= need);
    /* Offsets, not pointers: the block may move. */
    size_t body_offset = (size_t)(m->body - m->data);
    size_t headers_offset = m->headers.ptr ? (size_t)(m->headers.ptr - m->data) : 0;
    if (sizeof *m + body_offset + capacity > m->block_size) {
        struct message *grown = move_block(m, body_offset, capacity);
        if (!grown)
            return E_NOMEM;
        grown->body = grown->data + body_offset;
        if (grown->headers.ptr)
            grown->headers.ptr = grown->data + headers_offset;
        m = grown;
    }
    message_live_bytes += capacity - m->body_capacity;
    m->body_capacity = capacity;
    *message = m;
    return OK;
}

int message_append_body(struct message **message, const uint8_t *data, size_t size,
                        uint64_t more_size)
{
    struct message *m = *message;
    ASSERT(m->refs == 1); /* nobody else may see it move */
    ASSERT(size <= m->body_size - m->body_received);
    uint64_t need = m->body_received + size;
    if (need > m->body_capacity) {
        uint64_t missing = m->body_size - need;
        int rc = grow(message, need + (more_size < missing ? more_size : missing));
        if (rc != OK)
            return rc;
        m = *message;
    }
    if (size > 0)
        memcpy(m->body + m->body_received, data, size);
    m->body_received = need;
    ASSERT(m->body_received <= m->body_capacity);
    return OK;
}

int message_reserve_body(struct message **message, uint64_t extra)
{
    struct message *m = *message;
    ASSERT(m->refs == 1); /* nobody else may see it move */
    uint64_t missing = m->body_size - m->body_received;
    uint64_t ahead = m->body_received > MESSAGE_READ_AHEAD_SIZE ? m->body_received
                                                                : MESSAGE_READ_AHEAD_SIZE;
    if (extra > missing)
        extra = missing;
    if (extra > ahead)
        extra = ahead;
    uint64_t need = m->body_received + extra;
    return need > m->body_capacity ? grow(message, need) : OK;
}

void message_body_written(struct message *message, uint64_t size)
{
    ASSERT(message->body_received + size <= message->body_capacity);
    message->body_received += size;
}

int message_parse_expiration(struct bytes text, int64_t *out, char *reason, size_t reason_size)
{
    /* Erlang's string:to_integer: optional sign, digits, then leftovers. */
    uint32_t i = 0;
    bool negative = false;
    if (i < text.len && (text.ptr[i] == '-' || text.ptr[i] == '+'))
        negative = text.ptr[i++] == '-';
    uint32_t digits_start = i;
    int64_t value = 0;
    while (i < text.len && text.ptr[i] >= '0' && text.ptr[i] <= '9') {
        if (value > (INT64_MAX - 9) / 10) {
            snprintf(reason, reason_size, "{value_too_large,%.*s}", (int)text.len,
                     (const char *)text.ptr);
            return -1;
        }
        value = value * 10 + (text.ptr[i++] - '0');
    }
    if (i == digits_start) {
        snprintf(reason, reason_size, "no_integer");
        return -1;
    }
    if (i < text.len) {
        snprintf(reason, reason_size, "{leftover_string,\"%.*s\"}", (int)(text.len - i),
                 (const char *)text.ptr + i);
        return -1;
    }
    if (negative && value > 0) {
        snprintf(reason, reason_size, "{value_negative,-%lld}", (long long)value);
        return -1;
    }
    /* RabbitMQ's check_expiry: at most 2^32-1 * 1000 ms... it caps at the
     * largest timer value Erlang accepts; keep the same bound. */
    if (value > 4294967295000LL) {
        snprintf(reason, reason_size, "{value_too_large,%lld}", (long long)value);
        return -1;
    }
    *out = value;
    return 0;
}

struct bytes message_blob(const struct message *message)
{
    ASSERT(message->body_received == message->body_size);
    ASSERT(message->body_capacity == message->body_size);
    size_t size = MESSAGE_BLOB_HEADER_SIZE + (size_t)message->exchange_size +
                  message->routing_key_size + message->properties_size + message->body_size;
    ASSERT(size <= UINT32_MAX);
    return (struct bytes){message->data, (uint32_t)size};
}

struct bytes message_id(const struct message *m)
{
    const uint8_t *p = message_properties(m);
    /* Most messages have none: the flags word says so without a decode. */
    if (m->properties_size < 2 || !(((uint16_t)(p[0] << 8 | p[1])) & BASIC_FLAG_MESSAGE_ID))
        return (struct bytes){0};
    struct basic_properties props;
    int rc = basic_properties_decode(&props, p, m->properties_size);
    ASSERT(rc == OK); /* they were decoded when the message was made */
    return props.message_id;
}

struct message *message_from_blob(const uint8_t *blob, size_t size)
{
    if (size < MESSAGE_BLOB_HEADER_SIZE || blob[0] != 1)
        return NULL;
    uint32_t props_size = 0;
    uint64_t body_size = 0;
    for (int i = 0; i < 4; i++)
        props_size |= (uint32_t)blob[4 + i] << (8 * i);
    for (int i = 0; i < 8; i++)
        body_size |= (uint64_t)blob[8 + i] << (8 * i);
    size_t names = (size_t)blob[1] + blob[2];
    size_t left = size - MESSAGE_BLOB_HEADER_SIZE;
    if (names > left || props_size > left - names || body_size != left - names - props_size)
        return NULL;
    const uint8_t *p = blob + MESSAGE_BLOB_HEADER_SIZE;
    struct basic_properties props;
    if (basic_properties_decode(&props, p + names, props_size) != OK)
        return NULL;
    struct bytes exchange = {p, blob[1]};
    struct bytes routing_key = {p + blob[1], blob[2]};
    struct message *m =
        message_new(exchange, routing_key, p + names, props_size, &props, body_size);
    if (!m)
        return NULL;
    memcpy(m->body, p + names + props_size, body_size);
    m->body_received = body_size;
    /* Pair assertion: what we rebuilt is byte for byte what was stored. */
    ASSERT(message_blob(m).len == size);
    DEBUG_ASSERT(memcmp(message_blob(m).ptr, blob, size) == 0);
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
        message_live_bytes -= message->body_capacity;
        block_put(message, message->block_size);
    }
}

void message_release_callback(void *message)
{
    message_unref(message);
}
