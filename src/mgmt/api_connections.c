/*
 * api_connections.c: see api_connections.h.
 */
#include "mgmt/api_connections.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/connection.h"
#include "broker/flow.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/assert.h"
#include "mgmt/api.h"
#include "mgmt/api_list.h"
#include "mgmt/api_queues.h"
#include "mgmt/api_stats.h"
#include "mgmt/api_table.h"
#include "lib/json.h"

#define CHANNELS_SHOWN_MAX 2048
#define NAME_SIZE 160

/* Whether user sees connection c: its own, or all with monitoring. */
static bool sees(const struct auth_user *user, const struct connection *c)
{
    return user == NULL || auth_user_has_tag(user, AUTH_TAG_MONITORING) || c->user == user;
}

static bool is_client(const struct connection *c)
{
    return !c->cluster_peer;
}

/* "ip:port" of the local end, as RabbitMQ names a connection. */
static void local_name(const struct connection *c, char *out, size_t size)
{
    struct sockaddr_storage addr;
    int len = sizeof addr;
    char ip[64] = "?";
    int port = 0;
    if (uv_tcp_getsockname(&c->conn.tcp, (struct sockaddr *)&addr, &len) == 0) {
        if (addr.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&addr, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&addr, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
        }
    }
    snprintf(out, size, addr.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, port);
}

static void connection_name(const struct connection *c, char *out, size_t size)
{
    char local[80];
    local_name(c, local, sizeof local);
    snprintf(out, size, "%s -> %s", c->conn.peer_name, local);
}

/* Splits "ip:port" / "[v6]:port" into its parts. */
static void write_host_port(struct json *out, const char *hk, const char *pk, const char *name)
{
    const char *colon = strrchr(name, ':');
    size_t host_size = colon ? (size_t)(colon - name) : strlen(name);
    if (host_size >= 2 && name[0] == '[')
        json_key(out, hk), json_string_n(out, name + 1, host_size - 2);
    else
        json_key(out, hk), json_string_n(out, name, host_size);
    json_kv_uint(out, pk, colon ? strtoul(colon + 1, NULL, 10) : 0);
}

static const char *state_name(const struct connection *c)
{
    switch (c->state) {
    case CONNECTION_STATE_HEADER:
    case CONNECTION_STATE_START_OK: return "starting";
    case CONNECTION_STATE_SECURE_OK: return "securing";
    case CONNECTION_STATE_TUNE_OK: return "tuning";
    case CONNECTION_STATE_OPEN_WAIT: return "opening";
    case CONNECTION_STATE_OPEN:
        if (c->blocked)
            return "blocked";
        return c->flow || flow_connection_waits(c) ? "flow" : "running";
    case CONNECTION_STATE_CLOSING: return "closing";
    case CONNECTION_STATE_CLOSED: return "closed";
    }
    return "unknown";
}

static uint64_t wall_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
}

static void write_user_vhost(struct json *out, const struct connection *c)
{
    json_key(out, "user");
    c->user ? json_string(out, c->user->name) : json_null(out);
    json_key(out, "vhost");
    c->vhost ? json_string_n(out, c->vhost->name.ptr, c->vhost->name.len) : json_null(out);
}

static void write_connection(struct json *out, struct broker *broker, const struct connection *c)
{
    char name[NAME_SIZE], local[80];
    connection_name(c, name, sizeof name);
    local_name(c, local, sizeof local);
    json_object_begin(out);
    json_kv_string(out, "name", name);
    json_kv_string(out, "node", api_node_name(broker));
    write_user_vhost(out, c);
    json_kv_uint(out, "channels", c->channels_open);
    json_kv_string(out, "state", state_name(c));
    write_host_port(out, "peer_host", "peer_port", c->conn.peer_name);
    write_host_port(out, "host", "port", local);
    json_kv_string(out, "protocol", "AMQP 0-9-1");
    json_kv_string(out, "type", "network");
    json_kv_bool(out, "ssl", conn_tls(&c->conn) != NULL);
    json_kv_uint(out, "connected_at", wall_ms() - (uv_now(broker->loop) - c->started_ms));
    json_kv_uint(out, "frame_max", c->frame_max);
    json_kv_uint(out, "channel_max", c->channel_max);
    json_kv_uint(out, "timeout", c->heartbeat_s);
    const struct rates_clock *clock = &broker->rates_clock;
    api_stats_write(out, "recv_oct", c->conn.bytes_in,
                    rates_per_s(&c->rates, clock, CONNECTION_RATE_RECV_OCT));
    api_stats_write(out, "send_oct", c->conn.bytes_out,
                    rates_per_s(&c->rates, clock, CONNECTION_RATE_SEND_OCT));
    /* quay's own. */
    json_kv_uint(out, "id", c->conn.id);
    json_kv_string(out, "peer", c->conn.peer_name);
    json_kv_bool(out, "blocked", c->blocked);
    json_object_end(out);
}

static void write_channel(struct json *out, struct broker *broker, const struct connection *c,
                          const struct channel_info *ch)
{
    char name[NAME_SIZE], full[NAME_SIZE + 16];
    connection_name(c, name, sizeof name);
    snprintf(full, sizeof full, "%s (%u)", name, ch->number);
    json_object_begin(out);
    json_kv_string(out, "name", full);
    json_kv_uint(out, "number", ch->number);
    json_kv_string(out, "node", api_node_name(broker));
    write_user_vhost(out, c);
    json_key(out, "connection_details");
    json_object_begin(out);
    json_kv_string(out, "name", name);
    write_host_port(out, "peer_host", "peer_port", c->conn.peer_name);
    json_object_end(out);
    json_kv_bool(out, "confirm", ch->confirm);
    json_kv_bool(out, "transactional", ch->transactional);
    json_kv_uint(out, "consumer_count", ch->consumers_count);
    json_kv_uint(out, "messages_unacknowledged", ch->unacked_count);
    json_kv_uint(out, "prefetch_count", ch->prefetch_count);
    json_kv_uint(out, "global_prefetch_count", ch->global_prefetch_count);
    /* Flow control stops a whole connection (as RabbitMQ's reader), so
     * its channels show it. */
    json_kv_string(out, "state", c->flow || flow_connection_waits(c) ? "flow" : "running");
    json_key(out, "message_stats");
    json_object_begin(out);
    static const char *const keys[CHANNEL_RATE_COUNT] = {
        [CHANNEL_RATE_PUBLISH] = "publish", [CHANNEL_RATE_CONFIRM] = "confirm",
        [CHANNEL_RATE_DELIVER_GET] = "deliver_get", [CHANNEL_RATE_REDELIVER] = "redeliver",
        [CHANNEL_RATE_ACK] = "ack"};
    for (uint32_t i = 0; i < CHANNEL_RATE_COUNT; i++)
        api_stats_write(out, keys[i], ch->stats.counts[i], ch->rates[i]);
    json_object_end(out);
    json_object_end(out);
}

/* Connections, channels and consumers: as many as clients open, so
 * written up front (their figures as of the request, as before) and then
 * answered in slices (api_list_answer_texts), in the order written: these
 * lists have no default order (default_sort ""). */
static void answer_list(struct broker *broker, struct http_call *call,
                        const struct http_call_request *req, struct api_list_texts *t)
{
    api_list_answer_texts(broker->loop, call, req, "", t);
}

static void list_connections(struct broker *broker, struct http_call *call,
                             const struct http_call_request *req, const struct api_path *path)
{
    if (path->count == 0) {
        struct api_list_texts t;
        api_list_texts_init(&t);
        list_for_each(node, &broker->connections) {
            const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
            if (is_client(c) && sees(req->user, c)) {
                write_connection(api_list_texts_item(&t), broker, c);
                api_list_texts_end(&t);
            }
        }
        answer_list(broker, call, req, &t);
        return;
    }
    struct json body;
    http_body_init(&body);
    uint32_t found = 0;
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (!is_client(c) || !sees(req->user, c))
            continue;
        char name[NAME_SIZE];
        connection_name(c, name, sizeof name);
        if (found > 0 || !bytes_equal_cstr(path->seg[0], name))
            continue;
        write_connection(&body, broker, c);
        found++;
    }
    if (found == 1) {
        api_object_answer(call, req, &body);
    } else {
        json_free(&body);
        api_answer_not_found(call);
    }
}

static void handle_connections(void *ctx, struct http_call *call,
                               const struct http_call_request *req)
{
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    if (req->method != HTTP_METHOD_GET && req->method != HTTP_METHOD_HEAD)
        http_call_answer_error(call, 405, "Method Not Allowed");
    else if (path.count > 1)
        api_answer_not_found(call);
    else
        list_connections(ctx, call, req, &path);
}

static void handle_channels(void *ctx, struct http_call *call,
                            const struct http_call_request *req)
{
    struct broker *broker = ctx;
    if (req->rest_size > 0 || req->method == HTTP_METHOD_POST) {
        api_answer_not_found(call);
        return;
    }
    struct channel_info *infos = malloc(CHANNELS_SHOWN_MAX * sizeof *infos);
    ASSERT(infos != NULL);
    struct api_list_texts t;
    api_list_texts_init(&t);
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (!is_client(c) || !sees(req->user, c))
            continue;
        uint32_t n = channels_info(c, infos, CHANNELS_SHOWN_MAX);
        for (uint32_t i = 0; i < n; i++) {
            write_channel(api_list_texts_item(&t), broker, c, &infos[i]);
            api_list_texts_end(&t);
        }
    }
    free(infos);
    answer_list(broker, call, req, &t);
}

static void write_consumer(struct json *out, struct broker *broker, const struct queue *q,
                           const struct consumer *consumer, const struct channel_info *ch)
{
    char name[NAME_SIZE], full[NAME_SIZE + 16];
    connection_name(ch->connection, name, sizeof name);
    snprintf(full, sizeof full, "%s (%u)", name, ch->number);
    json_object_begin(out);
    json_key(out, "consumer_tag");
    json_string_n(out, consumer->tag.ptr, consumer->tag.len);
    json_kv_bool(out, "ack_required", !consumer->no_ack);
    json_kv_bool(out, "exclusive", consumer->exclusive);
    json_kv_uint(out, "prefetch_count", consumer->prefetch_count);
    json_kv_bool(out, "active", q->active_consumer == NULL || q->active_consumer == consumer);
    json_kv_string(out, "activity_status",
                   q->active_consumer == NULL || q->active_consumer == consumer ? "up"
                                                                              : "waiting");
    json_key(out, "arguments");
    json_object_begin(out);
    json_object_end(out);
    json_key(out, "queue");
    json_object_begin(out);
    json_key(out, "name");
    json_string_n(out, q->name.ptr, q->name.len);
    json_key(out, "vhost");
    json_string_n(out, q->vhost->name.ptr, q->vhost->name.len);
    json_object_end(out);
    json_key(out, "channel_details");
    json_object_begin(out);
    json_kv_string(out, "name", full);
    json_kv_uint(out, "number", ch->number);
    json_kv_string(out, "connection_name", name);
    json_kv_string(out, "node", api_node_name(broker));
    write_host_port(out, "peer_host", "peer_port", ch->connection->conn.peer_name);
    json_key(out, "user");
    ch->connection->user ? json_string(out, ch->connection->user->name) : json_null(out);
    json_object_end(out);
    json_object_end(out);
}

static void add_vhost_consumers(struct api_list_texts *t, struct broker *broker,
                                const struct vhost *vhost, const struct auth_user *user)
{
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->queues, &i, &e);) {
        const struct queue *q = e->value;
        list_for_each(node, &q->consumers) {
            const struct consumer *consumer = CONTAINER_OF(node, struct consumer, queue_link);
            struct channel_info ch;
            if (channel_consumer_info(consumer, &ch) && is_client(ch.connection) &&
                sees(user, ch.connection)) {
                write_consumer(api_list_texts_item(t), broker, q, consumer, &ch);
                api_list_texts_end(t);
            }
        }
    }
}

static void handle_consumers(void *ctx, struct http_call *call,
                             const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    if (path.count > 1 || req->method == HTTP_METHOD_POST) {
        api_answer_not_found(call);
        return;
    }
    if (path.count == 1 && api_vhost_or_404(broker, call, path.seg[0]) == NULL)
        return;
    struct api_list_texts t;
    api_list_texts_init(&t);
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        bool wanted = path.count == 1 ? bytes_equal(vhost->name, path.seg[0])
                                      : mgmt_user_sees_vhost(req->user, vhost->name);
        if (wanted)
            add_vhost_consumers(&t, broker, vhost, req->user);
    }
    answer_list(broker, call, req, &t);
}

void api_connections_register(struct http_server *http, struct broker *broker)
{
    http_server_route_tree(http, "/api/connections/", handle_connections, broker,
                           MGMT_ACCESS_MANAGEMENT);
    http_server_route_tree(http, "/api/channels/", handle_channels, broker,
                           MGMT_ACCESS_MANAGEMENT);
    http_server_route_tree(http, "/api/consumers/", handle_consumers, broker,
                           MGMT_ACCESS_MANAGEMENT);
}
