/*
 * api_limits.c: see api_limits.h. A PUT or DELETE in a cluster is
 * submitted to the map and answered from the submit's callback; the
 * pending request is cancelled if its HTTP client goes away first.
 */
#include "mgmt/api_limits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/durable.h"
#include "broker/limits.h"
#include "cluster/map.h"
#include "cluster/node.h"
#include "cluster/member.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api.h"
#include "mgmt/api_change.h"
#include "lib/json.h"
#include "lib/json_read.h"
#include "mgmt/json_tree.h"

#define ERROR_SIZE 256

const struct limit_set *api_limits_of(const struct broker *broker)
{
    if (member_node_of(broker) != NULL)
        return &cluster_node_map(member_node_of(broker))->limits;
    return &broker->limits;
}

/* One object per vhost or user with limits, in the set's order; only
 * `only` when it is set. */
static void write_list(struct json *out, const struct limit_set *set, enum limit_scope scope,
                       const struct bytes *only, const struct auth_user *user)
{
    json_array_begin(out);
    for (uint32_t i = 0; i < set->count;) {
        const struct limit *first = &set->items[i];
        uint32_t end = i;
        while (end < set->count && set->items[end].scope == first->scope &&
               bytes_equal(set->items[end].name, first->name))
            end++;
        bool shown = first->scope == scope && (only == NULL || bytes_equal(*only, first->name)) &&
                     (scope == LIMIT_SCOPE_USER || mgmt_user_sees_vhost(user, first->name));
        if (shown) {
            json_object_begin(out);
            json_key(out, limit_scope_name(scope));
            json_string_n(out, first->name.ptr, first->name.len);
            json_key(out, "value");
            json_object_begin(out);
            for (uint32_t k = i; k < end; k++) {
                json_key(out, limit_kind_name(set->items[k].kind));
                json_int(out, set->items[k].value);
            }
            json_object_end(out);
            json_object_end(out);
        }
        i = end;
    }
    json_array_end(out);
}

static void handle_vhost_list(void *ctx, const struct auth_user *user, struct json *out)
{
    write_list(out, api_limits_of(ctx), LIMIT_SCOPE_VHOST, NULL, user);
}

static void handle_user_list(void *ctx, const struct auth_user *user, struct json *out)
{
    write_list(out, api_limits_of(ctx), LIMIT_SCOPE_USER, NULL, user);
}

/* {"max-connections": N, ...}: the owner's limits, in kind order. */
static void write_value(struct json *out, const struct limit_set *set, enum limit_scope scope,
                        struct bytes name)
{
    json_object_begin(out);
    for (int k = 0; k < LIMIT_KIND_COUNT; k++) {
        const struct limit *l = limit_set_find(set, scope, name, k);
        if (l != NULL) {
            json_key(out, limit_kind_name(l->kind));
            json_int(out, l->value);
        }
    }
    json_object_end(out);
}

void api_limits_write_user(struct json *out, const struct broker *broker, struct bytes user)
{
    write_value(out, api_limits_of(broker), LIMIT_SCOPE_USER, user);
}

static void write_parameters(struct json *out, const struct broker *broker, struct bytes only,
                             bool with_vhost, const struct auth_user *user)
{
    const struct limit_set *set = api_limits_of(broker);
    for (uint32_t i = 0; i < set->count; i++) {
        const struct limit *l = &set->items[i];
        bool first = i == 0 || l->scope != set->items[i - 1].scope ||
                     !bytes_equal(l->name, set->items[i - 1].name);
        if (!first || l->scope != LIMIT_SCOPE_VHOST || (only.len && !bytes_equal(only, l->name)) ||
            !mgmt_user_sees_vhost(user, l->name))
            continue;
        json_object_begin(out);
        json_key(out, "value");
        write_value(out, set, LIMIT_SCOPE_VHOST, l->name);
        if (with_vhost) {
            json_key(out, "vhost");
            json_string_n(out, l->name.ptr, l->name.len);
        }
        json_kv_string(out, "component", "vhost-limits");
        json_kv_string(out, "name", "limits");
        json_object_end(out);
    }
}

void api_limits_write_parameters(struct json *out, const struct broker *broker,
                                 struct bytes only)
{
    write_parameters(out, broker, only, only.len == 0, NULL);
}

void api_limits_write_parameters_seen(struct json *out, const struct broker *broker,
                                      struct bytes only, const struct auth_user *user)
{
    write_parameters(out, broker, only, true, user);
}

bool api_limits_vhost_has(const struct broker *broker, struct bytes vhost)
{
    const struct limit_set *set = api_limits_of(broker);
    for (uint32_t i = 0; i < set->count; i++) {
        if (set->items[i].scope == LIMIT_SCOPE_VHOST && bytes_equal(set->items[i].name, vhost))
            return true;
    }
    return false;
}

/* ---- the path and the body ---------------------------------------------- */

/* %-decodes a path segment into out (1..LIMIT_NAME_SIZE_MAX bytes). */
static bool decode_segment(const char *s, size_t size, uint8_t *out, uint32_t *out_size)
{
    long n = http_percent_decode(s, size, out, LIMIT_NAME_SIZE_MAX, false);
    *out_size = n > 0 ? (uint32_t)n : 0;
    return n > 0;
}

struct limit_path {
    enum limit_scope scope;
    uint8_t owner[LIMIT_NAME_SIZE_MAX]; /* the vhost or the user */
    uint8_t name[LIMIT_NAME_SIZE_MAX];  /* "max-connections", ... */
    struct bytes owner_b, name_b;       /* name_b.len == 0: no name */
};

/* "{owner}" or "{owner}/{name}", each %-encoded and not empty. */
static bool parse_path(const char *rest, size_t size, struct limit_path *out)
{
    const char *slash = memchr(rest, '/', size);
    size_t first = slash ? (size_t)(slash - rest) : size;
    uint32_t on, nn = 0;
    if (!decode_segment(rest, first, out->owner, &on))
        return false;
    if (slash != NULL) {
        if (memchr(slash + 1, '/', size - first - 1) != NULL ||
            !decode_segment(slash + 1, size - first - 1, out->name, &nn))
            return false;
    }
    out->owner_b = (struct bytes){out->owner, on};
    out->name_b = (struct bytes){out->name, nn};
    return true;
}

struct body {
    bool has_value;
    int64_t value;
};

static bool on_member(void *ctx, const struct json_read_member *m, char *err, size_t err_size)
{
    struct body *b = ctx;
    if (strcmp(m->key, "value") == 0 && m->kind == JSON_READ_INT) {
        b->has_value = true;
        b->value = m->integer;
        return true;
    }
    snprintf(err, err_size, "unexpected member '%s' (expected \"value\": integer)", m->key);
    return false;
}

static int parse_body(const struct http_call_request *req, int64_t *value, char *err,
                      size_t err_size)
{
    struct body b = {0};
    if (json_read_object(req->body, req->body_size, on_member, &b, err, err_size) != OK)
        return E_SYNTAX;
    if (!b.has_value) {
        snprintf(err, err_size, "\"value\" (an integer) is required");
        return E_SYNTAX;
    }
    if (b.value > LIMIT_VALUE_MAX || b.value < -LIMIT_VALUE_MAX) {
        snprintf(err, err_size, "\"value\" must be an integer in -%d..%d (negative: no limit)",
                 LIMIT_VALUE_MAX, LIMIT_VALUE_MAX);
        return E_SYNTAX;
    }
    *value = b.value;
    return OK;
}

/* ---- in a cluster: through the map ------------------------------------------- */

static void on_applied(struct api_change *c, const struct map_change *change)
{
    if (change->reply_code == REPLY_NOT_FOUND)
        http_call_answer_error(c->call, 404, change->reply_text);
    else if (change->reply_code != REPLY_SUCCESS)
        http_call_answer_error(c->call, 400, change->reply_text);
    else
        http_call_answer_empty(c->call, 204);
    free(c);
}

/* One PUT or DELETE through the map (api_change.h). */
static void submit(struct broker *broker, struct http_call *call, struct map_cmd *cmd)
{
    if (!api_change_ready(broker, call, cmd))
        return;
    struct api_change *c = xcalloc(1, sizeof *c);
    *c = (struct api_change){.call = call, .applied = on_applied};
    api_change_submit(broker, c, cmd);
}

/* ---- the resource ------------------------------------------------------------- */

static bool owner_exists(struct broker *broker, enum limit_scope scope, struct bytes name)
{
    if (member_node_of(broker) != NULL) {
        const struct cluster_map *map = cluster_node_map(member_node_of(broker));
        return scope == LIMIT_SCOPE_VHOST ? cluster_map_vhost(map, name) != NULL
                                          : cluster_map_user(map, name) != NULL;
    }
    if (scope == LIMIT_SCOPE_VHOST)
        return broker_vhost(broker, name) != NULL;
    const struct auth_user *u = auth_find_user(&broker->auth, name);
    return u != NULL && !u->internal;
}

/* PUT (put) or DELETE of {owner}/{name}. */
static void change_limit(struct broker *broker, struct http_call *call,
                         const struct http_call_request *req, const struct limit_path *path,
                         bool put)
{
    char err[ERROR_SIZE];
    int kind = limit_kind_parse(path->scope, path->name_b);
    if (kind < 0) {
        snprintf(err, sizeof err, "unknown %s limit '%.*s' (%s)", limit_scope_name(path->scope),
                 (int)path->name_b.len, (const char *)path->name_b.ptr,
                 path->scope == LIMIT_SCOPE_VHOST ? "max-connections or max-queues"
                                                  : "max-connections or max-channels");
        http_call_answer_error(call, 400, err);
        return;
    }
    int64_t value = -1;
    if (put && parse_body(req, &value, err, sizeof err) != OK) {
        http_call_answer_error(call, 400, err);
        return;
    }
    if (!owner_exists(broker, path->scope, path->owner_b)) {
        http_call_answer_error(call, 404, path->scope == LIMIT_SCOPE_VHOST ? "no such vhost"
                                                                           : "no such user");
        return;
    }
    if (member_node_of(broker) != NULL) {
        struct map_cmd cmd;
        ASSERT(map_cmd_limit(&cmd, put, path->scope, path->owner_b, kind, value) == OK);
        submit(broker, call, &cmd);
        return;
    }
    const struct limit_set *set = &broker->limits;
    bool exists = limit_set_find(set, path->scope, path->owner_b, kind) != NULL;
    if (put && !exists && set->count == LIMIT_COUNT_MAX) {
        http_call_answer_error(call, 400, "too many limits");
        return;
    }
    if (put) {
        limit_set_put(&broker->limits, path->scope, path->owner_b, kind, value);
        durable_limit_put(broker, path->scope, path->owner_b, kind, value);
    } else if (limit_set_delete(&broker->limits, path->scope, path->owner_b, kind)) {
        durable_limit_deleted(broker, path->scope, path->owner_b, kind);
    }
    LOG_INFO("%s '%.*s': %s %s %lld", limit_scope_name(path->scope), (int)path->owner_b.len,
             (const char *)path->owner_b.ptr, limit_kind_name(kind), put ? "set to" : "cleared",
             (long long)value);
    http_call_answer_empty(call, 204);
}

static void handle(struct broker *broker, enum limit_scope scope, struct http_call *call,
                   const struct http_call_request *req)
{
    struct limit_path path = {.scope = scope};
    if (!parse_path(req->rest, req->rest_size, &path)) {
        http_call_answer_error(call, 404, scope == LIMIT_SCOPE_VHOST
                                              ? "expected /api/vhost-limits/{vhost}[/{name}]"
                                              : "expected /api/user-limits/{user}[/{name}]");
        return;
    }
    bool get = req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD;
    /* The vhost route admits management users: reading needs the vhost,
     * a change administrator (RabbitMQ's rabbit_mgmt_wm_limits and
     * rabbit_mgmt_wm_limit, their words). */
    bool admin = req->user == NULL || auth_user_has_tag(req->user, AUTH_TAG_ADMINISTRATOR);
    if (!admin && (!get || !mgmt_user_sees_vhost(req->user, path.owner_b))) {
        struct http_refusal refusal = {
            .status = 401, .error = "not_authorised",
            .reason = get ? "User not authorised to access virtual host"
                          : "Not administrator user"};
        http_call_answer_refusal(call, &refusal);
        return;
    }
    if (get && path.name_b.len == 0) {
        if (!owner_exists(broker, scope, path.owner_b)) {
            http_call_answer_error(call, 404, scope == LIMIT_SCOPE_VHOST ? "no such vhost"
                                                                         : "no such user");
            return;
        }
        struct json body;
        http_body_init(&body);
        write_list(&body, api_limits_of(broker), scope, &path.owner_b, req->user);
        http_call_answer(call, 200, &body);
        return;
    }
    bool change = req->method == HTTP_METHOD_PUT || req->method == HTTP_METHOD_DELETE;
    if (!change || path.name_b.len == 0) {
        http_call_answer_error(call, 405, "GET a vhost's or user's limits; PUT or DELETE one");
        return;
    }
    change_limit(broker, call, req, &path, req->method == HTTP_METHOD_PUT);
}

static void handle_vhost(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    handle(ctx, LIMIT_SCOPE_VHOST, call, req);
}

static void handle_user(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    handle(ctx, LIMIT_SCOPE_USER, call, req);
}

void api_limits_register(struct http_server *http, struct broker *broker)
{
    http_server_route_view(http, "/api/vhost-limits", handle_vhost_list, broker,
                           MGMT_ACCESS_MANAGEMENT);
    http_server_route_view(http, "/api/user-limits", handle_user_list, broker,
                           MGMT_ACCESS_ADMINISTRATOR);
    http_server_route_prefix(http, "/api/vhost-limits/", handle_vhost, broker,
                             MGMT_ACCESS_MANAGEMENT);
    http_server_route_prefix(http, "/api/user-limits/", handle_user, broker,
                             MGMT_ACCESS_ADMINISTRATOR);
}
