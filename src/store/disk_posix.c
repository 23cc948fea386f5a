/*
 * disk_posix.c: the real struct disk_ops over POSIX calls. Retries EINTR and
 * short writes; never interprets data. Owns no state.
 */
#include "store/disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/assert.h"

static int posix_open(void *ctx, const char *path, int flags, int *fd_out)
{
    ASSERT(path != NULL);
    int oflags = O_CLOEXEC;
    if (flags & DISK_OPEN_CREATE)
        oflags |= O_RDWR | O_CREAT;
    else if (flags & DISK_OPEN_WRITE)
        oflags |= O_RDWR;
    else
        oflags |= O_RDONLY;
    if (flags & DISK_OPEN_TRUNCATE)
        oflags |= O_TRUNC;
    int fd;
    do {
        fd = open(path, oflags, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -errno;
    *fd_out = fd;
    return 0;
}

static int posix_close(void *ctx, int fd)
{
    ASSERT(fd >= 0);
    return close(fd) == 0 ? 0 : -errno;
}

static int posix_pread(void *ctx, int fd, void *buf, size_t size, uint64_t offset, size_t *done)
{
    ASSERT(fd >= 0);
    size_t total = 0;
    while (total < size) {
        ssize_t n = pread(fd, (char *)buf + total, size - total, (off_t)(offset + total));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        total += (size_t)n;
    }
    *done = total;
    return 0;
}

static int posix_pwrite(void *ctx, int fd, const void *buf, size_t size, uint64_t offset)
{
    ASSERT(fd >= 0);
    size_t total = 0;
    while (total < size) {
        ssize_t n = pwrite(fd, (const char *)buf + total, size - total, (off_t)(offset + total));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        ASSERT(n > 0);
        total += (size_t)n;
    }
    return 0;
}

static int posix_fdatasync(void *ctx, int fd)
{
    ASSERT(fd >= 0);
    return fdatasync(fd) == 0 ? 0 : -errno;
}

static int posix_ftruncate(void *ctx, int fd, uint64_t size)
{
    ASSERT(fd >= 0);
    return ftruncate(fd, (off_t)size) == 0 ? 0 : -errno;
}

static int posix_fsize(void *ctx, int fd, uint64_t *size_out)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    *size_out = (uint64_t)st.st_size;
    return 0;
}

static int posix_rename(void *ctx, const char *from, const char *to)
{
    return rename(from, to) == 0 ? 0 : -errno;
}

static int posix_unlink(void *ctx, const char *path)
{
    return unlink(path) == 0 ? 0 : -errno;
}

static int posix_mkdir(void *ctx, const char *path)
{
    return mkdir(path, 0755) == 0 ? 0 : -errno;
}

static int posix_rmdir(void *ctx, const char *path)
{
    return rmdir(path) == 0 ? 0 : -errno;
}

static int posix_readdir(void *ctx, const char *path, disk_readdir_fn fn, void *fn_ctx)
{
    ASSERT(fn != NULL);
    DIR *d = opendir(path);
    if (d == NULL)
        return -errno;
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (e == NULL) {
            rc = -errno;
            break;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (fn(fn_ctx, e->d_name) != 0)
            break;
    }
    closedir(d);
    return rc;
}

static int posix_fsync_dir(void *ctx, const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

static int posix_dir_identity(void *ctx, const char *path, uint64_t identity[2])
{
    (void)ctx;
    struct stat st;
    if (stat(path, &st) != 0)
        return -errno;
    identity[0] = (uint64_t)st.st_dev;
    identity[1] = (uint64_t)st.st_ino;
    return 0;
}

static const struct disk_ops posix_ops = {
    .ctx = NULL,
    .open = posix_open,
    .close = posix_close,
    .pread = posix_pread,
    .pwrite = posix_pwrite,
    .fdatasync = posix_fdatasync,
    .ftruncate = posix_ftruncate,
    .fsize = posix_fsize,
    .rename = posix_rename,
    .unlink = posix_unlink,
    .mkdir = posix_mkdir,
    .rmdir = posix_rmdir,
    .readdir = posix_readdir,
    .fsync_dir = posix_fsync_dir,
    .dir_identity = posix_dir_identity,
};

const struct disk_ops *disk_posix(void)
{
    return &posix_ops;
}
