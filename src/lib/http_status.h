/*
 * http_status.h: the reason phrases of the HTTP statuses quay answers. In
 * lib/ because both the management API's server (mgmt/http.c) and the
 * cluster's own endpoints (cluster/member.c, served by it) name them, and
 * cluster/ may not include mgmt/ (docs/ARCHITECTURE.md section 1).
 */
#ifndef QUAY_LIB_HTTP_STATUS_H
#define QUAY_LIB_HTTP_STATUS_H

/* The reason phrase of an HTTP status ("Not Found"), which is also the
 * "error" of RabbitMQ's error bodies {"error", "reason"}. Asserts on a
 * status quay does not answer. */
const char *http_status_text(int status);

#endif
