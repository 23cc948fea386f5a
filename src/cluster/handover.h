/*
 * handover.h: a primary hands one of its queues over to another broker
 * while it serves (a planned move: queue.move in the map).
 *
 * The map names the target (map_queue.move_to), which is made a backup
 * and caught up like any backup. Once the move is ready (the target in
 * sync, and the factor kept without our copy: map_queue_move_state), the
 * primary
 *   1. pauses the queue: publishes are held, not enqueued (their confirms
 *      wait), and nothing more is dispatched (queue_pause);
 *   2. waits until its backups hold exactly what it does: every confirm
 *      given, and a probe answered after the last message and settle
 *      (replication_quiesce);
 *   3. proposes queue.set_owner planned (epoch + 1) to the target.
 * When that applies here, the queue becomes a stand-in (mirror.c): what it
 * held is forwarded to the new primary, its consumers (ours and the
 * peers') follow the queue without a cancel. The new primary adopts its
 * replica as it is.
 *
 * Giving up: the map moved on (the target left the in-sync set, the move
 * was cancelled, a failover) or it takes longer than HANDOVER_QUIESCE_MS to
 * quiesce: the queue resumes (the held publishes are enqueued) and the move
 * is cancelled. Once the handover is proposed the queue stays paused until
 * the outcome is known: refused (resume), applied (a stand-in), or no
 * answer (the move is cancelled first, which makes a handover still on its
 * way refused: queue.set_owner planned needs move_to, then resume).
 */
#ifndef QUAY_CLUSTER_HANDOVER_H
#define QUAY_CLUSTER_HANDOVER_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"

struct json;
struct map_queue;
struct member;
struct queue;

#define HANDOVER_QUIESCE_MS 2000

/* Our queue, as the map now has it (every map change of it, after its
 * replication followed): starts a handover the map asks for, or ends one
 * the map no longer wants. */
void handover_follow(struct member *member, struct queue *queue, const struct map_queue *mq);
/* replication.c: nothing is owed to the queue's backups any more. */
void handover_quiet(struct member *member, struct queue *queue);
/* The map gave the queue to another broker (mirror.c, before the queue
 * object goes): its handover, if any, is over. True if it was ours: a
 * planned handover to new_primary; then *relay (if its channel is still
 * open) passes to the caller: the channel on which the new primary keeps
 * the deliveries it was told of, in the order of delivered (tag k + 1 is
 * delivered[k]): settling them there settles them at the new primary. */
struct link_channel;
struct handover_relay {
    struct link_channel *channel;   /* NULL: none (its callbacks: the caller sets them) */
    uint64_t *delivered;            /* malloc'ed, ascending */
    uint32_t delivered_count;
};
bool handover_done(struct member *member, struct queue *queue, uint32_t new_primary,
                   struct handover_relay *relay);
/* The new primary's side, as it adopts its replica (mirror.c): the
 * messages the old primary had delivered stay delivered, to its channel
 * of the notice (settled from there by tag), the others keep its
 * redelivered flags. Frees note (NULL: nothing was said; a notice for
 * another epoch, or whose channel closed, is ignored). */
struct replica_handover;
void handover_adopt(struct member *member, struct queue *queue, struct replica_handover *note,
                    uint64_t previous_epoch);
/* forward.c: the forwards we sent the old primary of a queue handed over
 * to us are all answered: our held publishes go in (queue_hold_publishes). */
struct vhost;
void handover_forwards_drained(struct member *member, struct vhost *vhost, struct bytes name);
/* Every member tick: handovers that take too long give up. */
void handover_tick(struct member *member);
/* The member stops: every paused queue resumes (nothing was handed over). */
void handover_stop_all(struct member *member);
/* /api/cluster: handovers in progress here. */
void handover_write_json(struct member *member, struct json *out);

#endif
