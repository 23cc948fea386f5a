/*
 * api.c: see api.h. The handlers, and the JSON shape of each answer.
 *
 * Field names follow RabbitMQ's management API where a field means the
 * same thing there, so habits, scripts and rabbitmqadmin carry over. The
 * resources RabbitMQ's tools use are in api_rabbit.h's files; this one
 * keeps the login, the rights and the overview.
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
#include "broker/login.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api_nodes.h"
#include "mgmt/api_limits.h"
#include "mgmt/api_placement.h"
#include "mgmt/api_policies.h"
#include "mgmt/api_queues.h"
#include "mgmt/api_rabbit.h"
#include "mgmt/api_users.h"
#include "mgmt/console.h"
#include "mgmt/http.h"
#include "mgmt/http_guard.h"
#include "lib/json.h"
#include "mgmt/metrics.h"


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

bool mgmt_user_sees_vhost_or_401(struct http_call *call, const struct auth_user *user,
                                 struct bytes vhost)
{
    if (mgmt_user_sees_vhost(user, vhost))
        return true;
    struct http_refusal refusal = {.status = 401, .error = "not_authorised",
                                   .reason = "User not authorised to access virtual host"};
    http_call_answer_refusal(call, &refusal);
    return false;
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

static void on_checked(void *ctx, enum auth_verdict verdict, const struct auth_user *user)
{
    (void)verdict; /* asked again: the answer is in the cache, or a refusal */
    (void)user;
    http_wait_resume(ctx);
}

static void cancel_check(void *arg)
{
    login_cancel(arg);
}

/* The password's verdict: a slow check (PBKDF2) runs off the loop
 * (broker/login.h), and AUTH_VERDICT_SLOW says it started; the request
 * is admitted again when it is done, and its success is then in the
 * cache: without it the password was wrong. */
static enum auth_verdict check_password(struct mgmt_api *api, const struct http_admission *a,
                                        struct bytes name, struct bytes password,
                                        const struct auth_user **u)
{
    enum auth_verdict verdict;
    if (*a->memo != 0) {
        struct auth_job *job;
        verdict = auth_login_begin(&api->broker->auth, name, password, a->peer_loopback, u, &job);
        auth_job_free(job);
        return verdict == AUTH_VERDICT_SLOW ? AUTH_VERDICT_REFUSED : verdict;
    }
    struct login *login = login_start(api->broker, name, password, a->peer_loopback, on_checked,
                                      a->wait, &verdict, u);
    if (login != NULL) {
        *a->memo = 1;
        http_wait_on_cancel(a->wait, cancel_check, login);
    }
    return verdict;
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
    enum auth_verdict verdict = check_password(api, a, name, password, &u);
    OPENSSL_cleanse(credentials.decoded, sizeof credentials.decoded);
    if (verdict == AUTH_VERDICT_SLOW)
        return AGAIN; /* asked again once the check is done (http.h) */
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
 *   (marks dropped because the stream paused: see net/read_batch.h), "read_share":
 *   N (bytes of a client read a loop turn, 0 = no limit), "reads_deferred": N (reads
 *   left to the next turn because a client had its share: net/conn.c)},
 *  "cluster": {the same as GET /api/cluster} (clustered only)}
 * For a user without the monitoring tag the totals count its own
 * connections and its vhosts' queues only, and journal, network and
 * cluster (the node's own data) are left out.
 */
static bool vhost_seen(const struct vhost *vhost, const void *ctx)
{
    return mgmt_user_sees_vhost(ctx, vhost->name);
}

/* The queue totals over what user sees: its vhosts' queues, unless it is
 * a monitoring user (RabbitMQ counts the same way). Kept by the broker,
 * not walked (broker_queue_totals). */
static void count_totals(struct broker *broker, const struct auth_user *user,
                         struct broker_queue_totals *t)
{
    broker_queue_totals(broker, sees_node(user) ? NULL : vhost_seen, user, t);
}

/* The client connections and their channels user sees. */
static void count_connections(struct broker *broker, const struct auth_user *user,
                              uint64_t *connections, uint64_t *channels)
{
    *connections = *channels = 0;
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (sees_connection(user, c)) {
            (*connections)++;
            *channels += c->channels_open;
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
    json_kv_uint(out, "read_share", net->read_share);
    json_kv_uint(out, "reads_deferred", net->reads_deferred);
    json_object_end(out);
    if (member_node_of(broker)) {
        /* The cluster in brief (GET /api/cluster has it all). */
        json_key(out, "cluster");
        member_cluster_json(member_of(broker), out);
    }
}

static void handle_overview(void *ctx, const struct auth_user *user, struct json *out)
{
    struct mgmt_api *api = ctx;
    struct broker *broker = api->broker;
    const struct alarm *alarm = &broker->alarm;
    struct broker_queue_totals t;
    count_totals(broker, user, &t);
    uint64_t connections, channels;
    count_connections(broker, user, &connections, &channels);
    json_object_begin(out);
    json_kv_string(out, "product", "quay");
    json_kv_string(out, "version", QUAY_VERSION);
    json_kv_string(out, "node", api_node_name(broker));
    json_kv_uint(out, "uptime_ms", uv_now(broker->loop) - api->started_ms);
    json_kv_uint(out, "connections", connections);
    json_kv_uint(out, "channels", channels);
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
    api_overview_write_rabbit(out, broker, user, &t);
    json_object_end(out);
}

/* ---- life cycle -------------------------------------------------------- */

static void service_stop(void *ctx)
{
    mgmt_api_stop(ctx);
}

static void service_free(void *ctx)
{
    mgmt_api_free(ctx);
}

struct mgmt_api *mgmt_api_of(const struct broker *broker)
{
    return broker->http.free == service_free ? broker->http.ctx : NULL;
}

int mgmt_api_start(struct broker *broker, const char *address)
{
    ASSERT(broker != NULL);
    ASSERT(address != NULL);
    ASSERT(broker->http.ctx == NULL);
    struct mgmt_api *api = xcalloc(1, sizeof *api);
    api->broker = broker;
    api->started_ms = uv_now(broker->loop);
    /* Owned by the broker from here on (a service it stops and frees in
     * its shutdown order), even if listening fails: a failed listen may
     * leave a handle closing, so the memory must outlive the next loop run
     * (broker_free's). */
    broker->http = (struct broker_service){service_stop, service_free, api};
    http_server_guard(&api->http, admit, api, broker->config.http_allowed_hosts);
    http_server_route_view(&api->http, "/api/overview", handle_overview, api,
                           MGMT_ACCESS_MANAGEMENT);
    api_rabbit_register(&api->http, broker); /* RabbitMQ's resources (api_rabbit.h) */
    api_policies_register(&api->http, broker);
    api_limits_register(&api->http, broker);
    api_users_register(&api->http, broker);
    metrics_register(&api->http, broker);
    api_placement_register(&api->http, broker);
    console_register(&api->http); /* the web console's files, at "/" */
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

uint64_t mgmt_api_uptime_ms(const struct mgmt_api *api)
{
    return uv_now(api->broker->loop) - api->started_ms;
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

const struct listener *mgmt_api_listener(const struct mgmt_api *api)
{
    return api != NULL ? &api->http.listener : NULL;
}

void mgmt_api_route_tree(struct mgmt_api *api, const char *prefix, http_prefix_fn handler,
                         void *ctx)
{
    if (api != NULL)
        http_server_route_tree(&api->http, prefix, handler, ctx, MGMT_ACCESS_ADMINISTRATOR);
}

void mgmt_api_route_post(struct mgmt_api *api, const char *path, http_action_fn action,
                         void *ctx)
{
    if (api != NULL)
        http_server_route_post(&api->http, path, action, ctx, MGMT_ACCESS_ADMINISTRATOR);
}
