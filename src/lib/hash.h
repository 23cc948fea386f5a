/*
 * hash.h: an open-addressing hash map from byte strings to pointers.
 *
 * The map never owns keys or values: a key is a slice that must stay valid
 * while its entry exists (callers key objects by a name the object itself
 * owns, e.g. a queue's name). Linear probing with backward-shift deletion,
 * so there are no tombstones and lookups stay short after many deletes.
 */
#ifndef QUAY_LIB_HASH_H
#define QUAY_LIB_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"

struct hmap_entry {
    uint64_t hash; /* 0 marks an empty slot (real hashes are forced non-zero) */
    struct bytes key;
    void *value;
};

struct hmap {
    struct hmap_entry *slots; /* owned */
    uint32_t slots_count;     /* a power of two, or 0 before the first put */
    uint32_t count;
};

/* SipHash (Aumasson and Bernstein) with key (k0, k1), c_rounds compression
 * and d_rounds finalization rounds per the paper: 2, 4 is SipHash-2-4. */
uint64_t siphash(uint64_t k0, uint64_t k1, unsigned c_rounds, unsigned d_rounds,
                 const uint8_t *p, size_t len);

/* The tables' hash: SipHash-1-3 under this process's key, so that names a
 * client chooses (queues, exchanges, consumer tags, message ids) cannot be
 * picked to collide. The key is fixed (zero) until hash_seed_random. */
uint64_t hash_bytes(const uint8_t *p, size_t len);
/* A random key for this process (quayd calls it first thing, before any
 * table exists: the hashes in a table must not change under it). OK, or
 * E_IO if the system has no randomness to give (the key stays). */
int hash_seed_random(void);

void hmap_init(struct hmap *map);
void hmap_free(struct hmap *map); /* frees the slots only */
void *hmap_get(const struct hmap *map, struct bytes key);
/* Inserts or replaces; returns the previous value or NULL. Aborts on OOM. */
void *hmap_put(struct hmap *map, struct bytes key, void *value);
void *hmap_remove(struct hmap *map, struct bytes key);

/* Iteration: for (uint32_t i = 0; hmap_next(map, &i, &e);) ... Do not put or
 * remove while iterating; collect first. */
int hmap_next(const struct hmap *map, uint32_t *cursor, struct hmap_entry **out);

#endif
