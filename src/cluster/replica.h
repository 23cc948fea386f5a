/*
 * replica.h: backups of a queue (DESIGN §4-5), first increment.
 *
 * The primary of a queue with backups streams every change to each
 * backup, over the link, on the same confirm channel as its forwards (so
 * in order): basic.quay-replicate {queue, epoch, seq} + the message's
 * content for an enqueue, basic.quay-settle {queue, epoch, seq} when a
 * message leaves the queue for good (seq 0 with purge: every ready one).
 * A backup keeps the messages in its stand-in's replica and acks each
 * replicate; the publisher's confirm waits for those acks (publish_wait),
 * so a confirmed message is on every reachable backup.
 *
 * When the controller promotes a backup (queue.set_owner, epoch + 1), the
 * mirror turns its stand-in into the real queue and adopts the replica's
 * messages in order under the old primary's seqs (the other backups hold
 * them under the same ones, so the stream goes on), marked redelivered
 * (the old primary may have delivered them), journaled if persistent.
 *
 * A backup that is not in sync is caught up by its primary when the map
 * change arrives: a reset (quay-settle with purge), then every message the
 * queue holds, ready or delivered and unacked, in seq order, on the
 * stream's channel; once it acked the last one it joins the in-sync set.
 *
 * With x-quay-dedup-window the replica also keeps the queue's
 * de-duplication table (broker/dedup.h) from the stream: every replicated
 * message's id, timed by the backup's own clock. A reset keeps it (it
 * clears messages, not ids); promotion hands it to the real queue with the
 * messages, so a publisher's resend to the new primary is de-duplicated.
 * A backup caught up by snapshot learns only the ids of the messages still
 * in the queue, not those of messages already consumed.
 *
 * Not yet (issue 6, next increments): removing a lagging backup from the
 * in-sync set *before* confirming without it (today a backup that cannot
 * be reached is skipped, and marked out of sync afterwards); leases and
 * fencing of a deposed primary; catching up paged queues; sending the
 * dedup table in a catch-up snapshot.
 *
 * Memory: a replica is owned by its stand-in (proxy.c); each entry holds
 * one message reference. The primary side's state (struct replication) is
 * owned by the real queue (queue->replication) through replica_attach.
 */
#ifndef QUAY_CLUSTER_REPLICA_H
#define QUAY_CLUSTER_REPLICA_H

#include <stdbool.h>
#include <stdint.h>

#include "amqp/types.h"

struct map_queue;
struct member;
struct message;
struct queue;

/* ---- the backup's side ---- */

struct replica;
/* dedup_window_ms: the queue's x-quay-dedup-window (<= 0: none). */
struct replica *replica_new(int64_t dedup_window_ms);
void replica_free(struct replica *replica); /* NULL is fine */
/* Messages arrive in seq order; a seq at or below the last one is a resend
 * and ignored (true: stored or already there). With a dedup window the
 * message-id is remembered as of now_ms (our loop clock) either way. */
bool replica_push(struct replica *replica, uint64_t seq, struct message *message,
                  uint64_t now_ms);
void replica_remove(struct replica *replica, uint64_t seq); /* seq 0: all */
uint32_t replica_count(const struct replica *replica);   /* NULL: 0 */
uint32_t replica_dedup_count(const struct replica *replica); /* ids remembered; NULL: 0 */

/* ---- the primary's side ---- */

/* The queue is real here: stream it to mq's backups (or stop, with none). */
void replica_attach(struct member *member, struct queue *queue, const struct map_queue *mq);
/* Promotion: the stand-in's replica becomes the real queue's content. */
void replica_adopt(struct queue *queue, struct replica *replica);

#endif
