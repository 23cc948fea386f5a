/*
 * ctl_users.c: quayctl's commands on users, vhosts and permissions
 * (add-user, delete-user, change-password, set-user-tags, add-vhost,
 * delete-vhost, set-permissions, clear-permissions) and on vhost and user
 * limits (set-/clear-vhost-limits, set-/clear-user-limits): their paths
 * and JSON bodies, and the GET a change of one user field needs first.
 */
#include "cli/ctl_int.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/ctl_json.h"

/* ---- users, vhosts and permissions ------------------------------------------ */

bool ctl__is_user_command(const struct command *cmd)
{
    return strcmp(cmd->method, "GET") != 0 &&
           (strcmp(cmd->path, "/api/users/") == 0 || strcmp(cmd->path, "/api/vhosts/") == 0 ||
            strcmp(cmd->path, "/api/permissions/") == 0);
}

/* Appends ", \"key\": value" (or the first member, after "{"). */
static bool append_member(char *body, size_t cap, const char *key, const char *value)
{
    size_t n = strlen(body);
    int w = snprintf(body + n, cap - n, "%s\"%s\": ", n > 1 ? ", " : "", key);
    return w > 0 && (size_t)w < cap - n && ctl__append_json_string(body, cap, value);
}

/* The user's tags ("a,b") and password hash as the API has them now:
 * change-password keeps the one, set-user-tags the other. */
static int fetch_user(const struct options *opt, const char *authorization, const char *path,
                      char *tags, size_t tags_cap, char *hash, size_t hash_cap)
{
    struct buffer in = {0};
    struct response res;
    int rc = ctl__http_request(&opt->endpoint, "GET", path, NULL, authorization, opt->timeout_ms,
                               &in, &res);
    struct jvalue *doc = NULL;
    if (rc == 0 && res.status != 200) {
        const struct command get = {opt->command->name, "GET", path, NULL, 0, 0, 0};
        rc = ctl__show(&get, &res, false);
    } else if (rc == 0) {
        const char *error = NULL;
        doc = json_parse(res.body, res.body_size, &error);
        const struct jvalue *t = jget(doc, "tags"), *h = jget(doc, "password_hash");
        char *joined = ctl__cell_text(t);
        snprintf(tags, tags_cap, "%s", strcmp(joined, "-") == 0 ? "" : joined);
        free(joined);
        snprintf(hash, hash_cap, "%s", h && h->type == J_STRING ? h->text : "");
        if (t == NULL || hash[0] == '\0') {
            fprintf(stderr, "quayctl: GET %s: unexpected JSON shape\n", path);
            rc = EXIT_PROTOCOL;
        }
    }
    jfree(doc);
    free(in.data);
    return rc;
}

/* The PUT or DELETE of a user, vhost or permission command: its path and
 * body. Returns 0 or an exit status (printed). */
int ctl__build_user_request(const struct options *opt, const char *authorization, char *path,
                            size_t path_cap, char *body, size_t body_cap)
{
    const char *name = opt->command->name;
    char *const *args = opt->args;
    snprintf(path, path_cap, "%s", opt->command->path);
    if (strcmp(opt->command->path, "/api/permissions/") == 0 &&
        (!ctl__append_segment(path, path_cap, opt->vhost ? opt->vhost : "/") ||
         strlen(path) + 2 >= path_cap || !strcat(path, "/")))
        goto too_long;
    if (!ctl__append_segment(path, path_cap, args[0]))
        goto too_long;
    snprintf(body, body_cap, "{");
    bool ok = true;
    if (strcmp(name, "set-permissions") == 0) {
        ok = append_member(body, body_cap, "configure", args[1]) &&
             append_member(body, body_cap, "write", args[2]) &&
             append_member(body, body_cap, "read", args[3]);
    } else if (strcmp(name, "add-user") == 0) {
        ok = append_member(body, body_cap, "password", args[1]) &&
             append_member(body, body_cap, "tags", opt->tags ? opt->tags : "");
    } else if (strcmp(name, "change-password") == 0 || strcmp(name, "set-user-tags") == 0) {
        char tags[1024], hash[256];
        int rc = fetch_user(opt, authorization, path, tags, sizeof tags, hash, sizeof hash);
        if (rc != 0)
            return rc;
        bool password = strcmp(name, "change-password") == 0;
        if (!password) { /* the tags are the arguments after NAME */
            tags[0] = '\0';
            for (int i = 1; i < opt->args_count; i++)
                snprintf(tags + strlen(tags), sizeof tags - strlen(tags), "%s%s",
                         i > 1 ? "," : "", args[i]);
        }
        /* The hash as it is, in whichever form: the broker tells the form
         * from the text (broker/password.h). */
        ok = password ? append_member(body, body_cap, "password", args[1])
                      : append_member(body, body_cap, "password_hash", hash);
        ok = ok && append_member(body, body_cap, "tags", tags);
    }
    if (!ok || strlen(body) + 2 >= body_cap)
        goto too_long;
    strcat(body, "}");
    return 0;
too_long:
    fprintf(stderr, "quayctl: %s: an argument is too long\n", name);
    return EXIT_USAGE;
}

/* ---- vhost and user limits --------------------------------------------------- */

/* The limit names of set-*-limits' JSON object (NAME: integer) into
 * names[] and values[]; returns how many, or -1 (printed). */
static int limits_of(const char *command, const struct jvalue *doc, const char **names,
                     const char **values, int cap)
{
    int n = 0;
    bool bad = doc == NULL || doc->type != J_OBJECT || doc->child == NULL;
    for (const struct jvalue *m = bad ? NULL : doc->child; m; m = m->next) {
        if (m->type != J_NUMBER || strlen(m->text) > 20 || n == cap) {
            bad = true;
            break;
        }
        names[n] = m->key;
        values[n++] = m->text;
    }
    if (bad) {
        fprintf(stderr, "quayctl: %s: the limits are a JSON object of integers, such as "
                "'{\"max-connections\": 10}'\n", command);
        return -1;
    }
    return n;
}

/* set-vhost-limits [-p V] JSON and set-user-limits USER JSON: one PUT per
 * limit; clear-vhost-limits [-p V] and clear-user-limits USER NAME|all:
 * one DELETE per limit (a DELETE of no limit is 204). */
int ctl__run_limits(const struct options *opt, const char *authorization)
{
    const char *command = opt->command->name;
    bool vhost = strstr(command, "vhost") != NULL;
    bool set = strncmp(command, "set-", 4) == 0;
    char base[1024];
    snprintf(base, sizeof base, "%s", opt->command->path);
    const char *owner = vhost ? (opt->vhost ? opt->vhost : "/") : opt->args[0];
    if (!ctl__append_segment(base, sizeof base, owner) || strlen(base) + 2 >= sizeof base) {
        fprintf(stderr, "quayctl: %s: an argument is too long\n", command);
        return EXIT_USAGE;
    }
    strcat(base, "/");
    const char *names[4] = {"max-connections", vhost ? "max-queues" : "max-channels"};
    const char *values[4] = {NULL, NULL};
    int n = 2;
    struct jvalue *doc = NULL;
    if (set) {
        const char *text = opt->args[vhost ? 0 : 1], *error = NULL;
        doc = json_parse(text, strlen(text), &error);
        n = limits_of(command, doc, names, values, 4);
    } else if (!vhost && strcmp(opt->args[1], "all") != 0) {
        names[0] = opt->args[1];
        n = 1;
    }
    int rc = n < 0 ? EXIT_USAGE : 0;
    for (int i = 0; i < n && rc == 0; i++) {
        char path[2048], body[64] = "";
        snprintf(path, sizeof path, "%s", base);
        if (!ctl__append_segment(path, sizeof path, names[i])) {
            fprintf(stderr, "quayctl: %s: an argument is too long\n", command);
            rc = EXIT_USAGE;
            break;
        }
        if (set)
            snprintf(body, sizeof body, "{\"value\": %s}", values[i]);
        struct buffer in = {0};
        struct response res;
        rc = ctl__http_request(&opt->endpoint, opt->command->method, path, set ? body : NULL,
                               authorization, opt->timeout_ms, &in, &res);
        if (rc == 0)
            rc = ctl__show(opt->command, &res, opt->json);
        free(in.data);
    }
    jfree(doc);
    return rc;
}

/* Where an option that takes a string goes, or NULL if a is none. */
