/*
 * map_int.h: what the cluster map's files share: map.c (the objects,
 * removal with its cascades, verification), map_apply.c (the command
 * interpreter, and the ops on brokers, vhosts, users, policies, limits),
 * map_apply_queues.c (the ops on exchanges, bindings and queues),
 * map_cmd.c (the command builders) and map_snapshot.c. Not for other
 * modules.
 */
#ifndef QUAY_CLUSTER_MAP_INT_H
#define QUAY_CLUSTER_MAP_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "amqp/table.h"
#include "cluster/map.h"
#include "lib/alloc.h"
#include "lib/assert.h"

/* ---- small helpers -------------------------------------------------------- */

/* Grows a pointer array to hold one more. */
static inline void ptr_array_reserve(void ***items, uint32_t count, uint32_t *cap)
{
    if (count < *cap)
        return;
    uint32_t new_cap = *cap ? *cap * 2 : 16;
    *items = xrealloc(*items, (size_t)new_cap * sizeof(void *));
    *cap = new_cap;
}

/* ---- the objects (map.c) -------------------------------------------------- */

/* The slot of broker_id among the queue's backups, or -1. */
int map__backup_slot(const struct map_queue *queue, uint32_t broker_id);
/* Adds (delta +1) or removes (-1) a queue's contribution to broker counts. */
void map__queue_count(struct cluster_map *map, const struct map_queue *q, int delta);
void map__exchange_count(struct cluster_map *map, const struct map_exchange *x, int delta);

/* What a removal took with it. */
struct removed {
    uint32_t bindings;
    uint32_t exchanges;
};

void map__binding_remove(struct cluster_map *map, struct map_binding *b);
/* RabbitMQ's auto-delete: an exchange that lost its last binding (as a
 * source) goes too. */
void map__exchange_maybe_auto_delete(struct cluster_map *map, struct map_exchange *x,
                                     struct removed *out);
/* A queue with its bindings and their cascade: returns the bindings
 * removed, adds the exchanges to *exchanges_removed. */
uint32_t map__queue_remove(struct cluster_map *map, struct map_queue *q,
                           uint32_t *exchanges_removed);
/* Its bindings out first (so that no cascade comes back to it), then
 * those into it with their cascade. Freed with the command (graveyard). */
void map__exchange_remove(struct cluster_map *map, struct map_exchange *x,
                          struct removed *out);
void map__free_removed_exchanges(struct cluster_map *map);
void map__user_lists_release(struct map_user *u);
void map__user_remove(struct cluster_map *map, struct map_user *u);
/* Removes the user's permission for vhosts[j], keeping the others' order. */
void map__user_permission_remove(struct map_user *u, uint32_t j);
/* Deletes a vhost and everything in it (counted in *c). */
void map__vhost_remove(struct cluster_map *map, struct map_vhost *v, struct map_change *c);

/* ---- reading command fields (map_apply.c) ----------------------------------- */

/* Typed, bounded reads of a validated table. The first failure is latched
 * in bad_key, so a handler reads every field and checks once. */
struct cmd_reader {
    struct table table;
    const char *bad_key;
};

void map__reader_fail(struct cmd_reader *r, const char *key);
/* A string of min..max bytes ('S' or 'x'). */
struct bytes map__read_str(struct cmd_reader *r, const char *key, uint32_t min, uint32_t max);
struct bytes map__read_name(struct cmd_reader *r, const char *key);
uint64_t map__read_uint(struct cmd_reader *r, const char *key, uint64_t max, bool optional,
                        uint64_t dflt);
uint32_t map__read_broker_id(struct cmd_reader *r, const char *key);
bool map__read_bool(struct cmd_reader *r, const char *key, bool optional);
struct table map__read_table(struct cmd_reader *r, const char *key);
/* An array of up to CLUSTER_BACKUPS_MAX non-zero broker ids. */
uint8_t map__read_ids(struct cmd_reader *r, const char *key, uint32_t *ids);
/* The same, optional, each 0..UINT32_MAX (a broker's incarnation, 0: not
 * known). */
uint8_t map__read_incarnations(struct cmd_reader *r, const char *key, uint32_t *out);
bool map__rebalance_parse(struct bytes name, enum map_rebalance *out);

/* A permission's three regexes, as commands and snapshots name them. */
extern const char *const map__permission_keys[3];

/* ---- apply context, refusals, dispatch (map_apply.c) ----------------------- */

struct apply_ctx {
    struct cluster_map *map;
    struct map_change *change;
    struct cmd_reader reader;
    bool restoring; /* reading a snapshot: no liveness checks, no redeclares */
};

int map__refuse(struct apply_ctx *ctx, uint16_t code, bool retry, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int map__malformed(struct apply_ctx *ctx);
/* A new cluster_map.objects_stamp. */
uint64_t cluster_map__next_stamp(void);
/* The broker exists, and (unless restoring) may take new work: not down. */
int map__check_broker_usable(struct apply_ctx *ctx, uint32_t id, const char *what,
                             struct bytes name);
struct map_vhost *map__need_vhost(struct apply_ctx *ctx, struct bytes name, int *rc);
/* Runs the handler of ctx->change->op on ctx->reader's table. */
int map__dispatch(struct apply_ctx *ctx);

/* ---- the ops on exchanges, bindings and queues (map_apply_queues.c) --------- */

struct map_exchange *map__exchange_insert(struct cluster_map *map, struct map_vhost *v,
                                          const struct map_exchange_decl *d);
int map__op_exchange_declare(struct apply_ctx *ctx);
int map__op_exchange_delete(struct apply_ctx *ctx);
int map__op_exchange_set_owner(struct apply_ctx *ctx);
int map__op_bind(struct apply_ctx *ctx, bool bind);
int map__op_queue_declare(struct apply_ctx *ctx);
int map__op_queue_delete(struct apply_ctx *ctx);
int map__op_queue_set_owner(struct apply_ctx *ctx);
int map__op_queue_set_backups(struct apply_ctx *ctx);
int map__op_queue_move(struct apply_ctx *ctx);
int map__op_queue_set_in_sync(struct apply_ctx *ctx);
int map__op_queue_set_available(struct apply_ctx *ctx);
int map__op_queue_take_over(struct apply_ctx *ctx);
int map__op_queue_adopted(struct apply_ctx *ctx);

/* ---- encoders a command and a snapshot share (map_cmd.c) --------------------- */

/* Each writes its object's fields into the table being written (a
 * command's, with "op", or a snapshot element's, without). */
struct join_args {
    uint32_t id;
    struct bytes name, amqp_address, cluster_address;
    bool voter;
    uint32_t incarnation;
    const struct map_broker *broker; /* snapshot: also the state */
};

struct exchange_args {
    bool with_op;
    const struct map_exchange_decl *decl;
};

struct binding_args {
    enum map_op op; /* MAP_OP_NONE: snapshot */
    const struct map_binding_decl *decl;
};

struct queue_args_enc {
    const struct map_queue_decl *decl;
    uint32_t origin_id;             /* command only */
    const struct map_queue *queue;  /* snapshot only */
};

struct policy_args {
    bool with_op;
    const struct policy_decl *decl;
};

struct limit_args {
    enum map_op op; /* MAP_OP_NONE in a snapshot */
    enum limit_scope scope;
    struct bytes name;
    enum limit_kind kind;
    int64_t value;
};

void map__encode_join(struct table_writer *w, const void *arg);        /* struct join_args */
void map__encode_exchange(struct table_writer *w, const void *arg);    /* struct exchange_args */
void map__encode_binding(struct table_writer *w, const void *arg);     /* struct binding_args */
void map__encode_queue(struct table_writer *w, const void *arg);       /* struct queue_args_enc */
void map__encode_policy(struct table_writer *w, const void *arg);      /* struct policy_args */
void map__encode_limit(struct table_writer *w, const void *arg);       /* struct limit_args */
/* One map user as a snapshot (or a bootstrap) writes it: an array element. */
void map__encode_map_user(struct table_writer *w, const struct map_user *u);

#endif
