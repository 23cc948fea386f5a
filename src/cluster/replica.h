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
 * redelivered (the old primary may have delivered them).
 *
 * Of a durable queue the replica also logs the persistent messages (and
 * their removals) in the broker's journal under the queue's name, as the
 * primary does, without waiting for the fsync: a promotion then hands the
 * log to the real queue, which opens it by name, instead of writing every
 * message again (hundreds of MB for a deep queue: the new primary's first
 * confirms would wait behind them). A reset starts the log over. Where
 * the primary pages (a lazy queue, memory past the paging mark) the
 * replica keeps those messages in the log only, and the promoted queue
 * starts with them paged.
 *
 * With x-quay-dedup-window the replica also keeps the queue's
 * de-duplication table (broker/dedup.h) from the stream: every replicated
 * message's id, timed by the backup's own clock. A reset keeps it (it
 * clears messages, not ids); promotion hands it to the real queue with the
 * messages, so a publisher's resend to the new primary is de-duplicated.
 * A catch-up sends the primary's table first: ids as empty messages under
 * seq 0, which replica_push records and does not keep.
 *
 * Memory: a replica is owned by its stand-in (proxy.c); each entry holds
 * one message reference; it owns its log (deleted with it) until handed
 * over. The stand-in lets go of it once the map no longer names this
 * broker a backup (fence_replica_kept, which reads the map version the
 * last reset named).
 */
#ifndef QUAY_CLUSTER_REPLICA_H
#define QUAY_CLUSTER_REPLICA_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"

struct journal_queue;
struct message;
struct queue;
struct queue_entry;
struct reclaim;

/* ---- the backup's side ---- */

struct replica;
/* dedup_window_ms: the queue's x-quay-dedup-window (<= 0: none). log: the
 * journal's log of the queue's name (a durable queue), or NULL; the
 * replica owns it (one with records from before is started over).
 * reclaim: the broker's (borrowed, or NULL: at once), where everything the
 * replica holds goes when it all goes at once (replica_remove 0, the
 * free): a deep copy is let go of in slices, not in one loop turn. */
struct replica *replica_new(int64_t dedup_window_ms, struct journal_queue *log,
                            struct reclaim *reclaim);
void replica_free(struct replica *replica); /* NULL is fine */
/* Messages arrive in seq order; a seq at or below the last one is a resend
 * and ignored (true: stored or already there) when it comes under the same
 * epoch, and refused (false) under another (fence_replica_push: the new
 * primary's seqs collide with ours; it catches us up again). With a dedup window the
 * message-id is remembered as of now_ms (our loop clock) either way. page:
 * keep a persistent message in the log only, as a paging primary does (a
 * lazy queue, memory past the paging mark); never for a priority queue. */
bool replica_push(struct replica *replica, uint64_t epoch, uint64_t seq,
                  struct message *message, uint64_t now_ms, bool page);
/* The origin the primary recorded a pushed message (or a catch-up's mark,
 * under seq 0) as (broker/origin.h): the replica keeps the same marks, and
 * a promotion hands them to the queue, so a forward resent to it is not
 * enqueued twice. Stream 0: none. */
void replica_record_origin(struct replica *replica, uint64_t stream, uint64_t seq,
                           uint64_t now_ms);
void replica_remove(struct replica *replica, uint64_t seq); /* seq 0: all */
/* Every message of seqs first..last it holds goes (a purge's run; seqs it
 * does not hold are no business of it). */
void replica_remove_run(struct replica *replica, uint64_t first, uint64_t last);
/* A catch-up starts (its reset): everything goes (replica_remove 0), the
 * log starts over, and the copy remembers the map version its primary
 * started the stream under (0: unknown), which says whether this broker
 * keeps it while its own map does not name it a backup
 * (fence_replica_kept). */
void replica_reset(struct replica *replica, uint64_t stream_version);
uint64_t replica_stream_version(const struct replica *replica); /* NULL: 0 */

/* What a copy of a queue holds, in 16 bytes: how many messages and the sum
 * of their seqs, each mixed first (the order does not count, so a primary's
 * queue and a replica are summed alike whatever their layout). A promoted
 * primary sends each backup its stream starts in step with a verify message
 * (an empty-routed message under seq 0 whose body is the digest of what it
 * adopted: replication.c); the backup takes it only if its replica's digest
 * is the same. The two can differ: the old primary's last settles or
 * pushes reached one backup and not the other before it died, and the one
 * promoted holds fewer (or more) than the other, which would give them back
 * (a copy consumed already, unflagged) or lack one on the next failover
 * (a message confirmed since only because the stream assumed it was there).
 * Refused, the stream fails and the backup is caught up from a reset. */
struct replica_digest {
    uint64_t count, sum;
};
void replica_digest_add(struct replica_digest *d, uint64_t seq);
struct replica_digest replica_digest_of(const struct replica *replica); /* NULL: empty */
#define REPLICA_VERIFY_SIZE 20
void replica_verify_encode(const struct replica_digest *d, uint8_t out[REPLICA_VERIFY_SIZE]);
uint32_t replica_count(const struct replica *replica);   /* NULL: 0 */
uint64_t replica_bytes(const struct replica *replica);   /* their bodies (paged too); NULL: 0 */
bool replica_logged(const struct replica *replica);     /* it has a log; NULL: false */
/* The journal closes (a shutdown): the log is left as it is on disk (the
 * next start recovers it as a replica's: durable_replica_log_open). NULL
 * is fine. */
void replica_forget_log(struct replica *replica);
uint32_t replica_dedup_count(const struct replica *replica); /* ids remembered; NULL: 0 */

/* A planned handover's old primary that stays an in-sync backup
 * (map_queue_switch_keeps_primary): its queue becomes its replica, every
 * message it holds (ready, and delivered and not yet settled: those the
 * channels keep, which the new primary holds as delivered) under the
 * same seqs as the new primary's, with its log and de-duplication table;
 * the queue is left empty, to be deleted. last_seq: the queue's last seq,
 * so the new primary's stream goes on after it. No message is copied.
 * settles: the settles the queue held while it stood still (borrowed):
 * their messages left the channels but not the new primary, which gets
 * the settles through the relay and then streams them to us; until then
 * the replica holds them too, as the new primary does (else its verify,
 * replica.h, finds us different and catches us up for nothing). */
struct queue_held_settle;
struct replica *replica_of_queue(struct queue *queue, const struct queue_held_settle *settles,
                                 uint32_t settles_count);

/* A takeover with the replica (queue.take_over with replica, of a queue
 * with x-quay-replicate "transient"): the replica's messages held in
 * memory, in seq order, each with one reference (*out, owned by the
 * caller; the count returned), for durable_adopt_step to merge with the dead
 * primary's log: the transient ones, and any persistent ones (a replica
 * caught up in full: before the mode applied, or for a move), which only
 * matter where the log lacks them (the log's copy is taken where both have
 * a seq; one the log has as acked comes back, flagged redelivered). Paged
 * ones are left out (the log has every confirmed one). Its dedup table
 * goes to the queue; its log, the queue's own by name, stays the queue's.
 * Frees the replica (NULL is fine: 0). */
uint32_t replica_take_for_merge(struct queue *queue, struct replica *replica,
                                struct queue_entry **out);

/* ---- a planned handover ---- */

/* What the old primary said before it handed the queue over to us
 * (basic.quay-handover, in chunks on one channel of its link): the seqs it
 * had delivered and not yet settled, and those of its ready messages that
 * were delivered before (redelivered). Both ascending. */
struct replica_handover {
    uint64_t connection_id;  /* the old primary's link connection (conn.id) here */
    uint16_t channel_id;     /* its channel: the deliveries go on there */
    uint64_t epoch;          /* the queue's, before the handover */
    uint64_t *delivered;     /* owned */
    uint32_t delivered_count, delivered_cap;
    uint64_t *redelivered;   /* owned */
    uint32_t redelivered_count, redelivered_cap;
};
/* One chunk (seqs packed as big-endian 64-bit, ascending, after those of
 * earlier chunks): false if malformed (nothing kept). A chunk from another
 * channel or epoch starts over. */
bool replica_note_handover(struct replica *replica, uint64_t connection_id, uint16_t channel_id,
                           uint64_t epoch, struct bytes delivered, struct bytes redelivered);
/* The note, if any (the caller owns it: replica_handover_free). */
struct replica_handover *replica_take_handover(struct replica *replica);
void replica_handover_free(struct replica_handover *handover); /* NULL is fine */

/* ---- promotion ---- */

/* Promotion: the stand-in's replica becomes the real queue's content, its
 * log the queue's (the queue must have opened it: same name). Frees the
 * replica. */
void replica_adopt(struct queue *queue, struct replica *replica);

#endif
