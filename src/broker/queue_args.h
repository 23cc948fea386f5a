/*
 * queue_args.h: the x- arguments of queue.declare, basic.consume and
 * exchange.declare, validated and compared exactly as RabbitMQ 3.10 does.
 *
 * Owns RabbitMQ's argument rules (which keys are checked, in which order,
 * their types and ranges), its redeclare equivalence rules and the wording
 * of every 406 text, including how Erlang prints a field value in them.
 * The observed behaviour is recorded in tests/integration/RABBITMQ-ARGS.md.
 * Pure: never allocates, never does I/O, never keeps a pointer.
 *
 * Texts are written WITHOUT the "PRECONDITION_FAILED - " prefix and are
 * NUL-terminated (truncated to text_size). RabbitMQ caps the complete reply
 * text ("NAME - text") at 255 bytes by keeping 252 bytes and adding "...";
 * the caller applies that cap.
 *
 * Where RabbitMQ 3.10 crashes (an invalid x-queue-master-locator, an
 * x-credit consumer argument that is not a table, a redeclare whose failing
 * comparison involves a decimal value), it answers connection.close(541,
 * "INTERNAL_ERROR", 0, 0). The functions then set *reply_code to
 * REPLY_INTERNAL_ERROR and leave text empty: the caller closes the
 * connection with the bare text "INTERNAL_ERROR" and class/method 0.
 */
#ifndef QUAY_BROKER_QUEUE_ARGS_H
#define QUAY_BROKER_QUEUE_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "amqp/table.h"
#include "lib/types.h"

/* RabbitMQ's ceiling for x-message-ttl and x-expires: ten years in ms. */
#define QUEUE_ARGS_EXPIRY_MAX_MS INT64_C(315360000000)
/* Highest x-max-priority RabbitMQ accepts. */
#define QUEUE_ARGS_PRIORITY_MAX 255
/* Highest x-quay-backups (quay's own argument). */
#define QUEUE_ARGS_BACKUPS_MAX 3

enum queue_overflow {
    QUEUE_OVERFLOW_DROP_HEAD,
    QUEUE_OVERFLOW_REJECT_PUBLISH,
    QUEUE_OVERFLOW_REJECT_PUBLISH_DLX,
};

/* x-queue-type. quay implements classic queues; the other two are parsed so
 * that the broker can decide (RabbitMQ also requires quorum and stream
 * queues to be durable, non-exclusive and not auto-delete, which needs the
 * declare flags and is not checked here). */
enum queue_type {
    QUEUE_TYPE_CLASSIC,
    QUEUE_TYPE_QUORUM,
    QUEUE_TYPE_STREAM,
};

/* Parsed x- arguments of queue.declare. Owned by the caller; the byte slices
 * borrow from the table that was parsed. */
struct queue_args {
    int64_t message_ttl_ms;       /* x-message-ttl, -1 = none (0 is valid) */
    int64_t expires_ms;           /* x-expires, -1 = none (0 is refused) */
    int64_t max_length;           /* x-max-length, -1 = none */
    int64_t max_length_bytes;     /* x-max-length-bytes, -1 = none */
    enum queue_overflow overflow; /* x-overflow, default drop-head */
    bool has_dead_letter_exchange;
    struct bytes dead_letter_exchange; /* x-dead-letter-exchange, borrowed */
    bool has_dead_letter_routing_key;
    struct bytes dead_letter_routing_key; /* x-dead-letter-routing-key, borrowed */
    uint8_t max_priority;                 /* x-max-priority, 0 = not a priority queue */
    bool single_active_consumer;          /* x-single-active-consumer */
    bool lazy;                            /* x-queue-mode "lazy" ("default" is the other) */
    enum queue_type type;                 /* x-queue-type, default classic */
    int32_t quay_backups;                 /* x-quay-backups 0..3, -1 = not given (quay's own) */
    int64_t quay_dedup_window_ms;         /* x-quay-dedup-window, -1 = none (quay's own;
                                           * 0 is accepted and also means none) */
    bool quay_replicate_transient;        /* x-quay-replicate "transient" ("all" is the
                                           * other; quay's own: see policy.h) */
};

/* Validates and parses queue.declare arguments as RabbitMQ 3.10 does for a
 * queue that does not exist yet (a redeclare is only compared, with
 * queue_args_equivalent, and a passive declare ignores its arguments).
 * Unknown keys are ignored; a repeated key counts at its first occurrence.
 * On error returns false with *reply_code (406, or 541 as described above)
 * and text, e.g. "invalid arg 'x-message-ttl' for queue 'q' in vhost '/':
 * {value_negative,-1}". */
bool queue_args_parse(struct table args, struct bytes queue_name, struct bytes vhost,
                      struct queue_args *out, uint16_t *reply_code, char *text,
                      size_t text_size);

/* Redeclare check: compares the arguments RabbitMQ compares for the
 * existing queue's type (a fixed list, in a fixed order, plus quay's own
 * two) and ignores every other key. Returns true if equivalent; otherwise
 * *reply_code is 406 (or 541) and text is e.g. "inequivalent arg
 * 'x-message-ttl' for queue 'q' in vhost '/': received '2000' but current
 * is '1000'". `current` is the table the queue was declared with. */
bool queue_args_equivalent(struct table current, struct table received,
                           struct bytes queue_name, struct bytes vhost, uint16_t *reply_code,
                           char *text, size_t text_size);

/* basic.consume arguments on a classic queue: x-priority (any integer
 * type, any value), x-cancel-on-ha-failover (bool), x-credit (table),
 * x-stream-offset refused. The texts name the queue. */
bool consumer_args_parse(struct table args, struct bytes queue_name, struct bytes vhost,
                         int64_t *priority_out, uint16_t *reply_code, char *text,
                         size_t text_size);

/* exchange.declare arguments: alternate-exchange must be a longstr;
 * *alternate borrows from args. Other keys are ignored. */
bool exchange_args_parse(struct table args, struct bytes exchange_name, struct bytes vhost,
                         bool *has_alternate, struct bytes *alternate, uint16_t *reply_code,
                         char *text, size_t text_size);

/* What a redeclare is compared on, for queues and exchanges. */
struct queue_decl {
    bool durable;
    bool auto_delete;
    struct table arguments;
};

struct exchange_decl {
    struct bytes type;
    bool durable;
    bool auto_delete;
    bool internal;
    struct table arguments;
};

/* The whole equivalence check of a redeclare, as RabbitMQ makes it: first
 * the flags (one "inequivalent arg 'durable' ... received 'true' but
 * current is 'false'" at a time; for exchanges the type first), then the
 * compared arguments. Shared by the broker (a local redeclare) and the
 * cluster map (a redeclare decided at apply time). Exclusivity is not
 * here: it is a lock (405), judged by whoever knows the owners. */
bool queue_redeclare_equivalent(const struct queue_decl *current,
                                const struct queue_decl *received, struct bytes queue_name,
                                struct bytes vhost, uint16_t *reply_code, char *text,
                                size_t text_size);
bool exchange_redeclare_equivalent(const struct exchange_decl *current,
                                   const struct exchange_decl *received,
                                   struct bytes exchange_name, struct bytes vhost,
                                   uint16_t *reply_code, char *text, size_t text_size);

/* Exchange redeclare: RabbitMQ compares only alternate-exchange, with the
 * same rules and wording as queues ("... for exchange 'x' in vhost '/'"). */
bool exchange_args_equivalent(struct table current, struct table received,
                              struct bytes exchange_name, struct bytes vhost,
                              uint16_t *reply_code, char *text, size_t text_size);

/* RabbitMQ's name for a type letter: 'I' -> "signedint", 'S' -> "longstr",
 * 'x' -> "binary", ... ("unknown" for a letter table.h does not know). */
const char *field_kind_name(uint8_t kind);

/* Renders v as RabbitMQ prints a value in these texts: longstr/binary as
 * their raw bytes, everything else as Erlang's ~p prints the decoded term
 * (1000, 1.0e3, true, undefined, {2,12345}, [{<<"a">>,longstr,<<"b">>}]).
 * Writes at most size-1 bytes plus a NUL (size > 0); returns the bytes
 * written. Erlang's line wrapping of terms wider than 80 columns is not
 * reproduced. */
size_t field_value_format(const struct field_value *v, char *out, size_t size);

#endif
