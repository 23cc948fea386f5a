/*
 * ctl_rabbit.c: quayctl's verbs as rabbitmqctl and rabbitmq-diagnostics
 * name them, over RabbitMQ's API paths: list-queues, list-exchanges,
 * list-bindings, list-connections, list-channels and list-consumers with
 * their columns (a nested field by its dotted path: queue.name),
 * export-definitions and import-definitions, ping and await-startup.
 */
#include "cli/ctl_int.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/ctl_json.h"

/* ---- rabbitmqctl's verbs ------------------------------------------------------ */

static const char *const *default_columns(const char *name)
{
    static const char *const queues[] = {"name", "messages_ready", "messages_unacknowledged",
                                         "consumers", NULL};
    static const char *const exchanges[] = {"name", "type", NULL};
    static const char *const bindings[] = {"source", "destination_type", "destination",
                                           "routing_key", NULL};
    static const char *const connections[] = {"name", "user", "vhost", "channels", "state",
                                              NULL};
    /* rabbitmqctl's defaults, as the API names them (a channel's pid is
     * its name here, a consumer's channel_pid its channel's name). */
    static const char *const channels[] = {"name", "user", "consumer_count",
                                           "messages_unacknowledged", NULL};
    static const char *const consumers[] = {"queue.name", "channel_details.name",
                                            "consumer_tag", "ack_required", "prefetch_count",
                                            "active", NULL};
    return strcmp(name, "list-queues") == 0      ? queues
           : strcmp(name, "list-exchanges") == 0 ? exchanges
           : strcmp(name, "list-bindings") == 0  ? bindings
           : strcmp(name, "list-channels") == 0  ? channels
           : strcmp(name, "list-consumers") == 0 ? consumers
                                                 : connections;
}

/* list-*: the path with ?columns=..., and the table's columns (titles as
 * the API names them; right-aligned when every value is a number). */
static int build_list(const struct options *opt, char *path, size_t path_cap,
                      struct column *cols, size_t *ncols)
{
    const char *const *defaults = default_columns(opt->command->name);
    size_t n = 0;
    for (; n < LIST_COLUMNS_MAX; n++) {
        const char *key = opt->args_count ? (n < (size_t)opt->args_count ? opt->args[n] : NULL)
                                          : defaults[n];
        if (key == NULL)
            break;
        cols[n] = (struct column){key, key, false};
    }
    *ncols = n;
    snprintf(path, path_cap, "%s", opt->command->path);
    if (opt->vhost != NULL) {
        strcat(path, "/");
        if (!ctl__append_segment(path, path_cap, opt->vhost))
            return EXIT_USAGE;
    }
    size_t len = strlen(path);
    for (size_t i = 0; i < n; i++) {
        int w = snprintf(path + len, path_cap - len, "%s", i ? "," : "?columns=");
        if (w < 0 || (size_t)w >= path_cap - len ||
            !ctl__append_segment(path, path_cap, cols[i].key))
            return EXIT_USAGE;
        len = strlen(path);
    }
    return 0;
}

static void align_numbers(const struct jvalue *doc, struct column *cols, size_t ncols)
{
    for (size_t c = 0; c < ncols; c++) {
        bool numbers = doc && doc->child;
        for (const struct jvalue *e = doc ? doc->child : NULL; e; e = e->next) {
            const struct jvalue *v = jget_path(e, cols[c].key);
            numbers = numbers && v && v->type == J_NUMBER;
        }
        cols[c].right = numbers;
    }
}

int ctl__run_list(const struct options *opt, const char *authorization)
{
    char path[2048];
    struct column cols[LIST_COLUMNS_MAX];
    size_t ncols;
    if (build_list(opt, path, sizeof path, cols, &ncols) != 0) {
        fprintf(stderr, "quayctl: %s: the columns are too long\n", opt->command->name);
        return EXIT_USAGE;
    }
    struct buffer in = {0};
    struct response res;
    int rc = ctl__http_request(&opt->endpoint, "GET", path, NULL, authorization, opt->timeout_ms,
                               &in, &res);
    if (rc == 0 && !opt->json && res.status == 200) {
        const char *error = NULL;
        struct jvalue *doc = json_parse(res.body, res.body_size, &error);
        align_numbers(doc, cols, ncols);
        struct command cmd = *opt->command;
        cmd.columns = cols, cmd.columns_count = ncols;
        jfree(doc);
        rc = ctl__show(&cmd, &res, false);
    } else if (rc == 0) {
        rc = ctl__show(opt->command, &res, opt->json);
    }
    free(in.data);
    return rc;
}

/* Reads a whole file (at most the API's 16 MiB); NULL on failure (printed). */
static char *read_file(const char *name)
{
    FILE *f = strcmp(name, "-") == 0 ? stdin : fopen(name, "rb");
    char *data = NULL;
    size_t size = 0, cap = 0, n;
    if (f == NULL) {
        fprintf(stderr, "quayctl: cannot read %s: %s\n", name, strerror(errno));
        return NULL;
    }
    do {
        if (size + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 131072;
            data = realloc(data, cap);
            if (!data)
                abort();
        }
        n = fread(data + size, 1, cap - size - 1, f);
        size += n;
    } while (n > 0 && size <= (16u << 20));
    bool bad = ferror(f) || size > (16u << 20) || memchr(data, '\0', size) != NULL;
    if (f != stdin)
        fclose(f);
    if (bad) {
        fprintf(stderr, "quayctl: %s: unreadable, over 16 MiB, or not text\n", name);
        free(data);
        return NULL;
    }
    data[size] = '\0';
    return data;
}

int ctl__run_definitions(const struct options *opt, const char *authorization)
{
    bool import = strcmp(opt->command->name, "import-definitions") == 0;
    const char *file = opt->args[0];
    char *body = import ? read_file(file) : NULL;
    if (import && body == NULL)
        return EXIT_DATAERR;
    struct buffer in = {0};
    struct response res;
    int rc = ctl__http_request(&opt->endpoint, opt->command->method, opt->command->path, body,
                               authorization, opt->timeout_ms, &in, &res);
    free(body);
    if (rc == 0 && import && res.status == 204) {
        fprintf(stderr, "quayctl: imported %s\n", file);
    } else if (rc == 0 && !import && res.status == 200) {
        FILE *f = strcmp(file, "-") == 0 ? stdout : fopen(file, "wb");
        bool ok = f != NULL && fwrite(res.body, 1, res.body_size, f) == res.body_size;
        ok = (f == stdout ? fflush(f) == 0 : f != NULL && fclose(f) == 0) && ok;
        if (!ok) {
            fprintf(stderr, "quayctl: cannot write %s: %s\n", file, strerror(errno));
            rc = EXIT_DATAERR;
        }
    } else if (rc == 0) {
        rc = ctl__show(opt->command, &res, false); /* the refusal, with its reason */
    }
    free(in.data);
    return rc;
}

/* ping: one try. await-startup: tries until the API answers 200 or the
 * timeout passes (a broker still starting refuses the connection). */
int ctl__run_probe(const struct options *opt, const char *authorization)
{
    bool wait = strcmp(opt->command->name, "await-startup") == 0;
    int64_t deadline = ctl__now_ms() + opt->timeout_ms;
    for (;;) {
        struct buffer in = {0};
        struct response res;
        struct options once = *opt;
        once.timeout_ms = (int)(deadline - ctl__now_ms() > 1000 ? 1000 : deadline - ctl__now_ms());
        if (once.timeout_ms <= 0)
            once.timeout_ms = 1;
        ctl__quiet_connect = wait && deadline - ctl__now_ms() > 1200;
        int rc = ctl__http_request(&once.endpoint, "GET", opt->command->path, NULL, authorization,
                                   once.timeout_ms, &in, &res);
        if (rc == 0 && res.status != 200) {
            rc = ctl__show(opt->command, &res, false);
        } else if (rc == 0) {
            if (opt->json)
                rc = ctl__show(opt->command, &res, true);
            else
                printf("%s\n", wait ? "the broker is up" : "Ping succeeded");
        }
        free(in.data);
        if (rc != EXIT_UNAVAILABLE || !wait || ctl__now_ms() >= deadline)
            return rc;
        usleep(200 * 1000);
    }
}
