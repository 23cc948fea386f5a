/*
 * fuzz_json.c: the management API's JSON body readers (lib/json_read.h,
 * and mgmt/json_tree.h with the table conversion of mgmt/api_table.h),
 * which every POST and PUT body goes through before any action, and the
 * writer's string escaping (lib/json.h), which names from clients go
 * through on the way out.
 *
 * Goal: json_read_object never reads outside its input, always says why
 * it refuses, and hands over only well-formed members: keys and strings
 * NUL-terminated within their buffers, strings valid UTF-8 of the stated
 * size. Writing a string member back with the JSON writer and reading the
 * result gives the same member again. Method: the input is a body.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/json.h"
#include "amqp/table.h"
#include "mgmt/api_table.h"
#include "lib/json_read.h"
#include "mgmt/json_tree.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct seen {
    bool again; /* reading the written member back */
    struct json_read_member first;
};

static bool same_member(void *ctx, const struct json_read_member *m, char *err, size_t err_size)
{
    struct seen *s = ctx;
    (void)err;
    (void)err_size;
    ASSERT(strcmp(m->key, s->first.key) == 0 && m->kind == JSON_READ_STRING);
    ASSERT(m->string_size == s->first.string_size &&
           memcmp(m->string, s->first.string, m->string_size) == 0);
    return true;
}

static bool check_member(void *ctx, const struct json_read_member *m, char *err,
                         size_t err_size)
{
    struct seen *s = ctx;
    (void)err;
    (void)err_size;
    ASSERT(memchr(m->key, '\0', sizeof m->key) != NULL);
    if (m->kind != JSON_READ_STRING)
        return true;
    ASSERT(m->string_size < sizeof m->string && m->string[m->string_size] == '\0');
    /* Written out and read again: the same member (a string with a NUL or
     * a quote inside is written escaped, and read back the same). */
    bool plain_key = m->key[0] != '\0';
    for (const char *k = m->key; *k; k++)
        plain_key &= (*k >= 'a' && *k <= 'z') || (*k >= '0' && *k <= '9') || *k == '_';
    if (plain_key) {
        s->first = *m;
        struct json j;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, m->key);
        json_string_n(&j, (const uint8_t *)m->string, m->string_size);
        json_object_end(&j);
        size_t n;
        char *text = json_release(&j, &n);
        char why[128];
        ASSERT(json_read_object(text, n, same_member, s, why, sizeof why) == OK);
        free(text);
    }
    return true;
}

/* Every node's strings end within the tree and its children add up. */
static void check_node(const struct json_tree *t, const struct json_node *n, uint32_t depth)
{
    ASSERT(depth <= JSON_TREE_DEPTH_MAX);
    if (n->kind == JSON_KIND_STRING)
        ASSERT(n->string[n->string_size] == '\0');
    uint32_t count = 0;
    for (const struct json_node *c = json_tree_first(t, n); c; c = json_tree_next(t, c)) {
        ASSERT((c->key != NULL) == (n->kind == JSON_KIND_OBJECT));
        check_node(t, c, depth + 1);
        count++;
    }
    ASSERT(count == n->children_count);
}

/* The nested reader (mgmt/json_tree.h) on the same input: refused with a
 * position, or a consistent tree; an object then becomes an AMQP table
 * that validates, and that table is written back as JSON. */
static void check_tree(const uint8_t *data, size_t size)
{
    struct json_tree t;
    char err[256] = "";
    if (json_tree_parse(&t, (const char *)data, size, err, sizeof err) != OK) {
        ASSERT(strstr(err, "line ") != NULL);
        return;
    }
    const struct json_node *root = json_tree_root(&t);
    check_node(&t, root, 1);
    uint8_t *buf = malloc(1u << 16);
    ASSERT(buf != NULL);
    struct table table;
    if (root->kind == JSON_KIND_OBJECT &&
        api_table_from_json(&t, root, buf, 1u << 16, &table, err, sizeof err) == OK) {
        ASSERT(table_validate(table.ptr, table.len) == OK);
        struct json j;
        json_init(&j);
        api_table_write(&j, table);
        ASSERT(json_complete(&j));
        json_free(&j);
    }
    free(buf);
    json_tree_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct seen *s = calloc(1, sizeof *s);
    ASSERT(s != NULL);
    char err[256];
    err[0] = '\0';
    int rc = json_read_object((const char *)data, size, check_member, s, err, sizeof err);
    ASSERT(rc == OK || (rc == E_SYNTAX && err[0] != '\0'));
    free(s);
    check_tree(data, size);
    return 0;
}
