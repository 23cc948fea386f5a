/*
 * console.c: see console.h. Registers the generated table's files; the
 * HTTP server answers them (ETag, 304, security headers: http.c).
 */
#include "mgmt/console.h"

#include "lib/assert.h"

void console_register(struct http_server *server)
{
    ASSERT(console_assets_count > 0); /* at least index.html */
    for (size_t i = 0; i < console_assets_count; i++)
        http_server_route_asset(server, &console_assets[i]);
}
