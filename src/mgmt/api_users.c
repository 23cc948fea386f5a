/*
 * api_users.c: see api_users.h. Like api_policies.c, a change in a cluster
 * is submitted to the map and answered from the submit's callback; the
 * pending request is cancelled if its HTTP client goes away first.
 */
#include "mgmt/api_users.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/users.h"
#include "broker/vhost.h"
#include "cluster/map.h"
#include "cluster/node.h"
#include "cluster/member.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"
#include "mgmt/api.h"
#include "mgmt/api_change.h"
#include "mgmt/api_list.h"
#include "lib/json.h"
#include "lib/json_read.h"

#define NAME_SIZE_MAX 255
#define REGEX_SIZE_MAX 255

/* ---- answers ---------------------------------------------------------------- */

/* Refusals are logged with who asked and from where (issue 17). */
static void bad_request(struct http_call *call, const char *who, const char *reason)
{
    LOG_INFO("http peer=%s user=%s refused (400): %s", http_call_peer(call), who, reason);
    http_call_answer_error_as(call, 400, "bad_request", reason);
}

static const char *asker(const struct http_call_request *req)
{
    return req->user != NULL ? req->user->name : "?";
}

static void not_administrator(struct http_call *call)
{
    struct http_refusal refusal = {.status = 401, .error = "not_authorised",
                                   .reason = "Not administrator user"};
    http_call_answer_refusal(call, &refusal);
}

static void write_tags(struct json *out, unsigned tags)
{
    const char *names[4];
    uint32_t n = auth_tag_names(tags, names);
    json_key(out, "tags");
    json_array_begin(out);
    for (uint32_t i = 0; i < n; i++)
        json_string(out, names[i]);
    json_array_end(out);
}

static void write_user(struct json *out, const struct auth_user *u)
{
    char hash[PASSWORD_TEXT_MAX + 1];
    auth_user_hash_text(u, hash);
    json_object_begin(out);
    json_kv_string(out, "name", u->name);
    json_kv_string(out, "password_hash", hash);
    json_kv_string(out, "hashing_algorithm", auth_user_hash_algorithm(u));
    write_tags(out, u->tags);
    json_key(out, "limits");
    json_object_begin(out);
    json_object_end(out);
    json_object_end(out);
}

static void write_permission(struct json *out, const struct auth_user *u,
                             const struct auth_permission *p)
{
    json_object_begin(out);
    json_kv_string(out, "user", u->name);
    json_kv_string(out, "vhost", p->vhost);
    json_kv_string(out, "configure", p->texts[AUTH_PERMISSION_CONFIGURE]);
    json_kv_string(out, "write", p->texts[AUTH_PERMISSION_WRITE]);
    json_kv_string(out, "read", p->texts[AUTH_PERMISSION_READ]);
    json_object_end(out);
}

static bool only_vhost(const struct vhost *vhost, const void *ctx)
{
    return vhost == ctx;
}

/* RabbitMQ's sums of the vhost's queues' counts, as /api/overview's
 * queue_totals counts them (broker_queue_totals: in a cluster, what this
 * broker holds, its queues and stand-ins). Their rates are not kept per
 * vhost: no *_details. */
static void write_vhost_counts(struct json *out, struct broker *broker, struct bytes name)
{
    struct broker_queue_totals t = {0};
    struct vhost *vhost = broker_vhost(broker, name);
    if (vhost != NULL)
        broker_queue_totals(broker, only_vhost, vhost, &t);
    json_kv_uint(out, "messages", t.ready + t.unacked);
    json_kv_uint(out, "messages_ready", t.ready);
    json_kv_uint(out, "messages_unacknowledged", t.unacked);
}

static void write_vhost(struct json *out, struct broker *broker, struct bytes name)
{
    json_object_begin(out);
    json_key(out, "name");
    json_string_n(out, name.ptr, name.len);
    json_kv_string(out, "description", "");
    json_key(out, "tags");
    json_array_begin(out);
    json_array_end(out);
    json_kv_string(out, "default_queue_type", "undefined");
    json_key(out, "metadata");
    json_object_begin(out);
    json_kv_string(out, "description", "");
    json_key(out, "tags");
    json_array_begin(out);
    json_array_end(out);
    json_object_end(out);
    json_kv_bool(out, "tracing", false);
    write_vhost_counts(out, broker, name);
    json_object_end(out);
}

static void answer_json_user(struct http_call *call, const struct auth_user *u)
{
    struct json body;
    http_body_init(&body);
    write_user(&body, u);
    http_call_answer(call, 200, &body);
}

/* ---- the views ------------------------------------------------------------------ */

static void handle_whoami(void *ctx, const struct auth_user *user, struct json *out)
{
    (void)ctx;
    json_object_begin(out);
    json_kv_string(out, "name", user != NULL ? user->name : "");
    write_tags(out, user != NULL ? user->tags : 0);
    json_object_end(out);
}

/* The lists, as RabbitMQ 3.10 answers them: sorted (sort=, sort_reverse=)
 * and cut into columns=; only /api/vhosts is paged (its users,
 * permissions and policies lists ignore page=). RabbitMQ's default order
 * is (vhost, name): users by name, permissions by vhost (then user). */
#define PERMISSIONS_SORT "vhost,user"

/* A GET (or HEAD) of a list's bare path: false once answered 405. */
static bool list_read(struct http_call *call, const struct http_call_request *req)
{
    if (req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD)
        return true;
    http_call_answer_error(call, 405, "only GET and HEAD here");
    return false;
}

static void list_users(struct broker *broker, struct http_call *call,
                       const struct http_call_request *req)
{
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    for (size_t i = 0; i < broker->auth.users_count; i++) {
        if (!broker->auth.users[i]->internal) /* the broker's own login is nobody's */
            write_user(&body, broker->auth.users[i]);
    }
    json_array_end(&body);
    api_list_answer_whole(call, req, &body, "name");
}

static void list_permissions(struct broker *broker, struct http_call *call,
                             const struct http_call_request *req)
{
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    for (size_t i = 0; i < broker->auth.users_count; i++) {
        const struct auth_user *u = broker->auth.users[i];
        for (size_t j = 0; j < u->permissions_count; j++)
            write_permission(&body, u, &u->permissions[j]);
    }
    json_array_end(&body);
    api_list_answer_whole(call, req, &body, PERMISSIONS_SORT);
}

/* Those the user sees (every one for an administrator). */
static void list_vhosts(struct broker *broker, struct http_call *call,
                        const struct http_call_request *req)
{
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &e);) {
        const struct vhost *vhost = e->value;
        if (mgmt_user_sees_vhost(req->user, vhost->name))
            write_vhost(&body, broker, vhost->name);
    }
    json_array_end(&body);
    api_list_answer(call, req, &body, "name");
}

/* ---- paths ------------------------------------------------------------------------ */

/* One %-decoded path segment: 1..255 bytes, no NUL. */
struct segment {
    uint8_t bytes[NAME_SIZE_MAX + 1];
    struct bytes b;
};

static bool decode(const char *s, size_t size, struct segment *out)
{
    long n = http_percent_decode(s, size, out->bytes, NAME_SIZE_MAX, false);
    if (n <= 0 || memchr(out->bytes, 0, (size_t)n) != NULL)
        return false;
    out->bytes[n] = 0;
    out->b = (struct bytes){out->bytes, (uint32_t)n};
    return true;
}

/* rest as up to max segments split at '/'; returns how many, or 0 if one
 * does not decode or there are more. */
static int split_path(const char *rest, size_t size, struct segment *out, int max)
{
    int count = 0;
    while (count < max) {
        const char *slash = memchr(rest, '/', size);
        size_t first = slash ? (size_t)(slash - rest) : size;
        if (!decode(rest, first, &out[count++]))
            return 0;
        if (slash == NULL)
            return count;
        size -= first + 1;
        rest = slash + 1;
    }
    return 0;
}

/* ---- in a cluster: through the map ------------------------------------------------ */

/* One change waiting for its map command (api_change.h). */
struct pending {
    struct api_change change; /* first: the change frees the whole */
    struct broker *broker;
    int status;               /* 201 or 204 once applied */
    bool missing_is_bad;      /* a 404 from the map is RabbitMQ's 400 here */
    bool grant_creator;       /* vhost.put: then the creator's permission */
    char creator[NAME_SIZE_MAX + 1];
    char asker[NAME_SIZE_MAX + 1]; /* for the log of a refusal */
    struct segment vhost;
};

static void submit(struct pending *p, struct map_cmd *cmd);

static void on_applied(struct api_change *c, const struct map_change *change)
{
    struct pending *p = (struct pending *)c;
    if (change->reply_code == REPLY_NOT_FOUND && p->missing_is_bad) {
        bad_request(c->call, p->asker, "vhost_or_user_not_found");
    } else if (change->reply_code == REPLY_NOT_FOUND) {
        api_answer_not_found(c->call);
    } else if (change->reply_code != REPLY_SUCCESS) {
        bad_request(c->call, p->asker, change->reply_text);
    } else if (p->grant_creator) {
        /* RabbitMQ gives the vhost's creator full permissions on it. */
        p->grant_creator = false;
        const struct bytes full[3] = {BYTES_LIT(".*"), BYTES_LIT(".*"), BYTES_LIT(".*")};
        struct map_cmd cmd;
        int rc = map_cmd_permission_put(&cmd, bytes_of_cstr(p->creator), p->vhost.b, full);
        ASSERT(rc == OK); /* a few short strings */
        submit(p, &cmd);
        return;
    } else {
        http_call_answer_empty(c->call, p->status);
    }
    free(p);
}

static void submit(struct pending *p, struct map_cmd *cmd)
{
    p->vhost.b.ptr = p->vhost.bytes; /* the slice must point into p */
    api_change_submit(p->broker, &p->change, cmd);
}

/* A new pending change, or NULL (answered 503) if this broker cannot
 * propose yet. */
static struct pending *pending_new(struct broker *broker, struct http_call *call,
                                   const struct http_call_request *req, int status,
                                   struct map_cmd *cmd)
{
    if (!api_change_ready(broker, call, cmd))
        return NULL;
    struct pending *p = xcalloc(1, sizeof *p);
    *p = (struct pending){.change = {.call = call, .applied = on_applied}, .broker = broker,
                          .status = status};
    snprintf(p->asker, sizeof p->asker, "%s", asker(req));
    return p;
}

static void submit_simple(struct broker *broker, struct http_call *call,
                          const struct http_call_request *req, int status, struct map_cmd *cmd)
{
    struct pending *p = pending_new(broker, call, req, status, cmd);
    if (p != NULL)
        submit(p, cmd);
}

static const struct cluster_map *map_of(const struct broker *broker)
{
    const struct cluster_node *node = member_node_of(broker);
    return node != NULL ? cluster_node_map(node) : NULL;
}

/* ---- /api/users/{name} ------------------------------------------------------------- */

struct user_body {
    char password[JSON_READ_STRING_SIZE];
    size_t password_size;
    char hash[JSON_READ_STRING_SIZE];
    size_t hash_size;
    char algorithm[JSON_READ_STRING_SIZE];
    char tags[JSON_READ_STRING_SIZE];
    bool has_password, has_hash, has_algorithm, has_tags;
    bool ours; /* the error is the callback's (a wrong type), not the syntax's */
};

static bool copy_string(const struct json_read_member *m, char *out, size_t *size, bool *has)
{
    memcpy(out, m->string, m->string_size + 1);
    if (size != NULL)
        *size = m->string_size;
    *has = true;
    return true;
}

/* RabbitMQ ignores members it does not know; so do we. */
static bool on_user_member(void *ctx, const struct json_read_member *m, char *err,
                           size_t err_size)
{
    struct user_body *b = ctx;
    bool string = m->kind == JSON_READ_STRING;
    if (strcmp(m->key, "password") != 0 && memchr(m->string, 0, m->string_size) != NULL) {
        snprintf(err, err_size, "'%s' holds a NUL", m->key); /* only a password may */
        b->ours = true;
        return false;
    }
    if (strcmp(m->key, "tags") == 0 && (string || m->kind == JSON_READ_STRING_LIST))
        return copy_string(m, b->tags, NULL, &b->has_tags);
    if (strcmp(m->key, "password") == 0 && string)
        return copy_string(m, b->password, &b->password_size, &b->has_password);
    if (strcmp(m->key, "password_hash") == 0 && string)
        return copy_string(m, b->hash, &b->hash_size, &b->has_hash);
    if (strcmp(m->key, "hashing_algorithm") == 0 && string)
        return copy_string(m, b->algorithm, NULL, &b->has_algorithm);
    if (strcmp(m->key, "tags") == 0 || strcmp(m->key, "password") == 0 ||
        strcmp(m->key, "password_hash") == 0 || strcmp(m->key, "hashing_algorithm") == 0) {
        snprintf(err, err_size, "'%s' must be a string", m->key);
        b->ours = true;
        return false;
    }
    return true;
}

/* The password hash a PUT asks for into raw: 0, or -1 with the answer
 * given. An existing user without a new password keeps its own; a new
 * one gets random bytes nobody can log in with (RabbitMQ's user without
 * a password). */
static int user_hash(struct broker *broker, struct http_call *call, const char *who,
                     const struct user_body *b, const struct auth_user *existing,
                     struct password_hash *hash)
{
    static const struct password_policy sha256 = {.algorithm = PASSWORD_SHA256};
    if (b->has_password) {
        auth_hash_new(&broker->auth,
                      (struct bytes){(const uint8_t *)b->password, (uint32_t)b->password_size},
                      hash);
    } else if (b->has_hash) {
        if (b->has_algorithm && password_algorithm_parse(b->algorithm) < 0) {
            bad_request(call, who, "unknown hashing_algorithm (quay knows "
                                   "rabbit_password_hashing_sha256, "
                                   "rabbit_password_hashing_sha512, rabbit_password_hashing_md5, "
                                   "quay_password_hashing_pbkdf2_sha256)");
            return -1;
        }
        if (password_hash_parse(b->has_algorithm ? b->algorithm : NULL, b->hash, b->hash_size,
                                hash) != 0) {
            bad_request(call, who, "password_hash is not a hash of its hashing_algorithm "
                                   "(not_base64, another length, or PBKDF2 iterations outside "
                                   "1000..10000000)");
            return -1;
        }
    } else if (existing != NULL) {
        *hash = existing->password;
    } else {
        password_hash_random(&sha256, hash);
    }
    return 0;
}

/* Reads a PUT body into b and tags: 0, or -1 with the answer given. */
static int parse_user_body(struct http_call *call, const struct http_call_request *req,
                           struct user_body *b, unsigned *tags)
{
    memset(b, 0, sizeof *b);
    char err[256];
    if (json_read_object(req->body, req->body_size, on_user_member, b, err, sizeof err) != OK) {
        bad_request(call, asker(req), b->ours ? err : "not_json");
        return -1;
    }
    if (!b->has_tags) {
        bad_request(call, asker(req), "tags_not_present");
        return -1;
    }
    char bad[64], why[160];
    if (auth_parse_tags(b->tags, tags, bad, sizeof bad) != 0) {
        snprintf(why, sizeof why, "unknown tag '%s' (administrator, monitoring, policymaker, "
                 "management)", bad);
        bad_request(call, asker(req), why);
        return -1;
    }
    return 0;
}

static void put_user(struct broker *broker, struct http_call *call,
                     const struct http_call_request *req, const struct segment *name)
{
    struct user_body *b = xmalloc(sizeof *b);
    unsigned tags;
    struct password_hash raw;
    const struct auth_user *existing = auth_find_user(&broker->auth, name->b);
    int rc = parse_user_body(call, req, b, &tags);
    if (rc == 0)
        rc = user_hash(broker, call, asker(req), b, existing, &raw);
    OPENSSL_cleanse(b->password, sizeof b->password);
    free(b);
    if (rc != 0)
        return;
    const struct cluster_map *map = map_of(broker);
    if (map != NULL) {
        char hash[PASSWORD_TEXT_MAX + 1];
        password_hash_format(&raw, hash);
        const char *names[4];
        struct bytes tag_list[4];
        uint32_t n = auth_tag_names(tags, names);
        for (uint32_t i = 0; i < n; i++)
            tag_list[i] = bytes_of_cstr(names[i]);
        struct map_cmd cmd;
        int built = map_cmd_user_set(&cmd, name->b, bytes_of_cstr(hash), tag_list, n);
        ASSERT(built == OK);
        submit_simple(broker, call, req, cluster_map_user(map, name->b) ? 204 : 201, &cmd);
        return;
    }
    bool created;
    users_put(broker, name->b, &raw, tags, &created);
    LOG_INFO("user '%s' %s through the API", (const char *)name->bytes,
             created ? "created" : "changed");
    http_call_answer_empty(call, created ? 201 : 204);
}

static void delete_user(struct broker *broker, struct http_call *call,
                        const struct http_call_request *req, const struct segment *name)
{
    const struct cluster_map *map = map_of(broker);
    if (map != NULL) {
        if (cluster_map_user(map, name->b) == NULL) {
            api_answer_not_found(call);
            return;
        }
        struct map_cmd cmd;
        int built = map_cmd_user_delete(&cmd, name->b);
        ASSERT(built == OK);
        submit_simple(broker, call, req, 204, &cmd);
        return;
    }
    if (!users_delete(broker, name->b)) {
        api_answer_not_found(call);
        return;
    }
    http_call_answer_empty(call, 204);
}

static void answer_user_permissions(struct http_call *call, const struct http_call_request *req,
                                    const struct auth_user *u)
{
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    for (size_t j = 0; j < u->permissions_count; j++)
        write_permission(&body, u, &u->permissions[j]);
    json_array_end(&body);
    api_list_answer_whole(call, req, &body, PERMISSIONS_SORT);
}

/* /api/users, /api/users/{name} and /api/users/{name}/permissions */
static void handle_user(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    struct broker *broker = ctx;
    if (req->rest_size == 0) {
        if (list_read(call, req))
            list_users(broker, call, req);
        return;
    }
    struct segment path[2];
    int n = split_path(req->rest, req->rest_size, path, 2);
    bool read = req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD;
    if (n == 0 || (n == 2 && (!read || !bytes_equal_cstr(path[1].b, "permissions")))) {
        api_answer_not_found(call);
        return;
    }
    const struct auth_user *u = auth_find_user(&broker->auth, path[0].b);
    switch (req->method) {
    case HTTP_METHOD_GET:
    case HTTP_METHOD_HEAD:
        if (u == NULL)
            api_answer_not_found(call);
        else if (n == 2)
            answer_user_permissions(call, req, u);
        else
            answer_json_user(call, u);
        return;
    case HTTP_METHOD_PUT: put_user(broker, call, req, &path[0]); return;
    case HTTP_METHOD_DELETE: delete_user(broker, call, req, &path[0]); return;
    case HTTP_METHOD_POST: break;
    }
    http_call_answer_error(call, 405, "GET, PUT or DELETE a user");
}

/* ---- /api/vhosts/{name} ------------------------------------------------------------ */

static bool vhost_exists(struct broker *broker, struct bytes name)
{
    const struct cluster_map *map = map_of(broker);
    return map != NULL ? cluster_map_vhost(map, name) != NULL : broker_vhost(broker, name) != NULL;
}

static bool ignore_member(void *ctx, const struct json_read_member *m, char *err, size_t size)
{
    (void)ctx;
    (void)m;
    (void)err;
    (void)size;
    return true;
}

static void put_vhost(struct broker *broker, struct http_call *call,
                      const struct http_call_request *req, const struct segment *name)
{
    char err[128];
    /* Its settings (description, tags, default queue type) are RabbitMQ's
     * alone; the body only has to be an object when there is one. */
    if (req->body_size > 0 &&
        json_read_object(req->body, req->body_size, ignore_member, NULL, err, sizeof err) != OK) {
        bad_request(call, asker(req), "not_json");
        return;
    }
    if (vhost_exists(broker, name->b)) {
        http_call_answer_empty(call, 204);
        return;
    }
    const char *creator = req->user != NULL ? req->user->name : NULL;
    if (member_node_of(broker) != NULL) {
        struct map_cmd cmd;
        int built = map_cmd_vhost_put(&cmd, name->b);
        ASSERT(built == OK);
        struct pending *p = pending_new(broker, call, req, 201, &cmd);
        if (p == NULL)
            return;
        p->vhost = *name;
        p->grant_creator = creator != NULL;
        snprintf(p->creator, sizeof p->creator, "%s", creator != NULL ? creator : "");
        submit(p, &cmd);
        return;
    }
    users_vhost_put(broker, name->b);
    static const char *const full[AUTH_PERMISSION_KIND_COUNT] = {".*", ".*", ".*"};
    if (creator != NULL)
        users_permission_put(broker, bytes_of_cstr(creator), name->b, full, err, sizeof err);
    LOG_INFO("vhost '%s' created through the API", (const char *)name->bytes);
    http_call_answer_empty(call, 201);
}

static void delete_vhost(struct broker *broker, struct http_call *call,
                         const struct http_call_request *req, const struct segment *name)
{
    if (!vhost_exists(broker, name->b)) {
        api_answer_not_found(call);
        return;
    }
    if (member_node_of(broker) != NULL) {
        struct map_cmd cmd;
        int built = map_cmd_vhost_delete(&cmd, name->b);
        ASSERT(built == OK);
        submit_simple(broker, call, req, 204, &cmd);
        return;
    }
    users_vhost_delete(broker, name->b);
    http_call_answer_empty(call, 204);
}

/* GET /api/vhosts/{name}/permissions: every user's there. */
static void answer_vhost_permissions(struct broker *broker, struct http_call *call,
                                     const struct http_call_request *req, struct bytes vhost)
{
    struct json body;
    http_body_init(&body);
    json_array_begin(&body);
    for (size_t i = 0; i < broker->auth.users_count; i++) {
        const struct auth_user *u = broker->auth.users[i];
        const struct auth_permission *p = auth_user_permission(u, vhost);
        if (p != NULL)
            write_permission(&body, u, p);
    }
    json_array_end(&body);
    api_list_answer_whole(call, req, &body, PERMISSIONS_SORT);
}

static void handle_vhost(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    struct broker *broker = ctx;
    if (req->rest_size == 0) {
        if (list_read(call, req))
            list_vhosts(broker, call, req);
        return;
    }
    struct segment path[2]; /* name[, "permissions"] */
    int n = split_path(req->rest, req->rest_size, path, 2);
    const struct segment *name = &path[0];
    bool admin = req->user == NULL || auth_user_has_tag(req->user, AUTH_TAG_ADMINISTRATOR);
    bool read = req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD;
    if (n == 0 || (n == 2 && (!read || !bytes_equal_cstr(path[1].b, "permissions")))) {
        api_answer_not_found(call);
        return;
    }
    if (n == 2) {
        if (!admin)
            not_administrator(call);
        else if (!vhost_exists(broker, name->b))
            api_answer_not_found(call);
        else
            answer_vhost_permissions(broker, call, req, name->b);
        return;
    }
    switch (req->method) {
    case HTTP_METHOD_GET:
    case HTTP_METHOD_HEAD:
        if (!vhost_exists(broker, name->b) || !mgmt_user_sees_vhost(req->user, name->b)) {
            api_answer_not_found(call);
        } else {
            struct json body;
            http_body_init(&body);
            write_vhost(&body, broker, name->b);
            api_object_answer(call, req, &body);
        }
        return;
    case HTTP_METHOD_PUT:
    case HTTP_METHOD_DELETE:
        if (!admin)
            not_administrator(call);
        else if (req->method == HTTP_METHOD_PUT)
            put_vhost(broker, call, req, name);
        else
            delete_vhost(broker, call, req, name);
        return;
    case HTTP_METHOD_POST: break;
    }
    http_call_answer_error(call, 405, "GET, PUT or DELETE a vhost");
}

/* ---- /api/permissions/{vhost}/{user} ------------------------------------------------- */

struct permission_body {
    char texts[AUTH_PERMISSION_KIND_COUNT][JSON_READ_STRING_SIZE];
    bool has[AUTH_PERMISSION_KIND_COUNT];
    bool ours;
};

static bool on_permission_member(void *ctx, const struct json_read_member *m, char *err,
                                 size_t err_size)
{
    struct permission_body *b = ctx;
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
        if (strcmp(m->key, auth_permission_kind_name((enum auth_permission_kind)kind)) != 0)
            continue;
        if (m->kind != JSON_READ_STRING || m->string_size > REGEX_SIZE_MAX ||
            memchr(m->string, 0, m->string_size) != NULL) {
            snprintf(err, err_size, "'%s' must be a string of at most %d bytes, without NUL",
                     m->key, REGEX_SIZE_MAX);
            b->ours = true;
            return false;
        }
        memcpy(b->texts[kind], m->string, m->string_size + 1);
        b->has[kind] = true;
    }
    return true;
}

/* Reads and checks a PUT body: 0, or -1 with the answer given. */
static int parse_permission_body(struct http_call *call, const struct http_call_request *req,
                                 struct permission_body *b)
{
    memset(b, 0, sizeof *b);
    char err[256];
    if (json_read_object(req->body, req->body_size, on_permission_member, b, err,
                         sizeof err) != OK) {
        bad_request(call, asker(req), b->ours ? err : "not_json");
        return -1;
    }
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
        if (!b->has[kind]) {
            snprintf(err, sizeof err, "key_missing: %s",
                     auth_permission_kind_name((enum auth_permission_kind)kind));
            bad_request(call, asker(req), err);
            return -1;
        }
        char why[200];
        if (b->texts[kind][0] != '\0' && auth_regex_check(b->texts[kind], why, sizeof why) != 0) {
            snprintf(err, sizeof err, "invalid_regexp: %s", why);
            bad_request(call, asker(req), err);
            return -1;
        }
    }
    return 0;
}

static void put_permission(struct broker *broker, struct http_call *call,
                           const struct http_call_request *req, const struct segment *path)
{
    struct permission_body *b = xmalloc(sizeof *b);
    if (parse_permission_body(call, req, b) != 0) {
        free(b);
        return;
    }
    const struct auth_user *u = auth_find_user(&broker->auth, path[1].b);
    bool created = u == NULL || auth_user_permission(u, path[0].b) == NULL;
    const struct cluster_map *map = map_of(broker);
    if (map != NULL) {
        struct bytes regexes[3];
        for (int k = 0; k < 3; k++)
            regexes[k] = bytes_of_cstr(b->texts[k]);
        struct map_cmd cmd;
        int built = map_cmd_permission_put(&cmd, path[1].b, path[0].b, regexes);
        ASSERT(built == OK);
        free(b);
        struct pending *p = pending_new(broker, call, req, created ? 201 : 204, &cmd);
        if (p != NULL) {
            p->missing_is_bad = true;
            submit(p, &cmd);
        }
        return;
    }
    const char *texts[AUTH_PERMISSION_KIND_COUNT] = {b->texts[0], b->texts[1], b->texts[2]};
    char err[256];
    int rc = users_permission_put(broker, path[1].b, path[0].b, texts, err, sizeof err);
    free(b);
    if (rc == -2)
        bad_request(call, asker(req), "vhost_or_user_not_found");
    else if (rc < 0)
        bad_request(call, asker(req), err); /* checked above: cannot happen */
    else
        http_call_answer_empty(call, rc == 1 ? 201 : 204);
}

static void delete_permission(struct broker *broker, struct http_call *call,
                              const struct http_call_request *req, const struct segment *path)
{
    const struct auth_user *u = auth_find_user(&broker->auth, path[1].b);
    if (u == NULL || auth_user_permission(u, path[0].b) == NULL) {
        api_answer_not_found(call);
        return;
    }
    if (member_node_of(broker) != NULL) {
        struct map_cmd cmd;
        int built = map_cmd_permission_delete(&cmd, path[1].b, path[0].b);
        ASSERT(built == OK);
        submit_simple(broker, call, req, 204, &cmd);
        return;
    }
    users_permission_delete(broker, path[1].b, path[0].b);
    http_call_answer_empty(call, 204);
}

static void handle_permission(void *ctx, struct http_call *call,
                              const struct http_call_request *req)
{
    struct broker *broker = ctx;
    if (req->rest_size == 0) {
        if (list_read(call, req))
            list_permissions(broker, call, req);
        return;
    }
    struct segment path[2]; /* vhost, user */
    if (split_path(req->rest, req->rest_size, path, 2) != 2) {
        api_answer_not_found(call);
        return;
    }
    switch (req->method) {
    case HTTP_METHOD_GET:
    case HTTP_METHOD_HEAD: {
        const struct auth_user *u = auth_find_user(&broker->auth, path[1].b);
        const struct auth_permission *p = u ? auth_user_permission(u, path[0].b) : NULL;
        if (p == NULL) {
            api_answer_not_found(call);
            return;
        }
        struct json body;
        http_body_init(&body);
        write_permission(&body, u, p);
        http_call_answer(call, 200, &body);
        return;
    }
    case HTTP_METHOD_PUT: put_permission(broker, call, req, path); return;
    case HTTP_METHOD_DELETE: delete_permission(broker, call, req, path); return;
    case HTTP_METHOD_POST: break;
    }
    http_call_answer_error(call, 405, "GET, PUT or DELETE a permission");
}

void api_users_register(struct http_server *http, struct broker *broker)
{
    http_server_route_view(http, "/api/whoami", handle_whoami, broker, MGMT_ACCESS_MANAGEMENT);
    /* Trees: each bare path is its list (api_list.h's query parameters). */
    http_server_route_tree(http, "/api/users/", handle_user, broker, MGMT_ACCESS_ADMINISTRATOR);
    http_server_route_tree(http, "/api/vhosts/", handle_vhost, broker, MGMT_ACCESS_MANAGEMENT);
    http_server_route_tree(http, "/api/permissions/", handle_permission, broker,
                           MGMT_ACCESS_ADMINISTRATOR);
}
