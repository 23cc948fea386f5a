/*
 * connection.h: the server side of one AMQP 0-9-1 connection.
 *
 * Turns bytes into frames (amqp/frame.h), runs the connection handshake
 * (protocol header, start/start-ok, tune/tune-ok, open/open-ok), hands
 * channel frames to their channel, answers heartbeats and detects dead
 * peers, and closes cleanly on every error with the reply code the spec
 * names: a soft error closes only its channel (channel.c), a hard error
 * closes the connection.
 *
 * Memory: struct connection embeds its transport (struct conn) and is
 * freed from the transport's on_free, after on_close released every
 * channel (requeueing their unacked messages) and deleted the exclusive
 * queues it declared. Owned by the broker's list of connections.
 */
#ifndef QUAY_BROKER_CONNECTION_H
#define QUAY_BROKER_CONNECTION_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "amqp/frame.h"
#include "amqp/method_gen.h"
#include "broker/auth.h"
#include "broker/rates.h"
#include "net/conn.h"

struct broker;
struct channel;
struct vhost;
struct auth_user;
struct login;

/* Where the handshake stands. */
enum connection_state {
    CONNECTION_STATE_HEADER,    /* waiting for "AMQP\0\0\x09\x01" */
    CONNECTION_STATE_START_OK,  /* sent connection.start, waiting for start-ok */
    CONNECTION_STATE_SECURE_OK, /* sent connection.secure (a peer's login), waiting for
                                 * secure-ok */
    CONNECTION_STATE_TUNE_OK,   /* sent connection.tune, waiting for tune-ok */
    CONNECTION_STATE_OPEN_WAIT, /* tuned, waiting for connection.open */
    CONNECTION_STATE_OPEN,      /* serving channels */
    CONNECTION_STATE_CLOSING,   /* sent connection.close, waiting for close-ok */
    CONNECTION_STATE_CLOSED,    /* the socket is gone or going */
};

/* A connection's samples for rates (rates.h): RabbitMQ's recv_oct and
 * send_oct (conn.bytes_in, conn.bytes_out). */
enum connection_rate { CONNECTION_RATE_RECV_OCT, CONNECTION_RATE_SEND_OCT,
                       CONNECTION_RATE_COUNT };

struct connection {
    struct conn conn;                 /* first: transport callbacks cast back */
    struct rates rates;               /* of the bytes, sampled by the broker's tick */
    struct broker *broker;            /* borrowed */
    struct list_node broker_link;     /* in broker->connections */
    enum connection_state state;
    struct frame_reader reader;
    uint32_t frame_max;               /* negotiated, whole frame */
    uint16_t channel_max;             /* negotiated; highest usable channel id */
    uint16_t heartbeat_s;             /* negotiated; 0 = off */
    uint64_t started_ms;
    uint64_t closing_since_ms;
    const struct auth_user *user;     /* borrowed from broker->auth */
    struct vhost *vhost;              /* borrowed */
    bool client_cancel_notify;        /* client capability consumer_cancel_notify */
    bool client_auth_failure_close;   /* client capability authentication_failure_close */
    bool client_blocked;              /* client capability connection.blocked */
    /* Logged in with the cluster secret (mechanism QUAY-CLUSTER): another
     * broker's link (cluster/link.h). Its channels may each name a vhost
     * in channel.open (channel.c). */
    bool cluster_peer;
    char cluster_nonce[AUTH_CLUSTER_NONCE_SIZE + 1]; /* a peer's challenge (connection.secure) */
    bool publisher;                   /* has published: blocked by alarms */
    bool blocked;                     /* blocked by an alarm now */
    bool flow;                        /* not read until the brokers it forwards to catch up */
    struct list_node flow_ties;       /* the congested queues it waits for (flow.h) */
    uint32_t flow_waits;              /* how many: not read while > 0 (a client's) */
    /* Channels whose close crossed ours (both sides sent channel.close):
     * the client may still send the close-ok for ours, which is then
     * ignored once, as RabbitMQ does. Owned; rarely more than one. */
    uint16_t *crossed_closes;
    uint32_t crossed_closes_count, crossed_closes_cap;
    struct channel **channels;        /* owned array, indexed by channel id */
    uint32_t channels_cap;
    uint32_t channels_open;
    struct list_node exclusive_queues; /* struct queue.owner_link */
    uint32_t held;                    /* methods waiting for the cluster: input on hold */
    bool open_waits_for_sync;         /* connection.open held until the map is synced */
    /* The client's connection.close waits for channels that wait for a
     * primary (channel_close_with_connection): close-ok once none do. */
    uint32_t close_ok_owed;
    /* The input after the frame being dispatched (borrowed from the read:
     * valid during dispatch only), for connection__body_ahead. */
    const uint8_t *input_rest;
    size_t input_rest_size;
    /* While it is not read (blocked, flow, ...): when the kernel was last
     * asked about the peer, and when it last heard from it then. */
    uint64_t peer_checked_ms;
    uint64_t peer_heard_ms;
    /* Not logged in yet: counted in broker->handshaking_count until it
     * logs in or goes (--max-handshaking). */
    bool handshaking;
    /* A slow password check in flight (broker/login.h): input is held
     * until it answers; cancelled if the connection goes first. */
    struct login *login;
    const char *login_mechanism;      /* static: "PLAIN" or "AMQPLAIN", for the refusal */
    /* A large body frame taken in parts (connection_body.c): its header
     * is consumed; left payload bytes, then its end octet, are still to
     * come for channel's message, read straight into it while sinking.
     * discard: the message went (its channel closed): they are skipped. */
    struct {
        bool active;
        bool sinking;
        bool discard;
        uint16_t channel;
        uint32_t size;                /* the frame's payload size */
        uint32_t left;
    } split;
};

/* The broker's accept callback: allocates a connection for a new socket. */
struct conn *connection_accept(struct net *net, void *broker);

/* Periodic work (heartbeats, handshake timeout, close-ok timeout). */
void connection_tick(struct connection *connection, uint64_t now_ms);

/* Hard error: sends connection.close with the code and formatted text,
 * releases every channel, and closes the socket after close-ok (or a
 * timeout). class_id/method_id name the method that failed (0 if none). */
void connection_fail(struct connection *connection, uint16_t reply_code, uint32_t method_id,
                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void connection_failv(struct connection *connection, uint16_t reply_code, uint32_t method_id,
                      const char *fmt, va_list ap);

/* Server-initiated close with 320 CONNECTION_FORCED (shutdown). */
void connection_force_close(struct connection *connection, const char *reason);

/* Writes one method frame. */
void connection_send_method(struct connection *connection, uint16_t channel,
                            const struct method *method);

/* "CODE_NAME - detail" as RabbitMQ words it, cut to fit a shortstr. */
size_t connection__reply_text(char *out, size_t size, uint16_t reply_code, const char *fmt,
                              va_list ap);
/* Erlang-style rendering of bytes for reply texts (<<"abc">>, <<0,1>>). */
size_t connection__format_binary(char *out, size_t cap, const uint8_t *p, size_t len);
/* Decodes a method frame; on failure closes the connection with 540 or
 * 501 as RabbitMQ answers, and returns false. */
bool connection__decode_method(struct connection *connection, const struct frame *frame,
                               struct method *out);

/* A method's answer waits for something asynchronous (a cluster map
 * commit, a primary broker's reply): no further frame of this connection
 * is looked at until the matching connection_release, so methods are
 * still answered in order. */
/* Flow control (RabbitMQ's "flow" state): the connection published more
 * than the queues' primaries on other brokers have answered for (the
 * proxy's bound, cluster/proxy.h): it is not read until
 * connections_flow_resume, when they have caught up. */
void connection_flow(struct connection *connection);
void connections_flow_resume(struct broker *broker);

/* A channel that connection.close left waiting is gone (channel.c). */
void connection_channel_closed(struct connection *connection);

void connection_hold(struct connection *connection);
void connection_release(struct connection *connection);

/* The cluster map is applied up to the present: connections whose
 * connection.open waited for it are opened. */
void connection_cluster_synced(struct broker *broker);

/* Body bytes for channel that this read already holds right after the
 * frame being dispatched (its body frames, the last one possibly cut):
 * a message's room may be reserved up to this, as they have arrived. */
uint64_t connection__body_ahead(const struct connection *connection, uint16_t channel);

/* Large body frames in parts (connection_body.c). connection__split_begin:
 * input that starts with a body frame whose header is in but not all of
 * its payload: takes the header and the payload at hand (the rest is read
 * straight into the message) and returns the bytes taken, or 0 (it stays
 * whole: too small, or not for an assembling message). */
size_t connection__split_begin(struct connection *connection, const uint8_t *data, size_t size);
/* Input while a split frame is active: its payload bytes (when not read
 * into the message) and its end octet. Bytes taken, or -1 when its end
 * octet is wrong (the connection is failed). */
long connection__split_input(struct connection *connection, const uint8_t *data, size_t size);
/* The input ended after content for channel: if a large body frame is
 * still to come for it, the next read is a short one (conn_read_short). */
void connection__expect_body(struct connection *connection, uint16_t channel);
/* conn_ops.on_sink. */
void connection__on_sink(struct conn *conn, size_t size);
/* The channel's assembling message goes away (channel.c): the rest of a
 * split frame for it is skipped. */
void connection__body_dropped(struct connection *connection, uint16_t channel);
/* The frame's end octet is not FRAME_END: RabbitMQ's 501. */
void connection__fail_frame_end(struct connection *connection, uint8_t type,
                                const uint8_t *payload, size_t shown, uint8_t end);

/* Called by channels once they are fully closed and freed. */
void connection__channel_gone(struct connection *connection, uint16_t channel_id);

#endif
