/*
 * api_definitions_users.h: the users, vhosts and permissions sections of
 * RabbitMQ's definitions (api_definitions.h), kept apart so that the
 * run-time users work can take them over.
 *
 * export  writes them as RabbitMQ does: users with their password hash
 *         and its hashing_algorithm (each user's own) and tags, the
 *         vhosts, and each user's permissions per vhost it may open.
 * import  creates or changes them as RabbitMQ 3.10's import does: a user
 *         takes the file's password_hash (with hashing_algorithm:
 *         rabbit_password_hashing_sha256, _sha512, _md5, or quay's PBKDF2;
 *         absent, told from the hash; or a clear "password") and tags,
 *         and keeps its permissions the file does not name; a vhost is
 *         created if new; a permission is set. Users, vhosts and
 *         permissions the file leaves out are kept. Everything is checked
 *         before anything changes: a bad item refuses the whole import
 *         (400) naming its place ("users[2]: ...").
 *
 * Outside a cluster the changes are made at once (broker/users.h,
 * journaled); in a cluster they are one map command (users.import,
 * cluster/map.h), so every broker applies all of them or none.
 */
#ifndef QUAY_MGMT_API_DEFINITIONS_USERS_H
#define QUAY_MGMT_API_DEFINITIONS_USERS_H

#include <stdbool.h>
#include <stddef.h>

struct broker;
struct json;
struct json_tree;
struct json_node;

#include "broker/auth.h"
#include "lib/types.h"

struct cluster_request;

/* "users", "vhosts" and "permissions" members of the export. */
void api_definitions_write_users(struct json *out, struct broker *broker);

/* The checked sections; strings borrow from the import's tree. */
struct definitions_user {
    const char *name;
    struct password_hash hash;
    unsigned tags;
};
struct definitions_permission {
    const char *user, *vhost;
    const char *texts[AUTH_PERMISSION_KIND_COUNT];
};
struct definitions_users {
    struct definitions_user *users;            /* owned arrays */
    const char **vhosts;
    struct definitions_permission *permissions;
    uint32_t users_count, vhosts_count, permissions_count;
};

/* Checks root's "users", "vhosts" and "permissions" (absent: fine) into
 * out (api_definitions_users_free it in any case). True, or false with
 * why in err. Applies nothing. */
bool api_definitions_check_users(struct broker *broker, const struct json_tree *tree,
                                 const struct json_node *root, struct definitions_users *out,
                                 char *err, size_t err_size);
void api_definitions_users_free(struct definitions_users *d);
/* Whether the sections create vhost, or grant user a permission there. */
bool api_definitions_users_has_vhost(const struct definitions_users *d, struct bytes vhost);
bool api_definitions_users_grants(const struct definitions_users *d, const char *user,
                                  struct bytes vhost);

/* How applying ended: status 204 (done), or 400/413/503 with why. */
typedef void (*definitions_users_done_fn)(void *ctx, int status, const char *reason);
/* The caller's, until done ran or it is cancelled. */
struct definitions_users_apply {
    definitions_users_done_fn done;
    void *ctx;
    struct cluster_request *request; /* the map's, while submitted */
};
/* Applies d (checked): done runs at once outside a cluster, once the map
 * command was applied here in one (the broker's tables then have it). */
void api_definitions_apply_users(struct broker *broker, const struct definitions_users *d,
                                 struct definitions_users_apply *a);

#endif
