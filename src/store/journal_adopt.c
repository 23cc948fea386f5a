/*
 * journal_adopt.c: taking over another broker's queue log on shared
 * storage, on the loop thread.
 *
 * The design: move, then copy. The taker renames the dead broker's queue
 * directory (DIR/<dead>/queues/<id>) into its own journal directory
 * (DIR/<taker>/adopted/<dead>.<id>/queues/<id>), recovers it there with a
 * second, temporary journal (the journal's recovery, unchanged: torn tails
 * cut, acks and purges applied), and hands every live message to the
 * caller, who appends it to the taker's own log of the queue; once that is
 * synced the staged directory is removed (journal_adopt_finish).
 *
 * Why the rename is the fence: the old owner keeps descriptors of its
 * segment files, and a rename does not stop writes through them; but a
 * fenced journal (journal_options.fenced) checks after every fdatasync
 * that the directory its file was opened in is still at its path, and
 * fails for good when it is not. Rename is atomic, and the taker reads
 * only after it: a write whose check passed was synced before the rename,
 * so the taker reads it; a write after the rename is never confirmed. Its
 * bytes may land in the staged copy (an unconfirmed publish the taker may
 * or may not deliver, an ack of a message its consumer did get, a purge a
 * client of it asked for): never a lost confirmed message. A DELETE
 * record, which the old owner writes when it deletes the queue it lost,
 * is ignored in an adopted log, and an old owner that learns from the map
 * that its queue was taken (durable_abandon_log) writes nothing more to
 * it. The copy is why the taker does not append to the old files: a stray
 * write there cannot reach the taker's own log.
 * New paths (a new segment, a compaction) fail at once: the old directory
 * is gone from the namespace.
 */
#include "store/journal_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

/* One queue log of a scanned foreign directory. Owned by its adopt_index. */
struct adopt_entry {
    char name[17];   /* its directory: 16 hex digits */
    uint32_t key_size;
    uint8_t key[];   /* u32 vhost size, vhost, name: RECORD_QUEUE_NAME */
};

/* Reads DIR/queue's RECORD_QUEUE_NAME payload into key (by hand: recovery's
 * reader wants a journal of its own). Returns its size, 0 if unreadable. */
static uint32_t read_header(const struct disk_ops *d, const char *dir, uint8_t *key,
                            uint32_t key_cap)
{
    char path[JOURNAL_PATH_SIZE];
    journal__path(path, dir, "queue");
    int fd;
    if (d->open(d->ctx, path, DISK_OPEN_READ, &fd) < 0)
        return 0;
    uint8_t buf[FORMAT_FILE_HEADER_SIZE + FORMAT_RECORD_HEADER_SIZE + 4 + 2 * 255 + 64];
    size_t done = 0;
    int rc = d->pread(d->ctx, fd, buf, sizeof buf, 0, &done);
    d->close(d->ctx, fd);
    struct format_file_header fh;
    struct format_record_header h;
    uint64_t record_size;
    if (rc < 0 || done < FORMAT_FILE_HEADER_SIZE ||
        !format_file_header_decode(buf, FORMAT_MAGIC_QUEUE, &fh) ||
        format_record_check(buf + FORMAT_FILE_HEADER_SIZE, done - FORMAT_FILE_HEADER_SIZE, &h,
                            &record_size) != FORMAT_CHECK_OK ||
        h.type != RECORD_QUEUE_NAME || h.payload_size == 0 || h.payload_size > key_cap)
        return 0;
    memcpy(key, buf + FORMAT_FILE_HEADER_SIZE + FORMAT_RECORD_HEADER_SIZE, h.payload_size);
    return h.payload_size;
}

/* A miss in an index younger than this is no log there: a dead broker's
 * directory does not grow; older, it is scanned again (it may have been
 * alive since). Every miss rescanning made a thousand takeovers from a
 * directory holding none of them (a taker that died first) quadratic. */
#define ADOPT_INDEX_FRESH_MS 1000

static void index_clear(struct adopt_index *x)
{
    uint32_t cursor = 0;
    struct hmap_entry *e;
    while (hmap_next(&x->entries, &cursor, &e))
        free(e->value);
    hmap_free(&x->entries);
    hmap_init(&x->entries);
    x->scanned[0] = '\0';
}

struct scan {
    struct journal *j;
    struct adopt_index *index;
    const char *queues_dir;
};

static int index_entry(void *ctx, const char *name)
{
    struct scan *sc = ctx;
    if (strlen(name) != 16 || strchr(name, '.') != NULL)
        return 0; /* not a queue log (a deletion in progress, a temp file) */
    char dir[JOURNAL_PATH_SIZE];
    journal__path(dir, sc->queues_dir, name);
    uint8_t key[4 + 2 * 255];
    uint32_t key_size = read_header(sc->j->disk, dir, key, sizeof key);
    if (key_size == 0)
        return 0;
    struct adopt_entry *e = malloc(sizeof *e + key_size);
    ASSERT(e != NULL);
    memcpy(e->name, name, 17);
    e->key_size = key_size;
    memcpy(e->key, key, key_size);
    free(hmap_put(&sc->index->entries, (struct bytes){e->key, key_size}, e)); /* a twin: last */
    return 0;
}

/* Reads every queue header of foreign_queues once: a dead broker's
 * thousands of queues are then found in O(1) each, not O(queues). */
static int index_build(struct journal *j, struct adopt_index *x, const char *foreign_queues)
{
    index_clear(x);
    struct scan sc = {j, x, foreign_queues};
    int rc = j->disk->readdir(j->disk->ctx, foreign_queues, index_entry, &sc);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    snprintf(x->scanned, sizeof x->scanned, "%s", foreign_queues);
    x->built_ms = uv_now(j->loop);
    return 0;
}

/* foreign_queues' index, or the slot to build it in (the older one). */
static struct adopt_index *index_for(struct journal *j, const char *foreign_queues)
{
    struct adopt_index *x = j->adopt_indexes;
    for (int i = 0; i < 2; i++) {
        if (strcmp(x[i].scanned, foreign_queues) == 0)
            return &x[i];
    }
    return x[0].built_ms <= x[1].built_ms ? &x[0] : &x[1];
}

/* The directory of key's log under foreign_queues, taken out of the index
 * (its log is about to move). A stale index (built before) is rebuilt on
 * a miss. 1: found, 0: none, or a negative errno. */
static int index_take(struct journal *j, const char *foreign_queues, const uint8_t *key,
                      uint32_t key_size, bool *fresh, char name[17])
{
    struct adopt_index *x = index_for(j, foreign_queues);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 || strcmp(x->scanned, foreign_queues) != 0) {
            if (pass == 1 && (*fresh || uv_now(j->loop) - x->built_ms < ADOPT_INDEX_FRESH_MS))
                return 0;
            int rc = index_build(j, x, foreign_queues);
            if (rc < 0)
                return rc;
            *fresh = true;
        }
        struct adopt_entry *e = hmap_remove(&x->entries, (struct bytes){key, key_size});
        if (e != NULL) {
            memcpy(name, e->name, 17);
            free(e);
            return 1;
        }
    }
    return 0;
}

void journal__adopt_init(struct journal *j)
{
    for (int i = 0; i < 2; i++) {
        hmap_init(&j->adopt_indexes[i].entries);
        j->adopt_indexes[i].scanned[0] = '\0';
        j->adopt_indexes[i].built_ms = 0;
    }
}

void journal__adopt_free(struct journal *j)
{
    for (int i = 0; i < 2; i++) {
        index_clear(&j->adopt_indexes[i]);
        hmap_free(&j->adopt_indexes[i].entries);
    }
}

static void make_key(uint8_t *key, uint32_t *key_size, struct bytes vhost, struct bytes name)
{
    ASSERT(vhost.len <= 255 && name.len <= 255);
    format_put_u32(key, vhost.len);
    if (vhost.len > 0)
        memcpy(key + 4, vhost.ptr, vhost.len);
    if (name.len > 0)
        memcpy(key + 4 + vhost.len, name.ptr, name.len);
    *key_size = 4 + vhost.len + name.len;
}

static int mkdir_if_missing(const struct disk_ops *d, const char *path)
{
    int rc = d->mkdir(d->ctx, path);
    return rc == -EEXIST ? 0 : rc;
}

/* Moves foreign_queues/<name> to j->dir/adopted/<owner>.<name>/queues/<name>
 * and makes both directory changes durable; staged gets the new root. */
static int stage(struct journal *j, const char *foreign_dir, const char *foreign_queues,
                 const char *name, char *staged)
{
    const struct disk_ops *d = j->disk;
    const char *slash = strrchr(foreign_dir, '/');
    const char *owner = slash != NULL && slash[1] != '\0' ? slash + 1 : foreign_dir;
    char adopted[JOURNAL_PATH_SIZE];
    journal__path(adopted, j->dir, "adopted");
    char leaf[JOURNAL_PATH_SIZE];
    int n = snprintf(leaf, sizeof leaf, "%.200s.%s", owner, name);
    ASSERT(n > 0 && n < JOURNAL_PATH_SIZE);
    journal__path(staged, adopted, leaf);
    char queues[JOURNAL_PATH_SIZE];
    journal__path(queues, staged, "queues");
    char from[JOURNAL_PATH_SIZE];
    journal__path(from, foreign_queues, name);
    char to[JOURNAL_PATH_SIZE];
    journal__path(to, queues, name);
    int rc = mkdir_if_missing(d, adopted);
    if (rc == 0)
        rc = mkdir_if_missing(d, staged);
    if (rc == 0)
        rc = mkdir_if_missing(d, queues);
    if (rc == 0)
        rc = d->rename(d->ctx, from, to);
    if (rc == 0)
        rc = d->fsync_dir(d->ctx, foreign_queues);
    if (rc == 0)
        rc = d->fsync_dir(d->ctx, queues);
    if (rc == 0)
        rc = d->fsync_dir(d->ctx, adopted);
    if (rc < 0 && rc != -ENOENT)
        LOG_ERROR("journal: cannot take over %s into %s: %s", from, to, strerror(-rc));
    return rc;
}

int journal_adopt(struct journal *j, const char *foreign_dir, struct bytes vhost,
                  struct bytes name, journal_recover_fn fn, void *ctx,
                  struct journal_adoption *out)
{
    ASSERT(j->recovered);
    memset(out, 0, sizeof *out);
    uint8_t key[4 + 2 * 255];
    uint32_t key_size;
    make_key(key, &key_size, vhost, name);
    char foreign_queues[JOURNAL_PATH_SIZE];
    journal__path(foreign_queues, foreign_dir, "queues");
    bool fresh = false;
    char dir_name[17];
    int rc;
    do { /* a log the index names may have gone since: index again, once */
        rc = index_take(j, foreign_queues, key, key_size, &fresh, dir_name);
        if (rc <= 0) {
            out->staged[0] = '\0';
            return rc == 0 ? OK : E_IO; /* 0: no log, never written or adopted already */
        }
        rc = stage(j, foreign_dir, foreign_queues, dir_name, out->staged);
        if (rc == -ENOENT && !fresh)
            index_for(j, foreign_queues)->scanned[0] = '\0'; /* stale: scan again */
    } while (rc == -ENOENT && !fresh);
    if (rc < 0) {
        out->staged[0] = '\0';
        return E_IO;
    }
    struct journal *tmp;
    char err[256];
    if (journal_open(&tmp, j->loop, out->staged, NULL, err, sizeof err) != OK) {
        LOG_ERROR("journal: cannot open the adopted log %s: %s", out->staged, err);
        return E_IO;
    }
    tmp->adopting = true;
    rc = journal_recover(tmp, fn, ctx, &out->stats);
    uint32_t cursor = 0;
    struct hmap_entry *e;
    while (hmap_next(&tmp->queues, &cursor, &e))
        out->seq_last = journal_queue_seq_last(e->value);
    journal_close(tmp); /* freed once the loop runs its close callbacks */
    if (rc == OK)
        LOG_INFO("journal: took over %s (%" PRIu64 " live messages) into %s", dir_name,
                 out->stats.message_count, out->staged);
    return rc;
}

struct remover {
    const struct disk_ops *disk;
    const char *dir;
    int rc;
};

static int remove_entry(void *ctx, const char *name);

/* Removes path, a file or a directory tree (of a staged copy). */
int journal__remove_path(const struct disk_ops *d, const char *path)
{
    if (d->unlink(d->ctx, path) == 0)
        return 0;
    struct remover r = {d, path, 0};
    int rc = d->readdir(d->ctx, path, remove_entry, &r);
    if (rc == 0)
        rc = r.rc;
    if (rc == 0)
        rc = d->rmdir(d->ctx, path);
    return rc == -ENOENT ? 0 : rc;
}

static int remove_entry(void *ctx, const char *name)
{
    struct remover *r = ctx;
    char path[JOURNAL_PATH_SIZE];
    journal__path(path, r->dir, name);
    r->rc = journal__remove_path(r->disk, path);
    return r->rc != 0;
}

/* On the journal thread: unlinking a log's segments blocks for as long as
 * the filesystem frees (and discards) their blocks, which held the loop
 * for most of a big takeover. */
void journal_adopt_finish(struct journal *j, const char *staged)
{
    ASSERT(staged[0] != '\0');
    struct op *op = journal__op_new(OP_REMOVE_STAGED, 0);
    ASSERT(strlen(staged) < sizeof op->path);
    memcpy(op->path, staged, strlen(staged) + 1);
    journal__op_push(j, op);
}

static int report_entry(void *ctx, const char *name)
{
    const char *adopted = ctx;
    LOG_WARN("journal: %s/%s is a takeover that a crash interrupted: the messages our own "
             "log lacks are there, on disk, and not served (not automated yet: "
             "docs/ARCHITECTURE.md section 11)", adopted, name);
    return 0;
}

void journal__adopted_report(struct journal *j)
{
    char adopted[JOURNAL_PATH_SIZE];
    journal__path(adopted, j->dir, "adopted");
    j->disk->readdir(j->disk->ctx, adopted, report_entry, adopted); /* none: ENOENT */
}
