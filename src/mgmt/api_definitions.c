/*
 * api_definitions.c: see api_definitions.h. An import is checked whole
 * (check_*), turned into settings (policies, limits) and steps (one AMQP
 * method each, with its vhost), then applied: users, settings, then the
 * steps one vhost's batch at a time: each batch is one AMQP session
 * (api_amqp.h) that sends its methods pipelined and ends when every one
 * was answered. A refusal part way runs the undo steps and settings.
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
#include "broker/queue_args.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api.h"
#include "mgmt/api_amqp.h"
#include "mgmt/api_definitions_settings.h"
#include "mgmt/api_definitions_users.h"
#include "mgmt/http_guard.h"
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
    const char *section;           /* where it is in the file: "queues"[index] */
    uint32_t index;
    bool creates;                  /* makes what was not there (undone if refused) */
};

struct import {
    struct broker *broker;
    struct http_call *call;        /* NULL: quayd --definitions, logged instead */
    char user[256];                /* who the declarations log in as */
    char password[256];            /* the request's, or the internal user's */
    const char *source;            /* without a call: the file's name, for logs */
    struct http_call_request req;
    struct json_tree tree;
    struct bytes only;             /* the path's vhost (POST /api/definitions/{vhost}), or none */
    uint8_t only_text[256];
    struct definitions_users users; /* owned: the users, vhosts and permissions */
    struct definitions_users_apply users_apply;
    struct settings settings;      /* owned: the policies and limits */
    struct settings undo;          /* owned: what takes back what was applied */
    struct settings_apply settings_apply;
    struct step *steps;            /* owned */
    uint32_t count, cap;
    struct step *undo_steps;       /* owned: deletes and unbinds of what steps made */
    uint32_t undo_count;
    bool undo_on_refusal;          /* an HTTP import's (not quayd --definitions') */
    bool undoing;                  /* running undo_steps, then undo */
    int status;                    /* the refusal being answered once undone */
    char reason[ERR_SIZE + 100];
    uint32_t answered;             /* replies the batch got so far */
    const char *section;           /* the item being checked */
    uint32_t index;
    uint32_t batch_end;            /* steps [next, batch_end) are in flight */
    uint32_t next;
    uint32_t due;                  /* replies still owed by the batch */
};

static void import_free(struct import *im)
{
    OPENSSL_cleanse(im->password, sizeof im->password);
    api_definitions_users_free(&im->users);
    settings_free(&im->settings);
    settings_free(&im->undo);
    for (uint32_t i = 0; i < im->count; i++)
        free(im->steps[i].arguments);
    free(im->steps);
    free(im->undo_steps);
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
    *s = (struct step){.vhost = vhost, .method = {.id = method_id}, .ok_id = ok_id,
                       .section = im->section, .index = im->index};
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

static bool end_exists(const struct import *im, struct vhost *vhost, struct bytes vname,
                       bool queue, struct bytes name);

/* A declare as the broker would judge it (channel_declare.c): a new queue's
 * arguments, an existing one's equivalence, a reserved name. */
static bool queue_acceptable(const struct queue *q, const struct method_queue_declare *d,
                             struct bytes vname, char *err)
{
    uint16_t code;
    char text[300];
    bool ok;
    if (bytes_has_prefix(d->queue, "amq.")) {
        snprintf(text, sizeof text, "queue name '%.*s' contains reserved prefix 'amq.*'",
                 (int)d->queue.len, (const char *)d->queue.ptr);
        ok = false;
    } else if (q != NULL) {
        struct queue_decl current = {q->durable, q->auto_delete,
                                     {q->arguments.ptr, q->arguments.len}};
        struct queue_decl received = {d->durable, d->auto_delete, d->arguments};
        ok = queue_redeclare_equivalent(&current, &received, d->queue, vname, &code, text,
                                        sizeof text);
    } else {
        struct queue_args parsed;
        ok = queue_args_parse(d->arguments, d->queue, vname, &parsed, &code, text, sizeof text);
    }
    if (!ok)
        snprintf(err, ERR_SIZE, "queues: %s", text[0] ? text : "INTERNAL_ERROR");
    return ok;
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
    bool creates = q == NULL && !end_exists(im, vhost, vname, true, name);
    struct step *s = add_step(im, vname, METHOD_QUEUE_DECLARE, METHOD_QUEUE_DECLARE_OK);
    s->creates = creates;
    struct method_queue_declare *d = &s->method.queue_declare;
    d->queue = name, d->durable = durable, d->auto_delete = auto_delete;
    return encode_arguments(im, item, s, &d->arguments, err) &&
           queue_acceptable(q, d, vname, err);
}

/* As the broker judges an exchange.declare (channel_declare.c). */
static bool exchange_acceptable(const struct exchange *x, const struct method_exchange_declare *d,
                                struct bytes vname, char *err)
{
    uint16_t code;
    char text[300] = "";
    bool ok, has_alternate;
    struct bytes alternate;
    if (x != NULL) {
        struct exchange_decl current = {bytes_of_cstr(exchange_type_name(x->type)), x->durable,
                                        x->auto_delete, x->internal,
                                        {x->arguments.ptr, x->arguments.len}};
        struct exchange_decl received = {d->type, d->durable, d->auto_delete, d->internal,
                                         d->arguments};
        ok = exchange_redeclare_equivalent(&current, &received, d->exchange, vname, &code,
                                           text, sizeof text);
    } else if (bytes_has_prefix(d->exchange, "amq.")) {
        snprintf(text, sizeof text, "exchange name '%.*s' contains reserved prefix 'amq.*'",
                 (int)d->exchange.len, (const char *)d->exchange.ptr);
        ok = false;
    } else {
        ok = exchange_args_parse(d->arguments, d->exchange, vname, &has_alternate, &alternate,
                                 &code, text, sizeof text);
    }
    if (!ok)
        snprintf(err, ERR_SIZE, "exchanges: %s", text[0] ? text : "INTERNAL_ERROR");
    return ok;
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
    bool creates = x == NULL && !end_exists(im, vhost, vname, false, name);
    struct step *s = add_step(im, vname, METHOD_EXCHANGE_DECLARE,
                              METHOD_EXCHANGE_DECLARE_OK);
    s->creates = creates;
    struct method_exchange_declare *d = &s->method.exchange_declare;
    d->exchange = name, d->type = type, d->durable = durable;
    d->auto_delete = auto_delete, d->internal = internal;
    return encode_arguments(im, item, s, &d->arguments, err) &&
           exchange_acceptable(x, d, vname, err);
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

/* Whether a binding between ends that exist now is not there yet (one
 * with an end the import makes goes with that end when undone). */
static bool binding_new(struct vhost *vhost, struct bytes source, bool to_queue,
                        struct bytes dest, struct bytes rk, struct table args)
{
    struct exchange *x = vhost != NULL ? vhost_exchange(vhost, source) : NULL;
    struct queue *q = x != NULL && to_queue ? vhost_queue(vhost, dest) : NULL;
    struct exchange *to = x != NULL && !to_queue ? vhost_exchange(vhost, dest) : NULL;
    struct bind_dest *d = q != NULL ? &q->as_dest : to != NULL ? &to->as_dest : NULL;
    return d != NULL &&
           exchange_find_binding(x, d, rk, (struct bytes){args.ptr, args.len}) == NULL;
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
    s->creates = binding_new(vhost, source, to_queue, dest, rk, args);
    return true;
}

/* A policy, as PUT /api/policies takes it (api_definitions_settings.h). */
static bool check_policy(struct import *im, const struct json_node *item, char *err)
{
    return settings_check_policy(im->broker, &im->tree, item, im->only, &im->users,
                                 &im->settings, err, ERR_SIZE);
}

/* A user's "limits", as /api/user-limits sets them. */
static bool check_user_limits(struct import *im, const struct json_node *item, char *err)
{
    return settings_check_user_limits(im->broker, &im->tree, item, &im->settings, err,
                                      ERR_SIZE);
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
        else if ((im->section = key, im->index = index, check(im, c, why)))
            continue;
        /* Where: "queues[3]: ..." (the checks say "queues: ..."). */
        bool prefixed = strncmp(why, key, k) == 0 && strncmp(why + k, ": ", 2) == 0;
        snprintf(err, ERR_SIZE, "%s[%u]: %.340s", key, index, prefixed ? why + k + 2 : why);
        return false;
    }
    return true;
}

/* A "parameters" item: vhost-limits, as /api/vhost-limits sets them. */
static bool check_parameter(struct import *im, const struct json_node *item, char *err)
{
    return settings_check_parameter(im->broker, &im->tree, item, im->only, &im->users,
                                    &im->settings, err, ERR_SIZE);
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
    return (im->only.len > 0 || check_section(im, "users", check_user_limits, err)) &&
           check_section(im, "parameters", check_parameter, err) &&
           empty_section(im, "topic_permissions", err) &&
           check_section(im, "policies", check_policy, err) &&
           settings_room(im->broker, &im->settings, err, ERR_SIZE) &&
           check_section(im, "exchanges", check_exchange, err) &&
           check_section(im, "queues", check_queue, err) &&
           check_section(im, "bindings", check_binding, err);
}

/* ---- import: applying ---------------------------------------------------------------- */

/* Applying runs users (one change, all or nothing), then the policies and
 * limits (settings), then the declarations one vhost's batch at a time.
 * A refusal on the way takes back what was applied before it: the queues,
 * exchanges and bindings it made (undo_steps), then the settings and the
 * users, vhosts and permissions (undo, recorded as they were applied, run
 * from the last), and only then is the refusal answered. */

static void run_batch(struct import *im);
static void undo_settings(struct import *im);

/* The import's outcome, answered (or logged) once: the import ends. */
static void import_end(struct import *im, int status, const char *reason)
{
    if (im->call != NULL) {
        http_call_on_cancel(im->call, NULL, NULL);
        if (status == 204)
            http_call_answer_empty(im->call, 204);
        else if (status == 400)
            api_answer_bad_request(im->call, reason);
        else
            http_call_answer_error(im->call, status, reason);
    } else if (status == 204) {
        LOG_INFO("definitions from %s applied: %u declarations and bindings", im->source,
                 im->count);
    } else {
        LOG_ERROR("definitions from %s: not applied (%d): %s", im->source, status, reason);
    }
    import_free(im);
}

/* The client went away: the import goes on (to its end or undone), logged. */
static void import_cancel(void *arg)
{
    struct import *im = arg;
    im->call = NULL;
    im->source = "an HTTP import whose client left";
}

/* A refusal: remembered, then what was applied is undone. */
static void refused(struct import *im, int status, const char *reason)
{
    im->status = status;
    snprintf(im->reason, sizeof im->reason, "%s", reason != NULL ? reason : "?");
    if (!im->undo_on_refusal) {
        import_end(im, status, im->reason);
        return;
    }
    im->undoing = true; /* run_batch runs undo_steps now */
    im->next = 0;
    run_batch(im);
}

/* The method that takes back step s (made by the import). */
static void add_undo(struct import *im, const struct step *s)
{
    im->undo_steps = xrealloc(im->undo_steps, (im->undo_count + 1) * sizeof *im->undo_steps);
    struct step *u = &im->undo_steps[im->undo_count++];
    *u = (struct step){.vhost = s->vhost, .section = s->section, .index = s->index};
    const struct method *m = &s->method;
    if (m->id == METHOD_QUEUE_DECLARE) {
        u->method.id = METHOD_QUEUE_DELETE, u->ok_id = METHOD_QUEUE_DELETE_OK;
        u->method.queue_delete.queue = m->queue_declare.queue;
    } else if (m->id == METHOD_EXCHANGE_DECLARE) {
        u->method.id = METHOD_EXCHANGE_DELETE, u->ok_id = METHOD_EXCHANGE_DELETE_OK;
        u->method.exchange_delete.exchange = m->exchange_declare.exchange;
    } else if (m->id == METHOD_QUEUE_BIND) {
        u->method.id = METHOD_QUEUE_UNBIND, u->ok_id = METHOD_QUEUE_UNBIND_OK;
        u->method.queue_unbind = (struct method_queue_unbind){
            .queue = m->queue_bind.queue, .exchange = m->queue_bind.exchange,
            .routing_key = m->queue_bind.routing_key, .arguments = m->queue_bind.arguments};
    } else {
        u->method.id = METHOD_EXCHANGE_UNBIND, u->ok_id = METHOD_EXCHANGE_UNBIND_OK;
        u->method.exchange_unbind = (struct method_exchange_unbind){
            .destination = m->exchange_bind.destination, .source = m->exchange_bind.source,
            .routing_key = m->exchange_bind.routing_key, .arguments = m->exchange_bind.arguments};
    }
}

/* Steps [from, to) were made: their undoing is recorded, the latest first
 * (bindings before their ends). */
static void made(struct import *im, uint32_t from, uint32_t to)
{
    for (uint32_t i = to; i-- > from;) {
        if (im->steps[i].creates)
            add_undo(im, &im->steps[i]);
    }
}

/* A batch ended refused: the replies before the refusal were made. */
static void batch_failed(void *ctx, int status, const char *reason)
{
    struct import *im = ctx;
    uint32_t failed = im->next + im->answered;
    if (im->undoing) {
        LOG_WARN("definitions import: undoing %s[%u] refused (%d): %s",
                 im->undo_steps[failed].section, im->undo_steps[failed].index, status,
                 reason ? reason : "?");
        im->next = failed + 1; /* past it: the rest is still undone */
        run_batch(im);
        return;
    }
    made(im, im->next, failed);
    char why[sizeof im->reason];
    snprintf(why, sizeof why, "%s[%u]: %s", im->steps[failed].section,
             im->steps[failed].index, reason ? reason : "?");
    refused(im, status, why);
}

static void batch_started(struct api_op *op, struct link_channel *ch)
{
    struct import *im = api_op_data(op);
    struct step *steps = im->undoing ? im->undo_steps : im->steps;
    for (uint32_t i = im->next; i < im->batch_end; i++)
        link_send(ch, &steps[i].method);
}

static void batch_reply(struct api_op *op, const struct method *m)
{
    struct import *im = api_op_data(op);
    (void)m;
    ASSERT(im->due > 0);
    im->answered++;
    if (--im->due > 0)
        return;
    if (!im->undoing)
        made(im, im->next, im->batch_end);
    im->next = im->batch_end;
    api_op_end(op);
    run_batch(im);
}

/* The import is the batches' owner, not theirs (free_data unset). */
static const struct api_op_type batch_type = {.started = batch_started, .reply = batch_reply};

/* Steps are in section order (exchanges, queues, bindings); a batch is the
 * next steps of one vhost, each section's order kept. */
static void run_batch(struct import *im)
{
    struct step *steps = im->undoing ? im->undo_steps : im->steps;
    uint32_t count = im->undoing ? im->undo_count : im->count;
    if (im->next == count) {
        if (im->undoing)
            undo_settings(im);
        else
            import_end(im, 204, NULL);
        return;
    }
    struct bytes vhost = steps[im->next].vhost;
    /* Gather this vhost's remaining steps to the front, in order. */
    uint32_t end = im->next;
    for (uint32_t i = im->next; i < count; i++) {
        if (!bytes_equal(steps[i].vhost, vhost))
            continue;
        struct step s = steps[i];
        memmove(&steps[end + 1], &steps[end], (i - end) * sizeof s);
        steps[end++] = s;
    }
    im->batch_end = end;
    im->due = end - im->next;
    im->answered = 0;
    api_op_start_as(im->broker, im->user, im->password, vhost, &batch_type, im, batch_failed,
                    im);
}

/* The settings and users are taken back: the refusal is answered. */
static void settings_undone(void *ctx, int status, const char *reason, uint32_t done)
{
    struct import *im = ctx;
    if (status != 204)
        LOG_ERROR("definitions import: undoing stopped after %u of %u changes (%d): %s", done,
                  im->undo.count, status, reason);
    import_end(im, im->status, im->reason);
}

static void undo_settings(struct import *im)
{
    im->settings_apply = (struct settings_apply){
        .broker = im->broker, .list = &im->undo, .reverse = true, .best_effort = true,
        .done = settings_undone, .ctx = im};
    settings_apply(&im->settings_apply);
}

/* The policies and limits are in: the declarations follow. */
static void settings_applied(void *ctx, int status, const char *reason, uint32_t done)
{
    struct import *im = ctx;
    (void)done;
    if (status != 204) {
        refused(im, status, reason);
        return;
    }
    im->next = 0;
    run_batch(im);
}

/* The users, vhosts and permissions are in (or refused, and then nothing
 * is): the policies and limits follow. */
static void users_applied(void *ctx, int status, const char *reason)
{
    struct import *im = ctx;
    if (status != 204) {
        settings_free(&im->undo); /* nothing was applied */
        import_end(im, status, reason);
        return;
    }
    im->settings_apply = (struct settings_apply){
        .broker = im->broker, .list = &im->settings, .undo = &im->undo,
        .done = settings_applied, .ctx = im};
    settings_apply(&im->settings_apply);
}

/* Checked: users, vhosts and permissions first (RabbitMQ's order), then
 * the policies, limits and declarations, which may need them. */
static void import_start(struct import *im)
{
    im->users_apply = (struct definitions_users_apply){.done = users_applied, .ctx = im};
    if (im->call != NULL)
        http_call_on_cancel(im->call, import_cancel, im);
    settings_undo_users(im->broker, &im->users, &im->undo);
    api_definitions_apply_users(im->broker, &im->users, &im->users_apply);
}

/* The request's Basic credentials, which the declarations log in with. */
static bool take_credentials(struct import *im, const struct http_call_request *req)
{
    struct http_credentials c;
    if (req->authorization == NULL ||
        http_basic_parse(req->authorization, req->authorization_size, &c) != HTTP_BASIC_OK ||
        c.user_size >= sizeof im->user || c.password_size >= sizeof im->password) {
        OPENSSL_cleanse(c.decoded, sizeof c.decoded);
        return false;
    }
    memcpy(im->user, c.user, c.user_size);
    memcpy(im->password, c.password, c.password_size);
    OPENSSL_cleanse(c.decoded, sizeof c.decoded);
    return true;
}

static void import_definitions(struct broker *broker, struct http_call *call,
                               const struct http_call_request *req, const struct bytes *only)
{
    struct import *im = xcalloc(1, sizeof *im);
    *im = (struct import){.broker = broker, .call = call, .req = *req,
                          .source = "an HTTP import", .undo_on_refusal = true};
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
    if (!take_credentials(im, req)) {
        snprintf(err, sizeof err, "the import needs Basic credentials to declare with");
    } else if (json_tree_root(&im->tree)->kind != JSON_KIND_OBJECT) {
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
        snprintf(im->user, sizeof im->user, "%s", INTERNAL_USER);
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
