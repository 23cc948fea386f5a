/*
 * dead_letter.c: see dead_letter.h. Not a hot path: the dead message is
 * rebuilt (new headers, re-encoded properties, body copied) and routed
 * through the dead-letter exchange like a fresh publish.
 *
 * x-death (RabbitMQ 3.10): an array of tables, newest first, one per
 * (queue, reason): count, reason, queue, time, exchange, routing-keys and,
 * for per-message TTL, original-expiration. A repeated death in the same
 * queue for the same reason increments its count and moves it to the
 * front. x-first-death-{reason,queue,exchange} are set once.
 */
#include "broker/dead_letter.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "amqp/method_gen.h"
#include "amqp/table.h"
#include "broker/broker.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

#define ROUTE_DESTS_MAX 1024

static const char *const reason_names[] = {"rejected", "expired", "maxlen"};

static bool is_death_of(const struct field_value *entry, struct bytes queue, const char *reason)
{
    struct field_value q, r;
    if (entry->kind != 'F')
        return false;
    return table_get(entry->table, "queue", &q) && (q.kind == 'S') && bytes_equal(q.str, queue) &&
           table_get(entry->table, "reason", &r) && (r.kind == 'S') &&
           bytes_equal_cstr(r.str, reason);
}

/* Writes the x-death entry for this death: an existing one with its count
 * incremented, or a new one. */
static void put_death(struct table_writer *w, const struct field_value *previous,
                      struct queue *queue, struct message *message, const char *reason,
                      const struct basic_properties *props)
{
    size_t mark = table_array_put_table_begin(w);
    if (previous) {
        struct table_iter it;
        struct bytes key;
        struct field_value v;
        table_iter_init(&it, previous->table);
        while (table_iter_next(&it, &key, &v)) {
            int64_t count;
            if (bytes_equal_cstr(key, "count") && field_value_as_int(&v, &count))
                table_put_int(w, "count", count + 1);
            else
                table_put_field(w, key, &v);
        }
    } else {
        table_put_int(w, "count", 1);
        table_put_longstr(w, "reason", bytes_of_cstr(reason));
        table_put_longstr(w, "queue", queue->name);
        table_put_timestamp(w, "time", (uint64_t)time(NULL));
        table_put_longstr(w, "exchange", message_exchange(message));
        size_t keys = table_put_array_begin(w, "routing-keys");
        table_array_put_longstr(w, message_routing_key(message));
        table_put_array_end(w, keys);
        if (props->flags & BASIC_FLAG_EXPIRATION)
            table_put_longstr(w, "original-expiration", props->expiration);
    }
    table_put_table_end(w, mark);
}

/* Builds the dead message's headers into w. */
static void build_headers(struct table_writer *w, struct queue *queue, struct message *message,
                          const char *reason, const struct basic_properties *props)
{
    struct table old = (props->flags & BASIC_FLAG_HEADERS) ? props->headers
                                                          : (struct table){NULL, 0};
    struct field_value deaths = {.kind = 0};
    bool have_deaths = table_get(old, "x-death", &deaths) && deaths.kind == 'A';
    /* The matching earlier death, if any, moves to the front. */
    struct field_value previous;
    bool found = false;
    if (have_deaths) {
        struct array_iter it;
        struct field_value entry;
        array_iter_init(&it, deaths.array);
        while (array_iter_next(&it, &entry)) {
            if (!found && is_death_of(&entry, queue->name, reason)) {
                previous = entry;
                found = true;
            }
        }
    }
    size_t array = table_put_array_begin(w, "x-death");
    put_death(w, found ? &previous : NULL, queue, message, reason, props);
    if (have_deaths) {
        struct array_iter it;
        struct field_value entry;
        array_iter_init(&it, deaths.array);
        while (array_iter_next(&it, &entry)) {
            if (!(found && is_death_of(&entry, queue->name, reason)))
                table_array_put_field(w, &entry);
        }
    }
    table_put_array_end(w, array);
    struct field_value v;
    if (!table_get(old, "x-first-death-reason", &v)) {
        table_put_longstr(w, "x-first-death-reason", bytes_of_cstr(reason));
        table_put_longstr(w, "x-first-death-queue", queue->name);
        table_put_longstr(w, "x-first-death-exchange", message_exchange(message));
    }
    /* Every other header is kept as it was. */
    struct table_iter it;
    struct bytes key;
    table_iter_init(&it, old);
    while (table_iter_next(&it, &key, &v)) {
        if (!bytes_equal_cstr(key, "x-death"))
            table_put_field(w, key, &v);
    }
}

/* Would delivering to target close a dead-letter cycle with no rejection
 * in it? RabbitMQ (rabbit_dead_letter:is_cycle) walks the dead message's
 * x-death, newest first (this death included), to the target's own
 * earlier death: if every death on the way (that one too) was automatic
 * (expired, maxlen) the message would loop with no client involved, and
 * it is dropped. A rejection anywhere on the way lets it go round (a
 * client decides each time); so does an entry we do not understand. */
static bool is_cycle(const struct queue *target, struct table headers)
{
    struct field_value deaths;
    if (!table_get(headers, "x-death", &deaths) || deaths.kind != 'A')
        return false;
    struct array_iter it;
    struct field_value entry;
    array_iter_init(&it, deaths.array);
    while (array_iter_next(&it, &entry)) {
        struct field_value reason, queue;
        if (entry.kind != 'F' || !table_get(entry.table, "reason", &reason) ||
            reason.kind != 'S' || bytes_equal_cstr(reason.str, "rejected"))
            return false;
        if (table_get(entry.table, "queue", &queue) && queue.kind == 'S' &&
            bytes_equal(queue.str, target->name))
            return true;
    }
    return false;
}

void dead_letter(struct queue *queue, struct message *message, enum dead_letter_reason reason)
{
    struct vhost *vhost = queue->vhost;
    struct exchange *exchange = NULL;
    if (queue->args.has_dead_letter_exchange)
        exchange = vhost_exchange(vhost, queue->args.dead_letter_exchange);
    if (!exchange) {
        message_unref(message);
        return;
    }
    struct basic_properties props;
    int rc = basic_properties_decode(&props, message_properties(message),
                                     message->properties_size);
    ASSERT(rc == OK); /* decoded once already when the message was made */
    const char *reason_name = reason_names[reason];
    size_t headers_cap = (props.flags & BASIC_FLAG_HEADERS ? props.headers.len : 0) + 1024 +
                         2u * queue->name.len + 2u * 256;
    uint8_t *headers_buf = xmalloc(headers_cap);
    struct table_writer w;
    table_writer_init(&w, headers_buf, headers_cap);
    build_headers(&w, queue, message, reason_name, &props);
    ASSERT(!w.overflow);
    props.headers = table_writer_table(&w);
    props.flags |= BASIC_FLAG_HEADERS;
    props.flags &= (uint16_t)~BASIC_FLAG_EXPIRATION; /* kept as original-expiration */
    size_t props_cap = message->properties_size + headers_cap + 16;
    uint8_t *props_buf = xmalloc(props_cap);
    size_t props_size = basic_properties_encode(&props, props_buf, props_cap);
    ASSERT(props_size > 0);
    struct bytes routing_key = queue->args.has_dead_letter_routing_key
                                   ? queue->args.dead_letter_routing_key
                                   : message_routing_key(message);
    struct basic_properties new_props;
    rc = basic_properties_decode(&new_props, props_buf, (uint32_t)props_size);
    ASSERT(rc == OK); /* pair assertion: what we encoded decodes */
    struct message *dead = message_new(exchange->name, routing_key, props_buf,
                                       (uint32_t)props_size, &new_props, message->body_size);
    ASSERT(dead != NULL);
    memcpy(dead->body, message->body, message->body_size);
    dead->body_received = dead->body_size;
    free(props_buf);
    free(headers_buf);
    message_unref(message);

    struct bind_dest *dests[ROUTE_DESTS_MAX];
    struct route_result result = {.dests = dests, .cap = ROUTE_DESTS_MAX};
    /* (routing_key may be the dead message's own: routed by the copy.) */
    vhost_route(vhost, exchange, message_routing_key(dead), dead->headers, &result);
    struct queue *targets[ROUTE_DESTS_MAX];
    uint32_t targets_count = 0;
    for (uint32_t i = 0; i < result.count; i++) {
        struct queue *target = CONTAINER_OF(result.dests[i], struct queue, as_dest);
        if (is_cycle(target, dead->headers)) {
            LOG_DEBUG("vhost=%.*s queue=%.*s dead-letter cycle, message dropped",
                      (int)vhost->name.len, (const char *)vhost->name.ptr,
                      (int)target->name.len, (const char *)target->name.ptr);
            continue;
        }
        targets[targets_count++] = target;
    }
    /* Dead-lettering is at-most-once (RabbitMQ 3.10's classic queues): a
     * full target with reject-publish drops it, and nobody waits for a
     * target on another broker (its forward is resent if the link drops,
     * but lost with this broker). The targets' own backups get it as they
     * get any publish. */
    struct queue_publish_summary summary;
    queue_publish_routed(targets, targets_count, dead, NULL, true, &summary);
    message_unref(dead);
}
