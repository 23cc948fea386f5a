/*
 * http.c: see http.h. A client goes through two states:
 *
 *   READING ──head (and body) complete / malformed / too large / timeout──> ANSWERED
 *      └──a prefix or later route answers later──> WAITING ──answer──> ANSWERED
 *                                            └──client gone: its cancel hook runs
 *
 * In READING, input is copied into the client's fixed request buffer (so
 * the transport never keeps a partial head of its own) and the head is
 * re-parsed from the start; it is at most 8 KiB, so that costs nothing
 * worth a resumable parser. Every answer is one buffer holding headers
 * and body, queued by reference, after which the transport closes the
 * socket once it is written (conn_close_after_flush). Input that arrives
 * while answering is discarded.
 *
 * This file owns the plumbing only; what the paths answer is api.c's. The
 * request parser is http_parse.c's (pure, linked into the fuzzer alone).
 */
#include "mgmt/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/http_guard.h"
#include "lib/json.h"

#define HTTP_TICK_MS 250
/* Room reserved in front of every response body for the status line and
 * headers, which are written last (Content-Length is known only then);
 * a static file's security headers and ETag need more than 256 bytes. */
#define HTTP_HEADROOM 512u

/* Where a client stands. */
enum http_conn_state {
    HTTP_CONN_STATE_READING,   /* collecting the request head and body */
    HTTP_CONN_STATE_WAITING,   /* a prefix route answers later */
    HTTP_CONN_STATE_ADMITTING, /* the admission hook answers later (AGAIN) */
    HTTP_CONN_STATE_ANSWERED,  /* answer queued; closing once it is written */
};

/* One client. Owned by its server's pool; freed from the transport's
 * on_free (deferred destruction, see conn.h). */
struct http_conn {
    struct conn conn;              /* first: transport callbacks cast back */
    struct http_server *server;    /* borrowed */
    struct list_node server_link;  /* in server->conns */
    enum http_conn_state state;
    bool head_only;                /* a HEAD request: answer without the body */
    uint64_t state_since_ms;       /* loop time of accept, of the dispatch, or of the answer */
    http_cancel_fn cancel;         /* WAITING, ADMITTING: the route's or the hook's, or NULL */
    void *cancel_arg;
    int admission_memo;            /* the admission hook's (struct http_admission) */
    /* ADMITTING: input that came after the head (a big body's first
     * part), offered again once admitted. Owned, or NULL. */
    uint8_t *stash;
    size_t stash_size;
    uint32_t request_size;
    char request[HTTP_REQUEST_SIZE_MAX];
    /* A request whose body goes past request[]: head and body, collected
     * here as the bytes arrive (big_size of big_cap used), or NULL. */
    char *big;
    size_t big_size, big_cap;
};

static long on_input(struct conn *conn, const uint8_t *data, size_t size);
static void on_close(struct conn *conn);
static void on_free(struct conn *conn);

static const struct conn_ops http_conn_ops = {
    .on_input = on_input,
    .on_close = on_close,
    .on_free = on_free,
    .on_drain = NULL,
};

static struct http_conn *from_conn(struct conn *conn)
{
    return CONTAINER_OF(conn, struct http_conn, conn);
}

/* ---- answers ----------------------------------------------------------- */

/* A body with its headroom, ready for json writes. */
void http_body_init(struct json *body)
{
    static const char headroom[HTTP_HEADROOM];
    json_init(body);
    json_raw(body, headroom, sizeof headroom);
}

/* Writes the head in front of the body and queues the whole response by
 * reference; the transport frees it once written (or on close). body is
 * one JSON value, or the raw text of a text route (content_type). */
static void answer_released(struct http_conn *hc, int status, struct json *body,
                            const char *extra_headers, const char *content_type,
                            void (*release)(void *data))
{
    ASSERT(hc->state == HTTP_CONN_STATE_READING || hc->state == HTTP_CONN_STATE_WAITING ||
           hc->state == HTTP_CONN_STATE_ADMITTING);
    ASSERT(body->depth == 0);
    ASSERT(body->size >= HTTP_HEADROOM);
    hc->cancel = NULL;
    size_t body_size = body->size - HTTP_HEADROOM;
    char head[HTTP_HEADROOM];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\n"
                     "Server: quay\r\n"
                     "Content-Type: %s\r\n"
                     "Content-Length: %zu\r\n"
                     "Cache-Control: no-cache\r\n"
                     "%s"
                     "Connection: close\r\n"
                     "\r\n",
                     status, http_status_text(status), content_type, body_size, extra_headers);
    ASSERT(n > 0 && (size_t)n < sizeof head);
    size_t size;
    char *data = json_release(body, &size);
    char *start = data + HTTP_HEADROOM - n;
    memcpy(start, head, (size_t)n);
    size_t out_size = (size_t)n + (hc->head_only ? 0 : body_size);
    conn_out_ref(&hc->conn, (const uint8_t *)start, out_size, release ? release : free, data);
    hc->state = HTTP_CONN_STATE_ANSWERED;
    /* The loop's time is its turn's start: an answer built in this turn
     * for seconds (a list of 50,000 queues) would start its reader's
     * timeout that much in the past, and the timer would cut the answer
     * at once. */
    uv_update_time(hc->server->net->loop);
    hc->state_since_ms = uv_now(hc->server->net->loop);
    hc->server->requests_count++;
    conn_close_after_flush(&hc->conn);
}

static void answer_as(struct http_conn *hc, int status, struct json *body,
                      const char *extra_headers, const char *content_type)
{
    answer_released(hc, status, body, extra_headers, content_type, NULL);
}

static void answer(struct http_conn *hc, int status, struct json *body,
                   const char *extra_headers)
{
    ASSERT(json_complete(body));
    answer_as(hc, status, body, extra_headers, "application/json");
}

/* An error answer: RabbitMQ's management API shape, {"error", "reason"},
 * where error is the status text unless given. */
static void answer_error_as(struct http_conn *hc, int status, const char *error,
                            const char *reason, const char *extra_headers)
{
    struct json body;
    http_body_init(&body);
    json_object_begin(&body);
    json_kv_string(&body, "error", error != NULL ? error : http_status_text(status));
    json_kv_string(&body, "reason", reason);
    json_object_end(&body);
    LOG_DEBUG("http conn=%llu peer=%s answered %d: %s", (unsigned long long)hc->conn.id,
              hc->conn.peer_name, status, reason);
    answer(hc, status, &body, extra_headers);
}

static void answer_error(struct http_conn *hc, int status, const char *reason,
                         const char *extra_headers)
{
    answer_error_as(hc, status, NULL, reason, extra_headers);
}

/* The realm RabbitMQ's management plugin names, so that tools written for
 * it recognise the challenge. */
#define HTTP_CHALLENGE "WWW-Authenticate: Basic realm=\"RabbitMQ Management\"\r\n"

static void answer_refusal(struct http_conn *hc, const struct http_refusal *refusal)
{
    ASSERT(refusal->status >= 400 && refusal->status < 500);
    ASSERT(refusal->reason != NULL);
    hc->server->refused_count++;
    LOG_INFO("http conn=%llu peer=%s refused (%d): %s", (unsigned long long)hc->conn.id,
             hc->conn.peer_name, refusal->status, refusal->reason);
    answer_error_as(hc, refusal->status, refusal->error, refusal->reason,
                    refusal->challenge ? HTTP_CHALLENGE : "");
}

static const struct http_route *find_route(const struct http_server *server, const char *path,
                                           size_t path_size, bool post)
{
    for (uint32_t i = 0; i < server->routes_count; i++) {
        const struct http_route *route = &server->routes[i];
        if (route->prefix == NULL && strlen(route->path) == path_size &&
            memcmp(route->path, path, path_size) == 0 && (route->action != NULL) == post)
            return route;
    }
    return NULL;
}

/* The prefix route whose prefix path starts with and goes past. */
static const struct http_route *find_prefix(const struct http_server *server, const char *path,
                                            size_t path_size)
{
    for (uint32_t i = 0; i < server->routes_count; i++) {
        const struct http_route *route = &server->routes[i];
        size_t n = route->prefix ? strlen(route->path) : 0;
        if (n > 0 && path_size > n && memcmp(route->path, path, n) == 0)
            return route;
        /* A tree takes its bare path too ("/api/queues" for "/api/queues/"). */
        if (n > 0 && route->tree && path_size == n - 1 && memcmp(route->path, path, n - 1) == 0)
            return route;
    }
    return NULL;
}

static bool method_is(const struct http_request *req, const char *name)
{
    return req->method_size == strlen(name) && memcmp(req->method, name, req->method_size) == 0;
}

static bool parse_method(const struct http_request *req, enum http_method *out)
{
    static const struct {
        const char *name;
        enum http_method method;
    } methods[] = {{"GET", HTTP_METHOD_GET},  {"HEAD", HTTP_METHOD_HEAD},
                   {"POST", HTTP_METHOD_POST}, {"PUT", HTTP_METHOD_PUT},
                   {"DELETE", HTTP_METHOD_DELETE}};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        if (method_is(req, methods[i].name)) {
            *out = methods[i].method;
            return true;
        }
    }
    return false;
}

/* The Host and Origin checks (http_guard.h says why): false once refused. */
static bool guard_passes(struct http_conn *hc, const struct http_request *req)
{
    struct http_refusal refusal = {.status = 403};
    if (req->host != NULL) { /* only HTTP/1.0 may leave it out, and no browser does */
        struct sockaddr_storage local;
        int size = sizeof local;
        if (uv_tcp_getsockname(&hc->conn.tcp, (struct sockaddr *)&local, &size) != 0 ||
            !http_host_allowed(req->host, req->host_size, (const struct sockaddr *)&local,
                               hc->server->allowed_hosts))
            refusal.reason = "the Host header names none of this server's addresses or "
                             "allowed names (quayd --http-allowed-hosts)";
    }
    if (refusal.reason == NULL && req->origin != NULL &&
        (req->host == NULL ||
         !http_origin_is_own(req->origin, req->origin_size, req->host, req->host_size,
                             conn_tls(&hc->conn) != NULL)))
        refusal.reason = "a request from another origin (a web page of another site) is "
                         "refused";
    if (refusal.reason == NULL)
        return true;
    answer_refusal(hc, &refusal);
    return false;
}

/* Asks the owner whether the request may reach its route: false once
 * refused (and answered). */
static bool admitted(struct http_conn *hc, const struct http_request *req,
                     enum http_method method, const struct http_route *route,
                     const struct auth_user **user)
{
    *user = NULL;
    struct http_server *server = hc->server;
    if (route->asset != NULL)
        return true; /* a static file: no data of the broker (struct http_asset) */
    if (server->admit != NULL) {
        struct http_admission admission = {.method = method, .access = route->access,
                                           .request = req,
                                           .peer_loopback = hc->conn.peer_loopback,
                                           .wait = (struct http_wait *)hc,
                                           .memo = &hc->admission_memo};
        struct http_refusal refusal = {0};
        int rc = server->admit(server->admit_ctx, &admission, user, &refusal);
        if (rc == AGAIN) {
            hc->state = HTTP_CONN_STATE_ADMITTING;
            hc->state_since_ms = uv_now(server->net->loop);
            conn_pause_reading(&hc->conn, CONN_PAUSE_HOLD);
            return false;
        }
        if (rc != OK) {
            answer_refusal(hc, &refusal);
            return false;
        }
    }
    /* A browser form cannot send this type, and a script that sets it
     * makes the browser ask first (CORS), which nothing here grants. */
    if ((method == HTTP_METHOD_PUT || method == HTTP_METHOD_POST) &&
        (req->content_type == NULL ||
         !http_content_type_is_json(req->content_type, req->content_type_size))) {
        struct http_refusal refusal = {
            .status = 415, .reason = "PUT and POST take Content-Type: application/json"};
        answer_refusal(hc, &refusal);
        return false;
    }
    return true;
}

/* Hands a request under a prefix to its route, which answers now or later. */
static void dispatch_prefix(struct http_conn *hc, const struct http_route *route,
                            const struct http_request *req, enum http_method method,
                            size_t path_size, const struct auth_user *user)
{
    size_t n = strlen(route->path);
    if (path_size < n) /* a tree's bare path */
        n = path_size;
    const char *data = hc->big != NULL ? hc->big : hc->request;
    size_t query_at = path_size;
    while (query_at < req->target_size && req->target[query_at] != '?')
        query_at++;
    size_t query_end = query_at;
    while (query_end < req->target_size && req->target[query_end] != '#')
        query_end++;
    struct http_call_request call = {
        .method = method, .rest = req->target + n, .rest_size = path_size - n,
        .body = data + req->head_size, .body_size = req->content_length, .user = user,
        .query = req->target + query_at + (query_at < query_end),
        .query_size = query_end - query_at - (query_at < query_end),
        .authorization = req->authorization, .authorization_size = req->authorization_size};
    LOG_DEBUG("http conn=%llu peer=%s %.*s %.*s", (unsigned long long)hc->conn.id,
              hc->conn.peer_name, (int)req->method_size, req->method, (int)path_size,
              req->target);
    hc->state = HTTP_CONN_STATE_WAITING;
    hc->state_since_ms = uv_now(hc->server->net->loop);
    route->prefix(route->ctx, (struct http_call *)hc, &call);
}

/* The route for the request's method and path, or NULL once answered with
 * 404 or 405. */
static const struct http_route *find_target(struct http_conn *hc, const struct http_request *req,
                                            enum http_method method, size_t path_size)
{
    bool post = method == HTTP_METHOD_POST;
    const struct http_route *prefix = find_prefix(hc->server, req->target, path_size);
    if (prefix != NULL && (!post || prefix->tree))
        return prefix;
    const struct http_route *route = NULL;
    if (method != HTTP_METHOD_PUT && method != HTTP_METHOD_DELETE)
        route = find_route(hc->server, req->target, path_size, post);
    if (route != NULL)
        return route;
    bool get_exists = find_route(hc->server, req->target, path_size, false) != NULL;
    bool post_exists = find_route(hc->server, req->target, path_size, true) != NULL;
    if (post && get_exists)
        answer_error(hc, 405, "not an action", "Allow: GET, HEAD\r\n");
    else if (!post && post_exists)
        answer_error(hc, 405, "an action: POST it", "Allow: POST\r\n");
    else if (!post && method != HTTP_METHOD_GET && method != HTTP_METHOD_HEAD)
        answer_error(hc, 405, "only GET and HEAD here", "Allow: GET, HEAD\r\n");
    else
        answer_error_as(hc, 404, "Object Not Found", "Not Found", ""); /* RabbitMQ's words */
    return NULL;
}

/* Everything a request goes through before its route runs: the guard,
 * the method, the route, the admission. NULL once answered. */
static const struct http_route *admit_request(struct http_conn *hc,
                                              const struct http_request *req,
                                              enum http_method *method, size_t *path_size,
                                              const struct auth_user **user)
{
    if (!guard_passes(hc, req))
        return NULL;
    bool known = parse_method(req, method);
    hc->head_only = known && *method == HTTP_METHOD_HEAD;
    if (!known) {
        answer_error(hc, 405, "only GET, HEAD, POST, PUT and DELETE are served",
                     "Allow: GET, HEAD\r\n");
        return NULL;
    }
    size_t n = 0;
    while (n < req->target_size && req->target[n] != '?' && req->target[n] != '#')
        n++;
    if (n > 1 && req->target[n - 1] == '/')
        n--;
    *path_size = n;
    const struct http_route *route = find_target(hc, req, *method, n);
    if (route == NULL || !admitted(hc, req, *method, route, user))
        return NULL;
    return route;
}

/* Whether If-None-Match names etag (a list of quoted tags, maybe weak
 * "W/..."; "*" matches any). */
static bool etag_matches(const struct http_request *req, const char *etag)
{
    if (req->if_none_match == NULL)
        return false;
    size_t n = strlen(etag);
    const char *v = req->if_none_match;
    size_t size = req->if_none_match_size;
    if (size == 1 && v[0] == '*')
        return true;
    for (size_t i = 0; i + n <= size; i++) {
        if (memcmp(v + i, etag, n) == 0)
            return true;
    }
    return false;
}

/* A static file: the file, or 304 when the client's copy is this one.
 * no-cache means "ask each time", which the ETag makes a 304 of a few
 * bytes; the policy keeps the page from running anything but its own
 * script and from being framed by another site (clickjacking). */
static void answer_asset(struct http_conn *hc, const struct http_request *req,
                         const struct http_asset *asset)
{
    char headers[256];
    int n = snprintf(headers, sizeof headers,
                     "ETag: %s\r\n"
                     "X-Content-Type-Options: nosniff\r\n"
                     "Content-Security-Policy: default-src 'self'; frame-ancestors 'none'\r\n",
                     asset->etag);
    ASSERT(n > 0 && (size_t)n < sizeof headers);
    struct json body;
    http_body_init(&body);
    json_raw(&body, (const char *)asset->data, asset->size);
    bool fresh = etag_matches(req, asset->etag);
    /* A 304 has no body, and its Content-Length, if any, must be the
     * 200's (RFC 9110 8.6): the head of the 200, with the 304's status. */
    if (fresh)
        hc->head_only = true;
    LOG_DEBUG("http conn=%llu peer=%s %.*s %s: %d", (unsigned long long)hc->conn.id,
              hc->conn.peer_name, (int)req->method_size, req->method, asset->path,
              fresh ? 304 : 200);
    answer_as(hc, fresh ? 304 : 200, &body, headers, asset->content_type);
}

static void dispatch(struct http_conn *hc, const struct http_request *req)
{
    enum http_method method;
    size_t path_size;
    const struct auth_user *user;
    const struct http_route *route = admit_request(hc, req, &method, &path_size, &user);
    if (route == NULL)
        return;
    if (route->prefix != NULL) {
        dispatch_prefix(hc, route, req, method, path_size, user);
        return;
    }
    if (route->asset != NULL) {
        answer_asset(hc, req, route->asset);
        return;
    }
    if (route->later != NULL) {
        LOG_DEBUG("http conn=%llu peer=%s %.*s %.*s: answered later",
                  (unsigned long long)hc->conn.id, hc->conn.peer_name, (int)req->method_size,
                  req->method, (int)path_size, req->target);
        hc->state = HTTP_CONN_STATE_WAITING;
        hc->state_since_ms = uv_now(hc->server->net->loop);
        route->later(route->ctx, (struct http_call *)hc, user);
        return;
    }
    struct json body;
    http_body_init(&body);
    int status = 200;
    if (method == HTTP_METHOD_POST)
        status = route->action(route->ctx, (hc->big ? hc->big : hc->request) + req->head_size,
                               req->content_length,
                               &body);
    else if (route->view != NULL)
        route->view(route->ctx, user, &body);
    else
        route->handler(route->ctx, &body);
    LOG_DEBUG("http conn=%llu peer=%s %.*s %.*s: %d, %zu bytes",
              (unsigned long long)hc->conn.id, hc->conn.peer_name, (int)req->method_size,
              req->method, (int)path_size, req->target, status, body.size - HTTP_HEADROOM);
    answer(hc, status, &body, "");
}

/* ---- calls (prefix routes) ------------------------------------------------ */

void http_call_answer(struct http_call *call, int status, struct json *body)
{
    struct http_conn *hc = (struct http_conn *)call;
    ASSERT(hc->state == HTTP_CONN_STATE_WAITING);
    LOG_DEBUG("http conn=%llu peer=%s answered %d", (unsigned long long)hc->conn.id,
              hc->conn.peer_name, status);
    answer(hc, status, body, "");
}

void http_call_answer_text(struct http_call *call, int status, struct json *body,
                           const char *content_type, void (*release)(void *data))
{
    struct http_conn *hc = (struct http_conn *)call;
    ASSERT(hc->state == HTTP_CONN_STATE_WAITING);
    ASSERT(content_type != NULL);
    LOG_DEBUG("http conn=%llu peer=%s answered %d, %zu bytes", (unsigned long long)hc->conn.id,
              hc->conn.peer_name, status, body->size - HTTP_HEADROOM);
    answer_released(hc, status, body, "", content_type, release);
}

void http_call_answer_empty(struct http_call *call, int status)
{
    struct http_conn *hc = (struct http_conn *)call;
    ASSERT(hc->state == HTTP_CONN_STATE_WAITING);
    ASSERT(status == 201 || status == 204);
    struct json body;
    http_body_init(&body);
    answer_as(hc, status, &body, "", "application/json");
}

void http_call_answer_error(struct http_call *call, int status, const char *reason)
{
    struct http_conn *hc = (struct http_conn *)call;
    ASSERT(hc->state == HTTP_CONN_STATE_WAITING);
    answer_error(hc, status, reason, "");
}

const char *http_call_peer(const struct http_call *call)
{
    return ((const struct http_conn *)call)->conn.peer_name;
}

void http_call_answer_error_as(struct http_call *call, int status, const char *error,
                               const char *reason)
{
    struct http_conn *hc = (struct http_conn *)call;
    ASSERT(hc->state == HTTP_CONN_STATE_WAITING);
    answer_error_as(hc, status, error, reason, "");
}

void http_call_answer_refusal(struct http_call *call, const struct http_refusal *refusal)
{
    struct http_conn *hc = (struct http_conn *)call;
    ASSERT(hc->state == HTTP_CONN_STATE_WAITING);
    answer_refusal(hc, refusal);
}

void http_call_on_cancel(struct http_call *call, http_cancel_fn fn, void *arg)
{
    struct http_conn *hc = (struct http_conn *)call;
    ASSERT(hc->state == HTTP_CONN_STATE_WAITING);
    hc->cancel = fn;
    hc->cancel_arg = arg;
}

void http_call_progress(struct http_call *call)
{
    struct http_conn *hc = (struct http_conn *)call;
    ASSERT(hc->state == HTTP_CONN_STATE_WAITING);
    hc->state_since_ms = uv_now(hc->server->net->loop);
}

void http_wait_on_cancel(struct http_wait *wait, http_cancel_fn fn, void *arg)
{
    struct http_conn *hc = (struct http_conn *)wait;
    ASSERT(hc->state == HTTP_CONN_STATE_READING); /* from the hook: ADMITTING once it returns */
    hc->cancel = fn;
    hc->cancel_arg = arg;
}

void http_wait_resume(struct http_wait *wait)
{
    struct http_conn *hc = (struct http_conn *)wait;
    ASSERT(hc->state == HTTP_CONN_STATE_ADMITTING);
    hc->cancel = NULL;
    hc->state = HTTP_CONN_STATE_READING;
    hc->state_since_ms = uv_now(hc->server->net->loop); /* the wait was ours, not the client's */
    conn_resume_reading(&hc->conn, CONN_PAUSE_HOLD);
    uint8_t *stash = hc->stash;
    size_t stash_size = hc->stash_size;
    hc->stash = NULL;
    hc->stash_size = 0;
    static const uint8_t none[1];
    on_input(&hc->conn, stash != NULL ? stash : none, stash_size); /* dispatches */
    free(stash);
}

/* Input while the admission waits: kept for http_wait_resume. */
static void stash_input(struct http_conn *hc, const uint8_t *data, size_t size)
{
    if (size == 0)
        return;
    uint8_t *grown = xrealloc(hc->stash, hc->stash_size + size);
    memcpy(grown + hc->stash_size, data, size);
    hc->stash = grown;
    hc->stash_size += size;
}

/* A waiting call that can no longer be answered: its route forgets it. */
static void cancel_call(struct http_conn *hc)
{
    http_cancel_fn fn = hc->cancel;
    hc->cancel = NULL;
    if (fn != NULL)
        fn(hc->cancel_arg);
}

/* A request too big for request[]: the rest of its body goes to the heap,
 * grown as it arrives (never to more than what was sent). */
static void collect_big(struct http_conn *hc, const uint8_t *data, size_t size)
{
    if (hc->big == NULL) {
        hc->big_cap = 2u * HTTP_REQUEST_SIZE_MAX;
        hc->big = xmalloc(hc->big_cap);
        memcpy(hc->big, hc->request, hc->request_size);
        hc->big_size = hc->request_size;
    }
    if (hc->big_size + size > hc->big_cap) {
        while (hc->big_size + size > hc->big_cap)
            hc->big_cap *= 2;
        hc->big = xrealloc(hc->big, hc->big_cap);
    }
    memcpy(hc->big + hc->big_size, data, size);
    hc->big_size += size;
}

/* Whether a request whose body needs the heap may send it: it must pass
 * everything its dispatch will check (so a stranger cannot make the
 * server hold megabytes). The checks run again at dispatch. */
static bool admitted_for_big(struct http_conn *hc, const struct http_request *req)
{
    enum http_method method;
    size_t path_size;
    const struct auth_user *user;
    return admit_request(hc, req, &method, &path_size, &user) != NULL;
}

/* Input once the head is known to need the heap: the request is whole
 * once head and body are there. */
static long on_big_input(struct http_conn *hc, const uint8_t *data, size_t size)
{
    collect_big(hc, data, size);
    struct http_request req;
    int rc = http_parse_request(hc->big, hc->big_size, &req);
    ASSERT(rc == OK); /* the head parsed before */
    if (req.head_size + req.content_length <= hc->big_size)
        dispatch(hc, &req);
    return (long)size;
}

static long on_input(struct conn *conn, const uint8_t *data, size_t size)
{
    struct http_conn *hc = from_conn(conn);
    if (hc->state == HTTP_CONN_STATE_ADMITTING) {
        stash_input(hc, data, size); /* reading is paused: what one read brought */
        return (long)size;
    }
    if (hc->state != HTTP_CONN_STATE_READING)
        return (long)size; /* answered: whatever else comes is dropped */
    if (hc->big != NULL)
        return on_big_input(hc, data, size);
    size_t room = HTTP_REQUEST_SIZE_MAX - hc->request_size;
    size_t take = size < room ? size : room;
    memcpy(hc->request + hc->request_size, data, take);
    hc->request_size += (uint32_t)take;
    struct http_request req;
    int rc = http_parse_request(hc->request, hc->request_size, &req);
    if (rc == OK && req.content_length > HTTP_BODY_SIZE_MAX) {
        hc->server->glitches_count++;
        answer_error(hc, 413, "the request body is over 16 MiB", "");
    } else if (rc == OK && req.head_size + req.content_length > HTTP_REQUEST_SIZE_MAX &&
               hc->big == NULL && !admitted_for_big(hc, &req)) {
        /* answered: a body past 8 KiB is taken from admitted users only;
         * or the admission waits, and the rest is offered again then */
        if (hc->state == HTTP_CONN_STATE_ADMITTING)
            stash_input(hc, data + take, size - take);
    } else if (rc == OK && req.head_size + req.content_length > HTTP_REQUEST_SIZE_MAX) {
        collect_big(hc, data + take, size - take);
        if (req.head_size + req.content_length <= hc->big_size) {
            http_parse_request(hc->big, hc->big_size, &req); /* slices into big */
            dispatch(hc, &req);
        }
    } else if (rc == OK && req.head_size + req.content_length <= hc->request_size) {
        dispatch(hc, &req);
    } else if (rc == OK) {
        /* the body is still coming */
    } else if (rc == AGAIN) {
        if (hc->request_size == HTTP_REQUEST_SIZE_MAX) {
            hc->server->glitches_count++;
            if (req.line_complete)
                answer_error(hc, 431, "the request head is over 8 KiB", "");
            else
                answer_error(hc, 414, "the request line is over 8 KiB", "");
        }
    } else {
        hc->server->glitches_count++;
        answer_error(hc, req.status, req.reason, "");
    }
    /* Everything is consumed: a partial head lives in hc->request, so the
     * transport keeps no buffer of its own. */
    return (long)size;
}

static void on_close(struct conn *conn)
{
    struct http_conn *hc = from_conn(conn);
    if (hc->state == HTTP_CONN_STATE_WAITING || hc->state == HTTP_CONN_STATE_ADMITTING)
        cancel_call(hc);
}

static void on_free(struct conn *conn)
{
    struct http_conn *hc = from_conn(conn);
    struct http_server *server = hc->server;
    free(hc->big);
    hc->big = NULL;
    free(hc->stash);
    hc->stash = NULL;
    list_remove(&hc->server_link);
    ASSERT(server->conns_count > 0);
    server->conns_count--;
    pool_put(&server->conn_pool, hc);
}

/* ---- the server -------------------------------------------------------- */

static struct conn *http_accept(struct net *net, void *ctx)
{
    struct http_server *server = ctx;
    struct http_conn *hc = pool_get(&server->conn_pool);
    if (conn_init(&hc->conn, net, &http_conn_ops) != 0) {
        pool_put(&server->conn_pool, hc);
        return NULL;
    }
    hc->server = server;
    hc->state = HTTP_CONN_STATE_READING;
    hc->head_only = false;
    hc->cancel = NULL;
    hc->admission_memo = 0;
    hc->stash = NULL;
    hc->stash_size = 0;
    hc->state_since_ms = uv_now(net->loop);
    hc->request_size = 0;
    hc->big = NULL;
    hc->big_size = hc->big_cap = 0;
    list_push_back(&server->conns, &hc->server_link);
    server->conns_count++;
    if (server->conns_count > HTTP_CONNS_MAX || server->closed) {
        LOG_WARN("http conn=%llu refused: %u management clients at once",
                 (unsigned long long)hc->conn.id, HTTP_CONNS_MAX);
        hc->conn.refused = true; /* the listener accepts, then closes */
    }
    return &hc->conn;
}

/* Clients that take too long to ask, or to read the answer, are cut: a
 * request gets a 408, a stalled reader just loses its socket. */
static void on_timer(uv_timer_t *timer)
{
    struct http_server *server = timer->data;
    uint64_t now = uv_now(server->net->loop);
    list_for_each_safe(node, &server->conns) {
        struct http_conn *hc = CONTAINER_OF(node, struct http_conn, server_link);
        if (hc->conn.closing)
            continue;
        if (hc->state == HTTP_CONN_STATE_READING) {
            if (now - hc->state_since_ms >= server->timeout_ms) {
                server->glitches_count++;
                answer_error(hc, 408, "no complete request within the timeout", "");
            }
            continue;
        }
        if (hc->state == HTTP_CONN_STATE_WAITING || hc->state == HTTP_CONN_STATE_ADMITTING) {
            /* Routes answer within their own deadline (a cluster change
             * within 5 s), password checks in a fraction of a second
             * unless many wait; this is the backstop. */
            if (now - hc->state_since_ms >= 2u * server->timeout_ms) {
                cancel_call(hc);
                answer_error(hc, 503, "no answer in time", "");
            }
            continue;
        }
        uint64_t progress_ms = hc->state_since_ms > hc->conn.last_write_ms
                                   ? hc->state_since_ms
                                   : hc->conn.last_write_ms;
        if (now - progress_ms >= server->timeout_ms) {
            LOG_DEBUG("http conn=%llu peer=%s does not read its answer: closed",
                      (unsigned long long)hc->conn.id, hc->conn.peer_name);
            conn_close(&hc->conn);
        }
    }
}

int http_server_open(struct http_server *server, struct net *net, const char *address)
{
    ASSERT(net != NULL);
    ASSERT(address != NULL);
    ASSERT(server->net == NULL); /* zeroed, with at most routes added */
    server->net = net;
    server->timeout_ms = HTTP_TIMEOUT_MS;
    list_init(&server->conns);
    pool_init(&server->conn_pool, "http client", sizeof(struct http_conn), 4);
    int rc = listener_open(&server->listener, net, address, http_accept, server);
    if (rc != 0) {
        server->closed = true; /* nothing is open: http_server_free may follow */
        return rc;
    }
    server->listening = true;
    uv_timer_init(net->loop, &server->timer);
    server->timer.data = server;
    uv_timer_start(&server->timer, on_timer, HTTP_TICK_MS, HTTP_TICK_MS);
    uv_unref((uv_handle_t *)&server->timer); /* clients keep the loop alive, not this */
    return 0;
}

void http_server_use_tls(struct http_server *server, struct tls_context *tls)
{
    ASSERT(server->listening);
    server->listener.tls = tls;
}

void http_server_guard(struct http_server *server, http_admit_fn admit, void *ctx,
                       const char *allowed_hosts)
{
    ASSERT(server->net == NULL); /* before open */
    server->admit = admit;
    server->admit_ctx = ctx;
    server->allowed_hosts = allowed_hosts;
}

static void add_route(struct http_server *server, struct http_route route)
{
    ASSERT(server->routes_count < HTTP_ROUTES_MAX);
    ASSERT(route.path[0] == '/');
    server->routes[server->routes_count++] = route;
}

void http_server_route(struct http_server *server, const char *path, http_handler_fn handler,
                       void *ctx, uint32_t access)
{
    ASSERT(handler != NULL);
    add_route(server,
              (struct http_route){.path = path, .handler = handler, .ctx = ctx, .access = access});
}

void http_server_route_view(struct http_server *server, const char *path, http_view_fn view,
                            void *ctx, uint32_t access)
{
    ASSERT(view != NULL);
    add_route(server,
              (struct http_route){.path = path, .view = view, .ctx = ctx, .access = access});
}

void http_server_route_later(struct http_server *server, const char *path, http_later_fn later,
                             void *ctx, uint32_t access)
{
    ASSERT(later != NULL);
    add_route(server,
              (struct http_route){.path = path, .later = later, .ctx = ctx, .access = access});
}

void http_server_route_asset(struct http_server *server, const struct http_asset *asset)
{
    ASSERT(asset != NULL);
    ASSERT(asset->etag != NULL);
    ASSERT(asset->content_type != NULL);
    add_route(server, (struct http_route){.path = asset->path, .asset = asset});
}

void http_server_route_post(struct http_server *server, const char *path, http_action_fn action,
                            void *ctx, uint32_t access)
{
    ASSERT(action != NULL);
    add_route(server,
              (struct http_route){.path = path, .action = action, .ctx = ctx, .access = access});
}

void http_server_route_prefix(struct http_server *server, const char *prefix,
                              http_prefix_fn handler, void *ctx, uint32_t access)
{
    ASSERT(prefix[strlen(prefix) - 1] == '/');
    ASSERT(handler != NULL);
    add_route(server, (struct http_route){.path = prefix, .prefix = handler, .ctx = ctx,
                                          .access = access});
}

void http_server_route_tree(struct http_server *server, const char *prefix,
                            http_prefix_fn handler, void *ctx, uint32_t access)
{
    ASSERT(prefix[strlen(prefix) - 1] == '/');
    ASSERT(handler != NULL);
    add_route(server, (struct http_route){.path = prefix, .prefix = handler, .tree = true,
                                          .ctx = ctx, .access = access});
}

void http_server_close(struct http_server *server)
{
    if (server->closed)
        return;
    server->closed = true;
    if (server->listening) {
        listener_close(&server->listener);
        server->listening = false;
    }
    uv_timer_stop(&server->timer);
    uv_close((uv_handle_t *)&server->timer, NULL);
    list_for_each_safe(node, &server->conns) {
        conn_close(&CONTAINER_OF(node, struct http_conn, server_link)->conn);
    }
}

void http_server_free(struct http_server *server)
{
    ASSERT(server->closed);
    ASSERT(list_empty(&server->conns));
    pool_destroy(&server->conn_pool);
}
