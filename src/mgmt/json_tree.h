/*
 * json_tree.h: reads a whole JSON document (RFC 8259) into a tree of
 * nodes, for request bodies that nest: RabbitMQ's declarations carry an
 * "arguments" object, a publish carries "properties", and a definitions
 * file is objects in arrays in an object. (json_read.h stays the reader
 * of flat bodies.)
 *
 * The input is untrusted: every failure is an error text naming where
 * the document went wrong ("line 3, column 14 (byte 52): ...") and
 * nothing is read past size. Depth is at most JSON_TREE_DEPTH_MAX; numbers
 * keep their integer value when they have one (RabbitMQ's x-message-ttl
 * and the like must stay integers).
 *
 * Memory: json_tree_parse allocates the nodes and the unescaped strings
 * in one tree, freed by json_tree_free; nodes and strings borrow from
 * nothing the caller owns.
 */
#ifndef QUAY_MGMT_JSON_TREE_H
#define QUAY_MGMT_JSON_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_TREE_DEPTH_MAX 32
#define JSON_TREE_NONE UINT32_MAX

enum json_kind {
    JSON_KIND_NULL,
    JSON_KIND_BOOL,
    JSON_KIND_NUMBER,
    JSON_KIND_STRING,
    JSON_KIND_ARRAY,
    JSON_KIND_OBJECT,
};

/* One value. Children of an array or object are linked by next, in
 * document order; an object's children carry their member names. */
struct json_node {
    enum json_kind kind;
    bool boolean;
    bool is_integer;           /* NUMBER: no fraction, no exponent, fits int64 */
    int64_t integer;
    double number;
    const char *string;        /* STRING: UTF-8, NUL-terminated, string_size bytes */
    uint32_t string_size;
    const char *key;           /* a member's name (NUL-terminated), else NULL */
    uint32_t key_size;
    uint32_t first_child;      /* index, or JSON_TREE_NONE */
    uint32_t next;             /* the next sibling, or JSON_TREE_NONE */
    uint32_t children_count;
};

/* Owned by its caller; node 0 is the document's value. */
struct json_tree {
    struct json_node *nodes;
    uint32_t count;
    uint32_t cap;
    char *strings;             /* every unescaped string and key */
    size_t strings_size;
};

/* Parses text[0..size). OK, or E_SYNTAX with where and why in err (the
 * tree is then empty and needs no free). */
int json_tree_parse(struct json_tree *tree, const char *text, size_t size, char *err,
                    size_t err_size);
void json_tree_free(struct json_tree *tree);

static inline const struct json_node *json_tree_root(const struct json_tree *tree)
{
    return &tree->nodes[0];
}
/* The child after c (NULL at the end), and the first child of n. */
const struct json_node *json_tree_first(const struct json_tree *tree, const struct json_node *n);
const struct json_node *json_tree_next(const struct json_tree *tree, const struct json_node *c);
/* An object's member by name, or NULL. */
const struct json_node *json_tree_get(const struct json_tree *tree, const struct json_node *obj,
                                      const char *key);
/* A member read as RabbitMQ's management API reads it: booleans may be
 * given as true/false or "true"/"false" (rabbitmqadmin sends strings).
 * Returns false for another kind of value; absent: *out = dflt. */
bool json_tree_get_bool(const struct json_tree *tree, const struct json_node *obj,
                        const char *key, bool dflt, bool *out);

#endif
