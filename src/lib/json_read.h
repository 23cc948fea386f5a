/*
 * json_read.h (in lib/: the cluster's endpoints read bodies too): reads
 * one flat JSON object (a request body of the management API, e.g.
 * {"pattern": "^ha\\.", "priority": 0, "backups": 2}) member by member.
 *
 * Strings are unescaped to UTF-8 (\uXXXX and surrogate pairs included);
 * numbers must be integers; an array of strings (RabbitMQ 3.10's "tags")
 * comes joined with ',' (an element holding a ',' is refused); nested
 * objects and other arrays are refused, since no request body of ours has
 * them. The input is untrusted: every failure is
 * an error text, never a crash, and nothing is read past size.
 *
 * Memory: none allocated; strings land in the caller's member buffers.
 */
#ifndef QUAY_LIB_JSON_READ_H
#define QUAY_LIB_JSON_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_READ_KEY_SIZE 64
#define JSON_READ_STRING_SIZE 1024

enum json_read_kind {
    JSON_READ_STRING,
    JSON_READ_INT,
    JSON_READ_BOOL,
    JSON_READ_NULL,
    JSON_READ_STRING_LIST, /* string: the elements joined with ',' */
};

/* One member, valid during the callback. */
struct json_read_member {
    char key[JSON_READ_KEY_SIZE];       /* NUL-terminated */
    enum json_read_kind kind;
    char string[JSON_READ_STRING_SIZE]; /* STRING: UTF-8, string_size bytes (+ NUL) */
    size_t string_size;
    int64_t integer;                    /* INT */
    bool boolean;                       /* BOOL */
};

/* Called for each member in order; returns false (with a reason in err)
 * to stop. */
typedef bool (*json_read_fn)(void *ctx, const struct json_read_member *member, char *err,
                             size_t err_size);

/* Reads text[0..size) as one object. OK, or E_SYNTAX with why in err. */
int json_read_object(const char *text, size_t size, json_read_fn fn, void *ctx, char *err,
                     size_t err_size);

/* One escape in a JSON string, *p just past its backslash (the text ends
 * at end): its code point in *cp (a \uXXXX surrogate pair joined into
 * one) and *p past it. NULL, or why it is not one ("bad escape", "lone
 * high surrogate", ...), *p where reading stopped. Also the tree
 * parser's (mgmt/json_tree.c). */
const char *json_read_escape(const char **p, const char *end, uint32_t *cp);

#endif
