/*
 * api_bindings.c: see api_bindings.h.
 */
#include "mgmt/api_bindings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/broker.h"
#include "broker/exchange.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "mgmt/api.h"
#include "mgmt/api_amqp.h"
#include "mgmt/api_list.h"
#include "mgmt/api_queues.h"
#include "mgmt/api_table.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

#define PROPERTIES_KEY_SIZE_MAX (255 + 1 + 16 + 1)
#define API_ARGUMENTS_SIZE_MAX 65536

/* FNV-1a over the encoded arguments: the same on every broker and after
 * a restart (lib/hash.h's key is random per process). */
static uint64_t arguments_hash(struct bytes arguments)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < arguments.len; i++)
        h = (h ^ arguments.ptr[i]) * 0x100000001b3ull;
    return h;
}

static void properties_key(struct bytes routing_key, struct bytes arguments, char *out,
                           size_t size)
{
    if (arguments.len == 0 && routing_key.len == 0)
        snprintf(out, size, "~");
    else if (arguments.len == 0)
        snprintf(out, size, "%.*s", (int)routing_key.len, (const char *)routing_key.ptr);
    else
        snprintf(out, size, "%.*s~%016llx", (int)routing_key.len, (const char *)routing_key.ptr,
                 (unsigned long long)arguments_hash(arguments));
}

static struct bytes dest_name(const struct bind_dest *dest)
{
    if (dest->kind == BIND_DEST_QUEUE)
        return CONTAINER_OF(dest, struct queue, as_dest)->name;
    return CONTAINER_OF(dest, struct exchange, as_dest)->name;
}

static void write_one(struct json *out, struct bytes vhost, struct bytes source,
                      struct bytes destination, bool to_queue, struct bytes routing_key,
                      struct bytes arguments)
{
    json_object_begin(out);
    json_key(out, "source");
    json_string_n(out, source.ptr, source.len);
    json_key(out, "vhost");
    json_string_n(out, vhost.ptr, vhost.len);
    json_key(out, "destination");
    json_string_n(out, destination.ptr, destination.len);
    json_kv_string(out, "destination_type", to_queue ? "queue" : "exchange");
    json_key(out, "routing_key");
    json_string_n(out, routing_key.ptr, routing_key.len);
    json_key(out, "arguments");
    api_table_write(out, (struct table){arguments.ptr, arguments.len});
    char key[PROPERTIES_KEY_SIZE_MAX];
    properties_key(routing_key, arguments, key, sizeof key);
    json_kv_string(out, "properties_key", key);
    json_object_end(out);
}

static void write_binding(struct json *out, const struct vhost *vhost, const struct binding *b)
{
    write_one(out, vhost->name, b->source->name, dest_name(b->dest),
              b->dest->kind == BIND_DEST_QUEUE, b->routing_key, b->arguments);
}

/* The default exchange's implicit binding to queue. */
static void write_default(struct json *out, const struct vhost *vhost, const struct queue *q)
{
    write_one(out, vhost->name, BYTES_LIT(""), q->name, true, q->name, (struct bytes){NULL, 0});
}

void api_bindings_write_vhost(struct json *out, const struct vhost *vhost, bool with_defaults)
{
    struct hmap_entry *e;
    if (with_defaults) {
        for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->queues, &i, &e);)
            write_default(out, vhost, e->value);
    }
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->exchanges, &i, &e);) {
        const struct exchange *x = e->value;
        list_for_each(node, &x->bindings) {
            write_binding(out, vhost, CONTAINER_OF(node, struct binding, source_link));
        }
    }
}

void api_bindings_write_definitions(struct json *out, const struct vhost *vhost, bool alone)
{
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->exchanges, &i, &e);) {
        const struct exchange *x = e->value;
        list_for_each(node, &x->bindings) {
            const struct binding *b = CONTAINER_OF(node, struct binding, source_link);
            struct bytes dest = dest_name(b->dest);
            json_object_begin(out);
            json_key(out, "source");
            json_string_n(out, x->name.ptr, x->name.len);
            if (!alone) {
                json_key(out, "vhost");
                json_string_n(out, vhost->name.ptr, vhost->name.len);
            }
            json_key(out, "destination");
            json_string_n(out, dest.ptr, dest.len);
            json_kv_string(out, "destination_type",
                           b->dest->kind == BIND_DEST_QUEUE ? "queue" : "exchange");
            json_key(out, "routing_key");
            json_string_n(out, b->routing_key.ptr, b->routing_key.len);
            json_key(out, "arguments");
            api_table_write(out, (struct table){b->arguments.ptr, b->arguments.len});
            json_object_end(out);
        }
    }
}

static void answer_list(struct http_call *call, const struct http_call_request *req,
                        struct json *body)
{
    json_array_end(body);
    api_list_answer(call, req, body, "");
}

void api_bindings_of_queue(struct broker *broker, struct http_call *call,
                           const struct http_call_request *req, struct queue *queue)
{
    (void)broker;
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    write_default(&body, queue->vhost, queue);
    list_for_each(node, &queue->as_dest.bindings_in) {
        write_binding(&body, queue->vhost, CONTAINER_OF(node, struct binding, dest_link));
    }
    answer_list(call, req, &body);
}

void api_bindings_of_exchange(struct broker *broker, struct http_call *call,
                              const struct http_call_request *req, struct vhost *vhost,
                              struct exchange *exchange, bool as_source)
{
    (void)broker;
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    if (as_source) {
        list_for_each(node, &exchange->bindings) {
            write_binding(&body, vhost, CONTAINER_OF(node, struct binding, source_link));
        }
    } else {
        list_for_each(node, &exchange->as_dest.bindings_in) {
            write_binding(&body, vhost, CONTAINER_OF(node, struct binding, dest_link));
        }
    }
    answer_list(call, req, &body);
}

/* ---- the tree ------------------------------------------------------------------ */

/* {vhost}/e/{src}/{q|e}/{dst}[/{properties_key}] */
struct between {
    struct vhost *vhost;
    struct exchange *source;       /* NULL: unknown */
    struct bind_dest *dest;        /* NULL: unknown */
    bool to_queue;
    struct bytes source_name, dest_name;
};

static bool parse_between(struct broker *broker, const struct api_path *path,
                          struct between *b)
{
    if (path->count < 5 || path->count > 6 || !api_path_is(path, 1, "e") ||
        !(api_path_is(path, 3, "q") || api_path_is(path, 3, "e")))
        return false;
    b->vhost = broker_vhost(broker, path->seg[0]);
    if (b->vhost == NULL)
        return false;
    b->to_queue = api_path_is(path, 3, "q");
    b->source_name = path->seg[2];
    b->dest_name = path->seg[4];
    b->source = vhost_exchange(b->vhost, b->source_name);
    if (b->to_queue) {
        struct queue *q = vhost_queue(b->vhost, b->dest_name);
        b->dest = q ? &q->as_dest : NULL;
    } else {
        struct exchange *x = vhost_exchange(b->vhost, b->dest_name);
        b->dest = x ? &x->as_dest : NULL;
    }
    return true;
}

/* The bindings from source to dest, each (if key) only the one whose
 * properties_key is key. */
static uint32_t write_between(struct json *out, const struct between *b, const struct bytes *key)
{
    uint32_t n = 0;
    if (b->source == NULL || b->dest == NULL)
        return 0;
    if (b->source_name.len == 0 && b->to_queue) {
        const struct queue *q = CONTAINER_OF(b->dest, struct queue, as_dest);
        if (key == NULL || (key->len == q->name.len && memcmp(key->ptr, q->name.ptr,
                                                             key->len) == 0)) {
            write_default(out, b->vhost, q);
            n++;
        }
        return n;
    }
    list_for_each(node, &b->source->bindings) {
        const struct binding *bd = CONTAINER_OF(node, struct binding, source_link);
        if (bd->dest != b->dest)
            continue;
        char pk[PROPERTIES_KEY_SIZE_MAX];
        properties_key(bd->routing_key, bd->arguments, pk, sizeof pk);
        if (key != NULL && (strlen(pk) != key->len || memcmp(pk, key->ptr, key->len) != 0))
            continue;
        write_binding(out, b->vhost, bd);
        n++;
    }
    return n;
}

/* One bind or unbind, over AMQP. */
struct change {
    struct api_change head;        /* first: api_change_type's */
    uint8_t source[256], dest[256], routing_key[256];
    uint8_t arguments[API_ARGUMENTS_SIZE_MAX];
};

/* Fills the method of c for a bind (bind) or unbind of rk/args. */
static void set_method(struct change *c, const struct between *b, bool bind, struct bytes rk,
                       struct table args)
{
    memcpy(c->source, b->source_name.ptr, b->source_name.len);
    memcpy(c->dest, b->dest_name.ptr, b->dest_name.len);
    memcpy(c->routing_key, rk.ptr, rk.len);
    struct bytes source = {c->source, b->source_name.len};
    struct bytes dest = {c->dest, b->dest_name.len};
    struct bytes key = {c->routing_key, rk.len};
    if (b->to_queue && bind) {
        c->head.method.id = METHOD_QUEUE_BIND, c->head.ok_id = METHOD_QUEUE_BIND_OK;
        c->head.method.queue_bind = (struct method_queue_bind){
            .queue = dest, .exchange = source, .routing_key = key, .arguments = args};
    } else if (b->to_queue) {
        c->head.method.id = METHOD_QUEUE_UNBIND, c->head.ok_id = METHOD_QUEUE_UNBIND_OK;
        c->head.method.queue_unbind = (struct method_queue_unbind){
            .queue = dest, .exchange = source, .routing_key = key, .arguments = args};
    } else if (bind) {
        c->head.method.id = METHOD_EXCHANGE_BIND, c->head.ok_id = METHOD_EXCHANGE_BIND_OK;
        c->head.method.exchange_bind = (struct method_exchange_bind){
            .destination = dest, .source = source, .routing_key = key, .arguments = args};
    } else {
        c->head.method.id = METHOD_EXCHANGE_UNBIND, c->head.ok_id = METHOD_EXCHANGE_UNBIND_OK;
        c->head.method.exchange_unbind = (struct method_exchange_unbind){
            .destination = dest, .source = source, .routing_key = key, .arguments = args};
    }
}

static void bind_one(struct broker *broker, struct http_call *call,
                 const struct http_call_request *req, const struct between *b)
{
    struct json_tree tree;
    if (!api_body_parse(call, req, &tree))
        return;
    const struct json_node *root = json_tree_root(&tree);
    const struct json_node *rk = json_tree_get(&tree, root, "routing_key");
    struct change *c = calloc(1, sizeof *c);
    ASSERT(c != NULL);
    char err[200] = "";
    struct table args;
    if (rk != NULL && (rk->kind != JSON_KIND_STRING || rk->string_size > 255))
        snprintf(err, sizeof err, "routing_key must be a string of at most 255 bytes");
    else
        api_table_from_json(&tree, json_tree_get(&tree, root, "arguments"), c->arguments,
                            sizeof c->arguments, &args, err, sizeof err);
    if (err[0] == '\0') {
        struct bytes key = rk ? (struct bytes){(const uint8_t *)rk->string, rk->string_size}
                              : (struct bytes){NULL, 0};
        set_method(c, b, true, key, args);
        c->head.status = 201;
    }
    json_tree_free(&tree);
    if (err[0] != '\0') {
        free(c);
        api_answer_bad_request(call, err);
        return;
    }
    api_op_start(broker, call, req, b->vhost->name, false, &api_change_type, c);
}

static void unbind_one(struct broker *broker, struct http_call *call,
                   const struct http_call_request *req, const struct between *b,
                   struct bytes key)
{
    list_for_each(node, &b->source->bindings) {
        const struct binding *bd = CONTAINER_OF(node, struct binding, source_link);
        char pk[PROPERTIES_KEY_SIZE_MAX];
        properties_key(bd->routing_key, bd->arguments, pk, sizeof pk);
        if (bd->dest != b->dest || strlen(pk) != key.len || memcmp(pk, key.ptr, key.len) != 0)
            continue;
        struct change *c = calloc(1, sizeof *c);
        ASSERT(c != NULL);
        ASSERT(bd->arguments.len <= sizeof c->arguments);
        memcpy(c->arguments, bd->arguments.ptr, bd->arguments.len);
        set_method(c, b, false, bd->routing_key,
                   (struct table){c->arguments, bd->arguments.len});
        c->head.status = 204;
        api_op_start(broker, call, req, b->vhost->name, false, &api_change_type, c);
        return;
    }
    api_answer_not_found(call);
}

static void handle_between(struct broker *broker, struct http_call *call,
                           const struct http_call_request *req, const struct api_path *path)
{
    struct between b;
    if (!parse_between(broker, path, &b)) {
        api_answer_not_found(call);
        return;
    }
    enum http_method m = req->method;
    bool read = m == HTTP_METHOD_GET || m == HTTP_METHOD_HEAD;
    if (path->count == 5 && m == HTTP_METHOD_POST) {
        bind_one(broker, call, req, &b);
    } else if (b.source == NULL || b.dest == NULL) {
        api_answer_not_found(call);
    } else if (path->count == 5 && read) {
        struct json body;
        http_body_init(&body);
        json_array_begin(&body);
        write_between(&body, &b, NULL);
        answer_list(call, req, &body);
    } else if (path->count == 6 && read) {
        struct json body;
        http_body_init(&body);
        if (write_between(&body, &b, &path->seg[5]) == 1) {
            http_call_answer(call, 200, &body);
        } else {
            json_free(&body);
            api_answer_not_found(call);
        }
    } else if (path->count == 6 && m == HTTP_METHOD_DELETE) {
        unbind_one(broker, call, req, &b, path->seg[5]);
    } else {
        http_call_answer_error(call, 405, "Method Not Allowed");
    }
}

static void handle_bindings(void *ctx, struct http_call *call,
                            const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    bool read = req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD;
    if (path.count >= 1 && !mgmt_user_sees_vhost_or_401(call, req->user, path.seg[0]))
        return;
    if (path.count >= 2) {
        handle_between(broker, call, req, &path);
        return;
    }
    if (!read) {
        http_call_answer_error(call, 405, "Method Not Allowed");
        return;
    }
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        bool wanted = path.count == 1 ? bytes_equal(vhost->name, path.seg[0])
                                      : mgmt_user_sees_vhost(req->user, vhost->name);
        if (wanted)
            api_bindings_write_vhost(&body, vhost, true);
    }
    if (path.count == 1 && broker_vhost(broker, path.seg[0]) == NULL) {
        json_free(&body);
        api_answer_not_found(call);
        return;
    }
    answer_list(call, req, &body);
}

void api_bindings_register(struct http_server *http, struct broker *broker)
{
    http_server_route_tree(http, "/api/bindings/", handle_bindings, broker,
                           MGMT_ACCESS_MANAGEMENT);
}
