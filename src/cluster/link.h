/*
 * link.h: a broker's outbound AMQP 0-9-1 client connection to a peer
 * broker ("the link"). Brokers of a cluster talk to each other over AMQP
 * itself; each keeps one link per peer, over which the proxy layer
 * forwards publishes, runs upstream consumers, gets, declares and purges.
 *
 * The link connects, logs in with the cluster secret (mechanism
 * QUAY-CLUSTER, see broker/auth.h: the proof is auth_cluster_proof, the
 * one function both sides use), tunes, opens vhost "/", and reports up().
 * Channels are opened per vhost (the vhost travels in channel.open's
 * reserved field, which the server honours for cluster peers only).
 * When the connection is lost or refused, every channel gets closed(0),
 * then down() runs, and the link reconnects by itself with capped,
 * jittered exponential backoff.
 *
 *   link_new --> connecting --> handshake --> up --(lost)--> down --+
 *                    ^               |(fail, 5 s timeout)           |
 *                    +-- backoff <---+------------------------------+
 *
 * Callbacks run from the loop, never from inside a link_* call, except
 * that link_channel_close/link_free end all callbacks of what they close
 * at once. Any callback may call any link_* function, link_free included.
 *
 * Ownership: struct link is the caller's (link_new/link_free); each
 * struct link_channel is the link's, valid from link_channel_open until
 * its closed() returns or link_channel_close/link_free is called.
 * Messages handed to callbacks carry one reference for the callee.
 *
 * Must never: run a callback after link_free returned; touch the server
 * side (the broker serves a link like any client, plus the login and the
 * per-channel vhost); keep the loop alive on its own while waiting to
 * reconnect (its timer is unreferenced, as a broker's listeners keep the
 * loop alive).
 */
#ifndef QUAY_CLUSTER_LINK_H
#define QUAY_CLUSTER_LINK_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"

struct link;          /* opaque; one outbound connection */
struct link_channel;  /* opaque; one channel on it */
struct message;       /* broker/message.h */
struct method;        /* amqp/method_gen.h */
struct net;           /* net/conn.h */
struct tls_context;   /* net/tls.h */

struct link_config {
    /* The peer's AMQP "host:port": an IPv4 literal, "[v6]:port", or a host
     * name (resolved with uv_getaddrinfo at each attempt; when it has
     * several addresses, successive attempts take them in turn). Copied. */
    const char *address;
    const char *self_name;    /* our broker name, sent in the login (<= 255 bytes); copied */
    struct bytes secret;      /* the cluster secret (not empty); copied */
    uint32_t reconnect_min_ms, reconnect_max_ms; /* 0 = 100 / 2000 */
    uint16_t heartbeat_s;     /* 0 = 2: what we ask for in tune-ok (the peer's lower value wins) */
    uint32_t handshake_timeout_ms; /* 0 = 5000: connect to open-ok, else drop and retry */
    /* TLS with this client context (our certificate, the cluster's CAs), or
     * NULL for plain TCP (--cluster-tls). Borrowed: outlives the link. */
    struct tls_context *tls;
    /* A user's login instead of the cluster's (the management API acting
     * for the user who asked, api_amqp.h): user non-NULL logs in with
     * PLAIN as user/password and opens vhost (empty: "/"); secret may then
     * be empty. All copied. */
    const char *user;
    struct bytes password;
    struct bytes vhost;
};

struct link_ops {
    void *ctx;
    void (*up)(void *ctx, struct link *link);    /* handshake done: channels may be opened */
    /* The link is not up: the connection was lost, or an attempt failed
     * (refused, timed out, login refused). Every open channel already got
     * closed(); the link reconnects by itself. Runs at most once between
     * two ups (and once if the first attempts fail), not per attempt. */
    void (*down)(void *ctx, struct link *link);
    /* Optional: output fell back under the low-water mark after having
     * been above the high-water mark (link_channel_writable was false). */
    void (*drained)(void *ctx, struct link *link);
};

/* Returns 0, or UV_EINVAL for an address that is not "host:port", an
 * empty secret or self_name, or a self_name over 255 bytes. The first
 * connect starts from the loop. net must outlive the link (link_free
 * before net_close). */
int link_new(struct link **out, struct net *net, const struct link_config *config,
             const struct link_ops *ops);
/* Closes the connection (connection.close, then the socket); no callback
 * of any kind runs after this returns; memory is released once libuv is
 * done with the handles. Safe in any state and from any callback. */
void link_free(struct link *link);
bool link_is_up(const struct link *link);
/* The reply code of the peer's last connection.close (0: none), and its
 * text in *text (valid until the next close or link_free): why a login
 * or connection.open was refused. */
uint16_t link_last_close(const struct link *link, const char **text);

struct link_stats {
    uint64_t connects;        /* handshakes completed (up) */
    uint64_t disconnects;     /* up connections lost */
    uint64_t attempts_failed; /* attempts that never came up (refused, timeout, login) */
    uint64_t auth_failures;   /* the peer refused our login (403) */
    uint64_t frames_in;
    uint64_t frames_out;
    uint64_t bytes_in;        /* whole frames parsed */
    uint64_t bytes_out;       /* bytes queued for the socket */
};
void link_get_stats(const struct link *link, struct link_stats *out);

struct link_channel_ops {
    void *ctx;
    /* channel.open-ok received (and confirm.select-ok in confirm mode). */
    void (*opened)(void *ctx);
    /* The peer closed the channel (code/text from channel.close; we answer
     * close-ok) or the link went down (code 0). The struct link_channel is
     * freed right after this returns. */
    void (*closed)(void *ctx, uint16_t reply_code, struct bytes reply_text);
    /* basic.ack / basic.nack from the peer for our publishes (confirm mode). */
    void (*confirm)(void *ctx, uint64_t seq, bool multiple, bool ack);
    /* basic.deliver with its content; takes the message reference. NULL: dropped. */
    void (*deliver)(void *ctx, struct bytes consumer_tag, uint64_t delivery_tag, bool redelivered,
                    struct message *message);
    /* basic.get-ok (message non-NULL, reference passed) or basic.get-empty (message NULL). */
    void (*get_reply)(void *ctx, uint64_t delivery_tag, bool redelivered, uint32_t message_count,
                      struct message *message);
    /* basic.return; optional (NULL: drop). Takes the message reference. */
    void (*returned)(void *ctx, uint16_t reply_code, struct bytes reply_text,
                     struct message *message);
    /* Server-sent basic.cancel (we answer nothing: RabbitMQ clients don't). */
    void (*cancelled)(void *ctx, struct bytes consumer_tag);
    /* Every other method the peer sends on this channel (queue.declare-ok,
     * queue.purge-ok, basic.consume-ok, basic.qos-ok, basic.cancel-ok, ...),
     * in arrival order. Pointers inside m are valid during the call only.
     * Optional. */
    void (*reply)(void *ctx, const struct method *m);
};

/* Opens a channel (channel.open; with confirm: then confirm.select) in
 * vhost (empty: the connection's, "/"). Returns NULL if the link is not up
 * or out of channel ids. Methods may be sent right away (they are queued
 * after channel.open; AMQP allows pipelining). */
struct link_channel *link_channel_open(struct link *link, struct bytes vhost, bool confirm,
                                       const struct link_channel_ops *ops);
/* The channel changes hands: its callbacks go to ops (and ops->ctx) from
 * now on. */
void link_channel_set_ops(struct link_channel *ch, const struct link_channel_ops *ops);
/* Sends channel.close; no callbacks for this channel after this returns
 * (the id is reused only after close-ok). */
void link_channel_close(struct link_channel *ch);
/* basic.publish + content header + body frames (split by the negotiated
 * frame_max; properties as the message holds them encoded; large bodies
 * written by reference). Returns the publish sequence number (1, 2, ...
 * per channel, counted only in confirm mode; 0 otherwise). */
uint64_t link_publish(struct link_channel *ch, struct bytes exchange, struct bytes routing_key,
                      bool mandatory, struct message *message);
/* Any content-bearing method (basic.publish, or quay's basic.quay-forward)
 * followed by the message's content; numbered like link_publish. */
uint64_t link_send_content(struct link_channel *ch, const struct method *m,
                           struct message *message);
/* Any other method (basic.qos, basic.consume, basic.ack/nack/reject,
 * basic.get, basic.cancel, queue.declare, queue.purge, ...), encoded with
 * the generated codec. Not channel.open/close (the link's own). */
void link_send(struct link_channel *ch, const struct method *m);
/* False while the socket's output is above its high-water mark. */
bool link_channel_writable(const struct link_channel *ch);
/* The channel's id on the connection (logs, tests). */
uint16_t link_channel_id(const struct link_channel *ch);

#endif
