/*
 * api_definitions_users.c: see api_definitions_users.h.
 */
#include "mgmt/api_definitions_users.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/users.h"
#include "broker/vhost.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api_limits.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

static const struct {
    const char *name;
    unsigned bit;
} tag_names[] = {{"administrator", AUTH_TAG_ADMINISTRATOR},
                 {"monitoring", AUTH_TAG_MONITORING},
                 {"policymaker", AUTH_TAG_POLICYMAKER},
                 {"management", AUTH_TAG_MANAGEMENT}};
#define TAG_NAMES_COUNT (sizeof tag_names / sizeof tag_names[0])

static void write_permission(struct json *out, const struct auth_user *u, struct bytes vhost,
                             const struct auth_permission *p)
{
    static const char *const kinds[] = {"configure", "write", "read"};
    json_object_begin(out);
    json_kv_string(out, "user", u->name);
    json_key(out, "vhost");
    json_string_n(out, vhost.ptr, vhost.len);
    for (int k = 0; k < AUTH_PERMISSION_KIND_COUNT; k++)
        json_kv_string(out, kinds[k], p != NULL ? p->texts[k] : ".*");
    json_object_end(out);
}

void api_definitions_write_users(struct json *out, struct broker *broker)
{
    const struct auth *auth = &broker->auth;
    json_key(out, "users");
    json_array_begin(out);
    for (size_t i = 0; i < auth->users_count; i++) {
        const struct auth_user *u = auth->users[i];
        if (u->internal)
            continue;
        char hash[PASSWORD_TEXT_MAX + 1];
        auth_user_hash_text(u, hash);
        json_object_begin(out);
        json_kv_string(out, "name", u->name);
        json_kv_string(out, "password_hash", hash);
        /* Each user's own: RabbitMQ imports its three back, and refuses
         * quay's PBKDF2 (400 not_base64: README, "Passwords"). */
        json_kv_string(out, "hashing_algorithm", auth_user_hash_algorithm(u));
        json_key(out, "tags");
        json_array_begin(out);
        for (size_t t = 0; t < TAG_NAMES_COUNT; t++) {
            if (u->tags & tag_names[t].bit)
                json_string(out, tag_names[t].name);
        }
        json_array_end(out);
        json_key(out, "limits");
        api_limits_write_user(out, broker, bytes_of_cstr(u->name));
        json_object_end(out);
    }
    json_array_end(out);
    json_key(out, "vhosts");
    json_array_begin(out);
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        json_object_begin(out);
        json_key(out, "name");
        json_string_n(out, vhost->name.ptr, vhost->name.len);
        json_object_end(out);
    }
    json_array_end(out);
    json_key(out, "permissions");
    json_array_begin(out);
    for (size_t i = 0; i < auth->users_count; i++) {
        const struct auth_user *u = auth->users[i];
        for (uint32_t j = 0; !u->internal && hmap_next(&broker->vhosts, &j, &v);) {
            const struct vhost *vhost = v->value;
            if (auth_user_may_open(u, vhost->name))
                write_permission(out, u, vhost->name, auth_user_permission(u, vhost->name));
        }
    }
    json_array_end(out);
}

/* ---- import: checking ---------------------------------------------------------- */

#define NAME_SIZE_MAX 255

/* A string member of 1..255 bytes (0.. if may_be_empty) without NUL, or NULL. */
static const char *name_of(const struct json_tree *tree, const struct json_node *item,
                           const char *key, bool may_be_empty)
{
    const struct json_node *n = json_tree_get(tree, item, key);
    if (n == NULL || n->kind != JSON_KIND_STRING || n->string_size > NAME_SIZE_MAX ||
        (n->string_size == 0 && !may_be_empty) || memchr(n->string, 0, n->string_size) != NULL)
        return NULL;
    return n->string;
}

/* RabbitMQ's tags: an array of names, or one comma-separated string. */
static bool tags_of(const struct json_tree *tree, const struct json_node *item, unsigned *out)
{
    const struct json_node *n = json_tree_get(tree, item, "tags");
    *out = 0;
    if (n == NULL || n->kind == JSON_KIND_NULL)
        return true;
    if (n->kind == JSON_KIND_STRING) {
        char bad[64];
        return n->string[0] == '\0' || auth_parse_tags(n->string, out, bad, sizeof bad) == 0;
    }
    if (n->kind != JSON_KIND_ARRAY)
        return false;
    for (const struct json_node *c = json_tree_first(tree, n); c; c = json_tree_next(tree, c)) {
        bool known = false;
        for (size_t t = 0; t < TAG_NAMES_COUNT && c->kind == JSON_KIND_STRING; t++) {
            if (strcmp(c->string, tag_names[t].name) == 0)
                *out |= tag_names[t].bit, known = true;
        }
        if (!known)
            return false;
    }
    return true;
}

static bool is_internal(const struct broker *broker, const char *name)
{
    const struct auth_user *u = auth_find_user(&broker->auth, bytes_of_cstr(name));
    return u != NULL && u->internal;
}

/* A user as RabbitMQ 3.10's import takes it: "password_hash" with its
 * "hashing_algorithm" (absent: told from the hash), or a clear
 * "password"; an empty hash is a user nobody logs in as with a password. */
static bool check_user(struct broker *broker, const struct json_tree *tree,
                       const struct json_node *item, struct definitions_users *out, char *err,
                       size_t err_size)
{
    static const struct password_policy sha256 = {.algorithm = PASSWORD_SHA256};
    const char *name = name_of(tree, item, "name", false);
    const struct json_node *hash = json_tree_get(tree, item, "password_hash");
    const struct json_node *password = json_tree_get(tree, item, "password");
    const struct json_node *algorithm = json_tree_get(tree, item, "hashing_algorithm");
    struct definitions_user u = {.name = name};
    if (name == NULL || is_internal(broker, name)) {
        snprintf(err, err_size, name ? "'%.64s' is the broker's own login"
                                     : "no name (1 to 255 bytes, no NUL)", name);
        return false;
    }
    if (algorithm != NULL && (algorithm->kind != JSON_KIND_STRING ||
                              password_algorithm_parse(algorithm->string) < 0)) {
        snprintf(err, err_size, "'%.64s' has an unknown hashing_algorithm (quay knows "
                 "rabbit_password_hashing_sha256, _sha512, _md5 and "
                 "quay_password_hashing_pbkdf2_sha256)", name);
        return false;
    }
    if (hash != NULL && hash->kind == JSON_KIND_STRING && hash->string_size > 0) {
        if (password_hash_parse(algorithm ? algorithm->string : NULL, hash->string,
                                hash->string_size, &u.hash) != 0) {
            snprintf(err, err_size, "'%.64s': password_hash is not a hash of its "
                     "hashing_algorithm (not_base64, another length, or PBKDF2 iterations "
                     "outside 1000..10000000)", name);
            return false;
        }
    } else if (password != NULL && password->kind == JSON_KIND_STRING) {
        auth_hash_new(&broker->auth, (struct bytes){(const uint8_t *)password->string,
                                                    password->string_size}, &u.hash);
    } else if (hash != NULL && hash->kind == JSON_KIND_STRING) {
        password_hash_random(&sha256, &u.hash);
    } else {
        snprintf(err, err_size, "'%.64s' has no password_hash (a string)", name);
        return false;
    }
    if (!tags_of(tree, item, &u.tags)) {
        snprintf(err, err_size, "'%.64s': tags must be names among administrator, monitoring, "
                 "policymaker, management (an array, or one comma-separated string)", name);
        return false;
    }
    out->users = xrealloc(out->users, (out->users_count + 1) * sizeof *out->users);
    out->users[out->users_count++] = u;
    return true;
}

static bool check_vhost(struct broker *broker, const struct json_tree *tree,
                        const struct json_node *item, struct definitions_users *out, char *err,
                        size_t err_size)
{
    (void)broker;
    const char *name = name_of(tree, item, "name", false);
    if (name == NULL) {
        snprintf(err, err_size, "no name (1 to 255 bytes, no NUL)");
        return false;
    }
    out->vhosts = xrealloc(out->vhosts, (out->vhosts_count + 1) * sizeof *out->vhosts);
    out->vhosts[out->vhosts_count++] = name;
    return true;
}

static bool imports_user(const struct definitions_users *d, const char *name)
{
    for (uint32_t i = 0; i < d->users_count; i++) {
        if (strcmp(d->users[i].name, name) == 0)
            return true;
    }
    return false;
}

bool api_definitions_users_has_vhost(const struct definitions_users *d, struct bytes name)
{
    for (uint32_t i = 0; i < d->vhosts_count; i++) {
        if (bytes_equal_cstr(name, d->vhosts[i]))
            return true;
    }
    return false;
}

bool api_definitions_users_grants(const struct definitions_users *d, const char *user,
                                  struct bytes vhost)
{
    for (uint32_t i = 0; i < d->permissions_count; i++) {
        if (strcmp(d->permissions[i].user, user) == 0 &&
            bytes_equal_cstr(vhost, d->permissions[i].vhost))
            return true;
    }
    return false;
}

static bool check_permission(struct broker *broker, const struct json_tree *tree,
                             const struct json_node *item, struct definitions_users *out,
                             char *err, size_t err_size)
{
    struct definitions_permission p = {.user = name_of(tree, item, "user", false),
                                       .vhost = name_of(tree, item, "vhost", false)};
    if (p.user == NULL || p.vhost == NULL) {
        snprintf(err, err_size, "no user or no vhost (1 to 255 bytes, no NUL)");
        return false;
    }
    const struct auth_user *u = auth_find_user(&broker->auth, bytes_of_cstr(p.user));
    if ((u == NULL || u->internal) && !imports_user(out, p.user)) {
        snprintf(err, err_size, "user '%.64s' neither exists nor is in the definitions",
                 p.user);
        return false;
    }
    if (broker_vhost(broker, bytes_of_cstr(p.vhost)) == NULL &&
        !api_definitions_users_has_vhost(out, bytes_of_cstr(p.vhost))) {
        snprintf(err, err_size, "vhost '%.64s' neither exists nor is in the definitions",
                 p.vhost);
        return false;
    }
    for (int k = 0; k < AUTH_PERMISSION_KIND_COUNT; k++) {
        const char *kind = auth_permission_kind_name((enum auth_permission_kind)k);
        char why[200];
        p.texts[k] = name_of(tree, item, kind, true);
        if (p.texts[k] == NULL) {
            snprintf(err, err_size, "'%s' must be a string of at most %d bytes, without NUL",
                     kind, NAME_SIZE_MAX);
            return false;
        }
        if (p.texts[k][0] != '\0' && auth_regex_check(p.texts[k], why, sizeof why) != 0) {
            snprintf(err, err_size, "invalid_regexp in '%s': %s", kind, why);
            return false;
        }
    }
    out->permissions = xrealloc(out->permissions,
                                (out->permissions_count + 1) * sizeof *out->permissions);
    out->permissions[out->permissions_count++] = p;
    return true;
}

typedef bool (*check_fn)(struct broker *broker, const struct json_tree *tree,
                         const struct json_node *item, struct definitions_users *out,
                         char *err, size_t err_size);

/* Each item of root's key, checked in order; an error names its place
 * ("users[2]: ..."). */
static bool check_section(struct broker *broker, const struct json_tree *tree,
                          const struct json_node *root, const char *key, check_fn check,
                          struct definitions_users *out, char *err, size_t err_size)
{
    const struct json_node *list = json_tree_get(tree, root, key);
    if (list == NULL || list->kind == JSON_KIND_NULL)
        return true;
    if (list->kind != JSON_KIND_ARRAY) {
        snprintf(err, err_size, "%s must be an array", key);
        return false;
    }
    uint32_t index = 0;
    for (const struct json_node *c = json_tree_first(tree, list); c;
         c = json_tree_next(tree, c), index++) {
        char why[300];
        if (c->kind != JSON_KIND_OBJECT)
            snprintf(why, sizeof why, "not an object");
        else if (check(broker, tree, c, out, why, sizeof why))
            continue;
        snprintf(err, err_size, "%s[%u]: %s", key, index, why);
        return false;
    }
    return true;
}

bool api_definitions_check_users(struct broker *broker, const struct json_tree *tree,
                                 const struct json_node *root, struct definitions_users *out,
                                 char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    return check_section(broker, tree, root, "users", check_user, out, err, err_size) &&
           check_section(broker, tree, root, "vhosts", check_vhost, out, err, err_size) &&
           check_section(broker, tree, root, "permissions", check_permission, out, err,
                         err_size);
}

void api_definitions_users_free(struct definitions_users *d)
{
    free(d->users);
    free(d->vhosts);
    free(d->permissions);
    memset(d, 0, sizeof *d);
}

/* ---- import: applying ---------------------------------------------------------- */

/* Outside a cluster: at once, each change journaled as the API's are. */
static void apply_here(struct broker *broker, const struct definitions_users *d)
{
    for (uint32_t i = 0; i < d->vhosts_count; i++) {
        if (users_vhost_put(broker, bytes_of_cstr(d->vhosts[i])))
            LOG_INFO("vhost '%s' created by a definitions import", d->vhosts[i]);
    }
    for (uint32_t i = 0; i < d->users_count; i++) {
        bool created;
        users_put(broker, bytes_of_cstr(d->users[i].name), &d->users[i].hash, d->users[i].tags,
                  &created);
        LOG_INFO("user '%s' %s by a definitions import", d->users[i].name,
                 created ? "created" : "changed");
    }
    for (uint32_t i = 0; i < d->permissions_count; i++) {
        const struct definitions_permission *p = &d->permissions[i];
        char err[256];
        int rc = users_permission_put(broker, bytes_of_cstr(p->user), bytes_of_cstr(p->vhost),
                                      p->texts, err, sizeof err);
        ASSERT(rc >= 0); /* its user, vhost and regexes were checked */
    }
}

/* In a cluster: one users.import command, so every broker applies all of
 * it or none (the map checks it whole again). */
static struct map_cmd *import_command(const struct definitions_users *d, struct map_cmd *cmd)
{
    struct map_import_user *users = xcalloc(d->users_count + 1, sizeof *users);
    struct bytes *tags = xcalloc(4 * (size_t)d->users_count + 1, sizeof *tags);
    char (*hashes)[PASSWORD_TEXT_MAX + 1] = xcalloc(d->users_count + 1, sizeof *hashes);
    struct bytes *vhosts = xcalloc(d->vhosts_count + 1, sizeof *vhosts);
    struct map_import_permission *perms = xcalloc(d->permissions_count + 1, sizeof *perms);
    for (uint32_t i = 0; i < d->users_count; i++) {
        const char *names[4];
        uint32_t n = auth_tag_names(d->users[i].tags, names);
        for (uint32_t t = 0; t < n; t++)
            tags[4 * i + t] = bytes_of_cstr(names[t]);
        password_hash_format(&d->users[i].hash, hashes[i]);
        users[i] = (struct map_import_user){bytes_of_cstr(d->users[i].name),
                                            bytes_of_cstr(hashes[i]), &tags[4 * i], n};
    }
    for (uint32_t i = 0; i < d->vhosts_count; i++)
        vhosts[i] = bytes_of_cstr(d->vhosts[i]);
    for (uint32_t i = 0; i < d->permissions_count; i++) {
        const struct definitions_permission *p = &d->permissions[i];
        perms[i] = (struct map_import_permission){bytes_of_cstr(p->user), bytes_of_cstr(p->vhost),
                                                  {bytes_of_cstr(p->texts[0]),
                                                   bytes_of_cstr(p->texts[1]),
                                                   bytes_of_cstr(p->texts[2])}};
    }
    int rc = map_cmd_users_import(cmd, users, d->users_count, vhosts, d->vhosts_count, perms,
                                  d->permissions_count);
    free(users);
    free(tags);
    free(hashes);
    free(vhosts);
    free(perms);
    return rc == OK ? cmd : NULL;
}

static void on_imported(void *arg, int status, const struct map_change *change)
{
    struct definitions_users_apply *a = arg;
    a->request = NULL;
    if (status != OK)
        a->done(a->ctx, 503, "the cluster map is unavailable (no leader or no quorum)");
    else if (change->reply_code != REPLY_SUCCESS)
        a->done(a->ctx, 400, change->reply_text); /* changed since the check: nothing done */
    else
        a->done(a->ctx, 204, NULL);
}

void api_definitions_apply_users(struct broker *broker, const struct definitions_users *d,
                                 struct definitions_users_apply *a)
{
    struct cluster_node *node = member_node_of(broker);
    a->request = NULL;
    if (d->users_count + d->vhosts_count + d->permissions_count == 0) {
        a->done(a->ctx, 204, NULL);
        return;
    }
    if (node == NULL) {
        apply_here(broker, d);
        a->done(a->ctx, 204, NULL);
        return;
    }
    struct map_cmd cmd;
    if (import_command(d, &cmd) == NULL) {
        a->done(a->ctx, 413, "the users, vhosts and permissions exceed one cluster command "
                             "(1 MiB): import them in parts");
        return;
    }
    a->request = cluster_node_submit(node, &cmd, on_imported, a);
}
