/*
 * ring.h: growing the power-of-two ring buffers used across quay (queue
 * entries, deliveries, confirm waits, forwards, replicas...). Each ring
 * keeps its own typed array and head/count/cap; only growth is shared.
 *
 * A ring holds count elements of elem_size bytes starting at slot head,
 * wrapping at cap (a power of two, or 0 for none yet); element i is at
 * slot (head + i) & (cap - 1).
 */
#ifndef QUAY_LIB_RING_H
#define QUAY_LIB_RING_H

#include <stddef.h>
#include <stdint.h>

/* Doubles the ring (or allocates first_cap slots, a power of two), keeping
 * its elements in order from slot 0: returns the new array (items is
 * freed), *head becomes 0 and *cap the new capacity. Aborts on allocation
 * failure. Use: r->items = ring_grow(r->items, sizeof *r->items, ...). */
void *ring_grow(void *items, size_t elem_size, uint32_t *head, uint32_t count, uint32_t *cap,
                uint32_t first_cap);

#endif
