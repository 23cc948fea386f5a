/*
 * api_definitions_export.c: see api_definitions_export.h.
 *
 * A broker's definitions hold every queue, exchange and binding (50,000
 * queues: 50,000 queue items and their bindings), written in one loop turn
 * before. As the long lists (api_list_slices.c), the request's turn writes
 * the small sections (versions, users, vhosts, permissions, parameters,
 * policies) and copies each queue's, exchange's and binding's fields out
 * (api_list_keep: a memcpy a field; nothing holds them across turns); the
 * items are written in slices (api_answer_slices), as they were when asked.
 */
#include "mgmt/api_definitions_export.h"

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "broker/broker.h"
#include "broker/exchange.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/json.h"
#include "mgmt/api_bindings.h"
#include "mgmt/api_definitions_users.h"
#include "mgmt/api_limits.h"
#include "mgmt/api_list.h"
#include "mgmt/api_policies.h"
#include "mgmt/api_table.h"

static bool exported_exchange(const struct exchange *x)
{
    return x->name.len > 0 && !bytes_has_prefix(x->name, "amq.");
}

static void write_policies(struct json *out, struct broker *broker, const struct vhost *only)
{
    const struct policy_set *set = api_policies_of(broker);
    json_key(out, "policies");
    json_array_begin(out);
    for (uint32_t i = 0; i < set->count; i++) {
        const struct policy *p = set->items[i];
        if (only != NULL && !bytes_equal(p->vhost, only->name))
            continue;
        json_object_begin(out);
        if (only == NULL) {
            json_key(out, "vhost");
            json_string_n(out, p->vhost.ptr, p->vhost.len);
        }
        json_key(out, "name");
        json_string_n(out, p->name.ptr, p->name.len);
        json_key(out, "pattern");
        json_string_n(out, p->pattern.ptr, p->pattern.len);
        json_kv_string(out, "apply-to", "queues");
        json_kv_uint(out, "priority", p->priority);
        api_policy_definition_write(out, p);
        json_object_end(out);
    }
    json_array_end(out);
}

/* ---- the copied items ---------------------------------------------------------- */

enum section { SECTION_QUEUES, SECTION_EXCHANGES, SECTION_BINDINGS, SECTION_COUNT };

static const char *const section_key[SECTION_COUNT] = {"queues", "exchanges", "bindings"};

/* A string in the export's text (api_list_keep). */
struct kept {
    size_t at;
    uint32_t len;
};

/* One queue, exchange or binding, its fields copied. */
struct exported {
    struct kept vhost;
    struct kept name;              /* a binding's: its source */
    struct kept arguments;         /* encoded (an AMQP table) */
    struct kept destination, routing_key; /* a binding's */
    enum exchange_type type;       /* an exchange's */
    bool to_queue;                 /* a binding's destination is a queue */
    bool durable, auto_delete, internal;
};

/* Owned by the answer's slices (export_done). The items are a section's
 * after another's: [0, ends[0]) queues, [ends[0], ends[1]) exchanges,
 * [ends[1], ends[2]) bindings. */
struct export {
    struct api_list_text text;
    struct exported *items;
    size_t count, cap;
    size_t ends[SECTION_COUNT];
    bool alone;                    /* one vhost: no "vhost" fields */
    uint64_t began_ns;
};

static struct kept keep(struct export *e, struct bytes b)
{
    return (struct kept){api_list_keep(&e->text, b), b.len};
}

static struct exported *add(struct export *e, struct kept vhost, struct kept name,
                            struct bytes arguments)
{
    if (e->count == e->cap) {
        e->cap = 2 * e->cap + 256;
        e->items = xrealloc(e->items, e->cap * sizeof *e->items);
    }
    struct exported *it = &e->items[e->count++];
    *it = (struct exported){.vhost = vhost, .name = name};
    it->arguments = keep(e, arguments);
    return it;
}

static void add_queues(struct export *e, const struct vhost *vhost, struct kept vhost_name)
{
    struct hmap_entry *h;
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->queues, &i, &h);) {
        const struct queue *q = h->value;
        if (q->exclusive)
            continue;
        struct exported *it = add(e, vhost_name, keep(e, q->name), q->arguments);
        it->durable = q->durable;
        it->auto_delete = q->auto_delete;
    }
}

static void add_exchanges(struct export *e, const struct vhost *vhost, struct kept vhost_name)
{
    struct hmap_entry *h;
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->exchanges, &i, &h);) {
        const struct exchange *x = h->value;
        if (!exported_exchange(x))
            continue;
        struct exported *it = add(e, vhost_name, keep(e, x->name), x->arguments);
        it->type = x->type;
        it->durable = x->durable;
        it->auto_delete = x->auto_delete;
        it->internal = x->internal;
    }
}

/* Every binding but the default exchange's implicit ones (which are not
 * on its list). */
static void add_bindings(struct export *e, const struct vhost *vhost, struct kept vhost_name)
{
    struct hmap_entry *h;
    for (uint32_t i = 0; hmap_next((struct hmap *)&vhost->exchanges, &i, &h);) {
        const struct exchange *x = h->value;
        if (list_empty(&x->bindings))
            continue;
        struct kept source = keep(e, x->name);
        list_for_each(node, &x->bindings) {
            const struct binding *b = CONTAINER_OF(node, struct binding, source_link);
            struct exported *it = add(e, vhost_name, source, b->arguments);
            it->destination = keep(e, api_binding_dest_name(b->dest));
            it->routing_key = keep(e, b->routing_key);
            it->to_queue = b->dest->kind == BIND_DEST_QUEUE;
        }
    }
}

/* ---- writing them --------------------------------------------------------------- */

static void write_kept(struct json *out, const struct export *e, const char *key,
                       struct kept k)
{
    struct bytes b = api_list_kept(&e->text, k.at, k.len);
    json_key(out, key);
    json_string_n(out, b.ptr, b.len);
}

static void write_arguments(struct json *out, const struct export *e, struct kept k)
{
    struct bytes b = api_list_kept(&e->text, k.at, k.len);
    json_key(out, "arguments");
    api_table_write(out, (struct table){b.ptr, b.len});
}

static void write_item(struct json *out, const struct export *e, enum section section,
                       const struct exported *it)
{
    json_object_begin(out);
    write_kept(out, e, section == SECTION_BINDINGS ? "source" : "name", it->name);
    if (!e->alone)
        write_kept(out, e, "vhost", it->vhost);
    switch (section) {
    case SECTION_QUEUES:
        json_kv_bool(out, "durable", it->durable);
        json_kv_bool(out, "auto_delete", it->auto_delete);
        break;
    case SECTION_EXCHANGES:
        json_kv_string(out, "type", exchange_type_name(it->type));
        json_kv_bool(out, "durable", it->durable);
        json_kv_bool(out, "auto_delete", it->auto_delete);
        json_kv_bool(out, "internal", it->internal);
        break;
    case SECTION_BINDINGS:
        write_kept(out, e, "destination", it->destination);
        json_kv_string(out, "destination_type", it->to_queue ? "queue" : "exchange");
        write_kept(out, e, "routing_key", it->routing_key);
        break;
    case SECTION_COUNT:
        NEVER(true);
        break;
    }
    write_arguments(out, e, it->arguments);
    json_object_end(out);
}

/* Step i of the answer's rest: item i - k after k section ends (each ends
 * its section's array and opens the next's, or ends the answer). */
static bool export_write(void *ctx, size_t i, struct json *out)
{
    const struct export *e = ctx;
    for (uint32_t k = 0; k < SECTION_COUNT; k++) {
        if (i < e->ends[k] + k) {
            write_item(out, e, k, &e->items[i - k]);
            return true;
        }
        if (i == e->ends[k] + k) {
            json_array_end(out);
            if (k + 1 < SECTION_COUNT) {
                json_key(out, section_key[k + 1]);
                json_array_begin(out);
            } else {
                json_object_end(out);
            }
            return true;
        }
    }
    NEVER(true);
    return false;
}

static void export_done(void *ctx)
{
    struct export *e = ctx;
    free(e->text.data);
    free(e->items);
    free(e);
}

void api_definitions_export(struct broker *broker, struct http_call *call,
                            const struct vhost *only)
{
    struct export *e = xcalloc(1, sizeof *e);
    e->began_ns = uv_hrtime();
    e->alone = only != NULL;
    struct json body;
    http_body_init(&body);
    json_object_begin(&body);
    json_kv_string(&body, "rabbit_version", QUAY_VERSION);
    if (only == NULL) {
        json_kv_string(&body, "rabbitmq_version", QUAY_VERSION);
        json_kv_string(&body, "product_name", "quay");
        json_kv_string(&body, "product_version", QUAY_VERSION);
        api_definitions_write_users(&body, broker);
        json_key(&body, "topic_permissions");
        json_array_begin(&body);
        json_array_end(&body);
        json_key(&body, "global_parameters");
        json_array_begin(&body);
        json_array_end(&body);
    }
    json_key(&body, "parameters");
    json_array_begin(&body);
    api_limits_write_parameters(&body, broker, only ? only->name : (struct bytes){NULL, 0});
    json_array_end(&body);
    write_policies(&body, broker, only);
    json_key(&body, section_key[SECTION_QUEUES]);
    json_array_begin(&body);
    for (uint32_t k = 0; k < SECTION_COUNT; k++) {
        struct hmap_entry *v;
        for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
            const struct vhost *vhost = v->value;
            if (only != NULL && vhost != only)
                continue;
            struct kept name = keep(e, vhost->name);
            if (k == SECTION_QUEUES)
                add_queues(e, vhost, name);
            else if (k == SECTION_EXCHANGES)
                add_exchanges(e, vhost, name);
            else
                add_bindings(e, vhost, name);
        }
        e->ends[k] = e->count;
    }
    struct api_list_source source = {.count = e->count + SECTION_COUNT, .write = export_write,
                                     .done = export_done, .ctx = e, .began_ns = e->began_ns};
    api_answer_slices(broker->loop, call, &body, &source);
}
