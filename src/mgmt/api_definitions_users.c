/*
 * api_definitions_users.c: see api_definitions_users.h.
 */
#include "mgmt/api_definitions_users.h"

#include <stdio.h>
#include <string.h>

#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/vhost.h"
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

/* ---- import: only what already is ------------------------------------------- */

static const char *string_of(const struct json_tree *tree, const struct json_node *item,
                             const char *key)
{
    const struct json_node *n = json_tree_get(tree, item, key);
    return n != NULL && n->kind == JSON_KIND_STRING ? n->string : NULL;
}

/* RabbitMQ's tags: an array of names, or one comma-separated string. */
static bool tags_of(const struct json_tree *tree, const struct json_node *item, unsigned *out)
{
    const struct json_node *n = json_tree_get(tree, item, "tags");
    *out = 0;
    if (n == NULL)
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

static bool check_user(struct broker *broker, const struct json_tree *tree,
                       const struct json_node *item, char *err, size_t err_size)
{
    const char *name = string_of(tree, item, "name");
    const char *hash = string_of(tree, item, "password_hash");
    const char *algorithm = string_of(tree, item, "hashing_algorithm");
    const struct auth_user *u = name ? auth_find_user(&broker->auth, bytes_of_cstr(name)) : NULL;
    struct password_hash given;
    unsigned tags;
    if (name == NULL) {
        snprintf(err, err_size, "users: an item without a name");
        return false;
    }
    if (u == NULL) {
        snprintf(err, err_size, "users: '%.64s' does not exist here; quay cannot create "
                                "users from definitions yet (add it to the users file)", name);
        return false;
    }
    if (algorithm != NULL && password_algorithm_parse(algorithm) < 0) {
        snprintf(err, err_size, "users: '%.64s' has an unknown hashing_algorithm '%.64s' (quay "
                                "knows rabbit_password_hashing_sha256, _sha512, _md5 and "
                                "quay_password_hashing_pbkdf2_sha256)", name, algorithm);
        return false;
    }
    if (hash == NULL || password_hash_parse(algorithm, hash, strlen(hash), &given) != 0 ||
        !password_hash_equal(&given, &u->password)) {
        snprintf(err, err_size, "users: '%.64s' has another password here; quay cannot change "
                                "it from definitions yet", name);
        return false;
    }
    if (!tags_of(tree, item, &tags) || tags != u->tags) {
        snprintf(err, err_size, "users: '%.64s' has other tags here; quay cannot change them "
                                "from definitions yet", name);
        return false;
    }
    return true;
}

static bool check_permission(struct broker *broker, const struct json_tree *tree,
                             const struct json_node *item, char *err, size_t err_size)
{
    static const char *const kinds[] = {"configure", "write", "read"};
    const char *user = string_of(tree, item, "user");
    const char *vhost = string_of(tree, item, "vhost");
    const struct auth_user *u = user ? auth_find_user(&broker->auth, bytes_of_cstr(user)) : NULL;
    if (u == NULL || vhost == NULL || !auth_user_may_open(u, bytes_of_cstr(vhost))) {
        snprintf(err, err_size, "permissions: user '%.64s' on vhost '%.64s' is not granted "
                                "here; quay cannot grant it from definitions yet",
                 user ? user : "?", vhost ? vhost : "?");
        return false;
    }
    const struct auth_permission *p = auth_user_permission(u, bytes_of_cstr(vhost));
    for (int k = 0; k < AUTH_PERMISSION_KIND_COUNT; k++) {
        const char *want = string_of(tree, item, kinds[k]);
        const char *have = p != NULL ? p->texts[k] : ".*";
        if (want == NULL || strcmp(want, have) != 0) {
            snprintf(err, err_size, "permissions: user '%.64s' on vhost '%.64s' has %s '%.64s' "
                                    "here; quay cannot change it from definitions yet",
                     user, vhost, kinds[k], have);
            return false;
        }
    }
    return true;
}

typedef bool (*check_fn)(struct broker *broker, const struct json_tree *tree,
                         const struct json_node *item, char *err, size_t err_size);

static bool check_vhost(struct broker *broker, const struct json_tree *tree,
                        const struct json_node *item, char *err, size_t err_size)
{
    const char *name = string_of(tree, item, "name");
    if (name != NULL && broker_vhost(broker, bytes_of_cstr(name)) != NULL)
        return true;
    snprintf(err, err_size, "vhosts: '%.64s' does not exist here; quay cannot create vhosts "
                            "from definitions yet", name ? name : "?");
    return false;
}

static bool check_section(struct broker *broker, const struct json_tree *tree,
                          const struct json_node *root, const char *key, check_fn check,
                          char *err, size_t err_size)
{
    const struct json_node *list = json_tree_get(tree, root, key);
    if (list == NULL)
        return true;
    if (list->kind != JSON_KIND_ARRAY) {
        snprintf(err, err_size, "%s must be an array", key);
        return false;
    }
    for (const struct json_node *c = json_tree_first(tree, list); c; c = json_tree_next(tree, c)) {
        if (c->kind != JSON_KIND_OBJECT) {
            snprintf(err, err_size, "%s: every item must be an object", key);
            return false;
        }
        if (!check(broker, tree, c, err, err_size))
            return false;
    }
    return true;
}

bool api_definitions_check_users(struct broker *broker, const struct json_tree *tree,
                                 const struct json_node *root, char *err, size_t err_size)
{
    return check_section(broker, tree, root, "users", check_user, err, err_size) &&
           check_section(broker, tree, root, "vhosts", check_vhost, err, err_size) &&
           check_section(broker, tree, root, "permissions", check_permission, err, err_size);
}
