/*
 * ctl.c: quayctl, the admin tool. It asks a running quayd's management
 * API (quayd --http ADDR:PORT, or --https) with one blocking HTTP request
 * over a plain socket, or over TLS with OpenSSL, and prints the answer:
 * the JSON as it came with --json, else a table for people.
 *
 * It owns nothing beyond the process; it changes broker state only
 * through the API's own verbs (leave, forget, set-policy, clear-policy) and links
 * none of the broker's code (no libuv), so it runs anywhere the socket
 * reaches. It logs in with HTTP Basic: --user/--password, else the
 * environment's QUAY_USER/QUAY_PASSWORD, else guest/guest (the default
 * broker's administrator, from loopback). Exit codes follow sysexits.h,
 * as rabbitmqctl's do: 0 done, 64 usage, 69 the broker is unreachable,
 * 76 a bad or non-200 answer, 77 the login or its rights were refused.
 *
 * Here: main, the options and credentials, the command table, printing
 * (tables and key/value pairs), and the broker, cluster and policy
 * commands. The HTTP request is ctl_http.c's; the user, vhost, permission
 * and limit commands are ctl_users.c's; rabbitmqctl's verbs ctl_rabbit.c's;
 * the JSON reader ctl_json.c's. What they share is in ctl_int.h.
 */
#include "cli/ctl_int.h"

#include <ctype.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/ctl_json.h"
#include "lib/base64.h"

#define DEFAULT_HTTP "127.0.0.1:15672"
#define DEFAULT_USER "guest" /* and its password: quayd's default user */
#define CREDENTIALS_SIZE_MAX 1024 /* user:password, as quayd takes them */
#define DEFAULT_TIMEOUT_MS 10000

/* usage(): the commands of one broker and its cluster. */
static const char usage_head[] =
    "usage: quayctl [--http HOST:PORT | --https HOST:PORT [--cacert FILE]]\n"
    "               [--user NAME] [--password PW] [--json] [--timeout SECONDS]\n"
    "               COMMAND [ARGS]\n"
    "\n"
    "Asks a running quayd (started with --http) through its management API.\n"
    "\n"
    "commands:\n"
    "  status        the broker: version, uptime, totals, alarms (GET /api/overview)\n"
    "  queues        every queue with its message counts (GET /api/queues)\n"
    "  connections   every client connection (GET /api/connections)\n"
    "  cluster       the cluster: leader, map epoch, brokers (GET /api/cluster)\n"
    "  leave         this broker leaves the cluster (POST /api/cluster/leave)\n"
    "  forget BROKER a broker that is down for good leaves the map: its queues\n"
    "                go to their backups (or start again empty where it had\n"
    "                the only copy), its backups and exchanges elsewhere\n"
    "                (POST /api/cluster/forget)\n"
    "  drain BROKER  every queue BROKER is primary or backup of moves to other\n"
    "                brokers while they serve; then it may leave\n"
    "                (POST /api/cluster/drain)\n"
    "  revive BROKER a draining broker takes queues again (POST\n"
    "                /api/cluster/revive)\n"
    "  rebalance [on|off]\n"
    "                without an argument: move queues until every broker holds\n"
    "                its share; on/off: keep doing so automatically, or stop\n"
    "                (POST /api/cluster/rebalance)\n"
    "  offload BROKER --to BROKER (--fraction F | --queues REGEX [--vhost V])\n"
    "                move a fraction F (0..1] of the queues BROKER is primary\n"
    "                of, or those whose names match REGEX, to the --to broker\n"
    "                while they serve (POST /api/cluster/offload)\n"
    "  move QUEUE --to BROKER [--vhost VHOST] [--backup-of B]\n"
    "                hand QUEUE (of VHOST, default /) over to BROKER while it\n"
    "                serves: BROKER catches up as a backup, then takes over;\n"
    "                with --backup-of, BROKER replaces the queue's backup B once\n"
    "                caught up; 'cluster' shows the moves in progress\n"
    "                (POST /api/cluster/move)\n";

/* usage(): replication policies. */
static const char usage_policies[] =
    "  policies      every replication policy (GET /api/policies)\n"
    "  set-policy VHOST NAME PATTERN BACKUPS [PRIORITY]\n"
    "                queues of VHOST whose name matches the regular expression\n"
    "                PATTERN get BACKUPS backups (0..3) unless their x-quay-backups\n"
    "                says otherwise; the highest PRIORITY (default 0) wins\n"
    "                (PUT /api/policies/VHOST/NAME)\n"
    "  clear-policy VHOST NAME   (DELETE /api/policies/VHOST/NAME)\n";

/* usage(): users, vhosts and permissions. */
static const char usage_users[] =
    "  list-users    every user and its tags (GET /api/users)\n"
    "  add-user NAME PASSWORD [--tags TAG,...]   (PUT /api/users/NAME)\n"
    "  delete-user NAME   its connections are closed (DELETE /api/users/NAME)\n"
    "  change-password NAME PASSWORD   its tags stay\n"
    "  set-user-tags NAME [TAG...]   its password stays (none: no tags)\n"
    "  list-vhosts   (GET /api/vhosts)\n"
    "  add-vhost NAME / delete-vhost NAME   deleting one deletes its queues,\n"
    "                exchanges and permissions and closes its connections\n"
    "  list-permissions [-p VHOST]   every user's permissions, in every vhost or\n"
    "                in VHOST (GET /api/permissions, /api/vhosts/VHOST/permissions)\n"
    "  set-permissions [-p VHOST] USER CONFIGURE WRITE READ   three regular\n"
    "                expressions (\"\" matches nothing); VHOST defaults to /\n"
    "  clear-permissions [-p VHOST] USER\n"
    "  set-vhost-limits [-p VHOST] '{\"max-connections\": N, \"max-queues\": N}'\n"
    "                one or both (negative: no limit; PUT /api/vhost-limits/VHOST/NAME)\n"
    "  clear-vhost-limits [-p VHOST]   both\n"
    "  set-user-limits USER '{\"max-connections\": N, \"max-channels\": N}'\n"
    "  clear-user-limits USER NAME|all\n"
    "  list-vhost-limits [-p VHOST] / list-user-limits   (GET /api/vhost-limits ...)\n"
    "\n";

/* usage(): as rabbitmqctl names them. */
static const char usage_rabbit[] =
    "  as rabbitmqctl and rabbitmq-diagnostics name them (RabbitMQ's API paths):\n"
    "  list-queues [COLUMN...]       default: name messages_ready\n"
    "                                messages_unacknowledged consumers\n"
    "  list-exchanges [COLUMN...]    default: name type\n"
    "  list-bindings [COLUMN...]     default: source destination_type destination\n"
    "                                routing_key\n"
    "  list-connections [COLUMN...]  default: name user vhost channels state\n"
    "  list-channels [COLUMN...]     default: name user consumer_count\n"
    "                                messages_unacknowledged\n"
    "  list-consumers [COLUMN...]    default: queue.name channel_details.name\n"
    "                                consumer_tag ack_required prefetch_count active\n"
    "                (COLUMN: any field of the API's objects, a nested one by its\n"
    "                 dotted path; --vhost V: one vhost)\n"
    "  cluster-status                every broker: name, running, state (GET /api/nodes)\n"
    "  export-definitions FILE       RabbitMQ's definitions JSON to FILE (- = stdout)\n"
    "  import-definitions FILE       apply a definitions file (all or nothing)\n"
    "  await-startup                 wait (up to --timeout) until the API answers\n"
    "  ping                          is the broker up? (GET /api/healthchecks/node)\n"
    "\n";

/* usage(): the options and exit statuses. */
static const char usage_options[] =
    "options:\n"
    "  --http HOST:PORT   the API's address (default " DEFAULT_HTTP "); [V6]:PORT\n"
    "  --https HOST:PORT  the API over TLS (quayd --https); its certificate must\n"
    "                     verify and name HOST\n"
    "  --cacert FILE      PEM CAs to verify it with (default: the system's)\n"
    "  --user NAME        log in as NAME (default: $QUAY_USER, else " DEFAULT_USER ")\n"
    "  --password PW      its password (default: $QUAY_PASSWORD; " DEFAULT_USER "'s\n"
    "                     when no user is given either);\n"
    "                     prefer the variable: other users can see a command line\n"
    "  --json             print the API's JSON as it is\n"
    "  --timeout SECONDS  give up after this long (default 10)\n"
    "  --help             this text\n"
    "\n"
    "The user needs a management tag on the broker (administrator for leave and\n"
    "forget, policymaker for set-policy and clear-policy, monitoring for cluster,\n"
    "administrator for the user, vhost and permission commands).\n"
    "\n"
    "exit status: 0 done, 64 usage, 65 a file that cannot be read or written,\n"
    "69 broker unreachable (or not started within --timeout), 76 bad answer\n"
    "(a definitions file refused too), 77 login or right refused\n";

static void usage(FILE *out)
{
    fputs(usage_head, out);
    fputs(usage_policies, out);
    fputs(usage_users, out);
    fputs(usage_rabbit, out);
    fputs(usage_options, out);
}

/* ---- printing ---------------------------------------------------------- */

/* A value as one table cell: control characters shown as '?', so a name
 * cannot break the table or the terminal. Returns a new string. */
char *ctl__cell_text(const struct jvalue *v)
{
    const char *s = "-";
    char joined[1024];
    if (v && (v->type == J_STRING || v->type == J_NUMBER)) {
        s = v->text;
    } else if (v && v->type == J_BOOL) {
        s = v->boolean ? "yes" : "no";
    } else if (v && v->type == J_ARRAY) {
        size_t n = 0;
        joined[0] = '\0';
        for (const struct jvalue *e = v->child; e; e = e->next) {
            const char *t = e->text ? e->text : "?";
            n += (size_t)snprintf(joined + n, sizeof joined - n, "%s%s", n ? "," : "", t);
            if (n >= sizeof joined)
                break;
        }
        s = n ? joined : "-";
    } else if (v && v->type == J_OBJECT) { /* {"max-queues": 4} -> max-queues=4 */
        size_t n = 0;
        joined[0] = '\0';
        for (const struct jvalue *e = v->child; e; e = e->next) {
            n += (size_t)snprintf(joined + n, sizeof joined - n, "%s%s=%s", n ? "," : "",
                                  e->key, e->text ? e->text : "?");
            if (n >= sizeof joined)
                break;
        }
        s = n ? joined : "-";
    }
    char *out = strdup(s);
    if (!out)
        abort();
    for (char *p = out; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    }
    return out;
}

/* Display width: UTF-8 code points (every one taken as one column). */
static size_t text_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static void print_cell(const char *text, size_t width, bool right, bool last)
{
    size_t w = text_width(text);
    size_t pad = width > w ? width - w : 0;
    if (right)
        printf("%*s%s", (int)pad, "", text);
    else
        printf("%s%*s", text, last ? 0 : (int)pad, "");
    fputs(last ? "\n" : "  ", stdout);
}

static int compare_rows(const void *a, const void *b)
{
    char *const *ra = a, *const *rb = b;
    int c = strcmp(ra[0], rb[0]);
    return c ? c : strcmp(ra[1], rb[1]);
}

/* An array of objects as an aligned table, sorted by its first two
 * columns (the API lists in table order). */
static int print_table(const struct jvalue *array, const struct column *cols, size_t ncols)
{
    if (!array || array->type != J_ARRAY)
        return -1;
    size_t nrows = 0;
    for (const struct jvalue *e = array->child; e; e = e->next)
        nrows++;
    char **cells = calloc((nrows + 1) * ncols, sizeof *cells);
    size_t *width = calloc(ncols, sizeof *width);
    if (!cells || !width)
        abort();
    size_t r = 0;
    for (const struct jvalue *e = array->child; e; e = e->next, r++) {
        for (size_t c = 0; c < ncols; c++)
            cells[r * ncols + c] = ctl__cell_text(jget_path(e, cols[c].key));
    }
    qsort(cells, nrows, ncols * sizeof *cells, compare_rows);
    for (size_t c = 0; c < ncols; c++) {
        width[c] = text_width(cols[c].title);
        for (r = 0; r < nrows; r++) {
            size_t w = text_width(cells[r * ncols + c]);
            width[c] = w > width[c] ? w : width[c];
        }
    }
    for (size_t c = 0; c < ncols; c++)
        print_cell(cols[c].title, width[c], cols[c].right, c + 1 == ncols);
    for (r = 0; r < nrows; r++) {
        for (size_t c = 0; c < ncols; c++)
            print_cell(cells[r * ncols + c], width[c], cols[c].right, c + 1 == ncols);
    }
    for (size_t i = 0; i < nrows * ncols; i++)
        free(cells[i]);
    free(cells);
    free(width);
    return 0;
}

/* An object as "key  value" lines, nested objects flattened with dots. */
static void collect_pairs(const struct jvalue *object, const char *prefix, char ***pairs,
                          size_t *count)
{
    for (const struct jvalue *m = object->child; m; m = m->next) {
        char key[256];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", m->key);
        if (m->type == J_OBJECT) {
            collect_pairs(m, key, pairs, count);
            continue;
        }
        if (m->type == J_ARRAY && m->child && m->child->type == J_OBJECT)
            continue; /* a table of its own (print_object_arrays) */
        char **grown = realloc(*pairs, (*count + 2) * sizeof **pairs);
        if (!grown)
            abort();
        *pairs = grown;
        grown[(*count)++] = strdup(key);
        grown[(*count)++] = ctl__cell_text(m);
    }
}

/* Arrays of objects (a cluster's brokers, its moves) as tables after the
 * pairs, titled by their keys, with the first element's scalar members as
 * columns. */
static void print_object_arrays(const struct jvalue *object, const char *prefix)
{
    for (const struct jvalue *m = object->child; m; m = m->next) {
        char key[256];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", m->key);
        if (m->type == J_OBJECT) {
            print_object_arrays(m, key);
            continue;
        }
        if (m->type != J_ARRAY || !m->child || m->child->type != J_OBJECT)
            continue;
        struct column cols[32];
        char titles[32][64];
        size_t ncols = 0;
        for (const struct jvalue *f = m->child->child; f && ncols < 32; f = f->next) {
            if (f->type == J_OBJECT || (f->type == J_ARRAY && f->child &&
                                        f->child->type == J_OBJECT))
                continue;
            size_t i = 0;
            for (; f->key[i] && i + 1 < sizeof titles[0]; i++)
                titles[ncols][i] = (char)toupper((unsigned char)f->key[i]);
            titles[ncols][i] = '\0';
            cols[ncols] = (struct column){f->key, titles[ncols], f->type == J_NUMBER};
            ncols++;
        }
        printf("\n%s:\n", key);
        print_table(m, cols, ncols);
    }
}

static int print_pairs(const struct jvalue *object)
{
    if (!object || object->type != J_OBJECT)
        return -1;
    char **pairs = NULL;
    size_t count = 0, width = 0;
    collect_pairs(object, "", &pairs, &count);
    for (size_t i = 0; i < count; i += 2) {
        size_t w = text_width(pairs[i]);
        width = w > width ? w : width;
    }
    for (size_t i = 0; i < count; i += 2) {
        print_cell(pairs[i], width, false, false);
        print_cell(pairs[i + 1], 0, false, true);
        free(pairs[i]);
        free(pairs[i + 1]);
    }
    free(pairs);
    print_object_arrays(object, "");
    return 0;
}

/* ---- commands ---------------------------------------------------------- */

static const struct column queue_columns[] = {
    {"vhost", "VHOST", false},       {"name", "NAME", false},
    {"messages_ready", "READY", true}, {"messages_unacknowledged", "UNACKED", true},
    {"consumers", "CONSUMERS", true}, {"paged", "PAGED", true},
    {"durable", "DURABLE", false},   {"exclusive", "EXCLUSIVE", false},
    {"auto_delete", "AUTO_DELETE", false}, {"primary", "PRIMARY", false},
};

static const struct column connection_columns[] = {
    {"peer", "PEER", false},         {"user", "USER", false},
    {"vhost", "VHOST", false},       {"channels", "CHANNELS", true},
    {"state", "STATE", false},
};

static const struct column user_columns[] = {
    {"name", "NAME", false}, {"tags", "TAGS", false},
};

static const struct column vhost_columns[] = {
    {"name", "NAME", false},
};

static const struct column permission_columns[] = {
    {"user", "USER", false},         {"vhost", "VHOST", false},
    {"configure", "CONFIGURE", false}, {"write", "WRITE", false},
    {"read", "READ", false},
};

static const struct column vhost_limit_columns[] = {
    {"vhost", "VHOST", false}, {"value", "LIMITS", false},
};

static const struct column user_limit_columns[] = {
    {"user", "USER", false}, {"value", "LIMITS", false},
};

static const struct column policy_columns[] = {
    {"vhost", "VHOST", false},       {"name", "NAME", false},
    {"pattern", "PATTERN", false},   {"priority", "PRIORITY", true},
    {"backups", "BACKUPS", true},
};

static const struct column node_columns[] = {
    {"name", "NAME", false}, {"running", "RUNNING", false}, {"state", "STATE", false},
    {"queues_owned", "PRIMARIES", true}, {"backups_held", "BACKUPS", true},
};

static const struct command commands[] = {
    {"status", "GET", "/api/overview", NULL, 0, 0, 0},
    {"cluster", "GET", "/api/cluster", NULL, 0, 0, 0},
    {"queues", "GET", "/api/queues", queue_columns,
     sizeof queue_columns / sizeof queue_columns[0], 0, 0},
    {"connections", "GET", "/api/connections", connection_columns,
     sizeof connection_columns / sizeof connection_columns[0], 0, 0},
    {"leave", "POST", "/api/cluster/leave", NULL, 0, 0, 0},
    {"forget", "POST", "/api/cluster/forget", NULL, 0, 1, 1},
    {"move", "POST", "/api/cluster/move", NULL, 0, 1, 1},
    {"drain", "POST", "/api/cluster/drain", NULL, 0, 1, 1},
    {"revive", "POST", "/api/cluster/revive", NULL, 0, 1, 1},
    {"offload", "POST", "/api/cluster/offload", NULL, 0, 1, 1},
    {"rebalance", "POST", "/api/cluster/rebalance", NULL, 0, 0, 1},
    {"policies", "GET", "/api/policies", policy_columns,
     sizeof policy_columns / sizeof policy_columns[0], 0, 0},
    {"set-policy", "PUT", "/api/policies/", NULL, 0, 4, 5},
    {"clear-policy", "DELETE", "/api/policies/", NULL, 0, 2, 2},
    {"list-queues", "GET", "/api/queues", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"list-exchanges", "GET", "/api/exchanges", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"list-bindings", "GET", "/api/bindings", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"list-connections", "GET", "/api/connections", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"list-channels", "GET", "/api/channels", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"list-consumers", "GET", "/api/consumers", NULL, 0, 0, LIST_COLUMNS_MAX},
    {"cluster-status", "GET", "/api/nodes", node_columns,
     sizeof node_columns / sizeof node_columns[0], 0, 0},
    {"export-definitions", "GET", "/api/definitions", NULL, 0, 1, 1},
    {"import-definitions", "POST", "/api/definitions", NULL, 0, 1, 1},
    {"await-startup", "GET", "/api/overview", NULL, 0, 0, 0},
    {"ping", "GET", "/api/healthchecks/node", NULL, 0, 0, 0},
    {"list-users", "GET", "/api/users", user_columns,
     sizeof user_columns / sizeof user_columns[0], 0, 0},
    {"add-user", "PUT", "/api/users/", NULL, 0, 2, 2},
    {"delete-user", "DELETE", "/api/users/", NULL, 0, 1, 1},
    {"change-password", "PUT", "/api/users/", NULL, 0, 2, 2},
    {"set-user-tags", "PUT", "/api/users/", NULL, 0, 1, 5},
    {"list-vhosts", "GET", "/api/vhosts", vhost_columns,
     sizeof vhost_columns / sizeof vhost_columns[0], 0, 0},
    {"add-vhost", "PUT", "/api/vhosts/", NULL, 0, 1, 1},
    {"delete-vhost", "DELETE", "/api/vhosts/", NULL, 0, 1, 1},
    {"list-permissions", "GET", "/api/permissions", permission_columns,
     sizeof permission_columns / sizeof permission_columns[0], 0, 0},
    {"set-permissions", "PUT", "/api/permissions/", NULL, 0, 4, 4},
    {"clear-permissions", "DELETE", "/api/permissions/", NULL, 0, 1, 1},
    {"list-vhost-limits", "GET", "/api/vhost-limits", vhost_limit_columns,
     sizeof vhost_limit_columns / sizeof vhost_limit_columns[0], 0, 0},
    {"list-user-limits", "GET", "/api/user-limits", user_limit_columns,
     sizeof user_limit_columns / sizeof user_limit_columns[0], 0, 0},
    {"set-vhost-limits", "PUT", "/api/vhost-limits/", NULL, 0, 1, 1},
    {"clear-vhost-limits", "DELETE", "/api/vhost-limits/", NULL, 0, 0, 0},
    {"set-user-limits", "PUT", "/api/user-limits/", NULL, 0, 2, 2},
    {"clear-user-limits", "DELETE", "/api/user-limits/", NULL, 0, 2, 2},
};

/* ---- set-policy and clear-policy ------------------------------------------- */

/* Appends s %-encoded as a path segment (RabbitMQ's "/" vhost is %2F). */
bool ctl__append_segment(char *out, size_t cap, const char *s)
{
    size_t n = strlen(out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool plain = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                     (c >= 'A' && c <= 'Z') || strchr("-._~", c) != NULL;
        int w = plain ? snprintf(out + n, cap - n, "%c", c)
                      : snprintf(out + n, cap - n, "%%%02X", c);
        if (w < 0 || (size_t)w >= cap - n)
            return false;
        n += (size_t)w;
    }
    return true;
}

/* Appends s as a JSON string. */
bool ctl__append_json_string(char *out, size_t cap, const char *s)
{
    size_t n = strlen(out);
    if (n + 1 >= cap)
        return false;
    out[n++] = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int w = c == '"' || c == '\\' ? snprintf(out + n, cap - n, "\\%c", c)
                : c < 0x20 ? snprintf(out + n, cap - n, "\\u%04x", c)
                           : snprintf(out + n, cap - n, "%c", c);
        if (w < 0 || (size_t)w >= cap - n)
            return false;
        n += (size_t)w;
    }
    if (n + 1 >= cap)
        return false;
    out[n++] = '"';
    out[n] = '\0';
    return true;
}

static bool is_number(const char *s)
{
    if (*s == '\0' || strlen(s) > 9)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
    }
    return true;
}

/* move QUEUE --to BROKER [--vhost VHOST] [--backup-of B]: the names in a
 * JSON body. */
static int build_move(const char *queue, const char *to, const char *vhost,
                      const char *backup_of, char *body, size_t body_cap)
{
    if (to == NULL) {
        fprintf(stderr, "quayctl: move needs --to BROKER\n");
        return EXIT_USAGE;
    }
    snprintf(body, body_cap, "{\"vhost\": ");
    if (!ctl__append_json_string(body, body_cap, vhost ? vhost : "/") ||
        strlen(body) + 12 >= body_cap)
        goto too_long;
    strcat(body, ", \"queue\": ");
    if (!ctl__append_json_string(body, body_cap, queue) || strlen(body) + 9 >= body_cap)
        goto too_long;
    strcat(body, ", \"to\": ");
    if (!ctl__append_json_string(body, body_cap, to) || strlen(body) + 16 >= body_cap)
        goto too_long;
    if (backup_of != NULL) {
        strcat(body, ", \"backup_of\": ");
        if (!ctl__append_json_string(body, body_cap, backup_of) || strlen(body) + 2 >= body_cap)
            goto too_long;
    }
    strcat(body, "}");
    return 0;
too_long:
    fprintf(stderr, "quayctl: move: an argument is too long\n");
    return EXIT_USAGE;
}

/* offload BROKER --to T (--fraction F | --queues REGEX [--vhost V]): the
 * names in JSON, F as a whole percent (the API takes integers only). */
static int build_offload(const struct options *opt, char *body, size_t body_cap)
{
    if (opt->to == NULL || (opt->fraction == NULL) == (opt->queues == NULL)) {
        fprintf(stderr, "quayctl: offload needs --to BROKER and --fraction F or --queues REGEX\n");
        return EXIT_USAGE;
    }
    snprintf(body, body_cap, "{\"broker\": ");
    if (!ctl__append_json_string(body, body_cap, opt->args[0]) || strlen(body) + 10 >= body_cap)
        goto too_long;
    strcat(body, ", \"to\": ");
    if (!ctl__append_json_string(body, body_cap, opt->to) || strlen(body) + 24 >= body_cap)
        goto too_long;
    if (opt->fraction != NULL) {
        char *end;
        double f = strtod(opt->fraction, &end);
        if (*opt->fraction == '\0' || *end != '\0' || !(f > 0.0 && f <= 1.0)) {
            fprintf(stderr, "quayctl: --fraction takes a number in (0, 1]\n");
            return EXIT_USAGE;
        }
        long percent = (long)(f * 100.0 + 0.5);
        size_t n = strlen(body);
        snprintf(body + n, body_cap - n, ", \"percent\": %ld}", percent < 1 ? 1 : percent);
        return 0;
    }
    strcat(body, ", \"queues\": ");
    if (!ctl__append_json_string(body, body_cap, opt->queues) || strlen(body) + 12 >= body_cap)
        goto too_long;
    if (opt->vhost != NULL) {
        strcat(body, ", \"vhost\": ");
        if (!ctl__append_json_string(body, body_cap, opt->vhost) || strlen(body) + 2 >= body_cap)
            goto too_long;
    }
    strcat(body, "}");
    return 0;
too_long:
    fprintf(stderr, "quayctl: offload: an argument is too long\n");
    return EXIT_USAGE;
}

/* rebalance [on|off]: {} or {"auto": true|false}. */
static int build_rebalance(char **args, int args_count, char *body, size_t body_cap)
{
    bool on = args_count > 0 && strcmp(args[0], "on") == 0;
    if (args_count > 0 && !on && strcmp(args[0], "off") != 0) {
        fprintf(stderr, "quayctl: rebalance takes on, off or nothing\n");
        return EXIT_USAGE;
    }
    snprintf(body, body_cap, "%s", args_count == 0 ? "{}" : on ? "{\"auto\": true}"
                                                               : "{\"auto\": false}");
    return 0;
}

/* The path (and the body, for set-policy and forget) of a command with
 * arguments.
 * Returns 0 or EXIT_USAGE (printed). */
static int build_request(const struct command *cmd, char **args, int args_count, char *path,
                         size_t path_cap, char *body, size_t body_cap)
{
    snprintf(path, path_cap, "%s", cmd->path);
    if (strcmp(cmd->method, "POST") == 0) { /* forget/drain/revive BROKER: the name, JSON */
        snprintf(body, body_cap, "{\"broker\": ");
        if (!ctl__append_json_string(body, body_cap, args[0]) || strlen(body) + 2 >= body_cap)
            goto too_long;
        strcat(body, "}");
        return 0;
    }
    if (!ctl__append_segment(path, path_cap, args[0]) || strlen(path) + 2 >= path_cap)
        goto too_long;
    size_t end = strlen(path);
    path[end] = '/';
    path[end + 1] = '\0';
    if (!ctl__append_segment(path, path_cap, args[1]))
        goto too_long;
    if (cmd->args_max == 2)
        return 0;
    const char *priority = args_count > 4 ? args[4] : "0";
    if (!is_number(args[3]) || !is_number(priority)) {
        fprintf(stderr, "quayctl: BACKUPS and PRIORITY must be whole numbers\n");
        return EXIT_USAGE;
    }
    snprintf(body, body_cap, "{\"pattern\": ");
    if (!ctl__append_json_string(body, body_cap, args[2]))
        goto too_long;
    size_t n = strlen(body);
    int w = snprintf(body + n, body_cap - n, ", \"priority\": %s, \"backups\": %s}", priority,
                     args[3]);
    if (w < 0 || (size_t)w >= body_cap - n)
        goto too_long;
    return 0;
too_long:
    fprintf(stderr, "quayctl: %s: an argument is too long\n", cmd->name);
    return EXIT_USAGE;
}

/* Prints the answer; returns the exit status. */
int ctl__show(const struct command *cmd, const struct response *res, bool raw_json)
{
    const char *error = NULL;
    if (res->status == 204 || (res->status == 201 && res->body_size == 0))
        return 0; /* done: RabbitMQ answers a PUT or DELETE without a body */
    struct jvalue *doc = json_parse(res->body, res->body_size, &error);
    if (res->status != 200 && res->status != 201 && res->status != 202) {
        const struct jvalue *reason = jget(doc, "reason");
        if (reason == NULL)
            reason = jget(doc, "error");
        fprintf(stderr, "quayctl: %s %s: HTTP %d%s%s\n", cmd->method, cmd->path, res->status,
                reason && reason->text ? ": " : "", reason && reason->text ? reason->text : "");
        jfree(doc);
        if (res->status == 401 || res->status == 403) {
            fprintf(stderr, "quayctl: log in with --user and QUAY_PASSWORD (or --password) as "
                    "a user with the right tag\n");
            return EXIT_NOPERM;
        }
        return EXIT_PROTOCOL;
    }
    if (!doc) {
        fprintf(stderr, "quayctl: GET %s: bad JSON (%s)\n", cmd->path, error ? error : "?");
        return EXIT_PROTOCOL;
    }
    int rc;
    if (raw_json) {
        fwrite(res->body, 1, res->body_size, stdout);
        if (res->body_size == 0 || res->body[res->body_size - 1] != '\n')
            putchar('\n');
        rc = 0;
    } else if (cmd->columns) {
        rc = print_table(doc, cmd->columns, cmd->columns_count);
    } else {
        rc = print_pairs(doc);
    }
    jfree(doc);
    if (rc != 0) {
        fprintf(stderr, "quayctl: GET %s: unexpected JSON shape\n", cmd->path);
        return EXIT_PROTOCOL;
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

static const char **string_option(struct options *opt, const char *a)
{
    static const struct {
        const char *name;
        size_t offset;
    } options[] = {
        {"--to", offsetof(struct options, to)},
        {"--vhost", offsetof(struct options, vhost)},
        {"-p", offsetof(struct options, vhost)}, /* rabbitmqctl's spelling */
        {"--backup-of", offsetof(struct options, backup_of)},
        {"--fraction", offsetof(struct options, fraction)},
        {"--queues", offsetof(struct options, queues)},
        {"--tags", offsetof(struct options, tags)},
    };
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        if (strcmp(a, options[i].name) == 0)
            return (const char **)((char *)opt + options[i].offset);
    }
    return NULL;
}

/* Returns -1 to go on, or an exit status. */
static int parse_options(int argc, char **argv, struct options *opt)
{
    const char *http = DEFAULT_HTTP, *cacert = NULL;
    bool https = false;
    opt->timeout_ms = DEFAULT_TIMEOUT_MS;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            opt->json = true;
        } else if (string_option(opt, a) != NULL && i + 1 < argc) {
            *string_option(opt, a) = argv[++i];
        } else if (strcmp(a, "--user") == 0 && i + 1 < argc) {
            opt->user = argv[++i];
        } else if (strcmp(a, "--password") == 0 && i + 1 < argc) {
            opt->password = argv[++i];
        } else if (strcmp(a, "--cacert") == 0 && i + 1 < argc) {
            cacert = argv[++i];
        } else if ((strcmp(a, "--http") == 0 || strcmp(a, "--https") == 0 ||
                    strcmp(a, "--timeout") == 0) && i + 1 < argc) {
            if (strcmp(a, "--timeout") != 0) {
                https = strcmp(a, "--https") == 0;
                http = argv[++i];
                continue;
            }
            char *end;
            long s = strtol(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end != '\0' || s <= 0 || s > 3600) {
                fprintf(stderr, "quayctl: bad value for --timeout: '%s'\n", argv[i]);
                return EXIT_USAGE;
            }
            opt->timeout_ms = (int)s * 1000;
        } else if (opt->command && opt->args_count < opt->command->args_max) {
            opt->args[opt->args_count++] = argv[i];
        } else if ((a[0] == '-' && a[1] != '\0') || opt->command) {
            fprintf(stderr, "quayctl: unexpected argument '%s'\n", a);
            usage(stderr);
            return EXIT_USAGE;
        } else {
            for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++) {
                if (strcmp(a, commands[c].name) == 0)
                    opt->command = &commands[c];
            }
            if (!opt->command) {
                fprintf(stderr, "quayctl: unknown command '%s'\n", a);
                usage(stderr);
                return EXIT_USAGE;
            }
        }
    }
    if (!opt->command) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (opt->args_count < opt->command->args_min) {
        fprintf(stderr, "quayctl: %s needs %d arguments\n", opt->command->name,
                opt->command->args_min);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (ctl__parse_endpoint(http, &opt->endpoint) != 0) {
        fprintf(stderr, "quayctl: bad value for --http%s: '%s' (HOST:PORT)\n", https ? "s" : "",
                http);
        return EXIT_USAGE;
    }
    if (cacert != NULL && !https) {
        fprintf(stderr, "quayctl: --cacert is for --https\n");
        return EXIT_USAGE;
    }
    opt->endpoint.tls = https;
    opt->endpoint.cacert = cacert;
    return -1;
}

/* The Basic credentials: the options, else the environment, else guest's.
 * Returns 0, or EXIT_USAGE (printed). */
static int credentials(const struct options *opt, char *out, size_t out_cap)
{
    const char *user = opt->user ? opt->user : getenv("QUAY_USER");
    const char *password = opt->password ? opt->password : getenv("QUAY_PASSWORD");
    if (user != NULL && password == NULL) {
        fprintf(stderr, "quayctl: %s needs a password: QUAY_PASSWORD or --password\n", user);
        return EXIT_USAGE;
    }
    if (user == NULL)
        user = DEFAULT_USER;
    if (password == NULL)
        password = DEFAULT_USER;
    char plain[CREDENTIALS_SIZE_MAX + 1];
    int n = snprintf(plain, sizeof plain, "%s:%s", user, password);
    if (strchr(user, ':') != NULL || n < 0 || (size_t)n >= sizeof plain ||
        base64_encoded_size((size_t)n) >= out_cap) {
        explicit_bzero(plain, sizeof plain);
        fprintf(stderr, "quayctl: the user name has a ':' or the credentials are over %d "
                "bytes\n", CREDENTIALS_SIZE_MAX);
        return EXIT_USAGE;
    }
    base64_encode((const uint8_t *)plain, (size_t)n, out);
    explicit_bzero(plain, sizeof plain);
    return 0;
}

static bool is_command(const struct options *opt, const char *prefix)
{
    return strncmp(opt->command->name, prefix, strlen(prefix)) == 0;
}

/* rabbitmqctl's list-* with COLUMN arguments (run_list); list-users,
 * list-vhosts and list-permissions have columns of their own. */
static bool is_listing(const struct options *opt)
{
    return is_command(opt, "list-") && opt->command->columns == NULL;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN); /* OpenSSL writes to the socket with write() */
    struct options opt = {0};
    int rc = parse_options(argc, argv, &opt);
    if (rc >= 0)
        return rc;
    char authorization[2 * CREDENTIALS_SIZE_MAX];
    rc = credentials(&opt, authorization, sizeof authorization);
    if (rc != 0)
        return rc;
    struct buffer in = {0};
    struct response res;
    char path[2048], body[1536] = "";
    if (is_listing(&opt) || is_command(&opt, "export-definitions") ||
        is_command(&opt, "import-definitions") || is_command(&opt, "await-startup") ||
        is_command(&opt, "ping")) {
        rc = is_listing(&opt)           ? ctl__run_list(&opt, authorization)
             : is_command(&opt, "ping") ? ctl__run_probe(&opt, authorization)
             : is_command(&opt, "await") ? ctl__run_probe(&opt, authorization)
                                         : ctl__run_definitions(&opt, authorization);
        explicit_bzero(authorization, sizeof authorization);
        return rc;
    }
    if (strstr(opt.command->name, "-limits") != NULL && !is_command(&opt, "list-")) {
        rc = ctl__run_limits(&opt, authorization);
        explicit_bzero(authorization, sizeof authorization);
        return rc;
    }
    if (strcmp(opt.command->name, "move") == 0) {
        snprintf(path, sizeof path, "%s", opt.command->path);
        rc = build_move(opt.args[0], opt.to, opt.vhost, opt.backup_of, body, sizeof body);
        if (rc != 0)
            return rc;
    } else if (strcmp(opt.command->name, "offload") == 0) {
        snprintf(path, sizeof path, "%s", opt.command->path);
        rc = build_offload(&opt, body, sizeof body);
        if (rc != 0)
            return rc;
    } else if (strcmp(opt.command->name, "rebalance") == 0) {
        snprintf(path, sizeof path, "%s", opt.command->path);
        rc = build_rebalance(opt.args, opt.args_count, body, sizeof body);
        if (rc != 0)
            return rc;
    } else if (ctl__is_user_command(opt.command)) {
        rc = ctl__build_user_request(&opt, authorization, path, sizeof path, body, sizeof body);
        if (rc != 0)
            return rc;
        if (strcmp(opt.command->method, "DELETE") == 0)
            body[0] = '\0';
    } else if (opt.command->args_max > 0) {
        rc = build_request(opt.command, opt.args, opt.args_count, path, sizeof path, body,
                           sizeof body);
        if (rc != 0)
            return rc;
    } else if (strcmp(opt.command->name, "list-vhost-limits") == 0 && opt.vhost != NULL) {
        snprintf(path, sizeof path, "/api/vhost-limits/");
        if (!ctl__append_segment(path, sizeof path, opt.vhost)) {
            fprintf(stderr, "quayctl: list-vhost-limits: the vhost is too long\n");
            return EXIT_USAGE;
        }
    } else if (strcmp(opt.command->name, "list-permissions") == 0 && opt.vhost != NULL) {
        snprintf(path, sizeof path, "/api/vhosts/");
        if (!ctl__append_segment(path, sizeof path, opt.vhost) ||
            strlen(path) + 13 >= sizeof path) {
            fprintf(stderr, "quayctl: list-permissions: the vhost is too long\n");
            return EXIT_USAGE;
        }
        strcat(path, "/permissions");
    } else {
        snprintf(path, sizeof path, "%s", opt.command->path);
    }
    rc = ctl__http_request(&opt.endpoint, opt.command->method, path, body[0] ? body : NULL,
                           authorization, opt.timeout_ms, &in, &res);
    explicit_bzero(authorization, sizeof authorization);
    if (rc == 0)
        rc = ctl__show(opt.command, &res, opt.json);
    free(in.data);
    return rc;
}
