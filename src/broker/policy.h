/*
 * policy.h: replication policies, RabbitMQ-style: per vhost, a named regular
 * expression over queue names that sets how many backups a matching queue
 * gets (0..3), with a priority to choose among overlapping ones.
 *
 * Owns a policy set: the policies, their owned strings and compiled
 * patterns, kept sorted by (vhost, name). The cluster map holds one (every
 * broker the same, cluster/map.h); this module is pure: no I/O, no clock,
 * and nothing that depends on the order policies were put, so that every
 * broker answers "which policy applies to this queue" identically.
 *
 * Patterns are POSIX extended regular expressions (regcomp REG_EXTENDED,
 * REG_NOSUB), searched anywhere in the name as RabbitMQ does: anchor with
 * ^ and $ to match whole names.
 *
 * Precedence for a queue's backups: its own x-quay-backups argument, else
 * the matching policy with the highest priority (ties: the lowest name in
 * byte order), else the broker's --default-backups.
 *
 * A policy may also say what the backups get (RabbitMQ's definition key
 * "quay-replicate": "all" or "transient"; unset, most policies): the same
 * precedence, the queue's x-quay-replicate argument first (as RabbitMQ's
 * queue arguments win over a policy's for most keys), else the applying
 * policy's key, else "all". Only the applying policy counts: one of lower
 * priority that says "transient" does not (RabbitMQ applies one policy).
 */
#ifndef QUAY_BROKER_POLICY_H
#define QUAY_BROKER_POLICY_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"

#define POLICY_NAME_SIZE_MAX 255    /* names and patterns are shortstrs */
#define POLICY_COUNT_MAX 4096       /* in one set, every vhost together */
#define POLICY_PRIORITY_MAX 1000000 /* priorities are 0..this */
#define POLICY_BACKUPS_MAX 3        /* as x-quay-backups */
#define POLICY_ERROR_SIZE 160

/* A policy's "quay-replicate" (stored as the number). */
enum policy_replicate {
    POLICY_REPLICATE_UNSET = 0, /* the policy does not say: "all" */
    POLICY_REPLICATE_ALL,
    POLICY_REPLICATE_TRANSIENT,
};

/* Owned by its set. */
struct policy {
    struct bytes vhost;
    struct bytes name;
    struct bytes pattern;
    uint32_t priority;
    uint8_t backups;
    uint8_t replicate; /* enum policy_replicate */
    regex_t regex; /* compiled pattern */
};

struct policy_set {
    struct policy **items; /* owned, sorted by (vhost, name) */
    uint32_t count, cap;
};

/* What a put would store, before it is checked. Borrowed strings. */
struct policy_decl {
    struct bytes vhost;
    struct bytes name;
    struct bytes pattern;
    uint32_t priority;
    uint8_t backups;
    uint8_t replicate; /* enum policy_replicate (last: {..., backups} means unset) */
};

void policy_set_init(struct policy_set *set);
void policy_set_free(struct policy_set *set);

/* Checks a pattern: OK, or E_SYNTAX with regcomp's complaint in err
 * (NUL-terminated, at most err_size bytes). */
int policy_pattern_check(struct bytes pattern, char *err, size_t err_size);

/* Checks everything but the vhost's existence (the caller's business):
 * names 1..255 bytes, priority and backups in range, the pattern
 * compiles. OK, or E_SYNTAX with why in err. */
int policy_decl_check(const struct policy_decl *decl, char *err, size_t err_size);

struct policy *policy_set_find(const struct policy_set *set, struct bytes vhost,
                               struct bytes name);
/* True if a put of decl would change nothing (the same policy is there). */
bool policy_set_same(const struct policy_set *set, const struct policy_decl *decl);
/* Adds or replaces. decl must have passed policy_decl_check; the caller
 * checks POLICY_COUNT_MAX before adding a new one. */
void policy_set_put(struct policy_set *set, const struct policy_decl *decl);
/* Removes one; false if there was none. */
bool policy_set_delete(struct policy_set *set, struct bytes vhost, struct bytes name);
/* Removes every policy of a vhost; returns how many. */
uint32_t policy_set_delete_vhost(struct policy_set *set, struct bytes vhost);

/* The policy that applies to queue `name` in `vhost`, or NULL. */
const struct policy *policy_set_match(const struct policy_set *set, struct bytes vhost,
                                      struct bytes name);

/* A queue's backups under the precedence above. own: its x-quay-backups,
 * or -1 if it has none. */
uint8_t policy_effective_backups(int32_t own, const struct policy *best,
                                 uint8_t default_backups);

/* A queue's x-quay-backups from its encoded arguments, -1 if absent (or
 * not a number in 0..3, which a declare would have refused). */
int32_t policy_queue_own_backups(const uint8_t *arguments, uint32_t size);

/* "all" / "transient" as enum policy_replicate; -1 for anything else. */
int policy_replicate_parse(struct bytes value);
/* The key's value as a policy says it ("all" for unset). */
const char *policy_replicate_name(uint8_t replicate);

/* Whether queue `name` in `vhost`, with its encoded arguments, replicates
 * its transient messages only (x-quay-replicate, else the applying
 * policy's quay-replicate, else no; see above): with shared storage, a
 * durable queue's backups get its transient messages only, and the
 * persistent ones are recovered from the primary's log if it dies
 * (docs/ARCHITECTURE.md section 11). "all" (the default): everything. */
bool policy_replicates_transient_only(const struct policy_set *set, struct bytes vhost,
                                      struct bytes name, const uint8_t *arguments,
                                      uint32_t size);

#endif
