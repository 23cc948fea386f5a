/*
 * api_change.c: see api_change.h.
 */
#include "mgmt/api_change.h"

#include <stdlib.h>

#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "lib/errors.h"

static void on_cancel(void *arg)
{
    struct api_change *c = arg;
    cluster_request_cancel(c->request);
    free(c);
}

static void on_applied(void *ctx, int status, const struct map_change *change)
{
    struct api_change *c = ctx;
    if (status != OK) {
        http_call_answer_error(c->call, 503,
                               "the cluster map is unavailable (no leader or no quorum)");
        free(c);
        return;
    }
    c->applied(c, change);
}

bool api_change_ready(struct broker *broker, struct http_call *call, struct map_cmd *cmd)
{
    if (cluster_node_synced(member_node_of(broker)))
        return true;
    map_cmd_free(cmd);
    http_call_answer_error(call, 503, "this broker has not caught up with the cluster yet");
    return false;
}

void api_change_submit(struct broker *broker, struct api_change *c, struct map_cmd *cmd)
{
    http_call_on_cancel(c->call, on_cancel, c);
    c->request = cluster_node_submit(member_node_of(broker), cmd, on_applied, c);
}
