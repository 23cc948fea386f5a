/*
 * read_batch.h: reading a streaming publisher in batches, not a few
 * messages per loop iteration.
 *
 * Why: on loopback and fast links most of the broker's CPU per message is
 * the kernel's TCP path, and it is paid per read more than per byte: a
 * read that drains the socket sends an ACK, whose processing on the
 * peer's socket runs in our context too. A publisher that streams without
 * waiting for us is otherwise read every loop iteration, 4 KiB at a time.
 * Raising the socket's receive low-water mark (SO_RCVLOWAT) makes the
 * poll report it only once a batch is there (measured in bench/RESULTS.md,
 * "read batching").
 *
 * A low-water mark must never hold back bytes a peer waits on us to act
 * upon, nor hold the end of a stream for long:
 * - it is raised only on a connection we queued nothing to for
 *   READ_BATCH_QUIET_MS, this read included: a peer that waits for
 *   answers (a -ok, confirms, deliveries to ack) is never batched, and any
 *   output to the connection drops the mark at once;
 * - it is raised only for a dense stream (READ_BATCH_DENSE_PER_S frames a
 *   second, counted by the protocol in conn.in_units), sized to fill
 *   within half the wait at the rate the connection's bytes have been
 *   arriving, and never below READ_BATCH_MIN;
 * - a timer drops it `wait` after the connection's last read, so the last
 *   bytes of a stream, or a synchronous request right after one (a
 *   tx.commit), wait at most that long.
 *
 * Only connections whose conn_ops ask for it (batch_input: AMQP clients)
 * are batched. Linux only; elsewhere the functions do nothing.
 *
 * Ownership: the state lives in struct net (timer) and struct conn (mark,
 * list link); nothing is allocated.
 */
#ifndef QUAY_NET_READ_BATCH_H
#define QUAY_NET_READ_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "lib/list.h"

struct conn;

/* Marks below this are not worth a system call. */
#define READ_BATCH_MIN (4u << 10)
/* Nor above this: the read buffer is 256 KiB, and a batch this size
 * already costs one read per ~60 KiB of 1 KiB messages. */
#define READ_BATCH_MAX (64u << 10)
/* Nor for a connection sending fewer frames a second than this (about
 * 30k messages): below it reads cost little, and a batch would only add
 * its wait to every message's latency (measured: 4 KiB at 10k msg/s). */
#define READ_BATCH_DENSE_PER_S 100000u
/* Nor for one we queued output to within this long. */
#define READ_BATCH_QUIET_MS 20u
/* Default of --read-batch-us. */
#define READ_BATCH_WAIT_US_DEFAULT 500u

struct read_batch {
    uv_loop_t *loop;              /* borrowed */
    uint64_t wait_ns;             /* 0: batching off */
    int timer_fd;                 /* owned; -1 when off or unsupported */
    uv_poll_t timer_poll;
    bool timer_open;
    uint64_t armed_at_ns;         /* deadline the timer is set to; 0 = disarmed */
    struct list_node marked;      /* struct conn.batch_link, oldest read first */
    uint64_t raised_count;        /* marks raised from 0 (stats, tests) */
    uint64_t timeout_count;       /* marks the timer dropped */
};

/* Off until read_batch_enable. */
void read_batch_init(struct read_batch *rb, uv_loop_t *loop);
/* Batches for at most wait_us (0 = off). Returns 0, or -1 when the
 * platform lacks what it needs (batching stays off). */
int read_batch_enable(struct read_batch *rb, unsigned wait_us);
void read_batch_close(struct read_batch *rb);

/* After conn's protocol handled a read of nread bytes: raises, resizes or
 * drops its mark. */
void read_batch_after_read(struct read_batch *rb, struct conn *conn, size_t nread);
/* Drops conn's mark (output queued to it, reading paused, closing). */
void read_batch_drop(struct read_batch *rb, struct conn *conn);

#endif
