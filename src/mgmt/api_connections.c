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
#include "lib/alloc.h"
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

/* ---- a listing: the fields copied out in the request's turn ------------------- */

/* Clients open as many connections, channels and consumers as they like,
 * and nothing holds one across loop turns: a list copies what each item
 * shows (names, numbers, counters, rates, state, as of the request) into
 * compact records in the request's turn, a memcpy a string, and writes
 * their JSON, parses it for columns=/sort=/name=, sorts and answers in
 * slices (api_list_answer_slices). These lists have no default order
 * (default_sort ""): the tables' order, as gathered. */

/* A string copied into the listing's text (api_list_keep). */
struct kept {
    size_t at;
    uint32_t len;
    bool present;               /* else shown as null */
};

/* A connection, as its item and its channels' and consumers' show it. */
struct listed_connection {
    struct kept peer, local, user, vhost;
    const char *state;          /* a literal */
    uint64_t id, connected_at_ms, recv_oct, send_oct;
    double recv_oct_rate, send_oct_rate;
    uint32_t channels, frame_max, channel_max, heartbeat_s;
    bool ssl, blocked;
    bool flow;                  /* its channels' state: "flow" */
};

struct listed_channel {
    struct channel_info info;   /* info.connection: NULL (gone after the turn) */
    uint32_t connection;        /* in connections */
};

struct listed_consumer {
    struct kept tag, queue, vhost;
    uint32_t connection;        /* in connections */
    uint16_t channel;
    uint32_t prefetch_count;
    bool ack_required, exclusive, active;
};

/* Owned by the list's slices (freed by listing_done). */
struct listing {
    struct api_list_text text;
    struct kept node;
    struct listed_connection *connections;
    size_t connections_count, connections_cap;
    struct listed_channel *channels;
    size_t channels_count, channels_cap;
    struct listed_consumer *consumers;
    size_t consumers_count, consumers_cap;
    /* The connection last copied (only within the request's turn), so that
     * a connection's consecutive channels or consumers share its record. */
    const struct connection *last;  /* borrowed */
    uint64_t began_ns;
};

/* items (count of size each), with room for one more. */
static void *room_for_one(void *items, size_t *cap, size_t count, size_t size)
{
    if (count < *cap)
        return items;
    *cap = 2 * *cap + 64;
    items = xrealloc(items, *cap * size);
    return items;
}

static struct kept keep(struct listing *l, const void *ptr, size_t len)
{
    ASSERT(len <= UINT32_MAX);
    size_t at = api_list_keep(&l->text, (struct bytes){ptr, (uint32_t)len});
    return (struct kept){.at = at, .len = (uint32_t)len, .present = true};
}

static struct kept keep_cstr(struct listing *l, const char *s)
{
    return s != NULL ? keep(l, s, strlen(s)) : (struct kept){0};
}

static struct bytes kept(const struct listing *l, struct kept k)
{
    return api_list_kept(&l->text, k.at, k.len);
}

static struct listing *listing_new(struct broker *broker)
{
    struct listing *l = xcalloc(1, sizeof *l);
    l->began_ns = uv_hrtime();
    l->node = keep_cstr(l, api_node_name(broker));
    return l;
}

/* The index of c's record, copied now unless it was the last one copied. */
static uint32_t add_connection(struct listing *l, struct broker *broker,
                               const struct connection *c)
{
    if (l->last == c)
        return (uint32_t)(l->connections_count - 1);
    l->connections = room_for_one(l->connections, &l->connections_cap,
                                  l->connections_count, sizeof *l->connections);
    const struct rates_clock *clock = &broker->rates_clock;
    struct listed_connection *it = &l->connections[l->connections_count++];
    *it = (struct listed_connection){
        .peer = keep_cstr(l, c->conn.peer_name),
        .local = keep_cstr(l, c->conn.local_name),
        .user = keep_cstr(l, c->user ? c->user->name : NULL),
        .vhost = c->vhost ? keep(l, c->vhost->name.ptr, c->vhost->name.len) : (struct kept){0},
        .state = state_name(c),
        .id = c->conn.id,
        .connected_at_ms = wall_ms() - (uv_now(broker->loop) - c->started_ms),
        .recv_oct = c->conn.bytes_in,
        .send_oct = c->conn.bytes_out,
        .recv_oct_rate = rates_per_s(&c->rates, clock, CONNECTION_RATE_RECV_OCT),
        .send_oct_rate = rates_per_s(&c->rates, clock, CONNECTION_RATE_SEND_OCT),
        .channels = c->channels_open,
        .frame_max = c->frame_max,
        .channel_max = c->channel_max,
        .heartbeat_s = c->heartbeat_s,
        .ssl = conn_tls(&c->conn) != NULL,
        .blocked = c->blocked,
        .flow = c->flow || flow_connection_waits(c)};
    l->last = c;
    return (uint32_t)(l->connections_count - 1);
}

static void add_channels(struct listing *l, struct broker *broker, const struct connection *c,
                         struct channel_info *infos)
{
    uint32_t n = channels_info(c, infos, CHANNELS_SHOWN_MAX);
    if (n == 0)
        return;
    uint32_t connection = add_connection(l, broker, c);
    for (uint32_t i = 0; i < n; i++) {
        l->channels = room_for_one(l->channels, &l->channels_cap, l->channels_count,
                                   sizeof *l->channels);
        struct listed_channel *it = &l->channels[l->channels_count++];
        *it = (struct listed_channel){.info = infos[i], .connection = connection};
        it->info.connection = NULL;
    }
}

static void add_consumer(struct listing *l, struct broker *broker, const struct queue *q,
                         const struct consumer *consumer, const struct channel_info *ch)
{
    uint32_t connection = add_connection(l, broker, ch->connection);
    l->consumers = room_for_one(l->consumers, &l->consumers_cap, l->consumers_count,
                                sizeof *l->consumers);
    bool active = q->active_consumer == NULL || q->active_consumer == consumer;
    l->consumers[l->consumers_count++] = (struct listed_consumer){
        .tag = keep(l, consumer->tag.ptr, consumer->tag.len),
        .queue = keep(l, q->name.ptr, q->name.len),
        .vhost = keep(l, q->vhost->name.ptr, q->vhost->name.len),
        .connection = connection,
        .channel = ch->number,
        .prefetch_count = consumer->prefetch_count,
        .ack_required = !consumer->no_ack,
        .exclusive = consumer->exclusive,
        .active = active};
}

static void listing_done(void *ctx)
{
    struct listing *l = ctx;
    free(l->text.data);
    free(l->connections);
    free(l->channels);
    free(l->consumers);
    free(l);
}

/* ---- writing a listed item ------------------------------------------------------ */

static void write_kept(struct json *out, const struct listing *l, const char *key,
                       struct kept k)
{
    json_key(out, key);
    if (!k.present) {
        json_null(out);
        return;
    }
    struct bytes b = kept(l, k);
    json_string_n(out, b.ptr, b.len);
}

/* "peer -> local", as RabbitMQ names a connection. */
static void connection_name(const struct listing *l, const struct listed_connection *c,
                            char *out, size_t size)
{
    struct bytes peer = kept(l, c->peer), local = kept(l, c->local);
    snprintf(out, size, "%.*s -> %.*s", (int)peer.len, (const char *)peer.ptr,
             (int)local.len, (const char *)local.ptr);
}

/* Splits "ip:port" / "[v6]:port" into its parts. */
static void write_host_port(struct json *out, const char *hk, const char *pk,
                            struct bytes end)
{
    char name[80];
    snprintf(name, sizeof name, "%.*s", (int)end.len, (const char *)end.ptr);
    const char *colon = strrchr(name, ':');
    size_t host_size = colon ? (size_t)(colon - name) : strlen(name);
    if (host_size >= 2 && name[0] == '[')
        json_key(out, hk), json_string_n(out, name + 1, host_size - 2);
    else
        json_key(out, hk), json_string_n(out, name, host_size);
    json_kv_uint(out, pk, colon ? strtoul(colon + 1, NULL, 10) : 0);
}

static void write_connection(struct json *out, const struct listing *l,
                             const struct listed_connection *c)
{
    char name[NAME_SIZE];
    connection_name(l, c, name, sizeof name);
    json_object_begin(out);
    json_kv_string(out, "name", name);
    write_kept(out, l, "node", l->node);
    write_kept(out, l, "user", c->user);
    write_kept(out, l, "vhost", c->vhost);
    json_kv_uint(out, "channels", c->channels);
    json_kv_string(out, "state", c->state);
    write_host_port(out, "peer_host", "peer_port", kept(l, c->peer));
    write_host_port(out, "host", "port", kept(l, c->local));
    json_kv_string(out, "protocol", "AMQP 0-9-1");
    json_kv_string(out, "type", "network");
    json_kv_bool(out, "ssl", c->ssl);
    json_kv_uint(out, "connected_at", c->connected_at_ms);
    json_kv_uint(out, "frame_max", c->frame_max);
    json_kv_uint(out, "channel_max", c->channel_max);
    json_kv_uint(out, "timeout", c->heartbeat_s);
    api_stats_write(out, "recv_oct", c->recv_oct, c->recv_oct_rate);
    api_stats_write(out, "send_oct", c->send_oct, c->send_oct_rate);
    /* quay's own. */
    json_kv_uint(out, "id", c->id);
    write_kept(out, l, "peer", c->peer);
    json_kv_bool(out, "blocked", c->blocked);
    json_object_end(out);
}

static void write_channel(struct json *out, const struct listing *l,
                          const struct listed_channel *listed)
{
    const struct listed_connection *c = &l->connections[listed->connection];
    const struct channel_info *ch = &listed->info;
    char name[NAME_SIZE], full[NAME_SIZE + 16];
    connection_name(l, c, name, sizeof name);
    snprintf(full, sizeof full, "%s (%u)", name, ch->number);
    json_object_begin(out);
    json_kv_string(out, "name", full);
    json_kv_uint(out, "number", ch->number);
    write_kept(out, l, "node", l->node);
    write_kept(out, l, "user", c->user);
    write_kept(out, l, "vhost", c->vhost);
    json_key(out, "connection_details");
    json_object_begin(out);
    json_kv_string(out, "name", name);
    write_host_port(out, "peer_host", "peer_port", kept(l, c->peer));
    json_object_end(out);
    json_kv_bool(out, "confirm", ch->confirm);
    json_kv_bool(out, "transactional", ch->transactional);
    json_kv_uint(out, "consumer_count", ch->consumers_count);
    json_kv_uint(out, "messages_unacknowledged", ch->unacked_count);
    json_kv_uint(out, "prefetch_count", ch->prefetch_count);
    json_kv_uint(out, "global_prefetch_count", ch->global_prefetch_count);
    /* Flow control stops a whole connection (as RabbitMQ's reader), so
     * its channels show it. */
    json_kv_string(out, "state", c->flow ? "flow" : "running");
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

static void write_consumer(struct json *out, const struct listing *l,
                           const struct listed_consumer *consumer)
{
    const struct listed_connection *c = &l->connections[consumer->connection];
    char name[NAME_SIZE], full[NAME_SIZE + 16];
    connection_name(l, c, name, sizeof name);
    snprintf(full, sizeof full, "%s (%u)", name, consumer->channel);
    json_object_begin(out);
    write_kept(out, l, "consumer_tag", consumer->tag);
    json_kv_bool(out, "ack_required", consumer->ack_required);
    json_kv_bool(out, "exclusive", consumer->exclusive);
    json_kv_uint(out, "prefetch_count", consumer->prefetch_count);
    json_kv_bool(out, "active", consumer->active);
    json_kv_string(out, "activity_status", consumer->active ? "up" : "waiting");
    json_key(out, "arguments");
    json_object_begin(out);
    json_object_end(out);
    json_key(out, "queue");
    json_object_begin(out);
    write_kept(out, l, "name", consumer->queue);
    write_kept(out, l, "vhost", consumer->vhost);
    json_object_end(out);
    json_key(out, "channel_details");
    json_object_begin(out);
    json_kv_string(out, "name", full);
    json_kv_uint(out, "number", consumer->channel);
    json_kv_string(out, "connection_name", name);
    write_kept(out, l, "node", l->node);
    write_host_port(out, "peer_host", "peer_port", kept(l, c->peer));
    write_kept(out, l, "user", c->user);
    json_object_end(out);
    json_object_end(out);
}

static bool connections_write(void *ctx, size_t i, struct json *out)
{
    const struct listing *l = ctx;
    write_connection(out, l, &l->connections[i]);
    return true;
}

static bool channels_write(void *ctx, size_t i, struct json *out)
{
    const struct listing *l = ctx;
    write_channel(out, l, &l->channels[i]);
    return true;
}

static bool consumers_write(void *ctx, size_t i, struct json *out)
{
    const struct listing *l = ctx;
    write_consumer(out, l, &l->consumers[i]);
    return true;
}

/* Answers l's items (count of them, written by write) in slices; takes l. */
static void answer_list(struct broker *broker, struct http_call *call,
                        const struct http_call_request *req, struct listing *l, size_t count,
                        bool (*write)(void *ctx, size_t i, struct json *out))
{
    l->last = NULL; /* the turn is over */
    struct api_list_source source = {.count = count, .write = write, .done = listing_done,
                                     .ctx = l, .began_ns = l->began_ns};
    api_list_answer_slices(broker->loop, call, req, "", &source);
}

/* ---- the routes ------------------------------------------------------------------ */

static void list_connections(struct broker *broker, struct http_call *call,
                             const struct http_call_request *req, const struct api_path *path)
{
    struct listing *l = listing_new(broker);
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (!is_client(c) || !sees(req->user, c))
            continue;
        if (path->count == 0) {
            add_connection(l, broker, c);
            continue;
        }
        char name[NAME_SIZE];
        snprintf(name, sizeof name, "%s -> %s", c->conn.peer_name, c->conn.local_name);
        if (bytes_equal_cstr(path->seg[0], name)) {
            add_connection(l, broker, c);
            break;
        }
    }
    if (path->count == 0) {
        answer_list(broker, call, req, l, l->connections_count, connections_write);
        return;
    }
    if (l->connections_count == 1) {
        struct json body;
        http_body_init(&body);
        write_connection(&body, l, &l->connections[0]);
        api_object_answer(call, req, &body);
    } else {
        api_answer_not_found(call);
    }
    listing_done(l);
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
    struct channel_info *infos = xmalloc(CHANNELS_SHOWN_MAX * sizeof *infos);
    struct listing *l = listing_new(broker);
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (is_client(c) && sees(req->user, c))
            add_channels(l, broker, c, infos);
    }
    free(infos);
    answer_list(broker, call, req, l, l->channels_count, channels_write);
}

static void add_vhost_consumers(struct listing *l, struct broker *broker,
                                const struct vhost *vhost, const struct auth_user *user)
{
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->queues, &i, &e);) {
        const struct queue *q = e->value;
        list_for_each(node, &q->consumers) {
            const struct consumer *consumer = CONTAINER_OF(node, struct consumer, queue_link);
            struct channel_info ch;
            if (channel_consumer_info(consumer, &ch) && is_client(ch.connection) &&
                sees(user, ch.connection))
                add_consumer(l, broker, q, consumer, &ch);
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
    struct listing *l = listing_new(broker);
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        bool wanted = path.count == 1 ? bytes_equal(vhost->name, path.seg[0])
                                      : mgmt_user_sees_vhost(req->user, vhost->name);
        if (wanted)
            add_vhost_consumers(l, broker, vhost, req->user);
    }
    answer_list(broker, call, req, l, l->consumers_count, consumers_write);
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
