/*
 * node_request.c: a client's definition change (declare, bind, delete),
 * submitted on whichever broker the client is on, until its entry is
 * applied here; and the sync after a start.
 *
 * Requests (definition changes from clients, on any broker): the leader
 * proposes the entry itself; a follower hands it to the leader through
 * hooks.forward (the AMQP link) and the leader proposes it with
 * cluster_node_propose_entry. Either way the requester learns the outcome
 * by applying the entry like everyone else: the request id in the envelope
 * (this broker's id in the high half) finds it in the pending list. An
 * entry not applied after REQUEST_RESEND_MS is sent again (commands are
 * idempotent: a redeclare is equivalent, a second delete deletes nothing);
 * after CLUSTER_SUBMIT_TIMEOUT_MS the request fails (no quorum, no leader).
 */
#include "cluster/node.h"
#include "cluster/node_int.h"

#include <stdlib.h>

#include "cluster/consensus.h"
#include "cluster/outbox.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

#define REQUEST_RESEND_MS 1000

/* ---- requests (any broker) ---- */

static struct cluster_request *request_find(struct cluster_node *node, uint64_t id)
{
    list_for_each(n, &node->requests) {
        struct cluster_request *r = CONTAINER_OF(n, struct cluster_request, link);
        if (r->id == id)
            return r;
    }
    return NULL;
}

static void request_free(struct cluster_request *r)
{
    list_remove(&r->link);
    free(r->entry);
    free(r);
}

/* Hands the entry to consensus (leader) or to the leader (follower). A
 * failure is not reported: request_tick sends it again. */
static void request_send(struct cluster_node *node, struct cluster_request *r, uint64_t now)
{
    r->sent_ms = now;
    if (node->leader) {
        outbox_add(&node->outbox, r->entry, r->entry_size);
    } else if (node->leader_id == 0 || node->hooks.forward == NULL ||
               !node->hooks.forward(node->hooks.ctx, (uint32_t)node->leader_id, r->entry,
                                    r->entry_size)) {
        /* Nowhere to send it yet (a restart hears of its leader before its
         * link to it is up): the next tick tries again. A restarted broker's
         * sync waited a whole resend interval so, its recovered queues held. */
        r->sent_ms = 0;
    }
}

/* Frees the request, then tells its requester (which may submit again). */
void node__request_finish(struct cluster_request *r, int status,
                          const struct map_change *change)
{
    cluster_submit_fn done = r->done;
    void *ctx = r->ctx;
    request_free(r);
    done(ctx, status, change);
}

void node__request_applied(struct cluster_node *node, uint64_t id, int rc,
                           const struct map_change *change)
{
    struct cluster_request *r = request_find(node, id);
    if (r == NULL)
        return; /* answered by an earlier copy, or cancelled */
    (void)rc; /* the change carries the reply code */
    node__request_finish(r, OK, change);
}

void node__request_tick(struct cluster_node *node, uint64_t now)
{
    list_for_each_safe(n, &node->requests) {
        struct cluster_request *r = CONTAINER_OF(n, struct cluster_request, link);
        if (now >= r->deadline_ms)
            node__request_finish(r, CLUSTER_E_UNAVAILABLE, NULL);
        else if (r->sent_ms == 0 || now - r->sent_ms >= REQUEST_RESEND_MS)
            request_send(node, r, now);
    }
}

struct cluster_request *cluster_node_submit(struct cluster_node *node, struct map_cmd *cmd,
                                            cluster_submit_fn done, void *ctx)
{
    ASSERT(node != NULL && !node->stopping && done != NULL);
    struct cluster_request *r = xcalloc(1, sizeof *r);
    r->node = node;
    r->id = (uint64_t)node->id << 32 | (uint32_t)node->next_request++;
    r->entry = node__entry_new(cmd, r->id, &r->entry_size);
    map_cmd_free(cmd);
    uint64_t now = uv_now(node->loop);
    r->deadline_ms = now + CLUSTER_SUBMIT_TIMEOUT_MS;
    r->done = done;
    r->ctx = ctx;
    list_push_back(&node->requests, &r->link);
    /* Sent at once, from inside an apply callback too: neither the outbox
     * (a leader's) nor a forward (a follower's) enters consensus here. */
    request_send(node, r, now);
    return r;
}

void cluster_request_cancel(struct cluster_request *r)
{
    ASSERT(r != NULL);
    request_free(r);
}

int cluster_node_propose_entry(struct cluster_node *node, const uint8_t *entry, size_t size)
{
    if (node->stopping || !node->leader)
        return CONSENSUS_E_NOT_LEADER;
    if (size < ENVELOPE_HEADER_SIZE || size % 8 != 0 ||
        size > ENVELOPE_HEADER_SIZE + CLUSTER_CMD_SIZE_MAX + 8)
        return CONSENSUS_E_INVALID;
    /* Proposed with the others of this loop iteration; the origin (the
     * request id's high half) is checked at apply. */
    outbox_add(&node->outbox, entry, size);
    return OK;
}

static void on_synced(void *ctx, int status, const struct map_change *change)
{
    struct cluster_node *node = ctx;
    (void)change;
    node->sync_pending = false;
    if (status != OK || node->synced)
        return;
    node->synced = true;
    LOG_INFO("cluster: caught up with the map at epoch=%llu",
             (unsigned long long)node->map.version);
    if (node->hooks.synced != NULL)
        node->hooks.synced(node->hooks.ctx);
}

/* After a start, a sync through the log tells us when every command
 * committed before it has been applied here. */
void node__sync_tick(struct cluster_node *node)
{
    if (node->synced || node->sync_pending || node->leader_id == 0 || node->joining)
        return;
    struct map_cmd cmd;
    ASSERT(map_cmd_sync(&cmd) == OK);
    node->sync_pending = true;
    cluster_node_submit(node, &cmd, on_synced, node);
}
