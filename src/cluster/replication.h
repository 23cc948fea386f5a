/*
 * replication.h: the primary's side of a queue with backups (DESIGN §4-5).
 *
 * The primary streams every change of the queue to each backup, over the
 * link, on its replication channel to that broker for the queue's vhost
 * (a confirm channel beside the one publishes are forwarded on:
 * forward.c says why), in order: basic.quay-replicate {queue, epoch, seq} with the message's
 * content for an enqueue (the backup acks it), basic.quay-settle {queue,
 * epoch, seq} when a message leaves the queue for good (seq 0 with purge:
 * a reset, before a catch-up).
 *
 * The rule that keeps confirmed messages: a publish is confirmed only when
 * every backup in the queue's in-sync set (as this broker last applied the
 * map) has acked it, and this broker's lease is fresh. A backup that
 * cannot be reached, refuses the stream, or acks nothing for
 * REPLICATION_LAG_MS while a publish waits for it leaves the in-sync set
 * *by a map change*
 * (queue.set_in_sync, compare-and-set on the epoch) before the primary
 * confirms without it; until that change is applied here, the confirms
 * wait. So a backup the controller may promote (in sync in its map) holds
 * every message a publisher saw confirmed, and a primary cut off from the
 * map cannot drop a backup and go on alone: it stops confirming. When the
 * map moves the queue away (the primary was deposed), the publishes it
 * never confirmed are nacked: their publishers, or the proxies that
 * forwarded them, send them again to the new primary.
 *
 * A backup not in sync is caught up: a reset, then every message the
 * queue holds (ready, and delivered but not acked) in seq order on the
 * stream's channel, then the stream goes on. Once it acked the snapshot's
 * last message it gates confirms at once, and the primary asks the map to
 * add it to the in-sync set.
 *
 * Memory: struct replication is owned by the real queue (queue->replication,
 * freed by replication_detach). Each backup's stream is allocated apart:
 * the link's pending answers reference it, so it outlives a detach until
 * the last answer came (or the link died).
 */
#ifndef QUAY_CLUSTER_REPLICATION_H
#define QUAY_CLUSTER_REPLICATION_H

#include <stdbool.h>
#include <stdint.h>

struct json;
struct map_queue;
struct member;
struct queue;

/* A backup that answered nothing for this long while a publish waited for it
 * leaves the in-sync set (a stalled or silently cut broker). */
#define REPLICATION_LAG_MS 2000

/* The queue is real here, as mq says (called on every map change of it):
 * stream it to mq's backups, catch up those not in sync. No backups (and
 * nothing waiting): the queue's replication state goes. recovered: the
 * queue is what this process's journal recovered at its start (not a
 * replica it adopted): its in-sync backups may hold messages it lost (the
 * transient ones) under seqs it will number again, so they are not in
 * step: they leave the in-sync set (asked of the map; the confirms wait
 * meanwhile) and are caught up again, as a failed backup is. */
void replication_attach(struct member *member, struct queue *queue, const struct map_queue *mq,
                        bool recovered);

/* The queue stops being replicated from here: it was deleted (ack: its
 * waiting publishes are confirmed, as a deleted queue's are) or the map
 * moved it to another broker (ack false: they are nacked). Sends nothing
 * more to the backups (a demoted primary must not purge its old backups). */
void replication_detach(struct queue *queue, bool ack);

/* A planned handover (handover.c) waits until the backups hold exactly
 * what the queue does (its publishes are held meanwhile): no confirm
 * waits, and every in-sync backup answered a probe sent after the last
 * message and settle it was sent. True once so; else probes them (again,
 * if settles went since) and calls handover_quiet(queue) when the answers
 * are in. replication_quiesce_end: the handover is over. */
bool replication_quiesce(struct queue *queue);
/* Every backup is probed again (something went to one on another channel
 * of its link: a probe answered after it says it was read). */
void replication_probe_again(struct queue *queue);
void replication_quiesce_end(struct queue *queue);

/* A catch-up of backup_id going on for queue (a real queue here): the
 * messages of its backlog sent and in all, and the bytes sent. False if
 * none is (caught up, or not started). */
struct replication_progress {
    uint32_t sent, total;
    uint64_t bytes;
};
bool replication_catch_up_progress(const struct queue *queue, uint32_t backup_id,
                                   struct replication_progress *out);

/* Whether backup_id's copy of the queue has its persistent messages too
 * (false: x-quay-replicate "transient" sent it the transient ones only).
 * A planned handover goes only to a backup that has everything. */
bool replication_holds_everything(const struct queue *queue, uint32_t backup_id);

/* The member stops: every queue's replication is detached (nacked). */
void replication_stop_all(struct member *member);

/* Every member tick: confirms that waited for the lease; backups that lag;
 * in-sync changes the map did not take yet (asked again). The tick visits
 * up to `budget` of our replicated queues a call (member.c: a slice a loop
 * turn), each once a tick: true once every one was visited. */
void replication_tick_begin(struct member *member);
bool replication_tick_step(struct member *member, uint32_t budget);

/* /api/queues: whether this primary may confirm now, and the confirms it
 * gave in its current epoch. Nothing for a queue without backups. */
void replication_write_json(const struct queue *queue, struct json *out);
/* The queue's replication lag: publishes whose confirms wait for its
 * in-sync backups (0 without backups). GET /metrics, per queue. */
uint32_t replication_confirms_waiting(const struct queue *queue);

#endif
