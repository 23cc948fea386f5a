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
 *
 * Staged, then committed, then read. A rename is made durable by fsyncing
 * the directories it changed (the dead broker's queues/, our adopted/, the
 * new <dead>.<id>/ and its queues/); four device flushes a queue made a
 * thousand takeovers wait on 4,000. So staging (journal_adopt_stage, _claim_staged)
 * only renames and notes the directories; journal_adopt_commit fsyncs each
 * noted directory once, for all the renames staged since; and
 * journal_adopt_read refuses (asserts) while any is unsynced. The fence
 * is the rename itself, not its fsync: the old owner's check looks the
 * path up in the namespace, which changed at the rename, so from then on
 * its syncs fail whether or not the rename is durable yet, and its stray
 * bytes go to the staged files, never to ours. What the fsync adds is
 * that a crash cannot bring the log back to the old path once we act on
 * it, and per queue that still holds: nothing of a staged log is read,
 * copied, served or written for before the commit returns OK. A crash
 * before it may keep any subset of a batch's renames; each log is then in
 * exactly one place, the old or the staged one, which is where every
 * taker (and our restart) looks for it anyway.
 *
 * A taker that dies (or restarts) before its copy is synced leaves the log
 * staged in its adopted/: the next taker claims it from there with a
 * rename too (journal_adopt_claim_staged), the restarted taker reads it in
 * place; removing one renames it to <it>.gone first, so a claim and a
 * removal never meet half way; a restarted broker sweeps what nobody may
 * read any more (journal_adopt_sweep).
 */
#include "store/journal_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

/* Where to look for a queue's log: a broker's queues/ directory, or a
 * dead taker's adopted/ one (the staged copies of a takeover it did not
 * finish, each DIR/<taker>/adopted/<source>.<id>/queues/<id>). */
struct where {
    char dir[JOURNAL_PATH_SIZE];   /* the directory scanned */
    char prefix[ADOPT_LEAF_SIZE];  /* "": a queues/ directory; else "<source>." */
    char name[JOURNAL_PATH_SIZE];  /* its index's name: dir, or dir/prefix */
    bool ours;                     /* our own adopted/: what a miss may find was there at
                                      our start (what we stage joins its index) */
};

/* One queue log of a scanned directory. Owned by its adopt_index. */
struct adopt_entry {
    char leaf[ADOPT_LEAF_SIZE]; /* its entry: 16 hex digits, or <source>.<16 hex digits> */
    uint32_t key_size;
    uint8_t key[];              /* u32 vhost size, vhost, name: RECORD_QUEUE_NAME */
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

/* The log directory of entry leaf of a scanned directory, or false when
 * leaf is not one (a deletion in progress, a temporary file, another
 * source's staged copy). */
static bool log_dir(const char *dir, const char *prefix, const char *leaf, char *out)
{
    size_t n = strlen(prefix);
    if (strncmp(leaf, prefix, n) != 0 || strlen(leaf) >= ADOPT_LEAF_SIZE)
        return false;
    const char *id = leaf + n;
    if (strlen(id) != 16 || strchr(id, '.') != NULL)
        return false;
    journal__path(out, dir, leaf);
    if (n > 0) { /* a staged root: <root>/queues/<id> */
        char root[JOURNAL_PATH_SIZE];
        journal__path(root, out, "queues");
        journal__path(out, root, id);
    }
    return true;
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
    const struct where *where;
};

static int index_entry(void *ctx, const char *leaf)
{
    struct scan *sc = ctx;
    char dir[JOURNAL_PATH_SIZE];
    if (!log_dir(sc->where->dir, sc->where->prefix, leaf, dir))
        return 0;
    uint8_t key[4 + 2 * 255];
    uint32_t key_size = read_header(sc->j->disk, dir, key, sizeof key);
    if (key_size == 0)
        return 0;
    struct adopt_entry *e = xmalloc(sizeof *e + key_size);
    snprintf(e->leaf, sizeof e->leaf, "%s", leaf);
    e->key_size = key_size;
    memcpy(e->key, key, key_size);
    free(hmap_put(&sc->index->entries, (struct bytes){e->key, key_size}, e)); /* a twin: last */
    return 0;
}

/* Reads every queue header of w's directory once: a dead broker's
 * thousands of queues are then found in O(1) each, not O(queues). */
static int index_build(struct journal *j, struct adopt_index *x, const struct where *w)
{
    index_clear(x);
    struct scan sc = {j, x, w};
    int rc = j->disk->readdir(j->disk->ctx, w->dir, index_entry, &sc);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    snprintf(x->scanned, sizeof x->scanned, "%s", w->name);
    x->built_ms = uv_now(j->loop);
    return 0;
}

/* w's index, or the slot to build it in (the oldest one). */
static struct adopt_index *index_for(struct journal *j, const struct where *w)
{
    struct adopt_index *x = j->adopt_indexes;
    struct adopt_index *oldest = &x[0];
    for (int i = 0; i < JOURNAL_ADOPT_INDEXES; i++) {
        if (strcmp(x[i].scanned, w->name) == 0)
            return &x[i];
        if (x[i].built_ms < oldest->built_ms)
            oldest = &x[i];
    }
    return oldest;
}

/* The entry of key's log in w, taken out of the index (its log is about
 * to move). A stale index (built before) is rebuilt on a miss. 1: found,
 * 0: none, or a negative errno. */
static int index_take(struct journal *j, const struct where *w, const uint8_t *key,
                      uint32_t key_size, bool *fresh, char leaf[ADOPT_LEAF_SIZE])
{
    struct adopt_index *x = index_for(j, w);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 || strcmp(x->scanned, w->name) != 0) {
            if (pass == 1 && (*fresh || w->ours ||
                              uv_now(j->loop) - x->built_ms < ADOPT_INDEX_FRESH_MS))
                return 0;
            int rc = index_build(j, x, w);
            if (rc < 0)
                return rc;
            *fresh = true;
        }
        struct adopt_entry *e = hmap_remove(&x->entries, (struct bytes){key, key_size});
        if (e != NULL) {
            memcpy(leaf, e->leaf, ADOPT_LEAF_SIZE);
            free(e);
            return 1;
        }
    }
    return 0;
}

void journal__adopt_init(struct journal *j)
{
    for (int i = 0; i < JOURNAL_ADOPT_INDEXES; i++) {
        hmap_init(&j->adopt_indexes[i].entries);
        j->adopt_indexes[i].scanned[0] = '\0';
        j->adopt_indexes[i].built_ms = 0;
    }
}

void journal__adopt_free(struct journal *j)
{
    for (int i = 0; i < JOURNAL_ADOPT_INDEXES; i++) {
        index_clear(&j->adopt_indexes[i]);
        hmap_free(&j->adopt_indexes[i].entries);
    }
    free(j->adopt_unsynced);
    j->adopt_unsynced = NULL;
    j->adopt_unsynced_count = j->adopt_unsynced_cap = 0;
}

/* dir's entries changed (a rename, a mkdir): fsynced at the next commit,
 * once however many renames of the batch touched it. */
static void note_unsynced(struct journal *j, const char *dir)
{
    for (uint32_t i = 0; i < j->adopt_unsynced_count; i++) {
        if (strcmp(j->adopt_unsynced[i], dir) == 0)
            return;
    }
    if (j->adopt_unsynced_count == j->adopt_unsynced_cap) {
        j->adopt_unsynced_cap = j->adopt_unsynced_cap ? 2 * j->adopt_unsynced_cap : 16;
        j->adopt_unsynced = xrealloc(j->adopt_unsynced,
                                     j->adopt_unsynced_cap * sizeof *j->adopt_unsynced);
    }
    ASSERT(strlen(dir) < JOURNAL_PATH_SIZE);
    memcpy(j->adopt_unsynced[j->adopt_unsynced_count++], dir, strlen(dir) + 1);
}

int journal_adopt_commit(struct journal *j)
{
    int rc = 0;
    for (uint32_t i = 0; i < j->adopt_unsynced_count && rc == 0; i++) {
        rc = j->disk->fsync_dir(j->disk->ctx, j->adopt_unsynced[i]);
        if (rc < 0)
            LOG_ERROR("journal: cannot make a takeover's rename in %s durable: %s",
                      j->adopt_unsynced[i], strerror(-rc));
    }
    j->adopt_unsynced_count = 0;
    return rc < 0 ? E_IO : OK;
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

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash != NULL && slash[1] != '\0' ? slash + 1 : path;
}

/* Moves w's entry leaf into j->dir/adopted; staged gets the new root. The
 * directories it changed wait for journal_adopt_commit. A queue log, w->dir/<id>, of
 * broker owner goes to adopted/<owner>.<id>/queues/<id>; a staged root,
 * w->dir/<source>.<id>, goes to adopted/<source>.<id> as it is. */
static int stage(struct journal *j, const struct where *w, const char *owner, const char *leaf,
                 char *staged)
{
    const struct disk_ops *d = j->disk;
    char adopted[JOURNAL_PATH_SIZE];
    journal__path(adopted, j->dir, "adopted");
    char root_leaf[JOURNAL_PATH_SIZE];
    int n = w->prefix[0] != '\0' ? snprintf(root_leaf, sizeof root_leaf, "%s", leaf)
                                 : snprintf(root_leaf, sizeof root_leaf, "%.200s.%s", owner, leaf);
    ASSERT(n > 0 && n < JOURNAL_PATH_SIZE);
    journal__path(staged, adopted, root_leaf);
    char from[JOURNAL_PATH_SIZE];
    journal__path(from, w->dir, leaf);
    char to[JOURNAL_PATH_SIZE];
    char queues[JOURNAL_PATH_SIZE];
    journal__path(queues, staged, "queues");
    if (w->prefix[0] != '\0')
        snprintf(to, sizeof to, "%s", staged);
    else
        journal__path(to, queues, leaf);
    int rc = mkdir_if_missing(d, adopted);
    if (rc == 0 && w->prefix[0] == '\0')
        rc = mkdir_if_missing(d, staged);
    if (rc == 0 && w->prefix[0] == '\0')
        rc = mkdir_if_missing(d, queues);
    if (rc == 0)
        rc = d->rename(d->ctx, from, to);
    if (rc == 0) {
        note_unsynced(j, w->dir);
        if (w->prefix[0] == '\0') {
            note_unsynced(j, queues);
            /* (Its new queues/ entry: without this only a filesystem that
             * orders its metadata, as ext4's journal does, kept the path
             * to the log across a crash.) */
            note_unsynced(j, staged);
        }
        note_unsynced(j, adopted);
    }
    if (rc < 0 && rc != -ENOENT)
        LOG_ERROR("journal: cannot take over %s into %s: %s", from, to, strerror(-rc));
    return rc;
}

/* A log just staged, at root staged (adopted/<source>.<id>), joins the
 * index of our adopted/ for <source>, if there is one: a later claim of
 * ours finds it there (an adoption tried again after a log could not be
 * read whole, cluster/adoption.c). Without it the index, built before,
 * missed it, and a miss in ours is never scanned again. */
static void index_staged(struct journal *j, const char *staged, const uint8_t *key,
                         uint32_t key_size)
{
    const char *leaf = base_name(staged);
    const char *dot = strrchr(leaf, '.');
    ASSERT(dot != NULL && strlen(leaf) < ADOPT_LEAF_SIZE);
    char adopted[JOURNAL_PATH_SIZE];
    journal__path(adopted, j->dir, "adopted");
    char prefix[ADOPT_LEAF_SIZE];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(dot + 1 - leaf), leaf);
    char name[JOURNAL_PATH_SIZE];
    journal__path(name, adopted, prefix);
    for (int i = 0; i < JOURNAL_ADOPT_INDEXES; i++) {
        struct adopt_index *x = &j->adopt_indexes[i];
        if (strcmp(x->scanned, name) != 0)
            continue;
        struct adopt_entry *e = xmalloc(sizeof *e + key_size);
        snprintf(e->leaf, sizeof e->leaf, "%s", leaf);
        e->key_size = key_size;
        memcpy(e->key, key, key_size);
        free(hmap_put(&x->entries, (struct bytes){e->key, key_size}, e));
        return;
    }
}

/* Finds (vhost, name)'s log in w and stages it (stage): OK with staged ""
 * when there is none. */
static int claim(struct journal *j, const struct where *w, const char *owner,
                 struct bytes vhost, struct bytes name, char *staged)
{
    ASSERT(j->recovered);
    uint8_t key[4 + 2 * 255];
    uint32_t key_size;
    make_key(key, &key_size, vhost, name);
    bool fresh = false;
    char leaf[ADOPT_LEAF_SIZE];
    int rc;
    do { /* a log the index names may have gone since: index again, once */
        rc = index_take(j, w, key, key_size, &fresh, leaf);
        if (rc <= 0) {
            staged[0] = '\0';
            return rc == 0 ? OK : E_IO; /* 0: no log, never written or adopted already */
        }
        rc = stage(j, w, owner, leaf, staged);
        if (rc == 0)
            index_staged(j, staged, key, key_size);
        if (rc == -ENOENT && !fresh)
            index_for(j, w)->scanned[0] = '\0'; /* stale: scan again */
    } while (rc == -ENOENT && !fresh);
    if (rc < 0) {
        staged[0] = '\0';
        return E_IO;
    }
    return OK;
}

/* A staged log being read (journal_adopt_read_start). */
struct journal_reading {
    struct journal *tmp;  /* the reader journal over the staged root */
    struct recovery *recovery;
    struct journal_adoption out;
};

struct journal_reading *journal_adopt_read_start(struct journal *j, const char *staged,
                                                 journal_recover_fn fn, void *ctx)
{
    ASSERT(j->adopt_unsynced_count == 0); /* the fence: only a durable rename is read */
    struct journal_reading *rd = xcalloc(1, sizeof *rd);
    snprintf(rd->out.staged, sizeof rd->out.staged, "%s", staged);
    int opened = journal_open_reader(&rd->tmp, j->loop, rd->out.staged);
    ASSERT(opened == OK);
    rd->tmp->adopting = true;
    rd->recovery = journal__recovery_start(rd->tmp, fn, ctx, &rd->out.stats);
    return rd;
}

int journal_adopt_read_step(struct journal_reading *rd, uint64_t until_ns)
{
    return journal__recovery_step(rd->recovery, until_ns);
}

int journal_adopt_read_finish(struct journal_reading *rd, struct journal_adoption *out)
{
    int rc = journal__recovery_finish(rd->recovery);
    *out = rd->out;
    uint32_t cursor = 0;
    struct hmap_entry *e;
    while (hmap_next(&rd->tmp->queues, &cursor, &e))
        out->seq_last = journal_queue_seq_last(e->value);
    journal_close(rd->tmp);
    free(rd);
    if (rc == OK)
        LOG_INFO("journal: took over %s (%" PRIu64 " live messages)", out->staged,
                 out->stats.message_count);
    return rc;
}

int journal_adopt_read(struct journal *j, const char *staged, journal_recover_fn fn, void *ctx,
                       struct journal_adoption *out)
{
    struct journal_reading *rd = journal_adopt_read_start(j, staged, fn, ctx);
    journal_adopt_read_step(rd, 0);
    return journal_adopt_read_finish(rd, out);
}

int journal_adopt_stage(struct journal *j, const char *foreign_dir, struct bytes vhost,
                        struct bytes name, char *staged)
{
    struct where w = {.prefix = "", .ours = false};
    journal__path(w.dir, foreign_dir, "queues");
    snprintf(w.name, sizeof w.name, "%s", w.dir);
    return claim(j, &w, base_name(foreign_dir), vhost, name, staged);
}

int journal_adopt(struct journal *j, const char *foreign_dir, struct bytes vhost,
                  struct bytes name, journal_recover_fn fn, void *ctx,
                  struct journal_adoption *out)
{
    memset(out, 0, sizeof *out);
    int rc = journal_adopt_stage(j, foreign_dir, vhost, name, out->staged);
    if (rc == OK)
        rc = journal_adopt_commit(j);
    if (rc != OK || out->staged[0] == '\0')
        return rc;
    return journal_adopt_read(j, out->staged, fn, ctx, out);
}

int journal_adopt_claim_staged(struct journal *j, const char *taker_dir, const char *source,
                               struct bytes vhost, struct bytes name, char *staged)
{
    struct where w = {.ours = taker_dir == NULL};
    journal__path(w.dir, taker_dir != NULL ? taker_dir : j->dir, "adopted");
    int n = snprintf(w.prefix, sizeof w.prefix, "%.200s.", source);
    ASSERT(n > 0 && (size_t)n < sizeof w.prefix);
    journal__path(w.name, w.dir, w.prefix);
    return claim(j, &w, source, vhost, name, staged);
}

struct sources {
    char (*names)[JOURNAL_SOURCE_SIZE];
    uint32_t cap, count;
};

static int source_entry(void *ctx, const char *leaf)
{
    struct sources *sc = ctx;
    const char *dot = strrchr(leaf, '.');
    if (dot == NULL || strlen(dot + 1) != 16 || (size_t)(dot - leaf) >= JOURNAL_SOURCE_SIZE)
        return 0; /* (a *.gone, or not a staged root) */
    size_t n = (size_t)(dot - leaf);
    for (uint32_t i = 0; i < sc->count; i++) {
        if (strlen(sc->names[i]) == n && memcmp(sc->names[i], leaf, n) == 0)
            return 0;
    }
    if (sc->count == sc->cap)
        return 0;
    memcpy(sc->names[sc->count], leaf, n);
    sc->names[sc->count++][n] = '\0';
    return 0;
}

int journal_adopt_staged_sources(struct journal *j, const char *taker_dir,
                                 char (*sources)[JOURNAL_SOURCE_SIZE], uint32_t cap)
{
    char adopted[JOURNAL_PATH_SIZE];
    journal__path(adopted, taker_dir != NULL ? taker_dir : j->dir, "adopted");
    struct sources sc = {sources, cap, 0};
    int rc = j->disk->readdir(j->disk->ctx, adopted, source_entry, &sc);
    return rc < 0 && rc != -ENOENT ? rc : (int)sc.count;
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

/* Before it is removed a staged copy is renamed to <it>.gone: a taker
 * claiming it meanwhile (a rename too) gets all of it or nothing, never
 * a log half unlinked. On the journal thread. */
int journal__remove_staged(const struct disk_ops *d, const char *staged)
{
    if (journal__ends_with(staged, ".gone"))
        return journal__remove_path(d, staged); /* a removal a crash cut short */
    char gone[JOURNAL_PATH_SIZE];
    int n = snprintf(gone, sizeof gone, "%s.gone", staged);
    if (n <= 0 || n >= JOURNAL_PATH_SIZE)
        return journal__remove_path(d, staged); /* (a path that long: in place) */
    int rc = d->rename(d->ctx, staged, gone);
    if (rc == -ENOENT)
        return 0; /* claimed by a taker (it has our copy in our log), or gone */
    return rc < 0 ? rc : journal__remove_path(d, gone);
}

static int report_entry(void *ctx, const char *name)
{
    const char *adopted = ctx;
    if (!journal__ends_with(name, ".gone"))
        LOG_WARN("journal: %s/%s is a takeover that a crash or a restart interrupted: once "
                 "caught up with the map we adopt it again, leave it to the queue's new "
                 "taker, or remove it (docs/ARCHITECTURE.md section 11)", adopted, name);
    return 0;
}

void journal__adopted_report(struct journal *j)
{
    char adopted[JOURNAL_PATH_SIZE];
    journal__path(adopted, j->dir, "adopted");
    j->disk->readdir(j->disk->ctx, adopted, report_entry, adopted); /* none: ENOENT */
}

struct sweep {
    struct journal *j;
    const char *adopted;
    journal_staged_fn fn;
    void *ctx;
};

static int sweep_entry(void *ctx, const char *leaf)
{
    struct sweep *sw = ctx;
    char path[JOURNAL_PATH_SIZE];
    journal__path(path, sw->adopted, leaf);
    if (journal__ends_with(leaf, ".gone")) { /* a removal a crash cut short */
        journal_adopt_finish(sw->j, path);
        return 0;
    }
    const char *dot = strrchr(leaf, '.');
    uint8_t key[4 + 2 * 255];
    uint32_t key_size = 0;
    if (dot != NULL && strlen(dot + 1) == 16) { /* <source>.<id>: <leaf>/queues/<id> */
        char queues[JOURNAL_PATH_SIZE];
        journal__path(queues, path, "queues");
        char dir[JOURNAL_PATH_SIZE];
        journal__path(dir, queues, dot + 1);
        key_size = read_header(sw->j->disk, dir, key, sizeof key);
    }
    uint32_t vhost_len = key_size >= 4 ? format_get_u32(key) : 0;
    if (key_size < 4 || vhost_len > key_size - 4)
        return 0; /* not a staged log (or unreadable): left alone */
    struct bytes vhost = {key + 4, vhost_len};
    struct bytes name = {key + 4 + vhost_len, key_size - 4 - vhost_len};
    if (sw->fn(sw->ctx, vhost, name, path))
        journal_adopt_finish(sw->j, path);
    return 0;
}

void journal_adopt_sweep(struct journal *j, journal_staged_fn fn, void *ctx)
{
    ASSERT(j->recovered);
    char adopted[JOURNAL_PATH_SIZE];
    journal__path(adopted, j->dir, "adopted");
    struct sweep sw = {j, adopted, fn, ctx};
    j->disk->readdir(j->disk->ctx, adopted, sweep_entry, &sw); /* none: ENOENT */
}
