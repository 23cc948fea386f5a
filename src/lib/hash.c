/*
 * hash.c: see hash.h. Names in these tables come from clients, so the hash
 * is keyed (SipHash-1-3, a random key per process: hash_seed_random): a
 * client cannot compute names that pile into one probe run. SipHash as
 * specified in "SipHash: a fast short-input PRF" (Aumasson, Bernstein,
 * 2012); tests/unit/test_hash.c checks it against the paper's vectors.
 */
#include "lib/hash.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"

static uint64_t hash_k0, hash_k1;

static inline uint64_t rotl(uint64_t x, unsigned b)
{
    return (x << b) | (x >> (64 - b));
}

static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#define SIPROUND(v0, v1, v2, v3)                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = rotl(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = rotl(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = rotl(v2, 32);                                                                         \
    } while (0)

uint64_t siphash(uint64_t k0, uint64_t k1, unsigned c_rounds, unsigned d_rounds,
                 const uint8_t *p, size_t len)
{
    ASSERT(p != NULL || len == 0);
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull;
    uint64_t v1 = k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ull;
    uint64_t v3 = k1 ^ 0x7465646279746573ull;
    size_t whole = len - len % 8;
    for (size_t i = 0; i < whole; i += 8) {
        uint64_t m = load_le64(p + i);
        v3 ^= m;
        for (unsigned r = 0; r < c_rounds; r++)
            SIPROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    /* The last word: the remaining bytes, and the length's low byte on top. */
    uint64_t b = (uint64_t)(len & 0xff) << 56;
    for (size_t i = whole; i < len; i++)
        b |= (uint64_t)p[i] << (8 * (i - whole));
    v3 ^= b;
    for (unsigned r = 0; r < c_rounds; r++)
        SIPROUND(v0, v1, v2, v3);
    v0 ^= b;
    v2 ^= 0xff;
    for (unsigned r = 0; r < d_rounds; r++)
        SIPROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t hash_bytes(const uint8_t *p, size_t len)
{
    uint64_t h = siphash(hash_k0, hash_k1, 1, 3, p, len);
    return h == 0 ? 1 : h; /* 0 marks an empty slot */
}

int hash_seed_random(void)
{
    uint8_t key[16];
    size_t got = 0;
    while (got < sizeof key) {
        ssize_t n = getrandom(key + got, sizeof key - got, 0);
        if (n <= 0)
            return E_IO;
        got += (size_t)n;
    }
    hash_k0 = load_le64(key);
    hash_k1 = load_le64(key + 8);
    return OK;
}

void hmap_init(struct hmap *map)
{
    map->slots = NULL;
    map->slots_count = 0;
    map->count = 0;
}

void hmap_free(struct hmap *map)
{
    free(map->slots);
    hmap_init(map);
}

static struct hmap_entry *find(const struct hmap *map, struct bytes key, uint64_t h)
{
    if (map->slots_count == 0)
        return NULL;
    uint32_t mask = map->slots_count - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        struct hmap_entry *e = &map->slots[i];
        if (e->hash == 0)
            return NULL;
        if (e->hash == h && bytes_equal(e->key, key))
            return e;
    }
}

void *hmap_get(const struct hmap *map, struct bytes key)
{
    struct hmap_entry *e = find(map, key, hash_bytes(key.ptr, key.len));
    return e ? e->value : NULL;
}

static void insert_fresh(struct hmap *map, struct hmap_entry entry)
{
    uint32_t mask = map->slots_count - 1;
    for (uint32_t i = (uint32_t)entry.hash & mask;; i = (i + 1) & mask) {
        if (map->slots[i].hash == 0) {
            map->slots[i] = entry;
            return;
        }
    }
}

static void grow(struct hmap *map)
{
    uint32_t old_count = map->slots_count;
    struct hmap_entry *old = map->slots;
    map->slots_count = old_count ? old_count * 2 : 8;
    map->slots = xcalloc(map->slots_count, sizeof *map->slots);
    for (uint32_t i = 0; i < old_count; i++) {
        if (old[i].hash != 0)
            insert_fresh(map, old[i]);
    }
    free(old);
}

void *hmap_put(struct hmap *map, struct bytes key, void *value)
{
    uint64_t h = hash_bytes(key.ptr, key.len);
    struct hmap_entry *e = find(map, key, h);
    if (e) {
        void *previous = e->value;
        e->value = value;
        e->key = key;
        return previous;
    }
    /* Keep the load factor under 3/4 so probe sequences stay short. */
    if ((map->count + 1) * 4 > map->slots_count * 3)
        grow(map);
    insert_fresh(map, (struct hmap_entry){h, key, value});
    map->count++;
    return NULL;
}

void *hmap_remove(struct hmap *map, struct bytes key)
{
    struct hmap_entry *e = find(map, key, hash_bytes(key.ptr, key.len));
    if (!e)
        return NULL;
    void *value = e->value;
    uint32_t mask = map->slots_count - 1;
    uint32_t hole = (uint32_t)(e - map->slots);
    /* Backward-shift deletion: move later members of the probe run into the
     * hole when their home slot allows it, so no tombstones are needed. */
    for (uint32_t i = (hole + 1) & mask;; i = (i + 1) & mask) {
        struct hmap_entry *n = &map->slots[i];
        if (n->hash == 0)
            break;
        uint32_t home = (uint32_t)n->hash & mask;
        bool movable = hole <= i ? (home <= hole || home > i) : (home <= hole && home > i);
        if (movable) {
            map->slots[hole] = *n;
            hole = i;
        }
    }
    map->slots[hole] = (struct hmap_entry){0};
    map->count--;
    return value;
}

int hmap_next(const struct hmap *map, uint32_t *cursor, struct hmap_entry **out)
{
    while (*cursor < map->slots_count) {
        struct hmap_entry *e = &map->slots[(*cursor)++];
        if (e->hash != 0) {
            *out = e;
            return 1;
        }
    }
    return 0;
}
