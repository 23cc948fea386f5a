/*
 * conn.h: one TCP connection of the broker, as bytes in and bytes out.
 *
 * The transport knows nothing about AMQP. It reads into a loop-wide
 * scratch buffer and hands the bytes to its protocol through conn_ops;
 * bytes the protocol could not consume yet (a partial frame) are kept in a
 * per-connection buffer, so an idle connection holds no input memory.
 * Output is a list of chunks: copied bytes in fixed blocks, or references
 * to refcounted memory (message bodies) released once written. Everything
 * queued during one loop iteration is written together, with one writev,
 * in the loop's check phase ("after callbacks").
 *
 * Destruction is deferred: conn_close() marks the connection closing and
 * the memory is released from libuv's close callback, so no callback ever
 * sees a freed connection. The protocol's on_close runs exactly once.
 *
 * Ownership: struct conn is embedded in its protocol's object (e.g. the
 * AMQP connection), which conn_ops.on_free releases.
 */
#ifndef QUAY_NET_CONN_H
#define QUAY_NET_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "lib/list.h"
#include "lib/pool.h"
#include "net/loop_lag.h"
#include "net/read_batch.h"

struct conn;
struct net;

struct conn_ops {
    /* New input. Returns bytes consumed (the rest is offered again with
     * the next read), or a negative value to stop reading (the protocol
     * has called conn_close). Called only while not closing. */
    long (*on_input)(struct conn *conn, const uint8_t *data, size_t size);
    /* The socket is gone (EOF, error, or conn_close): stop using it. */
    void (*on_close)(struct conn *conn);
    /* Memory may be released now: libuv is done with the handle. */
    void (*on_free)(struct conn *conn);
    /* Output fell below the low-water mark after having been above it. */
    void (*on_drain)(struct conn *conn);
    /* size more bytes of the sink (conn_sink) are at its destination;
     * when it is full it is over (the protocol may set another one here).
     * Only for protocols that set sinks. */
    void (*on_sink)(struct conn *conn, size_t size);
    /* Read a streaming peer in batches (read_batch.h): for clients, not
     * for links whose timing the cluster's protocols depend on. */
    bool batch_input;
    /* Read at most net.read_share bytes of it a loop turn: for clients,
     * whose input competes for the loop; not for links, each of which
     * carries many queues and clients (net/conn.c, "the turn's share"). */
    bool share_turns;
};

/* Called with the output reference when its bytes have been written. */
typedef void (*conn_release_fn)(void *owner);

struct out_chunk;
struct connect_req;
struct tls_session;
struct tls_context;

struct conn {
    uv_tcp_t tcp;                 /* first: libuv handles are cast back */
    struct net *net;              /* borrowed */
    const struct conn_ops *ops;   /* borrowed, static */
    uint64_t id;

    uint8_t *in;                  /* owned; NULL when no partial input is kept */
    size_t in_size;
    size_t in_cap;
    size_t in_need;               /* bytes the protocol needs to make progress */
    /* conn_sink: the next sink_size bytes go to sink (the protocol's). */
    uint8_t *sink;                /* borrowed */
    size_t sink_size;
    size_t sink_tail;             /* usable room after the sink for what follows */
    bool sink_read;               /* the buffer on_alloc gave is the sink */
    bool read_short;              /* the next read is short (conn_read_short) */

    struct list_node out_chunks;  /* struct out_chunk, oldest first */
    size_t out_bytes;             /* queued and not yet written */
    size_t out_in_flight;         /* part of out_bytes handed to uv_write */
    uv_write_t write_req;
    struct list_node flush_link;  /* in net.flush_list when output is pending */

    uint64_t last_read_ms;
    uint64_t last_write_ms;
    uint64_t bytes_in;            /* read from the socket (TLS: ciphertext) */
    uint64_t bytes_out;           /* output sent (TLS: plaintext, as it is encrypted) */
    bool closing;
    bool close_after_flush;
    bool refused;                 /* over a limit: accept, then close at once */
    bool reading;
    uint32_t read_pauses;         /* enum conn_pause bits: why we are not reading */
    bool above_high_water;
    bool peer_loopback;
    /* Another broker (a cluster link, either end): always read, whatever
     * our output to it. Two brokers that each stop reading while their
     * output to the other is large (a catch-up one way, its acks the
     * other) would wait on each other for ever. */
    bool peer_reads_always;
    bool keepalive;               /* conn_keepalive was called */
    char peer_name[64];           /* "ip:port" */
    char local_name[72];          /* "ip:port", "[ip]:port" for IPv6 */
    struct list_node all_link;    /* in net.conns */
    struct list_node resume_link; /* in net.resume_list while held input waits */
    struct connect_req *connect_req; /* conn_connect in flight, else NULL */
    /* TLS (conn_tls.c), or NULL for plain TCP: the only test the plain
     * path makes for it is one branch per flush and per read start. */
    struct tls_session *tls;      /* owned */

    /* read_batch.c's: the receive low-water mark (0 = the kernel's), when
     * the connection was last read and last given output. */
    uint32_t batch_mark;
    uint64_t batch_read_ns;
    uint64_t last_out_ms;         /* loop time output was last queued to it */
    uint64_t in_units;            /* frames the protocol took (it counts them) */
    uint64_t batch_units_seen;    /* in_units at the last read */
    struct list_node batch_link;  /* in read_batch.marked while batch_mark > 0 */

    /* The turn's share (share_turns): bytes read in loop turn turn_at. */
    uint64_t turn_at;
    size_t turn_bytes;
};

/* Default of --read-share: a client's input a loop turn. 128 KiB is ~0.3 ms of
 * 1 KiB publishes; 64 KiB cost the confirm row a fifth of its rate (more
 * turns, smaller writes), and 256 KiB kept less beside a flooder
 * (bench/RESULTS.md, "A flooder's turn"). */
#define NET_READ_SHARE_DEFAULT (128u << 10)

/* Output beyond this makes conn_out_full() true: producers of output (queue
 * delivery) should hold back until on_drain. */
#define CONN_OUT_HIGH_WATER (1u << 20)
#define CONN_OUT_LOW_WATER (256u << 10)
/* Beyond this the peer is not reading (deliveries alone stop at the high
 * water mark), so its input is paused too until output is back under the
 * low water mark. */
#define CONN_OUT_READ_PAUSE (4u << 20)

/* Starts reading on an accepted stream. */
void conn_start(struct conn *conn);
/* Makes an accepted conn a TLS server (before conn_start): bytes read are
 * decrypted before the protocol sees them, output is encrypted. Returns 0,
 * or -1 (out of memory: close it). */
int conn_tls_accept(struct conn *conn, struct tls_context *tls);
/* Makes a conn_connect()ed conn a TLS client (right after conn_connect
 * returned 0): its handshake starts with the first output, which waits
 * for it. Returns 0, or -1 (out of memory). */
int conn_tls_connect(struct conn *conn, struct tls_context *tls);
/* For the protocol's timer, on a conn that has been quiet for a while:
 * a TLS conn releases the buffers its last burst left (tls_session_trim).
 * Nothing for plain conns, which hold none. */
void conn_trim_idle(struct conn *conn);
/* conn's TLS session, or NULL for plain TCP. */
static inline struct tls_session *conn_tls(const struct conn *conn)
{
    return conn->tls;
}
void conn_close(struct conn *conn);
/* Stops reading, writes what is queued, then closes: for goodbyes such as
 * connection.close-ok or our protocol header after a bad one. */
void conn_close_after_flush(struct conn *conn);

/* Reserves n contiguous bytes at the end of the output; write them, then
 * conn_out_commit(n). Never fails (aborts on OOM). */
uint8_t *conn_out_reserve(struct conn *conn, size_t n);
void conn_out_commit(struct conn *conn, size_t n);
/* Output for the peer is decided but written later in this loop iteration
 * (a publisher's confirms, net_flush_hook): counts as output now, so the
 * peer, who may wait for it, is not read in batches (read_batch.h). */
void conn_out_owed(struct conn *conn);
void conn_out_bytes(struct conn *conn, const void *data, size_t n);
/* Queues data owned by someone else; release(owner) runs once written or
 * when the connection goes away. Used for message bodies (zero copy). */
void conn_out_ref(struct conn *conn, const uint8_t *data, size_t n, conn_release_fn release,
                  void *owner);
static inline bool conn_out_full(const struct conn *conn)
{
    return conn->out_bytes >= CONN_OUT_HIGH_WATER;
}

/* Why a connection is not being read from. Reading resumes only when no
 * reason is left. */
enum conn_pause {
    CONN_PAUSE_CLOSING = 1u << 0,  /* a bad frame or a goodbye: read no more */
    CONN_PAUSE_OUTPUT = 1u << 1,   /* the peer is not reading what we send */
    CONN_PAUSE_ALARM = 1u << 2,    /* memory or disk alarm (publishers only) */
    CONN_PAUSE_HOLD = 1u << 3,     /* the protocol waits for an answer (conn_hold_input) */
    CONN_PAUSE_FLOW = 1u << 4,     /* its publishes wait for other brokers (flow control) */
    CONN_PAUSE_QUEUE = 1u << 5,    /* a queue it publishes to is congested (broker/flow.h) */
    CONN_PAUSE_TUNNEL = 1u << 6,   /* a TLS tunnel's plaintext end is full (raft_tls.c) */
};

/* The next size bytes of input belong at dst, the protocol's memory (a
 * large message body): they are read straight there instead of into the
 * scratch buffer and copied; on_sink reports them as they arrive. tail:
 * bytes of dst's memory after those that a read may also fill (up to
 * 4 KiB are used), so that the read that ends the sink takes what follows
 * too (the next publish's frames), which is then moved out and offered
 * to on_input. After a sink is filled without that, the next read is a
 * short one (4 KiB), so that the next body is not read into the scratch
 * buffer either.
 * Only from on_input that then consumes all it was offered, or from
 * on_sink. Plain TCP only: false on a TLS conn (its bytes are decrypted
 * into the scratch buffer anyway), and the bytes come through on_input.
 * dst must stay valid until the sink is full, conn_sink_cancel, or close. */
bool conn_sink(struct conn *conn, uint8_t *dst, size_t size, size_t tail);
/* The sink's memory is going away: the bytes it still expected come
 * through on_input. */
void conn_sink_cancel(struct conn *conn);
/* The protocol expects a large body next, but not its frame's header yet:
 * the next read is a short one (as after a sink), which takes the header
 * and little of the body, so that the rest can be sunk. */
void conn_read_short(struct conn *conn);

void conn_pause_reading(struct conn *conn, enum conn_pause reason);
void conn_resume_reading(struct conn *conn, enum conn_pause reason);

/* A peer we are not reading (paused for any reason) may have gone: its
 * FIN or RST waits in the kernel behind the input we left there, and so
 * do its heartbeats. So the kernel is asked (TCP_INFO): true if the
 * connection is over (the peer closed or reset it, or keepalive gave up
 * on it); else *quiet_ms is how long the kernel has heard nothing from it
 * (neither data nor an ACK of ours): a live peer's kernel acknowledges
 * what we send even while we read nothing of what it sends. */
bool conn_peer_gone(struct conn *conn, uint64_t *quiet_ms);
/* TCP keepalive probes once the socket has been silent for idle_s: with
 * heartbeats off and the peer's host vanished (no FIN ever comes), the
 * kernel gives up after a few unanswered probes and conn_peer_gone says
 * so. Idempotent. */
void conn_keepalive(struct conn *conn, unsigned idle_s);

/* The protocol stopped consuming input in the middle of what it was
 * offered, because it must wait for something asynchronous (a cluster map
 * commit, a peer broker's answer) before it may look at the next frame.
 * The unconsumed bytes are kept, reading stops, and conn_release_input
 * offers them again (from an idle callback, never from inside the
 * caller's stack) and resumes reading. */
void conn_hold_input(struct conn *conn);
void conn_release_input(struct conn *conn);

/* net: the loop-wide part of the transport. */
typedef struct conn *(*net_accept_fn)(struct net *net, void *ctx);

/* Work a layer above leaves for the end of the loop iteration, done in the
 * check phase right before output is written: what one iteration produced
 * goes out together (a publisher's confirms as one multiple ack, a proxy's
 * upstream settles in order). Owned by the registrant; net_flush_hook_arm
 * makes fn run once at the end of this iteration (the poll does not block
 * before it). fn may arm hooks, itself included (they run in the same
 * check phase). */
struct net_flush_hook {
    struct list_node link;         /* in net->flush_hooks */
    void (*fn)(struct net_flush_hook *hook);
    bool armed;
};

struct net {
    uv_loop_t *loop;               /* borrowed */
    uv_check_t flush_check;        /* flushes output after each loop iteration */
    uv_idle_t flush_idle;          /* active while output waits: the poll does not block */
    struct list_node flush_list;
    struct list_node flush_hooks;  /* struct net_flush_hook.link */
    uv_idle_t resume_idle;         /* re-offers held input (conn_release_input) */
    struct list_node resume_list;
    struct list_node conns;
    uint32_t conns_count;
    uint64_t next_conn_id;
    uint8_t *scratch;              /* owned: the shared read buffer */
    struct pool data_chunks;       /* output chunks of CHUNK_DATA_SIZE bytes */
    struct pool ref_chunks;        /* output chunks that reference a body */
    size_t scratch_size;
    uint64_t bytes_in;
    uint64_t bytes_out;
    uint64_t reads;
    struct read_batch read_batch;
    struct loop_lag loop_lag;      /* sampled by flush_check, every iteration */
    uint64_t turn;                 /* loop turns, counted by flush_check */
    uint32_t turn_readers;         /* connections read in this turn */
    uint32_t last_turn_readers;    /* ... and in the last one */
    size_t read_share;             /* a client's input a turn (0 = no limit) */
    uint64_t reads_deferred;       /* reads a share left to the next turn */
};

void net_init(struct net *net, uv_loop_t *loop);
void net_flush_hook_add(struct net *net, struct net_flush_hook *hook,
                        void (*fn)(struct net_flush_hook *hook));
void net_flush_hook_remove(struct net_flush_hook *hook);
void net_flush_hook_arm(struct net *net, struct net_flush_hook *hook);
/* Closes every connection and the flush handle. */
void net_close(struct net *net);
/* After the loop has run the close callbacks: frees the pools, asserting
 * that every output chunk came back. */
void net_free(struct net *net);
/* Called by the protocol when it allocated a conn for an accepted socket:
 * initializes the transport part. */
int conn_init(struct conn *conn, struct net *net, const struct conn_ops *ops);

/* An outbound connection's outcome: status 0 = connected and reading (as
 * after conn_start); < 0 = a libuv error, and the transport closes conn
 * right after this returns (on_close, then on_free, as for any conn). */
typedef void (*conn_connected_fn)(struct conn *conn, int status);

/* Outbound: conn_init, then a TCP connect to addr (the broker's cluster
 * links are ordinary conns). Returns 0, or a negative libuv error when
 * conn_init failed: then nothing runs and the caller still owns conn's
 * memory. After 0, connected() runs exactly once, from the loop (never
 * from inside this call, even when the connect fails at once), unless
 * the caller closes conn first: a conn_close before the connect
 * completed cancels it without calling connected(). */
int conn_connect(struct conn *conn, struct net *net, const struct conn_ops *ops,
                 const struct sockaddr *addr, conn_connected_fn connected);

/* A TCP connection with data unacknowledged for ms is aborted by the
 * kernel (TCP_USER_TIMEOUT) instead of waiting out its retransmission
 * backoff (minutes): for connections between brokers, which a silent cut
 * must break soon enough to be opened afresh once the path is back. */
void net_tcp_user_timeout(uv_tcp_t *tcp, unsigned ms);

#endif
