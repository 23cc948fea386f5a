/*
 * users.c: see users.h.
 */
#include "broker/users.h"

#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/connection.h"
#include "broker/durable.h"
#include "broker/policy.h"
#include "broker/vhost.h"
#include "lib/assert.h"
#include "lib/log.h"

/* In a cluster the map's log records users; the journal does not. */
static bool journaled(const struct broker *broker)
{
    return !broker->config.clustered;
}

static void record_user(struct broker *broker, const struct auth_user *u)
{
    if (!journaled(broker))
        return;
    durable_user_put(broker, u);
    for (size_t i = 0; i < u->permissions_count; i++)
        durable_permission_put(broker, u, &u->permissions[i]);
}

void users_bootstrap(struct broker *broker, struct auth *boot)
{
    if (broker->durable.users_recorded && journaled(broker)) {
        LOG_INFO("users: %zu from the journal (the users file seeds only the first start)",
                 broker->auth.users_count);
        auth_free(boot);
        /* A journal from before vhost records made its queues' vhosts:
         * record them now (idempotent). */
        struct hmap_entry *e;
        for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &e);)
            durable_vhost_put(broker, ((struct vhost *)e->value)->name);
        return;
    }
    /* First start (or a cluster, where the map decides later): the file's
     * users, and the vhosts they name. */
    auth_free(&broker->auth);
    broker->auth = *boot;
    auth_init(boot);
    auth_free(boot);
    broker_add_vhost(broker, BYTES_LIT("/"));
    for (size_t i = 0; i < broker->auth.users_count; i++) {
        const struct auth_user *u = broker->auth.users[i];
        for (size_t j = 0; j < u->permissions_count; j++)
            broker_add_vhost(broker, bytes_of_cstr(u->permissions[j].vhost));
    }
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &e);)
        durable_vhost_put(broker, ((struct vhost *)e->value)->name);
    for (size_t i = 0; i < broker->auth.users_count; i++)
        record_user(broker, broker->auth.users[i]);
}

struct auth_user *users_put(struct broker *broker, struct bytes name,
                            const struct password_hash *hash, unsigned tags, bool *created)
{
    struct auth_user *u = auth_user_put(&broker->auth, name, hash, tags, created);
    if (journaled(broker))
        durable_user_put(broker, u);
    return u;
}

/* Closes the open connections that match: 320, RabbitMQ's words. */
static void close_connections(struct broker *broker, const struct auth_user *user,
                              const struct vhost *vhost, const char *reason)
{
    list_for_each_safe(node, &broker->connections) {
        struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (c->cluster_peer || c->conn.closing)
            continue;
        /* The client answers close-ok (or the close timeout cuts it). */
        if ((user != NULL && c->user == user) || (vhost != NULL && c->vhost == vhost))
            connection_force_close(c, reason);
    }
}

/* A deleted vhost's or user's limits go with it (RabbitMQ). In a cluster
 * the map dropped them too, and the mirror copies the map's. */
static void delete_limits(struct broker *broker, enum limit_scope scope, struct bytes name)
{
    for (int kind = 0; kind < LIMIT_KIND_COUNT; kind++) {
        if (limit_set_delete(&broker->limits, scope, name, kind) && journaled(broker))
            durable_limit_deleted(broker, scope, name, kind);
    }
}

bool users_delete(struct broker *broker, struct bytes name)
{
    const struct auth_user *u = auth_find_user(&broker->auth, name);
    if (u == NULL)
        return false;
    auth_user_ref(u); /* ours until its connections are closed and its records gone */
    bool removed = auth_user_delete(&broker->auth, name);
    ASSERT(removed);
    char reason[300];
    snprintf(reason, sizeof reason, "user '%s' is deleted", u->name);
    close_connections(broker, u, NULL, reason);
    if (journaled(broker)) {
        for (size_t i = 0; i < u->permissions_count; i++)
            durable_permission_deleted(broker, name, bytes_of_cstr(u->permissions[i].vhost));
        durable_user_deleted(broker, name);
    }
    delete_limits(broker, LIMIT_SCOPE_USER, name);
    LOG_INFO("user '%s' deleted", u->name);
    auth_user_unref(u);
    return true;
}

int users_permission_put(struct broker *broker, struct bytes user, struct bytes vhost,
                         const char *const texts[AUTH_PERMISSION_KIND_COUNT], char *err,
                         size_t err_size)
{
    struct auth_user *u = (struct auth_user *)auth_find_user(&broker->auth, user);
    if (u == NULL || broker_vhost(broker, vhost) == NULL)
        return -2;
    int rc = auth_permission_put(u, vhost, texts, err, err_size);
    if (rc >= 0 && journaled(broker))
        durable_permission_put(broker, u, auth_user_permission(u, vhost));
    return rc;
}

bool users_permission_delete(struct broker *broker, struct bytes user, struct bytes vhost)
{
    struct auth_user *u = (struct auth_user *)auth_find_user(&broker->auth, user);
    if (u == NULL || !auth_permission_delete(u, vhost))
        return false;
    if (journaled(broker))
        durable_permission_deleted(broker, user, vhost);
    return true;
}

bool users_vhost_put(struct broker *broker, struct bytes name)
{
    if (broker_vhost(broker, name) != NULL)
        return false;
    broker_add_vhost(broker, name);
    return true;
}

bool users_vhost_delete(struct broker *broker, struct bytes name)
{
    struct vhost *vhost = broker_vhost(broker, name);
    if (vhost == NULL)
        return false;
    char reason[300];
    snprintf(reason, sizeof reason, "vhost '%.*s' is deleted", (int)name.len,
             (const char *)name.ptr);
    close_connections(broker, NULL, vhost, reason);
    /* Permissions on it go (RabbitMQ), in the journal as in the table. */
    for (size_t i = 0; i < broker->auth.users_count; i++) {
        struct auth_user *u = broker->auth.users[i];
        if (auth_permission_delete(u, name) && journaled(broker))
            durable_permission_deleted(broker, bytes_of_cstr(u->name), name);
    }
    for (uint32_t i = broker->policies.count; i-- > 0;) {
        const struct policy *p = broker->policies.items[i];
        if (bytes_equal(p->vhost, name))
            durable_policy_deleted(broker, p->vhost, p->name);
    }
    policy_set_delete_vhost(&broker->policies, name);
    delete_limits(broker, LIMIT_SCOPE_VHOST, name);
    broker_retire_vhost(broker, vhost);
    LOG_INFO("vhost '%.*s' deleted", (int)name.len, (const char *)name.ptr);
    return true;
}
