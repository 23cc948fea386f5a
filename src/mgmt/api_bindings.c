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
#include "lib/alloc.h"
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

struct bytes api_binding_dest_name(const struct bind_dest *dest)
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
    write_one(out, vhost->name, b->source->name, api_binding_dest_name(b->dest),
              b->dest->kind == BIND_DEST_QUEUE, b->routing_key, b->arguments);
}

/* The default exchange's implicit binding to queue. */
static void write_default(struct json *out, const struct vhost *vhost, const struct queue *q)
{
    write_one(out, vhost->name, BYTES_LIT(""), q->name, true, q->name, (struct bytes){NULL, 0});
}

/* ---- lists: copied out, then answered in slices ---------------------------- */

/* A binding as listed: its fields copied (offsets into the list's text),
 * so that the list can be written a slice at a time although bindings
 * and exchanges are freed when they go (no reference holds them). Every
 * queue has its default binding, so 50,000 queues list 50,000 of them.
 * Copying is what the first loop turn does (a memcpy a field); writing
 * the JSON (escaping every byte, the arguments' table) is done in slices
 * (api_list_answer_slices), so the list is what it was when asked. */
struct listed {
    size_t vhost, source, dest, routing_key, arguments; /* offsets in text */
    uint32_t vhost_len, source_len, dest_len, routing_key_len, arguments_len;
    bool to_queue;
};

struct listing {
    struct api_list_text text;     /* the copied bytes */
    struct listed *items;          /* owned */
    size_t count, cap_items;
    size_t vhost;                  /* the vhost of the items added next */
    uint32_t vhost_len;
    uint64_t began_ns;             /* for the log */
};

static void listing_vhost(struct listing *l, const struct vhost *vhost)
{
    l->vhost = api_list_keep(&l->text, vhost->name);
    l->vhost_len = vhost->name.len;
}

static struct listed *listing_add(struct listing *l)
{
    if (l->count == l->cap_items) {
        l->cap_items = 2 * l->cap_items + 64;
        l->items = xrealloc(l->items, l->cap_items * sizeof *l->items);
    }
    struct listed *it = &l->items[l->count++];
    *it = (struct listed){.vhost = l->vhost, .vhost_len = l->vhost_len};
    return it;
}

static void add_binding(struct listing *l, const struct binding *b)
{
    struct listed *it = listing_add(l);
    struct bytes dest = api_binding_dest_name(b->dest);
    it->source = api_list_keep(&l->text, b->source->name);
    it->source_len = b->source->name.len;
    it->dest = api_list_keep(&l->text, dest);
    it->dest_len = dest.len;
    it->routing_key = api_list_keep(&l->text, b->routing_key);
    it->routing_key_len = b->routing_key.len;
    it->arguments = api_list_keep(&l->text, b->arguments);
    it->arguments_len = b->arguments.len;
    it->to_queue = b->dest->kind == BIND_DEST_QUEUE;
}

/* The default exchange's implicit binding to q: its routing key is the
 * queue's name, one copy for both. */
static void add_default(struct listing *l, const struct queue *q)
{
    struct listed *it = listing_add(l);
    it->dest = it->routing_key = api_list_keep(&l->text, q->name);
    it->dest_len = it->routing_key_len = q->name.len;
    it->to_queue = true;
}

/* The vhost's bindings, the default exchange's implicit ones first. */
static void add_vhost(struct listing *l, const struct vhost *vhost)
{
    listing_vhost(l, vhost);
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->queues, &i, &e);)
        add_default(l, e->value);
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->exchanges, &i, &e);) {
        const struct exchange *x = e->value;
        list_for_each(node, &x->bindings) {
            add_binding(l, CONTAINER_OF(node, struct binding, source_link));
        }
    }
}

static bool listing_write(void *ctx, size_t i, struct json *out)
{
    const struct listing *l = ctx;
    const struct listed *it = &l->items[i];
    write_one(out, api_list_kept(&l->text, it->vhost, it->vhost_len),
              api_list_kept(&l->text, it->source, it->source_len),
              api_list_kept(&l->text, it->dest, it->dest_len), it->to_queue,
              api_list_kept(&l->text, it->routing_key, it->routing_key_len),
              api_list_kept(&l->text, it->arguments, it->arguments_len));
    return true;
}

static void listing_done(void *ctx)
{
    struct listing *l = ctx;
    free(l->text.data);
    free(l->items);
    free(l);
}

static struct listing *listing_new(void)
{
    struct listing *l = xcalloc(1, sizeof *l);
    l->began_ns = uv_hrtime();
    return l;
}

/* Answers l's bindings (takes l). They have no order of their own
 * (default_sort ""): the tables', as copied. */
static void answer_list(struct broker *broker, struct http_call *call,
                        const struct http_call_request *req, struct listing *l)
{
    struct api_list_source source = {.count = l->count, .write = listing_write,
                                     .done = listing_done, .ctx = l, .began_ns = l->began_ns};
    api_list_answer_slices(broker->loop, call, req, "", &source);
}

void api_bindings_of_queue(struct broker *broker, struct http_call *call,
                           const struct http_call_request *req, struct queue *queue)
{
    struct listing *l = listing_new();
    listing_vhost(l, queue->vhost);
    add_default(l, queue);
    list_for_each(node, &queue->as_dest.bindings_in) {
        add_binding(l, CONTAINER_OF(node, struct binding, dest_link));
    }
    answer_list(broker, call, req, l);
}

void api_bindings_of_exchange(struct broker *broker, struct http_call *call,
                              const struct http_call_request *req, struct vhost *vhost,
                              struct exchange *exchange, bool as_source)
{
    struct listing *l = listing_new();
    listing_vhost(l, vhost);
    if (as_source) {
        list_for_each(node, &exchange->bindings) {
            add_binding(l, CONTAINER_OF(node, struct binding, source_link));
        }
    } else {
        list_for_each(node, &exchange->as_dest.bindings_in) {
            add_binding(l, CONTAINER_OF(node, struct binding, dest_link));
        }
    }
    answer_list(broker, call, req, l);
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

/* The bindings from source to dest, as items of l (a list: one routing
 * key each, as many as a client binds), or the one whose properties_key
 * is key into one. */
static uint32_t write_between(struct json *one, struct listing *l, const struct between *b,
                              const struct bytes *key)
{
    uint32_t n = 0;
    if (b->source == NULL || b->dest == NULL)
        return 0;
    if (b->source_name.len == 0 && b->to_queue) {
        const struct queue *q = CONTAINER_OF(b->dest, struct queue, as_dest);
        if (key == NULL || (key->len == q->name.len && memcmp(key->ptr, q->name.ptr,
                                                             key->len) == 0)) {
            if (l != NULL)
                add_default(l, q);
            else
                write_default(one, b->vhost, q);
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
        if (l != NULL)
            add_binding(l, bd);
        else
            write_binding(one, b->vhost, bd);
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
    struct change *c = xcalloc(1, sizeof *c);
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
        struct change *c = xcalloc(1, sizeof *c);
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
        struct listing *l = listing_new();
        listing_vhost(l, b.vhost);
        write_between(NULL, l, &b, NULL);
        answer_list(broker, call, req, l);
    } else if (path->count == 6 && read) {
        struct json body;
        http_body_init(&body);
        if (write_between(&body, NULL, &b, &path->seg[5]) == 1) {
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
    if (path.count == 1 && broker_vhost(broker, path.seg[0]) == NULL) {
        api_answer_not_found(call);
        return;
    }
    struct listing *l = listing_new();
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        bool wanted = path.count == 1 ? bytes_equal(vhost->name, path.seg[0])
                                      : mgmt_user_sees_vhost(req->user, vhost->name);
        if (wanted)
            add_vhost(l, vhost);
    }
    answer_list(broker, call, req, l);
}

void api_bindings_register(struct http_server *http, struct broker *broker)
{
    http_server_route_tree(http, "/api/bindings/", handle_bindings, broker,
                           MGMT_ACCESS_MANAGEMENT);
}
