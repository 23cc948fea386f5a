/*
 * fuzz_http.c: the management API's request parser and the header checks
 * a stranger's request reaches before any login (mgmt/http.h,
 * mgmt/http_guard.h, lib/base64.h).
 *
 * Goal: http_parse_request never reads outside its input and its verdict
 * is consistent (OK: the head ends inside the input, every header slice
 * lies inside it; E_SYNTAX: a 4xx/505 status and a reason); the Basic,
 * Host, Origin and Content-Type checks never read outside the slices they
 * get; Basic credentials are slices of their decoded bytes; base64 decodes
 * only canonical input (decoding then encoding gives the input back).
 * Method: the input is a request head; each guarded header it holds goes
 * through its check (Host against an IPv4 and an IPv6 local address, with
 * and without an allowed list). The whole input also goes to the base64
 * decoder and to the Basic parser as one header value.
 */
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "lib/assert.h"
#include "lib/base64.h"
#include "lib/errors.h"
#include "mgmt/http.h"
#include "mgmt/http_guard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_slice(const char *slice, size_t slice_size, const char *data, size_t size)
{
    if (slice == NULL)
        return;
    ASSERT(slice >= data);
    ASSERT(slice_size <= size - (size_t)(slice - data));
}

static void check_basic(const char *value, size_t size)
{
    struct http_credentials c;
    if (http_basic_parse(value, size, &c) != HTTP_BASIC_OK)
        return;
    ASSERT(c.user == c.decoded);
    ASSERT(c.user_size + 1 + c.password_size <= sizeof c.decoded);
    ASSERT(c.password == c.decoded + c.user_size + 1);
    ASSERT(memchr(c.user, ':', c.user_size) == NULL);
}

static void check_host(const char *host, size_t size)
{
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    (void)http_host_allowed(host, size, (const struct sockaddr *)&v4, NULL);
    (void)http_host_allowed(host, size, (const struct sockaddr *)&v6, "mq.example,[::1],x");
}

static void check_base64(const uint8_t *data, size_t size)
{
    static uint8_t out[6144];
    static char again[8200];
    size_t n = 0;
    if (size >= sizeof again)
        return;
    if (base64_decode((const char *)data, size, out, sizeof out, &n) != OK)
        return;
    ASSERT(n <= size / 4 * 3);
    base64_encode(out, n, again);
    ASSERT(strlen(again) == size);
    ASSERT(memcmp(again, data, size) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    check_base64(data, size);
    check_basic(text, size);
    struct http_request req;
    int rc = http_parse_request(text, size, &req);
    if (rc == E_SYNTAX) {
        ASSERT(req.status >= 400 && req.status <= 505);
        ASSERT(req.reason != NULL);
        return 0;
    }
    ASSERT(rc == OK || rc == AGAIN);
    if (rc != OK)
        return 0;
    ASSERT(req.head_size <= size);
    check_slice(req.method, req.method_size, text, req.head_size);
    check_slice(req.target, req.target_size, text, req.head_size);
    check_slice(req.host, req.host_size, text, req.head_size);
    check_slice(req.origin, req.origin_size, text, req.head_size);
    check_slice(req.authorization, req.authorization_size, text, req.head_size);
    check_slice(req.content_type, req.content_type_size, text, req.head_size);
    if (req.authorization != NULL)
        check_basic(req.authorization, req.authorization_size);
    if (req.host != NULL) {
        check_host(req.host, req.host_size);
        if (req.origin != NULL)
            (void)http_origin_is_own(req.origin, req.origin_size, req.host, req.host_size,
                                     size % 2 == 0);
    }
    if (req.content_type != NULL)
        (void)http_content_type_is_json(req.content_type, req.content_type_size);
    return 0;
}
