/*
 * ctl_json.h: quayctl's small JSON reader (a whole document into a tree
 * of owned nodes), apart from ctl.c so that file keeps to its commands.
 * It links nothing of the broker's: quayctl stands alone.
 */
#ifndef QUAY_CLI_CTL_JSON_H
#define QUAY_CLI_CTL_JSON_H

#include <stdbool.h>
#include <stddef.h>

enum jtype { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT };

/* A parsed value. Children are a linked list; every node and string is
 * owned by its parent (jfree frees a whole tree). */
struct jvalue {
    enum jtype type;
    bool boolean;
    char *text;              /* owned: a string's UTF-8, a number's digits */
    char *key;               /* owned: the member name inside an object */
    struct jvalue *child;    /* owned: first element or member */
    struct jvalue *next;     /* owned: next sibling */
};

/* The document text[0..size), or NULL with why in *error. */
struct jvalue *json_parse(const char *text, size_t size, const char **error);
void jfree(struct jvalue *v);
/* An object's member, or NULL. */
const struct jvalue *jget(const struct jvalue *object, const char *key);
/* A member by a dotted path ("queue.name": the member "name" of the member
 * "queue"), as the API's columns= names nested fields; NULL if absent. */
const struct jvalue *jget_path(const struct jvalue *object, const char *path);

#endif
