/*
 * api_parameters.c: see api_parameters.h. Reads the broker on the loop
 * thread; changes nothing.
 */
#include "mgmt/api_parameters.h"

#include "broker/broker.h"
#include "broker/vhost.h"
#include "lib/json.h"
#include "mgmt/api.h"
#include "mgmt/api_limits.h"
#include "mgmt/api_list.h"
#include "mgmt/api_queues.h"

/* GET (or HEAD) with at most max segments, parsed into path; else answered
 * (405 for a change, 404 for a longer path) and false. */
static bool only_get(struct http_call *call, const struct http_call_request *req,
                     struct api_path *path, uint32_t max)
{
    if (req->method != HTTP_METHOD_GET && req->method != HTTP_METHOD_HEAD) {
        http_call_answer_error(call, 405, "read only in quay");
        return false;
    }
    if (!api_path_parse(call, req, path))
        return false;
    if (path->count > max) {
        api_answer_not_found(call);
        return false;
    }
    return true;
}

/* False (answered 404 or 401) if path's segment i names a vhost that does
 * not exist or that the user may not see. */
static bool vhost_ok(struct broker *broker, struct http_call *call,
                     const struct http_call_request *req, const struct api_path *path, uint32_t i)
{
    if (path->count <= i)
        return true;
    if (broker_vhost(broker, path->seg[i]) == NULL) {
        api_answer_not_found(call);
        return false;
    }
    return mgmt_user_sees_vhost_or_401(call, req->user, path->seg[i]);
}

static void answer_empty_list(struct http_call *call, const struct http_call_request *req)
{
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    json_array_end(&body);
    api_list_answer(call, req, &body, "name");
}

static void handle_parameters(void *ctx, struct http_call *call,
                              const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!only_get(call, req, &path, 3) || !vhost_ok(broker, call, req, &path, 1))
        return;
    bool limits = path.count == 0 || api_path_is(&path, 0, "vhost-limits");
    struct bytes only = path.count >= 2 ? path.seg[1] : (struct bytes){NULL, 0};
    if (path.count == 3) {
        /* One parameter: the vhost's limits, or nothing there. */
        if (!limits || !api_path_is(&path, 2, "limits") ||
            !api_limits_vhost_has(broker, path.seg[1])) {
            api_answer_not_found(call);
            return;
        }
        struct json body;
        http_body_init(&body);
        api_limits_write_parameters_seen(&body, broker, only, req->user); /* one object */
        api_object_answer(call, req, &body);
        return;
    }
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    if (limits)
        api_limits_write_parameters_seen(&body, broker, only, req->user);
    json_array_end(&body);
    api_list_answer(call, req, &body, "vhost,name");
}

static void handle_empty(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (only_get(call, req, &path, 1) && vhost_ok(broker, call, req, &path, 0))
        answer_empty_list(call, req);
}

static void handle_global(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    (void)ctx;
    struct api_path path;
    if (!only_get(call, req, &path, 1))
        return;
    if (path.count == 1)
        api_answer_not_found(call);
    else
        answer_empty_list(call, req);
}

static void handle_cluster_name(void *ctx, struct http_call *call,
                                const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!only_get(call, req, &path, 0))
        return;
    struct json body;
    http_body_init(&body);
    json_object_begin(&body);
    json_kv_string(&body, "name", api_node_name(broker));
    json_object_end(&body);
    http_call_answer(call, 200, &body);
}

void api_parameters_register(struct http_server *http, struct broker *broker)
{
    http_server_route_tree(http, "/api/parameters/", handle_parameters, broker,
                           MGMT_ACCESS_POLICIES);
    http_server_route_tree(http, "/api/operator-policies/", handle_empty, broker,
                           MGMT_ACCESS_POLICIES);
    http_server_route_tree(http, "/api/topic-permissions/", handle_empty, broker,
                           MGMT_ACCESS_MANAGEMENT);
    http_server_route_tree(http, "/api/global-parameters/", handle_global, broker,
                           MGMT_ACCESS_POLICIES);
    http_server_route_tree(http, "/api/cluster-name/", handle_cluster_name, broker,
                           MGMT_ACCESS_MANAGEMENT);
}
