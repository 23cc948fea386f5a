/*
 * console.h: the web console, served by the management HTTP server at "/"
 * (console/index.html, with console/console.css and console/console.js):
 * plain HTML, CSS and JavaScript, embedded in the binary at build time
 * (tools/embed_console.cmake writes console_assets.c in the build tree),
 * so quayd needs no files beside it and no network.
 *
 * The files are served without admission (http_asset says why): the page
 * asks for a user and password of the management API and sends them as
 * HTTP Basic with every /api request it makes, which the API checks as it
 * checks anyone's. The page is same-origin with the API, so the Host and
 * Origin checks (http_guard.h) let its requests through unchanged.
 *
 * Owns nothing at run time: the table is static data.
 */
#ifndef QUAY_MGMT_CONSOLE_H
#define QUAY_MGMT_CONSOLE_H

#include <stddef.h>

#include "mgmt/http.h"

/* Generated: one entry per file of console/. */
extern const struct http_asset console_assets[];
extern const size_t console_assets_count;

/* Routes every file of the console on server (one route each). */
void console_register(struct http_server *server);

#endif
