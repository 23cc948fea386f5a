/*
 * api_definitions_users.h: the users, vhosts and permissions sections of
 * RabbitMQ's definitions (api_definitions.h), kept apart so that the
 * run-time users work can take them over.
 *
 * Today quay's users, their vhosts and permissions come from the users
 * file (broker/auth.h) and cannot change while the broker runs. So:
 *
 *   export  writes them as RabbitMQ does: users with their password hash
 *           (the same rabbit_password_hashing_sha256 format) and tags,
 *           the vhosts that exist, and each user's permissions per vhost
 *           it may open (".*" three times where the file gives none);
 *   import  accepts these sections only where they say what the broker
 *           already has: a user that exists with the same password hash
 *           and tags, a vhost that exists, a permission the broker
 *           already grants in the same words. Anything else is refused
 *           (400) naming the item and the reason; users, vhosts and
 *           permissions the file leaves out are kept. No change is made.
 */
#ifndef QUAY_MGMT_API_DEFINITIONS_USERS_H
#define QUAY_MGMT_API_DEFINITIONS_USERS_H

#include <stdbool.h>
#include <stddef.h>

struct broker;
struct json;
struct json_tree;
struct json_node;

/* "users", "vhosts" and "permissions" members of the export. */
void api_definitions_write_users(struct json *out, struct broker *broker);
/* Checks root's "users", "vhosts" and "permissions" (absent: fine). True,
 * or false with why in err. Applies nothing. */
bool api_definitions_check_users(struct broker *broker, const struct json_tree *tree,
                                 const struct json_node *root, char *err, size_t err_size);

#endif
