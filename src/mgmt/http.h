/*
 * http.h: a small HTTP/1.1 server on the broker's loop, for the
 * management API. It serves GET (and HEAD) of registered paths with a JSON
 * body, static files (the web console's: http_asset), POST actions, and
 * GET/PUT/DELETE under registered prefixes (a resource such as
 * /api/policies/VHOST/NAME, answered now or later), one request per
 * connection ("Connection: close"), and nothing else: request
 * bodies only with Content-Length, no keep-alive, no chunked encoding;
 * over TLS when http_server_use_tls says so (net/conn_tls.c does it).
 *
 * Transport: each client is a struct conn (net/conn.h) with its own
 * conn_ops, accepted by a struct listener, exactly like an AMQP client, so
 * output buffering, deferred destruction and shutdown are shared.
 *
 * Limits, each an answer rather than a crash:
 *   - the request head (request line + headers) is at most
 *     HTTP_REQUEST_SIZE_MAX bytes: 414 if the request line alone does
 *     not fit, 431 if the headers do not; the body at most
 *     HTTP_BODY_SIZE_MAX (413); a Transfer-Encoding is 400;
 *   - a malformed head is 400, an HTTP major version other than 1 is 505,
 *     a method other than GET/HEAD (or POST, for an action) is 405, an
 *     unknown path 404;
 *   - a client has HTTP_TIMEOUT_MS to send its head (then 408 and close)
 *     and, once answered, to keep reading the answer (then it is cut);
 *   - at most HTTP_CONNS_MAX clients at once; more are accepted and
 *     closed at once.
 * Memory: a client's struct (its fixed request buffer included) comes from
 * a counted pool, so a request allocates nothing but its response buffer,
 * which is handed to the transport by reference (no copy) and freed once
 * written.
 *
 * Who may ask: before a request reaches its route, its Host and Origin
 * headers must show it does not come from another site through a browser
 * (403 otherwise, http_guard.h says why), and once the route is known the
 * server's owner admits it or not (http_admit_fn: authentication and
 * rights, 401); a PUT or POST must be Content-Type: application/json
 * (415). A route's handler learns who asked (the admitted user).
 *
 * The request parser (http_parse_request) is pure: bytes in, a verdict
 * out, so it can be fuzzed apart from the sockets.
 */
#ifndef QUAY_MGMT_HTTP_H
#define QUAY_MGMT_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "lib/http_status.h"
#include "lib/list.h"
#include "lib/pool.h"
#include "net/conn.h"
#include "net/listener.h"

struct json;
struct auth_user;
struct tls_context;
struct http_request;

#define HTTP_REQUEST_SIZE_MAX 8192u
#define HTTP_TIMEOUT_MS 5000u
#define HTTP_CONNS_MAX 64u
#define HTTP_ROUTES_MAX 64u
/* A request body past the 8 KiB head buffer (a definitions import) is
 * collected on the heap as it arrives, up to this many bytes. */
#define HTTP_BODY_SIZE_MAX (16u * 1024u * 1024u)

/* Writes the response body for a GET of the route's path: exactly one
 * JSON value. */
typedef void (*http_handler_fn)(void *ctx, struct json *body);

/* Writes the response body for a GET of the route's path, for the user
 * who asked (what it shows may depend on who that is). */
typedef void (*http_view_fn)(void *ctx, const struct auth_user *user, struct json *body);

/* A POST action: reads the request's body (Content-Length bytes, maybe
 * none; untrusted), writes a JSON body and returns the HTTP status (200,
 * 202, 409...). */
typedef int (*http_action_fn)(void *ctx, const char *request, size_t request_size,
                              struct json *body);

enum http_method {
    HTTP_METHOD_GET,
    HTTP_METHOD_HEAD,
    HTTP_METHOD_POST,
    HTTP_METHOD_PUT,
    HTTP_METHOD_DELETE,
};

/* One request to a prefix route, from dispatch until it is answered (or
 * its client is gone). Owned by the server. */
struct http_call;

/* What a prefix route gets. The slices live until the call is answered. */
struct http_call_request {
    enum http_method method;
    const char *rest;              /* the path after the prefix, still %-encoded */
    size_t rest_size;
    const char *body;              /* Content-Length bytes (none: size 0) */
    size_t body_size;
    const char *query;             /* after '?', still %-encoded (none: size 0) */
    size_t query_size;
    /* The Authorization header (admitted), for a route that acts as the
     * user over AMQP (api_amqp.h); NULL when absent. */
    const char *authorization;
    size_t authorization_size;
    const struct auth_user *user;  /* borrowed: who asked (NULL: no admission hook) */
};

/* Why a request is not served, for http_admit_fn and routes' own checks. */
struct http_refusal {
    int status;                    /* 400, 401 or 403 */
    const char *error;             /* static: the body's "error"; NULL = the status text */
    const char *reason;            /* static: the body's "reason" */
    bool challenge;                /* a login is missing: add WWW-Authenticate */
};

/* A request whose admission waits (below). */
struct http_wait;

/* What the admission hook is asked about. */
struct http_admission {
    enum http_method method;
    uint32_t access;               /* the route's, as registered (the owner's meaning) */
    const struct http_request *request; /* its headers */
    bool peer_loopback;            /* the client's address is a loopback one */
    /* For a hook that answers AGAIN: the request's handle, and a value
     * the server keeps for the hook with the request (0 at first). */
    struct http_wait *wait;
    int *memo;
};

/* Decides whether a request may reach its route: OK with *user set (who
 * asked, handed to the route), or an error with *refusal filled in, or
 * AGAIN: the answer needs a slow check (a PBKDF2 password,
 * broker/login.h). Then the server reads no more of the client and
 * answers nothing until the hook calls http_wait_resume, and asks the
 * hook again with the same request (the hook's memo tells it it asked);
 * if the client goes first, the cancel hook set with http_wait_on_cancel
 * runs. */
typedef int (*http_admit_fn)(void *ctx, const struct http_admission *admission,
                             const struct auth_user **user, struct http_refusal *refusal);

/* Handles a request under a prefix: answers it, now or later, exactly once
 * with http_call_answer*() (not at all once its cancel hook ran). */
typedef void (*http_prefix_fn)(void *ctx, struct http_call *call,
                               const struct http_call_request *req);
/* The client of a pending call went away (or the server closes): the call
 * must not be answered any more. */
typedef void (*http_cancel_fn)(void *arg);

/* An admission hook's AGAIN: fn(arg) runs if the client goes first. */
void http_wait_on_cancel(struct http_wait *wait, http_cancel_fn fn, void *arg);
/* The hook can answer now: the request is admitted again (at once). */
void http_wait_resume(struct http_wait *wait);

/* GET (and HEAD) of an exact path answered later, with text: the handler
 * answers the call once with http_call_answer_text (not at all once its
 * cancel hook ran), after as many loop turns as it needs (GET /metrics
 * writes 50,000 queues a slice a turn, mgmt/metrics.c). */
typedef void (*http_later_fn)(void *ctx, struct http_call *call, const struct auth_user *user);

/* A static file served as it is (the web console's page, style and
 * script), to anyone who passes the Host and Origin checks: without
 * admission, because it holds none of the broker's data (the page asks
 * for credentials and sends them with its /api requests). Static. */
struct http_asset {
    const char *path;              /* "/", "/console.js" */
    const char *content_type;      /* "text/html; charset=utf-8" */
    const uint8_t *data;
    size_t size;
    /* A strong validator of data (a hash of it), quoted as HTTP wants:
     * answered as ETag, compared with If-None-Match (304). */
    const char *etag;
};

struct http_route {
    const char *path;              /* borrowed, static: "/api/queues" or a prefix "/api/x/" */
    http_handler_fn handler;       /* GET (and HEAD), or NULL */
    http_view_fn view;             /* GET (and HEAD) that depends on the user, or NULL */
    http_action_fn action;         /* POST, or NULL */
    http_prefix_fn prefix;         /* anything under path, or NULL */
    /* A prefix route that also takes its bare path (path without the
     * trailing '/', rest empty) and POST: RabbitMQ's resource trees such
     * as /api/queues[/{vhost}[/{name}[/get]]]. */
    bool tree;
    http_later_fn later;           /* GET (and HEAD) answered later with text, or NULL */
    /* A static file for GET and HEAD, served without admission; NULL: not one. */
    const struct http_asset *asset;
    void *ctx;                     /* borrowed */
    uint32_t access;               /* for the admission hook */
};

/* Owned by its user (the management API); lives until http_server_free. */
struct http_server {
    struct net *net;               /* borrowed: the broker's transport */
    struct listener listener;
    bool listening;
    bool closed;
    struct http_route routes[HTTP_ROUTES_MAX];
    uint32_t routes_count;
    struct list_node conns;        /* struct http_conn.server_link */
    uint32_t conns_count;
    struct pool conn_pool;         /* struct http_conn */
    uv_timer_t timer;              /* request and write timeouts */
    uint32_t timeout_ms;
    uint64_t requests_count;       /* answered, any status */
    uint64_t glitches_count;       /* malformed, oversized or timed-out requests */
    uint64_t refused_count;        /* refused by the Host/Origin checks or the admission */
    http_admit_fn admit;           /* NULL: every request is admitted (no user) */
    void *admit_ctx;               /* borrowed */
    const char *allowed_hosts;     /* borrowed: names Host may give (http_guard.h), or NULL */
};

/* Listens on address ("HOST:PORT", see listener.h). The server must be
 * zeroed, apart from routes already added. Returns 0, or a libuv error
 * after which the server is closed (its listener's handle may still be
 * closing: run the loop before http_server_free). */
int http_server_open(struct http_server *server, struct net *net, const char *address);
/* Serves HTTPS from now on: every client accepted is a TLS server with
 * tls's current settings (borrowed; outlives the server). After open. */
void http_server_use_tls(struct http_server *server, struct tls_context *tls);
/* Sets who decides admission, and the names Host may give besides this
 * server's own address (comma-separated; borrowed, outlives the server).
 * Before open. */
void http_server_guard(struct http_server *server, http_admit_fn admit, void *ctx,
                       const char *allowed_hosts);
/* Registers a GET handler for an exact path (a trailing '/' and a query
 * string of the request are ignored when matching). Before or after open.
 * access is handed to the admission hook with each request to the route. */
void http_server_route(struct http_server *server, const char *path, http_handler_fn handler,
                       void *ctx, uint32_t access);
/* The same for a handler whose answer depends on who asks. */
void http_server_route_view(struct http_server *server, const char *path, http_view_fn view,
                            void *ctx, uint32_t access);
/* Registers a GET handler for an exact path that answers later (http_later_fn). */
void http_server_route_later(struct http_server *server, const char *path, http_later_fn later,
                             void *ctx, uint32_t access);
/* Serves a static file at asset->path (borrowed, static) for GET and
 * HEAD, without admission (struct http_asset says why), with its ETag;
 * a request whose If-None-Match names it gets 304 without the body. */
void http_server_route_asset(struct http_server *server, const struct http_asset *asset);
/* Registers a POST action for an exact path. */
void http_server_route_post(struct http_server *server, const char *path, http_action_fn action,
                            void *ctx, uint32_t access);
/* Registers a handler for every path that starts with prefix (which ends
 * with '/') and goes on past it, for GET, HEAD, PUT and DELETE. */
void http_server_route_prefix(struct http_server *server, const char *prefix,
                              http_prefix_fn handler, void *ctx, uint32_t access);
/* The same, for a whole resource tree (see http_route.tree): prefix ends
 * with '/'; GET, HEAD, PUT, DELETE and POST of prefix's bare path and of
 * every path under it. */
void http_server_route_tree(struct http_server *server, const char *prefix,
                            http_prefix_fn handler, void *ctx, uint32_t access);
/* A response body for http_call_answer (space for the head reserved). */
void http_body_init(struct json *body);
/* Answers a call (status 200..503, body one complete JSON value, which
 * the server takes). The call is gone afterwards. */
void http_call_answer(struct http_call *call, int status, struct json *body);
/* Answers a call with text of content_type (static) written with
 * json_raw into a body from http_body_init; release (or free(), NULL) is
 * called on the buffer once it is written or the client is gone. */
void http_call_answer_text(struct http_call *call, int status, struct json *body,
                           const char *content_type, void (*release)(void *data));
/* Answers 201 or 204 without a body (RabbitMQ's answer to a PUT or
 * DELETE). */
void http_call_answer_empty(struct http_call *call, int status);
/* RabbitMQ's error shape: {"error": status text, "reason": reason}. */
void http_call_answer_error(struct http_call *call, int status, const char *reason);
/* The client's address ("ADDR:PORT"), for logs. */
const char *http_call_peer(const struct http_call *call);
/* {"error": error, "reason": reason}: RabbitMQ's words ("bad_request",
 * "Object Not Found") rather than the status text. */
void http_call_answer_error_as(struct http_call *call, int status, const char *error,
                               const char *reason);
/* Refuses a call the route's own checks do not let through. */
void http_call_answer_refusal(struct http_call *call, const struct http_refusal *refusal);
/* For a call answered later: fn(arg) runs if it cannot be answered. */
void http_call_on_cancel(struct http_call *call, http_cancel_fn fn, void *arg);
/* A call answered later whose route is still working on it (a list built
 * in slices: api_list_slices.c): the backstop (503 "no answer in time",
 * 2 x HTTP_TIMEOUT_MS without an answer) counts from now. */
void http_call_progress(struct http_call *call);
/* Stops listening and closes every client. Idempotent. */
void http_server_close(struct http_server *server);
/* After the loop ran the close callbacks: frees the pool (asserting that
 * every client came back). */
void http_server_free(struct http_server *server);

/* ---- the request parser (pure) ---------------------------------------- */

struct http_request {
    const char *method;            /* slices into the parsed bytes */
    size_t method_size;
    const char *target;            /* origin-form: starts with '/' */
    size_t target_size;
    uint8_t version_minor;         /* HTTP/1.x */
    size_t head_size;              /* bytes up to and including the blank line */
    size_t content_length;         /* 0 without a Content-Length */
    bool has_length;               /* a Content-Length header was seen */
    /* The values of the headers the guard reads (http_guard.h), without
     * the whitespace around them; NULL when absent. Each may appear once
     * (a second one is 400: two answers to one question are a trick). */
    const char *host;
    size_t host_size;
    const char *origin;
    size_t origin_size;
    const char *authorization;
    size_t authorization_size;
    const char *content_type;
    size_t content_type_size;
    const char *if_none_match;     /* for a static file's 304 (http_asset) */
    size_t if_none_match_size;
    bool line_complete;            /* the request line ended (for 414 vs 431) */
    /* When the verdict is E_SYNTAX: the status to answer and why. */
    int status;
    const char *reason;            /* static text */
};

/* Parses the request head in data[0..size). Returns OK once the blank line
 * that ends the head is there, AGAIN if more bytes are needed, or E_SYNTAX
 * with req->status (400, 413 or 505) and req->reason set. Bytes after the
 * head (the body, content_length of them) are not looked at. */
int http_parse_request(const char *data, size_t size, struct http_request *req);

/* %-decodes s[0..size) (a path segment, or with plus a query value, where
 * '+' is a space) into out[0..cap). Returns the decoded size, or -1 for a
 * bad escape or more than cap bytes. The API's path and query readers
 * share it. */
long http_percent_decode(const char *s, size_t size, uint8_t *out, size_t cap, bool plus);

#endif
