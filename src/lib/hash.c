/*
 * hash.c: see hash.h. FNV-1a is enough for names chosen by clients because
 * each broker seeds it at start, so a client cannot precompute collisions.
 */
#include "lib/hash.h"

#include <stdlib.h>
#include <string.h>

#include "lib/assert.h"

static uint64_t hash_seed = 0xcbf29ce484222325ull;

uint64_t hash_bytes(const uint8_t *p, size_t len)
{
    uint64_t h = hash_seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 29;
    return h == 0 ? 1 : h;
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
    map->slots = calloc(map->slots_count, sizeof *map->slots);
    ASSERT(map->slots != NULL);
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
