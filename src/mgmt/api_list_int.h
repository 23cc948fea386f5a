/*
 * api_list_int.h: api_list.c's pieces that api_list_slices.c shares: the
 * query's columns, sort keys and page, and writing one item.
 */
#ifndef QUAY_MGMT_API_LIST_INT_H
#define QUAY_MGMT_API_LIST_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mgmt/api_list.h"
#include "mgmt/http.h"

struct json;
struct json_tree;
struct json_node;

#define QUERY_VALUE_SIZE_MAX 1024
#define COLUMNS_MAX 64
#define SORT_KEYS_MAX 8

/* columns= : the columns, split at ','. */
struct columns {
    char text[QUERY_VALUE_SIZE_MAX];
    const char *name[COLUMNS_MAX];
    uint32_t count;
};

void api_list__columns_parse(const struct http_call_request *req, struct columns *c);
/* Item n as it is, or its columns if cols has any. */
void api_list__write_item(struct json *out, const struct json_tree *tree,
                          const struct json_node *n, const struct columns *cols);
/* The field at a dotted path of object n, or NULL. */
const struct json_node *api_list__field_at(const struct json_tree *tree,
                                           const struct json_node *n, const char *path,
                                           size_t path_size);
/* The sort keys, "a.b,c" (sort= then default_sort, or default_sort alone),
 * and sort_reverse=; true if sort= asked for one. */
bool api_list__sort_keys(const struct http_call_request *req, const char *default_sort,
                         char keys[QUERY_VALUE_SIZE_MAX], bool *reverse);
/* Items whose "name" f keeps (RabbitMQ's name= filter). */
bool api_list__name_matches(const struct json_tree *tree, const struct json_node *n,
                            const struct api_name_filter *f);
/* name= and use_regex= of a page: false once answered 400 (a regular
 * expression that does not compile, in RabbitMQ's words). */
bool api_list__name_parse(struct http_call *call, const struct http_call_request *req,
                          struct api_name_filter *f);
/* page= and page_size=: false once answered 400. */
bool api_list__page_parse(struct http_call *call, const struct http_call_request *req,
                          bool *paged, long *page, long *page_size);
/* A page may start at the list's end, not past it: false once answered 400. */
bool api_list__page_in_range(struct http_call *call, long page, long page_size,
                             size_t filtered);

#endif
