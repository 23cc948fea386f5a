/*
 * shared_storage.c: the layout of a shared storage directory (see
 * shared_storage.h). Called once at start, before the journal opens.
 */
#include "store/shared_storage.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static bool valid_id(const char *id)
{
    if (strlen(id) != SHARED_STORAGE_ID_SIZE)
        return false;
    for (const char *p = id; *p; p++) {
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    }
    return true;
}

/* Writes a new id to path.tmp, syncs it and links it to path: link fails
 * with EEXIST when another broker got there first, and then its id wins. */
static int create_id(const char *path, char *err, size_t err_size)
{
    uint8_t raw[SHARED_STORAGE_ID_SIZE / 2];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
        snprintf(err, err_size, "no randomness for the storage id");
        return -1;
    }
    char text[SHARED_STORAGE_ID_SIZE + 2];
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(text + 2 * i, 3, "%02x", raw[i]);
    text[SHARED_STORAGE_ID_SIZE] = '\n';
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0 || write(fd, text, SHARED_STORAGE_ID_SIZE + 1) != SHARED_STORAGE_ID_SIZE + 1 ||
        fsync(fd) != 0) {
        snprintf(err, err_size, "cannot write %s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    int rc = link(tmp, path);
    int saved = errno;
    unlink(tmp);
    if (rc != 0 && saved != EEXIST) {
        snprintf(err, err_size, "cannot create %s: %s", path, strerror(saved));
        return -1;
    }
    return 0;
}

static int read_id(const char *path, char id[SHARED_STORAGE_ID_SIZE + 1], char *err,
                   size_t err_size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return 1; /* not yet */
    if (fd < 0) {
        snprintf(err, err_size, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char text[SHARED_STORAGE_ID_SIZE + 2] = {0};
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n > 0 && text[n - 1] == '\n')
        text[n - 1] = '\0';
    if (n < 0 || !valid_id(text)) {
        snprintf(err, err_size, "%s is not a storage id (%d hex digits)", path,
                 SHARED_STORAGE_ID_SIZE);
        return -1;
    }
    memcpy(id, text, SHARED_STORAGE_ID_SIZE + 1);
    return 0;
}

int shared_storage_open(const char *dir, const char *name, char *journal_dir,
                        size_t journal_dir_size, char id[SHARED_STORAGE_ID_SIZE + 1], char *err,
                        size_t err_size)
{
    if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
        snprintf(err, err_size, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/storage-id", dir);
    int rc = read_id(path, id, err, err_size);
    if (rc > 0 && create_id(path, err, err_size) == 0)
        rc = read_id(path, id, err, err_size);
    if (rc != 0)
        return -1;
    int n = snprintf(journal_dir, journal_dir_size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= journal_dir_size) {
        snprintf(err, err_size, "shared storage path too long");
        return -1;
    }
    if (mkdir(journal_dir, 0750) != 0 && errno != EEXIST) {
        snprintf(err, err_size, "cannot create %s: %s", journal_dir, strerror(errno));
        return -1;
    }
    return 0;
}
