/*
 * api_exchanges.c: see api_exchanges.h.
 */
#include "mgmt/api_exchanges.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "broker/broker.h"
#include "broker/exchange.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "mgmt/api.h"
#include "mgmt/api_amqp.h"
#include "mgmt/api_bindings.h"
#include "mgmt/api_list.h"
#include "mgmt/api_message.h"
#include "mgmt/api_queues.h"
#include "mgmt/api_table.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

#define API_ARGUMENTS_SIZE_MAX 65536

/* An exchange's fields, as listed and shown. */
struct fields {
    struct bytes vhost, name, arguments;
    enum exchange_type type;
    bool durable, auto_delete, internal;
};

static void write_fields(struct json *out, const struct fields *f)
{
    json_object_begin(out);
    json_key(out, "name");
    json_string_n(out, f->name.ptr, f->name.len);
    json_key(out, "vhost");
    json_string_n(out, f->vhost.ptr, f->vhost.len);
    json_kv_string(out, "type", exchange_type_name(f->type));
    json_kv_bool(out, "durable", f->durable);
    json_kv_bool(out, "auto_delete", f->auto_delete);
    json_kv_bool(out, "internal", f->internal);
    json_key(out, "arguments");
    api_table_write(out, (struct table){f->arguments.ptr, f->arguments.len});
    json_object_end(out);
}

void api_exchange_write(struct json *out, const struct vhost *vhost, const struct exchange *x)
{
    struct fields f = {vhost->name, x->name, x->arguments, x->type, x->durable,
                       x->auto_delete, x->internal};
    write_fields(out, &f);
}

/* ---- the list: copied out, then answered in slices ---------------------------- */

/* A client may declare any number of exchanges, freed when deleted (no
 * reference holds one): the list copies each one's fields (offsets into
 * its text) in the request's turn, then writes, sorts and answers them in
 * slices (api_list_answer_slices), as they were when asked. */
struct listed {
    size_t vhost, name, arguments; /* offsets in text */
    uint32_t vhost_len, name_len, arguments_len;
    enum exchange_type type;
    bool durable, auto_delete, internal;
};

struct listing {
    struct api_list_text text;     /* the copied bytes */
    struct listed *items;          /* owned */
    size_t count;
};

static void add_vhost(struct listing *l, const struct vhost *vhost)
{
    size_t vhost_at = api_list_keep(&l->text, vhost->name);
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->exchanges, &i, &e);) {
        const struct exchange *x = e->value;
        struct listed *it = &l->items[l->count++];
        *it = (struct listed){.vhost = vhost_at, .vhost_len = vhost->name.len,
                              .type = x->type, .durable = x->durable,
                              .auto_delete = x->auto_delete, .internal = x->internal};
        it->name = api_list_keep(&l->text, x->name);
        it->name_len = x->name.len;
        it->arguments = api_list_keep(&l->text, x->arguments);
        it->arguments_len = x->arguments.len;
    }
}

static bool listing_write(void *ctx, size_t i, struct json *out)
{
    const struct listing *l = ctx;
    const struct listed *it = &l->items[i];
    struct fields f = {api_list_kept(&l->text, it->vhost, it->vhost_len),
                       api_list_kept(&l->text, it->name, it->name_len),
                       api_list_kept(&l->text, it->arguments, it->arguments_len), it->type,
                       it->durable, it->auto_delete, it->internal};
    write_fields(out, &f);
    return true;
}

static int compare_bytes(struct bytes a, struct bytes b)
{
    size_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    return c ? c : (a.len > b.len) - (a.len < b.len);
}

/* By vhost, then name: the default order "vhost,name", as api_list.c
 * compares the two strings. */
static int listing_compare(void *ctx, size_t x, size_t y)
{
    const struct listing *l = ctx;
    const struct listed *a = &l->items[x], *b = &l->items[y];
    int c = compare_bytes(api_list_kept(&l->text, a->vhost, a->vhost_len),
                          api_list_kept(&l->text, b->vhost, b->vhost_len));
    return c ? c : compare_bytes(api_list_kept(&l->text, a->name, a->name_len),
                                 api_list_kept(&l->text, b->name, b->name_len));
}

static void listing_done(void *ctx)
{
    struct listing *l = ctx;
    free(l->text.data);
    free(l->items);
    free(l);
}

static void list_exchanges(struct broker *broker, struct http_call *call,
                           const struct http_call_request *req, const struct bytes *only)
{
    struct vhost *one = NULL;
    if (only != NULL && (one = api_vhost_or_404(broker, call, *only)) == NULL)
        return;
    uint64_t began_ns = uv_hrtime();
    size_t room = 0;
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);)
        room += ((const struct vhost *)v->value)->exchanges.count;
    struct listing *l = xcalloc(1, sizeof *l);
    l->items = xmalloc((room + 1) * sizeof *l->items);
    if (one != NULL) {
        add_vhost(l, one);
    } else {
        for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
            const struct vhost *vhost = v->value;
            if (mgmt_user_sees_vhost(req->user, vhost->name))
                add_vhost(l, vhost);
        }
    }
    struct api_list_source source = {.count = l->count, .write = listing_write,
                                     .compare = listing_compare, .done = listing_done,
                                     .ctx = l, .began_ns = began_ns};
    api_list_answer_slices(broker->loop, call, req, "vhost,name", &source);
}

/* One declare or delete, over AMQP. */
struct change {
    struct api_change head;        /* first: api_change_type's */
    uint8_t name[256], type[256];
    uint8_t arguments[API_ARGUMENTS_SIZE_MAX];
};

/* The declare's fields from the body: false with why in err. */
static bool declare_parse(const struct json_tree *tree, struct change *c,
                          struct method_exchange_declare *d, char *err, size_t err_size)
{
    const struct json_node *root = json_tree_root(tree);
    const struct json_node *type = json_tree_get(tree, root, "type");
    if (type != NULL && (type->kind != JSON_KIND_STRING || type->string_size > 255)) {
        snprintf(err, err_size, "type must be a string");
        return false;
    }
    struct bytes t = type ? (struct bytes){(const uint8_t *)type->string, type->string_size}
                          : BYTES_LIT("direct");
    memcpy(c->type, t.ptr, t.len);
    d->type = (struct bytes){c->type, t.len};
    if (!json_tree_get_bool(tree, root, "durable", false, &d->durable) ||
        !json_tree_get_bool(tree, root, "auto_delete", false, &d->auto_delete) ||
        !json_tree_get_bool(tree, root, "internal", false, &d->internal)) {
        snprintf(err, err_size, "durable, auto_delete and internal must be true or false");
        return false;
    }
    return api_table_from_json(tree, json_tree_get(tree, root, "arguments"), c->arguments,
                               sizeof c->arguments, &d->arguments, err, err_size) == OK;
}

static void declare_exchange(struct broker *broker, struct http_call *call,
                             const struct http_call_request *req, struct vhost *vhost,
                             struct bytes name)
{
    struct json_tree tree;
    if (!api_body_parse(call, req, &tree))
        return;
    struct change *c = xcalloc(1, sizeof *c);
    struct method_exchange_declare *d = &c->head.method.exchange_declare;
    char err[200];
    bool ok = declare_parse(&tree, c, d, err, sizeof err);
    json_tree_free(&tree);
    if (!ok) {
        free(c);
        api_answer_bad_request(call, err);
        return;
    }
    enum exchange_type known;
    if (exchange_type_parse(d->type, &known) != 0) {
        snprintf(err, sizeof err, "unknown exchange type '%.*s'", (int)d->type.len,
                 (const char *)d->type.ptr);
        free(c);
        api_answer_bad_request(call, err);
        return;
    }
    memcpy(c->name, name.ptr, name.len);
    d->exchange = (struct bytes){c->name, name.len};
    c->head.method.id = METHOD_EXCHANGE_DECLARE;
    c->head.ok_id = METHOD_EXCHANGE_DECLARE_OK;
    c->head.status = vhost_exchange(vhost, name) != NULL ? 204 : 201;
    api_op_start(broker, call, req, vhost->name, false, &api_change_type, c);
}

static void delete_exchange(struct broker *broker, struct http_call *call,
                            const struct http_call_request *req, struct vhost *vhost,
                            struct bytes name)
{
    struct change *c = xcalloc(1, sizeof *c);
    memcpy(c->name, name.ptr, name.len);
    c->head.method.id = METHOD_EXCHANGE_DELETE;
    c->head.method.exchange_delete.exchange = (struct bytes){c->name, name.len};
    char v[8];
    c->head.method.exchange_delete.if_unused =
        api_query_get(req, "if-unused", v, sizeof v) && strcmp(v, "true") == 0;
    c->head.ok_id = METHOD_EXCHANGE_DELETE_OK;
    c->head.status = 204;
    api_op_start(broker, call, req, vhost->name, false, &api_change_type, c);
}

static void handle_one(struct broker *broker, struct http_call *call,
                       const struct http_call_request *req, const struct api_path *path)
{
    struct vhost *vhost = api_vhost_or_404(broker, call, path->seg[0]);
    if (vhost == NULL)
        return;
    struct bytes name = path->seg[1];
    bool is_default = bytes_equal_cstr(name, "amq.default");
    struct exchange *x = vhost_exchange(vhost, is_default ? BYTES_LIT("") : name);
    enum http_method m = req->method;
    bool read = m == HTTP_METHOD_GET || m == HTTP_METHOD_HEAD;
    if (path->count == 2 && m == HTTP_METHOD_PUT && !is_default) {
        declare_exchange(broker, call, req, vhost, name);
    } else if (x == NULL) {
        api_answer_not_found(call);
    } else if (path->count == 2 && read) {
        struct json body;
        http_body_init(&body);
        api_exchange_write(&body, vhost, x);
        api_object_answer(call, req, &body);
    } else if (path->count == 2 && m == HTTP_METHOD_DELETE) {
        delete_exchange(broker, call, req, vhost, name);
    } else if (path->count == 3 && api_path_is(path, 2, "publish") && m == HTTP_METHOD_POST) {
        api_message_publish(broker, call, req, vhost, name);
    } else if (path->count == 4 && api_path_is(path, 2, "bindings") && read &&
               (api_path_is(path, 3, "source") || api_path_is(path, 3, "destination"))) {
        api_bindings_of_exchange(broker, call, req, vhost, x, api_path_is(path, 3, "source"));
    } else if (path->count <= 4) {
        http_call_answer_error(call, 405, "Method Not Allowed");
    } else {
        api_answer_not_found(call);
    }
}

static void handle_exchanges(void *ctx, struct http_call *call,
                             const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    bool read = req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD;
    if (path.count >= 1 && !mgmt_user_sees_vhost_or_401(call, req->user, path.seg[0]))
        return;
    if (path.count <= 1 && read) {
        list_exchanges(broker, call, req, path.count == 1 ? &path.seg[0] : NULL);
    } else if (path.count >= 2) {
        handle_one(broker, call, req, &path);
    } else {
        http_call_answer_error(call, 405, "Method Not Allowed");
    }
}

void api_exchanges_register(struct http_server *http, struct broker *broker)
{
    http_server_route_tree(http, "/api/exchanges/", handle_exchanges, broker,
                           MGMT_ACCESS_MANAGEMENT);
}
