/*
 * api_moves.c: see api_moves.h.
 */
#include "mgmt/api_moves.h"

#include <stdlib.h>

#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/moves.h"
#include "lib/json.h"
#include "lib/log.h"
#include "mgmt/api_change.h"
#include "mgmt/api_list.h"

/* A move waiting for its command to be applied here. Owned by the change
 * (api_change.h) once submitted. */
struct pending_move {
    struct api_change change; /* first: the change frees it as one */
    struct move_answer answer;
};

static void on_applied(struct api_change *c, const struct map_change *change)
{
    struct pending_move *p = (struct pending_move *)c;
    if (change->reply_code != 200) {
        /* The map changed between the check and the apply (the queue
         * failed over, the target went down): nothing was moved. */
        LOG_WARN("cluster: a move of queue '%s' in vhost '%s' was refused: %u %s",
                 p->answer.queue, p->answer.vhost, change->reply_code, change->reply_text);
        http_call_answer_error(c->call, 409, change->reply_text);
        free(p);
        return;
    }
    struct json body;
    http_body_init(&body);
    moves_write_answer(&p->answer, &body);
    http_call_answer(c->call, 202, &body);
    free(p);
}

void api_moves_move(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    struct member *member = ctx;
    if (req->rest_size > 0) {
        api_answer_not_found(call);
        return;
    }
    if (req->method != HTTP_METHOD_POST) {
        http_call_answer_error(call, 405, "POST /api/cluster/move only");
        return;
    }
    struct pending_move *p = calloc(1, sizeof *p);
    if (p == NULL) {
        http_call_answer_error(call, 503, "out of memory");
        return;
    }
    struct json body;
    http_body_init(&body);
    struct map_cmd cmd;
    int status = moves_prepare(member, req->body, req->body_size, &body, &p->answer, &cmd);
    if (status != 0) {
        free(p);
        http_call_answer(call, status, &body);
        return;
    }
    json_free(&body); /* an unfinished object: the answer is written once applied */
    p->change.call = call;
    p->change.applied = on_applied;
    api_change_submit(member->broker, &p->change, &cmd);
}
