/*
 * outbox.h: the leader's single-entry proposals of one loop iteration,
 * proposed together.
 *
 * libraft (0.15) keeps a leader's proposals in one list and, for every
 * entry it applies, walks that list for the proposal the entry began; an
 * entry that began none (the second and later of a batch) walks all of
 * it. After a failover, thousands of queues each propose their own small
 * change (a backup in sync) while the controller's batches are applied:
 * thousands of proposals times tens of thousands of entries, and the
 * leader's loop stalled for 650-700 ms. Gathered here, the entries of one
 * loop iteration (this broker's requests, those its followers forward)
 * are one proposal, and the list stays short.
 *
 * The outbox copies each entry; an idle handle proposes them before the
 * loop next waits for I/O. A proposal that fails (no longer leader, busy)
 * is dropped: its requester sends it again (request_tick, here or on the
 * follower that forwarded it), as it would after any failed proposal.
 */
#ifndef QUAY_CLUSTER_OUTBOX_H
#define QUAY_CLUSTER_OUTBOX_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "cluster/consensus.h"

#define OUTBOX_BATCH 256 /* entries per proposal */

/* Proposes a batch of entries (the outbox frees them afterwards): OK or a
 * consensus error. */
typedef int (*outbox_propose_fn)(void *ctx, const struct consensus_cmd *cmds, uint32_t n);

struct outbox {
    uv_idle_t idle; /* idle.data is the owner's (its close callback's) */
    outbox_propose_fn propose;
    void *ctx;
    struct consensus_cmd *items; /* owned, bytes owned */
    uint32_t count, capacity;
};

void outbox_init(struct outbox *box, uv_loop_t *loop, outbox_propose_fn propose, void *ctx);
/* Copies entry; proposed within this loop iteration or the next. */
void outbox_add(struct outbox *box, const uint8_t *entry, size_t size);
/* Drops what is waiting, then closes the idle handle; close_cb gets it
 * (its data untouched). */
void outbox_close(struct outbox *box, uv_close_cb close_cb);

#endif
