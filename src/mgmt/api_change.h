/*
 * api_change.h: a management API change (PUT, DELETE) made through the
 * cluster map, for api_limits.c, api_policies.c and api_users.c: the one
 * place that waits for the map command, gives up with the call, and
 * answers 503 when the map cannot take it.
 *
 * Memory: a caller's pending change is one malloc'd struct starting with
 * struct api_change; once submitted it is the change's: freed if the
 * call goes away first, else handed to applied(), which answers the call
 * and frees it (or submits it again).
 */
#ifndef QUAY_MGMT_API_CHANGE_H
#define QUAY_MGMT_API_CHANGE_H

#include <stdbool.h>

#include "mgmt/http.h"

struct broker;
struct map_change;
struct map_cmd;
struct cluster_request;
struct api_change;

/* The command committed and was applied here; change says whether the
 * map accepted it (reply_code 200) or refused it (code and text). */
typedef void (*api_change_fn)(struct api_change *c, const struct map_change *change);

struct api_change {
    struct http_call *call;
    struct cluster_request *request; /* the map's, until applied */
    api_change_fn applied;
};

/* Whether this broker may propose changes: else cmd is freed and call
 * answered 503 (not caught up with the cluster yet). */
bool api_change_ready(struct broker *broker, struct http_call *call, struct map_cmd *cmd);
/* Submits cmd (consumed) for c->call; c->applied runs once it committed,
 * or c is answered 503 and freed if it could not (no leader, no quorum). */
void api_change_submit(struct broker *broker, struct api_change *c, struct map_cmd *cmd);

#endif
