/*
 * link_int.h: what link.c (the connection: connect, handshake, heartbeats,
 * reconnect) and link_channel.c (channels: open/close, output, inbound
 * methods and content assembly) share. Not for other modules.
 */
#ifndef QUAY_CLUSTER_LINK_INT_H
#define QUAY_CLUSTER_LINK_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "amqp/frame.h"
#include "cluster/link.h"
#include "net/conn.h"

/* A peer may send content up to this size (the broker's own limit is
 * configurable, 128 MiB by default): a larger claim is a broken peer. */
#define LINK_BODY_SIZE_MAX (1ull << 30)
/* frame_max we accept: the server's offer, at most this (0 = this). */
#define LINK_FRAME_MAX 131072u

/* Where the link stands. One connection attempt at a time. */
enum link_state {
    LINK_STATE_IDLE,       /* waiting for the (backoff) timer */
    LINK_STATE_RESOLVING,  /* uv_getaddrinfo in flight */
    LINK_STATE_CONNECTING, /* TCP connect in flight */
    LINK_STATE_START,      /* protocol header sent; waiting for connection.start */
    LINK_STATE_SECURE,     /* start-ok sent; waiting for connection.secure (the nonce) */
    LINK_STATE_TUNE,       /* secure-ok sent; waiting for connection.tune */
    LINK_STATE_OPEN_OK,    /* tune-ok and open sent; waiting for open-ok */
    LINK_STATE_UP,         /* channels may be opened */
};

/* One connection attempt's transport. Owned by the link while attached
 * (link->lc); once detached (lc->link == NULL: the attempt failed, the
 * connection was dropped, or the link was freed) it only waits for
 * libuv's close and frees itself in on_free. */
struct link_conn {
    struct conn conn;             /* first: transport callbacks cast back */
    struct link *link;            /* NULL once detached */
};

/* A host-name lookup in flight; frees itself in its callback. */
struct link_resolve {
    uv_getaddrinfo_t req;
    struct link *link;            /* NULL once abandoned */
};

enum link_channel_state {
    LINK_CHANNEL_STATE_OPENING, /* channel.open (and confirm.select) sent; waiting for the -oks */
    LINK_CHANNEL_STATE_OPEN,
    LINK_CHANNEL_STATE_CLOSING, /* closed by our user: channel.close sent, waiting for close-ok */
    LINK_CHANNEL_STATE_GONE,    /* out of the table; closed() runs, then it is freed */
};

/* What the channel expects next from the peer (content, §4.2.6). */
enum link_content {
    LINK_CONTENT_NONE,   /* a method */
    LINK_CONTENT_HEADER, /* after deliver/get-ok/return: the content header */
    LINK_CONTENT_BODY,   /* body frames until body_size bytes arrived */
};

/* Owned by its link, in link->channels[id] until closed. */
struct link_channel {
    struct link *link;            /* borrowed: the owner */
    struct link_channel_ops ops;  /* copied; zeroed once our user closed it */
    uint16_t id;
    enum link_channel_state state;
    bool confirm;
    bool open_ok;                 /* channel.open-ok arrived */
    bool select_ok;               /* confirm.select-ok arrived (true without confirm) */
    uint64_t publish_seq;         /* last publish number (confirm mode) */

    /* The content being received and the method it belongs to. Names
     * are copied out of the method frame: the input buffer moves on. */
    enum link_content content;
    uint32_t content_method;      /* METHOD_BASIC_DELIVER, _GET_OK or _RETURN */
    struct message *assembling;   /* one reference while body frames arrive */
    uint64_t delivery_tag;
    uint32_t message_count;
    uint16_t reply_code;
    bool redelivered;
    uint8_t text_size;
    uint8_t exchange_size;
    uint8_t routing_key_size;
    uint8_t text[255];            /* consumer tag (deliver) or reply text (return) */
    uint8_t exchange[255];
    uint8_t routing_key[255];
};

struct link {
    struct net *net;              /* borrowed */
    char *address;                /* owned: "host:port" as configured, for logs */
    char *host;                   /* owned: without brackets */
    char port[8];
    char *self_name;              /* owned */
    struct bytes secret;          /* owned copy */
    char *user;                   /* owned; NULL: the cluster login (QUAY-CLUSTER) */
    struct bytes password;        /* owned copy (PLAIN login only), cleansed at free */
    struct bytes vhost;           /* owned copy: connection.open's (empty: "/") */
    uint32_t reconnect_min_ms;
    uint32_t reconnect_max_ms;
    uint32_t handshake_timeout_ms;
    uint16_t heartbeat_s;         /* what we ask for */
    struct tls_context *tls;      /* borrowed; NULL = plain TCP */
    struct link_ops ops;

    enum link_state state;
    bool freed;                   /* link_free ran: only the timer's close is left */
    bool down_reported;           /* down() ran since the last up */
    uint32_t failures;            /* attempts since the last up: the backoff exponent */
    uint32_t address_turn;        /* which of a name's addresses the next attempt takes */
    struct link_conn *lc;         /* the current attempt's transport, or NULL */
    struct link_resolve *resolve; /* the current lookup, or NULL */
    uv_timer_t timer;             /* backoff, handshake timeout, heartbeats (unreferenced) */

    /* Negotiated in connection.tune. */
    struct frame_reader reader;
    uint32_t frame_max;
    uint16_t channel_max;
    uint16_t heartbeat_negotiated_s;

    struct link_channel **channels; /* owned array by id; NULL slots are free ids */
    uint32_t channels_cap;
    struct link_stats stats;
    uint16_t last_close_code;     /* the peer's last connection.close, 0 if none */
    char last_close_text[256];
};

/* link.c */
/* The peer broke the protocol: connection.close with the code ("CODE -
 * detail"), drop the connection, reconnect. */
void link__fail(struct link *link, uint16_t reply_code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Decodes a method frame, or fails the link (540 unknown, 501 malformed). */
bool link__decode(struct link *link, const struct frame *frame, struct method *out);
void link__send_method(struct link *link, uint16_t channel, const struct method *m);

/* link_channel.c */
void link__channel_frame(struct link_channel *ch, const struct frame *frame);
/* Releases what the channel holds and frees it (no callback). */
void link__channel_free(struct link_channel *ch);

#endif
