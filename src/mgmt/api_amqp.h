/*
 * api_amqp.h: the management API acting over AMQP, as the user who asked.
 *
 * Whatever the API changes (declare, delete, bind, purge, publish, get)
 * it does as RabbitMQ's management plugin does: it opens an AMQP
 * connection to this broker (loopback, the first plain --listen address),
 * logs in with the request's own Basic credentials, opens the vhost and
 * sends the same methods a client would. So the broker's one path for
 * each operation serves the API too: permissions, RabbitMQ's equivalence
 * checks and reply texts, and in a cluster the map commands and the
 * queue's own operations (a queue whose primary is another broker is
 * handled by its stand-in, as for any client). Nothing here reaches into
 * broker state.
 *
 * An operation (struct api_op) lives from api_op_start until it answers
 * its HTTP call (api_op_answer / api_op_fail_amqp / api_op_fail), or its
 * client goes away; then its link is freed and its data with it.
 *
 * AMQP refusals become RabbitMQ's HTTP answers: 404 NOT_FOUND -> 404
 * {"error": "not_found"}, 403 ACCESS_REFUSED -> 401 {"error":
 * "not_authorised"}, any other channel or connection error -> 400
 * {"error": "bad_request"}, the reason being the AMQP reply "CODE -
 * text" as RabbitMQ writes it ("NOT_FOUND - no queue 'q' in vhost '/'").
 */
#ifndef QUAY_MGMT_API_AMQP_H
#define QUAY_MGMT_API_AMQP_H

#include <stdbool.h>
#include <stdint.h>

#include "amqp/method_gen.h"
#include "lib/types.h"
#include "mgmt/http.h"

struct api_op;
struct broker;
struct json;
struct link_channel;
struct message;
struct method;

/* What an operation does at each step; ctx is api_op_data's. Every hook
 * but started is optional. */
struct api_op_type {
    /* The channel is open (in confirm mode if asked): send the methods. */
    void (*started)(struct api_op *op, struct link_channel *ch);
    void (*reply)(struct api_op *op, const struct method *m);
    /* basic.get-ok (message with one reference for the callee) or -empty. */
    void (*get_reply)(struct api_op *op, uint64_t delivery_tag, bool redelivered,
                      uint32_t message_count, struct message *message);
    void (*confirm)(struct api_op *op, uint64_t seq, bool ack);
    /* basic.return (message with one reference for the callee). */
    void (*returned)(struct api_op *op, struct message *message);
    /* Frees the operation's data (api_op_start's data), if any. */
    void (*free_data)(void *data);
};

/* Starts an operation for call in vhost (copied) with the request's
 * credentials; data is the caller's, handed to type->free_data at the
 * end. Answers the call itself if it cannot start (no listener, bad
 * credentials: 503 / 401). */
void api_op_start(struct broker *broker, struct http_call *call,
                  const struct http_call_request *req, struct bytes vhost, bool confirm,
                  const struct api_op_type *type, void *data);
/* How an operation without an HTTP call ended: status as the HTTP answer
 * would have been (2xx: done), reason for a failure (else NULL). */
typedef void (*api_op_done_fn)(void *ctx, int status, const char *reason);
/* The same without an HTTP call, for the broker's own work (quayd
 * --definitions): logs in as user/password (auth_add_internal's) and
 * reports through done. */
void api_op_start_as(struct broker *broker, const char *user, const char *password,
                     struct bytes vhost, const struct api_op_type *type, void *data,
                     api_op_done_fn done, void *done_ctx);
void *api_op_data(struct api_op *op);

/* An operation that is one method and its -ok, answered 201 or 204
 * without a body (a declare, delete, purge, bind or unbind): its data
 * begins with this, and api_change_type sends the method and answers. */
struct api_change {
    struct method method;
    uint32_t ok_id;                /* the reply that means done */
    int status;                    /* 201 or 204 */
};
extern const struct api_op_type api_change_type;
struct link_channel *api_op_channel(struct api_op *op);
/* Answers with body (taken) and ends the operation. */
void api_op_answer(struct api_op *op, int status, struct json *body);
/* Answers 201/204-like success with no content (RabbitMQ's PUT/DELETE
 * answer: 201 Created for a new object, 204 No Content otherwise). */
void api_op_answer_empty(struct api_op *op, int status);
/* Answers an AMQP refusal as RabbitMQ's management plugin does (above). */
void api_op_fail_amqp(struct api_op *op, uint16_t reply_code, struct bytes reply_text);
void api_op_fail(struct api_op *op, int status, const char *reason);
/* Ends the operation without answering: the caller goes on with the call
 * (starts another operation on it, or answers it). The data is not freed. */
void api_op_end(struct api_op *op);

#endif
