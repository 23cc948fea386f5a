/*
 * users.h: users, vhosts and permissions changed while the broker runs,
 * applied to this broker: the table (broker/auth.h), its vhosts, its
 * connections, and outside a cluster the journal (broker/durable.h).
 *
 * Who calls: the management API outside a cluster (mgmt/api_users.c), the
 * cluster map's mirror in a cluster (cluster/mirror.c), which applies what
 * the map committed, so every broker does the same. In a cluster nothing
 * here writes users to the journal: the map's log is their record.
 *
 * The users file is a bootstrap (users_bootstrap): outside a cluster, the
 * first start with an empty journal takes the file's users (or the default
 * guest) and records them; from then on the journal's users win and the
 * file is not read for users again. In a cluster the map's users win as
 * soon as it has any (cluster/mirror.c); until then, the file's.
 *
 * Deleting a user closes its connections (320 CONNECTION_FORCED "user 'x'
 * is deleted", RabbitMQ's words); deleting a vhost closes its connections
 * ("vhost 'x' is deleted") and deletes its queues, exchanges, bindings,
 * policies, permissions and limits (a deleted user's limits go too). A
 * permission change holds from the next
 * operation of an open channel: every operation is checked against the
 * user's permissions as they are then. RabbitMQ 3.10 is laxer: a channel
 * caches up to 12 checks that passed, and keeps them after a revocation
 * (measured on 3.10.8: a publish and a declare it had made before were
 * still allowed; a new channel was refused). quay does not, on purpose: a
 * revocation that open channels ignore is no revocation.
 */
#ifndef QUAY_BROKER_USERS_H
#define QUAY_BROKER_USERS_H

#include <stdbool.h>

#include "lib/types.h"
#include "broker/auth.h"

struct broker;

/* At start, after the journal was replayed: boot holds the users file's
 * (or the default) users, and is consumed. */
void users_bootstrap(struct broker *broker, struct auth *boot);

/* Adds or changes a user (its permissions stay). Returns it. */
struct auth_user *users_put(struct broker *broker, struct bytes name,
                            const struct password_hash *hash, unsigned tags, bool *created);
/* Deletes a user and closes its connections; false if there is none. */
bool users_delete(struct broker *broker, struct bytes name);
/* Sets a permission. Returns 1 created, 0 replaced, -1 bad regex (why in
 * err), -2 no such user or vhost. */
int users_permission_put(struct broker *broker, struct bytes user, struct bytes vhost,
                         const char *const texts[AUTH_PERMISSION_KIND_COUNT], char *err,
                         size_t err_size);
/* Removes one; false if there was none. */
bool users_permission_delete(struct broker *broker, struct bytes user, struct bytes vhost);
/* Creates a vhost; false if it existed. */
bool users_vhost_put(struct broker *broker, struct bytes name);
/* Deletes a vhost with everything in it and closes its connections;
 * false if there is none. */
bool users_vhost_delete(struct broker *broker, struct bytes name);

#endif
