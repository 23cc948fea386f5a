/*
 * channel.h: one AMQP channel: publishing, consuming, acks, confirms, tx.
 *
 * A channel assembles published content (method, header, body frames)
 * into a message, routes it and confirms it; it owns its consumers and
 * the record of every message delivered and not yet settled (its
 * "unacked" deliveries, indexed by delivery tag). Closing a channel, for
 * any reason, requeues those messages with redelivered=true.
 *
 * Memory: owned by its connection's channel table; channel_destroy frees
 * it (and tells the connection). Deliveries hold a message reference and
 * a queue reference each.
 */
#ifndef QUAY_BROKER_CHANNEL_H
#define QUAY_BROKER_CHANNEL_H

#include <stdbool.h>
#include <stdint.h>

#include "amqp/frame.h"

struct channel;
struct connection;

/* A frame for a channel id that has no open channel. */
void channel_handle_unopened(struct connection *connection, const struct frame *frame);
void channel_handle_frame(struct channel *ch, const struct frame *frame);

/* A body frame taken in parts (connection_body.c) instead of whole:
 * true if ch is assembling a message that a body frame of size payload
 * bytes continues, i.e. channel_handle_frame would take it. */
bool channel_body_accepts(const struct channel *ch, uint32_t size);
/* Appends size payload bytes (more: body bytes known to follow). False if
 * that failed (no memory): the channel is closed. */
bool channel_body_append(struct channel *ch, const uint8_t *data, size_t size, uint64_t more);
/* Room for up to want more body bytes to be written straight into: where
 * they go, *room (1..want) of them, and *after: the bytes of the
 * message's memory after those (a read may fill them too: conn_sink's
 * tail); NULL if the channel failed (no memory: closed). The message may
 * move: the pointer is valid until the next call of these. */
uint8_t *channel_body_room(struct channel *ch, uint64_t want, size_t *room, size_t *after);
/* Body bytes still to come for the message being assembled (0: none). */
uint64_t channel_body_missing(const struct channel *ch);
/* The message being assembled, or NULL. */
const struct message *channel_assembling(const struct channel *ch);
/* size bytes were written at the room. */
void channel_body_written(struct channel *ch, size_t size);
/* The frame ended well (its end octet came): a complete message is
 * routed. */
void channel_body_frame_done(struct channel *ch);
/* Frees the channel without any protocol exchange (connection gone). */
void channel_destroy(struct channel *ch);
/* The client's connection.close: the channel goes as on its own
 * channel.close, without a close-ok. True: it waits for a primary (the
 * last consumer of an auto-delete stand-in went), and calls
 * connection_channel_closed once gone; false: it is gone. */
bool channel_close_with_connection(struct channel *ch);
/* The connection's output drained: consumers may take messages again. */
void channel_resume_delivery(struct channel *ch);
/* A publish forwarded to another broker's queue (cluster/proxy.c) reports
 * back through its channel's sink: the primary confirmed (ack) or refused
 * or lost (nack) publish number seq. */
struct confirm_sink;
void confirm_sink_ref(struct confirm_sink *sink);
void confirm_sink_unref(struct confirm_sink *sink);
void confirm_sink_answer(struct confirm_sink *sink, uint64_t seq, bool ack);
/* Publish seq's forward became `more` forwards more (a forward naming
 * several queues was split up for a resend): as many more answers come. */
void confirm_sink_expect(struct confirm_sink *sink, uint64_t seq, uint32_t more);
/* A parked or held publish (a peer's forward, a client's publish held by
 * a stand-in or a paused queue) was routed at last: its answer is what
 * routing it gathered (the fsync ticket, the backups' answers owed).
 * seq 0: a transaction's publish, which its commit-ok waits for. */
struct publish_wait;
void confirm_sink_routed(struct confirm_sink *sink, uint64_t seq, const struct publish_wait *routed,
                         bool rejected);

/* How many more unacked messages a consumer may have (its prefetch, or
 * the channel's if smaller); 0: no limit. */
struct consumer;
uint32_t channel_consumer_credit(const struct consumer *consumer);

/* Every message of queue delivered to a client (or a peer's upstream
 * consumer) on this broker and not yet settled: fn(ctx, seq, message). */
struct broker;
struct queue;
struct message;
struct connection;
struct rates_clock;
struct rates_active;
/* A client channel's message_stats (RabbitMQ's, on /api/channels): plain
 * counters bumped on the message path; the broker's tick samples them
 * (channels_sample_rates, rates.h). */
enum channel_rate {
    CHANNEL_RATE_PUBLISH,     /* publishes whose content arrived */
    CHANNEL_RATE_CONFIRM,     /* of them, acked to the publisher */
    CHANNEL_RATE_DELIVER_GET, /* basic.deliver and basic.get-ok, either ack mode */
    CHANNEL_RATE_REDELIVER,   /* of them, flagged redelivered */
    CHANNEL_RATE_ACK,         /* deliveries the client acked */
    CHANNEL_RATE_COUNT
};
struct channel_stats {
    uint64_t counts[CHANNEL_RATE_COUNT];
};
/* What the management API shows of a channel (mgmt/api_connections.c). */
struct channel_info {
    const struct connection *connection; /* borrowed */
    uint16_t number;
    bool confirm;
    bool transactional;
    uint32_t prefetch_count;             /* basic.qos global=false, for new consumers */
    uint32_t global_prefetch_count;
    uint32_t unacked_count;
    uint32_t consumers_count;
    struct channel_stats stats;
    double rates[CHANNEL_RATE_COUNT];    /* per second (rates.h) */
};
/* The open channels of connection, at most cap into out; returns how
 * many were written. */
uint32_t channels_info(const struct connection *connection, struct channel_info *out,
                       uint32_t cap);
/* The channel a consumer belongs to: false for a consumer that is not a
 * client channel's. */
bool channel_consumer_info(const struct consumer *consumer, struct channel_info *out);
/* Whether the consumer is another broker's: a channel of its link, which
 * consumes for a client of that broker (cluster/proxy.h). */
bool channel_consumer_of_peer(const struct consumer *consumer);
/* The tick's sample of the stats of the channels on the broker's active
 * list (rates.h); the ones that stood still for a window leave it. */
void channels_sample_rates(struct rates_active *active, const struct rates_clock *clock);
/* Asserts that each of the connection's channels off the active list holds
 * its newest sample's values (sanitized test builds: broker.c). */
void channels_check_idle(const struct connection *connection);
/* The consumers of the connection's channels (GET /metrics: O(channels)). */
uint32_t channels_consumers_count(const struct connection *connection);
/* Whether one of the connection's channels consumes from queue
 * (O(the queue's consumers)). */
bool channels_consume_from(const struct connection *connection, const struct queue *queue);
void channels_each_unacked(struct broker *broker, const struct queue *queue,
                           void (*fn)(void *ctx, uint64_t seq, struct message *message),
                           void *ctx);

/* A planned handover (cluster/handover.c) keeps the old primary's
 * deliveries delivered. On the new primary: the open channel of that
 * connection (NULL: gone); entry (taken from the queue,
 * counted unacked there) becomes a delivery on ch, the old primary's
 * channel for them, at its next tag, and nothing is sent: the old primary
 * settles it by that tag. NULL: the message was settled meanwhile; the tag
 * is skipped all the same (the old primary counts tags as it listed the
 * messages). */
struct queue_entry;
struct channel *channel_find(struct broker *broker, uint64_t connection_id, uint16_t channel_id);
void channel_adopt_delivery(struct channel *ch, struct queue *queue,
                            const struct queue_entry *entry);
/* On the old primary: every unsettled delivery of `from` for which
 * new_seq(ctx, seq) is not 0 now belongs to `to` under that seq (a
 * stand-in's: settling it settles it at the new primary). Returns how
 * many moved. */
uint32_t channels_move_unacked(struct broker *broker, struct queue *from, struct queue *to,
                               uint64_t (*new_seq)(void *ctx, uint64_t seq), void *ctx);

/* The end of a loop iteration (broker->confirms_hook): every channel that
 * owes its publisher confirms sends them, one multiple ack through the
 * last publish that waits for nothing more. */
struct net_flush_hook;
void channels_flush_confirms(struct net_flush_hook *hook);

#endif
