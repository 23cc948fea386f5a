/*
 * api_moves.h: POST /api/cluster/move, answered once this broker's map
 * holds the move (cluster/moves.h checks the request and builds the
 * command; api_change.h submits it and waits), so that the 202 means
 * "recorded": a GET of /api/cluster on the same broker after it lists
 * the move (or, once carried out, the queue's new primary). The move
 * itself goes on after the answer (a catch-up, then a handover), as
 * RabbitMQ's asynchronous operations answer before they are done.
 */
#ifndef QUAY_MGMT_API_MOVES_H
#define QUAY_MGMT_API_MOVES_H

#include "mgmt/http.h"

/* The route's handler (http_prefix_fn); ctx: the cluster's member.
 * Registered by quayd's wiring (cli/services.c) at "/api/cluster/move/". */
void api_moves_move(void *ctx, struct http_call *call, const struct http_call_request *req);

#endif
