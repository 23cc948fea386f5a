/*
 * api.c: see api.h. The handlers, and the JSON shape of each answer.
 *
 * Field names follow RabbitMQ's management API where a field means the
 * same thing there (durable, auto_delete, consumers, messages_unacknowledged,
 * peer_host...), so habits and scripts carry over. One difference, on
 * purpose: a queue's "messages" counts ready messages only (RabbitMQ adds
 * the unacknowledged ones); the unacknowledged are "messages_unacknowledged".
 *
 * Nothing here allocates besides the response buffer: lists are written
 * in table order, not sorted (quayctl sorts for display).
 */
#include "mgmt/api.h"

#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "cluster/proxy.h"
#include "cluster/replica.h"
#include "cluster/replication.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "broker/alarm.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/connection.h"
#include "broker/dedup.h"
#include "broker/durable.h"
#include "broker/flow.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api_policies.h"
#include "mgmt/api_users.h"
#include "mgmt/http.h"
#include "mgmt/http_guard.h"
#include "mgmt/json.h"
#include "mgmt/metrics.h"

/* The version the broker reports in connection.start's server properties
 * (connection.c) and CMake's project(); keep the three in step. */
/* This broker's name in placement fields until the cluster names nodes. */
#define MGMT_NODE_NAME "local"

struct mgmt_api {
    struct broker *broker;         /* borrowed: our owner */
    struct http_server http;
    uint64_t started_ms;           /* loop time at start, for uptime */
};

/* ---- who may do what ---------------------------------------------------- */

bool mgmt_user_sees_vhost(const struct auth_user *user, struct bytes vhost)
{
    return user == NULL || auth_user_has_tag(user, AUTH_TAG_ADMINISTRATOR) ||
           auth_user_may_open(user, vhost);
}

/* Whether the API shows user every connection and the node's own data. */
static bool sees_node(const struct auth_user *user)
{
    return user == NULL || auth_user_has_tag(user, AUTH_TAG_MONITORING);
}

/* Whether the connection is one the user may see. */
static bool sees_connection(const struct auth_user *user, const struct connection *c)
{
    return sees_node(user) || c->user == user;
}

static int refuse(struct http_refusal *refusal, const char *error, const char *reason)
{
    *refusal = (struct http_refusal){.status = 401, .error = error, .reason = reason};
    return E_LIMIT;
}

/* A login that failed: RabbitMQ's answer (its spelling, "not_authorized"
 * here and "not_authorised" for a missing right), with the challenge. */
static int refuse_login(struct http_refusal *refusal, const char *reason)
{
    refuse(refusal, "not_authorized", reason);
    refusal->challenge = true;
    return E_LIMIT;
}

/* The right a route needs, once the user is known. */
static int check_right(const struct auth_user *u, const struct http_admission *a,
                       struct http_refusal *refusal)
{
    if (!auth_user_has_tag(u, AUTH_TAG_MANAGEMENT))
        return refuse(refusal, "not_authorised", "Not management user");
    switch ((enum mgmt_access)a->access) {
    case MGMT_ACCESS_MANAGEMENT:
        return OK;
    case MGMT_ACCESS_MONITORING:
        if (!auth_user_has_tag(u, AUTH_TAG_MONITORING))
            return refuse(refusal, "not_authorised", "Not monitor user");
        return OK;
    case MGMT_ACCESS_POLICIES:
        /* Which vhost is the route's to check (api_policies.c). */
        if ((a->method == HTTP_METHOD_PUT || a->method == HTTP_METHOD_DELETE) &&
            !auth_user_has_tag(u, AUTH_TAG_POLICYMAKER))
            return refuse(refusal, "not_authorised", "User not authorised to access object");
        return OK;
    case MGMT_ACCESS_ADMINISTRATOR:
        if (!auth_user_has_tag(u, AUTH_TAG_ADMINISTRATOR))
            return refuse(refusal, "not_authorised", "Not administrator user");
        return OK;
    }
    ASSERT(!"a route without a known access");
    return E_LIMIT;
}

/* The admission hook (http.h): HTTP Basic against the broker's users, then
 * the route's right. A bad password, an unknown user and no credentials
 * get one answer; only a right password from the wrong peer is told so,
 * as RabbitMQ does. */
static int admit(void *ctx, const struct http_admission *a, const struct auth_user **user,
                 struct http_refusal *refusal)
{
    struct mgmt_api *api = ctx;
    const struct http_request *req = a->request;
    if (req->authorization == NULL)
        return refuse_login(refusal, "Login failed: send HTTP Basic credentials");
    struct http_credentials credentials;
    switch (http_basic_parse(req->authorization, req->authorization_size, &credentials)) {
    case HTTP_BASIC_OK:
        break;
    case HTTP_BASIC_OTHER:
        return refuse_login(refusal, "Login failed");
    case HTTP_BASIC_MALFORMED:
        *refusal = (struct http_refusal){
            .status = 400, .reason = "malformed Basic credentials (base64 of user:password)"};
        return E_SYNTAX;
    }
    struct bytes name = {credentials.user, (uint32_t)credentials.user_size};
    struct bytes password = {credentials.password, (uint32_t)credentials.password_size};
    const struct auth_user *u = NULL;
    enum auth_verdict verdict =
        auth_login(&api->broker->auth, name, password, a->peer_loopback, &u);
    OPENSSL_cleanse(credentials.decoded, sizeof credentials.decoded);
    if (verdict == AUTH_VERDICT_LOOPBACK_ONLY)
        return refuse(refusal, "not_authorised", "User can only log in via localhost");
    if (verdict != AUTH_VERDICT_OK)
        return refuse_login(refusal, "Login failed");
    ASSERT(u != NULL);
    if (check_right(u, a, refusal) != OK)
        return E_LIMIT;
    *user = u;
    return OK;
}

static void write_bytes(struct json *out, const char *key, struct bytes value)
{
    json_key(out, key);
    json_string_n(out, value.ptr, value.len);
}

/* ---- GET /api/overview --------------------------------------------------
 * {"product": "quay", "version": "0.1.0", "node": "local", "uptime_ms": N,
 *  "connections": N, "channels": N, "queues": N, "consumers": N,
 *  "messages_ready": N, "messages_unacknowledged": N, "messages_paged": N,
 *  "memory": {"used_bytes": N, "high_watermark_bytes": N, "alarm": bool},
 *  "disk": {"free_bytes": N, "free_limit_bytes": N, "alarm": bool},
 *  "alarms": ["memory", "disk"] (the ones on),
 *  "journal": {"synced_ticket": N, "status": 0},
 *  "network": {"bytes_in": N, "bytes_out": N, "reads": N (every socket: AMQP,
 *   links, HTTP), "read_batch_us": N (0 = off), "read_batches_started": N (times a
 *   streaming publisher's socket got a batch mark), "read_batches_timed_out": N
 *   (marks dropped because the stream paused: see net/read_batch.h)},
 *  "cluster": {the same as GET /api/cluster} (clustered only)}
 * For a user without the monitoring tag the totals count its own
 * connections and its vhosts' queues only, and journal, network and
 * cluster (the node's own data) are left out.
 */
struct totals {
    uint64_t connections;
    uint64_t channels;
    uint64_t queues;
    uint64_t consumers;
    uint64_t ready;
    uint64_t unacked;
    uint64_t paged;
};

/* Totals over what user sees: its vhosts' queues and its connections,
 * unless it is a monitoring user (RabbitMQ counts the same way). */
static void count_totals(struct broker *broker, const struct auth_user *user, struct totals *t)
{
    memset(t, 0, sizeof *t);
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (sees_connection(user, c)) {
            t->connections++;
            t->channels += c->channels_open;
        }
    }
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        struct vhost *vhost = v->value;
        if (!sees_node(user) && !mgmt_user_sees_vhost(user, vhost->name))
            continue;
        struct hmap_entry *q;
        for (uint32_t j = 0; hmap_next(&vhost->queues, &j, &q);) {
            const struct queue *queue = q->value;
            t->queues++;
            t->consumers += queue->consumers_count;
            t->ready += queue_ready_count(queue);
            t->unacked += queue->unacked_count;
            t->paged += queue->paged_count;
        }
    }
}

/* The node's own data: for monitoring users only. */
static void write_node(struct json *out, struct broker *broker)
{
    json_key(out, "journal");
    json_object_begin(out);
    json_kv_uint(out, "synced_ticket", durable_synced_ticket(broker));
    json_key(out, "status");
    json_int(out, broker->durable.status);
    json_object_end(out);

    const struct net *net = &broker->net;
    json_key(out, "network");
    json_object_begin(out);
    json_kv_uint(out, "bytes_in", net->bytes_in);
    json_kv_uint(out, "bytes_out", net->bytes_out);
    json_kv_uint(out, "reads", net->reads);
    json_kv_uint(out, "read_batch_us", net->read_batch.wait_ns / 1000u);
    json_kv_uint(out, "read_batches_started", net->read_batch.raised_count);
    json_kv_uint(out, "read_batches_timed_out", net->read_batch.timeout_count);
    json_object_end(out);
    if (broker->cluster) {
        /* The cluster in brief (GET /api/cluster has it all). */
        json_key(out, "cluster");
        member_cluster_json(broker->member, out);
    }
}

static void handle_overview(void *ctx, const struct auth_user *user, struct json *out)
{
    struct mgmt_api *api = ctx;
    struct broker *broker = api->broker;
    const struct alarm *alarm = &broker->alarm;
    struct totals t;
    count_totals(broker, user, &t);
    json_object_begin(out);
    json_kv_string(out, "product", "quay");
    json_kv_string(out, "version", QUAY_VERSION);
    json_kv_string(out, "node", MGMT_NODE_NAME);
    json_kv_uint(out, "uptime_ms", uv_now(broker->loop) - api->started_ms);
    json_kv_uint(out, "connections", t.connections);
    json_kv_uint(out, "channels", t.channels);
    json_kv_uint(out, "queues", t.queues);
    json_kv_uint(out, "consumers", t.consumers);
    json_kv_uint(out, "messages_ready", t.ready);
    json_kv_uint(out, "messages_unacknowledged", t.unacked);
    json_kv_uint(out, "messages_paged", t.paged);

    json_key(out, "memory");
    json_object_begin(out);
    json_kv_uint(out, "used_bytes", alarm_memory_estimate(alarm));
    json_kv_uint(out, "high_watermark_bytes", alarm->memory_high_watermark);
    json_kv_bool(out, "alarm", alarm->memory_on);
    json_object_end(out);

    json_key(out, "disk");
    json_object_begin(out);
    json_kv_uint(out, "free_bytes", alarm->disk_free_bytes);
    json_kv_uint(out, "free_limit_bytes", alarm->disk_free_limit);
    json_kv_bool(out, "alarm", alarm->disk_on);
    json_object_end(out);

    json_key(out, "alarms");
    json_array_begin(out);
    if (alarm->memory_on)
        json_string(out, "memory");
    if (alarm->disk_on)
        json_string(out, "disk");
    json_array_end(out);
    if (sees_node(user))
        write_node(out, broker);
    json_object_end(out);
}

/* ---- GET /api/queues ----------------------------------------------------
 * [{"vhost": "/", "name": "q", "durable": bool, "exclusive": bool,
 *   "auto_delete": bool, "messages": N (ready), "messages_unacknowledged": N,
 *   "consumers": N, "paged": N, "primary": NAME,
 *   "role": "primary"|"backup"|"proxy", "replica_messages": N (not primary),
 *   "dedup_ids": N (only with x-quay-dedup-window: ids remembered, a backup's
 *   in its replica; expired ones linger until the next publish),
 *   "available": bool (clustered only), "backups": [NAME...], "in_sync": [NAME...],
 *   "epoch": N, "replication_factor": N (clustered only),
 *   "policy": NAME|null (the replication policy that sets its backups)}, ...]
 * In a cluster, placement comes from the map; counts are this broker's
 * (a proxy's are what it holds for its own consumers).
 */
static void write_broker_name(struct json *out, const struct cluster_map *map, uint32_t id)
{
    const struct map_broker *b = cluster_map_broker(map, id);
    if (b)
        json_string_n(out, (const char *)b->name.ptr, b->name.len);
    else
        json_null(out);
}

/* Placement from the cluster map (every broker answers the same). */
static void write_placement(struct json *out, const struct mgmt_api *api,
                            const struct vhost *vhost, const struct queue *queue)
{
    const struct map_queue *mq =
        api->broker->cluster
            ? cluster_map_queue(cluster_node_map(api->broker->cluster), vhost->name,
                                queue->name)
            : NULL;
    if (mq == NULL) {
        /* A single broker is the primary of everything. */
        json_kv_string(out, "primary", MGMT_NODE_NAME);
        json_kv_string(out, "role", "primary");
        json_key(out, "backups");
        json_array_begin(out);
        json_array_end(out);
        json_key(out, "in_sync");
        json_array_begin(out);
        json_array_end(out);
        json_kv_uint(out, "epoch", 0);
        return;
    }
    const struct cluster_map *map = cluster_node_map(api->broker->cluster);
    json_key(out, "primary");
    write_broker_name(out, map, mq->primary_id);
    bool backup = map_queue_has_backup(mq, cluster_node_id(api->broker->cluster));
    json_kv_string(out, "role",
                   !queue_is_remote(queue) ? "primary" : backup ? "backup" : "proxy");
    if (queue_is_remote(queue)) { /* a backup's copy of the primary's messages */
        const struct replica *r = proxy_stub_replica((struct queue *)queue, false);
        json_kv_uint(out, "replica_messages", replica_count(r));
        if (queue->args.quay_dedup_window_ms > 0)
            json_kv_uint(out, "dedup_ids", replica_dedup_count(r));
    } else {
        replication_write_json(queue, out); /* serving, confirms (with backups) */
    }
    json_kv_bool(out, "available", mq->available);
    json_key(out, "backups");
    json_array_begin(out);
    for (uint8_t i = 0; i < mq->backups_count; i++)
        write_broker_name(out, map, mq->backup_ids[i]);
    json_array_end(out);
    json_key(out, "in_sync");
    json_array_begin(out);
    for (uint8_t i = 0; i < mq->backups_count; i++) {
        if (mq->in_sync_mask & (1u << i))
            write_broker_name(out, map, mq->backup_ids[i]);
    }
    json_array_end(out);
    json_kv_uint(out, "epoch", mq->epoch);
    json_kv_uint(out, "replication_factor", mq->replication_factor);
}

/* The replication policy that sets the queue's backups: null when none
 * matches, or when its own x-quay-backups (or being exclusive) decides. */
static void write_policy_name(struct json *out, const struct mgmt_api *api,
                              const struct vhost *vhost, const struct queue *queue)
{
    json_key(out, "policy");
    const struct policy *p = NULL;
    if (!queue->exclusive &&
        policy_queue_own_backups(queue->arguments.ptr, queue->arguments.len) < 0)
        p = policy_set_match(api_policies_of(api->broker), vhost->name, queue->name);
    if (p != NULL)
        json_string_n(out, p->name.ptr, p->name.len);
    else
        json_null(out);
}

static void write_queue(struct json *out, const struct mgmt_api *api, const struct vhost *vhost,
                        const struct queue *queue)
{
    json_object_begin(out);
    write_bytes(out, "vhost", vhost->name);
    write_bytes(out, "name", queue->name);
    json_kv_bool(out, "durable", queue->durable);
    json_kv_bool(out, "exclusive", queue->exclusive);
    json_kv_bool(out, "auto_delete", queue->auto_delete);
    /* A proxy's counts are its own: messages in flight to its consumers. */
    json_kv_uint(out, "messages", queue_ready_count(queue));
    json_kv_uint(out, "messages_unacknowledged", queue->unacked_count);
    json_kv_uint(out, "consumers", queue->consumers_count);
    json_kv_uint(out, "paged", queue->paged_count);
    if (!queue_is_remote(queue) && queue->args.quay_dedup_window_ms > 0)
        json_kv_uint(out, "dedup_ids", queue->dedup ? dedup_count(queue->dedup) : 0);
    write_policy_name(out, api, vhost, queue);
    write_placement(out, api, vhost, queue);
    json_object_end(out);
}

static void handle_queues(void *ctx, const struct auth_user *user, struct json *out)
{
    struct mgmt_api *api = ctx;
    json_array_begin(out);
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&api->broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        if (!mgmt_user_sees_vhost(user, vhost->name))
            continue;
        struct hmap_entry *q;
        for (uint32_t j = 0; hmap_next(&vhost->queues, &j, &q);) {
            const struct queue *queue = q->value;
            ASSERT(!queue->deleted);
            write_queue(out, api, vhost, queue);
        }
    }
    json_array_end(out);
}

/* ---- GET /api/connections -----------------------------------------------
 * [{"id": N, "peer": "127.0.0.1:50312", "user": "guest" or null,
 *   "vhost": "/" or null, "channels": N, "state": "running", "blocked": bool},
 *  ...]   (user and vhost are null until the handshake gets there)
 */
static const char *connection_state_name(const struct connection *connection)
{
    switch (connection->state) {
    case CONNECTION_STATE_HEADER:
    case CONNECTION_STATE_START_OK: return "starting";
    case CONNECTION_STATE_SECURE_OK: return "securing";
    case CONNECTION_STATE_TUNE_OK: return "tuning";
    case CONNECTION_STATE_OPEN_WAIT: return "opening";
    case CONNECTION_STATE_OPEN:
        if (connection->blocked)
            return "blocked";
        return connection->flow || flow_connection_waits(connection) ? "flow" : "running";
    case CONNECTION_STATE_CLOSING: return "closing";
    case CONNECTION_STATE_CLOSED: return "closed";
    }
    return "unknown";
}

static void handle_connections(void *ctx, const struct auth_user *user, struct json *out)
{
    struct mgmt_api *api = ctx;
    json_array_begin(out);
    list_for_each(node, &api->broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (!sees_connection(user, c))
            continue;
        json_object_begin(out);
        json_kv_uint(out, "id", c->conn.id);
        json_kv_string(out, "peer", c->conn.peer_name);
        json_key(out, "user");
        if (c->user)
            json_string(out, c->user->name);
        else
            json_null(out);
        json_key(out, "vhost");
        if (c->vhost)
            json_string_n(out, c->vhost->name.ptr, c->vhost->name.len);
        else
            json_null(out);
        json_kv_uint(out, "channels", c->channels_open);
        json_kv_string(out, "state", connection_state_name(c));
        json_kv_bool(out, "blocked", c->blocked);
        json_object_end(out);
    }
    json_array_end(out);
}

/* ---- life cycle -------------------------------------------------------- */

int mgmt_api_start(struct broker *broker, const char *address)
{
    ASSERT(broker != NULL);
    ASSERT(address != NULL);
    ASSERT(broker->mgmt == NULL);
    struct mgmt_api *api = calloc(1, sizeof *api);
    ASSERT(api != NULL);
    api->broker = broker;
    api->started_ms = uv_now(broker->loop);
    /* Owned by the broker from here on, even if listening fails: a failed
     * listen may leave a handle closing, so the memory must outlive the
     * next loop run (broker_free's). */
    broker->mgmt = api;
    http_server_guard(&api->http, admit, api, broker->config.http_allowed_hosts);
    http_server_route_view(&api->http, "/api/overview", handle_overview, api,
                           MGMT_ACCESS_MANAGEMENT);
    http_server_route_view(&api->http, "/api/queues", handle_queues, api,
                           MGMT_ACCESS_MANAGEMENT);
    http_server_route_view(&api->http, "/api/connections", handle_connections, api,
                           MGMT_ACCESS_MANAGEMENT);
    api_policies_register(&api->http, broker);
    api_users_register(&api->http, broker);
    metrics_register(&api->http, broker);
    int rc = http_server_open(&api->http, &broker->net, address);
    if (rc != 0) {
        LOG_ERROR("cannot listen for HTTP on %s: %s", address, uv_strerror(rc));
        return -1;
    }
    if (broker->config.http_tls) {
        ASSERT(broker->https_tls.ctx != NULL); /* main checks --tls-cert */
        http_server_use_tls(&api->http, &broker->https_tls);
    }
    LOG_INFO("listening for %s (management API) on %s", broker->config.http_tls ? "HTTPS" : "HTTP",
             address);
    return 0;
}

void mgmt_api_route(struct mgmt_api *api, const char *path, http_handler_fn handler,
                    void *ctx)
{
    ASSERT(api != NULL);
    http_server_route(&api->http, path, handler, ctx, MGMT_ACCESS_MONITORING);
}

void mgmt_api_stop(struct mgmt_api *api)
{
    if (api)
        http_server_close(&api->http);
}

void mgmt_api_free(struct mgmt_api *api)
{
    if (!api)
        return;
    mgmt_api_stop(api);
    http_server_free(&api->http);
    free(api);
}

void mgmt_api_route_post(struct mgmt_api *api, const char *path, http_action_fn action,
                         void *ctx)
{
    if (api != NULL)
        http_server_route_post(&api->http, path, action, ctx, MGMT_ACCESS_ADMINISTRATOR);
}
