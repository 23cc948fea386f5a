/*
 * api_definitions_settings.h: the policies and limits of a definitions
 * import (api_definitions.h), and the undoing of a refused import's
 * settings (users, vhosts, permissions, policies, limits).
 *
 * A setting is one change the management API makes elsewhere: a policy
 * put or deleted as PUT/DELETE /api/policies does, a limit as
 * /api/vhost-limits and /api/user-limits do, a permission, user or vhost
 * as /api/permissions, /api/users and /api/vhosts do. A list of them is
 * applied in order: outside a cluster at once (journaled), in a cluster
 * one map command after another. Applying records, for each change, the
 * one that undoes it (what was there before), so that a refused import
 * can be taken back.
 */
#ifndef QUAY_MGMT_API_DEFINITIONS_SETTINGS_H
#define QUAY_MGMT_API_DEFINITIONS_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker/password.h"
#include "lib/types.h"
#include "mgmt/api_policies.h"

struct broker;
struct cluster_request;
struct definitions_users;
struct json_node;
struct json_tree;

enum setting_kind {
    SETTING_POLICY_PUT,
    SETTING_POLICY_DELETE,
    SETTING_LIMIT_PUT,
    SETTING_LIMIT_DELETE,
    SETTING_PERMISSION_PUT,
    SETTING_PERMISSION_DELETE,
    SETTING_USER_SET,
    SETTING_USER_DELETE,
    SETTING_VHOST_DELETE,
};

struct setting {
    enum setting_kind kind;
    struct api_policy policy;      /* POLICY_*: decl (vhost, name for a delete) */
    uint8_t scope, limit_kind;     /* LIMIT_* */
    int64_t value;
    char owner[256];               /* a limit's vhost or user; a permission's, a user's or
                                    * a vhost's name */
    char vhost[256];               /* a permission's vhost */
    char regexes[3][256];          /* PERMISSION_PUT */
    struct password_hash hash;     /* USER_SET */
    unsigned tags;
};

struct settings {
    struct setting *items;         /* owned */
    uint32_t count, cap;
};

void settings_free(struct settings *s);

/* Checks a definitions "policies" item (as PUT /api/policies checks its
 * body) or "parameters" item (vhost-limits, as /api/vhost-limits checks a
 * value), or a "users" item's "limits", into out: true, or false with why
 * in err. only: the path's vhost (POST /api/definitions/{vhost}), or
 * none; d: the import's users and vhosts (a vhost or user may be new). */
bool settings_check_policy(struct broker *broker, const struct json_tree *tree,
                           const struct json_node *item, struct bytes only,
                           const struct definitions_users *d, struct settings *out, char *err,
                           size_t err_size);
bool settings_check_parameter(struct broker *broker, const struct json_tree *tree,
                              const struct json_node *item, struct bytes only,
                              const struct definitions_users *d, struct settings *out,
                              char *err, size_t err_size);
bool settings_check_user_limits(struct broker *broker, const struct json_tree *tree,
                                const struct json_node *item, struct settings *out, char *err,
                                size_t err_size);
/* Whether the broker has room for the policies and limits of s. */
bool settings_room(struct broker *broker, const struct settings *s, char *err, size_t err_size);

/* Appends to undo what takes d (checked, not applied yet) back: its new
 * vhosts deleted, its users deleted or restored, its permissions removed
 * or restored (applied in reverse order). */
void settings_undo_users(struct broker *broker, const struct definitions_users *d,
                         struct settings *undo);

/* How applying ended: status 204, or 400/503 with why; done is the index
 * of the first change not made. */
typedef void (*settings_done_fn)(void *ctx, int status, const char *reason, uint32_t done);
struct settings_apply {
    struct broker *broker;
    const struct settings *list;
    bool reverse;                  /* from the last to the first */
    bool best_effort;              /* go on past a refused change (undoing) */
    struct settings *undo;         /* NULL, or where each change's undo is appended */
    settings_done_fn done;
    void *ctx;
    uint32_t next;
    struct cluster_request *request; /* the map's, while submitted */
};
/* Applies a->list: a->done runs once (at once outside a cluster). */
void settings_apply(struct settings_apply *a);

#endif
