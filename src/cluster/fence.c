/*
 * fence.c: see fence.h.
 */
#include "cluster/fence.h"

#include <stdlib.h>

bool fence_forward_fresh(const struct map_queue *q, uint32_t self_id, uint64_t epoch)
{
    return q != NULL && q->primary_id == self_id && epoch >= q->epoch;
}

bool fence_forward_relays(const struct map_queue *q, uint32_t self_id, uint64_t epoch)
{
    return q != NULL && q->primary_id != self_id && epoch < q->epoch && q->available;
}

bool fence_forward_gone(const struct cluster_map *map, const struct map_queue *q,
                        uint64_t epoch)
{
    return q == NULL && epoch <= map->version;
}

bool fence_map_behind(const struct cluster_map *map, const struct map_queue *q, uint64_t epoch)
{
    return q != NULL ? epoch > q->epoch : epoch > map->version;
}

bool fence_replica_kept(const struct map_queue *q, uint32_t self_id, uint64_t map_version,
                        uint64_t stream_version)
{
    return q != NULL && q->primary_id != self_id &&
           (map_queue_has_backup(q, self_id) || stream_version > map_version);
}

bool fence_replica_accepts(const struct map_queue *q, uint32_t self_id, uint64_t epoch,
                           uint64_t map_version, uint64_t stream_version)
{
    return fence_replica_kept(q, self_id, map_version, stream_version) && epoch >= q->epoch;
}

bool fence_backup_restarted(uint32_t known, uint32_t now)
{
    return known != 0 && now != known;
}

bool fence_stream_gates(bool in_sync, bool join_asked)
{
    return in_sync || join_asked;
}

bool fence_stream_wanted(bool in_sync, bool join_asked, bool live)
{
    return (in_sync && live) || join_asked;
}

enum fence_push fence_replica_push(uint64_t last_seq, uint64_t last_epoch, uint64_t seq,
                                   uint64_t epoch)
{
    if (seq > last_seq)
        return FENCE_PUSH_TAKE;
    return epoch == last_epoch ? FENCE_PUSH_HAVE : FENCE_PUSH_REFUSE;
}

static int by_newest(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

uint64_t fence_lease_until(uint64_t *heard, uint32_t n, bool member, uint64_t lease_ms)
{
    uint32_t others_needed = (n + 1) / 2; /* a majority of n + 1, less ourselves */
    if (!member || others_needed == 0)
        return UINT64_MAX;
    qsort(heard, n, sizeof heard[0], by_newest);
    uint64_t last = heard[others_needed - 1];
    return last == 0 ? 0 : last + lease_ms;
}

void fence_pause_step(struct fence_pause *p, bool lease_fresh, bool serving, uint64_t now_ms,
                      uint64_t pause_after_ms)
{
    if (lease_fresh) {
        *p = (struct fence_pause){0};
        return;
    }
    if (!serving) {
        p->stale_since_ms = 0; /* (a pause, once begun, lasts until the lease is back) */
        return;
    }
    if (p->stale_since_ms == 0)
        p->stale_since_ms = now_ms;
    if (now_ms - p->stale_since_ms >= pause_after_ms)
        p->paused = true;
}

/* Whether our map (its low 32 bits) has reached version. */
static bool reached(uint64_t our_version, uint32_t version)
{
    return (int32_t)((uint32_t)our_version - version) >= 0;
}

void fence_heard_note(struct fence_heard *h, uint64_t now_ms, bool has_version, uint32_t version,
                      bool catching_up, uint64_t our_version)
{
    if (catching_up)
        return;
    if (!has_version || reached(our_version, version)) {
        h->heard_ms = now_ms;
        h->waiting_ms = 0;
    } else if (h->waiting_ms == 0) {
        h->waiting_ms = now_ms;
        h->waiting_version = version;
    }
}

uint64_t fence_heard_ms(struct fence_heard *h, uint64_t our_version)
{
    if (h->waiting_ms != 0 && reached(our_version, h->waiting_version)) {
        if (h->waiting_ms > h->heard_ms)
            h->heard_ms = h->waiting_ms;
        h->waiting_ms = 0;
    }
    return h->heard_ms;
}
