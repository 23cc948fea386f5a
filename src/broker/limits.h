/*
 * limits.h: RabbitMQ's per-vhost and per-user limits, as a pure set.
 *
 * A vhost may have max-connections and max-queues, a user max-connections
 * and max-channels (rabbitmqctl set_vhost_limits / set_user_limits; the
 * management API's /api/vhost-limits and /api/user-limits). A value is a
 * count: negative means no limit (RabbitMQ keeps and shows it), 0 allows
 * none.
 *
 * Owns a limit set: its entries and their owned names, kept sorted by
 * (scope, name, kind), so that every broker holding the same commands
 * holds the same set in the same order. The broker holds one (outside a
 * cluster recorded in the journal, broker/durable.h; in a cluster a copy
 * of the map's, cluster/mirror_users.c), the cluster map one (cluster/map.h).
 * No I/O, no clock.
 */
#ifndef QUAY_BROKER_LIMITS_H
#define QUAY_BROKER_LIMITS_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"

#define LIMIT_NAME_SIZE_MAX 255 /* vhost and user names are shortstrs */
#define LIMIT_COUNT_MAX 65536   /* entries in one set */
/* A value beyond a count anyone could reach is refused (bad body). */
#define LIMIT_VALUE_MAX 2147483647

enum limit_scope {
    LIMIT_SCOPE_VHOST = 0,
    LIMIT_SCOPE_USER = 1,
};

enum limit_kind {
    LIMIT_MAX_CONNECTIONS = 0, /* vhost and user */
    LIMIT_MAX_QUEUES = 1,      /* vhost */
    LIMIT_MAX_CHANNELS = 2,    /* user */
};
#define LIMIT_KIND_COUNT 3

/* Owned by its set. */
struct limit {
    enum limit_scope scope;
    struct bytes name; /* owned: the vhost's or the user's */
    enum limit_kind kind;
    int64_t value;     /* negative: no limit */
};

struct limit_set {
    struct limit *items; /* owned, sorted by (scope, name, kind) */
    uint32_t count, cap;
};

void limit_set_init(struct limit_set *set);
void limit_set_free(struct limit_set *set);
/* Makes dst an equal copy of src (dst's entries are freed first). */
void limit_set_copy(struct limit_set *dst, const struct limit_set *src);
bool limit_set_equal(const struct limit_set *a, const struct limit_set *b);

/* "max-connections" ... for the scope; -1 if the scope has no such limit. */
int limit_kind_parse(enum limit_scope scope, struct bytes text);
const char *limit_kind_name(enum limit_kind kind);
const char *limit_scope_name(enum limit_scope scope); /* "vhost", "user" */
bool limit_kind_valid(enum limit_scope scope, enum limit_kind kind);

const struct limit *limit_set_find(const struct limit_set *set, enum limit_scope scope,
                                   struct bytes name, enum limit_kind kind);
/* The value, or -1 (no limit) when there is none. */
int64_t limit_set_value(const struct limit_set *set, enum limit_scope scope, struct bytes name,
                        enum limit_kind kind);
/* Adds or replaces; the caller checked the kind for the scope, the name's
 * size (1..255) and LIMIT_COUNT_MAX. Returns true if it was new. */
bool limit_set_put(struct limit_set *set, enum limit_scope scope, struct bytes name,
                   enum limit_kind kind, int64_t value);
/* Removes one; false if there was none. */
bool limit_set_delete(struct limit_set *set, enum limit_scope scope, struct bytes name,
                      enum limit_kind kind);
/* Removes every limit of a vhost or user (it was deleted); returns how many. */
uint32_t limit_set_delete_all(struct limit_set *set, enum limit_scope scope, struct bytes name);

/* Whether one more may be opened when `count` are: a negative limit
 * allows any, otherwise count must be below it. */
static inline bool limit_allows(int64_t limit, uint64_t count)
{
    return limit < 0 || count < (uint64_t)limit;
}

#endif
