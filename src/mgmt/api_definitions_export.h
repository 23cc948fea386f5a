/*
 * api_definitions_export.h: GET /api/definitions[/{vhost}] (api_definitions.h
 * says what it holds).
 */
#ifndef QUAY_MGMT_API_DEFINITIONS_EXPORT_H
#define QUAY_MGMT_API_DEFINITIONS_EXPORT_H

#include "mgmt/http.h"

struct broker;
struct vhost;

/* Answers the broker's definitions, or one vhost's (only). */
void api_definitions_export(struct broker *broker, struct http_call *call,
                            const struct vhost *only);

#endif
