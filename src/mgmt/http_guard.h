/*
 * http_guard.h: the checks a management request passes on its headers,
 * as pure functions of their values (no sockets, no allocation), so that
 * they are unit-tested and fuzzed (tests/fuzz/fuzz_http.c) apart from the
 * server. http.c applies them; api.c decides what a logged-in user may do.
 *
 * Why these checks (the management API changes broker state, and a web
 * browser is a stranger's program running inside the operator's network):
 *
 *   - Host. A page from evil.example can make its own name resolve to
 *     127.0.0.1 (DNS rebinding) and then talk to the API as "same origin"
 *     as far as the browser can tell; only the Host header still says
 *     evil.example. So Host must be a name this server answers to: an IP
 *     address literal equal to the address the client connected to, a
 *     loopback name (localhost, 127.0.0.1, [::1]) when that address is
 *     loopback, or a name the operator listed (--http-allowed-hosts). An
 *     address literal cannot be rebound, so it needs no listing.
 *   - Origin. Browsers send it with every cross-site request that can
 *     change anything (and with fetch/XHR generally); tools (curl,
 *     quayctl, urllib) do not. A request whose Origin is present and is
 *     not "http://" + its own Host is refused, so no other site's page
 *     can use the API through the operator's browser, credentials or not.
 *   - Content-Type. A PUT or POST must say application/json: an HTML form
 *     cannot (its types are form-urlencoded, multipart and text/plain),
 *     and a script that sets it makes the browser ask first (a CORS
 *     preflight, OPTIONS, which this server does not grant). This covers
 *     old browsers that send no Origin on a form POST.
 *   - Authorization. HTTP Basic (RFC 7617) against the broker's users.
 */
#ifndef QUAY_MGMT_HTTP_GUARD_H
#define QUAY_MGMT_HTTP_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Decoded credentials longer than this are malformed (a user name and
 * password of RabbitMQ's sizes fit many times over). */
#define HTTP_CREDENTIALS_SIZE_MAX 1024u

/* What an Authorization header holds. */
enum http_basic {
    HTTP_BASIC_OK,          /* Basic credentials: *user and *password set */
    HTTP_BASIC_OTHER,       /* another scheme (Bearer...): not a login we know */
    HTTP_BASIC_MALFORMED,   /* Basic, but not base64 of "user:password" */
};

struct http_credentials {
    uint8_t decoded[HTTP_CREDENTIALS_SIZE_MAX];
    const uint8_t *user;          /* slices of decoded */
    size_t user_size;
    const uint8_t *password;
    size_t password_size;
};

/* Parses an Authorization value ("Basic" 1*SP token68, the scheme in any
 * case, surrounding whitespace ignored). The user ends at the first ':'
 * (RFC 7617 2: a user-id has none). */
enum http_basic http_basic_parse(const char *value, size_t size, struct http_credentials *out);

/* Whether a Host value (host [":" port]) names this server: local is the
 * address the client connected to (an AF_INET or AF_INET6 sockaddr),
 * allowed the operator's comma-separated names (NULL = none), compared
 * without case and without the port. */
bool http_host_allowed(const char *host, size_t host_size, const struct sockaddr *local,
                       const char *allowed);

/* Whether an Origin value is the API's own origin: "http://" (tls:
 * "https://") followed by the Host value exactly (without case). "null"
 * and every other origin is foreign. */
bool http_origin_is_own(const char *origin, size_t origin_size, const char *host,
                        size_t host_size, bool tls);

/* Whether a Content-Type value is application/json (parameters allowed). */
bool http_content_type_is_json(const char *value, size_t size);

#endif
