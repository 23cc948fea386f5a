/*
 * channel_int.h: what the channel_*.c files share. Not for other modules.
 */
#ifndef QUAY_BROKER_CHANNEL_INT_H
#define QUAY_BROKER_CHANNEL_INT_H

#include <stdarg.h>

#include "amqp/method_gen.h"
#include "amqp/reply_code_gen.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/connection.h"
#include "broker/queue.h"
#include "lib/hash.h"
#include "lib/list.h"

struct message;
struct vhost;

/* Reply texts name the channel's vhost as RabbitMQ's do. */
#define VHOST_FMT "in vhost '%.*s'"
#define VHOST_ARG(ch) BYTES_ARG((ch)->vhost->name)

enum channel_state {
    CHANNEL_STATE_OPEN,
    CHANNEL_STATE_CLOSING, /* we sent channel.close; waiting for close-ok */
};

/* What the channel expects next from a publisher (§4.2.6 content). */
enum content_state {
    CONTENT_STATE_NONE,    /* any method */
    CONTENT_STATE_HEADER,  /* after basic.publish: a content header */
    CONTENT_STATE_BODY,    /* body frames until body_size bytes arrived */
};

/* One message handed to this channel's client and not yet settled. */
struct delivery {
    struct message *message;   /* one reference */
    struct queue *queue;       /* one reference */
    struct consumer *consumer; /* borrowed; NULL for basic.get or once cancelled */
    uint64_t seq;              /* the queue's publish order, for requeue */
    uint64_t expires_at_ms;    /* kept across a requeue, as RabbitMQ does */
    bool live;                 /* false once settled (a hole in the ring) */
};

/* Deliveries indexed by tag: entry i of the ring has tag first_tag + i.
 * Tags grow by one per delivery, so lookup is O(1); settled entries
 * leave holes that are skipped when they reach the head. */
struct delivery_ring {
    struct delivery *items;    /* owned, cap entries */
    uint32_t head;
    uint32_t count;            /* entries from head, live or not */
    uint32_t cap;              /* a power of two, or 0 */
    uint64_t first_tag;        /* tag of the entry at head */
};

/* A publisher confirm that waits: for the journal's fsync (ticket), or
 * for other brokers (remote), or, answered already, for those before it
 * (channel.c: confirms go out in publish order where they can, and ahead
 * of a publish that still waits where they must). */
struct confirm_wait {
    uint64_t seq;              /* the publish's sequence number on the channel */
    uint64_t ticket;           /* journal sync ticket; 0 = nothing to wait for */
    uint32_t remote;           /* forwards to primaries not yet answered */
    bool nack;                 /* a queue refused it (reject-publish, failed forward) */
    bool answered;             /* acked or nacked alone, ahead of the head */
};

/* The channel's end of its forwarded publishes (confirm_sink_answer):
 * refcounted, so an answer arriving after the channel is gone is dropped. */
struct confirm_sink {
    uint32_t refs;
    struct channel *channel;   /* NULL once the channel is gone */
};

struct confirm_fifo {
    struct confirm_wait *items; /* owned ring */
    uint32_t head;
    uint32_t count;
    uint32_t cap;              /* a power of two, or 0 */
};

/* A publish or ack held back by tx.select until tx.commit. */
struct tx_op {
    struct list_node link;
    struct message *message;   /* publish: one reference; NULL for acks */
    uint32_t method_id;        /* METHOD_BASIC_PUBLISH / ACK / NACK / REJECT */
    uint64_t delivery_tag;
    bool multiple;
    bool requeue;
    bool mandatory;
};

struct channel {
    struct connection *connection;    /* borrowed: the owner */
    struct vhost *vhost;              /* borrowed */
    uint16_t id;
    enum channel_state state;
    bool flow_active;                 /* channel.flow from the client */
    bool confirm_mode;
    bool tx_mode;

    /* Publishing. */
    enum content_state content;
    bool publish_mandatory;
    bool publish_forward;             /* basic.quay-forward from a peer broker */
    bool publish_replicate;           /* basic.quay-replicate: a primary's stream to us */
    bool forward_dead_lettered;       /* a forward of a message a queue dead-lettered */
    uint64_t replicate_seq;
    uint8_t forward_target_size;
    uint8_t *forward_target;          /* owned, 256 bytes: the queue a replicate is for */
    uint64_t forward_epoch;
    uint8_t *forward_targets;         /* owned: a forward's targets table {queue: epoch} */
    uint32_t forward_targets_size, forward_targets_cap;
    /* A forward's origin (broker/origin.h): its stream (0: none), seq, and
     * whether it is a resend (checked, never recorded: only a stream's own
     * channel delivers its forwards in order). origin_frozen: this channel
     * refused a forward (at once, or later: parked, or held by a paused
     * queue), so it records no more (a later mark would hide the refused
     * seq, whose resend would then be dropped as a duplicate). */
    uint64_t forward_origin_stream, forward_origin_seq;
    bool forward_origin_resent;
    bool origin_frozen;
    uint8_t *publish_names;           /* owned, 512 bytes: exchange then key */
    uint8_t publish_exchange_size;
    uint8_t publish_routing_key_size;
    /* The last exchanges (up to 8) publishes were permitted to
     * (channel.c publish_permitted): later publishes to them skip the
     * regex. Owned; NULL until the channel's first publish. */
    struct permitted_exchanges *permitted;
    struct message *assembling;       /* one reference while receiving content */

    /* Publisher confirms: sequence numbers of this channel's publishes. */
    uint64_t publish_seq;             /* last assigned */
    uint64_t confirmed_seq;           /* answered to the client through here */
    struct confirm_fifo confirm_waits;
    struct confirm_sink *sink;        /* owned reference, made at the first forward */
    struct list_node durable_link;    /* in durable.confirm_waiters while waits exist */

    /* Consuming. */
    struct list_node consumers;       /* struct consumer.owner_link */
    struct hmap consumers_by_tag;
    uint32_t consumers_count;
    uint32_t prefetch_global;         /* basic.qos global=true; 0 = unlimited */
    uint32_t prefetch_consumer;       /* basic.qos global=false: for new consumers */
    uint64_t next_delivery_tag;
    struct delivery_ring deliveries;
    uint32_t unacked_count;

    uint8_t *last_queue;              /* owned, 256 bytes: the last queue declared here */
    uint8_t last_queue_size;
    bool has_last_queue;

    struct channel_cluster_wait *cluster_wait; /* owned: a wait for the cluster (held input) */
    /* A request at a stand-in's primary (held input): basic.get, passive
     * declare, purge, or delete's checks. */
    struct consumer *attaching;       /* its upstream consume awaits the primary (held input) */
    bool attaching_no_wait;
    struct queue_remote_op *remote_op;
    struct queue *remote_queue;       /* one reference while remote_op waits */
    uint32_t remote_method;
    bool remote_no_ack, remote_no_wait, remote_passive, remote_if_unused, remote_if_empty;
    /* A basic.get waiting while its queue stands still for a handover
     * (queue_hold_get; held input): asked again by name when it ends. */
    struct queue_get_wait get_wait;
    uint8_t get_name[256];
    uint8_t get_name_size;
    bool get_no_ack;

    struct channel_stats stats;       /* a client channel's (channel.h) */
    struct rates rates;               /* of stats */

    bool releasing;                   /* release() runs: nothing new may wait */
    bool client_closing;              /* the release is for the client's channel.close */
    /* The client's channel.close removed the last local consumer of these
     * auto-delete stand-ins (one reference each): close-ok waits until we
     * know, one after the other, whether their primaries deleted them
     * (channel__await_auto_delete). */
    struct queue **auto_delete_checks;
    uint32_t auto_delete_checks_count, auto_delete_checks_cap;
    bool close_pending;               /* close-ok waits for that */
    bool closing_with_connection;     /* ... and then the connection's close-ok */
    struct list_node tx_ops;          /* struct tx_op, in arrival order */
    uint64_t tx_ticket;               /* journal ticket the current commit needs */
    uint32_t tx_remote;               /* answers other brokers owe the current commit */
    bool tx_failed;                   /* one of them said no (or a queue refused one) */
    bool commit_pending;              /* tx.commit-ok waits for that fsync */
    struct list_node confirm_link;    /* in the flush list when acks are owed */
};

/* channel.c */
void channel__fail(struct channel *ch, uint16_t reply_code, uint32_t method_id,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void channel__send(struct channel *ch, const struct method *m);
/* RabbitMQ's permission check (broker/auth.h) of the connection's user in
 * the channel's vhost: kind access to the resource ("queue"/"exchange")
 * name. On refusal, logs it and fails the channel with 403 and RabbitMQ's
 * text; returns false. The default exchange "" is checked as
 * "amq.default". */
bool channel__permitted(struct channel *ch, enum auth_permission_kind kind,
                        const char *resource, struct bytes name, uint32_t method_id);
/* The connection-level failure for a method on this channel. */
void channel__connection_fail(struct channel *ch, uint16_t reply_code, uint32_t method_id,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Routes a completed publish, or holds it for tx.commit in tx mode. */
void channel__route_publish(struct channel *ch, struct message *message, bool mandatory);
/* Routes now (also used by tx.commit). */
void channel__route_now(struct channel *ch, struct message *message, bool mandatory);
void channel__route_forward(struct channel *ch, struct message *message);
void channel__route_replica(struct channel *ch, struct message *message);
void channel__begin_publish(struct channel *ch, const struct method *m);
/* basic.quay-forward: a peer broker's publish for one of our queues. */
void channel__begin_forward(struct channel *ch, const struct method *m);
/* basic.quay-settle: a message left a queue we are a backup of. */
void channel__handle_settle(struct channel *ch, const struct method *m);
void channel__handle_handover(struct channel *ch, const struct method *m);
/* basic.quay-sync: a peer's next requests need our map at that version. */
void channel__handle_sync(struct channel *ch, const struct method *m);
void channel__handle_usage(struct channel *ch, const struct method *m);
/* quay's own methods are for peer brokers only: clients see them as the
 * unknown methods they are to them (the connection fails with 540). */
bool channel__peer_only(struct channel *ch, uint32_t method_id);
/* queue.quay-counts-ok: the primary's counts as it answered them, or
 * (primary NULL) the queue's own here, primary set if it is real here. */
void channel__answer_counts(struct channel *ch, const struct queue *queue,
                            const struct queue_remote_counts *primary);

/* The journal synced everything up to ticket (status < 0: it failed, and
 * the publishes waiting for it are nacked). */
void channel__journal_synced(struct channel *ch, uint64_t ticket, int status);
/* Sends tx.commit-ok (or the failure) once the commit waits for nothing:
 * the journal synced through tx_ticket, every other broker answered. */
void channel__commit_check(struct channel *ch, uint64_t synced, int status);

/* channel_basic.c */
/* Writes content header and body frames for a message (deliver, get-ok, return). */
void channel__write_content(struct channel *ch, struct message *message);
void channel__handle_basic(struct channel *ch, const struct method *m);
void channel__handle_tx(struct channel *ch, const struct method *m);
void channel__release_consumers(struct channel *ch);
void channel__requeue_all(struct channel *ch);
void channel__drop_tx(struct channel *ch);

/* Ends a request at another broker (the channel is going away). */
void channel__forget_remote_op(struct channel *ch);
void channel__forget_attaching(struct channel *ch);
void channel__forget_held_get(struct channel *ch);
/* Waits for a stand-in's primary to answer m (queue.declare, purge or
 * delete), then answers the client as the primary would. */
void channel__remote_query(struct channel *ch, struct queue *queue, const struct method *m);
/* The last consumer here of an auto-delete stand-in went (basic.cancel, or
 * the client's channel.close: method_id): the primary deletes the queue if
 * it had no other consumer anywhere, and the client's next methods must
 * see that as on one broker. Holds the input until the primary has said
 * whether it did and, if so, until the map has forgotten the queue here;
 * then a channel.close is answered (channel__finish_close). */
void channel__await_auto_delete(struct channel *ch, struct queue *queue, uint32_t method_id);
/* During the client's channel.close: queue (an auto-delete stand-in) lost
 * its last consumer here; checked before close-ok (channel.c). */
void channel__check_auto_delete_on_close(struct channel *ch, struct queue *queue);
/* The client's channel.close goes on: the next auto-delete stand-in to
 * check is awaited, or, with none left, close-ok is sent and the channel
 * is gone. */
void channel__finish_close(struct channel *ch);

/* channel_wait.c */
struct cluster_ops_change;
bool channel__clustered(const struct channel *ch);
/* Submits change (cluster_ops.h) for the method and holds the connection's
 * input until it is applied here; then answers the method (queue.declare:
 * the queue change names; message_count: for queue.delete-ok) or fails it
 * with the map's reply. A queue.declare is placed (its primary and
 * backups), and placed again if the map finds the chosen broker down. */
void channel__cluster_submit(struct channel *ch, uint32_t method_id, bool no_wait,
                             const struct cluster_ops_change *change, uint32_t message_count);
/* The primary answered the channel's request: its input flows again. */
void channel__remote_op_done(struct channel *ch, const struct queue *queue);
/* A stand-in's primary refused the method: the same code and text (its
 * "NAME - " prefix is replaced by ours). */
void channel__fail_relayed(struct channel *ch, uint16_t code, uint32_t method_id,
                           struct bytes text);
/* 404: the stand-in's primary cannot be reached (down, or no link yet). */
void channel__fail_unreachable(struct channel *ch, const struct queue *queue, uint32_t method_id);
/* The channel is going away: drop its waiting change, if any. */
void channel__cluster_forget(struct channel *ch);
/* A peer's basic.quay-sync: hold the connection's input until our map has
 * applied through version (cluster_ops await_synced); answer: then tell
 * the peer (basic.quay-synced with our map's version). */
void channel__cluster_sync(struct channel *ch, uint64_t version, bool answer);

/* channel_declare.c */
void channel__remember_queue(struct channel *ch, struct bytes name);
/* An empty queue name means the last queue declared on the channel. Fails
 * the channel with 404 and returns false when there is none. */
bool channel__resolve_queue_name(struct channel *ch, struct bytes *name, uint32_t method_id);
/* Fails the channel with 405 if the queue is exclusive to another
 * connection; returns true if it did. */
bool channel__queue_locked(struct channel *ch, struct queue *queue, uint32_t method_id);
/* A queue whose log cannot be read yet (queue.h unreadable): fails the
 * channel with 404, as a queue whose primary is down, and returns true. */
bool channel__queue_unreadable(struct channel *ch, const struct queue *queue, uint32_t method_id);
void channel__handle_exchange(struct channel *ch, const struct method *m);
void channel__handle_queue(struct channel *ch, const struct method *m);

/* The broker's message counters (broker.h) when ch is a client's channel;
 * NULL on another broker's link, whose messages are counted where their
 * clients are. */
static inline struct broker_counters *channel__counters(const struct channel *ch)
{
    /* Inline: the message path asks for them three times a message (a call
     * each cost more than the counting, bench/RESULTS.md). */
    return ch->connection->cluster_peer ? NULL : &ch->connection->broker->counters;
}

/* Puts the channel on its broker's active list (rates.h). */
RATES_COLD void channel__rates_join(struct channel *ch);
/* Whoever bumps ch->stats calls this in the same call (rates.h). */
static inline void channel__rates_moved(struct channel *ch)
{
    if (RATES_UNLISTED(&ch->rates))
        channel__rates_join(ch);
}

#endif
