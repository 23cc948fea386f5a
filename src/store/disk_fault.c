/*
 * disk_fault.c: see disk_fault.h. A flat namespace of paths (files and
 * directories) in arrays; fine for tests with hundreds of files. Never used
 * by the broker in production.
 */
#include "store/disk_fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "lib/alloc.h"
#include "lib/assert.h"

struct fault_file {
    char *path; /* owned; NULL once unlinked */
    uint8_t *data;
    size_t size;
    size_t cap;
    uint8_t *synced;
    size_t synced_size;
    size_t synced_cap;
    size_t dirty_from; /* lowest offset written since the last sync */
    int open_count;
};

#define FAULT_FD_MAX 4096

struct disk_fault {
    struct disk_ops ops;
    pthread_mutex_t mutex;
    uint64_t rng;
    bool crashed;
    struct fault_file **files;
    size_t files_count;
    size_t files_cap;
    char **dirs;
    size_t dirs_count;
    size_t dirs_cap;
    struct fault_file *fds[FAULT_FD_MAX];
    uint64_t fail_countdown;
    int fail_err;
    struct disk_fault_stats stats;
};

static uint64_t rng_next(struct disk_fault *d)
{
    uint64_t z = (d->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    *buf = xrealloc(*buf, c);
    *cap = c;
}

static struct fault_file *file_find(struct disk_fault *d, const char *path)
{
    for (size_t i = 0; i < d->files_count; i++) {
        if (d->files[i]->path != NULL && strcmp(d->files[i]->path, path) == 0)
            return d->files[i];
    }
    return NULL;
}

static ssize_t dir_find(struct disk_fault *d, const char *path)
{
    for (size_t i = 0; i < d->dirs_count; i++) {
        if (strcmp(d->dirs[i], path) == 0)
            return (ssize_t)i;
    }
    return -1;
}

static void file_free(struct fault_file *f)
{
    free(f->path);
    free(f->data);
    free(f->synced);
    free(f);
}

/* Removes unlinked files nobody has open. */
static void files_collect(struct disk_fault *d)
{
    size_t kept = 0;
    for (size_t i = 0; i < d->files_count; i++) {
        struct fault_file *f = d->files[i];
        if (f->path == NULL && f->open_count == 0)
            file_free(f);
        else
            d->files[kept++] = f;
    }
    d->files_count = kept;
}

/* Counts down an injected failure; returns the error to fail with, or 0. */
static int inject(struct disk_fault *d)
{
    if (d->crashed)
        return -EIO;
    if (d->fail_countdown > 0 && --d->fail_countdown == 0)
        return d->fail_err;
    return 0;
}

static const char *parent_of(const char *path, char *buf, size_t size)
{
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    ASSERT(n < size);
    memcpy(buf, path, n);
    buf[n] = '\0';
    return buf;
}

static bool parent_exists(struct disk_fault *d, const char *path)
{
    char parent[1024];
    parent_of(path, parent, sizeof(parent));
    return parent[0] == '\0' || dir_find(d, parent) >= 0;
}

static int fault_open(void *ctx, const char *path, int flags, int *fd_out)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    int rc = d->crashed ? -EIO : 0;
    struct fault_file *f = rc == 0 ? file_find(d, path) : NULL;
    if (rc == 0 && f == NULL) {
        if (!(flags & DISK_OPEN_CREATE))
            rc = -ENOENT;
        else if (!parent_exists(d, path))
            rc = -ENOENT;
        else {
            f = xcalloc(1, sizeof(*f));
            f->path = xstrdup(path);
            if (d->files_count == d->files_cap) {
                d->files_cap = d->files_cap ? 2 * d->files_cap : 64;
                d->files = xrealloc(d->files, d->files_cap * sizeof(*d->files));
            }
            d->files[d->files_count++] = f;
        }
    }
    if (rc == 0 && (flags & DISK_OPEN_TRUNCATE)) {
        f->size = 0;
        f->synced_size = 0;
        f->dirty_from = 0;
    }
    int fd = -1;
    for (int i = 3; rc == 0 && i < FAULT_FD_MAX; i++) {
        if (d->fds[i] == NULL) {
            fd = i;
            break;
        }
    }
    if (rc == 0 && fd < 0)
        rc = -EMFILE;
    if (rc == 0) {
        d->fds[fd] = f;
        f->open_count++;
        *fd_out = fd;
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static struct fault_file *fd_file(struct disk_fault *d, int fd)
{
    ASSERT(fd >= 0 && fd < FAULT_FD_MAX);
    return d->fds[fd];
}

static int fault_close(void *ctx, int fd)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    struct fault_file *f = fd_file(d, fd);
    int rc = f == NULL ? -EBADF : 0;
    if (f != NULL) {
        d->fds[fd] = NULL;
        f->open_count--;
        files_collect(d);
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static int fault_pread(void *ctx, int fd, void *buf, size_t size, uint64_t offset, size_t *done)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    struct fault_file *f = fd_file(d, fd);
    int rc = d->crashed ? -EIO : f == NULL ? -EBADF : 0;
    if (rc == 0) {
        size_t n = 0;
        if (offset < f->size)
            n = f->size - (size_t)offset < size ? f->size - (size_t)offset : size;
        if (n > 0)
            memcpy(buf, f->data + offset, n);
        *done = n;
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static int fault_pwrite(void *ctx, int fd, const void *buf, size_t size, uint64_t offset)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    struct fault_file *f = fd_file(d, fd);
    int rc = f == NULL ? -EBADF : inject(d);
    if (rc == 0) {
        size_t end = (size_t)offset + size;
        reserve(&f->data, &f->cap, end);
        if (offset > f->size)
            memset(f->data + f->size, 0, (size_t)offset - f->size);
        memcpy(f->data + offset, buf, size);
        if (end > f->size)
            f->size = end;
        if (offset < f->dirty_from)
            f->dirty_from = (size_t)offset;
        d->stats.write_count++;
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static void file_sync(struct fault_file *f)
{
    reserve(&f->synced, &f->synced_cap, f->size);
    size_t from = f->dirty_from < f->synced_size ? f->dirty_from : f->synced_size;
    if (from < f->size)
        memcpy(f->synced + from, f->data + from, f->size - from);
    f->synced_size = f->size;
    f->dirty_from = f->size;
}

static int fault_fdatasync(void *ctx, int fd)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    struct fault_file *f = fd_file(d, fd);
    int rc = f == NULL ? -EBADF : inject(d);
    if (rc == 0) {
        file_sync(f);
        d->stats.sync_count++;
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static int fault_ftruncate(void *ctx, int fd, uint64_t size)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    struct fault_file *f = fd_file(d, fd);
    int rc = f == NULL ? -EBADF : inject(d);
    if (rc == 0) {
        reserve(&f->data, &f->cap, (size_t)size);
        if (size > f->size)
            memset(f->data + f->size, 0, (size_t)size - f->size);
        f->size = (size_t)size;
        file_sync(f); /* metadata is durable at once (see disk_fault.h) */
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static int fault_fsize(void *ctx, int fd, uint64_t *size_out)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    struct fault_file *f = fd_file(d, fd);
    int rc = d->crashed ? -EIO : f == NULL ? -EBADF : 0;
    if (rc == 0)
        *size_out = f->size;
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static bool has_prefix_dir(const char *path, const char *dir, size_t dir_len)
{
    return strncmp(path, dir, dir_len) == 0 && path[dir_len] == '/';
}

static char *replace_prefix(const char *path, size_t old_len, const char *new_prefix)
{
    size_t n = strlen(new_prefix) + strlen(path + old_len) + 1;
    char *p = xmalloc(n);
    size_t a = strlen(new_prefix);
    memcpy(p, new_prefix, a);
    memcpy(p + a, path + old_len, n - a);
    return p;
}

static int fault_rename(void *ctx, const char *from, const char *to)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    int rc = inject(d);
    struct fault_file *f = rc == 0 ? file_find(d, from) : NULL;
    ssize_t dir = rc == 0 ? dir_find(d, from) : -1;
    if (rc == 0 && f == NULL && dir < 0)
        rc = -ENOENT;
    if (rc == 0 && !parent_exists(d, to))
        rc = -ENOENT;
    if (rc == 0 && f != NULL) {
        struct fault_file *old = file_find(d, to);
        if (old != NULL && old != f) {
            free(old->path);
            old->path = NULL;
        }
        free(f->path);
        f->path = xstrdup(to);
        files_collect(d);
    } else if (rc == 0) {
        size_t len = strlen(from);
        for (size_t i = 0; i < d->files_count; i++) {
            struct fault_file *g = d->files[i];
            if (g->path != NULL && has_prefix_dir(g->path, from, len)) {
                char *p = replace_prefix(g->path, len, to);
                free(g->path);
                g->path = p;
            }
        }
        for (size_t i = 0; i < d->dirs_count; i++) {
            if (strcmp(d->dirs[i], from) == 0 || has_prefix_dir(d->dirs[i], from, len)) {
                char *p = replace_prefix(d->dirs[i], len, to);
                free(d->dirs[i]);
                d->dirs[i] = p;
            }
        }
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static int fault_unlink(void *ctx, const char *path)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    int rc = inject(d);
    struct fault_file *f = rc == 0 ? file_find(d, path) : NULL;
    if (rc == 0 && f == NULL)
        rc = -ENOENT;
    if (rc == 0) {
        free(f->path);
        f->path = NULL;
        files_collect(d);
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static int fault_mkdir(void *ctx, const char *path)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    int rc = inject(d);
    if (rc == 0 && (dir_find(d, path) >= 0 || file_find(d, path) != NULL))
        rc = -EEXIST;
    if (rc == 0 && !parent_exists(d, path))
        rc = -ENOENT;
    if (rc == 0) {
        if (d->dirs_count == d->dirs_cap) {
            d->dirs_cap = d->dirs_cap ? 2 * d->dirs_cap : 64;
            d->dirs = xrealloc(d->dirs, d->dirs_cap * sizeof(*d->dirs));
        }
        d->dirs[d->dirs_count++] = xstrdup(path);
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

static bool dir_has_entries(struct disk_fault *d, const char *path)
{
    size_t len = strlen(path);
    for (size_t i = 0; i < d->files_count; i++) {
        if (d->files[i]->path != NULL && has_prefix_dir(d->files[i]->path, path, len))
            return true;
    }
    for (size_t i = 0; i < d->dirs_count; i++) {
        if (has_prefix_dir(d->dirs[i], path, len))
            return true;
    }
    return false;
}

static int fault_rmdir(void *ctx, const char *path)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    int rc = inject(d);
    ssize_t i = rc == 0 ? dir_find(d, path) : -1;
    if (rc == 0 && i < 0)
        rc = -ENOENT;
    if (rc == 0 && dir_has_entries(d, path))
        rc = -ENOTEMPTY;
    if (rc == 0) {
        free(d->dirs[i]);
        d->dirs[i] = d->dirs[--d->dirs_count];
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

/* Collects direct children's names first, then calls fn without the lock so
 * that fn may call back into the disk (the journal unlinks while listing). */
static int fault_readdir(void *ctx, const char *path, disk_readdir_fn fn, void *fn_ctx)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    int rc = d->crashed ? -EIO : dir_find(d, path) < 0 ? -ENOENT : 0;
    size_t len = strlen(path);
    char **names = NULL;
    size_t count = 0;
    for (size_t i = 0; rc == 0 && i < d->files_count + d->dirs_count; i++) {
        const char *p = i < d->files_count ? d->files[i]->path : d->dirs[i - d->files_count];
        if (p == NULL || !has_prefix_dir(p, path, len) || strchr(p + len + 1, '/') != NULL)
            continue;
        names = xrealloc(names, (count + 1) * sizeof(*names));
        names[count++] = xstrdup(p + len + 1);
    }
    pthread_mutex_unlock(&d->mutex);
    size_t i = 0;
    for (; i < count; i++) {
        if (fn(fn_ctx, names[i]) != 0)
            break;
    }
    for (size_t k = 0; k < count; k++)
        free(names[k]);
    free(names);
    return rc;
}

static int fault_fsync_dir(void *ctx, const char *path)
{
    struct disk_fault *d = ctx;
    pthread_mutex_lock(&d->mutex);
    int rc = inject(d);
    if (rc == 0 && dir_find(d, path) < 0)
        rc = -ENOENT;
    if (rc == 0)
        d->stats.dir_sync_count++;
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

struct disk_fault *disk_fault_new(uint64_t seed)
{
    struct disk_fault *d = xcalloc(1, sizeof(*d));
    pthread_mutex_init(&d->mutex, NULL);
    d->rng = seed;
    d->ops = (struct disk_ops){
        .ctx = d,
        .open = fault_open,
        .close = fault_close,
        .pread = fault_pread,
        .pwrite = fault_pwrite,
        .fdatasync = fault_fdatasync,
        .ftruncate = fault_ftruncate,
        .fsize = fault_fsize,
        .rename = fault_rename,
        .unlink = fault_unlink,
        .mkdir = fault_mkdir,
        .rmdir = fault_rmdir,
        .readdir = fault_readdir,
        .fsync_dir = fault_fsync_dir,
    };
    return d;
}

void disk_fault_free(struct disk_fault *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->files_count; i++)
        file_free(d->files[i]);
    for (size_t i = 0; i < d->dirs_count; i++)
        free(d->dirs[i]);
    free(d->files);
    free(d->dirs);
    pthread_mutex_destroy(&d->mutex);
    free(d);
}

const struct disk_ops *disk_fault_ops(struct disk_fault *d)
{
    return &d->ops;
}

void disk_fault_crash(struct disk_fault *d, bool tear)
{
    pthread_mutex_lock(&d->mutex);
    ASSERT(!d->crashed);
    for (size_t i = 0; i < d->files_count; i++) {
        struct fault_file *f = d->files[i];
        size_t keep = 0;
        if (tear && f->size > f->synced_size) {
            size_t unsynced = f->size - f->synced_size;
            keep = (size_t)(rng_next(d) % (unsynced + 1));
        }
        size_t from = f->synced_size;
        /* Unsynced bytes at or after synced_size were written to data. */
        if (keep > 0) {
            reserve(&f->synced, &f->synced_cap, from + keep);
            memcpy(f->synced + from, f->data + from, keep);
        }
        f->size = from + keep;
        reserve(&f->data, &f->cap, f->size);
        if (f->size > 0)
            memcpy(f->data, f->synced, f->size);
        f->synced_size = f->size;
        f->dirty_from = f->size;
    }
    d->crashed = true;
    pthread_mutex_unlock(&d->mutex);
}

void disk_fault_restart(struct disk_fault *d)
{
    pthread_mutex_lock(&d->mutex);
    for (int fd = 0; fd < FAULT_FD_MAX; fd++) {
        if (d->fds[fd] != NULL) {
            d->fds[fd]->open_count--;
            d->fds[fd] = NULL;
        }
    }
    files_collect(d);
    d->crashed = false;
    d->fail_countdown = 0;
    pthread_mutex_unlock(&d->mutex);
}

int disk_fault_flip_bit(struct disk_fault *d, const char *path, uint64_t offset, unsigned bit)
{
    ASSERT(bit < 8);
    pthread_mutex_lock(&d->mutex);
    struct fault_file *f = file_find(d, path);
    int rc = f == NULL ? -ENOENT : offset >= f->size ? -EINVAL : 0;
    if (rc == 0) {
        f->data[offset] ^= (uint8_t)(1u << bit);
        if (offset < f->synced_size)
            f->synced[offset] ^= (uint8_t)(1u << bit);
    }
    pthread_mutex_unlock(&d->mutex);
    return rc;
}

uint8_t *disk_fault_read_file(struct disk_fault *d, const char *path, size_t *size_out)
{
    pthread_mutex_lock(&d->mutex);
    struct fault_file *f = file_find(d, path);
    uint8_t *copy = NULL;
    if (f != NULL) {
        copy = xmalloc(f->size + 1);
        if (f->size > 0)
            memcpy(copy, f->data, f->size);
        *size_out = f->size;
    }
    pthread_mutex_unlock(&d->mutex);
    return copy;
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

char **disk_fault_list_files(struct disk_fault *d, const char *suffix, size_t *count_out)
{
    pthread_mutex_lock(&d->mutex);
    char **out = NULL;
    size_t count = 0;
    size_t suffix_len = strlen(suffix);
    for (size_t i = 0; i < d->files_count; i++) {
        const char *p = d->files[i]->path;
        size_t len = p ? strlen(p) : 0;
        if (p == NULL || len < suffix_len || strcmp(p + len - suffix_len, suffix) != 0)
            continue;
        out = xrealloc(out, (count + 1) * sizeof(*out));
        out[count++] = xstrdup(p);
    }
    pthread_mutex_unlock(&d->mutex);
    if (count > 0)
        qsort(out, count, sizeof(*out), compare_strings);
    *count_out = count;
    return out;
}

void disk_fault_fail_after(struct disk_fault *d, uint64_t operations, int err)
{
    pthread_mutex_lock(&d->mutex);
    d->fail_countdown = operations;
    d->fail_err = err;
    pthread_mutex_unlock(&d->mutex);
}

void disk_fault_stats(struct disk_fault *d, struct disk_fault_stats *out)
{
    pthread_mutex_lock(&d->mutex);
    *out = d->stats;
    pthread_mutex_unlock(&d->mutex);
}
