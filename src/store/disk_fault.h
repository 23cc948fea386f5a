/*
 * disk_fault.h: an in-memory struct disk_ops for crash tests, after SQLite's
 * test6.c. Files live in memory with two images: what was written and what
 * was fdatasync'ed. disk_fault_crash() freezes the disk at that instant:
 * every file falls back to its synced image, optionally keeping a random
 * prefix of its unsynced appended bytes (a torn write), and every later
 * operation fails with -EIO until disk_fault_restart() "reboots" it.
 * disk_fault_flip_bit() damages a file the way a bad sector would.
 *
 * Simplification, on purpose: directory operations (create, mkdir, rename,
 * unlink, truncate) are durable at once, as on a journaling file system that
 * committed its metadata; the journal still calls fsync_dir where POSIX
 * needs it, and the fault disk counts those calls.
 *
 * Owns all its memory; thread-safe (one mutex), deterministic for a seed.
 */
#ifndef QUAY_STORE_DISK_FAULT_H
#define QUAY_STORE_DISK_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/disk.h"

struct disk_fault;

struct disk_fault *disk_fault_new(uint64_t seed);
void disk_fault_free(struct disk_fault *d);
const struct disk_ops *disk_fault_ops(struct disk_fault *d);

/* Crash now: drop unsynced data (with tear: keep a random prefix of each
 * file's unsynced tail), then fail every operation until restart. */
void disk_fault_crash(struct disk_fault *d, bool tear);
/* Reboot after a crash: forget all descriptors, accept operations again. */
void disk_fault_restart(struct disk_fault *d);
/* Flips one bit of a file's (written and synced) contents. */
int disk_fault_flip_bit(struct disk_fault *d, const char *path, uint64_t offset, unsigned bit);
/* A copy of a file's current contents (malloc'ed, caller frees), or NULL. */
uint8_t *disk_fault_read_file(struct disk_fault *d, const char *path, size_t *size_out);
/* Paths of files whose name ends with suffix, sorted; caller frees each and the array. */
char **disk_fault_list_files(struct disk_fault *d, const char *suffix, size_t *count_out);
/* Makes the nth write/sync from now fail with err (0 disables). */
void disk_fault_fail_after(struct disk_fault *d, uint64_t operations, int err);

struct disk_fault_stats {
    uint64_t write_count;
    uint64_t sync_count;
    uint64_t dir_sync_count;
};
void disk_fault_stats(struct disk_fault *d, struct disk_fault_stats *out);

#endif
