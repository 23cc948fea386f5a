/*
 * api_list.h: what RabbitMQ's management API does to any list it answers,
 * for the list endpoints of api_queues.c, api_exchanges.c, ...:
 *
 *   sort=KEY[.KEY...]     sort by that field (strings, then numbers;
 *                         missing last); the default is each list's own
 *   sort_reverse=true     descending
 *   columns=A,B.C,...     only these fields of each item (a dotted name
 *                         picks a field of a nested object)
 *   page=N&page_size=M    one page: {"filtered_count", "item_count",
 *                         "items", "page", "page_count", "page_size",
 *                         "total_count"}; page_size at most 500 (400
 *                         otherwise, as RabbitMQ), default 100
 *   name=TEXT             (with page) only items whose name contains TEXT
 *
 * And the path's segments: %-decoded, at most 255 bytes each (AMQP's
 * short strings), so "/api/queues/%2F/q" is ("/", "q").
 *
 * A list is written whole by its endpoint first (in its tables' order),
 * then re-read here and written again: it costs one parse of the answer,
 * only for lists, in one loop turn. A list whose length clients decide
 * (queues, exchanges, bindings, connections, channels, consumers) is
 * answered in slices instead (api_list_answer_slices, api_list_slices.c),
 * the same answer. Memory: answers take the body; nothing is kept.
 */
#ifndef QUAY_MGMT_API_LIST_H
#define QUAY_MGMT_API_LIST_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"
#include "mgmt/http.h"

struct json;
struct json_tree;
struct json_node;

#define API_PATH_SEGMENTS_MAX 8
#define API_SEGMENT_SIZE_MAX 255

/* The path after a tree's prefix, split at '/' and %-decoded. */
struct api_path {
    uint32_t count;
    struct bytes seg[API_PATH_SEGMENTS_MAX]; /* point into text */
    uint8_t text[API_PATH_SEGMENTS_MAX][API_SEGMENT_SIZE_MAX];
};

/* False (answered 404 with RabbitMQ's shape) if the path has too many
 * segments, an empty one, a bad %-escape or one over 255 bytes. */
bool api_path_parse(struct http_call *call, const struct http_call_request *req,
                    struct api_path *path);
/* Whether segment i is word. */
bool api_path_is(const struct api_path *path, uint32_t i, const char *word);

/* The %-decoded value of query parameter key into out[cap] (NUL-ended);
 * false if absent or too long. */
bool api_query_get(const struct http_call_request *req, const char *key, char *out,
                   size_t cap);

/* Answers raw (a complete JSON array written by the endpoint) after
 * sorting (by default_sort, "vhost,name"-style, unless sort= says
 * otherwise), columns and pagination as above. Takes raw. */
void api_list_answer(struct http_call *call, const struct http_call_request *req,
                     struct json *raw, const char *default_sort);
/* The same for the lists RabbitMQ 3.10 sorts and cuts into columns but
 * answers whole (users, permissions, policies: its reply_list without
 * pagination): page=, page_size= and name= are ignored there, so here. */
void api_list_answer_whole(struct http_call *call, const struct http_call_request *req,
                           struct json *raw, const char *default_sort);
/* A long list's items, for api_list_answer_slices: write(ctx, i, out)
 * writes item i (i < count) as one JSON object into out and returns true,
 * or writes nothing and returns false (the item is gone); compare(ctx, a,
 * b) orders items a and b as default_sort would (NULL: they are in that
 * order already); done(ctx) runs once the answer was given or the client
 * went, and no write after it. */
struct api_list_source {
    size_t count;
    bool (*write)(void *ctx, size_t i, struct json *out);
    int (*compare)(void *ctx, size_t a, size_t b);
    void (*done)(void *ctx);
    void *ctx;
    uint64_t began_ns;  /* when the endpoint began to gather them (uv_hrtime), for the log */
};
struct uv_loop_s;
/* The same answer as api_list_answer's for the source's items, built a
 * slice of ~1 ms per loop turn (api_list_slices.c), so that a list of
 * 50,000 queues does not hold the loop. */
void api_list_answer_slices(struct uv_loop_s *loop, struct http_call *call,
                            const struct http_call_request *req, const char *default_sort,
                            const struct api_list_source *source);
/* A long answer that is not a list (GET /api/definitions): body is the
 * answer as the endpoint began it (taken), and the source's items go on
 * writing it, in order, straight into it (write(ctx, i, body): any part
 * of the one JSON text; the last item ends it), a slice at a time as
 * above; then it is answered. compare is not used. */
void api_answer_slices(struct uv_loop_s *loop, struct http_call *call, struct json *body,
                       const struct api_list_source *source);
/* The bytes a source copied out of objects that may be freed before its
 * items are written (exchanges, bindings, connections, channels,
 * consumers: no reference holds them), one
 * buffer for a whole list: api_list_keep appends b and gives its offset,
 * api_list_kept gives it back. */
struct api_list_text {
    char *data;                    /* owned */
    size_t size, cap;
};
size_t api_list_keep(struct api_list_text *t, struct bytes b);
static inline struct bytes api_list_kept(const struct api_list_text *t, size_t at, uint32_t len)
{
    return (struct bytes){(uint8_t *)t->data + at, len};
}
/* A page cut by the endpoint before it writes its items, for lists
 * whose items cost to write (a queue in a cluster: its primary is asked
 * for its counts): a request for a page (page=, valid page_size=) sorted
 * by vhost and name only (sort= absent or empty, or "name", "vhost",
 * "vhost,name", "name,vhost"; sort_reverse=), with name= or not. The
 * endpoint counts its objects (total), keeps those api_list_cut_matches
 * (filtered), sorts them with api_list_cut_compare, writes the page's
 * (api_list_cut_range) and answers with api_list_answer_cut: the same
 * answer as api_list_answer would give for all of them written, but for
 * the order of names that differ only in bytes the JSON text replaces
 * (invalid UTF-8). */
/* RabbitMQ's name= filter of a page: the items whose name contains the
 * text, ignoring case (ASCII), or, with use_regex=true, that a caseless
 * extended regular expression matches (RabbitMQ's is a PCRE: the common
 * subset is the same). */
struct api_name_filter {
    char text[1024];      /* "": every item */
    bool regex;
    regex_t compiled;     /* regex: owned */
};
/* From the request's name= and use_regex=. False: the expression does not
 * compile (RabbitMQ answers 400 "Pagination parameters are invalid");
 * nothing to free then. */
bool api_name_filter_parse(const struct http_call_request *req, struct api_name_filter *f);
bool api_name_filter_matches(const struct api_name_filter *f, struct bytes name);
void api_name_filter_free(struct api_name_filter *f);

struct api_list_cut {
    long page, page_size;
    struct api_name_filter name; /* name=, use_regex= (api_list_cut_free) */
    bool name_first;      /* sorted by name, then vhost (else vhost, then name) */
    bool reverse;
    size_t total;         /* the endpoint's objects */
    size_t filtered;      /* of them, the matching ones */
};
/* False: not such a request (api_list_answer answers it, or refuses it);
 * nothing to free then. */
bool api_list_cut_parse(const struct http_call_request *req, struct api_list_cut *cut);
void api_list_cut_free(struct api_list_cut *cut);
bool api_list_cut_matches(const struct api_list_cut *cut, struct bytes name);
int api_list_cut_compare(const struct api_list_cut *cut, struct bytes vhost_a,
                         struct bytes name_a, struct bytes vhost_b, struct bytes name_b);
/* The page's items: [*from, *to) of the sorted matching ones. */
void api_list_cut_range(const struct api_list_cut *cut, size_t *from, size_t *to);
/* Answers the page: raw is a JSON array of the page's items in order
 * (fewer if some went meanwhile), with columns= applied here. Takes raw. */
void api_list_answer_cut(struct http_call *call, const struct http_call_request *req,
                         struct json *raw, const struct api_list_cut *cut);
/* Answers raw (one JSON object) with columns= applied. Takes raw. */
void api_object_answer(struct http_call *call, const struct http_call_request *req,
                       struct json *raw);
/* Writes node (of tree) as JSON into out. */
void api_write_node(struct json *out, const struct json_tree *tree, const struct json_node *n);
/* A request body that must be a JSON object: parsed into tree (free it),
 * or false once answered 400 with where the JSON went wrong. */
bool api_body_parse(struct http_call *call, const struct http_call_request *req,
                    struct json_tree *tree);
/* RabbitMQ's 400: {"error": "bad_request", "reason": reason}. */
void api_answer_bad_request(struct http_call *call, const char *reason);
/* RabbitMQ's 404 for a missing object or an unknown path. */
void api_answer_not_found(struct http_call *call);

#endif
