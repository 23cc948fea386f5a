/*
 * api_definitions_settings.c: see api_definitions_settings.h.
 */
#include "mgmt/api_definitions_settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/durable.h"
#include "broker/limits.h"
#include "broker/users.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "cluster/node.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api_definitions_users.h"
#include "mgmt/api_limits.h"
#include "mgmt/json_tree.h"

void settings_free(struct settings *s)
{
    free(s->items);
    memset(s, 0, sizeof *s);
}

static struct setting *add(struct settings *s, enum setting_kind kind)
{
    if (s->count == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->items = xrealloc(s->items, s->cap * sizeof *s->items);
    }
    struct setting *x = &s->items[s->count++];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    return x;
}

static void copy_name(char out[256], struct bytes b)
{
    size_t n = b.len < 255 ? b.len : 255;
    memcpy(out, b.ptr, n);
    out[n] = '\0';
}

static bool vhost_known(struct broker *broker, struct bytes vhost,
                        const struct definitions_users *d)
{
    bool exists = member_node_of(broker) != NULL
                      ? cluster_map_vhost(cluster_node_map(member_node_of(broker)), vhost) != NULL
                      : broker_vhost(broker, vhost) != NULL;
    return exists || (d != NULL && api_definitions_users_has_vhost(d, vhost));
}

static bool string_member(const struct json_tree *tree, const struct json_node *item,
                          const char *key, struct bytes *out)
{
    const struct json_node *n = json_tree_get(tree, item, key);
    if (n == NULL || n->kind != JSON_KIND_STRING || n->string_size == 0 ||
        n->string_size > 255)
        return false;
    *out = (struct bytes){(const uint8_t *)n->string, n->string_size};
    return true;
}

bool settings_check_policy(struct broker *broker, const struct json_tree *tree,
                           const struct json_node *item, struct bytes only,
                           const struct definitions_users *d, struct settings *out, char *err,
                           size_t err_size)
{
    struct bytes vhost = only, name;
    if ((only.len == 0 && !string_member(tree, item, "vhost", &vhost)) ||
        !string_member(tree, item, "name", &name)) {
        snprintf(err, err_size, "policies: an item without a vhost or a name");
        return false;
    }
    if (!vhost_known(broker, vhost, d)) {
        snprintf(err, err_size, "policies: vhost '%.*s' neither exists nor is in the "
                 "definitions", (int)vhost.len, (const char *)vhost.ptr);
        return false;
    }
    struct setting *x = add(out, SETTING_POLICY_PUT);
    char why[256];
    if (api_policy_read(tree, item, vhost, name, &x->policy, why, sizeof why) != OK) {
        out->count--;
        snprintf(err, err_size, "policies: '%.*s': %s", (int)name.len, (const char *)name.ptr,
                 why);
        return false;
    }
    return true;
}

/* value's members as limits of (scope, owner), each an integer: the ones
 * of scope it does not name are cleared (the value replaces them all). */
static bool check_limits(const struct json_tree *tree, const struct json_node *value,
                         enum limit_scope scope, struct bytes owner, struct settings *out,
                         char *err, size_t err_size)
{
    bool named[LIMIT_KIND_COUNT] = {false};
    for (const struct json_node *m = json_tree_first(tree, value); m != NULL;
         m = json_tree_next(tree, m)) {
        int kind = limit_kind_parse(scope, bytes_of_cstr(m->key));
        if (kind < 0 || m->kind != JSON_KIND_NUMBER || !m->is_integer) {
            snprintf(err, err_size, "unknown %s limit '%.64s' or a value not an integer (%s)",
                     limit_scope_name(scope), m->key,
                     scope == LIMIT_SCOPE_VHOST ? "max-connections or max-queues"
                                                : "max-connections or max-channels");
            return false;
        }
        named[kind] = true;
        struct setting *x = add(out, SETTING_LIMIT_PUT);
        x->scope = (uint8_t)scope, x->limit_kind = (uint8_t)kind, x->value = m->integer;
        copy_name(x->owner, owner);
    }
    for (int k = 0; k < LIMIT_KIND_COUNT; k++) {
        if (named[k] || !limit_kind_valid(scope, k))
            continue;
        struct setting *x = add(out, SETTING_LIMIT_DELETE);
        x->scope = (uint8_t)scope, x->limit_kind = (uint8_t)k;
        copy_name(x->owner, owner);
    }
    return true;
}

bool settings_check_parameter(struct broker *broker, const struct json_tree *tree,
                              const struct json_node *item, struct bytes only,
                              const struct definitions_users *d, struct settings *out,
                              char *err, size_t err_size)
{
    const struct json_node *component = json_tree_get(tree, item, "component");
    const struct json_node *value = json_tree_get(tree, item, "value");
    if (component == NULL || component->kind != JSON_KIND_STRING ||
        strcmp(component->string, "vhost-limits") != 0) {
        snprintf(err, err_size, "parameters: quay has only vhost-limits and cannot import "
                 "other components");
        return false;
    }
    struct bytes vhost = only;
    if ((only.len == 0 && !string_member(tree, item, "vhost", &vhost)) || value == NULL ||
        value->kind != JSON_KIND_OBJECT) {
        snprintf(err, err_size, "parameters: a vhost-limits item needs a vhost and a value");
        return false;
    }
    if (!vhost_known(broker, vhost, d)) {
        snprintf(err, err_size, "parameters: vhost '%.*s' neither exists nor is in the "
                 "definitions", (int)vhost.len, (const char *)vhost.ptr);
        return false;
    }
    char why[200];
    if (!check_limits(tree, value, LIMIT_SCOPE_VHOST, vhost, out, why, sizeof why)) {
        snprintf(err, err_size, "parameters: %s", why);
        return false;
    }
    return true;
}

bool settings_check_user_limits(struct broker *broker, const struct json_tree *tree,
                                const struct json_node *item, struct settings *out, char *err,
                                size_t err_size)
{
    (void)broker;
    const struct json_node *limits = json_tree_get(tree, item, "limits");
    struct bytes user;
    if (limits == NULL || limits->kind == JSON_KIND_NULL ||
        !string_member(tree, item, "name", &user))
        return true; /* absent; a user without a name was refused already */
    if (limits->kind != JSON_KIND_OBJECT) {
        snprintf(err, err_size, "users: limits must be an object");
        return false;
    }
    char why[200];
    if (!check_limits(tree, limits, LIMIT_SCOPE_USER, user, out, why, sizeof why)) {
        snprintf(err, err_size, "users: %s", why);
        return false;
    }
    return true;
}

bool settings_room(struct broker *broker, const struct settings *s, char *err, size_t err_size)
{
    uint32_t policies = 0, limits = 0;
    for (uint32_t i = 0; i < s->count; i++) {
        policies += s->items[i].kind == SETTING_POLICY_PUT;
        limits += s->items[i].kind == SETTING_LIMIT_PUT;
    }
    if (api_policies_of(broker)->count + policies > POLICY_COUNT_MAX ||
        api_limits_of(broker)->count + limits > LIMIT_COUNT_MAX) {
        snprintf(err, err_size, "too many policies or limits");
        return false;
    }
    return true;
}

void settings_undo_users(struct broker *broker, const struct definitions_users *d,
                         struct settings *undo)
{
    const struct auth *auth = &broker->auth;
    for (uint32_t i = 0; i < d->vhosts_count; i++) {
        if (!vhost_known(broker, bytes_of_cstr(d->vhosts[i]), NULL))
            copy_name(add(undo, SETTING_VHOST_DELETE)->owner, bytes_of_cstr(d->vhosts[i]));
    }
    for (uint32_t i = 0; i < d->users_count; i++) {
        const struct auth_user *u = auth_find_user(auth, bytes_of_cstr(d->users[i].name));
        struct setting *x = add(undo, u != NULL ? SETTING_USER_SET : SETTING_USER_DELETE);
        copy_name(x->owner, bytes_of_cstr(d->users[i].name));
        if (u != NULL)
            x->hash = u->password, x->tags = u->tags;
    }
    for (uint32_t i = 0; i < d->permissions_count; i++) {
        const struct definitions_permission *p = &d->permissions[i];
        const struct auth_user *u = auth_find_user(auth, bytes_of_cstr(p->user));
        const struct auth_permission *had =
            u != NULL ? auth_user_permission(u, bytes_of_cstr(p->vhost)) : NULL;
        struct setting *x = add(undo, had != NULL ? SETTING_PERMISSION_PUT
                                                  : SETTING_PERMISSION_DELETE);
        copy_name(x->owner, bytes_of_cstr(p->user));
        copy_name(x->vhost, bytes_of_cstr(p->vhost));
        for (int k = 0; had != NULL && k < 3; k++)
            copy_name(x->regexes[k], bytes_of_cstr(had->texts[k]));
    }
}

/* Appends to undo the change that takes x back (the broker as it is now). */
static void record_undo(struct broker *broker, const struct setting *x, struct settings *undo)
{
    if (x->kind == SETTING_POLICY_PUT) {
        const struct policy *p = policy_set_find(api_policies_of(broker), x->policy.decl.vhost,
                                                 x->policy.decl.name);
        struct setting *u = add(undo, p != NULL ? SETTING_POLICY_PUT : SETTING_POLICY_DELETE);
        u->policy = x->policy;
        if (p != NULL) {
            memcpy(u->policy.pattern, p->pattern.ptr, p->pattern.len);
            u->policy.decl.pattern.len = p->pattern.len;
            u->policy.decl.priority = p->priority, u->policy.decl.backups = p->backups;
            u->policy.decl.replicate = p->replicate;
        }
        /* The slices must point into the copy. */
        u->policy.decl.vhost.ptr = u->policy.vhost, u->policy.decl.name.ptr = u->policy.name;
        u->policy.decl.pattern.ptr = u->policy.pattern;
    } else if (x->kind == SETTING_LIMIT_PUT || x->kind == SETTING_LIMIT_DELETE) {
        const struct limit *l = limit_set_find(api_limits_of(broker), x->scope,
                                               bytes_of_cstr(x->owner), x->limit_kind);
        struct setting *u = add(undo, l != NULL ? SETTING_LIMIT_PUT : SETTING_LIMIT_DELETE);
        u->scope = x->scope, u->limit_kind = x->limit_kind, u->value = l ? l->value : -1;
        memcpy(u->owner, x->owner, sizeof u->owner);
    }
}

/* Outside a cluster: x at once, journaled (false: nothing to do). */
static void apply_here(struct broker *broker, const struct setting *x)
{
    struct bytes owner = bytes_of_cstr(x->owner);
    const char *texts[3] = {x->regexes[0], x->regexes[1], x->regexes[2]};
    char err[256];
    bool created;
    switch (x->kind) {
    case SETTING_POLICY_PUT: api_policy_put_here(broker, &x->policy.decl); return;
    case SETTING_POLICY_DELETE:
        api_policy_delete_here(broker, x->policy.decl.vhost, x->policy.decl.name);
        return;
    case SETTING_LIMIT_PUT:
        limit_set_put(&broker->limits, x->scope, owner, x->limit_kind, x->value);
        durable_limit_put(broker, x->scope, owner, x->limit_kind, x->value);
        return;
    case SETTING_LIMIT_DELETE:
        if (limit_set_delete(&broker->limits, x->scope, owner, x->limit_kind))
            durable_limit_deleted(broker, x->scope, owner, x->limit_kind);
        return;
    case SETTING_PERMISSION_PUT:
        (void)users_permission_put(broker, owner, bytes_of_cstr(x->vhost), texts, err,
                                   sizeof err);
        return;
    case SETTING_PERMISSION_DELETE:
        users_permission_delete(broker, owner, bytes_of_cstr(x->vhost));
        return;
    case SETTING_USER_SET: users_put(broker, owner, &x->hash, x->tags, &created); return;
    case SETTING_USER_DELETE: users_delete(broker, owner); return;
    case SETTING_VHOST_DELETE: users_vhost_delete(broker, owner); return;
    }
}

/* In a cluster: x's map command. */
static int command_of(const struct setting *x, struct map_cmd *cmd)
{
    struct bytes owner = bytes_of_cstr(x->owner);
    struct bytes regexes[3];
    for (int k = 0; k < 3; k++)
        regexes[k] = bytes_of_cstr(x->regexes[k]);
    char hash[PASSWORD_TEXT_MAX + 1];
    const char *names[4];
    struct bytes tags[4];
    switch (x->kind) {
    case SETTING_POLICY_PUT: return map_cmd_policy_put(cmd, &x->policy.decl);
    case SETTING_POLICY_DELETE:
        return map_cmd_policy_delete(cmd, x->policy.decl.vhost, x->policy.decl.name);
    case SETTING_LIMIT_PUT:
    case SETTING_LIMIT_DELETE:
        return map_cmd_limit(cmd, x->kind == SETTING_LIMIT_PUT, x->scope, owner, x->limit_kind,
                             x->value);
    case SETTING_PERMISSION_PUT:
        return map_cmd_permission_put(cmd, owner, bytes_of_cstr(x->vhost), regexes);
    case SETTING_PERMISSION_DELETE:
        return map_cmd_permission_delete(cmd, owner, bytes_of_cstr(x->vhost));
    case SETTING_USER_SET: {
        password_hash_format(&x->hash, hash);
        uint32_t n = auth_tag_names(x->tags, names);
        for (uint32_t t = 0; t < n; t++)
            tags[t] = bytes_of_cstr(names[t]);
        return map_cmd_user_set(cmd, owner, bytes_of_cstr(hash), tags, n);
    }
    case SETTING_USER_DELETE: return map_cmd_user_delete(cmd, owner);
    case SETTING_VHOST_DELETE: return map_cmd_vhost_delete(cmd, owner);
    }
    return E_SYNTAX;
}

static void apply_next(struct settings_apply *a);

static void on_applied(void *arg, int status, const struct map_change *change)
{
    struct settings_apply *a = arg;
    a->request = NULL;
    if (status != OK) {
        a->done(a->ctx, 503, "the cluster map is unavailable (no leader or no quorum)",
                a->next);
        return;
    }
    if (change->reply_code != REPLY_SUCCESS && !a->best_effort) {
        a->done(a->ctx, 400, change->reply_text, a->next);
        return;
    }
    if (change->reply_code != REPLY_SUCCESS)
        LOG_WARN("definitions import: undoing a change refused (%u): %s", change->reply_code,
                 change->reply_text);
    a->next++;
    apply_next(a);
}

static void apply_next(struct settings_apply *a)
{
    struct cluster_node *node = member_node_of(a->broker);
    while (a->next < a->list->count) {
        uint32_t n = a->list->count;
        const struct setting *x = &a->list->items[a->reverse ? n - 1 - a->next : a->next];
        if (a->undo != NULL)
            record_undo(a->broker, x, a->undo);
        if (node != NULL) {
            struct map_cmd cmd;
            ASSERT(command_of(x, &cmd) == OK); /* a few short strings */
            a->request = cluster_node_submit(node, &cmd, on_applied, a);
            return;
        }
        apply_here(a->broker, x);
        a->next++;
    }
    a->done(a->ctx, 204, NULL, a->next);
}

void settings_apply(struct settings_apply *a)
{
    a->next = 0;
    a->request = NULL;
    apply_next(a);
}
