/*
 * adoption.h: queues taken over from a dead broker's log on shared
 * storage (queue.take_over), adopted a few at a time between the loop's
 * other work.
 *
 * Adopting one queue (broker/durable_adopt.c) reads its whole log and
 * copies every live message into ours: about 6 ms per MB here. A broker
 * taking over a thousand queues did it all inside the map change, in one
 * loop turn of seconds: its heartbeats, its Raft (it may lead) and its
 * API stood still meanwhile, and the other takers waited for the leader.
 * So the mirror makes such a queue real and paused (queue_pause: its
 * publishes and gets wait, in order) and hands it here; an idle handle
 * (the loop polls without blocking while it runs) adopts queues for about
 * ADOPTION_SLICE_MS per loop iteration, in batches sized to fill it from
 * the last batch's time per queue: a batch stages (renames) all its
 * queues' logs, makes the renames durable with one fsync per directory,
 * then reads each (three directory fsyncs per queue before: a thousand
 * queues waited on 3,000 device flushes). A queue's logs are read in
 * steps within the slice (durable_adopt_step: a segment or a message at a
 * time), so a deep one (~4 ms per MiB here: 512 MiB, 2 s) is read over
 * many loop turns, not in one that stopped the taker's heartbeats for
 * longer than the 2 s after which it is declared down; the next queue
 * of the batch is read once it is done. Each adopted queue
 * resumes (what waited goes in after the adopted messages)
 * and only then starts its replication and any handover the map asks,
 * with the map as it is by then: a backup caught up from an empty queue
 * would miss the adopted messages.
 *
 * A log that cannot be read whole (an I/O error, a corrupt record) leaves
 * the queue unavailable (queue.h unreadable) rather than serving without
 * those messages; the adoption is tried again, resumed from where it
 * stopped, every ADOPTION_RETRY_MS_MIN doubling to ADOPTION_RETRY_MS_MAX.
 *
 * Once our copy of its log is synced, the map learns queue.adopted.
 * A queue deleted or moved away before its turn is skipped (its log stays
 * in the dead broker's directory). When the member stops, what is pending
 * is adopted at once, so that the messages are in our own log.
 */
#ifndef QUAY_CLUSTER_ADOPTION_H
#define QUAY_CLUSTER_ADOPTION_H

#include <stdbool.h>
#include <stdint.h>

struct map_queue;
struct member;
struct queue;
struct queue_entry;

#define ADOPTION_SLICE_MS 10
/* The most queues one batch stages before it reads any (adoption.c):
 * a slice's queues are staged together, their renames made durable with
 * one fsync per directory. */
#define ADOPTION_BATCH_MAX 64
/* The waits before an adoption that could not read its logs is tried
 * again: the first, and the most it doubles to. */
#define ADOPTION_RETRY_MS_MIN 1000
#define ADOPTION_RETRY_MS_MAX 30000

/* q was just made real here by queue.take_over (mq): pause it and adopt
 * mq->taken_from's log of it soon. merge (owned: count entries, each
 * holding a message reference, ascending seqs; NULL if none): the
 * messages of the replica a takeover with the replica kept
 * (replica_take_for_merge), which go in by seq among the log's
 * (durable_adopt_step's merge). */
void adoption_start(struct member *member, struct queue *queue, const struct map_queue *mq,
                    struct queue_entry *merge, uint32_t merge_count);
/* A queue the map says we took over and never said queue.adopted for
 * (pure). */
bool adoption_leftover(const struct map_queue *mq, uint32_t self);
/* Once caught up with the map after a start: such a queue that is real
 * here already (our restart recovered it from our own log, which may lack
 * what we were copying: we crashed or restarted before that was synced)
 * resumes its adoption: what our log lacks of the logs we took it from
 * (staged in our adopted/ directory, or still in the dead broker's) is
 * added above our log's last seq, then queue.adopted once synced. A queue
 * not real here yet is adopted by its queue.take_over, with our staged
 * copies too (durable_adopt_step). */
void adoption_resume_leftovers(struct member *member);
/* The same for one such queue, held since our start (mirror.c
 * follow_queue, at the sync): it stays paused into its adoption, so that
 * nothing that waited for it (our peers' forwards) takes a seq above our
 * log's last before the adoption has added what lies there. True: its
 * adoption is pending (it resumes the queue when done); false: nothing to
 * adopt (the broker it was taken from was forgotten), serve it. */
bool adoption_resume_leftover(struct member *member, struct queue *queue,
                              const struct map_queue *mq);
/* Whether a log we staged for a takeover and did not finish (a crash or
 * a restart came first) may still be read (pure): mq (NULL: no longer in
 * the map) still waits for a queue.adopted, and we are its primary
 * (adoption_resume_leftovers, or its queue.take_over, reads it) or the
 * broker a taker of it took it from (the taker claims it). Otherwise the
 * messages in it are in a log someone reads, or in no queue at all. */
bool adoption_staged_needed(const struct map_queue *mq, uint32_t self);
/* Once caught up after a start, before adopting anything: removes what
 * our adopted/ directory holds that no adoption needs any longer, and
 * remembers what it kept: adoption_tick removes each once a map change
 * made it unneeded (not at our next start only). */
void adoption_sweep_staged(struct member *member);
/* We caught up with the map (or got a queue to adopt): adopting starts
 * (never before: see adoption.c). */
void adoption_synced(struct member *member);
/* The queue waits for its adoption: its replication and handovers wait too. */
bool adoption_pending(const struct member *member, const struct queue *queue);
/* Queues waiting (GET /metrics). */
uint32_t adoption_pending_count(const struct member *member);
/* How many of those wait to be tried again (their logs unreadable). */
uint32_t adoption_unreadable_count(const struct member *member);
/* Whether to say queue.adopted for a queue we adopted, whose copy got
 * journal ticket `ticket` (0: nothing copied): once the journal's synced
 * ticket passed it (the copy is durable: a takeover from us may then read
 * our log alone); never if the journal failed (a takeover from us reads
 * the log we took it from as well) or the queue is no longer ours. */
enum adoption_say { ADOPTION_SAY_WAIT, ADOPTION_SAY_NOW, ADOPTION_SAY_NEVER };
enum adoption_say adoption_say_when(uint64_t ticket, uint64_t synced, bool journal_failed,
                                    bool ours);
/* Every MEMBER_TICK_MS: queue.adopted for the adopted queues now synced. */
void adoption_tick(struct member *member);
/* The member stops: every pending adoption now, then the handle closes
 * (what is adopted and not said yet is never said: safe, as above). */
void adoption_stop_all(struct member *member);

#endif
