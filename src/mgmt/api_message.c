/*
 * api_message.c: see api_message.h.
 */
#include "mgmt/api_message.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/message.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/base64.h"
#include "lib/errors.h"
#include "lib/utf8.h"
#include "mgmt/api_amqp.h"
#include "mgmt/api_list.h"
#include "mgmt/api_table.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

#define PROPERTIES_SIZE_MAX 65536

/* ---- publish ----------------------------------------------------------- */

struct publish {
    struct message *message;       /* one reference until sent */
    uint8_t exchange[256];
    uint8_t exchange_size;
    bool returned;
};

static void publish_free(void *data)
{
    struct publish *p = data;
    if (p->message != NULL)
        message_unref(p->message);
    free(p);
}

static void publish_started(struct api_op *op, struct link_channel *ch)
{
    struct publish *p = api_op_data(op);
    struct message *m = p->message;
    p->message = NULL;
    link_publish(ch, (struct bytes){p->exchange, p->exchange_size}, message_routing_key(m), true,
                 m);
    message_unref(m); /* link_publish queued what it needs */
}

static void publish_returned(struct api_op *op, struct message *message)
{
    struct publish *p = api_op_data(op);
    p->returned = true;
    message_unref(message);
}

static void publish_confirm(struct api_op *op, uint64_t seq, bool ack)
{
    (void)seq;
    struct publish *p = api_op_data(op);
    if (!ack) {
        api_op_fail(op, 400, "the broker refused the message (basic.nack)");
        return;
    }
    struct json body;
    http_body_init(&body);
    json_object_begin(&body);
    json_kv_bool(&body, "routed", !p->returned);
    json_object_end(&body);
    api_op_answer(op, 200, &body);
}

static const struct api_op_type publish_type = {.started = publish_started,
                                                .confirm = publish_confirm,
                                                .returned = publish_returned,
                                                .free_data = publish_free};

/* A short-string property: false if it is not a string or is too long. */
static bool prop_string(const struct json_node *n, struct bytes *out)
{
    if (n->kind != JSON_KIND_STRING || n->string_size > 255)
        return false;
    *out = (struct bytes){(const uint8_t *)n->string, n->string_size};
    return true;
}

static bool prop_int(const struct json_node *n, int64_t max, int64_t *out)
{
    int64_t v = n->integer;
    if (n->kind == JSON_KIND_STRING) /* rabbitmqadmin may send numbers as text */
        v = strtoll(n->string, NULL, 10);
    else if (n->kind != JSON_KIND_NUMBER || !n->is_integer)
        return false;
    if (v < 0 || v > max)
        return false;
    *out = v;
    return true;
}

/* One property of "properties": false with why in err. */
static bool put_property(const struct json_tree *tree, const struct json_node *n,
                         struct basic_properties *p, uint8_t *headers, char *err, size_t err_size)
{
    static const struct {
        const char *key;
        uint16_t flag;
        size_t offset;
    } strings[] = {
        {"content_type", BASIC_FLAG_CONTENT_TYPE, offsetof(struct basic_properties, content_type)},
        {"content_encoding", BASIC_FLAG_CONTENT_ENCODING,
         offsetof(struct basic_properties, content_encoding)},
        {"correlation_id", BASIC_FLAG_CORRELATION_ID,
         offsetof(struct basic_properties, correlation_id)},
        {"reply_to", BASIC_FLAG_REPLY_TO, offsetof(struct basic_properties, reply_to)},
        {"expiration", BASIC_FLAG_EXPIRATION, offsetof(struct basic_properties, expiration)},
        {"message_id", BASIC_FLAG_MESSAGE_ID, offsetof(struct basic_properties, message_id)},
        {"type", BASIC_FLAG_TYPE, offsetof(struct basic_properties, type)},
        {"user_id", BASIC_FLAG_USER_ID, offsetof(struct basic_properties, user_id)},
        {"app_id", BASIC_FLAG_APP_ID, offsetof(struct basic_properties, app_id)},
        {"cluster_id", BASIC_FLAG_CLUSTER_ID, offsetof(struct basic_properties, cluster_id)},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        if (strcmp(n->key, strings[i].key) != 0)
            continue;
        p->flags |= strings[i].flag;
        if (prop_string(n, (struct bytes *)((char *)p + strings[i].offset)))
            return true;
        snprintf(err, err_size, "property %s must be a string of at most 255 bytes", n->key);
        return false;
    }
    int64_t v;
    if (strcmp(n->key, "delivery_mode") == 0 && prop_int(n, 255, &v)) {
        p->flags |= BASIC_FLAG_DELIVERY_MODE, p->delivery_mode = (uint8_t)v;
    } else if (strcmp(n->key, "priority") == 0 && prop_int(n, 255, &v)) {
        p->flags |= BASIC_FLAG_PRIORITY, p->priority = (uint8_t)v;
    } else if (strcmp(n->key, "timestamp") == 0 && prop_int(n, INT64_MAX, &v)) {
        p->flags |= BASIC_FLAG_TIMESTAMP, p->timestamp = (uint64_t)v;
    } else if (strcmp(n->key, "headers") == 0) {
        p->flags |= BASIC_FLAG_HEADERS;
        return api_table_from_json(tree, n, headers, PROPERTIES_SIZE_MAX / 2, &p->headers, err,
                                   err_size) == OK;
    } else {
        snprintf(err, err_size, "property %s: unknown, or not a valid value", n->key);
        return false;
    }
    return true;
}

/* The body's payload: its bytes in a fresh buffer (*out, free it). */
static bool decode_payload(const struct json_tree *tree, const struct json_node *root,
                           uint8_t **out, size_t *out_size, char *err, size_t err_size)
{
    const struct json_node *payload = json_tree_get(tree, root, "payload");
    const struct json_node *enc = json_tree_get(tree, root, "payload_encoding");
    if (payload == NULL || payload->kind != JSON_KIND_STRING || enc == NULL ||
        enc->kind != JSON_KIND_STRING) {
        snprintf(err, err_size, "payload and payload_encoding (strings) are required");
        return false;
    }
    *out = xmalloc(payload->string_size + 1);
    if (strcmp(enc->string, "string") == 0) {
        memcpy(*out, payload->string, payload->string_size);
        *out_size = payload->string_size;
        return true;
    }
    if (strcmp(enc->string, "base64") == 0 &&
        base64_decode(payload->string, payload->string_size, *out, payload->string_size + 1,
                      out_size) == OK)
        return true;
    free(*out);
    *out = NULL;
    snprintf(err, err_size, "payload_encoding must be \"string\" or \"base64\" (with base64 "
                            "content)");
    return false;
}

/* The message the body describes, or NULL with why in err. */
static struct message *message_of(const struct json_tree *tree, const struct json_node *root,
                                  struct bytes exchange, char *err, size_t err_size)
{
    const struct json_node *rk = json_tree_get(tree, root, "routing_key");
    if (rk == NULL || rk->kind != JSON_KIND_STRING || rk->string_size > 255) {
        snprintf(err, err_size, "routing_key (a string of at most 255 bytes) is required");
        return NULL;
    }
    struct basic_properties props = {0};
    uint8_t *buf = xmalloc(2 * PROPERTIES_SIZE_MAX);
    const struct json_node *pn = json_tree_get(tree, root, "properties");
    bool ok = pn == NULL || pn->kind == JSON_KIND_OBJECT ||
              (pn->kind == JSON_KIND_ARRAY && pn->children_count == 0);
    if (!ok)
        snprintf(err, err_size, "properties must be an object");
    for (const struct json_node *c = ok && pn ? json_tree_first(tree, pn) : NULL; c && ok;
         c = json_tree_next(tree, c))
        ok = put_property(tree, c, &props, buf + PROPERTIES_SIZE_MAX, err, err_size);
    uint8_t *payload = NULL;
    size_t payload_size = 0;
    size_t n = ok ? basic_properties_encode(&props, buf, PROPERTIES_SIZE_MAX) : 0;
    struct basic_properties decoded;
    if (ok && (n == 0 || basic_properties_decode(&decoded, buf, (uint32_t)n) != OK)) {
        snprintf(err, err_size, "properties too big");
        ok = false;
    }
    struct message *m = NULL;
    if (ok && decode_payload(tree, root, &payload, &payload_size, err, err_size)) {
        m = message_new(exchange, (struct bytes){(const uint8_t *)rk->string, rk->string_size},
                        buf, (uint32_t)n, &decoded, payload_size);
        ASSERT(m != NULL);
        memcpy(m->body, payload, payload_size);
        m->body_received = payload_size;
    }
    free(payload);
    free(buf);
    return m;
}

void api_message_publish(struct broker *broker, struct http_call *call,
                         const struct http_call_request *req, struct vhost *vhost,
                         struct bytes exchange)
{
    if (exchange.len == 11 && memcmp(exchange.ptr, "amq.default", 11) == 0)
        exchange.len = 0;
    struct json_tree tree;
    if (!api_body_parse(call, req, &tree))
        return;
    char err[200];
    struct message *m = message_of(&tree, json_tree_root(&tree), exchange, err, sizeof err);
    json_tree_free(&tree);
    if (m == NULL) {
        api_answer_bad_request(call, err);
        return;
    }
    struct publish *p = xcalloc(1, sizeof *p);
    p->message = m;
    memcpy(p->exchange, exchange.ptr, exchange.len);
    p->exchange_size = (uint8_t)exchange.len;
    api_op_start(broker, call, req, vhost->name, true, &publish_type, p);
}

/* ---- get ------------------------------------------------------------------ */

enum ackmode { ACK_REQUEUE_TRUE, ACK_REQUEUE_FALSE, REJECT_REQUEUE_TRUE, REJECT_REQUEUE_FALSE };

struct get {
    uint8_t queue[256];
    uint8_t queue_size;
    int64_t wanted, got;
    enum ackmode ackmode;
    bool base64;                   /* encoding "base64"; else "auto" */
    int64_t truncate;              /* -1: whole payloads */
    uint64_t last_tag;
    struct json body;              /* the answer's array, open */
};

static void get_free(void *data)
{
    struct get *g = data;
    json_free(&g->body);
    free(g);
}

static void send_get(struct api_op *op)
{
    struct get *g = api_op_data(op);
    struct method m = {.id = METHOD_BASIC_GET};
    m.basic_get.queue = (struct bytes){g->queue, g->queue_size};
    link_send(api_op_channel(op), &m);
}

static void get_started(struct api_op *op, struct link_channel *ch)
{
    (void)ch;
    send_get(op);
}

static bool is_utf8(const uint8_t *p, size_t size)
{
    for (size_t i = 0; i < size;) {
        size_t k = p[i] < 0x80 ? 1 : utf8_sequence_size(p + i, size - i);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}

static void write_short(struct json *out, const char *key, struct bytes v)
{
    json_key(out, key);
    json_string_n(out, v.ptr, v.len);
}

/* RabbitMQ writes no properties as [] (an empty list), some as an object. */
static void write_properties(struct json *out, const struct message *m)
{
    struct basic_properties p;
    json_key(out, "properties");
    if (basic_properties_decode(&p, message_properties(m), m->properties_size) != OK ||
        p.flags == 0) {
        json_array_begin(out);
        json_array_end(out);
        return;
    }
    json_object_begin(out);
    if (p.flags & BASIC_FLAG_CONTENT_TYPE)
        write_short(out, "content_type", p.content_type);
    if (p.flags & BASIC_FLAG_CONTENT_ENCODING)
        write_short(out, "content_encoding", p.content_encoding);
    if (p.flags & BASIC_FLAG_PRIORITY)
        json_kv_uint(out, "priority", p.priority);
    if (p.flags & BASIC_FLAG_CORRELATION_ID)
        write_short(out, "correlation_id", p.correlation_id);
    if (p.flags & BASIC_FLAG_REPLY_TO)
        write_short(out, "reply_to", p.reply_to);
    if (p.flags & BASIC_FLAG_EXPIRATION)
        write_short(out, "expiration", p.expiration);
    if (p.flags & BASIC_FLAG_MESSAGE_ID)
        write_short(out, "message_id", p.message_id);
    if (p.flags & BASIC_FLAG_TIMESTAMP)
        json_kv_uint(out, "timestamp", p.timestamp);
    if (p.flags & BASIC_FLAG_TYPE)
        write_short(out, "type", p.type);
    if (p.flags & BASIC_FLAG_USER_ID)
        write_short(out, "user_id", p.user_id);
    if (p.flags & BASIC_FLAG_APP_ID)
        write_short(out, "app_id", p.app_id);
    if (p.flags & BASIC_FLAG_CLUSTER_ID)
        write_short(out, "cluster_id", p.cluster_id);
    if (p.flags & BASIC_FLAG_DELIVERY_MODE)
        json_kv_uint(out, "delivery_mode", p.delivery_mode);
    if (p.flags & BASIC_FLAG_HEADERS) {
        json_key(out, "headers");
        api_table_write(out, p.headers);
    }
    json_object_end(out);
}

static void write_payload(struct json *out, const struct get *g, const struct message *m)
{
    size_t size = (size_t)m->body_size;
    if (g->truncate >= 0 && (uint64_t)g->truncate < m->body_size)
        size = (size_t)g->truncate;
    bool text = !g->base64 && is_utf8(m->body, size);
    json_key(out, "payload");
    if (text) {
        json_string_n(out, m->body, size);
    } else {
        char *b64 = xmalloc(base64_encoded_size(size) + 1);
        base64_encode(m->body, size, b64);
        json_string(out, b64);
        free(b64);
    }
    json_kv_string(out, "payload_encoding", text ? "string" : "base64");
}

static void get_finish(struct api_op *op)
{
    struct get *g = api_op_data(op);
    if (g->got == 0) {
        json_array_end(&g->body);
        api_op_answer(op, 200, &g->body);
        return;
    }
    struct method m;
    if (g->ackmode == ACK_REQUEUE_FALSE || g->ackmode == REJECT_REQUEUE_FALSE) {
        m = (struct method){.id = METHOD_BASIC_ACK};
        m.basic_ack = (struct method_basic_ack){g->last_tag, true};
    } else {
        m = (struct method){.id = METHOD_BASIC_NACK};
        m.basic_nack = (struct method_basic_nack){g->last_tag, true, true};
    }
    link_send(api_op_channel(op), &m);
    /* A channel handles its methods in order: once basic.qos-ok is back,
     * the settle above was applied, so the answer never runs ahead of it. */
    struct method qos = {.id = METHOD_BASIC_QOS};
    link_send(api_op_channel(op), &qos);
}

static void get_reply(struct api_op *op, uint64_t delivery_tag, bool redelivered,
                      uint32_t message_count, struct message *message)
{
    struct get *g = api_op_data(op);
    if (message == NULL) {
        get_finish(op);
        return;
    }
    struct json *out = &g->body;
    json_object_begin(out);
    json_kv_uint(out, "payload_bytes", message->body_size);
    json_kv_bool(out, "redelivered", redelivered);
    write_short(out, "exchange", message_exchange(message));
    write_short(out, "routing_key", message_routing_key(message));
    json_kv_uint(out, "message_count", message_count);
    write_properties(out, message);
    write_payload(out, g, message);
    json_object_end(out);
    message_unref(message);
    g->got++;
    g->last_tag = delivery_tag;
    if (g->got < g->wanted && message_count > 0)
        send_get(op);
    else
        get_finish(op);
}

static void get_method(struct api_op *op, const struct method *m)
{
    struct get *g = api_op_data(op);
    if (m->id == METHOD_BASIC_QOS_OK) {
        json_array_end(&g->body);
        api_op_answer(op, 200, &g->body);
    }
}

static const struct api_op_type get_type = {.started = get_started,
                                            .get_reply = get_reply,
                                            .reply = get_method,
                                            .free_data = get_free};

/* The body of a get: false with why in err. */
static bool get_parse(const struct json_tree *tree, struct get *g, char *err, size_t err_size)
{
    const struct json_node *root = json_tree_root(tree);
    const struct json_node *count = json_tree_get(tree, root, "count");
    const struct json_node *ackmode = json_tree_get(tree, root, "ackmode");
    const struct json_node *encoding = json_tree_get(tree, root, "encoding");
    const struct json_node *truncate = json_tree_get(tree, root, "truncate");
    static const char *const modes[] = {"ack_requeue_true", "ack_requeue_false",
                                        "reject_requeue_true", "reject_requeue_false"};
    if (count == NULL || ackmode == NULL || encoding == NULL) {
        snprintf(err, err_size, "[{key_missing,%s}]",
                 count == NULL ? "count" : ackmode == NULL ? "ackmode" : "encoding");
        return false;
    }
    if (!prop_int(count, 1000000, &g->wanted) || g->wanted < 1) {
        snprintf(err, err_size, "count must be a positive integer");
        return false;
    }
    bool known = false;
    for (size_t i = 0; i < 4 && ackmode->kind == JSON_KIND_STRING; i++) {
        if (strcmp(ackmode->string, modes[i]) == 0)
            g->ackmode = (enum ackmode)i, known = true;
    }
    if (!known || encoding->kind != JSON_KIND_STRING ||
        (strcmp(encoding->string, "auto") != 0 && strcmp(encoding->string, "base64") != 0)) {
        snprintf(err, err_size, "ackmode must be one of ack_requeue_true, ack_requeue_false, "
                                "reject_requeue_true, reject_requeue_false; encoding auto or "
                                "base64");
        return false;
    }
    g->base64 = strcmp(encoding->string, "base64") == 0;
    g->truncate = -1;
    if (truncate != NULL && truncate->kind != JSON_KIND_NULL &&
        !prop_int(truncate, INT64_MAX, &g->truncate)) {
        snprintf(err, err_size, "truncate must be a non-negative integer");
        return false;
    }
    return true;
}

void api_message_get(struct broker *broker, struct http_call *call,
                     const struct http_call_request *req, struct vhost *vhost,
                     struct bytes queue)
{
    struct json_tree tree;
    if (!api_body_parse(call, req, &tree))
        return;
    struct get *g = xcalloc(1, sizeof *g);
    char err[300];
    bool ok = get_parse(&tree, g, err, sizeof err);
    json_tree_free(&tree);
    if (!ok) {
        free(g);
        api_answer_bad_request(call, err);
        return;
    }
    ASSERT(queue.len <= 255);
    memcpy(g->queue, queue.ptr, queue.len);
    g->queue_size = (uint8_t)queue.len;
    http_body_init(&g->body);
    json_array_begin(&g->body);
    api_op_start(broker, call, req, vhost->name, false, &get_type, g);
}
