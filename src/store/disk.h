/*
 * disk.h: the I/O seam of the store. Every disk operation the journal makes
 * (open, pread, pwrite, fdatasync, ftruncate, rename, unlink, mkdir, rmdir,
 * readdir, directory fsync) goes through a struct disk_ops, so tests can run
 * the journal on a fault disk (disk_fault.h) that loses unsynced writes,
 * tears them and flips bits. disk_posix() is the real implementation.
 *
 * Every function returns 0 or a negative errno. Implementations must be
 * thread-safe: the journal thread writes while the loop thread reads
 * (paging) and, at start, recovers. Writes are whole or fail: pwrite returns
 * 0 only when all bytes were written.
 */
#ifndef QUAY_STORE_DISK_H
#define QUAY_STORE_DISK_H

#include <stddef.h>
#include <stdint.h>

enum disk_open_flags {
    DISK_OPEN_READ = 0,      /* read only; the file must exist */
    DISK_OPEN_WRITE = 1,     /* read and write; the file must exist */
    DISK_OPEN_CREATE = 2,    /* read and write; created when missing */
    DISK_OPEN_TRUNCATE = 4,  /* with CREATE: start empty */
};

/* Called once per directory entry except "." and ".."; return non-zero to stop. */
typedef int (*disk_readdir_fn)(void *ctx, const char *name);

struct disk_ops {
    void *ctx;
    int (*open)(void *ctx, const char *path, int flags, int *fd_out);
    int (*close)(void *ctx, int fd);
    /* Reads up to size bytes; *done < size only at end of file. */
    int (*pread)(void *ctx, int fd, void *buf, size_t size, uint64_t offset, size_t *done);
    int (*pwrite)(void *ctx, int fd, const void *buf, size_t size, uint64_t offset);
    int (*fdatasync)(void *ctx, int fd);
    int (*ftruncate)(void *ctx, int fd, uint64_t size);
    int (*fsize)(void *ctx, int fd, uint64_t *size_out);
    int (*rename)(void *ctx, const char *from, const char *to);
    int (*unlink)(void *ctx, const char *path);
    int (*mkdir)(void *ctx, const char *path); /* -EEXIST when it exists */
    int (*rmdir)(void *ctx, const char *path);
    int (*readdir)(void *ctx, const char *path, disk_readdir_fn fn, void *fn_ctx);
    int (*fsync_dir)(void *ctx, const char *path);
    /* Which directory path names now (device and inode): the journal's
     * fence on shared storage (journal_options.fenced). May be NULL on a
     * disk without fencing (the fault disk). */
    int (*dir_identity)(void *ctx, const char *path, uint64_t identity[2]);
};

/* The POSIX implementation (static, shared, stateless). */
const struct disk_ops *disk_posix(void);

#endif
