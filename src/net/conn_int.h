/*
 * conn_int.h: what conn.c shares with conn_tls.c, and nobody else. The
 * output chunk list and its accounting stay conn.c's; the TLS side reads
 * the chunks in order and reports what it consumed.
 */
#ifndef QUAY_NET_CONN_INT_H
#define QUAY_NET_CONN_INT_H

#include "net/conn.h"

/* One piece of output. Either a copy (data[] of cap bytes, appended to
 * while it is the tail) or a reference to memory owned elsewhere. */
struct out_chunk {
    struct list_node link;
    const uint8_t *ref;           /* NULL for a copy chunk */
    conn_release_fn release;
    void *owner;
    size_t size;                  /* bytes queued in this chunk */
    size_t sent;                  /* bytes already written */
    size_t cap;                   /* copy chunks: capacity of data[] */
    uint8_t data[];
};

/* n bytes of output were consumed (written, or for TLS encrypted): frees
 * finished chunks, may resume reading, call on_drain, or close a
 * close_after_flush plain conn. */
void conn__advance(struct conn *conn, size_t n);
/* Keeps size bytes at data as the unconsumed input (conn.in). */
void conn__keep_leftover(struct conn *conn, const uint8_t *data, size_t size);
/* Puts conn on the list written at the end of this loop iteration. */
void conn__schedule_flush(struct conn *conn);
/* A read callback's start, plain or TLS: an error or EOF closes conn, and
 * bytes are counted. True if there are bytes to handle. */
bool conn__read_arrived(struct conn *conn, ssize_t nread);
/* Whether conn has read its share of this loop turn: the allocators then
 * give no buffer, and the read waits for the next turn (counted). */
bool conn__turn_spent(struct conn *conn);
/* After the protocol handled a read: the output pause and read batching. */
void conn__after_input(struct conn *conn, size_t nread);

/* conn_tls.c: the TLS versions of the read callbacks and of flush. */
void conn__tls_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf);
void conn__tls_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
void conn__tls_flush(struct conn *conn);

#endif
