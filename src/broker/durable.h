/*
 * durable.h: what the broker keeps on disk, through the journal (store/).
 *
 * Durable exchanges and queues, and bindings between durable things, are
 * journal definitions; persistent messages on durable queues are journal
 * records (queue.c appends them). At start, durable_open replays both:
 * definitions first, then every queue's live messages in order, with
 * redelivered=true for those handed out before the crash.
 *
 * Confirms: a publish that the journal must hold waits for the journal's
 * group-commit fsync; the journal reports "everything up to ticket T is
 * on disk" once per fsync, and durable fans that out to the channels in
 * its waiters list.
 *
 * Vhosts are definitions too (so a restart finds the vhosts of its
 * durable queues, whoever created them). Outside a cluster so are users
 * and their permissions, once the broker has them (broker/users.h): the
 * users file only seeds the first start. In a cluster the map holds users.
 */
#ifndef QUAY_BROKER_DURABLE_H
#define QUAY_BROKER_DURABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"
#include "lib/list.h"

struct binding;
struct broker;
struct policy;
struct exchange;
struct journal;
struct queue;
struct vhost;

struct durable_adopted;     /* durable_adopt.c */
struct durable_adopt_plan;  /* durable_adopt.c */
struct queue_entry;

/* Messages to merge by seq with an adopted log: a takeover by an in-sync
 * backup that kept its replica (x-quay-replicate "transient": the replica
 * has the transient messages, the log the persistent ones; a persistent
 * one the replica also has is taken from the log where both have its
 * seq). entries: ascending seqs, each holding one message reference, which
 * durable_adopt_step hands to the queue (they keep their redelivered flag);
 * next: the first not handed over yet. */
struct durable_merge {
    struct queue_entry *entries; /* owned by the caller */
    uint32_t count, next;
};

struct durable {
    struct journal *journal;          /* owned */
    struct durable_adopted *adopted;  /* owned: staged logs to remove once copied */
    struct durable_adopt_plan *adopt_staging; /* borrowed: staged, not committed yet */
    struct durable_merge *merge;      /* borrowed during a durable_adopt_step, else NULL */
    bool replaying;                   /* recovery: do not log what we replay */
    uint64_t synced_ticket;           /* everything up to this is on disk */
    int status;                       /* the journal's first error, 0 if none */
    struct list_node confirm_waiters; /* struct channel.durable_link */
    bool users_recorded;              /* the journal holds the users (replayed) */
};

/* Opens DATA_DIR's journal and replays it into the broker's vhosts.
 * Returns 0, or -1 with a message (e.g. corruption, and where). */
int durable_open(struct broker *broker, char *err, size_t err_size);
/* Flushes and closes the journal (after the loop stopped serving). */
void durable_close(struct broker *broker);

void durable_exchange_declared(struct broker *broker, struct vhost *vhost,
                               struct exchange *exchange);
void durable_exchange_deleted(struct broker *broker, struct vhost *vhost,
                              struct exchange *exchange);
/* Opens the queue's message log (queue->journal) and defines it. */
void durable_queue_declared(struct broker *broker, struct vhost *vhost, struct queue *queue);
void durable_queue_deleted(struct broker *broker, struct vhost *vhost, struct queue *queue);
/* A durable queue's backup logs its replica's persistent messages in the
 * log the real queue opens if the backup is promoted (cluster/replica.h).
 * The log is defined as a replica's (a QUEUE definition marked so), which
 * a restart recovers as a queue, held until the cluster's present map
 * decides (as every recovered queue): a backup that dies as it is
 * promoted (the map can name it primary before it has heard of the
 * restart) comes back holding what its replica had, not nothing; one the
 * map does not make primary drops it. Opens the log of the stand-in's
 * name (the stand-in gives it name, auto_delete and arguments) and
 * defines it; NULL for a queue without a log (not durable, exclusive, no
 * journal). A promotion's declare replaces the definition. */
struct journal_queue;
struct journal_queue *durable_replica_log_open(struct broker *broker, struct queue *stand_in);
/* The stand-in's replica, with its log, went (the replica deleted the log). */
void durable_replica_log_deleted(struct broker *broker, struct queue *stand_in);
void durable_binding_added(struct broker *broker, struct vhost *vhost, struct binding *binding);
void durable_binding_removed(struct broker *broker, struct vhost *vhost,
                             struct binding *binding);

/* A replication policy of a broker outside a cluster was put or deleted. */
void durable_policy_put(struct broker *broker, const struct policy *policy);
void durable_policy_deleted(struct broker *broker, struct bytes vhost, struct bytes name);
/* A vhost or user limit of a broker outside a cluster was put or deleted
 * (scope and kind are enum limit_scope and enum limit_kind). */
void durable_limit_put(struct broker *broker, int scope, struct bytes name, int kind,
                       int64_t value);
void durable_limit_deleted(struct broker *broker, int scope, struct bytes name, int kind);

/* Vhosts, users and permissions (broker/users.h decides which are kept). */
struct auth_user;
struct auth_permission;
void durable_vhost_put(struct broker *broker, struct bytes name);
void durable_vhost_deleted(struct broker *broker, struct bytes name);
/* Also records that the journal now holds the users (users_recorded). */
void durable_user_put(struct broker *broker, const struct auth_user *user);
void durable_user_deleted(struct broker *broker, struct bytes name);
void durable_permission_put(struct broker *broker, const struct auth_user *user,
                            const struct auth_permission *permission);
void durable_permission_deleted(struct broker *broker, struct bytes user, struct bytes vhost);

/* Pages out up to `wanted` bytes of ready persistent messages across the
 * durable queues (memory pressure). Returns the bytes released. */
uint64_t durable_page_out(struct broker *broker, uint64_t wanted);

/* Shared storage (durable_adopt.c): the queue, just made real here by a
 * queue.take_over from broker `owner_name`, adopts that broker's log of it
 * (journal_adopt): every live persistent message goes into the queue and
 * into our own log, redelivered if it had been delivered; the staged copy
 * goes once our copy is synced. A stale log of ours under the same name is
 * replaced. earlier (earlier_count names, newest first; none: NULL, 0):
 * the chain of brokers owner_name had taken the queue over from, each
 * without saying it adopted (earlier[0] the one owner_name took it from,
 * earlier[1] the one earlier[0] took it from, ...); each log, in that
 * order, adds the messages above those the logs before it hold. Each is
 * where its broker left it, or staged in the adopted/ directory of a
 * taker after it in the chain (one that died before its copy was
 * synced), or in ours (a crash or a restart cut our takeover short).
 * At most DURABLE_ADOPT_CHAIN_MAX.
 * resume: the queue is ours already, from our own log (a restart found
 * it, and the map says we never said queue.adopted): nothing replaced,
 * only what lies above our log's last seq is added.
 *
 * In steps, so that many queues' renames are made durable together
 * (cluster/adoption.c stages a slice's queues, commits once, then reads
 * them) and a deep log does not hold the loop for as long as it takes to
 * read (a taker's heartbeats would stop): durable_adopt_stage renames
 * every log of the queue into our adopted/ directory (the fence) and
 * returns the plan; durable_adopt_commit makes the renames of every plan
 * staged since the last commit durable (one fsync per directory); each
 * durable_adopt_step then reads a committed plan (it asserts the commit:
 * the fence must be durable before the queue gets, serves or logs
 * anything of those logs) until until_ns (uv_hrtime; 0: to the end; at
 * least a segment or a message), and returns AGAIN while there is more,
 * OK once every log is read, or -1 where a log could not be staged or read
 * whole (logged). Between steps the queue holds what was read so far (it
 * stays paused). durable_adopt_finish (status: the last step's) frees the
 * plan and returns the messages adopted, or -1: then what went in stays
 * in the queue and in our log, what was staged stays staged in our
 * adopted/, and the queue must not serve until a new plan with resume (our
 * log holds what went in) reads the rest. durable_adopt_discard frees a
 * plan not to be read on (its queue went meanwhile: what it staged stays
 * in our adopted/, reported, and swept at our next start). ticket: our
 * copy's last record (0: nothing copied); the copy is durable once
 * durable_synced_ticket passes it (it covers what went in before a
 * failure too). merge (or NULL): messages that go in by seq among the
 * adopted ones (all of them, once the logs are read whole: none is lost;
 * until then merge->next says where the next try goes on). */
#define DURABLE_ADOPT_CHAIN_MAX 8
struct durable_adopt_plan *durable_adopt_stage(struct broker *broker, struct queue *queue,
                                               const char *owner_name,
                                               const char *const *earlier,
                                               uint32_t earlier_count, bool resume);
void durable_adopt_commit(struct broker *broker);
int durable_adopt_step(struct broker *broker, struct durable_adopt_plan *plan,
                       struct durable_merge *merge, uint64_t until_ns);
int64_t durable_adopt_finish(struct broker *broker, struct durable_adopt_plan *plan,
                             struct durable_merge *merge, int status, uint64_t *ticket);
void durable_adopt_discard(struct broker *broker, struct durable_adopt_plan *plan);
/* The queue, ours until now, was taken over from our log (queue.take_over
 * names us): its log is closed without a write, neither the DELETE nor
 * the removal its deletion would make, so a taker that has not read it
 * yet finds it whole. Nor is the queue undefined when it is deleted
 * (queue->log_left): our restart before the taker renamed the log away
 * reopens it (held, given up again at the sync), where an undefined one
 * was deleted at the start. A log with nothing ever written (one our
 * restart just opened) is left to the queue's deletion. */
void durable_abandon_log(struct broker *broker, struct queue *queue);
/* The journal synced up to ticket: staged copies it covers go. */
void durable__adopted_synced(struct broker *broker, uint64_t ticket);
/* A log read into memory (replayed at start, or adopted: copied into our
 * journal too), one message (size: its record's) at a time: every 4096
 * messages or DURABLE_READING_CHECK_BYTES, the copy waits while more than
 * DURABLE_READING_BACKLOG_MAX of it is not written yet, and past half the
 * memory high watermark ready messages of durable queues leave memory
 * for their logs. So a log bigger than memory is read with its tail left
 * on disk (the alarm's tick, which pages too, does not run meanwhile:
 * the read is one step of the loop). reading: the caller's, zeroed. */
#define DURABLE_READING_CHECK_BYTES (8u << 20)
#define DURABLE_READING_BACKLOG_MAX (32u << 20)
struct durable_reading {
    uint64_t messages, bytes;
};
void durable__bound_memory_while_reading(struct broker *broker, struct durable_reading *reading,
                                 uint64_t size);
/* Frees the list at close (staged copies not yet covered stay on disk). */
void durable__adopted_free(struct broker *broker);

uint64_t durable_synced_ticket(const struct broker *broker);
/* The journal stopped for good (an I/O error, or fenced on shared
 * storage): it gives ticket 0, so a persistent publish must be nacked,
 * not confirmed. */
bool durable_failed(const struct broker *broker);
/* A channel has confirms waiting for a sync: link it (idempotent). */
void durable_wait_for_sync(struct broker *broker, struct list_node *channel_link);

#endif
