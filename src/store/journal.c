/*
 * journal.c: the journal's lifecycle, its thread and group commit.
 *
 * Owns the journal thread and the ops list. The loop thread queues ops
 * (journal__op_push, journal__append); the journal thread takes the whole
 * list at once, performs it in order, fdatasyncs every file it dirtied and
 * fsyncs every directory it changed, then publishes the batch's last ticket
 * as synced and wakes the loop through uv_async. One fdatasync therefore
 * covers every record appended before it: that is the group commit. This
 * file must never decide what to write: queue and definitions logic lives
 * in journal_queue.c and journal_defs.c.
 */
#include "store/journal_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

#define APPEND_CAPACITY_MIN (64u * 1024u)

void journal__path(char *out, const char *a, const char *b)
{
    int n = snprintf(out, JOURNAL_PATH_SIZE, "%s/%s", a, b);
    ASSERT(n > 0 && n < JOURNAL_PATH_SIZE);
}

bool journal__ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

static void parent_path(char *out, const char *path)
{
    const char *slash = strrchr(path, '/');
    ASSERT(slash != NULL);
    size_t n = (size_t)(slash - path);
    ASSERT(n < JOURNAL_PATH_SIZE);
    memcpy(out, path, n);
    out[n] = '\0';
}

struct jfile *journal__file_new(const char *path)
{
    struct jfile *f = xcalloc(1, sizeof(*f));
    ASSERT(strlen(path) < sizeof(f->path));
    memcpy(f->path, path, strlen(path) + 1);
    f->fd = -1;
    return f;
}

struct op *journal__op_new(enum op_kind kind, uint64_t capacity)
{
    struct op *op = xmalloc(sizeof(*op) + capacity);
    memset(op, 0, sizeof(*op));
    op->kind = kind;
    op->capacity = capacity;
    return op;
}

/* Returns the ticket; 0 (and the op is dropped) once the journal failed. */
static void exec_op(struct journal *j, struct op *op);

uint64_t journal__op_push(struct journal *j, struct op *op)
{
    ASSERT(op->next == NULL);
    if (j->reader) { /* (only what lets go of files: a reader writes nothing) */
        ASSERT(op->kind == OP_RELEASE || op->kind == OP_CLOSE);
        uint64_t ticket = op->ticket = ++j->ticket_last;
        exec_op(j, op);
        free(op);
        j->executed_ticket = ticket;
        return ticket;
    }
    ASSERT(j->thread_started);
    pthread_mutex_lock(&j->mutex);
    uint64_t ticket = op->ticket = ++j->ticket_last;
    if (j->ops_tail != NULL)
        j->ops_tail->next = op;
    else
        j->ops_head = op;
    j->ops_tail = op;
    j->backlog_size += op->size;
    pthread_cond_signal(&j->work_cond);
    pthread_mutex_unlock(&j->mutex);
    /* op may be executed and freed by now: use the copy. */
    return atomic_load(&j->failed) == OK ? ticket : 0;
}

/* Appends size bytes to file at offset, merging into the last queued op when
 * it is an APPEND that ends there, and fills them with fill while the lock is
 * held (the journal thread may take the list the moment it is released). */
static uint64_t append(struct journal *j, struct jfile *file, uint64_t offset, uint64_t size,
                       void (*fill)(uint8_t *out, const void *ctx), const void *fill_ctx)
{
    ASSERT(file != NULL);
    ASSERT(size > 0);
    pthread_mutex_lock(&j->mutex);
    struct op *tail = j->ops_tail;
    uint8_t *at;
    if (tail != NULL && tail->kind == OP_APPEND && tail->file == file &&
        tail->offset + tail->size == offset && tail->size + size <= tail->capacity) {
        at = tail->data + tail->size;
        tail->size += size;
    } else {
        tail = journal__op_new(OP_APPEND, size > APPEND_CAPACITY_MIN ? size : APPEND_CAPACITY_MIN);
        tail->file = file;
        tail->offset = offset;
        tail->size = size;
        at = tail->data;
        if (j->ops_tail != NULL)
            j->ops_tail->next = tail;
        else
            j->ops_head = tail;
        j->ops_tail = tail;
    }
    fill(at, fill_ctx);
    tail->ticket = ++j->ticket_last;
    j->backlog_size += size;
    uint64_t ticket = atomic_load(&j->failed) == OK ? tail->ticket : 0;
    pthread_cond_signal(&j->work_cond);
    pthread_mutex_unlock(&j->mutex);
    return ticket;
}

struct record_parts {
    enum record_type type;
    const void *a;
    uint32_t a_size;
    const void *b;
    uint32_t b_size;
};

static void fill_record(uint8_t *out, const void *ctx)
{
    const struct record_parts *r = ctx;
    format_record_encode(out, r->type, r->a, r->a_size, r->b, r->b_size);
}

uint64_t journal__append_record(struct journal *j, struct jfile *file, uint64_t offset,
                                enum record_type type, const void *a, uint32_t a_size,
                                const void *b, uint32_t b_size)
{
    struct record_parts r = {type, a, a_size, b, b_size};
    return append(j, file, offset, format_record_size((uint64_t)a_size + b_size), fill_record,
                  &r);
}

struct raw_bytes {
    const void *data;
    uint64_t size;
};

static void fill_raw(uint8_t *out, const void *ctx)
{
    const struct raw_bytes *r = ctx;
    memcpy(out, r->data, r->size);
}

uint64_t journal__append_bytes(struct journal *j, struct jfile *file, uint64_t offset,
                               const void *data, uint64_t size)
{
    struct raw_bytes r = {data, size};
    return append(j, file, offset, size, fill_raw, &r);
}

/* ---- The journal thread --------------------------------------------------- */

static void fail(struct journal *j, int err, const char *what, const char *path)
{
    ASSERT(err < 0);
    LOG_ERROR("journal: %s %s failed: %s; the journal stops writing", what, path,
              err == E_JOURNAL_CORRUPT  ? "corrupt record"
              : err == E_JOURNAL_FENCED ? "the directory was taken over by another broker"
                                        : strerror(-err));
    int expected = OK;
    bool kept = err == E_JOURNAL_CORRUPT || err == E_JOURNAL_FENCED;
    atomic_compare_exchange_strong(&j->failed, &expected, kept ? err : E_IO);
}

static bool failed(struct journal *j)
{
    return atomic_load(&j->failed) != OK;
}

static void dirty_dir_add(struct journal *j, const char *path)
{
    for (size_t i = 0; i < j->dirty_dirs_count; i++) {
        if (strcmp(j->dirty_dirs[i], path) == 0)
            return;
    }
    if (j->dirty_dirs_count == j->dirty_dirs_cap) {
        j->dirty_dirs_cap = j->dirty_dirs_cap ? 2 * j->dirty_dirs_cap : 16;
        j->dirty_dirs = xrealloc(j->dirty_dirs, j->dirty_dirs_cap * sizeof(*j->dirty_dirs));
    }
    memcpy(j->dirty_dirs[j->dirty_dirs_count++], path, strlen(path) + 1);
}

static void dirty_file_add(struct journal *j, struct jfile *f)
{
    if (f->dirty)
        return;
    if (j->dirty_files_count == j->dirty_files_cap) {
        j->dirty_files_cap = j->dirty_files_cap ? 2 * j->dirty_files_cap : 64;
        j->dirty_files = xrealloc(j->dirty_files, j->dirty_files_cap * sizeof(*j->dirty_files));
    }
    j->dirty_files[j->dirty_files_count++] = f;
    f->dirty = true;
}

static void dirty_file_remove(struct journal *j, struct jfile *f)
{
    for (size_t i = 0; i < j->dirty_files_count; i++) {
        if (j->dirty_files[i] == f) {
            j->dirty_files[i] = j->dirty_files[--j->dirty_files_count];
            f->dirty = false;
            return;
        }
    }
    ASSERT(!f->dirty);
}

/* On shared storage, a path of ours that is gone was taken over (its
 * directory renamed away by journal_adopt): say so. */
static int fenced_error(const struct journal *j, int rc)
{
    return j->opts.fenced && rc == -ENOENT ? E_JOURNAL_FENCED : rc;
}

/* Opens f on first use; a file created here dirties its directory. */
static int file_fd(struct journal *j, struct jfile *f)
{
    if (f->fd >= 0)
        return f->fd;
    int flags = f->created ? DISK_OPEN_WRITE : DISK_OPEN_CREATE;
    int rc = j->disk->open(j->disk->ctx, f->path, flags, &f->fd);
    if (rc < 0) {
        fail(j, fenced_error(j, rc), "open", f->path);
        f->fd = -1;
        return -1;
    }
    char parent[JOURNAL_PATH_SIZE];
    parent_path(parent, f->path);
    if (!f->created) {
        dirty_dir_add(j, parent);
        f->created = true;
    }
    if (j->opts.fenced) {
        /* Opened by its path: the directory that path names now is ours. */
        rc = j->disk->dir_identity(j->disk->ctx, parent, f->dir_identity);
        if (rc < 0) {
            fail(j, rc, "stat", parent);
            j->disk->close(j->disk->ctx, f->fd);
            f->fd = -1;
            return -1;
        }
    }
    return f->fd;
}

/* The fence: after f's fdatasync, is its directory still where we put it?
 * A taker renames it before reading (journal_adopt), so if it is, what we
 * synced is in what any taker will read. */
static int check_fence(struct journal *j, struct jfile *f)
{
    char parent[JOURNAL_PATH_SIZE];
    parent_path(parent, f->path);
    uint64_t now[2];
    int rc = j->disk->dir_identity(j->disk->ctx, parent, now);
    if (rc == 0 && now[0] == f->dir_identity[0] && now[1] == f->dir_identity[1])
        return OK;
    fail(j, E_JOURNAL_FENCED, "fdatasync", f->path);
    return E_JOURNAL_FENCED;
}

static int file_sync(struct journal *j, struct jfile *f)
{
    if (!f->dirty)
        return OK;
    ASSERT(f->fd >= 0);
    int rc = j->disk->fdatasync(j->disk->ctx, f->fd);
    dirty_file_remove(j, f);
    if (rc < 0)
        fail(j, rc, "fdatasync", f->path);
    else if (j->opts.fenced)
        rc = check_fence(j, f);
    return rc;
}

/* The barrier: every file and directory changed so far is made durable. */
static int sync_all(struct journal *j)
{
    while (j->dirty_files_count > 0 && !failed(j))
        file_sync(j, j->dirty_files[0]);
    for (size_t i = 0; i < j->dirty_dirs_count && !failed(j); i++) {
        int rc = j->disk->fsync_dir(j->disk->ctx, j->dirty_dirs[i]);
        if (rc < 0)
            fail(j, rc, "fsync", j->dirty_dirs[i]);
    }
    j->dirty_dirs_count = 0;
    return failed(j) ? E_IO : OK;
}

static void file_close(struct journal *j, struct jfile *f)
{
    if (!failed(j))
        file_sync(j, f);
    else if (f->dirty)
        dirty_file_remove(j, f);
    if (f->fd >= 0)
        j->disk->close(j->disk->ctx, f->fd);
    f->fd = -1;
}

static void exec_copy(struct journal *j, struct op *op)
{
    ASSERT(op->source != NULL);
    ASSERT(op->size >= FORMAT_RECORD_HEADER_SIZE);
    uint8_t *buf = xmalloc(op->size);
    int src = file_fd(j, op->source);
    size_t done = 0;
    int rc = src < 0 ? -EIO : j->disk->pread(j->disk->ctx, src, buf, op->size, op->source_offset,
                                              &done);
    if (rc < 0 && src >= 0)
        fail(j, rc, "pread", op->source->path);
    /* A run of PUBLISH records: each intact, the seqs rising from op->seq
     * to op->seq_last, op->count of them, filling op->size exactly. */
    uint64_t pos = 0, seq = 0, count = 0;
    bool intact = rc == 0 && done == op->size;
    while (intact && pos < done) {
        struct format_record_header h;
        uint64_t size = 0;
        if (format_record_check(buf + pos, done - pos, &h, &size) != FORMAT_CHECK_OK ||
            h.type != RECORD_PUBLISH) {
            intact = false;
            break;
        }
        uint64_t s = format_get_u64(buf + pos + FORMAT_RECORD_HEADER_SIZE);
        intact = count == 0 ? s == op->seq : s > seq;
        seq = s;
        count++;
        pos += size;
    }
    intact = intact && pos == op->size && count == op->count && seq == op->seq_last;
    if (rc == 0 && !intact) {
        LOG_ERROR("journal: record at %s offset %llu is corrupt; compaction stops",
                  op->source->path, (unsigned long long)(op->source_offset + pos));
        fail(j, E_JOURNAL_CORRUPT, "copy", op->source->path);
    }
    int dst = failed(j) ? -1 : file_fd(j, op->file);
    if (dst >= 0) {
        rc = j->disk->pwrite(j->disk->ctx, dst, buf, op->size, op->offset);
        if (rc < 0)
            fail(j, rc, "pwrite", op->file->path);
        dirty_file_add(j, op->file);
    }
    free(buf);
}

static void exec_write_atomic(struct journal *j, struct op *op)
{
    char tmp[JOURNAL_PATH_SIZE + 8];
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp", op->path);
    ASSERT(n > 0 && (size_t)n < sizeof(tmp));
    char parent[JOURNAL_PATH_SIZE];
    parent_path(parent, op->path);
    int fd = -1;
    int rc = j->disk->open(j->disk->ctx, tmp, DISK_OPEN_CREATE | DISK_OPEN_TRUNCATE, &fd);
    if (rc == 0)
        rc = j->disk->pwrite(j->disk->ctx, fd, op->data, op->size, 0);
    if (rc == 0)
        rc = j->disk->fdatasync(j->disk->ctx, fd);
    if (fd >= 0)
        j->disk->close(j->disk->ctx, fd);
    if (rc == 0)
        rc = j->disk->rename(j->disk->ctx, tmp, op->path);
    if (rc == 0)
        rc = j->disk->fsync_dir(j->disk->ctx, parent);
    if (rc < 0) {
        fail(j, rc, "atomic write", op->path);
        return;
    }
    if (op->file != NULL) {
        /* The old inode is gone from the namespace: drop it, reopen the new one. */
        if (op->file->dirty)
            dirty_file_remove(j, op->file);
        if (op->file->fd >= 0)
            j->disk->close(j->disk->ctx, op->file->fd);
        op->file->fd = -1;
        op->file->created = true;
    }
}

/* ---- A deleted log, removed a step at a time ------------------------------
 *
 * A deleted queue's log is garbage once its rename to <dir>.deleted-N is
 * durable (journal_queue_delete; a restart removes what is left of it), and
 * so is a live queue's dead segment once its rename to <name>.dead is
 * (OP_UNLINK; recovery lists *.seg only and removes *.dead).
 * Unlinked whole, a deep log's blocks were all freed by one filesystem
 * commit: on a filesystem mounted with discard, every other fdatasync on
 * the device (other brokers' confirms) waited ~20 ms behind a 200 MB log,
 * and the unlink held this thread ~40 ms (bench/RESULTS.md). So a file
 * over JOURNAL_GC_STEP is shrunk a step at a time, ftruncate and then
 * fdatasync (the step's blocks freed by a commit of their own), one step
 * per round of the thread, between its batches, at most one every
 * JOURNAL_GC_EVERY_NS; unlinked once small; the directory goes after its
 * files. */
#define JOURNAL_GC_STEP (8u << 20)
/* Steps at most this often: a step's commit keeps the device busy for a
 * millisecond or two, and back to back they would do so for as long as
 * the whole unlink did (so: at most 800 MB/s of garbage). */
#define JOURNAL_GC_EVERY_NS (10u * 1000 * 1000)

struct journal_gc {
    struct journal_gc *next;
    bool dir;   /* the directory, after its files */
    /* a renamed file whose directory is not synced yet: that comes first
     * (a crash must find the old name whole or the new one, never a
     * shrunk file under its old name) */
    bool sync_parent;
    int fd;     /* a file's, open for writing once it is the oldest; else -1
                 * (deleting a thousand deep queues holds one descriptor) */
    char path[JOURNAL_PATH_SIZE];
};

static void gc_push(struct journal *j, const char *path, bool dir, bool sync_parent)
{
    struct journal_gc *g = xcalloc(1, sizeof *g);
    g->dir = dir;
    g->sync_parent = sync_parent;
    g->fd = -1;
    memcpy(g->path, path, strlen(path) + 1);
    if (j->gc_tail != NULL)
        j->gc_tail->next = g;
    else
        j->gc_head = g;
    j->gc_tail = g;
}

static void gc_pop(struct journal *j)
{
    struct journal_gc *g = j->gc_head;
    j->gc_head = g->next;
    if (j->gc_head == NULL)
        j->gc_tail = NULL;
    if (g->fd >= 0)
        j->disk->close(j->disk->ctx, g->fd);
    free(g);
}

static int remove_dir(struct journal *j, const char *path)
{
    int rc = j->disk->rmdir(j->disk->ctx, path);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    char parent[JOURNAL_PATH_SIZE];
    parent_path(parent, path);
    dirty_dir_add(j, parent);
    return 0;
}

/* Shrinks g's file by a step: 1 if it did (more to go), 0 once it is
 * small enough to unlink (or gone), or a negative errno. */
static int gc_shrink(struct journal *j, struct journal_gc *g)
{
    if (g->sync_parent) {
        char parent[JOURNAL_PATH_SIZE];
        parent_path(parent, g->path);
        g->sync_parent = false;
        int rc = j->disk->fsync_dir(j->disk->ctx, parent);
        if (rc == -ENOENT)
            return 0; /* its queue was deleted meanwhile: its tree's removal has it */
        return rc < 0 ? rc : 1;
    }
    int rc = g->fd >= 0 ? 0 : j->disk->open(j->disk->ctx, g->path, DISK_OPEN_WRITE, &g->fd);
    uint64_t size = 0;
    if (rc == 0)
        rc = j->disk->fsize(j->disk->ctx, g->fd, &size);
    if (rc < 0)
        return rc == -ENOENT ? 0 : rc;
    if (size <= JOURNAL_GC_STEP)
        return 0;
    rc = j->disk->ftruncate(j->disk->ctx, g->fd, size - JOURNAL_GC_STEP);
    if (rc == 0)
        rc = j->disk->fdatasync(j->disk->ctx, g->fd);
    return rc < 0 ? rc : 1;
}

/* One step of the oldest removal; all of it when whole (a stop). */
static void gc_step(struct journal *j, bool whole)
{
    struct journal_gc *g = j->gc_head;
    int rc = 0;
    if (g->dir) {
        rc = remove_dir(j, g->path);
    } else {
        rc = whole ? 0 : gc_shrink(j, g);
        if (rc == 1)
            return; /* more steps */
        if (rc == 0) {
            rc = j->disk->unlink(j->disk->ctx, g->path);
            rc = rc == -ENOENT ? 0 : rc;
        }
    }
    if (rc < 0)
        fail(j, rc, "remove", g->path);
    gc_pop(j);
}

/* A round of the thread: one step; all of it at a stop (a restart would
 * remove what is left, but a clean stop leaves nothing); nothing more
 * once the journal failed (it writes nothing). */
static void gc_round(struct journal *j, bool stop)
{
    if (failed(j)) {
        while (j->gc_head != NULL)
            gc_pop(j);
    } else if (stop) {
        while (j->gc_head != NULL)
            gc_step(j, true);
    } else if (j->gc_head != NULL && uv_hrtime() >= j->gc_due_ns) {
        gc_step(j, false);
        j->gc_due_ns = uv_hrtime() + JOURNAL_GC_EVERY_NS;
    }
}

/* Under the mutex: until ops come, or (garbage waiting) its next step is due. */
static void wait_for_work(struct journal *j)
{
    while (j->ops_head == NULL) {
        if (j->gc_head == NULL) {
            pthread_cond_wait(&j->work_cond, &j->mutex);
            continue;
        }
        uint64_t now = uv_hrtime();
        if (now >= j->gc_due_ns)
            return;
        struct timespec due = {(time_t)(j->gc_due_ns / 1000000000u),
                               (long)(j->gc_due_ns % 1000000000u)};
        /* (uv_hrtime reads CLOCK_MONOTONIC, the condition's clock) */
        pthread_cond_timedwait(&j->work_cond, &j->mutex, &due);
    }
}

/* Whether path is large enough to be removed in steps. */
static bool gc_worth_steps(struct journal *j, const char *path)
{
    int fd = -1;
    uint64_t size = 0;
    bool big = j->disk->open(j->disk->ctx, path, DISK_OPEN_READ, &fd) == 0 &&
               j->disk->fsize(j->disk->ctx, fd, &size) == 0 && size > JOURNAL_GC_STEP;
    if (fd >= 0)
        j->disk->close(j->disk->ctx, fd);
    return big;
}

/* A live queue's dead segment (64 MiB by default), after the sync that
 * made its last acks durable: renamed out of the log's sight and removed
 * in steps when large, as a deleted log is (a 64 MiB unlink held other
 * brokers' fdatasyncs on a discard-mounted disk, section above). */
static void unlink_segment(struct journal *j, const char *path)
{
    char doomed[JOURNAL_PATH_SIZE];
    int n = snprintf(doomed, sizeof doomed, "%s%s", path, JOURNAL_DEAD_SUFFIX);
    int rc;
    if (n > 0 && n < (int)sizeof doomed && gc_worth_steps(j, path)) {
        rc = j->disk->rename(j->disk->ctx, path, doomed);
        if (rc == 0) {
            gc_push(j, doomed, false, true);
            return;
        }
    } else {
        char parent[JOURNAL_PATH_SIZE];
        parent_path(parent, path);
        rc = j->disk->unlink(j->disk->ctx, path);
        dirty_dir_add(j, parent);
    }
    if (rc < 0 && rc != -ENOENT)
        fail(j, rc, "unlink", path);
}

struct remove_ctx {
    struct journal *j;
    const char *dir;
    int rc;
    uint32_t deferred;
};

static int remove_entry(void *ctx, const char *name)
{
    struct remove_ctx *rc = ctx;
    struct journal *j = rc->j;
    char path[JOURNAL_PATH_SIZE];
    journal__path(path, rc->dir, name);
    if (gc_worth_steps(j, path)) {
        gc_push(j, path, false, false);
        rc->deferred++;
        return 0;
    }
    int err = j->disk->unlink(j->disk->ctx, path);
    if (err < 0 && err != -ENOENT)
        rc->rc = err;
    return 0;
}

static void exec_remove_tree(struct journal *j, struct op *op)
{
    struct remove_ctx ctx = {j, op->path, 0, 0};
    int rc = j->disk->readdir(j->disk->ctx, op->path, remove_entry, &ctx);
    if (rc == 0)
        rc = ctx.rc;
    if (rc == 0 && ctx.deferred > 0)
        gc_push(j, op->path, true, false); /* after its files */
    else if (rc == 0)
        rc = remove_dir(j, op->path);
    if (rc < 0 && rc != -ENOENT)
        fail(j, rc, "remove", op->path);
}

static void exec_disk_op(struct journal *j, struct op *op)
{
    char parent[JOURNAL_PATH_SIZE];
    int rc = 0;
    switch (op->kind) {
    case OP_APPEND: {
        int fd = file_fd(j, op->file);
        if (fd < 0)
            return;
        rc = j->disk->pwrite(j->disk->ctx, fd, op->data, op->size, op->offset);
        if (rc < 0)
            fail(j, rc, "pwrite", op->file->path);
        dirty_file_add(j, op->file);
        return;
    }
    case OP_COPY: exec_copy(j, op); return;
    case OP_MKDIR:
        rc = j->disk->mkdir(j->disk->ctx, op->path);
        if (rc < 0 && rc != -EEXIST)
            fail(j, rc, "mkdir", op->path);
        parent_path(parent, op->path);
        dirty_dir_add(j, parent);
        return;
    case OP_WRITE_ATOMIC: exec_write_atomic(j, op); return;
    case OP_RENAME:
        if (sync_all(j) != OK)
            return;
        rc = j->disk->rename(j->disk->ctx, op->path, op->path2);
        parent_path(parent, op->path2);
        if (rc == 0)
            rc = j->disk->fsync_dir(j->disk->ctx, parent);
        if (rc < 0)
            fail(j, fenced_error(j, rc), "rename", op->path);
        return;
    case OP_REMOVE_TREE: exec_remove_tree(j, op); return;
    case OP_REMOVE_STAGED:
        rc = journal__remove_staged(j->disk, op->path);
        if (rc < 0) {
            LOG_WARN("journal: cannot remove the adopted copy %s: %s (its messages are in our "
                     "log; remove it by hand)", op->path, strerror(-rc));
            return;
        }
        parent_path(parent, op->path);
        dirty_dir_add(j, parent);
        return;
    default: ASSERT(!"not a disk op"); return;
    }
}

/* Performs one op; file lifetimes are handled even after a failure so that
 * memory is still freed. */
static void exec_op(struct journal *j, struct op *op)
{
    switch (op->kind) {
    case OP_CLOSE: file_close(j, op->file); return;
    case OP_RELEASE:
        file_close(j, op->file);
        free(op->file);
        return;
    case OP_UNLINK:
        if (!failed(j))
            sync_all(j);
        file_close(j, op->file);
        if (!failed(j))
            unlink_segment(j, op->file->path);
        free(op->file);
        return;
    case OP_STOP: return;
    default:
        if (!failed(j))
            exec_disk_op(j, op);
        return;
    }
}

static void *journal_thread_main(void *arg)
{
    struct journal *j = arg;
    /* (ps -L, top -H; tests find it by this name to freeze it alone) */
    prctl(PR_SET_NAME, "quay-journal", 0, 0, 0);
    bool stop = false;
    while (!stop) {
        pthread_mutex_lock(&j->mutex);
        wait_for_work(j);
        struct op *batch = j->ops_head;
        j->ops_head = NULL;
        j->ops_tail = NULL;
        pthread_mutex_unlock(&j->mutex);
        if (batch == NULL) { /* garbage only: a step, then look for work again */
            gc_round(j, false);
            continue;
        }

        uint64_t ticket = 0;
        uint64_t size = 0;
        while (batch != NULL) {
            struct op *op = batch;
            batch = op->next;
            ASSERT(op->ticket > ticket); /* ops run in ticket order */
            ticket = op->ticket;
            size += op->size;
            stop = stop || op->kind == OP_STOP;
            exec_op(j, op);
            free(op);
        }
        pthread_mutex_lock(&j->mutex);
        j->executed_ticket = ticket;
        ASSERT(j->backlog_size >= size);
        j->backlog_size -= size;
        pthread_cond_broadcast(&j->executed_cond);
        pthread_mutex_unlock(&j->mutex);
        if (!failed(j) && sync_all(j) == OK)
            atomic_store(&j->synced_ticket, ticket);
        uv_async_send(&j->async);
        gc_round(j, stop);
    }
    ASSERT(j->dirty_files_count == 0 || failed(j));
    return NULL;
}

void journal__wait_executed(struct journal *j, uint64_t ticket)
{
    ASSERT(ticket <= j->ticket_last);
    pthread_mutex_lock(&j->mutex);
    while (j->executed_ticket < ticket)
        pthread_cond_wait(&j->executed_cond, &j->mutex);
    pthread_mutex_unlock(&j->mutex);
}

/* ---- The loop side ------------------------------------------------------- */

static void report_synced(struct journal *j)
{
    uint64_t synced = atomic_load(&j->synced_ticket);
    int status = atomic_load(&j->failed);
    if (synced > j->synced_reported) {
        ASSERT(synced <= j->ticket_last);
        j->synced_reported = synced;
        if (j->synced_fn != NULL)
            j->synced_fn(j->synced_ctx, synced, OK);
    }
    if (status != OK && !j->failed_reported) {
        j->failed_reported = true;
        if (j->synced_fn != NULL)
            j->synced_fn(j->synced_ctx, j->synced_reported, status);
    }
}

static void async_callback(uv_async_t *handle)
{
    struct journal *j = handle->data;
    report_synced(j);
    journal__compactions_resume(j);
}

void journal_set_synced_callback(struct journal *j, journal_synced_fn fn, void *ctx)
{
    j->synced_fn = fn;
    j->synced_ctx = ctx;
}

uint64_t journal_backlog_size(struct journal *j)
{
    pthread_mutex_lock(&j->mutex);
    uint64_t size = j->backlog_size;
    pthread_mutex_unlock(&j->mutex);
    return size;
}

void journal_wait_backlog(struct journal *j, uint64_t max_bytes)
{
    if (j->reader)
        return;
    pthread_mutex_lock(&j->mutex);
    /* (The writer broadcasts after each batch, failed or not.) */
    while (j->backlog_size > max_bytes && atomic_load(&j->failed) == OK)
        pthread_cond_wait(&j->executed_cond, &j->mutex);
    pthread_mutex_unlock(&j->mutex);
}

int journal_status(struct journal *j)
{
    return atomic_load(&j->failed);
}

static int mkdir_now(struct journal *j, const char *path, char *err, size_t err_size)
{
    int rc = j->disk->mkdir(j->disk->ctx, path);
    if (rc < 0 && rc != -EEXIST) {
        snprintf(err, err_size, "mkdir %s: %s", path, strerror(-rc));
        return E_IO;
    }
    return OK;
}

static void options_default(struct journal_options *o)
{
    if (o->disk == NULL)
        o->disk = disk_posix();
    if (o->segment_size_max == 0)
        o->segment_size_max = 64ull * 1024 * 1024;
    if (o->blob_size_max == 0)
        o->blob_size_max = 128u * 1024 * 1024;
    if (o->compact_live_percent == 0)
        o->compact_live_percent = 25;
    if (o->compact_slice_bytes == 0)
        o->compact_slice_bytes = 256 * 1024;
    if (o->definitions_compact_size == 0)
        o->definitions_compact_size = 1024 * 1024;
}

static struct journal *journal_new(uv_loop_t *loop, const char *dir,
                                   const struct journal_options *opts)
{
    ASSERT(loop != NULL);
    ASSERT(dir != NULL && strlen(dir) < JOURNAL_PATH_SIZE - 64);
    struct journal *j = xcalloc(1, sizeof(*j));
    if (opts != NULL)
        j->opts = *opts;
    options_default(&j->opts);
    ASSERT(j->opts.segment_size_max <= 1024ull * 1024 * 1024);
    ASSERT(j->opts.blob_size_max <= FORMAT_RECORD_PAYLOAD_SIZE_MAX - 8);
    ASSERT(j->opts.compact_live_percent <= 100);
    ASSERT(!j->opts.fenced || j->opts.disk->dir_identity != NULL);
    j->loop = loop;
    j->disk = j->opts.disk;
    memcpy(j->dir, dir, strlen(dir) + 1);
    journal__path(j->queues_dir, dir, "queues");
    hmap_init(&j->queues);
    journal__adopt_init(j);
    hmap_init(&j->queue_ids);
    hmap_init(&j->definitions);
    pthread_mutex_init(&j->mutex, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC); /* wait_for_work's deadlines */
    pthread_cond_init(&j->work_cond, &monotonic);
    pthread_condattr_destroy(&monotonic);
    pthread_cond_init(&j->executed_cond, NULL);
    atomic_init(&j->synced_ticket, 0);
    atomic_init(&j->failed, OK);
    return j;
}

/* A taker reads a staged log with this: a journal's recovery, without the
 * writer thread, the definitions file (created, fdatasync'ed and its
 * directory fsync'ed on open) and the AIO context a full journal sets up,
 * which cost a takeover of a thousand queues about a second of the loop's
 * time per 250 queues (perf trace -s of a taker, bench/RESULTS.md). */
int journal_open_reader(struct journal **out, uv_loop_t *loop, const char *dir)
{
    ASSERT(out != NULL);
    struct journal *j = journal_new(loop, dir, NULL);
    j->reader = true;
    *out = j;
    return OK;
}

int journal_open(struct journal **out, uv_loop_t *loop, const char *dir,
                 const struct journal_options *opts, char *err, size_t err_size)
{
    ASSERT(out != NULL);
    struct journal *j = journal_new(loop, dir, opts);
    int rc = mkdir_now(j, dir, err, err_size);
    if (rc == OK)
        rc = mkdir_now(j, j->queues_dir, err, err_size);
    if (rc == OK)
        rc = journal__definitions_open(j, err, err_size);
    if (rc == OK && pthread_create(&j->thread, NULL, journal_thread_main, j) != 0) {
        snprintf(err, err_size, "cannot start the journal thread");
        rc = E_IO;
    }
    if (rc != OK) {
        journal__definitions_free(j);
        hmap_free(&j->queues);
        hmap_free(&j->queue_ids);
        hmap_free(&j->definitions);
        journal__adopt_free(j);
        free(j);
        return rc;
    }
    j->thread_started = true;
    ASSERT(uv_async_init(loop, &j->async, async_callback) == 0);
    j->async.data = j;
    *out = j;
    return OK;
}

static void close_callback(uv_handle_t *handle)
{
    struct journal *j = handle->data;
    free(j);
}

void journal_close(struct journal *j)
{
    ASSERT(j->thread_started || j->reader);
    /* Release every file the thread holds, then stop it. */
    uint32_t cursor = 0;
    struct hmap_entry *e;
    while (hmap_next(&j->queues, &cursor, &e))
        journal__queue_release_files(e->value);
    if (j->definitions_file != NULL) {
        struct op *op = journal__op_new(OP_RELEASE, 0);
        op->file = j->definitions_file;
        journal__op_push(j, op);
        j->definitions_file = NULL;
    }
    if (!j->reader) {
        journal__op_push(j, journal__op_new(OP_STOP, 0));
        pthread_join(j->thread, NULL);
        report_synced(j);
    }
    cursor = 0;
    while (hmap_next(&j->queues, &cursor, &e))
        journal__queue_free(e->value);
    ASSERT(j->compacting_count == 0); /* each queue left the list as it was freed */
    free(j->compacting);
    hmap_free(&j->queues);
    hmap_free(&j->queue_ids);
    journal__adopt_free(j);
    journal__definitions_free(j);
    hmap_free(&j->definitions);
    free(j->dirty_files);
    free(j->dirty_dirs);
    pthread_mutex_destroy(&j->mutex);
    pthread_cond_destroy(&j->work_cond);
    pthread_cond_destroy(&j->executed_cond);
    if (j->reader)
        free(j); /* (no async handle) */
    else
        uv_close((uv_handle_t *)&j->async, close_callback);
}
