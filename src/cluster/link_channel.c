/*
 * link_channel.c: the link's channels (see link.h): opening with the
 * lowest free id, closing, what we send (methods, publishes with their
 * content), and what the peer sends on a channel: replies, confirms, and
 * deliveries, get-oks and returns whose content (header, then body
 * frames) is assembled here into a struct message.
 *
 * A channel's user callback is always the last thing a handler does: the
 * callee may close the channel or free the whole link, after which the
 * channel must not be touched (link.c's input loop then notices the
 * detached connection and stops).
 */
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "amqp/reply_code_gen.h"
#include "broker/frame_out.h"
#include "broker/message.h"
#include "cluster/link_int.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"

/* ---- opening and closing -------------------------------------------- */

/* The lowest id in 1..channel_max whose slot is free (a closed channel's
 * slot frees only with its close-ok), growing the table; 0 if none. */
static uint16_t free_id(struct link *link)
{
    uint32_t id = 1;
    while (id < link->channels_cap && link->channels[id])
        id++;
    if (id > link->channel_max)
        return 0;
    if (id >= link->channels_cap) {
        uint32_t cap = link->channels_cap ? link->channels_cap * 2 : 8;
        if (cap > (uint32_t)link->channel_max + 1)
            cap = (uint32_t)link->channel_max + 1;
        ASSERT(cap > id);
        struct link_channel **grown = xrealloc(link->channels, sizeof *grown * cap);
        memset(grown + link->channels_cap, 0, sizeof *grown * (cap - link->channels_cap));
        link->channels = grown;
        link->channels_cap = cap;
    }
    return (uint16_t)id;
}

struct link_channel *link_channel_open(struct link *link, struct bytes vhost, bool confirm,
                                       const struct link_channel_ops *ops)
{
    ASSERT(!link->freed);
    ASSERT(ops != NULL);
    ASSERT(vhost.len <= 255);
    if (link->state != LINK_STATE_UP || !link->lc)
        return NULL;
    uint16_t id = free_id(link);
    if (id == 0)
        return NULL;
    struct link_channel *ch = xcalloc(1, sizeof *ch);
    ch->link = link;
    ch->ops = *ops;
    ch->id = id;
    ch->state = LINK_CHANNEL_STATE_OPENING;
    ch->confirm = confirm;
    ch->select_ok = !confirm;
    link->channels[id] = ch;
    /* The vhost rides in channel.open's reserved shortstr, which a quay
     * server reads for cluster peers (broker/channel.c). */
    struct method open = {.id = METHOD_CHANNEL_OPEN};
    open.channel_open.reserved_1 = vhost;
    link__send_method(link, id, &open);
    if (confirm) {
        struct method select = {.id = METHOD_CONFIRM_SELECT};
        link__send_method(link, id, &select);
    }
    return ch;
}

static void release_content(struct link_channel *ch)
{
    if (ch->assembling) {
        message_unref(ch->assembling);
        ch->assembling = NULL;
    }
    ch->content = LINK_CONTENT_NONE;
}

void link__channel_free(struct link_channel *ch)
{
    release_content(ch);
    free(ch);
}

void link_channel_set_ops(struct link_channel *ch, const struct link_channel_ops *ops)
{
    ASSERT(ch->state != LINK_CHANNEL_STATE_CLOSING && ch->state != LINK_CHANNEL_STATE_GONE);
    ch->ops = *ops;
}

void link_channel_close(struct link_channel *ch)
{
    if (ch->state == LINK_CHANNEL_STATE_GONE)
        return; /* from inside its own closed(): it is being freed */
    ASSERT(ch->state != LINK_CHANNEL_STATE_CLOSING);
    release_content(ch);
    memset(&ch->ops, 0, sizeof ch->ops);
    ch->state = LINK_CHANNEL_STATE_CLOSING;
    /* Without a connection (the link is going down right now) the link
     * frees the channel with the others. */
    struct method close = {.id = METHOD_CHANNEL_CLOSE};
    close.channel_close.reply_code = REPLY_SUCCESS;
    close.channel_close.reply_text = BYTES_LIT("Goodbye");
    link__send_method(ch->link, ch->id, &close);
}

uint16_t link_channel_id(const struct link_channel *ch)
{
    return ch->id;
}

/* Takes the channel out of the table and frees it: its id is free. */
static void forget(struct link_channel *ch)
{
    struct link *link = ch->link;
    ASSERT(link->channels[ch->id] == ch);
    link->channels[ch->id] = NULL;
    link__channel_free(ch);
}

/* The peer closed the channel: close-ok, then closed(), then free. */
static void peer_closed(struct link_channel *ch, const struct method_channel_close *close)
{
    struct link *link = ch->link;
    struct method ok = {.id = METHOD_CHANNEL_CLOSE_OK};
    link__send_method(link, ch->id, &ok);
    link->channels[ch->id] = NULL;
    release_content(ch);
    ch->state = LINK_CHANNEL_STATE_GONE;
    if (ch->ops.closed)
        ch->ops.closed(ch->ops.ctx, close->reply_code, close->reply_text);
    free(ch);
}

/* ---- output --------------------------------------------------------- */

static bool usable(const struct link_channel *ch)
{
    return ch->state == LINK_CHANNEL_STATE_OPENING || ch->state == LINK_CHANNEL_STATE_OPEN;
}

uint64_t link_send_content(struct link_channel *ch, const struct method *m,
                           struct message *message)
{
    ASSERT(usable(ch));
    ASSERT(method_has_content(m->id));
    struct link *link = ch->link;
    uint64_t seq = ch->confirm ? ++ch->publish_seq : 0;
    if (!link->lc)
        return seq; /* going down this instant: closed() follows */
    struct conn *conn = &link->lc->conn;
    /* Output is flushed only in the check phase, so the growth of
     * out_bytes is exactly what this call queued. */
    size_t before = conn->out_bytes;
    size_t frames = frame_out_method(conn, ch->id, m) > 0;
    frames += frame_out_content(conn, ch->id, link->frame_max, message);
    link->stats.frames_out += frames;
    link->stats.bytes_out += conn->out_bytes - before;
    return seq;
}

uint64_t link_publish(struct link_channel *ch, struct bytes exchange, struct bytes routing_key,
                      bool mandatory, struct message *message)
{
    struct method m = {.id = METHOD_BASIC_PUBLISH};
    m.basic_publish.exchange = exchange;
    m.basic_publish.routing_key = routing_key;
    m.basic_publish.mandatory = mandatory;
    return link_send_content(ch, &m, message);
}

void link_send(struct link_channel *ch, const struct method *m)
{
    ASSERT(usable(ch));
    ASSERT(!method_has_content(m->id));
    ASSERT(METHOD_CLASS_ID(m->id) != CLASS_CONNECTION);
    ASSERT(m->id != METHOD_CHANNEL_OPEN && m->id != METHOD_CHANNEL_CLOSE &&
           m->id != METHOD_CHANNEL_CLOSE_OK);
    link__send_method(ch->link, ch->id, m);
}

bool link_channel_writable(const struct link_channel *ch)
{
    const struct link *link = ch->link;
    return link->lc && !conn_out_full(&link->lc->conn);
}

/* ---- content -------------------------------------------------------- */

static void copy_name(uint8_t *out, uint8_t *out_size, struct bytes name)
{
    ASSERT(name.len <= 255); /* shortstrs, as decoded */
    if (name.len)
        memcpy(out, name.ptr, name.len);
    *out_size = (uint8_t)name.len;
}

/* deliver, get-ok or return: the content header comes next. */
static void begin_content(struct link_channel *ch, const struct method *m)
{
    ch->content = LINK_CONTENT_HEADER;
    ch->content_method = m->id;
    struct bytes exchange, routing_key, text = BYTES_LIT("");
    switch (m->id) {
    case METHOD_BASIC_DELIVER:
        exchange = m->basic_deliver.exchange;
        routing_key = m->basic_deliver.routing_key;
        text = m->basic_deliver.consumer_tag;
        ch->delivery_tag = m->basic_deliver.delivery_tag;
        ch->redelivered = m->basic_deliver.redelivered;
        break;
    case METHOD_BASIC_GET_OK:
        exchange = m->basic_get_ok.exchange;
        routing_key = m->basic_get_ok.routing_key;
        ch->delivery_tag = m->basic_get_ok.delivery_tag;
        ch->redelivered = m->basic_get_ok.redelivered;
        ch->message_count = m->basic_get_ok.message_count;
        break;
    default:
        ASSERT(m->id == METHOD_BASIC_RETURN);
        exchange = m->basic_return.exchange;
        routing_key = m->basic_return.routing_key;
        text = m->basic_return.reply_text;
        ch->reply_code = m->basic_return.reply_code;
        break;
    }
    copy_name(ch->exchange, &ch->exchange_size, exchange);
    copy_name(ch->routing_key, &ch->routing_key_size, routing_key);
    copy_name(ch->text, &ch->text_size, text);
}

/* The message is whole: hand it (and its reference) over. */
static void content_complete(struct link_channel *ch)
{
    struct message *m = ch->assembling;
    ch->assembling = NULL;
    ch->content = LINK_CONTENT_NONE;
    /* The callee may free the channel: pass a copy of the tag or text. */
    uint8_t text[255];
    memcpy(text, ch->text, ch->text_size);
    struct bytes text_bytes = {text, ch->text_size};
    const struct link_channel_ops *ops = &ch->ops;
    switch (ch->content_method) {
    case METHOD_BASIC_DELIVER:
        if (!ops->deliver)
            break;
        return ops->deliver(ops->ctx, text_bytes, ch->delivery_tag, ch->redelivered, m);
    case METHOD_BASIC_GET_OK:
        if (!ops->get_reply)
            break;
        return ops->get_reply(ops->ctx, ch->delivery_tag, ch->redelivered, ch->message_count,
                              m);
    default:
        if (!ops->returned)
            break;
        return ops->returned(ops->ctx, ch->reply_code, text_bytes, m);
    }
    message_unref(m);
}

static void content_header(struct link_channel *ch, const struct frame *frame)
{
    struct link *link = ch->link;
    struct content_header header;
    if (content_header_decode(&header, frame->payload, frame->size) != OK ||
        header.class_id != CLASS_BASIC) {
        link__fail(link, REPLY_FRAME_ERROR, "malformed content header on channel %u", ch->id);
        return;
    }
    struct basic_properties props;
    if (basic_properties_decode(&props, header.properties, header.properties_size) != OK) {
        link__fail(link, REPLY_FRAME_ERROR, "cannot decode properties on channel %u", ch->id);
        return;
    }
    if (header.body_size > LINK_BODY_SIZE_MAX) {
        link__fail(link, REPLY_FRAME_ERROR, "body of %llu bytes on channel %u",
                   (unsigned long long)header.body_size, ch->id);
        return;
    }
    struct bytes exchange = {ch->exchange, ch->exchange_size};
    struct bytes routing_key = {ch->routing_key, ch->routing_key_size};
    ch->assembling = message_new(exchange, routing_key, header.properties,
                                 header.properties_size, &props, header.body_size);
    if (!ch->assembling) {
        link__fail(link, REPLY_RESOURCE_ERROR, "no memory for %llu bytes",
                   (unsigned long long)header.body_size);
        return;
    }
    ch->content = LINK_CONTENT_BODY;
    if (header.body_size == 0)
        content_complete(ch); /* no body frame follows an empty body */
}

static void content_body(struct link_channel *ch, const struct frame *frame)
{
    struct message *m = ch->assembling;
    uint64_t missing = m->body_size - m->body_received;
    if (frame->size > missing) {
        link__fail(ch->link, REPLY_FRAME_ERROR, "%u body bytes where %llu were due on channel %u",
                   frame->size, (unsigned long long)missing, ch->id);
        return;
    }
    memcpy(m->body + m->body_received, frame->payload, frame->size);
    m->body_received += frame->size;
    if (m->body_received == m->body_size)
        content_complete(ch);
}

/* ---- methods -------------------------------------------------------- */

static void maybe_opened(struct link_channel *ch)
{
    if (!ch->open_ok || !ch->select_ok)
        return;
    ch->state = LINK_CHANNEL_STATE_OPEN;
    if (ch->ops.opened)
        ch->ops.opened(ch->ops.ctx);
}

static void handle_method(struct link_channel *ch, const struct method *m)
{
    const struct link_channel_ops *ops = &ch->ops;
    switch (m->id) {
    case METHOD_CHANNEL_OPEN_OK:
        if (ch->state != LINK_CHANNEL_STATE_OPENING || ch->open_ok)
            break;
        ch->open_ok = true;
        return maybe_opened(ch);
    case METHOD_CONFIRM_SELECT_OK:
        if (ch->select_ok)
            break;
        ch->select_ok = true;
        return maybe_opened(ch);
    case METHOD_CHANNEL_CLOSE:
        return peer_closed(ch, &m->channel_close);
    case METHOD_CHANNEL_CLOSE_OK:
        break; /* we were not closing */
    case METHOD_CHANNEL_FLOW: {
        /* RabbitMQ never sends it; answer as the spec asks. */
        struct method ok = {.id = METHOD_CHANNEL_FLOW_OK};
        ok.channel_flow_ok.active = m->channel_flow.active;
        return link__send_method(ch->link, ch->id, &ok);
    }
    case METHOD_BASIC_ACK:
        if (ops->confirm)
            ops->confirm(ops->ctx, m->basic_ack.delivery_tag, m->basic_ack.multiple, true);
        return;
    case METHOD_BASIC_NACK:
        if (ops->confirm)
            ops->confirm(ops->ctx, m->basic_nack.delivery_tag, m->basic_nack.multiple, false);
        return;
    case METHOD_BASIC_DELIVER:
    case METHOD_BASIC_GET_OK:
    case METHOD_BASIC_RETURN:
        return begin_content(ch, m);
    case METHOD_BASIC_GET_EMPTY:
        if (ops->get_reply)
            ops->get_reply(ops->ctx, 0, false, 0, NULL);
        return;
    case METHOD_BASIC_CANCEL:
        if (ops->cancelled)
            ops->cancelled(ops->ctx, m->basic_cancel.consumer_tag);
        return;
    default:
        if (!method_has_content(m->id)) {
            if (ops->reply)
                ops->reply(ops->ctx, m);
            return;
        }
        break; /* content we cannot take (basic.publish to a client) */
    }
    const char *name = method_name(m->id);
    link__fail(ch->link, REPLY_COMMAND_INVALID, "unexpected %s on channel %u",
               name ? name : "method", ch->id);
}

/* We closed the channel: only close-ok (or a crossing close) matters. */
static void handle_closing(struct link_channel *ch, const struct frame *frame)
{
    if (frame->type != FRAME_METHOD)
        return; /* content of a delivery that crossed our close */
    struct method m;
    if (!link__decode(ch->link, frame, &m))
        return;
    if (m.id == METHOD_CHANNEL_CLOSE) {
        struct method ok = {.id = METHOD_CHANNEL_CLOSE_OK};
        link__send_method(ch->link, ch->id, &ok);
        forget(ch);
    } else if (m.id == METHOD_CHANNEL_CLOSE_OK) {
        forget(ch);
    }
}

void link__channel_frame(struct link_channel *ch, const struct frame *frame)
{
    if (ch->state == LINK_CHANNEL_STATE_CLOSING)
        return handle_closing(ch, frame);
    uint8_t expected = ch->content == LINK_CONTENT_NONE     ? FRAME_METHOD
                       : ch->content == LINK_CONTENT_HEADER ? FRAME_HEADER
                                                            : FRAME_BODY;
    if (frame->type != expected) {
        link__fail(ch->link, REPLY_UNEXPECTED_FRAME, "frame type %u where %u was due on channel %u",
                   frame->type, expected, ch->id);
        return;
    }
    if (expected == FRAME_HEADER)
        return content_header(ch, frame);
    if (expected == FRAME_BODY)
        return content_body(ch, frame);
    struct method m;
    if (link__decode(ch->link, frame, &m))
        handle_method(ch, &m);
}
