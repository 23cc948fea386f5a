/*
 * api_definitions.c: see api_definitions.h. An import is checked whole
 * (check_*), turned into steps (one AMQP method each, with its vhost),
 * then run one vhost's batch at a time: each batch is one AMQP session
 * (api_amqp.h) that sends its methods pipelined and ends when every one
 * was answered.
 */
#include "mgmt/api_definitions.h"
#include "mgmt/api_definitions_export.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/exchange.h"
#include "broker/policy.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api.h"
#include "mgmt/api_amqp.h"
#include "mgmt/api_definitions_users.h"
#include "mgmt/api_exchanges.h"
#include "mgmt/api_limits.h"
#include "mgmt/api_list.h"
#include "mgmt/api_policies.h"
#include "mgmt/api_queues.h"
#include "mgmt/api_table.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

#define ERR_SIZE 400
/* The broker's own login for quayd --definitions (auth_add_internal). */
#define INTERNAL_USER "quay-internal"
#define STEP_ARGUMENTS_SIZE_MAX 65536

/* ---- import: checking ------------------------------------------------------------ */

/* One declare or bind of the import. Slices point into the import's tree
 * or the step's own arguments. */
struct step {
    struct bytes vhost;
    struct method method;
    uint32_t ok_id;
    uint8_t *arguments;            /* owned: the encoded table */
};

struct import {
    struct broker *broker;
    struct http_call *call;        /* NULL: quayd --definitions, logged instead */
    char password[64];             /* without a call: the internal user's */
    const char *source;            /* without a call: the file's name, for logs */
    struct http_call_request req;
    struct json_tree tree;
    struct bytes only;             /* the path's vhost (POST /api/definitions/{vhost}), or none */
    uint8_t only_text[256];
    struct definitions_users users; /* owned: the users, vhosts and permissions */
    struct definitions_users_apply users_apply;
    struct step *steps;            /* owned */
    uint32_t count, cap;
    uint32_t batch_end;            /* steps [next, batch_end) are in flight */
    uint32_t next;
    uint32_t due;                  /* replies still owed by the batch */
};

static void import_free(struct import *im)
{
    OPENSSL_cleanse(im->password, sizeof im->password);
    api_definitions_users_free(&im->users);
    for (uint32_t i = 0; i < im->count; i++)
        free(im->steps[i].arguments);
    free(im->steps);
    json_tree_free(&im->tree);
    free(im);
}

static struct step *add_step(struct import *im, struct bytes vhost, uint32_t method_id,
                             uint32_t ok_id)
{
    if (im->count == im->cap) {
        im->cap = im->cap ? im->cap * 2 : 64;
        im->steps = xrealloc(im->steps, im->cap * sizeof *im->steps);
    }
    struct step *s = &im->steps[im->count++];
    *s = (struct step){.vhost = vhost, .method = {.id = method_id}, .ok_id = ok_id};
    return s;
}

/* A string member as bytes (at most 255 of them, not empty unless may_be_empty). */
static bool short_member(const struct json_tree *tree, const struct json_node *item,
                         const char *key, bool may_be_empty, struct bytes *out)
{
    const struct json_node *n = json_tree_get(tree, item, key);
    if (n == NULL || n->kind != JSON_KIND_STRING || n->string_size > 255 ||
        (!may_be_empty && n->string_size == 0))
        return false;
    *out = (struct bytes){(const uint8_t *)n->string, n->string_size};
    return true;
}

/* The item's vhost: the path's, or its own "vhost", which must exist or
 * be in the definitions (then *vhost is NULL: nothing is in it yet), and
 * which the importing user may open, now or by the definitions' grant:
 * the declarations are made over AMQP as that user. */
static bool item_vhost(struct import *im, const struct json_node *item, const char *section,
                       struct bytes *name, struct vhost **vhost, char *err)
{
    *name = im->only;
    if (im->only.len == 0 && !short_member(&im->tree, item, "vhost", false, name)) {
        snprintf(err, ERR_SIZE, "%s: an item without a vhost", section);
        return false;
    }
    *vhost = broker_vhost(im->broker, *name);
    if (*vhost == NULL && !api_definitions_users_has_vhost(&im->users, *name)) {
        snprintf(err, ERR_SIZE, "%s: vhost '%.*s' neither exists nor is in the definitions",
                 section, (int)name->len, (const char *)name->ptr);
        return false;
    }
    const struct auth_user *asker = im->call != NULL ? im->req.user : NULL;
    if (asker != NULL && !auth_user_may_open(asker, *name) &&
        !api_definitions_users_grants(&im->users, asker->name, *name)) {
        snprintf(err, ERR_SIZE, "%s: the importing user '%.64s' has no permission on vhost "
                 "'%.*s', and the definitions grant none", section, asker->name,
                 (int)name->len, (const char *)name->ptr);
        return false;
    }
    if (*vhost != NULL)
        *name = (*vhost)->name;
    return true;
}

static bool encode_arguments(struct import *im, const struct json_node *item, struct step *s,
                             struct table *out, char *err)
{
    s->arguments = xmalloc(STEP_ARGUMENTS_SIZE_MAX);
    return api_table_from_json(&im->tree, json_tree_get(&im->tree, item, "arguments"),
                               s->arguments, STEP_ARGUMENTS_SIZE_MAX, out, err, ERR_SIZE) == OK;
}

static bool flags_of(struct import *im, const struct json_node *item, bool *durable,
                     bool *auto_delete, bool *internal)
{
    return json_tree_get_bool(&im->tree, item, "durable", false, durable) &&
           json_tree_get_bool(&im->tree, item, "auto_delete", false, auto_delete) &&
           json_tree_get_bool(&im->tree, item, "internal", false, internal);
}

static bool check_queue(struct import *im, const struct json_node *item, char *err)
{
    struct vhost *vhost;
    struct bytes vname, name;
    bool durable, auto_delete, internal;
    if (!item_vhost(im, item, "queues", &vname, &vhost, err))
        return false;
    if (!short_member(&im->tree, item, "name", false, &name) ||
        !flags_of(im, item, &durable, &auto_delete, &internal)) {
        snprintf(err, ERR_SIZE, "queues: an item without a name, or with durable or "
                                "auto_delete not true or false");
        return false;
    }
    const struct queue *q = vhost != NULL ? vhost_queue(vhost, name) : NULL;
    if (q != NULL && (q->durable != durable || q->auto_delete != auto_delete)) {
        snprintf(err, ERR_SIZE, "queues: '%.*s' in vhost '%.*s' exists, declared otherwise "
                                "(durable %s, auto_delete %s)", (int)name.len,
                 (const char *)name.ptr, (int)vname.len, (const char *)vname.ptr,
                 q->durable ? "true" : "false", q->auto_delete ? "true" : "false");
        return false;
    }
    struct step *s = add_step(im, vname, METHOD_QUEUE_DECLARE, METHOD_QUEUE_DECLARE_OK);
    struct method_queue_declare *d = &s->method.queue_declare;
    d->queue = name, d->durable = durable, d->auto_delete = auto_delete;
    return encode_arguments(im, item, s, &d->arguments, err);
}

static bool check_exchange(struct import *im, const struct json_node *item, char *err)
{
    struct vhost *vhost;
    struct bytes vname, name, type;
    bool durable, auto_delete, internal;
    enum exchange_type t;
    if (!item_vhost(im, item, "exchanges", &vname, &vhost, err))
        return false;
    if (!short_member(&im->tree, item, "name", false, &name) ||
        !short_member(&im->tree, item, "type", false, &type) ||
        !flags_of(im, item, &durable, &auto_delete, &internal) ||
        exchange_type_parse(type, &t) != 0) {
        snprintf(err, ERR_SIZE, "exchanges: an item without a name or a known type, or with "
                                "durable, auto_delete or internal not true or false");
        return false;
    }
    /* A new vhost will have RabbitMQ's predeclared exchanges: a default one's. */
    const struct exchange *x = vhost != NULL ? vhost_exchange(vhost, name) : NULL;
    if (x != NULL && (x->type != t || x->durable != durable || x->auto_delete != auto_delete ||
                      x->internal != internal)) {
        snprintf(err, ERR_SIZE, "exchanges: '%.*s' in vhost '%.*s' exists, declared otherwise",
                 (int)name.len, (const char *)name.ptr, (int)vname.len,
                 (const char *)vname.ptr);
        return false;
    }
    struct step *s = add_step(im, vname, METHOD_EXCHANGE_DECLARE,
                              METHOD_EXCHANGE_DECLARE_OK);
    struct method_exchange_declare *d = &s->method.exchange_declare;
    d->exchange = name, d->type = type, d->durable = durable;
    d->auto_delete = auto_delete, d->internal = internal;
    return encode_arguments(im, item, s, &d->arguments, err);
}

/* Whether the import declares (kind, name) in vhost, or the broker has it
 * (a vhost the import creates has amq.* and the default exchange). */
static bool end_exists(const struct import *im, struct vhost *vhost, struct bytes vname,
                       bool queue, struct bytes name)
{
    if (vhost != NULL ? (queue ? vhost_queue(vhost, name) != NULL
                               : vhost_exchange(vhost, name) != NULL)
                      : !queue && vhost_predeclared(name))
        return true;
    uint32_t id = queue ? METHOD_QUEUE_DECLARE : METHOD_EXCHANGE_DECLARE;
    for (uint32_t i = 0; i < im->count; i++) {
        const struct step *s = &im->steps[i];
        if (s->method.id != id || !bytes_equal(s->vhost, vname))
            continue;
        if (bytes_equal(queue ? s->method.queue_declare.queue : s->method.exchange_declare.exchange,
                        name))
            return true;
    }
    return false;
}

static bool check_binding(struct import *im, const struct json_node *item, char *err)
{
    struct vhost *vhost;
    struct bytes vname, source, dest, type, rk;
    if (!item_vhost(im, item, "bindings", &vname, &vhost, err))
        return false;
    if (!short_member(&im->tree, item, "source", false, &source) ||
        !short_member(&im->tree, item, "destination", false, &dest) ||
        !short_member(&im->tree, item, "destination_type", false, &type) ||
        !short_member(&im->tree, item, "routing_key", true, &rk) ||
        !(bytes_equal_cstr(type, "queue") || bytes_equal_cstr(type, "exchange"))) {
        snprintf(err, ERR_SIZE, "bindings: an item without a source, destination, "
                                "destination_type (queue or exchange) or routing_key");
        return false;
    }
    bool to_queue = bytes_equal_cstr(type, "queue");
    if (!end_exists(im, vhost, vname, false, source) ||
        !end_exists(im, vhost, vname, to_queue, dest)) {
        snprintf(err, ERR_SIZE, "bindings: from '%.*s' to %s '%.*s' in vhost '%.*s': an end "
                                "that neither exists nor is in the definitions",
                 (int)source.len, (const char *)source.ptr, to_queue ? "queue" : "exchange",
                 (int)dest.len, (const char *)dest.ptr, (int)vname.len,
                 (const char *)vname.ptr);
        return false;
    }
    struct step *s = to_queue ? add_step(im, vname, METHOD_QUEUE_BIND, METHOD_QUEUE_BIND_OK)
                              : add_step(im, vname, METHOD_EXCHANGE_BIND,
                                         METHOD_EXCHANGE_BIND_OK);
    struct table args;
    if (!encode_arguments(im, item, s, &args, err))
        return false;
    if (to_queue)
        s->method.queue_bind = (struct method_queue_bind){
            .queue = dest, .exchange = source, .routing_key = rk, .arguments = args};
    else
        s->method.exchange_bind = (struct method_exchange_bind){
            .destination = dest, .source = source, .routing_key = rk, .arguments = args};
    return true;
}

/* A policy is accepted only as one the broker has (RabbitMQ's classic
 * mirroring words for quay's backups, as exported): quay does not apply
 * RabbitMQ's other policy keys, and sets policies through /api/policies. */
static bool check_policy(struct import *im, const struct json_node *item, char *err)
{
    struct bytes vhost = im->only, name, pattern;
    const struct json_node *def = json_tree_get(&im->tree, item, "definition");
    const struct json_node *mode = json_tree_get(&im->tree, def, "ha-mode");
    const struct json_node *params = json_tree_get(&im->tree, def, "ha-params");
    const struct json_node *replicate = json_tree_get(&im->tree, def, "quay-replicate");
    const struct json_node *priority = json_tree_get(&im->tree, item, "priority");
    bool named = (im->only.len > 0 || short_member(&im->tree, item, "vhost", false, &vhost)) &&
                 short_member(&im->tree, item, "name", false, &name) &&
                 short_member(&im->tree, item, "pattern", true, &pattern);
    const struct policy *p = named ? policy_set_find(api_policies_of(im->broker), vhost, name)
                                   : NULL;
    bool same_replicate =
        replicate == NULL ? p == NULL || p->replicate == POLICY_REPLICATE_UNSET
                          : p != NULL && p->replicate != POLICY_REPLICATE_UNSET &&
                                replicate->kind == JSON_KIND_STRING &&
                                strcmp(replicate->string,
                                       policy_replicate_name(p->replicate)) == 0;
    if (p != NULL && bytes_equal(p->pattern, pattern) && def != NULL && same_replicate &&
        def->children_count == 2u + (replicate != NULL) && mode != NULL &&
        mode->kind == JSON_KIND_STRING &&
        strcmp(mode->string, "exactly") == 0 && params != NULL && params->is_integer &&
        params->integer == (int64_t)p->backups + 1 &&
        (priority == NULL || (priority->is_integer && priority->integer == p->priority)))
        return true;
    snprintf(err, ERR_SIZE, "policies: '%.*s' is not one this broker has; quay does not import "
                            "policies (set its replication policies with PUT /api/policies)",
             named ? (int)name.len : 1, named ? (const char *)name.ptr : "?");
    return false;
}

typedef bool (*check_fn)(struct import *im, const struct json_node *item, char *err);

static bool check_section(struct import *im, const char *key, check_fn check, char *err)
{
    const struct json_node *root = json_tree_root(&im->tree);
    const struct json_node *list = json_tree_get(&im->tree, root, key);
    if (list == NULL || list->kind == JSON_KIND_NULL)
        return true;
    if (list->kind != JSON_KIND_ARRAY) {
        snprintf(err, ERR_SIZE, "%s must be an array", key);
        return false;
    }
    uint32_t index = 0;
    for (const struct json_node *c = json_tree_first(&im->tree, list); c;
         c = json_tree_next(&im->tree, c), index++) {
        char why[ERR_SIZE];
        size_t k = strlen(key);
        if (c->kind != JSON_KIND_OBJECT)
            snprintf(why, sizeof why, "%s: not an object", key);
        else if (check(im, c, why))
            continue;
        /* Where: "queues[3]: ..." (the checks say "queues: ..."). */
        bool prefixed = strncmp(why, key, k) == 0 && strncmp(why + k, ": ", 2) == 0;
        snprintf(err, ERR_SIZE, "%s[%u]: %.340s", key, index, prefixed ? why + k + 2 : why);
        return false;
    }
    return true;
}

/* A "parameters" item: only vhost-limits the broker has (api_limits.h). */
static bool check_parameter(struct import *im, const struct json_node *item, char *err)
{
    return api_limits_check_parameter(im->broker, &im->tree, item, im->only, err, ERR_SIZE);
}

static bool empty_section(struct import *im, const char *key, char *err)
{
    const struct json_node *n = json_tree_get(&im->tree, json_tree_root(&im->tree), key);
    if (n == NULL || n->kind == JSON_KIND_NULL ||
        (n->kind == JSON_KIND_ARRAY && n->children_count == 0))
        return true;
    snprintf(err, ERR_SIZE, "%s: quay has none and cannot import them", key);
    return false;
}

/* Everything checked, the steps made: true, or false with why in err. */
static bool check_all(struct import *im, char *err)
{
    const struct json_node *root = json_tree_root(&im->tree);
    if (im->only.len == 0 &&
        !api_definitions_check_users(im->broker, &im->tree, root, &im->users, err, ERR_SIZE))
        return false;
    return check_section(im, "parameters", check_parameter, err) &&
           empty_section(im, "topic_permissions", err) &&
           check_section(im, "policies", check_policy, err) &&
           check_section(im, "exchanges", check_exchange, err) &&
           check_section(im, "queues", check_queue, err) &&
           check_section(im, "bindings", check_binding, err);
}

/* ---- import: applying ---------------------------------------------------------------- */

static void run_batch(struct import *im);

/* quayd --definitions: a batch failed (the import is freed after this). */
static void load_failed(void *ctx, int status, const char *reason)
{
    struct import *im = ctx;
    LOG_ERROR("definitions from %s: applying stopped after %u of %u steps (%d): %s",
              im->source, im->next, im->count, status, reason ? reason : "?");
}

static void batch_started(struct api_op *op, struct link_channel *ch)
{
    struct import *im = api_op_data(op);
    for (uint32_t i = im->next; i < im->batch_end; i++)
        link_send(ch, &im->steps[i].method);
}

static void batch_reply(struct api_op *op, const struct method *m)
{
    struct import *im = api_op_data(op);
    (void)m;
    ASSERT(im->due > 0);
    if (--im->due > 0)
        return;
    im->next = im->batch_end;
    api_op_end(op);
    run_batch(im);
}

static void import_free_data(void *data)
{
    import_free(data);
}

static const struct api_op_type batch_type = {
    .started = batch_started, .reply = batch_reply, .free_data = import_free_data};

/* Steps are in section order (exchanges, queues, bindings); a batch is the
 * next steps of one vhost, each section's order kept. */
static void run_batch(struct import *im)
{
    if (im->next == im->count) {
        if (im->call != NULL)
            http_call_answer_empty(im->call, 204);
        else
            LOG_INFO("definitions from %s applied: %u declarations and bindings", im->source,
                     im->count);
        import_free(im);
        return;
    }
    struct bytes vhost = im->steps[im->next].vhost;
    /* Gather this vhost's remaining steps to the front, in order. */
    uint32_t end = im->next;
    for (uint32_t i = im->next; i < im->count; i++) {
        if (!bytes_equal(im->steps[i].vhost, vhost))
            continue;
        struct step s = im->steps[i];
        memmove(&im->steps[end + 1], &im->steps[end], (i - end) * sizeof s);
        im->steps[end++] = s;
    }
    im->batch_end = end;
    im->due = end - im->next;
    if (im->call != NULL)
        api_op_start(im->broker, im->call, &im->req, vhost, false, &batch_type, im);
    else
        api_op_start_as(im->broker, INTERNAL_USER, im->password, vhost, &batch_type, im,
                        load_failed, im);
}

/* The users, vhosts and permissions are in (or refused, and then nothing
 * is): the declarations follow. */
static void users_applied(void *ctx, int status, const char *reason)
{
    struct import *im = ctx;
    if (im->call != NULL)
        http_call_on_cancel(im->call, NULL, NULL);
    if (status == 204) {
        run_batch(im);
        return;
    }
    if (im->call == NULL)
        LOG_ERROR("definitions from %s: users, vhosts and permissions not applied (%d): %s",
                  im->source, status, reason);
    else if (status == 400)
        api_answer_bad_request(im->call, reason);
    else
        http_call_answer_error(im->call, status, reason);
    import_free(im);
}

static void import_cancel(void *arg)
{
    struct import *im = arg;
    api_definitions_apply_users_cancel(&im->users_apply);
    import_free(im);
}

/* Checked: users, vhosts and permissions first (RabbitMQ's order), then
 * the declarations, which may need them. */
static void import_start(struct import *im)
{
    im->users_apply = (struct definitions_users_apply){.done = users_applied, .ctx = im};
    if (im->call != NULL)
        http_call_on_cancel(im->call, import_cancel, im);
    api_definitions_apply_users(im->broker, &im->users, &im->users_apply);
}

static void import_definitions(struct broker *broker, struct http_call *call,
                               const struct http_call_request *req, const struct bytes *only)
{
    struct import *im = xcalloc(1, sizeof *im);
    *im = (struct import){.broker = broker, .call = call, .req = *req};
    if (only != NULL) {
        memcpy(im->only_text, only->ptr, only->len);
        im->only = (struct bytes){im->only_text, only->len};
    }
    char err[ERR_SIZE];
    if (json_tree_parse(&im->tree, req->body, req->body_size, err, sizeof err) != OK) {
        free(im);
        api_answer_bad_request(call, err);
        return;
    }
    if (json_tree_root(&im->tree)->kind != JSON_KIND_OBJECT) {
        snprintf(err, sizeof err, "definitions must be a JSON object");
    } else if (check_all(im, err)) {
        import_start(im);
        return;
    }
    import_free(im);
    api_answer_bad_request(call, err);
}

static void handle_definitions(void *ctx, struct http_call *call,
                               const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    if (path.count > 1) {
        api_answer_not_found(call);
        return;
    }
    struct vhost *vhost = NULL;
    if (path.count == 1 && (vhost = api_vhost_or_404(broker, call, path.seg[0])) == NULL)
        return;
    if (req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD)
        api_definitions_export(broker, call, vhost);
    else if (req->method == HTTP_METHOD_POST)
        import_definitions(broker, call, req, path.count == 1 ? &vhost->name : NULL);
    else
        http_call_answer_error(call, 405, "Method Not Allowed");
}

int api_definitions_load(struct broker *broker, const char *source, const char *text,
                         size_t size, char *err, size_t err_size)
{
    ASSERT(err_size >= ERR_SIZE);
    struct import *im = xcalloc(1, sizeof *im);
    *im = (struct import){.broker = broker, .source = source};
    if (json_tree_parse(&im->tree, text, size, err, err_size) != OK) {
        free(im);
        return -1;
    }
    if (json_tree_root(&im->tree)->kind != JSON_KIND_OBJECT) {
        snprintf(err, err_size, "definitions must be a JSON object");
    } else if (check_all(im, err)) {
        auth_add_internal(&broker->auth, INTERNAL_USER, im->password, sizeof im->password);
        LOG_INFO("definitions from %s: checked, %u users, %u vhosts, %u permissions, %u "
                 "declarations and bindings to apply", source, im->users.users_count,
                 im->users.vhosts_count, im->users.permissions_count, im->count);
        import_start(im);
        return 0;
    }
    import_free(im);
    return -1;
}

void api_definitions_register(struct http_server *http, struct broker *broker)
{
    /* Definitions hold every user's password hash: administrators only, as
     * in RabbitMQ. */
    http_server_route_tree(http, "/api/definitions/", handle_definitions, broker,
                           MGMT_ACCESS_ADMINISTRATOR);
}
