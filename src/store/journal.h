/*
 * journal.h: the broker's durable store. Per-queue message logs, a
 * definitions log, group commit on one journal thread, and recovery.
 *
 * Threads. Every function here is called on the loop thread that owns the
 * broker (the uv_loop_t given to journal_open). The journal owns one more
 * thread, which does every write and fdatasync; the loop thread hands it
 * records through a mutex-protected list and learns of completions through
 * a uv_async_t. The loop thread itself touches the disk only in
 * journal_open / journal_recover (before serving) and journal_read (a
 * synchronous pread, for paging: it may block the loop for one disk read).
 *
 * Tickets. Every call that changes the disk returns a "sync ticket": a
 * number that grows by at least one per call. When the synced callback
 * reports ticket T, everything appended with a ticket <= T is on disk
 * (fdatasync'ed, directories fsync'ed): confirm a publish only then. One
 * fdatasync per file covers every record appended before it (group commit).
 * Ticket 0 means "not written": the journal has failed (see status below).
 *
 * Failure. After a write or fsync error the journal stops writing for good
 * (an fsync error leaves the page cache in an unknown state) and reports the
 * error through the synced callback's status; later calls return ticket 0.
 * The broker must then stop confirming persistent publishes and shut down.
 *
 * Memory. struct journal owns every journal_queue. Blobs passed in are
 * copied; blobs passed to callbacks are borrowed for the call only.
 */
#ifndef QUAY_STORE_JOURNAL_H
#define QUAY_STORE_JOURNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "lib/errors.h"
#include "lib/types.h"
#include "store/disk.h"

/* Its errors (E_JOURNAL_*, besides E_IO, E_LIMIT, E_NOMEM) are in lib/errors.h. */

struct journal;
struct journal_queue; /* one durable queue's log; owned by its journal */

struct journal_options {
    const struct disk_ops *disk;       /* NULL: disk_posix() */
    uint64_t segment_size_max;         /* 0: 64 MiB; at most 1 GiB */
    uint32_t blob_size_max;            /* 0: 128 MiB; bigger publishes are refused */
    uint32_t compact_live_percent;     /* 0: 25; compact an old segment below this */
    /* A compaction copies at most this many bytes per group commit (0: 256
     * KiB), so the appends queued behind it wait for one slice, not for a
     * whole segment's live bytes (16 MiB of a 64 MiB segment once held
     * every confirm back for ~0.5 s). */
    uint32_t compact_slice_bytes;
    uint64_t definitions_compact_size; /* 0: 1 MiB; snapshot when bigger and half dead */
    /* Shared storage: after every fdatasync, before the ticket counts as
     * synced, check that each synced file's directory is still the one
     * the journal opened it in. A taker renames a log away before reading
     * it (journal_adopt), so a write that passed the check is in what the
     * taker reads, and one that did not fails the journal for good
     * (E_JOURNAL_FENCED): nothing after it is confirmed. */
    bool fenced;
};

/* ---- Lifecycle ----------------------------------------------------------- */

/* Opens (creating if needed) the journal in dir, replays the definitions log
 * (cutting a torn tail) and starts the journal thread. Returns OK, or E_IO /
 * E_JOURNAL_CORRUPT with a message naming file and offset in err. */
/* A journal only to recover dir's queue logs (journal_recover; a taker's
 * read of a staged log): no writer thread, no definitions file, nothing
 * written but recovery's own cuts of torn tails. Close it with
 * journal_close (freed at once). */
int journal_open_reader(struct journal **out, uv_loop_t *loop, const char *dir);
int journal_open(struct journal **out, uv_loop_t *loop, const char *dir,
                 const struct journal_options *opts, char *err, size_t err_size);

/* Writes and syncs everything appended, joins the thread, reports the last
 * synced ticket, and frees the journal once the loop has run its close
 * callbacks (run the loop once more after this call). */
void journal_close(struct journal *j);

/* ticket: every record with a ticket <= ticket is durable. status is OK, or
 * the error that stopped the journal (then ticket is the last durable one). */
typedef void (*journal_synced_fn)(void *ctx, uint64_t ticket, int status);
void journal_set_synced_callback(struct journal *j, journal_synced_fn fn, void *ctx);

/* Bytes appended but not yet written: block publishers above a limit. */
uint64_t journal_backlog_size(struct journal *j);
/* Blocks the caller until at most max_bytes are appended and not yet
 * written (or the journal failed): a bulk copy into the journal (an
 * adoption, on the loop) bounds the memory its records wait in. */
void journal_wait_backlog(struct journal *j, uint64_t max_bytes);
/* OK, or the error that stopped the journal. */
int journal_status(struct journal *j);

/* ---- Recovery, once, after journal_open and before any queue is opened --- */

struct journal_recovery_stats {
    uint64_t queue_count;         /* queue directories recovered */
    uint64_t message_count;       /* live messages handed to the callback */
    uint64_t segment_count;
    uint64_t byte_count;          /* bytes read */
    uint64_t deleted_queue_count; /* deletions found unfinished and finished now */
    uint64_t truncated_count;     /* torn tails cut */
    char truncated_path[512];     /* the first one cut, and where */
    uint64_t truncated_offset;
    char corrupt_path[512];       /* when E_JOURNAL_CORRUPT: where */
    uint64_t corrupt_offset;
};

/* Called once per live (unacked) message, queue by queue, in seq order. */
typedef void (*journal_recover_fn)(void *ctx, struct journal_queue *q, struct bytes vhost,
                                   struct bytes queue, uint64_t seq, bool delivered,
                                   const void *blob, uint32_t size);

/* Reads every queue log sequentially with whole-segment reads. A torn or
 * corrupt record at the tail of a queue's last segment (and nothing valid
 * after it) is cut: the file is truncated and the cut reported in stats.
 * Any other bad record returns E_JOURNAL_CORRUPT with stats->corrupt_path
 * and corrupt_offset; that queue's files are left untouched and the broker
 * must not serve (queues recovered before it may already have had their
 * callbacks and torn tails cut). Recovery also re-appends a DELIVERED or
 * reclaims segments left behind by a half-done compaction. The operator's
 * recourse: restore the queue from a backup broker, or move the named
 * queue directory aside (losing that queue's messages) and restart; the
 * journal never skips records silently. Returns OK, E_IO or E_JOURNAL_CORRUPT. */
int journal_recover(struct journal *j, journal_recover_fn fn, void *ctx,
                    struct journal_recovery_stats *stats);

/* ---- Queues -------------------------------------------------------------- */

/* The log of (vhost, name): the recovered one, or a new empty one (its
 * directory is created by the journal thread). Never NULL. */
struct journal_queue *journal_queue_open(struct journal *j, struct bytes vhost,
                                         struct bytes name);
/* Deletes the recovered queues that were not opened since recovery: call it
 * after restoring definitions, so a queue deleted from the definitions but
 * not from disk before a crash does not linger. */
void journal_queue_delete_unopened(struct journal *j);

/* The highest seq ever published on this queue (0 for none): the broker
 * numbers new messages above it. Seqs must be strictly increasing. */
uint64_t journal_queue_seq_last(const struct journal_queue *q);
uint64_t journal_queue_live_count(const struct journal_queue *q);

/* Appends one record; the return value is the record's sync ticket. */
uint64_t journal_publish(struct journal_queue *q, uint64_t seq, const void *blob, uint32_t size);
uint64_t journal_delivered(struct journal_queue *q, uint64_t seq);
uint64_t journal_ack(struct journal_queue *q, uint64_t seq);
/* journal_ack of every seq in [first, last] the log holds unacked (a
 * purge's run of ready messages, a backup told of it): one record, and
 * seqs it does not hold (transient messages) are no business of it. */
uint64_t journal_ack_range(struct journal_queue *q, uint64_t first, uint64_t last);
uint64_t journal_purge(struct journal_queue *q, uint64_t seq_below);
/* Appends DELETE, then removes the queue's files; q is freed at once. */
uint64_t journal_queue_delete(struct journal_queue *q);
/* Forgets a log another broker took over (or will: journal_adopt): closes
 * its files and writes nothing, so the taker finds it as it was. q is
 * freed at once. */
void journal_queue_abandon(struct journal_queue *q);
/* journal_queue_delete, then journal_queue_open of the same name: an empty
 * log whose seqs may start over (a backup's copy after a catch-up's
 * reset). q is freed; the new log is returned. */
struct journal_queue *journal_queue_recreate(struct journal_queue *q);

/* ---- Takeover from shared storage (journal_adopt.c) ----------------------- */

struct journal_adoption {
    char staged[512];  /* where the adopted log now is; "" when there was none */
    uint64_t seq_last; /* the highest seq it ever gave (number new messages above) */
    struct journal_recovery_stats stats;
};

/* Takes over (vhost, name)'s log from foreign_dir, the journal directory of
 * a dead broker on the same shared storage: renames it into this journal's
 * adopted/ directory (the fence: see journal_options.fenced), makes that
 * durable (journal_adopt_stage, then journal_adopt_commit: with any other
 * rename staged before), recovers it
 * there with the journal's recovery and calls fn for every live message
 * in seq order (its journal_queue argument is a temporary one: do not keep
 * it). The caller appends them to its own log and, once that is synced,
 * calls journal_adopt_finish(out->staged). OK with out->staged "" when
 * foreign_dir holds no log of that queue; E_IO or E_JOURNAL_CORRUPT
 * (recovery's; the staged copy is left as it is). Synchronous disk reads
 * on the loop thread; the loop must run afterwards to free the temporary
 * journal. */
int journal_adopt(struct journal *j, const char *foreign_dir, struct bytes vhost,
                  struct bytes name, journal_recover_fn fn, void *ctx,
                  struct journal_adoption *out);
/* journal_adopt in steps, so that the renames of many takeovers are made
 * durable together: stage each (renames it into our adopted/ directory, as
 * journal_adopt does; staged gets its path, "" when foreign_dir holds no
 * log of the queue; OK or E_IO), then journal_adopt_commit once, then
 * journal_adopt_read each staged path. Reading before the commit asserts:
 * the rename must be durable before the taker reads (and so serves or
 * writes) anything of the log. */
int journal_adopt_stage(struct journal *j, const char *foreign_dir, struct bytes vhost,
                        struct bytes name, char *staged);
/* Makes every rename staged since the last commit (journal_adopt_stage,
 * journal_adopt_claim_staged) durable: one fsync per directory they
 * changed, however many renames changed it. OK, or E_IO (logged): the
 * logs staged since are then not to be read. */
int journal_adopt_commit(struct journal *j);
/* A taker that died before its copy was synced left the log it was
 * adopting staged, in taker_dir/adopted/<source>.<id> (its own log may
 * lack the copy). Moves source's staged log of (vhost, name), if any, into
 * this journal's adopted/ directory (rename: the claim), with the same
 * fence as journal_adopt; staged gets its new path, "" when there was
 * none. Read it with journal_adopt_read after journal_adopt_commit.
 * taker_dir NULL: our own
 * adopted/ directory (a takeover of ours cut short by a crash or a
 * restart; the log stays where it is). OK, or E_IO. */
int journal_adopt_claim_staged(struct journal *j, const char *taker_dir, const char *source,
                               struct bytes vhost, struct bytes name, char *staged);
/* The sources of the staged copies in taker_dir/adopted/ (NULL: ours),
 * each once, in no particular order (a removal's *.gone left out): up to
 * cap names into sources (each JOURNAL_SOURCE_SIZE bytes, NUL-terminated).
 * Returns how many, or a negative errno (none there: 0). Names only: no
 * log is read. */
#define JOURNAL_SOURCE_SIZE 256
int journal_adopt_staged_sources(struct journal *j, const char *taker_dir,
                                 char (*sources)[JOURNAL_SOURCE_SIZE], uint32_t cap);
/* journal_adopt's second half: recovers the staged log at staged (one of
 * ours, committed: journal_adopt_commit) and calls fn for its live
 * messages; out as journal_adopt's. */
int journal_adopt_read(struct journal *j, const char *staged, journal_recover_fn fn, void *ctx,
                       struct journal_adoption *out);
/* journal_adopt_read in steps, so that a deep log does not hold the loop
 * for as long as it takes to read (a taker's heartbeats wait meanwhile):
 * _start opens it (it reads nothing yet); each _step reads until until_ns
 * (uv_hrtime; 0: to the end; at least a segment or a message), calling
 * fn, and returns AGAIN while there is more, else OK or the error;
 * _finish fills out, frees the reading (the loop must run afterwards, as
 * after journal_adopt_read) and returns journal_adopt_read's result (one
 * cut short before its end: E_IO). */
struct journal_reading;
struct journal_reading *journal_adopt_read_start(struct journal *j, const char *staged,
                                                 journal_recover_fn fn, void *ctx);
int journal_adopt_read_step(struct journal_reading *rd, uint64_t until_ns);
int journal_adopt_read_finish(struct journal_reading *rd, struct journal_adoption *out);
/* Our adopted/ directory after a restart, once the caller knows (the
 * cluster map) who may still need what is staged there: fn(ctx, vhost,
 * name, staged) for each staged log, by its queue (staged: its root, for
 * a journal_adopt_finish later); true removes it (journal_adopt_finish).
 * Removals a crash cut short are finished. */
typedef bool (*journal_staged_fn)(void *ctx, struct bytes vhost, struct bytes name,
                                  const char *staged);
void journal_adopt_sweep(struct journal *j, journal_staged_fn fn, void *ctx);
/* Removes an adopted log's staged copy (its messages are in our log now);
 * renamed away first, so a taker claiming it meanwhile gets it whole. */
void journal_adopt_finish(struct journal *j, const char *staged);

/* ---- Paging -------------------------------------------------------------- */

/* Where a live message is now. Compaction moves messages, so keep the seq
 * (and size) of a paged-out message, not its location: the journal keeps
 * the index (24 bytes per live message) and journal_read follows moves. */
struct journal_location {
    uint64_t segment_number;
    uint32_t offset;    /* of the PUBLISH record in the segment */
    uint32_t blob_size;
};
int journal_locate(const struct journal_queue *q, uint64_t seq, struct journal_location *out);

/* Reads a live message's blob back (size must be >= its blob_size) with a
 * synchronous pread on the calling (loop) thread, after waiting for the
 * journal thread to have written it. Checks the record's crc and seq.
 * Returns OK, E_JOURNAL_NOT_FOUND, E_IO or E_JOURNAL_CORRUPT. */
int journal_read(struct journal_queue *q, uint64_t seq, void *buf, uint32_t size);

/* ---- Definitions --------------------------------------------------------- */

/* The definitions log stores (kind, key) -> value. The journal reads only
 * kind and key; the value is opaque bytes (the broker's encoding of an
 * exchange, a queue with its argument table, ...). Key conventions, chosen
 * by the broker, must make keys unique per kind, e.g.:
 *   VHOST "name"; USER "name"; PERMISSION "user\0vhost";
 *   EXCHANGE / QUEUE "vhost\0name";
 *   BINDING "vhost\0source\0destination_kind destination\0routing_key\0args";
 *   POLICY "vhost\0name" (a broker outside a cluster; a log with one is
 *   refused by binaries from before policies);
 *   LIMIT "scope kind name" (one byte each of enum limit_scope and
 *   enum limit_kind, then the vhost's or user's name; likewise refused by
 *   binaries from before limits). */
enum journal_def_kind {
    JOURNAL_DEF_VHOST = 1,
    JOURNAL_DEF_USER = 2,
    JOURNAL_DEF_PERMISSION = 3,
    JOURNAL_DEF_EXCHANGE = 4,
    JOURNAL_DEF_QUEUE = 5,
    JOURNAL_DEF_BINDING = 6,
    JOURNAL_DEF_POLICY = 7,
    JOURNAL_DEF_LIMIT = 8,
};
#define JOURNAL_DEF_KIND_MAX 8

/* Put replaces the value for (kind, key); delete removes it (a no-op record
 * when absent). Both return a sync ticket. The log is rewritten as a
 * snapshot (write, fdatasync, rename) when it grows past
 * definitions_compact_size and is more than half dead. */
uint64_t journal_define(struct journal *j, enum journal_def_kind kind, struct bytes key,
                        struct bytes value);
uint64_t journal_undefine(struct journal *j, enum journal_def_kind kind, struct bytes key);

/* Calls fn for every live definition: by kind (vhosts first, bindings last),
 * then in the order they were last put. Read at journal_open. fn must not
 * define or undefine anything (asserted): key and value point into the
 * entries, which a change frees; it collects what to change for after. */
typedef void (*journal_definition_fn)(void *ctx, enum journal_def_kind kind, struct bytes key,
                                      struct bytes value);
void journal_recover_definitions(struct journal *j, journal_definition_fn fn, void *ctx);
uint64_t journal_definitions_count(const struct journal *j);

#endif
