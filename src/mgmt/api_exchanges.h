/*
 * api_exchanges.h: RabbitMQ's exchange endpoints of the management API.
 *
 *   GET    /api/exchanges[/{vhost}]                 the exchanges (api_list.h)
 *   GET    /api/exchanges/{vhost}/{name}            one (404 Object Not Found)
 *   PUT    /api/exchanges/{vhost}/{name}            declare: {"type", "durable",
 *                                                   "auto_delete", "internal",
 *                                                   "arguments"}; 201 / 204
 *   DELETE /api/exchanges/{vhost}/{name}            204 (?if-unused=true)
 *   POST   /api/exchanges/{vhost}/{name}/publish    api_message.h
 *   GET    /api/exchanges/{vhost}/{name}/bindings/source|destination
 *
 * An exchange: {"name", "vhost", "type", "durable", "auto_delete",
 * "internal", "arguments"}; the default exchange is listed with name "",
 * and "amq.default" names it in paths, as in RabbitMQ. Changes go over
 * AMQP as the user (api_amqp.h).
 */
#ifndef QUAY_MGMT_API_EXCHANGES_H
#define QUAY_MGMT_API_EXCHANGES_H

#include "mgmt/http.h"

struct broker;
struct exchange;
struct json;
struct vhost;

void api_exchanges_register(struct http_server *http, struct broker *broker);
/* One exchange's JSON (definitions use it too). */
void api_exchange_write(struct json *out, const struct vhost *vhost, const struct exchange *x);

#endif
