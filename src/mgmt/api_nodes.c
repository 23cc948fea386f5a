/*
 * api_nodes.c: see api_nodes.h.
 */
#include "mgmt/api_nodes.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/alarm.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/connection.h"
#include "broker/queue.h"
#include "broker/message.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "cluster/map.h"
#include "cluster/node.h"
#include "cluster/member.h"
#include "lib/assert.h"
#include "mgmt/api.h"
#include "mgmt/api_amqp.h"
#include "mgmt/api_list.h"
#include "mgmt/api_queues.h"
#include "mgmt/api_stats.h"
#include "lib/json.h"

#define ALIVENESS_QUEUE "aliveness-test"

static void write_local(struct json *out, struct broker *broker)
{
    const struct alarm *a = &broker->alarm;
    json_kv_uint(out, "mem_used", alarm_memory_estimate(a));
    json_kv_uint(out, "mem_limit", a->memory_high_watermark);
    json_kv_bool(out, "mem_alarm", a->memory_on);
    json_kv_uint(out, "disk_free", a->disk_free_bytes);
    json_kv_uint(out, "disk_free_limit", a->disk_free_limit);
    json_kv_bool(out, "disk_free_alarm", a->disk_on);
    json_kv_uint(out, "uptime", mgmt_api_uptime_ms(mgmt_api_of(broker)));
    json_key(out, "partitions");
    json_array_begin(out);
    json_array_end(out);
}

static void write_map_broker(struct json *out, struct broker *broker,
                             const struct map_broker *b)
{
    bool self = b->id == cluster_node_id(member_node_of(broker));
    json_object_begin(out);
    json_key(out, "name");
    json_string_n(out, b->name.ptr, b->name.len);
    json_kv_string(out, "type", "disc");
    json_kv_bool(out, "running", b->state != BROKER_STATE_DOWN);
    if (self)
        write_local(out, broker);
    json_kv_string(out, "state", broker_state_name(b->state));
    json_kv_bool(out, "voter", b->voter);
    json_kv_uint(out, "queues_owned", b->queues_owned_count);
    json_kv_uint(out, "backups_held", b->backups_held_count);
    json_key(out, "amqp_address");
    json_string_n(out, b->amqp_address.ptr, b->amqp_address.len);
    json_object_end(out);
}

static void handle_nodes(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    if (path.count > 1 || req->method == HTTP_METHOD_POST) {
        api_answer_not_found(call);
        return;
    }
    struct json body;
    http_body_init(&body);
    if (path.count == 0)
        json_array_begin(&body);
    uint32_t found = 0;
    if (member_node_of(broker) == NULL) {
        if (path.count == 0 || bytes_equal_cstr(path.seg[0], api_node_name(broker))) {
            json_object_begin(&body);
            json_kv_string(&body, "name", api_node_name(broker));
            json_kv_string(&body, "type", "disc");
            json_kv_bool(&body, "running", true);
            write_local(&body, broker);
            json_object_end(&body);
            found++;
        }
    } else {
        const struct cluster_map *map = cluster_node_map(member_node_of(broker));
        for (uint32_t i = 0; i < map->brokers_count; i++) {
            const struct map_broker *b = map->brokers[i];
            if (path.count == 1 && !bytes_equal(path.seg[0], b->name))
                continue;
            write_map_broker(&body, broker, b);
            found++;
        }
    }
    if (path.count == 0) {
        json_array_end(&body);
        api_list_answer(call, req, &body, "name");
    } else if (found == 1) {
        api_object_answer(call, req, &body);
    } else {
        json_free(&body);
        api_answer_not_found(call);
    }
}

/* ---- health (the rest: api_health.c) ---- */

static bool only_get(struct http_call *call, const struct http_call_request *req)
{
    if (req->rest_size > 0 || (req->method != HTTP_METHOD_GET && req->method != HTTP_METHOD_HEAD)) {
        api_answer_not_found(call);
        return false;
    }
    return true;
}

static void handle_node_check(void *ctx, struct http_call *call,
                              const struct http_call_request *req)
{
    (void)ctx;
    if (!only_get(call, req))
        return;
    struct json body;
    http_body_init(&body);
    json_object_begin(&body);
    json_kv_string(&body, "status", "ok");
    json_object_end(&body);
    http_call_answer(call, 200, &body);
}

/* ---- aliveness ----------------------------------------------------------------- */

static void alive_started(struct api_op *op, struct link_channel *ch)
{
    (void)op;
    struct method declare = {.id = METHOD_QUEUE_DECLARE};
    declare.queue_declare.queue = BYTES_LIT(ALIVENESS_QUEUE);
    link_send(ch, &declare);
    static const uint8_t no_properties[2] = {0, 0};
    struct basic_properties none = {0};
    struct message *m = message_new(BYTES_LIT(""), BYTES_LIT(ALIVENESS_QUEUE), no_properties, 2,
                                    &none, 4);
    ASSERT(m != NULL);
    memcpy(m->body, "test", 4);
    m->body_received = 4;
    link_publish(ch, BYTES_LIT(""), BYTES_LIT(ALIVENESS_QUEUE), false, m);
    message_unref(m);
    struct method get = {.id = METHOD_BASIC_GET};
    get.basic_get.queue = BYTES_LIT(ALIVENESS_QUEUE);
    get.basic_get.no_ack = true;
    link_send(ch, &get);
}

static void alive_got(struct api_op *op, uint64_t tag, bool redelivered, uint32_t count,
                      struct message *message)
{
    (void)tag, (void)redelivered, (void)count;
    if (message == NULL) {
        api_op_fail(op, 503, "aliveness-test: the message did not come back");
        return;
    }
    message_unref(message);
    struct json body;
    http_body_init(&body);
    json_object_begin(&body);
    json_kv_string(&body, "status", "ok");
    json_object_end(&body);
    api_op_answer(op, 200, &body);
}

static const struct api_op_type alive_type = {.started = alive_started, .get_reply = alive_got};

static void handle_aliveness(void *ctx, struct http_call *call,
                             const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    if (path.count != 1 || (req->method != HTTP_METHOD_GET && req->method != HTTP_METHOD_HEAD)) {
        api_answer_not_found(call);
        return;
    }
    struct vhost *vhost = api_vhost_or_404(broker, call, path.seg[0]);
    if (vhost != NULL)
        api_op_start(broker, call, req, vhost->name, false, &alive_type, NULL);
}

void api_nodes_register(struct http_server *http, struct broker *broker)
{
    http_server_route_tree(http, "/api/nodes/", handle_nodes, broker, MGMT_ACCESS_MONITORING);
    http_server_route_tree(http, "/api/healthchecks/node/", handle_node_check, broker,
                           MGMT_ACCESS_MONITORING);
    http_server_route_tree(http, "/api/aliveness-test/", handle_aliveness, broker,
                           MGMT_ACCESS_MANAGEMENT);
}

/* ---- /api/overview's RabbitMQ fields -------------------------------------------- */

struct rabbit_totals {
    uint64_t connections, channels, exchanges;
    bool all;   /* of every vhost */
};

/* What the queue totals leave: client connections, channels, exchanges. */
static void count(struct broker *broker, const struct auth_user *user, struct rabbit_totals *t)
{
    memset(t, 0, sizeof *t);
    bool all = user == NULL || auth_user_has_tag(user, AUTH_TAG_MONITORING);
    t->all = all;
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (!c->cluster_peer && (all || c->user == user)) {
            t->connections++;
            t->channels += c->channels_open;
        }
    }
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        struct vhost *vhost = v->value;
        if (all || mgmt_user_sees_vhost(user, vhost->name))
            t->exchanges += vhost->exchanges.count;
    }
}

static void write_message_stats(struct json *out, struct broker *broker)
{
    const struct broker_counters *c = &broker->counters;
    const struct rates_clock *clock = &broker->rates_clock;
    double rate[BROKER_RATE_COUNT];
    for (uint32_t i = 0; i < BROKER_RATE_COUNT; i++)
        rate[i] = rates_per_s(&broker->rates, clock, i);
    json_key(out, "message_stats");
    json_object_begin(out);
    api_stats_write(out, "publish", c->received, rate[BROKER_RATE_PUBLISH]);
    api_stats_write(out, "confirm", c->confirmed, rate[BROKER_RATE_CONFIRM]);
    api_stats_write(out, "deliver", c->delivered_consume_ack, rate[BROKER_RATE_DELIVER]);
    api_stats_write(out, "deliver_no_ack", c->delivered_consume_no_ack,
                    rate[BROKER_RATE_DELIVER_NO_ACK]);
    api_stats_write(out, "get", c->delivered_get_ack, rate[BROKER_RATE_GET]);
    api_stats_write(out, "get_no_ack", c->delivered_get_no_ack, rate[BROKER_RATE_GET_NO_ACK]);
    api_stats_write(out, "deliver_get",
                    c->delivered_consume_ack + c->delivered_consume_no_ack +
                        c->delivered_get_ack + c->delivered_get_no_ack,
                    rate[BROKER_RATE_DELIVER] + rate[BROKER_RATE_DELIVER_NO_ACK] +
                        rate[BROKER_RATE_GET] + rate[BROKER_RATE_GET_NO_ACK]);
    api_stats_write(out, "redeliver", c->redelivered, rate[BROKER_RATE_REDELIVER]);
    api_stats_write(out, "ack", c->acknowledged, rate[BROKER_RATE_ACK]);
    api_stats_write(out, "return_unroutable", c->unroutable_returned,
                    rate[BROKER_RATE_RETURN_UNROUTABLE]);
    api_stats_write(out, "drop_unroutable", c->unroutable_dropped,
                    rate[BROKER_RATE_DROP_UNROUTABLE]);
    json_object_end(out);
}

static void write_listeners(struct json *out, struct broker *broker)
{
    json_key(out, "listeners");
    json_array_begin(out);
    for (uint32_t i = 0; i < broker->config.listen_count + broker->config.tls_listen_count; i++) {
        bool tls = i >= broker->config.listen_count;
        const char *a = tls ? broker->config.tls_listen[i - broker->config.listen_count]
                            : broker->config.listen[i];
        const char *colon = strrchr(a, ':');
        json_object_begin(out);
        json_kv_string(out, "node", api_node_name(broker));
        json_kv_string(out, "protocol", tls ? "amqp/ssl" : "amqp");
        json_key(out, "ip_address");
        json_string_n(out, a, colon ? (size_t)(colon - a) : 0);
        json_kv_uint(out, "port", strtoul(colon ? colon + 1 : a, NULL, 10));
        json_object_end(out);
    }
    json_array_end(out);
}

void api_overview_write_rabbit(struct json *out, struct broker *broker,
                               const struct auth_user *user,
                               const struct broker_queue_totals *q)
{
    struct rabbit_totals t;
    count(broker, user, &t);
    json_kv_string(out, "management_version", QUAY_VERSION);
    json_kv_string(out, "rabbitmq_version", QUAY_VERSION);
    json_kv_string(out, "product_name", "quay");
    json_kv_string(out, "product_version", QUAY_VERSION);
    json_kv_string(out, "rates_mode", "basic");
    json_kv_string(out, "cluster_name", api_node_name(broker));
    json_key(out, "object_totals");
    json_object_begin(out);
    json_kv_uint(out, "connections", t.connections);
    json_kv_uint(out, "channels", t.channels);
    json_kv_uint(out, "consumers", q->consumers);
    json_kv_uint(out, "exchanges", t.exchanges);
    json_kv_uint(out, "queues", q->queues);
    json_object_end(out);
    json_key(out, "queue_totals");
    json_object_begin(out);
    json_kv_uint(out, "messages", q->ready + q->unacked);
    json_kv_uint(out, "messages_ready", q->ready);
    json_kv_uint(out, "messages_unacknowledged", q->unacked);
    if (t.all) { /* the rates are of every queue's counts */
        const struct rates *r = &broker->totals_rates;
        const struct rates_clock *clock = &broker->rates_clock;
        api_stats_write_rate(out, "messages",
                             rates_per_s(r, clock, BROKER_TOTALS_RATE_MESSAGES));
        api_stats_write_rate(out, "messages_ready",
                             rates_per_s(r, clock, BROKER_TOTALS_RATE_READY));
        api_stats_write_rate(out, "messages_unacknowledged",
                             rates_per_s(r, clock, BROKER_TOTALS_RATE_UNACKED));
    }
    json_object_end(out);
    write_message_stats(out, broker);
    write_listeners(out, broker);
    json_key(out, "exchange_types");
    json_array_begin(out);
    static const char *const types[] = {"direct", "fanout", "headers", "topic"};
    for (size_t i = 0; i < 4; i++) {
        json_object_begin(out);
        json_kv_string(out, "name", types[i]);
        json_kv_bool(out, "enabled", true);
        json_object_end(out);
    }
    json_array_end(out);
}
