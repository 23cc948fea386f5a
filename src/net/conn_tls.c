/*
 * conn_tls.c: a conn's TLS layer, between libuv and the protocol.
 *
 * Input: ciphertext is read into the loop's scratch buffer, appended to
 * the session's input BIO at once, and everything it makes whole is
 * decrypted (SSL_read) before the protocol sees any of it: into the
 * scratch buffer again when no plaintext was kept from before, else after
 * the kept plaintext in conn.in. So the protocol's input path (on_input,
 * leftovers in conn.in, held input offered again) is the plain one, on
 * plaintext; and no plaintext is ever left inside OpenSSL, where a paused
 * connection would not see it again until its peer sent more.
 *
 * Output: in the check phase, conn.c's flush hands TLS conns here. The
 * queued chunks are encrypted in order (small ones coalesced, so a
 * delivery's method, header and body go out as one record), consumed with
 * conn__advance as if written, and the ciphertext is taken out of the
 * output BIO and written with one uv_try_write; what the kernel does not
 * take is copied to session.writing for a uv_write, and nothing more is
 * encrypted until it is written (the plaintext waits in the chunks, so
 * the output limits keep counting it).
 *
 * A handshake or record that fails is logged (info: strangers' garbage is
 * not our error), its alert tried once, and the conn closed. A handshake
 * that stalls is the protocol's handshake timeout's business.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/log.h"
#include "net/conn_int.h"
#include "net/tls.h"

/* Records carry at most 16 KiB of plaintext: small chunks are gathered
 * into one record's worth before SSL_write. */
#define TLS_RECORD_SIZE (16u << 10)
/* Ciphertext made per round before it is written (bounds the output BIO). */
#define TLS_ENCRYPT_BATCH (256u << 10)
/* A chunk this large is encrypted straight from its memory, this much at a time. */
#define TLS_WRITE_MAX (64u << 10)

/* The failure is logged, the alert OpenSSL made (if any) tried once
 * without waiting, and the conn closed. */
static void fail(struct conn *conn, const char *what)
{
    struct tls_session *session = conn->tls;
    char reason[256];
    tls_error_text(reason, sizeof reason);
    LOG_INFO("conn=%llu peer=%s TLS %s: %s", (unsigned long long)conn->id, conn->peer_name, what,
             reason);
    session->failed = true;
    char *data;
    long pending = BIO_get_mem_data(session->out, &data);
    if (pending > 0 && session->writing == NULL) {
        uv_buf_t buf = uv_buf_init(data, (unsigned)pending);
        (void)uv_try_write((uv_stream_t *)&conn->tcp, &buf, 1);
    }
    conn_close(conn);
}

void conn__tls_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    struct conn *conn = handle->data;
    (void)suggested;
    if (conn__turn_spent(conn)) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    /* Ciphertext is copied into the input BIO at once: always the scratch. */
    *buf = uv_buf_init((char *)conn->net->scratch, (unsigned)conn->net->scratch_size);
}

/* Everything the input BIO makes whole, decrypted after the plaintext
 * kept in conn.in, into *data and *size (the scratch buffer, or conn.in
 * once it would overflow). Returns 0, 1 when the peer said close_notify,
 * or -1 for a failed handshake or record. */
static int decrypt(struct conn *conn, uint8_t **data, size_t *size)
{
    struct tls_session *session = conn->tls;
    bool in_scratch = conn->in_size == 0;
    uint8_t *buf = in_scratch ? conn->net->scratch : conn->in;
    size_t used = in_scratch ? 0 : conn->in_size;
    size_t cap = in_scratch ? conn->net->scratch_size : conn->in_cap;
    ERR_clear_error();
    for (;;) {
        if (used == cap) {
            size_t grown = cap * 2;
            uint8_t *moved = xrealloc(conn->in, grown);
            if (in_scratch)
                memcpy(moved, buf, used);
            in_scratch = false;
            conn->in = buf = moved;
            conn->in_cap = cap = grown;
        }
        size_t room = cap - used < INT_MAX ? cap - used : INT_MAX;
        int n = SSL_read(session->ssl, buf + used, (int)room);
        if (n > 0) {
            used += (size_t)n;
            continue;
        }
        int err = SSL_get_error(session->ssl, n);
        if (!in_scratch)
            conn->in_size = used;
        *data = buf;
        *size = used;
        if (err == SSL_ERROR_WANT_READ)
            return 0;
        return err == SSL_ERROR_ZERO_RETURN ? 1 : -1;
    }
}

void conn__tls_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *conn = stream->data;
    if (!conn__read_arrived(conn, nread))
        return;
    ASSERT((size_t)nread <= conn->net->scratch_size);
    if (BIO_write(conn->tls->in, buf->base, (int)nread) != (int)nread) {
        fail(conn, "input");
        return;
    }
    uint8_t *data;
    size_t size;
    int rc = decrypt(conn, &data, &size);
    if (rc < 0) {
        fail(conn, SSL_is_init_finished(conn->tls->ssl) ? "record" : "handshake failed");
        return;
    }
    /* Handshake messages to answer with, and output that waited for the
     * handshake to finish. */
    if (BIO_ctrl_pending(conn->tls->out) > 0 || conn->out_bytes > 0)
        conn__schedule_flush(conn);
    if (size > 0) {
        long used = conn->ops->on_input(conn, data, size);
        if (used < 0 || conn->closing)
            return;
        ASSERT((size_t)used <= size);
        conn__keep_leftover(conn, data + used, size - (size_t)used);
    }
    if (rc == 1) {
        conn_close(conn); /* the peer's close_notify: as EOF */
        return;
    }
    conn__after_input(conn, (size_t)nread);
}

/* ---- output --------------------------------------------------------- */

static void on_write_done(uv_write_t *req, int status)
{
    struct conn *conn = req->data;
    struct tls_session *session = conn->tls;
    free(session->writing);
    session->writing = NULL;
    session->writing_size = 0;
    if (status < 0) {
        conn_close(conn);
        return;
    }
    conn->last_write_ms = uv_now(conn->net->loop);
    if (!conn->closing)
        conn__schedule_flush(conn);
}

/* The first chunk with bytes not yet consumed, or NULL. */
static struct out_chunk *first_unsent(struct conn *conn)
{
    list_for_each(node, &conn->out_chunks) {
        struct out_chunk *chunk = CONTAINER_OF(node, struct out_chunk, link);
        if (chunk->sent < chunk->size)
            return chunk;
    }
    return NULL;
}

/* Copies the unsent bytes of the chunks, in order, into record (at most
 * TLS_RECORD_SIZE); returns how many. */
static size_t gather_record(struct conn *conn, uint8_t *record)
{
    size_t filled = 0;
    list_for_each(node, &conn->out_chunks) {
        struct out_chunk *chunk = CONTAINER_OF(node, struct out_chunk, link);
        const uint8_t *base = chunk->ref ? chunk->ref : chunk->data;
        size_t left = chunk->size - chunk->sent;
        size_t take = left < TLS_RECORD_SIZE - filled ? left : TLS_RECORD_SIZE - filled;
        memcpy(record + filled, base + chunk->sent, take);
        filled += take;
        if (filled == TLS_RECORD_SIZE)
            break;
    }
    return filled;
}

/* Encrypts queued output into the output BIO until it holds a batch.
 * Returns 1 if it stopped at the batch (more to do once that is written),
 * 0 when every chunk is encrypted or the handshake must finish first, -1
 * on a failure. */
static int encrypt(struct conn *conn)
{
    struct tls_session *session = conn->tls;
    uint8_t record[TLS_RECORD_SIZE];
    ERR_clear_error();
    for (;;) {
        if (BIO_ctrl_pending(session->out) >= TLS_ENCRYPT_BATCH)
            return 1;
        struct out_chunk *chunk = first_unsent(conn);
        if (chunk == NULL)
            return 0;
        size_t left = chunk->size - chunk->sent;
        const uint8_t *from;
        size_t size;
        if (left >= TLS_RECORD_SIZE) {
            from = (chunk->ref ? chunk->ref : chunk->data) + chunk->sent;
            size = left < TLS_WRITE_MAX ? left : TLS_WRITE_MAX;
        } else {
            from = record;
            size = gather_record(conn, record);
        }
        int n = SSL_write(session->ssl, from, (int)size);
        if (n <= 0) {
            int err = SSL_get_error(session->ssl, n);
            return err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE ? 0 : -1;
        }
        ASSERT((size_t)n == size); /* memory BIOs take all: no partial writes */
        conn__advance(conn, (size_t)n);
        if (conn->closing)
            return 0;
    }
}

/* Hands the output BIO's ciphertext to the socket. Returns true when all
 * of it was written; false when the rest waits in a uv_write (or the conn
 * is closing). The ciphertext is read out through the scratch buffer:
 * flushes run in the check phase, never inside a read, so it is free. */
static bool write_out(struct conn *conn)
{
    struct tls_session *session = conn->tls;
    uint8_t *buf = conn->net->scratch;
    size_t cap = conn->net->scratch_size;
    for (size_t pending = BIO_ctrl_pending(session->out); pending > 0;
         pending = BIO_ctrl_pending(session->out)) {
        int n = BIO_read(session->out, buf, (int)(pending < cap ? pending : cap));
        ASSERT(n > 0);
        uv_buf_t iov = uv_buf_init((char *)buf, (unsigned)n);
        int written = uv_try_write((uv_stream_t *)&conn->tcp, &iov, 1);
        if (written == UV_EAGAIN)
            written = 0;
        if (written < 0) {
            conn_close(conn);
            return false;
        }
        if (written == n)
            continue;
        /* The kernel is full: the rest waits in memory of its own. */
        size_t rest = (size_t)(n - written);
        size_t more = BIO_ctrl_pending(session->out);
        session->writing = xmalloc(rest + more);
        memcpy(session->writing, buf + written, rest);
        if (more > 0) {
            int got = BIO_read(session->out, session->writing + rest, (int)more);
            ASSERT(got == (int)more);
        }
        session->writing_size = rest + more;
        session->write_req.data = conn;
        iov = uv_buf_init((char *)session->writing, (unsigned)session->writing_size);
        if (uv_write(&session->write_req, (uv_stream_t *)&conn->tcp, &iov, 1, on_write_done) < 0)
            conn_close(conn); /* the handle's close frees writing with the session */
        return false;
    }
    return true;
}

void conn__tls_flush(struct conn *conn)
{
    struct tls_session *session = conn->tls;
    if (conn->closing || session->writing != NULL)
        return;
    if (conn->close_after_flush && !SSL_is_init_finished(session->ssl)) {
        /* A goodbye before the handshake ended (a shutdown): nothing we
         * queued could be encrypted for this peer. */
        conn_close(conn);
        return;
    }
    for (;;) {
        int more = encrypt(conn);
        if (more < 0) {
            fail(conn, "write");
            return;
        }
        if (conn->closing)
            return;
        bool goodbye = conn->close_after_flush && conn->out_bytes == 0;
        if (goodbye && !session->shutdown_sent) {
            session->shutdown_sent = true;
            (void)SSL_shutdown(session->ssl); /* queues our close_notify */
            ERR_clear_error();
        }
        if (!write_out(conn))
            return;
        conn->last_write_ms = uv_now(conn->net->loop);
        if (goodbye) {
            conn_close(conn);
            return;
        }
        if (more == 0)
            return;
    }
}
