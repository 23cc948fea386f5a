/*
 * mirror_users.c: the broker's users table follows the cluster map's
 * users (see mirror.h and broker/users.h).
 *
 * Until the map has users (map.users_defined), each broker logs in with
 * its own users file's; the first broker to catch up proposes its file as
 * users.bootstrap, which applies only to a map that has never had users,
 * so exactly one file wins and later ones are refused. From then on every
 * broker's table is the map's, rebuilt in place after each user command:
 * users the map lacks are deleted (their connections closed), the others
 * changed in place (so open connections see new permissions at once).
 * The vhost and user limits are copied whole from the map's: the broker
 * checks its copy (broker/limits.h) at connection.open, channel.open and
 * queue.declare.
 */
#include <stdlib.h>
#include <string.h>

#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/usage.h"
#include "broker/users.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/mirror.h"
#include "cluster/node.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

/* A map user's tags as enum auth_tag bits; unknown ones are ignored (the
 * proposer checked them). */
static unsigned tag_bits(const struct map_user *mu)
{
    unsigned tags = 0;
    for (uint32_t i = 0; i < mu->tags_count; i++) {
        char text[CLUSTER_NAME_SIZE_MAX + 1], bad[8];
        memcpy(text, mu->tags[i].ptr, mu->tags[i].len);
        text[mu->tags[i].len] = '\0';
        unsigned one;
        if (auth_parse_tags(text, &one, bad, sizeof bad) == 0)
            tags |= one;
    }
    return tags;
}

static void text_of(struct bytes b, char out[CLUSTER_NAME_SIZE_MAX + 1])
{
    ASSERT(b.len <= CLUSTER_NAME_SIZE_MAX);
    if (b.len)
        memcpy(out, b.ptr, b.len);
    out[b.len] = '\0';
}

static void follow_permissions(struct auth_user *u, const struct map_user *mu)
{
    for (size_t j = u->permissions_count; j-- > 0;) {
        if (!map_user_has_vhost(mu, bytes_of_cstr(u->permissions[j].vhost)))
            auth_permission_delete(u, bytes_of_cstr(u->permissions[j].vhost));
    }
    for (uint32_t k = 0; k < mu->vhosts_count; k++) {
        char texts[AUTH_PERMISSION_KIND_COUNT][CLUSTER_NAME_SIZE_MAX + 1];
        const char *ptrs[AUTH_PERMISSION_KIND_COUNT];
        bool same = true;
        const struct auth_permission *p = auth_user_permission(u, mu->vhosts[k]);
        for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
            text_of(mu->permissions[3 * k + (uint32_t)kind], texts[kind]);
            ptrs[kind] = texts[kind];
            same = same && p != NULL && strcmp(p->texts[kind], texts[kind]) == 0;
        }
        char err[256];
        if (!same && auth_permission_put(u, mu->vhosts[k], ptrs, err, sizeof err) < 0)
            LOG_WARN("cluster: user '%s': %s", u->name, err); /* the map checked it */
    }
}

void mirror_limits(struct member *member)
{
    const struct cluster_map *map = member_map(member);
    if (limit_set_equal(&member->broker->limits, &map->limits))
        return;
    limit_set_copy(&member->broker->limits, &map->limits);
    usage_changed(member->broker, NULL); /* a name newly limited: the peers need its counts */
}

void mirror_users(struct member *member)
{
    const struct cluster_map *map = member_map(member);
    struct broker *broker = member->broker;
    mirror_limits(member);
    if (!map->users_defined)
        return;
    for (size_t i = broker->auth.users_count; i-- > 0;) {
        const struct auth_user *u = broker->auth.users[i];
        if (!u->internal && cluster_map_user(map, bytes_of_cstr(u->name)) == NULL)
            users_delete(broker, bytes_of_cstr(u->name)); /* (the broker's own stays) */
    }
    for (uint32_t i = 0; i < map->users_count; i++) {
        const struct map_user *mu = map->users[i];
        /* Any form travels (broker/password.h): each broker checks it. */
        struct password_hash hash;
        const char *text = (const char *)mu->password_hash.ptr;
        if (password_hash_parse(NULL, text, mu->password_hash.len, &hash) != 0) /* none matches: */
            hash = (struct password_hash){.digest_size = 32, .salt_size = 4};
        bool created;
        struct auth_user *u = users_put(broker, mu->name, &hash, tag_bits(mu), &created);
        u->loopback_only = mu->loopback;
        u->any_vhost = mu->any_vhost;
        follow_permissions(u, mu);
    }
}

static void on_bootstrap_done(void *ctx, int status, const struct map_change *change)
{
    (void)ctx;
    if (status != OK)
        LOG_WARN("cluster: the users file could not be proposed (retried at the next sync)");
    else if (change->reply_code == 200)
        LOG_INFO("cluster: this broker's users file is now the cluster's users");
}

/* Our table as map users, for users.bootstrap: they borrow the table's
 * strings, and *strings and *hashes (the caller frees all three). */
static struct map_user *as_map_users(const struct auth *auth, struct bytes **strings,
                                     char **hashes_out)
{
    struct map_user *out = xcalloc(auth->users_count + 1, sizeof *out);
    size_t n = 0;
    for (size_t i = 0; i < auth->users_count; i++)
        n += 2 + 4 + 4 * auth->users[i]->permissions_count;
    struct bytes *s = xcalloc(n + 1, sizeof *s);
    char *hashes = xcalloc(auth->users_count + 1, PASSWORD_TEXT_MAX + 1);
    *strings = s;
    *hashes_out = hashes;
    for (size_t i = 0; i < auth->users_count; i++) {
        const struct auth_user *u = auth->users[i];
        struct map_user *mu = &out[i];
        char *hash = hashes + i * (PASSWORD_TEXT_MAX + 1);
        size_t hash_size = auth_user_hash_text(u, hash);
        mu->name = bytes_of_cstr(u->name);
        mu->password_hash = (struct bytes){(const uint8_t *)hash, (uint32_t)hash_size};
        const char *names[4];
        mu->tags_count = auth_tag_names(u->tags, names);
        mu->tags = s;
        for (uint32_t t = 0; t < mu->tags_count; t++)
            *s++ = bytes_of_cstr(names[t]);
        mu->vhosts_count = (uint32_t)u->permissions_count;
        mu->vhosts = s;
        for (size_t j = 0; j < u->permissions_count; j++)
            *s++ = bytes_of_cstr(u->permissions[j].vhost);
        mu->permissions = s;
        for (size_t j = 0; j < u->permissions_count; j++) {
            for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++)
                *s++ = bytes_of_cstr(u->permissions[j].texts[kind]);
        }
        mu->loopback = u->loopback_only;
        mu->any_vhost = u->any_vhost;
    }
    return out;
}

void mirror_users_bootstrap(struct member *member)
{
    const struct cluster_map *map = member_map(member);
    const struct auth *auth = &member->broker->auth;
    if (map->users_defined || auth->users_count == 0)
        return;
    struct bytes *strings;
    char *hashes;
    struct map_user *users = as_map_users(auth, &strings, &hashes);
    const struct map_user **list = xcalloc(auth->users_count, sizeof *list);
    for (size_t i = 0; i < auth->users_count; i++)
        list[i] = &users[i];
    struct map_cmd cmd;
    if (map_cmd_users_bootstrap(&cmd, list, (uint32_t)auth->users_count) == OK)
        cluster_node_submit(member->node, &cmd, on_bootstrap_done, member);
    free(hashes);
    free(list);
    free(users);
    free(strings);
}
