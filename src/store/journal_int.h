/*
 * journal_int.h: the journal's internal structures, shared by journal.c
 * (thread, operations, group commit), journal_queue.c (queue logs,
 * reclamation, compaction, paging), journal_recover.c and journal_defs.c.
 * Not for other modules: they use journal.h.
 *
 * Who touches what:
 *
 *   loop thread                          journal thread
 *   -----------                          --------------
 *   struct journal_queue, segments,      struct jfile.fd/.dirty, the dirty
 *   index, definitions map, ticket_last  lists, executes struct op in order
 *             \                         /
 *              +-- j->ops list (mutex) -+   synced/executed tickets: atomics
 *
 * The loop thread decides everything (which segment, which offset, what to
 * copy or delete) and turns it into struct op; the journal thread only
 * performs ops, in order, and syncs. A struct jfile is allocated by the loop
 * thread and freed by the journal thread (OP_RELEASE, OP_UNLINK); after
 * queueing either, the loop thread must not touch it.
 */
#ifndef QUAY_STORE_JOURNAL_INT_H
#define QUAY_STORE_JOURNAL_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "lib/hash.h"
#include "store/format.h"
#include "store/journal.h"

#define JOURNAL_PATH_SIZE 512
/* A dead segment's name while it is removed in steps (journal.c);
 * recovery removes what a crash left of it. */
#define JOURNAL_DEAD_SUFFIX ".dead"
/* journal_adopt.c: an adopted/ entry, <source broker>.<16 hex digits>. */
#define ADOPT_LEAF_SIZE 220
#define JOURNAL_ADOPT_INDEXES 5

/* A file the journal thread writes. Owned by the journal thread once the
 * loop thread has queued an op naming it (see above). */
struct jfile {
    char path[JOURNAL_PATH_SIZE];
    int fd;             /* journal thread only; -1 when closed */
    bool dirty;         /* journal thread only: written since its last fdatasync */
    bool created;       /* journal thread only: opened with O_CREAT once */
    uint64_t dir_identity[2]; /* journal thread only, fenced journals: its directory's */
};

enum op_kind {
    OP_APPEND,       /* pwrite data at offset of file */
    OP_COPY,         /* copy size bytes of a record from source to file at offset */
    OP_CLOSE,        /* fdatasync if dirty, close the descriptor (file stays) */
    OP_RELEASE,      /* OP_CLOSE, then free the jfile */
    OP_UNLINK,       /* sync everything, close, unlink the file, free the jfile */
    OP_MKDIR,        /* mkdir path; its parent is fsync'ed with the batch */
    OP_WRITE_ATOMIC, /* write path.tmp, fdatasync, rename over path, fsync dir;
                        file (optional) is closed so that it reopens the new one */
    OP_RENAME,       /* sync everything, rename path -> path2, fsync the parent */
    OP_REMOVE_TREE,  /* unlink every file in directory path, rmdir it */
    OP_REMOVE_STAGED, /* remove the tree path (an adopted log's staged copy:
                         journal__remove_staged); a failure is logged, not
                         the journal's */
    OP_STOP,         /* the last op: the thread exits after this batch */
};

/* One unit of work for the journal thread. Owned by the ops list, then by
 * the journal thread, which frees it. */
struct op {
    struct op *next;
    enum op_kind kind;
    uint64_t ticket;
    struct jfile *file;   /* borrowed */
    struct jfile *source; /* borrowed: OP_COPY */
    uint64_t offset;
    uint64_t source_offset;
    uint64_t seq;      /* OP_COPY: the message it must find at source_offset */
    uint64_t seq_last; /* OP_COPY: the run's last message (seqs rise in between) */
    uint64_t count;    /* OP_COPY: the run's messages */
    uint64_t size;     /* bytes in data (APPEND, WRITE_ATOMIC) or copied (COPY) */
    uint64_t capacity; /* bytes allocated in data */
    char path[JOURNAL_PATH_SIZE];
    char path2[JOURNAL_PATH_SIZE];
    uint8_t data[];
};

/* One segment of a queue log, as the loop thread sees it. */
struct segment {
    uint64_t number;
    uint64_t size;       /* bytes appended so far (written or queued) */
    uint64_t live_count; /* PUBLISH records here that are not acked */
    uint64_t live_size;  /* their record bytes */
    uint64_t ref_min;    /* lowest older segment an ACK/DELIVERED/PURGE here names */
    struct jfile *file;  /* handed to the journal thread; see jfile */
    int read_fd;         /* the loop thread's descriptor for journal_read, or -1 */
};

#define ENTRY_DELIVERED 1u
#define ENTRY_ACKED 2u

/* One live message in a queue's index (24 bytes; 1M messages = 24 MB). */
struct entry {
    uint64_t seq;
    uint32_t segment_number;
    uint32_t offset;
    uint32_t blob_size;
    uint32_t flags;
};
static_assert(sizeof(struct entry) == 24, "index entries stay small");

/* Owned by its journal. */
struct journal_queue {
    struct journal *journal; /* borrowed */
    uint64_t id;
    uint8_t id_key[8];       /* the id as the j->queue_ids key */
    char dir[JOURNAL_PATH_SIZE];
    uint8_t *key;            /* owned: u32 vhost_size, vhost, name (RECORD_QUEUE_NAME) */
    uint32_t key_size;
    struct bytes vhost;      /* slices of key */
    struct bytes name;
    struct segment *segments; /* owned, by number; the last one is current */
    size_t segments_count;
    size_t segments_cap;
    struct entry *entries;   /* owned, by seq; [entries_head, entries_count) in use */
    size_t entries_head;
    size_t entries_count;
    size_t entries_cap;
    uint64_t live_count;
    uint64_t seq_last;
    uint64_t purge_below;
    uint64_t ticket_last;    /* the last op naming this queue's files */
    bool opened;             /* by journal_queue_open since recovery */
    bool maintain_pending;   /* a segment rolled: look for work once the call is done */
    /* A compaction goes in slices (journal_queue.c): the live messages of
     * segment compact_number from seq compact_seq on are still to copy,
     * and the next slice waits until the journal synced compact_ticket,
     * the last op of the one before. The queue is in j->compacting
     * meanwhile. */
    bool compacting;
    uint64_t compact_number;
    uint64_t compact_seq;
    uint64_t compact_ticket;
};

struct def_entry {
    uint8_t *key;        /* owned: kind byte, then the caller's key */
    uint32_t key_size;
    uint8_t *value;      /* owned */
    uint32_t value_size;
    uint64_t order;      /* when it was last put */
};

/* Owned by whoever opened it. */
struct journal {
    uv_loop_t *loop;     /* borrowed */
    uv_async_t async;
    const struct disk_ops *disk; /* borrowed */
    struct journal_options opts;
    char dir[JOURNAL_PATH_SIZE];
    char queues_dir[JOURNAL_PATH_SIZE];

    /* Shared with the journal thread, under mutex. */
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t work_cond;
    pthread_cond_t executed_cond;
    struct op *ops_head;
    struct op *ops_tail;
    uint64_t backlog_size;
    uint64_t executed_ticket;

    /* Written by the journal thread, read by the loop thread. */
    _Atomic uint64_t synced_ticket;
    _Atomic int failed;

    /* Journal thread only. */
    struct jfile **dirty_files;
    size_t dirty_files_count;
    size_t dirty_files_cap;
    char (*dirty_dirs)[JOURNAL_PATH_SIZE];
    size_t dirty_dirs_count;
    size_t dirty_dirs_cap;
    /* A deleted log's files still to remove, a step a round (journal.c). */
    struct journal_gc *gc_head;
    struct journal_gc *gc_tail;
    uint64_t gc_due_ns;  /* uv_hrtime(): the next step not before */

    /* Loop thread only. */
    uint64_t ticket_last;
    uint64_t synced_reported;
    bool failed_reported;
    journal_synced_fn synced_fn;
    void *synced_ctx;
    bool recovered;
    bool thread_started;
    bool reader; /* journal_open_reader: no thread (ops run inline), no definitions */
    /* A temporary journal reading an adopted log (journal_adopt): a DELETE
     * record in it was written by the old owner after the queue was no
     * longer its own (the map still has the queue), so it is ignored. */
    bool adopting;
    /* journal_adopt.c: the directories last scanned, each with its queue
     * key -> struct adopt_entry index (loop thread). Five: a takeover may
     * read, in turn, a dead taker's queues/ and adopted/, the dead broker's
     * queues/, and our own adopted/ for either of the two. */
    struct adopt_index {
        char scanned[JOURNAL_PATH_SIZE]; /* "": unused */
        struct hmap entries;
        uint64_t built_ms;               /* loop time of the scan */
    } adopt_indexes[JOURNAL_ADOPT_INDEXES];
    /* journal_adopt.c: the directories whose entries takeovers' renames
     * changed since the last journal_adopt_commit, each once (loop thread):
     * nothing staged is read before they are fsynced. */
    char (*adopt_unsynced)[JOURNAL_PATH_SIZE];
    uint32_t adopt_unsynced_count;
    uint32_t adopt_unsynced_cap;
    uint64_t deleted_counter;
    struct hmap queues;      /* key -> struct journal_queue */
    struct hmap queue_ids;   /* id_key -> struct journal_queue */
    /* The queues with a compaction under way (borrowed; a queue leaves the
     * array when its compaction ends or it is freed): each synced report
     * gives the next slice of those whose last slice is on disk. */
    struct journal_queue **compacting;
    size_t compacting_count;
    size_t compacting_cap;

    struct hmap definitions; /* def_entry.key -> struct def_entry */
    struct jfile *definitions_file;
    uint64_t definitions_size;      /* bytes in the file (written or queued) */
    uint64_t definitions_live_size; /* record bytes of live puts */
    uint64_t definitions_order;
    /* In journal_recover_definitions: its callback sees keys and values in
     * the entries, so nothing may put or delete one until it returns. */
    bool definitions_walking;
};

/* journal.c */
struct op *journal__op_new(enum op_kind kind, uint64_t capacity);
uint64_t journal__op_push(struct journal *j, struct op *op);
/* Append a record (encoded under the ops lock) or raw bytes to file at
 * offset, merging with the last queued op when contiguous; return the ticket. */
uint64_t journal__append_record(struct journal *j, struct jfile *file, uint64_t offset,
                                enum record_type type, const void *a, uint32_t a_size,
                                const void *b, uint32_t b_size);
uint64_t journal__append_bytes(struct journal *j, struct jfile *file, uint64_t offset,
                               const void *data, uint64_t size);
struct jfile *journal__file_new(const char *path);
void journal__wait_executed(struct journal *j, uint64_t ticket);
void journal__path(char *out, const char *a, const char *b);
bool journal__ends_with(const char *s, const char *tail);

/* journal_queue.c */
struct journal_queue *journal__queue_new(struct journal *j, uint64_t id, struct bytes vhost,
                                         struct bytes name);
void journal__queue_free(struct journal_queue *q);
void journal__queue_release_files(struct journal_queue *q);
void journal__queue_maintain(struct journal_queue *q);
/* The next slice of each compaction whose last slice is synced (called
 * when the journal thread reports). */
void journal__compactions_resume(struct journal *j);
/* Appends DELIVERED again for a message whose first DELIVERED record may sit
 * in a segment that is about to go (recovery, after a half-done compaction). */
void journal__queue_remark_delivered(struct journal_queue *q, uint64_t seq,
                                     uint64_t segment_number);
struct segment *journal__segment_push(struct journal_queue *q, uint64_t number);
struct segment *journal__segment_find(struct journal_queue *q, uint64_t number);

/* journal_recover.c: journal_recover in steps (a taker reads a deep log
 * over many turns of the loop, journal_adopt_read_step). _start lists the
 * queue directories (stats zeroed); each _step works until until_ns
 * (uv_hrtime; 0: to the end; at least one unit: a segment scanned or a
 * message handed over) and returns AGAIN while there is more, else OK or
 * the error; _finish frees it and returns what journal_recover would (a
 * recovery cut short before the end: E_IO). */
struct recovery;
struct recovery *journal__recovery_start(struct journal *j, journal_recover_fn fn, void *ctx,
                                        struct journal_recovery_stats *stats);
int journal__recovery_step(struct recovery *r, uint64_t until_ns);
int journal__recovery_finish(struct recovery *r);

/* journal_adopt.c: logs a warning for each staged copy left by a takeover
 * that a crash interrupted (its messages are on disk but not served). */
void journal__adopted_report(struct journal *j);
/* Removes a staged copy: renamed to <staged>.gone first (a taker's claim
 * gets all of it or none), then removed; gone already (claimed): 0
 * (journal_adopt.c, on the journal thread). */
int journal__remove_staged(const struct disk_ops *d, const char *staged);
/* Removes path, a file or a directory tree (journal_adopt.c). */
int journal__remove_path(const struct disk_ops *d, const char *path);
void journal__adopt_init(struct journal *j);
void journal__adopt_free(struct journal *j);

/* journal_defs.c */
int journal__definitions_open(struct journal *j, char *err, size_t err_size);
void journal__definitions_free(struct journal *j);

#endif
