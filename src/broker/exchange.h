/*
 * exchange.h: exchanges, their bindings and routing.
 *
 * An exchange owns its bindings. A binding links a source exchange to a
 * destination, which is either a queue or another exchange (RabbitMQ's
 * exchange-to-exchange bindings); both embed a struct bind_dest so the
 * exchange layer never needs to know what a queue is. Every binding is
 * also linked into its destination's list so that deleting a queue or an
 * exchange removes all bindings pointing at it in O(its bindings).
 *
 * Routing is a pure function of (exchange, routing key, headers): it walks
 * exchange-to-exchange bindings (each exchange visited once, so cycles are
 * harmless) and collects each destination queue at most once.
 *
 * Memory: struct exchange is owned by its vhost (created with
 * exchange_new, freed with exchange_free, which unbinds everything first).
 * struct binding is owned by its source exchange. Keys and arguments are
 * copied in; nothing here borrows from a frame after the call returns.
 */
#ifndef QUAY_BROKER_EXCHANGE_H
#define QUAY_BROKER_EXCHANGE_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"
#include "lib/hash.h"
#include "lib/list.h"

enum exchange_type {
    EXCHANGE_DIRECT,
    EXCHANGE_FANOUT,
    EXCHANGE_TOPIC,
    EXCHANGE_HEADERS,
};

/* "direct" -> EXCHANGE_DIRECT ...; returns -1 for an unknown type name. */
int exchange_type_parse(struct bytes name, enum exchange_type *out);
const char *exchange_type_name(enum exchange_type type);

enum bind_dest_kind { BIND_DEST_QUEUE, BIND_DEST_EXCHANGE };

/* Embedded in struct queue and struct exchange. */
struct bind_dest {
    enum bind_dest_kind kind;
    struct list_node bindings_in; /* struct binding.dest_link: bindings pointing here */
    uint32_t bindings_in_count;
    uint32_t route_mark;          /* routing scratch: last route pass that saw it */
};

struct binding {
    struct exchange *source;      /* borrowed: the owner */
    struct bind_dest *dest;       /* borrowed */
    struct list_node source_link; /* in the source exchange's list of all bindings */
    struct list_node dest_link;   /* in dest->bindings_in */
    struct bytes routing_key;     /* owned copy (ptr points into this allocation) */
    struct bytes arguments;       /* owned copy of the encoded field table */
    /* private to exchange.c: per-type index links, parsed topic words, ... */
    void *index;
};

struct exchange {
    struct bind_dest as_dest;     /* for exchange-to-exchange bindings */
    struct bytes name;            /* owned copy */
    enum exchange_type type;
    bool durable;
    bool auto_delete;
    bool internal;
    struct bytes arguments;       /* owned copy of the declare arguments table */
    struct list_node bindings;    /* struct binding.source_link, all of them */
    uint32_t bindings_count;
    void *index;                  /* private per-type routing index */
    void *user;                   /* borrowed back-pointer for the owner (vhost) */
};

struct exchange *exchange_new(struct bytes name, enum exchange_type type, bool durable,
                              bool auto_delete, bool internal, struct bytes arguments);
/* Removes every binding from and to this exchange, then frees it. */
void exchange_free(struct exchange *exchange);
/* Removes every binding from this exchange (it is their source). */
void exchange_unbind_all(struct exchange *exchange);

void bind_dest_init(struct bind_dest *dest, enum bind_dest_kind kind);
/* Removes every binding that points at dest (call before freeing a queue).
 * Source exchanges that become unused are reported through the callback so
 * the owner can auto-delete them; the callback may be NULL. */
typedef void (*exchange_unused_fn)(struct exchange *exchange, void *ctx);
void bind_dest_unbind_all(struct bind_dest *dest, exchange_unused_fn on_unused, void *ctx);

/* Adds a binding; returns it, or the existing identical one (same dest,
 * routing key and arguments: RabbitMQ treats a re-bind as a no-op). */
struct binding *exchange_bind(struct exchange *source, struct bind_dest *dest,
                              struct bytes routing_key, struct bytes arguments);
/* Removes the identical binding; returns false if there was none. */
bool exchange_unbind(struct exchange *source, struct bind_dest *dest,
                     struct bytes routing_key, struct bytes arguments);
bool exchange_has_bindings(const struct exchange *exchange);
/* The binding identical to this one (as exchange_unbind matches), or NULL. */
struct binding *exchange_find_binding(struct exchange *source, struct bind_dest *dest,
                                      struct bytes routing_key, struct bytes arguments);

/* The queues one publish reaches. Destinations are appended to out (at most
 * out_cap; routing stops collecting past that and sets overflow). */
struct route_result {
    struct bind_dest **dests; /* borrowed array supplied by the caller */
    uint32_t count;
    uint32_t cap;
    bool overflow;
};

/* headers: the message's headers table (may be empty) for headers exchanges.
 * Only BIND_DEST_QUEUE destinations are put in the result; exchange
 * destinations are followed. */
void exchange_route(struct exchange *exchange, struct bytes routing_key, struct table headers,
                    struct route_result *result);

/* Pure matchers, exposed for unit tests. */
bool topic_match(struct bytes pattern, struct bytes routing_key);
bool headers_match(struct table binding_args, struct table message_headers);

/* Module-private helpers, for unit tests only. The size of the routing
 * index: direct buckets, topic trie nodes (0 once every binding is gone),
 * or the bindings count for fanout and headers. */
uint32_t exchange__index_count(const struct exchange *exchange);
/* Sets the last route pass number handed out, to test its wrap-around. */
void exchange__route_pass_set(uint32_t pass);

#endif
