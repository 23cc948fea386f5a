/*
 * shared_storage.h: a directory that several brokers mount (NFS v4, GFS2,
 * CephFS, or one machine's disk for tests), holding each broker's journal
 * under DIR/<broker name>/ so that a live broker can take over a dead
 * one's queue logs (journal_adopt). DIR/storage-id names the storage: a
 * random id written once by the first broker; brokers that read the same
 * id announce it in the cluster map (broker.storage) and so know they
 * share it.
 */
#ifndef QUAY_STORE_SHARED_STORAGE_H
#define QUAY_STORE_SHARED_STORAGE_H

#include <stddef.h>

#define SHARED_STORAGE_ID_SIZE 32 /* hex characters */

/* Creates dir and dir/<name> when missing, reads dir/storage-id (or
 * creates it, exclusively: the first broker's id wins a race). Writes the
 * journal directory into journal_dir and the id (NUL-terminated) into id.
 * Returns 0, or -1 with a message in err. */
int shared_storage_open(const char *dir, const char *name, char *journal_dir,
                        size_t journal_dir_size, char id[SHARED_STORAGE_ID_SIZE + 1], char *err,
                        size_t err_size);

#endif
