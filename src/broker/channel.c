/*
 * channel.c: channel lifecycle, frame dispatch, content assembly and
 * routing of publishes, publisher confirms.
 *
 * Error discipline (§1.4.2 of the spec, and what clients expect): a soft
 * error sends channel.close and releases the channel's consumers and
 * unacked deliveries at once; until close-ok arrives the channel
 * discards every frame except channel.close / close-ok. Frame-order
 * violations (content where a method was due, a method inside content)
 * are hard errors: 505 UNEXPECTED_FRAME closes the connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/table.h"
#include "broker/broker.h"
#include "broker/channel_int.h"
#include "broker/cluster_ops.h"
#include "broker/connection.h"
#include "broker/durable.h"
#include "broker/exchange.h"
#include "broker/flow.h"
#include "broker/message.h"
#include "broker/usage.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/ring.h"
#include "lib/errors.h"
#include "lib/log.h"

#define ROUTE_DESTS_MAX 4096

/* ---- lifecycle ------------------------------------------------------ */

static struct channel *channel_new(struct connection *connection, uint16_t id)
{
    if (id >= connection->channels_cap) {
        uint32_t cap = connection->channels_cap ? connection->channels_cap : 4;
        while (cap <= id)
            cap *= 2;
        struct channel **grown = xrealloc(connection->channels, sizeof *grown * cap);
        memset(grown + connection->channels_cap, 0,
               sizeof *grown * (cap - connection->channels_cap));
        connection->channels = grown;
        connection->channels_cap = cap;
    }
    ASSERT(connection->channels[id] == NULL);
    struct channel *ch = xcalloc(1, sizeof *ch);
    ch->connection = connection;
    ch->vhost = connection->vhost;
    ch->id = id;
    ch->state = CHANNEL_STATE_OPEN;
    ch->flow_active = true;
    ch->next_delivery_tag = 1;
    ch->deliveries.first_tag = 1;
    list_init(&ch->consumers);
    hmap_init(&ch->consumers_by_tag);
    list_init(&ch->tx_ops);
    list_init(&ch->confirm_link);
    list_init(&ch->get_wait.link);
    list_init(&ch->durable_link);
    connection->channels[id] = ch;
    connection->channels_open++;
    usage_changed(connection->broker, connection);
    channel__rates_join(ch); /* its first sample: the values its rates start from */
    return ch;
}

/* Releases everything the channel holds, keeping the struct. */
static void release(struct channel *ch)
{
    ch->releasing = true;
    if (ch->assembling) {
        /* A body frame may be being read straight into it. */
        connection__body_dropped(ch->connection, ch->id);
        message_unref(ch->assembling);
        ch->assembling = NULL;
    }
    ch->content = CONTENT_STATE_NONE;
    channel__cluster_forget(ch);
    channel__forget_remote_op(ch);
    channel__forget_attaching(ch);
    channel__forget_held_get(ch);
    channel__release_consumers(ch);
    channel__requeue_all(ch);
    ASSERT(ch->unacked_count == 0); /* no consumer is left to take them back */
    channel__drop_tx(ch);
    if (list_linked(&ch->confirm_link))
        list_remove(&ch->confirm_link);
    if (list_linked(&ch->durable_link))
        list_remove(&ch->durable_link);
    ch->confirm_waits.count = 0;
    ch->commit_pending = false;
    ch->releasing = false;
}

/* Awaits the next auto-delete stand-in the client's close left without a
 * consumer here: true while one is awaited (close_pending). */
static bool await_next_check(struct channel *ch)
{
    while (ch->auto_delete_checks_count > 0) {
        struct queue *check = ch->auto_delete_checks[--ch->auto_delete_checks_count];
        channel__await_auto_delete(ch, check, METHOD_CHANNEL_CLOSE);
        queue_unref(check);
        if (ch->remote_op != NULL) {
            ch->close_pending = true;
            return true;
        }
    }
    return false;
}

void channel__finish_close(struct channel *ch)
{
    if (await_next_check(ch))
        return;
    ch->close_pending = false;
    if (ch->closing_with_connection) {
        struct connection *connection = ch->connection;
        channel_destroy(ch);
        connection_channel_closed(connection);
        return;
    }
    struct method ok = {.id = METHOD_CHANNEL_CLOSE_OK};
    channel__send(ch, &ok);
    channel_destroy(ch);
}

/* The client closes the channel: its consumers go first. Each auto-delete
 * stand-in that lost its last local consumer is checked with its primary
 * (channel__await_auto_delete) before the close is done: true while that
 * waits (close_pending; channel__finish_close goes on). */
static bool close_for_client(struct channel *ch)
{
    ch->client_closing = true;
    release(ch);
    ch->client_closing = false;
    return await_next_check(ch);
}

void channel__check_auto_delete_on_close(struct channel *ch, struct queue *queue)
{
    for (uint32_t i = 0; i < ch->auto_delete_checks_count; i++) {
        if (ch->auto_delete_checks[i] == queue)
            return;
    }
    if (ch->auto_delete_checks_count == ch->auto_delete_checks_cap) {
        ch->auto_delete_checks_cap = ch->auto_delete_checks_cap ? 2 * ch->auto_delete_checks_cap
                                                                : 4;
        ch->auto_delete_checks = xrealloc(ch->auto_delete_checks,
                                          ch->auto_delete_checks_cap * sizeof(struct queue *));
    }
    queue_ref(queue);
    ch->auto_delete_checks[ch->auto_delete_checks_count++] = queue;
}

bool channel_close_with_connection(struct channel *ch)
{
    if (close_for_client(ch)) {
        ch->closing_with_connection = true;
        return true;
    }
    channel_destroy(ch);
    return false;
}

void channel_destroy(struct channel *ch)
{
    release(ch);
    while (ch->auto_delete_checks_count > 0)
        queue_unref(ch->auto_delete_checks[--ch->auto_delete_checks_count]);
    free(ch->auto_delete_checks);
    ch->auto_delete_checks = NULL;
    ASSERT(ch->consumers_count == 0);
    ASSERT(ch->unacked_count == 0);
    hmap_free(&ch->consumers_by_tag);
    free(ch->deliveries.items);
    free(ch->publish_names);
    free(ch->permitted);
    free(ch->forward_target);
    free(ch->forward_targets);
    free(ch->last_queue);
    free(ch->confirm_waits.items);
    rates_leave(&ch->connection->broker->channels_active, &ch->rates);
    rates_free(&ch->rates);
    if (ch->sink) {
        ch->sink->channel = NULL;
        confirm_sink_unref(ch->sink);
    }
    connection__channel_gone(ch->connection, ch->id);
    free(ch);
}

void channel__send(struct channel *ch, const struct method *m)
{
    connection_send_method(ch->connection, ch->id, m);
}

static void vfail(struct channel *ch, uint16_t reply_code, uint32_t method_id, const char *fmt,
                  va_list ap)
{
    if (reply_code_is_hard(reply_code)) {
        connection_failv(ch->connection, reply_code, method_id, fmt, ap);
        return;
    }
    if (ch->state == CHANNEL_STATE_CLOSING)
        return;
    char text[1280];
    connection__reply_text(text, sizeof text, reply_code, fmt, ap);
    LOG_DEBUG("conn=%llu ch=%u closing: %u %s", (unsigned long long)ch->connection->conn.id,
              ch->id, reply_code, text);
    release(ch);
    struct method m = {.id = METHOD_CHANNEL_CLOSE};
    m.channel_close.reply_code = reply_code;
    m.channel_close.reply_text = (struct bytes){(const uint8_t *)text, (uint32_t)strlen(text)};
    m.channel_close.class_id = METHOD_CLASS_ID(method_id);
    m.channel_close.method_id = METHOD_METHOD_ID(method_id);
    channel__send(ch, &m);
    ch->state = CHANNEL_STATE_CLOSING;
}

void channel__fail(struct channel *ch, uint16_t reply_code, uint32_t method_id, const char *fmt,
                   ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(ch, reply_code, method_id, fmt, ap);
    va_end(ap);
}

bool channel__permitted(struct channel *ch, enum auth_permission_kind kind,
                        const char *resource, struct bytes name, uint32_t method_id)
{
    const struct auth_user *user = ch->connection->user;
    if (user == NULL || (user->any_vhost && user->permissions_count == 0))
        return true;
    if (name.len == 0 && strcmp(resource, "exchange") == 0)
        name = BYTES_LIT("amq.default");
    /* The user's permissions as they are now: a change made while the
     * channel is open holds from its next operation (auth.h). */
    if (auth_user_allows(user, ch->vhost->name, kind, name))
        return true;
    LOG_INFO("conn=%llu peer=%s user=%s vhost=%.*s refused %s access to %s '%.*s'",
             (unsigned long long)ch->connection->conn.id, ch->connection->conn.peer_name,
             user->name, (int)ch->vhost->name.len, (const char *)ch->vhost->name.ptr,
             auth_permission_kind_name(kind), resource, (int)name.len, (const char *)name.ptr);
    channel__fail(ch, REPLY_ACCESS_REFUSED, method_id,
                  "%s access to %s '%.*s' in vhost '%.*s' refused for user '%s'",
                  auth_permission_kind_name(kind), resource, (int)name.len,
                  (const char *)name.ptr, (int)ch->vhost->name.len,
                  (const char *)ch->vhost->name.ptr, user->name);
    return false;
}

/* The exchanges a channel's publishes were permitted to, with the user's
 * permissions_generation then: a channel that publishes to a few
 * exchanges in turn checks each once (a regex search costs a thousand
 * instructions and more, ~25% of a message's cost: bench/RESULTS.md). */
#define PERMITTED_MAX 8
struct permitted_exchanges {
    uint32_t generation;
    uint8_t count;
    uint8_t next;                     /* replaced next once all are used */
    uint8_t last;                     /* the last one published to: tried first */
    uint8_t sizes[PERMITTED_MAX];
    uint8_t names[PERMITTED_MAX][255];
};

static inline bool permitted_is(const struct permitted_exchanges *p, uint32_t i,
                                 struct bytes exchange)
{
    return p->sizes[i] == exchange.len &&
           (exchange.len == 0 || memcmp(p->names[i], exchange.ptr, exchange.len) == 0);
}

/* Whether p holds exchange; the one found is tried first next time. */
static bool permitted_find(struct permitted_exchanges *p, struct bytes exchange)
{
    for (uint32_t i = 0; i < p->count; i++) {
        if (permitted_is(p, i, exchange)) {
            p->last = (uint8_t)i;
            return true;
        }
    }
    return false;
}

/* basic.publish's write check, once per exchange while the user's
 * permissions do not change (a revocation holds from the next publish). */
static bool publish_permitted(struct channel *ch, struct bytes exchange, uint32_t method_id)
{
    const struct auth_user *user = ch->connection->user;
    uint32_t generation = user != NULL ? user->permissions_generation : 0;
    struct permitted_exchanges *p = ch->permitted;
    if (p != NULL && p->generation == generation &&
        (permitted_is(p, p->last, exchange) || permitted_find(p, exchange)))
        return true;
    if (!channel__permitted(ch, AUTH_PERMISSION_WRITE, "exchange", exchange, method_id))
        return false;
    if (p == NULL) {
        p = ch->permitted = xcalloc(1, sizeof *p);
    }
    if (p->generation != generation)
        *p = (struct permitted_exchanges){.generation = generation};
    uint32_t slot = p->count < PERMITTED_MAX ? p->count++ : p->next++ % PERMITTED_MAX;
    p->next %= PERMITTED_MAX;
    ASSERT(exchange.len <= sizeof p->names[slot]);
    if (exchange.len)
        memcpy(p->names[slot], exchange.ptr, exchange.len);
    p->sizes[slot] = (uint8_t)exchange.len;
    p->last = (uint8_t)slot;
    return true;
}

void channel__connection_fail(struct channel *ch, uint16_t reply_code, uint32_t method_id,
                              const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    connection_failv(ch->connection, reply_code, method_id, fmt, ap);
    va_end(ap);
}

/* ---- frames --------------------------------------------------------- */

/* A cluster peer's channel.open named a vhost we do not have. 530 is a
 * connection-level code, but only this channel is refused (channel.close,
 * then the usual wait for close-ok): the link's other vhosts still work. */
static void refuse_open(struct channel *ch, struct bytes vhost_name)
{
    char text[300];
    snprintf(text, sizeof text, "%s - vhost %.*s not found", reply_code_text(REPLY_NOT_ALLOWED),
             (int)vhost_name.len, (const char *)vhost_name.ptr);
    struct method m = {.id = METHOD_CHANNEL_CLOSE};
    m.channel_close.reply_code = REPLY_NOT_ALLOWED;
    m.channel_close.reply_text = (struct bytes){(const uint8_t *)text,
                                                (uint32_t)strnlen(text, 255)};
    m.channel_close.class_id = CLASS_CHANNEL;
    m.channel_close.method_id = METHOD_METHOD_ID(METHOD_CHANNEL_OPEN);
    channel__send(ch, &m);
    ch->state = CHANNEL_STATE_CLOSING;
}

/* Both sides sent channel.close: the client may still answer ours. */
static void remember_crossed(struct connection *connection, uint16_t id)
{
    if (connection->crossed_closes_count == connection->crossed_closes_cap) {
        uint32_t cap = connection->crossed_closes_cap ? connection->crossed_closes_cap * 2 : 4;
        uint16_t *grown = xrealloc(connection->crossed_closes, sizeof *grown * cap);
        connection->crossed_closes = grown;
        connection->crossed_closes_cap = cap;
    }
    connection->crossed_closes[connection->crossed_closes_count++] = id;
}

/* Forgets a crossed close of channel id; true if there was one. */
static bool forget_crossed(struct connection *connection, uint16_t id)
{
    for (uint32_t i = 0; i < connection->crossed_closes_count; i++) {
        if (connection->crossed_closes[i] == id) {
            connection->crossed_closes[i] =
                connection->crossed_closes[--connection->crossed_closes_count];
            return true;
        }
    }
    return false;
}

/* The user's max-channels over its connections to every broker of the
 * cluster (broker/usage.h): beyond it the connection fails, 530 (RabbitMQ
 * 3.10's rabbit_reader, its words). */
static bool user_channels_allow(struct connection *connection)
{
    const struct auth_user *user = connection->user;
    struct bytes name = bytes_of_cstr(user->name);
    int64_t limit = limit_set_value(&connection->broker->limits, LIMIT_SCOPE_USER, name,
                                    LIMIT_MAX_CHANNELS);
    if (limit < 0 ||
        limit_allows(limit, usage_count(connection->broker, LIMIT_SCOPE_USER, name,
                                        LIMIT_MAX_CHANNELS)))
        return true;
    connection_fail(connection, REPLY_NOT_ALLOWED, 0,
                    "number of channels opened for user '%s' has reached the maximum allowed "
                    "user limit of (%lld)", user->name, (long long)limit);
    return false;
}

void channel_handle_unopened(struct connection *connection, const struct frame *frame)
{
    if (frame->type != FRAME_METHOD) {
        connection_fail(connection, REPLY_CHANNEL_ERROR, 0, "expected 'channel.open'");
        return;
    }
    struct method m;
    if (!connection__decode_method(connection, frame, &m))
        return;
    bool crossed = connection->crossed_closes_count > 0 && forget_crossed(connection,
                                                                         frame->channel);
    if (crossed && m.id == METHOD_CHANNEL_CLOSE_OK)
        return; /* the client's answer to our close, which crossed its own */
    if (m.id != METHOD_CHANNEL_OPEN) {
        connection_fail(connection, REPLY_CHANNEL_ERROR, m.id, "expected 'channel.open'");
        return;
    }
    /* channel_max bounds how many channels are open, not their numbers. */
    if (connection->channels_open >= connection->channel_max) {
        connection_fail(connection, REPLY_NOT_ALLOWED, 0,
                        "number of channels opened (%u) has reached the negotiated "
                        "channel_max (%u)", connection->channels_open, connection->channel_max);
        return;
    }
    if (!connection->cluster_peer && !user_channels_allow(connection))
        return;
    struct channel *ch = channel_new(connection, frame->channel);
    struct bytes vhost_name = m.channel_open.reserved_1;
    if (connection->cluster_peer && vhost_name.len > 0) {
        /* A cluster link serves every vhost over one connection: it names
         * each channel's vhost in channel.open's reserved shortstr (its
         * old out-of-band field). Clients' values are ignored as ever. */
        ch->vhost = broker_vhost(connection->broker, vhost_name);
        if (!ch->vhost) {
            refuse_open(ch, vhost_name);
            return;
        }
    }
    struct method ok = {.id = METHOD_CHANNEL_OPEN_OK};
    ok.channel_open_ok.reserved_1 = BYTES_LIT("");
    channel__send(ch, &ok);
}

static void handle_channel_class(struct channel *ch, const struct method *m)
{
    switch (m->id) {
    case METHOD_CHANNEL_OPEN:
        channel__connection_fail(ch, REPLY_CHANNEL_ERROR, m->id,
                                 "second 'channel.open' seen");
        return;
    case METHOD_CHANNEL_CLOSE:
        if (!close_for_client(ch))
            channel__finish_close(ch);
        return;
    case METHOD_CHANNEL_CLOSE_OK:
        /* Unsolicited: the channel was not closing. */
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id, "unimplemented method");
        return;
    case METHOD_CHANNEL_FLOW: {
        /* RabbitMQ 3.x refuses to stop delivering on client request. */
        if (!m->channel_flow.active) {
            channel__fail(ch, REPLY_NOT_IMPLEMENTED, m->id, "active=false");
            return;
        }
        ch->flow_active = true;
        struct method ok = {.id = METHOD_CHANNEL_FLOW_OK};
        ok.channel_flow_ok.active = true;
        channel__send(ch, &ok);
        return;
    }
    default:
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id, "unimplemented method");
    }
}

static void handle_confirm_class(struct channel *ch, const struct method *m)
{
    if (m->id != METHOD_CONFIRM_SELECT) {
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id, "unimplemented method");
        return;
    }
    if (ch->tx_mode) {
        channel__fail(ch, REPLY_PRECONDITION_FAILED, m->id,
                      "cannot switch from tx to confirm mode");
        return;
    }
    ch->confirm_mode = true;
    if (!m->confirm_select.no_wait) {
        struct method ok = {.id = METHOD_CONFIRM_SELECT_OK};
        channel__send(ch, &ok);
    }
}

static void handle_method(struct channel *ch, const struct method *m)
{
    if (ch->state == CHANNEL_STATE_CLOSING) {
        if (m->id == METHOD_CHANNEL_CLOSE_OK) {
            channel_destroy(ch);
        } else if (m->id == METHOD_CHANNEL_CLOSE) {
            /* Both sides closed at once: each close is the other's close-ok
             * (§1.5.2.5). We answer, and are done; a client that answers
             * ours too is not faulted for it. */
            struct method ok = {.id = METHOD_CHANNEL_CLOSE_OK};
            struct connection *connection = ch->connection;
            uint16_t id = ch->id;
            channel__send(ch, &ok);
            channel_destroy(ch);
            remember_crossed(connection, id);
        }
        return;
    }
    switch (METHOD_CLASS_ID(m->id)) {
    case CLASS_CHANNEL:
        return handle_channel_class(ch, m);
    case CLASS_EXCHANGE:
        return channel__handle_exchange(ch, m);
    case CLASS_QUEUE:
        return channel__handle_queue(ch, m);
    case CLASS_BASIC:
        return channel__handle_basic(ch, m);
    case CLASS_CONFIRM:
        return handle_confirm_class(ch, m);
    case CLASS_TX:
        return channel__handle_tx(ch, m);
    default:
        channel__connection_fail(ch, REPLY_COMMAND_INVALID, m->id, "unimplemented method");
    }
}

void channel__rates_join(struct channel *ch)
{
    rates_join(&ch->connection->broker->channels_active, &ch->rates);
}

static void content_complete(struct channel *ch)
{
    struct message *message = ch->assembling;
    ASSERT(message->body_capacity == message->body_size);
    ch->assembling = NULL;
    ch->content = CONTENT_STATE_NONE;
    if (ch->publish_forward && ch->publish_replicate)
        channel__route_replica(ch, message);
    else if (ch->publish_forward)
        channel__route_forward(ch, message);
    else
        channel__route_publish(ch, message, ch->publish_mandatory);
    struct broker_counters *counters = channel__counters(ch);
    if (counters != NULL && !ch->publish_forward) {
        channel__rates_moved(ch);
        ch->stats.counts[CHANNEL_RATE_PUBLISH]++;
        counters->received++;
        counters->received_confirm += ch->confirm_mode;
    }
    message_unref(message);
}

static void handle_content_header(struct channel *ch, const struct frame *frame)
{
    struct content_header header;
    if (content_header_decode(&header, frame->payload, frame->size) != OK) {
        channel__connection_fail(ch, REPLY_FRAME_ERROR, METHOD_BASIC_PUBLISH,
                                 "malformed content header");
        return;
    }
    if (header.class_id != CLASS_BASIC) {
        channel__connection_fail(ch, REPLY_UNEXPECTED_FRAME, METHOD_BASIC_PUBLISH,
                                 "expected content header for class %u, got one for class %u "
                                 "instead", CLASS_BASIC, header.class_id);
        return;
    }
    uint64_t size_max = ch->connection->broker->config.limits.message_size_max;
    if (header.body_size > size_max) {
        /* Discarding the body frames still to come would need a state of
         * its own; RabbitMQ closes the channel here, and so do we. */
        ch->content = CONTENT_STATE_NONE;
        channel__fail(ch, REPLY_PRECONDITION_FAILED, METHOD_BASIC_PUBLISH,
                      "message size %llu is larger than configured max size %llu",
                      (unsigned long long)header.body_size, (unsigned long long)size_max);
        return;
    }
    struct basic_properties props;
    if (basic_properties_decode(&props, header.properties, header.properties_size) != OK) {
        char octets[320];
        connection__format_binary(octets, sizeof octets, frame->payload, frame->size);
        channel__connection_fail(ch, REPLY_FRAME_ERROR, METHOD_BASIC_PUBLISH,
                                 "cannot decode %s", octets);
        return;
    }
    int64_t expiration;
    char reason[64];
    if ((props.flags & BASIC_FLAG_EXPIRATION) &&
        message_parse_expiration(props.expiration, &expiration, reason, sizeof reason) != 0) {
        ch->content = CONTENT_STATE_NONE;
        channel__fail(ch, REPLY_PRECONDITION_FAILED, METHOD_BASIC_PUBLISH,
                      "invalid expiration '%.*s': %s", (int)props.expiration.len,
                      (const char *)props.expiration.ptr, reason);
        return;
    }
    const char *user = ch->connection->user->name;
    /* A forwarded message's user-id was checked by the broker it entered. */
    if ((props.flags & BASIC_FLAG_USER_ID) && !ch->publish_forward &&
        !bytes_equal_cstr(props.user_id, user)) {
        ch->content = CONTENT_STATE_NONE;
        channel__fail(ch, REPLY_PRECONDITION_FAILED, METHOD_BASIC_PUBLISH,
                      "user_id property set to '%.*s' but authenticated user was '%s'",
                      (int)props.user_id.len, (const char *)props.user_id.ptr, user);
        return;
    }
    struct bytes exchange = {ch->publish_names, ch->publish_exchange_size};
    struct bytes routing_key = {ch->publish_names + 256, ch->publish_routing_key_size};
    /* Room for the body bytes that came with the header (all of a small
     * message, usually: one allocation); the rest as they arrive. */
    uint64_t arrived = connection__body_ahead(ch->connection, ch->id);
    ch->assembling = message_new_partial(
        exchange, routing_key, header.properties, header.properties_size, &props,
        header.body_size, arrived < header.body_size ? arrived : header.body_size);
    if (!ch->assembling) {
        channel__fail(ch, REPLY_RESOURCE_ERROR, METHOD_BASIC_PUBLISH,
                      "cannot allocate a message of %llu bytes",
                      (unsigned long long)header.body_size);
        return;
    }
    ch->content = CONTENT_STATE_BODY;
    alarm_check_publish(ch->connection->broker);
    if (header.body_size == 0)
        content_complete(ch);
}

/* The message grew or may have: it holds more memory now. */
static void body_grew(struct channel *ch, uint64_t capacity)
{
    if (ch->assembling->body_capacity != capacity)
        alarm_check_publish(ch->connection->broker);
}

static void body_out_of_memory(struct channel *ch)
{
    channel__fail(ch, REPLY_RESOURCE_ERROR, METHOD_BASIC_PUBLISH,
                  "cannot allocate a message of %llu bytes",
                  (unsigned long long)ch->assembling->body_size);
}

bool channel_body_append(struct channel *ch, const uint8_t *data, size_t size, uint64_t more)
{
    uint64_t capacity = ch->assembling->body_capacity;
    if (message_append_body(&ch->assembling, data, size, more) != OK) {
        body_out_of_memory(ch);
        return false;
    }
    body_grew(ch, capacity);
    return true;
}

static void handle_content_body(struct channel *ch, const struct frame *frame)
{
    struct message *m = ch->assembling;
    if (frame->size > m->body_size - m->body_received) {
        channel__connection_fail(ch, REPLY_FRAME_ERROR, METHOD_BASIC_PUBLISH,
                                 "body frames exceed the declared body size %llu",
                                 (unsigned long long)m->body_size);
        return;
    }
    if (!channel_body_append(ch, frame->payload, frame->size,
                             connection__body_ahead(ch->connection, ch->id)))
        return;
    if (ch->assembling->body_received == ch->assembling->body_size)
        content_complete(ch);
}

bool channel_body_accepts(const struct channel *ch, uint32_t size)
{
    return ch->state != CHANNEL_STATE_CLOSING && ch->content == CONTENT_STATE_BODY &&
           ch->assembling != NULL &&
           size <= ch->assembling->body_size - ch->assembling->body_received;
}

uint8_t *channel_body_room(struct channel *ch, uint64_t want, size_t *room, size_t *after)
{
    ASSERT(want > 0);
    uint64_t capacity = ch->assembling->body_capacity;
    if (message_reserve_body(&ch->assembling, want) != OK) {
        body_out_of_memory(ch);
        return NULL;
    }
    body_grew(ch, capacity);
    struct message *m = ch->assembling;
    uint64_t free_room = m->body_capacity - m->body_received;
    ASSERT(free_room > 0);
    *room = (size_t)(free_room < want ? free_room : want);
    /* The room lies inside the block (what a read may fill after it too). */
    ASSERT(m->block_size >= sizeof *m + (size_t)(m->body - m->data) + m->body_capacity);
    *after = message_block_after(m, m->body_received + *room);
    return m->body + m->body_received;
}

uint64_t channel_body_missing(const struct channel *ch)
{
    if (ch->state == CHANNEL_STATE_CLOSING || ch->content != CONTENT_STATE_BODY ||
        ch->assembling == NULL)
        return 0;
    return ch->assembling->body_size - ch->assembling->body_received;
}

const struct message *channel_assembling(const struct channel *ch)
{
    return ch->assembling;
}

void channel_body_written(struct channel *ch, size_t size)
{
    message_body_written(ch->assembling, size);
}

void channel_body_frame_done(struct channel *ch)
{
    if (ch->assembling->body_received == ch->assembling->body_size)
        content_complete(ch);
}

void channel_handle_frame(struct channel *ch, const struct frame *frame)
{
    if (ch->state == CHANNEL_STATE_CLOSING && frame->type != FRAME_METHOD)
        return; /* content of a publish that raced our channel.close */
    switch (ch->content) {
    case CONTENT_STATE_HEADER:
        if (frame->type != FRAME_HEADER) {
            channel__connection_fail(ch, REPLY_UNEXPECTED_FRAME, METHOD_BASIC_PUBLISH,
                                     "expected content header for class %u, got non content "
                                     "header frame instead", CLASS_BASIC);
            return;
        }
        return handle_content_header(ch, frame);
    case CONTENT_STATE_BODY:
        if (frame->type != FRAME_BODY) {
            channel__connection_fail(ch, REPLY_UNEXPECTED_FRAME, METHOD_BASIC_PUBLISH,
                                     "expected content body, got non content body frame "
                                     "instead");
            return;
        }
        return handle_content_body(ch, frame);
    case CONTENT_STATE_NONE:
        break;
    }
    if (frame->type != FRAME_METHOD) {
        channel__connection_fail(ch, REPLY_UNEXPECTED_FRAME, 0,
                                 "expected method frame, got non method frame instead");
        return;
    }
    struct method m;
    if (!connection__decode_method(ch->connection, frame, &m))
        return;
    handle_method(ch, &m);
}

/* ---- publishing ----------------------------------------------------- */

/* The channel's publisher is owed acks: they go out at the end of the
 * loop iteration, with whatever else it is owed by then. */
static void owe_confirm(struct channel *ch)
{
    struct broker *broker = ch->connection->broker;
    if (!list_linked(&ch->confirm_link))
        list_push_back(&broker->confirms_owed, &ch->confirm_link);
    conn_out_owed(&ch->connection->conn);
    net_flush_hook_arm(&broker->net, &broker->confirms_hook);
}

/* basic.publish: remember where the content goes; the message is made
 * when its header arrives. Exchange checks happen now, as in RabbitMQ, so
 * a bad exchange fails the channel before any content is read. */
void channel__begin_publish(struct channel *ch, const struct method *m)
{
    const struct method_basic_publish *p = &m->basic_publish;
    if (p->immediate) {
        channel__connection_fail(ch, REPLY_NOT_IMPLEMENTED, m->id, "immediate=true");
        return;
    }
    if (!publish_permitted(ch, p->exchange, m->id))
        return; /* the content frames that follow are discarded, as below */
    struct exchange *exchange = vhost_exchange(ch->vhost, p->exchange);
    if (!exchange) {
        channel__fail(ch, REPLY_NOT_FOUND, m->id, "no exchange '%.*s' in vhost '%.*s'",
                      (int)p->exchange.len, (const char *)p->exchange.ptr,
                      (int)ch->vhost->name.len, (const char *)ch->vhost->name.ptr);
        /* The content frames that follow are discarded by the closing
         * channel (channel_handle_frame). */
        return;
    }
    if (exchange->internal) {
        channel__fail(ch, REPLY_ACCESS_REFUSED, m->id,
                      "cannot publish to internal exchange '%.*s' in vhost '%.*s'",
                      (int)p->exchange.len, (const char *)p->exchange.ptr,
                      (int)ch->vhost->name.len, (const char *)ch->vhost->name.ptr);
        return;
    }
    if (!ch->publish_names) {
        ch->publish_names = xmalloc(512);
    }
    memcpy(ch->publish_names, p->exchange.ptr, p->exchange.len);
    memcpy(ch->publish_names + 256, p->routing_key.ptr, p->routing_key.len);
    ch->publish_exchange_size = (uint8_t)p->exchange.len;
    ch->publish_routing_key_size = (uint8_t)p->routing_key.len;
    ch->publish_mandatory = p->mandatory;
    ch->publish_forward = false;
    ch->content = CONTENT_STATE_HEADER;
    alarm_note_publisher(ch->connection->broker, ch->connection);
}

bool channel__peer_only(struct channel *ch, uint32_t method_id)
{
    if (ch->connection->cluster_peer)
        return true;
    channel__connection_fail(ch, REPLY_NOT_IMPLEMENTED, method_id, "unknown method %u.%u",
                             METHOD_CLASS_ID(method_id), METHOD_METHOD_ID(method_id));
    return false;
}

void channel__handle_settle(struct channel *ch, const struct method *m)
{
    const struct method_basic_quay_settle *s = &m->basic_quay_settle;
    struct broker *broker = ch->connection->broker;
    if (!channel__peer_only(ch, m->id) || broker->cluster_ops == NULL)
        return;
    if (s->purge)
        broker->cluster_ops->replica_reset(broker->cluster_ctx, ch->vhost, s->queue, s->epoch,
                                           s->seq);
    else
        broker->cluster_ops->replica_settle(broker->cluster_ctx, ch->vhost, s->queue, s->epoch,
                                            s->seq, s->seq_last);
}

void channel__answer_counts(struct channel *ch, const struct queue *queue,
                            const struct queue_remote_counts *primary)
{
    struct queue_remote_counts here = {queue_ready_count(queue), queue->consumers_count,
                                       queue->unacked_count, !queue_is_remote(queue),
                                       queue->unreadable};
    const struct queue_remote_counts *n = primary != NULL ? primary : &here;
    struct method ok = {.id = METHOD_QUEUE_QUAY_COUNTS_OK};
    ok.queue_quay_counts_ok = (struct method_queue_quay_counts_ok){
        n->messages, n->unacked, n->consumers, n->primary, n->down};
    channel__send(ch, &ok);
}

/* basic.quay-usage: a peer's counts of what our limits count. */
void channel__handle_usage(struct channel *ch, const struct method *m)
{
    const struct method_basic_quay_usage *u = &m->basic_quay_usage;
    if (channel__peer_only(ch, m->id))
        usage_heard(ch->connection->broker, ch->connection->conn.id, u->broker, u->counts);
}

void channel__handle_handover(struct channel *ch, const struct method *m)
{
    const struct method_basic_quay_handover *h = &m->basic_quay_handover;
    struct broker *broker = ch->connection->broker;
    if (channel__peer_only(ch, m->id) && broker->cluster_ops)
        broker->cluster_ops->handover_notice(broker->cluster_ctx, ch->vhost,
                                             ch->connection->conn.id, ch->id, h->queue,
                                             h->epoch, h->delivered, h->redelivered);
}

static void keep_names(struct channel *ch, struct bytes exchange, struct bytes routing_key)
{
    if (!ch->publish_names) {
        ch->publish_names = xmalloc(512);
    }
    memcpy(ch->publish_names, exchange.ptr, exchange.len);
    memcpy(ch->publish_names + 256, routing_key.ptr, routing_key.len);
    ch->publish_exchange_size = (uint8_t)exchange.len;
    ch->publish_routing_key_size = (uint8_t)routing_key.len;
}

/* basic.quay-sync: a peer waits for our map to reach its version. */
void channel__handle_sync(struct channel *ch, const struct method *m)
{
    if (channel__peer_only(ch, m->id) && channel__clustered(ch))
        channel__cluster_sync(ch, m->basic_quay_sync.version, m->basic_quay_sync.answer);
}

/* basic.quay-forward (a peer's publish for queues of ours: its targets
 * table names each with the epoch it was sent under) or
 * basic.quay-replicate (a primary's copy for us, a backup, as it was
 * published); the content follows. */
void channel__begin_forward(struct channel *ch, const struct method *m)
{
    if (!channel__peer_only(ch, m->id))
        return;
    ch->publish_replicate = m->id == METHOD_BASIC_QUAY_REPLICATE;
    if (ch->publish_replicate) {
        const struct method_basic_quay_replicate *r = &m->basic_quay_replicate;
        keep_names(ch, r->exchange, r->routing_key);
        if (!ch->forward_target) {
            ch->forward_target = xmalloc(256);
        }
        memcpy(ch->forward_target, r->queue.ptr, r->queue.len);
        ch->forward_target_size = (uint8_t)r->queue.len;
        ch->forward_epoch = r->epoch;
        ch->replicate_seq = r->seq;
        ch->forward_origin_stream = r->origin_stream;
        ch->forward_origin_seq = r->origin_seq;
    } else {
        const struct method_basic_quay_forward *f = &m->basic_quay_forward;
        keep_names(ch, f->exchange, f->routing_key);
        ch->forward_dead_lettered = f->dead_lettered;
        ch->forward_origin_stream = f->origin_stream;
        ch->forward_origin_seq = f->origin_seq;
        ch->forward_origin_resent = f->origin_resent;
        /* same-targets: those of this channel's previous forward, kept. */
        if (!f->same_targets) {
            if (f->targets.len > ch->forward_targets_cap) {
                free(ch->forward_targets);
                ch->forward_targets = xmalloc(f->targets.len);
                ch->forward_targets_cap = f->targets.len;
            }
            if (f->targets.len > 0)
                memcpy(ch->forward_targets, f->targets.ptr, f->targets.len);
            ch->forward_targets_size = f->targets.len;
        }
    }
    ch->publish_mandatory = false;
    ch->publish_forward = true;
    ch->content = CONTENT_STATE_HEADER;
}

static void send_return(struct channel *ch, struct message *message, uint16_t code,
                        const char *text);

void channel__route_publish(struct channel *ch, struct message *message, bool mandatory)
{
    if (ch->tx_mode) {
        struct tx_op *op = xcalloc(1, sizeof *op);
        op->method_id = METHOD_BASIC_PUBLISH;
        op->message = message;
        op->mandatory = mandatory;
        message_ref(message);
        list_push_back(&ch->tx_ops, &op->link);
        return;
    }
    channel__route_now(ch, message, mandatory);
}

static void count_confirmed(struct channel *ch, uint64_t n)
{
    struct broker_counters *counters = channel__counters(ch);
    if (counters != NULL)
        counters->confirmed += n;
    channel__rates_moved(ch);
    ch->stats.counts[CHANNEL_RATE_CONFIRM] += n;
}

/* Sends the acks owed up to and including seq (one multiple ack). */
static void send_acks_through(struct channel *ch, uint64_t seq)
{
    if (seq <= ch->confirmed_seq)
        return;
    struct method ack = {.id = METHOD_BASIC_ACK};
    ack.basic_ack.delivery_tag = seq;
    ack.basic_ack.multiple = seq - ch->confirmed_seq > 1;
    channel__send(ch, &ack);
    count_confirmed(ch, seq - ch->confirmed_seq);
    ch->confirmed_seq = seq;
}

/* Routes through the exchange, then through alternate exchanges while
 * nothing matched (RabbitMQ's alternate-exchange, chained; each exchange
 * is tried once). */
static void route_with_alternates(struct channel *ch, struct exchange *exchange,
                                  struct message *message, struct route_result *result)
{
    struct exchange *tried[8];
    uint32_t tried_count = 0;
    while (exchange) {
        vhost_route(ch->vhost, exchange, message_routing_key(message), message->headers, result);
        if (result->count > 0 || tried_count == ARRAY_SIZE(tried))
            return;
        tried[tried_count++] = exchange;
        struct field_value ae;
        struct table args = {exchange->arguments.ptr, exchange->arguments.len};
        if (!table_get(args, "alternate-exchange", &ae) || ae.kind != 'S')
            return;
        exchange = vhost_exchange(ch->vhost, ae.str);
        for (uint32_t i = 0; exchange && i < tried_count; i++) {
            if (tried[i] == exchange)
                exchange = NULL;
        }
    }
}

static void fifo_push(struct confirm_fifo *f, struct confirm_wait wait)
{
    if (f->count == f->cap)
        f->items = ring_grow(f->items, sizeof *f->items, &f->head, f->count, &f->cap, 16);
    f->items[(f->head + f->count) & (f->cap - 1)] = wait;
    f->count++;
}

static void send_nack(struct channel *ch, uint64_t seq)
{
    send_acks_through(ch, seq - 1);
    struct method nack = {.id = METHOD_BASIC_NACK};
    nack.basic_nack.delivery_tag = seq;
    channel__send(ch, &nack);
    ch->confirmed_seq = seq;
}

/* Sends what may be confirmed now: acks through the last publish that
 * waits for nothing (flush_confirms calls this at the end of a batch). */
static void release_confirms(struct channel *ch)
{
    struct confirm_fifo *f = &ch->confirm_waits;
    uint64_t limit = f->count ? f->items[f->head].seq - 1 : ch->publish_seq;
    send_acks_through(ch, limit);
}

/* Confirms go out in publish order while they can: one multiple ack
 * answers a run of them. But a publish that waits for nothing more does
 * not wait behind one that still waits for another broker (a slow backup
 * of one queue would hold every other queue's confirms on the channel,
 * and a proxy forwards all its clients' publishes to a primary on one
 * channel): it is answered alone, ahead, as RabbitMQ answers publishes to
 * different queues. It stays in the FIFO, answered, so that sink_wait
 * still finds each publish by its number, and no multiple ack passes
 * over it when it reaches the head (drain_waits). */
static void answer_early(struct channel *ch, struct confirm_wait *wait)
{
    ASSERT(!wait->answered && wait->remote == 0);
    struct method m = {.id = wait->nack ? METHOD_BASIC_NACK : METHOD_BASIC_ACK};
    if (wait->nack)
        m.basic_nack.delivery_tag = wait->seq;
    else
        m.basic_ack.delivery_tag = wait->seq;
    channel__send(ch, &m);
    if (!wait->nack)
        count_confirmed(ch, 1);
    wait->answered = true;
}

static bool wait_done(const struct confirm_wait *wait, uint64_t synced)
{
    return wait->remote == 0 && wait->ticket <= synced;
}

/* Answers, ahead of the head, the publishes behind it that wait for
 * nothing more after an fsync: from the head up to the first one the
 * fsync did not cover (tickets grow with publish order, but for the
 * few that took a later ticket from a forward's answer, which wait for
 * the next fsync or their own answer). */
static void answer_synced_behind(struct channel *ch, uint64_t synced)
{
    struct confirm_fifo *f = &ch->confirm_waits;
    for (uint32_t i = 1; i < f->count; i++) {
        struct confirm_wait *wait = &f->items[(f->head + i) & (f->cap - 1)];
        if (wait->ticket > synced)
            break;
        if (!wait->answered && wait->remote == 0)
            answer_early(ch, wait);
    }
}

/* Confirms every waiting publish at the head that waits for nothing more:
 * its fsync is done (ticket <= synced) and every primary answered; and,
 * after an fsync (synced_now), those behind the head it freed. */
static void drain_waits(struct channel *ch, uint64_t synced, int status, bool synced_now)
{
    struct confirm_fifo *f = &ch->confirm_waits;
    bool owed = false;
    /* A journal that stopped syncs nothing more: what waits for it is
     * nacked now (it reports its failure once), whenever it comes. */
    bool failed = status < 0 || durable_failed(ch->connection->broker);
    while (f->count > 0 && (f->items[f->head].answered ||
                            ((f->items[f->head].ticket <= synced || failed) &&
                             f->items[f->head].remote == 0))) {
        struct confirm_wait wait = f->items[f->head];
        f->head = (f->head + 1) & (f->cap - 1);
        f->count--;
        if (wait.answered) {
            /* No multiple ack may pass over it (its answer was given, and
             * may have been a nack): those owed before it go out now. */
            send_acks_through(ch, wait.seq - 1);
            ch->confirmed_seq = wait.seq;
        } else if (wait.nack || (failed && wait.ticket != 0))
            send_nack(ch, wait.seq); /* after the acks owed before it */
        else
            owed = true; /* acked by the next multiple ack (release_confirms) */
    }
    if (owed && ch->state == CHANNEL_STATE_OPEN)
        owe_confirm(ch);
    if (synced_now && !failed && f->count > 1 && ch->state == CHANNEL_STATE_OPEN)
        answer_synced_behind(ch, synced);
}

/* A publish that now waits for nothing more: answered at the head's turn,
 * or alone now if others before it still wait. */
static void wait_settled(struct channel *ch, struct confirm_wait *wait)
{
    struct broker *broker = ch->connection->broker;
    uint64_t synced = durable_synced_ticket(broker);
    struct confirm_fifo *f = &ch->confirm_waits;
    if (wait != &f->items[f->head] && wait_done(wait, synced) && !durable_failed(broker))
        answer_early(ch, wait);
    drain_waits(ch, synced, 0, false);
}

void channel__commit_check(struct channel *ch, uint64_t synced, int status)
{
    if (!ch->commit_pending || synced < ch->tx_ticket || ch->tx_remote > 0)
        return;
    ch->commit_pending = false;
    bool failed = ch->tx_failed;
    ch->tx_failed = false;
    ch->tx_ticket = 0;
    if (status < 0) {
        channel__fail(ch, REPLY_INTERNAL_ERROR, METHOD_TX_COMMIT,
                      "the journal failed: the transaction may not be on disk");
    } else if (failed) {
        /* A publish refused by a queue (reject-publish), here or at its
         * primary elsewhere, or that no primary took: RabbitMQ's answer. */
        channel__fail(ch, REPLY_PRECONDITION_FAILED, METHOD_TX_COMMIT, "partial tx completion");
    } else {
        struct method ok = {.id = METHOD_TX_COMMIT_OK};
        channel__send(ch, &ok);
    }
}

void channel__journal_synced(struct channel *ch, uint64_t ticket, int status)
{
    struct confirm_fifo *f = &ch->confirm_waits;
    drain_waits(ch, ticket, status, true);
    channel__commit_check(ch, ticket, status);
    if (f->count == 0 && !ch->commit_pending && list_linked(&ch->durable_link))
        list_remove(&ch->durable_link);
}

void confirm_sink_ref(struct confirm_sink *sink)
{
    ASSERT(sink->refs > 0);
    sink->refs++;
}

void confirm_sink_unref(struct confirm_sink *sink)
{
    ASSERT(sink->refs > 0);
    if (--sink->refs == 0)
        free(sink);
}

static struct confirm_wait *sink_wait(struct channel *ch, uint64_t seq)
{
    struct confirm_fifo *f = &ch->confirm_waits;
    ASSERT(f->count > 0 && seq >= f->items[f->head].seq);
    uint64_t index = seq - f->items[f->head].seq;
    ASSERT(index < f->count);
    struct confirm_wait *wait = &f->items[(f->head + index) & (f->cap - 1)];
    ASSERT(wait->seq == seq && wait->remote > 0 && !wait->answered);
    return wait;
}

/* A peer's forwarding channel refused a forward: it records no origins
 * more (origin_frozen, channel_int.h). Counted and said once per channel:
 * a resend through it is taken again (an unflagged duplicate). Client
 * channels (no forward ever came) are not counted. */
static void freeze_origins(struct channel *ch, const char *why)
{
    if (ch->origin_frozen)
        return;
    ch->origin_frozen = true;
    if (ch->forward_origin_stream == 0)
        return;
    ch->connection->broker->counters.forward_channels_frozen++;
    LOG_INFO("conn=%llu channel=%u: a forward refused (%s): this peer's forwards are no longer "
             "recorded until its link reconnects", (unsigned long long)ch->connection->conn.id,
             (unsigned)ch->id, why);
}

/* A transaction's publish (seq 0: its sink's answers are counted in
 * tx_remote, not in the confirm fifo) was answered, ok or not: by a
 * primary elsewhere, or by a queue that held it (a stand-in's for a dead
 * primary, a paused one's), routed now where it waits for more answers
 * and for the journal's ticket instead. tx.commit-ok waits for them all. */
static void tx_answered(struct channel *ch, uint32_t more, bool ok, uint64_t ticket)
{
    ASSERT(ch->tx_remote > 0);
    ch->tx_remote += more;
    ch->tx_remote--;
    if (!ok)
        ch->tx_failed = true;
    struct broker *broker = ch->connection->broker;
    if (ticket > ch->tx_ticket)
        ch->tx_ticket = ticket;
    if (ch->commit_pending && ch->tx_ticket > durable_synced_ticket(broker))
        durable_wait_for_sync(broker, &ch->durable_link);
    channel__commit_check(ch, durable_synced_ticket(broker), 0);
}

void confirm_sink_answer(struct confirm_sink *sink, uint64_t seq, bool ack)
{
    struct channel *ch = sink->channel;
    if (ch == NULL || ch->state != CHANNEL_STATE_OPEN)
        return;
    if (seq == 0) {
        tx_answered(ch, 0, ack, 0);
        return;
    }
    struct confirm_wait *wait = sink_wait(ch, seq);
    wait->remote--;
    if (!ack) {
        wait->nack = true;
        freeze_origins(ch, "answered late with a nack");
    }
    wait_settled(ch, wait);
}

void confirm_sink_expect(struct confirm_sink *sink, uint64_t seq, uint32_t more)
{
    struct channel *ch = sink->channel;
    if (ch == NULL || ch->state != CHANNEL_STATE_OPEN)
        return;
    if (seq == 0) { /* a transaction's publish */
        ASSERT(ch->tx_remote > 0);
        ch->tx_remote += more;
        return;
    }
    sink_wait(ch, seq)->remote += more;
}

void confirm_sink_routed(struct confirm_sink *sink, uint64_t seq, const struct publish_wait *routed,
                         bool rejected)
{
    struct channel *ch = sink->channel;
    if (ch == NULL || ch->state != CHANNEL_STATE_OPEN)
        return;
    if (seq == 0) {
        tx_answered(ch, routed->remote, !rejected, routed->ticket);
        return;
    }
    struct confirm_wait *wait = sink_wait(ch, seq);
    wait->remote += routed->remote;
    wait->remote--; /* the answer this was */
    if (rejected) {
        wait->nack = true;
        /* A peer's forward parked, or held by a paused queue, then refused:
         * its channel records no more (channel_int.h). */
        freeze_origins(ch, "parked or held, then refused");
    }
    struct broker *broker = ch->connection->broker;
    if (routed->ticket > wait->ticket)
        wait->ticket = routed->ticket;
    if (wait->ticket > durable_synced_ticket(broker))
        durable_wait_for_sync(broker, &ch->durable_link);
    wait_settled(ch, wait);
}

static void confirm_publish(struct channel *ch, uint64_t ticket, uint32_t remote,
                            bool rejected);

static struct confirm_sink *channel_sink(struct channel *ch)
{
    if (!ch->sink) {
        ch->sink = xcalloc(1, sizeof *ch->sink);
        ch->sink->refs = 1;
        ch->sink->channel = ch;
    }
    return ch->sink;
}

void channel__route_now(struct channel *ch, struct message *message, bool mandatory)
{
    struct bind_dest *dests[ROUTE_DESTS_MAX];
    struct route_result result = {.dests = dests, .cap = ROUTE_DESTS_MAX};
    /* The exchange may have been deleted between method and content. */
    struct exchange *exchange = vhost_exchange(ch->vhost, message_exchange(message));
    if (exchange)
        route_with_alternates(ch, exchange, message, &result);
    if (result.count == 0 && mandatory)
        send_return(ch, message, REPLY_NO_ROUTE, "NO_ROUTE");
    struct broker_counters *counters = channel__counters(ch);
    if (counters != NULL && result.count > 0)
        counters->routed++;
    else if (counters != NULL && mandatory)
        counters->unroutable_returned++;
    else if (counters != NULL)
        counters->unroutable_dropped++;
    uint64_t seq = ch->confirm_mode ? ch->publish_seq + 1 : 0;
    /* A transaction's commit-ok waits for other brokers too: their answers
     * come as seq 0 (confirm_sink_answer). */
    bool waits = ch->confirm_mode || ch->tx_mode;
    struct publish_wait wait = {.sink = waits ? channel_sink(ch) : NULL, .seq = seq};
    struct queue *queues[ROUTE_DESTS_MAX];
    for (uint32_t i = 0; i < result.count; i++)
        queues[i] = CONTAINER_OF(result.dests[i], struct queue, as_dest);
    struct queue_publish_summary summary;
    queue_publish_routed(queues, result.count, message, &wait, false, &summary);
    if (wait.flow)
        connection_flow(ch->connection);
    for (uint32_t i = 0; i < result.count; i++) {
        if (queues[i]->flow.congested)
            flow_wait(ch->connection, ch->id, queues[i]);
    }
    bool rejected = summary.rejected > 0;
    uint32_t unavailable = summary.unavailable; /* stand-ins whose queue has no primary now */
    if (unavailable > 0 && unavailable == result.count && mandatory) {
        /* Reached no queue at all: a mandatory publish comes back (and is
         * confirmed, as RabbitMQ confirms a returned message). */
        send_return(ch, message, REPLY_NO_ROUTE, "NO_ROUTE");
    } else if (unavailable > 0) {
        rejected = true; /* the publisher must resend it */
    }
    if (message->persistent && durable_failed(ch->connection->broker))
        rejected = true; /* not on disk, and never will be: the journal stopped */
    if (ch->tx_mode) {
        if (wait.ticket > ch->tx_ticket)
            ch->tx_ticket = wait.ticket; /* tx.commit-ok waits for it */
        ch->tx_remote += wait.remote;
        /* A queue refused it (reject-publish), or has no primary now: the
         * commit fails, as RabbitMQ's does ("partial tx completion"). */
        if (summary.rejected > 0 || (unavailable > 0 && !mandatory))
            ch->tx_failed = true;
        return;
    }
    confirm_publish(ch, wait.ticket, wait.remote, rejected);
}

/* The publisher's confirm for the publish just routed: now, or once the
 * fsync (ticket) and the primaries (remote) are done. */
static void confirm_publish(struct channel *ch, uint64_t ticket, uint32_t remote, bool rejected)
{
    if (!ch->confirm_mode)
        return;
    ch->publish_seq++;
    struct confirm_fifo *f = &ch->confirm_waits;
    bool unsynced = ticket > durable_synced_ticket(ch->connection->broker);
    if (unsynced || remote > 0 || f->count > 0) {
        /* Wait for the fsync or the primaries, or answered now but kept
         * behind a publish that waits (answer_early); the publisher waits
         * for us meanwhile (read_batch.h). */
        fifo_push(f, (struct confirm_wait){ch->publish_seq, ticket, remote, rejected, false});
        conn_out_owed(&ch->connection->conn);
        if (unsynced)
            durable_wait_for_sync(ch->connection->broker, &ch->durable_link);
        else if (remote == 0 && !durable_failed(ch->connection->broker))
            answer_early(ch, &f->items[(f->head + f->count - 1) & (f->cap - 1)]);
        return;
    }
    if (rejected)
        send_nack(ch, ch->publish_seq); /* a queue refused it (reject-publish) */
    else
        owe_confirm(ch);
}

/* The forward this channel is routing, as a queue takes it. */
static struct queue_forwarded forwarded(const struct channel *ch)
{
    return (struct queue_forwarded){.origin_stream = ch->forward_origin_stream,
                                    .origin_seq = ch->forward_origin_seq,
                                    .resent = ch->forward_origin_resent,
                                    .record = !ch->origin_frozen,
                                    .dead_lettered = ch->forward_dead_lettered};
}

/* One target of a peer's forward (ours, or relayed by our stand-in):
 * false if refused (queue_publish_forward). */
static bool forward_to(struct channel *ch, struct queue *queue, struct message *message,
                       struct publish_wait *wait)
{
    struct queue_forwarded f = forwarded(ch);
    enum queue_publish_result r = queue_publish_forward(queue, message, &f, wait);
    if (queue->flow.congested)
        flow_wait(ch->connection, ch->id, queue); /* the sender is told */
    return r != QUEUE_PUBLISH_REJECTED && r != QUEUE_PUBLISH_UNAVAILABLE;
}

/* A peer's forward: straight into each target queue, which must be ours
 * at the epoch the sender named (a stale sender, one whose map still
 * names us, or an older epoch, is nacked and sends it again where the map
 * now says), unless the queue was handed over to another broker since
 * (relayed through our stand-in); a target our map has not reached yet is
 * parked until it has.
 * The answer (one ack, or a nack if any target refused it) waits for
 * every target's journal and backups, as a client's publish would. */
void channel__route_forward(struct channel *ch, struct message *message)
{
    struct broker *broker = ch->connection->broker;
    const struct cluster_ops *cluster = broker->cluster_ops;
    void *ctx = broker->cluster_ctx;
    struct table targets = {ch->forward_targets, ch->forward_targets_size};
    struct field_value epoch_value;
    if (table_get(targets, CLUSTER_OPS_MAP_TARGET, &epoch_value)) {
        if (cluster)
            cluster->propose_entry(ctx, message->body, message->body_size);
        return; /* the sender learns the outcome from the map itself */
    }
    uint64_t seq = ch->confirm_mode ? ch->publish_seq + 1 : 0;
    struct publish_wait wait = {.sink = seq ? channel_sink(ch) : NULL, .seq = seq,
                                .from_peer = true};
    bool rejected = targets.len == 0;
    struct table_iter it;
    struct bytes name;
    table_iter_init(&it, targets);
    while (table_iter_next(&it, &name, &epoch_value)) {
        int64_t epoch;
        if (!field_value_as_int(&epoch_value, &epoch) || epoch < 0) {
            rejected = true; /* a confused peer: no queue of ours */
            continue;
        }
        struct queue *queue = vhost_queue(ch->vhost, name);
        bool stale = queue == NULL || queue_is_remote(queue) ||
                     (cluster && !cluster->forward_fresh(ctx, ch->vhost->name, name,
                                                         (uint64_t)epoch));
        if (stale && cluster &&
            cluster->map_behind(ctx, ch->vhost->name, name, (uint64_t)epoch)) {
            /* The sender's map is ahead of ours (a queue just declared or
             * moved to us): route it once we have applied that far. */
            if (wait.sink)
                wait.remote++;
            struct queue_forwarded f = forwarded(ch); /* (never recorded: member.c) */
            cluster->park_forward(ctx, ch->vhost, name, (uint64_t)epoch, message, wait.sink,
                                  seq, &f);
            continue;
        }
        /* The sender's map is behind ours and the queue moved on (a
         * handover to another broker): our stand-in sends it there, and
         * the sender gets that answer, in order with what we held. */
        bool relay = stale && queue != NULL && queue_is_remote(queue) &&
                     cluster->forward_relays(ctx, ch->vhost->name, name, (uint64_t)epoch);
        if (stale && !relay) {
            /* Deleted since the sender routed to it (our map has passed
             * its epoch without it): as on one broker, routed to a queue
             * that then went, confirmed. Else not ours: a nack, and the
             * sender sends it again where its map says. */
            rejected = rejected || queue != NULL || cluster == NULL ||
                       !cluster->forward_gone(ctx, ch->vhost->name, name, (uint64_t)epoch);
            continue;
        }
        if (!forward_to(ch, queue, message, &wait))
            rejected = true;
    }
    if (message->persistent && durable_failed(broker))
        rejected = true; /* the journal stopped: see channel__route_now */
    if (rejected)
        freeze_origins(ch, "stale epoch, reject-publish or a failed journal");
    confirm_publish(ch, wait.ticket, wait.remote, rejected);
}

/* A primary's replication of a message to us (a backup): kept in the
 * stand-in's replica, acked so its publisher's confirm can go out. The
 * ack waits for nothing (not even our fsync), so a replication channel's
 * acks stay in publish order: its primary reads one as "everything up to
 * here" (replication.c on_stream_answer). */
void channel__route_replica(struct channel *ch, struct message *message)
{
    struct broker *broker = ch->connection->broker;
    struct bytes target = {ch->forward_target, ch->forward_target_size};
    bool ok = broker->cluster_ops &&
              broker->cluster_ops->replica_push(broker->cluster_ctx, ch->vhost, target,
                                                ch->forward_epoch, ch->replicate_seq, message,
                                                ch->forward_origin_stream,
                                                ch->forward_origin_seq);
    confirm_publish(ch, 0, 0, !ok);
}

void channels_flush_confirms(struct net_flush_hook *hook)
{
    struct broker *broker = CONTAINER_OF(hook, struct broker, confirms_hook);
    while (!list_empty(&broker->confirms_owed)) {
        struct channel *ch =
            CONTAINER_OF(broker->confirms_owed.next, struct channel, confirm_link);
        list_remove(&ch->confirm_link);
        if (ch->state == CHANNEL_STATE_OPEN)
            release_confirms(ch);
    }
}

/* ---- returns -------------------------------------------------------- */

static void send_return(struct channel *ch, struct message *message, uint16_t code,
                        const char *text)
{
    struct method m = {.id = METHOD_BASIC_RETURN};
    m.basic_return.reply_code = code;
    m.basic_return.reply_text = bytes_of_cstr(text);
    m.basic_return.exchange = message_exchange(message);
    m.basic_return.routing_key = message_routing_key(message);
    channel__send(ch, &m);
    channel__write_content(ch, message);
}
