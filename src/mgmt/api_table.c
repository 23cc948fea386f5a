/*
 * api_table.c: see api_table.h.
 */
#include "mgmt/api_table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "amqp/table.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

static void write_value(struct json *out, const struct field_value *v);

static void write_array(struct json *out, struct bytes array)
{
    json_array_begin(out);
    struct array_iter it;
    struct field_value v;
    array_iter_init(&it, array);
    while (array_iter_next(&it, &v))
        write_value(out, &v);
    json_array_end(out);
}

static void write_value(struct json *out, const struct field_value *v)
{
    int64_t i;
    switch (v->kind) {
    case 't': json_bool(out, v->boolean); return;
    case 'S':
    case 'x': json_string_n(out, v->str.ptr, v->str.len); return;
    case 'F': api_table_write(out, v->table); return;
    case 'A': write_array(out, v->array); return;
    case 'V': json_null(out); return;
    case 'f':
        isfinite(v->f32) ? json_double(out, v->f32) : json_null(out);
        return;
    case 'd':
        isfinite(v->f64) ? json_double(out, v->f64) : json_null(out);
        return;
    case 'D':
        json_double(out, v->decimal.value / pow(10.0, v->decimal.scale));
        return;
    default:
        if (field_value_as_int(v, &i))
            json_int(out, i);
        else if (v->kind == 'L' || v->kind == 'T')
            json_uint(out, v->u64);
        else
            json_null(out);
        return;
    }
}

void api_table_write(struct json *out, struct table t)
{
    json_object_begin(out);
    struct table_iter it;
    struct bytes key;
    struct field_value v;
    table_iter_init(&it, t);
    while (table_iter_next(&it, &key, &v)) {
        char name[256];
        ASSERT(key.len < sizeof name); /* a shortstr */
        memcpy(name, key.ptr, key.len);
        name[key.len] = '\0';
        json_key(out, name);
        write_value(out, &v);
    }
    json_object_end(out);
}

static bool put_node(struct table_writer *w, const struct json_tree *tree,
                     const struct json_node *n, bool keyed, char *err, size_t err_size);

static bool put_children(struct table_writer *w, const struct json_tree *tree,
                         const struct json_node *n, char *err, size_t err_size)
{
    bool object = n->kind == JSON_KIND_OBJECT;
    for (const struct json_node *c = json_tree_first(tree, n); c; c = json_tree_next(tree, c)) {
        if (object && (c->key_size > 255 || c->key_size != strlen(c->key))) {
            snprintf(err, err_size, "a field name over 255 bytes (or with a NUL)");
            return false;
        }
        if (!put_node(w, tree, c, object, err, err_size))
            return false;
    }
    return true;
}

static bool put_node(struct table_writer *w, const struct json_tree *tree,
                     const struct json_node *n, bool keyed, char *err, size_t err_size)
{
    struct field_value v = {0};
    switch (n->kind) {
    case JSON_KIND_NULL: v.kind = 'V'; break;
    case JSON_KIND_BOOL: v.kind = 't', v.boolean = n->boolean; break;
    case JSON_KIND_STRING:
        v.kind = 'S', v.str = (struct bytes){(const uint8_t *)n->string, n->string_size};
        break;
    case JSON_KIND_NUMBER:
        if (n->is_integer)
            v.kind = 'l', v.i64 = n->integer;
        else
            v.kind = 'd', v.f64 = n->number;
        break;
    case JSON_KIND_OBJECT:
    case JSON_KIND_ARRAY: {
        bool object = n->kind == JSON_KIND_OBJECT;
        size_t mark = keyed ? (object ? table_put_table_begin(w, n->key)
                                      : table_put_array_begin(w, n->key))
                            : (object ? table_array_put_table_begin(w)
                                      : table_array_put_array_begin(w));
        if (!put_children(w, tree, n, err, err_size))
            return false;
        object ? table_put_table_end(w, mark) : table_put_array_end(w, mark);
        return true;
    }
    }
    if (keyed)
        table_put_field(w, (struct bytes){(const uint8_t *)n->key, n->key_size}, &v);
    else
        table_array_put_field(w, &v);
    return true;
}

int api_table_from_json(const struct json_tree *tree, const struct json_node *obj, uint8_t *buf,
                        size_t cap, struct table *out, char *err, size_t err_size)
{
    struct table_writer w;
    table_writer_init(&w, buf, cap);
    if (obj != NULL && obj->kind != JSON_KIND_NULL) {
        if (obj->kind != JSON_KIND_OBJECT) {
            snprintf(err, err_size, "arguments must be a JSON object");
            return E_SYNTAX;
        }
        if (!put_children(&w, tree, obj, err, err_size))
            return E_SYNTAX;
    }
    if (w.overflow) {
        snprintf(err, err_size, "arguments too big (over %zu bytes)", cap);
        return E_SYNTAX;
    }
    *out = table_writer_table(&w);
    return OK;
}
