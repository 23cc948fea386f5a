/*
 * replica.h: a backup's copy of a queue (DESIGN §4-5).
 *
 * A backup keeps the messages its primary streams to it
 * (replication.h) in its stand-in's replica: in seq order, each removed
 * when the primary says it left the queue; a reset (a catch-up) empties it.
 *
 * When the controller promotes a backup (queue.set_owner, epoch + 1), the
 * mirror turns its stand-in into the real queue and adopts the replica's
 * messages in order under the old primary's seqs (the other in-sync
 * backups hold them under the same ones, so the stream goes on), marked
 * redelivered (the old primary may have delivered them), journaled if
 * persistent.
 *
 * Memory: a replica is owned by its stand-in (proxy.c); each entry holds
 * one message reference.
 */
#ifndef QUAY_CLUSTER_REPLICA_H
#define QUAY_CLUSTER_REPLICA_H

#include <stdbool.h>
#include <stdint.h>

#include "amqp/types.h"

struct message;
struct queue;

/* ---- the backup's side ---- */

struct replica;
struct replica *replica_new(void);
void replica_free(struct replica *replica); /* NULL is fine */
/* Messages arrive in seq order; a seq at or below the last one is a resend
 * and ignored (true: stored or already there). */
bool replica_push(struct replica *replica, uint64_t seq, struct message *message);
void replica_remove(struct replica *replica, uint64_t seq); /* seq 0: all */
uint32_t replica_count(const struct replica *replica);

/* ---- promotion ---- */

/* Promotion: the stand-in's replica becomes the real queue's content. */
void replica_adopt(struct queue *queue, struct replica *replica);

#endif
