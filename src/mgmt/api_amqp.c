/*
 * api_amqp.c: see api_amqp.h. One link (cluster/link.h, the broker's own
 * AMQP client) per operation, logged in as the HTTP user:
 *
 *   api_op_start --link up--> channel.open(-ok) --started()--> methods ...
 *        |                         |                    replies --> api_op_answer
 *        +--down before up---------+--channel closed-------------> api_op_fail_amqp
 *
 * The link never reconnects for us: its first down() ends the operation.
 * The HTTP client leaving first cancels it (the link is freed, no answer).
 */
#include "mgmt/api_amqp.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/broker.h"
#include "broker/message.h"
#include "cluster/link.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/log.h"
#include "mgmt/http_guard.h"
#include "lib/json.h"

struct api_op {
    bool over;                     /* answered, cancelled or ended: no more answers */
    struct http_call *call;        /* the HTTP call to answer, or NULL: done instead */
    api_op_done_fn done;           /* without a call: how it ended */
    void *done_ctx;
    struct link *link;             /* owned */
    struct link_channel *ch;       /* the link's, while open */
    const struct api_op_type *type;
    void *data;                    /* owned through type->free_data */
    struct bytes vhost;            /* owned copy */
    bool confirm;
};

void *api_op_data(struct api_op *op)
{
    return op->data;
}

struct link_channel *api_op_channel(struct api_op *op)
{
    return op->ch;
}

/* Ends the operation once answered: everything goes. Safe from inside a
 * link callback (link_free allows it). */
static void op_free(struct api_op *op)
{
    if (op->ch != NULL)
        link_channel_close(op->ch);
    op->ch = NULL;
    if (op->link != NULL)
        link_free(op->link);
    if (op->type->free_data != NULL && op->data != NULL)
        op->type->free_data(op->data);
    bytes_free(&op->vhost);
    free(op);
}

static void on_cancel(void *arg)
{
    struct api_op *op = arg;
    op->over = true;
    op_free(op);
}

/* Ends the operation with its outcome: the HTTP answer, or done(). */
static void finish(struct api_op *op, int status, struct json *body, const char *reason)
{
    ASSERT(!op->over);
    op->over = true;
    if (op->call != NULL && body != NULL)
        http_call_answer(op->call, status, body);
    else if (op->call != NULL && reason != NULL)
        http_call_answer_error(op->call, status, reason);
    else if (op->call != NULL)
        http_call_answer_empty(op->call, status);
    if (op->call == NULL) {
        if (body != NULL)
            json_free(body);
        op->done(op->done_ctx, status, reason);
    }
    op_free(op);
}

void api_op_answer(struct api_op *op, int status, struct json *body)
{
    finish(op, status, body, NULL);
}

void api_op_answer_empty(struct api_op *op, int status)
{
    finish(op, status, NULL, NULL);
}

static void change_started(struct api_op *op, struct link_channel *ch)
{
    struct api_change *c = api_op_data(op);
    link_send(ch, &c->method);
}

static void change_reply(struct api_op *op, const struct method *m)
{
    struct api_change *c = api_op_data(op);
    if (m->id == c->ok_id)
        api_op_answer_empty(op, c->status);
}

const struct api_op_type api_change_type = {
    .started = change_started, .reply = change_reply, .free_data = free};

void api_op_end(struct api_op *op)
{
    ASSERT(!op->over);
    op->over = true;
    if (op->call != NULL)
        http_call_on_cancel(op->call, NULL, NULL);
    op->data = NULL; /* the caller's still */
    op_free(op);
}

void api_op_fail(struct api_op *op, int status, const char *reason)
{
    finish(op, status, NULL, reason);
}

/* RabbitMQ's reply names, as its management plugin writes them in reasons. */
static const char *reply_name(uint16_t code)
{
    switch (code) {
    case REPLY_NOT_FOUND: return "NOT_FOUND";
    case REPLY_ACCESS_REFUSED: return "ACCESS_REFUSED";
    case REPLY_RESOURCE_LOCKED: return "RESOURCE_LOCKED";
    case REPLY_PRECONDITION_FAILED: return "PRECONDITION_FAILED";
    case REPLY_NOT_ALLOWED: return "NOT_ALLOWED";
    case REPLY_COMMAND_INVALID: return "COMMAND_INVALID";
    case REPLY_NOT_IMPLEMENTED: return "NOT_IMPLEMENTED";
    case REPLY_RESOURCE_ERROR: return "RESOURCE_ERROR";
    case REPLY_INTERNAL_ERROR: return "INTERNAL_ERROR";
    default: return "AMQP_ERROR";
    }
}

void api_op_fail_amqp(struct api_op *op, uint16_t reply_code, struct bytes reply_text)
{
    ASSERT(!op->over);
    /* The broker's texts start "NAME - " (channel__fail). RabbitMQ's
     * management plugin keeps it for NOT_FOUND and drops it otherwise. */
    char reason[600];
    const char *name = reply_name(reply_code);
    size_t name_size = strlen(name);
    bool prefixed = reply_text.len > name_size + 3 &&
                    memcmp(reply_text.ptr, name, name_size) == 0 &&
                    memcmp(reply_text.ptr + name_size, " - ", 3) == 0;
    if (prefixed && reply_code != REPLY_NOT_FOUND)
        reply_text.ptr += name_size + 3, reply_text.len -= (uint32_t)name_size + 3;
    if (prefixed || reply_code != REPLY_NOT_FOUND)
        snprintf(reason, sizeof reason, "%.*s", (int)reply_text.len, (const char *)reply_text.ptr);
    else
        snprintf(reason, sizeof reason, "%s - %.*s", name, (int)reply_text.len,
                 (const char *)reply_text.ptr);
    struct json body;
    http_body_init(&body);
    json_object_begin(&body);
    int status = 400;
    const char *error = "bad_request";
    if (reply_code == REPLY_NOT_FOUND)
        status = 404, error = "not_found";
    else if (reply_code == REPLY_ACCESS_REFUSED)
        status = 401, error = "not_authorised";
    json_kv_string(&body, "error", error);
    json_kv_string(&body, "reason", reason);
    json_object_end(&body);
    if (op->call != NULL) {
        finish(op, status, &body, NULL);
    } else {
        json_free(&body);
        finish(op, status, NULL, reason);
    }
}

/* ---- the channel's callbacks --------------------------------------------- */

static void ch_opened(void *ctx)
{
    struct api_op *op = ctx;
    op->type->started(op, op->ch);
}

static void ch_closed(void *ctx, uint16_t reply_code, struct bytes reply_text)
{
    struct api_op *op = ctx;
    op->ch = NULL; /* the link frees it after this returns */
    if (op->over)
        return;
    if (reply_code == 0)
        api_op_fail(op, 503, "the broker closed the management API's AMQP connection");
    else
        api_op_fail_amqp(op, reply_code, reply_text);
}

static void ch_confirm(void *ctx, uint64_t seq, bool multiple, bool ack)
{
    (void)multiple;
    struct api_op *op = ctx;
    if (op->type->confirm != NULL)
        op->type->confirm(op, seq, ack);
}

static void ch_get_reply(void *ctx, uint64_t delivery_tag, bool redelivered,
                         uint32_t message_count, struct message *message)
{
    struct api_op *op = ctx;
    if (op->type->get_reply != NULL)
        op->type->get_reply(op, delivery_tag, redelivered, message_count, message);
    else if (message != NULL)
        message_unref(message);
}

static void ch_returned(void *ctx, uint16_t reply_code, struct bytes reply_text,
                        struct message *message)
{
    (void)reply_code;
    (void)reply_text;
    struct api_op *op = ctx;
    if (op->type->returned != NULL)
        op->type->returned(op, message);
    else
        message_unref(message);
}

static void ch_deliver(void *ctx, struct bytes consumer_tag, uint64_t delivery_tag,
                       bool redelivered, struct message *message)
{
    (void)ctx, (void)consumer_tag, (void)delivery_tag, (void)redelivered;
    message_unref(message); /* the API never consumes */
}

static void ch_reply(void *ctx, const struct method *m)
{
    struct api_op *op = ctx;
    if (op->type->reply != NULL)
        op->type->reply(op, m);
}

/* ---- the link's callbacks ------------------------------------------------- */

static void link_up(void *ctx, struct link *link)
{
    struct api_op *op = ctx;
    static const struct link_channel_ops ops_template = {
        .opened = ch_opened, .closed = ch_closed, .confirm = ch_confirm,
        .deliver = ch_deliver, .get_reply = ch_get_reply, .returned = ch_returned,
        .reply = ch_reply};
    struct link_channel_ops ops = ops_template;
    ops.ctx = op;
    op->ch = link_channel_open(link, BYTES_LIT(""), op->confirm, &ops);
    if (op->ch == NULL)
        api_op_fail(op, 503, "cannot open a channel to this broker");
}

static void link_down(void *ctx, struct link *link)
{
    struct api_op *op = ctx;
    if (op->over)
        return;
    const char *text;
    uint16_t code = link_last_close(link, &text);
    if (code == REPLY_NOT_ALLOWED || code == REPLY_ACCESS_REFUSED) {
        /* connection.open refused: RabbitMQ's answer for a vhost the user
         * may not open, or one that does not exist. */
        char reason[400];
        snprintf(reason, sizeof reason, "%s", text);
        struct http_refusal refusal = {.status = 401, .error = "not_authorised",
                                       .reason = "User not authorised to access virtual host"};
        if (strstr(reason, "not found") != NULL) {
            api_op_fail(op, 404, "no such vhost");
        } else if (op->call != NULL) {
            op->over = true;
            http_call_answer_refusal(op->call, &refusal);
            op_free(op);
        } else {
            api_op_fail(op, 401, refusal.reason);
        }
        return;
    }
    api_op_fail(op, 503, code ? text : "cannot reach this broker's AMQP listener");
}

/* This broker's first plain listener, as an address to connect to:
 * a wildcard host becomes the loopback of its family. */
static bool loopback_address(const struct broker *broker, char *out, size_t size)
{
    if (broker->config.listen_count == 0)
        return false;
    const char *a = broker->config.listen[0];
    const char *colon = strrchr(a, ':');
    const char *port = colon ? colon + 1 : a;
    size_t host_size = colon ? (size_t)(colon - a) : 0;
    const char *host = a;
    if (host_size == 0 || (host_size == 7 && memcmp(a, "0.0.0.0", 7) == 0))
        host = "127.0.0.1", host_size = 9;
    else if (host_size == 4 && memcmp(a, "[::]", 4) == 0)
        host = "[::1]", host_size = 5;
    int n = snprintf(out, size, "%.*s:%s", (int)host_size, host, port);
    return n > 0 && (size_t)n < size;
}

/* Starts op (its call or done set) logging in as user/password. */
static void start(struct broker *broker, struct api_op *op, const char *user,
                  struct bytes password)
{
    char address[128];
    if (!loopback_address(broker, address, sizeof address)) {
        api_op_fail(op, 503, "the broker has no plain AMQP listener to act on");
        return;
    }
    struct link_config config = {
        .address = address, .self_name = "quay-management", .user = user,
        .password = password, .vhost = op->vhost, .reconnect_min_ms = 60000,
        .reconnect_max_ms = 60000};
    static const struct link_ops link_ops = {.up = link_up, .down = link_down};
    struct link_ops ops = link_ops;
    ops.ctx = op;
    if (link_new(&op->link, &broker->net, &config, &ops) != 0) {
        op->link = NULL;
        api_op_fail(op, 400, "a user name or vhost name too long for AMQP");
        return;
    }
    if (op->call != NULL)
        http_call_on_cancel(op->call, on_cancel, op);
}

static struct api_op *op_new(struct http_call *call, struct bytes vhost, bool confirm,
                             const struct api_op_type *type, void *data)
{
    ASSERT(type != NULL && type->started != NULL);
    struct api_op *op = xcalloc(1, sizeof *op);
    *op = (struct api_op){.call = call, .type = type, .data = data, .confirm = confirm,
                          .vhost = bytes_dup(vhost)};
    return op;
}

void api_op_start(struct broker *broker, struct http_call *call,
                  const struct http_call_request *req, struct bytes vhost, bool confirm,
                  const struct api_op_type *type, void *data)
{
    struct api_op *op = op_new(call, vhost, confirm, type, data);
    struct http_credentials credentials;
    if (req->authorization == NULL ||
        http_basic_parse(req->authorization, req->authorization_size, &credentials) !=
            HTTP_BASIC_OK) {
        api_op_fail(op, 401, "Login failed");
        return;
    }
    char user[256];
    size_t user_size = credentials.user_size < sizeof user - 1 ? credentials.user_size
                                                               : sizeof user - 1;
    memcpy(user, credentials.user, user_size);
    user[user_size] = '\0';
    start(broker, op, user, (struct bytes){credentials.password,
                                           (uint32_t)credentials.password_size});
    OPENSSL_cleanse(credentials.decoded, sizeof credentials.decoded);
}

void api_op_start_as(struct broker *broker, const char *user, const char *password,
                     struct bytes vhost, const struct api_op_type *type, void *data,
                     api_op_done_fn done, void *done_ctx)
{
    ASSERT(done != NULL);
    struct api_op *op = op_new(NULL, vhost, false, type, data);
    op->done = done;
    op->done_ctx = done_ctx;
    start(broker, op, user, bytes_of_cstr(password));
}
