/*
 * api_policies.c: see api_policies.h. A PUT or DELETE in a cluster is
 * submitted to the map and answered from the submit's callback; the
 * pending request is cancelled if its HTTP client goes away first.
 */
#include "mgmt/api_policies.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/broker.h"
#include "broker/durable.h"
#include "broker/policy.h"
#include "cluster/map.h"
#include "cluster/node.h"
#include "cluster/member.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api.h"
#include "mgmt/api_change.h"
#include "mgmt/api_list.h"
#include "lib/json.h"
#include "lib/json_read.h"
#include "mgmt/json_tree.h"

#define ERROR_SIZE 256

const struct policy_set *api_policies_of(const struct broker *broker)
{
    if (member_node_of(broker) != NULL)
        return &cluster_node_map(member_node_of(broker))->policies;
    return &broker->policies;
}

static void write_policy(struct json *out, const struct policy *p)
{
    json_object_begin(out);
    json_key(out, "vhost");
    json_string_n(out, p->vhost.ptr, p->vhost.len);
    json_key(out, "name");
    json_string_n(out, p->name.ptr, p->name.len);
    json_key(out, "pattern");
    json_string_n(out, p->pattern.ptr, p->pattern.len);
    json_kv_string(out, "apply-to", "queues");
    api_policy_definition_write(out, p); /* ("backups" below is quay's own) */
    json_kv_uint(out, "priority", p->priority);
    json_kv_uint(out, "backups", p->backups);
    json_object_end(out);
}

void api_policy_definition_write(struct json *out, const struct policy *p)
{
    json_key(out, "definition");
    json_object_begin(out);
    json_kv_string(out, "ha-mode", "exactly");
    json_kv_uint(out, "ha-params", (uint64_t)p->backups + 1);
    if (p->replicate != POLICY_REPLICATE_UNSET)
        json_kv_string(out, "quay-replicate", policy_replicate_name(p->replicate));
    json_object_end(out);
}

/* GET /api/policies[/{vhost}]: those of the vhosts the user sees (of the
 * one vhost), as RabbitMQ 3.10 lists them: by priority (then vhost, name)
 * unless sort= says otherwise, columns= applied, not paged (page= is
 * ignored there). */
static void answer_list(struct broker *broker, struct http_call *call,
                        const struct http_call_request *req, const struct bytes *vhost)
{
    const struct policy_set *set = api_policies_of(broker);
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    for (uint32_t i = 0; i < set->count; i++) {
        const struct policy *p = set->items[i];
        if (mgmt_user_sees_vhost(req->user, p->vhost) &&
            (vhost == NULL || bytes_equal(*vhost, p->vhost)))
            write_policy(&body, p);
    }
    json_array_end(&body);
    api_list_answer_whole(call, req, &body, "priority,vhost,name");
}

/* ---- the path and the body ---------------------------------------------- */

/* %-decodes a path segment into out (1..POLICY_NAME_SIZE_MAX bytes). */
static bool decode_segment(const char *s, size_t size, uint8_t *out, uint32_t *out_size)
{
    long n = http_percent_decode(s, size, out, POLICY_NAME_SIZE_MAX, false);
    *out_size = n > 0 ? (uint32_t)n : 0;
    return n > 0;
}

struct policy_path {
    uint8_t vhost[POLICY_NAME_SIZE_MAX];
    uint8_t name[POLICY_NAME_SIZE_MAX];
    struct bytes vhost_b, name_b;
};

/* "{vhost}/{name}", each %-encoded and not empty. */
static bool parse_path(const char *rest, size_t size, struct policy_path *out)
{
    const char *slash = memchr(rest, '/', size);
    if (slash == NULL)
        return false;
    size_t first = (size_t)(slash - rest);
    if (memchr(slash + 1, '/', size - first - 1) != NULL)
        return false;
    uint32_t vn, nn;
    if (!decode_segment(rest, first, out->vhost, &vn) ||
        !decode_segment(slash + 1, size - first - 1, out->name, &nn))
        return false;
    out->vhost_b = (struct bytes){out->vhost, vn};
    out->name_b = (struct bytes){out->name, nn};
    return true;
}

struct body {
    char pattern[JSON_READ_STRING_SIZE];
    size_t pattern_size;
    int64_t priority, backups;
    uint8_t replicate; /* enum policy_replicate */
};

/* RabbitMQ's answer to a policy whose definition has a bad value for a
 * known key (rabbit_policy's validation, as its management API words it:
 * 400, "Validation failed\n\n<<\"x\">> is not a valid ha-mode value\n"),
 * the value written as Erlang prints the term JSON decoded to. */
static void bad_value(const struct json_node *m, char *err, size_t err_size)
{
    char term[96];
    if (m->kind == JSON_KIND_NUMBER && m->is_integer)
        snprintf(term, sizeof term, "%lld", (long long)m->integer);
    else if (m->kind == JSON_KIND_BOOL)
        snprintf(term, sizeof term, m->boolean ? "true" : "false");
    else if (m->kind == JSON_KIND_STRING)
        snprintf(term, sizeof term, "<<\"%.64s\">>", m->string);
    else
        snprintf(term, sizeof term, "null");
    snprintf(err, err_size, "Validation failed\n\n%s is not a valid %s value\n", term, m->key);
}

/* quay-replicate ("all" or "transient"), a definition key or a member of
 * quay's shape: false with RabbitMQ's reason in err. */
static bool read_replicate(const struct json_node *m, struct body *b, char *err,
                           size_t err_size)
{
    int r = m->kind == JSON_KIND_STRING
                ? policy_replicate_parse((struct bytes){(const uint8_t *)m->string,
                                                        m->string_size})
                : -1;
    if (r < 0) {
        bad_value(m, err, err_size);
        return false;
    }
    b->replicate = (uint8_t)r;
    return true;
}

/* A definition in RabbitMQ's words, of what quay's policies do (replicate):
 * {"ha-mode": "exactly", "ha-params": N} is N - 1 backups, {"ha-mode":
 * "all"} as many as a queue may have; "ha-sync-mode" is accepted (a new
 * backup always catches up). -1 with why in err for anything else. */
static int64_t definition_backups(const struct json_tree *t, const struct json_node *def,
                                  char *err, size_t err_size)
{
    if (def->kind != JSON_KIND_OBJECT) {
        snprintf(err, err_size, "definition: an object expected");
        return -1;
    }
    for (const struct json_node *m = json_tree_first(t, def); m; m = json_tree_next(t, m)) {
        if (strcmp(m->key, "ha-mode") != 0 && strcmp(m->key, "ha-params") != 0 &&
            strcmp(m->key, "ha-sync-mode") != 0 && strcmp(m->key, "quay-replicate") != 0) {
            snprintf(err, err_size, "definition: '%s' is not supported (quay's policies set "
                     "replication: ha-mode, ha-params, quay-replicate)", m->key);
            return -1;
        }
    }
    const struct json_node *mode = json_tree_get(t, def, "ha-mode");
    const struct json_node *params = json_tree_get(t, def, "ha-params");
    if (mode != NULL && mode->kind == JSON_KIND_STRING && strcmp(mode->string, "all") == 0)
        return POLICY_BACKUPS_MAX;
    if (mode == NULL || mode->kind != JSON_KIND_STRING || strcmp(mode->string, "exactly") != 0 ||
        params == NULL || !params->is_integer || params->integer < 1 ||
        params->integer > POLICY_BACKUPS_MAX + 1) {
        snprintf(err, err_size, "definition: {\"ha-mode\": \"exactly\", \"ha-params\": 1..%d} "
                 "or {\"ha-mode\": \"all\"} expected", POLICY_BACKUPS_MAX + 1);
        return -1;
    }
    return params->integer - 1;
}

/* The members of a PUT's body: false with why in err. RabbitMQ's shape
 * ("pattern", "definition", "priority", "apply-to"; rabbitmqadmin adds
 * "name" and "vhost", which the path says) or quay's ("backups"). */
static bool read_members(const struct json_tree *t, const struct json_node *root, struct body *b,
                         char *err, size_t err_size)
{
    if (root->kind != JSON_KIND_OBJECT) {
        snprintf(err, err_size, "an object expected");
        return false;
    }
    b->backups = -1;
    for (const struct json_node *m = json_tree_first(t, root); m; m = json_tree_next(t, m)) {
        int64_t backups = -2;
        if (strcmp(m->key, "pattern") == 0 && m->kind == JSON_KIND_STRING &&
            m->string_size < sizeof b->pattern) {
            memcpy(b->pattern, m->string, m->string_size);
            b->pattern_size = m->string_size;
        } else if (strcmp(m->key, "priority") == 0 && m->is_integer) {
            b->priority = m->integer;
        } else if (strcmp(m->key, "backups") == 0 && m->is_integer) {
            backups = m->integer;
        } else if (strcmp(m->key, "definition") == 0) {
            const struct json_node *r = json_tree_get(t, m, "quay-replicate");
            if (r != NULL && !read_replicate(r, b, err, err_size))
                return false;
            backups = definition_backups(t, m, err, err_size);
            if (backups < 0)
                return false;
        } else if (strcmp(m->key, "quay-replicate") == 0) {
            if (!read_replicate(m, b, err, err_size))
                return false;
        } else if (strcmp(m->key, "apply-to") == 0 && m->kind == JSON_KIND_STRING &&
                   (strcmp(m->string, "queues") == 0 || strcmp(m->string, "all") == 0)) {
            /* Replication policies only ever apply to queues. */
        } else if ((strcmp(m->key, "name") == 0 || strcmp(m->key, "vhost") == 0) &&
                   m->kind == JSON_KIND_STRING) {
            /* The path's (rabbitmqadmin sends them too). */
        } else {
            snprintf(err, err_size, "unexpected member '%s' (expected \"pattern\": string, "
                     "\"definition\": {\"ha-mode\", \"ha-params\", \"quay-replicate\"} or "
                     "\"backups\": integer, \"priority\": integer, \"apply-to\": \"queues\" or "
                     "\"all\")", m->key);
            return false;
        }
        if (backups >= -1 && b->backups >= 0 && backups != b->backups) {
            snprintf(err, err_size, "\"backups\" and \"definition\" disagree");
            return false;
        }
        if (backups != -2)
            b->backups = backups;
    }
    return true;
}

/* The members read as a declaration of vhost/name: OK, or E_SYNTAX. */
static int body_decl(const struct json_tree *t, const struct json_node *obj, struct body *b,
                     struct bytes vhost, struct bytes name, struct policy_decl *d, char *err,
                     size_t err_size)
{
    memset(b, 0, sizeof *b);
    if (!read_members(t, obj, b, err, err_size))
        return E_SYNTAX;
    if (b->pattern_size == 0 || b->backups < 0) {
        snprintf(err, err_size, "\"pattern\" and \"definition\" (or \"backups\") are required");
        return E_SYNTAX;
    }
    if (b->priority < 0 || b->priority > POLICY_PRIORITY_MAX || b->backups > POLICY_BACKUPS_MAX) {
        snprintf(err, err_size, "priority must be 0..%d and backups 0..%d", POLICY_PRIORITY_MAX,
                 POLICY_BACKUPS_MAX);
        return E_SYNTAX;
    }
    *d = (struct policy_decl){vhost, name,
                              {(const uint8_t *)b->pattern, (uint32_t)b->pattern_size},
                              (uint32_t)b->priority, (uint8_t)b->backups, b->replicate};
    return policy_decl_check(d, err, err_size);
}

/* The body of a PUT as a declaration: OK, or E_SYNTAX with why in err. */
static int parse_body(const struct http_call_request *req, const struct policy_path *path,
                      struct body *b, struct policy_decl *d, char *err, size_t err_size)
{
    struct json_tree t;
    if (json_tree_parse(&t, req->body, req->body_size, err, err_size) != OK)
        return E_SYNTAX;
    int rc = body_decl(&t, json_tree_root(&t), b, path->vhost_b, path->name_b, d, err,
                       err_size);
    json_tree_free(&t);
    return rc;
}

int api_policy_read(const struct json_tree *t, const struct json_node *obj, struct bytes vhost,
                    struct bytes name, struct api_policy *out, char *err, size_t err_size)
{
    struct body *b = xmalloc(sizeof *b);
    struct policy_decl d;
    int rc = body_decl(t, obj, b, vhost, name, &d, err, err_size);
    if (rc == OK) {
        memset(out, 0, sizeof *out);
        memcpy(out->vhost, vhost.ptr, vhost.len);
        memcpy(out->name, name.ptr, name.len);
        memcpy(out->pattern, b->pattern, b->pattern_size);
        out->decl = (struct policy_decl){{out->vhost, vhost.len}, {out->name, name.len},
                                         {out->pattern, (uint32_t)b->pattern_size},
                                         d.priority, d.backups, d.replicate};
    }
    free(b);
    return rc;
}

/* ---- answers ---------------------------------------------------------------- */

static void answer_policy(struct http_call *call, int status, const struct policy *p)
{
    struct json body;
    http_body_init(&body);
    write_policy(&body, p);
    http_call_answer(call, status, &body);
}

/* RabbitMQ's answers to a change, without a body: a PUT 201 (created) or
 * 204 (replaced), a DELETE 204. */
static int put_status(bool created)
{
    return created ? 201 : 204;
}

/* ---- in a cluster: through the map ------------------------------------------- */

/* One PUT or DELETE waiting for its map command (api_change.h). */
struct pending {
    struct api_change change; /* first: the change frees the whole */
    struct broker *broker;
    bool created;
    struct policy_path path;
};

static void on_applied(struct api_change *c, const struct map_change *change)
{
    struct pending *p = (struct pending *)c;
    if (change->reply_code == REPLY_NOT_FOUND) {
        api_answer_not_found(c->call);
    } else if (change->reply_code != REPLY_SUCCESS) {
        api_answer_bad_request(c->call, change->reply_text);
    } else {
        http_call_answer_empty(c->call, change->op == MAP_OP_POLICY_DELETE
                                            ? 204 : put_status(p->created));
    }
    free(p);
}

static void submit(struct broker *broker, struct http_call *call, struct map_cmd *cmd,
                   const struct policy_path *path, bool created)
{
    if (!api_change_ready(broker, call, cmd))
        return;
    struct pending *p = xcalloc(1, sizeof *p);
    *p = (struct pending){.change = {.call = call, .applied = on_applied}, .broker = broker,
                          .created = created, .path = *path};
    /* The slices must point into the pending copy, not the caller's. */
    p->path.vhost_b.ptr = p->path.vhost;
    p->path.name_b.ptr = p->path.name;
    api_change_submit(broker, &p->change, cmd);
}

/* ---- the resource ------------------------------------------------------------- */

static bool vhost_exists(struct broker *broker, struct bytes vhost)
{
    if (member_node_of(broker) != NULL)
        return cluster_map_vhost(cluster_node_map(member_node_of(broker)), vhost) != NULL;
    return broker_vhost(broker, vhost) != NULL;
}

void api_policy_put_here(struct broker *broker, const struct policy_decl *d)
{
    policy_set_put(&broker->policies, d);
    durable_policy_put(broker, policy_set_find(&broker->policies, d->vhost, d->name));
    LOG_INFO("policy '%.*s' in vhost '%.*s': pattern '%.*s', priority %u, backups %u",
             (int)d->name.len, (const char *)d->name.ptr, (int)d->vhost.len,
             (const char *)d->vhost.ptr, (int)d->pattern.len, (const char *)d->pattern.ptr,
             d->priority, d->backups);
}

bool api_policy_delete_here(struct broker *broker, struct bytes vhost, struct bytes name)
{
    if (!policy_set_delete(&broker->policies, vhost, name))
        return false;
    durable_policy_deleted(broker, vhost, name);
    return true;
}

static void put_policy(struct broker *broker, struct http_call *call,
                       const struct http_call_request *req, const struct policy_path *path)
{
    struct body b;
    struct policy_decl d;
    char err[ERROR_SIZE];
    if (parse_body(req, path, &b, &d, err, sizeof err) != OK) {
        api_answer_bad_request(call, err);
        return;
    }
    if (!vhost_exists(broker, d.vhost)) {
        api_answer_not_found(call); /* RabbitMQ's words */
        return;
    }
    const struct policy_set *set = api_policies_of(broker);
    bool created = policy_set_find(set, d.vhost, d.name) == NULL;
    if (member_node_of(broker) != NULL) {
        struct map_cmd cmd;
        ASSERT(map_cmd_policy_put(&cmd, &d) == OK); /* a few short strings */
        submit(broker, call, &cmd, path, created);
        return;
    }
    if (created && set->count == POLICY_COUNT_MAX) {
        api_answer_bad_request(call, "too many policies");
        return;
    }
    api_policy_put_here(broker, &d);
    http_call_answer_empty(call, put_status(created));
}

static void delete_policy(struct broker *broker, struct http_call *call,
                          const struct policy_path *path)
{
    if (!vhost_exists(broker, path->vhost_b)) {
        api_answer_not_found(call); /* RabbitMQ's words */
        return;
    }
    if (member_node_of(broker) != NULL) {
        struct map_cmd cmd;
        ASSERT(map_cmd_policy_delete(&cmd, path->vhost_b, path->name_b) == OK);
        submit(broker, call, &cmd, path, false);
        return;
    }
    if (!api_policy_delete_here(broker, path->vhost_b, path->name_b)) {
        api_answer_not_found(call);
        return;
    }
    http_call_answer_empty(call, 204);
}

/* GET /api/policies or /api/policies/{vhost}: answered. */
static void handle_lists(struct broker *broker, struct http_call *call,
                         const struct http_call_request *req)
{
    if (req->method != HTTP_METHOD_GET && req->method != HTTP_METHOD_HEAD) {
        http_call_answer_error(call, 405, "only GET and HEAD here");
        return;
    }
    if (req->rest_size == 0) {
        answer_list(broker, call, req, NULL);
        return;
    }
    uint8_t vhost[POLICY_NAME_SIZE_MAX];
    uint32_t size;
    if (!decode_segment(req->rest, req->rest_size, vhost, &size) ||
        !vhost_exists(broker, (struct bytes){vhost, size})) {
        api_answer_not_found(call);
        return;
    }
    struct bytes b = {vhost, size};
    if (mgmt_user_sees_vhost_or_401(call, req->user, b))
        answer_list(broker, call, req, &b);
}

/* /api/policies[/{vhost}[/{name}]] */
static void handle_policy(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct policy_path path;
    if (memchr(req->rest, '/', req->rest_size) == NULL) {
        handle_lists(broker, call, req);
        return;
    }
    if (!parse_path(req->rest, req->rest_size, &path)) {
        api_answer_not_found(call);
        return;
    }
    /* The admission checked the tag (policymaker to change); the vhost is
     * this route's to check. RabbitMQ's words for each. */
    if (!mgmt_user_sees_vhost(req->user, path.vhost_b)) {
        bool read = req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD;
        struct http_refusal refusal = {
            .status = 401, .error = "not_authorised",
            .reason = read ? "User not authorised to access virtual host"
                           : "User not authorised to access object"};
        http_call_answer_refusal(call, &refusal);
        return;
    }
    switch (req->method) {
    case HTTP_METHOD_GET:
    case HTTP_METHOD_HEAD: {
        const struct policy *p =
            policy_set_find(api_policies_of(broker), path.vhost_b, path.name_b);
        if (p != NULL)
            answer_policy(call, 200, p);
        else
            api_answer_not_found(call);
        return;
    }
    case HTTP_METHOD_PUT: put_policy(broker, call, req, &path); return;
    case HTTP_METHOD_DELETE: delete_policy(broker, call, &path); return;
    case HTTP_METHOD_POST: break;
    }
    http_call_answer_error(call, 405, "GET, PUT or DELETE a policy");
}

void api_policies_register(struct http_server *http, struct broker *broker)
{
    http_server_route_tree(http, "/api/policies/", handle_policy, broker, MGMT_ACCESS_POLICIES);
}
