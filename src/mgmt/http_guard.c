/*
 * http_guard.c: see http_guard.h. Every function reads only the slice it
 * is given (header values are not NUL-terminated) and writes only its
 * out-parameters.
 */
#include "mgmt/http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "lib/assert.h"
#include "lib/base64.h"
#include "lib/errors.h"

#define HOST_NAME_SIZE_MAX 255u
#define PORT_DIGITS_MAX 5u

/* a[0..n) and b[0..n) equal without ASCII case (NUL is a byte like any
 * other: the slices are not C strings). */
static bool same_nocase(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char x = (unsigned char)a[i], y = (unsigned char)b[i];
        if (x >= 'A' && x <= 'Z')
            x = (unsigned char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (unsigned char)(y - 'A' + 'a');
        if (x != y)
            return false;
    }
    return true;
}

static void trim(const char **s, size_t *size)
{
    while (*size > 0 && (**s == ' ' || **s == '\t'))
        (*s)++, (*size)--;
    while (*size > 0 && ((*s)[*size - 1] == ' ' || (*s)[*size - 1] == '\t'))
        (*size)--;
}

/* ---- Authorization: Basic ------------------------------------------------- */

enum http_basic http_basic_parse(const char *value, size_t size, struct http_credentials *out)
{
    trim(&value, &size);
    size_t scheme_size = 0;
    while (scheme_size < size && value[scheme_size] != ' ' && value[scheme_size] != '\t')
        scheme_size++;
    if (scheme_size != 5 || !same_nocase(value, "basic", 5))
        return HTTP_BASIC_OTHER;
    const char *token = value + scheme_size;
    size_t token_size = size - scheme_size;
    trim(&token, &token_size);
    if (token_size == 0 || token == value + scheme_size)
        return HTTP_BASIC_MALFORMED; /* "Basic" alone, or no space after it */
    size_t decoded_size = 0;
    if (base64_decode(token, token_size, out->decoded, sizeof out->decoded, &decoded_size) != OK)
        return HTTP_BASIC_MALFORMED;
    ASSERT(decoded_size <= sizeof out->decoded);
    const uint8_t *colon = decoded_size ? memchr(out->decoded, ':', decoded_size) : NULL;
    if (colon == NULL)
        return HTTP_BASIC_MALFORMED;
    out->user = out->decoded;
    out->user_size = (size_t)(colon - out->decoded);
    out->password = colon + 1;
    out->password_size = decoded_size - out->user_size - 1;
    return HTTP_BASIC_OK;
}

/* ---- Host ---------------------------------------------------------------- */

/* An address in a comparable form: IPv4 (and IPv4-mapped IPv6) as 4
 * bytes, IPv6 as 16. */
struct address {
    uint8_t bytes[16];
    size_t size;
};

static void address_of_v6(const uint8_t in6[16], struct address *out)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(in6, v4mapped, sizeof v4mapped) == 0) {
        memcpy(out->bytes, in6 + 12, 4);
        out->size = 4;
    } else {
        memcpy(out->bytes, in6, 16);
        out->size = 16;
    }
}

static bool address_of_sockaddr(const struct sockaddr *sa, struct address *out)
{
    if (sa->sa_family == AF_INET) {
        memcpy(out->bytes, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        out->size = 4;
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        address_of_v6(((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr, out);
        return true;
    }
    return false;
}

static bool address_is_loopback(const struct address *a)
{
    static const uint8_t v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    if (a->size == 4)
        return a->bytes[0] == 127;
    return memcmp(a->bytes, v6_loopback, 16) == 0;
}

/* An address literal (dotted IPv4, or the inside of an IPv6 [...]); false
 * if the text is not one. */
static bool parse_literal(const char *text, size_t size, bool bracketed, struct address *out)
{
    char copy[64];
    if (size == 0 || size >= sizeof copy)
        return false;
    memcpy(copy, text, size);
    copy[size] = '\0';
    if (bracketed) {
        uint8_t in6[16];
        if (inet_pton(AF_INET6, copy, in6) != 1)
            return false;
        address_of_v6(in6, out);
        return true;
    }
    out->size = 4;
    return inet_pton(AF_INET, copy, out->bytes) == 1;
}

/* Whether name (the host without its port, brackets kept) is one of the
 * comma-separated names in list. */
static bool listed(const char *name, size_t name_size, const char *list)
{
    for (const char *p = list; p != NULL && *p != '\0';) {
        size_t n = strcspn(p, ",");
        if (n == name_size && same_nocase(p, name, n))
            return true;
        p += n;
        if (*p == ',')
            p++;
    }
    return false;
}

/* Splits host [":" port] into the host part (brackets kept) and checks the
 * port's digits. */
static bool split_host(const char *host, size_t size, size_t *name_size, bool *bracketed)
{
    size_t end;
    *bracketed = size > 0 && host[0] == '[';
    if (*bracketed) {
        const char *close = memchr(host, ']', size);
        if (close == NULL)
            return false;
        end = (size_t)(close - host) + 1;
    } else {
        end = 0;
        while (end < size && host[end] != ':')
            end++;
    }
    if (end == 0 || end > HOST_NAME_SIZE_MAX)
        return false;
    if (end < size) {
        if (host[end] != ':' || size - end - 1 > PORT_DIGITS_MAX)
            return false;
        for (size_t i = end + 1; i < size; i++) {
            if (host[i] < '0' || host[i] > '9')
                return false;
        }
    }
    *name_size = end;
    return true;
}

bool http_host_allowed(const char *host, size_t host_size, const struct sockaddr *local,
                       const char *allowed)
{
    trim(&host, &host_size);
    size_t name_size;
    bool bracketed;
    if (!split_host(host, host_size, &name_size, &bracketed))
        return false;
    if (listed(host, name_size, allowed))
        return true;
    struct address here;
    if (!address_of_sockaddr(local, &here))
        return false;
    bool here_loopback = address_is_loopback(&here);
    struct address named;
    const char *inside = bracketed ? host + 1 : host;
    size_t inside_size = bracketed ? name_size - 2 : name_size;
    if (parse_literal(inside, inside_size, bracketed, &named)) {
        if (named.size == here.size && memcmp(named.bytes, here.bytes, here.size) == 0)
            return true;
        return here_loopback && address_is_loopback(&named);
    }
    return here_loopback && name_size == 9 && same_nocase(host, "localhost", 9);
}

/* ---- Origin, Content-Type --------------------------------------------------- */

bool http_origin_is_own(const char *origin, size_t origin_size, const char *host,
                        size_t host_size, bool tls)
{
    const char *scheme = tls ? "https://" : "http://";
    size_t scheme_size = strlen(scheme);
    trim(&origin, &origin_size);
    trim(&host, &host_size);
    return host_size > 0 && origin_size == scheme_size + host_size &&
           same_nocase(origin, scheme, scheme_size) &&
           same_nocase(origin + scheme_size, host, host_size);
}

bool http_content_type_is_json(const char *value, size_t size)
{
    static const char json[] = "application/json";
    const size_t n = sizeof json - 1;
    trim(&value, &size);
    if (size < n || !same_nocase(value, json, n))
        return false;
    size_t i = n;
    while (i < size && (value[i] == ' ' || value[i] == '\t'))
        i++;
    return i == size || value[i] == ';';
}
