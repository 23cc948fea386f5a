/*
 * http_parse.c: the request parser of http.h (http_parse_request), apart
 * from the server so that it is pure: bytes in, a verdict out, no sockets,
 * no allocation. tests/fuzz/fuzz_http.c links it alone.
 */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "lib/assert.h"
#include "lib/errors.h"
#include "mgmt/http.h"

/* A method longer than this is garbage, not a method we do not know. */
#define HTTP_METHOD_SIZE_MAX 32u

/* ---- percent-decoding ------------------------------------------------- */

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

long http_percent_decode(const char *s, size_t size, uint8_t *out, size_t cap, bool plus)
{
    size_t n = 0;
    for (size_t i = 0; i < size; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c == '%') {
            int hi = size - i >= 3 ? hex_digit(s[i + 1]) : -1;
            int lo = size - i >= 3 ? hex_digit(s[i + 2]) : -1;
            if (hi < 0 || lo < 0)
                return -1;
            c = (uint8_t)(hi << 4 | lo);
            i += 2;
        } else if (c == '+' && plus) {
            c = ' ';
        }
        if (n == cap)
            return -1;
        out[n++] = c;
    }
    return (long)n;
}

/* ---- the request parser ------------------------------------------------ */

/* RFC 9110 §5.6.2 token characters. */
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int parse_fail(struct http_request *req, int status, const char *reason)
{
    req->status = status;
    req->reason = reason;
    return E_SYNTAX;
}

/* The next line at *pos, without its LF or CRLF; false if it has not ended
 * yet. */
static bool next_line(const char *data, size_t size, size_t *pos, const char **line,
                      size_t *line_size)
{
    ASSERT(*pos <= size);
    const char *lf = memchr(data + *pos, '\n', size - *pos);
    if (!lf)
        return false;
    size_t end = (size_t)(lf - data);
    *line = data + *pos;
    *line_size = end - *pos;
    if (*line_size > 0 && (*line)[*line_size - 1] == '\r')
        (*line_size)--;
    *pos = end + 1;
    return true;
}

/* A request line that has not ended yet can already be garbage: reject it
 * now rather than after 8 KiB or the timeout. */
static int check_partial_line(const char *line, size_t size, struct http_request *req)
{
    size_t i = 0;
    while (i < size && is_tchar((unsigned char)line[i]))
        i++;
    if (i > HTTP_METHOD_SIZE_MAX)
        return parse_fail(req, 400, "malformed method");
    if (i < size && line[i] != ' ' && !(line[i] == '\r' && i + 1 == size))
        return parse_fail(req, 400, "malformed method");
    for (; i < size; i++) {
        unsigned char c = (unsigned char)line[i];
        if ((c < 0x20 && !(c == '\r' && i + 1 == size)) || c == 0x7f)
            return parse_fail(req, 400, "control character in the request line");
    }
    return AGAIN;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* method SP request-target SP HTTP-version (RFC 9112 §3). */
static int parse_request_line(const char *line, size_t size, struct http_request *req)
{
    size_t i = 0;
    while (i < size && is_tchar((unsigned char)line[i]))
        i++;
    if (i == 0 || i > HTTP_METHOD_SIZE_MAX || i >= size || line[i] != ' ')
        return parse_fail(req, 400, "malformed method");
    req->method = line;
    req->method_size = i;
    size_t target = ++i;
    while (i < size && (unsigned char)line[i] > 0x20 && line[i] != 0x7f)
        i++;
    if (i == target || i >= size || line[i] != ' ')
        return parse_fail(req, 400, "malformed request target");
    if (line[target] != '/')
        return parse_fail(req, 400, "the request target is not a path");
    req->target = line + target;
    req->target_size = i - target;
    const char *v = line + i + 1;
    size_t v_size = size - i - 1;
    if (v_size != 8 || memcmp(v, "HTTP/", 5) != 0 || !is_digit(v[5]) || v[6] != '.' ||
        !is_digit(v[7]))
        return parse_fail(req, 400, "malformed HTTP version");
    if (v[5] != '1')
        return parse_fail(req, 505, "only HTTP/1.x is served");
    req->version_minor = (uint8_t)(v[7] - '0');
    return OK;
}

/* field-name ":" OWS field-value OWS (RFC 9112 §5). */
/* Content-Length: digits only, at most HTTP_BODY_SIZE_MAX. */
static int parse_content_length(const char *value, size_t size, struct http_request *req)
{
    while (size > 0 && (*value == ' ' || *value == '\t'))
        value++, size--;
    while (size > 0 && (value[size - 1] == ' ' || value[size - 1] == '\t'))
        size--;
    size_t n = 0;
    for (size_t i = 0; i < size; i++) {
        if (!is_digit(value[i]))
            return parse_fail(req, 400, "malformed Content-Length");
        if (n > HTTP_BODY_SIZE_MAX)
            return parse_fail(req, 413, "the request body is over 16 MiB");
        n = n * 10 + (size_t)(value[i] - '0');
    }
    if (size == 0)
        return parse_fail(req, 400, "malformed Content-Length");
    if (n > HTTP_BODY_SIZE_MAX)
        return parse_fail(req, 413, "the request body is over 16 MiB");
    if (req->has_length && req->content_length != n)
        return parse_fail(req, 400, "conflicting Content-Length headers");
    req->has_length = true;
    req->content_length = n;
    return OK;
}

/* Keeps a header's value (without surrounding whitespace) in *slot; a
 * second header of the same name is refused. */
static int keep_value(const char *value, size_t size, const char **slot, size_t *slot_size,
                      struct http_request *req, const char *twice)
{
    if (*slot != NULL)
        return parse_fail(req, 400, twice);
    while (size > 0 && (*value == ' ' || *value == '\t'))
        value++, size--;
    while (size > 0 && (value[size - 1] == ' ' || value[size - 1] == '\t'))
        size--;
    *slot = value;
    *slot_size = size;
    return OK;
}

static bool name_is(const char *line, size_t name_size, const char *name)
{
    return name_size == strlen(name) && strncasecmp(line, name, name_size) == 0;
}

static int parse_header(const char *line, size_t size, struct http_request *req)
{
    if (line[0] == ' ' || line[0] == '\t')
        return parse_fail(req, 400, "obsolete header line folding");
    size_t i = 0;
    while (i < size && is_tchar((unsigned char)line[i]))
        i++;
    if (i == 0 || i >= size || line[i] != ':')
        return parse_fail(req, 400, "malformed header field");
    for (size_t j = i + 1; j < size; j++) {
        unsigned char c = (unsigned char)line[j];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return parse_fail(req, 400, "control character in a header field");
    }
    const char *value = line + i + 1;
    size_t value_size = size - i - 1;
    if (name_is(line, i, "host"))
        return keep_value(value, value_size, &req->host, &req->host_size, req,
                          "more than one Host header");
    if (name_is(line, i, "origin"))
        return keep_value(value, value_size, &req->origin, &req->origin_size, req,
                          "more than one Origin header");
    if (name_is(line, i, "authorization"))
        return keep_value(value, value_size, &req->authorization, &req->authorization_size,
                          req, "more than one Authorization header");
    if (name_is(line, i, "content-type"))
        return keep_value(value, value_size, &req->content_type, &req->content_type_size, req,
                          "more than one Content-Type header");
    if (name_is(line, i, "if-none-match"))
        return keep_value(value, value_size, &req->if_none_match, &req->if_none_match_size,
                          req, "more than one If-None-Match header");
    if (name_is(line, i, "content-length"))
        return parse_content_length(value, value_size, req);
    if (name_is(line, i, "transfer-encoding"))
        return parse_fail(req, 400, "a Transfer-Encoding is not served: send Content-Length");
    return OK;
}

int http_parse_request(const char *data, size_t size, struct http_request *req)
{
    memset(req, 0, sizeof *req);
    size_t pos = 0;
    /* RFC 9112 §2.2: empty lines before the request line are ignored. */
    while (pos < size && (data[pos] == '\r' || data[pos] == '\n'))
        pos++;
    const char *line;
    size_t line_size;
    size_t start = pos;
    if (!next_line(data, size, &pos, &line, &line_size))
        return check_partial_line(data + start, size - start, req);
    req->line_complete = true;
    int rc = parse_request_line(line, line_size, req);
    if (rc != OK)
        return rc;
    for (;;) {
        if (!next_line(data, size, &pos, &line, &line_size))
            return AGAIN;
        if (line_size == 0)
            break;
        rc = parse_header(line, line_size, req);
        if (rc != OK)
            return rc;
    }
    req->head_size = pos;
    if (req->version_minor >= 1 && req->host == NULL)
        return parse_fail(req, 400, "an HTTP/1.1 request needs a Host header");
    return OK;
}
